//! MQTT behaviour of the real daemon, with rumqttc (3.1.1 and 5.0) over loopback TCP.

mod common;

use std::time::Duration;

use common::raw::Raw;
use common::{Daemon, v3, v5};
use meridian_core::codec::{
    Packet as CPacket,
    ProtocolVersion::{V5, V311},
    ReasonCode,
};
use rumqttc::{LastWill, Packet, QoS, SubscribeReasonCode};

#[tokio::test]
async fn connect_v3_and_v5() {
    let d = Daemon::start();
    let c3 = v3::connect(v3::options("c-v3", d.mqtt)).await;
    let c5 = v5::connect(v5::options("c-v5", d.mqtt)).await;
    c3.disconnect().await;
    c5.abort();
}

#[tokio::test]
async fn qos_0_1_2_round_trips() {
    let d = Daemon::start();
    let mut sub = v3::connect(v3::options("sub", d.mqtt)).await;
    let codes = sub.subscribe("rt/#", QoS::ExactlyOnce).await;
    assert_eq!(codes, vec![SubscribeReasonCode::Success(QoS::ExactlyOnce)]);
    let mut publ = v3::connect(v3::options("pub", d.mqtt)).await;
    for (i, qos) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce]
        .into_iter()
        .enumerate()
    {
        publ.client
            .publish(format!("rt/{i}"), qos, false, vec![i as u8; 10])
            .await
            .unwrap();
        let p = sub.publish_msg().await;
        assert_eq!(p.topic, format!("rt/{i}"));
        assert_eq!(p.qos, qos);
        assert_eq!(&p.payload[..], &[i as u8; 10][..]);
    }
    // The publisher's acknowledgements arrive too.
    publ.expect(|p| matches!(p, Packet::PubAck(_)).then_some(()))
        .await;
    publ.expect(|p| matches!(p, Packet::PubComp(_)).then_some(()))
        .await;
}

