//! MQTT control packets as plain data, shared by MQTT 3.1.1 and 5.0.
//!
//! Fields that only exist in MQTT 5.0 (properties, most reason codes) are left at their defaults
//! when a packet is decoded from MQTT 3.1.1, and ignored when one is encoded for MQTT 3.1.1.
//! Payloads and binary properties are [`Bytes`] that share the decoded frame: no copy.

use bytes::Bytes;

use super::reason::ReasonCode;

/// The protocol level a connection speaks, taken from its CONNECT packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProtocolVersion {
    /// MQTT 3.1.1 (protocol level 4).
    V311,
    /// MQTT 5.0 (protocol level 5).
    V5,
}

impl ProtocolVersion {
    /// The protocol level byte carried in CONNECT.
    pub fn level(self) -> u8 {
        match self {
            Self::V311 => 4,
            Self::V5 => 5,
        }
    }
}

/// Quality of service of a message or a subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum QoS {
    #[default]
    AtMostOnce = 0,
    AtLeastOnce = 1,
    ExactlyOnce = 2,
}

impl QoS {
    /// The QoS for a 2-bit field value; `None` for the invalid value 3.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Self::AtMostOnce),
            1 => Some(Self::AtLeastOnce),
            2 => Some(Self::ExactlyOnce),
            _ => None,
        }
    }
}

/// A user property (MQTT 5.0): a name/value pair of UTF-8 strings; may repeat.
pub type UserProperty = (String, String);

/// An MQTT control packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    Connect(Connect),
    ConnAck(ConnAck),
    Publish(Publish),
    PubAck(Ack),
    PubRec(Ack),
    PubRel(Ack),
    PubComp(Ack),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(UnsubAck),
    PingReq,
    PingResp,
    Disconnect(Disconnect),
    /// AUTH exists in MQTT 5.0 only.
    Auth(Auth),
}

impl Packet {
    /// The packet type name, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Packet::Connect(_) => "CONNECT",
            Packet::ConnAck(_) => "CONNACK",
            Packet::Publish(_) => "PUBLISH",
            Packet::PubAck(_) => "PUBACK",
            Packet::PubRec(_) => "PUBREC",
            Packet::PubRel(_) => "PUBREL",
            Packet::PubComp(_) => "PUBCOMP",
            Packet::Subscribe(_) => "SUBSCRIBE",
            Packet::SubAck(_) => "SUBACK",
            Packet::Unsubscribe(_) => "UNSUBSCRIBE",
            Packet::UnsubAck(_) => "UNSUBACK",
            Packet::PingReq => "PINGREQ",
            Packet::PingResp => "PINGRESP",
            Packet::Disconnect(_) => "DISCONNECT",
            Packet::Auth(_) => "AUTH",
        }
    }
}

/// CONNECT: the first packet a client sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connect {
    pub protocol: ProtocolVersion,
    /// "Clean Session" in 3.1.1, "Clean Start" in 5.0.
    pub clean_start: bool,
    /// Keep alive in seconds; 0 turns it off.
    pub keep_alive: u16,
    /// May be empty: the server then assigns one.
    pub client_id: String,
    pub will: Option<LastWill>,
    pub username: Option<String>,
    pub password: Option<Bytes>,
    pub properties: ConnectProperties,
}

/// The will message carried in CONNECT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastWill {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    pub properties: WillProperties,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    pub maximum_packet_size: Option<u32>,
    pub topic_alias_maximum: Option<u16>,
    pub request_response_information: Option<bool>,
    pub request_problem_information: Option<bool>,
    pub user_properties: Vec<UserProperty>,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WillProperties {
    pub will_delay_interval: Option<u32>,
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: Vec<UserProperty>,
}

/// CONNACK. For 3.1.1 the reason maps to a return code with [`ReasonCode::to_v3_connack`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnAck {
    pub session_present: bool,
    pub reason: ReasonCode,
    pub properties: ConnAckProperties,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnAckProperties {
    pub session_expiry_interval: Option<u32>,
    pub receive_maximum: Option<u16>,
    pub maximum_qos: Option<QoS>,
    pub retain_available: Option<bool>,
    pub maximum_packet_size: Option<u32>,
    pub assigned_client_identifier: Option<String>,
    pub topic_alias_maximum: Option<u16>,
    pub reason_string: Option<String>,
    pub user_properties: Vec<UserProperty>,
    pub wildcard_subscription_available: Option<bool>,
    pub subscription_identifiers_available: Option<bool>,
    pub shared_subscription_available: Option<bool>,
    pub server_keep_alive: Option<u16>,
    pub response_information: Option<String>,
    pub server_reference: Option<String>,
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
}

