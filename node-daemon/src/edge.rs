//! Edge links: the leaves of this node (the edge worker's Durable Objects) link to it over
//! WebSocket at `/link`, each binary message one of the core's link frames. The core makes
//! each linked node a leaf ([`meridian_core::Broker::add_leaf`]): its interest joins this
//! node's route set, it sees everything wanted elsewhere, and messages cross between it and
//! the mesh only towards interest (`docs/geo.md`, "Leaves").
//!
//! Who may link: a client that presents one of the edge-link tokens (the policy document's,
//! or with `policy.source = "files"` those of `cluster.edge.token_file`) as
//! `Authorization: Bearer TOKEN` in its upgrade request; with operator keys
//! (`policy.operator_keys`), a leaf credential one of them signed (`meridian certify-leaf`)
//! instead, and tokens link nothing. A credential names the leaf (or a prefix of names): a
//! `Hello` naming another is refused (`reason="credential"`); and it holds the leaf to its
//! topic scope and filter bound ([`meridian_core::Broker::scope_leaf`]). A wrong or missing
//! token is refused with 401 before the upgrade, so before any frame is read
//! (`meridian_edge_links_refused_total{reason="token"}`). An accepted upgrade names this node
//! in its `meridian-node` header. The first frame names the leaf
//! (`Hello`); a name that does not start with `edge-`, or is a mesh member's, is refused
//! (`reason="node"`), and
//! one session per leaf stands at a time (a new one replaces the old). A token is a
//! credential: a live leaf is replaced only by a link with the token it linked with, and one
//! token links at most `cluster.edge.max_leaves_per_token` leaves, those whose link ended
//! counted until the hub forgets them (`cluster.edge.leaf_expiry_ms`), as they hold a place
//! among its nodes till then; past either, the link is closed after its `Hello`
//! (`reason="credential"`). A link that sends no
//! `Hello` within [`HELLO_TIMEOUT`], or a frame that does not decode, is closed. One address
//! may have [`MAX_HANDSHAKES_PER_ADDRESS`] connections at once between their accept and a
//! completed upgrade; more get 503 (`reason="busy_address"`), so that one host holding
//! handshakes open cannot take every place `cluster.edge.max_links` gives (edge objects
//! behind one egress address hold a place only for the milliseconds of their handshake).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use meridian_core::broker::LeafScope;
use meridian_core::link::{self, DEFAULT_MAX_FRAME_LEN, Frame};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tracing::{debug, info, warn};

use crate::mailbox::{DaemonCounters, LinkEvent, LinkLimits, PeerWriter, ToEngine};
use crate::per_address::{AddressSlot, PerAddress};
use crate::policy::operator::{LeafCredential, OperatorKeys};
use crate::policy::tokens::Tokens;

/// What an upgrade request presented: an edge-link token (by its name), or a leaf
/// credential.
enum Presented {
    Token(String),
    Leaf(LeafCredential),
}

impl Presented {
    /// What it admits `leaf` as: the name live leaves are held to, and the scope. An error
    /// says why not.
    fn admit(self, leaf: &str) -> Result<(String, Option<LeafScope>), String> {
        match self {
            Presented::Token(name) => Ok((name, None)),
            Presented::Leaf(credential) => {
                if !credential.admits(leaf) {
                    return Err(format!("the credential links {}", credential.name));
                }
                Ok((
                    format!("credential {}", credential.id),
                    Some(credential.scope),
                ))
            }
        }
    }
}

/// The path edge links upgrade on.
pub const LINK_PATH: &str = "/link";
/// How long a connection may take to complete TLS and the WebSocket upgrade.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new link may take to send its `Hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections of one address between their accept and a completed upgrade.
pub const MAX_HANDSHAKES_PER_ADDRESS: usize = 8;
/// The answer to a connection past [`MAX_HANDSHAKES_PER_ADDRESS`].
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1 << 48);

/// The response header of an accepted upgrade that names this node, so that the leaf knows
/// its hub before any frame.
pub const NODE_HEADER: &str = "meridian-node";

/// What the edge-link listener needs.
#[derive(Clone)]
pub struct EdgeSettings {
    /// This node's id, told to each leaf ([`NODE_HEADER`]).
    pub node: String,
    pub tokens: Tokens,
    /// With keys, links need a leaf credential they signed, and tokens link nothing.
    pub operator: OperatorKeys,
    /// TLS (wss), required off loopback.
    pub tls: Option<TlsAcceptor>,
    /// Links open at once, handshakes included.
    pub max_links: usize,
    /// Leaves one token links at once (`cluster.edge.max_leaves_per_token`).
    pub max_leaves_per_token: usize,
    /// How long a leaf whose link ended is kept (`cluster.edge.leaf_expiry_ms`): it counts
    /// towards its token's leaves till then.
    pub leaf_expiry: Duration,
    pub limits: LinkLimits,
}

/// A leaf a token linked: its session, the token, and when its link ended (`None`: live).
#[derive(Debug)]
struct Linked {
    session: u64,
    token: String,
    ended: Option<Instant>,
}

