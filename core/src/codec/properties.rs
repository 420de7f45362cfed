//! MQTT 5.0 properties (§2.2.2): identifiers, reading a property block into each packet's
//! property struct, and writing them back.
//!
//! Reading enforces the per-packet tables of §2.2.2.2: an identifier a packet may not carry is
//! `MALFORMED_PACKET`, a second copy of a single-valued property and an out-of-range value are
//! `PROTOCOL_ERROR`. Writing emits only the properties that are set.

use bytes::Bytes;

use super::error::{DecodeError, EncodeError};
use super::packet::{
    AuthProperties, ConnAckProperties, ConnectProperties, DisconnectProperties, PublishProperties,
    QoS, ReasonProperties, SubscribeProperties, UserProperty, WillProperties,
};
use super::primitives::{
    Encode, Sink, VAR_INT_MAX, put_binary, put_string, put_var_int, read_binary, read_string,
    read_string_pair, read_u8, read_u16, read_u32, read_var_int,
};
use super::reason::ReasonCode;

pub(crate) const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
pub(crate) const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
pub(crate) const CONTENT_TYPE: u8 = 0x03;
pub(crate) const RESPONSE_TOPIC: u8 = 0x08;
pub(crate) const CORRELATION_DATA: u8 = 0x09;
pub(crate) const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
pub(crate) const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
pub(crate) const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
pub(crate) const SERVER_KEEP_ALIVE: u8 = 0x13;
pub(crate) const AUTHENTICATION_METHOD: u8 = 0x15;
pub(crate) const AUTHENTICATION_DATA: u8 = 0x16;
pub(crate) const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
pub(crate) const WILL_DELAY_INTERVAL: u8 = 0x18;
pub(crate) const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
pub(crate) const RESPONSE_INFORMATION: u8 = 0x1A;
pub(crate) const SERVER_REFERENCE: u8 = 0x1C;
pub(crate) const REASON_STRING: u8 = 0x1F;
pub(crate) const RECEIVE_MAXIMUM: u8 = 0x21;
pub(crate) const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
pub(crate) const TOPIC_ALIAS: u8 = 0x23;
pub(crate) const MAXIMUM_QOS: u8 = 0x24;
pub(crate) const RETAIN_AVAILABLE: u8 = 0x25;
pub(crate) const USER_PROPERTY: u8 = 0x26;
pub(crate) const MAXIMUM_PACKET_SIZE: u8 = 0x27;
pub(crate) const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
pub(crate) const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
pub(crate) const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;

// ---------------------------------------------------------------------------------------------
// Reading

/// Iterates over one property block, split off the packet cursor.
struct Reader {
    block: Bytes,
}

impl Reader {
    /// Reads the property length and splits that many bytes off `buf`.
    fn new(buf: &mut Bytes) -> Result<Self, DecodeError> {
        let len = read_var_int(buf)?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > buf.len() {
            return Err(DecodeError::malformed("property length exceeds the packet"));
        }
        Ok(Self {
            block: buf.split_to(len),
        })
    }

    /// The next property identifier, or `None` at the end of the block.
    fn next_id(&mut self) -> Result<Option<u8>, DecodeError> {
        if self.block.is_empty() {
            return Ok(None);
        }
        let id = read_var_int(&mut self.block)?;
        u8::try_from(id).map(Some).map_err(|_| unknown())
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        read_u8(&mut self.block)
    }
    fn two(&mut self) -> Result<u16, DecodeError> {
        read_u16(&mut self.block)
    }
    fn four(&mut self) -> Result<u32, DecodeError> {
        read_u32(&mut self.block)
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        read_string(&mut self.block)
    }
    fn binary(&mut self) -> Result<Bytes, DecodeError> {
        read_binary(&mut self.block)
    }
    fn pair(&mut self) -> Result<UserProperty, DecodeError> {
        read_string_pair(&mut self.block)
    }

    /// A byte that must be 0 or 1.
    fn boolean(&mut self) -> Result<bool, DecodeError> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::protocol("boolean property not 0 or 1")),
        }
    }

    fn non_zero_two(&mut self, detail: &'static str) -> Result<u16, DecodeError> {
        match self.two()? {
            0 => Err(DecodeError::protocol(detail)),
            v => Ok(v),
        }
    }

    fn payload_format(&mut self) -> Result<u8, DecodeError> {
        match self.byte()? {
            v @ (0 | 1) => Ok(v),
            _ => Err(DecodeError::protocol("payload format indicator not 0 or 1")),
        }
    }

    fn maximum_packet_size(&mut self) -> Result<u32, DecodeError> {
        match self.four()? {
            0 => Err(DecodeError::protocol("maximum packet size 0")),
            v => Ok(v),
        }
    }

    fn subscription_identifier(&mut self) -> Result<u32, DecodeError> {
        match read_var_int(&mut self.block)? {
            0 => Err(DecodeError::protocol("subscription identifier 0")),
            v => Ok(v),
        }
    }
}

