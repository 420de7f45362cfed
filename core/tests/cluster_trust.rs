//! Members that leave and peers that cannot lie: every frame that names an origin is taken
//! only from that origin, what a peer can make a node hold is bounded, a node that left is
//! forgotten (by command, announcement or expiry) and never holds publishers back, clocks far
//! ahead are refused, and forwarded messages meet the receiving node's access rules.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::mesh::{Mesh, id};
use common::operator::{FORGET_SIGNATURE, region_certificate, with_operator_keys};
use common::*;
use meridian_core::acl::{Acl, Action, Permission, Rule};
use meridian_core::broker::{AllowAll, ForgetError, ForgetReason, PeerFault, PeerLimit};
use meridian_core::codec::{Packet, Publish, QoS, ReasonCode};
use meridian_core::link::{DigestEntry, Forward, Frame, FrameKind, OutboxLimits, RetainedUpdate};
use meridian_core::retained::{Hlc, Stamp};
use meridian_core::routes::{Owner, RouteChange, RouteDelta, RouteOp, SnapshotChunk};
use meridian_core::{Config, Event, Timestamp};

fn owner(name: &str, incarnation: u64) -> Owner {
    Owner {
        node: id(name),
        incarnation,
    }
}

fn delta(of: &str, incarnation: u64, filters: &[&str]) -> RouteDelta {
    let changes: Vec<RouteChange> = filters
        .iter()
        .enumerate()
        .map(|(i, f)| RouteChange {
            version: i as u64 + 1,
            filter: Arc::from(*f),
            op: RouteOp::Add,
        })
        .collect();
    RouteDelta {
        owner: owner(of, incarnation),
        after: 0,
        changes,
        hash: meridian_core::routes::set_hash(filters.iter().copied()),
    }
}

fn message(topic: &str, payload: &[u8], qos: QoS) -> Publish {
    Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.into(),
        packet_id: (qos != QoS::AtMostOnce).then_some(1),
        payload: Bytes::copy_from_slice(payload),
        properties: Default::default(),
    }
}

fn faults(w: &World) -> Vec<(String, PeerFault)> {
    w.events
        .iter()
        .filter_map(|e| match e {
            Event::PeerFault { peer, fault } => Some((peer.to_string(), *fault)),
            _ => None,
        })
        .collect()
}

/// Three nodes; `a` has a subscriber to `a/#`, which `b` and `c` replicate.
fn three() -> (Mesh, meridian_core::ConnId) {
    let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), |_| {});
    let sub = mesh.node("a").connect(V5, "sub");
    mesh.node("a").subscribe(sub, "a/#", QoS::AtLeastOnce);
    mesh.advance(50);
    (mesh, sub)
}

#[test]
fn a_peer_cannot_write_another_nodes_routes() {
    let (mut mesh, _) = three();
    // `b` holds the key, and claims to speak for `a` with an incarnation no one can beat.
    mesh.inject(
        "b",
        "c",
        Frame::RouteDelta(delta("a", u64::MAX, &["stolen/#"])),
    );
    mesh.inject(
        "b",
        "c",
        Frame::SnapshotChunk(SnapshotChunk {
            owner: owner("a", u64::MAX),
            version: 1,
            hash: 0,
            index: 0,
            count: 1,
            filters: Vec::new(),
        }),
    );
    mesh.settle();
    let c = mesh.node("c");
    assert_eq!(c.broker.replicated_routes(&id("a")), vec!["a/#".to_owned()]);
    assert_eq!(c.broker.nodes_for("a/x"), vec![id("a")]);
    assert!(c.broker.nodes_for("stolen/x").is_empty());
    assert_eq!(c.broker.stats().peer_frames_not_owner, 2);
    assert_eq!(
        faults(c),
        vec![("b".to_owned(), PeerFault::NotOwner(FrameKind::RouteDelta))],
        "reported once per peer and kind"
    );
    assert!(
        c.cut_peers.is_empty(),
        "a forged origin is dropped, not cut"
    );
}

#[test]
fn a_spoofed_forward_origin_cannot_poison_the_duplicate_marks() {
    let (mut mesh, sub) = three();
    // `b` forwards as if it were `c`, with a sequence number far ahead.
    let forged = Forward {
        origin: owner("c", 1),
        seq: u64::MAX - 1,
        message: message("a/forged", b"x", QoS::AtLeastOnce),
    };
    mesh.inject("b", "a", Frame::Forward(forged));
    assert!(mesh.node("a").received_publishes(sub).is_empty());
    assert_eq!(mesh.node("a").broker.stats().peer_frames_not_owner, 1);
    // `c`'s genuine forwards still arrive, once each.
    let publisher = mesh.node("c").connect(V5, "pub");
    for i in 1..=3u16 {
        mesh.node("c")
            .publish(publisher, "a/real", b"y", QoS::AtLeastOnce, false, i);
        mesh.settle();
    }
    let got = mesh.node("a").received_publishes(sub);
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|p| p.topic == "a/real"));
}

