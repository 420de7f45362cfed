//! Regions meshed over libp2p: real `meridian` processes on loopback, every link between two
//! of them through a fault-injecting proxy (latency, cuts), real MQTT clients (rumqttc).

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::mesh::*;
use common::{DEADLINE, Daemon, free_port, http, v3};
use meridian_tools::link_proxy::LinkProxy as Proxy;
use rumqttc::{Packet, QoS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_goes_only_to_the_region_that_wants_it_and_stops_after_unsubscribe() {
    let t = three_regions().await;
    let (a, b, c) = (&t.a, &t.b, &t.c);

    let mut sub = v3::connect(v3::options("sub-a", a.mqtt())).await;
    sub.subscribe("geo/a/#", QoS::AtLeastOnce).await;
    wait_for("a's route at c", &[a, c], || async {
        c.routes_of(a).await == ["geo/a/#"]
    })
    .await;

    let mut publ = v3::connect(v3::options("pub-c", c.mqtt())).await;
    const N: usize = 100;
    for i in 0..N {
        publ.client
            .publish(format!("geo/a/{i}"), QoS::AtLeastOnce, false, i.to_string())
            .await
            .unwrap();
    }
    // Local delivery at c and routing are done once every PUBACK is in.
    for _ in 0..N {
        publ.expect(|p| matches!(p, Packet::PubAck(_)).then_some(()))
            .await;
    }
    for i in 0..N {
        let p = sub.publish_msg().await;
        assert_eq!(p.topic, format!("geo/a/{i}"), "in order, each once");
        assert_eq!(&p.payload[..], i.to_string().as_bytes());
    }
    assert_eq!(
        c.peer_metric("meridian_forward_sent_messages_total", a)
            .await,
        N as f64
    );
    assert_eq!(
        c.peer_metric("meridian_forward_sent_messages_total", b)
            .await,
        0.0
    );
    assert_eq!(
        b.peer_metric("meridian_forward_received_messages_total", c)
            .await,
        0.0
    );
    assert_eq!(
        a.peer_metric("meridian_forward_received_messages_total", c)
            .await,
        N as f64
    );

    // After the unsubscribe reaches c, c stops forwarding.
    sub.client.unsubscribe("geo/a/#").await.unwrap();
    sub.expect(|p| matches!(p, Packet::UnsubAck(_)).then_some(()))
        .await;
    wait_for("a's route gone at c", &[a, c], || async {
        c.routes_of(a).await.is_empty()
    })
    .await;
    for i in 0..10 {
        publ.client
            .publish(format!("geo/a/late/{i}"), QoS::AtLeastOnce, false, "x")
            .await
            .unwrap();
        publ.expect(|p| matches!(p, Packet::PubAck(_)).then_some(()))
            .await;
    }
    assert_eq!(
        c.peer_metric("meridian_forward_sent_messages_total", a)
            .await,
        N as f64
    );
    assert_eq!(
        c.peer_metric("meridian_forward_sent_messages_total", b)
            .await,
        0.0
    );
    // Per-peer gauges are there for operators.
    let page = c.metrics().await;
    for name in [
        "meridian_peer_connected",
        "meridian_peer_rtt_seconds",
        "meridian_peer_routes",
        "meridian_peer_route_lag",
        "meridian_peer_outbox_messages",
        "meridian_peer_outbox_bytes",
    ] {
        assert!(
            page.contains(&format!("{name}{{peer=\"{}\",region=\"euc1\"}}", a.peer_id)),
            "{name} missing:\n{page}"
        );
    }
    drop(t);
}

/// Connect `n` clients to `port`, each subscribing to its own wildcard filter under `prefix`;
/// returns the time until every SUBACK, and the clients.
async fn subscribe_many(port: u16, prefix: &str, n: usize) -> (Duration, Vec<v3::Client>) {
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let filter = format!("{prefix}/+/{i}/sub/+/#");
            let id = format!("{prefix}-{i}");
            tokio::spawn(async move {
                let mut opts = v3::options(&id, port);
                opts.set_keep_alive(Duration::from_secs(60));
                let mut client = v3::connect(opts).await;
                let codes = client.subscribe(&filter, QoS::AtMostOnce).await;
                assert_eq!(codes.len(), 1);
                client
            })
        })
        .collect();
    let mut clients = Vec::with_capacity(n);
    for t in tasks {
        clients.push(t.await.expect("subscriber task"));
    }
    (start.elapsed(), clients)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_subscribers_get_local_subacks_whatever_the_link_latency() {
    let (a, c, link, _dir) = two_regions().await;

    const N: usize = 1000;
    let mut report = Vec::new();
    let mut keep = Vec::new();
    for (round, one_way_ms) in [(0, 0u64), (1, 100)] {
        link.set_one_way_latency(one_way_ms);
        let prefix = format!("t/mqttx{round}");
        let (subacks, clients) = subscribe_many(a.mqtt(), &prefix, N).await;
        let start = Instant::now();
        wait_for("every route at c", &[&a, &c], || async {
            c.routes_of(&a)
                .await
                .iter()
                .filter(|f| f.starts_with(&format!("{prefix}/")))
                .count()
                == N
        })
        .await;
        let converged = start.elapsed();
        let routes = c.routes_of(&a).await;
        for i in 0..N {
            assert!(
                routes.contains(&format!("{prefix}/+/{i}/sub/+/#")),
                "route {i} missing at c"
            );
        }
        report.push((2 * one_way_ms, subacks, converged));
        keep.extend(clients);
    }
    // Timings are reported (`--nocapture`), not asserted.
    for (rtt, subacks, converged) in &report {
        eprintln!(
            "link RTT {rtt} ms: {N} clients connected and subscribed at a in {:.0} ms; \
             routes at c {:.0} ms after the last SUBACK",
            subacks.as_secs_f64() * 1000.0,
            converged.as_secs_f64() * 1000.0
        );
    }
    for client in keep {
        client.abort();
    }
}

