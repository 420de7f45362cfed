//! The broker state machine: connections, sessions, routing.
//!
//! One [`Broker`] owns every connection and session of a node. The shell feeds it inputs and
//! drains its outputs; see the crate documentation for the drive loop.

mod auth;
mod client_id;
mod cluster;
mod config;
mod connect;
mod connection;
mod io;
mod message;
mod persist;
mod publish;
mod restore;
mod resume;
mod session;
mod stats;
mod subscribe;
mod subscriptions;
mod sys;

use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use foldhash::fast::FixedState;

pub use auth::{
    AllowAll, AuthOutcome, AuthRequest, Authenticator, Authorizer, ClientRef, FilterAccess,
};
pub use client_id::{ClientId, ClientIdError};
pub use cluster::{
    ClusterConfig, ForgetError, ForgetReason, Forgotten, HomeRegion, LEAF_PREFIX, LeafError,
    LeafScope, PeerFault, PeerLimit, PeerLimits, PeerSummary,
};
pub use config::Config;
pub use io::{ConnId, ConnInfo, DisconnectCause, Durability, Event, Input, Output, Timestamp};
pub use message::{Message, MessageProperties};
pub use persist::RecordError;
pub use restore::RestoreReport;
pub use stats::{Figure, FigureKind, FigureValue, Stats};

use self::connection::{ConnState, Connection};
use self::session::{Session, SessionId};
use self::subscriptions::{Recipient, SubscriptionIndex};
use crate::codec::{self, Disconnect, Packet, ProtocolVersion, QoS, ReasonCode};
use crate::topic::{self, TopicTree};

/// A deadline the broker waits for. Stale timers (for connections that are gone or sessions
/// whose generation moved on) are recognised and ignored when they fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    ConnectTimeout(ConnId),
    KeepAlive(ConnId),
    Will {
        session: SessionId,
        generation: u64,
    },
    SessionExpiry {
        session: SessionId,
        generation: u64,
    },
    /// The earliest entry of `retained_expiry` is due.
    RetainedExpiry,
    /// Close the batch of route changes and send it.
    RouteFlush,
    /// Announce this node's route-set version.
    Digest,
    /// A held SUBACK's longest wait is over.
    SubscribeFence,
    /// Look for nodes absent longer than the expiry time.
    PeerExpiry,
    /// Publish the system topics that changed.
    Sys,
    /// The wait for a session shipped from another node is over.
    TransferWait(SessionId),
    /// A session that moved here stops holding messages back for their order.
    OrderWait(SessionId),
    /// A CONNECT waiting for its home region's grant waits no longer.
    HomeAnswer(ConnId),
    /// The earliest revocation a home region's deciding node waits for is due.
    HomeRevoke,
}

/// Room for outputs kept between inputs; a queue grown past it by a burst shrinks back.
const OUTPUTS_KEPT: usize = 4_096;

/// Hash maps with a fixed seed: deterministic, no OS randomness.
pub(crate) type FixedMap<K, V> = std::collections::HashMap<K, V, FixedState>;

/// One subscription, for admin listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionSummary {
    /// The session's client id.
    pub client_id: String,
    /// The filter as subscribed (with its `$share/{group}/` prefix).
    pub filter: String,
    /// The QoS granted.
    pub qos: QoS,
}

/// A summary of one session, for admin listings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSummary {
    /// The session's client id.
    pub client_id: String,
    /// The user the session runs as, if any.
    pub username: Option<String>,
    /// The protocol version of its latest connection.
    pub protocol: ProtocolVersion,
    /// Whether a connection is attached now.
    pub connected: bool,
    /// The attached connection, if any.
    pub conn: Option<ConnId>,
    /// Its subscriptions: the filter as subscribed (`$share/` prefix included) and its maximum QoS.
    pub subscriptions: Vec<(String, QoS)>,
    /// QoS 1/2 messages sent (or to be re-sent) to the client and not yet acknowledged.
    pub inflight: usize,
    /// QoS 1/2 messages waiting for room in the in-flight window, or for the client to return.
    pub queued: usize,
    /// Its connection is congested ([`Input::Congested`]): QoS 0 messages to it are dropped.
    pub congested: bool,
}

