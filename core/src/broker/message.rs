//! An application message as the broker holds it: shared by every subscriber, never copied.

use std::sync::Arc;

use bytes::Bytes;

use super::io::Timestamp;
use crate::codec::{PublishProperties, QoS};

/// A published message. Held in an [`Arc`] and shared by all the sessions it goes to; the
/// per-subscriber parts (packet id, QoS, DUP, retain flag, alias, subscription ids) live in
/// [`Delivery`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub topic: Arc<str>,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// Properties passed through to subscribers. `topic_alias` and `subscription_identifiers`
    /// are always empty here; `message_expiry_interval` is replaced by `expires_at`.
    pub properties: PublishProperties,
    /// When the message expires (from Message Expiry Interval), if it does.
    pub expires_at: Option<Timestamp>,
    /// The session that published it, for No Local. `None` for wills, restored and system messages.
    pub origin: Option<u32>,
}

impl Message {
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }

    /// Seconds left before expiry, rounded up, as sent in Message Expiry Interval.
    pub fn remaining_expiry_secs(&self, now: Timestamp) -> Option<u32> {
        self.expires_at.map(|at| {
            let ms = at.millis_since(now);
            u32::try_from(ms.div_ceil(1000)).unwrap_or(u32::MAX)
        })
    }

    /// Payload bytes counted against queue limits.
    pub fn weight(&self) -> usize {
        self.payload.len() + self.topic.len()
    }
}

/// One message on its way to one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub message: Arc<Message>,
    /// Granted QoS: min(message QoS, best matching subscription QoS).
    pub qos: QoS,
    /// Retain flag as sent to this subscriber.
    pub retain: bool,
    pub subscription_ids: Vec<u32>,
    /// Set when the delivery came through a shared subscription (full filter text), so that an
    /// unacknowledged message can go to another member if this one leaves.
    pub shared: Option<Arc<str>>,
}
