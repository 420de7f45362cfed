//! The broker task: the one place that owns the [`Broker`] and the [`Store`].
//!
//! It serves plain TCP connections itself ([`TcpConns`]): it reads their sockets when they are
//! readable and feeds the bytes to the core. Everything else reaches it as [`ToEngine`]
//! messages over a bounded channel (a full channel makes senders wait: back-pressure): the
//! bytes of TLS and WebSocket connections, which have a task each, frames from peer nodes,
//! requests from admin HTTP. It runs the core's drive loop: in each turn, take up to
//! [`MAX_BATCH`] messages and [`READS_PER_TURN`] reads, feed each, drain every output,
//! commit all `Persist` records of the turn in one transaction, and only then hand out the
//! bytes: to TCP sockets, written at the end of the turn, and to the other connections'
//! [`Outbox`]es. Then it waits for a socket, a message or the broker's deadline.
//!
//! A message between plain TCP clients is read, routed and written within one turn of one
//! task, without a hand-off. The task runs on the broker thread ([`crate::broker_thread`]),
//! beside the region mesh: what it waits for (an fsync, a route snapshot from a peer) holds up
//! only the mesh, which waits for it anyway.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use foldhash::{HashMap as ConnMap, HashSet as ConnSet};
use meridian_core::broker::{coalesce_forward_acks, record_may_wait};
use meridian_core::codec::ReasonCode;
use meridian_core::link::{self, Frame};
use meridian_core::routes::NodeId;
use meridian_core::{Broker, ConnId, ConnInfo, Event, Input, Output, Timestamp};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;
use tracing::{debug, error, info, warn};

use crate::mailbox::{DaemonCounters, MeshCmd, SendAuthenticator, SendAuthorizer, ToEngine};
use crate::mesh::queue::{PeerWriter, SendError};
use crate::storage::{StorageError, Store};
use crate::transport::Outbox;
use crate::transport::tcp::{Poller, Read, TcpConns};

/// Inputs taken per turn of the loop before outputs are committed and sent.
pub const MAX_BATCH: usize = 256;

/// Reads from plain TCP sockets per turn of the loop, each at most [`tcp::READ_BYTES`].
pub const READS_PER_TURN: usize = 256;

/// Bytes for connections after which a turn reads no more: what it routed is written before
/// more is read, so that subscribers are fed while publishers are read.
pub const TURN_OUTPUT_BYTES: usize = 1 << 20;

/// Outputs a commit window holds at most: past them it closes at the end of the turn, so
/// that what waits for its fsync stays within a few turns' worth at any rate.
pub const HELD_OUTPUTS_MAX: usize = 16 * 1024;

/// Bytes for connections and peers a commit window holds at most, as [`HELD_OUTPUTS_MAX`].
pub const HELD_BYTES_MAX: usize = TURN_OUTPUT_BYTES;

/// Records whose commits a window waits for at most: once its commits hold this many, it
/// closes at the end of the turn. An fsync shared this many ways costs little per record,
/// and publishers that keep this many messages in flight are not held back by the window:
/// what they send next waits for the acknowledgements it holds.
pub const COMMIT_WINDOW_RECORDS: usize = 8;

/// How far the task's timer may be from the next deadline before it is moved. Deadlines are
/// recomputed from the clock every turn and drift by microseconds; broker timers count in
/// milliseconds.
const WAKE_SLACK: Duration = Duration::from_millis(1);

/// Bounds on the bytes waiting to be written to one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteLimits {
    /// Past this backlog the connection is cut off as a slow consumer.
    pub max_bytes: usize,
    /// Past this backlog QoS 0 messages to the connection are dropped ([`Input::Congested`]),
    /// until it falls to half of it ([`Input::Drained`]).
    pub qos0_max_bytes: usize,
}

impl WriteLimits {
    pub fn from_config(limits: &crate::config::Limits) -> Self {
        Self {
            max_bytes: limits.max_write_buffer_bytes,
            qos0_max_bytes: limits.qos0_max_write_buffer_bytes.unwrap_or(
                (limits.max_write_buffer_bytes / 8)
                    .max(1024)
                    .min(limits.max_write_buffer_bytes),
            ),
        }
    }
}

/// The broker as the daemon runs it: with hooks that are `Send`, so that the broker, built on
/// the blocking pool, may run on the broker thread.
pub type DaemonBroker = Broker<SendAuthenticator, SendAuthorizer>;
/// Wall-clock milliseconds since the Unix epoch (stable across restarts, as the core needs
/// for persisted deadlines), never going backwards within a process.
#[derive(Debug, Default)]
pub struct Clock {
    last: u64,
}

impl Clock {
    pub fn now(&mut self) -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.last = self.last.max(ms);
        Timestamp(self.last)
    }
}

/// The broker task's state.
pub struct Engine {
    broker: DaemonBroker,
    store: Store,
    clock: Clock,
    /// Plain TCP connections.
    tcp: TcpConns,
    /// Connections served by tasks.
    outboxes: ConnMap<ConnId, Arc<Outbox>>,
    write_limits: WriteLimits,
    /// Connections the broker was told are congested ([`WriteLimits::qos0_max_bytes`]).
    congested: ConnSet<ConnId>,
    /// Bytes for each connection in this batch, not yet handed to its outbox.
    batch_bytes: ConnMap<ConnId, usize>,
    /// The sum of `batch_bytes`.
    turn_bytes: usize,
    counters: Arc<DaemonCounters>,
    outputs: Vec<Output>,
    records: Vec<(Bytes, Option<Bytes>)>,
    /// Connections to report closed to the broker after this batch's outputs are out.
    slow: Vec<ConnId>,
    /// Link sessions to peer nodes, by node.
    links: HashMap<NodeId, PeerLink>,
    /// Peers whose link the broker was told is congested ([`PeerWriter::congested_with`]).
    congested_links: Vec<NodeId>,
    /// Sessions whose queue overflowed in this batch: cut after the batch.
    cut: Vec<NodeId>,
    /// Where broadcasts go (gossip), in cluster mode.
    mesh: Option<mpsc::Sender<MeshCmd>>,
    frame_buf: BytesMut,
    stopping: bool,
    /// `storage.commit_window_ms`: how long a commit that outputs wait for may wait for
    /// others to share its fsync (zero: it is fsynced at once).
    commit_window: Duration,
    /// When the commit the held outputs wait for is fsynced, while a window is open.
    commit_due: Option<std::time::Instant>,
    /// Records committed since the window opened.
    window_records: usize,
    /// Outputs of the turns since the window opened, in order, waiting for its fsync (their
    /// records are in the journal).
    held: Vec<Output>,
    /// Bytes of the held outputs for connections and peers.
    held_bytes: usize,
}

