//! Seed inputs built in code: valid packets of every type in both versions, and scenarios for
//! the structured targets written in the byte format `arbitrary` reads them from.
//!
//! `examples/gen_seeds.rs` writes them to `fuzz/seeds/<target>/`. The scenario writer knows
//! how `arbitrary` 1.x decodes the few shapes it writes (one-byte picks, booleans, enum tags,
//! [`Wire`] bytes, `take_rest` sequences); [`check_scenario`] decodes every written seed and
//! compares it with the value it was meant to be, so a change in `arbitrary` or in the
//! operation enums shows up as a generator failure, not as silently useless seeds.

use std::fmt::Debug;
use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use bytes::{Bytes, BytesMut};
use meridian_core::codec::{
    self, Ack, Auth, AuthProperties, ConnAck, ConnAckProperties, Connect, ConnectProperties,
    Disconnect, DisconnectProperties, LastWill, Packet, ProtocolVersion, Publish,
    PublishProperties, QoS, ReasonCode, ReasonProperties, RetainHandling, SubAck, Subscribe,
    SubscribeFilter, SubscribeProperties, SubscriptionOptions, UnsubAck, Unsubscribe,
    WillProperties,
};
use meridian_core::link::{self, DigestEntry, Forward, Frame};
use meridian_core::routes::{NodeId, Owner, RouteChange, RouteDelta, RouteOp, SnapshotChunk};

use crate::broker::{self, Wire};
use crate::{routes, topic};

// ---------------------------------------------------------------------------------------------
// Packets

fn connect(version: ProtocolVersion, client_id: &str) -> Connect {
    Connect {
        protocol: version,
        clean_start: true,
        keep_alive: 60,
        client_id: client_id.to_owned(),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
    }
}

fn publish(topic: &str, qos: QoS, packet_id: Option<u16>, payload: &'static [u8]) -> Publish {
    Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.to_owned(),
        packet_id,
        payload: Bytes::from_static(payload),
        properties: PublishProperties::default(),
    }
}

fn users() -> Vec<(String, String)> {
    vec![("k".to_owned(), "v".to_owned())]
}

