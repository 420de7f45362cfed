//! Brokers as nodes of a deployment: interest replicated between nodes, each PUBLISH forwarded
//! once per node that wants it, QoS 1/2 through durable outboxes, exactly once, in order,
//! through link cuts and crashes.

mod common;

use bytes::Bytes;
use common::mesh::{Mesh, id};
use common::*;
use meridian_core::broker::PeerSummary;
use meridian_core::codec::{Packet, PublishProperties, QoS, ReasonCode};
use meridian_core::link::{Frame, OutboxLimits};
use meridian_core::{Config, Input, Timestamp};

fn persistent(c: &mut meridian_core::codec::Connect) {
    c.clean_start = false;
    c.properties.session_expiry_interval = Some(3600);
}

fn peer<'a>(peers: &'a [PeerSummary], name: &str) -> &'a PeerSummary {
    peers
        .iter()
        .find(|p| p.node == id(name))
        .expect("peer known")
}

fn payloads(w: &mut World, conn: meridian_core::ConnId) -> Vec<u32> {
    w.read_numbers(conn)
}

#[test]
fn publish_goes_only_to_nodes_with_a_matching_subscriber() {
    let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), |_| {});
    let sub = mesh.node("a").connect(V5, "sub");
    mesh.node("a").subscribe(sub, "geo/a/#", QoS::AtLeastOnce);
    mesh.advance(50); // one route batch
    assert_eq!(mesh.node("c").broker.nodes_for("geo/a/x"), vec![id("a")]);
    assert!(mesh.node("c").broker.nodes_for("geo/b/x").is_empty());

    let publisher = mesh.node("c").connect(V5, "pub");
    for i in 0..10u32 {
        mesh.node("c").publish(
            publisher,
            "geo/a/x",
            &i.to_be_bytes(),
            QoS::AtLeastOnce,
            false,
            i as u16 + 1,
        );
        mesh.settle();
    }
    assert_eq!(payloads(mesh.node("a"), sub), (0..10).collect::<Vec<_>>());
    let c_peers = mesh.node("c").broker.peers();
    assert_eq!(peer(&c_peers, "a").forwarded_to, 10);
    assert_eq!(peer(&c_peers, "b").forwarded_to, 0, "b has no subscriber");
    assert_eq!(peer(&mesh.node("b").broker.peers(), "c").forwarded_from, 0);

    // a unsubscribes: once the route change propagates, c stops forwarding.
    mesh.node("a").unsubscribe(sub, "geo/a/#");
    mesh.advance(50);
    assert!(mesh.node("c").broker.nodes_for("geo/a/x").is_empty());
    mesh.node("c").publish(
        publisher,
        "geo/a/x",
        &99u32.to_be_bytes(),
        QoS::AtLeastOnce,
        false,
        50,
    );
    mesh.settle();
    assert_eq!(peer(&mesh.node("c").broker.peers(), "a").forwarded_to, 10);
}

#[test]
fn suback_is_local_even_with_every_link_down() {
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), |_| {});
    mesh.link_down(&id("a"), &id("b"));
    let sub = mesh.node("a").connect(V5, "sub");
    assert_eq!(
        mesh.node("a").subscribe(sub, "t/#", QoS::AtMostOnce),
        vec![ReasonCode::GRANTED_QOS_0]
    );
    mesh.advance(50);
    assert!(
        mesh.node("b").broker.nodes_for("t/x").is_empty(),
        "not yet known: the link is down"
    );
    mesh.link_up(&id("a"), &id("b"));
    mesh.advance(50);
    assert_eq!(
        mesh.node("b").broker.nodes_for("t/x"),
        vec![id("a")],
        "learned when the link came back"
    );
}

