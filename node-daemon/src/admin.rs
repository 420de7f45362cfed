//! Admin HTTP: `/health`, Prometheus `/metrics`, and the client API.
//!
//! Who may ask ([`AdminAccess`]): with `admin.token_file`, every request but `GET /health`
//! carries `Authorization: Bearer TOKEN` (else 401); a token is required to bind off
//! loopback. On loopback, the `Host` must name loopback too (else 421), so that a web page
//! cannot reach the API by pointing its own name at 127.0.0.1. A client that does not send a
//! request's headers within `admin.header_timeout_ms` is cut off, and at most
//! [`MAX_CONNECTIONS`] connections are served at once.
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /health` | 200 `{"status":"ok"}` while the broker task answers, else 503 |
//! | `GET /` | the status page (HTML; it reads the API below) |
//! | `GET /metrics` | OpenMetrics text (Prometheus scrapes it) |
//! | `GET /api/stats` | every figure of the broker's `Stats`, by name |
//! | `GET /api/clients` | JSON array of every session, connected or not, with subscriptions; `?offset=&limit=&q=` pages it (header `x-total-count`) |
//! | `GET /api/clients/{id}` | one session, or 404 |
//! | `GET /api/subscriptions` | JSON array of every subscription: `client_id`, `filter`, `qos`; `?offset=&limit=&q=` pages it |
//! | `DELETE /api/clients/{id}` | disconnect the client (MQTT 5.0 gets DISCONNECT 0x98); 404 if not connected |
//! | `DELETE /api/sessions/{id}` | end the client's session (disconnecting it): its subscriptions and messages go, and its client id is free for any user; 404 if none |
//! | `GET /api/node` | this node: peer id, region, p2p listen addresses (cluster mode) |
//! | `GET /api/peers` | JSON array of the peer nodes: connected, region, RTT, routes, route lag, outbox, forwards |
//! | `GET /api/peers/{peer_id}/routes` | the filters that peer has subscribers for, as replicated here |
//! | `DELETE /api/peers/{peer_id}` | forget a node that left: withdraw its routes, drop what waits for it, tell the other nodes; 404 if unknown, 409 while its link is up |
//! | `GET /api/discovery` | JSON array of the peers discovery knows: addresses, whether self-reported, connected |
//! | `GET /api/routes` | this node's own route set (filters with a local subscriber) |

use std::convert::Infallible;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use meridian_core::broker::{
    ClientSummary, Figure, FigureKind, FigureValue, ForgetError, PeerSummary, Stats,
};
use meridian_core::codec::ProtocolVersion;
use meridian_core::routes::NodeId;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::runtime::RuntimeMetrics;
use tokio::sync::watch;
use tracing::debug;

use crate::mailbox::{DaemonCounters, EngineHandle, Page};
use crate::mesh::MeshStats;
use crate::per_address::PerAddress;
use crate::policy::tokens::{MIN_TOKEN_LEN, TokenSet, Tokens};
use crate::policy::{PolicyHandle, api};

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
    /// The token of `admin.token_file` (its first line), named `token-file-` and the start of
    /// its hash; none without
    /// the file.
    pub fn file_tokens(config: &crate::config::AdminConfig) -> anyhow::Result<TokenSet> {
        use anyhow::Context as _;
        if config.token_file.as_os_str().is_empty() {
            return Ok(TokenSet::default());
        }
        let text = std::fs::read_to_string(&config.token_file).with_context(|| {
            format!(
                "admin.token_file: cannot read {}",
                config.token_file.display()
            )
        })?;
        let token = text.lines().next().unwrap_or("").trim().to_owned();
        anyhow::ensure!(
            token.len() >= MIN_TOKEN_LEN,
            "admin.token_file: {} holds no token of {MIN_TOKEN_LEN} characters or more on its \
             first line",
            config.token_file.display()
        );
        let (name, hash) = crate::policy::tokens::seeded("token-file", &token);
        Ok(TokenSet::from_hashes([(&name, &hash)]))
    }

    /// Refuse a listener off loopback without a token.
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
        // Off loopback the tokens cannot be empty at start; if all are removed later, nobody
        // gets in until one is added on a node that still takes requests.
        if self.loopback && self.tokens.is_empty() {
            return Ok("local".to_owned());
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

/// The response, with the connection closed after it: a client that was refused keeps no
/// connection open.
fn closing(mut r: Response<Body>) -> Response<Body> {
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
    /// The broker thread's runtime ([`crate::broker_thread`]).
    pub broker_thread: RuntimeMetrics,
}

/// Serve admin HTTP until `stop` changes.
pub async fn serve(
    listener: TcpListener,
    state: std::sync::Arc<AdminState>,
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
        tokio::spawn(async move {
            let counters = state.engine.counters.clone();
            let header_timeout = state.access.header_timeout;
            let service = service_fn(move |req| {
                let state = state.clone();
                async move {
                    let response = match state.access.admit(&req, &state.engine.counters) {
                        Ok(who) => route(req, &state, who).await,
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
            drop((permit, slot));
        });
    }
}

async fn route(req: Request<Incoming>, state: &AdminState, who: Requester) -> Response<Body> {
    let (engine, node) = (&state.engine, &state.node);
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if path == "/api/policy" || path.starts_with("/api/policy/") {
        return policy_route(req, state, who).await;
    }
    match (method, path.as_str()) {
        (Method::GET, "/health") => match engine.stats().await {
            Some(_) => json(StatusCode::OK, serde_json::json!({"status": "ok"})),
            None => json(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({"status": "stopping"}),
            ),
        },
        (Method::GET, "/metrics") => match (engine.stats().await, engine.peers().await) {
            (Some(stats), Some(peers)) => Response::builder()
                .header(
                    "content-type",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )
                .body(Full::new(Bytes::from(render_metrics(
                    &stats,
                    &engine.counters,
                    &peers,
                    state.mesh.as_deref(),
                    &tokio::runtime::Handle::current().metrics(),
                    &state.broker_thread,
                ))))
                .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "")),
            _ => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
        },
        (Method::GET, "/") => Response::builder()
            .header("content-type", "text/html; charset=utf-8")
            // The page runs its own script only, and fetches from this origin only.
            .header(
                "content-security-policy",
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; \
                 base-uri 'none'; form-action 'none'",
            )
            .body(Full::new(Bytes::from_static(STATUS_PAGE.as_bytes())))
            .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "")),
        (Method::GET, "/api/node") => json(
            StatusCode::OK,
            serde_json::json!({
                "name": node.name,
                "region": node.region,
                "peer_id": node.peer_id,
                "p2p_addrs": node.p2p_addrs,
                "version": env!("CARGO_PKG_VERSION"),
                "uptime_s": node.started.elapsed().as_secs(),
            }),
        ),
        (Method::GET, "/api/stats") => match engine.stats().await {
            Some(stats) => json(StatusCode::OK, stats_json(&stats)),
            None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
        },
        (Method::GET, "/api/peers") => match engine.peers().await {
            Some(peers) => {
                let rtt = rtt_map(state.mesh.as_deref());
                let errors = state
                    .mesh
                    .as_deref()
                    .and_then(|m| m.last_error.lock().ok().map(|e| e.clone()))
                    .unwrap_or_default();
                json(
                    StatusCode::OK,
                    serde_json::Value::Array(
                        peers
                            .iter()
                            .map(|p| {
                                let mut v = peer_json(p, rtt.get(p.node.as_str()));
                                v["last_error"] = serde_json::json!(errors.get(p.node.as_str()));
                                v
                            })
                            .collect(),
                    ),
                )
            }
            None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
        },
        (Method::GET, "/api/discovery") => {
            let known = state
                .mesh
                .as_deref()
                .and_then(|m| m.discovered.lock().ok().map(|d| d.clone()))
                .unwrap_or_default();
            // Each with its region, where the broker knows it (from the peer's hello).
            let regions: std::collections::HashMap<String, Option<String>> = engine
                .peers()
                .await
                .unwrap_or_default()
                .into_iter()
                .map(|p| (p.node.to_string(), p.region))
                .collect();
            let known: Vec<serde_json::Value> = known
                .iter()
                .map(|k| {
                    let mut v = serde_json::json!(k);
                    v["region"] = serde_json::json!(regions.get(&k.peer_id).cloned().flatten());
                    v
                })
                .collect();
            json(StatusCode::OK, serde_json::Value::Array(known))
        }
        (Method::GET, "/api/routes") => match engine.routes(None).await {
            Some(routes) => json(StatusCode::OK, serde_json::json!(routes)),
            None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
        },
        (Method::GET, p)
            if let Some(id) = p
                .strip_prefix("/api/peers/")
                .and_then(|rest| rest.strip_suffix("/routes")) =>
        {
            let Ok(node) = NodeId::new(id) else {
                return plain(StatusCode::BAD_REQUEST, "bad peer id\n");
            };
            match engine.peers().await {
                Some(peers) if peers.iter().any(|p| p.node == node) => {
                    match engine.routes(Some(node)).await {
                        Some(routes) => json(StatusCode::OK, serde_json::json!(routes)),
                        None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
                    }
                }
                Some(_) => json(
                    StatusCode::NOT_FOUND,
                    serde_json::json!({"error": "no such peer"}),
                ),
                None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
            }
        }
        (Method::DELETE, p) if let Some(id) = p.strip_prefix("/api/peers/") => {
            let Ok(node) = NodeId::new(id) else {
                return plain(StatusCode::BAD_REQUEST, "bad peer id\n");
            };
            match engine.forget_peer(node).await {
                Some(Ok(forgotten)) => {
                    // Gone from the deployment: no longer one of the policy document's nodes
                    // (which compaction waits for).
                    if let Some(policy) = &state.policy {
                        let gone = crate::policy::document::Edit::NodeRemove {
                            peer_id: id.to_owned(),
                        };
                        if let Err(e) = policy.edit(vec![gone], who.clone()).await {
                            debug!(error = %e, "forgotten node not removed from the policy");
                        }
                    }
                    json(
                        StatusCode::OK,
                        serde_json::json!({
                            "peer_id": id,
                            "forgotten": true,
                            "routes_withdrawn": forgotten.routes,
                            "messages_dropped": forgotten.dropped_messages,
                        }),
                    )
                }
                Some(Err(e)) => {
                    let status = match e {
                        ForgetError::Unknown => StatusCode::NOT_FOUND,
                        ForgetError::Connected => StatusCode::CONFLICT,
                        ForgetError::Myself | ForgetError::NotClustered => StatusCode::BAD_REQUEST,
                    };
                    json(status, serde_json::json!({"error": e.to_string()}))
                }
                None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
            }
        }
        (Method::GET, "/api/clients") => {
            match engine.clients_page(page_of(req.uri().query())).await {
                Some((list, total)) => {
                    let mut r = json(
                        StatusCode::OK,
                        serde_json::Value::Array(list.iter().map(client_json).collect()),
                    );
                    r.headers_mut()
                        .insert("x-total-count", hyper::header::HeaderValue::from(total));
                    r
                }
                None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
            }
        }
        (Method::GET, "/api/subscriptions") => {
            match engine.subscriptions_page(page_of(req.uri().query())).await {
                Some((list, total)) => {
                    let mut r = json(
                        StatusCode::OK,
                        serde_json::Value::Array(
                            list.into_iter()
                                .map(|s| {
                                    serde_json::json!({
                                        "client_id": s.client_id,
                                        "filter": s.filter,
                                        "qos": s.qos as u8,
                                    })
                                })
                                .collect(),
                        ),
                    );
                    r.headers_mut()
                        .insert("x-total-count", hyper::header::HeaderValue::from(total));
                    r
                }
                None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
            }
        }
        (Method::DELETE, p) if let Some(id) = p.strip_prefix("/api/sessions/") => {
            let Some(id) = percent_decode(id) else {
                return plain(StatusCode::BAD_REQUEST, "bad client id encoding\n");
            };
            match engine.end_session(id.clone()).await {
                Some(true) => json(
                    StatusCode::OK,
                    serde_json::json!({"client_id": id, "session_ended": true}),
                ),
                Some(false) => json(
                    StatusCode::NOT_FOUND,
                    serde_json::json!({"error": "no such session"}),
                ),
                None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
            }
        }
        (method, p) if p.starts_with("/api/clients/") => {
            let Some(id) = percent_decode(&p["/api/clients/".len()..]) else {
                return plain(StatusCode::BAD_REQUEST, "bad client id encoding\n");
            };
            match method {
                Method::GET => match engine.clients().await {
                    Some(list) => match list.iter().find(|c| c.client_id == id) {
                        Some(c) => json(StatusCode::OK, client_json(c)),
                        None => json(
                            StatusCode::NOT_FOUND,
                            serde_json::json!({"error": "no such client"}),
                        ),
                    },
                    None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
                },
                Method::DELETE => match engine.kick(id.clone()).await {
                    Some(true) => json(
                        StatusCode::OK,
                        serde_json::json!({"client_id": id, "disconnected": true}),
                    ),
                    Some(false) => json(
                        StatusCode::NOT_FOUND,
                        serde_json::json!({"error": "client not connected"}),
                    ),
                    None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
                },
                _ => plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"),
            }
        }
        _ => plain(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// The policy endpoints ([`crate::policy::api`]).
async fn policy_route(
    req: Request<Incoming>,
    state: &AdminState,
    who: Requester,
) -> Response<Body> {
    use http_body_util::BodyExt as _;
    let Some(policy) = &state.policy else {
        return json(
            StatusCode::CONFLICT,
            serde_json::json!({"error": "this node reads users, rules and tokens from files \
                (policy.source = \"files\"): edit the files and send SIGHUP"}),
        );
    };
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/api/policy") => json(StatusCode::OK, api::show(policy)),
        (Method::GET, "/api/policy/history") => json(StatusCode::OK, api::history(policy).await),
        (Method::POST, "/api/policy") => {
            let body = http_body_util::Limited::new(req.into_body(), api::MAX_BODY_BYTES);
            match body.collect().await {
                Ok(b) => {
                    let (status, value) = api::edit(policy, &b.to_bytes(), who).await;
                    json(status, value)
                }
                Err(e) => json(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    serde_json::json!({"error": format!("the body could not be read: {e}")}),
                ),
            }
        }
        _ => plain(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(value.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

/// `?offset=N&limit=N&q=TEXT` of a listing: a page of it, of the entries that hold TEXT.
fn page_of(query: Option<&str>) -> Page {
    let mut page = Page {
        offset: 0,
        limit: usize::MAX,
        filter: None,
    };
    for (key, value) in query
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
    {
        match key {
            "offset" => page.offset = value.parse().unwrap_or(0),
            "limit" => page.limit = value.parse().unwrap_or(usize::MAX),
            "q" => page.filter = percent_decode(&value.replace('+', " ")).filter(|q| !q.is_empty()),
            _ => {}
        }
    }
    page
}

/// Every figure of the broker's [`Stats`], by field name; figures by QoS as arrays of three.
fn stats_json(stats: &Stats) -> serde_json::Value {
    let figures: serde_json::Map<String, serde_json::Value> = stats
        .figures()
        .map(|(figure, value)| {
            let value = match value {
                FigureValue::One(n) => serde_json::json!(n),
                FigureValue::ByQos(q) => serde_json::json!(q),
            };
            (figure.field.to_owned(), value)
        })
        .collect();
    serde_json::Value::Object(figures)
}

fn client_json(c: &ClientSummary) -> serde_json::Value {
    serde_json::json!({
        "client_id": c.client_id,
        "username": c.username,
        "protocol": match c.protocol {
            ProtocolVersion::V311 => "3.1.1",
            ProtocolVersion::V5 => "5.0",
        },
        "connected": c.connected,
        "subscriptions": c.subscriptions.iter().map(|(f, q)| serde_json::json!({
            "filter": f,
            "qos": *q as u8,
        })).collect::<Vec<_>>(),
        "inflight": c.inflight,
        "queued": c.queued,
        "congested": c.congested,
    })
}

fn rtt_map(mesh: Option<&MeshStats>) -> std::collections::HashMap<String, std::time::Duration> {
    mesh.and_then(|m| m.rtt.lock().ok().map(|r| r.clone()))
        .unwrap_or_default()
}

fn peer_json(p: &PeerSummary, rtt: Option<&std::time::Duration>) -> serde_json::Value {
    serde_json::json!({
        "peer_id": p.node.as_str(),
        "connected": p.connected,
        "region": p.region,
        "rtt_ms": rtt.map(|d| d.as_secs_f64() * 1000.0),
        "routes": p.routes,
        "route_version": p.route_version,
        "announced_version": p.announced_version,
        "route_lag": p.announced_version.saturating_sub(p.route_version),
        "outbox_messages": p.outbox_messages,
        "outbox_bytes": p.outbox_bytes,
        "forwarded_to": p.forwarded_to,
        "forwarded_from": p.forwarded_from,
        "leaf": p.leaf,
        // Unix milliseconds (the broker's clock is the wall clock).
        "connected_since_ms": p.up_since.map(|t| t.as_millis()),
    })
}

/// `%XX` escapes decoded; `None` for a bad escape or non-UTF-8 result.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Every figure of the broker's [`Stats`], as its table describes it: labelled figures of one
/// metric (the reasons of `messages_dropped`, the QoS levels of `messages_received`) as one
/// family.
fn render_stats(r: &mut Registry, s: &Stats) {
    type Labels = Vec<(String, String)>;
    let mut families: Vec<(&Figure, Family<Labels, Counter>)> = Vec::new();
    for (figure, value) in s.figures() {
        let help = figure.metric_help.trim().trim_end_matches('.');
        let labelled = figure.label.is_some() || matches!(value, FigureValue::ByQos(_));
        if !labelled {
            let FigureValue::One(v) = value else {
                continue;
            };
            match figure.kind {
                FigureKind::Gauge => {
                    let g: Gauge = Gauge::default();
                    g.set(i64::try_from(v).unwrap_or(i64::MAX));
                    r.register(figure.metric, help, g);
                }
                FigureKind::Counter => {
                    let c: Counter = Counter::default();
                    c.inc_by(v);
                    r.register(figure.metric, help, c);
                }
            }
            continue;
        }
        let i = match families.iter().position(|(f, _)| f.metric == figure.metric) {
            Some(i) => i,
            None => {
                families.push((figure, Family::default()));
                families.len() - 1
            }
        };
        let family = &families[i].1;
        match value {
            FigureValue::ByQos(by_qos) => {
                for (qos, v) in by_qos.iter().enumerate() {
                    family
                        .get_or_create(&vec![("qos".to_owned(), qos.to_string())])
                        .inc_by(*v);
                }
            }
            FigureValue::One(v) => {
                if let Some((name, label)) = figure.label {
                    family
                        .get_or_create(&vec![(name.to_owned(), label.to_owned())])
                        .inc_by(v);
                }
            }
        }
    }
    for (figure, family) in families {
        let help = figure.metric_help.trim().trim_end_matches('.');
        r.register(figure.metric, help, family);
    }
}

/// The metrics page from a snapshot of the broker's [`Stats`], the daemon's counters, the
/// runtime's worker threads and the broker thread, and, in cluster mode, the peers and the
/// mesh's counters.
pub fn render_metrics(
    s: &Stats,
    d: &DaemonCounters,
    peers: &[PeerSummary],
    mesh: Option<&MeshStats>,
    runtime: &RuntimeMetrics,
    broker_thread: &RuntimeMetrics,
) -> String {
    let mut r = Registry::with_prefix("meridian");
    let counter = |r: &mut Registry, name: &str, help: &str, v: u64| {
        let c: Counter = Counter::default();
        c.inc_by(v);
        r.register(name, help, c);
    };
    render_stats(&mut r, s);
    let family = |r: &mut Registry, name: &str, help: &str, values: &[(&str, u64)]| {
        let f = Family::<Vec<(String, String)>, Counter>::default();
        for (reason, v) in values {
            f.get_or_create(&vec![("reason".to_owned(), (*reason).to_owned())])
                .inc_by(*v);
        }
        r.register(name, help, f);
    };
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    counter(
        &mut r,
        "password_checks",
        "Password checks done (Argon2 verifications, right or wrong)",
        load(&d.password_checks),
    );
    family(
        &mut r,
        "logins_refused",
        "CONNECTs refused before a password check: the check queue was full (busy) or held the \
         client address's share (busy_address); a certificate named another user \
         (certificate_mismatch)",
        &[
            ("busy", load(&d.logins_busy)),
            ("busy_address", load(&d.logins_busy_address)),
            ("certificate_mismatch", load(&d.logins_certificate_mismatch)),
        ],
    );
    family(
        &mut r,
        "websocket_refused",
        "WebSocket upgrades refused: a browser Origin not in allowed_origins",
        &[("origin", load(&d.websocket_origin_refused))],
    );
    family(
        &mut r,
        "admin_refused",
        "Admin requests refused: no or a wrong token (token), a Host not allowed (host), \
         headers not sent in time (header_timeout)",
        &[
            ("token", load(&d.admin_refused_token)),
            ("host", load(&d.admin_refused_host)),
            ("header_timeout", load(&d.admin_header_timeouts)),
        ],
    );
    family(
        &mut r,
        "edge_links_refused",
        "Edge links refused: no or a wrong token, before the upgrade (token); a leaf named as \
         this node or a mesh member (node); too many handshakes from one address (busy_address)",
        &[
            ("token", load(&d.edge_links_refused_token)),
            ("node", load(&d.edge_links_refused_node)),
            ("busy_address", load(&d.edge_links_refused_busy_address)),
        ],
    );
    let frames = Family::<Vec<(String, String)>, Counter>::default();
    for (direction, c) in [("in", &d.edge_frames_in), ("out", &d.edge_frames_out)] {
        frames
            .get_or_create(&vec![("direction".to_owned(), direction.to_owned())])
            .inc_by(load(c));
    }
    r.register(
        "edge_link_frames",
        "Link frames read from edge links (in) and written to them (out)",
        frames,
    );
    counter(
        &mut r,
        "protocol_errors",
        "Connections closed for protocol errors",
        s.protocol_errors,
    );
    counter(
        &mut r,
        "slow_consumer_disconnects",
        "Clients disconnected because their write buffer was full",
        d.slow_consumer_disconnects.load(Ordering::Relaxed),
    );
    counter(
        &mut r,
        "link_sessions_cut",
        "Link sessions to peer nodes cut because their frame queue was full",
        d.link_sessions_cut.load(Ordering::Relaxed),
    );
    counter(
        &mut r,
        "connections_accepted",
        "Connections accepted by the listeners",
        d.connections_accepted.load(Ordering::Relaxed),
    );
    counter(
        &mut r,
        "connections_rejected",
        "Connections closed at accept because a listener was at max_connections",
        d.connections_rejected.load(Ordering::Relaxed),
    );
    counter(
        &mut r,
        "storage_commits",
        "Storage commits (journal batches)",
        d.storage_commits.load(Ordering::Relaxed),
    );
    counter(
        &mut r,
        "storage_syncs",
        "Fsyncs of the journal: commits made durable, alone or together (storage.commit_window_ms)",
        d.storage_syncs.load(Ordering::Relaxed),
    );
    counter(
        &mut r,
        "storage_checkpoints",
        "Journal checkpoints: the changes since the last written to the database (storage.journal_max_bytes)",
        d.storage_checkpoints.load(Ordering::Relaxed),
    );
    counter(
        &mut r,
        "storage_cache_evictions",
        "Pages the store's cache let go of because it was full (storage.cache_bytes)",
        d.storage_cache_evictions.load(Ordering::Relaxed),
    );
    if let Some(m) = mesh {
        render_mesh_metrics(&mut r, peers, m);
    }
    render_runtime_metrics(&mut r, runtime);
    let busy = Counter::<f64, std::sync::atomic::AtomicU64>::default();
    busy.inc_by(broker_thread.worker_total_busy_duration(0).as_secs_f64());
    r.register(
        "broker_thread_busy_seconds",
        "Time the broker thread (the broker task and the region mesh) spent running",
        busy,
    );
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}

/// The worker threads (`runtime.worker_threads`): how many, how busy, how often they sleep.
fn render_runtime_metrics(r: &mut Registry, rt: &RuntimeMetrics) {
    let workers: Gauge = Gauge::default();
    workers.set(i64::try_from(rt.num_workers()).unwrap_or(i64::MAX));
    r.register(
        "runtime_workers",
        "Worker threads serving clients and the broker (runtime.worker_threads)",
        workers,
    );
    let tasks: Gauge = Gauge::default();
    tasks.set(i64::try_from(rt.num_alive_tasks()).unwrap_or(i64::MAX));
    r.register(
        "runtime_tasks",
        "Tasks alive on the worker threads: one per TLS or WebSocket connection, plus the \
         daemon's own (listeners, edge links, the policy document, admin HTTP)",
        tasks,
    );
    let busy = Family::<Labels, Counter<f64, std::sync::atomic::AtomicU64>>::default();
    let parks = Family::<Labels, Counter>::default();
    for w in 0..rt.num_workers() {
        let label = vec![("worker".to_owned(), w.to_string())];
        busy.get_or_create(&label)
            .inc_by(rt.worker_total_busy_duration(w).as_secs_f64());
        parks.get_or_create(&label).inc_by(rt.worker_park_count(w));
    }
    r.register(
        "runtime_worker_busy_seconds",
        "Time each worker thread spent running tasks",
        busy,
    );
    r.register(
        "runtime_worker_parks",
        "Times each worker thread went to sleep for want of work",
        parks,
    );
}

type Labels = Vec<(String, String)>;
/// A per-peer gauge: name, help, value.
type PeerGauge = (&'static str, &'static str, fn(&PeerSummary) -> i64);

fn render_mesh_metrics(r: &mut Registry, peers: &[PeerSummary], m: &MeshStats) {
    let rtt = rtt_map(Some(m));
    // The peer id, and the region it named in its hello (empty until then), so that a
    // dashboard can show `afs1 -> euc1` rather than two peer ids.
    let label = |p: &PeerSummary| {
        vec![
            ("peer".to_owned(), p.node.to_string()),
            ("region".to_owned(), p.region.clone().unwrap_or_default()),
        ]
    };
    let gauges: [PeerGauge; 5] = [
        (
            "peer_connected",
            "1 while a link session to the peer is up",
            |p| i64::from(p.connected),
        ),
        (
            "peer_routes",
            "Filters the peer has subscribers for, as replicated here",
            |p| i64::try_from(p.routes).unwrap_or(i64::MAX),
        ),
        (
            "peer_route_lag",
            "Route-set versions the peer announced and this node has not applied yet",
            |p| {
                i64::try_from(p.announced_version.saturating_sub(p.route_version))
                    .unwrap_or(i64::MAX)
            },
        ),
        (
            "peer_outbox_messages",
            "QoS 1/2 forwards waiting for the peer's ack",
            |p| i64::try_from(p.outbox_messages).unwrap_or(i64::MAX),
        ),
        (
            "peer_outbox_bytes",
            "Topic and payload bytes waiting in the peer's outbox",
            |p| i64::try_from(p.outbox_bytes).unwrap_or(i64::MAX),
        ),
    ];
    for (name, help, value) in gauges {
        let family = Family::<Labels, Gauge>::default();
        for p in peers {
            family.get_or_create(&label(p)).set(value(p));
        }
        r.register(name, help, family);
    }
    let rtt_family = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    for p in peers {
        if let Some(d) = rtt.get(p.node.as_str()) {
            rtt_family.get_or_create(&label(p)).set(d.as_secs_f64());
        }
    }
    r.register(
        "peer_rtt_seconds",
        "Last ping round trip to the peer",
        rtt_family,
    );
    for (name, help, value) in [
        (
            "forward_sent_messages",
            "Messages forwarded to the peer (once per message, whatever its subscriber count)",
            (|p: &PeerSummary| p.forwarded_to) as fn(&PeerSummary) -> u64,
        ),
        (
            "forward_received_messages",
            "Messages the peer forwarded to this node",
            |p: &PeerSummary| p.forwarded_from,
        ),
    ] {
        let family = Family::<Labels, Counter>::default();
        for p in peers {
            family.get_or_create(&label(p)).inc_by(value(p));
        }
        r.register(name, help, family);
    }
    let refused = Family::<Labels, Counter>::default();
    for (reason, v) in [
        ("handshake", m.refused_handshake.load(Ordering::Relaxed)),
        ("not_allowed", m.refused_not_allowed.load(Ordering::Relaxed)),
    ] {
        refused
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc_by(v);
    }
    r.register(
        "p2p_refused_connections",
        "Connections refused: failed handshake (no or wrong cluster key) or peer not allowed",
        refused,
    );
    let c = Counter::<u64>::default();
    c.inc_by(m.dial_failures.load(Ordering::Relaxed));
    r.register(
        "p2p_dial_failures",
        "Dials of bootstrap or discovered peers that failed",
        c,
    );
    let g = Gauge::<i64>::default();
    g.set(
        m.discovered
            .lock()
            .map_or(0, |d| i64::try_from(d.len()).unwrap_or(i64::MAX)),
    );
    r.register(
        "p2p_discovered_peers",
        "Peers known through discovery (announced by other nodes)",
        g,
    );
    let c = Counter::<u64>::default();
    c.inc_by(m.gossip_fallbacks.load(Ordering::Relaxed));
    r.register(
        "p2p_gossip_fallbacks",
        "Broadcasts gossip could not take, sent over the link sessions instead",
        c,
    );
    let c = Counter::<u64>::default();
    c.inc_by(m.gossip_refused.load(Ordering::Relaxed));
    r.register(
        "p2p_gossip_refused",
        "Gossiped frames refused: malformed, or of a kind that travels on link sessions only",
        c,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_page_names_every_family() {
        let stats = Stats {
            connections: 3,
            messages_received: [1, 2, 3],
            dropped_queue_full: 7,
            ..Stats::default()
        };
        let runtime = crate::config::RuntimeConfig { worker_threads: 2 }
            .build()
            .unwrap();
        let page = render_metrics(
            &stats,
            &DaemonCounters::default(),
            &[],
            None,
            &runtime.metrics(),
            &runtime.metrics(),
        );
        assert!(page.contains("meridian_connections 3"), "{page}");
        assert!(
            page.contains("meridian_messages_received_total{qos=\"2\"} 3"),
            "{page}"
        );
        assert!(
            page.contains("meridian_messages_dropped_total{reason=\"queue_full\"} 7"),
            "{page}"
        );
        assert!(
            page.contains("meridian_slow_consumer_disconnects_total 0"),
            "{page}"
        );
        assert!(page.contains("meridian_runtime_workers 2"), "{page}");
        assert!(
            page.contains("meridian_broker_thread_busy_seconds_total "),
            "{page}"
        );
        assert!(
            page.contains("meridian_runtime_worker_parks_total{worker=\"1\"}"),
            "{page}"
        );
        assert!(
            page.contains("meridian_runtime_worker_busy_seconds_total{worker=\"0\"}"),
            "{page}"
        );
        assert!(page.ends_with("# EOF\n"));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("bad%zz"), None);
        assert_eq!(percent_decode("cut%2"), None);
    }
}
