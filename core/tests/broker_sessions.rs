//! Connection and session behaviour: CONNECT/CONNACK, client ids, keep alive, takeover,
//! session expiry and resumption, wills, DISCONNECT both ways, auth hooks.

mod common;

use bytes::Bytes;
use common::*;
use meridian_core::acl::{Acl, Action, Permission, Rule};
use meridian_core::broker::{AllowAll, AuthOutcome, DisconnectCause};
use meridian_core::codec::{
    Auth, AuthProperties, Disconnect, DisconnectProperties, LastWill, Packet, QoS, ReasonCode,
    WillProperties,
};
use meridian_core::{Config, Event};

#[test]
fn connect_v311_and_v5_get_connack_success() {
    let mut w = World::new();
    let (_, ack3) = w.connect_with(V3, "a", |_| {});
    assert_eq!(ack3.reason, ReasonCode::SUCCESS);
    assert!(!ack3.session_present);
    let (_, ack5) = w.connect_with(V5, "b", |_| {});
    assert_eq!(ack5.reason, ReasonCode::SUCCESS);
}

#[test]
fn connack_advertises_every_server_limit() {
    let config = Config {
        maximum_qos: QoS::AtLeastOnce,
        retain_available: false,
        wildcard_subscription_available: false,
        subscription_identifiers_available: false,
        shared_subscription_available: false,
        max_keep_alive_secs: 30,
        max_session_expiry_secs: 100,
        ..Config::default()
    };
    let mut w = World::with_config(config.clone());
    let (_, ack) = w.connect_with(V5, "a", |c| {
        c.keep_alive = 600;
        c.properties.session_expiry_interval = Some(1000);
    });
    let p = ack.properties;
    assert_eq!(p.receive_maximum, Some(config.receive_maximum));
    assert_eq!(p.maximum_packet_size, Some(config.max_packet_size));
    assert_eq!(p.topic_alias_maximum, Some(config.topic_alias_maximum));
    assert_eq!(p.maximum_qos, Some(QoS::AtLeastOnce));
    assert_eq!(p.retain_available, Some(false));
    assert_eq!(p.wildcard_subscription_available, Some(false));
    assert_eq!(p.subscription_identifiers_available, Some(false));
    assert_eq!(p.shared_subscription_available, Some(false));
    assert_eq!(p.server_keep_alive, Some(30));
    assert_eq!(p.session_expiry_interval, Some(100));
}

#[test]
fn empty_client_id_is_assigned_on_v5() {
    let mut w = World::new();
    let (_, ack) = w.connect_with(V5, "", |_| {});
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    let id = ack
        .properties
        .assigned_client_identifier
        .expect("assigned id");
    assert!(id.starts_with("meridian-"));
}

#[test]
fn empty_client_id_with_clean_session_is_accepted_on_v311() {
    let mut w = World::new();
    let (conn, ack) = w.connect_with(V3, "", |_| {});
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    assert!(!w.is_closed(conn));
}

