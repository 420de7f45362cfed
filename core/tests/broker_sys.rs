//! System topics (`Config::sys_interval_ms`): the broker's figures under `$SYS/broker/`.

mod common;

use bytes::Bytes;
use common::mesh::{Mesh, id};
use common::{V3, V5, World};
use meridian_core::Config;
use meridian_core::codec::{
    LastWill, Packet, Publish, QoS, ReasonCode, SubscriptionOptions, WillProperties,
};

const INTERVAL_MS: u64 = 10_000;

fn config() -> Config {
    Config {
        sys_interval_ms: INTERVAL_MS,
        ..Config::default()
    }
}

/// (topic, payload) of each PUBLISH.
fn figures(packets: &[Packet]) -> Vec<(String, String)> {
    packets
        .iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(figure(p)),
            _ => None,
        })
        .collect()
}

fn figure(p: &Publish) -> (String, String) {
    (
        p.topic.to_string(),
        String::from_utf8(p.payload.to_vec()).expect("figures are text"),
    )
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(t, v)| ((*t).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn a_subscription_gets_the_current_figures_at_once_with_the_retain_flag() {
    let mut w = World::with_config(config());
    w.advance(25_000);
    let watcher = w.connect(V5, "watcher");
    let packets = w.subscribe_collect(watcher, "$SYS/broker/+", SubscriptionOptions::default());
    assert!(matches!(packets.first(), Some(Packet::SubAck(_))));
    let publishes: Vec<&Publish> = packets
        .iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(p),
            _ => None,
        })
        .collect();
    assert!(
        publishes
            .iter()
            .all(|p| p.retain && p.qos == QoS::AtMostOnce)
    );
    assert_eq!(
        figures(&packets),
        pairs(&[
            (
                "$SYS/broker/version",
                &format!("meridian version {}", env!("CARGO_PKG_VERSION"))
            ),
            ("$SYS/broker/uptime", "25 seconds"),
        ])
    );
}

#[test]
fn figures_that_changed_are_sent_every_interval() {
    let mut w = World::with_config(config());
    let watcher = w.connect(V5, "watcher");
    let packets = w.subscribe_collect(
        watcher,
        "$SYS/broker/clients/+",
        SubscriptionOptions::default(),
    );
    let clients = |connected, disconnected, total, maximum| {
        pairs(&[
            ("$SYS/broker/clients/connected", connected),
            ("$SYS/broker/clients/disconnected", disconnected),
            ("$SYS/broker/clients/total", total),
            ("$SYS/broker/clients/maximum", maximum),
        ])
    };
    assert_eq!(figures(&packets), clients("1", "0", "1", "1"));

    // The first interval sends every figure (it sent none before); nothing changed since, so
    // the next sends none.
    w.advance(INTERVAL_MS);
    assert_eq!(figures(&w.recv(watcher)), clients("1", "0", "1", "1"));
    w.advance(INTERVAL_MS);
    assert_eq!(figures(&w.recv(watcher)), vec![]);

    // A persistent session that goes away counts as disconnected; the maximum stays.
    let other = w.connect_with(V3, "other", |c| c.clean_start = false).0;
    w.advance(INTERVAL_MS);
    let packets = w.recv(watcher);
    assert!(
        packets
            .iter()
            .all(|p| matches!(p, Packet::Publish(p) if !p.retain)),
        "an update to a subscriber is not flagged retained (no Retain As Published)"
    );
    assert_eq!(
        figures(&packets),
        pairs(&[
            ("$SYS/broker/clients/connected", "2"),
            ("$SYS/broker/clients/total", "2"),
            ("$SYS/broker/clients/maximum", "2"),
        ])
    );
    w.close(other);
    w.advance(INTERVAL_MS - 1);
    assert_eq!(figures(&w.recv(watcher)), vec![], "not before the interval");
    w.advance(1);
    assert_eq!(
        figures(&w.recv(watcher)),
        pairs(&[
            ("$SYS/broker/clients/connected", "1"),
            ("$SYS/broker/clients/disconnected", "1"),
        ])
    );
}

