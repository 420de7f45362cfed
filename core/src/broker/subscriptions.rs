//! Local subscriptions: a [`FilterTrie`] whose values hold the subscribers of each filter
//! pattern, direct and by shared-subscription group.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::session::SessionId;
use crate::codec::{QoS, SubscriptionOptions};
use crate::topic::{FilterTrie, TopicFilter};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Subscriber {
    pub options: SubscriptionOptions,
    pub subscription_id: Option<u32>,
    /// The subscription reaches topics its session may not receive
    /// ([`crate::acl::FilterAccess::Filtered`]): each message is checked before delivery.
    pub filtered: bool,
}

#[derive(Debug)]
pub(crate) struct SharedGroup {
    pub name: Arc<str>,
    /// `$share/{name}/{pattern}`, as subscribed.
    pub filter: Arc<str>,
    pub members: BTreeMap<SessionId, Subscriber>,
    /// Round-robin position (a `Cell` because matching only borrows the trie).
    cursor: Cell<usize>,
}

/// The subscribers of one filter pattern.
#[derive(Debug, Default)]
pub(crate) struct FilterEntry {
    pub direct: Direct,
    pub shared: Vec<SharedGroup>,
}

/// The direct (not shared) subscribers of one filter pattern, by session. Most filters have
/// one (a device's own topic), held inline; some have very many, held in a B-tree.
#[derive(Debug, Default)]
pub(crate) enum Direct {
    #[default]
    None,
    One(SessionId, Subscriber),
    Many(BTreeMap<SessionId, Subscriber>),
}

impl Direct {
    fn is_empty(&self) -> bool {
        match self {
            Direct::None => true,
            Direct::One(..) => false,
            Direct::Many(m) => m.is_empty(),
        }
    }

    /// Add or replace; the subscriber it replaced.
    fn insert(&mut self, session: SessionId, sub: Subscriber) -> Option<Subscriber> {
        match self {
            Direct::None => {
                *self = Direct::One(session, sub);
                None
            }
            Direct::One(s, old) if *s == session => Some(std::mem::replace(old, sub)),
            Direct::One(s, old) => {
                *self = Direct::Many(BTreeMap::from([(*s, *old), (session, sub)]));
                None
            }
            Direct::Many(m) => m.insert(session, sub),
        }
    }

    fn get_mut(&mut self, session: SessionId) -> Option<&mut Subscriber> {
        match self {
            Direct::One(s, sub) if *s == session => Some(sub),
            Direct::Many(m) => m.get_mut(&session),
            _ => None,
        }
    }

    fn remove(&mut self, session: SessionId) -> Option<Subscriber> {
        match self {
            Direct::None => None,
            Direct::One(s, sub) if *s == session => {
                let sub = *sub;
                *self = Direct::None;
                Some(sub)
            }
            Direct::One(..) => None,
            Direct::Many(m) => {
                let removed = m.remove(&session);
                if m.len() <= 1 {
                    *self = match m.pop_first() {
                        Some((s, sub)) => Direct::One(s, sub),
                        None => Direct::None,
                    };
                }
                removed
            }
        }
    }

    /// In session order.
    fn iter(&self) -> impl Iterator<Item = (SessionId, &Subscriber)> {
        let (one, many) = match self {
            Direct::None => (None, None),
            Direct::One(s, sub) => (Some((*s, sub)), None),
            Direct::Many(m) => (None, Some(m.iter().map(|(s, sub)| (*s, sub)))),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

impl FilterEntry {
    fn is_empty(&self) -> bool {
        self.direct.is_empty() && self.shared.is_empty()
    }
}

/// One session that should receive a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recipient {
    pub session: SessionId,
    pub qos: QoS,
    pub retain_as_published: bool,
    pub subscription_ids: Vec<u32>,
    pub shared: Option<Arc<str>>,
}

/// What a subscribe or unsubscribe changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Change {
    /// Subscribe: no subscription of this session to this filter existed before.
    /// Unsubscribe: one existed and was removed.
    pub session_changed: bool,
    /// The pattern went from no local subscriber to one (subscribe) or back (unsubscribe).
    pub route_changed: bool,
}

#[derive(Debug)]
pub(crate) struct SubscriptionIndex {
    trie: FilterTrie<FilterEntry>,
    count: usize,
}

impl SubscriptionIndex {
    pub fn new(seed: u64) -> Self {
        Self {
            trie: FilterTrie::new(seed),
            count: 0,
        }
    }

