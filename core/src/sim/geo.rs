//! The scenarios of the EMQX geo-distribution write-up, on a simulated Meridian deployment:
//! nodes in Frankfurt, Hong Kong and Cape Town; clients at Hong Kong connecting and
//! subscribing to unique filters; how long until every client has its SUBACK, and until every
//! region routes to every new filter. EMQX's published figures ride along for comparison.

use crate::Config;
use crate::codec::QoS;
use crate::routes::NodeId;

use super::{Action, LinkSpec, Sim};

/// Hong Kong to Cape Town round trip used here (the write-up gives none): public RTT tables
/// put it between 300 and 400 ms (routes go through Europe or Singapore).
pub const HKG_CPT_RTT_MS: u64 = 320;

/// Round trip from a client to its Hong Kong node (same city).
const CLIENT_RTT_MS: u64 = 5;

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct GeoRow {
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