#[test]
fn message_counters_follow_the_traffic() {
    let mut w = World::with_config(config());
    let watcher = w.connect(V5, "watcher");
    w.subscribe_collect(
        watcher,
        "$SYS/broker/publish/messages/#",
        SubscriptionOptions::default(),
    );
    w.advance(INTERVAL_MS);
    w.recv(watcher);
    let publisher = w.connect(V5, "publisher");
    let sub = w.connect(V5, "sub");
    w.subscribe(sub, "t", QoS::AtMostOnce);
    for _ in 0..3 {
        w.publish(publisher, "t", b"x", QoS::AtMostOnce, false, 0);
    }
    assert_eq!(w.received_publishes(sub).len(), 3);
    w.advance(INTERVAL_MS);
    assert_eq!(
        figures(&w.recv(watcher)),
        pairs(&[
            ("$SYS/broker/publish/messages/received", "3"),
            // Three to `sub`, and six to the watcher: three figures when it subscribed, and
            // the same three at the first interval.
            ("$SYS/broker/publish/messages/sent", "9"),
        ])
    );
}

#[test]
fn wildcards_at_the_start_of_a_filter_do_not_match_system_topics() {
    let mut w = World::with_config(config());
    let all = w.connect(V5, "all");
    w.subscribe(all, "#", QoS::AtMostOnce);
    w.subscribe(all, "+/broker/#", QoS::AtMostOnce);
    w.advance(3 * INTERVAL_MS);
    assert_eq!(w.received_publishes(all), vec![]);
}

#[test]
fn clients_may_not_publish_under_sys_while_the_broker_does() {
    let mut w = World::with_config(config());
    let watcher = w.connect(V5, "watcher");
    w.subscribe(watcher, "$SYS/#", QoS::AtLeastOnce);
    w.recv(watcher);
    let client = w.connect(V5, "client");
    w.publish(
        client,
        "$SYS/broker/uptime",
        b"forged",
        QoS::AtLeastOnce,
        true,
        1,
    );
    match w.recv(client).as_slice() {
        [Packet::PubAck(ack)] => assert_eq!(ack.reason, ReasonCode::NOT_AUTHORIZED),
        other => panic!("expected PUBACK 0x87, got {other:?}"),
    }
    w.publish(client, "$SYS", b"forged", QoS::AtMostOnce, false, 0);
    assert_eq!(w.received_publishes(watcher), vec![]);
    assert_eq!(w.broker.stats().retained_messages, 0);

    // Nor through a will.
    let (_, ack) = w.connect_with(V5, "willing", |c| {
        c.will = Some(LastWill {
            topic: "$SYS/broker/uptime".to_owned(),
            payload: Bytes::from_static(b"forged"),
            qos: QoS::AtMostOnce,
            retain: true,
            properties: WillProperties::default(),
        });
    });
    assert_eq!(ack.reason, ReasonCode::NOT_AUTHORIZED);

    // Without system topics, `$SYS` is a topic like any other.
    let mut w = World::new();
    let watcher = w.connect(V5, "watcher");
    w.subscribe(watcher, "$SYS/#", QoS::AtMostOnce);
    let client = w.connect(V5, "client");
    w.publish(client, "$SYS/x", b"mine", QoS::AtMostOnce, false, 0);
    assert_eq!(w.received_publishes(watcher).len(), 1);
}

#[test]
fn each_node_publishes_only_its_own_figures() {
    let mut mesh = Mesh::new(&["a", "b"], config(), |_| {});
    let watcher = mesh.node("b").connect(V5, "watcher");
    let packets = mesh.node("b").subscribe_collect(
        watcher,
        "$SYS/broker/clients/connected",
        SubscriptionOptions::default(),
    );
    assert_eq!(
        figures(&packets),
        pairs(&[("$SYS/broker/clients/connected", "1")])
    );
    // One route batch: a knows b wants the topic.
    mesh.advance(50);
    assert_eq!(
        mesh.node("a")
            .broker
            .nodes_for("$SYS/broker/clients/connected"),
        vec![id("b")]
    );
    mesh.node("a").connect(V5, "a1");
    mesh.node("a").connect(V5, "a2");
    mesh.advance(INTERVAL_MS);
    // b's own figure, at its first interval; a sends b nothing.
    assert_eq!(
        figures(&mesh.node("b").recv(watcher)),
        pairs(&[("$SYS/broker/clients/connected", "1")])
    );
    let other = mesh.node("b").connect(V5, "b2");
    mesh.advance(INTERVAL_MS);
    assert_eq!(
        figures(&mesh.node("b").recv(watcher)),
        pairs(&[("$SYS/broker/clients/connected", "2")])
    );
    mesh.node("b").close(other);
}

