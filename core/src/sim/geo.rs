//! The scenarios of the EMQX geo-distribution write-up, on a simulated Meridian deployment:
//! nodes in Frankfurt, Hong Kong and Cape Town; clients at Hong Kong connecting and
//! subscribing to unique filters; how long until every client has its SUBACK, and until every
//! region routes to every new filter. EMQX's published figures ride along for comparison.

use crate::Config;
use crate::codec::QoS;
use crate::routes::NodeId;

use super::{
    Action, ClientGroup, Fault, FaultKind, LinkSpec, NodeSpec, PublishPlan, Report, Scenario, Sim,
};

/// Hong Kong to Cape Town round trip used here (the write-up gives none): public RTT tables
/// put it between 300 and 400 ms (routes go through Europe or Singapore).
pub const HKG_CPT_RTT_MS: u64 = 320;

/// Round trip from a client to its Hong Kong node (same city).
const CLIENT_RTT_MS: u64 = 5;

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct GeoRow {
    /// Clients at Hong Kong, each subscribing to a filter of its own.
    pub clients: usize,
    /// The filter pattern; `%i` is the client index.
    pub filter: &'static str,
    /// From the first CONNECT until the last client has its SUBACK.
    pub all_subacks_ms: u64,
    /// From the first CONNECT until Frankfurt and Cape Town route every new filter to Hong Kong.
    pub routes_converged_ms: u64,
    /// EMQX's figures for the same workload in the write-up: (setup, seconds).
    pub emqx: Vec<(&'static str, f64)>,
}

fn rtt(a: &str, b: &str) -> LinkSpec {
    let pair = if a < b { (a, b) } else { (b, a) };
    LinkSpec::rtt(match pair {
        ("cpt", "fra") => 160,
        ("fra", "hkg") => 200,
        _ => HKG_CPT_RTT_MS,
    })
}

fn row(seed: u64, clients: usize, filter: &'static str, emqx: Vec<(&'static str, f64)>) -> GeoRow {
    let mut sim = Sim::new(
        seed,
        Config::default(),
        &[
            ("fra", "eu-central"),
            ("hkg", "ap-east"),
            ("cpt", "af-south"),
        ],
        rtt,
        |_| {},
    );
    let hkg = NodeId::new("hkg").expect("valid");
    let remote = [
        NodeId::new("fra").expect("valid"),
        NodeId::new("cpt").expect("valid"),
    ];
    for i in 0..clients {
        let c = sim.add_client(&format!("bench-{i}"), &hkg, CLIENT_RTT_MS);
        sim.at(
            0,
            Action::ConnectAndSubscribe {
                client: c,
                filter: filter.replace("%i", &i.to_string()),
                qos: QoS::AtLeastOnce,
            },
        );
    }
    let mut converged_at = None;
    sim.run_until(600_000, |s| {
        if converged_at.is_none()
            && remote.iter().all(|n| {
                s.broker(n).is_some_and(|b| {
                    b.peers()
                        .iter()
                        .any(|p| p.node == hkg && p.routes == clients)
                })
            })
        {
            converged_at = Some(s.elapsed_ms());
        }
    });
    let all_subacks_ms = sim
        .clients
        .iter()
        .filter_map(|c| c.subacks_at_ms.first().copied())
        .max()
        .unwrap_or(0);
    let done = sim.clients.iter().all(|c| !c.subacks_at_ms.is_empty());
    GeoRow {
        clients,
        filter,
        all_subacks_ms: if done { all_subacks_ms } else { u64::MAX },
        routes_converged_ms: converged_at.unwrap_or(u64::MAX),
        emqx,
    }
}

/// Every row of the write-up's connect-and-subscribe scenarios.
pub fn geo_writeup(seed: u64) -> Vec<GeoRow> {
    let exact = "t/mqttx/%i";
    let wildcard = "t/mqttx/+/%i/sub/+/#";
    vec![
        row(
            seed,
            1,
            exact,
            vec![("stretched cluster, v1 routing", 0.89)],
        ),
        row(
            seed,
            100,
            exact,
            vec![("stretched cluster, v1 routing", 1.71)],
        ),
        row(
            seed,
            1,
            wildcard,
            vec![
                ("stretched cluster, v1 routing", 2.94),
                ("remote core + replicants", 0.70),
            ],
        ),
        row(
            seed,
            100,
            wildcard,
            vec![
                ("stretched cluster, v1 routing", 102.0),
                ("stretched cluster, v2 routing", 1.67),
                ("remote core + replicants", 1.09),
            ],
        ),
        row(
            seed,
            1_000,
            wildcard,
            vec![
                ("remote core + replicants", 4.33),
                ("... with batched route sync", 2.59),
            ],
        ),
    ]
}

