//! The `Broker` class through its JS-facing API, run under Node by wasm-bindgen-test.

#![cfg(target_arch = "wasm32")]

mod common;

use common::*;
use js_sys::Function;
use meridian_wasm::JsBroker;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_test::wasm_bindgen_test;

#[wasm_bindgen_test]
fn connect_gets_connack_and_event() {
    let mut h = Harness::new("{}");
    let conn = h.accept(4);
    // The crate docs' CONNECT: MQTT 3.1.1, client id "c1", clean session, keep alive 60 s.
    let connect = u8array(&[
        0x10, 14, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 60, 0, 2, b'c', b'1',
    ]);
    h.broker.handle_bytes(conn, connect, h.now).unwrap();
    let outs = array(&h.broker.drain());
    let send = outs
        .iter()
        .find(|o| get_str(o, "type") == "send")
        .expect("a send output");
    assert_eq!(get_num(send, "conn"), conn);
    assert_eq!(bytes(&get(send, "data")), [0x20, 2, 0, 0]);
    let event = outs
        .iter()
        .find(|o| get_str(o, "type") == "event")
        .map(|o| get(o, "event"))
        .expect("an event output");
    assert_eq!(get_str(&event, "type"), "clientConnected");
    assert_eq!(get_str(&event, "clientId"), "c1");
    assert_eq!(get_num(&event, "protocolVersion"), 4.0);
    assert!(get(&event, "username").is_null());
    // Drained: nothing left.
    assert!(h.broker.poll_output().is_undefined());
    assert_eq!(array(&h.broker.drain()).len(), 0);
}

