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
    /// 0x00 Success: CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK and AUTH for an operation
    /// that worked.
    pub const SUCCESS: Self = Self(0x00);
    /// 0x00 Normal disconnection: DISCONNECT without an error; the will is not published.
    pub const NORMAL_DISCONNECTION: Self = Self(0x00);
    /// 0x00 Granted QoS 0: SUBACK, the subscription was accepted at QoS 0.
    pub const GRANTED_QOS_0: Self = Self(0x00);
    /// 0x01 Granted QoS 1: SUBACK, the subscription was accepted at QoS 1 at most.
    pub const GRANTED_QOS_1: Self = Self(0x01);
    /// 0x02 Granted QoS 2: SUBACK, the subscription was accepted at QoS 2.
    pub const GRANTED_QOS_2: Self = Self(0x02);
    /// 0x04 Disconnect with Will Message: a client's DISCONNECT that still wants its will
    /// published.
    pub const DISCONNECT_WITH_WILL: Self = Self(0x04);
    /// 0x10 No matching subscribers: PUBACK or PUBREC; this broker answers `SUCCESS` instead.
    pub const NO_MATCHING_SUBSCRIBERS: Self = Self(0x10);
    /// 0x11 No subscription existed: UNSUBACK, for a filter the session was not subscribed to.
    pub const NO_SUBSCRIPTION_EXISTED: Self = Self(0x11);
    /// 0x18 Continue authentication: AUTH, another step of enhanced authentication follows.
    pub const CONTINUE_AUTHENTICATION: Self = Self(0x18);
    /// 0x19 Re-authenticate: AUTH from a connected client that starts authenticating again.
    pub const RE_AUTHENTICATE: Self = Self(0x19);
    /// 0x80 Unspecified error: a failure no other code fits; the only SUBACK failure MQTT 3.1.1
    /// has.
    pub const UNSPECIFIED_ERROR: Self = Self(0x80);
    /// 0x81 Malformed packet: the bytes break the wire format; the connection is closed.
    pub const MALFORMED_PACKET: Self = Self(0x81);
    /// 0x82 Protocol error: a well-formed packet the protocol does not allow here (a second
    /// CONNECT, an AUTH out of turn); the connection is closed.
    pub const PROTOCOL_ERROR: Self = Self(0x82);
    /// 0x83 Implementation specific error: valid, but this server will not accept it.
    pub const IMPLEMENTATION_SPECIFIC_ERROR: Self = Self(0x83);
    /// 0x84 Unsupported protocol version: CONNACK for a protocol name or level the broker does not
    /// speak (in MQTT 3.1.1 form, return code 1).
    pub const UNSUPPORTED_PROTOCOL_VERSION: Self = Self(0x84);
    /// 0x85 Client identifier not valid: CONNACK, for a client id over the configured length, or an
    /// empty one from an MQTT 3.1.1 client without a clean session.
    pub const CLIENT_IDENTIFIER_NOT_VALID: Self = Self(0x85);
    /// 0x86 Bad user name or password: CONNACK, the authenticator rejected the credentials.
    pub const BAD_USER_NAME_OR_PASSWORD: Self = Self(0x86);
    /// 0x87 Not authorized: a will, PUBLISH or subscription the authorizer refused; also what
    /// CONNACK and DISCONNECT carry for a refusal they have no code for.
    pub const NOT_AUTHORIZED: Self = Self(0x87);
    /// 0x88 Server unavailable: CONNACK; MQTT 3.1.1 return code 3 reads as this.
    pub const SERVER_UNAVAILABLE: Self = Self(0x88);
    /// 0x89 Server busy: CONNACK or DISCONNECT, try again later (an overloaded authenticator's
    /// answer).
    pub const SERVER_BUSY: Self = Self(0x89);
    /// 0x8A Banned: CONNACK, the client may not connect.
    pub const BANNED: Self = Self(0x8A);
    /// 0x8B Server shutting down: DISCONNECT to every MQTT 5.0 client on
    /// [`crate::Broker::shutdown`].
    pub const SERVER_SHUTTING_DOWN: Self = Self(0x8B);
    /// 0x8C Bad authentication method: CONNACK, for an authentication method the authenticator does
    /// not know.
    pub const BAD_AUTHENTICATION_METHOD: Self = Self(0x8C);
    /// 0x8D Keep alive timeout: DISCONNECT, nothing arrived within 1.5 times the keep alive.
    pub const KEEP_ALIVE_TIMEOUT: Self = Self(0x8D);
    /// 0x8E Session taken over: DISCONNECT, another connection took over the same client id.
    pub const SESSION_TAKEN_OVER: Self = Self(0x8E);
    /// 0x8F Topic filter invalid: SUBACK or UNSUBACK, for a string that is not a valid topic
    /// filter.
    pub const TOPIC_FILTER_INVALID: Self = Self(0x8F);
    /// 0x90 Topic name invalid: a PUBLISH or will topic that is not a valid topic name or breaks
    /// the configured limits.
    pub const TOPIC_NAME_INVALID: Self = Self(0x90);
    /// 0x91 Packet identifier in use: the packet id already belongs to another exchange.
    pub const PACKET_IDENTIFIER_IN_USE: Self = Self(0x91);
    /// 0x92 Packet identifier not found: PUBREL or PUBCOMP for a packet id the receiver does not
    /// know.
    pub const PACKET_IDENTIFIER_NOT_FOUND: Self = Self(0x92);
    /// 0x93 Receive Maximum exceeded: DISCONNECT, the client has more unacknowledged QoS 2
    /// PUBLISHes than the broker's Receive Maximum.
    pub const RECEIVE_MAXIMUM_EXCEEDED: Self = Self(0x93);
    /// 0x94 Topic alias invalid: DISCONNECT, for a topic alias of 0 or above the broker's maximum.
    pub const TOPIC_ALIAS_INVALID: Self = Self(0x94);
    /// 0x95 Packet too large: a packet over the Maximum Packet Size; the connection is closed.
    pub const PACKET_TOO_LARGE: Self = Self(0x95);
    /// 0x96 Message rate too high: DISCONNECT, the client publishes faster than allowed.
    pub const MESSAGE_RATE_TOO_HIGH: Self = Self(0x96);
    /// 0x97 Quota exceeded: CONNACK when the session limit is reached, SUBACK past the per-client
    /// subscription limit, PUBACK or PUBREC when a peer's outbox is full.
    pub const QUOTA_EXCEEDED: Self = Self(0x97);
    /// 0x98 Administrative action: DISCONNECT, an operator closed the connection.
    pub const ADMINISTRATIVE_ACTION: Self = Self(0x98);
    /// 0x99 Payload format invalid: a payload marked UTF-8 (Payload Format Indicator 1) that is
    /// not.
    pub const PAYLOAD_FORMAT_INVALID: Self = Self(0x99);
    /// 0x9A Retain not supported: a retained PUBLISH or will while retain is not available.
    pub const RETAIN_NOT_SUPPORTED: Self = Self(0x9A);
    /// 0x9B QoS not supported: a PUBLISH or will above the broker's Maximum QoS.
    pub const QOS_NOT_SUPPORTED: Self = Self(0x9B);
    /// 0x9C Use another server: CONNACK or DISCONNECT, for now; see Server Reference.
    pub const USE_ANOTHER_SERVER: Self = Self(0x9C);
    /// 0x9D Server moved: CONNACK or DISCONNECT, for good; see Server Reference.
    pub const SERVER_MOVED: Self = Self(0x9D);
    /// 0x9E Shared subscriptions not supported: SUBACK, for a `$share/` filter while they are off.
    pub const SHARED_SUBSCRIPTIONS_NOT_SUPPORTED: Self = Self(0x9E);
    /// 0x9F Connection rate exceeded: CONNACK, the client connects too often.
    pub const CONNECTION_RATE_EXCEEDED: Self = Self(0x9F);
    /// 0xA0 Maximum connect time: DISCONNECT, the connection lasted as long as allowed; the
    /// broker's event when no CONNECT came within the connect timeout.
    pub const MAXIMUM_CONNECT_TIME: Self = Self(0xA0);
    /// 0xA1 Subscription identifiers not supported: DISCONNECT, for a SUBSCRIBE with one while they
    /// are off.
    pub const SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED: Self = Self(0xA1);
    /// 0xA2 Wildcard subscriptions not supported: SUBACK, for a wildcard filter while they are off.
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