fn unknown() -> DecodeError {
    DecodeError::malformed("property not allowed in this packet")
}

/// Stores a property that may appear at most once.
fn once<T>(slot: &mut Option<T>, value: T) -> Result<(), DecodeError> {
    if slot.is_some() {
        return Err(DecodeError::protocol("property appears more than once"));
    }
    *slot = Some(value);
    Ok(())
}

pub(crate) fn read_connect(buf: &mut Bytes) -> Result<ConnectProperties, DecodeError> {
    let mut r = Reader::new(buf)?;
    let mut p = ConnectProperties::default();
    while let Some(id) = r.next_id()? {
        match id {
            SESSION_EXPIRY_INTERVAL => once(&mut p.session_expiry_interval, r.four()?)?,
            RECEIVE_MAXIMUM => once(&mut p.receive_maximum, r.non_zero_two("receive maximum 0")?)?,
            MAXIMUM_PACKET_SIZE => once(&mut p.maximum_packet_size, r.maximum_packet_size()?)?,
            TOPIC_ALIAS_MAXIMUM => once(&mut p.topic_alias_maximum, r.two()?)?,
            REQUEST_RESPONSE_INFORMATION => {
                once(&mut p.request_response_information, r.boolean()?)?
            }
            REQUEST_PROBLEM_INFORMATION => once(&mut p.request_problem_information, r.boolean()?)?,
            USER_PROPERTY => p.user_properties.push(r.pair()?),
            AUTHENTICATION_METHOD => once(&mut p.authentication_method, r.string()?)?,
            AUTHENTICATION_DATA => once(&mut p.authentication_data, r.binary()?)?,
            _ => return Err(unknown()),
        }
    }
    if p.authentication_data.is_some() && p.authentication_method.is_none() {
        return Err(DecodeError::protocol(
            "authentication data without authentication method",
        ));
    }
    Ok(p)
}

pub(crate) fn read_will(buf: &mut Bytes) -> Result<WillProperties, DecodeError> {
    let mut r = Reader::new(buf)?;
    let mut p = WillProperties::default();
    while let Some(id) = r.next_id()? {
        match id {
            WILL_DELAY_INTERVAL => once(&mut p.will_delay_interval, r.four()?)?,
            PAYLOAD_FORMAT_INDICATOR => once(&mut p.payload_format_indicator, r.payload_format()?)?,
            MESSAGE_EXPIRY_INTERVAL => once(&mut p.message_expiry_interval, r.four()?)?,
            CONTENT_TYPE => once(&mut p.content_type, r.string()?)?,
            RESPONSE_TOPIC => once(&mut p.response_topic, r.string()?)?,
            CORRELATION_DATA => once(&mut p.correlation_data, r.binary()?)?,
            USER_PROPERTY => p.user_properties.push(r.pair()?),
            _ => return Err(unknown()),
        }
    }
    Ok(p)
}

pub(crate) fn read_connack(buf: &mut Bytes) -> Result<ConnAckProperties, DecodeError> {
    let mut r = Reader::new(buf)?;
    let mut p = ConnAckProperties::default();
    while let Some(id) = r.next_id()? {
        match id {
            SESSION_EXPIRY_INTERVAL => once(&mut p.session_expiry_interval, r.four()?)?,
            RECEIVE_MAXIMUM => once(&mut p.receive_maximum, r.non_zero_two("receive maximum 0")?)?,
            MAXIMUM_QOS => {
                let qos = match r.byte()? {
                    0 => QoS::AtMostOnce,
                    1 => QoS::AtLeastOnce,
                    _ => return Err(DecodeError::protocol("maximum QoS not 0 or 1")),
                };
                once(&mut p.maximum_qos, qos)?
            }
            RETAIN_AVAILABLE => once(&mut p.retain_available, r.boolean()?)?,
            MAXIMUM_PACKET_SIZE => once(&mut p.maximum_packet_size, r.maximum_packet_size()?)?,
            ASSIGNED_CLIENT_IDENTIFIER => once(&mut p.assigned_client_identifier, r.string()?)?,
            TOPIC_ALIAS_MAXIMUM => once(&mut p.topic_alias_maximum, r.two()?)?,
            REASON_STRING => once(&mut p.reason_string, r.string()?)?,
            USER_PROPERTY => p.user_properties.push(r.pair()?),
            WILDCARD_SUBSCRIPTION_AVAILABLE => {
                once(&mut p.wildcard_subscription_available, r.boolean()?)?
            }
            SUBSCRIPTION_IDENTIFIER_AVAILABLE => {
                once(&mut p.subscription_identifiers_available, r.boolean()?)?
            }
            SHARED_SUBSCRIPTION_AVAILABLE => {
                once(&mut p.shared_subscription_available, r.boolean()?)?
            }
            SERVER_KEEP_ALIVE => once(&mut p.server_keep_alive, r.two()?)?,
            RESPONSE_INFORMATION => once(&mut p.response_information, r.string()?)?,
            SERVER_REFERENCE => once(&mut p.server_reference, r.string()?)?,
            AUTHENTICATION_METHOD => once(&mut p.authentication_method, r.string()?)?,
            AUTHENTICATION_DATA => once(&mut p.authentication_data, r.binary()?)?,
            _ => return Err(unknown()),
        }
    }
    Ok(p)
}

