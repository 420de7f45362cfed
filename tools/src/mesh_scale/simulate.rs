//! Bursts of route changes in a simulated mesh: convergence in virtual time and the route
//! frames' encoded bytes.

use std::collections::BTreeMap;

use anyhow::{Context, ensure};
use meridian_core::Config;
use meridian_core::broker::ClusterConfig;
use meridian_core::codec::QoS;
use meridian_core::link::FrameKind;
use meridian_core::routes::NodeId;
use meridian_core::sim::{Action, LinkSpec, LinkTraffic, Sim};
use serde::{Deserialize, Serialize};

use super::{CLIENT_RTT_MS, REGIONS, filter_name, layout, rtt_ms};

/// When the base subscriptions are sent (after every client has its CONNACK).
const BASE_AT_MS: u64 = 50;

/// One burst in one simulated mesh.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BurstRow {
    /// Nodes in the mesh.
    pub nodes: usize,
    /// Regions they are in.
    pub regions: usize,
    /// Filters each node held before the burst (its own; it holds `nodes - 1` times as many
    /// replicated).
    pub base_per_node: usize,
    /// New filters each node subscribed at the burst's start.
    pub burst_per_node: usize,
    /// Route changes in the burst (`nodes × burst_per_node`).
    pub changes: u64,
    /// From the burst's SUBSCRIBEs until every node's replica of every route set is at its
    /// owner's version and hash; `None` if that did not happen inside the window.
    pub converged_ms: Option<u64>,
    /// The network's floor for it: half the client's round trip, one route batch, and the
    /// longest one-way trip between two nodes.
    pub floor_ms: u64,
    /// Route-delta frames sent (each peer's copy counted).
    pub delta_frames: u64,
    /// Bytes of those frames.
    pub delta_bytes: u64,
    /// Route acknowledgements sent.
    pub ack_frames: u64,
    /// Bytes of those frames.
    pub ack_bytes: u64,
    /// Digests sent during the burst's window (they go out every digest interval whatever
    /// happens; the window avoids them, see `idle_bytes_per_s`).
    pub digest_bytes: u64,
    /// Snapshot requests and chunks sent (none while every replica keeps up).
    pub snapshot_bytes: u64,
    /// Every route frame's bytes (deltas, acks, digests, snapshots) per route change.
    pub bytes_per_change: f64,
    /// The same per change and receiving node: `bytes_per_change / (nodes - 1)`.
    pub bytes_per_change_per_peer: f64,
    /// Link bytes per second of the whole mesh when no route changes (digests), measured over
    /// two digest intervals after the bursts.
    pub idle_bytes_per_s: f64,
}

/// Whether every client has `subacks` SUBACKs, no node has a route batch waiting, and every
/// replica is at its owner's version and hash.
fn settled(sim: &Sim, subacks: usize) -> bool {
    sim.clients.iter().all(|c| c.subacks_at_ms.len() == subacks)
        && sim
            .node_ids()
            .iter()
            .all(|n| sim.broker(n).is_some_and(|b| !b.routes_pending()))
        && sim.routes_in_sync()
}

fn traffic_of(traffic: &BTreeMap<FrameKind, LinkTraffic>, kinds: &[FrameKind]) -> LinkTraffic {
    kinds
        .iter()
        .filter_map(|k| traffic.get(k))
        .fold(LinkTraffic::default(), |a, t| LinkTraffic {
            frames: a.frames + t.frames,
            bytes: a.bytes + t.bytes,
        })
}