#[tokio::test]
async fn v5_round_trip() {
    let d = Daemon::start();
    let mut sub = v5::connect(v5::options("sub5", d.mqtt)).await;
    sub.subscribe("five/+", rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
        .await;
    let publ = v5::connect(v5::options("pub5", d.mqtt)).await;
    publ.client
        .publish(
            "five/a",
            rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
            false,
            "hello",
        )
        .await
        .unwrap();
    let p = sub.publish_msg().await;
    assert_eq!(&p.topic[..], b"five/a");
    assert_eq!(&p.payload[..], b"hello");
}

#[tokio::test]
async fn retained_message_goes_to_later_subscribers() {
    let d = Daemon::start();
    let publ = v3::connect(v3::options("pub", d.mqtt)).await;
    publ.client
        .publish("ret/t", QoS::AtLeastOnce, true, "kept")
        .await
        .unwrap();
    let mut publ = publ;
    publ.expect(|p| matches!(p, Packet::PubAck(_)).then_some(()))
        .await;
    let mut sub = v3::connect(v3::options("late", d.mqtt)).await;
    sub.subscribe("ret/#", QoS::AtLeastOnce).await;
    let p = sub.publish_msg().await;
    assert!(p.retain);
    assert_eq!(&p.payload[..], b"kept");
}

#[tokio::test]
async fn will_is_published_when_the_connection_drops() {
    let d = Daemon::start();
    let mut sub = v3::connect(v3::options("watcher", d.mqtt)).await;
    sub.subscribe("wills/#", QoS::AtLeastOnce).await;
    let mut opts = v3::options("dying", d.mqtt);
    opts.set_last_will(LastWill::new(
        "wills/dying",
        "gone",
        QoS::AtLeastOnce,
        false,
    ));
    let dying = v3::connect(opts).await;
    dying.abort();
    let p = sub.publish_msg().await;
    assert_eq!(p.topic, "wills/dying");
    assert_eq!(&p.payload[..], b"gone");
}

#[tokio::test]
async fn takeover_disconnects_the_first_connection() {
    let d = Daemon::start();
    let mut first = Raw::connect(d.mqtt, V5, "same").await;
    let _second = Raw::connect(d.mqtt, V5, "same").await;
    match first.next().await {
        Some(CPacket::Disconnect(x)) => assert_eq!(x.reason, ReasonCode::SESSION_TAKEN_OVER),
        other => panic!("expected DISCONNECT 0x8E, got {other:?}"),
    }
    assert!(first.next().await.is_none(), "closed after DISCONNECT");
}

#[tokio::test]
async fn persistent_session_resumes_across_a_restart() {
    let mut d = Daemon::start();
    let mut opts = v3::options("durable", d.mqtt);
    opts.set_clean_session(false);
    let mut sub = v3::connect(opts.clone()).await;
    sub.subscribe("dur/#", QoS::AtLeastOnce).await;
    sub.disconnect().await;

    // Queued while the client is away, then a clean restart.
    let mut publ = v3::connect(v3::options("pub", d.mqtt)).await;
    publ.client
        .publish("dur/1", QoS::AtLeastOnce, false, "while away")
        .await
        .unwrap();
    publ.expect(|p| matches!(p, Packet::PubAck(_)).then_some(()))
        .await;
    publ.disconnect().await;
    assert!(d.terminate().success(), "exit 0 after SIGTERM");
    d.restart();

    let mut sub = v3::connect(opts).await;
    let p = sub.publish_msg().await;
    assert_eq!(p.topic, "dur/1");
    assert_eq!(&p.payload[..], b"while away");
    // The subscription itself survived too.
    let publ = v3::connect(v3::options("pub2", d.mqtt)).await;
    publ.client
        .publish("dur/2", QoS::AtLeastOnce, false, "after restart")
        .await
        .unwrap();
    let p = sub.publish_msg().await;
    assert_eq!(p.topic, "dur/2");
}

#[tokio::test]
async fn sigterm_sends_v5_clients_server_shutting_down_and_exits_0() {
    let mut d = Daemon::start();
    let mut c5 = Raw::connect(d.mqtt, V5, "bye5").await;
    let mut c3 = Raw::connect(d.mqtt, V311, "bye3").await;
    let status = tokio::task::spawn_blocking(move || {
        let s = d.terminate();
        (s, d)
    });
    match c5.next().await {
        Some(CPacket::Disconnect(x)) => assert_eq!(x.reason, ReasonCode::SERVER_SHUTTING_DOWN),
        other => panic!("expected DISCONNECT 0x8B, got {other:?}"),
    }
    // 3.1.1 has no server DISCONNECT: the connection just closes.
    assert!(c3.next().await.is_none());
    let (status, _d) = status.await.unwrap();
    assert!(status.success(), "exit status {status:?}");
}

/// QoS 1 publishes acknowledged by the broker survive `kill -9`.
#[tokio::test]
async fn crash_loses_no_acknowledged_qos1_message() {
    acknowledged_messages_survive_kill9(Daemon::start()).await;
}

/// With a commit window, the acknowledgements wait for the fsync the window's commits share:
/// what was acknowledged survives `kill -9` all the same, and the fsyncs are counted (no more
/// of them than commits). That they are shared is the engine's test.
#[tokio::test]
async fn crash_loses_no_acknowledged_qos1_message_with_a_commit_window() {
    let d = Daemon::start_with_config(Some("[storage]\ncommit_window_ms = 20\n"));
    let page = acknowledged_messages_survive_kill9(d).await;
    let metrics = common::Metrics::parse(&page);
    let value = |name: &str| -> u64 {
        metrics
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in\n{page}")) as u64
    };
    let (syncs, commits) = (
        value("meridian_storage_syncs_total"),
        value("meridian_storage_commits_total"),
    );
    assert!(syncs > 0, "nothing fsynced");
    assert!(syncs <= commits, "{syncs} fsyncs for {commits} commits");
}

/// Publishes 50 QoS 1 messages and a retained one for a persistent session, kills the
/// daemon once every one is acknowledged, restarts it and finds them all. Returns the
/// daemon's metrics page from before the kill.
async fn acknowledged_messages_survive_kill9(mut d: Daemon) -> String {
    const N: usize = 50;
    let mut opts = v3::options("crash-sub", d.mqtt);
    opts.set_clean_session(false);
    let mut sub = v3::connect(opts.clone()).await;
    sub.subscribe("crash/#", QoS::AtLeastOnce).await;
    sub.disconnect().await;

    let mut publ = v3::connect(v3::options("crash-pub", d.mqtt)).await;
    let mut acked = 0;
    for i in 0..N {
        publ.client
            .publish(format!("crash/{i}"), QoS::AtLeastOnce, false, i.to_string())
            .await
            .unwrap();
    }
    publ.client
        .publish("crash/retained", QoS::AtLeastOnce, true, "kept")
        .await
        .unwrap();
    while acked < N + 1 {
        publ.expect(|p| matches!(p, Packet::PubAck(_)).then_some(()))
            .await;
        acked += 1;
    }
    let (status, metrics) = common::http(d.admin, "GET", "/metrics").await;
    assert_eq!(status, 200);
    d.kill9();
    publ.abort();
    d.restart();

    let mut sub = v3::connect(opts).await;
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < N + 1 {
        let p = sub.publish_msg().await;
        seen.insert(p.topic.clone());
    }
    for i in 0..N {
        assert!(seen.contains(&format!("crash/{i}")), "message {i} lost");
    }
    let mut late = v3::connect(v3::options("late", d.mqtt)).await;
    late.subscribe("crash/retained", QoS::AtMostOnce).await;
    let p = late.publish_msg().await;
    assert_eq!(&p.payload[..], b"kept");
    metrics
}

#[tokio::test]
async fn many_messages_flow_in_order() {
    let d = Daemon::start();
    let mut sub = v3::connect(v3::options("bulk-sub", d.mqtt)).await;
    sub.subscribe("bulk", QoS::AtLeastOnce).await;
    let publ = v3::connect(v3::options("bulk-pub", d.mqtt)).await;
    let sender = tokio::spawn(async move {
        for i in 0..500u32 {
            publ.client
                .publish("bulk", QoS::AtLeastOnce, false, i.to_be_bytes().to_vec())
                .await
                .unwrap();
        }
        publ
    });
    for i in 0..500u32 {
        let p = sub.publish_msg().await;
        assert_eq!(&p.payload[..], &i.to_be_bytes()[..]);
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), sender).await;
}

