//! What a session that moved has taken, by the messages' identities in the deployment
//! ([`MessageId`]: origin and number), so that none reaches it twice by the several ways a
//! move opens.
//!
//! A node hands an origin's messages to its sessions in the origin's order (one link, in
//! order, each once: [`crate::link::Inbox`]). So a session that never moved needs no record:
//! what it took of an origin is everything up to the node's mark for it. A move opens other
//! ways: what its old node relays, what was queued for the new node before the session came
//! (sent after a cut heals), the same message by both. So the session carries, per origin, the
//! number up to which it has everything it will ever get (`upto`), and while messages may
//! still come out of order (its move's relays run), the exact numbers it took above that.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{BufMut, BytesMut};

use crate::broker::persist::{self, RecordError};
use crate::link::MessageId;
use crate::read::Fields;
use crate::routes::{NodeId, Owner};

/// Numbers a session keeps exactly: past it, an origin's lowest counts as its `upto` (a
/// message older than that still to come would be taken for one already had).
pub(super) const EXACT_KEPT: usize = 100_000;

/// Origins a record may name (a node's incarnations are a few each; nodes are bounded by
/// `cluster.max_nodes`).
const ORIGINS_KEPT: usize = 4_096;

/// What a session has taken, per origin.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Intake {
    origins: BTreeMap<Owner, Taken>,
    /// Per node: every message of its incarnations below this one (a node that restarted
    /// handed its own messages of before to its sessions as it published them).
    below: BTreeMap<NodeId, u64>,
    /// Numbers held exactly, over every origin.
    exact: usize,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Taken {
    /// Every message of the origin numbered up to this was taken, or will not come.
    upto: u64,
    /// Taken above `upto` while older ones may still come.
    above: BTreeSet<u64>,
}

/// What taking a message found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Take {
    /// Taken before: not again.
    Twice,
    /// New, and after everything taken of its origin.
    InOrder,
    /// New, but a later one of its origin was taken already.
    Late,
}

impl Intake {
    pub fn is_empty(&self) -> bool {
        self.origins.is_empty() && self.below.is_empty()
    }

    /// Whether every message of `origin` counts as had (an earlier incarnation).
    fn is_below(&self, origin: &Owner) -> bool {
        self.below
            .get(&origin.node)
            .is_some_and(|below| origin.incarnation < *below)
    }

    /// Whether the session has `id` already.
    pub fn has(&self, (origin, seq): &MessageId) -> bool {
        self.is_below(origin)
            || self
                .origins
                .get(origin)
                .is_some_and(|t| *seq <= t.upto || t.above.contains(seq))
    }

    /// The session has every message of `node`'s incarnations below `incarnation`.
    pub fn had_below(&mut self, node: &NodeId, incarnation: u64) {
        let below = self.below.entry(node.clone()).or_default();
        *below = (*below).max(incarnation);
        self.exact -= self
            .origins
            .iter()
            .filter(|(o, _)| o.node == *node && o.incarnation < incarnation)
            .map(|(_, t)| t.above.len())
            .sum::<usize>();
        self.origins
            .retain(|o, _| o.node != *node || o.incarnation >= incarnation);
    }

    /// Take `id`. `exact`: older messages of its origin may still come, so the numbers above
    /// `upto` are kept one by one; otherwise its origin is had up to it.
    pub fn take(&mut self, id: &MessageId, exact: bool) -> Take {
        if self.has(id) {
            return Take::Twice;
        }
        let (origin, seq) = id;
        let t = self.origins.entry(origin.clone()).or_default();
        let late = t.above.last().is_some_and(|last| last > seq);
        if exact {
            t.above.insert(*seq);
            self.exact += 1;
            if self.exact > EXACT_KEPT
                && let Some(lowest) = t.above.pop_first()
            {
                t.upto = lowest;
                self.exact -= 1;
            }
        } else {
            self.exact -= t.above.len();
            t.upto = t.above.last().copied().unwrap_or(0).max(*seq);
            t.above.clear();
        }
        if late { Take::Late } else { Take::InOrder }
    }

    /// The session has every message of `origin` up to `upto` (a node's mark for it, where
    /// the session was).
    pub fn had_up_to(&mut self, origin: &Owner, upto: u64) {
        if self.is_below(origin) {
            return;
        }
        let t = self.origins.entry(origin.clone()).or_default();
        if upto > t.upto {
            t.upto = upto;
            let before = t.above.len();
            t.above = t.above.split_off(&(upto + 1));
            self.exact -= before - t.above.len();
        }
    }

    /// Join what the session took elsewhere.
    pub fn merge(&mut self, other: &Intake) {
        for (node, below) in &other.below {
            self.had_below(node, *below);
        }
        for (origin, theirs) in &other.origins {
            if self.is_below(origin) {
                continue;
            }
            self.had_up_to(origin, theirs.upto);
            let t = self.origins.entry(origin.clone()).or_default();
            for &seq in theirs.above.range(t.upto + 1..) {
                if t.above.insert(seq) {
                    self.exact += 1;
                }
            }
        }
    }

