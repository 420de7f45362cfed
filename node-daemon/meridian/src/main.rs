//! `meridian`: the Meridian MQTT broker.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use meridian_daemon::config::{LogFormat, P2pAddr, P2pPeerId};
use meridian_daemon::{DEFAULT_CONFIG, DaemonConfig, Server};

#[derive(Debug, Parser)]
#[command(
    name = "meridian",
    version,
    about = "Meridian: a geo-distributed MQTT broker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the broker.
    Run(Box<RunArgs>),
    /// Create or update USER in the password FILE (the password is read from stdin).
    Passwd { file: PathBuf, user: String },
    /// Write a new cluster key (the deployment's shared secret) to FILE, or a new operator
    /// key (whose public half, printed, goes in every node's policy.operator_keys).
    #[command(group(clap::ArgGroup::new("key").required(true)))]
    Keygen {
        /// The cluster key file to write.
        #[arg(long, value_name = "FILE", group = "key")]
        cluster_key: Option<PathBuf>,
        /// The operator key file to write (keep it off the nodes).
        #[arg(long, value_name = "FILE", group = "key")]
        operator: Option<PathBuf>,
    },
    /// Print the operator's certificate of a node's region (hex), for that node's
    /// cluster.certificate file: with operator keys, peers take a node's region only with one.
    Certify {
        /// The operator key (`meridian keygen --operator`).
        #[arg(long, value_name = "FILE")]
        operator_key: PathBuf,
        /// The node's peer id (`meridian peer-id`).
        #[arg(long, value_name = "ID")]
        peer_id: libp2p::PeerId,
        /// The region it runs in (its cluster.region).
        #[arg(long, value_name = "NAME")]
        region: String,
    },
    /// Print an edge-link credential signed by an operator key (with policy.operator_keys,
    /// an edge object links with one: its MERIDIAN_LINK_TOKEN).
    CertifyLeaf {
        /// The operator key (`meridian keygen --operator`).
        #[arg(long, value_name = "FILE")]
        operator_key: PathBuf,
        /// The leaf's name (edge-eu), or a prefix of names ending with * (edge-*).
        #[arg(long, value_name = "NAME")]
        name: String,
        /// A topic filter the leaf's messages and subscriptions must lie within (repeat it;
        /// '#' for every topic).
        #[arg(long, value_name = "FILTER", required = true)]
        scope: Vec<String>,
        /// The most distinct filters the leaf may bring.
        #[arg(long, value_name = "N", default_value_t = 100_000)]
        max_filters: u32,
    },
    /// Print the node's peer id (its id in the region mesh), creating its identity if needed.
    PeerId {
        /// Data directory of the node.
        #[arg(long, value_name = "DIR", default_value = "./meridian-data")]
        data_dir: PathBuf,
    },
    /// Run a simulated multi-region deployment in virtual time and print what it measured.
    Sim {
        /// Topology file (TOML: nodes, regions, RTT matrix, clients, workload, faults; see
        /// docs/geo.md). Without one, the built-in --scenario runs.
        #[arg(value_name = "TOPOLOGY")]
        topology: Option<PathBuf>,
        /// Built-in scenario: geo-writeup, or mesh-scale (docs/geo.md, "How far the mesh scales").
        #[arg(long, default_value = "geo-writeup")]
        scenario: String,
        /// Seed of the run: the same seed gives the same run.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// One JSON object per row instead of a table.
        #[arg(long)]
        json: bool,
        /// Draw the run's timeline to this SVG file.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
        /// Write the run as a standalone HTML page: the deployment drawn, its timeline, the
        /// report.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// Load-test any MQTT broker: connect, subscribe, publish, and the classic presets.
    Bench(Box<meridian_tools::bench::BenchArgs>),
    /// Administer a running node through its admin API (peers list, peers forget).
    Ctl(meridian_daemon::cli::CtlArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// TOML configuration file (default: the embedded default, see --print-default-config).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// MQTT over TCP listener address (ip:port).
    #[arg(long, value_name = "ADDR")]
    mqtt: Option<SocketAddr>,
    /// MQTT over WebSocket listener address (ip:port).
    #[arg(long, value_name = "ADDR")]
    ws: Option<SocketAddr>,
    /// Admin HTTP address (ip:port).
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,
    /// A file of the admin API's bearer tokens, one per line (admin.token_file).
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// Data directory.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Node name (logs).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// Region of this node in a multi-region deployment.
    #[arg(long, value_name = "NAME")]
    region: Option<String>,
    /// Join a multi-region deployment: libp2p listen address (repeatable), e.g.
    /// /ip4/0.0.0.0/tcp/7000.
    #[arg(long, value_name = "MULTIADDR")]
    p2p: Vec<libp2p::Multiaddr>,
    /// A bootstrap peer of the deployment (repeatable), e.g. /ip4/10.0.0.2/tcp/7000.
    #[arg(long, value_name = "MULTIADDR")]
    peer: Vec<libp2p::Multiaddr>,
    /// The deployment's cluster key file (`meridian keygen --cluster-key FILE`).
    #[arg(long, value_name = "FILE")]
    cluster_key: Option<PathBuf>,
    /// Let only these peer ids in (repeatable; adds to cluster.allow_peers).
    #[arg(long, value_name = "PEER_ID")]
    allow_peer: Vec<libp2p::PeerId>,
    /// Connect only to the bootstrap peers and to nodes that dial this one (cluster.discover =
    /// false).
    #[arg(long)]
    no_discover: bool,
    /// An address other nodes should dial to reach this one (repeatable; adds to
    /// cluster.advertise).
    #[arg(long, value_name = "MULTIADDR")]
    advertise: Vec<libp2p::Multiaddr>,
    /// Serve edge links (leaves of this node) on this address (cluster.edge.listen).
    #[arg(long, value_name = "ADDR")]
    edge_link: Option<SocketAddr>,
    /// The tokens edge links present, one per line (cluster.edge.token_file).
    #[arg(long, value_name = "FILE")]
    edge_token_file: Option<PathBuf>,
    /// Print the full default configuration file and exit.
    #[arg(long)]
    print_default_config: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(*args),
        Command::Passwd { file, user } => meridian_daemon::cli::passwd_command(&file, &user),
        Command::Keygen {
            cluster_key,
            operator,
        } => match (cluster_key, operator) {
            (Some(path), _) => {
                meridian_daemon::cli::keygen_command(&path, &mut std::io::stdout().lock())
            }
            (None, Some(path)) => {
                meridian_daemon::cli::operator_keygen_command(&path, &mut std::io::stdout().lock())
            }
            (None, None) => unreachable!("clap requires one of them"),
        },
        Command::Certify {
            operator_key,
            peer_id,
            region,
        } => meridian_daemon::cli::certify_command(
            &operator_key,
            &peer_id,
            &region,
            &mut std::io::stdout().lock(),
        ),
        Command::CertifyLeaf {
            operator_key,
            name,
            scope,
            max_filters,
        } => meridian_daemon::cli::certify_leaf_command(
            &operator_key,
            &name,
            &scope,
            max_filters,
            &mut std::io::stdout().lock(),
        ),
        Command::PeerId { data_dir } => {
            meridian_daemon::cli::peer_id_command(&data_dir, &mut std::io::stdout().lock())
        }
        Command::Sim {
            topology,
            scenario,
            seed,
            json,
            svg,
            html,
        } => {
            let args = meridian_tools::sim::SimArgs {
                topology,
                scenario,
                seed,
                json,
                svg,
                html,
            };
            meridian_tools::sim::sim_command(&args, &mut std::io::stdout().lock())
        }
        Command::Bench(args) => meridian_tools::bench::bench_command(*args),
        Command::Ctl(args) => {
            meridian_daemon::cli::ctl_command(&args, &mut std::io::stdout().lock())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("meridian: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    if args.print_default_config {
        #[allow(clippy::print_stdout)]
        {
            print!("{DEFAULT_CONFIG}");
        }
        return Ok(());
    }
    let config = load_config(&args)?;
    init_logging(&config)?;

    let runtime = config
        .runtime
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async move {
        let span = tracing::info_span!("node", name = %config.node.name);
        let _enter = span.enter();
        // Before the start, which may take a while: a signal meanwhile is handled once the
        // broker is up, rather than ending the process unflushed.
        let mut signals = Signals::new()?;
        let mut server = Server::start(config).await?;
        tracing::info!("ready");
        loop {
            tokio::select! {
                r = server.stopped() => {
                    r?;
                    anyhow::bail!("the broker stopped unexpectedly");
                }
                signal = signals.next() => match signal? {
                    Signal::Stop => break,
                    Signal::Reload => reload(&args, &server).await,
                },
            }
        }
        tracing::info!("shutting down");
        server.shutdown().await?;
        tracing::info!("bye");
        Ok(())
    })
}

/// The configuration `meridian run` runs with: the file (or the embedded default), then the
/// command line's overrides. Read again on SIGHUP.
fn load_config(args: &RunArgs) -> anyhow::Result<DaemonConfig> {
    let mut config = match &args.config {
        Some(path) => DaemonConfig::load(path)?,
        None => DaemonConfig::default(),
    };
    if let Some(a) = args.mqtt {
        config.listeners.tcp.enabled = true;
        config.listeners.tcp.bind = a;
    }
    if let Some(a) = args.ws {
        config.listeners.ws.enabled = true;
        config.listeners.ws.bind = a;
    }
    if let Some(f) = &args.admin_token_file {
        config.admin.token_file.clone_from(f);
    }
    if let Some(a) = args.admin {
        config.admin.enabled = true;
        config.admin.bind = a;
    }
    if let Some(d) = args.data_dir.clone() {
        config.storage.data_dir = d;
    }
    if let Some(n) = args.node_name.clone() {
        config.node.name = n;
    }
    let cluster = &mut config.cluster;
    if let Some(r) = args.region.clone() {
        cluster.region = r;
    }
    if !args.p2p.is_empty() {
        cluster.enabled = true;
        cluster.listen = args.p2p.iter().cloned().map(P2pAddr).collect();
    }
    cluster.peers.extend(args.peer.iter().cloned().map(P2pAddr));
    if let Some(k) = args.cluster_key.clone() {
        cluster.key_file = k;
    }
    cluster
        .allow_peers
        .extend(args.allow_peer.iter().copied().map(P2pPeerId));
    if args.no_discover {
        cluster.discover = false;
    }
    cluster
        .advertise
        .extend(args.advertise.iter().cloned().map(P2pAddr));
    if let Some(a) = args.edge_link {
        cluster.edge.listen = a.to_string();
    }
    if let Some(f) = args.edge_token_file.clone() {
        cluster.edge.token_file = f;
    }
    config.validate_cluster("command line")?;
    Ok(config)
}

/// Read the configuration again and apply its `[auth]` and `[acl]` (SIGHUP). A configuration
/// that cannot be read leaves everything as it was.
async fn reload(args: &RunArgs, server: &Server) {
    match server.reload(|| load_config(args)).await {
        Ok(r) => {
            tracing::info!(
                users = r.summary.users,
                anonymous = r.summary.anonymous,
                acl_rules = r.summary.acl_rules,
                "reloaded the password file and ACL rules"
            );
            if r.other_changes {
                tracing::warn!(
                    "the configuration changed beyond [auth] and [acl]: \
                     those changes take effect at the next start"
                );
            }
        }
        Err(e) => tracing::error!(
            error = format!("{e:#}"),
            "reload failed: the password file and ACL rules stay as they were"
        ),
    }
}

/// What a signal asks of `meridian run`.
enum Signal {
    /// SIGINT, SIGTERM: shut down.
    Stop,
    /// SIGHUP: reload the password file and ACL rules.
    Reload,
}

#[cfg(unix)]
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            hup: signal(SignalKind::hangup()).context("SIGHUP handler")?,
        })
    }

    async fn next(&mut self) -> anyhow::Result<Signal> {
        Ok(tokio::select! {
            _ = self.term.recv() => Signal::Stop,
            _ = self.int.recv() => Signal::Stop,
            _ = self.hup.recv() => Signal::Reload,
        })
    }
}

/// Ctrl-C only: no reload outside Unix.
#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn new() -> anyhow::Result<Self> {
        Ok(Self)
    }

    async fn next(&mut self) -> anyhow::Result<Signal> {
        tokio::signal::ctrl_c().await.context("Ctrl-C handler")?;
        Ok(Signal::Stop)
    }
}

fn init_logging(config: &DaemonConfig) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.is_empty() => EnvFilter::try_new(v).context("RUST_LOG")?,
        _ => EnvFilter::try_new(&config.log.level).context("log.level")?,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}
