//! A deterministic simulation of a whole deployment in virtual time (feature `sim`).
//!
//! Nodes are real [`Broker`]s in cluster mode, each with an in-memory store; links between them
//! carry link frames with latency and jitter, ordered for the point-to-point stream and lossy,
//! duplicating and reordering for broadcasts (gossip); links can be cut and healed; nodes can
//! crash (losing everything not persisted) and restart with a new incarnation; clients speak
//! MQTT 5.0 through the real codec with their own round trip to their node. One seed gives one
//! run: [`Sim::trace_hash`] is the same every time, which [`Sim`]'s tests check.

mod client;
mod geo;
mod rng;
mod scenario;
mod timeline;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use bytes::Bytes;

pub use client::{Received, SimClient};
pub use geo::{
    GeoRow, HKG_CPT_RTT_MS, cross_region_latency, geo_writeup, geo_writeup_reports,
    region_partition, subscribe_fence, writeup_deployment,
};
pub use rng::Rng;
pub use scenario::{
    ClientGroup, DeliveryRow, Fault, FaultKind, LatencyRow, NodeSpec, PublishPlan, Report,
    Scenario, ScenarioError, SubscribeRow,
};
pub use timeline::{Timeline, TimelineEvent, TimelineKind};

use crate::broker::ClusterConfig;
use crate::codec::QoS;
use crate::link::{EncodedFrame, Frame, FrameKind};
use crate::routes::NodeId;
use crate::{Broker, Config, ConnId, ConnInfo, Input, Output, Timestamp};

/// Virtual time starts here (milliseconds), so that no timestamp is zero.
const EPOCH_MS: u64 = 1_000_000;

/// Frames of one kind put on links, and their encoded size ([`EncodedFrame::len`],
/// length prefix included); a broadcast counts once per peer it is sent to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkTraffic {
    /// Frames sent.
    pub frames: u64,
    /// Their encoded bytes.
    pub bytes: u64,
}

/// The behaviour of the link between two nodes (both directions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkSpec {
    /// Round-trip time; each direction takes half.
    pub rtt_ms: u64,
    /// Up to this much extra delay per frame (stream frames stay in order).
    pub jitter_ms: u64,
    /// Broadcast (gossip) frames lost, and duplicated, per million.
    pub gossip_loss_ppm: u32,
    /// Broadcast (gossip) frames duplicated, per million.
    pub gossip_dup_ppm: u32,
}

impl LinkSpec {
    /// A link with this round-trip time in milliseconds: no jitter, no gossip loss or duplication.
    pub fn rtt(rtt_ms: u64) -> Self {
        Self {
            rtt_ms,
            jitter_ms: 0,
            gossip_loss_ppm: 0,
            gossip_dup_ppm: 0,
        }
    }
}

#[derive(Debug)]
struct Link {
    spec: LinkSpec,
    up: bool,
    /// Cut by a fault ([`Action::Cut`]) until it heals ([`Action::Heal`]): a node that restarts
    /// meanwhile does not reach over it.
    held_down: bool,
    /// Bumped on every cut: stream frames of an earlier epoch died with the connection.
    epoch: u64,
    /// When the last stream frame in each direction arrives (keeps the stream ordered).
    stream_tail: [u64; 2],
}

#[derive(Debug)]
struct Node {
    broker: Option<Broker>,
    store: BTreeMap<Bytes, Bytes>,
    cluster: ClusterConfig,
    timer_at: Option<u64>,
    /// Connection -> client index.
    conns: BTreeMap<ConnId, usize>,
}

