//! Counters the shell reads for metrics. Plain fields, no global state.

/// Running totals and current sizes, read with [`crate::Broker::stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub connections: usize,
    pub sessions: usize,
    pub subscriptions: usize,
    pub retained_messages: usize,
    /// Messages waiting in session queues (not yet in flight).
    pub queued_messages: usize,
    /// Messages sent and not yet acknowledged.
    pub inflight_messages: usize,
    pub packets_received: u64,
    pub packets_sent: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// PUBLISH packets received from clients, by QoS.
    pub messages_received: [u64; 3],
    /// PUBLISH packets sent to clients, by QoS.
    pub messages_sent: [u64; 3],
    pub dropped_queue_full: u64,
    pub dropped_too_large: u64,
    pub dropped_expired: u64,
    pub dropped_qos0_offline: u64,
    /// QoS 0 deliveries dropped because the connection was congested ([`crate::Input::Congested`]).
    pub dropped_qos0_congested: u64,
    /// PUBLISH packets (and wills) refused by the authorizer.
    pub dropped_not_authorized: u64,
    /// Deliveries withheld from filtered subscriptions by the authorizer
    /// ([`crate::acl::FilterAccess::Filtered`]).
    pub withheld_not_authorized: u64,
    /// Subscriptions refused by the authorizer (SUBACK 0x87, or 0x80 to 3.1.1 clients).
    pub subscriptions_not_authorized: u64,
    pub dropped_retained_full: u64,
    /// QoS 0 forwards for a peer whose link was down.
    pub dropped_peer_down: u64,
    /// QoS 0 forwards for a peer whose link was congested ([`crate::Input::PeerCongested`]).
    pub dropped_peer_congested: u64,
    /// QoS 1/2 forwards refused by a full peer outbox (MQTT 3.1.1 publishers only; 5.0
    /// publishers get 0x97 instead).
    pub dropped_outbox_full: u64,
    pub connects_refused: u64,
    pub protocol_errors: u64,
}
