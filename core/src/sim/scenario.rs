//! A deployment and a workload described as data (what a topology file holds), run on the
//! simulator, measured: how long subscribers wait for their SUBACK and the other regions for
//! the new routes, how long messages take between regions, and what a fault did to delivery
//! (delivered, lost and duplicated counts per QoS).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::{Action, LinkSpec, Sim, Timeline, TimelineKind};
use crate::Config;
use crate::codec::QoS;
use crate::routes::NodeId;
use crate::topic::{TopicFilter, TopicName, matches};

/// Most timeline events kept for drawing.
const TIMELINE_CAP: usize = 50_000;

/// One broker node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Node id (1 to 255 printable bytes), unique in the scenario.
    pub name: String,
    /// Its region: one of [`Scenario::regions`].
    pub region: String,
}

/// `count` clients of one node, named `{name}-{i}`. Each connects at `connect_at_ms` (a
/// persistent MQTT 5.0 session) and, once connected, subscribes to every filter in
/// `subscribe` (`%i` is replaced by the client's index in the group), one SUBSCRIBE each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientGroup {
    /// Group name, unique in the scenario; its clients are `{name}-{i}`.
    pub name: String,
    /// The node its clients connect to (a [`NodeSpec::name`]).
    pub node: String,
    /// Number of clients.
    pub count: usize,
    /// Round trip between a client and its node.
    pub rtt_ms: u64,
    /// When the clients connect, in milliseconds since the start of the run.
    pub connect_at_ms: u64,
    /// Topic filters each client subscribes to once connected (`%i`: its index).
    pub subscribe: Vec<String>,
    /// The maximum QoS of those subscriptions.
    pub qos: QoS,
}

/// Every client of group `clients` publishes `count` messages to `topic` (`%i`: the
/// client's index in its group, `%n`: the message's number), one every `interval_ms` from
/// `start_ms`. Payloads are `payload_bytes` long (at least 8: the message's id). A client
/// that is not connected (no CONNACK yet, or its node is down) skips its turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishPlan {
    /// The client group that publishes (a [`ClientGroup::name`]).
    pub clients: String,
    /// The topic name; `%i` and `%n` are replaced as above.
    pub topic: String,
    /// The QoS of the messages.
    pub qos: QoS,
    /// Whether they are published retained.
    pub retain: bool,
    /// When each client publishes its first message, in milliseconds since the start of the run.
    pub start_ms: u64,
    /// Milliseconds between one client's messages; at least 1 when `count` is more than 1.
    pub interval_ms: u64,
    /// Messages each client publishes.
    pub count: u64,
    /// Payload length in bytes (at least 8).
    pub payload_bytes: usize,
}

/// What goes wrong, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// Every link between the nodes of `target` (a region or a node) and the others is cut,
    /// then healed.
    Partition {
        /// A region, or a node's name.
        target: String,
    },
    /// A node crashes (losing all it did not persist), then restarts with a new incarnation.
    Crash {
        /// The node's name.
        node: String,
    },
}

/// A fault injected into the run: what, when and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// What goes wrong.
    pub kind: FaultKind,
    /// When it starts, in milliseconds since the start of the run.
    pub at_ms: u64,
    /// How long it lasts, in milliseconds; then the links heal or the node restarts.
    pub duration_ms: u64,
}

/// A deployment, its links and its workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// The scenario's name, carried into the report.
    pub name: String,
    /// The broker nodes.
    pub nodes: Vec<NodeSpec>,
    /// Regions in the order of `rtt_ms`'s rows and columns.
    pub regions: Vec<String>,
    /// Round trips between regions (symmetric); the diagonal is between nodes of one region.
    pub rtt_ms: Vec<Vec<u64>>,
    /// Up to this much extra delay per link frame.
    pub jitter_ms: u64,
    /// Route changes are batched this long ([`crate::broker::ClusterConfig::route_batch_ms`]).
    pub route_batch_ms: u64,
    /// [`crate::broker::ClusterConfig::subscribe_fence`].
    pub subscribe_fence: bool,
    /// The client groups.
    pub clients: Vec<ClientGroup>,
    /// What the clients publish.
    pub publishes: Vec<PublishPlan>,
    /// Faults to inject.
    pub faults: Vec<Fault>,
    /// Virtual time the run lasts.
    pub duration_ms: u64,
}

