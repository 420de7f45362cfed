//! A leaf of a daemon for the tests (the core in cluster mode on a WebSocket client, as the
//! edge worker's Durable Object runs it), and a daemon that takes it.

#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use meridian_core::broker::{ClusterConfig, Message};
use meridian_core::codec::{self, Packet, ProtocolVersion, QoS as CoreQoS};
use meridian_core::link;
use meridian_core::routes::NodeId;
use meridian_core::{Broker, Config, ConnId, ConnInfo, Input, Output, Timestamp};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::free_port;
use super::mesh::{MESH_DEADLINE, Node, cluster_key};

pub const TOKEN: &str = "edge-token-0123456789abcdef";

pub fn now() -> Timestamp {
    Timestamp::from_millis(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    )
}

/// A QoS 1 message published by the leaf itself.
pub fn message(topic: &str, payload: &'static [u8]) -> Message {
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
pub async fn hub(dir: &std::path::Path) -> (Node, u16) {
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
pub async fn open(port: u16, token: &str) -> Result<(WebSocketStream<TcpStream>, String), u16> {
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
pub struct Leaf {
    pub broker: Broker,
    pub hub: NodeId,
    ws: WebSocketStream<TcpStream>,
    client: ConnId,
    /// Bytes for the local client, not yet decoded.
    inbox: BytesMut,
}

impl Leaf {
    pub async fn link(port: u16, name: &str, hub: &str) -> Self {
        Self::link_with(port, TOKEN, name, hub).await
    }

    /// A leaf named `name` that links with `token` (a token, or a leaf credential).
    pub async fn link_with(port: u16, token: &str, name: &str, hub: &str) -> Self {
        let (ws, named) = open(port, token).await.expect("the edge link opens");
        assert_eq!(named, hub, "the upgrade names the hub");
        let mut broker = Broker::new(Config::default(), now());
        broker.enable_cluster(
            now(),
            ClusterConfig::new(NodeId::new(name).unwrap(), 1, "edge-eu"),
        );
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
        leaf.client_sends(Packet::Connect(super::raw::connect_packet(
            ProtocolVersion::V5,
            "edge-client",
        )));
        leaf.pump().await;
        leaf
    }

    /// A packet from the leaf's local client.
    pub fn client_sends(&mut self, packet: Packet) {
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
    pub async fn pump(&mut self) {
        while let Some(out) = self.broker.poll_output() {
            match out {
                Output::ToPeer { frame, .. } | Output::Broadcast { frame } => {
                    self.ws
                        .send(WsMessage::Binary(frame.into_bytes()))
                        .await
                        .expect("link write");
                }
                Output::Send { data, .. } => self.inbox.extend_from_slice(&data),
                _ => {}
            }
        }
    }

    /// Run the leaf (its timers, the hub's frames) for `ms`.
    pub async fn run_for(&mut self, ms: u64) {
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
    pub async fn next_publish(&mut self) -> codec::Publish {
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
