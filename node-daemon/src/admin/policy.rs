//! The admin API's policy endpoints (`meridian ctl user|acl|token|residency|history` use them):
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /api/policy` | what the document says: user and token names (never hashes), the access rules in order, the residency rules, the nodes; its epoch, and the nodes a compaction that is due waits for (`compaction_waits_for`) |
//! | `POST /api/policy` | `{"edits": [EDIT, ...]}` applied as one change by the request's token: 200 `{"changed": bool}`, 400 for an edit that is not valid, 404 for removing what is not there |
//! | `GET /api/policy/history` | every change, oldest first: `at_ms`, `by`, `node`, `region`, `what`, `change`, `signed_by` (the operator key that signed it) |
//! | `GET /api/policy/document` | the whole document (`document`, hex) and its `epoch`: what `meridian ctl --operator-key` makes its change on |
//! | `POST /api/policy/changes` | `{"changes": [HEX, ...]}`: changes an operator key signed, each checked (403 for one no operator key signed, 409 for one made on what this node does not hold: another epoch); 200 `{"changed": bool}` |
//! | `POST /api/policy/epoch` | `{"document": HEX}`: a document of a later epoch, every change signed or its epoch's genesis, its base signed (403 otherwise, 409 for an epoch not later than this node's); 200 `{"epoch": N}` |
//!
//! With `policy.operator_keys`, `POST /api/policy` is refused (403): a change counts only if an
//! operator key signed it, whoever holds an admin token.
//!
//! An edit is a JSON object named by its `edit` field, as [`Edit`] serializes:
//! `{"edit": "user_set", "name": "alice", "hash": "$argon2id$..."}`,
//! `{"edit": "acl_add", "rule": {"permission": "deny", "action": "subscribe", "topic":
//! "secret/#"}, "before": 0}`, `{"edit": "token_set", "kind": "admin", "name": "ops", "hash":
//! SHA256_HEX}`, `{"edit": "residency_set", "filter": "health/#", "regions": ["fra"]}`...
//! Passwords and tokens never travel: `meridian ctl` hashes them first.

use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

use super::{AdminState, Body, Requester, json as respond, plain};
use crate::policy::PolicyHandle;
use crate::policy::document::{DocError, Edit, EditError};

/// Largest request body of `POST /api/policy`.
const MAX_BODY_BYTES: usize = 1024 * 1024;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Edits {
    edits: Vec<Edit>,
}

/// `GET /api/policy`.
fn show(policy: &PolicyHandle) -> Value {
    let p = policy.current();
    json!({
        "users": p.users.keys().collect::<Vec<_>>(),
        "acl_default": p.acl_default.map_or("allow".to_owned(), |d| d.to_string()),
        "acl": p.acl,
        "admin_tokens": p.admin_tokens.keys().collect::<Vec<_>>(),
        "edge_tokens": p.edge_tokens.keys().collect::<Vec<_>>(),
        "residency": p.residency.iter().map(|(filter, regions)| json!({
            "filter": filter,
            "regions": regions,
        })).collect::<Vec<_>>(),
        "nodes": p.nodes.iter().map(|(peer_id, n)| json!({
            "peer_id": peer_id,
            "name": n.name,
            "region": n.region,
        })).collect::<Vec<_>>(),
        "unreadable": p.unreadable,
        "epoch": policy.epoch(),
        "signed": policy.signed(),
        "compaction_waits_for": policy.compaction_waits_for(),
    })
}

/// `POST /api/policy`: the body's edits, made by `who`.
async fn edit(policy: &PolicyHandle, body: &[u8], who: String) -> (StatusCode, Value) {
    let edits: Edits = match serde_json::from_slice(body) {
        Ok(e) => e,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                json!({"error": format!("the body is not {{\"edits\": [...]}}: {e}")}),
            );
        }
    };
    // A node's own entry is the node's to write.
    if edits.edits.iter().any(|e| matches!(e, Edit::Node { .. })) {
        return (
            StatusCode::BAD_REQUEST,
            json!({"error": "nodes record themselves; `node_remove` takes one out"}),
        );
    }
    match policy.edit(edits.edits, who).await {
        Ok(changed) => (StatusCode::OK, json!({"changed": changed})),
        Err(EditError::NotFound(why)) => (StatusCode::NOT_FOUND, json!({"error": why})),
        Err(EditError::Invalid(why)) => (StatusCode::BAD_REQUEST, json!({"error": why})),
        Err(EditError::Storage(why)) => (StatusCode::INTERNAL_SERVER_ERROR, json!({"error": why})),
        Err(EditError::Refused(why)) => (StatusCode::FORBIDDEN, json!({"error": why})),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Changes {
    changes: Vec<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Epoch {
    document: String,
}

/// The status and answer of a refused change or document.
fn refused(e: &DocError) -> (StatusCode, Value) {
    let status = match e {
        DocError::Unsigned(_) => StatusCode::FORBIDDEN,
        DocError::Behind(_) => StatusCode::CONFLICT,
        DocError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        DocError::Load(_) | DocError::Sync(_) => StatusCode::BAD_REQUEST,
    };
    (status, json!({"error": e.to_string()}))
}

/// `POST /api/policy/changes`.
async fn changes(policy: &PolicyHandle, body: &[u8]) -> (StatusCode, Value) {
    let bad = |why: String| (StatusCode::BAD_REQUEST, json!({"error": why}));
    let changes: Changes = match serde_json::from_slice(body) {
        Ok(c) => c,
        Err(e) => return bad(format!("the body is not {{\"changes\": [HEX, ...]}}: {e}")),
    };
    let mut decoded = Vec::with_capacity(changes.changes.len());
    for (i, c) in changes.changes.iter().enumerate() {
        let change = hex::decode(c)
            .map_err(|e| e.to_string())
            .and_then(|b| automerge::Change::from_bytes(b).map_err(|e| e.to_string()));
        match change {
            Ok(c) => decoded.push(c),
            Err(e) => return bad(format!("changes[{i}] is not an automerge change: {e}")),
        }
    }
    match policy.submit_changes(decoded).await {
        Ok(changed) => (StatusCode::OK, json!({"changed": changed})),
        Err(e) => refused(&e),
    }
}

/// `POST /api/policy/epoch`.
async fn epoch(policy: &PolicyHandle, body: &[u8]) -> (StatusCode, Value) {
    let document = match serde_json::from_slice::<Epoch>(body)
        .map_err(|e| e.to_string())
        .and_then(|e| hex::decode(e.document).map_err(|e| e.to_string()))
    {
        Ok(d) => d,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                json!({"error": format!("the body is not {{\"document\": HEX}}: {e}")}),
            );
        }
    };
    match policy.submit_epoch(document).await {
        Ok(epoch) => (StatusCode::OK, json!({"epoch": epoch})),
        Err(e) => refused(&e),
    }
}

/// `GET /api/policy/history`.
async fn history(policy: &PolicyHandle) -> Value {
    json!(policy.history().await)
}

/// The policy endpoints: `/api/policy` and what is under it.
pub(super) async fn route(
    req: Request<Incoming>,
    state: &AdminState,
    who: Requester,
) -> Response<Body> {
    let Some(policy) = &state.policy else {
        return respond(
            StatusCode::CONFLICT,
            serde_json::json!({"error": "this node reads users, rules and tokens from files \
                (policy.source = \"files\"): edit the files and send SIGHUP"}),
        );
    };
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/api/policy") => respond(StatusCode::OK, show(policy)),
        (Method::GET, "/api/policy/history") => respond(StatusCode::OK, history(policy).await),
        (Method::GET, "/api/policy/document") => match policy.document().await {
            Some((epoch, document)) => respond(
                StatusCode::OK,
                json!({"epoch": epoch, "document": hex::encode(document)}),
            ),
            None => respond(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "the policy task has stopped"}),
            ),
        },
        (Method::POST, path @ ("/api/policy" | "/api/policy/changes" | "/api/policy/epoch")) => {
            // A document travels whole, in hex.
            let max = if path == "/api/policy/epoch" {
                policy.max_document_bytes().saturating_mul(2) + MAX_BODY_BYTES
            } else {
                MAX_BODY_BYTES
            };
            let body = match http_body_util::Limited::new(req.into_body(), max)
                .collect()
                .await
            {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return respond(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        json!({"error": format!("the body could not be read: {e}")}),
                    );
                }
            };
            let (status, value) = match path {
                "/api/policy" => edit(policy, &body, who).await,
                "/api/policy/changes" => changes(policy, &body).await,
                _ => epoch(policy, &body).await,
            };
            respond(status, value)
        }
        _ => plain(StatusCode::NOT_FOUND, "not found\n"),
    }
}
