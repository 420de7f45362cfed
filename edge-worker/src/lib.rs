//! Meridian at the edge: a Cloudflare Worker whose Durable Object runs the Meridian broker
//! core, for MQTT clients over WebSocket.
//!
//! - The Worker answers `GET /mqtt` WebSocket upgrades (subprotocol `mqtt`) by handing them to
//!   a Durable Object: the object of the client's edge location (see [`placement`]), or one
//!   object named by the `BROKER_NAME` variable (default `meridian`) for every client.
//!   `GET /status?location=NAME` answers an object's state.
//! - The Durable Object keeps the broker in memory, stores its sessions, subscriptions,
//!   queued and retained messages in its SQLite storage (restored when the object starts
//!   again), and wakes for the broker's deadlines with its alarm. Client sockets are
//!   hibernatable: the object may be evicted between messages while they stay open, and
//!   resumes every connection from storage when it is built again.
//!
//! - The `MQTT_USERS` secret (one `user:password` per line, see [`users`]) lists who may
//!   connect; without it, nobody may, unless the variable `ALLOW_ANONYMOUS = "true"` lets
//!   everyone in on purpose (local development does).
//! - `MQTT_ACL` (see [`rules`]) holds access rules in the daemon's `[acl]` format.
//! - `MERIDIAN_UPSTREAM` and the secret `MERIDIAN_LINK_TOKEN` (see [`link`]) make the broker a
//!   leaf of a daemon's region: its subscribers' interest joins the region's. Without a
//!   daemon, `EDGE_HUB` names the location whose object the others link to.
//!
//! Everything MQTT (3.1.1 and 5.0) is `meridian-mqtt-core`'s; this crate translates IO. A worker
//! crate links it (`edge-worker/template`, the project a user copies) and builds for
//! `wasm32-unknown-unknown` (`worker-build --release`); on other targets only [`users`],
//! [`rules`] and [`link`] are built, for their tests.

#[cfg(target_arch = "wasm32")]
mod entry;
pub mod link;
#[cfg(target_arch = "wasm32")]
mod links;
pub mod placement;
pub mod rules;
#[cfg(target_arch = "wasm32")]
mod shell;
#[cfg(target_arch = "wasm32")]
mod store;
pub mod users;
