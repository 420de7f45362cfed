//! Edge links with a real `meridian` process: a leaf (the core in cluster mode, as the edge
//! worker's Durable Object runs it, on a WebSocket client) links to a daemon at `/link` with a
//! token, and messages cross both ways between it and the daemon's MQTT clients (rumqttc),
//! towards interest only. A wrong token is refused before the upgrade, and a leaf cannot take
//! the name of the node it links to.

mod common;

use bytes::BytesMut;
use common::leaf::*;
use common::mesh::*;
use common::{meridian, v3};
use futures_util::{SinkExt, StreamExt};
use meridian_core::codec::{
    Packet, QoS as CoreQoS, Subscribe, SubscribeFilter, SubscribeProperties, SubscriptionOptions,
};
use meridian_core::link::{self, Frame};
use meridian_core::routes::NodeId;
use rumqttc::QoS;
use tokio_tungstenite::tungstenite::Message as WsMessage;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaf_and_the_hubs_clients_exchange_messages_towards_interest() {
    let dir = tempfile::tempdir().unwrap();
    let (hub, edge) = hub(dir.path()).await;
    let mut leaf = Leaf::link(edge, "edge-eu", &hub.peer_id).await;
    leaf.client_sends(Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: "edge/#".into(),
            options: SubscriptionOptions {
                qos: CoreQoS::AtLeastOnce,
                ..Default::default()
            },
        }],
        properties: SubscribeProperties::default(),
    }));
    // The hub lists its leaf, and takes the leaf's interest as its own.
    let deadline = tokio::time::Instant::now() + MESH_DEADLINE;
    loop {
        leaf.run_for(20).await;
        let peers = hub.peers().await;
        let listed = peers.iter().any(|p| {
            p["peer_id"] == "edge-eu"
                && p["leaf"] == true
                && p["routes"] == 1
                && p["connected_since_ms"].as_u64().is_some()
        });
        let (status, own) = common::http(hub.daemon.admin, "GET", "/api/routes").await;
        if listed && status == 200 && own.contains("edge/#") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leaf's routes never reached the hub: {peers:?}\n{}",
            hub.log()
        );
    }

    // From a client of the hub to the leaf's client.
    let publisher = v3::connect(v3::options("hub-pub", hub.mqtt())).await;
    publisher
        .client
        .publish("edge/1", QoS::AtLeastOnce, false, "to the edge")
        .await
        .unwrap();
    let got = leaf.next_publish().await;
    assert_eq!(got.topic, "edge/1");
    assert_eq!(&got.payload[..], b"to the edge");

    // From the leaf to a subscriber of the hub.
    let mut subscriber = v3::connect(v3::options("hub-sub", hub.mqtt())).await;
    subscriber.subscribe("up/#", QoS::AtLeastOnce).await;
    let deadline = tokio::time::Instant::now() + MESH_DEADLINE;
    while leaf.broker.replicated_routes(&leaf.hub).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hub's interest never reached the leaf"
        );
        leaf.run_for(20).await;
    }
    leaf.broker
        .publish(now(), message("up/1", b"from the edge"))
        .unwrap();
    leaf.run_for(50).await;
    let p = subscriber.publish_msg().await;
    assert_eq!(p.topic, "up/1");
    assert_eq!(&p.payload[..], b"from the edge");

    // A topic nobody wants at the hub never crosses.
    let sent_before = leaf
        .broker
        .peers()
        .iter()
        .find(|p| p.node == leaf.hub)
        .map_or(0, |p| p.forwarded_to);
    leaf.broker
        .publish(now(), message("nobody/here", b"stay"))
        .unwrap();
    leaf.run_for(50).await;
    let sent_after = leaf
        .broker
        .peers()
        .iter()
        .find(|p| p.node == leaf.hub)
        .map_or(0, |p| p.forwarded_to);
    assert_eq!(sent_after, sent_before);
    let page = hub.metrics().await;
    for direction in ["in", "out"] {
        let series = format!("meridian_edge_link_frames_total{{direction=\"{direction}\"}}");
        assert!(metric(&page, &series) > 0.0, "{series} counted");
    }
    publisher.disconnect().await;
    subscriber.disconnect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_or_a_stolen_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (hub, edge) = hub(dir.path()).await;
    assert_eq!(
        open(edge, "not-the-token-0123456789").await.err(),
        Some(401)
    );
    assert_eq!(open(edge, "").await.err(), Some(401));
    assert_eq!(
        metric(
            &hub.metrics().await,
            "meridian_edge_links_refused_total{reason=\"token\"}"
        ),
        2.0
    );
    // A leaf that names itself as the hub is closed after its Hello.
    let (mut ws, _) = open(edge, TOKEN).await.expect("the upgrade succeeds");
    let hello = Frame::Hello {
        node: NodeId::new(&hub.peer_id).unwrap(),
        incarnation: 1,
        protocol: link::LINK_PROTOCOL_VERSION,
        region: "edge".into(),
        certificate: None,
    };
    let mut bytes = BytesMut::new();
    link::encode(&hello, &mut bytes).unwrap();
    ws.send(WsMessage::Binary(bytes.freeze())).await.unwrap();
    let end = tokio::time::timeout(MESH_DEADLINE, async {
        while let Some(Ok(m)) = ws.next().await {
            if m.is_close() {
                break;
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the link is closed");
    wait_for("the refusal counted", &[&hub], || async {
        metric(
            &hub.metrics().await,
            "meridian_edge_links_refused_total{reason=\"node\"}",
        ) == 1.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_hold_every_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let (hub, edge) = hub(dir.path()).await;
    // Connections that never upgrade hold their address's places until they give up.
    let mut stalled = Vec::new();
    for _ in 0..8 {
        stalled.push(
            tokio::net::TcpStream::connect(("127.0.0.1", edge))
                .await
                .unwrap(),
        );
    }
    wait_for(
        "the next link from this address refused",
        &[&hub],
        || async { open(edge, TOKEN).await.err() == Some(503) },
    )
    .await;
    assert!(
        metric(
            &hub.metrics().await,
            "meridian_edge_links_refused_total{reason=\"busy_address\"}"
        ) >= 1.0
    );
    drop(stalled);
    wait_for("a link again once they are gone", &[&hub], || async {
        open(edge, TOKEN).await.is_ok()
    })
    .await;
}

/// Open an edge link with `token` and send a Hello naming `leaf`: whether the hub keeps the
/// link (true) or closes it (false), within `wait_ms` after the Hello.
async fn hello(
    edge: u16,
    token: &str,
    leaf: &str,
    wait_ms: u64,
) -> (
    bool,
    Option<tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>>,
) {
    let (mut ws, _) = open(edge, token).await.expect("the upgrade succeeds");
    let frame = Frame::Hello {
        node: NodeId::new(leaf).unwrap(),
        incarnation: 1,
        protocol: link::LINK_PROTOCOL_VERSION,
        region: "edge".into(),
        certificate: None,
    };
    let mut bytes = BytesMut::new();
    link::encode(&frame, &mut bytes).unwrap();
    ws.send(WsMessage::Binary(bytes.freeze())).await.unwrap();
    let closed = tokio::time::timeout(std::time::Duration::from_millis(wait_ms), async {
        while let Some(Ok(m)) = ws.next().await {
            if m.is_close() {
                return;
            }
        }
    })
    .await
    .is_ok();
    if closed {
        (false, None)
    } else {
        (true, Some(ws))
    }
}

/// An edge-link token is a credential: a live leaf cannot be taken over with another token,
/// and one token links a bounded number of leaves, those whose link ended counted while the
/// hub keeps them (so that it cannot fill `max_nodes` with names of its own, nor by cycling
/// them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_links_its_own_leaves_and_a_bounded_number_of_them() {
    const OTHER: &str = "edge-token-other-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let tokens = dir.path().join("edge-tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n{OTHER}\n")).unwrap();
    let edge = common::free_port();
    let extra = format!(
        "[cluster.edge]\nlisten = \"127.0.0.1:{edge}\"\ntoken_file = \"{}\"\nmax_leaves_per_token = 2\n",
        tokens.display()
    );
    let hub = Node::start_with("euc1", common::free_port(), &[], &key, &extra).await;
    let refused = || async {
        metric(
            &hub.metrics().await,
            "meridian_edge_links_refused_total{reason=\"credential\"}",
        )
    };
    let mut a = Leaf::link(edge, "edge-a", &hub.peer_id).await;
    a.run_for(50).await;
    // Another token's link naming the live leaf is closed; the leaf keeps its link.
    let (kept, _) = hello(edge, OTHER, "edge-a", 10_000).await;
    assert!(!kept, "a live leaf's name with another token");
    assert_eq!(refused().await, 1.0);
    let listed = |name: &'static str| {
        let hub = &hub;
        async move {
            hub.peers()
                .await
                .iter()
                .any(|p| p["peer_id"] == name && p["connected_since_ms"].as_u64().is_some())
        }
    };
    assert!(listed("edge-a").await, "{}", tail(&hub.log(), 20));
    // TOKEN links a second leaf, and no third.
    let (kept, b_link) = hello(edge, TOKEN, "edge-b", 300).await;
    assert!(kept);
    let (kept, _) = hello(edge, TOKEN, "edge-c", 10_000).await;
    assert!(!kept, "a third leaf for a token of two");
    assert_eq!(refused().await, 2.0);
    // The other token links its own.
    let (kept, _c) = hello(edge, OTHER, "edge-c", 300).await;
    assert!(kept);
    // The leaf's own token replaces its link (a reconnect).
    let (kept, _a2) = hello(edge, TOKEN, "edge-a", 300).await;
    assert!(kept);
    wait_for("the hub to list the leaves it kept", &[&hub], || async {
        listed("edge-b").await && listed("edge-c").await && listed("edge-a").await
    })
    .await;
    assert_eq!(refused().await, 2.0);
    // edge-b's link ends: the hub keeps it (until leaf_expiry_ms), and it still counts, so the
    // token links no new name in its place; edge-b itself links again.
    drop(b_link);
    wait_for("edge-b's link to end", &[&hub], || async {
        hub.peers()
            .await
            .iter()
            .any(|p| p["peer_id"] == "edge-b" && p["connected_since_ms"].is_null())
    })
    .await;
    let (kept, _) = hello(edge, TOKEN, "edge-d", 10_000).await;
    assert!(!kept, "a new name in place of a leaf the hub keeps");
    assert_eq!(refused().await, 3.0);
    let (kept, _b2) = hello(edge, TOKEN, "edge-b", 300).await;
    assert!(kept, "edge-b links again");
}

/// With operator keys, an edge link is a leaf credential the operator signed (`meridian
/// certify-leaf`): tokens and credentials of another key link nothing, a credential links the
/// leaf it names and no other, a live leaf is not taken by another credential, and the leaf
/// (a hostile one, built from the crate's own core: it subscribes to everything and publishes
/// outside its scope) touches nothing outside its scope, either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_operator_keys_a_leaf_links_with_its_credential_and_stays_in_its_scope() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let op_key = dir.path().join("operator.key");
    let public = meridian(&["keygen", "--operator", op_key.to_str().unwrap()]);
    let rogue_key = dir.path().join("rogue.key");
    meridian(&["keygen", "--operator", rogue_key.to_str().unwrap()]);
    let certify = |key: &std::path::Path, name: &str, scope: &str| {
        meridian(&[
            "certify-leaf",
            "--operator-key",
            key.to_str().unwrap(),
            "--name",
            name,
            "--scope",
            scope,
            "--max-filters",
            "10",
        ])
    };
    let eu = certify(&op_key, "edge-eu", "sensors/eu/#");
    let any = certify(&op_key, "edge-*", "#");
    let forged = certify(&rogue_key, "edge-eu", "#");
    let tokens = dir.path().join("edge-tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();
    let edge = common::free_port();
    let extra = format!(
        "[cluster.edge]\nlisten = \"127.0.0.1:{edge}\"\ntoken_file = \"{}\"\n\
         [policy]\noperator_keys = [\"{public}\"]\n",
        tokens.display()
    );
    let hub = Node::start_with("euc1", common::free_port(), &[], &key, &extra).await;
    assert_eq!(
        open(edge, TOKEN).await.err(),
        Some(401),
        "a token links nothing"
    );
    assert_eq!(
        open(edge, &forged).await.err(),
        Some(401),
        "another key's credential"
    );
    let refused = || async {
        metric(
            &hub.metrics().await,
            "meridian_edge_links_refused_total{reason=\"credential\"}",
        )
    };
    let (kept, _) = hello(edge, &eu, "edge-as", 10_000).await;
    assert!(!kept, "a credential links the leaf it names only");
    assert_eq!(refused().await, 1.0);

    let mut leaf = Leaf::link_with(edge, &eu, "edge-eu", &hub.peer_id).await;
    leaf.client_sends(Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: ["#", "sensors/eu/+"]
            .into_iter()
            .map(|f| SubscribeFilter {
                filter: f.into(),
                options: SubscriptionOptions {
                    qos: CoreQoS::AtLeastOnce,
                    ..Default::default()
                },
            })
            .collect(),
        properties: SubscribeProperties::default(),
    }));
    let deadline = tokio::time::Instant::now() + MESH_DEADLINE;
    loop {
        leaf.run_for(20).await;
        let (_, own) = common::http(hub.daemon.admin, "GET", "/api/routes").await;
        if own.contains("sensors/eu/+") {
            assert!(
                !own.contains("\"#\""),
                "the leaf's # is no interest of the hub: {own}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leaf's routes never reached the hub: {own}\n{}",
            hub.log()
        );
    }
    let mut subscriber = v3::connect(v3::options("hub-sub", hub.mqtt())).await;
    subscriber.subscribe("#", QoS::AtLeastOnce).await;
    while leaf.broker.replicated_routes(&leaf.hub).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hub's interest never reached the leaf"
        );
        leaf.run_for(20).await;
    }
    // Towards the leaf: what its scope holds, whatever its # asks for.
    let publisher = v3::connect(v3::options("hub-pub", hub.mqtt())).await;
    for topic in ["secret/1", "sensors/eu/1"] {
        publisher
            .client
            .publish(topic, QoS::AtLeastOnce, false, topic)
            .await
            .unwrap();
    }
    assert_eq!(leaf.next_publish().await.topic, "sensors/eu/1");
    for _ in 0..2 {
        subscriber.publish_msg().await;
    }
    // From the leaf: what is outside its scope reaches no one, and is counted.
    let not_owner = "meridian_peer_frames_refused_total{reason=\"not_owner\"}";
    let before = metric(&hub.metrics().await, not_owner);
    for topic in ["control/valve", "sensors/eu/2"] {
        leaf.broker.publish(now(), message(topic, b"x")).unwrap();
    }
    leaf.run_for(50).await;
    assert_eq!(subscriber.publish_msg().await.topic, "sensors/eu/2");
    assert!(metric(&hub.metrics().await, not_owner) > before);

    // Another credential cannot take the live leaf's name; the leaf keeps its link.
    let (kept, _) = hello(edge, &any, "edge-eu", 10_000).await;
    assert!(!kept, "a live leaf's name with another credential");
    assert_eq!(refused().await, 2.0);
    let (kept, _other) = hello(edge, &any, "edge-as", 300).await;
    assert!(kept, "a prefix credential links a name it covers");
    publisher.disconnect().await;
    subscriber.disconnect().await;
}
