//! [`ClientId`]: the id a client's session is known by, in the broker and across nodes.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A session's client id: 1 to 65,535 bytes of UTF-8 without U+0000 (what an MQTT string
/// may hold; the broker assigns one to a client that sent none). Cheap to clone; reads as a
/// `&str`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(Arc<str>);

/// Why a client id was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid client id: {0}")]
pub struct ClientIdError(&'static str);

impl ClientId {
    /// `id`, checked.
    pub fn new(id: &str) -> Result<Self, ClientIdError> {
        if id.is_empty() {
            return Err(ClientIdError("empty"));
        }
        if id.len() > usize::from(u16::MAX) {
            return Err(ClientIdError("longer than 65,535 bytes"));
        }
        if id.contains('\0') {
            return Err(ClientIdError("contains U+0000"));
        }
        Ok(Self(id.into()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for ClientId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ClientId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_id_is_an_mqtt_string_that_is_not_empty() {
        let id = ClientId::new("sensor-7").unwrap();
        assert_eq!(&*id, "sensor-7");
        assert_eq!(id.to_string(), "sensor-7");
        assert!(ClientId::new("").is_err());
        assert!(ClientId::new("a\0b").is_err());
        assert!(ClientId::new(&"x".repeat(65_535)).is_ok());
        assert!(ClientId::new(&"x".repeat(65_536)).is_err());
        let mut map = std::collections::HashMap::new();
        map.insert(id.clone(), 1);
        assert_eq!(map.get("sensor-7"), Some(&1), "looked up by its text");
    }
}