pub(crate) fn read_publish(buf: &mut Bytes) -> Result<PublishProperties, DecodeError> {
    let mut r = Reader::new(buf)?;
    let mut p = PublishProperties::default();
    while let Some(id) = r.next_id()? {
        match id {
            PAYLOAD_FORMAT_INDICATOR => once(&mut p.payload_format_indicator, r.payload_format()?)?,
            MESSAGE_EXPIRY_INTERVAL => once(&mut p.message_expiry_interval, r.four()?)?,
            TOPIC_ALIAS => {
                let alias = match r.two()? {
                    0 => {
                        return Err(DecodeError::new(
                            ReasonCode::TOPIC_ALIAS_INVALID,
                            "topic alias 0",
                        ));
                    }
                    v => v,
                };
                once(&mut p.topic_alias, alias)?
            }
            RESPONSE_TOPIC => once(&mut p.response_topic, r.string()?)?,
            CORRELATION_DATA => once(&mut p.correlation_data, r.binary()?)?,
            USER_PROPERTY => p.user_properties.push(r.pair()?),
            SUBSCRIPTION_IDENTIFIER => p
                .subscription_identifiers
                .push(r.subscription_identifier()?),
            CONTENT_TYPE => once(&mut p.content_type, r.string()?)?,
            _ => return Err(unknown()),
        }
    }
    Ok(p)
}

/// The properties of PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK and UNSUBACK.
pub(crate) fn read_reason(buf: &mut Bytes) -> Result<ReasonProperties, DecodeError> {
    let mut r = Reader::new(buf)?;
    let mut p = ReasonProperties::default();
    while let Some(id) = r.next_id()? {
        match id {
            REASON_STRING => once(&mut p.reason_string, r.string()?)?,
            USER_PROPERTY => p.user_properties.push(r.pair()?),
            _ => return Err(unknown()),
        }
    }
    Ok(p)
}

pub(crate) fn read_subscribe(buf: &mut Bytes) -> Result<SubscribeProperties, DecodeError> {
    let mut r = Reader::new(buf)?;
    let mut p = SubscribeProperties::default();
    while let Some(id) = r.next_id()? {
        match id {
            SUBSCRIPTION_IDENTIFIER => {
                once(&mut p.subscription_identifier, r.subscription_identifier()?)?
            }
            USER_PROPERTY => p.user_properties.push(r.pair()?),
            _ => return Err(unknown()),
        }
    }
    Ok(p)
}

/// The properties of UNSUBSCRIBE: user properties only.
pub(crate) fn read_user_properties(buf: &mut Bytes) -> Result<Vec<UserProperty>, DecodeError> {
    let mut r = Reader::new(buf)?;
    let mut user_properties = Vec::new();
    while let Some(id) = r.next_id()? {
        match id {
            USER_PROPERTY => user_properties.push(r.pair()?),
            _ => return Err(unknown()),
        }
    }
    Ok(user_properties)
}

pub(crate) fn read_disconnect(buf: &mut Bytes) -> Result<DisconnectProperties, DecodeError> {
    let mut r = Reader::new(buf)?;
    let mut p = DisconnectProperties::default();
    while let Some(id) = r.next_id()? {
        match id {
            SESSION_EXPIRY_INTERVAL => once(&mut p.session_expiry_interval, r.four()?)?,
            REASON_STRING => once(&mut p.reason_string, r.string()?)?,
            USER_PROPERTY => p.user_properties.push(r.pair()?),
            SERVER_REFERENCE => once(&mut p.server_reference, r.string()?)?,
            _ => return Err(unknown()),
        }
    }
    Ok(p)
}

