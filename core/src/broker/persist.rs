//! Records that make persistent sessions and retained messages survive a restart.
//!
//! The core decides what to store and emits it as [`Output::Persist`](super::Output::Persist);
//! the shell stores the opaque key/value bytes and feeds them all back to
//! [`Broker::restore`](super::Broker::restore). Keys start with a one-byte kind; client ids are
//! length-prefixed so no separator can be forged. Values start with a format version byte.
//!
//! | key | value |
//! |---|---|
//! | `S` cid | session: protocol, expiry, username, disconnect time, will |
//! | `U` cid filter | subscription options and identifier |
//! | `Q` cid seq(u64 BE) | a queued or in-flight outgoing QoS 1/2 message |
//! | `I` cid packet-id(u16 BE) | an incoming QoS 2 packet id waiting for PUBREL |
//! | `R` topic | a retained message |
//! | `O` peer seq(u64 BE) | a QoS 1/2 forward waiting in a peer's outbox (a link frame) |
//! | `M` origin incarnation(u64 BE) | the highest forward delivered from an origin incarnation |
//! | `T` topic | the stamp of a topic's last retained write (cluster mode), or its tombstone |
//! | `C` conn(u64 BE) | an open connection's negotiated state ([`Config::resumable_connections`](crate::Config::resumable_connections)) |
//! | `W` conn(u64 BE) | that connection holds part of a packet (no value but the format byte) |
//! | `A` conn(u64 BE) alias(u16 BE) | the topic a topic alias of that connection's client stands for |
//! | `L` node | a leaf of this node (cluster mode; no value but the format byte) |
//! | `K` cid | a clean session of an open connection as of the last checkpoint: the records above it would have (`S`, `U`, `Q`, `I`), in one value |
//! | `H` cid | the claim on a client id with the greatest stamp known here, or its tombstone (cluster mode) |
//! | `X` cid stamp | a session shipped to the node whose claim (stamp) took it over, until that node took it |
//! | `Y` cid stamp sender | a shipped session taken here (so that one sent again is taken once) |
//! | `V` cid | in a shipped session only: the messages it was delivered while relays to it could come (their identities), so that its next node delivers none of them again |
//! | `Z` cid stamp n(u64 BE) | a QoS 1/2 message relayed to the node a session moved to, until it acknowledged it |
//! | `N` | the first connection id not yet given out, reserved ahead so that ids are never reused across rebuilds (resumable connections) |

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::io::{Durability, Timestamp};
use super::message::{Delivery, Message};
use super::session::{InflightState, SubscriptionEntry, Will};
use crate::codec::{
    self, Packet, ProtocolVersion, Publish, PublishProperties, QoS, RetainHandling,
    SubscriptionOptions,
};
use crate::link::MessageId;
use crate::read::Fields;
use crate::retained::{Hlc, Stamp};
use crate::routes::{NodeId, Owner};

const FORMAT: u8 = 1;

/// A record that could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unreadable {kind} record: {detail}")]
pub struct RecordError {
    /// The kind of record (`session`, `queued message`, `key`, ...).
    pub kind: &'static str,
    /// What was wrong with it.
    pub detail: &'static str,
}

fn err(kind: &'static str, detail: &'static str) -> RecordError {
    RecordError { kind, detail }
}

/// A decoded record key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Key {
    Session {
        client_id: String,
    },
    Subscription {
        client_id: String,
        filter: String,
    },
    Queued {
        client_id: String,
        seq: u64,
    },
    Incoming {
        client_id: String,
        packet_id: u16,
    },
    Retained {
        topic: String,
    },
    Outbox {
        peer: NodeId,
        seq: u64,
    },
    InboxMark {
        origin: NodeId,
        incarnation: u64,
    },
    /// Where this node's replica of `node`'s route set stands (incarnation, version, hash).
    ReplicaPosition {
        node: NodeId,
    },
    /// One filter of this node's replica of `node`'s route set.
    ReplicaFilter {
        node: NodeId,
        filter: String,
    },
    /// The last-writer-wins stamp of a retained message (or of its deletion).
    RetainedStamp {
        topic: String,
    },
    /// A node forgotten here: its last incarnation, the next forward number for it, and when
    /// it was forgotten among the others (so the oldest are let go first after a restart).
    Forgotten {
        node: NodeId,
    },
    /// An open connection, kept so that it can be resumed.
    Connection {
        conn: u64,
    },
    /// An open connection holds part of a packet.
    PartialPacket {
        conn: u64,
    },
    /// Connection ids below this one may have been given out.
    ConnectionIds,
    /// A topic alias the client of an open connection set.
    TopicAlias {
        conn: u64,
        alias: u16,
    },
    /// A clean session's records, as of the last checkpoint.
    Checkpoint {
        client_id: String,
    },
    /// A node that is a leaf of this one.
    Leaf {
        node: NodeId,
    },
    /// The claim on a client id that stands here.
    Claim {
        client_id: String,
    },
    /// This node's own last claim on a client id that another node's claim replaced: what a
    /// session it ships (or passes on) there was held by.
    SupersededClaim {
        client_id: String,
    },
    /// A session shipped to the node whose claim took it over, by its shipment
    /// ([`crate::link::SessionTransfer::shipment`]).
    Transfer {
        client_id: String,
        shipment: Stamp,
    },
    /// A shipped session taken here.
    TransferTaken {
        client_id: String,
        shipment: Stamp,
        from: NodeId,
    },
    /// What a session that moved took (by the messages' identities) and, while it is
    /// here, the relays it waits for; also inside a shipped session.
    Seen {
        client_id: String,
    },
    /// A message relayed to the node a session moved to.
    Relay {
        client_id: String,
        claim: Stamp,
        n: u64,
    },
    /// A relay's subscriptions (the session's, kept while the new node's routes spread).
    RelaySlot {
        client_id: String,
        claim: Stamp,
    },
    /// A relay whose subscriptions went, kept while relays to this node may still bring it
    /// messages to pass on: where it goes, and the nodes that echoed its fence.
    RelayKept {
        client_id: String,
        claim: Stamp,
    },
    /// A message a session that moved took while others could still bring it again.
    Took {
        client_id: String,
        origin: Owner,
        seq: u64,
    },
}

