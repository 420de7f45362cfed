//! The simulator: one seed, one run (checked by running seeds twice); under random faults
//! (jitter, lossy and duplicating gossip, link cuts, crashes of the publishing node) the
//! invariants hold: routes converge, every acknowledged QoS 1/2 message reaches every
//! subscriber once (QoS 2) or at least once (QoS 1), in order. A failure prints its seed;
//! `SIM_SEEDS=n` sweeps more seeds.

use std::collections::BTreeMap;

use bytes::Bytes;
use meridian_core::Config;
use meridian_core::codec::QoS;
use meridian_core::routes::NodeId;
use meridian_core::sim::{Action, LinkSpec, Sim};

fn id(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

/// Three regions, subscribers everywhere, publishers at `cpt`, faults drawn from the seed.
fn run(seed: u64, faults: bool) -> Sim {
    let link = |_: &str, _: &str| LinkSpec {
        rtt_ms: 160,
        jitter_ms: if faults { 40 } else { 0 },
        gossip_loss_ppm: if faults { 200_000 } else { 0 },
        gossip_dup_ppm: if faults { 100_000 } else { 0 },
    };
    let mut sim = Sim::new(
        seed,
        Config::default(),
        &[("fra", "eu"), ("hkg", "ap"), ("cpt", "af")],
        link,
        |c| c.digest_interval_ms = 1_000,
    );
    let mut rng = meridian_core::sim::Rng::new(seed ^ 0xfa17);
    for (i, node) in ["fra", "hkg", "cpt"].iter().enumerate() {
        let c = sim.add_client(&format!("sub-{node}"), &id(node), 10);
        sim.at(0, Action::Connect { client: c });
        let qos = if i == 1 {
            QoS::ExactlyOnce
        } else {
            QoS::AtLeastOnce
        };
        sim.at(
            100,
            Action::Subscribe {
                client: c,
                filter: format!("geo/{node}/#"),
                qos,
            },
        );
        sim.at(
            100,
            Action::Subscribe {
                client: c,
                filter: "all/+".into(),
                qos,
            },
        );
    }
    let publisher = sim.add_client("pub", &id("cpt"), 10);
    sim.at(0, Action::Connect { client: publisher });
    for k in 0..60u64 {
        let at = 2_000 + k * 50;
        let topic = ["geo/fra/x", "geo/hkg/y", "all/z"][(k % 3) as usize].to_string();
        let qos = if k % 2 == 0 {
            QoS::AtLeastOnce
        } else {
            QoS::ExactlyOnce
        };
        let payload = Bytes::from(k.to_be_bytes().to_vec());
        sim.at(
            at,
            Action::Publish {
                client: publisher,
                topic,
                payload,
                qos,
                // Every fifth message is retained: retained state must agree everywhere.
                retain: k % 5 == 0,
            },
        );
    }
    if faults {
        // A cut between the publisher's node and another, healed later.
        let other = if rng.up_to(1) == 0 { "fra" } else { "hkg" };
        let cut_at = 2_000 + rng.up_to(1_500);
        sim.at(
            cut_at,
            Action::Cut {
                a: id("cpt"),
                b: id(other),
            },
        );
        sim.at(
            cut_at + 500 + rng.up_to(3_000),
            Action::Heal {
                a: id("cpt"),
                b: id(other),
            },
        );
    }
    sim.run_until(60_000, |_| {});
    sim
}

/// What each subscriber received, as publish indices, dropping DUP re-sends of QoS 1.
fn received(sim: &Sim) -> BTreeMap<String, Vec<(u64, bool)>> {
    sim.clients
        .iter()
        .filter(|c| c.name.starts_with("sub-"))
        .map(|c| {
            let got = c
                .received
                .iter()
                .map(|r| {
                    (
                        u64::from_be_bytes(r.payload[..8].try_into().unwrap()),
                        r.dup,
                    )
                })
                .collect();
            (c.name.clone(), got)
        })
        .collect()
}

fn check(seed: u64, sim: &Sim) {
    assert!(
        sim.routes_converged(),
        "seed {seed}: route sets differ at quiescence"
    );
    let digests: Vec<_> = sim
        .node_ids()
        .iter()
        .map(|n| sim.broker(n).unwrap().retained_digest().unwrap())
        .collect();
    assert!(
        digests.windows(2).all(|w| w[0] == w[1]),
        "seed {seed}: retained state differs between nodes: {digests:?}"
    );
    assert_eq!(
        digests[0].entries, 3,
        "seed {seed}: one retained message per topic"
    );
    let publisher = sim.clients.iter().find(|c| c.name == "pub").unwrap();
    let acked: Vec<u64> = publisher
        .acknowledged
        .iter()
        .map(|p| u64::from_be_bytes(p[..8].try_into().unwrap()))
        .collect();
    assert_eq!(acked.len(), 60, "seed {seed}: every publish acknowledged");
    for (name, got) in received(sim) {
        let node = name.trim_start_matches("sub-");
        let wanted: Vec<u64> = acked
            .iter()
            .copied()
            .filter(|k| {
                let topic = ["geo/fra/x", "geo/hkg/y", "all/z"][(*k % 3) as usize];
                topic == "all/z" || topic.starts_with(&format!("geo/{node}/"))
            })
            .collect();
        let firsts: Vec<u64> = {
            let mut seen = std::collections::BTreeSet::new();
            got.iter()
                .filter(|(k, _)| seen.insert(*k))
                .map(|(k, _)| *k)
                .collect()
        };
        assert_eq!(
            firsts, wanted,
            "seed {seed}: {name} must get every acknowledged message, in order"
        );
        // QoS 2 (the hkg subscriber has QoS 2 subscriptions): never a second non-DUP copy.
        if node == "hkg" {
            let odd: Vec<u64> = got
                .iter()
                .filter(|(k, dup)| k % 2 == 1 && !dup)
                .map(|(k, _)| *k)
                .collect();
            let mut dedup = odd.clone();
            dedup.dedup();
            assert_eq!(odd, dedup, "seed {seed}: QoS 2 delivered twice to {name}");
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    for seed in [1, 2, 3] {
        let a = run(seed, true).trace_hash();
        let b = run(seed, true).trace_hash();
        assert_eq!(a, b, "seed {seed}: two runs differ");
    }
    assert_ne!(
        run(1, true).trace_hash(),
        run(2, true).trace_hash(),
        "seeds matter"
    );
}

#[test]
fn without_faults_everything_arrives() {
    let sim = run(7, false);
    check(7, &sim);
}

/// The seeds a sweep runs: `SIM_SEEDS` of them (else `default`) from `SIM_SEED_BASE`.
fn sweep(default: u64) -> std::ops::Range<u64> {
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    let base: u64 = std::env::var("SIM_SEED_BASE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6d65_7269);
    base..base + seeds
}

#[test]
fn invariants_hold_across_random_seeds_with_faults() {
    for seed in sweep(20) {
        let sim = run(seed, true);
        // The seed is in every assertion message; print it too for panics elsewhere.
        eprintln!("sim seed {seed}: {} events", sim.trace_hash() & 0xffff);
        check(seed, &sim);
    }
}

#[test]
fn geo_writeup_scenarios_answer_locally_and_converge() {
    for row in meridian_core::sim::geo_writeup(1) {
        // Correctness, not timing: every client got its SUBACK and every region learned every
        // filter. (The numbers themselves go to docs/geo.md, measured by `meridian sim`.)
        assert_ne!(
            row.all_subacks_ms,
            u64::MAX,
            "{} clients on {}: a SUBACK is missing",
            row.clients,
            row.filter
        );
        assert_ne!(
            row.routes_converged_ms,
            u64::MAX,
            "{} clients on {}: routes never converged",
            row.clients,
            row.filter
        );
        eprintln!(
            "{:>5} x {:<24} subacks {:>5} ms  routes {:>5} ms",
            row.clients, row.filter, row.all_subacks_ms, row.routes_converged_ms
        );
    }
}

#[test]
fn a_60s_partition_under_qos1_loses_and_duplicates_nothing() {
    let report = meridian_core::sim::region_partition().run(5).unwrap();
    let qos1 = report
        .delivery
        .iter()
        .find(|r| r.qos == QoS::AtLeastOnce)
        .expect("QoS 1 row");
    eprintln!("{qos1:?}");
    assert_eq!(qos1.published, 2_700);
    assert_eq!(
        qos1.acknowledged, qos1.published,
        "publishers are answered locally, partition or not"
    );
    assert_eq!(
        qos1.expected,
        3 * 2_700,
        "every subscriber wants every message"
    );
    assert_eq!(
        qos1.lost, 0,
        "outboxes hold the messages through the partition"
    );
    assert_eq!(qos1.delivered, qos1.expected);
    assert_eq!(
        qos1.duplicated, 0,
        "the link is exactly once, and no session was cut"
    );
    assert!(
        report
            .subscribe
            .as_ref()
            .unwrap()
            .routes_converged_ms
            .is_some(),
        "routes agree again after the heal"
    );
    let kinds: Vec<_> = report
        .timeline
        .events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                meridian_core::sim::TimelineKind::LinkDown { .. }
                    | meridian_core::sim::TimelineKind::LinkUp { .. }
            )
        })
        .collect();
    assert_eq!(kinds.len(), 4, "two links cut, two healed");
}

#[test]
fn cross_region_messages_all_arrive() {
    let report = meridian_core::sim::cross_region_latency().run(1).unwrap();
    for row in &report.delivery {
        assert_eq!(row.lost, 0, "{row:?}");
        assert_eq!(row.duplicated, 0, "{row:?}");
        assert_eq!(row.expected, 3 * 100, "{row:?}");
    }
    let pairs: Vec<(&str, &str)> = report
        .latency
        .iter()
        .map(|r| (r.from_region.as_str(), r.to_region.as_str()))
        .collect();
    assert_eq!(
        pairs,
        vec![
            ("ap-east", "af-south"),
            ("ap-east", "ap-east"),
            ("ap-east", "eu-central")
        ]
    );
}

#[test]
fn the_fence_closes_the_window_after_suback() {
    let off = meridian_core::sim::subscribe_fence(false).run(1).unwrap();
    let on = meridian_core::sim::subscribe_fence(true).run(1).unwrap();
    let lost = |r: &meridian_core::sim::Report| r.delivery[0].lost;
    assert!(
        lost(&off) > 0,
        "without the fence, messages published right after the SUBACK elsewhere are missed"
    );
    assert_eq!(lost(&on), 0, "with the fence, none is");
    assert!(on.delivery[0].expected > 0);
    assert_eq!(on.subscribe.as_ref().unwrap().missing_subacks, 0);
}

#[test]
fn a_scenario_with_a_bad_reference_is_refused_naming_the_field() {
    let mut s = meridian_core::sim::cross_region_latency();
    s.clients[1].node = "nowhere".into();
    let e = s.run(1).unwrap_err();
    assert_eq!(e.field, "clients[1].node");
    let mut s = meridian_core::sim::cross_region_latency();
    s.rtt_ms[0][1] = 7;
    assert_eq!(s.run(1).unwrap_err().field, "rtt_ms[0][1]");
}

/// fra (eu), hkg (ap) and cpt (af), `rtt_ms` apart with a quarter of it as jitter; gossip
/// loses a fifth of its frames and duplicates a tenth.
fn three_regions(seed: u64, rtt_ms: u64) -> Sim {
    let link = move |_: &str, _: &str| LinkSpec {
        rtt_ms,
        jitter_ms: rtt_ms / 4,
        gossip_loss_ppm: 200_000,
        gossip_dup_ppm: 100_000,
    };
    Sim::new(
        seed,
        Config::default(),
        &[("fra", "eu"), ("hkg", "ap"), ("cpt", "af")],
        link,
        |c| c.digest_interval_ms = 1_000,
    )
}

/// A client with a persistent QoS 2 subscription roams fra → hkg → fra while a publisher in
/// cpt sends QoS 1 and 2 messages every 25 ms throughout: some reach fra on the connection the
/// client just left (in flight when it moves), some reach the old node after the session left
/// (relayed), some come both ways while the routes move. Links jitter; gossip loses and
/// duplicates route deltas.
fn roaming(seed: u64) -> Sim {
    roaming_with(seed, false, 25)
}

/// [`roaming`], the client dropping its connection before it moves (`drop_first`), the
/// publisher sending every `every_ms`.
fn roaming_with(seed: u64, drop_first: bool, every_ms: u64) -> Sim {
    roaming_on(seed, drop_first, every_ms, 160)
}

/// [`roaming_with`] on links of `rtt_ms` (a quarter of it as jitter).
fn roaming_on(seed: u64, drop_first: bool, every_ms: u64, rtt_ms: u64) -> Sim {
    let mut sim = three_regions(seed, rtt_ms);
    let roamer = sim.add_client("roamer", &id("fra"), 10);
    sim.at(
        0,
        Action::ConnectAndSubscribe {
            client: roamer,
            filter: "fleet/#".into(),
            qos: QoS::ExactlyOnce,
        },
    );
    let publisher = sim.add_client("pub", &id("cpt"), 10);
    sim.at(0, Action::Connect { client: publisher });
    for k in 0..ROAMING_MESSAGES {
        let qos = if k.is_multiple_of(2) {
            QoS::AtLeastOnce
        } else {
            QoS::ExactlyOnce
        };
        sim.at(
            ROAMING_START_MS + k * every_ms,
            Action::Publish {
                client: publisher,
                topic: "fleet/x".into(),
                payload: Bytes::from(k.to_be_bytes().to_vec()),
                qos,
                retain: false,
            },
        );
    }
    let mut rng = meridian_core::sim::Rng::new(seed ^ 0x70a3);
    let span = ROAMING_MESSAGES * every_ms;
    for (at, node) in [
        (ROAMING_START_MS + span / 4, "hkg"),
        (ROAMING_START_MS + span * 5 / 8, "fra"),
    ] {
        let at = at + rng.up_to(span / 10);
        if drop_first {
            sim.at(at, Action::Drop { client: roamer });
        }
        sim.at(
            at + u64::from(drop_first) * rng.up_to(100),
            Action::Roam {
                client: roamer,
                node: id(node),
            },
        );
    }
    sim.run_until(45_000, |_| {});
    sim
}

const ROAMING_MESSAGES: u64 = 320;

/// What `client` received (message number, DUP), checked: every one of the
/// [`ROAMING_MESSAGES`] at least once, and none of the QoS 2 ones (odd numbers) twice but as a
/// re-send.
fn each_once(seed: u64, client: &meridian_core::sim::SimClient) -> Vec<(u64, bool)> {
    let got: Vec<(u64, bool)> = client
        .received
        .iter()
        .map(|r| {
            (
                u64::from_be_bytes(r.payload[..8].try_into().unwrap()),
                r.dup,
            )
        })
        .collect();
    let distinct: std::collections::BTreeSet<u64> = got.iter().map(|(k, _)| *k).collect();
    let missing: Vec<u64> = (0..ROAMING_MESSAGES)
        .filter(|k| !distinct.contains(k))
        .collect();
    assert!(missing.is_empty(), "seed {seed}: lost {missing:?}");
    let mut fresh = std::collections::BTreeMap::new();
    for (k, dup) in &got {
        if !dup && k % 2 == 1 {
            *fresh.entry(*k).or_insert(0) += 1;
        }
    }
    let twice: Vec<u64> = fresh
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(k, _)| k)
        .collect();
    assert!(
        twice.is_empty(),
        "seed {seed}: QoS 2 delivered twice: {twice:?}"
    );
    got
}
/// Publishing starts once the subscriber's route reached the publisher's node, lossy gossip
/// (and its anti-entropy every second) included.
const ROAMING_START_MS: u64 = 6_000;

