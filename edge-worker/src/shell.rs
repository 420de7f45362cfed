//! The drive loop of one broker inside a Durable Object: hibernatable WebSockets in, the
//! core's outputs carried out, the object's alarm for the core's next deadline.
//!
//! Everything here translates IO; what MQTT does is the core's. Each input is fed with the
//! shell borrowed, every output is applied before the borrow ends, and nothing awaits in
//! between, so outputs leave in the order the core gave them.
//!
//! Client sockets go through the WebSocket Hibernation API: the runtime keeps them open while
//! the object is evicted from memory between messages, and builds the object again for the
//! next event. The core runs with resumable connections, so everything a connection needs to
//! go on is in storage; each socket carries its connection id as its attachment, and a new
//! instance hands the sockets still open to [`Broker::restore_open`]. Once the object has been
//! quiet for [`CHECKPOINT_QUIET_MS`], it writes the core's checkpoint of its clean sessions:
//! the runtime hibernates an object only after it was quiet longer than that (and never while
//! a timer is pending, as the one that waits for the checkpoint is). The core's deadlines are
//! kept by the object's alarm, not by timers.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use js_sys::Uint8Array;
use meridian_core::acl::Acl;
use meridian_core::broker::{ClusterConfig, FigureValue, LEAF_PREFIX, PeerLimits};
use meridian_core::link::{self, DEFAULT_MAX_FRAME_LEN, Frame, OutboxLimits};
use meridian_core::routes::NodeId;
use meridian_core::{Broker, Config, ConnId, ConnInfo, Event, Input, Output, Timestamp};
use wasm_bindgen::{JsCast, JsValue};
use worker::worker_sys::DurableObjectState;
use worker::{
    Date, Delay, Headers, ObjectNamespace, Response, ScheduledTime, Storage, WebSocket,
    WebSocketPair,
};

use crate::link::Uplink;
use crate::links::{self, NODE_HEADER, PeerSocket};
use crate::placement::HUB_MAX_LEAVES;
use crate::store::RecordStore;
use crate::users::Users;

/// WebSocket close code of a normal close.
const CLOSE_NORMAL: u16 = 1000;
/// WebSocket close code for a text frame (MQTT travels in binary frames only).
const CLOSE_UNSUPPORTED_DATA: u16 = 1003;
/// WebSocket close code for a link frame that cannot be read.
const CLOSE_PROTOCOL_ERROR: u16 = 1002;
/// WebSocket close code when stored state could not be read or written: the client reconnects
/// to a broker rebuilt from what was stored.
const CLOSE_INTERNAL_ERROR: u16 = 1011;
/// Sockets open beyond the broker's sessions, for clients still connecting (each for at most
/// the connect timeout). Past `max_sessions` plus these, new upgrades get 503.
const CONNECTING_SOCKETS: usize = 1_000;
/// How long the object waits without an event before it writes its checkpoint: well under the
/// 10 s of quiet after which workerd may evict it with its sockets kept.
const CHECKPOINT_QUIET_MS: u64 = 2_000;
/// The wait before dialling the home region again after a failure: doubling from the first to
/// the second.
const DIAL_BACKOFF_MIN_MS: u64 = 500;
const DIAL_BACKOFF_MAX_MS: u64 = 30_000;
/// How long a leaf's link to a hub object may take to send its `Hello`.
const HELLO_TIMEOUT_MS: u64 = 10_000;

/// The distinct filters each leaf of a hub object may bring, and so each object of an
/// edge-only deployment may want: the hub holds every leaf's filters (at most
/// [`HUB_MAX_LEAVES`]) and, for each leaf, a view of everyone else's, within an object of 128 MB.
const HUB_LEAF_MAX_FILTERS: usize = 2_500;
/// The distinct filters an object linked to a daemon may want: the daemon's bound for one
/// leaf (`cluster.edge.max_filters`, 100,000, by default).
const REGION_LEAF_MAX_FILTERS: usize = 100_000;

