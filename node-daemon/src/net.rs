//! Listeners and connection tasks.
//!
//! Each accepted socket gets a reader (this task) and a writer task. The reader forwards what it
//! reads to the broker thread and waits when that thread's queue is full; the writer writes what
//! the broker thread hands it. The broker thread bounds each writer's backlog in bytes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use meridian_core::ConnInfo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::{Instrument, debug, info_span, warn};

use crate::engine::{ConnWriter, EngineHandle, ToEngine, WriteCmd};

/// Read buffer sizes. An idle connection holds the smallest; a connection whose reads fill the
/// buffer doubles it, up to the largest, and halves it again when reads get small.
const READ_MIN: usize = 256;
const READ_MAX: usize = 16 * 1024;

/// How a listener speaks MQTT.
#[derive(Debug, Clone)]
pub enum Transport {
    Tcp,
    /// `max_message_bytes` bounds one WebSocket message (and frame) before it is buffered: the
    /// packet-size limit plus room for framing.
    WebSocket {
        path: String,
        max_message_bytes: usize,
    },
}

/// One running listener's settings.
#[derive(Clone)]
pub struct ListenerSpec {
    pub name: &'static str,
    pub transport: Transport,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub max_connections: usize,
    pub max_packet_size: Option<u32>,
}

impl std::fmt::Debug for ListenerSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerSpec")
            .field("name", &self.name)
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
    loop {
        let (socket, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: note it and keep going.
                    warn!(listener = spec.name, error = %e, "accept failed");
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
            debug!(listener = spec.name, %peer, "max_connections reached, closing");
            drop(socket);
            continue;
        };
        engine
            .counters
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        let _ = socket.set_nodelay(true);
        let spec = spec.clone();
        let engine = engine.clone();
        let span = info_span!("conn", listener = spec.name, %peer);
        tokio::spawn(
            async move {
                serve_socket(socket, peer, &spec, engine).await;
                drop(permit);
            }
            .instrument(span),
        );
    }
}

async fn serve_socket(
    socket: TcpStream,
    peer: SocketAddr,
    spec: &ListenerSpec,
    engine: EngineHandle,
) {
    let info = ConnInfo {
        remote_addr: Some(peer.to_string()),
        tls_identity: None,
        max_packet_size: spec.max_packet_size,
    };
    match &spec.tls {
        None => serve_transport(socket, info, &spec.transport, engine).await,
        // Boxed: the TLS handshake and stream are large, and most connections have neither.
        Some(acceptor) => {
            Box::pin(serve_tls(socket, info, acceptor, &spec.transport, engine)).await
        }
    }
}

async fn serve_tls(
    socket: TcpStream,
    mut info: ConnInfo,
    acceptor: &tokio_rustls::TlsAcceptor,
    transport: &Transport,
    engine: EngineHandle,
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
                .and_then(|cert| crate::tls::common_name(cert));
            serve_transport(tls, info, transport, engine).await
        }
        Ok(Err(e)) => debug!(error = %e, "TLS handshake failed"),
        Err(_) => debug!("TLS handshake timed out"),
    }
}

async fn serve_transport<S>(stream: S, info: ConnInfo, transport: &Transport, engine: EngineHandle)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match transport {
        Transport::Tcp => serve_stream(stream, info, engine).await,
        Transport::WebSocket {
            path,
            max_message_bytes,
        } => {
            // Boxed: the WebSocket state is large, and plain MQTT connections need none of it.
            Box::pin(serve_websocket(
                stream,
                info,
                path,
                *max_message_bytes,
                engine,
            ))
            .await
        }
    }
}

