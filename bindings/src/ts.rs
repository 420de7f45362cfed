//! JS types named in the TypeScript declarations, for optional arguments (an `Option` of one of
//! these becomes `name?: Type | null` in the `.d.ts`). They are unchecked handles: the values
//! are validated where they are read, like every other `JsValue`.

use wasm_bindgen::prelude::*;

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(typescript_type = "BrokerConfig")]
    #[derive(Debug)]
    pub type BrokerConfigArg;

    #[wasm_bindgen(typescript_type = "BrokerHooks")]
    #[derive(Debug)]
    pub type BrokerHooksArg;

    #[wasm_bindgen(typescript_type = "ConnInfo")]
    #[derive(Debug)]
    pub type ConnInfoArg;

    #[wasm_bindgen(typescript_type = "any")]
    #[derive(Debug)]
    pub type AnyArg;

    #[wasm_bindgen(typescript_type = "ProtocolVersion")]
    #[derive(Debug)]
    pub type ProtocolVersionArg;
}

/// The value of an optional argument; `undefined` when it was left out.
pub(crate) fn arg<T: Into<JsValue>>(value: Option<T>) -> JsValue {
    value.map_or(JsValue::UNDEFINED, Into::into)
}
