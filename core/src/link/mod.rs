//! The link protocol between nodes: versioned, length-prefixed frames that carry the route
//! index and forwarded messages. Transport-agnostic: the daemon carries frames over libp2p
//! streams and gossip, the edge worker over a WebSocket, the simulator over virtual links.
//!
//! A frame is a 4-byte big-endian length (of what follows), a type byte and its body. Every
//! decoder refuses malformed input with a [`LinkError`], never a panic, and never allocates
//! more than the frame's own length. Shells read frames with a [`FrameReader`] (a byte
//! stream) or [`decode_message`] (a whole message), and write the [`EncodedFrame`]s the
//! broker hands them as they are.

mod codec;
mod inbox;
mod outbox;
mod wire;

use bytes::Bytes;

use crate::codec::Publish;
use crate::retained::{Hlc, Stamp};
use crate::routes::{NodeId, Owner, RouteDelta, SnapshotChunk};

pub use codec::{LinkError, decode, encode, encoded_len};

/// A message's identity in the deployment: its origin (node and incarnation) and its number
/// there ([`Forward::seq`]).
pub type MessageId = (Owner, u64);
pub use inbox::{Arrival, Inbox};
pub use outbox::{Outbox, OutboxFull, OutboxLimits, Queued};
pub use wire::{EncodedFrame, FrameReader, StreamRead, decode_message};

/// The link protocol version spoken by this build; sent in [`Frame::Hello`].
pub const LINK_PROTOCOL_VERSION: u16 = 8;

/// Largest frame accepted by default (a snapshot chunk or a forwarded message).
pub const DEFAULT_MAX_FRAME_LEN: u32 = 16 * 1024 * 1024;

/// One owner's position, as announced in a [`Frame::Digest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DigestEntry {
    /// The route set's owner.
    pub owner: Owner,
    /// The version of that route set the sender holds.
    pub version: u64,
    /// [`crate::routes::set_hash`] of the live set at that version.
    pub hash: u64,
}

/// A PUBLISH forwarded from the node where it was published (`origin`) to a node with a
/// matching subscriber. `seq` is the message's number at its origin: one per message, the
/// same towards every destination, growing, so that (origin, seq) names a message in the
/// deployment and a receiver drops a QoS 1/2 forward it already had.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forward {
    /// The node (and incarnation) where the message was published.
    pub origin: Owner,
    /// The message's number at its origin (0: none).
    pub seq: u64,
    /// The message with every MQTT 5.0 property. Its packet id means nothing on the link; its
    /// Message Expiry Interval is what remained when it was sent.
    pub message: Publish,
}

/// A retained write replicated to every node: the message (its topic is `topic`; its Message
/// Expiry Interval is what remained when it was sent), or `None` for a delete. Nodes keep the
/// write with the greatest stamp per topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetainedUpdate {
    /// The topic written.
    pub topic: String,
    /// When and where the write was accepted; the greatest stamp wins.
    pub stamp: Stamp,
    /// The retained message, or `None` for a delete.
    pub message: Option<Publish>,
}

/// What a node that serves a client says about it: who the client logged in as, and whether
/// its CONNECT asked to resume its session (clean start 0) and keep it after the connection
/// (a session expiry above 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The user the client logged in as (the authenticator's choice, or the CONNECT user name).
    pub user: Option<String>,
    /// The CONNECT asked to resume its session: the node that held it ships it over.
    pub resume: bool,
    /// The session outlives the connection (session expiry above 0).
    pub persistent: bool,
    /// What shows that the client authenticated at the claiming node as `user`, if the
    /// authenticator gave one ([`crate::broker::Authenticator::claim_proof`]): the node that
    /// holds the session checks it ([`crate::broker::Authorizer::vouches`]). Opaque here.
    pub proof: Option<Bytes>,
}

/// A client id claimed by the node that serves the client now (the stamp's node), or let go
/// by it (`claim: None`: the session ended there). Every node keeps the claim with the
/// greatest stamp per client id; a node that held the session and sees a newer claim closes
/// its connection and ships the session to the claiming node ([`Frame::SessionTransfer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimUpdate {
    /// The client id.
    pub client_id: String,
    /// When and where the client connected (or its session ended); the greatest stamp wins.
    pub stamp: Stamp,
    /// The claim, or `None` when the session ended at the stamp's node.
    pub claim: Option<Claim>,
}

