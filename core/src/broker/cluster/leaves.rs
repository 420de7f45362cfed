//! Leaves: nodes that hang off this one without being members of the mesh (the edge objects of
//! a region, linked to their home daemon as NATS leaf nodes are to their hub).
//!
//! - A leaf's filters join this node's own route set: the mesh sees this node wanting what its
//!   leaves want, and never learns of the leaves, so edge objects coming and going touch the
//!   rest of the deployment only through this node's route changes.
//! - Each leaf sees this node as one peer whose route set (its *view*) is everything wanted
//!   elsewhere: this node's local filters, every mesh node's, and the other leaves'. A leaf
//!   therefore forwards up only what someone beyond it wants. A view is a route log of its own,
//!   under this node's owner id, replicated to that leaf alone by the same deltas, digests and
//!   snapshots as between mesh nodes.
//! - A message forwarded by a mesh node goes on to the leaves that want it; one forwarded by a
//!   leaf goes on to the mesh nodes and the other leaves that want it, never back to its leaf;
//!   this node's own publishers reach mesh nodes and leaves alike. A leaf never forwards what it
//!   receives, and a mesh node never forwards what a mesh node sent it, so nothing loops. QoS
//!   1/2 go on through this node's durable outboxes, numbered as its own forwards.
//! - A leaf holds no authority over the mesh: what it says of other nodes (`Forget`) is
//!   refused and counted. Retained messages replicate between mesh nodes only: a leaf's are
//!   ignored here, and none are sent to it.
//!
//! - A leaf may be held to a scope ([`LeafScope`], from the credential it linked with): its
//!   messages must carry topics inside it and its filters lie wholly inside it. A forward
//!   outside is dropped (acknowledged, marked had, delivered nowhere) and a filter outside is
//!   kept in its replica but wanted by no one here: neither counts as interest nor draws a
//!   message to the leaf. Both are counted as `not_owner`. Nothing outside the scope goes to
//!   the leaf either, whatever its filters say.
//!
//! Who wants each filter is counted only while there are leaves; a node without leaves pays
//! nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Cluster;
use super::trust::PeerFault;
use crate::acl::{Pattern, Relation, RuleError};
use crate::broker::persist::Key;
use crate::broker::{Authenticator, Authorizer, Broker, Timestamp};
use crate::link::{Frame, FrameKind};
use crate::residency::NO_CLIENT;
use crate::routes::{NodeId, RouteLog};

/// What a leaf may touch: the topics its messages may carry and its filters may match (each
/// scope filter a topic filter without `%u` or `%c`), and how many filters it may bring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafScope {
    filters: Vec<String>,
    patterns: Vec<Pattern>,
    max_filters: usize,
}

impl LeafScope {
    /// A scope of `filters` and at most `max_filters` filters; an error names a filter that
    /// is not one.
    pub fn new<S: AsRef<str>>(
        filters: impl IntoIterator<Item = S>,
        max_filters: usize,
    ) -> Result<Self, RuleError> {
        let mut scope = Self {
            filters: Vec::new(),
            patterns: Vec::new(),
            max_filters,
        };
        for filter in filters {
            let filter = filter.as_ref();
            let pattern = Pattern::parse(filter)?;
            if pattern.uses_user || pattern.uses_client_id {
                return Err(RuleError::Topic {
                    topic: filter.to_owned(),
                    reason: "a leaf's scope names topics, without %u or %c",
                });
            }
            scope.filters.push(filter.to_owned());
            scope.patterns.push(pattern);
        }
        Ok(scope)
    }

    /// Whether `subject`, a topic or a topic filter, lies wholly inside the scope.
    pub fn covers(&self, subject: &str) -> bool {
        self.patterns
            .iter()
            .any(|p| p.relation(subject, &NO_CLIENT) == Relation::Covers)
    }

    /// The scope's filters.
    pub fn filters(&self) -> &[String] {
        &self.filters
    }

    /// How many filters the leaf may bring.
    pub fn max_filters(&self) -> usize {
        self.max_filters
    }
}

