//! Password authentication and ACL denials against the real daemon.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use bytes::Bytes;
use common::raw::{Raw, connect_packet};
use common::{Daemon, cheap_hash};
use meridian_core::codec::{
    Packet, ProtocolVersion, ProtocolVersion::V5, ProtocolVersion::V311, Publish,
    PublishProperties, QoS, ReasonCode, Subscribe, SubscribeFilter, SubscribeProperties,
    SubscriptionOptions,
};

fn passwd(file: &std::path::Path, user: &str, password: &str) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .arg("passwd")
        .arg(file)
        .arg(user)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    assert!(child.wait().unwrap().success());
}

struct Setup {
    daemon: Daemon,
    _dir: tempfile::TempDir,
}

fn start() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    std::fs::write(
        &file,
        format!(
            "# test users\nalice:{}\nbob:{}\n",
            cheap_hash("looking-glass"),
            cheap_hash("builder")
        ),
    )
    .unwrap();
    Setup {
        daemon: Daemon::start_with_config(Some(&config_text(&file, ""))),
        _dir: dir,
    }
}

/// The configuration of [`start`], with the ACL rules `first` before its own.
fn config_text(password_file: &std::path::Path, first: &str) -> String {
    format!(
        r#"
[auth]
password_file = "{}"
allow_anonymous = false

[acl]
default = "deny"
{first}
[[acl.rules]]
permission = "deny"
action = "subscribe"
topic = "secret/#"

[[acl.rules]]
permission = "allow"
action = "all"
topic = "users/%u/#"

[[acl.rules]]
permission = "allow"
action = "all"
topic = "public/#"
"#,
        password_file.display()
    )
}

async fn login(
    port: u16,
    v: ProtocolVersion,
    id: &str,
    user: Option<&str>,
    pw: Option<&str>,
) -> (Raw, ReasonCode) {
    let mut c = connect_packet(v, id);
    c.username = user.map(str::to_owned);
    c.password = pw.map(|p| Bytes::copy_from_slice(p.as_bytes()));
    let (raw, ack) = Raw::connect_with(port, c).await;
    (raw, ack.reason)
}

fn subscribe(filter: &str, id: u16) -> Packet {
    Packet::Subscribe(Subscribe {
        packet_id: id,
        filters: vec![SubscribeFilter {
            filter: filter.to_owned(),
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                ..Default::default()
            },
        }],
        properties: SubscribeProperties::default(),
    })
}

fn publish(topic: &str, id: u16) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: topic.into(),
        packet_id: Some(id),
        payload: Bytes::from_static(b"p"),
        properties: PublishProperties::default(),
    })
}

#[tokio::test]
async fn logins_are_checked() {
    let s = start();
    let port = s.daemon.mqtt;
    let (_, r) = login(port, V5, "anon", None, None).await;
    assert_eq!(r, ReasonCode::NOT_AUTHORIZED);
    let (_, r) = login(port, V5, "a1", Some("alice"), Some("wonderland")).await;
    assert_eq!(
        r,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD,
        "old password replaced"
    );
    let (_, r) = login(port, V5, "a2", Some("nobody"), Some("x")).await;
    assert_eq!(r, ReasonCode::BAD_USER_NAME_OR_PASSWORD);
    let (_, r) = login(port, V311, "a3", Some("alice"), Some("nope")).await;
    assert!(r.is_error(), "3.1.1 refused: {r:?}");
    let (_, r) = login(port, V5, "a4", Some("alice"), Some("looking-glass")).await;
    assert!(!r.is_error(), "{r:?}");
    let (_, r) = login(port, V311, "a5", Some("bob"), Some("builder")).await;
    assert!(!r.is_error(), "{r:?}");
}