/// The write-up's deployment (Frankfurt, Hong Kong, Cape Town; its round trips) with no
/// clients yet.
pub fn writeup_deployment(name: &str) -> Scenario {
    let regions = ["eu-central", "ap-east", "af-south"];
    Scenario {
        name: name.to_owned(),
        nodes: [("fra", 0), ("hkg", 1), ("cpt", 2)]
            .iter()
            .map(|(n, r)| NodeSpec {
                name: (*n).to_owned(),
                region: regions[*r].to_owned(),
            })
            .collect(),
        regions: regions.iter().map(|r| (*r).to_owned()).collect(),
        rtt_ms: vec![
            vec![2, 200, 160],
            vec![200, 2, HKG_CPT_RTT_MS],
            vec![160, HKG_CPT_RTT_MS, 2],
        ],
        jitter_ms: 0,
        route_batch_ms: 20,
        subscribe_fence: false,
        clients: Vec::new(),
        publishes: Vec::new(),
        faults: Vec::new(),
        duration_ms: 60_000,
    }
}

fn group(name: &str, node: &str, subscribe: &[&str]) -> ClientGroup {
    ClientGroup {
        name: name.to_owned(),
        node: node.to_owned(),
        count: 1,
        rtt_ms: CLIENT_RTT_MS,
        connect_at_ms: 0,
        subscribe: subscribe.iter().map(|s| (*s).to_owned()).collect(),
        qos: QoS::AtLeastOnce,
    }
}

fn plan(
    clients: &str,
    topic: &str,
    qos: QoS,
    start_ms: u64,
    interval_ms: u64,
    count: u64,
) -> PublishPlan {
    PublishPlan {
        clients: clients.to_owned(),
        topic: topic.to_owned(),
        qos,
        retain: false,
        start_ms,
        interval_ms,
        count,
        payload_bytes: 256,
    }
}

/// Cross-region publish latency: a publisher in Hong Kong, one subscriber per region, 100
/// QoS 1 and 100 QoS 0 messages.
pub fn cross_region_latency() -> Scenario {
    let mut s = writeup_deployment("cross-region-latency");
    for node in ["fra", "hkg", "cpt"] {
        s.clients
            .push(group(&format!("sub-{node}"), node, &["chat/#"]));
    }
    s.clients.push(group("pub-hkg", "hkg", &[]));
    s.publishes.push(plan(
        "pub-hkg",
        "chat/hkg/%n",
        QoS::AtLeastOnce,
        2_000,
        100,
        100,
    ));
    s.publishes.push(plan(
        "pub-hkg",
        "chat/hkg/q0/%n",
        QoS::AtMostOnce,
        2_050,
        100,
        100,
    ));
    s.duration_ms = 30_000;
    s
}

/// A 60 s partition of Cape Town under QoS 1 traffic, then heal: a publisher and a
/// subscriber (persistent sessions) in every region, 10 messages a second each for 90 s.
pub fn region_partition() -> Scenario {
    let mut s = writeup_deployment("partition-60s");
    for node in ["fra", "hkg", "cpt"] {
        s.clients
            .push(group(&format!("sub-{node}"), node, &["load/#"]));
        s.clients.push(group(&format!("pub-{node}"), node, &[]));
        s.publishes.push(plan(
            &format!("pub-{node}"),
            &format!("load/{node}/%n"),
            QoS::AtLeastOnce,
            5_000,
            100,
            900,
        ));
    }
    s.faults.push(Fault {
        kind: FaultKind::Partition {
            target: "af-south".to_owned(),
        },
        at_ms: 20_000,
        duration_ms: 60_000,
    });
    s.duration_ms = 180_000;
    s
}

/// The subscription fence's cost and effect: a subscriber in Frankfurt subscribes, in a
/// settled mesh, while a publisher in Cape Town sends a QoS 1 message every 10 ms to its topic. Messages published
/// after the SUBACK but before Cape Town knew the route are lost without the fence.
pub fn subscribe_fence(on: bool) -> Scenario {
    let mut s = writeup_deployment(if on { "fence-on" } else { "fence-off" });
    s.subscribe_fence = on;
    // Two seconds in, once the mesh settled: until a node caught up with a peer's routes
    // after their link came up, it forwards QoS 1/2 messages to that peer whatever its routes.
    let mut sub = group("sub-fra", "fra", &["news/fra"]);
    sub.connect_at_ms = 2_000;
    s.clients.push(sub);
    s.clients.push(group("pub-cpt", "cpt", &[]));
    s.publishes.push(plan(
        "pub-cpt",
        "news/fra",
        QoS::AtLeastOnce,
        2_020,
        10,
        100,
    ));
    s.duration_ms = 10_000;
    s
}

/// The write-up's extra scenarios: cross-region latency, the 60 s partition, and the
/// subscription fence off and on.
pub fn geo_writeup_reports(seed: u64) -> Vec<Report> {
    [
        cross_region_latency(),
        region_partition(),
        subscribe_fence(false),
        subscribe_fence(true),
    ]
    .iter()
    .map(|s| s.run(seed).expect("the built-in scenarios are valid"))
    .collect()
}