#[test]
fn a_roaming_client_gets_every_message_once() {
    let (mut resent, mut relayed, mut twice, mut out_of_order) = (0, 0, 0, 0);
    let seeds = sweep(30);
    let count = seeds.end - seeds.start;
    for seed in seeds {
        eprintln!("sim seed {seed}: roaming");
        let sim = match seed % 4 {
            0 => roaming(seed),
            1 => roaming_with(seed, true, 25),
            2 => roaming_with(seed, true, 3),
            // Nodes of one region: a move takes a few milliseconds.
            _ => roaming_on(seed, true, 1, 4),
        };
        let publisher = sim.clients.iter().find(|c| c.name == "pub").unwrap();
        assert_eq!(
            publisher.acknowledged.len() as u64,
            ROAMING_MESSAGES,
            "seed {seed}: all acknowledged"
        );
        let roamer = sim.clients.iter().find(|c| c.name == "roamer").unwrap();
        assert_eq!(roamer.node, id("fra"), "seed {seed}: back where it started");
        let got = each_once(seed, roamer);
        resent += got.iter().filter(|(_, dup)| *dup).count();
        let mut seen = std::collections::BTreeSet::new();
        let firsts: Vec<u64> = got
            .iter()
            .filter(|(k, _)| seen.insert(*k))
            .map(|(k, _)| *k)
            .collect();
        let late: Vec<u64> = firsts
            .windows(2)
            .filter(|w| w[1] < w[0])
            .map(|w| w[1])
            .collect();
        assert!(late.is_empty(), "seed {seed}: out of order: {late:?}");
        out_of_order += late.len();
        for node in sim.node_ids() {
            let b = sim.broker(&node).unwrap();
            relayed += b.stats().messages_relayed;
            twice += b.stats().dropped_moved_twice;
            assert_eq!(
                b.claim_owner("roamer"),
                Some(id("fra")),
                "seed {seed}: {node} agrees who serves it"
            );
            let want = usize::from(node == id("fra") || node == id("cpt"));
            assert_eq!(b.stats().sessions, want, "seed {seed}: sessions on {node}");
            assert_eq!(b.sessions_in_transit(), 0, "seed {seed}: {node}");
        }
        let hkg = sim.broker(&id("hkg")).unwrap();
        assert_eq!(
            hkg.stats().subscriptions,
            0,
            "seed {seed}: hkg's relay ended"
        );
    }
    eprintln!(
        "{count} seeds: {resent} re-sent in flight, {relayed} relayed, {twice} came twice, \
         {out_of_order} arrived before an earlier one"
    );
    assert!(resent > 0, "no message was in flight when the client moved");
    assert!(relayed > 0, "no message was relayed");
    assert!(twice > 0, "no message came both ways");
}