fn put_stamp(k: &mut BytesMut, stamp: &Stamp) {
    k.put_u64(stamp.hlc.wall_ms);
    k.put_u32(stamp.hlc.logical);
    // Node ids are at most 255 bytes.
    k.put_u16(u16::try_from(stamp.node.as_str().len()).unwrap_or(u16::MAX));
    k.put_slice(stamp.node.as_str().as_bytes());
}

fn get_stamp(k: &mut &[u8]) -> Result<Stamp, RecordError> {
    let e = |d| err("key", d);
    if k.len() < 14 {
        return Err(e("truncated stamp"));
    }
    let hlc = Hlc {
        wall_ms: k.get_u64(),
        logical: k.get_u32(),
    };
    let n = usize::from(k.get_u16());
    if k.len() < n {
        return Err(e("truncated stamp"));
    }
    let node = std::str::from_utf8(&k[..n])
        .ok()
        .and_then(|s| NodeId::new(s).ok())
        .ok_or_else(|| e("bad node id in stamp"))?;
    k.advance(n);
    Ok(Stamp { hlc, node })
}

fn with_client(kind: u8, client_id: &str, extra: usize) -> BytesMut {
    let mut k = BytesMut::with_capacity(3 + client_id.len() + extra);
    k.put_u8(kind);
    // Client ids are bounded by Config::max_client_id_len, far below u16::MAX.
    k.put_u16(u16::try_from(client_id.len()).unwrap_or(u16::MAX));
    k.put_slice(client_id.as_bytes());
    k
}

fn with_number(kind: u8, n: u64) -> Bytes {
    let mut k = BytesMut::with_capacity(9);
    k.put_u8(kind);
    k.put_u64(n);
    k.freeze()
}

impl Key {
    pub fn encode(&self) -> Bytes {
        match self {
            Key::Session { client_id } => with_client(b'S', client_id, 0).freeze(),
            Key::Subscription { client_id, filter } => {
                let mut k = with_client(b'U', client_id, filter.len());
                k.put_slice(filter.as_bytes());
                k.freeze()
            }
            Key::Queued { client_id, seq } => {
                let mut k = with_client(b'Q', client_id, 8);
                k.put_u64(*seq);
                k.freeze()
            }
            Key::Incoming {
                client_id,
                packet_id,
            } => {
                let mut k = with_client(b'I', client_id, 2);
                k.put_u16(*packet_id);
                k.freeze()
            }
            Key::Outbox { peer, seq } => {
                let mut k = with_client(b'O', peer.as_str(), 8);
                k.put_u64(*seq);
                k.freeze()
            }
            Key::InboxMark {
                origin,
                incarnation,
            } => {
                let mut k = with_client(b'M', origin.as_str(), 8);
                k.put_u64(*incarnation);
                k.freeze()
            }
            Key::ReplicaPosition { node } => with_client(b'P', node.as_str(), 0).freeze(),
            Key::Forgotten { node } => with_client(b'G', node.as_str(), 0).freeze(),
            Key::Checkpoint { client_id } => with_client(b'K', client_id, 0).freeze(),
            Key::Leaf { node } => with_client(b'L', node.as_str(), 0).freeze(),
            Key::Claim { client_id } => with_client(b'H', client_id, 0).freeze(),
            Key::SupersededClaim { client_id } => with_client(b'E', client_id, 0).freeze(),
            Key::Seen { client_id } => with_client(b'V', client_id, 0).freeze(),
            Key::Transfer {
                client_id,
                shipment,
            } => {
                let mut k = with_client(b'X', client_id, 16 + shipment.node.as_str().len());
                put_stamp(&mut k, shipment);
                k.freeze()
            }
            Key::Relay {
                client_id,
                claim,
                n,
            } => {
                let mut k = with_client(b'Z', client_id, 24 + claim.node.as_str().len());
                put_stamp(&mut k, claim);
                k.put_u64(*n);
                k.freeze()
            }
            Key::RelaySlot { client_id, claim } => {
                let mut k = with_client(b'B', client_id, 16 + claim.node.as_str().len());
                put_stamp(&mut k, claim);
                k.freeze()
            }
            Key::RelayKept { client_id, claim } => {
                let mut k = with_client(b'J', client_id, 16 + claim.node.as_str().len());
                put_stamp(&mut k, claim);
                k.freeze()
            }
            Key::Took {
                client_id,
                origin,
                seq,
            } => {
                let mut k = with_client(b'D', client_id, 16 + origin.node.as_str().len());
                k.put_u64(origin.incarnation);
                k.put_u64(*seq);
                k.put_slice(origin.node.as_str().as_bytes());
                k.freeze()
            }
            Key::TransferTaken {
                client_id,
                shipment,
                from,
            } => {
                let mut k = with_client(b'Y', client_id, 16 + shipment.node.as_str().len());
                put_stamp(&mut k, shipment);
                k.put_slice(from.as_str().as_bytes());
                k.freeze()
            }
            Key::ReplicaFilter { node, filter } => {
                let mut k = with_client(b'F', node.as_str(), filter.len());
                k.put_slice(filter.as_bytes());
                k.freeze()
            }
            Key::Retained { topic } => {
                let mut k = BytesMut::with_capacity(1 + topic.len());
                k.put_u8(b'R');
                k.put_slice(topic.as_bytes());
                k.freeze()
            }
            Key::RetainedStamp { topic } => {
                let mut k = BytesMut::with_capacity(1 + topic.len());
                k.put_u8(b'T');
                k.put_slice(topic.as_bytes());
                k.freeze()
            }
            Key::Connection { conn } => with_number(b'C', *conn),
            Key::PartialPacket { conn } => with_number(b'W', *conn),
            Key::ConnectionIds => Bytes::from_static(b"N"),
            Key::TopicAlias { conn, alias } => {
                let mut k = BytesMut::from(&with_number(b'A', *conn)[..]);
                k.put_u16(*alias);
                k.freeze()
            }
        }
    }

