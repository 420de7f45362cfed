//! The broker checker: one [`Broker`] driven through a sequence of operations the input picks,
//! as a shell would drive it, with invariants checked after every step.
//!
//! Operations: accept a connection; send it a well-formed packet built from arbitrary fields
//! (so that the fuzzer gets past CONNECT), several at once, one split in two, or raw bytes;
//! close it; let time pass, firing every timer on the way; answer a pending authentication;
//! acknowledge everything a client received; crash and restart from what was persisted;
//! report a connection congested or drained; and the shell's own calls (publish, disconnect a
//! client, shut down).
//!
//! Invariants, after every step:
//! - no `Send` or `Close` for a connection that is already closed (or was never accepted);
//!   `Input::Closed` for an open connection yields its `Close`;
//! - every `Send` is a whole number of valid packets in the connection's protocol version (the
//!   version of the CONNECT the client sent; a 3.1.1 CONNACK where none was readable), each a
//!   packet a server may send, no larger than the client's Maximum Packet Size; the first is
//!   CONNACK (or AUTH), nothing follows a refusing CONNACK or a DISCONNECT, no PUBLISH before a
//!   successful CONNACK, and topic aliases stay within the client's maximum and are known;
//! - flow control: a QoS 1/2 PUBLISH never reuses a packet id still in flight on its connection,
//!   and no more are in flight than the client's Receive Maximum and `max_inflight` allow (a
//!   QoS 1 message is in flight until the client's PUBACK, a QoS 2 one until its PUBCOMP or a
//!   failing PUBREC; the count starts afresh on each connection, MQTT 5.0 §4.9; an
//!   acknowledgement the client pipelined in the same read as the one that made the broker send
//!   the PUBLISH counts, conservatively, as already received);
//! - after `Input::Timeout` at `now`, `poll_timeout()` is `None` or later than `now`;
//! - `stats()` agrees with what the shell saw: connections = accepted − closed; sessions,
//!   subscriptions, in-flight and queued counts equal the sums over `clients()`; the connected
//!   sessions are exactly the open connections that got a successful CONNACK;
//! - a crash-restart from the persisted records reads every record (`unreadable` is empty),
//!   sends nothing, and brings back no session the broker did not have, with the subscriptions
//!   it had;
//! - with `twice` set, a second run of the same operations yields the same outputs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use bytes::{Bytes, BytesMut};
use meridian_core::broker::{
    AuthOutcome, AuthRequest, Authenticator, Authorizer, ClientRef, FilterAccess, Message,
};
use meridian_core::codec::{
    self, Ack, Auth, AuthProperties, Connect, ConnectProperties, Disconnect, DisconnectProperties,
    LastWill, Packet, ProtocolVersion, Publish, PublishProperties, QoS, ReasonCode,
    ReasonProperties, RetainHandling, Subscribe, SubscribeFilter, SubscribeProperties,
    SubscriptionOptions, Unsubscribe, WillProperties,
};
use meridian_core::topic::{Limits, TopicFilter, TopicName};
use meridian_core::{Broker, Config, ConnId, ConnInfo, Input, Output, Timestamp};

use crate::trace;

const START_MS: u64 = 1_700_000_000_000;

// ---------------------------------------------------------------------------------------------
// What the input chooses

/// Picks one of `choices` (the first when the input has run out).
fn pick<T: Copy>(u: &mut Unstructured<'_>, choices: &[T]) -> arbitrary::Result<T> {
    u.choose(choices).copied()
}

/// Broker limits, mostly tiny so that they are reached.
#[derive(Debug, Clone)]
pub struct Knobs(pub Config);

impl<'a> Arbitrary<'a> for Knobs {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let d = Config::default();
        Ok(Knobs(Config {
            max_packet_size: pick(u, &[d.max_packet_size, 64, 300])?,
            receive_maximum: pick(u, &[d.receive_maximum, 1, 2])?,
            max_inflight: pick(u, &[d.max_inflight, 1, 2])?,
            max_inflight_bytes: pick(u, &[d.max_inflight_bytes, 1, 300])?,
            max_queued_messages: pick(u, &[d.max_queued_messages, 0, 2])?,
            max_queued_bytes: pick(u, &[d.max_queued_bytes, 8, 100])?,
            max_subscriptions_per_client: pick(u, &[d.max_subscriptions_per_client, 1, 2])?,
            max_topic_len: pick(u, &[d.max_topic_len, 5])?,
            max_topic_levels: pick(u, &[d.max_topic_levels, 2])?,
            max_client_id_len: pick(u, &[d.max_client_id_len, 2])?,
            connect_timeout_ms: pick(u, &[d.connect_timeout_ms, 1])?,
            max_keep_alive_secs: pick(u, &[d.max_keep_alive_secs, 1, 60])?,
            max_session_expiry_secs: pick(u, &[d.max_session_expiry_secs, 0, 5])?,
            v3_session_expiry_secs: pick(u, &[d.v3_session_expiry_secs, 0, 5])?,
            max_retained_messages: pick(u, &[d.max_retained_messages, 0, 1])?,
            topic_alias_maximum: pick(u, &[d.topic_alias_maximum, 0, 1])?,
            outbound_topic_alias_maximum: pick(u, &[d.outbound_topic_alias_maximum, 0, 1])?,
            maximum_qos: pick(u, &[QoS::ExactlyOnce, QoS::AtLeastOnce, QoS::AtMostOnce])?,
            retain_available: pick(u, &[true, true, false])?,
            wildcard_subscription_available: pick(u, &[true, true, false])?,
            subscription_identifiers_available: pick(u, &[true, true, false])?,
            shared_subscription_available: pick(u, &[true, true, false])?,
            reason_strings: pick(u, &[true, false])?,
            // Not much shorter: a step of a day fires the timer at every interval.
            sys_interval_ms: pick(u, &[d.sys_interval_ms, 60_000, 3_600_000])?,
            seed: u64::from(u8::arbitrary(u)?),
            ..d
        }))
    }
}

