//! SUBSCRIBE and SUBACK (MQTT 5.0 §3.8, §3.9; MQTT 3.1.1 §3.8, §3.9).

use bytes::Bytes;

use super::error::{DecodeError, EncodeError};
use super::packet::{
    ProtocolVersion, QoS, ReasonProperties, RetainHandling, SubAck, Subscribe, SubscribeFilter,
    SubscribeProperties, SubscriptionOptions,
};
use super::primitives::{
    Sink, check_reason_code, put_packet_id, put_string, read_packet_id, read_reason_code,
    read_string, read_u8,
};
use super::properties;
use super::reason::ReasonCode;

/// MQTT 5.0 §3.9.3.
const SUBACK_REASONS: &[ReasonCode] = &[
    ReasonCode::GRANTED_QOS_0,
    ReasonCode::GRANTED_QOS_1,
    ReasonCode::GRANTED_QOS_2,
    ReasonCode::UNSPECIFIED_ERROR,
    ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR,
    ReasonCode::NOT_AUTHORIZED,
    ReasonCode::TOPIC_FILTER_INVALID,
    ReasonCode::PACKET_IDENTIFIER_IN_USE,
    ReasonCode::QUOTA_EXCEEDED,
    ReasonCode::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
    ReasonCode::SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
    ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
];

/// MQTT 3.1.1 §3.9.3: granted QoS or failure.
const V311_SUBACK_CODES: &[ReasonCode] = &[
    ReasonCode::GRANTED_QOS_0,
    ReasonCode::GRANTED_QOS_1,
    ReasonCode::GRANTED_QOS_2,
    ReasonCode::UNSPECIFIED_ERROR,
];

const QOS_MASK: u8 = 0b0000_0011;
const NO_LOCAL: u8 = 0b0000_0100;
const RETAIN_AS_PUBLISHED: u8 = 0b0000_1000;
const RETAIN_HANDLING_SHIFT: u8 = 4;
const V5_RESERVED: u8 = 0b1100_0000;

fn decode_options(byte: u8, version: ProtocolVersion) -> Result<SubscriptionOptions, DecodeError> {
    let qos = QoS::from_u8(byte & QOS_MASK).ok_or(DecodeError::malformed("subscription QoS 3"))?;
    if version == ProtocolVersion::V311 {
        if byte & !QOS_MASK != 0 {
            return Err(DecodeError::malformed(
                "reserved subscription option bits set",
            ));
        }
        return Ok(SubscriptionOptions {
            qos,
            ..Default::default()
        });
    }
    if byte & V5_RESERVED != 0 {
        return Err(DecodeError::malformed(
            "reserved subscription option bits set",
        ));
    }
    let retain_handling = match (byte >> RETAIN_HANDLING_SHIFT) & 0b11 {
        0 => RetainHandling::OnSubscribe,
        1 => RetainHandling::OnNewSubscribe,
        2 => RetainHandling::Never,
        _ => return Err(DecodeError::malformed("retain handling 3")),
    };
    Ok(SubscriptionOptions {
        qos,
        no_local: byte & NO_LOCAL != 0,
        retain_as_published: byte & RETAIN_AS_PUBLISHED != 0,
        retain_handling,
    })
}

fn encode_options(o: SubscriptionOptions, version: ProtocolVersion) -> u8 {
    let mut byte = o.qos as u8;
    if version == ProtocolVersion::V5 {
        byte |= (o.retain_handling as u8) << RETAIN_HANDLING_SHIFT;
        if o.no_local {
            byte |= NO_LOCAL;
        }
        if o.retain_as_published {
            byte |= RETAIN_AS_PUBLISHED;
        }
    }
    byte
}

pub(crate) fn decode_subscribe(
    buf: &mut Bytes,
    version: ProtocolVersion,
) -> Result<Subscribe, DecodeError> {
    let packet_id = read_packet_id(buf)?;
    let properties = match version {
        ProtocolVersion::V5 => properties::read_subscribe(buf)?,
        ProtocolVersion::V311 => SubscribeProperties::default(),
    };
    let mut filters = Vec::new();
    while !buf.is_empty() {
        let filter = read_string(buf)?;
        let options = decode_options(read_u8(buf)?, version)?;
        filters.push(SubscribeFilter { filter, options });
    }
    if filters.is_empty() {
        return Err(DecodeError::protocol("SUBSCRIBE without topic filters"));
    }
    Ok(Subscribe {
        packet_id,
        filters,
        properties,
    })
}

