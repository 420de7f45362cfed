//! `encodePacket`, `decodePacket`, `PacketDecoder`, topic validation and `TopicMatcher`, run
//! under Node by wasm-bindgen-test.

#![cfg(target_arch = "wasm32")]

mod common;

use common::*;
use meridian_wasm::{
    AnyArg, PacketDecoder, TopicMatcher, decode_packet, encode_packet, is_valid_topic_filter,
    is_valid_topic_name, reason_name, topic_matches, validate_topic_filter, validate_topic_name,
};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_test::wasm_bindgen_test;

/// One packet of every type, with most optional fields set, as JSON.
const PACKETS: &[&str] = &[
    r#"{"type":"connect","protocolVersion":5,"cleanStart":false,"keepAlive":30,"clientId":"c",
        "username":"u","password":"p",
        "will":{"topic":"w","payload":"bye","qos":1,"retain":true,
                "properties":{"willDelayInterval":5,"contentType":"text/plain",
                              "userProperties":[["k","v"]]}},
        "properties":{"sessionExpiryInterval":60,"receiveMaximum":10,"maximumPacketSize":1000,
                      "topicAliasMaximum":4,"requestProblemInformation":false,
                      "userProperties":[["a","1"],["a","2"]],
                      "authenticationMethod":"m","authenticationData":"d"}}"#,
    r#"{"type":"connect","protocolVersion":4,"cleanStart":true,"keepAlive":0,"clientId":"",
        "properties":{}}"#,
    r#"{"type":"connack","sessionPresent":true,"reasonCode":0,
        "properties":{"assignedClientIdentifier":"x","maximumQos":1,"retainAvailable":false,
                      "serverKeepAlive":20,"reasonString":"ok"}}"#,
    r#"{"type":"publish","topic":"a/b","payload":"hi","qos":2,"retain":true,"dup":true,
        "packetId":7,"properties":{"messageExpiryInterval":9,"topicAlias":3,
        "responseTopic":"r","correlationData":"c","subscriptionIdentifiers":[1,2],
        "payloadFormatIndicator":1,"contentType":"t","userProperties":[["x","y"]]}}"#,
    r#"{"type":"publish","topic":"a","payload":"","qos":0,"retain":false,"dup":false,
        "properties":{}}"#,
    r#"{"type":"puback","packetId":1,"reasonCode":16,"properties":{"reasonString":"none"}}"#,
    r#"{"type":"pubrec","packetId":2,"reasonCode":0,"properties":{}}"#,
    r#"{"type":"pubrel","packetId":3,"reasonCode":146,"properties":{}}"#,
    r#"{"type":"pubcomp","packetId":4,"reasonCode":0,"properties":{}}"#,
    r#"{"type":"subscribe","packetId":5,"filters":[
        {"filter":"a/+","qos":1,"noLocal":true,"retainAsPublished":true,"retainHandling":2},
        {"filter":"$share/g/b/#","qos":0,"noLocal":false,"retainAsPublished":false,
         "retainHandling":0}],
        "properties":{"subscriptionIdentifier":42}}"#,
    r#"{"type":"suback","packetId":5,"reasonCodes":[1,128],"properties":{}}"#,
    r#"{"type":"unsubscribe","packetId":6,"filters":["a/+","b"],
        "properties":{"userProperties":[["u","v"]]}}"#,
    r#"{"type":"unsuback","packetId":6,"reasonCodes":[0,17],"properties":{}}"#,
    r#"{"type":"pingreq"}"#,
    r#"{"type":"pingresp"}"#,
    r#"{"type":"disconnect","reasonCode":4,
        "properties":{"sessionExpiryInterval":0,"serverReference":"elsewhere"}}"#,
    r#"{"type":"auth","reasonCode":24,
        "properties":{"authenticationMethod":"SCRAM","authenticationData":"abc"}}"#,
];

