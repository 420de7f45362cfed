//! Access rules: which topics a client may publish to and receive from.
//!
//! An [`Acl`] is an ordered list of [`Rule`]s and a default [`Permission`]. For a PUBLISH, or
//! for a message about to be delivered, the first rule that applies to the client and whose
//! topic pattern matches the topic decides; without one, the default does. A subscription is
//! classified as a whole ([`FilterAccess`]): allowed when every topic its filter matches may
//! be received, denied when none may, and otherwise filtered — accepted, with each message
//! checked as it is delivered. So `deny subscribe secret/#` refuses a subscription to
//! `secret/x` but lets `#` stand without ever delivering `secret/...` to it, and subscribers
//! whose filters overlap no deny rule are never checked per message.
//!
//! Rule topics are topic filters in which `%u` and `%c` stand for the client's username and
//! client id. A rule with a placeholder does not apply to a client without the value, nor to
//! one whose value is empty or holds `/`, `+` or `#` (it would change the filter's shape).
//! A leading wildcard does not match topics that start with `$`, as in subscriptions.
//!
//! ```
//! use meridian_core::acl::{Acl, Action, ClientRef, FilterAccess, Permission, Rule};
//!
//! let acl = Acl::new(
//!     Permission::Allow,
//!     vec![
//!         Rule::new(Permission::Deny, Action::Subscribe, "secret/#").unwrap(),
//!         Rule::new(Permission::Allow, Action::All, "users/%u/#").unwrap(),
//!         Rule::new(Permission::Deny, Action::Publish, "users/#").unwrap(),
//!     ],
//! );
//! let alice = ClientRef { client_id: "c1", username: Some("alice") };
//! assert!(acl.may_publish(&alice, "users/alice/status"));
//! assert!(!acl.may_publish(&alice, "users/bob/status"));
//! assert_eq!(acl.filter_access(&alice, "secret/+"), FilterAccess::Denied);
//! assert_eq!(acl.filter_access(&alice, "#"), FilterAccess::Filtered);
//! assert_eq!(acl.filter_access(&alice, "news/#"), FilterAccess::Allowed);
//! assert!(!acl.may_receive(&alice, "secret/plans"));
//! assert!(acl.may_receive(&alice, "news/today"));
//! ```

use core::fmt;
use core::str::FromStr;

/// The identity that access rules are evaluated against.
#[derive(Debug, Clone, Copy)]
pub struct ClientRef<'a> {
    /// The client identifier of the session.
    pub client_id: &'a str,
    /// The user the client logged in as, if any.
    pub username: Option<&'a str>,
}

/// What a subscription may receive, decided once when it is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FilterAccess {
    /// Every topic the filter matches may be received.
    Allowed,
    /// Some topics the filter matches may be received and some not: the subscription is
    /// accepted and each message is checked as it is delivered.
    Filtered,
    /// No topic the filter matches may be received: the subscription is refused.
    Denied,
}

/// Whether a rule lets the client in or keeps it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(try_from = "String")
)]
pub enum Permission {
    /// `allow`
    Allow,
    /// `deny`
    Deny,
}

/// What a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `publish`: messages the client sends (its will included).
    Publish,
    /// `subscribe`: messages the client receives, and the subscriptions that would bring them.
    Subscribe,
    /// `all`: both.
    All,
}

/// A rule or a part of one that cannot be used, with what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// Not `allow` or `deny`.
    #[error("{0:?} is not a permission (allow or deny)")]
    Permission(String),
    /// Not `publish`, `subscribe` or `all`.
    #[error("{0:?} is not an action (publish, subscribe or all)")]
    Action(String),
    /// The rule's topic is not a topic filter.
    #[error("topic {topic:?}: {reason}")]
    Topic {
        /// The topic as written.
        topic: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl FromStr for Permission {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Self, RuleError> {
        match s {
            "allow" => Ok(Self::Allow),
            "deny" => Ok(Self::Deny),
            _ => Err(RuleError::Permission(s.to_owned())),
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        })
    }
}

impl FromStr for Action {
    type Err = RuleError;

    fn from_str(s: &str) -> Result<Self, RuleError> {
        match s {
            "publish" => Ok(Self::Publish),
            "subscribe" => Ok(Self::Subscribe),
            "all" => Ok(Self::All),
            _ => Err(RuleError::Action(s.to_owned())),
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Publish => "publish",
            Self::Subscribe => "subscribe",
            Self::All => "all",
        })
    }
}

/// One access rule: a permission for an action on the topics a pattern matches, for every
/// client or for one user or client id.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(try_from = "RuleTable")
)]
pub struct Rule {
    permission: Permission,
    action: Action,
    topic: String,
    pattern: Pattern,
    user: Option<String>,
    client_id: Option<String>,
}

