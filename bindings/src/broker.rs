//! The broker's drive loop in JavaScript terms.
//!
//! One input (`accept`, `handleBytes`, `handleClosed`, `handleTimeout`, ...), then drain
//! `pollOutput()` (or `drain()`) until it is empty, then wait until `pollTimeout()` or the next
//! input. Connection ids are JS numbers; times are milliseconds since the epoch (`Date.now()`).

use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use bytes::Bytes;
use meridian_core::broker::{AllowAll, AuthOutcome, Authenticator, Authorizer, Message};
use meridian_core::codec::ReasonCode;
use meridian_core::link::FrameReader;
use meridian_core::{ConnId, Input, Output, Timestamp};
use wasm_bindgen::prelude::*;

use crate::hooks::{HookErrors, Hooks, JsAuthenticator, JsAuthorizer, auth_outcome};
use crate::js::{self, Fields, Obj};
use crate::ts::{BrokerConfigArg, BrokerHooksArg, ConnInfoArg, arg};
use crate::{config, glue, output, packet};

/// An MQTT 3.1.1 and 5.0 broker with no IO of its own: feed it bytes and time, send what it
/// returns. See the package README for the drive loop.
#[wasm_bindgen(js_name = Broker)]
#[derive(Debug)]
pub struct JsBroker {
    pub(crate) inner: meridian_core::Broker,
    /// Errors thrown by hooks, handed out as `hookError` outputs before the core's outputs.
    hook_errors: HookErrors,
    /// Hook errors taken from `hook_errors`, waiting for `pollOutput`.
    pending: VecDeque<JsValue>,
    /// Reused for the bytes of `handleBytes`.
    scratch: Vec<u8>,
    /// Per peer node: the reader of its link's frames (bytes of a frame not yet whole).
    pub(crate) peer_readers: BTreeMap<String, FrameReader>,
}

pub(crate) fn now(ms: f64) -> Result<Timestamp, JsValue> {
    js::millis(ms, "nowMs").map(Timestamp::from_millis)
}

fn conn_id(conn: f64) -> Result<ConnId, JsValue> {
    if !(conn.is_finite()
        && conn.fract() == 0.0
        && conn >= 1.0
        && conn <= js::MAX_SAFE_INTEGER as f64)
    {
        return Err(js::range_error(&format!(
            "conn: expected a connection id returned by accept(), got {}",
            js::show(conn)
        )));
    }
    Ok(ConnId(conn as u64))
}

#[wasm_bindgen(js_class = Broker)]
impl JsBroker {
    /// A broker with `config` (every field optional; the core's safe defaults otherwise) at time
    /// `nowMs` (default `Date.now()`). `hooks` may hold `authenticate`, `mayPublish` and
    /// `maySubscribe` functions; without them everyone may connect and do everything.
    #[wasm_bindgen(constructor)]
    pub fn new(
        config: Option<BrokerConfigArg>,
        #[wasm_bindgen(js_name = nowMs)] now_ms: Option<f64>,
        hooks: Option<BrokerHooksArg>,
    ) -> Result<JsBroker, JsValue> {
        let config = config::from_js(&arg(config))?;
        let now = now(now_ms.unwrap_or_else(js_sys::Date::now))?;
        let hooks = Hooks::from_js(&arg(hooks))?;
        let hook_errors = HookErrors::default();
        let authenticator: Box<dyn Authenticator> = match hooks.authenticate {
            Some(function) => Box::new(JsAuthenticator {
                function,
                errors: Rc::clone(&hook_errors),
            }),
            None => Box::new(AllowAll),
        };
        let authorizer: Box<dyn Authorizer> =
            if hooks.may_publish.is_none() && hooks.may_subscribe.is_none() {
                Box::new(AllowAll)
            } else {
                Box::new(JsAuthorizer {
                    may_publish: hooks.may_publish,
                    may_subscribe: hooks.may_subscribe,
                    may_receive: hooks.may_receive,
                    errors: Rc::clone(&hook_errors),
                })
            };
        Ok(Self {
            inner: meridian_core::Broker::with_auth(config, now, authenticator, authorizer),
            hook_errors,
            pending: VecDeque::new(),
            scratch: Vec::new(),
            peer_readers: BTreeMap::new(),
        })
    }

    /// A new network connection; returns its id. The client must send CONNECT within
    /// `connectTimeoutMs`. `info`: `{ remoteAddr?, tlsIdentity?, maxPacketSize? }`.
    pub fn accept(
        &mut self,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
        info: Option<ConnInfoArg>,
    ) -> Result<f64, JsValue> {
        let info = config::conn_info(&arg(info))?;
        let id = self.inner.accept(now(now_ms)?, info);
        Ok(id.0 as f64)
    }

