//! Topic matching benchmarks: `cargo bench -p meridian-mqtt-core --bench topic`.
//!
//! The subscription trie holds 1M filters `bench/{i}/#` plus 10k filters `+/x{i}` (values are
//! `u32` subscription ids); the retained tree holds 100k topics `dev/{i}/temp`. Memory per
//! filter is printed before the timings.

use std::hint::black_box;
use std::sync::LazyLock;

use divan::Bencher;
use divan::counter::ItemsCount;
use meridian_core::topic::{FilterTrie, TopicTree};

#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

const FILTERS: u32 = 1_000_000;
const PLUS_FILTERS: u32 = 10_000;
const RETAINED: u32 = 100_000;

fn build_trie() -> FilterTrie<u32> {
    let mut trie = FilterTrie::new(0x6d65_7269_6469_616e);
    for i in 0..FILTERS {
        trie.insert(&format!("bench/{i}/#"), i);
    }
    for i in 0..PLUS_FILTERS {
        trie.insert(&format!("+/x{i}"), FILTERS + i);
    }
    trie
}

static TRIE: LazyLock<FilterTrie<u32>> = LazyLock::new(build_trie);

static TREE: LazyLock<TopicTree<u32>> = LazyLock::new(|| {
    let mut tree = TopicTree::new(1);
    for i in 0..RETAINED {
        tree.insert(&format!("dev/{i}/temp"), i);
    }
    tree
});

/// SplitMix64: deterministic random inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn count_matches(topic: &str) -> usize {
    let mut n = 0;
    TRIE.for_each_match(topic, |v| {
        black_box(v);
        n += 1;
    });
    n
}

/// Resident set size in bytes (Linux only; 0 elsewhere).
fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn main() {
    let rss_before = rss_bytes();
    let trie = &*TRIE;
    let rss_after = rss_bytes();
    let n = trie.len();
    eprintln!(
        "FilterTrie: {n} filters, heap estimate {:.1} B/filter, RSS growth {:.1} B/filter",
        trie.heap_bytes_estimate() as f64 / n as f64,
        rss_after.saturating_sub(rss_before) as f64 / n as f64,
    );
    eprintln!(
        "matches: hit {}, miss {}",
        count_matches("bench/123456/test"),
        count_matches("nope/1/2")
    );
    divan::main();
}

/// Building the whole trie (1.01M filters) from empty.
#[divan::bench(sample_count = 3, sample_size = 1)]
fn build(bencher: Bencher) {
    bencher
        .counter(ItemsCount::new(FILTERS + PLUS_FILTERS))
        .bench_local(build_trie);
}

#[divan::bench(sample_size = 1000)]
fn match_hit(bencher: Bencher) {
    LazyLock::force(&TRIE);
    bencher.bench(|| count_matches(black_box("bench/123456/test")));
}

#[divan::bench(sample_size = 100)]
fn match_random(bencher: Bencher) {
    LazyLock::force(&TRIE);
    let mut rng = Rng(42);
    bencher
        .with_inputs(|| format!("bench/{}/t", rng.next() % u64::from(FILTERS)))
        .bench_local_refs(|topic| count_matches(topic));
}

#[divan::bench(sample_size = 1000)]
fn match_miss(bencher: Bencher) {
    LazyLock::force(&TRIE);
    bencher.bench(|| count_matches(black_box("nope/1/2")));
}

/// Subscribe then unsubscribe one filter next to the 1M others.
#[divan::bench]
fn subscribe_unsubscribe(bencher: Bencher) {
    let mut trie = build_trie();
    let mut rng = Rng(7);
    bencher
        .with_inputs(|| format!("bench/{}/new/#", rng.next() % u64::from(FILTERS)))
        .bench_local_refs(|filter| {
            trie.insert(filter, 0);
            trie.remove(filter)
        });
}

/// Retained: one literal lookup among 100k topics.
#[divan::bench(sample_size = 1000)]
fn retained_exact(bencher: Bencher) {
    LazyLock::force(&TREE);
    bencher.bench(|| {
        let mut n = 0;
        TREE.for_each_match(black_box("dev/4242/temp"), |_| n += 1);
        n
    });
}

/// Retained: "dev/+/temp" visits all 100k topics.
#[divan::bench(sample_count = 20)]
fn retained_plus_100k(bencher: Bencher) {
    LazyLock::force(&TREE);
    bencher.counter(ItemsCount::new(RETAINED)).bench(|| {
        let mut n = 0;
        TREE.for_each_match(black_box("dev/+/temp"), |_| n += 1);
        n
    });
}
