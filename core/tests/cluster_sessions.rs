//! Sessions that follow their clients across nodes: one owner per client id, claimed by the
//! node the client connects to; the node that held the session closes the old connection
//! (0x8E) and ships the session there; a session belongs to the user that made it.

mod common;

use common::mesh::{Mesh, id};
use common::*;
use meridian_core::codec::{Ack, LastWill, Packet, ProtocolVersion, QoS, ReasonCode};
use meridian_core::{Config, ConnId};

fn persistent(c: &mut meridian_core::codec::Connect) {
    c.clean_start = false;
    c.properties.session_expiry_interval = Some(3600);
}

fn as_user(user: &'static str) -> impl Fn(&mut meridian_core::codec::Connect) {
    move |c| {
        persistent(c);
        c.username = Some(user.into());
    }
}

fn three() -> Mesh {
    Mesh::new(&["a", "b", "c"], Config::default(), |_| {})
}

/// A subscriber of `t/#` at `node`, with a persistent session, its SUBACK in.
fn subscriber(mesh: &mut Mesh, node: &str, qos: QoS) -> ConnId {
    let conn = mesh.node(node).connect_with(V5, "dev", persistent).0;
    mesh.node(node).subscribe(conn, "t/#", qos);
    mesh.advance(50);
    conn
}

fn publish_numbers(mesh: &mut Mesh, node: &str, range: std::ops::Range<u32>, qos: QoS) {
    let publisher = mesh.node(node).connect(V5, &format!("pub-{node}"));
    for i in range {
        mesh.node(node)
            .publish(publisher, "t/x", &i.to_be_bytes(), qos, false, i as u16 + 1);
        mesh.settle();
    }
}

/// A DISCONNECT with session expiry 0: it ends the session.
fn ending_session() -> Packet {
    Packet::Disconnect(meridian_core::codec::Disconnect {
        reason: ReasonCode::SUCCESS,
        properties: meridian_core::codec::DisconnectProperties {
            session_expiry_interval: Some(0),
            ..Default::default()
        },
    })
}

fn disconnect_reason(packets: &[Packet]) -> Option<ReasonCode> {
    packets.iter().find_map(|p| match p {
        Packet::Disconnect(d) => Some(d.reason),
        _ => None,
    })
}

#[test]
fn a_session_follows_its_client_to_another_node() {
    let mut mesh = three();
    let old = subscriber(&mut mesh, "a", QoS::AtLeastOnce);
    mesh.node("a").close(old);
    mesh.settle();
    // Queued at a while the client is away.
    publish_numbers(&mut mesh, "c", 0..5, QoS::AtLeastOnce);
    assert_eq!(mesh.node("a").broker.stats().queued_messages, 5);

    let (conn, ack) = mesh.node("b").connect_with(V5, "dev", persistent);
    assert!(ack.session_present, "a's claim says the session exists");
    mesh.settle();
    assert_eq!(
        mesh.node("b").read_numbers(conn),
        (0..5).collect::<Vec<_>>()
    );
    assert_eq!(mesh.node("a").broker.stats().sessions, 0, "a let it go");
    assert_eq!(mesh.node("a").broker.stats().sessions_moved_out, 1);
    assert_eq!(mesh.node("b").broker.stats().sessions_moved_in, 1);
    assert_eq!(mesh.node("a").broker.sessions_in_transit(), 0, "b took it");
    for n in ["a", "b", "c"] {
        assert_eq!(mesh.node(n).broker.claim_owner("dev"), Some(id("b")), "{n}");
    }

    // Its subscription came along: once b's routes are everywhere (a route batch), a lets
    // go of the session's subscriptions (another batch), and new messages go to b only.
    mesh.advance(50);
    assert_eq!(
        mesh.node("c").broker.nodes_for("t/x"),
        vec![id("a"), id("b")]
    );
    mesh.advance(50);
    assert_eq!(mesh.node("c").broker.nodes_for("t/x"), vec![id("b")]);
    publish_numbers(&mut mesh, "c", 5..8, QoS::AtLeastOnce);
    assert_eq!(mesh.node("b").read_numbers(conn), vec![5, 6, 7]);
}

#[test]
fn the_old_connection_is_taken_over_with_0x8e_and_its_in_flight_messages_keep_their_ids() {
    let mut mesh = three();
    let old = subscriber(&mut mesh, "a", QoS::ExactlyOnce);
    publish_numbers(&mut mesh, "c", 0..3, QoS::ExactlyOnce);
    // Received on a, never acknowledged: the client moved on.
    let sent = mesh.node("a").received_publishes(old);
    assert_eq!(sent.len(), 3);

    let (conn, ack) = mesh.node("b").connect_with(V5, "dev", persistent);
    assert!(ack.session_present);
    mesh.settle();
    assert!(mesh.node("a").is_closed(old));
    assert_eq!(
        disconnect_reason(&mesh.node("a").recv(old)),
        Some(ReasonCode::SESSION_TAKEN_OVER)
    );
    let again = mesh.node("b").received_publishes(conn);
    assert_eq!(again.len(), 3, "re-sent from b: {again:?}");
    for (first, resent) in sent.iter().zip(&again) {
        assert_eq!(resent.packet_id, first.packet_id, "same packet id");
        assert!(resent.dup, "a re-send");
        assert_eq!(resent.payload, first.payload);
    }
    for p in &again {
        mesh.node("b").ack(conn, p);
    }
    assert_eq!(mesh.node("b").broker.stats().inflight_messages, 0);
}

#[test]
fn nothing_in_flight_goes_out_before_the_session_arrives() {
    let mut mesh = three();
    subscriber(&mut mesh, "a", QoS::AtLeastOnce);
    publish_numbers(&mut mesh, "c", 0..2, QoS::AtLeastOnce);
    // b subscribes to the same topic for another client, so a message published at b is
    // delivered to dev there too once its session arrived (and not before).
    let (conn, ack) = mesh.node("b").connect_with(V5, "dev", persistent);
    assert!(ack.session_present);
    // Nothing delivered yet: the transfer has not come (the mesh holds it until settle).
    assert!(mesh.node("b").received_publishes(conn).is_empty());
    mesh.settle();
    let got = mesh.node("b").received_publishes(conn);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].packet_id, Some(1));
}

#[test]
fn a_resume_whose_session_never_comes_goes_on_after_the_wait() {
    let mut mesh = three();
    subscriber(&mut mesh, "a", QoS::AtLeastOnce);
    mesh.link_down(&id("a"), &id("b"));
    let (conn, ack) = mesh.node("b").connect_with(V5, "dev", persistent);
    assert!(ack.session_present, "b knew a's claim before the cut");
    mesh.node("b").subscribe(conn, "t/#", QoS::AtLeastOnce);
    mesh.advance(50);
    publish_numbers(&mut mesh, "c", 0..2, QoS::AtLeastOnce);
    assert!(mesh.node("b").received_publishes(conn).is_empty(), "held");
    mesh.advance(5_000);
    assert_eq!(mesh.node("b").read_numbers(conn), vec![0, 1]);
    assert_eq!(
        mesh.node("b").broker.stats().sessions_transfer_waits_over,
        1
    );
    // The link returns: a learns b's claim, and its session follows (its subscription is b's
    // already; nothing was queued there).
    mesh.link_up(&id("a"), &id("b"));
    mesh.settle();
    assert_eq!(mesh.node("a").broker.stats().sessions, 0);
    assert_eq!(mesh.node("b").broker.stats().sessions_moved_in, 1);
}