#[wasm_bindgen_test]
fn poll_output_yields_the_same_sequence_as_drain() {
    let run = |use_drain: bool| -> Vec<String> {
        let mut b = JsBroker::new(None, Some(T0), None).unwrap();
        let mut seen = Vec::new();
        for id in ["a", "b"] {
            let conn = b.accept(T0, None).unwrap();
            let connect = encode(&format!(r#"{{"type":"connect","clientId":"{id}"}}"#), 5);
            b.handle_bytes(conn, connect, T0).unwrap();
        }
        let outs = if use_drain {
            array(&b.drain())
        } else {
            std::iter::from_fn(|| Some(b.poll_output()).filter(|o| !o.is_undefined())).collect()
        };
        for o in outs {
            seen.push(js_sys::JSON::stringify(&o).unwrap().into());
        }
        seen
    };
    let drained = run(true);
    assert!(drained.len() >= 4, "{drained:?}");
    assert_eq!(drained, run(false));
}

#[wasm_bindgen_test]
fn publish_subscribe_qos1_between_two_connections() {
    let mut h = Harness::new("{}");
    let sub = h.connect("sub", 5);
    let publisher = h.connect("pub", 4);
    h.send(
        sub,
        r#"{"type":"subscribe","packetId":1,"filters":[{"filter":"a/#","qos":1}]}"#,
        5,
    );
    let suback = h.take(sub);
    assert_eq!(get_str(&suback[0], "type"), "suback");
    assert_eq!(
        array(&get(&suback[0], "reasonCodes"))[0].as_f64(),
        Some(1.0)
    );
    assert!(
        h.events()
            .iter()
            .any(|e| get_str(e, "type") == "routeAdded" && get_str(e, "filter") == "a/#")
    );

    h.send(
        publisher,
        r#"{"type":"publish","topic":"a/b","payload":"hello","qos":1,"packetId":9}"#,
        4,
    );
    let puback = h.take(publisher);
    assert_eq!(get_str(&puback[0], "type"), "puback");
    assert_eq!(get_num(&puback[0], "packetId"), 9.0);
    let delivered = h.take(sub);
    assert_eq!(delivered.len(), 1);
    let p = &delivered[0];
    assert_eq!(get_str(p, "topic"), "a/b");
    assert_eq!(bytes(&get(p, "payload")), b"hello");
    assert_eq!(get_num(p, "qos"), 1.0);

    let stats = h.broker.stats();
    assert_eq!(get_num(&stats, "connections"), 2.0);
    assert_eq!(get_num(&stats, "subscriptions"), 1.0);
    assert_eq!(
        array(&get(&stats, "messagesReceived"))[1].as_f64(),
        Some(1.0)
    );
    assert_eq!(get_num(&stats, "inflightMessages"), 1.0);

    // The app publishes too.
    let n = h
        .broker
        .publish(js(r#"{"topic":"a/c","payload":"from app"}"#), h.now)
        .unwrap();
    assert_eq!(n, 1);
    h.pump();
    assert_eq!(get_str(&h.take(sub)[0], "topic"), "a/c");
    let err = h
        .broker
        .publish(js(r#"{"topic":"a/+"}"#), h.now)
        .unwrap_err();
    assert!(err.is_instance_of::<js_sys::TypeError>());
    assert!(
        message(&err).contains("invalid topic name"),
        "{}",
        message(&err)
    );
}

#[wasm_bindgen_test]
fn a_congested_connection_misses_qos0_until_drained() {
    let mut h = Harness::new("{}");
    let sub = h.connect("sub", 5);
    let publisher = h.connect("pub", 5);
    h.send(
        sub,
        r#"{"type":"subscribe","packetId":1,"filters":[{"filter":"t/#","qos":1}]}"#,
        5,
    );
    h.take(sub);
    let publish = |h: &mut Harness, qos: u8, payload: &str| {
        let id = if qos > 0 { r#","packetId":5"# } else { "" };
        h.send(
            publisher,
            &format!(r#"{{"type":"publish","topic":"t/x","payload":"{payload}","qos":{qos}{id}}}"#),
            5,
        );
    };
    h.broker.handle_congested(sub, h.now).unwrap();
    publish(&mut h, 0, "dropped");
    publish(&mut h, 1, "kept");
    let got = h.take(sub);
    assert_eq!(got.len(), 1);
    assert_eq!(bytes(&get(&got[0], "payload")), b"kept");
    assert_eq!(get_num(&h.broker.stats(), "droppedQos0Congested"), 1.0);
    let clients = array(&h.broker.clients());
    let congested = |id: &str| {
        clients
            .iter()
            .find(|c| get_str(c, "clientId") == id)
            .map(|c| get_bool(c, "congested"))
    };
    assert_eq!(congested("sub"), Some(true));
    assert_eq!(congested("pub"), Some(false));

    h.broker.handle_drained(sub, h.now).unwrap();
    publish(&mut h, 0, "resumed");
    let got = h.take(sub);
    assert_eq!(got.len(), 1);
    assert_eq!(bytes(&get(&got[0], "payload")), b"resumed");
    assert!(h.broker.handle_congested(-1.0, h.now).is_err());
}

#[wasm_bindgen_test]
fn malformed_frame_closes_only_its_own_connection() {
    let mut h = Harness::new("{}");
    let good = h.connect("good", 5);
    let bad = h.connect("bad", 5);
    // A PUBLISH whose topic length runs past the end of the packet.
    h.feed(bad, &u8array(&[0x30, 3, 0, 9, b'a']));
    assert!(h.closed.contains(&bad));
    assert!(!h.closed.contains(&good));
    let disconnect = h.take(bad);
    assert_eq!(get_str(&disconnect[0], "type"), "disconnect");
    assert_eq!(get_num(&disconnect[0], "reasonCode"), 0x81 as f64);
    assert!(h.events().iter().any(|e| {
        get_str(e, "type") == "clientDisconnected"
            && get_str(e, "clientId") == "bad"
            && get_str(e, "cause") == "server"
    }));
    // More bytes for the closed connection are ignored, the other one still works.
    h.feed(bad, &u8array(&[0xC0, 0]));
    assert!(h.take(bad).is_empty());
    h.send(good, r#"{"type":"pingreq"}"#, 5);
    assert_eq!(get_str(&h.take(good)[0], "type"), "pingresp");
    assert_eq!(get_num(&h.broker.stats(), "protocolErrors"), 1.0);
}

#[wasm_bindgen_test]
fn keep_alive_deadline_closes_a_silent_client() {
    let mut h = Harness::new("{}");
    let conn = h.connect_with(
        r#"{"type":"connect","clientId":"quiet","keepAlive":10,"protocolVersion":4}"#,
        4,
    );
    // Never sooner than 1.5 x keep alive.
    let at = h.broker.poll_timeout().expect("keep-alive deadline");
    assert_eq!(at, T0 + 15_000.0);
    h.fire_timeout();
    assert_eq!(h.closed, [conn]);
    assert!(h.events().iter().any(|e| {
        get_str(e, "type") == "clientDisconnected" && get_num(e, "reasonCode") == 0x8D as f64
    }));
}

#[wasm_bindgen_test]
fn will_is_published_when_the_connection_is_lost() {
    let mut h = Harness::new("{}");
    let watcher = h.connect("watcher", 4);
    h.send(
        watcher,
        r#"{"type":"subscribe","packetId":1,"filters":["wills/#"]}"#,
        4,
    );
    h.take(watcher);
    let dying = h.connect_with(
        r#"{"type":"connect","clientId":"dying","protocolVersion":4,
            "will":{"topic":"wills/dying","payload":"gone","qos":0}}"#,
        4,
    );
    h.broker.handle_closed(dying, h.now).unwrap();
    h.pump();
    let got = h.take(watcher);
    assert_eq!(get_str(&got[0], "topic"), "wills/dying");
    assert_eq!(bytes(&get(&got[0], "payload")), b"gone");
    let events = h.events();
    let gone = events
        .iter()
        .find(|e| get_str(e, "type") == "clientDisconnected")
        .expect("clientDisconnected");
    assert_eq!(get_str(gone, "cause"), "connectionLost");
    assert!(get_bool(gone, "publishesWill"));
}

#[wasm_bindgen_test]
fn system_topics_are_published_when_asked_for() {
    let mut h = Harness::new(r#"{"sysIntervalMs": 1000}"#);
    assert_eq!(get_num(&h.broker.config(), "sysIntervalMs"), 1000.0);
    let watcher = h.connect("watcher", 5);
    h.send(
        watcher,
        r#"{"type":"subscribe","packetId":1,"filters":["$SYS/broker/clients/connected"]}"#,
        5,
    );
    let got = h.take(watcher);
    let figure = got
        .iter()
        .find(|p| get_str(p, "type") == "publish")
        .expect("the figure follows the SUBACK");
    assert_eq!(get_str(figure, "topic"), "$SYS/broker/clients/connected");
    assert_eq!(bytes(&get(figure, "payload")), b"1");
    assert!(get_bool(figure, "retain"));
    assert_eq!(h.broker.poll_timeout(), Some(T0 + 1000.0));
}

#[wasm_bindgen_test]
fn persisted_session_is_restored_by_a_new_broker() {
    let mut h = Harness::new("{}");
    let conn = h.connect_with(
        r#"{"type":"connect","clientId":"keeper","cleanStart":false,"protocolVersion":4}"#,
        4,
    );
    h.send(
        conn,
        r#"{"type":"subscribe","packetId":1,"filters":[{"filter":"k/#","qos":1}]}"#,
        4,
    );
    h.broker.handle_closed(conn, h.now).unwrap();
    h.pump();
    // A QoS 1 message for the offline session is queued and persisted.
    h.broker
        .publish(js(r#"{"topic":"k/1","payload":"queued","qos":1}"#), h.now)
        .unwrap();
    h.pump();
    let mut store: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for o in h.other.iter().filter(|o| get_str(o, "type") == "persist") {
        let key = bytes(&get(o, "key"));
        store.retain(|(k, _)| *k != key);
        let value = get(o, "value");
        if !value.is_null() {
            store.push((key, bytes(&value)));
        }
    }
    assert!(
        store.len() >= 3,
        "session, subscription and message records"
    );

    let records = js_sys::Array::new();
    for (k, v) in &store {
        records.push(&js_sys::Array::of2(&u8array(k), &u8array(v)));
    }
    let mut restarted = Harness::new("{}");
    let report = restarted.broker.restore(records.into(), T0).unwrap();
    assert_eq!(get_num(&report, "sessions"), 1.0);
    assert_eq!(get_num(&report, "subscriptions"), 1.0);
    assert_eq!(get_num(&report, "messages"), 1.0);
    assert_eq!(array(&get(&report, "unreadable")).len(), 0);
    let clients = array(&restarted.broker.clients());
    assert_eq!(get_str(&clients[0], "clientId"), "keeper");
    assert!(!get_bool(&clients[0], "connected"));

    let conn = restarted.accept(4);
    restarted.send(
        conn,
        r#"{"type":"connect","clientId":"keeper","cleanStart":false,"protocolVersion":4}"#,
        4,
    );
    let got = restarted.take(conn);
    assert_eq!(get_str(&got[0], "type"), "connack");
    assert!(get_bool(&got[0], "sessionPresent"));
    assert_eq!(get_str(&got[1], "topic"), "k/1");
    assert_eq!(bytes(&get(&got[1], "payload")), b"queued");

    let bad = js(r#"[["not", "a record"]]"#);
    let report = restarted.broker.restore(bad, T0).unwrap();
    assert_eq!(array(&get(&report, "unreadable")).len(), 1);
    let err = restarted.broker.restore(js("[[1]]"), T0).unwrap_err();
    assert!(message(&err).contains("records[0]"), "{}", message(&err));
}

#[wasm_bindgen_test]
fn shutdown_closes_every_connection() {
    let mut h = Harness::new("{}");
    let a = h.connect("a", 5);
    let b = h.connect("b", 4);
    h.broker.shutdown(h.now).unwrap();
    h.pump();
    assert_eq!(h.closed, [a, b]);
    let to_a = h.take(a);
    assert_eq!(get_num(&to_a[0], "reasonCode"), 0x8B as f64);
    assert!(h.take(b).is_empty(), "3.1.1 has no server DISCONNECT");
}

#[wasm_bindgen_test]
fn config_is_applied_and_checked() {
    let h = Harness::new(r#"{"maxPacketSize": 512, "maximumQos": 1, "seed": 7}"#);
    let config = h.broker.config();
    assert_eq!(get_num(&config, "maxPacketSize"), 512.0);
    assert_eq!(get_num(&config, "maximumQos"), 1.0);
    assert!(get(&config, "seed").is_bigint());

    let refused = |json: &str| {
        let err = JsBroker::new(Some(js(json).unchecked_into()), Some(T0), None).unwrap_err();
        (err.clone(), message(&err))
    };
    let (err, msg) = refused(r#"{"maxPacketSiz": 5}"#);
    assert!(err.is_instance_of::<js_sys::TypeError>());
    assert!(msg.contains("unknown field 'maxPacketSiz'"), "{msg}");
    let (err, msg) = refused(r#"{"receiveMaximum": 70000}"#);
    assert!(err.is_instance_of::<js_sys::RangeError>());
    assert!(msg.contains("config.receiveMaximum"), "{msg}");
    let (_, msg) = refused(r#"{"retainAvailable": "yes"}"#);
    assert!(msg.contains("expected a boolean"), "{msg}");
    let (_, msg) = refused(r#"{"maximumQos": 3}"#);
    assert!(msg.contains("config.maximumQos"), "{msg}");
    let (_, msg) = refused("[1]");
    assert!(msg.contains("expected an object"), "{msg}");
    // A bigint seed above 2^53.
    let config = js("{}");
    js_sys::Reflect::set(
        &config,
        &"seed".into(),
        &js_sys::BigInt::from(u64::MAX).into(),
    )
    .unwrap();
    JsBroker::new(Some(config.unchecked_into()), Some(T0), None).expect("u64 seed");
}

#[wasm_bindgen_test]
fn bad_arguments_throw_instead_of_trapping() {
    let mut b = JsBroker::new(None, Some(T0), None).unwrap();
    let conn = b.accept(T0, None).unwrap();
    for bad_conn in [0.0, -1.0, 1.5, f64::NAN, f64::INFINITY] {
        let err = b.handle_bytes(bad_conn, u8array(&[]), T0).unwrap_err();
        assert!(err.is_instance_of::<js_sys::RangeError>(), "{bad_conn}");
    }
    for bad_now in [-1.0, f64::NAN, 1e300] {
        let err = b.handle_timeout(bad_now).unwrap_err();
        assert!(message(&err).contains("nowMs"), "{}", message(&err));
    }
    let err = b
        .handle_bytes(conn, JsValue::from_str("CONNECT"), T0)
        .unwrap_err();
    assert!(err.is_instance_of::<js_sys::TypeError>());
    // An ArrayBuffer is fine; an unknown connection is ignored, as in the core.
    b.handle_bytes(conn, js_sys::ArrayBuffer::new(0).into(), T0)
        .unwrap();
    b.handle_bytes(999.0, u8array(&[0xC0, 0]), T0).unwrap();
    b.handle_closed(999.0, T0).unwrap();
    let err = b
        .accept(T0, Some(js(r#"{"remoteAdr":"x"}"#).unchecked_into()))
        .unwrap_err();
    assert!(message(&err).contains("unknown field 'remoteAdr'"));
    assert!(b.disconnect_client("x".into(), T0, Some(300.0)).is_err());
    assert!(!b.disconnect_client("nobody".into(), T0, None).unwrap());
}

fn function(args: &str, body: &str) -> Function {
    Function::new_with_args(args, body)
}

fn hooks(pairs: &[(&str, Function)]) -> meridian_wasm::BrokerHooksArg {
    let obj = js_sys::Object::new();
    for (name, f) in pairs {
        js_sys::Reflect::set(&obj, &(*name).into(), f).unwrap();
    }
    JsValue::from(obj).unchecked_into()
}

#[wasm_bindgen_test]
fn authenticate_hook_allows_and_denies() {
    let auth = function(
        "req",
        "return req.username === 'alice' && new TextDecoder().decode(req.password) === 'pw' \
         ? { allow: true } : { deny: 0x86 };",
    );
    let broker = JsBroker::new(None, Some(T0), Some(hooks(&[("authenticate", auth)]))).unwrap();
    let mut h = Harness::with_broker(broker);
    h.connect_with(
        r#"{"type":"connect","clientId":"a","username":"alice","password":"pw"}"#,
        5,
    );
    let conn = h.accept(5);
    h.send(
        conn,
        r#"{"type":"connect","clientId":"m","username":"mallory","password":"x"}"#,
        5,
    );
    let connack = &h.take(conn)[0];
    assert_eq!(get_num(connack, "reasonCode"), 0x86 as f64);
    assert!(h.closed.contains(&conn));
}

#[wasm_bindgen_test]
fn a_throwing_hook_refuses_and_reports_the_error() {
    let auth = function("req", "throw new Error('database down');");
    let broker = JsBroker::new(None, Some(T0), Some(hooks(&[("authenticate", auth)]))).unwrap();
    let mut h = Harness::with_broker(broker);
    let conn = h.accept(4);
    h.send(
        conn,
        r#"{"type":"connect","clientId":"x","protocolVersion":4}"#,
        4,
    );
    assert_eq!(get_num(&h.take(conn)[0], "reasonCode"), 0x87 as f64);
    let report = h
        .other
        .iter()
        .find(|o| get_str(o, "type") == "hookError")
        .expect("hookError output");
    assert_eq!(get_str(report, "hook"), "authenticate");
    assert_eq!(message(&get(report, "error")), "database down");
}

#[wasm_bindgen_test]
fn pending_authentication_is_decided_later() {
    let auth = function("req", "return 'pending';");
    let broker = JsBroker::new(None, Some(T0), Some(hooks(&[("authenticate", auth)]))).unwrap();
    let mut h = Harness::with_broker(broker);
    let conn = h.accept(5);
    h.send(conn, r#"{"type":"connect","clientId":"slow"}"#, 5);
    assert!(h.take(conn).is_empty(), "no CONNACK before the decision");
    h.broker
        .auth_decision(conn, js(r#"{"allow":true,"username":"bob"}"#), h.now)
        .unwrap();
    h.pump();
    assert_eq!(get_num(&h.take(conn)[0], "reasonCode"), 0.0);
    let connected = h
        .events()
        .into_iter()
        .find(|e| get_str(e, "type") == "clientConnected")
        .expect("clientConnected");
    assert_eq!(get_str(&connected, "username"), "bob");
    let err = h
        .broker
        .auth_decision(conn, js(r#""pending""#), h.now)
        .unwrap_err();
    assert!(message(&err).contains("auth result"), "{}", message(&err));
}

#[wasm_bindgen_test]
fn a_client_streaming_before_its_login_is_decided_is_asked_to_wait() {
    let auth = function("req", "return 'pending';");
    let broker = JsBroker::new(
        Some(js(r#"{"maxPacketSize": 512}"#).unchecked_into()),
        Some(T0),
        Some(hooks(&[("authenticate", auth)])),
    )
    .unwrap();
    let mut h = Harness::with_broker(broker);
    let conn = h.accept(5);
    h.send(conn, r#"{"type":"connect","clientId":"eager"}"#, 5);
    assert!(h.broker.wants_input(conn).unwrap(), "nothing held yet");
    let publish = format!(
        r#"{{"type":"publish","topic":"t","payload":"{}"}}"#,
        "x".repeat(100)
    );
    let mut sent = 0;
    while h.broker.wants_input(conn).unwrap() {
        h.send(conn, &publish, 5);
        sent += 1;
        assert!(sent <= 6, "still reading after {sent} packets");
    }
    assert!(h.closed.is_empty(), "paused, not cut");
    h.broker.auth_decision(conn, js("true"), h.now).unwrap();
    h.pump();
    assert!(
        h.broker.wants_input(conn).unwrap(),
        "reading again after the decision"
    );
    assert!(
        h.broker.wants_input(0.5).is_err(),
        "a connection id is checked"
    );
}

#[wasm_bindgen_test]
fn a_filtered_subscription_gets_each_message_checked() {
    let may_subscribe = function(
        "client, filter",
        "return filter === 'secret/+' ? false : filter === '#' ? 'filtered' : true;",
    );
    let may_receive = function("client, topic", "return !topic.startsWith('secret/');");
    let broker = JsBroker::new(
        None,
        Some(T0),
        Some(hooks(&[
            ("maySubscribe", may_subscribe),
            ("mayReceive", may_receive),
        ])),
    )
    .unwrap();
    let mut h = Harness::with_broker(broker);
    let c = h.connect("c", 5);
    h.send(
        c,
        r##"{"type":"subscribe","packetId":1,"filters":["#","secret/+"]}"##,
        5,
    );
    let codes: Vec<f64> = array(&get(&h.take(c)[0], "reasonCodes"))
        .iter()
        .map(|c| c.as_f64().unwrap())
        .collect();
    assert_eq!(codes, [0.0, 0x87 as f64]);
    for topic in ["secret/x", "open/x"] {
        h.send(
            c,
            &format!(r#"{{"type":"publish","topic":"{topic}","payload":"p"}}"#),
            5,
        );
    }
    let got = h.take(c);
    assert_eq!(got.len(), 1);
    assert_eq!(get_str(&got[0], "topic"), "open/x");
}

#[wasm_bindgen_test]
fn filtered_without_may_receive_is_a_hook_error() {
    let may_subscribe = function("client, filter", "return 'filtered';");
    let broker = JsBroker::new(
        None,
        Some(T0),
        Some(hooks(&[("maySubscribe", may_subscribe)])),
    )
    .unwrap();
    let mut h = Harness::with_broker(broker);
    let c = h.connect("c", 5);
    h.send(
        c,
        r##"{"type":"subscribe","packetId":1,"filters":["#"]}"##,
        5,
    );
    let codes: Vec<f64> = array(&get(&h.take(c)[0], "reasonCodes"))
        .iter()
        .map(|c| c.as_f64().unwrap())
        .collect();
    assert_eq!(codes, [0x87 as f64]);
}

#[wasm_bindgen_test]
fn authorization_hooks_filter_publish_and_subscribe() {
    let may_publish = function("client, topic", "return !topic.startsWith('secret/');");
    let may_subscribe = function("client, filter", "return filter !== '#';");
    let broker = JsBroker::new(
        None,
        Some(T0),
        Some(hooks(&[
            ("mayPublish", may_publish),
            ("maySubscribe", may_subscribe),
        ])),
    )
    .unwrap();
    let mut h = Harness::with_broker(broker);
    let c = h.connect("c", 5);
    h.send(
        c,
        r##"{"type":"subscribe","packetId":1,"filters":["#","open/+","secret/+"]}"##,
        5,
    );
    let suback = &h.take(c)[0];
    let codes: Vec<f64> = array(&get(suback, "reasonCodes"))
        .iter()
        .map(|c| c.as_f64().unwrap())
        .collect();
    assert_eq!(codes, [0x87 as f64, 0.0, 0.0]);
    h.send(
        c,
        r#"{"type":"publish","topic":"secret/x","payload":"no","qos":1,"packetId":2}"#,
        5,
    );
    let puback = &h.take(c)[0];
    assert_eq!(get_num(puback, "reasonCode"), 0x87 as f64);
    h.send(
        c,
        r#"{"type":"publish","topic":"open/x","payload":"yes"}"#,
        5,
    );
    assert_eq!(get_str(&h.take(c)[0], "topic"), "open/x");
}
