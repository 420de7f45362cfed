//! The route replication checker: owners change their route sets, replicas follow through
//! deltas, acknowledgements, digests and snapshots sent as link frames over a network that
//! reorders, duplicates and drops them; then the network heals.
//!
//! Two owners ([`RouteLog`]) and two replicas ([`RouteTable`], each holding both owners' sets)
//! exchange the frames the cluster layer exchanges (`core/src/broker/cluster.rs`): a flush
//! broadcasts a `RouteDelta`; a replica acknowledges what it applied (`RouteAck`), answers a gap
//! with a `Digest` of where it stands and a hash mismatch or overflow with a `SnapshotRequest`;
//! owners broadcast their `Digest` now and then and answer a replica's digest with the delta
//! since its version, or a chunked snapshot when that is gone or the incarnation differs. An
//! owner may restart (a new incarnation with an empty set; its earlier frames are still in
//! flight), forget a peer and see it come back. Every frame is encoded and decoded with the
//! link codec on its way.
//!
//! Checked after every step (a table after every frame it receives):
//! - a replica of an owner incarnation is at a version that incarnation flushed, with exactly
//!   the set the owner had then, and the hash of that set (never a mix of two versions or two
//!   incarnations); a replica never heard of is empty at version 0;
//! - each table's trie answers `nodes_for` exactly as the naive matcher over the replicas'
//!   sets, and counts the distinct patterns;
//! - an owner keeps at most its tombstone budget of changes.
//!
//! At the end the network heals: owners flush, then rounds of owner digests with every frame
//! delivered in order until nothing is in flight; within a few rounds every replica must hold
//! every owner's live set, at its version, incarnation and hash, and a round must end in
//! bounded traffic (no livelock).

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::{Arbitrary, Unstructured};
use bytes::BytesMut;
use meridian_core::link::{self, DEFAULT_MAX_FRAME_LEN, DigestEntry, Frame};
use meridian_core::routes::{
    DeltaOutcome, NodeId, Owner, RouteLog, RouteTable, SnapshotOutcome, set_hash,
};
use meridian_core::topic::matches;

use crate::trace;

/// Filter patterns the owners subscribe to: overlapping wildcards, `$` and empty levels.
pub const FILTERS: &[&str] = &[
    "a/b", "a/+", "a/#", "#", "+/b", "$SYS/#", "c", "c/d/e", "+", "/a",
];
/// Topics the tries are asked about.
pub const TOPICS: &[&str] = &["a/b", "a/c", "a", "c", "c/d/e", "$SYS/x", "/a", "b/b", "z"];

pub const OWNERS: usize = 2;
pub const REPLICAS: usize = 2;

/// Healing rounds allowed before the replicas must have converged.
const HEAL_ROUNDS: usize = 8;
/// Frames one healing round may deliver before it counts as a livelock.
const HEAL_FRAMES: usize = 10_000;

#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    /// Stage an add in owner `owner % 2`'s batch (`filter % FILTERS.len()`).
    Add {
        owner: u8,
        filter: u8,
    },
    Remove {
        owner: u8,
        filter: u8,
    },
    /// Close the owner's batch and broadcast the delta.
    Flush {
        owner: u8,
    },
    /// Deliver the frame in flight at this position (modulo their number): reordering.
    Deliver(u8),
    /// Put a copy of a frame in flight.
    Duplicate(u8),
    /// Lose a frame.
    Drop(u8),
    /// The owner's periodic digest to every replica.
    Digest {
        owner: u8,
    },
    /// The owner restarts with nothing: a new incarnation, peers come up again.
    Restart {
        owner: u8,
    },
    /// A link between an owner and a replica comes up (the owner adds the peer, sends its
    /// digest).
    PeerUp {
        owner: u8,
        replica: u8,
    },
    /// The owner forgets a peer: its acknowledgements no longer hold changes back.
    RemovePeer {
        owner: u8,
        replica: u8,
    },
    /// The replica asks the owner for a snapshot.
    RequestSnapshot {
        owner: u8,
        replica: u8,
    },
}

#[derive(Debug, Arbitrary)]
pub struct Scenario {
    /// Tombstone budget: `budget % 16 + 1`.
    pub budget: u8,
    /// Filters per snapshot chunk: `chunk % 4 + 1`.
    pub chunk: u8,
    pub ops: Vec<Op>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Owner(usize),
    Replica(usize),
}