#[test]
fn messages_published_while_a_session_moves_reach_it_once() {
    let mut mesh = three();
    subscriber(&mut mesh, "a", QoS::ExactlyOnce);
    let from_c = mesh.node("c").connect(V5, "pub-c");
    let from_b = mesh.node("b").connect(V5, "pub-b");
    mesh.settle();
    let (conn, _) = mesh.node("b").connect_with(V5, "dev", persistent);
    mesh.settle();
    // The session is on b; c still routes its topic to a only, and a relays (it lists no
    // client for that).
    assert_eq!(mesh.node("c").broker.nodes_for("t/x"), vec![id("a")]);
    assert!(mesh.node("a").broker.clients().is_empty());
    mesh.node("c").publish(
        from_c,
        "t/x",
        &1u32.to_be_bytes(),
        QoS::ExactlyOnce,
        false,
        1,
    );
    mesh.settle();
    // Published on b: delivered there, and sent to a (which still wants it), which relays
    // it back.
    mesh.node("b").publish(
        from_b,
        "t/x",
        &2u32.to_be_bytes(),
        QoS::ExactlyOnce,
        false,
        1,
    );
    mesh.settle();
    // c learns b's route before a lets go: c sends the next one both ways.
    mesh.node("b").advance(50);
    mesh.deliver_one_way("b", "c");
    assert_eq!(
        mesh.node("c").broker.nodes_for("t/x"),
        vec![id("a"), id("b")]
    );
    mesh.node("c").publish(
        from_c,
        "t/x",
        &3u32.to_be_bytes(),
        QoS::ExactlyOnce,
        false,
        2,
    );
    mesh.settle();
    mesh.advance(50);
    mesh.advance(50);
    assert_eq!(mesh.node("c").broker.nodes_for("t/x"), vec![id("b")]);
    mesh.node("c").publish(
        from_c,
        "t/x",
        &4u32.to_be_bytes(),
        QoS::ExactlyOnce,
        false,
        3,
    );
    mesh.settle();

    let got = mesh.node("b").read_numbers(conn);
    let mut each = got.clone();
    each.sort_unstable();
    assert_eq!(each, vec![1, 2, 3, 4], "each once: {got:?}");
    let from_c: Vec<u32> = got.iter().copied().filter(|n| *n != 2).collect();
    assert_eq!(from_c, vec![1, 3, 4], "c's in c's order: {got:?}");
    let a = mesh.node("a").broker.stats();
    assert_eq!(a.messages_relayed, 3, "1, 2 and 3 went through a");
    assert_eq!(
        mesh.node("b").broker.stats().dropped_moved_twice,
        2,
        "2 and 3 came both ways"
    );
    assert_eq!(a.sessions, 0);
    assert_eq!(a.subscriptions, 0, "the relay ended");
}

#[test]
fn what_waits_to_be_relayed_is_bounded_as_a_session_queue() {
    let config = Config {
        max_queued_messages: 3,
        ..Config::default()
    };
    let mut mesh = Mesh::new(&["a", "b", "c"], config, |_| {});
    subscriber(&mut mesh, "a", QoS::AtLeastOnce);
    let _ = mesh.node("b").connect_with(V5, "dev", persistent);
    // a hears b's claim and becomes a relay; then its link to b goes.
    mesh.deliver_one_way("b", "a");
    mesh.link_down(&id("a"), &id("b"));
    publish_numbers(&mut mesh, "c", 0..5, QoS::AtLeastOnce);
    let a = mesh.node("a").broker.stats();
    assert_eq!(a.messages_relayed, 3, "held for b");
    assert_eq!(a.dropped_queue_full, 2, "past the bound, counted");
}

#[test]
fn a_clean_start_elsewhere_ends_the_old_session_and_its_will_goes_once() {
    let mut mesh = three();
    let watcher = mesh.node("c").connect(V5, "watcher");
    mesh.node("c")
        .subscribe(watcher, "wills/#", QoS::AtLeastOnce);
    mesh.advance(50);
    let old = mesh
        .node("a")
        .connect_with(V5, "dev", |c| {
            persistent(c);
            c.will = Some(LastWill {
                topic: "wills/dev".into(),
                payload: bytes::Bytes::from_static(b"gone"),
                qos: QoS::AtLeastOnce,
                retain: false,
                properties: Default::default(),
            });
        })
        .0;
    mesh.node("a").subscribe(old, "t/#", QoS::AtLeastOnce);
    mesh.advance(50);

    let (_conn, ack) = mesh.node("b").connect_with(V5, "dev", |_| {});
    assert!(!ack.session_present, "a clean start has no session");
    mesh.settle();
    assert!(mesh.node("a").is_closed(old));
    assert_eq!(mesh.node("a").broker.stats().sessions, 0, "ended");
    assert_eq!(mesh.node("a").broker.stats().sessions_moved_out, 0);
    let wills = mesh.node("c").received_publishes(watcher);
    assert_eq!(wills.len(), 1, "one will, from a: {wills:?}");
    assert_eq!(&wills[0].payload[..], b"gone");
    mesh.advance(50);
    assert!(
        mesh.node("c").broker.nodes_for("t/x").is_empty(),
        "the old session's subscription went with it"
    );
}

#[test]
fn another_users_session_is_refused_on_every_node() {
    let mut mesh = three();
    let alice = mesh.node("a").connect_with(V5, "dev", as_user("alice")).0;
    mesh.settle();
    // On another node (the claim says whose it is), 5.0 and 3.1.1.
    let (refused, ack) = mesh.node("b").connect_with(V5, "dev", as_user("mallory"));
    assert_eq!(ack.reason, ReasonCode::NOT_AUTHORIZED);
    assert!(mesh.node("b").is_closed(refused));
    let (_, ack) = mesh
        .node("c")
        .connect_with(ProtocolVersion::V311, "dev", as_user("mallory"));
    // Decoded from the 3.1.1 return code 5.
    assert_eq!(ack.reason, ReasonCode::NOT_AUTHORIZED);
    // And on the node that holds it.
    let (_, ack) = mesh.node("a").connect_with(V5, "dev", as_user("mallory"));
    assert_eq!(ack.reason, ReasonCode::NOT_AUTHORIZED);
    mesh.settle();
    assert!(
        !mesh.node("a").is_closed(alice),
        "alice kept her connection"
    );
    assert_eq!(mesh.node("b").broker.claim_owner("dev"), Some(id("a")));

    // Alice herself may move it.
    let (_, ack) = mesh.node("b").connect_with(V5, "dev", as_user("alice"));
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    assert!(ack.session_present);
    mesh.settle();
    assert!(mesh.node("a").is_closed(alice));
}

#[test]
fn a_session_that_ends_lets_go_of_its_client_id() {
    let mut mesh = three();
    let conn = mesh.node("a").connect_with(V5, "dev", as_user("alice")).0;
    mesh.settle();
    assert_eq!(mesh.node("b").broker.claim_owner("dev"), Some(id("a")));
    assert_eq!(mesh.node("b").broker.stats().claims, 1);
    // DISCONNECT with expiry 0 ends the session.
    mesh.node("a").send(conn, ending_session());
    mesh.settle();
    assert_eq!(mesh.node("b").broker.claim_owner("dev"), None);
    assert_eq!(mesh.node("b").broker.stats().claims, 0);
    assert_eq!(mesh.node("a").broker.stats().claims, 0);
    // Free for anyone now.
    let (_, ack) = mesh.node("b").connect_with(V5, "dev", as_user("bob"));
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    assert!(!ack.session_present);
}

#[test]
fn simultaneous_claims_leave_one_owner_everywhere() {
    let mut mesh = three();
    mesh.link_down(&id("a"), &id("b"));
    mesh.link_down(&id("a"), &id("c"));
    let on_a = mesh.node("a").connect_with(V5, "dev", persistent).0;
    mesh.node("a").subscribe(on_a, "from/a", QoS::AtLeastOnce);
    let on_b = mesh.node("b").connect_with(V5, "dev", persistent).0;
    mesh.node("b").subscribe(on_b, "from/b", QoS::AtLeastOnce);
    mesh.settle();
    mesh.link_up(&id("a"), &id("b"));
    mesh.link_up(&id("a"), &id("c"));
    mesh.settle();
    // The winner's routes, then the loser's relay ending: two route batches.
    mesh.advance(50);
    mesh.advance(50);
    let owners: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| mesh.node(n).broker.claim_owner("dev"))
        .collect();
    assert!(owners.windows(2).all(|w| w[0] == w[1]), "{owners:?}");
    let winner = owners[0].clone().expect("an owner");
    let (win, lose, loser_conn, winner_conn) = if winner == id("a") {
        ("a", "b", on_b, on_a)
    } else {
        ("b", "a", on_a, on_b)
    };
    assert!(
        mesh.node(lose).is_closed(loser_conn),
        "the loser was taken over"
    );
    assert_eq!(
        disconnect_reason(&mesh.node(lose).recv(loser_conn)),
        Some(ReasonCode::SESSION_TAKEN_OVER)
    );
    assert!(!mesh.node(win).is_closed(winner_conn));
    assert_eq!(mesh.node(lose).broker.stats().sessions, 0);
    // The winner's session holds both subscriptions.
    assert_eq!(
        mesh.node("c").broker.nodes_for("from/a"),
        vec![id(win)],
        "the loser's subscription joined the winner's session"
    );
    assert_eq!(mesh.node("c").broker.nodes_for("from/b"), vec![id(win)]);
}

