//! UNSUBSCRIBE and UNSUBACK (MQTT 5.0 §3.10, §3.11; MQTT 3.1.1 §3.10, §3.11).

use bytes::Bytes;

use super::error::{DecodeError, EncodeError};
use super::packet::{ProtocolVersion, UnsubAck, Unsubscribe};
use super::primitives::{
    Sink, check_reason_code, put_packet_id, put_string, read_packet_id, read_reason_code,
    read_string,
};
use super::properties::{self, UserProperties};
use super::reason::ReasonCode;

/// MQTT 5.0 §3.11.3.
const UNSUBACK_REASONS: &[ReasonCode] = &[
    ReasonCode::SUCCESS,
    ReasonCode::NO_SUBSCRIPTION_EXISTED,
    ReasonCode::UNSPECIFIED_ERROR,
    ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR,
    ReasonCode::NOT_AUTHORIZED,
    ReasonCode::TOPIC_FILTER_INVALID,
    ReasonCode::PACKET_IDENTIFIER_IN_USE,
];

pub(crate) fn decode_unsubscribe(
    buf: &mut Bytes,
    version: ProtocolVersion,
) -> Result<Unsubscribe, DecodeError> {
    let packet_id = read_packet_id(buf)?;
    let user_properties = match version {
        ProtocolVersion::V5 => properties::read_user_properties(buf)?,
        ProtocolVersion::V311 => Vec::new(),
    };
    let mut filters = Vec::new();
    while !buf.is_empty() {
        filters.push(read_string(buf)?);
    }
    if filters.is_empty() {
        return Err(DecodeError::protocol("UNSUBSCRIBE without topic filters"));
    }
    Ok(Unsubscribe {
        packet_id,
        filters,
        user_properties,
    })
}

pub(crate) fn write_unsubscribe<S: Sink>(
    unsub: &Unsubscribe,
    version: ProtocolVersion,
    s: &mut S,
) -> Result<(), EncodeError> {
    if unsub.filters.is_empty() {
        return Err(EncodeError::NoFilters {
            packet: "UNSUBSCRIBE",
        });
    }
    put_packet_id(s, unsub.packet_id)?;
    if version == ProtocolVersion::V5 {
        s.put_block(&UserProperties(&unsub.user_properties))?;
    }
    for filter in &unsub.filters {
        put_string(s, filter)?;
    }
    Ok(())
}

/// In MQTT 3.1.1 UNSUBACK carries only the packet identifier.
pub(crate) fn decode_unsuback(
    buf: &mut Bytes,
    version: ProtocolVersion,
) -> Result<UnsubAck, DecodeError> {
    let packet_id = read_packet_id(buf)?;
    if version == ProtocolVersion::V311 {
        return Ok(UnsubAck {
            packet_id,
            reasons: Vec::new(),
            properties: Default::default(),
        });
    }
    let properties = properties::read_reason(buf)?;
    let mut reasons = Vec::with_capacity(buf.len());
    while !buf.is_empty() {
        reasons.push(read_reason_code(
            buf,
            UNSUBACK_REASONS,
            "reason code not allowed in UNSUBACK",
        )?);
    }
    Ok(UnsubAck {
        packet_id,
        reasons,
        properties,
    })
}

