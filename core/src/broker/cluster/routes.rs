//! This node's route set: filters gained and lost are batched, and each batch goes to every
//! peer as a versioned delta with the set's hash; a digest announces the version now and then.

use crate::broker::io::Event;
use crate::broker::{Authenticator, Authorizer, Broker, Timer};
use crate::link::Frame;
use crate::routes::{DELTA_MAX_BYTES, RouteDelta};

/// A delta as the frames it leaves in ([`RouteDelta::split`]): a node that gains many filters
/// at once (all of them, after a restart) sends them in bounded pieces.
pub(super) fn delta_frames(delta: RouteDelta, max_changes: usize) -> Vec<Frame> {
    delta
        .split(max_changes, DELTA_MAX_BYTES)
        .into_iter()
        .map(Frame::RouteDelta)
        .collect()
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// A filter pattern got its first local subscriber.
    pub(in crate::broker) fn route_added(&mut self, filter: &str) {
        self.event(Event::RouteAdded {
            filter: filter.to_owned(),
        });
        if let Some(c) = &mut self.cluster {
            if c.leaves.is_empty() {
                c.advertise(filter);
            } else {
                c.local_interest(filter, true);
            }
            self.arm_route_flush();
        }
    }

    /// Whether a new local subscription to `filter` would take this node's route set past
    /// [`super::ClusterConfig::max_route_filters`].
    pub(in crate::broker) fn route_set_full(&self, filter: &str) -> bool {
        self.cluster
            .as_ref()
            .is_some_and(|c| !c.wants(filter) && c.wanted_len() >= c.config.max_route_filters)
    }

    /// A filter pattern lost its last local subscriber.
    pub(in crate::broker) fn route_removed(&mut self, filter: &str) {
        self.event(Event::RouteRemoved {
            filter: filter.to_owned(),
        });
        if let Some(c) = &mut self.cluster {
            if c.leaves.is_empty() {
                c.withdraw_filter(filter);
            } else {
                c.local_interest(filter, false);
            }
            self.arm_route_flush();
        }
    }

    pub(super) fn arm_route_flush(&mut self) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        if !c.flush_armed && (c.routes.has_pending() || c.leaves.has_pending() || c.scoped_dirty) {
            c.flush_armed = true;
            self.timers
                .insert((now.plus_ms(c.config.route_batch_ms), Timer::RouteFlush));
        }
    }

    pub(in crate::broker) fn fire_route_flush(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        c.flush_armed = false;
        let delta = c.routes.flush();
        let version = c.routes.version();
        for fence in c.fences.iter_mut().filter(|f| f.target.is_none()) {
            fence.target = Some(version);
        }
        if let Some(delta) = delta {
            let per_frame = c.config.snapshot_chunk_filters;
            for frame in delta_frames(delta, per_frame) {
                self.broadcast(&frame);
            }
        }
        self.flush_views();
        self.send_scoped_routes();
        self.release_fences();
        self.moves_flushed();
    }

    pub(in crate::broker) fn fire_digest(&mut self) {
        let Some(c) = &self.cluster else { return };
        let frame = c.own_digest();
        let next = self.now.plus_ms(c.config.digest_interval_ms);
        self.broadcast(&frame);
        self.send_view_digests();
        self.timers.insert((next, Timer::Digest));
    }
}