impl TryFrom<String> for Permission {
    type Error = RuleError;

    fn try_from(s: String) -> Result<Self, RuleError> {
        s.parse()
    }
}

/// A rule as a configuration writes it, before it is checked.
#[cfg(feature = "serde")]
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleTable {
    permission: String,
    action: String,
    topic: String,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    client_id: Option<String>,
}

#[cfg(feature = "serde")]
impl TryFrom<RuleTable> for Rule {
    type Error = RuleError;

    fn try_from(t: RuleTable) -> Result<Self, RuleError> {
        let mut rule = Rule::new(t.permission.parse()?, t.action.parse()?, &t.topic)?;
        if let Some(user) = t.user {
            rule = rule.for_user(user);
        }
        if let Some(client_id) = t.client_id {
            rule = rule.for_client_id(client_id);
        }
        Ok(rule)
    }
}

impl Rule {
    /// A rule for every client; `topic` is a topic filter that may hold `%u` and `%c`.
    pub fn new(permission: Permission, action: Action, topic: &str) -> Result<Self, RuleError> {
        Ok(Self {
            permission,
            action,
            topic: topic.to_owned(),
            pattern: Pattern::parse(topic)?,
            user: None,
            client_id: None,
        })
    }

    /// The same rule, for the clients logged in as `user` only.
    pub fn for_user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// The same rule, for the client with this client id only.
    pub fn for_client_id(mut self, client_id: impl Into<String>) -> Self {
        self.client_id = Some(client_id.into());
        self
    }

    /// Allow or deny.
    pub fn permission(&self) -> Permission {
        self.permission
    }

    /// What the rule is about.
    pub fn action(&self) -> Action {
        self.action
    }

    /// The topic pattern as written.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The user the rule is limited to, if any.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The client id the rule is limited to, if any.
    pub fn client_id(&self) -> Option<&str> {
        self.client_id.as_deref()
    }

    /// Whether the rule speaks of `action` for `client` (its placeholders can be filled).
    fn applies(&self, client: &ClientRef<'_>, action: Action) -> bool {
        (self.action == Action::All || self.action == action)
            && self
                .user
                .as_deref()
                .is_none_or(|u| Some(u) == client.username)
            && self
                .client_id
                .as_deref()
                .is_none_or(|c| c == client.client_id)
            && (!self.pattern.uses_user || client.username.is_some_and(safe_value))
            && (!self.pattern.uses_client_id || safe_value(client.client_id))
    }
}

/// A placeholder's value that leaves the pattern's shape as it is.
fn safe_value(s: &str) -> bool {
    !s.is_empty() && !s.contains(['/', '+', '#'])
}

/// Ordered access rules and what holds where none applies. With the `serde` feature it reads
/// from a configuration's `[acl]` table: `default = "allow" | "deny"` and `[[acl.rules]]`
/// tables of `permission`, `action`, `topic` and optional `user` and `client_id`, each checked
/// as it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(deny_unknown_fields)
)]
pub struct Acl {
    default: Permission,
    #[cfg_attr(feature = "serde", serde(default))]
    rules: Vec<Rule>,
}

impl Default for Acl {
    /// No rules, everything allowed.
    fn default() -> Self {
        Self::new(Permission::Allow, Vec::new())
    }
}

impl Acl {
    /// Rules tried in order; `default` decides where none applies.
    pub fn new(default: Permission, rules: Vec<Rule>) -> Self {
        Self { default, rules }
    }

    /// What holds where no rule applies.
    pub fn default_permission(&self) -> Permission {
        self.default
    }

    /// The rules, in the order they are tried.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Whether `client` may publish to `topic` (a topic name).
    pub fn may_publish(&self, client: &ClientRef<'_>, topic: &str) -> bool {
        self.topic_allowed(client, Action::Publish, topic)
    }

    /// Whether a message on `topic` may be delivered to `client`.
    pub fn may_receive(&self, client: &ClientRef<'_>, topic: &str) -> bool {
        self.topic_allowed(client, Action::Subscribe, topic)
    }

