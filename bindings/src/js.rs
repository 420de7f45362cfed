//! Reading plain JS objects into Rust values and building them back, with errors that name the
//! offending field.
//!
//! Everything that comes from JavaScript is checked here: wrong types and out-of-range numbers
//! become `TypeError`/`RangeError` exceptions naming the field (`publish.properties.topicAlias`),
//! never a panic (a panic in wasm is a trap that poisons the instance).

use bytes::{Bytes, BytesMut};
use js_sys::{Array, ArrayBuffer, Object, Reflect, Uint8Array};
use std::cell::RefCell;

use wasm_bindgen::{JsCast, JsValue};

use crate::glue;

/// A JS `Error` with `message`.
pub(crate) fn error(message: &str) -> JsValue {
    js_sys::Error::new(message).into()
}

/// A JS `TypeError`: a value of the wrong type.
pub(crate) fn type_error(message: &str) -> JsValue {
    js_sys::TypeError::new(message).into()
}

/// A JS `RangeError`: a number or size out of its allowed range.
pub(crate) fn range_error(message: &str) -> JsValue {
    js_sys::RangeError::new(message).into()
}

thread_local! {
    /// Property names as JS strings, made once: decoding a key from UTF-8 for every property
    /// set was the largest cost of building outputs.
    static KEYS: RefCell<Vec<(&'static str, JsValue)>> = const { RefCell::new(Vec::new()) };
}

/// The JS string for a property name (all names are literals of this crate: a few dozen).
fn key(name: &'static str) -> JsValue {
    KEYS.with(|keys| {
        let mut keys = keys.borrow_mut();
        if let Some((_, k)) = keys
            .iter()
            .find(|(n, _)| std::ptr::eq(*n, name) || *n == name)
        {
            return k.clone();
        }
        let k = JsValue::from_str(name);
        keys.push((name, k.clone()));
        k
    })
}

/// Sets `key` on `target`, a plain object this crate created (so it cannot throw).
fn set(target: &JsValue, name: &'static str, value: &JsValue) {
    glue::set_prop(target, &key(name), value);
}

/// A short description of a JS value's type, for error messages.
pub(crate) fn describe(value: &JsValue) -> String {
    if value.is_null() {
        "null".into()
    } else if Array::is_array(value) {
        "an array".into()
    } else if value.is_instance_of::<Uint8Array>() {
        "a Uint8Array".into()
    } else {
        let ty = value.js_typeof().as_string().unwrap_or_default();
        match ty.as_str() {
            "number" => format!("the number {}", show(value.as_f64().unwrap_or(f64::NAN))),
            "string" => "a string".into(),
            "object" => "an object".into(),
            other => format!("a value of type {other}"),
        }
    }
}

/// Whether `value` is `undefined` or `null`: an absent optional field.
pub(crate) fn is_absent(value: &JsValue) -> bool {
    value.is_undefined() || value.is_null()
}

/// A non-negative integer up to `max`, from a JS number.
pub(crate) fn uint(value: &JsValue, max: u64, what: &str) -> Result<u64, JsValue> {
    let Some(n) = value.as_f64() else {
        return Err(type_error(&format!(
            "{what}: expected an integer, got {}",
            describe(value)
        )));
    };
    // `max` is at most 2^53 - 1 here, so the comparison in f64 is exact.
    if !(n.is_finite() && n.fract() == 0.0 && n >= 0.0 && n <= max as f64) {
        return Err(range_error(&format!(
            "{what}: expected an integer in 0..={max}, got {}",
            show(n)
        )));
    }
    Ok(n as u64)
}

/// Milliseconds since the epoch, as passed by the shell (`Date.now()`). Fractions (as from
/// `performance.timeOrigin + performance.now()`) are truncated.
pub(crate) fn millis(value: f64, what: &str) -> Result<u64, JsValue> {
    if !(value.is_finite() && value >= 0.0 && value <= MAX_SAFE_INTEGER as f64) {
        return Err(range_error(&format!(
            "{what}: expected milliseconds since the epoch (a non-negative finite number), got {}",
            show(value)
        )));
    }
    Ok(value as u64)
}

/// A number as JavaScript prints it (`String(n)`). Formatting floats in Rust would link its
/// float-printing code into the wasm (~15 KB) for error messages alone.
pub(crate) fn show(n: f64) -> String {
    js_sys::Number::from(n)
        .to_string_with_radix(10)
        .map(String::from)
        .unwrap_or_default()
}

/// Largest integer a JS number holds exactly.
pub(crate) const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// A u64 as a JS number. Counters and ids stay far below 2^53 in practice; beyond it the value
/// loses precision rather than wrapping.
pub(crate) fn num(n: u64) -> JsValue {
    JsValue::from_f64(n as f64)
}

/// Bytes from a `Uint8Array` (a Node `Buffer` is one), an `ArrayBuffer`, or a string (UTF-8).
pub(crate) fn bytes(value: &JsValue, what: &str) -> Result<Bytes, JsValue> {
    if let Some(a) = value.dyn_ref::<Uint8Array>() {
        Ok(Bytes::from(a.to_vec()))
    } else if let Some(s) = value.as_string() {
        Ok(Bytes::from(s.into_bytes()))
    } else if let Some(b) = value.dyn_ref::<ArrayBuffer>() {
        Ok(Bytes::from(Uint8Array::new(b).to_vec()))
    } else {
        Err(type_error(&format!(
            "{what}: expected a Uint8Array, an ArrayBuffer or a string, got {}",
            describe(value)
        )))
    }
}

/// The bytes of a `Uint8Array` (a Node `Buffer` is one) or an `ArrayBuffer`, as a view.
fn byte_view(value: &JsValue, what: &str) -> Result<Uint8Array, JsValue> {
    if let Some(a) = value.dyn_ref::<Uint8Array>() {
        Ok(a.clone())
    } else if let Some(b) = value.dyn_ref::<ArrayBuffer>() {
        Ok(Uint8Array::new(b))
    } else {
        Err(type_error(&format!(
            "{what}: expected a Uint8Array or an ArrayBuffer, got {}",
            describe(value)
        )))
    }
}

/// Copies the bytes of a `Uint8Array` or `ArrayBuffer` into `buf` (cleared first), reusing its
/// allocation.
pub(crate) fn bytes_into(value: &JsValue, buf: &mut Vec<u8>, what: &str) -> Result<(), JsValue> {
    let a = byte_view(value, what)?;
    buf.clear();
    buf.resize(a.length() as usize, 0);
    a.copy_to(buf);
    Ok(())
}

/// Appends the bytes of a `Uint8Array` or `ArrayBuffer` to `buf`.
pub(crate) fn append_bytes(value: &JsValue, buf: &mut BytesMut, what: &str) -> Result<(), JsValue> {
    let a = byte_view(value, what)?;
    let start = buf.len();
    buf.resize(start + a.length() as usize, 0);
    a.copy_to(&mut buf[start..]);
    Ok(())
}

/// A JS `Uint8Array` holding a copy of `data`.
pub(crate) fn u8array(data: &[u8]) -> JsValue {
    Uint8Array::from(data).into()
}

/// A JS array of the given values.
pub(crate) fn array<T: Into<JsValue>>(items: impl IntoIterator<Item = T>) -> JsValue {
    let out = Array::new();
    for item in items {
        out.push(&item.into());
    }
    out.into()
}

/// The elements of a JS array, or a `TypeError` naming `what`.
pub(crate) fn elements(value: &JsValue, what: &str) -> Result<Vec<JsValue>, JsValue> {
    if !Array::is_array(value) {
        return Err(type_error(&format!(
            "{what}: expected an array, got {}",
            describe(value)
        )));
    }
    Ok(value.unchecked_ref::<Array>().iter().collect())
}

/// Builds a plain JS object field by field.
pub(crate) struct Obj(JsValue);

impl Obj {
    pub(crate) fn new() -> Self {
        Self(Object::new().into())
    }

    /// An object whose `type` field is `ty`: the tag of every union this crate returns.
    pub(crate) fn tagged(ty: &'static str) -> Self {
        let obj = Self::new();
        obj.set("type", key(ty));
        obj
    }

    pub(crate) fn set(&self, key: &'static str, value: impl Into<JsValue>) -> &Self {
        set(&self.0, key, &value.into());
        self
    }

    /// Sets `key` only if `value` is present: absent fields are left out, not `undefined`.
    /// Like [`Obj::set`], for a name made at run time (not interned: for rare objects).
    pub(crate) fn set_named(&self, key: &str, value: impl Into<JsValue>) -> &Self {
        glue::set_prop(&self.0, &JsValue::from_str(key), &value.into());
        self
    }

    pub(crate) fn opt(&self, key: &'static str, value: Option<impl Into<JsValue>>) -> &Self {
        if let Some(v) = value {
            self.set(key, v);
        }
        self
    }

    /// Sets `key` to a copy of `data` as a `Uint8Array`, if present.
    pub(crate) fn opt_bytes(&self, key: &'static str, data: Option<&Bytes>) -> &Self {
        self.opt(key, data.map(|d| u8array(d)))
    }

    pub(crate) fn into_js(self) -> JsValue {
        self.0
    }
}

/// Reads the fields of a plain JS object, remembering which names it knows so that
/// [`Fields::finish`] can refuse the ones it does not (a typo is an error, not a silent default).
pub(crate) struct Fields {
    obj: JsValue,
    path: String,
    known: Vec<String>,
}

impl Fields {
    /// `value` must be an object (not `null`, not an array). `path` names it in errors.
    pub(crate) fn new(value: &JsValue, path: impl Into<String>) -> Result<Self, JsValue> {
        let path = path.into();
        if !value.is_object() || value.is_null() || Array::is_array(value) {
            return Err(type_error(&format!(
                "{path}: expected an object, got {}",
                describe(value)
            )));
        }
        Ok(Self {
            obj: value.clone(),
            path,
            known: Vec::new(),
        })
    }

    /// Like [`Fields::new`], but `undefined` and `null` read as an empty object.
    pub(crate) fn optional(value: &JsValue, path: impl Into<String>) -> Result<Self, JsValue> {
        if is_absent(value) {
            Self::new(&Object::new().into(), path)
        } else {
            Self::new(value, path)
        }
    }

    /// The path of field `key`, for error messages.
    pub(crate) fn path_of(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    /// The value of `key`; `None` if it is `undefined` or `null`.
    pub(crate) fn get(&mut self, key: &str) -> Result<Option<JsValue>, JsValue> {
        self.known.push(key.to_owned());
        let value = Reflect::get(&self.obj, &JsValue::from_str(key))?;
        Ok((!is_absent(&value)).then_some(value))
    }

    /// A field that must be present.
    pub(crate) fn required(&mut self, key: &str) -> Result<JsValue, JsValue> {
        self.get(key)?
            .ok_or_else(|| type_error(&format!("{}: required field is missing", self.path_of(key))))
    }

    pub(crate) fn uint(&mut self, key: &str, max: u64) -> Result<Option<u64>, JsValue> {
        let path = self.path_of(key);
        self.get(key)?.map(|v| uint(&v, max, &path)).transpose()
    }

    pub(crate) fn u32(&mut self, key: &str) -> Result<Option<u32>, JsValue> {
        // The value is at most u32::MAX by the check in `uint`.
        Ok(self.uint(key, u32::MAX.into())?.map(|n| n as u32))
    }

    pub(crate) fn u16(&mut self, key: &str) -> Result<Option<u16>, JsValue> {
        Ok(self.uint(key, u16::MAX.into())?.map(|n| n as u16))
    }

    pub(crate) fn u8(&mut self, key: &str) -> Result<Option<u8>, JsValue> {
        Ok(self.uint(key, u8::MAX.into())?.map(|n| n as u8))
    }

    /// A count or size (`usize`), as a JS number up to 2^53 - 1.
    pub(crate) fn usize(&mut self, key: &str) -> Result<Option<usize>, JsValue> {
        let max = MAX_SAFE_INTEGER.min(usize::MAX as u64);
        Ok(self.uint(key, max)?.map(|n| n as usize))
    }

    pub(crate) fn bool(&mut self, key: &str) -> Result<Option<bool>, JsValue> {
        let path = self.path_of(key);
        self.get(key)?
            .map(|v| {
                v.as_bool().ok_or_else(|| {
                    type_error(&format!("{path}: expected a boolean, got {}", describe(&v)))
                })
            })
            .transpose()
    }

    pub(crate) fn string(&mut self, key: &str) -> Result<Option<String>, JsValue> {
        let path = self.path_of(key);
        self.get(key)?
            .map(|v| {
                v.as_string().ok_or_else(|| {
                    type_error(&format!("{path}: expected a string, got {}", describe(&v)))
                })
            })
            .transpose()
    }

    pub(crate) fn bytes(&mut self, key: &str) -> Result<Option<Bytes>, JsValue> {
        let path = self.path_of(key);
        self.get(key)?.map(|v| bytes(&v, &path)).transpose()
    }

    /// Refuses fields this reader was not asked about.
    pub(crate) fn finish(self) -> Result<(), JsValue> {
        for key in Object::keys(self.obj.unchecked_ref::<Object>()).iter() {
            let key = key.as_string().unwrap_or_default();
            if !self.known.contains(&key) {
                return Err(type_error(&format!(
                    "{}: unknown field '{key}' (known fields: {})",
                    self.path,
                    self.known.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// A string argument. (wasm-bindgen's own `&str` arguments would turn `undefined` into
/// `"undefined"` without a word.)
pub(crate) fn string(value: &JsValue, what: &str) -> Result<String, JsValue> {
    value.as_string().ok_or_else(|| {
        type_error(&format!(
            "{what}: expected a string, got {}",
            describe(value)
        ))
    })
}