/// A handful of valid packets of every type, as a client or a server of `version` sends them.
pub fn packets(version: ProtocolVersion) -> Vec<(&'static str, Packet)> {
    let v5 = version == ProtocolVersion::V5;
    let mut out: Vec<(&'static str, Packet)> = Vec::new();

    out.push(("connect-minimal", Packet::Connect(connect(version, "c1"))));
    let mut full = connect(version, "client-full");
    full.clean_start = false;
    full.username = Some("user".to_owned());
    full.password = Some(Bytes::from_static(b"secret"));
    full.will = Some(LastWill {
        topic: "last/will".to_owned(),
        payload: Bytes::from_static(b"gone"),
        qos: QoS::AtLeastOnce,
        retain: true,
        properties: if v5 {
            WillProperties {
                will_delay_interval: Some(5),
                payload_format_indicator: Some(1),
                message_expiry_interval: Some(60),
                content_type: Some("text/plain".to_owned()),
                response_topic: Some("reply/here".to_owned()),
                correlation_data: Some(Bytes::from_static(b"\x01\x02")),
                user_properties: users(),
            }
        } else {
            WillProperties::default()
        },
    });
    if v5 {
        full.properties = ConnectProperties {
            session_expiry_interval: Some(3600),
            receive_maximum: Some(10),
            maximum_packet_size: Some(4096),
            topic_alias_maximum: Some(5),
            request_response_information: Some(true),
            request_problem_information: Some(false),
            user_properties: users(),
            authentication_method: Some("m".to_owned()),
            authentication_data: Some(Bytes::from_static(b"ok")),
        };
    }
    out.push(("connect-full", Packet::Connect(full)));
    let mut empty_id = connect(version, "");
    empty_id.keep_alive = 0;
    out.push(("connect-empty-id", Packet::Connect(empty_id)));

    out.push((
        "connack-accepted",
        Packet::ConnAck(ConnAck {
            session_present: true,
            reason: ReasonCode::SUCCESS,
            properties: ConnAckProperties::default(),
        }),
    ));
    out.push((
        "connack-refused",
        Packet::ConnAck(ConnAck {
            session_present: false,
            reason: ReasonCode::NOT_AUTHORIZED,
            properties: ConnAckProperties::default(),
        }),
    ));
    if v5 {
        out.push((
            "connack-properties",
            Packet::ConnAck(ConnAck {
                session_present: false,
                reason: ReasonCode::SUCCESS,
                properties: ConnAckProperties {
                    session_expiry_interval: Some(60),
                    receive_maximum: Some(1024),
                    maximum_qos: Some(QoS::AtLeastOnce),
                    retain_available: Some(false),
                    maximum_packet_size: Some(1 << 20),
                    assigned_client_identifier: Some("meridian-0123".to_owned()),
                    topic_alias_maximum: Some(64),
                    reason_string: Some("welcome".to_owned()),
                    user_properties: users(),
                    wildcard_subscription_available: Some(false),
                    subscription_identifiers_available: Some(false),
                    shared_subscription_available: Some(false),
                    server_keep_alive: Some(30),
                    response_information: Some("response/c1/".to_owned()),
                    server_reference: Some("elsewhere".to_owned()),
                    authentication_method: Some("m".to_owned()),
                    authentication_data: Some(Bytes::from_static(b"ok")),
                },
            }),
        ));
    }

    out.push((
        "publish-qos0",
        Packet::Publish(publish("a/b", QoS::AtMostOnce, None, b"hello")),
    ));
    let mut q1 = publish("sensors/1/temp", QoS::AtLeastOnce, Some(7), b"21.5");
    q1.retain = true;
    out.push(("publish-qos1-retain", Packet::Publish(q1)));
    let mut q2 = publish("$SYS/x", QoS::ExactlyOnce, Some(65535), b"");
    q2.dup = true;
    out.push(("publish-qos2-dup", Packet::Publish(q2)));
    if v5 {
        let mut props = publish("a/b", QoS::AtLeastOnce, Some(1), b"{}");
        props.properties = PublishProperties {
            payload_format_indicator: Some(1),
            message_expiry_interval: Some(10),
            topic_alias: Some(1),
            response_topic: Some("reply".to_owned()),
            correlation_data: Some(Bytes::from_static(b"id")),
            user_properties: users(),
            subscription_identifiers: vec![1, 268_435_455],
            content_type: Some("application/json".to_owned()),
        };
        out.push(("publish-properties", Packet::Publish(props)));
        let mut alias = publish("", QoS::AtMostOnce, None, b"x");
        alias.properties.topic_alias = Some(1);
        out.push(("publish-alias-only", Packet::Publish(alias)));
    }

    let ack = |id: u16| {
        let mut a = Ack::new(id);
        if v5 {
            a.reason = ReasonCode::NO_MATCHING_SUBSCRIBERS;
            a.properties = ReasonProperties {
                reason_string: Some("nobody".to_owned()),
                user_properties: users(),
            };
        }
        a
    };
    out.push(("puback", Packet::PubAck(Ack::new(7))));
    out.push(("puback-reason", Packet::PubAck(ack(8))));
    out.push(("pubrec", Packet::PubRec(Ack::new(9))));
    out.push(("pubrel", Packet::PubRel(Ack::new(9))));
    out.push(("pubcomp", Packet::PubComp(Ack::new(9))));
    if v5 {
        let mut rel = Ack::new(10);
        rel.reason = ReasonCode::PACKET_IDENTIFIER_NOT_FOUND;
        out.push(("pubrel-not-found", Packet::PubRel(rel)));
    }

    let opts = |qos, rh| SubscriptionOptions {
        qos,
        no_local: v5,
        retain_as_published: v5,
        retain_handling: if v5 { rh } else { RetainHandling::OnSubscribe },
    };
    out.push((
        "subscribe",
        Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![
                SubscribeFilter {
                    filter: "a/+".to_owned(),
                    options: SubscriptionOptions::default(),
                },
                SubscribeFilter {
                    filter: "sport/#".to_owned(),
                    options: opts(QoS::AtLeastOnce, RetainHandling::OnNewSubscribe),
                },
                SubscribeFilter {
                    filter: "$share/g/jobs/+".to_owned(),
                    options: opts(QoS::ExactlyOnce, RetainHandling::Never),
                },
            ],
            properties: SubscribeProperties {
                subscription_identifier: v5.then_some(42),
                user_properties: if v5 { users() } else { Vec::new() },
            },
        }),
    ));
    out.push((
        "suback",
        Packet::SubAck(SubAck {
            packet_id: 1,
            reasons: vec![
                ReasonCode::GRANTED_QOS_0,
                ReasonCode::GRANTED_QOS_2,
                ReasonCode::UNSPECIFIED_ERROR,
            ],
            properties: ReasonProperties::default(),
        }),
    ));
    out.push((
        "unsubscribe",
        Packet::Unsubscribe(Unsubscribe {
            packet_id: 2,
            filters: vec!["a/+".to_owned(), "#".to_owned()],
            user_properties: if v5 { users() } else { Vec::new() },
        }),
    ));
    out.push((
        "unsuback",
        Packet::UnsubAck(UnsubAck {
            packet_id: 2,
            reasons: if v5 {
                vec![ReasonCode::SUCCESS, ReasonCode::NO_SUBSCRIPTION_EXISTED]
            } else {
                Vec::new()
            },
            properties: ReasonProperties::default(),
        }),
    ));
    out.push(("pingreq", Packet::PingReq));
    out.push(("pingresp", Packet::PingResp));
    out.push((
        "disconnect",
        Packet::Disconnect(Disconnect::new(ReasonCode::NORMAL_DISCONNECTION)),
    ));
    if v5 {
        out.push((
            "disconnect-properties",
            Packet::Disconnect(Disconnect {
                reason: ReasonCode::DISCONNECT_WITH_WILL,
                properties: DisconnectProperties {
                    session_expiry_interval: Some(0),
                    reason_string: Some("bye".to_owned()),
                    user_properties: users(),
                    server_reference: Some("other".to_owned()),
                },
            }),
        ));
        out.push((
            "auth",
            Packet::Auth(Auth {
                reason: ReasonCode::CONTINUE_AUTHENTICATION,
                properties: AuthProperties {
                    authentication_method: Some("m".to_owned()),
                    authentication_data: Some(Bytes::from_static(b"more")),
                    reason_string: Some("step".to_owned()),
                    user_properties: users(),
                },
            }),
        ));
    }
    out
}