#[derive(Debug)]
struct PeerLink {
    session: u64,
    writer: PeerWriter,
    /// A leaf's edge link: broadcasts (meant for the mesh) do not go on it.
    leaf: bool,
    /// The broker was told ([`Input::PeerCongested`]) and not yet told it drained.
    congested: bool,
    /// Frames for the peer in this batch, and their bytes, not yet queued on the session.
    batch_frames: usize,
    batch_bytes: usize,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("broker", &self.broker)
            .field("connections", &(self.tcp.count() + self.outboxes.len()))
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Build the engine and restore every stored record into the broker. It serves plain TCP
    /// connections with `tcp`, from the epoll set [`Engine::run`] is given.
    pub fn new(
        broker: DaemonBroker,
        store: Store,
        write_limits: WriteLimits,
        counters: Arc<DaemonCounters>,
        tcp: TcpConns,
    ) -> Result<Self, StorageError> {
        let mut engine = Self {
            broker,
            store,
            clock: Clock::default(),
            tcp,
            outboxes: ConnMap::default(),
            write_limits,
            congested: ConnSet::default(),
            batch_bytes: ConnMap::default(),
            turn_bytes: 0,
            counters,
            outputs: Vec::new(),
            records: Vec::new(),
            slow: Vec::new(),
            links: HashMap::new(),
            congested_links: Vec::new(),
            cut: Vec::new(),
            mesh: None,
            frame_buf: BytesMut::new(),
            stopping: false,
            commit_window: Duration::ZERO,
            commit_due: None,
            window_records: 0,
            held: Vec::new(),
            held_bytes: 0,
        };
        let records = engine.store.load_all()?;
        let count = records.len();
        let now = engine.clock.now();
        let report = engine.broker.restore(now, records);
        for (key, e) in &report.unreadable {
            warn!(key = ?key, error = %e, "unreadable stored record left in place");
        }
        info!(
            records = count,
            sessions = report.sessions,
            subscriptions = report.subscriptions,
            messages = report.messages,
            retained = report.retained,
            "restored state"
        );
        engine.drain();
        engine.flush()?;
        Ok(engine)
    }

    /// Let a commit that acknowledgements wait for wait up to `window` for the commits of the
    /// turns after it, so that one fsync makes them all durable (`storage.commit_window_ms`;
    /// only with a store whose commits sync). Everything those turns send waits with them,
    /// in order.
    pub fn with_commit_window(mut self, window: Duration) -> Self {
        self.commit_window = window;
        self
    }

    /// Send broadcasts to the region mesh (cluster mode; the broker must have cluster enabled).
    pub fn with_mesh(mut self, mesh: mpsc::Sender<MeshCmd>) -> Self {
        self.mesh = Some(mesh);
        self
    }