#[test]
fn qos1_and_qos2_cross_a_cut_link_exactly_once_in_order() {
    let mut mesh = Mesh::new(&["a", "c"], Config::default(), |_| {});
    let sub = mesh.node("a").connect_with(V5, "sub", persistent).0;
    mesh.node("a").subscribe(sub, "o/#", QoS::ExactlyOnce);
    mesh.advance(50);
    let publisher = mesh.node("c").connect(V5, "pub");
    let mut received = Vec::new();
    for i in 0..100u32 {
        if i == 30 {
            mesh.link_down(&id("a"), &id("c"));
        }
        if i == 70 {
            mesh.link_up(&id("a"), &id("c"));
        }
        let qos = if i % 2 == 0 {
            QoS::AtLeastOnce
        } else {
            QoS::ExactlyOnce
        };
        let w = mesh.node("c");
        w.publish(publisher, "o/x", &i.to_be_bytes(), qos, false, i as u16 + 1);
        if qos == QoS::ExactlyOnce {
            let rec = w.recv(publisher);
            assert!(
                matches!(&rec[..], [Packet::PubRec(a)] if a.reason == ReasonCode::SUCCESS),
                "{rec:?}"
            );
            w.send(
                publisher,
                Packet::PubRel(meridian_core::codec::Ack::new(i as u16 + 1)),
            );
        }
        w.recv(publisher);
        mesh.settle();
        received.extend(payloads(mesh.node("a"), sub));
    }
    assert_eq!(
        received,
        (0..100).collect::<Vec<_>>(),
        "each once, in order"
    );
    assert_eq!(peer(&mesh.node("c").broker.peers(), "a").outbox_messages, 0);
}

/// Two nodes: a subscriber to `w/#` at QoS 2 on `a`, and a publisher on `c` whose client-id
/// claim reached `a` already (what `c` sends `a` next is its forwards).
fn subscriber_at_a_publisher_at_c() -> (Mesh, meridian_core::ConnId, meridian_core::ConnId) {
    let mut mesh = Mesh::new(&["a", "c"], Config::default(), |_| {});
    let sub = mesh.node("a").connect(V5, "sub");
    mesh.node("a").subscribe(sub, "w/#", QoS::ExactlyOnce);
    mesh.advance(50);
    let publisher = mesh.node("c").connect(V5, "pub");
    mesh.settle();
    (mesh, sub, publisher)
}

/// What the receiving node stores for a forwarded message, and whether a shell may let it
/// wait for a later fsync (`Durability::WithNext`): everything a QoS 1 forward to a subscriber
/// without a stored session leaves may wait (after a power loss it may come once more, as QoS 1
/// allows); a QoS 2 forward's duplicate mark may not.
#[test]
fn only_a_qos1_forwards_records_at_the_receiver_may_wait_for_the_disk() {
    use meridian_core::Output;
    use meridian_core::broker::Durability;
    let (mut mesh, sub, publisher) = subscriber_at_a_publisher_at_c();
    for (i, qos) in [QoS::AtLeastOnce, QoS::ExactlyOnce].into_iter().enumerate() {
        let w = mesh.node("c");
        w.publish(publisher, "w/x", &[i as u8], qos, false, i as u16 + 1);
        w.recv(publisher);
        let seen = mesh.node("a").log.len();
        mesh.deliver_one_way("c", "a");
        let records: Vec<_> = mesh.node("a").log[seen..]
            .iter()
            .filter_map(|out| match out {
                Output::Persist {
                    key,
                    value,
                    durability,
                } => Some((key.clone(), value.clone(), *durability)),
                _ => None,
            })
            .collect();
        assert!(!records.is_empty(), "{qos:?}: a duplicate mark is stored");
        let may_wait = records
            .iter()
            .all(|(_, _, durability)| *durability == Durability::WithNext);
        assert_eq!(may_wait, qos == QoS::AtLeastOnce, "{qos:?}: {records:?}");
        assert_eq!(mesh.node("a").received_publishes(sub).len(), 1, "{qos:?}");
    }
}

