//! Persistence as outputs: what must survive a restart leaves the core as records, before the
//! acknowledgement that depends on it, and comes back through `restore`.

mod common;

use bytes::BytesMut;
use common::*;
use meridian_core::codec::{self, Ack, Packet, QoS};
use meridian_core::{Broker, Config, ConnInfo, Input, Output, Timestamp};

fn persistent(c: &mut codec::Connect) {
    c.clean_start = false;
    c.properties.session_expiry_interval = Some(3600);
}

#[test]
fn persist_comes_before_the_puback_that_depends_on_it() {
    let now = Timestamp(1_000);
    let mut broker = Broker::new(Config::default(), now);
    let run = |broker: &mut Broker, conn, packet: Packet| -> Vec<Output> {
        let mut buf = BytesMut::new();
        codec::encode(&packet, V5, &mut buf).unwrap();
        broker.handle_input(now, Input::Bytes { conn, data: &buf });
        std::iter::from_fn(|| broker.poll_output()).collect()
    };
    let sub = broker.accept(now, ConnInfo::default());
    let mut c = connect_packet(V5, "sub");
    persistent(&mut c);
    run(&mut broker, sub, Packet::Connect(c));
    run(
        &mut broker,
        sub,
        Packet::Subscribe(codec::Subscribe {
            packet_id: 1,
            filters: vec![codec::SubscribeFilter {
                filter: "d/#".into(),
                options: Default::default(),
            }],
            properties: Default::default(),
        }),
    );
    // Resubscribe at QoS 1 and go offline.
    run(
        &mut broker,
        sub,
        Packet::Subscribe(codec::Subscribe {
            packet_id: 2,
            filters: vec![codec::SubscribeFilter {
                filter: "d/#".into(),
                options: codec::SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..Default::default()
                },
            }],
            properties: Default::default(),
        }),
    );
    broker.handle_input(now, Input::Closed { conn: sub });
    while broker.poll_output().is_some() {}

    let publisher = broker.accept(now, ConnInfo::default());
    run(
        &mut broker,
        publisher,
        Packet::Connect(connect_packet(V5, "pub")),
    );
    let outputs = run(
        &mut broker,
        publisher,
        Packet::Publish(publish_packet("d/1", b"x", QoS::AtLeastOnce, false, 5)),
    );
    let persist_at = outputs
        .iter()
        .position(|o| matches!(o, Output::Persist { value: Some(_), .. }))
        .expect("queued message persisted");
    let puback_at = outputs
        .iter()
        .position(|o| matches!(o, Output::Send { conn, .. } if *conn == publisher))
        .expect("PUBACK sent");
    assert!(
        persist_at < puback_at,
        "Persist must come before the PUBACK: {outputs:?}"
    );
}

#[test]
fn clean_sessions_write_nothing() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "x", QoS::ExactlyOnce);
    let p = w.connect(V5, "p");
    w.publish(p, "x", b"1", QoS::ExactlyOnce, false, 1);
    w.close(s);
    assert!(
        w.store.is_empty(),
        "no records for clean sessions: {:?}",
        w.store.keys().collect::<Vec<_>>()
    );
}

#[test]
fn restart_restores_sessions_subscriptions_and_queued_messages() {
    let mut w = World::new();
    let s = w.connect_with(V5, "s", persistent).0;
    w.subscribe(s, "q/#", QoS::ExactlyOnce);
    w.close(s);
    let p = w.connect(V5, "p");
    for i in 0..3u16 {
        w.publish(p, "q/a", &[i as u8], QoS::AtLeastOnce, false, i + 1);
    }
    w.restart();
    let (s2, ack) = w.connect_with(V5, "s", persistent);
    assert!(ack.session_present);
    let got: Vec<u8> = w
        .received_publishes(s2)
        .iter()
        .map(|p| p.payload[0])
        .collect();
    assert_eq!(got, vec![0, 1, 2]);
    // Subscriptions came back too.
    let p2 = w.connect(V5, "p2");
    w.publish(p2, "q/b", b"new", QoS::AtLeastOnce, false, 1);
    assert_eq!(w.received_publishes(s2).len(), 1);
}

