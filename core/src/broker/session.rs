//! Session state: what survives a connection (subscriptions, QoS 1/2 messages in flight and
//! queued, incoming QoS 2 packet ids) for as long as the session lasts.

use std::collections::{BTreeSet, VecDeque};

use super::io::{ConnId, Timestamp};
use super::message::{Delivery, Message};
use crate::codec::{ProtocolVersion, SubscriptionOptions};
use std::sync::Arc;

/// Index of a session in the broker's session table.
pub(crate) type SessionId = u32;

/// A subscription as the session remembers it (key: the full filter text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SubscriptionEntry {
    pub options: SubscriptionOptions,
    pub subscription_id: Option<u32>,
}

/// A session's subscriptions by filter text, in a sorted vector: most sessions hold a few,
/// and a B-tree's smallest node has room for eleven.
#[derive(Debug, Default)]
pub(crate) struct Subscriptions(Vec<(String, SubscriptionEntry)>);

impl Subscriptions {
    fn position(&self, filter: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(f, _)| f.as_str().cmp(filter))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn contains_key(&self, filter: &str) -> bool {
        self.position(filter).is_ok()
    }

    /// Add or replace; the entry it replaced.
    pub fn insert(
        &mut self,
        filter: String,
        entry: SubscriptionEntry,
    ) -> Option<SubscriptionEntry> {
        match self.position(&filter) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, entry)),
            Err(i) => {
                // Most sessions hold one subscription: no room for more until a second comes.
                self.0.reserve_exact(usize::from(self.0.is_empty()));
                self.0.insert(i, (filter, entry));
                None
            }
        }
    }

    pub fn remove(&mut self, filter: &str) -> Option<SubscriptionEntry> {
        let i = self.position(filter).ok()?;
        Some(self.0.remove(i).1)
    }

    /// In filter order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &SubscriptionEntry)> {
        self.0.iter().map(|(f, e)| (f, e))
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(f, _)| f)
    }
}

/// Where an outgoing QoS 1/2 message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InflightState {
    /// PUBLISH sent, waiting for PUBACK (QoS 1) or PUBREC (QoS 2).
    AwaitAck,
    /// PUBREL sent, waiting for PUBCOMP.
    AwaitComp,
}

#[derive(Debug, Clone)]
pub(crate) struct Inflight {
    pub packet_id: u16,
    pub state: InflightState,
    pub delivery: Delivery,
    /// Persistence key sequence, when the session is persistent.
    pub seq: u64,
    /// Sent on the current connection. After a reconnect, entries are re-sent as the client's
    /// Receive Maximum allows.
    pub sent: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub delivery: Delivery,
    pub seq: u64,
}

/// A will message waiting for its connection to end or its delay to pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Will {
    pub message: Message,
    pub delay_secs: u32,
}

#[derive(Debug)]
pub(crate) struct Session {
    pub client_id: Arc<str>,
    pub username: Option<String>,
    pub protocol: ProtocolVersion,
    pub conn: Option<ConnId>,
    /// Seconds the session outlives its connection; 0 ends it with the connection,
    /// `u32::MAX` never expires.
    pub expiry_secs: u32,
    /// When a disconnected session expires.
    pub expires_at: Option<Timestamp>,
    /// When the session lost its connection (persisted: expiry counts from here).
    pub disconnected_at: Option<Timestamp>,
    pub subscriptions: Subscriptions,
    pub inflight: VecDeque<Inflight>,
    pub queue: VecDeque<Queued>,
    pub queued_bytes: usize,
    /// Incoming QoS 2 packet ids PUBREC'd and waiting for PUBREL.
    pub incoming_qos2: BTreeSet<u16>,
    next_packet_id: u16,
    pub next_seq: u64,
    /// The will of the current connection (boxed: most sessions have none).
    pub will: Option<Box<Will>>,
    /// A will whose connection ended, published at the given time unless the client comes back.
    pub pending_will: Option<(Box<Will>, Timestamp)>,
    /// Bumped on every connect and disconnect so that stale timers are recognised.
    pub generation: u64,
    /// Whether records of this session may be in storage (so ending it must delete them).
    pub persisted: bool,
}

impl Session {
    pub fn new(client_id: Arc<str>, protocol: ProtocolVersion) -> Self {
        Self {
            client_id,
            username: None,
            protocol,
            conn: None,
            expiry_secs: 0,
            expires_at: None,
            disconnected_at: None,
            subscriptions: Subscriptions::default(),
            inflight: VecDeque::new(),
            queue: VecDeque::new(),
            queued_bytes: 0,
            incoming_qos2: BTreeSet::new(),
            next_packet_id: 1,
            next_seq: 1,
            will: None,
            pending_will: None,
            generation: 0,
            persisted: false,
        }
    }

    /// Persistent sessions outlive their connection and are written to storage.
    pub fn is_persistent(&self) -> bool {
        self.expiry_secs > 0
    }

    /// A packet id not used by any message in flight. The in-flight window is bounded by a
    /// `u16` Receive Maximum, so a free id always exists.
    pub fn allocate_packet_id(&mut self) -> u16 {
        loop {
            let id = self.next_packet_id;
            self.next_packet_id = if id == u16::MAX { 1 } else { id + 1 };
            if !self.inflight.iter().any(|m| m.packet_id == id) {
                return id;
            }
        }
    }

    pub fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// In-flight entries sent on the current connection.
    pub fn sent_inflight(&self) -> usize {
        self.inflight.iter().filter(|m| m.sent).count()
    }

    /// The first in-flight entry not yet re-sent on the current connection.
    pub fn first_unsent(&self) -> Option<usize> {
        self.inflight.iter().position(|m| !m.sent)
    }

    pub fn inflight_position(&self, packet_id: u16) -> Option<usize> {
        self.inflight.iter().position(|m| m.packet_id == packet_id)
    }
}