    pub fn decode(mut k: &[u8]) -> Result<Key, RecordError> {
        let e = |d| err("key", d);
        let node = |s: &str| NodeId::new(s).map_err(|_| err("key", "bad node id"));
        if k.is_empty() {
            return Err(e("empty key"));
        }
        let kind = k.get_u8();
        if kind == b'N' && k.is_empty() {
            return Ok(Key::ConnectionIds);
        }
        if kind == b'A' {
            if k.len() != 10 {
                return Err(e("bad topic alias key"));
            }
            return Ok(Key::TopicAlias {
                conn: k.get_u64(),
                alias: k.get_u16(),
            });
        }
        if kind == b'C' || kind == b'W' {
            if k.len() != 8 {
                return Err(e("bad connection number"));
            }
            let conn = k.get_u64();
            return Ok(if kind == b'C' {
                Key::Connection { conn }
            } else {
                Key::PartialPacket { conn }
            });
        }
        if kind == b'R' || kind == b'T' {
            let topic = String::from_utf8(k.to_vec()).map_err(|_| e("topic is not UTF-8"))?;
            return Ok(if kind == b'R' {
                Key::Retained { topic }
            } else {
                Key::RetainedStamp { topic }
            });
        }
        if k.len() < 2 {
            return Err(e("truncated client id"));
        }
        let n = usize::from(k.get_u16());
        if k.len() < n {
            return Err(e("truncated client id"));
        }
        let client_id =
            String::from_utf8(k[..n].to_vec()).map_err(|_| e("client id is not UTF-8"))?;
        k.advance(n);
        Ok(match kind {
            b'S' if k.is_empty() => Key::Session { client_id },
            b'U' => Key::Subscription {
                client_id,
                filter: String::from_utf8(k.to_vec()).map_err(|_| e("filter is not UTF-8"))?,
            },
            b'Q' if k.len() == 8 => Key::Queued {
                client_id,
                seq: k.get_u64(),
            },
            b'I' if k.len() == 2 => Key::Incoming {
                client_id,
                packet_id: k.get_u16(),
            },
            b'O' if k.len() == 8 => Key::Outbox {
                peer: node(&client_id)?,
                seq: k.get_u64(),
            },
            b'M' if k.len() == 8 => Key::InboxMark {
                origin: node(&client_id)?,
                incarnation: k.get_u64(),
            },
            b'P' if k.is_empty() => Key::ReplicaPosition {
                node: node(&client_id)?,
            },
            b'G' if k.is_empty() => Key::Forgotten {
                node: node(&client_id)?,
            },
            b'K' if k.is_empty() => Key::Checkpoint { client_id },
            b'L' if k.is_empty() => Key::Leaf {
                node: node(&client_id)?,
            },
            b'H' if k.is_empty() => Key::Claim { client_id },
            b'E' if k.is_empty() => Key::SupersededClaim { client_id },
            b'V' if k.is_empty() => Key::Seen { client_id },
            b'X' => {
                let claim = get_stamp(&mut k)?;
                if !k.is_empty() {
                    return Err(e("bytes after the stamp"));
                }
                Key::Transfer {
                    client_id,
                    shipment: claim,
                }
            }
            b'D' => {
                if k.len() < 17 {
                    return Err(e("bad message identity"));
                }
                let incarnation = k.get_u64();
                let seq = k.get_u64();
                let node = node(std::str::from_utf8(k).map_err(|_| e("node is not UTF-8"))?)?;
                Key::Took {
                    client_id,
                    origin: Owner { node, incarnation },
                    seq,
                }
            }
            b'B' | b'J' => {
                let claim = get_stamp(&mut k)?;
                if !k.is_empty() {
                    return Err(e("bytes after the stamp"));
                }
                if kind == b'B' {
                    Key::RelaySlot { client_id, claim }
                } else {
                    Key::RelayKept { client_id, claim }
                }
            }
            b'Z' => {
                let claim = get_stamp(&mut k)?;
                if k.len() != 8 {
                    return Err(e("bad relay number"));
                }
                Key::Relay {
                    client_id,
                    claim,
                    n: k.get_u64(),
                }
            }
            b'Y' => {
                let claim = get_stamp(&mut k)?;
                let from = node(std::str::from_utf8(k).map_err(|_| e("node is not UTF-8"))?)?;
                Key::TransferTaken {
                    client_id,
                    shipment: claim,
                    from,
                }
            }
            b'F' => Key::ReplicaFilter {
                node: node(&client_id)?,
                filter: String::from_utf8(k.to_vec()).map_err(|_| e("filter is not UTF-8"))?,
            },
            _ => return Err(e("unknown key kind")),
        })
    }
}