/// The forwards of one read are acknowledged once per origin, with the highest number, after
/// every record they left: acknowledgements are cumulative, and each must follow the
/// duplicate marks it stands for.
#[test]
fn the_forwards_of_one_read_are_acknowledged_once_after_their_records() {
    use meridian_core::Output;
    let (mut mesh, sub, publisher) = subscriber_at_a_publisher_at_c();
    for i in 0..5u16 {
        let w = mesh.node("c");
        w.publish(publisher, "w/x", &[i as u8], QoS::ExactlyOnce, false, i + 1);
        w.recv(publisher);
    }
    let seen = mesh.node("a").log.len();
    mesh.deliver_as_one_read("c", "a");
    let a = mesh.node("a");
    let outputs = &a.log[seen..];
    let acks: Vec<usize> = outputs
        .iter()
        .enumerate()
        .filter(|(_, o)| {
            matches!(o, Output::ToPeer { frame, .. }
                if matches!(frame.decode(), Ok(Frame::ForwardAck { .. })))
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        acks.len(),
        1,
        "one acknowledgement for the read: {outputs:?}"
    );
    let last_record = outputs
        .iter()
        .rposition(|o| matches!(o, Output::Persist { .. }))
        .expect("duplicate marks stored");
    assert!(acks[0] > last_record, "after the records: {outputs:?}");
    let Output::ToPeer { frame, .. } = &outputs[acks[0]] else {
        unreachable!()
    };
    let Ok(Frame::ForwardAck { seq, .. }) = frame.decode() else {
        unreachable!()
    };
    let highest = a.received_publishes(sub).len();
    assert_eq!(highest, 5, "every forward delivered");
    mesh.settle();
    assert_eq!(
        peer(&mesh.node("c").broker.peers(), "a").outbox_messages,
        0,
        "the one acknowledgement ({seq}) took every forward off the outbox"
    );
}

#[test]
fn outbox_survives_a_crash_of_the_publishing_node() {
    let mut mesh = Mesh::new(&["a", "c"], Config::default(), |_| {});
    let sub = mesh.node("a").connect_with(V5, "sub", persistent).0;
    mesh.node("a").subscribe(sub, "d/#", QoS::AtLeastOnce);
    mesh.advance(50);
    mesh.link_down(&id("a"), &id("c"));
    let publisher = mesh.node("c").connect(V5, "pub");
    for i in 0..20u32 {
        mesh.node("c").publish(
            publisher,
            "d/x",
            &i.to_be_bytes(),
            QoS::AtLeastOnce,
            false,
            i as u16 + 1,
        );
    }
    let acks = mesh.node("c").recv(publisher);
    assert_eq!(acks.len(), 20, "acknowledged while the link is down");
    assert_eq!(
        peer(&mesh.node("c").broker.peers(), "a").outbox_messages,
        20
    );
    mesh.crash_and_restart("c");
    assert_eq!(
        peer(&mesh.node("c").broker.peers(), "a").outbox_messages,
        20,
        "restored from storage"
    );
    mesh.link_up(&id("a"), &id("c"));
    mesh.settle();
    assert_eq!(payloads(mesh.node("a"), sub), (0..20).collect::<Vec<_>>());
    assert_eq!(peer(&mesh.node("c").broker.peers(), "a").outbox_messages, 0);
}

#[test]
fn receiver_crash_does_not_deliver_twice() {
    let mut mesh = Mesh::new(&["a", "c"], Config::default(), |_| {});
    let sub = mesh.node("a").connect_with(V5, "sub", persistent).0;
    mesh.node("a").subscribe(sub, "r/#", QoS::ExactlyOnce);
    mesh.advance(50);
    let publisher = mesh.node("c").connect(V5, "pub");
    for i in 0..10u32 {
        mesh.node("c").publish(
            publisher,
            "r/x",
            &i.to_be_bytes(),
            QoS::AtLeastOnce,
            false,
            i as u16 + 1,
        );
    }
    // The forwards reach a, but a's acks are lost with the link, and then a crashes.
    mesh.deliver_one_way("c", "a");
    assert_eq!(mesh.node("a").received_publishes(sub).len(), 10);
    mesh.link_down(&id("a"), &id("c"));
    assert_eq!(
        peer(&mesh.node("c").broker.peers(), "a").outbox_messages,
        10,
        "unacknowledged"
    );
    mesh.crash_and_restart("a");
    mesh.link_up(&id("a"), &id("c"));
    mesh.settle();
    // c re-sent all ten; a's persisted marks dropped them as duplicates and acknowledged.
    assert_eq!(peer(&mesh.node("a").broker.peers(), "c").forwarded_from, 10);
    assert_eq!(peer(&mesh.node("c").broker.peers(), "a").outbox_messages, 0);
    // The subscriber's session holds the ten in flight, re-sent as DUP; no second copies.
    let sub2 = mesh.node("a").connect_with(V5, "sub", persistent).0;
    let again = mesh.node("a").received_publishes(sub2);
    assert_eq!(again.len(), 10);
    assert!(again.iter().all(|p| p.dup));
}

#[test]
fn a_restarted_node_remembers_remote_routes_and_queues_for_an_unreachable_peer() {
    let mut mesh = Mesh::new(&["a", "c"], Config::default(), |_| {});
    let sub = mesh.node("a").connect_with(V5, "sub", persistent).0;
    mesh.node("a").subscribe(sub, "k/#", QoS::AtLeastOnce);
    mesh.advance(50);
    assert_eq!(mesh.node("c").broker.nodes_for("k/x"), vec![id("a")]);
    // c restarts while the link is down: what it knew of a's routes came back from storage,
    // so what its clients publish meanwhile waits in its outbox instead of going nowhere.
    mesh.link_down(&id("a"), &id("c"));
    mesh.crash_and_restart("c");
    assert_eq!(mesh.node("c").broker.nodes_for("k/x"), vec![id("a")]);
    assert_eq!(mesh.node("c").broker.replicated_routes(&id("a")), ["k/#"]);
    let publisher = mesh.node("c").connect(V5, "pub");
    for i in 0..5u32 {
        mesh.node("c").publish(
            publisher,
            "k/x",
            &i.to_be_bytes(),
            QoS::AtLeastOnce,
            false,
            i as u16 + 1,
        );
    }
    assert_eq!(peer(&mesh.node("c").broker.peers(), "a").outbox_messages, 5);
    mesh.link_up(&id("a"), &id("c"));
    mesh.settle();
    assert_eq!(payloads(mesh.node("a"), sub), (0..5).collect::<Vec<_>>());
}

#[test]
fn a_node_that_gains_many_filters_at_once_sends_them_in_bounded_deltas() {
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), |c| {
        c.snapshot_chunk_filters = 4;
    });
    let sub = mesh.node("a").connect(V5, "many");
    mesh.node("a").peer_out.clear();
    for i in 0..10 {
        mesh.node("a")
            .subscribe(sub, &format!("many/{i}"), QoS::AtMostOnce);
    }
    mesh.node("a").advance(50);
    let deltas: Vec<usize> = mesh
        .node("a")
        .peer_out
        .iter()
        .filter_map(|(_, f)| match f {
            meridian_core::link::Frame::RouteDelta(d) => Some(d.changes.len()),
            _ => None,
        })
        .collect();
    assert_eq!(
        deltas,
        vec![4, 4, 2],
        "one batch of 10, in pieces of at most 4"
    );
    mesh.settle();
    assert_eq!(mesh.node("b").broker.replicated_routes(&id("a")).len(), 10);
    assert_eq!(
        mesh.node("b").broker.replica_position(&id("a")),
        mesh.node("a").broker.route_position()
    );
}

