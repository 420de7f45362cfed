//! What the cluster keeps in storage (replicas of peers' route sets, outboxes, inbox marks,
//! retained stamps) and its restoring after a restart.

use bytes::{Bytes, BytesMut};

use super::trust::PeerFault;
use crate::broker::persist::{InboxMark, Key};
use crate::broker::{Authenticator, Authorizer, Broker};
use crate::link::{self, DEFAULT_MAX_FRAME_LEN, Frame, FrameKind};
use crate::routes::{NodeId, Owner, RoutePosition};

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Persist what changed in the replica of `node`'s route set, so that a restarted node
    /// keeps forwarding (into its outboxes) to nodes it cannot reach yet.
    /// Only what changed is written: nothing for a duplicate delta or a snapshot still arriving.
    pub(super) fn persist_replica(&mut self, node: &NodeId, moved: bool) {
        let Some(c) = &mut self.cluster else { return };
        let changes = c.table.take_journal();
        if changes.is_empty() && !moved {
            return;
        }
        let position = c.table.replica(node).map(|r| r.position());
        // Leaves see what the mesh and the other leaves want.
        let mut outside = Vec::new();
        for change in &changes {
            if c.replica_interest(&change.owner, &change.filter, change.present) {
                outside.push(change.owner.clone());
            }
        }
        for owner in &outside {
            self.peer_fault(owner, PeerFault::NotOwner(FrameKind::RouteDelta));
        }
        for change in changes {
            let key = Key::ReplicaFilter {
                node: change.owner.clone(),
                filter: change.filter.to_string(),
            };
            self.persist(key.encode(), change.present.then(Bytes::new));
        }
        self.arm_route_flush();
        if let Some(position) = position {
            let key = Key::ReplicaPosition { node: node.clone() };
            let value = Bytes::copy_from_slice(&position.to_bytes());
            self.persist(key.encode(), Some(value));
        }
    }

    /// Restore a cluster record; false if the record is not a cluster one.
    pub(in crate::broker) fn restore_cluster_record(
        &mut self,
        key: &Key,
        value: &[u8],
    ) -> Result<bool, crate::broker::RecordError> {
        let bad = |detail| crate::broker::RecordError {
            kind: "cluster",
            detail,
        };
        let Some(c) = &mut self.cluster else {
            return Ok(matches!(
                key,
                Key::Outbox { .. }
                    | Key::InboxMark { .. }
                    | Key::RetainedStamp { .. }
                    | Key::ReplicaPosition { .. }
                    | Key::ReplicaFilter { .. }
                    | Key::Forgotten { .. }
                    | Key::Leaf { .. }
            ));
        };
        match key {
            Key::Outbox { peer, seq } => {
                let node = peer.clone();
                let mut buf = BytesMut::from(value);
                match link::decode(&mut buf, DEFAULT_MAX_FRAME_LEN) {
                    Ok(Some(Frame::Forward(f))) if f.seq == *seq && buf.is_empty() => {
                        // Numbers go on from the highest given out, towards every node.
                        c.next_message = c.next_message.max(f.seq + 1);
                        // Sent again as it was stored.
                        let frame = link::EncodedFrame::from_stored(
                            link::FrameKind::Forward,
                            Bytes::copy_from_slice(value),
                        );
                        c.peer(&node).outbox.restore(&f, frame)
                    }
                    _ => return Err(bad("outbox entry")),
                }
                Ok(true)
            }
            Key::RetainedStamp { topic } => {
                let (stamp, deleted) = crate::broker::persist::decode_stamp(value)?;
                c.hlc.observe(stamp.hlc, 0);
                // A stamp whose message is gone (expired while the node was down) is dropped.
                let weight = self.retained.get(topic).map(|m| m.weight());
                if deleted || weight.is_some() {
                    let Some(c) = &mut self.cluster else {
                        return Ok(true);
                    };
                    // Counted against its writer: who relayed it is not kept.
                    let charge = weight
                        .filter(|_| !deleted)
                        .map(|bytes| super::RetainedCharge {
                            bytes,
                            to: stamp.node.clone(),
                        });
                    c.account_retained(topic, charge.as_ref());
                    c.retained.apply(topic, stamp, charge);
                } else {
                    self.persist(key.encode(), None);
                }
                Ok(true)
            }
            Key::InboxMark {
                origin,
                incarnation,
            } => {
                let node = origin.clone();
                let mark = InboxMark::decode(value).ok_or_else(|| bad("inbox mark"))?;
                c.inbox.restore(
                    &Owner {
                        node,
                        incarnation: *incarnation,
                    },
                    mark.seq,
                );
                self.delete_forgotten_marks();
                Ok(true)
            }
            Key::ReplicaPosition { node } => {
                let node = node.clone();
                let position =
                    RoutePosition::from_bytes(value).ok_or_else(|| bad("replica position"))?;
                c.table.restore_position(&node, position);
                Ok(true)
            }
            Key::ReplicaFilter { node, filter } => {
                let node = node.clone();
                c.table.restore_filter(&node, filter);
                Ok(true)
            }
            Key::Leaf { node } => {
                let node = node.clone();
                self.restore_leaf(&node);
                Ok(true)
            }
            Key::Forgotten { node } => {
                let node = node.clone();
                let words = <[u8; 24]>::try_from(value).map_err(|_| bad("forgotten node"))?;
                let word = |i: usize| {
                    let mut w = [0; 8];
                    w.copy_from_slice(&words[i * 8..i * 8 + 8]);
                    u64::from_be_bytes(w)
                };
                c.next_message = c.next_message.max(word(1));
                c.restore_forgotten(node, word(0), word(1), word(2));
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}
