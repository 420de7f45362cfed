//! The per-peer outbox of QoS 1/2 forwards: sequence numbers, a send window, cumulative acks,
//! re-sending after a link outage, and a bound. The broker persists what it holds (as
//! `Persist` outputs), so a restart resumes it.

use std::collections::VecDeque;

use super::Forward;

/// Why a forward could not be queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("outbox full: {messages} messages, {bytes} bytes waiting")]
pub struct OutboxFull {
    /// Forwards waiting.
    pub messages: usize,
    /// Their payload and topic bytes.
    pub bytes: usize,
}

/// Bounds of one outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboxLimits {
    /// Forwards sent and not yet acknowledged.
    pub window: usize,
    /// The most forwards held, sent or not.
    pub max_messages: usize,
    /// The most payload and topic bytes held.
    pub max_bytes: usize,
}

#[derive(Debug, Clone)]
struct Entry {
    forward: Forward,
    weight: usize,
}

/// Forwards to one peer, in sequence order.
#[derive(Debug, Clone)]
pub struct Outbox {
    limits: OutboxLimits,
    /// Above every sequence number queued so far.
    next_seq: u64,
    /// Entries not yet acknowledged, oldest first, with growing sequence numbers (the
    /// messages' numbers at their origin: gaps where a message went elsewhere only).
    entries: VecDeque<Entry>,
    /// How many of `entries` were sent on the current link session.
    sent: usize,
    bytes: usize,
}

impl Outbox {
    /// An empty outbox; its first forward gets sequence number 1.
    pub fn new(limits: OutboxLimits) -> Self {
        Self {
            limits,
            next_seq: 1,
            entries: VecDeque::new(),
            sent: 0,
            bytes: 0,
        }
    }

    /// An empty outbox whose first forward gets sequence number `next_seq` (for a peer that
    /// was forgotten and came back: its inbox still remembers the earlier numbers).
    pub fn starting_at(limits: OutboxLimits, next_seq: u64) -> Self {
        Self {
            next_seq: next_seq.max(1),
            ..Self::new(limits)
        }
    }

    /// The sequence number the next forward gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The sequence numbers of every forward held, oldest first.
    pub fn seqs(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries.iter().map(|e| e.forward.seq)
    }

    /// Messages waiting (sent or not) for an acknowledgement.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no forward is waiting.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Payload and topic bytes waiting.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether a forward of `weight` bytes would be accepted.
    pub fn has_room(&self, weight: usize) -> bool {
        self.entries.len() < self.limits.max_messages
            && self.bytes + weight <= self.limits.max_bytes
    }

    /// Queue a forward. It keeps its number ([`Forward::seq`], the message's at its origin)
    /// if that is above every number queued before; otherwise it gets the next one (set in
    /// the returned copy and kept).
    pub fn push(&mut self, mut forward: Forward) -> Result<Forward, OutboxFull> {
        let weight = forward.message.payload.len() + forward.message.topic.len();
        if !self.has_room(weight) {
            return Err(OutboxFull {
                messages: self.entries.len(),
                bytes: self.bytes,
            });
        }
        forward.seq = forward.seq.max(self.next_seq);
        self.next_seq = forward.seq + 1;
        self.bytes += weight;
        self.entries.push_back(Entry {
            forward: forward.clone(),
            weight,
        });
        Ok(forward)
    }

    /// Queue a forward, dropping the oldest ones until it fits (for a peer that is not there,
    /// or does not acknowledge: what waits for it is bounded, and the newest messages are
    /// kept). Returns the queued copy and the sequence numbers dropped; fails only for a
    /// forward larger than the whole outbox may hold. Dropped forwards that were sent may
    /// still arrive; the peer's acknowledgement of them is taken as for any other.
    pub fn push_evicting(&mut self, forward: Forward) -> Result<(Forward, Vec<u64>), OutboxFull> {
        let weight = forward.message.payload.len() + forward.message.topic.len();
        if weight > self.limits.max_bytes || self.limits.max_messages == 0 {
            return Err(OutboxFull {
                messages: self.entries.len(),
                bytes: self.bytes,
            });
        }
        let mut dropped = Vec::new();
        while !self.has_room(weight) {
            let Some(oldest) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= oldest.weight;
            self.sent = self.sent.saturating_sub(1);
            dropped.push(oldest.forward.seq);
        }
        Ok((self.push(forward)?, dropped))
    }

    /// Put back a forward read from storage after a restart (in any order; sorted here).
    pub fn restore(&mut self, forward: Forward) {
        let weight = forward.message.payload.len() + forward.message.topic.len();
        self.next_seq = self.next_seq.max(forward.seq + 1);
        let at = self
            .entries
            .partition_point(|e| e.forward.seq < forward.seq);
        if self
            .entries
            .get(at)
            .is_some_and(|e| e.forward.seq == forward.seq)
        {
            return;
        }
        self.bytes += weight;
        self.entries.insert(at, Entry { forward, weight });
    }

    /// The next forwards to send on the link, as the window allows; they count as sent.
    pub fn take_sendable(&mut self) -> Vec<Forward> {
        let room = self.limits.window.saturating_sub(self.sent);
        let out: Vec<Forward> = self
            .entries
            .iter()
            .skip(self.sent)
            .take(room)
            .map(|e| e.forward.clone())
            .collect();
        self.sent += out.len();
        out
    }

