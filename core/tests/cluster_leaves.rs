//! Leaves: nodes that hang off a mesh node (edge objects off their home region) without being
//! members of the mesh. Their interest joins their node's route set, each sees everything
//! wanted elsewhere, and messages cross between the mesh and the leaves only towards interest,
//! exactly once.
//!
//! The deployment in every test: mesh nodes `hub` and `far` (two regions), leaves `edge-eu` and
//! `edge-as` off `hub`.

mod common;

use common::mesh::{Mesh, id};
use common::*;
use meridian_core::broker::LeafScope;
use meridian_core::codec::{Ack, Packet, QoS};
use meridian_core::link::Frame;
use meridian_core::routes::{Owner, RouteChange, RouteDelta, RouteOp};
use meridian_core::{Config, Timestamp};

fn deployment() -> Mesh {
    Mesh::with_leaves(
        &["far", "hub"],
        &[("edge-as", "hub"), ("edge-eu", "hub")],
        Config::default(),
        |_| {},
    )
}

fn payloads(w: &mut World, conn: meridian_core::ConnId) -> Vec<Vec<u8>> {
    let got = w.received_publishes(conn);
    for p in &got {
        w.ack(conn, p);
    }
    got.iter().map(|p| p.payload.to_vec()).collect()
}

/// Two route batches: a leaf's to its hub, then the hub's to the mesh and the other leaves.
fn routes_settle(mesh: &mut Mesh) {
    mesh.advance(100);
    mesh.advance(100);
}

/// How many frames went from `from` to `to`.
fn carried(mesh: &Mesh, from: &str, to: &str) -> usize {
    mesh.carried.get(&(id(from), id(to))).copied().unwrap_or(0)
}

#[test]
fn a_leafs_interest_joins_its_nodes_route_set_and_the_mesh_never_learns_the_leaf() {
    let mut mesh = deployment();
    let sub = mesh.node("edge-eu").connect(V5, "sub");
    mesh.node("edge-eu")
        .subscribe(sub, "news/#", QoS::AtLeastOnce);
    routes_settle(&mut mesh);
    assert!(
        mesh.node("hub")
            .broker
            .route_set()
            .contains(&"news/#".to_owned())
    );
    assert_eq!(
        mesh.node("far").broker.replicated_routes(&id("hub")),
        ["news/#"]
    );
    assert!(
        mesh.node("far")
            .broker
            .peers()
            .iter()
            .all(|p| p.node != id("edge-eu"))
    );
    assert!(
        mesh.node("far")
            .broker
            .replicated_routes(&id("edge-eu"))
            .is_empty()
    );
    // The other leaf sees it as the hub's; the leaf itself does not see its own interest.
    assert_eq!(
        mesh.node("edge-as").broker.replicated_routes(&id("hub")),
        ["news/#"]
    );
    assert!(
        mesh.node("edge-eu")
            .broker
            .replicated_routes(&id("hub"))
            .is_empty()
    );
    let hub_peers = mesh.node("hub").broker.peers();
    assert!(hub_peers.iter().any(|p| p.node == id("edge-eu") && p.leaf));
    assert!(hub_peers.iter().any(|p| p.node == id("far") && !p.leaf));

    // Gone from the leaf, gone everywhere.
    mesh.node("edge-eu").unsubscribe(sub, "news/#");
    routes_settle(&mut mesh);
    assert!(
        mesh.node("far")
            .broker
            .replicated_routes(&id("hub"))
            .is_empty()
    );
    assert!(
        mesh.node("edge-as")
            .broker
            .replicated_routes(&id("hub"))
            .is_empty()
    );
}

#[test]
fn each_leaf_sees_what_the_mesh_and_the_other_leaves_want() {
    let mut mesh = deployment();
    let far = mesh.node("far").connect(V5, "far-sub");
    mesh.node("far").subscribe(far, "far/#", QoS::AtLeastOnce);
    let hub = mesh.node("hub").connect(V5, "hub-sub");
    mesh.node("hub").subscribe(hub, "hub/#", QoS::AtLeastOnce);
    let asia = mesh.node("edge-as").connect(V5, "as-sub");
    mesh.node("edge-as")
        .subscribe(asia, "as/#", QoS::AtLeastOnce);
    routes_settle(&mut mesh);
    assert_eq!(
        mesh.node("edge-eu").broker.replicated_routes(&id("hub")),
        ["as/#", "far/#", "hub/#"]
    );
    assert_eq!(
        mesh.node("edge-as").broker.replicated_routes(&id("hub")),
        ["far/#", "hub/#"]
    );
    // The mesh sees the hub's local and leaf interest, not its own coming back.
    assert_eq!(
        mesh.node("far").broker.replicated_routes(&id("hub")),
        ["as/#", "hub/#"]
    );
}

