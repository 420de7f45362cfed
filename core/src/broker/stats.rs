//! Counters the shell reads for metrics. Plain fields, no global state.
//!
//! Each figure is described once, here: its field, whether it is a gauge or a counter, the
//! metric it is shown as, and what it counts ([`Stats::FIGURES`]). Shells render every figure
//! from that table (Prometheus metrics, a JS object), so a new figure reaches them all.

/// Whether a figure is a current size or a running total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FigureKind {
    /// A current size: connections open, messages queued.
    Gauge,
    /// A running total since the broker started.
    Counter,
}

/// One figure of [`Stats`], as [`Stats::FIGURES`] describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figure {
    /// The field of [`Stats`] (`dropped_queue_full`).
    pub field: &'static str,
    /// The metric it is shown as (`messages_dropped`); several figures may share one, told
    /// apart by `label`.
    pub metric: &'static str,
    /// What the metric counts (shared by the figures of one metric).
    pub metric_help: &'static str,
    /// The label that tells this figure apart within its metric (`("reason", "queue_full")`).
    pub label: Option<(&'static str, &'static str)>,
    /// Gauge or counter.
    pub kind: FigureKind,
    /// What the field counts.
    pub help: &'static str,
}

/// A figure's value: one number, or one per QoS level (label `qos`, 0 to 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FigureValue {
    /// One number.
    One(u64),
    /// One number per QoS level.
    ByQos([u64; 3]),
}

/// What a field's type gives as a [`FigureValue`].
trait AsFigure {
    fn as_figure(&self) -> FigureValue;
}

impl AsFigure for u64 {
    fn as_figure(&self) -> FigureValue {
        FigureValue::One(*self)
    }
}

impl AsFigure for usize {
    fn as_figure(&self) -> FigureValue {
        FigureValue::One(*self as u64)
    }
}

impl AsFigure for [u64; 3] {
    fn as_figure(&self) -> FigureValue {
        FigureValue::ByQos(*self)
    }
}

macro_rules! stats {
    ($(
        $(#[doc = $doc:literal])+
        $kind:ident $field:ident : $ty:ty => $metric:literal
            $(($metric_help:expr) $lname:literal = $lvalue:literal)?;
    )*) => {
        /// Running totals and current sizes, read with [`crate::Broker::stats`]; each is
        /// described in [`Stats::FIGURES`].
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[doc = $doc])+ pub $field: $ty,)*
        }

        impl Stats {
            /// Every figure, in the order of [`Stats::figures`].
            pub const FIGURES: &'static [Figure] = &[$(Figure {
                field: stringify!($field),
                metric: $metric,
                metric_help: stats!(@help $($metric_help)? ; $($doc)+),
                label: stats!(@label $($lname, $lvalue)?),
                kind: FigureKind::$kind,
                help: concat!($($doc),+),
            }),*];

            /// Every figure with its value.
            pub fn figures(&self) -> impl Iterator<Item = (&'static Figure, FigureValue)> {
                let values = [$(AsFigure::as_figure(&self.$field)),*];
                Self::FIGURES.iter().zip(values)
            }
        }
    };
    (@help $metric_help:expr ; $($doc:literal)+) => { $metric_help };
    (@help ; $($doc:literal)+) => { concat!($($doc),+) };
    (@label $lname:literal, $lvalue:literal) => { Some(($lname, $lvalue)) };
    (@label) => { None };
}

/// What `messages_dropped`, the figures of every drop reason, counts.
const DROPPED: &str = "Messages dropped, by reason";
/// What `subscriptions_refused` counts.
const SUBS_REFUSED: &str = "Subscriptions refused, by reason";
/// What `peer_frames_refused` counts.
const REFUSED: &str = "Frames from peer nodes refused, by reason";