#[test]
fn retained_writes_digests_and_hellos_speak_only_for_their_sender() {
    let (mut mesh, _) = three();
    let stamp = |node: &str| Stamp {
        hlc: Hlc {
            wall_ms: 1_000_000,
            logical: 0,
        },
        node: id(node),
    };
    let update = RetainedUpdate {
        topic: "r".into(),
        stamp: stamp("a"),
        message: Some(message("r", b"forged", QoS::AtMostOnce)),
    };
    mesh.inject("b", "c", Frame::Retained(update));
    let digest = Frame::Digest(vec![DigestEntry {
        owner: owner("a", 9),
        version: 100,
        hash: 1,
    }]);
    mesh.inject("b", "c", digest);
    mesh.inject(
        "b",
        "c",
        Frame::Hello {
            node: id("a"),
            incarnation: 1,
            protocol: meridian_core::link::LINK_PROTOCOL_VERSION,
            region: "elsewhere".into(),
            certificate: None,
        },
    );
    let c = mesh.node("c");
    assert_eq!(c.broker.stats().peer_frames_not_owner, 3);
    assert_eq!(c.broker.retained_digest().unwrap().entries, 0);
    assert!(
        !c.peer_out
            .iter()
            .any(|(to, f)| *to == Some(id("a")) && *f == Frame::SnapshotRequest),
        "a forged digest does not make c bother a"
    );
    let a = c.broker.peers().into_iter().find(|p| p.node == id("a"));
    assert_eq!(a.unwrap().region.as_deref(), Some("region-a"));
}

#[test]
fn a_peer_past_its_filter_bound_is_cut_and_changes_nothing() {
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), |c| {
        c.peer_limits.max_filters = 3;
    });
    mesh.inject("a", "b", Frame::RouteDelta(delta("a", 1, &["1", "2"])));
    assert_eq!(mesh.node("b").broker.replicated_routes(&id("a")).len(), 2);
    let mut more = delta("a", 1, &["3", "4"]);
    more.after = 2;
    for (i, c) in more.changes.iter_mut().enumerate() {
        c.version = 3 + i as u64;
    }
    more.hash = meridian_core::routes::set_hash(["1", "2", "3", "4"]);
    mesh.inject("a", "b", Frame::RouteDelta(more));
    let b = mesh.node("b");
    assert_eq!(b.broker.replicated_routes(&id("a")).len(), 2, "not applied");
    assert_eq!(b.broker.stats().peer_frames_over_limit, 1);
    assert_eq!(b.broker.stats().peer_sessions_cut, 1);
    assert_eq!(b.cut_peers, vec![id("a")]);
    assert_eq!(
        faults(b),
        vec![("a".into(), PeerFault::OverLimit(PeerLimit::Filters))]
    );
    // A snapshot past the bound is refused the same way.
    let chunk = SnapshotChunk {
        owner: owner("a", 2),
        version: 4,
        hash: meridian_core::routes::set_hash(["1", "2", "3", "4"]),
        index: 0,
        count: 1,
        filters: ["1", "2", "3", "4"].into_iter().map(Arc::from).collect(),
    };
    mesh.inject("a", "b", Frame::SnapshotChunk(chunk));
    assert_eq!(mesh.node("b").broker.stats().peer_frames_over_limit, 2);
    assert_eq!(mesh.node("b").broker.replicated_routes(&id("a")).len(), 2);
}

/// A peer's route set is bounded in bytes as well as in filters: a delta of a few long
/// filters past `max_snapshot_bytes` is refused like a snapshot that size.
#[test]
fn a_peer_s_route_set_is_bounded_in_bytes_however_it_grows() {
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), |c| {
        c.peer_limits.max_snapshot_bytes = 1_000;
    });
    mesh.inject("a", "b", Frame::RouteDelta(delta("a", 1, &["short"])));
    let long = "x/".repeat(600);
    let mut more = delta("a", 1, &[long.as_str()]);
    more.after = 1;
    more.changes[0].version = 2;
    more.hash = meridian_core::routes::set_hash(["short", long.as_str()]);
    mesh.inject("a", "b", Frame::RouteDelta(more.clone()));
    mesh.inject("a", "b", Frame::RouteDelta(more));
    let b = mesh.node("b");
    assert_eq!(
        b.broker.replicated_routes(&id("a")),
        vec!["short".to_owned()]
    );
    assert_eq!(b.broker.stats().peer_frames_over_limit, 2);
    assert_eq!(
        faults(b),
        vec![("a".into(), PeerFault::OverLimit(PeerLimit::SnapshotBytes))]
    );
}

#[test]
fn nodes_beyond_the_bound_are_refused() {
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), |c| c.max_nodes = 1);
    for stranger in ["x", "y"] {
        mesh.inject(
            stranger,
            "a",
            Frame::RouteDelta(delta(stranger, 1, &["s/#"])),
        );
    }
    let a = mesh.node("a");
    assert!(a.broker.nodes_for("s/1").is_empty());
    assert_eq!(a.broker.stats().peer_frames_too_many_nodes, 2);
    assert_eq!(a.broker.peers().len(), 1, "only b");
}

