//! Starting a whole broker, in named steps: the cluster's secrets, the policy document, who
//! gets in, the broker task (its state restored), then the mesh and the listeners, the plain
//! MQTT one last. Once the broker task runs, what started is held in a [`Starting`], which
//! stops it all if a later step fails.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use meridian_core::Broker;
use meridian_core::broker::ClusterConfig;
use meridian_core::residency::Residency;
use meridian_core::routes::NodeId;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tracing::{info, warn};

use super::follow::Follower;
use super::settings::{core_cluster_config, fresh_seed, policy_settings};
use super::{AuthDecisions, AuthFactory, Server};
use crate::admin::{AdminAccess, AdminState, NodeInfo};
use crate::auth::{AuthSetup, VerifyLimits};
use crate::broker_thread::BrokerThread;
use crate::clock::Clock;
use crate::config::{DaemonConfig, ListenerConfig, ListenerKind, PolicySource};
use crate::engine::{Engine, WriteLimits};
use crate::mailbox::{
    DaemonCounters, ENGINE_QUEUE, EngineHandle, MemberGate, MeshCmd, PolicyInForce, ReloadStatus,
    ToEngine,
};
use crate::mesh::{self, Mesh, MeshSettings, MeshStats};
use crate::policy::PolicyHandle;
use crate::policy::document::TokenKind;
use crate::policy::tokens::{TokenSet, Tokens};
use crate::storage::Store;
use crate::transport::listen::{self, ListenerSpec, Transport};
use crate::transport::tcp::{self, Poller};

/// Capacity of the broker task's broadcast channel to the mesh (a full one sends the
/// broadcast over the link sessions instead).
const MESH_QUEUE: usize = 1024;

/// Start everything `config` asks for; see the module's documentation for the steps.
pub(super) async fn start(
    config: DaemonConfig,
    custom_auth: Option<AuthFactory>,
) -> anyhow::Result<Server> {
    let has_custom_auth = custom_auth.is_some();
    // Before any file is opened: every connection is one.
    let open_files = crate::open_files::raise();
    let counters = Arc::new(DaemonCounters::default());
    let verify_limits = VerifyLimits::new(counters.clone());
    // Cluster mode: the secrets first, so that a missing key stops the start early.
    let secrets = ClusterSecrets::load(&config)?;
    let node_id = secrets.as_ref().map(|s| s.node.to_string());
    let policy = start_policy(&config, custom_auth.is_some(), node_id.clone(), &counters).await?;
    let hooks = Hooks::choose(&config, custom_auth, policy.as_ref(), node_id.as_deref())?;
    let tokens = TokenSources(policy.clone());
    let admin_access = AdminAccess::new(
        &config.admin,
        tokens.get(
            TokenKind::Admin,
            &config.admin.token_file,
            "admin.token_file",
            crate::policy::ADMIN_FILE_TOKEN,
        )?,
    )?;
    // Whether clients get in without logging in, for the WebSocket listeners' origin
    // policy. The application's own hooks are taken to decide who gets in.
    let anonymous = hooks.anonymous();
    let cluster = secrets.as_ref().map(|s| {
        let mut cluster = core_cluster_config(&config.cluster, s.node.clone());
        cluster.certificate = s.certificate.clone();
        // Where the operator certifies (keys, and this node's own certificate), only certified
        // peers are members, unless the configuration turns it off while nodes are certified.
        cluster.members_certified = config.cluster.members_certified
            && s.certificate.is_some()
            && !config.policy.operator_keys.is_empty();
        // Then the mesh's policy streams wait for the broker's word on each peer.
        let members = cluster.members_certified.then(MemberGate::default);
        ClusterStart {
            config: cluster,
            commands: s.commands.clone(),
            members,
        }
    });
    let members = cluster.as_ref().and_then(|c| c.members.clone());
    // In force before anything is restored or advertised.
    let started_with = policy.as_ref().map(PolicyHandle::current);
    let residency = started_with
        .as_ref()
        .map(|p| (p.residency(), p.node_regions()));
    let mut starting = start_broker(
        &config,
        hooks,
        cluster,
        residency,
        counters,
        verify_limits.clone(),
        open_files,
    )
    .await?;
    let in_force = Arc::new(PolicyInForce::default());
    let reloads = Arc::new(Mutex::new(ReloadStatus::default()));
    // Listeners, only now that the state is restored.
    let bound = async {
        if let Some(secrets) = secrets {
            starting
                .start_mesh(&config, secrets, policy.clone(), members)
                .await?;
        }
        starting
            .serve_edge(&config, &tokens, node_id.clone().unwrap_or_default())
            .await?;
        starting
            .serve_admin(
                &config,
                admin_access,
                policy.clone(),
                in_force.clone(),
                reloads.clone(),
            )
            .await?;
        // Bound last: its accepting connections means every other listener is up too
        // (readiness).
        starting.serve_mqtt(&config, anonymous)
    }
    .await;
    if let Err(e) = bound {
        starting.undo().await;
        return Err(e);
    }
    if !starting.addrs.iter().any(|(kind, _)| kind.mqtt()) {
        warn!("no MQTT listener is enabled");
    }
    if let (Some(p), Some(started)) = (&policy, started_with) {
        let follower = Follower {
            config: config.clone(),
            tx: starting.handle.tx.clone(),
            limits: verify_limits.clone(),
            in_force,
            node: node_id.clone(),
        };
        tokio::spawn(follower.run(p.watch(), started));
    }
    Ok(starting.into_server(config, has_custom_auth, verify_limits, policy, reloads))
}

