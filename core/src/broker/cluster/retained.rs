//! Retained messages across nodes: last writer wins per topic by hybrid logical clock,
//! deletes included, with snapshots for peers that were away.

use std::sync::Arc;

use bytes::Bytes;

use super::forward::link_publish;
use super::trust::{PeerFault, PeerLimit};
use super::{Cluster, RetainedCharge};
use crate::broker::message::Message;
use crate::broker::persist::Key;
use crate::broker::{Authenticator, Authorizer, Broker};
use crate::codec::QoS;
use crate::link::{Frame, RetainedUpdate};
use crate::retained::{RetainedDigest, Stamp};
use crate::routes::NodeId;

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// A retained write accepted here (a message, or a delete by an empty payload): stamp it
    /// and send it to every connected peer.
    pub(in crate::broker) fn replicate_retained(&mut self, message: &Message) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let stamp = Stamp {
            hlc: c.hlc.tick(now.as_millis()),
            node: c.owner.node.clone(),
        };
        let deleted = message.payload.is_empty();
        let update = RetainedUpdate {
            topic: message.topic.to_string(),
            stamp: stamp.clone(),
            message: (!deleted).then(|| link_publish(message, now)),
        };
        let charge = (!deleted).then(|| RetainedCharge {
            bytes: message.topic.len() + message.payload.len(),
            to: c.owner.node.clone(),
        });
        c.account_retained(&message.topic, charge.as_ref());
        c.retained.apply(&message.topic, stamp.clone(), charge);
        let mut peers = c.connected_peers();
        if !c.residency.is_empty() {
            let withheld = c.residency_filter(&message.topic, &mut peers);
            self.stats.residency_withheld += withheld;
        }
        self.persist_stamp(&message.topic, &stamp, deleted);
        self.prune_retained_tombstones();
        for peer in peers {
            self.send_to_peer(peer, Frame::Retained(update.clone()));
        }
    }

    pub(super) fn persist_stamp(&mut self, topic: &str, stamp: &Stamp, deleted: bool) {
        let key = Key::RetainedStamp {
            topic: topic.to_owned(),
        };
        self.persist(
            key.encode(),
            Some(crate::broker::persist::encode_stamp(stamp, deleted)),
        );
    }

    pub(super) fn prune_retained_tombstones(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        let max = c.config.retained_tombstones_max;
        for topic in c.retained.prune_tombstones(max) {
            let key = Key::RetainedStamp {
                topic: topic.to_string(),
            };
            self.persist(key.encode(), None);
        }
    }

    /// A retained write that `sender` sent: its own, or one it relays in a snapshot (a write of
    /// a node this node cannot reach now; this node's own writes and those of the nodes it
    /// reaches come from their writers only). Stored if it is newer than what this node has,
    /// within the clock bound and the bounds of what `sender` may make this node hold: its own
    /// writes count against it, and so do the writes it relays, never against their writers.
    pub(super) fn apply_retained_update(&mut self, sender: &NodeId, update: RetainedUpdate) {
        let now = self.now;
        if !self.config.retain_available {
            return;
        }
        let Some(c) = &mut self.cluster else { return };
        let writer = &update.stamp.node;
        if writer != sender
            && (*writer == c.owner.node || c.peers.get(writer).is_some_and(|p| p.connected))
        {
            return;
        }
        let ahead_ms = update.stamp.hlc.wall_ms.saturating_sub(now.as_millis());
        if ahead_ms > c.config.max_clock_drift_ms {
            self.peer_fault(sender, PeerFault::ClockAhead);
            return;
        }
        if c.retained
            .get(&update.topic)
            .is_some_and(|e| e.stamp >= update.stamp)
        {
            return;
        }
        let deleted = update.message.is_none();
        let charge = (!deleted).then(|| RetainedCharge {
            bytes: update.topic.len() + update.message.as_ref().map_or(0, |m| m.payload.len()),
            to: sender.clone(),
        });
        if let Some(charge) = &charge
            && let Some(limit) = c.retained_over_limit(&update.topic, charge)
        {
            self.peer_fault(sender, PeerFault::OverLimit(limit));
            return;
        }
        let mut message = match update.message {
            Some(p) => Message {
                topic: p.topic.as_str().into(),
                payload: p.payload,
                qos: p.qos,
                retain: true,
                expires_at: p
                    .properties
                    .message_expiry_interval
                    .map(|s| now.plus_secs(s)),
                properties: crate::codec::PublishProperties {
                    message_expiry_interval: None,
                    topic_alias: None,
                    subscription_identifiers: Vec::new(),
                    ..p.properties
                }
                .into(),
                origin: None,
            },
            None => Message {
                topic: update.topic.as_str().into(),
                payload: Bytes::new(),
                qos: QoS::AtMostOnce,
                retain: true,
                expires_at: None,
                properties: Default::default(),
                origin: None,
            },
        };
        // Its own bytes, not a part of the link frame it came in.
        message.detach();
        // What the store keeps out (its own bounds) is neither taken as the winner nor counted.
        if !self.store_retained(&Arc::new(message)) {
            return;
        }
        let Some(c) = &mut self.cluster else { return };
        c.hlc.observe(update.stamp.hlc, now.as_millis());
        c.account_retained(&update.topic, charge.as_ref());
        c.retained
            .apply(&update.topic, update.stamp.clone(), charge);
        self.persist_stamp(&update.topic, &update.stamp, deleted);
        self.prune_retained_tombstones();
    }

    /// Every retained write this node knows (tombstones included), in chunks.
    pub(super) fn send_retained_snapshot(&mut self, peer: &NodeId) {
        const CHUNK_BYTES: usize = 1 << 20;
        let now = self.now;
        let Some(c) = &self.cluster else { return };
        let per_chunk = c.config.snapshot_chunk_filters.max(1);
        let mut chunks = Vec::new();
        let mut chunk = Vec::new();
        let mut bytes = 0;
        for (topic, entry) in c.retained.iter() {
            if !c.residency_allows(topic, peer) {
                continue;
            }
            let message = match entry.value {
                None => None,
                Some(_) => match self.retained.get(topic) {
                    Some(m) if !m.is_expired(now) => Some(link_publish(m, now)),
                    // Not stored here (expired, or the store was full): nothing to offer.
                    _ => continue,
                },
            };
            bytes += topic.len() + message.as_ref().map_or(0, |m| m.payload.len());
            chunk.push(RetainedUpdate {
                topic: topic.to_string(),
                stamp: entry.stamp.clone(),
                message,
            });
            if chunk.len() >= per_chunk || bytes >= CHUNK_BYTES {
                chunks.push(std::mem::take(&mut chunk));
                bytes = 0;
            }
        }
        if !chunk.is_empty() {
            chunks.push(chunk);
        }
        for chunk in chunks {
            self.send_to_peer(peer.clone(), Frame::RetainedSnapshot(chunk));
        }
    }

    /// A retained message expired here: its stamp goes too (every node expires it by itself).
    pub(in crate::broker) fn retained_expired(&mut self, topic: &str) {
        let Some(c) = &mut self.cluster else { return };
        if let Some(old) = c.retained.forget(topic) {
            c.unaccount_retained(old.value.as_ref());
            let key = Key::RetainedStamp {
                topic: topic.to_owned(),
            };
            self.persist(key.encode(), None);
        }
    }

    /// A summary of the retained writes this node holds, equal on nodes that agree:
    /// (hash, entries with tombstones). `None` outside cluster mode.
    pub fn retained_digest(&self) -> Option<RetainedDigest> {
        Some(self.cluster.as_ref()?.retained.digest())
    }
}

