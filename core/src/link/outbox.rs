//! The per-peer outbox of QoS 1/2 forwards: sequence numbers, a send window, cumulative acks,
//! re-sending after a link outage, and a bound. The broker persists what it holds (as
//! `Persist` outputs), so a restart resumes it.

use std::collections::VecDeque;

use super::{EncodedFrame, Forward, Frame};

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
    /// Its sequence number (the message's at its origin).
    seq: u64,
    /// Its payload and topic bytes, as the bound counts them.
    weight: usize,
    /// The `Forward` frame, encoded once: what is sent, and what is stored.
    frame: EncodedFrame,
}

/// A forward as the outbox queued it: its number, and the frame to send and store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    /// The sequence number it was queued under.
    pub seq: u64,
    /// The `Forward` frame with that number, encoded.
    pub frame: EncodedFrame,
}

/// Forwards to one peer, in sequence order, each held as its encoded frame.
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

/// What a forward counts for against the byte bound.
fn weight(forward: &Forward) -> usize {
    forward.message.payload.len() + forward.message.topic.len()
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
        self.entries.iter().map(|e| e.seq)
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

    /// Queue `forward`, encoded as `frame`. It keeps its number ([`Forward::seq`], the
    /// message's at its origin) if that is above every number queued before, and then its
    /// frame is `frame` itself; otherwise it gets the next one, in a copy of the frame.
    pub fn push(&mut self, forward: &Forward, frame: &EncodedFrame) -> Result<Queued, OutboxFull> {
        let weight = weight(forward);
        if !self.has_room(weight) {
            return Err(OutboxFull {
                messages: self.entries.len(),
                bytes: self.bytes,
            });
        }
        let seq = forward.seq.max(self.next_seq);
        let frame = if seq == forward.seq {
            frame.clone()
        } else {
            frame.with_forward_seq(forward, seq)
        };
        self.next_seq = seq + 1;
        self.bytes += weight;
        self.entries.push_back(Entry {
            seq,
            weight,
            frame: frame.clone(),
        });
        Ok(Queued { seq, frame })
    }

    /// Queue a forward, dropping the oldest ones until it fits (for a peer that is not there,
    /// or does not acknowledge: what waits for it is bounded, and the newest messages are
    /// kept). Returns what was queued and the sequence numbers dropped; fails only for a
    /// forward larger than the whole outbox may hold. Dropped forwards that were sent may
    /// still arrive; the peer's acknowledgement of them is taken as for any other.
    pub fn push_evicting(
        &mut self,
        forward: &Forward,
        frame: &EncodedFrame,
    ) -> Result<(Queued, Vec<u64>), OutboxFull> {
        let weight = weight(forward);
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
            dropped.push(oldest.seq);
        }
        Ok((self.push(forward, frame)?, dropped))
    }

    /// Put back a forward read from storage after a restart, as it was stored (in any order;
    /// sorted here).
    pub fn restore(&mut self, forward: &Forward, frame: EncodedFrame) {
        let seq = forward.seq;
        self.next_seq = self.next_seq.max(seq + 1);
        let at = self.entries.partition_point(|e| e.seq < seq);
        if self.entries.get(at).is_some_and(|e| e.seq == seq) {
            return;
        }
        let weight = weight(forward);
        self.bytes += weight;
        self.entries.insert(at, Entry { seq, weight, frame });
    }

    /// The next forwards to send on the link, as the window allows; they count as sent.
    pub fn take_sendable(&mut self) -> Vec<EncodedFrame> {
        let room = self.limits.window.saturating_sub(self.sent);
        let out: Vec<EncodedFrame> = self
            .entries
            .iter()
            .skip(self.sent)
            .take(room)
            .map(|e| e.frame.clone())
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
            if first.seq > seq {
                break;
            }
            done.push(first.seq);
            self.bytes -= first.weight;
            self.entries.pop_front();
            self.sent = self.sent.saturating_sub(1);
        }
        done
    }

    /// Drop the forwards `drop` picks, sent or not (the peer may already have one that was
    /// sent). Returns their sequence numbers (so their records can be deleted). Each entry
    /// is decoded to be asked about: this is for rare changes (a residency rule), not the
    /// path of a message.
    pub fn remove_where(&mut self, mut drop: impl FnMut(&Forward) -> bool) -> Vec<u64> {
        let mut removed = Vec::new();
        let mut sent_removed = 0;
        let mut kept = VecDeque::with_capacity(self.entries.len());
        for (i, e) in self.entries.drain(..).enumerate() {
            let picked = matches!(e.frame.decode(), Ok(Frame::Forward(f)) if drop(&f));
            if picked {
                removed.push(e.seq);
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

    fn encoded(f: &Forward) -> EncodedFrame {
        EncodedFrame::encode(&Frame::Forward(f.clone())).unwrap()
    }

    fn push(o: &mut Outbox, f: Forward) -> Result<Queued, OutboxFull> {
        let frame = encoded(&f);
        o.push(&f, &frame)
    }

    fn seqs_of(frames: Vec<EncodedFrame>) -> Vec<u64> {
        frames
            .iter()
            .map(|f| match f.decode() {
                Ok(Frame::Forward(f)) => f.seq,
                other => panic!("not a forward: {other:?}"),
            })
            .collect()
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
            push(&mut o, fwd(p)).unwrap();
        }
        let first = seqs_of(o.take_sendable());
        assert_eq!(first, vec![1, 2], "window of 2");
        assert!(o.take_sendable().is_empty());
        assert_eq!(o.ack(1), vec![1]);
        assert_eq!(seqs_of(o.take_sendable()), vec![3]);
        assert_eq!(o.ack(3), vec![2, 3]);
        assert!(o.is_empty());
        assert_eq!(o.bytes(), 0);
    }

    #[test]
    fn link_outage_resends_unacknowledged_in_order() {
        let mut o = Outbox::new(limits());
        for p in [b"1", b"2", b"3"] {
            push(&mut o, fwd(p)).unwrap();
        }
        o.take_sendable();
        o.link_down();
        assert_eq!(seqs_of(o.take_sendable()), vec![1, 2]);
    }

    #[test]
    fn full_outbox_refuses_new_forwards() {
        let mut o = Outbox::new(OutboxLimits {
            window: 10,
            max_messages: 2,
            max_bytes: 1000,
        });
        push(&mut o, fwd(b"1")).unwrap();
        push(&mut o, fwd(b"2")).unwrap();
        assert_eq!(
            push(&mut o, fwd(b"3")).map(|q| q.seq),
            Err(OutboxFull {
                messages: 2,
                bytes: 4
            })
        );
        o.ack(1);
        assert!(
            push(&mut o, fwd(b"3")).is_ok(),
            "room again once acknowledged"
        );
        let mut small = Outbox::new(OutboxLimits {
            window: 10,
            max_messages: 10,
            max_bytes: 3,
        });
        assert!(push(&mut small, fwd(b"xyz")).is_err(), "byte bound too");
    }

    #[test]
    fn an_absent_peers_outbox_keeps_the_newest_within_its_bounds() {
        let mut o = Outbox::new(OutboxLimits {
            window: 10,
            max_messages: 2,
            max_bytes: 1000,
        });
        for p in [b"1", b"2"] {
            push(&mut o, fwd(p)).unwrap();
        }
        let f = fwd(b"3");
        let frame = encoded(&f);
        let (queued, dropped) = o.push_evicting(&f, &frame).unwrap();
        assert_eq!((queued.seq, dropped), (3, vec![1]));
        assert_eq!(o.seqs().collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(o.bytes(), 4);
        assert!(
            {
                let big = fwd(&[b'x'; 1000]);
                o.push_evicting(&big, &encoded(&big)).is_err()
            },
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
            let frame = encoded(&f);
            o.restore(&f, frame);
        }
        assert_eq!(o.len(), 3);
        assert_eq!(seqs_of(o.take_sendable()), vec![5, 6]);
        let queued = push(&mut o, fwd(b"y")).unwrap();
        assert_eq!(queued.seq, 8);
        assert_eq!(
            queued.frame.decode().unwrap(),
            Frame::Forward(Forward {
                seq: 8,
                ..fwd(b"y")
            }),
            "renumbered in its frame too"
        );
    }
}