#[test]
fn a_retained_write_from_a_clock_far_ahead_is_refused_and_the_clock_does_not_jump() {
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), |c| {
        c.max_clock_drift_ms = 1_000;
    });
    let now = mesh.node("a").now;
    let write = |wall_ms: u64, payload: &[u8]| RetainedUpdate {
        topic: "state".into(),
        stamp: Stamp {
            hlc: Hlc {
                wall_ms,
                logical: u32::MAX,
            },
            node: id("b"),
        },
        message: Some(message("state", payload, QoS::AtMostOnce)),
    };
    mesh.inject("b", "a", Frame::Retained(write(u64::MAX, b"frozen")));
    mesh.inject("b", "a", Frame::Retained(write(now + 500, b"near")));
    let a = mesh.node("a");
    assert_eq!(a.broker.stats().peer_frames_clock_ahead, 1);
    assert_eq!(
        faults(a),
        vec![("b".into(), PeerFault::ClockAhead)],
        "reported, not cut"
    );
    // a's own later write wins over the one within the drift: its clock was not frozen.
    a.advance(2_000);
    let publisher = a.connect(V5, "p");
    a.publish(publisher, "state", b"mine", QoS::AtMostOnce, true, 0);
    let sub = a.connect(V5, "s");
    let got: Vec<Publish> = a
        .subscribe_collect(sub, "state", Default::default())
        .into_iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(p),
            _ => None,
        })
        .collect();
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].payload[..], b"mine");
}

#[test]
fn a_node_that_left_is_forgotten_by_command_and_publishers_go_on() {
    let limits = OutboxLimits {
        window: 10,
        max_messages: 2,
        max_bytes: 1 << 20,
    };
    let (mut mesh, _) = {
        let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), move |c| {
            c.outbox = limits
        });
        let sub = mesh.node("a").connect(V5, "sub");
        mesh.node("a").subscribe(sub, "a/#", QoS::AtLeastOnce);
        mesh.advance(50);
        (mesh, sub)
    };
    // `a` dies for good.
    mesh.link_down(&id("a"), &id("b"));
    mesh.link_down(&id("a"), &id("c"));
    let publisher = mesh.node("c").connect(V5, "pub");
    for i in 1..=5u16 {
        mesh.node("c")
            .publish(publisher, "a/x", b"m", QoS::AtLeastOnce, false, i);
    }
    assert_eq!(
        mesh.node("c").puback_reasons(publisher),
        vec![ReasonCode::SUCCESS; 5],
        "a node that is not there never refuses a publisher"
    );
    let c = mesh.node("c");
    assert_eq!(c.broker.stats().dropped_peer_absent, 3, "the oldest go");
    assert_eq!(
        c.broker.forget_peer(Timestamp(c.now), &id("b")),
        Err(ForgetError::Connected),
        "b is alive"
    );
    assert_eq!(
        c.broker.forget_peer(Timestamp(c.now), &id("zz")),
        Err(ForgetError::Unknown)
    );
    let forgotten = c.broker.forget_peer(Timestamp(c.now), &id("a")).unwrap();
    c.drain();
    assert_eq!((forgotten.routes, forgotten.dropped_messages), (1, 2));
    assert!(c.broker.nodes_for("a/x").is_empty());
    assert_eq!(c.broker.stats().dropped_peer_forgotten, 2);
    assert!(c.broker.peers().iter().all(|p| p.node != id("a")));
    // The announcement reaches b, which cannot reach a either.
    mesh.settle();
    let b = mesh.node("b");
    assert!(b.broker.nodes_for("a/x").is_empty());
    assert!(b.events.iter().any(|e| matches!(
        e,
        Event::PeerForgotten { peer, reason: ForgetReason::Announced { by }, .. }
            if *peer == id("a") && *by == id("c")
    )));
    // After a restart, nothing of a comes back from storage (no route, no outbox).
    mesh.crash_and_restart("c");
    assert!(mesh.node("c").broker.nodes_for("a/x").is_empty());
    assert!(
        mesh.node("c")
            .broker
            .peers()
            .iter()
            .all(|p| p.node != id("a"))
    );
}

#[test]
fn an_announced_forget_is_ignored_by_a_node_that_still_reaches_it() {
    let (mut mesh, _) = three();
    mesh.inject(
        "b",
        "c",
        Frame::Forget {
            node: id("a"),
            incarnation: 1,
            signature: None,
        },
    );
    let c = mesh.node("c");
    assert_eq!(c.broker.nodes_for("a/x"), vec![id("a")]);
    assert_eq!(c.broker.stats().peers_forgotten, 0);
}