/// Part of a session shipped to the node that claimed its client id: the session as the
/// records it is stored as (session, subscriptions, messages in flight and queued, QoS 2
/// packet ids received), in `count` frames. The receiver takes the session once every part
/// arrived and answers [`Frame::SessionTaken`]; until then the sender keeps it and sends it
/// again on every new link session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionTransfer {
    /// The session's client id.
    pub client_id: String,
    /// The receiver's claim that the session answers.
    pub claim: Stamp,
    /// Which shipment this is: the clock of the node that shipped the session first, and
    /// that node. A node that passes a session on (claimed since by another) keeps it, so
    /// that two sessions one node sends for the same claim are two shipments, and one sent
    /// again is the same.
    pub shipment: Stamp,
    /// This part's index, below `count`.
    pub index: u32,
    /// Parts in the transfer.
    pub count: u32,
    /// The sender's own claim on the client id that `claim` replaced: what it held the
    /// session by (or waited for it by, when it passes on a session that reached it after
    /// `claim`). The receiver takes the transfer only from the node this claim names, made
    /// before `claim`, and one its authorizer vouches for; `None` from a sender that had no
    /// claim of its own, taken only where claims need no proof.
    pub by: Option<ClaimUpdate>,
    /// Storage records (key, value) of the session.
    pub records: Vec<(Bytes, Bytes)>,
}