/// The sans-IO MQTT broker: every connection and session of one node.
///
/// `A` and `Z` are its [`Authenticator`] and [`Authorizer`]: boxed trait objects unless the
/// application names them, for instance `Box<dyn Authenticator + Send>` to move the broker
/// between threads.
///
/// # Methods by family
///
/// - **Set-up**, before the first input: [`Broker::new`], [`Broker::with_auth`],
///   [`Broker::enable_cluster`], then [`Broker::restore`] with every stored record (and
///   [`Broker::restore_open`] for connections that outlived the process).
/// - **Inputs**, all taking `now`: [`Broker::handle_input`] for what happened ([`Input`]:
///   bytes, closes, deadlines, authentication decisions, peers and their frames, congestion),
///   [`Broker::accept`] for a new connection, and the commands of an operator or an
///   application: [`Broker::publish`], [`Broker::disconnect_client`],
///   [`Broker::end_client_session`], [`Broker::set_hooks`], [`Broker::add_leaf`],
///   [`Broker::forget_peer`], [`Broker::set_residency`], [`Broker::set_node_regions`],
///   [`Broker::checkpoint`], [`Broker::shutdown`].
/// - **Outputs**: [`Broker::poll_output`] until it returns `None`, then
///   [`Broker::poll_timeout`] for when to feed [`Input::Timeout`]; [`Broker::wants_input`]
///   says whether to go on reading a connection.
/// - **Getters**, which change nothing: [`Broker::stats`], [`Broker::clients`],
///   [`Broker::clients_page`], [`Broker::subscriptions_page`], [`Broker::peers`],
///   [`Broker::route_set`], [`Broker::replicated_routes`], [`Broker::config`] and the like.
///
/// # The drain rule
///
/// After every input, drain [`Broker::poll_output`] to `None` before feeding the next, and
/// feed nothing while draining (a shell that learns something as it applies an output,
/// that a connection's backlog passed its mark, say, feeds it once the drain is over). Apply
/// the outputs in the order they come:
///
/// - a [`Output::Persist`] of [`Durability::Now`] is durable before any output after it goes
///   out (it may be what that output acknowledges); one of [`Durability::WithNext`] may wait
///   for the next that is;
/// - [`Output::Send`] bytes are written as they are, in order per connection;
/// - [`Output::ToPeer`] and [`Output::Broadcast`] frames are encoded already
///   ([`crate::link::EncodedFrame`]): their bytes go on the link as they are, in order per
///   peer.
///
/// One input's acknowledgements of forwards received ([`Input::PeerFrames`] carries every
/// frame of one read) leave as one per peer and origin, last.
pub struct Broker<A = Box<dyn Authenticator>, Z = Box<dyn Authorizer>> {
    config: Config,
    now: Timestamp,
    /// Boxed: a map of many connections keeps spare slots, which stay small this way.
    conns: FixedMap<ConnId, Box<Connection>>,
    next_conn: u64,
    /// Ids up to this one are reserved in storage (resumable connections).
    conn_ids_reserved: u64,
    sessions: Vec<Option<Session>>,
    free_sessions: Vec<SessionId>,
    by_client_id: FixedMap<ClientId, SessionId>,
    subs: SubscriptionIndex,
    retained: TopicTree<Arc<Message>>,
    /// Retained messages with an expiry, by deadline (entries of replaced messages are skipped).
    retained_expiry: BTreeSet<(Timestamp, Arc<str>)>,
    /// When the one `RetainedExpiry` timer is armed.
    retained_timer: Option<Timestamp>,
    outputs: VecDeque<Output>,
    /// Bytes of the sessions' held messages as last counted ([`Session::accounted`]).
    held: usize,
    /// Sessions changed since their bytes were last counted.
    touched: Vec<SessionId>,
    /// Sessions changed since the last checkpoint (resumable connections).
    unsaved: Vec<SessionId>,
    /// Bytes of the retained messages stored.
    retained_bytes: usize,
    /// Connections with bytes in their write buffer, in the order they were first written.
    dirty: Vec<ConnId>,
    timers: BTreeSet<(Timestamp, Timer)>,
    authenticator: A,
    authorizer: Z,
    rng: u64,
    generation: u64,
    stats: Stats,
    scratch: Vec<Recipient>,
    topic_limits: topic::Limits,
    /// Set when the broker is a node of a multi-region deployment.
    cluster: Option<Box<cluster::Cluster>>,
    /// Set when the broker publishes system topics ([`Config::sys_interval_ms`]).
    sys: Option<Box<sys::SysTopics>>,
}

impl<A, Z> fmt::Debug for Broker<A, Z> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Broker")
            .field("now", &self.now)
            .field("connections", &self.conns.len())
            .field("sessions", &self.by_client_id.len())
            .field("subscriptions", &self.subs.len())
            .field("retained", &self.retained.len())
            .finish_non_exhaustive()
    }
}

impl Broker {
    /// A broker that lets everyone in ([`AllowAll`]); see [`Broker::with_auth`].
    pub fn new(config: Config, now: Timestamp) -> Self {
        Self::with_auth(config, now, Box::new(AllowAll), Box::new(AllowAll))
    }
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// A broker that asks the application's own hooks who may connect and what they may do.
    pub fn with_auth(config: Config, now: Timestamp, authenticator: A, authorizer: Z) -> Self {
        let seed = config.seed;
        let topic_limits = topic::Limits {
            max_len: config.max_topic_len,
            max_levels: config.max_topic_levels,
        };
        let mut timers = BTreeSet::new();
        let sys = (config.sys_interval_ms > 0).then(|| {
            timers.insert((now.plus_ms(config.sys_interval_ms), Timer::Sys));
            sys::SysTopics::new(now)
        });
        Self {
            conns: FixedMap::with_hasher(FixedState::with_seed(seed)),
            next_conn: 1,
            conn_ids_reserved: 0,
            sessions: Vec::new(),
            free_sessions: Vec::new(),
            by_client_id: FixedMap::with_hasher(FixedState::with_seed(seed ^ 1)),
            subs: SubscriptionIndex::new(seed ^ 2),
            retained: TopicTree::new(seed ^ 3),
            retained_expiry: BTreeSet::new(),
            retained_timer: None,
            outputs: VecDeque::new(),
            held: 0,
            touched: Vec::new(),
            unsaved: Vec::new(),
            retained_bytes: 0,
            dirty: Vec::new(),
            timers,
            authenticator,
            authorizer,
            rng: seed,
            generation: 0,
            stats: Stats::default(),
            scratch: Vec::new(),
            topic_limits,
            cluster: None,
            sys,
            config,
            now,
        }
    }

