//! The region mesh: the daemon as a node of a multi-region deployment, over libp2p.
//!
//! Transport: TCP, Noise, then the proof of the deployment's cluster key ([`member`]: a node
//! without the key cannot complete the handshake), Yamux. On top:
//! - **gossipsub** carries what the core broadcasts (route deltas in batches, route digests);
//! - one long-lived **stream per peer pair** ([`session`]) carries what the core addresses to
//!   one peer: forwarded messages and their acks, route acks, digests, snapshot chunks. The node
//!   with the smaller peer id opens it, so a pair has one session however many connections;
//! - **identify** and **ping** (the RTT per peer is in the metrics);
//! - an optional **allowlist** of peer ids on top of the key;
//! - **discovery** ([`discovery`], on by default): nodes announce their addresses and their
//!   peers' on a gossip topic, so a node that lists one peer meets the others.
//!
//! Bootstrap peers are dialled until they answer, with exponential backoff, and re-dialled
//! when their connection drops. The node's id in the deployment is its peer id.

mod conn_limits;
pub mod discovery;
pub mod keys;
pub mod member;
pub mod policy_sync;
pub mod session;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use futures_util::StreamExt;
use libp2p::core::transport::Transport as _;
use libp2p::core::upgrade::Version;
use libp2p::identity::Keypair;
use libp2p::multiaddr::Protocol;
use libp2p::pnet::PreSharedKey;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{ConnectionId, DialError, ListenError, NetworkBehaviour, SwarmEvent};
use libp2p::{
    Multiaddr, PeerId, StreamProtocol, Swarm, allow_block_list, connection_limits, gossipsub,
    identify, noise, ping, tcp, yamux,
};
use meridian_core::link::{self, DEFAULT_MAX_FRAME_LEN};
use meridian_core::routes::NodeId;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::mailbox::{LinkEvent, MeshCmd, ToEngine};

/// The stream protocol of link sessions.
pub const LINK_PROTOCOL: StreamProtocol = StreamProtocol::new("/meridian/link/1");
/// The gossipsub topic of broadcast link frames.
pub const GOSSIP_TOPIC: &str = "meridian/link/1";
/// How long opening a link session may take before it is tried again.
const OPEN_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest frame sent by gossip; larger broadcasts go over the link sessions.
pub const GOSSIP_MAX_FRAME: usize = 1024 * 1024;

/// What the mesh needs to start.
#[derive(Debug, Clone)]
pub struct MeshSettings {
    pub listen: Vec<Multiaddr>,
    pub bootstrap: Vec<Multiaddr>,
    pub cluster_key: PreSharedKey,
    /// Peer ids let in besides holding the key; empty = every holder of the key.
    pub allow: Vec<PeerId>,
    pub ping_interval: Duration,
    /// First and largest pause between dials of a peer that does not answer.
    pub redial_min: Duration,
    pub redial_max: Duration,
    /// Meet the nodes the peers know of (the `discovery` module).
    pub discover: bool,
    /// The addresses announced to other nodes; empty = the listen addresses.
    pub advertise: Vec<Multiaddr>,
    /// How often this node announces itself and its peers.
    pub announce_every: Duration,
    /// The bounds of each link session's queue.
    pub link_limits: crate::mailbox::LinkLimits,
    /// p2p connections in at most (`cluster.max_peer_connections`).
    pub max_connections: usize,
    /// p2p connections in from one address at most
    /// (`cluster.max_peer_connections_per_address`).
    pub max_connections_per_address: usize,
    /// The policy document to keep in sync with every peer (`policy.source = "document"`),
    /// and the largest one accepted.
    pub policy: Option<crate::policy::PolicyHandle>,
    /// Where members must be certified, the peers the broker takes as members: only they
    /// get the policy document (`None`: every holder of the cluster key).
    pub members: Option<crate::mailbox::MemberGate>,
}