    /// Hold what this says of `me`'s own messages to what `me` published: none of a later
    /// incarnation, none numbered `next` or above. Whether it said more (no node that took
    /// the session from `me` can have).
    pub fn bound_own(&mut self, me: &Owner, next: u64) -> bool {
        let mut said_more = false;
        if let Some(below) = self.below.get_mut(&me.node)
            && *below > me.incarnation
        {
            *below = me.incarnation;
            said_more = true;
        }
        let before = self.origins.len();
        self.origins
            .retain(|o, _| o.node != me.node || o.incarnation <= me.incarnation);
        said_more |= self.origins.len() != before;
        if let Some(t) = self.origins.get_mut(me) {
            let last = next.saturating_sub(1);
            let beyond = t.above.split_off(&next);
            said_more |= !beyond.is_empty() || t.upto > last;
            t.upto = t.upto.min(last);
        }
        self.exact = self.origins.values().map(|t| t.above.len()).sum();
        said_more
    }

    /// Take out what this says of the nodes `apart` picks, as an intake of its own.
    pub fn split_off(&mut self, apart: impl Fn(&NodeId) -> bool) -> Intake {
        let (origins, kept): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut self.origins)
            .into_iter()
            .partition(|(origin, _)| apart(&origin.node));
        self.origins = kept;
        let (below, kept): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut self.below)
            .into_iter()
            .partition(|(node, _)| apart(node));
        self.below = kept;
        self.exact = self.origins.values().map(|t| t.above.len()).sum();
        let exact = origins.values().map(|t| t.above.len()).sum();
        Intake {
            origins,
            below,
            exact,
        }
    }

    /// Forget what this says of `node`'s messages.
    pub fn forget_node(&mut self, node: &NodeId) {
        self.origins.retain(|origin, _| origin.node != *node);
        self.below.remove(node);
        self.exact = self.origins.values().map(|t| t.above.len()).sum();
    }

    /// The nodes whose messages this speaks of.
    pub fn nodes(&self) -> BTreeSet<NodeId> {
        self.origins
            .keys()
            .map(|origin| origin.node.clone())
            .chain(self.below.keys().cloned())
            .collect()
    }

    /// The numbers kept one by one.
    pub fn exact_ids(&self) -> impl Iterator<Item = MessageId> + '_ {
        self.origins
            .iter()
            .flat_map(|(origin, t)| t.above.iter().map(|seq| (origin.clone(), *seq)))
    }

    /// Nothing more comes out of order: every origin is had up to the highest taken.
    pub fn settle(&mut self) {
        for t in self.origins.values_mut() {
            if let Some(last) = t.above.last() {
                t.upto = t.upto.max(*last);
            }
            t.above.clear();
        }
        self.exact = 0;
    }

    /// Forget the origins `passed` says this node's own stream of them went past what the
    /// session had (nothing older from them can reach it here again).
    pub fn forget_passed(&mut self, passed: impl Fn(&Owner, u64) -> bool) {
        self.origins
            .retain(|origin, t| !(t.above.is_empty() && passed(origin, t.upto)));
    }

    pub fn encode(&self, v: &mut BytesMut) {
        v.put_u32(u32::try_from(self.origins.len()).unwrap_or(u32::MAX));
        for (origin, t) in &self.origins {
            persist::put_string(v, origin.node.as_str());
            v.put_u64(origin.incarnation);
            v.put_u64(t.upto);
            v.put_u32(u32::try_from(t.above.len()).unwrap_or(u32::MAX));
            for seq in &t.above {
                v.put_u64(*seq);
            }
        }
        v.put_u32(u32::try_from(self.below.len()).unwrap_or(u32::MAX));
        for (node, below) in &self.below {
            persist::put_string(v, node.as_str());
            v.put_u64(*below);
        }
    }

    /// Read what [`Intake::encode`] wrote, within the bounds a node keeps.
    pub fn decode(r: &mut persist::Reader<'_>) -> Result<Self, RecordError> {
        let count = r.u32()? as usize;
        if count > ORIGINS_KEPT {
            return Err(r.fail("too many origins"));
        }
        let mut intake = Intake::default();
        for _ in 0..count {
            let node = r.node()?;
            let incarnation = r.u64()?;
            let upto = r.u64()?;
            let above = r.u32()? as usize;
            if intake.exact + above > EXACT_KEPT {
                return Err(r.fail("too many numbers"));
            }
            let mut t = Taken {
                upto,
                above: BTreeSet::new(),
            };
            for _ in 0..above {
                let seq = r.u64()?;
                if seq > upto {
                    t.above.insert(seq);
                }
            }
            intake.exact += t.above.len();
            intake.origins.insert(Owner { node, incarnation }, t);
        }
        let count = r.u32()? as usize;
        if count > ORIGINS_KEPT {
            return Err(r.fail("too many nodes"));
        }
        for _ in 0..count {
            let node = r.node()?;
            let below = r.u64()?;
            intake.had_below(&node, below);
        }
        Ok(intake)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn owner(n: u8) -> Owner {
        Owner {
            node: NodeId::new(&format!("n{n}")).unwrap(),
            incarnation: 1,
        }
    }

    #[test]
    fn a_message_is_taken_once_whichever_way_it_comes() {
        let mut i = Intake::default();
        i.had_up_to(&owner(1), 10);
        assert_eq!(i.take(&(owner(1), 9), true), Take::Twice);
        assert_eq!(i.take(&(owner(1), 12), true), Take::InOrder);
        assert_eq!(i.take(&(owner(1), 11), true), Take::Late);
        assert_eq!(i.take(&(owner(1), 12), false), Take::Twice);
        i.settle();
        assert!(i.has(&(owner(1), 11)) && !i.has(&(owner(1), 13)));
        assert_eq!(i.take(&(owner(1), 20), false), Take::InOrder);
        assert!(i.has(&(owner(1), 15)), "in order, the gaps will not come");
    }

    #[test]
    fn what_a_shipment_says_of_this_nodes_messages_stays_within_what_it_published() {
        let me = owner(1);
        let later = Owner {
            incarnation: 2,
            ..owner(1)
        };
        let mut honest = Intake::default();
        honest.take(&(me.clone(), 7), true);
        honest.had_up_to(&owner(2), 1_000);
        let before = honest.clone();
        assert!(!honest.bound_own(&me, 8), "7 was published");
        assert_eq!(honest, before);

        let mut forged = Intake::default();
        forged.had_up_to(&me, 100_000);
        forged.take(&(me.clone(), 100_001), true);
        forged.take(&(later.clone(), 1), true);
        forged.had_up_to(&owner(2), 1_000);
        assert!(forged.bound_own(&me, 8));
        assert!(forged.has(&(me.clone(), 7)) && !forged.has(&(me.clone(), 8)));
        assert!(!forged.has(&(me.clone(), 100_001)) && !forged.has(&(later.clone(), 1)));
        assert!(
            forged.has(&(owner(2), 1_000)),
            "other nodes' are theirs to say"
        );
        assert_eq!(forged.exact, 0);

        let mut below = Intake::default();
        below.had_below(&me.node, 9);
        assert!(below.bound_own(&later, 1));
        assert!(
            below.has(&(me, 5)) && !below.has(&(later, 1)),
            "below 2 only"
        );
    }

    #[test]
    fn a_restarted_nodes_earlier_messages_count_as_had() {
        let mut i = Intake::default();
        let later = Owner {
            incarnation: 3,
            ..owner(1)
        };
        i.take(&(owner(1), 5), true);
        i.had_below(&owner(1).node, 3);
        assert!(i.has(&(owner(1), 99)), "incarnation 1 is below 3");
        assert!(!i.has(&(later.clone(), 1)));
        assert_eq!(i.take(&(later, 1), true), Take::InOrder);
        assert_eq!(i.exact, 1, "the earlier incarnation's numbers went");
    }

    #[test]
    fn merging_keeps_both_sides_exact_numbers() {
        let mut a = Intake::default();
        a.had_up_to(&owner(1), 5);
        a.take(&(owner(1), 8), true);
        let mut b = Intake::default();
        b.had_up_to(&owner(1), 6);
        b.take(&(owner(1), 9), true);
        b.take(&(owner(2), 3), false);
        a.merge(&b);
        for (o, seq, had) in [
            (1, 6, true),
            (1, 7, false),
            (1, 8, true),
            (1, 9, true),
            (2, 3, true),
        ] {
            assert_eq!(a.has(&(owner(o), seq)), had, "{o}:{seq}");
        }
    }

    #[test]
    fn a_record_holds_at_most_what_a_node_keeps() {
        let mut v = BytesMut::new();
        v.put_u8(1);
        v.put_u32(1);
        persist::put_string(&mut v, "n1");
        v.put_u64(1);
        v.put_u64(0);
        v.put_u32(u32::MAX);
        let mut r = persist::Reader::new("test", &v).unwrap();
        assert!(Intake::decode(&mut r).is_err());
    }

    proptest! {
        /// Against a plain set of what was taken: taking answers Twice exactly for what is in
        /// it, whatever the order, and a record reads back as it was written.
        #[test]
        fn intake_agrees_with_the_set_of_what_was_taken(
            takes in proptest::collection::vec((0u8..3, 1u64..60, any::<bool>()), 0..200),
        ) {
            let mut i = Intake::default();
            let mut taken = BTreeSet::new();
            for (o, seq, _) in &takes {
                let id = (owner(*o), *seq);
                let first = taken.insert((*o, *seq));
                // Exactly kept throughout: an out-of-order stream must never lose a number.
                let t = i.take(&id, true);
                prop_assert_eq!(t == Take::Twice, !first, "{}:{}", o, seq);
            }
            let mut v = BytesMut::new();
            v.put_u8(1);
            i.encode(&mut v);
            let mut r = persist::Reader::new("test", &v).unwrap();
            prop_assert_eq!(Intake::decode(&mut r).unwrap(), i.clone());
            // Settled, everything up to each origin's highest counts as had.
            i.settle();
            for (o, seq, _) in &takes {
                prop_assert!(i.has(&(owner(*o), *seq)));
            }
        }
    }
}