/// Reads values with bounds checks; every failure is a [`RecordError`].
pub(crate) struct Reader<'a> {
    kind: &'static str,
    buf: &'a [u8],
}

impl<'a> Fields for Reader<'a> {
    type Buf = &'a [u8];
    type Error = RecordError;

    fn buf(&mut self) -> &mut &'a [u8] {
        &mut self.buf
    }

    fn fail(&self, detail: &'static str) -> RecordError {
        err(self.kind, detail)
    }
}

impl<'a> Reader<'a> {
    /// A reader of a value of `kind` that starts with the format byte.
    pub(crate) fn new(kind: &'static str, buf: &'a [u8]) -> Result<Self, RecordError> {
        let mut r = Self { kind, buf };
        if r.u8()? != FORMAT {
            return Err(err(kind, "unknown format version"));
        }
        Ok(r)
    }
    pub(crate) fn opt_string(&mut self) -> Result<Option<String>, RecordError> {
        Ok(if self.u8()? == 1 {
            Some(self.string()?)
        } else {
            None
        })
    }
    /// What is left of the value.
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.buf
    }
    fn qos(&mut self) -> Result<QoS, RecordError> {
        QoS::from_u8(self.u8()?).ok_or(err(self.kind, "bad QoS"))
    }
    fn message(&mut self) -> Result<Message, RecordError> {
        let expires_at = match self.u64()? {
            0 => None,
            ms => Some(Timestamp(ms)),
        };
        let mut frame = BytesMut::from(self.buf);
        self.buf = &[];
        match codec::decode(&mut frame, ProtocolVersion::V5, u32::MAX) {
            Ok(Some(Packet::Publish(p))) if frame.is_empty() => Ok(Message {
                topic: p.topic.into(),
                payload: p.payload,
                qos: p.qos,
                retain: p.retain,
                properties: p.properties.into(),
                expires_at,
                origin: None,
            }),
            _ => Err(err(self.kind, "bad message")),
        }
    }
}

pub(crate) fn put_string(v: &mut BytesMut, s: &str) {
    // Strings in records come from MQTT strings, at most 65,535 bytes.
    v.put_u16(u16::try_from(s.len()).unwrap_or(u16::MAX));
    v.put_slice(&s.as_bytes()[..s.len().min(usize::from(u16::MAX))]);
}

pub(crate) fn put_opt_string(v: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => {
            v.put_u8(1);
            put_string(v, s);
        }
        None => v.put_u8(0),
    }
}

/// Appends a stamp in a value: clock reading, then node id.
pub(crate) fn put_stamp_value(v: &mut BytesMut, stamp: &Stamp) {
    v.put_u64(stamp.hlc.wall_ms);
    v.put_u32(stamp.hlc.logical);
    put_string(v, stamp.node.as_str());
}

/// Appends the message as its expiry and an MQTT 5.0 PUBLISH frame (which carries every
/// property). Messages in the broker were decoded from valid packets, so they re-encode.
fn put_message(v: &mut BytesMut, m: &Message) {
    v.put_u64(m.expires_at.map_or(0, |t| t.0.max(1)));
    let publish = Packet::Publish(Publish {
        dup: false,
        qos: m.qos,
        retain: m.retain,
        topic: m.topic.to_string(),
        packet_id: (m.qos != QoS::AtMostOnce).then_some(1),
        payload: m.payload.clone(),
        properties: PublishProperties::clone(&m.properties),
    });
    let _ = codec::encode(&publish, ProtocolVersion::V5, v);
}

/// The persisted part of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionRecord {
    pub protocol: ProtocolVersion,
    pub expiry_secs: u32,
    pub username: Option<String>,
    /// `None` while connected (a crash then counts as a lost connection).
    pub disconnected_at: Option<Timestamp>,
    /// The connection's will (while connected) or the pending will and when it is due.
    pub will: Option<(Will, Option<Timestamp>)>,
}

impl SessionRecord {
    /// The record of a session as it stands.
    pub fn of(s: &super::session::Session) -> Self {
        Self {
            protocol: s.protocol,
            expiry_secs: s.expiry_secs,
            username: s.username.as_deref().map(str::to_owned),
            disconnected_at: s.disconnected_at,
            will: match (&s.will, &s.pending_will) {
                (Some(w), _) => Some((Will::clone(w), None)),
                (None, Some((w, due))) => Some((Will::clone(w), Some(*due))),
                (None, None) => None,
            },
        }
    }

    pub fn encode(&self) -> Bytes {
        let mut v = BytesMut::with_capacity(32);
        v.put_u8(FORMAT);
        v.put_u8(self.protocol.level());
        v.put_u32(self.expiry_secs);
        put_opt_string(&mut v, self.username.as_deref());
        v.put_u64(self.disconnected_at.map_or(0, |t| t.0.max(1)));
        match &self.will {
            None => v.put_u8(0),
            Some((will, due)) => {
                v.put_u8(1);
                v.put_u32(will.delay_secs);
                v.put_u64(due.map_or(0, |t| t.0.max(1)));
                put_message(&mut v, &will.message);
            }
        }
        v.freeze()
    }