/// Assigned client ids do not repeat across restarts (they would resume someone else's
/// persisted session).
#[tokio::test]
async fn assigned_client_ids_differ_across_restarts() {
    let mut d = Daemon::start();
    let assigned = |d: u16| async move {
        let mut c = common::raw::connect_packet(V5, "");
        c.properties.session_expiry_interval = Some(3600);
        let (_r, ack) = Raw::connect_with(d, c).await;
        assert!(!ack.reason.is_error());
        ack.properties
            .assigned_client_identifier
            .expect("an assigned client id")
    };
    let first = assigned(d.mqtt).await;
    assert!(d.terminate().success());
    d.restart();
    let second = assigned(d.mqtt).await;
    assert_ne!(first, second);
}

/// A subscriber that stops reading fills its socket; what the broker could not write waits in
/// the connection's queue. Once it reads again, every message arrives, in order, although the
/// socket took the queue in pieces that end anywhere inside a message.
#[tokio::test]
async fn a_subscriber_that_stops_reading_gets_everything_in_order_when_it_reads_again() {
    const COUNT: u32 = 8000;
    // QoS 0 messages are kept however long the backlog grows, up to the hard bound.
    let d = Daemon::start_with_config(Some(
        "[limits]\nmax_write_buffer_bytes = 67108864\nqos0_max_write_buffer_bytes = 67108864\n",
    ));
    // rumqttc stops reading its socket while its 1,000-packet channel is full, that is, until
    // the test starts taking packets below.
    let mut sub = v3::connect(v3::options("stalled-sub", d.mqtt)).await;
    sub.subscribe("fill", QoS::AtMostOnce).await;
    let publ = v3::connect(v3::options("fill-pub", d.mqtt)).await;
    let sender = tokio::spawn(async move {
        for i in 0..COUNT {
            let mut payload = vec![0u8; 4096];
            payload[..4].copy_from_slice(&i.to_be_bytes());
            publ.client
                .publish("fill", QoS::AtMostOnce, false, payload)
                .await
                .unwrap();
        }
        publ
    });
    // 32 MB in all: far more than the channel and the kernel's socket buffers hold.
    let publ = tokio::time::timeout(common::DEADLINE, sender)
        .await
        .expect("the publisher sends everything in time")
        .unwrap();
    for i in 0..COUNT {
        let p = sub.publish_msg().await;
        assert_eq!(
            &p.payload[..4],
            &i.to_be_bytes()[..],
            "message {i} out of order"
        );
    }
    publ.disconnect().await;
}

/// With a commit window, a commit waits for others to share its fsync only where its client
/// keeps sending without waiting for it: a publisher that waits for each PUBACK (one message
/// in flight) has its commits fsynced at once, but for a window now and then that shows it
/// waits.
#[tokio::test]
async fn with_a_commit_window_a_publisher_that_waits_for_each_acknowledgement_is_fsynced_at_once() {
    const N: u32 = 300;
    let d = Daemon::start_with_config(Some("[storage]\ncommit_window_ms = 2\n"));
    // A persistent session away: each message is queued for it, durably.
    let mut opts = v3::options("lone-sub", d.mqtt);
    opts.set_clean_session(false);
    let mut sub = v3::connect(opts).await;
    sub.subscribe("lone/#", QoS::AtLeastOnce).await;
    sub.disconnect().await;
    let mut publ = v3::connect(v3::options("one-by-one", d.mqtt)).await;
    for i in 0..N {
        publ.client
            .publish("lone/x", QoS::AtLeastOnce, false, i.to_string())
            .await
            .unwrap();
        publ.expect(|p| matches!(p, Packet::PubAck(_)).then_some(()))
            .await;
    }
    let (_, page) = common::http(d.admin, "GET", "/metrics").await;
    let metrics = common::Metrics::parse(&page);
    let value = |name: &str| metrics.get(name).unwrap_or_else(|| panic!("no {name}"));
    let waited = value("meridian_storage_commits_waited_total");
    let syncs = value("meridian_storage_syncs_total");
    // One window when its pace is first seen, then one a second at most.
    assert!(waited <= 5.0, "{waited} of {N} commits waited for company");
    assert!(
        syncs >= f64::from(N),
        "{syncs} fsyncs for {N} acknowledged messages"
    );
}