const LEVELS: &[&str] = &["a", "b", "$s", "", "deny", "+", "#"];

/// A topic name or filter: small-alphabet levels (a `$share/g/` prefix sometimes) or any text.
#[derive(Debug, Clone)]
pub struct Topic(pub String);

/// Topics and filters common enough that subscriptions and publications meet.
const COMMON: &[&str] = &["a", "a/b", "a/+", "a/#", "#", "+", "+/b", "b"];

impl<'a> Arbitrary<'a> for Topic {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        match u.int_in_range(0..=15u8)? {
            0 => Ok(Topic(String::arbitrary(u)?)),
            1 => Ok(Topic(format!("$share/g/{}", Self::levels(u)?))),
            2..=8 => Ok(Topic(pick(u, COMMON)?.to_owned())),
            _ => Ok(Topic(Self::levels(u)?)),
        }
    }
}

impl Topic {
    fn levels(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
        let n = u.int_in_range(1..=3)?;
        let mut levels = Vec::with_capacity(n);
        for _ in 0..n {
            levels.push(pick(u, LEVELS)?);
        }
        Ok(levels.join("/"))
    }
}

/// Packet ids 1 ..= 4 (so that acknowledgements meet what the broker sent), rarely any.
#[derive(Debug, Clone, Copy)]
pub struct Pid(pub u16);

impl<'a> Arbitrary<'a> for Pid {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let b = u8::arbitrary(u)?;
        Ok(Pid(if b >= 250 {
            u16::from(b) << 8
        } else {
            1 + u16::from(b % 4)
        }))
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Q(pub QoS);

impl<'a> Arbitrary<'a> for Q {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Q(pick(
            u,
            &[QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce],
        )?))
    }
}

/// A reason code: mostly success, sometimes any byte.
#[derive(Debug, Clone, Copy)]
pub struct Reason(pub ReasonCode);

impl<'a> Arbitrary<'a> for Reason {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Reason(ReasonCode(pick(
            u,
            &[0x00, 0x00, 0x04, 0x10, 0x80, 0x87, 0x18, 0x19],
        )?)))
    }
}

/// Small payloads, and a 300-byte one to meet the packet-size limits.
#[derive(Debug, Clone)]
pub struct Payload(pub Bytes);

impl<'a> Arbitrary<'a> for Payload {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Payload(match u.int_in_range(0..=3u8)? {
            0 => Bytes::new(),
            1 => Bytes::from_static(&[0xFF, 0xFE]), // not UTF-8
            2 => Bytes::from(vec![b'x'; 300]),
            _ => Bytes::copy_from_slice(<&[u8]>::arbitrary(u)?),
        }))
    }
}

#[derive(Debug, Clone, Arbitrary)]
pub struct WillSpec {
    pub topic: Topic,
    pub payload: Payload,
    pub qos: Q,
    pub retain: bool,
    pub delay: Option<u8>,
    pub expiry: Option<u8>,
}

#[derive(Debug, Clone, Arbitrary)]
pub struct ConnectSpec {
    pub v5: bool,
    pub clean_start: bool,
    pub keep_alive: u8,
    /// 0..=2: "c0".."c2"; 3: empty (assigned); more: a long id.
    pub client: u8,
    pub will: Option<WillSpec>,
    /// 0: none; "u", "pending", "deny", "continue", "rename".
    pub username: u8,
    pub password: bool,
    pub session_expiry: Option<u8>,
    pub receive_maximum: Option<u8>,
    pub maximum_packet_size: Option<u8>,
    pub topic_alias_maximum: Option<u8>,
    pub request_response_information: Option<bool>,
    pub request_problem_information: Option<bool>,
    /// 0: none; 1: "m" (known to the authenticator); 2: "x".
    pub auth_method: u8,
    pub auth_data: Option<AuthData>,
}

/// Enhanced-authentication data the test authenticator understands.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum AuthData {
    Ok,
    Deny,
    Later,
    More,
}

impl AuthData {
    fn bytes(self) -> Bytes {
        Bytes::from_static(match self {
            AuthData::Ok => b"ok",
            AuthData::Deny => b"deny",
            AuthData::Later => b"later",
            AuthData::More => b"more",
        })
    }
}

#[derive(Debug, Clone, Arbitrary)]
pub struct PublishSpec {
    pub qos: Q,
    pub retain: bool,
    pub dup: bool,
    pub topic: Topic,
    /// Send an empty topic (with an alias, to use one the client set).
    pub empty_topic: bool,
    pub pid: Pid,
    pub payload: Payload,
    pub alias: Option<u8>,
    pub expiry: Option<u8>,
    pub utf8_payload: bool,
    pub response_topic: Option<Topic>,
    pub subscription_id: Option<u8>,
}

#[derive(Debug, Clone, Arbitrary)]
pub struct FilterSpec {
    pub filter: Topic,
    pub qos: Q,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub retain_handling: u8,
}

