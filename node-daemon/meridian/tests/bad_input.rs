//! Hostile and broken input against the running daemon: it stays up and other clients are
//! unaffected.

mod common;

use std::time::{Duration, Instant};

use common::raw::Raw;
use common::{DEADLINE, Daemon, http, v3};
use meridian_core::codec::ProtocolVersion::{V5, V311};
use rumqttc::QoS;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str = "[limits]\nconnect_timeout_ms = 500\n";

/// Whether the daemon closes this connection within the deadline (reading and discarding).
async fn closed_by_server(mut s: TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(DEADLINE, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            }
        }
    })
    .await
    .unwrap_or(false)
}

/// A bystander keeps working: subscribe, publish, receive.
async fn bystander_round_trip(d: &Daemon, id: &str) {
    let mut c = v3::connect(v3::options(id, d.mqtt)).await;
    c.subscribe(&format!("ok/{id}"), QoS::AtLeastOnce).await;
    c.client
        .publish(format!("ok/{id}"), QoS::AtLeastOnce, false, "still fine")
        .await
        .unwrap();
    assert_eq!(&c.publish_msg().await.payload[..], b"still fine");
    let (status, _) = http(d.admin, "GET", "/health").await;
    assert_eq!(status, 200);
}

/// splitmix64, so failures replay.
fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) as u8
        })
        .collect()
}

#[tokio::test]
async fn random_bytes_are_refused_and_others_are_unaffected() {
    let d = Daemon::start_with_config(Some(CONFIG));
    let mut keep = v3::connect(v3::options("keeper", d.mqtt)).await;
    keep.subscribe("keep", QoS::AtLeastOnce).await;
    for seed in 0..40u64 {
        let mut s = TcpStream::connect(("127.0.0.1", d.mqtt)).await.unwrap();
        let bytes = random_bytes(seed, 64 + (seed as usize * 37) % 4000);
        // The daemon may close mid-write; that is fine.
        let _ = s.write_all(&bytes).await;
        assert!(
            closed_by_server(s).await,
            "seed {seed}: connection not closed"
        );
    }
    // Random bytes after a valid CONNECT.
    for seed in 100..120u64 {
        let mut r = Raw::connect(d.mqtt, V5, &format!("fuzz{seed}")).await;
        let _ = r.stream.write_all(&random_bytes(seed, 512)).await;
        assert!(r.closed().await);
    }
    keep.client
        .publish("keep", QoS::AtLeastOnce, false, "alive")
        .await
        .unwrap();
    assert_eq!(&keep.publish_msg().await.payload[..], b"alive");
    bystander_round_trip(&d, "after-random").await;
}

#[tokio::test]
async fn oversized_remaining_length_is_refused_before_buffering() {
    let d = Daemon::start_with_config(Some(CONFIG));
    // PUBLISH claiming 268 MB, after a valid CONNECT.
    let mut r = Raw::connect(d.mqtt, V311, "big").await;
    r.stream
        .write_all(&[0x30, 0xFF, 0xFF, 0xFF, 0x7F])
        .await
        .unwrap();
    let started = Instant::now();
    assert!(r.closed().await);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused from the header alone"
    );
    // A remaining length of five continuation bytes is malformed.
    let mut s = TcpStream::connect(("127.0.0.1", d.mqtt)).await.unwrap();
    s.write_all(&[0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0x01])
        .await
        .unwrap();
    assert!(closed_by_server(s).await);
    // A CONNECT larger than the packet limit.
    let mut s = TcpStream::connect(("127.0.0.1", d.mqtt)).await.unwrap();
    s.write_all(&[0x10, 0x80, 0x80, 0x80, 0x01]).await.unwrap();
    assert!(closed_by_server(s).await);
    bystander_round_trip(&d, "after-big").await;
}

#[tokio::test]
async fn truncated_packets_and_silence_hit_the_connect_timeout() {
    let d = Daemon::start_with_config(Some(CONFIG));
    // Nothing at all.
    let silent = TcpStream::connect(("127.0.0.1", d.mqtt)).await.unwrap();
    // Half a CONNECT.
    let mut half = TcpStream::connect(("127.0.0.1", d.mqtt)).await.unwrap();
    half.write_all(&[0x10, 14, 0, 4, b'M', b'Q']).await.unwrap();
    let started = Instant::now();
    assert!(closed_by_server(silent).await);
    assert!(closed_by_server(half).await);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "closed by the 500 ms connect timeout, took {:?}",
        started.elapsed()
    );
    // Truncated then dropped by the client.
    for cut in 1..14 {
        let mut s = TcpStream::connect(("127.0.0.1", d.mqtt)).await.unwrap();
        let connect = [
            0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60, 0, 2, b'c', b'1',
        ];
        s.write_all(&connect[..cut]).await.unwrap();
        drop(s);
    }
    bystander_round_trip(&d, "after-truncated").await;
}

