//! The Meridian MQTT broker daemon.
//!
//! `meridian-daemon` runs the sans-IO [`meridian_core::Broker`] on real sockets: TCP, TLS,
//! WebSocket and WSS listeners, persistence in redb, a TOML configuration, admin HTTP with
//! Prometheus metrics. The binary `meridian` is a thin CLI over [`BrokerBuilder`]; apps embed
//! the same broker in their own tokio runtime through it.
//!
//! # Architecture
//!
//! One task, the broker task, owns the `Broker` and the store and runs the core's drive loop
//! ([`engine`]). Connection tasks on the same tokio runtime read sockets and send the bytes to
//! it over a bounded channel; it commits what must be persisted, then queues outgoing bytes in
//! each connection's [`outbox::Outbox`], bounded in bytes, which the connection's task writes.
//! Because all of them are tasks of one runtime, a message at a low rate is read, routed and
//! written on one worker thread without waking another.

pub mod admin;
pub mod auth;
pub mod bench;
pub mod client;
pub mod config;
mod connection;
pub mod engine;
pub mod link_proxy;
pub mod mesh;
pub mod net;
pub mod outbox;
pub mod passwd;
pub mod server;
pub mod sim;
pub mod storage;
pub mod timeline_svg;
pub mod tls;
pub mod topology;
mod wire;

pub use config::{DEFAULT_CONFIG, DaemonConfig};
pub use server::{AuthDecisions, AuthFactory, BrokerBuilder, Server};
