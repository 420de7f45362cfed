//! PUBACK, PUBREC, PUBREL and PUBCOMP (MQTT 5.0 §3.4–§3.7): a packet identifier, then in MQTT 5.0
//! an optional reason code and properties.
//!
//! A remaining length of 2 means `SUCCESS` without properties, 3 a reason code without
//! properties (§3.4.2.1). The encoder uses the shortest form, so round trips are canonical.

use bytes::Bytes;

use super::error::{DecodeError, EncodeError};
use super::packet::{Ack, ProtocolVersion, ReasonProperties};
use super::primitives::{Sink, check_reason_code, put_packet_id, read_packet_id, read_reason_code};
use super::properties;
use super::reason::ReasonCode;

/// MQTT 5.0 §3.4.2.1 (PUBACK) and §3.5.2.1 (PUBREC).
const PUBACK_REASONS: &[ReasonCode] = &[
    ReasonCode::SUCCESS,
    ReasonCode::NO_MATCHING_SUBSCRIBERS,
    ReasonCode::UNSPECIFIED_ERROR,
    ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR,
    ReasonCode::NOT_AUTHORIZED,
    ReasonCode::TOPIC_NAME_INVALID,
    ReasonCode::PACKET_IDENTIFIER_IN_USE,
    ReasonCode::QUOTA_EXCEEDED,
    ReasonCode::PAYLOAD_FORMAT_INVALID,
];

/// MQTT 5.0 §3.6.2.1 (PUBREL) and §3.7.2.1 (PUBCOMP).
const PUBREL_REASONS: &[ReasonCode] =
    &[ReasonCode::SUCCESS, ReasonCode::PACKET_IDENTIFIER_NOT_FOUND];

/// Which of the four acknowledgements: PUBACK, PUBREC, PUBREL or PUBCOMP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AckKind {
    Ack,
    Rec,
    Rel,
    Comp,
}

impl AckKind {
    fn name(self) -> &'static str {
        match self {
            Self::Ack => "PUBACK",
            Self::Rec => "PUBREC",
            Self::Rel => "PUBREL",
            Self::Comp => "PUBCOMP",
        }
    }

    fn reasons(self) -> &'static [ReasonCode] {
        match self {
            Self::Ack | Self::Rec => PUBACK_REASONS,
            Self::Rel | Self::Comp => PUBREL_REASONS,
        }
    }

    fn reason_error(self) -> &'static str {
        match self {
            Self::Ack => "reason code not allowed in PUBACK",
            Self::Rec => "reason code not allowed in PUBREC",
            Self::Rel => "reason code not allowed in PUBREL",
            Self::Comp => "reason code not allowed in PUBCOMP",
        }
    }
}

pub(crate) fn decode(
    kind: AckKind,
    buf: &mut Bytes,
    version: ProtocolVersion,
) -> Result<Ack, DecodeError> {
    let packet_id = read_packet_id(buf)?;
    if version == ProtocolVersion::V311 || buf.is_empty() {
        return Ok(Ack::new(packet_id));
    }
    let reason = read_reason_code(buf, kind.reasons(), kind.reason_error())?;
    let properties = if buf.is_empty() {
        ReasonProperties::default()
    } else {
        properties::read_reason(buf)?
    };
    Ok(Ack {
        packet_id,
        reason,
        properties,
    })
}