#[tokio::test]
async fn connect_flood_leaves_the_daemon_serving() {
    let d = Daemon::start_with_config(Some(CONFIG));
    let mut keep = v3::connect(v3::options("flood-keeper", d.mqtt)).await;
    keep.subscribe("flood/keep", QoS::AtLeastOnce).await;
    let port = d.mqtt;
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        tasks.push(tokio::spawn(async move {
            // Half reuse one client id (a takeover storm), half are distinct.
            let id = if i % 2 == 0 {
                "storm".to_owned()
            } else {
                format!("flood{i}")
            };
            let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await else {
                return;
            };
            let mut out = bytes::BytesMut::new();
            let packet =
                meridian_core::codec::Packet::Connect(common::raw::connect_packet(V5, &id));
            meridian_core::codec::encode(&packet, V5, &mut out).unwrap();
            let _ = s.write_all(&out).await;
            let mut buf = [0u8; 64];
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
        }));
    }
    for t in tasks {
        tokio::time::timeout(DEADLINE, t).await.unwrap().unwrap();
    }
    keep.client
        .publish("flood/keep", QoS::AtLeastOnce, false, "alive")
        .await
        .unwrap();
    assert_eq!(&keep.publish_msg().await.payload[..], b"alive");
    bystander_round_trip(&d, "after-flood").await;
}

#[tokio::test]
async fn slow_consumer_is_disconnected_and_counted() {
    let d = Daemon::start_with_config(Some("[limits]\nmax_write_buffer_bytes = 65536\n"));
    // A subscriber that never reads its socket, at QoS 1: QoS 0 messages would be dropped
    // once its backlog passed a lower mark, and it would stay connected.
    let mut slow = Raw::connect(d.mqtt, V311, "slow").await;
    slow.send(&meridian_core::codec::Packet::Subscribe(
        meridian_core::codec::Subscribe {
            packet_id: 1,
            filters: vec![meridian_core::codec::SubscribeFilter {
                filter: "firehose".to_owned(),
                options: meridian_core::codec::SubscriptionOptions {
                    qos: meridian_core::codec::QoS::AtLeastOnce,
                    ..Default::default()
                },
            }],
            properties: Default::default(),
        },
    ))
    .await;
    assert!(matches!(
        slow.next().await,
        Some(meridian_core::codec::Packet::SubAck(_))
    ));
    // Publish until the daemon gives up on it: kernel buffers fill, then 64 KiB of backlog.
    let mut opts = v3::options("firehose", d.mqtt);
    opts.set_max_packet_size(1 << 20, 1 << 20);
    let publ = v3::connect(opts).await;
    let payload = vec![7u8; 256 * 1024];
    let deadline = Instant::now() + DEADLINE;
    loop {
        let cut = metric(&d, "meridian_slow_consumer_disconnects_total").await;
        if cut > 0 {
            assert_eq!(cut, 1, "one slow connection is cut off, and counted, once");
            break;
        }
        assert!(Instant::now() < deadline, "slow consumer never cut off");
        for _ in 0..8 {
            publ.client
                .publish("firehose", QoS::AtLeastOnce, false, payload.clone())
                .await
                .unwrap();
        }
    }
    bystander_round_trip(&d, "after-slow").await;
}

/// A subscriber that stops reading during a stream of large QoS 1 messages is not cut off:
/// `max_inflight_bytes` holds back what would take its backlog past the write buffer's bound,
/// and the rest waits in its session until it reads and acknowledges again.
#[tokio::test]
async fn large_qos1_messages_to_a_stalled_reader_wait_in_its_session() {
    const COUNT: usize = 64;
    let d = Daemon::start();
    // rumqttc, its event loop polled by hand: while it is not polled, the socket is not read
    // and nothing is acknowledged.
    let mut opts = v3::options("stalled-qos1", d.mqtt);
    opts.set_max_packet_size(1 << 20, 1 << 20);
    let (sub, mut events) = rumqttc::AsyncClient::new(opts, 10);
    sub.subscribe("big", QoS::AtLeastOnce).await.unwrap();
    loop {
        match tokio::time::timeout(DEADLINE, events.poll()).await {
            Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_)))) => break,
            Ok(Ok(_)) => {}
            other => panic!("subscriber: {other:?}"),
        }
    }
    // 16 MiB: twice the write buffer's bound (8 MiB) if it all went out at once.
    let mut opts = v3::options("big-pub", d.mqtt);
    opts.set_max_packet_size(1 << 20, 1 << 20);
    let publ = v3::connect(opts).await;
    for i in 0..COUNT {
        let mut payload = vec![0u8; 256 * 1024];
        payload[0] = u8::try_from(i).unwrap();
        publ.client
            .publish("big", QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }
    let deadline = Instant::now() + DEADLINE;
    while metric(&d, "meridian_queued_messages").await == 0 {
        assert!(Instant::now() < deadline, "nothing held back");
        tokio::task::yield_now().await;
    }
    // The subscriber reads and acknowledges again: every message, in order, nothing cut.
    let mut next = 0;
    while next < COUNT {
        match tokio::time::timeout(DEADLINE, events.poll()).await {
            Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)))) => {
                assert_eq!(usize::from(p.payload[0]), next, "in order");
                next += 1;
            }
            Ok(Ok(_)) => {}
            other => panic!("after {next} messages the subscriber got: {other:?}"),
        }
    }
    assert_eq!(
        metric(&d, "meridian_slow_consumer_disconnects_total").await,
        0
    );
    bystander_round_trip(&d, "after-large-qos1").await;
}

