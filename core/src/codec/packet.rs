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
    /// QoS 0: delivered at most once, never acknowledged.
    #[default]
    AtMostOnce = 0,
    /// QoS 1: delivered at least once, acknowledged with PUBACK.
    AtLeastOnce = 1,
    /// QoS 2: delivered exactly once, through PUBREC, PUBREL and PUBCOMP.
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
    /// CONNECT, client to server: the first packet, which opens or resumes a session.
    Connect(Connect),
    /// CONNACK, server to client: the answer to CONNECT.
    ConnAck(ConnAck),
    /// PUBLISH, either direction: an application message.
    Publish(Publish),
    /// PUBACK: acknowledges a QoS 1 PUBLISH.
    PubAck(Ack),
    /// PUBREC: the first acknowledgement of a QoS 2 PUBLISH.
    PubRec(Ack),
    /// PUBREL: answers PUBREC; the receiver may now release the QoS 2 message.
    PubRel(Ack),
    /// PUBCOMP: answers PUBREL and completes the QoS 2 exchange.
    PubComp(Ack),
    /// SUBSCRIBE, client to server.
    Subscribe(Subscribe),
    /// SUBACK, server to client: one reason code per filter of the SUBSCRIBE.
    SubAck(SubAck),
    /// UNSUBSCRIBE, client to server.
    Unsubscribe(Unsubscribe),
    /// UNSUBACK, server to client.
    UnsubAck(UnsubAck),
    /// PINGREQ: the client's keep-alive ping.
    PingReq,
    /// PINGRESP: the server's answer to PINGREQ.
    PingResp,
    /// DISCONNECT: the sender ends the connection (from the server in MQTT 5.0 only).
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
    /// The protocol version, from the protocol name and level.
    pub protocol: ProtocolVersion,
    /// "Clean Session" in 3.1.1, "Clean Start" in 5.0.
    pub clean_start: bool,
    /// Keep alive in seconds; 0 turns it off.
    pub keep_alive: u16,
    /// May be empty: the server then assigns one.
    pub client_id: String,
    /// The will message, published when the connection ends without a normal DISCONNECT.
    pub will: Option<LastWill>,
    /// User Name, if the client sent one.
    pub username: Option<String>,
    /// Password (binary data), if the client sent one.
    pub password: Option<Bytes>,
    /// CONNECT properties (MQTT 5.0).
    pub properties: ConnectProperties,
}

/// The will message carried in CONNECT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastWill {
    /// The topic name the will is published to.
    pub topic: String,
    /// The will's payload.
    pub payload: Bytes,
    /// The QoS the will is published with.
    pub qos: QoS,
    /// Whether the will is published as a retained message.
    pub retain: bool,
    /// Will properties (MQTT 5.0).
    pub properties: WillProperties,
}

/// CONNECT properties (MQTT 5.0 §3.1.2.11). `None` or empty = not sent, and the protocol's default
/// applies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectProperties {
    /// Session Expiry Interval in seconds (MQTT 5.0 §3.1.2.11.2); `None` = not sent, which means 0:
    /// the session ends with the connection.
    pub session_expiry_interval: Option<u32>,
    /// Receive Maximum: QoS 1 and 2 PUBLISHes the client handles at once; `None` = 65,535.
    pub receive_maximum: Option<u16>,
    /// Maximum Packet Size in bytes the client accepts; `None` = no limit beyond the protocol's.
    pub maximum_packet_size: Option<u32>,
    /// Topic Alias Maximum: the highest topic alias the client accepts; `None` = 0, no aliases.
    pub topic_alias_maximum: Option<u16>,
    /// Request Response Information: the client asks for Response Information; `None` = false.
    pub request_response_information: Option<bool>,
    /// Request Problem Information: `false` limits reason strings and user properties to PUBLISH,
    /// CONNACK and DISCONNECT; `None` = true.
    pub request_problem_information: Option<bool>,
    /// User properties, in the order sent.
    pub user_properties: Vec<UserProperty>,
    /// Authentication Method: the enhanced authentication the client starts, e.g. `SCRAM-SHA-256`.
    pub authentication_method: Option<String>,
    /// Authentication Data for the method's first step.
    pub authentication_data: Option<Bytes>,
}

