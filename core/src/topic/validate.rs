//! Validated topic names and topic filters (MQTT 5.0 §4.7, §4.8.2), and the naive matcher.

use core::borrow::Borrow;
use core::cmp::Ordering;
use core::fmt;
use core::hash::{Hash, Hasher};

/// Why a string is not a valid topic name or topic filter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// Topic names and filters must be at least one character long.
    #[error("topic is empty")]
    Empty,
    /// Longer than the configured (or MQTT's 65,535-byte) maximum.
    #[error("topic is {len} bytes long, the maximum is {max}")]
    TooLong {
        /// Length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// More levels than the configured maximum.
    #[error("topic has {levels} levels, the maximum is {max}")]
    TooManyLevels {
        /// Number of '/'-separated levels (of the pattern, for a shared subscription).
        levels: usize,
        /// The limit.
        max: usize,
    },
    /// A topic name contains '+' or '#'.
    #[error("topic name contains a wildcard ('+' or '#')")]
    WildcardInName,
    /// Contains U+0000.
    #[error("topic contains the null character U+0000")]
    NullChar,
    /// Under `$SYS`, where the broker publishes its own figures.
    #[error("topics under $SYS are the broker's own")]
    Reserved,
    /// '#' that is not the whole last level, or '+' that is not a whole level.
    #[error("misplaced wildcard: '#' must be the whole last level, '+' a whole level")]
    MisplacedWildcard,
    /// A `$share/` filter that breaks MQTT 5.0 §4.8.2.
    #[error("bad shared subscription: {0}")]
    BadSharedSubscription(&'static str),
}

/// Bounds on topic names and filters. [`Limits::MQTT`] is the protocol's own maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// Maximum length in bytes (MQTT: 65,535; larger values are capped at that).
    pub max_len: usize,
    /// Maximum number of '/'-separated levels (MQTT: unlimited).
    pub max_levels: usize,
}

impl Limits {
    /// MQTT's own limits: 65,535 bytes, any number of levels.
    pub const MQTT: Limits = Limits {
        max_len: u16::MAX as usize,
        max_levels: usize::MAX,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::MQTT
    }
}

/// Prefix of a shared subscription filter.
const SHARE_PREFIX: &str = "$share/";

fn check_len(s: &str, limits: &Limits) -> Result<(), TopicError> {
    if s.is_empty() {
        return Err(TopicError::Empty);
    }
    let max = limits.max_len.min(Limits::MQTT.max_len);
    if s.len() > max {
        return Err(TopicError::TooLong { len: s.len(), max });
    }
    Ok(())
}

fn check_common(s: &str, limits: &Limits) -> Result<(), TopicError> {
    check_len(s, limits)?;
    if s.contains('\0') {
        return Err(TopicError::NullChar);
    }
    Ok(())
}

fn check_levels(s: &str, limits: &Limits) -> Result<(), TopicError> {
    // Counting separators is enough: levels = separators + 1.
    levels_within(s.bytes().filter(|&b| b == b'/').count() + 1, limits)
}

fn levels_within(levels: usize, limits: &Limits) -> Result<(), TopicError> {
    if levels > limits.max_levels {
        return Err(TopicError::TooManyLevels {
            levels,
            max: limits.max_levels,
        });
    }
    Ok(())
}

/// Checks the wildcard placement of a (non-shared) filter pattern.
fn check_pattern(p: &str) -> Result<(), TopicError> {
    if p.is_empty() {
        return Err(TopicError::Empty);
    }
    let mut levels = p.split('/').peekable();
    while let Some(level) = levels.next() {
        let last = levels.peek().is_none();
        match level {
            "+" => {}
            "#" if last => {}
            _ if level.contains(['+', '#']) => return Err(TopicError::MisplacedWildcard),
            _ => {}
        }
    }
    Ok(())
}

/// A validated topic name: what a PUBLISH is sent to. Non-empty, at most 65,535 bytes (or the
/// configured [`Limits`]), no wildcards, no U+0000.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicName(Box<str>);

