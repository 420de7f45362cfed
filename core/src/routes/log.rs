//! The owner's side: this node's route set and its versioned change log.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use super::hash::filter_hash;
use super::{NodeId, Owner, RouteChange, RouteDelta, RouteOp, SnapshotChunk};

/// Filter bytes in one snapshot chunk, about (a chunk is one link frame).
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;

/// This node's route set, the changes peers may still need, and the batch being collected.
#[derive(Debug, Clone)]
pub struct RouteLog {
    owner: Owner,
    /// Last version given to a change.
    version: u64,
    live: BTreeSet<Arc<str>>,
    hash: u64,
    /// Changes with versions `floor + 1 ..= version`; older ones were dropped.
    log: VecDeque<RouteChange>,
    floor: u64,
    /// Net effect of the current batch relative to `live`.
    pending: BTreeMap<Arc<str>, RouteOp>,
    /// Peers that must acknowledge a change before it may be dropped, and what they acked.
    acked: BTreeMap<NodeId, u64>,
    /// Most changes kept for peers that are behind; past it they get a snapshot.
    tombstone_budget: usize,
}

impl RouteLog {
    /// An empty route set for `owner`, keeping at most `tombstone_budget` changes (at least 1) for
    /// peers that are behind.
    pub fn new(owner: Owner, tombstone_budget: usize) -> Self {
        Self {
            owner,
            version: 0,
            live: BTreeSet::new(),
            hash: 0,
            log: VecDeque::new(),
            floor: 0,
            pending: BTreeMap::new(),
            acked: BTreeMap::new(),
            tombstone_budget: tombstone_budget.max(1),
        }
    }

    /// Who writes this route set.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The version of the last flushed change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// [`super::set_hash`] of the flushed live set.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The flushed live set.
    pub fn live(&self) -> impl Iterator<Item = &str> {
        self.live.iter().map(|f| &**f)
    }

    /// The set as it stands with the current batch applied: the flushed live set, less what
    /// the batch removes, and what it adds.
    pub fn wanted(&self) -> impl Iterator<Item = &str> {
        let kept = self
            .live
            .iter()
            .filter(|f| self.pending.get(*f) != Some(&RouteOp::Remove));
        let added = self
            .pending
            .iter()
            .filter(|(_, op)| **op == RouteOp::Add)
            .map(|(f, _)| f);
        kept.chain(added).map(|f| &**f)
    }

    /// Whether `filter` is in the set as it stands with the current batch applied.
    pub fn wants(&self, filter: &str) -> bool {
        match self.pending.get(filter) {
            Some(op) => *op == RouteOp::Add,
            None => self.live.contains(filter),
        }
    }

    /// How many filters the set holds with the current batch applied (a batch adds only
    /// filters that are not live and removes only live ones).
    pub fn wanted_len(&self) -> usize {
        let adds = self
            .pending
            .values()
            .filter(|op| **op == RouteOp::Add)
            .count();
        (self.live.len() + adds) - (self.pending.len() - adds)
    }

    /// Changes kept for peers (tombstones included).
    pub fn retained_changes(&self) -> usize {
        self.log.len()
    }

    /// The first local subscriber of `filter` appeared.
    pub fn add(&mut self, filter: &str) {
        self.stage(filter, RouteOp::Add);
    }

    /// The last local subscriber of `filter` left.
    pub fn remove(&mut self, filter: &str) {
        self.stage(filter, RouteOp::Remove);
    }

    fn stage(&mut self, filter: &str, op: RouteOp) {
        let is_live = self.live.contains(filter);
        let wanted = op == RouteOp::Add;
        if is_live == wanted {
            // Back to the flushed state: an add and a remove inside one batch cancel.
            self.pending.remove(filter);
        } else {
            self.pending.insert(filter.into(), op);
        }
    }

    /// Whether a batch is waiting for [`RouteLog::flush`].
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Close the batch: every change gets the next version (in filter order). Returns the
    /// delta to send to every peer, or `None` if nothing changed.
    pub fn flush(&mut self) -> Option<RouteDelta> {
        if self.pending.is_empty() {
            return None;
        }
        let after = self.version;
        let mut changes = Vec::with_capacity(self.pending.len());
        for (filter, op) in std::mem::take(&mut self.pending) {
            self.version += 1;
            self.hash ^= filter_hash(&filter);
            match op {
                RouteOp::Add => self.live.insert(filter.clone()),
                RouteOp::Remove => self.live.remove(&filter),
            };
            changes.push(RouteChange {
                version: self.version,
                filter,
                op,
            });
        }
        self.log.extend(changes.iter().cloned());
        self.trim();
        Some(RouteDelta {
            owner: self.owner.clone(),
            after,
            changes,
            hash: self.hash,
        })
    }

    /// What a peer at version `after` is missing, or `None` if those changes are gone (the
    /// peer needs a snapshot) or `after` is in the future.
    pub fn delta_since(&self, after: u64) -> Option<RouteDelta> {
        if after < self.floor || after > self.version {
            return None;
        }
        let skip = usize::try_from(after - self.floor).ok()?;
        Some(RouteDelta {
            owner: self.owner.clone(),
            after,
            changes: self.log.iter().skip(skip).cloned().collect(),
            hash: self.hash,
        })
    }

