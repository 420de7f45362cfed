//! Decode and encode errors.

use super::reason::ReasonCode;

/// Why a frame could not be decoded.
///
/// `reason` is what the broker sends back before closing: the DISCONNECT reason (or, for a
/// CONNECT, the CONNACK reason). "Need more bytes" is not an error: [`decode`](super::decode)
/// returns `Ok(None)` for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail} ({reason})")]
pub struct DecodeError {
    pub reason: ReasonCode,
    pub detail: &'static str,
}

impl DecodeError {
    pub fn new(reason: ReasonCode, detail: &'static str) -> Self {
        Self { reason, detail }
    }

    /// A `MALFORMED_PACKET` error.
    pub fn malformed(detail: &'static str) -> Self {
        Self::new(ReasonCode::MALFORMED_PACKET, detail)
    }

    /// A `PROTOCOL_ERROR` error.
    pub fn protocol(detail: &'static str) -> Self {
        Self::new(ReasonCode::PROTOCOL_ERROR, detail)
    }
}

/// Why a packet could not be encoded. These are bugs or limits on the sending side; nothing is
/// appended to the output buffer when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("UTF-8 string of {len} bytes is longer than 65,535")]
    StringTooLong { len: usize },
    #[error("binary data of {len} bytes is longer than 65,535")]
    BinaryTooLong { len: usize },
    /// Remaining length (or a property block) above the variable byte integer limit.
    #[error("{len} bytes is more than the MQTT limit of 268,435,455")]
    PacketTooLarge { len: usize },
    #[error("property {property} has a value the protocol does not allow")]
    PropertyOutOfRange { property: &'static str },
    #[error("a packet identifier must be present exactly when QoS > 0")]
    PacketIdMismatch,
    #[error("packet identifier 0 is not allowed")]
    ZeroPacketId,
    #[error("DUP must be 0 on a QoS 0 PUBLISH")]
    DupWithQoS0,
    #[error("MQTT 3.1.1 does not allow a password without a user name")]
    PasswordWithoutUsername,
    #[error("empty topic name without a topic alias (MQTT 5.0 only)")]
    EmptyTopic,
    #[error("{packet} needs at least one topic filter")]
    NoFilters { packet: &'static str },
    #[error("{packet} does not exist in MQTT 3.1.1")]
    NotInV311 { packet: &'static str },
    #[error("reason code {reason} is not allowed in {packet}")]
    ReasonNotAllowed {
        packet: &'static str,
        reason: ReasonCode,
    },
    /// A bug in the codec: writing produced a different length than measuring. Never expected.
    #[error("internal error: encoded length differs from the measured length")]
    LengthMismatch,
}
