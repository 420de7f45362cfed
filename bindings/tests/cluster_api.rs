//! Two brokers as nodes of a deployment, linked by a JS-style shell that carries their frames
//! as bytes: a subscription on one node receives what a client of the other publishes.

#![cfg(target_arch = "wasm32")]

mod common;

use common::*;
use meridian_wasm::JsBroker;
use wasm_bindgen::JsValue;
use wasm_bindgen_test::wasm_bindgen_test;

fn node(name: &str) -> Harness {
    let mut h = Harness::with_broker(JsBroker::new(None, Some(T0), None).unwrap());
    h.broker
        .enable_cluster(
            js(&format!(
                r#"{{"node":"{name}","incarnation":1,"region":"r-{name}","routeBatchMs":10}}"#
            )),
            T0,
        )
        .unwrap();
    h
}

/// Moves every frame waiting in `from`'s outputs to `to`; returns how many moved.
fn carry(from: &mut Harness, from_name: &str, to: &mut Harness, to_name: &str) -> usize {
    let mut moved = 0;
    let mut rest = Vec::new();
    for o in std::mem::take(&mut from.other) {
        let ty = get_str(&o, "type");
        let for_peer = ty == "broadcast" || (ty == "toPeer" && get_str(&o, "peer") == to_name);
        if for_peer {
            // Split each frame in two to exercise reassembly.
            let frame = bytes(&get(&o, "frame"));
            let (a, b) = frame.split_at(frame.len() / 2);
            for part in [a, b] {
                to.broker
                    .handle_peer_bytes(from_name.into(), u8array(part), to.now)
                    .unwrap();
            }
            to.pump();
            moved += 1;
        } else {
            rest.push(o);
        }
    }
    from.other = rest;
    moved
}

/// Runs both nodes' timers and carries frames until nothing moves.
fn settle(a: &mut Harness, b: &mut Harness) {
    for _ in 0..50 {
        a.now += 10.0;
        b.now += 10.0;
        a.broker.handle_timeout(a.now).unwrap();
        b.broker.handle_timeout(b.now).unwrap();
        a.pump();
        b.pump();
        let moved = carry(a, "a", b, "b") + carry(b, "b", a, "a");
        if moved == 0 && a.broker.poll_timeout().unwrap_or(f64::MAX) > a.now + 10.0 {
            return;
        }
    }
}

/// Nodes a and b, linked, with a client `sub` of a subscribed to `filter` at QoS 1 and the
/// route carried to b; returns them and the client's connection.
fn linked_with_subscriber(filter: &str) -> (Harness, Harness, f64) {
    let mut a = node("a");
    let mut b = node("b");
    a.broker.handle_peer_up("b".into(), a.now).unwrap();
    b.broker.handle_peer_up("a".into(), b.now).unwrap();
    let sub = a.connect("sub", 5);
    a.send(
        sub,
        &format!(
            r#"{{"type":"subscribe","packetId":1,"filters":[{{"filter":"{filter}","qos":1}}]}}"#
        ),
        5,
    );
    a.take(sub);
    settle(&mut a, &mut b);
    (a, b, sub)
}

#[wasm_bindgen_test]
fn a_message_published_on_one_node_reaches_a_subscriber_on_the_other() {
    let (mut a, mut b, sub) = linked_with_subscriber("world/#");
    let peers = array(&b.broker.peers());
    assert_eq!(get_str(&peers[0], "node"), "a");
    assert!(get_bool(&peers[0], "connected"));
    assert_eq!(get_num(&peers[0], "routes"), 1.0, "a's route reached b");

    let publisher = b.connect("pub", 4);
    b.send(
        publisher,
        r#"{"type":"publish","topic":"world/news","payload":"hello from b","qos":1,"packetId":5}"#,
        4,
    );
    assert_eq!(get_str(&b.take(publisher)[0], "type"), "puback");
    settle(&mut a, &mut b);
    let got = a.take(sub);
    let publish = got
        .iter()
        .find(|p| get_str(p, "type") == "publish")
        .expect("the forwarded message");
    assert_eq!(get_str(publish, "topic"), "world/news");
    assert_eq!(bytes(&get(publish, "payload")), b"hello from b");
}

