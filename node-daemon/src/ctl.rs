//! `meridian ctl`: the admin CLI. It talks to the admin API of a running node (HTTP/1.1,
//! with a bearer admin token when the node asks for one) and prints what the node answered.
//!
//! Policy edits (`user`, `acl`, `token`, `residency`) go to the node's policy document and
//! from there to every node of the deployment. Passwords and tokens never leave this process:
//! they are hashed here and only the hashes are sent.
//!
//! With `--operator-key FILE` (a deployment with `policy.operator_keys`), an edit is made here
//! as a change of the node's document, signed with the operator key, and sent as such; the
//! node checks the signature before the change counts. `policy compact` makes the next epoch
//! the same way, and `peers forget` signs the forget of the node's incarnation.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

use crate::policy::document::{Author, Edit, PolicyDoc, RuleEntry, TokenKind};
use crate::policy::operator::OperatorKey;
use tokio_rustls::rustls::pki_types::ServerName;

/// How long one request to the admin API may take.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the node's admin API is, and how to be let in.
#[derive(Debug, Clone, clap::Args)]
pub struct CtlArgs {
    /// The node's admin API address (admin.bind).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    pub admin: SocketAddr,
    /// A token file (the node's admin.token_file will do): its first token is presented.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Speak HTTPS to the admin API (admin.cert), trusting the certificates of FILE (PEM: the
    /// node's certificate, or the CA that signed it).
    #[arg(long, value_name = "FILE")]
    pub admin_ca: Option<PathBuf>,
    /// The name the node's certificate is checked against (default: the --admin address).
    #[arg(long, value_name = "NAME", requires = "admin_ca")]
    pub admin_name: Option<String>,
    /// An operator key (`meridian keygen --operator`): edits (and `peers forget`) are signed
    /// with it, as a node with `policy.operator_keys` requires.
    #[arg(long, value_name = "FILE")]
    pub operator_key: Option<PathBuf>,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// What to do.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum CtlCommand {
    /// The other nodes of the deployment.
    #[command(subcommand)]
    Peers(PeersCommand),
    /// The users who may log in (the policy document).
    #[command(subcommand)]
    User(UserCommand),
    /// The access rules (the policy document).
    #[command(subcommand)]
    Acl(AclCommand),
    /// Admin API and edge-link tokens (the policy document).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Data-residency rules: the regions a topic's messages may reach (the policy document).
    #[command(subcommand)]
    Residency(ResidencyCommand),
    /// Every change of the policy document: when, by which token, on which node and region,
    /// and what.
    History,
    /// The policy document itself.
    #[command(subcommand)]
    Policy(PolicyCommand),
}

/// `meridian ctl policy ...`
#[derive(Debug, Clone, clap::Subcommand)]
pub enum PolicyCommand {
    /// Make the deployment's next epoch from what the node's document says now, signed with
    /// the operator key (--operator-key): its history is summarised, and a document made
    /// before the deployment had operator keys becomes one every node takes. Edits made
    /// elsewhere that the node does not hold yet are not carried over.
    Compact {
        /// History kept change by change (older changes are summarised), in days.
        #[arg(long, default_value_t = 90)]
        retention_days: u64,
    },
}

/// `meridian ctl user ...`
#[derive(Debug, Clone, clap::Subcommand)]
pub enum UserCommand {
    /// The users' names.
    List,
    /// Add a user; the password is the first line of stdin (`echo secret | meridian ctl user
    /// add alice`).
    Add { name: String },
    /// Change a user's password (from stdin, as for `add`).
    Passwd { name: String },
    /// Remove a user: its next login is refused (connected clients stay connected).
    Remove { name: String },
}

/// `meridian ctl acl ...`
#[derive(Debug, Clone, clap::Subcommand)]
pub enum AclCommand {
    /// The rules in the order they are tried, numbered, and the default.
    List,
    /// Add a rule, at the end or before rule N; the same rule with the other permission is
    /// replaced.
    Add {
        #[command(flatten)]
        rule: RuleArgs,
        /// Place it before rule N (as `acl list` numbers them).
        #[arg(long, value_name = "N")]
        before: Option<usize>,
    },
    /// Remove a rule (whatever its permission).
    Remove {
        #[command(flatten)]
        rule: RuleArgs,
    },
    /// What holds where no rule applies: allow or deny.
    Default {
        permission: meridian_core::acl::Permission,
    },
}

