//! The broker as a node of a multi-region deployment: its route set replicated to peers,
//! their route sets replicated here, and PUBLISH forwarded once per node that wants it,
//! QoS 1/2 through a durable per-peer outbox, deduplicated on arrival.
//!
//! Nothing here waits on another region: a client's SUBSCRIBE is answered locally and its
//! route reaches peers in the next batch; a PUBLISH is acknowledged once it is routed locally
//! and queued (persisted) for every peer that wants it.

use std::collections::{BTreeMap, VecDeque};

mod claims;
mod fence;
mod home;
mod intake;
mod relay;
mod transfer;
use fence::Fence;
mod forward;
mod leaves;
mod links;
mod membership;
mod records;
mod residency;
mod retained;
mod routes;
mod trust;

pub use home::HomeRegion;
pub use leaves::{LEAF_PREFIX, LeafError, LeafScope};
pub use membership::{ForgetError, ForgetReason, Forgotten};
pub(in crate::broker) use relay::Moving;
pub use trust::{PeerFault, PeerLimit, PeerLimits};

use crate::broker::io::{Output, Timestamp};
use crate::broker::{Authenticator, Authorizer, Broker, Timer};
use crate::link::{DigestEntry, EncodedFrame, Frame, Inbox, Outbox, OutboxLimits};
use crate::retained::{Hlc, LwwMap};
use crate::routes::{NodeId, Owner, RouteLog, RoutePosition, RouteTable};

