//! Connections that outlive their broker: with [`Config::resumable_connections`], what an open
//! connection needs to go on is stored, so that a shell whose process is rebuilt while the
//! network connections stay open (a Durable Object woken from hibernation) hands
//! [`Broker::restore_open`] the connections still open and the broker carries on with each where
//! it stood.
//!
//! What is kept: the connection's record (what CONNECT negotiated), written at CONNACK; a record
//! per topic alias the client sets, written when it names a new topic; a marker while a packet
//! is partly received. Persistent sessions are stored as they change, as always; a clean
//! session is written whole at each [`Broker::checkpoint`] if it changed, which the shell calls
//! once its connections have been quiet for a moment (a runtime that hibernates only evicts a
//! quiet process): storing every message of a clean session as it passes would cost a write
//! per delivery and per acknowledgement for state no restart keeps.
//!
//! What is not kept: the time of the last packet (keep alive counts again from the
//! resumption) and the topic aliases the broker chose towards the client (it sends a topic
//! with its alias again, which the client takes as a new mapping).
//!
//! [`Config::resumable_connections`]: crate::Config::resumable_connections

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::connection::{ConnState, Connection, InboundAliases, OutboundAliases};
use super::io::{ConnId, ConnInfo, Output, Timestamp};
use super::persist::{self, ConnRecord, Key, RecordError, SessionRecord, marker};
use super::session::{Session, SessionId};
use super::{Authenticator, Authorizer, Broker, Timer};

/// Connection ids reserved in storage at a time.
const CONN_ID_BLOCK: u64 = 1024;