pub(crate) fn write_subscribe<S: Sink>(
    sub: &Subscribe,
    version: ProtocolVersion,
    s: &mut S,
) -> Result<(), EncodeError> {
    if sub.filters.is_empty() {
        return Err(EncodeError::NoFilters {
            packet: "SUBSCRIBE",
        });
    }
    put_packet_id(s, sub.packet_id)?;
    if version == ProtocolVersion::V5 {
        s.put_block(&sub.properties)?;
    }
    for f in &sub.filters {
        put_string(s, &f.filter)?;
        s.put_u8(encode_options(f.options, version));
    }
    Ok(())
}

pub(crate) fn decode_suback(
    buf: &mut Bytes,
    version: ProtocolVersion,
) -> Result<SubAck, DecodeError> {
    let packet_id = read_packet_id(buf)?;
    let (properties, allowed) = match version {
        ProtocolVersion::V5 => (properties::read_reason(buf)?, SUBACK_REASONS),
        ProtocolVersion::V311 => (ReasonProperties::default(), V311_SUBACK_CODES),
    };
    let mut reasons = Vec::with_capacity(buf.len());
    while !buf.is_empty() {
        reasons.push(read_reason_code(
            buf,
            allowed,
            "reason code not allowed in SUBACK",
        )?);
    }
    Ok(SubAck {
        packet_id,
        reasons,
        properties,
    })
}