/// Encodes `packet`, which the seed list only holds if it is valid.
pub fn encode(packet: &Packet, version: ProtocolVersion) -> Vec<u8> {
    let mut out = BytesMut::new();
    codec::encode(packet, version, &mut out)
        .unwrap_or_else(|e| panic!("seed packet {packet:?} does not encode: {e}"));
    out.to_vec()
}

/// Seed files for a codec target: one per packet, and all of them back to back.
pub fn codec_seeds(version: ProtocolVersion) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut all = Vec::new();
    for (name, packet) in packets(version) {
        let bytes = encode(&packet, version);
        all.extend_from_slice(&bytes);
        files.push((name.to_owned(), bytes));
    }
    files.push(("all-back-to-back".to_owned(), all));
    files
}

// ---------------------------------------------------------------------------------------------
// Scenarios in arbitrary's byte format

/// Writes the bytes that `arbitrary` 1.x decodes into the values given.
#[derive(Debug, Default)]
pub struct Writer {
    out: Vec<u8>,
}

impl Writer {
    /// A one-byte pick of choice `index` (`Unstructured::choose`, `int_in_range` over at most
    /// 256 values, `u8`).
    pub fn pick(&mut self, index: u8) -> &mut Self {
        self.out.push(index);
        self
    }

    pub fn bool(&mut self, b: bool) -> &mut Self {
        self.pick(u8::from(b))
    }

    /// The tag of variant `index` of an enum with `count` variants (derived `Arbitrary` reads a
    /// little-endian `u32` and scales it: `(x * count) >> 32`).
    pub fn variant(&mut self, index: u32, count: u32) -> &mut Self {
        let x = ((u64::from(index) << 32).div_ceil(u64::from(count))) as u32;
        self.out.extend_from_slice(&x.to_le_bytes());
        self
    }

    /// [`Wire`] bytes: a big-endian `u16` length, then the bytes.
    pub fn wire(&mut self, bytes: &[u8]) -> &mut Self {
        let len = u16::try_from(bytes.len()).expect("seed bytes fit a u16 length");
        self.out.extend_from_slice(&len.to_be_bytes());
        self.out.extend_from_slice(bytes);
        self
    }