/// A scenario that cannot run, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ScenarioError {
    /// The field at fault, as a path (`clients[2].node`).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> ScenarioError {
    ScenarioError {
        field: field.into(),
        message: message.into(),
    }
}

/// Subscribers: how long they waited, and how long the other nodes took to learn their routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeRow {
    /// Clients with at least one subscription.
    pub subscribers: usize,
    /// Subscriptions that never got a SUBACK.
    pub missing_subacks: usize,
    /// The longest wait from a client's CONNECT to its last SUBACK.
    pub all_subacks_ms: u64,
    /// When every node's replica of every route set last became equal to its owner's (from
    /// the start of the run); `None` if they were not equal at the end.
    pub routes_converged_ms: Option<u64>,
}

/// Publish-to-delivery times from publishers in one region to subscribers in another (first
/// copies only; from the moment the publisher sends the PUBLISH).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyRow {
    /// The publishers' region.
    pub from_region: String,
    /// The subscribers' region.
    pub to_region: String,
    /// Deliveries measured.
    pub messages: usize,
    /// Median, in milliseconds.
    pub p50_ms: u64,
    /// 99th percentile (nearest rank), in milliseconds.
    pub p99_ms: u64,
    /// Longest, in milliseconds.
    pub max_ms: u64,
}

/// Delivery accounting for the messages published at one QoS. A delivery is *expected* when
/// the message was acknowledged to its publisher (QoS 0: sent) and the subscriber had a SUBACK
/// for a matching filter before the message was published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRow {
    /// The QoS the messages were published with.
    pub qos: QoS,
    /// Messages the plans called for.
    pub published: usize,
    /// Messages acknowledged to their publisher (at QoS 0, every one counts).
    pub acknowledged: usize,
    /// Deliveries expected, one per message and subscriber with a matching filter (see above).
    pub expected: usize,
    /// Expected deliveries that arrived (first copies).
    pub delivered: usize,
    /// Expected deliveries that never arrived.
    pub lost: usize,
    /// Copies beyond the first of one message at one subscriber (DUP re-sends included).
    pub duplicated: usize,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// The seed of the run.
    pub seed: u64,
    /// Subscriber figures; `None` when no client subscribes.
    pub subscribe: Option<SubscribeRow>,
    /// Latencies per (publisher region, subscriber region).
    pub latency: Vec<LatencyRow>,
    /// Delivery accounting per QoS published.
    pub delivery: Vec<DeliveryRow>,
    /// The scenario's nodes.
    pub nodes: Vec<NodeSpec>,
    /// The scenario's regions, in the order of `rtt_ms`.
    pub regions: Vec<String>,
    /// The scenario's round trips between regions.
    pub rtt_ms: Vec<Vec<u64>>,
    /// Virtual time the run lasted, in milliseconds.
    pub duration_ms: u64,
    /// What happened, for drawing.
    pub timeline: Timeline,
}

/// One message a client published.
struct Sent {
    at_ms: u64,
    client: usize,
    topic: String,
    qos: QoS,
}

/// One subscribing client: its filters in the order it sent them (SUBACKs come in that order).
struct Subscriber {
    client: usize,
    connect_at_ms: u64,
    filters: Vec<String>,
}

