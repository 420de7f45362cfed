//! The fixed header (MQTT 5.0 §2.1): packet type, flags and remaining length.
//!
//! It is parsed from a plain slice before anything else, so a frame's full size is known — and
//! refused if too large — before the rest of it is waited for.

use super::error::DecodeError;
use super::packet::ProtocolVersion;
use super::primitives::parse_var_int;

/// The control packet types (the upper nibble of the first byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PacketType {
    Connect = 1,
    ConnAck = 2,
    Publish = 3,
    PubAck = 4,
    PubRec = 5,
    PubRel = 6,
    PubComp = 7,
    Subscribe = 8,
    SubAck = 9,
    Unsubscribe = 10,
    UnsubAck = 11,
    PingReq = 12,
    PingResp = 13,
    Disconnect = 14,
    Auth = 15,
}

impl PacketType {
    /// The first byte of a packet of this type with the given flags (only PUBLISH has any that
    /// vary; the others use [`PacketType::required_flags`]).
    pub(crate) fn first_byte(self, flags: u8) -> u8 {
        (self as u8) << 4 | (flags & 0x0F)
    }

    /// The fixed flags of every type but PUBLISH (§2.1.3).
    pub(crate) fn required_flags(self) -> u8 {
        match self {
            Self::PubRel | Self::Subscribe | Self::Unsubscribe => 0b0010,
            _ => 0,
        }
    }
}

/// A parsed fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FixedHeader {
    pub kind: PacketType,
    /// The low nibble of the first byte.
    pub flags: u8,
    /// Bytes after the fixed header.
    pub remaining_len: usize,
    /// Bytes of the fixed header itself (2 to 5).
    pub header_len: usize,
}

impl FixedHeader {
    /// The whole frame's length.
    pub(crate) fn frame_len(&self) -> usize {
        self.header_len + self.remaining_len
    }
}

/// Checks the first byte: a known packet type with valid flags.
pub(crate) fn packet_type(byte: u8, version: ProtocolVersion) -> Result<PacketType, DecodeError> {
    let flags = byte & 0x0F;
    let kind = match byte >> 4 {
        1 => PacketType::Connect,
        2 => PacketType::ConnAck,
        3 => PacketType::Publish,
        4 => PacketType::PubAck,
        5 => PacketType::PubRec,
        6 => PacketType::PubRel,
        7 => PacketType::PubComp,
        8 => PacketType::Subscribe,
        9 => PacketType::SubAck,
        10 => PacketType::Unsubscribe,
        11 => PacketType::UnsubAck,
        12 => PacketType::PingReq,
        13 => PacketType::PingResp,
        14 => PacketType::Disconnect,
        15 if version == ProtocolVersion::V5 => PacketType::Auth,
        15 => return Err(DecodeError::malformed("AUTH does not exist in MQTT 3.1.1")),
        _ => return Err(DecodeError::malformed("reserved packet type 0")),
    };
    if kind == PacketType::Publish {
        let qos = (flags >> 1) & 0b11;
        if qos == 3 {
            return Err(DecodeError::malformed("PUBLISH with QoS 3"));
        }
        if qos == 0 && flags & 0b1000 != 0 {
            return Err(DecodeError::malformed("PUBLISH with DUP set and QoS 0"));
        }
    } else if flags != kind.required_flags() {
        return Err(DecodeError::malformed("reserved fixed header flags"));
    }
    Ok(kind)
}

/// Parses the fixed header at the start of `buf`; `Ok(None)` if it is not complete yet.
pub(crate) fn parse(
    buf: &[u8],
    version: ProtocolVersion,
) -> Result<Option<FixedHeader>, DecodeError> {
    let Some((&first, rest)) = buf.split_first() else {
        return Ok(None);
    };
    let kind = packet_type(first, version)?;
    let Some((remaining_len, len_len)) = parse_var_int(rest)? else {
        return Ok(None);
    };
    Ok(Some(FixedHeader {
        kind,
        flags: first & 0x0F,
        // A variable byte integer is at most 268,435,455: it fits in usize even on 32-bit targets.
        remaining_len: usize::try_from(remaining_len).unwrap_or(usize::MAX),
        header_len: 1 + len_len,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::ReasonCode;
    use ProtocolVersion::*;

    fn malformed(buf: &[u8], version: ProtocolVersion) -> bool {
        matches!(parse(buf, version), Err(e) if e.reason == ReasonCode::MALFORMED_PACKET)
    }

    #[test]
    fn packet_type_0_is_malformed() {
        assert!(malformed(&[0x00, 0x00], V311));
        assert!(malformed(&[0x00, 0x00], V5));
    }

    #[test]
    fn auth_type_in_v311_is_malformed() {
        assert!(malformed(&[0xF0, 0x00], V311));
        assert!(!malformed(&[0xF0, 0x00], V5));
    }

    #[test]
    fn reserved_fixed_header_flags_are_malformed() {
        for kind in 1u8..=15 {
            let required = match kind {
                3 => continue,
                6 | 8 | 10 => 0b0010,
                _ => 0,
            };
            for flags in 0u8..16 {
                let ok = parse(&[kind << 4 | flags, 0], V5).is_ok();
                assert_eq!(ok, flags == required, "type {kind} flags {flags:04b}");
            }
        }
    }

    #[test]
    fn publish_qos3_is_malformed() {
        assert!(malformed(&[0x36, 0x00], V5));
        assert!(malformed(&[0x3E, 0x00], V311));
    }

    #[test]
    fn publish_dup_with_qos0_is_malformed() {
        assert!(malformed(&[0x38, 0x00], V5));
        assert!(malformed(&[0x39, 0x00], V311));
        assert!(!malformed(&[0x3A, 0x00], V311));
    }

    #[test]
    fn remaining_length_of_five_bytes_is_malformed() {
        assert!(malformed(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F], V5));
    }

    #[test]
    fn remaining_length_non_minimal_is_malformed() {
        assert!(malformed(&[0xC0, 0x80, 0x00], V5));
    }

    #[test]
    fn incomplete_header_is_none() {
        assert_eq!(parse(&[], V5), Ok(None));
        assert_eq!(parse(&[0x30], V5), Ok(None));
        assert_eq!(parse(&[0x30, 0x80, 0x80], V5), Ok(None));
    }

    #[test]
    fn header_lengths() {
        let h = parse(&[0x30, 0x80, 0x01], V5).unwrap().unwrap();
        assert_eq!(
            (h.kind, h.flags, h.remaining_len, h.header_len),
            (PacketType::Publish, 0, 128, 3)
        );
        assert_eq!(h.frame_len(), 131);
    }
}