#[test]
fn restarted_node_replaces_its_routes_everywhere() {
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), |_| {});
    let sub = mesh.node("a").connect(V5, "clean");
    mesh.node("a").subscribe(sub, "gone/#", QoS::AtMostOnce);
    mesh.advance(50);
    assert_eq!(mesh.node("b").broker.nodes_for("gone/x"), vec![id("a")]);
    // A clean session does not survive the crash: the new incarnation has no such route.
    mesh.crash_and_restart("a");
    mesh.advance(6_000); // a digest round
    assert!(mesh.node("b").broker.nodes_for("gone/x").is_empty());
}

#[test]
fn a_connected_peers_full_outbox_refuses_a_v5_publish_with_quota_exceeded() {
    let limits = OutboxLimits {
        window: 10,
        max_messages: 2,
        max_bytes: 1 << 20,
    };
    let mut mesh = Mesh::new(&["a", "c"], Config::default(), move |c| c.outbox = limits);
    let sub = mesh.node("a").connect(V5, "sub");
    mesh.node("a").subscribe(sub, "f", QoS::AtLeastOnce);
    mesh.advance(50);
    // The link is up, but nothing is carried (so nothing is acknowledged) until the end: a
    // region that is there but slower than its publishers holds them back. (One that is not
    // there never does: tests/cluster_trust.rs.)
    let v5 = mesh.node("c").connect(V5, "p5");
    let v3 = mesh.node("c").connect(V3, "p3");
    for i in 1..=3u16 {
        mesh.node("c")
            .publish(v5, "f", b"x", QoS::AtLeastOnce, false, i);
    }
    let acks = mesh.node("c").recv(v5);
    let reasons: Vec<ReasonCode> = acks
        .iter()
        .map(|p| match p {
            Packet::PubAck(a) => a.reason,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        reasons,
        vec![
            ReasonCode::SUCCESS,
            ReasonCode::SUCCESS,
            ReasonCode::QUOTA_EXCEEDED
        ]
    );
    mesh.node("c")
        .publish(v3, "f", b"x", QoS::AtLeastOnce, false, 1);
    assert_eq!(
        mesh.node("c").broker.stats().dropped_outbox_full,
        1,
        "3.1.1: dropped and counted"
    );
}

#[test]
fn forwarded_message_keeps_every_property_and_qos0_goes_direct() {
    let mut mesh = Mesh::new(&["a", "c"], Config::default(), |_| {});
    let sub = mesh.node("a").connect(V5, "sub");
    mesh.node("a").subscribe(sub, "p", QoS::AtLeastOnce);
    mesh.advance(50);
    let publisher = mesh.node("c").connect(V5, "pub");
    let mut msg = publish_packet("p", b"{}", QoS::AtMostOnce, false, 0);
    msg.properties = PublishProperties {
        payload_format_indicator: Some(1),
        content_type: Some("application/json".into()),
        response_topic: Some("reply/c".into()),
        correlation_data: Some(Bytes::from_static(b"corr")),
        user_properties: vec![("k".into(), "v".into())],
        ..Default::default()
    };
    mesh.node("c").send(publisher, Packet::Publish(msg.clone()));
    mesh.settle();
    let got = mesh.node("a").received_publishes(sub);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].properties, msg.properties);
    assert_eq!(
        peer(&mesh.node("c").broker.peers(), "a").outbox_messages,
        0,
        "QoS 0 skips the outbox"
    );
}

