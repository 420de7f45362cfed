//! Per-connection state: buffers, negotiated limits, topic aliases, keep alive.

use std::sync::Arc;

use bytes::BytesMut;

use super::io::{ConnInfo, Timestamp};
use super::session::SessionId;
use crate::codec::{Connect, ProtocolVersion};

#[derive(Debug)]
pub(crate) enum ConnState {
    /// Waiting for CONNECT (until the connect timeout).
    AwaitConnect,
    /// CONNECT received; the authenticator has not said yes yet. The CONNECT's
    /// authentication method is the one in progress (`None`: a plain decision is pending).
    /// `assigned`: the client id was assigned by the broker (CONNACK must say so).
    Authenticating {
        connect: Box<Connect>,
        assigned: bool,
    },
    /// CONNECT accepted here, its client id pinned to a home region: waiting for that
    /// region's grant (boxed: rare, and the connection stays small).
    AwaitingHome(Box<HomeWait>),
    Connected {
        session: SessionId,
    },
    /// Close requested; input is ignored.
    Closed,
}

/// A CONNECT waiting for its home region's grant.
#[derive(Debug)]
pub(crate) struct HomeWait {
    pub connect: crate::codec::Connect,
    pub assigned: bool,
    pub username: Option<String>,
    /// Names the request, told back in the answer.
    pub token: u64,
    /// The node asked (`None`: this one decides): only its answer counts.
    pub authority: Option<crate::routes::NodeId>,
    /// The claim proof the authenticator gave for the client, sent with the request (the
    /// home checks it before it closes anyone's connection) and kept for the claim.
    pub proof: Option<bytes::Bytes>,
}

/// What the shell told about a connection ([`ConnInfo`]), kept for as long as it lives: its
/// texts never change, so they are kept without room to grow.
#[derive(Debug)]
pub(crate) struct Peer {
    pub remote_addr: Option<Box<str>>,
    pub tls_identity: Option<Box<str>>,
    pub max_packet_size: Option<u32>,
}