/// This node's identity in the deployment and the bounds of its links.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// This node's id, unique in the deployment.
    pub node: NodeId,
    /// Must grow on every start of the node (the shell keeps a counter in its data dir).
    pub incarnation: u64,
    /// The region the node runs in, told to peers in [`Frame::Hello`].
    pub region: String,
    /// The operator's certificate of this node's id and region, sent in every hello, where
    /// the deployment has operator keys ([`Authorizer::vouches_region`](crate::broker::Authorizer::vouches_region)).
    pub certificate: Option<bytes::Bytes>,
    /// Only peers the authorizer vouches for by their hello's certificate are members: until
    /// a peer's hello is vouched for, nothing but that hello is taken from it, and nothing but
    /// this node's hello is sent to it; a hello that is not is refused and its session cut.
    /// (Leaves are held to their credentials instead.)
    pub members_certified: bool,
    /// Route changes are collected for this long, then sent as one delta.
    pub route_batch_ms: u64,
    /// How often this node announces its route-set version (anti-entropy).
    pub digest_interval_ms: u64,
    /// Route changes kept for peers that are behind; beyond, they get a snapshot.
    pub tombstone_budget: usize,
    /// Filters per route snapshot chunk; also the retained writes per retained snapshot chunk.
    pub snapshot_chunk_filters: usize,
    /// Per-peer outbox of QoS 1/2 forwards. When the outbox of a connected peer is full, a
    /// QoS 1/2 PUBLISH that the peer wants is refused with 0x97 (MQTT 5.0) so that nothing
    /// acknowledged is lost; an MQTT 3.1.1 publisher cannot be told, so the forward to that
    /// node is dropped and counted (`Stats::dropped_outbox_full`). A peer whose link is down,
    /// or that stalled ([`ClusterConfig::outbox_stall_ms`]), never makes a publisher wait or
    /// fail: its outbox keeps the newest messages within the bounds and drops the oldest
    /// (`Stats::dropped_peer_absent`).
    pub outbox: OutboxLimits,
    /// A peer whose link is up but that acknowledged no forward for this long while its
    /// outbox is full counts as not there: its outbox makes room by dropping its oldest
    /// messages instead of refusing publishers (a peer that never acknowledges cannot hold
    /// the others' publishers back).
    pub outbox_stall_ms: u64,
    /// Nodes this node keeps state for (links, route sets, outboxes); frames from a node
    /// beyond them are refused and its session cut.
    pub max_nodes: usize,
    /// What each peer may make this node hold.
    pub peer_limits: PeerLimits,
    /// A node without a link to this one for this long is forgotten: its routes withdrawn,
    /// what waited for it dropped ([`Broker::forget_peer`] does it at once).
    pub peer_expiry_ms: u64,
    /// A leaf ([`Broker::add_leaf`]) without a link to this node for this long is forgotten:
    /// its routes leave this node's route set and what waited for it is dropped (counted in
    /// `Stats::dropped_peer_forgotten`).
    pub leaf_expiry_ms: u64,
    /// Distinct filters this node's route set may hold (its own subscribers' and its leaves')
    /// for a SUBSCRIBE to add one: past it a new filter gets SUBACK 0x97 (3.1.1: 0x80),
    /// counted. Keep it within what its peers take from one node ([`PeerLimits::max_filters`],
    /// or `leaf_max_filters` at a leaf's hub), or they cut its link for the size of its
    /// interest. Leaves' filters are taken past it (each leaf has its own bound).
    pub max_route_filters: usize,
    /// Filters a leaf's route set may hold here (they join this node's own route set, which
    /// the mesh replicates): a leaf past it has its frame refused and its session cut, as a
    /// peer past [`PeerLimits`] is.
    pub leaf_max_filters: usize,
    /// Retained writes stamped further than this ahead of this node's clock are refused, so
    /// that a node with a wrong clock cannot make its writes win for ever.
    pub max_clock_drift_ms: u64,
    /// Subscription fence: hold the SUBACK of a SUBSCRIBE until every peer whose link is up
    /// has applied the route change that makes this node want the new filters, so that a
    /// message published on any node after the client got its SUBACK reaches it. Costs a
    /// route batch plus a round trip to the farthest connected peer per SUBSCRIBE. A peer
    /// whose link goes down stops being waited for (it learns the route when the link comes
    /// back), and no SUBACK waits longer than `subscribe_fence_max_ms`. Off by default.
    pub subscribe_fence: bool,
    /// The longest a SUBACK is held by the subscription fence, in milliseconds.
    pub subscribe_fence_max_ms: u64,
    /// Held SUBACKs at most; past it, SUBACKs go out without waiting.
    pub subscribe_fence_max_held: usize,
    /// Retained deletes remembered (as tombstones, so that an older message arriving late
    /// cannot come back); beyond, the oldest are forgotten.
    pub retained_tombstones_max: usize,
    /// A client that resumes its session here while another node holds it (as that node's
    /// claim says) gets Session Present at once; its QoS 1/2 messages wait until the session
    /// arrives, at most this long (then they go, and a session arriving later still joins).
    pub session_transfer_wait_ms: u64,
    /// A session that moved here holds back the QoS 1/2 messages of each node while older
    /// ones from that node may still come by its old node (queued there, or behind a cut
    /// link), so that it gets every node's messages in their order; at most this long after
    /// it arrived (then they go, and older ones that come later are delivered late, counted).
    pub session_order_wait_ms: u64,
    /// Client ids pinned to a home region ([`HomeRegion`]): a node answers their CONNECT only
    /// once the home region granted it, after the node that served the client closed its
    /// connection; one node serves such a client at any moment. Empty by default.
    pub home_regions: Vec<HomeRegion>,
    /// How long a CONNECT waits for its home region's grant (and the home region for the
    /// node serving the client to close its connection) before it is refused with 0x88.
    pub home_wait_ms: u64,
}

impl ClusterConfig {
    /// The defaults for `node` in its `incarnation`, in `region`.
    pub fn new(node: NodeId, incarnation: u64, region: impl Into<String>) -> Self {
        Self {
            node,
            incarnation,
            region: region.into(),
            certificate: None,
            members_certified: false,
            route_batch_ms: 20,
            digest_interval_ms: 5_000,
            tombstone_budget: 100_000,
            snapshot_chunk_filters: 10_000,
            outbox: OutboxLimits {
                window: 1_024,
                max_messages: 100_000,
                max_bytes: 256 * 1024 * 1024,
            },
            outbox_stall_ms: 30_000,
            max_nodes: 256,
            peer_limits: PeerLimits::default(),
            peer_expiry_ms: 24 * 60 * 60 * 1000,
            leaf_expiry_ms: 60 * 60 * 1000,
            leaf_max_filters: 100_000,
            max_route_filters: PeerLimits::default().max_filters,
            max_clock_drift_ms: 60_000,
            subscribe_fence: false,
            subscribe_fence_max_ms: 10_000,
            subscribe_fence_max_held: 100_000,
            retained_tombstones_max: 100_000,
            session_transfer_wait_ms: 5_000,
            session_order_wait_ms: 10_000,
            home_regions: Vec::new(),
            home_wait_ms: 5_000,
        }
    }
}