    /// The "one more element" flag of a `take_rest` sequence.
    pub fn more(&mut self) -> &mut Self {
        self.bool(true)
    }

    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }
}

/// Decodes `bytes` as a `T` (with `take_rest`) and checks that it reads as `expected`.
pub fn check_scenario<'a, T: Arbitrary<'a> + Debug>(bytes: &'a [u8], expected: &str) {
    let decoded = T::arbitrary_take_rest(Unstructured::new(bytes))
        .unwrap_or_else(|e| panic!("seed does not decode: {e}"));
    let got = format!("{decoded:?}");
    assert_eq!(
        got, expected,
        "seed decodes to something else than intended"
    );
}

// --- broker_sequence

/// The operations a broker seed may use (a subset of [`broker::Op`]).
#[derive(Debug, Clone)]
pub enum SeedOp {
    Accept,
    Raw(u8, Vec<u8>),
    Close(u8),
    /// Index into the time steps of [`broker::Step`].
    Advance(u8),
    Timeout,
    AuthDecision(u8, u32),
    AckAll(u8),
    Crash,
}

/// Variant indexes of [`broker::Op`] and their count; checked by [`check_scenario`].
const OP_ACCEPT: u32 = 0;
const OP_RAW: u32 = 4;
const OP_CLOSE: u32 = 5;
const OP_ADVANCE: u32 = 6;
const OP_TIMEOUT: u32 = 7;
const OP_AUTH_DECISION: u32 = 8;
const OP_ACK_ALL: u32 = 9;
const OP_CRASH: u32 = 10;
const OP_COUNT: u32 = 15;
const OUTCOME_COUNT: u32 = 5;
const STEPS: [u64; 11] = [
    0, 1, 999, 1_000, 1_500, 5_000, 10_000, 60_000, 90_000, 3_600_000, 86_400_000,
];
const OUTCOMES: [&str; 5] = ["Allow", "AllowAs", "Deny", "Continue", "Pending"];

/// Encodes a broker scenario with the default configuration; returns the bytes and the
/// `Debug` text of the `broker::Scenario` they must decode to.
pub fn broker_scenario(ops: &[SeedOp]) -> (Vec<u8>, String) {
    let mut w = Writer::default();
    // Knobs: 24 picks of the first choice (the defaults), then the seed byte.
    for _ in 0..24 {
        w.pick(0);
    }
    w.pick(0x6d);
    w.bool(false); // twice
    let mut expected = Vec::new();
    for op in ops {
        w.more();
        match op {
            SeedOp::Accept => {
                w.variant(OP_ACCEPT, OP_COUNT).bool(false);
                expected.push("Accept { small_limit: false }".to_owned());
            }
            SeedOp::Raw(conn, bytes) => {
                w.variant(OP_RAW, OP_COUNT).pick(*conn).wire(bytes);
                expected.push(format!(
                    "Raw {{ conn: {conn}, bytes: {:?} }}",
                    Wire(bytes.clone())
                ));
            }
            SeedOp::Close(conn) => {
                w.variant(OP_CLOSE, OP_COUNT).pick(*conn);
                expected.push(format!("Close {{ conn: {conn} }}"));
            }
            SeedOp::Advance(step) => {
                w.variant(OP_ADVANCE, OP_COUNT).pick(*step);
                expected.push(format!("Advance(Step({}))", STEPS[usize::from(*step)]));
            }
            SeedOp::Timeout => {
                w.variant(OP_TIMEOUT, OP_COUNT);
                expected.push("Timeout".to_owned());
            }
            SeedOp::AuthDecision(conn, outcome) => {
                w.variant(OP_AUTH_DECISION, OP_COUNT)
                    .pick(*conn)
                    .variant(*outcome, OUTCOME_COUNT);
                expected.push(format!(
                    "AuthDecision {{ conn: {conn}, outcome: {} }}",
                    OUTCOMES[*outcome as usize]
                ));
            }
            SeedOp::AckAll(conn) => {
                w.variant(OP_ACK_ALL, OP_COUNT).pick(*conn);
                expected.push(format!("AckAll {{ conn: {conn} }}"));
            }
            SeedOp::Crash => {
                w.variant(OP_CRASH, OP_COUNT);
                expected.push("Crash".to_owned());
            }
        }
    }
    let bytes = w.finish();
    let decoded = broker::Scenario::arbitrary_take_rest(Unstructured::new(&bytes))
        .unwrap_or_else(|e| panic!("broker seed does not decode: {e}"));
    assert_eq!(
        decoded.knobs.0,
        meridian_core::Config {
            seed: 0x6d,
            ..meridian_core::Config::default()
        },
        "seed knobs must decode to the default configuration"
    );
    let text = format!("[{}]", expected.join(", "));
    (bytes, text)
}

