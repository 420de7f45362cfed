//! System topics: the broker's own figures under `$SYS/broker/`, named as Mosquitto names
//! them, so that dashboards and tools made for it read them unchanged.
//!
//! Every [`Config::sys_interval_ms`](super::Config::sys_interval_ms) the broker sends the
//! figures that changed since it last sent them to its subscribers, as retained QoS 0
//! messages: a new subscription gets the figures at once with the retain flag set, as it would
//! get retained messages, and later ones carry it as any retained message does (only with
//! Retain As Published). The figures are made when they are sent: never stored, persisted,
//! replicated or forwarded to other nodes, so in a deployment of several regions each node's
//! `$SYS` topics describe that node.
//!
//! While the broker publishes them, `$SYS` is its own: clients may not publish there (nor
//! leave wills there), the shell may not either ([`Broker::publish`]), and what other nodes
//! forward there, or retained messages stored there while system topics were off, are not
//! passed on.

use std::sync::Arc;

use bytes::Bytes;

use super::MessageProperties;
use super::message::Delivery;
use super::session::SessionId;
use super::subscribe::RetainedFor;
use super::{Authenticator, Authorizer, Broker, Message, Timer};
use crate::Timestamp;
use crate::codec::QoS;
use crate::topic;

/// The topics, in the order [`Broker::sys_figures`] gives their values.
const TOPICS: [&str; 16] = [
    "$SYS/broker/version",
    "$SYS/broker/uptime",
    "$SYS/broker/clients/connected",
    "$SYS/broker/clients/disconnected",
    "$SYS/broker/clients/total",
    "$SYS/broker/clients/maximum",
    "$SYS/broker/subscriptions/count",
    "$SYS/broker/retained messages/count",
    "$SYS/broker/store/messages/count",
    "$SYS/broker/messages/received",
    "$SYS/broker/messages/sent",
    "$SYS/broker/publish/messages/received",
    "$SYS/broker/publish/messages/sent",
    "$SYS/broker/publish/messages/dropped",
    "$SYS/broker/bytes/received",
    "$SYS/broker/bytes/sent",
];

/// What the broker keeps to publish its system topics.
#[derive(Debug)]
pub(super) struct SysTopics {
    started: Timestamp,
    /// The figures each interval last sent, in the order of [`TOPICS`] (empty before the
    /// first): the next interval sends those that differ.
    sent: Vec<String>,
    /// The figures last worked out, and when: what a new subscription gets while they are
    /// less than an interval old.
    latest: Option<(Vec<String>, Timestamp)>,
    /// The most connections open at once.
    max_connections: usize,
}

impl SysTopics {
    pub(super) fn new(now: Timestamp) -> Box<Self> {
        Box::new(Self {
            started: now,
            sent: Vec::new(),
            latest: None,
            max_connections: 0,
        })
    }

    pub(super) fn connections(&mut self, open: usize) {
        self.max_connections = self.max_connections.max(open);
    }
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Whether `topic` is under `$SYS` while the broker publishes there: no client may publish
    /// there, and nothing else published there is passed on.
    pub(super) fn sys_reserved(&self, topic: &str) -> bool {
        self.sys.is_some() && (topic == "$SYS" || topic.starts_with("$SYS/"))
    }

    /// Send the figures that changed to their subscribers, and wake again in an interval.
    /// Some figures take a pass over every session: with no subscriber to any of them, nothing
    /// is worked out. Subscribers that cannot take a message now (offline, congested) miss it,
    /// uncounted: the next figure replaces it.
    pub(super) fn fire_sys(&mut self) {
        if self.sys.is_none() {
            return;
        }
        let next = self.now.plus_ms(self.config.sys_interval_ms);
        self.timers.insert((next, Timer::Sys));
        if !TOPICS.iter().any(|t| self.subs.matches_any(t)) {
            return;
        }
        let figures = self.sys_figures();
        let Some(sys) = &mut self.sys else { return };
        let changed: Vec<Arc<Message>> = figures
            .iter()
            .enumerate()
            .filter(|&(i, value)| sys.sent.get(i) != Some(value))
            .map(|(i, value)| Arc::new(sys_message(TOPICS[i], value)))
            .collect();
        sys.sent.clone_from(&figures);
        sys.latest = Some((figures, self.now));
        for message in changed {
            // The message holds its own bytes already.
            self.route(&message, Some(message.clone()), true);
        }
    }

    /// The figures matching a new subscription, with the retain flag set: those last worked
    /// out, or new ones if those are an interval old (so that a flood of subscriptions works
    /// them out at most once an interval).
    pub(super) fn send_sys(&mut self, sid: SessionId, r: &RetainedFor) {
        let Some(sys) = &self.sys else { return };
        if !r.filter.pattern().starts_with("$SYS") {
            return;
        }
        let interval = self.config.sys_interval_ms;
        let stale = sys
            .latest
            .as_ref()
            .is_none_or(|(_, at)| self.now.millis_since(*at) >= interval);
        if stale {
            let figures = self.sys_figures();
            if let Some(sys) = &mut self.sys {
                sys.latest = Some((figures, self.now));
            }
        }
        let Some((figures, _)) = self.sys.as_ref().and_then(|s| s.latest.as_ref()) else {
            return;
        };
        let matching: Vec<Arc<Message>> = figures
            .iter()
            .enumerate()
            .filter(|&(i, _)| topic::matches(r.filter.pattern(), TOPICS[i]))
            .filter(|&(i, _)| !r.filtered || self.may_receive(sid, TOPICS[i]))
            .map(|(i, value)| Arc::new(sys_message(TOPICS[i], value)))
            .collect();
        for message in matching {
            let ids = r.subscription_id.into_iter().collect();
            let delivery = Delivery::new(message.clone(), r.qos.min(message.qos), true, ids, None);
            self.deliver(sid, delivery, &mut Some(message));
        }
    }

    /// The value of each of [`TOPICS`], now.
    fn sys_figures(&self) -> Vec<String> {
        let Some(sys) = &self.sys else {
            return Vec::new();
        };
        let stats = self.stats();
        let connected = self
            .sessions
            .iter()
            .flatten()
            .filter(|s| s.conn.is_some())
            .count();
        let uptime_secs = self.now.millis_since(sys.started) / 1000;
        let dropped = stats.dropped_queue_full
            + stats.dropped_too_large
            + stats.dropped_expired
            + stats.dropped_qos0_offline
            + stats.dropped_qos0_congested;
        vec![
            format!("meridian version {}", env!("CARGO_PKG_VERSION")),
            format!("{uptime_secs} seconds"),
            connected.to_string(),
            (stats.sessions.saturating_sub(connected)).to_string(),
            stats.sessions.to_string(),
            sys.max_connections.to_string(),
            stats.subscriptions.to_string(),
            stats.retained_messages.to_string(),
            (stats.queued_messages + stats.inflight_messages).to_string(),
            stats.packets_received.to_string(),
            stats.packets_sent.to_string(),
            stats.messages_received.iter().sum::<u64>().to_string(),
            stats.messages_sent.iter().sum::<u64>().to_string(),
            dropped.to_string(),
            stats.bytes_received.to_string(),
            stats.bytes_sent.to_string(),
        ]
    }
}

fn sys_message(topic: &str, value: &str) -> Message {
    Message {
        topic: Arc::from(topic),
        payload: Bytes::copy_from_slice(value.as_bytes()),
        qos: QoS::AtMostOnce,
        retain: true,
        properties: MessageProperties::default(),
        expires_at: None,
        origin: None,
    }
}
