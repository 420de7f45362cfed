//! The replicated route index: which topic filters have subscribers on which node.
//!
//! Each node owns its *route set* (the filter patterns with at least one local subscriber) and
//! is its only writer, so the index is conflict-free by construction. The owner keeps a
//! versioned log of changes ([`RouteLog`]); other nodes hold a [`Replica`] per owner inside one
//! [`RouteTable`], whose trie answers "which nodes want this topic" with one match.
//!
//! Replication, all of it driven by the link layer:
//! - Changes are batched ([`RouteLog::add`], [`RouteLog::remove`]); an add and a remove of the
//!   same filter inside one batch cancel. [`RouteLog::flush`] gives every surviving change the
//!   next version and returns a [`RouteDelta`] to broadcast.
//! - Every delta carries the hash of the owner's live set after it ([`set_hash`]). A replica
//!   applies deltas in version order, keeps a bounded number that arrive early, drops
//!   duplicates, and asks for what it misses ([`DeltaOutcome`]).
//! - An owner keeps changes until every peer acknowledged them ([`RouteLog::ack`]), within a
//!   tombstone budget; a peer that fell behind the budget, or whose hash disagrees, gets a
//!   chunked snapshot ([`RouteLog::snapshot`]) instead.
//! - Owner identity is `(node id, incarnation)`: a restarted owner's new incarnation replaces
//!   everything its earlier one announced.

mod hash;
mod log;
mod table;

use std::fmt;
use std::sync::Arc;

pub use hash::{filter_hash, set_hash};

/// Filter bytes in one route-delta frame as a node sends it, about ([`RouteDelta::split`]):
/// well inside a gossip message and a link frame.
pub const DELTA_MAX_BYTES: usize = 512 * 1024;
pub use log::{RouteLog, SNAPSHOT_CHUNK_BYTES};
pub use table::{
    DeltaOutcome, FilterChange, NodeSet, Replica, ReplicaLimit, ReplicaLimits, RouteTable,
    SnapshotOutcome,
};

/// A node of the deployment, named by the shell (e.g. `euc1-a` or a libp2p peer id).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(Arc<str>);

/// Why a node id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid node id: {0}")]
pub struct NodeIdError(&'static str);

impl NodeId {
    /// 1 to 255 bytes of printable characters.
    pub fn new(id: &str) -> Result<Self, NodeIdError> {
        if id.is_empty() {
            return Err(NodeIdError("empty"));
        }
        if id.len() > 255 {
            return Err(NodeIdError("longer than 255 bytes"));
        }
        if id.chars().any(char::is_control) {
            return Err(NodeIdError("contains control characters"));
        }
        Ok(Self(id.into()))
    }

    /// The id as the shell gave it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a copy of a route set stands: its owner's incarnation, the version it has reached
/// and the hash of the live set there. Copies at equal positions hold equal sets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RoutePosition {
    /// The owner's incarnation.
    pub incarnation: u64,
    /// The version reached.
    pub version: u64,
    /// [`set_hash`] of the live set at that version.
    pub hash: u64,
}

impl RoutePosition {
    /// Bytes of [`RoutePosition::to_bytes`].
    pub const LEN: usize = 24;

    /// Three big-endian words, as stored.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0; Self::LEN];
        out[..8].copy_from_slice(&self.incarnation.to_be_bytes());
        out[8..16].copy_from_slice(&self.version.to_be_bytes());
        out[16..].copy_from_slice(&self.hash.to_be_bytes());
        out
    }

    /// What [`RoutePosition::to_bytes`] wrote; `None` for anything else.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; Self::LEN] = bytes.try_into().ok()?;
        let word = |i: usize| {
            let mut w = [0; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            u64::from_be_bytes(w)
        };
        Some(Self {
            incarnation: word(0),
            version: word(8),
            hash: word(16),
        })
    }
}

/// Who writes a route set: a node, in one incarnation (bumped on every restart that lost
/// its in-memory route state).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    /// The node that writes the route set.
    pub node: NodeId,
    /// Its incarnation: a greater one replaces everything an earlier one announced.
    pub incarnation: u64,
}

/// What a change does to a filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteOp {
    /// The filter gained its first local subscriber.
    Add,
    /// The filter lost its last local subscriber.
    Remove,
}

/// One versioned change of an owner's route set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteChange {
    /// The version this change gave the route set.
    pub version: u64,
    /// The filter pattern.
    pub filter: Arc<str>,
    /// Added or removed.
    pub op: RouteOp,
}

/// The changes of one owner after version `after`, one version each, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteDelta {
    /// The route set's owner.
    pub owner: Owner,
    /// The version the changes follow: the first of them has `after + 1`.
    pub after: u64,
    /// The changes, in version order.
    pub changes: Vec<RouteChange>,
    /// [`set_hash`] of the owner's live set once these changes are applied.
    pub hash: u64,
}

impl RouteDelta {
    /// The version the delta brings a replica to.
    pub fn to(&self) -> u64 {
        self.after + self.changes.len() as u64
    }

    /// The same changes as consecutive deltas of at most `max_changes` changes and about
    /// `max_bytes` of filters each (at least one change each), every one with the hash of the
    /// live set after it: applied in order, they do what the whole delta does, and none is
    /// too large for a frame however many filters a node gains at once (after a restart, all
    /// of them).
    pub fn split(self, max_changes: usize, max_bytes: usize) -> Vec<RouteDelta> {
        let max_changes = max_changes.max(1);
        let fits = |d: &RouteDelta| {
            d.changes.len() <= max_changes
                && d.changes.iter().map(|c| c.filter.len()).sum::<usize>() <= max_bytes
        };
        if fits(&self) {
            return vec![self];
        }
        // The hash after each change: the final hash without the changes that follow it.
        let mut after_each = vec![0; self.changes.len()];
        let mut hash = self.hash;
        for (i, change) in self.changes.iter().enumerate().rev() {
            after_each[i] = hash;
            hash ^= hash::filter_hash(&change.filter);
        }
        let mut out = Vec::new();
        let mut part = Vec::new();
        let mut bytes = 0;
        let mut after = self.after;
        for (i, change) in self.changes.into_iter().enumerate() {
            bytes += change.filter.len();
            part.push(change);
            let full = part.len() >= max_changes || bytes >= max_bytes;
            if full || i + 1 == after_each.len() {
                let changes = std::mem::take(&mut part);
                let next = after + changes.len() as u64;
                out.push(RouteDelta {
                    owner: self.owner.clone(),
                    after,
                    changes,
                    hash: after_each[i],
                });
                after = next;
                bytes = 0;
            }
        }
        out
    }
}

/// One piece of an owner's live set at `version`; chunks `0..count` together are the set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotChunk {
    /// The route set's owner.
    pub owner: Owner,
    /// The version the set is at.
    pub version: u64,
    /// [`set_hash`] of the whole set, to check the assembled chunks against.
    pub hash: u64,
    /// This chunk's position, from 0.
    pub index: u32,
    /// How many chunks make the snapshot.
    pub count: u32,
    /// This chunk's filter patterns.
    pub filters: Vec<Arc<str>>,
}
