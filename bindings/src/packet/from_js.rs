//! Plain JS objects to [`Packet`]s. The shapes are those of `types.d.ts` (`Packet`); the field
//! names are the core's, in camelCase.

use js_sys::{Object, Reflect};
use meridian_core::codec::{
    Ack, Auth, AuthProperties, ConnAck, ConnAckProperties, Connect, ConnectProperties, Disconnect,
    DisconnectProperties, LastWill, Packet, ProtocolVersion, Publish, PublishProperties, QoS,
    ReasonCode, ReasonProperties, RetainHandling, SubAck, Subscribe, SubscribeFilter,
    SubscribeProperties, SubscriptionOptions, UnsubAck, Unsubscribe, UserProperty, WillProperties,
};
use wasm_bindgen::{JsCast, JsValue};

use crate::js::{self, Fields, describe, range_error, type_error};

/// A packet object, e.g. `{ type: "puback", packetId: 7 }`. `version` is the default protocol
/// of a CONNECT that does not name its own `protocolVersion`.
pub(crate) fn packet(value: &JsValue, version: ProtocolVersion) -> Result<Packet, JsValue> {
    let ty = if value.is_object() && !value.is_null() {
        Reflect::get(value, &JsValue::from_str("type"))?
    } else {
        JsValue::UNDEFINED
    };
    let Some(ty) = ty.as_string() else {
        return Err(type_error(&format!(
            "packet: expected an object with a string 'type' field (\"connect\", \"publish\", ...), got {}",
            describe(value)
        )));
    };
    let mut f = Fields::new(value, ty.as_str())?;
    f.get("type")?;
    let packet = match ty.as_str() {
        "connect" => Packet::Connect(connect(&mut f, version)?),
        "connack" => Packet::ConnAck(ConnAck {
            session_present: f.bool("sessionPresent")?.unwrap_or(false),
            reason: reason(&mut f)?,
            properties: connack_properties(&mut f)?,
        }),
        "publish" => Packet::Publish(publish(&mut f)?),
        "puback" => Packet::PubAck(ack(&mut f)?),
        "pubrec" => Packet::PubRec(ack(&mut f)?),
        "pubrel" => Packet::PubRel(ack(&mut f)?),
        "pubcomp" => Packet::PubComp(ack(&mut f)?),
        "subscribe" => Packet::Subscribe(subscribe(&mut f)?),
        "suback" => Packet::SubAck(SubAck {
            packet_id: packet_id(&mut f)?,
            reasons: reason_list(&mut f)?,
            properties: reason_properties(&mut f)?,
        }),
        "unsubscribe" => Packet::Unsubscribe(unsubscribe(&mut f)?),
        "unsuback" => Packet::UnsubAck(UnsubAck {
            packet_id: packet_id(&mut f)?,
            reasons: reason_list(&mut f)?,
            properties: reason_properties(&mut f)?,
        }),
        "pingreq" => Packet::PingReq,
        "pingresp" => Packet::PingResp,
        "disconnect" => Packet::Disconnect(Disconnect {
            reason: reason(&mut f)?,
            properties: disconnect_properties(&mut f)?,
        }),
        "auth" => Packet::Auth(Auth {
            reason: reason(&mut f)?,
            properties: auth_properties(&mut f)?,
        }),
        other => {
            return Err(type_error(&format!(
                "packet: unknown type '{other}' (expected connect, connack, publish, puback, \
                 pubrec, pubrel, pubcomp, subscribe, suback, unsubscribe, unsuback, pingreq, \
                 pingresp, disconnect or auth)"
            )));
        }
    };
    f.finish()?;
    Ok(packet)
}

/// A protocol version given as the MQTT protocol level: 4 (3.1.1) or 5 (5.0).
pub(crate) fn version(value: &JsValue, what: &str) -> Result<ProtocolVersion, JsValue> {
    if js::is_absent(value) {
        return Ok(ProtocolVersion::V5);
    }
    match value.as_f64() {
        Some(4.0) => Ok(ProtocolVersion::V311),
        Some(5.0) => Ok(ProtocolVersion::V5),
        _ => Err(range_error(&format!(
            "{what}: expected 4 (MQTT 3.1.1) or 5 (MQTT 5.0), got {}",
            describe(value)
        ))),
    }
}

pub(crate) fn qos(value: &JsValue, what: &str) -> Result<QoS, JsValue> {
    let n = js::uint(value, 2, what)?;
    // `uint` checked n <= 2, which are all valid QoS values.
    QoS::from_u8(n as u8).ok_or_else(|| range_error(&format!("{what}: expected 0, 1 or 2")))
}

