//! Message behaviour: QoS flows both ways, flow control, ordering, subscriptions and their
//! options, shared subscriptions, retained messages, MQTT 5.0 extras, limits.

mod common;

use bytes::Bytes;
use common::*;
use meridian_core::codec::{
    Ack, Packet, Publish, PublishProperties, QoS, ReasonCode, RetainHandling, Subscribe,
    SubscribeFilter, SubscribeProperties, SubscriptionOptions,
};
use meridian_core::{Config, Event};

fn opts(qos: QoS) -> SubscriptionOptions {
    SubscriptionOptions {
        qos,
        ..Default::default()
    }
}

#[test]
fn qos0_round_trip() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "a/b", QoS::AtMostOnce);
    let p = w.connect(V3, "p");
    w.publish(p, "a/b", b"hello", QoS::AtMostOnce, false, 0);
    let got = w.received_publishes(s);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].qos, QoS::AtMostOnce);
    assert_eq!(got[0].packet_id, None);
    assert_eq!(&got[0].payload[..], b"hello");
}

#[test]
fn qos1_round_trip_with_puback_both_ways() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "a/+", QoS::AtLeastOnce);
    let p = w.connect(V5, "p");
    w.publish(p, "a/b", b"x", QoS::AtLeastOnce, false, 77);
    assert!(
        matches!(&w.recv(p)[..], [Packet::PubAck(a)] if a.packet_id == 77 && a.reason == ReasonCode::SUCCESS)
    );
    let got = w.received_publishes(s);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].qos, QoS::AtLeastOnce);
    assert_eq!(w.broker.stats().inflight_messages, 1);
    w.ack(s, &got[0]);
    assert_eq!(w.broker.stats().inflight_messages, 0);
}

#[test]
fn qos2_exactly_once_both_ways() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "a", QoS::ExactlyOnce);
    let p = w.connect(V5, "p");
    w.publish(p, "a", b"once", QoS::ExactlyOnce, false, 9);
    assert!(matches!(&w.recv(p)[..], [Packet::PubRec(a)] if a.packet_id == 9));
    // The publisher re-sends (DUP) before PUBREL: not delivered twice.
    let mut dup = publish_packet("a", b"once", QoS::ExactlyOnce, false, 9);
    dup.dup = true;
    w.send(p, Packet::Publish(dup));
    assert!(matches!(&w.recv(p)[..], [Packet::PubRec(a)] if a.packet_id == 9));
    w.send(p, Packet::PubRel(Ack::new(9)));
    assert!(matches!(&w.recv(p)[..], [Packet::PubComp(a)] if a.packet_id == 9));
    let got = w.received_publishes(s);
    assert_eq!(got.len(), 1, "delivered exactly once");
    w.ack(s, &got[0]);
    assert_eq!(w.broker.stats().inflight_messages, 0);
    // The packet id is free again: a new message with id 9 is a new message.
    w.publish(p, "a", b"again", QoS::ExactlyOnce, false, 9);
    w.recv(p);
    assert_eq!(w.received_publishes(s).len(), 1);
}

#[test]
fn pubrel_for_unknown_packet_id_gets_0x92() {
    let mut w = World::new();
    let p = w.connect(V5, "p");
    w.send(p, Packet::PubRel(Ack::new(5)));
    assert!(
        matches!(&w.recv(p)[..], [Packet::PubComp(a)] if a.reason == ReasonCode::PACKET_IDENTIFIER_NOT_FOUND)
    );
}

#[test]
fn delivered_qos_is_min_of_publish_and_subscription() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "a", QoS::AtLeastOnce);
    let p = w.connect(V5, "p");
    w.publish(p, "a", b"x", QoS::ExactlyOnce, false, 1);
    assert_eq!(w.received_publishes(s)[0].qos, QoS::AtLeastOnce);
    w.publish(p, "a", b"x", QoS::AtMostOnce, false, 0);
    assert_eq!(w.received_publishes(s)[0].qos, QoS::AtMostOnce);
}

#[test]
fn client_receive_maximum_limits_messages_in_flight() {
    let mut w = World::new();
    let s = w
        .connect_with(V5, "s", |c| c.properties.receive_maximum = Some(2))
        .0;
    w.subscribe(s, "a", QoS::AtLeastOnce);
    let p = w.connect(V5, "p");
    for i in 1..=5u16 {
        w.publish(p, "a", &[i as u8], QoS::AtLeastOnce, false, i);
    }
    let first = w.received_publishes(s);
    assert_eq!(first.len(), 2, "window of 2");
    w.ack(s, &first[0]);
    let next = w.received_publishes(s);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].payload[0], 3, "in order");
    w.ack(s, &first[1]);
    w.ack(s, &next[0]);
    let rest = w.received_publishes(s);
    assert_eq!(
        rest.iter().map(|p| p.payload[0]).collect::<Vec<_>>(),
        vec![4, 5]
    );
}

#[test]
fn bytes_in_flight_are_bounded_too() {
    // Room for three messages of 1,000 payload bytes and a one-byte topic.
    let mut w = World::with_config(Config {
        max_inflight_bytes: 3 * 1001,
        ..Config::default()
    });
    let s = w.connect(V5, "s");
    w.subscribe(s, "a", QoS::AtLeastOnce);
    let p = w.connect(V5, "p");
    for i in 1..=5u16 {
        w.publish(p, "a", &[i as u8; 1000], QoS::AtLeastOnce, false, i);
    }
    let first = w.received_publishes(s);
    assert_eq!(first.len(), 3, "three fit");
    assert_eq!(w.broker.stats().queued_messages, 2);
    w.ack(s, &first[0]);
    let next = w.received_publishes(s);
    assert_eq!(next.len(), 1, "an ack makes room for one");
    assert_eq!(next[0].payload[0], 4, "in order");
    for m in first[1..].iter().chain(&next) {
        w.ack(s, m);
    }
    let last = w.received_publishes(s);
    assert_eq!(last[0].payload[0], 5);
    w.ack(s, &last[0]);

    // A message larger than the bound goes alone.
    w.publish(p, "a", &[9; 5000], QoS::AtLeastOnce, false, 6);
    w.publish(p, "a", &[10; 10], QoS::AtLeastOnce, false, 7);
    let got = w.received_publishes(s);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload.len(), 5000);
    w.ack(s, &got[0]);
    assert_eq!(w.received_publishes(s)[0].payload[0], 10);
}

