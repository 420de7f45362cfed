//! The drive loop of one broker inside a Durable Object: WebSockets in, the core's outputs
//! carried out, one timer for the core's next deadline.
//!
//! Everything here translates IO; what MQTT does is the core's. Each input is fed with the
//! shell borrowed, every output is applied before the borrow ends, and nothing awaits in
//! between, so outputs leave in the order the core gave them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use js_sys::{ArrayBuffer, Uint8Array};
use meridian_core::acl::Acl;
use meridian_core::{Broker, Config, ConnId, ConnInfo, Event, Input, Output, Timestamp};
use wasm_bindgen::{JsCast, JsValue};
use worker::{Date, Delay, ScheduledTime, Storage, WebSocket, web_sys};

use crate::store::RecordStore;
use crate::users::Users;

/// WebSocket close code of a normal close.
const CLOSE_NORMAL: u16 = 1000;
/// WebSocket close code for a text frame (MQTT travels in binary frames only).
const CLOSE_UNSUPPORTED_DATA: u16 = 1003;
/// WebSocket close code when stored state could not be written: the client reconnects to a
/// broker rebuilt from what was stored.
const CLOSE_INTERNAL_ERROR: u16 = 1011;
/// While clients are connected, the Durable Object alarm stands at most this far ahead.
const ALARM_BACKSTOP_MS: u64 = 60_000;
/// The longest single wait of the in-memory timer.
const MAX_TIMER_WAIT_MS: u64 = 3_600_000;

/// Who may connect, and what they may do.
#[derive(Debug, Clone)]
pub struct Hooks {
    pub users: Users,
    pub acl: Acl,
}

/// The broker and the sockets of its connections.
#[derive(Debug)]
struct Shell {
    broker: Broker<Users, Acl>,
    sockets: HashMap<ConnId, WebSocket>,
    store: RecordStore,
    /// The latest time fed to the broker; the clock it reads never goes backwards.
    now: Timestamp,
    /// The deadline the running timer waits for, if one runs.
    timer: Option<Timestamp>,
    /// The deadline the Durable Object alarm is set for, if set by this instance.
    alarm: Option<Timestamp>,
}

impl Shell {
    /// A broker with every stored record restored, seeded from the platform's random source
    /// (the client ids it assigns are not the same sequence on every start).
    fn start(mut config: Config, hooks: Hooks, store: RecordStore) -> worker::Result<Self> {
        let now = wall_clock();
        config.seed = random_seed()?;
        let mut broker = Broker::with_auth(config, now, hooks.users, hooks.acl);
        let records = store.load()?;
        let count = records.len();
        let report = broker.restore(now, records);
        if count > 0 {
            worker::console_log!(
                "meridian: restored {count} records: {} sessions, {} subscriptions, {} queued and {} retained messages",
                report.sessions,
                report.subscriptions,
                report.messages,
                report.retained
            );
        }
        for (key, error) in &report.unreadable {
            worker::console_error!("meridian: stored record {key:02x?} unreadable: {error}");
        }
        let mut shell = Self {
            broker,
            sockets: HashMap::new(),
            store,
            now,
            timer: None,
            alarm: None,
        };
        // Restoring may delete records that belong to nothing.
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
                        let _ = ws.close(Some(1000), Some("closed by the broker"));
                    }
                }
                Output::Persist { key, value } => self.store.apply(&key, value.as_deref())?,
                Output::Event(event) => log_event(&event),
                // Not in cluster mode: the edge runs one broker of its own.
                Output::ToPeer { .. } | Output::Broadcast { .. } | Output::CutPeer { .. } => {}
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
/// read each socket and wait for deadlines.
#[derive(Debug, Clone)]
pub struct Edge {
    inner: Rc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: Config,
    /// Who may connect and what they may do, or why they cannot be read.
    hooks: Result<Hooks, String>,
    sql: worker::SqlStorage,
    storage: Storage,
    /// `None` until started, and again after stored state could not be read or written.
    shell: RefCell<Option<Shell>>,
}