/// A forget that names an incarnation no node has met (up to u64::MAX) would have every node
/// drop what waits for a region that is merely cut off: it is refused and counted; the
/// incarnation the nodes know is forgotten as documented.
#[test]
fn an_announced_forget_of_an_incarnation_nobody_met_is_refused() {
    let (mut mesh, _) = three();
    mesh.link_down(&id("a"), &id("c"));
    for incarnation in [2, u64::MAX] {
        mesh.inject(
            "b",
            "c",
            Frame::Forget {
                node: id("a"),
                incarnation,
                signature: None,
            },
        );
    }
    let c = mesh.node("c");
    assert_eq!(c.broker.nodes_for("a/x"), vec![id("a")]);
    assert_eq!(c.broker.stats().peers_forgotten, 0);
    assert_eq!(c.broker.stats().peer_frames_not_owner, 2);
    mesh.inject(
        "b",
        "c",
        Frame::Forget {
            node: id("a"),
            incarnation: 1,
            signature: None,
        },
    );
    let c = mesh.node("c");
    assert_eq!(c.broker.stats().peers_forgotten, 1);
    assert!(c.broker.nodes_for("a/x").is_empty());
}

/// With operator keys, a node's region is the operator's word, not the node's: a hello
/// naming a region without the operator's certificate of it records no region (so no
/// residency rule lets a restricted message go to that node) and is counted; a certified one
/// is taken.
#[test]
fn with_operator_keys_a_region_counts_only_certified() {
    let (mut mesh, _) = three();
    with_operator_keys(&mut mesh, &[("c", true)]);
    let region_of_b = |mesh: &mut Mesh| {
        let b = mesh
            .node("c")
            .broker
            .peers()
            .into_iter()
            .find(|p| p.node == id("b"));
        b.and_then(|b| b.region)
    };
    let hello = |region: &str, certificate: Option<&str>| Frame::Hello {
        node: id("b"),
        incarnation: 1,
        protocol: meridian_core::link::LINK_PROTOCOL_VERSION,
        region: region.into(),
        certificate: certificate.map(region_certificate),
    };
    mesh.inject("b", "c", hello("region-a", None));
    mesh.inject("b", "c", hello("region-a", Some("region-b")));
    assert_eq!(region_of_b(&mut mesh), None);
    assert_eq!(mesh.node("c").broker.stats().peer_frames_not_owner, 2);
    mesh.inject("b", "c", hello("region-b", Some("region-b")));
    assert_eq!(region_of_b(&mut mesh).as_deref(), Some("region-b"));
    assert_eq!(mesh.node("c").broker.stats().peer_frames_not_owner, 2);
}

/// Where members must be certified, a node holding the cluster key but no certificate of the
/// operator's (a rogue, built from the crate's own broker) is no member: its hello is refused
/// and its sessions cut, nothing it says is taken (its routes, its forwards), and nothing of
/// the deployment's state or messages is sent to it. Certified nodes mesh as before.
#[test]
fn with_members_certified_a_node_without_the_operators_certificate_is_no_member() {
    let certified = |c: &mut meridian_core::broker::ClusterConfig| {
        c.members_certified = true;
        c.certificate = Some(region_certificate(&c.region));
    };
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), certified);
    with_operator_keys(&mut mesh, &[("a", true), ("b", true)]);
    // The link comes up again under the operator's rules: a and b vouch for each other.
    mesh.link_down(&id("a"), &id("b"));
    mesh.link_up(&id("a"), &id("b"));
    mesh.settle();
    let on_b = mesh.node("b").connect(V5, "b-sub");
    mesh.node("b").subscribe(on_b, "t/#", QoS::AtLeastOnce);
    mesh.advance(100);
    assert_eq!(mesh.node("a").broker.nodes_for("t/x"), vec![id("b")]);

    mesh.join("r", Config::default(), |c| c.members_certified = true);
    // Each member sends the newcomer its hello and nothing else until it is vouched for.
    for n in ["a", "b"] {
        let kinds: Vec<FrameKind> = mesh.peek(n, "r").iter().map(Frame::kind).collect();
        assert_eq!(kinds, [FrameKind::Hello], "{n} told the rogue nothing more");
    }
    for n in ["a", "b"] {
        mesh.deliver_one_way("r", n);
        let w = mesh.node(n);
        assert!(
            w.cut_peers.contains(&id("r")),
            "{n} cut the rogue's session"
        );
        assert_eq!(w.broker.stats().peer_frames_not_owner, 1, "{n}");
    }
    // (Its daemon would dial again and be cut again: the links stay down here.)
    mesh.link_down(&id("a"), &id("r"));
    mesh.link_down(&id("b"), &id("r"));
    let publisher = mesh.node("a").connect(V5, "a-pub");
    mesh.node("a")
        .publish(publisher, "t/x", b"for members", QoS::AtLeastOnce, false, 1);
    mesh.settle();
    assert_eq!(mesh.node("b").received_publishes(on_b).len(), 1);
    let to_r = mesh.node("a").broker.peers();
    assert!(
        to_r.iter()
            .filter(|p| p.node == id("r"))
            .all(|p| p.outbox_messages == 0 && p.routes == 0),
        "{to_r:?}"
    );
    // What it sends straight is dropped.
    let on_a = mesh.node("a").connect(V5, "a-sub");
    mesh.node("a").subscribe(on_a, "r/#", QoS::AtLeastOnce);
    mesh.inject(
        "r",
        "a",
        Frame::Forward(Forward {
            origin: owner("r", 1),
            seq: 1,
            message: message("r/x", b"from the rogue", QoS::AtLeastOnce),
        }),
    );
    mesh.inject("r", "a", Frame::RouteDelta(delta("r", 1, &["t/#"])));
    mesh.settle();
    assert!(mesh.node("a").received_publishes(on_a).is_empty());
    assert_eq!(mesh.node("a").broker.nodes_for("t/x"), vec![id("b")]);
}

