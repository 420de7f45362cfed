//! The receiving side: a replica of every other owner's route set, merged into one trie whose
//! values are node sets.

use std::collections::{BTreeMap, HashSet};

use foldhash::fast::FixedState;
use std::sync::Arc;

use super::hash::filter_hash;
use super::{NodeId, RouteDelta, RouteOp, RoutePosition, SnapshotChunk};
use crate::topic::FilterTrie;

/// Deltas kept while an earlier one is missing.
const MAX_BUFFERED_DELTAS: usize = 64;

/// Bytes a filter is counted for in [`ReplicaLimits`]: its text and the bookkeeping around it.
const FILTER_OVERHEAD: usize = 16;

/// Bounds on what one owner can make this node hold for its route set. An owner past the
/// filters or snapshot bound is refused ([`DeltaOutcome::OverLimit`],
/// [`SnapshotOutcome::OverLimit`]) and its replica stays as it was; past the pending bytes,
/// the deltas held for it are dropped and a snapshot asked for ([`DeltaOutcome::NeedSnapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaLimits {
    /// Filters in one owner's replica.
    pub max_filters: usize,
    /// Bytes of one owner's deltas kept while an earlier one is missing.
    pub max_pending_bytes: usize,
    /// Bytes of one owner's snapshot being assembled, and of its replica however it grows
    /// (a delta that would take it past is refused as a snapshot would be).
    pub max_snapshot_bytes: usize,
}

impl ReplicaLimits {
    /// No bound at all (for tools that replicate trusted data).
    pub const UNBOUNDED: ReplicaLimits = ReplicaLimits {
        max_filters: usize::MAX,
        max_pending_bytes: usize::MAX,
        max_snapshot_bytes: usize::MAX,
    };
}

/// Which of the [`ReplicaLimits`] an owner went past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReplicaLimit {
    /// [`ReplicaLimits::max_filters`].
    Filters,
    /// [`ReplicaLimits::max_snapshot_bytes`].
    SnapshotBytes,
}

/// Bytes one filter is counted for in [`ReplicaLimits`].
fn filter_weight(filter: &str) -> usize {
    filter.len() + FILTER_OVERHEAD
}

/// The bytes a list of filters is counted for.
fn weight<'a>(filters: impl Iterator<Item = &'a Arc<str>>) -> usize {
    filters.map(|f| filter_weight(f)).sum()
}

/// The nodes that have a filter (sorted, small: one entry per region node).
pub type NodeSet = Vec<NodeId>;

/// What applying a delta did, and what the replica needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeltaOutcome {
    /// Applied (with any buffered deltas that followed it); the replica is at `version`.
    Applied {
        /// The version the replica is at now.
        version: u64,
    },
    /// Nothing new (already applied).
    Duplicate,
    /// It starts after the replica's version: kept for later, ask the owner for the changes
    /// after `after`.
    Gap {
        /// The version the replica is at: the owner should send the changes after it.
        after: u64,
    },
    /// The replica cannot continue from deltas (the hash disagreed, a new incarnation began
    /// mid-log, or too many deltas are out of order): ask for a snapshot.
    NeedSnapshot,
    /// From an older incarnation of the owner: ignored.
    Stale,
    /// Applying it would take the replica past a bound: not applied (the replica is as it
    /// was, buffered deltas dropped).
    OverLimit(ReplicaLimit),
}

/// What applying a snapshot chunk did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotOutcome {
    /// More chunks are needed.
    InProgress,
    /// The snapshot is complete and installed; the replica is at `version`.
    Installed {
        /// The version the replica is at now.
        version: u64,
    },
    /// Older than what the replica has, or from an older incarnation: ignored.
    Stale,
    /// The chunks did not add up to the announced hash: ask again.
    Corrupt,
    /// The snapshot is larger than a bound allows: dropped, the replica is as it was.
    OverLimit(ReplicaLimit),
}

/// One owner's route set as this node knows it.
#[derive(Debug, Clone, Default)]
pub struct Replica {
    /// The owner's incarnation this copy follows.
    pub incarnation: u64,
    /// The version applied.
    pub version: u64,
    /// [`super::set_hash`] of the filters at `version`.
    pub hash: u64,
    /// Hashed with a fixed seed: iteration order depends only on the operations applied.
    filters: HashSet<Arc<str>, FixedState>,
    /// Bytes of `filters`, as [`ReplicaLimits`] counts them.
    bytes: usize,
    /// Deltas that arrived before the one they follow, by `after`.
    early: BTreeMap<u64, RouteDelta>,
    /// Bytes of `early`, as [`ReplicaLimits`] counts them.
    early_bytes: usize,
    /// A snapshot being received.
    assembling: Option<Assembly>,
}