/// Everything nodes say to each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// First frame on a link, both ways.
    Hello {
        /// The sender's node id.
        node: NodeId,
        /// The sender's incarnation (it grows on every start).
        incarnation: u64,
        /// The link protocol version the sender speaks ([`LINK_PROTOCOL_VERSION`]).
        protocol: u16,
        /// The sender's region.
        region: String,
        /// The operator's certificate of the sender's node id and region, where the
        /// deployment has operator keys (what it is and who checks it is the shell's:
        /// [`crate::broker::Authorizer::vouches_region`]).
        certificate: Option<Bytes>,
    },
    /// New changes of an owner's route set, applied in version order.
    RouteDelta(RouteDelta),
    /// The sender applied `owner`'s changes up to `version`.
    RouteAck {
        /// The owner whose changes were applied.
        owner: Owner,
        /// The version applied up to.
        version: u64,
    },
    /// Where the sender stands for each owner it knows (anti-entropy).
    Digest(Vec<DigestEntry>),
    /// Send me a snapshot of your route set.
    SnapshotRequest,
    /// Part of the sender's route set, answering a [`Frame::SnapshotRequest`].
    SnapshotChunk(SnapshotChunk),
    /// A message for the receiver's local subscribers.
    Forward(Forward),
    /// Every forward from `origin` with a sequence number up to `seq` arrived.
    ForwardAck {
        /// The node (and incarnation) the forwards came from.
        origin: Owner,
        /// The highest sequence number acknowledged.
        seq: u64,
    },
    /// Says nothing: a transport may send it to keep an idle link open; the broker ignores it.
    KeepAlive,
    /// A retained write accepted by the sender (or one it learned that won).
    Retained(RetainedUpdate),
    /// The sender's retained state in short: if it differs from the receiver's, the receiver
    /// sends its whole state as [`Frame::RetainedSnapshot`] chunks.
    RetainedDigest {
        /// The hash of the sender's retained state ([`crate::retained::RetainedDigest::hash`]).
        hash: u64,
        /// Topics the sender holds, tombstones included.
        entries: u64,
    },
    /// Part of the sender's retained state, tombstones included.
    RetainedSnapshot(Vec<RetainedUpdate>),
    /// An operator told the sender to forget `node` (it left the deployment for good): a
    /// receiver that cannot reach `node` either forgets it too, unless it knows a later
    /// incarnation of it.
    Forget {
        /// The node to forget.
        node: NodeId,
        /// The latest incarnation of it the sender knew (0: none).
        incarnation: u64,
        /// The operator's signature of the forget, where the deployment has operator keys
        /// (what it is and who checks it is the shell's: [`crate::broker::Authorizer::vouches_forget`]).
        signature: Option<Bytes>,
    },
    /// A client id the sender claimed (a client connected there) or let go.
    Claim(ClaimUpdate),
    /// The claims the sender holds of its own, sent when a link session opens.
    ClaimSnapshot(Vec<ClaimUpdate>),
    /// Part of a session shipped to the receiver, whose claim took it over.
    SessionTransfer(SessionTransfer),
    /// The sender took the session that answers its claim: the shipping node lets go of it.
    SessionTaken {
        /// The session's client id.
        client_id: String,
        /// The sender's claim.
        claim: Stamp,
        /// The shipment taken ([`SessionTransfer::shipment`]).
        shipment: Stamp,
    },
    /// A message for a session shipped to the receiver, that reached the sender after the
    /// session left (its subscriptions stay there until the receiver's routes are known).
    SessionRelay(SessionRelay),
    /// The sender has every relayed message of that session up to `n`.
    SessionRelayAck {
        /// The session's client id.
        client_id: String,
        /// The claim the session was shipped for.
        claim: Stamp,
        /// The highest relayed number received.
        n: u64,
    },
    /// Every node the sender knows routes the shipped session's subscriptions to the sender:
    /// the node that shipped it lets go of them once what the others routed to it before is
    /// in ([`Frame::Fence`]).
    SessionRouted {
        /// The session's client id.
        client_id: String,
        /// The sender's claim.
        claim: Stamp,
    },
    /// The sender relays nothing more for that session: `last` was its last relayed number.
    SessionRelayDone {
        /// The session's client id.
        client_id: String,
        /// The claim the session was shipped for.
        claim: Stamp,
        /// The last relayed number (0: none).
        last: u64,
    },
    /// Answer with [`Frame::FenceEcho`] once everything sent to the sender before it is on
    /// its way (after the forwards queued for it).
    Fence {
        /// Told back in the echo.
        token: u64,
    },
    /// Everything the sender had for the receiver when its [`Frame::Fence`] came was sent
    /// before this.
    FenceEcho {
        /// The fence's token.
        token: u64,
        /// The sender's incarnation.
        incarnation: u64,
        /// The number the sender's next message was to get when the fence came: every message
        /// it published before the fence is numbered below it.
        next: u64,
    },
    /// A client whose id is pinned to the receiver's region connected to the sender: may the
    /// sender serve it? (The receiver is the region's node that decides for it.)
    ClaimRequest {
        /// The client id.
        client_id: String,
        /// The user the client logged in as.
        user: Option<String>,
        /// What shows that the client logged in at the sender as `user` ([`Claim::proof`]):
        /// the receiver decides only for a request its authorizer vouches for.
        proof: Option<Bytes>,
        /// Told back in the answer.
        token: u64,
    },
    /// The answer to a [`Frame::ClaimRequest`].
    ClaimAnswer {
        /// The client id.
        client_id: String,
        /// The request's token.
        token: u64,
        /// 0: granted (the sender's clock reading `hlc` is below nothing the previous owner
        /// stamped); otherwise the MQTT 5.0 reason code the client is refused with.
        reason: u8,
        /// The deciding node's clock when it granted.
        hlc: Hlc,
    },
    /// Close the connection of this client, if the receiver serves it: another node is
    /// about to (its session stays, and follows the new node's claim).
    Revoke {
        /// The client id.
        client_id: String,
        /// Told back in [`Frame::Revoked`].
        token: u64,
    },
    /// The receiver's [`Frame::Revoke`] was done: the sender serves the client no more.
    Revoked {
        /// The client id.
        client_id: String,
        /// The revocation's token.
        token: u64,
    },
    /// The sender's filters that a data-residency rule keeps out of its route set, those the
    /// receiver's region may know of: all of them, replacing what it sent before. Sent on the
    /// link session to the nodes of those regions only, never by gossip.
    ScopedRoutes {
        /// The filters, each once.
        filters: Vec<String>,
    },
    /// Everything `node` routed to the sender for that session before it routed it to the
    /// receiver was relayed before this (or `node` is the sender, and its own forwards to the
    /// receiver were sent): the receiver may deliver `node`'s newer messages to the session
    /// without breaking their order.
    SessionRelayCaughtUp {
        /// The session's client id.
        client_id: String,
        /// The receiver's claim the session was shipped for.
        claim: Stamp,
        /// The node whose messages are all in.
        node: NodeId,
    },
}

/// A message relayed to the node a session was shipped to ([`Frame::SessionRelay`]), with its
/// identity in the deployment, so that the receiver delivers it once whichever way it comes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRelay {
    /// The session's client id.
    pub client_id: String,
    /// The receiver's claim the session was shipped for.
    pub claim: Stamp,
    /// Numbers the sender's relays for that session, from 1.
    pub n: u64,
    /// The node (and incarnation) where the message was published, or relayed into the
    /// mesh from a leaf.
    pub origin: Owner,
    /// The message's number at its origin ([`Forward::seq`]); 0 if it has none.
    pub seq: u64,
    /// The message as the session gets it (its QoS is the delivery's).
    pub message: Publish,
}

