//! Sessions that follow their clients between regions, with real clients (rumqttc, MQTT 3.1.1
//! and 5.0) against three `meridian` processes meshed on loopback: a persistent session left
//! in one region is resumed in another with what was queued for it meanwhile; the old
//! connection is taken over; another user cannot take a session over from any region.

mod common;

use common::mesh::{MESH_DEADLINE, Node, cluster_key, next_publish, wait_for};
use common::{cheap_hash, free_port, raw, v3, v5};
use meridian_core::codec::{Packet, ProtocolVersion, ReasonCode};
use meridian_tools::link_proxy::LinkProxy as Proxy;
use rumqttc::QoS;

/// Three regions with users alice and mallory (password `pw`), each node linked to the others
/// through a proxy.
struct Regions {
    nodes: Vec<Node>,
    _proxies: Vec<Proxy>,
    _dir: tempfile::TempDir,
}

async fn regions() -> Regions {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let passwords = dir.path().join("passwords");
    std::fs::write(
        &passwords,
        format!("alice:{}\nmallory:{}\n", cheap_hash("pw"), cheap_hash("pw")),
    )
    .unwrap();
    let auth = format!(
        "\n[auth]\npassword_file = \"{}\"\nallow_anonymous = false\n",
        passwords.display()
    );
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let ab = Proxy::start(pa).await.unwrap();
    let ac = Proxy::start(pa).await.unwrap();
    let bc = Proxy::start(pb).await.unwrap();
    let a = Node::start_with("euc1", pa, &[], &key, &auth).await;
    let b = Node::start_with("ape1", pb, &[ab.port], &key, &auth).await;
    let c = Node::start_with("afs1", pc, &[ac.port, bc.port], &key, &auth).await;
    for (x, y) in [(&a, &b), (&a, &c), (&b, &c)] {
        wait_for("the mesh to connect", &[x, y], || async {
            x.connected_to(y).await && y.connected_to(x).await
        })
        .await;
    }
    Regions {
        nodes: vec![a, b, c],
        _proxies: vec![ab, ac, bc],
        _dir: dir,
    }
}

fn v3_login(id: &str, port: u16, user: &str) -> rumqttc::MqttOptions {
    let mut o = v3::options(id, port);
    o.set_credentials(user, "pw");
    o.set_clean_session(false);
    o
}

