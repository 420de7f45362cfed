//! The Meridian MQTT broker daemon.
//!
//! `meridian-mqtt-daemon` runs the sans-IO [`meridian_core::Broker`] on real sockets: TCP, TLS,
//! WebSocket and WSS listeners, persistence in redb, a TOML configuration, admin HTTP with
//! Prometheus metrics. The binary `meridian` is a thin CLI over [`BrokerBuilder`]; apps embed
//! the same broker in their own tokio runtime through it.
//!
//! # Architecture
//!
//! One task, the broker task, owns the `Broker` and the store and runs the core's drive loop
//! (`engine.rs`); everything else reaches it through its mailbox (`mailbox.rs`). It serves
//! plain TCP connections itself, from an epoll set of its own (`transport/tcp.rs`): it reads
//! the sockets, commits what must be persisted, and writes each turn's bytes to each socket in
//! one vectored write. TLS and WebSocket connections have a task each on the same tokio
//! runtime (`transport/task.rs`), which reads and sends the bytes to the broker task over a
//! bounded channel and writes what the broker task queues in its outbox. Every queue of
//! outgoing bytes is bounded. The region mesh is in `mesh/`, admin HTTP in `admin.rs`; the
//! repository's `docs/architecture.md` draws the whole.
//!
//! The public surface is what an embedding application needs: [`BrokerBuilder`] and
//! [`Server`], the configuration ([`config`], [`DaemonConfig`]), the in-process [`client`],
//! the password file format ([`passwd`]) and the binary's other commands ([`cli`]).

mod admin;
mod auth;
mod broker_thread;
pub mod client;
mod clock;
pub mod config;
mod ctl;
mod edge;
mod engine;
mod mailbox;
mod mesh;
mod open_files;
pub mod passwd;
mod per_address;
mod policy;
mod secret_file;
mod server;
mod storage;
mod transport;

pub use config::{DEFAULT_CONFIG, DaemonConfig, ListenerKind};
pub use server::{AuthDecisions, AuthFactory, AuthReload, BrokerBuilder, Server};

/// What the `meridian` binary's own subcommands run, besides the broker.
pub mod cli {
    pub use crate::ctl::{
        AclCommand, CtlArgs, CtlCommand, PeersCommand, ResidencyCommand, RuleArgs, TokenCommand,
        TokenKindArg, UserCommand, ctl_command,
    };
    pub use crate::mesh::keys::{keygen_command, peer_id_command};
    pub use crate::passwd::passwd_command;
    pub use crate::policy::operator::keygen_command as operator_keygen_command;
    pub use crate::policy::operator::{certify_command, certify_leaf_command};
}

/// The region mesh's own parts, for tests that play a peer node (one holding the cluster key
/// that sends what it likes). Not a stable interface.
#[doc(hidden)]
pub mod testing {
    pub use crate::mailbox::{LinkEvent, MeshCmd, ToEngine};
    pub use crate::mailbox::{LinkLimits, PeerWriter};
    pub use crate::mesh::keys::load_cluster_key;
    pub use crate::mesh::policy_sync::POLICY_PROTOCOL;
    pub use crate::mesh::{Mesh, MeshSettings, MeshStats, start as start_mesh};
}