#[test]
fn empty_client_id_without_clean_session_is_refused_on_v311() {
    let mut w = World::new();
    let (conn, ack) = w.connect_with(V3, "", |c| c.clean_start = false);
    assert_eq!(ack.reason, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
    assert!(w.is_closed(conn));
}

#[test]
fn client_id_over_the_limit_is_refused() {
    let mut w = World::with_config(Config {
        max_client_id_len: 8,
        ..Config::default()
    });
    let (conn, ack) = w.connect_with(V5, "much-too-long-id", |_| {});
    assert_eq!(ack.reason, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID);
    assert!(w.is_closed(conn));
}

#[test]
fn unsupported_protocol_level_gets_connack_return_code_1() {
    let mut w = World::new();
    let conn = w.accept();
    // MQTT 3.1 ("MQIsdp", level 3) is not supported.
    let mut bytes = vec![0x10, 0];
    let body = [
        0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 0x02, 0, 60, 0, 1, b'x',
    ];
    bytes[1] = body.len() as u8;
    bytes.extend_from_slice(&body);
    w.send_bytes(conn, &bytes);
    w.versions.insert(conn, V3);
    let packets = w.recv(conn);
    assert!(
        matches!(&packets[..], [Packet::ConnAck(a)] if a.reason == ReasonCode::UNSUPPORTED_PROTOCOL_VERSION)
    );
    assert!(w.is_closed(conn));
}

#[test]
fn first_packet_other_than_connect_closes_the_connection() {
    let mut w = World::new();
    let conn = w.accept();
    w.send_bytes(conn, &[0xC0, 0]); // PINGREQ
    assert!(w.is_closed(conn));
}

#[test]
fn no_connect_within_connect_timeout_closes_the_connection() {
    let mut w = World::with_config(Config {
        connect_timeout_ms: 5_000,
        ..Config::default()
    });
    let conn = w.accept();
    w.advance(4_999);
    assert!(!w.is_closed(conn));
    w.advance(1);
    assert!(w.is_closed(conn));
}

#[test]
fn second_connect_is_a_protocol_error() {
    let mut w = World::new();
    let conn = w.connect(V5, "a");
    w.send(conn, Packet::Connect(connect_packet(V5, "a")));
    let packets = w.recv(conn);
    assert!(
        matches!(&packets[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::PROTOCOL_ERROR)
    );
    assert!(w.is_closed(conn));
}

#[test]
fn keep_alive_timeout_at_one_and_a_half_times_the_interval() {
    let mut w = World::new();
    let (conn, _) = w.connect_with(V5, "a", |c| c.keep_alive = 10);
    w.advance(14_000);
    w.send(conn, Packet::PingReq);
    assert_eq!(w.recv(conn), vec![Packet::PingResp]);
    // The deadline restarts from the last packet.
    w.advance(14_999);
    assert!(!w.is_closed(conn));
    w.advance(2);
    let packets = w.recv(conn);
    assert!(
        matches!(&packets[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::KEEP_ALIVE_TIMEOUT)
    );
    assert!(w.is_closed(conn));
}

#[test]
fn server_keep_alive_lowers_the_client_keep_alive() {
    let mut w = World::with_config(Config {
        max_keep_alive_secs: 20,
        ..Config::default()
    });
    let (conn, ack) = w.connect_with(V5, "a", |c| c.keep_alive = 0);
    assert_eq!(ack.properties.server_keep_alive, Some(20));
    w.advance(30_001);
    assert!(w.is_closed(conn));
}

#[test]
fn takeover_closes_the_old_connection_with_0x8e() {
    let mut w = World::new();
    let old = w.connect(V5, "same");
    let new = w.connect(V5, "same");
    let packets = w.recv(old);
    assert!(
        matches!(&packets[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::SESSION_TAKEN_OVER)
    );
    assert!(w.is_closed(old));
    assert!(!w.is_closed(new));
}

#[test]
fn takeover_resumes_the_session_without_clean_start() {
    let mut w = World::new();
    let old = w
        .connect_with(V5, "s", |c| c.properties.session_expiry_interval = Some(60))
        .0;
    w.subscribe(old, "t/#", QoS::AtLeastOnce);
    let (new, ack) = w.connect_with(V5, "s", |c| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(60);
    });
    assert!(ack.session_present);
    let publisher = w.connect(V5, "p");
    w.publish(publisher, "t/1", b"x", QoS::AtLeastOnce, false, 1);
    let got = w.received_publishes(new);
    assert_eq!(got.len(), 1);
}

#[test]
fn clean_start_discards_the_previous_session() {
    let mut w = World::new();
    let a = w
        .connect_with(V5, "s", |c| c.properties.session_expiry_interval = Some(60))
        .0;
    w.subscribe(a, "t", QoS::AtMostOnce);
    w.close(a);
    let (b, ack) = w.connect_with(V5, "s", |c| c.clean_start = true);
    assert!(!ack.session_present);
    let p = w.connect(V5, "p");
    w.publish(p, "t", b"x", QoS::AtMostOnce, false, 0);
    assert!(w.received_publishes(b).is_empty());
}

#[test]
fn persistent_session_queues_qos1_while_offline_and_delivers_on_resume() {
    let mut w = World::new();
    let a = w
        .connect_with(V5, "sub", |c| {
            c.properties.session_expiry_interval = Some(300)
        })
        .0;
    w.subscribe(a, "q/#", QoS::ExactlyOnce);
    w.close(a);
    let p = w.connect(V5, "pub");
    for i in 0..5u16 {
        w.publish(p, "q/x", &[i as u8], QoS::AtLeastOnce, false, i + 1);
    }
    w.publish(p, "q/x", b"zero", QoS::AtMostOnce, false, 0);
    let (a2, ack) = w.connect_with(V5, "sub", |c| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(300);
    });
    assert!(ack.session_present);
    let got = w.received_publishes(a2);
    let payloads: Vec<u8> = got.iter().map(|p| p.payload[0]).collect();
    assert_eq!(
        payloads,
        vec![0, 1, 2, 3, 4],
        "QoS 1 queued in order; QoS 0 not queued offline"
    );
    assert!(got.iter().all(|p| p.qos == QoS::AtLeastOnce));
}

#[test]
fn session_expires_after_its_interval() {
    let mut w = World::new();
    let a = w
        .connect_with(V5, "s", |c| c.properties.session_expiry_interval = Some(10))
        .0;
    w.subscribe(a, "t", QoS::AtLeastOnce);
    w.close(a);
    w.advance(9_000);
    let (b, ack) = w.connect_with(V5, "s", |c| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(10);
    });
    assert!(ack.session_present, "still there before expiry");
    w.close(b);
    w.advance(10_001);
    assert!(
        w.events
            .iter()
            .any(|e| matches!(e, Event::SessionEnded { client_id } if client_id == "s"))
    );
    let (_, ack) = w.connect_with(V5, "s", |c| c.clean_start = false);
    assert!(!ack.session_present);
}

#[test]
fn v311_clean_session_zero_is_persistent() {
    let mut w = World::new();
    let a = w.connect_with(V3, "s", |c| c.clean_start = false).0;
    w.subscribe(a, "t", QoS::AtLeastOnce);
    w.close(a);
    let p = w.connect(V3, "p");
    w.publish(p, "t", b"1", QoS::AtLeastOnce, false, 1);
    let (b, ack) = w.connect_with(V3, "s", |c| c.clean_start = false);
    assert!(ack.session_present);
    assert_eq!(w.received_publishes(b).len(), 1);
}

#[test]
fn disconnect_cannot_raise_expiry_from_zero() {
    let mut w = World::new();
    let conn = w.connect(V5, "a");
    w.send(
        conn,
        Packet::Disconnect(Disconnect {
            reason: ReasonCode::NORMAL_DISCONNECTION,
            properties: DisconnectProperties {
                session_expiry_interval: Some(100),
                ..Default::default()
            },
        }),
    );
    let packets = w.recv(conn);
    assert!(
        matches!(&packets[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::PROTOCOL_ERROR)
    );
    assert!(w.is_closed(conn));
}

fn will(topic: &str, delay: Option<u32>) -> LastWill {
    LastWill {
        topic: topic.into(),
        payload: Bytes::from_static(b"gone"),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: WillProperties {
            will_delay_interval: delay,
            ..Default::default()
        },
    }
}

#[test]
fn will_is_published_on_abnormal_disconnect() {
    let mut w = World::new();
    let watcher = w.connect(V5, "w");
    w.subscribe(watcher, "wills/#", QoS::AtLeastOnce);
    let a = w
        .connect_with(V5, "a", |c| c.will = Some(will("wills/a", None)))
        .0;
    w.close(a);
    let got = w.received_publishes(watcher);
    assert_eq!(got.len(), 1);
    assert_eq!(&got[0].payload[..], b"gone");
}

#[test]
fn will_is_not_published_on_normal_disconnect() {
    let mut w = World::new();
    let watcher = w.connect(V5, "w");
    w.subscribe(watcher, "wills/#", QoS::AtLeastOnce);
    let a = w
        .connect_with(V5, "a", |c| c.will = Some(will("wills/a", None)))
        .0;
    w.send(
        a,
        Packet::Disconnect(Disconnect::new(ReasonCode::NORMAL_DISCONNECTION)),
    );
    assert!(w.is_closed(a));
    assert!(w.received_publishes(watcher).is_empty());
}

#[test]
fn disconnect_with_will_message_publishes_the_will() {
    let mut w = World::new();
    let watcher = w.connect(V5, "w");
    w.subscribe(watcher, "wills/#", QoS::AtLeastOnce);
    let a = w
        .connect_with(V5, "a", |c| c.will = Some(will("wills/a", None)))
        .0;
    w.send(
        a,
        Packet::Disconnect(Disconnect::new(ReasonCode::DISCONNECT_WITH_WILL)),
    );
    assert_eq!(w.received_publishes(watcher).len(), 1);
}

#[test]
fn will_delay_waits_and_is_cancelled_by_reconnect() {
    let mut w = World::new();
    let watcher = w.connect(V5, "w");
    w.subscribe(watcher, "wills/#", QoS::AtLeastOnce);
    let session = |c: &mut meridian_core::codec::Connect| {
        c.clean_start = false;
        c.properties.session_expiry_interval = Some(600);
        c.will = Some(will("wills/a", Some(30)));
    };
    let a = w.connect_with(V5, "a", session).0;
    w.close(a);
    w.advance(20_000);
    assert!(w.received_publishes(watcher).is_empty(), "delayed");
    let a2 = w.connect_with(V5, "a", session).0;
    w.advance(60_000);
    assert!(
        w.received_publishes(watcher).is_empty(),
        "reconnect cancelled the will"
    );
    w.close(a2);
    w.advance(29_000);
    assert!(w.received_publishes(watcher).is_empty());
    w.advance(1_001);
    assert_eq!(
        w.received_publishes(watcher).len(),
        1,
        "published after the delay"
    );
}

#[test]
fn will_is_published_at_session_end_if_earlier_than_its_delay() {
    let mut w = World::new();
    let watcher = w.connect(V5, "w");
    w.subscribe(watcher, "wills/#", QoS::AtLeastOnce);
    let a = w
        .connect_with(V5, "a", |c| {
            c.properties.session_expiry_interval = Some(5);
            c.will = Some(will("wills/a", Some(3600)));
        })
        .0;
    w.close(a);
    w.advance(5_001);
    assert_eq!(w.received_publishes(watcher).len(), 1);
}

#[test]
fn will_on_takeover_with_clean_start_is_published() {
    let mut w = World::new();
    let watcher = w.connect(V5, "w");
    w.subscribe(watcher, "wills/#", QoS::AtLeastOnce);
    let _a = w
        .connect_with(V5, "a", |c| c.will = Some(will("wills/a", None)))
        .0;
    let _b = w.connect(V5, "a");
    assert_eq!(w.received_publishes(watcher).len(), 1);
}

#[test]
fn server_disconnect_carries_a_reason_code_to_v5_clients() {
    let mut w = World::new();
    let conn = w.connect(V5, "a");
    let now = meridian_core::Timestamp(w.now);
    assert!(
        w.broker
            .disconnect_client(now, "a", ReasonCode::ADMINISTRATIVE_ACTION)
    );
    w.drain();
    let packets = w.recv(conn);
    assert!(
        matches!(&packets[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::ADMINISTRATIVE_ACTION)
    );
    assert!(w.events.iter().any(|e| matches!(
        e,
        Event::ClientDisconnected {
            cause: DisconnectCause::ByServer(ReasonCode::ADMINISTRATIVE_ACTION),
            ..
        }
    )));
}

#[test]
fn shutdown_sends_server_shutting_down_to_v5_and_closes_all() {
    let mut w = World::new();
    let a = w.connect(V5, "a");
    let b = w.connect(V3, "b");
    w.broker.shutdown(meridian_core::Timestamp(w.now));
    w.drain();
    assert!(
        matches!(&w.recv(a)[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::SERVER_SHUTTING_DOWN)
    );
    assert!(w.recv(b).is_empty());
    assert!(w.is_closed(a) && w.is_closed(b));
}

#[test]
fn authenticator_denial_gets_the_reason_in_connack() {
    let authn = FnAuth(
        |r: &meridian_core::broker::AuthRequest<'_>| match r.password {
            Some(b"secret") => AuthOutcome::Allow { username: None },
            _ => AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD),
        },
    );
    let mut w = World::with_auth(Config::default(), Box::new(authn), Box::new(AllowAll));
    let (conn, ack) = w.connect_with(V5, "a", |c| {
        c.username = Some("u".into());
        c.password = Some(Bytes::from_static(b"wrong"));
    });
    assert_eq!(ack.reason, ReasonCode::BAD_USER_NAME_OR_PASSWORD);
    assert!(w.is_closed(conn));
    let (_, ack) = w.connect_with(V3, "b", |c| {
        c.username = Some("u".into());
        c.password = Some(Bytes::from_static(b"wrong"));
    });
    assert_eq!(
        ack.reason,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD,
        "3.1.1 return code 4 maps back"
    );
    let (_, ack) = w.connect_with(V5, "c", |c| {
        c.username = Some("u".into());
        c.password = Some(Bytes::from_static(b"secret"));
    });
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
}

#[test]
fn pending_authentication_completes_with_a_later_decision() {
    let authn = FnAuth(|_: &meridian_core::broker::AuthRequest<'_>| AuthOutcome::Pending);
    let mut w = World::with_auth(Config::default(), Box::new(authn), Box::new(AllowAll));
    let conn = w.accept();
    w.versions.insert(conn, V5);
    w.send(conn, Packet::Connect(connect_packet(V5, "a")));
    assert!(w.recv(conn).is_empty(), "no CONNACK before the decision");
    let now = meridian_core::Timestamp(w.now);
    w.broker.handle_input(
        now,
        meridian_core::Input::AuthDecision {
            conn,
            outcome: AuthOutcome::Allow {
                username: Some("alice".into()),
            },
        },
    );
    w.drain();
    assert!(matches!(&w.recv(conn)[..], [Packet::ConnAck(a)] if a.reason == ReasonCode::SUCCESS));
    assert!(
        w.events
            .iter()
            .any(|e| matches!(e, Event::ClientConnected { username: Some(u), .. } if u == "alice"))
    );
}

#[test]
fn enhanced_auth_exchange_through_the_authenticator() {
    // A challenge/response method: the server sends "challenge", expects "response".
    let authn = FnAuth(|r: &meridian_core::broker::AuthRequest<'_>| {
        match (r.method, r.continuation, r.data) {
            (Some("TEST"), false, _) => AuthOutcome::Continue(Bytes::from_static(b"challenge")),
            (Some("TEST"), true, Some(b"response")) => AuthOutcome::Allow { username: None },
            (Some("TEST"), true, _) => AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED),
            _ => AuthOutcome::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD),
        }
    });
    let mut w = World::with_auth(Config::default(), Box::new(authn), Box::new(AllowAll));
    let conn = w.accept();
    w.versions.insert(conn, V5);
    let mut c = connect_packet(V5, "a");
    c.properties.authentication_method = Some("TEST".into());
    w.send(conn, Packet::Connect(c));
    let packets = w.recv(conn);
    let [Packet::Auth(challenge)] = &packets[..] else {
        panic!("expected AUTH, got {packets:?}")
    };
    assert_eq!(challenge.reason, ReasonCode::CONTINUE_AUTHENTICATION);
    assert_eq!(
        challenge.properties.authentication_data.as_deref(),
        Some(&b"challenge"[..])
    );
    let auth = |data: &'static [u8], reason| {
        Packet::Auth(Auth {
            reason,
            properties: AuthProperties {
                authentication_method: Some("TEST".into()),
                authentication_data: Some(Bytes::from_static(data)),
                ..Default::default()
            },
        })
    };
    w.send(conn, auth(b"response", ReasonCode::CONTINUE_AUTHENTICATION));
    let packets = w.recv(conn);
    let [Packet::ConnAck(ack)] = &packets[..] else {
        panic!("expected CONNACK, got {packets:?}")
    };
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    assert_eq!(
        ack.properties.authentication_method.as_deref(),
        Some("TEST")
    );

    // Re-authentication: success answers AUTH 0x00, failure disconnects.
    w.send(conn, auth(b"x", ReasonCode::RE_AUTHENTICATE));
    assert!(
        matches!(&w.recv(conn)[..], [Packet::Auth(a)] if a.reason == ReasonCode::CONTINUE_AUTHENTICATION)
    );
    w.send(conn, auth(b"response", ReasonCode::CONTINUE_AUTHENTICATION));
    assert!(matches!(&w.recv(conn)[..], [Packet::Auth(a)] if a.reason == ReasonCode::SUCCESS));
    w.send(conn, auth(b"x", ReasonCode::RE_AUTHENTICATE));
    w.recv(conn);
    w.send(conn, auth(b"wrong", ReasonCode::CONTINUE_AUTHENTICATION));
    assert!(
        matches!(&w.recv(conn)[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::NOT_AUTHORIZED)
    );
    assert!(w.is_closed(conn));
}

