//! Resumable connections: a broker rebuilt from its records while its network connections
//! stay open (a Durable Object woken from hibernation, which happens only after it was quiet,
//! so after a checkpoint) goes on with each connection where it stood, without a new CONNECT,
//! a lost message or a duplicate.

mod common;

use bytes::Bytes;
use common::*;
use meridian_core::codec::{Ack, LastWill, Packet, QoS, WillProperties};
use meridian_core::{Config, Timestamp};

fn resumable() -> Config {
    Config {
        resumable_connections: true,
        ..Config::default()
    }
}

fn will(topic: &str) -> LastWill {
    LastWill {
        topic: topic.into(),
        payload: Bytes::from_static(b"gone"),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: WillProperties::default(),
    }
}

#[test]
fn qos2_exchanges_that_span_a_wake_up_complete_once() {
    let mut w = World::with_config(resumable());
    let sub = w.connect(V5, "sub");
    w.subscribe(sub, "t", QoS::ExactlyOnce);
    let publisher = w.connect(V3, "pub");
    w.publish(publisher, "t", b"one", QoS::ExactlyOnce, false, 1);
    assert!(matches!(&w.recv(publisher)[..], [Packet::PubRec(a)] if a.packet_id == 1));
    let got = w.received_publishes(sub);
    assert_eq!(got.len(), 1);
    let delivered = got[0].clone();

    let report = w.wake(&[sub, publisher]);
    assert_eq!(report.connections, 2);
    assert_eq!(report.sessions, 2);
    // Nothing is sent again on a connection that never went away.
    assert!(w.recv(sub).is_empty());
    assert!(w.recv(publisher).is_empty());

    // The publisher's re-sent PUBLISH is known; its PUBREL completes the exchange.
    let mut again = publish_packet("t", b"one", QoS::ExactlyOnce, false, 1);
    again.dup = true;
    w.send(publisher, Packet::Publish(again));
    assert!(matches!(&w.recv(publisher)[..], [Packet::PubRec(a)] if a.packet_id == 1));
    w.send(publisher, Packet::PubRel(Ack::new(1)));
    assert!(matches!(&w.recv(publisher)[..], [Packet::PubComp(a)] if a.packet_id == 1));
    // The subscriber acknowledges what it received before the wake-up.
    w.ack(sub, &delivered);
    assert!(
        w.recv(sub).is_empty(),
        "the message came once, and nothing else"
    );
    // And both go on.
    w.publish(publisher, "t", b"two", QoS::ExactlyOnce, false, 2);
    let got = w.received_publishes(sub);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, "two");
}

#[test]
fn qos1_sent_before_a_wake_up_is_acknowledged_after_it() {
    let mut w = World::with_config(resumable());
    let sub = w.connect(V3, "sub");
    w.subscribe(sub, "t", QoS::AtLeastOnce);
    let publisher = w.connect(V5, "pub");
    for i in 1..=3u16 {
        w.publish(publisher, "t", &[i as u8], QoS::AtLeastOnce, false, i);
    }
    let got = w.received_publishes(sub);
    assert_eq!(got.len(), 3);
    w.wake(&[sub, publisher]);
    for p in &got {
        w.ack(sub, p);
    }
    assert!(w.recv(sub).is_empty());
    // Every record of the clean sessions goes with their connections; what stays is the
    // reservation of connection ids.
    w.close(sub);
    w.close(publisher);
    let left: Vec<_> = w.store.keys().collect();
    assert_eq!(left, [&Bytes::from_static(b"N")], "records left");
}