    /// The drive loop, with `poller` watching the epoll set of the engine's [`TcpConns`].
    /// Returns when told to shut down or when every handle is gone.
    pub async fn run(
        mut self,
        mut rx: mpsc::Receiver<ToEngine>,
        mut poller: Poller,
    ) -> Result<(), StorageError> {
        // One timer for the task's life, moved when the next deadline moves: a new one per turn
        // would enter and leave tokio's timer wheel every turn.
        let timer = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(timer);
        loop {
            let wake = self.next_wake();
            if let Some(at) = wake
                && (timer.is_elapsed()
                    || at.max(timer.deadline()) - at.min(timer.deadline()) > WAKE_SLACK)
            {
                timer.as_mut().reset(at);
            }
            // Sockets left to read from the last turn: no waiting.
            let busy = self.tcp.has_readable();
            let first = tokio::select! {
                biased;
                events = poller.wait() => {
                    match events {
                        Ok(events) => self.tcp.on_events(events),
                        Err(e) => {
                            error!(error = %e, "cannot wait on the TCP connections: stopping");
                            self.stopping = true;
                        }
                    }
                    None
                }
                msg = rx.recv() => match msg {
                    Some(m) => Some(m),
                    None => { self.stopping = true; None }
                },
                () = &mut timer, if !busy && wake.is_some() => None,
                () = std::future::ready(()), if busy => None,
            };
            if !self.congested.is_empty() {
                self.release_drained();
            }
            if !self.congested_links.is_empty() {
                self.release_drained_links();
            }
            let mut inputs = 0;
            if let Some(msg) = first {
                self.handle(msg);
                inputs = 1;
            }
            // Whatever woke the turn, messages waiting get their share of it.
            while inputs < MAX_BATCH {
                match rx.try_recv() {
                    Ok(msg) => self.handle(msg),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.stopping = true;
                        break;
                    }
                }
                inputs += 1;
            }
            self.read_sockets();
            self.tcp.expire(std::time::Instant::now());
            let now = self.clock.now();
            if self.broker.poll_timeout().is_some_and(|at| at <= now) {
                self.broker.handle_input(now, Input::Timeout);
                self.drain();
            }
            if self.stopping {
                let now = self.clock.now();
                self.broker.shutdown(now);
                self.drain();
                self.flush()?;
                self.commit_held()?;
                self.store.sync()?;
                info!("broker stopped; storage flushed");
                return Ok(());
            }
            self.flush()?;
            if self
                .commit_due
                .is_some_and(|at| at <= std::time::Instant::now())
            {
                self.commit_held()?;
            }
            if self
                .store
                .sync_due()
                .is_some_and(|at| at <= std::time::Instant::now())
            {
                self.store.sync()?;
            }
            // Whichever way the turn's fsyncs came: with a commit, a window or the period.
            self.counters
                .storage_syncs
                .store(self.store.syncs(), Ordering::Relaxed);
            if !rx.is_empty() || self.tcp.has_readable() {
                // More is waiting: let the tasks this turn woke on this thread (the link
                // sessions and connections of the mesh) run first.
                tokio::task::yield_now().await;
            }
        }
    }

    /// Read from the readable plain TCP sockets, up to [`READS_PER_TURN`] reads or until the
    /// turn has [`TURN_OUTPUT_BYTES`] to write, and feed what they give to the broker. A client
    /// gone is noted, to be closed at the end of the turn.
    fn read_sockets(&mut self) {
        if !self.tcp.has_readable() {
            return;
        }
        let now = self.clock.now();
        for _ in 0..READS_PER_TURN {
            if self.turn_bytes >= TURN_OUTPUT_BYTES {
                break;
            }
            let Some((conn, read)) = self.tcp.read_next() else {
                break;
            };
            match read {
                Read::Data(n) => {
                    let data = self.tcp.read_buf(n);
                    self.broker.handle_input(now, Input::Bytes { conn, data });
                    self.drain();
                    self.pause_if_full(conn);
                }
                Read::Gone => self.slow.push(conn),
            }
        }
    }

    /// Stop reading from `conn` while the broker holds as much of its input as it will before
    /// a pending login is decided ([`Broker::wants_input`]); the decision resumes it.
    fn pause_if_full(&mut self, conn: ConnId) {
        if !self.broker.wants_input(conn) {
            self.tcp.pause(conn);
            if let Some(outbox) = self.outboxes.get(&conn) {
                outbox.pause_reading();
            }
        }
    }

    /// Close `conn` at once, dropping what is queued for it; whether it was open.
    fn kill(&mut self, conn: ConnId) -> bool {
        if self.tcp.remove(conn) {
            return true;
        }
        match self.outboxes.remove(&conn) {
            Some(outbox) => {
                outbox.kill();
                true
            }
            None => false,
        }
    }

    /// Tell the broker which congested connections have written enough of their backlog to
    /// take QoS 0 messages again (or are gone).
    fn release_drained(&mut self) {
        let now = self.clock.now();
        let low = self.write_limits.qos0_max_bytes / 2;
        let (broker, tcp, outboxes) = (&mut self.broker, &self.tcp, &self.outboxes);
        self.congested
            .retain(|&conn| match queued(tcp, outboxes, conn) {
                Some(queued) if queued > low => true,
                Some(_) => {
                    debug!(
                        conn = conn.0,
                        "write backlog drained: QoS 0 messages resume"
                    );
                    broker.handle_input(now, Input::Drained { conn });
                    false
                }
                None => false,
            });
    }

    /// Tell the broker which congested links have written enough of their queue to take QoS 0
    /// forwards again. Links that ended need no word: the core starts every session uncongested.
    fn release_drained_links(&mut self) {
        let now = self.clock.now();
        let (broker, links) = (&mut self.broker, &mut self.links);
        self.congested_links
            .retain(|peer| match links.get_mut(peer) {
                Some(link) if link.congested => {
                    if !link.writer.drained() {
                        return true;
                    }
                    link.congested = false;
                    info!(peer = %peer, "link session drained: QoS 0 forwards resume");
                    broker.handle_input(now, Input::PeerDrained { peer: peer.clone() });
                    false
                }
                _ => false,
            });
    }

    fn next_wake(&mut self) -> Option<tokio::time::Instant> {
        let now = self.clock.now();
        let broker = self
            .broker
            .poll_timeout()
            .map(|at| tokio::time::Instant::now() + Duration::from_millis(at.millis_since(now)));
        let sync = self.store.sync_due().map(tokio::time::Instant::from_std);
        let close = self.tcp.next_deadline().map(tokio::time::Instant::from_std);
        let commit = self.commit_due.map(tokio::time::Instant::from_std);
        [broker, sync, close, commit].into_iter().flatten().min()
    }

    /// A new connection for the broker.
    fn accept(&mut self, now: Timestamp, info: ConnInfo) -> ConnId {
        let peer = tracing::enabled!(tracing::Level::DEBUG)
            .then(|| info.remote_addr.clone())
            .flatten();
        let conn = self.broker.accept(now, info);
        debug!(conn = conn.0, peer, "connection accepted");
        conn
    }

    fn handle(&mut self, msg: ToEngine) {
        let now = self.clock.now();
        match msg {
            ToEngine::AcceptTcp {
                info,
                socket,
                permit,
            } => {
                let conn = self.accept(now, info);
                if let Err(e) = self.tcp.add(conn, socket, permit) {
                    warn!(conn = conn.0, error = %e, "cannot watch a TCP connection");
                    self.broker.handle_input(now, Input::Closed { conn });
                }
                self.drain();
            }
            ToEngine::Accept {
                info,
                outbox,
                reply,
            } => {
                let conn = self.accept(now, info);
                if reply.send(conn).is_ok() {
                    self.outboxes.insert(conn, outbox);
                } else {
                    // The connection task is gone already.
                    self.broker.handle_input(now, Input::Closed { conn });
                }
                self.drain();
            }
            ToEngine::Bytes { conn, data } => {
                self.broker
                    .handle_input(now, Input::Bytes { conn, data: &data });
                self.drain();
                if let Some(outbox) = self.outboxes.get(&conn) {
                    outbox.fed(data.len());
                }
                self.pause_if_full(conn);
            }
            ToEngine::Closed { conn } => {
                self.broker.handle_input(now, Input::Closed { conn });
                self.drain();
                // The broker may have forgotten the connection already (no Close output).
                self.slow.push(conn);
            }
            ToEngine::AuthDecision { conn, outcome } => {
                self.broker
                    .handle_input(now, Input::AuthDecision { conn, outcome });
                self.drain();
                if self.broker.wants_input(conn) {
                    self.tcp.resume(conn);
                    if let Some(outbox) = self.outboxes.get(&conn) {
                        outbox.resume_reading();
                    }
                }
            }
            ToEngine::Stats(reply) => {
                let _ = reply.send(self.broker.stats());
            }
            ToEngine::Clients(reply) => {
                let _ = reply.send(self.broker.clients());
            }
            ToEngine::ClientsPage { page, reply } => {
                let _ = reply.send(self.broker.clients_page(
                    page.offset,
                    page.limit,
                    page.filter.as_deref(),
                ));
            }
            ToEngine::SubscriptionsPage { page, reply } => {
                let _ = reply.send(self.broker.subscriptions_page(
                    page.offset,
                    page.limit,
                    page.filter.as_deref(),
                ));
            }
            ToEngine::EndSession { client_id, reply } => {
                let ended = self.broker.end_client_session(
                    now,
                    &client_id,
                    ReasonCode::ADMINISTRATIVE_ACTION,
                );
                self.drain();
                let _ = reply.send(ended);
            }
            ToEngine::Kick { client_id, reply } => {
                let was = self.broker.disconnect_client(
                    now,
                    &client_id,
                    ReasonCode::ADMINISTRATIVE_ACTION,
                );
                self.drain();
                let _ = reply.send(was);
            }
            ToEngine::Publish { message, reply } => {
                let n = self.broker.publish(now, message);
                self.drain();
                let _ = reply.send(n);
            }
            ToEngine::PeerUp {
                peer,
                session,
                writer,
            } => {
                if self.broker.is_leaf(&peer) {
                    // A leaf links at the edge-link listener only.
                    warn!(peer = %peer, "a leaf of this node opened a mesh session: ended");
                    writer.kill.notify_one();
                    return;
                }
                self.session_up(now, peer, session, writer, false);
            }
            ToEngine::LeafUp {
                leaf,
                session,
                writer,
                accepted,
            } => {
                // The core refuses a name that is not a leaf's (`edge-…`; mesh members are
                // named by their peer ids, which never are), this node's and a member's.
                let added = self.broker.add_leaf(&leaf);
                let _ = accepted.send(added.is_ok());
                if let Err(why) = added {
                    warn!(leaf = %leaf, %why, "edge link refused");
                    return;
                }
                self.session_up(now, leaf, session, writer, true);
            }
            ToEngine::PeerFrame { peer, frame } => {
                self.broker
                    .handle_input(now, Input::PeerFrame { peer, frame });
                self.drain();
            }
            ToEngine::PeerDown { peer, session } => {
                if self.links.get(&peer).is_some_and(|l| l.session == session) {
                    self.links.remove(&peer);
                    info!(peer = %peer, session, "link session down");
                    self.broker.handle_input(now, Input::PeerDown { peer });
                    self.drain();
                }
            }
            ToEngine::BroadcastDirect(frame) => self.write_to_every_peer(&frame),
            ToEngine::Peers(reply) => {
                let _ = reply.send(self.broker.peers());
            }
            ToEngine::ForgetPeer { peer, reply } => {
                let result = self.broker.forget_peer(&peer);
                self.drain();
                let _ = reply.send(result);
            }
            ToEngine::Routes { peer, reply } => {
                let routes = match peer {
                    Some(p) => self.broker.replicated_routes(&p),
                    None => {
                        let mut r = self.broker.route_set();
                        r.sort();
                        r
                    }
                };
                let _ = reply.send(routes);
            }
            ToEngine::SetHooks { hooks, reply } => {
                self.broker.set_hooks(hooks.authenticator, hooks.authorizer);
                let _ = reply.send(());
            }
            ToEngine::SetResidency {
                rules,
                node_regions,
            } => {
                self.broker.set_residency(rules);
                self.broker.set_node_regions(node_regions);
            }
            ToEngine::Shutdown => self.stopping = true,
        }
    }

    /// A link session to `peer` (a mesh member, or a leaf) started; it replaces any earlier one.
    fn session_up(
        &mut self,
        now: Timestamp,
        peer: NodeId,
        session: u64,
        writer: PeerWriter,
        leaf: bool,
    ) {
        let old = self.links.insert(
            peer.clone(),
            PeerLink {
                session,
                writer,
                leaf,
                congested: false,
                batch_frames: 0,
                batch_bytes: 0,
            },
        );
        if let Some(old) = old {
            // A new session replaces the old one: the core re-sends what was in flight.
            old.writer.kill.notify_one();
            self.broker
                .handle_input(now, Input::PeerDown { peer: peer.clone() });
        }
        info!(peer = %peer, session, leaf, "link session up");
        self.broker.handle_input(now, Input::PeerUp { peer });
        self.drain();
    }

    fn encode_frame(&mut self, frame: &Frame) -> Option<Bytes> {
        self.frame_buf.clear();
        match link::encode(frame, &mut self.frame_buf) {
            Ok(()) => Some(self.frame_buf.split().freeze()),
            Err(e) => {
                error!(frame = frame.name(), error = %e, "cannot encode a link frame");
                None
            }
        }
    }

    /// Queue an encoded frame on a peer's session; a session whose queue is full is cut (QoS 0
    /// forwards stop well before, at the congestion mark: [`Engine::note_frame`]).
    fn write_to_peer(&mut self, peer: &NodeId, frame: Bytes) {
        let Some(link) = self.links.get_mut(peer) else {
            return; // No session: the core re-sends what matters on the next one.
        };
        match link.writer.send(frame) {
            Ok(()) => {}
            Err(SendError::Full) if !self.cut.contains(peer) => {
                warn!(peer = %peer, "link session queue full: cutting the session");
                self.counters
                    .link_sessions_cut
                    .fetch_add(1, Ordering::Relaxed);
                self.cut.push(peer.clone());
            }
            // Cut already, or the session ended by itself (its PeerDown is on its way).
            Err(_) => {}
        }
    }

    fn broadcast(&mut self, frame: &Frame) {
        let Some(bytes) = self.encode_frame(frame) else {
            return;
        };
        if let Some(mesh) = &self.mesh
            && mesh.try_send(MeshCmd::Gossip(bytes.clone())).is_ok()
        {
            return;
        }
        self.write_to_every_peer(&bytes);
    }

    /// Queue an encoded frame on every open session to a mesh member.
    fn write_to_every_peer(&mut self, frame: &Bytes) {
        let peers: Vec<NodeId> = self
            .links
            .iter()
            .filter(|(_, l)| !l.leaf)
            .map(|(p, _)| p.clone())
            .collect();
        for peer in peers {
            self.write_to_peer(&peer, frame.clone());
        }
    }

    /// Take the broker's outputs for the end of the batch. Bytes and frames they add to a
    /// connection's or a peer's backlog count at once: past its mark the broker is told before
    /// the next input, not after the batch, so that a batch cannot overshoot the mark by more
    /// than one input's worth.
    fn drain(&mut self) {
        while let Some(output) = self.broker.poll_output() {
            match &output {
                Output::Send { conn, data } => self.note_send(*conn, data.len()),
                Output::ToPeer { peer, frame } => self.note_frame(peer, frame),
                _ => {}
            }
            self.outputs.push(output);
        }
    }

    /// `len` more bytes for `conn` in this batch: past [`WriteLimits::qos0_max_bytes`] with
    /// what it has queued, the broker drops QoS 0 messages for it ([`Input::Congested`]).
    fn note_send(&mut self, conn: ConnId, len: usize) {
        self.turn_bytes += len;
        let pending = self.batch_bytes.entry(conn).or_default();
        *pending += len;
        let pending = *pending;
        let Some(queued) = queued(&self.tcp, &self.outboxes, conn) else {
            return;
        };
        let backlog = queued + pending;
        if backlog > self.write_limits.qos0_max_bytes && self.congested.insert(conn) {
            debug!(
                conn = conn.0,
                backlog, "write backlog past its mark: QoS 0 messages are dropped"
            );
            let now = self.clock.now();
            self.broker.handle_input(now, Input::Congested { conn });
        }
    }

    /// One more frame for `peer` in this batch: past the link's congestion mark with what its
    /// session has queued, the broker drops QoS 0 forwards to it ([`Input::PeerCongested`]).
    fn note_frame(&mut self, peer: &NodeId, frame: &Frame) {
        let Some(link) = self.links.get_mut(peer) else {
            return;
        };
        link.batch_frames += 1;
        link.batch_bytes += link::encoded_len(frame).unwrap_or(0);
        if link.congested
            || !link
                .writer
                .congested_with(link.batch_frames, link.batch_bytes)
        {
            return;
        }
        link.congested = true;
        info!(
            peer = %peer,
            "link session congested: QoS 0 forwards dropped until it drains"
        );
        self.congested_links.push(peer.clone());
        let now = self.clock.now();
        self.broker
            .handle_input(now, Input::PeerCongested { peer: peer.clone() });
    }

    /// Commit the batch's records, then hand out bytes and closes, and write to the TCP
    /// sockets.
    fn flush(&mut self) -> Result<(), StorageError> {
        loop {
            if self.outputs.is_empty() && self.slow.is_empty() && self.cut.is_empty() {
                // What the turn queued, and what waited for room in a socket that has some now.
                self.tcp.write(&mut self.slow);
                if self.slow.is_empty() {
                    self.end_batch();
                    return Ok(());
                }
            }
            let mut outputs = std::mem::take(&mut self.outputs);
            // The turn's acknowledgements of forwards received: one frame per peer.
            coalesce_forward_acks(&mut outputs);
            self.records.clear();
            for out in &outputs {
                if let Output::Persist { key, value } = out {
                    self.records.push((key.clone(), value.clone()));
                }
            }
            if !self.records.is_empty() {
                let may_wait = self
                    .records
                    .iter()
                    .all(|(key, value)| record_may_wait(key, value.as_ref()));
                let windowed = !self.commit_window.is_zero() && self.store.commit_syncs();
                if may_wait {
                    // Acknowledged forwards let go of: no fsync of their own.
                    self.store.apply_deferred(&self.records)?;
                } else if windowed || self.commit_due.is_some() {
                    // The window's fsync makes it durable, with the others it holds.
                    self.store.apply_deferred(&self.records)?;
                    let now = std::time::Instant::now();
                    if self.commit_due.is_none() {
                        self.commit_due = Some(now + self.commit_window);
                        self.window_records = 0;
                    }
                    self.window_records += self.records.len();
                    if self.window_records >= COMMIT_WINDOW_RECORDS {
                        // Closed at the end of the turn.
                        self.commit_due = Some(now);
                    }
                } else {
                    self.store.apply(&self.records)?;
                }
                if self.store.checkpoint_due() {
                    // Written to the B-tree: tens of milliseconds.
                    self.store.checkpoint()?;
                }
                self.counters
                    .storage_commits
                    .fetch_add(1, Ordering::Relaxed);
                self.counters
                    .storage_cache_evictions
                    .store(self.store.cache_evictions(), Ordering::Relaxed);
                self.counters
                    .storage_checkpoints
                    .store(self.store.checkpoints(), Ordering::Relaxed);
            }
            if self.commit_due.is_some() {
                // Their records are written; they go out once the window's fsync is done.
                for out in outputs.drain(..) {
                    self.held_bytes += match &out {
                        Output::Persist { .. } => continue,
                        Output::Send { data, .. } => data.len(),
                        Output::ToPeer { frame, .. } | Output::Broadcast { frame } => {
                            link::encoded_len(frame).unwrap_or(0)
                        }
                        _ => 0,
                    };
                    self.held.push(out);
                }
                if self.held.len() >= HELD_OUTPUTS_MAX || self.held_bytes >= HELD_BYTES_MAX {
                    // Closed at the end of the turn.
                    self.commit_due = Some(std::time::Instant::now());
                }
            }
            for out in outputs.drain(..) {
                match out {
                    Output::Send { conn, data } => self.send(conn, data),
                    Output::Close { conn } => {
                        if let Some(outbox) = self.outboxes.remove(&conn) {
                            outbox.close();
                        } else {
                            self.tcp.close(conn, std::time::Instant::now());
                        }
                    }
                    Output::Persist { .. } => {}
                    Output::Event(event) => {
                        if let Event::PeerForgotten { peer, .. } = &event
                            && let Some(mesh) = &self.mesh
                        {
                            // Discovery stops dialling it (a configured peer is dialled still).
                            let _ = mesh.try_send(MeshCmd::Forget(peer.clone()));
                        }
                        log_event(&event);
                    }
                    Output::CutPeer { peer } => {
                        if self.links.contains_key(&peer) && !self.cut.contains(&peer) {
                            self.cut.push(peer);
                        }
                    }
                    Output::ToPeer { peer, frame } => {
                        if self.links.contains_key(&peer)
                            && let Some(bytes) = self.encode_frame(&frame)
                        {
                            self.write_to_peer(&peer, bytes);
                        }
                    }
                    Output::Broadcast { frame } => self.broadcast(&frame),
                }
            }
            // Sessions that could not keep up: the core re-sends on the next one.
            for peer in std::mem::take(&mut self.cut) {
                if let Some(link) = self.links.remove(&peer) {
                    link.writer.kill.notify_one();
                    let now = self.clock.now();
                    self.broker.handle_input(now, Input::PeerDown { peer });
                    self.drain();
                }
            }
            // Connections that went away (or were cut off as slow consumers) during the batch.
            let now = self.clock.now();
            for conn in std::mem::take(&mut self.slow) {
                if self.kill(conn) {
                    self.broker.handle_input(now, Input::Closed { conn });
                    self.drain();
                }
            }
            // The list keeps its room for the next batch, unless the closes above queued more.
            if self.outputs.is_empty() {
                self.outputs = outputs;
            }
        }
    }

    /// Close the commit window: one fsync makes the journal's batches since it opened
    /// durable, then what waited for them goes out, in order.
    fn commit_held(&mut self) -> Result<(), StorageError> {
        if self.commit_due.take().is_none() {
            return Ok(());
        }
        self.store.sync()?;
        self.held_bytes = 0;
        let mut held = std::mem::take(&mut self.held);
        held.append(&mut self.outputs);
        self.outputs = held;
        self.flush()
    }

    /// What the batch noted for each connection and peer is in their queues now.
    fn end_batch(&mut self) {
        if !self.batch_bytes.is_empty() {
            self.batch_bytes.clear();
        }
        self.turn_bytes = 0;
        for link in self.links.values_mut() {
            link.batch_frames = 0;
            link.batch_bytes = 0;
        }
    }

    /// Hand bytes to a connection: queued for its socket, written at the end of the turn, or
    /// for its task.
    fn send(&mut self, conn: ConnId, data: Bytes) {
        // Already cut off in this batch: drop the rest, and count the connection once.
        if self.slow.contains(&conn) {
            return;
        }
        let Some(queued) = queued(&self.tcp, &self.outboxes, conn) else {
            return;
        };
        let queued = queued + data.len();
        if queued > self.write_limits.max_bytes {
            warn!(
                conn = conn.0,
                queued, "slow consumer: write buffer full, disconnecting"
            );
            self.counters
                .slow_consumer_disconnects
                .fetch_add(1, Ordering::Relaxed);
            self.slow.push(conn);
        } else if let Some(outbox) = self.outboxes.get(&conn) {
            outbox.push(data);
        } else {
            self.tcp.push(conn, data);
        }
    }
}