/// Counters and gauges of the mesh, read by the metrics page.
#[derive(Debug, Default)]
pub struct MeshStats {
    /// Last ping round trip per peer.
    pub rtt: Mutex<HashMap<String, Duration>>,
    /// Why each peer's connection last ended or failed (by peer id), for the status page.
    pub last_error: Mutex<HashMap<String, String>>,
    /// Incoming connections that failed the handshake (wrong or no cluster key, not libp2p).
    pub refused_handshake: AtomicU64,
    /// Connections refused because the peer id is not on the allowlist.
    pub refused_not_allowed: AtomicU64,
    /// Connections in refused past `cluster.max_peer_connections` or its per-address share.
    pub refused_limit: AtomicU64,
    /// Policy sync streams refused: the peer is no member (where members must be certified).
    pub policy_refused: AtomicU64,
    /// Dials of bootstrap or discovered peers that failed.
    pub dial_failures: AtomicU64,
    /// Peers known through discovery, with their addresses (`GET /api/discovery`, and their
    /// count in the metrics).
    pub discovered: Mutex<Vec<discovery::KnownPeer>>,
    /// Broadcast frames that gossip could not take, sent over the sessions instead.
    pub gossip_fallbacks: AtomicU64,
    /// Gossiped frames refused: malformed, or of a kind that travels on link sessions only.
    pub gossip_refused: AtomicU64,
}

/// A running mesh.
pub struct Mesh {
    pub peer_id: PeerId,
    /// The addresses it listens on (with the port the OS chose for `/tcp/0`).
    pub listen_addrs: Vec<Multiaddr>,
    pub stats: Arc<MeshStats>,
    /// Opens streams of any protocol to connected peers (what a test playing a peer uses to
    /// send raw bytes on a protocol's stream).
    pub streams: libp2p_stream::Control,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("peer_id", &self.peer_id)
            .field("listen_addrs", &self.listen_addrs)
            .finish_non_exhaustive()
    }
}

impl Mesh {
    /// Close every connection and stop.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.task.await;
    }
}

#[derive(NetworkBehaviour)]
struct Behaviour {
    limits: connection_limits::Behaviour,
    per_address: conn_limits::PerAddress,
    allow: Toggle<allow_block_list::Behaviour<allow_block_list::AllowedPeers>>,
    gossipsub: gossipsub::Behaviour,
    identify: identify::Behaviour,
    ping: ping::Behaviour,
    stream: libp2p_stream::Behaviour,
}

