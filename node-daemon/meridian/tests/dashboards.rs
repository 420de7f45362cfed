//! The Grafana dashboard and the Prometheus alerting rules in `deploy/` ask only for series a
//! node serves: every metric they name is on the metrics page of a node of a two-node mesh
//! (the per-peer series included).

mod common;

use std::collections::BTreeSet;

use common::free_port;
use common::mesh::{Node, cluster_key, wait_for};

fn repo_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `meridian_…` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("meridian_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// The dashboard's queries and the rules' expressions.
fn queries() -> Vec<String> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&repo_file("deploy/grafana/meridian.json"))
            .expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "a dashboard of {} panels", panels.len());
    let mut exprs = Vec::new();
    for panel in panels {
        let targets = panel["targets"].as_array().expect("each panel has targets");
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for t in targets {
            exprs.push(
                t["expr"]
                    .as_str()
                    .expect("each target has an expr")
                    .to_owned(),
            );
        }
    }
    let rules = repo_file("deploy/prometheus/meridian-alerts.yml");
    let alerts = rules
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert: "))
        .count();
    let rule_exprs: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("expr: "))
        .map(str::to_owned)
        .collect();
    assert_eq!(alerts, rule_exprs.len(), "each alert has one expr");
    assert!(alerts >= 5);
    exprs.extend(rule_exprs);
    exprs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_alerts_name_only_series_a_node_serves() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pb) = (free_port(), free_port());
    let a = Node::start_with("euc1", pa, &[], &key, "").await;
    let b = Node::start_with("afs1", pb, &[pa], &key, "").await;
    wait_for("the mesh to connect", &[&a, &b], || async {
        a.connected_to(&b).await && b.connected_to(&a).await
    })
    .await;
    // A peer's round trip is on the page once a ping has come back.
    wait_for("a ping round trip to b", &[&a, &b], || async {
        a.metrics().await.contains("meridian_peer_rtt_seconds")
    })
    .await;
    let page = a.metrics().await;
    // Families as the page declares them (a counter's samples end in _total).
    let mut served = BTreeSet::new();
    for line in page.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let mut parts = decl.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            served.insert(name.to_owned());
            if kind == "counter" {
                served.insert(format!("{name}_total"));
            }
        }
    }
    assert!(served.contains("meridian_peer_connected"), "{page}");
    let asked: BTreeSet<String> = queries().iter().flat_map(|q| metric_names(q)).collect();
    let unknown: Vec<&String> = asked.iter().filter(|n| !served.contains(*n)).collect();
    assert!(unknown.is_empty(), "not on the metrics page: {unknown:?}");
    assert!(asked.len() >= 20, "{asked:?}");
}
