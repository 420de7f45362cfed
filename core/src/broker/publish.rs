//! PUBLISH in both directions: inbound validation, retained store, routing to sessions,
//! the outgoing in-flight window and queue, and the QoS 1/2 acknowledgement flows.

use std::sync::Arc;

use super::cluster::Moving;
use super::io::ConnId;
use super::message::{Delivery, Message};
use super::persist::{self, Key};
use super::session::{Inflight, InflightState, Queued, SessionId};
use super::subscriptions::Readiness;
use super::{Authenticator, Authorizer, Broker, ClientRef};
use crate::codec::{self, Ack, OutgoingPublish, Packet, ProtocolVersion, Publish, QoS, ReasonCode};
use crate::topic::{TopicFilter, TopicName};

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
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
            } else if conn.inbound_aliases.set(alias, &p.topic) {
                self.persist_topic_alias(conn_id, alias, &p.topic);
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
            if session.incoming_qos2.contains(packet_id) {
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

        if !p.properties.subscription_identifiers.is_empty() {
            return self.protocol_violation(
                conn_id,
                ReasonCode::PROTOCOL_ERROR,
                "a client PUBLISH cannot carry a subscription identifier",
            );
        }
        if p.properties
            .response_topic
            .as_deref()
            .is_some_and(|t| t.contains(['+', '#']))
        {
            return self.protocol_violation(
                conn_id,
                ReasonCode::PROTOCOL_ERROR,
                "response topic contains wildcards",
            );
        }
        let mut reason = self.check_publish(sid, &p);
        let weight = p.payload.len() + p.topic.len();
        // The broker holds as much as it may, or a node that wants the message has a full
        // outbox: refuse rather than lose it.
        // A retained delete frees what it touches: never refused for the budget.
        let frees = p.retain && p.payload.is_empty();
        if reason.is_none() && v5 && p.qos != QoS::AtMostOnce {
            if !frees && self.over_budget(weight) {
                self.stats.dropped_memory_full += 1;
                reason = Some(ReasonCode::QUOTA_EXCEEDED);
            } else if self.outbox_full_for(&p.topic, weight) {
                reason = Some(ReasonCode::QUOTA_EXCEEDED);
            }
        }
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
                properties: p.properties.into(),
                expires_at: None,
                origin: Some(sid),
            };
            // Route first: the subscribers' records must exist before the marker that makes a
            // re-sent PUBLISH count as already delivered.
            self.publish_message(message);
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
        if TopicName::check(&p.topic, &self.topic_limits).is_err() {
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
        if self.sys_reserved(&p.topic) || !self.authorizer.may_publish(&client, &p.topic) {
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
        message.properties.strip_per_delivery();
        if message.retain {
            // A retained message outlives the packet it came in.
            message.detach();
        }
        let message = Arc::new(message);
        // What this node does not store (its retained bounds), it does not offer to others.
        if message.retain && self.store_retained(&message) {
            self.replicate_retained(&message);
        }
        // A retained message holds its own bytes already.
        let detached = message.retain.then(|| message.clone());
        self.begin_local_routing();
        let n = self.route(&message, detached, false);
        self.forward(&message);
        self.end_routing();
        n
    }

    /// A message forwarded by another node: to local subscribers only. Under `$SYS`, while
    /// this node publishes its own figures there, it is dropped.
    pub(super) fn deliver_local(&mut self, mut message: Message) -> usize {
        if self.sys_reserved(&message.topic) {
            return 0;
        }
        message.properties.strip_per_delivery();
        self.route(&Arc::new(message), None, false)
    }

    /// Store (or, with an empty payload, delete) a retained message; false if a bound kept it
    /// out (counted).
    pub(super) fn store_retained(&mut self, message: &Arc<Message>) -> bool {
        let key = Key::Retained {
            topic: message.topic.to_string(),
        }
        .encode();
        if message.payload.is_empty() {
            if let Some(old) = self.retained.remove(&message.topic) {
                self.retained_bytes -= old.weight();
                self.forget_retained_expiry(&old);
                self.persist(key, None);
            }
            return true;
        }
        let old_weight = self.retained.get(&message.topic).map(|m| m.weight());
        if old_weight.is_none() && self.retained.len() >= self.config.max_retained_messages {
            self.stats.dropped_retained_full += 1;
            return false;
        }
        let more = message.weight().saturating_sub(old_weight.unwrap_or(0));
        if more > 0 && self.over_budget(more) {
            self.stats.dropped_memory_full += 1;
            return false;
        }
        self.retained_bytes += message.weight();
        if let Some(old) = self.retained.insert(&message.topic, message.clone()) {
            self.retained_bytes -= old.weight();
            self.forget_retained_expiry(&old);
        }
        self.arm_retained_expiry(message);
        self.persist(key, Some(persist::encode_retained(message)));
        true
    }

    /// Remember when a retained message expires, so that it leaves memory and storage then.
    pub(super) fn arm_retained_expiry(&mut self, message: &Arc<Message>) {
        if let Some(at) = message.expires_at {
            self.retained_expiry.insert((at, message.topic.clone()));
            self.rearm_retained_timer();
        }
    }

    fn forget_retained_expiry(&mut self, old: &Arc<Message>) {
        if let Some(at) = old.expires_at {
            self.retained_expiry.remove(&(at, old.topic.clone()));
            self.rearm_retained_timer();
        }
    }

    /// One timer, at the earliest retained expiry.
    pub(super) fn rearm_retained_timer(&mut self) {
        let next = self.retained_expiry.first().map(|(at, _)| *at);
        if next != self.retained_timer {
            if let Some(at) = self.retained_timer {
                self.timers.remove(&(at, super::Timer::RetainedExpiry));
            }
            if let Some(at) = next {
                self.timers.insert((at, super::Timer::RetainedExpiry));
            }
            self.retained_timer = next;
        }
    }

    /// Deliver to every matching local session. `detached`: the message, if it holds its own
    /// bytes already (see [`Broker::deliver`]). With `ready_only`, sessions that could not
    /// take it now (offline, or congested) are passed over without a word.
    pub(super) fn route(
        &mut self,
        message: &Arc<Message>,
        mut detached: Option<Arc<Message>>,
        ready_only: bool,
    ) -> usize {
        let mut recipients = std::mem::take(&mut self.scratch);
        let withheld = std::cell::Cell::new(0);
        self.subs.recipients(
            &message.topic,
            message.origin,
            |sid| self.readiness(sid),
            |sid| {
                let ok = self.may_receive(sid, &message.topic);
                withheld.set(withheld.get() + u64::from(!ok));
                ok
            },
            &mut recipients,
        );
        self.stats.withheld_not_authorized += withheld.get();
        if ready_only {
            recipients.retain(|r| self.readiness(r.session) == Readiness::Ready);
        }
        let n = recipients.len();
        for r in recipients.drain(..) {
            let delivery = Delivery::new(
                message.clone(),
                message.qos.min(r.qos),
                message.retain && r.retain_as_published,
                r.subscription_ids,
                r.shared,
            );
            self.deliver(r.session, delivery, &mut detached);
        }
        self.scratch = recipients;
        n
    }

    /// Whether the authorizer lets a message on `topic` go to the session (asked for its
    /// filtered subscriptions only).
    pub(super) fn may_receive(&self, sid: SessionId, topic: &str) -> bool {
        self.session(sid).is_some_and(|s| {
            let client = ClientRef {
                client_id: &s.client_id,
                username: s.username.as_deref(),
            };
            self.authorizer.may_receive(&client, topic)
        })
    }

    /// Whether a session can take a message now.
    fn readiness(&self, sid: SessionId) -> Readiness {
        let conn = self.session(sid).and_then(|s| s.conn);
        match conn.and_then(|c| self.conns.get(&c)) {
            None => Readiness::Offline,
            Some(c) if c.congested => Readiness::Congested,
            Some(_) => Readiness::Ready,
        }
    }

    /// Hand one message to one session: send it now, or queue it. A queued message may wait
    /// long, so it holds bytes of its own ([`Message::detach`]): `detached` is the delivery's
    /// message so detached, made by the first session that queues it and shared by the others
    /// (pass the message itself if it holds its own bytes already).
    pub(super) fn deliver(
        &mut self,
        sid: SessionId,
        delivery: Delivery,
        detached: &mut Option<Arc<Message>>,
    ) {
        let (id, held) = match self.moving_delivery(sid, &delivery) {
            Moving::Deliver => (self.routing_id(), false),
            Moving::Handled => return,
            Moving::Hold(id) => (Some(id), true),
        };
        self.hand_to_session(sid, delivery, detached, id, held);
    }

    /// [`Broker::deliver`] once the moves of sessions had their say: `id`, the message's
    /// identity in the deployment if a cluster routed it; `held`, whether it is to be held
    /// back for its origin's order (with its identity).
    pub(super) fn hand_to_session(
        &mut self,
        sid: SessionId,
        mut delivery: Delivery,
        detached: &mut Option<Arc<Message>>,
        id: Option<crate::link::MessageId>,
        held: bool,
    ) {
        if delivery.qos != QoS::AtMostOnce && self.over_budget(delivery.message.weight()) {
            // It would be held (queued, or in flight until acknowledged).
            self.stats.dropped_memory_full += 1;
            return;
        }
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
            && !held
            && !self.transfer_blocks(sid, delivery.qos)
            && session.queue.is_empty()
            && session.inflight.has_room(
                window,
                delivery.message.weight(),
                self.config.max_inflight_bytes,
            )
            && session.inflight.first_unsent().is_none()
        {
            let seq = self.session_mut(sid).map_or(0, |s| s.take_seq());
            self.send_inflight(sid, conn, delivery, seq, false);
            return;
        }
        let weight = delivery.message.weight();
        let full = |s: &super::session::Session, c: &super::Config| {
            s.queue.len() >= c.max_queued_messages || s.queue.bytes() + weight > c.max_queued_bytes
        };
        if full(session, &self.config) {
            // Expired messages make room first; they must not be delivered anyway.
            self.purge_expired_queue(sid);
            let Some(session) = self.session(sid) else {
                return;
            };
            if full(session, &self.config) {
                self.stats.dropped_queue_full += 1;
                return;
            }
        }
        delivery.message = detached
            .get_or_insert_with(|| Arc::new(delivery.message.detached()))
            .clone();
        let id = id.map(Box::new);
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        let seq = session.take_seq();
        if session.is_persistent() {
            session.persisted = true;
            let key = Key::Queued {
                client_id: session.client_id.to_string(),
                seq,
            };
            let value = persist::encode_queued_with(None, &delivery, id.as_deref(), held);
            session.queue.enqueue(held, Queued { delivery, seq, id });
            self.persist(key.encode(), Some(value));
        } else {
            session.queue.enqueue(held, Queued { delivery, seq, id });
        }
    }

    /// Drop expired messages from a session's queue, with their records.
    fn purge_expired_queue(&mut self, sid: SessionId) {
        let now = self.now;
        self.touch(sid);
        let Some(session) = self.sessions.get_mut(sid as usize).and_then(Option::as_mut) else {
            return;
        };
        let mut expired = Vec::new();
        session.queue.retain(|q| {
            let keep = !q.delivery.message.is_expired(now);
            if !keep {
                expired.push(q.seq);
            }
            keep
        });
        let client_id = session.client_id.to_string();
        let persistent = session.is_persistent();
        self.stats.dropped_expired += expired.len() as u64;
        if persistent {
            for seq in expired {
                let key = Key::Queued {
                    client_id: client_id.clone(),
                    seq,
                };
                self.persist(key.encode(), None);
            }
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
        let packet_id = session.inflight.allocate_packet_id();
        let persistent = session.is_persistent();
        let client_id = (persistent || stored).then(|| session.client_id.to_string());
        // A message too large for this client is dropped, as if delivered, and so is its record.
        // The record goes before the PUBLISH: once the client may have the message, a restart
        // must know its packet id, or a QoS 2 message could be delivered twice. So a persistent
        // session's delivery is measured first; any other is measured as it is written.
        if persistent && !self.fits_client(conn, &delivery, Some(packet_id)) {
            self.stats.dropped_too_large += 1;
            if stored && let Some(client_id) = client_id {
                self.persist(Key::Queued { client_id, seq }.encode(), None);
            }
            return;
        }
        if persistent && let Some(client_id) = &client_id {
            let value =
                persist::encode_queued(Some((packet_id, InflightState::AwaitAck)), &delivery);
            let key = Key::Queued {
                client_id: client_id.clone(),
                seq,
            };
            self.persist(key.encode(), Some(value));
        }
        if !self.write_publish(conn, &delivery, Some(packet_id), false) {
            if let Some(client_id) = client_id {
                self.persist(Key::Queued { client_id, seq }.encode(), None);
            }
            return;
        }
        if let Some(session) = self.session_mut(sid) {
            session.persisted |= persistent;
            session.inflight.push(Inflight {
                packet_id,
                state: InflightState::AwaitAck,
                delivery,
                seq,
                sent: true,
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
        if conn.congested && delivery.qos == QoS::AtMostOnce {
            self.stats.dropped_qos0_congested += 1;
            return false;
        }
        let msg = &delivery.message;
        let v5 = conn.protocol == ProtocolVersion::V5;
        let max = conn.client_max_packet as usize;
        let protocol = conn.protocol;
        let within =
            |o: &OutgoingPublish<'_>| codec::publish_len(o, protocol).is_ok_and(|l| l <= max);
        let mut out = outgoing(delivery, v5, now, packet_id, dup);
        if v5 && conn.outbound_aliases.maximum > 0 {
            if let Some(alias) = conn.outbound_aliases.known(&msg.topic) {
                out.topic = "";
                out.topic_alias = Some(alias);
            } else {
                // A new alias adds its property; take one only if the packet still fits.
                let mut aliased = out;
                aliased.topic_alias = Some(1);
                if within(&aliased) {
                    out.topic_alias = Some(conn.outbound_aliases.assign(&msg.topic));
                }
            }
        }
        if !within(&out) {
            self.stats.dropped_too_large += 1;
            return false;
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

    /// Fill the client's window: first re-send in-flight messages not yet sent on this
    /// connection (after a reconnect: PUBLISH with DUP, or PUBREL), then queued messages.
    pub(super) fn pump(&mut self, sid: SessionId) {
        loop {
            let Some(session) = self.session(sid) else {
                return;
            };
            let Some(conn) = session.conn else { return };
            if self.transfer_blocks(sid, QoS::AtLeastOnce) {
                // The session's messages in flight are on their way from another node.
                return;
            }
            let window = self
                .conns
                .get(&conn)
                .map_or(0, |c| usize::from(c.send_window));
            if let Some(pos) = session.inflight.first_unsent() {
                if session.inflight.sent() >= window {
                    return;
                }
                self.resend_inflight(sid, conn, pos);
                continue;
            }
            let Some((weight, qos)) = session
                .queue
                .front()
                .map(|q| (q.delivery.message.weight(), q.delivery.qos))
            else {
                return;
            };
            if !session
                .inflight
                .has_room(window, weight, self.config.max_inflight_bytes)
                || self.transfer_blocks(sid, qos)
            {
                return;
            }
            let now = self.now;
            self.touch(sid);
            let Some(session) = self.sessions.get_mut(sid as usize).and_then(Option::as_mut) else {
                return;
            };
            let Some(Queued { delivery, seq, .. }) = session.queue.pop_front() else {
                return;
            };
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

    /// Re-send one in-flight entry on a new connection, with its packet id: PUBLISH with DUP
    /// (or, once PUBREC'd, PUBREL). A PUBLISH now too large for the client is dropped.
    fn resend_inflight(&mut self, sid: SessionId, conn: ConnId, pos: usize) {
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        let entry = session.inflight.mark_sent(pos);
        let (packet_id, state, delivery) = (entry.packet_id, entry.state, entry.delivery.clone());
        match state {
            InflightState::AwaitComp => self.send(conn, &Packet::PubRel(Ack::new(packet_id))),
            InflightState::AwaitAck => {
                if !self.write_publish(conn, &delivery, Some(packet_id), true) {
                    self.drop_inflight(sid, pos);
                }
            }
        }
    }

    /// Remove an in-flight entry and its record.
    fn drop_inflight(&mut self, sid: SessionId, pos: usize) {
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
    }

    /// Remove a finished in-flight message and its record, then refill the window.
    fn complete_inflight(&mut self, sid: SessionId, pos: usize) {
        self.drop_inflight(sid, pos);
        self.pump(sid);
    }

    pub(super) fn on_puback(&mut self, sid: SessionId, ack: Ack) {
        let Some(session) = self.session(sid) else {
            return;
        };
        if let Some(pos) = session.inflight.position(ack.packet_id) {
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
        let Some(pos) = session.inflight.position(ack.packet_id) else {
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
            session.inflight.set_state(pos, InflightState::AwaitComp);
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
        if let Some(pos) = session.inflight.position(ack.packet_id)
            && session.inflight[pos].state == InflightState::AwaitComp
        {
            self.complete_inflight(sid, pos);
        }
    }

    /// PUBREL for an incoming QoS 2 message: forget its packet id, answer PUBCOMP.
    pub(super) fn on_pubrel(&mut self, conn_id: ConnId, sid: SessionId, ack: Ack) {
        let awaiting = self.awaits_transfer(sid);
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        let mut comp = Ack::new(ack.packet_id);
        if session.incoming_qos2.remove(ack.packet_id) {
            if session.is_persistent() {
                let key = Key::Incoming {
                    client_id: session.client_id.to_string(),
                    packet_id: ack.packet_id,
                };
                self.persist(key.encode(), None);
            }
        } else if awaiting {
            // Received by the node the session comes from: released now, for good.
            self.released_before_transfer(sid, ack.packet_id);
        } else if session.protocol == ProtocolVersion::V5 {
            comp.reason = ReasonCode::PACKET_IDENTIFIER_NOT_FOUND;
        }
        self.send(conn_id, &Packet::PubComp(comp));
    }

    /// A session lost its connection (or ends): its unacknowledged messages that came through
    /// shared subscriptions go to another connected member of the same group. Messages already
    /// PUBREC'd stay (the client has them), and so does everything when no other member is
    /// connected (it is re-sent on reconnect, with its packet id).
    pub(super) fn hand_over_shared(&mut self, sid: SessionId, session_ends: bool) {
        let Some(session) = self.session(sid) else {
            return;
        };
        // A QoS 2 message once sent must be completed with the same client (MQTT-4.8.2-5):
        // only QoS 1 in flight and messages never sent may move.
        let candidates: Vec<(u64, Arc<str>, Arc<str>)> = session
            .inflight
            .iter()
            .filter(|m| m.state == InflightState::AwaitAck && m.delivery.qos == QoS::AtLeastOnce)
            .map(|m| (m.seq, &m.delivery))
            .chain(session.queue.iter().map(|m| (m.seq, &m.delivery)))
            .filter_map(|(seq, d)| Some((seq, d.shared()?.clone(), d.message.topic.clone())))
            .collect();
        for (seq, filter, topic) in candidates {
            let Ok(filter) = TopicFilter::new(&*filter) else {
                continue;
            };
            // While the session lives on, only a connected member is worth moving to; when
            // it ends, any member (an offline one queues the message) beats losing it.
            let target = self.subs.other_shared_member(
                &filter,
                sid,
                |s| {
                    self.session(s)
                        .is_some_and(|x| session_ends || x.conn.is_some())
                },
                |s| self.may_receive(s, &topic),
            );
            let Some((other, sub)) = target else { continue };
            let Some(session) = self.session_mut(sid) else {
                return;
            };
            let in_flight = session.inflight.iter().position(|m| m.seq == seq);
            let from_queue = in_flight.is_none();
            let delivery = match in_flight {
                Some(pos) => session.inflight.remove(pos).map(|m| m.delivery),
                None => session.queue.remove_seq(seq).map(|m| m.delivery),
            };
            let Some(mut delivery) = delivery else {
                continue;
            };
            let old_key = session.is_persistent().then(|| Key::Queued {
                client_id: session.client_id.to_string(),
                seq,
            });
            delivery.qos = delivery.message.qos.min(sub.options.qos);
            delivery.retain = delivery.message.retain && sub.options.retain_as_published;
            delivery.set_subscription_ids(sub.subscription_id.into_iter().collect());
            // The new member's record is written before the old one is deleted.
            // A queued message holds its own bytes already.
            let mut detached = from_queue.then(|| delivery.message.clone());
            self.deliver(other, delivery, &mut detached);
            if let Some(key) = old_key {
                self.persist(key.encode(), None);
            }
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
        subscription_identifiers: if v5 { delivery.subscription_ids() } else { &[] },
    }
}

/// Whether the PUBLISH can be sent within the client's Maximum Packet Size: as it is, or with
/// an empty topic and an alias the client already knows.
fn fits(out: &OutgoingPublish<'_>, conn: &super::connection::Connection) -> bool {
    let max = conn.client_max_packet as usize;
    let within =
        |o: &OutgoingPublish<'_>| codec::publish_len(o, conn.protocol).is_ok_and(|l| l <= max);
    if within(out) {
        return true;
    }
    match conn.outbound_aliases.known(out.topic) {
        Some(alias) if conn.protocol == ProtocolVersion::V5 => {
            let mut aliased = *out;
            aliased.topic = "";
            aliased.topic_alias = Some(alias);
            within(&aliased)
        }
        _ => false,
    }
}
