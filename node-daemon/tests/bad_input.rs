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
    // A subscriber that never reads its socket.
    let mut slow = Raw::connect(d.mqtt, V311, "slow").await;
    slow.send(&meridian_core::codec::Packet::Subscribe(
        meridian_core::codec::Subscribe {
            packet_id: 1,
            filters: vec![meridian_core::codec::SubscribeFilter {
                filter: "firehose".to_owned(),
                options: Default::default(),
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
        let (_, metrics) = http(d.admin, "GET", "/metrics").await;
        let cut: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("meridian_slow_consumer_disconnects_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if cut > 0 {
            assert_eq!(cut, 1, "one slow connection is cut off, and counted, once");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slow consumer never cut off:\n{metrics}"
        );
        for _ in 0..8 {
            publ.client
                .publish("firehose", QoS::AtMostOnce, false, payload.clone())
                .await
                .unwrap();
        }
    }
    bystander_round_trip(&d, "after-slow").await;
}