/// A region is cut off while it holds a session with a will; the client moves to another
/// region during the cut (dropping its connection first, or leaving it open), and messages
/// for it are published all along.
fn cut_off_while_holding(seed: u64) -> Sim {
    let mut sim = three_regions(seed, 160);
    let watcher = sim.add_client("watcher", &id("cpt"), 10);
    sim.at(
        0,
        Action::ConnectAndSubscribe {
            client: watcher,
            filter: "wills/#".into(),
            qos: QoS::AtLeastOnce,
        },
    );
    let roamer = sim.add_client("roamer", &id("fra"), 10);
    sim.clients[roamer].will = Some(("wills/roamer".into(), Bytes::from_static(b"gone")));
    sim.at(
        0,
        Action::ConnectAndSubscribe {
            client: roamer,
            filter: "fleet/#".into(),
            qos: QoS::ExactlyOnce,
        },
    );
    let publisher = sim.add_client("pub", &id("cpt"), 10);
    sim.at(0, Action::Connect { client: publisher });
    for k in 0..ROAMING_MESSAGES {
        let qos = if k.is_multiple_of(2) {
            QoS::AtLeastOnce
        } else {
            QoS::ExactlyOnce
        };
        sim.at(
            ROAMING_START_MS + k * 25,
            Action::Publish {
                client: publisher,
                topic: "fleet/x".into(),
                payload: Bytes::from(k.to_be_bytes().to_vec()),
                qos,
                retain: false,
            },
        );
    }
    let mut rng = meridian_core::sim::Rng::new(seed ^ 0xc07);
    let cut = ROAMING_START_MS + 1_000 + rng.up_to(2_000);
    for other in ["hkg", "cpt"] {
        sim.at(
            cut,
            Action::Cut {
                a: id("fra"),
                b: id(other),
            },
        );
        sim.at(
            cut + 3_000 + rng.up_to(4_000),
            Action::Heal {
                a: id("fra"),
                b: id(other),
            },
        );
    }
    let roam = cut + 200 + rng.up_to(1_000);
    if seed.is_multiple_of(2) {
        sim.at(roam, Action::Drop { client: roamer });
    }
    sim.at(
        roam + 50,
        Action::Roam {
            client: roamer,
            node: id("hkg"),
        },
    );
    sim.run_until(60_000, |_| {});
    sim
}