/// A series of `/metrics`, 0 when absent.
async fn metric(d: &Daemon, series: &str) -> u64 {
    common::Metrics::of(d.admin).await.value(series) as u64
}

/// The client ids `/api/clients` shows congested.
async fn congested_clients(d: &Daemon) -> Vec<String> {
    let (status, body) = http(d.admin, "GET", "/api/clients").await;
    assert_eq!(status, 200, "{body}");
    let clients: serde_json::Value = serde_json::from_str(&body).unwrap();
    clients
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["congested"] == true)
        .map(|c| c["client_id"].as_str().unwrap().to_owned())
        .collect()
}

const QOS0_CONGESTED: &str = "meridian_messages_dropped_total{reason=\"qos0_congested\"}";

/// A subscriber that stops reading during a QoS 0 flood is not cut off: past
/// `qos0_max_write_buffer_bytes` of backlog its QoS 0 messages are dropped and counted, its
/// QoS 1 messages still arrive, and QoS 0 resumes once it has read its backlog.
#[tokio::test]
async fn qos0_flood_to_a_stalled_reader_is_dropped_not_disconnected() {
    let d = Daemon::start_with_config(Some(
        "[limits]\nmax_write_buffer_bytes = 8388608\nqos0_max_write_buffer_bytes = 65536\n",
    ));
    // rumqttc, its event loop polled by hand: while it is not polled, the socket is not read.
    let mut opts = v3::options("stalled", d.mqtt);
    opts.set_max_packet_size(1 << 20, 1 << 20);
    let (sub, mut events) = rumqttc::AsyncClient::new(opts, 10);
    sub.subscribe("firehose", QoS::AtMostOnce).await.unwrap();
    sub.subscribe("keep", QoS::AtLeastOnce).await.unwrap();
    let mut subacks = 0;
    while subacks < 2 {
        let event = tokio::time::timeout(DEADLINE, events.poll()).await;
        if let Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_)))) = event {
            subacks += 1;
        }
        assert!(matches!(event, Ok(Ok(_))), "subscriber: {event:?}");
    }

    let mut opts = v3::options("flood", d.mqtt);
    opts.set_max_packet_size(1 << 20, 1 << 20);
    let publ = v3::connect(opts).await;
    let payload = vec![7u8; 256 * 1024];
    let mut published = 0u64;
    let flood = async |n: usize| {
        for _ in 0..n {
            publ.client
                .publish("firehose", QoS::AtMostOnce, false, payload.clone())
                .await
                .unwrap();
        }
        n as u64
    };
    // Until the kernel's buffers are full and the backlog stays past its mark (while the
    // kernel still takes bytes, it may fall back under half the mark and QoS 0 resume)...
    let deadline = Instant::now() + DEADLINE;
    while metric(&d, QOS0_CONGESTED).await == 0 || congested_clients(&d).await != ["stalled"] {
        assert!(Instant::now() < deadline, "QoS 0 messages never dropped");
        published += flood(8).await;
    }
    // ...then four times the hard bound more, which would cut the subscriber off if queued.
    published += flood(128).await;
    publ.client
        .publish("keep", QoS::AtLeastOnce, false, "still here")
        .await
        .unwrap();

    // The subscriber reads again: what was written before the mark, then the QoS 1 message.
    let mut received = 0u64;
    loop {
        match tokio::time::timeout(DEADLINE, events.poll()).await {
            Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)))) => {
                if p.topic == "keep" {
                    break;
                }
                received += 1;
            }
            Ok(Ok(_)) => {}
            other => panic!("the stalled subscriber lost its connection: {other:?}"),
        }
    }
    let dropped = metric(&d, QOS0_CONGESTED).await;
    assert!(
        received > 0 && dropped > 0,
        "received {received}, dropped {dropped}"
    );
    assert_eq!(
        received + dropped,
        published,
        "every QoS 0 message was either delivered or counted as dropped"
    );
    assert_eq!(
        metric(&d, "meridian_slow_consumer_disconnects_total").await,
        0
    );

    // Its backlog written, QoS 0 messages reach it again.
    publ.client
        .publish("firehose", QoS::AtMostOnce, false, "after")
        .await
        .unwrap();
    loop {
        match tokio::time::timeout(DEADLINE, events.poll()).await {
            Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)))) => {
                assert_eq!(&p.payload[..], b"after");
                break;
            }
            Ok(Ok(_)) => {}
            other => panic!("the subscriber lost its connection: {other:?}"),
        }
    }
    assert_eq!(metric(&d, QOS0_CONGESTED).await, dropped);
    assert!(congested_clients(&d).await.is_empty());
    bystander_round_trip(&d, "after-qos0-flood").await;
}