pub(crate) fn write<S: Sink>(
    kind: AckKind,
    ack: &Ack,
    version: ProtocolVersion,
    s: &mut S,
) -> Result<(), EncodeError> {
    put_packet_id(s, ack.packet_id)?;
    if version == ProtocolVersion::V5 {
        check_reason_code(ack.reason, kind.reasons(), kind.name())?;
        let no_properties = ack.properties == ReasonProperties::default();
        if ack.reason != ReasonCode::SUCCESS || !no_properties {
            s.put_u8(ack.reason.0);
        }
        if !no_properties {
            s.put_block(&ack.properties)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Packet;
    use crate::codec::test_util::{assert_error, decode_one, encode_vec, round_trip};
    use ProtocolVersion::*;

    fn packets(ack: Ack) -> [(Packet, u8); 4] {
        [
            (Packet::PubAck(ack.clone()), 0x40),
            (Packet::PubRec(ack.clone()), 0x50),
            (Packet::PubRel(ack.clone()), 0x62),
            (Packet::PubComp(ack), 0x70),
        ]
    }

    #[test]
    fn v311_ack_bytes() {
        for (p, first) in packets(Ack::new(0x0102)) {
            let bytes = [first, 2, 1, 2];
            assert_eq!(encode_vec(&p, V311), bytes);
            assert_eq!(decode_one(&bytes, V311), Ok(p));
        }
    }

    #[test]
    fn v311_ack_with_extra_bytes_is_malformed() {
        assert_error(&[0x40, 3, 0, 1, 0], V311, ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn v5_ack_short_form_is_success() {
        for (p, first) in packets(Ack::new(7)) {
            let bytes = [first, 2, 0, 7];
            assert_eq!(encode_vec(&p, V5), bytes);
            assert_eq!(decode_one(&bytes, V5), Ok(p));
        }
    }

    #[test]
    fn v5_ack_reason_without_properties_bytes() {
        let ack = Ack {
            reason: ReasonCode::PACKET_IDENTIFIER_NOT_FOUND,
            ..Ack::new(7)
        };
        let p = Packet::PubRel(ack);
        assert_eq!(encode_vec(&p, V5), [0x62, 3, 0, 7, 0x92]);
        assert_eq!(decode_one(&[0x62, 3, 0, 7, 0x92], V5), Ok(p.clone()));
        // The explicit empty property block decodes the same.
        assert_eq!(decode_one(&[0x62, 4, 0, 7, 0x92, 0], V5), Ok(p));
        assert_eq!(
            decode_one(&[0x40, 4, 0, 7, 0, 0], V5),
            Ok(Packet::PubAck(Ack::new(7)))
        );
    }

    #[test]
    fn v5_ack_with_properties_bytes() {
        let ack = Ack {
            packet_id: 1,
            reason: ReasonCode::NO_MATCHING_SUBSCRIBERS,
            properties: ReasonProperties {
                reason_string: Some("no".into()),
                user_properties: vec![],
            },
        };
        let bytes = [0x40, 9, 0, 1, 0x10, 5, 0x1F, 0, 2, b'n', b'o'];
        let p = Packet::PubAck(ack);
        assert_eq!(encode_vec(&p, V5), bytes);
        assert_eq!(decode_one(&bytes, V5), Ok(p.clone()));
        round_trip(&p, V5);
    }

    #[test]
    fn ack_packet_id_0_is_malformed() {
        for first in [0x40, 0x50, 0x62, 0x70] {
            assert_error(&[first, 2, 0, 0], V311, ReasonCode::MALFORMED_PACKET);
            assert_error(&[first, 2, 0, 0], V5, ReasonCode::MALFORMED_PACKET);
        }
    }

    #[test]
    fn ack_reason_not_allowed_is_malformed() {
        // 0x10 is a PUBACK reason, not a PUBREL one; 0x92 the other way round.
        assert_error(&[0x62, 3, 0, 1, 0x10], V5, ReasonCode::MALFORMED_PACKET);
        assert_error(&[0x70, 3, 0, 1, 0x10], V5, ReasonCode::MALFORMED_PACKET);
        assert_error(&[0x40, 3, 0, 1, 0x92], V5, ReasonCode::MALFORMED_PACKET);
        assert_error(&[0x50, 3, 0, 1, 0x04], V5, ReasonCode::MALFORMED_PACKET);
        let bad = Packet::PubRel(Ack {
            reason: ReasonCode::QUOTA_EXCEEDED,
            ..Ack::new(1)
        });
        assert!(matches!(
            crate::codec::encoded_len(&bad, V5),
            Err(EncodeError::ReasonNotAllowed {
                packet: "PUBREL",
                ..
            })
        ));
    }

    #[test]
    fn ack_property_not_allowed_is_malformed() {
        assert_error(
            &[0x40, 6, 0, 1, 0, 2, 0x01, 0],
            V5,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn ack_truncated_is_malformed() {
        assert_error(&[0x40, 1, 0], V5, ReasonCode::MALFORMED_PACKET);
        assert_error(&[0x40, 0], V311, ReasonCode::MALFORMED_PACKET);
    }
}