#[test]
fn a_congested_link_drops_qos0_forwards_until_drained_or_the_next_session() {
    let mut mesh = Mesh::new(&["a", "c"], Config::default(), |_| {});
    let sub = mesh.node("a").connect(V5, "sub");
    mesh.node("a").subscribe(sub, "g/#", QoS::AtLeastOnce);
    mesh.advance(50);
    let publisher = mesh.node("c").connect(V5, "pub");
    let congest = |mesh: &mut Mesh, input: fn(meridian_core::routes::NodeId) -> Input<'static>| {
        let w = mesh.node("c");
        w.broker.handle_input(Timestamp(w.now), input(id("a")));
        w.drain();
    };
    let send = |mesh: &mut Mesh, i: u32, qos: QoS| {
        mesh.node("c")
            .publish(publisher, "g/x", &i.to_be_bytes(), qos, false, i as u16 + 1);
        mesh.node("c").recv(publisher);
        mesh.settle();
    };

    congest(&mut mesh, |peer| Input::PeerCongested { peer });
    send(&mut mesh, 0, QoS::AtMostOnce);
    send(&mut mesh, 1, QoS::AtLeastOnce);
    assert_eq!(
        payloads(mesh.node("a"), sub),
        vec![1],
        "QoS 1 still crosses"
    );
    assert_eq!(mesh.node("c").broker.stats().dropped_peer_congested, 1);

    congest(&mut mesh, |peer| Input::PeerDrained { peer });
    send(&mut mesh, 2, QoS::AtMostOnce);
    assert_eq!(payloads(mesh.node("a"), sub), vec![2]);

    // A new session starts uncongested.
    congest(&mut mesh, |peer| Input::PeerCongested { peer });
    mesh.link_down(&id("a"), &id("c"));
    mesh.link_up(&id("a"), &id("c"));
    send(&mut mesh, 3, QoS::AtMostOnce);
    assert_eq!(payloads(mesh.node("a"), sub), vec![3]);
    assert_eq!(mesh.node("c").broker.stats().dropped_peer_congested, 1);
}

