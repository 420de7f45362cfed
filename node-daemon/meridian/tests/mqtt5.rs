//! MQTT 5.0 features through the real daemon with rumqttc's v5 client: shared subscriptions,
//! topic aliases, message expiry, will delay, session expiry.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{DEADLINE, Daemon, v5};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{LastWill, LastWillProperties, PublishProperties};

#[tokio::test]
async fn shared_subscription_delivers_each_message_to_one_member() {
    let d = Daemon::start();
    let mut a = v5::connect(v5::options("member-a", d.mqtt)).await;
    let mut b = v5::connect(v5::options("member-b", d.mqtt)).await;
    a.subscribe("$share/workers/jobs/#", QoS::AtLeastOnce).await;
    b.subscribe("$share/workers/jobs/#", QoS::AtLeastOnce).await;
    let publ = v5::connect(v5::options("boss", d.mqtt)).await;
    const N: usize = 20;
    for i in 0..N {
        publ.client
            .publish(format!("jobs/{i}"), QoS::AtLeastOnce, false, i.to_string())
            .await
            .unwrap();
    }
    let mut seen = BTreeSet::new();
    let mut per_member = [0usize; 2];
    tokio::time::timeout(DEADLINE, async {
        while seen.len() < N {
            tokio::select! {
                Some(p) = a.rx.recv() => if let rumqttc::v5::mqttbytes::v5::Packet::Publish(p) = p {
                    assert!(seen.insert(p.topic.clone()), "duplicate delivery");
                    per_member[0] += 1;
                },
                Some(p) = b.rx.recv() => if let rumqttc::v5::mqttbytes::v5::Packet::Publish(p) = p {
                    assert!(seen.insert(p.topic.clone()), "duplicate delivery");
                    per_member[1] += 1;
                },
            }
        }
    })
    .await
    .expect("every job delivered once");
    assert_eq!(per_member[0] + per_member[1], N);
    assert!(
        per_member.iter().all(|&n| n > 0),
        "both members served: {per_member:?}"
    );
}

#[tokio::test]
async fn topic_alias_from_the_client_is_resolved() {
    let d = Daemon::start();
    let mut sub = v5::connect(v5::options("alias-sub", d.mqtt)).await;
    sub.subscribe("alias/#", QoS::AtLeastOnce).await;
    let publ = v5::connect(v5::options("alias-pub", d.mqtt)).await;
    let props = PublishProperties {
        topic_alias: Some(3),
        ..Default::default()
    };
    publ.client
        .publish_with_properties(
            "alias/long/topic",
            QoS::AtLeastOnce,
            false,
            "first",
            props.clone(),
        )
        .await
        .unwrap();
    publ.client
        .publish_with_properties("", QoS::AtLeastOnce, false, "second", props)
        .await
        .unwrap();
    for payload in ["first", "second"] {
        let p = sub.publish_msg().await;
        assert_eq!(&p.topic[..], b"alias/long/topic");
        assert_eq!(&p.payload[..], payload.as_bytes());
    }
}

#[tokio::test]
async fn expired_retained_message_is_removed() {
    let d = Daemon::start();
    let publ = v5::connect(v5::options("exp-pub", d.mqtt)).await;
    let props = PublishProperties {
        message_expiry_interval: Some(1),
        ..Default::default()
    };
    publ.client
        .publish_with_properties("exp/short", QoS::AtLeastOnce, true, "soon gone", props)
        .await
        .unwrap();
    publ.client
        .publish("exp/long", QoS::AtLeastOnce, true, "stays")
        .await
        .unwrap();
    // Wait (bounded) until the broker drops the expired one: the retained gauge goes 2 -> 1.
    let deadline = Instant::now() + DEADLINE;
    let mut saw_two = false;
    loop {
        let metrics = common::Metrics::of(d.admin).await;
        let retained = metrics.get("meridian_retained_messages");
        if retained == Some(2.0) {
            saw_two = true;
        }
        if saw_two && retained == Some(1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "retained message never expired: {metrics:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut late = v5::connect(v5::options("exp-late", d.mqtt)).await;
    late.subscribe("exp/#", QoS::AtLeastOnce).await;
    let p = late.publish_msg().await;
    assert_eq!(&p.topic[..], b"exp/long");
}

#[tokio::test]
async fn will_delay_holds_the_will_back() {
    let d = Daemon::start();
    let mut watcher = v5::connect(v5::options("will-watch", d.mqtt)).await;
    watcher.subscribe("wd/#", QoS::AtLeastOnce).await;
    let mut opts = v5::options("will-delayed", d.mqtt);
    opts.set_clean_start(true);
    opts.set_session_expiry_interval(Some(60));
    opts.set_last_will(LastWill::new(
        "wd/gone",
        "late will",
        QoS::AtLeastOnce,
        false,
        Some(LastWillProperties {
            delay_interval: Some(1),
            payload_format_indicator: None,
            message_expiry_interval: None,
            content_type: None,
            response_topic: None,
            correlation_data: None,
            user_properties: Vec::new(),
        }),
    ));
    let dying = v5::connect(opts).await;
    let dropped_at = Instant::now();
    dying.abort();
    let p = watcher.publish_msg().await;
    assert_eq!(&p.topic[..], b"wd/gone");
    assert!(
        dropped_at.elapsed() >= Duration::from_millis(900),
        "will came after {:?}, before its 1 s delay",
        dropped_at.elapsed()
    );
}

/// Flow control: the broker keeps at most the client's Receive Maximum of QoS 1 messages
/// unacknowledged, and sends the next one when one is acknowledged.
#[tokio::test]
async fn receive_maximum_limits_unacknowledged_deliveries() {
    use common::raw::{Raw, connect_packet};
    use meridian_core::codec::{
        Ack, Packet, ProtocolVersion::V5, QoS as CQoS, Subscribe, SubscribeFilter,
        SubscriptionOptions,
    };
    let d = Daemon::start();
    let mut c = connect_packet(V5, "slow-acker");
    c.properties.receive_maximum = Some(2);
    let (mut r, ack) = Raw::connect_with(d.mqtt, c).await;
    assert!(!ack.reason.is_error());
    r.send(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![SubscribeFilter {
            filter: "fc".to_owned(),
            options: SubscriptionOptions {
                qos: CQoS::AtLeastOnce,
                ..Default::default()
            },
        }],
        properties: Default::default(),
    }))
    .await;
    assert!(matches!(r.next().await, Some(Packet::SubAck(_))));
    let publ = v5::connect(v5::options("fc-pub", d.mqtt)).await;
    for i in 0..5 {
        publ.client
            .publish("fc", QoS::AtLeastOnce, false, format!("{i}"))
            .await
            .unwrap();
    }
    let mut ids = Vec::new();
    for _ in 0..2 {
        match r.next().await {
            Some(Packet::Publish(p)) => ids.push(p.packet_id.unwrap()),
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }
    // A third must not come while two are unacknowledged.
    let third = tokio::time::timeout(Duration::from_millis(500), r.next()).await;
    assert!(third.is_err(), "window exceeded: {third:?}");
    r.send(&Packet::PubAck(Ack::new(ids[0]))).await;
    match r.next().await {
        Some(Packet::Publish(p)) => assert_eq!(&p.payload[..], b"2"),
        other => panic!("expected the third PUBLISH, got {other:?}"),
    }
}

/// A publisher's QoS 2 handshake never waits for a subscriber: a subscriber with Receive
/// Maximum 1 holds its first PUBREC while a publisher completes two QoS 2 handshakes (each
/// PUBCOMP before the next PUBLISH); the second message reaches the subscriber once it lets
/// go of the first, with PUBREC and PUBCOMP, or with an error PUBREC (which ends that flow: no
/// PUBREL). Three such pairs run at once, 20 rounds each: a fault in one run of six would
/// show with near certainty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos2_publishers_never_wait_for_a_subscriber_holding_its_pubrec() {
    let d = Daemon::start();
    let port = d.mqtt;
    let flows: Vec<_> = (0..3)
        .map(|flow| tokio::spawn(qos2_rounds(port, flow, 20)))
        .collect();
    for f in flows {
        f.await.unwrap();
    }
}

