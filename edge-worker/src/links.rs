//! Sockets that carry link frames: an object's link up to its hub (a daemon's edge-link
//! listener, or the hub object of an edge-only deployment), and at a hub object, its leaves'
//! links. Each is an ordinary (not hibernatable) WebSocket whose events call back into the
//! object; a binary message holds whole link frames.

use js_sys::{ArrayBuffer, Uint8Array};

use meridian_core::routes::NodeId;
use wasm_bindgen::closure::Closure;
use wasm_bindgen::{JsCast, JsValue};
use worker::{Fetch, Headers, ObjectNamespace, Request, RequestInit, Response, WebSocket, web_sys};

use crate::link::{LinkConfig, Uplink};

/// The path a hub object takes its leaves' links on. The Worker's fetch handler forwards
/// `/mqtt` and `/status` only, so a request for it reaches an object from another object of
/// the same Worker, never from outside.
pub const HUB_LINK_PATH: &str = "/link";
/// The response header in which a hub names itself (as the daemon's edge-link listener does).
pub const NODE_HEADER: &str = "meridian-node";

/// A socket's event handlers, kept for as long as it is open.
pub type Handlers = [Closure<dyn FnMut(JsValue)>; 3];

/// One link: its socket, and the node at the other end once known.
pub struct PeerSocket {
    pub ws: WebSocket,
    /// The hub an upgrade named, or the leaf its `Hello` named (`None` until then).
    pub node: Option<NodeId>,
    _handlers: Handlers,
}

impl std::fmt::Debug for PeerSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerSocket")
            .field("node", &self.node)
            .finish()
    }
}

impl PeerSocket {
    /// Listens on `ws`: each binary message goes to `on_data`; a text message, a close or an
    /// error to `on_end` (with the reason to close it with, for a text message).
    pub fn listen(
        ws: WebSocket,
        node: Option<NodeId>,
        on_data: impl Fn(&[u8]) + 'static,
        on_end: impl Fn(Option<&'static str>) + 'static,
    ) -> Self {
        let on_end = std::rc::Rc::new(on_end);
        let on_message = Closure::<dyn FnMut(JsValue)>::new({
            let on_end = on_end.clone();
            move |event: JsValue| {
                let data = event
                    .dyn_ref::<web_sys::MessageEvent>()
                    .map(web_sys::MessageEvent::data);
                match data.as_ref().and_then(|d| d.dyn_ref::<ArrayBuffer>()) {
                    Some(buffer) => on_data(&Uint8Array::new(buffer).to_vec()),
                    None => on_end(Some("a text message")),
                }
            }
        });
        let ended = || {
            let on_end = on_end.clone();
            Closure::<dyn FnMut(JsValue)>::new(move |_: JsValue| on_end(None))
        };
        let (on_close, on_error) = (ended(), ended());
        let socket: &web_sys::WebSocket = ws.as_ref();
        socket.set_binary_type(web_sys::BinaryType::Arraybuffer);
        socket.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        socket.set_onclose(Some(on_close.as_ref().unchecked_ref()));
        socket.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        Self {
            ws,
            node,
            _handlers: [on_message, on_close, on_error],
        }
    }

    /// Sends one frame, as one message (a socket that is closing refuses; its close event
    /// says so). Each frame its own message: a batch of them would reach the other end as one
    /// event, whose deliveries could overflow a subscriber's queue before its acknowledgements
    /// are read (measured: `docs/benchmarks.md`, "Edge-only").
    pub fn send(&self, frame: &[u8]) {
        let _ = self.ws.send_with_bytes(frame);
    }

    /// Closes the socket with `code` and `reason`, and lets go of its handlers once the
    /// running event (which may be one of them) is over.
    pub fn retire(self, code: u16, reason: &str) {
        let _ = self.ws.close(Some(code), Some(reason));
        wasm_bindgen_futures::spawn_local(async move { drop(self) });
    }
}

/// Opens the link up: an upgrade to the daemon's `/link` with its token, or to the hub
/// object's through its stub. The other end names itself in its answer.
pub async fn dial(
    uplink: &Uplink,
    namespace: Option<&ObjectNamespace>,
) -> worker::Result<(WebSocket, NodeId)> {
    let headers = Headers::new();
    headers.set("Upgrade", "websocket")?;
    let (response, who) = match uplink {
        Uplink::Region(LinkConfig { url, token }) => {
            headers.set("Authorization", &format!("Bearer {token}"))?;
            let mut init = RequestInit::new();
            init.with_headers(headers);
            let response = Fetch::Request(Request::new_with_init(url, &init)?)
                .send()
                .await?;
            (response, "the daemon")
        }
        Uplink::Hub(hub) => {
            let namespace = namespace
                .ok_or_else(|| worker::Error::RustError("no Durable Object binding".into()))?;
            let id = namespace.id_from_name(&hub.object)?;
            let stub = match hub.hint {
                Some(hint) => id.get_stub_with_location_hint(hint)?,
                None => id.get_stub()?,
            };
            let mut init = RequestInit::new();
            init.with_headers(headers);
            let url = format!("https://{}{HUB_LINK_PATH}", hub.object);
            let response = stub
                .fetch_with_request(Request::new_with_init(&url, &init)?)
                .await?;
            (response, "the hub object")
        }
    };
    upgraded(response, who)
}

/// The socket of an upgrade's answer, and the node it names.
fn upgraded(response: Response, who: &str) -> worker::Result<(WebSocket, NodeId)> {
    let status = response.status_code();
    let node = response.headers().get(NODE_HEADER)?;
    let ws = response
        .websocket()
        .ok_or_else(|| worker::Error::RustError(format!("{who} answered {status}")))?;
    let node = node
        .and_then(|n| NodeId::new(&n).ok())
        .ok_or_else(|| worker::Error::RustError(format!("{who} did not name itself")))?;
    ws.accept()?;
    Ok((ws, node))
}
