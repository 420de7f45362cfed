//! Meridian's sans-IO MQTT broker for JavaScript, through WebAssembly.
//!
//! The JS API mirrors the drive loop of [`meridian_core`]: create a [`Broker`](broker::JsBroker)
//! from a config object, `accept()` connections, feed them bytes and the time, drain the outputs
//! (bytes to send per connection, closes, records to persist, events), and read the next
//! deadline; in a deployment of several nodes, carry link frames between peers too. Alongside:
//! the MQTT codec on plain objects ([`encodePacket`](packet::encode_packet),
//! [`decodePacket`](packet::decode_packet), [`packet::PacketDecoder`]), topic
//! validation, and a [`topic::TopicMatcher`] over the core's subscription trie.
//!
//! Every value from JavaScript is checked: bad input throws a `TypeError` or `RangeError` naming
//! the field, a malformed MQTT packet an `Error` with its `reasonCode`. Nothing JS passes in can
//! panic (a panic is a wasm trap that leaves the instance unusable).
//!
//! The TypeScript declarations of the objects exchanged are in `src/types.d.ts`, appended to the
//! generated `.d.ts`.

mod broker;
mod cluster;
mod config;
mod glue;
mod hooks;
mod js;
mod output;
mod packet;
mod topic;
mod ts;

use wasm_bindgen::prelude::*;

pub use broker::JsBroker;
pub use packet::{PacketDecoder, decode_packet, encode_packet};
pub use topic::{
    TopicMatcher, is_valid_topic_filter, is_valid_topic_name, topic_matches, validate_topic_filter,
    validate_topic_name,
};
pub use ts::{AnyArg, BrokerConfigArg, BrokerHooksArg, ConnInfoArg, ProtocolVersionArg};

#[wasm_bindgen(typescript_custom_section)]
const TYPES: &str = include_str!("types.d.ts");

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_namespace = console, js_name = error)]
    fn console_error(message: &str);
}

/// Runs when the module is instantiated: a panic (a bug, never bad input) is reported on the
/// console with its message before the trap, instead of a bare `unreachable`.
#[wasm_bindgen(start, skip_typescript)]
fn start() {
    std::panic::set_hook(Box::new(|info| {
        console_error(&format!(
            "meridian-mqtt-wasm: internal error (please report): {info}"
        ));
    }));
}

/// The version of this package (and of the `meridian-mqtt-core` inside it).
#[wasm_bindgen]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}

/// The name of an MQTT 5.0 reason code, e.g. `reasonName(0x87)` is `"not authorized"`.
#[wasm_bindgen(js_name = reasonName)]
pub fn reason_name(code: f64) -> Result<String, JsValue> {
    let code = js::uint(&code.into(), 255, "code")? as u8;
    Ok(meridian_core::codec::ReasonCode(code).name().to_owned())
}