/// A frame in flight, encoded, with the frame it must decode to.
#[derive(Debug, Clone)]
struct Msg {
    from: End,
    to: End,
    bytes: BytesMut,
    frame: Frame,
}

struct World {
    budget: usize,
    chunk: usize,
    owner_nodes: Vec<NodeId>,
    replica_nodes: Vec<NodeId>,
    owners: Vec<RouteLog>,
    tables: Vec<RouteTable>,
    wire: Vec<Msg>,
    /// Each owner incarnation's live set at every version it flushed (and 0).
    history: BTreeMap<(usize, u64), BTreeMap<u64, BTreeSet<String>>>,
}

fn node(name: String) -> NodeId {
    NodeId::new(&name).expect("valid node id")
}

impl World {
    fn new(budget: usize, chunk: usize) -> Self {
        let owner_nodes: Vec<NodeId> = (0..OWNERS).map(|i| node(format!("o{i}"))).collect();
        let replica_nodes: Vec<NodeId> = (0..REPLICAS).map(|i| node(format!("r{i}"))).collect();
        let mut world = World {
            budget,
            chunk,
            owners: Vec::new(),
            tables: (0..REPLICAS).map(|i| RouteTable::new(i as u64)).collect(),
            wire: Vec::new(),
            history: BTreeMap::new(),
            owner_nodes,
            replica_nodes,
        };
        for o in 0..OWNERS {
            let log = world.fresh_log(o, 1);
            world.owners.push(log);
        }
        world
    }

    /// An owner's log for `incarnation`, with every replica as a peer.
    fn fresh_log(&mut self, o: usize, incarnation: u64) -> RouteLog {
        let owner = Owner {
            node: self.owner_nodes[o].clone(),
            incarnation,
        };
        let mut log = RouteLog::new(owner, self.budget);
        for r in &self.replica_nodes {
            log.add_peer(r.clone());
        }
        self.history
            .entry((o, incarnation))
            .or_default()
            .insert(0, BTreeSet::new());
        log
    }

    /// Encodes `frame` and puts it in flight.
    fn send(&mut self, from: End, to: End, frame: Frame) {
        let mut bytes = BytesMut::new();
        link::encode(&frame, &mut bytes)
            .unwrap_or_else(|e| panic!("{frame:?} does not encode: {e}"));
        self.wire.push(Msg {
            from,
            to,
            bytes,
            frame,
        });
    }

    fn flush(&mut self, o: usize) {
        let Some(delta) = self.owners[o].flush() else {
            return;
        };
        let log = &self.owners[o];
        let live: BTreeSet<String> = log.live().map(str::to_owned).collect();
        assert_eq!(
            delta.to(),
            log.version(),
            "a delta ends at the owner's version"
        );
        assert_eq!(delta.hash, set_hash(live.iter().map(String::as_str)));
        self.history
            .entry((o, log.owner().incarnation))
            .or_default()
            .insert(log.version(), live);
        for r in 0..REPLICAS {
            self.send(
                End::Owner(o),
                End::Replica(r),
                Frame::RouteDelta(delta.clone()),
            );
        }
    }

    fn digest(&mut self, o: usize, r: usize) {
        let log = &self.owners[o];
        let entry = DigestEntry {
            owner: log.owner().clone(),
            version: log.version(),
            hash: log.hash(),
        };
        self.send(End::Owner(o), End::Replica(r), Frame::Digest(vec![entry]));
    }

    fn send_snapshot(&mut self, o: usize, r: usize) {
        for chunk in self.owners[o].snapshot(self.chunk) {
            self.send(End::Owner(o), End::Replica(r), Frame::SnapshotChunk(chunk));
        }
    }

    /// Decodes a frame in flight (it must be the frame sent) and hands it to its receiver.
    /// Returns the replica that received it, if any.
    fn deliver(&mut self, msg: Msg) -> Option<usize> {
        let mut buf = msg.bytes;
        let frame = link::decode(&mut buf, DEFAULT_MAX_FRAME_LEN)
            .unwrap_or_else(|e| panic!("{:?} does not decode: {e}", msg.frame))
            .unwrap_or_else(|| panic!("{:?} does not decode whole", msg.frame));
        assert_eq!(frame, msg.frame, "a frame does not survive the link codec");
        assert!(buf.is_empty(), "bytes left after {frame:?}");
        trace!("  {:?} -> {:?}: {frame:?}", msg.from, msg.to);
        match (msg.from, msg.to) {
            (End::Replica(r), End::Owner(o)) => {
                self.at_owner(o, r, frame);
                None
            }
            (End::Owner(o), End::Replica(r)) => {
                self.at_replica(r, o, frame);
                Some(r)
            }
            (from, to) => panic!("no link from {from:?} to {to:?}"),
        }
    }