/// Start listening and dialling. Returns once every listen address is bound. `cmds` is the
/// other end of the broker task's broadcast channel (`Engine::with_mesh`).
pub async fn start(
    settings: MeshSettings,
    keypair: Keypair,
    engine: mpsc::Sender<ToEngine>,
    cmds: mpsc::Receiver<MeshCmd>,
    stats: Arc<MeshStats>,
    region: &str,
) -> anyhow::Result<Mesh> {
    let peer_id = keypair.public().to_peer_id();
    let psk = settings.cluster_key;
    let allow = settings.allow.clone();
    let (max_connections, max_per_address) = (
        settings.max_connections,
        settings.max_connections_per_address,
    );
    let ping_interval = settings.ping_interval;
    let agent = format!("meridian/{} region={region}", env!("CARGO_PKG_VERSION"));
    let uses_quic = settings
        .listen
        .iter()
        .chain(&settings.bootstrap)
        .any(|a| a.iter().any(|p| matches!(p, Protocol::QuicV1)));
    if uses_quic && !cfg!(feature = "quic") {
        anyhow::bail!("cluster: a /quic-v1 address needs a build with the `quic` feature");
    }
    if uses_quic && settings.allow.is_empty() {
        // The cluster key guards TCP only: over QUIC, the allowlist is what keeps strangers out.
        anyhow::bail!(
            "cluster.allow_peers: QUIC connections do not carry the cluster key; \
             list the peer ids allowed in (--allow-peer) to use a /quic-v1 address"
        );
    }
    let (dns_config, dns_opts) =
        hickory_resolver::system_conf::read_system_conf().unwrap_or_else(|e| {
            warn!(error = %e, "no usable DNS configuration (/etc/resolv.conf): peer addresses \
                   by name (/dns4/...) resolve from /etc/hosts only");
            (
                libp2p::dns::ResolverConfig::new(),
                libp2p::dns::ResolverOpts::default(),
            )
        });
    let builder = libp2p::SwarmBuilder::with_existing_identity(keypair).with_tokio();
    #[cfg(feature = "quic")]
    let builder = builder.with_quic();
    let mut swarm = builder
        .with_other_transport(|key| {
            let noise =
                member::NoiseMember::new(noise::Config::new(key)?, &psk, key.public().to_peer_id());
            let transport = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true))
                .upgrade(Version::V1Lazy)
                .authenticate(noise)
                .multiplex(yamux::Config::default())
                .timeout(Duration::from_secs(20));
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(transport)
        })
        .context("cannot build the p2p transport")?
        // `/dns4/…`, `/dns6/…` and `/dns/…` addresses resolve with the system's resolver.
        .with_dns_config(dns_config, dns_opts)
        .with_behaviour(|key| {
            let gossip_config = gossipsub::ConfigBuilder::default()
                .max_transmit_size(GOSSIP_MAX_FRAME + 4096)
                .heartbeat_interval(Duration::from_millis(500))
                .validation_mode(gossipsub::ValidationMode::Strict)
                .build()?;
            let gossipsub = gossipsub::Behaviour::new(
                gossipsub::MessageAuthenticity::Signed(key.clone()),
                gossip_config,
            )?;
            let allow = (!allow.is_empty()).then(|| {
                let mut list =
                    allow_block_list::Behaviour::<allow_block_list::AllowedPeers>::default();
                for p in &allow {
                    list.allow_peer(*p);
                }
                list
            });
            let total = u32::try_from(max_connections).unwrap_or(u32::MAX);
            Ok(Behaviour {
                limits: connection_limits::Behaviour::new(
                    connection_limits::ConnectionLimits::default()
                        .with_max_established_incoming(Some(total))
                        .with_max_pending_incoming(Some((total / 4).max(1))),
                ),
                per_address: conn_limits::PerAddress::new(max_per_address),
                allow: Toggle::from(allow),
                gossipsub,
                identify: identify::Behaviour::new(
                    identify::Config::new("/meridian/1".to_owned(), key.public())
                        .with_agent_version(agent)
                        // Dial only the configured peers and what discovery announces: the
                        // addresses a peer's connections report may be unreachable (or
                        // bypass the path the operator chose).
                        .with_cache_size(0),
                ),
                ping: ping::Behaviour::new(ping::Config::new().with_interval(ping_interval)),
                stream: libp2p_stream::Behaviour::new(),
            })
        })
        .context("cannot build the p2p behaviour")?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(3600)))
        .build();

    let topic = gossipsub::IdentTopic::new(GOSSIP_TOPIC);
    swarm
        .behaviour_mut()
        .gossipsub
        .subscribe(&topic)
        .context("cannot subscribe to the gossip topic")?;
    let discovery_topic = gossipsub::IdentTopic::new(discovery::DISCOVERY_TOPIC);
    if settings.discover {
        swarm
            .behaviour_mut()
            .gossipsub
            .subscribe(&discovery_topic)
            .context("cannot subscribe to the discovery topic")?;
    }
    let mut incoming = swarm
        .behaviour()
        .stream
        .new_control()
        .accept(LINK_PROTOCOL)
        .context("link protocol registered twice")?;

    let mut pending = HashSet::new();
    for addr in &settings.listen {
        let id = swarm
            .listen_on(addr.clone())
            .with_context(|| format!("cluster.listen: cannot listen on {addr}"))?;
        pending.insert(id);
    }
    let mut listen_addrs = Vec::new();
    while !pending.is_empty() {
        match swarm.select_next_some().await {
            SwarmEvent::NewListenAddr {
                listener_id,
                address,
            } => {
                info!(addr = %address.clone().with(Protocol::P2p(peer_id)), "p2p listening");
                pending.remove(&listener_id);
                listen_addrs.push(address);
            }
            SwarmEvent::ListenerClosed { reason: Err(e), .. }
            | SwarmEvent::ListenerError { error: e, .. } => {
                anyhow::bail!("cluster.listen: cannot listen: {e}");
            }
            other => debug!(event = ?other, "p2p event while binding"),
        }
    }

    // Incoming policy sync streams, opened by the peer with the smaller id too.
    if let Some(policy) = settings.policy.clone() {
        let members = settings
            .members
            .clone()
            .map(|gate| policy_sync::MemberCheck {
                gate,
                stats: stats.clone(),
            });
        let mut incoming = swarm
            .behaviour()
            .stream
            .new_control()
            .accept(policy_sync::POLICY_PROTOCOL)
            .context("policy protocol registered twice")?;
        tokio::spawn(async move {
            // One stream per peer: a newer one stops the older.
            let mut standing: HashMap<PeerId, oneshot::Sender<()>> = HashMap::new();
            while let Some((peer, stream)) = incoming.next().await {
                standing.retain(|_, stop| !stop.is_closed());
                let (stop, stopped) = oneshot::channel();
                if let Some(older) = standing.insert(peer, stop) {
                    let _ = older.send(());
                }
                tokio::spawn(policy_sync::run(
                    peer,
                    stream,
                    policy.clone(),
                    members.clone(),
                    Some(stopped),
                ));
            }
        });
    }
    // Incoming link sessions: the peer with the smaller id opened them.
    let accept_engine = engine.clone();
    let link_limits = settings.link_limits;
    tokio::spawn(async move {
        while let Some((peer, stream)) = incoming.next().await {
            let Ok(node) = NodeId::new(&peer.to_string()) else {
                continue;
            };
            tokio::spawn(session::run(
                node,
                stream,
                accept_engine.clone(),
                link_limits,
            ));
        }
    });

    let (stop, stop_rx) = oneshot::channel();
    let directory = settings.discover.then(|| {
        discovery::Directory::new(
            peer_id,
            &settings.allow,
            settings.redial_min,
            settings.redial_max,
            settings.announce_every,
        )
    });
    let advertise_listen = settings.advertise.is_empty();
    let advertise = if advertise_listen {
        listen_addrs.clone()
    } else {
        settings.advertise.clone()
    };
    let driver = Driver {
        swarm,
        topic,
        discovery_topic,
        directory,
        advertise,
        advertise_listen,
        announce_every: settings.announce_every,
        last_announce: None,
        next_periodic_announce: tokio::time::Instant::now(),
        announce_pending: false,
        link_limits: settings.link_limits,
        policy: settings.policy.clone(),
        members: settings
            .members
            .clone()
            .map(|gate| policy_sync::MemberCheck {
                gate,
                stats: stats.clone(),
            }),
        engine,
        stats: stats.clone(),
        bootstrap: settings
            .bootstrap
            .iter()
            .map(|addr| Bootstrap {
                addr: addr.clone(),
                peer: addr.iter().find_map(|p| match p {
                    Protocol::P2p(id) => Some(id),
                    _ => None,
                }),
                dialing: None,
                next: tokio::time::Instant::now(),
                backoff: settings.redial_min,
            })
            .collect(),
        redial_min: settings.redial_min,
        redial_max: settings.redial_max,
        openers: HashMap::new(),
        peer_id,
        gossip_warned: HashSet::new(),
        limit_warned: HashSet::new(),
    };
    let streams = driver.swarm.behaviour().stream.new_control();
    let task = tokio::spawn(driver.run(cmds, stop_rx));
    Ok(Mesh {
        peer_id,
        listen_addrs,
        stats,
        streams,
        stop: Some(stop),
        task,
    })
}

