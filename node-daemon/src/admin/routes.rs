//! The admin API's routes: each method and path (the table in the module above) and the JSON
//! it answers with.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use meridian_core::broker::{ClientSummary, FigureValue, ForgetError, PeerSummary, Stats};
use meridian_core::codec::ProtocolVersion;
use meridian_core::routes::NodeId;
use tracing::debug;

use super::history;
use super::metrics::{render_metrics, rtt_map};
use super::{AdminState, Body, Requester, STATUS_PAGE, json, plain};
use crate::mailbox::Page;

pub(super) async fn route(
    req: Request<Incoming>,
    state: &AdminState,
    who: Requester,
) -> Response<Body> {
    let engine = &state.engine;
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if path == "/api/policy" || path.starts_with("/api/policy/") {
        return super::policy::route(req, state, who).await;
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
        (Method::GET, "/api/node") => json(StatusCode::OK, node_json(state)),
        (Method::GET, "/api/stats") => match engine.stats().await {
            Some(stats) => json(StatusCode::OK, stats_json(&stats)),
            None => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
        },
        (Method::GET, "/api/history") => match engine.stats().await {
            Some(now) => {
                let mut samples = state.history.samples();
                samples.push((history::now_ms(), now));
                let samples: Vec<_> = samples
                    .iter()
                    .map(|(at_ms, stats)| {
                        serde_json::json!({"at_ms": at_ms, "figures": stats_json(stats)})
                    })
                    .collect();
                let interval_ms = u64::try_from(history::EVERY.as_millis()).unwrap_or(u64::MAX);
                json(
                    StatusCode::OK,
                    serde_json::json!({"interval_ms": interval_ms, "samples": samples}),
                )
            }
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
            let signature = match forget_signature(state, &node, req.uri().query()).await {
                Ok(signature) => signature,
                Err(refusal) => return refusal,
            };
            match engine.forget_peer(node, signature).await {
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

/// `GET /api/node`: this node, what it has in force of the policy document, and what came of
/// its reloads.
fn node_json(state: &AdminState) -> serde_json::Value {
    let node = &state.node;
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    let reloads = state
        .reloads
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    serde_json::json!({
        "name": node.name,
        "region": node.region,
        "peer_id": node.peer_id,
        "p2p_addrs": node.p2p_addrs,
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": node.started.elapsed().as_secs(),
        "reloads": {
            "done": reloads.done,
            "failed": reloads.failed,
            "last_error": reloads.last_error,
            "restart_needed": reloads.restart_needed,
        },
        "policy_in_force": state.in_force.as_deref().map(|p| serde_json::json!({
            "changes": load(&p.changes),
            "users": load(&p.users),
            "acl_rules": load(&p.acl_rules),
            "residency_rules": load(&p.residency_rules),
        })),
    })
}

/// With operator keys, the operator's signature of a forget, `?incarnation=N&signature=HEX`
/// (`meridian ctl --operator-key ... peers forget`), checked here and carried by the
/// announcement for every other node to check again: 403 without one or with one no operator
/// key made, 409 when it names an incarnation other than the one this node knows. Without
/// operator keys, none is needed (and none is passed on).
async fn forget_signature(
    state: &AdminState,
    node: &NodeId,
    query: Option<&str>,
) -> Result<Option<Bytes>, Response<Body>> {
    if state.operator_keys.is_empty() {
        return Ok(None);
    }
    let (mut incarnation, mut signature) = (None, None);
    for (key, value) in query_pairs(query) {
        match key {
            "incarnation" => incarnation = value.parse::<u64>().ok(),
            "signature" => signature = hex::decode(value).ok(),
            _ => {}
        }
    }
    let (Some(incarnation), Some(signature)) = (incarnation, signature) else {
        return Err(json(
            StatusCode::FORBIDDEN,
            serde_json::json!({"error": "with operator keys, a forget needs the operator's \
                signature: meridian ctl --operator-key FILE peers forget PEER_ID"}),
        ));
    };
    if !state
        .operator_keys
        .verify_forget(node.as_str(), incarnation, &signature)
    {
        return Err(json(
            StatusCode::FORBIDDEN,
            serde_json::json!({"error": "no operator key signed this forget"}),
        ));
    }
    let known = state
        .engine
        .peers()
        .await
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.node == *node)
        .map(|p| p.incarnation);
    if known.is_some_and(|known| known != incarnation) {
        return Err(json(
            StatusCode::CONFLICT,
            serde_json::json!({"error": format!(
                "the forget is signed for incarnation {incarnation}, this node knows {}",
                known.unwrap_or(0)
            )}),
        ));
    }
    Ok(Some(Bytes::from(signature)))
}

/// The `key=value` pairs of a query string (raw: values are not decoded).
fn query_pairs(query: Option<&str>) -> impl Iterator<Item = (&str, &str)> {
    query
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
}

/// `?offset=N&limit=N&q=TEXT` of a listing: a page of it, of the entries that hold TEXT.
fn page_of(query: Option<&str>) -> Page {
    let mut page = Page {
        offset: 0,
        limit: usize::MAX,
        filter: None,
    };
    for (key, value) in query_pairs(query) {
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

fn peer_json(p: &PeerSummary, rtt: Option<&std::time::Duration>) -> serde_json::Value {
    serde_json::json!({
        "peer_id": p.node.as_str(),
        "connected": p.connected,
        "region": p.region,
        "incarnation": p.incarnation,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb").as_deref(), Some("a/b"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("bad%zz"), None);
        assert_eq!(percent_decode("cut%2"), None);
    }
}
