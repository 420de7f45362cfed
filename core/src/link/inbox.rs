//! The receiving side of forwards: drops duplicates by (origin, incarnation, sequence).
//!
//! A link carries an origin's forwards in sequence order, and after an outage the origin
//! re-sends from its first unacknowledged one, so a high-water mark per origin incarnation is
//! enough: a forward at or below it was delivered already. Marks are kept per incarnation
//! because a restarted origin still re-sends what its outbox held under the earlier one. The
//! broker persists the marks so that a restart of the receiver delivers nothing twice.

use std::collections::BTreeMap;

use crate::routes::{NodeId, Owner};

/// Incarnations of one origin whose marks are kept; older ones are forgotten (their forwards
/// were acknowledged long ago, or the origin restarted this many times since).
const INCARNATIONS_KEPT: usize = 4;

/// Highest sequence number delivered, per origin incarnation.
#[derive(Debug, Clone, Default)]
pub struct Inbox {
    marks: BTreeMap<NodeId, BTreeMap<u64, u64>>,
    /// Marks forgotten since [`Inbox::take_forgotten`] was last called.
    forgotten: Vec<(NodeId, u64)>,
}

/// What to do with an arriving forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// New: deliver it (and acknowledge up to its sequence number).
    Deliver,
    /// Delivered before: only acknowledge.
    Duplicate,
}

impl Inbox {
    /// Record an arriving QoS 1/2 forward and say whether to deliver it.
    pub fn arrive(&mut self, origin: &Owner, seq: u64) -> Arrival {
        let marks = self.marks.entry(origin.node.clone()).or_default();
        let mark = marks.entry(origin.incarnation).or_insert(0);
        let arrival = if seq <= *mark {
            Arrival::Duplicate
        } else {
            *mark = seq;
            Arrival::Deliver
        };
        self.trim(&origin.node);
        arrival
    }

    /// Keep the latest [`INCARNATIONS_KEPT`] incarnations' marks of `node`.
    fn trim(&mut self, node: &NodeId) {
        let Some(marks) = self.marks.get_mut(node) else {
            return;
        };
        while marks.len() > INCARNATIONS_KEPT {
            if let Some((incarnation, _)) = marks.pop_first() {
                self.forgotten.push((node.clone(), incarnation));
            }
        }
    }

    /// The marks dropped since the last call (old incarnations), so that their records can be
    /// deleted.
    pub fn take_forgotten(&mut self) -> Vec<(NodeId, u64)> {
        std::mem::take(&mut self.forgotten)
    }

    /// Every origin incarnation's mark.
    pub fn marks(&self) -> impl Iterator<Item = (Owner, u64)> + '_ {
        self.marks.iter().flat_map(|(node, marks)| {
            marks.iter().map(|(incarnation, mark)| {
                let owner = Owner {
                    node: node.clone(),
                    incarnation: *incarnation,
                };
                (owner, *mark)
            })
        })
    }

    /// The mark for an origin incarnation: the highest delivered sequence.
    pub fn mark(&self, origin: &Owner) -> Option<u64> {
        self.marks
            .get(&origin.node)?
            .get(&origin.incarnation)
            .copied()
    }

    /// Forget every mark of `node` (a node forgotten long ago); returns the incarnations whose
    /// marks were dropped, so that their records can be deleted.
    pub fn forget(&mut self, node: &NodeId) -> Vec<u64> {
        self.marks
            .remove(node)
            .map(|m| m.into_keys().collect())
            .unwrap_or_default()
    }

    /// Put back a persisted mark after a restart.
    pub fn restore(&mut self, origin: &Owner, seq: u64) {
        let marks = self.marks.entry(origin.node.clone()).or_default();
        let mark = marks.entry(origin.incarnation).or_insert(0);
        *mark = (*mark).max(seq);
        self.trim(&origin.node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(incarnation: u64) -> Owner {
        Owner {
            node: NodeId::new("euc1").unwrap(),
            incarnation,
        }
    }

    #[test]
    fn duplicates_are_dropped_per_incarnation() {
        let mut inbox = Inbox::default();
        assert_eq!(inbox.arrive(&origin(1), 1), Arrival::Deliver);
        assert_eq!(inbox.arrive(&origin(1), 2), Arrival::Deliver);
        assert_eq!(inbox.arrive(&origin(1), 2), Arrival::Duplicate);
        assert_eq!(
            inbox.arrive(&origin(1), 1),
            Arrival::Duplicate,
            "re-sent after an outage"
        );
        assert_eq!(
            inbox.arrive(&origin(2), 1),
            Arrival::Deliver,
            "a restarted origin starts over"
        );
        // The restarted origin still re-sends its earlier incarnation's outbox.
        assert_eq!(inbox.arrive(&origin(1), 3), Arrival::Deliver);
        assert_eq!(inbox.arrive(&origin(1), 3), Arrival::Duplicate);
    }

    #[test]
    fn restored_marks_keep_deduplicating_and_few_incarnations_are_kept() {
        let mut inbox = Inbox::default();
        inbox.restore(&origin(3), 10);
        assert_eq!(inbox.mark(&origin(3)), Some(10));
        assert_eq!(inbox.arrive(&origin(3), 10), Arrival::Duplicate);
        assert_eq!(inbox.arrive(&origin(3), 11), Arrival::Deliver);
        for incarnation in 4..10 {
            inbox.arrive(&origin(incarnation), 1);
        }
        assert_eq!(
            inbox.mark(&origin(3)),
            None,
            "old incarnations are forgotten"
        );
        let forgotten: Vec<u64> = inbox.take_forgotten().iter().map(|(_, i)| *i).collect();
        assert_eq!(forgotten, vec![3, 4, 5], "and said, for their records");
        assert_eq!(inbox.mark(&origin(9)), Some(1));
    }
}