/// The ops of a decoded broker scenario, as `Debug` text (to compare with [`broker_scenario`]).
pub fn broker_ops_text(bytes: &[u8]) -> String {
    let decoded = broker::Scenario::arbitrary_take_rest(Unstructured::new(bytes))
        .unwrap_or_else(|e| panic!("broker seed does not decode: {e}"));
    format!("{:?}", decoded.ops)
}

fn v(version: ProtocolVersion, p: Packet) -> Vec<u8> {
    encode(&p, version)
}

fn sub(filter: &str, qos: QoS) -> Packet {
    Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: filter.to_owned(),
            options: SubscriptionOptions {
                qos,
                ..SubscriptionOptions::default()
            },
        }],
        properties: SubscribeProperties::default(),
    })
}

/// Conversations that get past CONNECT: delivery, retained messages, QoS 2, wills, keep
/// alive, persistent sessions across a crash, enhanced and deferred authentication.
pub fn broker_seeds() -> Vec<(String, Vec<SeedOp>)> {
    use ProtocolVersion::{V5, V311};
    use SeedOp::*;
    let mut seeds = Vec::new();
    for (name, ver) in [("v311", V311), ("v5", V5)] {
        let pubq = |topic: &str, qos: QoS, id: u16, retain: bool| {
            let mut p = publish(topic, qos, (qos != QoS::AtMostOnce).then_some(id), b"m");
            p.retain = retain;
            v(ver, Packet::Publish(p))
        };
        seeds.push((
            format!("deliver-{name}"),
            vec![
                Accept,
                Raw(0, v(ver, Packet::Connect(connect(ver, "c0")))),
                Raw(0, v(ver, sub("a/+", QoS::AtLeastOnce))),
                Accept,
                Raw(1, v(ver, Packet::Connect(connect(ver, "c1")))),
                Raw(1, pubq("a/b", QoS::AtLeastOnce, 1, false)),
                Raw(1, pubq("a/c", QoS::ExactlyOnce, 2, true)),
                Raw(1, v(ver, Packet::PubRel(Ack::new(2)))),
                AckAll(0),
                AckAll(0),
                Raw(1, v(ver, Packet::PingReq)),
                Raw(
                    0,
                    v(
                        ver,
                        Packet::Disconnect(Disconnect::new(ReasonCode::SUCCESS)),
                    ),
                ),
                Advance(7),
            ],
        ));
        let mut persistent = connect(ver, "c0");
        persistent.clean_start = false;
        if ver == V5 {
            persistent.properties.session_expiry_interval = Some(3600);
        }
        let mut with_will = connect(ver, "c2");
        with_will.keep_alive = 1;
        with_will.will = Some(LastWill {
            topic: "a/will".to_owned(),
            payload: Bytes::from_static(b"bye"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: WillProperties::default(),
        });
        seeds.push((
            format!("offline-queue-crash-{name}"),
            vec![
                Accept,
                Raw(0, v(ver, Packet::Connect(persistent.clone()))),
                Raw(0, v(ver, sub("a/#", QoS::ExactlyOnce))),
                Close(0),
                Accept,
                Raw(1, v(ver, Packet::Connect(with_will))),
                Raw(1, pubq("a/b", QoS::AtLeastOnce, 1, true)),
                Raw(1, pubq("a/b/c", QoS::ExactlyOnce, 2, false)),
                Advance(4),
                Crash,
                Accept,
                Raw(0, v(ver, Packet::Connect(persistent))),
                AckAll(0),
                AckAll(0),
                Advance(9),
            ],
        ));
    }
    let mut enhanced = connect(V5, "c1");
    enhanced.properties.authentication_method = Some("m".to_owned());
    enhanced.properties.authentication_data = Some(Bytes::from_static(b"more"));
    let auth = |data: &'static [u8]| {
        v(
            V5,
            Packet::Auth(Auth {
                reason: ReasonCode::CONTINUE_AUTHENTICATION,
                properties: AuthProperties {
                    authentication_method: Some("m".to_owned()),
                    authentication_data: Some(Bytes::from_static(data)),
                    ..AuthProperties::default()
                },
            }),
        )
    };
    let mut pending = connect(V311, "c2");
    pending.username = Some("pending".to_owned());
    seeds.push((
        "auth".to_owned(),
        vec![
            Accept,
            Raw(0, v(V5, Packet::Connect(enhanced))),
            Raw(0, auth(b"later")),
            AuthDecision(0, 3),
            Raw(0, auth(b"ok")),
            Accept,
            Raw(1, v(V311, Packet::Connect(pending))),
            AuthDecision(1, 0),
            Timeout,
        ],
    ));
    seeds
}

