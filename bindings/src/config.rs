//! The broker's configuration and connection info as JS objects.
//!
//! Mapped field by field onto [`meridian_core::Config`], starting from its defaults: a field
//! left out keeps the core's default, an unknown field is an error (a typo should not silently
//! leave a limit at its default).

use meridian_core::codec::QoS;
use meridian_core::{Config, ConnInfo};
use wasm_bindgen::{JsCast, JsValue};

use crate::js::{self, Fields, Obj};
use crate::packet;

/// `BrokerConfig` (see `types.d.ts`) to a core [`Config`].
pub(crate) fn from_js(value: &JsValue) -> Result<Config, JsValue> {
    let mut c = Config::default();
    let mut f = Fields::optional(value, "config")?;
    macro_rules! field {
        ($name:literal, $field:ident, $read:ident) => {
            if let Some(v) = f.$read($name)? {
                c.$field = v;
            }
        };
    }
    field!("maxPacketSize", max_packet_size, u32);
    field!("receiveMaximum", receive_maximum, u16);
    field!("maxInflight", max_inflight, u16);
    field!("maxInflightBytes", max_inflight_bytes, usize);
    field!("maxQueuedMessages", max_queued_messages, usize);
    field!("maxQueuedBytes", max_queued_bytes, usize);
    field!(
        "maxSubscriptionsPerClient",
        max_subscriptions_per_client,
        usize
    );
    field!("maxTopicLen", max_topic_len, usize);
    field!("maxTopicLevels", max_topic_levels, usize);
    field!("maxClientIdLen", max_client_id_len, usize);
    if let Some(ms) = f.uint("connectTimeoutMs", js::MAX_SAFE_INTEGER)? {
        c.connect_timeout_ms = ms;
    }
    field!("maxKeepAliveSecs", max_keep_alive_secs, u16);
    field!("maxSessionExpirySecs", max_session_expiry_secs, u32);
    field!("maxSessions", max_sessions, usize);
    field!("v3SessionExpirySecs", v3_session_expiry_secs, u32);
    field!("maxRetainedMessages", max_retained_messages, usize);
    field!("topicAliasMaximum", topic_alias_maximum, u16);
    field!(
        "outboundTopicAliasMaximum",
        outbound_topic_alias_maximum,
        u16
    );
    let qos_path = f.path_of("maximumQos");
    if let Some(v) = f.get("maximumQos")? {
        c.maximum_qos = packet::qos(&v, &qos_path)?;
    }
    field!("retainAvailable", retain_available, bool);
    field!(
        "wildcardSubscriptionAvailable",
        wildcard_subscription_available,
        bool
    );
    field!(
        "subscriptionIdentifiersAvailable",
        subscription_identifiers_available,
        bool
    );
    field!(
        "sharedSubscriptionAvailable",
        shared_subscription_available,
        bool
    );
    field!("reasonStrings", reason_strings, bool);
    field!("responseTopicPrefix", response_topic_prefix, string);
    field!("assignedClientIdPrefix", assigned_client_id_prefix, string);
    if let Some(ms) = f.uint("sysIntervalMs", js::MAX_SAFE_INTEGER)? {
        c.sys_interval_ms = ms;
    }
    let seed_path = f.path_of("seed");
    if let Some(v) = f.get("seed")? {
        c.seed = seed(&v, &seed_path)?;
    }
    f.finish()?;
    Ok(c)
}

/// A seed: a safe-integer number or a `bigint` in 0..2^64.
fn seed(value: &JsValue, what: &str) -> Result<u64, JsValue> {
    if value.is_bigint() {
        let text = js_sys::BigInt::unchecked_from_js_ref(value)
            .to_string(10)
            .ok()
            .and_then(|s| s.as_string())
            .unwrap_or_default();
        return text.parse().map_err(|_| {
            js::range_error(&format!("{what}: expected a bigint in 0..2^64, got {text}"))
        });
    }
    js::uint(value, js::MAX_SAFE_INTEGER, what)
}

/// The effective configuration as a `BrokerConfig` object (every field present).
pub(crate) fn to_js(c: &Config) -> JsValue {
    let o = Obj::new();
    o.set("maxPacketSize", c.max_packet_size)
        .set("receiveMaximum", c.receive_maximum)
        .set("maxInflight", c.max_inflight)
        .set("maxInflightBytes", c.max_inflight_bytes)
        .set("maxQueuedMessages", c.max_queued_messages)
        .set("maxQueuedBytes", c.max_queued_bytes)
        .set("maxSubscriptionsPerClient", c.max_subscriptions_per_client)
        .set("maxTopicLen", c.max_topic_len)
        .set("maxTopicLevels", c.max_topic_levels)
        .set("maxClientIdLen", c.max_client_id_len)
        .set("connectTimeoutMs", js::num(c.connect_timeout_ms))
        .set("maxKeepAliveSecs", c.max_keep_alive_secs)
        .set("maxSessionExpirySecs", c.max_session_expiry_secs)
        .set("maxSessions", c.max_sessions)
        .set("v3SessionExpirySecs", c.v3_session_expiry_secs)
        .set("maxRetainedMessages", c.max_retained_messages)
        .set("topicAliasMaximum", c.topic_alias_maximum)
        .set("outboundTopicAliasMaximum", c.outbound_topic_alias_maximum)
        .set("maximumQos", qos_number(c.maximum_qos))
        .set("retainAvailable", c.retain_available)
        .set(
            "wildcardSubscriptionAvailable",
            c.wildcard_subscription_available,
        )
        .set(
            "subscriptionIdentifiersAvailable",
            c.subscription_identifiers_available,
        )
        .set(
            "sharedSubscriptionAvailable",
            c.shared_subscription_available,
        )
        .set("reasonStrings", c.reason_strings)
        .set("responseTopicPrefix", c.response_topic_prefix.as_str())
        .set(
            "assignedClientIdPrefix",
            c.assigned_client_id_prefix.as_str(),
        )
        .set("sysIntervalMs", js::num(c.sys_interval_ms))
        // As a bigint: the default seed does not fit a JS number exactly.
        .set("seed", js_sys::BigInt::from(c.seed));
    o.into_js()
}

fn qos_number(q: QoS) -> u8 {
    q as u8
}

/// `ConnInfo` (`{ remoteAddr?, tlsIdentity?, maxPacketSize? }`) to the core's.
pub(crate) fn conn_info(value: &JsValue) -> Result<ConnInfo, JsValue> {
    let mut f = Fields::optional(value, "info")?;
    let info = ConnInfo {
        remote_addr: f.string("remoteAddr")?,
        tls_identity: f.string("tlsIdentity")?,
        max_packet_size: f.u32("maxPacketSize")?,
    };
    f.finish()?;
    Ok(info)
}