#[test]
fn nothing_loops_in_a_full_mesh() {
    let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), |_| {});
    // A client id is one client in the whole deployment: one subscriber per node, each its own.
    for name in ["a", "b", "c"] {
        let w = mesh.node(name);
        let s = w.connect(V5, &format!("s-{name}"));
        w.subscribe(s, "all/#", QoS::AtLeastOnce);
    }
    mesh.advance(50);
    let p = mesh.node("b").connect(V5, "p");
    mesh.node("b")
        .publish(p, "all/x", &7u32.to_be_bytes(), QoS::AtLeastOnce, false, 1);
    mesh.advance(10);
    mesh.settle();
    for name in ["a", "b", "c"] {
        let w = mesh.node(name);
        let conn = w
            .broker
            .clients()
            .iter()
            .find(|c| c.client_id == format!("s-{name}"))
            .unwrap()
            .conn
            .unwrap();
        assert_eq!(
            w.received_publishes(conn).len(),
            1,
            "exactly one copy at {name}"
        );
    }
    let peers = mesh.node("b").broker.peers();
    assert_eq!(
        peer(&peers, "a").forwarded_to + peer(&peers, "c").forwarded_to,
        2
    );
}

fn qos1() -> meridian_core::codec::SubscriptionOptions {
    meridian_core::codec::SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        ..Default::default()
    }
}

#[test]
fn without_the_fence_a_publish_elsewhere_right_after_suback_can_be_missed() {
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), |_| {});
    let sub = mesh.node("a").connect(V5, "sub");
    let publisher = mesh.node("b").connect(V5, "pub");
    assert_eq!(
        mesh.node("a").subscribe(sub, "fresh/#", QoS::AtLeastOnce),
        vec![ReasonCode::GRANTED_QOS_1],
        "answered at once"
    );
    mesh.node("b").publish(
        publisher,
        "fresh/x",
        &1u32.to_be_bytes(),
        QoS::AtLeastOnce,
        false,
        1,
    );
    mesh.settle();
    assert!(
        payloads(mesh.node("a"), sub).is_empty(),
        "b did not know the route yet"
    );
}

#[test]
fn fenced_suback_waits_until_every_connected_peer_knows_the_route() {
    let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), |c| {
        c.subscribe_fence = true
    });
    let sub = mesh.node("a").connect(V5, "sub");
    let publisher = mesh.node("b").connect(V5, "pub");
    assert!(
        mesh.node("a")
            .subscribe_collect(sub, "fresh/#", qos1())
            .is_empty(),
        "SUBACK held"
    );
    assert_eq!(mesh.node("a").broker.held_subacks(), 1);
    mesh.settle();
    assert!(mesh.node("a").recv(sub).is_empty(), "not before the batch");
    mesh.advance(20); // the route batch goes out; b and c apply it and acknowledge
    let got = mesh.node("a").recv(sub);
    assert!(
        matches!(&got[..], [Packet::SubAck(a)] if a.reasons == vec![ReasonCode::GRANTED_QOS_1]),
        "{got:?}"
    );
    assert_eq!(mesh.node("a").broker.held_subacks(), 0);
    // Right after the SUBACK, a message published on another node is delivered.
    mesh.node("b").publish(
        publisher,
        "fresh/x",
        &1u32.to_be_bytes(),
        QoS::AtLeastOnce,
        false,
        1,
    );
    mesh.settle();
    assert_eq!(payloads(mesh.node("a"), sub), vec![1]);
    // A filter every peer already knows costs nothing more.
    assert_eq!(
        mesh.node("a").subscribe(sub, "fresh/#", QoS::AtLeastOnce),
        vec![ReasonCode::GRANTED_QOS_1]
    );
}

