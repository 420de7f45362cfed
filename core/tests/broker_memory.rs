//! What the broker keeps in memory, counted by the allocator (dhat's heap usage testing). One
//! test in this binary, so that no other test's allocations are counted with it.

mod common;

use bytes::BytesMut;
use common::*;
use meridian_core::broker::ClusterConfig;
use meridian_core::codec::{
    self, Connect, Packet, QoS, Subscribe, SubscribeFilter, SubscriptionOptions,
};
use meridian_core::link::{Forward, Frame};
use meridian_core::routes::{NodeId, Owner, RouteChange, RouteDelta, RouteOp, set_hash};
use meridian_core::{Broker, Config, ConnId, ConnInfo, Input, Timestamp};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

const NOW: Timestamp = Timestamp(1_000);
/// Messages sent in each case, one per read.
const READS: usize = 200;
/// What else each read held.
const PADDING: usize = 16 * 1024;

fn feed(broker: &mut Broker, conn: ConnId, packets: &[Packet]) {
    let mut buf = BytesMut::new();
    for p in packets {
        codec::encode(p, V5, &mut buf).unwrap();
    }
    broker.handle_input(NOW, Input::Bytes { conn, data: &buf });
    while broker.poll_output().is_some() {}
}

/// A broker with one subscriber to `wanted` whose in-flight window holds one message: the
/// rest wait in its session's queue.
fn broker_with_a_slow_subscriber(cluster: Option<ClusterConfig>) -> Broker {
    let mut connect = connect_packet(V5, "sub");
    connect.properties.receive_maximum = Some(1);
    broker_with_a_subscriber(cluster, connect).0
}

/// A broker with one subscriber to `wanted`, connected with `connect`, and its connection.
fn broker_with_a_subscriber(cluster: Option<ClusterConfig>, connect: Connect) -> (Broker, ConnId) {
    let mut broker = Broker::new(Config::default(), NOW);
    if let Some(cluster) = cluster {
        broker.enable_cluster(NOW, cluster);
    }
    let sub = broker.accept(NOW, ConnInfo::default());
    let subscribe = Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: "wanted".into(),
            options: SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                ..Default::default()
            },
        }],
        properties: Default::default(),
    };
    feed(
        &mut broker,
        sub,
        &[Packet::Connect(connect), Packet::Subscribe(subscribe)],
    );
    (broker, sub)
}

/// Heap bytes allocated by `send` and still held afterwards, per message sent.
fn kept_per_message(broker: &mut Broker, send: impl FnOnce(&mut Broker)) -> usize {
    let profiler = dhat::Profiler::builder().testing().build();
    send(broker);
    let kept = dhat::HeapStats::get().curr_bytes;
    drop(profiler);
    kept / READS
}

fn wanted(i: usize) -> codec::Publish {
    let id = u16::try_from(i + 1).unwrap();
    publish_packet("wanted", b"0123456789", QoS::AtLeastOnce, false, id)
}

/// A client connected to `broker` publishes, in each of its reads, 16 KiB nobody wants and a
/// 10-byte QoS 1 message to `wanted`; then `after` runs. What the broker kept per message.
fn publish_reads(broker: &mut Broker, after: impl FnOnce(&mut Broker)) -> usize {
    let publisher = broker.accept(NOW, ConnInfo::default());
    feed(
        broker,
        publisher,
        &[Packet::Connect(connect_packet(V5, "pub"))],
    );
    let padding = vec![b'x'; PADDING];
    let reads: Vec<[Packet; 2]> = (0..READS)
        .map(|i| {
            let unwanted = publish_packet("unwanted", &padding, QoS::AtMostOnce, false, 0);
            [Packet::Publish(unwanted), Packet::Publish(wanted(i))]
        })
        .collect();
    kept_per_message(broker, |broker| {
        for read in &reads {
            feed(broker, publisher, read);
        }
        after(broker);
    })
}

