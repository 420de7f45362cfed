//! CONNECT, AUTH and DISCONNECT: authentication, takeover, session start and end, wills.

use bytes::Bytes;

use super::client_id::ClientId;
use super::connection::{ConnState, OutboundAliases};
use super::io::{ConnId, DisconnectCause, Event};
use super::message::Message;
use super::persist::{Key, SessionRecord};
use super::session::{Session, SessionId, Will};
use super::{AuthOutcome, AuthRequest, Authenticator, Authorizer, Broker, ClientRef, Timer};
use crate::codec::{
    Auth, AuthProperties, ConnAck, ConnAckProperties, Connect, Disconnect, LastWill, Packet,
    ProtocolVersion, QoS, ReasonCode,
};
use crate::topic::TopicName;

/// A pinned client's CONNECT that its home region granted ([`Broker::complete_connect`]).
pub(super) struct HomeGranted {
    /// The claim proof its request carried ([`crate::link::Claim::proof`]).
    pub proof: Option<bytes::Bytes>,
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    pub(super) fn on_connect(&mut self, conn_id: ConnId, mut connect: Connect) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        conn.protocol = connect.protocol;
        let v5 = connect.protocol == ProtocolVersion::V5;
        let client_id = connect.client_id.clone();

        let mut assigned = false;
        if connect.client_id.is_empty() {
            if !v5 && !connect.clean_start {
                return self.refuse(conn_id, None, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
            }
            connect.client_id = self.assign_client_id();
            assigned = true;
        }
        if connect.client_id.len() > self.config.max_client_id_len
            || ClientId::new(&connect.client_id).is_err()
        {
            return self.refuse(
                conn_id,
                Some(client_id),
                ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
            );
        }
        if let Some(will) = &connect.will {
            if TopicName::check(&will.topic, &self.topic_limits).is_err() {
                return self.refuse(conn_id, Some(client_id), ReasonCode::TOPIC_NAME_INVALID);
            }
            if will.qos > self.config.maximum_qos {
                return self.refuse(conn_id, Some(client_id), ReasonCode::QOS_NOT_SUPPORTED);
            }
            if will.retain && !self.config.retain_available {
                return self.refuse(conn_id, Some(client_id), ReasonCode::RETAIN_NOT_SUPPORTED);
            }
        }

        let outcome = {
            let conn = &self.conns[&conn_id];
            self.authenticator.authenticate(&AuthRequest {
                conn: conn_id,
                client_id: &connect.client_id,
                username: connect.username.as_deref(),
                password: connect.password.as_deref(),
                method: connect.properties.authentication_method.as_deref(),
                data: connect.properties.authentication_data.as_deref(),
                tls_identity: conn.info.tls_identity.as_deref(),
                remote_addr: conn.info.remote_addr.as_deref(),
                continuation: false,
                reauthentication: false,
            })
        };
        self.apply_auth_outcome(conn_id, Box::new(connect), assigned, outcome);
    }

    /// What the authenticator said about a CONNECT (whose authentication method, if any, is
    /// the one in use).
    fn apply_auth_outcome(
        &mut self,
        conn_id: ConnId,
        connect: Box<Connect>,
        assigned: bool,
        outcome: AuthOutcome,
    ) {
        match outcome {
            AuthOutcome::Allow { username } => {
                self.complete_connect(conn_id, *connect, assigned, username, None)
            }
            AuthOutcome::Deny(reason) => {
                self.refuse(conn_id, Some(connect.client_id.clone()), reason)
            }
            AuthOutcome::Continue(data) => {
                let method = connect.properties.authentication_method.clone();
                if method.is_none() || connect.protocol != ProtocolVersion::V5 {
                    return self.refuse(
                        conn_id,
                        Some(connect.client_id.clone()),
                        ReasonCode::BAD_AUTHENTICATION_METHOD,
                    );
                }
                self.send(
                    conn_id,
                    &auth_packet(ReasonCode::CONTINUE_AUTHENTICATION, method, Some(data)),
                );
                self.set_authenticating(conn_id, connect, assigned);
            }
            AuthOutcome::Pending => self.set_authenticating(conn_id, connect, assigned),
        }
    }

