//! Edge links with a real `meridian` process: a leaf (the core in cluster mode, as the edge
//! worker's Durable Object runs it, on a WebSocket client) links to a daemon at `/link` with a
//! token, and messages cross both ways between it and the daemon's MQTT clients (rumqttc),
//! towards interest only. A wrong token is refused before the upgrade, and a leaf cannot take
//! the name of the node it links to.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use common::mesh::*;
use common::{free_port, v3};
use futures_util::{SinkExt, StreamExt};
use meridian_core::broker::ClusterConfig;
use meridian_core::broker::Message;
use meridian_core::codec::{
    self, Packet, ProtocolVersion, QoS as CoreQoS, Subscribe, SubscribeFilter, SubscribeProperties,
    SubscriptionOptions,
};
use meridian_core::link::{self, Frame};
use meridian_core::routes::NodeId;
use meridian_core::{Broker, Config, ConnId, ConnInfo, Input, Output, Timestamp};
use rumqttc::QoS;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const TOKEN: &str = "edge-token-0123456789abcdef";

fn now() -> Timestamp {
    Timestamp::from_millis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    )
}

/// A QoS 1 message published by the leaf itself.
fn message(topic: &str, payload: &'static [u8]) -> Message {
    Message {
        topic: topic.into(),
        payload: bytes::Bytes::from_static(payload),
        qos: CoreQoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
        expires_at: None,
        origin: None,
    }
}

/// A hub: one region whose edge-link listener takes `TOKEN`.
async fn hub(dir: &std::path::Path) -> (Node, u16) {
    let key = cluster_key(dir, "cluster.key");
    let tokens = dir.join("edge-tokens");
    std::fs::write(&tokens, format!("# the edge worker\n{TOKEN}\n")).unwrap();
    let edge = free_port();
    let extra = format!(
        "[cluster.edge]\nlisten = \"127.0.0.1:{edge}\"\ntoken_file = \"{}\"\n",
        tokens.display()
    );
    let node = Node::start_with("euc1", free_port(), &[], &key, &extra).await;
    (node, edge)
}

/// An edge link with `token`: the socket and the hub it names, or the refusal's status.
async fn open(port: u16, token: &str) -> Result<(WebSocketStream<TcpStream>, String), u16> {
    let mut request = format!("ws://127.0.0.1:{port}/link")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the edge-link listener accepts");
    match tokio_tungstenite::client_async(request, tcp).await {
        Ok((ws, response)) => {
            let hub = response
                .headers()
                .get("meridian-node")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            Ok((ws, hub))
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            Err(response.status().as_u16())
        }
        Err(e) => panic!("edge link: {e}"),
    }
}

/// A leaf: the core in cluster mode with the hub as its one peer, one local MQTT client, and
/// the WebSocket that carries its link frames.
struct Leaf {
    broker: Broker,
    hub: NodeId,
    ws: WebSocketStream<TcpStream>,
    client: ConnId,
    /// Bytes for the local client, not yet decoded.
    inbox: BytesMut,
}

impl Leaf {
    async fn link(port: u16, name: &str, hub: &str) -> Self {
        let (ws, named) = open(port, TOKEN).await.expect("the edge link opens");
        assert_eq!(named, hub, "the upgrade names the hub");
        let mut broker = Broker::new(Config::default(), now());
        broker.enable_cluster(ClusterConfig::new(NodeId::new(name).unwrap(), 1, "edge-eu"));
        let client = broker.accept(now(), ConnInfo::default());
        let hub = NodeId::new(hub).unwrap();
        broker.handle_input(now(), Input::PeerUp { peer: hub.clone() });
        let mut leaf = Self {
            broker,
            hub,
            ws,
            client,
            inbox: BytesMut::new(),
        };
        leaf.client_sends(Packet::Connect(common::raw::connect_packet(
            ProtocolVersion::V5,
            "edge-client",
        )));
        leaf.pump().await;
        leaf
    }

    /// A packet from the leaf's local client.
    fn client_sends(&mut self, packet: Packet) {
        let mut bytes = BytesMut::new();
        codec::encode(&packet, ProtocolVersion::V5, &mut bytes).unwrap();
        self.broker.handle_input(
            now(),
            Input::Bytes {
                conn: self.client,
                data: &bytes,
            },
        );
    }

    /// Carry every output: link frames onto the WebSocket, bytes to the local client.
    async fn pump(&mut self) {
        while let Some(out) = self.broker.poll_output() {
            match out {
                Output::ToPeer { frame, .. } | Output::Broadcast { frame } => {
                    let mut bytes = BytesMut::new();
                    link::encode(&frame, &mut bytes).unwrap();
                    self.ws
                        .send(WsMessage::Binary(bytes.freeze()))
                        .await
                        .expect("link write");
                }
                Output::Send { data, .. } => self.inbox.extend_from_slice(&data),
                _ => {}
            }
        }
    }

    /// Run the leaf (its timers, the hub's frames) for `ms`.
    async fn run_for(&mut self, ms: u64) {
        let until = tokio::time::Instant::now() + Duration::from_millis(ms);
        loop {
            if self.broker.poll_timeout().is_some_and(|at| at <= now()) {
                self.broker.handle_input(now(), Input::Timeout);
            }
            self.pump().await;
            let wait = tokio::time::sleep_until(
                until.min(tokio::time::Instant::now() + Duration::from_millis(5)),
            );
            tokio::select! {
                msg = self.ws.next() => {
                    let Some(Ok(WsMessage::Binary(data))) = msg else { continue };
                    let mut buf = BytesMut::from(&data[..]);
                    while let Ok(Some(frame)) = link::decode(&mut buf, link::DEFAULT_MAX_FRAME_LEN) {
                        self.broker.handle_input(
                            now(),
                            Input::PeerFrame { peer: self.hub.clone(), frame: Box::new(frame) },
                        );
                    }
                }
                () = wait => {}
            }
            if tokio::time::Instant::now() >= until {
                self.pump().await;
                return;
            }
        }
    }

    /// Run until the local client received a PUBLISH, within the deadline.
    async fn next_publish(&mut self) -> codec::Publish {
        let deadline = tokio::time::Instant::now() + MESH_DEADLINE;
        loop {
            while let Ok(Some(packet)) =
                codec::decode(&mut self.inbox, ProtocolVersion::V5, u32::MAX)
            {
                if let Packet::Publish(p) = packet {
                    return p;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no message reached the leaf's client"
            );
            self.run_for(20).await;
        }
    }
}

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
        let listed = peers
            .iter()
            .any(|p| p["peer_id"] == "edge-eu" && p["leaf"] == true && p["routes"] == 1);
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
