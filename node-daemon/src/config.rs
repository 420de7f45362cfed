//! The daemon's TOML configuration: parsing, validation and the mapping onto
//! [`meridian_core::Config`].
//!
//! The embedded default ([`DEFAULT_CONFIG`]) is the complete, commented file that
//! `meridian run --print-default-config` prints. A user file is read on top of it: every key
//! is optional, unknown keys and bad values are refused with the key and the line named.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use crate::storage::SyncPolicy;
use meridian_core::acl;
use meridian_core::codec::QoS;
use serde::Deserialize;

/// The full default configuration file, with comments.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// A configuration error, with the line it is on when it comes from a file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{source_name}: line {line}: {message}")]
    Parse {
        source_name: String,
        line: usize,
        message: String,
    },
    #[error("{source_name}: {message}")]
    Invalid {
        source_name: String,
        message: String,
    },
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    pub node: NodeConfig,
    pub listeners: Listeners,
    pub admin: AdminConfig,
    pub storage: StorageConfig,
    pub log: LogConfig,
    pub runtime: RuntimeConfig,
    pub limits: Limits,
    pub mqtt: MqttFeatures,
    pub auth: AuthConfig,
    /// `[acl]`: the access rules, read as the core's rule engine.
    pub acl: acl::Acl,
    pub cluster: ClusterSection,
    pub policy: PolicyConfig,
}

/// `[policy]`: where users, access rules and tokens come from.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    pub source: PolicySource,
    /// Public operator keys (64 hex digits each): with any, a policy change counts only if
    /// one of them signed it.
    pub operator_keys: Vec<String>,
    pub max_document_bytes: usize,
    pub history_retention_days: u64,
    pub compact_after_changes: usize,
    pub compact_interval_ms: u64,
}

/// Where the policy comes from.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PolicySource {
    /// The replicated policy document, seeded from the files on first start.
    Document,
    /// The files, read at start and on SIGHUP.
    Files,
}

/// `[cluster]`: this node as a region of a multi-region deployment (the libp2p mesh).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    pub enabled: bool,
    pub region: String,
    pub listen: Vec<P2pAddr>,
    pub peers: Vec<P2pAddr>,
    pub key_file: PathBuf,
    pub certificate: PathBuf,
    /// Where this node has operator keys and its own certificate, only peers with the
    /// operator's certificate are members ([`meridian_core::broker::ClusterConfig::members_certified`]);
    /// `false` turns that off (while a deployment's nodes are being certified).
    pub members_certified: bool,
    pub allow_peers: Vec<P2pPeerId>,
    pub discover: bool,
    pub advertise: Vec<P2pAddr>,
    pub announce_interval_ms: u64,
    pub link_queue_frames: usize,
    pub link_congested_bytes: usize,
    pub link_drained_bytes: usize,
    pub route_batch_ms: u64,
    pub digest_interval_ms: u64,
    pub tombstone_budget: usize,
    pub outbox_window: usize,
    pub outbox_max_messages: usize,
    pub outbox_max_bytes: usize,
    pub ping_interval_ms: u64,
    pub subscribe_fence: bool,
    pub subscribe_fence_max_ms: u64,
    pub retained_tombstones_max: usize,
    pub outbox_stall_ms: u64,
    pub peer_expiry_ms: u64,
    pub max_nodes: usize,
    pub max_peer_connections: usize,
    pub max_peer_connections_per_address: usize,
    pub max_clock_drift_ms: u64,
    pub peer_max_filters: usize,
    pub peer_max_pending_delta_bytes: usize,
    pub peer_max_snapshot_bytes: usize,
    pub peer_max_retained_messages: usize,
    pub peer_max_retained_bytes: usize,
    pub peer_max_claims: usize,
    pub peer_max_claim_bytes: usize,
    pub peer_max_transfer_bytes: usize,
    pub session_transfer_wait_ms: u64,
    pub session_order_wait_ms: u64,
    /// `[[cluster.home]]`: client ids pinned to a home region.
    pub home: Vec<HomeSection>,
    pub home_wait_ms: u64,
    /// `[cluster.edge]`: the leaves of this node.
    pub edge: EdgeSection,
}

/// `[[cluster.home]]`: client ids (`*` for any run of characters) that the home region
/// decides who serves.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HomeSection {
    pub client_ids: String,
    pub region: String,
}

/// `[cluster.edge]`: edge links, over which the edge worker's Durable Objects (or any other
/// leaf) hang off this node (`crate::edge`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EdgeSection {
    /// The listener's address, `ip:port`; empty: no edge links.
    pub listen: String,
    /// The tokens that let an edge link in, one per line.
    pub token_file: PathBuf,
    /// TLS certificate and key (PEM), for `wss://`; required off loopback.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Edge links open at once.
    pub max_links: usize,
    /// Leaves one token links at once.
    pub max_leaves_per_token: usize,
    /// A leaf without a link for this long is forgotten.
    pub leaf_expiry_ms: u64,
    /// Filters one leaf may bring.
    pub max_filters: usize,
}