impl From<ConnInfo> for Peer {
    fn from(info: ConnInfo) -> Self {
        Self {
            remote_addr: info.remote_addr.map(String::into_boxed_str),
            tls_identity: info.tls_identity.map(String::into_boxed_str),
            max_packet_size: info.max_packet_size,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Connection {
    pub info: Peer,
    pub state: ConnState,
    pub protocol: ProtocolVersion,
    pub read_buf: BytesMut,
    pub write_buf: BytesMut,
    /// Whether `write_buf` holds bytes not yet handed to the shell.
    pub dirty: bool,
    /// The shell's backlog for this connection is past its mark ([`super::Input::Congested`]):
    /// QoS 0 deliveries are dropped.
    pub congested: bool,
    pub last_packet_at: Timestamp,
    /// When the connect timeout fires (its timer is cancelled once connected or closed).
    pub connect_deadline: Timestamp,
    /// The keep-alive timer currently armed, if any.
    pub keep_alive_timer: Option<Timestamp>,
    /// Keep alive enforced by the server, in seconds (0: none).
    pub keep_alive_secs: u16,
    /// Largest packet the client accepts.
    pub client_max_packet: u32,
    /// Outgoing QoS 1/2 window (client's Receive Maximum capped by config).
    pub send_window: u16,
    /// Whether the client wants reason strings and user properties on errors.
    pub problem_information: bool,
    pub inbound_aliases: InboundAliases,
    pub outbound_aliases: OutboundAliases,
    /// Authentication method agreed at CONNECT (for re-authentication).
    pub auth_method: Option<Box<str>>,
    /// CONNECT asked for no session expiry: DISCONNECT may then not set one (MQTT-3.14.2-2).
    pub expiry_requested_zero: bool,
}

impl Connection {
    pub fn new(info: ConnInfo, now: Timestamp, connect_deadline: Timestamp) -> Self {
        Self {
            info: info.into(),
            state: ConnState::AwaitConnect,
            protocol: ProtocolVersion::V5,
            read_buf: BytesMut::new(),
            write_buf: BytesMut::new(),
            dirty: false,
            congested: false,
            last_packet_at: now,
            connect_deadline,
            keep_alive_timer: None,
            keep_alive_secs: 0,
            client_max_packet: u32::MAX,
            send_window: 0,
            problem_information: true,
            inbound_aliases: InboundAliases::default(),
            outbound_aliases: OutboundAliases::default(),
            auth_method: None,
            expiry_requested_zero: true,
        }
    }

    pub fn session(&self) -> Option<SessionId> {
        match self.state {
            ConnState::Connected { session } => Some(session),
            _ => None,
        }
    }

    /// When the keep alive runs out: 1.5 times the interval after the last packet.
    pub fn keep_alive_deadline(&self) -> Option<Timestamp> {
        self.keep_alive_deadline_from(self.last_packet_at)
    }

    /// When the keep alive runs out if the last packet came `at`.
    pub fn keep_alive_deadline_from(&self, at: Timestamp) -> Option<Timestamp> {
        (self.keep_alive_secs > 0).then(|| at.plus_ms(u64::from(self.keep_alive_secs) * 1500))
    }
}

/// Topic aliases the client set (client to server), 1 ..= the broker's Topic Alias Maximum.
/// Boxed and made on the first alias: most clients never set one.
#[derive(Debug, Default)]
pub(crate) struct InboundAliases {
    topics: Option<Box<[Option<Arc<str>>]>>,
}

impl InboundAliases {
    pub fn get(&self, alias: u16) -> Option<&Arc<str>> {
        self.topics.as_ref()?.get(usize::from(alias))?.as_ref()
    }

    /// Every alias set, with its topic.
    pub fn iter(&self) -> impl Iterator<Item = (u16, &Arc<str>)> {
        let topics = self.topics.iter().flat_map(|t| t.iter());
        topics
            .enumerate()
            .filter_map(|(i, t)| Some((u16::try_from(i).ok()?, t.as_ref()?)))
    }

    /// Sets `alias` to `topic`; false if it already stood for that topic.
    pub fn set(&mut self, alias: u16, topic: &str) -> bool {
        if self.get(alias).is_some_and(|t| **t == *topic) {
            return false;
        }
        let topic: Arc<str> = topic.into();
        let i = usize::from(alias);
        let topics = self.topics.get_or_insert_with(Box::default);
        if topics.len() <= i {
            // Grown to the highest alias in use: a client sets each alias once or a few times.
            let mut grown = std::mem::take(topics).into_vec();
            grown.resize(i + 1, None);
            *topics = grown.into_boxed_slice();
        }
        topics[i] = Some(topic);
        true
    }
}

/// Topic aliases the broker uses towards the client. New topics take free aliases; once all
/// are taken, aliases are reused in round-robin order.
#[derive(Debug, Default)]
pub(crate) struct OutboundAliases {
    pub maximum: u16,
    /// Boxed and made on the first alias: most clients never allow one.
    table: Option<Box<AliasTable>>,
}

#[derive(Debug, Default)]
struct AliasTable {
    by_topic: super::FixedMap<Arc<str>, u16>,
    by_alias: Vec<Arc<str>>,
    next_victim: u16,
}

impl OutboundAliases {
    pub fn with_maximum(maximum: u16) -> Self {
        Self {
            maximum,
            table: None,
        }
    }

    /// The alias the client already knows for this topic.
    pub fn known(&self, topic: &str) -> Option<u16> {
        self.table.as_ref()?.by_topic.get(topic).copied()
    }

    /// Give the topic an alias: a free one while there are, then reuse them in round-robin
    /// order. The client learns it from the PUBLISH that carries topic and alias together.
    pub fn assign(&mut self, topic: &Arc<str>) -> u16 {
        let maximum = self.maximum;
        let table = self.table.get_or_insert_with(Box::default);
        let alias = if table.by_alias.len() < usize::from(maximum) {
            table.by_alias.push(topic.clone());
            // by_alias.len() <= maximum, a u16.
            u16::try_from(table.by_alias.len()).unwrap_or(u16::MAX)
        } else {
            let alias = table.next_victim % maximum + 1;
            table.next_victim = alias % maximum;
            let slot = usize::from(alias - 1);
            let old = std::mem::replace(&mut table.by_alias[slot], topic.clone());
            table.by_topic.remove(&old);
            alias
        };
        table.by_topic.insert(topic.clone(), alias);
        alias
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes a connection's state may take: it is boxed, and up to 216 bytes it takes a
    /// 224-byte malloc chunk.
    const CONNECTION_BUDGET: usize = 216;

    #[test]
    fn a_connection_stays_within_its_budget() {
        let size = std::mem::size_of::<Connection>();
        assert!(size <= CONNECTION_BUDGET, "a connection takes {size} bytes");
    }
}
