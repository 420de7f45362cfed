//! Admin HTTP against the real daemon.

mod common;

use common::raw::Raw;
use common::{Daemon, http, http_with, v3};
use meridian_core::codec::{Packet, ProtocolVersion::V5, ReasonCode};
use rumqttc::QoS;

#[tokio::test]
async fn health_metrics_clients_and_kick() {
    let d = Daemon::start();
    let (status, body) = http(d.admin, "GET", "/health").await;
    assert_eq!(status, 200);
    assert!(body.contains("ok"), "{body}");

    let mut sub = v3::connect(v3::options("watcher", d.mqtt)).await;
    sub.subscribe("a/+", QoS::AtLeastOnce).await;
    let mut victim = Raw::connect(d.mqtt, V5, "victim").await;
    sub.client
        .publish("a/b", QoS::AtLeastOnce, true, "x")
        .await
        .unwrap();
    sub.publish_msg().await;

    let metrics = common::Metrics::of(d.admin).await;
    for (series, value) in [
        ("meridian_connections", 2.0),
        ("meridian_subscriptions", 1.0),
        ("meridian_retained_messages", 1.0),
        ("meridian_messages_received_total{qos=\"1\"}", 1.0),
        ("meridian_messages_sent_total{qos=\"1\"}", 1.0),
        (
            "meridian_messages_dropped_total{reason=\"queue_full\"}",
            0.0,
        ),
        ("meridian_queued_messages", 0.0),
        ("meridian_slow_consumer_disconnects_total", 0.0),
    ] {
        assert_eq!(metrics.get(series), Some(value), "{series} in {metrics:?}");
    }
    assert!(
        metrics.value("meridian_bytes_received_total") > 0.0,
        "{metrics:?}"
    );

    let (status, body) = http(d.admin, "GET", "/api/clients").await;
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2);
    let watcher = list.iter().find(|c| c["client_id"] == "watcher").unwrap();
    assert_eq!(watcher["subscriptions"][0]["filter"], "a/+");
    assert_eq!(watcher["subscriptions"][0]["qos"], 1);
    assert_eq!(watcher["protocol"], "3.1.1");
    assert_eq!(watcher["connected"], true);

    let (status, body) = http(d.admin, "GET", "/api/subscriptions").await;
    assert_eq!(status, 200);
    let subs: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        subs,
        serde_json::json!([{"client_id": "watcher", "filter": "a/+", "qos": 1}])
    );

    let (status, _) = http(d.admin, "GET", "/api/clients/victim").await;
    assert_eq!(status, 200);
    let (status, _) = http(d.admin, "DELETE", "/api/clients/victim").await;
    assert_eq!(status, 200);
    match victim.next().await {
        Some(Packet::Disconnect(x)) => assert_eq!(x.reason, ReasonCode::ADMINISTRATIVE_ACTION),
        other => panic!("expected DISCONNECT 0x98, got {other:?}"),
    }
    let (status, _) = http(d.admin, "DELETE", "/api/clients/victim").await;
    assert_eq!(status, 404);
    let (status, _) = http(d.admin, "GET", "/nope").await;
    assert_eq!(status, 404);

    // Pages of the listings, with the total.
    let (status, body) = http(d.admin, "GET", "/api/clients?offset=0&limit=1&q=watch").await;
    assert_eq!(status, 200);
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page.as_array().map(Vec::len), Some(1));
    assert_eq!(page[0]["client_id"], "watcher");

    // Ending a session: the watcher is disconnected, and its session and subscription go.
    let (status, body) = http(d.admin, "DELETE", "/api/sessions/watcher").await;
    assert_eq!(status, 200, "{body}");
    let (_, body) = http(d.admin, "GET", "/api/subscriptions").await;
    assert_eq!(body, "[]");
    let (status, _) = http(d.admin, "DELETE", "/api/sessions/watcher").await;
    assert_eq!(status, 404);
}

