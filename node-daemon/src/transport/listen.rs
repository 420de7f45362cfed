//! Listeners: accepting sockets, handing plain TCP ones to the broker task, and the TLS and
//! WebSocket handshakes before each such connection's task ([`ConnectionTask`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use meridian_core::ConnInfo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::{Instrument, debug, info_span, warn};

use crate::config::ListenerKind;
use crate::mailbox::{ConnEvent, EngineHandle, ToEngine};
use crate::transport::task::ConnectionTask;
use crate::transport::wire::{StreamWire, WsWire};

/// How a listener speaks MQTT.
#[derive(Debug, Clone)]
pub enum Transport {
    Tcp,
    /// `max_message_bytes` bounds one WebSocket message (and frame) before it is buffered: the
    /// packet-size limit plus room for framing.
    WebSocket {
        path: String,
        max_message_bytes: usize,
        origins: Origins,
    },
}

/// Which web pages may open a WebSocket connection, by the `Origin` header their browser
/// sends. A request without one (a client that is not a browser) is never refused for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origins {
    /// Every page.
    Any,
    /// These origins (`scheme://host[:port]`, compared without regard to case) and no others.
    Only(Vec<String>),
}

impl Origins {
    /// The policy of a listener from its `allowed_origins`. Unset, no page may use a listener
    /// where a browser is let in without giving anything the page must know (`ambient_login`:
    /// anonymous access, or a client certificate the browser presents by itself), and any page
    /// may use one where clients must give a password.
    pub fn from_config(allowed: Option<&[String]>, ambient_login: bool) -> Self {
        match allowed {
            Some(list) if list.iter().any(|o| o == "*") => Self::Any,
            Some(list) => Self::Only(list.to_vec()),
            None if ambient_login => Self::Only(Vec::new()),
            None => Self::Any,
        }
    }

    /// Whether a request with this `Origin` (if any) and `Host` may upgrade. An origin that
    /// is the listener itself reached on a loopback name (`http://127.0.0.1:8083`, as
    /// paho-mqtt sends) is the broker's own, not another page's; a page whose name was merely
    /// pointed at a loopback address (DNS rebinding) names its own host, and is refused.
    pub fn allow(&self, origin: Option<&[u8]>, host: Option<&[u8]>) -> bool {
        let Some(origin) = origin else {
            return true;
        };
        match self {
            Self::Any => true,
            Self::Only(list) => {
                list.iter()
                    .any(|allowed| allowed.as_bytes().eq_ignore_ascii_case(origin))
                    || host.is_some_and(|host| same_loopback_origin(origin, host))
            }
        }
    }
}