/// One access rule on the command line.
#[derive(Debug, Clone, clap::Args)]
pub struct RuleArgs {
    /// allow or deny
    pub permission: String,
    /// publish, subscribe or all
    pub action: String,
    /// A topic filter; %u and %c stand for the username and client id.
    pub topic: String,
    /// Only for this username.
    #[arg(long)]
    pub user: Option<String>,
    /// Only for this client id.
    #[arg(long)]
    pub client_id: Option<String>,
}

/// Which kind of token.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TokenKindArg {
    /// Bearer tokens of the admin API.
    Admin,
    /// Tokens edge objects link with.
    Edge,
}

/// `meridian ctl token ...`
#[derive(Debug, Clone, clap::Subcommand)]
pub enum TokenCommand {
    /// The tokens' names.
    List,
    /// Make a new random token; it is printed once, only its hash is kept.
    Add { kind: TokenKindArg, name: String },
    /// Revoke a token on every node.
    Remove { kind: TokenKindArg, name: String },
}

/// `meridian ctl residency ...`
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ResidencyCommand {
    /// The rules: a filter and the regions its messages may reach.
    List,
    /// Keep the messages of the topics `filter` matches in `regions`: they are not forwarded
    /// to other regions, nor retained there, and subscriptions to them are not advertised
    /// there. Replaces the filter's rule if it has one.
    Add {
        filter: String,
        #[arg(required = true)]
        regions: Vec<String>,
    },
    /// Remove the filter's rule.
    Remove { filter: String },
}

/// `meridian ctl peers ...`
#[derive(Debug, Clone, clap::Subcommand)]
pub enum PeersCommand {
    /// List the nodes this node knows: link, region, routes, outbox.
    List,
    /// Forget a node that left the deployment for good: its routes are withdrawn and what
    /// waits for it is dropped, on this node and on every node that cannot reach it either.
    /// Refused while its link to this node is up.
    Forget {
        /// The node's peer id (`meridian peer-id`, or `meridian ctl peers list`).
        peer_id: String,
    },
}