impl TopicName {
    /// Validates `s` against MQTT's own limits.
    pub fn new(s: impl Into<String>) -> Result<Self, TopicError> {
        Self::with_limits(s, &Limits::MQTT)
    }

    /// Validates `s` against `limits`.
    pub fn with_limits(s: impl Into<String>, limits: &Limits) -> Result<Self, TopicError> {
        let s = s.into();
        Self::check(&s, limits)?;
        Ok(Self(s.into_boxed_str()))
    }

    /// Whether `s` would make a valid topic name under `limits`, without making one.
    pub fn check(s: &str, limits: &Limits) -> Result<(), TopicError> {
        check_len(s, limits)?;
        // One pass over the bytes, as this runs for every PUBLISH. No byte of a multi-byte
        // UTF-8 sequence is ASCII, so bytes are enough.
        let (mut separators, mut wildcard, mut null) = (0, false, false);
        for &b in s.as_bytes() {
            match b {
                b'/' => separators += 1,
                b'+' | b'#' => wildcard = true,
                0 => null = true,
                _ => {}
            }
        }
        if null {
            return Err(TopicError::NullChar);
        }
        if wildcard {
            return Err(TopicError::WildcardInName);
        }
        levels_within(separators + 1, limits)
    }

    /// The topic as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the topic starts with '$' (e.g. `$SYS/...`): such topics are not matched by
    /// filters whose first level is a wildcard.
    pub fn is_system(&self) -> bool {
        self.0.starts_with('$')
    }
}