#[derive(Debug, Clone, Arbitrary)]
pub enum PacketSpec {
    Connect(ConnectSpec),
    Publish(PublishSpec),
    Subscribe {
        pid: Pid,
        filters: Vec<FilterSpec>,
        id: Option<u8>,
    },
    Unsubscribe {
        pid: Pid,
        filters: Vec<Topic>,
    },
    PubAck(Pid, Reason),
    PubRec(Pid, Reason),
    PubRel(Pid, Reason),
    PubComp(Pid, Reason),
    PingReq,
    Disconnect {
        reason: Reason,
        expiry: Option<u8>,
    },
    Auth {
        reason: Reason,
        method: bool,
        data: Option<AuthData>,
    },
    /// A packet only a server sends.
    ServerOnly(u8),
}

/// Raw bytes with a two-byte big-endian length in front (cut to what is left), so that seed
/// scenarios can be written by hand (see [`crate::seeds`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wire(pub Vec<u8>);

impl<'a> Arbitrary<'a> for Wire {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let len = usize::from(u.int_in_range(0..=u16::MAX)?).min(u.len());
        Ok(Wire(u.bytes(len)?.to_vec()))
    }
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum OutcomeSpec {
    Allow,
    AllowAs,
    Deny,
    Continue,
    Pending,
}

/// Time steps around the limits the broker uses (keep alive x1.5, connect timeout, expiry,
/// the one-minute retained sweep).
#[derive(Debug, Clone, Copy)]
pub struct Step(pub u64);

impl<'a> Arbitrary<'a> for Step {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Step(pick(
            u,
            &[
                0, 1, 999, 1_000, 1_500, 5_000, 10_000, 60_000, 90_000, 3_600_000, 86_400_000,
            ],
        )?))
    }
}

#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    Accept {
        small_limit: bool,
    },
    Send {
        conn: u8,
        packet: PacketSpec,
    },
    /// Several packets in one read.
    Batch {
        conn: u8,
        packets: Vec<PacketSpec>,
    },
    /// One packet in two reads.
    Split {
        conn: u8,
        packet: PacketSpec,
        at: u16,
    },
    Raw {
        conn: u8,
        bytes: Wire,
    },
    Close {
        conn: u8,
    },
    Advance(Step),
    /// `Input::Timeout` now, whether or not anything is due.
    Timeout,
    AuthDecision {
        conn: u8,
        outcome: OutcomeSpec,
    },
    /// The client acknowledges every PUBLISH and PUBREL it has received.
    AckAll {
        conn: u8,
    },
    Crash,
    ShellPublish {
        topic: Topic,
        qos: Q,
        retain: bool,
        payload: Payload,
    },
    DisconnectClient {
        client: u8,
    },
    Shutdown,
    /// The shell reports the connection's write backlog past its mark (`true`) or drained.
    Congest {
        conn: u8,
        congested: bool,
    },
}

#[derive(Debug, Clone, Arbitrary)]
pub struct Scenario {
    pub knobs: Knobs,
    pub twice: bool,
    pub ops: Vec<Op>,
}

// ---------------------------------------------------------------------------------------------
// The authenticator and authorizer the scenarios run against

/// Deterministic answers from what the client sends: username "pending" / "deny" / "continue"
/// / "rename"; method "m" with data "ok" / "deny" / "later" / anything else (continue);
/// other methods are refused.
#[derive(Debug, Default, Clone, Copy)]
pub struct TestAuth;

impl Authenticator for TestAuth {
    fn authenticate(&mut self, r: &AuthRequest<'_>) -> AuthOutcome {
        match r.method {
            Some("m") => match r.data {
                Some(b"ok") => AuthOutcome::Allow { username: None },
                Some(b"deny") => AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED),
                Some(b"later") => AuthOutcome::Pending,
                _ => AuthOutcome::Continue(Bytes::from_static(b"challenge")),
            },
            Some(_) => AuthOutcome::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD),
            None => match r.username {
                Some("pending") => AuthOutcome::Pending,
                Some("deny") => AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD),
                Some("continue") => AuthOutcome::Continue(Bytes::from_static(b"challenge")),
                Some("rename") => AuthOutcome::Allow {
                    username: Some("renamed".into()),
                },
                _ => AuthOutcome::Allow { username: None },
            },
        }
    }
}

/// Publishing to `deny...` is refused. Receiving a topic whose last level is `b` is refused:
/// a filter ending in `b` is denied, one ending in a wildcard is filtered (its messages
/// checked one by one), and none of these may ever reach a client.
impl Authorizer for TestAuth {
    fn may_publish(&self, _: &ClientRef<'_>, topic: &str) -> bool {
        !topic.starts_with("deny")
    }

    fn may_subscribe(&self, _: &ClientRef<'_>, filter: &TopicFilter) -> FilterAccess {
        match filter.pattern().rsplit('/').next() {
            Some("b") => FilterAccess::Denied,
            Some("+" | "#") => FilterAccess::Filtered,
            _ => FilterAccess::Allowed,
        }
    }

    fn may_receive(&self, _: &ClientRef<'_>, topic: &str) -> bool {
        !withheld(topic)
    }
}

/// A topic [`TestAuth`] keeps from every subscriber.
fn withheld(topic: &str) -> bool {
    topic.rsplit('/').next() == Some("b")
}

fn new_broker(config: &Config, now: u64) -> Broker {
    Broker::with_auth(
        config.clone(),
        Timestamp(now),
        Box::new(TestAuth),
        Box::new(TestAuth),
    )
}

// ---------------------------------------------------------------------------------------------
// Building packets from specs

fn small(v: u8, choices: &[u32]) -> u32 {
    choices[usize::from(v) % choices.len()]
}