/// MQTT straight over a byte stream (TCP or TLS).
pub async fn serve_stream<S>(stream: S, info: ConnInfo, engine: EngineHandle)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, wr) = tokio::io::split(stream);
    let (writer, rx) = ConnWriter::new();
    let queued = writer.queued.clone();
    let kill = writer.kill.clone();
    let Some(conn) = engine.accept(info, writer).await else {
        return;
    };
    let mut write_task = tokio::spawn(write_stream(wr, rx, queued, kill).in_current_span());
    let mut want = READ_MIN;
    let mut buf = BytesMut::new();
    loop {
        buf.reserve(want);
        tokio::select! {
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    want = if n >= want {
                        (want * 2).min(READ_MAX)
                    } else if n < want / 4 {
                        (want / 2).max(READ_MIN)
                    } else {
                        want
                    };
                    let data = buf.split().freeze();
                    if engine.tx.send(ToEngine::Bytes { conn, data }).await.is_err() {
                        break;
                    }
                }
            },
            _ = &mut write_task => break,
        }
    }
    let _ = engine.tx.send(ToEngine::Closed { conn }).await;
}

async fn write_stream<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<WriteCmd>,
    queued: Arc<std::sync::atomic::AtomicUsize>,
    kill: Arc<tokio::sync::Notify>,
) {
    loop {
        let cmd = tokio::select! {
            c = rx.recv() => c,
            () = kill.notified() => return,
        };
        match cmd {
            Some(WriteCmd::Data(data)) => {
                let len = data.len();
                let ok = tokio::select! {
                    r = wr.write_all(&data) => r.is_ok(),
                    () = kill.notified() => return,
                };
                queued.fetch_sub(len, Ordering::AcqRel);
                if !ok {
                    return;
                }
                if rx.is_empty() && wr.flush().await.is_err() {
                    return;
                }
            }
            Some(WriteCmd::Close) | None => {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                    let _ = wr.flush().await;
                    let _ = wr.shutdown().await;
                })
                .await;
                return;
            }
        }
    }
}

/// MQTT over WebSocket (binary frames, subprotocol `mqtt`).
pub async fn serve_websocket<S>(
    stream: S,
    info: ConnInfo,
    path: &str,
    max_message_bytes: usize,
    engine: EngineHandle,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let expected = path.to_owned();
    // The signature is tungstenite's; its error type is what it is.
    #[allow(clippy::result_large_err)]
    let callback = move |req: &Request, mut resp: Response| -> Result<Response, ErrorResponse> {
        if req.uri().path() != expected {
            let mut err = ErrorResponse::new(Some("not found".to_owned()));
            *err.status_mut() = StatusCode::NOT_FOUND;
            return Err(err);
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
    let (mut sink, mut stream) = ws.split();
    let (writer, mut rx) = ConnWriter::new();
    let queued = writer.queued.clone();
    let kill = writer.kill.clone();
    let Some(conn) = engine.accept(info, writer).await else {
        return;
    };
    let mut write_task = tokio::spawn(
        async move {
            loop {
                let cmd = tokio::select! {
                    c = rx.recv() => c,
                    () = kill.notified() => return,
                };
                match cmd {
                    Some(WriteCmd::Data(data)) => {
                        let len = data.len();
                        let ok = tokio::select! {
                            r = sink.send(WsMessage::Binary(data)) => r.is_ok(),
                            () = kill.notified() => return,
                        };
                        queued.fetch_sub(len, Ordering::AcqRel);
                        if !ok {
                            return;
                        }
                    }
                    Some(WriteCmd::Close) | None => {
                        let _ =
                            tokio::time::timeout(std::time::Duration::from_secs(5), sink.close())
                                .await;
                        return;
                    }
                }
            }
        }
        .in_current_span(),
    );
    loop {
        tokio::select! {
            m = stream.next() => match m {
                Some(Ok(WsMessage::Binary(data))) => {
                    if engine.tx.send(ToEngine::Bytes { conn, data }).await.is_err() {
                        break;
                    }
                }
                Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_))) => {}
                // Text frames are not MQTT; close like any other malformed input.
                Some(Ok(WsMessage::Text(_) | WsMessage::Close(_))) | None => break,
                Some(Err(e)) => {
                    debug!(error = %e, "WebSocket read failed");
                    break;
                }
            },
            _ = &mut write_task => break,
        }
    }
    let _ = engine.tx.send(ToEngine::Closed { conn }).await;
}
