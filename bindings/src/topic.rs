//! Topic names, topic filters and the matcher, for JavaScript.

use meridian_core::topic::{FilterTrie, TopicError, TopicFilter, TopicName};
use wasm_bindgen::prelude::*;

use crate::js::{self, Obj};
use crate::ts::AnyArg;

/// Seed of the matcher's hash tables. The match order depends only on the stored filters.
const MATCHER_SEED: u64 = 0x746f_7069_635f_6d61;

fn name_error(topic: &str, e: &TopicError) -> JsValue {
    js::type_error(&format!("invalid topic name {topic:?}: {e}"))
}

fn filter_error(filter: &str, e: &TopicError) -> JsValue {
    js::type_error(&format!("invalid topic filter {filter:?}: {e}"))
}

/// Throws a `TypeError` saying why `topic` is not a valid MQTT topic name (empty, wildcard,
/// U+0000, longer than 65,535 bytes); returns nothing if it is valid.
#[wasm_bindgen(js_name = validateTopicName)]
pub fn validate_topic_name(
    #[wasm_bindgen(unchecked_param_type = "string")] topic: JsValue,
) -> Result<(), JsValue> {
    let topic = &js::string(&topic, "topic")?;
    TopicName::new(topic.as_str())
        .map(drop)
        .map_err(|e| name_error(topic, &e))
}

/// Checks a topic filter (wildcards, `$share/{group}/{filter}`), throwing a `TypeError` that
/// says why it is invalid. Returns `{ filter, pattern, shareGroup, hasWildcards }`, where
/// `pattern` is the part matched against topic names (without any `$share/{group}/` prefix).
#[wasm_bindgen(js_name = validateTopicFilter, unchecked_return_type = "TopicFilterInfo")]
pub fn validate_topic_filter(
    #[wasm_bindgen(unchecked_param_type = "string")] filter: JsValue,
) -> Result<JsValue, JsValue> {
    let filter = &js::string(&filter, "filter")?;
    let f = TopicFilter::new(filter.as_str()).map_err(|e| filter_error(filter, &e))?;
    let o = Obj::new();
    o.set("filter", f.as_str())
        .set("pattern", f.pattern())
        .set(
            "shareGroup",
            f.shared_group().map_or(JsValue::NULL, JsValue::from_str),
        )
        .set("hasWildcards", f.has_wildcards());
    Ok(o.into_js())
}

/// Whether `topic` is a valid topic name.
#[wasm_bindgen(js_name = isValidTopicName)]
pub fn is_valid_topic_name(
    #[wasm_bindgen(unchecked_param_type = "string")] topic: JsValue,
) -> bool {
    topic.as_string().is_some_and(|t| TopicName::new(t).is_ok())
}

/// Whether `filter` is a valid topic filter (shared subscriptions included).
#[wasm_bindgen(js_name = isValidTopicFilter)]
pub fn is_valid_topic_filter(
    #[wasm_bindgen(unchecked_param_type = "string")] filter: JsValue,
) -> bool {
    filter
        .as_string()
        .is_some_and(|f| TopicFilter::new(f).is_ok())
}

/// Whether the topic filter `filter` matches the topic name `topic` (MQTT 5.0 §4.7; a
/// `$share/{group}/` prefix is ignored). Throws a `TypeError` if either is invalid.
#[wasm_bindgen(js_name = topicMatches)]
pub fn topic_matches(
    #[wasm_bindgen(unchecked_param_type = "string")] filter: JsValue,
    #[wasm_bindgen(unchecked_param_type = "string")] topic: JsValue,
) -> Result<bool, JsValue> {
    let filter = &js::string(&filter, "filter")?;
    let topic = &js::string(&topic, "topic")?;
    let f = TopicFilter::new(filter).map_err(|e| filter_error(filter, &e))?;
    let t = TopicName::new(topic).map_err(|e| name_error(topic, &e))?;
    Ok(f.matches(&t))
}

/// A set of topic filters with a value each, matched by topic name through the core's
/// subscription trie: the cost of `match` grows with the topic's levels, not with the number of
/// filters.
///
/// ```js
/// const m = new TopicMatcher();
/// m.add("sport/+/score", "scores");
/// m.add("sport/#");                    // the value defaults to the filter itself
/// m.match("sport/tennis/score");       // ["sport/#", "scores"] (order: deterministic)
/// ```
#[wasm_bindgen]
#[derive(Debug)]
pub struct TopicMatcher {
    /// Keyed by pattern; shared filters with the same pattern share a node.
    trie: FilterTrie<Vec<(Box<str>, JsValue)>>,
    len: usize,
}

impl Default for TopicMatcher {
    fn default() -> Self {
        Self::new()
    }
}

#[wasm_bindgen]
impl TopicMatcher {
    #[wasm_bindgen(constructor)]
    pub fn new() -> TopicMatcher {
        Self {
            trie: FilterTrie::new(MATCHER_SEED),
            len: 0,
        }
    }