    /// Number of (session, filter) subscriptions.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether any subscription matches `topic`.
    pub fn matches_any(&self, topic: &str) -> bool {
        self.trie.matches_any(topic)
    }

    pub fn insert(&mut self, filter: &TopicFilter, session: SessionId, sub: Subscriber) -> Change {
        let route_changed = self
            .trie
            .get(filter.pattern())
            .is_none_or(FilterEntry::is_empty);
        let entry = self.trie.entry(filter.pattern());
        let previous = match filter.shared_group() {
            None => entry.direct.insert(session, sub),
            Some(name) => {
                let group = match entry.shared.iter().position(|g| &*g.name == name) {
                    Some(i) => &mut entry.shared[i],
                    None => {
                        entry.shared.push(SharedGroup {
                            name: name.into(),
                            filter: filter.as_str().into(),
                            members: BTreeMap::new(),
                            cursor: Cell::new(0),
                        });
                        // Just pushed, so the vector is not empty.
                        entry.shared.last_mut().expect("group just pushed")
                    }
                };
                group.members.insert(session, sub)
            }
        };
        if previous.is_none() {
            self.count += 1;
        }
        Change {
            session_changed: previous.is_none(),
            route_changed,
        }
    }

    pub fn remove(&mut self, filter: &TopicFilter, session: SessionId) -> Change {
        let Some(entry) = self.trie.get_mut(filter.pattern()) else {
            return Change {
                session_changed: false,
                route_changed: false,
            };
        };
        let removed = match filter.shared_group() {
            None => entry.direct.remove(session).is_some(),
            Some(name) => match entry.shared.iter().position(|g| &*g.name == name) {
                Some(i) => {
                    let removed = entry.shared[i].members.remove(&session).is_some();
                    if entry.shared[i].members.is_empty() {
                        entry.shared.remove(i);
                    }
                    removed
                }
                None => false,
            },
        };
        let now_empty = entry.is_empty();
        if now_empty {
            self.trie.remove(filter.pattern());
        }
        if removed {
            self.count -= 1;
        }
        Change {
            session_changed: removed,
            route_changed: removed && now_empty,
        }
    }

    /// Everyone who should receive a message on `topic`: one entry per session for its direct
    /// subscriptions (overlaps merged: highest QoS, every subscription identifier), plus one per
    /// matching shared group (a member chosen round-robin, the most [`Readiness`] first).
    /// `origin` is the publishing session, skipped by No Local subscriptions. A filtered
    /// subscription counts only if `may_receive` lets its session have the message.
    pub fn recipients(
        &self,
        topic: &str,
        origin: Option<SessionId>,
        readiness: impl Fn(SessionId) -> Readiness,
        may_receive: impl Fn(SessionId) -> bool,
        out: &mut Vec<Recipient>,
    ) {
        out.clear();
        let mut shared: Vec<Recipient> = Vec::new();
        self.trie.for_each_match(topic, |entry| {
            for (session, sub) in entry.direct.iter() {
                if sub.options.no_local && origin == Some(session) {
                    continue;
                }
                if sub.filtered && !may_receive(session) {
                    continue;
                }
                out.push(Recipient {
                    session,
                    qos: sub.options.qos,
                    retain_as_published: sub.options.retain_as_published,
                    subscription_ids: sub.subscription_id.into_iter().collect(),
                    shared: None,
                });
            }
            for group in &entry.shared {
                if let Some((session, sub)) = pick_member(group, &readiness, &may_receive) {
                    shared.push(Recipient {
                        session,
                        qos: sub.options.qos,
                        retain_as_published: sub.options.retain_as_published,
                        subscription_ids: sub.subscription_id.into_iter().collect(),
                        shared: Some(group.filter.clone()),
                    });
                }
            }
        });
        if out.len() > 1 {
            out.sort_by_key(|r| r.session);
            out.dedup_by(|later, kept| {
                if later.session != kept.session {
                    return false;
                }
                kept.qos = kept.qos.max(later.qos);
                kept.retain_as_published |= later.retain_as_published;
                kept.subscription_ids.append(&mut later.subscription_ids);
                true
            });
        }
        out.append(&mut shared);
    }

