//! Small JavaScript helpers the Rust code calls for speed: plain objects built by JS itself
//! (object literals get V8's fast shapes), and property stores without `Reflect.set`'s
//! exception wrapper. Measured on the drive loop (Node 20, 10 subscribers): building outputs
//! through `Reflect.set` with keys decoded from UTF-8 each time cost ~25 µs per output, and one
//! `ArrayBuffer` per `send` ~3 µs; `drain()` puts all of its sends in one.

use wasm_bindgen::prelude::*;

#[wasm_bindgen(inline_js = r#"
export function set_prop(obj, key, value) { obj[key] = value; }
export function send_output(conn, view) { return { type: "send", conn, data: view.slice() }; }
export function copy_bytes(view) { return view.slice(); }
export function send_output_in(conn, all, start, end) {
  return { type: "send", conn, data: all.subarray(start, end) };
}
export function close_output(conn) { return { type: "close", conn }; }
"#)]
extern "C" {
    /// `obj[key] = value` on a plain object this crate created (cannot throw).
    pub(crate) fn set_prop(obj: &JsValue, key: &JsValue, value: &JsValue);
    /// `{ type: "send", conn, data }` with a copy of `view` (a view of wasm memory).
    pub(crate) fn send_output(conn: f64, view: &[u8]) -> JsValue;
    /// A JS copy of `view` (a view of wasm memory).
    pub(crate) fn copy_bytes(view: &[u8]) -> js_sys::Uint8Array;
    /// `{ type: "send", conn, data }` with `data` a view of `all[start..end]`.
    pub(crate) fn send_output_in(
        conn: f64,
        all: &js_sys::Uint8Array,
        start: u32,
        end: u32,
    ) -> JsValue;
    /// `{ type: "close", conn }`.
    pub(crate) fn close_output(conn: f64) -> JsValue;
}