impl AsRef<str> for TopicName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for TopicName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<TopicName> for String {
    fn from(t: TopicName) -> String {
        t.0.into()
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// A validated topic filter: what a SUBSCRIBE asks for. May be a shared subscription
/// `$share/{group}/{filter}` (MQTT 5.0 §4.8.2); [`TopicFilter::pattern`] is the part that is
/// matched against topic names.
///
/// Equality, ordering and hashing are those of the full text.
#[derive(Clone)]
pub struct TopicFilter {
    text: Box<str>,
    /// Byte offset of the pattern in `text`: 0 for an ordinary filter.
    pattern_start: usize,
}

impl TopicFilter {
    /// Validates `s` against MQTT's own limits.
    pub fn new(s: impl Into<String>) -> Result<Self, TopicError> {
        Self::with_limits(s, &Limits::MQTT)
    }

    /// Validates `s` against `limits`. The length limit applies to the whole text, the level
    /// limit to the pattern.
    pub fn with_limits(s: impl Into<String>, limits: &Limits) -> Result<Self, TopicError> {
        let s = s.into();
        check_common(&s, limits)?;
        let pattern_start = match s.strip_prefix("$share") {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => shared_pattern_start(&s)?,
            _ => 0,
        };
        let pattern = &s[pattern_start..];
        check_pattern(pattern)?;
        check_levels(pattern, limits)?;
        Ok(Self {
            text: s.into_boxed_str(),
            pattern_start,
        })
    }

    /// The full filter as given, including any `$share/{group}/` prefix.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The share group of a shared subscription.
    pub fn shared_group(&self) -> Option<&str> {
        if self.pattern_start == 0 {
            return None;
        }
        // pattern_start > 0 only for "$share/{group}/{pattern}", so the slice is in bounds
        // and on char boundaries ('/' is ASCII).
        self.text
            .get(SHARE_PREFIX.len()..self.pattern_start - 1)
            .filter(|g| !g.is_empty())
    }

    /// The filter without the `$share/{group}/` prefix: what is matched against topic names.
    pub fn pattern(&self) -> &str {
        self.text.get(self.pattern_start..).unwrap_or_default()
    }

    /// Whether the pattern contains '+' or '#'.
    pub fn has_wildcards(&self) -> bool {
        self.pattern().contains(['+', '#'])
    }

    /// Whether this filter can match `topic` (MQTT 5.0 §4.7).
    pub fn matches(&self, topic: &TopicName) -> bool {
        matches(self.pattern(), topic.as_str())
    }
}

/// Byte offset of the pattern of `s`, which starts with `$share` followed by nothing or '/'.
fn shared_pattern_start(s: &str) -> Result<usize, TopicError> {
    let rest = s
        .strip_prefix(SHARE_PREFIX)
        .ok_or(TopicError::BadSharedSubscription("missing share name"))?;
    let Some((group, pattern)) = rest.split_once('/') else {
        return Err(TopicError::BadSharedSubscription(if rest.is_empty() {
            "empty share name"
        } else {
            "missing '/' and filter after the share name"
        }));
    };
    if group.is_empty() {
        return Err(TopicError::BadSharedSubscription("empty share name"));
    }
    if group.contains(['+', '#']) {
        return Err(TopicError::BadSharedSubscription(
            "share name contains a wildcard",
        ));
    }
    if pattern.is_empty() {
        return Err(TopicError::BadSharedSubscription(
            "empty filter after the share name",
        ));
    }
    Ok(SHARE_PREFIX.len() + group.len() + 1)
}

impl AsRef<str> for TopicFilter {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl Borrow<str> for TopicFilter {
    fn borrow(&self) -> &str {
        &self.text
    }
}

impl From<TopicFilter> for String {
    fn from(f: TopicFilter) -> String {
        f.text.into()
    }
}

// By text only (`pattern_start` follows from it), so that `Borrow<str>` is sound.
impl PartialEq for TopicFilter {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for TopicFilter {}

impl Hash for TopicFilter {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

impl PartialOrd for TopicFilter {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TopicFilter {
    fn cmp(&self, other: &Self) -> Ordering {
        self.text.cmp(&other.text)
    }
}

impl fmt::Display for TopicFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for TopicFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.text, f)
    }
}

/// The naive, obviously correct matcher (MQTT 5.0 §4.7): does the filter `filter` (a pattern,
/// without any `$share/{group}/` prefix) match the topic name `topic`?
///
/// '+' matches exactly one level (which may be empty); '#' matches its own level and every
/// level below, including none ("a/#" matches "a"); a topic starting with '$' is not matched by
/// a filter whose first level is '+' or '#'. Both arguments are assumed valid; for invalid ones
/// the answer is unspecified but this never panics.
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && (filter.starts_with('+') || filter.starts_with('#')) {
        return false;
    }
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(fl), Some(tl)) if fl == tl => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name_err(s: &str) -> TopicError {
        TopicName::new(s).unwrap_err()
    }

    fn filter_err(s: &str) -> TopicError {
        TopicFilter::new(s).unwrap_err()
    }

    #[test]
    fn valid_names() {
        for s in [
            "a",
            "/",
            "a/b",
            "/finance",
            "a//b",
            "$SYS/x",
            "sport/tennis/player1",
            " ",
        ] {
            let t = TopicName::new(s).unwrap();
            assert_eq!(t.as_str(), s);
            assert_eq!(t.to_string(), s);
            assert_eq!(t.as_ref(), s);
        }
        assert!(TopicName::new("$SYS/x").unwrap().is_system());
        assert!(!TopicName::new("a/$SYS").unwrap().is_system());
    }

    #[test]
    fn invalid_names() {
        assert_eq!(name_err(""), TopicError::Empty);
        assert_eq!(name_err("a/+"), TopicError::WildcardInName);
        assert_eq!(name_err("#"), TopicError::WildcardInName);
        assert_eq!(name_err("a+b"), TopicError::WildcardInName);
        assert_eq!(name_err("a\0b"), TopicError::NullChar);
        let long = "x".repeat(65_536);
        assert_eq!(
            name_err(&long),
            TopicError::TooLong {
                len: 65_536,
                max: 65_535
            }
        );
        assert!(TopicName::new("x".repeat(65_535)).is_ok());
    }

    #[test]
    fn name_limits() {
        let limits = Limits {
            max_len: 5,
            max_levels: 2,
        };
        assert!(TopicName::with_limits("a/b", &limits).is_ok());
        assert_eq!(
            TopicName::with_limits("a/b/c", &limits),
            Err(TopicError::TooManyLevels { levels: 3, max: 2 })
        );
        // The check alone says the same, without making a name.
        assert_eq!(TopicName::check("a/b", &limits), Ok(()));
        assert_eq!(
            TopicName::check("a/b/c", &limits),
            Err(TopicError::TooManyLevels { levels: 3, max: 2 })
        );
        assert_eq!(
            TopicName::check("a/+", &Limits::MQTT),
            Err(TopicError::WildcardInName)
        );
        assert_eq!(
            TopicName::with_limits("abcdef", &limits),
            Err(TopicError::TooLong { len: 6, max: 5 })
        );
    }

    #[test]
    fn valid_filters() {
        for s in [
            "#",
            "+",
            "+/+",
            "/+",
            "a/#",
            "a/+/b",
            "+/#",
            "/",
            "a//b",
            "$SYS/#",
            "sport/+/player1",
        ] {
            let f = TopicFilter::new(s).unwrap();
            assert_eq!(f.as_str(), s);
            assert_eq!(f.pattern(), s);
            assert_eq!(f.shared_group(), None);
        }
        assert!(TopicFilter::new("a/+").unwrap().has_wildcards());
        assert!(!TopicFilter::new("a/b").unwrap().has_wildcards());
    }

    #[test]
    fn misplaced_wildcards() {
        for s in [
            "a/#/b", "#/a", "a#", "a/b#", "a+", "a/+b", "+a/b", "##", "++", "a/#/#",
        ] {
            assert_eq!(filter_err(s), TopicError::MisplacedWildcard, "{s}");
        }
        assert_eq!(filter_err(""), TopicError::Empty);
        assert_eq!(filter_err("a/\0"), TopicError::NullChar);
    }

    #[test]
    fn filter_limits() {
        let limits = Limits {
            max_len: 20,
            max_levels: 2,
        };
        assert!(TopicFilter::with_limits("$share/g/a/b", &limits).is_ok());
        assert_eq!(
            TopicFilter::with_limits("$share/g/a/b/c", &limits),
            Err(TopicError::TooManyLevels { levels: 3, max: 2 })
        );
        assert_eq!(
            TopicFilter::with_limits("$share/group/a/b/cdefgh", &limits),
            Err(TopicError::TooLong { len: 23, max: 20 })
        );
    }

    #[test]
    fn shared_subscriptions() {
        let f = TopicFilter::new("$share/g1/sport/+/x").unwrap();
        assert_eq!(f.shared_group(), Some("g1"));
        assert_eq!(f.pattern(), "sport/+/x");
        assert_eq!(f.as_str(), "$share/g1/sport/+/x");
        assert!(f.has_wildcards());
        let f = TopicFilter::new("$share/g/#").unwrap();
        assert_eq!((f.shared_group(), f.pattern()), (Some("g"), "#"));
        let f = TopicFilter::new("$share/g//").unwrap();
        assert_eq!((f.shared_group(), f.pattern()), (Some("g"), "/"));
        let f = TopicFilter::new("$share/g/$share/x").unwrap();
        assert_eq!((f.shared_group(), f.pattern()), (Some("g"), "$share/x"));

        for s in [
            "$share",
            "$share/",
            "$share/g",
            "$share/g/",
            "$share//a",
            "$share/+/x",
            "$share/#/x",
            "$share/a+/x",
        ] {
            assert!(
                matches!(filter_err(s), TopicError::BadSharedSubscription(_)),
                "{s}"
            );
        }
        assert_eq!(filter_err("$share/g/a/#/b"), TopicError::MisplacedWildcard);

        for s in [
            "$shared/a",
            "$sharex/a",
            "$SHARE/a",
            "a/$share/b",
            "$share2",
        ] {
            let f = TopicFilter::new(s).unwrap();
            assert_eq!((f.shared_group(), f.pattern()), (None, s));
        }
    }

    #[test]
    fn spec_examples() {
        // MQTT 5.0 §4.7.1.2
        let f = "sport/tennis/player1/#";
        assert!(matches(f, "sport/tennis/player1"));
        assert!(matches(f, "sport/tennis/player1/ranking"));
        assert!(matches(f, "sport/tennis/player1/score/wimbledon"));
        assert!(!matches(f, "sport/tennis/player2"));
        assert!(matches("sport/#", "sport"));
        assert!(matches("#", "sport/tennis"));
        // §4.7.1.3
        assert!(matches("sport/tennis/+", "sport/tennis/player1"));
        assert!(matches("sport/tennis/+", "sport/tennis/player2"));
        assert!(!matches("sport/tennis/+", "sport/tennis/player1/ranking"));
        assert!(!matches("sport/+", "sport"));
        assert!(matches("sport/+", "sport/"));
        assert!(matches("+/+", "/finance"));
        assert!(matches("/+", "/finance"));
        assert!(!matches("+", "/finance"));
        assert!(matches("+/tennis/#", "sport/tennis"));
        // §4.7.2
        assert!(!matches("#", "$SYS/monitor/Clients"));
        assert!(!matches("+/monitor/Clients", "$SYS/monitor/Clients"));
        assert!(matches("$SYS/#", "$SYS/monitor/Clients"));
        assert!(matches("$SYS/monitor/+", "$SYS/monitor/Clients"));
        assert!(!matches("+", "$SYS"));
        assert!(matches("$SYS/#", "$SYS"));
        // Case-sensitive, no normalisation.
        assert!(!matches("ACCOUNTS", "accounts"));
        assert!(!matches("a/b", "a/b/"));
        assert!(matches("a//b", "a//b"));
        assert!(matches("a/+/b", "a//b"));
    }

    #[test]
    fn filter_matches_name() {
        let f = TopicFilter::new("$share/g/a/+").unwrap();
        assert!(f.matches(&TopicName::new("a/b").unwrap()));
        assert!(!f.matches(&TopicName::new("$share/g/a/b").unwrap()));
    }

    #[test]
    fn borrow_as_str() {
        use std::collections::BTreeSet;
        let names: BTreeSet<TopicName> = ["b", "a"].map(|s| TopicName::new(s).unwrap()).into();
        assert!(names.contains("a"));
        let filters: BTreeSet<TopicFilter> = ["$share/g/x", "x"]
            .map(|s| TopicFilter::new(s).unwrap())
            .into();
        assert!(filters.contains("$share/g/x"));
        assert!(!filters.contains("g/x"));
        assert_eq!(String::from(TopicName::new("a/b").unwrap()), "a/b");
        assert_eq!(
            String::from(TopicFilter::new("$share/g/#").unwrap()),
            "$share/g/#"
        );
    }

    #[test]
    fn debug_is_the_text() {
        assert_eq!(format!("{:?}", TopicName::new("a/b").unwrap()), "\"a/b\"");
        assert_eq!(format!("{:?}", TopicFilter::new("a/#").unwrap()), "\"a/#\"");
    }

    proptest::proptest! {
        /// The one-pass check of a topic name gives what each rule, checked in turn, gives.
        #[test]
        fn name_check_applies_the_rules_in_order(
            s in "[a/+#\0é]{0,10}",
            max_len in 1usize..12,
            max_levels in 1usize..6,
        ) {
            let limits = Limits { max_len, max_levels };
            let expected = if s.is_empty() {
                Err(TopicError::Empty)
            } else if s.len() > max_len {
                Err(TopicError::TooLong { len: s.len(), max: max_len })
            } else if s.contains('\0') {
                Err(TopicError::NullChar)
            } else if s.contains(['+', '#']) {
                Err(TopicError::WildcardInName)
            } else if s.split('/').count() > max_levels {
                Err(TopicError::TooManyLevels { levels: s.split('/').count(), max: max_levels })
            } else {
                Ok(())
            };
            proptest::prop_assert_eq!(TopicName::check(&s, &limits), expected);
        }
    }
}