    /// Owner `o` receives `frame` from replica `r`.
    fn at_owner(&mut self, o: usize, r: usize, frame: Frame) {
        let peer = self.replica_nodes[r].clone();
        match frame {
            Frame::RouteAck { owner, version } => {
                if owner == *self.owners[o].owner() {
                    self.owners[o].ack(&peer, version);
                }
            }
            Frame::Digest(entries) => {
                for entry in entries {
                    let log = &self.owners[o];
                    assert_eq!(
                        entry.owner.node,
                        log.owner().node,
                        "digest sent to the wrong owner"
                    );
                    let same = entry.owner.incarnation == log.owner().incarnation;
                    if same && entry.version == log.version() && entry.hash == log.hash() {
                        continue;
                    }
                    let delta = (same && entry.version < log.version())
                        .then(|| log.delta_since(entry.version))
                        .flatten();
                    match delta {
                        Some(delta) => {
                            self.send(End::Owner(o), End::Replica(r), Frame::RouteDelta(delta))
                        }
                        None => self.send_snapshot(o, r),
                    }
                }
            }
            Frame::SnapshotRequest => self.send_snapshot(o, r),
            other => panic!("an owner received {other:?} from a replica"),
        }
    }

    /// Replica `r` receives `frame` from owner `o`.
    fn at_replica(&mut self, r: usize, o: usize, frame: Frame) {
        let table = &mut self.tables[r];
        match frame {
            Frame::RouteDelta(delta) => {
                let owner = delta.owner.clone();
                let outcome = table.apply_delta(&delta);
                trace!("    {outcome:?}");
                match outcome {
                    DeltaOutcome::Applied { version } => {
                        let at = table.replica(&owner.node).map(|r| r.version);
                        assert_eq!(at, Some(version), "Applied names another version");
                        self.send(
                            End::Replica(r),
                            End::Owner(o),
                            Frame::RouteAck { owner, version },
                        );
                    }
                    DeltaOutcome::Gap { after } => {
                        let hash = table.replica(&owner.node).map_or(0, |r| r.hash);
                        let entry = DigestEntry {
                            owner,
                            version: after,
                            hash,
                        };
                        self.send(End::Replica(r), End::Owner(o), Frame::Digest(vec![entry]));
                    }
                    DeltaOutcome::NeedSnapshot => {
                        self.send(End::Replica(r), End::Owner(o), Frame::SnapshotRequest)
                    }
                    DeltaOutcome::Duplicate | DeltaOutcome::Stale => {}
                    DeltaOutcome::OverLimit(l) => panic!("an unbounded table refused: {l:?}"),
                }
            }
            Frame::SnapshotChunk(chunk) => {
                let owner = chunk.owner.clone();
                let outcome = table.apply_snapshot_chunk(&chunk);
                trace!("    {outcome:?}");
                match outcome {
                    SnapshotOutcome::Installed { version } => {
                        let at = table.replica(&owner.node).map(|r| r.version);
                        assert_eq!(at, Some(version), "Installed names another version");
                        self.send(
                            End::Replica(r),
                            End::Owner(o),
                            Frame::RouteAck { owner, version },
                        );
                    }
                    SnapshotOutcome::Corrupt => {
                        self.send(End::Replica(r), End::Owner(o), Frame::SnapshotRequest)
                    }
                    SnapshotOutcome::InProgress | SnapshotOutcome::Stale => {}
                    SnapshotOutcome::OverLimit(l) => panic!("an unbounded table refused: {l:?}"),
                }
            }
            Frame::Digest(entries) => {
                for entry in entries {
                    let replica = self.tables[r].replica(&entry.owner.node);
                    let (incarnation, version, hash) =
                        replica.map_or((0, 0, 0), |r| (r.incarnation, r.version, r.hash));
                    let theirs = (entry.owner.incarnation, entry.version);
                    let behind = (incarnation, version) < theirs;
                    let diverged = (incarnation, version) == theirs && hash != entry.hash;
                    if diverged || (behind && incarnation != entry.owner.incarnation) {
                        self.send(End::Replica(r), End::Owner(o), Frame::SnapshotRequest);
                    } else if behind {
                        let mine = DigestEntry {
                            owner: entry.owner,
                            version,
                            hash,
                        };
                        self.send(End::Replica(r), End::Owner(o), Frame::Digest(vec![mine]));
                    }
                }
            }
            other => panic!("a replica received {other:?} from an owner"),
        }
    }