fn opt_qos(f: &mut Fields, key: &'static str) -> Result<Option<QoS>, JsValue> {
    let path = f.path_of(key);
    f.get(key)?.map(|v| qos(&v, &path)).transpose()
}

fn reason(f: &mut Fields) -> Result<ReasonCode, JsValue> {
    Ok(ReasonCode(f.u8("reasonCode")?.unwrap_or(0)))
}

fn packet_id(f: &mut Fields) -> Result<u16, JsValue> {
    let path = f.path_of("packetId");
    let v = f.required("packetId")?;
    // Zero is refused by the encoder with its own message; only the type is checked here.
    Ok(js::uint(&v, u16::MAX.into(), &path)? as u16)
}

fn reason_list(f: &mut Fields) -> Result<Vec<ReasonCode>, JsValue> {
    let path = f.path_of("reasonCodes");
    let Some(v) = f.get("reasonCodes")? else {
        return Ok(Vec::new());
    };
    js::elements(&v, &path)?
        .iter()
        .enumerate()
        .map(|(i, c)| Ok(ReasonCode(js::uint(c, 255, &format!("{path}[{i}]"))? as u8)))
        .collect()
}

fn connect(f: &mut Fields, default: ProtocolVersion) -> Result<Connect, JsValue> {
    let protocol = match f.get("protocolVersion")? {
        Some(v) => version(&v, &f.path_of("protocolVersion"))?,
        None => default,
    };
    let will = match f.get("will")? {
        Some(v) => Some(will(&v, &f.path_of("will"))?),
        None => None,
    };
    Ok(Connect {
        protocol,
        clean_start: f.bool("cleanStart")?.unwrap_or(true),
        keep_alive: f.u16("keepAlive")?.unwrap_or(60),
        client_id: f.string("clientId")?.unwrap_or_default(),
        will,
        username: f.string("username")?,
        password: f.bytes("password")?,
        properties: connect_properties(f)?,
    })
}

fn will(value: &JsValue, path: &str) -> Result<LastWill, JsValue> {
    let mut f = Fields::new(value, path)?;
    let topic_path = f.path_of("topic");
    let topic = f
        .string("topic")?
        .ok_or_else(|| type_error(&format!("{topic_path}: required field is missing")))?;
    let will = LastWill {
        topic,
        payload: f.bytes("payload")?.unwrap_or_default(),
        qos: opt_qos(&mut f, "qos")?.unwrap_or_default(),
        retain: f.bool("retain")?.unwrap_or(false),
        properties: {
            let mut p = sub_fields(&mut f, "properties")?;
            let props = WillProperties {
                will_delay_interval: p.u32("willDelayInterval")?,
                payload_format_indicator: p.u8("payloadFormatIndicator")?,
                message_expiry_interval: p.u32("messageExpiryInterval")?,
                content_type: p.string("contentType")?,
                response_topic: p.string("responseTopic")?,
                correlation_data: p.bytes("correlationData")?,
                user_properties: user_properties(&mut p)?,
            };
            p.finish()?;
            props
        },
    };
    f.finish()?;
    Ok(will)
}

pub(crate) fn publish(f: &mut Fields) -> Result<Publish, JsValue> {
    let topic_path = f.path_of("topic");
    Ok(Publish {
        topic: f
            .string("topic")?
            .ok_or_else(|| type_error(&format!("{topic_path}: required field is missing")))?,
        payload: f.bytes("payload")?.unwrap_or_default(),
        qos: opt_qos(f, "qos")?.unwrap_or_default(),
        retain: f.bool("retain")?.unwrap_or(false),
        dup: f.bool("dup")?.unwrap_or(false),
        packet_id: f.u16("packetId")?,
        properties: publish_properties(f)?,
    })
}

/// The `properties` object of a PUBLISH (also used for messages the shell publishes).
pub(crate) fn publish_properties(f: &mut Fields) -> Result<PublishProperties, JsValue> {
    let mut p = sub_fields(f, "properties")?;
    let sub_ids_path = p.path_of("subscriptionIdentifiers");
    let subscription_identifiers = match p.get("subscriptionIdentifiers")? {
        Some(v) => js::elements(&v, &sub_ids_path)?
            .iter()
            .enumerate()
            .map(|(i, id)| {
                Ok(js::uint(id, u32::MAX.into(), &format!("{sub_ids_path}[{i}]"))? as u32)
            })
            .collect::<Result<_, JsValue>>()?,
        None => Vec::new(),
    };
    let props = PublishProperties {
        payload_format_indicator: p.u8("payloadFormatIndicator")?,
        message_expiry_interval: p.u32("messageExpiryInterval")?,
        topic_alias: p.u16("topicAlias")?,
        response_topic: p.string("responseTopic")?,
        correlation_data: p.bytes("correlationData")?,
        user_properties: user_properties(&mut p)?,
        subscription_identifiers,
        content_type: p.string("contentType")?,
    };
    p.finish()?;
    Ok(props)
}

