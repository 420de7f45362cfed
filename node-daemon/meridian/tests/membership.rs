//! Members that leave and peers that cannot lie, with real `meridian` processes: a node killed
//! for good never holds the others' publishers back and is forgotten (by `meridian ctl` and by
//! expiry); a peer holding the cluster key that forges another node's routes, forwards and
//! retained writes changes nothing.

mod common;

use std::time::Duration;

use common::forger::{Forger, encode, owner};
use common::mesh::*;
use common::{free_port, v3, v5};
use meridian_core::codec::Publish;
use meridian_core::link::{Forward, Frame, RetainedUpdate};
use meridian_core::retained::{Hlc, Stamp};
use meridian_core::routes::{NodeId, RouteChange, RouteDelta, RouteOp, SnapshotChunk};
use meridian_daemon::testing::MeshCmd;
use rumqttc::QoS;

/// `meridian ctl --admin 127.0.0.1:PORT ARGS...`: (success, stdout, stderr).
fn ctl(admin: u16, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meridian"))
        .arg("ctl")
        .arg("--admin")
        .arg(format!("127.0.0.1:{admin}"))
        .args(args)
        .output()
        .expect("run meridian ctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Publish `n` QoS 1 messages over MQTT 5.0 and return their PUBACK reason codes.
async fn publish_v5(port: u16, id: &str, topic: &str, n: usize) -> Vec<u8> {
    use rumqttc::v5::mqttbytes::QoS as Q5;
    use rumqttc::v5::mqttbytes::v5::Packet as P5;
    let mut p = v5::connect(v5::options(id, port)).await;
    let mut reasons = Vec::new();
    for i in 0..n {
        p.client
            .publish(topic, Q5::AtLeastOnce, false, format!("{i}").into_bytes())
            .await
            .expect("publish queued");
        let reason = p
            .expect(|packet| match packet {
                P5::PubAck(ack) => Some(ack.reason as u8),
                _ => None,
            })
            .await;
        reasons.push(reason);
    }
    p.abort();
    reasons
}

async fn peer_ids(node: &Node) -> Vec<String> {
    node.peers()
        .await
        .iter()
        .filter_map(|p| p["peer_id"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_for_good_never_blocks_publishers_and_is_forgotten_by_command() {
    let (mut a, c, _link, _dir) = two_regions_with("outbox_max_messages = 100\n").await;
    let mut sub = v3::connect(v3::options("sub-a", a.mqtt())).await;
    sub.subscribe("geo/a/#", QoS::AtLeastOnce).await;
    wait_for("c to learn a's route", &[&a, &c], || async {
        c.routes_of(&a).await == ["geo/a/#"]
    })
    .await;

    // a dies for good (its data directory is lost with it).
    a.daemon.kill9();
    wait_for("c to see a gone", &[&c], || async {
        !c.connected_to(&a).await
    })
    .await;
    let reasons = publish_v5(c.mqtt(), "pub", "geo/a/x", 300).await;
    assert!(
        reasons.iter().all(|r| *r == 0),
        "every publish succeeds with a node gone: {reasons:?}"
    );
    let metrics = c.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "meridian_messages_dropped_total{reason=\"peer_absent\"}"
        ),
        200.0,
        "the outbox keeps the newest 100"
    );

    // The operator says it is gone for good.
    let (ok, out, err) = ctl(c.daemon.admin, &["peers", "forget", &a.peer_id]);
    assert!(ok, "ctl failed: {err}");
    assert!(
        out.contains("1 routes withdrawn, 100 queued messages dropped"),
        "{out}"
    );
    assert!(c.routes_of(&a).await.is_empty());
    assert!(!peer_ids(&c).await.contains(&a.peer_id));
    let metrics = c.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "meridian_messages_dropped_total{reason=\"peer_forgotten\"}"
        ),
        100.0
    );
    assert_eq!(metric(&metrics, "meridian_peers_forgotten_total"), 1.0);
    assert!(c.log().contains("peer forgotten"), "{}", c.log());

    // Publishing goes on, and nothing queues for the forgotten node any more.
    let reasons = publish_v5(c.mqtt(), "pub2", "geo/a/x", 20).await;
    assert!(reasons.iter().all(|r| *r == 0), "{reasons:?}");
    let metrics = c.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "meridian_messages_dropped_total{reason=\"peer_absent\"}"
        ),
        200.0
    );

    // Asking again, or about a node that is up, is an error the operator can read.
    let (ok, _, err) = ctl(c.daemon.admin, &["peers", "forget", &a.peer_id]);
    assert!(
        !ok && err.contains("404") && err.contains("unknown node"),
        "{err}"
    );
    let (ok, out, _) = ctl(c.daemon.admin, &["peers", "list"]);
    assert!(ok && !out.contains(&a.peer_id), "{out}");
    let (ok, _, err) = ctl(c.daemon.admin, &["peers", "forget", "not a peer?x"]);
    assert!(!ok && err.contains("is not a peer id"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_absent_past_the_expiry_is_forgotten_by_itself_and_a_live_one_is_not() {
    // c forgets after 1.5 s without a link; a stays up, b goes first.
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let mut a = Node::start("euc1", pa, &[], &key).await;
    let mut b = Node::start("ape1", pb, &[], &key).await;
    let c = Node::start_with("afs1", pc, &[pa, pb], &key, "peer_expiry_ms = 1500\n").await;
    let mut sub = v3::connect(v3::options("sub-a", a.mqtt())).await;
    sub.subscribe("geo/a/#", QoS::AtLeastOnce).await;
    wait_for(
        "c to reach b and learn a's route",
        &[&a, &b, &c],
        || async { c.connected_to(&b).await && c.routes_of(&a).await == ["geo/a/#"] },
    )
    .await;
    // Refused while the link is up, by the API as by the CLI.
    let (status, body) = common::http(
        c.daemon.admin,
        "DELETE",
        &format!("/api/peers/{}", a.peer_id),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    // b dies: once c has forgotten it, an expiry time has passed, and a, live all along, is
    // still known with its routes.
    b.daemon.kill9();
    wait_for("c to forget b by itself", &[&c], || async {
        !peer_ids(&c).await.contains(&b.peer_id)
    })
    .await;
    assert!(
        peer_ids(&c).await.contains(&a.peer_id),
        "a live node was forgotten"
    );
    assert_eq!(c.routes_of(&a).await, ["geo/a/#"]);
    assert_eq!(
        metric(&c.metrics().await, "meridian_peers_forgotten_total"),
        1.0
    );

    a.daemon.kill9();
    wait_for("c to forget a by itself", &[&c], || async {
        !peer_ids(&c).await.contains(&a.peer_id)
    })
    .await;
    assert!(c.routes_of(&a).await.is_empty());
    assert_eq!(
        metric(&c.metrics().await, "meridian_peers_forgotten_total"),
        2.0
    );
    assert!(c.log().contains("Expired"), "{}", c.log());
    let reasons = publish_v5(c.mqtt(), "pub", "geo/a/x", 10).await;
    assert!(reasons.iter().all(|r| *r == 0), "{reasons:?}");
}

fn publish(topic: &str, qos: rumqttc::QoS) -> Publish {
    let qos = match qos {
        rumqttc::QoS::AtMostOnce => meridian_core::codec::QoS::AtMostOnce,
        rumqttc::QoS::AtLeastOnce => meridian_core::codec::QoS::AtLeastOnce,
        rumqttc::QoS::ExactlyOnce => meridian_core::codec::QoS::ExactlyOnce,
    };
    Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.into(),
        packet_id: (qos != meridian_core::codec::QoS::AtMostOnce).then_some(1),
        payload: bytes::Bytes::from_static(b"forged"),
        properties: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_the_key_that_forges_other_nodes_state_changes_nothing() {
    let (a, c, _link, dir) = two_regions().await;
    let mut sub = v3::connect(v3::options("sub-a", a.mqtt())).await;
    sub.subscribe("geo/a/#", QoS::ExactlyOnce).await;
    wait_for("c to learn a's route", &[&a, &c], || async {
        c.routes_of(&a).await == ["geo/a/#"]
    })
    .await;

    let Forger {
        mesh,
        writers,
        cmds: cmd_tx,
        ..
    } = Forger::start(dir.path(), &[&a, &c]).await;

    let stolen = Frame::RouteDelta(RouteDelta {
        owner: owner(&a.peer_id, u64::MAX),
        after: 0,
        changes: vec![RouteChange {
            version: 1,
            filter: "geo/stolen/#".into(),
            op: RouteOp::Add,
        }],
        hash: meridian_core::routes::set_hash(["geo/stolen/#"]),
    });
    let blackhole = Frame::SnapshotChunk(SnapshotChunk {
        owner: owner(&a.peer_id, u64::MAX),
        version: u64::MAX,
        hash: 0,
        index: 0,
        count: 1,
        filters: Vec::new(),
    });
    let frozen = Frame::Retained(RetainedUpdate {
        topic: "geo/a/state".into(),
        stamp: Stamp {
            hlc: Hlc {
                wall_ms: u64::MAX,
                logical: u32::MAX,
            },
            node: NodeId::new(&a.peer_id).unwrap(),
        },
        message: Some(publish("geo/a/state", QoS::AtMostOnce)),
    });
    // Forwards as if from c, numbered far ahead: genuine ones must not look like duplicates.
    let poison = Frame::Forward(Forward {
        origin: owner(&c.peer_id, 1),
        seq: u64::MAX - 1,
        message: publish("geo/a/poison", QoS::ExactlyOnce),
    });
    let to_c = &writers[&c.peer_id];
    for frame in [&stolen, &blackhole, &frozen] {
        to_c.send(encode(frame)).expect("session open");
    }
    let to_a = &writers[&a.peer_id];
    for incarnation in 0..4 {
        let mut f = poison.clone();
        if let Frame::Forward(fw) = &mut f {
            fw.origin.incarnation = incarnation;
        }
        to_a.send(encode(&f)).expect("session open");
    }
    // And by gossip: a route delta in a's name, and a forward (a kind gossip never carries),
    // sent again until the forger's gossip mesh has formed and a and c have refused them.
    let metrics_of = |port: u16| async move { common::http(port, "GET", "/metrics").await.1 };
    let not_owner = "meridian_peer_frames_refused_total{reason=\"not_owner\"}";
    let gossip_refused = "meridian_p2p_gossip_refused_total";
    wait_for("a and c to refuse the forgeries", &[&a, &c], || {
        let cmd = cmd_tx.clone();
        let (stolen, poison) = (encode(&stolen), encode(&poison));
        let (pa, pc) = (a.daemon.admin, c.daemon.admin);
        async move {
            let _ = cmd.send(MeshCmd::Gossip(stolen)).await;
            let _ = cmd.send(MeshCmd::Gossip(poison)).await;
            let (ma, mc) = (metrics_of(pa).await, metrics_of(pc).await);
            // c: three by its session and the gossiped delta; a: four by its session and the
            // gossiped delta; both: the gossiped forward.
            metric(&mc, not_owner) >= 4.0
                && metric(&ma, not_owner) >= 5.0
                && metric(&mc, gossip_refused) >= 1.0
                && metric(&ma, gossip_refused) >= 1.0
        }
    })
    .await;

    // Nothing changed: c routes to a as before, and genuine QoS 2 messages arrive once each.
    assert_eq!(c.routes_of(&a).await, ["geo/a/#"]);
    let publisher = v3::connect(v3::options("pub-c", c.mqtt())).await;
    for i in 0..20u32 {
        publisher
            .client
            .publish("geo/a/x", QoS::ExactlyOnce, false, i.to_be_bytes().to_vec())
            .await
            .unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 20 {
        let p = next_publish(&mut sub, |p| p.topic == "geo/a/x").await;
        got.push(u32::from_be_bytes(p.payload[..4].try_into().unwrap()));
    }
    assert_eq!(
        got,
        (0..20).collect::<Vec<_>>(),
        "every one, once, in order"
    );
    let stray = tokio::time::timeout(Duration::from_millis(300), async {
        next_publish(&mut sub, |p| p.topic != "geo/a/x").await
    })
    .await;
    assert!(stray.is_err(), "a forged message was delivered: {stray:?}");
    assert!(
        c.log().contains("refused a frame from a peer"),
        "{}",
        c.log()
    );
    mesh.shutdown().await;
}

/// A policy stream message: tag (0 sync, 1 whole document), epoch, body; framed with its
/// length.
fn policy_frame(tag: u8, epoch: u64, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    let len = u32::try_from(1 + 8 + body.len()).unwrap();
    m.extend_from_slice(&len.to_be_bytes());
    m.push(tag);
    m.extend_from_slice(&epoch.to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn uleb(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let byte = u8::try_from(n & 0x7f).unwrap();
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// An automerge chunk of `kind` (0 document, 2 compressed change) around `data`.
fn automerge_chunk(kind: u8, data: &[u8]) -> Vec<u8> {
    let mut c = vec![0x85, 0x6f, 0x4a, 0x83, 0, 0, 0, 0, kind];
    uleb(data.len(), &mut c);
    c.extend_from_slice(data);
    c
}

/// 64 MiB of zeros, deflated (a few tens of KiB).
fn deflate_bomb() -> Vec<u8> {
    use std::io::Read as _;
    let zeros = std::io::repeat(0).take(64 << 20);
    let mut out = Vec::new();
    flate2::bufread::DeflateEncoder::new(
        std::io::BufReader::new(zeros),
        flate2::Compression::best(),
    )
    .read_to_end(&mut out)
    .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_the_key_that_sends_malformed_policy_sync_changes_nothing() {
    // c takes policy documents up to 1 MiB: what compressed parts inflate to is held to 8 MiB.
    let (a, c, _link, dir) = two_regions_with("[policy]\nmax_document_bytes = 1048576\n").await;
    let forger = Forger::start(dir.path(), &[&c]).await;
    let c_peer: libp2p::PeerId = c.peer_id.parse().unwrap();

    let bomb = deflate_bomb();
    // A bloom filter of 0 bits per entry: automerge's next message divides by zero.
    let zero_bits = vec![0x42, 0, 0, 1, 0, 3, 1, 0, 1, 0];
    // One of u32::MAX probes: 16 GiB of them.
    let probes = vec![
        0x42, 0, 0, 1, 0, 9, 1, 10, 0xff, 0xff, 0xff, 0xff, 0x0f, 0xff, 0xff, 0,
    ];
    // A compressed change that inflates to 64 MiB.
    let mut inflating_change = vec![0x42, 0, 0, 0, 1];
    let chunk = automerge_chunk(2, &bomb);
    uleb(chunk.len(), &mut inflating_change);
    inflating_change.extend_from_slice(&chunk);
    // A whole document of a later epoch whose one column inflates to 64 MiB.
    let mut document = vec![0, 0, 1, 0b1000];
    uleb(bomb.len(), &mut document);
    document.push(0);
    document.extend_from_slice(&bomb);
    let inflating_document = automerge_chunk(0, &document);
    let messages = [
        policy_frame(0, 0, &zero_bits),
        policy_frame(0, 0, &probes),
        policy_frame(0, 0, &inflating_change),
        policy_frame(1, 1, &inflating_document),
        policy_frame(0, 0, &[0x42, 0xff, 0xff, 0xff]),
    ];
    for (i, message) in messages.iter().enumerate() {
        let mut stream = forger
            .mesh
            .streams
            .clone()
            .open_stream(c_peer, meridian_daemon::testing::POLICY_PROTOCOL)
            .await
            .expect("c takes a policy stream");
        use futures_util::io::{AsyncReadExt as _, AsyncWriteExt as _};
        stream.write_all(message).await.expect("written");
        stream.flush().await.expect("flushed");
        // c answers with its own sync message, then ends the stream.
        let mut sink = Vec::new();
        let ended = tokio::time::timeout(MESH_DEADLINE, stream.read_to_end(&mut sink)).await;
        assert!(
            ended.is_ok(),
            "c did not end the policy stream of message {i}"
        );
    }

    let metrics = c.metrics().await;
    assert_eq!(
        metric(&metrics, "meridian_policy_sync_refused_total"),
        5.0,
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "meridian_policy_task_restarts_total"), 0.0);
    // c's policy task lives on and syncs with a both ways.
    let rules_of = |admin: u16| async move {
        let (_, body) = common::http(admin, "GET", "/api/policy").await;
        body
    };
    assert!(
        ctl(
            a.daemon.admin,
            &["acl", "add", "deny", "subscribe", "from-a/#"]
        )
        .0
    );
    assert!(
        ctl(
            c.daemon.admin,
            &["acl", "add", "deny", "subscribe", "from-c/#"]
        )
        .0
    );
    wait_for("both rules at both nodes", &[&a, &c], || async {
        let (pa, pc) = (
            rules_of(a.daemon.admin).await,
            rules_of(c.daemon.admin).await,
        );
        [pa, pc]
            .iter()
            .all(|p| p.contains("from-a/#") && p.contains("from-c/#"))
    })
    .await;
    assert!(
        c.log().contains("policy sync refused"),
        "{}",
        tail(&c.log(), 40)
    );
    forger.mesh.shutdown().await;
}

/// `extra`, a connection past a bound of `node`'s p2p listener, is closed at once, and the
/// refusal counted.
async fn closed_at_once_and_counted(node: &Node, mut extra: tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt as _;
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(MESH_DEADLINE, extra.read(&mut byte)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "the connection past the bound is closed: {closed:?}"
    );
    wait_for("the refusal to be counted", &[node], || async {
        metric(
            &node.metrics().await,
            "meridian_p2p_refused_connections_total{reason=\"limit\"}",
        ) >= 1.0
    })
    .await;
}

/// Connections a stranger opens to the p2p port count against its address from the start:
/// past the address's share they are closed at once, and counted; once they end, a node from
/// the same address gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2p_connections_past_an_address_s_share_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pc) = (free_port(), free_port());
    let a = Node::start_with(
        "euc1",
        pa,
        &[],
        &key,
        "max_peer_connections_per_address = 3\n",
    )
    .await;
    // Three sockets that never start the handshake hold the address's share.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            tokio::net::TcpStream::connect(("127.0.0.1", pa))
                .await
                .unwrap(),
        );
    }
    let extra = tokio::net::TcpStream::connect(("127.0.0.1", pa))
        .await
        .unwrap();
    closed_at_once_and_counted(&a, extra).await;
    drop(held);
    let c = Node::start_with("afs1", pc, &[pa], &key, "").await;
    wait_for("c to link once the sockets are gone", &[&a, &c], || async {
        a.connected_to(&c).await && c.connected_to(&a).await
    })
    .await;
}

/// Past `cluster.max_peer_connections` in total, connections to the p2p port are closed at
/// once and counted, whichever addresses they come from; once some end, a node gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2p_connections_past_the_total_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pc) = (free_port(), free_port());
    let a = Node::start_with("euc1", pa, &[], &key, "max_peer_connections = 3\n").await;
    // From three addresses, one socket each, none starting the handshake: the total is held.
    let from = |n: u8| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, n], 0)))
            .unwrap();
        socket
            .connect(std::net::SocketAddr::from(([127, 0, 0, 1], pa)))
            .await
            .unwrap()
    };
    let mut held = Vec::new();
    for n in 2..5 {
        held.push(from(n).await);
    }
    closed_at_once_and_counted(&a, from(5).await).await;
    drop(held);
    let c = Node::start_with("afs1", pc, &[pa], &key, "").await;
    wait_for("c to link once the sockets are gone", &[&a, &c], || async {
        a.connected_to(&c).await && c.connected_to(&a).await
    })
    .await;
}