/// Connections to resume, by the client id of their session.
pub(super) type Resuming = BTreeMap<String, (ConnId, ConnRecord)>;

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Keeps connection ids unique across rebuilds: ids are reserved in storage a block at a
    /// time, and a rebuilt broker starts after the last reservation.
    pub(super) fn reserve_conn_ids(&mut self) {
        if self.config.resumable_connections && self.next_conn > self.conn_ids_reserved {
            self.conn_ids_reserved = self.next_conn.saturating_add(CONN_ID_BLOCK);
            let value = Bytes::copy_from_slice(&self.conn_ids_reserved.to_be_bytes());
            self.persist(Key::ConnectionIds.encode(), Some(value));
        }
    }

    /// A reservation read back: later ids start after it.
    pub(super) fn restore_conn_ids(&mut self, value: &[u8]) -> Result<(), RecordError> {
        let reserved = <[u8; 8]>::try_from(value).map_err(|_| RecordError {
            kind: "connection ids",
            detail: "not a u64",
        })?;
        self.next_conn = self.next_conn.max(u64::from_be_bytes(reserved));
        Ok(())
    }

    /// Stores every clean session of an open connection that changed since the last
    /// checkpoint, as one record of the records it would have if it were persistent
    /// (persistent sessions are stored record by record as they change). A shell whose
    /// process may be rebuilt with its connections kept calls it once they have been quiet
    /// for a moment, before the runtime may evict it: resuming then finds every clean session
    /// as it stood. Without resumable connections it does nothing.
    pub fn checkpoint(&mut self, now: Timestamp) {
        self.advance(now);
        for sid in std::mem::take(&mut self.unsaved) {
            let Some(session) = self.sessions.get_mut(sid as usize).and_then(Option::as_mut) else {
                continue;
            };
            session.checkpoint = session.checkpoint.with_unsaved(false);
            if session.conn.is_none() || session.is_persistent() {
                continue;
            }
            session.checkpoint = session.checkpoint.with_stored(true);
            let records = session_records(session);
            let key = Key::Checkpoint {
                client_id: session.client_id.to_string(),
            };
            self.persist(key.encode(), Some(persist::pack(&records)));
        }
    }

    /// Deletes a session's checkpoint, if one may be stored.
    pub(super) fn drop_checkpoint(&mut self, sid: SessionId) {
        let Some(session) = self.sessions.get_mut(sid as usize).and_then(Option::as_mut) else {
            return;
        };
        if !session.checkpoint.is_stored() {
            return;
        }
        session.checkpoint = session.checkpoint.with_stored(false);
        let key = Key::Checkpoint {
            client_id: session.client_id.to_string(),
        };
        self.persist(key.encode(), None);
    }

    /// Stores what a connected connection needs to be resumed.
    pub(super) fn persist_connection(&mut self, conn_id: ConnId) {
        if !self.config.resumable_connections {
            return;
        }
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let Some(session) = conn.session().and_then(|sid| self.session(sid)) else {
            return;
        };
        let record = ConnRecord {
            client_id: session.client_id.to_string(),
            remote_addr: conn.info.remote_addr.as_deref().map(str::to_owned),
            tls_identity: conn.info.tls_identity.as_deref().map(str::to_owned),
            listener_max_packet: conn.info.max_packet_size,
            keep_alive_secs: conn.keep_alive_secs,
            client_max_packet: conn.client_max_packet,
            send_window: conn.send_window,
            outbound_alias_maximum: conn.outbound_aliases.maximum,
            problem_information: conn.problem_information,
            expiry_requested_zero: conn.expiry_requested_zero,
            auth_method: conn.auth_method.as_deref().map(str::to_owned),
        };
        let key = Key::Connection { conn: conn_id.0 }.encode();
        self.persist(key, Some(record.encode()));
    }

    /// Stores the topic a client's alias stands for now.
    pub(super) fn persist_topic_alias(&mut self, conn_id: ConnId, alias: u16, topic: &str) {
        if self.config.resumable_connections {
            let key = Key::TopicAlias {
                conn: conn_id.0,
                alias,
            };
            self.persist(key.encode(), Some(Bytes::copy_from_slice(topic.as_bytes())));
        }
    }

    /// Deletes a closed connection's records.
    pub(super) fn unpersist_connection(&mut self, conn_id: ConnId, aliases: &InboundAliases) {
        if !self.config.resumable_connections {
            return;
        }
        let conn = conn_id.0;
        self.persist(Key::Connection { conn }.encode(), None);
        self.persist(Key::PartialPacket { conn }.encode(), None);
        for (alias, _) in aliases.iter() {
            self.persist(Key::TopicAlias { conn, alias }.encode(), None);
        }
    }

    /// Records whether a connected connection holds part of a packet: such a connection
    /// cannot be resumed (the bytes are not stored), and is closed instead, as one the network
    /// lost. Written when a packet starts to span reads and when it is complete, not per read.
    pub(super) fn mark_partial_packet(&mut self, conn_id: ConnId, partial: bool) {
        if !self.config.resumable_connections
            || !self
                .conns
                .get(&conn_id)
                .is_some_and(|c| matches!(c.state, ConnState::Connected { .. }))
        {
            return;
        }
        let key = Key::PartialPacket { conn: conn_id.0 }.encode();
        self.persist(key, partial.then(marker));
    }

    /// Pairs the stored connections with the ones the shell still has open and with their
    /// sessions (stored as connected). Records of any other connection are deleted; the
    /// broker's next connection number comes after every number seen.
    pub(super) fn match_connections(
        &mut self,
        connections: BTreeMap<u64, ConnRecord>,
        aliases: &BTreeMap<(u64, u16), String>,
        partial: &BTreeSet<u64>,
        sessions: &BTreeMap<String, SessionRecord>,
        open: &BTreeSet<ConnId>,
    ) -> Resuming {
        let last = connections.keys().copied().chain(partial.iter().copied());
        let last = last.chain(open.iter().map(|c| c.0)).max().unwrap_or(0);
        self.next_conn = self.next_conn.max(last.saturating_add(1));
        self.reserve_conn_ids();
        let mut resuming = Resuming::new();
        for (conn, record) in connections {
            let connected = sessions
                .get(&record.client_id)
                .is_some_and(|s| s.disconnected_at.is_none());
            if connected
                && open.contains(&ConnId(conn))
                && !partial.contains(&conn)
                && !resuming.contains_key(&record.client_id)
            {
                resuming.insert(record.client_id.clone(), (ConnId(conn), record));
            } else {
                self.persist(Key::Connection { conn }.encode(), None);
            }
        }
        for &conn in partial {
            self.persist(Key::PartialPacket { conn }.encode(), None);
        }
        let resumed: BTreeSet<u64> = resuming.values().map(|(c, _)| c.0).collect();
        for &(conn, alias) in aliases.keys() {
            if !resumed.contains(&conn) {
                self.persist(Key::TopicAlias { conn, alias }.encode(), None);
            }
        }
        resuming
    }

    /// Attaches each connection to resume to its restored session, armed with a fresh keep
    /// alive. Open connections with nothing to resume are closed ([`Output::Close`]).
    pub(super) fn resume_connections(
        &mut self,
        resuming: Resuming,
        aliases: BTreeMap<(u64, u16), String>,
        open: &BTreeSet<ConnId>,
    ) -> usize {
        let now = self.now;
        let mut resumed = BTreeSet::new();
        for (client_id, (conn_id, record)) in resuming {
            let Some(&sid) = self.by_client_id.get(client_id.as_str()) else {
                continue;
            };
            let Some(session) = self.session_mut(sid) else {
                continue;
            };
            // Every message restored in flight was sent on this connection: its record is
            // stored before it is written.
            session.inflight.mark_all_sent();
            let protocol = session.protocol;
            let mut inbound_aliases = InboundAliases::default();
            let limit = self.config.topic_alias_maximum;
            let theirs = aliases.range((conn_id.0, 1)..=(conn_id.0, u16::MAX));
            for (&(_, alias), topic) in theirs {
                if alias <= limit {
                    inbound_aliases.set(alias, topic);
                }
            }
            let keep_alive_timer = (record.keep_alive_secs > 0)
                .then(|| now.plus_ms(u64::from(record.keep_alive_secs) * 1500));
            let info = ConnInfo {
                remote_addr: record.remote_addr,
                tls_identity: record.tls_identity,
                max_packet_size: record.listener_max_packet,
            };
            // A fresh connection (no connect timer: it is connected), then what CONNECT set.
            let mut conn = Connection::new(info, now, now);
            conn.state = ConnState::Connected { session: sid };
            conn.protocol = protocol;
            conn.keep_alive_timer = keep_alive_timer;
            conn.keep_alive_secs = record.keep_alive_secs;
            conn.client_max_packet = record.client_max_packet;
            conn.send_window = record.send_window;
            conn.problem_information = record.problem_information;
            conn.inbound_aliases = inbound_aliases;
            conn.outbound_aliases = OutboundAliases::with_maximum(record.outbound_alias_maximum);
            conn.auth_method = record.auth_method.map(String::into_boxed_str);
            conn.expiry_requested_zero = record.expiry_requested_zero;
            self.conns.insert(conn_id, Box::new(conn));
            if let Some(at) = keep_alive_timer {
                self.timers.insert((at, Timer::KeepAlive(conn_id)));
            }
            resumed.insert(conn_id);
        }
        for &conn in open.difference(&resumed) {
            self.outputs.push_back(Output::Close { conn });
        }
        if let Some(sys) = &mut self.sys {
            sys.connections(self.conns.len());
        }
        resumed.len()
    }
}

