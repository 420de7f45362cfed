//! Access rules in the broker: subscriptions refused, filtered or left alone, and messages
//! checked at delivery — live, retained, system topics, shared groups, after a restart and
//! after new rules.

mod common;

use common::*;
use meridian_core::Config;
use meridian_core::acl::{Acl, Action, Permission, Rule};
use meridian_core::broker::AllowAll;
use meridian_core::codec::{Packet, ProtocolVersion, QoS, ReasonCode, SubscriptionOptions};

const V5: ProtocolVersion = ProtocolVersion::V5;
const V3: ProtocolVersion = ProtocolVersion::V311;

fn rule(permission: Permission, action: Action, topic: &str) -> Rule {
    Rule::new(permission, action, topic).unwrap()
}

/// Everything allowed but receiving `secret/#`.
fn no_secrets() -> Acl {
    Acl::new(
        Permission::Allow,
        vec![rule(Permission::Deny, Action::Subscribe, "secret/#")],
    )
}

fn topics(w: &mut World, conn: meridian_core::ConnId) -> Vec<String> {
    let mut t: Vec<String> = w
        .received_publishes(conn)
        .into_iter()
        .map(|p| p.topic.to_string())
        .collect();
    t.sort();
    t
}

#[test]
fn a_wildcard_overlapping_a_deny_rule_stands_and_never_receives_a_denied_topic() {
    let mut w = World::with_acl(Config::default(), no_secrets());
    let monitor = w.connect(V5, "monitor");
    let old = w.connect(V3, "old");
    assert_eq!(
        w.subscribe(monitor, "#", QoS::AtLeastOnce),
        [ReasonCode::GRANTED_QOS_1]
    );
    assert_eq!(
        w.subscribe(old, "+/status", QoS::AtMostOnce),
        [ReasonCode::GRANTED_QOS_0]
    );
    let p = w.connect(V5, "p");
    for (i, topic) in ["secret/status", "public/status", "secret/a/b", "news"]
        .into_iter()
        .enumerate()
    {
        w.publish(p, topic, b"x", QoS::AtLeastOnce, false, i as u16 + 1);
    }
    assert_eq!(topics(&mut w, monitor), ["news", "public/status"]);
    assert_eq!(topics(&mut w, old), ["public/status"]);
    assert_eq!(w.broker.stats().withheld_not_authorized, 3);
}

#[test]
fn a_filter_inside_a_deny_rule_is_refused() {
    let mut w = World::with_acl(Config::default(), no_secrets());
    let a = w.connect(V5, "a");
    let b = w.connect(V3, "b");
    assert_eq!(
        w.subscribe(a, "secret/+", QoS::AtMostOnce),
        [ReasonCode::NOT_AUTHORIZED]
    );
    assert_eq!(
        w.subscribe(b, "secret/#", QoS::AtMostOnce),
        [ReasonCode::UNSPECIFIED_ERROR]
    );
    assert_eq!(
        w.subscribe(a, "$share/g/secret/x", QoS::AtMostOnce),
        [ReasonCode::NOT_AUTHORIZED]
    );
    let stats = w.broker.stats();
    assert_eq!(stats.subscriptions_not_authorized, 3);
    assert_eq!(stats.subscriptions, 0);
}

#[test]
fn retained_messages_on_denied_topics_stay_behind() {
    let mut w = World::with_acl(Config::default(), no_secrets());
    let p = w.connect(V5, "p");
    w.publish(p, "secret/plan", b"s", QoS::AtLeastOnce, true, 1);
    w.publish(p, "public/plan", b"p", QoS::AtLeastOnce, true, 2);
    let s = w.connect(V5, "s");
    let got = w.subscribe_collect(
        s,
        "#",
        SubscriptionOptions {
            qos: QoS::AtLeastOnce,
            ..Default::default()
        },
    );
    let retained: Vec<&str> = got
        .iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(p.topic.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(retained, ["public/plan"]);
}

#[test]
fn an_unfiltered_subscription_beside_a_filtered_one_is_not_held_back() {
    // `#` is filtered, `public/#` is not: a message on public topics matches both and comes
    // once; one on a secret topic matches only the filtered one and stays away.
    let mut w = World::with_acl(Config::default(), no_secrets());
    let s = w.connect(V5, "s");
    w.subscribe(s, "#", QoS::AtMostOnce);
    w.subscribe(s, "public/#", QoS::AtLeastOnce);
    let p = w.connect(V5, "p");
    w.publish(p, "public/a", b"x", QoS::AtLeastOnce, false, 1);
    w.publish(p, "secret/a", b"x", QoS::AtLeastOnce, false, 2);
    let got = w.received_publishes(s);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].topic.as_str(), "public/a");
    assert_eq!(got[0].qos, QoS::AtLeastOnce);
}

