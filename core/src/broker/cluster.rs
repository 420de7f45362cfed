//! The broker as a node of a multi-region deployment: its route set replicated to peers,
//! their route sets replicated here, and PUBLISH forwarded once per node that wants it,
//! QoS 1/2 through a durable per-peer outbox, deduplicated on arrival.
//!
//! Nothing here waits on another region: a client's SUBSCRIBE is answered locally and its
//! route reaches peers in the next batch; a PUBLISH is acknowledged once it is routed locally
//! and queued (persisted) for every peer that wants it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::io::{ConnId, Event, Output, Timestamp};
use super::message::Message;
use super::persist::Key;
use super::session::SessionId;
use super::subscribe::RetainedFor;
use super::{Authenticator, Authorizer, Broker, Timer};
use crate::codec::{Publish, PublishProperties, QoS, SubAck};
use crate::link::{
    self, Arrival, DEFAULT_MAX_FRAME_LEN, DigestEntry, Forward, Frame, Inbox,
    LINK_PROTOCOL_VERSION, Outbox, OutboxLimits, RetainedUpdate,
};
use crate::retained::{Hlc, LwwMap, Stamp};
use crate::routes::{DeltaOutcome, NodeId, Owner, RouteLog, RouteTable, SnapshotOutcome};

/// This node's identity in the deployment and the bounds of its links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    pub node: NodeId,
    /// Must grow on every start of the node (the shell keeps a counter in its data dir).
    pub incarnation: u64,
    pub region: String,
    /// Route changes are collected for this long, then sent as one delta.
    pub route_batch_ms: u64,
    /// How often this node announces its route-set version (anti-entropy).
    pub digest_interval_ms: u64,
    /// Route changes kept for peers that are behind; beyond, they get a snapshot.
    pub tombstone_budget: usize,
    pub snapshot_chunk_filters: usize,
    /// Per-peer outbox of QoS 1/2 forwards. When one is full, a QoS 1/2 PUBLISH that a node
    /// behind it wants is refused with 0x97 (MQTT 5.0) so that nothing acknowledged is lost;
    /// an MQTT 3.1.1 publisher cannot be told, so the forward to that node is dropped and
    /// counted (`Stats::dropped_outbox_full`).
    pub outbox: OutboxLimits,
    /// Subscription fence: hold the SUBACK of a SUBSCRIBE until every peer whose link is up
    /// has applied the route change that makes this node want the new filters, so that a
    /// message published on any node after the client got its SUBACK reaches it. Costs a
    /// route batch plus a round trip to the farthest connected peer per SUBSCRIBE. A peer
    /// whose link goes down stops being waited for (it learns the route when the link comes
    /// back), and no SUBACK waits longer than `subscribe_fence_max_ms`. Off by default.
    pub subscribe_fence: bool,
    pub subscribe_fence_max_ms: u64,
    /// Held SUBACKs at most; past it, SUBACKs go out without waiting.
    pub subscribe_fence_max_held: usize,
    /// Retained deletes remembered (as tombstones, so that an older message arriving late
    /// cannot come back); beyond, the oldest are forgotten.
    pub retained_tombstones_max: usize,
}

impl ClusterConfig {
    pub fn new(node: NodeId, incarnation: u64, region: impl Into<String>) -> Self {
        Self {
            node,
            incarnation,
            region: region.into(),
            route_batch_ms: 20,
            digest_interval_ms: 5_000,
            tombstone_budget: 100_000,
            snapshot_chunk_filters: 10_000,
            outbox: OutboxLimits {
                window: 1_024,
                max_messages: 100_000,
                max_bytes: 256 * 1024 * 1024,
            },
            subscribe_fence: false,
            subscribe_fence_max_ms: 10_000,
            subscribe_fence_max_held: 100_000,
            retained_tombstones_max: 100_000,
        }
    }
}

/// What the broker knows about one peer node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSummary {
    pub node: NodeId,
    pub connected: bool,
    pub region: Option<String>,
    /// Filters the peer has subscribers for, as replicated here.
    pub routes: usize,
    /// Route-set version replicated here, and the latest the peer announced.
    pub route_version: u64,
    pub announced_version: u64,
    pub outbox_messages: usize,
    pub outbox_bytes: usize,
    pub forwarded_to: u64,
    pub forwarded_from: u64,
}