/// What the broker knows about one peer node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSummary {
    /// The peer's id.
    pub node: NodeId,
    /// Whether its link is up.
    pub connected: bool,
    /// Its region, once it said hello.
    pub region: Option<String>,
    /// The incarnation of it known here (of its route set; 0: none yet): what a forget of it
    /// names.
    pub incarnation: u64,
    /// Filters the peer has subscribers for, as replicated here.
    pub routes: usize,
    /// Route-set version replicated here, and the latest the peer announced.
    pub route_version: u64,
    /// The latest version of its route set the peer announced in a digest.
    pub announced_version: u64,
    /// QoS 1/2 forwards in its outbox waiting for the peer's acknowledgement.
    pub outbox_messages: usize,
    /// Payload and topic bytes in its outbox.
    pub outbox_bytes: usize,
    /// Messages forwarded to the peer since the broker started (QoS 0 sent, QoS 1/2 queued).
    pub forwarded_to: u64,
    /// Messages the peer forwarded here since the broker started, duplicates included.
    pub forwarded_from: u64,
    /// Whether it is a leaf of this node ([`Broker::add_leaf`]) rather than a mesh member.
    pub leaf: bool,
    /// When its link came up, while it is up.
    pub up_since: Option<Timestamp>,
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
    /// When the link last went up or down, or a frame came; `None` until first seen absent.
    last_heard: Option<Timestamp>,
    /// When the link came up or the peer last acknowledged a forward.
    acked_at: Timestamp,
    /// When the link came up, while it is up.
    up_since: Option<Timestamp>,
    /// Kinds of [`PeerFault`] already reported.
    faults_reported: u8,
    /// Fences the peer asked for, echoed once its outbox has sent what it holds: their tokens,
    /// with this node's next message number when each came.
    echoes: Vec<(u64, u64)>,
    /// Since its link came up, this node's copy of the peer's routes caught up with what the
    /// peer announced (its digest). Until then QoS 1/2 messages go to it whatever its routes
    /// say: a subscription it took while the link was down (or since its restart) must not
    /// miss what is published here meanwhile.
    routes_current: bool,
    /// Where the peer said its routes stand, once it did on this link session.
    announced_position: Option<(u64, u64)>,
    /// The scoped filters last sent on its link session ([`residency`]).
    scoped_sent: Option<Vec<String>>,
}

/// A node forgotten here, remembered so that forwards to it continue their numbering if it
/// comes back (its inbox remembers the earlier numbers).
#[derive(Debug)]
struct ForgottenNode {
    node: NodeId,
    incarnation: u64,
    next_seq: u64,
    /// When it was forgotten, among the others (a counter): the oldest are let go first.
    order: u64,
}

/// Retained messages held here on a node's account: those it wrote and sent, and those it
/// relayed.
#[derive(Debug, Clone, Copy, Default)]
struct RetainedUsage {
    messages: usize,
    bytes: usize,
}

/// What a stored retained write counts for, and on whose account.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RetainedCharge {
    /// Its topic and payload bytes.
    bytes: usize,
    /// The node whose bounds it counts against: the peer that sent it (this node's own for
    /// its own writes, which no peer bound counts).
    to: NodeId,
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
    /// Acknowledgements of forwards received in this input, one per peer and origin (the
    /// highest): sent at its end ([`Broker::send_held_acks`]).
    acks: Vec<(NodeId, Owner, u64)>,
    /// Held SUBACKs, in the order their SUBSCRIBEs arrived.
    fences: VecDeque<Fence>,
    /// Clock of retained writes, and the stamp of every topic's last write.
    hlc: Hlc,
    /// The winning write per topic, with what its message counts for.
    retained: LwwMap<RetainedCharge>,
    /// Per writer other than this node.
    retained_usage: BTreeMap<NodeId, RetainedUsage>,
    /// Oldest first, at most [`membership::FORGOTTEN_KEPT`]; kept in storage too.
    forgotten: VecDeque<ForgottenNode>,
    /// The `order` the next forgotten node gets.
    forget_count: u64,
    /// Nodes refused for the node count and reported (at most [`trust::REFUSED_NODES_KEPT`]).
    refused_nodes: std::collections::BTreeSet<NodeId>,
    /// Peers whose hello was vouched for since this node started
    /// ([`ClusterConfig::members_certified`]).
    certified: std::collections::BTreeSet<NodeId>,
    /// Nodes that hang off this one outside the mesh.
    leaves: leaves::Leaves,
    /// Who serves each client id.
    claims: claims::Claims,
    /// Sessions on their way between nodes.
    transfers: transfer::Transfers,
    /// What this node decides for client ids pinned to its region.
    homes: home::Homes,
    /// Sessions that moved: relays from here, windows of sessions taken here.
    moves: relay::Moves,
    /// The number the next message routed here from a client of this node gets.
    next_message: u64,
    /// The identity of the message being routed now.
    routing: Option<crate::link::MessageId>,
    /// The data-residency rules in force ([`Broker::set_residency`]).
    residency: crate::residency::Residency,
    /// This node's filters that a residency rule holds whole, with the regions they may be
    /// advertised to: kept out of `routes`.
    scoped: BTreeMap<std::sync::Arc<str>, std::collections::BTreeSet<String>>,
    /// `scoped` changed since it was last sent.
    scoped_dirty: bool,
    /// The other nodes' scoped filters.
    scoped_remote: residency::ScopedRemote,
    /// The deployment's nodes' regions as recorded ([`Broker::set_node_regions`]).
    node_regions: BTreeMap<NodeId, String>,
}