/// A client action, scheduled with [`Sim::at`].
#[derive(Debug, Clone)]
pub enum Action {
    /// Connect a client to its node (CONNECT goes after a TCP round trip).
    Connect {
        /// The client's index ([`Sim::add_client`]).
        client: usize,
    },
    /// Connect, and subscribe as soon as CONNACK arrives.
    ConnectAndSubscribe {
        /// The client's index.
        client: usize,
        /// The topic filter.
        filter: String,
        /// The maximum QoS asked for.
        qos: QoS,
    },
    /// Send a SUBSCRIBE from a client.
    Subscribe {
        /// The client's index.
        client: usize,
        /// The topic filter.
        filter: String,
        /// The maximum QoS asked for.
        qos: QoS,
    },
    /// Send a PUBLISH from a client (skipped if it has no CONNACK yet).
    Publish {
        /// The client's index.
        client: usize,
        /// The topic name.
        topic: String,
        /// The payload.
        payload: Bytes,
        /// The QoS to publish with.
        qos: QoS,
        /// Whether to publish it retained.
        retain: bool,
    },
    /// Cut the link between two nodes ([`Sim::cut`]).
    Cut {
        /// One end.
        a: NodeId,
        /// The other end.
        b: NodeId,
    },
    /// Heal the link between two nodes ([`Sim::heal`]).
    Heal {
        /// One end.
        a: NodeId,
        /// The other end.
        b: NodeId,
    },
    /// Crash a node ([`Sim::crash`]).
    Crash {
        /// The node.
        node: NodeId,
    },
    /// Restart a crashed node ([`Sim::restart`]).
    Restart {
        /// The node.
        node: NodeId,
    },
    /// A client's connection drops (the node sees it closed, without DISCONNECT).
    Drop {
        /// The client's index.
        client: usize,
    },
    /// A client moves to another node: it leaves its connection (unannounced, as a device
    /// that changes networks: the old node notices nothing until the new node's claim
    /// arrives) and connects there, resuming its session.
    Roam {
        /// The client's index.
        client: usize,
        /// The node it connects to now.
        node: NodeId,
    },
}

#[derive(Debug)]
enum Event {
    Act(Action),
    Frame {
        from: NodeId,
        to: NodeId,
        epoch: Option<u64>,
        sent: u64,
        frame: Box<Frame>,
    },
    /// Bytes a client sent on one connection (`via`: its node and connection then); lost
    /// if that connection is no longer the client's.
    ToNode {
        client: usize,
        via: Option<(NodeId, ConnId)>,
        data: Bytes,
    },
    ToClient {
        client: usize,
        node: NodeId,
        conn: ConnId,
        data: Bytes,
    },
    Timer {
        node: NodeId,
    },
}

/// The simulated world.
#[derive(Debug)]
pub struct Sim {
    now: u64,
    rng: Rng,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: BTreeMap<u64, Event>,
    nodes: BTreeMap<NodeId, Node>,
    links: BTreeMap<(NodeId, NodeId), Link>,
    /// The simulated clients, by index ([`Sim::add_client`]).
    pub clients: Vec<SimClient>,
    config: Config,
    trace: u64,
    /// Called after every event (invariant checks, measurements).
    observed_events: u64,
    timeline: Option<Timeline>,
    /// Link frames sent, by kind, once [`Sim::count_link_traffic`] was called.
    traffic: Option<BTreeMap<FrameKind, LinkTraffic>>,
}

fn key(a: &NodeId, b: &NodeId) -> (NodeId, NodeId) {
    if a < b {
        (a.clone(), b.clone())
    } else {
        (b.clone(), a.clone())
    }
}