impl Drop for Engine {
    /// Connections still open when the broker task ends (a storage failure, say) are closed
    /// rather than left waiting for output that will never come.
    fn drop(&mut self) {
        for outbox in self.outboxes.values() {
            outbox.kill();
        }
    }
}

/// Bytes handed to `conn` and not yet written to its socket; `None` if it is not open.
fn queued(tcp: &TcpConns, outboxes: &ConnMap<ConnId, Arc<Outbox>>, conn: ConnId) -> Option<usize> {
    tcp.queued(conn)
        .or_else(|| outboxes.get(&conn).map(|o| o.queued()))
}

fn log_event(event: &Event) {
    match event {
        Event::ClientConnected {
            conn,
            client_id,
            username,
            protocol,
            session_present,
        } => info!(
            conn = conn.0,
            client_id,
            username = username.as_deref(),
            protocol = ?protocol,
            session_present,
            "client connected"
        ),
        Event::ConnectRefused {
            conn,
            client_id,
            reason,
        } => {
            info!(conn = conn.0, client_id = client_id.as_deref(), reason = %format!("{:#04x}", reason.0), "connect refused")
        }
        Event::ClientDisconnected {
            conn,
            client_id,
            cause,
        } => info!(conn = conn.0, client_id, cause = ?cause, "client disconnected"),
        Event::ConnectionClosed {
            conn,
            reason,
            detail,
        } => {
            debug!(conn = conn.0, reason = %format!("{:#04x}", reason.0), detail, "connection closed")
        }
        Event::SessionEnded { client_id } => debug!(client_id, "session ended"),
        Event::SessionMoved { client_id, to } => {
            info!(client_id, %to, "session moved to the node that took its client id over")
        }
        Event::SessionArrived { client_id } => {
            info!(client_id, "session arrived from another node")
        }
        Event::RouteAdded { filter } => debug!(filter, "route added"),
        Event::RouteRemoved { filter } => debug!(filter, "route removed"),
        Event::PeerFault { peer, fault } => {
            warn!(%peer, fault = ?fault, "refused a frame from a peer (reported once per peer and kind; counted in peer_frames_refused)")
        }
        Event::PeerForgotten {
            peer,
            reason,
            routes,
            dropped_messages,
        } => {
            info!(%peer, reason = ?reason, routes, dropped_messages, "peer forgotten: its routes withdrawn, what waited for it dropped")
        }
    }
}