#[tokio::test]
async fn subscriptions_wholly_in_denied_topics_get_0x87_on_v5_and_0x80_on_v311() {
    let s = start();
    let port = s.daemon.mqtt;
    let (mut c5, _) = login(port, V5, "s5", Some("alice"), Some("looking-glass")).await;
    for (i, (filter, ok)) in [
        ("secret/x", false),
        ("secret/#", false),
        ("ops/#", false),
        // Reaches allowed and denied topics: accepted, and filtered as messages come.
        ("#", true),
        ("users/+/#", true),
        ("users/bob/#", false),
        ("users/alice/#", true),
        ("public/+", true),
    ]
    .into_iter()
    .enumerate()
    {
        c5.send(&subscribe(filter, i as u16 + 1)).await;
        match c5.next().await {
            Some(Packet::SubAck(a)) => {
                let expect = if ok {
                    ReasonCode(1)
                } else {
                    ReasonCode::NOT_AUTHORIZED
                };
                assert_eq!(a.reasons, vec![expect], "{filter}");
            }
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }
    let (mut c3, _) = login(port, V311, "s3", Some("bob"), Some("builder")).await;
    c3.send(&subscribe("secret/#", 1)).await;
    match c3.next().await {
        Some(Packet::SubAck(a)) => assert_eq!(a.reasons, vec![ReasonCode(0x80)]),
        other => panic!("expected SUBACK, got {other:?}"),
    }
}

#[tokio::test]
async fn denied_publishes_get_0x87_on_v5_and_are_dropped_on_v311() {
    let s = start();
    let port = s.daemon.mqtt;
    let (mut bob, _) = login(port, V311, "bob", Some("bob"), Some("builder")).await;
    bob.send(&subscribe("users/bob/#", 1)).await;
    assert!(matches!(bob.next().await, Some(Packet::SubAck(_))));
    bob.send(&subscribe("public/#", 2)).await;
    assert!(matches!(bob.next().await, Some(Packet::SubAck(_))));

    let (mut a5, _) = login(port, V5, "alice5", Some("alice"), Some("looking-glass")).await;
    a5.send(&publish("users/bob/x", 1)).await;
    match a5.next().await {
        Some(Packet::PubAck(a)) => assert_eq!(a.reason, ReasonCode::NOT_AUTHORIZED),
        other => panic!("expected PUBACK 0x87, got {other:?}"),
    }

    let (mut a3, _) = login(port, V311, "alice3", Some("alice"), Some("looking-glass")).await;
    a3.send(&publish("users/bob/y", 1)).await;
    assert!(
        matches!(a3.next().await, Some(Packet::PubAck(_))),
        "3.1.1 acknowledges and drops"
    );
    a3.send(&publish("public/ok", 2)).await;
    assert!(matches!(a3.next().await, Some(Packet::PubAck(_))));
    match bob.next().await {
        Some(Packet::Publish(p)) => {
            assert_eq!(&*p.topic, "public/ok", "denied messages never arrive")
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

#[test]
fn passwd_command_creates_and_updates_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    std::fs::write(&file, format!("# keep me\nbob:{}\n", cheap_hash("b"))).unwrap();
    passwd(&file, "alice", "one");
    passwd(&file, "alice", "two");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("# keep me\nbob:$argon2id$"), "{text}");
    let db = meridian_daemon::passwd::parse(&text).unwrap();
    assert_eq!(db.len(), 2);
    assert!(meridian_daemon::passwd::verify(
        b"two",
        &db["alice"],
        &Default::default()
    ));
}

#[test]
fn non_loopback_listener_with_password_file_starts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    std::fs::write(&file, format!("u:{}\n", cheap_hash("p"))).unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, format!("[auth]\npassword_file = \"{}\"\n[listeners.ws]\nenabled = false\n[admin]\nenabled = false\n", file.display())).unwrap();
    // 0.0.0.0 is not loopback: allowed only because a password file is set. Checked by
    // --print-default-config's sibling: start and stop at once with an invalid data dir would
    // hide errors, so start for real on a free port and kill it once it listens.
    let port = common::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(["run", "--config"])
        .arg(&cfg)
        .args(["--mqtt", &format!("0.0.0.0:{port}")])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + common::DEADLINE;
    let mut up = false;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("daemon exited: {status:?}");
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            up = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(up, "daemon listening on 0.0.0.0 with a password file");
}

/// [`config_text`], reading users and rules from the files (`policy.source = "files"`).
fn files_config_text(password_file: &std::path::Path, first: &str) -> String {
    format!(
        "{}\n[policy]\nsource = \"files\"\n",
        config_text(password_file, first)
    )
}

