//! PUBLISH in both directions: inbound validation, retained store, routing to sessions,
//! the outgoing in-flight window and queue, and the QoS 1/2 acknowledgement flows.

use std::sync::Arc;

use super::connection::AliasUse;
use super::io::ConnId;
use super::message::{Delivery, Message};
use super::persist::{self, Key};
use super::session::{Inflight, InflightState, Queued, SessionId};
use super::{Broker, ClientRef};
use crate::codec::{self, Ack, OutgoingPublish, Packet, ProtocolVersion, Publish, QoS, ReasonCode};
use crate::topic::{TopicFilter, TopicName};

impl Broker {
    pub(super) fn on_publish(&mut self, conn_id: ConnId, sid: SessionId, mut p: Publish) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        let v5 = conn.protocol == ProtocolVersion::V5;
        self.stats.messages_received[p.qos as usize] += 1;

        // Topic aliases (5.0): resolve or record.
        if let Some(alias) = p.properties.topic_alias.take() {
            if alias == 0 || alias > self.config.topic_alias_maximum {
                return self.protocol_violation(
                    conn_id,
                    ReasonCode::TOPIC_ALIAS_INVALID,
                    "topic alias out of range",
                );
            }
            if p.topic.is_empty() {
                match conn.inbound_aliases.get(alias) {
                    Some(topic) => p.topic = topic.to_string(),
                    None => {
                        return self.protocol_violation(
                            conn_id,
                            ReasonCode::PROTOCOL_ERROR,
                            "unknown topic alias",
                        );
                    }
                }
            } else {
                conn.inbound_aliases.set(alias, p.topic.as_str().into());
            }
        }
        if p.qos > self.config.maximum_qos {
            return self.protocol_violation(
                conn_id,
                ReasonCode::QOS_NOT_SUPPORTED,
                "QoS above the server maximum",
            );
        }
        if p.retain && !self.config.retain_available {
            return self.protocol_violation(
                conn_id,
                ReasonCode::RETAIN_NOT_SUPPORTED,
                "retain is not available",
            );
        }
        let packet_id = p.packet_id.unwrap_or(0);

        // Exactly once: a QoS 2 packet id already PUBREC'd is a re-send; acknowledge, don't route.
        if p.qos == QoS::ExactlyOnce {
            let Some(session) = self.session(sid) else {
                return;
            };
            if session.incoming_qos2.contains(&packet_id) {
                return self.send(conn_id, &Packet::PubRec(Ack::new(packet_id)));
            }
            if session.incoming_qos2.len() >= usize::from(self.config.receive_maximum) {
                return self.protocol_violation(
                    conn_id,
                    ReasonCode::RECEIVE_MAXIMUM_EXCEEDED,
                    "more unacknowledged QoS 2 messages than Receive Maximum",
                );
            }
        }

