//! Listeners and connection tasks.
//!
//! Each accepted socket gets one task. It hands what it reads to the broker task (waiting,
//! without reading more, while its queue is full) and writes what the broker task
//! queued in the connection's [`Outbox`], whose backlog the broker task bounds in bytes.
//! Reading and writing proceed independently within the task.
//!
//! One loop (`serve`) serves every transport: plain TCP, TLS and WebSocket each supply a
//! reading half (`WireRead`) and a writing half (`WireWrite`). A connection's task keeps its
//! whole state for as long as the connection lives, so its waits are kept small.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use std::collections::VecDeque;
use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use meridian_core::{ConnId, ConnInfo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadHalf};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::OwnedPermit;
use tokio::sync::mpsc::error::{SendError, TrySendError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::{Instrument, debug, info_span, warn};

use crate::engine::{EngineHandle, ToEngine};
use crate::outbox::{End, Outbox};

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
    let spec = Arc::new(spec);
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
        let span = info_span!("conn", listener = spec.name, %peer);
        let info = ConnInfo {
            remote_addr: Some(peer.to_string()),
            tls_identity: None,
            max_packet_size: spec.max_packet_size,
        };
        let engine = engine.clone();
        // Plain MQTT over TCP is spawned as it is: a task keeps its whole state for as long as
        // the connection lives, and the TLS and WebSocket layers are large.
        if spec.tls.is_none() && matches!(spec.transport, Transport::Tcp) {
            tokio::spawn(serve_tcp(socket, info, engine, permit).instrument(span));
        } else {
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
                .and_then(|cert| crate::tls::common_name(cert));
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
        Transport::Tcp => serve_stream(stream, info, engine, permit).await,
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
                permit,
            ))
            .await
        }
    }
}

/// Plain MQTT over TCP. `permit` is the listener's connection permit, held until the
/// connection ends.
async fn serve_tcp(
    socket: TcpStream,
    info: ConnInfo,
    engine: EngineHandle,
    permit: OwnedSemaphorePermit,
) {
    let outbox = Outbox::new();
    // Boxed here and below: the task keeps its largest state for as long as the connection
    // lives, and these waits happen once each.
    let Some(conn) = Box::pin(engine.accept(info, outbox.clone())).await else {
        return;
    };
    let (rd, wr) = socket.into_split();
    let reads = TcpReads { rd, want: READ_MIN };
    serve(reads, ByteWrites(wr), &outbox, conn, &engine).await;
    drop(permit);
}

/// MQTT straight over a byte stream (TLS). `permit` is the listener's connection permit,
/// held until the connection ends.
async fn serve_stream<S>(
    stream: S,
    info: ConnInfo,
    engine: EngineHandle,
    permit: OwnedSemaphorePermit,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let outbox = Outbox::new();
    let Some(conn) = Box::pin(engine.accept(info, outbox.clone())).await else {
        return;
    };
    let (rd, wr) = tokio::io::split(stream);
    let reads = StreamReads {
        rd,
        buf: BytesMut::new(),
        want: READ_MIN,
    };
    serve(reads, ByteWrites(wr), &outbox, conn, &engine).await;
    drop(permit);
}

/// A connection task's loop, whatever the transport: hand what is read to the broker task,
/// write what it queued, end when either side does.
async fn serve(
    mut rd: impl WireRead,
    mut wr: impl WireWrite,
    outbox: &Outbox,
    conn: ConnId,
    engine: &EngineHandle,
) {
    let mut out = VecDeque::new();
    let mut unflushed = false;
    let mut to_broker = ToBroker::new(conn);
    loop {
        tokio::select! {
            () = outbox.changed() => match outbox.take(&mut out) {
                Some(End::Kill) => break,
                Some(End::Close) => {
                    // What the broker wrote last (a DISCONNECT, say) goes out, within a bound.
                    let _ = Box::pin(tokio::time::timeout(CLOSE_TIMEOUT, async {
                        while wr.write_some(&mut out).await? > 0 {}
                        wr.shutdown().await
                    }))
                    .await;
                    break;
                }
                None => {}
            },
            r = wr.write_some(&mut out), if !out.is_empty() || unflushed => match r {
                Ok(0) => unflushed = false,
                Ok(n) => {
                    outbox.written(n);
                    unflushed = true;
                }
                Err(_) => break,
            },
            sent = to_broker.when_room(), if to_broker.is_waiting() => if !sent {
                break;
            },
            r = rd.next(), if !to_broker.is_waiting() => match r {
                Some(data) => if !to_broker.offer(engine, data) {
                    break;
                },
                None => break,
            },
        }
    }
    let _ = Box::pin(engine.tx.send(ToEngine::Closed { conn })).await;
}

