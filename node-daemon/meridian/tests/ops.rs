//! Operational behaviour: JSON logs, per-listener connection limits, listen backlogs, worker
//! threads.

mod common;

use std::time::Instant;

use common::{DEADLINE, Daemon, http, v3};
use meridian_core::codec::ProtocolVersion::V311;
use rumqttc::QoS;
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let d = Daemon::start_with_config(Some("[log]\nformat = \"json\"\n"));
    let _c = common::raw::Raw::connect(d.mqtt, V311, "logged").await;
    // The broker task logs the connect in the turn it takes it, before it answers the admin
    // API's next question.
    common::wait_for_api(d.admin, "/api/clients/logged", "the client", |c| {
        c["connected"] == true
    })
    .await;
    let log = d.log_text();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            v.get("level").is_some() && v.get("fields").is_some(),
            "{line}"
        );
    }
    assert!(log.contains("\"client_id\":\"logged\""), "{log}");
}

#[tokio::test]
async fn listener_max_connections_closes_the_excess() {
    let d = Daemon::start_with_config(Some("[listeners.tcp]\nmax_connections = 2\n"));
    probes_closed(&d).await;
    let _a = common::raw::Raw::connect(d.mqtt, V311, "a").await;
    let _b = common::raw::Raw::connect(d.mqtt, V311, "b").await;
    closed_at_accept(&d, 2).await;
}

/// Started with 200 open files allowed (300 at most), the daemon raises its own limit to 300,
/// keeps 256 for its own files and shares the other 44 between its two listeners (TCP and
/// WebSocket, max_connections left at 0): 22 MQTT connections are served, the 23rd is closed
/// at accept and counted, and the node goes on serving.
#[tokio::test]
async fn the_listeners_share_what_the_open_file_limit_allows() {
    let d = Daemon::start_under(&["prlimit", "--nofile=200:300"], None);
    probes_closed(&d).await;
    let mut clients = Vec::new();
    for i in 0..22 {
        clients.push(common::raw::Raw::connect(d.mqtt, V311, &format!("c{i}")).await);
    }
    closed_at_accept(&d, 22).await;
    // One leaves, another takes its place.
    drop(clients.pop());
    let deadline = Instant::now() + DEADLINE;
    while common::Metrics::of(d.admin)
        .await
        .get("meridian_connections")
        != Some(21.0)
    {
        assert!(
            Instant::now() < deadline,
            "the client's leaving was never seen"
        );
        tokio::task::yield_now().await;
    }
    let _again = common::raw::Raw::connect(d.mqtt, V311, "again").await;
}

/// One more MQTT connection while `served` are: closed at accept, and counted.
async fn closed_at_accept(d: &Daemon, served: u32) {
    let mut extra = tokio::net::TcpStream::connect(("127.0.0.1", d.mqtt))
        .await
        .unwrap();
    let mut buf = [0u8; 8];
    let n = tokio::time::timeout(DEADLINE, extra.read(&mut buf))
        .await
        .expect("closed in time");
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "connection {} closed: {n:?}",
        served + 1
    );
    let metrics = common::Metrics::of(d.admin).await;
    assert_eq!(
        metrics.get("meridian_connections_rejected_total"),
        Some(1.0),
        "{metrics:?}"
    );
    assert_eq!(
        metrics.get("meridian_connections"),
        Some(f64::from(served)),
        "{metrics:?}"
    );
}

/// Wait until the start-up check's probes of the MQTT and WebSocket ports, which hold a
/// connection slot each until the daemon has seen them closed, are gone.
async fn probes_closed(d: &Daemon) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (_, page) = http(d.admin, "GET", "/metrics").await;
        let value = |name: &str| {
            page.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
        };
        if value("meridian_connections_accepted_total") >= Some(2)
            && value("meridian_connections") == Some(0)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the probes never closed:\n{page}"
        );
        tokio::task::yield_now().await;
    }
}

/// The listen backlog the kernel reports for a listening port (`ss`, from iproute2: the
/// Send-Q of a listening socket is its backlog).
fn listen_backlog(port: u16) -> u32 {
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{port}")])
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"LISTEN"), "ss printed {text:?}");
    fields[2].parse().expect("Send-Q is a number")
}