impl Peer {
    /// Whether the peer holds publishers back when its outbox is full: its link is up and it
    /// acknowledged something lately.
    fn holds_publishers(&self, now: Timestamp, stall_ms: u64) -> bool {
        self.connected && now.millis_since(self.acked_at) < stall_ms
    }
}

impl Cluster {
    pub(super) fn new(config: ClusterConfig, seed: u64) -> Self {
        let owner = Owner {
            node: config.node.clone(),
            incarnation: config.incarnation,
        };
        Self {
            routes: RouteLog::new(owner.clone(), config.tombstone_budget),
            table: RouteTable::new(seed)
                .journal()
                .with_limits(config.peer_limits.replica()),
            owner,
            peers: BTreeMap::new(),
            inbox: Inbox::default(),
            flush_armed: false,
            scratch: Vec::new(),
            acks: Vec::new(),
            fences: VecDeque::new(),
            hlc: Hlc::default(),
            retained: LwwMap::new(),
            retained_usage: BTreeMap::new(),
            forgotten: VecDeque::new(),
            forget_count: 0,
            refused_nodes: std::collections::BTreeSet::new(),
            certified: std::collections::BTreeSet::new(),
            leaves: leaves::Leaves::default(),
            claims: claims::Claims::default(),
            transfers: transfer::Transfers::default(),
            homes: home::Homes::default(),
            moves: relay::Moves::default(),
            next_message: 1,
            routing: None,
            residency: crate::residency::Residency::default(),
            scoped: BTreeMap::new(),
            scoped_dirty: false,
            scoped_remote: residency::ScopedRemote::new(seed),
            node_regions: BTreeMap::new(),
            config,
        }
    }