#[test]
fn unknown_auth_method_is_refused_with_0x8c() {
    let mut w = World::new();
    let (conn, ack) = w.connect_with(V5, "a", |c| {
        c.properties.authentication_method = Some("KERBEROS".into())
    });
    assert_eq!(ack.reason, ReasonCode::BAD_AUTHENTICATION_METHOD);
    assert!(w.is_closed(conn));
}

/// Access rules that keep everyone away from `secret/#`.
fn deny_secret() -> Acl {
    Acl::new(
        Permission::Allow,
        vec![Rule::new(Permission::Deny, Action::All, "secret/#").unwrap()],
    )
}

#[test]
fn will_on_a_denied_topic_refuses_the_connect() {
    let mut w = World::with_acl(Config::default(), deny_secret());
    let (_, ack) = w.connect_with(V5, "a", |c| c.will = Some(will("secret/x", None)));
    assert_eq!(ack.reason, ReasonCode::NOT_AUTHORIZED);
}

#[test]
fn denied_publish_gets_0x87_on_v5_and_is_dropped_on_v311() {
    let mut w = World::with_acl(Config::default(), deny_secret());
    let watcher = w.connect(V5, "w");
    w.subscribe(watcher, "#", QoS::AtLeastOnce);
    let v5 = w.connect(V5, "p5");
    w.publish(v5, "secret/a", b"x", QoS::AtLeastOnce, false, 1);
    assert!(
        matches!(&w.recv(v5)[..], [Packet::PubAck(a)] if a.reason == ReasonCode::NOT_AUTHORIZED)
    );
    let v3 = w.connect(V3, "p3");
    w.publish(v3, "secret/a", b"x", QoS::AtLeastOnce, false, 1);
    assert!(matches!(&w.recv(v3)[..], [Packet::PubAck(a)] if a.packet_id == 1));
    assert!(!w.is_closed(v3));
    assert!(w.received_publishes(watcher).is_empty());
    assert_eq!(w.broker.stats().dropped_not_authorized, 2);
}