pub(crate) fn write_suback<S: Sink>(
    ack: &SubAck,
    version: ProtocolVersion,
    s: &mut S,
) -> Result<(), EncodeError> {
    put_packet_id(s, ack.packet_id)?;
    if version == ProtocolVersion::V5 {
        s.put_block(&ack.properties)?;
    }
    for &reason in &ack.reasons {
        check_reason_code(reason, SUBACK_REASONS, "SUBACK")?;
        // MQTT 3.1.1 has a single failure code.
        let code = if version == ProtocolVersion::V311 && reason.is_error() {
            ReasonCode::UNSPECIFIED_ERROR
        } else {
            reason
        };
        s.put_u8(code.0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Packet;
    use crate::codec::test_util::{assert_error, decode_one, encode_vec, round_trip};
    use ProtocolVersion::*;

    fn filter(f: &str, options: SubscriptionOptions) -> SubscribeFilter {
        SubscribeFilter {
            filter: f.into(),
            options,
        }
    }

    #[test]
    fn v311_subscribe_bytes() {
        let bytes = [
            0x82, 14, 0, 10, // packet id 10
            0, 3, b'a', b'/', b'b', 1, // "a/b" QoS 1
            0, 3, b'c', b'/', b'#', 2, // "c/#" QoS 2
        ];
        let qos = |qos| SubscriptionOptions {
            qos,
            ..Default::default()
        };
        let p = Packet::Subscribe(Subscribe {
            packet_id: 10,
            filters: vec![
                filter("a/b", qos(QoS::AtLeastOnce)),
                filter("c/#", qos(QoS::ExactlyOnce)),
            ],
            properties: SubscribeProperties::default(),
        });
        assert_eq!(decode_one(&bytes, V311), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V311), bytes);
    }

    #[test]
    fn v5_subscribe_bytes() {
        let bytes = [
            0x82,
            9,
            0,
            1, // packet id 1
            2,
            0x0B,
            42, // subscription identifier 42
            0,
            1,
            b'#',        // "#"
            0b0010_1110, // retain handling 2, retain as published, no local, QoS 2
        ];
        let p = Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![filter(
                "#",
                SubscriptionOptions {
                    qos: QoS::ExactlyOnce,
                    no_local: true,
                    retain_as_published: true,
                    retain_handling: RetainHandling::Never,
                },
            )],
            properties: SubscribeProperties {
                subscription_identifier: Some(42),
                user_properties: vec![],
            },
        });
        assert_eq!(decode_one(&bytes, V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), bytes);
    }

    #[test]
    fn subscribe_filter_syntax_is_left_to_the_broker() {
        // "a/#/b" is not a valid filter, but it is a valid string: SUBACK answers for it.
        let bytes = [0x82, 10, 0, 1, 0, 5, b'a', b'/', b'#', b'/', b'b', 0];
        assert!(decode_one(&bytes, V311).is_ok());
    }

    #[test]
    fn subscribe_without_filters_is_protocol_error() {
        assert_error(&[0x82, 2, 0, 1], V311, ReasonCode::PROTOCOL_ERROR);
        assert_error(&[0x82, 3, 0, 1, 0], V5, ReasonCode::PROTOCOL_ERROR);
    }

    #[test]
    fn subscribe_options_reserved_bits_are_malformed() {
        assert_error(
            &[0x82, 7, 0, 1, 0, 0, 1, b'a', 0x40],
            V5,
            ReasonCode::MALFORMED_PACKET,
        );
        assert_error(
            &[0x82, 7, 0, 1, 0, 0, 1, b'a', 0x80],
            V5,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn subscribe_retain_handling_3_is_malformed() {
        assert_error(
            &[0x82, 7, 0, 1, 0, 0, 1, b'a', 0x30],
            V5,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn subscribe_qos3_is_malformed() {
        assert_error(
            &[0x82, 7, 0, 1, 0, 0, 1, b'a', 3],
            V5,
            ReasonCode::MALFORMED_PACKET,
        );
        assert_error(
            &[0x82, 6, 0, 1, 0, 1, b'a', 3],
            V311,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn v311_subscribe_options_upper_bits_are_malformed() {
        for bit in 2..8 {
            let opts = 1u8 << bit;
            assert_error(
                &[0x82, 6, 0, 1, 0, 1, b'a', opts],
                V311,
                ReasonCode::MALFORMED_PACKET,
            );
        }
    }

    #[test]
    fn subscribe_packet_id_0_is_malformed() {
        assert_error(
            &[0x82, 6, 0, 0, 0, 1, b'a', 0],
            V311,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn subscribe_filter_without_options_is_malformed() {
        assert_error(
            &[0x82, 5, 0, 1, 0, 1, b'a'],
            V311,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn subscribe_subscription_identifier_0_is_protocol_error() {
        assert_error(
            &[0x82, 9, 0, 1, 2, 0x0B, 0, 0, 1, b'a', 0],
            V5,
            ReasonCode::PROTOCOL_ERROR,
        );
    }

    #[test]
    fn subscribe_duplicate_subscription_identifier_is_protocol_error() {
        let bytes = [0x82, 11, 0, 1, 4, 0x0B, 1, 0x0B, 2, 0, 1, b'a', 0];
        assert_error(&bytes, V5, ReasonCode::PROTOCOL_ERROR);
    }

    #[test]
    fn subscribe_without_filters_is_encode_error() {
        let p = Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![],
            properties: Default::default(),
        });
        assert_eq!(
            crate::codec::encoded_len(&p, V5),
            Err(EncodeError::NoFilters {
                packet: "SUBSCRIBE"
            })
        );
    }

    #[test]
    fn v311_suback_bytes() {
        let bytes = [0x90, 6, 0, 10, 0, 1, 2, 0x80];
        let p = Packet::SubAck(SubAck {
            packet_id: 10,
            reasons: vec![
                ReasonCode::GRANTED_QOS_0,
                ReasonCode::GRANTED_QOS_1,
                ReasonCode::GRANTED_QOS_2,
                ReasonCode::UNSPECIFIED_ERROR,
            ],
            properties: ReasonProperties::default(),
        });
        assert_eq!(decode_one(&bytes, V311), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V311), bytes);
    }

    #[test]
    fn v311_suback_maps_v5_failures_to_0x80() {
        let p = Packet::SubAck(SubAck {
            packet_id: 1,
            reasons: vec![ReasonCode::NOT_AUTHORIZED, ReasonCode::GRANTED_QOS_1],
            properties: ReasonProperties::default(),
        });
        assert_eq!(encode_vec(&p, V311), [0x90, 4, 0, 1, 0x80, 1]);
    }

    #[test]
    fn v311_suback_v5_only_code_is_malformed() {
        assert_error(&[0x90, 3, 0, 1, 0x87], V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn v5_suback_bytes() {
        let bytes = [0x90, 5, 0, 10, 0, 0x01, 0xA2];
        let p = Packet::SubAck(SubAck {
            packet_id: 10,
            reasons: vec![
                ReasonCode::GRANTED_QOS_1,
                ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
            ],
            properties: ReasonProperties::default(),
        });
        assert_eq!(decode_one(&bytes, V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), bytes);
        let with_props = Packet::SubAck(SubAck {
            properties: ReasonProperties {
                reason_string: Some("why".into()),
                user_properties: vec![("a".into(), "b".into())],
            },
            ..SubAck {
                packet_id: 10,
                reasons: vec![ReasonCode::QUOTA_EXCEEDED],
                properties: Default::default(),
            }
        });
        round_trip(&with_props, V5);
    }

    #[test]
    fn suback_packet_id_0_is_malformed() {
        assert_error(&[0x90, 3, 0, 0, 0], V311, ReasonCode::MALFORMED_PACKET);
        assert_error(&[0x90, 4, 0, 0, 0, 0], V5, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn v5_suback_reason_not_allowed_is_malformed() {
        assert_error(&[0x90, 4, 0, 1, 0, 0x04], V5, ReasonCode::MALFORMED_PACKET);
    }
}
