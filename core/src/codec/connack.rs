//! CONNACK (MQTT 3.1.1 §3.2, MQTT 5.0 §3.2).

use bytes::Bytes;

use super::error::{DecodeError, EncodeError};
use super::packet::{ConnAck, ConnAckProperties, ProtocolVersion};
use super::primitives::{Sink, check_reason_code, read_reason_code, read_u8};
use super::properties;
use super::reason::ReasonCode;

/// The CONNACK reason codes of MQTT 5.0 §3.2.2.2.
const REASONS: &[ReasonCode] = &[
    ReasonCode::SUCCESS,
    ReasonCode::UNSPECIFIED_ERROR,
    ReasonCode::MALFORMED_PACKET,
    ReasonCode::PROTOCOL_ERROR,
    ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR,
    ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
    ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
    ReasonCode::BAD_USER_NAME_OR_PASSWORD,
    ReasonCode::NOT_AUTHORIZED,
    ReasonCode::SERVER_UNAVAILABLE,
    ReasonCode::SERVER_BUSY,
    ReasonCode::BANNED,
    ReasonCode::BAD_AUTHENTICATION_METHOD,
    ReasonCode::TOPIC_NAME_INVALID,
    ReasonCode::PACKET_TOO_LARGE,
    ReasonCode::QUOTA_EXCEEDED,
    ReasonCode::PAYLOAD_FORMAT_INVALID,
    ReasonCode::RETAIN_NOT_SUPPORTED,
    ReasonCode::QOS_NOT_SUPPORTED,
    ReasonCode::USE_ANOTHER_SERVER,
    ReasonCode::SERVER_MOVED,
    ReasonCode::CONNECTION_RATE_EXCEEDED,
];

const SESSION_PRESENT: u8 = 0x01;

pub(crate) fn decode(buf: &mut Bytes, version: ProtocolVersion) -> Result<ConnAck, DecodeError> {
    let flags = read_u8(buf)?;
    if flags & !SESSION_PRESENT != 0 {
        return Err(DecodeError::malformed("CONNACK reserved flags set"));
    }
    let session_present = flags & SESSION_PRESENT != 0;
    let (reason, properties) = match version {
        ProtocolVersion::V311 => {
            let reason = ReasonCode::from_v3_connack(read_u8(buf)?)
                .ok_or(DecodeError::malformed("CONNACK return code above 5"))?;
            (reason, ConnAckProperties::default())
        }
        ProtocolVersion::V5 => {
            let reason = read_reason_code(buf, REASONS, "reason code not allowed in CONNACK")?;
            (reason, properties::read_connack(buf)?)
        }
    };
    Ok(ConnAck {
        session_present,
        reason,
        properties,
    })
}