#[test]
fn new_hooks_decide_what_comes_next_and_leave_what_was_decided() {
    let mut w = World::with_acl(Config::default(), deny_secret());
    let a = w.connect(V5, "a");
    w.subscribe(a, "public/#", QoS::AtMostOnce);
    let deny_password = |r: &meridian_core::broker::AuthRequest<'_>| match r.password {
        Some(b"new") => AuthOutcome::Allow { username: None },
        _ => AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD),
    };
    let deny_public = Acl::new(
        Permission::Allow,
        vec![
            Rule::new(Permission::Deny, Action::Subscribe, "public/#").unwrap(),
            Rule::new(Permission::Deny, Action::Publish, "public/closed").unwrap(),
        ],
    );
    w.broker.set_hooks(
        meridian_core::Timestamp(w.now),
        Box::new(FnAuth(deny_password)),
        Box::new(deny_public),
    );

    // a stays connected and subscribed, though the rules now deny that subscription: it
    // receives nothing more through it...
    let p = w
        .connect_with(V5, "p", |c| c.password = Some(Bytes::from_static(b"new")))
        .0;
    w.publish(
        p,
        "public/closed",
        b"now denied",
        QoS::AtLeastOnce,
        false,
        1,
    );
    assert!(
        matches!(&w.recv(p)[..], [Packet::PubAck(ack)] if ack.reason == ReasonCode::NOT_AUTHORIZED)
    );
    w.publish(p, "public/x", b"not for a", QoS::AtLeastOnce, false, 2);
    assert!(matches!(&w.recv(p)[..], [Packet::PubAck(ack)] if ack.reason == ReasonCode::SUCCESS));
    assert!(w.received_publishes(a).is_empty());
    assert_eq!(w.broker.stats().withheld_not_authorized, 1);
    assert!(!w.is_closed(a));
    assert_eq!(w.broker.stats().subscriptions, 1);
    // ...and new connections and subscriptions follow the new hooks.
    assert_eq!(
        w.subscribe(a, "secret/#", QoS::AtMostOnce),
        vec![ReasonCode::GRANTED_QOS_0]
    );
    assert_eq!(
        w.subscribe(a, "public/more", QoS::AtMostOnce),
        vec![ReasonCode::NOT_AUTHORIZED]
    );
    let (_, ack) = w.connect_with(V5, "q", |c| c.password = Some(Bytes::from_static(b"old")));
    assert_eq!(ack.reason, ReasonCode::BAD_USER_NAME_OR_PASSWORD);
}

