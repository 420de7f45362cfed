//! What goes into the broker and what comes out of it.

use bytes::Bytes;

use crate::codec::{ProtocolVersion, ReasonCode};
use crate::link::{EncodedFrame, Frame};
use crate::routes::NodeId;

/// Milliseconds since the Unix epoch (or any epoch the shell keeps stable across restarts:
/// persisted expiry deadlines are absolute). Passed in by the shell; the core never reads a clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The timestamp `ms` milliseconds after the epoch.
    pub fn from_millis(ms: u64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the epoch.
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// `ms` milliseconds later (saturating).
    pub fn plus_ms(self, ms: u64) -> Self {
        Self(self.0.saturating_add(ms))
    }

    /// `secs` seconds later (saturating).
    pub fn plus_secs(self, secs: u32) -> Self {
        self.plus_ms(u64::from(secs) * 1000)
    }

    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
    pub fn millis_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// A network connection, named by the broker when the shell calls [`crate::Broker::accept`].
/// Ids are never reused, so input for a connection that is already gone is ignored safely.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

/// What the shell knows about a new connection.
#[derive(Clone, Debug, Default)]
pub struct ConnInfo {
    /// Peer address, for logs and events.
    pub remote_addr: Option<String>,
    /// Identity from a verified TLS client certificate, if the listener asked for one.
    pub tls_identity: Option<String>,
    /// A tighter packet-size limit for this listener than the broker-wide one.
    pub max_packet_size: Option<u32>,
}

/// One thing that happened, fed to [`crate::Broker::handle_input`].
#[derive(Debug)]
pub enum Input<'a> {
    /// Bytes read from a connection.
    Bytes {
        /// The connection they were read from.
        conn: ConnId,
        /// The bytes as read: any amount, whatever the packet boundaries.
        data: &'a [u8],
    },
    /// The connection was closed by the peer or the network.
    Closed {
        /// The connection that closed.
        conn: ConnId,
    },
    /// The deadline from [`crate::Broker::poll_timeout`] (or a later time) has come.
    Timeout,
    /// A decision for an authentication the authenticator answered with `Pending`.
    AuthDecision {
        /// The connection waiting for the decision.
        conn: ConnId,
        /// The decision; `Pending` keeps the connection waiting.
        outcome: super::AuthOutcome,
    },
    /// A link to a peer node is up (cluster mode).
    PeerUp {
        /// The peer node whose link came up.
        peer: NodeId,
    },
    /// A frame from a peer node, read with a [`crate::link::FrameReader`] or
    /// [`crate::link::decode_message`].
    PeerFrame {
        /// The node that sent it.
        peer: NodeId,
        /// The decoded frame.
        frame: Box<Frame>,
    },
    /// The frames of one read from a peer node's link, in order. Their acknowledgements of
    /// forwards received go out as one per origin (the highest: acknowledgements are
    /// cumulative), after everything else the frames caused.
    PeerFrames {
        /// The node that sent them.
        peer: NodeId,
        /// The decoded frames.
        frames: Vec<Frame>,
    },
    /// The link to a peer node is down.
    PeerDown {
        /// The peer node whose link went down.
        peer: NodeId,
    },
    /// The shell's backlog of bytes not yet written to this connection passed its mark: the
    /// client reads more slowly than it is sent to. QoS 0 deliveries to it are dropped, and
    /// counted in [`crate::broker::Stats::dropped_qos0_congested`], until [`Input::Drained`].
    /// QoS 1 and 2 deliveries are bounded by the in-flight window and go on as before. A shared
    /// subscription gives its messages to members that are not congested first.
    Congested {
        /// The congested connection.
        conn: ConnId,
    },
    /// The backlog of a [`Input::Congested`] connection fell back: QoS 0 deliveries resume.
    Drained {
        /// The connection whose backlog fell back.
        conn: ConnId,
    },
    /// The shell's queue of frames for this peer's link passed its mark: the link carries less
    /// than is sent on it. QoS 0 forwards to the peer are dropped, and counted in
    /// [`crate::broker::Stats::dropped_peer_congested`], until [`Input::PeerDrained`] or the
    /// link's next session. QoS 1 and 2 forwards wait in the peer's outbox as always.
    PeerCongested {
        /// The peer node whose link is congested.
        peer: NodeId,
    },
    /// The queue of a [`Input::PeerCongested`] link fell back: QoS 0 forwards resume.
    PeerDrained {
        /// The peer node whose link's queue fell back.
        peer: NodeId,
    },
}

