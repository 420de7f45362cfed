//! DISCONNECT (MQTT 5.0 §3.14; MQTT 3.1.1 §3.14, where it is empty).
//!
//! In MQTT 5.0 a remaining length of 0 means "normal disconnection" without properties, and of 1
//! a reason code without properties (§3.14.2.1). The encoder uses the shortest form.

use bytes::Bytes;

use super::error::{DecodeError, EncodeError};
use super::packet::{Disconnect, DisconnectProperties, ProtocolVersion};
use super::primitives::{Sink, check_reason_code, read_reason_code};
use super::properties;
use super::reason::ReasonCode;

/// MQTT 5.0 §3.14.2.1.
const REASONS: &[ReasonCode] = &[
    ReasonCode::NORMAL_DISCONNECTION,
    ReasonCode::DISCONNECT_WITH_WILL,
    ReasonCode::UNSPECIFIED_ERROR,
    ReasonCode::MALFORMED_PACKET,
    ReasonCode::PROTOCOL_ERROR,
    ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR,
    ReasonCode::NOT_AUTHORIZED,
    ReasonCode::SERVER_BUSY,
    ReasonCode::SERVER_SHUTTING_DOWN,
    ReasonCode::KEEP_ALIVE_TIMEOUT,
    ReasonCode::SESSION_TAKEN_OVER,
    ReasonCode::TOPIC_FILTER_INVALID,
    ReasonCode::TOPIC_NAME_INVALID,
    ReasonCode::RECEIVE_MAXIMUM_EXCEEDED,
    ReasonCode::TOPIC_ALIAS_INVALID,
    ReasonCode::PACKET_TOO_LARGE,
    ReasonCode::MESSAGE_RATE_TOO_HIGH,
    ReasonCode::QUOTA_EXCEEDED,
    ReasonCode::ADMINISTRATIVE_ACTION,
    ReasonCode::PAYLOAD_FORMAT_INVALID,
    ReasonCode::RETAIN_NOT_SUPPORTED,
    ReasonCode::QOS_NOT_SUPPORTED,
    ReasonCode::USE_ANOTHER_SERVER,
    ReasonCode::SERVER_MOVED,
    ReasonCode::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
    ReasonCode::CONNECTION_RATE_EXCEEDED,
    ReasonCode::MAXIMUM_CONNECT_TIME,
    ReasonCode::SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
    ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
];

/// In MQTT 3.1.1 the body is empty (leftover bytes are refused by the caller).
pub(crate) fn decode(buf: &mut Bytes, version: ProtocolVersion) -> Result<Disconnect, DecodeError> {
    if version == ProtocolVersion::V311 || buf.is_empty() {
        return Ok(Disconnect::new(ReasonCode::NORMAL_DISCONNECTION));
    }
    let reason = read_reason_code(buf, REASONS, "reason code not allowed in DISCONNECT")?;
    let properties = if buf.is_empty() {
        DisconnectProperties::default()
    } else {
        properties::read_disconnect(buf)?
    };
    Ok(Disconnect { reason, properties })
}

pub(crate) fn write<S: Sink>(
    d: &Disconnect,
    version: ProtocolVersion,
    s: &mut S,
) -> Result<(), EncodeError> {
    if version == ProtocolVersion::V311 {
        return Ok(());
    }
    check_reason_code(d.reason, REASONS, "DISCONNECT")?;
    let no_properties = d.properties == DisconnectProperties::default();
    if d.reason != ReasonCode::NORMAL_DISCONNECTION || !no_properties {
        s.put_u8(d.reason.0);
    }
    if !no_properties {
        s.put_block(&d.properties)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Packet;
    use crate::codec::test_util::{assert_error, decode_one, encode_vec, round_trip};
    use ProtocolVersion::*;

    #[test]
    fn v311_disconnect_bytes() {
        let p = Packet::Disconnect(Disconnect::new(ReasonCode::NORMAL_DISCONNECTION));
        assert_eq!(decode_one(&[0xE0, 0], V311), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V311), [0xE0, 0]);
        // The reason is an MQTT 5.0 field: not written.
        let p = Packet::Disconnect(Disconnect::new(ReasonCode::SERVER_SHUTTING_DOWN));
        assert_eq!(encode_vec(&p, V311), [0xE0, 0]);
    }

    #[test]
    fn v311_disconnect_with_payload_is_malformed() {
        assert_error(&[0xE0, 1, 0], V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn v5_disconnect_remaining_length_0_is_normal() {
        let p = Packet::Disconnect(Disconnect::new(ReasonCode::NORMAL_DISCONNECTION));
        assert_eq!(decode_one(&[0xE0, 0], V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), [0xE0, 0]);
        assert_eq!(decode_one(&[0xE0, 1, 0], V5), Ok(p.clone()));
        assert_eq!(decode_one(&[0xE0, 2, 0, 0], V5), Ok(p));
    }

    #[test]
    fn v5_disconnect_bytes() {
        let p = Packet::Disconnect(Disconnect::new(ReasonCode::KEEP_ALIVE_TIMEOUT));
        assert_eq!(encode_vec(&p, V5), [0xE0, 1, 0x8D]);
        assert_eq!(decode_one(&[0xE0, 1, 0x8D], V5), Ok(p));
        let bytes = [0xE0, 11, 0x9C, 9, 0x11, 0, 0, 0, 0, 0x1C, 0, 1, b's'];
        let p = Packet::Disconnect(Disconnect {
            reason: ReasonCode::USE_ANOTHER_SERVER,
            properties: DisconnectProperties {
                session_expiry_interval: Some(0),
                server_reference: Some("s".into()),
                ..Default::default()
            },
        });
        assert_eq!(decode_one(&bytes, V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), bytes);
        let all = Packet::Disconnect(Disconnect {
            reason: ReasonCode::NORMAL_DISCONNECTION,
            properties: DisconnectProperties {
                session_expiry_interval: Some(1),
                reason_string: Some("bye".into()),
                user_properties: vec![("a".into(), "b".into())],
                server_reference: Some("elsewhere".into()),
            },
        });
        round_trip(&all, V5);
    }

    #[test]
    fn disconnect_reason_not_allowed_is_malformed() {
        // 0x10 (no matching subscribers) is a PUBACK reason.
        assert_error(&[0xE0, 1, 0x10], V5, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn disconnect_property_not_allowed_is_malformed() {
        assert_error(&[0xE0, 4, 0, 2, 0x01, 0], V5, ReasonCode::MALFORMED_PACKET);
    }
}