/// Each listener's backlog comes from its `backlog` key (1024 by default, where std's and
/// tokio's bind would give 128), as far as the kernel's cap allows.
#[test]
fn listener_backlog_comes_from_the_config() {
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .expect("somaxconn")
        .trim()
        .parse()
        .unwrap();
    let d = Daemon::start_with_config(Some("[listeners.tcp]\nbacklog = 300\n"));
    assert_eq!(listen_backlog(d.mqtt), 300.min(somaxconn));
    assert_eq!(listen_backlog(d.ws), 1024.min(somaxconn), "the default");
}

/// `runtime.worker_threads` sets how many worker threads serve connections beside the broker
/// thread, and one is enough.
#[tokio::test]
async fn worker_threads_come_from_the_config() {
    let d = Daemon::start_with_config(Some("[runtime]\nworker_threads = 1\n"));
    let mut sub = v3::connect(v3::options("one-sub", d.mqtt)).await;
    sub.subscribe("one/#", QoS::AtLeastOnce).await;
    let publ = v3::connect(v3::options("one-pub", d.mqtt)).await;
    for i in 0..100u8 {
        publ.client
            .publish(format!("one/{i}"), QoS::AtLeastOnce, false, vec![i; 8])
            .await
            .unwrap();
    }
    for i in 0..100u8 {
        let p = sub.publish_msg().await;
        assert_eq!(
            (p.topic, p.payload.to_vec()),
            (format!("one/{i}"), vec![i; 8])
        );
    }
    let (_, metrics) = http(d.admin, "GET", "/metrics").await;
    assert_eq!(
        common::Metrics::parse(&metrics).get("meridian_runtime_workers"),
        Some(1.0),
        "{metrics}"
    );
    // The broker task routed them on the broker thread, whose busy time counts it.
    let busy = common::Metrics::parse(&metrics)
        .get("meridian_broker_thread_busy_seconds_total")
        .unwrap_or_else(|| panic!("no broker thread figure:\n{metrics}"));
    assert!(busy > 0.0, "{metrics}");

    let d = Daemon::start_with_config(Some("[runtime]\nworker_threads = 3\n"));
    let (_, metrics) = http(d.admin, "GET", "/metrics").await;
    assert_eq!(
        common::Metrics::parse(&metrics).get("meridian_runtime_workers"),
        Some(3.0),
        "{metrics}"
    );
}

/// The value of the next PUBLISH on `topic`.
async fn next_figure(client: &mut v3::Client, topic: &str) -> String {
    client
        .expect(|p| match p {
            rumqttc::Packet::Publish(p) if p.topic == topic => {
                Some(String::from_utf8(p.payload.to_vec()).expect("text"))
            }
            _ => None,
        })
        .await
}

#[tokio::test]
async fn system_topics_give_the_broker_figures_and_follow_changes() {
    let d = Daemon::start_with_config(Some("[mqtt]\nsys_interval_ms = 100\n"));
    let mut watcher = v3::connect(v3::options("watcher", d.mqtt)).await;
    watcher
        .subscribe("$SYS/broker/version", QoS::AtMostOnce)
        .await;
    let version = next_figure(&mut watcher, "$SYS/broker/version").await;
    assert_eq!(
        version,
        format!("meridian version {}", env!("CARGO_PKG_VERSION"))
    );
    const CONNECTED: &str = "$SYS/broker/clients/connected";
    watcher.subscribe(CONNECTED, QoS::AtMostOnce).await;
    assert_eq!(next_figure(&mut watcher, CONNECTED).await, "1");

    // A second client shows in a later figure; a forged one is not relayed.
    let other = v3::connect(v3::options("other", d.mqtt)).await;
    let deadline = Instant::now() + DEADLINE;
    while next_figure(&mut watcher, CONNECTED).await != "2" {
        assert!(Instant::now() < deadline, "the count never reached 2");
    }
    other
        .client
        .publish(CONNECTED, QoS::AtLeastOnce, true, "forged")
        .await
        .unwrap();
    other.disconnect().await;
    loop {
        let figure = next_figure(&mut watcher, CONNECTED).await;
        assert_ne!(
            figure, "forged",
            "a client's PUBLISH under $SYS went through"
        );
        if figure == "1" {
            break;
        }
        assert!(Instant::now() < deadline, "the count never fell back to 1");
    }
    let metrics = common::Metrics::of(d.admin).await;
    assert_eq!(
        metrics.get("meridian_messages_dropped_total{reason=\"not_authorized\"}"),
        Some(1.0),
        "the forged figure is refused: {metrics:?}"
    );
}
