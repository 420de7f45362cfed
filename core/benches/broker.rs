//! Broker throughput without IO: PUBLISH bytes in, PUBLISH bytes out, through the whole state
//! machine (decode, match, per-subscriber encode, flow control). Run with
//! `cargo bench -p meridian-mqtt-core --bench broker`.

use bytes::{Bytes, BytesMut};
use divan::{Bencher, black_box};
use meridian_core::codec::{
    self, Ack, Connect, ConnectProperties, Packet, ProtocolVersion, Publish, PublishProperties,
    QoS, Subscribe, SubscribeFilter, SubscribeProperties, SubscriptionOptions,
};
use meridian_core::{Broker, Config, ConnId, ConnInfo, Input, Output, Timestamp};

fn main() {
    divan::main();
}

const NOW: Timestamp = Timestamp(1_000_000);

fn bytes_of(packet: &Packet) -> Vec<u8> {
    let mut buf = BytesMut::new();
    codec::encode(packet, ProtocolVersion::V5, &mut buf).expect("bench packet encodes");
    buf.to_vec()
}

fn drain(broker: &mut Broker) -> usize {
    let mut n = 0;
    while let Some(out) = broker.poll_output() {
        if let Output::Send { data, .. } = out {
            n += data.len();
        }
    }
    n
}

fn client(broker: &mut Broker, id: &str, filter: Option<(&str, QoS)>) -> ConnId {
    let conn = broker.accept(NOW, ConnInfo::default());
    let connect = Packet::Connect(Connect {
        protocol: ProtocolVersion::V5,
        clean_start: true,
        keep_alive: 0,
        client_id: id.into(),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
    });
    broker.handle_input(
        NOW,
        Input::Bytes {
            conn,
            data: &bytes_of(&connect),
        },
    );
    if let Some((filter, qos)) = filter {
        let sub = Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![SubscribeFilter {
                filter: filter.into(),
                options: SubscriptionOptions {
                    qos,
                    ..Default::default()
                },
            }],
            properties: SubscribeProperties::default(),
        });
        broker.handle_input(
            NOW,
            Input::Bytes {
                conn,
                data: &bytes_of(&sub),
            },
        );
    }
    drain(broker);
    conn
}

fn publish_bytes(topic: &str, qos: QoS, packet_id: u16) -> Vec<u8> {
    bytes_of(&Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.into(),
        packet_id: (qos != QoS::AtMostOnce).then_some(packet_id),
        payload: Bytes::from(vec![7u8; 256]),
        properties: PublishProperties::default(),
    }))
}

/// One publisher, `fanout` subscribers on the same filter; one PUBLISH of 256 bytes per
/// iteration. QoS 1 subscribers acknowledge every message.
#[divan::bench(args = [1, 20, 1000], consts = [0, 1])]
fn fan_out<const QOS: u8>(bencher: Bencher, fanout: usize) {
    let qos = QoS::from_u8(QOS).expect("0 or 1");
    let mut broker = Broker::new(Config::default(), NOW);
    let subs: Vec<ConnId> = (0..fanout)
        .map(|i| client(&mut broker, &format!("s{i}"), Some(("bench/+/t", qos))))
        .collect();
    let publisher = client(&mut broker, "p", None);
    let mut packet_id = 0u16;
    bencher.bench_local(|| {
        packet_id = packet_id % 60_000 + 1;
        let data = publish_bytes("bench/42/t", qos, packet_id);
        broker.handle_input(
            NOW,
            Input::Bytes {
                conn: publisher,
                data: &data,
            },
        );
        let mut sent = 0;
        while let Some(out) = broker.poll_output() {
            if let Output::Send { conn, data } = out {
                sent += data.len();
                if qos == QoS::AtLeastOnce && conn != publisher {
                    // The subscriber acknowledges: read the packet id back from its PUBLISH.
                    let mut buf = BytesMut::from(&data[..]);
                    while let Ok(Some(Packet::Publish(p))) =
                        codec::decode(&mut buf, ProtocolVersion::V5, u32::MAX)
                    {
                        let ack = bytes_of(&Packet::PubAck(Ack::new(p.packet_id.unwrap_or(1))));
                        broker.handle_input(NOW, Input::Bytes { conn, data: &ack });
                    }
                }
            }
        }
        black_box(sent);
    });
    black_box(subs);
}