    pub fn decode(value: &[u8]) -> Result<Self, RecordError> {
        let mut r = Reader::new("session", value)?;
        let protocol = match r.u8()? {
            4 => ProtocolVersion::V311,
            5 => ProtocolVersion::V5,
            _ => return Err(err("session", "bad protocol level")),
        };
        let expiry_secs = r.u32()?;
        let username = r.opt_string()?;
        let disconnected_at = match r.u64()? {
            0 => None,
            ms => Some(Timestamp(ms)),
        };
        let will = if r.u8()? == 1 {
            let delay_secs = r.u32()?;
            let due = match r.u64()? {
                0 => None,
                ms => Some(Timestamp(ms)),
            };
            Some((
                Will {
                    message: r.message()?,
                    delay_secs,
                },
                due,
            ))
        } else {
            None
        };
        Ok(Self {
            protocol,
            expiry_secs,
            username,
            disconnected_at,
            will,
        })
    }
}

/// What an open connection needs to go on in a broker rebuilt from storage: what CONNECT
/// negotiated and what the shell told about it. Its session, protocol and user are in the
/// session's records, the topic aliases its client set in records of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnRecord {
    pub client_id: String,
    pub remote_addr: Option<String>,
    pub tls_identity: Option<String>,
    /// The listener's packet-size limit ([`super::ConnInfo::max_packet_size`]).
    pub listener_max_packet: Option<u32>,
    pub keep_alive_secs: u16,
    pub client_max_packet: u32,
    pub send_window: u16,
    pub outbound_alias_maximum: u16,
    pub problem_information: bool,
    pub expiry_requested_zero: bool,
    pub auth_method: Option<String>,
}

impl ConnRecord {
    pub fn encode(&self) -> Bytes {
        let mut v = BytesMut::with_capacity(64 + self.client_id.len());
        v.put_u8(FORMAT);
        put_string(&mut v, &self.client_id);
        put_opt_string(&mut v, self.remote_addr.as_deref());
        put_opt_string(&mut v, self.tls_identity.as_deref());
        v.put_u32(self.listener_max_packet.unwrap_or(0));
        v.put_u16(self.keep_alive_secs);
        v.put_u32(self.client_max_packet);
        v.put_u16(self.send_window);
        v.put_u16(self.outbound_alias_maximum);
        v.put_u8(u8::from(self.problem_information) | u8::from(self.expiry_requested_zero) << 1);
        put_opt_string(&mut v, self.auth_method.as_deref());
        v.freeze()
    }

    pub fn decode(value: &[u8]) -> Result<Self, RecordError> {
        let mut r = Reader::new("connection", value)?;
        let client_id = r.string()?;
        let remote_addr = r.opt_string()?;
        let tls_identity = r.opt_string()?;
        let listener_max_packet = Some(r.u32()?).filter(|&m| m > 0);
        let keep_alive_secs = r.u16()?;
        let client_max_packet = r.u32()?;
        let send_window = r.u16()?;
        let outbound_alias_maximum = r.u16()?;
        let flags = r.u8()?;
        let auth_method = r.opt_string()?;
        if !r.buf.is_empty() {
            return Err(err("connection", "trailing bytes"));
        }
        Ok(Self {
            client_id,
            remote_addr,
            tls_identity,
            listener_max_packet,
            keep_alive_secs,
            client_max_packet,
            send_window,
            outbound_alias_maximum,
            problem_information: flags & 1 != 0,
            expiry_requested_zero: flags & 2 != 0,
            auth_method,
        })
    }
}

pub(crate) fn encode_subscription(entry: &SubscriptionEntry) -> Bytes {
    let mut v = BytesMut::with_capacity(7);
    v.put_u8(FORMAT);
    let o = entry.options;
    v.put_u8(
        o.qos as u8
            | u8::from(o.no_local) << 2
            | u8::from(o.retain_as_published) << 3
            | (o.retain_handling as u8) << 4,
    );
    v.put_u32(entry.subscription_id.unwrap_or(0));
    v.freeze()
}

pub(crate) fn decode_subscription(value: &[u8]) -> Result<SubscriptionEntry, RecordError> {
    let mut r = Reader::new("subscription", value)?;
    let b = r.u8()?;
    let options = SubscriptionOptions {
        qos: QoS::from_u8(b & 3).ok_or(err("subscription", "bad QoS"))?,
        no_local: b & 4 != 0,
        retain_as_published: b & 8 != 0,
        retain_handling: match (b >> 4) & 3 {
            0 => RetainHandling::OnSubscribe,
            1 => RetainHandling::OnNewSubscribe,
            _ => RetainHandling::Never,
        },
    };
    let subscription_id = match r.u32()? {
        0 => None,
        id => Some(id),
    };
    Ok(SubscriptionEntry {
        options,
        subscription_id,
    })
}

/// A queued (`packet_id: None`) or in-flight outgoing message.
#[derive(Debug, Clone)]
pub(crate) struct QueuedRecord {
    pub inflight: Option<(u16, InflightState)>,
    pub delivery: Delivery,
    /// The message's identity in the deployment, when a cluster routed it.
    pub id: Option<MessageId>,
    /// Whether it is held back for its origin's order (then it has its identity).
    pub held: bool,
}

/// The state byte's flags: the message is held back for its origin's order (`HELD`), its
/// identity follows the subscription ids (`ID`, or `HELD`, which always has one).
const HELD: u8 = 0x80;
const ID: u8 = 0x40;

pub(crate) fn encode_queued(inflight: Option<(u16, InflightState)>, delivery: &Delivery) -> Bytes {
    encode_queued_with(inflight, delivery, None, false)
}