#[test]
fn a_shipped_session_survives_a_restart_of_the_node_that_ships_it() {
    let mut mesh = three();
    let old = subscriber(&mut mesh, "a", QoS::AtLeastOnce);
    mesh.node("a").close(old);
    publish_numbers(&mut mesh, "c", 0..3, QoS::AtLeastOnce);
    let (conn, _) = mesh.node("b").connect_with(V5, "dev", persistent);
    // a hears the claim and ships; the transfer is lost with the link, then a crashes.
    mesh.deliver_one_way("b", "a");
    mesh.link_down(&id("a"), &id("b"));
    assert_eq!(mesh.node("a").broker.sessions_in_transit(), 1);
    mesh.crash_and_restart("a");
    assert_eq!(mesh.node("a").broker.sessions_in_transit(), 1, "kept");
    mesh.link_up(&id("a"), &id("b"));
    mesh.settle();
    assert_eq!(mesh.node("b").read_numbers(conn), vec![0, 1, 2]);
    assert_eq!(mesh.node("a").broker.sessions_in_transit(), 0);
    // Sent again on the next link session: still taken once.
    mesh.link_down(&id("a"), &id("b"));
    mesh.link_up(&id("a"), &id("b"));
    mesh.settle();
    assert!(mesh.node("b").received_publishes(conn).is_empty());
    assert_eq!(mesh.node("b").broker.stats().sessions_moved_in, 1);
}

#[test]
fn a_pubrel_for_a_message_the_old_node_received_is_answered_and_forgotten() {
    let mut mesh = three();
    let watcher = mesh.node("c").connect(V5, "watcher");
    mesh.node("c").subscribe(watcher, "t/y", QoS::AtLeastOnce);
    mesh.advance(50);
    let old = mesh.node("a").connect_with(V5, "dev", persistent).0;
    // QoS 2 publish received by a and PUBREC'd; the client moves before PUBREL.
    mesh.node("a")
        .publish(old, "t/y", &7u32.to_be_bytes(), QoS::ExactlyOnce, false, 9);
    assert!(
        mesh.node("a")
            .recv(old)
            .iter()
            .any(|p| matches!(p, Packet::PubRec(a) if a.packet_id == 9))
    );
    mesh.settle();
    let (conn, ack) = mesh.node("b").connect_with(V5, "dev", persistent);
    assert!(ack.session_present);
    // The client completes the exchange on b before the session arrives.
    mesh.node("b").send(conn, Packet::PubRel(Ack::new(9)));
    let comp = mesh.node("b").recv(conn);
    assert!(
        comp.iter()
            .any(|p| matches!(p, Packet::PubComp(a) if a.packet_id == 9 && a.reason == ReasonCode::SUCCESS)),
        "{comp:?}"
    );
    mesh.settle();
    // Packet id 9 is free again: a new QoS 2 message with it is a new message.
    mesh.node("b")
        .publish(conn, "t/y", &8u32.to_be_bytes(), QoS::ExactlyOnce, false, 9);
    mesh.settle();
    assert_eq!(
        mesh.node("c").read_numbers(watcher),
        vec![7, 8],
        "published once each"
    );
}

#[test]
fn a_shipped_message_waits_for_older_ones_of_its_node_that_come_another_way() {
    const ORDER_WAIT_MS: u64 = 2_000;
    let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), |c| {
        c.session_order_wait_ms = ORDER_WAIT_MS;
    });
    let first = subscriber(&mut mesh, "a", QoS::AtLeastOnce);
    mesh.node("a").close(first);
    mesh.settle();
    // c is cut off from a: what it publishes for the session waits in its outbox for a.
    mesh.link_down(&id("a"), &id("c"));
    publish_numbers(&mut mesh, "c", 0..3, QoS::AtLeastOnce);
    // The client stays on b a while: b takes the session, c sends to b too from then on.
    let (at_b, ack) = mesh.node("b").connect_with(V5, "dev", persistent);
    assert!(ack.session_present);
    for _ in 0..3 {
        mesh.advance(50);
    }
    assert_eq!(
        mesh.node("c").broker.nodes_for("t/x"),
        vec![id("a"), id("b")]
    );
    mesh.node("b").close(at_b);
    mesh.settle();
    publish_numbers(&mut mesh, "c", 3..6, QoS::AtLeastOnce);
    // a cannot say it relayed everything of c (c cannot echo), so b holds 3..5 until its
    // hold runs out; then they are queued ready to go.
    mesh.advance(ORDER_WAIT_MS + 1);
    assert_eq!(mesh.node("b").broker.stats().session_order_waits_over, 1);

    // The client comes back to a: b ships 3..5, which must wait for 0..2, still in c's
    // outbox for a.
    let (back, ack) = mesh.node("a").connect_with(V5, "dev", persistent);
    assert!(ack.session_present);
    mesh.advance(50);
    let early = mesh.node("a").read_numbers(back);
    mesh.link_up(&id("a"), &id("c"));
    for _ in 0..5 {
        mesh.advance(50);
    }
    let got: Vec<u32> = early
        .into_iter()
        .chain(mesh.node("a").read_numbers(back))
        .collect();
    assert_eq!(got, (0..6).collect::<Vec<_>>(), "each once, in c's order");
}

mod trust {
    use super::*;
    use bytes::Bytes;
    use common::operator::with_operator_keys;
    use meridian_core::link::{Claim, ClaimUpdate, Frame, SessionRelay, SessionTransfer};
    use meridian_core::retained::{Hlc, Stamp};

    fn stamp(node: &str, wall_ms: u64) -> Stamp {
        Stamp {
            hlc: Hlc {
                wall_ms,
                logical: 0,
            },
            node: id(node),
        }
    }

    fn claim(client_id: &str, node: &str) -> Frame {
        Frame::Claim(ClaimUpdate {
            client_id: client_id.into(),
            stamp: stamp(node, 1),
            claim: Some(Claim {
                user: None,
                resume: true,
                persistent: true,
                proof: None,
            }),
        })
    }

    #[test]
    fn a_peer_claims_for_itself_only() {
        let mut mesh = three();
        let conn = mesh.node("a").connect_with(V5, "dev", persistent).0;
        mesh.settle();
        // b says c took dev over: refused, and a keeps serving it.
        mesh.inject("b", "a", claim("dev", "c"));
        mesh.settle();
        assert_eq!(mesh.node("a").broker.stats().peer_frames_not_owner, 1);
        assert!(!mesh.node("a").is_closed(conn));
        assert_eq!(mesh.node("a").broker.claim_owner("dev"), Some(id("a")));
    }

