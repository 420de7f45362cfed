//! Data residency across nodes: a rule's topics reach only the regions it names — messages,
//! retained messages and the subscriptions that ask for them.

mod common;

use common::mesh::{Mesh, id};
use common::*;
use meridian_core::codec::{Packet, QoS, SubscriptionOptions};
use meridian_core::link::Frame;
use meridian_core::residency::{Residency, ResidencyRule};
use meridian_core::{Config, ConnId, Timestamp};

/// Nodes `eu1`, `eu2` and `us` (each its own region, `region-NAME`), with `health/#` kept in
/// the two European regions.
fn three() -> Mesh {
    let mut mesh = Mesh::new(&["eu1", "eu2", "us"], Config::default(), |_| {});
    apply(&mut mesh, &[("health/#", &["region-eu1", "region-eu2"])]);
    mesh
}

/// Publish `n` (QoS 1) on `topic` from `conn` at `node`, and let it travel.
fn publish_number(mesh: &mut Mesh, node: &str, conn: ConnId, topic: &str, n: u32, retain: bool) {
    let packet_id = u16::try_from(n + 1).unwrap();
    mesh.node(node).publish(
        conn,
        topic,
        &n.to_be_bytes(),
        QoS::AtLeastOnce,
        retain,
        packet_id,
    );
    mesh.settle();
}

/// Whether node `at` knows of `of`'s subscription to `filter` (replicated or scoped).
fn knows(mesh: &mut Mesh, at: &str, of: &str, filter: &str) -> bool {
    mesh.node(at)
        .broker
        .replicated_routes(&id(of))
        .iter()
        .any(|f| f == filter)
}

/// Subscribe to `filter` at `node`; the retained messages that came, as numbers.
fn retained_for(mesh: &mut Mesh, node: &str, client: &str, filter: &str) -> Vec<u32> {
    let w = mesh.node(node);
    let conn = w.connect(V5, client);
    let options = SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        ..Default::default()
    };
    let mut got: Vec<u32> = w
        .subscribe_collect(conn, filter, options)
        .into_iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(u32::from_be_bytes(p.payload[..4].try_into().unwrap())),
            _ => None,
        })
        .collect();
    got.sort();
    got
}

fn apply(mesh: &mut Mesh, rules: &[(&str, &[&str])]) {
    let residency = Residency::new(
        rules
            .iter()
            .map(|(f, regions)| ResidencyRule::new(f, regions.iter().copied()).unwrap())
            .collect(),
    );
    for n in ["eu1", "eu2", "us"] {
        let w = mesh.node(n);
        w.broker.set_residency(Timestamp(w.now), residency.clone());
    }
    mesh.advance(50);
}

#[test]
fn messages_under_a_rule_reach_only_its_regions() {
    let mut mesh = three();
    let eu = mesh.node("eu2").connect(V5, "eu-sub");
    mesh.node("eu2").subscribe(eu, "#", QoS::AtLeastOnce);
    let us = mesh.node("us").connect(V5, "us-sub");
    mesh.node("us").subscribe(us, "#", QoS::AtLeastOnce);
    mesh.advance(50);

    let publisher = mesh.node("eu1").connect(V5, "pub");
    for (i, topic) in ["health/p1", "news/today", "health/p2"].iter().enumerate() {
        publish_number(&mut mesh, "eu1", publisher, topic, i as u32, false);
    }
    assert_eq!(mesh.node("eu2").read_numbers(eu), vec![0, 1, 2]);
    assert_eq!(
        mesh.node("us").read_numbers(us),
        vec![1],
        "only the news crossed"
    );
    let stats = mesh.node("eu1").broker.stats();
    assert_eq!(
        stats.residency_withheld, 2,
        "kept home, counted where published"
    );
    assert_eq!(mesh.node("us").broker.stats().residency_withheld, 0);

    // Published in a region the rule does not name: it still goes to those it names only.
    let p2 = mesh.node("us").connect(V5, "pub-us");
    mesh.node("us").publish(
        p2,
        "health/p3",
        &7u32.to_be_bytes(),
        QoS::AtMostOnce,
        false,
        0,
    );
    mesh.settle();
    assert_eq!(mesh.node("eu2").read_numbers(eu), vec![7]);
    assert_eq!(
        mesh.node("us").read_numbers(us),
        vec![7],
        "its own subscriber, locally"
    );
}