impl Cluster {
    /// Which bound a write of `topic` charged as `charge` would break: its node's retained
    /// messages and bytes, with the write it replaces taken out if charged to the same node.
    fn retained_over_limit(&self, topic: &str, charge: &RetainedCharge) -> Option<PeerLimit> {
        if charge.to == self.owner.node {
            return None;
        }
        let limits = &self.config.peer_limits;
        let mut usage = self
            .retained_usage
            .get(&charge.to)
            .copied()
            .unwrap_or_default();
        if let Some(old) = self.retained.get(topic).and_then(|e| e.value.as_ref())
            && old.to == charge.to
        {
            usage.messages = usage.messages.saturating_sub(1);
            usage.bytes = usage.bytes.saturating_sub(old.bytes);
        }
        if usage.messages >= limits.max_retained_messages {
            Some(PeerLimit::RetainedMessages)
        } else if usage.bytes.saturating_add(charge.bytes) > limits.max_retained_bytes {
            Some(PeerLimit::RetainedBytes)
        } else {
            None
        }
    }

    /// Move the accounting of `topic` to the write about to win it (`None` for a delete).
    pub(super) fn account_retained(&mut self, topic: &str, charge: Option<&RetainedCharge>) {
        if let Some(old) = self.retained.get(topic).and_then(|e| e.value.clone()) {
            self.unaccount_retained(Some(&old));
        }
        if let Some(charge) = charge
            && charge.to != self.owner.node
        {
            let usage = self.retained_usage.entry(charge.to.clone()).or_default();
            usage.messages += 1;
            usage.bytes += charge.bytes;
        }
    }

    fn unaccount_retained(&mut self, charge: Option<&RetainedCharge>) {
        let Some(charge) = charge else { return };
        if let Some(usage) = self.retained_usage.get_mut(&charge.to) {
            usage.messages = usage.messages.saturating_sub(1);
            usage.bytes = usage.bytes.saturating_sub(charge.bytes);
            if usage.messages == 0 {
                self.retained_usage.remove(&charge.to);
            }
        }
    }
}
