//! Authentication and authorization hooks the shell plugs in.

use bytes::Bytes;

use super::io::ConnId;
use crate::codec::ReasonCode;
use crate::topic::TopicFilter;

/// What an authenticator is asked, on CONNECT and on each AUTH step.
#[derive(Debug, Clone, Copy)]
pub struct AuthRequest<'a> {
    pub conn: ConnId,
    pub client_id: &'a str,
    pub username: Option<&'a str>,
    pub password: Option<&'a [u8]>,
    /// MQTT 5.0 enhanced authentication method, if the client named one.
    pub method: Option<&'a str>,
    /// Authentication data of this step (CONNECT or AUTH).
    pub data: Option<&'a [u8]>,
    /// Identity from a verified TLS client certificate.
    pub tls_identity: Option<&'a str>,
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
    Allow { username: Option<String> },
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
    fn authenticate(&mut self, request: &AuthRequest<'_>) -> AuthOutcome;
}

impl<T: Authenticator + ?Sized> Authenticator for Box<T> {
    fn authenticate(&mut self, request: &AuthRequest<'_>) -> AuthOutcome {
        (**self).authenticate(request)
    }
}

/// The identity that authorization rules are evaluated against.
#[derive(Debug, Clone, Copy)]
pub struct ClientRef<'a> {
    pub client_id: &'a str,
    pub username: Option<&'a str>,
}

/// Decides what a connected client may do.
pub trait Authorizer {
    fn may_publish(&self, client: &ClientRef<'_>, topic: &str) -> bool;
    fn may_subscribe(&self, client: &ClientRef<'_>, filter: &TopicFilter) -> bool;
}

impl<T: Authorizer + ?Sized> Authorizer for Box<T> {
    fn may_publish(&self, client: &ClientRef<'_>, topic: &str) -> bool {
        (**self).may_publish(client, topic)
    }

    fn may_subscribe(&self, client: &ClientRef<'_>, filter: &TopicFilter) -> bool {
        (**self).may_subscribe(client, filter)
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

    fn may_subscribe(&self, _: &ClientRef<'_>, _: &TopicFilter) -> bool {
        true
    }
}