    /// What a subscription of `client` to `filter` (a topic filter without `$share/group/`)
    /// may receive. `Allowed` and `Denied` are exact for every topic the filter matches;
    /// `Filtered` may be answered for a filter whose topics all turn out alike (the messages
    /// are then checked one by one, to the same effect).
    pub fn filter_access(&self, client: &ClientRef<'_>, filter: &str) -> FilterAccess {
        let (mut allowed, mut denied) = (false, false);
        let mut mark = |permission| match permission {
            Permission::Allow => allowed = true,
            Permission::Deny => denied = true,
        };
        let mut decided = false;
        for rule in self.applicable(client, Action::Subscribe) {
            match rule.pattern.relation(filter, client) {
                Relation::Disjoint => {}
                Relation::Overlaps => mark(rule.permission),
                Relation::Covers => {
                    // Every topic of the filter not decided by an earlier rule is decided here.
                    mark(rule.permission);
                    decided = true;
                    break;
                }
            }
        }
        if !decided {
            mark(self.default);
        }
        match (allowed, denied) {
            (true, false) => FilterAccess::Allowed,
            (false, _) => FilterAccess::Denied,
            (true, true) => FilterAccess::Filtered,
        }
    }

    fn topic_allowed(&self, client: &ClientRef<'_>, action: Action, topic: &str) -> bool {
        let permission = self
            .applicable(client, action)
            .find(|rule| rule.pattern.relation(topic, client) == Relation::Covers)
            .map_or(self.default, |rule| rule.permission);
        permission == Permission::Allow
    }

    fn applicable<'s>(
        &'s self,
        client: &'s ClientRef<'_>,
        action: Action,
    ) -> impl Iterator<Item = &'s Rule> {
        self.rules.iter().filter(move |r| r.applies(client, action))
    }
}

/// How a rule's pattern stands to a subscription's filter (or a topic, which either it
/// matches — `Covers` — or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Relation {
    /// No topic is matched by both.
    Disjoint,
    /// Some topic is matched by both; some topic of the filter may not be matched by the rule.
    Overlaps,
    /// Every topic the filter matches, the rule matches too.
    Covers,
}

/// A rule's topic, parsed: levels, some with placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pattern {
    levels: Vec<Level>,
    pub(crate) uses_user: bool,
    pub(crate) uses_client_id: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Level {
    /// `+`
    Plus,
    /// `#`, the last level.
    Hash,
    /// A level without placeholders.
    Text(Box<str>),
    /// A level with `%u` or `%c` in it.
    Template(Box<[Piece]>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(Box<str>),
    User,
    ClientId,
}

/// The longest topic MQTT carries.
const MAX_TOPIC_LEN: usize = u16::MAX as usize;

impl Pattern {
    pub(crate) fn parse(topic: &str) -> Result<Self, RuleError> {
        let bad = |reason| RuleError::Topic {
            topic: topic.to_owned(),
            reason,
        };
        if topic.is_empty() {
            return Err(bad("empty"));
        }
        if topic.len() > MAX_TOPIC_LEN {
            return Err(bad("longer than 65,535 bytes"));
        }
        if topic.contains('\0') {
            return Err(bad("contains the null character"));
        }
        if topic == "$share" || topic.starts_with("$share/") {
            return Err(bad(
                "rules name topics, not shared subscriptions: write the filter without \
                 $share/GROUP/ (shared subscriptions are checked on their filter)",
            ));
        }
        let mut levels = Vec::new();
        let (mut uses_user, mut uses_client_id) = (false, false);
        let mut parts = topic.split('/').peekable();
        while let Some(part) = parts.next() {
            let level = match part {
                "+" => Level::Plus,
                "#" if parts.peek().is_none() => Level::Hash,
                _ if part.contains(['+', '#']) => {
                    return Err(bad(
                        "misplaced wildcard: '#' must be the whole last level, '+' a whole level",
                    ));
                }
                _ => {
                    let pieces = pieces(part);
                    uses_user |= pieces.contains(&Piece::User);
                    uses_client_id |= pieces.contains(&Piece::ClientId);
                    match <[Piece; 1]>::try_from(pieces) {
                        Ok([Piece::Text(text)]) => Level::Text(text),
                        Ok(one) => Level::Template(Box::new(one)),
                        Err(many) => Level::Template(many.into_boxed_slice()),
                    }
                }
            };
            levels.push(level);
        }
        Ok(Self {
            levels,
            uses_user,
            uses_client_id,
        })
    }

    /// How this pattern, its placeholders filled from `client`, stands to `subject`, a topic
    /// filter or a topic name. The rule must apply to the client ([`Rule::applies`]).
    pub(crate) fn relation(&self, subject: &str, client: &ClientRef<'_>) -> Relation {
        let mut subject_levels = subject.split('/');
        let mut covers = true;
        for (i, level) in self.levels.iter().enumerate() {
            let next = subject_levels.next();
            if i == 0 && !self.dollar_compatible(next, client) {
                return Relation::Disjoint;
            }
            match (level, next) {
                (Level::Hash, _) => {
                    return if covers {
                        Relation::Covers
                    } else {
                        Relation::Overlaps
                    };
                }
                // The subject's `#` also matches its parent level, which this longer pattern
                // does not: some topics are shared, not all.
                (_, Some("#")) => return Relation::Overlaps,
                (_, None) => return Relation::Disjoint,
                (Level::Plus, Some(_)) => {}
                (_, Some("+")) => covers = false,
                (Level::Text(text), Some(s)) if **text == *s => {}
                (Level::Template(pieces), Some(s)) if fills(pieces, s, client) => {}
                _ => return Relation::Disjoint,
            }
        }
        match subject_levels.next() {
            None if covers => Relation::Covers,
            None => Relation::Overlaps,
            // `a` and `a/#` share the topic `a`.
            Some("#") if subject_levels.next().is_none() => Relation::Overlaps,
            Some(_) => Relation::Disjoint,
        }
    }

    /// Whether the first levels can meet, given that a leading wildcard matches no topic that
    /// starts with `$`.
    fn dollar_compatible(&self, subject_first: Option<&str>, client: &ClientRef<'_>) -> bool {
        let Some(subject_first) = subject_first else {
            return true;
        };
        let subject_wild = matches!(subject_first, "+" | "#");
        match &self.levels[0] {
            Level::Plus | Level::Hash => !subject_first.starts_with('$'),
            Level::Text(text) => !(subject_wild && text.starts_with('$')),
            Level::Template(pieces) => !(subject_wild && first_char(pieces, client) == Some('$')),
        }
    }
}

/// A level's text split at its placeholders.
fn pieces(level: &str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = level.chars().peekable();
    while let Some(c) = chars.next() {
        let placeholder = match (c, chars.peek()) {
            ('%', Some('u')) => Some(Piece::User),
            ('%', Some('c')) => Some(Piece::ClientId),
            _ => None,
        };
        match placeholder {
            Some(piece) => {
                chars.next();
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text).into()));
                }
                pieces.push(piece);
            }
            None => text.push(c),
        }
    }
    if !text.is_empty() || pieces.is_empty() {
        pieces.push(Piece::Text(text.into()));
    }
    pieces
}

