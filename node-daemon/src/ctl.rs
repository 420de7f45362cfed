//! `meridian ctl`: the admin CLI. It talks to the admin API of a running node (HTTP/1.1,
//! with the bearer token of `admin.token_file` when the node has one) and prints what the
//! node answered.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

/// How long one request to the admin API may take.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the node's admin API is, and how to be let in.
#[derive(Debug, Clone, clap::Args)]
pub struct CtlArgs {
    /// The node's admin API address (admin.bind).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
    pub admin: SocketAddr,
    /// A file whose first line is the admin API's bearer token (the node's admin.token_file).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// What to do.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum CtlCommand {
    /// The other nodes of the deployment.
    #[command(subcommand)]
    Peers(PeersCommand),
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
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--token-file: cannot read {}", path.display()))?;
            Some(text.lines().next().unwrap_or("").trim().to_owned())
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a runtime")?;
    // A node that takes the connection and never answers does not hang the command.
    let call = |method: Method, path: String| {
        runtime.block_on(async {
            tokio::time::timeout(
                REQUEST_TIMEOUT,
                request(args.admin, token.as_deref(), method, &path),
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
            let peers = call(Method::GET, "/api/peers".to_owned())?;
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
            let answer = call(Method::DELETE, format!("/api/peers/{peer_id}"))?;
            writeln!(
                out,
                "forgot {peer_id}: {} routes withdrawn, {} queued messages dropped",
                answer["routes_withdrawn"], answer["messages_dropped"]
            )?;
        }
    }
    Ok(())
}

/// One request to the admin API; the JSON answer of a 2xx, else an error with the node's
/// own words.
async fn request(
    addr: SocketAddr,
    token: Option<&str>,
    method: Method,
    path: &str,
) -> anyhow::Result<serde_json::Value> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot reach the admin API at {addr} (--admin ADDR)"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("admin API handshake")?;
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let req = req
        .body(Full::new(Bytes::new()))
        .context("building the request")?;
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
