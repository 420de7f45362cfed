//! The MQTT codec for JavaScript: any packet to and from plain objects.

mod from_js;
mod to_js;

use bytes::BytesMut;
use meridian_core::codec::{self, DecodeError, ProtocolVersion};
use wasm_bindgen::prelude::*;

use crate::js;
use crate::ts::{ProtocolVersionArg, arg};

pub(crate) use from_js::{publish_properties, qos};
pub(crate) use to_js::version as version_level;

/// A JS `Error` for a decode failure, with the MQTT reason code as `reasonCode`.
fn decode_error(e: &DecodeError) -> JsValue {
    let err = js_sys::Error::new(&format!("malformed MQTT packet: {e}"));
    // A fresh Error object: setting a data property cannot fail.
    let _ = js_sys::Reflect::set(&err, &"reasonCode".into(), &e.reason.0.into());
    err.into()
}

/// Encodes a packet object (`{ type: "publish", topic, payload, qos, ... }`) into its wire
/// bytes for protocol `version` (4 = MQTT 3.1.1, 5 = MQTT 5.0; default 5). MQTT 5.0-only
/// fields are left out for 3.1.1. Throws a `TypeError`/`RangeError` naming the field for a
/// malformed object, an `Error` for a packet the protocol does not allow.
#[wasm_bindgen(js_name = encodePacket, unchecked_return_type = "Uint8Array")]
pub fn encode_packet(
    #[wasm_bindgen(unchecked_param_type = "PacketInput")] packet: JsValue,
    version: Option<ProtocolVersionArg>,
) -> Result<JsValue, JsValue> {
    let version = from_js::version(&arg(version), "version")?;
    let packet = from_js::packet(&packet, version)?;
    let mut out = BytesMut::new();
    codec::encode(&packet, version, &mut out).map_err(|e| {
        js::error(&format!(
            "cannot encode {} for MQTT {}: {e}",
            packet.name(),
            version_name(version)
        ))
    })?;
    Ok(js::u8array(&out))
}

/// Decodes exactly one whole packet from `bytes` as protocol `version` (default 5; a CONNECT
/// is read in whatever version it names). Throws an `Error` with a `reasonCode` property if the
/// bytes are malformed, incomplete, or hold more than one packet.
#[wasm_bindgen(js_name = decodePacket, unchecked_return_type = "Packet")]
pub fn decode_packet(
    #[wasm_bindgen(unchecked_param_type = "Uint8Array")] bytes: JsValue,
    version: Option<ProtocolVersionArg>,
) -> Result<JsValue, JsValue> {
    let version = from_js::version(&arg(version), "version")?;
    let mut buf = BytesMut::new();
    js::append_bytes(&bytes, &mut buf, "bytes")?;
    let len = buf.len();
    match codec::decode(&mut buf, version, u32::MAX) {
        Err(e) => Err(decode_error(&e)),
        Ok(None) => Err(js::error(&format!(
            "incomplete MQTT packet: {len} bytes do not hold a whole packet"
        ))),
        Ok(Some(_)) if !buf.is_empty() => Err(js::error(&format!(
            "{} bytes left over after the first packet; use PacketDecoder for a stream",
            buf.len()
        ))),
        Ok(Some(packet)) => Ok(to_js::packet(&packet)),
    }
}

/// A streaming decoder: push bytes as they arrive, get back every packet completed so far.
///
/// After a CONNECT it decodes in the CONNECT's protocol version, as a broker would. After a
/// decode error it throws on every call (the stream cannot be resynchronised).
#[wasm_bindgen]
#[derive(Debug)]
pub struct PacketDecoder {
    buf: BytesMut,
    version: ProtocolVersion,
    max_packet_size: u32,
    failed: Option<DecodeError>,
}

#[wasm_bindgen]
impl PacketDecoder {
    /// `version`: 4 or 5 (default 5). `maxPacketSize`: largest accepted packet in bytes,
    /// checked as soon as its fixed header is readable (default: MQTT's own limit).
    #[wasm_bindgen(constructor)]
    pub fn new(
        version: Option<ProtocolVersionArg>,
        #[wasm_bindgen(js_name = maxPacketSize)] max_packet_size: Option<f64>,
    ) -> Result<PacketDecoder, JsValue> {
        let max_packet_size = match max_packet_size {
            Some(n) => js::uint(&n.into(), u32::MAX.into(), "maxPacketSize")? as u32,
            None => u32::MAX,
        };
        Ok(Self {
            buf: BytesMut::new(),
            version: from_js::version(&arg(version), "version")?,
            max_packet_size,
            failed: None,
        })
    }

    /// Appends `bytes` and returns the packets now complete, in order. On malformed input it
    /// throws an `Error` with `reasonCode` and `packets` (those completed before the bad one).
    #[wasm_bindgen(unchecked_return_type = "Packet[]")]
    pub fn push(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "Uint8Array")] bytes: JsValue,
    ) -> Result<JsValue, JsValue> {
        if let Some(e) = &self.failed {
            return Err(decode_error(e));
        }
        js::append_bytes(&bytes, &mut self.buf, "bytes")?;
        let out = js_sys::Array::new();
        loop {
            match codec::decode(&mut self.buf, self.version, self.max_packet_size) {
                Ok(Some(packet)) => {
                    if let codec::Packet::Connect(c) = &packet {
                        self.version = c.protocol;
                    }
                    out.push(&to_js::packet(&packet));
                }
                Ok(None) => return Ok(out.into()),
                Err(e) => {
                    let err = decode_error(&e);
                    // The packets completed before the bad one still count.
                    let _ = js_sys::Reflect::set(&err, &"packets".into(), &out);
                    self.buf.clear();
                    self.failed = Some(e);
                    return Err(err);
                }
            }
        }
    }

    /// Bytes received but not yet part of a whole packet.
    #[wasm_bindgen(getter)]
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The protocol version packets are decoded in (4 or 5).
    #[wasm_bindgen(getter, unchecked_return_type = "ProtocolVersion")]
    pub fn version(&self) -> u8 {
        self.version.level()
    }
}

pub(crate) fn version_name(v: ProtocolVersion) -> &'static str {
    match v {
        ProtocolVersion::V311 => "3.1.1",
        ProtocolVersion::V5 => "5.0",
    }
}
