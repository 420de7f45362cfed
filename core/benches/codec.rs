//! Codec benchmarks: `cargo bench -p meridian-mqtt-core --bench codec`.
//!
//! Decode and encode of three MQTT 5.0 packets: a QoS 1 PUBLISH with a 256-byte payload, a
//! CONNECT with a will and credentials, and a SUBSCRIBE with 10 filters. `encode` appends to a
//! buffer that already has room, as the broker's outbox does. The allocation profiler shows
//! what decoding allocates (strings; payloads are zero-copy slices).

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use divan::Bencher;
use divan::counter::BytesCount;
use meridian_core::codec::{
    self, Connect, ConnectProperties, LastWill, OutgoingPublish, Packet, ProtocolVersion, Publish,
    PublishProperties, QoS, Subscribe, SubscribeFilter, SubscribeProperties, SubscriptionOptions,
    WillProperties,
};

#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

const V5: ProtocolVersion = ProtocolVersion::V5;

fn publish() -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "site/building-7/floor-3/room-12/temperature".into(),
        packet_id: Some(4242),
        payload: Bytes::from((0..=255u8).collect::<Vec<_>>()),
        properties: PublishProperties {
            payload_format_indicator: Some(0),
            message_expiry_interval: Some(3600),
            ..Default::default()
        },
    })
}

fn connect() -> Packet {
    Packet::Connect(Connect {
        protocol: V5,
        clean_start: true,
        keep_alive: 60,
        client_id: "sensor-0001-a7f3c9".into(),
        will: Some(LastWill {
            topic: "site/building-7/sensors/sensor-0001/status".into(),
            payload: Bytes::from_static(b"offline"),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: WillProperties {
                will_delay_interval: Some(5),
                ..Default::default()
            },
        }),
        username: Some("sensor-0001".into()),
        password: Some(Bytes::from_static(b"s3cr3t-t0k3n-0123456789")),
        properties: ConnectProperties {
            session_expiry_interval: Some(3600),
            receive_maximum: Some(100),
            maximum_packet_size: Some(1 << 20),
            topic_alias_maximum: Some(16),
            ..Default::default()
        },
    })
}

fn subscribe() -> Packet {
    Packet::Subscribe(Subscribe {
        packet_id: 7,
        filters: (0..10)
            .map(|i| SubscribeFilter {
                filter: format!("site/building-{i}/+/temperature"),
                options: SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..Default::default()
                },
            })
            .collect(),
        properties: SubscribeProperties {
            subscription_identifier: Some(12),
            user_properties: vec![],
        },
    })
}

fn encoded(packet: &Packet) -> Vec<u8> {
    let mut buf = BytesMut::new();
    codec::encode(packet, V5, &mut buf).expect("bench packets are valid");
    buf.to_vec()
}

fn bench_decode(bencher: Bencher, packet: Packet) {
    let bytes = encoded(&packet);
    bencher
        .counter(BytesCount::new(bytes.len()))
        .with_inputs(|| BytesMut::from(&bytes[..]))
        .bench_local_values(|mut buf| codec::decode(&mut buf, V5, u32::MAX));
}

fn bench_encode(bencher: Bencher, packet: Packet) {
    let len = codec::encoded_len(&packet, V5).expect("bench packets are valid");
    bencher
        .counter(BytesCount::new(len))
        .with_inputs(|| BytesMut::with_capacity(len))
        .bench_local_values(|mut out| {
            codec::encode(black_box(&packet), V5, &mut out).expect("bench packets are valid");
            out
        });
}

mod decode {
    use super::*;

    #[divan::bench]
    fn publish_qos1_256b(bencher: Bencher) {
        bench_decode(bencher, super::publish());
    }

    #[divan::bench]
    fn connect(bencher: Bencher) {
        bench_decode(bencher, super::connect());
    }

    #[divan::bench]
    fn subscribe_10_filters(bencher: Bencher) {
        bench_decode(bencher, super::subscribe());
    }
}

mod encode {
    use super::*;

    #[divan::bench]
    fn publish_qos1_256b(bencher: Bencher) {
        bench_encode(bencher, super::publish());
    }

    /// The fan-out path: one shared message, per-subscriber packet id and subscription id.
    #[divan::bench]
    fn outgoing_publish_qos1_256b(bencher: Bencher) {
        let Packet::Publish(p) = super::publish() else {
            unreachable!("publish() is a PUBLISH")
        };
        let view = OutgoingPublish {
            subscription_identifiers: &[12],
            ..OutgoingPublish::from(&p)
        };
        let len = codec::publish_len(&view, V5).expect("bench packets are valid");
        bencher
            .counter(BytesCount::new(len))
            .with_inputs(|| BytesMut::with_capacity(len))
            .bench_local_values(|mut out| {
                codec::encode_publish(black_box(&view), V5, &mut out).expect("valid");
                out
            });
    }

    #[divan::bench]
    fn connect(bencher: Bencher) {
        bench_encode(bencher, super::connect());
    }

    #[divan::bench]
    fn subscribe_10_filters(bencher: Bencher) {
        bench_encode(bencher, super::subscribe());
    }
}

fn main() {
    divan::main();
}