    /// Stores `value` for `filter` (when `value` is left out or `null`: the filter string),
    /// replacing and returning the previous value of that exact filter. Throws a `TypeError`
    /// for an invalid filter.
    pub fn add(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "string")] filter: JsValue,
        value: Option<AnyArg>,
    ) -> Result<JsValue, JsValue> {
        let filter = &js::string(&filter, "filter")?;
        let f = TopicFilter::new(filter).map_err(|e| filter_error(filter, &e))?;
        let value = value.map_or_else(|| JsValue::from_str(filter), JsValue::from);
        let entries = self.trie.entry(f.pattern());
        if let Some(slot) = entries.iter_mut().find(|(text, _)| **text == *filter) {
            return Ok(std::mem::replace(&mut slot.1, value));
        }
        entries.push((filter.as_str().into(), value));
        self.len += 1;
        Ok(JsValue::UNDEFINED)
    }

    /// Removes `filter`, returning its value (`undefined` if it was not stored).
    pub fn remove(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "string")] filter: JsValue,
    ) -> Result<JsValue, JsValue> {
        let filter = &js::string(&filter, "filter")?;
        let f = TopicFilter::new(filter).map_err(|e| filter_error(filter, &e))?;
        let Some(entries) = self.trie.get_mut(f.pattern()) else {
            return Ok(JsValue::UNDEFINED);
        };
        let Some(i) = entries.iter().position(|(text, _)| **text == *filter) else {
            return Ok(JsValue::UNDEFINED);
        };
        let (_, value) = entries.swap_remove(i);
        if entries.is_empty() {
            self.trie.remove(f.pattern());
        }
        self.len -= 1;
        Ok(value)
    }

    /// The value stored for exactly `filter`, or `undefined`.
    pub fn get(&self, #[wasm_bindgen(unchecked_param_type = "string")] filter: JsValue) -> JsValue {
        let Some(filter) = filter.as_string() else {
            return JsValue::UNDEFINED;
        };
        let Ok(f) = TopicFilter::new(filter.as_str()) else {
            return JsValue::UNDEFINED;
        };
        self.trie
            .get(f.pattern())
            .and_then(|entries| entries.iter().find(|(text, _)| **text == *filter))
            .map_or(JsValue::UNDEFINED, |(_, v)| v.clone())
    }

    /// Whether exactly `filter` is stored.
    pub fn has(&self, #[wasm_bindgen(unchecked_param_type = "string")] filter: JsValue) -> bool {
        !self.get(filter).is_undefined()
    }

    /// The values of every stored filter matching the topic name `topic`, each once per filter.
    /// Throws a `TypeError` for an invalid topic name.
    #[wasm_bindgen(js_name = "match", unchecked_return_type = "any[]")]
    pub fn match_topic(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] topic: JsValue,
    ) -> Result<JsValue, JsValue> {
        let topic = &js::string(&topic, "topic")?;
        let t = TopicName::new(topic).map_err(|e| name_error(topic, &e))?;
        let out = js_sys::Array::new();
        self.trie.for_each_match(t.as_str(), |entries| {
            for (_, v) in entries {
                out.push(v);
            }
        });
        Ok(out.into())
    }

    /// The stored filters matching `topic` (rather than their values).
    #[wasm_bindgen(js_name = matchFilters, unchecked_return_type = "string[]")]
    pub fn match_filters(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] topic: JsValue,
    ) -> Result<JsValue, JsValue> {
        let topic = &js::string(&topic, "topic")?;
        let t = TopicName::new(topic).map_err(|e| name_error(topic, &e))?;
        let out = js_sys::Array::new();
        self.trie.for_each_match(t.as_str(), |entries| {
            for (f, _) in entries {
                out.push(&JsValue::from_str(f));
            }
        });
        Ok(out.into())
    }

    /// Whether any stored filter matches `topic` (`false` for an invalid topic name).
    #[wasm_bindgen(js_name = matchesAny)]
    pub fn matches_any(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string")] topic: JsValue,
    ) -> bool {
        topic
            .as_string()
            .and_then(|t| TopicName::new(t).ok())
            .is_some_and(|t| self.trie.matches_any(t.as_str()))
    }

    /// Number of stored filters.
    #[wasm_bindgen(getter)]
    pub fn size(&self) -> usize {
        self.len
    }

    /// Every stored `[filter, value]` pair, sorted by filter.
    #[wasm_bindgen(unchecked_return_type = "Array<[string, any]>")]
    pub fn entries(&self) -> JsValue {
        let mut all: Vec<(&str, &JsValue)> = self
            .trie
            .iter()
            .flat_map(|(_, entries)| entries.iter().map(|(f, v)| (&**f, v)))
            .collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        js::array(
            all.into_iter()
                .map(|(f, v)| js::array([JsValue::from_str(f), v.clone()])),
        )
    }

    /// Removes every filter.
    pub fn clear(&mut self) {
        self.trie = FilterTrie::new(MATCHER_SEED);
        self.len = 0;
    }
}