/// Will properties (MQTT 5.0 §3.1.3.2): those of the will message once it is published.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WillProperties {
    /// Will Delay Interval in seconds: how long after the connection ends the will waits (it goes
    /// sooner if the session ends first, and not at all if the client reconnects); `None` = 0.
    pub will_delay_interval: Option<u32>,
    /// Payload Format Indicator: 0 = unspecified bytes, 1 = UTF-8 text; `None` = 0.
    pub payload_format_indicator: Option<u8>,
    /// Message Expiry Interval in seconds, once the will is published; `None` = it does not expire.
    pub message_expiry_interval: Option<u32>,
    /// Content Type: a description of the payload (a MIME type, say), opaque to the broker.
    pub content_type: Option<String>,
    /// Response Topic: the topic name a receiver should answer on.
    pub response_topic: Option<String>,
    /// Correlation Data: opaque bytes that tie a response to its request.
    pub correlation_data: Option<Bytes>,
    /// User properties, passed on to subscribers.
    pub user_properties: Vec<UserProperty>,
}

/// CONNACK. For 3.1.1 the reason maps to a return code with [`ReasonCode::to_v3_connack`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnAck {
    /// Session Present: the broker resumed a session it held for this client id (false on refusal).
    pub session_present: bool,
    /// Connect Reason Code: `SUCCESS`, or why the connection was refused.
    pub reason: ReasonCode,
    /// CONNACK properties (MQTT 5.0).
    pub properties: ConnAckProperties,
}

/// CONNACK properties (MQTT 5.0 §3.2.2.3): what the server allows and what it assigned. `None` =
/// not sent, and the protocol's default applies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnAckProperties {
    /// Session Expiry Interval in seconds, sent when the server overrides the client's.
    pub session_expiry_interval: Option<u32>,
    /// Receive Maximum: QoS 1 and 2 PUBLISHes the server handles at once; `None` = 65,535.
    pub receive_maximum: Option<u16>,
    /// Maximum QoS the server accepts in PUBLISH and wills; `None` = QoS 2.
    pub maximum_qos: Option<QoS>,
    /// Retain Available: whether the server accepts retained messages; `None` = true.
    pub retain_available: Option<bool>,
    /// Maximum Packet Size in bytes the server accepts; `None` = no limit beyond the protocol's.
    pub maximum_packet_size: Option<u32>,
    /// Assigned Client Identifier: given to a client that connected with an empty client id.
    pub assigned_client_identifier: Option<String>,
    /// Topic Alias Maximum: the highest topic alias the server accepts; `None` = 0, no aliases.
    pub topic_alias_maximum: Option<u16>,
    /// Reason String: a human-readable explanation, for diagnostics only.
    pub reason_string: Option<String>,
    /// User properties.
    pub user_properties: Vec<UserProperty>,
    /// Wildcard Subscription Available; `None` = true.
    pub wildcard_subscription_available: Option<bool>,
    /// Subscription Identifiers Available; `None` = true.
    pub subscription_identifiers_available: Option<bool>,
    /// Shared Subscription Available; `None` = true.
    pub shared_subscription_available: Option<bool>,
    /// Server Keep Alive in seconds: the keep alive the client must use instead of its own.
    pub server_keep_alive: Option<u16>,
    /// Response Information: a basis for the client's response topics, when it asked for one.
    pub response_information: Option<String>,
    /// Server Reference: another server the client may use (with `USE_ANOTHER_SERVER` or
    /// `SERVER_MOVED`).
    pub server_reference: Option<String>,
    /// Authentication Method: the enhanced authentication in use, as named in CONNECT.
    pub authentication_method: Option<String>,
    /// Authentication Data of the method's last step.
    pub authentication_data: Option<Bytes>,
}

