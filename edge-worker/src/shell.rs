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
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use js_sys::{ArrayBuffer, Uint8Array};
use meridian_core::acl::Acl;
use meridian_core::broker::{ClusterConfig, PeerLimits};
use meridian_core::link::{self, DEFAULT_MAX_FRAME_LEN, OutboxLimits};
use meridian_core::routes::NodeId;
use meridian_core::{Broker, Config, ConnId, ConnInfo, Event, Input, Output, Timestamp};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};
use worker::worker_sys::DurableObjectState;
use worker::{Date, Delay, ScheduledTime, Storage, WebSocket, web_sys};

use crate::link::LinkConfig;
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

/// The bounds of the broker as a leaf: one peer, its home region, and what that peer may make
/// an object of 128 MB hold.
fn leaf_cluster_config(node: NodeId, incarnation: u64) -> ClusterConfig {
    // Its region, as the daemon's listings show it, is its own name.
    let region = node.to_string();
    let mut c = ClusterConfig::new(node, incarnation, region);
    c.max_nodes = 4;
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
    };
    c
}

/// Who may connect, what they may do, and the region the broker links to.
#[derive(Debug, Clone)]
pub struct Hooks {
    pub users: Users,
    pub acl: Acl,
    /// `MERIDIAN_UPSTREAM`: the broker is a leaf of that daemon.
    pub upstream: Option<LinkConfig>,
}

/// The link to the home region, while its WebSocket is open.
struct Upstream {
    ws: WebSocket,
    /// The daemon at its other end, as its upgrade named it.
    hub: NodeId,
    /// The socket's handlers, kept for as long as it is open.
    _handlers: [Closure<dyn FnMut(JsValue)>; 3],
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").field("hub", &self.hub).finish()
    }
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
    /// Where the broker links to (a leaf of that daemon), if anywhere.
    link: Option<LinkConfig>,
    /// The link, while it is open.
    upstream: Option<Upstream>,
    /// A dial (or the wait before the next) is under way.
    dialing: bool,
    /// The wait before the next dial after a failure.
    backoff_ms: u64,
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
        if hooks.upstream.is_some() {
            // A new incarnation per start: the daemon replaces the routes of the last one.
            let incarnation = store.next_incarnation()?;
            // Objects of a location are named edge-<location> already.
            let node = if name.starts_with("edge-") {
                name.to_owned()
            } else {
                format!("edge-{name}")
            };
            let node = NodeId::new(&node).map_err(|e| worker::Error::RustError(e.to_string()))?;
            broker.enable_cluster(leaf_cluster_config(node, incarnation));
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
            link: hooks.upstream,
            upstream: None,
            dialing: false,
            backoff_ms: DIAL_BACKOFF_MIN_MS,
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
                Output::Persist { key, value } => self.store.apply(&key, value.as_deref())?,
                Output::Event(event) => log_event(&event),
                // The one peer is the home region: what the core sends to peers goes there.
                Output::ToPeer { frame, .. } | Output::Broadcast { frame } => {
                    if let Some(up) = &self.upstream {
                        let mut bytes = BytesMut::new();
                        if link::encode(&frame, &mut bytes).is_ok() {
                            // A link that is closing refuses; its close event tells the broker.
                            let _ = up.ws.send_with_bytes(&bytes);
                        }
                    }
                }
                Output::CutPeer { .. } => {
                    if let Some(up) = &self.upstream {
                        let _ = up
                            .ws
                            .close(Some(CLOSE_INTERNAL_ERROR), Some("cut by the broker"));
                    }
                }
            }
        }
        Ok(())
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
    /// `None` until started, and again after stored state could not be read or written.
    shell: RefCell<Option<Shell>>,
}