/// A link thinner than the QoS 0 stream sent across it: past its mark the sending node drops
/// QoS 0 forwards to that region and counts them, instead of letting the link's queue fill until
/// the session is cut; QoS 1 messages still cross, and the session stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qos0_flood_over_a_thin_link_is_dropped_and_the_session_stays_up() {
    const DROPPED: &str = "meridian_messages_dropped_total{reason=\"peer_congested\"}";
    let (a, c, link, _dir) = two_regions().await;
    let mut sub = v3::connect(v3::options("far-sub", a.mqtt())).await;
    sub.subscribe("flood/#", QoS::AtMostOnce).await;
    sub.subscribe("keep/#", QoS::AtLeastOnce).await;
    wait_for("the routes at c", &[&a, &c], || async {
        c.routes_of(&a).await.len() == 2
    })
    .await;

    // 500 kB/s from c to a; the publisher at c sends small messages as fast as it can, so that
    // one read of the broker's holds hundreds of them.
    link.set_bandwidth(500_000);
    let publ = v3::connect(v3::options("near-pub", c.mqtt())).await;
    let payload = vec![7u8; 32];
    let flood = async |n: usize| {
        for _ in 0..n {
            publ.client
                .publish("flood/x", QoS::AtMostOnce, false, payload.clone())
                .await
                .unwrap();
        }
    };
    let deadline = Instant::now() + MESH_DEADLINE;
    while metric(&c.metrics().await, DROPPED) == 0.0 {
        assert!(
            Instant::now() < deadline,
            "QoS 0 forwards never dropped\n{}",
            tail(&c.log(), 40)
        );
        flood(1000).await;
    }
    // Then four times what the link's whole queue holds (16,384 frames), which would cut the
    // session if it were queued.
    flood(64_000).await;
    publ.client
        .publish("keep/x", QoS::AtLeastOnce, false, "across")
        .await
        .unwrap();
    // Everything queued before it crosses first.
    let got = next_publish(&mut sub, |p| p.topic == "keep/x").await;
    assert_eq!(&got.payload[..], b"across");
    let page = c.metrics().await;
    assert!(metric(&page, DROPPED) > 0.0);
    assert_eq!(metric(&page, "meridian_link_sessions_cut_total"), 0.0);
    assert_eq!(link.connections(), 1, "the session was never replaced");
    assert!(c.connected_to(&a).await);

    // The link drained: QoS 0 crosses again, and nothing more is dropped.
    let dropped = metric(&c.metrics().await, DROPPED);
    publ.client
        .publish("flood/x", QoS::AtMostOnce, false, "after")
        .await
        .unwrap();
    let got = next_publish(&mut sub, |p| &p.payload[..] == b"after").await;
    assert_eq!(got.topic, "flood/x");
    assert_eq!(metric(&c.metrics().await, DROPPED), dropped);
}

