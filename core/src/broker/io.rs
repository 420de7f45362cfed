//! What goes into the broker and what comes out of it.

use bytes::Bytes;

use crate::codec::{ProtocolVersion, ReasonCode};
use crate::link::Frame;
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
    /// A frame from a peer node, decoded with [`crate::link::decode`].
    PeerFrame {
        /// The node that sent it.
        peer: NodeId,
        /// The decoded frame.
        frame: Box<Frame>,
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
/// Order matters: a `Persist` must be durable before any `Send` that follows it is written,
/// because that `Send` may acknowledge what was persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// [`crate::Broker::restore`] after a restart. Keys and values are opaque to the shell.
    Persist {
        /// The record's key.
        key: Bytes,
        /// The record's new value; `None` deletes the record.
        value: Option<Bytes>,
    },
    /// Something worth logging, counting or reacting to.
    Event(Event),
    /// Send this frame to one peer node (cluster mode), on its ordered link.
    ToPeer {
        /// The node to send it to.
        peer: NodeId,
        /// The frame; [`crate::link::encode`] turns it into bytes.
        frame: Frame,
    },
    /// Send this frame to every peer node of the mesh (route deltas, digests and forget
    /// announcements: the kinds [`crate::link::FrameKind::is_broadcast`] names; gossip is
    /// fine), not to this node's leaves ([`crate::Broker::add_leaf`]): they get their own
    /// frames through [`Output::ToPeer`].
    Broadcast {
        /// The frame; [`crate::link::encode`] turns it into bytes.
        frame: Frame,
    },
    /// End the link session with this peer: it went past a bound ([`Event::PeerFault`] says
    /// which). Feed [`Input::PeerDown`] once it has ended, as for any other session.
    CutPeer {
        /// The node whose session to end.
        peer: NodeId,
    },
}

/// Keep, of the forward acknowledgements among `outputs` (taken in order from
/// [`crate::Broker::poll_output`]), one per peer and origin: the highest, where the last of
/// them stood.
///
/// [`Frame::ForwardAck`] is cumulative, so the peer learns the same from one frame as from
/// all of them. Each acknowledgement kept is at or after every one it stands for, so it still
/// follows the records it depends on. A shell that takes several inputs' outputs before it
/// writes to its peers saves a frame (and often a system call) per forward received.
pub fn coalesce_forward_acks(outputs: &mut Vec<Output>) {
    /// An acknowledgement's peer and origin.
    fn ack(out: &Output) -> Option<(&NodeId, &crate::routes::Owner, u64)> {
        match out {
            Output::ToPeer {
                peer,
                frame: Frame::ForwardAck { origin, seq },
            } => Some((peer, origin, *seq)),
            _ => None,
        }
    }
    // Per peer and origin: where its first and last acknowledgements are, and the highest.
    let mut kept: Vec<(usize, usize, u64)> = Vec::new();
    let mut acks = 0;
    for (i, out) in outputs.iter().enumerate() {
        let Some((peer, origin, seq)) = ack(out) else {
            continue;
        };
        acks += 1;
        let same = kept.iter_mut().find(|(first, ..)| {
            ack(&outputs[*first]).is_some_and(|(p, o, _)| p == peer && o == origin)
        });
        match same {
            Some(entry) => {
                entry.1 = i;
                entry.2 = entry.2.max(seq);
            }
            None => kept.push((i, i, seq)),
        }
    }
    if kept.len() == acks {
        return;
    }
    let mut i = 0;
    outputs.retain_mut(|out| {
        let at = i;
        i += 1;
        let Output::ToPeer {
            frame: Frame::ForwardAck { seq, .. },
            ..
        } = out
        else {
            return true;
        };
        match kept.iter().find(|(_, last, _)| *last == at) {
            Some((_, _, highest)) => {
                *seq = *highest;
                true
            }
            None => false,
        }
    });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::Owner;

    fn ack(peer: &str, origin: &str, incarnation: u64, seq: u64) -> Output {
        Output::ToPeer {
            peer: NodeId::new(peer).expect("a node id"),
            frame: Frame::ForwardAck {
                origin: Owner {
                    node: NodeId::new(origin).expect("a node id"),
                    incarnation,
                },
                seq,
            },
        }
    }

    fn record(key: &'static [u8]) -> Output {
        Output::Persist {
            key: Bytes::from_static(key),
            value: None,
        }
    }

    #[test]
    fn one_acknowledgement_per_peer_and_origin_the_highest_where_the_last_stood() {
        let send = Output::Send {
            conn: ConnId(1),
            data: Bytes::from_static(b"x"),
        };
        let mut outputs = vec![
            record(b"mark 5"),
            ack("b", "a", 1, 5),
            send.clone(),
            ack("c", "a", 1, 3),
            record(b"mark 7"),
            ack("b", "a", 1, 7),
            ack("b", "a", 2, 1),
            // A duplicate acknowledged again: lower than what came before it.
            ack("b", "a", 1, 6),
            Output::ToPeer {
                peer: NodeId::new("b").expect("a node id"),
                frame: Frame::KeepAlive,
            },
        ];
        coalesce_forward_acks(&mut outputs);
        assert_eq!(
            outputs,
            vec![
                record(b"mark 5"),
                send,
                ack("c", "a", 1, 3),
                record(b"mark 7"),
                ack("b", "a", 2, 1),
                ack("b", "a", 1, 7),
                Output::ToPeer {
                    peer: NodeId::new("b").expect("a node id"),
                    frame: Frame::KeepAlive,
                },
            ]
        );
    }

    #[test]
    fn outputs_without_repeated_acknowledgements_are_left_as_they_are() {
        let mut outputs = vec![ack("b", "a", 1, 5), record(b"k"), ack("c", "a", 1, 5)];
        let before = outputs.clone();
        coalesce_forward_acks(&mut outputs);
        assert_eq!(outputs, before);
    }
}
