//! One real broker holding its replicas of a whole deployment's filters: resident memory,
//! install and apply time, lookups.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use bytes::BytesMut;
use meridian_core::broker::ClusterConfig;
use meridian_core::link::{self, Frame, FrameKind, LINK_PROTOCOL_VERSION};
use meridian_core::routes::{
    NodeId, Owner, RouteChange, RouteDelta, RouteLog, RouteOp, SnapshotChunk, filter_hash,
};
use meridian_core::sim::Rng;
use meridian_core::{Broker, Config, Input, Output, Timestamp};
use serde::{Deserialize, Serialize};

use super::{MeshScale, REGIONS, filter_name, layout, topic_for};

/// Virtual time of the run start (the simulator's clock) used by the memory measurement.
const MEMORY_NOW: Timestamp = Timestamp(1_000_000);

/// One node's replicated route index at full size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryRow {
    /// Nodes in the mesh.
    pub nodes: usize,
    /// Filters in the whole deployment.
    pub deployment_filters: u64,
    /// Other nodes whose route sets this node replicates.
    pub owners: usize,
    /// Filters of each owner (`deployment_filters / nodes`).
    pub filters_per_owner: u64,
    /// Filters in this node's replicas (`owners × filters_per_owner`).
    pub filters_held: u64,
    /// Resident memory of the process before the snapshots arrived, and after they were
    /// installed (`None` where `/proc/self/statm` cannot be read).
    pub rss_before_bytes: Option<u64>,
    /// See `rss_before_bytes`.
    pub rss_after_bytes: Option<u64>,
    /// `(rss_after - rss_before) / filters_held`.
    pub bytes_per_filter: Option<f64>,
    /// The most resident memory the process had by the end of the installation (the
    /// transient cost of a joining node: a snapshot is assembled whole before it is
    /// installed, and every filter installed is handed to the shell to persist).
    pub rss_peak_bytes: Option<u64>,
    /// Snapshot-chunk frames received, and their encoded bytes: what a node joining the mesh
    /// downloads.
    pub snapshot_frames: u64,
    /// See `snapshot_frames`.
    pub snapshot_bytes: u64,
    /// Wall-clock time this node spent decoding and installing every snapshot (one core).
    pub install_ms: u64,
    /// Route changes then applied as one delta per owner (`owners × burst`).
    pub applied_changes: u64,
    /// Wall-clock time per change to decode and apply those deltas (persist records made and
    /// acknowledgements sent included), on the full index.
    pub apply_us_per_change: f64,
    /// One owner's whole route set as it broadcasts it after a restart (its subscriptions
    /// restored, every filter added again in one batch, sent as deltas of bounded size),
    /// encoded: made by a [`RouteLog`] after the memory was read. Bytes of every frame.
    pub restart_delta_bytes: u64,
    /// How many frames those deltas are.
    pub restart_delta_frames: u64,
    /// The largest of them, encoded.
    pub restart_largest_frame_bytes: u64,
    /// The largest frame a node accepts ([`link::DEFAULT_MAX_FRAME_LEN`], length prefix
    /// excluded); a larger delta is refused and ends the session.
    pub max_frame_bytes: u64,
    /// Route lookups timed ("which nodes want this topic", each matching one filter).
    pub lookups: u64,
    /// Wall-clock time per lookup.
    pub lookup_ns: f64,
}

/// The most resident memory this process had so far, in bytes (Linux).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resident memory of this process, in bytes (Linux).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * rustix::param::page_size() as u64)
}

/// Decode one whole frame from `wire` (which holds exactly one).
fn decode(wire: &mut BytesMut) -> anyhow::Result<Frame> {
    link::decode(wire, link::DEFAULT_MAX_FRAME_LEN)
        .context("decoding a link frame")?
        .context("a link frame cut short")
}

/// Drain the broker's outputs; returns the route acknowledgements among them.
fn drain(broker: &mut Broker) -> u64 {
    let mut acks = 0;
    while let Some(out) = broker.poll_output() {
        if let Output::ToPeer { frame, .. } = out
            && frame.kind() == FrameKind::RouteAck
        {
            acks += 1;
        }
    }
    acks
}

