//! The Worker's fetch handler and the Durable Object that holds the broker.

use meridian_core::Config;
use meridian_core::acl::Acl;
use wasm_bindgen::JsValue;
use worker::{
    Context, DurableObject, Env, Headers, Request, Response, Result, State, WebSocket,
    WebSocketIncomingMessage, WebSocketPair, durable_object, event,
};

use crate::link::Uplink;
use crate::links::HUB_LINK_PATH;
use crate::placement::Placement;
use crate::shell::{Edge, Hooks};
use crate::users::Users;

/// The Durable Object binding in the worker's `wrangler.toml` (`edge-worker/template`).
const BINDING: &str = "MQTT_BROKER";
/// The secret that lists the users (see [`crate::users`]).
const USERS_SECRET: &str = "MQTT_USERS";
/// The variable that lets anonymous clients in when no user is listed: `"true"` only.
const ALLOW_ANONYMOUS: &str = "ALLOW_ANONYMOUS";
/// The secret or variable that holds the access rules (see [`crate::rules`]).
const ACL_SECRET: &str = "MQTT_ACL";
/// The variable naming the daemon this broker is a leaf of (see [`crate::link`]).
const UPSTREAM_VAR: &str = "MERIDIAN_UPSTREAM";
/// The secret token the daemon's edge-link listener takes.
const LINK_TOKEN_SECRET: &str = "MERIDIAN_LINK_TOKEN";
/// The variable naming the location whose object is the hub of an edge-only deployment.
const HUB_VAR: &str = "EDGE_HUB";
/// The path MQTT clients connect to, as Mosquitto's and EMQX's WebSocket listeners use.
const MQTT_PATH: &str = "/mqtt";

/// The path of an object's state (`?location=NAME`).
const STATUS_PATH: &str = "/status";

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
    let path = req.path();
    match path.as_str() {
        MQTT_PATH | STATUS_PATH => {
            if path == MQTT_PATH && !is_websocket_upgrade(&req)? {
                return Response::error(
                    "MQTT over WebSocket: connect with a WebSocket client (subprotocol mqtt)\n",
                    426,
                );
            }
            let placement = match placement(&env) {
                Ok(p) => p,
                Err(error) => {
                    worker::console_error!("meridian: {error}");
                    return Response::error(
                        "the broker's placement is misconfigured; its log says why\n",
                        503,
                    );
                }
            };
            let pinned = req
                .url()?
                .query_pairs()
                .find(|(k, _)| k == "location")
                .map(|(_, v)| v.into_owned());
            let (country, continent) = req
                .cf()
                .map_or((None, None), |cf| (cf.country(), cf.continent()));
            let target =
                match placement.target(pinned.as_deref(), country.as_deref(), continent.as_deref())
                {
                    Ok(t) => t,
                    Err(why) => return Response::error(format!("{why}\n"), 404),
                };
            let namespace = env.durable_object(BINDING)?;
            let id = namespace.id_from_name(&target.object)?;
            let hint = target
                .hint
                .map(str::to_owned)
                .or_else(|| optional_var(&env, "LOCATION_HINT"));
            let stub = match hint {
                Some(hint) => id.get_stub_with_location_hint(&hint)?,
                None => id.get_stub()?,
            };
            stub.fetch_with_request(req).await
        }
        "/" => Response::ok(format!(
            "Meridian edge broker: MQTT over WebSocket at {MQTT_PATH} (subprotocol mqtt), \
             an object's state at {STATUS_PATH}?location=NAME\n"
        )),
        _ => Response::error("not found\n", 404),
    }
}

/// How clients are spread over objects (see [`crate::placement`]).
fn placement(env: &Env) -> std::result::Result<Placement, String> {
    let name = optional_var(env, "BROKER_NAME").unwrap_or_else(|| "meridian".into());
    let linked = optional_var(env, UPSTREAM_VAR).is_some() || optional_var(env, HUB_VAR).is_some();
    Placement::parse(
        text_binding(env, "PLACEMENT")?.as_deref(),
        text_binding(env, "EDGE_LOCATIONS")?.as_deref(),
        &name,
        linked,
    )
}

fn optional_var(env: &Env, name: &str) -> Option<String> {
    env.var(name)
        .ok()
        .map(|var| var.to_string())
        .filter(|value| !value.is_empty())
}

fn is_websocket_upgrade(req: &Request) -> Result<bool> {
    Ok(req
        .headers()
        .get("Upgrade")?
        .is_some_and(|value| value.eq_ignore_ascii_case("websocket")))
}

/// The subprotocol to answer: MQTT over WebSocket names `mqtt` (and `mqttv3.1` for 3.1
/// clients); clients such as MQTT.js refuse a connection that does not echo it.
fn subprotocol(req: &Request) -> Result<Option<&'static str>> {
    let offered = req
        .headers()
        .get("Sec-WebSocket-Protocol")?
        .unwrap_or_default();
    let offered: Vec<&str> = offered.split(',').map(str::trim).collect();
    Ok(["mqtt", "mqttv3.1"]
        .into_iter()
        .find(|name| offered.contains(name)))
}

/// A text binding (a secret or a variable): `None` when it is not bound.
fn text_binding(env: &Env, name: &str) -> std::result::Result<Option<String>, String> {
    let binding = js_sys::Reflect::get(env, &JsValue::from(name))
        .map_err(|_| format!("{name} cannot be read"))?;
    if binding.is_undefined() {
        return Ok(None);
    }
    binding
        .as_string()
        .map(Some)
        .ok_or_else(|| format!("{name} is not text"))
}

