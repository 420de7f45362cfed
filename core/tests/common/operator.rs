//! Hooks of a deployment with operator keys, as the daemon's: what the operator's signatures
//! would prove is stood for by fixed bytes, so that a test can give or withhold them.

use bytes::Bytes;
use meridian_core::broker::{
    AuthOutcome, AuthRequest, Authenticator, Authorizer, ClientRef, FilterAccess,
};
use meridian_core::link::Claim;
use meridian_core::routes::NodeId;
use meridian_core::topic::TopicFilter;
use meridian_core::{ConnId, Timestamp};

use super::mesh::Mesh;

/// What proves that a client logged in as alice at the claiming node.
pub const ALICE_PROOF: &[u8] = b"alice logged in";
/// The operator's signature of a forget.
pub const FORGET_SIGNATURE: &[u8] = b"operator";

/// The operator's certificate of a node in `region`.
pub fn region_certificate(region: &str) -> Bytes {
    Bytes::from(format!("cert:{region}"))
}

/// Lets every client in; with `true`, proves its claims (a node that checked alice's
/// password), with `false` not (a node that let "alice" in on its own word).
pub struct Proving(pub bool);

impl Authenticator for Proving {
    fn authenticate(&mut self, _: &AuthRequest<'_>) -> AuthOutcome {
        AuthOutcome::Allow { username: None }
    }

    fn claim_proof(&mut self, _: ConnId, _: &str) -> Option<Bytes> {
        self.0.then(|| Bytes::from_static(ALICE_PROOF))
    }
}

/// Allows every topic; takes alice's claims only with her proof, a forget only with the
/// operator's signature, and a node's region only with the operator's certificate of it.
pub struct OperatorRules;

impl Authorizer for OperatorRules {
    fn may_publish(&self, _: &ClientRef<'_>, _: &str) -> bool {
        true
    }
    fn may_subscribe(&self, _: &ClientRef<'_>, _: &TopicFilter) -> FilterAccess {
        FilterAccess::Allowed
    }
    fn may_receive(&self, _: &ClientRef<'_>, _: &str) -> bool {
        true
    }
    fn vouches(&self, _: &str, _: &NodeId, claim: &Claim) -> bool {
        claim.user.as_deref() != Some("alice") || claim.proof.as_deref() == Some(ALICE_PROOF)
    }
    fn vouches_forget(&self, _: &NodeId, _: u64, signature: Option<&[u8]>) -> bool {
        signature == Some(FORGET_SIGNATURE)
    }
    fn vouches_region(&self, _: &NodeId, region: &str, certificate: Option<&[u8]>) -> bool {
        certificate == Some(&region_certificate(region)[..])
    }
}

/// Give each named node these hooks, proving its clients' claims or not.
pub fn with_operator_keys(mesh: &mut Mesh, nodes: &[(&str, bool)]) {
    for &(node, proves) in nodes {
        let w = mesh.node(node);
        let now = Timestamp(w.now);
        w.broker
            .set_hooks(now, Box::new(Proving(proves)), Box::new(OperatorRules));
    }
}