impl Frame {
    /// What kind of frame this is.
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Hello { .. } => FrameKind::Hello,
            Frame::RouteDelta(_) => FrameKind::RouteDelta,
            Frame::RouteAck { .. } => FrameKind::RouteAck,
            Frame::Digest(_) => FrameKind::Digest,
            Frame::SnapshotRequest => FrameKind::SnapshotRequest,
            Frame::SnapshotChunk(_) => FrameKind::SnapshotChunk,
            Frame::Forward(_) => FrameKind::Forward,
            Frame::ForwardAck { .. } => FrameKind::ForwardAck,
            Frame::KeepAlive => FrameKind::KeepAlive,
            Frame::Retained(_) => FrameKind::Retained,
            Frame::RetainedDigest { .. } => FrameKind::RetainedDigest,
            Frame::RetainedSnapshot(_) => FrameKind::RetainedSnapshot,
            Frame::Forget { .. } => FrameKind::Forget,
            Frame::Claim(_) => FrameKind::Claim,
            Frame::ClaimSnapshot(_) => FrameKind::ClaimSnapshot,
            Frame::SessionTransfer(_) => FrameKind::SessionTransfer,
            Frame::SessionTaken { .. } => FrameKind::SessionTaken,
            Frame::SessionRelay(_) => FrameKind::SessionRelay,
            Frame::SessionRelayAck { .. } => FrameKind::SessionRelayAck,
            Frame::SessionRouted { .. } => FrameKind::SessionRouted,
            Frame::SessionRelayDone { .. } => FrameKind::SessionRelayDone,
            Frame::Fence { .. } => FrameKind::Fence,
            Frame::FenceEcho { .. } => FrameKind::FenceEcho,
            Frame::ClaimRequest { .. } => FrameKind::ClaimRequest,
            Frame::ClaimAnswer { .. } => FrameKind::ClaimAnswer,
            Frame::Revoke { .. } => FrameKind::Revoke,
            Frame::Revoked { .. } => FrameKind::Revoked,
            Frame::ScopedRoutes { .. } => FrameKind::ScopedRoutes,
            Frame::SessionRelayCaughtUp { .. } => FrameKind::SessionRelayCaughtUp,
        }
    }

    /// The kind's name (`route-delta`), for logs.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

/// The kinds of [`Frame`], with the type byte each has on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Type 1: [`Frame::Hello`].
    Hello = 1,
    /// Type 2: [`Frame::RouteDelta`].
    RouteDelta = 2,
    /// Type 3: [`Frame::RouteAck`].
    RouteAck = 3,
    /// Type 4: [`Frame::Digest`].
    Digest = 4,
    /// Type 5: [`Frame::SnapshotRequest`].
    SnapshotRequest = 5,
    /// Type 6: [`Frame::SnapshotChunk`].
    SnapshotChunk = 6,
    /// Type 7: [`Frame::Forward`].
    Forward = 7,
    /// Type 8: [`Frame::ForwardAck`].
    ForwardAck = 8,
    /// Type 9: [`Frame::KeepAlive`].
    KeepAlive = 9,
    /// Type 10: [`Frame::Retained`].
    Retained = 10,
    /// Type 11: [`Frame::RetainedDigest`].
    RetainedDigest = 11,
    /// Type 12: [`Frame::RetainedSnapshot`].
    RetainedSnapshot = 12,
    /// Type 13: [`Frame::Forget`].
    Forget = 13,
    /// Type 14: [`Frame::Claim`].
    Claim = 14,
    /// Type 15: [`Frame::ClaimSnapshot`].
    ClaimSnapshot = 15,
    /// Type 16: [`Frame::SessionTransfer`].
    SessionTransfer = 16,
    /// Type 17: [`Frame::SessionTaken`].
    SessionTaken = 17,
    /// Type 18: [`Frame::SessionRelay`].
    SessionRelay = 18,
    /// Type 19: [`Frame::SessionRelayAck`].
    SessionRelayAck = 19,
    /// Type 20: [`Frame::SessionRouted`].
    SessionRouted = 20,
    /// Type 21: [`Frame::SessionRelayDone`].
    SessionRelayDone = 21,
    /// Type 22: [`Frame::Fence`].
    Fence = 22,
    /// Type 23: [`Frame::FenceEcho`].
    FenceEcho = 23,
    /// Type 24: [`Frame::ClaimRequest`].
    ClaimRequest = 24,
    /// Type 25: [`Frame::ClaimAnswer`].
    ClaimAnswer = 25,
    /// Type 26: [`Frame::Revoke`].
    Revoke = 26,
    /// Type 27: [`Frame::Revoked`].
    Revoked = 27,
    /// Type 28: [`Frame::ScopedRoutes`].
    ScopedRoutes = 28,
    /// Type 29: [`Frame::SessionRelayCaughtUp`].
    SessionRelayCaughtUp = 29,
}

