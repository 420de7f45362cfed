//! Nodes that leave: forgotten by an operator's command ([`Broker::forget_peer`]), by an
//! announcement of another node's operator ([`Frame::Forget`]), or by themselves after
//! [`super::ClusterConfig::peer_expiry_ms`] without a link. Forgetting a node withdraws its
//! routes and drops what waited for it (counted); a forgotten node that comes back is met as a
//! new member: its route set is copied afresh, and forwards to it continue their numbering.

use bytes::Bytes;

use crate::broker::io::{Event, Timestamp};
use crate::broker::persist::Key;
use crate::broker::{Authenticator, Authorizer, Broker, Timer};
use crate::link::{Frame, FrameKind};
use crate::routes::NodeId;

use super::trust::PeerFault;

/// Why a node was forgotten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForgetReason {
    /// An operator asked this node ([`Broker::forget_peer`]).
    Command,
    /// It had no link to this node for [`super::ClusterConfig::peer_expiry_ms`].
    Expired,
    /// An operator asked another node, which told this one ([`Frame::Forget`]).
    Announced {
        /// The node that announced it.
        by: NodeId,
    },
}

/// What forgetting a node dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forgotten {
    /// Filters of its route set withdrawn here.
    pub routes: usize,
    /// Forwards that waited for it, dropped (`Stats::dropped_peer_forgotten`).
    pub dropped_messages: usize,
}

/// Why a node cannot be forgotten.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForgetError {
    /// The broker is not a node of a deployment.
    #[error("this broker is not clustered")]
    NotClustered,
    /// This node.
    #[error("a node cannot forget itself")]
    Myself,
    /// A node this node knows nothing of.
    #[error("unknown node")]
    Unknown,
    /// A node whose link is up: it has not left.
    #[error("the node is connected; stop it first")]
    Connected,
}