pub(crate) fn write_unsuback<S: Sink>(
    ack: &UnsubAck,
    version: ProtocolVersion,
    s: &mut S,
) -> Result<(), EncodeError> {
    put_packet_id(s, ack.packet_id)?;
    if version == ProtocolVersion::V5 {
        s.put_block(&ack.properties)?;
        for &reason in &ack.reasons {
            check_reason_code(reason, UNSUBACK_REASONS, "UNSUBACK")?;
            s.put_u8(reason.0);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::test_util::{assert_error, decode_one, encode_vec, round_trip};
    use crate::codec::{Packet, ReasonProperties};
    use ProtocolVersion::*;

    #[test]
    fn v311_unsubscribe_bytes() {
        let bytes = [0xA2, 9, 0, 5, 0, 1, b'a', 0, 2, b'b', b'/'];
        let p = Packet::Unsubscribe(Unsubscribe {
            packet_id: 5,
            filters: vec!["a".into(), "b/".into()],
            user_properties: vec![],
        });
        assert_eq!(decode_one(&bytes, V311), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V311), bytes);
    }

    #[test]
    fn v5_unsubscribe_bytes() {
        let bytes = [
            0xA2, 14, 0, 5, 7, 0x26, 0, 1, b'k', 0, 1, b'v', 0, 2, b'a', b'+',
        ];
        let p = Packet::Unsubscribe(Unsubscribe {
            packet_id: 5,
            filters: vec!["a+".into()],
            user_properties: vec![("k".into(), "v".into())],
        });
        assert_eq!(decode_one(&bytes, V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), bytes);
    }

    #[test]
    fn unsubscribe_without_filters_is_protocol_error() {
        assert_error(&[0xA2, 2, 0, 5], V311, ReasonCode::PROTOCOL_ERROR);
        assert_error(&[0xA2, 3, 0, 5, 0], V5, ReasonCode::PROTOCOL_ERROR);
        let p = Packet::Unsubscribe(Unsubscribe {
            packet_id: 1,
            filters: vec![],
            user_properties: vec![],
        });
        assert_eq!(
            crate::codec::encoded_len(&p, V311),
            Err(EncodeError::NoFilters {
                packet: "UNSUBSCRIBE"
            })
        );
    }

    #[test]
    fn unsubscribe_packet_id_0_is_malformed() {
        assert_error(
            &[0xA2, 5, 0, 0, 0, 1, b'a'],
            V311,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn unsubscribe_property_not_allowed_is_malformed() {
        assert_error(
            &[0xA2, 8, 0, 5, 2, 0x0B, 1, 0, 1, b'a'],
            V5,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn v311_unsuback_bytes() {
        let p = Packet::UnsubAck(UnsubAck {
            packet_id: 9,
            reasons: vec![],
            properties: Default::default(),
        });
        assert_eq!(decode_one(&[0xB0, 2, 0, 9], V311), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V311), [0xB0, 2, 0, 9]);
        // MQTT 3.1.1 has no reason codes: they are not written.
        let with_reasons = Packet::UnsubAck(UnsubAck {
            packet_id: 9,
            reasons: vec![ReasonCode::SUCCESS],
            properties: Default::default(),
        });
        assert_eq!(encode_vec(&with_reasons, V311), [0xB0, 2, 0, 9]);
    }

    #[test]
    fn v311_unsuback_with_payload_is_malformed() {
        assert_error(&[0xB0, 3, 0, 9, 0], V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn v5_unsuback_bytes() {
        let bytes = [0xB0, 5, 0, 9, 0, 0x00, 0x11];
        let p = Packet::UnsubAck(UnsubAck {
            packet_id: 9,
            reasons: vec![ReasonCode::SUCCESS, ReasonCode::NO_SUBSCRIPTION_EXISTED],
            properties: ReasonProperties::default(),
        });
        assert_eq!(decode_one(&bytes, V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), bytes);
        let with_props = Packet::UnsubAck(UnsubAck {
            properties: ReasonProperties {
                reason_string: Some("r".into()),
                user_properties: vec![],
            },
            ..UnsubAck {
                packet_id: 9,
                reasons: vec![ReasonCode::NOT_AUTHORIZED],
                properties: Default::default(),
            }
        });
        round_trip(&with_props, V5);
    }

    #[test]
    fn unsuback_packet_id_0_is_malformed() {
        assert_error(&[0xB0, 2, 0, 0], V311, ReasonCode::MALFORMED_PACKET);
        assert_error(&[0xB0, 4, 0, 0, 0, 0], V5, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn v5_unsuback_reason_not_allowed_is_malformed() {
        assert_error(&[0xB0, 4, 0, 9, 0, 0x10], V5, ReasonCode::MALFORMED_PACKET);
    }
}
