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
    let clients: Vec<u64> = rows
        .iter()
        .map(|r| r["clients"].as_u64().unwrap())
        .collect();
    assert_eq!(clients, vec![1, 100, 1, 100, 1000]);
    for row in &rows {
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