fn build_connect(c: &ConnectSpec) -> Connect {
    let v5 = c.v5;
    let client_id = match c.client {
        0..=2 => format!("c{}", c.client),
        3 => String::new(),
        _ => "long-client-id".to_owned(),
    };
    let username = match c.username % 6 {
        0 => None,
        1 => Some("u"),
        2 => Some("pending"),
        3 => Some("deny"),
        4 => Some("continue"),
        _ => Some("rename"),
    };
    let will = c.will.as_ref().map(|w| LastWill {
        topic: w.topic.0.clone(),
        payload: w.payload.0.clone(),
        qos: w.qos.0,
        retain: w.retain,
        properties: if v5 {
            WillProperties {
                will_delay_interval: w.delay.map(|d| small(d, &[0, 1, 5, 100])),
                message_expiry_interval: w.expiry.map(|d| small(d, &[0, 1, 5])),
                ..WillProperties::default()
            }
        } else {
            WillProperties::default()
        },
    });
    let properties = if v5 {
        ConnectProperties {
            session_expiry_interval: c
                .session_expiry
                .map(|e| small(e, &[0, 1, 10, 3_600, u32::MAX])),
            receive_maximum: c.receive_maximum.map(|r| small(r, &[1, 2, 100]) as u16),
            maximum_packet_size: c
                .maximum_packet_size
                .map(|m| small(m, &[20, 64, 200, 100_000])),
            topic_alias_maximum: c.topic_alias_maximum.map(|t| small(t, &[0, 1, 2]) as u16),
            request_response_information: c.request_response_information,
            request_problem_information: c.request_problem_information,
            user_properties: Vec::new(),
            authentication_method: match c.auth_method % 3 {
                0 => None,
                1 => Some("m".to_owned()),
                _ => Some("x".to_owned()),
            },
            authentication_data: c.auth_data.map(AuthData::bytes),
        }
    } else {
        ConnectProperties::default()
    };
    Connect {
        protocol: if v5 {
            ProtocolVersion::V5
        } else {
            ProtocolVersion::V311
        },
        clean_start: c.clean_start,
        keep_alive: u16::from(c.keep_alive % 4),
        client_id,
        will,
        username: username.map(str::to_owned),
        // 3.1.1 allows a password only with a user name.
        password: (c.password && (v5 || username.is_some())).then(|| Bytes::from_static(b"pw")),
        properties,
    }
}