impl EdgeSection {
    /// The listener's address, when edge links are on (checked by validation).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.listen.parse().ok()
    }

    /// Whether the listener speaks TLS.
    pub fn tls(&self) -> bool {
        !self.cert.as_os_str().is_empty()
    }

    fn validate(&self, cluster_enabled: bool) -> Result<(), String> {
        if self.listen.is_empty() {
            return Ok(());
        }
        let Ok(addr) = self.listen.parse::<SocketAddr>() else {
            return Err(format!(
                "cluster.edge.listen: an ip:port address, not {:?}",
                self.listen
            ));
        };
        if !cluster_enabled {
            return Err(
                "cluster.edge.listen: edge links make leaves of this node, which needs                  [cluster] enabled (--p2p)"
                    .to_owned(),
            );
        }
        if self.token_file.as_os_str().is_empty() {
            return Err(
                "cluster.edge.token_file: edge links need tokens (--edge-token-file FILE)"
                    .to_owned(),
            );
        }
        if self.cert.as_os_str().is_empty() != self.key.as_os_str().is_empty() {
            return Err("cluster.edge.cert and cluster.edge.key: set both, or neither".to_owned());
        }
        if !addr.ip().is_loopback() && !self.tls() {
            return Err(format!(
                "cluster.edge.listen is {addr} (not loopback) but cluster.edge.cert is not set: \
                 edge tokens would cross the network in the clear. Set cluster.edge.cert and \
                 cluster.edge.key, or listen on 127.0.0.1"
            ));
        }
        if self.max_links == 0
            || self.max_leaves_per_token == 0
            || self.leaf_expiry_ms == 0
            || self.max_filters == 0
        {
            return Err(
                "cluster.edge.max_links, max_leaves_per_token, leaf_expiry_ms and max_filters: \
                 must be at least 1"
                    .to_owned(),
            );
        }
        Ok(())
    }
}

/// A libp2p multiaddr in the configuration (`/ip4/127.0.0.1/tcp/7001`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct P2pAddr(pub libp2p::Multiaddr);

/// A libp2p peer id in the configuration (`12D3KooW...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2pPeerId(pub libp2p::PeerId);

/// Deserialise a newtype from a string through its inner type's `FromStr` (the error, with the
/// value, gets the key and line like every other).
macro_rules! from_str_de {
    ($t:ident, $inner:ty, $what:literal) => {
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse::<$inner>()
                    .map($t)
                    .map_err(|e| serde::de::Error::custom(format!("{s:?} is not {}: {e}", $what)))
            }
        }
    };
}
from_str_de!(P2pAddr, libp2p::Multiaddr, "a multiaddr");
from_str_de!(P2pPeerId, libp2p::PeerId, "a peer id");

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub name: String,
}

/// Which listener: the four MQTT listeners of `[listeners]`, the admin API's and the edge
/// links'. [`crate::Server::local_addr`] names them so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListenerKind {
    /// MQTT over TCP (`listeners.tcp`).
    Tcp,
    /// MQTT over WebSocket (`listeners.ws`).
    Ws,
    /// MQTT over TLS (`listeners.tls`).
    Tls,
    /// MQTT over WebSocket over TLS (`listeners.wss`).
    Wss,
    /// Admin HTTP (`[admin]`).
    Admin,
    /// Edge links (`cluster.edge.listen`).
    Edge,
}

impl ListenerKind {
    /// Its name in the configuration's keys (`listeners.tcp`) and the logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Ws => "ws",
            Self::Tls => "tls",
            Self::Wss => "wss",
            Self::Admin => "admin",
            Self::Edge => "edge",
        }
    }

    /// It carries MQTT over WebSocket.
    pub fn websocket(self) -> bool {
        matches!(self, Self::Ws | Self::Wss)
    }

    /// It carries MQTT over TLS.
    pub fn tls(self) -> bool {
        matches!(self, Self::Tls | Self::Wss)
    }

    /// It carries MQTT (not admin HTTP or edge links).
    pub fn mqtt(self) -> bool {
        !matches!(self, Self::Admin | Self::Edge)
    }
}

impl std::fmt::Display for ListenerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Listeners {
    pub tcp: ListenerConfig,
    pub ws: ListenerConfig,
    pub tls: ListenerConfig,
    pub wss: ListenerConfig,
}

/// One listener. `path` applies to WebSocket listeners, `cert`/`key` to TLS ones.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub enabled: bool,
    pub bind: SocketAddr,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub cert: Option<PathBuf>,
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// TLS listeners: PEM CA certificates that client certificates are verified against.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// TLS listeners: refuse clients without a valid certificate (needs `client_ca`).
    #[serde(default)]
    pub require_client_cert: bool,
    /// WebSocket listeners: the browser origins (`Origin` header) allowed to connect; `"*"`
    /// allows every one. Unset: none on a listener anyone may use without logging in, every
    /// one otherwise. Clients that send no `Origin` (not browsers) are never refused for it.
    #[serde(default)]
    pub allowed_origins: Option<Vec<String>>,
    /// Connections at once; 0: a share of what the open-file limit allows (docs/operations.md,
    /// "Open files and connections").
    pub max_connections: usize,
    pub max_packet_size: u32,
    /// Connections the kernel holds until the broker accepts them (the listen backlog).
    pub backlog: u32,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    pub enabled: bool,
    pub bind: SocketAddr,
    /// A file of bearer tokens, one per line (`#` comments allowed), one of which every
    /// request but `GET /health` must carry; required when `bind` is not a loopback address.
    pub token_file: PathBuf,
    /// How long a client may take to send a request's headers before it is cut off.
    pub header_timeout_ms: u64,
    /// TLS certificate (PEM chain) and key: the API speaks HTTPS; required off loopback.
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl AdminConfig {
    /// Whether the API speaks HTTPS (`cert` and `key` set).
    pub fn tls(&self) -> bool {
        !self.cert.as_os_str().is_empty()
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    pub sync: SyncPolicy,
    pub sync_interval_ms: u64,
    /// With `sync = "always"`: how long the fsync that acknowledgements wait for may wait for
    /// more commits to share it (0: none).
    pub commit_window_ms: u64,
    /// Memory the store may keep for its pages (redb's cache).
    pub cache_bytes: usize,
    /// The journal's size at which the store checkpoints.
    pub journal_max_bytes: usize,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    pub level: String,
}

/// `[runtime]`: the threads that serve connections and the broker.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// tokio worker threads; 0 = one per CPU core (or `TOKIO_WORKER_THREADS` when set).
    pub worker_threads: usize,
}