#[test]
fn a_subscription_inside_a_rule_is_advertised_to_its_regions_only() {
    let mut mesh = three();
    let eu = mesh.node("eu1").connect(V5, "eu-sub");
    mesh.node("eu1")
        .subscribe(eu, "health/+/heart", QoS::AtLeastOnce);
    mesh.node("eu1").subscribe(eu, "#", QoS::AtLeastOnce);
    mesh.advance(50);
    let filter = "health/+/heart".to_owned();
    assert!(knows(&mut mesh, "eu2", "eu1", &filter));
    assert!(
        !knows(&mut mesh, "us", "eu1", &filter),
        "never advertised to us"
    );
    assert_eq!(
        mesh.node("us").broker.replicated_routes(&id("eu1")),
        vec!["#".to_owned()]
    );
    assert_eq!(
        mesh.node("eu2").broker.nodes_for("health/p1/heart"),
        vec![id("eu1")]
    );
    // The route set every node replicates does not hold it; eu1 lists it as its own.
    assert!(mesh.node("eu1").broker.route_set().contains(&filter));

    // Gone when the subscriber goes.
    mesh.node("eu1").unsubscribe(eu, "health/+/heart");
    mesh.advance(50);
    assert!(!knows(&mut mesh, "eu2", "eu1", &filter));
}

#[test]
fn retained_messages_under_a_rule_stay_in_its_regions() {
    let mut mesh = three();
    let publisher = mesh.node("eu1").connect(V5, "pub");
    publish_number(&mut mesh, "eu1", publisher, "health/p1", 1, true);
    publish_number(&mut mesh, "eu1", publisher, "news/x", 2, true);
    assert_eq!(retained_for(&mut mesh, "eu2", "late-eu", "#"), vec![1, 2]);
    assert_eq!(retained_for(&mut mesh, "us", "late-us", "#"), vec![2]);
    assert_eq!(mesh.node("eu1").broker.stats().residency_withheld, 1);

    // A node that was away gets the retained snapshot of its region only.
    mesh.link_down(&id("eu1"), &id("us"));
    mesh.link_down(&id("eu2"), &id("us"));
    publish_number(&mut mesh, "eu1", publisher, "health/p2", 3, true);
    mesh.link_up(&id("eu1"), &id("us"));
    mesh.link_up(&id("eu2"), &id("us"));
    mesh.advance(2_000);
    assert_eq!(retained_for(&mut mesh, "us", "later-us", "#"), vec![2]);
    assert_eq!(
        retained_for(&mut mesh, "eu2", "later-eu", "health/#"),
        vec![1, 3]
    );
}

#[test]
fn a_change_of_rules_rescopes_what_was_advertised() {
    let mut mesh = Mesh::new(&["eu1", "eu2", "us"], Config::default(), |_| {});
    let eu = mesh.node("eu1").connect(V5, "eu-sub");
    mesh.node("eu1").subscribe(eu, "health/#", QoS::AtLeastOnce);
    mesh.advance(50);
    let filter = "health/#".to_owned();
    assert!(knows(&mut mesh, "us", "eu1", &filter));

    // A rule now holds it: withdrawn from us at once, still known in eu2. A message
    // published in us finds no subscriber there to go to.
    apply(&mut mesh, &[("health/#", &["region-eu1", "region-eu2"])]);
    assert!(!knows(&mut mesh, "us", "eu1", &filter));
    assert!(knows(&mut mesh, "eu2", "eu1", &filter));
    let publisher = mesh.node("us").connect(V5, "pub");
    publish_number(&mut mesh, "us", publisher, "health/p1", 1, false);
    assert_eq!(mesh.node("eu1").read_numbers(eu), Vec::<u32>::new());
    let p1 = mesh.node("eu2").connect(V5, "pub1");
    publish_number(&mut mesh, "eu2", p1, "health/p1", 1, false);
    assert_eq!(mesh.node("eu1").read_numbers(eu), vec![1], "eu2 does");

    // Narrowed to eu2's region only: eu1's own subscription is advertised nowhere, and
    // messages published at eu2 do not reach it.
    apply(&mut mesh, &[("health/#", &["region-eu2"])]);
    assert!(!knows(&mut mesh, "eu2", "eu1", &filter));
    let p2 = mesh.node("eu2").connect(V5, "pub2");
    publish_number(&mut mesh, "eu2", p2, "health/p1", 2, false);
    assert_eq!(mesh.node("eu1").read_numbers(eu), Vec::<u32>::new());

    // No rule: back in the replicated route set, everywhere.
    apply(&mut mesh, &[]);
    for n in ["eu2", "us"] {
        assert!(knows(&mut mesh, n, "eu1", &filter), "{n}");
    }
}

