//! [`Packet`]s to plain JS objects: the inverse of `from_js`, so that
//! `encodePacket(decodePacket(b))` gives `b` back. Absent optional fields are left out.

use meridian_core::codec::{
    Ack, AuthProperties, ConnAckProperties, ConnectProperties, DisconnectProperties, LastWill,
    Packet, ProtocolVersion, Publish, PublishProperties, ReasonCode, ReasonProperties,
    SubscribeFilter, UserProperty,
};
use wasm_bindgen::JsValue;

use crate::js::{self, Obj};

pub(crate) fn version(v: ProtocolVersion) -> u8 {
    v.level()
}

/// The `type` tag of a packet object.
fn type_name(p: &Packet) -> &'static str {
    match p {
        Packet::Connect(_) => "connect",
        Packet::ConnAck(_) => "connack",
        Packet::Publish(_) => "publish",
        Packet::PubAck(_) => "puback",
        Packet::PubRec(_) => "pubrec",
        Packet::PubRel(_) => "pubrel",
        Packet::PubComp(_) => "pubcomp",
        Packet::Subscribe(_) => "subscribe",
        Packet::SubAck(_) => "suback",
        Packet::Unsubscribe(_) => "unsubscribe",
        Packet::UnsubAck(_) => "unsuback",
        Packet::PingReq => "pingreq",
        Packet::PingResp => "pingresp",
        Packet::Disconnect(_) => "disconnect",
        Packet::Auth(_) => "auth",
    }
}

pub(crate) fn packet(p: &Packet) -> JsValue {
    let o = Obj::tagged(type_name(p));
    match p {
        Packet::Connect(c) => {
            o.set("protocolVersion", version(c.protocol))
                .set("cleanStart", c.clean_start)
                .set("keepAlive", c.keep_alive)
                .set("clientId", c.client_id.as_str())
                .opt("will", c.will.as_ref().map(will))
                .opt("username", c.username.as_deref())
                .opt_bytes("password", c.password.as_ref())
                .set("properties", connect_properties(&c.properties));
        }
        Packet::ConnAck(c) => {
            o.set("sessionPresent", c.session_present)
                .set("reasonCode", c.reason.0)
                .set("properties", connack_properties(&c.properties));
        }
        Packet::Publish(p) => publish_fields(&o, p),
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            ack_fields(&o, a)
        }
        Packet::Subscribe(s) => {
            let props = Obj::new();
            props.opt(
                "subscriptionIdentifier",
                s.properties.subscription_identifier,
            );
            user_properties(&props, &s.properties.user_properties);
            o.set("packetId", s.packet_id)
                .set("filters", js::array(s.filters.iter().map(subscribe_filter)))
                .set("properties", props.into_js());
        }
        Packet::SubAck(a) => {
            o.set("packetId", a.packet_id)
                .set("reasonCodes", reason_codes(&a.reasons))
                .set("properties", reason_properties(&a.properties));
        }
        Packet::Unsubscribe(u) => {
            let props = Obj::new();
            user_properties(&props, &u.user_properties);
            o.set("packetId", u.packet_id)
                .set(
                    "filters",
                    js::array(u.filters.iter().map(|f| JsValue::from_str(f))),
                )
                .set("properties", props.into_js());
        }
        Packet::UnsubAck(a) => {
            o.set("packetId", a.packet_id)
                .set("reasonCodes", reason_codes(&a.reasons))
                .set("properties", reason_properties(&a.properties));
        }
        Packet::PingReq | Packet::PingResp => {}
        Packet::Disconnect(d) => {
            o.set("reasonCode", d.reason.0)
                .set("properties", disconnect_properties(&d.properties));
        }
        Packet::Auth(a) => {
            o.set("reasonCode", a.reason.0)
                .set("properties", auth_properties(&a.properties));
        }
    }
    o.into_js()
}

fn publish_fields(o: &Obj, p: &Publish) {
    o.set("topic", p.topic.as_str())
        .set("payload", js::u8array(&p.payload))
        .set("qos", p.qos as u8)
        .set("retain", p.retain)
        .set("dup", p.dup)
        .opt("packetId", p.packet_id)
        .set("properties", publish_properties(&p.properties));
}

pub(crate) fn publish_properties(p: &PublishProperties) -> JsValue {
    let o = Obj::new();
    o.opt("payloadFormatIndicator", p.payload_format_indicator)
        .opt("messageExpiryInterval", p.message_expiry_interval)
        .opt("topicAlias", p.topic_alias)
        .opt("responseTopic", p.response_topic.as_deref())
        .opt_bytes("correlationData", p.correlation_data.as_ref())
        .opt("contentType", p.content_type.as_deref());
    if !p.subscription_identifiers.is_empty() {
        o.set(
            "subscriptionIdentifiers",
            js::array(p.subscription_identifiers.iter().copied()),
        );
    }
    user_properties(&o, &p.user_properties);
    o.into_js()
}

