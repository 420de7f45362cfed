//! Broker limits and capabilities, with safe defaults.
//!
//! Every queue and buffer the broker keeps has a bound here. What happens at each bound:
//!
//! | limit | at the bound |
//! |---|---|
//! | `max_packet_size` | a larger incoming packet: DISCONNECT 0x95 (5.0) / close (3.1.1), checked from the fixed header before the body is buffered |
//! | `receive_maximum` | one more unacknowledged incoming QoS 2 PUBLISH: DISCONNECT 0x93 (3.1.1 clients, which have no Receive Maximum, are bounded the same way: the connection is closed) |
//! | `max_inflight` | outgoing QoS 1/2 beyond min(this, client's Receive Maximum) wait in the session queue |
//! | `max_inflight_bytes` | outgoing QoS 1/2 whose payload and topic bytes would take those in flight past it wait in the session queue (one message always goes when nothing is in flight) |
//! | `max_queued_messages`, `max_queued_bytes` | the new message for that session is dropped and counted (`Stats::dropped_queue_full`); `max_queued_bytes` counts payload and topic bytes, and a queued message holds its own copy of its payload, not the read it arrived in |
//! | `max_subscriptions_per_client` | further new filters get SUBACK 0x97 (5.0) / 0x80 (3.1.1) |
//! | `max_topic_len`, `max_topic_levels` | PUBLISH: PUBACK/PUBREC 0x90 (5.0) / close (3.1.1); SUBSCRIBE: per-filter 0x8F / 0x80 |
//! | `max_client_id_len` | CONNACK 0x85 (5.0) / return code 2 (3.1.1) |
//! | `connect_timeout_ms` | no CONNECT by then: the connection is closed |
//! | `max_keep_alive_secs` | a larger (or zero) keep alive of a 5.0 client is lowered to this and announced as Server Keep Alive; 3.1.1 clients cannot be told, so theirs is kept |
//! | `max_session_expiry_secs` | a longer requested expiry is lowered and announced in CONNACK |
//! | `max_sessions` | a CONNECT that would create one more session: CONNACK 0x97 (5.0) / return code 3 (3.1.1) |
//! | `max_retained_messages` | a new retained topic beyond it is not stored (counted in `Stats::dropped_retained_full`); replacing or deleting still works |
//! | `topic_alias_maximum` | a client alias above it: DISCONNECT 0x94 |
//! | the shell's write backlog (not a field here) | the shell feeds [`crate::Input::Congested`] when a connection's unwritten bytes pass its mark: QoS 0 deliveries to it are dropped and counted (`Stats::dropped_qos0_congested`) until [`crate::Input::Drained`]; the shell also decides when a backlog is too large to keep the connection |

use crate::codec::QoS;

/// Broker configuration. `Config::default()` is safe for a public-facing broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Largest packet accepted from clients, in bytes (whole packet). Advertised in CONNACK.
    pub max_packet_size: u32,
    /// Unacknowledged incoming QoS 2 messages allowed per client. Advertised in CONNACK.
    pub receive_maximum: u16,
    /// Cap on outgoing unacknowledged QoS 1/2 messages per client (the client's Receive Maximum
    /// lowers it further).
    pub max_inflight: u16,
    /// Cap on the payload and topic bytes of outgoing unacknowledged QoS 1/2 messages per
    /// client (a message larger than this is sent alone).
    pub max_inflight_bytes: usize,
    /// Messages waiting per session (offline, or beyond the in-flight window).
    pub max_queued_messages: usize,
    /// Payload bytes waiting per session.
    pub max_queued_bytes: usize,
    pub max_subscriptions_per_client: usize,
    pub max_topic_len: usize,
    pub max_topic_levels: usize,
    pub max_client_id_len: usize,
    pub connect_timeout_ms: u64,
    /// 0 means no upper bound (clients may also turn keep alive off).
    pub max_keep_alive_secs: u16,
    /// Upper bound on a session's expiry interval; `u32::MAX` means sessions may never expire.
    pub max_session_expiry_secs: u32,
    /// Sessions the broker holds at once, connected or not.
    pub max_sessions: usize,
    /// Expiry for MQTT 3.1.1 sessions with Clean Session 0 (3.1.1 has no expiry of its own).
    pub v3_session_expiry_secs: u32,
    pub max_retained_messages: usize,
    /// Aliases a client may use towards the broker. Advertised in CONNACK; 0 disables.
    pub topic_alias_maximum: u16,
    /// Aliases the broker uses towards a client, within the client's own maximum; 0 disables.
    pub outbound_topic_alias_maximum: u16,
    pub maximum_qos: QoS,
    pub retain_available: bool,
    pub wildcard_subscription_available: bool,
    pub subscription_identifiers_available: bool,
    pub shared_subscription_available: bool,
    /// Explain failures with a Reason String to MQTT 5.0 clients: in DISCONNECT always, in
    /// acknowledgements only to clients that did not set Request Problem Information to 0.
    pub reason_strings: bool,
    /// Response Information sent to MQTT 5.0 clients that request it: this prefix followed by
    /// the client id and `/`, a topic namespace the client may use for responses.
    pub response_topic_prefix: String,
    /// Prefix of client identifiers the broker assigns to clients that connect with an empty one.
    pub assigned_client_id_prefix: String,
    /// How often the broker publishes its figures under `$SYS/broker/` (the topics Mosquitto
    /// uses), in milliseconds; 0: never. Only figures that changed are sent, as retained QoS 0
    /// messages, to local subscribers only; a new subscription gets them all at once. While it
    /// is set, nothing but the broker publishes under `$SYS` (clients get `Not authorized`).
    pub sys_interval_ms: u64,
    /// Seed for everything the broker randomises (assigned client ids, hash seeds). Shells
    /// should pass a random value per process (the core cannot draw one), so that assigned
    /// client ids differ across restarts and nodes; tests and the simulator pass a fixed one.
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_packet_size: 1024 * 1024,
            receive_maximum: 1024,
            max_inflight: 256,
            max_inflight_bytes: 4 * 1024 * 1024,
            max_queued_messages: 10_000,
            max_queued_bytes: 64 * 1024 * 1024,
            max_subscriptions_per_client: 1_000,
            max_topic_len: 1024,
            max_topic_levels: 32,
            max_client_id_len: 256,
            connect_timeout_ms: 10_000,
            max_keep_alive_secs: 0,
            max_session_expiry_secs: 7 * 24 * 3600,
            max_sessions: 1_000_000,
            v3_session_expiry_secs: 24 * 3600,
            max_retained_messages: 1_000_000,
            topic_alias_maximum: 64,
            outbound_topic_alias_maximum: 64,
            maximum_qos: QoS::ExactlyOnce,
            retain_available: true,
            wildcard_subscription_available: true,
            subscription_identifiers_available: true,
            shared_subscription_available: true,
            reason_strings: true,
            response_topic_prefix: "response/".to_owned(),
            assigned_client_id_prefix: "meridian-".to_owned(),
            sys_interval_ms: 0,
            seed: 0x6d65_7269_6469_616e,
        }
    }
}
