//! The messages between the daemon's tasks: what the broker task is sent ([`ToEngine`],
//! through an [`EngineHandle`]), what it orders the mesh task to do ([`MeshCmd`]), and the
//! counters they keep together ([`DaemonCounters`]). Every part of the daemon that talks to the
//! broker task imports this module; it imports none of them.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use bytes::Bytes;
use meridian_core::broker::{
    AuthOutcome, Authenticator, Authorizer, ClientSummary, ForgetError, Forgotten, Message,
    PeerSummary, Stats, SubscriptionSummary,
};
use meridian_core::link::Frame;
use meridian_core::routes::NodeId;
use meridian_core::topic::TopicError;
use meridian_core::{ConnId, ConnInfo};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};

use crate::mesh::queue::PeerWriter;
use crate::transport::Outbox;

/// Capacity of the channel into the broker task (each message at most one 16 KiB read).
pub const ENGINE_QUEUE: usize = 1024;

/// An authenticator the broker task can hold.
pub type SendAuthenticator = Box<dyn Authenticator + Send>;
/// An authorizer the broker task can hold.
pub type SendAuthorizer = Box<dyn Authorizer + Send>;

/// Authentication and authorization hooks that replace the broker's (a reload).
pub struct Hooks {
    pub authenticator: SendAuthenticator,
    pub authorizer: SendAuthorizer,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooks")
    }
}

/// A message for the broker task.
#[derive(Debug)]
pub enum ToEngine {
    /// A plain TCP connection, for the broker task to serve itself.
    AcceptTcp {
        info: ConnInfo,
        socket: std::net::TcpStream,
        permit: OwnedSemaphorePermit,
    },
    /// A connection served by a task of its own, which writes what the outbox gets.
    Accept {
        info: ConnInfo,
        outbox: Arc<Outbox>,
        reply: oneshot::Sender<ConnId>,
    },
    Bytes {
        conn: ConnId,
        data: Bytes,
    },
    Closed {
        conn: ConnId,
    },
    AuthDecision {
        conn: ConnId,
        outcome: AuthOutcome,
    },
    Stats(oneshot::Sender<Stats>),
    Clients(oneshot::Sender<Vec<ClientSummary>>),
    /// A page of the sessions, of those whose client id holds the filter, and the total.
    ClientsPage {
        page: Page,
        reply: oneshot::Sender<(Vec<ClientSummary>, usize)>,
    },
    /// A page of the subscriptions (client id, filter, QoS), and the total.
    SubscriptionsPage {
        page: Page,
        reply: oneshot::Sender<(Vec<SubscriptionSummary>, usize)>,
    },
    /// End a client's session (an operator's decision); whether there was one.
    EndSession {
        client_id: String,
        reply: oneshot::Sender<bool>,
    },
    Kick {
        client_id: String,
        reply: oneshot::Sender<bool>,
    },
    Publish {
        message: Message,
        reply: oneshot::Sender<Result<usize, TopicError>>,
    },
    /// A link session to a peer node started (it replaces any earlier one).
    PeerUp {
        peer: NodeId,
        session: u64,
        writer: PeerWriter,
    },
    /// An edge link named its leaf (the `edge` module): the broker task answers whether it may
    /// link (not this node, nor a mesh member) and, if so, makes it a leaf and starts its
    /// session (it replaces any earlier one).
    LeafUp {
        leaf: NodeId,
        session: u64,
        writer: PeerWriter,
        accepted: oneshot::Sender<bool>,
    },
    /// A frame from a peer node (from its session or from gossip).
    PeerFrame {
        peer: NodeId,
        frame: Box<Frame>,
    },
    /// A link session ended.
    PeerDown {
        peer: NodeId,
        session: u64,
    },
    /// An encoded broadcast frame that gossip could not take: send it on every session.
    BroadcastDirect(Bytes),
    Peers(oneshot::Sender<Vec<PeerSummary>>),
    /// Forget a node that left the deployment ([`meridian_core::Broker::forget_peer`]).
    ForgetPeer {
        peer: NodeId,
        reply: oneshot::Sender<Result<Forgotten, ForgetError>>,
    },
    /// A peer's route set as replicated here (`None`: this node's own).
    Routes {
        peer: Option<NodeId>,
        reply: oneshot::Sender<Vec<String>>,
    },
    /// Replace the broker's hooks; answered once they are in place.
    SetHooks {
        hooks: Hooks,
        reply: oneshot::Sender<()>,
    },
    /// Put these data-residency rules in force, with the regions of the deployment's nodes
    /// as the cluster policy records them.
    SetResidency {
        rules: meridian_core::residency::Residency,
        node_regions: std::collections::BTreeMap<NodeId, String>,
    },
    Shutdown,
}