/// Peers remembered for once-per-peer warnings, at most (past it, refusals are only counted).
const MAX_WARNED: usize = 1_024;

/// A bootstrap peer: dialled until connected, re-dialled when its connection drops.
#[derive(Debug)]
struct Bootstrap {
    addr: Multiaddr,
    peer: Option<PeerId>,
    dialing: Option<ConnectionId>,
    next: tokio::time::Instant,
    backoff: Duration,
}

impl Bootstrap {
    /// Dial again after the current backoff, and double it for the time after.
    fn retry_later(&mut self, now: tokio::time::Instant, max: Duration) {
        self.next = now + self.backoff;
        self.backoff = (self.backoff * 2).min(max);
    }
}

struct Driver {
    swarm: Swarm<Behaviour>,
    topic: gossipsub::IdentTopic,
    discovery_topic: gossipsub::IdentTopic,
    /// The peers heard of by discovery (`None` with discovery off).
    directory: Option<discovery::Directory>,
    /// This node's addresses as announced to others.
    advertise: Vec<Multiaddr>,
    /// `advertise` follows the listen addresses (no `cluster.advertise`).
    advertise_listen: bool,
    announce_every: Duration,
    /// When an announcement last went out to at least one peer.
    last_announce: Option<tokio::time::Instant>,
    next_periodic_announce: tokio::time::Instant,
    /// A peer joined since the last announcement, which went out too recently to send another.
    announce_pending: bool,
    link_limits: crate::mailbox::LinkLimits,
    engine: mpsc::Sender<ToEngine>,
    stats: Arc<MeshStats>,
    bootstrap: Vec<Bootstrap>,
    redial_min: Duration,
    redial_max: Duration,
    /// Tasks that keep a link session open to a peer (for peers with a larger id).
    /// The tasks that keep a stream open to a peer, by peer and protocol.
    openers: HashMap<(PeerId, StreamProtocol), JoinHandle<()>>,
    policy: Option<crate::policy::PolicyHandle>,
    members: Option<policy_sync::MemberCheck>,
    peer_id: PeerId,
    /// Authors of refused gossip, warned about once each (at most [`MAX_WARNED`]).
    gossip_warned: HashSet<PeerId>,
    /// Addresses warned of for connections past a bound (at most [`MAX_WARNED`]).
    limit_warned: HashSet<Option<std::net::IpAddr>>,
}