#[test]
fn server_receive_maximum_exceeded_disconnects_with_0x93() {
    let mut w = World::with_config(Config {
        receive_maximum: 2,
        ..Config::default()
    });
    let p = w.connect(V5, "p");
    for i in 1..=2u16 {
        w.publish(p, "a", b"x", QoS::ExactlyOnce, false, i);
    }
    w.recv(p);
    w.publish(p, "a", b"x", QoS::ExactlyOnce, false, 3);
    assert!(
        matches!(&w.recv(p)[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::RECEIVE_MAXIMUM_EXCEEDED)
    );
}

#[test]
fn per_topic_order_is_kept_across_qos_levels_of_one_subscription() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "o", QoS::ExactlyOnce);
    let p = w.connect(V5, "p");
    for i in 0..50u16 {
        w.publish(p, "o", &i.to_be_bytes(), QoS::ExactlyOnce, false, i + 1);
        w.recv(p);
        w.send(p, Packet::PubRel(Ack::new(i + 1)));
    }
    let got = w.received_publishes(s);
    let order: Vec<u16> = got
        .iter()
        .map(|p| u16::from_be_bytes([p.payload[0], p.payload[1]]))
        .collect();
    assert_eq!(order, (0..50).collect::<Vec<_>>());
}

#[test]
fn unacknowledged_messages_are_resent_with_dup_on_resumption() {
    let mut w = World::new();
    let session = |c: &mut meridian_core::codec::Connect| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(100);
    };
    let s = w.connect_with(V5, "s", session).0;
    w.subscribe(s, "r", QoS::ExactlyOnce);
    let p = w.connect(V5, "p");
    w.publish(p, "r", b"one", QoS::AtLeastOnce, false, 1);
    w.publish(p, "r", b"two", QoS::ExactlyOnce, false, 2);
    let first = w.received_publishes(s);
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|p| !p.dup));
    // PUBREC the QoS 2 one, then lose the connection before PUBCOMP.
    let qos2 = first.iter().find(|p| p.qos == QoS::ExactlyOnce).unwrap();
    w.send(s, Packet::PubRec(Ack::new(qos2.packet_id.unwrap())));
    w.recv(s);
    w.close(s);
    let s2 = w.connect_with(V5, "s", session).0;
    let again = w.recv(s2);
    // QoS 1 re-sent with DUP and the same packet id; the QoS 2 one continues with PUBREL.
    assert!(again.iter().any(|x| matches!(x, Packet::Publish(p) if p.dup && p.payload == "one" && p.packet_id == first.iter().find(|f| f.qos == QoS::AtLeastOnce).unwrap().packet_id)));
    assert!(
        again
            .iter()
            .any(|x| matches!(x, Packet::PubRel(a) if Some(a.packet_id) == qos2.packet_id))
    );
    assert!(
        !again
            .iter()
            .any(|x| matches!(x, Packet::Publish(p) if p.payload == "two"))
    );
}

#[test]
fn offline_queue_bound_drops_new_messages_and_counts_them() {
    let mut w = World::with_config(Config {
        max_queued_messages: 3,
        ..Config::default()
    });
    let s = w
        .connect_with(V5, "s", |c| {
            c.properties.session_expiry_interval = Some(100)
        })
        .0;
    w.subscribe(s, "q", QoS::AtLeastOnce);
    w.close(s);
    let p = w.connect(V5, "p");
    for i in 1..=5u16 {
        w.publish(p, "q", &[i as u8], QoS::AtLeastOnce, false, i);
    }
    assert_eq!(w.broker.stats().dropped_queue_full, 2);
    let s2 = w
        .connect_with(V5, "s", |c| {
            c.clean_start = false;
            c.properties.session_expiry_interval = Some(100);
        })
        .0;
    let got: Vec<u8> = w
        .received_publishes(s2)
        .iter()
        .map(|p| p.payload[0])
        .collect();
    assert_eq!(got, vec![1, 2, 3], "the oldest are kept");
}

#[test]
fn congested_connection_drops_qos0_and_counts_until_drained() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "zero", QoS::AtMostOnce);
    w.subscribe(s, "one", QoS::AtLeastOnce);
    let other = w.connect(V3, "other");
    w.subscribe(other, "zero", QoS::AtMostOnce);
    let p = w.connect(V5, "p");

    w.set_congested(s, true);
    let congested = |w: &World| {
        w.broker
            .clients()
            .iter()
            .filter(|c| c.congested)
            .map(|c| c.client_id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(congested(&w), vec!["s".to_owned()]);
    w.publish(p, "zero", b"a", QoS::AtMostOnce, false, 0);
    w.publish(p, "one", b"b", QoS::AtLeastOnce, false, 1);
    let got: Vec<Bytes> = w
        .received_publishes(s)
        .into_iter()
        .map(|p| p.payload)
        .collect();
    assert_eq!(got, vec![Bytes::from_static(b"b")], "QoS 1 still goes out");
    assert_eq!(w.broker.stats().dropped_qos0_congested, 1);
    assert_eq!(
        w.received_publishes(other).len(),
        1,
        "others are not affected"
    );

    w.set_congested(s, false);
    assert!(congested(&w).is_empty());
    w.publish(p, "zero", b"c", QoS::AtMostOnce, false, 0);
    let got = w.received_publishes(s);
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].payload[..], b"c");
    assert_eq!(w.broker.stats().dropped_qos0_congested, 1);
    assert!(!w.is_closed(s));
}