/// The leaves linked, live or kept by the hub after their link ended, by name.
#[derive(Debug, Default)]
struct Credentials(std::sync::Mutex<std::collections::HashMap<String, Linked>>);

impl Credentials {
    fn leaves(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Linked>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Take `leaf` for `session` with `token`, unless it is live with another token, or the
    /// token has `max` other leaves, live or ended less than `kept` ago (the hub still holds
    /// those: a token cycling names would fill its nodes otherwise).
    fn take(
        &self,
        leaf: &str,
        session: u64,
        token: &str,
        max: usize,
        kept: Duration,
    ) -> Result<(), String> {
        let mut leaves = self.leaves();
        leaves.retain(|_, l| l.ended.is_none_or(|at| at.elapsed() < kept));
        if let Some(l) = leaves.get(leaf)
            && l.ended.is_none()
            && l.token != token
        {
            return Err(format!("{leaf} is live, linked with another token"));
        }
        let others = leaves
            .iter()
            .filter(|(name, l)| l.token == token && name.as_str() != leaf)
            .count();
        if others >= max {
            return Err(format!(
                "the token links {others} leaves already, live or kept after their link ended \
                 (cluster.edge.max_leaves_per_token, cluster.edge.leaf_expiry_ms)"
            ));
        }
        let linked = Linked {
            session,
            token: token.to_owned(),
            ended: None,
        };
        leaves.insert(leaf.to_owned(), linked);
        Ok(())
    }

    /// `session` of `leaf` ended (a later session of it keeps its place): the hub keeps the
    /// leaf, and its token's count, until it forgets it.
    fn end(&self, leaf: &str, session: u64) {
        if let Some(l) = self.leaves().get_mut(leaf)
            && l.session == session
        {
            l.ended = Some(Instant::now());
        }
    }

    /// `session` of `leaf` was not taken as a leaf: it counts for nothing.
    fn drop_refused(&self, leaf: &str, session: u64) {
        let mut leaves = self.leaves();
        if leaves.get(leaf).is_some_and(|l| l.session == session) {
            leaves.remove(leaf);
        }
    }
}

/// Accept edge links on `listener` until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    settings: EdgeSettings,
    engine: mpsc::Sender<ToEngine>,
    counters: Arc<DaemonCounters>,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(settings.max_links));
    let handshakes = PerAddress::new(MAX_HANDSHAKES_PER_ADDRESS, false);
    let credentials = Arc::new(Credentials::default());
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => return,
        };
        let (stream, addr) = match accepted {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "edge link: accept failed");
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            debug!(%addr, "edge link refused: max_links reached");
            continue;
        };
        let Some(handshake) = handshakes.take(addr.ip()) else {
            counters
                .edge_links_refused_busy_address
                .fetch_add(1, Ordering::Relaxed);
            debug!(%addr, "edge link refused: too many handshakes from this address");
            // Best effort: a new socket's buffer has room for it.
            let _ = stream.try_write(BUSY);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let settings = settings.clone();
        let engine = engine.clone();
        let counters = counters.clone();
        let credentials = credentials.clone();
        tokio::spawn(async move {
            let ours = (&settings, &*credentials, &*counters);
            match &settings.tls {
                Some(tls) => {
                    let Ok(Ok(stream)) =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await
                    else {
                        debug!(%addr, "edge link: TLS handshake failed");
                        return;
                    };
                    link(stream, handshake, ours, engine).await;
                }
                None => link(stream, handshake, ours, engine).await,
            }
            drop(permit);
        });
    }
}

