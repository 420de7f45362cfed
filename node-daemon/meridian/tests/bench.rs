//! `meridian bench` (the real binary) against a real daemon on loopback: every scenario, small
//! bounded counts, the reported counts checked.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::{Daemon, cheap_hash};
use serde_json::Value;

fn bench(d: &Daemon, args: &[&str]) -> Value {
    bench_on(d, d.mqtt, args)
}

/// `meridian bench ARGS` against `port` of the daemon, which it measures.
fn bench_on(d: &Daemon, port: u16, args: &[&str]) -> Value {
    let pid = d.child.as_ref().expect("daemon running").id().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .arg("bench")
        .args(args)
        .args(["--port", &port.to_string()])
        .args(["--broker-pid", &pid, "--json", "--quiet", "--timeout", "20"])
        .args(["--threads", "2"])
        .output()
        .expect("run meridian bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "meridian bench {args:?} failed: {}\n{stdout}\ndaemon log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log_text()
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

fn u(v: &Value, path: &[&str]) -> u64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("{path:?} missing in {v}"))
}

/// Every message delivered exactly once to every subscriber it was for.
fn assert_exact(r: &Value, sent: u64, expected: u64, qos1: bool) {
    let m = &r["messages"];
    assert_eq!(u(m, &["sent"]), sent, "{r}");
    if qos1 {
        assert_eq!(u(m, &["acked"]), sent, "{r}");
    }
    assert_eq!(u(m, &["expected"]), expected, "{r}");
    assert_eq!(u(m, &["received"]), expected, "{r}");
    assert_eq!(u(m, &["lost"]), 0, "{r}");
    assert_eq!(u(m, &["duplicates"]), 0, "{r}");
    assert_eq!(u(m, &["foreign"]), 0, "{r}");
    if expected > 0 {
        assert!(m["latency"]["p99_us"].as_f64().unwrap() > 0.0, "{r}");
        assert!(m["received_per_sec"].as_f64().unwrap() > 0.0, "{r}");
    }
    let cpu = r["broker"]["cpu_secs"].as_f64().unwrap();
    let in_kernel = r["broker"]["cpu_system_secs"].as_f64().unwrap();
    assert!(cpu >= 0.0 && (0.0..=cpu).contains(&in_kernel), "{r}");
    assert!(r["errors"].as_array().unwrap().is_empty(), "{r}");
}

#[test]
fn presets_deliver_every_message_once() {
    let d = Daemon::start();
    let r = bench(&d, &["pairs", "-c", "2", "-n", "300", "-q", "1"]);
    assert_eq!(u(&r, &["clients"]), 4);
    assert_exact(&r, 600, 600, true);

    let r = bench(&d, &["pairs", "-n", "300", "-q", "0", "--rate", "2000"]);
    assert_exact(&r, 300, 300, false);

    let r = bench(&d, &["fan-in", "-c", "4", "-n", "100", "-q", "1"]);
    assert_eq!(u(&r, &["publishers"]), 4);
    assert_eq!(u(&r, &["subscribers"]), 1);
    assert_exact(&r, 400, 400, true);

    let r = bench(
        &d,
        &["fan-out", "-c", "4", "-n", "100", "-q", "1", "-s", "64"],
    );
    assert_eq!(u(&r, &["publishers"]), 1);
    assert_eq!(u(&r, &["subscribers"]), 4);
    assert_exact(&r, 100, 400, true);

    let r = bench(&d, &["mesh", "-c", "3", "-n", "50", "-q", "1"]);
    assert_exact(&r, 150, 450, true);

    let r = bench(
        &d,
        &["pub", "-c", "2", "-n", "100", "-q", "1", "-t", "x/%i"],
    );
    assert_exact(&r, 200, 0, true);
}

/// The daemon's gauge of retained messages, from its metrics.
fn retained_messages(d: &Daemon) -> u64 {
    let mut s = TcpStream::connect(("127.0.0.1", d.admin)).expect("admin port");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    common::Metrics::parse(&text)
        .get("meridian_retained_messages")
        .unwrap_or_else(|| panic!("no retained-messages gauge in:\n{text}")) as u64
}