    /// A member's releases of client ids it never claimed end nothing and are not kept (no
    /// tombstone, nothing stored), and a claim on an id longer than any client of the
    /// deployment can have is refused: a member cannot fill a node's claims with either.
    #[test]
    fn releases_of_ids_never_claimed_and_over_long_ids_take_no_room() {
        let mut mesh = three();
        let stored_claims = |mesh: &mut Mesh| {
            let store = &mesh.node("a").store;
            store.keys().filter(|k| k.first() == Some(&b'H')).count()
        };
        let before = stored_claims(&mut mesh);
        let wall_ms = mesh.node("a").now;
        for i in 0..1_000 {
            let ghost = ClaimUpdate {
                client_id: format!("ghost-{i}"),
                stamp: stamp("b", wall_ms + i),
                claim: None,
            };
            mesh.inject("b", "a", Frame::Claim(ghost));
        }
        let long = ClaimUpdate {
            client_id: "x".repeat(257),
            stamp: stamp("b", wall_ms + 1_000),
            claim: Some(Claim {
                user: None,
                resume: false,
                persistent: false,
                proof: None,
            }),
        };
        mesh.inject("b", "a", Frame::Claim(long.clone()));
        mesh.settle();
        assert_eq!(stored_claims(&mut mesh), before, "nothing kept");
        let a = mesh.node("a");
        assert_eq!(a.broker.claim_owner(&long.client_id), None);
        assert_eq!(a.broker.stats().peer_frames_not_owner, 1);
        // A release of b's own claim still ends it.
        let mine = ClaimUpdate {
            client_id: "dev".into(),
            stamp: stamp("b", wall_ms + 2_000),
            claim: Some(Claim {
                user: None,
                resume: true,
                persistent: true,
                proof: None,
            }),
        };
        mesh.inject("b", "a", Frame::Claim(mine.clone()));
        mesh.settle();
        assert_eq!(mesh.node("a").broker.claim_owner("dev"), Some(id("b")));
        let release = ClaimUpdate {
            claim: None,
            stamp: stamp("b", wall_ms + 2_001),
            ..mine
        };
        mesh.inject("b", "a", Frame::Claim(release));
        mesh.settle();
        assert_eq!(mesh.node("a").broker.claim_owner("dev"), None);
    }

    /// A claim naming another user than the one whose claim on the client id stands (what a
    /// node that knows another user's password can make) is not taken: alice's session, what
    /// is queued in it and her client id stay hers. Nor can the claimer clear her claim first
    /// with a release of its own: a release ends its sender's claim and no other.
    #[test]
    fn a_claim_of_another_user_takes_neither_the_client_id_nor_the_session() {
        let mut mesh = three();
        let alice = mesh.node("a").connect_with(V5, "dev", as_user("alice")).0;
        mesh.node("a").subscribe(alice, "t/#", QoS::AtLeastOnce);
        mesh.advance(50);
        mesh.node("a").close(alice);
        mesh.settle();
        publish_numbers(&mut mesh, "c", 0..3, QoS::AtLeastOnce);
        let wall_ms = mesh.node("a").now + 1_000;
        let mallory = ClaimUpdate {
            client_id: "dev".into(),
            stamp: stamp("b", wall_ms),
            claim: Some(Claim {
                user: Some("mallory".into()),
                resume: true,
                persistent: true,
                proof: None,
            }),
        };
        let release = ClaimUpdate {
            claim: None,
            ..mallory.clone()
        };
        for update in [release, mallory] {
            for to in ["a", "c"] {
                mesh.inject("b", to, Frame::Claim(update.clone()));
            }
            mesh.settle();
        }
        for n in ["a", "c"] {
            let node = mesh.node(n);
            assert_eq!(node.broker.claim_owner("dev"), Some(id("a")), "{n}");
            assert_eq!(node.broker.stats().claims_of_another_user, 1, "{n}");
        }
        assert_eq!(mesh.node("a").broker.sessions_in_transit(), 0);
        publish_numbers(&mut mesh, "c", 3..5, QoS::AtLeastOnce);
        let (back, ack) = mesh.node("a").connect_with(V5, "dev", as_user("alice"));
        assert_eq!(ack.reason, ReasonCode::SUCCESS);
        assert!(ack.session_present);
        mesh.settle();
        assert_eq!(
            mesh.node("a").read_numbers(back),
            (0..5).collect::<Vec<_>>()
        );
        // At c too, her session follows her there with what came since.
        mesh.node("a").close(back);
        publish_numbers(&mut mesh, "b", 5..7, QoS::AtLeastOnce);
        let (on_c, ack) = mesh.node("c").connect_with(V5, "dev", as_user("alice"));
        assert_eq!(ack.reason, ReasonCode::SUCCESS);
        mesh.settle();
        assert_eq!(mesh.node("c").read_numbers(on_c), vec![5, 6]);
    }

    /// A node that ends its session releases its own claim and no newer one: a client that
    /// reconnected at b while a was cut off keeps its claim when a's release arrives.
    #[test]
    fn a_release_ends_its_own_claim_not_a_newer_one_it_never_saw() {
        let mut mesh = three();
        let old = mesh.node("a").connect_with(V5, "dev", as_user("alice")).0;
        mesh.settle();
        mesh.link_down(&id("a"), &id("b"));
        mesh.link_down(&id("a"), &id("c"));
        let (on_b, ack) = mesh.node("b").connect_with(V5, "dev", as_user("alice"));
        assert_eq!(ack.reason, ReasonCode::SUCCESS);
        mesh.advance(10);
        // a never learns of b's claim before its own session ends (expiry 0).
        mesh.node("a").send(old, ending_session());
        mesh.settle();
        mesh.link_up(&id("a"), &id("b"));
        mesh.link_up(&id("a"), &id("c"));
        mesh.settle();
        for n in ["a", "b", "c"] {
            assert_eq!(mesh.node(n).broker.claim_owner("dev"), Some(id("b")), "{n}");
        }
        assert!(!mesh.node("b").is_closed(on_b));
        let (_, ack) = mesh.node("c").connect_with(V5, "dev", as_user("mallory"));
        assert_eq!(
            ack.reason,
            ReasonCode::NOT_AUTHORIZED,
            "b's claim keeps others out"
        );
    }

    /// A node's claim naming another user keeps that user out of the client id everywhere
    /// (0x87) for as long as the claim stands; once the node is forgotten, its claims go with
    /// it and the client id is free again.
    #[test]
    fn a_forgotten_node_s_claims_keep_no_one_out() {
        let mut mesh = three();
        mesh.inject(
            "c",
            "a",
            Frame::Claim(ClaimUpdate {
                client_id: "dev".into(),
                stamp: stamp("c", 1),
                claim: Some(Claim {
                    user: Some("mallory".into()),
                    resume: true,
                    persistent: true,
                    proof: None,
                }),
            }),
        );
        let (_, ack) = mesh.node("a").connect_with(V5, "dev", as_user("alice"));
        assert_eq!(
            ack.reason,
            ReasonCode::NOT_AUTHORIZED,
            "kept out by c's claim"
        );
        mesh.link_down(&id("a"), &id("c"));
        mesh.link_down(&id("b"), &id("c"));
        let a = mesh.node("a");
        a.broker
            .forget_peer(meridian_core::Timestamp(a.now), &id("c"))
            .unwrap();
        assert_eq!(mesh.node("a").broker.claim_owner("dev"), None);
        let (_, ack) = mesh.node("a").connect_with(V5, "dev", as_user("alice"));
        assert_eq!(ack.reason, ReasonCode::SUCCESS);
    }

    /// bob's claim on alice's client id, with bob's own valid proof (what a node bob logs in
    /// at can make for any client id, and what two users' clients meeting during a cut make),
    /// is not taken where alice's claim stands: she keeps her connection, her session and the
    /// client id; bob is served where he connected.
    #[test]
    fn a_proven_claim_of_another_user_takes_nothing_of_hers() {
        let mut mesh = three();
        with_operator_keys(&mut mesh, &[("a", true), ("b", true), ("c", true)]);
        mesh.link_down(&id("a"), &id("b"));
        let alice = mesh.node("a").connect_with(V5, "dev", as_user("alice")).0;
        mesh.node("a").subscribe(alice, "t/#", QoS::AtLeastOnce);
        mesh.advance(50);
        let (bob, ack) = mesh.node("b").connect_with(V5, "dev", as_user("bob"));
        assert_eq!(
            ack.reason,
            ReasonCode::SUCCESS,
            "b has not met alice's claim"
        );
        mesh.link_up(&id("a"), &id("b"));
        mesh.settle();
        for n in ["a", "c"] {
            let node = mesh.node(n);
            assert_eq!(node.broker.claim_owner("dev"), Some(id("a")), "{n}");
            assert_eq!(node.broker.stats().claims_of_another_user, 1, "{n}");
            assert_eq!(
                node.broker.stats().claims_unproven,
                0,
                "{n}: bob's proof holds"
            );
        }
        assert!(!mesh.node("a").is_closed(alice));
        assert!(!mesh.node("b").is_closed(bob));
        publish_numbers(&mut mesh, "c", 0..3, QoS::AtLeastOnce);
        assert_eq!(mesh.node("a").read_numbers(alice), vec![0, 1, 2]);
    }