impl FrameKind {
    /// Every kind, in the order of their type bytes.
    pub const ALL: [FrameKind; 29] = [
        FrameKind::Hello,
        FrameKind::RouteDelta,
        FrameKind::RouteAck,
        FrameKind::Digest,
        FrameKind::SnapshotRequest,
        FrameKind::SnapshotChunk,
        FrameKind::Forward,
        FrameKind::ForwardAck,
        FrameKind::KeepAlive,
        FrameKind::Retained,
        FrameKind::RetainedDigest,
        FrameKind::RetainedSnapshot,
        FrameKind::Forget,
        FrameKind::Claim,
        FrameKind::ClaimSnapshot,
        FrameKind::SessionTransfer,
        FrameKind::SessionTaken,
        FrameKind::SessionRelay,
        FrameKind::SessionRelayAck,
        FrameKind::SessionRouted,
        FrameKind::SessionRelayDone,
        FrameKind::Fence,
        FrameKind::FenceEcho,
        FrameKind::ClaimRequest,
        FrameKind::ClaimAnswer,
        FrameKind::Revoke,
        FrameKind::Revoked,
        FrameKind::ScopedRoutes,
        FrameKind::SessionRelayCaughtUp,
    ];

    /// The kind whose type byte this is.
    pub fn from_byte(byte: u8) -> Option<Self> {
        Self::ALL.get(usize::from(byte).checked_sub(1)?).copied()
    }

    /// The type byte on the wire.
    pub fn byte(self) -> u8 {
        self as u8
    }

    /// Its name in logs and drawings: `hello`, `route-delta`, ...
    pub fn name(self) -> &'static str {
        match self {
            FrameKind::Hello => "hello",
            FrameKind::RouteDelta => "route-delta",
            FrameKind::RouteAck => "route-ack",
            FrameKind::Digest => "digest",
            FrameKind::SnapshotRequest => "snapshot-request",
            FrameKind::SnapshotChunk => "snapshot-chunk",
            FrameKind::Forward => "forward",
            FrameKind::ForwardAck => "forward-ack",
            FrameKind::KeepAlive => "keep-alive",
            FrameKind::Retained => "retained",
            FrameKind::RetainedDigest => "retained-digest",
            FrameKind::RetainedSnapshot => "retained-snapshot",
            FrameKind::Forget => "forget",
            FrameKind::Claim => "claim",
            FrameKind::ClaimSnapshot => "claim-snapshot",
            FrameKind::SessionTransfer => "session-transfer",
            FrameKind::SessionTaken => "session-taken",
            FrameKind::SessionRelay => "session-relay",
            FrameKind::SessionRelayAck => "session-relay-ack",
            FrameKind::SessionRouted => "session-routed",
            FrameKind::SessionRelayDone => "session-relay-done",
            FrameKind::Fence => "fence",
            FrameKind::FenceEcho => "fence-echo",
            FrameKind::ClaimRequest => "claim-request",
            FrameKind::ClaimAnswer => "claim-answer",
            FrameKind::Revoke => "revoke",
            FrameKind::Revoked => "revoked",
            FrameKind::ScopedRoutes => "scoped-routes",
            FrameKind::SessionRelayCaughtUp => "session-relay-caught-up",
        }
    }

    /// Whether a node sends this kind to every peer at once, so that a transport may carry it
    /// by gossip (relayed, its author authenticated by the transport): route deltas, digests
    /// and forget announcements. Every other kind travels on the link session between its
    /// sender and its receiver only, and a transport refuses it from gossip.
    pub fn is_broadcast(self) -> bool {
        matches!(
            self,
            FrameKind::RouteDelta | FrameKind::Digest | FrameKind::Forget
        )
    }
}
