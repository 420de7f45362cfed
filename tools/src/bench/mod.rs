//! `meridian bench`: a load generator for any MQTT broker (MQTT 3.1.1 over TCP, TLS, WebSocket
//! or WSS, through rumqttc).
//!
//! Scenarios: `conn` (connect N clients), `sub` (connect and subscribe N clients to a pattern
//! with `%i`), `pub` (N publishers), and the classic presets `pairs` (N 1:1 pairs), `fan-in`
//! (N:1), `fan-out` (1:N) and `mesh` (every client publishes to and subscribes to all). Every
//! run is bounded by a message count and by time.
//!
//! Each published payload starts with the send time, the publisher's index and a sequence
//! number, so a subscriber measures end-to-end latency and finds lost and duplicated messages.
//! Given the broker's pid, the broker's CPU time and memory are read from `/proc` before and
//! after the measured phase.

mod client;
mod proc;
mod report;
mod scenario;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

pub use report::Report;

/// `meridian bench` arguments.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub scenario: Scenario,
}

#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// N clients connect (at a rate or a concurrency); connect latency.
    Conn(ConnArgs),
    /// N clients connect and each subscribes to a filter with `%i` (its index); time until all
    /// SUBACKs, per-client connect→SUBACK latency, broker memory per connection.
    Sub(SubArgs),
    /// N publishers; messages/s sent (no subscribers of its own).
    Pub(PubArgs),
    /// N pairs: publisher i → topic i → subscriber i.
    Pairs(FlowArgs),
    /// N publishers (default 20) → one subscriber.
    FanIn(FlowArgs),
    /// One publisher → N subscribers (default 20).
    FanOut(FlowArgs),
    /// N clients (default 20), each publishing to and subscribed to one topic: every message
    /// reaches all N.
    Mesh(FlowArgs),
}

