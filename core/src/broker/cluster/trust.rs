//! What a peer can make this node believe or hold. Holding the deployment's key makes a node
//! a member, not the owner of anything but its own state: every frame that names an origin is
//! accepted only from that origin ([`foreign_origin`]), the number of nodes is bounded, and so
//! is what each one can make this node hold ([`PeerLimits`]). A peer past a bound has its
//! link session cut ([`Output::CutPeer`]); every refusal is counted, and reported once per
//! peer and kind ([`Event::PeerFault`]).

use crate::broker::io::{Event, Output};
use crate::broker::{Authenticator, Authorizer, Broker};
use crate::link::{Frame, FrameKind};
use crate::routes::{NodeId, ReplicaLimit, ReplicaLimits};

/// What one peer may make this node hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLimits {
    /// Filters in the peer's route set.
    pub max_filters: usize,
    /// Bytes of the peer's route deltas held while an earlier one is missing; past it they are
    /// dropped and the peer is asked for a snapshot instead (it is not cut: a large batch over a
    /// lossy path is no fault).
    pub max_pending_delta_bytes: usize,
    /// Bytes of a route snapshot of the peer's being assembled.
    pub max_snapshot_bytes: usize,
    /// Retained messages written by the peer (as their stamps say) held here.
    pub max_retained_messages: usize,
    /// Topic and payload bytes of those retained messages.
    pub max_retained_bytes: usize,
    /// Client ids the peer claims (clients it serves, sessions it holds) held here.
    pub max_claims: usize,
    /// Bytes of those claims (client ids, users and proofs, each with a fixed overhead).
    pub max_claim_bytes: usize,
    /// Bytes of sessions the peer ships here being assembled (a transfer's parts until the
    /// last one arrives).
    pub max_transfer_bytes: usize,
}

impl Default for PeerLimits {
    fn default() -> Self {
        Self {
            max_filters: 2_000_000,
            max_pending_delta_bytes: 16 * 1024 * 1024,
            max_snapshot_bytes: 256 * 1024 * 1024,
            max_retained_messages: 100_000,
            max_retained_bytes: 64 * 1024 * 1024,
            max_claims: 2_000_000,
            max_claim_bytes: 256 * 1024 * 1024,
            max_transfer_bytes: 64 * 1024 * 1024,
        }
    }
}

impl PeerLimits {
    /// The bounds of one route-set replica.
    pub fn replica(&self) -> ReplicaLimits {
        ReplicaLimits {
            max_filters: self.max_filters,
            max_pending_bytes: self.max_pending_delta_bytes,
            max_snapshot_bytes: self.max_snapshot_bytes,
        }
    }
}

/// Which of the [`PeerLimits`] a peer went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PeerLimit {
    /// [`PeerLimits::max_filters`].
    Filters,
    /// [`PeerLimits::max_snapshot_bytes`].
    SnapshotBytes,
    /// [`PeerLimits::max_retained_messages`].
    RetainedMessages,
    /// [`PeerLimits::max_retained_bytes`].
    RetainedBytes,
    /// [`PeerLimits::max_claims`].
    Claims,
    /// [`PeerLimits::max_claim_bytes`].
    ClaimBytes,
    /// [`PeerLimits::max_transfer_bytes`].
    TransferBytes,
}

impl From<ReplicaLimit> for PeerLimit {
    fn from(limit: ReplicaLimit) -> Self {
        match limit {
            ReplicaLimit::Filters => PeerLimit::Filters,
            ReplicaLimit::SnapshotBytes => PeerLimit::SnapshotBytes,
        }
    }
}

/// Why a frame from a peer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PeerFault {
    /// The frame named another node as its origin (owner, author or writer): dropped.
    NotOwner(FrameKind),
    /// Applying it would take the peer past a bound: dropped, and the session cut.
    OverLimit(PeerLimit),
    /// A retained write stamped further ahead of this node's clock than
    /// [`super::ClusterConfig::max_clock_drift_ms`]: dropped.
    ClockAhead,
    /// A node this node has no room for ([`super::ClusterConfig::max_nodes`]): dropped (and
    /// its link session, if it has one, cut).
    TooManyNodes,
}

impl PeerFault {
    /// Whether the peer's link session is cut (a node refused for the node count is cut when
    /// its session opens: its gossip has no session to cut).
    fn cuts(self) -> bool {
        matches!(self, PeerFault::OverLimit(_))
    }

    /// One bit per kind of fault, to report each once per peer.
    fn bit(self) -> u8 {
        match self {
            PeerFault::NotOwner(_) => 1,
            PeerFault::OverLimit(_) => 2,
            PeerFault::ClockAhead => 4,
            PeerFault::TooManyNodes => 8,
        }
    }
}