fn ack_fields(o: &Obj, a: &Ack) {
    o.set("packetId", a.packet_id)
        .set("reasonCode", a.reason.0)
        .set("properties", reason_properties(&a.properties));
}

fn will(w: &LastWill) -> JsValue {
    let p = &w.properties;
    let props = Obj::new();
    props
        .opt("willDelayInterval", p.will_delay_interval)
        .opt("payloadFormatIndicator", p.payload_format_indicator)
        .opt("messageExpiryInterval", p.message_expiry_interval)
        .opt("contentType", p.content_type.as_deref())
        .opt("responseTopic", p.response_topic.as_deref())
        .opt_bytes("correlationData", p.correlation_data.as_ref());
    user_properties(&props, &p.user_properties);
    let o = Obj::new();
    o.set("topic", w.topic.as_str())
        .set("payload", js::u8array(&w.payload))
        .set("qos", w.qos as u8)
        .set("retain", w.retain)
        .set("properties", props.into_js());
    o.into_js()
}

fn subscribe_filter(f: &SubscribeFilter) -> JsValue {
    let o = Obj::new();
    o.set("filter", f.filter.as_str())
        .set("qos", f.options.qos as u8)
        .set("noLocal", f.options.no_local)
        .set("retainAsPublished", f.options.retain_as_published)
        .set("retainHandling", f.options.retain_handling as u8);
    o.into_js()
}

fn reason_codes(codes: &[ReasonCode]) -> JsValue {
    js::array(codes.iter().map(|c| c.0))
}

fn connect_properties(p: &ConnectProperties) -> JsValue {
    let o = Obj::new();
    o.opt("sessionExpiryInterval", p.session_expiry_interval)
        .opt("receiveMaximum", p.receive_maximum)
        .opt("maximumPacketSize", p.maximum_packet_size)
        .opt("topicAliasMaximum", p.topic_alias_maximum)
        .opt("requestResponseInformation", p.request_response_information)
        .opt("requestProblemInformation", p.request_problem_information)
        .opt("authenticationMethod", p.authentication_method.as_deref())
        .opt_bytes("authenticationData", p.authentication_data.as_ref());
    user_properties(&o, &p.user_properties);
    o.into_js()
}

fn connack_properties(p: &ConnAckProperties) -> JsValue {
    let o = Obj::new();
    o.opt("sessionExpiryInterval", p.session_expiry_interval)
        .opt("receiveMaximum", p.receive_maximum)
        .opt("maximumQos", p.maximum_qos.map(|q| q as u8))
        .opt("retainAvailable", p.retain_available)
        .opt("maximumPacketSize", p.maximum_packet_size)
        .opt(
            "assignedClientIdentifier",
            p.assigned_client_identifier.as_deref(),
        )
        .opt("topicAliasMaximum", p.topic_alias_maximum)
        .opt("reasonString", p.reason_string.as_deref())
        .opt(
            "wildcardSubscriptionAvailable",
            p.wildcard_subscription_available,
        )
        .opt(
            "subscriptionIdentifiersAvailable",
            p.subscription_identifiers_available,
        )
        .opt(
            "sharedSubscriptionAvailable",
            p.shared_subscription_available,
        )
        .opt("serverKeepAlive", p.server_keep_alive)
        .opt("responseInformation", p.response_information.as_deref())
        .opt("serverReference", p.server_reference.as_deref())
        .opt("authenticationMethod", p.authentication_method.as_deref())
        .opt_bytes("authenticationData", p.authentication_data.as_ref());
    user_properties(&o, &p.user_properties);
    o.into_js()
}

fn reason_properties(p: &ReasonProperties) -> JsValue {
    let o = Obj::new();
    o.opt("reasonString", p.reason_string.as_deref());
    user_properties(&o, &p.user_properties);
    o.into_js()
}

fn disconnect_properties(p: &DisconnectProperties) -> JsValue {
    let o = Obj::new();
    o.opt("sessionExpiryInterval", p.session_expiry_interval)
        .opt("reasonString", p.reason_string.as_deref())
        .opt("serverReference", p.server_reference.as_deref());
    user_properties(&o, &p.user_properties);
    o.into_js()
}

fn auth_properties(p: &AuthProperties) -> JsValue {
    let o = Obj::new();
    o.opt("authenticationMethod", p.authentication_method.as_deref())
        .opt_bytes("authenticationData", p.authentication_data.as_ref())
        .opt("reasonString", p.reason_string.as_deref());
    user_properties(&o, &p.user_properties);
    o.into_js()
}

/// Sets `userProperties` as `[name, value]` pairs, unless there are none.
fn user_properties(o: &Obj, props: &[UserProperty]) {
    if !props.is_empty() {
        o.set(
            "userProperties",
            js::array(
                props
                    .iter()
                    .map(|(k, v)| js::array([JsValue::from_str(k), JsValue::from_str(v)])),
            ),
        );
    }
}