    /// Bytes read from connection `conn` (a `Uint8Array`, e.g. a Node `Buffer`). Bytes for a
    /// connection that is already closed are ignored.
    #[wasm_bindgen(js_name = handleBytes)]
    pub fn handle_bytes(
        &mut self,
        conn: f64,
        #[wasm_bindgen(unchecked_param_type = "Uint8Array")] data: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let conn = conn_id(conn)?;
        let now = now(now_ms)?;
        let mut scratch = std::mem::take(&mut self.scratch);
        let read = js::bytes_into(&data, &mut scratch, "data");
        if read.is_ok() {
            self.inner.handle_input(
                now,
                Input::Bytes {
                    conn,
                    data: &scratch,
                },
            );
        }
        // Keep the allocation for the next call, but not a huge one.
        if scratch.capacity() <= 64 * 1024 {
            self.scratch = scratch;
        }
        self.collect_hook_errors();
        read
    }

    /// Connection `conn` was closed by the peer or the network.
    #[wasm_bindgen(js_name = handleClosed)]
    pub fn handle_closed(
        &mut self,
        conn: f64,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let input = Input::Closed {
            conn: conn_id(conn)?,
        };
        self.inner.handle_input(now(now_ms)?, input);
        self.collect_hook_errors();
        Ok(())
    }

    /// Connection `conn` has more unwritten bytes than the app wants to buffer (for a Node
    /// socket, `write()` returned `false`): QoS 0 messages to it are dropped, and counted in
    /// `stats().droppedQos0Congested`, until `handleDrained`. QoS 1 and 2 messages go on.
    #[wasm_bindgen(js_name = handleCongested)]
    pub fn handle_congested(
        &mut self,
        conn: f64,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let conn = conn_id(conn)?;
        self.inner
            .handle_input(now(now_ms)?, Input::Congested { conn });
        Ok(())
    }

    /// Connection `conn`, reported congested, has written its backlog (a Node socket's
    /// `"drain"` event): QoS 0 messages to it resume.
    #[wasm_bindgen(js_name = handleDrained)]
    pub fn handle_drained(
        &mut self,
        conn: f64,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let conn = conn_id(conn)?;
        self.inner
            .handle_input(now(now_ms)?, Input::Drained { conn });
        Ok(())
    }

    /// The deadline from `pollTimeout()` (or a later time) has come.
    #[wasm_bindgen(js_name = handleTimeout)]
    pub fn handle_timeout(
        &mut self,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        self.inner.handle_input(now(now_ms)?, Input::Timeout);
        self.collect_hook_errors();
        Ok(())
    }

    /// The decision for a connection whose `authenticate` hook answered `"pending"`:
    /// `true`, `false`, `{ allow: true, username? }`, `{ deny: reasonCode }` or
    /// `{ continue: Uint8Array }`.
    #[wasm_bindgen(js_name = authDecision)]
    pub fn auth_decision(
        &mut self,
        conn: f64,
        #[wasm_bindgen(unchecked_param_type = "AuthResult")] result: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let conn = conn_id(conn)?;
        let outcome: AuthOutcome = auth_outcome(&result, false)?;
        self.inner
            .handle_input(now(now_ms)?, Input::AuthDecision { conn, outcome });
        self.collect_hook_errors();
        Ok(())
    }

    /// The next thing to do, in order, or `undefined` when there is nothing left:
    /// `{ type: "send", conn, data }`, `{ type: "close", conn }`,
    /// `{ type: "persist", key, value }` (value `null`: delete), `{ type: "event", event }` or
    /// `{ type: "hookError", hook, error }`.
    #[wasm_bindgen(js_name = pollOutput, unchecked_return_type = "Output | undefined")]
    pub fn poll_output(&mut self) -> JsValue {
        if let Some(e) = self.pending.pop_front() {
            return e;
        }
        self.inner
            .poll_output()
            .map_or(JsValue::UNDEFINED, |o| output::output(&o))
    }

    /// Every pending output at once, in order (one call instead of one per output). The
    /// `data` of its `send` outputs are views of one shared buffer.
    #[wasm_bindgen(unchecked_return_type = "Output[]")]
    pub fn drain(&mut self) -> JsValue {
        let out = js_sys::Array::new();
        for e in self.pending.drain(..) {
            out.push(&e);
        }
        let outputs: Vec<Output> = std::iter::from_fn(|| self.inner.poll_output()).collect();
        // One JS allocation for every byte to send, instead of one per send.
        let mut all = Vec::new();
        for o in &outputs {
            if let Output::Send { data, .. } = o {
                all.extend_from_slice(data);
            }
        }
        let shared = glue::copy_bytes(&all);
        let mut at = 0u32;
        for o in &outputs {
            let js = match o {
                Output::Send { conn, data } => {
                    // Sends are bounded by the packet size limits, far below 4 GiB in total
                    // for one drain in practice; past u32 the views would be wrong, not unsafe.
                    let end = at.saturating_add(data.len() as u32);
                    let v = glue::send_output_in(conn.0 as f64, &shared, at, end);
                    at = end;
                    v
                }
                other => output::output(other),
            };
            out.push(&js);
        }
        out.into()
    }

    /// Whether to go on reading from `conn`: `false` while an `authenticate` hook's answer is
    /// pending and the broker already holds one packet's worth of what the client sent after
    /// CONNECT. Pause the socket then (a Node socket's `pause()`) and resume it after
    /// `authDecision`, so that a client cannot make the broker hold more before it has logged
    /// in.
    #[wasm_bindgen(js_name = wantsInput)]
    pub fn wants_input(&self, conn: f64) -> Result<bool, JsValue> {
        Ok(self.inner.wants_input(conn_id(conn)?))
    }

