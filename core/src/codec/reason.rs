//! MQTT 5.0 reason codes (and the MQTT 3.1.1 return codes they map to).

use std::fmt;

/// An MQTT 5.0 reason code.
///
/// Several names share a value (`0x00` is *Success*, *Normal disconnection* and *Granted QoS 0*),
/// so this is a newtype over `u8` with named constants rather than an enum. Which codes a packet
/// may carry is checked by the decoder.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReasonCode(pub u8);

impl ReasonCode {
    pub const SUCCESS: Self = Self(0x00);
    pub const NORMAL_DISCONNECTION: Self = Self(0x00);
    pub const GRANTED_QOS_0: Self = Self(0x00);
    pub const GRANTED_QOS_1: Self = Self(0x01);
    pub const GRANTED_QOS_2: Self = Self(0x02);
    pub const DISCONNECT_WITH_WILL: Self = Self(0x04);
    pub const NO_MATCHING_SUBSCRIBERS: Self = Self(0x10);
    pub const NO_SUBSCRIPTION_EXISTED: Self = Self(0x11);
    pub const CONTINUE_AUTHENTICATION: Self = Self(0x18);
    pub const RE_AUTHENTICATE: Self = Self(0x19);
    pub const UNSPECIFIED_ERROR: Self = Self(0x80);
    pub const MALFORMED_PACKET: Self = Self(0x81);
    pub const PROTOCOL_ERROR: Self = Self(0x82);
    pub const IMPLEMENTATION_SPECIFIC_ERROR: Self = Self(0x83);
    pub const UNSUPPORTED_PROTOCOL_VERSION: Self = Self(0x84);
    pub const CLIENT_IDENTIFIER_NOT_VALID: Self = Self(0x85);
    pub const BAD_USER_NAME_OR_PASSWORD: Self = Self(0x86);
    pub const NOT_AUTHORIZED: Self = Self(0x87);
    pub const SERVER_UNAVAILABLE: Self = Self(0x88);
    pub const SERVER_BUSY: Self = Self(0x89);
    pub const BANNED: Self = Self(0x8A);
    pub const SERVER_SHUTTING_DOWN: Self = Self(0x8B);
    pub const BAD_AUTHENTICATION_METHOD: Self = Self(0x8C);
    pub const KEEP_ALIVE_TIMEOUT: Self = Self(0x8D);
    pub const SESSION_TAKEN_OVER: Self = Self(0x8E);
    pub const TOPIC_FILTER_INVALID: Self = Self(0x8F);
    pub const TOPIC_NAME_INVALID: Self = Self(0x90);
    pub const PACKET_IDENTIFIER_IN_USE: Self = Self(0x91);
    pub const PACKET_IDENTIFIER_NOT_FOUND: Self = Self(0x92);
    pub const RECEIVE_MAXIMUM_EXCEEDED: Self = Self(0x93);
    pub const TOPIC_ALIAS_INVALID: Self = Self(0x94);
    pub const PACKET_TOO_LARGE: Self = Self(0x95);
    pub const MESSAGE_RATE_TOO_HIGH: Self = Self(0x96);
    pub const QUOTA_EXCEEDED: Self = Self(0x97);
    pub const ADMINISTRATIVE_ACTION: Self = Self(0x98);
    pub const PAYLOAD_FORMAT_INVALID: Self = Self(0x99);
    pub const RETAIN_NOT_SUPPORTED: Self = Self(0x9A);
    pub const QOS_NOT_SUPPORTED: Self = Self(0x9B);
    pub const USE_ANOTHER_SERVER: Self = Self(0x9C);
    pub const SERVER_MOVED: Self = Self(0x9D);
    pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: Self = Self(0x9E);
    pub const CONNECTION_RATE_EXCEEDED: Self = Self(0x9F);
    pub const MAXIMUM_CONNECT_TIME: Self = Self(0xA0);
    pub const SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: Self = Self(0xA1);
    pub const WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED: Self = Self(0xA2);

    /// True for codes `>= 0x80`, which report a failure.
    pub fn is_error(self) -> bool {
        self.0 >= 0x80
    }

    /// The MQTT 3.1.1 CONNACK return code that best expresses this reason.
    pub fn to_v3_connack(self) -> u8 {
        match self {
            Self::SUCCESS => 0,
            Self::UNSUPPORTED_PROTOCOL_VERSION => 1,
            Self::CLIENT_IDENTIFIER_NOT_VALID => 2,
            Self::BAD_USER_NAME_OR_PASSWORD | Self::BAD_AUTHENTICATION_METHOD => 4,
            Self::NOT_AUTHORIZED | Self::BANNED => 5,
            _ => 3,
        }
    }

    /// The reason an MQTT 3.1.1 CONNACK return code stands for, if it is a valid one (0–5).
    pub fn from_v3_connack(code: u8) -> Option<Self> {
        Some(match code {
            0 => Self::SUCCESS,
            1 => Self::UNSUPPORTED_PROTOCOL_VERSION,
            2 => Self::CLIENT_IDENTIFIER_NOT_VALID,
            3 => Self::SERVER_UNAVAILABLE,
            4 => Self::BAD_USER_NAME_OR_PASSWORD,
            5 => Self::NOT_AUTHORIZED,
            _ => return None,
        })
    }

    /// A short English name, for logs and error messages.
    pub fn name(self) -> &'static str {
        match self.0 {
            0x00 => "success",
            0x01 => "granted QoS 1",
            0x02 => "granted QoS 2",
            0x04 => "disconnect with will message",
            0x10 => "no matching subscribers",
            0x11 => "no subscription existed",
            0x18 => "continue authentication",
            0x19 => "re-authenticate",
            0x80 => "unspecified error",
            0x81 => "malformed packet",
            0x82 => "protocol error",
            0x83 => "implementation specific error",
            0x84 => "unsupported protocol version",
            0x85 => "client identifier not valid",
            0x86 => "bad user name or password",
            0x87 => "not authorized",
            0x88 => "server unavailable",
            0x89 => "server busy",
            0x8A => "banned",
            0x8B => "server shutting down",
            0x8C => "bad authentication method",
            0x8D => "keep alive timeout",
            0x8E => "session taken over",
            0x8F => "topic filter invalid",
            0x90 => "topic name invalid",
            0x91 => "packet identifier in use",
            0x92 => "packet identifier not found",
            0x93 => "receive maximum exceeded",
            0x94 => "topic alias invalid",
            0x95 => "packet too large",
            0x96 => "message rate too high",
            0x97 => "quota exceeded",
            0x98 => "administrative action",
            0x99 => "payload format invalid",
            0x9A => "retain not supported",
            0x9B => "QoS not supported",
            0x9C => "use another server",
            0x9D => "server moved",
            0x9E => "shared subscriptions not supported",
            0x9F => "connection rate exceeded",
            0xA0 => "maximum connect time",
            0xA1 => "subscription identifiers not supported",
            0xA2 => "wildcard subscriptions not supported",
            _ => "unknown reason code",
        }
    }
}

impl fmt::Debug for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#04x} ({})", self.0, self.name())
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