    /// alice's session at a, with c's messages 0 and 1 queued in it; alice resumes it at b,
    /// and a learns b's claim (a's shipment waits on the link to b). Her connection at b.
    fn alice_queued_at_a_resumes_at_b(mesh: &mut Mesh) -> meridian_core::ConnId {
        let on_a = mesh.node("a").connect_with(V5, "dev", as_user("alice")).0;
        mesh.node("a").subscribe(on_a, "t/#", QoS::AtLeastOnce);
        mesh.advance(50);
        mesh.node("a").close(on_a);
        publish_numbers(mesh, "c", 0..2, QoS::AtLeastOnce);
        let (on_b, ack) = mesh.node("b").connect_with(V5, "dev", as_user("alice"));
        assert!(ack.session_present);
        mesh.deliver_one_way("b", "a");
        on_b
    }

    /// The value of a shipped session's window (its `Seen` record, as the link carries it)
    /// saying the session had `node`'s messages (incarnation 1) up to `upto`.
    fn window_saying_had(node: &str, upto: u64) -> Bytes {
        let mut v = Vec::new();
        v.extend_from_slice(&[1, 0]); // format, no state awaited
        v.extend_from_slice(&0u32.to_be_bytes()); // no relays awaited
        v.extend_from_slice(&1u32.to_be_bytes()); // one origin:
        v.extend_from_slice(&(node.len() as u16).to_be_bytes());
        v.extend_from_slice(node.as_bytes());
        v.extend_from_slice(&1u64.to_be_bytes());
        v.extend_from_slice(&upto.to_be_bytes());
        v.extend_from_slice(&0u32.to_be_bytes()); // nothing above it
        v.extend_from_slice(&0u32.to_be_bytes()); // no earlier incarnations
        Bytes::from(v)
    }

    /// A node that held alice's session by a proven claim ships it on with a window saying she
    /// had c's messages far past what c has published (what a rogue there could say to have
    /// c's next messages to her dropped as had). b takes that word for c's messages only until
    /// c echoes the fence b sends it once the session is there: what c publishes after reaches
    /// her, each message once.
    #[test]
    fn a_window_s_word_on_a_third_node_s_messages_lasts_until_that_node_s_echo() {
        let mut mesh = three();
        with_operator_keys(&mut mesh, &[("a", true), ("b", true), ("c", true)]);
        let on_b = alice_queued_at_a_resumes_at_b(&mut mesh);
        let shipped = mesh.take("a", "b", |f| matches!(f, Frame::SessionTransfer(_)));
        assert_eq!(shipped.len(), 1, "a ships the session in one part");
        let Some(Frame::SessionTransfer(mut forged)) = shipped.into_iter().next() else {
            unreachable!()
        };
        let window = forged
            .records
            .iter_mut()
            .find(|(key, _)| key.first() == Some(&b'V'))
            .expect("the shipment carries its window");
        window.1 = window_saying_had("c", 1_000_000);
        mesh.inject("a", "b", Frame::SessionTransfer(forged));
        mesh.advance(50);
        assert_eq!(mesh.node("b").broker.stats().sessions_moved_in, 1);
        assert_eq!(mesh.node("b").read_numbers(on_b), vec![0, 1]);
        publish_numbers(&mut mesh, "c", 2..5, QoS::AtLeastOnce);
        assert_eq!(mesh.node("b").read_numbers(on_b), vec![2, 3, 4]);
        assert_eq!(mesh.node("b").broker.stats().dropped_moved_twice, 0);
    }

    /// A claim the authorizer does not vouch for (no proof that the client logged in as the
    /// user it names) moves no session and keeps no one out; one with the proof does.
    #[test]
    fn a_claim_without_proof_moves_no_session() {
        let mut mesh = three();
        with_operator_keys(&mut mesh, &[("a", true), ("b", true), ("c", false)]);
        let on_a = mesh.node("a").connect_with(V5, "dev", as_user("alice")).0;
        mesh.node("a").subscribe(on_a, "t/#", QoS::AtLeastOnce);
        mesh.settle();
        // c lets "alice" in with no proof (its own password file, say) and claims dev.
        let (_, ack) = mesh.node("c").connect_with(V5, "dev", as_user("alice"));
        assert_eq!(ack.reason, ReasonCode::SUCCESS, "c serves its own client");
        mesh.settle();
        let a = mesh.node("a");
        assert!(!a.is_closed(on_a), "a still serves alice");
        assert_eq!(a.broker.claim_owner("dev"), Some(id("a")));
        assert_eq!(a.broker.stats().claims_unproven, 1);
        assert_eq!(mesh.node("b").broker.stats().claims_unproven, 1);
        // alice at b, proven: her session follows her there.
        let (_, ack) = mesh.node("b").connect_with(V5, "dev", as_user("alice"));
        assert_eq!(ack.reason, ReasonCode::SUCCESS);
        mesh.settle();
        assert!(mesh.node("a").is_closed(on_a), "taken over");
        assert_eq!(mesh.node("a").broker.claim_owner("dev"), Some(id("b")));
        assert_eq!(mesh.node("b").broker.stats().sessions_moved_in, 1);
    }

    /// A session comes only from a node whose own claim the receiver's replaced, one the
    /// authorizer vouches for: a member without the user's proof cannot ship messages into
    /// her session (or a window that would drop her next ones), whatever claim it names.
    #[test]
    fn only_a_node_that_held_the_session_by_a_proven_claim_ships_it() {
        let mut mesh = three();
        with_operator_keys(&mut mesh, &[("a", true), ("b", true), ("c", false)]);
        // alice at b: a ships her session there, by its proven claim.
        let on_b = alice_queued_at_a_resumes_at_b(&mut mesh);
        let shipped = mesh
            .peek("a", "b")
            .into_iter()
            .find_map(|f| match f {
                Frame::SessionTransfer(t) => Some(t),
                _ => None,
            })
            .expect("a ships the session");
        let by = shipped.by.clone().expect("a names its claim");
        assert_eq!(
            (by.stamp.node.clone(), by.stamp < shipped.claim),
            (id("a"), true)
        );
        mesh.advance(50);
        assert_eq!(mesh.node("b").read_numbers(on_b), vec![0, 1]);
        assert_eq!(mesh.node("b").broker.stats().sessions_moved_in, 1);

        // c sends the same session again, as a shipment of its own, by every claim it can
        // name: none of its own with a proof, a's (which names a), one of its own made after
        // b's. Taken, its messages would reach alice a second time.
        let unproven = ClaimUpdate {
            client_id: "dev".into(),
            stamp: stamp("c", 1),
            claim: Some(Claim {
                user: Some("alice".into()),
                resume: true,
                persistent: true,
                proof: None,
            }),
        };
        let later = ClaimUpdate {
            stamp: Stamp {
                hlc: Hlc {
                    wall_ms: shipped.claim.hlc.wall_ms + 1,
                    logical: 0,
                },
                node: id("c"),
            },
            ..by.clone()
        };
        let forged = [None, Some(unproven), Some(by), Some(later)];
        for (n, by) in forged.into_iter().enumerate() {
            let before = mesh.node("b").broker.stats();
            mesh.inject(
                "c",
                "b",
                Frame::SessionTransfer(SessionTransfer {
                    shipment: stamp("c", 10 + n as u64),
                    by,
                    ..shipped.clone()
                }),
            );
            mesh.advance(50);
            let after = mesh.node("b").broker.stats();
            assert_eq!(
                (
                    after.peer_frames_not_owner - before.peer_frames_not_owner,
                    after.sessions_moved_in,
                ),
                (1, 1),
                "forged transfer {n} refused"
            );
            assert!(
                !mesh
                    .peek("b", "c")
                    .iter()
                    .any(|f| matches!(f, Frame::SessionTaken { .. })),
                "not answered: nothing of it is kept"
            );
        }
        assert!(mesh.node("b").read_numbers(on_b).is_empty());
        assert_eq!(mesh.node("b").broker.stats().queued_messages, 0);
    }