/// Whether `origin` is `http://HOST` or `https://HOST` for this request's `Host`, and that
/// host is a loopback name.
fn same_loopback_origin(origin: &[u8], host: &[u8]) -> bool {
    let (Ok(origin), Ok(host)) = (std::str::from_utf8(origin), std::str::from_utf8(host)) else {
        return false;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    authority.is_some_and(|a| a.eq_ignore_ascii_case(host)) && is_loopback_host(host)
}

/// Whether an HTTP `Host` value (`name[:port]`) names this machine's loopback interface:
/// `localhost`, an address in 127.0.0.0/8, or `[::1]`.
pub fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(ip, _)| ip),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Bind a listening socket at `addr` whose kernel queue holds `backlog` connections not yet
/// accepted (capped by the kernel at `net.core.somaxconn`). std's and tokio's `bind` use 128,
/// which a burst of clients reconnecting at once overflows: each connection beyond it waits
/// for its SYN to be sent again, a second later.
pub fn bind(addr: std::net::SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As std's `bind` does on Unix: a restarted broker binds its port at once, whatever
    // connections of the previous run wait out TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// One running listener's settings.
#[derive(Clone)]
pub struct ListenerSpec {
    pub kind: ListenerKind,
    pub transport: Transport,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub max_packet_size: Option<u32>,
}

impl std::fmt::Debug for ListenerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerSpec")
            .field("kind", &self.kind)
            .field("transport", &self.transport)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// Accept connections until `stop` turns true. Each connection holds a permit of `permits`
/// (the listener's `max_connections`) until it ends.
pub async fn accept_loop(
    listener: TcpListener,
    spec: ListenerSpec,
    engine: EngineHandle,
    permits: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) {
    let spec = Arc::new(spec);
    loop {
        let (socket, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: note it and keep going.
                    warn!(listener = spec.kind.name(), error = %e, "accept failed");
                    tokio::task::yield_now().await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            engine
                .counters
                .connections_rejected
                .fetch_add(1, Ordering::Relaxed);
            debug!(listener = spec.kind.name(), %peer, "max_connections reached, closing");
            drop(socket);
            continue;
        };
        engine
            .counters
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        let _ = socket.set_nodelay(true);
        let info = ConnInfo {
            remote_addr: Some(peer.to_string()),
            tls_identity: None,
            max_packet_size: spec.max_packet_size,
        };
        // Plain MQTT over TCP: the broker task serves the socket itself.
        if spec.tls.is_none() && matches!(spec.transport, Transport::Tcp) {
            let socket = match socket.into_std() {
                Ok(s) => s,
                Err(e) => {
                    warn!(listener = spec.kind.name(), %peer, error = %e, "cannot take the socket over");
                    continue;
                }
            };
            let accept = ToEngine::Conn(ConnEvent::AcceptTcp {
                info,
                socket,
                permit,
            });
            // A full queue holds back accepting too.
            if engine.tx.send(accept).await.is_err() {
                return; // The broker task has stopped.
            }
        } else {
            let engine = engine.clone();
            let span = info_span!("conn", listener = spec.kind.name(), %peer);
            let spec = spec.clone();
            tokio::spawn(
                async move {
                    match &spec.tls {
                        None => {
                            serve_transport(socket, info, &spec.transport, engine, permit).await
                        }
                        Some(acceptor) => {
                            serve_tls(socket, info, acceptor, &spec.transport, engine, permit).await
                        }
                    }
                }
                .instrument(span),
            );
        }
    }
}

async fn serve_tls(
    socket: TcpStream,
    mut info: ConnInfo,
    acceptor: &tokio_rustls::TlsAcceptor,
    transport: &Transport,
    engine: EngineHandle,
    permit: OwnedSemaphorePermit,
) {
    // A handshake is bounded by the same timeout a client has to send CONNECT.
    let handshake =
        tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(socket)).await;
    match handshake {
        Ok(Ok(tls)) => {
            info.tls_identity = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|cert| crate::transport::tls::common_name(cert));
            serve_transport(tls, info, transport, engine, permit).await
        }
        Ok(Err(e)) => debug!(error = %e, "TLS handshake failed"),
        Err(_) => debug!("TLS handshake timed out"),
    }
}

async fn serve_transport<S>(
    stream: S,
    info: ConnInfo,
    transport: &Transport,
    engine: EngineHandle,
    permit: OwnedSemaphorePermit,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match transport {
        Transport::Tcp => ConnectionTask::new(StreamWire::new(stream), info, &engine, permit).await,
        Transport::WebSocket {
            path,
            max_message_bytes,
            origins,
        } => {
            // Boxed: the WebSocket state is large, and plain MQTT connections need none of it.
            Box::pin(serve_websocket(
                stream,
                info,
                WsSettings {
                    path,
                    max_message_bytes: *max_message_bytes,
                    origins,
                },
                engine,
                permit,
            ))
            .await
        }
    }
}

/// What a WebSocket listener checks and bounds.
#[derive(Debug, Clone, Copy)]
pub struct WsSettings<'a> {
    pub path: &'a str,
    pub max_message_bytes: usize,
    pub origins: &'a Origins,
}