/// Encodes, decodes, and encodes the decoded object again: same bytes, same object.
#[wasm_bindgen_test]
fn every_packet_round_trips_through_plain_objects() {
    for json in PACKETS {
        let v = if json.contains(r#""protocolVersion":4"#) {
            4
        } else {
            5
        };
        let wire = bytes(&encode(json, v));
        let decoded = decode(&u8array(&wire), v);
        let again = encode_packet(decoded.clone(), version(v)).unwrap();
        assert_eq!(bytes(&again), wire, "{json}");
        // Same object back, binary fields as Uint8Array.
        let text = js_sys::JSON::stringify(&decoded).unwrap();
        let expected = js_sys::JSON::stringify(&decode(&again, v)).unwrap();
        assert_eq!(String::from(text), String::from(expected));
        assert_eq!(
            get_str(&decoded, "type"),
            get_str(&js(json), "type"),
            "{json}"
        );
    }
}

#[wasm_bindgen_test]
fn v311_drops_v5_only_fields() {
    let wire = encode(
        r#"{"type":"puback","packetId":1,"reasonCode":0,"properties":{"reasonString":"x"}}"#,
        4,
    );
    assert_eq!(bytes(&wire), [0x40, 2, 0, 1]);
    let p = decode(&wire, 4);
    assert_eq!(get_num(&p, "packetId"), 1.0);
    // Defaults fill what is left out.
    let connect = decode(&encode(r#"{"type":"connect"}"#, 4), 4);
    assert_eq!(get_num(&connect, "protocolVersion"), 4.0);
    assert_eq!(get_num(&connect, "keepAlive"), 60.0);
    assert!(get_bool(&connect, "cleanStart"));
    // MQTT.js-style user properties are accepted.
    let p = decode(
        &encode(
            r#"{"type":"publish","topic":"t","properties":{"userProperties":{"a":"1","b":["2","3"]}}}"#,
            5,
        ),
        5,
    );
    let props = js_sys::JSON::stringify(&get(&get(&p, "properties"), "userProperties")).unwrap();
    assert_eq!(String::from(props), r#"[["a","1"],["b","2"],["b","3"]]"#);
}

#[wasm_bindgen_test]
fn encode_errors_name_the_field() {
    let cases = [
        (
            r#"{"type":"publish"}"#,
            "publish.topic: required field is missing",
        ),
        (r#"{"type":"publish","topic":"t","qos":3}"#, "publish.qos"),
        (
            r#"{"type":"publish","topic":"t","colour":1}"#,
            "unknown field 'colour'",
        ),
        (
            r#"{"type":"publish","topic":"t","properties":{"topicAlias":70000}}"#,
            "publish.properties.topicAlias",
        ),
        (
            r#"{"type":"publish","topic":"t","qos":1}"#,
            "packet identifier",
        ),
        (
            r#"{"type":"subscribe","packetId":1,"filters":[]}"#,
            "at least one",
        ),
        (
            r#"{"type":"subscribe","packetId":1,"filters":[7]}"#,
            "subscribe.filters[0]",
        ),
        (r#"{"type":"auth"}"#, "MQTT 3.1.1"),
        (r#"{"type":"launch"}"#, "unknown type 'launch'"),
        (r#"{"cmd":"publish"}"#, "'type' field"),
        ("null", "'type' field"),
        (
            r#"{"type":"unsubscribe","packetId":1,"filters":["a"],"properties":{"userProperties":[["a"]]}}"#,
            "[name, value] pair",
        ),
    ];
    for (json, needle) in cases {
        let v = if json.contains("auth") { 4 } else { 5 };
        let err = encode_packet(js(json), version(v)).unwrap_err();
        assert!(
            err.is_instance_of::<js_sys::Error>(),
            "{json}: not an Error: {err:?}"
        );
        let msg = message(&err);
        assert!(msg.contains(needle), "{json}: {msg:?} lacks {needle:?}");
    }
    let err = encode_packet(js(r#"{"type":"pingreq"}"#), version(3)).unwrap_err();
    assert!(message(&err).contains("expected 4 (MQTT 3.1.1) or 5"));
}

#[wasm_bindgen_test]
fn decode_errors_carry_the_reason_code() {
    let cases: [(&[u8], &str); 4] = [
        (&[0x40, 1, 0], "malformed"),
        (&[0x30, 5, 0, 1], "incomplete"),
        (&[0xC0, 0, 0xC0, 0], "left over"),
        (&[0x00, 0], "malformed"),
    ];
    for (wire, needle) in cases {
        let err = decode_packet(u8array(wire), version(5)).unwrap_err();
        let msg = message(&err);
        assert!(msg.contains(needle), "{wire:?}: {msg}");
    }
    let err = decode_packet(u8array(&[0x40, 1, 0]), version(5)).unwrap_err();
    assert_eq!(get_num(&err, "reasonCode"), 0x81 as f64);
    let err = decode_packet(JsValue::from(5), version(5)).unwrap_err();
    assert!(err.is_instance_of::<js_sys::TypeError>());
}

/// Every packet, fed to a `PacketDecoder` split at every byte boundary.
#[wasm_bindgen_test]
fn packet_decoder_handles_every_split() {
    let v = 5;
    let mut stream = Vec::new();
    let mut expected = Vec::new();
    for json in PACKETS
        .iter()
        .filter(|j| !j.contains(r#""protocolVersion""#))
    {
        let wire = bytes(&encode(json, v));
        expected.push(js_sys::JSON::stringify(&decode(&u8array(&wire), v)).unwrap());
        stream.extend_from_slice(&wire);
    }
    for split in 0..=stream.len() {
        let mut d = PacketDecoder::new(version(v), None).unwrap();
        let mut got = array(&d.push(u8array(&stream[..split])).unwrap());
        got.extend(array(&d.push(u8array(&stream[split..])).unwrap()));
        assert_eq!(d.buffered(), 0);
        let got: Vec<_> = got
            .iter()
            .map(|p| js_sys::JSON::stringify(p).unwrap())
            .collect();
        assert_eq!(got, expected, "split at {split}");
    }
}

#[wasm_bindgen_test]
fn packet_decoder_limits_and_poisoning() {
    let mut d = PacketDecoder::new(version(5), Some(10.0)).unwrap();
    // A PUBLISH announcing 200 bytes is refused from its fixed header alone.
    let err = d.push(u8array(&[0xC0, 0, 0x30, 0xC8, 0x01])).unwrap_err();
    assert_eq!(get_num(&err, "reasonCode"), 0x95 as f64);
    assert_eq!(
        array(&get(&err, "packets")).len(),
        1,
        "the PINGREQ before it"
    );
    assert!(d.push(u8array(&[0xC0, 0])).is_err(), "stays failed");

    // A CONNECT switches the decoder to its version.
    let mut d = PacketDecoder::new(version(5), None).unwrap();
    let connect = bytes(&encode(r#"{"type":"connect","protocolVersion":4}"#, 4));
    d.push(u8array(&connect)).unwrap();
    assert_eq!(d.version(), 4);
    assert!(PacketDecoder::new(version(5), Some(-1.0)).is_err());
}

#[wasm_bindgen_test]
fn topic_validation() {
    assert!(is_valid_topic_name("a/b".into()));
    assert!(!is_valid_topic_name("a/+".into()));
    assert!(!is_valid_topic_name("".into()));
    assert!(!is_valid_topic_name(JsValue::UNDEFINED));
    assert!(is_valid_topic_filter("a/+/#".into()));
    assert!(!is_valid_topic_filter("a/#/b".into()));
    assert!(!is_valid_topic_filter("$share/g".into()));

    validate_topic_name("sport/tennis".into()).unwrap();
    let err = validate_topic_name("a\u{0}b".into()).unwrap_err();
    assert!(err.is_instance_of::<js_sys::TypeError>());
    assert!(
        message(&err).contains("null character"),
        "{}",
        message(&err)
    );
    let err = validate_topic_name(JsValue::from(1)).unwrap_err();
    assert!(message(&err).contains("expected a string"));

    let info = validate_topic_filter("$share/group/a/+".into()).unwrap();
    assert_eq!(get_str(&info, "pattern"), "a/+");
    assert_eq!(get_str(&info, "shareGroup"), "group");
    assert!(get_bool(&info, "hasWildcards"));
    let info = validate_topic_filter("plain".into()).unwrap();
    assert!(get(&info, "shareGroup").is_null());
    let err = validate_topic_filter("a+".into()).unwrap_err();
    assert!(
        message(&err).contains("misplaced wildcard"),
        "{}",
        message(&err)
    );

    assert!(topic_matches("a/#".into(), "a".into()).unwrap());
    assert!(!topic_matches("+/x".into(), "$SYS/x".into()).unwrap());
    assert!(topic_matches("a/#".into(), "a/+".into()).is_err());
    assert_eq!(reason_name(0x87 as f64).unwrap(), "not authorized");
    assert!(reason_name(256.0).is_err());
}

fn any(v: impl Into<JsValue>) -> Option<AnyArg> {
    Some(v.into().unchecked_into())
}

/// The trie-backed matcher agrees with `topicMatches` (the core's naive matcher) on every pair.
#[wasm_bindgen_test]
fn topic_matcher_agrees_with_the_naive_matcher() {
    let filters = [
        "#",
        "+",
        "+/+",
        "a",
        "a/#",
        "a/+",
        "a/b",
        "a/+/c",
        "+/b/#",
        "a/b/c/#",
        "$SYS/#",
        "$SYS/+",
        "+/#",
        "/+",
        "a//b",
        "$share/g/a/+",
        "$share/h/a/+",
    ];
    let topics = [
        "a", "a/b", "a/b/c", "a/x/c", "b", "x/b/y", "$SYS/up", "$SYS", "/a", "a//b", "a/b/c/d",
    ];
    let mut m = TopicMatcher::new();
    for f in filters {
        assert!(m.add(f.into(), None).unwrap().is_undefined());
    }
    assert_eq!(m.size(), filters.len());
    for t in topics {
        let mut got: Vec<String> = array(&m.match_topic(t.into()).unwrap())
            .iter()
            .map(|v| v.as_string().unwrap())
            .collect();
        got.sort();
        let mut want: Vec<String> = filters
            .iter()
            .filter(|f| topic_matches((**f).into(), t.into()).unwrap())
            .map(|f| f.to_string())
            .collect();
        want.sort();
        assert_eq!(got, want, "topic {t}");
        assert_eq!(m.matches_any(t.into()), !want.is_empty());
    }
}

#[wasm_bindgen_test]
fn topic_matcher_values_replace_and_remove() {
    let mut m = TopicMatcher::new();
    assert!(m.add("a/+".into(), any(1)).unwrap().is_undefined());
    assert_eq!(m.add("a/+".into(), any(2)).unwrap().as_f64(), Some(1.0));
    m.add("$share/g/a/+".into(), any(3)).unwrap();
    assert_eq!(m.size(), 2);
    let mut got: Vec<f64> = array(&m.match_topic("a/x".into()).unwrap())
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    got.sort_by(f64::total_cmp);
    assert_eq!(got, [2.0, 3.0]);
    assert_eq!(m.get("a/+".into()).as_f64(), Some(2.0));
    assert!(m.has("$share/g/a/+".into()));
    assert!(!m.has("a/#".into()));
    assert_eq!(m.remove("a/+".into()).unwrap().as_f64(), Some(2.0));
    assert!(m.remove("a/+".into()).unwrap().is_undefined());
    assert_eq!(m.size(), 1);
    let filters = array(&m.match_filters("a/x".into()).unwrap());
    assert_eq!(filters[0].as_string().unwrap(), "$share/g/a/+");
    let entries = array(&m.entries());
    assert_eq!(entries.len(), 1);
    assert!(m.add("a/#/b".into(), None).is_err());
    assert!(m.match_topic("a/#".into()).is_err());
    m.clear();
    assert_eq!(m.size(), 0);
    assert_eq!(array(&m.match_topic("a/x".into()).unwrap()).len(), 0);
}