// --- topic_match

/// Variant indexes of [`topic::Op`].
const T_ADD_FILTER: u32 = 0;
const T_REMOVE_FILTER: u32 = 1;
const T_ADD_TOPIC: u32 = 2;
const T_MATCH_TOPIC: u32 = 4;
const T_MATCH_FILTER: u32 = 5;
const T_COUNT: u32 = 6;

fn text(w: &mut Writer, s: &str) {
    // Not the one-in-eight arbitrary string; then the level count and each level.
    let levels: Vec<&str> = s.split('/').collect();
    w.pick(1)
        .pick(u8::try_from(levels.len() - 1).expect("few levels"));
    for level in levels {
        let i = topic::LEVELS
            .iter()
            .position(|l| *l == level)
            .unwrap_or_else(|| panic!("level {level:?} not in the alphabet"));
        w.pick(u8::try_from(i).expect("small alphabet"));
    }
}

/// Stores `filters` and `topics`, matches them both ways, removes the first filter (in sorted
/// order) and matches again.
pub fn topic_scenario(filters: &[&str], topics: &[&str]) -> Vec<u8> {
    let mut w = Writer::default();
    w.out.extend_from_slice(&42u64.to_le_bytes());
    for f in filters {
        w.more().variant(T_ADD_FILTER, T_COUNT);
        text(&mut w, f);
    }
    for t in topics {
        w.more().variant(T_ADD_TOPIC, T_COUNT);
        text(&mut w, t);
    }
    for t in topics {
        w.more().variant(T_MATCH_TOPIC, T_COUNT);
        text(&mut w, t);
    }
    for f in filters {
        w.more().variant(T_MATCH_FILTER, T_COUNT);
        text(&mut w, f);
    }
    w.more()
        .variant(T_REMOVE_FILTER, T_COUNT)
        .pick(0)
        .bool(false);
    for t in topics {
        w.more().variant(T_MATCH_TOPIC, T_COUNT);
        text(&mut w, t);
    }
    w.finish()
}

/// The `Debug` text of the ops `topic_scenario(filters, topics)` must decode to.
pub fn topic_expected(filters: &[&str], topics: &[&str]) -> String {
    let t = |s: &str| format!("Text({s:?})");
    let mut ops = Vec::new();
    ops.extend(filters.iter().map(|f| format!("AddFilter({})", t(f))));
    ops.extend(topics.iter().map(|x| format!("AddTopic({})", t(x))));
    ops.extend(topics.iter().map(|x| format!("MatchTopic({})", t(x))));
    ops.extend(filters.iter().map(|f| format!("MatchFilter({})", t(f))));
    ops.push("RemoveFilter { index: 0, other: None }".to_owned());
    ops.extend(topics.iter().map(|x| format!("MatchTopic({})", t(x))));
    format!("Scenario {{ seed: 42, ops: [{}] }}", ops.join(", "))
}

