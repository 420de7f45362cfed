//! The broker's configuration and connection info as JS objects.
//!
//! Mapped onto [`meridian_core::Config`] from the core's own list of its fields, starting from
//! its defaults: a field left out keeps the core's default, an unknown field is an error (a
//! typo should not silently leave a limit at its default).

use meridian_core::codec::QoS;
use meridian_core::{Config, ConnInfo};
use wasm_bindgen::{JsCast, JsValue};

use crate::js::{self, Fields, Obj};
use crate::packet;

/// A core configuration field as a JS property: read (checked) and written back.
trait JsField: Sized {
    fn from_js(value: &JsValue, path: &str) -> Result<Self, JsValue>;
    fn to_js(&self) -> JsValue;
}

macro_rules! numeric_js_fields {
    ($($t:ty => $max:expr),*) => {
        $(impl JsField for $t {
            fn from_js(value: &JsValue, path: &str) -> Result<Self, JsValue> {
                // At most the type's maximum by the check in `uint`.
                js::uint(value, $max, path).map(|n| n as $t)
            }
            fn to_js(&self) -> JsValue {
                js::num(*self as u64)
            }
        })*
    };
}
numeric_js_fields!(
    u16 => u16::MAX.into(),
    u32 => u32::MAX.into(),
    u64 => js::MAX_SAFE_INTEGER,
    usize => js::MAX_SAFE_INTEGER.min(usize::MAX as u64)
);

impl JsField for bool {
    fn from_js(value: &JsValue, path: &str) -> Result<Self, JsValue> {
        value.as_bool().ok_or_else(|| {
            js::type_error(&format!(
                "{path}: expected a boolean, got {}",
                js::describe(value)
            ))
        })
    }
    fn to_js(&self) -> JsValue {
        JsValue::from_bool(*self)
    }
}

impl JsField for String {
    fn from_js(value: &JsValue, path: &str) -> Result<Self, JsValue> {
        js::string(value, path)
    }
    fn to_js(&self) -> JsValue {
        JsValue::from_str(self)
    }
}

impl JsField for QoS {
    fn from_js(value: &JsValue, path: &str) -> Result<Self, JsValue> {
        packet::qos(value, path)
    }
    fn to_js(&self) -> JsValue {
        JsValue::from(*self as u8)
    }
}

/// `max_packet_size` -> `maxPacketSize`.
pub(crate) fn camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.push(c.to_ascii_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// The core's `limits` and `features` fields ([`meridian_core::with_config_fields`]) are the
/// `BrokerConfig` properties, in camel case; of the `process` fields, `seed` (a number or a
/// `bigint`).
macro_rules! js_config {
    (
        limits { $($(#[doc = $ldoc:literal])* $lfield:ident : $lty:ty = $ldefault:expr),* $(,)? }
        features { $($(#[doc = $fdoc:literal])* $ffield:ident : $fty:ty = $fdefault:expr),* $(,)? }
        process { $($process:tt)* }
    ) => {
        /// `BrokerConfig` (see `types.d.ts`) to a core [`Config`].
        pub(crate) fn from_js(value: &JsValue) -> Result<Config, JsValue> {
            let mut c = Config::default();
            let mut f = Fields::optional(value, "config")?;
            $(
                let key = camel(stringify!($lfield));
                let path = f.path_of(&key);
                if let Some(v) = f.get(&key)? {
                    c.$lfield = <$lty as JsField>::from_js(&v, &path)?;
                }
            )*
            $(
                let key = camel(stringify!($ffield));
                let path = f.path_of(&key);
                if let Some(v) = f.get(&key)? {
                    c.$ffield = <$fty as JsField>::from_js(&v, &path)?;
                }
            )*
            let seed_path = f.path_of("seed");
            if let Some(v) = f.get("seed")? {
                c.seed = seed(&v, &seed_path)?;
            }
            f.finish()?;
            Ok(c)
        }

        /// The effective configuration as a `BrokerConfig` object (every field present).
        pub(crate) fn to_js(c: &Config) -> JsValue {
            let o = Obj::new();
            $(o.set_named(&camel(stringify!($lfield)), c.$lfield.to_js());)*
            $(o.set_named(&camel(stringify!($ffield)), c.$ffield.to_js());)*
            // As a bigint: the default seed does not fit a JS number exactly.
            o.set("seed", js_sys::BigInt::from(c.seed));
            o.into_js()
        }
    };
}

meridian_core::with_config_fields!(js_config);

/// A seed: a safe-integer number or a `bigint` in 0..2^64.
fn seed(value: &JsValue, what: &str) -> Result<u64, JsValue> {
    if value.is_bigint() {
        let text = js_sys::BigInt::unchecked_from_js_ref(value)
            .to_string(10)
            .ok()
            .and_then(|s| s.as_string())
            .unwrap_or_default();
        return text.parse().map_err(|_| {
            js::range_error(&format!("{what}: expected a bigint in 0..2^64, got {text}"))
        });
    }
    js::uint(value, js::MAX_SAFE_INTEGER, what)
}

/// `ConnInfo` (`{ remoteAddr?, tlsIdentity?, maxPacketSize? }`) to the core's.
pub(crate) fn conn_info(value: &JsValue) -> Result<ConnInfo, JsValue> {
    let mut f = Fields::optional(value, "info")?;
    let info = ConnInfo {
        remote_addr: f.string("remoteAddr")?,
        tls_identity: f.string("tlsIdentity")?,
        max_packet_size: f.u32("maxPacketSize")?,
    };
    f.finish()?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::camel;

    /// The members of `interface NAME { ... }` in `types.d.ts`.
    fn members(name: &str) -> Vec<String> {
        let text = include_str!("types.d.ts");
        let start = text
            .find(&format!("export interface {name} {{"))
            .unwrap_or_else(|| panic!("interface {name} in types.d.ts"));
        let body = &text[start..];
        let body = &body[..body.find("\n}").expect("end of the interface")];
        body.lines()
            .skip(1)
            .map(str::trim)
            .filter(|l| !l.starts_with("/**") && !l.starts_with('*') && !l.is_empty())
            .filter_map(|l| l.split([':', '?']).next().map(str::to_owned))
            .collect()
    }

    macro_rules! names {
        ($($group:ident {
            $($(#[doc = $doc:literal])* $field:ident : $ty:ty = $default:expr),* $(,)?
        })*) => {
            vec![$($((stringify!($group), stringify!($field))),*),*]
        };
    }

    #[test]
    fn the_typescript_types_name_every_config_field_and_figure() {
        let config = members("BrokerConfig");
        for (group, field) in meridian_core::with_config_fields!(names) {
            if group != "process" || field == "seed" {
                assert!(config.contains(&camel(field)), "BrokerConfig lacks {field}");
            }
        }
        let stats = members("BrokerStats");
        for figure in meridian_core::broker::Stats::FIGURES {
            assert!(
                stats.contains(&camel(figure.field)),
                "BrokerStats lacks {}",
                figure.field
            );
        }
        assert_eq!(stats.len(), meridian_core::broker::Stats::FIGURES.len());
    }
}