    #[test]
    fn claims_past_a_peers_bound_cut_its_session() {
        let mut mesh = Mesh::new(&["a", "b"], Config::default(), |c| {
            c.peer_limits.max_claims = 2
        });
        for n in 0..3 {
            mesh.inject("b", "a", claim(&format!("c{n}"), "b"));
        }
        let a = mesh.node("a");
        assert_eq!(a.broker.stats().peer_frames_over_limit, 1);
        assert_eq!(a.broker.claim_owner("c1"), Some(id("b")));
        assert_eq!(a.broker.claim_owner("c2"), None, "refused");
    }

    /// Claims count in bytes too: long client ids past a peer's byte bound are refused.
    #[test]
    fn claims_past_a_peers_byte_bound_cut_its_session() {
        let mut mesh = Mesh::new(&["a", "b"], Config::default(), |c| {
            c.peer_limits.max_claim_bytes = 400
        });
        for n in 0..3 {
            let client_id = format!("{n}{}", "x".repeat(99));
            mesh.inject("b", "a", claim(&client_id, "b"));
        }
        let a = mesh.node("a");
        assert_eq!(a.broker.stats().peer_frames_over_limit, 1);
        let id_of = |n: u32| format!("{n}{}", "x".repeat(99));
        assert_eq!(a.broker.claim_owner(&id_of(1)), Some(id("b")));
        let third = id_of(2);
        assert_eq!(a.broker.claim_owner(&third), None, "refused");
    }

    #[test]
    fn a_transfer_writes_its_own_clients_records_only() {
        let mut mesh = three();
        mesh.node("a").connect_with(V5, "dev", persistent);
        mesh.settle();
        let mut victim = vec![b'S', 0, 6];
        victim.extend_from_slice(b"victim");
        mesh.inject(
            "b",
            "a",
            Frame::SessionTransfer(SessionTransfer {
                client_id: "dev".into(),
                claim: stamp("a", 1),
                shipment: stamp("b", 1),
                index: 0,
                count: 1,
                by: None,
                records: vec![(Bytes::from(victim), Bytes::from_static(&[1, 5]))],
            }),
        );
        mesh.settle();
        let a = mesh.node("a");
        assert_eq!(a.broker.stats().sessions_transfers_refused, 1);
        assert_eq!(a.broker.stats().sessions, 1, "no session for victim");
        assert_eq!(a.broker.stats().sessions_moved_in, 0);
    }

    #[test]
    fn only_the_node_that_shipped_a_session_relays_to_it() {
        let mut mesh = three();
        let conn = mesh.node("a").connect_with(V5, "dev", persistent).0;
        mesh.node("a").subscribe(conn, "t/#", QoS::AtLeastOnce);
        mesh.settle();
        // c, which never held dev's session, makes up a relay for it.
        mesh.inject(
            "c",
            "a",
            Frame::SessionRelay(SessionRelay {
                client_id: "dev".into(),
                claim: stamp("a", 1),
                n: 1,
                origin: meridian_core::routes::Owner {
                    node: id("c"),
                    incarnation: 1,
                },
                seq: 1,
                message: publish_packet("t/x", b"forged", QoS::AtLeastOnce, false, 1),
            }),
        );
        mesh.settle();
        assert_eq!(mesh.node("a").broker.stats().peer_frames_not_owner, 1);
        assert!(mesh.node("a").received_publishes(conn).is_empty());
    }

    #[test]
    fn only_the_node_that_shipped_a_session_says_its_relay_caught_up() {
        let mut mesh = three();
        subscriber(&mut mesh, "a", QoS::ExactlyOnce);
        let from_c = mesh.node("c").connect(V5, "pub-c");
        mesh.settle();
        // a cannot reach c: until c echoes a's fence, a cannot say it relayed everything c
        // routed to it, so b holds c's messages to dev back for their order.
        mesh.link_down(&id("a"), &id("c"));
        let conn = mesh.node("b").connect_with(V5, "dev", persistent).0;
        let claim = mesh
            .peek("b", "c")
            .into_iter()
            .find_map(|f| match f {
                Frame::Claim(u) if u.client_id == "dev" => Some(u.stamp),
                _ => None,
            })
            .expect("b claims dev");
        mesh.advance(50);
        mesh.node("c").publish(
            from_c,
            "t/x",
            &1u32.to_be_bytes(),
            QoS::ExactlyOnce,
            false,
            1,
        );
        mesh.advance(50);
        assert!(mesh.node("b").read_numbers(conn).is_empty(), "held");
        // c, which never held the session, says a relayed all of c's: refused, still held.
        mesh.inject(
            "c",
            "b",
            Frame::SessionRelayCaughtUp {
                client_id: "dev".into(),
                claim,
                node: id("c"),
            },
        );
        mesh.settle();
        let b = mesh.node("b");
        assert_eq!(b.broker.stats().peer_frames_not_owner, 1);
        assert!(b.read_numbers(conn).is_empty(), "still held");
        // The cut heals: a echoes c's fence, says so, and the message goes, once.
        mesh.link_up(&id("a"), &id("c"));
        mesh.advance(50);
        assert_eq!(mesh.node("b").read_numbers(conn), vec![1]);
    }

    /// c is cut off while dev moves to b; dev comes back to c, which never learnt that it had
    /// left and resumes its own copy. When the links heal, c learns b's claim (older than its
    /// own): b holds a part of the session with a's messages 1 and 2 in it, so a's message 3,
    /// which comes to c straight, waits for that part. Before the part comes, a relay from b
    /// for it is refused: b has shipped nothing yet.
    #[test]
    fn a_node_that_resumed_a_session_while_cut_off_waits_for_the_part_taken_meanwhile() {
        resumed_while_cut_off(1);
    }

    /// The same when the client reconnected at c more than once during the cut: c's later
    /// claim replaced only c's own, so b's claim, older than both, is still news when it comes
    /// (sim seeds 90947 and 90816 found c forgetting that, and letting a's messages out before
    /// b's part).
    #[test]
    fn a_session_resumed_twice_while_cut_off_still_waits_for_the_part_taken_meanwhile() {
        resumed_while_cut_off(2);
    }

