//! The topic checker: filters and names from a small alphabet (so that matches happen) or
//! arbitrary strings, stored in a [`FilterTrie`] and a [`TopicTree`] with inserts and removes,
//! and every query compared with the naive [`matches`].

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::{Arbitrary, Unstructured};
use meridian_core::topic::{FilterTrie, Limits, TopicFilter, TopicName, TopicTree, matches};

use crate::trace;

/// Levels that make matches (and the '$' and empty-level corner cases) likely.
pub const LEVELS: &[&str] = &["a", "b", "$s", "", "+", "#", "$share", "g"];

/// A topic string: small-alphabet levels joined by '/', or any string.
#[derive(Debug, Clone)]
pub struct Text(pub String);

impl<'a> Arbitrary<'a> for Text {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        if u.ratio(1, 8)? {
            return Ok(Text(String::arbitrary(u)?));
        }
        let n = u.int_in_range(1..=5)?;
        let mut levels = Vec::with_capacity(n);
        for _ in 0..n {
            levels.push(*u.choose(LEVELS)?);
        }
        Ok(Text(levels.join("/")))
    }
}

#[derive(Debug, Arbitrary)]
pub enum Op {
    /// Validate as a filter; store the pattern of a valid one in the trie.
    AddFilter(Text),
    /// Remove a stored filter (by index into the stored ones) or any text.
    RemoveFilter {
        index: u8,
        other: Option<Text>,
    },
    /// Validate as a name; store a valid one in the tree.
    AddTopic(Text),
    RemoveTopic {
        index: u8,
        other: Option<Text>,
    },
    /// Match a topic name against the trie.
    MatchTopic(Text),
    /// Match a filter against the tree.
    MatchFilter(Text),
}

#[derive(Debug, Arbitrary)]
pub struct Scenario {
    pub seed: u64,
    pub ops: Vec<Op>,
}

/// Validation must not panic, must agree between `new` and `with_limits(MQTT)`, and a valid
/// value must keep its text.
fn validate(s: &str) -> (Option<TopicFilter>, Option<TopicName>) {
    let filter = TopicFilter::new(s);
    assert_eq!(
        filter.clone().map(|f| f.as_str().to_owned()),
        TopicFilter::with_limits(s, &Limits::MQTT).map(|f| f.as_str().to_owned())
    );
    let name = TopicName::new(s);
    if let Ok(f) = &filter {
        assert_eq!(f.as_str(), s);
        assert!(
            s.ends_with(f.pattern()),
            "pattern {:?} of {s:?}",
            f.pattern()
        );
        assert_eq!(f.has_wildcards(), f.pattern().contains(['+', '#']));
        assert_eq!(f.shared_group().is_some(), f.pattern().len() != s.len());
        // A tight level limit is honoured.
        let levels = f.pattern().split('/').count();
        let tight = Limits {
            max_len: usize::MAX,
            max_levels: levels - 1,
        };
        assert!(
            TopicFilter::with_limits(s, &tight).is_err(),
            "{s:?} over {tight:?}"
        );
    }
    if let Ok(n) = &name {
        assert_eq!(n.as_str(), s);
        assert!(!s.contains(['+', '#']));
        // Every valid name is a valid (wildcard-free) filter that matches itself.
        // ("$share..." names are not filters: that prefix marks a shared subscription.)
        if !s.starts_with("$share") {
            let f = filter
                .as_ref()
                .unwrap_or_else(|e| panic!("name {s:?} is not a filter: {e}"));
            assert!(f.matches(n), "{s:?} does not match itself");
        }
    }
    (filter.ok(), name.ok())
}