/// What a connection task reads from its transport.
trait WireRead: Send {
    /// The next bytes of MQTT; `None` at the end of the stream or on an error. Cancel-safe.
    fn next(&mut self) -> impl Future<Output = Option<Bytes>> + Send;
}

/// What a connection task writes to its transport.
trait WireWrite: Send {
    /// Write from the front of `out` (removing what was written), or, with nothing queued,
    /// flush. Returns the bytes written (0: flushed). Cancel-safe: a cancelled call wrote
    /// nothing.
    fn write_some(
        &mut self,
        out: &mut VecDeque<Bytes>,
    ) -> impl Future<Output = std::io::Result<usize>> + Send;

    /// End the writing side once everything was written.
    fn shutdown(&mut self) -> impl Future<Output = std::io::Result<()>> + Send;
}

/// Reading a TCP socket: a buffer is taken only once the socket is readable, so a quiet
/// connection holds none.
struct TcpReads {
    rd: OwnedReadHalf,
    want: usize,
}

impl WireRead for TcpReads {
    // Polled by hand rather than with `readable()` and `read_buf()`: a quiet connection waits
    // here for as long as it lives, and this way the wait holds nothing but `self`.
    fn next(&mut self) -> impl Future<Output = Option<Bytes>> + Send {
        std::future::poll_fn(move |cx| {
            loop {
                let socket: &TcpStream = self.rd.as_ref();
                if std::task::ready!(socket.poll_read_ready(cx)).is_err() {
                    return Poll::Ready(None);
                }
                let mut buf = BytesMut::with_capacity(self.want);
                let room = buf.capacity();
                let mut read = None;
                let r = socket.try_io(Interest::READABLE, || {
                    let n = socket.try_read_buf(&mut buf)?;
                    read = Some(n);
                    if n > 0 && n < room {
                        // A read that did not fill the buffer emptied the socket: "would
                        // block" clears the readiness, as tokio's own reads do, so that the
                        // next wait does not start with a read that finds nothing.
                        return Err(std::io::ErrorKind::WouldBlock.into());
                    }
                    Ok(())
                });
                return match (read, r) {
                    (Some(0), _) => Poll::Ready(None),
                    (Some(n), _) => {
                        self.want = next_read_size(self.want, n);
                        Poll::Ready(Some(buf.freeze()))
                    }
                    // The readiness was stale: wait again.
                    (None, Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    (None, _) => Poll::Ready(None),
                };
            }
        })
    }
}

/// Writing a byte stream: a TCP socket's owned half, or a TLS stream's.
struct ByteWrites<W>(W);

impl<W: AsyncWrite + Unpin + Send> WireWrite for ByteWrites<W> {
    fn write_some(
        &mut self,
        out: &mut VecDeque<Bytes>,
    ) -> impl Future<Output = std::io::Result<usize>> + Send {
        write_vectored(&mut self.0, out)
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        self.0.shutdown().await
    }
}

/// Reading a byte stream (TLS) into a buffer that grows for busy connections and shrinks for
/// quiet ones.
struct StreamReads<S> {
    rd: ReadHalf<S>,
    buf: BytesMut,
    want: usize,
}

impl<S: AsyncRead + Send> WireRead for StreamReads<S> {
    async fn next(&mut self) -> Option<Bytes> {
        self.buf.reserve(self.want);
        match self.rd.read_buf(&mut self.buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => {
                self.want = next_read_size(self.want, n);
                Some(self.buf.split().freeze())
            }
        }
    }
}

/// Waiting for room in the broker task's queue.
type Room = Pin<Box<dyn Future<Output = Result<OwnedPermit<ToEngine>, SendError<()>>> + Send>>;

/// Hands what a connection reads to the broker task: at once while its queue has room; when
/// it is full, the connection holds the bytes and reads no more until there is room.
struct ToBroker {
    conn: ConnId,
    /// Boxed: rare, and a connection's task keeps its largest state for as long as it lives.
    unsent: Option<Box<(Bytes, Room)>>,
}

impl ToBroker {
    fn new(conn: ConnId) -> Self {
        Self { conn, unsent: None }
    }