/// Topic seeds: (name, filters, topics).
pub fn topic_seeds() -> Vec<(&'static str, Vec<&'static str>, Vec<&'static str>)> {
    vec![
        (
            "wildcards",
            vec!["a/+", "a/#", "#", "+/b", "+", "a/b", "$share/g/a/+"],
            vec!["a", "a/b", "b/b", "a/b/a"],
        ),
        (
            "dollar-and-empty-levels",
            vec!["+/a", "#", "$s/#", "$s/+", "/a", "+/+", "a//b"],
            vec!["$s/a", "/a", "a//b", "$s", ""],
        ),
    ]
}

// --- link_frame

fn owner(name: &str, incarnation: u64) -> Owner {
    Owner {
        node: NodeId::new(name).expect("valid node id"),
        incarnation,
    }
}

/// One link frame of every type, as the cluster layer sends them (the test vectors of
/// `core/tests/link_props.rs`).
pub fn link_frames() -> Vec<(&'static str, Frame)> {
    let euc1 = owner("euc1-a", 3);
    let change = |version, filter: &str, op| RouteChange {
        version,
        filter: Arc::from(filter),
        op,
    };
    let mut message = publish("sensors/1/temp", QoS::AtLeastOnce, Some(1), b"21.5");
    message.properties = PublishProperties {
        payload_format_indicator: Some(1),
        message_expiry_interval: Some(60),
        content_type: Some("text/plain".into()),
        correlation_data: Some(Bytes::from_static(b"c")),
        user_properties: users(),
        ..Default::default()
    };
    vec![
        (
            "hello",
            Frame::Hello {
                node: euc1.node.clone(),
                incarnation: 3,
                protocol: link::LINK_PROTOCOL_VERSION,
                region: "eu-central-1".into(),
                certificate: None,
            },
        ),
        (
            "route-delta",
            Frame::RouteDelta(RouteDelta {
                owner: euc1.clone(),
                after: 4,
                changes: vec![
                    change(5, "a/+", RouteOp::Add),
                    change(6, "sensors/#", RouteOp::Add),
                    change(7, "$SYS/x", RouteOp::Remove),
                ],
                hash: 0x0123_4567_89ab_cdef,
            }),
        ),
        (
            "route-delta-empty",
            Frame::RouteDelta(RouteDelta {
                owner: euc1.clone(),
                after: 7,
                changes: Vec::new(),
                hash: 0,
            }),
        ),
        (
            "route-ack",
            Frame::RouteAck {
                owner: euc1.clone(),
                version: 7,
            },
        ),
        (
            "digest",
            Frame::Digest(vec![
                DigestEntry {
                    owner: euc1.clone(),
                    version: 7,
                    hash: 42,
                },
                DigestEntry {
                    owner: owner("use1-b", 1),
                    version: 0,
                    hash: 0,
                },
            ]),
        ),
        ("snapshot-request", Frame::SnapshotRequest),
        (
            "snapshot-chunk",
            Frame::SnapshotChunk(SnapshotChunk {
                owner: euc1.clone(),
                version: 7,
                hash: 42,
                index: 1,
                count: 3,
                filters: vec![Arc::from("a/+"), Arc::from("#"), Arc::from("/x//")],
            }),
        ),
        (
            "forward",
            Frame::Forward(Forward {
                origin: euc1.clone(),
                seq: 9,
                message,
            }),
        ),
        (
            "forward-qos0",
            Frame::Forward(Forward {
                origin: euc1.clone(),
                seq: 0,
                message: publish("a", QoS::AtMostOnce, None, b""),
            }),
        ),
        (
            "forward-ack",
            Frame::ForwardAck {
                origin: euc1,
                seq: 9,
            },
        ),
        ("keep-alive", Frame::KeepAlive),
    ]
}

/// Seed files for `link_frame`: one per frame, and all of them back to back.
pub fn link_seeds() -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut all = Vec::new();
    for (name, frame) in link_frames() {
        let mut out = BytesMut::new();
        link::encode(&frame, &mut out)
            .unwrap_or_else(|e| panic!("seed frame {frame:?} does not encode: {e}"));
        all.extend_from_slice(&out);
        files.push((name.to_owned(), out.to_vec()));
    }
    files.push(("all-back-to-back".to_owned(), all));
    files
}

// --- route_merge