/// Who may connect and what they may do: the users of `MQTT_USERS` (nobody without it, unless
/// `ALLOW_ANONYMOUS` is `"true"`) and the rules of `MQTT_ACL` (everything allowed without it).
/// Anything that keeps them from being read (not text, a bad line, a secret that lists no
/// user, a bad rule) keeps the broker closed: connections get 503 and the log says why.
fn hooks(env: &Env) -> std::result::Result<Hooks, String> {
    let users = match text_binding(env, USERS_SECRET)? {
        Some(text) => {
            let users = Users::parse(&text).map_err(|e| e.to_string())?;
            if users.is_empty() {
                return Err(format!("{USERS_SECRET} is set but lists no user"));
            }
            users
        }
        None if text_binding(env, ALLOW_ANONYMOUS)?.as_deref() == Some("true") => Users::anyone(),
        None => Users::nobody(),
    };
    let acl = match text_binding(env, ACL_SECRET)? {
        Some(text) => crate::rules::parse(&text)?,
        None => Acl::default(),
    };
    let hub = match text_binding(env, HUB_VAR)?.filter(|h| !h.trim().is_empty()) {
        Some(location) => Some(placement(env)?.hub(&location)?),
        None => None,
    };
    let uplink = Uplink::parse(
        text_binding(env, UPSTREAM_VAR)?.as_deref(),
        text_binding(env, LINK_TOKEN_SECRET)?.as_deref(),
        hub,
    )?;
    Ok(Hooks { users, acl, uplink })
}

/// Limits for a broker inside one Durable Object, whose isolate has about 128 MB: smaller
/// packets, queues and counts than the daemon's defaults, and every message held within
/// 48 MiB, the part of the isolate left for messages beside the runtime, the module and the
/// connections (`edge-worker/README.md`, "Limits").
fn edge_config() -> Config {
    Config {
        max_held_bytes: 48 * 1024 * 1024,
        max_packet_size: 64 * 1024,
        max_inflight_bytes: 512 * 1024,
        max_queued_messages: 1_000,
        max_queued_bytes: 512 * 1024,
        max_sessions: 2_000,
        max_retained_messages: 1_000,
        ..Config::default()
    }
}

/// One MQTT broker. Its clients connect through the Worker above.
#[durable_object]
#[derive(Debug)]
pub struct MqttBroker {
    edge: Edge,
}

impl DurableObject for MqttBroker {
    fn new(state: State, env: Env) -> Self {
        let storage = state.storage();
        let namespace = env.durable_object(BINDING).ok();
        Self {
            edge: Edge::new(
                edge_config(),
                hooks(&env),
                state._inner(),
                storage,
                namespace,
            ),
        }
    }

    async fn fetch(&self, req: Request) -> Result<Response> {
        // Only another object of this Worker asks for this path: the Worker's fetch handler
        // above forwards /mqtt and /status alone.
        if req.path() == HUB_LINK_PATH && is_websocket_upgrade(&req)? {
            return match self.edge.accept_leaf() {
                Ok(response) => Ok(response),
                Err(error) => {
                    worker::console_error!("meridian: cannot take a leaf's link: {error}");
                    Response::error("the hub cannot start; its log says why\n", 503)
                }
            };
        }
        if req.path() == STATUS_PATH {
            if let Err(error) = self.edge.ensure_started() {
                worker::console_error!("meridian: cannot start the broker: {error}");
                return Response::error("the broker cannot start; its log says why\n", 503);
            }
            let mut response = Response::ok(self.edge.status_json())?;
            response
                .headers_mut()
                .set("content-type", "application/json")?;
            return Ok(response);
        }
        if !is_websocket_upgrade(&req)? {
            return Response::error("expected a WebSocket upgrade\n", 426);
        }
        if let Err(error) = self.edge.ensure_started() {
            worker::console_error!("meridian: cannot start the broker: {error}");
            return Response::error("the broker cannot start; its log says why\n", 503);
        }
        if !self.edge.has_room() {
            return Response::error("the broker holds as many connections as it may\n", 503);
        }
        let protocol = subprotocol(&req)?;
        let remote_addr = req.headers().get("CF-Connecting-IP")?;
        let pair = WebSocketPair::new()?;
        self.edge.accept(pair.server, remote_addr)?;
        let response = Response::from_websocket(pair.client)?;
        Ok(match protocol {
            Some(protocol) => {
                let headers = Headers::new();
                headers.set("Sec-WebSocket-Protocol", protocol)?;
                response.with_headers(headers)
            }
            None => response,
        })
    }

    async fn websocket_message(
        &self,
        ws: WebSocket,
        message: WebSocketIncomingMessage,
    ) -> Result<()> {
        match message {
            WebSocketIncomingMessage::Binary(data) => self.edge.message(&ws, Some(&data)),
            WebSocketIncomingMessage::String(_) => self.edge.message(&ws, None),
        }
    }

    async fn websocket_close(
        &self,
        ws: WebSocket,
        code: usize,
        _reason: String,
        _was_clean: bool,
    ) -> Result<()> {
        self.edge
            .socket_closed(&ws, Some(u16::try_from(code).unwrap_or(1000)))
    }

    async fn websocket_error(&self, ws: WebSocket, _error: worker::Error) -> Result<()> {
        self.edge.socket_closed(&ws, None)
    }

    async fn alarm(&self) -> Result<Response> {
        self.edge.alarm()?;
        Response::ok("")
    }
}