#[test]
fn fence_stops_waiting_for_a_peer_whose_link_goes_down_and_is_bounded() {
    let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), |c| {
        c.subscribe_fence = true;
        c.subscribe_fence_max_ms = 5_000;
    });
    let sub = mesh.node("a").connect(V5, "sub");
    assert!(
        mesh.node("a")
            .subscribe_collect(sub, "x/#", qos1())
            .is_empty()
    );
    // c never answers: its link is down before the batch goes out.
    mesh.link_down(&id("a"), &id("c"));
    mesh.advance(20);
    assert!(
        matches!(&mesh.node("a").recv(sub)[..], [Packet::SubAck(_)]),
        "b acknowledged; c is not waited for"
    );
    // Every link up but nothing carried: the SUBACK goes after subscribe_fence_max_ms.
    mesh.link_up(&id("a"), &id("c"));
    mesh.settle();
    assert!(
        mesh.node("a")
            .subscribe_collect(sub, "y/#", qos1())
            .is_empty()
    );
    mesh.node("a").advance(4_000);
    assert!(mesh.node("a").recv(sub).is_empty());
    mesh.node("a").advance(1_000);
    assert!(matches!(&mesh.node("a").recv(sub)[..], [Packet::SubAck(_)]));
}

/// What a new subscriber to `filter` on `node` receives as retained messages.
fn retained_at(mesh: &mut Mesh, node: &str, filter: &str) -> Vec<(String, Vec<u8>)> {
    let w = mesh.node(node);
    let c = w.connect(V5, "probe");
    let got = w.subscribe_collect(c, filter, qos1());
    w.close(c);
    got.into_iter()
        .filter_map(|p| match p {
            Packet::Publish(p) if p.retain => Some((p.topic, p.payload.to_vec())),
            _ => None,
        })
        .collect()
}

#[test]
fn retained_messages_and_deletes_reach_every_node() {
    let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), |_| {});
    let p = mesh.node("a").connect(V5, "pub");
    mesh.node("a")
        .publish(p, "cfg/one", b"1", QoS::AtLeastOnce, true, 1);
    mesh.node("a")
        .publish(p, "cfg/two", b"2", QoS::AtMostOnce, true, 0);
    mesh.settle();
    for node in ["a", "b", "c"] {
        assert_eq!(
            retained_at(&mut mesh, node, "cfg/#"),
            vec![
                ("cfg/one".to_owned(), b"1".to_vec()),
                ("cfg/two".to_owned(), b"2".to_vec())
            ],
            "at {node}"
        );
    }
    // A delete on another node (empty retained payload) removes it everywhere.
    let q = mesh.node("b").connect(V5, "pub2");
    mesh.node("b")
        .publish(q, "cfg/one", b"", QoS::AtMostOnce, true, 0);
    mesh.settle();
    for node in ["a", "b", "c"] {
        assert_eq!(
            retained_at(&mut mesh, node, "cfg/#"),
            vec![("cfg/two".to_owned(), b"2".to_vec())],
            "at {node}"
        );
    }
    let digests: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| mesh.node(n).broker.retained_digest().unwrap())
        .collect();
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
    assert_eq!(digests[0].entries, 2, "one message and one tombstone");
}