/// PUBLISH, in either direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publish {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// Empty only in MQTT 5.0 when `properties.topic_alias` is set.
    pub topic: String,
    /// Present (and non-zero) exactly when `qos > 0`.
    pub packet_id: Option<u16>,
    pub payload: Bytes,
    pub properties: PublishProperties,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishProperties {
    pub payload_format_indicator: Option<u8>,
    pub message_expiry_interval: Option<u32>,
    pub topic_alias: Option<u16>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
    pub user_properties: Vec<UserProperty>,
    /// Server to client only; one per matching subscription that had an identifier.
    pub subscription_identifiers: Vec<u32>,
    pub content_type: Option<String>,
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP share this shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub packet_id: u16,
    /// Always `SUCCESS` in 3.1.1.
    pub reason: ReasonCode,
    pub properties: ReasonProperties,
}

impl Ack {
    pub fn new(packet_id: u16) -> Self {
        Self {
            packet_id,
            reason: ReasonCode::SUCCESS,
            properties: ReasonProperties::default(),
        }
    }
}

/// The properties of acknowledgements: a reason string and user properties.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReasonProperties {
    pub reason_string: Option<String>,
    pub user_properties: Vec<UserProperty>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscribe {
    pub packet_id: u16,
    /// At least one.
    pub filters: Vec<SubscribeFilter>,
    pub properties: SubscribeProperties,
}

/// One topic filter of a SUBSCRIBE with its options. The filter is only checked to be a valid
/// UTF-8 string here; whether it is a valid topic filter is answered per filter in SUBACK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscribeFilter {
    pub filter: String,
    pub options: SubscriptionOptions,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SubscriptionOptions {
    pub qos: QoS,
    /// MQTT 5.0: do not send messages this client published itself.
    pub no_local: bool,
    /// MQTT 5.0: keep the retain flag as published.
    pub retain_as_published: bool,
    pub retain_handling: RetainHandling,
}

/// When retained messages are sent on SUBSCRIBE (MQTT 5.0; 3.1.1 always sends them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RetainHandling {
    #[default]
    OnSubscribe = 0,
    OnNewSubscribe = 1,
    Never = 2,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubscribeProperties {
    /// 1 ..= 268,435,455.
    pub subscription_identifier: Option<u32>,
    pub user_properties: Vec<UserProperty>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubAck {
    pub packet_id: u16,
    /// One per filter: granted QoS or a failure code (3.1.1 knows only 0, 1, 2 and 0x80).
    pub reasons: Vec<ReasonCode>,
    pub properties: ReasonProperties,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsubscribe {
    pub packet_id: u16,
    /// At least one.
    pub filters: Vec<String>,
    pub user_properties: Vec<UserProperty>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsubAck {
    pub packet_id: u16,
    /// One per filter in MQTT 5.0; empty in 3.1.1, which has none.
    pub reasons: Vec<ReasonCode>,
    pub properties: ReasonProperties,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disconnect {
    /// Always `NORMAL_DISCONNECTION` in 3.1.1.
    pub reason: ReasonCode,
    pub properties: DisconnectProperties,
}

impl Disconnect {
    pub fn new(reason: ReasonCode) -> Self {
        Self {
            reason,
            properties: DisconnectProperties::default(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DisconnectProperties {
    pub session_expiry_interval: Option<u32>,
    pub reason_string: Option<String>,
    pub user_properties: Vec<UserProperty>,
    pub server_reference: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Auth {
    /// `SUCCESS`, `CONTINUE_AUTHENTICATION` or `RE_AUTHENTICATE`.
    pub reason: ReasonCode,
    pub properties: AuthProperties,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthProperties {
    pub authentication_method: Option<String>,
    pub authentication_data: Option<Bytes>,
    pub reason_string: Option<String>,
    pub user_properties: Vec<UserProperty>,
}
