//! Authentication (password file, client certificates) and authorization (the core's rule
//! engine, [`meridian_core::acl`], with the rules of `[acl]`).
//!
//! Password hashes are verified off the broker task: the authenticator answers
//! [`AuthOutcome::Pending`], the verification waits in a [`VerifyLimits`] queue and runs on
//! the blocking pool, and the decision comes back as [`ToEngine::Conn(ConnEvent::AuthDecision)`]. The queue is
//! shared fairly between source addresses: each has a bounded number of checks waiting, and
//! the workers take one address's check after another's, so one host sending bogus logins
//! neither fills the queue nor delays a login from elsewhere by more than a turn.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use meridian_core::ConnId;
use meridian_core::acl::Acl;
use meridian_core::broker::{AuthOutcome, AuthRequest, Authenticator};
use meridian_core::codec::ReasonCode;
use tokio::sync::mpsc;

use crate::config::DaemonConfig;
use crate::mailbox::{ConnEvent, DaemonCounters, SendAuthenticator, SendAuthorizer, ToEngine};
use crate::passwd::{self, PasswordDb};

/// Argon2 verifications running at once (each takes ~19 MiB and tens of milliseconds).
pub const MAX_CONCURRENT_VERIFY: usize = 4;
/// Verifications waiting or running at once; beyond it CONNECT is refused with 0x89 Server
/// busy.
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
    /// Password checks one source address may have waiting or running.
    pending_per_address: usize,
    /// What one check may cost.
    hash_bounds: passwd::HashBounds,
    /// With operator keys: the users' claim keys, which claims are proven with and checked
    /// against ([`crate::policy::claim_key`]).
    claims: Option<ClaimKeys>,
    acl: Acl,
}

/// The users' claim keys (user → public half, hex) and this node's id, which proofs name;
/// and the operator keys, which sign the forgets of nodes.
#[derive(Debug, Clone)]
pub struct ClaimKeys {
    pub keys: Arc<std::collections::BTreeMap<String, String>>,
    pub node: String,
    pub operator: crate::policy::operator::OperatorKeys,
}

/// What the password check of a user with a claim key also does: prove the login for the
/// claim the core makes next ([`Authenticator::claim_proof`]).
struct ClaimJob {
    user: String,
    client_id: String,
    public: String,
    node: String,
    proofs: Proofs,
}

/// Proofs made by password checks, waiting for their connection's claim.
type Proofs = Arc<Mutex<HashMap<ConnId, (String, bytes::Bytes)>>>;
/// Proofs kept waiting at most (each is taken within the same turn of the broker task as
/// its login's decision; the bound only matters for connections that closed meanwhile).
const MAX_WAITING_PROOFS: usize = 4096;

/// The core's rule engine, and with operator keys the check of peers' claims.
struct PolicyAuthorizer {
    acl: Acl,
    claims: ClaimKeys,
}

impl meridian_core::broker::Authorizer for PolicyAuthorizer {
    fn may_publish(&self, client: &meridian_core::broker::ClientRef<'_>, topic: &str) -> bool {
        meridian_core::broker::Authorizer::may_publish(&self.acl, client, topic)
    }

    fn may_subscribe(
        &self,
        client: &meridian_core::broker::ClientRef<'_>,
        filter: &meridian_core::topic::TopicFilter,
    ) -> meridian_core::broker::FilterAccess {
        meridian_core::broker::Authorizer::may_subscribe(&self.acl, client, filter)
    }

    fn may_receive(&self, client: &meridian_core::broker::ClientRef<'_>, topic: &str) -> bool {
        meridian_core::broker::Authorizer::may_receive(&self.acl, client, topic)
    }

    /// With operator keys, a claim counts only with a proof made with its user's claim key
    /// for this client id and the claiming node.
    fn vouches(
        &self,
        client_id: &str,
        claimer: &meridian_core::routes::NodeId,
        claim: &meridian_core::link::Claim,
    ) -> bool {
        let (Some(user), Some(proof)) = (claim.user.as_deref(), claim.proof.as_deref()) else {
            return false;
        };
        self.claims.keys.get(user).is_some_and(|public| {
            crate::policy::claim_key::verify(public, client_id, user, claimer.as_str(), proof)
        })
    }

