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
//! ([`engine`]). It serves plain TCP connections itself, from an epoll set of its own
//! ([`tcp`]): it reads the sockets, commits what must be persisted, and writes each turn's
//! bytes to each socket in one vectored write. TLS and WebSocket connections have a task each
//! on the same tokio runtime, which reads and sends the bytes to the broker task over a
//! bounded channel and writes what the broker task queues in its [`outbox::Outbox`]. Every
//! queue of outgoing bytes is bounded.

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
pub mod tcp;
pub mod timeline_svg;
pub mod tls;
pub mod topology;
mod wire;

pub use config::{DEFAULT_CONFIG, DaemonConfig};
pub use server::{AuthDecisions, AuthFactory, BrokerBuilder, Server};
