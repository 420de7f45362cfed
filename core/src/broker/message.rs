//! An application message as the broker holds it: shared by every subscriber.

use std::ops::Deref;
use std::sync::Arc;

use bytes::Bytes;

use super::io::Timestamp;
use crate::codec::{PublishProperties, QoS};

/// A published message. Held in an [`Arc`] and shared by all the sessions it goes to; the
/// per-subscriber parts (packet id, QoS, DUP, retain flag, alias, subscription ids) live
/// beside it, in each session's record of the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The topic name it was published to.
    pub topic: Arc<str>,
    /// The application payload.
    pub payload: Bytes,
    /// The QoS it was published with; each delivery gets the lower of this and the subscription's.
    pub qos: QoS,
    /// Whether it was published with RETAIN.
    pub retain: bool,
    /// Properties passed through to subscribers. `topic_alias` and `subscription_identifiers`
    /// are always empty here; `message_expiry_interval` is replaced by `expires_at`.
    pub properties: MessageProperties,
    /// When the message expires (from Message Expiry Interval), if it does.
    pub expires_at: Option<Timestamp>,
    /// The session that published it, for No Local. `None` for wills, restored and system messages.
    pub origin: Option<u32>,
}

impl Message {
    /// Whether it has expired at `now`.
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

    /// Give the message's bytes (payload, correlation data) allocations of their own.
    ///
    /// A message decoded from a packet holds parts of the buffer the packet was read into, and
    /// keeps all of that buffer alive, with every other packet it held: up to a whole read
    /// for a few bytes. A message that may be kept long (retained, queued for a session,
    /// waiting in a peer's outbox) is detached, so that what it keeps is what its limits count.
    pub(crate) fn detach(&mut self) {
        self.payload = Bytes::copy_from_slice(&self.payload);
        if let Some(p) = self.properties.0.as_deref_mut()
            && let Some(data) = &mut p.correlation_data
        {
            *data = Bytes::copy_from_slice(data);
        }
    }

    /// A copy of the message with bytes of its own ([`Message::detach`]).
    pub(crate) fn detached(&self) -> Self {
        let mut message = self.clone();
        message.detach();
        message
    }
}

/// A message's properties, read through [`Deref`]. Most messages have none, and every queued,
/// retained or in-flight message holds its own: they are boxed, and made only when there are
/// some, so that a message takes 88 bytes rather than 224.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageProperties(Option<Box<PublishProperties>>);

/// What a message without properties reads.
static NO_PROPERTIES: PublishProperties = PublishProperties {
    payload_format_indicator: None,
    message_expiry_interval: None,
    topic_alias: None,
    response_topic: None,
    correlation_data: None,
    user_properties: Vec::new(),
    subscription_identifiers: Vec::new(),
    content_type: None,
};

impl From<PublishProperties> for MessageProperties {
    fn from(properties: PublishProperties) -> Self {
        Self((!properties.is_empty()).then(|| Box::new(properties)))
    }
}

impl Deref for MessageProperties {
    type Target = PublishProperties;

    fn deref(&self) -> &PublishProperties {
        self.0.as_deref().unwrap_or(&NO_PROPERTIES)
    }
}

impl MessageProperties {
    /// Without what is set for each delivery or hop: the expiry interval (a message keeps its
    /// expiry as a time), the topic alias and the subscription identifiers.
    pub(crate) fn strip_per_delivery(&mut self) {
        if let Some(p) = self.0.as_deref_mut() {
            p.message_expiry_interval = None;
            p.topic_alias = None;
            p.subscription_identifiers.clear();
            if p.is_empty() {
                self.0 = None;
            }
        }
    }
}

/// One message on its way to one session. Every queued and in-flight QoS 1/2 message holds
/// one, so what few deliveries carry (subscription identifiers, a shared subscription) is
/// boxed: a delivery takes 24 bytes instead of 56.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub message: Arc<Message>,
    /// Granted QoS: min(message QoS, best matching subscription QoS).
    pub qos: QoS,
    /// Retain flag as sent to this subscriber.
    pub retain: bool,
    rare: Option<Box<Rare>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rare {
    subscription_ids: Vec<u32>,
    shared: Option<Arc<str>>,
}