/// One thing the shell must do, taken from [`crate::Broker::poll_output`] in order.
///
/// Order matters: a `Persist` of [`Durability::Now`] must be durable before any `Send` that
/// follows it is written, because that `Send` may acknowledge what was persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "every output is something the shell must do, in order"]
pub enum Output {
    /// Write these bytes to the connection.
    Send {
        /// The connection to write to.
        conn: ConnId,
        /// Encoded MQTT packets, to be written as they are.
        data: Bytes,
    },
    /// Close the connection after writing everything sent to it before.
    Close {
        /// The connection to close.
        conn: ConnId,
    },
    /// Store (or, with `value: None`, delete) a record; feed them all back to
    /// [`crate::Broker::restore`] after a restart. Keys and values are opaque to the shell:
    /// what it needs to know of a record, `durability` says.
    Persist {
        /// The record's key.
        key: Bytes,
        /// The record's new value; `None` deletes the record.
        value: Option<Bytes>,
        /// How soon it must be on the disk.
        durability: Durability,
    },
    /// Something worth logging, counting or reacting to.
    Event(Event),
    /// Send this frame to one peer node (cluster mode), on its ordered link, as it is.
    ToPeer {
        /// The node to send it to.
        peer: NodeId,
        /// The frame, encoded: its bytes are what goes on the link.
        frame: EncodedFrame,
    },
    /// Send this frame to every peer node of the mesh (route deltas, digests and forget
    /// announcements: the kinds [`crate::link::FrameKind::is_broadcast`] names; gossip is
    /// fine), not to this node's leaves ([`crate::Broker::add_leaf`]): they get their own
    /// frames through [`Output::ToPeer`].
    Broadcast {
        /// The frame, encoded: its bytes are what goes on the links.
        frame: EncodedFrame,
    },
    /// End the link session with this peer: it went past a bound ([`Event::PeerFault`] says
    /// which). Feed [`Input::PeerDown`] once it has ended, as for any other session.
    CutPeer {
        /// The node whose session to end.
        peer: NodeId,
    },
}

/// How soon an [`Output::Persist`] record must reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Before any output that follows it goes out: what follows may acknowledge it.
    Now,
    /// With the next record that is `Now` (or the shell's next periodic sync). Losing it in a
    /// crash costs only work done again or a duplicate MQTT allows, never a message lost and
    /// never a QoS 2 message delivered twice: the deletion of a forward its peer acknowledged
    /// (after a crash it is sent again and the peer drops it as a duplicate), of a duplicate
    /// mark the inbox let go of, or a duplicate mark that guards a QoS 0 or 1 message only. A
    /// shell that writes records in order to one log (a journal) may skip waiting for the
    /// disk for a batch made only of these; the next batch it waits for takes them along.
    WithNext,
}

/// Why a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisconnectCause {
    /// The client sent DISCONNECT with this reason.
    ByClient(ReasonCode),
    /// The network connection closed without a DISCONNECT.
    ConnectionLost,
    /// The broker closed it, with this reason (sent to MQTT 5.0 clients).
    ByServer(ReasonCode),
}

impl DisconnectCause {
    /// Whether the will message is published for this disconnection.
    pub fn publishes_will(self) -> bool {
        !matches!(
            self,
            DisconnectCause::ByClient(ReasonCode::NORMAL_DISCONNECTION)
        )
    }
}

/// Notable happenings, for logs, metrics and the layers above the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// CONNECT accepted and CONNACK sent.
    ClientConnected {
        /// The client's connection.
        conn: ConnId,
        /// The session's client id (assigned by the broker if CONNECT had none).
        client_id: String,
        /// The user the session runs as: the authenticator's choice, or the CONNECT user name.
        username: Option<String>,
        /// The protocol version the client speaks.
        protocol: ProtocolVersion,
        /// Whether an existing session was resumed (CONNACK's Session Present).
        session_present: bool,
    },
    /// A CONNECT was refused with this reason (CONNACK sent where the protocol allows).
    ConnectRefused {
        /// The connection, which is closed.
        conn: ConnId,
        /// The CONNECT's client id; `None` for an empty one the broker may not assign (MQTT 3.1.1
        /// without a clean session).
        client_id: Option<String>,
        /// The reason CONNACK carried (MQTT 3.1.1 clients get the matching return code).
        reason: ReasonCode,
    },
    /// A connected client's connection ended.
    ClientDisconnected {
        /// The connection that ended.
        conn: ConnId,
        /// The session's client id.
        client_id: String,
        /// Who ended it, and why.
        cause: DisconnectCause,
    },
    /// A connection ended before CONNECT completed, or was closed for bad input before that.
    ConnectionClosed {
        /// The connection that closed.
        conn: ConnId,
        /// The reason code the connection was closed with (0x00 when the peer closed it).
        reason: ReasonCode,
        /// What happened, in words, for logs.
        detail: &'static str,
    },
    /// A session ended (expired, or was replaced by a clean start).
    SessionEnded {
        /// The client id of the session that ended.
        client_id: String,
    },
    /// A session was shipped to the node that took its client id over (cluster mode).
    SessionMoved {
        /// The session's client id.
        client_id: String,
        /// The node it went to.
        to: NodeId,
    },
    /// A session shipped from another node joined the one here (cluster mode).
    SessionArrived {
        /// The session's client id.
        client_id: String,
    },
    /// The first local subscriber to this filter pattern appeared (route set add).
    RouteAdded {
        /// The filter pattern (without a `$share/{group}/` prefix).
        filter: String,
    },
    /// The last local subscriber to this filter pattern left (route set remove).
    RouteRemoved {
        /// The filter pattern (without a `$share/{group}/` prefix).
        filter: String,
    },
    /// A frame from a peer was refused (reported the first time per peer and kind of fault;
    /// every refusal is counted in [`crate::broker::Stats`]).
    PeerFault {
        /// The peer that sent it.
        peer: NodeId,
        /// What was wrong with it.
        fault: crate::broker::PeerFault,
    },
    /// A node was forgotten: its routes withdrawn, what waited for it dropped.
    PeerForgotten {
        /// The node forgotten.
        peer: NodeId,
        /// Who decided.
        reason: crate::broker::ForgetReason,
        /// Filters of its route set withdrawn.
        routes: usize,
        /// Forwards that waited for it, dropped.
        dropped_messages: usize,
    },
}