fn ack(f: &mut Fields) -> Result<Ack, JsValue> {
    Ok(Ack {
        packet_id: packet_id(f)?,
        reason: reason(f)?,
        properties: reason_properties(f)?,
    })
}

fn subscribe(f: &mut Fields) -> Result<Subscribe, JsValue> {
    let packet_id = packet_id(f)?;
    let path = f.path_of("filters");
    let filters = js::elements(&f.required("filters")?, &path)?
        .iter()
        .enumerate()
        .map(|(i, v)| subscribe_filter(v, &format!("{path}[{i}]")))
        .collect::<Result<_, JsValue>>()?;
    let mut p = sub_fields(f, "properties")?;
    let properties = SubscribeProperties {
        subscription_identifier: p.u32("subscriptionIdentifier")?,
        user_properties: user_properties(&mut p)?,
    };
    p.finish()?;
    Ok(Subscribe {
        packet_id,
        filters,
        properties,
    })
}

/// `"a/+"` (QoS 0, default options) or `{ filter, qos, noLocal, retainAsPublished, retainHandling }`.
fn subscribe_filter(value: &JsValue, path: &str) -> Result<SubscribeFilter, JsValue> {
    if let Some(filter) = value.as_string() {
        return Ok(SubscribeFilter {
            filter,
            options: SubscriptionOptions::default(),
        });
    }
    let mut f = Fields::new(value, path)?;
    let filter_path = f.path_of("filter");
    let filter = f
        .string("filter")?
        .ok_or_else(|| type_error(&format!("{filter_path}: required field is missing")))?;
    let retain_handling = match f.u8("retainHandling")? {
        None | Some(0) => RetainHandling::OnSubscribe,
        Some(1) => RetainHandling::OnNewSubscribe,
        Some(2) => RetainHandling::Never,
        Some(n) => {
            return Err(range_error(&format!(
                "{}: expected 0, 1 or 2, got {n}",
                f.path_of("retainHandling")
            )));
        }
    };
    let options = SubscriptionOptions {
        qos: opt_qos(&mut f, "qos")?.unwrap_or_default(),
        no_local: f.bool("noLocal")?.unwrap_or(false),
        retain_as_published: f.bool("retainAsPublished")?.unwrap_or(false),
        retain_handling,
    };
    f.finish()?;
    Ok(SubscribeFilter { filter, options })
}

fn unsubscribe(f: &mut Fields) -> Result<Unsubscribe, JsValue> {
    let packet_id = packet_id(f)?;
    let path = f.path_of("filters");
    let filters = js::elements(&f.required("filters")?, &path)?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_string().ok_or_else(|| {
                type_error(&format!(
                    "{path}[{i}]: expected a string, got {}",
                    describe(v)
                ))
            })
        })
        .collect::<Result<_, JsValue>>()?;
    let mut p = sub_fields(f, "properties")?;
    let user_properties = user_properties(&mut p)?;
    p.finish()?;
    Ok(Unsubscribe {
        packet_id,
        filters,
        user_properties,
    })
}

/// The reader of a nested object field (absent reads as empty).
fn sub_fields(f: &mut Fields, key: &'static str) -> Result<Fields, JsValue> {
    let path = f.path_of(key);
    let value = f.get(key)?.unwrap_or(JsValue::UNDEFINED);
    Fields::optional(&value, path)
}

fn connect_properties(f: &mut Fields) -> Result<ConnectProperties, JsValue> {
    let mut p = sub_fields(f, "properties")?;
    let props = ConnectProperties {
        session_expiry_interval: p.u32("sessionExpiryInterval")?,
        receive_maximum: p.u16("receiveMaximum")?,
        maximum_packet_size: p.u32("maximumPacketSize")?,
        topic_alias_maximum: p.u16("topicAliasMaximum")?,
        request_response_information: p.bool("requestResponseInformation")?,
        request_problem_information: p.bool("requestProblemInformation")?,
        user_properties: user_properties(&mut p)?,
        authentication_method: p.string("authenticationMethod")?,
        authentication_data: p.bytes("authenticationData")?,
    };
    p.finish()?;
    Ok(props)
}