/// MQTT over WebSocket (binary frames, subprotocol `mqtt`).
pub async fn serve_websocket<S>(
    stream: S,
    info: ConnInfo,
    settings: WsSettings<'_>,
    engine: EngineHandle,
    permit: OwnedSemaphorePermit,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let WsSettings {
        path,
        max_message_bytes,
        origins,
    } = settings;
    let refused = |status: StatusCode, text: &str| {
        let mut err = ErrorResponse::new(Some(text.to_owned()));
        *err.status_mut() = status;
        err
    };
    // The signature is tungstenite's; its error type is what it is.
    #[allow(clippy::result_large_err)]
    let callback = |req: &Request, mut resp: Response| -> Result<Response, ErrorResponse> {
        if req.uri().path() != path {
            return Err(refused(StatusCode::NOT_FOUND, "not found"));
        }
        let origin = req.headers().get("origin").map(HeaderValue::as_bytes);
        let host = req.headers().get("host").map(HeaderValue::as_bytes);
        if !origins.allow(origin, host) {
            engine
                .counters
                .websocket_origin_refused
                .fetch_add(1, Ordering::Relaxed);
            debug!(origin = ?origin.map(String::from_utf8_lossy), "WebSocket origin refused");
            return Err(refused(
                StatusCode::FORBIDDEN,
                "this page's origin may not use the broker (listeners.*.allowed_origins)",
            ));
        }
        let offered = req
            .headers()
            .get_all("sec-websocket-protocol")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .find(|p| p.eq_ignore_ascii_case("mqtt") || p.eq_ignore_ascii_case("mqttv3.1"));
        if let Some(p) = offered
            && let Ok(v) = HeaderValue::from_str(p)
        {
            resp.headers_mut().insert("sec-websocket-protocol", v);
        }
        Ok(resp)
    };
    let ws = match tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio_tungstenite::accept_hdr_async_with_config(
            stream,
            callback,
            Some(
                WebSocketConfig::default()
                    .max_message_size(Some(max_message_bytes))
                    .max_frame_size(Some(max_message_bytes)),
            ),
        ),
    )
    .await
    {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => {
            debug!(error = %e, "WebSocket handshake failed");
            return;
        }
        Err(_) => {
            debug!("WebSocket handshake timed out");
            return;
        }
    };
    ConnectionTask::new(WsWire(ws), info, &engine, permit).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for yes in [
            "localhost",
            "LOCALHOST:8083",
            "127.0.0.1",
            "127.0.0.1:8083",
            "127.9.9.9:1",
            "[::1]",
            "[::1]:8081",
        ] {
            assert!(is_loopback_host(yes), "{yes}");
        }
        for no in [
            "example.com",
            "localhost.example.com:80",
            "10.0.0.1:8083",
            "[::2]:1",
            "",
        ] {
            assert!(!is_loopback_host(no), "{no}");
        }
    }

    #[test]
    fn origins() {
        let none = Origins::from_config(None, true);
        let h = |s: &'static str| Some(s.as_bytes());
        assert!(none.allow(None, h("127.0.0.1:8083")), "not a browser");
        assert!(!none.allow(h("https://evil.example"), h("127.0.0.1:8083")));
        assert!(none.allow(h("http://127.0.0.1:8083"), h("127.0.0.1:8083")));
        assert!(none.allow(h("https://LOCALHOST:8083"), h("localhost:8083")));
        // DNS rebinding: the page's own name, pointed at loopback.
        assert!(!none.allow(h("http://evil.example:8083"), h("evil.example:8083")));
        assert!(!none.allow(h("http://127.0.0.1:9999"), h("127.0.0.1:8083")));
        assert_eq!(Origins::from_config(None, false), Origins::Any);
        let star = ["*".to_owned()];
        assert_eq!(Origins::from_config(Some(&star), true), Origins::Any);
        let listed = ["https://app.example.com".to_owned()];
        let only = Origins::from_config(Some(&listed), false);
        assert!(only.allow(h("https://APP.example.com"), h("broker.example.com")));
        assert!(!only.allow(h("https://other.example.com"), h("broker.example.com")));
    }
}