/// The bounds of the broker as a node: one peer, its hub, for a leaf; its leaves for a hub
/// object; and what those peers may make an object of 128 MB hold.
fn edge_cluster_config(node: NodeId, incarnation: u64, uplink: Option<&Uplink>) -> ClusterConfig {
    // Its region, as the hub's listings show it, is its own name.
    let region = node.to_string();
    let mut c = ClusterConfig::new(node, incarnation, region);
    match uplink {
        Some(Uplink::Region(_)) => {
            c.max_nodes = 4;
            c.max_route_filters = REGION_LEAF_MAX_FILTERS;
        }
        Some(Uplink::Hub(_)) => {
            c.max_nodes = 4;
            c.max_route_filters = HUB_LEAF_MAX_FILTERS;
        }
        None => {
            c.max_nodes = HUB_MAX_LEAVES;
            c.leaf_max_filters = HUB_LEAF_MAX_FILTERS;
            // Its own subscribers' filters beside its leaves'.
            c.max_route_filters = (HUB_MAX_LEAVES + 1) * HUB_LEAF_MAX_FILTERS;
        }
    }
    c.tombstone_budget = 10_000;
    c.snapshot_chunk_filters = 1_000;
    c.outbox = OutboxLimits {
        window: 256,
        max_messages: 10_000,
        max_bytes: 8 * 1024 * 1024,
    };
    c.peer_limits = PeerLimits {
        max_filters: 100_000,
        max_pending_delta_bytes: 4 * 1024 * 1024,
        max_snapshot_bytes: 16 * 1024 * 1024,
        max_retained_messages: 1_000,
        max_retained_bytes: 4 * 1024 * 1024,
        // Claims and sessions move between mesh nodes only, never over a leaf link.
        max_claims: 0,
        max_claim_bytes: 0,
        max_transfer_bytes: 0,
    };
    c
}

/// Who may connect, what they may do, and what the broker links to.
#[derive(Debug, Clone)]
pub struct Hooks {
    pub users: Users,
    pub acl: Acl,
    /// `MERIDIAN_UPSTREAM` or `EDGE_HUB`: the hub every object (the hub object aside) is a
    /// leaf of.
    pub uplink: Option<Uplink>,
}

/// A link socket of the object: the one up to its hub, or one of its leaves'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkRef {
    Up,
    Leaf(u64),
}

/// The broker and the sockets of its connections.
#[derive(Debug)]
struct Shell {
    broker: Broker<Users, Acl>,
    sockets: HashMap<ConnId, WebSocket>,
    store: RecordStore,
    /// The latest time fed to the broker; the clock it reads never goes backwards.
    now: Timestamp,
    /// The deadline the Durable Object alarm is set for, if this instance set it.
    alarm: Option<Timestamp>,
    /// When the last event came.
    last_event: Timestamp,
    /// A timer waits to write the checkpoint once the object is quiet.
    checkpoint_pending: bool,
    /// What the broker is a leaf of, if anything.
    uplink: Option<Uplink>,
    /// The link up, while it is open.
    upstream: Option<PeerSocket>,
    /// A dial (or the wait before the next) is under way.
    dialing: bool,
    /// Why the last dial up failed, until one succeeds (`/status`, `link_error`).
    link_error: Option<String>,
    /// The wait before the next dial after a failure.
    backoff_ms: u64,
    /// This object is the hub of an edge-only deployment.
    hub: bool,
    /// Its leaves' links (before their `Hello`, without a node), by link number.
    leaves: BTreeMap<u64, PeerSocket>,
    next_link: u64,
}

impl Shell {
    /// A broker with every stored record restored, seeded from the platform's random source
    /// (the client ids it assigns are not the same sequence on every start), and the
    /// connections of `open` (sockets that outlived the previous instance) resumed.
    fn start(
        mut config: Config,
        hooks: Hooks,
        store: RecordStore,
        open: Vec<WebSocket>,
        name: &str,
    ) -> worker::Result<Self> {
        let now = wall_clock();
        config.seed = random_seed()?;
        config.resumable_connections = true;
        let mut broker = Broker::with_auth(config, now, hooks.users, hooks.acl);
        // The hub object of an edge-only deployment is no leaf: its leaves link to it.
        let hub = matches!(&hooks.uplink, Some(Uplink::Hub(t)) if t.object == name);
        let uplink = hooks.uplink.filter(|_| !hub);
        if hub || uplink.is_some() {
            // A new incarnation per start: the hub replaces the routes of the last one.
            let incarnation = store.next_incarnation()?;
            // Objects of a location are named edge-<location> already.
            let node = if name.starts_with(LEAF_PREFIX) {
                name.to_owned()
            } else {
                format!("{LEAF_PREFIX}{name}")
            };
            let node = NodeId::new(&node).map_err(|e| worker::Error::RustError(e.to_string()))?;
            broker.enable_cluster(now, edge_cluster_config(node, incarnation, uplink.as_ref()));
        }
        let records = store.load()?;
        let count = records.len();
        let mut sockets = HashMap::new();
        for ws in open {
            match ws.deserialize_attachment::<u64>() {
                Ok(Some(id)) => {
                    sockets.insert(ConnId(id), ws);
                }
                _ => {
                    let _ = ws.close(Some(CLOSE_INTERNAL_ERROR), Some("unknown connection"));
                }
            }
        }
        let report = broker.restore_open(now, records, sockets.keys().copied());
        if count > 0 {
            worker::console_log!(
                "meridian: restored {count} records: {} sessions, {} subscriptions, {} queued and {} retained messages; {} of {} open connections resumed",
                report.sessions,
                report.subscriptions,
                report.messages,
                report.retained,
                report.connections,
                sockets.len()
            );
        }
        for (key, error) in &report.unreadable {
            worker::console_error!("meridian: stored record {key:02x?} unreadable: {error}");
        }
        let mut shell = Self {
            broker,
            sockets,
            store,
            now,
            alarm: None,
            last_event: now,
            checkpoint_pending: false,
            uplink,
            upstream: None,
            dialing: false,
            link_error: None,
            backoff_ms: DIAL_BACKOFF_MIN_MS,
            hub,
            leaves: BTreeMap::new(),
            next_link: 0,
        };
        // Restoring may close connections it cannot resume and delete records that belong
        // to nothing.
        shell.drive()?;
        Ok(shell)
    }