    /// The configuration the broker runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Replace the authentication and authorization hooks, say after the application reloaded
    /// its passwords or rules. Connected clients stay connected and their subscriptions stay
    /// in place, judged again: from now on every message delivered to them passes the new
    /// rules (a subscription they now refuse delivers nothing). Every later decision asks the
    /// new hooks, including a re-authentication; a decision the old authenticator left
    /// pending is still taken when it comes ([`Input::AuthDecision`]).
    pub fn set_hooks(&mut self, now: Timestamp, authenticator: A, authorizer: Z) {
        self.advance(now);
        self.authenticator = authenticator;
        self.authorizer = authorizer;
        let sessions: Vec<SessionId> = self.by_client_id.values().copied().collect();
        for sid in sessions {
            self.reclassify_subscriptions(sid);
        }
    }

    /// A new network connection. The client must send CONNECT within the connect timeout.
    pub fn accept(&mut self, now: Timestamp, info: ConnInfo) -> ConnId {
        self.advance(now);
        let id = ConnId(self.next_conn);
        self.next_conn += 1;
        self.reserve_conn_ids();
        let deadline = now.plus_ms(self.config.connect_timeout_ms);
        self.conns
            .insert(id, Box::new(Connection::new(info, now, deadline)));
        if let Some(sys) = &mut self.sys {
            sys.connections(self.conns.len());
        }
        self.timers.insert((deadline, Timer::ConnectTimeout(id)));
        id
    }

    /// Feed one input. Drain [`Broker::poll_output`] afterwards.
    pub fn handle_input(&mut self, now: Timestamp, input: Input<'_>) {
        self.advance(now);
        match input {
            Input::Bytes { conn, data } => self.on_bytes(conn, data),
            Input::Closed { conn } => self.close_conn(conn, DisconnectCause::ConnectionLost),
            Input::Timeout => self.on_timeout(),
            Input::AuthDecision { conn, outcome } => self.on_auth_decision(conn, outcome),
            Input::PeerUp { peer } => self.on_peer_up(peer),
            Input::PeerFrame { peer, frame } => self.on_peer_frame(peer, *frame),
            Input::PeerFrames { peer, frames } => {
                for frame in frames {
                    self.on_peer_frame(peer.clone(), frame);
                }
            }
            Input::PeerDown { peer } => self.on_peer_down(peer),
            Input::Congested { conn } => self.set_congested(conn, true),
            Input::Drained { conn } => self.set_congested(conn, false),
            Input::PeerCongested { peer } => self.set_peer_congested(&peer, true),
            Input::PeerDrained { peer } => self.set_peer_congested(&peer, false),
        }
        self.send_held_acks();
    }

