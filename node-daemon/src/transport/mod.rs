//! How clients' bytes reach the broker task and leave it.
//!
//! - [`listen`]: the listeners: accepting sockets, the TLS and WebSocket handshakes (with the
//!   WebSocket listeners' origin check), and handing each connection to the broker task.
//! - [`tcp`]: plain MQTT-over-TCP connections, served by the broker task itself from an epoll
//!   set of its own.
//! - [`task`]: a task per TLS or WebSocket connection, which reads for the broker task and
//!   writes what it queues.
//! - [`wire`]: the byte stream or WebSocket a connection's task polls.
//! - [`tls`]: certificates and client identities.

pub mod listen;
pub mod task;
pub mod tcp;
pub mod tls;
pub mod wire;
