//! A simulated MQTT client: speaks through the real codec, acknowledges what it receives, and
//! records when things happened.

use bytes::{Bytes, BytesMut};

use crate::ConnId;
use crate::codec::{
    self, Ack, Connect, ConnectProperties, LastWill, Packet, ProtocolVersion, Publish, QoS,
    ReasonCode, Subscribe, SubscribeFilter, SubscribeProperties, SubscriptionOptions,
};
use crate::routes::NodeId;

/// One message as a client received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// When it arrived, in milliseconds since the start of the run.
    pub at_ms: u64,
    /// The topic name it came on.
    pub topic: String,
    /// The payload.
    pub payload: Bytes,
    /// The QoS it was delivered with.
    pub qos: QoS,
    /// The DUP flag: a re-send.
    pub dup: bool,
    /// The RETAIN flag as delivered.
    pub retain: bool,
}

/// A simulated MQTT 5.0 client with a persistent session on one node, and a record of what happened
/// to it.
#[derive(Debug, Clone)]
pub struct SimClient {
    /// Its client id.
    pub name: String,
    /// The node it connects to.
    pub node: NodeId,
    /// Round trip to its node.
    pub rtt_ms: u64,
    /// Its connection on its node; `None` while it is not connected.
    pub conn: Option<ConnId>,
    /// When the current connection's CONNACK arrived.
    pub connack_at_ms: Option<u64>,
    /// SUBACK times, in order.
    pub subacks_at_ms: Vec<u64>,
    /// Every message it received, in order.
    pub received: Vec<Received>,
    /// Payloads of its own QoS 1/2 publishes that the broker acknowledged (PUBACK/PUBCOMP).
    pub acknowledged: Vec<Bytes>,
    buf: BytesMut,
    next_packet_id: u16,
    /// Own QoS 1/2 publishes waiting for their acknowledgement, by packet id.
    waiting: Vec<(u16, Bytes)>,
    /// Subscriptions to send as soon as CONNACK arrives (as load generators do), one
    /// SUBSCRIBE each, in order.
    pub(super) subscribe_on_connack: Vec<(String, QoS)>,
    /// A will (topic, payload) its CONNECTs carry, QoS 1, no delay.
    pub will: Option<(String, Bytes)>,
}

impl SimClient {
    pub(super) fn new(name: String, node: NodeId, rtt_ms: u64) -> Self {
        Self {
            name,
            node,
            rtt_ms,
            conn: None,
            connack_at_ms: None,
            subacks_at_ms: Vec::new(),
            received: Vec::new(),
            acknowledged: Vec::new(),
            buf: BytesMut::new(),
            next_packet_id: 0,
            waiting: Vec::new(),
            subscribe_on_connack: Vec::new(),
            will: None,
        }
    }

    fn packet_id(&mut self) -> u16 {
        self.next_packet_id = self.next_packet_id % u16::MAX + 1;
        self.next_packet_id
    }

    pub(super) fn connect_bytes(&self) -> Bytes {
        let connect = Packet::Connect(Connect {
            protocol: ProtocolVersion::V5,
            clean_start: false,
            keep_alive: 0,
            client_id: self.name.clone(),
            will: self.will.as_ref().map(|(topic, payload)| LastWill {
                topic: topic.clone(),
                payload: payload.clone(),
                qos: QoS::AtLeastOnce,
                retain: false,
                properties: Default::default(),
            }),
            username: None,
            password: None,
            properties: ConnectProperties {
                session_expiry_interval: Some(3_600),
                ..Default::default()
            },
        });
        encode(&connect)
    }

    pub(super) fn subscribe_bytes(&mut self, filter: &str, qos: QoS) -> Bytes {
        let packet_id = self.packet_id();
        encode(&Packet::Subscribe(Subscribe {
            packet_id,
            filters: vec![SubscribeFilter {
                filter: filter.to_owned(),
                options: SubscriptionOptions {
                    qos,
                    ..Default::default()
                },
            }],
            properties: SubscribeProperties::default(),
        }))
    }

    pub(super) fn publish_bytes(
        &mut self,
        topic: &str,
        payload: Bytes,
        qos: QoS,
        retain: bool,
    ) -> Bytes {
        let packet_id = (qos != QoS::AtMostOnce).then(|| self.packet_id());
        if let Some(id) = packet_id {
            self.waiting.push((id, payload.clone()));
        }
        encode(&Packet::Publish(Publish {
            dup: false,
            qos,
            retain,
            topic: topic.to_owned(),
            packet_id,
            payload,
            properties: Default::default(),
        }))
    }

    /// Bytes from the broker; returns what the client sends back.
    pub(super) fn receive(&mut self, now_ms: u64, data: &[u8]) -> Vec<Bytes> {
        self.buf.extend_from_slice(data);
        let mut replies = Vec::new();
        // The broker only sends valid packets; anything else would be a broker bug, which the
        // invariants report through the counts they compare.
        while let Ok(Some(packet)) = codec::decode(&mut self.buf, ProtocolVersion::V5, u32::MAX) {
            match packet {
                Packet::ConnAck(_) => {
                    self.connack_at_ms = Some(now_ms);
                    for (filter, qos) in std::mem::take(&mut self.subscribe_on_connack) {
                        replies.push(self.subscribe_bytes(&filter, qos));
                    }
                }
                Packet::SubAck(_) => self.subacks_at_ms.push(now_ms),
                Packet::Publish(p) => {
                    self.received.push(Received {
                        at_ms: now_ms,
                        topic: p.topic.clone(),
                        payload: p.payload.clone(),
                        qos: p.qos,
                        dup: p.dup,
                        retain: p.retain,
                    });
                    match (p.qos, p.packet_id) {
                        (QoS::AtLeastOnce, Some(id)) => {
                            replies.push(encode(&Packet::PubAck(Ack::new(id))))
                        }
                        (QoS::ExactlyOnce, Some(id)) => {
                            replies.push(encode(&Packet::PubRec(Ack::new(id))))
                        }
                        _ => {}
                    }
                }
                Packet::PubRel(a) => replies.push(encode(&Packet::PubComp(Ack::new(a.packet_id)))),
                Packet::PubRec(a) => {
                    if a.reason.is_error() {
                        self.waiting.retain(|(id, _)| *id != a.packet_id);
                    } else {
                        replies.push(encode(&Packet::PubRel(Ack::new(a.packet_id))));
                    }
                }
                Packet::PubAck(a) | Packet::PubComp(a) => {
                    if let Some(i) = self.waiting.iter().position(|(id, _)| *id == a.packet_id) {
                        let (_, payload) = self.waiting.remove(i);
                        if a.reason == ReasonCode::SUCCESS {
                            self.acknowledged.push(payload);
                        }
                    }
                }
                _ => {}
            }
        }
        replies
    }

    /// Where bytes it sends now go: its node and connection.
    pub(super) fn via(&self) -> Option<(NodeId, ConnId)> {
        Some((self.node.clone(), self.conn?))
    }

    pub(super) fn disconnected(&mut self) {
        self.conn = None;
        self.connack_at_ms = None;
        self.buf.clear();
    }
}

fn encode(packet: &Packet) -> Bytes {
    let mut buf = BytesMut::new();
    // The simulator builds only valid packets.
    let _ = codec::encode(packet, ProtocolVersion::V5, &mut buf);
    buf.freeze()
}
