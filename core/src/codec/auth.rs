//! AUTH (MQTT 5.0 §3.15); it does not exist in MQTT 3.1.1.
//!
//! A remaining length of 0 means `SUCCESS` without properties; otherwise the reason code and a
//! property block are both present.

use bytes::Bytes;

use super::error::{DecodeError, EncodeError};
use super::packet::{Auth, AuthProperties, ProtocolVersion};
use super::primitives::{Sink, check_reason_code, read_reason_code};
use super::properties;
use super::reason::ReasonCode;

/// MQTT 5.0 §3.15.2.1.
const REASONS: &[ReasonCode] = &[
    ReasonCode::SUCCESS,
    ReasonCode::CONTINUE_AUTHENTICATION,
    ReasonCode::RE_AUTHENTICATE,
];

/// Only reached for MQTT 5.0: the fixed header refuses packet type 15 in 3.1.1.
pub(crate) fn decode(buf: &mut Bytes) -> Result<Auth, DecodeError> {
    if buf.is_empty() {
        return Ok(Auth {
            reason: ReasonCode::SUCCESS,
            properties: AuthProperties::default(),
        });
    }
    let reason = read_reason_code(buf, REASONS, "reason code not allowed in AUTH")?;
    let properties = properties::read_auth(buf)?;
    Ok(Auth { reason, properties })
}

pub(crate) fn write<S: Sink>(
    auth: &Auth,
    version: ProtocolVersion,
    s: &mut S,
) -> Result<(), EncodeError> {
    if version == ProtocolVersion::V311 {
        return Err(EncodeError::NotInV311 { packet: "AUTH" });
    }
    check_reason_code(auth.reason, REASONS, "AUTH")?;
    if auth.reason == ReasonCode::SUCCESS && auth.properties == AuthProperties::default() {
        return Ok(());
    }
    s.put_u8(auth.reason.0);
    s.put_block(&auth.properties)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Packet;
    use crate::codec::test_util::{assert_error, decode_one, encode_vec};
    use ProtocolVersion::*;

    #[test]
    fn auth_bytes() {
        let bytes = [0xF0, 11, 0x18, 9, 0x15, 0, 3, b'S', b'C', b'R', 0x16, 0, 0];
        let p = Packet::Auth(Auth {
            reason: ReasonCode::CONTINUE_AUTHENTICATION,
            properties: AuthProperties {
                authentication_method: Some("SCR".into()),
                authentication_data: Some(Bytes::new()),
                ..Default::default()
            },
        });
        assert_eq!(decode_one(&bytes, V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), bytes);
    }

    #[test]
    fn auth_remaining_length_0_is_success() {
        let p = Packet::Auth(Auth {
            reason: ReasonCode::SUCCESS,
            properties: Default::default(),
        });
        assert_eq!(decode_one(&[0xF0, 0], V5), Ok(p.clone()));
        assert_eq!(encode_vec(&p, V5), [0xF0, 0]);
        let re = Packet::Auth(Auth {
            reason: ReasonCode::RE_AUTHENTICATE,
            properties: Default::default(),
        });
        assert_eq!(encode_vec(&re, V5), [0xF0, 2, 0x19, 0]);
        assert_eq!(decode_one(&[0xF0, 2, 0x19, 0], V5), Ok(re));
    }

    #[test]
    fn auth_in_v311_is_malformed() {
        assert_error(&[0xF0, 0], V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn auth_in_v311_is_encode_error() {
        let p = Packet::Auth(Auth {
            reason: ReasonCode::SUCCESS,
            properties: Default::default(),
        });
        assert_eq!(
            crate::codec::encoded_len(&p, V311),
            Err(EncodeError::NotInV311 { packet: "AUTH" })
        );
    }

    #[test]
    fn auth_reason_not_allowed_is_malformed() {
        assert_error(&[0xF0, 2, 0x80, 0], V5, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn auth_reason_without_property_length_is_malformed() {
        assert_error(&[0xF0, 1, 0x18], V5, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn auth_duplicate_method_is_protocol_error() {
        let bytes = [0xF0, 10, 0x18, 8, 0x15, 0, 1, b'a', 0x15, 0, 1, b'b'];
        assert_error(&bytes, V5, ReasonCode::PROTOCOL_ERROR);
    }
}