#[test]
fn denied_subscribe_gets_0x87_on_v5_and_0x80_on_v311() {
    let mut w = World::with_acl(Config::default(), deny_secret());
    let a = w.connect(V5, "a");
    assert_eq!(
        w.subscribe(a, "secret/#", QoS::AtLeastOnce),
        vec![ReasonCode::NOT_AUTHORIZED]
    );
    let b = w.connect(V3, "b");
    assert_eq!(
        w.subscribe(b, "secret/#", QoS::AtLeastOnce),
        vec![ReasonCode::UNSPECIFIED_ERROR]
    );
}

#[test]
fn pipelined_packets_wait_for_a_pending_authentication() {
    let authn = FnAuth(|_: &meridian_core::broker::AuthRequest<'_>| AuthOutcome::Pending);
    let mut w = World::with_auth(Config::default(), Box::new(authn), Box::new(AllowAll));
    let conn = w.accept();
    w.versions.insert(conn, V5);
    // CONNECT, SUBSCRIBE and PINGREQ in one write, before any answer.
    let mut bytes = bytes::BytesMut::new();
    for packet in [
        Packet::Connect(connect_packet(V5, "eager")),
        Packet::PingReq,
    ] {
        meridian_core::codec::encode(&packet, V5, &mut bytes).unwrap();
    }
    w.send_bytes(conn, &bytes);
    assert!(w.recv(conn).is_empty());
    assert!(!w.is_closed(conn), "pipelining is not a protocol error");
    let now = meridian_core::Timestamp(w.now);
    w.broker.handle_input(
        now,
        meridian_core::Input::AuthDecision {
            conn,
            outcome: AuthOutcome::Allow { username: None },
        },
    );
    w.drain();
    let packets = w.recv(conn);
    assert!(
        matches!(&packets[..], [Packet::ConnAck(_), Packet::PingResp]),
        "{packets:?}"
    );
}

#[test]
fn a_client_streaming_before_its_login_is_decided_is_asked_to_wait() {
    let authn = FnAuth(|r: &meridian_core::broker::AuthRequest<'_>| {
        if r.client_id == "eager" {
            AuthOutcome::Pending
        } else {
            AuthOutcome::Allow { username: None }
        }
    });
    let config = Config {
        max_packet_size: 1024,
        ..Config::default()
    };
    let mut w = World::with_auth(config, Box::new(authn), Box::new(AllowAll));
    let conn = w.accept();
    w.versions.insert(conn, V5);
    assert!(w.broker.wants_input(conn), "before CONNECT");
    w.send(conn, Packet::Connect(connect_packet(V5, "eager")));
    assert!(w.broker.wants_input(conn), "nothing held yet");
    // 100-byte PUBLISHes, pipelined: held until one packet's worth is held.
    let mut sent = 0;
    let mut one = bytes::BytesMut::new();
    let publish = Packet::Publish(publish_packet("t", &[7; 90], QoS::AtMostOnce, false, 0));
    meridian_core::codec::encode(&publish, V5, &mut one).unwrap();
    while w.broker.wants_input(conn) {
        w.send_bytes(conn, &one);
        sent += 1;
        assert!(sent <= 11, "still reading after {sent} packets");
    }
    assert_eq!(
        sent * one.len() / 1024,
        1,
        "{sent} packets of {} bytes",
        one.len()
    );
    assert!(!w.is_closed(conn), "pipelining is not a protocol error");
    let s = w.connect(V5, "s");
    w.subscribe(s, "t", QoS::AtMostOnce);
    let now = meridian_core::Timestamp(w.now);
    w.broker.handle_input(
        now,
        meridian_core::Input::AuthDecision {
            conn,
            outcome: AuthOutcome::Allow { username: None },
        },
    );
    w.drain();
    assert!(
        w.broker.wants_input(conn),
        "reading again after the decision"
    );
    assert!(matches!(w.recv(conn).first(), Some(Packet::ConnAck(_))));
    assert_eq!(
        w.received_publishes(s).len(),
        sent,
        "every held packet handled"
    );
}