impl Sim {
    /// Nodes `(name, region)`, every pair linked with `link(a, b)`.
    pub fn new(
        seed: u64,
        config: Config,
        nodes: &[(&str, &str)],
        link: impl Fn(&str, &str) -> LinkSpec,
        tweak: impl Fn(&mut ClusterConfig),
    ) -> Self {
        let mut sim = Self {
            now: EPOCH_MS,
            rng: Rng::new(seed),
            seq: 0,
            queue: BinaryHeap::new(),
            events: BTreeMap::new(),
            nodes: BTreeMap::new(),
            links: BTreeMap::new(),
            clients: Vec::new(),
            config,
            trace: 0xcbf2_9ce4_8422_2325,
            observed_events: 0,
            timeline: None,
            traffic: None,
        };
        for (name, region) in nodes {
            let id = NodeId::new(name).expect("simulated node names are valid");
            let mut cluster = ClusterConfig::new(id.clone(), 1, *region);
            tweak(&mut cluster);
            let mut node = Node {
                broker: None,
                store: BTreeMap::new(),
                cluster,
                timer_at: None,
                conns: BTreeMap::new(),
            };
            node.broker = Some(sim.boot(&node.cluster, &node.store));
            sim.nodes.insert(id, node);
        }
        for (i, (a, _)) in nodes.iter().enumerate() {
            for (b, _) in &nodes[i + 1..] {
                let (x, y) = (
                    NodeId::new(a).expect("valid"),
                    NodeId::new(b).expect("valid"),
                );
                sim.links.insert(
                    key(&x, &y),
                    Link {
                        spec: link(a, b),
                        up: false,
                        epoch: 0,
                        stream_tail: [0; 2],
                        held_down: false,
                    },
                );
            }
        }
        let pairs: Vec<(NodeId, NodeId)> = sim.links.keys().cloned().collect();
        for (a, b) in pairs {
            sim.heal(&a, &b);
        }
        sim
    }

    fn boot(&self, cluster: &ClusterConfig, store: &BTreeMap<Bytes, Bytes>) -> Broker {
        let mut config = self.config.clone();
        config.seed ^= cluster.incarnation.wrapping_mul(0x9E37_79B9)
            ^ crate::routes::filter_hash(cluster.node.as_str());
        let mut broker = Broker::new(config, Timestamp(self.now));
        broker.enable_cluster(Timestamp(self.now), cluster.clone());
        broker.restore(
            Timestamp(self.now),
            store.iter().map(|(k, v)| (k.clone(), v.clone())),
        );
        broker
    }

    /// Record a timeline of the run (at most `cap` events) from now on.
    pub fn record_timeline(&mut self, cap: usize) {
        self.timeline = Some(Timeline::new(cap));
    }

    /// The timeline recorded so far, if [`Sim::record_timeline`] was called.
    pub fn take_timeline(&mut self) -> Option<Timeline> {
        self.timeline.take()
    }

    fn note(&mut self, kind: TimelineKind) {
        let at = self.now - EPOCH_MS;
        if let Some(t) = &mut self.timeline {
            t.push(at, kind);
        }
    }

    /// Count the link frames sent, and their encoded bytes, from now on (each frame is encoded
    /// once more to measure it).
    pub fn count_link_traffic(&mut self) {
        self.traffic.get_or_insert_with(BTreeMap::new);
    }

    /// The link traffic counted since [`Sim::count_link_traffic`] or the last call, by frame
    /// kind; counting goes on from zero.
    pub fn take_link_traffic(&mut self) -> BTreeMap<FrameKind, LinkTraffic> {
        self.traffic
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Milliseconds since the simulation began.
    pub fn elapsed_ms(&self) -> u64 {
        self.now - EPOCH_MS
    }

    /// A hash of everything that happened, in order: equal for equal seeds.
    pub fn trace_hash(&self) -> u64 {
        self.trace
    }

    /// The broker of `node`; `None` while it is crashed, or for an unknown node.
    pub fn broker(&self, node: &NodeId) -> Option<&Broker> {
        self.nodes.get(node)?.broker.as_ref()
    }

    /// Every node's id, in order.
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes.keys().cloned().collect()
    }

    /// Add a client of `node` with its round trip to it; returns its index.
    pub fn add_client(&mut self, name: &str, node: &NodeId, rtt_ms: u64) -> usize {
        self.clients
            .push(SimClient::new(name.to_owned(), node.clone(), rtt_ms));
        self.clients.len() - 1
    }