pub(crate) fn read_auth(buf: &mut Bytes) -> Result<AuthProperties, DecodeError> {
    let mut r = Reader::new(buf)?;
    let mut p = AuthProperties::default();
    while let Some(id) = r.next_id()? {
        match id {
            AUTHENTICATION_METHOD => once(&mut p.authentication_method, r.string()?)?,
            AUTHENTICATION_DATA => once(&mut p.authentication_data, r.binary()?)?,
            REASON_STRING => once(&mut p.reason_string, r.string()?)?,
            USER_PROPERTY => p.user_properties.push(r.pair()?),
            _ => return Err(unknown()),
        }
    }
    Ok(p)
}

// ---------------------------------------------------------------------------------------------
// Writing

fn out_of_range(property: &'static str) -> EncodeError {
    EncodeError::PropertyOutOfRange { property }
}

fn put_byte<S: Sink>(s: &mut S, id: u8, v: Option<u8>) {
    if let Some(v) = v {
        s.put_u8(id);
        s.put_u8(v);
    }
}

fn put_bool<S: Sink>(s: &mut S, id: u8, v: Option<bool>) {
    put_byte(s, id, v.map(u8::from));
}

fn put_two<S: Sink>(s: &mut S, id: u8, v: Option<u16>) {
    if let Some(v) = v {
        s.put_u8(id);
        s.put_u16(v);
    }
}

fn put_four<S: Sink>(s: &mut S, id: u8, v: Option<u32>) {
    if let Some(v) = v {
        s.put_u8(id);
        s.put_u32(v);
    }
}

fn put_str<S: Sink>(s: &mut S, id: u8, v: Option<&String>) -> Result<(), EncodeError> {
    if let Some(v) = v {
        s.put_u8(id);
        put_string(s, v)?;
    }
    Ok(())
}

fn put_bin<S: Sink>(s: &mut S, id: u8, v: Option<&Bytes>) -> Result<(), EncodeError> {
    if let Some(v) = v {
        s.put_u8(id);
        put_binary(s, v)?;
    }
    Ok(())
}

fn put_users<S: Sink>(s: &mut S, users: &[UserProperty]) -> Result<(), EncodeError> {
    for (name, value) in users {
        s.put_u8(USER_PROPERTY);
        put_string(s, name)?;
        put_string(s, value)?;
    }
    Ok(())
}

fn put_subscription_identifier<S: Sink>(s: &mut S, v: u32) -> Result<(), EncodeError> {
    if v == 0 || v > VAR_INT_MAX {
        return Err(out_of_range("subscription identifier"));
    }
    s.put_u8(SUBSCRIPTION_IDENTIFIER);
    put_var_int(s, v);
    Ok(())
}

fn non_zero<T: Default + PartialEq>(
    v: Option<T>,
    property: &'static str,
) -> Result<Option<T>, EncodeError> {
    match v {
        Some(v) if v == T::default() => Err(out_of_range(property)),
        v => Ok(v),
    }
}

fn payload_format(v: Option<u8>) -> Result<Option<u8>, EncodeError> {
    match v {
        Some(2..) => Err(out_of_range("payload format indicator")),
        v => Ok(v),
    }
}

impl Encode for ConnectProperties {
    fn encode<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_four(s, SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        put_two(
            s,
            RECEIVE_MAXIMUM,
            non_zero(self.receive_maximum, "receive maximum")?,
        );
        put_four(
            s,
            MAXIMUM_PACKET_SIZE,
            non_zero(self.maximum_packet_size, "maximum packet size")?,
        );
        put_two(s, TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        put_bool(
            s,
            REQUEST_RESPONSE_INFORMATION,
            self.request_response_information,
        );
        put_bool(
            s,
            REQUEST_PROBLEM_INFORMATION,
            self.request_problem_information,
        );
        put_users(s, &self.user_properties)?;
        put_str(
            s,
            AUTHENTICATION_METHOD,
            self.authentication_method.as_ref(),
        )?;
        put_bin(s, AUTHENTICATION_DATA, self.authentication_data.as_ref())
    }
}

impl Encode for WillProperties {
    fn encode<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_four(s, WILL_DELAY_INTERVAL, self.will_delay_interval);
        put_byte(
            s,
            PAYLOAD_FORMAT_INDICATOR,
            payload_format(self.payload_format_indicator)?,
        );
        put_four(s, MESSAGE_EXPIRY_INTERVAL, self.message_expiry_interval);
        put_str(s, CONTENT_TYPE, self.content_type.as_ref())?;
        put_str(s, RESPONSE_TOPIC, self.response_topic.as_ref())?;
        put_bin(s, CORRELATION_DATA, self.correlation_data.as_ref())?;
        put_users(s, &self.user_properties)
    }
}