    /// The peers whose link is up, in node order.
    /// Peers with a link session now, members only.
    fn connected_peers(&self) -> Vec<NodeId> {
        self.peers
            .iter()
            .filter(|(n, p)| p.connected && self.is_member(n))
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn peer(&mut self, node: &NodeId) -> &mut Peer {
        let limits = self.config.outbox;
        let forgotten = &mut self.forgotten;
        self.peers.entry(node.clone()).or_insert_with(|| {
            let next_seq = forgotten
                .iter()
                .position(|f| f.node == *node)
                .and_then(|at| forgotten.remove(at))
                .map_or(1, |f| f.next_seq);
            Peer {
                connected: false,
                congested: false,
                region: None,
                outbox: Outbox::starting_at(limits, next_seq),
                announced_version: 0,
                forwarded_to: 0,
                forwarded_from: 0,
                last_heard: None,
                acked_at: Timestamp::default(),
                up_since: None,
                faults_reported: 0,
                echoes: Vec::new(),
                routes_current: false,
                announced_position: None,
                scoped_sent: None,
            }
        })
    }

    /// Whether `node` is a member this node exchanges state with: always, unless members
    /// must be certified and its hello was not vouched for yet (leaves: always).
    fn is_member(&self, node: &NodeId) -> bool {
        !self.config.members_certified || self.certified.contains(node) || self.leaves.is_leaf(node)
    }

    /// Whether this node keeps state for `node`: one it knows, or a new one while there is
    /// room ([`ClusterConfig::max_nodes`]).
    fn admits(&self, node: &NodeId) -> bool {
        self.peers.contains_key(node)
            || self.table.replica(node).is_some()
            || self.peers.len() < self.config.max_nodes
    }

    /// Remember a forgotten node; returns its `order` and the nodes forgotten so long ago
    /// that they are let go of entirely.
    fn remember_forgotten(
        &mut self,
        node: NodeId,
        incarnation: u64,
        next_seq: u64,
    ) -> (u64, Vec<NodeId>) {
        let order = self.forget_count;
        self.forget_count += 1;
        self.forgotten.retain(|f| f.node != node);
        self.forgotten.push_back(ForgottenNode {
            node,
            incarnation,
            next_seq,
            order,
        });
        (order, self.trim_forgotten())
    }

    /// Let go of the oldest forgotten nodes beyond [`membership::FORGOTTEN_KEPT`].
    fn trim_forgotten(&mut self) -> Vec<NodeId> {
        let mut gone = Vec::new();
        while self.forgotten.len() > membership::FORGOTTEN_KEPT {
            if let Some(f) = self.forgotten.pop_front() {
                gone.push(f.node);
            }
        }
        gone
    }

    /// Put back a forgotten node read from storage (in any order; sorted when restoring ends).
    fn restore_forgotten(&mut self, node: NodeId, incarnation: u64, next_seq: u64, order: u64) {
        self.forget_count = self.forget_count.max(order.saturating_add(1));
        self.forgotten.push_back(ForgottenNode {
            node,
            incarnation,
            next_seq,
            order,
        });
    }

    /// Whether this node holds state for `node` now (a link, an outbox or a route set).
    /// Whether this node's copy of `node`'s routes reached what `node` announced on its
    /// link session (then it is current: see `Peer::routes_current`).
    fn check_routes_current(&mut self, node: &NodeId) {
        let position = self.table.replica(node).map(|r| r.position());
        let Some(p) = self.peers.get_mut(node) else {
            return;
        };
        if let (Some(target), Some(position)) = (p.announced_position, position) {
            p.routes_current |= (position.incarnation, position.version) >= target;
        }
    }

    fn knows(&self, node: &NodeId) -> bool {
        self.peers.contains_key(node) || self.table.replica(node).is_some()
    }

    /// This node's route set as `peer` sees it: its own (a mesh node), or the leaf's view.
    fn log_for(&self, peer: &NodeId) -> &RouteLog {
        self.leaves.view(peer).unwrap_or(&self.routes)
    }

    fn log_for_mut(&mut self, peer: &NodeId) -> &mut RouteLog {
        match self.leaves.view_mut(peer) {
            Some(view) => view,
            None => &mut self.routes,
        }
    }

    /// A digest of this node's route set as `peer` sees it.
    fn digest_for(&self, peer: &NodeId) -> Frame {
        match self.leaves.view(peer) {
            Some(view) => leaves::view_digest(self, view),
            None => self.own_digest(),
        }
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
    pub fn enable_cluster(&mut self, now: Timestamp, config: ClusterConfig) {
        self.advance(now);
        let seed = self.config.seed ^ 0x5eed;
        let cluster = Cluster::new(config, seed);
        let first_digest = self.now.plus_ms(cluster.config.digest_interval_ms);
        self.cluster = Some(Box::new(cluster));
        self.timers.insert((first_digest, Timer::Digest));
        self.arm_peer_expiry(self.now);
    }

    /// This node's id in its deployment (cluster mode).
    pub fn node_id(&self) -> Option<&NodeId> {
        self.cluster.as_ref().map(|c| &c.owner.node)
    }

    /// Whether mesh node `node` is a member this node shares the deployment's state with
    /// (cluster mode): any peer, unless [`ClusterConfig::members_certified`], then one whose
    /// hello carried the operator's certificate of it. The daemon holds its other streams
    /// with a peer (policy sync) to this.
    pub fn is_member(&self, node: &NodeId) -> bool {
        self.cluster.as_ref().is_some_and(|c| c.is_member(node))
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
                    incarnation: replica.map_or(0, |r| r.incarnation),
                    routes: replica.map_or(0, |r| r.len()) + c.scoped_remote.of(node).count(),
                    route_version: replica.map_or(0, |r| r.version),
                    announced_version: p.announced_version,
                    outbox_messages: p.outbox.len(),
                    outbox_bytes: p.outbox.bytes(),
                    forwarded_to: p.forwarded_to,
                    forwarded_from: p.forwarded_from,
                    leaf: c.leaves.is_leaf(node),
                    up_since: p.up_since,
                }
            })
            .collect()
    }

    /// Nodes whose subscribers want `topic` (for tests and admin tools).
    pub fn nodes_for(&self, topic: &str) -> Vec<NodeId> {
        let mut out = Vec::new();
        if let Some(c) = &self.cluster {
            c.table.nodes_for(topic, &mut out);
            c.scoped_nodes_for(topic, &mut out);
        }
        out
    }

    /// Send `frame` to `peer`, encoded once. An acknowledgement of a forward waits for the
    /// end of the input ([`Broker::send_held_acks`]): acknowledgements are cumulative, so one
    /// per peer and origin says as much as all of them.
    fn send_to_peer(&mut self, peer: NodeId, frame: Frame) {
        if let Frame::ForwardAck { origin, seq } = frame {
            if let Some(c) = &mut self.cluster {
                match c
                    .acks
                    .iter_mut()
                    .find(|(p, o, _)| *p == peer && *o == origin)
                {
                    Some(held) => held.2 = held.2.max(seq),
                    None => c.acks.push((peer, origin, seq)),
                }
            }
            return;
        }
        if let Some(frame) = encoded(&frame) {
            self.send_encoded(peer, frame);
        }
    }

    /// Send a frame encoded already (a forward from an outbox) to `peer`.
    fn send_encoded(&mut self, peer: NodeId, frame: EncodedFrame) {
        self.outputs.push_back(Output::ToPeer { peer, frame });
    }

    /// Send `frame` to every peer of the mesh, encoded once.
    fn broadcast(&mut self, frame: &Frame) {
        if let Some(frame) = encoded(frame) {
            self.outputs.push_back(Output::Broadcast { frame });
        }
    }

    /// The acknowledgements held during the input that ends, after everything else it
    /// caused (the records they depend on included).
    pub(in crate::broker) fn send_held_acks(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        if c.acks.is_empty() {
            return;
        }
        let mut acks = std::mem::take(&mut c.acks);
        for (peer, origin, seq) in acks.drain(..) {
            if let Some(frame) = encoded(&Frame::ForwardAck { origin, seq }) {
                self.send_encoded(peer, frame);
            }
        }
        if let Some(c) = &mut self.cluster {
            // The list keeps its room for the next input.
            c.acks = acks;
        }
    }

    /// This node's own route set (filters with a local subscriber), as last flushed, with
    /// the filters a residency rule keeps out of it (sorted).
    pub fn route_set(&self) -> Vec<String> {
        let Some(c) = &self.cluster else {
            return Vec::new();
        };
        let mut routes: Vec<String> = c.routes.live().map(str::to_owned).collect();
        routes.extend(c.scoped.keys().map(|f| f.to_string()));
        routes.sort();
        routes
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
        routes.extend(c.scoped_remote.of(node).map(str::to_owned));
        routes.sort();
        routes.dedup();
        routes
    }

    /// Where this node's own route set stands, as last flushed.
    pub fn route_position(&self) -> Option<RoutePosition> {
        let c = self.cluster.as_ref()?;
        Some(RoutePosition {
            incarnation: c.owner.incarnation,
            version: c.routes.version(),
            hash: c.routes.hash(),
        })
    }

    /// Where this node's replica of `node`'s route set stands.
    pub fn replica_position(&self, node: &NodeId) -> Option<RoutePosition> {
        let r = self.cluster.as_ref()?.table.replica(node)?;
        Some(r.position())
    }

    /// Whether route changes (of this node's own route set, or of a leaf's view of it) wait
    /// for the next batch.
    pub fn routes_pending(&self) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.routes.has_pending() || c.leaves.has_pending())
    }
}

/// A frame this node made, encoded. Its frames hold validated names, topics and sizes, far
/// within what the link encodes, so a failure is a bug: it fails tests, and in a release
/// build the frame is left out (its sender re-sends what matters on the next session).
fn encoded(frame: &Frame) -> Option<EncodedFrame> {
    match EncodedFrame::encode(frame) {
        Ok(encoded) => Some(encoded),
        Err(e) => {
            debug_assert!(false, "cannot encode a {} frame: {e}", frame.name());
            None
        }
    }
}
