//! Which peers the broker takes as members, for the streams beside the link session (policy
//! sync) where members must be certified: the broker task sets it as it hears each peer's
//! hello, the mesh asks it before it syncs anything with a peer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use meridian_core::routes::NodeId;
use tokio::sync::watch;

/// The broker's word on each peer whose hello it heard on the link session now up: a member
/// or not (`cluster.members_certified`: its hello carried the operator's certificate or not).
#[derive(Clone, Debug)]
pub struct MemberGate(Arc<watch::Sender<BTreeMap<NodeId, bool>>>);

impl Default for MemberGate {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(BTreeMap::new())))
    }
}

impl MemberGate {
    /// The broker heard `peer`'s hello: a member, or not.
    pub fn set(&self, peer: &NodeId, member: bool) {
        self.0
            .send_if_modified(|m| m.insert(peer.clone(), member) != Some(member));
    }

    /// `peer`'s link session is down: its next one's hello decides again.
    pub fn forget(&self, peer: &NodeId) {
        self.0.send_if_modified(|m| m.remove(peer).is_some());
    }

    /// Whether `peer` is a member: the broker's word on its hello, once heard, within `wait`
    /// (the hello comes on the link session, which may open after the stream that asks).
    pub async fn admits(&self, peer: &NodeId, wait: Duration) -> bool {
        let mut members = self.0.subscribe();
        let heard = members.wait_for(|m| m.contains_key(peer));
        match tokio::time::timeout(wait, heard).await {
            Ok(Ok(m)) => m.get(peer).copied().unwrap_or(false),
            _ => false,
        }
    }
}