    fn is_waiting(&self) -> bool {
        self.unsent.is_some()
    }

    /// Hand bytes over, or hold them until there is room; false if the broker task is gone.
    fn offer(&mut self, engine: &EngineHandle, data: Bytes) -> bool {
        let conn = self.conn;
        match engine.tx.try_send(ToEngine::Bytes { conn, data }) {
            Ok(()) => true,
            Err(TrySendError::Full(ToEngine::Bytes { data, .. })) => {
                let room: Room = Box::pin(engine.tx.clone().reserve_owned());
                self.unsent = Some(Box::new((data, room)));
                true
            }
            Err(_) => false,
        }
    }

    /// Wait for room and hand over the held bytes; false if the broker task is gone.
    /// Cancel-safe: the bytes stay held.
    async fn when_room(&mut self) -> bool {
        let Some((_, room)) = self.unsent.as_deref_mut() else {
            return true;
        };
        let Ok(permit) = room.await else {
            return false;
        };
        let (data, _) = *self.unsent.take().expect("held above");
        permit.send(ToEngine::Bytes {
            conn: self.conn,
            data,
        });
        true
    }
}

/// How long a connection the broker closes may take to write what is left and shut down.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The size of the next read after one of `want` bytes got `n`: larger for a connection whose
/// read filled the buffer, smaller for one whose reads are small.
fn next_read_size(want: usize, n: usize) -> usize {
    if n >= want {
        (want * 2).min(READ_MAX)
    } else if n < want / 4 {
        (want / 2).max(READ_MIN)
    } else {
        want
    }
}

/// Chunks handed to one vectored write.
const MAX_IOV: usize = 64;

/// Write from the front of `out`, as much as one vectored write takes (removing what was
/// written), or, with nothing queued, flush. Returns the bytes written (0: flushed).
/// Cancel-safe: a cancelled call wrote nothing. Polled by hand, so that the wait holds no
/// more than the two references.
fn write_vectored<W: AsyncWrite + Unpin + Send>(
    wr: &mut W,
    out: &mut VecDeque<Bytes>,
) -> impl Future<Output = std::io::Result<usize>> + Send {
    std::future::poll_fn(move |cx| {
        if out.is_empty() {
            return Pin::new(&mut *wr).poll_flush(cx).map_ok(|()| 0);
        }
        let n = std::task::ready!(with_slices(out, |slices| {
            Pin::new(&mut *wr).poll_write_vectored(cx, slices)
        }))?;
        Poll::Ready(consume(out, n))
    })
}

/// Call `write` with the front of `out` as slices. They are built on each call, so a task
/// waiting to write does not hold them.
fn with_slices<T>(out: &VecDeque<Bytes>, write: impl FnOnce(&[IoSlice<'_>]) -> T) -> T {
    let mut slices = [IoSlice::new(&[]); MAX_IOV];
    let mut used = 0;
    for (slice, chunk) in slices.iter_mut().zip(out.iter()) {
        *slice = IoSlice::new(chunk);
        used += 1;
    }
    write(&slices[..used])
}

/// Remove `n` written bytes from the front of `out`; `n` itself.
fn consume(out: &mut VecDeque<Bytes>, n: usize) -> std::io::Result<usize> {
    if n == 0 {
        return Err(std::io::ErrorKind::WriteZero.into());
    }
    let mut left = n;
    while let Some(chunk) = out.front_mut() {
        if left < chunk.len() {
            let _ = chunk.split_to(left);
            break;
        }
        left -= chunk.len();
        out.pop_front();
    }
    if out.is_empty() {
        // An idle connection keeps no queue.
        *out = VecDeque::new();
    }
    Ok(n)
}

/// MQTT over WebSocket (binary frames, subprotocol `mqtt`).
pub async fn serve_websocket<S>(
    stream: S,
    info: ConnInfo,
    path: &str,
    max_message_bytes: usize,
    engine: EngineHandle,
    permit: OwnedSemaphorePermit,
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
    let outbox = Outbox::new();
    let Some(conn) = Box::pin(engine.accept(info, outbox.clone())).await else {
        return;
    };
    let (sink, stream) = ws.split();
    serve(WsReads(stream), WsWrites(sink), &outbox, conn, &engine).await;
    drop(permit);
}

type Ws<S> = tokio_tungstenite::WebSocketStream<S>;

/// MQTT from binary WebSocket messages.
struct WsReads<S>(SplitStream<Ws<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin + Send> WireRead for WsReads<S> {
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            match self.0.next().await? {
                Ok(WsMessage::Binary(data)) => return Some(data),
                Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_)) => {}
                // Text frames are not MQTT; close like any other malformed input.
                Ok(WsMessage::Text(_) | WsMessage::Close(_)) => return None,
                Err(e) => {
                    debug!(error = %e, "WebSocket read failed");
                    return None;
                }
            }
        }
    }
}