    /// Applies one operation; returns the replica whose table it may have changed.
    fn step(&mut self, op: &Op) -> Option<usize> {
        let owner = |o: &u8| usize::from(*o) % OWNERS;
        let replica = |r: &u8| usize::from(*r) % REPLICAS;
        let filter = |f: &u8| FILTERS[usize::from(*f) % FILTERS.len()];
        match op {
            Op::Add {
                owner: o,
                filter: f,
            } => self.owners[owner(o)].add(filter(f)),
            Op::Remove {
                owner: o,
                filter: f,
            } => self.owners[owner(o)].remove(filter(f)),
            Op::Flush { owner: o } => self.flush(owner(o)),
            Op::Deliver(i) if !self.wire.is_empty() => {
                let msg = self.wire.remove(usize::from(*i) % self.wire.len());
                return self.deliver(msg);
            }
            Op::Duplicate(i) if !self.wire.is_empty() => {
                let msg = self.wire[usize::from(*i) % self.wire.len()].clone();
                self.wire.push(msg);
            }
            Op::Drop(i) if !self.wire.is_empty() => {
                self.wire.remove(usize::from(*i) % self.wire.len());
            }
            Op::Deliver(_) | Op::Duplicate(_) | Op::Drop(_) => {}
            Op::Digest { owner: o } => {
                for r in 0..REPLICAS {
                    self.digest(owner(o), r);
                }
            }
            Op::Restart { owner: o } => {
                let o = owner(o);
                let incarnation = self.owners[o].owner().incarnation + 1;
                self.owners[o] = self.fresh_log(o, incarnation);
                for r in 0..REPLICAS {
                    self.digest(o, r);
                }
            }
            Op::PeerUp {
                owner: o,
                replica: r,
            } => {
                let (o, r) = (owner(o), replica(r));
                self.owners[o].add_peer(self.replica_nodes[r].clone());
                self.digest(o, r);
            }
            Op::RemovePeer {
                owner: o,
                replica: r,
            } => {
                let (o, r) = (owner(o), replica(r));
                self.owners[o].remove_peer(&self.replica_nodes[r]);
            }
            Op::RequestSnapshot {
                owner: o,
                replica: r,
            } => {
                self.send(
                    End::Replica(replica(r)),
                    End::Owner(owner(o)),
                    Frame::SnapshotRequest,
                );
            }
        }
        None
    }

    /// An owner keeps at most its tombstone budget of changes.
    fn check_owners(&self) {
        for (o, log) in self.owners.iter().enumerate() {
            assert!(
                log.retained_changes() <= self.budget,
                "owner {o} keeps {} changes, over its budget of {}",
                log.retained_changes(),
                self.budget
            );
        }
    }

