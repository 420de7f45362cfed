//! Authentication and authorization hooks the shell plugs in.

use bytes::Bytes;

use super::io::ConnId;
use crate::acl::Acl;
pub use crate::acl::{ClientRef, FilterAccess};
use crate::codec::ReasonCode;
use crate::routes::NodeId;
use crate::topic::TopicFilter;

/// What an authenticator is asked, on CONNECT and on each AUTH step.
#[derive(Debug, Clone, Copy)]
pub struct AuthRequest<'a> {
    /// The connection asking.
    pub conn: ConnId,
    /// The session's client id (assigned by the broker if CONNECT had none).
    pub client_id: &'a str,
    /// The user name from CONNECT; on re-authentication, the one the session runs as.
    pub username: Option<&'a str>,
    /// The password from CONNECT; `None` on AUTH steps.
    pub password: Option<&'a [u8]>,
    /// MQTT 5.0 enhanced authentication method, if the client named one.
    pub method: Option<&'a str>,
    /// Authentication data of this step (CONNECT or AUTH).
    pub data: Option<&'a [u8]>,
    /// Identity from a verified TLS client certificate.
    pub tls_identity: Option<&'a str>,
    /// Peer address, as the shell gave it in [`crate::ConnInfo`].
    pub remote_addr: Option<&'a str>,
    /// `true` for the steps after the first (AUTH packets), including re-authentication.
    pub continuation: bool,
    /// `true` when a connected client re-authenticates (AUTH 0x19).
    pub reauthentication: bool,
}

/// An authenticator's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthOutcome {
    /// Let the client in, as this user (defaults to the CONNECT username when `None`).
    Allow {
        /// The user name the session runs as; `None` keeps the client's own.
        username: Option<String>,
    },
    /// Refuse with this reason (CONNACK, or DISCONNECT when re-authenticating).
    Deny(ReasonCode),
    /// Enhanced authentication continues: send AUTH 0x18 with this data and wait for the client.
    Continue(Bytes),
    /// The decision comes later, through [`super::Input::AuthDecision`] (e.g. a slow password hash
    /// computed off the thread that drives the broker).
    Pending,
}

/// Decides who may connect. Called synchronously; answer `Pending` to decide asynchronously.
pub trait Authenticator {
    /// Judge one step: a CONNECT, an AUTH that continues an exchange, or a re-authentication.
    fn authenticate(&mut self, request: &AuthRequest<'_>) -> AuthOutcome;

    /// What shows other nodes that the client of `conn`, just let in, authenticated here as
    /// its user, for its claim on `client_id` (cluster mode; [`crate::link::Claim::proof`]).
    /// Asked once, as the claim is made. None by default.
    fn claim_proof(&mut self, conn: ConnId, client_id: &str) -> Option<Bytes> {
        let _ = (conn, client_id);
        None
    }
}

impl<T: Authenticator + ?Sized> Authenticator for Box<T> {
    fn authenticate(&mut self, request: &AuthRequest<'_>) -> AuthOutcome {
        (**self).authenticate(request)
    }