#[test]
fn a_peer_speaks_for_its_own_scoped_filters_within_its_bounds() {
    let mut mesh = Mesh::new(&["eu1", "eu2", "us"], Config::default(), |c| {
        c.peer_limits.max_filters = 3;
    });
    // Malformed filters are left out; the rest replace what the peer sent before.
    mesh.inject(
        "eu1",
        "eu2",
        Frame::ScopedRoutes {
            filters: vec!["a/+".into(), "bad/#/x".into()],
        },
    );
    assert_eq!(
        mesh.node("eu2").broker.replicated_routes(&id("eu1")),
        vec!["a/+".to_owned()]
    );
    mesh.inject("eu1", "eu2", Frame::ScopedRoutes { filters: vec![] });
    assert!(
        mesh.node("eu2")
            .broker
            .replicated_routes(&id("eu1"))
            .is_empty()
    );
    // Past the peer's filter bound: refused, nothing taken.
    let before = mesh.node("eu2").broker.stats().peer_frames_over_limit;
    mesh.inject(
        "eu1",
        "eu2",
        Frame::ScopedRoutes {
            filters: (0..4).map(|i| format!("f/{i}")).collect(),
        },
    );
    assert_eq!(
        mesh.node("eu2").broker.stats().peer_frames_over_limit,
        before + 1
    );
    assert!(
        mesh.node("eu2")
            .broker
            .replicated_routes(&id("eu1"))
            .is_empty()
    );
}

#[test]
fn a_session_that_moves_out_of_the_regions_leaves_their_messages_behind() {
    let mut mesh = three();
    let persistent = |c: &mut meridian_core::codec::Connect| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(3600);
    };
    let old = mesh.node("eu1").connect_with(V5, "dev", persistent).0;
    mesh.node("eu1").subscribe(old, "#", QoS::AtLeastOnce);
    mesh.advance(50);
    mesh.node("eu1").close(old);
    mesh.settle();
    let publisher = mesh.node("eu2").connect(V5, "pub");
    for (i, topic) in ["health/p1", "news/a", "health/p2", "news/b"]
        .iter()
        .enumerate()
    {
        publish_number(&mut mesh, "eu2", publisher, topic, i as u32, false);
    }
    assert_eq!(mesh.node("eu1").broker.stats().queued_messages, 4);

    // The device turns up in the US: its session follows, without the health messages.
    let (conn, ack) = mesh.node("us").connect_with(V5, "dev", persistent);
    assert!(ack.session_present);
    mesh.settle();
    assert_eq!(mesh.node("us").read_numbers(conn), vec![1, 3]);
    assert_eq!(mesh.node("eu1").broker.stats().residency_withheld, 2);
}

#[test]
fn forwards_queued_before_a_rule_do_not_leave_for_other_regions() {
    let mut mesh = Mesh::new(&["eu1", "eu2", "us"], Config::default(), |_| {});
    let us = mesh.node("us").connect(V5, "us-sub");
    mesh.node("us").subscribe(us, "#", QoS::AtLeastOnce);
    mesh.advance(50);
    mesh.link_down(&id("eu1"), &id("us"));
    let publisher = mesh.node("eu1").connect(V5, "pub");
    for (i, topic) in ["health/p1", "news/a"].iter().enumerate() {
        publish_number(&mut mesh, "eu1", publisher, topic, i as u32, false);
    }
    // Queued for us while its link is down; then the rule comes.
    apply(&mut mesh, &[("health/#", &["region-eu1", "region-eu2"])]);
    assert_eq!(mesh.node("eu1").broker.stats().residency_withheld, 1);
    mesh.link_up(&id("eu1"), &id("us"));
    mesh.advance(50);
    assert_eq!(mesh.node("us").read_numbers(us), vec![1], "the news only");
}

#[test]
fn after_a_restart_what_waits_for_an_allowed_region_is_kept() {
    let mut mesh = Mesh::new(&["eu1", "eu2", "us"], Config::default(), |_| {});
    let persistent = |c: &mut meridian_core::codec::Connect| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(3600);
    };
    let sub = mesh.node("eu2").connect_with(V5, "eu-sub", persistent).0;
    mesh.node("eu2")
        .subscribe(sub, "health/#", QoS::AtLeastOnce);
    mesh.advance(50);
    // eu1 restarts while its link to eu2 is down: it knows eu2's routes (stored), not yet its
    // region from a hello — the deployment's record of it says.
    mesh.link_down(&id("eu1"), &id("eu2"));
    mesh.link_down(&id("eu1"), &id("us"));
    mesh.node("eu1").restart();
    let rules = Residency::new(vec![
        ResidencyRule::new("health/#", ["region-eu1", "region-eu2"]).unwrap(),
    ]);
    let w = mesh.node("eu1");
    let now = Timestamp(w.now);
    let b = &mut w.broker;
    b.set_residency(now, rules);
    b.set_node_regions(
        now,
        [("eu2", "region-eu2"), ("us", "region-us")]
            .into_iter()
            .map(|(n, r)| (id(n), r.to_owned()))
            .collect(),
    );
    let publisher = mesh.node("eu1").connect(V5, "pub");
    publish_number(&mut mesh, "eu1", publisher, "health/p1", 5, false);
    assert_eq!(
        mesh.node("eu1").broker.stats().residency_withheld,
        0,
        "queued for eu2"
    );
    mesh.link_up(&id("eu1"), &id("eu2"));
    mesh.link_up(&id("eu1"), &id("us"));
    mesh.advance(50);
    assert_eq!(mesh.node("eu2").read_numbers(sub), vec![5]);
}
