//! Admin HTTP: `/health`, Prometheus `/metrics`, and the client API.
//!
//! Who may ask ([`AdminAccess`]): with `admin.token_file`, every request but `GET /health`
//! carries `Authorization: Bearer TOKEN` (else 401); a token is required to bind off
//! loopback. On loopback, the `Host` must name loopback too (else 421), so that a web page
//! cannot reach the API by pointing its own name at 127.0.0.1. Off loopback it speaks HTTPS
//! only (`admin.cert`, `admin.key`). Whatever the token, a request
//! whose `Origin` is another site's is refused (403), and so is a POST whose body is not JSON
//! (415): a web page cannot make a browser send one without asking first. A client that does
//! not send a request's headers within `admin.header_timeout_ms` is cut off, and at most
//! [`MAX_CONNECTIONS`] connections are served at once.
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /health` | 200 `{"status":"ok"}` while the broker task answers, else 503 |
//! | `GET /` | the status page (HTML; it reads the API below) |
//! | `GET /metrics` | OpenMetrics text (Prometheus scrapes it) |
//! | `GET /api/stats` | every figure of the broker's `Stats`, by name |
//! | `GET /api/history` | the last ten minutes of those figures ([`history`]): `interval_ms`, and `samples`, oldest first, each `at_ms` (Unix time) and `figures`; the last is of the moment |
//! | `GET /api/clients` | JSON array of every session, connected or not, with subscriptions; `?offset=&limit=&q=` pages it (header `x-total-count`) |
//! | `GET /api/clients/{id}` | one session, or 404 |
//! | `GET /api/subscriptions` | JSON array of every subscription: `client_id`, `filter`, `qos`; `?offset=&limit=&q=` pages it |
//! | `DELETE /api/clients/{id}` | disconnect the client (MQTT 5.0 gets DISCONNECT 0x98); 404 if not connected |
//! | `DELETE /api/sessions/{id}` | end the client's session (disconnecting it): its subscriptions and messages go, and its client id is free for any user; 404 if none |
//! | `GET /api/node` | this node: peer id, region, p2p listen addresses (cluster mode); what it has in force of the policy document (`policy_in_force`: changes applied, users, access and residency rules); what came of the configuration's reloads (`reloads`: done, failed, the last error, whether a restart is needed) |
//! | `GET /api/peers` | JSON array of the peer nodes: connected, region, incarnation, RTT, routes, route lag, outbox, forwards |
//! | `GET /api/peers/{peer_id}/routes` | the filters that peer has subscribers for, as replicated here |
//! | `DELETE /api/peers/{peer_id}` | forget a node that left: withdraw its routes, drop what waits for it, tell the other nodes; 404 if unknown, 409 while its link is up. With operator keys, `?incarnation=N&signature=HEX` (the operator's signature, `meridian ctl --operator-key`) is needed (403 without it) and goes with the announcement |
//! | `GET /api/discovery` | JSON array of the peers discovery knows: addresses, whether self-reported, connected |
//! | `GET /api/routes` | this node's own route set (filters with a local subscriber) |
//! | `GET`, `POST /api/policy`, `GET /api/policy/history` | the cluster policy document ([`policy`]) |
//!
//! The routes are in [`routes`], the metrics page in [`metrics`], the figures' history in
//! [`history`].

pub mod history;
mod metrics;
mod policy;
mod routes;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::runtime::RuntimeMetrics;
use tokio::sync::watch;
use tracing::debug;

use crate::mailbox::{DaemonCounters, EngineHandle, PolicyInForce, ReloadStatus};
use crate::mesh::MeshStats;
use crate::per_address::PerAddress;
use crate::policy::PolicyHandle;
use crate::policy::tokens::Tokens;

/// What the admin API says about this node itself.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub region: Option<String>,
    pub peer_id: Option<String>,
    pub p2p_addrs: Vec<String>,
    /// When the daemon started (the uptime in `/api/node`).
    pub started: std::time::Instant,
}

/// The status page (`GET /`): HTML, CSS and JavaScript in one file, nothing fetched from
/// elsewhere; it reads the JSON API below.
const STATUS_PAGE: &str = include_str!("status.html");

type Body = Full<Bytes>;

/// Admin connections served at once; more are closed as they are accepted.
pub const MAX_CONNECTIONS: usize = 64;
/// Admin connections served at once from one address (loopback excepted), so that one host
/// cannot hold them all.
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 8;

/// Who may use the admin API, from `[admin]` and the admin tokens.
#[derive(Debug, Clone)]
pub struct AdminAccess {
    /// The admin tokens (the policy document's, or `admin.token_file`'s): with none, no
    /// token is asked for (on loopback) or nobody gets in (elsewhere).
    tokens: Tokens,
    /// The listener is on a loopback address: requests must name a loopback host.
    loopback: bool,
    header_timeout: std::time::Duration,
}

/// Who made a request that was let in: the admin token's name, or `local` when no token is
/// asked for.
pub type Requester = String;

impl AdminAccess {
    /// Refuse a listener off loopback without a token, or without TLS.
    pub fn new(config: &crate::config::AdminConfig, tokens: Tokens) -> anyhow::Result<Self> {
        let loopback = config.bind.ip().is_loopback();
        anyhow::ensure!(
            loopback || !tokens.is_empty(),
            "admin.bind is {} (not loopback) but there is no admin token: anyone who reaches \
             it could list and disconnect clients. Set admin.token_file (or \
             --admin-token-file; with policy.source = \"document\" it seeds the policy's \
             tokens on the first start, `meridian ctl token add admin NAME` adds more), or \
             bind the admin API to 127.0.0.1",
            config.bind
        );
        anyhow::ensure!(
            loopback || config.tls(),
            "admin.bind is {} (not loopback) but admin.cert is not set: bearer tokens and \
             policy changes would cross the network in the clear. Set admin.cert and \
             admin.key (HTTPS), or bind the admin API to 127.0.0.1",
            config.bind
        );
        Ok(Self {
            tokens,
            loopback,
            header_timeout: std::time::Duration::from_millis(config.header_timeout_ms),
        })
    }

    /// Who asks, or why the request may not be answered, as the response to give instead.
    fn admit(
        &self,
        req: &Request<Incoming>,
        counters: &DaemonCounters,
    ) -> Result<Requester, Box<Response<Body>>> {
        if self.loopback {
            let host = req
                .headers()
                .get(hyper::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("");
            if !crate::transport::listen::is_loopback_host(host) {
                counters.admin_refused_host.fetch_add(1, Ordering::Relaxed);
                return Err(Box::new(closing(plain(
                    StatusCode::MISDIRECTED_REQUEST,
                    "the admin API answers requests for 127.0.0.1, [::1] or localhost only\n",
                ))));
            }
        }
        cross_site(req, counters)?;
        // Off loopback the tokens cannot be empty at start; if all are removed later, nobody
        // gets in until one is added on a node that still takes requests.
        if self.loopback && self.tokens.is_empty() {
            return Ok(crate::policy::document::by::LOCAL.to_owned());
        }
        // The health check, and the status page, which holds no data (it asks for the token
        // and reads the API with it).
        if req.method() == Method::GET && matches!(req.uri().path(), "/health" | "/") {
            return Ok("anonymous".to_owned());
        }
        // The scheme's name is case-insensitive (RFC 9110).
        let given = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map_or("", |(_, token)| token.trim());
        if let Some(name) = self.tokens.admits(given) {
            return Ok(name);
        }
        counters.admin_refused_token.fetch_add(1, Ordering::Relaxed);
        let mut r = plain(
            StatusCode::UNAUTHORIZED,
            "a bearer token is required (Authorization: Bearer TOKEN)\n",
        );
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer realm=\"meridian\""),
        );
        Err(Box::new(closing(r)))
    }
}

/// Refuse what a web page of another site can make a browser send without asking first (no
/// CORS preflight): a request whose `Origin` is not the API's own (HTTP 403,
/// `reason="origin"`), and a body that is not JSON (HTTP 415, `reason="content_type"`). A
/// page could otherwise edit the policy through a loopback API that asks for no token.
fn cross_site(
    req: &Request<Incoming>,
    counters: &DaemonCounters,
) -> Result<(), Box<Response<Body>>> {
    let header = |name| {
        req.headers()
            .get(name)
            .map(|h| h.to_str().unwrap_or("\u{fffd}"))
    };
    if let Some(origin) = header(hyper::header::ORIGIN) {
        let own = header(hyper::header::HOST).unwrap_or("");
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        if authority.is_none_or(|a| !a.eq_ignore_ascii_case(own)) {
            counters
                .admin_refused_origin
                .fetch_add(1, Ordering::Relaxed);
            return Err(Box::new(closing(plain(
                StatusCode::FORBIDDEN,
                "the admin API answers its own pages only (Origin is another site)\n",
            ))));
        }
    }
    let has_body = matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH);
    let json = header(hyper::header::CONTENT_TYPE).is_some_and(|t| {
        t.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    });
    if has_body && !json {
        counters
            .admin_refused_content_type
            .fetch_add(1, Ordering::Relaxed);
        return Err(Box::new(closing(plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the admin API takes JSON bodies only (Content-Type: application/json)\n",
        ))));
    }
    Ok(())
}

/// The response, with the connection closed after it: a client that was refused keeps no
/// connection open.
pub(crate) fn closing(mut r: Response<Body>) -> Response<Body> {
    r.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    r
}

/// What the admin API answers from.
#[derive(Debug)]
pub struct AdminState {
    pub engine: EngineHandle,
    pub node: NodeInfo,
    /// The region mesh's counters, in cluster mode.
    pub mesh: Option<std::sync::Arc<MeshStats>>,
    pub access: AdminAccess,
    /// The policy document (`policy.source = "document"`).
    pub policy: Option<PolicyHandle>,
    /// What the broker has in force of it (`policy.source = "document"`).
    pub in_force: Option<Arc<PolicyInForce>>,
    /// What came of the reloads of the configuration (SIGHUP).
    pub reloads: Arc<std::sync::Mutex<ReloadStatus>>,
    /// The broker thread's runtime ([`crate::broker_thread`]).
    pub broker_thread: RuntimeMetrics,
    /// `policy.operator_keys`: with some, a forget needs one's signature.
    pub operator_keys: crate::policy::operator::OperatorKeys,
    /// The figures of the last ten minutes, for the status page's charts.
    pub history: Arc<history::History>,
}

/// Serve admin HTTP (HTTPS with `tls`) until `stop` changes.
pub async fn serve(
    listener: TcpListener,
    state: std::sync::Arc<AdminState>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let per_address = PerAddress::new(MAX_CONNECTIONS_PER_ADDRESS, true);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    debug!(error = %e, "admin accept failed");
                    tokio::task::yield_now().await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            debug!(%peer, "admin connections at their maximum, closing");
            continue;
        };
        let Some(slot) = per_address.take(peer.ip()) else {
            debug!(%peer, "admin connections from this address at their maximum, closing");
            continue;
        };
        let state = state.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let header_timeout = state.access.header_timeout;
            match tls {
                Some(tls) => {
                    // The handshake has the headers' time too.
                    match tokio::time::timeout(header_timeout, tls.accept(stream)).await {
                        Ok(Ok(stream)) => connection(stream, peer, state).await,
                        Ok(Err(e)) => debug!(%peer, error = %e, "admin TLS handshake failed"),
                        Err(_) => {
                            state
                                .engine
                                .counters
                                .admin_header_timeouts
                                .fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                None => connection(stream, peer, state).await,
            }
            drop((permit, slot));
        });
    }
}

/// Serve one admin connection.
async fn connection<S>(stream: S, peer: std::net::SocketAddr, state: std::sync::Arc<AdminState>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let counters = state.engine.counters.clone();
    let header_timeout = state.access.header_timeout;
    let service = service_fn(move |req| {
        let state = state.clone();
        async move {
            let response = match state.access.admit(&req, &state.engine.counters) {
                Ok(who) => routes::route(req, &state, who).await,
                Err(refusal) => *refusal,
            };
            Ok::<_, Infallible>(response)
        }
    });
    let served = http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        if e.is_timeout() {
            counters
                .admin_header_timeouts
                .fetch_add(1, Ordering::Relaxed);
        }
        debug!(%peer, error = %e, "admin connection error");
    }
}

pub(crate) fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

pub(crate) fn json(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(value.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}
