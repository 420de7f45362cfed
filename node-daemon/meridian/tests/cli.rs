//! The command line contract.

use std::process::Command;

fn meridian() -> Command {
    Command::new(env!("CARGO_BIN_EXE_meridian"))
}

#[test]
fn print_default_config_prints_the_embedded_file() {
    let out = meridian()
        .args(["run", "--print-default-config"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, meridian_daemon::DEFAULT_CONFIG);
    assert!(text.contains("bind = \"127.0.0.1:1883\""));
}

#[test]
fn bad_config_is_refused_naming_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[storage]\nsync = \"always\"\nfsync = true\n").unwrap();
    let out = meridian()
        .arg("run")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("fsync"), "{err}");
}

/// Off loopback, the admin API needs a token: no token, no start.
#[test]
fn an_admin_api_off_loopback_without_a_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = meridian()
        .args(["run", "--mqtt", "127.0.0.1:0", "--ws", "127.0.0.1:0"])
        .args(["--admin", "0.0.0.0:0"])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("admin.token_file"), "{err}");
}

/// Off loopback, the admin API needs TLS: tokens would cross the network in the clear.
#[test]
fn an_admin_api_off_loopback_without_tls_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("admin.token");
    std::fs::write(&tokens, "0123456789abcdef0123456789abcdef\n").unwrap();
    let out = meridian()
        .args(["run", "--mqtt", "127.0.0.1:0", "--ws", "127.0.0.1:0"])
        .args(["--admin", "0.0.0.0:0"])
        .arg("--admin-token-file")
        .arg(&tokens)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("admin.cert"), "{err}");
}

#[test]
fn non_loopback_listener_without_auth_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = meridian()
        .args([
            "run",
            "--mqtt",
            "0.0.0.0:0",
            "--admin",
            "127.0.0.1:0",
            "--ws",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("auth.password_file"), "{err}");
}