    fn claim_proof(&mut self, conn: ConnId, client_id: &str) -> Option<Bytes> {
        (**self).claim_proof(conn, client_id)
    }
}

/// Decides what a connected client may do.
///
/// The broker asks [`Authorizer::may_subscribe`] once per subscription, when it is made (and
/// again when the hooks are replaced, the session changes user or is restored). Messages for
/// a subscription answered [`FilterAccess::Filtered`] are each checked with
/// [`Authorizer::may_receive`] before delivery — live, retained and forwarded alike; the
/// others are never checked per message. [`Acl`] is the rule engine the shells use.
pub trait Authorizer {
    /// Whether `client` may publish to `topic` (its will included).
    fn may_publish(&self, client: &ClientRef<'_>, topic: &str) -> bool;
    /// What a subscription to `filter` may receive: `Denied` refuses it in SUBACK.
    fn may_subscribe(&self, client: &ClientRef<'_>, filter: &TopicFilter) -> FilterAccess;
    /// Whether a message on `topic` may go to `client` through a subscription that
    /// [`Authorizer::may_subscribe`] answered `Filtered` for.
    fn may_receive(&self, client: &ClientRef<'_>, topic: &str) -> bool;

    /// Whether node `claimer`'s claim on `client_id` counts: the user it names is the one its
    /// client authenticated as there ([`crate::link::Claim::proof`]). A claim that does not
    /// count is dropped: it moves no session and keeps no one out. Every claim counts by
    /// default.
    fn vouches(&self, client_id: &str, claimer: &NodeId, claim: &crate::link::Claim) -> bool {
        let _ = (client_id, claimer, claim);
        true
    }

    /// Whether an announced forget of `node`'s `incarnation` counts: with operator keys, one
    /// the operator signed (`signature`, as [`crate::Broker::forget_peer_signed`] was given
    /// it). One that does not count is dropped and counted (`not_owner`). Every forget counts
    /// by default (as documented, only where the node is not reached).
    fn vouches_forget(&self, node: &NodeId, incarnation: u64, signature: Option<&[u8]>) -> bool {
        let _ = (node, incarnation, signature);
        true
    }

    /// Whether mesh node `node` runs in the `region` its hello names: with operator keys, the
    /// operator certified it (`certificate`, as the node's [`crate::broker::ClusterConfig::certificate`]).
    /// A region not vouched for is not recorded (residency rules then keep every restricted
    /// message from the node, and home regions do not count it) and the hello is counted as
    /// `not_owner`. Every region counts by default.
    fn vouches_region(&self, node: &NodeId, region: &str, certificate: Option<&[u8]>) -> bool {
        let _ = (node, region, certificate);
        true
    }
}

impl<T: Authorizer + ?Sized> Authorizer for Box<T> {
    fn may_publish(&self, client: &ClientRef<'_>, topic: &str) -> bool {
        (**self).may_publish(client, topic)
    }

    fn may_subscribe(&self, client: &ClientRef<'_>, filter: &TopicFilter) -> FilterAccess {
        (**self).may_subscribe(client, filter)
    }

    fn may_receive(&self, client: &ClientRef<'_>, topic: &str) -> bool {
        (**self).may_receive(client, topic)
    }

    fn vouches(&self, client_id: &str, claimer: &NodeId, claim: &crate::link::Claim) -> bool {
        (**self).vouches(client_id, claimer, claim)
    }

    fn vouches_forget(&self, node: &NodeId, incarnation: u64, signature: Option<&[u8]>) -> bool {
        (**self).vouches_forget(node, incarnation, signature)
    }

    fn vouches_region(&self, node: &NodeId, region: &str, certificate: Option<&[u8]>) -> bool {
        (**self).vouches_region(node, region, certificate)
    }
}

impl Authorizer for Acl {
    fn may_publish(&self, client: &ClientRef<'_>, topic: &str) -> bool {
        Acl::may_publish(self, client, topic)
    }

    /// Shared subscriptions are judged on their filter without `$share/group/`.
    fn may_subscribe(&self, client: &ClientRef<'_>, filter: &TopicFilter) -> FilterAccess {
        self.filter_access(client, filter.pattern())
    }

    fn may_receive(&self, client: &ClientRef<'_>, topic: &str) -> bool {
        Acl::may_receive(self, client, topic)
    }
}

/// Lets everyone connect without credentials and do everything; refuses enhanced
/// authentication methods (it knows none). The default; suitable for loopback-only brokers.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllowAll;

impl Authenticator for AllowAll {
    fn authenticate(&mut self, request: &AuthRequest<'_>) -> AuthOutcome {
        if request.method.is_some() {
            AuthOutcome::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD)
        } else {
            AuthOutcome::Allow { username: None }
        }
    }
}

impl Authorizer for AllowAll {
    fn may_publish(&self, _: &ClientRef<'_>, _: &str) -> bool {
        true
    }

    fn may_subscribe(&self, _: &ClientRef<'_>, _: &TopicFilter) -> FilterAccess {
        FilterAccess::Allowed
    }

    fn may_receive(&self, _: &ClientRef<'_>, _: &str) -> bool {
        true
    }
}