    /// The flushed live set in chunks of at most `filters_per_chunk` filters and about
    /// [`SNAPSHOT_CHUNK_BYTES`] of them.
    pub fn snapshot(&self, filters_per_chunk: usize) -> Vec<SnapshotChunk> {
        let per = filters_per_chunk.max(1);
        let mut parts: Vec<Vec<Arc<str>>> = Vec::new();
        let mut part = Vec::new();
        let mut bytes = 0;
        for filter in &self.live {
            bytes += filter.len();
            part.push(filter.clone());
            if part.len() >= per || bytes >= SNAPSHOT_CHUNK_BYTES {
                parts.push(std::mem::take(&mut part));
                bytes = 0;
            }
        }
        if !part.is_empty() {
            parts.push(part);
        }
        let count32 = u32::try_from(parts.len().max(1)).unwrap_or(u32::MAX);
        let mut chunks: Vec<SnapshotChunk> = parts
            .into_iter()
            .enumerate()
            .map(|(i, filters)| SnapshotChunk {
                owner: self.owner.clone(),
                version: self.version,
                hash: self.hash,
                index: u32::try_from(i).unwrap_or(u32::MAX),
                count: count32,
                filters,
            })
            .collect();
        if chunks.is_empty() {
            chunks.push(SnapshotChunk {
                owner: self.owner.clone(),
                version: self.version,
                hash: self.hash,
                index: 0,
                count: 1,
                filters: Vec::new(),
            });
        }
        chunks
    }

    /// A peer that must receive every change (it starts at version 0 until it acknowledges).
    pub fn add_peer(&mut self, peer: NodeId) {
        self.acked.entry(peer).or_insert(0);
    }

    /// A peer that left the deployment: its acknowledgements no longer hold changes back.
    pub fn remove_peer(&mut self, peer: &NodeId) {
        self.acked.remove(peer);
        self.trim();
    }

    /// A peer has applied everything up to `version`.
    pub fn ack(&mut self, peer: &NodeId, version: u64) {
        let version = version.min(self.version);
        let entry = self.acked.entry(peer.clone()).or_insert(0);
        *entry = (*entry).max(version);
        self.trim();
    }

    /// What `peer` acknowledged last.
    pub fn acked(&self, peer: &NodeId) -> Option<u64> {
        self.acked.get(peer).copied()
    }

    /// Drop changes every peer has, then any beyond the tombstone budget.
    fn trim(&mut self) {
        let everyone = self.acked.values().copied().min().unwrap_or(self.version);
        while let Some(first) = self.log.front() {
            if first.version <= everyone || self.log.len() > self.tombstone_budget {
                self.floor = first.version;
                self.log.pop_front();
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::set_hash;

    fn owner() -> Owner {
        Owner {
            node: NodeId::new("n1").unwrap(),
            incarnation: 1,
        }
    }

    #[test]
    fn add_and_remove_inside_one_batch_cancel() {
        let mut log = RouteLog::new(owner(), 100);
        log.add("a/#");
        log.remove("a/#");
        assert!(!log.has_pending());
        assert_eq!(log.flush(), None);
        log.add("b");
        let delta = log.flush().unwrap();
        log.remove("b");
        log.add("b");
        assert_eq!(
            log.flush(),
            None,
            "removing and re-adding a live filter is no change"
        );
        assert_eq!(delta.after, 0);
        assert_eq!(delta.to(), 1);
        assert_eq!(delta.hash, set_hash(["b"]));
    }

    #[test]
    fn each_change_gets_the_next_version_in_filter_order() {
        let mut log = RouteLog::new(owner(), 100);
        log.add("z");
        log.add("a");
        let d = log.flush().unwrap();
        let got: Vec<(u64, &str)> = d.changes.iter().map(|c| (c.version, &*c.filter)).collect();
        assert_eq!(got, vec![(1, "a"), (2, "z")]);
    }

    #[test]
    fn delta_since_serves_peers_until_they_acknowledge() {
        let peer = NodeId::new("peer").unwrap();
        let mut log = RouteLog::new(owner(), 100);
        log.add_peer(peer.clone());
        log.add("a");
        log.flush();
        log.add("b");
        log.flush();
        assert_eq!(log.delta_since(1).unwrap().changes.len(), 1);
        assert_eq!(log.delta_since(0).unwrap().changes.len(), 2);
        log.ack(&peer, 1);
        assert_eq!(log.retained_changes(), 1);
        assert_eq!(
            log.delta_since(0),
            None,
            "version 1 is gone: a snapshot is needed"
        );
        log.ack(&peer, 2);
        assert_eq!(log.retained_changes(), 0);
        assert_eq!(log.delta_since(2).unwrap().changes.len(), 0);
    }

    #[test]
    fn tombstone_budget_bounds_the_log_for_a_silent_peer() {
        let mut log = RouteLog::new(owner(), 3);
        log.add_peer(NodeId::new("silent").unwrap());
        for i in 0..10 {
            log.add(&format!("f/{i}"));
            log.flush();
        }
        assert_eq!(log.retained_changes(), 3);
        assert_eq!(log.delta_since(0), None);
        assert!(log.delta_since(7).is_some());
    }

    #[test]
    fn snapshot_chunks_cover_the_live_set() {
        let mut log = RouteLog::new(owner(), 100);
        for f in ["a", "b", "c", "d", "e"] {
            log.add(f);
        }
        log.flush();
        let chunks = log.snapshot(2);
        assert_eq!(chunks.len(), 3);
        assert!(chunks.iter().all(|c| c.count == 3 && c.version == 5));
        let all: Vec<&str> = chunks
            .iter()
            .flat_map(|c| c.filters.iter().map(|f| &**f))
            .collect();
        assert_eq!(all, ["a", "b", "c", "d", "e"]);
        let empty = RouteLog::new(owner(), 1).snapshot(10);
        assert_eq!(empty.len(), 1, "an empty set is one empty chunk");
    }
}