    fn set_authenticating(&mut self, conn_id: ConnId, connect: Box<Connect>, assigned: bool) {
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            conn.state = ConnState::Authenticating { connect, assigned };
        }
    }

    /// An AUTH packet: the next step of enhanced authentication, or re-authentication.
    pub(super) fn on_auth(&mut self, conn_id: ConnId, auth: Auth) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let reauth = matches!(conn.state, ConnState::Connected { .. });
        let expected = match &conn.state {
            ConnState::Authenticating { connect, .. } => {
                connect.properties.authentication_method.clone()
            }
            ConnState::Connected { .. } => conn.auth_method.as_deref().map(str::to_owned),
            _ => None,
        };
        let ok_reason = if reauth {
            auth.reason == ReasonCode::RE_AUTHENTICATE
                || auth.reason == ReasonCode::CONTINUE_AUTHENTICATION
        } else {
            auth.reason == ReasonCode::CONTINUE_AUTHENTICATION
        };
        if expected.is_none() || auth.properties.authentication_method != expected || !ok_reason {
            return self.protocol_violation(
                conn_id,
                ReasonCode::PROTOCOL_ERROR,
                "AUTH does not fit the authentication in progress",
            );
        }
        let (client_id, username) = match &conn.state {
            ConnState::Authenticating { connect, .. } => {
                (connect.client_id.clone(), connect.username.clone())
            }
            ConnState::Connected { session } => {
                let s = self.session(*session);
                (
                    s.map(|s| s.client_id.to_string()).unwrap_or_default(),
                    s.and_then(|s| s.username.as_deref().map(str::to_owned)),
                )
            }
            _ => return,
        };
        let outcome = self.authenticator.authenticate(&AuthRequest {
            conn: conn_id,
            client_id: &client_id,
            username: username.as_deref(),
            password: None,
            method: expected.as_deref(),
            data: auth.properties.authentication_data.as_deref(),
            tls_identity: conn.info.tls_identity.as_deref(),
            remote_addr: conn.info.remote_addr.as_deref(),
            // AUTH 0x19 starts a new exchange; AUTH 0x18 continues one.
            continuation: auth.reason == ReasonCode::CONTINUE_AUTHENTICATION,
            reauthentication: reauth,
        });
        self.on_auth_decision(conn_id, outcome);
    }

    /// The authenticator's (possibly late) answer for a connection waiting on it.
    pub(super) fn on_auth_decision(&mut self, conn_id: ConnId, outcome: AuthOutcome) {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        match &conn.state {
            ConnState::Authenticating { .. } => {
                let ConnState::Authenticating { connect, assigned } =
                    std::mem::replace(&mut conn.state, ConnState::AwaitConnect)
                else {
                    return;
                };
                self.apply_auth_outcome(conn_id, connect, assigned, outcome);
                // Packets the client pipelined after CONNECT were held back: handle them now.
                self.on_bytes(conn_id, &[]);
            }
            ConnState::Connected { session } => {
                let session = *session;
                let method = conn.auth_method.as_deref().map(str::to_owned);
                match outcome {
                    AuthOutcome::Allow { username } => {
                        if let Some(name) = username
                            && let Some(s) = self.session_mut(session)
                        {
                            let changed = s.username.as_deref() != Some(name.as_str());
                            s.username = Some(name.into());
                            self.persist_session_meta(session);
                            if changed {
                                self.reclassify_subscriptions(session);
                            }
                        }
                        self.send(conn_id, &auth_packet(ReasonCode::SUCCESS, method, None));
                    }
                    AuthOutcome::Continue(data) => self.send(
                        conn_id,
                        &auth_packet(ReasonCode::CONTINUE_AUTHENTICATION, method, Some(data)),
                    ),
                    AuthOutcome::Deny(reason) => {
                        self.close_conn(conn_id, DisconnectCause::ByServer(reason))
                    }
                    AuthOutcome::Pending => {}
                }
            }
            _ => {}
        }
    }

    /// Refuse a CONNECT: CONNACK with the reason (3.1.1: the nearest return code), then close.
    pub(super) fn refuse(
        &mut self,
        conn_id: ConnId,
        client_id: Option<String>,
        reason: ReasonCode,
    ) {
        self.stats.connects_refused += 1;
        let reason = super::connack_reason(reason);
        self.send(
            conn_id,
            &Packet::ConnAck(ConnAck {
                session_present: false,
                reason,
                properties: ConnAckProperties::default(),
            }),
        );
        self.event(Event::ConnectRefused {
            conn: conn_id,
            client_id,
            reason,
        });
        self.finish_close(conn_id);
    }

    fn assign_client_id(&mut self) -> String {
        loop {
            let n = self.random();
            let id = format!("{}{n:016x}", self.config.assigned_client_id_prefix);
            if !self.by_client_id.contains_key(id.as_str()) {
                return id;
            }
        }
    }

    /// A CONNECT the authenticator accepted. `home`: its home region granted it already (a
    /// client id pinned to one waits for that first), with the claim proof its request
    /// carried.
    pub(super) fn complete_connect(
        &mut self,
        conn_id: ConnId,
        connect: Connect,
        assigned: bool,
        username: Option<String>,
        home: Option<HomeGranted>,
    ) {
        let username = username.or_else(|| connect.username.clone());
        let v5 = connect.protocol == ProtocolVersion::V5;
        if let Some(will) = &connect.will {
            let client = ClientRef {
                client_id: &connect.client_id,
                username: username.as_deref(),
            };
            if self.sys_reserved(&will.topic) || !self.authorizer.may_publish(&client, &will.topic)
            {
                return self.refuse(conn_id, Some(connect.client_id), ReasonCode::NOT_AUTHORIZED);
            }
        }

        // A session belongs to the user that made it: another user may neither take it over
        // (closing its connection, firing its will) nor resume it, nor start afresh in its
        // place, while it lasts.
        let other_user = self
            .by_client_id
            .get(connect.client_id.as_str())
            .and_then(|&s| self.session(s))
            .is_some_and(|s| s.username.as_deref() != username.as_deref());
        if other_user || self.claim_refuses(&connect.client_id, username.as_deref()) {
            return self.refuse(conn_id, Some(connect.client_id), ReasonCode::NOT_AUTHORIZED);
        }
        // A client id pinned to a home region: its grant first (CONNACK comes with it).
        if home.is_none()
            && let Some(region) = self.home_region_of(&connect.client_id)
        {
            return self.wait_for_home(conn_id, connect, assigned, username, &region);
        }
        // Takeover: the old connection goes (its will follows the usual rules).
        if let Some(old) = self
            .by_client_id
            .get(connect.client_id.as_str())
            .and_then(|&s| self.session(s)?.conn)
        {
            self.close_conn(
                old,
                DisconnectCause::ByServer(ReasonCode::SESSION_TAKEN_OVER),
            );
        }
        let Ok(id) = ClientId::new(&connect.client_id) else {
            // Checked as the CONNECT came.
            return self.refuse(
                conn_id,
                Some(connect.client_id),
                ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
            );
        };
        let existing = self.by_client_id.get(connect.client_id.as_str()).copied();
        if existing.is_none() && self.by_client_id.len() >= self.config.max_sessions {
            return self.refuse(conn_id, Some(connect.client_id), ReasonCode::QUOTA_EXCEEDED);
        }
        // A session this client left on another node: it is shipped here (cluster mode).
        let elsewhere = (!connect.clean_start)
            .then(|| self.session_elsewhere(&connect.client_id, username.as_deref()))
            .flatten();
        let (sid, session_present) = match existing {
            Some(sid) if !connect.clean_start => (sid, true),
            None if elsewhere.is_some() => (self.new_session(id, connect.protocol), true),
            Some(sid) => {
                self.end_session(sid);
                (self.new_session(id, connect.protocol), false)
            }
            None => (self.new_session(id, connect.protocol), false),
        };

        let requested_expiry = if v5 {
            connect.properties.session_expiry_interval.unwrap_or(0)
        } else if connect.clean_start {
            0
        } else {
            self.config.v3_session_expiry_secs
        };
        let expiry = requested_expiry.min(self.config.max_session_expiry_secs);
        // MQTT 3.1.1 cannot tell a client to use another keep alive, so only 5.0 clients get
        // the server's maximum imposed (and announced as Server Keep Alive).
        let mut keep_alive = connect.keep_alive;
        let max_ka = self.config.max_keep_alive_secs;
        let server_keep_alive = (v5 && max_ka > 0 && (keep_alive == 0 || keep_alive > max_ka))
            .then(|| {
                keep_alive = max_ka;
                max_ka
            });

        self.cancel_session_timers(sid);
        let generation = self.next_generation();
        let had_records;
        {
            let will = connect.will.as_ref().map(|w| Box::new(will_from(w)));
            // new_session / existing ids are live slots.
            let session = self.session_mut(sid).expect("session slot just looked up");
            had_records = session.persisted;
            session.conn = Some(conn_id);
            session.protocol = connect.protocol;
            session.username = username.as_deref().map(Box::from);
            session.expiry_secs = expiry;
            session.disconnected_at = None;
            session.generation = generation;
            session.pending_will = None;
            session.will = will;
        }
        if had_records && expiry == 0 {
            self.unpersist_session(sid);
        }
        // Asked once: a pinned client's request took it already.
        let proof = match home {
            Some(granted) => granted.proof,
            None => self.authenticator.claim_proof(conn_id, &connect.client_id),
        };
        self.claim_client(
            proof,
            &connect.client_id,
            username.as_deref(),
            !connect.clean_start,
            expiry > 0,
        );
        if let Some(holder) = elsewhere {
            self.await_transfer(sid, holder);
        }
        if expiry > 0 {
            // Stored record by record from now on.
            self.drop_checkpoint(sid);
        }
        self.persist_session_meta(sid);

        let props = &connect.properties;
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        conn.state = ConnState::Connected { session: sid };
        conn.keep_alive_secs = keep_alive;
        conn.send_window = props
            .receive_maximum
            .unwrap_or(u16::MAX)
            .min(self.config.max_inflight)
            .max(1);
        conn.client_max_packet = props.maximum_packet_size.unwrap_or(u32::MAX);
        conn.outbound_aliases = OutboundAliases::with_maximum(
            props
                .topic_alias_maximum
                .unwrap_or(0)
                .min(self.config.outbound_topic_alias_maximum),
        );
        conn.problem_information = props.request_problem_information.unwrap_or(true);
        conn.auth_method = props.authentication_method.as_deref().map(Box::from);
        conn.expiry_requested_zero = requested_expiry == 0;
        self.persist_connection(conn_id);
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let max_packet_size = conn
            .info
            .max_packet_size
            .map_or(self.config.max_packet_size, |m| {
                m.min(self.config.max_packet_size)
            });

        let c = &self.config;
        let properties = if v5 {
            ConnAckProperties {
                session_expiry_interval: (expiry != requested_expiry).then_some(expiry),
                receive_maximum: Some(c.receive_maximum),
                maximum_qos: (c.maximum_qos != QoS::ExactlyOnce).then_some(c.maximum_qos),
                retain_available: (!c.retain_available).then_some(false),
                maximum_packet_size: Some(max_packet_size),
                assigned_client_identifier: assigned.then(|| connect.client_id.clone()),
                topic_alias_maximum: (c.topic_alias_maximum > 0).then_some(c.topic_alias_maximum),
                wildcard_subscription_available: (!c.wildcard_subscription_available)
                    .then_some(false),
                subscription_identifiers_available: (!c.subscription_identifiers_available)
                    .then_some(false),
                shared_subscription_available: (!c.shared_subscription_available).then_some(false),
                server_keep_alive,
                response_information: (props.request_response_information == Some(true))
                    .then(|| response_information(&c.response_topic_prefix, &connect.client_id)),
                authentication_method: props.authentication_method.clone(),
                ..ConnAckProperties::default()
            }
        } else {
            ConnAckProperties::default()
        };
        let connack = Packet::ConnAck(ConnAck {
            session_present,
            reason: ReasonCode::SUCCESS,
            properties,
        });
        if !self.try_send(conn_id, &connack) {
            // Even without its reason string, CONNACK exceeds the client's Maximum Packet
            // Size: the connection cannot be completed. No DISCONNECT either: nothing may
            // precede CONNACK.
            self.finish_close(conn_id);
            return self.session_disconnected(
                sid,
                conn_id,
                DisconnectCause::ByServer(ReasonCode::PACKET_TOO_LARGE),
            );
        }
        self.event(Event::ClientConnected {
            conn: conn_id,
            client_id: connect.client_id.clone(),
            username,
            protocol: connect.protocol,
            session_present,
        });
        if let Some(conn) = self.conns.get_mut(&conn_id) {
            self.timers
                .remove(&(conn.connect_deadline, Timer::ConnectTimeout(conn_id)));
            if let Some(deadline) = conn.keep_alive_deadline_from(self.now) {
                conn.keep_alive_timer = Some(deadline);
                self.timers.insert((deadline, Timer::KeepAlive(conn_id)));
            }
        }
        if session_present {
            self.resume(sid, conn_id);
        }
    }

    pub(super) fn new_session(
        &mut self,
        client_id: ClientId,
        protocol: ProtocolVersion,
    ) -> SessionId {
        let session = Session::new(client_id.clone(), protocol);
        let sid = match self.free_sessions.pop() {
            Some(sid) => {
                self.sessions[sid as usize] = Some(session);
                sid
            }
            None => {
                self.sessions.push(Some(session));
                // Sessions are bounded by connections, far below u32::MAX.
                u32::try_from(self.sessions.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.by_client_id.insert(client_id, sid);
        sid
    }

    /// A session resumed on a new connection: re-send what was in flight (PUBLISH with DUP,
    /// or PUBREL), in the original order, then whatever waits in the queue.
    /// `pump` re-sends in-flight entries (as the new Receive Maximum allows) before the queue.
    fn resume(&mut self, sid: SessionId, _conn_id: ConnId) {
        self.pump(sid);
    }

    /// Forget the expiry and will timers of the session's current generation.
    pub(super) fn cancel_session_timers(&mut self, sid: SessionId) {
        let Some(s) = self.session(sid) else { return };
        let generation = s.generation;
        let expiry = s.expires_at().map(|at| {
            (
                at,
                Timer::SessionExpiry {
                    session: sid,
                    generation,
                },
            )
        });
        let will = s.pending_will.as_ref().map(|(_, due)| {
            (
                *due,
                Timer::Will {
                    session: sid,
                    generation,
                },
            )
        });
        for timer in [expiry, will].into_iter().flatten() {
            self.timers.remove(&timer);
        }
    }

    pub(super) fn on_disconnect(&mut self, conn_id: ConnId, sid: SessionId, d: Disconnect) {
        if let Some(expiry) = d.properties.session_expiry_interval {
            let max_expiry = self.config.max_session_expiry_secs;
            let requested_zero = self
                .conns
                .get(&conn_id)
                .is_some_and(|c| c.expiry_requested_zero);
            let Some(session) = self.session_mut(sid) else {
                return;
            };
            if requested_zero && expiry != 0 {
                return self.protocol_violation(
                    conn_id,
                    ReasonCode::PROTOCOL_ERROR,
                    "DISCONNECT cannot give an expiry to a session that had none",
                );
            }
            session.expiry_secs = expiry.min(max_expiry);
            if expiry == 0 {
                self.unpersist_session(sid);
            }
        }
        self.close_conn(conn_id, DisconnectCause::ByClient(d.reason));
    }

    /// The session's connection ended: will, expiry, shared-subscription hand-over.
    pub(super) fn session_disconnected(
        &mut self,
        sid: SessionId,
        conn_id: ConnId,
        cause: DisconnectCause,
    ) {
        let now = self.now;
        let generation = self.next_generation();
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        if session.conn != Some(conn_id) {
            return;
        }
        session.conn = None;
        session.generation = generation;
        session.disconnected_at = Some(now);
        session.inflight.mark_all_unsent();
        if session.is_persistent() {
            session.inflight.detach_messages();
        }
        let client_id = session.client_id.to_string();
        let will = session.will.take().filter(|_| cause.publishes_will());
        let expiry = session.expiry_secs;
        self.event(Event::ClientDisconnected {
            conn: conn_id,
            client_id,
            cause,
        });

        let mut publish_will_now = None;
        if let Some(will) = will {
            if will.delay_secs == 0 || expiry == 0 {
                publish_will_now = Some(will.message);
            } else {
                let due = now.plus_secs(will.delay_secs);
                if let Some(s) = self.session_mut(sid) {
                    s.pending_will = Some((will, due));
                }
                self.timers.insert((
                    due,
                    Timer::Will {
                        session: sid,
                        generation,
                    },
                ));
            }
        }
        self.hand_over_shared(sid, false);
        if expiry == 0 {
            self.end_session(sid);
        } else {
            if let Some(at) = self.session(sid).and_then(Session::expires_at) {
                self.timers.insert((
                    at,
                    Timer::SessionExpiry {
                        session: sid,
                        generation,
                    },
                ));
            }
            self.persist_session_meta(sid);
        }
        if let Some(message) = publish_will_now {
            self.publish_message(message);
        }
    }

    pub(super) fn publish_pending_will(&mut self, sid: SessionId) {
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        if let Some((will, _)) = session.pending_will.take() {
            self.persist_session_meta(sid);
            self.publish_message(will.message);
        }
    }

    /// The session ends: subscriptions go, a pending will is published, records are deleted,
    /// and (cluster mode) its client id is let go.
    pub(super) fn end_session(&mut self, sid: SessionId) {
        self.hand_over_shared(sid, true);
        self.cancel_session_timers(sid);
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        let pending_will = session.pending_will.take();
        let Some(client_id) = self.discard_session(sid) else {
            return;
        };
        self.release_claim(&client_id);
        self.event(Event::SessionEnded {
            client_id: client_id.to_string(),
        });
        if let Some((will, _)) = pending_will {
            self.publish_message(will.message);
        }
    }

    /// Let go of a session here: its subscriptions, records and slot (its timers are the
    /// caller's). Returns its client id.
    pub(super) fn discard_session(&mut self, sid: SessionId) -> Option<ClientId> {
        let client_id = self.session(sid)?.client_id.clone();
        self.unpersist_session(sid);
        self.drop_checkpoint(sid);
        self.by_client_id.remove(&client_id);
        self.forget_transfer_wait(&client_id);
        self.moved_session_left(&client_id);
        self.free_slot(sid);
        Some(client_id)
    }

    /// Free a session's slot: its subscriptions go, and its bytes leave the count.
    pub(super) fn free_slot(&mut self, sid: SessionId) {
        let Some(session) = self.session(sid) else {
            return;
        };
        let filters: Vec<String> = session.subscriptions.keys().cloned().collect();
        for filter in filters {
            self.remove_subscription(sid, &filter);
        }
        // Its bytes leave the count (counted first, so that no changed session is left on
        // the list); a later session in the same slot starts from none.
        self.count_held();
        let Some(session) = self.sessions.get_mut(sid as usize).and_then(Option::take) else {
            return;
        };
        self.held -= session.accounted;
        self.free_sessions.push(sid);
    }

    /// A session shipped elsewhere leaves this node, but its slot keeps its subscriptions for
    /// a relay ([`super::cluster`]): its records and messages go (they travel in the
    /// transfer), and its client id is free here for a new session.
    pub(super) fn vacate_session(&mut self, sid: SessionId) -> Option<ClientId> {
        let client_id = self.session(sid)?.client_id.clone();
        self.unpersist_session(sid);
        self.drop_checkpoint(sid);
        self.by_client_id.remove(&client_id);
        self.forget_transfer_wait(&client_id);
        self.moved_session_left(&client_id);
        self.touch(sid);
        let session = self.session_mut(sid)?;
        session.inflight = Default::default();
        session.queue = Default::default();
        session.incoming_qos2 = Default::default();
        session.expiry_secs = 0;
        session.will = None;
        session.pending_will = None;
        Some(client_id)
    }

    // ----- persistence of session state -----

    pub(super) fn persist_session_meta(&mut self, sid: SessionId) {
        let Some(s) = self.session_mut(sid) else {
            return;
        };
        if !s.is_persistent() {
            return;
        }
        s.persisted = true;
        let s = &*s;
        let record = SessionRecord::of(s);
        let key = Key::Session {
            client_id: s.client_id.to_string(),
        }
        .encode();
        self.persist(key, Some(record.encode()));
    }

    /// Delete every record of a session (it ended, or stopped being persistent).
    pub(super) fn unpersist_session(&mut self, sid: SessionId) {
        let Some(s) = self.session_mut(sid) else {
            return;
        };
        if !s.persisted {
            return;
        }
        s.persisted = false;
        let s = &*s;
        let client_id = s.client_id.to_string();
        let mut keys = vec![Key::Session {
            client_id: client_id.clone(),
        }];
        keys.extend(s.subscriptions.keys().map(|f| Key::Subscription {
            client_id: client_id.clone(),
            filter: f.clone(),
        }));
        keys.extend(s.inflight.iter().map(|m| Key::Queued {
            client_id: client_id.clone(),
            seq: m.seq,
        }));
        keys.extend(s.queue.iter().map(|m| Key::Queued {
            client_id: client_id.clone(),
            seq: m.seq,
        }));
        keys.extend(s.incoming_qos2.iter().map(|packet_id| Key::Incoming {
            client_id: client_id.clone(),
            packet_id,
        }));
        for key in keys {
            self.persist(key.encode(), None);
        }
    }
}

fn auth_packet(reason: ReasonCode, method: Option<String>, data: Option<Bytes>) -> Packet {
    Packet::Auth(Auth {
        reason,
        properties: AuthProperties {
            authentication_method: method,
            authentication_data: data,
            ..Default::default()
        },
    })
}

/// The will of a CONNECT as the message it will become.
fn will_from(w: &LastWill) -> Will {
    let p = &w.properties;
    Will {
        message: Message {
            topic: w.topic.as_str().into(),
            payload: w.payload.clone(),
            qos: w.qos,
            retain: w.retain,
            properties: crate::codec::PublishProperties {
                payload_format_indicator: p.payload_format_indicator,
                message_expiry_interval: p.message_expiry_interval,
                response_topic: p.response_topic.clone(),
                correlation_data: p.correlation_data.clone(),
                user_properties: p.user_properties.clone(),
                content_type: p.content_type.clone(),
                ..Default::default()
            }
            .into(),
            // The expiry interval starts when the will is published.
            expires_at: None,
            origin: None,
        },
        delay_secs: p.will_delay_interval.unwrap_or(0),
    }
}

/// Response Information for a client: the configured prefix and the client id, with characters
/// that cannot stand in a topic level ('/', '+', '#') replaced, and a trailing '/'.
fn response_information(prefix: &str, client_id: &str) -> String {
    let level: String = client_id
        .chars()
        .map(|c| if matches!(c, '/' | '+' | '#') { '_' } else { c })
        .collect();
    format!("{prefix}{level}/")
}