    fn clock(&mut self) -> Timestamp {
        self.now = self.now.max(wall_clock());
        self.now
    }

    fn feed(&mut self, input: Input<'_>) -> worker::Result<()> {
        let now = self.clock();
        self.broker.handle_input(now, input);
        self.drive()
    }

    /// Carries out every pending output, in order. A record that cannot be stored stops it:
    /// what follows may acknowledge that record.
    fn drive(&mut self) -> worker::Result<()> {
        while let Some(output) = self.broker.poll_output() {
            match output {
                Output::Send { conn, data } => {
                    if let Some(ws) = self.sockets.get(&conn) {
                        // A socket that is closing refuses; its close event tells the broker.
                        let _ = ws.send_with_bytes(&data);
                    }
                }
                Output::Close { conn } => {
                    // Closed by the broker: its close event must not report it again.
                    if let Some(ws) = self.sockets.remove(&conn) {
                        let _ = ws.close(Some(CLOSE_NORMAL), Some("closed by the broker"));
                    }
                }
                // Every write reaches the object's storage before any later output leaves
                // (its output gate): a record of either durability is as durable as it gets
                // before what follows it goes out.
                Output::Persist { key, value, .. } => {
                    self.store.apply(&key, value.as_deref())?;
                }
                Output::Event(event) => log_event(&event),
                Output::ToPeer { peer, frame } => {
                    if let Some(socket) = self.link_of(&peer) {
                        socket.send(frame.bytes());
                    }
                }
                // Meant for the mesh: the hub above is this object's only member of it (its
                // leaves get their frames as ToPeer).
                Output::Broadcast { frame } => {
                    if let Some(up) = &self.upstream {
                        up.send(frame.bytes());
                    }
                }
                // Its close event tells the broker.
                Output::CutPeer { peer } => {
                    if let Some(socket) = self.link_of(&peer) {
                        let _ = socket
                            .ws
                            .close(Some(CLOSE_INTERNAL_ERROR), Some("cut by the broker"));
                    }
                }
            }
        }
        Ok(())
    }

    /// The open link to `peer`: the one up, or a leaf's.
    fn link_of(&self, peer: &NodeId) -> Option<&PeerSocket> {
        self.upstream
            .iter()
            .chain(self.leaves.values())
            .find(|s| s.node.as_ref() == Some(peer))
    }

    fn socket(&mut self, link: LinkRef) -> Option<&mut PeerSocket> {
        match link {
            LinkRef::Up => self.upstream.as_mut(),
            LinkRef::Leaf(n) => self.leaves.get_mut(&n),
        }
    }

    /// A leaf's link named its node (`Hello`): the core makes it a leaf (or refuses), and an
    /// earlier link of the same leaf gives way.
    fn admit_leaf(&mut self, n: u64, node: NodeId) -> worker::Result<Result<(), String>> {
        let now = self.clock();
        if let Err(why) = self.broker.add_leaf(now, &node) {
            return Ok(Err(why.to_string()));
        }
        let earlier = self
            .leaves
            .iter()
            .find(|(m, s)| **m != n && s.node.as_ref() == Some(&node))
            .map(|(m, _)| *m);
        if let Some(m) = earlier.and_then(|m| self.leaves.remove(&m)) {
            m.retire(CLOSE_NORMAL, "replaced by a new link");
            self.feed(Input::PeerDown { peer: node.clone() })?;
        }
        if let Some(socket) = self.leaves.get_mut(&n) {
            socket.node = Some(node.clone());
        }
        worker::console_log!("meridian: {node} linked as a leaf");
        self.feed(Input::PeerUp { peer: node })?;
        Ok(Ok(()))
    }
}