#[tokio::test]
async fn sighup_reloads_the_password_file_and_acl_rules() {
    let mut s = start();
    let file = s._dir.path().join("passwd");
    let config = s.daemon.config.clone().expect("a config file");
    std::fs::write(&config, files_config_text(&file, "")).unwrap();
    s.daemon.terminate();
    s.daemon.restart();
    let port = s.daemon.mqtt;
    let (mut alice, r) = login(port, V5, "alice", Some("alice"), Some("looking-glass")).await;
    assert!(!r.is_error(), "{r:?}");
    let (_, r) = login(port, V5, "carol0", Some("carol"), Some("oak")).await;
    assert_eq!(r, ReasonCode::BAD_USER_NAME_OR_PASSWORD);

    // carol in, bob out, and no more publishing under public/.
    std::fs::write(
        &file,
        format!(
            "alice:{}\ncarol:{}\n",
            cheap_hash("looking-glass"),
            cheap_hash("oak")
        ),
    )
    .unwrap();
    let config = &config;
    let deny_public =
        "[[acl.rules]]\npermission = \"deny\"\naction = \"publish\"\ntopic = \"public/#\"\n";
    std::fs::write(config, files_config_text(&file, deny_public)).unwrap();
    s.daemon.hangup();
    let reloads = reloads_reach(&s.daemon, 1, 0).await;
    assert_eq!(reloads["last_error"], serde_json::Value::Null, "{reloads}");
    assert!(s.daemon.log_text().contains("users=2"));

    let (_, r) = login(port, V5, "carol1", Some("carol"), Some("oak")).await;
    assert!(!r.is_error(), "{r:?}");
    let (_, r) = login(port, V311, "bob", Some("bob"), Some("builder")).await;
    assert!(r.is_error(), "bob is gone: {r:?}");
    // alice stays connected, under the new rules.
    alice.send(&publish("public/x", 1)).await;
    match alice.next().await {
        Some(Packet::PubAck(a)) => assert_eq!(a.reason, ReasonCode::NOT_AUTHORIZED),
        other => panic!("expected PUBACK 0x87, got {other:?}"),
    }
    alice.send(&publish("users/alice/x", 2)).await;
    match alice.next().await {
        Some(Packet::PubAck(a)) => assert_eq!(a.reason, ReasonCode::SUCCESS),
        other => panic!("expected PUBACK, got {other:?}"),
    }

    // A configuration that does not parse, or a password file that does not, changes
    // nothing, and the log says where it is wrong.
    let good = std::fs::read_to_string(config).unwrap();
    std::fs::write(config, "[acl]\ndefault = \"maybe\"\n").unwrap();
    s.daemon.hangup();
    let reloads = reloads_reach(&s.daemon, 1, 1).await;
    assert!(
        reloads["last_error"].as_str().unwrap().contains("line 2"),
        "{reloads}"
    );
    std::fs::write(config, &good).unwrap();
    let passwords = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, format!("{passwords}not a user line\n")).unwrap();
    s.daemon.hangup();
    let reloads = reloads_reach(&s.daemon, 1, 2).await;
    assert!(
        reloads["last_error"].as_str().unwrap().contains("line 3"),
        "{reloads}"
    );
    assert_eq!(
        reloads["restart_needed"], false,
        "only [auth] and [acl] changed so far: {reloads}"
    );
    std::fs::write(&file, passwords).unwrap();
    let (_, r) = login(port, V5, "carol2", Some("carol"), Some("oak")).await;
    assert!(!r.is_error(), "{r:?}");
    alice.send(&publish("public/y", 3)).await;
    match alice.next().await {
        Some(Packet::PubAck(a)) => assert_eq!(a.reason, ReasonCode::NOT_AUTHORIZED),
        other => panic!("the rules stay: expected PUBACK 0x87, got {other:?}"),
    }

    // Other changes wait for a restart, and are said to.
    let moved = files_config_text(&file, deny_public)
        .replace("[acl]", "[limits]\nmax_inflight = 7\n\n[acl]");
    std::fs::write(config, moved).unwrap();
    s.daemon.hangup();
    let reloads = reloads_reach(&s.daemon, 2, 2).await;
    assert_eq!(reloads["restart_needed"], true, "{reloads}");
}

/// Wait until the daemon's reloads (`/api/node`) are `done` applied and `failed` refused;
/// what it says of them.
async fn reloads_reach(daemon: &Daemon, done: u64, failed: u64) -> serde_json::Value {
    let node = common::wait_for_api(daemon.admin, "/api/node", "the reloads", |n| {
        n["reloads"]["done"] == done && n["reloads"]["failed"] == failed
    })
    .await;
    node["reloads"].clone()
}

