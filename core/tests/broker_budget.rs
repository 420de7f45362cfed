//! The broker-wide budget of held messages (`max_held_bytes`): retained, queued and in-flight
//! bytes over all sessions, and what each kind of message meets at the bound.

mod common;

use common::*;
use meridian_core::Config;
use meridian_core::codec::{Packet, QoS, ReasonCode};

/// A budget of 100 bytes; each test message weighs 10 (topic `t/x`, 7-byte payload).
fn world() -> World {
    World::with_config(Config {
        max_held_bytes: 100,
        ..Config::default()
    })
}

/// Connect with a persistent session; returns the connection and what followed CONNACK (a
/// resumed session's messages).
fn persistent(w: &mut World, id: &str) -> (meridian_core::ConnId, Vec<Packet>) {
    let conn = w.accept();
    let mut c = connect_packet(V5, id);
    c.clean_start = false;
    c.properties.session_expiry_interval = Some(3600);
    w.send(conn, Packet::Connect(c));
    let mut packets = w.recv(conn);
    packets.retain(|p| !matches!(p, Packet::ConnAck(_)));
    (conn, packets)
}

#[test]
fn at_the_bound_qos1_is_refused_deliveries_are_dropped_and_qos0_still_flows() {
    let mut w = world();
    // An offline persistent subscriber: what it is sent waits in its queue.
    let (away, _) = persistent(&mut w, "away");
    w.subscribe(away, "t/#", QoS::AtLeastOnce);
    w.close(away);
    let live = w.connect(V5, "live");
    w.subscribe(live, "t/#", QoS::AtMostOnce);
    let publisher = w.connect(V5, "pub");
    for i in 1..=12u16 {
        w.publish(publisher, "t/x", b"1234567", QoS::AtLeastOnce, false, i);
    }
    let reasons = w.puback_reasons(publisher);
    assert_eq!(reasons.len(), 12);
    assert!(
        reasons[..10].iter().all(|r| *r == ReasonCode::SUCCESS),
        "{reasons:?}"
    );
    assert!(
        reasons[10..]
            .iter()
            .all(|r| *r == ReasonCode::QUOTA_EXCEEDED),
        "past 100 bytes a QoS 1 PUBLISH is refused: {reasons:?}"
    );
    let stats = w.broker.stats();
    assert_eq!(stats.held_bytes, 100);
    assert_eq!(stats.queued_messages, 10);
    assert_eq!(stats.dropped_memory_full, 2);
    assert_eq!(
        w.received_publishes(live).len(),
        10,
        "refused ones reach nobody"
    );
    // QoS 0 is never held: it still reaches the connected subscriber.
    w.publish(publisher, "t/x", b"1234567", QoS::AtMostOnce, false, 0);
    assert_eq!(w.received_publishes(live).len(), 1);
    // An MQTT 3.1.1 publisher cannot be refused: its message is routed, and the delivery that
    // would be held is dropped.
    let v3 = w.connect(V3, "pub3");
    w.publish(v3, "t/x", b"1234567", QoS::AtLeastOnce, false, 1);
    assert_eq!(w.puback_reasons(v3), vec![ReasonCode::SUCCESS]);
    assert_eq!(w.broker.stats().dropped_memory_full, 3);
    assert_eq!(w.broker.stats().queued_messages, 10);
    // The subscriber comes back and acknowledges: the bytes go, and there is room again.
    let (away, queued) = persistent(&mut w, "away");
    assert_eq!(queued.len(), 10);
    for p in queued {
        if let Packet::Publish(p) = p {
            w.ack(away, &p);
        }
    }
    assert_eq!(w.broker.stats().held_bytes, 0);
    w.publish(publisher, "t/x", b"1234567", QoS::AtLeastOnce, false, 20);
    assert_eq!(w.puback_reasons(publisher), vec![ReasonCode::SUCCESS]);
    assert_eq!(w.broker.held_bytes(), w.broker.held_bytes_recounted());
}