/// PUBLISH, in either direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publish {
    /// DUP flag: this may be a re-send of an earlier attempt; always false at QoS 0.
    pub dup: bool,
    /// The QoS of this PUBLISH.
    pub qos: QoS,
    /// RETAIN flag. From a client: keep the message as its topic's retained message (an empty
    /// payload deletes it). To a client: a retained message, or one published with RETAIN under
    /// Retain As Published.
    pub retain: bool,
    /// Empty only in MQTT 5.0 when `properties.topic_alias` is set.
    pub topic: String,
    /// Present (and non-zero) exactly when `qos > 0`.
    pub packet_id: Option<u16>,
    /// The application payload, opaque to the broker.
    pub payload: Bytes,
    /// PUBLISH properties (MQTT 5.0).
    pub properties: PublishProperties,
}

/// PUBLISH properties (MQTT 5.0 §3.3.2.3).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishProperties {
    /// Payload Format Indicator: 0 = unspecified bytes, 1 = UTF-8 text, which the broker checks
    /// (`PAYLOAD_FORMAT_INVALID`); `None` = 0.
    pub payload_format_indicator: Option<u8>,
    /// Message Expiry Interval in seconds (to subscribers: what is left of it); `None` = no expiry.
    pub message_expiry_interval: Option<u32>,
    /// Topic Alias: stands for the topic name on this connection; 1 up to the receiver's maximum.
    pub topic_alias: Option<u16>,
    /// Response Topic: the topic name a receiver should answer on (no wildcards).
    pub response_topic: Option<String>,
    /// Correlation Data: opaque bytes that tie a response to its request.
    pub correlation_data: Option<Bytes>,
    /// User properties, passed on to subscribers in order.
    pub user_properties: Vec<UserProperty>,
    /// Server to client only; one per matching subscription that had an identifier.
    pub subscription_identifiers: Vec<u32>,
    /// Content Type: a description of the payload (a MIME type, say), opaque to the broker.
    pub content_type: Option<String>,
}

impl PublishProperties {
    /// Whether none is set: what most messages carry, and what a message keeps no box for.
    pub fn is_empty(&self) -> bool {
        // Every field named, so that a new one cannot be forgotten here.
        let Self {
            payload_format_indicator,
            message_expiry_interval,
            topic_alias,
            response_topic,
            correlation_data,
            user_properties,
            subscription_identifiers,
            content_type,
        } = self;
        payload_format_indicator.is_none()
            && message_expiry_interval.is_none()
            && topic_alias.is_none()
            && response_topic.is_none()
            && correlation_data.is_none()
            && user_properties.is_empty()
            && subscription_identifiers.is_empty()
            && content_type.is_none()
    }
}

/// PUBACK, PUBREC, PUBREL and PUBCOMP share this shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    /// Packet Identifier of the QoS 1 or 2 exchange this belongs to.
    pub packet_id: u16,
    /// Always `SUCCESS` in 3.1.1.
    pub reason: ReasonCode,
    /// Reason String and user properties (MQTT 5.0).
    pub properties: ReasonProperties,
}

impl Ack {
    /// An acknowledgement of `packet_id` with `SUCCESS` and no properties.
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
    /// Reason String: a human-readable explanation, for diagnostics only.
    pub reason_string: Option<String>,
    /// User properties.
    pub user_properties: Vec<UserProperty>,
}

/// SUBSCRIBE: the client asks for the messages of one or more topic filters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscribe {
    /// Packet Identifier, echoed in the SUBACK.
    pub packet_id: u16,
    /// At least one.
    pub filters: Vec<SubscribeFilter>,
    /// SUBSCRIBE properties (MQTT 5.0).
    pub properties: SubscribeProperties,
}

/// One topic filter of a SUBSCRIBE with its options. The filter is only checked to be a valid
/// UTF-8 string here; whether it is a valid topic filter is answered per filter in SUBACK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscribeFilter {
    /// The topic filter as sent, a `$share/{group}/` prefix included.
    pub filter: String,
    /// The subscription options for this filter.
    pub options: SubscriptionOptions,
}