    /// Another member of the shared group `filter` than `except`, among those `eligible`
    /// accepts (and `may_receive` too, for filtered members), for re-sending a message
    /// `except` did not acknowledge.
    pub fn other_shared_member(
        &self,
        filter: &TopicFilter,
        except: SessionId,
        eligible: impl Fn(SessionId) -> bool,
        may_receive: impl Fn(SessionId) -> bool,
    ) -> Option<(SessionId, Subscriber)> {
        let name = filter.shared_group()?;
        let entry = self.trie.get(filter.pattern())?;
        let group = entry.shared.iter().find(|g| &*g.name == name)?;
        let (session, sub) = pick_member(
            group,
            &|s| {
                if s != except && eligible(s) {
                    Readiness::Ready
                } else {
                    Readiness::Offline
                }
            },
            &may_receive,
        )?;
        (session != except && eligible(session)).then_some((session, sub))
    }

    /// Mark a session's subscription to `filter` filtered or not; whether it exists.
    pub fn set_filtered(
        &mut self,
        filter: &TopicFilter,
        session: SessionId,
        filtered: bool,
    ) -> bool {
        let Some(entry) = self.trie.get_mut(filter.pattern()) else {
            return false;
        };
        let sub = match filter.shared_group() {
            None => entry.direct.get_mut(session),
            Some(name) => entry
                .shared
                .iter_mut()
                .find(|g| &*g.name == name)
                .and_then(|g| g.members.get_mut(&session)),
        };
        match sub {
            Some(sub) => {
                sub.filtered = filtered;
                true
            }
            None => false,
        }
    }
}

/// How well a member of a shared group can take a message now, least first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Readiness {
    /// Not connected: a message would wait in its session (QoS 0: dropped).
    Offline,
    /// Connected, but the shell reported its connection congested: QoS 0 would be dropped.
    Congested,
    Ready,
}

/// Round-robin over the group: the next member in turn that is [`Readiness::Ready`]; if there
/// is none, the next of the readiest there are (a message for an offline member is queued in
/// its session). A filtered member that `may_receive` refuses is passed over.
fn pick_member(
    group: &SharedGroup,
    readiness: &impl Fn(SessionId) -> Readiness,
    may_receive: &impl Fn(SessionId) -> bool,
) -> Option<(SessionId, Subscriber)> {
    let n = group.members.len();
    let start = group.cursor.get() % n.max(1);
    let mut fallback: Option<(Readiness, usize, SessionId, Subscriber)> = None;
    for (k, (&session, sub)) in group.members.iter().enumerate().cycle().skip(start).take(n) {
        if sub.filtered && !may_receive(session) {
            continue;
        }
        let ready = readiness(session);
        if ready == Readiness::Ready {
            group.cursor.set(k + 1);
            return Some((session, *sub));
        }
        if fallback.is_none_or(|(best, ..)| ready > best) {
            fallback = Some((ready, k, session, *sub));
        }
    }
    let (_, k, session, sub) = fallback?;
    group.cursor.set(k + 1);
    Some((session, sub))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(qos: QoS) -> Subscriber {
        Subscriber {
            options: SubscriptionOptions {
                qos,
                ..Default::default()
            },
            subscription_id: None,
            filtered: false,
        }
    }

    fn sessions(d: &Direct) -> Vec<(SessionId, QoS)> {
        d.iter().map(|(s, sub)| (s, sub.options.qos)).collect()
    }

    #[test]
    fn direct_subscribers_go_from_inline_to_a_tree_and_back() {
        let mut d = Direct::default();
        assert!(d.is_empty());
        assert_eq!(d.insert(7, sub(QoS::AtMostOnce)), None);
        assert!(matches!(d, Direct::One(7, _)));
        assert_eq!(
            d.insert(7, sub(QoS::AtLeastOnce)),
            Some(sub(QoS::AtMostOnce)),
            "a second subscribe replaces"
        );
        assert_eq!(d.insert(3, sub(QoS::ExactlyOnce)), None);
        assert_eq!(d.insert(5, sub(QoS::AtMostOnce)), None);
        assert_eq!(
            sessions(&d),
            [
                (3, QoS::ExactlyOnce),
                (5, QoS::AtMostOnce),
                (7, QoS::AtLeastOnce)
            ],
            "in session order"
        );
        assert_eq!(d.remove(4), None);
        assert_eq!(d.remove(3), Some(sub(QoS::ExactlyOnce)));
        assert_eq!(d.remove(7), Some(sub(QoS::AtLeastOnce)));
        assert!(
            matches!(d, Direct::One(5, _)),
            "one left is held inline again"
        );
        assert_eq!(d.remove(7), None);
        assert_eq!(d.remove(5), Some(sub(QoS::AtMostOnce)));
        assert!(d.is_empty());
        assert!(sessions(&d).is_empty());
    }
}
