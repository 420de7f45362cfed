//! The status page (`GET /` on the admin listener), loaded by headless Chromium (Debian's
//! `chromium`, which `scripts/test-all` installs) from a deployment of three real daemons: it
//! must draw the mesh and the tables as the JSON API says, with no script error, and show
//! nothing but a token prompt where a token is required.

mod common;

use std::path::{Path, PathBuf};

use common::mesh::*;
use common::{Daemon, http, v3};
use rumqttc::QoS;

/// Debian's Chromium.
fn chromium() -> PathBuf {
    let path = PathBuf::from("/usr/bin/chromium");
    assert!(
        path.exists(),
        "these tests need Chromium (`apt-get install chromium`; scripts/test-all installs it)"
    );
    path
}

/// Load `url` in headless Chromium and return the document once its scripts have run for up to
/// `budget` of virtual time (fetches included); `screenshot` also saves it as a PNG.
async fn load(url: &str, screenshot: Option<&Path>) -> String {
    let profile = tempfile::tempdir().unwrap();
    // Bounded by coreutils' `timeout`: a hung browser is killed, and the test fails.
    let mut cmd = std::process::Command::new("timeout");
    cmd.args(["--kill-after=5", "60"])
        .arg(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
            "--window-size=1280,1100",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()));
    match screenshot {
        Some(path) => cmd.arg(format!("--screenshot={}", path.display())),
        None => cmd.arg("--dump-dom"),
    };
    cmd.arg(url);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .expect("Chromium runs");
    assert!(
        out.status.success(),
        "Chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The number in `data-ready="N"` of the page's body: how many times it drew the API's data.
fn refreshes(dom: &str) -> Option<u32> {
    let at = dom.find("data-ready=\"")? + "data-ready=\"".len();
    dom[at..].split('"').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_draws_the_mesh_as_the_api_says() {
    let t = three_regions().await;
    let mut subs = Vec::new();
    for (i, filter) in ["geo/a/#", "geo/a/+/t", "plain"].iter().enumerate() {
        let mut c = v3::connect(v3::options(&format!("sub-{i}"), t.a.mqtt())).await;
        c.subscribe(filter, QoS::AtLeastOnce).await;
        subs.push(c);
    }
    for other in [&t.b, &t.c] {
        wait_for("the routes to reach every node", &[&t.a, other], || async {
            other.routes_of(&t.a).await.len() == 3
        })
        .await;
    }
    let url = format!("http://127.0.0.1:{}/", t.a.daemon.admin);
    let dom = load(&url, None).await;
    assert!(
        refreshes(&dom).is_some_and(|n| n >= 1),
        "the page never drew the API's data:\n{dom}"
    );
    assert!(
        dom.contains("<ul id=\"errors\"></ul>"),
        "the page reported errors:\n{dom}"
    );
    // Every peer, as /api/peers has it: in the table and on the diagram.
    for peer in t.a.peers().await {
        let (id, region, routes) = (
            peer["peer_id"].as_str().unwrap(),
            peer["region"].as_str().unwrap(),
            peer["routes"].as_u64().unwrap(),
        );
        let row = format!(
            "data-peer=\"{id}\" data-region=\"{region}\" data-connected=\"true\" data-routes=\"{routes}\""
        );
        assert!(dom.contains(&row), "no row {row}:\n{dom}");
        let link = format!("class=\"link\" data-peer=\"{id}\" data-state=\"up\"");
        assert!(dom.contains(&link), "no link {link}:\n{dom}");
        assert!(
            dom.contains(&format!("euc1 → {region}")),
            "no euc1 → {region}"
        );
    }
    assert_eq!(t.a.peers().await.len(), 2);
    // The figures, as /api/stats has them.
    let (_, stats) = http(t.a.daemon.admin, "GET", "/api/stats").await;
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    for (label, field) in [
        ("subscriptions", "subscriptions"),
        ("clients", "connections"),
    ] {
        let card = format!(
            "data-figure=\"{label}\"><div class=\"n\">{}</div>",
            stats[field]
        );
        assert!(dom.contains(&card), "no {card}:\n{dom}");
    }
    // Each card's line over the last minutes: the history holds the sample taken at start and
    // one of the moment at least, oldest first; every gauge's card draws a line through them.
    let (_, history) = http(t.a.daemon.admin, "GET", "/api/history").await;
    let history: serde_json::Value = serde_json::from_str(&history).unwrap();
    assert_eq!(history["interval_ms"], 10_000);
    let samples = history["samples"].as_array().expect("samples");
    assert!(samples.len() >= 2, "{history}");
    assert!(
        samples
            .windows(2)
            .all(|w| w[0]["at_ms"].as_u64() <= w[1]["at_ms"].as_u64())
    );
    assert_eq!(samples.last().unwrap()["figures"]["subscriptions"], 3);
    assert_eq!(dom.matches("<svg class=\"spark\"").count(), 8, "{dom}");
    assert!(dom.matches("<polyline").count() >= 6, "{dom}");
    for i in 0..3 {
        assert!(dom.contains(&format!("data-client=\"sub-{i}\"")));
    }
    for filter in ["geo/a/#", "geo/a/+/t", "plain"] {
        assert!(
            dom.contains(&format!("<tr data-filter=\"{filter}\">")),
            "{filter}"
        );
    }
    // The API the tables page through.
    let (_, page) = http(
        t.a.daemon.admin,
        "GET",
        "/api/subscriptions?offset=1&limit=1&q=geo",
    )
    .await;
    let page: serde_json::Value = serde_json::from_str(&page).unwrap();
    assert_eq!(page.as_array().map(Vec::len), Some(1));
    assert!(page[0]["filter"].as_str().unwrap().starts_with("geo/"));
    // A picture for the docs (docs/operations.md shows one made this way).
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("status.png");
    load(&url, Some(&png)).await;
    let bytes = std::fs::read(&png).expect("a screenshot");
    assert!(bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000);
    if let Ok(keep) = std::env::var("MERIDIAN_STATUS_SCREENSHOT") {
        std::fs::copy(&png, keep).unwrap();
    }
    // A region goes down: its link is drawn down, with why.
    let mut t = t;
    let gone = t.c.peer_id.clone();
    t.c.daemon.kill9();
    wait_for("a to see afs1 gone", &[&t.a], || async {
        !t.a.connected_to(&t.c).await
    })
    .await;
    let dom = load(&url, None).await;
    let link = format!("class=\"link\" data-peer=\"{gone}\" data-state=\"down\"");
    assert!(dom.contains(&link), "no {link}:\n{dom}");
    let row = format!("data-peer=\"{gone}\" data-region=\"afs1\" data-connected=\"false\"");
    assert!(dom.contains(&row), "no {row}:\n{dom}");
    let (_, peers) = http(t.a.daemon.admin, "GET", "/api/peers").await;
    let peers: serde_json::Value = serde_json::from_str(&peers).unwrap();
    let last_error = peers
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["peer_id"] == gone.as_str())
        .and_then(|p| p["last_error"].as_str())
        .expect("a last error for the link that went down")
        .to_owned();
    assert!(dom.contains(&last_error), "the page shows it: {last_error}");
    assert!(dom.contains("<ul id=\"errors\"></ul>"), "{dom}");
    drop(subs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_required_the_page_shows_a_prompt_and_no_data() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin.token");
    std::fs::write(&file, "0123456789abcdef0123456789abcdef\n").unwrap();
    let d = Daemon::start_with_config(Some(&format!(
        "[admin]\ntoken_file = \"{}\"\n",
        file.display()
    )));
    let (status, page) = http(d.admin, "GET", "/").await;
    assert_eq!(status, 200, "the page itself holds no data");
    assert!(page.contains("<title>Meridian</title>"));
    let dom = load(&format!("http://127.0.0.1:{}/", d.admin), None).await;
    assert!(
        dom.contains("data-ready=\"token\""),
        "the page did not ask for the token:\n{dom}"
    );
    assert!(
        dom.contains("<section id=\"login\">"),
        "the prompt is shown"
    );
    assert!(
        dom.contains("<div id=\"content\" hidden=\"\">"),
        "no data shown"
    );
    assert!(dom.contains("<ul id=\"errors\"></ul>"), "{dom}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_draws_edge_leaves_beside_the_regions() {
    let dir = tempfile::tempdir().unwrap();
    let (hub, edge) = common::leaf::hub(dir.path()).await;
    let mut leaf = common::leaf::Leaf::link(edge, "edge-eu", &hub.peer_id).await;
    let deadline = tokio::time::Instant::now() + MESH_DEADLINE;
    loop {
        leaf.run_for(20).await;
        let peers = hub.peers().await;
        if peers
            .iter()
            .any(|p| p["peer_id"] == "edge-eu" && p["connected"] == true && p["leaf"] == true)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leaf never showed: {peers:?}"
        );
    }
    let dom = load(&format!("http://127.0.0.1:{}/", hub.daemon.admin), None).await;
    assert!(dom.contains("<ul id=\"errors\"></ul>"), "{dom}");
    let link = "class=\"link\" data-peer=\"edge-eu\" data-state=\"up\" data-kind=\"leaf\"";
    assert!(dom.contains(link), "no {link}:\n{dom}");
    assert!(
        dom.contains("euc1 → edge-eu (edge leaf): up"),
        "the leaf is named as the operator names it:\n{dom}"
    );
    let row = "data-peer=\"edge-eu\" data-region=\"edge-eu\" data-connected=\"true\"";
    assert!(dom.contains(row), "no {row}:\n{dom}");
    assert!(dom.contains("data-kind=\"leaf\"><td class=\"up\">up</td><td>edge-eu (edge)</td>"));
}