#[derive(Debug)]
struct Peer {
    connected: bool,
    /// The shell reported the link congested ([`crate::Input::PeerCongested`]): no QoS 0
    /// forwards until it drains or the next session.
    congested: bool,
    region: Option<String>,
    outbox: Outbox,
    announced_version: u64,
    forwarded_to: u64,
    forwarded_from: u64,
}

/// A message as it travels on the link: every property, the expiry interval set to what
/// remains.
fn link_publish(message: &Message, now: Timestamp) -> Publish {
    let mut properties = PublishProperties::clone(&message.properties);
    properties.message_expiry_interval = message.remaining_expiry_secs(now).map(|s| s.max(1));
    Publish {
        dup: false,
        qos: message.qos,
        retain: message.retain,
        topic: message.topic.to_string(),
        packet_id: (message.qos != QoS::AtMostOnce).then_some(1),
        payload: message.payload.clone(),
        properties,
    }
}

/// A SUBACK held by the subscription fence.
#[derive(Debug)]
struct Fence {
    conn: ConnId,
    sid: SessionId,
    suback: SubAck,
    retained: Vec<RetainedFor>,
    /// The route-set version every waited-for peer must have applied; `None` until the batch
    /// holding the new filters is flushed.
    target: Option<u64>,
    peers: Vec<NodeId>,
    deadline: Timestamp,
}

#[derive(Debug)]
pub(super) struct Cluster {
    config: ClusterConfig,
    owner: Owner,
    routes: RouteLog,
    table: RouteTable,
    peers: BTreeMap<NodeId, Peer>,
    inbox: Inbox,
    flush_armed: bool,
    scratch: Vec<NodeId>,
    /// Held SUBACKs, in the order their SUBSCRIBEs arrived.
    fences: VecDeque<Fence>,
    /// Clock of retained writes, and the stamp of every topic's last write.
    hlc: Hlc,
    retained: LwwMap<()>,
}

impl Cluster {
    pub(super) fn new(config: ClusterConfig, seed: u64) -> Self {
        let owner = Owner {
            node: config.node.clone(),
            incarnation: config.incarnation,
        };
        Self {
            routes: RouteLog::new(owner.clone(), config.tombstone_budget),
            table: RouteTable::new(seed).journal(),
            owner,
            peers: BTreeMap::new(),
            inbox: Inbox::default(),
            flush_armed: false,
            scratch: Vec::new(),
            fences: VecDeque::new(),
            hlc: Hlc::default(),
            retained: LwwMap::new(),
            config,
        }
    }

    fn peer(&mut self, node: &NodeId) -> &mut Peer {
        let limits = self.config.outbox;
        self.peers.entry(node.clone()).or_insert_with(|| Peer {
            connected: false,
            congested: false,
            region: None,
            outbox: Outbox::new(limits),
            announced_version: 0,
            forwarded_to: 0,
            forwarded_from: 0,
        })
    }

    fn own_digest(&self) -> Frame {
        Frame::Digest(vec![DigestEntry {
            owner: self.owner.clone(),
            version: self.routes.version(),
            hash: self.routes.hash(),
        }])
    }
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Make this broker a node of a deployment. Call before [`Broker::restore`] and before
    /// accepting connections.
    pub fn enable_cluster(&mut self, config: ClusterConfig) {
        let seed = self.config.seed ^ 0x5eed;
        let cluster = Cluster::new(config, seed);
        let first_digest = self.now.plus_ms(cluster.config.digest_interval_ms);
        self.cluster = Some(Box::new(cluster));
        self.timers.insert((first_digest, Timer::Digest));
    }

    /// Peers this node knows, for admin listings and metrics.
    pub fn peers(&self) -> Vec<PeerSummary> {
        let Some(c) = &self.cluster else {
            return Vec::new();
        };
        c.peers
            .iter()
            .map(|(node, p)| {
                let replica = c.table.replica(node);
                PeerSummary {
                    node: node.clone(),
                    connected: p.connected,
                    region: p.region.clone(),
                    routes: replica.map_or(0, |r| r.len()),
                    route_version: replica.map_or(0, |r| r.version),
                    announced_version: p.announced_version,
                    outbox_messages: p.outbox.len(),
                    outbox_bytes: p.outbox.bytes(),
                    forwarded_to: p.forwarded_to,
                    forwarded_from: p.forwarded_from,
                }
            })
            .collect()
    }