/// The leaves of this node and who wants each filter.
#[derive(Debug, Default)]
pub(super) struct Leaves {
    /// Each leaf's view of this node's route set.
    views: BTreeMap<NodeId, RouteLog>,
    /// Who wants each filter, while there are leaves.
    interest: BTreeMap<Arc<str>, Interest>,
    /// The leaves held to a scope.
    scopes: BTreeMap<NodeId, LeafScope>,
}

/// Who wants one filter.
#[derive(Debug, Default)]
struct Interest {
    /// A local subscriber.
    local: bool,
    /// Mesh nodes (not leaves) with the filter in their route set.
    mesh: u32,
    /// Leaves with the filter in their route set.
    leaves: Vec<NodeId>,
}

impl Interest {
    fn is_empty(&self) -> bool {
        !self.local && self.mesh == 0 && self.leaves.is_empty()
    }

    /// Whether this node's own route set (what the mesh sees) holds the filter.
    fn in_own(&self) -> bool {
        self.local || !self.leaves.is_empty()
    }

    /// Whether the view of `leaf` holds the filter: someone other than that leaf wants it.
    fn in_view_of(&self, leaf: &NodeId) -> bool {
        self.local || self.mesh > 0 || self.leaves.iter().any(|l| l != leaf)
    }
}

impl Leaves {
    pub(super) fn is_leaf(&self, node: &NodeId) -> bool {
        self.views.contains_key(node)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.views.is_empty()
    }

    pub(super) fn view(&self, leaf: &NodeId) -> Option<&RouteLog> {
        self.views.get(leaf)
    }

    pub(super) fn view_mut(&mut self, leaf: &NodeId) -> Option<&mut RouteLog> {
        self.views.get_mut(leaf)
    }

    pub(super) fn has_pending(&self) -> bool {
        self.views.values().any(RouteLog::has_pending)
    }

    /// Whether `subject` (a topic, or a filter) lies within `node`'s scope: always for a node
    /// that has none (a mesh node, or a leaf held to none).
    pub(super) fn allows(&self, node: &NodeId, subject: &str) -> bool {
        self.scopes.get(node).is_none_or(|s| s.covers(subject))
    }

    /// Whether some leaf is held to a scope.
    pub(super) fn any_scoped(&self) -> bool {
        !self.scopes.is_empty()
    }
}

impl Cluster {
    /// Brings the routes of `filter` up to date after who wants it changed: this node's own
    /// set and every view (staging is idempotent: a filter already where it should be is left).
    fn refresh(&mut self, filter: &Arc<str>) {
        let Some(own) = self.leaves.interest.get(filter).map(|i| i.in_own()) else {
            return;
        };
        if own {
            self.advertise(filter);
        } else {
            self.withdraw_filter(filter);
        }
        let Some(interest) = self.leaves.interest.get(filter) else {
            return;
        };
        for (leaf, view) in &mut self.leaves.views {
            if interest.in_view_of(leaf) {
                view.add(filter);
            } else {
                view.remove(filter);
            }
        }
        if interest.is_empty() {
            self.leaves.interest.remove(filter);
        }
    }

    /// A local subscriber came or went for `filter` while there are leaves.
    pub(super) fn local_interest(&mut self, filter: &str, present: bool) {
        let filter: Arc<str> = filter.into();
        self.leaves
            .interest
            .entry(filter.clone())
            .or_default()
            .local = present;
        self.refresh(&filter);
    }

    /// `node`'s route set (a mesh node's or a leaf's) gained or lost `filter`. A leaf's filter
    /// outside its scope counts as absent; true for such a filter gained.
    pub(super) fn replica_interest(
        &mut self,
        node: &NodeId,
        filter: &Arc<str>,
        present: bool,
    ) -> bool {
        if self.leaves.is_empty() {
            return false;
        }
        let outside = present && !self.leaves.allows(node, filter);
        let present = present && !outside;
        let leaf = self.leaves.is_leaf(node);
        let interest = self.leaves.interest.entry(filter.clone()).or_default();
        match (leaf, present) {
            (true, true) if !interest.leaves.contains(node) => interest.leaves.push(node.clone()),
            (true, false) => interest.leaves.retain(|l| l != node),
            (false, true) => interest.mesh += 1,
            (false, false) => interest.mesh = interest.mesh.saturating_sub(1),
            (true, true) => {}
        }
        self.refresh(filter);
        outside
    }

