//! Rebuilding state from persisted records after a restart.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::client_id::ClientId;
use super::io::{ConnId, Timestamp};
use super::persist::{self, ConnRecord, Key, QueuedRecord, RecordError, SessionRecord};
use super::resume::Resuming;
use super::session::{Inflight, Queued, SessionId, SubscriptionEntry, origin_order};
use super::{Authenticator, Authorizer, Broker, Timer};
use crate::topic::TopicFilter;

/// What [`Broker::restore`] rebuilt, and the records it could not read (left in storage
/// untouched so that nothing is lost silently; the shell should log them).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    /// Sessions restored.
    pub sessions: usize,
    /// Subscriptions restored.
    pub subscriptions: usize,
    /// Queued and in-flight QoS 1/2 messages restored.
    pub messages: usize,
    /// Retained messages restored (expired ones are deleted instead).
    pub retained: usize,
    /// Open connections resumed ([`Broker::restore_open`]).
    pub connections: usize,
    /// Records that could not be read: the key and why.
    pub unreadable: Vec<(Bytes, RecordError)>,
}

/// The broker's records, read and sorted by kind (retained messages and cluster records are
/// put back as they are read).
#[derive(Debug, Default)]
struct Records {
    sessions: BTreeMap<String, SessionRecord>,
    subscriptions: Vec<(String, TopicFilter, SubscriptionEntry)>,
    queued: BTreeMap<(String, u64), QueuedRecord>,
    incoming: Vec<(String, u16)>,
    connections: BTreeMap<u64, ConnRecord>,
    /// Connections that held part of a packet.
    partial: BTreeSet<u64>,
    aliases: BTreeMap<(u64, u16), String>,
    /// Clean sessions read from a checkpoint.
    checkpointed: BTreeSet<String>,
    /// Relays' subscriptions: client id, claim, record.
    relay_slots: Vec<(String, crate::retained::Stamp, Bytes)>,
}

/// What is left to do once every session is back.
#[derive(Debug, Default)]
struct Pending {
    /// Wills waiting for their delay: (due, session, generation).
    wills: Vec<(Timestamp, SessionId, u64)>,
    /// Sessions connected at the crash, whose disconnection is to be recorded.
    crashed: Vec<SessionId>,
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Feed back every record the shell stored, in any order, before accepting connections.
    /// Sessions come back disconnected: their expiry runs from `now` (or from the recorded
    /// disconnect), and a will of a connection that was open at the crash is treated as that of
    /// a lost connection. Records that belong to nothing (e.g. the session record was already
    /// deleted) are deleted through `Persist` outputs.
    pub fn restore(
        &mut self,
        now: Timestamp,
        records: impl IntoIterator<Item = (Bytes, Bytes)>,
    ) -> RestoreReport {
        self.restore_open(now, records, [])
    }

    /// [`Broker::restore`] in a shell whose network connections outlived the broker (with
    /// [`Config::resumable_connections`](crate::Config::resumable_connections)): `open` lists
    /// the connections still open, by the ids the previous broker gave them. Each one whose
    /// records were stored goes on where it stood, connected to its session, without a new
    /// CONNECT; the others get [`Output::Close`](crate::Output::Close), and their sessions see
    /// a lost connection. Later connections get ids after every id seen.
    pub fn restore_open(
        &mut self,
        now: Timestamp,
        records: impl IntoIterator<Item = (Bytes, Bytes)>,
        open: impl IntoIterator<Item = ConnId>,
    ) -> RestoreReport {
        self.advance(now);
        let mut report = RestoreReport::default();
        let mut records = self.read_records(records, &mut report);
        self.finish_cluster_restore();
        let open: BTreeSet<ConnId> = open.into_iter().collect();
        let connections = std::mem::take(&mut records.connections);
        let aliases = std::mem::take(&mut records.aliases);
        let resuming = self.match_connections(
            connections,
            &aliases,
            &records.partial,
            &records.sessions,
            &open,
        );
        let pending = self.restore_sessions(
            records.sessions,
            &records.checkpointed,
            &resuming,
            &mut report,
        );
        self.restore_subscriptions(records.subscriptions, &mut report);
        self.restore_messages(records.queued, &mut report);
        self.restore_incoming(records.incoming);
        for (client_id, claim, value) in std::mem::take(&mut records.relay_slots) {
            if let Err(e) = self.restore_relay_slot(&client_id, claim.clone(), &value) {
                let key = Key::RelaySlot { client_id, claim };
                report.unreadable.push((key.encode(), e));
            }
        }
        report.connections = self.resume_connections(resuming, aliases, &open);
        // The rules may have changed while the node was down.
        let sessions: Vec<SessionId> = self.by_client_id.values().copied().collect();
        for sid in sessions {
            self.withhold_queued(sid);
        }
        self.finish_restore(pending);
        report
    }