fn connack_properties(f: &mut Fields) -> Result<ConnAckProperties, JsValue> {
    let mut p = sub_fields(f, "properties")?;
    let props = ConnAckProperties {
        session_expiry_interval: p.u32("sessionExpiryInterval")?,
        receive_maximum: p.u16("receiveMaximum")?,
        maximum_qos: opt_qos(&mut p, "maximumQos")?,
        retain_available: p.bool("retainAvailable")?,
        maximum_packet_size: p.u32("maximumPacketSize")?,
        assigned_client_identifier: p.string("assignedClientIdentifier")?,
        topic_alias_maximum: p.u16("topicAliasMaximum")?,
        reason_string: p.string("reasonString")?,
        user_properties: user_properties(&mut p)?,
        wildcard_subscription_available: p.bool("wildcardSubscriptionAvailable")?,
        subscription_identifiers_available: p.bool("subscriptionIdentifiersAvailable")?,
        shared_subscription_available: p.bool("sharedSubscriptionAvailable")?,
        server_keep_alive: p.u16("serverKeepAlive")?,
        response_information: p.string("responseInformation")?,
        server_reference: p.string("serverReference")?,
        authentication_method: p.string("authenticationMethod")?,
        authentication_data: p.bytes("authenticationData")?,
    };
    p.finish()?;
    Ok(props)
}

fn reason_properties(f: &mut Fields) -> Result<ReasonProperties, JsValue> {
    let mut p = sub_fields(f, "properties")?;
    let props = ReasonProperties {
        reason_string: p.string("reasonString")?,
        user_properties: user_properties(&mut p)?,
    };
    p.finish()?;
    Ok(props)
}

fn disconnect_properties(f: &mut Fields) -> Result<DisconnectProperties, JsValue> {
    let mut p = sub_fields(f, "properties")?;
    let props = DisconnectProperties {
        session_expiry_interval: p.u32("sessionExpiryInterval")?,
        reason_string: p.string("reasonString")?,
        user_properties: user_properties(&mut p)?,
        server_reference: p.string("serverReference")?,
    };
    p.finish()?;
    Ok(props)
}

fn auth_properties(f: &mut Fields) -> Result<AuthProperties, JsValue> {
    let mut p = sub_fields(f, "properties")?;
    let props = AuthProperties {
        authentication_method: p.string("authenticationMethod")?,
        authentication_data: p.bytes("authenticationData")?,
        reason_string: p.string("reasonString")?,
        user_properties: user_properties(&mut p)?,
    };
    p.finish()?;
    Ok(props)
}

/// `userProperties`: an array of `[name, value]` pairs (order kept, names may repeat), or an
/// object `{ name: value | value[] }` as MQTT.js writes them.
fn user_properties(f: &mut Fields) -> Result<Vec<UserProperty>, JsValue> {
    let path = f.path_of("userProperties");
    let Some(v) = f.get("userProperties")? else {
        return Ok(Vec::new());
    };
    let string = |v: &JsValue, at: &str| {
        v.as_string()
            .ok_or_else(|| type_error(&format!("{at}: expected a string, got {}", describe(v))))
    };
    let mut out = Vec::new();
    if js_sys::Array::is_array(&v) {
        for (i, pair) in js::elements(&v, &path)?.iter().enumerate() {
            let at = format!("{path}[{i}]");
            let items = js::elements(pair, &at)?;
            let [name, value] = items.as_slice() else {
                return Err(type_error(&format!(
                    "{at}: expected a [name, value] pair, got {} elements",
                    items.len()
                )));
            };
            out.push((
                string(name, &format!("{at}[0]"))?,
                string(value, &format!("{at}[1]"))?,
            ));
        }
    } else if v.is_object() {
        for entry in Object::entries(v.unchecked_ref::<Object>()).iter() {
            let entry: js_sys::Array = entry.unchecked_into();
            let name = entry.get(0).as_string().unwrap_or_default();
            let value = entry.get(1);
            let at = format!("{path}.{name}");
            if js_sys::Array::is_array(&value) {
                for (i, item) in js::elements(&value, &at)?.iter().enumerate() {
                    out.push((name.clone(), string(item, &format!("{at}[{i}]"))?));
                }
            } else {
                out.push((name.clone(), string(&value, &at)?));
            }
        }
    } else {
        return Err(type_error(&format!(
            "{path}: expected an array of [name, value] pairs, got {}",
            describe(&v)
        )));
    }
    Ok(out)
}