/// Counters kept by the daemon itself (the broker's are in [`Stats`]).
#[derive(Debug, Default)]
pub struct DaemonCounters {
    pub slow_consumer_disconnects: AtomicU64,
    /// Link sessions cut because their frame queue was full.
    pub link_sessions_cut: AtomicU64,
    pub connections_rejected: AtomicU64,
    pub storage_commits: AtomicU64,
    /// Fsyncs of the journal ([`Store::syncs`]).
    pub storage_syncs: AtomicU64,
    /// Journal checkpoints ([`Store::checkpoints`]).
    pub storage_checkpoints: AtomicU64,
    /// Pages the store's cache let go of because it was full ([`Store::cache_evictions`]).
    pub storage_cache_evictions: AtomicU64,
    pub connections_accepted: AtomicU64,
    /// Password checks done (Argon2 verifications, right or wrong).
    pub password_checks: AtomicU64,
    /// CONNECTs refused with 0x89 because the password-check queue was full.
    pub logins_busy: AtomicU64,
    /// ... because the client's address had its share of the queue.
    pub logins_busy_address: AtomicU64,
    /// CONNECTs refused because a client certificate's name was not the username given.
    pub logins_certificate_mismatch: AtomicU64,
    /// WebSocket upgrades refused for their Origin (HTTP 403).
    pub websocket_origin_refused: AtomicU64,
    /// Admin requests refused: no or a wrong bearer token (HTTP 401).
    pub admin_refused_token: AtomicU64,
    /// ... a Host header that names no allowed host (HTTP 421).
    pub admin_refused_host: AtomicU64,
    /// Admin connections closed because their request headers took too long.
    pub admin_header_timeouts: AtomicU64,
    /// Edge links refused: no or a wrong token (HTTP 401).
    pub edge_links_refused_token: AtomicU64,
    /// ... a leaf named as this node or a mesh member.
    pub edge_links_refused_node: AtomicU64,
    /// ... too many handshakes from one address (HTTP 503).
    pub edge_links_refused_busy_address: AtomicU64,
    /// Link frames read from edge links, and written to them.
    pub edge_frames_in: AtomicU64,
    pub edge_frames_out: AtomicU64,
}

/// A cheap handle to the broker task.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    pub tx: mpsc::Sender<ToEngine>,
    pub counters: Arc<DaemonCounters>,
}

impl EngineHandle {
    /// Register a connection; `None` if the broker is stopping. The wait does not borrow the
    /// handle.
    pub fn accept(
        &self,
        info: ConnInfo,
        outbox: Arc<Outbox>,
    ) -> impl Future<Output = Option<ConnId>> + Send + 'static {
        let tx = self.tx.clone();
        async move {
            let (reply, rx) = oneshot::channel();
            tx.send(ToEngine::Accept {
                info,
                outbox,
                reply,
            })
            .await
            .ok()?;
            rx.await.ok()
        }
    }

    pub async fn stats(&self) -> Option<Stats> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(ToEngine::Stats(reply)).await.ok()?;
        rx.await.ok()
    }

    /// Peer nodes this node knows (cluster mode; empty otherwise).
    pub async fn peers(&self) -> Option<Vec<PeerSummary>> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(ToEngine::Peers(reply)).await.ok()?;
        rx.await.ok()
    }

    /// Forget a node that left the deployment; `None` if the broker task is gone.
    pub async fn forget_peer(&self, peer: NodeId) -> Option<Result<Forgotten, ForgetError>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(ToEngine::ForgetPeer { peer, reply })
            .await
            .ok()?;
        rx.await.ok()
    }

    /// A peer's route set as replicated here, or this node's own with `None`.
    pub async fn routes(&self, peer: Option<NodeId>) -> Option<Vec<String>> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(ToEngine::Routes { peer, reply }).await.ok()?;
        rx.await.ok()
    }

    pub async fn clients(&self) -> Option<Vec<ClientSummary>> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(ToEngine::Clients(reply)).await.ok()?;
        rx.await.ok()
    }

    /// Disconnect a client (0x98 Administrative action); whether it was connected.
    pub async fn clients_page(&self, page: Page) -> Option<(Vec<ClientSummary>, usize)> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(ToEngine::ClientsPage { page, reply })
            .await
            .ok()?;
        rx.await.ok()
    }

    pub async fn subscriptions_page(
        &self,
        page: Page,
    ) -> Option<(Vec<SubscriptionSummary>, usize)> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(ToEngine::SubscriptionsPage { page, reply })
            .await
            .ok()?;
        rx.await.ok()
    }

    pub async fn end_session(&self, client_id: String) -> Option<bool> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(ToEngine::EndSession { client_id, reply })
            .await
            .ok()?;
        rx.await.ok()
    }

    pub async fn kick(&self, client_id: String) -> Option<bool> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(ToEngine::Kick { client_id, reply })
            .await
            .ok()?;
        rx.await.ok()
    }

    /// Publish from the application; the number of sessions it reached.
    pub async fn publish(&self, message: Message) -> Option<Result<usize, TopicError>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(ToEngine::Publish { message, reply })
            .await
            .ok()?;
        rx.await.ok()
    }
}

/// Orders for the mesh task.
#[derive(Debug)]
pub enum MeshCmd {
    /// Publish an encoded link frame to every peer.
    Gossip(Bytes),
    /// A node was forgotten: discovery stops dialling it.
    Forget(NodeId),
}

/// A page of a listing: `limit` entries from `offset`, of those that hold `filter`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub offset: usize,
    pub limit: usize,
    pub filter: Option<String>,
}