impl Driver {
    async fn run(mut self, mut cmds: mpsc::Receiver<MeshCmd>, mut stop: oneshot::Receiver<()>) {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_event(event),
                cmd = cmds.recv() => match cmd {
                    Some(MeshCmd::Gossip(frame)) => self.gossip(frame),
                    Some(MeshCmd::Forget(node)) => self.forget(&node),
                    None => break,
                },
                _ = tick.tick() => {
                    self.dial_bootstrap();
                    self.discovery_tick();
                    // An opener gives up when its peer goes away; one that gave up while the
                    // peer came back (or never got an answer) is started again.
                    let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
                    for peer in peers {
                        self.ensure_session(peer);
                    }
                }
                _ = &mut stop => break,
            }
        }
        for (_, opener) in self.openers.drain() {
            opener.abort();
        }
        let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        for peer in peers {
            let _ = self.swarm.disconnect_peer_id(peer);
        }
        debug!("p2p mesh stopped");
    }

    fn gossip(&mut self, frame: Bytes) {
        let too_large = frame.len() > GOSSIP_MAX_FRAME;
        let result = if too_large {
            Err(gossipsub::PublishError::MessageTooLarge)
        } else {
            self.swarm
                .behaviour_mut()
                .gossipsub
                .publish(self.topic.clone(), frame.clone())
                .map(|_| ())
        };
        if let Err(e) = result {
            // No gossip peer yet (the mesh is forming) or too large: the sessions carry it.
            debug!(error = ?e, "gossip publish failed: sending over the link sessions");
            self.stats.gossip_fallbacks.fetch_add(1, Ordering::Relaxed);
            let _ = self
                .engine
                .try_send(ToEngine::Link(LinkEvent::BroadcastDirect(frame)));
        }
    }

    fn dial_bootstrap(&mut self) {
        let now = tokio::time::Instant::now();
        for b in &mut self.bootstrap {
            if b.dialing.is_some() || b.next > now {
                continue;
            }
            if b.peer.is_some_and(|p| self.swarm.is_connected(&p)) {
                continue;
            }
            let opts = DialOpts::unknown_peer_id().address(b.addr.clone()).build();
            let id = opts.connection_id();
            match self.swarm.dial(opts) {
                Ok(()) => b.dialing = Some(id),
                Err(e) => {
                    debug!(addr = %b.addr, error = %e, "cannot dial bootstrap peer");
                    b.retry_later(now, self.redial_max);
                }
            }
        }
    }

    /// Forget the peers no one announces any more, announce if it is time, and dial the
    /// discovered peers that are due (not connected, backoff passed).
    fn discovery_tick(&mut self) {
        let Some(directory) = &mut self.directory else {
            return;
        };
        let now = tokio::time::Instant::now();
        let gone = directory.expire(now);
        for peer in &gone {
            info!(%peer, "discovered peer forgotten: neither connected nor announced");
        }
        if !gone.is_empty() {
            self.show_directory();
        }
        if now >= self.next_periodic_announce {
            self.next_periodic_announce = now + self.announce_every;
            self.announce_pending = true;
        }
        self.announce_if_due(now);
        self.dial_discovered(now);
    }

    /// Publish what discovery knows to the metrics and the admin API.
    fn show_directory(&self) {
        let Some(directory) = &self.directory else {
            return;
        };
        if let Ok(mut shown) = self.stats.discovered.lock() {
            *shown = directory.snapshot();
        }
    }

    /// Dial the discovered peers that are due.
    fn dial_discovered(&mut self, now: tokio::time::Instant) {
        let Some(directory) = &mut self.directory else {
            return;
        };
        let mut shown_stale = false;
        for (peer, addrs) in directory.due(now) {
            if self.swarm.is_connected(&peer) {
                directory.connected(peer);
                shown_stale = true;
                continue;
            }
            if self.bootstrap.iter().any(|b| b.peer == Some(peer)) {
                continue; // Dialled as a bootstrap peer, by the configured address.
            }
            let opts = DialOpts::peer_id(peer)
                .addresses(addrs)
                .condition(PeerCondition::DisconnectedAndNotDialing)
                .build();
            let id = opts.connection_id();
            match self.swarm.dial(opts) {
                Ok(()) => {
                    debug!(%peer, "dialling a discovered peer");
                    directory.dialing(peer, id);
                }
                Err(e) => {
                    debug!(%peer, error = %e, "cannot dial a discovered peer");
                    directory.not_dialled(peer, now);
                }
            }
        }
        if shown_stale {
            self.show_directory();
        }
    }

    /// Tell the peers this node's addresses and those of its peers, if an announcement is
    /// pending and the last one is at least [`discovery::MIN_ANNOUNCE_GAP`] old.
    fn announce_if_due(&mut self, now: tokio::time::Instant) {
        let Some(directory) = &self.directory else {
            return;
        };
        if !self.announce_pending
            || self
                .last_announce
                .is_some_and(|last| now.duration_since(last) < discovery::MIN_ANNOUNCE_GAP)
        {
            return;
        }
        self.announce_pending = false;
        let announcement = directory.announcement(&self.advertise);
        match self
            .swarm
            .behaviour_mut()
            .gossipsub
            .publish(self.discovery_topic.clone(), announcement)
        {
            Ok(_) => self.last_announce = Some(now),
            // No peer on the topic yet: the first to join gets one at once.
            Err(e) => debug!(error = ?e, "cannot announce this node's peers"),
        }
    }

    fn on_announcement(&mut self, message: gossipsub::Message) {
        let (Some(author), Some(directory)) = (message.source, &mut self.directory) else {
            return;
        };
        let now = tokio::time::Instant::now();
        match discovery::decode(&message.data) {
            Ok(entries) => {
                let swarm = &self.swarm;
                let new = directory.learn(author, entries, now, |p| swarm.is_connected(p));
                let met = !new.is_empty();
                for peer in new {
                    info!(%peer, from = %author, "discovered peer");
                }
                self.show_directory();
                if met {
                    self.dial_discovered(now);
                }
            }
            Err(e) => warn!(peer = %author, error = %e, "announcement ignored"),
        }
    }

    fn on_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                endpoint,
                num_established,
                ..
            } => {
                for b in &mut self.bootstrap {
                    if b.dialing == Some(connection_id) {
                        b.dialing = None;
                        b.peer = Some(peer_id);
                    }
                    // Whoever dialled: the next outage starts from the shortest pause, and
                    // its first failed dial is a warning again.
                    if b.peer == Some(peer_id) {
                        b.backoff = self.redial_min;
                    }
                }
                if num_established.get() == 1 {
                    info!(peer = %peer_id, addr = %endpoint.get_remote_address(), "peer connected");
                }
                if let Some(directory) = &mut self.directory {
                    directory.connected(peer_id);
                    self.show_directory();
                }
                self.ensure_session(peer_id);
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established,
                cause,
                ..
            } => {
                if num_established == 0 {
                    info!(peer = %peer_id, cause = ?cause, "peer disconnected");
                    let why = cause.as_ref().map_or_else(
                        || "closed".to_owned(),
                        |e| format!("connection closed: {e}"),
                    );
                    self.note_error(peer_id, why);
                    if let Ok(mut rtt) = self.stats.rtt.lock() {
                        rtt.remove(&peer_id.to_string());
                    }
                    let now = tokio::time::Instant::now();
                    for b in &mut self.bootstrap {
                        if b.peer == Some(peer_id) {
                            b.next = now + b.backoff;
                        }
                    }
                    if let Some(directory) = &mut self.directory {
                        directory.disconnected(peer_id, now);
                        self.show_directory();
                    }
                }
            }
            SwarmEvent::OutgoingConnectionError {
                connection_id,
                error,
                peer_id,
                ..
            } => {
                if let Some(peer) = peer_id {
                    self.note_error(peer, format!("dial failed: {error}"));
                }
                let now = tokio::time::Instant::now();
                for b in &mut self.bootstrap {
                    if b.dialing == Some(connection_id) {
                        b.dialing = None;
                        // The first failure in a row is worth a warning (a wrong address or
                        // name shows at once); the retries are not.
                        if b.backoff == self.redial_min {
                            warn!(addr = %b.addr, error = %error, "bootstrap peer did not answer; dialling it again with backoff");
                        } else {
                            debug!(addr = %b.addr, error = %error, retry_in = ?b.backoff, "bootstrap peer did not answer");
                        }
                        b.retry_later(now, self.redial_max);
                        self.stats.dial_failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if let Some(directory) = &mut self.directory
                    && directory.dial_failed(connection_id, now)
                {
                    self.stats.dial_failures.fetch_add(1, Ordering::Relaxed);
                    debug!(peer = ?peer_id, error = %error, "discovered peer did not answer");
                }
                if let DialError::Denied { cause } = &error {
                    self.stats
                        .refused_not_allowed
                        .fetch_add(1, Ordering::Relaxed);
                    warn!(peer = ?peer_id, cause = %cause, "refused to connect to a peer not on the allowlist");
                }
            }
            SwarmEvent::IncomingConnectionError {
                send_back_addr,
                error,
                peer_id,
                ..
            } => match error {
                ListenError::Denied { cause }
                    if cause.downcast_ref::<conn_limits::AddressFull>().is_some()
                        || cause
                            .downcast_ref::<connection_limits::Exceeded>()
                            .is_some() =>
                {
                    self.stats.refused_limit.fetch_add(1, Ordering::Relaxed);
                    let host = conn_limits::source(&send_back_addr);
                    if self.limit_warned.len() < MAX_WARNED && self.limit_warned.insert(host) {
                        warn!(addr = %send_back_addr, cause = %cause, "refused a p2p connection past a bound (said once per address)");
                    }
                }
                ListenError::Denied { cause } => {
                    self.stats
                        .refused_not_allowed
                        .fetch_add(1, Ordering::Relaxed);
                    warn!(peer = ?peer_id, addr = %send_back_addr, cause = %cause, "refused a node that is not on the allowlist");
                }
                ListenError::Transport(e) => {
                    self.stats.refused_handshake.fetch_add(1, Ordering::Relaxed);
                    warn!(addr = %send_back_addr, error = %e, "refused a connection that failed the handshake (no or wrong cluster key?)");
                }
                other => {
                    debug!(addr = %send_back_addr, error = %other, "incoming connection failed")
                }
            },
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(gossipsub::Event::Message {
                message,
                ..
            })) => {
                if message.topic == self.discovery_topic.hash() {
                    self.on_announcement(message);
                } else {
                    self.on_gossip(message);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(gossipsub::Event::Subscribed {
                peer_id,
                topic,
            })) if topic == self.discovery_topic.hash() => {
                debug!(peer = %peer_id, "peer joined discovery: announcing");
                self.announce_pending = true;
                self.announce_if_due(tokio::time::Instant::now());
            }
            SwarmEvent::NewListenAddr { address, .. } => {
                if self.advertise_listen && !self.advertise.contains(&address) {
                    self.advertise.push(address);
                }
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                if self.advertise_listen {
                    self.advertise.retain(|a| *a != address);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event {
                peer,
                result: Ok(rtt),
                ..
            })) => {
                if let Ok(mut map) = self.stats.rtt.lock() {
                    map.insert(peer.to_string(), rtt);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) => debug!(peer = %peer_id, agent = info.agent_version, "identified peer"),
            other => debug!(event = ?other, "p2p event"),
        }
    }

    /// Keep one link session (and one policy sync stream) open to `peer` if this node is the
    /// one that opens them.
    fn ensure_session(&mut self, peer: PeerId) {
        if self.peer_id.to_bytes() >= peer.to_bytes() {
            return; // The peer opens them.
        }
        let Ok(node) = NodeId::new(&peer.to_string()) else {
            return;
        };
        let engine = self.engine.clone();
        let limits = self.link_limits;
        self.keep_open(peer, LINK_PROTOCOL, None, move |stream| {
            session::run(node.clone(), stream, engine.clone(), limits)
        });
        if let Some(policy) = self.policy.clone() {
            // A policy stream the peer refuses at once (a document past its bound) is not
            // opened again and again: the pause grows, and the next connection tries anew.
            let healthy = Some(Duration::from_secs(1));
            let members = self.members.clone();
            self.keep_open(peer, policy_sync::POLICY_PROTOCOL, healthy, move |stream| {
                policy_sync::run(peer, stream, policy.clone(), members.clone(), None)
            });
        }
    }

    /// Open a `protocol` stream to `peer` and run `serve` on it, again whenever it ends, while
    /// the broker task runs and the peer answers. The pause between tries starts again from
    /// the shortest after a stream that was served (for at least `healthy`, if given).
    fn keep_open<F, Fut>(
        &mut self,
        peer: PeerId,
        protocol: StreamProtocol,
        healthy: Option<Duration>,
        serve: F,
    ) where
        F: Fn(libp2p::Stream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let key = (peer, protocol.clone());
        if self.openers.get(&key).is_some_and(|t| !t.is_finished()) {
            return;
        }
        let mut control = self.swarm.behaviour().stream.new_control();
        let engine = self.engine.clone();
        let task = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            loop {
                // Bounded: a request made while the peer was reconnecting can go unanswered.
                let open = control.open_stream(peer, protocol.clone());
                match tokio::time::timeout(OPEN_TIMEOUT, open).await {
                    Ok(Ok(stream)) => {
                        let started = tokio::time::Instant::now();
                        serve(stream).await;
                        if healthy.is_none_or(|h| started.elapsed() >= h) {
                            backoff = Duration::from_millis(50);
                        }
                    }
                    Ok(Err(e)) => debug!(%peer, %protocol, error = %e, "cannot open a stream"),
                    Err(_) => debug!(%peer, %protocol, "opening a stream timed out; retrying"),
                }
                if engine.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                // Opening a stream dials the peer if it is not connected: give up after a while
                // and let the next connection start a new opener.
                if backoff >= Duration::from_secs(5) {
                    return;
                }
            }
        });
        self.openers.insert(key, task);
    }

    /// Remember why `peer`'s connection last ended or failed (bounded like the peers).
    fn note_error(&self, peer: PeerId, why: String) {
        if let Ok(mut map) = self.stats.last_error.lock()
            && (map.len() < MAX_WARNED || map.contains_key(&peer.to_string()))
        {
            // At most 200 bytes, cut at a character boundary (addresses may name any host).
            let mut cut = why.len().min(200);
            while !why.is_char_boundary(cut) {
                cut -= 1;
            }
            map.insert(peer.to_string(), why[..cut].to_owned());
        }
    }

    fn first_gossip_warning(&mut self, author: PeerId) -> bool {
        self.gossip_warned.len() < MAX_WARNED && self.gossip_warned.insert(author)
    }

    /// The broker forgot `node`: discovery stops dialling it.
    fn forget(&mut self, node: &NodeId) {
        let Ok(peer) = node.as_str().parse::<PeerId>() else {
            return;
        };
        if let Some(directory) = &mut self.directory
            && directory.forget(&peer)
        {
            self.show_directory();
        }
    }

    /// A gossiped frame, authored by `message.source` (gossipsub checked its signature). Only
    /// the kinds a node broadcasts are taken; the broker checks that what the frame names as
    /// its origin is its author.
    fn on_gossip(&mut self, message: gossipsub::Message) {
        let Some(source) = message.source else {
            return;
        };
        let Ok(node) = NodeId::new(&source.to_string()) else {
            return;
        };
        // One frame per message.
        match link::decode_message(&message.data, DEFAULT_MAX_FRAME_LEN) {
            Ok(frames) if frames.len() == 1 && !frames[0].kind().is_broadcast() => {
                self.stats.gossip_refused.fetch_add(1, Ordering::Relaxed);
                if self.first_gossip_warning(source) {
                    warn!(peer = %source, frame = frames[0].name(), "refused a gossiped frame of a kind that travels on link sessions only (reported once per peer)");
                }
            }
            Ok(frames) if frames.len() == 1 => {
                let msg = ToEngine::Link(LinkEvent::Frames { peer: node, frames });
                // A full broker queue drops a broadcast: digests and snapshots recover it.
                if self.engine.try_send(msg).is_err() {
                    debug!(peer = %source, "broker busy: gossip frame dropped");
                }
            }
            other => {
                self.stats.gossip_refused.fetch_add(1, Ordering::Relaxed);
                if self.first_gossip_warning(source) {
                    warn!(peer = %source, result = ?other.map(|f| f.len()), "malformed gossip frame ignored (reported once per peer)")
                }
            }
        }
    }
}
