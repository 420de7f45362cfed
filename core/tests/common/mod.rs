//! A scripted world for broker tests: the broker, virtual time, and clients that speak through
//! the real codec. Every output is applied the way a shell would apply it.

#![allow(dead_code)]

pub mod mesh;
pub mod operator;

use std::collections::{BTreeMap, HashMap, HashSet};

use bytes::{Bytes, BytesMut};
use meridian_core::acl::Acl;
use meridian_core::broker::ClusterConfig;
use meridian_core::broker::{AllowAll, AuthOutcome, Authenticator, Authorizer};
use meridian_core::codec::{
    self, Ack, ConnAck, Connect, ConnectProperties, Packet, ProtocolVersion, Publish,
    PublishProperties, QoS, ReasonCode, Subscribe, SubscribeFilter, SubscribeProperties,
    SubscriptionOptions, Unsubscribe,
};
use meridian_core::link::Frame;
use meridian_core::routes::NodeId;
use meridian_core::{Broker, Config, ConnId, ConnInfo, Event, Input, Output, Timestamp};

pub const V3: ProtocolVersion = ProtocolVersion::V311;
pub const V5: ProtocolVersion = ProtocolVersion::V5;

/// The broker plus everything a shell would keep: bytes per connection, storage, events.
pub struct World {
    pub broker: Broker,
    pub config: Config,
    pub now: u64,
    pub inbox: HashMap<ConnId, BytesMut>,
    /// Packets decoded but not yet handed to the test (what followed a CONNACK).
    pub pending: HashMap<ConnId, Vec<Packet>>,
    pub versions: HashMap<ConnId, ProtocolVersion>,
    pub closed: HashSet<ConnId>,
    pub store: BTreeMap<Bytes, Bytes>,
    pub events: Vec<Event>,
    /// Every output in the order the broker gave it.
    pub log: Vec<Output>,
    /// Frames for peer nodes (`None`: to every peer), not yet carried.
    pub peer_out: Vec<(Option<NodeId>, Frame)>,
    /// Peers whose link sessions the broker cut ([`Output::CutPeer`]).
    pub cut_peers: Vec<NodeId>,
    /// Set for a node of a deployment; a restart bumps the incarnation.
    pub cluster: Option<ClusterConfig>,
    /// Access rules the broker enforces, again after a restart.
    pub acl: Option<Acl>,
}

impl World {
    pub fn new() -> Self {
        Self::with_config(Config::default())
    }

    pub fn with_config(config: Config) -> Self {
        let broker = Broker::new(config.clone(), Timestamp(1_000_000));
        Self::from_broker(broker, config, 1_000_000)
    }

    pub fn with_auth(
        config: Config,
        authn: Box<dyn Authenticator>,
        authz: Box<dyn Authorizer>,
    ) -> Self {
        let broker = Broker::with_auth(config.clone(), Timestamp(1_000_000), authn, authz);
        Self::from_broker(broker, config, 1_000_000)
    }

    /// A broker that enforces `acl` and lets everyone log in.
    pub fn with_acl(config: Config, acl: Acl) -> Self {
        let mut w = Self::with_auth(config, Box::new(AllowAll), Box::new(acl.clone()));
        w.acl = Some(acl);
        w
    }

    fn from_broker(broker: Broker, config: Config, now: u64) -> Self {
        Self {
            broker,
            config,
            now,
            inbox: HashMap::new(),
            pending: HashMap::new(),
            versions: HashMap::new(),
            closed: HashSet::new(),
            store: BTreeMap::new(),
            events: Vec::new(),
            log: Vec::new(),
            peer_out: Vec::new(),
            cut_peers: Vec::new(),
            cluster: None,
            acl: None,
        }
    }

    /// A node of a deployment.
    pub fn node(config: Config, cluster: ClusterConfig) -> Self {
        let mut w = Self::with_config(config);
        w.broker.enable_cluster(Timestamp(w.now), cluster.clone());
        w.cluster = Some(cluster);
        w
    }