#[test]
fn suback_has_a_reason_code_per_filter() {
    let mut w = World::with_config(Config {
        maximum_qos: QoS::AtLeastOnce,
        ..Config::default()
    });
    let s = w.connect(V5, "s");
    w.send(
        s,
        Packet::Subscribe(Subscribe {
            packet_id: 3,
            filters: vec![
                SubscribeFilter {
                    filter: "a".into(),
                    options: opts(QoS::AtMostOnce),
                },
                SubscribeFilter {
                    filter: "b/#".into(),
                    options: opts(QoS::ExactlyOnce),
                },
                SubscribeFilter {
                    filter: "bad/#/x".into(),
                    options: opts(QoS::AtMostOnce),
                },
                SubscribeFilter {
                    filter: "".into(),
                    options: opts(QoS::AtMostOnce),
                },
                SubscribeFilter {
                    filter: "$share/g".into(),
                    options: opts(QoS::AtMostOnce),
                },
            ],
            properties: SubscribeProperties::default(),
        }),
    );
    let packets = w.recv(s);
    let [Packet::SubAck(ack)] = &packets[..] else {
        panic!("{packets:?}")
    };
    assert_eq!(
        ack.reasons,
        vec![
            ReasonCode::GRANTED_QOS_0,
            ReasonCode::GRANTED_QOS_1, // capped by maximum QoS
            ReasonCode::TOPIC_FILTER_INVALID,
            ReasonCode::TOPIC_FILTER_INVALID,
            ReasonCode::TOPIC_FILTER_INVALID,
        ]
    );
}

#[test]
fn v311_invalid_filter_gets_0x80() {
    let mut w = World::new();
    let s = w.connect(V3, "s");
    assert_eq!(
        w.subscribe(s, "a/#/b", QoS::AtMostOnce),
        vec![ReasonCode::UNSPECIFIED_ERROR]
    );
}

#[test]
fn unsubscribe_reports_per_filter_and_stops_delivery() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "u/#", QoS::AtMostOnce);
    let packets = w.unsubscribe(s, "u/#");
    assert!(
        matches!(&packets[..], [Packet::UnsubAck(a)] if a.reasons == vec![ReasonCode::SUCCESS])
    );
    let packets = w.unsubscribe(s, "u/#");
    assert!(
        matches!(&packets[..], [Packet::UnsubAck(a)] if a.reasons == vec![ReasonCode::NO_SUBSCRIPTION_EXISTED])
    );
    let p = w.connect(V5, "p");
    w.publish(p, "u/1", b"x", QoS::AtMostOnce, false, 0);
    assert!(w.received_publishes(s).is_empty());
}

#[test]
fn no_local_skips_own_messages() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe_with(
        s,
        "n",
        SubscriptionOptions {
            no_local: true,
            ..opts(QoS::AtMostOnce)
        },
        None,
    );
    w.publish(s, "n", b"mine", QoS::AtMostOnce, false, 0);
    assert!(w.received_publishes(s).is_empty());
    let p = w.connect(V5, "p");
    w.publish(p, "n", b"theirs", QoS::AtMostOnce, false, 0);
    assert_eq!(w.received_publishes(s).len(), 1);
}

#[test]
fn retain_as_published_keeps_the_retain_flag() {
    let mut w = World::new();
    let keep = w.connect(V5, "keep");
    w.subscribe_with(
        keep,
        "r",
        SubscriptionOptions {
            retain_as_published: true,
            ..opts(QoS::AtMostOnce)
        },
        None,
    );
    let clear = w.connect(V5, "clear");
    w.subscribe(clear, "r", QoS::AtMostOnce);
    let p = w.connect(V5, "p");
    w.publish(p, "r", b"x", QoS::AtMostOnce, true, 0);
    assert!(w.received_publishes(keep)[0].retain);
    assert!(!w.received_publishes(clear)[0].retain);
}

#[test]
fn retained_message_set_replace_delete() {
    let mut w = World::new();
    let p = w.connect(V5, "p");
    w.publish(p, "ret/a", b"v1", QoS::AtMostOnce, true, 0);
    w.publish(p, "ret/a", b"v2", QoS::AtMostOnce, true, 0);
    w.publish(p, "ret/b", b"b", QoS::AtLeastOnce, true, 1);
    let s = w.connect(V5, "s");
    let packets = w.subscribe_collect(s, "ret/+", opts(QoS::AtLeastOnce));
    let pubs: Vec<&Publish> = packets
        .iter()
        .filter_map(|p| {
            if let Packet::Publish(p) = p {
                Some(p)
            } else {
                None
            }
        })
        .collect();
    assert!(matches!(packets[0], Packet::SubAck(_)), "SUBACK first");
    assert_eq!(pubs.len(), 2);
    assert!(pubs.iter().all(|p| p.retain));
    assert!(pubs.iter().any(|p| p.payload == "v2"));
    // Empty payload deletes.
    w.publish(p, "ret/a", b"", QoS::AtMostOnce, true, 0);
    let s2 = w.connect(V5, "s2");
    let packets = w.subscribe_collect(s2, "ret/+", opts(QoS::AtLeastOnce));
    assert_eq!(
        packets
            .iter()
            .filter(|p| matches!(p, Packet::Publish(_)))
            .count(),
        1
    );
    assert_eq!(w.broker.stats().retained_messages, 1);
}

