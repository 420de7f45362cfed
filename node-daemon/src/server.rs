//! Starting and stopping a whole broker: storage, the broker task, listeners, admin HTTP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use meridian_core::broker::AuthOutcome;
use meridian_core::broker::{ClusterConfig, HomeRegion, PeerLimits};
use meridian_core::link::OutboxLimits;
use meridian_core::routes::NodeId;
use meridian_core::{Broker, ConnId};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tracing::{info, warn};

use crate::auth;
use crate::broker_thread::BrokerThread;
use crate::config::DaemonConfig;
use crate::config::PolicySource;
use crate::engine::Engine;
use crate::mailbox::{
    ConnEvent, DaemonCounters, ENGINE_QUEUE, EngineHandle, MeshCmd, PolicyChange,
    SendAuthenticator, SendAuthorizer, ToEngine,
};
use crate::mesh::{self, Mesh, MeshSettings, MeshStats};
use crate::policy::document::Policy;
use crate::policy::document::TokenKind;
use crate::policy::tokens::{TokenSet, Tokens};
use crate::policy::{PolicyHandle, PolicySettings, Seed, SeedFiles, Snapshot};
use crate::storage::Store;
use crate::transport::listen::{self, ListenerSpec, Transport};

/// Builds and starts a broker inside the caller's tokio runtime.
///
/// ```no_run
/// # async fn demo() -> anyhow::Result<()> {
/// let server = meridian_daemon::BrokerBuilder::new()
///     .mqtt_addr("127.0.0.1:0".parse()?)
///     .data_dir("/tmp/meridian-example")
///     .start()
///     .await?;
/// println!("MQTT on {}", server.local_addr("tcp").unwrap());
/// server.shutdown().await?;
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct BrokerBuilder {
    config: DaemonConfig,
    auth: Option<AuthFactory>,
}

impl std::fmt::Debug for BrokerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerBuilder")
            .field("config", &self.config)
            .field("custom_auth", &self.auth.is_some())
            .finish()
    }
}

/// Builds the broker's authenticator and authorizer. They are `Send`: the broker is built on
/// the blocking pool and runs on the broker thread. The [`AuthDecisions`] handle lets an
/// authenticator that answered `AuthOutcome::Pending` deliver its decision later, from any
/// thread or task.
pub type AuthFactory =
    Box<dyn FnOnce(AuthDecisions) -> (SendAuthenticator, SendAuthorizer) + Send + 'static>;

/// Delivers decisions for authentications answered with `AuthOutcome::Pending`.
#[derive(Debug, Clone)]
pub struct AuthDecisions {
    tx: mpsc::Sender<ToEngine>,
}

impl AuthDecisions {
    /// Decide for `conn` (from `AuthRequest::conn`). Waits if the broker task is busy.
    pub async fn decide(&self, conn: ConnId, outcome: AuthOutcome) {
        let _ = self
            .tx
            .send(ToEngine::Conn(ConnEvent::AuthDecision { conn, outcome }))
            .await;
    }

    /// Same, from a thread that is not running async code.
    pub fn blocking_decide(&self, conn: ConnId, outcome: AuthOutcome) {
        let _ = self
            .tx
            .blocking_send(ToEngine::Conn(ConnEvent::AuthDecision { conn, outcome }));
    }
}

impl BrokerBuilder {
    /// The embedded default configuration (see [`crate::DEFAULT_CONFIG`]).
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_config(config: DaemonConfig) -> Self {
        Self { config, auth: None }
    }

    /// Replace the password file and ACL of the configuration with the application's own
    /// authentication (including MQTT 5.0 enhanced authentication: answer
    /// `AuthOutcome::Continue` to send AUTH challenges) and authorization. Non-loopback
    /// listeners are allowed with it: the application is responsible for who gets in.
    pub fn auth(mut self, factory: AuthFactory) -> Self {
        self.auth = Some(factory);
        self
    }

