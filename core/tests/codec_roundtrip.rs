//! Codec properties on generated packets: every packet valid for a version survives
//! encode → decode unchanged, whole or split at any byte, alone or back to back; `encoded_len`
//! agrees with `encode`; and no input, however broken, makes the decoder panic.
//!
//! Case counts follow proptest's default (256); raise them with `PROPTEST_CASES`.

use ProtocolVersion::{V5, V311};
use bytes::{Bytes, BytesMut};
use meridian_core::codec::{
    self, Ack, Auth, AuthProperties, ConnAck, ConnAckProperties, Connect, ConnectProperties,
    Disconnect, DisconnectProperties, LastWill, MAX_REMAINING_LENGTH, OutgoingPublish, Packet,
    ProtocolVersion, Publish, PublishProperties, QoS, ReasonCode, ReasonProperties, RetainHandling,
    SubAck, Subscribe, SubscribeFilter, SubscribeProperties, SubscriptionOptions, UnsubAck,
    Unsubscribe, UserProperty, WillProperties,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Building blocks

/// Any UTF-8 string without U+0000.
fn text() -> impl Strategy<Value = String> + Clone {
    "[^\\x00]{0,8}"
}

/// A topic name: non-empty, no wildcards.
fn topic() -> impl Strategy<Value = String> + Clone {
    "[^\\x00+#]{1,8}"
}

fn data() -> impl Strategy<Value = Bytes> + Clone {
    prop::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

fn users() -> impl Strategy<Value = Vec<UserProperty>> + Clone {
    prop::collection::vec((text(), text()), 0..3)
}

fn opt<S: Strategy>(s: S) -> impl Strategy<Value = Option<S::Value>> {
    prop::option::of(s)
}

fn qos() -> impl Strategy<Value = QoS> + Clone {
    prop_oneof![
        Just(QoS::AtMostOnce),
        Just(QoS::AtLeastOnce),
        Just(QoS::ExactlyOnce)
    ]
}

fn packet_id() -> impl Strategy<Value = u16> + Clone {
    1..=u16::MAX
}

fn subscription_id() -> impl Strategy<Value = u32> + Clone {
    1..=MAX_REMAINING_LENGTH
}

fn reason(codes: &'static [u8]) -> impl Strategy<Value = ReasonCode> + Clone {
    prop::sample::select(codes).prop_map(ReasonCode)
}

// The reason code tables of MQTT 5.0, written out from the spec independently of the codec.
const CONNACK: &[u8] = &[
    0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97,
    0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F,
];
/// The reasons a 3.1.1 return code decodes to.
const CONNACK_V311: &[u8] = &[0x00, 0x84, 0x85, 0x88, 0x86, 0x87];
const PUBACK: &[u8] = &[0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99];
const PUBREL: &[u8] = &[0x00, 0x92];
const SUBACK: &[u8] = &[
    0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2,
];
const SUBACK_V311: &[u8] = &[0x00, 0x01, 0x02, 0x80];
const UNSUBACK: &[u8] = &[0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91];
const DISCONNECT: &[u8] = &[
    0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95,
    0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2,
];
const AUTH: &[u8] = &[0x00, 0x18, 0x19];

// ---------------------------------------------------------------------------------------------
// Properties (MQTT 5.0)

fn connect_properties() -> impl Strategy<Value = ConnectProperties> {
    (
        (
            opt(any::<u32>()),
            opt(1..=u16::MAX),
            opt(1..=u32::MAX),
            opt(any::<u16>()),
        ),
        (opt(any::<bool>()), opt(any::<bool>()), users()),
        opt((text(), opt(data()))),
    )
        .prop_map(|((sei, rm, mps, tam), (rri, rpi, user_properties), auth)| {
            let (authentication_method, authentication_data) = match auth {
                Some((m, d)) => (Some(m), d),
                None => (None, None),
            };
            ConnectProperties {
                session_expiry_interval: sei,
                receive_maximum: rm,
                maximum_packet_size: mps,
                topic_alias_maximum: tam,
                request_response_information: rri,
                request_problem_information: rpi,
                user_properties,
                authentication_method,
                authentication_data,
            }
        })
}

fn will_properties() -> impl Strategy<Value = WillProperties> {
    (
        opt(any::<u32>()),
        opt(0..=1u8),
        opt(any::<u32>()),
        opt(text()),
        opt(topic()),
        opt(data()),
        users(),
    )
        .prop_map(
            |(wdi, pfi, mei, ct, rt, cd, user_properties)| WillProperties {
                will_delay_interval: wdi,
                payload_format_indicator: pfi,
                message_expiry_interval: mei,
                content_type: ct,
                response_topic: rt,
                correlation_data: cd,
                user_properties,
            },
        )
}

fn connack_properties() -> impl Strategy<Value = ConnAckProperties> {
    (
        (
            opt(any::<u32>()),
            opt(1..=u16::MAX),
            opt(prop_oneof![Just(QoS::AtMostOnce), Just(QoS::AtLeastOnce)]),
        ),
        (
            opt(any::<bool>()),
            opt(1..=u32::MAX),
            opt(text()),
            opt(any::<u16>()),
        ),
        (
            opt(text()),
            users(),
            opt(any::<bool>()),
            opt(any::<bool>()),
            opt(any::<bool>()),
        ),
        (
            opt(any::<u16>()),
            opt(text()),
            opt(text()),
            opt(text()),
            opt(data()),
        ),
    )
        .prop_map(
            |(
                (sei, rm, mq),
                (ra, mps, aci, tam),
                (rs, up, wsa, sia, ssa),
                (ska, ri, sr, am, ad),
            )| {
                ConnAckProperties {
                    session_expiry_interval: sei,
                    receive_maximum: rm,
                    maximum_qos: mq,
                    retain_available: ra,
                    maximum_packet_size: mps,
                    assigned_client_identifier: aci,
                    topic_alias_maximum: tam,
                    reason_string: rs,
                    user_properties: up,
                    wildcard_subscription_available: wsa,
                    subscription_identifiers_available: sia,
                    shared_subscription_available: ssa,
                    server_keep_alive: ska,
                    response_information: ri,
                    server_reference: sr,
                    authentication_method: am,
                    authentication_data: ad,
                }
            },
        )
}

fn publish_properties() -> impl Strategy<Value = PublishProperties> {
    (
        opt(0..=1u8),
        opt(any::<u32>()),
        opt(1..=u16::MAX),
        opt(topic()),
        opt(data()),
        users(),
        prop::collection::vec(subscription_id(), 0..3),
        opt(text()),
    )
        .prop_map(|(pfi, mei, ta, rt, cd, up, si, ct)| PublishProperties {
            payload_format_indicator: pfi,
            message_expiry_interval: mei,
            topic_alias: ta,
            response_topic: rt,
            correlation_data: cd,
            user_properties: up,
            subscription_identifiers: si,
            content_type: ct,
        })
}

fn reason_properties() -> impl Strategy<Value = ReasonProperties> {
    (opt(text()), users()).prop_map(|(reason_string, user_properties)| ReasonProperties {
        reason_string,
        user_properties,
    })
}

// ---------------------------------------------------------------------------------------------
// Packets

fn connect(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let v5 = version == V5;
    let will = (topic(), data(), qos(), any::<bool>(), will_properties()).prop_map(
        move |(topic, payload, qos, retain, properties)| LastWill {
            topic,
            payload,
            qos,
            retain,
            properties: if v5 {
                properties
            } else {
                WillProperties::default()
            },
        },
    );
    (
        any::<bool>(),
        any::<u16>(),
        text(),
        opt(will),
        opt(text()),
        opt(data()),
        connect_properties(),
    )
        .prop_map(
            move |(clean_start, keep_alive, client_id, will, username, password, properties)| {
                // MQTT 3.1.1 has no password without a user name.
                let password = if v5 || username.is_some() {
                    password
                } else {
                    None
                };
                Packet::Connect(Connect {
                    protocol: version,
                    clean_start,
                    keep_alive,
                    client_id,
                    will,
                    username,
                    password,
                    properties: if v5 {
                        properties
                    } else {
                        ConnectProperties::default()
                    },
                })
            },
        )
}

fn connack(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    match version {
        V311 => (any::<bool>(), reason(CONNACK_V311))
            .prop_map(|(session_present, reason)| {
                Packet::ConnAck(ConnAck {
                    session_present,
                    reason,
                    properties: Default::default(),
                })
            })
            .boxed(),
        V5 => (any::<bool>(), reason(CONNACK), connack_properties())
            .prop_map(|(session_present, reason, properties)| {
                Packet::ConnAck(ConnAck {
                    session_present,
                    reason,
                    properties,
                })
            })
            .boxed(),
    }
}

fn publish(version: ProtocolVersion) -> impl Strategy<Value = Publish> {
    let v5 = version == V5;
    (
        qos(),
        any::<bool>(),
        any::<bool>(),
        topic(),
        any::<bool>(),
        packet_id(),
        data(),
        publish_properties(),
    )
        .prop_map(
            move |(qos, dup, retain, topic, empty_topic, id, payload, properties)| {
                let has_id = qos != QoS::AtMostOnce;
                let properties = if v5 {
                    properties
                } else {
                    PublishProperties::default()
                };
                // An empty topic needs a topic alias (MQTT 5.0 only).
                let topic = if empty_topic && properties.topic_alias.is_some() {
                    String::new()
                } else {
                    topic
                };
                Publish {
                    dup: dup && has_id,
                    qos,
                    retain,
                    topic,
                    packet_id: has_id.then_some(id),
                    payload,
                    properties,
                }
            },
        )
}

fn ack(version: ProtocolVersion, codes: &'static [u8]) -> BoxedStrategy<Ack> {
    match version {
        V311 => packet_id().prop_map(Ack::new).boxed(),
        V5 => (packet_id(), reason(codes), reason_properties())
            .prop_map(|(packet_id, reason, properties)| Ack {
                packet_id,
                reason,
                properties,
            })
            .boxed(),
    }
}

fn subscribe(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let v5 = version == V5;
    let retain_handling = prop_oneof![
        Just(RetainHandling::OnSubscribe),
        Just(RetainHandling::OnNewSubscribe),
        Just(RetainHandling::Never)
    ];
    let options = (qos(), any::<bool>(), any::<bool>(), retain_handling).prop_map(
        move |(qos, no_local, retain_as_published, retain_handling)| {
            if v5 {
                SubscriptionOptions {
                    qos,
                    no_local,
                    retain_as_published,
                    retain_handling,
                }
            } else {
                SubscriptionOptions {
                    qos,
                    ..Default::default()
                }
            }
        },
    );
    let filters = prop::collection::vec(
        (text(), options).prop_map(|(filter, options)| SubscribeFilter { filter, options }),
        1..4,
    );
    let properties = (opt(subscription_id()), users()).prop_map(
        move |(subscription_identifier, user_properties)| {
            if v5 {
                SubscribeProperties {
                    subscription_identifier,
                    user_properties,
                }
            } else {
                SubscribeProperties::default()
            }
        },
    );
    (packet_id(), filters, properties).prop_map(|(packet_id, filters, properties)| {
        Packet::Subscribe(Subscribe {
            packet_id,
            filters,
            properties,
        })
    })
}

fn suback(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let v5 = version == V5;
    let codes = if v5 { SUBACK } else { SUBACK_V311 };
    (
        packet_id(),
        prop::collection::vec(reason(codes), 0..4),
        reason_properties(),
    )
        .prop_map(move |(packet_id, reasons, properties)| {
            let properties = if v5 {
                properties
            } else {
                ReasonProperties::default()
            };
            Packet::SubAck(SubAck {
                packet_id,
                reasons,
                properties,
            })
        })
}

fn unsubscribe(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let v5 = version == V5;
    (packet_id(), prop::collection::vec(text(), 1..4), users()).prop_map(
        move |(packet_id, filters, user_properties)| {
            let user_properties = if v5 { user_properties } else { Vec::new() };
            Packet::Unsubscribe(Unsubscribe {
                packet_id,
                filters,
                user_properties,
            })
        },
    )
}

fn unsuback(version: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let v5 = version == V5;
    (
        packet_id(),
        prop::collection::vec(reason(UNSUBACK), 0..4),
        reason_properties(),
    )
        .prop_map(move |(packet_id, reasons, properties)| {
            if v5 {
                Packet::UnsubAck(UnsubAck {
                    packet_id,
                    reasons,
                    properties,
                })
            } else {
                Packet::UnsubAck(UnsubAck {
                    packet_id,
                    reasons: Vec::new(),
                    properties: Default::default(),
                })
            }
        })
}

fn disconnect_v5() -> impl Strategy<Value = Packet> {
    let properties = (opt(any::<u32>()), opt(text()), users(), opt(text())).prop_map(
        |(session_expiry_interval, reason_string, user_properties, server_reference)| {
            DisconnectProperties {
                session_expiry_interval,
                reason_string,
                user_properties,
                server_reference,
            }
        },
    );
    (reason(DISCONNECT), properties)
        .prop_map(|(reason, properties)| Packet::Disconnect(Disconnect { reason, properties }))
}

fn auth_v5() -> impl Strategy<Value = Packet> {
    let properties = (opt(text()), opt(data()), opt(text()), users()).prop_map(
        |(authentication_method, authentication_data, reason_string, user_properties)| {
            AuthProperties {
                authentication_method,
                authentication_data,
                reason_string,
                user_properties,
            }
        },
    );
    (reason(AUTH), properties)
        .prop_map(|(reason, properties)| Packet::Auth(Auth { reason, properties }))
}

/// Any packet valid in `version`, with canonical values where 3.1.1 cannot say more.
fn packet(version: ProtocolVersion) -> BoxedStrategy<Packet> {
    let common = prop_oneof![
        connect(version),
        connack(version),
        publish(version).prop_map(Packet::Publish),
        ack(version, PUBACK).prop_map(Packet::PubAck),
        ack(version, PUBACK).prop_map(Packet::PubRec),
        ack(version, PUBREL).prop_map(Packet::PubRel),
        ack(version, PUBREL).prop_map(Packet::PubComp),
        subscribe(version),
        suback(version),
        unsubscribe(version),
        unsuback(version),
        Just(Packet::PingReq),
        Just(Packet::PingResp),
    ];
    match version {
        V311 => prop_oneof![
            12 => common,
            1 => Just(Packet::Disconnect(Disconnect::new(ReasonCode::NORMAL_DISCONNECTION))),
        ]
        .boxed(),
        V5 => prop_oneof![13 => common, 1 => disconnect_v5(), 1 => auth_v5()].boxed(),
    }
}

fn version() -> impl Strategy<Value = ProtocolVersion> {
    prop_oneof![Just(V311), Just(V5)]
}

fn versioned_packet() -> impl Strategy<Value = (ProtocolVersion, Packet)> {
    version().prop_flat_map(|v| packet(v).prop_map(move |p| (v, p)))
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn encode(packet: &Packet, version: ProtocolVersion) -> BytesMut {
    let mut buf = BytesMut::new();
    codec::encode(packet, version, &mut buf).expect("generated packets encode");
    buf
}

/// Decodes packets from `buf` until it needs more bytes or fails; it must always make progress.
fn drain(
    buf: &mut BytesMut,
    version: ProtocolVersion,
    max: u32,
) -> Vec<Result<Packet, ReasonCode>> {
    let mut out = Vec::new();
    loop {
        let before = buf.len();
        match codec::decode(buf, version, max) {
            Ok(Some(p)) => {
                assert!(buf.len() < before, "a decoded packet consumed no bytes");
                out.push(Ok(p));
            }
            Ok(None) => return out,
            Err(e) => {
                out.push(Err(e.reason));
                return out;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Properties

proptest! {
    #[test]
    fn round_trip_v311(p in packet(V311)) {
        let bytes = encode(&p, V311);
        prop_assert_eq!(codec::encoded_len(&p, V311), Ok(bytes.len()));
        let mut buf = bytes.clone();
        prop_assert_eq!(codec::decode(&mut buf, V311, u32::MAX), Ok(Some(p)));
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn round_trip_v5(p in packet(V5)) {
        let bytes = encode(&p, V5);
        prop_assert_eq!(codec::encoded_len(&p, V5), Ok(bytes.len()));
        let mut buf = bytes.clone();
        prop_assert_eq!(codec::decode(&mut buf, V5, u32::MAX), Ok(Some(p)));
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn exact_max_packet_size_is_accepted((v, p) in versioned_packet()) {
        let bytes = encode(&p, v);
        let len = u32::try_from(bytes.len()).unwrap();
        prop_assert_eq!(codec::decode(&mut bytes.clone(), v, len), Ok(Some(p)));
        let err = codec::decode(&mut bytes.clone(), v, len - 1).unwrap_err();
        prop_assert_eq!(err.reason, ReasonCode::PACKET_TOO_LARGE);
    }

    #[test]
    fn split_at_every_position((v, p) in versioned_packet()) {
        let bytes = encode(&p, v);
        for at in 0..bytes.len() {
            let mut buf = BytesMut::from(&bytes[..at]);
            prop_assert_eq!(codec::decode(&mut buf, v, u32::MAX), Ok(None), "prefix of {}", at);
            prop_assert_eq!(&buf[..], &bytes[..at], "prefix of {} was touched", at);
            buf.extend_from_slice(&bytes[at..]);
            prop_assert_eq!(codec::decode(&mut buf, v, u32::MAX), Ok(Some(p.clone())), "split at {}", at);
            prop_assert!(buf.is_empty());
        }
    }

    #[test]
    fn concatenated_packets_decode_in_order(
        (v, ps) in version().prop_flat_map(|v| prop::collection::vec(packet(v), 1..6).prop_map(move |ps| (v, ps))),
        tail in 0usize..4,
    ) {
        let mut buf = BytesMut::new();
        for p in &ps {
            codec::encode(p, v, &mut buf).unwrap();
        }
        let total: usize = ps.iter().map(|p| codec::encoded_len(p, v).unwrap()).sum();
        prop_assert_eq!(buf.len(), total);
        // A few bytes of a next packet: they stay in the buffer.
        let next = encode(&Packet::PingReq, v);
        let tail = tail.min(next.len() - 1);
        buf.extend_from_slice(&next[..tail]);
        let decoded = drain(&mut buf, v, u32::MAX);
        prop_assert_eq!(decoded, ps.into_iter().map(Ok).collect::<Vec<_>>());
        prop_assert_eq!(&buf[..], &next[..tail]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        v in version(),
        max in prop_oneof![Just(u32::MAX), 0u32..64],
    ) {
        let mut buf = BytesMut::from(&bytes[..]);
        drain(&mut buf, v, max);
    }

    /// Valid frames with a few bytes changed or the length cut reach deeper than random bytes.
    #[test]
    fn mutated_packets_never_panic(
        (v, p) in versioned_packet(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
        decode_as in version(),
    ) {
        let mut bytes = encode(&p, v).to_vec();
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        let mut buf = BytesMut::from(&bytes[..]);
        drain(&mut buf, decode_as, u32::MAX);
        let mut buf = BytesMut::from(&bytes[..cut.index(bytes.len() + 1)]);
        drain(&mut buf, decode_as, u32::MAX);
    }

    #[test]
    fn encode_publish_with_overrides(
        base in publish(V5),
        topic_alias in opt(1..=u16::MAX),
        message_expiry_interval in opt(any::<u32>()),
        subscription_identifiers in prop::collection::vec(subscription_id(), 0..3),
    ) {
        let topic = if base.topic.is_empty() && topic_alias.is_none() { "t" } else { base.topic.as_str() };
        let out = OutgoingPublish {
            dup: base.dup,
            qos: base.qos,
            retain: base.retain,
            topic,
            packet_id: base.packet_id,
            payload: &base.payload,
            properties: &base.properties,
            topic_alias,
            message_expiry_interval,
            subscription_identifiers: &subscription_identifiers,
        };
        let mut buf = BytesMut::new();
        codec::encode_publish(&out, V5, &mut buf).unwrap();
        prop_assert_eq!(codec::publish_len(&out, V5), Ok(buf.len()));

        let expected = Publish {
            topic: topic.to_owned(),
            properties: PublishProperties {
                topic_alias,
                message_expiry_interval,
                subscription_identifiers: subscription_identifiers.clone(),
                ..base.properties.clone()
            },
            ..base.clone()
        };
        prop_assert_eq!(codec::decode(&mut buf, V5, u32::MAX), Ok(Some(Packet::Publish(expected.clone()))));

        // In 3.1.1 the properties are dropped.
        if !topic.is_empty() {
            let mut buf = BytesMut::new();
            codec::encode_publish(&out, V311, &mut buf).unwrap();
            let v311 = Publish { properties: PublishProperties::default(), ..expected };
            prop_assert_eq!(codec::decode(&mut buf, V311, u32::MAX), Ok(Some(Packet::Publish(v311))));
        }
    }

    /// `encode(Packet::Publish)` and `encode_publish` of its view give the same bytes (or error).
    #[test]
    fn encode_and_encode_publish_agree(p in publish(V5), v in version()) {
        let mut a = BytesMut::new();
        let mut b = BytesMut::new();
        let ra = codec::encode(&Packet::Publish(p.clone()), v, &mut a);
        let rb = codec::encode_publish(&OutgoingPublish::from(&p), v, &mut b);
        prop_assert_eq!(ra, rb);
        prop_assert_eq!(a, b);
    }
}
