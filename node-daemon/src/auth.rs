//! Authentication (password file) and authorization (ACL rules) for the broker.
//!
//! Password hashes are verified off the broker task: the authenticator answers
//! [`AuthOutcome::Pending`], a blocking task runs Argon2 (at most [`MAX_CONCURRENT_VERIFY`] at
//! once), and the decision comes back as [`ToEngine::AuthDecision`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use meridian_core::broker::{AuthOutcome, AuthRequest, Authenticator, Authorizer, ClientRef};
use meridian_core::codec::ReasonCode;
use meridian_core::topic::{self, TopicFilter};
use tokio::sync::{Semaphore, mpsc};

use crate::config::{AclAction, AclRule, DaemonConfig, Permission};
use crate::engine::{SendAuthenticator, SendAuthorizer, ToEngine};
use crate::passwd::{self, PasswordDb};

/// Argon2 verifications running at once (each takes ~19 MiB and tens of milliseconds).
pub const MAX_CONCURRENT_VERIFY: usize = 4;
/// Verifications waiting at once; beyond it CONNECT is refused with 0x89 Server busy.
pub const MAX_PENDING_VERIFY: usize = 1024;

/// Everything needed to build the broker's authenticator and authorizer once the broker task's
/// channel exists (the authenticator sends late decisions into it).
#[derive(Debug, Clone)]
pub struct AuthSetup {
    users: Option<Arc<PasswordDb>>,
    /// A valid hash checked for unknown users, so that "no such user" costs as much as a
    /// wrong password.
    dummy_hash: Arc<str>,
    anonymous: bool,
    acl: Acl,
}

impl AuthSetup {
    /// Check the configuration and load the password file. Anonymous access needs every
    /// listener on loopback; a non-loopback listener without a password file is refused.
    pub fn from_config(config: &DaemonConfig) -> anyhow::Result<Self> {
        let users = if config.auth.password_file.is_empty() {
            None
        } else {
            Some(Arc::new(passwd::load(std::path::Path::new(
                &config.auth.password_file,
            ))?))
        };
        let mut all_loopback = true;
        for (name, l) in config.listeners() {
            if l.enabled && !l.bind.ip().is_loopback() {
                all_loopback = false;
                let certs_required = matches!(name, "tls" | "wss") && l.require_client_cert;
                if users.is_none() && !certs_required {
                    anyhow::bail!(
                        "listeners.{name} binds {} (not loopback) but no authentication is \
                         configured: set auth.password_file (create it with `meridian passwd \
                         FILE USER`), or require client certificates on a TLS listener \
                         (require_client_cert, client_ca), or bind the listener to 127.0.0.1",
                        l.bind
                    );
                }
            }
        }
        let anonymous = users.is_none() || (config.auth.allow_anonymous && all_loopback);
        if users.is_some() && config.auth.allow_anonymous && !all_loopback {
            tracing::warn!(
                "auth.allow_anonymous ignored: a listener is not on loopback, clients must log in"
            );
        }
        // Any stored hash will do (`known` stays false for unknown users): same parameters,
        // same cost.
        let dummy_hash: Arc<str> = users
            .as_ref()
            .and_then(|u| u.values().next())
            .map_or_else(|| Arc::from(""), |h| Arc::from(h.as_str()));
        Ok(Self {
            users,
            dummy_hash,
            anonymous,
            acl: Acl {
                default: config.acl.default,
                rules: config.acl.rules.clone(),
            },
        })
    }

    /// What these hooks let in, for a log line.
    pub fn summary(&self) -> AuthSummary {
        AuthSummary {
            users: self.users.as_ref().map(|u| u.len()),
            anonymous: self.anonymous,
            acl_rules: self.acl.rules.len(),
        }
    }