    pub fn config_mut(&mut self) -> &mut DaemonConfig {
        &mut self.config
    }

    pub fn mqtt_addr(mut self, addr: SocketAddr) -> Self {
        self.config.listeners.tcp.enabled = true;
        self.config.listeners.tcp.bind = addr;
        self
    }

    /// Turn the WebSocket listener on at `addr`, or off with `None`.
    pub fn ws_addr(mut self, addr: Option<SocketAddr>) -> Self {
        match addr {
            Some(a) => {
                self.config.listeners.ws.enabled = true;
                self.config.listeners.ws.bind = a;
            }
            None => self.config.listeners.ws.enabled = false,
        }
        self
    }

    /// Turn admin HTTP on at `addr`, or off with `None`.
    pub fn admin_addr(mut self, addr: Option<SocketAddr>) -> Self {
        match addr {
            Some(a) => {
                self.config.admin.enabled = true;
                self.config.admin.bind = a;
            }
            None => self.config.admin.enabled = false,
        }
        self
    }

    pub fn data_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.config.storage.data_dir = dir.into();
        self
    }

    /// Restore state, bind every listener and start serving. Returns once the listeners
    /// accept connections.
    pub async fn start(self) -> anyhow::Result<Server> {
        Server::start_with_auth(self.config, self.auth).await
    }
}

/// A running broker. Dropping it without [`Server::shutdown`] stops its broker thread at once,
/// without the orderly steps (as a crash would).
#[derive(Debug)]
pub struct Server {
    handle: EngineHandle,
    addrs: Vec<(&'static str, SocketAddr)>,
    stop: watch::Sender<bool>,
    engine_done: oneshot::Receiver<anyhow::Result<()>>,
    permits: Vec<(Arc<Semaphore>, usize)>,
    mesh: Option<Mesh>,
    /// The configuration it started with.
    config: DaemonConfig,
    /// Its hooks are the application's own ([`BrokerBuilder::auth`]), not the configuration's.
    custom_auth: bool,
    /// Shared by its hooks and those of every reload.
    verify_limits: auth::VerifyLimits,
    /// The policy document, when users and rules come from it.
    policy: Option<PolicyHandle>,
    /// Runs the broker task and the mesh.
    broker_thread: BrokerThread,
}

impl Server {
    pub async fn start(config: DaemonConfig) -> anyhow::Result<Self> {
        Self::start_with_auth(config, None).await
    }