    /// Schedule an action `at_ms` after the start of the simulation.
    pub fn at(&mut self, at_ms: u64, action: Action) {
        self.schedule(EPOCH_MS + at_ms, Event::Act(action));
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse((at.max(self.now), self.seq)));
        self.events.insert(self.seq, event);
    }

    fn mix(&mut self, parts: &[u64]) {
        for p in parts {
            for b in p.to_le_bytes() {
                self.trace ^= u64::from(b);
                self.trace = self.trace.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }

    /// Run events until `until_ms` after the start (or until nothing is left), calling
    /// `observe` after each one.
    pub fn run_until(&mut self, until_ms: u64, mut observe: impl FnMut(&Sim)) {
        let until = EPOCH_MS + until_ms;
        while let Some(Reverse((at, seq))) = self.queue.peek().copied() {
            if at > until {
                break;
            }
            self.queue.pop();
            self.now = at;
            let Some(event) = self.events.remove(&seq) else {
                continue;
            };
            self.handle(event);
            self.observed_events += 1;
            observe(self);
        }
        self.now = self.now.max(until);
    }

    /// Run until no event is left (bounded by `limit_ms`).
    pub fn run_to_quiet(&mut self, limit_ms: u64) {
        let limit = self.elapsed_ms() + limit_ms;
        self.run_until(limit, |_| {});
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Act(action) => self.act(action),
            Event::Frame {
                from,
                to,
                epoch,
                sent,
                frame,
            } => {
                let link = self.links.get(&key(&from, &to));
                let alive = link.is_some_and(|l| l.up && epoch.is_none_or(|e| e == l.epoch));
                if alive {
                    self.mix(&[self.now, 1, crate::routes::filter_hash(frame.name())]);
                    if self.timeline.is_some() && drawn(&frame) {
                        self.note(TimelineKind::Frame {
                            from: from.clone(),
                            to: to.clone(),
                            sent_ms: sent - EPOCH_MS,
                            frame: frame.kind(),
                        });
                    }
                    self.feed(&to, Input::PeerFrame { peer: from, frame });
                }
            }
            Event::ToNode { client, via, data } => {
                let Some(c) = self.clients.get(client) else {
                    return;
                };
                let Some((node, conn)) = via else { return };
                if c.node == node && c.conn == Some(conn) {
                    self.mix(&[self.now, 2, client as u64, data.len() as u64]);
                    self.feed(&node, Input::Bytes { conn, data: &data });
                }
            }
            Event::ToClient {
                client,
                node,
                conn,
                data,
            } => {
                let Some(c) = self.clients.get_mut(client) else {
                    return;
                };
                if c.node != node || c.conn != Some(conn) {
                    return;
                }
                let replies = c.receive(self.now - EPOCH_MS, &data);
                let half = c.rtt_ms / 2;
                let via = Some((c.node.clone(), conn));
                self.mix(&[self.now, 3, client as u64, data.len() as u64]);
                for reply in replies {
                    self.schedule(
                        self.now + half,
                        Event::ToNode {
                            client,
                            via: via.clone(),
                            data: reply,
                        },
                    );
                }
            }
            Event::Timer { node } => {
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.timer_at = None;
                }
                self.feed(&node, Input::Timeout);
            }
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Connect { client } => {
                let Some(c) = self.clients.get(client) else {
                    return;
                };
                let node = c.node.clone();
                let half = c.rtt_ms / 2;
                let bytes = c.connect_bytes();
                let now = Timestamp(self.now);
                let Some(n) = self.nodes.get_mut(&node) else {
                    return;
                };
                let Some(broker) = n.broker.as_mut() else {
                    return;
                };
                let conn = broker.accept(now, ConnInfo::default());
                n.conns.insert(conn, client);
                self.clients[client].conn = Some(conn);
                // The TCP handshake takes one round trip before CONNECT is sent.
                self.schedule(
                    self.now + half + self.clients[client].rtt_ms,
                    Event::ToNode {
                        client,
                        via: Some((node, conn)),
                        data: bytes,
                    },
                );
            }
            Action::ConnectAndSubscribe {
                client,
                filter,
                qos,
            } => {
                if let Some(c) = self.clients.get_mut(client) {
                    c.subscribe_on_connack.push((filter, qos));
                }
                self.act(Action::Connect { client });
            }
            Action::Subscribe {
                client,
                filter,
                qos,
            } => {
                let half = self.clients[client].rtt_ms / 2;
                let bytes = self.clients[client].subscribe_bytes(&filter, qos);
                let via = self.clients[client].via();
                self.schedule(
                    self.now + half,
                    Event::ToNode {
                        client,
                        via,
                        data: bytes,
                    },
                );
            }
            Action::Publish {
                client,
                topic,
                payload,
                qos,
                retain,
            } => {
                let Some(c) = self.clients.get(client) else {
                    return;
                };
                // A client sends nothing before its CONNACK (that would be a protocol error).
                if c.conn.is_none() || c.connack_at_ms.is_none() {
                    return;
                }
                let half = self.clients[client].rtt_ms / 2;
                let bytes = self.clients[client].publish_bytes(&topic, payload, qos, retain);
                let via = self.clients[client].via();
                self.schedule(
                    self.now + half,
                    Event::ToNode {
                        client,
                        via,
                        data: bytes,
                    },
                );
            }
            Action::Drop { client } => {
                let Some((node, conn)) = self.clients.get(client).and_then(SimClient::via) else {
                    return;
                };
                self.clients[client].disconnected();
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.conns.remove(&conn);
                }
                self.feed(&node, Input::Closed { conn });
            }
            Action::Roam { client, node } => {
                let Some(c) = self.clients.get_mut(client) else {
                    return;
                };
                // The old connection is left open: the node that held it closes it when the
                // new node's claim arrives (or its keep alive would).
                c.disconnected();
                c.node = node;
                self.act(Action::Connect { client });
            }
            Action::Cut { a, b } => {
                if let Some(link) = self.links.get_mut(&key(&a, &b)) {
                    link.held_down = true;
                }
                self.cut(&a, &b);
            }
            Action::Heal { a, b } => {
                if let Some(link) = self.links.get_mut(&key(&a, &b)) {
                    link.held_down = false;
                }
                self.heal(&a, &b);
            }
            Action::Crash { node } => self.crash(&node),
            Action::Restart { node } => self.restart(&node),
        }
    }

    /// Cut a link: frames on it are lost; both ends see the link go down.
    pub fn cut(&mut self, a: &NodeId, b: &NodeId) {
        let Some(link) = self.links.get_mut(&key(a, b)) else {
            return;
        };
        if !link.up {
            return;
        }
        link.up = false;
        link.epoch += 1;
        self.note(TimelineKind::LinkDown {
            a: a.clone(),
            b: b.clone(),
        });
        for (x, y) in [(a, b), (b, a)] {
            self.feed(x, Input::PeerDown { peer: y.clone() });
        }
    }

    /// Heal a link: both ends see it come up.
    pub fn heal(&mut self, a: &NodeId, b: &NodeId) {
        let both_alive = self.nodes.get(a).is_some_and(|n| n.broker.is_some())
            && self.nodes.get(b).is_some_and(|n| n.broker.is_some());
        let Some(link) = self.links.get_mut(&key(a, b)) else {
            return;
        };
        if link.up || !both_alive {
            return;
        }
        link.up = true;
        link.epoch += 1;
        link.stream_tail = [self.now; 2];
        if self.now > EPOCH_MS {
            self.note(TimelineKind::LinkUp {
                a: a.clone(),
                b: b.clone(),
            });
        }
        for (x, y) in [(a, b), (b, a)] {
            self.feed(x, Input::PeerUp { peer: y.clone() });
        }
    }

    /// A node crashes: its connections and links drop, only its store survives.
    pub fn crash(&mut self, node: &NodeId) {
        let others: Vec<NodeId> = self.nodes.keys().filter(|n| *n != node).cloned().collect();
        for other in &others {
            self.cut(node, other);
        }
        if self.nodes.get(node).is_none_or(|n| n.broker.is_none()) {
            return;
        }
        self.note(TimelineKind::Crash { node: node.clone() });
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        n.broker = None;
        n.timer_at = None;
        for (_, client) in std::mem::take(&mut n.conns) {
            self.clients[client].disconnected();
        }
    }

    /// A crashed node starts again from its store, with a new incarnation; its links come up
    /// again, but for those a fault holds down ([`Action::Cut`] until [`Action::Heal`]).
    pub fn restart(&mut self, node: &NodeId) {
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        if n.broker.is_some() {
            return;
        }
        n.cluster.incarnation += 1;
        let (cluster, store) = (n.cluster.clone(), n.store.clone());
        self.note(TimelineKind::Restart { node: node.clone() });
        let broker = self.boot(&cluster, &store);
        if let Some(n) = self.nodes.get_mut(node) {
            n.broker = Some(broker);
        }
        self.after_input(node);
        let others: Vec<NodeId> = self.nodes.keys().filter(|n| *n != node).cloned().collect();
        for other in others {
            // A link a fault holds down stays down until the fault heals it.
            if self
                .links
                .get(&key(node, &other))
                .is_some_and(|l| !l.held_down)
            {
                self.heal(node, &other);
            }
        }
    }

    fn feed(&mut self, node: &NodeId, input: Input<'_>) {
        let now = Timestamp(self.now);
        let Some(broker) = self.nodes.get_mut(node).and_then(|n| n.broker.as_mut()) else {
            return;
        };
        broker.handle_input(now, input);
        self.after_input(node);
    }

    /// Apply a node's outputs the way a shell would, and arm its timer.
    fn after_input(&mut self, node: &NodeId) {
        let mut outputs = Vec::new();
        if let Some(broker) = self.nodes.get_mut(node).and_then(|n| n.broker.as_mut()) {
            while let Some(out) = broker.poll_output() {
                outputs.push(out);
            }
        }
        for out in outputs {
            match out {
                Output::Send { conn, data } => {
                    let Some(&client) = self.nodes.get(node).and_then(|n| n.conns.get(&conn))
                    else {
                        continue;
                    };
                    let half = self.clients[client].rtt_ms / 2;
                    let node = node.clone();
                    self.schedule(
                        self.now + half,
                        Event::ToClient {
                            client,
                            node,
                            conn,
                            data,
                        },
                    );
                }
                Output::Close { conn } => {
                    if let Some(client) =
                        self.nodes.get_mut(node).and_then(|n| n.conns.remove(&conn))
                        && self.clients[client].node == *node
                        && self.clients[client].conn == Some(conn)
                    {
                        self.clients[client].disconnected();
                    }
                }
                Output::Persist { key, value, .. } => {
                    let Some(n) = self.nodes.get_mut(node) else {
                        continue;
                    };
                    match value {
                        Some(v) => n.store.insert(key, v),
                        None => n.store.remove(&key),
                    };
                }
                Output::Event(_) => {}
                Output::ToPeer { peer, frame } => self.send_frame(node, &peer, frame, true),
                Output::Broadcast { frame } => {
                    let peers: Vec<NodeId> =
                        self.nodes.keys().filter(|n| *n != node).cloned().collect();
                    for peer in peers {
                        self.send_frame(node, &peer, frame.clone(), false);
                    }
                }
                // The session ends (what was on it is lost) and, as a daemon redials, the
                // next one starts.
                Output::CutPeer { peer } => {
                    self.cut(node, &peer);
                    self.heal(node, &peer);
                }
            }
        }
        let next = self
            .nodes
            .get(node)
            .and_then(|n| n.broker.as_ref())
            .and_then(Broker::poll_timeout);
        if let Some(at) = next {
            let at = at.0.max(self.now);
            let Some(n) = self.nodes.get_mut(node) else {
                return;
            };
            if n.timer_at.is_none_or(|t| at < t) {
                n.timer_at = Some(at);
                self.schedule(at, Event::Timer { node: node.clone() });
            }
        }
    }

    fn send_frame(&mut self, from: &NodeId, to: &NodeId, encoded: EncodedFrame, stream: bool) {
        let k = key(from, to);
        let Some(link) = self.links.get(&k) else {
            return;
        };
        if !link.up {
            return;
        }
        if let Some(traffic) = &mut self.traffic {
            let t = traffic.entry(encoded.kind()).or_default();
            t.frames += 1;
            t.bytes += encoded.len() as u64;
        }
        // The receiver reads the bytes the sender wrote.
        let frame = match encoded.decode() {
            Ok(frame) => frame,
            Err(e) => {
                debug_assert!(false, "a frame the broker encoded does not decode: {e}");
                return;
            }
        };
        let spec = link.spec;
        let epoch = link.epoch;
        let delay = spec.rtt_ms / 2 + self.rng.up_to(spec.jitter_ms);
        if stream {
            let dir = usize::from(from > to);
            let link = self.links.get_mut(&k).expect("link exists");
            let at = (self.now + delay).max(link.stream_tail[dir]);
            link.stream_tail[dir] = at;
            self.schedule(
                at,
                Event::Frame {
                    from: from.clone(),
                    to: to.clone(),
                    epoch: Some(epoch),
                    sent: self.now,
                    frame: Box::new(frame),
                },
            );
        } else {
            if self.rng.chance(spec.gossip_loss_ppm) {
                return;
            }
            let copies = if self.rng.chance(spec.gossip_dup_ppm) {
                2
            } else {
                1
            };
            for _ in 0..copies {
                let delay = spec.rtt_ms / 2 + self.rng.up_to(spec.jitter_ms);
                self.schedule(
                    self.now + delay,
                    Event::Frame {
                        from: from.clone(),
                        to: to.clone(),
                        epoch: None,
                        sent: self.now,
                        frame: Box::new(frame.clone()),
                    },
                );
            }
        }
    }

    /// Whether every running node's replica of every other running node's route set is at
    /// the owner's incarnation, version and hash (cheap enough to check after every event).
    pub fn routes_in_sync(&self) -> bool {
        self.nodes.iter().all(|(owner, n)| {
            let Some(position) = n.broker.as_ref().and_then(Broker::route_position) else {
                return true;
            };
            self.nodes
                .iter()
                .filter(|(other, _)| *other != owner)
                .all(|(_, m)| {
                    // No replica yet is as good as one of an empty set never changed.
                    m.broker.as_ref().is_none_or(|mb| {
                        mb.replica_position(owner)
                            .map_or(position.version == 0, |p| p == position)
                    })
                })
        })
    }

    /// The node a client belongs to, and its region.
    pub fn region_of(&self, node: &NodeId) -> Option<&str> {
        Some(self.nodes.get(node)?.cluster.region.as_str())
    }

    /// Whether every node's replica of every other node's routes equals that node's own set.
    pub fn routes_converged(&self) -> bool {
        self.nodes.iter().all(|(owner, n)| {
            let Some(b) = &n.broker else { return true };
            let mut own = b.route_set();
            own.sort();
            self.nodes
                .iter()
                .filter(|(other, _)| *other != owner)
                .all(|(_, m)| {
                    m.broker
                        .as_ref()
                        .is_none_or(|mb| mb.replicated_routes(owner) == own)
                })
        })
    }
}

/// Frames worth drawing on a timeline: those that carry routes, messages or retained messages.
fn drawn(frame: &Frame) -> bool {
    matches!(
        frame,
        Frame::RouteDelta(_)
            | Frame::SnapshotChunk(_)
            | Frame::Forward(_)
            | Frame::Retained(_)
            | Frame::RetainedSnapshot(_)
    )
}