/// The cost of access rules per message: 20 QoS 0 subscribers on `bench/+/t` with no rules
/// (`RULES` 0); with a rule denying `secret/#`, which their filter does not reach, so they are
/// never checked (1); subscribed to `#` instead, which reaches `secret/#`, so every message is
/// checked for each of them (2).
#[divan::bench(consts = [0, 1, 2])]
fn fan_out_under_access_rules<const RULES: u8>(bencher: Bencher) {
    use meridian_core::acl::{Acl, Action, Permission, Rule};
    use meridian_core::broker::{AllowAll, Authorizer};
    let authorizer: Box<dyn Authorizer> = match RULES {
        0 => Box::new(AllowAll),
        _ => Box::new(Acl::new(
            Permission::Allow,
            vec![Rule::new(Permission::Deny, Action::Subscribe, "secret/#").expect("a filter")],
        )),
    };
    let mut broker: Broker =
        Broker::with_auth(Config::default(), NOW, Box::new(AllowAll), authorizer);
    let filter = if RULES == 2 { "#" } else { "bench/+/t" };
    let subs: Vec<ConnId> = (0..20)
        .map(|i| {
            client(
                &mut broker,
                &format!("s{i}"),
                Some((filter, QoS::AtMostOnce)),
            )
        })
        .collect();
    let publisher = client(&mut broker, "p", None);
    let data = publish_bytes("bench/42/t", QoS::AtMostOnce, 0);
    bencher.bench_local(|| {
        broker.handle_input(
            NOW,
            Input::Bytes {
                conn: publisher,
                data: &data,
            },
        );
        black_box(drain(&mut broker));
    });
    black_box(subs);
}

/// Matching cost with many unrelated subscribers: 100k clients each on a unique wildcard filter
/// `bench/{i}/#`, one publisher hitting one of them.
#[divan::bench(sample_count = 50)]
fn publish_among_100k_unique_filters(bencher: Bencher) {
    let mut broker = Broker::new(
        Config {
            max_topic_levels: 8,
            ..Config::default()
        },
        NOW,
    );
    for i in 0..100_000 {
        client(
            &mut broker,
            &format!("s{i}"),
            Some((&format!("bench/{i}/#"), QoS::AtMostOnce)),
        );
    }
    let publisher = client(&mut broker, "p", None);
    let data = publish_bytes("bench/77777/x", QoS::AtMostOnce, 0);
    bencher.bench_local(|| {
        broker.handle_input(
            NOW,
            Input::Bytes {
                conn: publisher,
                data: &data,
            },
        );
        black_box(drain(&mut broker));
    });
}

/// CONNECT + SUBSCRIBE to a unique wildcard filter + CONNACK/SUBACK, per client.
#[divan::bench]
fn connect_and_subscribe(bencher: Bencher) {
    let mut broker = Broker::new(Config::default(), NOW);
    let mut i = 0u64;
    bencher.bench_local(|| {
        i += 1;
        black_box(client(
            &mut broker,
            &format!("c{i}"),
            Some((&format!("t/mqttx/+/{i}/sub/+/#"), QoS::AtLeastOnce)),
        ));
    });
}

