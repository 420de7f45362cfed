//! Meridian's tools around the broker, behind the `meridian` binary's subcommands and used by
//! the tests and examples.
//!
//! - [`bench`](mod@bench): `meridian bench`, a load generator for any MQTT broker (rumqttc clients over
//!   TCP, TLS, WebSocket or WSS): latency, loss and duplicates, the broker's CPU and memory.
//! - [`sim`]: `meridian sim`, a simulated deployment from a topology file ([`topology`]) or a
//!   built-in scenario, run by the core's deterministic simulator, with its timeline drawn as
//!   SVG ([`timeline_svg`]) or as a standalone page with the deployment ([`sim_html`]); its
//!   `mesh-scale` scenario ([`mesh_scale`]) measures how far the
//!   region mesh scales.
//! - [`link_proxy`]: a TCP proxy with latency and cuts, for meshes of regions on one machine.
//!
//! None of it is part of the broker: the daemon (`meridian-mqtt-daemon`) does not depend on it; the
//! `meridian` binary does.

pub mod bench;
pub mod link_proxy;
pub mod mesh_scale;
pub mod sim;
pub mod sim_html;
pub mod timeline_svg;
pub mod topology;