/// The options of one subscription (MQTT 5.0 §3.8.3.1; MQTT 3.1.1 has only the QoS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SubscriptionOptions {
    /// Maximum QoS: messages are delivered at this QoS or lower.
    pub qos: QoS,
    /// MQTT 5.0: do not send messages this client published itself.
    pub no_local: bool,
    /// MQTT 5.0: keep the retain flag as published.
    pub retain_as_published: bool,
    /// Retain Handling: when retained messages are sent for this subscription.
    pub retain_handling: RetainHandling,
}

/// When retained messages are sent on SUBSCRIBE (MQTT 5.0; 3.1.1 always sends them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RetainHandling {
    /// 0: send retained messages on every SUBSCRIBE.
    #[default]
    OnSubscribe = 0,
    /// 1: send them only when the subscription did not exist yet.
    OnNewSubscribe = 1,
    /// 2: never send them on SUBSCRIBE.
    Never = 2,
}

/// SUBSCRIBE properties (MQTT 5.0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubscribeProperties {
    /// 1 ..= 268,435,455.
    pub subscription_identifier: Option<u32>,
    /// User properties.
    pub user_properties: Vec<UserProperty>,
}

/// SUBACK: the answer to SUBSCRIBE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubAck {
    /// Packet Identifier of the SUBSCRIBE answered.
    pub packet_id: u16,
    /// One per filter: granted QoS or a failure code (3.1.1 knows only 0, 1, 2 and 0x80).
    pub reasons: Vec<ReasonCode>,
    /// Reason String and user properties (MQTT 5.0).
    pub properties: ReasonProperties,
}

/// UNSUBSCRIBE: the client removes subscriptions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsubscribe {
    /// Packet Identifier, echoed in the UNSUBACK.
    pub packet_id: u16,
    /// At least one.
    pub filters: Vec<String>,
    /// User properties (MQTT 5.0; the only property UNSUBSCRIBE has).
    pub user_properties: Vec<UserProperty>,
}

/// UNSUBACK: the answer to UNSUBSCRIBE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsubAck {
    /// Packet Identifier of the UNSUBSCRIBE answered.
    pub packet_id: u16,
    /// One per filter in MQTT 5.0; empty in 3.1.1, which has none.
    pub reasons: Vec<ReasonCode>,
    /// Reason String and user properties (MQTT 5.0).
    pub properties: ReasonProperties,
}

/// DISCONNECT: the end of a connection, and why (MQTT 3.1.1's is empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disconnect {
    /// Always `NORMAL_DISCONNECTION` in 3.1.1.
    pub reason: ReasonCode,
    /// DISCONNECT properties (MQTT 5.0).
    pub properties: DisconnectProperties,
}

impl Disconnect {
    /// A DISCONNECT with `reason` and no properties.
    pub fn new(reason: ReasonCode) -> Self {
        Self {
            reason,
            properties: DisconnectProperties::default(),
        }
    }
}

/// DISCONNECT properties (MQTT 5.0 §3.14.2.2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DisconnectProperties {
    /// Session Expiry Interval in seconds, from the client: replaces the one from CONNECT (a
    /// session that had 0 cannot be given one here).
    pub session_expiry_interval: Option<u32>,
    /// Reason String: a human-readable explanation, for diagnostics only.
    pub reason_string: Option<String>,
    /// User properties.
    pub user_properties: Vec<UserProperty>,
    /// Server Reference: another server the client may use (server to client only).
    pub server_reference: Option<String>,
}

/// AUTH (MQTT 5.0 only): one step of enhanced authentication or re-authentication.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Auth {
    /// `SUCCESS`, `CONTINUE_AUTHENTICATION` or `RE_AUTHENTICATE`.
    pub reason: ReasonCode,
    /// AUTH properties.
    pub properties: AuthProperties,
}

/// AUTH properties (MQTT 5.0 §3.15.2.2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthProperties {
    /// Authentication Method: the one named in CONNECT.
    pub authentication_method: Option<String>,
    /// Authentication Data of this step, as the method defines it.
    pub authentication_data: Option<Bytes>,
    /// Reason String: a human-readable explanation, for diagnostics only.
    pub reason_string: Option<String>,
    /// User properties.
    pub user_properties: Vec<UserProperty>,
}