#[test]
fn concurrent_retained_writes_converge_on_the_last_writer() {
    let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), |_| {});
    for (x, y) in [("a", "b"), ("a", "c"), ("b", "c")] {
        mesh.link_down(&id(x), &id(y));
    }
    let pa = mesh.node("a").connect(V5, "pa");
    let pb = mesh.node("b").connect(V5, "pb");
    // b writes later (its clock is ahead), then a writes an older value after b's.
    mesh.node("a").advance(5);
    mesh.node("b").advance(10);
    mesh.node("b")
        .publish(pb, "state", b"b", QoS::AtMostOnce, true, 0);
    mesh.node("a")
        .publish(pa, "state", b"a", QoS::AtMostOnce, true, 0);
    // And a deletes a topic that only b had: the delete is later, so it wins.
    mesh.node("b")
        .publish(pb, "gone", b"old", QoS::AtMostOnce, true, 0);
    mesh.node("a").advance(20);
    mesh.node("a")
        .publish(pa, "gone", b"", QoS::AtMostOnce, true, 0);
    for (x, y) in [("a", "b"), ("a", "c"), ("b", "c")] {
        mesh.link_up(&id(x), &id(y));
    }
    mesh.settle();
    for node in ["a", "b", "c"] {
        assert_eq!(
            retained_at(&mut mesh, node, "#"),
            vec![("state".to_owned(), b"b".to_vec())],
            "at {node}: the later write wins, and the delete holds"
        );
    }
    let a = mesh.node("a").broker.retained_digest();
    assert_eq!(a, mesh.node("b").broker.retained_digest());
    assert_eq!(a, mesh.node("c").broker.retained_digest());
}

#[test]
fn a_node_that_was_away_or_restarted_catches_up_on_retained_messages() {
    let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), |_| {});
    let p = mesh.node("a").connect(V5, "pub");
    mesh.node("a")
        .publish(p, "r/1", b"x", QoS::AtMostOnce, true, 0);
    mesh.settle();
    mesh.link_down(&id("a"), &id("c"));
    mesh.link_down(&id("b"), &id("c"));
    mesh.node("a")
        .publish(p, "r/1", b"", QoS::AtMostOnce, true, 0);
    mesh.node("a")
        .publish(p, "r/2", b"y", QoS::AtMostOnce, true, 0);
    mesh.settle();
    assert_eq!(
        retained_at(&mut mesh, "c", "r/#"),
        vec![("r/1".to_owned(), b"x".to_vec())],
        "c is cut off"
    );
    mesh.link_up(&id("b"), &id("c"));
    mesh.settle();
    assert_eq!(
        retained_at(&mut mesh, "c", "r/#"),
        vec![("r/2".to_owned(), b"y".to_vec())],
        "caught up from b, the delete included"
    );
    // A restart keeps the stamps: after it, c agrees with the others without a new write.
    mesh.crash_and_restart("c");
    mesh.link_up(&id("a"), &id("c"));
    mesh.settle();
    assert_eq!(
        mesh.node("c").broker.retained_digest(),
        mesh.node("a").broker.retained_digest()
    );
    assert_eq!(
        retained_at(&mut mesh, "c", "r/#"),
        vec![("r/2".to_owned(), b"y".to_vec())]
    );
}

#[test]
fn a_restarted_node_shows_its_whole_route_set_from_the_first_contact() {
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), |_| {});
    let (sub, _) = mesh.node("a").connect_with(V5, "sub", persistent);
    mesh.node("a").subscribe(sub, "r/#", QoS::AtLeastOnce);
    mesh.advance(50);
    mesh.crash_and_restart("a");
    // No route batch has passed since the restart: what b publishes now still reaches a.
    mesh.settle();
    let publisher = mesh.node("b").connect(V5, "pub");
    mesh.node("b").publish(
        publisher,
        "r/1",
        &7u32.to_be_bytes(),
        QoS::AtLeastOnce,
        false,
        1,
    );
    mesh.settle();
    let (back, ack) = mesh.node("a").connect_with(V5, "sub", persistent);
    assert!(ack.session_present);
    assert_eq!(payloads(mesh.node("a"), back), vec![7]);
}