/// `storage.cache_bytes` reaches the store: 2 MiB of retained messages overflow a 1 MiB cache,
/// which the evictions counter shows, and fit in the default 16 MiB.
#[tokio::test]
async fn the_store_cache_is_bounded_by_the_config() {
    async fn evictions_after_retaining_2_mib(d: &Daemon) -> u64 {
        let mut c = v3::connect(v3::options("retainer", d.mqtt)).await;
        for i in 0..256 {
            c.client
                .publish(format!("big/{i}"), QoS::AtLeastOnce, true, vec![b'x'; 8192])
                .await
                .unwrap();
        }
        // Each message is stored before it is acknowledged.
        for _ in 0..256 {
            c.expect(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(()))
                .await;
        }
        let metrics = common::Metrics::of(d.admin).await;
        metrics
            .get("meridian_storage_cache_evictions_total")
            .unwrap_or_else(|| panic!("no evictions counter in {metrics:?}")) as u64
    }
    let small =
        Daemon::start_with_config(Some("[storage]\nsync = \"none\"\ncache_bytes = 1048576\n"));
    assert!(evictions_after_retaining_2_mib(&small).await > 0);
    let default = Daemon::start_with_config(Some("[storage]\nsync = \"none\"\n"));
    assert_eq!(evictions_after_retaining_2_mib(&default).await, 0);
}

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn with_token() -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin.token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let d = Daemon::start_with_config(Some(&format!(
        "[admin]\ntoken_file = \"{}\"\n",
        file.display()
    )));
    (d, dir)
}

