//! Topic names, topic filters and the tries that match them.
//!
//! - [`TopicName`], [`TopicFilter`]: validated newtypes (MQTT 5.0 §4.7, shared subscriptions
//!   §4.8.2), with [`Limits`] and [`TopicError`]; [`matches()`] is the naive reference matcher.
//! - [`FilterTrie`]: stored filters matched by a topic name (subscriptions; the publish path).
//! - [`TopicTree`]: stored topic names matched by a filter (retained messages).
//!
//! Both tries intern level strings, keep their nodes in slabs (nothing recurses, so a
//! 65,535-byte topic of 32k levels is fine), hash with a caller-supplied seed and visit matches
//! in an order that depends only on what was stored.
//!
//! ```
//! use meridian_core::topic::{FilterTrie, TopicFilter, TopicName, TopicTree};
//!
//! let filter = TopicFilter::new("$share/workers/sport/+/score").unwrap();
//! assert_eq!(filter.shared_group(), Some("workers"));
//!
//! // Subscriptions: the trie stores patterns; share groups live in the value.
//! let mut subs: FilterTrie<Vec<&str>> = FilterTrie::new(42);
//! subs.entry(filter.pattern()).push("client-a");
//! subs.entry("sport/#").push("client-b");
//! subs.entry("#").push("client-c");
//!
//! let topic = TopicName::new("sport/tennis/score").unwrap();
//! let mut to = Vec::new();
//! subs.for_each_match(topic.as_str(), |clients| to.extend_from_slice(clients));
//! to.sort();
//! assert_eq!(to, ["client-a", "client-b", "client-c"]);
//!
//! // '$' topics are not matched by a leading wildcard.
//! let mut n = 0;
//! subs.for_each_match("$SYS/uptime", |_| n += 1);
//! assert_eq!(n, 0);
//!
//! // Retained messages: the tree stores topic names and is queried with a filter.
//! let mut retained = TopicTree::new(42);
//! retained.insert("sport/tennis/score", "15-0");
//! retained.insert("sport/golf/score", "-3");
//! retained.insert("news", "hello");
//! let mut got = Vec::new();
//! retained.for_each_match("sport/+/score", |m| got.push(*m));
//! assert_eq!(got.len(), 2);
//! ```

mod interner;
mod levels;
mod tree;
mod trie;
mod validate;

pub use tree::TopicTree;
pub use trie::FilterTrie;
pub use validate::{Limits, TopicError, TopicFilter, TopicName, matches};
