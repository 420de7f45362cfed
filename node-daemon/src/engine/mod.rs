//! The broker task: the one place that owns the [`Broker`] and the [`Store`].
//!
//! It serves plain TCP connections itself: it reads their sockets when they are readable and
//! feeds the bytes to the core. Everything else reaches it as [`ToEngine`] messages over a
//! bounded channel (a full channel makes senders wait: back-pressure): the bytes of TLS and
//! WebSocket connections, which have a task each, frames from peer nodes, requests from admin
//! HTTP, what the cluster policy puts in force. It runs the core's drive loop: in each turn,
//! take up to [`MAX_BATCH`] messages and [`READS_PER_TURN`] reads, feed each and drain every
//! output, commit all `Persist` records of the turn in one transaction, and only then hand out
//! the bytes: to TCP sockets, written at the end of the turn, to the other connections'
//! outboxes and to the link sessions. Then it waits for a socket, a message or the broker's
//! deadline.
//!
//! Its rooms, each with one owner:
//! - [`conns`]: the client connections and their write backlogs;
//! - [`links`]: the link sessions to peer nodes and leaves, and their congestion;
//! - [`commit`]: the commit window, which lets the commits of a few milliseconds share one
//!   fsync;
//! - [`log`]: what it logs of the broker's events.
//!
//! Every message that changes the broker is followed by a drain, and nothing is fed to the
//! broker while it is drained: what the outputs show (a backlog past its mark) is fed once
//! the drain is over.
//!
//! A message between plain TCP clients is read, routed and written within one turn of one
//! task, without a hand-off. The task runs on the broker thread ([`crate::broker_thread`]),
//! beside the region mesh: what it waits for (an fsync, a route snapshot from a peer) holds up
//! only the mesh, which waits for it anyway.

mod commit;
mod conns;
mod links;
pub mod log;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use meridian_core::broker::Durability;
use meridian_core::codec::ReasonCode;
use meridian_core::link::Frame;
use meridian_core::routes::NodeId;
use meridian_core::{Broker, ConnId, ConnInfo, Event, Input, Output, Timestamp};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;
use tracing::{debug, error, info, warn};

use crate::clock::Clock;
use crate::mailbox::{
    AdminRequest, ConnEvent, DaemonCounters, LinkEvent, MemberGate, MeshCmd, PeerWriter,
    PolicyChange, SendAuthenticator, SendAuthorizer, ToEngine,
};
use crate::storage::{StorageError, Store};
use crate::transport::tcp::{Poller, Read, TcpConns};

use self::commit::{CommitWindow, Source};
use self::conns::Conns;
use self::links::Links;

pub use self::conns::WriteLimits;

/// Inputs taken per turn of the loop before outputs are committed and sent.
pub const MAX_BATCH: usize = 256;

/// Reads from plain TCP sockets per turn of the loop, each at most
/// [`crate::transport::tcp::READ_BYTES`].
pub const READS_PER_TURN: usize = 256;

/// Bytes for connections after which a turn reads no more: what it routed is written before
/// more is read, so that subscribers are fed while publishers are read.
pub const TURN_OUTPUT_BYTES: usize = 1 << 20;

/// How far the task's timer may be from the next deadline before it is moved. Deadlines are
/// recomputed from the clock every turn and drift by microseconds; broker timers count in
/// milliseconds.
const WAKE_SLACK: Duration = Duration::from_millis(1);

/// The broker as the daemon runs it: with hooks that are `Send`, so that the broker, built on
/// the blocking pool, may run on the broker thread.
pub type DaemonBroker = Broker<SendAuthenticator, SendAuthorizer>;

