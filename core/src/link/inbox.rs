//! The receiving side of forwards: drops duplicates by (origin, incarnation, sequence).
//!
//! A link carries an origin's forwards in sequence order, and after an outage the origin
//! re-sends from its first unacknowledged one, so a high-water mark per origin incarnation is
//! enough: a forward at or below it was delivered already. The broker persists the marks so
//! that a restart does not deliver anything twice.

use std::collections::BTreeMap;

use crate::routes::{NodeId, Owner};

/// Highest sequence number delivered, per origin node (in its latest incarnation).
#[derive(Debug, Clone, Default)]
pub struct Inbox {
    marks: BTreeMap<NodeId, (u64, u64)>,
}

/// What to do with an arriving forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// New: deliver it (and acknowledge up to its sequence number).
    Deliver,
    /// Delivered before: only acknowledge.
    Duplicate,
    /// From an older incarnation of the origin: ignore.
    Stale,
}

impl Inbox {
    /// Record an arriving QoS 1/2 forward and say whether to deliver it.
    pub fn arrive(&mut self, origin: &Owner, seq: u64) -> Arrival {
        let mark = self
            .marks
            .entry(origin.node.clone())
            .or_insert((origin.incarnation, 0));
        if origin.incarnation < mark.0 {
            return Arrival::Stale;
        }
        if origin.incarnation > mark.0 {
            *mark = (origin.incarnation, 0);
        }
        if seq <= mark.1 {
            return Arrival::Duplicate;
        }
        mark.1 = seq;
        Arrival::Deliver
    }

    /// The mark for an origin: (incarnation, highest delivered sequence).
    pub fn mark(&self, node: &NodeId) -> Option<(u64, u64)> {
        self.marks.get(node).copied()
    }

    /// Put back a persisted mark after a restart.
    pub fn restore(&mut self, origin: &Owner, seq: u64) {
        let mark = self
            .marks
            .entry(origin.node.clone())
            .or_insert((origin.incarnation, 0));
        if (origin.incarnation, seq) > *mark {
            *mark = (origin.incarnation, seq);
        }
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
    fn duplicates_and_stale_incarnations_are_dropped() {
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
        assert_eq!(inbox.arrive(&origin(1), 3), Arrival::Stale);
    }

    #[test]
    fn restored_marks_keep_deduplicating() {
        let mut inbox = Inbox::default();
        inbox.restore(&origin(3), 10);
        inbox.restore(&origin(2), 50);
        assert_eq!(inbox.mark(&NodeId::new("euc1").unwrap()), Some((3, 10)));
        assert_eq!(inbox.arrive(&origin(3), 10), Arrival::Duplicate);
        assert_eq!(inbox.arrive(&origin(3), 11), Arrival::Deliver);
    }
}