#[test]
fn retain_handling_0_1_2() {
    let mut w = World::new();
    let p = w.connect(V5, "p");
    w.publish(p, "rh", b"x", QoS::AtMostOnce, true, 0);
    let s = w.connect(V5, "s");
    let count = |packets: Vec<Packet>| {
        packets
            .iter()
            .filter(|p| matches!(p, Packet::Publish(_)))
            .count()
    };
    let h = |rh| SubscriptionOptions {
        retain_handling: rh,
        ..opts(QoS::AtMostOnce)
    };
    assert_eq!(
        count(w.subscribe_collect(s, "rh", h(RetainHandling::OnSubscribe))),
        1
    );
    assert_eq!(
        count(w.subscribe_collect(s, "rh", h(RetainHandling::OnSubscribe))),
        1,
        "0: every time"
    );
    assert_eq!(
        count(w.subscribe_collect(s, "rh", h(RetainHandling::OnNewSubscribe))),
        0,
        "1: not for an existing one"
    );
    w.unsubscribe(s, "rh");
    assert_eq!(
        count(w.subscribe_collect(s, "rh", h(RetainHandling::OnNewSubscribe))),
        1,
        "1: new subscription"
    );
    w.unsubscribe(s, "rh");
    assert_eq!(
        count(w.subscribe_collect(s, "rh", h(RetainHandling::Never))),
        0,
        "2: never"
    );
}

#[test]
fn retained_message_honours_message_expiry() {
    let mut w = World::new();
    let p = w.connect(V5, "p");
    let mut msg = publish_packet("exp", b"x", QoS::AtMostOnce, true, 0);
    msg.properties.message_expiry_interval = Some(10);
    w.send(p, Packet::Publish(msg));
    w.advance(4_000);
    let s = w.connect(V5, "s");
    let packets = w.subscribe_collect(s, "exp", opts(QoS::AtMostOnce));
    let Some(Packet::Publish(got)) = packets.get(1) else {
        panic!("{packets:?}")
    };
    assert_eq!(
        got.properties.message_expiry_interval,
        Some(6),
        "decremented by the time held"
    );
    w.advance(6_001);
    let s2 = w.connect(V5, "s2");
    assert_eq!(
        w.subscribe_collect(s2, "exp", opts(QoS::AtMostOnce)).len(),
        1,
        "expired: SUBACK only"
    );
}

#[test]
fn queued_message_expires_before_delivery() {
    let mut w = World::new();
    let s = w
        .connect_with(V5, "s", |c| {
            c.properties.session_expiry_interval = Some(1000)
        })
        .0;
    w.subscribe(s, "e", QoS::AtLeastOnce);
    w.close(s);
    let p = w.connect(V5, "p");
    let mut msg = publish_packet("e", b"x", QoS::AtLeastOnce, false, 1);
    msg.properties.message_expiry_interval = Some(5);
    w.send(p, Packet::Publish(msg));
    w.publish(p, "e", b"keep", QoS::AtLeastOnce, false, 2);
    w.advance(6_000);
    let s2 = w
        .connect_with(V5, "s", |c| {
            c.clean_start = false;
            c.properties.session_expiry_interval = Some(1000);
        })
        .0;
    let got = w.received_publishes(s2);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, "keep");
    assert_eq!(w.broker.stats().dropped_expired, 1);
}

#[test]
fn overlapping_subscriptions_deliver_one_copy_at_max_qos_with_all_identifiers() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe_with(s, "o/+", opts(QoS::AtMostOnce), Some(1));
    w.subscribe_with(s, "o/#", opts(QoS::AtLeastOnce), Some(2));
    w.subscribe_with(s, "o/x", opts(QoS::AtMostOnce), None);
    let p = w.connect(V5, "p");
    w.publish(p, "o/x", b"x", QoS::ExactlyOnce, false, 1);
    let got = w.received_publishes(s);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].qos, QoS::AtLeastOnce);
    let mut ids = got[0].properties.subscription_identifiers.clone();
    ids.sort();
    assert_eq!(ids, vec![1, 2]);
}

#[test]
fn subscription_identifier_is_sent_with_matching_messages_only_to_v5() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe_with(s, "id/#", opts(QoS::AtMostOnce), Some(42));
    let p = w.connect(V5, "p");
    w.publish(p, "id/1", b"x", QoS::AtMostOnce, false, 0);
    assert_eq!(
        w.received_publishes(s)[0]
            .properties
            .subscription_identifiers,
        vec![42]
    );
}

#[test]
fn shared_subscription_spreads_messages_across_members() {
    let mut w = World::new();
    let a = w.connect(V5, "a");
    let b = w.connect(V5, "b");
    w.subscribe(a, "$share/g/work/#", QoS::AtLeastOnce);
    w.subscribe(b, "$share/g/work/#", QoS::AtLeastOnce);
    let plain = w.connect(V5, "plain");
    w.subscribe(plain, "work/#", QoS::AtMostOnce);
    let p = w.connect(V5, "p");
    for i in 0..10u16 {
        w.publish(p, "work/x", &[i as u8], QoS::AtLeastOnce, false, i + 1);
    }
    let got_a = w.received_publishes(a);
    let got_b = w.received_publishes(b);
    assert_eq!(
        got_a.len() + got_b.len(),
        10,
        "each message to exactly one member"
    );
    assert_eq!(got_a.len(), 5, "round robin");
    assert_eq!(
        w.received_publishes(plain).len(),
        10,
        "non-shared subscribers get every message"
    );
}

#[test]
fn shared_subscription_passes_over_a_congested_member() {
    let mut w = World::new();
    let a = w.connect(V5, "a");
    let b = w.connect(V5, "b");
    w.subscribe(a, "$share/g/work/#", QoS::AtMostOnce);
    w.subscribe(b, "$share/g/work/#", QoS::AtMostOnce);
    let p = w.connect(V5, "p");
    w.set_congested(a, true);
    for i in 0..6u8 {
        w.publish(p, "work/x", &[i], QoS::AtMostOnce, false, 0);
    }
    assert!(w.received_publishes(a).is_empty());
    assert_eq!(
        w.received_publishes(b).len(),
        6,
        "all to the member keeping up"
    );
    assert_eq!(w.broker.stats().dropped_qos0_congested, 0);

    // With every member congested, the message goes to one in turn, and is dropped there.
    w.set_congested(b, true);
    w.publish(p, "work/x", &[6], QoS::AtMostOnce, false, 0);
    assert_eq!(w.broker.stats().dropped_qos0_congested, 1);
    w.set_congested(a, false);
    w.set_congested(b, false);
    for i in 7..11u8 {
        w.publish(p, "work/x", &[i], QoS::AtMostOnce, false, 0);
    }
    assert_eq!(w.received_publishes(a).len(), 2, "round robin again");
    assert_eq!(w.received_publishes(b).len(), 2);
}