impl Replica {
    fn clear_early(&mut self) {
        self.early.clear();
        self.early_bytes = 0;
    }

    /// Where this copy stands.
    pub fn position(&self) -> RoutePosition {
        RoutePosition {
            incarnation: self.incarnation,
            version: self.version,
            hash: self.hash,
        }
    }
}

/// The chunks of one snapshot received so far.
#[derive(Debug, Clone)]
struct Assembly {
    /// (version, hash, count): which snapshot the chunks belong to.
    id: (u64, u64, u32),
    parts: BTreeMap<u32, Vec<Arc<str>>>,
    /// Bytes of `parts`, as [`ReplicaLimits`] counts them.
    bytes: usize,
    /// Filters in `parts`.
    filters: usize,
}

impl Replica {
    /// The filter patterns the owner has subscribers for, in an order fixed by the operations
    /// applied.
    pub fn filters(&self) -> impl Iterator<Item = &str> {
        self.filters.iter().map(|f| &**f)
    }

    /// Number of filters.
    pub fn len(&self) -> usize {
        self.filters.len()
    }

    /// Whether the owner has no filters.
    pub fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }
}

/// Every other owner's route set, and one trie that answers which nodes want a topic.
#[derive(Debug)]
pub struct RouteTable {
    replicas: BTreeMap<NodeId, Replica>,
    trie: FilterTrie<NodeSet>,
    /// Filters added to (`true`) or removed from (`false`) replicas, for a shell that keeps
    /// replicas in storage ([`RouteTable::journal`]); `None` when nobody reads it.
    journal: Option<Vec<FilterChange>>,
    limits: ReplicaLimits,
    /// Owners held within other limits than `limits` (a node's leaves).
    owner_limits: BTreeMap<NodeId, ReplicaLimits>,
}

impl RouteTable {
    /// An empty table without bounds; `seed` fixes the trie's hashing, so that runs are
    /// repeatable.
    pub fn new(seed: u64) -> Self {
        Self {
            replicas: BTreeMap::new(),
            trie: FilterTrie::new(seed),
            journal: None,
            limits: ReplicaLimits::UNBOUNDED,
            owner_limits: BTreeMap::new(),
        }
    }

    /// Hold `owner`'s replica within `limits` rather than the table's (`None`: the table's).
    pub fn set_owner_limits(&mut self, owner: &NodeId, limits: Option<ReplicaLimits>) {
        match limits {
            Some(l) => self.owner_limits.insert(owner.clone(), l),
            None => self.owner_limits.remove(owner),
        };
    }

    fn limits_for(&self, owner: &NodeId) -> ReplicaLimits {
        self.owner_limits.get(owner).copied().unwrap_or(self.limits)
    }

