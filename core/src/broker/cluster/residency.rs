//! Data residency across nodes ([`crate::residency`]): what a rule keeps in its regions.
//!
//! - A message goes only to the nodes whose region every rule matching its topic names; the
//!   others are counted in `Stats::residency_withheld` on the publisher's node. A leaf
//!   counts as its node's region.
//! - A retained write (and a retained snapshot entry) goes only to peers of the regions its
//!   topic may reach.
//! - A local filter wholly inside rules is kept out of this node's route set (which every
//!   node replicates) and sent instead, in [`Frame::ScopedRoutes`], to the connected nodes of
//!   the regions those rules name only — the whole list each time it changes for that node,
//!   and again at each new link session; to no node at all if this node's region is not one
//!   of them. What a peer sends so is its own filters, replacing
//!   what it sent before, bounded like its route set.
//!
//! A change of the rules re-scopes this node's filters at once: a filter now inside a rule
//! leaves the route set (its removal reaches every node in the next batch) and joins the
//! scoped list; one no longer inside goes back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::Cluster;
use super::trust::{PeerFault, PeerLimit};
use crate::broker::{Authenticator, Authorizer, Broker, Timestamp};
use crate::link::Frame;
use crate::residency::Residency;
use crate::routes::NodeId;
use crate::topic::FilterTrie;

/// The scoped filters of the other nodes, as they sent them.
#[derive(Debug)]
pub(super) struct ScopedRemote {
    by_node: BTreeMap<NodeId, BTreeSet<Arc<str>>>,
    trie: FilterTrie<Vec<NodeId>>,
}

impl ScopedRemote {
    pub(super) fn new(seed: u64) -> Self {
        Self {
            by_node: BTreeMap::new(),
            trie: FilterTrie::new(seed),
        }
    }

    /// `node`'s filters are now `filters`: the filters it gained and lost.
    fn replace(
        &mut self,
        node: &NodeId,
        filters: BTreeSet<Arc<str>>,
    ) -> (Vec<Arc<str>>, Vec<Arc<str>>) {
        let old = self.by_node.remove(node).unwrap_or_default();
        let gained: Vec<Arc<str>> = filters.difference(&old).cloned().collect();
        let lost: Vec<Arc<str>> = old.difference(&filters).cloned().collect();
        for f in &gained {
            let nodes = self.trie.entry(f);
            if let Err(at) = nodes.binary_search(node) {
                nodes.insert(at, node.clone());
            }
        }
        for f in &lost {
            self.trie.update_or_remove(f, |nodes| {
                nodes.retain(|n| n != node);
                !nodes.is_empty()
            });
        }
        if !filters.is_empty() {
            self.by_node.insert(node.clone(), filters);
        }
        (gained, lost)
    }

    /// Add the nodes with a scoped filter matching `topic` to `out` (sorted, each once).
    fn nodes_for(&self, topic: &str, out: &mut Vec<NodeId>) {
        if self.by_node.is_empty() {
            return;
        }
        let before = out.len();
        self.trie
            .for_each_match(topic, |nodes| out.extend(nodes.iter().cloned()));
        if out.len() > before {
            out.sort();
            out.dedup();
        }
    }

    /// The filters `node` sent.
    pub(super) fn of(&self, node: &NodeId) -> impl Iterator<Item = &str> {
        self.by_node.get(node).into_iter().flatten().map(|f| &**f)
    }
}

impl Cluster {
    /// Where a local subscription to `filter` may be advertised: anywhere (`None`), or the
    /// regions of the rules that hold it whole — none at all if this node's region is not
    /// among them (no message of theirs may come here).
    fn scope_of(&self, filter: &str) -> Option<BTreeSet<String>> {
        let mut regions = self.residency.scope(filter)?;
        if !regions.contains(&self.config.region) {
            regions.clear();
        }
        Some(regions)
    }