    /// Start with the application's own authenticator and authorizer (see
    /// [`BrokerBuilder::auth`]).
    pub async fn start_with_auth(
        config: DaemonConfig,
        custom_auth: Option<AuthFactory>,
    ) -> anyhow::Result<Self> {
        let has_custom_auth = custom_auth.is_some();
        let counters = Arc::new(DaemonCounters::default());
        let verify_limits = auth::VerifyLimits::new(counters.clone());
        // Whether clients get in without logging in, for the WebSocket listeners' origin
        // policy. The application's own hooks are taken to decide who gets in.
        let (tx, rx) = mpsc::channel(ENGINE_QUEUE);
        // Cluster mode: the secrets first, so that a missing key stops the start early.
        let cluster = &config.cluster;
        let p2p = if cluster.enabled {
            let key =
                mesh::keys::load_cluster_key(&cluster.key_file).context("cluster.key_file")?;
            let identity = mesh::keys::load_or_create_identity(&config.storage.data_dir)?;
            let node = NodeId::new(&identity.public().to_peer_id().to_string())
                .context("peer id as node id")?;
            let (commands, orders) = mpsc::channel::<MeshCmd>(MESH_QUEUE);
            Some(MeshStart {
                key,
                identity,
                node,
                commands,
                orders,
                stats: Arc::new(MeshStats::default()),
            })
        } else {
            None
        };
        let handle = EngineHandle {
            tx,
            counters: counters.clone(),
        };
        let node_id = p2p.as_ref().map(|p| p.node.to_string());
        // The policy document, unless the application decides who gets in or the files do.
        let policy = if custom_auth.is_none() && config.policy.source == PolicySource::Document {
            let settings = policy_settings(&config, node_id.clone())?;
            Some(PolicyHandle::start(settings).await?)
        } else {
            None
        };
        // What the broker starts with (the follower applies any later change).
        let started_with = policy.as_ref().map(PolicyHandle::current);
        let auth_setup = match (custom_auth, &started_with) {
            (Some(f), _) => Err(f),
            (None, Some(p)) => Ok(auth::AuthSetup::from_policy(&config, p, true)?),
            (None, None) => Ok(auth::AuthSetup::from_config(&config)?),
        };
        // The policy document's tokens, or (`policy.source = "files"`) the token files'.
        let token_source = |kind: TokenKind, file: &std::path::Path, key: &str, name: &str| {
            anyhow::Ok(match &policy {
                Some(p) => Tokens::Policy(p.watch(), kind),
                None => Tokens::Fixed(Arc::new(TokenSet::from_file(file, key, name)?)),
            })
        };
        let admin_tokens = token_source(
            TokenKind::Admin,
            &config.admin.token_file,
            "admin.token_file",
            crate::policy::ADMIN_FILE_TOKEN,
        )?;
        let admin_access = crate::admin::AdminAccess::new(&config.admin, admin_tokens)?;
        let anonymous = auth_setup.as_ref().is_ok_and(auth::AuthSetup::anonymous);
        if let Some(p) = &policy {
            let current = p.current();
            info!(
                users = current.users.len(),
                acl_rules = current.acl.len(),
                admin_tokens = current.admin_tokens.len(),
                "users, access rules and tokens from the policy document"
            );
        }
        let core_cluster = p2p.as_ref().map(|p| {
            (
                core_cluster_config(cluster, p.node.clone()),
                p.commands.clone(),
            )
        });
        // In force before anything is restored or advertised.
        let residency = started_with
            .as_ref()
            .map(|p| (p.residency(), p.node_regions()));

        // The broker task. Opening the store and restoring from it may take a while: that
        // runs on the blocking pool; serving runs on the runtime's workers.
        let (done_tx, done_rx) = oneshot::channel();
        let mut core_config = config.core_config();
        // A fresh seed per start: assigned client ids must not repeat those of sessions that
        // survived a restart.
        core_config.seed = fresh_seed();
        let storage = config.storage.clone();
        let write_limits = crate::engine::WriteLimits::from_config(&config.limits);
        let engine_tx = handle.tx.clone();
        let hook_limits = verify_limits.clone();
        let (poll, tcp) = crate::transport::tcp::new().context("cannot create an epoll set")?;
        let broker_thread = BrokerThread::start()?;
        let poller = {
            // Watched by the broker thread's runtime, which runs the broker task.
            let _on_it = broker_thread.handle().enter();
            crate::transport::tcp::Poller::new(poll).context("cannot watch the epoll set")?
        };
        let engine = tokio::task::spawn_blocking(move || {
            let mut store = Store::open(
                &storage.data_dir,
                storage.sync,
                Duration::from_millis(storage.sync_interval_ms),
                storage.cache_bytes,
                storage.journal_max_bytes,
            )?;
            let (authn, authz) = match auth_setup {
                Ok(setup) => setup.build(engine_tx, &hook_limits),
                Err(factory) => factory(AuthDecisions { tx: engine_tx }),
            };
            let now = crate::engine::Clock::default().now();
            let mut broker = Broker::with_auth(core_config, now, authn, authz);
            let mut mesh_tx = None;
            if let Some((mut cluster, cmd_tx)) = core_cluster {
                // A new incarnation per start: peers replace this node's old routes.
                cluster.incarnation = store.next_incarnation()?;
                info!(
                    node = %cluster.node,
                    incarnation = cluster.incarnation,
                    region = %cluster.region,
                    "cluster mode"
                );
                broker.enable_cluster(now, cluster);
                if let Some((rules, node_regions)) = residency {
                    broker.set_residency(now, rules);
                    broker.set_node_regions(now, node_regions);
                }
                mesh_tx = Some(cmd_tx);
            }
            let mut engine = Engine::new(broker, store, write_limits, counters, tcp)?
                .with_commit_window(Duration::from_millis(storage.commit_window_ms));
            if let Some(tx) = mesh_tx {
                engine = engine.with_mesh(tx);
            }
            Ok::<_, anyhow::Error>(engine)
        })
        .await
        .context("broker start-up panicked")??;
        broker_thread.handle().spawn(async move {
            let r = engine.run(rx, poller).await;
            if let Err(e) = &r {
                crate::engine::log::storage_failure(e);
            }
            let _ = done_tx.send(r.map_err(anyhow::Error::from));
        });

        // Listeners, only now that the state is restored.
        let (stop, stop_rx) = watch::channel(false);
        let mut addrs = Vec::new();
        let mut permits = Vec::new();
        let mut mesh = None;
        let bound = async {
            if let Some(MeshStart {
                key,
                identity,
                orders,
                stats,
                ..
            }) = p2p
            {
                let settings = MeshSettings {
                    listen: cluster.listen.iter().map(|a| a.0.clone()).collect(),
                    bootstrap: cluster.peers.iter().map(|a| a.0.clone()).collect(),
                    cluster_key: key,
                    allow: cluster.allow_peers.iter().map(|p| p.0).collect(),
                    ping_interval: Duration::from_millis(cluster.ping_interval_ms),
                    redial_min: Duration::from_millis(250),
                    redial_max: Duration::from_secs(10),
                    discover: cluster.discover,
                    advertise: cluster.advertise.iter().map(|a| a.0.clone()).collect(),
                    announce_every: Duration::from_millis(cluster.announce_interval_ms),
                    link_limits: cluster.link_limits(),
                    policy: policy.clone(),
                };
                // On the broker thread: the swarm's connections and the link sessions are
                // spawned from it, beside the broker task.
                let engine_tx = handle.tx.clone();
                let region = cluster.region.clone();
                let started = broker_thread.handle().spawn(async move {
                    mesh::start(settings, identity, engine_tx, orders, stats, &region).await
                });
                mesh = Some(started.await.context("the mesh's start panicked")??);
            }
            if let Some(addr) = cluster.edge.listen_addr().filter(|_| cluster.enabled) {
                let edge = &cluster.edge;
                let tokens = token_source(
                    TokenKind::Edge,
                    &edge.token_file,
                    "cluster.edge.token_file",
                    crate::policy::EDGE_FILE_TOKEN,
                )?;
                if tokens.is_empty() {
                    warn!(
                        "edge links: no edge-link token, no edge object can link until one is \
                         added (meridian ctl token add edge NAME)"
                    );
                }
                let tls = if edge.tls() {
                    Some(
                        crate::transport::tls::server_acceptor(&edge.cert, &edge.key)
                            .context("cluster.edge: cannot load the TLS certificate or key")?,
                    )
                } else {
                    None
                };
                let listener = TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cluster.edge.listen: cannot bind {addr}"))?;
                let local = listener.local_addr()?;
                info!(addr = %local, tls = edge.tls(), "edge links listening");
                addrs.push(("edge", local));
                let node = node_id.clone().unwrap_or_default();
                let settings = crate::edge::EdgeSettings {
                    node,
                    tokens,
                    tls,
                    max_links: edge.max_links,
                    limits: cluster.link_limits(),
                };
                tokio::spawn(crate::edge::serve(
                    listener,
                    settings,
                    handle.tx.clone(),
                    handle.counters.clone(),
                    stop_rx.clone(),
                ));
            }
            if config.admin.enabled {
                let listener = TcpListener::bind(config.admin.bind)
                    .await
                    .with_context(|| format!("admin: cannot bind {}", config.admin.bind))?;
                let local = listener.local_addr()?;
                info!(addr = %local, "admin HTTP listening");
                addrs.push(("admin", local));
                let node = crate::admin::NodeInfo {
                    name: config.node.name.clone(),
                    region: cluster.enabled.then(|| cluster.region.clone()),
                    peer_id: mesh.as_ref().map(|m: &Mesh| m.peer_id.to_string()),
                    p2p_addrs: mesh.as_ref().map_or_else(Vec::new, |m: &Mesh| {
                        m.listen_addrs.iter().map(ToString::to_string).collect()
                    }),
                    started: std::time::Instant::now(),
                };
                let state = crate::admin::AdminState {
                    engine: handle.clone(),
                    node,
                    mesh: mesh.as_ref().map(|m: &Mesh| m.stats.clone()),
                    access: admin_access.clone(),
                    policy: policy.clone(),
                    broker_thread: broker_thread.metrics(),
                };
                tokio::spawn(crate::admin::serve(
                    listener,
                    Arc::new(state),
                    stop_rx.clone(),
                ));
            }
            // The plain TCP listener is bound last: its accepting connections means every other
            // listener is up too (readiness).
            let mut order = config.listeners();
            order.reverse();
            for (name, l) in order {
                if !l.enabled {
                    continue;
                }
                let listener = listen::bind(l.bind, l.backlog)
                    .with_context(|| format!("listeners.{name}: cannot bind {}", l.bind))?;
                let local = listener.local_addr()?;
                let transport = match name {
                    "ws" | "wss" => Transport::WebSocket {
                        origins: listen::Origins::from_config(
                            l.allowed_origins.as_deref(),
                            // Anonymous access, or client certificates a browser sends
                            // whatever page asks.
                            anonymous
                                || l.client_ca
                                    .as_ref()
                                    .is_some_and(|p| !p.as_os_str().is_empty()),
                        ),
                        path: l.path.clone().unwrap_or_else(|| "/mqtt".to_owned()),
                        max_message_bytes: usize::try_from(if l.max_packet_size > 0 {
                            l.max_packet_size.min(config.limits.max_packet_size)
                        } else {
                            config.limits.max_packet_size
                        })
                        .unwrap_or(usize::MAX)
                        .saturating_add(1024),
                    },
                    _ => Transport::Tcp,
                };
                let tls = match name {
                    "tls" | "wss" => {
                        Some(crate::transport::tls::acceptor(l).with_context(|| {
                            format!("listeners.{name}: cannot load the TLS certificate or key")
                        })?)
                    }
                    _ => None,
                };
                let spec = ListenerSpec {
                    name,
                    transport,
                    tls,
                    max_packet_size: (l.max_packet_size > 0).then_some(l.max_packet_size),
                };
                let sem = Arc::new(Semaphore::new(l.max_connections));
                permits.push((sem.clone(), l.max_connections));
                info!(listener = name, addr = %local, "listening");
                addrs.push((name, local));
                tokio::spawn(listen::accept_loop(
                    listener,
                    spec,
                    handle.clone(),
                    sem,
                    stop_rx.clone(),
                ));
            }
            Ok::<_, anyhow::Error>(())
        }
        .await;
        if let Err(e) = bound {
            // Undo what started: the mesh, accept loops and the broker task.
            if let Some(m) = mesh {
                m.shutdown().await;
            }
            let _ = stop.send(true);
            let _ = handle.tx.send(ToEngine::Shutdown).await;
            let _ = done_rx.await;
            return Err(e);
        }
        if addrs.iter().all(|(n, _)| *n == "admin") {
            warn!("no MQTT listener is enabled");
        }
        if let (Some(p), Some(started)) = (&policy, started_with) {
            tokio::spawn(follow_policy(
                p.watch(),
                started,
                config.clone(),
                handle.tx.clone(),
                verify_limits.clone(),
            ));
        }
        Ok(Self {
            handle,
            addrs,
            stop,
            engine_done: done_rx,
            permits,
            mesh,
            config,
            custom_auth: has_custom_auth,
            verify_limits,
            policy,
            broker_thread,
        })
    }