/// Connection lifecycle events in the Worker's log; per-message work is not logged.
fn log_event(event: &Event) {
    match event {
        Event::ClientConnected { .. }
        | Event::ClientDisconnected { .. }
        | Event::ConnectRefused { .. }
        | Event::SessionEnded { .. } => worker::console_log!("meridian: {event:?}"),
        _ => {}
    }
}

fn wall_clock() -> Timestamp {
    Timestamp::from_millis(Date::now().as_millis())
}

/// 64 bits from `crypto.getRandomValues`.
fn random_seed() -> worker::Result<u64> {
    let bytes = Uint8Array::new_with_length(8);
    let crypto = js_sys::Reflect::get(&js_sys::global(), &JsValue::from("crypto"))?;
    let fill: js_sys::Function =
        js_sys::Reflect::get(&crypto, &JsValue::from("getRandomValues"))?.dyn_into()?;
    fill.call1(&crypto, &bytes)?;
    let mut seed = [0u8; 8];
    bytes.copy_to(&mut seed);
    Ok(u64::from_le_bytes(seed))
}

/// One broker and its connections, shared by the Durable Object's handlers and the tasks that
/// set its alarm.
#[derive(Debug, Clone)]
pub struct Edge {
    inner: Rc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: Config,
    /// Who may connect and what they may do, or why they cannot be read.
    hooks: Result<Hooks, String>,
    state: DurableObjectState,
    storage: Storage,
    /// The Worker's Durable Objects, through which a leaf reaches its hub object.
    namespace: Option<ObjectNamespace>,
    /// `None` until started, and again after stored state could not be read or written.
    shell: RefCell<Option<Shell>>,
}

impl Edge {
    pub fn new(
        config: Config,
        hooks: Result<Hooks, String>,
        state: DurableObjectState,
        storage: Storage,
        namespace: Option<ObjectNamespace>,
    ) -> Self {
        Self {
            inner: Rc::new(Inner {
                config,
                hooks,
                state,
                storage,
                namespace,
                shell: RefCell::new(None),
            }),
        }
    }

    /// Starts the broker from what is stored, with the sockets still open, unless it runs.
    pub fn ensure_started(&self) -> worker::Result<()> {
        let mut slot = self.inner.shell.borrow_mut();
        if slot.is_none() {
            let hooks = self.inner.hooks.clone().map_err(worker::Error::RustError)?;
            if hooks.users.allows_anyone() {
                worker::console_warn!(
                    "meridian: ALLOW_ANONYMOUS is \"true\" and MQTT_USERS is not set: every client may connect"
                );
            } else if hooks.users.is_empty() {
                worker::console_error!(
                    "meridian: MQTT_USERS is not set: every client is refused (set it, or ALLOW_ANONYMOUS = \"true\" for local development)"
                );
            }
            let store = RecordStore::open(self.inner.storage.sql())?;
            let open = self.open_sockets()?;
            let id = self.inner.state.id()?;
            let name = match store.name(id.name())? {
                Some(name) => name,
                None => id.to_string()?,
            };
            *slot = Some(Shell::start(
                self.inner.config.clone(),
                hooks,
                store,
                open,
                &name,
            )?);
        }
        drop(slot);
        self.arm();
        self.dial();
        Ok(())
    }

