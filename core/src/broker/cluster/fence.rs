//! The subscription fence: a SUBACK held until the other nodes know the new route
//! ([`ClusterConfig::subscribe_fence`](super::ClusterConfig::subscribe_fence)), within a bound.

use std::collections::BTreeSet;

use crate::broker::io::{ConnId, Timestamp};
use crate::broker::session::SessionId;
use crate::broker::subscribe::RetainedFor;
use crate::broker::{Authenticator, Authorizer, Broker, Timer};
use crate::codec::SubAck;
use crate::routes::NodeId;

/// A SUBACK held by the subscription fence.
#[derive(Debug)]
pub(super) struct Fence {
    conn: ConnId,
    sid: SessionId,
    suback: SubAck,
    retained: Vec<RetainedFor>,
    /// The route-set version every waited-for peer must have applied; `None` until the batch
    /// holding the new filters is flushed.
    pub(super) target: Option<u64>,
    peers: Vec<NodeId>,
    deadline: Timestamp,
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// With the fence on, keep a SUBACK until the connected peers know the routes; returns
    /// it back if it may go now.
    #[allow(clippy::type_complexity)]
    pub(in crate::broker) fn hold_suback(
        &mut self,
        conn: ConnId,
        sid: SessionId,
        granted: bool,
        suback: SubAck,
        retained: Vec<RetainedFor>,
    ) -> Option<(SubAck, Vec<RetainedFor>)> {
        let now = self.now;
        let Some(c) = &mut self.cluster else {
            return Some((suback, retained));
        };
        // Mesh nodes only: a leaf's view is not this node's own route set.
        let mut peers = c.connected_peers();
        peers.retain(|p| !c.leaves.is_leaf(p));
        let earlier_held = c.fences.iter().any(|f| f.conn == conn);
        let wanted = c.config.subscribe_fence && granted && !peers.is_empty();
        if !(wanted || earlier_held) || c.fences.len() >= c.config.subscribe_fence_max_held {
            return Some((suback, retained));
        }
        let target = (!c.routes.has_pending()).then(|| c.routes.version());
        let deadline = now.plus_ms(c.config.subscribe_fence_max_ms);
        c.fences.push_back(Fence {
            conn,
            sid,
            suback,
            retained,
            target,
            peers,
            deadline,
        });
        self.timers.insert((deadline, Timer::SubscribeFence));
        self.release_fences();
        None
    }

    /// Send every held SUBACK whose peers have all applied its routes (or whose wait is
    /// over), keeping each connection's SUBACKs in order.
    pub(in crate::broker) fn release_fences(&mut self) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let mut ready = Vec::new();
        let mut blocked: BTreeSet<ConnId> = BTreeSet::new();
        let mut i = 0;
        while i < c.fences.len() {
            let f = &c.fences[i];
            let done = f.deadline <= now
                || f.target.is_some_and(|target| {
                    f.peers.iter().all(|p| {
                        c.routes.acked(p).unwrap_or(0) >= target
                            || !c.peers.get(p).is_some_and(|x| x.connected)
                    })
                });
            if done && !blocked.contains(&f.conn) {
                if let Some(f) = c.fences.remove(i) {
                    ready.push(f);
                }
            } else {
                blocked.insert(f.conn);
                i += 1;
            }
        }
        for f in ready {
            self.send_suback(f.conn, f.sid, f.suback, f.retained);
        }
    }

    /// SUBACKs held by the subscription fence.
    pub fn held_subacks(&self) -> usize {
        self.cluster.as_ref().map_or(0, |c| c.fences.len())
    }
}