/// Where the broker is and how to reach it; what to report.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Broker host.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Broker port (MQTT over TCP or TLS).
    #[arg(long, default_value_t = 1883)]
    pub port: u16,
    /// MQTT over WebSocket at this URL instead (ws://HOST:PORT/PATH, or wss:// with TLS).
    #[arg(long, value_name = "URL")]
    pub ws: Option<String>,
    /// Subscribers connect to this port of --host instead (another broker of the same
    /// deployment: what a message takes to cross between them). Publishing starts 0.5 s after
    /// the last SUBACK, for the subscriptions to reach the publishers' broker.
    #[arg(long, value_name = "PORT")]
    pub sub_port: Option<u16>,
    /// Subscribers connect to this WebSocket URL instead (an edge broker, another region's).
    #[arg(long, value_name = "URL", conflicts_with = "sub_port")]
    pub sub_ws: Option<String>,
    /// TLS (MQTT over TLS on --port, or wss:// with --ws).
    #[arg(long)]
    pub tls: bool,
    /// PEM CA certificates to trust for --tls (default: the system's roots).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    #[arg(long)]
    pub username: Option<String>,
    #[arg(long)]
    pub password: Option<String>,
    /// Prefix of client ids (`PREFIX-<run>-<index>`).
    #[arg(long, default_value = "bench")]
    pub client_prefix: String,
    /// Keep alive, in seconds.
    #[arg(long, default_value_t = 60)]
    pub keep_alive: u64,
    /// Clients connecting at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Connections started per second (0 = as fast as --concurrency allows).
    #[arg(long, default_value_t = 0.0)]
    pub connect_rate: f64,
    /// Upper bound on the whole run, in seconds (connecting, publishing and draining).
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
    /// The broker's process id: report its CPU time, memory and storage writes. Given more
    /// than once (the brokers of two regions), their sum.
    #[arg(long, value_name = "PID")]
    pub broker_pid: Vec<u32>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Worker threads of the load generator (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ConnArgs {
    #[command(flatten)]
    pub common: Common,
    /// Number of clients.
    #[arg(long, short = 'c', default_value_t = 100)]
    pub clients: usize,
    /// Keep the connections open this many seconds after the last one is up.
    #[arg(long, default_value_t = 0.0)]
    pub hold: f64,
}

#[derive(Debug, Clone, Args)]
pub struct SubArgs {
    #[command(flatten)]
    pub common: Common,
    /// Number of clients.
    #[arg(long, short = 'c', default_value_t = 100)]
    pub clients: usize,
    /// Filter each client subscribes to; `%i` is the client's index.
    #[arg(long, short = 't', default_value = "t/mqttx/+/%i/sub/+/#")]
    pub topic: String,
    #[arg(long, short = 'q', default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub qos: u8,
    /// Keep the connections open this many seconds after the last SUBACK (the broker's memory
    /// is read at the end of it).
    #[arg(long, default_value_t = 0.0)]
    pub hold: f64,
}

/// How publishers publish.
#[derive(Debug, Clone, Args)]
pub struct Load {
    /// Payload size in bytes (at least 20: send time, publisher, sequence number).
    #[arg(long, short = 's', default_value_t = 256)]
    pub size: usize,
    #[arg(long, short = 'q', default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub qos: u8,
    /// Messages per second per publisher (0 = as fast as possible).
    #[arg(long, short = 'r', default_value_t = 0.0)]
    pub rate: f64,
    /// Messages per publisher.
    #[arg(long, short = 'n', default_value_t = 100_000)]
    pub count: u64,
    /// Publishing stops after this many seconds even if --count is not reached.
    #[arg(long, short = 'd', default_value_t = 10.0)]
    pub duration: f64,
    /// After publishing, wait this long (seconds) without a delivery before calling the rest
    /// lost.
    #[arg(long, default_value_t = 2.0)]
    pub drain: f64,
    /// QoS 1/2 messages in flight per publisher.
    #[arg(long, default_value_t = 100)]
    pub inflight: u16,
    /// Publish with the RETAIN flag: the broker keeps each topic's last message.
    #[arg(long)]
    pub retain: bool,
}

#[derive(Debug, Clone, Args)]
pub struct PubArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub load: Load,
    /// Number of publishers.
    #[arg(long, short = 'c', default_value_t = 1)]
    pub clients: usize,
    /// Topic each publisher publishes to; `%i` is the publisher's index.
    #[arg(long, short = 't', default_value = "bench/%i")]
    pub topic: String,
}

#[derive(Debug, Clone, Args)]
pub struct FlowArgs {
    #[command(flatten)]
    pub common: Common,
    #[command(flatten)]
    pub load: Load,
    /// Pairs (pairs), publishers (fan-in), subscribers (fan-out) or clients (mesh); default 1
    /// for pairs, 20 otherwise.
    #[arg(long, short = 'c')]
    pub clients: Option<usize>,
    /// Topic prefix of the run's topics.
    #[arg(long, default_value = "bench")]
    pub prefix: String,
}

/// Run `meridian bench`: print the report on stdout.
pub fn bench_command(args: BenchArgs) -> anyhow::Result<()> {
    let common = match &args.scenario {
        Scenario::Conn(a) => &a.common,
        Scenario::Sub(a) => &a.common,
        Scenario::Pub(a) => &a.common,
        Scenario::Pairs(a) | Scenario::FanIn(a) | Scenario::FanOut(a) | Scenario::Mesh(a) => {
            &a.common
        }
    };
    let json = common.json;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = common.threads {
        anyhow::ensure!(n > 0, "--threads must be at least 1");
        builder.worker_threads(n);
    }
    let runtime = builder
        .enable_all()
        .thread_name("meridian-bench")
        .build()
        .context("cannot start the tokio runtime")?;
    proc::raise_fd_limit();
    // Both rustls providers may be compiled in through dependencies; TLS uses ring.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let report = runtime.block_on(scenario::run(args.scenario))?;
    let mut out = std::io::stdout().lock();
    if json {
        report.write_json(&mut out)?;
    } else {
        report.write_text(&mut out)?;
    }
    // Clients still closing must not hold the process.
    runtime.shutdown_timeout(Duration::from_millis(200));
    Ok(())
}