/// With operator keys, a member's word (at the incarnation every node knows) makes no node
/// drop what waits for a node that is merely cut off: only a forget the operator signed is
/// honoured, and it goes round with the announcement.
#[test]
fn with_operator_keys_only_a_signed_forget_is_honoured() {
    let (mut mesh, _) = three();
    with_operator_keys(&mut mesh, &[("b", true), ("c", true)]);
    mesh.link_down(&id("a"), &id("c"));
    mesh.link_down(&id("a"), &id("b"));
    let known = mesh
        .node("c")
        .broker
        .peers()
        .into_iter()
        .find(|p| p.node == id("a"))
        .map(|p| p.incarnation);
    assert_eq!(known, Some(1));
    for signature in [None, Some(Bytes::from_static(b"forged"))] {
        mesh.inject(
            "b",
            "c",
            Frame::Forget {
                node: id("a"),
                incarnation: 1,
                signature,
            },
        );
    }
    let c = mesh.node("c");
    assert_eq!(c.broker.stats().peer_frames_not_owner, 2);
    assert_eq!(c.broker.stats().peers_forgotten, 0);
    assert_eq!(c.broker.nodes_for("a/x"), vec![id("a")]);
    // The operator signs the forget of a at b (its admin API was given the signature).
    let b = mesh.node("b");
    let now = Timestamp(b.now);
    b.broker
        .forget_peer_signed(now, &id("a"), Some(Bytes::from_static(FORGET_SIGNATURE)))
        .unwrap();
    b.drain();
    mesh.settle();
    let c = mesh.node("c");
    assert_eq!(c.broker.stats().peers_forgotten, 1);
    assert!(c.broker.nodes_for("a/x").is_empty());
}

#[test]
fn a_node_absent_past_the_expiry_is_forgotten_by_itself() {
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), |c| {
        c.peer_expiry_ms = 10_000;
    });
    let sub = mesh.node("a").connect(V5, "sub");
    mesh.node("a").subscribe(sub, "a/#", QoS::AtLeastOnce);
    mesh.advance(50);
    mesh.link_down(&id("a"), &id("b"));
    mesh.node("b").advance(9_000);
    assert_eq!(mesh.node("b").broker.nodes_for("a/x"), vec![id("a")]);
    mesh.node("b").advance(4_000);
    let b = mesh.node("b");
    assert!(b.broker.nodes_for("a/x").is_empty());
    assert_eq!(b.broker.stats().peers_forgotten, 1);
    assert!(b.events.iter().any(|e| matches!(
        e,
        Event::PeerForgotten {
            reason: ForgetReason::Expired,
            ..
        }
    )));
    // It comes back: its routes are copied afresh and forwards reach it again, once each.
    mesh.link_up(&id("a"), &id("b"));
    mesh.advance(6_000);
    assert_eq!(mesh.node("b").broker.nodes_for("a/x"), vec![id("a")]);
    let publisher = mesh.node("b").connect(V5, "pub");
    mesh.node("b")
        .publish(publisher, "a/x", b"again", QoS::AtLeastOnce, false, 1);
    mesh.settle();
    let got = mesh.node("a").received_publishes(sub);
    assert_eq!(got.len(), 1);
}

#[test]
fn forwards_to_a_forgotten_node_that_returns_keep_their_numbering() {
    let (mut mesh, sub) = three();
    let publisher = mesh.node("c").connect(V5, "pub");
    for i in 1..=3u16 {
        mesh.node("c")
            .publish(publisher, "a/x", b"before", QoS::AtLeastOnce, false, i);
        mesh.settle();
    }
    assert_eq!(mesh.node("a").received_publishes(sub).len(), 3);
    mesh.link_down(&id("a"), &id("c"));
    let c = mesh.node("c");
    c.broker.forget_peer(Timestamp(c.now), &id("a")).unwrap();
    mesh.node("c").drain();
    // (b, which still reaches a, ignores c's announcement.)
    // a was only cut off from c: it returns with the same incarnation, its inbox remembering
    // c's numbers 1 to 3. New forwards must not be mistaken for those.
    mesh.link_up(&id("a"), &id("c"));
    mesh.advance(6_000);
    mesh.node("c")
        .publish(publisher, "a/x", b"after", QoS::AtLeastOnce, false, 9);
    mesh.settle();
    let got = mesh.node("a").received_publishes(sub);
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].payload[..], b"after");
}