    /// This node's route set gains `filter` (a first local subscriber, or a leaf's): into
    /// the replicated route set, or the scoped list if a rule holds it whole.
    pub(super) fn advertise(&mut self, filter: &str) {
        match self.scope_of(filter) {
            None => self.routes.add(filter),
            Some(regions) => {
                self.scoped.insert(filter.into(), regions);
                self.scoped_dirty = true;
            }
        }
    }

    /// This node's route set loses `filter`.
    pub(super) fn withdraw_filter(&mut self, filter: &str) {
        if self.scoped.remove(filter).is_some() {
            self.scoped_dirty = true;
        } else {
            self.routes.remove(filter);
        }
    }

    /// Whether this node's route set (replicated or scoped) holds `filter`.
    pub(super) fn wants(&self, filter: &str) -> bool {
        self.routes.wants(filter) || self.scoped.contains_key(filter)
    }

    /// Filters in this node's route set, replicated or scoped.
    pub(super) fn wanted_len(&self) -> usize {
        self.routes.wanted_len() + self.scoped.len()
    }

    /// The region of `node` for residency: its own for a leaf, what it said in its hello
    /// for a mesh node, else what the deployment says of it ([`Broker::set_node_regions`]);
    /// none if nobody said.
    fn region_of(&self, node: &NodeId) -> Option<&str> {
        if self.leaves.is_leaf(node) {
            return Some(&self.config.region);
        }
        self.peers
            .get(node)
            .and_then(|p| p.region.as_deref())
            .or_else(|| self.node_regions.get(node).map(String::as_str))
    }

    /// Keep in `nodes` those a message on `topic` may reach; how many were taken out.
    pub(super) fn residency_filter(&self, topic: &str, nodes: &mut Vec<NodeId>) -> u64 {
        let Some(regions) = self.residency.regions_for(topic) else {
            return 0;
        };
        let before = nodes.len();
        nodes.retain(|n| self.region_of(n).is_some_and(|r| regions.contains(r)));
        (before - nodes.len()) as u64
    }

    /// Whether a message on `topic` may reach `node`.
    pub(super) fn residency_allows(&self, topic: &str, node: &NodeId) -> bool {
        self.residency.is_empty()
            || self
                .region_of(node)
                .is_some_and(|r| self.residency.allows(topic, r))
    }

    /// Add the nodes with a scoped filter matching `topic`.
    pub(super) fn scoped_nodes_for(&self, topic: &str, out: &mut Vec<NodeId>) {
        self.scoped_remote.nodes_for(topic, out);
    }

    /// The scoped filters `peer`'s region may know of.
    fn scoped_for(&self, peer: &NodeId) -> Option<Vec<String>> {
        let region = self.region_of(peer)?;
        Some(
            self.scoped
                .iter()
                .filter(|(_, regions)| regions.contains(region))
                .map(|(f, _)| f.to_string())
                .collect(),
        )
    }
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Put `residency` in force: the next message, retained write and advertisement follow
    /// it. This node's filters are re-scoped at once (the changes leave in the next batch).
    pub fn set_residency(&mut self, now: Timestamp, residency: Residency) {
        self.advance(now);
        let Some(c) = &mut self.cluster else { return };
        if c.residency == residency {
            return;
        }
        c.residency = residency;
        let mut all: Vec<Arc<str>> = c.routes.wanted().map(Arc::from).collect();
        all.extend(c.scoped.keys().cloned());
        for filter in all {
            let scoped_now = c.scoped.contains_key(&filter);
            match (c.scope_of(&filter), scoped_now) {
                (None, false) => {}
                (None, true) => {
                    c.scoped.remove(&filter);
                    c.routes.add(&filter);
                }
                (Some(regions), _) => {
                    if !scoped_now {
                        c.routes.remove(&filter);
                    }
                    c.scoped.insert(filter, regions);
                }
            }
        }
        c.scoped_dirty = true;
        self.arm_route_flush();
        self.purge_withheld_forwards();
    }

