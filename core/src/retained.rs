//! Retained messages across the nodes of a deployment: last writer wins per topic.
//!
//! Every retained write (a message, or a delete by an empty payload) gets a [`Stamp`]: a
//! hybrid logical clock reading ([`Hlc`]) of the node that accepted it, and that node's id to
//! break ties. A node keeps, per topic, the write with the greatest stamp ([`LwwMap`]);
//! deletes stay as tombstones so that an older message arriving late cannot come back. The
//! merge is commutative, associative and idempotent, so nodes that saw the same writes in any
//! order, any number of times, hold the same state, which [`LwwMap::digest`] summarises for
//! anti-entropy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::routes::NodeId;

/// A hybrid logical clock reading: wall-clock milliseconds, and a counter that orders events
/// within one millisecond (or while the wall clock lags a reading seen from another node).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Hlc {
    /// Wall-clock milliseconds: the greatest seen, local or remote.
    pub wall_ms: u64,
    /// Orders readings with the same `wall_ms`.
    pub logical: u32,
}

impl Hlc {
    /// The reading for a local event at `now_ms`: greater than every earlier reading and
    /// every reading observed.
    pub fn tick(&mut self, now_ms: u64) -> Hlc {
        if now_ms > self.wall_ms {
            self.wall_ms = now_ms;
            self.logical = 0;
        } else if self.logical == u32::MAX {
            // Never wraps: readings far ahead of any wall clock are refused before they are
            // observed (`ClusterConfig::max_clock_drift_ms`).
            self.wall_ms = self.wall_ms.saturating_add(1);
            self.logical = 0;
        } else {
            self.logical += 1;
        }
        *self
    }

    /// Account for a reading from another node, so that later local readings order after it.
    pub fn observe(&mut self, remote: Hlc, now_ms: u64) {
        let before = *self;
        *self = before.max(remote);
        if now_ms > self.wall_ms {
            *self = Hlc {
                wall_ms: now_ms,
                logical: 0,
            };
        }
    }
}

/// When, and where, a retained write was accepted. Writes are ordered by clock, then node id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp {
    /// The clock reading of the node that accepted the write.
    pub hlc: Hlc,
    /// That node's id; breaks ties between equal readings.
    pub node: NodeId,
}

/// The winning write for one topic: a value, or `None` for a delete (a tombstone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LwwEntry<V> {
    /// The write's stamp.
    pub stamp: Stamp,
    /// The value written, or `None` for a delete.
    pub value: Option<V>,
}

/// A summary of what a node holds of the retained writes ([`LwwMap::digest`]): equal on nodes
/// that hold the same writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RetainedDigest {
    /// A hash over every topic's stamp and whether it is a tombstone.
    pub hash: u64,
    /// Topics held, tombstones included.
    pub entries: u64,
}

/// A last-writer-wins register per topic, with tombstones (bounded by the caller through
/// [`LwwMap::prune_tombstones`]).
#[derive(Clone, Debug)]
pub struct LwwMap<V> {
    entries: BTreeMap<Arc<str>, LwwEntry<V>>,
    /// Tombstones, oldest first.
    tombstones: BTreeSet<(Stamp, Arc<str>)>,
    hash: u64,
}

impl<V> Default for LwwMap<V> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            tombstones: BTreeSet::new(),
            hash: 0,
        }
    }
}

/// FNV-1a of one entry (topic, stamp, delete or not), so that equal states hash equal on
/// every node and every build.
fn entry_hash(topic: &str, stamp: &Stamp, deleted: bool) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(topic.as_bytes());
    eat(&[0xff]);
    eat(&stamp.hlc.wall_ms.to_be_bytes());
    eat(&stamp.hlc.logical.to_be_bytes());
    eat(stamp.node.as_str().as_bytes());
    eat(&[u8::from(deleted)]);
    h
}