#[test]
fn shared_subscription_resends_unacknowledged_to_another_member_when_one_leaves() {
    let mut w = World::new();
    let a = w.connect(V5, "a");
    let b = w.connect(V5, "b");
    w.subscribe(a, "$share/g/job", QoS::AtLeastOnce);
    w.subscribe(b, "$share/g/job", QoS::AtLeastOnce);
    let p = w.connect(V5, "p");
    for i in 0..4u16 {
        w.publish(p, "job", &[i as u8], QoS::AtLeastOnce, false, i + 1);
    }
    let got_a = w.received_publishes(a);
    let got_b = w.received_publishes(b);
    assert_eq!(got_a.len(), 2);
    // a leaves without acknowledging: its two messages go to b.
    w.close(a);
    let resent = w.received_publishes(b);
    let mut all: Vec<u8> = got_b
        .iter()
        .chain(resent.iter())
        .map(|p| p.payload[0])
        .collect();
    all.sort();
    assert_eq!(all, vec![0, 1, 2, 3]);
}

#[test]
fn shared_subscription_does_not_get_retained_messages() {
    let mut w = World::new();
    let p = w.connect(V5, "p");
    w.publish(p, "sr", b"x", QoS::AtMostOnce, true, 0);
    let s = w.connect(V5, "s");
    assert_eq!(
        w.subscribe_collect(s, "$share/g/sr", opts(QoS::AtMostOnce))
            .len(),
        1
    );
}

#[test]
fn no_local_on_shared_subscription_is_a_protocol_error() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.send(
        s,
        Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![SubscribeFilter {
                filter: "$share/g/x".into(),
                options: SubscriptionOptions {
                    no_local: true,
                    ..Default::default()
                },
            }],
            properties: SubscribeProperties::default(),
        }),
    );
    assert!(
        matches!(&w.recv(s)[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::PROTOCOL_ERROR)
    );
}

#[test]
fn dollar_topics_are_not_matched_by_leading_wildcards() {
    let mut w = World::new();
    let hash = w.connect(V5, "hash");
    w.subscribe(hash, "#", QoS::AtMostOnce);
    let plus = w.connect(V5, "plus");
    w.subscribe(plus, "+/info", QoS::AtMostOnce);
    let exact = w.connect(V5, "exact");
    w.subscribe(exact, "$SYS/#", QoS::AtMostOnce);
    let p = w.connect(V5, "p");
    w.publish(p, "$SYS/info", b"x", QoS::AtMostOnce, false, 0);
    assert!(w.received_publishes(hash).is_empty());
    assert!(w.received_publishes(plus).is_empty());
    assert_eq!(w.received_publishes(exact).len(), 1);
}

#[test]
fn inbound_topic_alias_is_resolved() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "long/topic/name", QoS::AtMostOnce);
    let p = w.connect(V5, "p");
    let mut first = publish_packet("long/topic/name", b"1", QoS::AtMostOnce, false, 0);
    first.properties.topic_alias = Some(3);
    w.send(p, Packet::Publish(first));
    let mut second = publish_packet("", b"2", QoS::AtMostOnce, false, 0);
    second.properties.topic_alias = Some(3);
    w.send(p, Packet::Publish(second));
    let got = w.received_publishes(s);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|p| p.topic == "long/topic/name"));
}

#[test]
fn inbound_topic_alias_above_maximum_disconnects_with_0x94() {
    let mut w = World::with_config(Config {
        topic_alias_maximum: 4,
        ..Config::default()
    });
    let p = w.connect(V5, "p");
    let mut msg = publish_packet("t", b"1", QoS::AtMostOnce, false, 0);
    msg.properties.topic_alias = Some(5);
    w.send(p, Packet::Publish(msg));
    assert!(
        matches!(&w.recv(p)[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::TOPIC_ALIAS_INVALID)
    );
}

#[test]
fn unknown_inbound_topic_alias_is_a_protocol_error() {
    let mut w = World::new();
    let p = w.connect(V5, "p");
    let mut msg = publish_packet("", b"1", QoS::AtMostOnce, false, 0);
    msg.properties.topic_alias = Some(1);
    w.send(p, Packet::Publish(msg));
    assert!(
        matches!(&w.recv(p)[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::PROTOCOL_ERROR)
    );
}

#[test]
fn outbound_topic_aliases_within_the_client_maximum() {
    let mut w = World::with_config(Config {
        outbound_topic_alias_maximum: 10,
        ..Config::default()
    });
    let s = w
        .connect_with(V5, "s", |c| c.properties.topic_alias_maximum = Some(2))
        .0;
    w.subscribe(s, "al/#", QoS::AtMostOnce);
    let p = w.connect(V5, "p");
    for t in ["al/a", "al/a", "al/b", "al/c", "al/c"] {
        w.publish(p, t, b"x", QoS::AtMostOnce, false, 0);
    }
    let got = w.received_publishes(s);
    let seen: Vec<(String, Option<u16>)> = got
        .iter()
        .map(|p| (p.topic.clone(), p.properties.topic_alias))
        .collect();
    assert_eq!(seen[0], ("al/a".into(), Some(1)));
    assert_eq!(seen[1], ("".into(), Some(1)), "known alias: empty topic");
    assert_eq!(seen[2], ("al/b".into(), Some(2)));
    assert!(
        seen[3].0 == "al/c" && seen[3].1.is_some_and(|a| a <= 2),
        "reuses an alias within the maximum"
    );
    assert_eq!(seen[4].0, "");
}

#[test]
fn properties_are_passed_through_to_subscribers() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "props", QoS::AtMostOnce);
    let p = w.connect(V5, "p");
    let mut msg = publish_packet("props", b"{}", QoS::AtMostOnce, false, 0);
    msg.properties = PublishProperties {
        payload_format_indicator: Some(1),
        content_type: Some("application/json".into()),
        response_topic: Some("reply/here".into()),
        correlation_data: Some(Bytes::from_static(b"corr")),
        user_properties: vec![("k".into(), "v".into()), ("k".into(), "v2".into())],
        ..Default::default()
    };
    w.send(p, Packet::Publish(msg.clone()));
    let got = w.received_publishes(s);
    assert_eq!(got[0].properties, msg.properties);
}