/// With the policy document (the default), the files seed it once: SIGHUP reloads nothing
/// and says where users and rules come from.
#[tokio::test]
async fn sighup_with_the_policy_document_points_to_meridian_ctl() {
    let s = start();
    let port = s.daemon.mqtt;
    let file = s._dir.path().join("passwd");
    std::fs::write(&file, format!("carol:{}\n", cheap_hash("oak"))).unwrap();
    s.daemon.hangup();
    let reloads = reloads_reach(&s.daemon, 0, 1).await;
    assert!(
        reloads["last_error"]
            .as_str()
            .unwrap()
            .contains("meridian ctl user|acl"),
        "{reloads}"
    );
    let (_, r) = login(port, V5, "carol", Some("carol"), Some("oak")).await;
    assert_eq!(
        r,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD,
        "the file is not read again"
    );
    let (_, r) = login(port, V5, "alice", Some("alice"), Some("looking-glass")).await;
    assert!(!r.is_error(), "{r:?}");
}

/// A monitoring client subscribed to `#` under a deny rule: everything but the denied topics
/// reaches it, retained messages included; counted in `/metrics`.
#[tokio::test]
async fn a_wildcard_subscriber_gets_everything_but_the_denied_topics() {
    use common::{v3, v5};
    use rumqttc::v5::mqttbytes::QoS as Qos5;

    let daemon = Daemon::start_with_config(Some(
        r#"
[acl]
default = "allow"

[[acl.rules]]
permission = "deny"
action = "subscribe"
topic = "secret/#"
"#,
    ));
    let port = daemon.mqtt;
    let mut publisher = v3::connect(v3::options("pub", port)).await;
    for (topic, retain) in [("secret/r", true), ("public/r", true)] {
        publisher
            .client
            .publish(topic, rumqttc::QoS::AtLeastOnce, retain, "retained")
            .await
            .unwrap();
        publisher
            .expect(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(()))
            .await;
    }

    let mut monitor = v5::connect(v5::options("monitor", port)).await;
    monitor.subscribe("#", Qos5::AtLeastOnce).await;
    let mut status = v3::connect(v3::options("status", port)).await;
    let granted = status
        .subscribe("+/status", rumqttc::QoS::AtLeastOnce)
        .await;
    assert_eq!(
        granted,
        [rumqttc::SubscribeReasonCode::Success(
            rumqttc::QoS::AtLeastOnce
        )]
    );
    let refused = status
        .subscribe("secret/+", rumqttc::QoS::AtLeastOnce)
        .await;
    assert_eq!(refused, [rumqttc::SubscribeReasonCode::Failure]);

    for topic in ["secret/status", "public/status", "secret/a/b", "public/end"] {
        publisher
            .client
            .publish(topic, rumqttc::QoS::AtLeastOnce, false, "live")
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("public/end") {
        let p = monitor.publish_msg().await;
        seen.push(String::from_utf8_lossy(&p.topic).into_owned());
    }
    assert_eq!(seen, ["public/r", "public/status", "public/end"]);
    let p = status.publish_msg().await;
    assert_eq!(p.topic, "public/status");

    // secret/r kept from the monitor; secret/status from both; secret/a/b from the monitor.
    let metrics = common::Metrics::of(daemon.admin).await;
    assert_eq!(
        metrics.get("meridian_deliveries_withheld_total"),
        Some(4.0),
        "{metrics:?}"
    );
    assert_eq!(
        metrics.get("meridian_subscriptions_refused_total{reason=\"not_authorized\"}"),
        Some(1.0),
        "{metrics:?}"
    );
}

/// A hash whose own parameters ask for 2^32 - 1 passes: checking one password against it
/// would hold a login worker for hours. The policy document holds what any node wrote, and
/// this one is seeded from the file as a peer could have written it.
#[tokio::test]
async fn a_hash_that_would_hold_the_login_workers_is_never_checked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    let costly = "$argon2id$v=19$m=19456,t=4294967295,p=1$c2FsdHNhbHQ$\
                  AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    std::fs::write(
        &file,
        format!("alice:{}\nmallory:{costly}\n", cheap_hash("looking-glass")),
    )
    .unwrap();
    let daemon = Daemon::start_with_config(Some(&config_text(&file, "")));
    let port = daemon.mqtt;
    // More logins than there are login workers (4), at once.
    let tries: Vec<_> = (0..8)
        .map(|i| {
            tokio::spawn(async move {
                let id = format!("m{i}");
                login(port, V5, &id, Some("mallory"), Some("anything"))
                    .await
                    .1
            })
        })
        .collect();
    for t in tries {
        assert_eq!(t.await.unwrap(), ReasonCode::BAD_USER_NAME_OR_PASSWORD);
    }
    let (_, r) = login(port, V5, "a", Some("alice"), Some("looking-glass")).await;
    assert!(!r.is_error(), "{r:?}");
    assert!(
        daemon.log_text().contains("these users cannot log in"),
        "{}",
        daemon.log_text()
    );
}