/// Files the node needs besides its clients' connections: its own
/// ([`crate::open_files::OWN_FILES`]), and in cluster mode its mesh connections and edge links.
fn reserved_files(config: &DaemonConfig) -> u64 {
    let cluster = &config.cluster;
    let mut reserved = crate::open_files::OWN_FILES;
    if cluster.enabled {
        reserved += cluster.max_peer_connections as u64;
        if cluster.edge.listen_addr().is_some() {
            reserved += cluster.edge.max_links as u64;
        }
    }
    reserved
}

/// `cluster.certificate`: the operator's certificate of this node's region, checked against
/// the operator keys here too, so that a wrong one (another node's, another region's, another
/// key's) stops the start rather than leave the node without a region everywhere. Without
/// one while there are operator keys, the start goes on and says what that means.
fn load_certificate(config: &DaemonConfig, node: &NodeId) -> anyhow::Result<Option<bytes::Bytes>> {
    let path = &config.cluster.certificate;
    let keys = crate::policy::operator::OperatorKeys::parse(&config.policy.operator_keys)?;
    if path.as_os_str().is_empty() {
        if !keys.is_empty() {
            warn!(
                "no cluster.certificate: with operator keys, peers take no region from this \
                 node (no residency rule lets a restricted message go to it), and peers that \
                 have theirs take it for no member (cluster.members_certified); \
                 `meridian certify` makes one"
            );
        }
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let certificate = hex::decode(text.trim()).ok().with_context(|| {
        format!(
            "{}: not a certificate (hex; `meridian certify` prints one)",
            path.display()
        )
    })?;
    let region = &config.cluster.region;
    if !keys.is_empty() && !keys.verify_region(node.as_str(), region, &certificate) {
        anyhow::bail!(
            "{}: not an operator's certificate of this node ({node}) in region {region:?}",
            path.display()
        );
    }
    Ok(Some(bytes::Bytes::from(certificate)))
}

/// What cluster mode needs before the broker starts: the secrets, and the channel by which
/// the broker task orders the mesh task about.
struct ClusterSecrets {
    key: libp2p::pnet::PreSharedKey,
    identity: libp2p::identity::Keypair,
    node: NodeId,
    /// The operator's certificate of this node's region (`cluster.certificate`).
    certificate: Option<bytes::Bytes>,
    /// The broker task's end.
    commands: mpsc::Sender<MeshCmd>,
    /// The mesh task's end.
    orders: mpsc::Receiver<MeshCmd>,
}

impl ClusterSecrets {
    /// The cluster key and this node's identity (created on the first start), in cluster
    /// mode.
    fn load(config: &DaemonConfig) -> anyhow::Result<Option<Self>> {
        let cluster = &config.cluster;
        if !cluster.enabled {
            return Ok(None);
        }
        let key = mesh::keys::load_cluster_key(&cluster.key_file).context("cluster.key_file")?;
        let identity = mesh::keys::load_or_create_identity(&config.storage.data_dir)?;
        let node = NodeId::new(&identity.public().to_peer_id().to_string())
            .context("peer id as node id")?;
        let certificate = load_certificate(config, &node).context("cluster.certificate")?;
        let (commands, orders) = mpsc::channel::<MeshCmd>(MESH_QUEUE);
        Ok(Some(Self {
            key,
            identity,
            node,
            certificate,
            commands,
            orders,
        }))
    }
}

/// The policy document, unless the application decides who gets in or the files do
/// (`policy.source = "files"`).
async fn start_policy(
    config: &DaemonConfig,
    custom_auth: bool,
    peer_id: Option<String>,
    counters: &Arc<DaemonCounters>,
) -> anyhow::Result<Option<PolicyHandle>> {
    if custom_auth || config.policy.source != PolicySource::Document {
        return Ok(None);
    }
    let handle = PolicyHandle::start(policy_settings(config, peer_id, counters.clone())?).await?;
    let current = handle.current();
    info!(
        users = current.users.len(),
        acl_rules = current.acl.len(),
        admin_tokens = current.admin_tokens.len(),
        "users, access rules and tokens from the policy document"
    );
    Ok(Some(handle))
}

/// Who decides who gets in and what they may do.
enum Hooks {
    /// The configuration: its password file and `[acl]`, or the policy document.
    Configured(AuthSetup),
    /// The application's own hooks ([`super::BrokerBuilder::auth`]).
    Application(AuthFactory),
}

impl Hooks {
    fn choose(
        config: &DaemonConfig,
        custom_auth: Option<AuthFactory>,
        policy: Option<&PolicyHandle>,
        node: Option<&str>,
    ) -> anyhow::Result<Self> {
        Ok(match (custom_auth, policy) {
            (Some(factory), _) => Self::Application(factory),
            (None, Some(p)) => {
                Self::Configured(AuthSetup::from_policy(config, &p.current(), true, node)?)
            }
            (None, None) => Self::Configured(AuthSetup::from_config(config)?),
        })
    }

    /// Clients get in without logging in (the application's own hooks are taken to decide).
    fn anonymous(&self) -> bool {
        match self {
            Self::Configured(setup) => setup.anonymous(),
            Self::Application(_) => false,
        }
    }

    /// The broker's authenticator and authorizer; decisions come back on `engine`.
    fn build(
        self,
        engine: mpsc::Sender<ToEngine>,
        limits: &VerifyLimits,
    ) -> (
        crate::mailbox::SendAuthenticator,
        crate::mailbox::SendAuthorizer,
    ) {
        match self {
            Self::Configured(setup) => setup.build(engine, limits),
            Self::Application(factory) => factory(AuthDecisions { tx: engine }),
        }
    }
}

/// Where a listener's tokens come from: the policy document's, or (`policy.source =
/// "files"`) a token file's.
struct TokenSources(Option<PolicyHandle>);

impl TokenSources {
    fn get(
        &self,
        kind: TokenKind,
        file: &std::path::Path,
        key: &str,
        name: &str,
    ) -> anyhow::Result<Tokens> {
        Ok(match &self.0 {
            Some(p) => Tokens::Policy(p.watch(), kind),
            None => Tokens::Fixed(Arc::new(TokenSet::from_file(file, key, name)?)),
        })
    }
}

/// Open the store, build the broker with every stored record restored, and run it on the
/// broker thread. Opening and restoring may take a while: that runs on the blocking pool.
/// What the broker task needs in cluster mode.
struct ClusterStart {
    config: ClusterConfig,
    /// Orders to the mesh.
    commands: mpsc::Sender<MeshCmd>,
    /// Where members must be certified: the broker's word on each peer, for the mesh.
    members: Option<MemberGate>,
}

async fn start_broker(
    config: &DaemonConfig,
    hooks: Hooks,
    cluster: Option<ClusterStart>,
    residency: Option<(Residency, BTreeMap<NodeId, String>)>,
    counters: Arc<DaemonCounters>,
    verify_limits: VerifyLimits,
    open_files: crate::open_files::Limit,
) -> anyhow::Result<Starting> {
    let (tx, rx) = mpsc::channel(ENGINE_QUEUE);
    let handle = EngineHandle {
        tx,
        counters: counters.clone(),
    };
    let mut core_config = config.core_config();
    // A fresh seed per start: assigned client ids must not repeat those of sessions that
    // survived a restart.
    core_config.seed = fresh_seed();
    let storage = config.storage.clone();
    let write_limits = WriteLimits::from_config(&config.limits);
    let engine_tx = handle.tx.clone();
    let (poll, tcp) = tcp::new().context("cannot create an epoll set")?;
    let broker_thread = BrokerThread::start()?;
    let poller = {
        // Watched by the broker thread's runtime, which runs the broker task.
        let _on_it = broker_thread.handle().enter();
        Poller::new(poll).context("cannot watch the epoll set")?
    };
    let engine = tokio::task::spawn_blocking(move || {
        let mut store = Store::open(
            &storage.data_dir,
            storage.sync,
            Duration::from_millis(storage.sync_interval_ms),
            storage.cache_bytes,
            storage.journal_max_bytes,
        )?;
        let (authn, authz) = hooks.build(engine_tx, &verify_limits);
        let now = Clock::default().now();
        let mut broker = Broker::with_auth(core_config, now, authn, authz);
        let (mut mesh_tx, mut members) = (None, None);
        if let Some(ClusterStart {
            config: mut cluster,
            commands,
            members: gate,
        }) = cluster
        {
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
            (mesh_tx, members) = (Some(commands), gate);
        }
        let mut engine = Engine::new(broker, store, write_limits, counters, tcp)?
            .with_commit_window(Duration::from_millis(storage.commit_window_ms));
        if let Some(tx) = mesh_tx {
            engine = engine.with_mesh(tx);
        }
        if let Some(members) = members {
            engine = engine.with_members(members);
        }
        Ok::<_, anyhow::Error>(engine)
    })
    .await
    .context("broker start-up panicked")??;
    let (done_tx, engine_done) = oneshot::channel();
    broker_thread.handle().spawn(async move {
        let r = engine.run(rx, poller).await;
        if let Err(e) = &r {
            crate::engine::log::storage_failure(e);
        }
        let _ = done_tx.send(r.map_err(anyhow::Error::from));
    });
    let (stop, _) = watch::channel(false);
    Ok(Starting {
        handle,
        stop,
        engine_done,
        addrs: Vec::new(),
        permits: Vec::new(),
        open_files,
        mesh: None,
        broker_thread,
    })
}

/// A start that got as far as the broker task: what runs, and what stops it.
struct Starting {
    handle: EngineHandle,
    /// Turned true, it stops every accept loop.
    stop: watch::Sender<bool>,
    engine_done: oneshot::Receiver<anyhow::Result<()>>,
    addrs: Vec<(ListenerKind, SocketAddr)>,
    /// Each MQTT listener's connection permits, and how many.
    permits: Vec<(Arc<Semaphore>, usize)>,
    /// The open-file limit, raised at start.
    open_files: crate::open_files::Limit,
    mesh: Option<Mesh>,
    broker_thread: BrokerThread,
}

impl Starting {
    /// The region mesh, on the broker thread: the swarm's connections and the link sessions
    /// are spawned from it, beside the broker task.
    async fn start_mesh(
        &mut self,
        config: &DaemonConfig,
        secrets: ClusterSecrets,
        policy: Option<PolicyHandle>,
        members: Option<MemberGate>,
    ) -> anyhow::Result<()> {
        let cluster = &config.cluster;
        let settings = MeshSettings {
            listen: cluster.listen.iter().map(|a| a.0.clone()).collect(),
            bootstrap: cluster.peers.iter().map(|a| a.0.clone()).collect(),
            cluster_key: secrets.key,
            allow: cluster.allow_peers.iter().map(|p| p.0).collect(),
            ping_interval: Duration::from_millis(cluster.ping_interval_ms),
            redial_min: Duration::from_millis(250),
            redial_max: Duration::from_secs(10),
            discover: cluster.discover,
            advertise: cluster.advertise.iter().map(|a| a.0.clone()).collect(),
            announce_every: Duration::from_millis(cluster.announce_interval_ms),
            link_limits: cluster.link_limits(),
            max_connections: cluster.max_peer_connections,
            max_connections_per_address: cluster.max_peer_connections_per_address,
            policy,
            members,
        };
        let engine_tx = self.handle.tx.clone();
        let region = cluster.region.clone();
        let (identity, orders) = (secrets.identity, secrets.orders);
        let stats = Arc::new(MeshStats::default());
        let started = self.broker_thread.handle().spawn(async move {
            mesh::start(settings, identity, engine_tx, orders, stats, &region).await
        });
        self.mesh = Some(started.await.context("the mesh's start panicked")??);
        Ok(())
    }

    /// The edge-link listener, where leaves link (cluster mode with `cluster.edge.listen`).
    async fn serve_edge(
        &mut self,
        config: &DaemonConfig,
        tokens: &TokenSources,
        node: String,
    ) -> anyhow::Result<()> {
        let cluster = &config.cluster;
        let Some(addr) = cluster.edge.listen_addr().filter(|_| cluster.enabled) else {
            return Ok(());
        };
        let edge = &cluster.edge;
        let tokens = tokens.get(
            TokenKind::Edge,
            &edge.token_file,
            "cluster.edge.token_file",
            crate::policy::EDGE_FILE_TOKEN,
        )?;
        let operator = crate::policy::operator::OperatorKeys::parse(&config.policy.operator_keys)?;
        if !operator.is_empty() {
            info!(
                "edge links: with operator keys, an edge object links with a leaf credential \
                 (meridian certify-leaf); edge-link tokens link nothing"
            );
        } else if tokens.is_empty() {
            warn!(
                "edge links: no edge-link token, no edge object can link until one is added \
                 (meridian ctl token add edge NAME)"
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
        self.addrs.push((ListenerKind::Edge, local));
        let settings = crate::edge::EdgeSettings {
            node,
            tokens,
            operator,
            tls,
            max_links: edge.max_links,
            max_leaves_per_token: edge.max_leaves_per_token,
            leaf_expiry: Duration::from_millis(edge.leaf_expiry_ms),
            limits: cluster.link_limits(),
        };
        tokio::spawn(crate::edge::serve(
            listener,
            settings,
            self.handle.tx.clone(),
            self.handle.counters.clone(),
            self.stop.subscribe(),
        ));
        Ok(())
    }

    /// Admin HTTP (`[admin]`).
    async fn serve_admin(
        &mut self,
        config: &DaemonConfig,
        access: AdminAccess,
        policy: Option<PolicyHandle>,
        in_force: Arc<PolicyInForce>,
        reloads: Arc<Mutex<ReloadStatus>>,
    ) -> anyhow::Result<()> {
        if !config.admin.enabled {
            return Ok(());
        }
        let listener = TcpListener::bind(config.admin.bind)
            .await
            .with_context(|| format!("admin: cannot bind {}", config.admin.bind))?;
        let local = listener.local_addr()?;
        info!(addr = %local, https = config.admin.tls(), "admin HTTP listening");
        self.addrs.push((ListenerKind::Admin, local));
        let mesh = self.mesh.as_ref();
        let node = NodeInfo {
            name: config.node.name.clone(),
            region: config
                .cluster
                .enabled
                .then(|| config.cluster.region.clone()),
            peer_id: mesh.map(|m| m.peer_id.to_string()),
            p2p_addrs: mesh.map_or_else(Vec::new, |m| {
                m.listen_addrs.iter().map(ToString::to_string).collect()
            }),
            started: std::time::Instant::now(),
        };
        let in_force = policy.is_some().then_some(in_force);
        let state = AdminState {
            engine: self.handle.clone(),
            node,
            mesh: mesh.map(|m| m.stats.clone()),
            access,
            policy,
            in_force,
            reloads,
            broker_thread: self.broker_thread.metrics(),
            operator_keys: crate::policy::operator::OperatorKeys::parse(
                &config.policy.operator_keys,
            )?,
            history: Arc::default(),
        };
        tokio::spawn(crate::admin::history::sample(
            self.handle.clone(),
            state.history.clone(),
            self.stop.subscribe(),
        ));
        let tls = if config.admin.tls() {
            Some(
                crate::transport::tls::server_acceptor(&config.admin.cert, &config.admin.key)
                    .context("admin.cert / admin.key")?,
            )
        } else {
            None
        };
        tokio::spawn(crate::admin::serve(
            listener,
            Arc::new(state),
            tls,
            self.stop.subscribe(),
        ));
        Ok(())
    }

    /// The MQTT listeners, the plain TCP one last.
    fn serve_mqtt(&mut self, config: &DaemonConfig, anonymous: bool) -> anyhow::Result<()> {
        let mut order = config.listeners();
        order.reverse();
        let enabled: Vec<_> = order.into_iter().filter(|(_, l)| l.enabled).collect();
        // Within the open-file limit, after the node's own files.
        let limit = self.open_files;
        let available = crate::open_files::for_connections(limit.soft, reserved_files(config));
        let configured: Vec<(String, usize)> = enabled
            .iter()
            .map(|(kind, l)| {
                (
                    format!("listeners.{kind}.max_connections"),
                    l.max_connections,
                )
            })
            .collect();
        let (maxes, clamped) = crate::open_files::fit(available, &configured);
        for (key, configured, now) in clamped {
            warn!(
                "{key} = {configured} does not fit the open-file limit: {now} taken \
                 (the listeners share {available} connections)"
            );
        }
        info!(
            open_files = limit.soft,
            raised_from = limit.before,
            connections = available,
            "open-file limit: {} files, {available} of them for client connections after the \
             node's own",
            limit.soft
        );
        for ((kind, l), max) in enabled.into_iter().zip(maxes) {
            self.serve_mqtt_listener(config, kind, l, max, anonymous)?;
        }
        Ok(())
    }

    fn serve_mqtt_listener(
        &mut self,
        config: &DaemonConfig,
        kind: ListenerKind,
        l: &ListenerConfig,
        max_connections: usize,
        anonymous: bool,
    ) -> anyhow::Result<()> {
        let listener = listen::bind(l.bind, l.backlog)
            .with_context(|| format!("listeners.{kind}: cannot bind {}", l.bind))?;
        let local = listener.local_addr()?;
        let transport = if kind.websocket() {
            let max_packet_size = if l.max_packet_size > 0 {
                l.max_packet_size.min(config.limits.max_packet_size)
            } else {
                config.limits.max_packet_size
            };
            Transport::WebSocket {
                origins: listen::Origins::from_config(
                    l.allowed_origins.as_deref(),
                    // Anonymous access, or client certificates a browser sends whatever page
                    // asks.
                    anonymous
                        || l.client_ca
                            .as_ref()
                            .is_some_and(|p| !p.as_os_str().is_empty()),
                ),
                path: l.path.clone().unwrap_or_else(|| "/mqtt".to_owned()),
                max_message_bytes: usize::try_from(max_packet_size)
                    .unwrap_or(usize::MAX)
                    .saturating_add(1024),
            }
        } else {
            Transport::Tcp
        };
        let tls = if kind.tls() {
            Some(crate::transport::tls::acceptor(l).with_context(|| {
                format!("listeners.{kind}: cannot load the TLS certificate or key")
            })?)
        } else {
            None
        };
        let spec = ListenerSpec {
            kind,
            transport,
            tls,
            max_packet_size: (l.max_packet_size > 0).then_some(l.max_packet_size),
        };
        let permits = Arc::new(Semaphore::new(max_connections));
        self.permits.push((permits.clone(), max_connections));
        info!(listener = kind.name(), addr = %local, max_connections, "listening");
        self.addrs.push((kind, local));
        tokio::spawn(listen::accept_loop(
            listener,
            spec,
            self.handle.clone(),
            permits,
            self.stop.subscribe(),
        ));
        Ok(())
    }

    /// Stop what started: the mesh, the accept loops and the broker task.
    async fn undo(self) {
        if let Some(m) = self.mesh {
            m.shutdown().await;
        }
        let _ = self.stop.send(true);
        let _ = self.handle.tx.send(ToEngine::Shutdown).await;
        let _ = self.engine_done.await;
    }

    fn into_server(
        self,
        config: DaemonConfig,
        custom_auth: bool,
        verify_limits: VerifyLimits,
        policy: Option<PolicyHandle>,
        reloads: Arc<Mutex<ReloadStatus>>,
    ) -> Server {
        Server {
            handle: self.handle,
            addrs: self.addrs,
            stop: self.stop,
            engine_done: self.engine_done,
            permits: self.permits,
            mesh: self.mesh,
            config,
            custom_auth,
            verify_limits,
            policy,
            reloads,
            broker_thread: self.broker_thread,
        }
    }
}