    /// Decode every record. Sorted first, so that the rebuilt state (and so the order of later
    /// outputs) does not depend on the order in which the shell's store hands them back.
    fn read_records(
        &mut self,
        records: impl IntoIterator<Item = (Bytes, Bytes)>,
        report: &mut RestoreReport,
    ) -> Records {
        let mut out = Records::default();
        let mut records: Vec<(Bytes, Bytes)> = records.into_iter().collect();
        records.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (key, value) in records {
            if let Err(e) = self.read_record(&key, &value, &mut out, report) {
                report.unreadable.push((key, e));
            }
        }
        out
    }

    /// Decode one record into `out` (or put it back at once: retained messages, cluster
    /// records).
    fn read_record(
        &mut self,
        key: &Bytes,
        value: &Bytes,
        out: &mut Records,
        report: &mut RestoreReport,
    ) -> Result<(), RecordError> {
        match Key::decode(key)? {
            k @ (Key::Outbox { .. }
            | Key::InboxMark { .. }
            | Key::RetainedStamp { .. }
            | Key::ReplicaPosition { .. }
            | Key::ReplicaFilter { .. }
            | Key::Forgotten { .. }
            | Key::Leaf { .. }) => {
                self.restore_cluster_record(&k, value)?;
            }
            Key::Claim { client_id } => self.restore_claim(&client_id, value)?,
            Key::SupersededClaim { client_id } => {
                self.restore_superseded_claim(client_id, value)?
            }
            Key::Transfer {
                client_id,
                shipment,
            } => self.restore_transfer(&client_id, shipment, value)?,
            Key::TransferTaken {
                client_id,
                shipment: claim,
                from,
            } => self.restore_taken(client_id, claim, from),
            Key::Relay {
                client_id,
                claim,
                n,
            } => self.restore_relayed(client_id, claim, n, value)?,
            Key::Took {
                client_id,
                origin,
                seq,
            } => self.restore_took(&client_id, (origin, seq)),
            Key::RelaySlot { client_id, claim } => {
                out.relay_slots.push((client_id, claim, value.clone()))
            }
            Key::RelayKept { client_id, claim } => {
                self.restore_relay_kept(client_id, claim, value)?
            }
            Key::Seen { client_id } => self.restore_seen(client_id, value)?,
            Key::Checkpoint { client_id } => {
                let records = persist::unpack(value)?;
                // Only the records of that one session.
                for (inner, _) in &records {
                    let own = match Key::decode(inner)? {
                        Key::Session { client_id: c }
                        | Key::Subscription { client_id: c, .. }
                        | Key::Queued { client_id: c, .. }
                        | Key::Incoming { client_id: c, .. } => c == client_id,
                        _ => false,
                    };
                    if !own {
                        return Err(RecordError {
                            kind: "checkpoint",
                            detail: "a record of something else",
                        });
                    }
                }
                for (inner, inner_value) in &records {
                    self.read_record(inner, inner_value, out, report)?;
                }
                out.checkpointed.insert(client_id);
            }
            Key::Session { client_id } => {
                out.sessions
                    .insert(client_id, SessionRecord::decode(value)?);
            }
            Key::Subscription { client_id, filter } => {
                let entry = persist::decode_subscription(value)?;
                let filter = TopicFilter::new(filter.as_str()).map_err(|_| RecordError {
                    kind: "subscription",
                    detail: "invalid filter",
                })?;
                out.subscriptions.push((client_id, filter, entry));
            }
            Key::Queued { client_id, seq } => {
                out.queued
                    .insert((client_id, seq), persist::decode_queued(value)?);
            }
            Key::Incoming {
                client_id,
                packet_id,
            } => out.incoming.push((client_id, packet_id)),
            Key::Connection { conn } => {
                out.connections.insert(conn, ConnRecord::decode(value)?);
            }
            Key::PartialPacket { conn } => {
                out.partial.insert(conn);
            }
            Key::ConnectionIds => self.restore_conn_ids(value)?,
            Key::TopicAlias { conn, alias } => {
                let topic = String::from_utf8(value.to_vec()).map_err(|_| RecordError {
                    kind: "topic alias",
                    detail: "topic is not UTF-8",
                })?;
                out.aliases.insert((conn, alias), topic);
            }
            Key::Retained { topic } => {
                let message = persist::decode_retained(value)?;
                if message.is_expired(self.now) {
                    self.persist(key.clone(), None);
                } else {
                    let message = std::sync::Arc::new(message);
                    self.retained_bytes += message.weight();
                    if let Some(old) = self.retained.insert(&topic, message.clone()) {
                        self.retained_bytes -= old.weight();
                    }
                    self.arm_retained_expiry(&message);
                    report.retained += 1;
                }
            }
        }
        Ok(())
    }