    /// Nodes whose subscribers want `topic` (for tests and admin tools).
    pub fn nodes_for(&self, topic: &str) -> Vec<NodeId> {
        let mut out = Vec::new();
        if let Some(c) = &self.cluster {
            c.table.nodes_for(topic, &mut out);
        }
        out
    }

    fn send_to_peer(&mut self, peer: NodeId, frame: Frame) {
        self.outputs.push_back(Output::ToPeer { peer, frame });
    }

    // ----- route set -----

    /// A filter pattern got its first local subscriber.
    pub(super) fn route_added(&mut self, filter: &str) {
        self.event(Event::RouteAdded {
            filter: filter.to_owned(),
        });
        if let Some(c) = &mut self.cluster {
            c.routes.add(filter);
            self.arm_route_flush();
        }
    }

    /// A filter pattern lost its last local subscriber.
    pub(super) fn route_removed(&mut self, filter: &str) {
        self.event(Event::RouteRemoved {
            filter: filter.to_owned(),
        });
        if let Some(c) = &mut self.cluster {
            c.routes.remove(filter);
            self.arm_route_flush();
        }
    }

    fn arm_route_flush(&mut self) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        if !c.flush_armed && c.routes.has_pending() {
            c.flush_armed = true;
            self.timers
                .insert((now.plus_ms(c.config.route_batch_ms), Timer::RouteFlush));
        }
    }

    pub(super) fn fire_route_flush(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        c.flush_armed = false;
        let delta = c.routes.flush();
        let version = c.routes.version();
        for fence in c.fences.iter_mut().filter(|f| f.target.is_none()) {
            fence.target = Some(version);
        }
        if let Some(delta) = delta {
            self.outputs.push_back(Output::Broadcast {
                frame: Frame::RouteDelta(delta),
            });
        }
        self.release_fences();
    }

    // ----- subscription fence -----

    /// With the fence on, keep a SUBACK until the connected peers know the routes; returns
    /// it back if it may go now.
    #[allow(clippy::type_complexity)]
    pub(super) fn hold_suback(
        &mut self,
        conn: ConnId,
        sid: SessionId,
        granted: bool,
        suback: SubAck,
        retained: Vec<RetainedFor>,
    ) -> Option<(SubAck, Vec<RetainedFor>)> {
        let now = self.now;
        let Some(c) = &mut self.cluster else {
            return Some((suback, retained));
        };
        let peers: Vec<NodeId> = c
            .peers
            .iter()
            .filter(|(_, p)| p.connected)
            .map(|(n, _)| n.clone())
            .collect();
        let earlier_held = c.fences.iter().any(|f| f.conn == conn);
        let wanted = c.config.subscribe_fence && granted && !peers.is_empty();
        if !(wanted || earlier_held) || c.fences.len() >= c.config.subscribe_fence_max_held {
            return Some((suback, retained));
        }
        let target = (!c.routes.has_pending()).then(|| c.routes.version());
        let deadline = now.plus_ms(c.config.subscribe_fence_max_ms);
        c.fences.push_back(Fence {
            conn,
            sid,
            suback,
            retained,
            target,
            peers,
            deadline,
        });
        self.timers.insert((deadline, Timer::SubscribeFence));
        self.release_fences();
        None
    }

    /// Send every held SUBACK whose peers have all applied its routes (or whose wait is
    /// over), keeping each connection's SUBACKs in order.
    pub(super) fn release_fences(&mut self) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let mut ready = Vec::new();
        let mut blocked: BTreeSet<ConnId> = BTreeSet::new();
        let mut i = 0;
        while i < c.fences.len() {
            let f = &c.fences[i];
            let done = f.deadline <= now
                || f.target.is_some_and(|target| {
                    f.peers.iter().all(|p| {
                        c.routes.acked(p).unwrap_or(0) >= target
                            || !c.peers.get(p).is_some_and(|x| x.connected)
                    })
                });
            if done && !blocked.contains(&f.conn) {
                if let Some(f) = c.fences.remove(i) {
                    ready.push(f);
                }
            } else {
                blocked.insert(f.conn);
                i += 1;
            }
        }
        for f in ready {
            self.send_suback(f.conn, f.sid, f.suback, f.retained);
        }
    }

    /// SUBACKs held by the subscription fence.
    pub fn held_subacks(&self) -> usize {
        self.cluster.as_ref().map_or(0, |c| c.fences.len())
    }

    pub(super) fn fire_digest(&mut self) {
        let Some(c) = &self.cluster else { return };
        let frame = c.own_digest();
        let next = self.now.plus_ms(c.config.digest_interval_ms);
        self.outputs.push_back(Output::Broadcast { frame });
        self.timers.insert((next, Timer::Digest));
    }

    // ----- links -----

    pub(super) fn on_peer_up(&mut self, peer: NodeId) {
        let Some(c) = &mut self.cluster else { return };
        if peer == c.owner.node {
            return;
        }
        let p = c.peer(&peer);
        p.connected = true;
        p.congested = false;
        c.routes.add_peer(peer.clone());
        let hello = Frame::Hello {
            node: c.owner.node.clone(),
            incarnation: c.owner.incarnation,
            protocol: LINK_PROTOCOL_VERSION,
            region: c.config.region.clone(),
        };
        let digest = c.own_digest();
        let (hash, entries) = c.retained.digest();
        self.send_to_peer(peer.clone(), hello);
        self.send_to_peer(peer.clone(), digest);
        self.send_to_peer(peer.clone(), Frame::RetainedDigest { hash, entries });
        self.pump_outbox(&peer);
    }

    pub(super) fn set_peer_congested(&mut self, peer: &NodeId, congested: bool) {
        let Some(c) = &mut self.cluster else { return };
        if let Some(p) = c.peers.get_mut(peer)
            && p.connected
        {
            p.congested = congested;
        }
    }

    pub(super) fn on_peer_down(&mut self, peer: NodeId) {
        let Some(c) = &mut self.cluster else { return };
        if let Some(p) = c.peers.get_mut(&peer) {
            p.connected = false;
            p.congested = false;
            p.outbox.link_down();
        }
        if !c.fences.is_empty() {
            self.release_fences();
        }
    }

    pub(super) fn on_peer_frame(&mut self, peer: NodeId, frame: Frame) {
        let Some(c) = &mut self.cluster else { return };
        match frame {
            Frame::Hello {
                region, protocol, ..
            } => {
                if protocol != LINK_PROTOCOL_VERSION {
                    self.stats.protocol_errors += 1;
                }
                c.peer(&peer).region = Some(region);
            }
            Frame::RouteDelta(delta) => {
                if delta.owner.node == c.owner.node {
                    return;
                }
                let owner = delta.owner.clone();
                let outcome = c.table.apply_delta(&delta);
                self.persist_replica(&owner.node, matches!(outcome, DeltaOutcome::Applied { .. }));
                let Some(c) = &mut self.cluster else { return };
                match outcome {
                    DeltaOutcome::Applied { version } => {
                        self.send_to_peer(owner.node.clone(), Frame::RouteAck { owner, version })
                    }
                    DeltaOutcome::Gap { after } => {
                        let hash = c.table.replica(&owner.node).map_or(0, |r| r.hash);
                        let entry = DigestEntry {
                            owner: owner.clone(),
                            version: after,
                            hash,
                        };
                        self.send_to_peer(owner.node, Frame::Digest(vec![entry]));
                    }
                    DeltaOutcome::NeedSnapshot => {
                        self.send_to_peer(owner.node, Frame::SnapshotRequest)
                    }
                    DeltaOutcome::Duplicate | DeltaOutcome::Stale => {}
                }
            }
            Frame::RouteAck { owner, version } => {
                if owner == c.owner {
                    c.routes.ack(&peer, version);
                    if !c.fences.is_empty() {
                        self.release_fences();
                    }
                }
            }
            Frame::Digest(entries) => {
                for entry in entries {
                    self.on_digest_entry(&peer, entry);
                }
            }
            Frame::SnapshotRequest => self.send_snapshot(&peer),
            Frame::SnapshotChunk(chunk) => {
                if chunk.owner.node == c.owner.node {
                    return;
                }
                let owner = chunk.owner.clone();
                let outcome = c.table.apply_snapshot_chunk(&chunk);
                let installed = matches!(outcome, SnapshotOutcome::Installed { .. });
                self.persist_replica(&owner.node, installed);
                match outcome {
                    SnapshotOutcome::Installed { version } => {
                        self.send_to_peer(owner.node.clone(), Frame::RouteAck { owner, version })
                    }
                    SnapshotOutcome::Corrupt => {
                        self.send_to_peer(owner.node, Frame::SnapshotRequest)
                    }
                    SnapshotOutcome::InProgress | SnapshotOutcome::Stale => {}
                }
            }
            Frame::Forward(forward) => self.on_forward(peer, forward),
            Frame::ForwardAck { seq, .. } => {
                let done = c.peer(&peer).outbox.ack(seq);
                for seq in done {
                    self.persist(
                        Key::Outbox {
                            peer: peer.to_string(),
                            seq,
                        }
                        .encode(),
                        None,
                    );
                }
                self.pump_outbox(&peer);
            }
            Frame::KeepAlive => {}
            Frame::Retained(update) => self.apply_retained_update(update),
            Frame::RetainedDigest { hash, entries } => {
                if c.retained.digest() != (hash, entries) {
                    self.send_retained_snapshot(&peer);
                }
            }
            Frame::RetainedSnapshot(updates) => {
                for update in updates {
                    self.apply_retained_update(update);
                }
            }
        }
    }

    /// A peer says where it stands for one owner's route set.
    fn on_digest_entry(&mut self, peer: &NodeId, entry: DigestEntry) {
        let Some(c) = &mut self.cluster else { return };
        if entry.owner.node == c.owner.node {
            // About our own routes: help the peer catch up.
            let same = entry.owner.incarnation == c.owner.incarnation;
            if same && entry.version == c.routes.version() && entry.hash == c.routes.hash() {
                return;
            }
            let delta = (same && entry.version <= c.routes.version())
                .then(|| c.routes.delta_since(entry.version))
                .flatten()
                .filter(|_| entry.version < c.routes.version());
            match delta {
                Some(delta) => self.send_to_peer(peer.clone(), Frame::RouteDelta(delta)),
                None => self.send_snapshot(peer),
            }
            return;
        }
        // About someone else's routes (usually the peer's own): are we behind?
        if entry.owner.node == *peer {
            c.peer(peer).announced_version = entry.version;
        }
        let replica = c.table.replica(&entry.owner.node);
        let (incarnation, version, hash) =
            replica.map_or((0, 0, 0), |r| (r.incarnation, r.version, r.hash));
        let behind = (incarnation, version) < (entry.owner.incarnation, entry.version);
        let diverged = (incarnation, version) == (entry.owner.incarnation, entry.version)
            && hash != entry.hash;
        if diverged || (behind && incarnation != entry.owner.incarnation) {
            self.send_to_peer(entry.owner.node, Frame::SnapshotRequest);
        } else if behind {
            let mine = DigestEntry {
                owner: entry.owner.clone(),
                version,
                hash,
            };
            self.send_to_peer(entry.owner.node, Frame::Digest(vec![mine]));
        }
    }

    fn send_snapshot(&mut self, peer: &NodeId) {
        let Some(c) = &self.cluster else { return };
        let chunks = c.routes.snapshot(c.config.snapshot_chunk_filters);
        for chunk in chunks {
            self.send_to_peer(peer.clone(), Frame::SnapshotChunk(chunk));
        }
    }

    // ----- forwarding -----

    /// Whether a QoS 1/2 message on `topic` would overflow the outbox of a node that wants it.
    pub(super) fn outbox_full_for(&self, topic: &str, weight: usize) -> bool {
        let Some(c) = &self.cluster else { return false };
        let mut nodes = Vec::new();
        c.table.nodes_for(topic, &mut nodes);
        nodes
            .iter()
            .any(|n| c.peers.get(n).is_some_and(|p| !p.outbox.has_room(weight)))
    }

    /// Send a locally published message to every node that has a matching subscriber, once.
    pub(super) fn forward(&mut self, message: &Arc<Message>) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let mut nodes = std::mem::take(&mut c.scratch);
        c.table.nodes_for(&message.topic, &mut nodes);
        if nodes.is_empty() {
            c.scratch = nodes;
            return;
        }
        let publish = if message.qos == QoS::AtMostOnce {
            link_publish(message, now)
        } else {
            // It may wait in the peers' outboxes.
            link_publish(&message.detached(), now)
        };
        let forward = Forward {
            origin: c.owner.clone(),
            seq: 0,
            message: publish,
        };
        for node in nodes.drain(..) {
            let Some(c) = &mut self.cluster else { break };
            let peer = c.peer(&node);
            if message.qos == QoS::AtMostOnce {
                if !peer.connected {
                    self.stats.dropped_peer_down += 1;
                } else if peer.congested {
                    self.stats.dropped_peer_congested += 1;
                } else {
                    peer.forwarded_to += 1;
                    self.send_to_peer(node, Frame::Forward(forward.clone()));
                }
                continue;
            }
            match peer.outbox.push(forward.clone()) {
                Ok(queued) => {
                    peer.forwarded_to += 1;
                    let mut value = BytesMut::new();
                    if link::encode(&Frame::Forward(queued.clone()), &mut value).is_ok() {
                        let key = Key::Outbox {
                            peer: node.to_string(),
                            seq: queued.seq,
                        };
                        self.persist(key.encode(), Some(value.freeze()));
                    }
                    self.pump_outbox(&node);
                }
                Err(_) => self.stats.dropped_outbox_full += 1,
            }
        }
        if let Some(c) = &mut self.cluster {
            c.scratch = nodes;
        }
    }

    /// Send what the window allows from a peer's outbox, if the link is up.
    fn pump_outbox(&mut self, node: &NodeId) {
        let Some(c) = &mut self.cluster else { return };
        let Some(peer) = c.peers.get_mut(node) else {
            return;
        };
        if !peer.connected {
            return;
        }
        for forward in peer.outbox.take_sendable() {
            self.send_to_peer(node.clone(), Frame::Forward(forward));
        }
    }

    /// A message forwarded by a peer: delivered to local subscribers only (never forwarded
    /// again, so nothing loops), once.
    fn on_forward(&mut self, peer: NodeId, forward: Forward) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        c.peer(&peer).forwarded_from += 1;
        let p = forward.message;
        let message = Message {
            topic: p.topic.as_str().into(),
            payload: p.payload,
            qos: p.qos,
            retain: p.retain,
            expires_at: p
                .properties
                .message_expiry_interval
                .map(|s| now.plus_secs(s)),
            properties: p.properties.into(),
            origin: None,
        };
        if p.qos == QoS::AtMostOnce {
            self.deliver_local(message);
            return;
        }
        let origin = forward.origin;
        let seq = forward.seq;
        if c.inbox.arrive(&origin, seq) == Arrival::Deliver {
            self.deliver_local(message);
            let key = Key::InboxMark {
                origin: origin.node.to_string(),
                incarnation: origin.incarnation,
            };
            self.persist(
                key.encode(),
                Some(Bytes::copy_from_slice(&seq.to_be_bytes())),
            );
        }
        self.send_to_peer(peer, Frame::ForwardAck { origin, seq });
    }

    /// Persist what changed in the replica of `node`'s route set, so that a restarted node
    /// keeps forwarding (into its outboxes) to nodes it cannot reach yet.
    /// Only what changed is written: nothing for a duplicate delta or a snapshot still arriving.
    fn persist_replica(&mut self, node: &NodeId, moved: bool) {
        let Some(c) = &mut self.cluster else { return };
        let changes = c.table.take_journal();
        if changes.is_empty() && !moved {
            return;
        }
        let position = c
            .table
            .replica(node)
            .map(|r| (r.incarnation, r.version, r.hash));
        for (owner, filter, present) in changes {
            let key = Key::ReplicaFilter {
                node: owner.to_string(),
                filter: filter.to_string(),
            };
            self.persist(key.encode(), present.then(Bytes::new));
        }
        if let Some((incarnation, version, hash)) = position {
            let mut value = BytesMut::with_capacity(24);
            value.put_u64(incarnation);
            value.put_u64(version);
            value.put_u64(hash);
            let key = Key::ReplicaPosition {
                node: node.to_string(),
            };
            self.persist(key.encode(), Some(value.freeze()));
        }
    }

    /// Restore a cluster record; false if the record is not a cluster one.
    pub(super) fn restore_cluster_record(
        &mut self,
        key: &Key,
        value: &[u8],
    ) -> Result<bool, super::RecordError> {
        let bad = |detail| super::RecordError {
            kind: "cluster",
            detail,
        };
        let Some(c) = &mut self.cluster else {
            return Ok(matches!(
                key,
                Key::Outbox { .. }
                    | Key::InboxMark { .. }
                    | Key::RetainedStamp { .. }
                    | Key::ReplicaPosition { .. }
                    | Key::ReplicaFilter { .. }
            ));
        };
        match key {
            Key::Outbox { peer, seq } => {
                let node = NodeId::new(peer).map_err(|_| bad("peer id"))?;
                let mut buf = BytesMut::from(value);
                match link::decode(&mut buf, DEFAULT_MAX_FRAME_LEN) {
                    Ok(Some(Frame::Forward(f))) if f.seq == *seq => c.peer(&node).outbox.restore(f),
                    _ => return Err(bad("outbox entry")),
                }
                Ok(true)
            }
            Key::RetainedStamp { topic } => {
                let (stamp, deleted) = super::persist::decode_stamp(value)?;
                c.hlc.observe(stamp.hlc, 0);
                // A stamp whose message is gone (expired while the node was down) is dropped.
                let live = self.retained.get(topic).is_some();
                if deleted || live {
                    let c = self.cluster.as_mut().expect("checked above");
                    c.retained.apply(topic, stamp, (!deleted).then_some(()));
                } else {
                    self.persist(key.encode(), None);
                }
                Ok(true)
            }
            Key::InboxMark {
                origin,
                incarnation,
            } => {
                let node = NodeId::new(origin).map_err(|_| bad("origin id"))?;
                let seq = <[u8; 8]>::try_from(value).map_err(|_| bad("inbox mark"))?;
                c.inbox.restore(
                    &Owner {
                        node,
                        incarnation: *incarnation,
                    },
                    u64::from_be_bytes(seq),
                );
                Ok(true)
            }
            Key::ReplicaPosition { node } => {
                let node = NodeId::new(node).map_err(|_| bad("replica node id"))?;
                let mut v = value;
                if v.len() != 24 {
                    return Err(bad("replica position"));
                }
                let (incarnation, version, hash) = (v.get_u64(), v.get_u64(), v.get_u64());
                c.table.restore_position(&node, incarnation, version, hash);
                Ok(true)
            }
            Key::ReplicaFilter { node, filter } => {
                let node = NodeId::new(node).map_err(|_| bad("replica node id"))?;
                c.table.restore_filter(&node, filter);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    // ----- retained messages across nodes -----

    /// A retained write accepted here (a message, or a delete by an empty payload): stamp it
    /// and send it to every connected peer.
    pub(super) fn replicate_retained(&mut self, message: &Message) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let stamp = Stamp {
            hlc: c.hlc.tick(now.as_millis()),
            node: c.owner.node.clone(),
        };
        let deleted = message.payload.is_empty();
        let update = RetainedUpdate {
            topic: message.topic.to_string(),
            stamp: stamp.clone(),
            message: (!deleted).then(|| link_publish(message, now)),
        };
        c.retained
            .apply(&message.topic, stamp.clone(), (!deleted).then_some(()));
        let peers: Vec<NodeId> = c
            .peers
            .iter()
            .filter(|(_, p)| p.connected)
            .map(|(n, _)| n.clone())
            .collect();
        self.persist_stamp(&message.topic, &stamp, deleted);
        self.prune_retained_tombstones();
        for peer in peers {
            self.send_to_peer(peer, Frame::Retained(update.clone()));
        }
    }

    fn persist_stamp(&mut self, topic: &str, stamp: &Stamp, deleted: bool) {
        let key = Key::RetainedStamp {
            topic: topic.to_owned(),
        };
        self.persist(
            key.encode(),
            Some(super::persist::encode_stamp(stamp, deleted)),
        );
    }

    fn prune_retained_tombstones(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        let max = c.config.retained_tombstones_max;
        for topic in c.retained.prune_tombstones(max) {
            let key = Key::RetainedStamp {
                topic: topic.to_string(),
            };
            self.persist(key.encode(), None);
        }
    }

    /// A retained write from another node: stored if it is newer than what this node has.
    fn apply_retained_update(&mut self, update: RetainedUpdate) {
        let now = self.now;
        if !self.config.retain_available {
            return;
        }
        let Some(c) = &mut self.cluster else { return };
        c.hlc.observe(update.stamp.hlc, now.as_millis());
        let deleted = update.message.is_none();
        if !c.retained.apply(
            &update.topic,
            update.stamp.clone(),
            (!deleted).then_some(()),
        ) {
            return;
        }
        self.persist_stamp(&update.topic, &update.stamp, deleted);
        self.prune_retained_tombstones();
        let mut message = match update.message {
            Some(p) => Message {
                topic: p.topic.as_str().into(),
                payload: p.payload,
                qos: p.qos,
                retain: true,
                expires_at: p
                    .properties
                    .message_expiry_interval
                    .map(|s| now.plus_secs(s)),
                properties: crate::codec::PublishProperties {
                    message_expiry_interval: None,
                    topic_alias: None,
                    subscription_identifiers: Vec::new(),
                    ..p.properties
                }
                .into(),
                origin: None,
            },
            None => Message {
                topic: update.topic.as_str().into(),
                payload: Bytes::new(),
                qos: QoS::AtMostOnce,
                retain: true,
                expires_at: None,
                properties: Default::default(),
                origin: None,
            },
        };
        // Its own bytes, not a part of the link frame it came in.
        message.detach();
        self.store_retained(&Arc::new(message));
    }

    /// Every retained write this node knows (tombstones included), in chunks.
    fn send_retained_snapshot(&mut self, peer: &NodeId) {
        const CHUNK_BYTES: usize = 1 << 20;
        let now = self.now;
        let Some(c) = &self.cluster else { return };
        let per_chunk = c.config.snapshot_chunk_filters.max(1);
        let mut chunks = Vec::new();
        let mut chunk = Vec::new();
        let mut bytes = 0;
        for (topic, entry) in c.retained.iter() {
            let message = match entry.value {
                None => None,
                Some(()) => match self.retained.get(topic) {
                    Some(m) if !m.is_expired(now) => Some(link_publish(m, now)),
                    // Not stored here (expired, or the store was full): nothing to offer.
                    _ => continue,
                },
            };
            bytes += topic.len() + message.as_ref().map_or(0, |m| m.payload.len());
            chunk.push(RetainedUpdate {
                topic: topic.to_string(),
                stamp: entry.stamp.clone(),
                message,
            });
            if chunk.len() >= per_chunk || bytes >= CHUNK_BYTES {
                chunks.push(std::mem::take(&mut chunk));
                bytes = 0;
            }
        }
        if !chunk.is_empty() {
            chunks.push(chunk);
        }
        for chunk in chunks {
            self.send_to_peer(peer.clone(), Frame::RetainedSnapshot(chunk));
        }
    }

    /// A retained message expired here: its stamp goes too (every node expires it by itself).
    pub(super) fn retained_expired(&mut self, topic: &str) {
        let Some(c) = &mut self.cluster else { return };
        if c.retained.forget(topic).is_some() {
            let key = Key::RetainedStamp {
                topic: topic.to_owned(),
            };
            self.persist(key.encode(), None);
        }
    }

    /// A summary of the retained writes this node holds, equal on nodes that agree:
    /// (hash, entries with tombstones). `None` outside cluster mode.
    pub fn retained_digest(&self) -> Option<(u64, u64)> {
        Some(self.cluster.as_ref()?.retained.digest())
    }

    /// This node's own route set (filters with a local subscriber), as last flushed.
    pub fn route_set(&self) -> Vec<String> {
        self.cluster
            .as_ref()
            .map_or_else(Vec::new, |c| c.routes.live().map(str::to_owned).collect())
    }

    /// Another node's route set as replicated here.
    pub fn replicated_routes(&self, node: &NodeId) -> Vec<String> {
        let Some(c) = &self.cluster else {
            return Vec::new();
        };
        let mut routes: Vec<String> = c
            .table
            .replica(node)
            .map(|r| r.filters().map(str::to_owned).collect())
            .unwrap_or_default();
        routes.sort();
        routes
    }

    /// This node's own route set as last flushed: (incarnation, version, hash).
    pub fn route_position(&self) -> Option<(u64, u64, u64)> {
        let c = self.cluster.as_ref()?;
        Some((c.owner.incarnation, c.routes.version(), c.routes.hash()))
    }

    /// Where this node's replica of `node`'s route set stands: (incarnation, version, hash).
    pub fn replica_position(&self, node: &NodeId) -> Option<(u64, u64, u64)> {
        let r = self.cluster.as_ref()?.table.replica(node)?;
        Some((r.incarnation, r.version, r.hash))
    }

    /// Whether route changes wait for the next batch.
    pub fn routes_pending(&self) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.routes.has_pending())
    }
}