/// The link's marks are the operator's (`cluster.link_*`): with room for a burst six times
/// the default congestion mark, a thin link carries all of it, late but whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_with_room_for_a_burst_carries_all_of_it() {
    const N: usize = 6 * 1024;
    let roomy = "link_queue_frames = 65536\nlink_congested_bytes = 67108864\n";
    let (a, c, link, _dir) = two_regions_with(roomy).await;
    let mut sub = v3::connect(v3::options("far-sub", a.mqtt())).await;
    sub.subscribe("burst/#", QoS::AtMostOnce).await;
    wait_for("the route at c", &[&a, &c], || async {
        c.routes_of(&a).await.len() == 1
    })
    .await;

    // 6 MiB in 1 KiB messages, published far faster than the link's 2 MB/s: the default mark
    // (4 MiB) would drop the tail of it.
    link.set_bandwidth(2_000_000);
    let publ = v3::connect(v3::options("near-pub", c.mqtt())).await;
    for i in 0..N {
        let mut payload = vec![0u8; 1024];
        payload[..8].copy_from_slice(&(i as u64).to_be_bytes());
        publ.client
            .publish("burst/x", QoS::AtMostOnce, false, payload)
            .await
            .unwrap();
    }
    for i in 0..N {
        let p = next_publish(&mut sub, |p| p.topic == "burst/x").await;
        let got = u64::from_be_bytes(p.payload[..8].try_into().unwrap());
        assert_eq!(got, i as u64, "in order, none missing");
    }
    let page = c.metrics().await;
    assert_eq!(
        metric(
            &page,
            "meridian_messages_dropped_total{reason=\"peer_congested\"}"
        ),
        0.0
    );
    assert_eq!(metric(&page, "meridian_link_sessions_cut_total"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos1_and_qos2_survive_a_cut_link_and_a_killed_publisher_node() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pc) = (free_port(), free_port());
    let link = Proxy::start(pa).await.unwrap();
    let a = Node::start("euc1", pa, &[], &key).await;
    let mut c = Node::start("afs1", pc, &[link.port], &key).await;
    wait_for("the link", &[&a, &c], || async {
        a.connected_to(&c).await && c.connected_to(&a).await
    })
    .await;

    // A persistent subscriber at a, for both QoS levels.
    let mut opts = v3::options("sub-a", a.mqtt());
    opts.set_clean_session(false);
    let mut sub = v3::connect(opts).await;
    sub.subscribe("f/#", QoS::ExactlyOnce).await;
    wait_for("a's route at c", &[&a, &c], || async {
        c.routes_of(&a).await == ["f/#"]
    })
    .await;

    let mut publ = v3::connect(v3::options("pub-c", c.mqtt())).await;
    // Publish one message per topic and QoS, in turn, and wait for its ack (PUBACK or
    // PUBCOMP): from then on, the message must arrive.
    async fn publish_acked(publ: &mut v3::Client, i: usize) {
        publ.client
            .publish("f/q1", QoS::AtLeastOnce, false, i.to_string())
            .await
            .unwrap();
        publ.expect(|p| matches!(p, Packet::PubAck(_)).then_some(()))
            .await;
        publ.client
            .publish("f/q2", QoS::ExactlyOnce, false, i.to_string())
            .await
            .unwrap();
        publ.expect(|p| matches!(p, Packet::PubComp(_)).then_some(()))
            .await;
    }
    let mut sent = 0;
    for _ in 0..50 {
        publish_acked(&mut publ, sent).await;
        sent += 1;
    }
    // Cut the link mid-stream: c keeps accepting, holding the forwards in its outbox.
    link.cut();
    wait_for("c to see the link down", &[&a, &c], || async {
        !c.connected_to(&a).await
    })
    .await;
    for _ in 0..50 {
        publish_acked(&mut publ, sent).await;
        sent += 1;
    }
    let waiting = c
        .peers()
        .await
        .iter()
        .find(|p| p["peer_id"] == a.peer_id.as_str())
        .map(|p| p["outbox_messages"].as_u64().unwrap_or(0))
        .unwrap_or(0);
    assert!(
        waiting > 0,
        "forwards wait in c's outbox while the link is cut"
    );

    // kill -9 the publisher's node with its outbox full, restart it, restore the link.
    publ.abort();
    c.daemon.kill9();
    c.daemon.restart();
    c.peer_id = node_info(c.daemon.admin).await["peer_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut publ = v3::connect(v3::options("pub-c", c.mqtt())).await;
    for _ in 0..20 {
        publish_acked(&mut publ, sent).await;
        sent += 1;
    }
    link.restore();

    // Every acknowledged message arrives: QoS 2 exactly once, QoS 1 at least once, in order.
    let mut got: HashMap<String, Vec<usize>> = HashMap::new();
    let deadline = Instant::now() + MESH_DEADLINE;
    while got.get("f/q2").map_or(0, Vec::len) < sent || dedup_count(got.get("f/q1")) < sent {
        assert!(
            Instant::now() < deadline,
            "timed out: got {:?} of {sent}\n{}",
            got.iter().map(|(t, v)| (t, v.len())).collect::<Vec<_>>(),
            tail(&c.log(), 40)
        );
        let p = match tokio::time::timeout(DEADLINE, sub.rx.recv()).await {
            Ok(Some(p)) => p,
            Ok(None) => panic!("subscriber connection ended"),
            Err(_) => panic!(
                "nothing arrived for {DEADLINE:?}: got {:?} of {sent}\n--- a\n{}\n--- c\n{}",
                got.iter().map(|(t, v)| (t, v.len())).collect::<Vec<_>>(),
                tail(&a.log(), 40),
                tail(&c.log(), 60)
            ),
        };
        if let Packet::Publish(p) = p {
            let i: usize = std::str::from_utf8(&p.payload).unwrap().parse().unwrap();
            got.entry(p.topic.clone()).or_default().push(i);
        }
    }
    let q2 = &got["f/q2"];
    assert_eq!(
        *q2,
        (0..sent).collect::<Vec<_>>(),
        "QoS 2: each exactly once, in order"
    );
    let mut q1 = got["f/q1"].clone();
    q1.dedup();
    assert_eq!(
        q1,
        (0..sent).collect::<Vec<_>>(),
        "QoS 1: each at least once, in order"
    );
    sub.abort();
}

fn dedup_count(v: Option<&Vec<usize>>) -> usize {
    let mut v = v.cloned().unwrap_or_default();
    v.dedup();
    v.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_replaces_its_old_routes_everywhere() {
    let t = three_regions().await;
    let (a, b, c) = (&t.a, &t.b, &t.c);
    let mut sub = v3::connect(v3::options("old", a.mqtt())).await;
    sub.subscribe("inc/old/#", QoS::AtMostOnce).await;
    for other in [b, c] {
        wait_for("a's route everywhere", &[a, other], || async {
            other.routes_of(a).await == ["inc/old/#"]
        })
        .await;
    }
    sub.abort();
    let mut t = t;
    t.a.daemon.kill9();
    t.a.daemon.restart();
    let (a, b, c) = (&t.a, &t.b, &t.c);
    let mut sub = v3::connect(v3::options("new", a.mqtt())).await;
    sub.subscribe("inc/new/#", QoS::AtMostOnce).await;
    for other in [b, c] {
        wait_for(
            "the new incarnation's routes everywhere",
            &[a, other],
            || async { other.routes_of(a).await == ["inc/new/#"] },
        )
        .await;
    }
    sub.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_the_cluster_key_or_not_allowed_cannot_join() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let other_key = cluster_key(dir.path(), "other.key");
    let pa = free_port();

    // b starts first (a is not up yet: b keeps dialling), and is on a's allowlist.
    let b = Node::start("ape1", free_port(), &[pa], &key).await;
    let a = Node::start_with(
        "euc1",
        pa,
        &[],
        &key,
        &format!("allow_peers = [\"{}\"]\n", b.peer_id),
    )
    .await;
    wait_for("b joining a", &[&a, &b], || async {
        a.connected_to(&b).await
    })
    .await;

    // d has another key: it cannot complete a handshake.
    let d = Node::start("afs1", free_port(), &[pa], &other_key).await;
    wait_for("a refusing d's handshake", &[&a, &d], || async {
        metric(
            &a.metrics().await,
            "meridian_p2p_refused_connections_total{reason=\"handshake\"}",
        ) >= 1.0
    })
    .await;
    assert!(d.peers().await.is_empty());
    assert!(
        a.log().contains("failed the handshake"),
        "refusal is logged"
    );

    // e has the key but is not on a's allowlist.
    let e = Node::start("usw2", free_port(), &[pa], &key).await;
    wait_for("a refusing e (not allowed)", &[&a, &e], || async {
        metric(
            &a.metrics().await,
            "meridian_p2p_refused_connections_total{reason=\"not_allowed\"}",
        ) >= 1.0
    })
    .await;
    assert!(
        a.log().contains("not on the allowlist"),
        "refusal is logged"
    );
    let known: Vec<String> = a
        .peers()
        .await
        .iter()
        .filter(|p| p["connected"] == true)
        .map(|p| p["peer_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(known, std::slice::from_ref(&b.peer_id), "only b is in");
}

/// Two nodes that each list only a first one meet by discovery, at the addresses they
/// advertise (each a proxy in front of it, as a NAT would be); a message crosses between them
/// directly. When the link between the two breaks for longer than a discovered peer is kept
/// unannounced, they meet again once it is back, since the first still announces both. A node
/// that is gone for good is forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_list_one_peer_meet_the_others_by_discovery() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let (front_b, front_c) = (
        Proxy::start(pb).await.unwrap(),
        Proxy::start(pc).await.unwrap(),
    );
    let a = Node::start_discovering("euc1", pa, &[], &key, None).await;
    let b = Node::start_discovering("ape1", pb, &[pa], &key, Some(front_b.port)).await;
    let c = Node::start_discovering("afs1", pc, &[pa], &key, Some(front_c.port)).await;
    wait_for("b and c to meet", &[&a, &b, &c], || async {
        b.connected_to(&c).await && c.connected_to(&b).await
    })
    .await;
    assert!(
        front_b.connections() + front_c.connections() >= 1,
        "b and c met at an advertised address, not at their listen addresses"
    );
    for n in [&a, &b, &c] {
        wait_for("each to know the other two", &[n], || async {
            metric(&n.metrics().await, "meridian_p2p_discovered_peers") == 2.0
        })
        .await;
    }
    let (status, body) = http(c.daemon.admin, "GET", "/api/discovery").await;
    assert_eq!(status, 200, "{body}");
    let known: serde_json::Value = serde_json::from_str(&body).unwrap();
    let b_there = known
        .as_array()
        .and_then(|k| k.iter().find(|p| p["peer_id"] == b.peer_id.as_str()))
        .unwrap_or_else(|| panic!("b in c's /api/discovery: {body}"));
    assert_eq!(
        b_there["addrs"],
        serde_json::json!([format!("/ip4/127.0.0.1/tcp/{}", front_b.port)]),
        "{body}"
    );
    assert_eq!(b_there["connected"], true);

    let mut sub = v3::connect(v3::options("sub-b", b.mqtt())).await;
    sub.subscribe("meet/+", QoS::AtLeastOnce).await;
    wait_for("c to route to b", &[&b, &c], || async {
        c.routes_of(&b).await == ["meet/+"]
    })
    .await;
    let publ = v3::connect(v3::options("pub-c", c.mqtt())).await;
    publ.client
        .publish("meet/1", QoS::AtLeastOnce, false, "across")
        .await
        .unwrap();
    let p = next_publish(&mut sub, |p| p.topic == "meet/1").await;
    assert_eq!(&p.payload[..], b"across");
    assert_eq!(
        c.peer_metric("meridian_forward_sent_messages_total", &b)
            .await,
        1.0,
        "c forwarded to b itself"
    );

    // Cut b <-> c only, until b has failed to dial c five times (four seconds, more than the
    // three announcement intervals after which a peer no one announces is forgotten).
    const FAILURES: &str = "meridian_p2p_dial_failures_total";
    let failed = metric(&b.metrics().await, FAILURES);
    front_b.cut();
    front_c.cut();
    wait_for("b to fail to dial c five times", &[&a, &b, &c], || async {
        metric(&b.metrics().await, FAILURES) >= failed + 5.0
    })
    .await;
    assert!(!b.connected_to(&c).await);
    assert_eq!(
        metric(&b.metrics().await, "meridian_p2p_discovered_peers"),
        2.0,
        "a still announces c"
    );
    front_b.restore();
    front_c.restore();
    wait_for("b and c to meet again", &[&a, &b, &c], || async {
        b.connected_to(&c).await && c.connected_to(&b).await
    })
    .await;

    drop(publ);
    let Node { daemon, .. } = c;
    drop(daemon);
    wait_for("b to forget c", &[&a, &b], || async {
        metric(&b.metrics().await, "meridian_p2p_discovered_peers") == 1.0
    })
    .await;
    assert!(b.log().contains("discovered peer forgotten"));
}

/// `meridian peer-id --data-dir DIR`.
fn peer_id_of(data_dir: &Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meridian"))
        .arg("peer-id")
        .arg("--data-dir")
        .arg(data_dir)
        .output()
        .expect("run meridian peer-id");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_contract_joins_nodes_and_bootstrap_peers_may_come_up_later() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pb) = (free_port(), free_port());
    // a starts first, dialling b by name, and b is not up yet.
    let a = Daemon::start_with(
        None,
        [
            "--region",
            "euc1",
            "--p2p",
            &format!("/ip4/127.0.0.1/tcp/{pa}"),
            "--peer",
            &format!("/dns4/localhost/tcp/{pb}"),
            "--cluster-key",
            key.to_str().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec(),
    );
    let b = Daemon::start_with(
        None,
        [
            "--region",
            "ape1",
            "--p2p",
            &format!("/ip4/127.0.0.1/tcp/{pb}"),
            "--cluster-key",
            key.to_str().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec(),
    );
    let joined = || async {
        let (_, body) = http(b.admin, "GET", "/api/peers").await;
        let peers: serde_json::Value = serde_json::from_str(&body).unwrap();
        peers.as_array().is_some_and(|p| {
            p.iter()
                .any(|p| p["connected"] == true && p["region"] == "euc1")
        })
    };
    poll_until(
        "a to join b",
        Duration::from_millis(25),
        || a.log_text(),
        joined,
    )
    .await;
    let info = node_info(b.admin).await;
    assert_eq!(info["region"], "ape1");
    assert_eq!(info["peer_id"].as_str().unwrap(), peer_id_of(&b.data_dir));
}

#[test]
fn clustering_without_a_key_is_refused_with_the_key_named() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args([
            "run",
            "--p2p",
            "/ip4/127.0.0.1/tcp/0",
            "--mqtt",
            "127.0.0.1:0",
        ])
        .output()
        .expect("run meridian");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cluster.key_file"), "{err}");
}

/// The EMQX geo-distribution write-up's scenarios with real processes: nodes in Frankfurt,
/// Hong Kong and Cape Town, links through proxies with the write-up's round trips (Frankfurt–
/// Cape Town 160 ms, Frankfurt–Hong Kong 200 ms; Hong Kong–Cape Town 320 ms, as in the
/// simulator), clients at Hong Kong on loopback. Asserts that every SUBACK comes and every
/// region learns every filter; prints the timings (`--nocapture`; docs/geo.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn geo_writeup_scenarios_with_real_processes() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (p_fra, p_hkg, p_cpt) = (free_port(), free_port(), free_port());
    let hkg_fra = Proxy::start(p_fra).await.unwrap();
    let cpt_fra = Proxy::start(p_fra).await.unwrap();
    let cpt_hkg = Proxy::start(p_hkg).await.unwrap();
    hkg_fra.set_one_way_latency(100);
    cpt_fra.set_one_way_latency(80);
    cpt_hkg.set_one_way_latency(160);
    let fra = Node::start("fra", p_fra, &[], &key).await;
    let hkg = Node::start("hkg", p_hkg, &[hkg_fra.port], &key).await;
    let cpt = Node::start("cpt", p_cpt, &[cpt_fra.port, cpt_hkg.port], &key).await;
    for (x, y) in [(&fra, &hkg), (&fra, &cpt), (&hkg, &cpt)] {
        wait_for("the mesh to connect", &[x, y], || async {
            x.connected_to(y).await && y.connected_to(x).await
        })
        .await;
    }

    let rows: [(usize, &str, &str); 5] = [
        (1, "t/mqttx/%i", "v1: 0.89 s"),
        (100, "t/mqttx/%i", "v1: 1.71 s"),
        (
            1,
            "t/mqttx/+/%i/sub/+/#",
            "v1: 2.94 s; core+replicants: 0.70 s",
        ),
        (
            100,
            "t/mqttx/+/%i/sub/+/#",
            "v1: 102 s; v2: 1.67 s; core+replicants: 1.09 s",
        ),
        (
            1000,
            "t/mqttx/+/%i/sub/+/#",
            "core+replicants: 4.33 s; batched: 2.59 s",
        ),
    ];
    let mut keep = Vec::new();
    let mut total = 0;
    let mut table = vec![format!(
        "{:>7}  {:<24} {:>15} {:>20}   EMQX (write-up)",
        "clients", "filter", "all_subacks_ms", "routes_converged_ms"
    )];
    for (row, (n, pattern, emqx)) in rows.into_iter().enumerate() {
        total += n;
        let start = Instant::now();
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let filter = pattern.replace("%i", &format!("r{row}c{i}"));
                let port = hkg.mqtt();
                tokio::spawn(async move {
                    let mut client = v3::connect(v3::options(&format!("r{row}c{i}"), port)).await;
                    let codes = client.subscribe(&filter, QoS::AtLeastOnce).await;
                    assert_eq!(codes.len(), 1);
                    client
                })
            })
            .collect();
        for t in tasks {
            keep.push(t.await.expect("client task"));
        }
        let subacks = start.elapsed();
        let converged = || async {
            let mut done = true;
            for region in [&fra, &cpt] {
                let routes = region
                    .peers()
                    .await
                    .iter()
                    .find(|p| p["peer_id"] == hkg.peer_id.as_str())
                    .and_then(|p| p["routes"].as_u64())
                    .unwrap_or(0);
                done &= routes as usize == total;
            }
            done
        };
        // Asked often: the time of convergence is what this row measures.
        let what = format!("routes to converge (row {row})");
        poll_until(&what, Duration::from_millis(5), String::new, converged).await;
        let converged = start.elapsed();
        table.push(format!(
            "{n:>7}  {pattern:<24} {:>15.0} {:>20.0}   {emqx}",
            subacks.as_secs_f64() * 1000.0,
            converged.as_secs_f64() * 1000.0
        ));
    }
    eprintln!("\n{}\n", table.join("\n"));
    for client in keep {
        client.abort();
    }
}