    /// This node's peer id in the region mesh (cluster mode).
    pub fn peer_id(&self) -> Option<libp2p::PeerId> {
        self.mesh.as_ref().map(|m| m.peer_id)
    }

    /// The region mesh's listen addresses (cluster mode), with the ports the OS chose.
    pub fn p2p_addrs(&self) -> Vec<libp2p::Multiaddr> {
        self.mesh
            .as_ref()
            .map_or_else(Vec::new, |m| m.listen_addrs.clone())
    }

    /// The bound address of a listener: "tcp", "ws", "tls", "wss" or "admin".
    pub fn local_addr(&self, name: &str) -> Option<SocketAddr> {
        self.addrs.iter().find(|(n, _)| *n == name).map(|(_, a)| *a)
    }

    /// A handle to the broker task (stats, clients, publish, in-process clients).
    pub fn handle(&self) -> &EngineHandle {
        &self.handle
    }

    /// An in-process MQTT client: a virtual connection on the broker, no socket.
    pub fn client(&self) -> crate::client::ClientBuilder {
        crate::client::ClientBuilder::new(self.handle.clone())
    }

    /// Graceful stop: no new connections, MQTT 5.0 clients get DISCONNECT 0x8B, storage is
    /// flushed, writers get a moment to deliver what is queued.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        // Peers see the links go down at once rather than at their ping timeout.
        if let Some(m) = self.mesh.take() {
            m.shutdown().await;
        }
        if self.handle.tx.send(ToEngine::Shutdown).await.is_err() {
            bail!("the broker task had already stopped");
        }
        let result = self
            .engine_done
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the broker task panicked")));
        // Let writer tasks finish their last bytes (the DISCONNECTs), within a bound.
        let _ = tokio::time::timeout(Duration::from_secs(3), async {
            for (sem, n) in &self.permits {
                let _ = sem
                    .acquire_many(u32::try_from(*n).unwrap_or(u32::MAX))
                    .await;
            }
        })
        .await;
        // What the broker thread still runs (nothing, once the broker task and the mesh ended)
        // stops with it, and the store is closed when this returns.
        drop(self.broker_thread);
        result
    }

