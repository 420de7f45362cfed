//! The broker follows the cluster policy document: its users, access rules and residency
//! rules are put in force as they change, and what is in force is told to the admin API
//! ([`PolicyInForce`], `/api/node`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};

use crate::auth;
use crate::config::DaemonConfig;
use crate::mailbox::{PolicyChange, PolicyInForce, ToEngine};
use crate::policy::Snapshot;
use crate::policy::document::Policy;

/// Make the broker task use the hooks of `setup`; returns once it does.
pub(super) async fn set_hooks(
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

/// What follows the policy document, and where it says what is in force.
pub(super) struct Follower {
    pub config: DaemonConfig,
    pub tx: mpsc::Sender<ToEngine>,
    pub limits: auth::VerifyLimits,
    pub in_force: Arc<PolicyInForce>,
    /// This node's id (cluster mode), which its claims' proofs name.
    pub node: Option<String>,
}

impl Follower {
    /// Follow the policy document from `started`, what the broker started with: each change
    /// of its users or access rules replaces the broker's hooks, so the next login and the
    /// next operation follow it (connected clients stay connected), and each change of its
    /// residency rules is put in force at once. Ends with the policy task or the broker task.
    pub async fn run(self, mut rx: watch::Receiver<Snapshot>, started: Arc<Policy>) {
        let auth_part = |p: &Policy| {
            (
                p.users.clone(),
                p.claim_keys.clone(),
                p.acl_default,
                p.acl.clone(),
            )
        };
        let residency_part = |p: &Policy| (p.residency.clone(), p.node_regions());
        // What the broker started with; a change made since is applied at once.
        let mut applied = auth_part(&started);
        let mut residency = residency_part(&started);
        let in_force = &self.in_force;
        in_force
            .users
            .store(started.users.len() as u64, Ordering::Relaxed);
        in_force
            .acl_rules
            .store(started.acl.len() as u64, Ordering::Relaxed);
        in_force
            .residency_rules
            .store(started.residency.len() as u64, Ordering::Relaxed);
        loop {
            let policy = rx.borrow_and_update().policy.clone();
            let now = residency_part(&policy);
            if now != residency {
                residency = now;
                let (reply, done) = oneshot::channel();
                let set = ToEngine::Policy(PolicyChange::Residency {
                    rules: policy.residency(),
                    node_regions: residency.1.clone(),
                    reply,
                });
                if self.tx.send(set).await.is_err() || done.await.is_err() {
                    return;
                }
                self.in_force
                    .residency_rules
                    .store(residency.0.len() as u64, Ordering::Relaxed);
                self.in_force.changes.fetch_add(1, Ordering::Relaxed);
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
                if !self.apply_auth(&policy, new_users).await {
                    return;
                }
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Make the broker use the users and rules of `policy`. False once the broker task is
    /// gone.
    async fn apply_auth(&self, policy: &Policy, new_users: bool) -> bool {
        match auth::AuthSetup::from_policy(&self.config, policy, false, self.node.as_deref()) {
            Ok(setup) => {
                let summary = setup.summary();
                if set_hooks(&self.tx, setup, &self.limits, new_users)
                    .await
                    .is_err()
                {
                    return false;
                }
                self.in_force
                    .users
                    .store(policy.users.len() as u64, Ordering::Relaxed);
                self.in_force
                    .acl_rules
                    .store(policy.acl.len() as u64, Ordering::Relaxed);
                self.in_force.changes.fetch_add(1, Ordering::Relaxed);
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
}