/// QUIC (cargo feature `quic`): the cluster key does not guard it, so the allowlist must.
#[cfg(feature = "quic")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_mesh_over_quic_with_an_allowlist() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (ta, tb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ia, ib) = (
        peer_id_of(&ta.path().join("data")),
        peer_id_of(&tb.path().join("data")),
    );
    let (pa, pb) = (free_port(), free_port());
    let args = |region: &str, port: u16, allow: &str, peer: Option<u16>| {
        let mut v = vec![
            "--region".to_owned(),
            region.to_owned(),
            "--p2p".to_owned(),
            format!("/ip4/127.0.0.1/udp/{port}/quic-v1"),
            "--cluster-key".to_owned(),
            key.display().to_string(),
            "--allow-peer".to_owned(),
            allow.to_owned(),
        ];
        if let Some(p) = peer {
            v.push("--peer".to_owned());
            v.push(format!("/ip4/127.0.0.1/udp/{p}/quic-v1"));
        }
        v
    };
    let a = Daemon::start_in(ta, None, args("euc1", pa, &ib, None));
    let b = Daemon::start_in(tb, None, args("ape1", pb, &ia, Some(pa)));
    let joined = || async {
        let (_, body) = http(a.admin, "GET", "/api/peers").await;
        body.contains(&ib) && body.contains("\"connected\":true")
    };
    poll_until(
        "b to join a over QUIC",
        Duration::from_millis(25),
        || b.log_text(),
        joined,
    )
    .await;
}

/// With `subscribe_fence`, a SUBACK means every connected region knows the route: a message
/// published in another region right after it is delivered. The link has 100 ms each way,
/// so without the fence that publish would reach c before the route does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_suback_means_other_regions_already_route_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pc) = (free_port(), free_port());
    let link = Proxy::start(pa).await.unwrap();
    let fence = "subscribe_fence = true\n";
    let a = Node::start_with("euc1", pa, &[], &key, fence).await;
    let c = Node::start_with("afs1", pc, &[link.port], &key, fence).await;
    wait_for("the link", &[&a, &c], || async {
        a.connected_to(&c).await && c.connected_to(&a).await
    })
    .await;
    link.set_one_way_latency(100);
    let publ = v3::connect(v3::options("pub-c", c.mqtt())).await;
    let mut sub = v3::connect(v3::options("sub-a", a.mqtt())).await;
    for i in 0..3 {
        let topic = format!("fenced/{i}");
        sub.subscribe(&topic, QoS::AtLeastOnce).await;
        publ.client
            .publish(&topic, QoS::AtLeastOnce, false, "right after the SUBACK")
            .await
            .unwrap();
        let p = sub.publish_msg().await;
        assert_eq!(p.topic, topic);
    }
}
