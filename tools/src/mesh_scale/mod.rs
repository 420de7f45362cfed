//! `meridian sim --scenario mesh-scale`: how far the region mesh scales. Three figures for
//! each mesh size, each measured, none extrapolated:
//!
//! - **Convergence of a burst of route changes, and the link bytes it costs** ([`simulate`]):
//!   every node a real [`Broker`](meridian_core::Broker) in the deterministic simulator, on ten regions with
//!   realistic round trips; one client per node subscribes a base of filters, then bursts of
//!   new ones. Virtual time from the burst until every node's replica of every route set is at
//!   its owner's version and hash; the route frames' encoded bytes
//!   ([`meridian_core::link::encoded_len`]) per route change. Each size runs at two base sizes
//!   to show that neither figure depends on how many filters the nodes already hold.
//! - **Memory per replicated filter** ([`measure_memory`]): one real broker is fed, through
//!   the link codec and [`Input::PeerFrame`](meridian_core::Input::PeerFrame), snapshots of every other node's share of the
//!   whole deployment's filters (10 million by default), as a node joining the mesh would be;
//!   its resident memory (`/proc/self/statm`) before and after. The same broker then applies a
//!   burst of deltas from every owner and answers route lookups, timed by the wall clock. The
//!   command runs each of these in a fresh process of its own, so that memory freed by one
//!   measurement cannot hide the cost of the next.
//!
//! The scenario name takes options after colons, e.g.
//! `mesh-scale:nodes=10,25,50:filters=10M:base=100,1000:burst=1,1000` (see [`MeshScale`]);
//! `mesh-scale-memory:nodes=50` runs the memory measurement alone.

mod memory;
mod report;
mod simulate;

use std::path::PathBuf;

use anyhow::{Context, bail, ensure};
use meridian_core::topic::TopicFilter;

use memory::measure_memory_in_process;
pub use memory::{MemoryRow, measure_memory};
pub use report::{report_rows, write_report};
pub use simulate::{BurstRow, simulate};

/// The simulated deployment's regions: (name, the prefix of its nodes' names).
pub const REGIONS: [(&str, &str); 10] = [
    ("eu-central", "fra"),
    ("eu-west", "lon"),
    ("us-east", "iad"),
    ("us-west", "sfo"),
    ("sa-east", "gru"),
    ("af-south", "cpt"),
    ("ap-south", "bom"),
    ("ap-southeast", "sin"),
    ("ap-east", "hkg"),
    ("au-east", "syd"),
];

/// Round trips between the regions, in milliseconds, in the order of [`REGIONS`]: rounded
/// public figures between those cities (Frankfurt–Cape Town 160 ms, Frankfurt–Hong Kong 200 ms
/// and Hong Kong–Cape Town 320 ms as in the geo-writeup scenario).
pub const RTT_MS: [[u64; 10]; 10] = [
    [0, 15, 90, 150, 200, 160, 120, 160, 200, 280],
    [15, 0, 75, 140, 190, 150, 115, 170, 200, 270],
    [90, 75, 0, 65, 120, 230, 200, 220, 200, 200],
    [150, 140, 65, 0, 180, 290, 230, 170, 150, 140],
    [200, 190, 120, 180, 0, 330, 310, 330, 310, 310],
    [160, 150, 230, 290, 330, 0, 220, 270, 320, 290],
    [120, 115, 200, 230, 310, 220, 0, 60, 90, 150],
    [160, 170, 220, 170, 330, 270, 60, 0, 35, 95],
    [200, 200, 200, 150, 310, 320, 90, 35, 0, 120],
    [280, 270, 200, 140, 310, 290, 150, 95, 120, 0],
];

/// Round trip between two nodes of one region.
pub const SAME_REGION_RTT_MS: u64 = 2;

/// Round trip between a client and its node.
pub const CLIENT_RTT_MS: u64 = 2;

/// Digits the filter number `%i` is padded to, so that every filter of a run has one length.
const FILTER_NUMBER_DIGITS: usize = 7;

/// What to measure; the scenario name's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshScale {
    /// Mesh sizes (`nodes=10,25,50`); node `i` is in region `i % 10`.
    pub nodes: Vec<usize>,
    /// Filters in the whole deployment for the memory measurement (`filters=10M`), shared
    /// evenly by the nodes.
    pub filters: u64,
    /// Filters each node subscribes before the bursts, in the simulator (`base=100,1000`).
    pub base: Vec<usize>,
    /// New filters each node subscribes at once in each burst (`burst=1,1000`); the memory
    /// measurement applies deltas of the largest from every owner.
    pub burst: Vec<usize>,
    /// The filter pattern; `%i` is a number unique in the deployment (`filter=...`).
    pub filter: String,
    /// Where the memory is measured (`memory=process|here|off`).
    pub memory: MemoryMode,
    /// Measure only the memory (`mesh-scale-memory`).
    pub memory_only: bool,
}