#[test]
fn retained_publishes_leave_one_message_per_topic() {
    let d = Daemon::start();
    let r = bench(
        &d,
        &[
            "pub", "-c", "3", "-n", "2", "-q", "1", "--retain", "-t", "kept/%i",
        ],
    );
    assert_eq!(r["retain"], true, "{r}");
    assert_exact(&r, 6, 0, true);
    // Every PUBLISH was acknowledged, so stored: the broker answers the metrics after that.
    assert_eq!(retained_messages(&d), 3, "one retained message per topic");

    // Without the flag, nothing more is kept.
    let r = bench(
        &d,
        &["pub", "-c", "2", "-n", "2", "-q", "1", "-t", "gone/%i"],
    );
    assert_eq!(r["retain"], false, "{r}");
    assert_exact(&r, 4, 0, true);
    assert_eq!(retained_messages(&d), 3);
}

#[test]
fn conn_and_sub_report_every_client() {
    let d = Daemon::start();
    let r = bench(&d, &["conn", "-c", "30", "--concurrency", "8"]);
    assert_eq!(u(&r, &["connects", "ok"]), 30);
    assert_eq!(u(&r, &["connects", "failed"]), 0);
    assert!(r["connects"]["connack"]["p99_us"].as_f64().unwrap() > 0.0);
    assert!(r["connects"]["suback"].is_null());

    let r = bench(
        &d,
        &["sub", "-c", "30", "-t", "t/mqttx/+/%i/sub/+/#", "-q", "1"],
    );
    assert_eq!(u(&r, &["connects", "ok"]), 30);
    assert!(r["connects"]["suback"]["p50_us"].as_f64().unwrap() > 0.0);
    assert!(r["broker"]["rss_per_connection_bytes"].is_number());

    // A filter the broker refuses is a failed client, named in the errors.
    let r = bench(&d, &["sub", "-c", "2", "-t", "bad/#/%i"]);
    assert_eq!(u(&r, &["connects", "ok"]), 0);
    assert_eq!(u(&r, &["connects", "failed"]), 2);
    assert!(!r["errors"].as_array().unwrap().is_empty());
}

#[test]
fn websocket_and_text_report() {
    let d = Daemon::start();
    let url = format!("ws://127.0.0.1:{}/mqtt", d.ws);
    let r = bench(&d, &["pairs", "-n", "200", "-q", "1", "--ws", &url]);
    assert_eq!(r["target"], url.as_str());
    assert_exact(&r, 200, 200, true);

    let out = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(["bench", "fan-out", "-c", "2", "-n", "50", "--quiet"])
        .args(["--port", &d.mqtt.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("received        100 of 100"), "{text}");
    assert!(text.contains("lost            0   duplicates 0"), "{text}");
}

#[test]
fn tls_and_credentials_reach_a_broker_that_requires_them() {
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    let passwd = dir.path().join("passwd");
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    std::fs::write(&passwd, format!("alice:{}\n", cheap_hash("looking-glass"))).unwrap();
    let tls = common::free_port();
    let d = Daemon::start_with_config(Some(&format!(
        r#"
[listeners.tls]
enabled = true
bind = "127.0.0.1:{tls}"
cert = "{}"
key = "{}"

[auth]
password_file = "{}"
allow_anonymous = false
"#,
        cert.display(),
        key.display(),
        passwd.display()
    )));
    let ca = cert.to_str().unwrap();
    let trusted = ["--tls", "--ca", ca];

    let r = bench_on(
        &d,
        tls,
        &[
            &["pairs", "-n", "200", "-q", "1"],
            trusted.as_slice(),
            &["--username", "alice", "--password", "looking-glass"],
        ]
        .concat(),
    );
    assert_eq!(r["target"], format!("mqtts://127.0.0.1:{tls}").as_str());
    assert_exact(&r, 200, 200, true);

    // Refusals are named: a wrong password, no password, a certificate not trusted.
    let wrong = [
        trusted.as_slice(),
        &["--username", "alice", "--password", "nope"],
    ]
    .concat();
    for (args, expected) in [
        (wrong.as_slice(), "BadUserNamePassword"),
        (trusted.as_slice(), "NotAuthorized"),
        (&["--tls"], "certificate"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_meridian"))
            .args(["bench", "pairs", "-n", "10", "--quiet", "--timeout", "10"])
            .args(["--port", &tls.to_string()])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

#[test]
fn unreachable_broker_fails_with_a_message() {
    let port = common::free_port().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(["bench", "pairs", "-n", "10", "--quiet", "--timeout", "5"])
        .args(["--port", &port])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("could not connect"), "{err}");
}
