//! Members that leave and peers that cannot lie, with real `meridian` processes: a node killed
//! for good never holds the others' publishers back and is forgotten (by `meridian ctl` and by
//! expiry); a peer holding the cluster key that forges another node's routes, forwards and
//! retained writes changes nothing.

mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::mesh::*;
use common::{free_port, v3, v5};
use meridian_core::codec::Publish;
use meridian_core::link::{self, Forward, Frame, RetainedUpdate};
use meridian_core::retained::{Hlc, Stamp};
use meridian_core::routes::{NodeId, Owner, RouteChange, RouteDelta, RouteOp, SnapshotChunk};
use meridian_daemon::testing::{
    LinkEvent, LinkLimits, MeshCmd, MeshSettings, MeshStats, ToEngine, load_cluster_key, start_mesh,
};
use rumqttc::QoS;
use tokio::sync::mpsc;

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

fn owner(node: &str, incarnation: u64) -> Owner {
    Owner {
        node: NodeId::new(node).unwrap(),
        incarnation,
    }
}

fn encode(frame: &Frame) -> bytes::Bytes {
    let mut out = BytesMut::new();
    link::encode(frame, &mut out).expect("frame encodes");
    out.freeze()
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

    // The forger: a node of its own, built from the daemon's mesh, holding the cluster key,
    // connected to both a and c.
    let node_port = |n: &Node| {
        format!("/ip4/127.0.0.1/tcp/{}", n.p2p)
            .parse::<libp2p::Multiaddr>()
            .expect("multiaddr")
    };
    let settings = MeshSettings {
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
        bootstrap: vec![node_port(&a), node_port(&c)],
        cluster_key: load_cluster_key(&dir.path().join("cluster.key")).unwrap(),
        allow: Vec::new(),
        ping_interval: Duration::from_secs(1),
        redial_min: Duration::from_millis(50),
        redial_max: Duration::from_secs(1),
        discover: false,
        advertise: Vec::new(),
        announce_every: Duration::from_secs(10),
        link_limits: LinkLimits::default(),
        policy: None,
    };
    let (engine_tx, mut engine_rx) = mpsc::channel(1024);
    let (cmd_tx, cmd_rx) = mpsc::channel(64);
    let keypair = libp2p::identity::Keypair::generate_ed25519();
    let mesh = start_mesh(
        settings,
        keypair,
        engine_tx,
        cmd_rx,
        std::sync::Arc::new(MeshStats::default()),
        "forger",
    )
    .await
    .expect("the forger's mesh starts");
    // Its link sessions to a and c, as the broker task would get them.
    let mut writers = std::collections::HashMap::new();
    tokio::time::timeout(MESH_DEADLINE, async {
        while writers.len() < 2 {
            if let Some(ToEngine::Link(LinkEvent::PeerUp { peer, writer, .. })) =
                engine_rx.recv().await
            {
                writers.insert(peer.to_string(), writer);
            }
        }
    })
    .await
    .expect("the forger's sessions open");
    // Keep reading what a and c send it (hellos, digests), as a peer does.
    tokio::spawn(async move { while engine_rx.recv().await.is_some() {} });

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