/// Where [`measure_memory`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryMode {
    /// Each measurement in a fresh process of this executable (`meridian sim --scenario
    /// mesh-scale-memory:...`): `memory=process`, the default of the command.
    Process(PathBuf),
    /// In this process, one after another (`memory=here`): memory freed by one measurement
    /// may be reused by the next, which then reads lower.
    Here,
    /// Not measured (`memory=off`).
    Off,
}

impl Default for MeshScale {
    fn default() -> Self {
        Self {
            nodes: vec![10, 25, 50],
            filters: 10_000_000,
            base: vec![100, 1_000],
            burst: vec![1, 1_000],
            filter: "devices/%i/+/state".to_owned(),
            memory: MemoryMode::Here,
            memory_only: false,
        }
    }
}

impl MeshScale {
    /// The options in a scenario name (`mesh-scale[:key=value]...` or
    /// `mesh-scale-memory[:key=value]...`); `None` for another scenario. `exe` is what
    /// `memory=process` runs.
    pub fn parse(scenario: &str, exe: Option<PathBuf>) -> anyhow::Result<Option<Self>> {
        let mut parts = scenario.split(':');
        let mut options = Self::default();
        match parts.next() {
            Some("mesh-scale") => {}
            Some("mesh-scale-memory") => options.memory_only = true,
            _ => return Ok(None),
        }
        options.memory = match exe {
            Some(exe) if !options.memory_only => MemoryMode::Process(exe),
            _ => MemoryMode::Here,
        };
        for part in parts {
            let (key, value) = part
                .split_once('=')
                .with_context(|| format!("{part:?}: expected key=value"))?;
            let list = || -> anyhow::Result<Vec<usize>> {
                value
                    .split(',')
                    .map(|v| {
                        let n = number(v)?;
                        usize::try_from(n).with_context(|| format!("{v:?}: too large"))
                    })
                    .collect()
            };
            match key {
                "nodes" => options.nodes = list()?,
                "filters" => options.filters = number(value)?,
                "base" => options.base = list()?,
                "burst" => options.burst = list()?,
                "filter" => options.filter = value.to_owned(),
                "memory" => {
                    options.memory = match (value, &options.memory) {
                        ("off", _) => MemoryMode::Off,
                        ("here", _) => MemoryMode::Here,
                        ("process", MemoryMode::Process(_)) => options.memory.clone(),
                        ("process", _) => MemoryMode::Here,
                        _ => bail!("memory={value}: expected process, here or off"),
                    }
                }
                _ => bail!(
                    "unknown option {key:?} (known: nodes, filters, base, burst, filter, memory)"
                ),
            }
        }
        options.check()?;
        Ok(Some(options))
    }

    fn check(&self) -> anyhow::Result<()> {
        ensure!(!self.nodes.is_empty(), "nodes: none given");
        for &n in &self.nodes {
            ensure!((2..=1_000).contains(&n), "nodes={n}: between 2 and 1000");
            ensure!(
                self.filters >= n as u64,
                "filters={}: fewer than the {n} nodes",
                self.filters
            );
        }
        ensure!(
            !self.burst.is_empty() && self.burst.iter().all(|&b| b > 0),
            "burst: at least one, each 1 or more"
        );
        ensure!(!self.base.is_empty(), "base: none given");
        ensure!(
            self.filter.matches("%i").count() == 1,
            "filter={}: needs %i exactly once",
            self.filter
        );
        let filter = TopicFilter::new(filter_name(&self.filter, 0))
            .map_err(|e| anyhow::anyhow!("filter={}: {e}", self.filter))?;
        ensure!(
            filter.shared_group().is_none(),
            "filter={}: a shared subscription's route is its pattern; give that",
            self.filter
        );
        Ok(())
    }

    /// The option string that asks for the same measurement (for `memory=process`).
    fn memory_scenario(&self, nodes: usize) -> String {
        format!(
            "mesh-scale-memory:nodes={nodes}:filters={}:burst={}:filter={}",
            self.filters,
            self.largest_burst(),
            self.filter
        )
    }

    fn largest_burst(&self) -> usize {
        self.burst.iter().copied().max().unwrap_or(1)
    }
}

/// `123`, `100k` or `10M`.
fn number(v: &str) -> anyhow::Result<u64> {
    let (digits, times) = match v.strip_suffix(['k', 'K']) {
        Some(d) => (d, 1_000),
        None => match v.strip_suffix(['m', 'M']) {
            Some(d) => (d, 1_000_000),
            None => (v, 1),
        },
    };
    let n: u64 = digits
        .parse()
        .with_context(|| format!("{v:?}: not a number"))?;
    n.checked_mul(times)
        .with_context(|| format!("{v:?}: too large"))
}