pub(crate) fn write<S: Sink>(
    c: &ConnAck,
    version: ProtocolVersion,
    s: &mut S,
) -> Result<(), EncodeError> {
    s.put_u8(if c.session_present {
        SESSION_PRESENT
    } else {
        0
    });
    match version {
        ProtocolVersion::V311 => s.put_u8(c.reason.to_v3_connack()),
        ProtocolVersion::V5 => {
            check_reason_code(c.reason, REASONS, "CONNACK")?;
            s.put_u8(c.reason.0);
            s.put_block(&c.properties)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Packet;
    use crate::codec::packet::QoS;
    use crate::codec::test_util::{assert_error, decode_one, encode_vec, round_trip};
    use ProtocolVersion::*;

    fn connack(session_present: bool, reason: ReasonCode) -> Packet {
        Packet::ConnAck(ConnAck {
            session_present,
            reason,
            properties: Default::default(),
        })
    }

    #[test]
    fn v311_connack_bytes() {
        let p = connack(true, ReasonCode::SUCCESS);
        assert_eq!(encode_vec(&p, V311), [0x20, 2, 1, 0]);
        assert_eq!(decode_one(&[0x20, 2, 1, 0], V311), Ok(p));
        let p = connack(false, ReasonCode::NOT_AUTHORIZED);
        assert_eq!(encode_vec(&p, V311), [0x20, 2, 0, 5]);
        assert_eq!(decode_one(&[0x20, 2, 0, 5], V311), Ok(p));
    }

    #[test]
    fn v311_connack_maps_v5_reasons_to_return_codes() {
        let p = connack(false, ReasonCode::BANNED);
        assert_eq!(encode_vec(&p, V311), [0x20, 2, 0, 5]);
        let p = connack(false, ReasonCode::SERVER_BUSY);
        assert_eq!(encode_vec(&p, V311), [0x20, 2, 0, 3]);
    }

    #[test]
    fn v311_connack_return_code_above_5_is_malformed() {
        assert_error(&[0x20, 2, 0, 6], V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn connack_session_present_reserved_bits_are_malformed() {
        assert_error(&[0x20, 2, 2, 0], V311, ReasonCode::MALFORMED_PACKET);
        assert_error(&[0x20, 3, 0x80, 0, 0], V5, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn v5_connack_bytes() {
        let bytes = [
            0x20, 13, 0, 0x00, // not present, success
            10,   // properties
            0x24, 1, // maximum QoS 1
            0x12, 0, 2, b'i', b'd', // assigned client identifier
            0x13, 0, 30, // server keep alive
        ];
        let p = Packet::ConnAck(ConnAck {
            session_present: false,
            reason: ReasonCode::SUCCESS,
            properties: ConnAckProperties {
                maximum_qos: Some(QoS::AtLeastOnce),
                assigned_client_identifier: Some("id".into()),
                server_keep_alive: Some(30),
                ..Default::default()
            },
        });
        assert_eq!(decode_one(&bytes, V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), bytes);
        let bare = connack(true, ReasonCode::BAD_AUTHENTICATION_METHOD);
        assert_eq!(encode_vec(&bare, V5), [0x20, 3, 1, 0x8C, 0]);
    }

    #[test]
    fn v5_connack_all_properties_round_trip() {
        let p = Packet::ConnAck(ConnAck {
            session_present: true,
            reason: ReasonCode::SUCCESS,
            properties: ConnAckProperties {
                session_expiry_interval: Some(1),
                receive_maximum: Some(2),
                maximum_qos: Some(QoS::AtMostOnce),
                retain_available: Some(false),
                maximum_packet_size: Some(3),
                assigned_client_identifier: Some("a".into()),
                topic_alias_maximum: Some(4),
                reason_string: Some("r".into()),
                user_properties: vec![("k".into(), "v".into())],
                wildcard_subscription_available: Some(true),
                subscription_identifiers_available: Some(true),
                shared_subscription_available: Some(false),
                server_keep_alive: Some(5),
                response_information: Some("ri".into()),
                server_reference: Some("sr".into()),
                authentication_method: Some("m".into()),
                authentication_data: Some(Bytes::from_static(b"d")),
            },
        });
        round_trip(&p, V5);
    }

    #[test]
    fn connack_reason_not_allowed_is_malformed() {
        // 0x04 (disconnect with will) is a DISCONNECT reason.
        assert_error(&[0x20, 3, 0, 0x04, 0], V5, ReasonCode::MALFORMED_PACKET);
        assert_eq!(
            crate::codec::encoded_len(&connack(false, ReasonCode::DISCONNECT_WITH_WILL), V5),
            Err(EncodeError::ReasonNotAllowed {
                packet: "CONNACK",
                reason: ReasonCode::DISCONNECT_WITH_WILL
            })
        );
    }

    #[test]
    fn connack_maximum_qos_2_is_protocol_error() {
        assert_error(&[0x20, 5, 0, 0, 2, 0x24, 2], V5, ReasonCode::PROTOCOL_ERROR);
    }

    #[test]
    fn connack_boolean_property_not_0_or_1_is_protocol_error() {
        for id in [0x25, 0x28, 0x29, 0x2A] {
            assert_error(&[0x20, 5, 0, 0, 2, id, 2], V5, ReasonCode::PROTOCOL_ERROR);
        }
    }

    #[test]
    fn v5_connack_without_property_length_is_malformed() {
        assert_error(&[0x20, 2, 0, 0], V5, ReasonCode::MALFORMED_PACKET);
    }
}