#[test]
fn a_forwarded_message_meets_the_receiving_nodes_access_rules() {
    let mut mesh = Mesh::new(&["a", "b"], Config::default(), |_| {});
    let acl = Acl::new(
        Permission::Allow,
        vec![Rule::new(Permission::Deny, Action::Subscribe, "a/secret/#").unwrap()],
    );
    let a = mesh.node("a");
    a.broker
        .set_hooks(Timestamp(a.now), Box::new(AllowAll), Box::new(acl));
    let sub = mesh.node("a").connect(V5, "sub");
    assert_eq!(
        mesh.node("a").subscribe(sub, "a/#", QoS::AtLeastOnce),
        vec![ReasonCode::GRANTED_QOS_1],
        "overlaps the deny rule: accepted, filtered"
    );
    mesh.advance(50);
    let publisher = mesh.node("b").connect(V5, "pub");
    mesh.node("b")
        .publish(publisher, "a/secret/x", b"no", QoS::AtLeastOnce, false, 1);
    mesh.node("b")
        .publish(publisher, "a/open", b"yes", QoS::AtLeastOnce, false, 2);
    mesh.settle();
    let got = mesh.node("a").received_publishes(sub);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].topic, "a/open");
    assert_eq!(mesh.node("a").broker.stats().withheld_not_authorized, 1);
}

mod forged {
    use super::*;
    use proptest::prelude::*;

    /// A frame from `b` that speaks for `a`: its routes, its forwards, its retained writes, its
    /// digest, its hello.
    fn forged_frame() -> impl Strategy<Value = Frame> {
        let filters = prop::collection::vec("[a-z]{1,3}(/[a-z#+]{1,2})?", 0..4);
        prop_oneof![
            (any::<u64>(), filters.clone()).prop_map(|(inc, f)| {
                let f: Vec<&str> = f.iter().map(String::as_str).collect();
                Frame::RouteDelta(delta("a", inc, &f))
            }),
            (any::<u64>(), any::<u64>(), filters).prop_map(|(inc, version, f)| {
                Frame::SnapshotChunk(SnapshotChunk {
                    owner: owner("a", inc),
                    version,
                    hash: meridian_core::routes::set_hash(f.iter().map(String::as_str)),
                    index: 0,
                    count: 1,
                    filters: f.iter().map(|s| Arc::from(s.as_str())).collect(),
                })
            }),
            (any::<u64>(), any::<u64>()).prop_map(|(inc, seq)| {
                Frame::Forward(Forward {
                    origin: owner("a", inc),
                    seq,
                    message: message("a/x", b"forged", QoS::AtLeastOnce),
                })
            }),
            (any::<u64>(), any::<u32>()).prop_map(|(wall_ms, logical)| {
                Frame::Retained(RetainedUpdate {
                    topic: "a/r".into(),
                    stamp: Stamp {
                        hlc: Hlc { wall_ms, logical },
                        node: id("a"),
                    },
                    message: Some(message("a/r", b"forged", QoS::AtMostOnce)),
                })
            }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(inc, version, hash)| {
                Frame::Digest(vec![DigestEntry {
                    owner: owner("a", inc),
                    version,
                    hash,
                }])
            }),
            any::<u64>().prop_map(|incarnation| Frame::Hello {
                node: id("a"),
                incarnation,
                protocol: 2,
                region: "forged".into(),
                certificate: None,
            }),
            // Relayed writes in a's name (c reaches a: it takes a's writes from a only), and
            // one in c's own name.
            (any::<u64>(), any::<bool>(), any::<bool>()).prop_map(|(wall_ms, as_c, delete)| {
                Frame::RetainedSnapshot(vec![RetainedUpdate {
                    topic: "a/r".into(),
                    stamp: Stamp {
                        hlc: Hlc {
                            wall_ms: wall_ms % 2_000_000,
                            logical: 0,
                        },
                        node: id(if as_c { "c" } else { "a" }),
                    },
                    message: (!delete).then(|| message("a/r", b"forged", QoS::AtMostOnce)),
                }])
            }),
            any::<u64>().prop_map(|incarnation| Frame::Forget {
                node: id("a"),
                incarnation,
                signature: None,
            }),
        ]
    }

    proptest! {
        #[test]
        fn whatever_b_says_for_a_changes_nothing_c_holds_of_a(
            frames in prop::collection::vec(forged_frame(), 1..20),
        ) {
            let (mut mesh, sub) = three();
            let before = mesh.node("c").broker.replicated_routes(&id("a"));
            let retained = mesh.node("c").broker.retained_digest();
            // Relays and forget announcements are not faults: they are ignored here.
            let n = frames
                .iter()
                .filter(|f| !matches!(f, Frame::RetainedSnapshot(_) | Frame::Forget { .. }))
                .count() as u64;
            for frame in frames {
                mesh.inject("b", "c", frame.clone());
                mesh.inject("b", "a", frame);
            }
            mesh.settle();
            let c = mesh.node("c");
            prop_assert_eq!(c.broker.replicated_routes(&id("a")), before);
            prop_assert_eq!(c.broker.nodes_for("a/x"), vec![id("a")]);
            prop_assert_eq!(c.broker.retained_digest(), retained);
            prop_assert_eq!(c.broker.stats().peer_frames_not_owner, n);
            prop_assert!(mesh.node("a").received_publishes(sub).is_empty());
        }
    }
}