#[test]
fn invalid_utf8_payload_with_format_indicator_gets_0x99() {
    let mut w = World::new();
    let p = w.connect(V5, "p");
    let mut msg = publish_packet("f", &[0xff, 0xfe], QoS::AtLeastOnce, false, 1);
    msg.properties.payload_format_indicator = Some(1);
    w.send(p, Packet::Publish(msg));
    assert!(
        matches!(&w.recv(p)[..], [Packet::PubAck(a)] if a.reason == ReasonCode::PAYLOAD_FORMAT_INVALID)
    );
}

#[test]
fn messages_above_client_maximum_packet_size_are_skipped() {
    let mut w = World::new();
    let s = w
        .connect_with(V5, "s", |c| c.properties.maximum_packet_size = Some(64))
        .0;
    w.subscribe(s, "big", QoS::AtLeastOnce);
    let p = w.connect(V5, "p");
    w.publish(p, "big", &[0u8; 100], QoS::AtLeastOnce, false, 1);
    w.publish(p, "big", b"small", QoS::AtLeastOnce, false, 2);
    let got = w.received_publishes(s);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, "small");
    assert_eq!(w.broker.stats().dropped_too_large, 1);
    assert_eq!(
        w.broker.stats().inflight_messages,
        1,
        "the skipped one is not in flight"
    );
}

#[test]
fn packet_over_server_maximum_is_refused_with_0x95() {
    let mut w = World::with_config(Config {
        max_packet_size: 128,
        ..Config::default()
    });
    let p = w.connect(V5, "p");
    w.publish(p, "t", &[0u8; 200], QoS::AtMostOnce, false, 0);
    assert!(
        matches!(&w.recv(p)[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::PACKET_TOO_LARGE)
    );
    assert!(w.is_closed(p));
}

#[test]
fn topic_over_the_limits_gets_0x90_on_v5_and_closes_v311() {
    let mut w = World::with_config(Config {
        max_topic_levels: 3,
        ..Config::default()
    });
    let p = w.connect(V5, "p");
    w.publish(p, "a/b/c/d", b"x", QoS::AtLeastOnce, false, 1);
    assert!(
        matches!(&w.recv(p)[..], [Packet::PubAck(a)] if a.reason == ReasonCode::TOPIC_NAME_INVALID)
    );
    let q = w.connect(V3, "q");
    w.publish(q, "a/b/c/d", b"x", QoS::AtLeastOnce, false, 1);
    assert!(w.is_closed(q));
}

#[test]
fn subscriptions_per_client_limit_gives_quota_exceeded() {
    let mut w = World::with_config(Config {
        max_subscriptions_per_client: 2,
        ..Config::default()
    });
    let s = w.connect(V5, "s");
    w.subscribe(s, "a", QoS::AtMostOnce);
    w.subscribe(s, "b", QoS::AtMostOnce);
    assert_eq!(
        w.subscribe(s, "c", QoS::AtMostOnce),
        vec![ReasonCode::QUOTA_EXCEEDED]
    );
    assert_eq!(
        w.subscribe(s, "a", QoS::AtLeastOnce),
        vec![ReasonCode::GRANTED_QOS_1],
        "replacing is fine"
    );
}

#[test]
fn qos_above_maximum_disconnects_with_0x9b() {
    let mut w = World::with_config(Config {
        maximum_qos: QoS::AtLeastOnce,
        ..Config::default()
    });
    let p = w.connect(V5, "p");
    w.publish(p, "t", b"x", QoS::ExactlyOnce, false, 1);
    assert!(
        matches!(&w.recv(p)[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::QOS_NOT_SUPPORTED)
    );
}

#[test]
fn route_events_on_first_and_last_subscriber() {
    let mut w = World::new();
    let a = w.connect(V5, "a");
    let b = w.connect(V5, "b");
    w.subscribe(a, "r/#", QoS::AtMostOnce);
    w.subscribe(b, "r/#", QoS::AtMostOnce);
    w.unsubscribe(a, "r/#");
    w.close(b);
    let routes: Vec<&Event> = w
        .events
        .iter()
        .filter(|e| matches!(e, Event::RouteAdded { .. } | Event::RouteRemoved { .. }))
        .collect();
    assert_eq!(
        routes,
        vec![
            &Event::RouteAdded {
                filter: "r/#".into()
            },
            &Event::RouteRemoved {
                filter: "r/#".into()
            }
        ]
    );
}

#[test]
fn malformed_packet_closes_only_its_own_connection() {
    let mut w = World::new();
    let good = w.connect(V5, "good");
    w.subscribe(good, "t", QoS::AtMostOnce);
    let bad = w.connect(V5, "bad");
    w.send_bytes(bad, &[0x36, 0x03, 0x00, 0x01, b'x']); // PUBLISH with QoS 3
    assert!(w.is_closed(bad));
    let p = w.connect(V5, "p");
    w.publish(p, "t", b"still here", QoS::AtMostOnce, false, 0);
    assert_eq!(w.received_publishes(good).len(), 1);
}

#[test]
fn bytes_split_at_every_position_still_work() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "split", QoS::AtMostOnce);
    let p = w.connect(V5, "p");
    let mut bytes = bytes::BytesMut::new();
    for i in 0..3u8 {
        meridian_core::codec::encode(
            &Packet::Publish(publish_packet(
                "split",
                &[i; 40],
                QoS::AtLeastOnce,
                false,
                u16::from(i) + 1,
            )),
            V5,
            &mut bytes,
        )
        .unwrap();
    }
    for b in bytes.iter() {
        w.send_bytes(p, &[*b]);
    }
    assert_eq!(w.received_publishes(s).len(), 3);
    assert_eq!(w.recv(p).len(), 3, "three PUBACKs");
}