/// Two nodes of a deployment, `a` and `b`, linked, with what each wants known to the other:
/// `b` has a subscriber on `bench/+/t` at `qos`, `a` a publisher. Returns the nodes, the
/// publisher (on `a`) and the subscriber (on `b`).
fn linked_pair(qos: QoS) -> (Broker, Broker, ConnId, ConnId) {
    use meridian_core::broker::ClusterConfig;
    use meridian_core::routes::NodeId;
    let id = |n: &str| NodeId::new(n).expect("a node id");
    let mut a = Broker::new(Config::default(), NOW);
    let mut b = Broker::new(Config::default(), NOW);
    a.enable_cluster(NOW, ClusterConfig::new(id("a"), 1, "ra"));
    b.enable_cluster(NOW, ClusterConfig::new(id("b"), 1, "rb"));
    let subscriber = client(&mut b, "sub", Some(("bench/+/t", qos)));
    let publisher = client(&mut a, "pub", None);
    a.handle_input(NOW, Input::PeerUp { peer: id("b") });
    b.handle_input(NOW, Input::PeerUp { peer: id("a") });
    // Time runs until the route batches and digests went both ways and nothing is in flight.
    let step = |sender: &mut Broker, receiver: &mut Broker, from: &str, now: Timestamp| {
        if sender.poll_timeout().is_some_and(|at| at <= now) {
            sender.handle_input(now, Input::Timeout);
        }
        let frames = frames_out(sender);
        if !frames.is_empty() {
            let peer = id(from);
            receiver.handle_input(now, Input::PeerFrames { peer, frames });
        }
    };
    let mut now = NOW;
    for _ in 0..100 {
        now = now.plus_ms(10);
        step(&mut a, &mut b, "a", now);
        step(&mut b, &mut a, "b", now);
    }
    assert_eq!(a.nodes_for("bench/42/t"), [id("b")], "a knows what b wants");
    (a, b, publisher, subscriber)
}

/// The frames a node sends its peers, read back as its peer reads them (the shell writes the
/// bytes as they are; the peer's reader decodes them).
fn frames_out(broker: &mut Broker) -> Vec<meridian_core::link::Frame> {
    let mut reader = meridian_core::link::FrameReader::new(u32::MAX);
    let mut frames = Vec::new();
    while let Some(out) = broker.poll_output() {
        if let Output::ToPeer { frame, .. } | Output::Broadcast { frame } = out {
            frames.extend(reader.read(frame.bytes()).frames);
        }
    }
    frames
}

/// One PUBLISH of 256 bytes from a client of one node to a client of another, per iteration:
/// the publisher's node matches it and forwards it (QoS 1: through its outbox, a record), the
/// other node delivers it (QoS 1: a duplicate mark, the subscriber's PUBACK) and acknowledges
/// it, and the first takes the acknowledgement. Both nodes' work, and what their shells do
/// with the frames: write the bytes they are given, read them back.
#[divan::bench(consts = [0, 1])]
fn forward_across_nodes<const QOS: u8>(bencher: Bencher) {
    use meridian_core::routes::NodeId;
    let qos = QoS::from_u8(QOS).expect("0 or 1");
    let (mut a, mut b, publisher, subscriber) = linked_pair(qos);
    let (from_a, from_b) = (NodeId::new("a").unwrap(), NodeId::new("b").unwrap());
    let mut packet_id = 0u16;
    bencher.bench_local(|| {
        packet_id = packet_id % 60_000 + 1;
        let data = publish_bytes("bench/42/t", qos, packet_id);
        a.handle_input(
            NOW,
            Input::Bytes {
                conn: publisher,
                data: &data,
            },
        );
        let frames = frames_out(&mut a);
        b.handle_input(
            NOW,
            Input::PeerFrames {
                peer: from_a.clone(),
                frames,
            },
        );
        let mut acks = Vec::new();
        let mut reader = meridian_core::link::FrameReader::new(u32::MAX);
        while let Some(out) = b.poll_output() {
            match out {
                Output::Send { conn, data } if conn == subscriber && qos == QoS::AtLeastOnce => {
                    let mut buf = BytesMut::from(&data[..]);
                    while let Ok(Some(Packet::Publish(p))) =
                        codec::decode(&mut buf, ProtocolVersion::V5, u32::MAX)
                    {
                        acks.push(bytes_of(&Packet::PubAck(Ack::new(
                            p.packet_id.unwrap_or(1),
                        ))));
                    }
                }
                Output::ToPeer { frame, .. } => {
                    let read = reader.read(frame.bytes());
                    if !read.frames.is_empty() {
                        a.handle_input(
                            NOW,
                            Input::PeerFrames {
                                peer: from_b.clone(),
                                frames: read.frames,
                            },
                        );
                    }
                }
                _ => {}
            }
        }
        for ack in acks {
            b.handle_input(
                NOW,
                Input::Bytes {
                    conn: subscriber,
                    data: &ack,
                },
            );
        }
        black_box((drain(&mut a), drain(&mut b)));
    });
}