/// a and c, c's outbox for a holding 2 messages, a stall time of 5 s, a subscribed to `f`.
fn two_with_a_small_outbox() -> Mesh {
    let limits = OutboxLimits {
        window: 10,
        max_messages: 2,
        max_bytes: 1 << 20,
    };
    let mut mesh = Mesh::new(&["a", "c"], Config::default(), move |c| {
        c.outbox = limits;
        c.outbox_stall_ms = 5_000;
    });
    let sub = mesh.node("a").connect(V5, "sub");
    mesh.node("a").subscribe(sub, "f", QoS::AtLeastOnce);
    mesh.advance(50);
    mesh
}

#[test]
fn a_peer_that_never_acknowledges_holds_publishers_back_only_until_the_stall_time() {
    let mut mesh = two_with_a_small_outbox();
    // a's link stays up, but nothing it is sent is ever acknowledged (nothing is carried).
    let publisher = mesh.node("c").connect(V5, "pub");
    for i in 1..=3u16 {
        mesh.node("c")
            .publish(publisher, "f", b"x", QoS::AtLeastOnce, false, i);
    }
    assert_eq!(
        mesh.node("c").puback_reasons(publisher),
        vec![
            ReasonCode::SUCCESS,
            ReasonCode::SUCCESS,
            ReasonCode::QUOTA_EXCEEDED
        ],
        "a peer that is there and full holds publishers back"
    );
    mesh.node("c").advance(6_000);
    mesh.node("c").peer_out.clear();
    mesh.node("c")
        .publish(publisher, "f", b"x", QoS::AtLeastOnce, false, 4);
    assert_eq!(
        mesh.node("c").puback_reasons(publisher),
        vec![ReasonCode::SUCCESS],
        "stalled: it no longer does"
    );
    assert_eq!(mesh.node("c").broker.stats().dropped_peer_absent, 1);
}

#[test]
fn duplicate_marks_of_nodes_forgotten_long_ago_are_let_go() {
    let mut mesh = Mesh::new(&["a"], Config::default(), |c| c.max_nodes = 2_000);
    let sub = mesh.node("a").connect(V5, "sub");
    // At QoS 0, so that no window holds deliveries back.
    mesh.node("a").subscribe(sub, "t", QoS::AtMostOnce);
    let forward = |from: &str| {
        Frame::Forward(Forward {
            origin: owner(from, 1),
            seq: 7,
            message: message("t", from.as_bytes(), QoS::AtLeastOnce),
        })
    };
    let names: Vec<String> = (0..1_025).map(|i| format!("s{i}")).collect();
    for name in &names {
        mesh.inject(name, "a", forward(name));
    }
    assert_eq!(mesh.node("a").received_publishes(sub).len(), 1_025);
    for name in &names {
        {
            let a = mesh.node("a");
            a.broker.forget_peer(Timestamp(a.now), &id(name)).unwrap();
        }
    }
    mesh.node("a").drain();
    // The most recently forgotten still has its mark: a re-sent forward is a duplicate.
    mesh.inject("s1024", "a", forward("s1024"));
    assert!(mesh.node("a").received_publishes(sub).is_empty());
    // The first was forgotten 1,025 nodes ago: its marks (memory, records) are gone.
    mesh.inject("s0", "a", forward("s0"));
    assert_eq!(mesh.node("a").received_publishes(sub).len(), 1);
}

#[test]
fn a_relayed_retained_write_counts_against_its_relayer_and_never_speaks_for_reachable_nodes() {
    let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), |c| {
        c.peer_limits.max_retained_messages = 2;
    });
    let now = mesh.node("c").now;
    let write = |topic: &str, node: &str, wall_ms: u64| RetainedUpdate {
        topic: topic.into(),
        stamp: Stamp {
            hlc: Hlc {
                wall_ms,
                logical: 0,
            },
            node: id(node),
        },
        message: Some(message(topic, b"relayed", QoS::AtMostOnce)),
    };
    // b relays writes in the names of c itself and of a, which c reaches: ignored.
    mesh.inject(
        "b",
        "c",
        Frame::RetainedSnapshot(vec![write("r/1", "c", now), write("r/2", "a", now)]),
    );
    assert_eq!(mesh.node("c").broker.retained_digest().unwrap().entries, 0);
    // In the name of a node c cannot reach: taken, on b's account, which holds two.
    mesh.link_down(&id("a"), &id("c"));
    mesh.inject(
        "b",
        "c",
        Frame::RetainedSnapshot(vec![
            write("r/1", "a", now),
            write("r/2", "a", now),
            write("r/3", "a", now),
        ]),
    );
    let c = mesh.node("c");
    assert_eq!(c.broker.retained_digest().unwrap().entries, 2);
    assert_eq!(c.broker.stats().peer_frames_over_limit, 1);
    assert_eq!(
        c.cut_peers,
        vec![id("b")],
        "the relayer pays, with its session"
    );
    c.cut_peers.clear();
    // a's own writes are not spent by what b relayed.
    mesh.link_up(&id("a"), &id("c"));
    mesh.settle();
    let a = mesh.node("a");
    let p = a.connect(V5, "p");
    a.publish(p, "r/own1", b"x", QoS::AtMostOnce, true, 0);
    a.publish(p, "r/own2", b"x", QoS::AtMostOnce, true, 0);
    mesh.settle();
    let c = mesh.node("c");
    assert!(c.cut_peers.is_empty(), "a was not cut: {:?}", c.cut_peers);
    assert_eq!(c.broker.stats().retained_messages, 4);
}