    fn set_congested(&mut self, conn: ConnId, congested: bool) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.congested = congested;
        }
    }

    /// Whether the shell should go on reading from `conn`. A client may send packets right
    /// after CONNECT, before its CONNACK; while an authentication decision is pending
    /// ([`AuthOutcome::Pending`]) the broker holds them. Once it holds the connection's maximum
    /// packet size, this answers `false` until the decision comes ([`Input::AuthDecision`]):
    /// a shell that stops reading then (and reads again after the decision) keeps what one
    /// client can make the broker hold before it has logged in to that, plus one read.
    pub fn wants_input(&self, conn: ConnId) -> bool {
        let Some(c) = self.conns.get(&conn) else {
            return false;
        };
        // A decision is pending: a plain authentication, or the grant of a home region.
        let holding = match &c.state {
            ConnState::AwaitingHome(_) => true,
            ConnState::Authenticating { connect, .. } => {
                connect.properties.authentication_method.is_none()
            }
            _ => false,
        };
        if !holding {
            return true;
        }
        let limit = c
            .info
            .max_packet_size
            .map_or(self.config.max_packet_size, |m| {
                m.min(self.config.max_packet_size)
            });
        c.read_buf.len() < limit as usize
    }

    /// The next thing for the shell to do, in order; `None` when there is nothing left.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        if self.outputs.is_empty() {
            self.flush_dirty();
            if self.outputs.is_empty() && self.outputs.capacity() > OUTPUTS_KEPT {
                // A burst (a route snapshot installed: one record per filter) gives its
                // memory back once drained.
                self.outputs.shrink_to(OUTPUTS_KEPT);
            }
        }
        self.outputs.pop_front()
    }

    /// When to feed [`Input::Timeout`] next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// Counters and current sizes.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats.clone();
        s.connections = self.conns.len();
        s.sessions = self.by_client_id.len();
        s.subscriptions = self.subs.len();
        s.retained_messages = self.retained.len();
        s.claims = self.claims_held();
        s.queued_messages = self.sessions.iter().flatten().map(|x| x.queue.len()).sum();
        s.held_bytes = self.held_bytes();
        s.inflight_messages = self
            .sessions
            .iter()
            .flatten()
            .map(|x| x.inflight.len())
            .sum();
        s
    }

    /// Every session, connected or not, for admin listings.
    pub fn clients(&self) -> Vec<ClientSummary> {
        self.clients_page(0, usize::MAX, None).0
    }

    /// A page of [`Broker::clients`]: `limit` sessions from `offset`, of those whose client id
    /// holds `filter`, and how many there are in all. Only the page is summarised.
    pub fn clients_page(
        &self,
        offset: usize,
        limit: usize,
        filter: Option<&str>,
    ) -> (Vec<ClientSummary>, usize) {
        let mut ids: Vec<&Session> = self
            .by_client_id
            .values()
            .filter_map(|&sid| self.session(sid))
            .filter(|s| filter.is_none_or(|f| s.client_id.contains(f)))
            .collect();
        ids.sort_unstable_by(|a, b| a.client_id.cmp(&b.client_id));
        let total = ids.len();
        let page = ids
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|s| self.client_summary(s))
            .collect();
        (page, total)
    }

    /// Subscriptions, by client id then filter: `limit` from `offset` of those whose filter or
    /// client id holds `filter`, and how many there are in all.
    pub fn subscriptions_page(
        &self,
        offset: usize,
        limit: usize,
        filter: Option<&str>,
    ) -> (Vec<SubscriptionSummary>, usize) {
        let mut sessions: Vec<&Session> = self.sessions.iter().flatten().collect();
        sessions.sort_unstable_by(|a, b| a.client_id.cmp(&b.client_id));
        let mut total = 0;
        let mut page = Vec::new();
        for s in sessions {
            let client_hit = filter.is_none_or(|f| s.client_id.contains(f));
            let mut subs: Vec<(&String, QoS)> = s
                .subscriptions
                .iter()
                .filter(|(f, _)| client_hit || filter.is_some_and(|q| f.contains(q)))
                .map(|(f, e)| (f, e.options.qos))
                .collect();
            subs.sort_unstable();
            for (f, qos) in subs {
                if total >= offset && page.len() < limit {
                    page.push(SubscriptionSummary {
                        client_id: s.client_id.to_string(),
                        filter: f.clone(),
                        qos,
                    });
                }
                total += 1;
            }
        }
        (page, total)
    }

    fn client_summary(&self, s: &Session) -> ClientSummary {
        ClientSummary {
            client_id: s.client_id.to_string(),
            username: s.username.as_deref().map(str::to_owned),
            protocol: s.protocol,
            connected: s.conn.is_some(),
            conn: s.conn,
            subscriptions: s
                .subscriptions
                .iter()
                .map(|(f, e)| (f.clone(), e.options.qos))
                .collect(),
            inflight: s.inflight.len(),
            queued: s.queue.len(),
            congested: s
                .conn
                .and_then(|c| self.conns.get(&c))
                .is_some_and(|c| c.congested),
        }
    }

    /// Disconnect a client (MQTT 5.0 clients get DISCONNECT with `reason`). Returns whether it
    /// was connected.
    pub fn disconnect_client(
        &mut self,
        now: Timestamp,
        client_id: &str,
        reason: ReasonCode,
    ) -> bool {
        self.advance(now);
        let conn = self
            .by_client_id
            .get(client_id)
            .and_then(|&s| self.session(s)?.conn);
        match conn {
            Some(conn) => {
                self.close_conn(conn, DisconnectCause::ByServer(reason));
                true
            }
            None => false,
        }
    }

    /// End the session of `client_id` (an operator's decision): its connection is closed with
    /// `reason` (MQTT 5.0 clients get it in DISCONNECT), its will follows the usual rules, and
    /// the session, its subscriptions and its messages are gone; the client id is free again
    /// for anyone. Returns whether there was such a session.
    pub fn end_client_session(
        &mut self,
        now: Timestamp,
        client_id: &str,
        reason: ReasonCode,
    ) -> bool {
        self.advance(now);
        if !self.by_client_id.contains_key(client_id) {
            return false;
        }
        self.disconnect_client(now, client_id, reason);
        // A clean session ended with its connection already.
        if let Some(&sid) = self.by_client_id.get(client_id) {
            self.end_session(sid);
        }
        true
    }

    /// Graceful shutdown: every connection is closed (MQTT 5.0 clients get DISCONNECT 0x8B).
    /// Persistent sessions stay in storage.
    pub fn shutdown(&mut self, now: Timestamp) {
        self.advance(now);
        let mut conns: Vec<ConnId> = self.conns.keys().copied().collect();
        conns.sort();
        for conn in conns {
            self.close_conn(
                conn,
                DisconnectCause::ByServer(ReasonCode::SERVER_SHUTTING_DOWN),
            );
        }
    }

    /// Publish a message from the shell itself (bridges, embedding apps, an admin API).
    /// Returns the number of sessions it was delivered or queued to.
    /// A message with an invalid topic name is refused, and so is one under `$SYS` while the
    /// broker publishes its own figures there ([`Config::sys_interval_ms`]).
    pub fn publish(
        &mut self,
        now: Timestamp,
        message: Message,
    ) -> Result<usize, topic::TopicError> {
        self.advance(now);
        topic::TopicName::check(&message.topic, &self.topic_limits)?;
        if self.sys_reserved(&message.topic) {
            return Err(topic::TopicError::Reserved);
        }
        Ok(self.publish_message(message))
    }

    fn advance(&mut self, now: Timestamp) {
        // Time never goes backwards; a shell whose clock steps back is treated as standing still.
        self.now = self.now.max(now);
    }

    fn session(&self, id: SessionId) -> Option<&Session> {
        self.sessions.get(id as usize)?.as_ref()
    }

    /// The session, put on the lists of those changed ([`Broker::touch`]).
    fn session_mut(&mut self, id: SessionId) -> Option<&mut Session> {
        self.touch(id);
        self.sessions.get_mut(id as usize)?.as_mut()
    }

    /// Put a session on the list of those to count again, and of those changed since the
    /// last checkpoint (for code that borrows it directly).
    fn touch(&mut self, id: SessionId) {
        if let Some(session) = self.sessions.get_mut(id as usize).and_then(Option::as_mut) {
            if !session.touched {
                session.touched = true;
                self.touched.push(id);
            }
            if self.config.resumable_connections && !session.checkpoint.is_unsaved() {
                session.checkpoint = session.checkpoint.with_unsaved(true);
                self.unsaved.push(id);
            }
        }
    }

    /// Count again the bytes of the sessions changed since they were last counted.
    fn count_held(&mut self) {
        for sid in self.touched.drain(..) {
            if let Some(s) = self.sessions.get_mut(sid as usize).and_then(Option::as_mut) {
                let now = s.held_bytes();
                self.held = self.held - s.accounted + now;
                s.accounted = now;
                s.touched = false;
            }
        }
    }

    /// Payload and topic bytes of every message held: retained, queued and in flight.
    pub fn held_bytes(&self) -> usize {
        let pending: isize = self
            .touched
            .iter()
            .filter_map(|&sid| self.session(sid))
            .filter(|s| s.touched)
            .map(|s| s.held_bytes() as isize - s.accounted as isize)
            .sum();
        (self.held as isize + pending) as usize + self.retained_bytes
    }

    /// [`Broker::held_bytes`] counted from scratch, every session and retained message: what
    /// the running count must always equal (tests check it).
    #[doc(hidden)]
    pub fn held_bytes_recounted(&self) -> usize {
        let sessions: usize = self
            .sessions
            .iter()
            .flatten()
            .map(Session::held_bytes)
            .sum();
        let retained: usize = self.retained.iter().map(|(_, m)| m.weight()).sum();
        sessions + retained
    }

    /// Whether holding `more` bytes of messages would pass `max_held_bytes`.
    fn over_budget(&mut self, more: usize) -> bool {
        self.count_held();
        self.held + self.retained_bytes + more > self.config.max_held_bytes
    }

    fn next_generation(&mut self) -> u64 {
        self.generation += 1;
        self.generation
    }

    /// splitmix64: deterministic from the configured seed.
    fn random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    // ----- output plumbing -----

    /// Queue an output. Bytes already written to connections go out first, so that a `Persist`
    /// precedes every acknowledgement written after it.
    fn push(&mut self, output: Output) {
        if matches!(output, Output::Persist { .. }) {
            self.flush_dirty();
        }
        self.outputs.push_back(output);
    }

    /// A reason string for a failure code in an acknowledgement, if this client wants problem
    /// information (MQTT 5.0 `Request Problem Information`) and the broker sends them.
    fn problem(&self, conn_id: ConnId, reason: ReasonCode) -> codec::ReasonProperties {
        let wanted = self.config.reason_strings
            && reason.is_error()
            && self
                .conns
                .get(&conn_id)
                .is_some_and(|c| c.problem_information);
        codec::ReasonProperties {
            reason_string: wanted.then(|| reason.name().to_owned()),
            user_properties: Vec::new(),
        }
    }

    fn event(&mut self, event: Event) {
        self.outputs.push_back(Output::Event(event));
    }

    fn persist(&mut self, key: Bytes, value: Option<Bytes>) {
        let durability = persist::durability(&key, value.as_ref());
        self.push(Output::Persist {
            key,
            value,
            durability,
        });
    }

    fn flush_dirty(&mut self) {
        // Drained rather than taken: the list keeps its room for the next batch.
        let mut dirty = std::mem::take(&mut self.dirty);
        for id in dirty.drain(..) {
            if let Some(conn) = self.conns.get_mut(&id) {
                conn.dirty = false;
                if !conn.write_buf.is_empty() {
                    // Taken whole: a buffer split off would keep the allocation alive, shared
                    // with what was sent, for as long as the connection lasts.
                    let data = std::mem::take(&mut conn.write_buf).freeze();
                    self.outputs.push_back(Output::Send { conn: id, data });
                }
            }
        }
        self.dirty = dirty;
    }

    /// Encode a packet into a connection's write buffer.
    /// Packets larger than the client's Maximum Packet Size lose their Reason String and User
    /// Properties first, and are not sent if still too large (MQTT-3.1.2-24, -25).
    fn send(&mut self, conn_id: ConnId, packet: &Packet) {
        self.try_send(conn_id, packet);
    }

    /// [`Broker::send`], saying whether the packet went out.
    fn try_send(&mut self, conn_id: ConnId, packet: &Packet) -> bool {
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return false;
        };
        let max = conn.client_max_packet as usize;
        let too_large = |p: &Packet| codec::encoded_len(p, conn.protocol).is_ok_and(|n| n > max);
        let stripped;
        let packet = if too_large(packet) {
            stripped = without_problem_properties(packet);
            if too_large(&stripped) {
                self.stats.dropped_too_large += 1;
                return false;
            }
            &stripped
        } else {
            packet
        };
        let before = conn.write_buf.len();
        if codec::encode(packet, conn.protocol, &mut conn.write_buf).is_err() {
            // Only packets the broker built itself get here, within protocol limits; a failure
            // would be a bug, and the connection is better closed than fed half a packet.
            conn.write_buf.truncate(before);
            self.stats.protocol_errors += 1;
            return false;
        }
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += (conn.write_buf.len() - before) as u64;
        if !conn.dirty {
            conn.dirty = true;
            self.dirty.push(conn_id);
        }
        true
    }

    // ----- input -----

    fn on_bytes(&mut self, conn_id: ConnId, data: &[u8]) {
        let max = self.config.max_packet_size;
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        if matches!(conn.state, ConnState::Closed) {
            return;
        }
        self.stats.bytes_received += data.len() as u64;
        let had_partial = !conn.read_buf.is_empty();
        conn.read_buf.extend_from_slice(data);
        loop {
            let Some(conn) = self.conns.get_mut(&conn_id) else {
                return;
            };
            if matches!(conn.state, ConnState::AwaitingHome(_)) {
                // Packets pipelined after CONNECT wait for the home region's answer.
                return;
            }
            if let ConnState::Authenticating { connect, .. } = &conn.state
                && connect.properties.authentication_method.is_none()
            {
                // A decision is pending: packets pipelined after CONNECT wait in the read
                // buffer until it comes; past one packet's worth, the shell is asked to stop
                // reading ([`Broker::wants_input`]).
                return;
            }
            let limit = conn.info.max_packet_size.map_or(max, |m| m.min(max));
            match codec::decode(&mut conn.read_buf, conn.protocol, limit) {
                Ok(None) => {
                    let partial = !conn.read_buf.is_empty();
                    if !partial {
                        // An idle connection keeps no buffer (an empty one would keep the
                        // last read's allocation alive, shared with the packets it held).
                        conn.read_buf = BytesMut::new();
                    }
                    if partial != had_partial {
                        self.mark_partial_packet(conn_id, partial);
                    }
                    return;
                }
                Ok(Some(packet)) => {
                    conn.last_packet_at = self.now;
                    self.stats.packets_received += 1;
                    self.on_packet(conn_id, packet);
                }
                Err(e) => {
                    self.protocol_violation(conn_id, e.reason, e.detail);
                    return;
                }
            }
        }
    }

    fn on_packet(&mut self, conn_id: ConnId, packet: Packet) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        match (&conn.state, packet) {
            (ConnState::AwaitConnect, Packet::Connect(c)) => self.on_connect(conn_id, c),
            (ConnState::AwaitConnect, _) => self.protocol_violation(
                conn_id,
                ReasonCode::PROTOCOL_ERROR,
                "first packet must be CONNECT",
            ),
            // Held in the read buffer until the answer (see `on_bytes`).
            (ConnState::AwaitingHome(_), _) => {}
            (ConnState::Authenticating { .. }, Packet::Auth(a)) => self.on_auth(conn_id, a),
            (ConnState::Authenticating { .. }, Packet::Disconnect(_)) => self.close_conn(
                conn_id,
                DisconnectCause::ByClient(ReasonCode::NORMAL_DISCONNECTION),
            ),
            (ConnState::Authenticating { .. }, _) => self.protocol_violation(
                conn_id,
                ReasonCode::PROTOCOL_ERROR,
                "expected AUTH during authentication",
            ),
            (ConnState::Connected { session }, packet) => {
                let session = *session;
                match packet {
                    Packet::Publish(p) => self.on_publish(conn_id, session, p),
                    Packet::PubAck(a) => self.on_puback(session, a),
                    Packet::PubRec(a) => self.on_pubrec(conn_id, session, a),
                    Packet::PubRel(a) => self.on_pubrel(conn_id, session, a),
                    Packet::PubComp(a) => self.on_pubcomp(session, a),
                    Packet::Subscribe(s) => self.on_subscribe(conn_id, session, s),
                    Packet::Unsubscribe(u) => self.on_unsubscribe(conn_id, session, u),
                    Packet::PingReq => self.send(conn_id, &Packet::PingResp),
                    Packet::Disconnect(d) => self.on_disconnect(conn_id, session, d),
                    Packet::Auth(a) => self.on_auth(conn_id, a),
                    Packet::Connect(_) => self.protocol_violation(
                        conn_id,
                        ReasonCode::PROTOCOL_ERROR,
                        "second CONNECT on a connection",
                    ),
                    Packet::ConnAck(_)
                    | Packet::SubAck(_)
                    | Packet::UnsubAck(_)
                    | Packet::PingResp => self.protocol_violation(
                        conn_id,
                        ReasonCode::PROTOCOL_ERROR,
                        "packet only a server may send",
                    ),
                }
            }
            (ConnState::Closed, _) => {}
        }
    }

    /// Close a connection for bad input: MQTT 5.0 connected clients get DISCONNECT with the
    /// reason; a CONNECT of an unsupported protocol level gets a 3.1.1 CONNACK return code 1.
    fn protocol_violation(&mut self, conn_id: ConnId, reason: ReasonCode, detail: &'static str) {
        self.stats.protocol_errors += 1;
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return;
        };
        match conn.state {
            ConnState::Connected { .. } => {
                self.close_conn_because(conn_id, DisconnectCause::ByServer(reason), Some(detail));
            }
            _ => {
                // Only a first CONNECT is answered in 3.1.1 form; later in the handshake the
                // connection already speaks its own version.
                if reason == ReasonCode::UNSUPPORTED_PROTOCOL_VERSION
                    && matches!(conn.state, ConnState::AwaitConnect)
                {
                    conn.protocol = ProtocolVersion::V311;
                    self.send(
                        conn_id,
                        &Packet::ConnAck(codec::ConnAck {
                            session_present: false,
                            reason,
                            properties: Default::default(),
                        }),
                    );
                }
                self.event(Event::ConnectionClosed {
                    conn: conn_id,
                    reason,
                    detail,
                });
                self.finish_close(conn_id);
            }
        }
    }

    /// End a connection. A connected session sees the disconnection (will, expiry, ...).
    fn close_conn(&mut self, conn_id: ConnId, cause: DisconnectCause) {
        self.close_conn_because(conn_id, cause, None);
    }

    /// Like `close_conn`, with a reason string for the DISCONNECT sent to MQTT 5.0 clients.
    fn close_conn_because(
        &mut self,
        conn_id: ConnId,
        cause: DisconnectCause,
        detail: Option<&str>,
    ) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        match conn.state {
            ConnState::Connected { session } => {
                if let DisconnectCause::ByServer(reason) = cause
                    && conn.protocol == ProtocolVersion::V5
                {
                    let mut disconnect = Disconnect::new(disconnect_reason(reason));
                    if self.config.reason_strings {
                        disconnect.properties.reason_string = detail.map(str::to_owned);
                    }
                    self.send(conn_id, &Packet::Disconnect(disconnect));
                }
                self.finish_close(conn_id);
                self.session_disconnected(session, conn_id, cause);
            }
            ConnState::Closed => {}
            _ => {
                let reason = match cause {
                    DisconnectCause::ByServer(r) | DisconnectCause::ByClient(r) => r,
                    DisconnectCause::ConnectionLost => ReasonCode::NORMAL_DISCONNECTION,
                };
                self.event(Event::ConnectionClosed {
                    conn: conn_id,
                    reason,
                    detail: "closed before CONNECT completed",
                });
                self.finish_close(conn_id);
            }
        }
    }

    /// Flush what was written to the connection, tell the shell to close it, forget it.
    fn finish_close(&mut self, conn_id: ConnId) {
        if let Some(mut conn) = self.conns.remove(&conn_id) {
            if matches!(conn.state, ConnState::Connected { .. }) {
                self.unpersist_connection(conn_id, &conn.inbound_aliases);
            }
            conn.state = ConnState::Closed;
            self.timers
                .remove(&(conn.connect_deadline, Timer::ConnectTimeout(conn_id)));
            if let Some(at) = conn.keep_alive_timer {
                self.timers.remove(&(at, Timer::KeepAlive(conn_id)));
            }
            if !conn.write_buf.is_empty() {
                let data = conn.write_buf.split().freeze();
                self.flush_dirty();
                self.outputs.push_back(Output::Send {
                    conn: conn_id,
                    data,
                });
            }
            self.outputs.push_back(Output::Close { conn: conn_id });
        }
    }

    // ----- timers -----

    fn on_timeout(&mut self) {
        while let Some(&(at, timer)) = self.timers.first() {
            if at > self.now {
                break;
            }
            self.timers.pop_first();
            self.fire(timer);
        }
    }

    fn fire(&mut self, timer: Timer) {
        match timer {
            Timer::ConnectTimeout(conn) => {
                if self.conns.get(&conn).is_some_and(|c| c.session().is_none()) {
                    self.event(Event::ConnectionClosed {
                        conn,
                        reason: ReasonCode::MAXIMUM_CONNECT_TIME,
                        detail: "no CONNECT within the connect timeout",
                    });
                    self.finish_close(conn);
                }
            }
            Timer::KeepAlive(conn) => {
                let Some(c) = self.conns.get_mut(&conn) else {
                    return;
                };
                c.keep_alive_timer = None;
                let Some(deadline) = c.keep_alive_deadline() else {
                    return;
                };
                if deadline <= self.now {
                    self.close_conn(
                        conn,
                        DisconnectCause::ByServer(ReasonCode::KEEP_ALIVE_TIMEOUT),
                    );
                } else {
                    c.keep_alive_timer = Some(deadline);
                    self.timers.insert((deadline, Timer::KeepAlive(conn)));
                }
            }
            Timer::Will {
                session,
                generation,
            } => {
                if self
                    .session(session)
                    .is_some_and(|s| s.generation == generation)
                {
                    self.publish_pending_will(session);
                }
            }
            Timer::SessionExpiry {
                session,
                generation,
            } => {
                if self
                    .session(session)
                    .is_some_and(|s| s.generation == generation && s.conn.is_none())
                {
                    self.end_session(session);
                }
            }
            Timer::RouteFlush => self.fire_route_flush(),
            Timer::Digest => self.fire_digest(),
            Timer::PeerExpiry => self.fire_peer_expiry(),
            Timer::SubscribeFence => self.release_fences(),
            Timer::Sys => self.fire_sys(),
            Timer::TransferWait(session) => self.transfer_wait_over(session),
            Timer::OrderWait(session) => self.order_wait_over(session),
            Timer::HomeAnswer(conn) => self.home_wait_over(conn),
            Timer::HomeRevoke => self.home_revokes_over(),
            Timer::RetainedExpiry => {
                self.retained_timer = None;
                while let Some((at, topic)) = self.retained_expiry.first().cloned() {
                    if at > self.now {
                        break;
                    }
                    self.retained_expiry.pop_first();
                    if self
                        .retained
                        .get(&topic)
                        .is_some_and(|m| m.is_expired(self.now))
                    {
                        if let Some(old) = self.retained.remove(&topic) {
                            self.retained_bytes -= old.weight();
                        }
                        let key = persist::Key::Retained {
                            topic: topic.to_string(),
                        };
                        self.persist(key.encode(), None);
                        self.retained_expired(&topic);
                    }
                }
                self.rearm_retained_timer();
            }
        }
    }
}