/// Feed one real broker snapshots of the route sets of the other `nodes - 1` nodes of a mesh
/// of `nodes` sharing `deployment_filters`, through the link codec, and measure its resident
/// memory before and after; then apply one delta of `burst` new filters from every owner and
/// time lookups. Each owner's snapshot is made one chunk at a time, as
/// [`meridian_core::routes::RouteLog::snapshot`] would send it, so that only the receiving
/// node's memory grows.
pub fn measure_memory(
    seed: u64,
    nodes: usize,
    deployment_filters: u64,
    burst: usize,
    template: &str,
) -> anyhow::Result<MemoryRow> {
    let layout = layout(nodes);
    let per_owner = deployment_filters / nodes as u64;
    let (me, my_region) = &layout[0];
    let cluster = ClusterConfig::new(
        NodeId::new(me).context("node id")?,
        1,
        REGIONS[*my_region].0,
    );
    let chunk_filters = cluster.snapshot_chunk_filters;
    let config = Config {
        seed,
        ..Config::default()
    };
    let mut broker = Broker::new(config, MEMORY_NOW);
    broker.enable_cluster(MEMORY_NOW, cluster.clone());
    let feed = |broker: &mut Broker, peer: &NodeId, wire: &mut BytesMut| -> anyhow::Result<u64> {
        let frame = decode(wire)?;
        broker.handle_input(
            MEMORY_NOW,
            Input::PeerFrame {
                peer: peer.clone(),
                frame: Box::new(frame),
            },
        );
        Ok(drain(broker))
    };

    let rss_before = rss_bytes();
    let mut install = Duration::ZERO;
    let (mut snapshot_frames, mut snapshot_bytes, mut installed) = (0, 0, 0);
    let mut owners = Vec::new();
    let mut wire = BytesMut::new();
    for (k, (name, region)) in layout.iter().enumerate().skip(1) {
        let peer = NodeId::new(name).context("node id")?;
        broker.handle_input(MEMORY_NOW, Input::PeerUp { peer: peer.clone() });
        drain(&mut broker);
        let hello = Frame::Hello {
            node: peer.clone(),
            incarnation: 1,
            protocol: LINK_PROTOCOL_VERSION,
            region: REGIONS[*region].0.to_owned(),
            certificate: None,
        };
        link::encode(&hello, &mut wire).context("encoding hello")?;
        feed(&mut broker, &peer, &mut wire)?;
        // The owner's side: its live set at version `per_owner` (one add each), in the
        // chunks and order `RouteLog::snapshot` sends it (filter order), made one chunk at a
        // time so that the owner's copy does not sit in this process's memory.
        let owner = Owner {
            node: peer.clone(),
            incarnation: 1,
        };
        let numbers = k as u64 * per_owner..(k as u64 + 1) * per_owner;
        let version = per_owner;
        let hash = numbers
            .clone()
            .fold(0, |h, n| h ^ filter_hash(&filter_name(template, n)));
        let per_chunk = chunk_filters as u64;
        let count = u32::try_from(per_owner.div_ceil(per_chunk).max(1)).context("chunks")?;
        for index in 0..count {
            let from = numbers.start + u64::from(index) * per_chunk;
            let to = (from + per_chunk).min(numbers.end);
            let frame = Frame::SnapshotChunk(SnapshotChunk {
                owner: owner.clone(),
                version,
                hash,
                index,
                count,
                filters: (from..to)
                    .map(|n| filter_name(template, n).into())
                    .collect(),
            });
            link::encode(&frame, &mut wire).context("encoding a snapshot chunk")?;
            drop(frame);
            snapshot_frames += 1;
            snapshot_bytes += wire.len() as u64;
            let started = Instant::now();
            installed += feed(&mut broker, &peer, &mut wire)?;
            install += started.elapsed();
        }
        owners.push((peer, owner, version, hash, k));
    }
    let install_ms = u64::try_from(install.as_millis()).unwrap_or(u64::MAX);
    let rss_after = rss_bytes();
    let rss_peak = peak_rss_bytes();
    let held: u64 = broker.peers().iter().map(|p| p.routes as u64).sum();
    let filters_held = per_owner * owners.len() as u64;
    ensure!(
        installed == owners.len() as u64 && held == filters_held,
        "{installed} of {} snapshots installed, {held} of {filters_held} filters held",
        owners.len()
    );

    // A burst: one delta of `burst` new filters from every owner, encoded before timing.
    let burst = burst as u64;
    let mut deltas = Vec::new();
    for (peer, owner, version, hash, k) in &owners {
        let mut hash = *hash;
        let changes: Vec<RouteChange> = (0..burst)
            .map(|j| {
                let filter = filter_name(template, deployment_filters + *k as u64 * burst + j);
                hash ^= filter_hash(&filter);
                RouteChange {
                    version: version + j + 1,
                    filter: filter.into(),
                    op: RouteOp::Add,
                }
            })
            .collect();
        let frame = Frame::RouteDelta(RouteDelta {
            owner: owner.clone(),
            after: *version,
            changes,
            hash,
        });
        let mut bytes = BytesMut::new();
        link::encode(&frame, &mut bytes).context("encoding a route delta")?;
        deltas.push((peer.clone(), bytes));
    }
    let started = Instant::now();
    let mut acks = 0;
    for (peer, mut bytes) in deltas {
        acks += feed(&mut broker, &peer, &mut bytes)?;
    }
    let apply = started.elapsed();
    let applied_changes = burst * owners.len() as u64;
    ensure!(
        acks == owners.len() as u64,
        "{acks} of {} deltas applied",
        owners.len()
    );

    // Lookups of topics that each match one filter of one owner.
    let lookups: u64 = 100_000;
    let mut rng = Rng::new(seed);
    let topics: Vec<String> = (0..lookups)
        .map(|_| {
            let k = 1 + rng.up_to(owners.len() as u64 - 1);
            let j = rng.up_to(per_owner.max(1) - 1);
            topic_for(&filter_name(template, k * per_owner + j))
        })
        .collect();
    let started = Instant::now();
    let mut found = 0;
    for topic in &topics {
        found += broker.nodes_for(topic).len();
    }
    let lookup = started.elapsed();
    ensure!(
        found as u64 == lookups,
        "{found} nodes found for {lookups} lookups"
    );

    // What one owner broadcasts after a restart: its whole set in one batch, in bounded deltas.
    let (restart_delta_bytes, restart_delta_frames, restart_largest_frame_bytes) = {
        let (_, owner, _, _, k) = &owners[0];
        let mut log = RouteLog::new(
            owner.clone(),
            ClusterConfig::new(owner.node.clone(), 1, "").tombstone_budget,
        );
        for j in 0..per_owner {
            log.add(&filter_name(template, *k as u64 * per_owner + j));
        }
        let delta = log.flush().context("a restart's delta")?;
        let per_frame = ClusterConfig::new(owner.node.clone(), 1, "").snapshot_chunk_filters;
        let (mut total, mut frames, mut largest) = (0u64, 0u64, 0u64);
        for part in delta.split(per_frame, meridian_core::routes::DELTA_MAX_BYTES) {
            let len = link::encoded_len(&Frame::RouteDelta(part))
                .context("encoding a restart's delta")? as u64;
            total += len;
            frames += 1;
            largest = largest.max(len);
        }
        (total, frames, largest)
    };

    Ok(MemoryRow {
        nodes,
        deployment_filters,
        owners: owners.len(),
        filters_per_owner: per_owner,
        filters_held,
        rss_before_bytes: rss_before,
        rss_after_bytes: rss_after,
        bytes_per_filter: rss_before
            .zip(rss_after)
            .map(|(b, a)| a.saturating_sub(b) as f64 / filters_held.max(1) as f64),
        rss_peak_bytes: rss_peak,
        snapshot_frames,
        snapshot_bytes,
        install_ms,
        applied_changes,
        apply_us_per_change: apply.as_secs_f64() * 1e6 / applied_changes.max(1) as f64,
        restart_delta_bytes,
        restart_delta_frames,
        restart_largest_frame_bytes,
        max_frame_bytes: u64::from(link::DEFAULT_MAX_FRAME_LEN),
        lookups,
        lookup_ns: lookup.as_secs_f64() * 1e9 / lookups as f64,
    })
}

/// [`measure_memory`] in a fresh process of `exe` (`meridian`).
pub(super) fn measure_memory_in_process(
    exe: &Path,
    options: &MeshScale,
    seed: u64,
    nodes: usize,
) -> anyhow::Result<MemoryRow> {
    let output = std::process::Command::new(exe)
        .args(["sim", "--json", "--seed", &seed.to_string(), "--scenario"])
        .arg(options.memory_scenario(nodes))
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    ensure!(
        output.status.success(),
        "the memory measurement for {nodes} nodes failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let stdout = String::from_utf8(output.stdout).context("the measurement's output")?;
    let line = stdout
        .lines()
        .find(|l| l.contains("\"memory\""))
        .context("no memory row in the measurement's output")?;
    serde_json::from_str(line).context("the measurement's memory row")
}