impl Edge {
    pub fn new(
        config: Config,
        hooks: Result<Hooks, String>,
        state: DurableObjectState,
        storage: Storage,
    ) -> Self {
        Self {
            inner: Rc::new(Inner {
                config,
                hooks,
                state,
                storage,
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

    /// Opens the link to the home region, if the broker has one and it is not open or being
    /// opened: an upgrade to the daemon's `/link` with the token; the daemon names itself in
    /// its answer. A failure is tried again after a wait that doubles up to 30 s.
    fn dial(&self) {
        let mut slot = self.inner.shell.borrow_mut();
        let Some(shell) = slot.as_mut() else { return };
        let Some(config) = shell.link.clone() else {
            return;
        };
        if shell.upstream.is_some() || shell.dialing {
            return;
        }
        shell.dialing = true;
        drop(slot);
        let weak = Rc::downgrade(&self.inner);
        wasm_bindgen_futures::spawn_local(async move {
            let opened = open_link(&config).await;
            let Some(inner) = weak.upgrade() else { return };
            let edge = Edge { inner };
            match opened {
                Ok((ws, hub)) => {
                    if let Err(error) = edge.linked(ws, hub) {
                        worker::console_error!("meridian: the link to the region failed: {error}");
                    }
                }
                Err(error) => {
                    worker::console_warn!("meridian: cannot link to the region: {error}");
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

    /// The link is open: its frames go to the broker, which now has its peer.
    fn linked(&self, ws: WebSocket, hub: NodeId) -> worker::Result<()> {
        ws.as_ref()
            .set_binary_type(web_sys::BinaryType::Arraybuffer);
        let weak = Rc::downgrade(&self.inner);
        let on_message = Closure::<dyn FnMut(JsValue)>::new({
            let weak = weak.clone();
            move |event: JsValue| {
                let Some(inner) = weak.upgrade() else { return };
                let data = event
                    .dyn_ref::<web_sys::MessageEvent>()
                    .map(web_sys::MessageEvent::data);
                match data.as_ref().and_then(|d| d.dyn_ref::<ArrayBuffer>()) {
                    Some(buffer) => Edge { inner }.upstream_data(&Uint8Array::new(buffer).to_vec()),
                    None => Edge { inner }.upstream_closed(Some("a text message")),
                }
            }
        });
        let on_end = || {
            let weak = weak.clone();
            Closure::<dyn FnMut(JsValue)>::new(move |_: JsValue| {
                if let Some(inner) = weak.upgrade() {
                    Edge { inner }.upstream_closed(None);
                }
            })
        };
        let (on_close, on_error) = (on_end(), on_end());
        let socket: &web_sys::WebSocket = ws.as_ref();
        socket.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        socket.set_onclose(Some(on_close.as_ref().unchecked_ref()));
        socket.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        worker::console_log!("meridian: linked to the region ({hub})");
        self.with_shell(|shell| {
            shell.dialing = false;
            shell.backoff_ms = DIAL_BACKOFF_MIN_MS;
            shell.upstream = Some(Upstream {
                ws,
                hub: hub.clone(),
                _handlers: [on_message, on_close, on_error],
            });
            shell.feed(Input::PeerUp { peer: hub })
        })
    }

    /// Bytes from the region: whole link frames, each fed to the broker.
    fn upstream_data(&self, data: &[u8]) {
        let malformed = self
            .with_shell(|shell| {
                let Some(hub) = shell.upstream.as_ref().map(|u| u.hub.clone()) else {
                    return Ok(false);
                };
                let mut buf = BytesMut::from(data);
                loop {
                    match link::decode(&mut buf, DEFAULT_MAX_FRAME_LEN) {
                        Ok(Some(frame)) => shell.feed(Input::PeerFrame {
                            peer: hub.clone(),
                            frame: Box::new(frame),
                        })?,
                        Ok(None) if buf.is_empty() => return Ok(false),
                        _ => return Ok(true),
                    }
                }
            })
            .unwrap_or(false);
        if malformed {
            self.upstream_closed(Some("a malformed link frame"));
        }
    }

    /// The link closed (or failed, or sent what cannot be read): the broker loses its peer
    /// until the next dial.
    fn upstream_closed(&self, why: Option<&str>) {
        let gone = self.with_shell(|shell| {
            let Some(up) = shell.upstream.take() else {
                return Ok(false);
            };
            if let Some(why) = why {
                let _ = up.ws.close(Some(CLOSE_PROTOCOL_ERROR), Some(why));
            }
            let hub = up.hub.clone();
            retire(up);
            shell.feed(Input::PeerDown { peer: hub })?;
            Ok(true)
        });
        if gone.unwrap_or(false) {
            worker::console_warn!("meridian: the link to the region closed; dialling again");
            self.dial_later();
        }
    }

    fn open_sockets(&self) -> worker::Result<Vec<WebSocket>> {
        let sockets = self.inner.state.get_websockets()?;
        Ok(sockets.into_iter().map(WebSocket::from).collect())
    }

    /// The object's state as JSON, for `GET /status`: its name, its link to the region, its
    /// clients. Nothing secret.
    pub fn status_json(&self) -> String {
        let slot = self.inner.shell.borrow();
        let Some(shell) = slot.as_ref() else {
            return "{\"running\":false}".to_owned();
        };
        let stats = shell.broker.stats();
        let hub = shell.upstream.as_ref().map(|u| u.hub.clone());
        let outbox = hub.as_ref().map_or(0, |hub| {
            shell
                .broker
                .peers()
                .iter()
                .find(|p| &p.node == hub)
                .map_or(0, |p| p.outbox_messages)
        });
        format!(
            "{{\"running\":true,\"node\":{},\"linked\":{},\"hub\":{},\"connections\":{},\
             \"sessions\":{},\"subscriptions\":{},\"outbox_messages\":{}}}",
            json_string_or_null(shell.broker.node_id().map(NodeId::as_str)),
            hub.is_some(),
            json_string_or_null(hub.as_ref().map(NodeId::as_str)),
            stats.connections,
            stats.sessions,
            stats.subscriptions,
            outbox
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
                shell.broker.checkpoint();
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
        if let Some(up) = shell.upstream.take() {
            let _ = up
                .ws
                .close(Some(CLOSE_INTERNAL_ERROR), Some("storage failed"));
            retire(up);
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

/// Lets go of a link whose handlers may be running now: they are dropped once this turn ends.
fn retire(up: Upstream) {
    wasm_bindgen_futures::spawn_local(async move { drop(up) });
}

/// An upgrade to the daemon's edge-link listener, with the token; the daemon's answer names
/// it (`meridian-node`).
async fn open_link(config: &LinkConfig) -> worker::Result<(WebSocket, NodeId)> {
    let headers = worker::Headers::new();
    headers.set("Upgrade", "websocket")?;
    headers.set("Authorization", &format!("Bearer {}", config.token))?;
    let mut init = worker::RequestInit::new();
    init.with_headers(headers);
    let request = worker::Request::new_with_init(&config.url, &init)?;
    let response = worker::Fetch::Request(request).send().await?;
    let status = response.status_code();
    let hub = response.headers().get("meridian-node")?;
    let ws = response
        .websocket()
        .ok_or_else(|| worker::Error::RustError(format!("the daemon answered {status}")))?;
    let hub = hub
        .and_then(|h| NodeId::new(&h).ok())
        .ok_or_else(|| worker::Error::RustError("the daemon did not name itself".into()))?;
    ws.accept()?;
    Ok((ws, hub))
}

/// The connection a socket carries (its attachment), if it carries one.
fn connection_of(ws: &WebSocket) -> Option<ConnId> {
    ws.deserialize_attachment::<u64>()
        .ok()
        .flatten()
        .map(ConnId)
}