#[test]
fn rules_with_placeholders_filter_per_user() {
    let acl = Acl::new(
        Permission::Deny,
        vec![rule(Permission::Allow, Action::All, "users/%u/#")],
    );
    let mut w = World::with_acl(Config::default(), acl);
    let alice = w
        .connect_with(V5, "a", |c| c.username = Some("alice".into()))
        .0;
    // Wider than her own tree: accepted, filtered to what she may read.
    assert_eq!(
        w.subscribe(alice, "users/+/inbox", QoS::AtMostOnce),
        [ReasonCode::GRANTED_QOS_0]
    );
    assert_eq!(
        w.subscribe(alice, "ops/#", QoS::AtMostOnce),
        [ReasonCode::NOT_AUTHORIZED]
    );
    let bob = w
        .connect_with(V5, "b", |c| c.username = Some("bob".into()))
        .0;
    w.publish(bob, "users/bob/inbox", b"x", QoS::AtMostOnce, false, 0);
    assert!(w.received_publishes(alice).is_empty());
    let alice2 = w
        .connect_with(V5, "a2", |c| c.username = Some("alice".into()))
        .0;
    w.publish(alice2, "users/alice/inbox", b"x", QoS::AtMostOnce, false, 0);
    assert_eq!(topics(&mut w, alice), ["users/alice/inbox"]);
}

#[test]
fn a_shared_group_gives_a_message_to_a_member_that_may_receive_it() {
    let acl = Acl::new(
        Permission::Allow,
        vec![rule(Permission::Deny, Action::Subscribe, "jobs/secret").for_user("intern")],
    );
    let mut w = World::with_acl(Config::default(), acl);
    let intern = w
        .connect_with(V5, "i", |c| c.username = Some("intern".into()))
        .0;
    let staff = w
        .connect_with(V5, "s", |c| c.username = Some("staff".into()))
        .0;
    w.subscribe(intern, "$share/workers/jobs/+", QoS::AtLeastOnce);
    w.subscribe(staff, "$share/workers/jobs/+", QoS::AtLeastOnce);
    let p = w.connect(V5, "p");
    for id in 1..=4 {
        w.publish(p, "jobs/secret", b"x", QoS::AtLeastOnce, false, id);
    }
    assert!(w.received_publishes(intern).is_empty());
    assert_eq!(w.received_publishes(staff).len(), 4);
    // Open jobs still go round the whole group.
    for id in 5..=8 {
        w.publish(p, "jobs/open", b"x", QoS::AtLeastOnce, false, id);
    }
    assert_eq!(w.received_publishes(intern).len(), 2);
    assert_eq!(w.received_publishes(staff).len(), 2);
}

#[test]
fn a_restored_session_is_filtered_as_before() {
    let mut w = World::with_acl(Config::default(), no_secrets());
    let (s, _) = w.connect_with(V3, "s", |c| c.clean_start = false);
    w.subscribe(s, "#", QoS::AtLeastOnce);
    w.restart();
    let (s, ack) = w.connect_with(V3, "s", |c| c.clean_start = false);
    assert!(ack.session_present);
    let p = w.connect(V5, "p");
    w.publish(p, "secret/x", b"x", QoS::AtLeastOnce, false, 1);
    w.publish(p, "open/x", b"x", QoS::AtLeastOnce, false, 2);
    assert_eq!(topics(&mut w, s), ["open/x"]);
}

#[test]
fn new_rules_filter_subscriptions_made_before_them() {
    let mut w = World::new();
    let s = w.connect(V5, "s");
    w.subscribe(s, "#", QoS::AtMostOnce);
    let p = w.connect(V5, "p");
    w.publish(p, "secret/x", b"x", QoS::AtMostOnce, false, 0);
    assert_eq!(topics(&mut w, s), ["secret/x"]);
    w.broker.set_hooks(
        meridian_core::Timestamp(w.now),
        Box::new(AllowAll),
        Box::new(no_secrets()),
    );
    w.publish(p, "secret/x", b"x", QoS::AtMostOnce, false, 0);
    w.publish(p, "open/x", b"x", QoS::AtMostOnce, false, 0);
    assert_eq!(topics(&mut w, s), ["open/x"]);
    // And back: with no rules, nothing is checked any more.
    w.broker.set_hooks(
        meridian_core::Timestamp(w.now),
        Box::new(AllowAll),
        Box::new(AllowAll),
    );
    w.publish(p, "secret/x", b"x", QoS::AtMostOnce, false, 0);
    assert_eq!(topics(&mut w, s), ["secret/x"]);
}