/// A queued message keeps its own bytes, not the read they came in. Each read here holds
/// 16 KiB that nobody wants and a 10-byte message that must wait: what the broker keeps per
/// waiting message must be near 10 bytes plus its records, not 16 KiB. So for a client's
/// reads and a peer's frames queued for a slow subscriber, and for a client's reads waiting
/// in the outbox to a peer that is away, and for messages in flight to a persistent session
/// when its client goes away.
#[test]
fn a_waiting_message_keeps_its_own_bytes_not_the_read_they_came_in() {
    let mut broker = broker_with_a_slow_subscriber(None);
    let queued_from_a_client = publish_reads(&mut broker, |_| {});
    assert_eq!(broker.stats().queued_messages, READS - 1);

    let here = NodeId::new("here").unwrap();
    let there = NodeId::new("there").unwrap();
    let owner = Owner {
        node: there.clone(),
        incarnation: 1,
    };
    let cluster = ClusterConfig::new(here, 1, "r1");
    let mut broker = broker_with_a_slow_subscriber(Some(cluster.clone()));
    broker.handle_input(
        NOW,
        Input::PeerUp {
            peer: there.clone(),
        },
    );
    while broker.poll_output().is_some() {}
    let padding = vec![b'x'; PADDING];
    let queued_from_a_peer = kept_per_message(&mut broker, |broker| {
        for i in 0..READS {
            // A peer's frames are decoded from its reads, as a client's packets are: the
            // message is a part of the read.
            let mut message = wanted(i);
            let mut read = BytesMut::from(&padding[..]);
            read.extend_from_slice(&message.payload);
            message.payload = read.freeze().split_off(PADDING);
            let forward = Forward {
                origin: owner.clone(),
                seq: i as u64 + 1,
                message,
            };
            let input = Input::PeerFrame {
                peer: there.clone(),
                frame: Box::new(Frame::Forward(forward)),
            };
            broker.handle_input(NOW, input);
            while broker.poll_output().is_some() {}
        }
    });
    assert_eq!(broker.stats().queued_messages, READS - 1);

    // A node whose peer wants `wanted` and is away: every message waits in its outbox.
    let mut broker = Broker::new(Config::default(), NOW);
    broker.enable_cluster(NOW, cluster);
    broker.handle_input(
        NOW,
        Input::PeerUp {
            peer: there.clone(),
        },
    );
    let delta = RouteDelta {
        owner,
        after: 0,
        changes: vec![RouteChange {
            version: 1,
            filter: "wanted".into(),
            op: RouteOp::Add,
        }],
        hash: set_hash(["wanted"]),
    };
    let frame = Box::new(Frame::RouteDelta(delta));
    let peer = there.clone();
    broker.handle_input(NOW, Input::PeerFrame { peer, frame });
    broker.handle_input(NOW, Input::PeerDown { peer: there });
    while broker.poll_output().is_some() {}
    let in_an_outbox = publish_reads(&mut broker, |_| {});
    let outbox: Vec<usize> = broker.peers().iter().map(|p| p.outbox_messages).collect();
    assert_eq!(outbox, [READS], "every message waits in the outbox");

    // A persistent session that goes away with every message in flight.
    let mut connect = connect_packet(V5, "sub");
    connect.clean_start = false;
    connect.properties.session_expiry_interval = Some(3600);
    let (mut broker, sub) = broker_with_a_subscriber(None, connect);
    let in_flight_to_a_session_gone = publish_reads(&mut broker, |broker| {
        broker.handle_input(NOW, Input::Closed { conn: sub });
        while broker.poll_output().is_some() {}
    });
    assert_eq!(broker.stats().inflight_messages, READS);

    for (waiting, kept) in [
        ("queued from a client", queued_from_a_client),
        ("queued from a peer", queued_from_a_peer),
        ("in a peer's outbox", in_an_outbox),
        ("in flight to a session gone", in_flight_to_a_session_gone),
    ] {
        assert!(
            kept < 1024,
            "{kept} bytes kept per message {waiting} (a read was over {PADDING} bytes)"
        );
    }
}