    /// Opens the link up, if the broker has one and it is not open or being opened: an
    /// upgrade to the daemon's `/link` with the token, or to the hub object's; the other end
    /// names itself in its answer. A failure is tried again after a wait that doubles up to
    /// 30 s.
    fn dial(&self) {
        let mut slot = self.inner.shell.borrow_mut();
        let Some(shell) = slot.as_mut() else { return };
        let Some(uplink) = shell.uplink.clone() else {
            return;
        };
        if shell.upstream.is_some() || shell.dialing {
            return;
        }
        shell.dialing = true;
        drop(slot);
        let weak = Rc::downgrade(&self.inner);
        wasm_bindgen_futures::spawn_local(async move {
            let namespace = weak.upgrade().and_then(|inner| inner.namespace.clone());
            let opened = links::dial(&uplink, namespace.as_ref()).await;
            let Some(inner) = weak.upgrade() else { return };
            let edge = Edge { inner };
            match opened {
                Ok((ws, hub)) => {
                    if let Err(error) = edge.linked(ws, hub) {
                        worker::console_error!("meridian: the link up failed: {error}");
                    }
                }
                Err(error) => {
                    worker::console_warn!("meridian: cannot link to {}: {error}", above(&uplink));
                    if let Some(shell) = edge.inner.shell.borrow_mut().as_mut() {
                        shell.link_error = Some(error.to_string());
                    }
                    edge.dial_later();
                }
            }
        });
    }

    /// Dials again after the backoff.
    fn dial_later(&self) {
        let wait = {
            let mut slot = self.inner.shell.borrow_mut();
            let Some(shell) = slot.as_mut() else { return };
            shell.dialing = true;
            let wait = shell.backoff_ms;
            shell.backoff_ms = (wait * 2).min(DIAL_BACKOFF_MAX_MS);
            wait
        };
        let weak = Rc::downgrade(&self.inner);
        wasm_bindgen_futures::spawn_local(async move {
            Delay::from(Duration::from_millis(wait)).await;
            let Some(inner) = weak.upgrade() else { return };
            let edge = Edge { inner };
            if let Some(shell) = edge.inner.shell.borrow_mut().as_mut() {
                shell.dialing = false;
            }
            edge.dial();
        });
    }