/// The broker task's state.
pub struct Engine {
    broker: DaemonBroker,
    store: Store,
    clock: Clock,
    conns: Conns,
    links: Links,
    commit: CommitWindow,
    counters: Arc<DaemonCounters>,
    /// The batch's outputs, in order, taken from the broker as each input was drained.
    outputs: Vec<Output>,
    /// The batch's records, for one commit.
    records: Vec<(Bytes, Option<Bytes>)>,
    /// Whose input made the batch's records that must be durable before what follows goes
    /// out (with the commit window on): what decides whether its commit waits for company.
    sources: Vec<Source>,
    /// Where members must be certified: the peers the broker takes as members, for the
    /// mesh's policy streams.
    members: Option<MemberGate>,
    stopping: bool,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("broker", &self.broker)
            .field("connections", &self.conns.count())
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
            conns: Conns::new(tcp, write_limits, counters.clone()),
            links: Links::new(counters.clone()),
            commit: CommitWindow::default(),
            counters,
            outputs: Vec::new(),
            records: Vec::new(),
            members: None,
            sources: Vec::new(),
            stopping: false,
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
        self.commit = CommitWindow::new(window);
        self
    }

    /// Send broadcasts to the region mesh (cluster mode; the broker must have cluster enabled).
    pub fn with_mesh(mut self, mesh: mpsc::Sender<MeshCmd>) -> Self {
        self.links.set_mesh(mesh);
        self
    }

    /// Tell `members` which peers the broker takes as members, as it hears their hellos.
    pub fn with_members(mut self, members: MemberGate) -> Self {
        self.members = Some(members);
        self
    }

    /// The drive loop, with `poller` watching the epoll set of the engine's TCP connections.
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
            let busy = self.conns.tcp.has_readable();
            let first = tokio::select! {
                biased;
                events = poller.wait() => {
                    match events {
                        Ok(events) => self.conns.tcp.on_events(events),
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
            self.release_drained();
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
            self.conns.tcp.expire(std::time::Instant::now());
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
                .commit
                .due()
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
            if !rx.is_empty() || self.conns.tcp.has_readable() {
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
        if !self.conns.tcp.has_readable() {
            return;
        }
        let now = self.clock.now();
        for _ in 0..READS_PER_TURN {
            if self.conns.turn_is_full() {
                break;
            }
            let Some((conn, read)) = self.conns.tcp.read_next() else {
                break;
            };
            match read {
                Read::Data(n) => {
                    let data = self.conns.tcp.read_buf(n);
                    let from = self.outputs.len();
                    self.broker.handle_input(now, Input::Bytes { conn, data });
                    self.drain();
                    self.note_source(Source::Conn(conn), from);
                    self.pause_if_full(conn);
                }
                Read::Gone => self.conns.mark_gone(conn),
            }
        }
    }

    /// Stop reading from `conn` while the broker holds as much of its input as it will before
    /// a pending login is decided ([`Broker::wants_input`]); the decision resumes it.
    fn pause_if_full(&mut self, conn: ConnId) {
        if !self.broker.wants_input(conn) {
            self.conns.pause(conn);
        }
    }

    /// Tell the broker which congested connections and links have written enough of their
    /// backlog to take QoS 0 messages again.
    fn release_drained(&mut self) {
        let conns = self.conns.take_drained();
        let peers = self.links.take_drained();
        if conns.is_empty() && peers.is_empty() {
            return;
        }
        let now = self.clock.now();
        for conn in conns {
            self.broker.handle_input(now, Input::Drained { conn });
        }
        for peer in peers {
            self.broker.handle_input(now, Input::PeerDrained { peer });
        }
        self.drain();
    }

    fn next_wake(&mut self) -> Option<tokio::time::Instant> {
        let now = self.clock.now();
        let broker = self
            .broker
            .poll_timeout()
            .map(|at| tokio::time::Instant::now() + Duration::from_millis(at.millis_since(now)));
        let sync = self.store.sync_due().map(tokio::time::Instant::from_std);
        let close = self
            .conns
            .tcp
            .next_deadline()
            .map(tokio::time::Instant::from_std);
        let commit = self.commit.due().map(tokio::time::Instant::from_std);
        [broker, sync, close, commit].into_iter().flatten().min()
    }

    /// One message; whatever it changed in the broker is drained.
    fn handle(&mut self, msg: ToEngine) {
        let now = self.clock.now();
        match msg {
            ToEngine::Conn(event) => self.on_conn(now, event),
            ToEngine::Link(event) => self.on_link(now, event),
            ToEngine::Admin(request) => self.on_admin(now, request),
            ToEngine::Policy(change) => self.on_policy(now, change),
            ToEngine::Shutdown => self.stopping = true,
        }
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

    fn on_conn(&mut self, now: Timestamp, event: ConnEvent) {
        match event {
            ConnEvent::AcceptTcp {
                info,
                socket,
                permit,
            } => {
                let conn = self.accept(now, info);
                if let Err(e) = self.conns.tcp.add(conn, socket, permit) {
                    warn!(conn = conn.0, error = %e, "cannot watch a TCP connection");
                    self.broker.handle_input(now, Input::Closed { conn });
                }
                self.drain();
            }
            ConnEvent::Accept {
                info,
                outbox,
                reply,
            } => {
                let conn = self.accept(now, info);
                if reply.send(conn).is_ok() {
                    self.conns.add_task(conn, outbox);
                } else {
                    // The connection task is gone already.
                    self.broker.handle_input(now, Input::Closed { conn });
                }
                self.drain();
            }
            ConnEvent::Bytes { conn, data } => {
                let from = self.outputs.len();
                self.broker
                    .handle_input(now, Input::Bytes { conn, data: &data });
                self.drain();
                self.note_source(Source::Conn(conn), from);
                self.conns.fed(conn, data.len());
                self.pause_if_full(conn);
            }
            ConnEvent::Closed { conn } => {
                self.broker.handle_input(now, Input::Closed { conn });
                self.drain();
                self.commit.forget(&Source::Conn(conn));
                // The broker may have forgotten the connection already (no Close output).
                self.conns.mark_gone(conn);
            }
            ConnEvent::AuthDecision { conn, outcome } => {
                self.broker
                    .handle_input(now, Input::AuthDecision { conn, outcome });
                self.drain();
                if self.broker.wants_input(conn) {
                    self.conns.resume(conn);
                }
            }
        }
    }

    fn on_link(&mut self, now: Timestamp, event: LinkEvent) {
        match event {
            LinkEvent::PeerUp {
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
            LinkEvent::LeafUp {
                leaf,
                scope,
                session,
                writer,
                accepted,
            } => {
                // The core refuses a name that is not a leaf's (`edge-…`; mesh members are
                // named by their peer ids, which never are), this node's and a member's.
                let added = self.broker.add_leaf(now, &leaf);
                if added.is_ok() {
                    self.broker.scope_leaf(now, &leaf, scope);
                }
                self.drain();
                let _ = accepted.send(added.is_ok());
                if let Err(why) = added {
                    warn!(leaf = %leaf, %why, "edge link refused");
                    return;
                }
                self.session_up(now, leaf, session, writer, true);
            }
            LinkEvent::Frames { peer, frames } => {
                let hello = frames.iter().any(|f| matches!(f, Frame::Hello { .. }));
                let heard = hello.then(|| peer.clone());
                let from = self.outputs.len();
                let source = Source::Peer(peer.clone());
                self.broker
                    .handle_input(now, Input::PeerFrames { peer, frames });
                self.drain();
                self.note_source(source, from);
                if let (Some(members), Some(peer)) = (&self.members, heard) {
                    members.set(&peer, self.broker.is_member(&peer));
                }
            }
            LinkEvent::Down { peer, session } => {
                if self.links.down(&peer, session) {
                    if let Some(members) = &self.members {
                        members.forget(&peer);
                    }
                    self.commit.forget(&Source::Peer(peer.clone()));
                    info!(peer = %peer, session, "link session down");
                    self.broker.handle_input(now, Input::PeerDown { peer });
                    self.drain();
                }
            }
            LinkEvent::BroadcastDirect(frame) => self.links.write_to_every_peer(&frame),
        }
    }

    /// A link session to `peer` (a mesh member, or a leaf) started; it replaces any earlier
    /// one, whose frames in flight the core sends again on this one.
    fn session_up(
        &mut self,
        now: Timestamp,
        peer: NodeId,
        session: u64,
        writer: PeerWriter,
        leaf: bool,
    ) {
        if self.links.up(peer.clone(), session, writer, leaf) {
            self.broker
                .handle_input(now, Input::PeerDown { peer: peer.clone() });
            self.drain();
        }
        info!(peer = %peer, session, leaf, "link session up");
        self.broker.handle_input(now, Input::PeerUp { peer });
        self.drain();
    }

    fn on_admin(&mut self, now: Timestamp, request: AdminRequest) {
        match request {
            AdminRequest::Stats(reply) => {
                let _ = reply.send(self.broker.stats());
            }
            AdminRequest::Clients(reply) => {
                let _ = reply.send(self.broker.clients());
            }
            AdminRequest::ClientsPage { page, reply } => {
                let _ = reply.send(self.broker.clients_page(
                    page.offset,
                    page.limit,
                    page.filter.as_deref(),
                ));
            }
            AdminRequest::SubscriptionsPage { page, reply } => {
                let _ = reply.send(self.broker.subscriptions_page(
                    page.offset,
                    page.limit,
                    page.filter.as_deref(),
                ));
            }
            AdminRequest::Peers(reply) => {
                let _ = reply.send(self.broker.peers());
            }
            AdminRequest::Routes { peer, reply } => {
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
            AdminRequest::EndSession { client_id, reply } => {
                let ended = self.broker.end_client_session(
                    now,
                    &client_id,
                    ReasonCode::ADMINISTRATIVE_ACTION,
                );
                self.drain();
                let _ = reply.send(ended);
            }
            AdminRequest::Kick { client_id, reply } => {
                let was = self.broker.disconnect_client(
                    now,
                    &client_id,
                    ReasonCode::ADMINISTRATIVE_ACTION,
                );
                self.drain();
                let _ = reply.send(was);
            }
            AdminRequest::Publish { message, reply } => {
                let n = self.broker.publish(now, message);
                self.drain();
                let _ = reply.send(n);
            }
            AdminRequest::ForgetPeer {
                peer,
                signature,
                reply,
            } => {
                let result = self.broker.forget_peer_signed(now, &peer, signature);
                self.drain();
                let _ = reply.send(result);
            }
        }
    }

    /// Answered once the change is in force (and what it caused drained).
    fn on_policy(&mut self, now: Timestamp, change: PolicyChange) {
        match change {
            PolicyChange::Hooks { hooks, reply } => {
                self.broker
                    .set_hooks(now, hooks.authenticator, hooks.authorizer);
                self.drain();
                let _ = reply.send(());
            }
            PolicyChange::Residency {
                rules,
                node_regions,
                reply,
            } => {
                self.broker.set_residency(now, rules);
                self.drain();
                self.broker.set_node_regions(now, node_regions);
                self.drain();
                let _ = reply.send(());
            }
        }
    }

    /// Take the broker's outputs for the end of the batch. Bytes and frames they add to a
    /// connection's or a peer's backlog count at once: one past its mark is told to the
    /// broker as soon as the drain is over, before the next input, so that a batch cannot
    /// overshoot the mark by more than one input's worth.
    fn drain(&mut self) {
        loop {
            while let Some(output) = self.broker.poll_output() {
                match &output {
                    Output::Send { conn, data } => self.conns.note_send(*conn, data.len()),
                    Output::ToPeer { peer, frame } => self.links.note_frame(peer, frame.len()),
                    _ => {}
                }
                self.outputs.push(output);
            }
            let conns = self.conns.take_newly_congested();
            let peers = self.links.take_newly_congested();
            if conns.is_empty() && peers.is_empty() {
                return;
            }
            let now = self.clock.now();
            for conn in conns {
                self.broker.handle_input(now, Input::Congested { conn });
            }
            for peer in peers {
                self.broker.handle_input(now, Input::PeerCongested { peer });
            }
        }
    }

    /// With the commit window on: `source`'s input made the outputs from `from` on; if they
    /// hold a record that must be durable before what follows goes out, the batch's commit
    /// is (also) `source`'s.
    fn note_source(&mut self, source: Source, from: usize) {
        if !self.commit.enabled() || self.sources.contains(&source) {
            return;
        }
        let durable = self.outputs[from..].iter().any(|out| {
            matches!(out, Output::Persist { durability, .. } if *durability != Durability::WithNext)
        });
        if durable {
            self.sources.push(source);
        }
    }

    /// Commit the batch's records, then hand out bytes and closes (or hold them for the
    /// commit window's fsync), and write to the TCP sockets.
    fn flush(&mut self) -> Result<(), StorageError> {
        loop {
            if self.outputs.is_empty() && !self.conns.has_gone() {
                // What the turn queued, and what waited for room in a socket that has some now.
                self.conns.write_tcp();
                if !self.conns.has_gone() {
                    self.conns.end_batch();
                    self.links.end_batch();
                    return Ok(());
                }
            }
            let mut outputs = std::mem::take(&mut self.outputs);
            self.commit_records(&outputs)?;
            if self.commit.is_open() {
                // Their records are written; they go out once the window's fsync is done.
                self.commit.hold(std::time::Instant::now(), &mut outputs);
            }
            for out in outputs.drain(..) {
                self.apply(out);
            }
            // Sessions that could not keep up, or that the broker cut: it re-sends on the next.
            let now = self.clock.now();
            for peer in self.links.take_cut() {
                self.broker.handle_input(now, Input::PeerDown { peer });
                self.drain();
            }
            // Connections that went away (or were cut off as slow consumers) during the batch.
            for conn in self.conns.take_gone() {
                if self.conns.kill(conn) {
                    self.broker.handle_input(now, Input::Closed { conn });
                    self.drain();
                }
                self.commit.forget(&Source::Conn(conn));
            }
            // The list keeps its room for the next batch, unless the closes above queued more.
            if self.outputs.is_empty() {
                self.outputs = outputs;
            }
        }
    }

    /// Commit the records among `outputs` as one batch: fsynced before what follows goes out,
    /// or, with the commit window, written now and fsynced with the window's. A batch whose
    /// every record may wait for the next ([`Durability::WithNext`]) waits.
    fn commit_records(&mut self, outputs: &[Output]) -> Result<(), StorageError> {
        self.records.clear();
        let mut lazy = true;
        for out in outputs {
            if let Output::Persist {
                key,
                value,
                durability,
            } = out
            {
                self.records.push((key.clone(), value.clone()));
                lazy &= *durability == Durability::WithNext;
            }
        }
        if self.records.is_empty() {
            return Ok(());
        }
        let sources = std::mem::take(&mut self.sources);
        let now = std::time::Instant::now();
        if lazy {
            // Acknowledged forwards let go of, and the like: no fsync of their own.
            self.store.apply_deferred(&self.records)?;
        } else if self.commit.is_open()
            || (self.store.commit_syncs() && self.commit.may_wait(now, &sources))
        {
            // The window's fsync makes it durable, with the others it holds.
            self.store.apply_deferred(&self.records)?;
            self.commit.joined(now, self.records.len(), &sources);
            self.counters
                .storage_commits_waited
                .store(self.commit.waited(), Ordering::Relaxed);
        } else {
            self.store.apply(&self.records)?;
            if self.commit.enabled() {
                self.commit.committed(now, &sources);
            }
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
        Ok(())
    }

    /// Do what one output says (its records are committed).
    fn apply(&mut self, out: Output) {
        match out {
            Output::Send { conn, data } => self.conns.send(conn, data),
            Output::Close { conn } => self.conns.close(conn),
            Output::Persist { .. } => {}
            Output::Event(event) => {
                if let Event::PeerForgotten { peer, .. } = &event {
                    self.links.forgotten(peer);
                }
                log::event(&event);
            }
            Output::CutPeer { peer } => self.links.cut(peer),
            Output::ToPeer { peer, frame } => self.links.write(&peer, frame.into_bytes()),
            Output::Broadcast { frame } => self.links.broadcast(frame.into_bytes()),
        }
    }

    /// Close the commit window: one fsync makes the journal's batches since it opened
    /// durable, then what waited for them goes out, in order.
    fn commit_held(&mut self) -> Result<(), StorageError> {
        if !self.commit.is_open() {
            return Ok(());
        }
        self.store.sync()?;
        let mut held = self.commit.close(std::time::Instant::now());
        held.append(&mut self.outputs);
        self.outputs = held;
        self.flush()
    }
}

impl Drop for Engine {
    /// Connections still open when the broker task ends (a storage failure, say) are closed
    /// rather than left waiting for output that will never come.
    fn drop(&mut self) {
        self.conns.kill_tasks();
    }
}

#[cfg(test)]
mod tests;