/// Simulate a mesh of `nodes` whose nodes each subscribe `base` filters, then each of
/// `bursts` new ones at once, one burst per digest interval (between two digests); one row
/// per burst. Fails if the base does not converge or the replicas end unequal.
pub fn simulate(
    seed: u64,
    nodes: usize,
    base: usize,
    bursts: &[usize],
    template: &str,
) -> anyhow::Result<Vec<BurstRow>> {
    let layout = layout(nodes);
    let names: Vec<(&str, &str)> = layout
        .iter()
        .map(|(name, region)| (name.as_str(), REGIONS[*region].0))
        .collect();
    let region_of: BTreeMap<&str, usize> = layout.iter().map(|(n, r)| (n.as_str(), *r)).collect();
    let per_node = base + bursts.iter().sum::<usize>();
    let config = Config {
        seed,
        max_subscriptions_per_client: per_node + 1,
        ..Config::default()
    };
    let defaults = ClusterConfig::new(NodeId::new("defaults").context("node id")?, 1, "");
    let interval = defaults.digest_interval_ms;
    let mut sim = Sim::new(
        seed,
        config,
        &names,
        |a, b| LinkSpec::rtt(rtt_ms(region_of[a], region_of[b])),
        |_| {},
    );
    let node_ids = sim.node_ids();
    let mut clients = Vec::new();
    for (k, (name, _)) in layout.iter().enumerate() {
        let id = NodeId::new(name).context("node id")?;
        let c = sim.add_client(&format!("c-{name}"), &id, CLIENT_RTT_MS);
        sim.at(0, Action::Connect { client: c });
        clients.push((c, k));
    }
    // Filter j of node k is number k × per_node + j.
    let subscribe = |sim: &mut Sim, at_ms: u64, from: usize, count: usize| {
        for &(client, k) in &clients {
            for j in from..from + count {
                let number = (k * per_node + j) as u64;
                sim.at(
                    at_ms,
                    Action::Subscribe {
                        client,
                        filter: filter_name(template, number),
                        qos: QoS::AtLeastOnce,
                    },
                );
            }
        }
    };
    subscribe(&mut sim, BASE_AT_MS, 0, base);
    let max_rtt = node_ids
        .iter()
        .flat_map(|a| node_ids.iter().map(move |b| (a, b)))
        .filter(|(a, b)| a != b)
        .map(|(a, b)| rtt_ms(region_of[a.as_str()], region_of[b.as_str()]))
        .max()
        .unwrap_or(0);
    let floor_ms = CLIENT_RTT_MS / 2 + defaults.route_batch_ms + max_rtt / 2;
    sim.count_link_traffic();
    let mut rows = Vec::new();
    let mut subscribed = base;
    for (k, &burst) in bursts.iter().enumerate() {
        // Between two digests: one at `interval × (k + 1)`, the next at `interval × (k + 2)`.
        let start = interval * (k as u64 + 1) + 200;
        let end = interval * (k as u64 + 2) - 1;
        sim.run_until(start - 1, |_| {});
        ensure!(
            settled(&sim, subscribed),
            "{nodes} nodes, base {base}: routes had not converged before burst {k}"
        );
        sim.take_link_traffic();
        subscribe(&mut sim, start, subscribed, burst);
        subscribed += burst;
        let mut converged_ms = None;
        for t in start..=end {
            sim.run_until(t, |_| {});
            if settled(&sim, subscribed) {
                converged_ms = Some(t - start);
                break;
            }
        }
        sim.run_until(end, |_| {});
        ensure!(
            sim.routes_converged(),
            "{nodes} nodes: replicas differ from their owners' route sets after burst {k}"
        );
        let traffic = sim.take_link_traffic();
        let delta = traffic_of(&traffic, &[FrameKind::RouteDelta]);
        let ack = traffic_of(&traffic, &[FrameKind::RouteAck]);
        let digest = traffic_of(&traffic, &[FrameKind::Digest]);
        let snapshot = traffic_of(
            &traffic,
            &[FrameKind::SnapshotRequest, FrameKind::SnapshotChunk],
        );
        let changes = (nodes * burst) as u64;
        let route_bytes = delta.bytes + ack.bytes + digest.bytes + snapshot.bytes;
        let bytes_per_change = route_bytes as f64 / changes as f64;
        rows.push(BurstRow {
            nodes,
            regions: nodes.min(REGIONS.len()),
            base_per_node: base,
            burst_per_node: burst,
            changes,
            converged_ms,
            floor_ms,
            delta_frames: delta.frames,
            delta_bytes: delta.bytes,
            ack_frames: ack.frames,
            ack_bytes: ack.bytes,
            digest_bytes: digest.bytes,
            snapshot_bytes: snapshot.bytes,
            bytes_per_change,
            bytes_per_change_per_peer: bytes_per_change / (nodes - 1) as f64,
            idle_bytes_per_s: 0.0,
        });
    }
    // Idle: two digest intervals with no route change.
    let from = interval * (bursts.len() as u64 + 1) - 1;
    sim.run_until(from, |_| {});
    sim.take_link_traffic();
    sim.run_until(from + 2 * interval, |_| {});
    let idle: u64 = sim.take_link_traffic().values().map(|t| t.bytes).sum();
    let idle_bytes_per_s = idle as f64 / (2 * interval) as f64 * 1_000.0;
    for row in &mut rows {
        row.idle_bytes_per_s = idle_bytes_per_s;
    }
    Ok(rows)
}