    /// Listens on a link socket: its frames go to the broker.
    fn listen(&self, ws: WebSocket, node: Option<NodeId>, link: LinkRef) -> PeerSocket {
        let weak = Rc::downgrade(&self.inner);
        let on_data = {
            let weak = weak.clone();
            move |data: &[u8]| {
                if let Some(inner) = weak.upgrade() {
                    Edge { inner }.link_data(link, data);
                }
            }
        };
        let on_end = move |why: Option<&'static str>| {
            if let Some(inner) = weak.upgrade() {
                Edge { inner }.end_link(link, why);
            }
        };
        PeerSocket::listen(ws, node, on_data, on_end)
    }

    /// The link up is open: the broker has its peer.
    fn linked(&self, ws: WebSocket, hub: NodeId) -> worker::Result<()> {
        let socket = self.listen(ws, Some(hub.clone()), LinkRef::Up);
        self.with_shell(|shell| {
            worker::console_log!("meridian: linked to {} ({hub})", above_of(shell));
            shell.dialing = false;
            shell.link_error = None;
            shell.backoff_ms = DIAL_BACKOFF_MIN_MS;
            shell.upstream = Some(socket);
            shell.feed(Input::PeerUp { peer: hub })
        })
    }

    /// A leaf's link to this hub object (`links::HUB_LINK_PATH`): an upgrade whose answer
    /// names this node; its first frame must be the leaf's `Hello`.
    pub fn accept_leaf(&self) -> worker::Result<Response> {
        self.ensure_started()?;
        let admitted = self.with_shell(|shell| {
            if !shell.hub {
                return Ok(Err((404, "this object is not the deployment's hub\n")));
            }
            if shell.leaves.len() >= HUB_MAX_LEAVES {
                return Ok(Err((503, "the hub holds as many leaves as it may\n")));
            }
            let node = shell.broker.node_id().cloned();
            shell.next_link += 1;
            Ok(Ok((shell.next_link, node)))
        })?;
        let (n, node) = match admitted {
            Ok(admitted) => admitted,
            Err((status, why)) => return Response::error(why, status),
        };
        let pair = WebSocketPair::new()?;
        pair.server.accept()?;
        let socket = self.listen(pair.server, None, LinkRef::Leaf(n));
        self.with_shell(|shell| {
            shell.leaves.insert(n, socket);
            Ok(())
        })?;
        // A link that names no leaf in time is closed.
        let weak = Rc::downgrade(&self.inner);
        wasm_bindgen_futures::spawn_local(async move {
            Delay::from(Duration::from_millis(HELLO_TIMEOUT_MS)).await;
            let Some(inner) = weak.upgrade() else { return };
            let mut slot = inner.shell.borrow_mut();
            let Some(shell) = slot.as_mut() else { return };
            if shell.leaves.get(&n).is_some_and(|s| s.node.is_none())
                && let Some(socket) = shell.leaves.remove(&n)
            {
                socket.retire(CLOSE_PROTOCOL_ERROR, "no Hello");
            }
        });
        let headers = Headers::new();
        if let Some(node) = node {
            headers.set(NODE_HEADER, node.as_str())?;
        }
        Ok(Response::from_websocket(pair.client)?.with_headers(headers))
    }

    /// A message on a link: whole link frames, fed to the broker as one input (their
    /// acknowledgements of forwards leave as one per origin). A leaf's first must name it
    /// (`Hello`).
    fn link_data(&self, link: LinkRef, data: &[u8]) {
        let refused = self
            .with_shell(|shell| {
                let Some(socket) = shell.socket(link) else {
                    // Closed already; a late message is ignored.
                    return Ok(None);
                };
                let frames = match link::decode_message(data, DEFAULT_MAX_FRAME_LEN) {
                    Ok(frames) => frames,
                    Err(_) => return Ok(Some("a malformed link frame".to_owned())),
                };
                let peer = match (&socket.node, link, frames.first()) {
                    (Some(peer), _, _) => peer.clone(),
                    (None, LinkRef::Leaf(n), Some(Frame::Hello { node, .. })) => {
                        let node = node.clone();
                        if let Err(why) = shell.admit_leaf(n, node.clone())? {
                            worker::console_warn!("meridian: leaf {node} refused: {why}");
                            return Ok(Some(why));
                        }
                        node
                    }
                    (None, ..) => return Ok(Some("the first frame is not a Hello".to_owned())),
                };
                shell.feed(Input::PeerFrames { peer, frames })?;
                Ok(None)
            })
            .unwrap_or(None);
        if let Some(why) = refused {
            self.end_link(link, Some(&why));
        }
    }

    /// Ends a link that closed, failed, or sent what this end closes it for (`why`): the
    /// broker loses its peer; a link up is dialled again after the backoff.
    fn end_link(&self, link: LinkRef, why: Option<&str>) {
        let gone = self.with_shell(|shell| {
            let socket = match link {
                LinkRef::Up => shell.upstream.take(),
                LinkRef::Leaf(n) => shell.leaves.remove(&n),
            };
            let Some(socket) = socket else {
                return Ok(false);
            };
            let node = socket.node.clone();
            match why {
                Some(why) => socket.retire(CLOSE_PROTOCOL_ERROR, why),
                None => socket.retire(CLOSE_NORMAL, "closed"),
            }
            if let Some(peer) = node {
                if link != LinkRef::Up {
                    worker::console_log!("meridian: leaf {peer} unlinked");
                }
                shell.feed(Input::PeerDown { peer })?;
            }
            Ok(true)
        });
        if link == LinkRef::Up && gone.unwrap_or(false) {
            worker::console_warn!("meridian: the link up closed; dialling again");
            self.dial_later();
        }
    }

    fn open_sockets(&self) -> worker::Result<Vec<WebSocket>> {
        let sockets = self.inner.state.get_websockets()?;
        Ok(sockets.into_iter().map(WebSocket::from).collect())
    }

    /// The object's state as JSON, for `GET /status`: its name, its role (`alone`, `leaf`,
    /// `hub`), its links (to its hub, or its leaves) with what crossed them and why the last
    /// dial up failed, its clients, the messages it dropped by reason. Nothing secret.
    pub fn status_json(&self) -> String {
        let slot = self.inner.shell.borrow();
        let Some(shell) = slot.as_ref() else {
            return "{\"running\":false}".to_owned();
        };
        let stats = shell.broker.stats();
        let hub = shell.upstream.as_ref().and_then(|u| u.node.clone());
        let peers = shell.broker.peers();
        let outbox = peers
            .iter()
            .find(|p| Some(&p.node) == hub.as_ref())
            .map_or(0, |p| p.outbox_messages);
        let role = match (shell.hub, &shell.uplink) {
            (true, _) => "hub",
            (false, Some(_)) => "leaf",
            (false, None) => "alone",
        };
        let peers: Vec<String> = peers
            .iter()
            .map(|p| {
                format!(
                    "{{\"node\":{},\"leaf\":{},\"connected\":{},\"routes\":{},\
                     \"outbox_messages\":{},\"forwarded_to\":{},\"forwarded_from\":{}}}",
                    json_string_or_null(Some(p.node.as_str())),
                    p.leaf,
                    p.connected,
                    p.routes,
                    p.outbox_messages,
                    p.forwarded_to,
                    p.forwarded_from
                )
            })
            .collect();
        // Messages dropped, by reason (those with any).
        let dropped: Vec<String> = stats
            .figures()
            .filter_map(
                |(figure, value)| match (figure.metric, figure.label, value) {
                    ("messages_dropped", Some((_, reason)), FigureValue::One(n)) if n > 0 => {
                        Some(format!("\"{reason}\":{n}"))
                    }
                    _ => None,
                },
            )
            .collect();
        format!(
            "{{\"running\":true,\"node\":{},\"role\":\"{role}\",\"linked\":{},\"hub\":{},\
             \"link_error\":{},\
             \"connections\":{},\"sessions\":{},\"subscriptions\":{},\"outbox_messages\":{},\
             \"messages_dropped\":{{{}}},\"peers\":[{}]}}",
            json_string_or_null(shell.broker.node_id().map(NodeId::as_str)),
            hub.is_some(),
            json_string_or_null(hub.as_ref().map(NodeId::as_str)),
            json_string_or_null(shell.link_error.as_deref()),
            stats.connections,
            stats.sessions,
            stats.subscriptions,
            outbox,
            dropped.join(","),
            peers.join(",")
        )
    }

    /// Whether one more socket may be opened.
    pub fn has_room(&self) -> bool {
        let open = self
            .inner
            .shell
            .borrow()
            .as_ref()
            .map_or(0, |s| s.sockets.len());
        open < self.inner.config.max_sessions + CONNECTING_SOCKETS
    }

    /// A new connection on `ws`, handed to the runtime as a hibernatable socket that carries
    /// its connection id.
    pub fn accept(&self, ws: WebSocket, remote_addr: Option<String>) -> worker::Result<()> {
        self.inner.state.accept_websocket(ws.as_ref())?;
        self.with_shell(|shell| {
            let now = shell.clock();
            let info = ConnInfo {
                remote_addr,
                ..ConnInfo::default()
            };
            let conn = shell.broker.accept(now, info);
            ws.serialize_attachment(conn.0)?;
            shell.sockets.insert(conn, ws);
            // Arms the connect timeout.
            shell.drive()
        })
    }

    /// A message on a client's socket.
    pub fn message(&self, ws: &WebSocket, data: Option<&[u8]>) -> worker::Result<()> {
        self.ensure_started()?;
        let Some(conn) = connection_of(ws) else {
            let _ = ws.close(Some(CLOSE_INTERNAL_ERROR), Some("unknown connection"));
            return Ok(());
        };
        match data {
            Some(data) => self.with_shell(|shell| {
                if !shell.sockets.contains_key(&conn) {
                    // Closed by the broker; a late message is ignored.
                    return Ok(());
                }
                shell.feed(Input::Bytes { conn, data })
            }),
            None => {
                let _ = ws.close(
                    Some(CLOSE_UNSUPPORTED_DATA),
                    Some("MQTT needs binary frames"),
                );
                self.closed(conn)
            }
        }
    }

    /// A client closed its socket (`code` from its Close frame), or the socket failed.
    pub fn socket_closed(&self, ws: &WebSocket, code: Option<u16>) -> worker::Result<()> {
        if let Some(code) = code {
            // Answer the client's Close at once, with its code where one may be sent back,
            // so that a clean disconnect ends cleanly rather than timing out. (A runtime
            // that already answered refuses; that is fine.)
            let code = match code {
                code @ (1000..=1003 | 1007..=1014 | 3000..=4999) => code,
                _ => CLOSE_NORMAL,
            };
            let _ = ws.close(Some(code), Some("closed by the client"));
        }
        self.ensure_started()?;
        match connection_of(ws) {
            Some(conn) => self.closed(conn),
            None => Ok(()),
        }
    }

    /// The connection ended without the broker closing it.
    fn closed(&self, conn: ConnId) -> worker::Result<()> {
        self.with_shell(|shell| {
            if shell.sockets.remove(&conn).is_some() {
                shell.feed(Input::Closed { conn })?;
            }
            Ok(())
        })
    }

    /// The Durable Object alarm rang: the core's deadlines that are due (keep alive, connect
    /// timeout, will delay, session and message expiry) are handled, and the alarm is set
    /// for the next one.
    pub fn alarm(&self) -> worker::Result<()> {
        self.ensure_started()?;
        self.with_shell(|shell| {
            shell.alarm = None;
            shell.feed(Input::Timeout)
        })
    }

    /// Runs `f` on the started broker, then keeps the alarm at its next deadline. A storage
    /// failure closes every connection and drops the broker; the next event starts it again
    /// from storage.
    fn with_shell<T>(&self, f: impl FnOnce(&mut Shell) -> worker::Result<T>) -> worker::Result<T> {
        let mut slot = self.inner.shell.borrow_mut();
        let Some(shell) = slot.as_mut() else {
            return Err(worker::Error::RustError("the broker is not running".into()));
        };
        let result = f(shell);
        if let Err(error) = &result {
            stop(&mut slot, error);
            return result;
        }
        shell.last_event = shell.now;
        drop(slot);
        self.arm();
        self.checkpoint_when_quiet();
        result
    }

    /// Writes the core's checkpoint once no event came for [`CHECKPOINT_QUIET_MS`]: one timer
    /// at a time, which waits again for as long as events keep coming.
    fn checkpoint_when_quiet(&self) {
        let mut slot = self.inner.shell.borrow_mut();
        let Some(shell) = slot.as_mut() else { return };
        if shell.checkpoint_pending {
            return;
        }
        shell.checkpoint_pending = true;
        drop(slot);
        let edge = self.clone();
        wasm_bindgen_futures::spawn_local(async move {
            let mut wait = CHECKPOINT_QUIET_MS;
            loop {
                Delay::from(Duration::from_millis(wait)).await;
                let mut slot = edge.inner.shell.borrow_mut();
                let Some(shell) = slot.as_mut() else { return };
                let quiet =
                    (shell.clock().as_millis()).saturating_sub(shell.last_event.as_millis());
                if quiet < CHECKPOINT_QUIET_MS {
                    wait = CHECKPOINT_QUIET_MS - quiet;
                    continue;
                }
                shell.checkpoint_pending = false;
                let now = shell.clock();
                shell.broker.checkpoint(now);
                if let Err(error) = shell.drive() {
                    stop(&mut slot, &error);
                }
                return;
            }
        });
    }

    /// Keeps the alarm at or before the broker's next deadline. It is set again only when the
    /// deadline comes earlier than the alarm standing (not once per packet: a deadline that
    /// moved later rings the alarm early, which finds nothing due and sets it again).
    fn arm(&self) {
        let mut slot = self.inner.shell.borrow_mut();
        let Some(shell) = slot.as_mut() else { return };
        let Some(deadline) = shell.broker.poll_timeout() else {
            return;
        };
        if shell.alarm.is_some_and(|at| at <= deadline) {
            return;
        }
        shell.alarm = Some(deadline);
        let edge = self.clone();
        wasm_bindgen_futures::spawn_local(async move {
            // An absolute time: a bare number would be an offset from now.
            let date = js_sys::Date::new(&JsValue::from(deadline.as_millis() as f64));
            if let Err(error) = edge.inner.storage.set_alarm(ScheduledTime::new(date)).await {
                worker::console_error!("meridian: cannot set the alarm: {error}");
                // Not set: the next turn tries again.
                if let Some(shell) = edge.inner.shell.borrow_mut().as_mut()
                    && shell.alarm == Some(deadline)
                {
                    shell.alarm = None;
                }
            }
        });
    }
}