    /// Build the broker's hooks. Password verifications run on the blocking pool of the
    /// runtime the broker task runs on, within `limits`, which every set of hooks of one
    /// broker shares. Hooks built later make these stale ([`VerifyLimits`]).
    pub fn build(
        self,
        engine: mpsc::Sender<ToEngine>,
        limits: &VerifyLimits,
    ) -> (SendAuthenticator, SendAuthorizer) {
        let generation = limits.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let authn = PasswordAuth {
            users: self.users,
            dummy_hash: self.dummy_hash,
            anonymous: self.anonymous,
            engine,
            limits: limits.clone(),
            generation,
        };
        (Box::new(authn), Box::new(self.acl))
    }
}

/// What bounds password verifications across reloads: the verifications running and waiting,
/// and which set of hooks is current. A verification that ends after its hooks were replaced
/// (a reload) does not let the client in, whatever the old password file said: it is refused
/// with 0x89 Server busy, and the client's next attempt meets the new file.
#[derive(Debug, Clone)]
pub struct VerifyLimits {
    permits: Arc<Semaphore>,
    pending: Arc<AtomicUsize>,
    generation: Arc<AtomicU64>,
}

impl Default for VerifyLimits {
    fn default() -> Self {
        Self {
            permits: Arc::new(Semaphore::new(MAX_CONCURRENT_VERIFY)),
            pending: Arc::new(AtomicUsize::new(0)),
            generation: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// What a set of hooks lets in: see [`AuthSetup::summary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthSummary {
    /// Users in the password file; `None` without one.
    pub users: Option<usize>,
    /// Clients without a username are let in.
    pub anonymous: bool,
    pub acl_rules: usize,
}

struct PasswordAuth {
    users: Option<Arc<PasswordDb>>,
    dummy_hash: Arc<str>,
    anonymous: bool,
    engine: mpsc::Sender<ToEngine>,
    limits: VerifyLimits,
    /// The value of `limits.generation` while these hooks are current.
    generation: u64,
}

impl Authenticator for PasswordAuth {
    fn authenticate(&mut self, request: &AuthRequest<'_>) -> AuthOutcome {
        if request.method.is_some() {
            return AuthOutcome::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD);
        }
        // A verified client certificate logs the client in as its Common Name (unless the
        // client names another user, who must then give that user's password).
        if let Some(identity) = request.tls_identity
            && request.username.is_none_or(|u| u == identity)
        {
            return AuthOutcome::Allow {
                username: Some(identity.to_owned()),
            };
        }
        let Some(users) = &self.users else {
            return AuthOutcome::Allow { username: None };
        };
        let Some(username) = request.username else {
            return if self.anonymous {
                AuthOutcome::Allow { username: None }
            } else {
                AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED)
            };
        };
        let Some(password) = request.password else {
            return AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
        };
        if self.limits.pending.load(Ordering::Relaxed) >= MAX_PENDING_VERIFY {
            return AuthOutcome::Deny(ReasonCode::SERVER_BUSY);
        }
        let (hash, known) = match users.get(username) {
            Some(h) => (h.clone(), true),
            None => (self.dummy_hash.to_string(), false),
        };
        let password = password.to_vec();
        let conn = request.conn;
        let engine = self.engine.clone();
        let limits = self.limits.clone();
        let generation = self.generation;
        limits.pending.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let ok = match limits.permits.clone().acquire_owned().await {
                Ok(_permit) => {
                    tokio::task::spawn_blocking(move || passwd::verify(&password, &hash) && known)
                        .await
                        .unwrap_or(false)
                }
                Err(_) => false,
            };
            limits.pending.fetch_sub(1, Ordering::Relaxed);
            let current = limits.generation.load(Ordering::Acquire) == generation;
            let outcome = match (ok, current) {
                (true, true) => AuthOutcome::Allow { username: None },
                // Checked against a password file that has been replaced since.
                (true, false) => AuthOutcome::Deny(ReasonCode::SERVER_BUSY),
                (false, _) => AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD),
            };
            let _ = engine.send(ToEngine::AuthDecision { conn, outcome }).await;
        });
        AuthOutcome::Pending
    }
}