/// A reason the server may put in DISCONNECT (MQTT 5.0 §3.14.2.1); others (e.g. an
/// authenticator's 0x86 on re-authentication) become 0x87, or 0x82 for protocol trouble.
fn disconnect_reason(reason: ReasonCode) -> ReasonCode {
    match reason.0 {
        0x00 | 0x80..=0x83 | 0x87 | 0x89 | 0x8B | 0x8D..=0x90 | 0x93..=0xA2 => reason,
        0x84 | 0x85 | 0x91 | 0x92 => ReasonCode::PROTOCOL_ERROR,
        _ => ReasonCode::NOT_AUTHORIZED,
    }
}

/// A reason CONNACK may carry (MQTT 5.0 §3.2.2.2); others become 0x87.
pub(crate) fn connack_reason(reason: ReasonCode) -> ReasonCode {
    match reason.0 {
        0x00 | 0x80..=0x8A | 0x8C | 0x90 | 0x95 | 0x97 | 0x99..=0x9D | 0x9F => reason,
        _ => ReasonCode::NOT_AUTHORIZED,
    }
}

/// The packet without Reason String and User Properties, for a client with a small Maximum
/// Packet Size.
fn without_problem_properties(packet: &Packet) -> Packet {
    let mut p = packet.clone();
    match &mut p {
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            a.properties = codec::ReasonProperties::default();
        }
        Packet::SubAck(a) => a.properties = codec::ReasonProperties::default(),
        Packet::UnsubAck(a) => a.properties = codec::ReasonProperties::default(),
        Packet::Disconnect(d) => {
            d.properties.reason_string = None;
            d.properties.user_properties.clear();
        }
        Packet::Auth(a) => {
            a.properties.reason_string = None;
            a.properties.user_properties.clear();
        }
        Packet::ConnAck(c) => {
            c.properties.reason_string = None;
            c.properties.user_properties.clear();
        }
        _ => {}
    }
    p
}