    /// With operator keys, an announced forget counts only with an operator's signature of
    /// that node and incarnation (`meridian ctl --operator-key ... peers forget`).
    fn vouches_forget(
        &self,
        node: &meridian_core::routes::NodeId,
        incarnation: u64,
        signature: Option<&[u8]>,
    ) -> bool {
        signature.is_some_and(|signature| {
            (self.claims.operator).verify_forget(node.as_str(), incarnation, signature)
        })
    }

    /// With operator keys, a node's region counts only with the operator's certificate of
    /// it (`meridian certify`, the node's `cluster.certificate`).
    fn vouches_region(
        &self,
        node: &meridian_core::routes::NodeId,
        region: &str,
        certificate: Option<&[u8]>,
    ) -> bool {
        certificate.is_some_and(|certificate| {
            (self.claims.operator).verify_region(node.as_str(), region, certificate)
        })
    }
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
        Self::new(config, users, config.acl.clone())
    }

    /// The users and access rules of the policy document, with the rest of `[auth]`. Without
    /// users, clients get in without logging in while every listener is on loopback; with a
    /// listener elsewhere, a start is refused (as without a password file), and a change that
    /// removes the last user lets nobody in but clients with a certificate.
    pub fn from_policy(
        config: &DaemonConfig,
        policy: &crate::policy::document::Policy,
        at_start: bool,
        node: Option<&str>,
    ) -> anyhow::Result<Self> {
        // With operator keys (so that the users' claim keys are the operator's word), claims
        // are proven and checked.
        let operator = crate::policy::operator::OperatorKeys::parse(&config.policy.operator_keys)?;
        let claims = node.filter(|_| !operator.is_empty()).map(|node| ClaimKeys {
            keys: Arc::new(policy.claim_keys.clone()),
            node: node.to_owned(),
            operator,
        });
        let mut setup = Self::from_policy_users(config, policy, at_start)?;
        setup.claims = claims;
        Ok(setup)
    }

    fn from_policy_users(
        config: &DaemonConfig,
        policy: &crate::policy::document::Policy,
        at_start: bool,
    ) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        if at_start && policy.users.is_empty() {
            return Self::new(config, None, policy.acl()).context(
                "the policy document holds no user: add one with `meridian ctl user add NAME` \
                 while the listeners are on 127.0.0.1 (or, before the first start, set \
                 auth.password_file, which seeds the document)",
            );
        }
        let all_loopback = config
            .listeners()
            .iter()
            .all(|(_, l)| !l.enabled || l.bind.ip().is_loopback());
        let users = (!policy.users.is_empty() || !all_loopback).then(|| {
            Arc::new(
                policy
                    .users
                    .iter()
                    .map(|(u, h)| (u.clone(), h.clone()))
                    .collect(),
            )
        });
        Self::new(config, users, policy.acl())
    }

    fn new(
        config: &DaemonConfig,
        users: Option<Arc<PasswordDb>>,
        acl: Acl,
    ) -> anyhow::Result<Self> {
        let mut all_loopback = true;
        for (name, l) in config.listeners() {
            if l.enabled && !l.bind.ip().is_loopback() {
                all_loopback = false;
                let certs_required = name.tls() && l.require_client_cert;
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
        let bounds = config.auth.hash_bounds();
        if let Some(users) = &users {
            let mut past: Vec<&str> = users
                .iter()
                .filter(|(_, h)| bounds.check(h).is_err())
                .map(|(u, _)| u.as_str())
                .collect();
            if !past.is_empty() {
                past.sort_unstable();
                tracing::warn!(
                    count = past.len(),
                    users = ?&past[..past.len().min(10)],
                    "password hashes that ask for more than auth.max_hash_memory_kib or \
                     auth.max_hash_passes, or are not Argon2: these users cannot log in"
                );
            }
        }
        // Any stored hash within the bounds will do (`known` stays false for unknown users):
        // same parameters, same cost.
        let dummy_hash: Arc<str> = users
            .as_ref()
            .and_then(|u| u.values().find(|h| bounds.check(h).is_ok()))
            .map_or_else(|| Arc::from(""), |h| Arc::from(h.as_str()));
        Ok(Self {
            users,
            dummy_hash,
            anonymous,
            pending_per_address: config.auth.max_pending_per_address,
            hash_bounds: config.auth.hash_bounds(),
            claims: None,
            acl,
        })
    }

    /// Whether clients without credentials are let in (a listener serving them is open to
    /// anyone who reaches it).
    pub fn anonymous(&self) -> bool {
        self.anonymous
    }

    /// What these hooks let in, for a log line.
    pub fn summary(&self) -> AuthSummary {
        AuthSummary {
            users: self.users.as_ref().map(|u| u.len()),
            anonymous: self.anonymous,
            acl_rules: self.acl.rules().len(),
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
        self.build_for(engine, limits, true)
    }

    /// [`build`](Self::build); with `new_users` false (the users are those of the hooks in
    /// place, only the rules changed), verifications still running stay valid.
    pub fn build_for(
        self,
        engine: mpsc::Sender<ToEngine>,
        limits: &VerifyLimits,
        new_users: bool,
    ) -> (SendAuthenticator, SendAuthorizer) {
        let generation = if new_users {
            limits.generation.fetch_add(1, Ordering::AcqRel) + 1
        } else {
            limits.generation.load(Ordering::Acquire)
        };
        let authn = PasswordAuth {
            users: self.users,
            dummy_hash: self.dummy_hash,
            anonymous: self.anonymous,
            pending_per_address: self.pending_per_address,
            hash_bounds: self.hash_bounds,
            claims: self.claims.clone(),
            proofs: Proofs::default(),
            engine,
            limits: limits.clone(),
            generation,
        };
        let authz: SendAuthorizer = match self.claims {
            Some(claims) => Box::new(PolicyAuthorizer {
                acl: self.acl,
                claims,
            }),
            None => Box::new(self.acl),
        };
        (Box::new(authn), authz)
    }
}

/// What bounds password verifications across reloads: the checks running and waiting, by
/// source, and which set of hooks is current. A verification that ends after its hooks were
/// replaced (a reload) does not let the client in, whatever the old password file said: it is
/// refused with 0x89 Server busy, and the client's next attempt meets the new file.
#[derive(Debug, Clone, Default)]
pub struct VerifyLimits {
    queue: Arc<Mutex<VerifyQueue>>,
    generation: Arc<AtomicU64>,
    /// Where refused logins are counted.
    counters: Arc<DaemonCounters>,
}

impl VerifyLimits {
    /// Limits that count refused logins in `counters`.
    pub fn new(counters: Arc<DaemonCounters>) -> Self {
        Self {
            counters,
            ..Self::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VerifyQueue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queue a check, unless the source's share of the queue is full; start a worker if one
    /// may start. A full queue makes room by turning away the newest check of the source that
    /// has the most waiting, if it has more than this one's would: so sources with many
    /// addresses between them cannot keep out one with few.
    fn submit(&self, job: Job, per_source: usize) -> Result<(), ReasonCode> {
        let source = job.source;
        let mut evicted = None;
        let start_worker = {
            let mut q = self.lock();
            if q.pending >= MAX_PENDING_VERIFY {
                let mine = q.by_source.get(&source).map_or(0, |s| s.pending);
                match q.evict_from_heaviest(mine + 1) {
                    Some(job) => evicted = Some(job),
                    None => {
                        self.counters.logins_busy.fetch_add(1, Ordering::Relaxed);
                        return Err(ReasonCode::SERVER_BUSY);
                    }
                }
            }
            let waiting = q.by_source.entry(source).or_default();
            if waiting.pending >= per_source {
                self.counters
                    .logins_busy_address
                    .fetch_add(1, Ordering::Relaxed);
                return Err(ReasonCode::SERVER_BUSY);
            }
            waiting.pending += 1;
            waiting.jobs.push_back(job);
            if waiting.jobs.len() == 1 {
                q.turns.push_back(source);
            }
            q.pending += 1;
            let start = q.workers < MAX_CONCURRENT_VERIFY;
            q.workers += usize::from(start);
            start
        };
        if start_worker {
            let limits = self.clone();
            tokio::task::spawn_blocking(move || limits.work());
        }
        if let Some(job) = evicted {
            self.counters.logins_busy.fetch_add(1, Ordering::Relaxed);
            // Asked from within the broker task: the answer goes through its queue.
            let decision = ToEngine::Conn(ConnEvent::AuthDecision {
                conn: job.conn,
                outcome: AuthOutcome::Deny(ReasonCode::SERVER_BUSY),
            });
            tokio::spawn(async move {
                let _ = job.engine.send(decision).await;
            });
        }
        Ok(())
    }

    /// A worker: take the next source's oldest check, run it, answer; until none waits.
    fn work(&self) {
        loop {
            let job = {
                let mut q = self.lock();
                match q.next_job() {
                    Some(job) => job,
                    None => {
                        q.workers -= 1;
                        return;
                    }
                }
            };
            let ok = passwd::verify(&job.password, &job.hash, &job.bounds) && job.known;
            if ok && let Some(claim) = &job.claim {
                prove_login(&job, claim);
            }
            self.counters
                .password_checks
                .fetch_add(1, Ordering::Relaxed);
            let current = self.generation.load(Ordering::Acquire) == job.generation;
            let outcome = match (ok, current) {
                (true, true) => AuthOutcome::Allow { username: None },
                // Checked against a password file that has been replaced since.
                (true, false) => AuthOutcome::Deny(ReasonCode::SERVER_BUSY),
                (false, _) => AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD),
            };
            {
                let mut q = self.lock();
                q.pending -= 1;
                q.finished(job.source);
            }
            // The blocking pool is outside the runtime's workers: waiting for room is fine.
            let _ = job
                .engine
                .blocking_send(ToEngine::Conn(ConnEvent::AuthDecision {
                    conn: job.conn,
                    outcome,
                }));
        }
    }
}

/// Make the proof of a login for the claim that follows it: the user's claim key, derived
/// from the password just checked, signs the client id, the user and this node. None if the
/// password derives another key than the user's entry holds.
fn prove_login(job: &Job, claim: &ClaimJob) {
    let Ok(key) = crate::policy::claim_key::derive(&job.password, &claim.user) else {
        return;
    };
    if crate::policy::claim_key::public_hex(&key) != claim.public {
        tracing::warn!(
            user = %claim.user,
            "the password derives another claim key than the user's entry holds: its \
             claims are not proven (set the password again with `meridian ctl \
             --operator-key FILE user passwd`)"
        );
        return;
    }
    let proof = crate::policy::claim_key::prove(&key, &claim.client_id, &claim.user, &claim.node);
    let mut proofs = claim.proofs.lock().unwrap_or_else(PoisonError::into_inner);
    if proofs.len() >= MAX_WAITING_PROOFS {
        proofs.clear();
    }
    proofs.insert(job.conn, (claim.client_id.clone(), proof.into()));
}

/// Where a login comes from, for sharing the queue: the IPv4 address, or the IPv6 /64 (one
/// host's usual allocation). Connections without an address (in-process) share one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Source(Option<IpAddr>);

impl Source {
    fn of(remote_addr: Option<&str>) -> Self {
        let ip = remote_addr
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .map(|a| match a.ip() {
                IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                    Some(v4) => IpAddr::V4(v4),
                    None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
                },
                v4 => v4,
            });
        Self(ip)
    }
}

/// Password checks waiting, by source, taken in turn.
#[derive(Debug, Default)]
struct VerifyQueue {
    by_source: HashMap<Source, SourceQueue>,
    /// Sources with checks waiting, in the order they get their next turn.
    turns: VecDeque<Source>,
    /// Checks waiting or running.
    pending: usize,
    workers: usize,
}

#[derive(Debug, Default)]
struct SourceQueue {
    jobs: VecDeque<Job>,
    /// Waiting or running.
    pending: usize,
}

impl VerifyQueue {
    fn next_job(&mut self) -> Option<Job> {
        let source = self.turns.pop_front()?;
        let queue = self.by_source.get_mut(&source)?;
        let job = queue.jobs.pop_front()?;
        if !queue.jobs.is_empty() {
            self.turns.push_back(source);
        }
        Some(job)
    }

    /// Take the newest waiting check of the source with the most checks pending, if that is at
    /// least `more_than` (its count going down by one then leaves it no fewer than the source
    /// that makes room).
    fn evict_from_heaviest(&mut self, more_than: usize) -> Option<Job> {
        let (&source, _) = self
            .by_source
            .iter()
            .filter(|(_, s)| !s.jobs.is_empty())
            .max_by_key(|(_, s)| s.pending)
            .filter(|(_, s)| s.pending > more_than)?;
        let queue = self.by_source.get_mut(&source)?;
        let job = queue.jobs.pop_back()?;
        if queue.jobs.is_empty() {
            self.turns.retain(|s| *s != source);
        }
        self.pending -= 1;
        self.finished(source);
        Some(job)
    }

    fn finished(&mut self, source: Source) {
        if let Some(queue) = self.by_source.get_mut(&source) {
            queue.pending -= 1;
            if queue.pending == 0 {
                self.by_source.remove(&source);
            }
        }
    }
}

/// One password check.
struct Job {
    source: Source,
    conn: ConnId,
    password: Vec<u8>,
    hash: String,
    known: bool,
    bounds: passwd::HashBounds,
    /// The login's proof to make, for a user with a claim key (operator keys).
    claim: Option<ClaimJob>,
    generation: u64,
    engine: mpsc::Sender<ToEngine>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("source", &self.source)
            .field("conn", &self.conn)
            .finish_non_exhaustive()
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
    pending_per_address: usize,
    hash_bounds: passwd::HashBounds,
    claims: Option<ClaimKeys>,
    proofs: Proofs,
    engine: mpsc::Sender<ToEngine>,
    limits: VerifyLimits,
    /// The value of `limits.generation` while these hooks are current.
    generation: u64,
}

impl Authenticator for PasswordAuth {
    fn claim_proof(&mut self, conn: ConnId, client_id: &str) -> Option<bytes::Bytes> {
        let mut proofs = self.proofs.lock().unwrap_or_else(PoisonError::into_inner);
        let (proven, proof) = proofs.remove(&conn)?;
        (proven == client_id).then_some(proof)
    }

    fn authenticate(&mut self, request: &AuthRequest<'_>) -> AuthOutcome {
        if request.method.is_some() {
            return AuthOutcome::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD);
        }
        // A verified client certificate logs the client in as its name. A client that names
        // another user must give that user's password, which needs a password file.
        if let Some(identity) = request.tls_identity {
            if request.username.is_none_or(|u| u == identity) {
                return AuthOutcome::Allow {
                    username: Some(identity.to_owned()),
                };
            }
            if self.users.is_none() {
                self.limits
                    .counters
                    .logins_certificate_mismatch
                    .fetch_add(1, Ordering::Relaxed);
                return AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
            }
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
        let (hash, known) = match users.get(username) {
            Some(h) => (h.clone(), true),
            None => (self.dummy_hash.to_string(), false),
        };
        let job = Job {
            source: Source::of(request.remote_addr),
            conn: request.conn,
            password: password.to_vec(),
            hash,
            known,
            bounds: self.hash_bounds,
            claim: self.claims.as_ref().and_then(|c| {
                Some(ClaimJob {
                    user: username.to_owned(),
                    client_id: request.client_id.to_owned(),
                    public: c.keys.get(username)?.clone(),
                    node: c.node.clone(),
                    proofs: self.proofs.clone(),
                })
            }),
            generation: self.generation,
            engine: self.engine.clone(),
        };
        match self.limits.submit(job, self.pending_per_address) {
            Ok(()) => AuthOutcome::Pending,
            Err(reason) => AuthOutcome::Deny(reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Some(ToEngine::Conn(ConnEvent::AuthDecision { outcome, .. })) => outcome,
            other => panic!("expected a decision, got {other:?}"),
        }
    }

    fn setup(hash: &str) -> AuthSetup {
        AuthSetup {
            users: Some(Arc::new([("alice".to_owned(), hash.to_owned())].into())),
            dummy_hash: Arc::from(hash),
            anonymous: false,
            pending_per_address: 2,
            hash_bounds: passwd::HashBounds::default(),
            claims: None,
            acl: Acl::default(),
        }
    }

    fn request<'a>(remote_addr: &'a str, password: &'a [u8]) -> AuthRequest<'a> {
        AuthRequest {
            conn: ConnId(1),
            client_id: "c",
            username: Some("alice"),
            password: Some(password),
            method: None,
            data: None,
            tls_identity: None,
            remote_addr: Some(remote_addr),
            continuation: false,
            reauthentication: false,
        }
    }

    /// Keep workers from starting, as if every one were busy; give one back with `release`.
    fn hold_workers(limits: &VerifyLimits) {
        limits.lock().workers = MAX_CONCURRENT_VERIFY;
    }

    fn release_worker(limits: &VerifyLimits) {
        limits.lock().workers -= 1;
        let limits = limits.clone();
        tokio::task::spawn_blocking(move || limits.work());
    }

    #[tokio::test]
    async fn a_verification_that_ends_after_a_reload_does_not_let_the_client_in() {
        let setup = setup(&cheap_hash("old"));
        let request = request("10.0.0.1:5000", b"old");
        let limits = VerifyLimits::default();
        let (tx, mut rx) = mpsc::channel(4);
        // Every worker busy: the check waits until after the reload.
        hold_workers(&limits);
        let (mut old, _) = setup.clone().build(tx.clone(), &limits);
        assert!(matches!(old.authenticate(&request), AuthOutcome::Pending));
        let (mut new, _) = setup.build(tx, &limits);
        release_worker(&limits);
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
        let q = limits.lock();
        assert_eq!((q.pending, q.by_source.len()), (0, 0));
    }

    #[tokio::test]
    async fn one_address_gets_its_share_of_the_queue_and_no_more() {
        let limits = VerifyLimits::default();
        let (tx, mut rx) = mpsc::channel(16);
        hold_workers(&limits);
        let (mut hooks, _) = setup(&cheap_hash("pw")).build(tx, &limits);
        let flood = request("192.0.2.7:1000", b"wrong");
        assert!(matches!(hooks.authenticate(&flood), AuthOutcome::Pending));
        assert!(matches!(hooks.authenticate(&flood), AuthOutcome::Pending));
        assert_eq!(
            hooks.authenticate(&flood),
            AuthOutcome::Deny(ReasonCode::SERVER_BUSY)
        );
        // Another port of the same host is the same source; another host is not.
        assert_eq!(
            hooks.authenticate(&request("192.0.2.7:2000", b"wrong")),
            AuthOutcome::Deny(ReasonCode::SERVER_BUSY)
        );
        let mut good = request("198.51.100.1:1000", b"pw");
        good.conn = ConnId(2);
        assert!(matches!(hooks.authenticate(&good), AuthOutcome::Pending));
        assert_eq!(
            limits.counters.logins_busy_address.load(Ordering::Relaxed),
            2
        );
        // One worker: the good login is checked second, not after the whole flood.
        release_worker(&limits);
        let mut order = Vec::new();
        for _ in 0..3 {
            match rx.recv().await {
                Some(ToEngine::Conn(ConnEvent::AuthDecision { conn, .. })) => order.push(conn.0),
                other => panic!("expected a decision, got {other:?}"),
            }
        }
        assert_eq!(order, [1, 2, 1]);
    }

    /// Many addresses of one network fill the whole queue; a login from elsewhere still gets
    /// in, in place of the newest check of the address with the most waiting.
    #[tokio::test]
    async fn a_full_queue_makes_room_for_a_source_with_less_in_it() {
        let limits = VerifyLimits::default();
        let (tx, mut rx) = mpsc::channel(16);
        hold_workers(&limits);
        let mut setup = setup(&cheap_hash("pw"));
        setup.pending_per_address = 16;
        let (mut hooks, _) = setup.build(tx, &limits);
        let mut conn = 0;
        let mut login = |hooks: &mut SendAuthenticator, addr: String| {
            conn += 1;
            let mut r = request(&addr, b"wrong");
            r.conn = ConnId(conn);
            hooks.authenticate(&r)
        };
        // 1,024 checks from 64 IPv6 /64 networks, 16 each, fill the queue.
        for net in 0..64u32 {
            for _ in 0..16 {
                let addr = format!("[2001:db8:0:{net:x}::1]:1000");
                assert!(matches!(login(&mut hooks, addr), AuthOutcome::Pending));
            }
        }
        assert_eq!(limits.lock().pending, MAX_PENDING_VERIFY);
        let good = login(&mut hooks, "198.51.100.1:1".to_owned());
        assert!(matches!(good, AuthOutcome::Pending), "{good:?}");
        assert_eq!(limits.lock().pending, MAX_PENDING_VERIFY);
        // The check turned away is told so.
        match tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv()).await {
            Ok(Some(ToEngine::Conn(ConnEvent::AuthDecision { outcome, .. }))) => {
                assert_eq!(outcome, AuthOutcome::Deny(ReasonCode::SERVER_BUSY));
            }
            other => panic!("expected a decision, got {other:?}"),
        }
        // Another check from a network that has its share finds no room.
        let more = login(&mut hooks, "[2001:db8:0:1::2]:1".to_owned());
        assert_eq!(more, AuthOutcome::Deny(ReasonCode::SERVER_BUSY));
    }

    #[test]
    fn sources_are_addresses_and_ipv6_prefixes() {
        let s = |a| Source::of(Some(a));
        assert_eq!(s("10.0.0.1:1"), s("10.0.0.1:2"));
        assert_ne!(s("10.0.0.1:1"), s("10.0.0.2:1"));
        assert_eq!(s("[2001:db8:1:2::5]:1"), s("[2001:db8:1:2:ffff::9]:1"));
        assert_ne!(s("[2001:db8:1:2::5]:1"), s("[2001:db8:1:3::5]:1"));
        assert_eq!(s("[::ffff:10.0.0.1]:1"), s("10.0.0.1:9"));
        assert_eq!(Source::of(None), Source::of(Some("not an address")));
    }

    #[test]
    fn a_certificate_does_not_lend_its_holder_another_name() {
        let (tx, _rx) = mpsc::channel(1);
        let limits = VerifyLimits::default();
        let mut open = setup("");
        open.users = None;
        open.anonymous = true;
        let (mut hooks, _) = open.build(tx, &limits);
        let mut r = request("10.0.0.1:1", b"");
        r.tls_identity = Some("device-7");
        r.username = Some("admin");
        r.password = None;
        assert_eq!(
            hooks.authenticate(&r),
            AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD)
        );
        assert_eq!(
            limits
                .counters
                .logins_certificate_mismatch
                .load(Ordering::Relaxed),
            1
        );
        r.username = Some("device-7");
        assert_eq!(
            hooks.authenticate(&r),
            AuthOutcome::Allow {
                username: Some("device-7".into())
            }
        );
        r.username = None;
        assert_eq!(
            hooks.authenticate(&r),
            AuthOutcome::Allow {
                username: Some("device-7".into())
            }
        );
    }
}
