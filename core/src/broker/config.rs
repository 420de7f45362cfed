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
//! | `max_held_bytes` | every message the broker holds, retained, queued and in flight, over all sessions: a QoS 1/2 PUBLISH from an MQTT 5.0 client gets 0x97 (Quota exceeded) and is not routed; an MQTT 3.1.1 one is routed, and each delivery that would be held (queued, or sent and awaiting its acknowledgement) is dropped; a retained message that would add bytes is not stored (all counted in `Stats::dropped_memory_full`); QoS 0 deliveries are written at once and never held, deletes and acknowledgements always work |
//! | `topic_alias_maximum` | a client alias above it: DISCONNECT 0x94 |
//! | the shell's write backlog (not a field here) | the shell feeds [`crate::Input::Congested`] when a connection's unwritten bytes pass its mark: QoS 0 deliveries to it are dropped and counted (`Stats::dropped_qos0_congested`) until [`crate::Input::Drained`]; the shell also decides when a backlog is too large to keep the connection |

/// Calls `$callback!` with every field of [`Config`](crate::Config), so that shells derive
/// their own descriptions of it (a configuration file's keys, a JS object's properties) from
/// this one list rather than restating it. The fields come in groups: `limits` (bounds on what
/// clients may do and hold), `features` (what the broker offers, advertised to clients) and
/// `process` (what a shell sets for the process, not from a file). Each field is written
/// `/// doc` `name: Type = default`, types named by full path.
///
/// ```
/// macro_rules! names {
///     ($($group:ident { $($(#[doc = $doc:literal])* $field:ident : $ty:ty = $default:expr),* $(,)? })*) => {
///         [$($(stringify!($field)),*),*]
///     };
/// }
/// let names = meridian_core::with_config_fields!(names);
/// assert!(names.contains(&"max_packet_size"));
/// ```
#[macro_export]
macro_rules! with_config_fields {
    ($callback:ident) => {
        $callback! {
            limits {
                /// Largest packet accepted from clients, in bytes (whole packet). Advertised in
                /// CONNACK.
                max_packet_size: u32 = 1024 * 1024,
                /// Unacknowledged incoming QoS 2 messages allowed per client. Advertised in
                /// CONNACK.
                receive_maximum: u16 = 1024,
                /// Cap on outgoing unacknowledged QoS 1/2 messages per client (the client's
                /// Receive Maximum lowers it further).
                max_inflight: u16 = 256,
                /// Cap on the payload and topic bytes of outgoing unacknowledged QoS 1/2
                /// messages per client (a message larger than this is sent alone).
                max_inflight_bytes: usize = 4 * 1024 * 1024,
                /// Messages waiting per session (offline, or beyond the in-flight window).
                max_queued_messages: usize = 10_000,
                /// Payload and topic bytes waiting per session.
                max_queued_bytes: usize = 64 * 1024 * 1024,
                /// Filters one session may subscribe to.
                max_subscriptions_per_client: usize = 1_000,
                /// Longest topic name or filter accepted, in bytes.
                max_topic_len: usize = 1024,
                /// Most `/`-separated levels in a topic name or filter.
                max_topic_levels: usize = 32,
                /// Longest client identifier accepted, in bytes.
                max_client_id_len: usize = 256,
                /// How long a new connection may take to send CONNECT, in milliseconds.
                connect_timeout_ms: u64 = 10_000,
                /// Largest keep alive granted to MQTT 5.0 clients, in seconds; 0 means no upper
                /// bound (clients may also turn keep alive off).
                max_keep_alive_secs: u16 = 0,
                /// Upper bound on a session's expiry interval, in seconds; `u32::MAX` means
                /// sessions may never expire.
                max_session_expiry_secs: u32 = 7 * 24 * 3600,
                /// Sessions the broker holds at once, connected or not.
                max_sessions: usize = 1_000_000,
                /// Expiry for MQTT 3.1.1 sessions with Clean Session 0, in seconds (3.1.1 has no
                /// expiry of its own).
                v3_session_expiry_secs: u32 = 24 * 3600,
                /// Retained topics the broker keeps.
                max_retained_messages: usize = 1_000_000,
                /// Payload and topic bytes of every message the broker holds: retained, queued
                /// and in flight, over all sessions, each delivery counted (a message held for
                /// 20 sessions counts 20 times, though they share its bytes: the count bounds
                /// memory from above). At the bound, a QoS 1/2 PUBLISH from an MQTT 5.0 client
                /// is refused with 0x97, a delivery that would be queued or sent and held is
                /// dropped, and a new retained message is not stored (each counted in
                /// `Stats::dropped_memory_full`); QoS 0 deliveries are never held, and retained
                /// deletes always go through.
                max_held_bytes: usize = 1024 * 1024 * 1024,
                /// Aliases a client may use towards the broker. Advertised in CONNACK; 0
                /// disables.
                topic_alias_maximum: u16 = 64,
                /// Aliases the broker uses towards a client, within the client's own maximum; 0
                /// disables.
                outbound_topic_alias_maximum: u16 = 64,
            }
            features {
                /// Highest QoS the broker grants; a PUBLISH above it is refused. Advertised in
                /// CONNACK.
                maximum_qos: $crate::codec::QoS = $crate::codec::QoS::ExactlyOnce,
                /// Whether retained messages are kept. Advertised in CONNACK.
                retain_available: bool = true,
                /// Whether filters may hold `+` and `#`. Advertised in CONNACK.
                wildcard_subscription_available: bool = true,
                /// Whether SUBSCRIBE may carry a Subscription Identifier. Advertised in CONNACK.
                subscription_identifiers_available: bool = true,
                /// Whether `$share/...` subscriptions are allowed. Advertised in CONNACK.
                shared_subscription_available: bool = true,
                /// Explain failures with a Reason String to MQTT 5.0 clients: in DISCONNECT
                /// always, in acknowledgements only to clients that did not set Request Problem
                /// Information to 0.
                reason_strings: bool = true,
                /// Response Information sent to MQTT 5.0 clients that request it: this prefix
                /// followed by the client id and `/`, a topic namespace the client may use for
                /// responses.
                response_topic_prefix: ::std::string::String = "response/".to_owned(),
                /// Prefix of client identifiers the broker assigns to clients that connect with
                /// an empty one.
                assigned_client_id_prefix: ::std::string::String = "meridian-".to_owned(),
                /// How often the broker publishes its figures under `$SYS/broker/` (the topics
                /// Mosquitto uses), in milliseconds; 0: never. Only figures that changed are
                /// sent, as retained QoS 0 messages, to local subscribers only; a new
                /// subscription gets them all at once. While it is set, nothing but the broker
                /// publishes under `$SYS` (clients get `Not authorized`).
                sys_interval_ms: u64 = 0,
            }
            process {
                /// Seed for everything the broker randomises (assigned client ids, hash seeds).
                /// Shells should pass a random value per process (the core cannot draw one), so
                /// that assigned client ids differ across restarts and nodes; tests and the
                /// simulator pass a fixed one.
                seed: u64 = 0x6d65_7269_6469_616e,
                /// Store what each open connection needs to go on (what CONNECT negotiated, the
                /// client's topic aliases) as it changes, and the clean sessions of open
                /// connections at each `Broker::checkpoint`, so that a shell whose process is
                /// rebuilt while its network connections stay open (a Durable Object woken from
                /// hibernation) resumes them with `Broker::restore_open`. Costs a record per
                /// connection and alias, and a record per changed clean session at each
                /// checkpoint.
                resumable_connections: bool = false,
            }
        }
    };
}

macro_rules! define_config {
    ($($group:ident {
        $($(#[doc = $doc:literal])* $field:ident : $ty:ty = $default:expr),* $(,)?
    })*) => {
        /// Broker configuration. `Config::default()` is safe for a public-facing broker. Its
        /// fields are listed once, in [`with_config_fields!`](crate::with_config_fields), from
        /// which the shells derive their configuration files and objects.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct Config {
            $($($(#[doc = $doc])* pub $field: $ty,)*)*
        }

        impl Default for Config {
            fn default() -> Self {
                Self {
                    $($($field: $default,)*)*
                }
            }
        }
    };
}

with_config_fields!(define_config);