/// ACL rules from the config: the first rule that applies decides, else `default`.
#[derive(Debug, Clone)]
pub struct Acl {
    pub default: Permission,
    pub rules: Vec<AclRule>,
}

impl Acl {
    fn decide(&self, client: &ClientRef<'_>, action: AclAction, target: &str) -> bool {
        for rule in &self.rules {
            if rule.action != AclAction::All && rule.action != action {
                continue;
            }
            if rule
                .user
                .as_deref()
                .is_some_and(|u| Some(u) != client.username)
            {
                continue;
            }
            if rule
                .client_id
                .as_deref()
                .is_some_and(|c| c != client.client_id)
            {
                continue;
            }
            let Some(filter) = substitute(&rule.topic, client) else {
                continue;
            };
            let applies = match (action, rule.permission) {
                (AclAction::Subscribe, Permission::Allow) => covers(&filter, target),
                // A deny rule catches any subscription that could receive a denied topic.
                (AclAction::Subscribe, Permission::Deny) => overlaps(&filter, target),
                _ => topic::matches(&filter, target),
            };
            if applies {
                return rule.permission == Permission::Allow;
            }
        }
        self.default == Permission::Allow
    }
}

impl Authorizer for Acl {
    fn may_publish(&self, client: &ClientRef<'_>, topic: &str) -> bool {
        self.decide(client, AclAction::Publish, topic)
    }

    fn may_subscribe(&self, client: &ClientRef<'_>, filter: &TopicFilter) -> bool {
        self.decide(client, AclAction::Subscribe, filter.pattern())
    }
}

/// `%u` and `%c` replaced by the username and client id. `None` (the rule does not apply) when
/// a needed value is missing or contains characters that would change the filter's shape.
fn substitute(template: &str, client: &ClientRef<'_>) -> Option<String> {
    let unsafe_part = |s: &str| s.is_empty() || s.contains(['/', '+', '#']);
    let mut out = template.to_owned();
    if out.contains("%u") {
        let u = client.username?;
        if unsafe_part(u) {
            return None;
        }
        out = out.replace("%u", u);
    }
    if out.contains("%c") {
        if unsafe_part(client.client_id) {
            return None;
        }
        out = out.replace("%c", client.client_id);
    }
    Some(out)
}