#[test]
fn reauthentication_denial_with_a_connack_only_code_sends_a_valid_disconnect() {
    let authn =
        FnAuth(
            |r: &meridian_core::broker::AuthRequest<'_>| match (r.method, r.reauthentication) {
                (Some("M"), false) => AuthOutcome::Allow { username: None },
                (Some("M"), true) => AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD),
                _ => AuthOutcome::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD),
            },
        );
    let mut w = World::with_auth(Config::default(), Box::new(authn), Box::new(AllowAll));
    let (conn, ack) = w.connect_with(V5, "a", |c| {
        c.properties.authentication_method = Some("M".into())
    });
    assert_eq!(ack.reason, ReasonCode::SUCCESS);
    w.send(
        conn,
        Packet::Auth(Auth {
            reason: ReasonCode::RE_AUTHENTICATE,
            properties: AuthProperties {
                authentication_method: Some("M".into()),
                ..Default::default()
            },
        }),
    );
    // 0x86 is not a DISCONNECT reason code: the client is told 0x87 (not authorized).
    assert!(
        matches!(&w.recv(conn)[..], [Packet::Disconnect(d)] if d.reason == ReasonCode::NOT_AUTHORIZED)
    );
}

#[test]
fn disconnect_may_set_expiry_when_connect_asked_for_one_even_if_capped() {
    let mut w = World::with_config(Config {
        max_session_expiry_secs: 0,
        ..Config::default()
    });
    let conn = w
        .connect_with(V5, "a", |c| {
            c.properties.session_expiry_interval = Some(100)
        })
        .0;
    w.send(
        conn,
        Packet::Disconnect(Disconnect {
            reason: ReasonCode::NORMAL_DISCONNECTION,
            properties: DisconnectProperties {
                session_expiry_interval: Some(100),
                ..Default::default()
            },
        }),
    );
    assert!(w.recv(conn).is_empty(), "no protocol error");
}

#[test]
fn session_cap_refuses_new_sessions_with_quota_exceeded() {
    let mut w = World::with_config(Config {
        max_sessions: 2,
        ..Config::default()
    });
    w.connect(V5, "a");
    w.connect(V5, "b");
    let (conn, ack) = w.connect_with(V5, "c", |_| {});
    assert_eq!(ack.reason, ReasonCode::QUOTA_EXCEEDED);
    assert!(w.is_closed(conn));
    let (_, ack) = w.connect_with(V5, "a", |_| {});
    assert_eq!(
        ack.reason,
        ReasonCode::SUCCESS,
        "an existing client id may take over"
    );
}

#[test]
fn response_information_is_a_valid_topic_prefix() {
    let mut w = World::new();
    let (_, ack) = w.connect_with(V5, "odd/id+#", |c| {
        c.properties.request_response_information = Some(true)
    });
    assert_eq!(
        ack.properties.response_information.as_deref(),
        Some("response/odd_id__/")
    );
}