/// Forgotten nodes whose forward numbering and duplicate marks are remembered, at most.
pub(super) const FORGOTTEN_KEPT: usize = 1_024;

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Forget a node that left the deployment for good: withdraw its routes, drop the forwards
    /// waiting for it (counted), and tell the other nodes to do the same. Refused for a node
    /// whose link is up.
    pub fn forget_peer(&mut self, now: Timestamp, node: &NodeId) -> Result<Forgotten, ForgetError> {
        self.forget_peer_signed(now, node, None)
    }

    /// [`Broker::forget_peer`], the announcement carrying `signature` (the operator's, of
    /// this node's incarnation as [`Broker::peers`] shows it), which the other nodes'
    /// [`Authorizer::vouches_forget`] checks.
    pub fn forget_peer_signed(
        &mut self,
        now: Timestamp,
        node: &NodeId,
        signature: Option<Bytes>,
    ) -> Result<Forgotten, ForgetError> {
        self.advance(now);
        let leaf = self.is_leaf(node);
        let forgotten = self.forget(node, ForgetReason::Command)?;
        if leaf {
            // The mesh never knew it.
            return Ok(forgotten);
        }
        let incarnation = self
            .cluster
            .as_ref()
            .and_then(|c| c.forgotten.iter().find(|f| f.node == *node))
            .map_or(0, |f| f.incarnation);
        self.broadcast(&Frame::Forget {
            node: node.clone(),
            incarnation,
            signature,
        });
        Ok(forgotten)
    }

    fn forget(&mut self, node: &NodeId, reason: ForgetReason) -> Result<Forgotten, ForgetError> {
        let Some(c) = &mut self.cluster else {
            return Err(ForgetError::NotClustered);
        };
        if *node == c.owner.node {
            return Err(ForgetError::Myself);
        }
        let replica = c.table.replica(node).map(|r| (r.len(), r.incarnation));
        let Some(peer) = c.peers.remove(node) else {
            if replica.is_none() {
                return Err(ForgetError::Unknown);
            }
            return Ok(self.withdraw(node, reason, 0, 1, replica));
        };
        if peer.connected {
            c.peers.insert(node.clone(), peer);
            return Err(ForgetError::Connected);
        }
        let dropped: Vec<u64> = peer.outbox.seqs().collect();
        for seq in &dropped {
            let key = Key::Outbox {
                peer: node.clone(),
                seq: *seq,
            };
            self.persist(key.encode(), None);
        }
        let next_seq = peer.outbox.next_seq();
        Ok(self.withdraw(node, reason, dropped.len(), next_seq, replica))
    }

    /// The rest of forgetting `node`, once its peer state is gone.
    fn withdraw(
        &mut self,
        node: &NodeId,
        reason: ForgetReason,
        dropped: usize,
        next_seq: u64,
        replica: Option<(usize, u64)>,
    ) -> Forgotten {
        let Some(c) = &mut self.cluster else {
            return Forgotten {
                routes: 0,
                dropped_messages: 0,
            };
        };
        let (routes, incarnation) = replica.unwrap_or((0, 0));
        c.table.remove_node(node);
        c.routes.remove_peer(node);
        c.certified.remove(node);
        self.forget_scoped(node);
        self.moves_forget_node(node);
        self.forget_claims_of(node);
        let Some(c) = &mut self.cluster else {
            return Forgotten {
                routes: 0,
                dropped_messages: 0,
            };
        };
        // The node's duplicate marks stay (it may come back and re-send what it had queued),
        // until so many nodes were forgotten since that it is let go of entirely.
        let (order, let_go) = c.remember_forgotten(node.clone(), incarnation, next_seq);
        let mut record = Vec::with_capacity(24);
        for word in [incarnation, next_seq, order] {
            record.extend_from_slice(&word.to_be_bytes());
        }
        self.persist(
            Key::Forgotten { node: node.clone() }.encode(),
            Some(record.into()),
        );
        self.let_go(let_go);
        self.persist_replica(node, false);
        self.forget_leaf(node);
        self.persist(Key::ReplicaPosition { node: node.clone() }.encode(), None);
        self.stats.dropped_peer_forgotten += dropped as u64;
        self.stats.peers_forgotten += 1;
        self.event(Event::PeerForgotten {
            peer: node.clone(),
            reason,
            routes,
            dropped_messages: dropped,
        });
        self.release_fences();
        Forgotten {
            routes,
            dropped_messages: dropped,
        }
    }

    /// Drop what is remembered of nodes forgotten long ago: their record, and their duplicate
    /// marks unless they came back since.
    fn let_go(&mut self, nodes: Vec<NodeId>) {
        for old in nodes {
            self.persist(Key::Forgotten { node: old.clone() }.encode(), None);
            let Some(c) = &mut self.cluster else { return };
            if c.knows(&old) {
                continue;
            }
            for incarnation in c.inbox.forget(&old) {
                let key = Key::InboxMark {
                    origin: old.clone(),
                    incarnation,
                };
                self.persist(key.encode(), None);
            }
        }
    }

    /// After a restart: the forgotten nodes read from storage, oldest first; those that came
    /// back before it are no longer forgotten, and the oldest beyond the bound are let go.
    pub(in crate::broker) fn finish_cluster_restore(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        c.forgotten.make_contiguous().sort_by_key(|f| f.order);
        let back: Vec<NodeId> = c
            .forgotten
            .iter()
            .filter(|f| c.knows(&f.node))
            .map(|f| f.node.clone())
            .collect();
        c.forgotten.retain(|f| !back.contains(&f.node));
        let let_go = c.trim_forgotten();
        for node in back {
            self.persist(Key::Forgotten { node: node.clone() }.encode(), None);
        }
        self.let_go(let_go);
    }

    /// Another node's operator forgot `node`: forget it too, unless this node can reach it or
    /// knows a later incarnation of it.
    pub(super) fn on_forget(
        &mut self,
        from: &NodeId,
        node: &NodeId,
        incarnation: u64,
        signature: Option<&[u8]>,
    ) {
        let Some(c) = &self.cluster else { return };
        if *node == c.owner.node || node == from {
            return;
        }
        if c.peers.get(node).is_some_and(|p| p.connected) {
            return;
        }
        // Only the incarnation this node knows (the one the announcing node forgot, if they
        // agree): a later one is alive, and one nobody has met yet (up to u64::MAX) is no
        // node's word.
        let known = c.table.replica(node).map_or(0, |r| r.incarnation);
        if incarnation != known {
            if incarnation > known {
                self.peer_fault(from, PeerFault::NotOwner(FrameKind::Forget));
            }
            return;
        }
        if !self.authorizer.vouches_forget(node, incarnation, signature) {
            return self.peer_fault(from, PeerFault::NotOwner(FrameKind::Forget));
        }
        let reason = ForgetReason::Announced { by: from.clone() };
        // Unknown here already: nothing to do.
        let _ = self.forget(node, reason);
    }

    /// Forget the nodes that had no link for the expiry time, and check again later.
    pub(in crate::broker) fn fire_peer_expiry(&mut self) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let (peer_expiry, leaf_expiry) = (c.config.peer_expiry_ms, c.config.leaf_expiry_ms);
        // Route sets restored from storage of nodes that never came back count as absent too.
        let orphans: Vec<NodeId> = c
            .table
            .replicas()
            .map(|(n, _)| n.clone())
            .filter(|n| !c.peers.contains_key(n))
            .collect();
        for node in orphans {
            c.peer(&node);
        }
        let mut expired = Vec::new();
        for (node, p) in c.peers.iter_mut().filter(|(_, p)| !p.connected) {
            let expiry = if c.leaves.is_leaf(node) {
                leaf_expiry
            } else {
                peer_expiry
            };
            match p.last_heard {
                Some(at) if now.millis_since(at) >= expiry => expired.push(node.clone()),
                Some(_) => {}
                // Absent since it became known (from storage, or by gossip): from now on.
                None => p.last_heard = Some(now),
            }
        }
        let next = now.plus_ms(expiry_check_ms(peer_expiry.min(leaf_expiry)));
        self.timers.insert((next, Timer::PeerExpiry));
        for node in expired {
            let _ = self.forget(&node, ForgetReason::Expired);
        }
    }

    /// Arm the first expiry check.
    pub(super) fn arm_peer_expiry(&mut self, now: Timestamp) {
        if let Some(c) = &self.cluster {
            let expiry = c.config.peer_expiry_ms.min(c.config.leaf_expiry_ms);
            let at = now.plus_ms(expiry_check_ms(expiry));
            self.timers.insert((at, Timer::PeerExpiry));
        }
    }
}

/// How often absent nodes are checked: a quarter of the expiry time, within 100 ms and a
/// minute, so that a node is forgotten at most a quarter (or a minute) late.
fn expiry_check_ms(expiry_ms: u64) -> u64 {
    (expiry_ms / 4).clamp(100, 60_000)
}