/// Whether every topic `inner` matches is also matched by `outer`.
fn covers(outer: &str, inner: &str) -> bool {
    let mut o = outer.split('/');
    let mut i = inner.split('/');
    loop {
        match (o.next(), i.next()) {
            (Some("#"), _) => return true,
            (Some(_), Some("#")) => return false,
            (Some("+"), Some(_)) => {}
            (Some(_), Some("+")) => return false,
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// Whether some topic is matched by both filters.
fn overlaps(a: &str, b: &str) -> bool {
    let mut x = a.split('/');
    let mut y = b.split('/');
    loop {
        match (x.next(), y.next()) {
            (Some("#"), _) | (_, Some("#")) => return true,
            (Some("+"), Some(_)) | (Some(_), Some("+")) => {}
            (Some(p), Some(q)) if p == q => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(permission: Permission, action: AclAction, topic: &str) -> AclRule {
        AclRule {
            permission,
            action,
            topic: topic.to_owned(),
            user: None,
            client_id: None,
        }
    }

    #[test]
    fn cover_and_overlap() {
        assert!(covers("a/#", "a/b/c"));
        assert!(covers("a/+", "a/b"));
        assert!(covers("a/+", "a/+"));
        assert!(!covers("a/+", "a/#"));
        assert!(!covers("a/b", "a/+"));
        assert!(covers("#", "x/#"));
        assert!(overlaps("secret/#", "#"));
        assert!(overlaps("a/+/c", "a/b/+"));
        assert!(!overlaps("a/b", "a/c"));
        assert!(!overlaps("a/b", "a/b/c"));
    }

    #[test]
    fn first_match_wins_with_substitution() {
        let acl = Acl {
            default: Permission::Deny,
            rules: vec![
                rule(Permission::Deny, AclAction::Subscribe, "secret/#"),
                rule(Permission::Allow, AclAction::All, "users/%u/#"),
                rule(Permission::Allow, AclAction::Subscribe, "#"),
                rule(Permission::Allow, AclAction::Publish, "clients/%c"),
            ],
        };
        let alice = ClientRef {
            client_id: "c1",
            username: Some("alice"),
        };
        let anon = ClientRef {
            client_id: "c2",
            username: None,
        };
        assert!(acl.may_publish(&alice, "users/alice/x"));
        assert!(!acl.may_publish(&alice, "users/bob/x"));
        assert!(!acl.may_publish(&anon, "users/x"));
        assert!(acl.may_publish(&anon, "clients/c2"));
        assert!(!acl.may_publish(&anon, "clients/c1"));
        let f = |s: &str| TopicFilter::new(s).unwrap();
        assert!(acl.may_subscribe(&alice, &f("news/#")));
        assert!(
            !acl.may_subscribe(&alice, &f("#")),
            "overlaps a denied filter"
        );
        assert!(!acl.may_subscribe(&alice, &f("secret/x")));
    }

    #[test]
    fn substitution_refuses_wildcards_in_names() {
        let evil = ClientRef {
            client_id: "#",
            username: Some("a/b"),
        };
        assert_eq!(substitute("users/%u", &evil), None);
        assert_eq!(substitute("c/%c", &evil), None);
        assert_eq!(substitute("plain", &evil).as_deref(), Some("plain"));
    }

    fn cheap_hash(password: &str) -> String {
        use argon2::password_hash::PasswordHasher;
        let params = argon2::Params::new(64, 1, 1, None).unwrap();
        argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
            .hash_password(password.as_bytes())
            .unwrap()
            .to_string()
    }

    async fn decision(rx: &mut mpsc::Receiver<ToEngine>) -> AuthOutcome {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv());
        match next.await.expect("a decision in time") {
            Some(ToEngine::AuthDecision { outcome, .. }) => outcome,
            other => panic!("expected a decision, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_verification_that_ends_after_a_reload_does_not_let_the_client_in() {
        let hash = cheap_hash("old");
        let setup = AuthSetup {
            users: Some(Arc::new([("alice".to_owned(), hash.clone())].into())),
            dummy_hash: Arc::from(hash.as_str()),
            anonymous: false,
            acl: Acl {
                default: Permission::Allow,
                rules: Vec::new(),
            },
        };
        let request = AuthRequest {
            conn: meridian_core::ConnId(1),
            client_id: "c",
            username: Some("alice"),
            password: Some(b"old"),
            method: None,
            data: None,
            tls_identity: None,
            remote_addr: None,
            continuation: false,
            reauthentication: false,
        };
        let limits = VerifyLimits::default();
        let (tx, mut rx) = mpsc::channel(4);
        // Every verification slot taken: the check waits until after the reload.
        let slots = u32::try_from(MAX_CONCURRENT_VERIFY).unwrap();
        let held = limits
            .permits
            .clone()
            .acquire_many_owned(slots)
            .await
            .unwrap();
        let (mut old, _) = setup.clone().build(tx.clone(), &limits);
        assert!(matches!(old.authenticate(&request), AuthOutcome::Pending));
        let (mut new, _) = setup.build(tx, &limits);
        drop(held);
        assert_eq!(
            decision(&mut rx).await,
            AuthOutcome::Deny(ReasonCode::SERVER_BUSY)
        );
        // The same login through the hooks now in place.
        assert!(matches!(new.authenticate(&request), AuthOutcome::Pending));
        assert_eq!(
            decision(&mut rx).await,
            AuthOutcome::Allow { username: None }
        );
        assert_eq!(limits.pending.load(Ordering::Relaxed), 0);
    }
}