    /// Whether forwards wait for room in the window (queued, not sent yet).
    pub fn has_unsent(&self) -> bool {
        self.entries.len() > self.sent
    }

    /// The peer has everything up to `seq`: those entries leave. Returns their sequence
    /// numbers (so their records can be deleted).
    pub fn ack(&mut self, seq: u64) -> Vec<u64> {
        let mut done = Vec::new();
        while let Some(first) = self.entries.front() {
            if first.forward.seq > seq {
                break;
            }
            done.push(first.forward.seq);
            self.bytes -= first.weight;
            self.entries.pop_front();
            self.sent = self.sent.saturating_sub(1);
        }
        done
    }

    /// Drop the forwards `drop` picks, sent or not (the peer may already have one that was
    /// sent). Returns their sequence numbers (so their records can be deleted).
    pub fn remove_where(&mut self, mut drop: impl FnMut(&Forward) -> bool) -> Vec<u64> {
        let mut removed = Vec::new();
        let mut sent_removed = 0;
        let mut kept = VecDeque::with_capacity(self.entries.len());
        for (i, e) in self.entries.drain(..).enumerate() {
            if drop(&e.forward) {
                removed.push(e.forward.seq);
                self.bytes -= e.weight;
                sent_removed += usize::from(i < self.sent);
            } else {
                kept.push_back(e);
            }
        }
        self.entries = kept;
        self.sent -= sent_removed;
        removed
    }

    /// The link went down: whatever was sent and not acknowledged is sent again when it
    /// comes back, in order (the peer drops what it already has).
    pub fn link_down(&mut self) {
        self.sent = 0;
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::codec::{Publish, QoS};
    use crate::routes::{NodeId, Owner};

    fn fwd(payload: &'static [u8]) -> Forward {
        Forward {
            origin: Owner {
                node: NodeId::new("a").unwrap(),
                incarnation: 1,
            },
            seq: 0,
            message: Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: "t".into(),
                packet_id: Some(1),
                payload: Bytes::from_static(payload),
                properties: Default::default(),
            },
        }
    }

    fn limits() -> OutboxLimits {
        OutboxLimits {
            window: 2,
            max_messages: 4,
            max_bytes: 1000,
        }
    }

    #[test]
    fn sequence_numbers_window_and_cumulative_acks() {
        let mut o = Outbox::new(limits());
        for p in [b"1", b"2", b"3"] {
            o.push(fwd(p)).unwrap();
        }
        let first: Vec<u64> = o.take_sendable().iter().map(|f| f.seq).collect();
        assert_eq!(first, vec![1, 2], "window of 2");
        assert!(o.take_sendable().is_empty());
        assert_eq!(o.ack(1), vec![1]);
        assert_eq!(
            o.take_sendable().iter().map(|f| f.seq).collect::<Vec<_>>(),
            vec![3]
        );
        assert_eq!(o.ack(3), vec![2, 3]);
        assert!(o.is_empty());
        assert_eq!(o.bytes(), 0);
    }

    #[test]
    fn link_outage_resends_unacknowledged_in_order() {
        let mut o = Outbox::new(limits());
        for p in [b"1", b"2", b"3"] {
            o.push(fwd(p)).unwrap();
        }
        o.take_sendable();
        o.link_down();
        assert_eq!(
            o.take_sendable().iter().map(|f| f.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
    }

    #[test]
    fn full_outbox_refuses_new_forwards() {
        let mut o = Outbox::new(OutboxLimits {
            window: 10,
            max_messages: 2,
            max_bytes: 1000,
        });
        o.push(fwd(b"1")).unwrap();
        o.push(fwd(b"2")).unwrap();
        assert_eq!(
            o.push(fwd(b"3")),
            Err(OutboxFull {
                messages: 2,
                bytes: 4
            })
        );
        o.ack(1);
        assert!(o.push(fwd(b"3")).is_ok(), "room again once acknowledged");
        let mut small = Outbox::new(OutboxLimits {
            window: 10,
            max_messages: 10,
            max_bytes: 3,
        });
        assert!(small.push(fwd(b"xyz")).is_err(), "byte bound too");
    }

    #[test]
    fn an_absent_peers_outbox_keeps_the_newest_within_its_bounds() {
        let mut o = Outbox::new(OutboxLimits {
            window: 10,
            max_messages: 2,
            max_bytes: 1000,
        });
        for p in [b"1", b"2"] {
            o.push(fwd(p)).unwrap();
        }
        let (queued, dropped) = o.push_evicting(fwd(b"3")).unwrap();
        assert_eq!((queued.seq, dropped), (3, vec![1]));
        assert_eq!(o.seqs().collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(o.bytes(), 4);
        assert!(
            o.push_evicting(fwd(&[b'x'; 1000])).is_err(),
            "larger than the whole outbox"
        );
        let again = Outbox::starting_at(limits(), o.next_seq());
        assert_eq!(again.next_seq(), 4);
    }

    #[test]
    fn restore_rebuilds_order_and_sequence() {
        let mut o = Outbox::new(limits());
        for seq in [7, 5, 6, 6] {
            let mut f = fwd(b"x");
            f.seq = seq;
            o.restore(f);
        }
        assert_eq!(o.len(), 3);
        assert_eq!(
            o.take_sendable().iter().map(|f| f.seq).collect::<Vec<_>>(),
            vec![5, 6]
        );
        assert_eq!(o.push(fwd(b"y")).unwrap().seq, 8);
    }
}