    /// Simulate a crash and restart: a new broker restored from what was persisted.
    pub fn restart(&mut self) {
        self.rebuild();
        self.inbox.clear();
        self.pending.clear();
        self.closed.clear();
        let records = self.records();
        let report = self.broker.restore(Timestamp(self.now), records);
        assert!(
            report.unreadable.is_empty(),
            "unreadable records: {:?}",
            report.unreadable
        );
        self.drain();
    }

    /// Simulate a shell whose process is rebuilt while the network connections `open` stay
    /// open (a Durable Object woken from hibernation): the broker's checkpoint once things
    /// went quiet, then a new broker restored from what was persisted, told which connections
    /// are still open. Clients keep what they had received.
    pub fn wake(&mut self, open: &[ConnId]) -> meridian_core::broker::RestoreReport {
        self.broker.checkpoint(Timestamp(self.now));
        self.drain();
        self.wake_without_checkpoint(open)
    }

    /// [`World::wake`] without the checkpoint (a process lost while busy).
    pub fn wake_without_checkpoint(
        &mut self,
        open: &[ConnId],
    ) -> meridian_core::broker::RestoreReport {
        self.rebuild();
        let records = self.records();
        let report = self
            .broker
            .restore_open(Timestamp(self.now), records, open.iter().copied());
        assert!(
            report.unreadable.is_empty(),
            "unreadable records: {:?}",
            report.unreadable
        );
        self.drain();
        report
    }