#[test]
fn reason_strings_follow_request_problem_information() {
    let mut w = World::with_config(Config {
        max_topic_levels: 2,
        ..Config::default()
    });
    let wants = w.connect(V5, "wants");
    w.publish(wants, "a/b/c", b"x", QoS::AtLeastOnce, false, 1);
    let [Packet::PubAck(ack)] = &w.recv(wants)[..] else {
        panic!()
    };
    assert_eq!(ack.reason, ReasonCode::TOPIC_NAME_INVALID);
    assert!(ack.properties.reason_string.is_some());
    let quiet = w
        .connect_with(V5, "quiet", |c| {
            c.properties.request_problem_information = Some(false)
        })
        .0;
    w.publish(quiet, "a/b/c", b"x", QoS::AtLeastOnce, false, 1);
    let [Packet::PubAck(ack)] = &w.recv(quiet)[..] else {
        panic!()
    };
    assert_eq!(ack.reason, ReasonCode::TOPIC_NAME_INVALID);
    assert_eq!(
        ack.properties.reason_string, None,
        "client asked for no problem information"
    );
    // DISCONNECT always explains itself.
    w.send(quiet, Packet::PubRel(Ack::new(0xffff)));
    w.recv(quiet);
    let mut bad = publish_packet("", b"x", QoS::AtMostOnce, false, 0);
    bad.properties.topic_alias = Some(9);
    w.send(quiet, Packet::Publish(bad));
    let [Packet::Disconnect(d)] = &w.recv(quiet)[..] else {
        panic!()
    };
    assert_eq!(d.reason, ReasonCode::PROTOCOL_ERROR);
    assert!(
        d.properties
            .reason_string
            .as_deref()
            .is_some_and(|s| s.contains("alias"))
    );
}

#[test]
fn queued_bytes_bound_drops_new_messages() {
    let mut w = World::with_config(Config {
        max_queued_bytes: 250,
        ..Config::default()
    });
    let s = w
        .connect_with(V5, "s", |c| {
            c.properties.session_expiry_interval = Some(100)
        })
        .0;
    w.subscribe(s, "b", QoS::AtLeastOnce);
    w.close(s);
    let p = w.connect(V5, "p");
    for i in 1..=3u16 {
        w.publish(p, "b", &[0u8; 100], QoS::AtLeastOnce, false, i);
    }
    assert_eq!(w.broker.stats().queued_messages, 2);
    assert_eq!(w.broker.stats().dropped_queue_full, 1);
}

#[test]
fn max_inflight_caps_the_clients_receive_maximum() {
    let mut w = World::with_config(Config {
        max_inflight: 3,
        ..Config::default()
    });
    let s = w
        .connect_with(V5, "s", |c| c.properties.receive_maximum = Some(100))
        .0;
    w.subscribe(s, "f", QoS::AtLeastOnce);
    let p = w.connect(V5, "p");
    for i in 1..=5u16 {
        w.publish(p, "f", b"x", QoS::AtLeastOnce, false, i);
    }
    assert_eq!(w.received_publishes(s).len(), 3);
    assert_eq!(w.broker.stats().queued_messages, 2);
}

