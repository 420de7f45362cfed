//! Properties of the replicated route index: replicas converge to the owner's route set
//! whatever the network does to deltas (duplicates, reordering, loss), using only the repair
//! steps the protocol has (ask for the changes after a version, ask for a snapshot, compare
//! digests); snapshots commute, are idempotent and equal the deltas they summarise.

use std::collections::BTreeSet;

use meridian_core::routes::{
    DeltaOutcome, NodeId, Owner, ReplicaLimits, RouteDelta, RouteLog, RouteTable, SnapshotChunk,
    SnapshotOutcome, set_hash,
};
use meridian_core::topic::matches;
use proptest::prelude::*;

const FILTERS: &[&str] = &[
    "a/b",
    "a/+",
    "a/#",
    "#",
    "+/b",
    "$SYS/#",
    "c",
    "c/d/e",
    "$share/g/x",
];
const TOPICS: &[&str] = &["a/b", "a/c", "c", "c/d/e", "$SYS/x", "z"];

#[derive(Debug, Clone)]
enum Op {
    Add(usize),
    Remove(usize),
    Flush,
    /// Deliver the in-flight message at this position (mod length): reordering.
    Deliver(usize),
    Duplicate(usize),
    Lose(usize),
    /// A periodic digest exchange (anti-entropy) happens now.
    Digest,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..FILTERS.len()).prop_map(Op::Add),
        3 => (0..FILTERS.len()).prop_map(Op::Remove),
        3 => Just(Op::Flush),
        6 => any::<usize>().prop_map(Op::Deliver),
        1 => any::<usize>().prop_map(Op::Duplicate),
        2 => any::<usize>().prop_map(Op::Lose),
        1 => Just(Op::Digest),
    ]
}

#[derive(Debug, Clone)]
enum Msg {
    Delta(RouteDelta),
    Chunk(SnapshotChunk),
}