#[test]
fn a_connection_keeps_its_topic_aliases_and_limits() {
    let mut w = World::with_config(resumable());
    let sub = w.connect(V5, "sub");
    w.subscribe(sub, "a/b", QoS::AtMostOnce);
    let (publisher, _) = w.connect_with(V5, "pub", |c| {
        c.properties.receive_maximum = Some(1);
    });
    let mut first = publish_packet("a/b", b"1", QoS::AtMostOnce, false, 0);
    first.properties.topic_alias = Some(3);
    w.send(publisher, Packet::Publish(first));
    assert_eq!(w.received_publishes(sub).len(), 1);

    w.wake(&[sub, publisher]);
    let mut second = publish_packet("", b"2", QoS::AtMostOnce, false, 0);
    second.properties.topic_alias = Some(3);
    w.send(publisher, Packet::Publish(second));
    let got = w.received_publishes(sub);
    assert_eq!(got.len(), 1, "the alias still names a/b");
    assert_eq!(got[0].payload, "2");

    // Receive Maximum 1 still holds: a second QoS 1 message waits for the first's PUBACK.
    w.subscribe(publisher, "q", QoS::AtLeastOnce);
    w.publish(sub, "q", b"x", QoS::AtLeastOnce, false, 1);
    w.publish(sub, "q", b"y", QoS::AtLeastOnce, false, 2);
    let got = w.received_publishes(publisher);
    assert_eq!(got.len(), 1);
    w.wake(&[sub, publisher]);
    w.ack(publisher, &got[0]);
    let got = w.received_publishes(publisher);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, "y");
    w.ack(publisher, &got[0]);
    // The alias records go with their connection.
    w.close(publisher);
    w.close(sub);
    let left: Vec<_> = w.store.keys().collect();
    assert_eq!(left, [&Bytes::from_static(b"N")], "records left");
}

#[test]
fn keep_alive_runs_again_from_the_wake_up_and_the_will_waits_for_it() {
    let mut w = World::with_config(resumable());
    let watcher = w.connect(V5, "watcher");
    w.subscribe(watcher, "wills/#", QoS::AtLeastOnce);
    let (device, _) = w.connect_with(V5, "device", |c| {
        c.keep_alive = 10;
        c.will = Some(will("wills/device"));
    });
    w.advance(9_000);
    w.wake(&[watcher, device]);
    assert!(
        w.received_publishes(watcher).is_empty(),
        "no will at wake-up"
    );
    w.advance(14_000);
    assert!(!w.is_closed(device), "keep alive counts from the wake-up");
    w.advance(2_000);
    assert!(
        w.is_closed(device),
        "1.5 times the keep alive without a packet"
    );
    let got = w.received_publishes(watcher);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].topic, "wills/device");
}

#[test]
fn a_connection_that_closed_meanwhile_is_a_lost_connection() {
    let mut w = World::with_config(resumable());
    let watcher = w.connect(V5, "watcher");
    w.subscribe(watcher, "wills/#", QoS::AtLeastOnce);
    let (device, _) = w.connect_with(V3, "device", |c| c.will = Some(will("wills/device")));
    w.subscribe(device, "cmd", QoS::AtLeastOnce);

    let report = w.wake(&[watcher]);
    assert_eq!(report.connections, 1);
    let got = w.received_publishes(watcher);
    assert_eq!(got.len(), 1, "the will of a lost connection is published");
    // Its clean session ended with it, and its records are gone.
    let leftovers: Vec<_> = w
        .store
        .keys()
        .filter(|k| k.windows(6).any(|w| w == b"device"))
        .collect();
    assert!(leftovers.is_empty(), "records left: {leftovers:?}");
    // A message for its old subscription goes nowhere; the device may connect again.
    w.publish(watcher, "cmd", b"x", QoS::AtLeastOnce, false, 1);
    let (again, ack) = w.connect_with(V3, "device", |_| {});
    assert!(!ack.session_present);
    assert!(again.0 > device.0, "connection ids are never reused");
}

#[test]
fn a_persistent_session_resumes_with_its_expiry_and_queue() {
    let mut w = World::with_config(resumable());
    let (sub, _) = w.connect_with(V5, "sub", |c| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(60);
        c.properties.receive_maximum = Some(1);
    });
    w.subscribe(sub, "t", QoS::AtLeastOnce);
    let publisher = w.connect(V5, "pub");
    for i in 1..=3u16 {
        w.publish(publisher, "t", &[i as u8], QoS::AtLeastOnce, false, i);
    }
    let first = w.received_publishes(sub);
    assert_eq!(first.len(), 1, "the rest wait in the queue");
    w.wake(&[sub, publisher]);
    let mut payloads = vec![first[0].payload[0]];
    let mut last = first[0].clone();
    for _ in 0..2 {
        w.ack(sub, &last);
        let got = w.received_publishes(sub);
        assert_eq!(got.len(), 1);
        last = got[0].clone();
        payloads.push(last.payload[0]);
    }
    w.ack(sub, &last);
    assert_eq!(payloads, vec![1, 2, 3]);
    // Disconnected, the session outlives its connection as before.
    w.close(sub);
    w.publish(publisher, "t", b"later", QoS::AtLeastOnce, false, 9);
    let (back, ack) = w.connect_with(V5, "sub", |c| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(60);
    });
    assert!(ack.session_present);
    assert_eq!(w.received_publishes(back).len(), 1);
}

