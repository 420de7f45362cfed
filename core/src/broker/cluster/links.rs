//! The link to each peer: sessions up and down, and every frame a peer sends.

use super::trust::{PeerFault, foreign_origin};
use crate::broker::persist::Key;
use crate::broker::{Authenticator, Authorizer, Broker};
use crate::link::{DigestEntry, Frame, FrameKind, LINK_PROTOCOL_VERSION};
use crate::retained::RetainedDigest;
use crate::routes::{DeltaOutcome, NodeId, RouteLog, RoutePosition, SnapshotOutcome};

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    pub(in crate::broker) fn on_peer_up(&mut self, peer: NodeId) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        if peer == c.owner.node {
            return;
        }
        if !c.admits(&peer) {
            self.peer_fault(&peer, PeerFault::TooManyNodes);
            self.cut_peer(peer);
            return;
        }
        let p = c.peer(&peer);
        p.connected = true;
        p.congested = false;
        p.routes_current = false;
        p.announced_position = None;
        p.last_heard = Some(now);
        p.acked_at = now;
        p.up_since = Some(now);
        let hello = Frame::Hello {
            node: c.owner.node.clone(),
            incarnation: c.owner.incarnation,
            protocol: LINK_PROTOCOL_VERSION,
            region: c.config.region.clone(),
            certificate: c.config.certificate.clone(),
        };
        let member = c.is_member(&peer);
        self.send_to_peer(peer.clone(), hello);
        // A peer not vouched for yet gets the rest once its hello is.
        if member {
            self.session_state_to(&peer);
        }
    }

    /// What a link session starts with after the hello: the route digest (a leaf's view
    /// batched first), retained digest, claims, shipped sessions, relays and the outbox.
    fn session_state_to(&mut self, peer: &NodeId) {
        let Some(c) = &mut self.cluster else { return };
        let peer = peer.clone();
        // Its acknowledgements hold this node's route changes for it from now on.
        c.log_for_mut(&peer).add_peer(peer.clone());
        // A leaf's view may hold changes not batched yet (all of it, for a leaf made just
        // now): batched here and sent, so that the digest after them says where the view
        // stands. Otherwise the leaf would take the view it has for current and keep its
        // publishers' messages to itself until the next batch.
        let view_delta = c.leaves.view_mut(&peer).and_then(RouteLog::flush);
        let per_frame = c.config.snapshot_chunk_filters;
        let digest = c.digest_for(&peer);
        // Retained messages replicate between mesh nodes only.
        let retained = (!c.leaves.is_leaf(&peer)).then(|| c.retained.digest());
        for frame in view_delta
            .into_iter()
            .flat_map(|d| super::routes::delta_frames(d, per_frame))
        {
            self.send_to_peer(peer.clone(), frame);
        }
        self.send_to_peer(peer.clone(), digest);
        if let Some(RetainedDigest { hash, entries }) = retained {
            self.send_to_peer(peer.clone(), Frame::RetainedDigest { hash, entries });
        }
        self.claims_peer_up(&peer);
        // A shipped session, then what was relayed for it, then the forwards: a session's
        // messages from this node reach it in their order.
        self.transfers_peer_up(&peer);
        self.relays_peer_up(&peer);
        self.pump_outbox(&peer);
    }

    pub(in crate::broker) fn set_peer_congested(&mut self, peer: &NodeId, congested: bool) {
        let Some(c) = &mut self.cluster else { return };
        if let Some(p) = c.peers.get_mut(peer)
            && p.connected
        {
            p.congested = congested;
        }
    }

    pub(in crate::broker) fn on_peer_down(&mut self, peer: NodeId) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        if let Some(p) = c.peers.get_mut(&peer) {
            p.connected = false;
            p.congested = false;
            p.last_heard = Some(now);
            p.up_since = None;
            p.outbox.link_down();
        }
        c.transfers.drop_incoming(&peer);
        if !c.fences.is_empty() {
            self.release_fences();
        }
    }

    /// A frame from `peer`, which the shell authenticated (the link session's remote end, or
    /// the author of a gossiped broadcast).
    pub(in crate::broker) fn on_peer_frame(&mut self, peer: NodeId, frame: Frame) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        if peer == c.owner.node {
            return;
        }
        if !c.admits(&peer) {
            self.peer_fault(&peer, PeerFault::TooManyNodes);
            return;
        }
        if let Some(kind) = foreign_origin(&c.owner.node, &peer, &frame) {
            self.peer_fault(&peer, PeerFault::NotOwner(kind));
            return;
        }
        // Before its hello is vouched for, a peer that must be certified says nothing (its
        // gossip may come before its hello: what it says is asked for again once it is in).
        if !c.is_member(&peer) && !matches!(frame, Frame::Hello { .. }) {
            return;
        }
        if c.leaves.is_leaf(&peer) {
            match frame {
                // A leaf speaks for its own routes and messages only.
                Frame::Forget { .. } => {
                    self.peer_fault(&peer, PeerFault::NotOwner(frame.kind()));
                    return;
                }
                // Retained messages and claims replicate between mesh nodes only.
                Frame::Retained(_)
                | Frame::RetainedDigest { .. }
                | Frame::RetainedSnapshot(_)
                | Frame::Claim(_)
                | Frame::ClaimSnapshot(_)
                | Frame::SessionTransfer(_)
                | Frame::SessionTaken { .. }
                | Frame::SessionRelay(_)
                | Frame::SessionRelayAck { .. }
                | Frame::SessionRouted { .. }
                | Frame::SessionRelayDone { .. }
                | Frame::SessionRelayCaughtUp { .. }
                | Frame::ClaimRequest { .. }
                | Frame::ClaimAnswer { .. }
                | Frame::Revoke { .. }
                | Frame::Revoked { .. }
                // A leaf's filters come in its route deltas.
                | Frame::ScopedRoutes { .. } => {
                    return;
                }
                _ => {}
            }
        }
        c.peer(&peer).last_heard = Some(now);
        match frame {
            Frame::Hello {
                region,
                protocol,
                certificate,
                ..
            } => {
                if protocol != LINK_PROTOCOL_VERSION {
                    self.stats.protocol_errors += 1;
                }
                // A mesh node's region counts only as the authorizer vouches for it (with
                // operator keys, certified); a leaf's is its hub's anyway.
                let vouched = c.leaves.is_leaf(&peer)
                    || self
                        .authorizer
                        .vouches_region(&peer, &region, certificate.as_deref());
                c.peer(&peer).region = vouched.then_some(region);
                // Where members must be certified, one whose hello is not has its session cut;
                // one vouched for the first time gets what its session starts with now.
                let strict = c.config.members_certified && !c.leaves.is_leaf(&peer);
                let newly = strict && vouched && c.certified.insert(peer.clone());
                let connected = c.peers.get(&peer).is_some_and(|p| p.connected);
                if !vouched {
                    self.peer_fault(&peer, PeerFault::NotOwner(FrameKind::Hello));
                    if strict {
                        self.cut_peer(peer);
                        return;
                    }
                }
                if newly && connected {
                    self.session_state_to(&peer);
                }
                self.send_scoped_to(&peer, true);
                self.purge_withheld_forwards();
            }
            Frame::ScopedRoutes { filters } => self.on_scoped_routes(&peer, filters),
            Frame::RouteDelta(delta) => {
                let owner = delta.owner.clone();
                let outcome = c.table.apply_delta(&delta);
                c.check_routes_current(&owner.node);
                self.persist_replica(&owner.node, matches!(outcome, DeltaOutcome::Applied { .. }));
                let Some(c) = &mut self.cluster else { return };
                match outcome {
                    DeltaOutcome::Applied { version } => {
                        self.send_to_peer(owner.node.clone(), Frame::RouteAck { owner, version })
                    }
                    DeltaOutcome::Gap { after } => {
                        let hash = c.table.replica(&owner.node).map_or(0, |r| r.hash);
                        let entry = DigestEntry {
                            owner: owner.clone(),
                            version: after,
                            hash,
                        };
                        self.send_to_peer(owner.node, Frame::Digest(vec![entry]));
                    }
                    DeltaOutcome::NeedSnapshot => {
                        self.send_to_peer(owner.node, Frame::SnapshotRequest)
                    }
                    DeltaOutcome::OverLimit(limit) => {
                        self.peer_fault(&peer, PeerFault::OverLimit(limit.into()))
                    }
                    DeltaOutcome::Duplicate | DeltaOutcome::Stale => {}
                }
            }
            Frame::RouteAck { owner, version } => {
                if owner == c.owner {
                    c.log_for_mut(&peer).ack(&peer, version);
                    if !c.fences.is_empty() {
                        self.release_fences();
                    }
                    self.settle_moves();
                }
            }
            Frame::Digest(entries) => {
                for entry in entries {
                    self.on_digest_entry(&peer, entry);
                }
            }
            Frame::SnapshotRequest => self.send_snapshot(&peer),
            Frame::SnapshotChunk(chunk) => {
                let owner = chunk.owner.clone();
                let outcome = c.table.apply_snapshot_chunk(&chunk);
                c.check_routes_current(&owner.node);
                let installed = matches!(outcome, SnapshotOutcome::Installed { .. });
                self.persist_replica(&owner.node, installed);
                match outcome {
                    SnapshotOutcome::Installed { version } => {
                        self.send_to_peer(owner.node.clone(), Frame::RouteAck { owner, version })
                    }
                    SnapshotOutcome::Corrupt => {
                        self.send_to_peer(owner.node, Frame::SnapshotRequest)
                    }
                    SnapshotOutcome::OverLimit(limit) => {
                        self.peer_fault(&peer, PeerFault::OverLimit(limit.into()))
                    }
                    SnapshotOutcome::InProgress | SnapshotOutcome::Stale => {}
                }
            }
            Frame::Forward(forward) => self.on_forward(peer, forward),
            Frame::ForwardAck { seq, .. } => {
                let p = c.peer(&peer);
                let done = p.outbox.ack(seq);
                if !done.is_empty() {
                    p.acked_at = now;
                }
                for seq in done {
                    self.persist(
                        Key::Outbox {
                            peer: peer.clone(),
                            seq,
                        }
                        .encode(),
                        None,
                    );
                }
                self.pump_outbox(&peer);
            }
            Frame::KeepAlive => {}
            Frame::Retained(update) => self.apply_retained_update(&peer, update),
            Frame::RetainedDigest { hash, entries } => {
                if c.retained.digest() != (RetainedDigest { hash, entries }) {
                    self.send_retained_snapshot(&peer);
                }
            }
            Frame::RetainedSnapshot(updates) => {
                for update in updates {
                    self.apply_retained_update(&peer, update);
                }
            }
            Frame::Forget {
                node,
                incarnation,
                signature,
            } => self.on_forget(&peer, &node, incarnation, signature.as_deref()),
            Frame::Claim(update) => self.on_claim(&peer, update),
            Frame::ClaimSnapshot(updates) => {
                for update in updates {
                    self.on_claim(&peer, update);
                }
            }
            Frame::SessionTransfer(transfer) => self.on_session_transfer(&peer, transfer),
            Frame::SessionTaken {
                client_id,
                shipment,
                ..
            } => self.on_session_taken(&peer, client_id, shipment),
            Frame::SessionRelay(relay) => self.on_session_relay(&peer, relay),
            Frame::SessionRelayAck {
                client_id,
                claim,
                n,
            } => self.on_relay_ack(&peer, client_id, claim, n),
            Frame::SessionRouted { client_id, claim } => {
                self.on_session_routed(&peer, client_id, claim)
            }
            Frame::SessionRelayDone {
                client_id, claim, ..
            } => self.on_relay_done(&peer, &client_id, claim),
            Frame::SessionRelayCaughtUp {
                client_id,
                claim,
                node,
            } => self.on_relay_caught_up(&peer, &client_id, claim, node),
            Frame::Fence { token } => self.on_fence(&peer, token),
            Frame::ClaimRequest {
                client_id,
                user,
                proof,
                token,
            } => self.on_claim_request(&peer, client_id, user, proof, token),
            Frame::ClaimAnswer {
                token, reason, hlc, ..
            } => self.on_claim_answer(&peer, token, reason, hlc),
            Frame::Revoke { client_id, token } => self.on_revoke(&peer, client_id, token),
            Frame::Revoked { token, .. } => self.on_revoked(&peer, token),
            Frame::FenceEcho {
                token,
                incarnation,
                next,
            } => self.on_fence_echo(&peer, token, (incarnation, next)),
        }
    }

    /// A peer says where it stands for one owner's route set.
    pub(super) fn on_digest_entry(&mut self, peer: &NodeId, entry: DigestEntry) {
        let Some(c) = &mut self.cluster else { return };
        if entry.owner.node == c.owner.node {
            // About our own routes (as this peer sees them): help the peer catch up.
            let same = entry.owner.incarnation == c.owner.incarnation;
            let log = c.log_for(peer);
            if same && entry.version == log.version() && entry.hash == log.hash() {
                return;
            }
            let delta = (same && entry.version <= log.version())
                .then(|| log.delta_since(entry.version))
                .flatten()
                .filter(|_| entry.version < log.version());
            match delta {
                Some(delta) => {
                    let per_frame = c.config.snapshot_chunk_filters;
                    for frame in super::routes::delta_frames(delta, per_frame) {
                        self.send_to_peer(peer.clone(), frame);
                    }
                }
                None => self.send_snapshot(peer),
            }
            return;
        }
        // About someone else's routes (usually the peer's own): are we behind?
        if entry.owner.node == *peer {
            let p = c.peer(peer);
            p.announced_version = entry.version;
            p.announced_position = Some((entry.owner.incarnation, entry.version));
            c.check_routes_current(peer);
        }
        let replica = c.table.replica(&entry.owner.node);
        let RoutePosition {
            incarnation,
            version,
            hash,
        } = replica.map(|r| r.position()).unwrap_or_default();
        let behind = (incarnation, version) < (entry.owner.incarnation, entry.version);
        let diverged = (incarnation, version) == (entry.owner.incarnation, entry.version)
            && hash != entry.hash;
        if diverged || (behind && incarnation != entry.owner.incarnation) {
            self.send_to_peer(entry.owner.node, Frame::SnapshotRequest);
        } else if behind {
            let mine = DigestEntry {
                owner: entry.owner.clone(),
                version,
                hash,
            };
            self.send_to_peer(entry.owner.node, Frame::Digest(vec![mine]));
        }
    }

    pub(super) fn send_snapshot(&mut self, peer: &NodeId) {
        let Some(c) = &self.cluster else { return };
        let chunks = c.log_for(peer).snapshot(c.config.snapshot_chunk_filters);
        for chunk in chunks {
            self.send_to_peer(peer.clone(), Frame::SnapshotChunk(chunk));
        }
    }
}