#[test]
fn messages_cross_between_the_mesh_and_the_leaves_exactly_once() {
    let mut mesh = deployment();
    let eu = mesh.node("edge-eu").connect(V5, "eu-sub");
    mesh.node("edge-eu").subscribe(eu, "t/#", QoS::ExactlyOnce);
    let far = mesh.node("far").connect(V3, "far-sub");
    mesh.node("far").subscribe(far, "t/#", QoS::AtLeastOnce);
    routes_settle(&mut mesh);

    // From the far region to the leaf, and from the other leaf to both.
    let far_pub = mesh.node("far").connect(V5, "far-pub");
    mesh.node("far")
        .publish(far_pub, "t/1", b"from far", QoS::ExactlyOnce, false, 1);
    mesh.settle();
    let as_pub = mesh.node("edge-as").connect(V5, "as-pub");
    mesh.node("edge-as")
        .publish(as_pub, "t/2", b"from as", QoS::AtLeastOnce, false, 1);
    mesh.settle();
    let eu_pub = mesh.node("edge-eu").connect(V5, "eu-pub");
    mesh.node("edge-eu")
        .publish(eu_pub, "t/3", b"from eu", QoS::AtLeastOnce, false, 1);
    mesh.settle();
    let eu_got = payloads(mesh.node("edge-eu"), eu);
    assert_eq!(
        eu_got,
        [
            b"from far".to_vec(),
            b"from as".to_vec(),
            b"from eu".to_vec()
        ]
    );
    let far_got = payloads(mesh.node("far"), far);
    assert_eq!(
        far_got,
        [
            b"from far".to_vec(),
            b"from as".to_vec(),
            b"from eu".to_vec()
        ]
    );
    mesh.advance(1_000);
    assert!(
        payloads(mesh.node("edge-eu"), eu).is_empty(),
        "nothing twice"
    );
    assert!(payloads(mesh.node("far"), far).is_empty(), "nothing twice");
    // The leaf's own message came back to it from nowhere: the hub never returns it.
    let hub_peers = mesh.node("hub").broker.peers();
    let to_eu = hub_peers.iter().find(|p| p.node == id("edge-eu")).unwrap();
    assert_eq!(to_eu.forwarded_to, 2, "from far and from as, not its own");
}

#[test]
fn a_topic_nobody_wants_elsewhere_stays_on_its_leaf() {
    let mut mesh = deployment();
    let eu = mesh.node("edge-eu").connect(V5, "eu-sub");
    mesh.node("edge-eu")
        .subscribe(eu, "local/#", QoS::AtLeastOnce);
    routes_settle(&mut mesh);
    let before = carried(&mesh, "edge-eu", "hub");
    let publisher = mesh.node("edge-eu").connect(V5, "eu-pub");
    for i in 1..=5u16 {
        mesh.node("edge-eu")
            .publish(publisher, "local/x", b"stay", QoS::AtLeastOnce, false, i);
    }
    mesh.settle();
    assert_eq!(payloads(mesh.node("edge-eu"), eu).len(), 5);
    assert_eq!(
        carried(&mesh, "edge-eu", "hub"),
        before,
        "nothing crossed to the hub"
    );
    let hub_peers = mesh.node("hub").broker.peers();
    let from_eu = hub_peers.iter().find(|p| p.node == id("edge-eu")).unwrap();
    assert_eq!(from_eu.forwarded_from, 0);
}

#[test]
fn a_leaf_that_links_learns_what_was_wanted_before_it_came_before_its_publishers_are_judged() {
    // What the hub and the mesh wanted long before the leaf linked is in the leaf's view from
    // the start: the view's first digest says so, and the leaf does not take the empty view
    // it has for current (it would keep its publishers' messages to itself until the next
    // route batch).
    let mut mesh = Mesh::new(&["far", "hub"], Config::default(), |_| {});
    let hub = mesh.node("hub").connect(V5, "hub-sub");
    mesh.node("hub").subscribe(hub, "up/#", QoS::AtLeastOnce);
    let far = mesh.node("far").connect(V5, "far-sub");
    mesh.node("far").subscribe(far, "far/#", QoS::AtMostOnce);
    routes_settle(&mut mesh);
    mesh.join_leaf("edge-as", "hub", Config::default(), |_| {});
    mesh.settle();
    let mut known = mesh.node("edge-as").broker.replicated_routes(&id("hub"));
    known.sort();
    assert_eq!(
        known,
        ["far/#", "up/#"],
        "the leaf's copy of its view, no batch later"
    );

    // Its publishers' messages go up: QoS 0 and 1, to the hub's subscriber and the far one.
    let publisher = mesh.node("edge-as").connect(V5, "as-pub");
    mesh.node("edge-as")
        .publish(publisher, "up/0", b"qos 0", QoS::AtMostOnce, false, 0);
    mesh.node("edge-as")
        .publish(publisher, "up/1", b"qos 1", QoS::AtLeastOnce, false, 1);
    mesh.node("edge-as")
        .publish(publisher, "far/0", b"far", QoS::AtMostOnce, false, 0);
    mesh.settle();
    assert_eq!(
        payloads(mesh.node("hub"), hub),
        [b"qos 0".to_vec(), b"qos 1".to_vec()]
    );
    assert_eq!(payloads(mesh.node("far"), far), [b"far".to_vec()]);
}