    /// Hold every owner's replica within `limits`.
    pub fn with_limits(mut self, limits: ReplicaLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Record every filter added to or removed from a replica from now on; take them with
    /// [`RouteTable::take_journal`] (a node that persists its replicas writes exactly those).
    pub fn journal(mut self) -> Self {
        self.journal = Some(Vec::new());
        self
    }

    /// The filter changes since the last call.
    pub fn take_journal(&mut self) -> Vec<FilterChange> {
        self.journal
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Put back a filter of `node`'s replica read from storage (any order, with
    /// [`RouteTable::restore_position`]).
    pub fn restore_filter(&mut self, node: &NodeId, filter: &str) {
        let replica = self.replicas.entry(node.clone()).or_default();
        let filter: Arc<str> = filter.into();
        if replica.filters.insert(filter.clone()) {
            replica.bytes += filter_weight(&filter);
            index(&mut self.trie, &filter, node);
        }
    }

    /// Put back where `node`'s replica stood, from storage.
    pub fn restore_position(&mut self, node: &NodeId, position: RoutePosition) {
        let replica = self.replicas.entry(node.clone()).or_default();
        replica.incarnation = position.incarnation;
        replica.version = position.version;
        replica.hash = position.hash;
    }

    /// `node`'s replica, if this node holds one.
    pub fn replica(&self, node: &NodeId) -> Option<&Replica> {
        self.replicas.get(node)
    }

    /// Every replica, by owner node.
    pub fn replicas(&self) -> impl Iterator<Item = (&NodeId, &Replica)> {
        self.replicas.iter()
    }

    /// Distinct filter patterns with at least one remote node.
    pub fn patterns(&self) -> usize {
        self.trie.len()
    }

    /// The nodes with a subscriber whose filter matches `topic`, each once, sorted.
    pub fn nodes_for(&self, topic: &str, out: &mut Vec<NodeId>) {
        out.clear();
        self.trie
            .for_each_match(topic, |nodes| out.extend(nodes.iter().cloned()));
        if out.len() > 1 {
            out.sort();
            out.dedup();
        }
    }

    /// Forget a node (it left the deployment).
    pub fn remove_node(&mut self, node: &NodeId) {
        if let Some(replica) = self.replicas.remove(node) {
            for filter in &replica.filters {
                unindex(&mut self.trie, filter, node);
                note(&mut self.journal, node, filter, false);
            }
        }
    }

    /// Apply a delta from its owner.
    pub fn apply_delta(&mut self, delta: &RouteDelta) -> DeltaOutcome {
        let node = &delta.owner.node;
        let limits = self.limits_for(node);
        let replica = self.replicas.entry(node.clone()).or_default();
        if delta.owner.incarnation < replica.incarnation {
            return DeltaOutcome::Stale;
        }
        if delta.owner.incarnation > replica.incarnation
            && delta.after > 0
            && !replica.filters.is_empty()
        {
            // A new incarnation that began before this delta: its set is whole only in a
            // snapshot. Until it installs, the earlier incarnation's filters stay (the node
            // mostly restored them): a message forwarded to a filter it dropped is dropped
            // there, one not forwarded to a filter it still has is lost.
            let asked = replica
                .early
                .values()
                .any(|d| d.owner.incarnation == delta.owner.incarnation);
            if replica.early.len() < MAX_BUFFERED_DELTAS {
                let bytes = weight(delta.changes.iter().map(|c| &c.filter));
                if replica.early_bytes.saturating_add(bytes) <= limits.max_pending_bytes {
                    if let Some(old) = replica.early.insert(delta.after, delta.clone()) {
                        replica.early_bytes -= weight(old.changes.iter().map(|c| &c.filter));
                    }
                    replica.early_bytes += bytes;
                }
            }
            return if asked {
                DeltaOutcome::Duplicate
            } else {
                DeltaOutcome::NeedSnapshot
            };
        }
        if delta.owner.incarnation > replica.incarnation {
            // A new incarnation from its first change replaces everything the earlier one
            // announced.
            let old = std::mem::take(replica);
            for filter in &old.filters {
                unindex(&mut self.trie, filter, node);
                note(&mut self.journal, node, filter, false);
            }
            let replica = self.replicas.entry(node.clone()).or_default();
            replica.incarnation = delta.owner.incarnation;
        }
        let replica = self.replicas.entry(node.clone()).or_default();
        if delta.to() <= replica.version {
            return DeltaOutcome::Duplicate;
        }
        if delta.after > replica.version {
            if replica.early.len() >= MAX_BUFFERED_DELTAS {
                replica.clear_early();
                return DeltaOutcome::NeedSnapshot;
            }
            let bytes = weight(delta.changes.iter().map(|c| &c.filter));
            if replica.early_bytes.saturating_add(bytes) > limits.max_pending_bytes {
                // As for too many deltas out of order: what is held goes, and a snapshot
                // (in bounded chunks) repairs the replica; an honest owner that sent a large
                // batch over a lossy path is not cut for it.
                replica.clear_early();
                return DeltaOutcome::NeedSnapshot;
            }
            if let Some(old) = replica.early.insert(delta.after, delta.clone()) {
                replica.early_bytes -= weight(old.changes.iter().map(|c| &c.filter));
            }
            replica.early_bytes += bytes;
            return DeltaOutcome::Gap {
                after: replica.version,
            };
        }
        if let Err(outcome) = self.apply_checked(node, delta) {
            return outcome;
        }
        // Deltas that were waiting for this one.
        while let Some(delta) = self.next_early(node) {
            if let Err(outcome) = self.apply_checked(node, &delta) {
                return outcome;
            }
        }
        let version = self.replicas.get(node).map_or(0, |r| r.version);
        DeltaOutcome::Applied { version }
    }

    /// A buffered delta that now continues the replica (those entirely behind it are dropped).
    /// Only one of the replica's own incarnation: a later incarnation's, buffered while it
    /// waits for that incarnation's snapshot, numbers its changes afresh and would mix the
    /// two sets.
    fn next_early(&mut self, node: &NodeId) -> Option<RouteDelta> {
        let replica = self.replicas.get_mut(node)?;
        let incarnation = replica.incarnation;
        loop {
            let (&after, _) = replica
                .early
                .range(..=replica.version)
                .rfind(|(_, d)| d.owner.incarnation == incarnation)?;
            let delta = replica.early.remove(&after)?;
            replica.early_bytes -= weight(delta.changes.iter().map(|c| &c.filter));
            if delta.to() > replica.version {
                return Some(delta);
            }
        }
    }

    /// Apply `delta` (which continues the replica) within the bounds.
    fn apply_checked(&mut self, node: &NodeId, delta: &RouteDelta) -> Result<(), DeltaOutcome> {
        if let Some(limit) = self.over_limit(node, delta) {
            if let Some(r) = self.replicas.get_mut(node) {
                r.clear_early();
            }
            return Err(DeltaOutcome::OverLimit(limit));
        }
        if !self.apply_in_order(node, delta) {
            return Err(DeltaOutcome::NeedSnapshot);
        }
        Ok(())
    }

    /// Whether applying `delta` would take the replica past [`ReplicaLimits::max_filters`],
    /// or past [`ReplicaLimits::max_snapshot_bytes`] in bytes.
    fn over_limit(&self, node: &NodeId, delta: &RouteDelta) -> Option<ReplicaLimit> {
        let replica = self.replicas.get(node)?;
        let limits = self.limits_for(node);
        let (mut len, mut bytes) = (replica.filters.len(), replica.bytes);
        for change in delta.changes.iter().filter(|c| c.version > replica.version) {
            let weight = filter_weight(&change.filter);
            match change.op {
                RouteOp::Add => {
                    len += 1;
                    bytes = bytes.saturating_add(weight);
                }
                RouteOp::Remove => {
                    len = len.saturating_sub(1);
                    bytes = bytes.saturating_sub(weight);
                }
            }
            if len > limits.max_filters {
                return Some(ReplicaLimit::Filters);
            }
            if bytes > limits.max_snapshot_bytes {
                return Some(ReplicaLimit::SnapshotBytes);
            }
        }
        None
    }

    /// Apply the changes of `delta` newer than the replica (which must be at or past
    /// `delta.after`); false if the result's hash disagrees with the owner's.
    fn apply_in_order(&mut self, node: &NodeId, delta: &RouteDelta) -> bool {
        let Some(replica) = self.replicas.get_mut(node) else {
            return false;
        };
        let start = replica.version;
        for change in delta.changes.iter().filter(|c| c.version > start) {
            // One hash-set operation per change; adding what is there or removing what is
            // not means the replica diverged.
            let changed = match change.op {
                RouteOp::Add => replica.filters.insert(change.filter.clone()),
                RouteOp::Remove => replica.filters.remove(&change.filter),
            };
            if !changed {
                return false;
            }
            replica.hash ^= filter_hash(&change.filter);
            let weight = filter_weight(&change.filter);
            match change.op {
                RouteOp::Add => {
                    replica.bytes += weight;
                    index(&mut self.trie, &change.filter, node);
                }
                RouteOp::Remove => {
                    replica.bytes = replica.bytes.saturating_sub(weight);
                    unindex(&mut self.trie, &change.filter, node);
                }
            }
            note(
                &mut self.journal,
                node,
                &change.filter,
                change.op == RouteOp::Add,
            );
            replica.version = change.version;
        }
        replica.version = replica.version.max(delta.to());
        replica.hash == delta.hash
    }

    /// Apply one snapshot chunk; the replica switches to the snapshot once all chunks are in.
    pub fn apply_snapshot_chunk(&mut self, chunk: &SnapshotChunk) -> SnapshotOutcome {
        let node = &chunk.owner.node;
        let limits = self.limits_for(node);
        let replica = self.replicas.entry(node.clone()).or_default();
        if chunk.owner.incarnation < replica.incarnation
            || (chunk.owner.incarnation == replica.incarnation && chunk.version < replica.version)
        {
            return SnapshotOutcome::Stale;
        }
        let id = (chunk.version, chunk.hash, chunk.count);
        if replica.assembling.as_ref().is_none_or(|a| a.id != id) {
            replica.assembling = Some(Assembly {
                id,
                parts: BTreeMap::new(),
                bytes: 0,
                filters: 0,
            });
        }
        let Some(assembly) = replica.assembling.as_mut() else {
            return SnapshotOutcome::InProgress;
        };
        if chunk.index >= chunk.count {
            replica.assembling = None;
            return SnapshotOutcome::Corrupt;
        }
        let bytes = weight(chunk.filters.iter()) + FILTER_OVERHEAD;
        if let Some(old) = assembly.parts.remove(&chunk.index) {
            assembly.bytes -= weight(old.iter()) + FILTER_OVERHEAD;
            assembly.filters -= old.len();
        }
        assembly.bytes = assembly.bytes.saturating_add(bytes);
        assembly.filters += chunk.filters.len();
        let limit = if assembly.filters > limits.max_filters {
            Some(ReplicaLimit::Filters)
        } else if assembly.bytes > limits.max_snapshot_bytes {
            Some(ReplicaLimit::SnapshotBytes)
        } else {
            None
        };
        if let Some(limit) = limit {
            replica.assembling = None;
            return SnapshotOutcome::OverLimit(limit);
        }
        assembly.parts.insert(chunk.index, chunk.filters.clone());
        if assembly.parts.len() < chunk.count as usize {
            return SnapshotOutcome::InProgress;
        }
        let Some(Assembly { parts, .. }) = replica.assembling.take() else {
            return SnapshotOutcome::InProgress;
        };
        let filters: HashSet<Arc<str>, FixedState> = parts.into_values().flatten().collect();
        if super::set_hash(filters.iter().map(|f| &**f)) != chunk.hash {
            return SnapshotOutcome::Corrupt;
        }
        // Install: index the difference, keep deltas of this incarnation that follow the
        // snapshot (those of an earlier one would be applied on top of the new set).
        let old = std::mem::take(&mut replica.filters);
        let early = std::mem::take(&mut replica.early);
        replica.early_bytes = 0;
        for gone in old.difference(&filters) {
            unindex(&mut self.trie, gone, node);
            note(&mut self.journal, node, gone, false);
        }
        for new in filters.difference(&old) {
            index(&mut self.trie, new, node);
            note(&mut self.journal, node, new, true);
        }
        let replica = self.replicas.entry(node.clone()).or_default();
        replica.bytes = weight(filters.iter());
        replica.filters = filters;
        replica.incarnation = chunk.owner.incarnation;
        replica.version = chunk.version;
        replica.hash = chunk.hash;
        replica.early = early
            .into_iter()
            .filter(|(_, d)| d.owner.incarnation == chunk.owner.incarnation)
            .filter(|(_, d)| d.to() > chunk.version)
            .collect();
        replica.early_bytes = replica
            .early
            .values()
            .map(|d| weight(d.changes.iter().map(|c| &c.filter)))
            .sum();
        SnapshotOutcome::Installed {
            version: chunk.version,
        }
    }
}

/// A filter that joined or left a replica ([`RouteTable::take_journal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterChange {
    /// The replica's owner.
    pub owner: NodeId,
    /// The filter.
    pub filter: Arc<str>,
    /// Whether it is in the replica now.
    pub present: bool,
}

fn note(journal: &mut Option<Vec<FilterChange>>, node: &NodeId, filter: &Arc<str>, present: bool) {
    if let Some(j) = journal {
        j.push(FilterChange {
            owner: node.clone(),
            filter: filter.clone(),
            present,
        });
    }
}

fn index(trie: &mut FilterTrie<NodeSet>, filter: &str, node: &NodeId) {
    let nodes = trie.entry(filter);
    if let Err(at) = nodes.binary_search(node) {
        nodes.insert(at, node.clone());
    }
}

fn unindex(trie: &mut FilterTrie<NodeSet>, filter: &str, node: &NodeId) {
    // One walk down the trie; the filter goes when its last node does.
    trie.update_or_remove(filter, |nodes| {
        if let Ok(at) = nodes.binary_search(node) {
            nodes.remove(at);
        }
        !nodes.is_empty()
    });
}