stats! {
    /// Open client connections.
    Gauge connections: usize => "connections";
    /// Sessions held, connected or not.
    Gauge sessions: usize => "sessions";
    /// Subscriptions of all sessions.
    Gauge subscriptions: usize => "subscriptions";
    /// Retained messages stored.
    Gauge retained_messages: usize => "retained_messages";
    /// Client ids claimed in the deployment, as known here: this node's clients and the
    /// other nodes' (cluster mode).
    Gauge claims: usize => "claims";
    /// Messages waiting in session queues (not yet in flight).
    Gauge queued_messages: usize => "queued_messages";
    /// Messages sent and not yet acknowledged.
    Gauge inflight_messages: usize => "inflight_messages";
    /// Payload and topic bytes of every message held: retained, queued and in flight
    /// (bounded by `max_held_bytes`).
    Gauge held_bytes: usize => "held_bytes";
    /// MQTT packets received.
    Counter packets_received: u64 => "packets_received";
    /// MQTT packets sent.
    Counter packets_sent: u64 => "packets_sent";
    /// Bytes received from clients.
    Counter bytes_received: u64 => "bytes_received";
    /// Bytes sent to clients.
    Counter bytes_sent: u64 => "bytes_sent";
    /// PUBLISH packets received from clients, by QoS.
    Counter messages_received: [u64; 3] => "messages_received";
    /// PUBLISH packets sent to clients, by QoS.
    Counter messages_sent: [u64; 3] => "messages_sent";
    /// Deliveries dropped because the session's queue was full.
    Counter dropped_queue_full: u64 => "messages_dropped"
        (DROPPED) "reason" = "queue_full";
    /// Deliveries dropped because they exceeded the client's Maximum Packet Size.
    Counter dropped_too_large: u64 => "messages_dropped"
        (DROPPED) "reason" = "too_large";
    /// Messages dropped because their Message Expiry Interval ran out before delivery.
    Counter dropped_expired: u64 => "messages_dropped"
        (DROPPED) "reason" = "expired";
    /// QoS 0 deliveries dropped because the subscriber was not connected.
    Counter dropped_qos0_offline: u64 => "messages_dropped"
        (DROPPED) "reason" = "qos0_offline";
    /// QoS 0 deliveries dropped because the connection was congested (the shell said so
    /// with `Input::Congested`).
    Counter dropped_qos0_congested: u64 => "messages_dropped"
        (DROPPED) "reason" = "qos0_congested";
    /// PUBLISH packets (and wills) refused by the authorizer.
    Counter dropped_not_authorized: u64 => "messages_dropped"
        (DROPPED) "reason" = "not_authorized";
    /// Retained messages not stored because `max_retained_messages` was reached.
    Counter dropped_retained_full: u64 => "messages_dropped"
        (DROPPED) "reason" = "retained_full";
    /// QoS 1/2 forwards refused by a full peer outbox (MQTT 3.1.1 publishers only; 5.0
    /// publishers get 0x97 instead).
    Counter dropped_outbox_full: u64 => "messages_dropped"
        (DROPPED) "reason" = "outbox_full";
    /// QoS 0 forwards for a peer whose link was down.
    Counter dropped_peer_down: u64 => "messages_dropped"
        (DROPPED) "reason" = "peer_down";
    /// QoS 0 forwards for a peer whose link was congested (the shell said so with
    /// `Input::PeerCongested`).
    Counter dropped_peer_congested: u64 => "messages_dropped"
        (DROPPED) "reason" = "peer_congested";
    /// Deliveries not held and retained messages not stored because the broker held
    /// `max_held_bytes` of messages, and QoS 1/2 PUBLISHes refused for it (5.0: 0x97).
    Counter dropped_memory_full: u64 => "messages_dropped"
        (DROPPED) "reason" = "memory_full";
    /// QoS 1/2 forwards waiting for a node that was forgotten (it left the deployment).
    Counter dropped_peer_forgotten: u64 => "messages_dropped"
        (DROPPED) "reason" = "peer_forgotten";
    /// The oldest QoS 1/2 forwards waiting for a node whose link is down, dropped to keep its
    /// outbox within bounds (publishers are never refused for a node that is not there).
    Counter dropped_peer_absent: u64 => "messages_dropped"
        (DROPPED) "reason" = "peer_absent";
    /// Deliveries to a session that had the message already: it reached the session's new
    /// node both from its publisher's node and relayed by the old node while the session
    /// moved.
    Counter dropped_moved_twice: u64 => "messages_dropped"
        (DROPPED) "reason" = "moved_twice";
    /// Peer frames refused for naming another node as their origin.
    Counter peer_frames_not_owner: u64 => "peer_frames_refused"
        (REFUSED) "reason" = "not_owner";
    /// Peer frames refused for taking the peer past one of its bounds.
    Counter peer_frames_over_limit: u64 => "peer_frames_refused"
        (REFUSED) "reason" = "over_limit";
    /// Retained writes from peers refused for a clock reading too far ahead.
    Counter peer_frames_clock_ahead: u64 => "peer_frames_refused"
        (REFUSED) "reason" = "clock_ahead";
    /// Peer frames refused because the node count is at its bound.
    Counter peer_frames_too_many_nodes: u64 => "peer_frames_refused"
        (REFUSED) "reason" = "too_many_nodes";
    /// Peer link sessions cut for going past a bound.
    Counter peer_sessions_cut: u64 => "peer_sessions_cut";
    /// Nodes forgotten (by command, announcement or expiry).
    Counter peers_forgotten: u64 => "peers_forgotten";
    /// Deliveries withheld from subscriptions that reach topics the authorizer denies (those
    /// it judged Filtered).
    Counter withheld_not_authorized: u64 => "deliveries_withheld";
    /// Subscriptions refused by the authorizer (SUBACK 0x87, or 0x80 to 3.1.1 clients).
    Counter subscriptions_not_authorized: u64 => "subscriptions_refused"
        (SUBS_REFUSED) "reason" = "not_authorized";
    /// Subscriptions refused because their filter would take this node's route set past
    /// `ClusterConfig::max_route_filters` (SUBACK 0x97, or 0x80 to 3.1.1 clients).
    Counter subscriptions_route_set_full: u64 => "subscriptions_refused"
        (SUBS_REFUSED) "reason" = "route_set_full";
    /// Sessions shipped to another node whose claim took their client id over.
    Counter sessions_moved_out: u64 => "sessions_moved"
        ("Sessions moved between nodes, by direction") "direction" = "out";
    /// Sessions shipped here from another node and joined to the one here.
    Counter sessions_moved_in: u64 => "sessions_moved"
        ("Sessions moved between nodes, by direction") "direction" = "in";
    /// Sessions shipped here that were not taken: not their client id's records, another
    /// user's, or for a session that ended here before they arrived.
    Counter sessions_transfers_refused: u64 => "session_transfers_refused";
    /// Claims from peers dropped because the authorizer does not vouch for them (no proof
    /// that the client logged in as the user the claim names).
    Counter claims_unproven: u64 => "claims_unproven";
    /// Claims from peers not taken because another user's claim on the client id stands here
    /// (its session is that user's; the claimer should have refused its client with 0x87).
    Counter claims_of_another_user: u64 => "claims_of_another_user";
    /// Resumed sessions whose wait for the session from another node ran out
    /// (`ClusterConfig::session_transfer_wait_ms`).
    Counter sessions_transfer_waits_over: u64 => "session_transfer_waits_over";
    /// Messages a node relayed to the node a session moved to, for that session.
    Counter messages_relayed: u64 => "messages_relayed";
    /// Messages a relay from here still held for a session's next node when the session came
    /// back here: delivered here, before newer ones (they still go, and come back no second
    /// time).
    Counter messages_taken_back: u64 => "messages_taken_back";
    /// Messages a session that just moved held back, while older ones from their node could
    /// still come by its old node (they go once those are in, in their node's order).
    Counter messages_held_for_order: u64 => "messages_held_for_order";
    /// Holds that ran out (`ClusterConfig::session_order_wait_ms`) before the old node had
    /// passed on everything older: what they held went, and older messages that came after
    /// were delivered late, out of their node's order.
    Counter session_order_waits_over: u64 => "session_order_waits_over";
    /// Sessions resumed here whose client id another node had claimed meanwhile, learnt of
    /// only after this node's own claim (the two could not reach each other): the session
    /// held its messages back for their order until that node's part came (or the hold ran
    /// out).
    Counter session_shipments_expected: u64 => "session_shipments_expected";
    /// Messages delivered to a session that moved after a later one from the same node (a
    /// hold that ran out, or a node the hold did not know).
    Counter messages_delivered_late: u64 => "messages_delivered_late";
    /// Forwards and retained writes that a data-residency rule kept from a node of a region
    /// it does not name (counted on the node that would have sent them).
    Counter residency_withheld: u64 => "residency_withheld";
    /// CONNECTs of client ids pinned to a home region that it did not grant (or not in time).
    Counter connects_home_refused: u64 => "connects_home_refused";
    /// CONNECTs refused.
    Counter connects_refused: u64 => "connects_refused";
    /// Connections closed for protocol errors.
    Counter protocol_errors: u64 => "protocol_errors";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_a_figure_in_order() {
        let stats = Stats {
            connections: 3,
            messages_sent: [1, 2, 3],
            protocol_errors: 9,
            ..Stats::default()
        };
        let figures: Vec<_> = stats.figures().collect();
        assert_eq!(figures.len(), Stats::FIGURES.len());
        assert_eq!(figures[0].0.field, "connections");
        assert_eq!(figures[0].1, FigureValue::One(3));
        let sent = figures.iter().find(|(f, _)| f.field == "messages_sent");
        assert_eq!(sent.map(|(_, v)| *v), Some(FigureValue::ByQos([1, 2, 3])));
        let last = figures.last().unwrap();
        assert_eq!(
            (last.0.field, last.1),
            ("protocol_errors", FigureValue::One(9))
        );
        let queue_full = Stats::FIGURES
            .iter()
            .find(|f| f.field == "dropped_queue_full")
            .unwrap();
        assert_eq!(queue_full.metric, "messages_dropped");
        assert_eq!(queue_full.label, Some(("reason", "queue_full")));
        assert_eq!(queue_full.metric_help, "Messages dropped, by reason");
        assert_eq!(
            queue_full.help.trim(),
            "Deliveries dropped because the session's queue was full."
        );
    }
}