    fn resumed_while_cut_off(resumes_at_c: u32) {
        let mut mesh = three();
        subscriber(&mut mesh, "c", QoS::ExactlyOnce);
        let from_a = mesh.node("a").connect(V5, "pub-a");
        mesh.settle();
        mesh.link_down(&id("a"), &id("c"));
        mesh.link_down(&id("b"), &id("c"));
        let at_b = mesh.node("b").connect_with(V5, "dev", persistent).0;
        mesh.advance(50);
        for i in 1..=2u32 {
            mesh.node("a").publish(
                from_a,
                "t/x",
                &i.to_be_bytes(),
                QoS::ExactlyOnce,
                false,
                i as u16,
            );
            mesh.advance(50);
        }
        // The part at b waits for the rest of the session (its state is on its way from c).
        assert!(mesh.node("b").read_numbers(at_b).is_empty());
        let mut back = mesh.node("c").connect_with(V5, "dev", persistent).0;
        mesh.advance(50);
        for _ in 1..resumes_at_c {
            mesh.node("c").close(back);
            mesh.settle();
            back = mesh.node("c").connect_with(V5, "dev", persistent).0;
            mesh.advance(50);
        }
        assert_eq!(mesh.node("c").broker.stats().session_shipments_expected, 0);
        // The links heal; only b's first words reach c yet (its claims among them).
        mesh.link_up(&id("b"), &id("c"));
        mesh.link_up(&id("a"), &id("c"));
        let b_claim = mesh
            .peek("b", "c")
            .into_iter()
            .find_map(|f| match f {
                Frame::ClaimSnapshot(updates) => updates.into_iter().find(|u| u.client_id == "dev"),
                _ => None,
            })
            .expect("b tells c its claim on dev");
        mesh.deliver_one_way("b", "c");
        assert_eq!(mesh.node("c").broker.stats().session_shipments_expected, 1);
        let claim = mesh
            .peek("c", "b")
            .into_iter()
            .find_map(|f| match f {
                Frame::ClaimSnapshot(updates) => updates
                    .into_iter()
                    .find(|u| u.client_id == "dev")
                    .map(|u| u.stamp),
                _ => None,
            })
            .expect("c tells b its claim on dev");
        mesh.inject(
            "b",
            "c",
            Frame::SessionRelay(SessionRelay {
                client_id: "dev".into(),
                claim,
                n: 1,
                origin: meridian_core::routes::Owner {
                    node: id("a"),
                    incarnation: 1,
                },
                seq: 99,
                message: publish_packet("t/x", &99u32.to_be_bytes(), QoS::ExactlyOnce, false, 1),
            }),
        );
        assert_eq!(mesh.node("c").broker.stats().peer_frames_not_owner, 1);
        // a's next message comes to c straight: it waits for b's part.
        mesh.node("a").publish(
            from_a,
            "t/x",
            &3u32.to_be_bytes(),
            QoS::ExactlyOnce,
            false,
            3,
        );
        mesh.deliver_one_way("a", "c");
        assert!(
            mesh.node("c").read_numbers(back).is_empty(),
            "held for b's part"
        );
        // b learns c's claim and ships its part: a's messages go in a's order, each once.
        mesh.advance(50);
        let mut got = Vec::new();
        for _ in 0..20 {
            got.extend(mesh.node("c").read_numbers(back));
            mesh.advance(50);
        }
        assert_eq!(got, vec![1, 2, 3]);
        // The same older claim sent again (by b, or by anyone replaying it) holds nothing back.
        mesh.advance(60_000);
        mesh.inject("b", "c", Frame::Claim(b_claim));
        assert_eq!(mesh.node("c").broker.stats().session_shipments_expected, 1);
        mesh.node("a").publish(
            from_a,
            "t/x",
            &4u32.to_be_bytes(),
            QoS::ExactlyOnce,
            false,
            4,
        );
        mesh.advance(50);
        assert_eq!(mesh.node("c").read_numbers(back), vec![4]);
    }

    #[test]
    fn transfers_past_a_peers_byte_bound_cut_its_session() {
        let mut mesh = Mesh::new(&["a", "b"], Config::default(), |c| {
            c.peer_limits.max_transfer_bytes = 1_000
        });
        let part = |index| {
            Frame::SessionTransfer(SessionTransfer {
                client_id: "dev".into(),
                claim: stamp("a", 1),
                shipment: stamp("b", 1),
                index,
                count: 3,
                by: None,
                records: vec![(Bytes::from_static(b"k"), Bytes::from(vec![0u8; 600]))],
            })
        };
        mesh.inject("b", "a", part(0));
        assert_eq!(mesh.node("a").broker.stats().peer_frames_over_limit, 0);
        mesh.inject("b", "a", part(1));
        assert_eq!(mesh.node("a").broker.stats().peer_frames_over_limit, 1);
    }
}

mod home {
    use super::*;
    use meridian_core::broker::HomeRegion;
    use meridian_core::codec::ConnAck;

    /// a, b and c, each its own region; client ids `plant-*` belong to a's region.
    fn pinned() -> Mesh {
        Mesh::new(&["a", "b", "c"], Config::default(), |c| {
            c.home_regions = vec![HomeRegion {
                client_ids: "plant-*".into(),
                region: "region-a".into(),
            }];
        })
    }

    /// Send CONNECT on a new connection of `node`, without waiting for CONNACK.
    fn start_connect(mesh: &mut Mesh, node: &str, client_id: &str) -> ConnId {
        let w = mesh.node(node);
        let conn = w.accept();
        let mut c = connect_packet(V5, client_id);
        persistent(&mut c);
        w.send(conn, Packet::Connect(c));
        conn
    }

    fn connack(mesh: &mut Mesh, node: &str, conn: ConnId) -> Option<ConnAck> {
        mesh.node(node)
            .recv(conn)
            .into_iter()
            .find_map(|p| match p {
                Packet::ConnAck(a) => Some(a),
                _ => None,
            })
    }

    #[test]
    fn a_pinned_client_is_served_once_its_home_region_granted_it() {
        let mut mesh = pinned();
        let conn = start_connect(&mut mesh, "b", "plant-1");
        assert_eq!(connack(&mut mesh, "b", conn), None, "waits for region-a");
        mesh.settle();
        let ack = connack(&mut mesh, "b", conn).expect("CONNACK after the grant");
        assert_eq!(ack.reason, ReasonCode::SUCCESS);
        mesh.settle();
        assert_eq!(mesh.node("c").broker.claim_owner("plant-1"), Some(id("b")));
        // Not pinned: served at once.
        let (_, ack) = mesh.node("b").connect_with(V5, "sensor-1", persistent);
        assert_eq!(ack.reason, ReasonCode::SUCCESS);
    }

    #[test]
    fn packets_pipelined_after_connect_are_handled_once_the_home_region_granted_it() {
        let mut mesh = pinned();
        let w = mesh.node("b");
        let conn = w.accept();
        let mut c = connect_packet(V5, "plant-1");
        persistent(&mut c);
        let mut bytes = bytes::BytesMut::new();
        for packet in [
            Packet::Connect(c),
            Packet::Publish(publish_packet("t", b"x", QoS::ExactlyOnce, false, 1)),
            Packet::PingReq,
        ] {
            meridian_core::codec::encode(&packet, V5, &mut bytes).unwrap();
        }
        w.send_bytes(conn, &bytes);
        assert!(w.recv(conn).is_empty(), "waits for region-a");
        mesh.settle();
        let got = mesh.node("b").recv(conn);
        assert!(
            matches!(
                &got[..],
                [Packet::ConnAck(a), Packet::PubRec(r), Packet::PingResp]
                    if a.reason == ReasonCode::SUCCESS && r.packet_id == 1
            ),
            "{got:?}"
        );
    }

    #[test]
    fn the_node_serving_a_pinned_client_closes_it_before_another_serves_it() {
        let mut mesh = pinned();
        let first = start_connect(&mut mesh, "c", "plant-1");
        mesh.settle();
        assert_eq!(
            connack(&mut mesh, "c", first).map(|a| a.reason),
            Some(ReasonCode::SUCCESS)
        );
        mesh.node("c").subscribe(first, "t/#", QoS::AtLeastOnce);
        mesh.settle();

        let second = start_connect(&mut mesh, "b", "plant-1");
        // b asks a; a has c close its connection; only then does a grant.
        mesh.deliver_one_way("b", "a");
        mesh.deliver_one_way("a", "c");
        assert!(mesh.node("c").is_closed(first), "c let go first");
        assert_eq!(connack(&mut mesh, "b", second), None, "b still waits");
        mesh.deliver_one_way("c", "a");
        mesh.deliver_one_way("a", "b");
        let ack = connack(&mut mesh, "b", second).expect("granted");
        assert_eq!(ack.reason, ReasonCode::SUCCESS);
        assert!(ack.session_present, "its session comes from c");
        mesh.settle();
        // b's routes, then c's relay ending: two route batches.
        mesh.advance(50);
        mesh.advance(50);
        assert_eq!(mesh.node("a").broker.nodes_for("t/x"), vec![id("b")]);
    }