    /// Every session, disconnected, with its expiry timer; wills are collected, not armed.
    fn restore_sessions(
        &mut self,
        sessions: BTreeMap<String, SessionRecord>,
        checkpointed: &BTreeSet<String>,
        resuming: &Resuming,
        report: &mut RestoreReport,
    ) -> Pending {
        let now = self.now;
        let mut pending = Pending::default();
        for (client_id, record) in sessions {
            // Stored from a session, whose id was checked.
            let Ok(id) = ClientId::new(&client_id) else {
                continue;
            };
            let sid = self.new_session(id, record.protocol);
            let generation = self.next_generation();
            report.sessions += 1;
            let resumed = resuming.get(&client_id).map(|(conn, _)| *conn);
            // A session connected at the crash (and not resumed) lost its connection now.
            if resumed.is_none() && record.disconnected_at.is_none() {
                pending.crashed.push(sid);
            }
            // Stored in one checkpoint record, or record by record.
            let from_checkpoint = checkpointed.contains(&client_id);
            let Some(session) = self.session_mut(sid) else {
                continue;
            };
            session.username = record.username.map(String::into_boxed_str);
            session.expiry_secs = record.expiry_secs;
            session.generation = generation;
            session.persisted = !from_checkpoint;
            session.checkpoint = session.checkpoint.with_stored(from_checkpoint);
            if let Some(conn) = resumed {
                // Still connected: its will waits for the connection to end.
                session.conn = Some(conn);
                session.will = record.will.map(|(will, _)| Box::new(will));
                continue;
            }
            session.disconnected_at = Some(record.disconnected_at.unwrap_or(now));
            if let Some((will, due)) = record.will {
                let due = due.unwrap_or_else(|| now.plus_secs(will.delay_secs));
                session.pending_will = Some((Box::new(will), due));
                pending.wills.push((due, sid, generation));
            }
            if let Some(at) = session.expires_at() {
                self.timers.insert((
                    at,
                    Timer::SessionExpiry {
                        session: sid,
                        generation,
                    },
                ));
            }
        }
        pending
    }

    /// Each session's subscriptions, judged by the current authorizer; those of no session are
    /// deleted.
    fn restore_subscriptions(
        &mut self,
        subscriptions: Vec<(String, TopicFilter, SubscriptionEntry)>,
        report: &mut RestoreReport,
    ) {
        for (client_id, filter, entry) in subscriptions {
            let Some(&sid) = self.by_client_id.get(client_id.as_str()) else {
                let key = Key::Subscription {
                    client_id,
                    filter: filter.as_str().to_owned(),
                };
                self.persist(key.encode(), None);
                continue;
            };
            let filtered = self.access_filtered(sid, &filter);
            self.hold_subscription(sid, &filter, entry, filtered);
            report.subscriptions += 1;
        }
    }