    /// Makes `node` a leaf. The first leaf starts the count of who wants what, from this
    /// node's own route set (all local until now) and the replicas held.
    fn make_leaf(&mut self, node: &NodeId) {
        if self.leaves.is_leaf(node) {
            return;
        }
        if self.leaves.is_empty() {
            for filter in self.routes.wanted() {
                self.leaves.interest.entry(filter.into()).or_default().local = true;
            }
            for (owner, replica) in self.table.replicas() {
                if owner == node {
                    continue;
                }
                for filter in replica.filters() {
                    self.leaves.interest.entry(filter.into()).or_default().mesh += 1;
                }
            }
        } else if let Some(replica) = self.table.replica(node) {
            // Counted as a mesh node's until now.
            for filter in replica.filters() {
                if let Some(i) = self.leaves.interest.get_mut(filter) {
                    i.mesh = i.mesh.saturating_sub(1);
                }
            }
        }
        if let Some(replica) = self.table.replica(node) {
            for filter in replica.filters() {
                let i = self.leaves.interest.entry(filter.into()).or_default();
                i.leaves.push(node.clone());
            }
        }
        let view = RouteLog::new(self.owner.clone(), self.config.tombstone_budget);
        self.leaves.views.insert(node.clone(), view);
        self.set_leaf_limits(node);
        let filters: Vec<Arc<str>> = self.leaves.interest.keys().cloned().collect();
        for filter in &filters {
            self.refresh(filter);
        }
    }

    /// The bound of a leaf's replica: a mesh peer's, within the leaf bound and its scope's.
    fn set_leaf_limits(&mut self, node: &NodeId) {
        let mut limits = self.config.peer_limits.replica();
        limits.max_filters = limits.max_filters.min(self.config.leaf_max_filters);
        if let Some(scope) = self.leaves.scopes.get(node) {
            limits.max_filters = limits.max_filters.min(scope.max_filters);
        }
        self.table.set_owner_limits(node, Some(limits));
    }

    /// `node` is no longer a leaf (it was forgotten; its replica is already withdrawn).
    fn drop_leaf(&mut self, node: &NodeId) {
        if self.leaves.views.remove(node).is_none() {
            return;
        }
        self.leaves.scopes.remove(node);
        self.table.set_owner_limits(node, None);
        if self.leaves.is_empty() {
            // Back to this node's own set being its local filters alone.
            let filters: Vec<Arc<str>> = self.leaves.interest.keys().cloned().collect();
            for filter in filters {
                let local = self.leaves.interest.get(&filter).is_some_and(|i| i.local);
                if !local {
                    self.withdraw_filter(&filter);
                }
            }
            self.leaves.interest.clear();
        }
    }
}

/// How every leaf's name starts (`edge-eu`): mesh members are named by their peer ids, so a
/// leaf cannot squat a member's name before it joins.
pub const LEAF_PREFIX: &str = "edge-";