        let reason = self.check_publish(sid, &p);
        if reason == Some(ReasonCode::TOPIC_NAME_INVALID) && !v5 {
            // 3.1.1 has no way to refuse a PUBLISH but closing the connection.
            return self.protocol_violation(
                conn_id,
                ReasonCode::TOPIC_NAME_INVALID,
                "topic name over the limits",
            );
        }
        if reason.is_none() {
            let message = Message {
                topic: p.topic.as_str().into(),
                payload: p.payload,
                qos: p.qos,
                retain: p.retain,
                properties: p.properties,
                expires_at: None,
                origin: Some(sid),
            };
            if p.qos == QoS::ExactlyOnce {
                let Some(session) = self.session_mut(sid) else {
                    return;
                };
                session.incoming_qos2.insert(packet_id);
                if session.is_persistent() {
                    let key = Key::Incoming {
                        client_id: session.client_id.to_string(),
                        packet_id,
                    };
                    self.persist(key.encode(), Some(persist::marker()));
                }
            }
            self.publish_message(message);
        }
        // 3.1.1 clients whose message was refused still get a normal acknowledgement (the
        // message is dropped), so that they do not re-send it forever.
        let reason = if v5 {
            reason.unwrap_or(ReasonCode::SUCCESS)
        } else {
            ReasonCode::SUCCESS
        };
        let ack = Ack {
            packet_id,
            reason,
            properties: self.problem(conn_id, reason),
        };
        match p.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => self.send(conn_id, &Packet::PubAck(ack)),
            QoS::ExactlyOnce => self.send(conn_id, &Packet::PubRec(ack)),
        }
    }

    /// Why a PUBLISH from a client is refused, if it is.
    fn check_publish(&mut self, sid: SessionId, p: &Publish) -> Option<ReasonCode> {
        if TopicName::with_limits(p.topic.as_str(), &self.topic_limits).is_err() {
            return Some(ReasonCode::TOPIC_NAME_INVALID);
        }
        if p.properties.payload_format_indicator == Some(1)
            && std::str::from_utf8(&p.payload).is_err()
        {
            return Some(ReasonCode::PAYLOAD_FORMAT_INVALID);
        }
        let session = self.session(sid)?;
        let client = ClientRef {
            client_id: &session.client_id,
            username: session.username.as_deref(),
        };
        if !self.authorizer.may_publish(&client, &p.topic) {
            self.stats.dropped_not_authorized += 1;
            return Some(ReasonCode::NOT_AUTHORIZED);
        }
        None
    }

    /// Store (if retained) and route a message to every matching session. Returns the number
    /// of sessions it went to.
    pub(super) fn publish_message(&mut self, mut message: Message) -> usize {
        if message.expires_at.is_none()
            && let Some(secs) = message.properties.message_expiry_interval
        {
            message.expires_at = Some(self.now.plus_secs(secs));
        }
        message.properties.message_expiry_interval = None;
        message.properties.topic_alias = None;
        message.properties.subscription_identifiers.clear();
        let message = Arc::new(message);
        if message.retain {
            self.store_retained(&message);
        }
        self.route(&message)
    }

    fn store_retained(&mut self, message: &Arc<Message>) {
        let key = Key::Retained {
            topic: message.topic.to_string(),
        }
        .encode();
        if message.payload.is_empty() {
            if self.retained.remove(&message.topic).is_some() {
                self.persist(key, None);
            }
            return;
        }
        if self.retained.get(&message.topic).is_none()
            && self.retained.len() >= self.config.max_retained_messages
        {
            self.stats.dropped_retained_full += 1;
            return;
        }
        self.retained.insert(&message.topic, message.clone());
        self.arm_retained_expiry(message);
        self.persist(key, Some(persist::encode_retained(message)));
    }

    /// Remember when a retained message expires, so that it leaves memory and storage then.
    pub(super) fn arm_retained_expiry(&mut self, message: &Arc<Message>) {
        if let Some(at) = message.expires_at {
            self.retained_expiry.insert((at, message.topic.clone()));
            self.timers.insert((at, super::Timer::RetainedExpiry));
        }
    }

    fn route(&mut self, message: &Arc<Message>) -> usize {
        let mut recipients = std::mem::take(&mut self.scratch);
        {
            let sessions = &self.sessions;
            let connected = |sid: SessionId| {
                sessions
                    .get(sid as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|s| s.conn.is_some())
            };
            self.subs
                .recipients(&message.topic, message.origin, connected, &mut recipients);
        }
        let n = recipients.len();
        for r in recipients.drain(..) {
            let delivery = Delivery {
                message: message.clone(),
                qos: message.qos.min(r.qos),
                retain: message.retain && r.retain_as_published,
                subscription_ids: r.subscription_ids,
                shared: r.shared,
            };
            self.deliver(r.session, delivery);
        }
        self.scratch = recipients;
        n
    }

    /// Hand one message to one session: send it now, or queue it.
    pub(super) fn deliver(&mut self, sid: SessionId, delivery: Delivery) {
        let Some(session) = self.session(sid) else {
            return;
        };
        let conn = session.conn;
        if delivery.message.is_expired(self.now) {
            self.stats.dropped_expired += 1;
            return;
        }
        if delivery.qos == QoS::AtMostOnce {
            match conn {
                Some(conn) => {
                    self.write_publish(conn, &delivery, None, false);
                }
                None => self.stats.dropped_qos0_offline += 1,
            }
            return;
        }
        let window = conn
            .and_then(|c| self.conns.get(&c))
            .map_or(0, |c| usize::from(c.send_window));
        if let Some(conn) = conn
            && session.queue.is_empty()
            && session.inflight.len() < window
        {
            let seq = self.session_mut(sid).map_or(0, |s| s.take_seq());
            self.send_inflight(sid, conn, delivery, seq, false);
            return;
        }
        let weight = delivery.message.weight();
        if session.queue.len() >= self.config.max_queued_messages
            || session.queued_bytes + weight > self.config.max_queued_bytes
        {
            self.stats.dropped_queue_full += 1;
            return;
        }
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        let seq = session.take_seq();
        session.queued_bytes += weight;
        if session.is_persistent() {
            session.persisted = true;
            let key = Key::Queued {
                client_id: session.client_id.to_string(),
                seq,
            };
            let value = persist::encode_queued(None, &delivery);
            session.queue.push_back(Queued { delivery, seq });
            self.persist(key.encode(), Some(value));
        } else {
            session.queue.push_back(Queued { delivery, seq });
        }
    }

    /// Put a QoS 1/2 delivery in flight on the session's connection. `stored`: a record of it
    /// (as queued) already exists under `seq`.
    fn send_inflight(
        &mut self,
        sid: SessionId,
        conn: ConnId,
        delivery: Delivery,
        seq: u64,
        stored: bool,
    ) {
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        let packet_id = session.allocate_packet_id();
        let persistent = session.is_persistent();
        let client_id = session.client_id.to_string();
        if !self.fits_client(conn, &delivery, Some(packet_id)) {
            // Too large for this client: dropped, as if delivered.
            self.stats.dropped_too_large += 1;
            if stored {
                self.persist(Key::Queued { client_id, seq }.encode(), None);
            }
            return;
        }
        // The record goes first: once the client may have the message, a restart must know
        // its packet id, or a QoS 2 message could be delivered twice.
        if persistent {
            let value =
                persist::encode_queued(Some((packet_id, InflightState::AwaitAck)), &delivery);
            self.persist(Key::Queued { client_id, seq }.encode(), Some(value));
        }
        self.write_publish(conn, &delivery, Some(packet_id), false);
        if let Some(session) = self.session_mut(sid) {
            session.persisted |= persistent;
            session.inflight.push_back(Inflight {
                packet_id,
                state: InflightState::AwaitAck,
                delivery,
                seq,
            });
        }
    }

    /// Encode a PUBLISH for one subscriber into its connection's buffer. Returns false (and
    /// counts a drop) if it is larger than the client accepts.
    pub(super) fn write_publish(
        &mut self,
        conn_id: ConnId,
        delivery: &Delivery,
        packet_id: Option<u16>,
        dup: bool,
    ) -> bool {
        let now = self.now;
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return false;
        };
        let msg = &delivery.message;
        let v5 = conn.protocol == ProtocolVersion::V5;
        let mut out = outgoing(delivery, v5, now, packet_id, dup);
        if !fits(&out, conn) {
            self.stats.dropped_too_large += 1;
            return false;
        }
        if v5 {
            match conn.outbound_aliases.lookup(&msg.topic) {
                AliasUse::None => {}
                AliasUse::Known(alias) => {
                    out.topic = "";
                    out.topic_alias = Some(alias);
                }
                AliasUse::New(alias) => out.topic_alias = Some(alias),
            }
        }
        let before = conn.write_buf.len();
        if codec::encode_publish(&out, conn.protocol, &mut conn.write_buf).is_err() {
            conn.write_buf.truncate(before);
            self.stats.dropped_too_large += 1;
            return false;
        }
        self.stats.packets_sent += 1;
        self.stats.messages_sent[delivery.qos as usize] += 1;
        self.stats.bytes_sent += (conn.write_buf.len() - before) as u64;
        if !conn.dirty {
            conn.dirty = true;
            self.dirty.push(conn_id);
        }
        true
    }

    /// Whether a PUBLISH of this delivery is within the client's Maximum Packet Size.
    fn fits_client(&self, conn_id: ConnId, delivery: &Delivery, packet_id: Option<u16>) -> bool {
        self.conns.get(&conn_id).is_some_and(|conn| {
            let v5 = conn.protocol == ProtocolVersion::V5;
            fits(&outgoing(delivery, v5, self.now, packet_id, false), conn)
        })
    }

    /// Move queued messages into flight while the window has room.
    pub(super) fn pump(&mut self, sid: SessionId) {
        loop {
            let Some(session) = self.session(sid) else {
                return;
            };
            let Some(conn) = session.conn else { return };
            let window = self
                .conns
                .get(&conn)
                .map_or(0, |c| usize::from(c.send_window));
            if session.inflight.len() >= window {
                return;
            }
            let now = self.now;
            let Some(session) = self.sessions.get_mut(sid as usize).and_then(Option::as_mut) else {
                return;
            };
            let Some(Queued { delivery, seq }) = session.queue.pop_front() else {
                return;
            };
            session.queued_bytes = session
                .queued_bytes
                .saturating_sub(delivery.message.weight());
            if delivery.message.is_expired(now) {
                self.stats.dropped_expired += 1;
                if session.is_persistent() {
                    let key = Key::Queued {
                        client_id: session.client_id.to_string(),
                        seq,
                    };
                    self.persist(key.encode(), None);
                }
                continue;
            }
            let stored = session.is_persistent();
            self.send_inflight(sid, conn, delivery, seq, stored);
        }
    }

    /// Remove a finished in-flight message and its record, then refill the window.
    fn complete_inflight(&mut self, sid: SessionId, pos: usize) {
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        let Some(done) = session.inflight.remove(pos) else {
            return;
        };
        if session.is_persistent() {
            let key = Key::Queued {
                client_id: session.client_id.to_string(),
                seq: done.seq,
            };
            self.persist(key.encode(), None);
        }
        self.pump(sid);
    }

    pub(super) fn on_puback(&mut self, sid: SessionId, ack: Ack) {
        let Some(session) = self.session(sid) else {
            return;
        };
        if let Some(pos) = session.inflight_position(ack.packet_id) {
            let m = &session.inflight[pos];
            if m.delivery.qos == QoS::AtLeastOnce && m.state == InflightState::AwaitAck {
                self.complete_inflight(sid, pos);
            }
        }
    }

    pub(super) fn on_pubrec(&mut self, conn_id: ConnId, sid: SessionId, ack: Ack) {
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        let Some(pos) = session.inflight_position(ack.packet_id) else {
            let mut rel = Ack::new(ack.packet_id);
            rel.reason = ReasonCode::PACKET_IDENTIFIER_NOT_FOUND;
            return self.send(conn_id, &Packet::PubRel(rel));
        };
        if session.inflight[pos].delivery.qos != QoS::ExactlyOnce {
            return;
        }
        if ack.reason.is_error() {
            // The client refused the message: it is finished, no PUBREL.
            return self.complete_inflight(sid, pos);
        }
        if session.inflight[pos].state == InflightState::AwaitAck {
            session.inflight[pos].state = InflightState::AwaitComp;
            if session.is_persistent() {
                let m = &session.inflight[pos];
                let key = Key::Queued {
                    client_id: session.client_id.to_string(),
                    seq: m.seq,
                };
                let value = persist::encode_queued(
                    Some((m.packet_id, InflightState::AwaitComp)),
                    &m.delivery,
                );
                self.persist(key.encode(), Some(value));
            }
        }
        self.send(conn_id, &Packet::PubRel(Ack::new(ack.packet_id)));
    }

    pub(super) fn on_pubcomp(&mut self, sid: SessionId, ack: Ack) {
        let Some(session) = self.session(sid) else {
            return;
        };
        if let Some(pos) = session.inflight_position(ack.packet_id)
            && session.inflight[pos].state == InflightState::AwaitComp
        {
            self.complete_inflight(sid, pos);
        }
    }

    /// PUBREL for an incoming QoS 2 message: forget its packet id, answer PUBCOMP.
    pub(super) fn on_pubrel(&mut self, conn_id: ConnId, sid: SessionId, ack: Ack) {
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        let mut comp = Ack::new(ack.packet_id);
        if session.incoming_qos2.remove(&ack.packet_id) {
            if session.is_persistent() {
                let key = Key::Incoming {
                    client_id: session.client_id.to_string(),
                    packet_id: ack.packet_id,
                };
                self.persist(key.encode(), None);
            }
        } else if session.protocol == ProtocolVersion::V5 {
            comp.reason = ReasonCode::PACKET_IDENTIFIER_NOT_FOUND;
        }
        self.send(conn_id, &Packet::PubComp(comp));
    }

    /// A session lost its connection (or ends): its unacknowledged messages that came through
    /// shared subscriptions go to another connected member of the same group. Messages already
    /// PUBREC'd stay (the client has them), and so does everything when no other member is
    /// connected (it is re-sent on reconnect, with its packet id).
    pub(super) fn hand_over_shared(&mut self, sid: SessionId) {
        let Some(session) = self.session(sid) else {
            return;
        };
        let candidates: Vec<(u64, Arc<str>)> = session
            .inflight
            .iter()
            .filter(|m| m.state == InflightState::AwaitAck)
            .map(|m| (m.seq, &m.delivery))
            .chain(session.queue.iter().map(|m| (m.seq, &m.delivery)))
            .filter_map(|(seq, d)| Some((seq, d.shared.clone()?)))
            .collect();
        for (seq, filter) in candidates {
            let Ok(filter) = TopicFilter::new(&*filter) else {
                continue;
            };
            let target = {
                let sessions = &self.sessions;
                self.subs.other_shared_member(&filter, sid, |s| {
                    sessions
                        .get(s as usize)
                        .and_then(Option::as_ref)
                        .is_some_and(|x| x.conn.is_some())
                })
            };
            let Some((other, sub)) = target else { continue };
            let Some(session) = self.session_mut(sid) else {
                return;
            };
            let delivery = if let Some(pos) = session.inflight.iter().position(|m| m.seq == seq) {
                session.inflight.remove(pos).map(|m| m.delivery)
            } else if let Some(pos) = session.queue.iter().position(|m| m.seq == seq) {
                let d = session.queue.remove(pos).map(|m| m.delivery);
                if let Some(d) = &d {
                    session.queued_bytes = session.queued_bytes.saturating_sub(d.message.weight());
                }
                d
            } else {
                None
            };
            let Some(mut delivery) = delivery else {
                continue;
            };
            if session.is_persistent() {
                let key = Key::Queued {
                    client_id: session.client_id.to_string(),
                    seq,
                };
                self.persist(key.encode(), None);
            }
            delivery.qos = delivery.message.qos.min(sub.options.qos);
            delivery.subscription_ids = sub.subscription_id.into_iter().collect();
            self.deliver(other, delivery);
        }
    }
}

/// The PUBLISH a delivery becomes for one subscriber (before topic aliasing).
fn outgoing(
    delivery: &Delivery,
    v5: bool,
    now: super::Timestamp,
    packet_id: Option<u16>,
    dup: bool,
) -> OutgoingPublish<'_> {
    let msg = &delivery.message;
    OutgoingPublish {
        dup,
        qos: delivery.qos,
        retain: delivery.retain,
        topic: &msg.topic,
        packet_id,
        payload: &msg.payload,
        properties: &msg.properties,
        topic_alias: None,
        message_expiry_interval: msg.remaining_expiry_secs(now).map(|s| s.max(1)),
        subscription_identifiers: if v5 {
            delivery.subscription_ids.as_slice()
        } else {
            &[]
        },
    }
}

/// Whether the PUBLISH fits the client's Maximum Packet Size, leaving room for a topic alias
/// property when aliases are in use (an alias never makes the packet larger than that).
fn fits(out: &OutgoingPublish<'_>, conn: &super::connection::Connection) -> bool {
    let alias_room = if conn.outbound_aliases.maximum > 0 {
        3
    } else {
        0
    };
    codec::publish_len(out, conn.protocol)
        .is_ok_and(|len| len + alias_room <= conn.client_max_packet as usize)
}