#[test]
fn subscribers_that_cannot_take_a_figure_miss_it_uncounted() {
    let mut w = World::with_config(config());
    let away = w
        .connect_with(V5, "away", |c| {
            c.clean_start = false;
            c.properties.session_expiry_interval = Some(3600);
        })
        .0;
    w.subscribe(away, "$SYS/broker/#", QoS::AtMostOnce);
    w.close(away);
    let watcher = w.connect(V5, "watcher");
    w.subscribe(
        watcher,
        "$SYS/broker/publish/messages/dropped",
        QoS::AtMostOnce,
    );
    w.recv(watcher);
    // The first interval sends the figure again (it sent none before); after it, nothing.
    w.advance(INTERVAL_MS);
    w.recv(watcher);
    w.advance(5 * INTERVAL_MS);
    assert_eq!(w.broker.stats().dropped_qos0_offline, 0);
    assert_eq!(figures(&w.recv(watcher)), vec![], "no drop to report");
}

#[test]
fn nothing_else_is_passed_on_under_sys() {
    // A retained message stored under $SYS while system topics were off...
    let mut w = World::new();
    let client = w.connect(V5, "client");
    w.publish(
        client,
        "$SYS/broker/version",
        b"stale",
        QoS::AtLeastOnce,
        true,
        1,
    );
    w.recv(client);
    assert_eq!(w.broker.stats().retained_messages, 1);
    // ...is not sent once they are on; the broker's own figure is.
    w.config = config();
    w.restart();
    let watcher = w.connect(V5, "watcher");
    let packets = w.subscribe_collect(
        watcher,
        "$SYS/broker/version",
        SubscriptionOptions::default(),
    );
    assert_eq!(
        figures(&packets),
        pairs(&[(
            "$SYS/broker/version",
            &format!("meridian version {}", env!("CARGO_PKG_VERSION"))
        )])
    );
    // The shell may not publish there either.
    let message = meridian_core::broker::Message {
        topic: "$SYS/broker/uptime".into(),
        payload: Bytes::from_static(b"forged"),
        qos: QoS::AtMostOnce,
        retain: true,
        properties: Default::default(),
        expires_at: None,
        origin: None,
    };
    assert_eq!(
        w.broker.publish(meridian_core::Timestamp(w.now), message),
        Err(meridian_core::topic::TopicError::Reserved)
    );
}

#[test]
fn subscriptions_within_an_interval_share_the_figures_worked_out_for_the_first() {
    let mut w = World::with_config(config());
    let first = w.connect(V5, "first");
    let uptime = |packets: &[Packet]| figures(packets)[0].1.clone();
    let got = w.subscribe_collect(first, "$SYS/broker/uptime", SubscriptionOptions::default());
    assert_eq!(uptime(&got), "0 seconds");
    w.advance(INTERVAL_MS / 2);
    let second = w.connect(V5, "second");
    let got = w.subscribe_collect(second, "$SYS/broker/uptime", SubscriptionOptions::default());
    assert_eq!(
        uptime(&got),
        "0 seconds",
        "worked out at most once an interval"
    );
    w.advance(INTERVAL_MS / 2);
    assert_eq!(uptime(&w.recv(first)), "10 seconds");
    assert_eq!(uptime(&w.recv(second)), "10 seconds");
}

#[test]
fn a_subscription_just_before_an_interval_keeps_the_others_informed() {
    let mut w = World::with_config(config());
    let first = w.connect(V5, "first");
    w.subscribe(first, "$SYS/broker/clients/connected", QoS::AtMostOnce);
    w.advance(INTERVAL_MS);
    w.recv(first);
    // A second client connects. An interval later, before that interval's turn runs, it
    // subscribes to other figures: they are worked out anew for it.
    let second = w.connect(V5, "second");
    w.now += INTERVAL_MS;
    w.subscribe(second, "$SYS/broker/uptime", QoS::AtMostOnce);
    w.advance(0);
    assert_eq!(
        figures(&w.recv(first)),
        pairs(&[("$SYS/broker/clients/connected", "2")]),
        "the first subscriber still hears of the change"
    );
}