#[test]
fn another_user_can_neither_take_over_nor_resume_a_session() {
    let acl = Acl::new(
        Permission::Allow,
        vec![rule(Permission::Deny, Action::Subscribe, "secret/#").for_user("guest")],
    );
    let mut w = World::with_acl(Config::default(), acl);
    let persistent = |user: &'static str| {
        move |c: &mut meridian_core::codec::Connect| {
            c.clean_start = false;
            c.username = Some(user.into());
            c.properties.session_expiry_interval = Some(600);
        }
    };
    let (s, _) = w.connect_with(V5, "s", persistent("admin"));
    w.subscribe(s, "#", QoS::AtLeastOnce);
    // While admin is connected, guest cannot take the session over (nor fire its will).
    let (_, ack) = w.connect_with(V5, "s", persistent("guest"));
    assert_eq!(ack.reason, ReasonCode::NOT_AUTHORIZED);
    assert!(!w.is_closed(s), "admin's connection stays");
    let (_, ack) = w.connect_with(V3, "s", |c| c.username = Some("guest".into()));
    assert_eq!(
        ack.reason,
        ReasonCode::NOT_AUTHORIZED,
        "3.1.1: return code 5, which the codec reads as 0x87"
    );
    w.close(s);
    let p = w.connect(V5, "p");
    w.publish(
        p,
        "secret/x",
        b"queued for admin",
        QoS::AtLeastOnce,
        false,
        1,
    );
    w.publish(p, "open/x", b"queued for admin", QoS::AtLeastOnce, false, 2);
    // Nor resume it, nor start afresh in its place, while it lasts.
    for clean in [false, true] {
        let (_, ack) = w.connect_with(V5, "s", |c| {
            persistent("guest")(c);
            c.clean_start = clean;
        });
        assert_eq!(ack.reason, ReasonCode::NOT_AUTHORIZED);
    }
    // admin finds its session as it left it.
    let (s, ack) = w.connect_with(V5, "s", persistent("admin"));
    assert!(ack.session_present);
    assert_eq!(w.received_publishes(s).len(), 2);
    // An operator may end it: then the client id is free for anyone.
    assert!(w.broker.end_client_session(
        meridian_core::Timestamp(w.now),
        "s",
        ReasonCode::ADMINISTRATIVE_ACTION
    ));
    w.drain();
    assert!(w.is_closed(s));
    let (_, ack) = w.connect_with(V5, "s", persistent("guest"));
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    assert!(!ack.session_present);
}

/// Connect and configure a persistent session.
fn persistent(c: &mut meridian_core::codec::Connect) {
    c.clean_start = false;
    c.properties.session_expiry_interval = Some(600);
}

/// Session `s` subscribed to `#` and offline, with QoS 1 messages on `secret/x` and `open/x`
/// waiting in its queue (no rules yet).
fn queue_for_offline_session(w: &mut World) {
    let (s, _) = w.connect_with(V5, "s", persistent);
    w.subscribe(s, "#", QoS::AtLeastOnce);
    w.close(s);
    let p = w.connect(V5, "p");
    w.publish(p, "secret/x", b"x", QoS::AtLeastOnce, false, 1);
    w.publish(p, "open/x", b"x", QoS::AtLeastOnce, false, 2);
}

#[test]
fn messages_queued_under_old_rules_are_withheld_under_new_ones() {
    let mut w = World::new();
    queue_for_offline_session(&mut w);
    w.broker.set_hooks(
        meridian_core::Timestamp(w.now),
        Box::new(AllowAll),
        Box::new(no_secrets()),
    );
    let (s, ack) = w.connect_with(V5, "s", persistent);
    assert!(ack.session_present);
    assert_eq!(topics(&mut w, s), ["open/x"]);
    assert_eq!(w.broker.stats().withheld_not_authorized, 1);
}

#[test]
fn messages_queued_before_a_restart_meet_the_rules_after_it() {
    let mut w = World::new();
    queue_for_offline_session(&mut w);
    // The node comes back with rules it did not have.
    w.acl = Some(no_secrets());
    w.restart();
    let (s, ack) = w.connect_with(V5, "s", persistent);
    assert!(ack.session_present);
    assert_eq!(topics(&mut w, s), ["open/x"]);
}