/// Variant index of a [`routes::Op`] (the order of its declaration).
fn route_op_index(op: &routes::Op) -> u32 {
    use routes::Op::*;
    match op {
        Add { .. } => 0,
        Remove { .. } => 1,
        Flush { .. } => 2,
        Deliver(_) => 3,
        Duplicate(_) => 4,
        Drop(_) => 5,
        Digest { .. } => 6,
        Restart { .. } => 7,
        PeerUp { .. } => 8,
        RemovePeer { .. } => 9,
        RequestSnapshot { .. } => 10,
    }
}
const ROUTE_OP_COUNT: u32 = 11;

/// Encodes a route scenario; returns the bytes and the `Debug` text they must decode to.
pub fn route_scenario(budget: u8, chunk: u8, ops: &[routes::Op]) -> (Vec<u8>, String) {
    use routes::Op::*;
    let mut w = Writer::default();
    w.pick(budget).pick(chunk);
    for op in ops {
        w.more().variant(route_op_index(op), ROUTE_OP_COUNT);
        match *op {
            Add { owner, filter } | Remove { owner, filter } => w.pick(owner).pick(filter),
            Flush { owner } | Digest { owner } | Restart { owner } => w.pick(owner),
            Deliver(i) | Duplicate(i) | Drop(i) => w.pick(i),
            PeerUp { owner, replica }
            | RemovePeer { owner, replica }
            | RequestSnapshot { owner, replica } => w.pick(owner).pick(replica),
        };
    }
    let expected = format!(
        "{:?}",
        routes::Scenario {
            budget,
            chunk,
            ops: ops.to_vec(),
        }
    );
    (w.finish(), expected)
}

/// Route scenarios: (name, tombstone budget byte, chunk byte, ops).
pub fn route_seeds() -> Vec<(&'static str, u8, u8, Vec<routes::Op>)> {
    use routes::Op::*;
    let add = |owner, filter| Add { owner, filter };
    let remove = |owner, filter| Remove { owner, filter };
    let flush = |owner| Flush { owner };
    vec![
        // Both owners change their sets; every frame arrives in order.
        (
            "in-order",
            15,
            1,
            vec![
                add(0, 0),
                add(0, 1),
                flush(0),
                add(1, 3),
                add(1, 5),
                flush(1),
                Deliver(0),
                Deliver(0),
                Deliver(0),
                Deliver(0),
                remove(0, 0),
                add(0, 6),
                flush(0),
                Deliver(0),
                Deliver(0),
                Deliver(0),
                Deliver(0),
                Deliver(0),
                Deliver(0),
            ],
        ),
        // Deltas reordered, duplicated and lost; the gap is repaired through digests.
        (
            "reorder-duplicate-lose",
            3,
            0,
            vec![
                add(0, 0),
                flush(0),
                add(0, 2),
                flush(0),
                remove(0, 0),
                add(0, 7),
                flush(0),
                Deliver(5),
                Duplicate(0),
                Drop(1),
                Deliver(2),
                Deliver(0),
                Digest { owner: 0 },
                Deliver(3),
                Deliver(1),
                Deliver(0),
                Deliver(0),
                Deliver(0),
            ],
        ),
        // An owner restarts while its earlier frames are still in flight.
        (
            "restart",
            7,
            1,
            vec![
                add(0, 0),
                add(0, 4),
                flush(0),
                Deliver(0),
                add(0, 9),
                flush(0),
                Restart { owner: 0 },
                add(0, 2),
                flush(0),
                Deliver(2),
                Deliver(1),
                Deliver(0),
                Deliver(0),
                Deliver(0),
                Deliver(0),
            ],
        ),
        // A peer falls behind the tombstone budget and is forgotten: snapshots in chunks of 1.
        (
            "snapshot-chunks",
            0,
            0,
            vec![
                RemovePeer {
                    owner: 1,
                    replica: 1,
                },
                add(1, 0),
                add(1, 1),
                add(1, 2),
                flush(1),
                add(1, 3),
                flush(1),
                Drop(0),
                Drop(0),
                Drop(0),
                PeerUp {
                    owner: 1,
                    replica: 1,
                },
                RequestSnapshot {
                    owner: 1,
                    replica: 0,
                },
                Deliver(0),
                Deliver(0),
                Deliver(0),
                Deliver(0),
                Deliver(0),
                Deliver(0),
                Deliver(0),
            ],
        ),
    ]
}