/// With a token configured, every call but the health check needs it.
#[tokio::test]
async fn calls_without_the_token_are_refused_when_one_is_configured() {
    let (d, _dir) = with_token();
    let bearer = format!("Bearer {TOKEN}");
    let host = ("host", "127.0.0.1");
    let paths = [
        "/api/clients",
        "/metrics",
        "/api/subscriptions",
        "/api/stats",
        "/api/history",
    ];
    for path in paths {
        let (status, _) = http_with(d.admin, "GET", path, &[host]).await;
        assert_eq!(status, 401, "{path} without a token");
        let wrong = format!("Bearer {}", TOKEN.replace('0', "1"));
        let (status, _) = http_with(d.admin, "GET", path, &[host, ("authorization", &wrong)]).await;
        assert_eq!(status, 401, "{path} with a wrong token");
        let (status, _) =
            http_with(d.admin, "GET", path, &[host, ("authorization", &bearer)]).await;
        assert_eq!(status, 200, "{path} with the token");
    }
    let (status, _) = http_with(d.admin, "DELETE", "/api/clients/x", &[host]).await;
    assert_eq!(status, 401, "no kick without the token");
    let (status, _) = http_with(d.admin, "GET", "/health", &[host]).await;
    assert_eq!(status, 200, "the health check is open");
    let (_, metrics) = http_with(
        d.admin,
        "GET",
        "/metrics",
        &[host, ("authorization", &bearer)],
    )
    .await;
    assert_eq!(
        common::Metrics::parse(&metrics).get(r#"meridian_admin_refused_total{reason="token"}"#),
        // Each path twice (no token, a wrong one), and the kick.
        Some((paths.len() * 2 + 1) as f64),
        "{metrics}"
    );
}

/// A web page whose name points at 127.0.0.1 (DNS rebinding) sends its own name as Host.
#[tokio::test]
async fn requests_for_another_host_are_refused_on_loopback() {
    let d = Daemon::start();
    for host in ["evil.example:8081", "10.0.0.1"] {
        let (status, _) = http_with(d.admin, "GET", "/api/clients", &[("host", host)]).await;
        assert_eq!(status, 421, "{host}");
    }
    let (status, _) = http_with(d.admin, "GET", "/api/clients", &[]).await;
    assert_eq!(status, 421, "no Host at all");
    for host in ["localhost:8081", "127.0.0.1", "[::1]:8081"] {
        let (status, _) = http_with(d.admin, "GET", "/api/clients", &[("host", host)]).await;
        assert_eq!(status, 200, "{host}");
    }
    let (_, metrics) = http(d.admin, "GET", "/metrics").await;
    assert_eq!(
        common::Metrics::parse(&metrics).get(r#"meridian_admin_refused_total{reason="host"}"#),
        Some(3.0),
        "{metrics}"
    );
}

/// A raw request with a body: the status code.
async fn post(port: u16, path: &str, headers: &[(&str, &str)], body: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("admin connect");
    let mut req = format!("POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n");
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str(&format!(
        "connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    s.write_all(req.as_bytes()).await.expect("write request");
    let mut resp = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(30), s.read_to_end(&mut resp))
        .await
        .expect("an answer in time")
        .expect("read response");
    let text = String::from_utf8_lossy(&resp);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status code")
}

/// A web page of another site can make a browser POST to the loopback API, which asks for no
/// token there, without asking first, as long as the body is a "simple" type (text/plain,
/// a form); it cannot send JSON or hide its Origin.
#[tokio::test]
async fn a_web_page_of_another_site_cannot_edit_the_policy() {
    let d = Daemon::start();
    let deny_all = r#"{"edits":[{"edit":"acl_default","permission":"deny"}]}"#;
    let own = format!("http://127.0.0.1:{}", d.admin);
    let forged = [
        // What a form or fetch(..., {mode: "no-cors"}) sends.
        vec![
            ("content-type", "text/plain"),
            ("origin", "http://evil.example"),
        ],
        vec![("content-type", "application/x-www-form-urlencoded")],
        vec![("content-type", "text/plain;charset=UTF-8")],
        vec![],
        // JSON from another site (a browser asks first, and gets no CORS answer; a page of a
        // sandboxed frame sends "null").
        vec![
            ("content-type", "application/json"),
            ("origin", "http://evil.example"),
        ],
        vec![("content-type", "application/json"), ("origin", "null")],
        vec![
            ("content-type", "application/json"),
            ("origin", "https://127.0.0.1:1"),
        ],
    ];
    let mut statuses = Vec::new();
    for headers in &forged {
        statuses.push(post(d.admin, "/api/policy", headers, deny_all).await);
    }
    assert_eq!(statuses, [403, 415, 415, 415, 403, 403, 403]);
    let (_, policy) = http(d.admin, "GET", "/api/policy").await;
    assert!(policy.contains(r#""acl_default":"allow""#), "{policy}");
    let (_, metrics) = http(d.admin, "GET", "/metrics").await;
    let m = common::Metrics::parse(&metrics);
    assert_eq!(
        m.get(r#"meridian_admin_refused_total{reason="origin"}"#),
        Some(4.0)
    );
    assert_eq!(
        m.get(r#"meridian_admin_refused_total{reason="content_type"}"#),
        Some(3.0)
    );
    // Its own pages, and clients that send no Origin (ctl, curl), with JSON, still can.
    let json = ("content-type", "application/json");
    let headers = [json, ("origin", own.as_str())];
    assert_eq!(post(d.admin, "/api/policy", &headers, deny_all).await, 200);
    let allow = deny_all.replace("deny", "allow");
    assert_eq!(post(d.admin, "/api/policy", &[json], &allow).await, 200);
}

/// A client that opens a connection and sends its headers slowly, or never, is cut off.
#[tokio::test]
async fn a_client_that_does_not_finish_its_headers_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let d = Daemon::start_with_config(Some("[admin]\nheader_timeout_ms = 300\n"));
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", d.admin))
        .await
        .unwrap();
    s.write_all(b"GET /api/clients HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        .await
        .unwrap();
    // The daemon closes the connection (a read ends, cleanly or with a reset).
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(common::DEADLINE, s.read_to_end(&mut rest))
        .await
        .expect("the daemon closes the connection");
    let (_, metrics) = http(d.admin, "GET", "/metrics").await;
    assert_eq!(
        common::Metrics::parse(&metrics)
            .get(r#"meridian_admin_refused_total{reason="header_timeout"}"#),
        Some(1.0),
        "{metrics}"
    );
}

/// With `admin.cert` and `admin.key` the API speaks HTTPS only (required off loopback), and
/// `meridian ctl --admin-ca` checks the node's certificate.
#[tokio::test]
async fn with_a_certificate_the_admin_api_speaks_https_only() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let cert =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let path = |n: &str| dir.path().join(n);
    std::fs::write(path("cert.pem"), cert.cert.pem()).unwrap();
    std::fs::write(path("key.pem"), cert.signing_key.serialize_pem()).unwrap();
    std::fs::write(path("other.pem"), other.cert.pem()).unwrap();
    let config = format!(
        "[admin]\ncert = \"{}\"\nkey = \"{}\"\n",
        path("cert.pem").display(),
        path("key.pem").display()
    );
    let d = Daemon::start_with_config(Some(&config));
    // Plain HTTP gets no HTTP answer.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", d.admin))
        .await
        .unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        s.read_to_end(&mut answer),
    )
    .await;
    assert!(!answer.starts_with(b"HTTP/"), "{answer:?}");
    let ctl = |ca: Option<&std::path::Path>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_meridian"));
        cmd.args(["ctl", "--admin", &format!("127.0.0.1:{}", d.admin)]);
        if let Some(ca) = ca {
            cmd.arg("--admin-ca").arg(ca);
        }
        cmd.args(["user", "list"]).output().unwrap()
    };
    let out = ctl(Some(&path("cert.pem")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Another certificate for the same name, or none at all: refused.
    let out = ctl(Some(&path("other.pem")));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("TLS"));
    assert!(!ctl(None).status.success());
}