#[test]
fn restart_redelivers_unacknowledged_inflight_with_dup() {
    let mut w = World::new();
    let s = w.connect_with(V5, "s", persistent).0;
    w.subscribe(s, "i", QoS::ExactlyOnce);
    let p = w.connect(V5, "p");
    w.publish(p, "i", b"one", QoS::AtLeastOnce, false, 1);
    w.publish(p, "i", b"two", QoS::ExactlyOnce, false, 2);
    let first = w.received_publishes(s);
    let two = first.iter().find(|p| p.payload == "two").unwrap().clone();
    w.send(s, Packet::PubRec(Ack::new(two.packet_id.unwrap())));
    w.recv(s);
    w.restart();
    let s2 = w.connect_with(V5, "s", persistent).0;
    let again = w.recv(s2);
    assert!(
        again
            .iter()
            .any(|x| matches!(x, Packet::Publish(p) if p.dup && p.payload == "one"))
    );
    assert!(
        again
            .iter()
            .any(|x| matches!(x, Packet::PubRel(a) if Some(a.packet_id) == two.packet_id))
    );
    for x in &again {
        if let Packet::Publish(p) = x {
            w.ack(s2, p);
        }
    }
    w.send(s2, Packet::PubComp(Ack::new(two.packet_id.unwrap())));
    assert_eq!(w.broker.stats().inflight_messages, 0);
    assert!(
        w.store.keys().all(|k| k[0] != b'Q'),
        "acknowledged messages leave storage"
    );
}

#[test]
fn a_message_too_large_for_the_client_leaves_no_record() {
    let mut w = World::new();
    let small = |c: &mut codec::Connect| {
        persistent(c);
        c.properties.maximum_packet_size = Some(64);
    };
    let s = w.connect_with(V5, "s", small).0;
    w.subscribe(s, "big", QoS::AtLeastOnce);
    let p = w.connect(V5, "p");
    let queued = |w: &World| w.store.keys().filter(|k| k[0] == b'Q').count();

    // Sent at once: measured before a record is written.
    w.publish(p, "big", &[0u8; 100], QoS::AtLeastOnce, false, 1);
    assert!(w.received_publishes(s).is_empty());
    assert_eq!(
        queued(&w),
        0,
        "no record for a message the client cannot take"
    );

    // Queued while the client is away, measured when it comes back: the record goes.
    w.close(s);
    w.publish(p, "big", &[0u8; 100], QoS::AtLeastOnce, false, 2);
    assert_eq!(queued(&w), 1, "queued for the absent client");
    let s = w.connect_with(V5, "s", small).0;
    assert!(w.received_publishes(s).is_empty());
    assert_eq!(queued(&w), 0, "the dropped message's record is deleted");
    assert_eq!(w.broker.stats().dropped_too_large, 2);
    assert_eq!(w.broker.stats().inflight_messages, 0);
}

#[test]
fn restart_keeps_incoming_qos2_state_so_a_resend_is_not_delivered_twice() {
    let mut w = World::new();
    let s = w.connect(V5, "watch");
    w.subscribe(s, "x", QoS::AtMostOnce);
    let p = w.connect_with(V5, "p", persistent).0;
    w.publish(p, "x", b"once", QoS::ExactlyOnce, false, 7);
    assert_eq!(w.received_publishes(s).len(), 1);
    w.restart();
    let s = w.connect(V5, "watch");
    w.subscribe(s, "x", QoS::AtMostOnce);
    let p = w.connect_with(V5, "p", persistent).0;
    let mut dup = publish_packet("x", b"once", QoS::ExactlyOnce, false, 7);
    dup.dup = true;
    w.send(p, Packet::Publish(dup));
    assert!(matches!(&w.recv(p)[..], [Packet::PubRec(a)] if a.packet_id == 7));
    assert!(
        w.received_publishes(s).is_empty(),
        "not delivered a second time"
    );
    w.send(p, Packet::PubRel(Ack::new(7)));
    assert!(matches!(&w.recv(p)[..], [Packet::PubComp(a)] if a.packet_id == 7));
}