#[test]
fn a_leaf_held_to_a_scope_touches_nothing_outside_it() {
    // edge-as linked with a credential for sensors/as/#: a hostile leaf (the crate's own
    // broker) subscribes to everything and publishes outside its scope.
    let mut mesh = deployment();
    let now = Timestamp(mesh.node("hub").now);
    let scope = LeafScope::new(["sensors/as/#"], 10).unwrap();
    mesh.node("hub")
        .broker
        .scope_leaf(now, &id("edge-as"), Some(scope));
    let far = mesh.node("far").connect(V5, "far-sub");
    mesh.node("far").subscribe(far, "#", QoS::AtLeastOnce);
    let leaf_sub = mesh.node("edge-as").connect(V5, "as-sub");
    mesh.node("edge-as")
        .subscribe(leaf_sub, "#", QoS::AtLeastOnce);
    mesh.node("edge-as")
        .subscribe(leaf_sub, "sensors/as/+/t", QoS::AtLeastOnce);
    routes_settle(&mut mesh);
    let before = mesh.node("hub").broker.stats().peer_frames_not_owner;
    assert!(before >= 1, "the leaf's # counted");
    // Its # draws nothing to the mesh: the hub wants only what is inside the scope for it.
    let mut wanted = mesh.node("far").broker.replicated_routes(&id("hub"));
    wanted.sort();
    assert_eq!(wanted, ["sensors/as/+/t"]);

    // Towards the leaf: only what is inside its scope, whatever its # says.
    let far_pub = mesh.node("far").connect(V5, "far-pub");
    for (i, topic) in ["secret/x", "sensors/as/1/t", "sensors/eu/1/t"]
        .iter()
        .enumerate()
    {
        mesh.node("far").publish(
            far_pub,
            topic,
            topic.as_bytes(),
            QoS::AtLeastOnce,
            false,
            i as u16 + 1,
        );
    }
    let hub_pub = mesh.node("hub").connect(V5, "hub-pub");
    mesh.node("hub")
        .publish(hub_pub, "secret/y", b"secret/y", QoS::AtMostOnce, false, 0);
    mesh.settle();
    assert_eq!(
        payloads(mesh.node("edge-as"), leaf_sub),
        [b"sensors/as/1/t".to_vec()]
    );

    // From the leaf: only what is inside its scope reaches anyone; the rest is taken and
    // counted, so that nothing waits in the leaf's outbox.
    payloads(mesh.node("far"), far);
    let leaf_pub = mesh.node("edge-as").connect(V5, "as-pub");
    let sent = [
        ("control/far", QoS::AtLeastOnce),
        ("sensors/as/2/t", QoS::AtLeastOnce),
        ("control/far", QoS::ExactlyOnce),
        ("control/far", QoS::AtMostOnce),
        ("sensors/as/3/t", QoS::AtMostOnce),
    ];
    for (i, (topic, qos)) in sent.iter().enumerate() {
        mesh.node("edge-as")
            .publish(leaf_pub, topic, topic.as_bytes(), *qos, false, i as u16 + 1);
        if *qos == QoS::ExactlyOnce {
            mesh.node("edge-as")
                .send(leaf_pub, Packet::PubRel(Ack::new(i as u16 + 1)));
        }
    }
    mesh.settle();
    assert_eq!(
        payloads(mesh.node("far"), far),
        [b"sensors/as/2/t".to_vec(), b"sensors/as/3/t".to_vec()]
    );
    assert_eq!(
        mesh.node("hub").broker.stats().peer_frames_not_owner - before,
        3,
        "each message outside the scope counted"
    );
    let to_hub = mesh.node("edge-as").broker.peers();
    assert_eq!(to_hub[0].outbox_messages, 0, "every forward acknowledged");
}

