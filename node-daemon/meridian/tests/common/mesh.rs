//! Regions of a test deployment: `meridian` nodes meshed over libp2p on loopback, their links
//! through fault-injecting proxies, and what the tests ask of them through the admin API.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use meridian_tools::link_proxy::LinkProxy as Proxy;
use rumqttc::Packet;

use super::{Daemon, free_port, http, v3};

/// How long a mesh condition may take before a test fails (loaded CI machines are slow).
pub const MESH_DEADLINE: Duration = Duration::from_secs(60);

/// One region: a daemon with a p2p port that stays the same across restarts.
pub struct Node {
    pub daemon: Daemon,
    pub peer_id: String,
    /// The port it listens on for peers.
    pub p2p: u16,
    /// Its region.
    pub region: String,
}

impl Node {
    /// Start a node of `region` listening for peers on `p2p`, dialling `peers` (ports on
    /// loopback: proxies to other nodes).
    pub async fn start(region: &str, p2p: u16, peers: &[u16], key: &Path) -> Self {
        Self::start_with(region, p2p, peers, key, "").await
    }

    /// The links of these tests go through proxies: discovery, which would dial the nodes' own
    /// addresses around them, is off unless a test turns it on.
    pub async fn start_with(
        region: &str,
        p2p: u16,
        peers: &[u16],
        key: &Path,
        extra: &str,
    ) -> Self {
        Self::launch(
            region,
            p2p,
            peers,
            key,
            &format!("discover = false\n{extra}"),
        )
        .await
    }

    /// A node with discovery on, as by default, announcing every second, and `advertise` (a
    /// port on loopback) as its address if given.
    pub async fn start_discovering(
        region: &str,
        p2p: u16,
        peers: &[u16],
        key: &Path,
        advertise: Option<u16>,
    ) -> Self {
        let advertise = advertise
            .map(|p| format!("advertise = [\"/ip4/127.0.0.1/tcp/{p}\"]\n"))
            .unwrap_or_default();
        let extra = format!("announce_interval_ms = 1000\n{advertise}");
        Self::launch(region, p2p, peers, key, &extra).await
    }

    pub async fn launch(region: &str, p2p: u16, peers: &[u16], key: &Path, extra: &str) -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        Self::launch_in(tmp, region, p2p, peers, key, extra).await
    }

    /// [`Node::launch`] in `tmp` (its data directory is `tmp/data`, which may exist already:
    /// `meridian peer-id --data-dir` made the node's identity there, say).
    pub async fn launch_in(
        tmp: tempfile::TempDir,
        region: &str,
        p2p: u16,
        peers: &[u16],
        key: &Path,
        extra: &str,
    ) -> Self {
        let peers: Vec<String> = peers
            .iter()
            .map(|p| format!("\"/ip4/127.0.0.1/tcp/{p}\""))
            .collect();
        let config = format!(
            "[cluster]\nenabled = true\nregion = \"{region}\"\nlisten = [\"/ip4/127.0.0.1/tcp/{p2p}\"]\n\
             peers = [{}]\nkey_file = \"{}\"\ndigest_interval_ms = 1000\nping_interval_ms = 1000\n{extra}",
            peers.join(", "),
            key.display()
        );
        let daemon = Daemon::start_in(tmp, Some(&config), Vec::new());
        let peer_id = node_info(daemon.admin).await["peer_id"]
            .as_str()
            .expect("peer id in /api/node")
            .to_owned();
        Self {
            daemon,
            peer_id,
            p2p,
            region: region.to_owned(),
        }
    }

    pub fn mqtt(&self) -> u16 {
        self.daemon.mqtt
    }

    pub async fn peers(&self) -> Vec<serde_json::Value> {
        let (status, body) = http(self.daemon.admin, "GET", "/api/peers").await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body)
            .expect("peers JSON")
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub async fn connected_to(&self, other: &Node) -> bool {
        self.peers()
            .await
            .iter()
            .any(|p| p["peer_id"] == other.peer_id.as_str() && p["connected"] == true)
    }

    /// The routes of `other` as replicated here (empty if `other` is unknown here).
    pub async fn routes_of(&self, other: &Node) -> Vec<String> {
        let (status, body) = http(
            self.daemon.admin,
            "GET",
            &format!("/api/peers/{}/routes", other.peer_id),
        )
        .await;
        if status == 404 {
            return Vec::new();
        }
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).expect("routes JSON")
    }

    /// The metric `name` with label peer=`other`'s id (0 if absent).
    pub async fn peer_metric(&self, name: &str, other: &Node) -> f64 {
        metric(
            &self.metrics().await,
            &format!(
                "{name}{{peer=\"{}\",region=\"{}\"}}",
                other.peer_id, other.region
            ),
        )
    }

    pub async fn metrics(&self) -> String {
        let (status, body) = http(self.daemon.admin, "GET", "/metrics").await;
        assert_eq!(status, 200, "{body}");
        body
    }

    pub fn log(&self) -> String {
        self.daemon.log_text()
    }

    /// SIGKILL: the node gets no chance to flush or to say goodbye to its peers.
    pub fn kill9(&mut self) {
        self.daemon.kill9();
    }

    /// Start it again after [`Node::kill9`], on the same ports and data directory, and wait
    /// until it accepts MQTT (a multi-threaded runtime: the wait blocks this worker).
    pub async fn restart(&mut self) {
        tokio::task::block_in_place(|| self.daemon.restart());
        self.peer_id = node_info(self.daemon.admin).await["peer_id"]
            .as_str()
            .expect("peer id in /api/node")
            .to_owned();
    }

    /// Whether its process is running (not killed).
    pub fn running(&self) -> bool {
        self.daemon.child.is_some()
    }
}