impl Edge {
    pub fn new(config: Config, hooks: Result<Hooks, String>, storage: Storage) -> Self {
        Self {
            inner: Rc::new(Inner {
                config,
                hooks,
                sql: storage.sql(),
                storage,
                shell: RefCell::new(None),
            }),
        }
    }

    /// Starts the broker from what is stored, unless it runs.
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
            let store = RecordStore::open(self.inner.sql.clone())?;
            *slot = Some(Shell::start(self.inner.config.clone(), hooks, store)?);
        }
        drop(slot);
        self.arm();
        Ok(())
    }

    /// A new connection on `ws`: it is accepted, and its messages are read until it closes.
    pub fn accept(&self, ws: WebSocket, remote_addr: Option<String>) -> worker::Result<()> {
        // Binary frames as ArrayBuffers, not Blobs (which would need a wait to read).
        ws.as_ref()
            .set_binary_type(web_sys::BinaryType::Arraybuffer);
        ws.accept()?;
        let conn = self.with_shell(|shell| {
            let now = shell.clock();
            let info = ConnInfo {
                remote_addr,
                ..ConnInfo::default()
            };
            let conn = shell.broker.accept(now, info);
            shell.sockets.insert(conn, ws.clone());
            // Arms the connect timeout.
            shell.drive()?;
            Ok(conn)
        })?;
        let edge = self.clone();
        wasm_bindgen_futures::spawn_local(async move { edge.read(conn, ws).await });
        Ok(())
    }

    async fn read(&self, conn: ConnId, ws: WebSocket) {
        use futures_util::StreamExt;
        use worker::WebsocketEvent;

        let mut events = match ws.events() {
            Ok(events) => events,
            Err(error) => {
                worker::console_error!("meridian: cannot read a WebSocket: {error}");
                let _ = ws.close(Some(CLOSE_INTERNAL_ERROR), Some("cannot read"));
                self.closed(conn, &ws);
                return;
            }
        };
        while let Some(event) = events.next().await {
            match event {
                Ok(WebsocketEvent::Message(message)) => {
                    let data = message.as_ref().data();
                    if let Some(buffer) = data.dyn_ref::<ArrayBuffer>() {
                        let data = Uint8Array::new(buffer).to_vec();
                        let _ = self.with_shell(|shell| {
                            if shell.sockets.get(&conn) != Some(&ws) {
                                // Closed by the broker (or a broker started again since, whose
                                // connection of this number is another): ignored.
                                return Ok(());
                            }
                            shell.feed(Input::Bytes { conn, data: &data })
                        });
                    } else {
                        let _ = ws.close(
                            Some(CLOSE_UNSUPPORTED_DATA),
                            Some("MQTT needs binary frames"),
                        );
                        self.closed(conn, &ws);
                    }
                }
                Ok(WebsocketEvent::Close(event)) => {
                    // Answer the client's Close at once, with its code where one may be sent
                    // back, so that a clean disconnect ends cleanly rather than timing out.
                    let code = match event.code() {
                        code @ (1000..=1003 | 1007..=1014 | 3000..=4999) => code,
                        _ => CLOSE_NORMAL,
                    };
                    let _ = ws.close(Some(code), Some("closed by the client"));
                    break;
                }
                Err(_) => break,
            }
        }
        self.closed(conn, &ws);
    }

    /// The connection on `ws` ended without the broker closing it.
    fn closed(&self, conn: ConnId, ws: &WebSocket) {
        let _ = self.with_shell(|shell| {
            if shell.sockets.get(&conn) == Some(ws) {
                shell.sockets.remove(&conn);
                shell.feed(Input::Closed { conn })?;
            }
            Ok(())
        });
    }

    /// The Durable Object alarm rang: deadlines that passed while nothing ran (session expiry,
    /// delayed wills) are handled.
    pub fn alarm(&self) -> worker::Result<()> {
        worker::console_log!("meridian: woken by the alarm");
        self.ensure_started()?;
        self.with_shell(|shell| {
            shell.alarm = None;
            shell.feed(Input::Timeout)
        })
    }

    /// Runs `f` on the started broker, then re-arms the timer. A storage failure closes every
    /// connection and drops the broker; the next request starts it again from storage.
    fn with_shell<T>(&self, f: impl FnOnce(&mut Shell) -> worker::Result<T>) -> worker::Result<T> {
        let mut slot = self.inner.shell.borrow_mut();
        let Some(shell) = slot.as_mut() else {
            return Err(worker::Error::RustError("the broker is not running".into()));
        };
        let result = f(shell);
        if let Err(error) = &result {
            worker::console_error!(
                "meridian: stored state failed ({error}); closing every connection"
            );
            for (_, ws) in shell.sockets.drain() {
                let _ = ws.close(Some(CLOSE_INTERNAL_ERROR), Some("storage failed"));
            }
            *slot = None;
            return result;
        }
        drop(slot);
        self.arm();
        result
    }

    /// Keeps the broker's next deadline covered. While connections are open, one timer waits
    /// for it, and an alarm stands at most [`ALARM_BACKSTOP_MS`] ahead: if the object is reset
    /// with clients connected, the alarm starts it again for their wills and session expiries.
    /// With no connection open, the alarm is set to the deadline itself (the object may be
    /// evicted meanwhile; the alarm starts it again).
    fn arm(&self) {
        let mut slot = self.inner.shell.borrow_mut();
        let Some(shell) = slot.as_mut() else { return };
        let now = shell.clock();
        let deadline = shell.broker.poll_timeout();
        if shell.sockets.is_empty() {
            // The alarm takes over; a timer still running finds itself replaced.
            shell.timer = None;
            if let Some(deadline) = deadline
                && shell.alarm != Some(deadline)
            {
                self.set_alarm(shell, deadline);
            }
            return;
        }
        let backstop = Timestamp::from_millis(now.as_millis() + ALARM_BACKSTOP_MS);
        // Set again only when none stands within the backstop: not once per packet.
        if shell.alarm.is_none_or(|at| at > backstop) {
            self.set_alarm(shell, backstop);
        }
        let Some(deadline) = deadline else { return };
        if shell.timer.is_some_and(|armed| armed <= deadline) {
            return; // the running timer comes first; it re-arms when it fires
        }
        shell.timer = Some(deadline);
        // At most an hour: a longer wait would overflow the runtime's timer. Waking early is
        // harmless: nothing is due yet, and the timer is armed again.
        let wait = deadline
            .as_millis()
            .saturating_sub(now.as_millis())
            .min(MAX_TIMER_WAIT_MS);
        let edge = self.clone();
        wasm_bindgen_futures::spawn_local(async move {
            Delay::from(Duration::from_millis(wait)).await;
            let _ = edge.with_shell(|shell| {
                // A timer replaced by an earlier one, or a broker restarted since, does nothing.
                if shell.timer != Some(deadline) {
                    return Ok(());
                }
                shell.timer = None;
                shell.feed(Input::Timeout)
            });
        });
    }

    fn set_alarm(&self, shell: &mut Shell, at: Timestamp) {
        shell.alarm = Some(at);
        let edge = self.clone();
        wasm_bindgen_futures::spawn_local(async move {
            // An absolute time: a bare number would be an offset from now.
            let date = js_sys::Date::new(&JsValue::from(at.as_millis() as f64));
            if let Err(error) = edge.inner.storage.set_alarm(ScheduledTime::new(date)).await {
                worker::console_error!("meridian: cannot set the alarm: {error}");
                // Not set: the next turn tries again.
                if let Some(shell) = edge.inner.shell.borrow_mut().as_mut()
                    && shell.alarm == Some(at)
                {
                    shell.alarm = None;
                }
            }
        });
    }
}