#[test]
fn a_region_cut_off_while_it_holds_a_session_loses_nothing_and_fires_one_will() {
    for seed in sweep(30) {
        eprintln!("sim seed {seed}: cut off while holding a session");
        let sim = cut_off_while_holding(seed);
        let publisher = sim.clients.iter().find(|c| c.name == "pub").unwrap();
        assert_eq!(
            publisher.acknowledged.len() as u64,
            ROAMING_MESSAGES,
            "seed {seed}: every publish acknowledged, cut or not"
        );
        let roamer = sim.clients.iter().find(|c| c.name == "roamer").unwrap();
        each_once(seed, roamer);
        let watcher = sim.clients.iter().find(|c| c.name == "watcher").unwrap();
        let wills = watcher
            .received
            .iter()
            .filter(|r| r.topic == "wills/roamer" && !r.dup)
            .count();
        assert_eq!(
            wills, 1,
            "seed {seed}: one will, from the node that held the session"
        );
        for node in sim.node_ids() {
            let b = sim.broker(&node).unwrap();
            assert_eq!(
                b.claim_owner("roamer"),
                Some(id("hkg")),
                "seed {seed}: {node} agrees who serves it"
            );
            assert_eq!(b.sessions_in_transit(), 0, "seed {seed}: {node}");
        }
        assert_eq!(
            sim.broker(&id("fra")).unwrap().stats().subscriptions,
            0,
            "seed {seed}"
        );
    }
}