#[test]
fn a_cut_between_the_hub_and_the_mesh_delays_what_a_leaf_sent_and_never_duplicates_it() {
    let mut mesh = deployment();
    let far = mesh.node("far").connect(V5, "far-sub");
    mesh.node("far").subscribe(far, "up/#", QoS::ExactlyOnce);
    routes_settle(&mut mesh);
    mesh.link_down(&id("hub"), &id("far"));
    let publisher = mesh.node("edge-eu").connect(V5, "eu-pub");
    for i in 1..=3u16 {
        mesh.node("edge-eu")
            .publish(publisher, "up/x", &[i as u8], QoS::ExactlyOnce, false, i);
        mesh.settle();
        mesh.node("edge-eu").recv(publisher);
        mesh.node("edge-eu").send(
            publisher,
            meridian_core::codec::Packet::PubRel(meridian_core::codec::Ack::new(i)),
        );
    }
    mesh.settle();
    assert!(payloads(mesh.node("far"), far).is_empty());
    // The hub crashes with the messages in its outbox, then the link comes back.
    mesh.crash_and_restart("hub");
    mesh.link_up(&id("hub"), &id("far"));
    routes_settle(&mut mesh);
    assert_eq!(
        payloads(mesh.node("far"), far),
        [vec![1u8], vec![2u8], vec![3u8]]
    );
    mesh.advance(1_000);
    assert!(payloads(mesh.node("far"), far).is_empty(), "nothing twice");
    // The hub still knows its leaves after the restart.
    assert!(mesh.node("hub").broker.is_leaf(&id("edge-eu")));
}

#[test]
fn a_leaf_gone_past_its_bound_is_forgotten_by_its_hub_alone() {
    let mut mesh = Mesh::with_leaves(
        &["far", "hub"],
        &[("edge-eu", "hub")],
        Config::default(),
        |c| c.leaf_expiry_ms = 60_000,
    );
    let eu = mesh.node("edge-eu").connect(V5, "eu-sub");
    mesh.node("edge-eu")
        .subscribe(eu, "gone/#", QoS::AtLeastOnce);
    routes_settle(&mut mesh);
    assert_eq!(
        mesh.node("far").broker.replicated_routes(&id("hub")),
        ["gone/#"]
    );
    mesh.link_down(&id("edge-eu"), &id("hub"));
    // A message for it waits at the hub, then is dropped with the leaf.
    let publisher = mesh.node("far").connect(V5, "far-pub");
    mesh.node("far")
        .publish(publisher, "gone/x", b"late", QoS::AtLeastOnce, false, 1);
    mesh.settle();
    mesh.advance(90_000);
    assert!(!mesh.node("hub").broker.is_leaf(&id("edge-eu")));
    assert_eq!(mesh.node("hub").broker.stats().dropped_peer_forgotten, 1);
    assert!(
        mesh.node("far")
            .broker
            .replicated_routes(&id("hub"))
            .is_empty()
    );
    // The mesh heard nothing of it: no announcement, and the far node forgot nobody.
    assert_eq!(mesh.node("far").broker.stats().peers_forgotten, 0);
}

#[test]
fn a_leaf_cannot_speak_for_the_mesh() {
    let mut mesh = deployment();
    mesh.link_down(&id("far"), &id("hub"));
    mesh.inject(
        "edge-eu",
        "hub",
        Frame::Forget {
            node: id("far"),
            incarnation: 1,
            signature: None,
        },
    );
    let hub = mesh.node("hub");
    assert_eq!(hub.broker.stats().peer_frames_not_owner, 1);
    assert!(hub.broker.peers().iter().any(|p| p.node == id("far")));
}

