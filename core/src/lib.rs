//! Meridian's sans-IO MQTT broker core.
//!
//! `meridian-mqtt-core` is a complete MQTT 3.1.1 and 5.0 broker as a state machine: the
//! [`codec`] for every packet, [`topic`] names, filters and the tries that match them, and the
//! [`Broker`] with sessions, QoS 0/1/2, retained messages, shared subscriptions, wills, topic
//! aliases and authentication hooks. It does no IO: no sockets, files, threads, clocks or OS
//! randomness. Bytes, time and seeds come in; bytes to send, connections to close, records to
//! persist and events come out. The same code runs in the `meridian` daemon, in a Cloudflare
//! Durable Object, in JavaScript through wasm, and in the simulator.
//!
//! # The drive loop
//!
//! Feed one input, drain every output in order, then sleep until [`Broker::poll_timeout`] or
//! the next input, whichever comes first:
//!
//! ```
//! use meridian_core::{Broker, Config, ConnInfo, Input, Output, Timestamp};
//!
//! let mut now = Timestamp::from_millis(1_700_000_000_000);
//! let mut broker = Broker::new(Config::default(), now);
//!
//! // A client connected: the shell names it with `accept` and passes its bytes in.
//! let conn = broker.accept(now, ConnInfo::default());
//! // An MQTT 3.1.1 CONNECT for client id "c1", clean session, keep alive 60 s.
//! let connect = [0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60, 0, 2, b'c', b'1'];
//! broker.handle_input(now, Input::Bytes { conn, data: &connect });
//!
//! let mut sent = Vec::new();
//! while let Some(output) = broker.poll_output() {
//!     match output {
//!         Output::Send { conn, data } => sent.extend_from_slice(&data), // write to the socket
//!         Output::Close { conn } => {}                                   // close the socket
//!         Output::Persist { key, value, durability } => {} // store (or delete), as durably as it says
//!         Output::Event(event) => {}           // log, count
//!         Output::ToPeer { .. } | Output::Broadcast { .. } | Output::CutPeer { .. } => {} // cluster mode
//!     }
//! }
//! assert_eq!(sent, [0x20, 2, 0, 0]); // CONNACK: accepted, no session present
//!
//! // Nothing more arrives. The next deadline is the keep-alive timeout, 1.5 x 60 s after the
//! // last packet; when it comes, the broker closes the connection.
//! let deadline = broker.poll_timeout().expect("keep-alive deadline");
//! assert_eq!(deadline.as_millis() - now.as_millis(), 90_000);
//! now = deadline;
//! broker.handle_input(now, Input::Timeout);
//! assert!(std::iter::from_fn(|| broker.poll_output()).any(|o| o == Output::Close { conn }));
//! ```
//!
//! Rules for shells: drain `poll_output` after every input and every other call that changes
//! the broker (each takes `now`); feed nothing while draining; apply outputs in order (a
//! [`Output::Persist`] of [`Durability::Now`](broker::Durability::Now) must be durable before
//! any later `Send` goes out, because that send may acknowledge it); write the frames for
//! peers as they come, already encoded; never let time go backwards; after a restart, feed
//! every stored record to [`Broker::restore`] before accepting connections. The [`Broker`]
//! type lists its methods by family.

#![warn(missing_docs)]

pub mod acl;
pub mod broker;
pub mod codec;
pub mod link;
mod read;
pub mod residency;
pub mod retained;
pub mod routes;
#[cfg(feature = "sim")]
pub mod sim;
pub mod topic;

pub use broker::{Broker, Config, ConnId, ConnInfo, Event, Input, Output, Timestamp};