/// Run a `meridian ctl` command, writing what the node answered to `out`.
pub fn ctl_command(args: &CtlArgs, out: &mut impl std::io::Write) -> anyhow::Result<()> {
    let token = match &args.token_file {
        // The node reads every token of its file; one is enough to ask with.
        Some(path) => crate::policy::tokens::read_file(path, "--token-file")?
            .into_iter()
            .next(),
        None => None,
    };
    let tls = match &args.admin_ca {
        Some(ca) => {
            let name = match &args.admin_name {
                Some(n) => n.clone(),
                None => args.admin.ip().to_string(),
            };
            let name = ServerName::try_from(name.clone())
                .with_context(|| format!("--admin-name {name:?} is not a host name"))?;
            Some((crate::transport::tls::client_connector(ca)?, name))
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a runtime")?;
    // A node that takes the connection and never answers does not hang the command.
    let call = |method: Method, path: String, body: Option<serde_json::Value>| {
        runtime.block_on(async {
            tokio::time::timeout(
                REQUEST_TIMEOUT,
                request(
                    args.admin,
                    tls.as_ref(),
                    token.as_deref(),
                    method,
                    &path,
                    body,
                ),
            )
            .await
            .unwrap_or_else(|_| {
                bail!(
                    "{path}: no answer from {} within {REQUEST_TIMEOUT:?}",
                    args.admin
                )
            })
        })
    };
    match &args.command {
        CtlCommand::Peers(PeersCommand::List) => {
            let peers = call(Method::GET, "/api/peers".to_owned(), None)?;
            writeln!(
                out,
                "{:<54} {:<10} {:<9} {:>8} {:>10} {:>12}",
                "PEER", "REGION", "LINK", "ROUTES", "OUTBOX", "OUTBOX_BYTES"
            )?;
            let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
            for p in peers.as_array().into_iter().flatten() {
                writeln!(
                    out,
                    "{:<54} {:<10} {:<9} {:>8} {:>10} {:>12}",
                    p["peer_id"].as_str().unwrap_or("?"),
                    p["region"].as_str().unwrap_or("-"),
                    if p["connected"].as_bool() == Some(true) {
                        "up"
                    } else {
                        "down"
                    },
                    n(&p["routes"]),
                    n(&p["outbox_messages"]),
                    n(&p["outbox_bytes"]),
                )?;
            }
        }
        CtlCommand::Peers(PeersCommand::Forget { peer_id }) => {
            let peer_id: libp2p::PeerId = peer_id
                .parse()
                .with_context(|| format!("{peer_id:?} is not a peer id"))?;
            // With an operator key, the forget is signed for the incarnation the node knows,
            // so that every other node honours its announcement.
            let query = match operator_key(args)? {
                Some(key) => {
                    let peers = call(Method::GET, "/api/peers".to_owned(), None)?;
                    let incarnation = peers
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|p| p["peer_id"].as_str() == Some(&peer_id.to_string()))
                        .and_then(|p| p["incarnation"].as_u64())
                        .with_context(|| format!("the node does not know {peer_id}"))?;
                    let signature = key.sign_forget(&peer_id.to_string(), incarnation);
                    format!(
                        "?incarnation={incarnation}&signature={}",
                        hex::encode(signature)
                    )
                }
                None => String::new(),
            };
            let answer = call(Method::DELETE, format!("/api/peers/{peer_id}{query}"), None)?;
            writeln!(
                out,
                "forgot {peer_id}: {} routes withdrawn, {} queued messages dropped",
                answer["routes_withdrawn"], answer["messages_dropped"]
            )?;
        }
        CtlCommand::History => {
            let history = call(Method::GET, "/api/policy/history".to_owned(), None)?;
            writeln!(
                out,
                "{:<24} {:<16} {:<16} {:<10} {:<16} WHAT",
                "WHEN (UTC)", "BY", "NODE", "REGION", "SIGNED BY"
            )?;
            for h in history.as_array().into_iter().flatten() {
                let s = |k: &str| h[k].as_str().unwrap_or("").to_owned();
                let or_dash = |v: String| if v.is_empty() { "-".to_owned() } else { v };
                let signed: String = s("signed_by").chars().take(16).collect();
                writeln!(
                    out,
                    "{:<24} {:<16} {:<16} {:<10} {:<16} {}",
                    utc(h["at_ms"].as_i64().unwrap_or(0)),
                    s("by"),
                    s("node"),
                    or_dash(s("region")),
                    or_dash(signed),
                    s("what")
                )?;
            }
        }
        CtlCommand::User(UserCommand::List) => {
            let policy = call(Method::GET, "/api/policy".to_owned(), None)?;
            for name in policy["users"].as_array().into_iter().flatten() {
                writeln!(out, "{}", name.as_str().unwrap_or(""))?;
            }
        }
        CtlCommand::Acl(AclCommand::List) => {
            let policy = call(Method::GET, "/api/policy".to_owned(), None)?;
            writeln!(
                out,
                "default: {}",
                policy["acl_default"].as_str().unwrap_or("?")
            )?;
            for (i, r) in policy["acl"].as_array().into_iter().flatten().enumerate() {
                let rule: crate::policy::document::RuleEntry =
                    serde_json::from_value(r.clone()).context("the node's answer")?;
                writeln!(out, "{:>4}  {rule}", i + 1)?;
            }
        }
        CtlCommand::Token(TokenCommand::List) => {
            let policy = call(Method::GET, "/api/policy".to_owned(), None)?;
            for kind in ["admin", "edge"] {
                for name in policy[format!("{kind}_tokens")]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    writeln!(out, "{kind:<6} {}", name.as_str().unwrap_or(""))?;
                }
            }
        }
        CtlCommand::Residency(ResidencyCommand::List) => {
            let policy = call(Method::GET, "/api/policy".to_owned(), None)?;
            for r in policy["residency"].as_array().into_iter().flatten() {
                let regions: Vec<&str> = r["regions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str())
                    .collect();
                writeln!(
                    out,
                    "{} -> {}",
                    r["filter"].as_str().unwrap_or(""),
                    regions.join(",")
                )?;
            }
        }
        CtlCommand::Policy(PolicyCommand::Compact { retention_days }) => {
            let key = operator_key(args)?.context(
                "policy compact: the next epoch is signed with the operator key (--operator-key)",
            )?;
            let (mut doc, author) = node_document(&call, &key)?;
            let next = doc.compacted_signed(
                &author,
                now_ms(),
                retention_days.saturating_mul(86_400_000),
                &key,
            )?;
            let mut next = next;
            let body = serde_json::json!({ "document": hex::encode(next.save()) });
            let answer = call(Method::POST, "/api/policy/epoch".to_owned(), Some(body))?;
            writeln!(
                out,
                "epoch {}: signed by {}",
                answer["epoch"],
                key.public_hex()
            )?;
        }
        CtlCommand::User(_)
        | CtlCommand::Acl(_)
        | CtlCommand::Token(_)
        | CtlCommand::Residency(_) => {
            let (edit, secret) = policy_edit(&args.command, args.operator_key.is_some())?;
            let answer = match operator_key(args)? {
                None => {
                    let body = serde_json::json!({ "edits": [edit] });
                    call(Method::POST, "/api/policy".to_owned(), Some(body))?
                }
                Some(key) => {
                    let (doc, author) = node_document(&call, &key)?;
                    match doc.signed_change(std::slice::from_ref(&edit), &author, now_ms(), &key)? {
                        Some(change) => {
                            let body = serde_json::json!({ "changes": [hex::encode(change)] });
                            call(Method::POST, "/api/policy/changes".to_owned(), Some(body))?
                        }
                        None => serde_json::json!({ "changed": false }),
                    }
                }
            };
            let what = edit.describe();
            match secret {
                // The new token, alone on its line (`ctl token add admin ops > ops.token`).
                Some(token) => writeln!(out, "{token}")?,
                None if answer["changed"] == true => writeln!(out, "done: {what}")?,
                None => writeln!(out, "unchanged: {what} (already so)")?,
            }
        }
    }
    Ok(())
}

/// The operator key of `--operator-key`, if given.
fn operator_key(args: &CtlArgs) -> anyhow::Result<Option<OperatorKey>> {
    args.operator_key
        .as_deref()
        .map(OperatorKey::load)
        .transpose()
}

/// The node's document, to make a change on, and the author a change made on it names: the
/// operator key (its first 16 hex digits), and the node and region it was sent to.
fn node_document(
    call: &impl Fn(Method, String, Option<serde_json::Value>) -> anyhow::Result<serde_json::Value>,
    key: &OperatorKey,
) -> anyhow::Result<(PolicyDoc, Author)> {
    let node = call(Method::GET, "/api/node".to_owned(), None)?;
    let answer = call(Method::GET, "/api/policy/document".to_owned(), None)?;
    let bytes = hex::decode(answer["document"].as_str().unwrap_or(""))
        .context("the node's document is not hex")?;
    let mut actor = [0u8; 16];
    getrandom::fill(&mut actor).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let doc = PolicyDoc::load(&bytes, automerge::ActorId::from(&actor[..]))
        .context("the node's policy document")?;
    let author = Author {
        by: format!("operator:{}", &key.public_hex()[..16]),
        node: node["name"].as_str().unwrap_or("").to_owned(),
        region: node["region"].as_str().unwrap_or("").to_owned(),
    };
    Ok((doc, author))
}

fn now_ms() -> i64 {
    i64::try_from(crate::clock::unix_ms()).unwrap_or(i64::MAX)
}

/// The policy edit a command asks for, and the new token it made, if any. With
/// `claim_keys` (an operator key signs the edit), a user's password also derives its claim
/// key, whose public half the entry holds.
fn policy_edit(command: &CtlCommand, claim_keys: bool) -> anyhow::Result<(Edit, Option<String>)> {
    let rule = |r: &RuleArgs| RuleEntry {
        permission: r.permission.clone(),
        action: r.action.clone(),
        topic: r.topic.clone(),
        user: r.user.clone(),
        client_id: r.client_id.clone(),
    };
    let kind = |k: TokenKindArg| match k {
        TokenKindArg::Admin => TokenKind::Admin,
        TokenKindArg::Edge => TokenKind::Edge,
    };
    let password = |name: &str| -> anyhow::Result<(String, Option<String>)> {
        let password = crate::passwd::read_password(&format!("meridian ctl user add {name}"))?;
        let claim_key = if claim_keys {
            let key = crate::policy::claim_key::derive(password.as_bytes(), name)?;
            Some(crate::policy::claim_key::public_hex(&key))
        } else {
            None
        };
        Ok((crate::passwd::hash(password.as_bytes())?, claim_key))
    };
    Ok(match command {
        CtlCommand::User(UserCommand::Add { name } | UserCommand::Passwd { name }) => {
            let (hash, claim_key) = password(name)?;
            (
                Edit::UserSet {
                    name: name.clone(),
                    hash,
                    claim_key,
                },
                None,
            )
        }
        CtlCommand::User(UserCommand::Remove { name }) => {
            (Edit::UserRemove { name: name.clone() }, None)
        }
        CtlCommand::Acl(AclCommand::Add { rule: r, before }) => {
            let before = match before {
                Some(0) => bail!("--before: rules are numbered from 1 (`meridian ctl acl list`)"),
                Some(n) => Some(n - 1),
                None => None,
            };
            (
                Edit::AclAdd {
                    rule: rule(r),
                    before,
                },
                None,
            )
        }
        CtlCommand::Acl(AclCommand::Remove { rule: r }) => {
            (Edit::AclRemove { rule: rule(r) }, None)
        }
        CtlCommand::Acl(AclCommand::Default { permission }) => (
            Edit::AclDefault {
                permission: *permission,
            },
            None,
        ),
        CtlCommand::Token(TokenCommand::Add { kind: k, name }) => {
            let token = crate::policy::tokens::new_token()?;
            (
                Edit::TokenSet {
                    kind: kind(*k),
                    name: name.clone(),
                    hash: crate::policy::tokens::token_hash(&token),
                },
                Some(token),
            )
        }
        CtlCommand::Token(TokenCommand::Remove { kind: k, name }) => (
            Edit::TokenRemove {
                kind: kind(*k),
                name: name.clone(),
            },
            None,
        ),
        CtlCommand::Residency(ResidencyCommand::Add { filter, regions }) => (
            Edit::ResidencySet {
                filter: filter.clone(),
                regions: regions.clone(),
            },
            None,
        ),
        CtlCommand::Residency(ResidencyCommand::Remove { filter }) => (
            Edit::ResidencyRemove {
                filter: filter.clone(),
            },
            None,
        ),
        _ => bail!("not a policy edit"),
    })
}

/// `YYYY-MM-DD HH:MM:SS.mmm` of milliseconds since the Unix epoch (UTC).
fn utc(ms: i64) -> String {
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Days to a civil date (proleptic Gregorian), by eras of 400 years.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

/// An HTTP/1.1 client connection over `io`, driven on its own task.
async fn handshake<S>(io: S) -> anyhow::Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .context("admin API handshake")?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One request to the admin API; the JSON answer of a 2xx, else an error with the node's
/// own words.
async fn request(
    addr: SocketAddr,
    tls: Option<&(tokio_rustls::TlsConnector, ServerName<'static>)>,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> anyhow::Result<serde_json::Value> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot reach the admin API at {addr} (--admin ADDR)"))?;
    let mut sender = match tls {
        Some((connector, name)) => {
            let stream = connector
                .connect(name.clone(), stream)
                .await
                .with_context(|| format!("TLS with the admin API at {addr} (--admin-ca)"))?;
            handshake(stream).await?
        }
        None => handshake(stream).await?,
    };
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let body = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    let req = req.body(Full::new(body)).context("building the request")?;
    let resp = sender
        .send_request(req)
        .await
        .context("admin API request")?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .context("reading the admin API's answer")?
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    if !status.is_success() {
        let why = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| text.trim().to_owned());
        bail!("{path}: {status}: {why}");
    }
    serde_json::from_str(&text).with_context(|| format!("{path}: the answer is not JSON"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00.000");
        assert_eq!(super::utc(951_782_400_123), "2000-02-29 00:00:00.123");
        assert_eq!(super::utc(1_795_000_000_000), "2026-11-18 11:06:40.000");
    }
}