    /// Messages queued and in flight, in their order; those of no session are deleted.
    fn restore_messages(
        &mut self,
        queued: BTreeMap<(String, u64), QueuedRecord>,
        report: &mut RestoreReport,
    ) {
        for ((client_id, seq), record) in held_in_origin_order(queued) {
            let Some(&sid) = self.by_client_id.get(client_id.as_str()) else {
                self.persist(Key::Queued { client_id, seq }.encode(), None);
                continue;
            };
            // Held back for its origin's order: held again while the session may still get
            // older ones (else it went before the restart, in its origin's order).
            let held = record.held && self.may_get_older(&client_id);
            let Some(session) = self.session_mut(sid) else {
                continue;
            };
            session.next_seq = session.next_seq.max(seq.saturating_add(1));
            match record.inflight {
                Some((packet_id, state)) if !session.inflight.holds(packet_id) => {
                    session.inflight.push(Inflight {
                        packet_id,
                        state,
                        delivery: record.delivery,
                        seq,
                        sent: false,
                    });
                }
                _ => {
                    let queued = Queued {
                        delivery: record.delivery,
                        seq,
                        id: record.id.map(Box::new),
                    };
                    session.queue.enqueue(held, queued);
                }
            }
            report.messages += 1;
        }
    }

    /// The QoS 2 packet ids each session had received and not released.
    fn restore_incoming(&mut self, incoming: Vec<(String, u16)>) {
        for (client_id, packet_id) in incoming {
            match self.by_client_id.get(client_id.as_str()).copied() {
                Some(sid) => {
                    if let Some(s) = self.session_mut(sid) {
                        s.incoming_qos2.insert(packet_id);
                    }
                }
                None => self.persist(
                    Key::Incoming {
                        client_id,
                        packet_id,
                    }
                    .encode(),
                    None,
                ),
            }
        }
    }

    /// Record the disconnection of sessions that were connected at the crash, so that another
    /// restart does not start their expiry (or will delay) over again; arm the wills; fire
    /// what is already due.
    fn finish_restore(&mut self, pending: Pending) {
        self.restart_holds();
        // Forwards stored before a residency rule was added do not leave for its regions.
        self.purge_withheld_forwards();
        if self.routes_pending() {
            // The route set is whole before any peer sees it: a peer that asks for it when the
            // link comes up must not be given the empty set of a node still restoring, or what
            // it publishes meanwhile would not be forwarded here.
            self.fire_route_flush();
        }
        for sid in pending.crashed {
            self.persist_session_meta(sid);
        }
        for (due, sid, generation) in pending.wills {
            self.timers.insert((
                due,
                Timer::Will {
                    session: sid,
                    generation,
                },
            ));
        }
        self.on_timeout();
    }
}

/// A session let its held messages go (or holds them) in their origins' order, which need not
/// be the order they came in, their numbers' here: within each session's records, each
/// origin's held ones take the places they came in, in that origin's order.
fn held_in_origin_order(
    records: BTreeMap<(String, u64), QueuedRecord>,
) -> Vec<((String, u64), QueuedRecord)> {
    let mut out = Vec::with_capacity(records.len());
    let mut records = records.into_iter().peekable();
    while let Some(first) = records.next() {
        let mut session = vec![first];
        while let Some(next) = records.next_if(|((c, _), _)| *c == session[0].0.0) {
            session.push(next);
        }
        let places: Vec<usize> = (0..session.len()).filter(|&i| session[i].1.held).collect();
        let order = origin_order(places.iter().filter_map(|&i| session[i].1.id.as_ref()));
        let mut slots: Vec<Option<_>> = session.into_iter().map(Some).collect();
        let moved: Vec<_> = order.iter().map(|&j| slots[places[j]].take()).collect();
        for (&place, record) in places.iter().zip(moved) {
            slots[place] = record;
        }
        out.extend(slots.into_iter().flatten());
    }
    out
}