/// The records a session would have if it were persistent: its own, its subscriptions, its
/// messages in flight and queued, the QoS 2 packet ids it received and has not released.
pub(in crate::broker) fn session_records(s: &Session) -> Vec<(Bytes, Bytes)> {
    session_records_where(s, |_| true).0
}

/// The same, with only the messages whose topic `keep` allows; how many were left out.
pub(in crate::broker) fn session_records_where(
    s: &Session,
    keep: impl Fn(&str) -> bool,
) -> (Vec<(Bytes, Bytes)>, u64) {
    let mut left_out = 0;
    let client_id = || s.client_id.to_string();
    let mut records = vec![(
        Key::Session {
            client_id: client_id(),
        }
        .encode(),
        SessionRecord::of(s).encode(),
    )];
    for (filter, entry) in s.subscriptions.iter() {
        let key = Key::Subscription {
            client_id: client_id(),
            filter: filter.clone(),
        };
        records.push((key.encode(), persist::encode_subscription(entry)));
    }
    for m in s.inflight.iter() {
        if !keep(&m.delivery.message.topic) {
            left_out += 1;
            continue;
        }
        let key = Key::Queued {
            client_id: client_id(),
            seq: m.seq,
        };
        let value = persist::encode_queued(Some((m.packet_id, m.state)), &m.delivery);
        records.push((key.encode(), value));
    }
    for (held, q) in s.queue.iter_marked() {
        if !keep(&q.delivery.message.topic) {
            left_out += 1;
            continue;
        }
        let key = Key::Queued {
            client_id: client_id(),
            seq: q.seq,
        };
        let value = persist::encode_queued_with(None, &q.delivery, q.id.as_deref(), held);
        records.push((key.encode(), value));
    }
    for packet_id in s.incoming_qos2.iter() {
        let key = Key::Incoming {
            client_id: client_id(),
            packet_id,
        };
        records.push((key.encode(), marker()));
    }
    (records, left_out)
}
