//! The Worker's fetch handler and the Durable Object that holds the broker.

use meridian_core::Config;
use worker::{
    Context, DurableObject, Env, Headers, Request, Response, Result, State, WebSocketPair,
    durable_object, event,
};

use crate::shell::Edge;
use crate::users::Users;

/// The Durable Object binding in `wrangler.toml`.
const BINDING: &str = "MQTT_BROKER";
/// The secret that lists the users (see [`crate::users`]).
const USERS_SECRET: &str = "MQTT_USERS";
/// The path MQTT clients connect to, as Mosquitto's and EMQX's WebSocket listeners use.
const MQTT_PATH: &str = "/mqtt";

#[event(fetch)]
async fn fetch(req: Request, env: Env, _ctx: Context) -> Result<Response> {
    match req.path().as_str() {
        MQTT_PATH => {
            if !is_websocket_upgrade(&req)? {
                return Response::error(
                    "MQTT over WebSocket: connect with a WebSocket client (subprotocol mqtt)\n",
                    426,
                );
            }
            let name = optional_var(&env, "BROKER_NAME").unwrap_or_else(|| "meridian".into());
            let namespace = env.durable_object(BINDING)?;
            let id = namespace.id_from_name(&name)?;
            let stub = match optional_var(&env, "LOCATION_HINT") {
                Some(hint) => id.get_stub_with_location_hint(&hint)?,
                None => id.get_stub()?,
            };
            stub.fetch_with_request(req).await
        }
        "/" => Response::ok(format!(
            "Meridian edge broker: MQTT over WebSocket at {MQTT_PATH} (subprotocol mqtt)\n"
        )),
        _ => Response::error("not found\n", 404),
    }
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

/// One MQTT broker. Its clients connect through the Worker above.
#[durable_object]
#[derive(Debug)]
pub struct MqttBroker {
    edge: Edge,
}

impl DurableObject for MqttBroker {
    fn new(state: State, env: Env) -> Self {
        // A secret that does not parse leaves the broker unstarted: connections get 503 and
        // the log names the line.
        let users = match env.secret(USERS_SECRET) {
            Ok(secret) => Users::parse(&secret.to_string()).map_err(|e| e.to_string()),
            Err(_) => Ok(Users::default()),
        };
        Self {
            edge: Edge::new(Config::default(), users, state.storage()),
        }
    }

    async fn fetch(&self, req: Request) -> Result<Response> {
        if !is_websocket_upgrade(&req)? {
            return Response::error("expected a WebSocket upgrade\n", 426);
        }
        if let Err(error) = self.edge.ensure_started() {
            worker::console_error!("meridian: cannot start the broker: {error}");
            return Response::error("the broker cannot start; its log says why\n", 503);
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

    async fn alarm(&self) -> Result<Response> {
        self.edge.alarm()?;
        Response::ok("")
    }
}