impl Scenario {
    /// Check names, references and shapes.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        if self.nodes.is_empty() {
            return Err(err("nodes", "at least one node is needed"));
        }
        let mut names = BTreeSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            NodeId::new(&n.name).map_err(|e| err(format!("nodes[{i}].name"), e.to_string()))?;
            if !names.insert(n.name.as_str()) {
                return Err(err(
                    format!("nodes[{i}].name"),
                    format!("node {:?} is declared twice", n.name),
                ));
            }
            if !self.regions.contains(&n.region) {
                return Err(err(
                    format!("nodes[{i}].region"),
                    format!("region {:?} is not in the RTT matrix", n.region),
                ));
            }
        }
        if self.rtt_ms.len() != self.regions.len() {
            return Err(err(
                "rtt_ms",
                format!(
                    "{} rows for {} regions",
                    self.rtt_ms.len(),
                    self.regions.len()
                ),
            ));
        }
        for (i, row) in self.rtt_ms.iter().enumerate() {
            if row.len() != self.regions.len() {
                return Err(err(
                    format!("rtt_ms[{i}]"),
                    format!("{} columns for {} regions", row.len(), self.regions.len()),
                ));
            }
            for (j, v) in row.iter().enumerate() {
                if self.rtt_ms[j][i] != *v {
                    return Err(err(
                        format!("rtt_ms[{i}][{j}]"),
                        format!(
                            "not symmetric: {v} here, {} at [{j}][{i}]",
                            self.rtt_ms[j][i]
                        ),
                    ));
                }
            }
        }
        let mut groups = BTreeSet::new();
        for (i, g) in self.clients.iter().enumerate() {
            if !groups.insert(g.name.as_str()) {
                return Err(err(
                    format!("clients[{i}].name"),
                    format!("client group {:?} is declared twice", g.name),
                ));
            }
            if !names.contains(g.node.as_str()) {
                return Err(err(
                    format!("clients[{i}].node"),
                    format!("unknown node {:?}", g.node),
                ));
            }
            for (k, f) in g.subscribe.iter().enumerate() {
                let sample = f.replace("%i", "0");
                TopicFilter::new(sample.as_str())
                    .map_err(|e| err(format!("clients[{i}].subscribe[{k}]"), e.to_string()))?;
            }
        }
        for (i, p) in self.publishes.iter().enumerate() {
            if !groups.contains(p.clients.as_str()) {
                return Err(err(
                    format!("publish[{i}].clients"),
                    format!("unknown client group {:?}", p.clients),
                ));
            }
            let sample = p.topic.replace("%i", "0").replace("%n", "0");
            TopicName::new(sample.as_str())
                .map_err(|e| err(format!("publish[{i}].topic"), e.to_string()))?;
            if p.count > 1 && p.interval_ms == 0 {
                return Err(err(
                    format!("publish[{i}].interval_ms"),
                    "must be at least 1 when more than one message is sent",
                ));
            }
        }
        for (i, f) in self.faults.iter().enumerate() {
            match &f.kind {
                FaultKind::Partition { target } => {
                    if !names.contains(target.as_str()) && !self.regions.contains(target) {
                        return Err(err(
                            format!("fault[{i}].target"),
                            format!("{target:?} is neither a node nor a region"),
                        ));
                    }
                }
                FaultKind::Crash { node } => {
                    if !names.contains(node.as_str()) {
                        return Err(err(
                            format!("fault[{i}].node"),
                            format!("unknown node {node:?}"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn region_index(&self, node: &str) -> usize {
        let region = self
            .nodes
            .iter()
            .find(|n| n.name == node)
            .map(|n| n.region.as_str());
        self.regions
            .iter()
            .position(|r| Some(r.as_str()) == region)
            .unwrap_or(0)
    }

    /// Run the scenario with one seed.
    pub fn run(&self, seed: u64) -> Result<Report, ScenarioError> {
        self.validate()?;
        let nodes: Vec<(&str, &str)> = self
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.region.as_str()))
            .collect();
        let jitter = self.jitter_ms;
        let link = |a: &str, b: &str| LinkSpec {
            rtt_ms: self.rtt_ms[self.region_index(a)][self.region_index(b)],
            jitter_ms: jitter,
            gossip_loss_ppm: 0,
            gossip_dup_ppm: 0,
        };
        let (batch, fence) = (self.route_batch_ms, self.subscribe_fence);
        let mut sim = Sim::new(seed, Config::default(), &nodes, link, |c| {
            c.route_batch_ms = batch;
            c.subscribe_fence = fence;
        });
        sim.record_timeline(TIMELINE_CAP);

        let mut subscribers = Vec::new();
        let mut group_clients: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for g in &self.clients {
            let node = NodeId::new(&g.node).map_err(|e| err("clients.node", e.to_string()))?;
            for i in 0..g.count {
                let c = sim.add_client(&format!("{}-{i}", g.name), &node, g.rtt_ms);
                let filters: Vec<String> = g
                    .subscribe
                    .iter()
                    .map(|f| f.replace("%i", &i.to_string()))
                    .collect();
                for f in &filters {
                    sim.clients[c].subscribe_on_connack.push((f.clone(), g.qos));
                }
                if !filters.is_empty() {
                    subscribers.push(Subscriber {
                        client: c,
                        connect_at_ms: g.connect_at_ms,
                        filters,
                    });
                }
                sim.at(g.connect_at_ms, Action::Connect { client: c });
                group_clients.entry(g.name.as_str()).or_default().push(c);
            }
        }

        let mut sent: Vec<Sent> = Vec::new();
        for p in &self.publishes {
            let clients = group_clients.get(p.clients.as_str()).cloned();
            for (i, &client) in clients.iter().flatten().enumerate() {
                for n in 0..p.count {
                    let at_ms = p.start_ms + n * p.interval_ms;
                    let topic = p
                        .topic
                        .replace("%i", &i.to_string())
                        .replace("%n", &n.to_string());
                    let id = sent.len() as u64;
                    let mut payload = id.to_be_bytes().to_vec();
                    payload.resize(p.payload_bytes.max(8), b'.');
                    sim.at(
                        at_ms,
                        Action::Publish {
                            client,
                            topic: topic.clone(),
                            payload: Bytes::from(payload),
                            qos: p.qos,
                            retain: p.retain,
                        },
                    );
                    sent.push(Sent {
                        at_ms,
                        client,
                        topic,
                        qos: p.qos,
                    });
                }
            }
        }

        for f in &self.faults {
            let targets: Vec<NodeId> = match &f.kind {
                FaultKind::Partition { target } => self
                    .nodes
                    .iter()
                    .filter(|n| n.name == *target || n.region == *target)
                    .filter_map(|n| NodeId::new(&n.name).ok())
                    .collect(),
                FaultKind::Crash { node } => NodeId::new(node).into_iter().collect(),
            };
            match &f.kind {
                FaultKind::Partition { .. } => {
                    for t in &targets {
                        for other in sim.node_ids() {
                            if targets.contains(&other) {
                                continue;
                            }
                            let (a, b) = (t.clone(), other.clone());
                            sim.at(f.at_ms, Action::Cut { a, b });
                            let (a, b) = (t.clone(), other);
                            sim.at(f.at_ms + f.duration_ms, Action::Heal { a, b });
                        }
                    }
                }
                FaultKind::Crash { .. } => {
                    for t in targets {
                        sim.at(f.at_ms, Action::Crash { node: t.clone() });
                        sim.at(f.at_ms + f.duration_ms, Action::Restart { node: t });
                    }
                }
            }
        }

        let mut in_sync = true;
        let mut converged_at: Option<u64> = Some(0);
        let mut flips = Vec::new();
        sim.run_until(self.duration_ms, |s| {
            let now_in_sync = s.routes_in_sync();
            if now_in_sync != in_sync {
                in_sync = now_in_sync;
                converged_at = now_in_sync.then(|| s.elapsed_ms());
                if now_in_sync {
                    flips.push(s.elapsed_ms());
                }
            }
        });
        let mut timeline = sim.take_timeline().unwrap_or_default();
        for at in flips {
            timeline.push(at, TimelineKind::RoutesConverged);
        }

        // Subscribers.
        let subscribe = (!subscribers.is_empty()).then(|| {
            let mut missing = 0;
            let mut worst = 0;
            for s in &subscribers {
                let c = &sim.clients[s.client];
                missing += s.filters.len().saturating_sub(c.subacks_at_ms.len());
                if let Some(last) = c.subacks_at_ms.get(s.filters.len().saturating_sub(1)) {
                    worst = worst.max(last.saturating_sub(s.connect_at_ms));
                }
                for at in &c.subacks_at_ms {
                    timeline.push(
                        *at,
                        TimelineKind::Suback {
                            node: c.node.clone(),
                            client: c.name.clone(),
                        },
                    );
                }
            }
            SubscribeRow {
                subscribers: subscribers.len(),
                missing_subacks: missing,
                all_subacks_ms: worst,
                routes_converged_ms: converged_at,
            }
        });
        timeline.sort();

        // Which publishes were acknowledged (QoS 0: sent).
        let mut acked = vec![false; sent.len()];
        for (id, s) in sent.iter().enumerate() {
            if s.qos == QoS::AtMostOnce {
                acked[id] = true;
            }
        }
        for c in &sim.clients {
            for p in &c.acknowledged {
                if let Some(id) = payload_id(p) {
                    acked[id] = true;
                }
            }
        }

        // Deliveries per (message, subscriber).
        let mut latency: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
        let mut rows: BTreeMap<u8, DeliveryRow> = BTreeMap::new();
        for s in &sent {
            let row = rows.entry(s.qos as u8).or_insert(DeliveryRow {
                qos: s.qos,
                published: 0,
                acknowledged: 0,
                expected: 0,
                delivered: 0,
                lost: 0,
                duplicated: 0,
            });
            row.published += 1;
        }
        for (id, s) in sent.iter().enumerate() {
            if acked[id]
                && let Some(row) = rows.get_mut(&(s.qos as u8))
            {
                row.acknowledged += 1;
            }
        }
        for sub in &subscribers {
            let c = &sim.clients[sub.client];
            let mut copies: BTreeMap<usize, (usize, u64)> = BTreeMap::new();
            for r in &c.received {
                let Some(id) = payload_id(&r.payload) else {
                    continue;
                };
                let entry = copies.entry(id).or_insert((0, r.at_ms));
                entry.0 += 1;
            }
            for (id, s) in sent.iter().enumerate() {
                let expected = acked[id]
                    && sub.filters.iter().enumerate().any(|(k, f)| {
                        c.subacks_at_ms.get(k).is_some_and(|at| *at <= s.at_ms)
                            && TopicFilter::new(f.as_str())
                                .is_ok_and(|f| matches(f.pattern(), &s.topic))
                    });
                let got = copies.get(&id).copied();
                let Some(row) = rows.get_mut(&(s.qos as u8)) else {
                    continue;
                };
                if let Some((n, _)) = got {
                    row.duplicated += n - 1;
                }
                if !expected {
                    continue;
                }
                row.expected += 1;
                match got {
                    Some((_, at)) => {
                        row.delivered += 1;
                        let from = sim.clients[s.client].node.clone();
                        let from = sim.region_of(&from).unwrap_or("?").to_owned();
                        let to = sim.region_of(&c.node).unwrap_or("?").to_owned();
                        latency
                            .entry((from, to))
                            .or_default()
                            .push(at.saturating_sub(s.at_ms));
                    }
                    None => row.lost += 1,
                }
            }
        }
        let latency = latency
            .into_iter()
            .map(|((from_region, to_region), mut ms)| {
                ms.sort_unstable();
                LatencyRow {
                    from_region,
                    to_region,
                    messages: ms.len(),
                    p50_ms: percentile(&ms, 50),
                    p99_ms: percentile(&ms, 99),
                    max_ms: ms.last().copied().unwrap_or(0),
                }
            })
            .collect();
        Ok(Report {
            scenario: self.name.clone(),
            seed,
            subscribe,
            latency,
            delivery: rows.into_values().collect(),
            nodes: self.nodes.clone(),
            regions: self.regions.clone(),
            rtt_ms: self.rtt_ms.clone(),
            duration_ms: self.duration_ms,
            timeline,
        })
    }
}

fn payload_id(payload: &[u8]) -> Option<usize> {
    let bytes: [u8; 8] = payload.get(..8)?.try_into().ok()?;
    usize::try_from(u64::from_be_bytes(bytes)).ok()
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), 50);
        assert_eq!(percentile(&v, 99), 99);
        assert_eq!(percentile(&[7], 99), 7);
        assert_eq!(percentile(&[], 50), 0);
    }
}