/// A queued message's record, with its identity in the deployment if it has one, held back
/// for its origin's order or not (only a message with its identity can be).
pub(crate) fn encode_queued_with(
    inflight: Option<(u16, InflightState)>,
    delivery: &Delivery,
    id: Option<&MessageId>,
    held: bool,
) -> Bytes {
    let mut v = BytesMut::with_capacity(64 + delivery.message.payload.len());
    v.put_u8(FORMAT);
    let flag = match id {
        Some(_) if held => HELD,
        Some(_) => ID,
        None => 0,
    };
    match inflight {
        None => v.put_u8(flag),
        Some((_, InflightState::AwaitAck)) => v.put_u8(1 | flag),
        Some((_, InflightState::AwaitComp)) => v.put_u8(2 | flag),
    }
    v.put_u16(inflight.map_or(0, |(id, _)| id));
    v.put_u8(delivery.qos as u8);
    v.put_u8(u8::from(delivery.retain));
    put_opt_string(&mut v, delivery.shared().map(|s| &**s));
    // At most one identifier per subscription, and subscriptions per client are bounded.
    let ids = delivery.subscription_ids();
    v.put_u16(u16::try_from(ids.len()).unwrap_or(u16::MAX));
    for id in ids.iter().take(usize::from(u16::MAX)) {
        v.put_u32(*id);
    }
    if let Some((origin, seq)) = id {
        put_string(&mut v, origin.node.as_str());
        v.put_u64(origin.incarnation);
        v.put_u64(*seq);
    }
    put_message(&mut v, &delivery.message);
    v.freeze()
}

pub(crate) fn decode_queued(value: &[u8]) -> Result<QueuedRecord, RecordError> {
    let mut r = Reader::new("queued message", value)?;
    let state = r.u8()?;
    let (held, has_id) = (state & HELD != 0, state & (HELD | ID) != 0);
    let state = state & !(HELD | ID);
    let packet_id = r.u16()?;
    let inflight = match state {
        0 => None,
        1 => Some((packet_id, InflightState::AwaitAck)),
        2 => Some((packet_id, InflightState::AwaitComp)),
        _ => return Err(err("queued message", "bad state")),
    };
    if inflight.is_some() && packet_id == 0 {
        return Err(err("queued message", "packet id 0"));
    }
    let qos = r.qos()?;
    let retain = r.u8()? == 1;
    let shared = r.opt_string()?.map(Arc::from);
    let n = r.u16()?;
    let mut subscription_ids = Vec::with_capacity(usize::from(n).min(64));
    for _ in 0..n {
        subscription_ids.push(r.u32()?);
    }
    let id = if has_id {
        let node = r.node()?;
        let incarnation = r.u64()?;
        Some((Owner { node, incarnation }, r.u64()?))
    } else {
        None
    };
    let message = Arc::new(r.message()?);
    Ok(QueuedRecord {
        inflight,
        delivery: Delivery::new(message, qos, retain, subscription_ids, shared),
        id,
        held,
    })
}

pub(crate) fn encode_retained(m: &Message) -> Bytes {
    let mut v = BytesMut::with_capacity(32 + m.payload.len());
    v.put_u8(FORMAT);
    put_message(&mut v, m);
    v.freeze()
}

pub(crate) fn decode_retained(value: &[u8]) -> Result<Message, RecordError> {
    Reader::new("retained message", value)?.message()
}

/// The stamp of a retained write, and whether it was a delete.
pub(crate) fn encode_stamp(stamp: &crate::retained::Stamp, deleted: bool) -> Bytes {
    let node = stamp.node.as_str();
    let mut v = BytesMut::with_capacity(16 + node.len());
    v.put_u8(FORMAT);
    v.put_u64(stamp.hlc.wall_ms);
    v.put_u32(stamp.hlc.logical);
    v.put_u8(u8::from(deleted));
    v.put_slice(node.as_bytes());
    v.freeze()
}

pub(crate) fn decode_stamp(value: &[u8]) -> Result<(crate::retained::Stamp, bool), RecordError> {
    let bad = |d| err("retained stamp", d);
    if value.len() < 14 || value[0] != FORMAT {
        return Err(bad("truncated or unknown format"));
    }
    let mut v = &value[1..];
    let wall_ms = v.get_u64();
    let logical = v.get_u32();
    let deleted = match v.get_u8() {
        0 => false,
        1 => true,
        _ => return Err(bad("delete flag")),
    };
    let node = std::str::from_utf8(v)
        .ok()
        .and_then(|n| crate::routes::NodeId::new(n).ok())
        .ok_or(bad("node id"))?;
    Ok((
        crate::retained::Stamp {
            hlc: crate::retained::Hlc { wall_ms, logical },
            node,
        },
        deleted,
    ))
}

/// Records packed into one value: each key and value after its length.
pub(crate) fn pack(records: &[(Bytes, Bytes)]) -> Bytes {
    let size: usize = records.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
    let mut out = BytesMut::with_capacity(1 + size);
    out.put_u8(FORMAT);
    for (key, value) in records {
        // Keys and values are a session's records, far below u32::MAX bytes.
        out.put_u32(u32::try_from(key.len()).unwrap_or(u32::MAX));
        out.put_slice(key);
        out.put_u32(u32::try_from(value.len()).unwrap_or(u32::MAX));
        out.put_slice(value);
    }
    out.freeze()
}