#[test]
fn a_retained_write_the_store_keeps_out_is_not_taken_nor_counted() {
    let config = Config {
        max_retained_messages: 1,
        ..Config::default()
    };
    let mut mesh = Mesh::new(&["a", "b"], config, |c| {
        c.peer_limits.max_retained_messages = 2;
    });
    let now = mesh.node("b").now;
    let write = |topic: &str, payload: &'static [u8], logical: u32| {
        Frame::Retained(RetainedUpdate {
            topic: topic.into(),
            stamp: Stamp {
                hlc: Hlc {
                    wall_ms: now,
                    logical,
                },
                node: id("a"),
            },
            message: Some(message(topic, payload, QoS::AtMostOnce)),
        })
    };
    mesh.inject("a", "b", write("r/1", b"x", 1));
    // b's store is full: a's next topics are kept out, and do not count on a's account (two
    // would reach its bound of 2), so a's write of a third is kept out again, no fault.
    mesh.inject("a", "b", write("r/2", b"x", 2));
    mesh.inject("a", "b", write("r/3", b"x", 3));
    mesh.inject("a", "b", write("r/4", b"x", 4));
    mesh.inject("a", "b", write("r/1", b"y", 5));
    let b = mesh.node("b");
    assert_eq!(b.broker.stats().retained_messages, 1);
    assert_eq!(b.broker.stats().dropped_retained_full, 3);
    assert_eq!(b.broker.stats().peer_frames_over_limit, 0);
    assert!(b.cut_peers.is_empty());
    assert_eq!(
        b.broker.retained_digest().unwrap().entries,
        1,
        "r/2 to r/4 not taken"
    );
    let sub = b.connect(V5, "s");
    let got = b.subscribe_collect(sub, "r/1", Default::default());
    assert!(
        got.iter()
            .any(|p| matches!(p, Packet::Publish(p) if &p.payload[..] == b"y"))
    );
}

#[test]
fn a_peer_that_was_idle_is_not_taken_for_stalled_by_the_burst_that_follows() {
    let mut mesh = two_with_a_small_outbox();
    // Quiet for longer than the stall time, then a burst faster than a can acknowledge.
    mesh.advance(20_000);
    let publisher = mesh.node("c").connect(V5, "pub");
    for i in 1..=3u16 {
        mesh.node("c")
            .publish(publisher, "f", b"x", QoS::AtLeastOnce, false, i);
    }
    assert_eq!(
        mesh.node("c").puback_reasons(publisher),
        vec![
            ReasonCode::SUCCESS,
            ReasonCode::SUCCESS,
            ReasonCode::QUOTA_EXCEEDED
        ]
    );
    assert_eq!(mesh.node("c").broker.stats().dropped_peer_absent, 0);
}

#[test]
fn nodes_forgotten_before_a_restart_are_let_go_in_their_turn_after_it() {
    let mut mesh = Mesh::new(&["a"], Config::default(), |c| c.max_nodes = 3_000);
    let forward = |from: &str| {
        Frame::Forward(Forward {
            origin: owner(from, 1),
            seq: 7,
            message: message("t", from.as_bytes(), QoS::AtLeastOnce),
        })
    };
    let forget_all = |mesh: &mut Mesh, names: &[String]| {
        for name in names {
            mesh.inject(name, "a", forward(name));
        }
        for name in names {
            {
                let a = mesh.node("a");
                a.broker.forget_peer(Timestamp(a.now), &id(name)).unwrap();
            }
        }
        mesh.node("a").drain();
    };
    let first: Vec<String> = (0..600).map(|i| format!("s{i}")).collect();
    let second: Vec<String> = (600..1_200).map(|i| format!("s{i}")).collect();
    forget_all(&mut mesh, &first);
    mesh.crash_and_restart("a");
    forget_all(&mut mesh, &second);
    let sub = mesh.node("a").connect(V5, "sub");
    mesh.node("a").subscribe(sub, "t", QoS::AtMostOnce);
    // 1,200 forgotten: the oldest 176 (forgotten before the restart) were let go.
    mesh.inject("s0", "a", forward("s0"));
    assert_eq!(mesh.node("a").received_publishes(sub).len(), 1, "s0 let go");
    mesh.inject("s599", "a", forward("s599"));
    assert!(
        mesh.node("a").received_publishes(sub).is_empty(),
        "s599 still remembered across the restart"
    );
}