    /// The regions of the deployment's nodes as its operators recorded them, for residency
    /// decisions about a node that has not said hello on a link yet (after a restart, say,
    /// so that what waits for it is kept rather than withheld).
    pub fn set_node_regions(&mut self, now: Timestamp, regions: BTreeMap<NodeId, String>) {
        self.advance(now);
        let Some(c) = &mut self.cluster else { return };
        c.node_regions = regions;
        self.purge_withheld_forwards();
    }

    /// Drop from the outboxes the forwards that the rules now keep from their peer (queued
    /// before a rule was added, or restored from storage), counted as withheld. A peer whose
    /// region nobody said keeps its forwards.
    pub(in crate::broker) fn purge_withheld_forwards(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        if c.residency.is_empty() {
            return;
        }
        let mut dropped: Vec<(NodeId, u64)> = Vec::new();
        let nodes: Vec<NodeId> = c.peers.keys().cloned().collect();
        for node in nodes {
            let Some(region) = c.region_of(&node).map(str::to_owned) else {
                continue;
            };
            let residency = &c.residency;
            if let Some(p) = c.peers.get_mut(&node) {
                let gone = p
                    .outbox
                    .remove_where(|f| !residency.allows(&f.message.topic, &region));
                dropped.extend(gone.into_iter().map(|seq| (node.clone(), seq)));
            }
        }
        self.stats.residency_withheld += dropped.len() as u64;
        for (node, seq) in dropped {
            let key = crate::broker::persist::Key::Outbox {
                peer: node.clone(),
                seq,
            };
            self.persist(key.encode(), None);
        }
    }

    /// Send each connected mesh node the scoped filters of its region, where they changed.
    pub(super) fn send_scoped_routes(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        if !c.scoped_dirty {
            return;
        }
        c.scoped_dirty = false;
        let peers: Vec<NodeId> = c
            .peers
            .iter()
            .filter(|(n, p)| p.connected && !c.leaves.is_leaf(n))
            .map(|(n, _)| n.clone())
            .collect();
        for peer in peers {
            self.send_scoped_to(&peer, false);
        }
    }

    /// Send `peer` the scoped filters of its region, if they differ from what it was sent
    /// (or in any case with `again`: a new link session).
    pub(super) fn send_scoped_to(&mut self, peer: &NodeId, again: bool) {
        let Some(c) = &mut self.cluster else { return };
        let Some(filters) = c.scoped_for(peer) else {
            return;
        };
        let p = c.peer(peer);
        if !again && p.scoped_sent.as_ref() == Some(&filters) {
            return;
        }
        // Nothing was ever sent and nothing is scoped: the peer has nothing to replace.
        if again && filters.is_empty() && p.scoped_sent.is_none() {
            return;
        }
        p.scoped_sent = Some(filters.clone());
        self.send_to_peer(peer.clone(), Frame::ScopedRoutes { filters });
    }

    /// A peer's scoped filters, replacing those it sent before.
    pub(super) fn on_scoped_routes(&mut self, peer: &NodeId, filters: Vec<String>) {
        let Some(c) = &mut self.cluster else { return };
        let max = c.config.peer_limits.max_filters;
        if filters.len() > max {
            self.peer_fault(peer, PeerFault::OverLimit(PeerLimit::Filters));
            return;
        }
        let filters: BTreeSet<Arc<str>> = filters
            .iter()
            .filter(|f| crate::topic::TopicFilter::new(f.as_str()).is_ok())
            .map(|f| Arc::from(f.as_str()))
            .collect();
        let (gained, lost) = c.scoped_remote.replace(peer, filters);
        for f in &gained {
            c.replica_interest(peer, f, true);
        }
        for f in &lost {
            c.replica_interest(peer, f, false);
        }
        if !gained.is_empty() || !lost.is_empty() {
            self.arm_route_flush();
        }
    }

    /// A node forgotten: its scoped filters go.
    pub(super) fn forget_scoped(&mut self, node: &NodeId) {
        let Some(c) = &mut self.cluster else { return };
        let (_, lost) = c.scoped_remote.replace(node, BTreeSet::new());
        for f in &lost {
            c.replica_interest(node, f, false);
        }
    }
}