/// The records of a value made by [`pack`].
pub(crate) fn unpack(value: &Bytes) -> Result<Vec<(Bytes, Bytes)>, RecordError> {
    let bad = |detail| err("checkpoint", detail);
    if value.first() != Some(&FORMAT) {
        return Err(bad("unknown format version"));
    }
    let mut rest = value.slice(1..);
    let mut records = Vec::new();
    let take = |rest: &mut Bytes| -> Result<Bytes, RecordError> {
        if rest.len() < 4 {
            return Err(bad("truncated"));
        }
        let n = rest.get_u32() as usize;
        if rest.len() < n {
            return Err(bad("truncated"));
        }
        Ok(rest.split_to(n))
    };
    while !rest.is_empty() {
        let key = take(&mut rest)?;
        let value = take(&mut rest)?;
        records.push((key, value));
    }
    Ok(records)
}

/// The flag byte of an empty record (incoming QoS 2 ids carry nothing but their key).
pub(crate) fn marker() -> Bytes {
    Bytes::from_static(&[FORMAT])
}

/// How soon a record the broker emits must reach the disk ([`Durability`]): with the next
/// one for the deletion of a forward its peer acknowledged (after a crash it is sent again
/// and the peer drops it as a duplicate), of a duplicate mark the inbox let go of, or for a
/// duplicate mark that only guards a QoS 0 or 1 message (after a crash, a forward its peer
/// had no acknowledgement for yet is delivered again: at least once, as QoS 1 promises), and
/// for what a session that moved took (it rides with the record of the message it took, or
/// of the acknowledgement that sends it on); before what follows for every other record. Read from the key's kind byte, which the
/// encoder above writes first.
pub(super) fn durability(key: &[u8], value: Option<&Bytes>) -> Durability {
    const OUTBOX: u8 = b'O';
    const INBOX_MARK: u8 = b'M';
    const TOOK: u8 = b'D';
    let lazy = match (key.first(), value) {
        (Some(&(OUTBOX | INBOX_MARK)), None) | (Some(&TOOK), _) => true,
        (Some(&INBOX_MARK), Some(mark)) => {
            InboxMark::decode(mark).is_some_and(|m| m.qos != QoS::ExactlyOnce)
        }
        _ => false,
    };
    if lazy {
        Durability::WithNext
    } else {
        Durability::Now
    }
}

/// The value of a [`Key::InboxMark`]: the highest sequence delivered from an origin
/// incarnation, and the QoS of that message (what a duplicate of it after a crash would
/// break).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InboxMark {
    pub seq: u64,
    pub qos: QoS,
}

impl InboxMark {
    pub fn encode(self) -> Bytes {
        let mut v = BytesMut::with_capacity(9);
        v.put_u64(self.seq);
        v.put_u8(self.qos as u8);
        v.freeze()
    }