impl<V> LwwMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Merge one write: it wins if its stamp is greater than the topic's current one, or, for a
    /// tombstone, equal to a live write's (the release of that very write). Returns whether it
    /// won (and the state changed).
    pub fn apply(&mut self, topic: &str, stamp: Stamp, value: Option<V>) -> bool {
        let releases = |e: &LwwEntry<V>| e.value.is_some() && value.is_none();
        if self
            .entries
            .get(topic)
            .is_some_and(|e| e.stamp > stamp || (e.stamp == stamp && !releases(e)))
        {
            return false;
        }
        let topic: Arc<str> = match self.entries.remove_entry(topic) {
            Some((key, old)) => {
                self.unaccount(&key, &old);
                key
            }
            None => topic.into(),
        };
        let entry = LwwEntry { stamp, value };
        self.hash ^= entry_hash(&topic, &entry.stamp, entry.value.is_none());
        if entry.value.is_none() {
            self.tombstones.insert((entry.stamp.clone(), topic.clone()));
        }
        self.entries.insert(topic, entry);
        true
    }

    fn unaccount(&mut self, topic: &Arc<str>, old: &LwwEntry<V>) {
        self.hash ^= entry_hash(topic, &old.stamp, old.value.is_none());
        if old.value.is_none() {
            self.tombstones.remove(&(old.stamp.clone(), topic.clone()));
        }
    }

    /// Forget a topic without a tombstone (its message expired on every node by itself).
    pub fn forget(&mut self, topic: &str) -> Option<LwwEntry<V>> {
        let (key, old) = self.entries.remove_entry(topic)?;
        self.unaccount(&key, &old);
        Some(old)
    }

    /// Drop the oldest tombstones beyond `max`; returns their topics. A node that was away
    /// longer than the dropped tombstones lived may bring an older message back.
    pub fn prune_tombstones(&mut self, max: usize) -> Vec<Arc<str>> {
        let mut gone = Vec::new();
        while self.tombstones.len() > max {
            let Some((_, topic)) = self.tombstones.pop_first() else {
                break;
            };
            if let Some(old) = self.entries.remove(&topic) {
                self.hash ^= entry_hash(&topic, &old.stamp, true);
            }
            gone.push(topic);
        }
        gone
    }

    /// The winning write for `topic`, tombstone or not.
    pub fn get(&self, topic: &str) -> Option<&LwwEntry<V>> {
        self.entries.get(topic)
    }

    /// Every entry (tombstones included), by topic.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &LwwEntry<V>)> {
        self.entries.iter()
    }

    /// Entries, tombstones included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no topic is held (tombstones included).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Tombstones held.
    pub fn tombstones(&self) -> usize {
        self.tombstones.len()
    }

    /// A summary of the state, equal on nodes that hold the same writes.
    pub fn digest(&self) -> RetainedDigest {
        RetainedDigest {
            hash: self.hash,
            entries: self.entries.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(wall_ms: u64, logical: u32, node: &str) -> Stamp {
        Stamp {
            hlc: Hlc { wall_ms, logical },
            node: NodeId::new(node).unwrap(),
        }
    }

    #[test]
    fn clock_orders_local_events_after_everything_seen() {
        let mut c = Hlc::default();
        let a = c.tick(100);
        let b = c.tick(100);
        assert!(b > a, "same millisecond: the counter moves");
        c.observe(
            Hlc {
                wall_ms: 500,
                logical: 3,
            },
            120,
        );
        let d = c.tick(130);
        assert_eq!(
            d,
            Hlc {
                wall_ms: 500,
                logical: 4
            },
            "after a reading from a node whose clock is ahead"
        );
        assert_eq!(
            c.tick(600),
            Hlc {
                wall_ms: 600,
                logical: 0
            }
        );
    }

    #[test]
    fn later_write_wins_ties_break_by_node_and_deletes_stay() {
        let mut m = LwwMap::new();
        assert!(m.apply("t", stamp(10, 0, "a"), Some(1)));
        assert!(!m.apply("t", stamp(9, 5, "z"), Some(2)), "older");
        assert!(
            m.apply("t", stamp(10, 0, "b"), Some(3)),
            "same clock, greater node"
        );
        assert!(m.apply("t", stamp(11, 0, "a"), None), "delete");
        assert!(!m.apply("t", stamp(10, 9, "c"), Some(4)), "no resurrection");
        assert_eq!(m.get("t").unwrap().value, None);
        assert_eq!(m.tombstones(), 1);
        assert_eq!(m.prune_tombstones(0), vec![Arc::<str>::from("t")]);
        assert!(m.is_empty());
        assert_eq!(m.digest(), RetainedDigest::default());
    }
}