/// One edge link: the upgrade (path and token checked), the `Hello`, then the session.
/// `handshake`, its address's place, is given back once the upgrade is done.
async fn link<S>(
    stream: S,
    handshake: AddressSlot,
    (settings, credentials, counters): (&EdgeSettings, &Credentials, &DaemonCounters),
    engine: mpsc::Sender<ToEngine>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut credential = None;
    let refuse = |status: StatusCode, text: &str| -> ErrorResponse {
        let mut r = ErrorResponse::new(Some(text.to_owned()));
        *r.status_mut() = status;
        r
    };
    // The library's callback type returns its own error response by value.
    #[allow(clippy::result_large_err)]
    let callback = |req: &Request, mut resp: Response| -> Result<Response, ErrorResponse> {
        if req.uri().path() != LINK_PATH {
            return Err(refuse(
                StatusCode::NOT_FOUND,
                "edge links upgrade at /link\n",
            ));
        }
        let token = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map_or("", str::trim);
        let presented = if settings.operator.is_empty() {
            settings.tokens.admits(token).map(Presented::Token)
        } else {
            settings.operator.verify_leaf(token).map(Presented::Leaf)
        };
        let Some(presented) = presented else {
            counters
                .edge_links_refused_token
                .fetch_add(1, Ordering::Relaxed);
            return Err(refuse(
                StatusCode::UNAUTHORIZED,
                "an edge link token is required (Authorization: Bearer TOKEN)\n",
            ));
        };
        credential = Some(presented);
        if let Ok(node) = settings.node.parse() {
            resp.headers_mut().insert(NODE_HEADER, node);
        }
        Ok(resp)
    };
    let max = usize::try_from(DEFAULT_MAX_FRAME_LEN).unwrap_or(usize::MAX);
    let config = WebSocketConfig::default()
        .max_message_size(Some(max))
        .max_frame_size(Some(max));
    let ws = match tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config)),
    )
    .await
    {
        Ok(Ok(ws)) => ws,
        Ok(Err(e)) => {
            debug!(error = %e, "edge link: upgrade refused or failed");
            return;
        }
        Err(_) => {
            debug!("edge link: upgrade timed out");
            return;
        }
    };
    drop(handshake);
    let (mut sink, mut stream) = ws.split();
    // The first frame names the leaf.
    let first = tokio::time::timeout(HELLO_TIMEOUT, next_frames(&mut stream)).await;
    let mut frames = match first {
        Ok(Some(Ok(frames))) => frames,
        _ => {
            debug!("edge link: no Hello in time, or a bad first frame");
            return;
        }
    };
    let Some(Frame::Hello { node, .. }) = frames.first() else {
        debug!("edge link: the first frame is not a Hello");
        return;
    };
    let leaf = node.clone();
    let session = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
    let Some(presented) = credential else { return };
    let admitted = presented
        .admit(leaf.as_str())
        .and_then(|(credential, scope)| {
            credentials
                .take(
                    leaf.as_str(),
                    session,
                    &credential,
                    settings.max_leaves_per_token,
                    settings.leaf_expiry,
                )
                .map(|()| scope)
                .map_err(|why| format!("{why} ({credential})"))
        });
    let scope = match admitted {
        Ok(scope) => scope,
        Err(why) => {
            counters
                .edge_links_refused_credential
                .fetch_add(1, Ordering::Relaxed);
            warn!(%leaf, %why, "edge link refused");
            let _ = sink.close().await;
            return;
        }
    };
    let (writer, mut rx, queued_bytes) = PeerWriter::channel(settings.limits);
    let kill = writer.kill.clone();
    let (accepted_tx, accepted_rx) = tokio::sync::oneshot::channel();
    let up = ToEngine::Link(LinkEvent::LeafUp {
        leaf: leaf.clone(),
        scope,
        session,
        writer,
        accepted: accepted_tx,
    });
    if engine.send(up).await.is_err() || !accepted_rx.await.unwrap_or(false) {
        credentials.drop_refused(leaf.as_str(), session);
        counters
            .edge_links_refused_node
            .fetch_add(1, Ordering::Relaxed);
        let _ = sink.close().await;
        return;
    }
    info!(%leaf, session, "edge link up");
    let why = {
        let read = async {
            loop {
                counters
                    .edge_frames_in
                    .fetch_add(frames.len() as u64, Ordering::Relaxed);
                // The frames of one message, one input for the broker.
                let msg = ToEngine::Link(LinkEvent::Frames {
                    peer: leaf.clone(),
                    frames: std::mem::take(&mut frames),
                });
                if engine.send(msg).await.is_err() {
                    return "broker stopping";
                }
                match next_frames(&mut stream).await {
                    Some(Ok(more)) => frames = more,
                    Some(Err(why)) => return why,
                    None => return "closed by the leaf",
                }
            }
        };
        let write = async {
            while let Some(first) = rx.recv().await {
                let len = first.len();
                if sink.feed(WsMessage::Binary(first)).await.is_err() {
                    return "write failed";
                }
                queued_bytes.fetch_sub(len, Ordering::AcqRel);
                let mut written = 1;
                while let Ok(more) = rx.try_recv() {
                    let len = more.len();
                    if sink.feed(WsMessage::Binary(more)).await.is_err() {
                        return "write failed";
                    }
                    queued_bytes.fetch_sub(len, Ordering::AcqRel);
                    written += 1;
                }
                counters
                    .edge_frames_out
                    .fetch_add(written, Ordering::Relaxed);
                if sink.flush().await.is_err() {
                    return "write failed";
                }
            }
            "ended by the broker"
        };
        tokio::select! {
            why = read => why,
            why = write => why,
            () = kill.notified() => "cut by the broker",
        }
    };
    info!(%leaf, session, why, "edge link ended");
    credentials.end(leaf.as_str(), session);
    let _ = engine
        .send(ToEngine::Link(LinkEvent::Down {
            peer: leaf,
            session,
        }))
        .await;
}

/// The frames of the next binary message (`None`: the link closed). A text message, or bytes
/// that are not whole frames, end the link.
async fn next_frames<S>(stream: &mut S) -> Option<Result<Vec<Frame>, &'static str>>
where
    S: futures_util::Stream<Item = Result<WsMessage, tokio_tungstenite::tungstenite::Error>>
        + Unpin,
{
    loop {
        let message = match stream.next().await? {
            Ok(m) => m,
            Err(_) => return None,
        };
        let data: Bytes = match message {
            WsMessage::Binary(data) => data,
            WsMessage::Close(_) => return None,
            WsMessage::Text(_) => return Some(Err("a text message")),
            // Pings are answered by the library.
            _ => continue,
        };
        return Some(
            link::decode_message(&data, DEFAULT_MAX_FRAME_LEN)
                .map_err(|_| "a malformed or partial frame"),
        );
    }
}