#[test]
fn a_half_received_packet_cannot_be_resumed() {
    let mut w = World::with_config(resumable());
    let sub = w.connect(V5, "sub");
    w.subscribe(sub, "t", QoS::AtMostOnce);
    let publisher = w.connect(V5, "pub");
    let mut bytes = bytes::BytesMut::new();
    meridian_core::codec::encode(
        &Packet::Publish(publish_packet("t", b"whole", QoS::AtMostOnce, false, 0)),
        V5,
        &mut bytes,
    )
    .unwrap();
    w.send_bytes(publisher, &bytes[..4]);
    w.wake(&[sub, publisher]);
    assert!(w.is_closed(publisher), "its first bytes are gone");
    assert!(!w.is_closed(sub));
    // A packet completed before the wake-up leaves nothing behind.
    let other = w.connect(V5, "other");
    w.send_bytes(other, &bytes[..4]);
    w.send_bytes(other, &bytes[4..]);
    assert_eq!(w.received_publishes(sub).len(), 1);
    w.wake(&[sub, other]);
    assert!(!w.is_closed(other));
}

#[test]
fn an_open_connection_without_a_session_is_closed() {
    let mut w = World::with_config(resumable());
    let early = w.accept(); // no CONNECT yet
    let sub = w.connect(V5, "sub");
    let report = w.wake(&[early, sub]);
    assert_eq!(report.connections, 1);
    assert!(w.is_closed(early));
    assert!(!w.is_closed(sub));
    let next = w.accept();
    assert!(next.0 > sub.0);
}

#[test]
fn without_the_option_nothing_of_a_connection_is_stored() {
    let mut w = World::new();
    let sub = w.connect(V5, "sub");
    w.subscribe(sub, "t", QoS::ExactlyOnce);
    let publisher = w.connect(V5, "pub");
    w.publish(publisher, "t", b"x", QoS::ExactlyOnce, false, 1);
    assert!(w.store.is_empty());
    let report = w.wake(&[sub, publisher]);
    assert_eq!(report.connections, 0);
    assert!(w.is_closed(sub) && w.is_closed(publisher));
}

#[test]
fn clean_sessions_are_written_at_the_checkpoint_not_per_message() {
    let mut w = World::with_config(resumable());
    let sub = w.connect(V5, "sub");
    w.subscribe(sub, "t", QoS::ExactlyOnce);
    let publisher = w.connect(V5, "pub");
    let writes = w.log.len();
    for i in 1..=5u16 {
        w.publish(publisher, "t", &[i as u8], QoS::AtLeastOnce, false, i);
    }
    let stored = w.log[writes..]
        .iter()
        .filter(|o| matches!(o, meridian_core::Output::Persist { .. }))
        .count();
    assert_eq!(stored, 0, "nothing stored per message");
    w.broker.checkpoint(Timestamp(w.now));
    w.drain();
    let checkpoints: Vec<_> = w
        .store
        .keys()
        .filter(|k| k.first() == Some(&b'K'))
        .collect();
    assert_eq!(checkpoints.len(), 2, "one record per changed clean session");
    // A second checkpoint with nothing changed writes nothing.
    let before = w.log.len();
    w.broker.checkpoint(Timestamp(w.now));
    w.drain();
    assert_eq!(w.log.len(), before);
}

#[test]
fn without_a_checkpoint_clean_sessions_are_lost_connections() {
    let mut w = World::with_config(resumable());
    let sub = w.connect(V5, "sub");
    w.subscribe(sub, "t", QoS::AtLeastOnce);
    let (persistent, _) = w.connect_with(V5, "kept", |c| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(60);
    });
    let report = w.wake_without_checkpoint(&[sub, persistent]);
    // The persistent session was stored as it changed; the clean one never was.
    assert_eq!(report.connections, 1);
    assert!(w.is_closed(sub));
    assert!(!w.is_closed(persistent));
}