/// The kind of `frame` if it names an origin other than the peer that sent it (`peer`), as
/// seen by node `me`. Route deltas, snapshot chunks, retained writes and forwards are the
/// sender's own; a hello names the sender; a digest speaks of the sender's route set or of the
/// receiver's; acknowledgements speak of the receiver's. A forget announcement speaks of a third
/// node, and is honoured only by nodes that cannot reach it ([`Frame::Forget`]). Retained
/// snapshots may relay other
/// nodes' writes (a node that was away learns writes of nodes it cannot reach yet): they are
/// held to the same clock and size bounds instead. Claims are their claimer's own; a session
/// transfer answers the receiver's claim, by a claim of the sender's that came before it,
/// and a session-taken answer the sender's.
pub(super) fn foreign_origin(me: &NodeId, peer: &NodeId, frame: &Frame) -> Option<FrameKind> {
    let own = match frame {
        Frame::Hello { node, .. } => node == peer,
        Frame::RouteDelta(delta) => delta.owner.node == *peer,
        Frame::SnapshotChunk(chunk) => chunk.owner.node == *peer,
        Frame::Digest(entries) => entries
            .iter()
            .all(|e| e.owner.node == *peer || e.owner.node == *me),
        Frame::Forward(forward) => forward.origin.node == *peer,
        Frame::Retained(update) => update.stamp.node == *peer,
        Frame::RouteAck { owner, .. } => owner.node == *me,
        Frame::ForwardAck { origin, .. } => origin.node == *me,
        Frame::Claim(update) => update.stamp.node == *peer,
        Frame::ClaimSnapshot(updates) => updates.iter().all(|u| u.stamp.node == *peer),
        Frame::SessionTransfer(t) => {
            t.claim.node == *me
                && t.by.as_ref().is_none_or(|by| {
                    by.stamp.node == *peer && by.client_id == t.client_id && by.stamp < t.claim
                })
        }
        Frame::SessionTaken { claim, .. } | Frame::SessionRouted { claim, .. } => {
            claim.node == *peer
        }
        // A relay and its end answer the receiver's claim; an acknowledgement the sender's.
        Frame::SessionRelay(r) => r.claim.node == *me,
        Frame::SessionRelayDone { claim, .. } | Frame::SessionRelayCaughtUp { claim, .. } => {
            claim.node == *me
        }
        Frame::SessionRelayAck { claim, .. } => claim.node == *peer,
        // The sender's own filters: they name no other node.
        Frame::ScopedRoutes { .. }
        | Frame::SnapshotRequest
        | Frame::Fence { .. }
        | Frame::FenceEcho { .. }
        | Frame::ClaimRequest { .. }
        | Frame::ClaimAnswer { .. }
        | Frame::Revoke { .. }
        | Frame::Revoked { .. }
        | Frame::Forget { .. }
        | Frame::KeepAlive
        | Frame::RetainedDigest { .. }
        | Frame::RetainedSnapshot(_) => true,
    };
    (!own).then(|| frame.kind())
}

/// Nodes refused for the node count that are remembered, so that each is reported once.
pub(super) const REFUSED_NODES_KEPT: usize = 1_024;

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Count a refused frame, report it the first time per peer and kind, and cut the peer's
    /// session if the fault calls for it.
    pub(super) fn peer_fault(&mut self, peer: &NodeId, fault: PeerFault) {
        let stats = &mut self.stats;
        match fault {
            PeerFault::NotOwner(_) => stats.peer_frames_not_owner += 1,
            PeerFault::OverLimit(_) => stats.peer_frames_over_limit += 1,
            PeerFault::ClockAhead => stats.peer_frames_clock_ahead += 1,
            PeerFault::TooManyNodes => stats.peer_frames_too_many_nodes += 1,
        }
        let Some(c) = &mut self.cluster else { return };
        let first = match c.peers.get_mut(peer) {
            Some(p) => {
                let first = p.faults_reported & fault.bit() == 0;
                p.faults_reported |= fault.bit();
                first
            }
            // A node not admitted: reported once, while there is room to remember it.
            None => {
                c.refused_nodes.len() < REFUSED_NODES_KEPT && c.refused_nodes.insert(peer.clone())
            }
        };
        if first {
            self.event(Event::PeerFault {
                peer: peer.clone(),
                fault,
            });
        }
        if fault.cuts() {
            self.cut_peer(peer.clone());
        }
    }

    /// End `peer`'s link session (the shell reports `PeerDown` once it has), counted.
    pub(super) fn cut_peer(&mut self, peer: NodeId) {
        self.stats.peer_sessions_cut += 1;
        self.outputs.push_back(Output::CutPeer { peer });
    }
}