    /// Read the password file and the ACL rules again, from `[auth]` and `[acl]` of `config`,
    /// and make the broker use them: the daemon's answer to SIGHUP. Connected clients and their
    /// subscriptions stay; every later decision follows the new rules. Nothing else of
    /// `config` is applied: the answer says whether anything else differs from the
    /// configuration the server started with (that takes a restart). On an error (a password
    /// file that cannot be read, say) the old rules stay. Refused for a server started with
    /// the application's own hooks ([`BrokerBuilder::auth`]).
    pub async fn reload_auth(&self, config: &DaemonConfig) -> anyhow::Result<AuthReload> {
        anyhow::ensure!(
            !self.custom_auth,
            "this broker uses the application's own authentication hooks"
        );
        anyhow::ensure!(
            self.policy.is_none(),
            "users and access rules come from the policy document (policy.source = \
             \"document\"): edit them with `meridian ctl user|acl`, on any node"
        );
        let reloaded = DaemonConfig {
            auth: config.auth.clone(),
            acl: config.acl.clone(),
            ..self.config.clone()
        };
        let setup = auth::AuthSetup::from_config(&reloaded)?;
        let summary = setup.summary();
        set_hooks(&self.handle.tx, setup, &self.verify_limits, true).await?;
        Ok(AuthReload {
            summary,
            other_changes: reloaded != *config,
        })
    }