/// Filter `number` of the deployment.
fn filter_name(template: &str, number: u64) -> String {
    template.replacen(
        "%i",
        &format!("{number:0width$}", width = FILTER_NUMBER_DIGITS),
        1,
    )
}

/// A topic that `filter` matches ('+' levels and a trailing '#' become `x`).
fn topic_for(filter: &str) -> String {
    filter
        .split('/')
        .map(|level| {
            if level == "+" || level == "#" {
                "x"
            } else {
                level
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The nodes of a mesh of `nodes`: (name, region index); node `i` is in region `i % 10`.
pub fn layout(nodes: usize) -> Vec<(String, usize)> {
    (0..nodes)
        .map(|i| {
            let region = i % REGIONS.len();
            (
                format!("{}-{}", REGIONS[region].1, i / REGIONS.len() + 1),
                region,
            )
        })
        .collect()
}

fn rtt_ms(a: usize, b: usize) -> u64 {
    if a == b {
        SAME_REGION_RTT_MS
    } else {
        RTT_MS[a][b]
    }
}

/// Everything measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MeshScaleReport {
    /// One row per mesh size, base size and burst.
    pub bursts: Vec<BurstRow>,
    /// One row per mesh size (none with `memory=off`).
    pub memory: Vec<MemoryRow>,
}

/// Measure what `options` asks for. The memory measurements come first, so that with
/// [`MemoryMode::Here`] the simulations' freed memory cannot hide their cost.
pub fn run(options: &MeshScale, seed: u64) -> anyhow::Result<MeshScaleReport> {
    let mut report = MeshScaleReport::default();
    for &nodes in &options.nodes {
        let row = match &options.memory {
            MemoryMode::Off => continue,
            MemoryMode::Here => measure_memory(
                seed,
                nodes,
                options.filters,
                options.largest_burst(),
                &options.filter,
            )?,
            MemoryMode::Process(exe) => measure_memory_in_process(exe, options, seed, nodes)?,
        };
        report.memory.push(row);
    }
    if options.memory_only {
        return Ok(report);
    }
    for &nodes in &options.nodes {
        for &base in &options.base {
            report.bursts.extend(simulate(
                seed,
                nodes,
                base,
                &options.burst,
                &options.filter,
            )?);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rtt_matrix_is_symmetric_with_a_zero_diagonal() {
        for (i, row) in RTT_MS.iter().enumerate() {
            for (j, &rtt) in row.iter().enumerate() {
                assert_eq!(rtt, RTT_MS[j][i], "{i} {j}");
                assert_eq!(rtt == 0, i == j, "{i} {j}");
            }
        }
    }

    #[test]
    fn options_parse_from_the_scenario_name() {
        assert_eq!(MeshScale::parse("geo-writeup", None).unwrap(), None);
        let exe = PathBuf::from("meridian");
        let o = MeshScale::parse("mesh-scale", Some(exe.clone()))
            .unwrap()
            .unwrap();
        assert_eq!(o.nodes, vec![10, 25, 50]);
        assert_eq!(o.memory, MemoryMode::Process(exe.clone()));
        let o = MeshScale::parse(
            "mesh-scale:nodes=3,4:filters=20k:base=5:burst=2,10:memory=off:filter=a/%i/#",
            Some(exe.clone()),
        )
        .unwrap()
        .unwrap();
        assert_eq!(o.nodes, vec![3, 4]);
        assert_eq!(o.filters, 20_000);
        assert_eq!(o.burst, vec![2, 10]);
        assert_eq!(o.memory, MemoryMode::Off);
        assert_eq!(filter_name(&o.filter, 42), "a/0000042/#");
        assert_eq!(topic_for("a/0000042/+/#"), "a/0000042/x/x");
        let o = MeshScale::parse("mesh-scale-memory:nodes=50:filters=10M", Some(exe))
            .unwrap()
            .unwrap();
        assert!(o.memory_only);
        assert_eq!(
            o.memory,
            MemoryMode::Here,
            "a memory-only run measures itself"
        );
        assert_eq!(o.filters, 10_000_000);
        for bad in [
            "mesh-scale:nodes=1",
            "mesh-scale:filter=a/b",
            "mesh-scale:burst=0",
            "mesh-scale:colour=red",
            "mesh-scale:nodes",
            "mesh-scale:filters=lots",
            "mesh-scale:filter=$share/g/a/%i",
        ] {
            assert!(MeshScale::parse(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn layout_spreads_nodes_over_the_regions() {
        let l = layout(12);
        assert_eq!(l[0], ("fra-1".to_owned(), 0));
        assert_eq!(l[9], ("syd-1".to_owned(), 9));
        assert_eq!(l[10], ("fra-2".to_owned(), 0));
    }
}