/// One client id connects in two regions at the same moment, each connection subscribing to
/// its own filter; then messages for both filters are published.
#[test]
fn one_client_id_connecting_in_two_regions_at_once_ends_with_one_owner() {
    for seed in sweep(30) {
        eprintln!("sim seed {seed}: one client id in two regions");
        let mut sim = three_regions(seed, 160);
        let mut rng = meridian_core::sim::Rng::new(seed ^ 0x7);
        let mut twins = Vec::new();
        for (node, filter) in [("fra", "twin/a"), ("hkg", "twin/b")] {
            let c = sim.add_client("twin", &id(node), 10);
            sim.at(
                1_000 + rng.up_to(100),
                Action::ConnectAndSubscribe {
                    client: c,
                    filter: filter.into(),
                    qos: QoS::ExactlyOnce,
                },
            );
            twins.push(c);
        }
        let publisher = sim.add_client("pub", &id("cpt"), 10);
        sim.at(0, Action::Connect { client: publisher });
        for k in 0..200u64 {
            sim.at(
                ROAMING_START_MS + k * 25,
                Action::Publish {
                    client: publisher,
                    topic: if k.is_multiple_of(2) {
                        "twin/a"
                    } else {
                        "twin/b"
                    }
                    .into(),
                    payload: Bytes::from(k.to_be_bytes().to_vec()),
                    qos: QoS::ExactlyOnce,
                    retain: false,
                },
            );
        }
        sim.run_until(30_000, |_| {});
        let owners: Vec<_> = sim
            .node_ids()
            .iter()
            .map(|n| sim.broker(n).unwrap().claim_owner("twin"))
            .collect();
        assert!(
            owners.windows(2).all(|w| w[0] == w[1]) && owners[0].is_some(),
            "seed {seed}: one owner everywhere: {owners:?}"
        );
        let connected: Vec<usize> = twins
            .iter()
            .copied()
            .filter(|c| sim.clients[*c].conn.is_some())
            .collect();
        assert_eq!(connected.len(), 1, "seed {seed}: the other was taken over");
        let winner = &sim.clients[connected[0]];
        assert_eq!(Some(winner.node.clone()), owners[0], "seed {seed}");
        let got: Vec<u64> = winner
            .received
            .iter()
            .filter(|r| !r.dup)
            .map(|r| u64::from_be_bytes(r.payload[..8].try_into().unwrap()))
            .collect();
        assert_eq!(
            got,
            (0..200).collect::<Vec<_>>(),
            "seed {seed}: both subscriptions joined, every message once, in order"
        );
    }
}