/// Stored state could not be read or written: every connection is closed and the broker
/// dropped; the next event starts it again from storage.
fn stop(slot: &mut Option<Shell>, error: &worker::Error) {
    worker::console_error!("meridian: stored state failed ({error}); closing every connection");
    if let Some(shell) = slot.as_mut() {
        for (_, ws) in shell.sockets.drain() {
            let _ = ws.close(Some(CLOSE_INTERNAL_ERROR), Some("storage failed"));
        }
        for socket in shell
            .upstream
            .take()
            .into_iter()
            .chain(std::mem::take(&mut shell.leaves).into_values())
        {
            socket.retire(CLOSE_INTERNAL_ERROR, "storage failed");
        }
    }
    *slot = None;
}

/// A JSON string (or `null`).
fn json_string_or_null(s: Option<&str>) -> String {
    let Some(s) = s else {
        return "null".to_owned();
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What an object links up to, for its log.
fn above(uplink: &Uplink) -> &'static str {
    match uplink {
        Uplink::Region(_) => "the region",
        Uplink::Hub(_) => "the hub object",
    }
}

fn above_of(shell: &Shell) -> &'static str {
    shell.uplink.as_ref().map_or("the hub", above)
}

/// The connection a socket carries (its attachment), if it carries one.
fn connection_of(ws: &WebSocket) -> Option<ConnId> {
    ws.deserialize_attachment::<u64>()
        .ok()
        .flatten()
        .map(ConnId)
}
