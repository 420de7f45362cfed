//! Starting and stopping a whole broker: storage, the broker task, listeners, admin HTTP
//! ([`start`] in named steps), and following the cluster policy while it runs ([`follow`]).

mod follow;
mod settings;
mod start;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::bail;
use meridian_core::ConnId;
use meridian_core::broker::AuthOutcome;
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use crate::auth;
use crate::broker_thread::BrokerThread;
use crate::config::{DaemonConfig, ListenerKind};
use crate::mailbox::{
    ConnEvent, EngineHandle, ReloadStatus, SendAuthenticator, SendAuthorizer, ToEngine,
};
use crate::mesh::Mesh;
use crate::policy::PolicyHandle;

/// Builds and starts a broker inside the caller's tokio runtime.
///
/// ```no_run
/// # async fn demo() -> anyhow::Result<()> {
/// let server = meridian_daemon::BrokerBuilder::new()
///     .mqtt_addr("127.0.0.1:0".parse()?)
///     .data_dir("/tmp/meridian-example")
///     .start()
///     .await?;
/// println!("MQTT on {}", server.local_addr(meridian_daemon::ListenerKind::Tcp).unwrap());
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
    addrs: Vec<(ListenerKind, SocketAddr)>,
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
    /// What came of the reloads, for the admin API.
    reloads: Arc<Mutex<ReloadStatus>>,
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
        start::start(config, custom_auth).await
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

    /// The bound address of a listener, if it is enabled.
    pub fn local_addr(&self, kind: ListenerKind) -> Option<SocketAddr> {
        self.addrs.iter().find(|(k, _)| *k == kind).map(|(_, a)| *a)
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

    /// The daemon's answer to SIGHUP: read the configuration again with `load` and apply its
    /// `[auth]` and `[acl]` ([`Server::reload_auth`]). What came of it is kept for the admin
    /// API (`/api/node`, `reloads`): applied or refused (and why), and whether other changes
    /// wait for a restart.
    pub async fn reload(
        &self,
        load: impl FnOnce() -> anyhow::Result<DaemonConfig>,
    ) -> anyhow::Result<AuthReload> {
        let result = match load() {
            Ok(config) => self.reload_auth(&config).await,
            Err(e) => Err(e),
        };
        let mut status = self.reloads.lock().unwrap_or_else(PoisonError::into_inner);
        match &result {
            Ok(r) => {
                status.done += 1;
                status.last_error = None;
                status.restart_needed = r.other_changes;
            }
            Err(e) => {
                status.failed += 1;
                status.last_error = Some(format!("{e:#}"));
            }
        }
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
        follow::set_hooks(&self.handle.tx, setup, &self.verify_limits, true).await?;
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
