//! Helpers for the wasm-bindgen tests: JS values from JSON, a broker on virtual time, and the
//! packets it sent, decoded.

#![allow(dead_code)]

use js_sys::{Array, Reflect, Uint8Array};
use meridian_wasm::{JsBroker, PacketDecoder, ProtocolVersionArg, decode_packet, encode_packet};
use wasm_bindgen::{JsCast, JsValue};

pub const T0: f64 = 1_700_000_000_000.0;

/// A JS value from JSON text.
pub fn js(json: &str) -> JsValue {
    js_sys::JSON::parse(json).unwrap_or_else(|e| panic!("bad test JSON {json}: {e:?}"))
}

/// A field of a JS object.
pub fn get(value: &JsValue, key: &str) -> JsValue {
    Reflect::get(value, &key.into()).expect("Reflect.get on a plain object")
}

pub fn get_str(value: &JsValue, key: &str) -> String {
    get(value, key)
        .as_string()
        .unwrap_or_else(|| panic!("{key} is not a string in {value:?}"))
}

pub fn get_num(value: &JsValue, key: &str) -> f64 {
    get(value, key)
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {value:?}"))
}

pub fn get_bool(value: &JsValue, key: &str) -> bool {
    get(value, key)
        .as_bool()
        .unwrap_or_else(|| panic!("{key} is not a boolean in {value:?}"))
}

pub fn version(v: u8) -> Option<ProtocolVersionArg> {
    Some(JsValue::from(v).unchecked_into())
}

pub fn bytes(value: &JsValue) -> Vec<u8> {
    value
        .dyn_ref::<Uint8Array>()
        .unwrap_or_else(|| panic!("not a Uint8Array: {value:?}"))
        .to_vec()
}

pub fn u8array(data: &[u8]) -> JsValue {
    Uint8Array::from(data).into()
}

/// The wire bytes of a packet given as JSON.
pub fn encode(json: &str, v: u8) -> JsValue {
    encode_packet(js(json), version(v)).unwrap_or_else(|e| panic!("encode {json}: {e:?}"))
}

pub fn decode(bytes: &JsValue, v: u8) -> JsValue {
    decode_packet(bytes.clone(), version(v)).unwrap_or_else(|e| panic!("decode: {e:?}"))
}

/// The message of a thrown JS error.
pub fn message(err: &JsValue) -> String {
    err.dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .unwrap_or_else(|| format!("{err:?}"))
}

pub fn array(value: &JsValue) -> Vec<JsValue> {
    value.unchecked_ref::<Array>().iter().collect()
}

/// A broker on virtual time, with one decoder per connection for what it sends.
pub struct Harness {
    pub broker: JsBroker,
    pub now: f64,
    pub decoders: Vec<(f64, PacketDecoder)>,
    /// Outputs other than `send`, in order.
    pub other: Vec<JsValue>,
    /// Connections the broker closed.
    pub closed: Vec<f64>,
    /// Packets the broker sent, with their connection, not yet taken.
    pub inbox: Vec<(f64, JsValue)>,
}

impl Harness {
    pub fn new(config: &str) -> Self {
        Self::with_broker(
            JsBroker::new(Some(js(config).unchecked_into()), Some(T0), None)
                .expect("broker from test config"),
        )
    }

    pub fn with_broker(broker: JsBroker) -> Self {
        Self {
            broker,
            now: T0,
            decoders: Vec::new(),
            other: Vec::new(),
            closed: Vec::new(),
            inbox: Vec::new(),
        }
    }

    pub fn accept(&mut self, v: u8) -> f64 {
        let conn = self.broker.accept(self.now, None).expect("accept");
        self.decoders
            .push((conn, PacketDecoder::new(version(v), None).expect("decoder")));
        conn
    }

    /// Accepts a connection, connects it as `client_id` and checks the CONNACK.
    pub fn connect(&mut self, client_id: &str, v: u8) -> f64 {
        self.connect_with(
            &format!(r#"{{"type":"connect","clientId":"{client_id}","protocolVersion":{v}}}"#),
            v,
        )
    }

    pub fn connect_with(&mut self, connect_json: &str, v: u8) -> f64 {
        let conn = self.accept(v);
        self.send(conn, connect_json, v);
        let got = self.take(conn);
        assert_eq!(got.len(), 1, "one CONNACK expected, got {got:?}");
        assert_eq!(get_str(&got[0], "type"), "connack");
        assert_eq!(get_num(&got[0], "reasonCode"), 0.0, "{:?}", got[0]);
        conn
    }

    /// Feeds a packet (JSON) from `conn` and drains the outputs.
    pub fn send(&mut self, conn: f64, json: &str, v: u8) {
        let data = encode(json, v);
        self.feed(conn, &data);
    }

    pub fn feed(&mut self, conn: f64, data: &JsValue) {
        self.broker
            .handle_bytes(conn, data.clone(), self.now)
            .expect("handleBytes");
        self.pump();
    }

    /// Drains every output: `send` bytes go to the connection's decoder, the rest is kept.
    pub fn pump(&mut self) {
        for out in array(&self.broker.drain()) {
            match get_str(&out, "type").as_str() {
                "send" => {
                    let conn = get_num(&out, "conn");
                    assert!(
                        !self.closed.contains(&conn),
                        "bytes sent to {conn} after its close"
                    );
                    self.received_raw(conn, &get(&out, "data"));
                }
                "close" => {
                    self.closed.push(get_num(&out, "conn"));
                    self.other.push(out);
                }
                _ => self.other.push(out),
            }
        }
    }

    fn received_raw(&mut self, conn: f64, data: &JsValue) {
        let (_, d) = self
            .decoders
            .iter_mut()
            .find(|(c, _)| *c == conn)
            .expect("send to an accepted connection");
        let packets = d.push(data.clone()).expect("broker sends valid packets");
        self.inbox
            .extend(array(&packets).into_iter().map(|p| (conn, p)));
    }

    /// Packets the broker sent to `conn` since the last call.
    pub fn take(&mut self, conn: f64) -> Vec<JsValue> {
        let (mine, rest) = std::mem::take(&mut self.inbox)
            .into_iter()
            .partition(|(c, _)| *c == conn);
        self.inbox = rest;
        mine.into_iter().map(|(_, p): (f64, JsValue)| p).collect()
    }

    /// Events seen since the last call, by `type`.
    pub fn events(&mut self) -> Vec<JsValue> {
        let events = self
            .other
            .iter()
            .filter(|o| get_str(o, "type") == "event")
            .map(|o| get(o, "event"))
            .collect();
        self.other.retain(|o| get_str(o, "type") != "event");
        events
    }

    /// Advances virtual time to the next deadline and fires it.
    pub fn fire_timeout(&mut self) {
        let at = self.broker.poll_timeout().expect("a deadline");
        self.now = self.now.max(at);
        self.broker.handle_timeout(self.now).expect("handleTimeout");
        self.pump();
    }
}
