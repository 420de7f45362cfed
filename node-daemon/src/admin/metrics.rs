//! The metrics page: every figure of the broker's `Stats` and the daemon's counters, as their
//! tables describe them, the worker threads and the broker thread, and the mesh's peers.

use std::sync::atomic::Ordering;

use meridian_core::broker::{Figure, FigureKind, FigureValue, PeerSummary, Stats};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::runtime::RuntimeMetrics;

use crate::mailbox::DaemonCounters;
use crate::mesh::MeshStats;

/// Figures as their table describes them ([`Stats::FIGURES`], [`DaemonCounters::FIGURES`]):
/// labelled figures of one metric (the reasons of `messages_dropped`, the QoS levels of
/// `messages_received`) as one family.
fn render_figures<'a>(r: &mut Registry, figures: impl Iterator<Item = (&'a Figure, FigureValue)>) {
    let mut families: Vec<(&Figure, Family<Labels, Counter>)> = Vec::new();
    for (figure, value) in figures {
        let help = figure.metric_help.trim().trim_end_matches('.');
        let labelled = figure.label.is_some() || matches!(value, FigureValue::ByQos(_));
        if !labelled {
            let FigureValue::One(v) = value else {
                continue;
            };
            match figure.kind {
                FigureKind::Gauge => {
                    let g: Gauge = Gauge::default();
                    g.set(i64::try_from(v).unwrap_or(i64::MAX));
                    r.register(figure.metric, help, g);
                }
                FigureKind::Counter => {
                    let c: Counter = Counter::default();
                    c.inc_by(v);
                    r.register(figure.metric, help, c);
                }
            }
            continue;
        }
        let i = match families.iter().position(|(f, _)| f.metric == figure.metric) {
            Some(i) => i,
            None => {
                families.push((figure, Family::default()));
                families.len() - 1
            }
        };
        let family = &families[i].1;
        match value {
            FigureValue::ByQos(by_qos) => {
                for (qos, v) in by_qos.iter().enumerate() {
                    family
                        .get_or_create(&vec![("qos".to_owned(), qos.to_string())])
                        .inc_by(*v);
                }
            }
            FigureValue::One(v) => {
                if let Some((name, label)) = figure.label {
                    family
                        .get_or_create(&vec![(name.to_owned(), label.to_owned())])
                        .inc_by(v);
                }
            }
        }
    }
    for (figure, family) in families {
        let help = figure.metric_help.trim().trim_end_matches('.');
        r.register(figure.metric, help, family);
    }
}

/// The metrics page from a snapshot of the broker's [`Stats`], the daemon's counters, the
/// runtime's worker threads and the broker thread, and, in cluster mode, the peers and the
/// mesh's counters.
pub fn render_metrics(
    s: &Stats,
    d: &DaemonCounters,
    peers: &[PeerSummary],
    mesh: Option<&MeshStats>,
    runtime: &RuntimeMetrics,
    broker_thread: &RuntimeMetrics,
) -> String {
    let mut r = Registry::with_prefix("meridian");
    render_figures(&mut r, s.figures());
    render_figures(&mut r, d.figures());
    if let Some(m) = mesh {
        render_mesh_metrics(&mut r, peers, m);
    }
    render_runtime_metrics(&mut r, runtime);
    let busy = Counter::<f64, std::sync::atomic::AtomicU64>::default();
    busy.inc_by(broker_thread.worker_total_busy_duration(0).as_secs_f64());
    r.register(
        "broker_thread_busy_seconds",
        "Time the broker thread (the broker task and the region mesh) spent running",
        busy,
    );
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}

/// The worker threads (`runtime.worker_threads`): how many, how busy, how often they sleep.
fn render_runtime_metrics(r: &mut Registry, rt: &RuntimeMetrics) {
    let workers: Gauge = Gauge::default();
    workers.set(i64::try_from(rt.num_workers()).unwrap_or(i64::MAX));
    r.register(
        "runtime_workers",
        "Worker threads serving clients and the broker (runtime.worker_threads)",
        workers,
    );
    let tasks: Gauge = Gauge::default();
    tasks.set(i64::try_from(rt.num_alive_tasks()).unwrap_or(i64::MAX));
    r.register(
        "runtime_tasks",
        "Tasks alive on the worker threads: one per TLS or WebSocket connection, plus the \
         daemon's own (listeners, edge links, the policy document, admin HTTP)",
        tasks,
    );
    let busy = Family::<Labels, Counter<f64, std::sync::atomic::AtomicU64>>::default();
    let parks = Family::<Labels, Counter>::default();
    for w in 0..rt.num_workers() {
        let label = vec![("worker".to_owned(), w.to_string())];
        busy.get_or_create(&label)
            .inc_by(rt.worker_total_busy_duration(w).as_secs_f64());
        parks.get_or_create(&label).inc_by(rt.worker_park_count(w));
    }
    r.register(
        "runtime_worker_busy_seconds",
        "Time each worker thread spent running tasks",
        busy,
    );
    r.register(
        "runtime_worker_parks",
        "Times each worker thread went to sleep for want of work",
        parks,
    );
}

type Labels = Vec<(String, String)>;
/// A per-peer gauge: name, help, value.
type PeerGauge = (&'static str, &'static str, fn(&PeerSummary) -> i64);

