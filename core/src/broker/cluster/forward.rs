//! PUBLISH forwarded once to each node with a matching filter, QoS 1/2 through the durable
//! per-peer outbox, deduplicated on arrival.

use std::sync::Arc;

use super::trust::PeerFault;
use crate::broker::io::Timestamp;
use crate::broker::message::Message;
use crate::broker::persist::{InboxMark, Key};
use crate::broker::{Authenticator, Authorizer, Broker};
use crate::codec::{Publish, PublishProperties, QoS};
use crate::link::{Arrival, Forward, Frame, FrameKind, MessageId};
use crate::routes::NodeId;

/// A message as it travels on the link: every property, the expiry interval set to what
/// remains.
pub(super) fn link_publish(message: &Message, now: Timestamp) -> Publish {
    let mut properties = PublishProperties::clone(&message.properties);
    properties.message_expiry_interval = message.remaining_expiry_secs(now).map(|s| s.max(1));
    Publish {
        dup: false,
        qos: message.qos,
        retain: message.retain,
        topic: message.topic.to_string(),
        packet_id: (message.qos != QoS::AtMostOnce).then_some(1),
        payload: message.payload.clone(),
        properties,
    }
}

/// A message that came on the link, as the broker holds it: its expiry from what remained.
pub(super) fn link_message(p: Publish, now: Timestamp) -> Message {
    Message {
        topic: p.topic.as_str().into(),
        payload: p.payload,
        qos: p.qos,
        retain: p.retain,
        expires_at: p
            .properties
            .message_expiry_interval
            .map(|s| now.plus_secs(s)),
        properties: p.properties.into(),
        origin: None,
    }
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Whether a QoS 1/2 message on `topic` would overflow the outbox of a connected node that
    /// wants it (a node that is not there, or does not acknowledge, never holds a publisher
    /// back: its outbox makes room).
    pub(in crate::broker) fn outbox_full_for(&self, topic: &str, weight: usize) -> bool {
        let Some(c) = &self.cluster else { return false };
        let mut nodes = Vec::new();
        c.table.nodes_for(topic, &mut nodes);
        let stall_ms = c.config.outbox_stall_ms;
        nodes.iter().any(|n| {
            c.peers.get(n).is_some_and(|p| {
                p.holds_publishers(self.now, stall_ms) && !p.outbox.has_room(weight)
            })
        })
    }

    /// Send a locally published message to every node that has a matching subscriber, once.
    pub(in crate::broker) fn forward(&mut self, message: &Arc<Message>) {
        self.forward_from(message, None);
    }

    /// Send a message on to the nodes that want it: all of them for a local publisher
    /// (`from` is `None`); for one a peer forwarded here, only where that may go on
    /// ([`super::leaves`]): from a mesh node to the leaves, from a leaf to the mesh and the
    /// other leaves.
    fn forward_from(&mut self, message: &Arc<Message>, from: Option<&NodeId>) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let mut nodes = std::mem::take(&mut c.scratch);
        c.table.nodes_for(&message.topic, &mut nodes);
        if message.qos != QoS::AtMostOnce {
            // Peers whose routes this node has not caught up with since their link came up
            // get it too (they drop what no subscriber of theirs wants).
            for (node, p) in &c.peers {
                if p.connected
                    && !p.routes_current
                    && !c.leaves.is_leaf(node)
                    && c.is_member(node)
                    && !nodes.contains(node)
                {
                    nodes.push(node.clone());
                }
            }
        }
        c.scoped_nodes_for(&message.topic, &mut nodes);
        if !c.residency.is_empty() {
            let withheld = c.residency_filter(&message.topic, &mut nodes);
            self.stats.residency_withheld += withheld;
        }
        let Some(c) = &mut self.cluster else { return };
        if let Some(from) = from {
            if c.leaves.is_leaf(from) {
                nodes.retain(|n| n != from);
            } else {
                nodes.retain(|n| c.leaves.is_leaf(n));
            }
        }
        if c.leaves.any_scoped() {
            nodes.retain(|n| c.leaves.allows(n, &message.topic));
        }
        if nodes.is_empty() {
            c.scratch = nodes;
            return;
        }
        let publish = if message.qos == QoS::AtMostOnce {
            link_publish(message, now)
        } else {
            // It may wait in the peers' outboxes.
            link_publish(&message.detached(), now)
        };
        // The message's number here: the one it is routed under, or for a message this node
        // passes on from a leaf or to its leaves (it is their origin now), a new one.
        let seq = match (from, &c.routing) {
            (None, Some((origin, seq))) if *origin == c.owner => *seq,
            _ => {
                c.next_message += 1;
                c.next_message - 1
            }
        };
        let forward = Forward {
            origin: c.owner.clone(),
            seq,
            message: publish,
        };
        // Encoded once for every node it goes to: the frame sent, and for QoS 1/2 the outbox
        // record's value.
        let whole = Frame::Forward(forward);
        let (Some(frame), Frame::Forward(forward)) = (super::encoded(&whole), whole) else {
            self.stats.dropped_too_large += 1;
            c.scratch = nodes;
            return;
        };
        let stall_ms = c.config.outbox_stall_ms;
        for node in nodes.drain(..) {
            let Some(c) = &mut self.cluster else { break };
            let peer = c.peer(&node);
            if message.qos == QoS::AtMostOnce {
                if !peer.connected {
                    self.stats.dropped_peer_down += 1;
                } else if peer.congested {
                    self.stats.dropped_peer_congested += 1;
                } else {
                    peer.forwarded_to += 1;
                    self.send_encoded(node, frame.clone());
                }
                continue;
            }
            if peer.outbox.is_empty() {
                // Nothing was waiting: the time a stall is measured from starts now.
                peer.acked_at = now;
            }
            let pushed = if peer.holds_publishers(now, stall_ms) {
                peer.outbox.push(&forward, &frame).map(|q| (q, Vec::new()))
            } else {
                peer.outbox.push_evicting(&forward, &frame)
            };
            match pushed {
                Ok((queued, evicted)) => {
                    peer.forwarded_to += 1;
                    self.stats.dropped_peer_absent += evicted.len() as u64;
                    for seq in evicted {
                        let key = Key::Outbox {
                            peer: node.clone(),
                            seq,
                        };
                        self.persist(key.encode(), None);
                    }
                    let key = Key::Outbox {
                        peer: node.clone(),
                        seq: queued.seq,
                    };
                    self.persist(key.encode(), Some(queued.frame.into_bytes()));
                    self.pump_outbox(&node);
                }
                Err(_) => self.stats.dropped_outbox_full += 1,
            }
        }
        if let Some(c) = &mut self.cluster {
            c.scratch = nodes;
        }
    }

    /// Send what the window allows from a peer's outbox, if the link is up.
    pub(super) fn pump_outbox(&mut self, node: &NodeId) {
        let Some(c) = &mut self.cluster else { return };
        if !c.is_member(node) {
            return;
        }
        let Some(peer) = c.peers.get_mut(node) else {
            return;
        };
        if !peer.connected {
            return;
        }
        let forwards = peer.outbox.take_sendable();
        let incarnation = c.owner.incarnation;
        let sent_all = !peer.outbox.has_unsent();
        let echoes = if sent_all {
            std::mem::take(&mut peer.echoes)
        } else {
            Vec::new()
        };
        for forward in forwards {
            self.send_encoded(node.clone(), forward);
        }
        for (token, next) in echoes {
            let echo = Frame::FenceEcho {
                token,
                incarnation,
                next,
            };
            self.send_to_peer(node.clone(), echo);
        }
        if sent_all {
            self.relays_outbox_sent(node);
        }
    }

    /// A message forwarded by a peer: delivered to local subscribers, once, and sent on only
    /// between the mesh and this node's leaves ([`super::leaves`]), so nothing loops.
    pub(super) fn on_forward(&mut self, peer: NodeId, forward: Forward) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        c.peer(&peer).forwarded_from += 1;
        let p = forward.message;
        let qos = p.qos;
        let message = link_message(p, now);
        let relays = !c.leaves.is_empty();
        let origin = forward.origin;
        let seq = forward.seq;
        // A leaf's message outside its scope is taken (a QoS 1/2 one marked had and
        // acknowledged, so that the leaf does not send it again) and delivered nowhere.
        let in_scope = c.leaves.allows(&peer, &message.topic);
        if !in_scope {
            self.peer_fault(&peer, PeerFault::NotOwner(FrameKind::Forward));
        }
        if qos == QoS::AtMostOnce {
            if in_scope {
                self.take_forwarded(message, &peer, (origin, seq), relays);
            }
            return;
        }
        let Some(c) = &mut self.cluster else { return };
        let arrival = c.inbox.arrive(&origin, seq);
        self.delete_forgotten_marks();
        if arrival == Arrival::Deliver {
            if in_scope {
                // Relayed in the same batch as the duplicate mark: stored together, or not at all.
                self.take_forwarded(message, &peer, (origin.clone(), seq), relays);
            }
            self.vouched_passed(&origin, seq);
            let key = Key::InboxMark {
                origin: origin.node.clone(),
                incarnation: origin.incarnation,
            };
            self.persist(key.encode(), Some(InboxMark { seq, qos }.encode()));
        }
        self.send_to_peer(peer, Frame::ForwardAck { origin, seq });
    }

    /// A forwarded message `id` from `peer`: passed on between the mesh and this node's
    /// leaves (while there are leaves, `relays`), and delivered to local subscribers.
    fn take_forwarded(&mut self, message: Message, peer: &NodeId, id: MessageId, relays: bool) {
        if relays {
            self.forward_from(&Arc::new(message.clone()), Some(peer));
        }
        self.begin_peer_routing(id);
        self.deliver_local(message);
        self.end_routing();
    }

    /// Delete the records of duplicate marks the inbox let go of.
    pub(super) fn delete_forgotten_marks(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        for (origin, incarnation) in c.inbox.take_forgotten() {
            let key = Key::InboxMark {
                origin: origin.clone(),
                incarnation,
            };
            self.persist(key.encode(), None);
        }
    }
}