fn build(spec: &PacketSpec, version: ProtocolVersion) -> Packet {
    let v5 = version == ProtocolVersion::V5;
    let ack = |pid: &Pid, reason: &Reason| Ack {
        packet_id: pid.0,
        reason: if v5 { reason.0 } else { ReasonCode::SUCCESS },
        properties: ReasonProperties::default(),
    };
    match spec {
        PacketSpec::Connect(c) => Packet::Connect(build_connect(c)),
        PacketSpec::Publish(p) => {
            let alias = p.alias.filter(|_| v5).map(|a| u16::from(a % 4));
            let topic = if p.empty_topic && alias.is_some() {
                String::new()
            } else {
                p.topic.0.clone()
            };
            Packet::Publish(Publish {
                dup: p.dup && p.qos.0 != QoS::AtMostOnce,
                qos: p.qos.0,
                retain: p.retain,
                topic,
                packet_id: (p.qos.0 != QoS::AtMostOnce).then_some(p.pid.0),
                payload: p.payload.0.clone(),
                properties: if v5 {
                    PublishProperties {
                        payload_format_indicator: p.utf8_payload.then_some(1),
                        message_expiry_interval: p.expiry.map(|e| small(e, &[0, 1, 10])),
                        topic_alias: alias,
                        response_topic: p.response_topic.as_ref().map(|t| t.0.clone()),
                        subscription_identifiers: p
                            .subscription_id
                            .map(|i| vec![1 + u32::from(i)])
                            .unwrap_or_default(),
                        ..PublishProperties::default()
                    }
                } else {
                    PublishProperties::default()
                },
            })
        }
        PacketSpec::Subscribe { pid, filters, id } => Packet::Subscribe(Subscribe {
            packet_id: pid.0,
            filters: filters
                .iter()
                .take(4)
                .map(|f| SubscribeFilter {
                    filter: f.filter.0.clone(),
                    options: SubscriptionOptions {
                        qos: f.qos.0,
                        no_local: v5 && f.no_local,
                        retain_as_published: v5 && f.retain_as_published,
                        retain_handling: match f.retain_handling % 3 {
                            _ if !v5 => RetainHandling::OnSubscribe,
                            0 => RetainHandling::OnSubscribe,
                            1 => RetainHandling::OnNewSubscribe,
                            _ => RetainHandling::Never,
                        },
                    },
                })
                .collect(),
            properties: SubscribeProperties {
                subscription_identifier: id.filter(|_| v5).map(|i| 1 + u32::from(i % 3)),
                user_properties: Vec::new(),
            },
        }),
        PacketSpec::Unsubscribe { pid, filters } => Packet::Unsubscribe(Unsubscribe {
            packet_id: pid.0,
            filters: filters.iter().take(4).map(|f| f.0.clone()).collect(),
            user_properties: Vec::new(),
        }),
        PacketSpec::PubAck(pid, r) => Packet::PubAck(ack(pid, r)),
        PacketSpec::PubRec(pid, r) => Packet::PubRec(ack(pid, r)),
        PacketSpec::PubRel(pid, r) => Packet::PubRel(ack(pid, r)),
        PacketSpec::PubComp(pid, r) => Packet::PubComp(ack(pid, r)),
        PacketSpec::PingReq => Packet::PingReq,
        PacketSpec::Disconnect { reason, expiry } => Packet::Disconnect(Disconnect {
            reason: if v5 { reason.0 } else { ReasonCode::SUCCESS },
            properties: DisconnectProperties {
                session_expiry_interval: expiry.filter(|_| v5).map(|e| small(e, &[0, 1, 100])),
                ..DisconnectProperties::default()
            },
        }),
        PacketSpec::Auth {
            reason,
            method,
            data,
        } => Packet::Auth(Auth {
            reason: reason.0,
            properties: AuthProperties {
                authentication_method: method.then(|| "m".to_owned()),
                authentication_data: data.map(AuthData::bytes),
                ..AuthProperties::default()
            },
        }),
        PacketSpec::ServerOnly(k) => match k % 3 {
            0 => Packet::PingResp,
            1 => Packet::ConnAck(codec::ConnAck {
                session_present: false,
                reason: ReasonCode::SUCCESS,
                properties: Default::default(),
            }),
            _ => Packet::SubAck(codec::SubAck {
                packet_id: 1,
                reasons: vec![ReasonCode::SUCCESS],
                properties: ReasonProperties::default(),
            }),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// The shell: drives the broker and checks what comes out

/// What the shell knows about one connection of the current broker.
#[derive(Debug, Default)]
struct Client {
    /// Bytes sent to the broker and not yet read back as whole packets.
    sent: BytesMut,
    /// The stream stopped being readable (the broker closes the connection).
    unreadable: bool,
    /// The version of the client's CONNECT, once it could be read; `None` while unknown.
    version: Option<ProtocolVersion>,
    /// Whether the first packet (CONNECT or not) has been read from `sent`.
    first_read: bool,
    /// Limits from the client's CONNECT (MQTT 5.0).
    max_packet: u32,
    alias_max: u16,
    /// Receive Maximum from the client's CONNECT (65,535 when absent).
    receive_maximum: u16,
    /// QoS 1/2 PUBLISHes received on this connection and not yet completed, by packet id:
    /// `false` for QoS 1, `true` for QoS 2. They count against Receive Maximum.
    in_flight: BTreeMap<u16, bool>,
    /// Acknowledgements in the input being handled for ids not in flight when it was sent: a
    /// PUBLISH the broker sends while handling that input may be one of them (the client
    /// pipelined them blind), so one with such an id may already be acknowledged.
    blind_acks: Vec<(u16, bool)>,
    closed: bool,
    /// A CONNACK arrived: success or not.
    connack: Option<bool>,
    /// The server sent DISCONNECT; only `Close` may follow.
    disconnected: bool,
    /// Topic aliases the server set.
    aliases: HashMap<u16, String>,
    /// Acknowledgements owed: PUBACK/PUBREC for publishes, PUBCOMP for PUBRELs.
    owed: Vec<Packet>,
}

impl Client {
    fn output_version(&self) -> ProtocolVersion {
        self.version.unwrap_or(ProtocolVersion::V311)
    }

    /// The version to encode the client's next packet in.
    fn input_version(&self, packet: &PacketSpec) -> ProtocolVersion {
        match (self.version, packet) {
            (Some(v), _) => v,
            (None, PacketSpec::Connect(c)) if !c.v5 => ProtocolVersion::V311,
            (None, _) => ProtocolVersion::V5,
        }
    }

    /// Reads back the packets the client sent: its version and limits from the first (the
    /// CONNECT), and the acknowledgements that end in-flight messages.
    fn sent(&mut self, data: &[u8]) {
        if self.unreadable {
            return;
        }
        self.sent.extend_from_slice(data);
        loop {
            // Like the broker: MQTT 5.0 until the CONNECT says otherwise.
            let version = self.version.unwrap_or(ProtocolVersion::V5);
            let packet = match codec::decode(&mut self.sent, version, u32::MAX) {
                Ok(None) => return,
                Ok(Some(p)) => p,
                Err(_) => {
                    self.unreadable = true;
                    return;
                }
            };
            if !self.first_read {
                self.first_read = true;
                let Packet::Connect(c) = packet else {
                    self.unreadable = true;
                    return;
                };
                self.version = Some(c.protocol);
                if c.protocol == ProtocolVersion::V5 {
                    self.max_packet = c.properties.maximum_packet_size.unwrap_or(u32::MAX);
                    self.alias_max = c.properties.topic_alias_maximum.unwrap_or(0);
                    self.receive_maximum = c.properties.receive_maximum.unwrap_or(u16::MAX);
                }
                continue;
            }
            // (packet id, whether it ends a QoS 2 exchange)
            let done = match &packet {
                Packet::PubAck(a) => Some((a.packet_id, false)),
                // A failing PUBREC ends the exchange; a successful one waits for PUBCOMP.
                Packet::PubRec(a) if a.reason.is_error() => Some((a.packet_id, true)),
                Packet::PubComp(a) => Some((a.packet_id, true)),
                _ => None,
            };
            if let Some((id, qos2)) = done {
                if self.in_flight.get(&id) == Some(&qos2) {
                    self.in_flight.remove(&id);
                } else {
                    self.blind_acks.push((id, qos2));
                }
            }
        }
    }
}

struct Shell {
    config: Config,
    broker: Broker,
    now: u64,
    /// Connections of the current broker, by id (ids restart after a crash).
    clients: BTreeMap<ConnId, Client>,
    accepted: usize,
    closed: usize,
    store: BTreeMap<Bytes, Bytes>,
    /// Every output, when the run is to be compared with a second one.
    transcript: Option<Vec<Output>>,
}

impl Shell {
    fn new(config: Config, record: bool) -> Self {
        Self {
            broker: new_broker(&config, START_MS),
            config,
            now: START_MS,
            clients: BTreeMap::new(),
            accepted: 0,
            closed: 0,
            store: BTreeMap::new(),
            transcript: record.then(Vec::new),
        }
    }

    fn conn(&self, index: u8) -> Option<ConnId> {
        if self.clients.is_empty() {
            return None;
        }
        self.clients
            .keys()
            .nth(usize::from(index) % self.clients.len())
            .copied()
    }

    fn input(&mut self, input: Input<'_>) {
        trace!("  @{} {input:?}", self.now - START_MS);
        self.broker.handle_input(Timestamp(self.now), input);
        self.drain();
        for c in self.clients.values_mut() {
            c.blind_acks.clear();
        }
    }

    fn bytes(&mut self, conn: ConnId, data: &[u8]) {
        if let Some(c) = self.clients.get_mut(&conn) {
            c.sent(data);
        }
        self.input(Input::Bytes { conn, data });
    }

    fn drain(&mut self) {
        while let Some(output) = self.broker.poll_output() {
            trace!("    -> {output:?}");
            if let Some(t) = &mut self.transcript {
                t.push(output.clone());
            }
            match output {
                Output::Send { conn, data } => self.check_send(conn, &data),
                Output::Close { conn } => {
                    let c = self
                        .clients
                        .get_mut(&conn)
                        .unwrap_or_else(|| panic!("Close for {conn:?}, which was never accepted"));
                    assert!(!c.closed, "second Close for {conn:?}");
                    c.closed = true;
                    self.closed += 1;
                }
                Output::Persist { key, value, .. } => match value {
                    Some(v) => {
                        self.store.insert(key, v);
                    }
                    None => {
                        self.store.remove(&key);
                    }
                },
                Output::Event(_) => {}
                Output::ToPeer { .. } | Output::Broadcast { .. } | Output::CutPeer { .. } => {
                    panic!("peer frame from a broker that is not in a cluster: {output:?}")
                }
            }
        }
    }

    fn check_send(&mut self, conn: ConnId, data: &Bytes) {
        let max_inflight = self.config.max_inflight;
        let c = self
            .clients
            .get_mut(&conn)
            .unwrap_or_else(|| panic!("Send to {conn:?}, which was never accepted"));
        assert!(!c.closed, "Send to closed {conn:?}");
        assert!(!data.is_empty(), "empty Send to {conn:?}");
        let version = c.output_version();
        let mut buf = BytesMut::from(&data[..]);
        while !buf.is_empty() {
            let before = buf.len();
            let packet = match codec::decode(&mut buf, version, u32::MAX) {
                Ok(Some(p)) => p,
                Ok(None) => panic!("Send to {conn:?} ends in a partial {version:?} packet"),
                Err(e) => panic!("Send to {conn:?} is not valid {version:?}: {e}: {data:02x?}"),
            };
            let size = before - buf.len();
            assert!(
                size <= c.max_packet as usize,
                "{} of {size} bytes to {conn:?}, whose Maximum Packet Size is {}",
                packet.name(),
                c.max_packet
            );
            assert!(
                !c.disconnected,
                "{} after DISCONNECT to {conn:?}",
                packet.name()
            );
            assert!(
                c.connack != Some(false),
                "{} after a refusing CONNACK to {conn:?}",
                packet.name()
            );
            match &packet {
                Packet::ConnAck(ack) => {
                    assert!(c.connack.is_none(), "second CONNACK to {conn:?}");
                    c.connack = Some(!ack.reason.is_error());
                }
                Packet::Auth(_) => assert_eq!(version, ProtocolVersion::V5, "AUTH to 3.1.1"),
                _ if c.connack != Some(true) => {
                    panic!("{} to {conn:?} before a successful CONNACK", packet.name())
                }
                Packet::Disconnect(_) => {
                    assert_eq!(version, ProtocolVersion::V5, "DISCONNECT to 3.1.1");
                    c.disconnected = true;
                }
                Packet::Publish(p) => {
                    let mut topic = p.topic.clone();
                    if let Some(alias) = p.properties.topic_alias {
                        assert!(
                            alias >= 1 && alias <= c.alias_max,
                            "topic alias {alias} to {conn:?}, whose maximum is {}",
                            c.alias_max
                        );
                        if topic.is_empty() {
                            topic = c.aliases.get(&alias).cloned().unwrap_or_else(|| {
                                panic!("unknown topic alias {alias} to {conn:?}")
                            });
                        } else {
                            c.aliases.insert(alias, topic.clone());
                        }
                    }
                    assert!(
                        TopicName::new(topic.as_str()).is_ok(),
                        "PUBLISH with invalid topic {topic:?} to {conn:?}"
                    );
                    assert!(
                        !withheld(&topic),
                        "PUBLISH on {topic:?}, which the authorizer withholds, to {conn:?}"
                    );
                    assert!(
                        p.properties.subscription_identifiers.iter().all(|&i| i > 0),
                        "subscription identifier 0"
                    );
                    if let Some(id) = p.packet_id.filter(|_| p.qos != QoS::AtMostOnce) {
                        let qos2 = p.qos == QoS::ExactlyOnce;
                        assert!(
                            c.in_flight.insert(id, qos2).is_none(),
                            "packet id {id} to {conn:?} is still in flight"
                        );
                        if let Some(i) = c.blind_acks.iter().position(|&a| a == (id, qos2)) {
                            // Acknowledged later in the same input: count it as done.
                            c.blind_acks.swap_remove(i);
                            c.in_flight.remove(&id);
                        }
                        assert!(
                            c.in_flight.len() <= usize::from(c.receive_maximum.min(max_inflight)),
                            "{} messages in flight to {conn:?}, Receive Maximum {}, max_inflight {}",
                            c.in_flight.len(),
                            c.receive_maximum,
                            max_inflight
                        );
                    }
                    match (p.qos, p.packet_id) {
                        (QoS::AtMostOnce, _) => {}
                        (QoS::AtLeastOnce, Some(id)) => c.owed.push(Packet::PubAck(Ack::new(id))),
                        (QoS::ExactlyOnce, Some(id)) => c.owed.push(Packet::PubRec(Ack::new(id))),
                        _ => panic!("QoS > 0 PUBLISH without a packet id"),
                    }
                }
                Packet::PubRel(a) => c.owed.push(Packet::PubComp(Ack::new(a.packet_id))),
                Packet::PubAck(_)
                | Packet::PubRec(_)
                | Packet::PubComp(_)
                | Packet::SubAck(_)
                | Packet::UnsubAck(_)
                | Packet::PingResp => {}
                Packet::Connect(_)
                | Packet::Subscribe(_)
                | Packet::Unsubscribe(_)
                | Packet::PingReq => {
                    panic!("server sent {} to {conn:?}", packet.name())
                }
            }
        }
    }

    /// Bookkeeping that must hold whenever all outputs have been drained.
    fn check_state(&self) {
        let stats = self.broker.stats();
        assert_eq!(
            stats.connections,
            self.accepted - self.closed,
            "connections = accepted - closed"
        );
        let clients = self.broker.clients();
        assert_eq!(stats.sessions, clients.len(), "sessions");
        assert_eq!(
            stats.subscriptions,
            clients.iter().map(|c| c.subscriptions.len()).sum::<usize>(),
            "subscriptions"
        );
        assert_eq!(
            stats.inflight_messages,
            clients.iter().map(|c| c.inflight).sum::<usize>(),
            "in flight"
        );
        assert_eq!(
            stats.queued_messages,
            clients.iter().map(|c| c.queued).sum::<usize>(),
            "queued"
        );
        let mut ids = BTreeSet::new();
        for c in &clients {
            assert!(ids.insert(&c.client_id), "client id {} twice", c.client_id);
            assert_eq!(c.connected, c.conn.is_some());
        }
        let connected: BTreeSet<ConnId> = clients.iter().filter_map(|c| c.conn).collect();
        assert_eq!(
            connected.len(),
            clients.iter().filter(|c| c.connected).count(),
            "two sessions on one connection"
        );
        let open_and_accepted: BTreeSet<ConnId> = self
            .clients
            .iter()
            .filter(|(_, c)| !c.closed && c.connack == Some(true))
            .map(|(&id, _)| id)
            .collect();
        assert_eq!(
            connected, open_and_accepted,
            "connected sessions vs open connections that got a successful CONNACK"
        );
    }

    fn timeout(&mut self) {
        self.input(Input::Timeout);
        if let Some(at) = self.broker.poll_timeout() {
            assert!(
                at.0 > self.now,
                "after Timeout at {}, poll_timeout() is {}",
                self.now,
                at.0
            );
        }
    }

    /// Lets `ms` pass, handling every deadline on the way at its own time.
    fn advance(&mut self, ms: u64) {
        let target = self.now + ms;
        while let Some(at) = self.broker.poll_timeout() {
            if at.0 > target {
                break;
            }
            self.now = self.now.max(at.0);
            self.timeout();
            self.check_state();
        }
        self.now = target;
        self.timeout();
    }

    fn crash(&mut self) {
        let before: BTreeMap<String, Vec<(String, QoS)>> = self
            .broker
            .clients()
            .into_iter()
            .map(|c| {
                let mut subs = c.subscriptions;
                subs.sort();
                (c.client_id, subs)
            })
            .collect();
        let retained_before = self.broker.stats().retained_messages;
        self.broker = new_broker(&self.config, self.now);
        self.clients.clear();
        self.accepted = 0;
        self.closed = 0;
        let records: Vec<(Bytes, Bytes)> = self
            .store
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        trace!("  crash: restoring {} records", records.len());
        let report = self.broker.restore(Timestamp(self.now), records);
        assert!(
            report.unreadable.is_empty(),
            "unreadable records after restart: {:?}",
            report.unreadable
        );
        self.drain();
        let after = self.broker.clients();
        assert_eq!(after.len(), report.sessions);
        for c in &after {
            assert!(
                !c.connected,
                "restored session {} is connected",
                c.client_id
            );
            let Some(subs) = before.get(&c.client_id) else {
                panic!(
                    "restart brought back session {}, which had ended",
                    c.client_id
                );
            };
            let mut restored = c.subscriptions.clone();
            restored.sort();
            assert_eq!(
                &restored, subs,
                "subscriptions of {} after restart",
                c.client_id
            );
        }
        assert!(
            report.retained <= retained_before,
            "{} retained messages restored, {retained_before} before",
            report.retained
        );
    }

    fn step(&mut self, op: &Op) {
        trace!("{op:?}");
        match op {
            Op::Accept { small_limit } => {
                let info = ConnInfo {
                    max_packet_size: small_limit.then_some(100),
                    ..ConnInfo::default()
                };
                let conn = self.broker.accept(Timestamp(self.now), info);
                let fresh = self.clients.insert(
                    conn,
                    Client {
                        max_packet: u32::MAX,
                        receive_maximum: u16::MAX,
                        ..Client::default()
                    },
                );
                assert!(fresh.is_none(), "connection id {conn:?} reused");
                self.accepted += 1;
                self.drain();
            }
            Op::Send { conn, packet } => {
                if let Some(conn) = self.conn(*conn) {
                    let version = self.clients[&conn].input_version(packet);
                    if let Some(bytes) = encode(&build(packet, version), version) {
                        self.bytes(conn, &bytes);
                    }
                }
            }
            Op::Batch { conn, packets } => {
                if let Some(conn) = self.conn(*conn) {
                    let mut all = Vec::new();
                    for packet in packets.iter().take(8) {
                        let version = self.clients[&conn].input_version(packet);
                        if let Some(bytes) = encode(&build(packet, version), version) {
                            all.extend_from_slice(&bytes);
                        }
                    }
                    if !all.is_empty() {
                        self.bytes(conn, &all);
                    }
                }
            }
            Op::Split { conn, packet, at } => {
                if let Some(conn) = self.conn(*conn) {
                    let version = self.clients[&conn].input_version(packet);
                    if let Some(bytes) = encode(&build(packet, version), version) {
                        let (a, b) = bytes.split_at(usize::from(*at) % (bytes.len() + 1));
                        self.bytes(conn, a);
                        self.check_state();
                        self.bytes(conn, b);
                    }
                }
            }
            Op::Raw { conn, bytes } => {
                if let Some(conn) = self.conn(*conn) {
                    self.bytes(conn, &bytes.0);
                }
            }
            Op::Close { conn } => {
                if let Some(conn) = self.conn(*conn) {
                    let was_open = !self.clients[&conn].closed;
                    self.input(Input::Closed { conn });
                    assert!(
                        !was_open || self.clients[&conn].closed,
                        "Input::Closed for open {conn:?} gave no Close"
                    );
                }
            }
            Op::Advance(Step(ms)) => self.advance(*ms),
            Op::Timeout => self.timeout(),
            Op::AuthDecision { conn, outcome } => {
                if let Some(conn) = self.conn(*conn) {
                    let outcome = match outcome {
                        OutcomeSpec::Allow => AuthOutcome::Allow { username: None },
                        OutcomeSpec::AllowAs => AuthOutcome::Allow {
                            username: Some("decided".into()),
                        },
                        OutcomeSpec::Deny => AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED),
                        OutcomeSpec::Continue => {
                            AuthOutcome::Continue(Bytes::from_static(b"challenge"))
                        }
                        OutcomeSpec::Pending => AuthOutcome::Pending,
                    };
                    self.input(Input::AuthDecision { conn, outcome });
                }
            }
            Op::AckAll { conn } => {
                if let Some(conn) = self.conn(*conn) {
                    let c = self.clients.get_mut(&conn).expect("picked from clients");
                    let version = c.output_version();
                    let owed = std::mem::take(&mut c.owed);
                    let mut bytes = BytesMut::new();
                    for p in &owed {
                        codec::encode(p, version, &mut bytes).expect("acks encode");
                    }
                    if !bytes.is_empty() {
                        self.bytes(conn, &bytes);
                    }
                }
            }
            Op::Crash => self.crash(),
            Op::ShellPublish {
                topic,
                qos,
                retain,
                payload,
            } => {
                if TopicName::new(topic.0.as_str()).is_ok() {
                    let message = Message {
                        topic: Arc::from(topic.0.as_str()),
                        payload: payload.0.clone(),
                        qos: qos.0,
                        retain: *retain,
                        properties: Default::default(),
                        expires_at: None,
                        origin: None,
                    };
                    trace!("  @{} publish {message:?}", self.now - START_MS);
                    let limits = Limits {
                        max_len: self.config.max_topic_len,
                        max_levels: self.config.max_topic_levels,
                    };
                    let valid = TopicName::with_limits(topic.0.as_str(), &limits).is_ok();
                    let result = self.broker.publish(Timestamp(self.now), message);
                    assert_eq!(
                        result.is_ok(),
                        valid,
                        "shell publish to {:?}: {result:?}",
                        topic.0
                    );
                    self.drain();
                }
            }
            Op::DisconnectClient { client } => {
                let id = format!("c{}", client % 3);
                self.broker.disconnect_client(
                    Timestamp(self.now),
                    &id,
                    ReasonCode::ADMINISTRATIVE_ACTION,
                );
                self.drain();
            }
            Op::Congest { conn, congested } => {
                if let Some(conn) = self.conn(*conn) {
                    self.input(if *congested {
                        Input::Congested { conn }
                    } else {
                        Input::Drained { conn }
                    });
                }
            }
            Op::Shutdown => {
                self.broker.shutdown(Timestamp(self.now));
                self.drain();
                assert_eq!(
                    self.broker.stats().connections,
                    0,
                    "connections after shutdown"
                );
            }
        }
        self.check_state();
    }
}

fn encode(packet: &Packet, version: ProtocolVersion) -> Option<BytesMut> {
    let mut out = BytesMut::new();
    // Some combinations of fields cannot be encoded (e.g. packet id 0): the client skips them.
    codec::encode(packet, version, &mut out).ok()?;
    Some(out)
}

/// Runs `scenario`; returns the outputs if it was asked to record them.
pub fn run(scenario: &Scenario, record: bool) -> Option<Vec<Output>> {
    let mut shell = Shell::new(scenario.knobs.0.clone(), record);
    for op in &scenario.ops {
        shell.step(op);
    }
    shell.transcript
}

/// The whole check for one input.
pub fn check(data: &[u8]) {
    let Ok(scenario) = Scenario::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    trace!(
        "{:?}\ntwice: {}, {} ops",
        scenario.knobs.0,
        scenario.twice,
        scenario.ops.len()
    );
    let first = run(&scenario, scenario.twice);
    if scenario.twice {
        let second = run(&scenario, true);
        assert!(first == second, "two runs of the same scenario differ");
    }
}