#[wasm_bindgen_test]
fn a_congested_link_misses_qos0_forwards_until_drained() {
    let (mut a, mut b, sub) = linked_with_subscriber("w/#");
    let publisher = b.connect("pub", 5);
    let publish = |a: &mut Harness, b: &mut Harness, payload: &str| {
        b.send(
            publisher,
            &format!(r#"{{"type":"publish","topic":"w/x","payload":"{payload}"}}"#),
            5,
        );
        settle(a, b);
        a.take(sub)
            .iter()
            .map(|p| String::from_utf8(bytes(&get(p, "payload"))).unwrap())
            .collect::<Vec<_>>()
    };
    b.broker.handle_peer_congested("a".into(), b.now).unwrap();
    assert!(publish(&mut a, &mut b, "dropped").is_empty());
    assert_eq!(get_num(&b.broker.stats(), "droppedPeerCongested"), 1.0);
    b.broker.handle_peer_drained("a".into(), b.now).unwrap();
    assert_eq!(publish(&mut a, &mut b, "crossed"), vec!["crossed"]);
    assert!(
        b.broker
            .handle_peer_congested(JsValue::from(1), b.now)
            .is_err()
    );
}

#[wasm_bindgen_test]
fn a_node_that_left_is_forgotten_and_the_others_are_told() {
    let (_a, mut b, _) = linked_with_subscriber("w/#");
    assert!(
        b.broker.forget_peer("a".into(), b.now).is_err(),
        "a node whose link is up is not forgotten"
    );
    b.broker.handle_peer_down("a".into(), b.now).unwrap();
    let forgotten = b.broker.forget_peer("a".into(), b.now).unwrap();
    assert_eq!(get_num(&forgotten, "routes"), 1.0);
    assert_eq!(get_num(&forgotten, "droppedMessages"), 0.0);
    b.pump();
    assert!(array(&b.broker.peers()).is_empty());
    assert_eq!(get_num(&b.broker.stats(), "peersForgotten"), 1.0);
    assert!(
        b.other.iter().any(|o| get_str(o, "type") == "broadcast"),
        "the other nodes are told"
    );
    assert!(
        b.broker.forget_peer("a".into(), b.now).is_err(),
        "unknown now"
    );
}

#[wasm_bindgen_test]
fn peer_input_is_checked() {
    let mut a = node("a");
    let err = a
        .broker
        .handle_peer_bytes("b".into(), u8array(&[0, 0, 0, 1, 0xEE]), T0)
        .unwrap_err();
    assert!(
        message(&err).contains("malformed frame from peer b"),
        "{}",
        message(&err)
    );
    // The link is dropped; a fresh one starts from an empty buffer.
    a.broker.handle_peer_down("b".into(), T0).unwrap();
    assert!(a.broker.handle_peer_up(JsValue::from_str(""), T0).is_err());
    assert!(a.broker.handle_peer_up(JsValue::from(1), T0).is_err());
    let err = JsBroker::new(None, Some(T0), None)
        .unwrap()
        .enable_cluster(js(r#"{"node":"x","region":"r"}"#), T0)
        .unwrap_err();
    assert!(
        message(&err).contains("cluster.incarnation"),
        "{}",
        message(&err)
    );
    assert_eq!(
        array(&JsBroker::new(None, Some(T0), None).unwrap().peers()).len(),
        0
    );
}

#[wasm_bindgen_test]
fn a_route_set_at_its_bound_refuses_new_filters() {
    let mut h = Harness::with_broker(JsBroker::new(None, Some(T0), None).unwrap());
    h.broker
        .enable_cluster(
            js(r#"{"node":"edge-a","incarnation":1,"region":"r","maxRouteFilters":1}"#),
            T0,
        )
        .unwrap();
    let c = h.connect("c", 5);
    h.send(
        c,
        r#"{"type":"subscribe","packetId":1,"filters":[{"filter":"a/#","qos":1},{"filter":"b","qos":1},{"filter":"$share/g/a/#","qos":0}]}"#,
        5,
    );
    let codes: Vec<f64> = array(&get(&h.take(c)[0], "reasonCodes"))
        .iter()
        .filter_map(JsValue::as_f64)
        .collect();
    assert_eq!(codes, [1.0, 151.0, 0.0]);
}
