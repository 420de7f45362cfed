//! SUBSCRIBE and UNSUBSCRIBE: per-filter reason codes, options, subscription identifiers,
//! retained messages on subscribe.

use std::sync::Arc;

use super::io::ConnId;
use super::message::{Delivery, Message};
use super::persist::{self, Key};
use super::session::{SessionId, SubscriptionEntry};
use super::subscriptions::{Change, Subscriber};
use super::{Authenticator, Authorizer, Broker, ClientRef, FilterAccess};
use crate::codec::{
    Packet, ProtocolVersion, QoS, ReasonCode, RetainHandling, SubAck, Subscribe, UnsubAck,
    Unsubscribe,
};
use crate::topic::TopicFilter;

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    pub(super) fn on_subscribe(&mut self, conn_id: ConnId, sid: SessionId, s: Subscribe) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let v5 = conn.protocol == ProtocolVersion::V5;
        let subscription_id = s.properties.subscription_identifier;
        if subscription_id.is_some() && !self.config.subscription_identifiers_available {
            return self.protocol_violation(
                conn_id,
                ReasonCode::SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED,
                "subscription identifiers are not available",
            );
        }
        let mut reasons = Vec::with_capacity(s.filters.len());
        let mut retained_for: Vec<RetainedFor> = Vec::new();
        for f in s.filters {
            let filter = match TopicFilter::with_limits(f.filter.as_str(), &self.topic_limits) {
                Ok(filter) => filter,
                Err(_) => {
                    reasons.push(failure(v5, ReasonCode::TOPIC_FILTER_INVALID));
                    continue;
                }
            };
            if filter.shared_group().is_some() {
                if f.options.no_local {
                    return self.protocol_violation(
                        conn_id,
                        ReasonCode::PROTOCOL_ERROR,
                        "No Local on a shared subscription",
                    );
                }
                if !self.config.shared_subscription_available {
                    reasons.push(failure(v5, ReasonCode::SHARED_SUBSCRIPTIONS_NOT_SUPPORTED));
                    continue;
                }
            }
            if filter.has_wildcards() && !self.config.wildcard_subscription_available {
                reasons.push(failure(
                    v5,
                    ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
                ));
                continue;
            }
            let Some(session) = self.session(sid) else {
                return;
            };
            let client = ClientRef {
                client_id: &session.client_id,
                username: session.username.as_deref(),
            };
            let filtered = match self.authorizer.may_subscribe(&client, &filter) {
                FilterAccess::Allowed => false,
                FilterAccess::Filtered => true,
                FilterAccess::Denied => {
                    self.stats.subscriptions_not_authorized += 1;
                    reasons.push(failure(v5, ReasonCode::NOT_AUTHORIZED));
                    continue;
                }
            };
            let exists = session.subscriptions.contains_key(filter.as_str());
            if !exists && session.subscriptions.len() >= self.config.max_subscriptions_per_client {
                reasons.push(failure(v5, ReasonCode::QUOTA_EXCEEDED));
                continue;
            }
            if self.route_set_full(filter.pattern()) {
                self.stats.subscriptions_route_set_full += 1;
                reasons.push(failure(v5, ReasonCode::QUOTA_EXCEEDED));
                continue;
            }
            let mut options = f.options;
            options.qos = options.qos.min(self.config.maximum_qos);
            if !v5 {
                options = crate::codec::SubscriptionOptions {
                    qos: options.qos,
                    ..Default::default()
                };
            }
            let entry = SubscriptionEntry {
                options,
                subscription_id,
            };
            let change = self.add_subscription(sid, &filter, entry, filtered);
            let send_retained = filter.shared_group().is_none()
                && match options.retain_handling {
                    RetainHandling::OnSubscribe => true,
                    RetainHandling::OnNewSubscribe => change.session_changed,
                    RetainHandling::Never => false,
                };
            if send_retained {
                retained_for.push(RetainedFor {
                    filter,
                    qos: options.qos,
                    subscription_id,
                    filtered,
                });
            }
            reasons.push(ReasonCode(options.qos as u8));
        }
        let first_failure = reasons.iter().copied().find(|r| r.is_error());
        let properties = first_failure
            .map(|r| self.problem(conn_id, r))
            .unwrap_or_default();
        let granted = reasons.iter().any(|r| !r.is_error());
        let suback = SubAck {
            packet_id: s.packet_id,
            reasons,
            properties,
        };
        // With the subscription fence on, the SUBACK waits for the other nodes to know the
        // routes (see `ClusterConfig::subscribe_fence`).
        let Some((suback, retained_for)) =
            self.hold_suback(conn_id, sid, granted, suback, retained_for)
        else {
            return;
        };
        self.send_suback(conn_id, sid, suback, retained_for);
    }

    /// Subscribe a session to `filter` (added, or its options replaced): in the trie, the
    /// route set, the session and its records.
    pub(super) fn add_subscription(
        &mut self,
        sid: SessionId,
        filter: &TopicFilter,
        entry: SubscriptionEntry,
        filtered: bool,
    ) -> Change {
        let change = self.hold_subscription(sid, filter, entry, filtered);
        if let Some(session) = self.session_mut(sid)
            && session.is_persistent()
        {
            session.persisted = true;
            let key = Key::Subscription {
                client_id: session.client_id.to_string(),
                filter: filter.as_str().to_owned(),
            };
            self.persist(key.encode(), Some(persist::encode_subscription(&entry)));
        }
        change
    }

    /// [`Broker::add_subscription`] without its record (one read back from storage).
    pub(super) fn hold_subscription(
        &mut self,
        sid: SessionId,
        filter: &TopicFilter,
        entry: SubscriptionEntry,
        filtered: bool,
    ) -> Change {
        let change = self.subs.insert(
            filter,
            sid,
            Subscriber {
                options: entry.options,
                subscription_id: entry.subscription_id,
                filtered,
            },
        );
        if change.route_changed {
            self.route_added(filter.pattern());
        }
        if let Some(session) = self.session_mut(sid) {
            session
                .subscriptions
                .insert(filter.as_str().to_owned(), entry);
        }
        change
    }

    /// Send a SUBACK, then the retained messages for the subscriptions it granted.
    pub(super) fn send_suback(
        &mut self,
        conn_id: ConnId,
        sid: SessionId,
        suback: SubAck,
        retained_for: Vec<RetainedFor>,
    ) {
        self.send(conn_id, &Packet::SubAck(suback));
        for r in retained_for {
            self.send_retained(sid, &r);
            self.send_sys(sid, &r);
        }
    }

    /// Retained messages matching a new subscription, with the retain flag set.
    fn send_retained(&mut self, sid: SessionId, r: &RetainedFor) {
        let now = self.now;
        let mut matches: Vec<Arc<Message>> = Vec::new();
        self.retained.for_each_match(r.filter.pattern(), |m| {
            // Under `$SYS` the broker's own figures take the place of anything stored there.
            if !m.is_expired(now) && !self.sys_reserved(&m.topic) {
                matches.push(m.clone());
            }
        });
        if r.filtered {
            let before = matches.len();
            matches.retain(|m| self.may_receive(sid, &m.topic));
            self.stats.withheld_not_authorized += (before - matches.len()) as u64;
        }
        for message in matches {
            let qos = message.qos.min(r.qos);
            let ids = r.subscription_id.into_iter().collect();
            let delivery = Delivery::new(message.clone(), qos, true, ids, None);
            // A retained message holds its own bytes already.
            self.deliver(sid, delivery, &mut Some(message));
        }
    }

    pub(super) fn on_unsubscribe(&mut self, conn_id: ConnId, sid: SessionId, u: Unsubscribe) {
        let Some(conn) = self.conns.get(&conn_id) else {
            return;
        };
        let v5 = conn.protocol == ProtocolVersion::V5;
        let mut reasons = Vec::with_capacity(u.filters.len());
        for f in &u.filters {
            let reason = if TopicFilter::with_limits(f.as_str(), &self.topic_limits).is_err() {
                ReasonCode::TOPIC_FILTER_INVALID
            } else if self.remove_subscription(sid, f) {
                ReasonCode::SUCCESS
            } else {
                ReasonCode::NO_SUBSCRIPTION_EXISTED
            };
            reasons.push(reason);
        }
        if !v5 {
            reasons.clear();
        }
        self.send(
            conn_id,
            &Packet::UnsubAck(UnsubAck {
                packet_id: u.packet_id,
                reasons,
                properties: Default::default(),
            }),
        );
    }

    /// Remove one subscription of a session; true if it existed.
    pub(super) fn remove_subscription(&mut self, sid: SessionId, filter_text: &str) -> bool {
        let Some(session) = self.session_mut(sid) else {
            return false;
        };
        if session.subscriptions.remove(filter_text).is_none() {
            return false;
        }
        if session.persisted {
            let key = Key::Subscription {
                client_id: session.client_id.to_string(),
                filter: filter_text.to_owned(),
            };
            self.persist(key.encode(), None);
        }
        if let Ok(filter) = TopicFilter::new(filter_text) {
            let change = self.subs.remove(&filter, sid);
            if change.route_changed {
                self.route_removed(filter.pattern());
            }
        }
        true
    }
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Whether a subscription of the session to `filter`, made earlier, needs its messages
    /// checked under the current hooks. One the hooks would now refuse stays in place, and
    /// every message for it is checked (so none the session may not receive gets through).
    pub(super) fn access_filtered(&self, sid: SessionId, filter: &TopicFilter) -> bool {
        self.session(sid).is_some_and(|s| {
            let client = ClientRef {
                client_id: &s.client_id,
                username: s.username.as_deref(),
            };
            self.authorizer.may_subscribe(&client, filter) != FilterAccess::Allowed
        })
    }

    /// Judge a session's subscriptions again, and what waits in its queue: the hooks or its
    /// user changed.
    pub(super) fn reclassify_subscriptions(&mut self, sid: SessionId) {
        self.withhold_queued(sid);
        let Some(session) = self.session(sid) else {
            return;
        };
        let filters: Vec<TopicFilter> = session
            .subscriptions
            .iter()
            .filter_map(|(text, _)| TopicFilter::new(text.as_str()).ok())
            .collect();
        for filter in filters {
            let filtered = self.access_filtered(sid, &filter);
            self.subs.set_filtered(&filter, sid, filtered);
        }
    }
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Drop the messages waiting in a session's queue that the authorizer does not let it
    /// receive now: they were queued under other rules (before a reload or a restart, or for
    /// another user). Messages already sent and waiting for an acknowledgement stay: the client
    /// has them.
    pub(super) fn withhold_queued(&mut self, sid: SessionId) {
        let Some(session) = self.session(sid) else {
            return;
        };
        let denied: std::collections::BTreeSet<u64> = session
            .queue
            .iter()
            .filter(|q| !self.may_receive(sid, &q.delivery.message.topic))
            .map(|q| q.seq)
            .collect();
        if denied.is_empty() {
            return;
        }
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        session.queue.retain(|q| !denied.contains(&q.seq));
        let client_id = session.client_id.to_string();
        if session.is_persistent() {
            for &seq in &denied {
                let key = Key::Queued {
                    client_id: client_id.clone(),
                    seq,
                };
                self.persist(key.encode(), None);
            }
        }
        self.stats.withheld_not_authorized += denied.len() as u64;
    }
}

/// A subscription granted by a SUBACK, whose retained messages follow it.
#[derive(Debug)]
pub(super) struct RetainedFor {
    pub filter: TopicFilter,
    /// The QoS granted.
    pub qos: QoS,
    pub subscription_id: Option<u32>,
    /// Each message is checked before it is sent ([`Subscriber::filtered`]).
    pub filtered: bool,
}

/// A refusal code as the protocol version can say it (3.1.1 knows only 0x80).
fn failure(v5: bool, reason: ReasonCode) -> ReasonCode {
    if v5 {
        reason
    } else {
        ReasonCode::UNSPECIFIED_ERROR
    }
}