/// More worker threads than this is a mistake, not a tuning.
pub const MAX_WORKER_THREADS: usize = 1024;

/// The longest `storage.commit_window_ms`: past it, acknowledgements would wait seconds.
pub const MAX_COMMIT_WINDOW_MS: u64 = 1000;

impl RuntimeConfig {
    /// The daemon's multi-thread runtime, with this many workers.
    pub fn build(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if self.worker_threads > 0 {
            builder.worker_threads(self.worker_threads);
        }
        builder.enable_all().thread_name("meridian-worker").build()
    }
}

/// How a core configuration field is written in the file, and read back.
pub trait FileField: Sized {
    /// The value as the file holds it.
    type Repr: serde::de::DeserializeOwned + Clone + PartialEq + std::fmt::Debug;
    /// The field from its file value (checked when the file is read, where it can be
    /// out of range).
    fn from_repr(repr: &Self::Repr) -> Self;
}

macro_rules! plain_file_fields {
    ($($t:ty),*) => {
        $(impl FileField for $t {
            type Repr = $t;
            fn from_repr(repr: &$t) -> $t {
                repr.clone()
            }
        })*
    };
}
plain_file_fields!(u16, u32, u64, usize, bool, String);

/// A QoS is written as its number, 0 to 2.
impl FileField for QoS {
    type Repr = u8;
    fn from_repr(repr: &u8) -> QoS {
        // Above 2 is refused by validation; read as the highest until then.
        QoS::from_u8(*repr).unwrap_or(QoS::ExactlyOnce)
    }
}

