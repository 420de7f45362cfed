//! The link protocol between nodes: versioned, length-prefixed frames that carry the route
//! index and forwarded messages. Transport-agnostic: the daemon carries frames over libp2p
//! streams and gossip, the edge worker over a WebSocket, the simulator over virtual links.
//!
//! A frame is a 4-byte big-endian length (of what follows), a type byte and its body. Every
//! decoder refuses malformed input with a [`LinkError`], never a panic, and never allocates
//! more than the frame's own length.

mod codec;
mod inbox;
mod outbox;

use crate::codec::Publish;
use crate::retained::Stamp;
use crate::routes::{NodeId, Owner, RouteDelta, SnapshotChunk};

pub use codec::{LinkError, decode, encode, encoded_len};
pub use inbox::{Arrival, Inbox};
pub use outbox::{Outbox, OutboxFull, OutboxLimits};

/// The link protocol version spoken by this build; sent in [`Frame::Hello`].
pub const LINK_PROTOCOL_VERSION: u16 = 1;

/// Largest frame accepted by default (a snapshot chunk or a forwarded message).
pub const DEFAULT_MAX_FRAME_LEN: u32 = 16 * 1024 * 1024;

/// One owner's position, as announced in a [`Frame::Digest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DigestEntry {
    pub owner: Owner,
    pub version: u64,
    pub hash: u64,
}

/// A PUBLISH forwarded from the node where it was published (`origin`) to a node with a
/// matching subscriber. `seq` numbers QoS 1/2 forwards per (origin, destination) so that the
/// receiver drops duplicates; QoS 0 forwards carry 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forward {
    pub origin: Owner,
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
    pub topic: String,
    pub stamp: Stamp,
    pub message: Option<Publish>,
}

/// Everything nodes say to each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// First frame on a link, both ways.
    Hello {
        node: NodeId,
        incarnation: u64,
        protocol: u16,
        region: String,
    },
    RouteDelta(RouteDelta),
    /// The sender applied `owner`'s changes up to `version`.
    RouteAck {
        owner: Owner,
        version: u64,
    },
    /// Where the sender stands for each owner it knows (anti-entropy).
    Digest(Vec<DigestEntry>),
    /// Send me a snapshot of your route set.
    SnapshotRequest,
    SnapshotChunk(SnapshotChunk),
    Forward(Forward),
    /// Every forward from `origin` with a sequence number up to `seq` arrived.
    ForwardAck {
        origin: Owner,
        seq: u64,
    },
    KeepAlive,
    /// A retained write accepted by the sender (or one it learned that won).
    Retained(RetainedUpdate),
    /// The sender's retained state in short: if it differs from the receiver's, the receiver
    /// sends its whole state as [`Frame::RetainedSnapshot`] chunks.
    RetainedDigest {
        hash: u64,
        entries: u64,
    },
    /// Part of the sender's retained state, tombstones included.
    RetainedSnapshot(Vec<RetainedUpdate>),
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
    Hello = 1,
    RouteDelta = 2,
    RouteAck = 3,
    Digest = 4,
    SnapshotRequest = 5,
    SnapshotChunk = 6,
    Forward = 7,
    ForwardAck = 8,
    KeepAlive = 9,
    Retained = 10,
    RetainedDigest = 11,
    RetainedSnapshot = 12,
}

impl FrameKind {
    /// Every kind, in the order of their type bytes.
    pub const ALL: [FrameKind; 12] = [
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
        }
    }
}