#[test]
fn a_leaf_brings_no_more_interest_than_its_bound() {
    let mut mesh = Mesh::with_leaves(
        &["far", "hub"],
        &[("edge-eu", "hub")],
        Config::default(),
        |c| c.leaf_max_filters = 2,
    );
    let sub = mesh.node("edge-eu").connect(V5, "sub");
    for filter in ["a/#", "b/#"] {
        mesh.node("edge-eu")
            .subscribe(sub, filter, QoS::AtLeastOnce);
    }
    routes_settle(&mut mesh);
    assert_eq!(
        mesh.node("far").broker.replicated_routes(&id("hub")),
        ["a/#", "b/#"]
    );
    // A delta that would take the leaf past its bound: refused, its session cut, and nothing
    // of it reaches the mesh (the session that follows carries the leaf's real two).
    let at = mesh.node("edge-eu").broker.route_position().unwrap();
    let change = |n: u64, filter: &str| RouteChange {
        version: at.version + n,
        filter: filter.into(),
        op: RouteOp::Add,
    };
    let delta = RouteDelta {
        owner: Owner {
            node: id("edge-eu"),
            incarnation: at.incarnation,
        },
        after: at.version,
        changes: vec![change(1, "c/#"), change(2, "d/#")],
        hash: 0,
    };
    mesh.inject("edge-eu", "hub", Frame::RouteDelta(delta));
    let hub = mesh.node("hub").broker.stats();
    assert_eq!(hub.peer_frames_over_limit, 1, "{hub:?}");
    routes_settle(&mut mesh);
    assert_eq!(mesh.node("hub").broker.stats().peer_sessions_cut, 1);
    assert_eq!(
        mesh.node("hub").broker.replicated_routes(&id("edge-eu")),
        ["a/#", "b/#"]
    );
    assert_eq!(
        mesh.node("far").broker.replicated_routes(&id("hub")),
        ["a/#", "b/#"]
    );
}

#[test]
fn a_leaf_is_named_as_one_and_cannot_take_a_members_name_or_its_hubs() {
    use meridian_core::broker::LeafError;
    let mut mesh = deployment();
    let hub = &mut mesh.node("hub").broker;
    let now = Timestamp(0);
    assert_eq!(hub.add_leaf(now, &id("far")), Err(LeafError::NotLeafName));
    assert!(!hub.is_leaf(&id("far")));
    assert_eq!(
        hub.add_leaf(now, &id("edge-eu")),
        Ok(()),
        "a leaf already is one"
    );
    // A hub or a member may carry a leaf's kind of name (an edge object that is a hub does).
    let mut mesh = Mesh::new(&["edge-hub", "edge-far"], Config::default(), |_| {});
    let hub = &mut mesh.node("edge-hub").broker;
    assert_eq!(hub.add_leaf(now, &id("edge-hub")), Err(LeafError::Myself));
    assert_eq!(
        hub.add_leaf(now, &id("edge-far")),
        Err(LeafError::MeshMember)
    );
    assert!(!hub.is_leaf(&id("edge-far")));
}

#[test]
fn a_subscribe_that_would_take_the_route_set_past_its_bound_is_refused() {
    use meridian_core::codec::ReasonCode;
    let mut mesh = Mesh::with_leaves(
        &["far", "hub"],
        &[("edge-eu", "hub")],
        Config::default(),
        |c| c.max_route_filters = 3,
    );
    let granted = vec![ReasonCode(1)];
    let full = vec![ReasonCode::QUOTA_EXCEEDED];
    let eu = mesh.node("edge-eu");
    let a = eu.connect(V5, "a");
    for filter in ["t/1", "t/2", "t/+"] {
        assert_eq!(
            eu.subscribe(a, filter, QoS::AtLeastOnce),
            granted,
            "{filter}"
        );
    }
    assert_eq!(eu.subscribe(a, "t/3", QoS::AtLeastOnce), full);
    // Filters the route set holds already cost nothing: the same one from another client,
    // a shared subscription to it, one unsubscribed to make room.
    let b = eu.connect(V5, "b");
    assert_eq!(eu.subscribe(b, "t/1", QoS::AtLeastOnce), granted);
    assert_eq!(eu.subscribe(b, "$share/g/t/2", QoS::AtLeastOnce), granted);
    eu.unsubscribe(a, "t/+");
    assert_eq!(eu.subscribe(a, "t/3", QoS::AtLeastOnce), granted);
    assert_eq!(eu.broker.stats().subscriptions_route_set_full, 1);
    routes_settle(&mut mesh);

    // The hub's route set holds its leaf's three filters: a new one of its own is refused, one
    // its leaf wants is not, and the leaf's stay taken past the bound.
    let hub = mesh.node("hub");
    assert_eq!(hub.broker.route_set().len(), 3);
    let h = hub.connect(V5, "h");
    assert_eq!(hub.subscribe(h, "x", QoS::AtLeastOnce), full);
    assert_eq!(hub.subscribe(h, "t/3", QoS::AtLeastOnce), granted);
    let eu = mesh.node("edge-eu");
    eu.unsubscribe(b, "t/1");
    eu.unsubscribe(a, "t/1");
    routes_settle(&mut mesh);
    let hub = mesh.node("hub");
    assert_eq!(hub.subscribe(h, "x", QoS::AtLeastOnce), granted);
    assert_eq!(hub.broker.stats().subscriptions_route_set_full, 1);
}