impl Encode for ConnAckProperties {
    fn encode<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_four(s, SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        put_two(
            s,
            RECEIVE_MAXIMUM,
            non_zero(self.receive_maximum, "receive maximum")?,
        );
        let maximum_qos = match self.maximum_qos {
            Some(QoS::ExactlyOnce) => return Err(out_of_range("maximum QoS")),
            qos => qos.map(|q| q as u8),
        };
        put_byte(s, MAXIMUM_QOS, maximum_qos);
        put_bool(s, RETAIN_AVAILABLE, self.retain_available);
        put_four(
            s,
            MAXIMUM_PACKET_SIZE,
            non_zero(self.maximum_packet_size, "maximum packet size")?,
        );
        put_str(
            s,
            ASSIGNED_CLIENT_IDENTIFIER,
            self.assigned_client_identifier.as_ref(),
        )?;
        put_two(s, TOPIC_ALIAS_MAXIMUM, self.topic_alias_maximum);
        put_str(s, REASON_STRING, self.reason_string.as_ref())?;
        put_users(s, &self.user_properties)?;
        put_bool(
            s,
            WILDCARD_SUBSCRIPTION_AVAILABLE,
            self.wildcard_subscription_available,
        );
        put_bool(
            s,
            SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            self.subscription_identifiers_available,
        );
        put_bool(
            s,
            SHARED_SUBSCRIPTION_AVAILABLE,
            self.shared_subscription_available,
        );
        put_two(s, SERVER_KEEP_ALIVE, self.server_keep_alive);
        put_str(s, RESPONSE_INFORMATION, self.response_information.as_ref())?;
        put_str(s, SERVER_REFERENCE, self.server_reference.as_ref())?;
        put_str(
            s,
            AUTHENTICATION_METHOD,
            self.authentication_method.as_ref(),
        )?;
        put_bin(s, AUTHENTICATION_DATA, self.authentication_data.as_ref())
    }
}

/// PUBLISH properties as sent to one subscriber: the shared ones from `base`, with topic alias,
/// message expiry interval and subscription identifiers replaced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PublishPropertiesView<'a> {
    pub base: &'a PublishProperties,
    pub topic_alias: Option<u16>,
    pub message_expiry_interval: Option<u32>,
    pub subscription_identifiers: &'a [u32],
}

impl Encode for PublishPropertiesView<'_> {
    fn encode<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        let base = self.base;
        put_byte(
            s,
            PAYLOAD_FORMAT_INDICATOR,
            payload_format(base.payload_format_indicator)?,
        );
        put_four(s, MESSAGE_EXPIRY_INTERVAL, self.message_expiry_interval);
        put_two(s, TOPIC_ALIAS, non_zero(self.topic_alias, "topic alias")?);
        put_str(s, RESPONSE_TOPIC, base.response_topic.as_ref())?;
        put_bin(s, CORRELATION_DATA, base.correlation_data.as_ref())?;
        put_users(s, &base.user_properties)?;
        for &id in self.subscription_identifiers {
            put_subscription_identifier(s, id)?;
        }
        put_str(s, CONTENT_TYPE, base.content_type.as_ref())
    }
}

impl Encode for ReasonProperties {
    fn encode<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_str(s, REASON_STRING, self.reason_string.as_ref())?;
        put_users(s, &self.user_properties)
    }
}

impl Encode for SubscribeProperties {
    fn encode<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        if let Some(id) = self.subscription_identifier {
            put_subscription_identifier(s, id)?;
        }
        put_users(s, &self.user_properties)
    }
}

/// The property block of UNSUBSCRIBE: user properties only.
pub(crate) struct UserProperties<'a>(pub &'a [UserProperty]);

impl Encode for UserProperties<'_> {
    fn encode<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_users(s, self.0)
    }
}

impl Encode for DisconnectProperties {
    fn encode<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_four(s, SESSION_EXPIRY_INTERVAL, self.session_expiry_interval);
        put_str(s, REASON_STRING, self.reason_string.as_ref())?;
        put_users(s, &self.user_properties)?;
        put_str(s, SERVER_REFERENCE, self.server_reference.as_ref())
    }
}

impl Encode for AuthProperties {
    fn encode<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError> {
        put_str(
            s,
            AUTHENTICATION_METHOD,
            self.authentication_method.as_ref(),
        )?;
        put_bin(s, AUTHENTICATION_DATA, self.authentication_data.as_ref())?;
        put_str(s, REASON_STRING, self.reason_string.as_ref())?;
        put_users(s, &self.user_properties)
    }
}