pub async fn node_info(admin: u16) -> serde_json::Value {
    super::api(admin, "/api/node").await
}

/// The value of `series` on a metrics page, 0 when absent.
pub fn metric(page: &str, series: &str) -> f64 {
    super::Metrics::parse(page).value(series)
}

/// Wait until `cond` holds or fail with `what` and the nodes' logs.
pub async fn wait_for<F, Fut>(what: &str, nodes: &[&Node], cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let logs = || {
        nodes
            .iter()
            .map(|n| format!("--- {}\n{}", n.peer_id, tail(&n.log(), 60)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    poll_until(what, Duration::from_millis(25), logs, cond).await;
}

/// The admin API cannot be waited on, only asked: ask every `every` until `cond` holds, within
/// `MESH_DEADLINE`, else fail with `what` and `context()`.
pub async fn poll_until<F, Fut>(
    what: &str,
    every: Duration,
    context: impl Fn() -> String,
    mut cond: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + MESH_DEADLINE;
    while !cond().await {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            context()
        );
        tokio::time::sleep(every).await;
    }
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub fn cluster_key(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meridian"))
        .arg("keygen")
        .arg("--cluster-key")
        .arg(&path)
        .output()
        .expect("run meridian keygen");
    assert!(out.status.success(), "{out:?}");
    path
}

/// Three regions in a full mesh, each link through its own proxy: b dials a, c dials a and b.
pub struct Three {
    pub a: Node,
    pub b: Node,
    pub c: Node,
    pub _ab: Proxy,
    pub _ac: Proxy,
    pub _bc: Proxy,
    pub _dir: tempfile::TempDir,
}

pub async fn three_regions() -> Three {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let ab = Proxy::start(pa).await.unwrap();
    let ac = Proxy::start(pa).await.unwrap();
    let bc = Proxy::start(pb).await.unwrap();
    let a = Node::start("euc1", pa, &[], &key).await;
    let b = Node::start("ape1", pb, &[ab.port], &key).await;
    let c = Node::start("afs1", pc, &[ac.port, bc.port], &key).await;
    let t = Three {
        a,
        b,
        c,
        _ab: ab,
        _ac: ac,
        _bc: bc,
        _dir: dir,
    };
    for (x, y) in [(&t.a, &t.b), (&t.a, &t.c), (&t.b, &t.c)] {
        wait_for("the mesh to connect", &[x, y], || async {
            x.connected_to(y).await && y.connected_to(x).await
        })
        .await;
    }
    t
}

/// The next PUBLISH `sub` receives that `want` accepts, skipping the others, within the mesh
/// deadline.
pub async fn next_publish(
    sub: &mut v3::Client,
    want: impl Fn(&rumqttc::Publish) -> bool,
) -> rumqttc::Publish {
    tokio::time::timeout(MESH_DEADLINE, async {
        loop {
            match sub.rx.recv().await {
                Some(Packet::Publish(p)) if want(&p) => return p,
                Some(_) => {}
                None => panic!("the subscriber's connection ended"),
            }
        }
    })
    .await
    .expect("the message arrives in time")
}

/// Two regions, c dialling a through a proxy, linked: a, c, the proxy, and the directory that
/// holds their cluster key.
pub async fn two_regions() -> (Node, Node, Proxy, tempfile::TempDir) {
    two_regions_with("").await
}

/// [`two_regions`], with `c_extra` added to c's `[cluster]` section.
pub async fn two_regions_with(c_extra: &str) -> (Node, Node, Proxy, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pc) = (free_port(), free_port());
    let link = Proxy::start(pa).await.unwrap();
    let a = Node::start("euc1", pa, &[], &key).await;
    let c = Node::start_with("afs1", pc, &[link.port], &key, c_extra).await;
    wait_for("the link", &[&a, &c], || async {
        a.connected_to(&c).await && c.connected_to(&a).await
    })
    .await;
    (a, c, link, dir)
}