    /// When to call `handleTimeout` next (ms since the epoch), or `undefined` if never.
    #[wasm_bindgen(js_name = pollTimeout)]
    pub fn poll_timeout(&self) -> Option<f64> {
        self.inner.poll_timeout().map(|t| t.as_millis() as f64)
    }

    /// Counters and current sizes.
    #[wasm_bindgen(unchecked_return_type = "BrokerStats")]
    pub fn stats(&self) -> JsValue {
        output::stats(&self.inner.stats())
    }

    /// Every session, connected or not, sorted by client id.
    #[wasm_bindgen(unchecked_return_type = "ClientSummary[]")]
    pub fn clients(&self) -> JsValue {
        js::array(self.inner.clients().iter().map(output::client))
    }

    /// The effective configuration (defaults filled in).
    #[wasm_bindgen(unchecked_return_type = "Required<BrokerConfig>")]
    pub fn config(&self) -> JsValue {
        config::to_js(self.inner.config())
    }

    /// Feeds back every stored record (`[key, value]` pairs of `persist` outputs, in any order)
    /// after a restart, before the first `accept`. Returns what was rebuilt; unreadable records
    /// are listed and left alone.
    #[wasm_bindgen(unchecked_return_type = "RestoreReport")]
    pub fn restore(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "Array<[Uint8Array, Uint8Array]>")] records: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<JsValue, JsValue> {
        let now = now(now_ms)?;
        let mut parsed: Vec<(Bytes, Bytes)> = Vec::new();
        for (i, record) in js::elements(&records, "records")?.iter().enumerate() {
            let at = format!("records[{i}]");
            let pair = js::elements(record, &at)?;
            let [key, value] = pair.as_slice() else {
                return Err(js::type_error(&format!(
                    "{at}: expected a [key, value] pair, got {} elements",
                    pair.len()
                )));
            };
            parsed.push((
                js::bytes(key, &format!("{at}[0]"))?,
                js::bytes(value, &format!("{at}[1]"))?,
            ));
        }
        let report = self.inner.restore(now, parsed);
        Ok(output::restore_report(&report))
    }

    /// Publishes a message from the embedding app (system topics, bridges):
    /// `{ topic, payload?, qos?, retain?, properties? }`. Returns the number of sessions it was
    /// delivered or queued to.
    pub fn publish(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "PublishMessage")] message: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<usize, JsValue> {
        let now = now(now_ms)?;
        let mut f = Fields::new(&message, "message")?;
        let topic_path = f.path_of("topic");
        let topic = js::string(&f.required("topic")?, &topic_path)?;
        let qos_path = f.path_of("qos");
        let qos = match f.get("qos")? {
            Some(v) => packet::qos(&v, &qos_path)?,
            None => Default::default(),
        };
        let payload = f.bytes("payload")?.unwrap_or_default();
        let retain = f.bool("retain")?.unwrap_or(false);
        let properties = packet::publish_properties(&mut f)?;
        f.finish()?;
        let message = Message {
            topic: topic.into(),
            payload,
            qos,
            retain,
            properties: properties.into(),
            expires_at: None,
            origin: None,
        };
        let delivered = self
            .inner
            .publish(now, message)
            .map_err(|e| js::type_error(&format!("{topic_path}: invalid topic name: {e}")));
        self.collect_hook_errors();
        delivered
    }

    /// Disconnects a client (MQTT 5.0 clients get DISCONNECT with `reasonCode`, default 0x98
    /// administrative action). Returns whether it was connected.
    #[wasm_bindgen(js_name = disconnectClient)]
    pub fn disconnect_client(
        &mut self,
        #[wasm_bindgen(js_name = clientId, unchecked_param_type = "string")] client_id: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
        #[wasm_bindgen(js_name = reasonCode)] reason_code: Option<f64>,
    ) -> Result<bool, JsValue> {
        let client_id = js::string(&client_id, "clientId")?;
        let reason = match reason_code {
            Some(c) => ReasonCode(js::uint(&c.into(), 255, "reasonCode")? as u8),
            None => ReasonCode::ADMINISTRATIVE_ACTION,
        };
        let was = self
            .inner
            .disconnect_client(now(now_ms)?, &client_id, reason);
        self.collect_hook_errors();
        Ok(was)
    }

    /// Graceful shutdown: every connection is closed (MQTT 5.0 clients get DISCONNECT 0x8B);
    /// persistent sessions stay in storage. Drain the outputs afterwards.
    pub fn shutdown(
        &mut self,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        self.inner.shutdown(now(now_ms)?);
        self.collect_hook_errors();
        Ok(())
    }
}

impl JsBroker {
    /// Moves errors thrown by hooks during the last input to the front of the output queue.
    pub(crate) fn collect_hook_errors(&mut self) {
        for (hook, error) in self.hook_errors.borrow_mut().drain(..) {
            let o = Obj::tagged("hookError");
            o.set("hook", hook).set("error", error);
            self.pending.push_back(o.into_js());
        }
    }
}