    /// Wait until the broker task stops by itself (a storage failure).
    pub async fn stopped(&mut self) -> anyhow::Result<()> {
        (&mut self.engine_done)
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the broker task panicked")))
    }
}

/// What [`Server::reload_auth`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthReload {
    pub summary: auth::AuthSummary,
    /// The configuration differs in more than `[auth]` and `[acl]`: those changes wait for a
    /// restart.
    pub other_changes: bool,
}

/// Capacity of the broker task's broadcast channel to the mesh (a full one sends the
/// broadcast over the link sessions instead).
const MESH_QUEUE: usize = 1024;

/// What cluster mode needs before the broker starts: the secrets, and the channel by which
/// the broker task orders the mesh task about.
struct MeshStart {
    key: libp2p::pnet::PreSharedKey,
    identity: libp2p::identity::Keypair,
    node: NodeId,
    /// The broker task's end.
    commands: mpsc::Sender<MeshCmd>,
    /// The mesh task's end.
    orders: mpsc::Receiver<MeshCmd>,
    stats: Arc<MeshStats>,
}

/// Make the broker task use the hooks of `setup`; returns once it does.
async fn set_hooks(
    tx: &mpsc::Sender<ToEngine>,
    setup: auth::AuthSetup,
    limits: &auth::VerifyLimits,
    new_users: bool,
) -> anyhow::Result<()> {
    let (authenticator, authorizer) = setup.build_for(tx.clone(), limits, new_users);
    let (reply, applied) = oneshot::channel();
    let hooks = crate::mailbox::Hooks {
        authenticator,
        authorizer,
    };
    let gone = || anyhow::anyhow!("the broker task has stopped");
    tx.send(ToEngine::Policy(PolicyChange::Hooks { hooks, reply }))
        .await
        .map_err(|_| gone())?;
    applied.await.map_err(|_| gone())
}