impl Delivery {
    /// `subscription_ids`: of the subscriptions it matched (sent to MQTT 5 clients).
    /// `shared`: the full filter text of the shared subscription it came through, so that an
    /// unacknowledged message can go to another member if this one leaves.
    pub fn new(
        message: Arc<Message>,
        qos: QoS,
        retain: bool,
        subscription_ids: Vec<u32>,
        shared: Option<Arc<str>>,
    ) -> Self {
        Self {
            message,
            qos,
            retain,
            rare: Rare::boxed(subscription_ids, shared),
        }
    }

    pub fn subscription_ids(&self) -> &[u32] {
        self.rare.as_ref().map_or(&[], |r| &r.subscription_ids)
    }

    pub fn shared(&self) -> Option<&Arc<str>> {
        self.rare.as_ref().and_then(|r| r.shared.as_ref())
    }

    pub fn set_subscription_ids(&mut self, ids: Vec<u32>) {
        let shared = self.rare.take().and_then(|r| r.shared);
        self.rare = Rare::boxed(ids, shared);
    }
}

impl Rare {
    fn boxed(subscription_ids: Vec<u32>, shared: Option<Arc<str>>) -> Option<Box<Self>> {
        (!subscription_ids.is_empty() || shared.is_some()).then(|| {
            Box::new(Self {
                subscription_ids,
                shared,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::UserProperty;

    /// Bytes a message takes (its `Arc` adds 16): one for each published message, for as
    /// long as it is queued, in flight or retained.
    const MESSAGE_BUDGET: usize = 88;

    #[test]
    fn a_message_stays_within_its_budget() {
        let size = size_of::<Message>();
        assert!(size <= MESSAGE_BUDGET, "a message takes {size} bytes");
    }

    #[test]
    fn properties_are_boxed_only_when_there_are_some() {
        assert!(
            MessageProperties::from(PublishProperties::default())
                .0
                .is_none()
        );

        let mut expiring = MessageProperties::from(PublishProperties {
            message_expiry_interval: Some(60),
            topic_alias: Some(3),
            ..Default::default()
        });
        assert_eq!(expiring.message_expiry_interval, Some(60));
        expiring.strip_per_delivery();
        assert!(expiring.0.is_none(), "nothing is left to pass on");

        let user_properties: Vec<UserProperty> = vec![("k".into(), "v".into())];
        let mut kept = MessageProperties::from(PublishProperties {
            message_expiry_interval: Some(60),
            user_properties: user_properties.clone(),
            ..Default::default()
        });
        kept.strip_per_delivery();
        assert_eq!(kept.user_properties, user_properties);
        assert_eq!(kept.message_expiry_interval, None);
    }

    /// Any one property set makes a message's properties worth a box.
    #[test]
    fn any_property_set_is_kept() {
        let set: [PublishProperties; 8] = [
            PublishProperties {
                payload_format_indicator: Some(0),
                ..Default::default()
            },
            PublishProperties {
                message_expiry_interval: Some(1),
                ..Default::default()
            },
            PublishProperties {
                topic_alias: Some(1),
                ..Default::default()
            },
            PublishProperties {
                response_topic: Some(String::new()),
                ..Default::default()
            },
            PublishProperties {
                correlation_data: Some(bytes::Bytes::new()),
                ..Default::default()
            },
            PublishProperties {
                user_properties: vec![("k".into(), "v".into())],
                ..Default::default()
            },
            PublishProperties {
                subscription_identifiers: vec![1],
                ..Default::default()
            },
            PublishProperties {
                content_type: Some(String::new()),
                ..Default::default()
            },
        ];
        assert!(PublishProperties::default().is_empty());
        for p in set {
            assert!(!p.is_empty(), "{p:?}");
            assert!(MessageProperties::from(p).0.is_some());
        }
    }
}
