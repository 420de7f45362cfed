//! The messages and queues between the daemon's tasks: what the broker task is sent
//! ([`ToEngine`], through an [`EngineHandle`]), what it orders the mesh task to do
//! ([`MeshCmd`]), what it hands a connection's task to write ([`outbox`]) and a link
//! session to send ([`link_queue`]), and the counters they keep together
//! ([`DaemonCounters`]). Every part of the daemon that talks to the broker task imports this
//! module; it imports none of them.

mod counters;
pub mod link_queue;
mod members;
pub mod outbox;

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

pub use counters::DaemonCounters;
pub use link_queue::{LinkLimits, PeerWriter};
pub use members::MemberGate;
pub use outbox::Outbox;

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

/// A message for the broker task, by concern: each has a room of the engine that takes it.
#[derive(Debug)]
pub enum ToEngine {
    /// A client connection's life.
    Conn(ConnEvent),
    /// Link sessions to peer nodes and leaves, and their frames.
    Link(LinkEvent),
    /// A question or an order from admin HTTP or an embedding application.
    Admin(AdminRequest),
    /// What the cluster policy (or a reload) puts in force.
    Policy(PolicyChange),
    /// Stop: shut the broker down and flush the store.
    Shutdown,
}

/// A client connection's life, from the listeners, the connection tasks and the password
/// checks.
#[derive(Debug)]
pub enum ConnEvent {
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
}

/// Link sessions to peer nodes (the mesh) and to leaves (edge links).
#[derive(Debug)]
pub enum LinkEvent {
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
        /// The scope its credential holds it to, if any.
        scope: Option<meridian_core::broker::LeafScope>,
        session: u64,
        writer: PeerWriter,
        accepted: oneshot::Sender<bool>,
    },
    /// The frames of one read from a peer node's session, or one gossiped frame: fed to the
    /// broker as one input (their forward acknowledgements leave as one per origin).
    Frames { peer: NodeId, frames: Vec<Frame> },
    /// A link session ended.
    Down { peer: NodeId, session: u64 },
    /// An encoded broadcast frame that gossip could not take: send it on every session.
    BroadcastDirect(Bytes),
}

/// A question or an order from admin HTTP or an embedding application, answered on `reply`.
#[derive(Debug)]
pub enum AdminRequest {
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
    Peers(oneshot::Sender<Vec<PeerSummary>>),
    /// Forget a node that left the deployment ([`meridian_core::Broker::forget_peer_signed`]),
    /// with the operator's signature for the other nodes, where there are operator keys.
    ForgetPeer {
        peer: NodeId,
        signature: Option<bytes::Bytes>,
        reply: oneshot::Sender<Result<Forgotten, ForgetError>>,
    },
    /// A peer's route set as replicated here (`None`: this node's own).
    Routes {
        peer: Option<NodeId>,
        reply: oneshot::Sender<Vec<String>>,
    },
}

/// What the cluster policy, or a reload of the files, puts in force; each answered once the
/// broker has it.
#[derive(Debug)]
pub enum PolicyChange {
    /// Replace the broker's hooks.
    Hooks {
        hooks: Hooks,
        reply: oneshot::Sender<()>,
    },
    /// Put these data-residency rules in force, with the regions of the deployment's nodes
    /// as the cluster policy records them.
    Residency {
        rules: meridian_core::residency::Residency,
        node_regions: std::collections::BTreeMap<NodeId, String>,
        reply: oneshot::Sender<()>,
    },
}

/// What the broker has in force of the cluster policy document, as the task that follows it
/// last put there. The admin API reports it (`/api/node`, `policy_in_force`), so that an
/// operator, or a test, can wait for a change to be in force rather than only in the
/// document.
#[derive(Debug, Default)]
pub struct PolicyInForce {
    /// Changes put in force since the start.
    pub changes: AtomicU64,
    /// Users.
    pub users: AtomicU64,
    /// Access rules.
    pub acl_rules: AtomicU64,
    /// Data-residency rules.
    pub residency_rules: AtomicU64,
}

/// What came of the reloads of the configuration (SIGHUP, [`crate::Server::reload`]), as the
/// admin API reports it (`/api/node`, `reloads`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReloadStatus {
    /// Reloads applied.
    pub done: u64,
    /// Reloads refused (the configuration or a file it names could not be read), which
    /// changed nothing.
    pub failed: u64,
    /// Why the last reload was refused, if it was.
    pub last_error: Option<String>,
    /// The configuration last read differs beyond `[auth]` and `[acl]`: that waits for a
    /// restart.
    pub restart_needed: bool,
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
            tx.send(ToEngine::Conn(ConnEvent::Accept {
                info,
                outbox,
                reply,
            }))
            .await
            .ok()?;
            rx.await.ok()
        }
    }

    /// Ask the broker task; `None` if it is gone.
    async fn ask<T>(&self, request: impl FnOnce(oneshot::Sender<T>) -> AdminRequest) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(ToEngine::Admin(request(reply))).await.ok()?;
        rx.await.ok()
    }

    pub async fn stats(&self) -> Option<Stats> {
        self.ask(AdminRequest::Stats).await
    }

    /// Peer nodes this node knows (cluster mode; empty otherwise).
    pub async fn peers(&self) -> Option<Vec<PeerSummary>> {
        self.ask(AdminRequest::Peers).await
    }

    /// Forget a node that left the deployment; the announcement carries `signature`.
    pub async fn forget_peer(
        &self,
        peer: NodeId,
        signature: Option<bytes::Bytes>,
    ) -> Option<Result<Forgotten, ForgetError>> {
        self.ask(|reply| AdminRequest::ForgetPeer {
            peer,
            signature,
            reply,
        })
        .await
    }

    /// A peer's route set as replicated here, or this node's own with `None`.
    pub async fn routes(&self, peer: Option<NodeId>) -> Option<Vec<String>> {
        self.ask(|reply| AdminRequest::Routes { peer, reply }).await
    }

    pub async fn clients(&self) -> Option<Vec<ClientSummary>> {
        self.ask(AdminRequest::Clients).await
    }

    /// A page of the sessions, and how many there are of those the page's filter selects.
    pub async fn clients_page(&self, page: Page) -> Option<(Vec<ClientSummary>, usize)> {
        self.ask(|reply| AdminRequest::ClientsPage { page, reply })
            .await
    }

    pub async fn subscriptions_page(
        &self,
        page: Page,
    ) -> Option<(Vec<SubscriptionSummary>, usize)> {
        self.ask(|reply| AdminRequest::SubscriptionsPage { page, reply })
            .await
    }

    /// End a client's session; whether there was one.
    pub async fn end_session(&self, client_id: String) -> Option<bool> {
        self.ask(|reply| AdminRequest::EndSession { client_id, reply })
            .await
    }

    /// Disconnect a client (0x98 Administrative action); whether it was connected.
    pub async fn kick(&self, client_id: String) -> Option<bool> {
        self.ask(|reply| AdminRequest::Kick { client_id, reply })
            .await
    }

    /// Publish from the application; the number of sessions it reached.
    pub async fn publish(&self, message: Message) -> Option<Result<usize, TopicError>> {
        self.ask(|reply| AdminRequest::Publish { message, reply })
            .await
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