/// A metric of a node, polled until it reaches `want`.
async fn metric_reaches(node: &Node, series: &str, want: f64) {
    wait_for(&format!("{series} to reach {want}"), &[node], || async {
        common::mesh::metric(&node.metrics().await, series) >= want
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_session_resumed_in_another_region_brings_what_was_queued() {
    let r = regions().await;
    let (a, b, c) = (&r.nodes[0], &r.nodes[1], &r.nodes[2]);

    // The device subscribes in region a, then goes away (its connection dropped).
    let mut device = v3::connect(v3_login("device-7", a.mqtt(), "alice")).await;
    device.subscribe("fleet/device-7/#", QoS::AtLeastOnce).await;
    wait_for("c to route to a", &[c], || async {
        c.routes_of(a).await.iter().any(|f| f == "fleet/device-7/#")
    })
    .await;
    device.abort();

    // Commands for it are published in region c while it is away: a queues them.
    let mut ops = v3::connect(v3_login("ops", c.mqtt(), "alice")).await;
    for i in 0..10 {
        ops.client
            .publish(
                "fleet/device-7/cmd",
                QoS::AtLeastOnce,
                false,
                format!("cmd {i}"),
            )
            .await
            .unwrap();
        ops.expect(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(()))
            .await;
    }
    // All ten held for it in region a: queued, or (one sent as its connection dropped) in
    // flight.
    wait_for("region a to hold the ten commands", &[a], || async {
        let m = a.metrics().await;
        common::mesh::metric(&m, "meridian_queued_messages")
            + common::mesh::metric(&m, "meridian_inflight_messages")
            >= 10.0
    })
    .await;

    // It reappears in region b: Session Present, and every command, once, in order.
    let mut device = v3::connect(v3_login("device-7", b.mqtt(), "alice")).await;
    assert!(
        device.session_present,
        "the session exists in the deployment"
    );
    for i in 0..10 {
        let p = next_publish(&mut device, |_| true).await;
        assert_eq!(p.payload, format!("cmd {i}").as_bytes(), "in order, once");
    }
    metric_reaches(a, "meridian_sessions_moved_total{direction=\"out\"}", 1.0).await;
    metric_reaches(b, "meridian_sessions_moved_total{direction=\"in\"}", 1.0).await;
    wait_for("region a to let the session go", &[a], || async {
        common::mesh::metric(&a.metrics().await, "meridian_sessions") == 0.0
    })
    .await;

    // Its subscription came along: commands now reach it in b, and no longer a.
    wait_for("c to route to b only", &[c], || async {
        c.routes_of(b).await.iter().any(|f| f == "fleet/device-7/#")
            && !c.routes_of(a).await.iter().any(|f| f == "fleet/device-7/#")
    })
    .await;
    ops.client
        .publish("fleet/device-7/cmd", QoS::AtLeastOnce, false, "after")
        .await
        .unwrap();
    let p = next_publish(&mut device, |_| true).await;
    assert_eq!(
        &p.payload[..],
        b"after",
        "no duplicate of an earlier command"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_connection_is_taken_over_and_another_user_is_refused_everywhere() {
    let r = regions().await;
    let (a, b, c) = (&r.nodes[0], &r.nodes[1], &r.nodes[2]);

    // MQTT 5.0: alice's sensor in region a (a raw client, to read the exact DISCONNECT).
    let mut hello = raw::connect_packet(ProtocolVersion::V5, "sensor-1");
    hello.username = Some("alice".into());
    hello.password = Some(bytes::Bytes::from_static(b"pw"));
    hello.clean_start = false;
    hello.properties.session_expiry_interval = Some(3600);
    let (mut sensor, ack) = raw::Raw::connect_with(a.mqtt(), hello).await;
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    for node in [b, c] {
        metric_reaches(node, "meridian_claims", 1.0).await;
    }

    // mallory cannot take sensor-1 over in any region: 3.1.1 return code 5, 5.0 0x87.
    for node in [a, b, c] {
        let mut o = v3::options("sensor-1", node.mqtt());
        o.set_credentials("mallory", "pw");
        let (_client, mut eventloop) = rumqttc::AsyncClient::new(o, 10);
        match tokio::time::timeout(MESH_DEADLINE, eventloop.poll()).await {
            Ok(Err(rumqttc::ConnectionError::ConnectionRefused(code))) => {
                assert_eq!(code, rumqttc::ConnectReturnCode::NotAuthorized)
            }
            other => panic!("{}: mallory was not refused: {other:?}", node.region),
        }
        let mut o = v5::options("sensor-1", node.mqtt());
        o.set_credentials("mallory", "pw");
        let (_client, mut eventloop) = rumqttc::v5::AsyncClient::new(o, 10);
        match tokio::time::timeout(MESH_DEADLINE, eventloop.poll()).await {
            Ok(Err(rumqttc::v5::ConnectionError::ConnectionRefused(code))) => {
                assert_eq!(
                    code,
                    rumqttc::v5::mqttbytes::v5::ConnectReturnCode::NotAuthorized
                )
            }
            other => panic!("{}: mallory was not refused: {other:?}", node.region),
        }
    }

    // alice herself moves it to b: a closes the old connection with 0x8E.
    let mut moved = v5::options("sensor-1", b.mqtt());
    moved.set_credentials("alice", "pw");
    moved.set_clean_start(false);
    moved.set_session_expiry_interval(Some(3600));
    let _sensor_b = v5::connect(moved).await;
    // The first packet a sends the sensor since it connected: mallory's attempts never
    // touched it.
    match sensor.next().await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::SESSION_TAKEN_OVER),
        other => panic!("expected DISCONNECT 0x8E, got {other:?}"),
    }
    assert!(sensor.closed().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_published_while_a_device_moves_all_reach_it() {
    use meridian_core::codec::{Ack, Subscribe, SubscribeFilter, SubscriptionOptions};
    const N: usize = 300;
    let r = regions().await;
    let (a, b, c) = (&r.nodes[0], &r.nodes[1], &r.nodes[2]);
    // In region a, a raw client (it acknowledges exactly what the test has seen).
    let mut hello = raw::connect_packet(ProtocolVersion::V311, "device-9");
    hello.username = Some("alice".into());
    hello.password = Some(bytes::Bytes::from_static(b"pw"));
    hello.clean_start = false;
    let (mut device, ack) = raw::Raw::connect_with(a.mqtt(), hello).await;
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    device
        .send(&Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![SubscribeFilter {
                filter: "fleet/device-9/#".into(),
                options: SubscriptionOptions {
                    qos: meridian_core::codec::QoS::AtLeastOnce,
                    ..Default::default()
                },
            }],
            properties: Default::default(),
        }))
        .await;
    assert!(matches!(device.next().await, Some(Packet::SubAck(_))));
    wait_for("c to route to a", &[c], || async {
        c.routes_of(a).await.iter().any(|f| f == "fleet/device-9/#")
    })
    .await;

    // Region c publishes without pause, each PUBLISH after the last one's PUBACK.
    let mut ops = v3::connect(v3_login("ops-9", c.mqtt(), "alice")).await;
    let publisher = tokio::spawn(async move {
        for i in 0..N {
            ops.client
                .publish("fleet/device-9/cmd", QoS::AtLeastOnce, false, i.to_string())
                .await
                .unwrap();
            ops.expect(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(()))
                .await;
        }
    });
    let number =
        |payload: &[u8]| -> usize { std::str::from_utf8(payload).unwrap().parse().unwrap() };
    let mut got = std::collections::BTreeSet::new();
    let mut copies = 0;
    while got.len() < N / 3 {
        match device.next().await {
            Some(Packet::Publish(p)) => {
                got.insert(number(&p.payload));
                copies += 1;
                if let Some(id) = p.packet_id {
                    device.send(&Packet::PubAck(Ack::new(id))).await;
                }
            }
            Some(_) => {}
            None => panic!("region a closed the device's connection"),
        }
    }
    // The device drops off region a mid-stream and comes back in region b.
    drop(device);
    let mut device = v3::connect(v3_login("device-9", b.mqtt(), "alice")).await;
    assert!(device.session_present);
    let deadline = tokio::time::Instant::now() + MESH_DEADLINE;
    while got.len() < N {
        let Ok(Some(p)) = tokio::time::timeout_at(deadline, device.rx.recv()).await else {
            let missing: Vec<usize> = (0..N).filter(|k| !got.contains(k)).collect();
            let mut report = format!("missing {missing:?}\n");
            for node in [a, b, c] {
                let m = node.metrics().await;
                for line in m.lines().filter(|l| {
                    !l.starts_with('#')
                        && (l.contains("dropped")
                            || l.contains("relayed")
                            || l.contains("moved")
                            || l.contains("transfer")
                            || l.contains("claims"))
                }) {
                    report.push_str(&format!("{}: {line}\n", node.region));
                }
            }
            panic!("{report}");
        };
        if let rumqttc::Packet::Publish(p) = p {
            got.insert(number(&p.payload));
            copies += 1;
        }
    }
    publisher.await.unwrap();
    assert_eq!(got, (0..N).collect(), "every message, none lost");
    let relayed = common::mesh::metric(&a.metrics().await, "meridian_messages_relayed_total");
    eprintln!("{N} messages, {copies} copies received (QoS 1), {relayed} relayed by region a");
}

/// A loopback TCP balancer: each connection goes to the next backend in turn.
async fn balancer(backends: Vec<u16>) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut next = 0;
        while let Ok((mut client, _)) = listener.accept().await {
            let backend = backends[next % backends.len()];
            next += 1;
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", backend)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    (port, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_of_one_region_behind_one_address_serve_any_client() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (p1, p2) = (free_port(), free_port());
    let link = Proxy::start(p1).await.unwrap();
    let one = Node::start("euc1", p1, &[], &key).await;
    let two = Node::start("euc1", p2, &[link.port], &key).await;
    wait_for("the two nodes to link", &[&one, &two], || async {
        one.connected_to(&two).await && two.connected_to(&one).await
    })
    .await;
    let (address, _balancer) = balancer(vec![one.mqtt(), two.mqtt()]).await;

    // Through the one address: the device lands on node one, subscribes, and goes away.
    let persistent = |id: &str| {
        let mut o = v3::options(id, address);
        o.set_clean_session(false);
        o
    };
    let mut device = v3::connect(persistent("meter-3")).await;
    device.subscribe("meters/3/#", QoS::AtLeastOnce).await;
    wait_for("node two to route to node one", &[&two], || async {
        two.routes_of(&one).await.iter().any(|f| f == "meters/3/#")
    })
    .await;
    device.abort();
    // The next connection, a publisher, lands on node two.
    let mut ops = v3::connect(v3::options("ops-3", address)).await;
    for i in 0..5 {
        ops.client
            .publish("meters/3/cmd", QoS::AtLeastOnce, false, format!("cmd {i}"))
            .await
            .unwrap();
        ops.expect(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(()))
            .await;
    }
    // Another client takes node one's turn; the device comes back through the one address
    // and lands on node two.
    let _passer_by = v3::connect(v3::options("passer-by", address)).await;
    let mut device = v3::connect(persistent("meter-3")).await;
    assert!(device.session_present, "its session, wherever it lands");
    for i in 0..5 {
        let p = next_publish(&mut device, |_| true).await;
        assert_eq!(p.payload, format!("cmd {i}").as_bytes(), "in order, once");
    }
    let moved = common::mesh::metric(
        &two.metrics().await,
        "meridian_sessions_moved_total{direction=\"in\"}",
    );
    assert_eq!(moved, 1.0, "the session came to node two");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_id_pinned_to_a_home_region_is_served_by_one_node_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let home =
        "home_wait_ms = 2000\n[[cluster.home]]\nclient_ids = \"plant-*\"\nregion = \"euc1\"\n";
    let (pa, pc) = (free_port(), free_port());
    let link = Proxy::start(pa).await.unwrap();
    let a = Node::start_with("euc1", pa, &[], &key, home).await;
    let c = Node::start_with("afs1", pc, &[link.port], &key, home).await;
    wait_for("the link", &[&a, &c], || async {
        a.connected_to(&c).await && c.connected_to(&a).await
    })
    .await;

    // In region afs1, a pinned client is served once region euc1 granted it (MQTT 5.0).
    let mut first = v5::options("plant-7", c.mqtt());
    first.set_clean_start(false);
    first.set_session_expiry_interval(Some(3600));
    let _plant = v5::connect(first).await;

    // It connects in euc1 too: afs1 closes its connection before euc1 answers.
    let mut again = raw::connect_packet(ProtocolVersion::V5, "plant-7");
    again.clean_start = false;
    again.properties.session_expiry_interval = Some(3600);
    let (_second, ack) = raw::Raw::connect_with(a.mqtt(), again).await;
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    assert!(ack.session_present);
    // By then afs1 had closed its connection: it serves plant-7 no more.
    let (_, clients) = common::http(c.daemon.admin, "GET", "/api/clients").await;
    assert!(
        !clients.contains("\"plant-7\",\"congested\":false,\"connected\":true"),
        "{clients}"
    );

    // Cut off from its home region, afs1 refuses the pinned client: 0x88, 3.1.1 code 3.
    link.cut();
    wait_for("the link to drop", &[&a, &c], || async {
        !c.connected_to(&a).await
    })
    .await;
    let (_, ack) = raw::Raw::connect_with(
        c.mqtt(),
        raw::connect_packet(ProtocolVersion::V5, "plant-8"),
    )
    .await;
    assert_eq!(ack.reason, ReasonCode::SERVER_UNAVAILABLE);
    let (_, ack) = raw::Raw::connect_with(
        c.mqtt(),
        raw::connect_packet(ProtocolVersion::V311, "plant-9"),
    )
    .await;
    assert_eq!(
        ack.reason,
        ReasonCode::SERVER_UNAVAILABLE,
        "3.1.1: return code 3"
    );
    // A client id pinned nowhere is served as ever.
    let (_, ack) = raw::Raw::connect_with(
        c.mqtt(),
        raw::connect_packet(ProtocolVersion::V5, "sensor-9"),
    )
    .await;
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    let refused = common::mesh::metric(&c.metrics().await, "meridian_connects_home_refused_total");
    assert_eq!(refused, 2.0);
}

/// `meridian ctl --admin 127.0.0.1:PORT ARGS`, `stdin` written to it: its output, or panic.
fn ctl(admin: u16, args: &[&str], stdin: &str) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_meridian"))
        .arg("ctl")
        .arg("--admin")
        .arg(format!("127.0.0.1:{admin}"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "meridian ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A new operator key pair in `dir`: the secret key's file, and the configuration that makes
/// a node take the key's signatures.
fn operator_key(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let op_key = dir.join("operator.key");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(["keygen", "--operator"])
        .arg(&op_key)
        .output()
        .unwrap();
    assert!(out.status.success());
    let public = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    (
        op_key,
        format!("\n[policy]\noperator_keys = [\"{public}\"]\n"),
    )
}

/// Command `i` for alice's device, from `ops`, acknowledged.
async fn send_command(ops: &mut v3::Client, i: u32) {
    ops.client
        .publish("cmd/dev/x", QoS::AtLeastOnce, false, format!("cmd {i}"))
        .await
        .unwrap();
    ops.expect(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(()))
        .await;
}

/// Alice's device (`dev`) subscribes at `node` and goes away; `n` commands are queued for it
/// there, each acknowledged. Returns her `ops` client, which sent them.
async fn alice_away_with_commands(node: &Node, n: u32) -> v3::Client {
    let mut device = v3::connect(v3_login("dev", node.mqtt(), "alice")).await;
    device.subscribe("cmd/dev/#", QoS::AtLeastOnce).await;
    device.abort();
    let mut ops = v3::connect(v3_login("ops", node.mqtt(), "alice")).await;
    for i in 0..n {
        send_command(&mut ops, i).await;
    }
    ops
}

/// Two nodes with an operator key, `a` in euc1 and `b` in `region` linked to it through
/// `proxy`, and `users` (password `pw`) added by the operator and known at both.
struct Operated {
    a: Node,
    b: Node,
    proxy: Proxy,
    dir: tempfile::TempDir,
}

async fn operated_pair(region: &str, users: &[&str]) -> Operated {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (op_key, signed) = operator_key(dir.path());
    let (pa, pb) = (free_port(), free_port());
    let proxy = Proxy::start(pa).await.unwrap();
    let a = Node::start_with("euc1", pa, &[], &key, &signed).await;
    let b = Node::start_with(region, pb, &[proxy.port], &key, &signed).await;
    wait_for("the mesh to connect", &[&a, &b], || async {
        a.connected_to(&b).await && b.connected_to(&a).await
    })
    .await;
    let op = op_key.to_str().unwrap();
    for user in users {
        ctl(
            a.daemon.admin,
            &["--operator-key", op, "user", "add", user],
            "pw\n",
        );
    }
    wait_for("the users at b", &[&a, &b], || async {
        let (_, p) = common::http(b.daemon.admin, "GET", "/api/policy").await;
        users.iter().all(|u| p.contains(u))
    })
    .await;
    Operated { a, b, proxy, dir }
}

/// With operator keys, a claim on a client id counts only with a proof that its client
/// logged in as the claim's user, which only a node that checked the user's password can make.
/// A rogue node (the released binary, the cluster key, a password file of its own that gives
/// alice another password) logs a client in as alice with her client id: it gets none of her
/// queued messages, and alice, back at her node, gets all of them. Her session still follows
/// her to an honest node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_does_not_know_a_users_password_cannot_take_her_session() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (op_key, signed) = operator_key(dir.path());
    let stolen = dir.path().join("rogue-passwords");
    std::fs::write(&stolen, format!("alice:{}\n", cheap_hash("stolen"))).unwrap();
    // Its users from its own file only: it takes nothing of the deployment's policy.
    let rogue_auth = format!(
        "\n[auth]\npassword_file = \"{}\"\n[policy]\nsource = \"files\"\n",
        stolen.display()
    );
    let (pa, pc, pr) = (free_port(), free_port(), free_port());
    let ac = Proxy::start(pa).await.unwrap();
    let ra = Proxy::start(pa).await.unwrap();
    let a = Node::start_with("euc1", pa, &[], &key, &signed).await;
    let c = Node::start_with("afs1", pc, &[ac.port], &key, &signed).await;
    let r = Node::start_with("xx1", pr, &[ra.port], &key, &rogue_auth).await;
    for (x, y) in [(&a, &c), (&a, &r)] {
        wait_for("the mesh to connect", &[x, y], || async {
            x.connected_to(y).await && y.connected_to(x).await
        })
        .await;
    }
    let op = op_key.to_str().unwrap();
    ctl(
        a.daemon.admin,
        &["--operator-key", op, "user", "add", "alice"],
        "pw\n",
    );
    wait_for("alice at c", &[&a, &c], || async {
        let (_, p) = common::http(c.daemon.admin, "GET", "/api/policy").await;
        p.contains("alice")
    })
    .await;

    // Alice's device subscribes at a and goes away; commands are queued for it there.
    let mut ops = alice_away_with_commands(&a, 5).await;

    // The rogue logs "alice" in with her client id and its own password for her.
    let mut o = v3::options("dev", r.mqtt());
    o.set_credentials("alice", "stolen");
    o.set_clean_session(false);
    let mut thief = v3::connect(o).await;
    metric_reaches(&a, "meridian_claims_unproven_total", 1.0).await;
    let stray = tokio::time::timeout(std::time::Duration::from_millis(500), async {
        next_publish(&mut thief, |_| true).await
    })
    .await;
    assert!(stray.is_err(), "the rogue got a queued message: {stray:?}");

    // Alice, back at a: her session, every command, once, in order.
    let mut device = v3::connect(v3_login("dev", a.mqtt(), "alice")).await;
    assert!(device.session_present);
    for i in 0..5 {
        let p = next_publish(&mut device, |_| true).await;
        assert_eq!(p.payload, format!("cmd {i}").as_bytes());
    }
    device.abort();

    // At an honest node, proven: her session follows her.
    let mut device = v3::connect(v3_login("dev", c.mqtt(), "alice")).await;
    assert!(device.session_present, "the session follows alice to c");
    metric_reaches(&c, "meridian_sessions_moved_total{direction=\"in\"}", 1.0).await;
    send_command(&mut ops, 5).await;
    let p = next_publish(&mut device, |_| true).await;
    assert_eq!(&p.payload[..], b"cmd 5");
}

/// With operator keys, bob's claim on alice's client id, made with his own valid proof (he
/// logged in with his password at a node cut off from hers, which had not met her claim), is
/// not taken where hers stands: once the link is back, alice resumes her session at her node
/// with every command queued in it, and bob keeps his connection at his.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proven_claim_of_another_user_takes_nothing_of_hers() {
    let Operated {
        a,
        b,
        proxy: ba,
        dir: _dir,
    } = operated_pair("ape1", &["alice", "bob"]).await;

    ba.cut();
    wait_for("the link to go", &[&a, &b], || async {
        !a.connected_to(&b).await && !b.connected_to(&a).await
    })
    .await;
    // Alice's device subscribes at a and goes away; commands are queued for it there.
    let mut device = v3::connect(v3_login("dev", a.mqtt(), "alice")).await;
    device.subscribe("cmd/dev/#", QoS::AtLeastOnce).await;
    device.abort();
    let mut ops = v3::connect(v3_login("ops", a.mqtt(), "alice")).await;
    for i in 0..3 {
        ops.client
            .publish("cmd/dev/x", QoS::AtLeastOnce, false, format!("cmd {i}"))
            .await
            .unwrap();
        ops.expect(|p| matches!(p, rumqttc::Packet::PubAck(_)).then_some(()))
            .await;
    }
    // bob, at b, with the same client id and his own password: b has not met alice's claim.
    let mut bob = v3::connect(v3_login("dev", b.mqtt(), "bob")).await;
    bob.subscribe("bob/#", QoS::AtLeastOnce).await;

    ba.restore();
    wait_for("the link to come back", &[&a, &b], || async {
        a.connected_to(&b).await && b.connected_to(&a).await
    })
    .await;
    metric_reaches(&a, "meridian_claims_of_another_user_total", 1.0).await;
    assert_eq!(
        common::mesh::metric(&a.metrics().await, "meridian_claims_unproven_total"),
        0.0,
        "bob's proof holds: his claim is refused for being over hers"
    );

    // Alice, back at a: her session, every command, once, in order.
    let mut device = v3::connect(v3_login("dev", a.mqtt(), "alice")).await;
    assert!(device.session_present);
    for i in 0..3 {
        let p = next_publish(&mut device, |_| true).await;
        assert_eq!(p.payload, format!("cmd {i}").as_bytes());
    }
    // bob was never taken over: his own messages still reach him at b.
    bob.client
        .publish("bob/x", QoS::AtLeastOnce, false, "still here")
        .await
        .unwrap();
    let p = next_publish(&mut bob, |_| true).await;
    assert_eq!(&p.payload[..], b"still here");
}

/// The value of a shipped session's window (its `Seen` record, as the link carries it) saying
/// the session had `node`'s messages (of incarnation `incarnation`) up to `upto`.
fn window_saying_had(node: &str, incarnation: u64, upto: u64) -> bytes::Bytes {
    let mut v = Vec::new();
    v.extend_from_slice(&[1, 0]); // format, no state awaited
    v.extend_from_slice(&0u32.to_be_bytes()); // no relays awaited
    v.extend_from_slice(&1u32.to_be_bytes()); // one origin:
    v.extend_from_slice(&(node.len() as u16).to_be_bytes());
    v.extend_from_slice(node.as_bytes());
    v.extend_from_slice(&incarnation.to_be_bytes());
    v.extend_from_slice(&upto.to_be_bytes());
    v.extend_from_slice(&0u32.to_be_bytes()); // nothing above it
    v.extend_from_slice(&0u32.to_be_bytes()); // no earlier incarnations
    bytes::Bytes::from(v)
}

/// The key of a session's window record.
fn window_key(client_id: &str) -> bytes::Bytes {
    let mut k = vec![b'V'];
    k.extend_from_slice(&(client_id.len() as u16).to_be_bytes());
    k.extend_from_slice(client_id.as_bytes());
    bytes::Bytes::from(k)
}

/// A member that never held alice's session (a node of its own with the cluster key, built
/// from the daemon's mesh code) ships "her session" to the node she has just claimed it at,
/// while that node is cut off from the one that holds it: by no claim of its own, by the
/// claim the holder held it by (copied from its broadcast), and by a claim of its own carrying
/// the holder's proof. Each shipment says she had the next million messages of the holder's
/// node, which taken would have them dropped as had. None is taken: once the link is back she
/// gets the commands queued for her, then those published after, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_shipped_by_a_member_that_did_not_hold_it_is_not_taken() {
    use common::forger::Forger;
    use meridian_core::link::{ClaimUpdate, Frame, SessionTransfer};
    use meridian_core::retained::Stamp;
    use meridian_core::routes::NodeId;

    let Operated {
        a,
        b: c,
        proxy: ca,
        dir,
    } = operated_pair("afs1", &["alice"]).await;
    let mut forger = Forger::start(dir.path(), &[&a, &c]).await;
    let a_incarnation = forger
        .hear(&a, |f| match f {
            Frame::Hello { incarnation, .. } => Some(*incarnation),
            _ => None,
        })
        .await;
    let claim_on_dev = |f: &Frame| match f {
        Frame::Claim(u) if u.client_id == "dev" && u.claim.is_some() => Some(u.clone()),
        _ => None,
    };

    // Alice's device subscribes at a and goes away; commands are queued for it there.
    let mut ops = alice_away_with_commands(&a, 3).await;
    let a_claim = forger.hear(&a, claim_on_dev).await;

    // Alice at c, cut off from a: c claims her session, which a cannot ship yet.
    ca.cut();
    wait_for("the link to go", &[&a, &c], || async {
        !a.connected_to(&c).await && !c.connected_to(&a).await
    })
    .await;
    let mut device = v3::connect(v3_login("dev", c.mqtt(), "alice")).await;
    let c_claim = forger.hear(&c, claim_on_dev).await;

    let me = NodeId::new(&forger.mesh.peer_id.to_string()).unwrap();
    let own_stamp = Stamp {
        hlc: a_claim.stamp.hlc,
        node: me,
    };
    let shipment = |by: Option<ClaimUpdate>| {
        Frame::SessionTransfer(SessionTransfer {
            client_id: "dev".into(),
            claim: c_claim.stamp.clone(),
            shipment: own_stamp.clone(),
            index: 0,
            count: 1,
            by,
            records: vec![(
                window_key("dev"),
                window_saying_had(&a.peer_id, a_incarnation, 1_000_000),
            )],
        })
    };
    let with_a_s_proof = ClaimUpdate {
        stamp: own_stamp.clone(),
        ..a_claim.clone()
    };
    let not_owner = "meridian_peer_frames_refused_total{reason=\"not_owner\"}";
    let refused_before = common::mesh::metric(&c.metrics().await, not_owner);
    for by in [None, Some(a_claim.clone()), Some(with_a_s_proof)] {
        forger.send(&c, &shipment(by));
    }
    // Refused: the first and the last for a claim c's authorizer does not vouch for (no proof
    // that alice logged in at the forger), the second for naming a claim not the forger's.
    metric_reaches(&c, "meridian_session_transfers_refused_total", 2.0).await;
    metric_reaches(&c, not_owner, refused_before + 3.0).await;

    // Back together: a ships her session to c, with every command once, in order; what a's
    // publishers send her after reaches her too.
    ca.restore();
    for i in 0..3 {
        let p = next_publish(&mut device, |_| true).await;
        assert_eq!(p.payload, format!("cmd {i}").as_bytes());
    }
    metric_reaches(&c, "meridian_sessions_moved_total{direction=\"in\"}", 1.0).await;
    for i in 3..6 {
        send_command(&mut ops, i).await;
        let p = next_publish(&mut device, |_| true).await;
        assert_eq!(p.payload, format!("cmd {i}").as_bytes());
    }
    let stray = tokio::time::timeout(std::time::Duration::from_millis(300), async {
        next_publish(&mut device, |_| true).await
    })
    .await;
    assert!(stray.is_err(), "a command came twice: {stray:?}");
    forger.mesh.shutdown().await;
}

/// With operator keys, a member's word about other nodes' clients counts for nothing without
/// the operator's or the user's signature: to the home of a pinned client id (a node that
/// serves alice's `plant-1` itself) a hostile member sends requests to serve it as alice
/// (without a proof, and with the proof of a's own claim), a revocation, a claim on an id
/// longer than any client's, releases of ids it never claimed and a forget of a node's
/// incarnation nobody met. Each is refused and counted; alice's connection stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_s_requests_revocations_releases_and_forgets_close_no_one() {
    use common::forger::Forger;
    use meridian_core::link::{Claim, ClaimUpdate, Frame};
    use meridian_core::retained::{Hlc, Stamp};
    use meridian_core::routes::NodeId;

    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (op_key, signed) = operator_key(dir.path());
    let home = format!("[[cluster.home]]\nclient_ids = \"plant-*\"\nregion = \"euc1\"\n{signed}");
    let a = Node::start_with("euc1", free_port(), &[], &key, &home).await;
    let op = op_key.to_str().unwrap();
    for user in ["alice", "ops"] {
        ctl(
            a.daemon.admin,
            &["--operator-key", op, "user", "add", user],
            "pw\n",
        );
    }
    wait_for("the users at a", &[&a], || async {
        let (_, p) = common::http(a.daemon.admin, "GET", "/api/policy").await;
        p.contains("alice") && p.contains("ops")
    })
    .await;
    let mut forger = Forger::start(dir.path(), &[&a]).await;
    let mut plant = v3::connect(v3_login("plant-1", a.mqtt(), "alice")).await;
    plant.subscribe("plant/1/#", QoS::AtLeastOnce).await;
    let a_claim = forger
        .hear(&a, |f| match f {
            Frame::Claim(u) if u.client_id == "plant-1" => Some(u.clone()),
            _ => None,
        })
        .await;
    let a_proof = a_claim.claim.as_ref().and_then(|c| c.proof.clone());
    assert!(a_proof.is_some(), "a proves alice's claim");

    let page = a.metrics().await;
    let not_owner = "meridian_peer_frames_refused_total{reason=\"not_owner\"}";
    let refused_before = common::mesh::metric(&page, not_owner);
    let request = |proof| Frame::ClaimRequest {
        client_id: "plant-1".into(),
        user: Some("alice".into()),
        proof,
        token: 7,
    };
    let me = NodeId::new(&forger.mesh.peer_id.to_string()).unwrap();
    let stamp = |wall_ms| Stamp {
        hlc: Hlc {
            wall_ms,
            logical: 0,
        },
        node: me.clone(),
    };
    let now_ms = a_claim.stamp.hlc.wall_ms;
    let mut frames = vec![
        request(None),
        request(a_proof),
        Frame::Revoke {
            client_id: "plant-1".into(),
            token: 8,
        },
        Frame::Claim(ClaimUpdate {
            client_id: "x".repeat(300),
            stamp: stamp(now_ms),
            claim: Some(Claim {
                user: None,
                resume: false,
                persistent: false,
                proof: None,
            }),
        }),
        Frame::Forget {
            node: NodeId::new("12D3KooWnobodymetthisnodeatall").unwrap(),
            incarnation: u64::MAX,
            signature: None,
        },
    ];
    frames.extend((0..100).map(|i| {
        Frame::Claim(ClaimUpdate {
            client_id: format!("plant-{i}"),
            stamp: stamp(now_ms + i),
            claim: None,
        })
    }));
    for frame in &frames {
        forger.send(&a, frame);
    }
    // Two requests (each also counted as unproven), the revocation (the forger is of no
    // home region), the over-long claim and the forget.
    metric_reaches(&a, "meridian_claims_unproven_total", 2.0).await;
    metric_reaches(&a, not_owner, refused_before + 5.0).await;
    let refusals = forger
        .hear(&a, |f| match f {
            Frame::ClaimAnswer { reason, .. } => Some(*reason),
            _ => None,
        })
        .await;
    assert_eq!(refusals, 0x87, "the request is refused: not authorized");

    // alice's plant is still served at a, her claim standing there.
    let ops = v3::connect(v3_login("ops", a.mqtt(), "ops")).await;
    ops.client
        .publish("plant/1/cmd", QoS::AtLeastOnce, false, "still here")
        .await
        .unwrap();
    let p = next_publish(&mut plant, |_| true).await;
    assert_eq!(&p.payload[..], b"still here");
    let (_, clients) = common::http(a.daemon.admin, "GET", "/api/clients").await;
    assert!(clients.contains("plant-1"), "{clients}");
    forger.mesh.shutdown().await;
}