fn node(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

struct Net {
    owner: RouteLog,
    table: RouteTable,
    wire: Vec<Msg>,
    replica_node: NodeId,
}

impl Net {
    fn new(incarnation: u64, budget: usize) -> Self {
        let mut owner = RouteLog::new(
            Owner {
                node: node("owner"),
                incarnation,
            },
            budget,
        );
        owner.add_peer(node("replica"));
        Self {
            owner,
            table: RouteTable::new(7),
            wire: Vec::new(),
            replica_node: node("replica"),
        }
    }

    /// What the owner sends when the replica says it is at `after`.
    fn catch_up(&mut self, after: u64) {
        match self.owner.delta_since(after) {
            Some(d) if !d.changes.is_empty() || d.to() == self.owner.version() => {
                self.wire.push(Msg::Delta(d))
            }
            _ => self
                .wire
                .extend(self.owner.snapshot(2).into_iter().map(Msg::Chunk)),
        }
    }

    fn deliver(&mut self, msg: Msg) {
        match msg {
            Msg::Delta(d) => match self.table.apply_delta(&d) {
                DeltaOutcome::Applied { version } => self.owner.ack(&self.replica_node, version),
                DeltaOutcome::Gap { after } => self.catch_up(after),
                DeltaOutcome::NeedSnapshot => self
                    .wire
                    .extend(self.owner.snapshot(2).into_iter().map(Msg::Chunk)),
                DeltaOutcome::Duplicate | DeltaOutcome::Stale => {}
                DeltaOutcome::OverLimit(l) => panic!("an unbounded table refused a delta: {l:?}"),
            },
            Msg::Chunk(c) => match self.table.apply_snapshot_chunk(&c) {
                SnapshotOutcome::Installed { version } => {
                    self.owner.ack(&self.replica_node, version)
                }
                SnapshotOutcome::Corrupt => self
                    .wire
                    .extend(self.owner.snapshot(2).into_iter().map(Msg::Chunk)),
                SnapshotOutcome::InProgress | SnapshotOutcome::Stale => {}
                SnapshotOutcome::OverLimit(l) => {
                    panic!("an unbounded table refused a chunk: {l:?}")
                }
            },
        }
    }

    /// Digest: the owner announces (version, hash); a replica that differs asks to catch up.
    fn digest(&mut self) {
        let owner = self.owner.owner().node.clone();
        let (version, hash) = self
            .table
            .replica(&owner)
            .map_or((0, 0), |r| (r.version, r.hash));
        if version != self.owner.version() || hash != self.owner.hash() {
            if hash
                != set_hash(
                    self.table
                        .replica(&owner)
                        .into_iter()
                        .flat_map(|r| r.filters()),
                )
            {
                self.wire
                    .extend(self.owner.snapshot(2).into_iter().map(Msg::Chunk));
            } else {
                self.catch_up(version);
            }
        }
    }

    fn run(&mut self, ops: &[Op]) {
        for op in ops {
            match *op {
                Op::Add(f) => self.owner.add(FILTERS[f]),
                Op::Remove(f) => self.owner.remove(FILTERS[f]),
                Op::Flush => {
                    if let Some(d) = self.owner.flush() {
                        self.wire.push(Msg::Delta(d));
                    }
                }
                Op::Deliver(i) if !self.wire.is_empty() => {
                    let msg = self.wire.remove(i % self.wire.len());
                    self.deliver(msg);
                }
                Op::Duplicate(i) if !self.wire.is_empty() => {
                    let msg = self.wire[i % self.wire.len()].clone();
                    self.wire.push(msg);
                }
                Op::Lose(i) if !self.wire.is_empty() => {
                    self.wire.remove(i % self.wire.len());
                }
                Op::Digest => self.digest(),
                _ => {}
            }
        }
    }

    /// The network heals: everything in flight arrives in order, then digests run until quiet.
    fn quiesce(&mut self) -> Result<(), TestCaseError> {
        if let Some(d) = self.owner.flush() {
            self.wire.push(Msg::Delta(d));
        }
        for _round in 0..100 {
            while !self.wire.is_empty() {
                let msg = self.wire.remove(0);
                self.deliver(msg);
            }
            self.digest();
            if self.wire.is_empty() {
                return Ok(());
            }
        }
        Err(TestCaseError::fail(
            "no convergence after 100 digest rounds",
        ))
    }

    fn check_converged(&self) -> Result<(), TestCaseError> {
        let owner = &self.owner.owner().node;
        let replica = self.table.replica(owner);
        let got: BTreeSet<&str> = replica.into_iter().flat_map(|r| r.filters()).collect();
        let want: BTreeSet<&str> = self.owner.live().collect();
        prop_assert_eq!(&got, &want);
        prop_assert_eq!(replica.map_or(0, |r| r.version), self.owner.version());
        let mut nodes = Vec::new();
        for topic in TOPICS {
            self.table.nodes_for(topic, &mut nodes);
            let expect = want.iter().any(|f| matches(f, topic));
            prop_assert_eq!(!nodes.is_empty(), expect, "topic {}", topic);
        }
        Ok(())
    }
}

proptest! {
    #[test]
    fn replica_converges_under_duplicated_reordered_and_lost_deltas(
        ops in proptest::collection::vec(op(), 0..120),
        budget in 1usize..20,
    ) {
        let mut net = Net::new(1, budget);
        net.run(&ops);
        net.quiesce()?;
        net.check_converged()?;
    }

    #[test]
    fn tombstones_are_dropped_once_acknowledged(ops in proptest::collection::vec(op(), 0..120)) {
        let mut net = Net::new(1, 10_000);
        net.run(&ops);
        net.quiesce()?;
        net.check_converged()?;
        prop_assert_eq!(net.owner.retained_changes(), 0, "the only peer acknowledged everything");
    }

    #[test]
    fn a_new_incarnation_replaces_the_old_routes(
        before in proptest::collection::vec(op(), 0..60),
        after in proptest::collection::vec(op(), 0..60),
    ) {
        let mut old = Net::new(1, 8);
        old.run(&before);
        old.quiesce()?;
        // The owner restarts with nothing: a new incarnation, the same replica table.
        let stale: Vec<Msg> = old.owner.snapshot(3).into_iter().map(Msg::Chunk).collect();
        let mut net = Net::new(2, 8);
        net.table = old.table;
        net.run(&after);
        // Messages of the old incarnation still arrive late.
        net.wire.extend(stale);
        net.quiesce()?;
        net.check_converged()?;
    }

    #[test]
    fn snapshots_commute_are_idempotent_and_equal_the_deltas(
        ops in proptest::collection::vec((0..FILTERS.len(), any::<bool>(), any::<bool>()), 1..60),
        order in Just(vec![0usize, 1, 2]).prop_shuffle(),
    ) {
        let mut owner = RouteLog::new(Owner { node: node("o"), incarnation: 1 }, 1_000);
        owner.add_peer(node("r"));
        let mut deltas = Vec::new();
        let mut snapshots = Vec::new();
        for (i, (f, add, flush)) in ops.iter().enumerate() {
            if *add { owner.add(FILTERS[*f]) } else { owner.remove(FILTERS[*f]) }
            if *flush || i + 1 == ops.len() {
                if let Some(d) = owner.flush() { deltas.push(d); }
                snapshots.push(owner.snapshot(2));
            }
        }
        // Deltas alone.
        let mut by_deltas = RouteTable::new(1);
        for d in &deltas { by_deltas.apply_delta(d); }
        let want: BTreeSet<&str> = owner.live().collect();
        let got: BTreeSet<&str> = by_deltas.replica(&node("o")).into_iter().flat_map(|r| r.filters()).collect();
        prop_assert_eq!(&got, &want);

        // Three snapshots, applied in any order and twice: the latest wins (commutative,
        // associative, idempotent).
        let picks = [0, snapshots.len() / 2, snapshots.len() - 1];
        let mut merged = RouteTable::new(2);
        for &k in order.iter().chain(order.iter()) {
            for chunk in &snapshots[picks[k]] { merged.apply_snapshot_chunk(chunk); }
        }
        let latest = &snapshots[picks[2]][0];
        let r = merged.replica(&node("o")).unwrap();
        prop_assert_eq!(r.version, latest.version);
        let got: BTreeSet<&str> = r.filters().collect();
        prop_assert_eq!(&got, &want);

        // A snapshot at some version plus the deltas after it = the deltas alone.
        let mid = &snapshots[picks[1]];
        let mut mixed = RouteTable::new(3);
        for chunk in mid { mixed.apply_snapshot_chunk(chunk); }
        for d in &deltas { mixed.apply_delta(d); }
        let got: BTreeSet<&str> = mixed.replica(&node("o")).into_iter().flat_map(|r| r.filters()).collect();
        prop_assert_eq!(&got, &want);
    }

    #[test]
    fn a_bounded_replica_never_holds_more_and_a_refusal_changes_nothing(
        ops in proptest::collection::vec((0..FILTERS.len(), any::<bool>(), any::<bool>()), 1..80),
        max_filters in 0usize..6,
        chunk in 1usize..4,
    ) {
        let mut owner = RouteLog::new(Owner { node: node("o"), incarnation: 1 }, 1_000);
        let limits = ReplicaLimits { max_filters, ..ReplicaLimits::UNBOUNDED };
        let mut table = RouteTable::new(1).with_limits(limits);
        let held = |t: &RouteTable| -> (BTreeSet<String>, u64) {
            t.replica(&node("o")).map_or((BTreeSet::new(), 0), |r| {
                (r.filters().map(str::to_owned).collect(), r.version)
            })
        };
        for (f, add, snapshot) in ops {
            if add { owner.add(FILTERS[f]) } else { owner.remove(FILTERS[f]) }
            let Some(delta) = owner.flush() else { continue };
            let before = held(&table);
            let refused = if snapshot {
                owner.snapshot(chunk).iter().any(|c| {
                    matches!(table.apply_snapshot_chunk(c), SnapshotOutcome::OverLimit(_))
                })
            } else {
                matches!(table.apply_delta(&delta), DeltaOutcome::OverLimit(_))
            };
            let after = held(&table);
            prop_assert!(after.0.len() <= max_filters, "{} filters held", after.0.len());
            if refused {
                prop_assert_eq!(&after, &before, "a refusal changed the replica");
                prop_assert!(owner.live().count() > max_filters, "refused within the bound");
            }
        }
    }

    #[test]
    fn a_split_delta_does_what_the_whole_does_in_bounded_pieces(
        ops in proptest::collection::vec((0..FILTERS.len(), any::<bool>()), 1..60),
        max_changes in 1usize..5,
        max_bytes in 1usize..20,
    ) {
        let mut owner = RouteLog::new(Owner { node: node("o"), incarnation: 1 }, 1_000);
        let mut whole = RouteTable::new(1);
        let mut pieces = RouteTable::new(2);
        for (f, add) in ops {
            if add { owner.add(FILTERS[f]) } else { owner.remove(FILTERS[f]) }
            let Some(delta) = owner.flush() else { continue };
            let parts = delta.clone().split(max_changes, max_bytes);
            prop_assert_eq!(parts.first().map(|p| p.after), Some(delta.after));
            prop_assert_eq!(parts.last().map(RouteDelta::to), Some(delta.to()));
            for part in &parts {
                prop_assert!(!part.changes.is_empty() && part.changes.len() <= max_changes);
                let bytes: usize = part.changes.iter().map(|c| c.filter.len()).sum();
                let last = part.changes.last().map_or(0, |c| c.filter.len());
                prop_assert!(bytes < max_bytes + last, "{} bytes in a piece", bytes);
                let outcome = pieces.apply_delta(part);
                prop_assert!(matches!(outcome, DeltaOutcome::Applied { .. }), "{:?}", outcome);
            }
            whole.apply_delta(&delta);
            prop_assert_eq!(
                pieces.replica(&node("o")).map(|r| r.position()),
                whole.replica(&node("o")).map(|r| r.position())
            );
        }
    }
}