#[test]
fn restart_restores_retained_messages() {
    let mut w = World::new();
    let p = w.connect(V5, "p");
    w.publish(p, "keep/a", b"A", QoS::AtLeastOnce, true, 1);
    w.publish(p, "keep/b", b"B", QoS::AtMostOnce, true, 0);
    w.publish(p, "keep/b", b"", QoS::AtMostOnce, true, 0);
    w.restart();
    let s = w.connect(V5, "s");
    let packets = w.subscribe_collect(s, "keep/#", Default::default());
    let pubs: Vec<_> = packets
        .iter()
        .filter_map(|p| {
            if let Packet::Publish(p) = p {
                Some(p.payload.clone())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(pubs, vec![bytes::Bytes::from_static(b"A")]);
}

#[test]
fn will_of_a_connection_open_at_the_crash_is_published_after_restart() {
    let mut w = World::new();
    let _a = w
        .connect_with(V5, "a", |c| {
            persistent(c);
            c.will = Some(codec::LastWill {
                topic: "wills/a".into(),
                payload: bytes::Bytes::from_static(b"bye"),
                qos: QoS::AtLeastOnce,
                retain: true,
                properties: Default::default(),
            });
        })
        .0;
    w.restart();
    let s = w.connect(V5, "s");
    let packets = w.subscribe_collect(s, "wills/#", Default::default());
    assert!(
        packets
            .iter()
            .any(|p| matches!(p, Packet::Publish(p) if p.payload == "bye"))
    );
}

#[test]
fn ending_a_session_deletes_its_records() {
    let mut w = World::new();
    let s = w
        .connect_with(V5, "s", |c| c.properties.session_expiry_interval = Some(5))
        .0;
    w.subscribe(s, "a", QoS::AtLeastOnce);
    w.close(s);
    let p = w.connect(V5, "p");
    w.publish(p, "a", b"x", QoS::AtLeastOnce, false, 1);
    assert!(!w.store.is_empty());
    w.advance(5_001);
    assert!(
        w.store.is_empty(),
        "left: {:?}",
        w.store.keys().collect::<Vec<_>>()
    );
}

#[test]
fn inflight_record_is_persisted_before_its_publish_is_sent() {
    let mut w = World::new();
    let s = w.connect_with(V5, "s", persistent).0;
    w.subscribe(s, "f", QoS::ExactlyOnce);
    let p = w.connect(V5, "p");
    w.log.clear();
    w.publish(p, "f", b"x", QoS::ExactlyOnce, false, 1);
    let record = w
        .log
        .iter()
        .position(|o| matches!(o, Output::Persist { key, value: Some(_), .. } if key[0] == b'Q'))
        .expect("in-flight record");
    let publish = w
        .log
        .iter()
        .position(|o| matches!(o, Output::Send { conn, .. } if *conn == s))
        .expect("PUBLISH");
    assert!(record < publish, "{:?}", w.log);
}

#[test]
fn repeated_restarts_do_not_extend_a_session_expiry() {
    let mut w = World::new();
    let _s = w.connect_with(V5, "s", |c| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(10);
    });
    w.restart(); // connected at the crash: disconnected now, expires in 10 s
    w.advance(6_000);
    w.restart();
    w.advance(5_000);
    let (_, ack) = w.connect_with(V5, "s", |c| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(10);
    });
    assert!(
        !ack.session_present,
        "expired 10 s after the first crash, not after the second"
    );
}