#[test]
fn retained_store_bound_refuses_new_topics_but_allows_replace_and_delete() {
    let mut w = World::with_config(Config {
        max_retained_messages: 2,
        ..Config::default()
    });
    let p = w.connect(V5, "p");
    w.publish(p, "r/1", b"a", QoS::AtMostOnce, true, 0);
    w.publish(p, "r/2", b"b", QoS::AtMostOnce, true, 0);
    w.publish(p, "r/3", b"c", QoS::AtMostOnce, true, 0);
    assert_eq!(w.broker.stats().retained_messages, 2);
    assert_eq!(w.broker.stats().dropped_retained_full, 1);
    w.publish(p, "r/1", b"a2", QoS::AtMostOnce, true, 0);
    w.publish(p, "r/2", b"", QoS::AtMostOnce, true, 0);
    w.publish(p, "r/3", b"c", QoS::AtMostOnce, true, 0);
    let s = w.connect(V5, "s");
    let payloads: Vec<Bytes> = w
        .subscribe_collect(s, "r/#", opts(QoS::AtMostOnce))
        .into_iter()
        .filter_map(|p| {
            if let Packet::Publish(p) = p {
                Some(p.payload)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(payloads.len(), 2);
    assert!(
        payloads.contains(&Bytes::from_static(b"a2"))
            && payloads.contains(&Bytes::from_static(b"c"))
    );
}

#[test]
fn expired_retained_message_leaves_memory_and_storage_at_its_deadline() {
    let mut w = World::new();
    let p = w.connect(V5, "p");
    let mut msg = publish_packet("gone/soon", b"x", QoS::AtMostOnce, true, 0);
    msg.properties.message_expiry_interval = Some(30);
    w.send(p, Packet::Publish(msg));
    assert_eq!(w.broker.stats().retained_messages, 1);
    assert_eq!(w.store.len(), 1);
    w.advance(30_000);
    assert_eq!(w.broker.stats().retained_messages, 0);
    assert!(w.store.is_empty());
}

#[test]
fn idle_broker_sets_no_deadline() {
    let mut w = World::new();
    assert_eq!(w.broker.poll_timeout(), None);
    let c = w.connect(V5, "no-keep-alive");
    assert_eq!(
        w.broker.poll_timeout(),
        None,
        "connect timeout cancelled once connected"
    );
    w.close(c);
    let c = w.connect_with(V5, "ka", |c| c.keep_alive = 5).0;
    assert!(w.broker.poll_timeout().is_some());
    w.close(c);
    assert_eq!(
        w.broker.poll_timeout(),
        None,
        "keep-alive timer cancelled on close"
    );
}

#[test]
fn shared_qos2_in_flight_stays_with_its_member_when_it_leaves() {
    let mut w = World::new();
    let persistent = |c: &mut meridian_core::codec::Connect| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(100);
    };
    let a = w.connect_with(V5, "a", persistent).0;
    let b = w.connect(V5, "b");
    w.subscribe(a, "$share/g/q2", QoS::ExactlyOnce);
    w.subscribe(b, "$share/g/q2", QoS::ExactlyOnce);
    let p = w.connect(V5, "p");
    for i in 0..2u16 {
        w.publish(p, "q2", &[i as u8], QoS::ExactlyOnce, false, i + 1);
        w.recv(p);
        w.send(p, Packet::PubRel(Ack::new(i + 1)));
    }
    let got_a = w.received_publishes(a);
    assert_eq!(got_a.len(), 1);
    let _ = w.received_publishes(b);
    w.close(a);
    assert!(
        w.received_publishes(b).is_empty(),
        "a QoS 2 message once sent is not handed over"
    );
    // a comes back and completes it, with the same packet id.
    let a2 = w.connect_with(V5, "a", persistent).0;
    let again = w.received_publishes(a2);
    assert_eq!(again.len(), 1);
    assert!(again[0].dup);
    assert_eq!(again[0].packet_id, got_a[0].packet_id);
}

#[test]
fn resumed_in_flight_messages_respect_the_new_receive_maximum() {
    let mut w = World::new();
    let s = w
        .connect_with(V5, "s", |c| {
            c.properties.session_expiry_interval = Some(100);
            c.properties.receive_maximum = Some(10);
        })
        .0;
    w.subscribe(s, "rm", QoS::AtLeastOnce);
    let p = w.connect(V5, "p");
    for i in 1..=6u16 {
        w.publish(p, "rm", &[i as u8], QoS::AtLeastOnce, false, i);
    }
    assert_eq!(
        w.received_publishes(s).len(),
        6,
        "all six in flight, none acknowledged"
    );
    w.close(s);
    let s2 = w
        .connect_with(V5, "s", |c| {
            c.clean_start = false;
            c.properties.session_expiry_interval = Some(100);
            c.properties.receive_maximum = Some(2);
        })
        .0;
    let first = w.received_publishes(s2);
    assert_eq!(
        first.iter().map(|p| p.payload[0]).collect::<Vec<_>>(),
        vec![1, 2],
        "window of 2"
    );
    assert!(first.iter().all(|p| p.dup));
    w.ack(s2, &first[0]);
    let next = w.received_publishes(s2);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].payload[0], 3);
    assert!(next[0].dup, "re-sent with its packet id, as DUP");
}

#[test]
fn full_queue_makes_room_by_dropping_expired_messages() {
    let mut w = World::with_config(Config {
        max_queued_messages: 2,
        ..Config::default()
    });
    let s = w
        .connect_with(V5, "s", |c| {
            c.properties.session_expiry_interval = Some(100)
        })
        .0;
    w.subscribe(s, "x", QoS::AtLeastOnce);
    w.close(s);
    let p = w.connect(V5, "p");
    let mut short = publish_packet("x", b"short", QoS::AtLeastOnce, false, 1);
    short.properties.message_expiry_interval = Some(1);
    w.send(p, Packet::Publish(short));
    w.publish(p, "x", b"keep", QoS::AtLeastOnce, false, 2);
    w.advance(2_000);
    w.publish(p, "x", b"new", QoS::AtLeastOnce, false, 3);
    assert_eq!(w.broker.stats().dropped_queue_full, 0);
    assert_eq!(w.broker.stats().dropped_expired, 1);
    let s2 = w
        .connect_with(V5, "s", |c| {
            c.clean_start = false;
            c.properties.session_expiry_interval = Some(100);
        })
        .0;
    let got: Vec<Bytes> = w
        .received_publishes(s2)
        .into_iter()
        .map(|p| p.payload)
        .collect();
    assert_eq!(
        got,
        vec![Bytes::from_static(b"keep"), Bytes::from_static(b"new")]
    );
}

#[test]
fn client_publish_with_subscription_identifier_is_a_protocol_error() {
    let mut w = World::new();
    let p = w.connect(V5, "p");
    let mut msg = publish_packet("t", b"x", QoS::AtMostOnce, false, 0);
    msg.properties.subscription_identifiers = vec![5];
    w.send(p, Packet::Publish(msg));
    assert!(
        matches!(&w.recv(p)[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::PROTOCOL_ERROR)
    );
}

#[test]
fn acks_lose_reason_strings_before_exceeding_client_maximum_packet_size() {
    let mut w = World::new();
    let s = w
        .connect_with(V5, "s", |c| c.properties.maximum_packet_size = Some(16))
        .0;
    // The SUBACK's reason string would not fit in 16 bytes: it is dropped, the SUBACK is not.
    let reasons = w.subscribe(s, "a/#/b", QoS::AtMostOnce);
    assert_eq!(reasons, vec![ReasonCode::TOPIC_FILTER_INVALID]);
}

#[test]
fn shell_published_messages_are_routed_and_validated() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "sys/#", QoS::AtMostOnce);
    let message = |topic: &str| meridian_core::broker::Message {
        topic: topic.into(),
        payload: Bytes::from_static(b"up"),
        qos: QoS::AtMostOnce,
        retain: false,
        properties: Default::default(),
        expires_at: None,
        origin: None,
    };
    let now = meridian_core::Timestamp(w.now);
    assert_eq!(w.broker.publish(now, message("sys/status")), Ok(1));
    assert!(
        w.broker.publish(now, message("sys/+")).is_err(),
        "wildcards are not a topic name"
    );
    w.drain();
    assert_eq!(w.received_publishes(s).len(), 1);
}