/// MQTT as binary WebSocket messages, one per queued chunk.
struct WsWrites<S>(SplitSink<Ws<S>, WsMessage>);

impl<S: AsyncRead + AsyncWrite + Unpin + Send> WireWrite for WsWrites<S> {
    async fn write_some(&mut self, out: &mut VecDeque<Bytes>) -> std::io::Result<usize> {
        let sink = &mut self.0;
        if out.is_empty() {
            sink.flush().await.map_err(std::io::Error::other)?;
            return Ok(0);
        }
        std::future::poll_fn(|cx| sink.poll_ready_unpin(cx))
            .await
            .map_err(std::io::Error::other)?;
        let chunk = out.pop_front().expect("checked above");
        if out.is_empty() {
            *out = VecDeque::new();
        }
        let n = chunk.len();
        sink.start_send_unpin(WsMessage::Binary(chunk))
            .map_err(std::io::Error::other)?;
        Ok(n)
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        self.0.close().await.map_err(std::io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vectored write that takes at most `limit` bytes, across slices.
    fn trickle(limit: usize, written: &mut Vec<u8>, slices: &[IoSlice<'_>]) -> usize {
        let mut n = 0;
        for s in slices {
            let take = s.len().min(limit - n);
            written.extend_from_slice(&s[..take]);
            n += take;
        }
        n
    }

    #[test]
    fn writes_that_end_inside_a_chunk_resume_where_they_stopped() {
        let mut written = Vec::new();
        let mut out: VecDeque<Bytes> = ["abc", "defg", "hi"]
            .into_iter()
            .map(|s| Bytes::from_static(s.as_bytes()))
            .collect();
        let n = with_slices(&out, |s| trickle(5, &mut written, s));
        assert_eq!(consume(&mut out, n).unwrap(), 5);
        assert_eq!(out, [Bytes::from_static(b"fg"), Bytes::from_static(b"hi")]);
        let n = with_slices(&out, |s| trickle(5, &mut written, s));
        assert_eq!(consume(&mut out, n).unwrap(), 4);
        assert!(out.is_empty());
        assert_eq!(written, b"abcdefghi");
        assert!(
            consume(&mut out, 0).is_err(),
            "a write of nothing is an error"
        );
    }

    #[test]
    fn one_write_takes_at_most_max_iov_chunks() {
        let out: VecDeque<Bytes> = (0..MAX_IOV + 5).map(|_| Bytes::from_static(b"x")).collect();
        assert_eq!(with_slices(&out, |s| s.len()), MAX_IOV);
    }
}
