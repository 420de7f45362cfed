//! Counters kept by the daemon itself (the broker's own are the core's [`Stats`]).
//!
//! Each counter is described once, here, in the core's [`Figure`] form: its field, the metric
//! it is shown as, the label that tells it apart within that metric, and what it counts
//! ([`DaemonCounters::FIGURES`]). The metrics page renders the daemon's counters and the
//! broker's figures alike from their tables.
//!
//! [`Stats`]: meridian_core::broker::Stats

use std::sync::atomic::{AtomicU64, Ordering};

use meridian_core::broker::{Figure, FigureKind, FigureValue};

macro_rules! counters {
    ($(
        $(#[doc = $doc:literal])+
        $field:ident => $metric:literal $(($lname:literal = $lvalue:literal))?;
    )*) => {
        /// Running totals the daemon's tasks add to; each described in
        /// [`DaemonCounters::FIGURES`].
        #[derive(Debug, Default)]
        pub struct DaemonCounters {
            $($(#[doc = $doc])+ pub $field: AtomicU64,)*
        }

        impl DaemonCounters {
            /// Every counter, in the order of [`DaemonCounters::figures`]. A metric's help is
            /// the one given in [`METRIC_HELP`] for metrics of several counters.
            pub const FIGURES: &'static [Figure] = &[$(Figure {
                field: stringify!($field),
                metric: $metric,
                metric_help: metric_help($metric, concat!($($doc),+)),
                label: counters!(@label $($lname, $lvalue)?),
                kind: FigureKind::Counter,
                help: concat!($($doc),+),
            }),*];

            /// Every counter with its value now.
            pub fn figures(&self) -> impl Iterator<Item = (&'static Figure, FigureValue)> + '_ {
                let values = [$(self.$field.load(Ordering::Relaxed)),*];
                Self::FIGURES
                    .iter()
                    .zip(values)
                    .map(|(figure, v)| (figure, FigureValue::One(v)))
            }
        }
    };
    (@label $lname:literal, $lvalue:literal) => { Some(($lname, $lvalue)) };
    (@label) => { None };
}

/// What the metrics of several counters count, told apart by their label.
const METRIC_HELP: &[(&str, &str)] = &[
    (
        "logins_refused",
        "CONNECTs refused before a password check: the check queue was full (busy) or held the \
         client address's share (busy_address); a certificate named another user \
         (certificate_mismatch)",
    ),
    (
        "websocket_refused",
        "WebSocket upgrades refused: a browser Origin not in allowed_origins",
    ),
    (
        "admin_refused",
        "Admin requests refused: no or a wrong token (token), a Host not allowed (host), an \
         Origin of another site (origin), a POST body that is not JSON (content_type), \
         headers not sent in time (header_timeout)",
    ),
    (
        "edge_links_refused",
        "Edge links refused: no or a wrong token, before the upgrade (token); a leaf named as \
         this node or a mesh member (node); a live leaf's name with another token, or a token \
         past its leaves (credential); too many handshakes from one address (busy_address)",
    ),
    (
        "edge_link_frames",
        "Link frames read from edge links (in) and written to them (out)",
    ),
];

/// The help of `metric`: its entry in [`METRIC_HELP`], else the counter's own.
const fn metric_help(metric: &str, own: &'static str) -> &'static str {
    let mut i = 0;
    while i < METRIC_HELP.len() {
        if const_eq(METRIC_HELP[i].0, metric) {
            return METRIC_HELP[i].1;
        }
        i += 1;
    }
    own
}

const fn const_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

counters! {
    /// Password checks done (Argon2 verifications, right or wrong).
    password_checks => "password_checks";
    /// CONNECTs refused with 0x89 because the password-check queue was full.
    logins_busy => "logins_refused" ("reason" = "busy");
    /// CONNECTs refused because the client's address had its share of the password-check
    /// queue.
    logins_busy_address => "logins_refused" ("reason" = "busy_address");
    /// CONNECTs refused because a client certificate's name was not the username given.
    logins_certificate_mismatch => "logins_refused" ("reason" = "certificate_mismatch");
    /// WebSocket upgrades refused for their Origin (HTTP 403).
    websocket_origin_refused => "websocket_refused" ("reason" = "origin");
    /// Admin requests refused: no or a wrong bearer token (HTTP 401).
    admin_refused_token => "admin_refused" ("reason" = "token");
    /// Admin requests refused: a Host header that names no allowed host (HTTP 421).
    admin_refused_host => "admin_refused" ("reason" = "host");
    /// Admin requests refused: an Origin header naming another site (HTTP 403).
    admin_refused_origin => "admin_refused" ("reason" = "origin");
    /// Admin requests refused: a POST whose body is not JSON (HTTP 415).
    admin_refused_content_type => "admin_refused" ("reason" = "content_type");
    /// Admin connections closed because their request headers took too long.
    admin_header_timeouts => "admin_refused" ("reason" = "header_timeout");
    /// Edge links refused: no or a wrong token (HTTP 401).
    edge_links_refused_token => "edge_links_refused" ("reason" = "token");
    /// Edge links refused: a leaf named as this node or a mesh member.
    edge_links_refused_node => "edge_links_refused" ("reason" = "node");
    /// Edge links refused: a live leaf's name with another token, or a token past
    /// cluster.edge.max_leaves_per_token.
    edge_links_refused_credential => "edge_links_refused" ("reason" = "credential");
    /// Edge links refused: too many handshakes from one address (HTTP 503).
    edge_links_refused_busy_address => "edge_links_refused" ("reason" = "busy_address");
    /// Link frames read from edge links.
    edge_frames_in => "edge_link_frames" ("direction" = "in");
    /// Link frames written to edge links.
    edge_frames_out => "edge_link_frames" ("direction" = "out");
    /// Clients disconnected because their write buffer was full.
    slow_consumer_disconnects => "slow_consumer_disconnects";
    /// Link sessions to peer nodes cut because their frame queue was full.
    link_sessions_cut => "link_sessions_cut";
    /// Connections accepted by the listeners.
    connections_accepted => "connections_accepted";
    /// Connections closed at accept because a listener was at max_connections.
    connections_rejected => "connections_rejected";
    /// Storage commits (journal batches).
    storage_commits => "storage_commits";
    /// Commits that waited for others to share their fsync (storage.commit_window_ms: their
    /// sources kept sending without waiting for them).
    storage_commits_waited => "storage_commits_waited";
    /// Fsyncs of the journal: commits made durable, alone or together
    /// (storage.commit_window_ms).
    storage_syncs => "storage_syncs";
    /// Journal checkpoints: the changes since the last written to the database
    /// (storage.journal_max_bytes).
    storage_checkpoints => "storage_checkpoints";
    /// Policy sync messages and documents from peers refused (malformed, past a bound, or
    /// not a policy document); the policy stream that brought each one ended.
    policy_sync_refused => "policy_sync_refused";
    /// Times the policy task failed on a request and started again from its saved document.
    policy_task_restarts => "policy_task_restarts";
    /// Pages the store's cache let go of because it was full (storage.cache_bytes).
    storage_cache_evictions => "storage_cache_evictions";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_is_described_once_and_shares_its_metric_help() {
        let c = DaemonCounters::default();
        c.logins_busy.store(3, Ordering::Relaxed);
        let figures: Vec<_> = c.figures().collect();
        assert_eq!(figures.len(), DaemonCounters::FIGURES.len());
        let (busy, value) = figures
            .iter()
            .find(|(f, _)| f.field == "logins_busy")
            .unwrap();
        assert_eq!(*value, FigureValue::One(3));
        assert_eq!(busy.label, Some(("reason", "busy")));
        assert!(busy.metric_help.starts_with("CONNECTs refused"));
        let mut fields: Vec<_> = DaemonCounters::FIGURES.iter().map(|f| f.field).collect();
        fields.sort_unstable();
        fields.dedup();
        assert_eq!(fields.len(), DaemonCounters::FIGURES.len());
        // A metric of one counter is helped by the counter's own words.
        let syncs = DaemonCounters::FIGURES
            .iter()
            .find(|f| f.metric == "storage_syncs")
            .unwrap();
        assert_eq!(syncs.metric_help, syncs.help);
    }
}