/// The whole check for one input.
pub fn check(data: &[u8]) {
    let Ok(scenario) = Scenario::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    trace!("seed {:#x}, {} ops", scenario.seed, scenario.ops.len());
    // Patterns in the trie, each with the full filters stored under it; names in the tree.
    let mut trie: FilterTrie<BTreeSet<String>> = FilterTrie::new(scenario.seed);
    let mut filters: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut tree: TopicTree<String> = TopicTree::new(scenario.seed);
    let mut names: BTreeSet<String> = BTreeSet::new();

    for op in &scenario.ops {
        trace!("{op:?}");
        match op {
            Op::AddFilter(Text(s)) => {
                if let (Some(f), _) = validate(s) {
                    trie.entry(f.pattern()).insert(f.as_str().to_owned());
                    filters
                        .entry(f.pattern().to_owned())
                        .or_default()
                        .insert(f.as_str().to_owned());
                }
            }
            Op::RemoveFilter { index, other } => {
                let pattern = match other {
                    Some(Text(s)) => s.clone(),
                    None if filters.is_empty() => continue,
                    None => filters
                        .keys()
                        .nth(usize::from(*index) % filters.len())
                        .cloned()
                        .unwrap_or_default(),
                };
                let removed = trie.remove(&pattern);
                assert_eq!(removed, filters.remove(&pattern), "remove {pattern:?}");
            }
            Op::AddTopic(Text(s)) => {
                if let (_, Some(n)) = validate(s) {
                    let old = tree.insert(n.as_str(), n.as_str().to_owned());
                    assert_eq!(old.is_some(), !names.insert(n.as_str().to_owned()));
                }
            }
            Op::RemoveTopic { index, other } => {
                let topic = match other {
                    Some(Text(s)) => s.clone(),
                    None if names.is_empty() => continue,
                    None => names
                        .iter()
                        .nth(usize::from(*index) % names.len())
                        .cloned()
                        .unwrap_or_default(),
                };
                let removed = tree.remove(&topic);
                assert_eq!(removed.is_some(), names.remove(&topic), "remove {topic:?}");
                if let Some(r) = removed {
                    assert_eq!(r, topic);
                }
            }
            Op::MatchTopic(Text(s)) => {
                let (_, name) = validate(s);
                let Some(name) = name else { continue };
                let mut got = Vec::new();
                trie.for_each_match(name.as_str(), |v| got.extend(v.iter().cloned()));
                let n = got.len();
                got.sort();
                got.dedup();
                assert_eq!(n, got.len(), "a filter was visited twice for {s:?}");
                let mut want: Vec<String> = filters
                    .iter()
                    .filter(|(p, _)| matches(p, name.as_str()))
                    .flat_map(|(_, fs)| fs.iter().cloned())
                    .collect();
                want.sort();
                assert_eq!(got, want, "trie matches for topic {s:?}");
                assert_eq!(trie.matches_any(name.as_str()), !want.is_empty());
            }
            Op::MatchFilter(Text(s)) => {
                let (filter, _) = validate(s);
                let Some(filter) = filter else { continue };
                let mut got = Vec::new();
                tree.for_each_match(filter.pattern(), |v| got.push(v.clone()));
                let n = got.len();
                got.sort();
                got.dedup();
                assert_eq!(n, got.len(), "a topic was visited twice for {s:?}");
                let want: Vec<String> = names
                    .iter()
                    .filter(|t| matches(filter.pattern(), t))
                    .cloned()
                    .collect();
                assert_eq!(got, want, "tree matches for filter {s:?}");
            }
        }
        assert_eq!(trie.len(), filters.len());
        assert_eq!(tree.len(), names.len());
    }

    // Iteration lists exactly what is stored, sorted.
    let listed: Vec<(String, BTreeSet<String>)> =
        trie.iter().map(|(p, v)| (p, v.clone())).collect();
    let expected: Vec<(String, BTreeSet<String>)> = filters.into_iter().collect();
    assert_eq!(listed, expected, "FilterTrie::iter");
    let listed: Vec<String> = tree.iter().map(|(t, _)| t).collect();
    let expected: Vec<String> = names.into_iter().collect();
    assert_eq!(listed, expected, "TopicTree::iter");
}