#[test]
fn sim_geo_writeup_prints_one_json_row_per_scenario() {
    let out = meridian()
        .args(["sim", "--scenario", "geo-writeup", "--seed", "3", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is a JSON object"))
        .collect();
    let writeup: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["row"] == "connect-subscribe")
        .collect();
    let clients: Vec<u64> = writeup
        .iter()
        .map(|r| r["clients"].as_u64().unwrap())
        .collect();
    assert_eq!(clients, vec![1, 100, 1, 100, 1000]);
    // The partition row: QoS 1 through a 60 s partition, nothing lost or duplicated.
    let partition = rows
        .iter()
        .find(|r| r["scenario"] == "partition-60s" && r["row"] == "delivery")
        .expect("partition row");
    assert_eq!(partition["qos"], 1);
    assert_eq!(partition["lost"], 0, "{partition}");
    assert_eq!(partition["duplicated"], 0, "{partition}");
    assert_eq!(partition["delivered"], partition["expected"]);
    assert!(
        rows.iter()
            .any(|r| r["scenario"] == "cross-region-latency" && r["row"] == "latency")
    );
    let fence_lost = |name: &str| {
        rows.iter()
            .find(|r| r["scenario"] == name && r["row"] == "delivery")
            .map(|r| r["lost"].as_u64().unwrap())
            .unwrap()
    };
    assert_eq!(fence_lost("fence-on"), 0);
    assert!(fence_lost("fence-off") > 0);
    for row in &writeup {
        let subacks = row["all_subacks_ms"].as_u64().unwrap();
        let routes = row["routes_converged_ms"].as_u64().unwrap();
        // Every SUBACK is local: it comes before any other region could have learned the route.
        assert!(subacks < routes, "{row}");
        assert!(
            row["emqx_seconds"]
                .as_object()
                .is_some_and(|m| !m.is_empty())
        );
    }
    let again = meridian()
        .args(["sim", "--seed", "3", "--json"])
        .output()
        .unwrap();
    let first = meridian()
        .args(["sim", "--seed", "3", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        again.stdout, first.stdout,
        "the same seed gives the same run"
    );
}

#[test]
fn sim_unknown_scenario_is_refused() {
    let out = meridian()
        .args(["sim", "--scenario", "nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown scenario"));
}

fn example_topology() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/topologies/three-regions.toml")
}

#[test]
fn sim_runs_a_topology_file_and_draws_its_timeline_and_a_page() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("timeline.svg");
    let html = dir.path().join("run.html");
    let out = meridian()
        .arg("sim")
        .arg(example_topology())
        .arg("--svg")
        .arg(&svg)
        .arg("--html")
        .arg(&html)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.starts_with("three-regions (seed 1)"), "{table}");
    assert!(table.contains("all_subacks_ms"), "{table}");
    assert!(table.contains("duplicated"), "{table}");
    let drawing = std::fs::read_to_string(&svg).unwrap();
    assert!(drawing.starts_with("<svg") && drawing.trim_end().ends_with("</svg>"));
    assert!(drawing.contains("link cpt-fra down") || drawing.contains("link fra-cpt down"));

    // The same run as one standalone page.
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!doctype html>") && page.trim_end().ends_with("</html>"));
    for region in ["eu-central", "ap-east", "af-south"] {
        assert!(
            page.contains(&format!("class=\"region\" data-region=\"{region}\"")),
            "{region} is drawn"
        );
    }
    assert!(page.contains("ms</text>"), "round trips on the links");
    assert!(page.contains("link cpt-fra down") || page.contains("link fra-cpt down"));
    assert!(page.contains("all_subacks_ms"), "the report's table");
    assert!(
        !page.contains("src=\"http") && !page.contains("href=\"http"),
        "nothing fetched from elsewhere"
    );
    assert!(page.contains("fra"), "nodes beside their region");

    let json = meridian()
        .arg("sim")
        .arg(example_topology())
        .args(["--json", "--seed", "9"])
        .output()
        .unwrap();
    assert!(json.status.success());
    let rows: Vec<serde_json::Value> = String::from_utf8(json.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is a JSON object"))
        .collect();
    let subscribe = rows.iter().find(|r| r["row"] == "subscribe").unwrap();
    assert_eq!(subscribe["subscribers"], 30);
    assert_eq!(subscribe["missing_subacks"], 0);
    let delivery = rows.iter().find(|r| r["row"] == "delivery").unwrap();
    assert_eq!(delivery["seed"], 9);
    assert_eq!(delivery["lost"], 0, "{delivery}");
    assert_eq!(delivery["duplicated"], 0, "{delivery}");
    assert_eq!(delivery["published"], 1_000);
    assert_eq!(
        delivery["expected"], 30_000,
        "every subscriber wants every message"
    );
    assert!(rows.iter().filter(|r| r["row"] == "latency").count() >= 6);
}

#[test]
fn sim_refuses_a_bad_topology_naming_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(example_topology()).unwrap();
    let cases = [
        // An unknown node: the simulator's check, mapped to the key's line.
        (
            text.replace(
                "name = \"pub-hkg\"\nnode = \"hkg\"",
                "name = \"pub-hkg\"\nnode = \"sgp\"",
            ),
            "clients[3].node",
            "node = \"sgp\"",
        ),
        // A syntax-level error: an unknown key.
        (
            text.replace("payload_bytes = 256", "payload_bytes = 256\nburst = 3"),
            "burst",
            "burst = 3",
        ),
    ];
    for (i, (bad, key, line_text)) in cases.iter().enumerate() {
        assert_ne!(bad, &text, "case {i} changed nothing");
        let path = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, bad).unwrap();
        let out = meridian().arg("sim").arg(&path).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8(out.stderr).unwrap();
        let line = bad.lines().position(|l| l == *line_text).unwrap() + 1;
        assert!(err.contains(key), "{err}");
        assert!(
            err.contains(&format!("line {line}:")),
            "want line {line}: {err}"
        );
    }
}