/// Why a node cannot be made a leaf.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeafError {
    /// The broker is not a node of a deployment.
    #[error("this broker is not clustered")]
    NotClustered,
    /// A name that does not start with [`LEAF_PREFIX`].
    #[error("a leaf's name starts with {LEAF_PREFIX}")]
    NotLeafName,
    /// This node's own name.
    #[error("a leaf cannot take this node's name")]
    Myself,
    /// A member of the mesh this node knows: a leaf cannot take its place.
    #[error("a leaf cannot take a mesh member's name")]
    MeshMember,
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Makes `node` a leaf of this node: call before its link comes up
    /// ([`crate::Input::PeerUp`]), once the shell has authenticated it as an edge object
    /// rather than a member of the mesh. Remembered in storage. Refused for a name that does
    /// not start with [`LEAF_PREFIX`], for this node's own name and for a mesh member this
    /// node knows; a leaf already is one.
    pub fn add_leaf(&mut self, now: Timestamp, node: &NodeId) -> Result<(), LeafError> {
        self.advance(now);
        let Some(c) = &mut self.cluster else {
            return Err(LeafError::NotClustered);
        };
        if !node.as_str().starts_with(LEAF_PREFIX) {
            return Err(LeafError::NotLeafName);
        }
        if *node == c.owner.node {
            return Err(LeafError::Myself);
        }
        if c.leaves.is_leaf(node) {
            return Ok(());
        }
        if c.knows(node) {
            return Err(LeafError::MeshMember);
        }
        c.make_leaf(node);
        self.persist(
            Key::Leaf { node: node.clone() }.encode(),
            Some(crate::broker::persist::marker()),
        );
        self.arm_route_flush();
        Ok(())
    }

    /// Holds the leaf `node` to `scope` (the credential its link presented), or to none: call
    /// after [`Broker::add_leaf`], before its link comes up, on each link. Its filters are
    /// judged again at once: those outside stop drawing messages and are counted, one
    /// `not_owner` fault each.
    pub fn scope_leaf(&mut self, now: Timestamp, node: &NodeId, scope: Option<LeafScope>) {
        self.advance(now);
        let Some(c) = &mut self.cluster else { return };
        if !c.leaves.is_leaf(node) || c.leaves.scopes.get(node) == scope.as_ref() {
            return;
        }
        match scope {
            Some(scope) => c.leaves.scopes.insert(node.clone(), scope),
            None => c.leaves.scopes.remove(node),
        };
        c.set_leaf_limits(node);
        let filters: Vec<Arc<str>> = c
            .table
            .replica(node)
            .map(|r| r.filters().map(Arc::from).collect())
            .unwrap_or_default();
        let mut outside = 0;
        for filter in &filters {
            outside += usize::from(c.replica_interest(node, filter, true));
        }
        for _ in 0..outside {
            self.peer_fault(node, PeerFault::NotOwner(FrameKind::RouteDelta));
        }
        self.arm_route_flush();
    }

    /// Whether `node` is a leaf of this node.
    pub fn is_leaf(&self, node: &NodeId) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| c.leaves.is_leaf(node))
    }

    /// A leaf read back from storage.
    pub(super) fn restore_leaf(&mut self, node: &NodeId) {
        if let Some(c) = &mut self.cluster {
            c.make_leaf(node);
        }
    }

    /// A forgotten leaf: its view goes, and its record.
    pub(super) fn forget_leaf(&mut self, node: &NodeId) {
        let Some(c) = &mut self.cluster else { return };
        if !c.leaves.is_leaf(node) {
            return;
        }
        c.drop_leaf(node);
        self.persist(Key::Leaf { node: node.clone() }.encode(), None);
        self.arm_route_flush();
    }

    /// The view's changes since the last batch, to each leaf whose link is up (one that is
    /// down catches up from its digest when it comes back).
    pub(super) fn flush_views(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        let per_frame = c.config.snapshot_chunk_filters;
        let mut frames = Vec::new();
        for (leaf, view) in &mut c.leaves.views {
            let Some(delta) = view.flush() else { continue };
            if c.peers.get(leaf).is_some_and(|p| p.connected) {
                for frame in super::routes::delta_frames(delta, per_frame) {
                    frames.push((leaf.clone(), frame));
                }
            }
        }
        for (leaf, frame) in frames {
            self.send_to_peer(leaf, frame);
        }
    }

    /// Each connected leaf's view digest.
    pub(super) fn send_view_digests(&mut self) {
        let Some(c) = &self.cluster else { return };
        let frames: Vec<(NodeId, Frame)> = c
            .leaves
            .views
            .iter()
            .filter(|(leaf, _)| c.peers.get(*leaf).is_some_and(|p| p.connected))
            .map(|(leaf, view)| (leaf.clone(), view_digest(c, view)))
            .collect();
        for (leaf, frame) in frames {
            self.send_to_peer(leaf, frame);
        }
    }
}

/// A digest of a leaf's view, under this node's owner id.
pub(super) fn view_digest(c: &Cluster, view: &RouteLog) -> Frame {
    Frame::Digest(vec![crate::link::DigestEntry {
        owner: c.owner.clone(),
        version: view.version(),
        hash: view.hash(),
    }])
}