    /// The invariants of replica tables (see the module docs): of table `only`, or of all.
    fn check_tables(&self, only: Option<usize>) {
        for (r, table) in self.tables.iter().enumerate() {
            if only.is_some_and(|only| only != r) {
                continue;
            }
            for (o, owner) in self.owner_nodes.iter().enumerate() {
                let Some(replica) = table.replica(owner) else {
                    continue;
                };
                let got: BTreeSet<&str> = replica.filters().collect();
                assert_eq!(got.len(), replica.len());
                assert_eq!(
                    replica.hash,
                    set_hash(got.iter().copied()),
                    "replica {r} of owner {o}: the hash is not its set's"
                );
                if replica.incarnation == 0 {
                    assert!(
                        replica.version == 0 && got.is_empty(),
                        "replica {r} of owner {o}: no incarnation yet, but version {} and {got:?}",
                        replica.version
                    );
                    continue;
                }
                let versions = self
                    .history
                    .get(&(o, replica.incarnation))
                    .unwrap_or_else(|| {
                        panic!(
                            "replica {r} of owner {o}: incarnation {} never existed",
                            replica.incarnation
                        )
                    });
                let want = versions.get(&replica.version).unwrap_or_else(|| {
                    panic!(
                        "replica {r} of owner {o}: version {} was never flushed by incarnation {} \
                         (flushed: {:?})",
                        replica.version,
                        replica.incarnation,
                        versions.keys().collect::<Vec<_>>()
                    )
                });
                let want: BTreeSet<&str> = want.iter().map(String::as_str).collect();
                assert_eq!(
                    got, want,
                    "replica {r} of owner {o} (incarnation {}, version {}) holds another set \
                     than the owner had at that version",
                    replica.incarnation, replica.version
                );
            }
            // The trie against the naive matcher over the replicas' sets.
            let mut patterns = BTreeSet::new();
            for (_, replica) in table.replicas() {
                patterns.extend(replica.filters());
            }
            assert_eq!(
                table.patterns(),
                patterns.len(),
                "table {r}: distinct patterns"
            );
            let mut nodes = Vec::new();
            for topic in TOPICS {
                table.nodes_for(topic, &mut nodes);
                let want: Vec<NodeId> = table
                    .replicas()
                    .filter(|(_, rep)| rep.filters().any(|f| matches(f, topic)))
                    .map(|(n, _)| n.clone())
                    .collect();
                assert_eq!(nodes, want, "table {r}: nodes for {topic:?}");
            }
        }
    }

    /// Whether replica `r` holds owner `o`'s live set, at its incarnation, version and hash.
    fn converged(&self, r: usize, o: usize) -> bool {
        let log = &self.owners[o];
        let Some(replica) = self.tables[r].replica(&self.owner_nodes[o]) else {
            return false;
        };
        replica.incarnation == log.owner().incarnation
            && replica.version == log.version()
            && replica.hash == log.hash()
            && replica.filters().collect::<BTreeSet<_>>() == log.live().collect::<BTreeSet<_>>()
    }

    /// The network heals (see the module docs).
    fn heal(&mut self) {
        trace!("heal: {} frame(s) in flight", self.wire.len());
        for o in 0..OWNERS {
            self.flush(o);
        }
        for round in 0..HEAL_ROUNDS {
            for o in 0..OWNERS {
                for r in 0..REPLICAS {
                    self.digest(o, r);
                }
            }
            let mut delivered = 0;
            while !self.wire.is_empty() {
                let msg = self.wire.remove(0);
                self.deliver(msg);
                delivered += 1;
                assert!(
                    delivered <= HEAL_FRAMES,
                    "round {round}: still {} frame(s) in flight after {HEAL_FRAMES}: livelock",
                    self.wire.len()
                );
            }
            self.check_owners();
            self.check_tables(None);
            let all = (0..REPLICAS).all(|r| (0..OWNERS).all(|o| self.converged(r, o)));
            trace!("heal round {round}: {delivered} frame(s), converged: {all}");
            if all {
                return;
            }
        }
        let stuck: Vec<String> = (0..REPLICAS)
            .flat_map(|r| (0..OWNERS).map(move |o| (r, o)))
            .filter(|&(r, o)| !self.converged(r, o))
            .map(|(r, o)| {
                let log = &self.owners[o];
                let rep = self.tables[r].replica(&self.owner_nodes[o]);
                format!(
                    "replica {r} of owner {o}: {:?} vs owner (incarnation {}, version {}, {:?})",
                    rep.map(|x| (
                        x.incarnation,
                        x.version,
                        x.filters().collect::<BTreeSet<_>>()
                    )),
                    log.owner().incarnation,
                    log.version(),
                    log.live().collect::<BTreeSet<_>>()
                )
            })
            .collect();
        panic!("no convergence after {HEAL_ROUNDS} healing rounds: {stuck:#?}");
    }
}

/// The whole check for one input (see the module docs).
pub fn check(data: &[u8]) {
    let Ok(scenario) = Scenario::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let budget = usize::from(scenario.budget % 16) + 1;
    let chunk = usize::from(scenario.chunk % 4) + 1;
    trace!(
        "budget {budget}, {chunk} filter(s) per chunk, {} ops",
        scenario.ops.len()
    );
    let mut world = World::new(budget, chunk);
    for op in &scenario.ops {
        trace!("{op:?}");
        // Only a delivery to a replica changes a table; owners change on most steps.
        if let Some(r) = world.step(op) {
            world.check_tables(Some(r));
        }
        world.check_owners();
    }
    world.heal();
}
