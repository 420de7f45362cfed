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
    /// The reason code to answer with: DISCONNECT's, or CONNACK's for a CONNECT.
    pub reason: ReasonCode,
    /// What was wrong, in words, for logs.
    pub detail: &'static str,
}

impl DecodeError {
    /// An error with this reason code and detail.
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
    /// A UTF-8 string field longer than 65,535 bytes.
    #[error("UTF-8 string of {len} bytes is longer than 65,535")]
    StringTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// A binary data field longer than 65,535 bytes.
    #[error("binary data of {len} bytes is longer than 65,535")]
    BinaryTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// Remaining length (or a property block) above the variable byte integer limit.
    #[error("{len} bytes is more than the MQTT limit of 268,435,455")]
    PacketTooLarge {
        /// The length in bytes.
        len: usize,
    },
    /// A property value the protocol does not allow (a topic alias of 0, Maximum QoS 2, ...).
    #[error("property {property} has a value the protocol does not allow")]
    PropertyOutOfRange {
        /// The property's name.
        property: &'static str,
    },
    /// A packet identifier at QoS 0, or none at QoS 1 or 2.
    #[error("a packet identifier must be present exactly when QoS > 0")]
    PacketIdMismatch,
    /// Packet identifier 0: identifiers start at 1.
    #[error("packet identifier 0 is not allowed")]
    ZeroPacketId,
    /// DUP set on a QoS 0 PUBLISH.
    #[error("DUP must be 0 on a QoS 0 PUBLISH")]
    DupWithQoS0,
    /// An MQTT 3.1.1 CONNECT with a password but no user name.
    #[error("MQTT 3.1.1 does not allow a password without a user name")]
    PasswordWithoutUsername,
    /// A PUBLISH with an empty topic name and no topic alias (MQTT 3.1.1 has no aliases).
    #[error("empty topic name without a topic alias (MQTT 5.0 only)")]
    EmptyTopic,
    /// A SUBSCRIBE or UNSUBSCRIBE without a topic filter.
    #[error("{packet} needs at least one topic filter")]
    NoFilters {
        /// The packet's name.
        packet: &'static str,
    },
    /// A packet MQTT 3.1.1 does not have (AUTH).
    #[error("{packet} does not exist in MQTT 3.1.1")]
    NotInV311 {
        /// The packet's name.
        packet: &'static str,
    },
    /// A reason code the packet may not carry.
    #[error("reason code {reason} is not allowed in {packet}")]
    ReasonNotAllowed {
        /// The packet's name.
        packet: &'static str,
        /// The reason code refused.
        reason: ReasonCode,
    },
    /// A bug in the codec: writing produced a different length than measuring. Never expected.
    #[error("internal error: encoded length differs from the measured length")]
    LengthMismatch,
}