fn render_mesh_metrics(r: &mut Registry, peers: &[PeerSummary], m: &MeshStats) {
    let rtt = rtt_map(Some(m));
    // The peer id, and the region it named in its hello (empty until then), so that a
    // dashboard can show `afs1 -> euc1` rather than two peer ids.
    let label = |p: &PeerSummary| {
        vec![
            ("peer".to_owned(), p.node.to_string()),
            ("region".to_owned(), p.region.clone().unwrap_or_default()),
        ]
    };
    let gauges: [PeerGauge; 5] = [
        (
            "peer_connected",
            "1 while a link session to the peer is up",
            |p| i64::from(p.connected),
        ),
        (
            "peer_routes",
            "Filters the peer has subscribers for, as replicated here",
            |p| i64::try_from(p.routes).unwrap_or(i64::MAX),
        ),
        (
            "peer_route_lag",
            "Route-set versions the peer announced and this node has not applied yet",
            |p| {
                i64::try_from(p.announced_version.saturating_sub(p.route_version))
                    .unwrap_or(i64::MAX)
            },
        ),
        (
            "peer_outbox_messages",
            "QoS 1/2 forwards waiting for the peer's ack",
            |p| i64::try_from(p.outbox_messages).unwrap_or(i64::MAX),
        ),
        (
            "peer_outbox_bytes",
            "Topic and payload bytes waiting in the peer's outbox",
            |p| i64::try_from(p.outbox_bytes).unwrap_or(i64::MAX),
        ),
    ];
    for (name, help, value) in gauges {
        let family = Family::<Labels, Gauge>::default();
        for p in peers {
            family.get_or_create(&label(p)).set(value(p));
        }
        r.register(name, help, family);
    }
    let rtt_family = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    for p in peers {
        if let Some(d) = rtt.get(p.node.as_str()) {
            rtt_family.get_or_create(&label(p)).set(d.as_secs_f64());
        }
    }
    r.register(
        "peer_rtt_seconds",
        "Last ping round trip to the peer",
        rtt_family,
    );
    for (name, help, value) in [
        (
            "forward_sent_messages",
            "Messages forwarded to the peer (once per message, whatever its subscriber count)",
            (|p: &PeerSummary| p.forwarded_to) as fn(&PeerSummary) -> u64,
        ),
        (
            "forward_received_messages",
            "Messages the peer forwarded to this node",
            |p: &PeerSummary| p.forwarded_from,
        ),
    ] {
        let family = Family::<Labels, Counter>::default();
        for p in peers {
            family.get_or_create(&label(p)).inc_by(value(p));
        }
        r.register(name, help, family);
    }
    let refused = Family::<Labels, Counter>::default();
    for (reason, v) in [
        ("handshake", m.refused_handshake.load(Ordering::Relaxed)),
        ("not_allowed", m.refused_not_allowed.load(Ordering::Relaxed)),
        ("limit", m.refused_limit.load(Ordering::Relaxed)),
    ] {
        refused
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc_by(v);
    }
    r.register(
        "p2p_refused_connections",
        "Connections refused: failed handshake (no or wrong cluster key), peer not allowed, or \
         past cluster.max_peer_connections or its per-address share",
        refused,
    );
    let c = Counter::<u64>::default();
    c.inc_by(m.policy_refused.load(Ordering::Relaxed));
    r.register(
        "p2p_policy_streams_refused",
        "Policy sync streams refused because the peer is no member (where members must be \
         certified: its hello carried no certificate of the operator's)",
        c,
    );
    let c = Counter::<u64>::default();
    c.inc_by(m.dial_failures.load(Ordering::Relaxed));
    r.register(
        "p2p_dial_failures",
        "Dials of bootstrap or discovered peers that failed",
        c,
    );
    let g = Gauge::<i64>::default();
    g.set(
        m.discovered
            .lock()
            .map_or(0, |d| i64::try_from(d.len()).unwrap_or(i64::MAX)),
    );
    r.register(
        "p2p_discovered_peers",
        "Peers known through discovery (announced by other nodes)",
        g,
    );
    let c = Counter::<u64>::default();
    c.inc_by(m.gossip_fallbacks.load(Ordering::Relaxed));
    r.register(
        "p2p_gossip_fallbacks",
        "Broadcasts gossip could not take, sent over the link sessions instead",
        c,
    );
    let c = Counter::<u64>::default();
    c.inc_by(m.gossip_refused.load(Ordering::Relaxed));
    r.register(
        "p2p_gossip_refused",
        "Gossiped frames refused: malformed, or of a kind that travels on link sessions only",
        c,
    );
}

pub(super) fn rtt_map(
    mesh: Option<&MeshStats>,
) -> std::collections::HashMap<String, std::time::Duration> {
    mesh.and_then(|m| m.rtt.lock().ok().map(|r| r.clone()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_page_names_every_family() {
        let stats = Stats {
            connections: 3,
            messages_received: [1, 2, 3],
            dropped_queue_full: 7,
            ..Stats::default()
        };
        let runtime = crate::config::RuntimeConfig { worker_threads: 2 }
            .build()
            .unwrap();
        let page = render_metrics(
            &stats,
            &DaemonCounters::default(),
            &[],
            None,
            &runtime.metrics(),
            &runtime.metrics(),
        );
        assert!(page.contains("meridian_connections 3"), "{page}");
        assert!(
            page.contains("meridian_messages_received_total{qos=\"2\"} 3"),
            "{page}"
        );
        assert!(
            page.contains("meridian_messages_dropped_total{reason=\"queue_full\"} 7"),
            "{page}"
        );
        assert!(
            page.contains("meridian_slow_consumer_disconnects_total 0"),
            "{page}"
        );
        assert!(page.contains("meridian_runtime_workers 2"), "{page}");
        assert!(
            page.contains("meridian_broker_thread_busy_seconds_total "),
            "{page}"
        );
        assert!(
            page.contains("meridian_runtime_worker_parks_total{worker=\"1\"}"),
            "{page}"
        );
        assert!(
            page.contains("meridian_runtime_worker_busy_seconds_total{worker=\"0\"}"),
            "{page}"
        );
        assert!(page.ends_with("# EOF\n"));
    }
}