#[test]
fn at_the_bound_a_new_retained_message_is_not_stored_but_a_delete_is_done() {
    let mut w = world();
    let publisher = w.connect(V5, "pub");
    for i in 0..12 {
        let topic = format!("r/{i:02}");
        w.publish(publisher, &topic, b"123456", QoS::AtMostOnce, true, 0);
    }
    // Each weighs 10: ten fit.
    assert_eq!(w.broker.stats().retained_messages, 10);
    assert_eq!(w.broker.stats().dropped_memory_full, 2);
    assert_eq!(w.broker.stats().held_bytes, 100);
    // Replacing one with a message no larger is fine; a delete makes room.
    w.publish(publisher, "r/00", b"abcdef", QoS::AtMostOnce, true, 0);
    w.publish(publisher, "r/01", b"", QoS::AtMostOnce, true, 0);
    w.publish(publisher, "r/11", b"123456", QoS::AtMostOnce, true, 0);
    assert_eq!(w.broker.stats().retained_messages, 10);
    assert_eq!(w.broker.stats().dropped_memory_full, 2);
    let sub = w.connect(V5, "sub");
    let got = w.subscribe_collect(sub, "r/00", Default::default());
    assert!(
        got.iter()
            .any(|p| matches!(p, Packet::Publish(p) if &p.payload[..] == b"abcdef"))
    );
    assert_eq!(w.broker.held_bytes(), w.broker.held_bytes_recounted());
}

#[test]
fn the_count_survives_a_restart_and_sessions_that_end() {
    let mut w = world();
    let (away, _) = persistent(&mut w, "away");
    w.subscribe(away, "t/#", QoS::AtLeastOnce);
    w.close(away);
    let publisher = w.connect(V5, "pub");
    w.publish(publisher, "t/x", b"1234567", QoS::AtLeastOnce, false, 1);
    w.publish(publisher, "t/r", b"1234567", QoS::AtMostOnce, true, 0);
    assert_eq!(w.broker.stats().held_bytes, 20);
    w.restart();
    assert_eq!(
        w.broker.stats().held_bytes,
        20,
        "restored: queued and retained"
    );
    // A clean start ends the stored session and its queue.
    let again = w.connect(V5, "away");
    w.recv(again);
    assert_eq!(w.broker.stats().held_bytes, 10, "only the retained message");
    assert_eq!(w.broker.held_bytes(), w.broker.held_bytes_recounted());
}

#[test]
fn messages_in_flight_count_until_acknowledged() {
    let mut w = world();
    let sub = w.connect(V5, "sub");
    w.subscribe(sub, "t/#", QoS::AtLeastOnce);
    let publisher = w.connect(V5, "pub");
    for i in 1..=3u16 {
        w.publish(publisher, "t/x", b"1234567", QoS::AtLeastOnce, false, i);
    }
    let sent = w.received_publishes(sub);
    assert_eq!(sent.len(), 3);
    let stats = w.broker.stats();
    assert_eq!((stats.inflight_messages, stats.held_bytes), (3, 30));
    for p in &sent {
        w.ack(sub, p);
    }
    assert_eq!(w.broker.stats().held_bytes, 0);
    assert_eq!(w.broker.held_bytes(), w.broker.held_bytes_recounted());
}

#[test]
fn a_retained_delete_is_never_refused_for_the_budget() {
    let mut w = world();
    let publisher = w.connect(V5, "pub");
    for i in 0..10 {
        w.publish(
            publisher,
            &format!("r/{i:02}"),
            b"123456",
            QoS::AtMostOnce,
            true,
            0,
        );
    }
    assert_eq!(w.broker.stats().held_bytes, 100);
    w.publish(publisher, "r/00", b"", QoS::AtLeastOnce, true, 1);
    assert_eq!(w.puback_reasons(publisher), vec![ReasonCode::SUCCESS]);
    assert_eq!(w.broker.stats().held_bytes, 90);
}

#[test]
fn each_held_delivery_counts_so_a_fan_out_is_counted_per_subscriber() {
    let mut w = world();
    let subs: Vec<_> = (0..3)
        .map(|i| {
            let s = w.connect(V5, &format!("s{i}"));
            w.subscribe(s, "t/#", QoS::AtLeastOnce);
            s
        })
        .collect();
    let publisher = w.connect(V5, "pub");
    w.publish(publisher, "t/x", b"1234567", QoS::AtLeastOnce, false, 1);
    // One message of 10 bytes, in flight to three subscribers: 30 held.
    assert_eq!(w.broker.stats().held_bytes, 30);
    for s in subs {
        assert_eq!(w.received_publishes(s).len(), 1);
    }
}