/// The placeholders' value for `client` (present, as [`Rule::applies`] checked).
fn value<'a>(piece: &'a Piece, client: &ClientRef<'a>) -> &'a str {
    match piece {
        Piece::Text(text) => text,
        Piece::User => client.username.unwrap_or_default(),
        Piece::ClientId => client.client_id,
    }
}

/// Whether the template, filled from `client`, reads `level`.
fn fills(pieces: &[Piece], level: &str, client: &ClientRef<'_>) -> bool {
    let mut rest = level;
    for piece in pieces {
        match rest.strip_prefix(value(piece, client)) {
            Some(r) => rest = r,
            None => return false,
        }
    }
    rest.is_empty()
}

fn first_char(pieces: &[Piece], client: &ClientRef<'_>) -> Option<char> {
    pieces
        .iter()
        .find_map(|piece| value(piece, client).chars().next())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: ClientRef<'static> = ClientRef {
        client_id: "c1",
        username: Some("alice"),
    };

    fn relation(pattern: &str, subject: &str) -> Relation {
        Pattern::parse(pattern).unwrap().relation(subject, &ALICE)
    }

    #[test]
    fn relations_between_patterns_and_filters() {
        use Relation::*;
        for (pattern, subject, expected) in [
            ("a/#", "a/b/c", Covers),
            ("a/#", "a", Covers),
            ("a/#", "a/#", Covers),
            ("a/+", "a/b", Covers),
            ("a/+", "a/+", Covers),
            ("a/+", "a/#", Overlaps),
            ("a/b", "a/+", Overlaps),
            ("a/b", "a/#", Overlaps),
            ("a", "a/#", Overlaps),
            ("#", "x/#", Covers),
            ("secret/#", "#", Overlaps),
            ("a/+/c", "a/b/+", Overlaps),
            ("a/b", "a/c", Disjoint),
            ("a/b", "a/b/c", Disjoint),
            ("a/b/c", "a/b", Disjoint),
            ("a/+", "a", Disjoint),
            ("#", "$SYS/x", Disjoint),
            ("+/x", "$a/x", Disjoint),
            ("#", "$SYS/#", Disjoint),
            ("$SYS/#", "#", Disjoint),
            ("$SYS/#", "+/x", Disjoint),
            ("$SYS/+", "$SYS/#", Overlaps),
            ("$SYS/#", "$SYS/broker/uptime", Covers),
            ("users/%u/#", "users/alice/x", Covers),
            ("users/%u/#", "users/bob/x", Disjoint),
            ("users/%u/#", "users/+/x", Overlaps),
            ("users/%u-%c", "users/alice-c1", Covers),
            ("users/%u-%c", "users/alice-c2", Disjoint),
            ("x/50%/y", "x/50%/y", Covers),
        ] {
            assert_eq!(
                relation(pattern, subject),
                expected,
                "{pattern} against {subject}"
            );
        }
    }

    #[test]
    fn bad_topics_are_refused_with_a_reason() {
        for bad in ["", "a/#/b", "a+", "a/b#", "$share/g/a", "a\0b"] {
            let e = Rule::new(Permission::Allow, Action::All, bad).unwrap_err();
            assert!(matches!(e, RuleError::Topic { .. }), "{bad}: {e}");
        }
        assert_eq!(
            "maybe".parse::<Permission>(),
            Err(RuleError::Permission("maybe".into()))
        );
        assert_eq!(
            "read".parse::<Action>(),
            Err(RuleError::Action("read".into()))
        );
        assert_eq!("subscribe".parse::<Action>(), Ok(Action::Subscribe));
    }

    #[test]
    fn placeholders_without_a_safe_value_leave_the_rule_out() {
        let rule = Rule::new(Permission::Allow, Action::All, "users/%u/%c").unwrap();
        let evil = ClientRef {
            client_id: "#",
            username: Some("a/b"),
        };
        let anon = ClientRef {
            client_id: "c2",
            username: None,
        };
        assert!(rule.applies(&ALICE, Action::Publish));
        assert!(!rule.applies(&evil, Action::Publish));
        assert!(!rule.applies(&anon, Action::Publish));
        let plain = Rule::new(Permission::Allow, Action::All, "plain").unwrap();
        assert!(plain.applies(&evil, Action::Subscribe));
    }

    #[test]
    fn first_rule_that_applies_decides() {
        let acl = Acl::new(
            Permission::Deny,
            vec![
                Rule::new(Permission::Deny, Action::Subscribe, "secret/#").unwrap(),
                Rule::new(Permission::Allow, Action::All, "users/%u/#").unwrap(),
                Rule::new(Permission::Allow, Action::Subscribe, "#").unwrap(),
                Rule::new(Permission::Allow, Action::Publish, "clients/%c").unwrap(),
                Rule::new(Permission::Allow, Action::Publish, "ops/#")
                    .unwrap()
                    .for_user("root"),
            ],
        );
        let anon = ClientRef {
            client_id: "c2",
            username: None,
        };
        assert!(acl.may_publish(&ALICE, "users/alice/x"));
        assert!(!acl.may_publish(&ALICE, "users/bob/x"));
        assert!(!acl.may_publish(&anon, "users/x"));
        assert!(acl.may_publish(&anon, "clients/c2"));
        assert!(!acl.may_publish(&anon, "clients/c1"));
        assert!(!acl.may_publish(&ALICE, "ops/restart"));
        let root = ClientRef {
            client_id: "r",
            username: Some("root"),
        };
        assert!(acl.may_publish(&root, "ops/restart"));

        assert_eq!(acl.filter_access(&ALICE, "news/#"), FilterAccess::Allowed);
        assert_eq!(acl.filter_access(&ALICE, "#"), FilterAccess::Filtered);
        assert_eq!(acl.filter_access(&ALICE, "secret/x"), FilterAccess::Denied);
        assert_eq!(acl.filter_access(&ALICE, "secret/#"), FilterAccess::Denied);
        assert!(acl.may_receive(&ALICE, "news/x"));
        assert!(!acl.may_receive(&ALICE, "secret/x"));
        // `#` matches no `$` topic: nothing but the default speaks for `$SYS`.
        assert_eq!(acl.filter_access(&ALICE, "$SYS/#"), FilterAccess::Denied);
    }

    #[test]
    fn a_filter_partly_allowed_by_a_narrower_rule_is_filtered() {
        let acl = Acl::new(
            Permission::Deny,
            vec![Rule::new(Permission::Allow, Action::Subscribe, "users/%u/#").unwrap()],
        );
        assert_eq!(acl.filter_access(&ALICE, "#"), FilterAccess::Filtered);
        assert_eq!(
            acl.filter_access(&ALICE, "users/+/x"),
            FilterAccess::Filtered
        );
        assert_eq!(
            acl.filter_access(&ALICE, "users/alice/+"),
            FilterAccess::Allowed
        );
        assert_eq!(acl.filter_access(&ALICE, "other/#"), FilterAccess::Denied);
        assert!(acl.may_receive(&ALICE, "users/alice/inbox"));
        assert!(!acl.may_receive(&ALICE, "users/bob/inbox"));
    }
}