    fn records(&self) -> Vec<(Bytes, Bytes)> {
        self.store
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// A new broker in place of the old one, which is dropped with everything in memory.
    fn rebuild(&mut self) {
        let mut broker = match &self.acl {
            Some(acl) => Broker::with_auth(
                self.config.clone(),
                Timestamp(self.now),
                Box::new(AllowAll) as Box<dyn Authenticator>,
                Box::new(acl.clone()) as Box<dyn Authorizer>,
            ),
            None => Broker::new(self.config.clone(), Timestamp(self.now)),
        };
        if let Some(c) = &mut self.cluster {
            c.incarnation += 1;
            broker.enable_cluster(Timestamp(self.now), c.clone());
        }
        self.peer_out.clear();
        let old = std::mem::replace(&mut self.broker, broker);
        drop(old);
    }

    pub fn drain(&mut self) {
        while let Some(out) = self.broker.poll_output() {
            self.log.push(out.clone());
            match out {
                Output::Send { conn, data } => {
                    assert!(
                        !self.closed.contains(&conn),
                        "bytes sent to closed connection {conn:?}"
                    );
                    self.inbox.entry(conn).or_default().extend_from_slice(&data);
                }
                Output::Close { conn } => {
                    self.closed.insert(conn);
                }
                Output::Persist { key, value, .. } => match value {
                    Some(v) => {
                        self.store.insert(key, v);
                    }
                    None => {
                        self.store.remove(&key);
                    }
                },
                Output::Event(e) => self.events.push(e),
                // Kept as the peers will read them.
                Output::ToPeer { peer, frame } => {
                    let frame = frame.decode().expect("frames the broker encodes decode");
                    self.peer_out.push((Some(peer), frame));
                }
                Output::Broadcast { frame } => {
                    let frame = frame.decode().expect("frames the broker encodes decode");
                    self.peer_out.push((None, frame));
                }
                Output::CutPeer { peer } => self.cut_peers.push(peer),
            }
        }
    }

    pub fn accept(&mut self) -> ConnId {
        let conn = self.broker.accept(Timestamp(self.now), ConnInfo::default());
        self.drain();
        conn
    }

    pub fn send_bytes(&mut self, conn: ConnId, data: &[u8]) {
        self.broker
            .handle_input(Timestamp(self.now), Input::Bytes { conn, data });
        self.drain();
    }

    pub fn send(&mut self, conn: ConnId, packet: Packet) {
        let version = self.versions.get(&conn).copied().unwrap_or(V5);
        let mut buf = BytesMut::new();
        codec::encode(&packet, version, &mut buf).expect("test packet encodes");
        self.send_bytes(conn, &buf);
    }

    pub fn close(&mut self, conn: ConnId) {
        self.broker
            .handle_input(Timestamp(self.now), Input::Closed { conn });
        self.closed.insert(conn);
        self.drain();
    }

    /// Tell the broker the connection's unwritten backlog passed the shell's mark (`true`) or
    /// fell back (`false`).
    pub fn set_congested(&mut self, conn: ConnId, congested: bool) {
        let input = if congested {
            Input::Congested { conn }
        } else {
            Input::Drained { conn }
        };
        self.broker.handle_input(Timestamp(self.now), input);
        self.drain();
    }

    /// Move virtual time forward, firing every timer on the way.
    pub fn advance(&mut self, ms: u64) {
        let target = self.now + ms;
        while let Some(at) = self.broker.poll_timeout() {
            if at.0 > target {
                break;
            }
            self.now = self.now.max(at.0);
            self.broker
                .handle_input(Timestamp(self.now), Input::Timeout);
            self.drain();
        }
        self.now = target;
        self.broker
            .handle_input(Timestamp(self.now), Input::Timeout);
        self.drain();
    }

    /// Everything the client received since the last call, decoded.
    pub fn recv(&mut self, conn: ConnId) -> Vec<Packet> {
        let version = self.versions.get(&conn).copied().unwrap_or(V5);
        let mut out = self.pending.remove(&conn).unwrap_or_default();
        let Some(buf) = self.inbox.get_mut(&conn) else {
            return out;
        };
        while let Some(p) = codec::decode(buf, version, u32::MAX).expect("broker output decodes") {
            out.push(p);
        }
        assert!(buf.is_empty(), "partial packet left in client buffer");
        out
    }

    pub fn is_closed(&self, conn: ConnId) -> bool {
        self.closed.contains(&conn)
    }

    /// Connect a client and return its connection after checking CONNACK success.
    pub fn connect(&mut self, version: ProtocolVersion, client_id: &str) -> ConnId {
        self.connect_with(version, client_id, |_| {}).0
    }

    pub fn connect_with(
        &mut self,
        version: ProtocolVersion,
        client_id: &str,
        tweak: impl FnOnce(&mut Connect),
    ) -> (ConnId, ConnAck) {
        let conn = self.accept();
        self.versions.insert(conn, version);
        let mut c = connect_packet(version, client_id);
        tweak(&mut c);
        self.send(conn, Packet::Connect(c));
        let mut packets = self.recv(conn);
        let Some(Packet::ConnAck(ack)) = packets.first().cloned() else {
            panic!("expected CONNACK, got {packets:?}");
        };
        packets.remove(0);
        if !packets.is_empty() {
            self.pending.insert(conn, packets);
        }
        (conn, ack)
    }

    pub fn subscribe(&mut self, conn: ConnId, filter: &str, qos: QoS) -> Vec<ReasonCode> {
        self.subscribe_with(
            conn,
            filter,
            SubscriptionOptions {
                qos,
                ..Default::default()
            },
            None,
        )
    }

    pub fn subscribe_with(
        &mut self,
        conn: ConnId,
        filter: &str,
        options: SubscriptionOptions,
        id: Option<u32>,
    ) -> Vec<ReasonCode> {
        let packet_id = 4242;
        self.send(
            conn,
            Packet::Subscribe(Subscribe {
                packet_id,
                filters: vec![SubscribeFilter {
                    filter: filter.into(),
                    options,
                }],
                properties: SubscribeProperties {
                    subscription_identifier: id,
                    ..Default::default()
                },
            }),
        );
        let packets = self.recv(conn);
        match packets.first() {
            Some(Packet::SubAck(ack)) => {
                assert_eq!(ack.packet_id, packet_id);
                ack.reasons.clone()
            }
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }

    /// Subscribe and return the SUBACK plus what followed it (retained messages).
    pub fn subscribe_collect(
        &mut self,
        conn: ConnId,
        filter: &str,
        options: SubscriptionOptions,
    ) -> Vec<Packet> {
        self.send(
            conn,
            Packet::Subscribe(Subscribe {
                packet_id: 7,
                filters: vec![SubscribeFilter {
                    filter: filter.into(),
                    options,
                }],
                properties: SubscribeProperties::default(),
            }),
        );
        self.recv(conn)
    }

    pub fn unsubscribe(&mut self, conn: ConnId, filter: &str) -> Vec<Packet> {
        self.send(
            conn,
            Packet::Unsubscribe(Unsubscribe {
                packet_id: 9,
                filters: vec![filter.into()],
                user_properties: vec![],
            }),
        );
        self.recv(conn)
    }

    pub fn publish(
        &mut self,
        conn: ConnId,
        topic: &str,
        payload: &[u8],
        qos: QoS,
        retain: bool,
        packet_id: u16,
    ) {
        self.send(
            conn,
            Packet::Publish(publish_packet(topic, payload, qos, retain, packet_id)),
        );
    }

    /// Publishes received by a client (acks and other packets are dropped).
    /// The reason codes of the PUBACKs a client received (other packets are dropped).
    pub fn puback_reasons(&mut self, conn: ConnId) -> Vec<ReasonCode> {
        self.recv(conn)
            .iter()
            .filter_map(|p| match p {
                Packet::PubAck(a) => Some(a.reason),
                _ => None,
            })
            .collect()
    }

    pub fn received_publishes(&mut self, conn: ConnId) -> Vec<Publish> {
        self.recv(conn)
            .into_iter()
            .filter_map(|p| match p {
                Packet::Publish(p) => Some(p),
                _ => None,
            })
            .collect()
    }

    /// The messages a subscriber received, each acknowledged (QoS 2 with PUBREC, PUBREL,
    /// PUBCOMP), as the numbers their payloads start with (big-endian `u32`).
    pub fn read_numbers(&mut self, conn: ConnId) -> Vec<u32> {
        let got = self.received_publishes(conn);
        for p in &got {
            self.ack(conn, p);
        }
        got.iter()
            .map(|p| u32::from_be_bytes(p.payload[..4].try_into().unwrap()))
            .collect()
    }

    pub fn ack(&mut self, conn: ConnId, p: &Publish) {
        if p.qos == QoS::AtMostOnce {
            return;
        }
        let id = p.packet_id.expect("QoS > 0 publish has an id");
        match p.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => self.send(conn, Packet::PubAck(Ack::new(id))),
            QoS::ExactlyOnce => {
                self.send(conn, Packet::PubRec(Ack::new(id)));
                let rel = self.recv(conn);
                assert!(
                    rel.iter()
                        .any(|p| matches!(p, Packet::PubRel(a) if a.packet_id == id)),
                    "no PUBREL: {rel:?}"
                );
                self.send(conn, Packet::PubComp(Ack::new(id)));
            }
        }
    }
}

pub fn connect_packet(version: ProtocolVersion, client_id: &str) -> Connect {
    Connect {
        protocol: version,
        clean_start: true,
        keep_alive: 0,
        client_id: client_id.into(),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
    }
}

pub fn publish_packet(
    topic: &str,
    payload: &[u8],
    qos: QoS,
    retain: bool,
    packet_id: u16,
) -> Publish {
    Publish {
        dup: false,
        qos,
        retain,
        topic: topic.into(),
        packet_id: (qos != QoS::AtMostOnce).then_some(packet_id),
        payload: Bytes::copy_from_slice(payload),
        properties: PublishProperties::default(),
    }
}

/// An authenticator driven by a closure, for tests.
pub struct FnAuth<F>(pub F);

impl<F: FnMut(&meridian_core::broker::AuthRequest<'_>) -> AuthOutcome> Authenticator for FnAuth<F> {
    fn authenticate(&mut self, r: &meridian_core::broker::AuthRequest<'_>) -> AuthOutcome {
        (self.0)(r)
    }
}
