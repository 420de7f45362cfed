//! The route index: applying a batch of 1,000 remote route changes to a table that already
//! holds 1M filters of that owner, and building that table from a snapshot. Run with
//! `cargo bench -p meridian-mqtt-core --bench routes`.

use divan::{Bencher, black_box};
use meridian_core::routes::{NodeId, Owner, RouteLog, RouteTable};

fn main() {
    divan::main();
}

fn owner() -> Owner {
    Owner {
        node: NodeId::new("euc1").expect("valid node id"),
        incarnation: 1,
    }
}

/// An owner with 1M filters `bench/{i}/#`, and a table that installed its snapshot.
fn base() -> (RouteLog, RouteTable) {
    let mut log = RouteLog::new(owner(), 100_000);
    log.add_peer(NodeId::new("ape1").expect("valid node id"));
    for i in 0..1_000_000 {
        log.add(&format!("bench/{i}/#"));
    }
    log.flush();
    let mut table = RouteTable::new(7);
    for chunk in log.snapshot(10_000) {
        table.apply_snapshot_chunk(&chunk);
    }
    (log, table)
}

#[divan::bench(sample_count = 10)]
fn apply_1000_changes_on_1m_filters(bencher: Bencher) {
    let (mut log, mut table) = base();
    let mut round = 0u64;
    bencher
        .with_inputs(|| {
            // Half new filters, half removals of existing ones.
            round += 1;
            for i in 0..500 {
                log.add(&format!("new/{round}/{i}/+"));
                log.remove(&format!("bench/{}/#", round * 500 + i));
            }
            log.flush().expect("changes")
        })
        .bench_local_values(|delta| black_box(table.apply_delta(&delta)));
}

#[divan::bench(sample_count = 3)]
fn install_snapshot_of_1m_filters(bencher: Bencher) {
    let (log, _) = base();
    let chunks = log.snapshot(10_000);
    bencher.bench_local(|| {
        let mut table = RouteTable::new(7);
        for chunk in &chunks {
            table.apply_snapshot_chunk(chunk);
        }
        black_box(table.patterns())
    });
}

#[divan::bench(sample_count = 20)]
fn nodes_for_topic_among_1m_remote_filters(bencher: Bencher) {
    let (_, table) = base();
    let mut out = Vec::new();
    bencher.bench_local(|| {
        table.nodes_for("bench/123456/x", &mut out);
        black_box(out.len())
    });
}