    /// A mark of the sequence alone counts as guarding a QoS 2 message: kept durable.
    pub fn decode(value: &[u8]) -> Option<InboxMark> {
        let (seq, qos) = match value.len() {
            8 => (value, QoS::ExactlyOnce),
            9 => (&value[..8], QoS::from_u8(value[8])?),
            _ => return None,
        };
        Some(InboxMark {
            seq: u64::from_be_bytes(seq.try_into().ok()?),
            qos,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_deletions_of_acknowledged_forwards_and_old_marks_may_wait() {
        let outbox = Key::Outbox {
            peer: NodeId::new("hkg-2").unwrap(),
            seq: 7,
        }
        .encode();
        let mark = Key::InboxMark {
            origin: NodeId::new("hkg-2").unwrap(),
            incarnation: 3,
        }
        .encode();
        let queued = Key::Queued {
            client_id: "c".to_owned(),
            seq: 7,
        }
        .encode();
        let value = Some(Bytes::from_static(b"v"));
        let mark_of = |seq, qos| Some(InboxMark { seq, qos }.encode());
        let record_may_wait =
            |key: &[u8], value: Option<&Bytes>| durability(key, value) == Durability::WithNext;
        assert!(record_may_wait(&outbox, None));
        assert!(record_may_wait(&mark, None));
        assert!(
            !record_may_wait(&outbox, value.as_ref()),
            "a forward to keep"
        );
        assert!(
            record_may_wait(&mark, mark_of(9, QoS::AtLeastOnce).as_ref()),
            "a QoS 1 message may come again after a crash"
        );
        assert!(
            !record_may_wait(&mark, mark_of(9, QoS::ExactlyOnce).as_ref()),
            "a QoS 2 message's mark is kept"
        );
        assert!(
            !record_may_wait(
                &mark,
                Some(Bytes::copy_from_slice(&9u64.to_be_bytes())).as_ref()
            ),
            "a mark of the sequence alone is kept"
        );
        assert!(
            !record_may_wait(&mark, value.as_ref()),
            "an unreadable mark is kept"
        );
        assert!(
            !record_may_wait(&queued, None),
            "a delivery done: QoS 2 exactly once"
        );
        assert!(!record_may_wait(b"", None));
    }

    #[test]
    fn an_inbox_mark_keeps_its_sequence_and_qos() {
        for qos in [QoS::AtLeastOnce, QoS::ExactlyOnce] {
            let mark = InboxMark { seq: 41, qos };
            assert_eq!(InboxMark::decode(&mark.encode()), Some(mark));
        }
        assert_eq!(
            InboxMark::decode(&41u64.to_be_bytes()),
            Some(InboxMark {
                seq: 41,
                qos: QoS::ExactlyOnce
            }),
            "the sequence alone"
        );
        let mut bad_qos = 41u64.to_be_bytes().to_vec();
        bad_qos.push(3);
        assert_eq!(InboxMark::decode(&bad_qos), None);
        assert_eq!(InboxMark::decode(b"short"), None);
    }

    fn stamp() -> Stamp {
        Stamp {
            hlc: Hlc {
                wall_ms: 1_700_000_000_000,
                logical: 3,
            },
            node: NodeId::new("hkg-2").expect("a node id"),
        }
    }

    #[test]
    fn every_key_kind_round_trips() {
        let keys = [
            Key::Session {
                client_id: "c".into(),
            },
            Key::Subscription {
                client_id: "c".into(),
                filter: "a/+/#".into(),
            },
            Key::Queued {
                client_id: "c".into(),
                seq: 7,
            },
            Key::Incoming {
                client_id: "c".into(),
                packet_id: 9,
            },
            Key::Retained {
                topic: "t/x".into(),
            },
            Key::Outbox {
                peer: NodeId::new("n1").unwrap(),
                seq: 3,
            },
            Key::InboxMark {
                origin: NodeId::new("n1").unwrap(),
                incarnation: 2,
            },
            Key::RetainedStamp {
                topic: "t/x".into(),
            },
            Key::ReplicaPosition {
                node: NodeId::new("n1").unwrap(),
            },
            Key::ReplicaFilter {
                node: NodeId::new("n1").unwrap(),
                filter: "geo/+/#".into(),
            },
            Key::Connection { conn: 42 },
            Key::PartialPacket { conn: u64::MAX },
            Key::ConnectionIds,
            Key::TopicAlias { conn: 3, alias: 64 },
            Key::Checkpoint {
                client_id: "c".into(),
            },
            Key::Leaf {
                node: NodeId::new("edge-eu").unwrap(),
            },
            Key::Claim {
                client_id: "dev".into(),
            },
            Key::SupersededClaim {
                client_id: "dev".into(),
            },
            Key::Transfer {
                client_id: "dev".into(),
                shipment: stamp(),
            },
            Key::RelaySlot {
                client_id: "dev".into(),
                claim: stamp(),
            },
            Key::RelayKept {
                client_id: "dev".into(),
                claim: stamp(),
            },
            Key::Took {
                client_id: "dev".into(),
                origin: Owner {
                    node: NodeId::new("fra-1").unwrap(),
                    incarnation: 3,
                },
                seq: 77,
            },
            Key::TransferTaken {
                client_id: "dev".into(),
                shipment: stamp(),
                from: NodeId::new("fra-1").unwrap(),
            },
            Key::Relay {
                client_id: "dev".into(),
                claim: stamp(),
                n: 12,
            },
            Key::Seen {
                client_id: "dev".into(),
            },
        ];
        for key in keys {
            let decoded = Key::decode(&key.encode()).expect("decodes");
            assert_eq!(decoded, key);
        }
    }

    #[test]
    fn packed_records_round_trip_and_truncation_is_an_error() {
        let records = vec![
            (Bytes::from_static(b"key"), Bytes::from_static(b"value")),
            (Bytes::from_static(b"k2"), Bytes::new()),
        ];
        let packed = pack(&records);
        assert_eq!(unpack(&packed).as_ref(), Ok(&records));
        // Cut anywhere, it is refused, or read as the records before the cut.
        for at in 0..packed.len() {
            if let Ok(read) = unpack(&packed.slice(..at)) {
                assert!(read.len() < records.len() && records.starts_with(&read));
            }
        }
    }

    #[test]
    fn a_queued_message_keeps_its_identity_held_back_or_not() {
        let message = Arc::new(Message {
            topic: "t/x".into(),
            payload: Bytes::from_static(b"7"),
            qos: QoS::ExactlyOnce,
            retain: false,
            properties: Default::default(),
            expires_at: None,
            origin: None,
        });
        let delivery = Delivery::new(message, QoS::AtLeastOnce, false, vec![3], None);
        let owner = Owner {
            node: NodeId::new("fra-1").unwrap(),
            incarnation: 4,
        };
        let id = (owner, 1 << 40);
        for (id, held) in [(None, false), (Some(&id), false), (Some(&id), true)] {
            let record = decode_queued(&encode_queued_with(None, &delivery, id, held)).unwrap();
            assert_eq!((record.id.as_ref(), record.held), (id, held));
            assert_eq!(record.delivery, delivery);
            assert_eq!(record.inflight, None);
        }
        // Held without an identity is not a state: kept ready to go.
        let record = decode_queued(&encode_queued_with(None, &delivery, None, true)).unwrap();
        assert!(!record.held);
        let inflight = Some((9, InflightState::AwaitComp));
        let record = decode_queued(&encode_queued_with(inflight, &delivery, Some(&id), false));
        assert_eq!(record.map(|r| (r.inflight, r.id)), Ok((inflight, Some(id))));
    }

    #[test]
    fn a_connection_record_round_trips() {
        let record = ConnRecord {
            client_id: "sensor-1".into(),
            remote_addr: Some("192.0.2.7".into()),
            tls_identity: None,
            listener_max_packet: Some(65_536),
            keep_alive_secs: 30,
            client_max_packet: 4096,
            send_window: 20,
            outbound_alias_maximum: 8,
            problem_information: false,
            expiry_requested_zero: true,
            auth_method: Some("SCRAM-SHA-256".into()),
        };
        let encoded = record.encode();
        assert_eq!(ConnRecord::decode(&encoded), Ok(record));
        for cut in 0..encoded.len() {
            assert!(ConnRecord::decode(&encoded[..cut]).is_err(), "cut at {cut}");
        }
    }
}