/// `[limits]` and `[mqtt]` hold the core's `limits` and `features` fields
/// ([`meridian_core::with_config_fields`]), under the same names; `[limits]` adds the
/// daemon's own bounds on what waits to be written to a connection.
macro_rules! core_sections {
    (
        limits { $($(#[doc = $ldoc:literal])* $lfield:ident : $lty:ty = $ldefault:expr),* $(,)? }
        features { $($(#[doc = $fdoc:literal])* $ffield:ident : $fty:ty = $fdefault:expr),* $(,)? }
        process { $($process:tt)* }
    ) => {
        /// `[limits]`: the core's limits, and the daemon's write buffers.
        #[derive(Debug, Clone, Deserialize, PartialEq)]
        #[serde(deny_unknown_fields)]
        pub struct Limits {
            $($(#[doc = $ldoc])* pub $lfield: <$lty as FileField>::Repr,)*
            /// Bytes waiting to be written to one client before it is cut off as a slow
            /// consumer.
            pub max_write_buffer_bytes: usize,
            /// Unset: an eighth of `max_write_buffer_bytes`, at least 1024 bytes.
            pub qos0_max_write_buffer_bytes: Option<usize>,
        }

        /// `[mqtt]`: the protocol features the broker offers.
        #[derive(Debug, Clone, Deserialize, PartialEq)]
        #[serde(deny_unknown_fields)]
        pub struct MqttFeatures {
            $($(#[doc = $fdoc])* pub $ffield: <$fty as FileField>::Repr,)*
        }




        impl DaemonConfig {
            /// The broker core's configuration.
            pub fn core_config(&self) -> meridian_core::Config {
                meridian_core::Config {
                    $($lfield: <$lty as FileField>::from_repr(&self.limits.$lfield),)*
                    $($ffield: <$fty as FileField>::from_repr(&self.mqtt.$ffield),)*
                    ..meridian_core::Config::default()
                }
            }
        }
    };
}

meridian_core::with_config_fields!(core_sections);

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub password_file: String,
    pub allow_anonymous: bool,
    pub max_pending_per_address: usize,
    pub max_hash_memory_kib: u32,
    pub max_hash_passes: u32,
}

impl AuthConfig {
    /// What checking one password may cost.
    pub fn hash_bounds(&self) -> crate::passwd::HashBounds {
        crate::passwd::HashBounds {
            memory_kib: self.max_hash_memory_kib,
            passes: self.max_hash_passes,
        }
    }
}

impl Default for DaemonConfig {
    fn default() -> Self {
        // The embedded file is checked by a unit test; it always parses.
        Self::parse(DEFAULT_CONFIG, "default config").expect("embedded default config parses")
    }
}

impl DaemonConfig {
    /// Parse a whole file on top of the embedded defaults.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, ConfigError> {
        let mut merged: toml::Table = toml::from_str(DEFAULT_CONFIG)
            .map_err(|e| parse_error(&e, DEFAULT_CONFIG, "default config"))?;
        let user: toml::Table =
            toml::from_str(text).map_err(|e| parse_error(&e, text, source_name))?;
        // Deserialise the user file alone first (with every section optional) so that unknown
        // keys and bad values get errors with spans in the user's own text.
        let partial: Partial =
            toml::from_str(text).map_err(|e| parse_error(&e, text, source_name))?;
        drop(partial);
        merge(&mut merged, user);
        let config: DaemonConfig =
            merged
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Invalid {
                    source_name: source_name.to_owned(),
                    message: e.message().to_owned(),
                })?;
        config.validate(source_name)?;
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.display().to_string(),
            error,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    fn validate(&self, source_name: &str) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            source_name: source_name.to_owned(),
            message,
        };
        if self.mqtt.maximum_qos > 2 {
            return Err(invalid(format!(
                "mqtt.maximum_qos: must be 0, 1 or 2, not {}",
                self.mqtt.maximum_qos
            )));
        }
        if (1..MIN_SYS_INTERVAL_MS).contains(&self.mqtt.sys_interval_ms) {
            return Err(invalid(format!(
                "mqtt.sys_interval_ms: must be 0 (no system topics) or at least \
                 {MIN_SYS_INTERVAL_MS}, not {} (some figures take a pass over every session)",
                self.mqtt.sys_interval_ms
            )));
        }
        for (name, l) in self.listeners.iter() {
            if !l.enabled {
                continue;
            }
            if name.websocket() {
                let path = l.path.as_deref().unwrap_or("");
                if !path.starts_with('/') {
                    return Err(invalid(format!(
                        "listeners.{name}.path: must start with '/', not {path:?}"
                    )));
                }
            }
            if name.tls() {
                for (key, value) in [("cert", &l.cert), ("key", &l.key)] {
                    if value.as_ref().is_none_or(|p| p.as_os_str().is_empty()) {
                        return Err(invalid(format!(
                            "listeners.{name}.{key}: a PEM file is required when the listener is enabled"
                        )));
                    }
                }
            }
            if let Some(origins) = &l.allowed_origins {
                if !name.websocket() {
                    return Err(invalid(format!(
                        "listeners.{name}.allowed_origins: only WebSocket listeners (ws, wss) \
                         have origins"
                    )));
                }
                if let Some(bad) = origins.iter().find(|o| !valid_origin(o)) {
                    return Err(invalid(format!(
                        "listeners.{name}.allowed_origins: {bad:?} is not an origin \
                         (scheme://host or scheme://host:port, \"null\", or \"*\")"
                    )));
                }
            }
            if l.require_client_cert
                && l.client_ca
                    .as_ref()
                    .is_none_or(|p| p.as_os_str().is_empty())
            {
                return Err(invalid(format!(
                    "listeners.{name}.client_ca: required with require_client_cert = true"
                )));
            }
            if l.backlog == 0 {
                return Err(invalid(format!(
                    "listeners.{name}.backlog: must be at least 1"
                )));
            }
        }
        if self.admin.cert.as_os_str().is_empty() != self.admin.key.as_os_str().is_empty() {
            return Err(invalid(
                "admin.cert and admin.key: set both (HTTPS) or neither".to_owned(),
            ));
        }
        if self.admin.header_timeout_ms == 0 {
            return Err(invalid(
                "admin.header_timeout_ms: must be at least 1".to_owned(),
            ));
        }
        if self.auth.max_pending_per_address == 0 {
            return Err(invalid(
                "auth.max_pending_per_address: must be at least 1".to_owned(),
            ));
        }
        if self.limits.max_write_buffer_bytes < 1024 {
            return Err(invalid(
                "limits.max_write_buffer_bytes: must be at least 1024".to_owned(),
            ));
        }
        if let Some(qos0) = self.limits.qos0_max_write_buffer_bytes
            && !(1024..=self.limits.max_write_buffer_bytes).contains(&qos0)
        {
            return Err(invalid(format!(
                "limits.qos0_max_write_buffer_bytes: must be at least 1024 and at most \
                 limits.max_write_buffer_bytes ({})",
                self.limits.max_write_buffer_bytes
            )));
        }
        if self.limits.max_packet_size < 64 {
            return Err(invalid(
                "limits.max_packet_size: must be at least 64".to_owned(),
            ));
        }
        if self.storage.sync == SyncPolicy::Periodic && self.storage.sync_interval_ms == 0 {
            return Err(invalid(
                "storage.sync_interval_ms: must be at least 1 with sync = \"periodic\"".to_owned(),
            ));
        }
        if self.storage.commit_window_ms > MAX_COMMIT_WINDOW_MS {
            return Err(invalid(format!(
                "storage.commit_window_ms: must be at most {MAX_COMMIT_WINDOW_MS}"
            )));
        }
        if self.storage.cache_bytes < crate::storage::MIN_CACHE_BYTES {
            return Err(invalid(format!(
                "storage.cache_bytes: must be at least {}",
                crate::storage::MIN_CACHE_BYTES
            )));
        }
        if self.storage.journal_max_bytes < crate::storage::MIN_JOURNAL_BYTES {
            return Err(invalid(format!(
                "storage.journal_max_bytes: must be at least {}",
                crate::storage::MIN_JOURNAL_BYTES
            )));
        }
        if self.runtime.worker_threads > MAX_WORKER_THREADS {
            return Err(invalid(format!(
                "runtime.worker_threads: must be at most {MAX_WORKER_THREADS}"
            )));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(invalid(format!("log.level: {e}")));
        }
        self.cluster.validate().map_err(invalid)
    }

    /// The check of `[cluster]` alone, also run after command-line overrides.
    pub fn validate_cluster(&self, source_name: &str) -> Result<(), ConfigError> {
        self.cluster
            .validate()
            .map_err(|message| ConfigError::Invalid {
                source_name: source_name.to_owned(),
                message,
            })
    }

    /// The listeners by name, in a fixed order.
    pub fn listeners(&self) -> [(ListenerKind, &ListenerConfig); 4] {
        self.listeners.iter()
    }
}

/// The shortest interval between two publications of the system topics.
const MIN_SYS_INTERVAL_MS: u64 = 100;

/// The most frames a link session's queue may hold (each slot costs its memory only when used).
const MAX_LINK_QUEUE_FRAMES: usize = 1 << 24;

impl ClusterSection {
    fn validate(&self) -> Result<(), String> {
        self.edge.validate(self.enabled)?;
        if !self.enabled {
            return Ok(());
        }
        if self.region.is_empty()
            || self.region.len() > 64
            || self
                .region
                .chars()
                .any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(format!(
                "cluster.region: 1 to 64 characters without spaces, not {:?}",
                self.region
            ));
        }
        if self.listen.is_empty() {
            return Err("cluster.listen: at least one address is needed (or --p2p)".to_owned());
        }
        if self.key_file.as_os_str().is_empty() {
            return Err(
                "cluster.key_file: the deployment's cluster key is required (--cluster-key FILE; \
                 create one with `meridian keygen --cluster-key FILE`)"
                    .to_owned(),
            );
        }
        for (key, v) in [
            ("route_batch_ms", self.route_batch_ms),
            ("digest_interval_ms", self.digest_interval_ms),
            ("ping_interval_ms", self.ping_interval_ms),
            ("announce_interval_ms", self.announce_interval_ms),
            ("peer_expiry_ms", self.peer_expiry_ms),
            ("outbox_stall_ms", self.outbox_stall_ms),
        ] {
            if v == 0 {
                return Err(format!("cluster.{key}: must be at least 1"));
            }
        }
        for (key, v) in [
            ("tombstone_budget", self.tombstone_budget),
            ("outbox_window", self.outbox_window),
            ("outbox_max_messages", self.outbox_max_messages),
            ("outbox_max_bytes", self.outbox_max_bytes),
            ("link_congested_bytes", self.link_congested_bytes),
            ("max_nodes", self.max_nodes),
            ("max_peer_connections", self.max_peer_connections),
            (
                "max_peer_connections_per_address",
                self.max_peer_connections_per_address,
            ),
            ("peer_max_filters", self.peer_max_filters),
            (
                "peer_max_pending_delta_bytes",
                self.peer_max_pending_delta_bytes,
            ),
            ("peer_max_snapshot_bytes", self.peer_max_snapshot_bytes),
        ] {
            if v == 0 {
                return Err(format!("cluster.{key}: must be at least 1"));
            }
        }
        if !(4..=MAX_LINK_QUEUE_FRAMES).contains(&self.link_queue_frames) {
            return Err(format!(
                "cluster.link_queue_frames: must be 4 to {MAX_LINK_QUEUE_FRAMES} (a link is \
                 congested past half its frames and drained at a quarter), not {}",
                self.link_queue_frames
            ));
        }
        if self.link_drained_bytes >= self.link_congested_bytes {
            return Err(format!(
                "cluster.link_drained_bytes: must be below cluster.link_congested_bytes ({}), \
                 not {}",
                self.link_congested_bytes, self.link_drained_bytes
            ));
        }
        Ok(())
    }

    /// The bounds of each link session's queue.
    pub fn link_limits(&self) -> crate::mailbox::LinkLimits {
        crate::mailbox::LinkLimits {
            queue_frames: self.link_queue_frames,
            congested_bytes: self.link_congested_bytes,
            drained_bytes: self.link_drained_bytes,
        }
    }
}

impl Listeners {
    pub fn iter(&self) -> [(ListenerKind, &ListenerConfig); 4] {
        [
            (ListenerKind::Tcp, &self.tcp),
            (ListenerKind::Ws, &self.ws),
            (ListenerKind::Tls, &self.tls),
            (ListenerKind::Wss, &self.wss),
        ]
    }
}

/// `*`, `null`, or `scheme://host[:port]` with nothing after: what browsers send as `Origin`.
fn valid_origin(o: &str) -> bool {
    if o == "*" || o == "null" {
        return true;
    }
    let Some((scheme, rest)) = o.split_once("://") else {
        return false;
    };
    !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', ' ', '@'])
}

/// Deep-merge `over` into `base` (tables merge key by key; everything else replaces).
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

fn parse_error(e: &toml::de::Error, text: &str, source_name: &str) -> ConfigError {
    let line = e
        .span()
        .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1)
        .unwrap_or(1);
    ConfigError::Parse {
        source_name: source_name.to_owned(),
        line,
        message: e.message().trim_end().to_owned(),
    }
}

// ----- the same shape with every field optional, to check a user file on its own -----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Partial {
    node: Option<PNode>,
    listeners: Option<PListeners>,
    admin: Option<PAdmin>,
    storage: Option<PStorage>,
    log: Option<PLog>,
    runtime: Option<PRuntime>,
    limits: Option<PLimits>,
    mqtt: Option<PMqtt>,
    auth: Option<PAuth>,
    acl: Option<PAcl>,
    cluster: Option<PCluster>,
    policy: Option<PPolicy>,
}

macro_rules! partial {
    ($name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct $name { $($field: Option<$ty>),* }
    };
}

partial!(PNode { name: String });
partial!(PListeners {
    tcp: PListener,
    ws: PListener,
    tls: PListener,
    wss: PListener
});
partial!(PListener {
    enabled: bool,
    bind: SocketAddr,
    path: String,
    cert: PathBuf,
    key: PathBuf,
    client_ca: PathBuf,
    require_client_cert: bool,
    allowed_origins: Vec<String>,
    max_connections: usize,
    max_packet_size: u32,
    backlog: u32,
});
partial!(PAdmin {
    enabled: bool,
    bind: SocketAddr,
    token_file: PathBuf,
    header_timeout_ms: u64,
    cert: PathBuf,
    key: PathBuf,
});
partial!(PStorage {
    data_dir: PathBuf,
    sync: SyncPolicy,
    sync_interval_ms: u64,
    commit_window_ms: u64,
    cache_bytes: usize,
    journal_max_bytes: usize
});
partial!(PLog {
    format: LogFormat,
    level: String
});
partial!(PRuntime {
    worker_threads: usize
});
partial!(PLimits {
    max_packet_size: u32,
    receive_maximum: u16,
    max_inflight: u16,
    max_inflight_bytes: usize,
    max_queued_messages: usize,
    max_queued_bytes: usize,
    max_subscriptions_per_client: usize,
    max_topic_len: usize,
    max_topic_levels: usize,
    max_client_id_len: usize,
    connect_timeout_ms: u64,
    max_keep_alive_secs: u16,
    max_session_expiry_secs: u32,
    max_sessions: usize,
    v3_session_expiry_secs: u32,
    max_retained_messages: usize,
    max_held_bytes: usize,
    topic_alias_maximum: u16,
    outbound_topic_alias_maximum: u16,
    max_write_buffer_bytes: usize,
    qos0_max_write_buffer_bytes: usize,
});
partial!(PMqtt {
    maximum_qos: u8,
    retain_available: bool,
    wildcard_subscription_available: bool,
    subscription_identifiers_available: bool,
    shared_subscription_available: bool,
    reason_strings: bool,
    response_topic_prefix: String,
    assigned_client_id_prefix: String,
    sys_interval_ms: u64,
});
partial!(PAuth {
    password_file: String,
    allow_anonymous: bool,
    max_pending_per_address: usize,
    max_hash_memory_kib: u32,
    max_hash_passes: u32,
});
partial!(PAcl { default: acl::Permission, rules: Vec<acl::Rule> });
partial!(PPolicy {
    source: PolicySource,
    operator_keys: Vec<String>,
    max_document_bytes: usize,
    history_retention_days: u64,
    compact_after_changes: usize,
    compact_interval_ms: u64,
});
partial!(PCluster {
    enabled: bool,
    region: String,
    listen: Vec<P2pAddr>,
    peers: Vec<P2pAddr>,
    key_file: PathBuf,
    certificate: PathBuf,
    members_certified: bool,
    allow_peers: Vec<P2pPeerId>,
    discover: bool,
    advertise: Vec<P2pAddr>,
    announce_interval_ms: u64,
    link_queue_frames: usize,
    link_congested_bytes: usize,
    link_drained_bytes: usize,
    route_batch_ms: u64,
    digest_interval_ms: u64,
    tombstone_budget: usize,
    outbox_window: usize,
    outbox_max_messages: usize,
    outbox_max_bytes: usize,
    ping_interval_ms: u64,
    subscribe_fence: bool,
    subscribe_fence_max_ms: u64,
    retained_tombstones_max: usize,
    outbox_stall_ms: u64,
    peer_expiry_ms: u64,
    max_nodes: usize,
    max_peer_connections: usize,
    max_peer_connections_per_address: usize,
    max_clock_drift_ms: u64,
    peer_max_filters: usize,
    peer_max_pending_delta_bytes: usize,
    peer_max_snapshot_bytes: usize,
    peer_max_retained_messages: usize,
    peer_max_retained_bytes: usize,
    peer_max_claims: usize,
    peer_max_claim_bytes: usize,
    peer_max_transfer_bytes: usize,
    session_transfer_wait_ms: u64,
    session_order_wait_ms: u64,
    home: Vec<PHome>,
    home_wait_ms: u64,
    edge: PEdge,
});
partial!(PHome {
    client_ids: String,
    region: String,
});
partial!(PEdge {
    listen: String,
    token_file: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    max_links: usize,
    max_leaves_per_token: usize,
    leaf_expiry_ms: u64,
    max_filters: usize,
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_file_parses_and_matches_core_defaults() {
        let c = DaemonConfig::parse(DEFAULT_CONFIG, "default").unwrap();
        assert_eq!(c.listeners.tcp.bind.to_string(), "127.0.0.1:1883");
        assert_eq!(c.listeners.ws.bind.to_string(), "127.0.0.1:8083");
        assert_eq!(c.listeners.ws.path.as_deref(), Some("/mqtt"));
        assert_eq!(c.admin.bind.to_string(), "127.0.0.1:8081");
        assert_eq!(c.storage.data_dir, PathBuf::from("./meridian-data"));
        assert_eq!(c.storage.sync, SyncPolicy::Always);
        // The daemon publishes system topics by default, as Mosquitto does; the core does not.
        let expected = meridian_core::Config {
            sys_interval_ms: 10_000,
            ..meridian_core::Config::default()
        };
        assert_eq!(c.core_config(), expected);
    }

    #[test]
    fn a_partial_file_overrides_only_its_keys() {
        let c = DaemonConfig::parse("[limits]\nmax_inflight = 7\n", "x.toml").unwrap();
        assert_eq!(c.limits.max_inflight, 7);
        assert_eq!(c.limits.receive_maximum, 1024);
        assert_eq!(c.listeners.tcp.bind.to_string(), "127.0.0.1:1883");
    }

    #[test]
    fn unknown_key_is_refused_with_its_name_and_line() {
        let e = DaemonConfig::parse("[limits]\n\nmax_inflite = 7\n", "x.toml").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("line 3"), "{text}");
        assert!(text.contains("max_inflite"), "{text}");
    }

    #[test]
    fn bad_value_is_refused_with_its_line() {
        let e = DaemonConfig::parse("[storage]\nsync = \"sometimes\"\n", "x.toml").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("line 2"), "{text}");
        assert!(text.contains("sometimes"), "{text}");
        let e = DaemonConfig::parse("[listeners.tcp]\nbind = \"nowhere\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
        let e = DaemonConfig::parse("[limits]\nmax_inflight = 70000\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn semantic_errors_name_the_key() {
        let e = DaemonConfig::parse("[listeners.tls]\nenabled = true\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("listeners.tls.cert"), "{e}");
        let e = DaemonConfig::parse("[mqtt]\nmaximum_qos = 3\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("mqtt.maximum_qos"), "{e}");
        let e = DaemonConfig::parse("[storage]\ncache_bytes = 4096\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("storage.cache_bytes"), "{e}");
        let e = DaemonConfig::parse("[storage]\ncommit_window_ms = 1001\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("storage.commit_window_ms"), "{e}");
        let c = DaemonConfig::parse("[storage]\ncommit_window_ms = 1000\n", "x.toml").unwrap();
        assert_eq!(c.storage.commit_window_ms, 1000);
        let e = DaemonConfig::parse("[listeners.ws]\nbacklog = 0\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("listeners.ws.backlog"), "{e}");
        let e = DaemonConfig::parse("[runtime]\nworker_threads = 100000\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("runtime.worker_threads"), "{e}");
        let e = DaemonConfig::parse("[mqtt]\nsys_interval_ms = 10\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("mqtt.sys_interval_ms"), "{e}");
        for ok in [0, 100] {
            let c = DaemonConfig::parse(&format!("[mqtt]\nsys_interval_ms = {ok}\n"), "x.toml")
                .unwrap();
            assert_eq!(c.core_config().sys_interval_ms, ok);
        }
    }

    #[test]
    fn acl_rules_are_checked_as_they_are_read() {
        let c = DaemonConfig::parse(
            "[acl]\ndefault = \"deny\"\n[[acl.rules]]\npermission = \"allow\"\n\
             action = \"subscribe\"\ntopic = \"users/%u/#\"\nuser = \"alice\"\n",
            "x.toml",
        )
        .unwrap();
        let acl = &c.acl;
        assert_eq!(acl.default_permission(), acl::Permission::Deny);
        assert_eq!(acl.rules()[0].topic(), "users/%u/#");
        assert_eq!(acl.rules()[0].user(), Some("alice"));
        for (bad, what) in [
            ("topic = \"a/#/b\"", "misplaced wildcard"),
            ("topic = \"$share/g/a\"", "shared subscriptions"),
        ] {
            let e = DaemonConfig::parse(
                &format!(
                    "[acl]\n\n[[acl.rules]]\npermission = \"deny\"\naction = \"all\"\n{bad}\n"
                ),
                "x.toml",
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(what) && e.contains("line"), "{bad}: {e}");
        }
        let e = DaemonConfig::parse("[acl]\ndefault = \"maybe\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("allow or deny"), "{e}");
    }

    #[test]
    fn allowed_origins_are_origins_on_websocket_listeners() {
        let c = DaemonConfig::parse(
            "[listeners.ws]\nallowed_origins = [\"https://app.example.com\", \"http://localhost:3000\"]\n",
            "x.toml",
        )
        .unwrap();
        assert_eq!(
            c.listeners.ws.allowed_origins.as_ref().map(Vec::len),
            Some(2)
        );
        for (bad, key) in [
            (
                "[listeners.ws]\nallowed_origins = [\"https://a.example/path\"]",
                "listeners.ws.allowed_origins",
            ),
            (
                "[listeners.ws]\nallowed_origins = [\"example.com\"]",
                "listeners.ws.allowed_origins",
            ),
            (
                "[listeners.tcp]\nallowed_origins = [\"*\"]",
                "listeners.tcp.allowed_origins",
            ),
        ] {
            let e = DaemonConfig::parse(&format!("{bad}\n"), "x.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn the_qos0_write_mark_is_an_eighth_unless_set_and_never_above_the_bound() {
        use crate::engine::WriteLimits;
        let c =
            DaemonConfig::parse("[limits]\nmax_write_buffer_bytes = 80000\n", "x.toml").unwrap();
        assert_eq!(WriteLimits::from_config(&c.limits).qos0_max_bytes, 10_000);
        let c = DaemonConfig::parse(
            "[limits]\nmax_write_buffer_bytes = 80000\nqos0_max_write_buffer_bytes = 80000\n",
            "x.toml",
        )
        .unwrap();
        assert_eq!(WriteLimits::from_config(&c.limits).qos0_max_bytes, 80_000);
        let e = DaemonConfig::parse(
            "[limits]\nmax_write_buffer_bytes = 80000\nqos0_max_write_buffer_bytes = 80001\n",
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("limits.qos0_max_write_buffer_bytes"), "{e}");
    }

    #[test]
    fn the_link_marks_are_checked_and_given_to_the_sessions() {
        use crate::mailbox::LinkLimits;
        let base = "[cluster]\nenabled = true\nkey_file = \"k\"\n";
        let c = DaemonConfig::parse(base, "x.toml").unwrap();
        assert_eq!(c.cluster.link_limits(), LinkLimits::default());
        let c = DaemonConfig::parse(
            &format!(
                "{base}link_queue_frames = 64\nlink_congested_bytes = 9000\nlink_drained_bytes = 10\n"
            ),
            "x.toml",
        )
        .unwrap();
        assert_eq!(
            c.cluster.link_limits(),
            LinkLimits {
                queue_frames: 64,
                congested_bytes: 9000,
                drained_bytes: 10
            }
        );
        for (bad, key) in [
            ("link_queue_frames = 3", "cluster.link_queue_frames"),
            (
                "link_queue_frames = 4611686018427387904",
                "cluster.link_queue_frames",
            ),
            ("announce_interval_ms = 0", "cluster.announce_interval_ms"),
            ("link_congested_bytes = 0", "cluster.link_congested_bytes"),
            ("link_drained_bytes = 4194304", "cluster.link_drained_bytes"),
        ] {
            let e = DaemonConfig::parse(&format!("{base}{bad}\n"), "x.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn edge_links_need_the_mesh_tokens_and_tls_off_loopback() {
        let cluster = "[cluster]\nenabled = true\nkey_file = \"k\"\n";
        let ok =
            format!("{cluster}[cluster.edge]\nlisten = \"127.0.0.1:7100\"\ntoken_file = \"t\"\n");
        let c = DaemonConfig::parse(&ok, "x.toml").unwrap();
        assert_eq!(
            c.cluster.edge.listen_addr(),
            Some("127.0.0.1:7100".parse().unwrap())
        );
        for (text, key) in [
            (
                "[cluster.edge]\nlisten = \"127.0.0.1:7100\"\ntoken_file = \"t\"\n".to_owned(),
                "[cluster] enabled",
            ),
            (
                format!("{cluster}[cluster.edge]\nlisten = \"127.0.0.1:7100\"\n"),
                "cluster.edge.token_file",
            ),
            (
                format!("{cluster}[cluster.edge]\nlisten = \"0.0.0.0:7100\"\ntoken_file = \"t\"\n"),
                "cluster.edge.cert",
            ),
            (
                format!("{cluster}[cluster.edge]\nlisten = \"here\"\ntoken_file = \"t\"\n"),
                "cluster.edge.listen",
            ),
        ] {
            let e = DaemonConfig::parse(&text, "x.toml")
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
        let tls = format!(
            "{cluster}[cluster.edge]\nlisten = \"0.0.0.0:7100\"\ntoken_file = \"t\"\n\
             cert = \"c.pem\"\nkey = \"k.pem\"\n"
        );
        assert!(
            DaemonConfig::parse(&tls, "x.toml")
                .unwrap()
                .cluster
                .edge
                .tls()
        );
        let e = DaemonConfig::parse("[cluster.edge]\nlisen = \"x\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2"),
            "an unknown key is named with its line: {e}"
        );
    }

    #[test]
    fn the_runtime_has_the_configured_workers() {
        let c = DaemonConfig::parse("[runtime]\nworker_threads = 3\n", "x.toml").unwrap();
        let runtime = c.runtime.build().unwrap();
        assert_eq!(runtime.metrics().num_workers(), 3);
        let default = DaemonConfig::default().runtime.build().unwrap();
        if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            assert_eq!(default.metrics().num_workers(), cores);
        }
    }
}