async fn qos2_rounds(port: u16, flow: u32, rounds: u32) {
    use common::raw::{Raw, connect_packet};
    use meridian_core::codec::{
        Ack, Packet, ProtocolVersion::V5, Publish, QoS as CQoS, ReasonCode, Subscribe,
        SubscribeFilter, SubscriptionOptions,
    };
    for round in 0..rounds {
        let topic = format!("q2/{flow}/{round}");
        let mut c = connect_packet(V5, &format!("q2-sub-{flow}-{round}"));
        c.properties.receive_maximum = Some(1);
        let (mut sub, ack) = Raw::connect_with(port, c).await;
        assert!(!ack.reason.is_error());
        sub.send(&Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![SubscribeFilter {
                filter: topic.clone(),
                options: SubscriptionOptions {
                    qos: CQoS::ExactlyOnce,
                    ..Default::default()
                },
            }],
            properties: Default::default(),
        }))
        .await;
        assert!(matches!(sub.next().await, Some(Packet::SubAck(_))));
        let mut publ = Raw::connect(port, V5, &format!("q2-pub-{flow}-{round}")).await;
        let mut held = None;
        for n in 1..=2u16 {
            publ.send(&Packet::Publish(Publish {
                dup: false,
                qos: CQoS::ExactlyOnce,
                retain: false,
                topic: topic.clone(),
                packet_id: Some(n),
                payload: format!("{n}").into(),
                properties: Default::default(),
            }))
            .await;
            let what = format!("flow {flow} round {round} message {n}");
            match publ.next().await {
                Some(Packet::PubRec(a)) => assert!(!a.reason.is_error(), "{what}: {a:?}"),
                other => panic!("{what}: expected PUBREC, got {other:?}"),
            }
            publ.send(&Packet::PubRel(Ack::new(n))).await;
            match publ.next().await {
                Some(Packet::PubComp(a)) => assert_eq!(a.packet_id, n, "{what}"),
                other => panic!("{what}: expected PUBCOMP, got {other:?}"),
            }
            if n == 1 {
                match sub.next().await {
                    Some(Packet::Publish(p)) => held = p.packet_id,
                    other => panic!("{what}: expected the first delivery, got {other:?}"),
                }
            }
        }
        let held = held.unwrap();
        if round % 2 == 0 {
            sub.send(&Packet::PubRec(Ack::new(held))).await;
            match sub.next().await {
                Some(Packet::PubRel(a)) => assert_eq!(a.packet_id, held),
                other => panic!("flow {flow} round {round}: expected PUBREL, got {other:?}"),
            }
            sub.send(&Packet::PubComp(Ack::new(held))).await;
        } else {
            let mut refused = Ack::new(held);
            refused.reason = ReasonCode::UNSPECIFIED_ERROR;
            sub.send(&Packet::PubRec(refused)).await;
        }
        match sub.next().await {
            Some(Packet::Publish(p)) => assert_eq!(&p.payload[..], b"2"),
            other => panic!("flow {flow} round {round}: expected the second, got {other:?}"),
        }
    }
}