    #[test]
    fn without_its_home_region_or_its_current_node_a_pinned_client_is_refused() {
        let mut mesh = pinned();
        mesh.link_down(&id("a"), &id("b"));
        let conn = start_connect(&mut mesh, "b", "plant-1");
        assert_eq!(
            connack(&mut mesh, "b", conn).map(|a| a.reason),
            Some(ReasonCode::SERVER_UNAVAILABLE),
            "no node of region-a reachable"
        );
        mesh.link_up(&id("a"), &id("b"));
        mesh.settle();

        // Served by c; then c is cut off from a: a cannot make it let go.
        let on_c = start_connect(&mut mesh, "c", "plant-2");
        mesh.settle();
        assert!(connack(&mut mesh, "c", on_c).is_some());
        mesh.link_down(&id("a"), &id("c"));
        let conn = start_connect(&mut mesh, "b", "plant-2");
        mesh.settle();
        assert_eq!(
            connack(&mut mesh, "b", conn).map(|a| a.reason),
            Some(ReasonCode::SERVER_UNAVAILABLE)
        );
        assert!(!mesh.node("c").is_closed(on_c), "c still serves it, alone");
        assert_eq!(mesh.node("b").broker.stats().connects_home_refused, 2);
    }

    #[test]
    fn only_the_node_asked_can_grant() {
        let mut mesh = pinned();
        let conn = start_connect(&mut mesh, "b", "plant-1");
        // c makes up a grant for b's first request (token 0).
        mesh.inject(
            "c",
            "b",
            meridian_core::link::Frame::ClaimAnswer {
                client_id: "plant-1".into(),
                token: 0,
                reason: 0,
                hlc: Default::default(),
            },
        );
        assert_eq!(connack(&mut mesh, "b", conn), None, "not from region-a");
        mesh.settle();
        assert_eq!(
            connack(&mut mesh, "b", conn).map(|a| a.reason),
            Some(ReasonCode::SUCCESS)
        );
    }

    /// Only a node of a pinned client id's home region revokes a connection, and only it is
    /// asked who may serve one: a revocation or a request from anywhere else, or for a client
    /// id that is not pinned, changes nothing and is counted.
    #[test]
    fn revocations_and_requests_from_outside_the_home_region_change_nothing() {
        use meridian_core::link::Frame;
        let mut mesh = pinned();
        let on_c = start_connect(&mut mesh, "c", "plant-1");
        mesh.settle();
        assert!(connack(&mut mesh, "c", on_c).is_some());
        let (free, _) = mesh.node("c").connect_with(V5, "sensor-1", persistent);
        mesh.settle();
        // b is of region-b: it may not close plant-1 at c.
        mesh.inject(
            "b",
            "c",
            Frame::Revoke {
                client_id: "plant-1".into(),
                token: 7,
            },
        );
        // a is of region-a, but sensor-1 is pinned nowhere.
        mesh.inject(
            "a",
            "c",
            Frame::Revoke {
                client_id: "sensor-1".into(),
                token: 8,
            },
        );
        // c is not of region-a: it decides nothing for plant-1.
        mesh.inject(
            "b",
            "c",
            Frame::ClaimRequest {
                client_id: "plant-1".into(),
                user: None,
                proof: None,
                token: 9,
            },
        );
        let c = mesh.node("c");
        assert!(!c.is_closed(on_c), "c still serves plant-1");
        assert!(!c.is_closed(free), "and sensor-1");
        assert_eq!(c.broker.stats().peer_frames_not_owner, 3);
        mesh.settle();
        // a still decides: plant-1 moves to b once a has c let go.
        let conn = start_connect(&mut mesh, "b", "plant-1");
        mesh.settle();
        assert_eq!(
            connack(&mut mesh, "b", conn).map(|a| a.reason),
            Some(ReasonCode::SUCCESS)
        );
        assert!(mesh.node("c").is_closed(on_c));
    }

    /// With operator keys, the home decides only for a request that carries the proof that
    /// its client logged in at the requester as the user it names: a member without it (one
    /// that let "alice" in on its own word, or forges the request) has no one's connection
    /// closed and is refused (0x87); the proven request of an honest node is granted.
    #[test]
    fn with_operator_keys_a_request_without_the_users_proof_closes_no_one() {
        use common::operator::{region_certificate, with_operator_keys};
        use meridian_core::link::Frame;
        let mut mesh = Mesh::new(&["a", "b", "c"], Config::default(), |c| {
            c.home_regions = vec![HomeRegion {
                client_ids: "plant-*".into(),
                region: "region-a".into(),
            }];
            c.certificate = Some(region_certificate(&c.region));
        });
        with_operator_keys(&mut mesh, &[("a", true), ("b", true), ("c", false)]);
        for (x, y) in [("a", "b"), ("a", "c"), ("b", "c")] {
            mesh.link_down(&id(x), &id(y));
            mesh.link_up(&id(x), &id(y));
        }
        mesh.settle();
        let alice = |c: &mut meridian_core::codec::Connect| {
            persistent(c);
            c.username = Some("alice".into());
        };
        let on_b = mesh.node("b").accept();
        let mut packet = connect_packet(V5, "plant-1");
        alice(&mut packet);
        mesh.node("b").send(on_b, Packet::Connect(packet.clone()));
        mesh.settle();
        assert_eq!(
            connack(&mut mesh, "b", on_b).map(|a| a.reason),
            Some(ReasonCode::SUCCESS)
        );
        // c forges a request for plant-1 as alice, then lets "alice" in on its own word.
        mesh.inject(
            "c",
            "a",
            Frame::ClaimRequest {
                client_id: "plant-1".into(),
                user: Some("alice".into()),
                proof: None,
                token: 99,
            },
        );
        let on_c = mesh.node("c").accept();
        mesh.node("c").send(on_c, Packet::Connect(packet.clone()));
        mesh.settle();
        assert_eq!(
            connack(&mut mesh, "c", on_c).map(|a| a.reason),
            Some(ReasonCode::NOT_AUTHORIZED)
        );
        assert!(!mesh.node("b").is_closed(on_b), "b still serves plant-1");
        assert_eq!(mesh.node("a").broker.stats().claims_unproven, 2);
        // alice at a, proven: a closes b's connection and serves her.
        let on_a = mesh.node("a").accept();
        mesh.node("a").send(on_a, Packet::Connect(packet));
        mesh.settle();
        assert_eq!(
            connack(&mut mesh, "a", on_a).map(|a| a.reason),
            Some(ReasonCode::SUCCESS)
        );
        assert!(mesh.node("b").is_closed(on_b));
    }

    /// A grant's clock reading moves the waiting node's clock: one far ahead is refused, and
    /// the genuine grant still comes.
    #[test]
    fn a_grant_from_a_clock_far_ahead_is_refused() {
        let mut mesh = pinned();
        let conn = start_connect(&mut mesh, "b", "plant-1");
        mesh.inject(
            "a",
            "b",
            meridian_core::link::Frame::ClaimAnswer {
                client_id: "plant-1".into(),
                token: 0,
                reason: 0,
                hlc: meridian_core::retained::Hlc {
                    wall_ms: u64::MAX / 2,
                    logical: 0,
                },
            },
        );
        assert_eq!(connack(&mut mesh, "b", conn), None, "refused");
        assert_eq!(mesh.node("b").broker.stats().peer_frames_clock_ahead, 1);
        mesh.settle();
        assert_eq!(
            connack(&mut mesh, "b", conn).map(|a| a.reason),
            Some(ReasonCode::SUCCESS)
        );
        // b's clock did not jump: its next claim is taken by a.
        let (_, ack) = mesh.node("b").connect_with(V5, "sensor-2", persistent);
        assert_eq!(ack.reason, ReasonCode::SUCCESS);
        mesh.settle();
        assert_eq!(mesh.node("a").broker.claim_owner("sensor-2"), Some(id("b")));
        assert_eq!(mesh.node("a").broker.stats().peer_frames_clock_ahead, 0);
    }

    #[test]
    fn a_grant_that_never_comes_ends_in_a_refusal() {
        let mut mesh = pinned();
        let conn = start_connect(&mut mesh, "b", "plant-1");
        // The request is lost with the link.
        mesh.link_down(&id("a"), &id("b"));
        mesh.node("b").advance(5_000);
        assert_eq!(
            connack(&mut mesh, "b", conn).map(|a| a.reason),
            Some(ReasonCode::SERVER_UNAVAILABLE)
        );
    }
}