/// Follow the policy document: each change of its users or access rules replaces the
/// broker's hooks, so the next login and the next operation follow it (connected clients
/// stay connected), and each change of its residency rules is put in force at once. Ends
/// with the policy task or the broker task.
async fn follow_policy(
    mut rx: watch::Receiver<Snapshot>,
    started: Arc<Policy>,
    config: DaemonConfig,
    tx: mpsc::Sender<ToEngine>,
    limits: auth::VerifyLimits,
) {
    let auth_part = |p: &Policy| (p.users.clone(), p.acl_default, p.acl.clone());
    // What the broker started with; a change made since is applied at once.
    let mut applied = auth_part(&started);
    let residency_part = |p: &Policy| (p.residency.clone(), p.node_regions());
    let mut residency = residency_part(&started);
    loop {
        let policy = rx.borrow_and_update().policy.clone();
        let now = residency_part(&policy);
        if now != residency {
            residency = now;
            let (reply, applied) = oneshot::channel();
            let set = ToEngine::Policy(PolicyChange::Residency {
                rules: policy.residency(),
                node_regions: residency.1.clone(),
                reply,
            });
            if tx.send(set).await.is_err() || applied.await.is_err() {
                return;
            }
            info!(
                rules = residency.0.len(),
                "policy changed: residency rules applied"
            );
        }
        let now = auth_part(&policy);
        if now != applied {
            // A login being checked against users that did not change stays valid.
            let new_users = now.0 != applied.0;
            applied = now;
            if !apply_auth(&config, &policy, &tx, &limits, new_users).await {
                return;
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Make the broker use the users and rules of `policy`. False once the broker task is gone.
async fn apply_auth(
    config: &DaemonConfig,
    policy: &Policy,
    tx: &mpsc::Sender<ToEngine>,
    limits: &auth::VerifyLimits,
    new_users: bool,
) -> bool {
    match auth::AuthSetup::from_policy(config, policy, false) {
        Ok(setup) => {
            let summary = setup.summary();
            if set_hooks(tx, setup, limits, new_users).await.is_err() {
                return false;
            }
            info!(
                users = summary.users,
                anonymous = summary.anonymous,
                acl_rules = summary.acl_rules,
                "policy changed: users and access rules applied"
            );
        }
        Err(e) => warn!(
            error = format!("{e:#}"),
            "policy changed but cannot be applied: the previous users and rules stay"
        ),
    }
    true
}

/// What the policy task of a daemon with `config` needs; `peer_id` in cluster mode. The files
/// are read only when there is no saved document yet (they seed it).
fn policy_settings(
    config: &DaemonConfig,
    peer_id: Option<String>,
) -> anyhow::Result<PolicySettings> {
    let data_dir = config.storage.data_dir.clone();
    let files = SeedFiles {
        password_file: config.auth.password_file.clone().into(),
        acl: config.acl.clone(),
        admin_token_file: config.admin.token_file.clone(),
        edge_token_file: config.cluster.edge.token_file.clone(),
    };
    let seed = Seed::read(&data_dir, &files)?;
    Ok(PolicySettings {
        data_dir,
        node: config.node.name.clone(),
        region: if config.cluster.enabled {
            config.cluster.region.clone()
        } else {
            String::new()
        },
        peer_id,
        max_document_bytes: config.policy.max_document_bytes,
        history_retention_ms: config
            .policy
            .history_retention_days
            .saturating_mul(86_400_000),
        compact_after_changes: config.policy.compact_after_changes,
        compact_interval_ms: config.policy.compact_interval_ms,
        node_expiry_ms: config.cluster.peer_expiry_ms,
        seed,
    })
}

/// The core's cluster configuration from `[cluster]` (the incarnation is set at start).
fn core_cluster_config(c: &crate::config::ClusterSection, node: NodeId) -> ClusterConfig {
    let mut config = ClusterConfig::new(node, 0, c.region.clone());
    config.route_batch_ms = c.route_batch_ms;
    config.digest_interval_ms = c.digest_interval_ms;
    config.tombstone_budget = c.tombstone_budget;
    config.subscribe_fence = c.subscribe_fence;
    config.subscribe_fence_max_ms = c.subscribe_fence_max_ms;
    config.retained_tombstones_max = c.retained_tombstones_max;
    config.outbox = OutboxLimits {
        window: c.outbox_window,
        max_messages: c.outbox_max_messages,
        max_bytes: c.outbox_max_bytes,
    };
    config.outbox_stall_ms = c.outbox_stall_ms;
    config.peer_expiry_ms = c.peer_expiry_ms;
    config.leaf_expiry_ms = c.edge.leaf_expiry_ms;
    config.leaf_max_filters = c.edge.max_filters;
    config.max_nodes = c.max_nodes;
    // What this node wants stays within what it takes from a peer, which is what its peers,
    // configured alike, take from it.
    config.max_route_filters = c.peer_max_filters;
    config.max_clock_drift_ms = c.max_clock_drift_ms;
    config.peer_limits = PeerLimits {
        max_filters: c.peer_max_filters,
        max_pending_delta_bytes: c.peer_max_pending_delta_bytes,
        max_snapshot_bytes: c.peer_max_snapshot_bytes,
        max_retained_messages: c.peer_max_retained_messages,
        max_retained_bytes: c.peer_max_retained_bytes,
        max_claims: c.peer_max_claims,
        max_transfer_bytes: c.peer_max_transfer_bytes,
    };
    config.session_transfer_wait_ms = c.session_transfer_wait_ms;
    config.home_regions = c
        .home
        .iter()
        .map(|h| HomeRegion {
            client_ids: h.client_ids.clone(),
            region: h.region.clone(),
        })
        .collect();
    config.home_wait_ms = c.home_wait_ms;
    config
}

/// 64 bits that differ between starts: OS-seeded hasher keys mixed with the time and pid.
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cluster_section_is_the_cores_default() {
        let config = crate::DaemonConfig::parse(crate::DEFAULT_CONFIG, "default").unwrap();
        let node = NodeId::new("n").unwrap();
        let from_file = core_cluster_config(&config.cluster, node.clone());
        assert_eq!(from_file, ClusterConfig::new(node, 0, "local"));
    }
}