/// Log a fatal storage error (the broker stops rather than acknowledge what it cannot store).
pub fn log_storage_failure(e: &StorageError) {
    error!(error = %e, "storage failure: stopping the broker");
}

#[cfg(test)]
mod tests {
    use meridian_core::broker::AllowAll;
    use tokio::sync::oneshot;

    use super::*;
    use crate::storage::SyncPolicy;
    use crate::transport::outbox::End;

    const TEST_LIMITS: WriteLimits = WriteLimits {
        max_bytes: 1 << 20,
        qos0_max_bytes: 1 << 18,
    };

    fn store(dir: &std::path::Path) -> Store {
        Store::open(
            dir,
            SyncPolicy::Always,
            Duration::from_secs(1),
            crate::storage::MIN_CACHE_BYTES,
            crate::storage::MIN_JOURNAL_BYTES,
        )
        .unwrap()
    }

    fn tcp_conns() -> TcpConns {
        crate::transport::tcp::new().unwrap().1
    }

    fn allow_all() -> DaemonBroker {
        let config = meridian_core::Config::default();
        Broker::with_auth(config, Timestamp(0), Box::new(AllowAll), Box::new(AllowAll))
    }

    #[test]
    fn connections_still_open_are_closed_when_the_broker_task_ends() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let mut engine =
            Engine::new(allow_all(), store, TEST_LIMITS, Arc::default(), tcp_conns()).unwrap();
        let outbox = Outbox::new();
        let (reply, _conn) = oneshot::channel();
        engine.handle(ToEngine::Accept {
            info: ConnInfo::default(),
            outbox: outbox.clone(),
            reply,
        });
        drop(engine);
        let mut out = std::collections::VecDeque::new();
        assert_eq!(outbox.take(&mut out), Some(End::Kill));
    }

    /// A link session whose queue is full is cut once, at the end of the batch: its task is
    /// told to end, what it had queued stays in order, and nothing more goes to it.
    #[tokio::test]
    async fn a_link_session_that_cannot_keep_up_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let mut engine =
            Engine::new(allow_all(), store, TEST_LIMITS, Arc::default(), tcp_conns()).unwrap();
        let peer = NodeId::new("far-away").unwrap();
        let (writer, mut frames, _) = PeerWriter::channel(crate::mesh::queue::LinkLimits {
            queue_frames: 2,
            ..crate::mesh::queue::LinkLimits::default()
        });
        let kill = writer.kill.clone();
        engine.handle(ToEngine::PeerUp {
            peer: peer.clone(),
            session: 1,
            writer,
        });
        for frame in ["one", "two", "three", "four"] {
            engine.write_to_peer(&peer, Bytes::from_static(frame.as_bytes()));
        }
        assert_eq!(
            engine.cut,
            std::slice::from_ref(&peer),
            "cut once, however many frames overflow"
        );
        engine.flush().unwrap();
        assert!(!engine.links.contains_key(&peer), "the session is gone");
        tokio::time::timeout(Duration::from_secs(5), kill.notified())
            .await
            .expect("the session's task is told to end");
        engine.write_to_peer(&peer, Bytes::from_static(b"after"));
        assert_eq!(frames.recv().await.as_deref(), Some(&b"one"[..]));
        assert_eq!(frames.recv().await.as_deref(), Some(&b"two"[..]));
        assert!(frames.try_recv().is_err(), "nothing after the cut");
    }

    /// Past half its frames a link is congested, once, as soon as the batch's outputs show it;
    /// at a quarter, written by its session, it is drained at the next turn.
    #[tokio::test]
    async fn a_link_is_congested_past_its_mark_and_drained_below_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let mut engine =
            Engine::new(allow_all(), store, TEST_LIMITS, Arc::default(), tcp_conns()).unwrap();
        let peer = NodeId::new("thin").unwrap();
        let (writer, mut frames, written) = PeerWriter::channel(crate::mesh::queue::LinkLimits {
            queue_frames: 8,
            ..crate::mesh::queue::LinkLimits::default()
        });
        engine.handle(ToEngine::PeerUp {
            peer: peer.clone(),
            session: 1,
            writer,
        });
        // Two frames queued from an earlier batch, then a batch of more.
        for _ in 0..2 {
            engine.write_to_peer(&peer, Bytes::from_static(b"frame"));
        }
        for _ in 0..2 {
            engine.note_frame(&peer, &Frame::KeepAlive);
        }
        assert!(
            !engine.links[&peer].congested,
            "half the frames is the mark"
        );
        for _ in 0..3 {
            engine.note_frame(&peer, &Frame::KeepAlive);
        }
        assert!(
            engine.links[&peer].congested,
            "told before the batch is written"
        );
        assert_eq!(engine.congested_links, vec![peer.clone()], "told once");
        engine.end_batch();
        for _ in 0..5 {
            engine.write_to_peer(&peer, Bytes::from_static(b"frame"));
        }
        // The session writes all but three.
        for _ in 0..4 {
            let frame = frames.recv().await.unwrap();
            written.fetch_sub(frame.len(), Ordering::AcqRel);
        }
        engine.release_drained_links();
        assert!(engine.links[&peer].congested, "three left: above a quarter");
        let frame = frames.recv().await.unwrap();
        written.fetch_sub(frame.len(), Ordering::AcqRel);
        engine.release_drained_links();
        assert!(!engine.links[&peer].congested);
        assert!(engine.congested_links.is_empty());
        assert!(engine.cut.is_empty());
    }

    /// The bytes of one packet, as a client would send them (MQTT 5.0).
    fn wire(packet: meridian_core::codec::Packet) -> Bytes {
        let mut buf = BytesMut::new();
        meridian_core::codec::encode(&packet, meridian_core::codec::ProtocolVersion::V5, &mut buf)
            .unwrap();
        buf.freeze()
    }

    /// A connection registered with the engine, connected as `client_id`, its outbox empty.
    fn client(engine: &mut Engine, client_id: &str) -> (ConnId, Arc<Outbox>) {
        use meridian_core::codec::{Connect, ConnectProperties, Packet, ProtocolVersion};
        let outbox = Outbox::new();
        let (reply, mut conn) = oneshot::channel();
        engine.handle(ToEngine::Accept {
            info: ConnInfo::default(),
            outbox: outbox.clone(),
            reply,
        });
        let conn = conn.try_recv().unwrap();
        let connect = Connect {
            protocol: ProtocolVersion::V5,
            clean_start: true,
            keep_alive: 0,
            client_id: client_id.to_owned(),
            will: None,
            username: None,
            password: None,
            properties: ConnectProperties::default(),
        };
        engine.handle(ToEngine::Bytes {
            conn,
            data: wire(Packet::Connect(connect)),
        });
        engine.flush().unwrap();
        let mut taken = std::collections::VecDeque::new();
        outbox.take(&mut taken);
        outbox.written(taken.iter().map(Bytes::len).sum());
        (conn, outbox)
    }

    /// A client `sub` subscribed to `filter`, its SUBACK taken from its outbox.
    fn subscriber(engine: &mut Engine, filter: &str) -> (ConnId, Arc<Outbox>) {
        use meridian_core::codec::{Packet, Subscribe, SubscribeFilter};
        let (sub, outbox) = client(engine, "sub");
        engine.handle(ToEngine::Bytes {
            conn: sub,
            data: wire(Packet::Subscribe(Subscribe {
                packet_id: 1,
                filters: vec![SubscribeFilter {
                    filter: filter.to_owned(),
                    options: Default::default(),
                }],
                properties: Default::default(),
            })),
        });
        engine.flush().unwrap();
        assert!(matches!(
            packets(&outbox)[..],
            [meridian_core::codec::Packet::SubAck(_)]
        ));
        (sub, outbox)
    }

    /// A batch that would take a subscriber past its QoS 0 mark tells the broker as soon as
    /// it does: the rest of the batch's QoS 0 messages for it are dropped, not queued.
    #[test]
    fn a_batch_stops_queueing_qos0_at_the_mark_not_after_it() {
        use meridian_core::codec::{Packet, Publish, QoS};
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let mut engine =
            Engine::new(allow_all(), store, TEST_LIMITS, Arc::default(), tcp_conns()).unwrap();
        let (sub, sub_box) = subscriber(&mut engine, "t");
        let acked = sub_box.queued();
        let (publisher, _) = client(&mut engine, "pub");
        const COUNT: usize = 40;
        let payload = Bytes::from(vec![0u8; 16 * 1024]);
        for _ in 0..COUNT {
            let publish = Publish {
                dup: false,
                qos: QoS::AtMostOnce,
                retain: false,
                topic: "t".to_owned(),
                packet_id: None,
                payload: payload.clone(),
                properties: Default::default(),
            };
            engine.handle(ToEngine::Bytes {
                conn: publisher,
                data: wire(Packet::Publish(publish)),
            });
        }
        engine.flush().unwrap();
        let stats = engine.broker.stats();
        let delivered = usize::try_from(stats.messages_sent[0]).unwrap();
        let dropped = usize::try_from(stats.dropped_qos0_congested).unwrap();
        assert_eq!(delivered + dropped, COUNT);
        assert!(dropped > 0, "nothing dropped: {delivered} delivered");
        let backlog = sub_box.queued() - acked;
        assert!(
            backlog <= TEST_LIMITS.qos0_max_bytes + payload.len() + 64,
            "{backlog} bytes queued, past the mark by more than one message"
        );
        assert!(engine.slow.is_empty() && engine.outboxes.contains_key(&sub));
    }

    /// The packets queued on a connection since the last look.
    fn packets(outbox: &Outbox) -> Vec<meridian_core::codec::Packet> {
        use meridian_core::codec::{ProtocolVersion, decode};
        let mut taken = std::collections::VecDeque::new();
        outbox.take(&mut taken);
        let mut buf: BytesMut = taken.iter().flat_map(|b| b.iter().copied()).collect();
        outbox.written(buf.len());
        let mut packets = Vec::new();
        while let Some(p) = decode(&mut buf, ProtocolVersion::V5, u32::MAX).unwrap() {
            packets.push(p);
        }
        packets
    }

    /// With a commit window, what the turns after a commit send waits for one fsync that
    /// makes all their commits durable, and then goes out in order.
    #[test]
    fn turns_in_a_commit_window_share_one_fsync_and_send_after_it() {
        use meridian_core::codec::{Ack, Packet, Publish, QoS};
        let dir = tempfile::tempdir().unwrap();
        let mut engine = Engine::new(
            allow_all(),
            store(dir.path()),
            TEST_LIMITS,
            Arc::default(),
            tcp_conns(),
        )
        .unwrap();
        let (_, sub_box) = subscriber(&mut engine, "#");
        let publishers = [client(&mut engine, "p1"), client(&mut engine, "p2")];
        engine.commit_window = Duration::from_secs(3600);
        let syncs = engine.store.syncs();
        // Retained QoS 1 messages: stored, so their PUBACKs wait for the disk.
        let retained = |topic: &str, packet_id: u16| {
            wire(Packet::Publish(Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: true,
                topic: topic.to_owned(),
                packet_id: Some(packet_id),
                payload: Bytes::from_static(b"m"),
                properties: Default::default(),
            }))
        };
        // One turn each.
        for ((conn, _), topic) in publishers.iter().zip(["a", "b"]) {
            engine.handle(ToEngine::Bytes {
                conn: *conn,
                data: retained(topic, 7),
            });
            engine.flush().unwrap();
            assert!(engine.commit_due.is_some());
            assert_eq!(
                engine.store.syncs(),
                syncs,
                "fsynced before the window closed"
            );
            for (_, outbox) in &publishers {
                assert!(packets(outbox).is_empty(), "acknowledged before the fsync");
            }
            assert!(packets(&sub_box).is_empty(), "delivered before the fsync");
        }
        engine.commit_held().unwrap();
        assert_eq!(engine.store.syncs(), syncs + 1);
        assert!(engine.commit_due.is_none() && engine.held.is_empty());
        for (_, outbox) in &publishers {
            assert!(matches!(
                packets(outbox)[..],
                [Packet::PubAck(Ack { packet_id: 7, .. })]
            ));
        }
        let delivered: Vec<String> = packets(&sub_box)
            .into_iter()
            .filter_map(|p| match p {
                Packet::Publish(p) => Some(p.topic),
                _ => None,
            })
            .collect();
        assert_eq!(delivered, ["a", "b"], "in the order they came");
        // A turn that brings the window's records to COMMIT_WINDOW_RECORDS closes it at its
        // end, however long the window.
        let (conn, _) = publishers[0];
        for i in 0..COMMIT_WINDOW_RECORDS {
            let packet_id = u16::try_from(i + 1).unwrap();
            engine.handle(ToEngine::Bytes {
                conn,
                data: retained(&format!("c/{i}"), packet_id),
            });
        }
        engine.flush().unwrap();
        assert!(
            engine
                .commit_due
                .is_some_and(|at| at <= std::time::Instant::now())
        );
    }
}
