//! One owner per client id across the deployment.
//!
//! The node a client connects to serves it at once and claims its client id: a [`Claim`]
//! stamped with its hybrid logical clock, sent to every mesh peer. Every node keeps the claim
//! with the greatest stamp per client id (last writer wins, like retained messages), so
//! simultaneous claims resolve the same way everywhere. A node that holds the session of a
//! client id another node claimed closes the client's connection (0x8E Session taken over)
//! and, if the claim asks to resume it and comes from the same user, ships the session there
//! ([`super::transfer`]); otherwise the session ends where it was. A session that ends lets
//! go of its claim (a tombstone). The claim carries its user: a client of another user is
//! refused the client id on every node that knows the claim.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};

use super::Cluster;
use super::trust::{PeerFault, PeerLimit};
use crate::broker::io::DisconnectCause;
use crate::broker::persist::{self, Key, RecordError};
use crate::broker::session::SessionId;
use crate::broker::{Authenticator, Authorizer, Broker};
use crate::codec::ReasonCode;
use crate::link::{Claim, ClaimUpdate, Frame, FrameKind};
use crate::read::Fields;
use crate::retained::Stamp;
use crate::routes::NodeId;

/// Claims per [`Frame::ClaimSnapshot`].
const SNAPSHOT_CLAIMS: usize = 10_000;
/// Claim tombstones (sessions that ended) remembered, so that a late claim older than the
/// end cannot revive an owner; beyond, the oldest are forgotten.
pub(super) const CLAIM_TOMBSTONES_KEPT: usize = 100_000;

/// The claims known here.
#[derive(Debug, Default)]
pub(super) struct Claims {
    /// The greatest claim per client id (tombstones: sessions that ended).
    pub map: crate::retained::LwwMap<Claim>,
    /// Live claims held per claimer, and their bytes ([`claim_weight`]).
    by_node: BTreeMap<NodeId, (usize, usize)>,
    /// Live claims held, this node's included.
    live: usize,
    /// Per client id this node's live claim holds: the newest claim of another node known to
    /// have been made before it (the one it replaced, or one learnt of since), so that an
    /// older claim counts once ([`Broker::older_claim`]).
    known_before: BTreeMap<String, Stamp>,
    /// Per client id, this node's own last claim that another node's claim replaced: a
    /// session this node ships or passes on there carries it, as its right to
    /// ([`crate::link::SessionTransfer::by`]). At most [`CLAIMS_SUPERSEDED_KEPT`], the
    /// oldest forgotten first.
    superseded: BTreeMap<String, (Stamp, Claim)>,
}

/// Own claims replaced by others' that are remembered ([`Claims::superseded`]).
const CLAIMS_SUPERSEDED_KEPT: usize = 100_000;

impl Claims {
    /// The live claim on `client_id`, with its stamp.
    pub fn live(&self, client_id: &str) -> Option<(&Stamp, &Claim)> {
        let e = self.map.get(client_id)?;
        Some((&e.stamp, e.value.as_ref()?))
    }

    /// One live claim more (`delta` 1) or less (-1) for `node`, of `weight` bytes.
    fn count(&mut self, node: &NodeId, delta: isize, weight: usize) {
        self.live = self.live.saturating_add_signed(delta);
        let (n, bytes) = self.by_node.entry(node.clone()).or_default();
        *n = n.saturating_add_signed(delta);
        *bytes = if delta > 0 {
            bytes.saturating_add(weight)
        } else {
            bytes.saturating_sub(weight)
        };
        if *n == 0 {
            self.by_node.remove(node);
        }
    }

    /// Apply a claim that wins over what is held (the caller checked), keeping the counts of
    /// live claims.
    fn apply(&mut self, update: &ClaimUpdate) {
        let old = self.map.get(&update.client_id).and_then(|e| {
            let weight = claim_weight(&update.client_id, e.value.as_ref()?);
            Some((e.stamp.node.clone(), weight))
        });
        if let Some((node, weight)) = old {
            self.count(&node, -1, weight);
        }
        self.map.apply(
            &update.client_id,
            update.stamp.clone(),
            update.claim.clone(),
        );
        if let Some(claim) = &update.claim {
            let weight = claim_weight(&update.client_id, claim);
            self.count(&update.stamp.node, 1, weight);
        }
    }

    fn live_of(&self, node: &NodeId) -> usize {
        self.by_node.get(node).map_or(0, |(n, _)| *n)
    }

    fn bytes_of(&self, node: &NodeId) -> usize {
        self.by_node.get(node).map_or(0, |(_, bytes)| *bytes)
    }

    /// Drop every claim (and release) `node` made; the client ids they named.
    fn drop_node(&mut self, node: &NodeId) -> Vec<String> {
        let theirs: Vec<String> = self
            .map
            .iter()
            .filter(|(_, e)| e.stamp.node == *node)
            .map(|(client_id, _)| client_id.to_string())
            .collect();
        for client_id in &theirs {
            if let Some(e) = self.map.forget(client_id)
                && let Some(claim) = &e.value
            {
                self.count(node, -1, claim_weight(client_id, claim));
            }
        }
        theirs
    }
}

impl Cluster {
    /// Whether this node exchanges claims: mesh members do; a leaf (an edge object) serves
    /// its clients alone, and its hub does not take claims from it.
    fn claims_shared(&self) -> bool {
        !self.owner.node.as_str().starts_with(super::LEAF_PREFIX)
    }

    /// The mesh peers whose link is up, that claims are told to (not leaves).
    fn claim_peers(&self) -> Vec<NodeId> {
        if !self.claims_shared() {
            return Vec::new();
        }
        let mut peers = self.connected_peers();
        peers.retain(|p| !self.leaves.is_leaf(p));
        peers
    }
}

/// Bytes a claim is counted for in [`super::PeerLimits::max_claim_bytes`]: its client id,
/// user and proof, and the bookkeeping around them.
fn claim_weight(client_id: &str, claim: &Claim) -> usize {
    const OVERHEAD: usize = 64;
    client_id.len()
        + claim.user.as_deref().map_or(0, str::len)
        + claim.proof.as_ref().map_or(0, Bytes::len)
        + OVERHEAD
}

/// The value of a claim record: stamp, then 0 for a tombstone, or 1, flags, the user and the
/// proof (the rest of the value; none in records written before proofs).
pub(super) fn encode_claim(stamp: &Stamp, claim: Option<&Claim>) -> Bytes {
    let mut v = BytesMut::with_capacity(32);
    v.put_u8(1);
    persist::put_stamp_value(&mut v, stamp);
    match claim {
        None => v.put_u8(0),
        Some(c) => {
            v.put_u8(1);
            v.put_u8(u8::from(c.resume) | u8::from(c.persistent) << 1);
            persist::put_opt_string(&mut v, c.user.as_deref());
            if let Some(proof) = &c.proof {
                v.put_slice(proof);
            }
        }
    }
    v.freeze()
}

pub(super) fn decode_claim(value: &[u8]) -> Result<(Stamp, Option<Claim>), RecordError> {
    let mut r = persist::Reader::new("claim", value)?;
    let stamp = r.stamp()?;
    let claim = match r.u8()? {
        0 => None,
        1 => {
            let flags = r.u8()?;
            let user = r.opt_string()?;
            let proof = Some(r.rest()).filter(|p| !p.is_empty());
            Some(Claim {
                user,
                resume: flags & 1 != 0,
                persistent: flags & 2 != 0,
                proof: proof.map(Bytes::copy_from_slice),
            })
        }
        _ => {
            return Err(RecordError {
                kind: "claim",
                detail: "unknown operation",
            });
        }
    };
    Ok((stamp, claim))
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Whether the claims known here refuse `client_id` to `user` connecting here: a live
    /// claim of another node belongs to another user (the session is theirs).
    pub(in crate::broker) fn claim_refuses(&self, client_id: &str, user: Option<&str>) -> bool {
        self.node_id()
            .is_some_and(|me| self.claim_refuses_for(me, client_id, user))
    }

    /// Whether the claims known here refuse `client_id` to `user` connecting at `node`.
    pub(super) fn claim_refuses_for(
        &self,
        node: &NodeId,
        client_id: &str,
        user: Option<&str>,
    ) -> bool {
        let Some(c) = &self.cluster else { return false };
        c.claims
            .live(client_id)
            .is_some_and(|(stamp, claim)| stamp.node != *node && claim.user.as_deref() != user)
    }

    /// Whether the claims known here say another node holds the session a resuming client
    /// of `user` left there.
    pub(in crate::broker) fn session_elsewhere(
        &self,
        client_id: &str,
        user: Option<&str>,
    ) -> Option<NodeId> {
        let c = self.cluster.as_ref()?;
        c.claims
            .live(client_id)
            .filter(|(stamp, claim)| {
                stamp.node != c.owner.node && claim.persistent && claim.user.as_deref() == user
            })
            .map(|(stamp, _)| stamp.node.clone())
    }

    /// A client connected here: claim its client id, with the proof the authenticator gave
    /// for it, and tell the mesh.
    pub(in crate::broker) fn claim_client(
        &mut self,
        proof: Option<Bytes>,
        client_id: &str,
        user: Option<&str>,
        resume: bool,
        persistent: bool,
    ) {
        let now = self.now;
        if self.cluster.is_none() {
            return;
        }
        let Some(c) = &mut self.cluster else { return };
        let update = ClaimUpdate {
            client_id: client_id.to_owned(),
            stamp: Stamp {
                hlc: c.hlc.tick(now.as_millis()),
                node: c.owner.node.clone(),
            },
            claim: Some(Claim {
                user: user.map(str::to_owned),
                resume,
                persistent,
                proof,
            }),
        };
        self.publish_claim(update);
    }

    /// A session ended here: let go of its client id, if this node's claim is the one that
    /// stands. The release bears that claim's own stamp: it ends that claim and no other, so
    /// that a newer claim of another node it has not seen yet (the client reconnected there
    /// during a cut) stands wherever the two meet, as it would have over the claim.
    pub(in crate::broker) fn release_claim(&mut self, client_id: &str) {
        let Some(c) = &mut self.cluster else { return };
        let Some(stamp) = c
            .claims
            .live(client_id)
            .map(|(stamp, _)| stamp.clone())
            .filter(|stamp| stamp.node == c.owner.node)
        else {
            return;
        };
        let update = ClaimUpdate {
            client_id: client_id.to_owned(),
            stamp,
            claim: None,
        };
        self.publish_claim(update);
    }

    fn publish_claim(&mut self, update: ClaimUpdate) {
        let Some(c) = &mut self.cluster else { return };
        // What this claim knew it replaced: another node's claim. One that replaces this
        // node's own claim knew what that one knew (an older claim of another node it has not
        // met yet still holds the session's order back when it comes).
        let replaced = c.claims.map.get(&update.client_id).map(|e| e.stamp.clone());
        match replaced.filter(|_| update.claim.is_some()) {
            Some(stamp) if stamp.node == c.owner.node => None,
            Some(stamp) => c
                .claims
                .known_before
                .insert(update.client_id.clone(), stamp),
            None => c.claims.known_before.remove(&update.client_id),
        };
        c.claims.apply(&update);
        let peers = c.claim_peers();
        self.persist_claim(&update);
        self.prune_claim_tombstones();
        for peer in peers {
            self.send_to_peer(peer, Frame::Claim(update.clone()));
        }
    }

    fn persist_claim(&mut self, update: &ClaimUpdate) {
        let key = Key::Claim {
            client_id: update.client_id.clone(),
        };
        self.persist(
            key.encode(),
            Some(encode_claim(&update.stamp, update.claim.as_ref())),
        );
    }

    fn prune_claim_tombstones(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        for client_id in c.claims.map.prune_tombstones(CLAIM_TOMBSTONES_KEPT) {
            let key = Key::Claim {
                client_id: client_id.to_string(),
            };
            self.persist(key.encode(), None);
        }
    }

    /// A claim (or a release) from `peer`, its claimer: kept if it is newer than what this node
    /// holds; a session held here for that client id is then handed over.
    pub(super) fn on_claim(&mut self, peer: &NodeId, update: ClaimUpdate) {
        let now = self.now;
        // No client of this deployment can have that id (its nodes share the bound): such a
        // claim, or a release of one, would only take room.
        if update.client_id.len() > self.config.max_client_id_len {
            return self.peer_fault(peer, PeerFault::NotOwner(FrameKind::Claim));
        }
        let Some(c) = &mut self.cluster else { return };
        let ahead_ms = update.stamp.hlc.wall_ms.saturating_sub(now.as_millis());
        if ahead_ms > c.config.max_clock_drift_ms {
            self.peer_fault(peer, PeerFault::ClockAhead);
            return;
        }
        // Older than what is known, or the same (a release ends the live claim of its stamp).
        if let Some(e) = c.claims.map.get(&update.client_id)
            && (e.stamp > update.stamp
                || (e.stamp == update.stamp && !(e.value.is_some() && update.claim.is_none())))
        {
            let own = e.stamp.node == c.owner.node && e.stamp > update.stamp;
            if let (true, Some(mine)) = (own, e.value.clone()) {
                let stamp = e.stamp.clone();
                self.older_claim(peer, &update, &stamp, &mine);
            }
            return;
        }
        // A release ends its sender's own claim and no other: stamped after another node's
        // claim that stands here, it ends a claim this node did not take; with no claim of
        // the sender's standing here, it ends nothing and is not kept (a member cannot fill
        // the tombstones with client ids it never claimed).
        if update.claim.is_none()
            && c.claims
                .live(&update.client_id)
                .is_none_or(|(stamp, _)| stamp.node != *peer)
        {
            return;
        }
        // A claim counts only if the authorizer takes its word for the user it names (with
        // operator keys, a proof that the client logged in as that user at the claimer).
        if let Some(claim) = &update.claim
            && !self.authorizer.vouches(&update.client_id, peer, claim)
        {
            self.stats.claims_unproven += 1;
            return self.peer_fault(peer, PeerFault::NotOwner(FrameKind::Claim));
        }
        // Nor over another user's claim that stands here: the claimer should have refused its
        // client (0x87), as this node would. The client id and its session stay that user's,
        // whatever passwords the claimer knows.
        if let Some(claim) = &update.claim
            && self.claim_refuses_for(peer, &update.client_id, claim.user.as_deref())
        {
            self.stats.claims_of_another_user += 1;
            return;
        }
        let Some(c) = &mut self.cluster else { return };
        let replaces_own_live = c
            .claims
            .live(&update.client_id)
            .is_some_and(|(s, _)| s.node == *peer);
        if update.claim.is_some()
            && !replaces_own_live
            && c.claims.live_of(peer) >= c.config.peer_limits.max_claims
        {
            self.peer_fault(peer, PeerFault::OverLimit(PeerLimit::Claims));
            return;
        }
        if let Some(claim) = &update.claim {
            let replaced = c
                .claims
                .live(&update.client_id)
                .filter(|(s, _)| s.node == *peer)
                .map_or(0, |(_, old)| claim_weight(&update.client_id, old));
            let bytes = c.claims.bytes_of(peer).saturating_sub(replaced)
                + claim_weight(&update.client_id, claim);
            if bytes > c.config.peer_limits.max_claim_bytes {
                self.peer_fault(peer, PeerFault::OverLimit(PeerLimit::ClaimBytes));
                return;
            }
        }
        c.hlc.observe(update.stamp.hlc, now.as_millis());
        c.claims.known_before.remove(&update.client_id);
        let me = &c.owner.node;
        let superseded = update
            .claim
            .as_ref()
            .and_then(|_| c.claims.live(&update.client_id))
            .filter(|(stamp, _)| stamp.node == *me)
            .map(|(stamp, claim)| (stamp.clone(), claim.clone()));
        c.claims.apply(&update);
        self.persist_claim(&update);
        self.prune_claim_tombstones();
        if let Some((stamp, claim)) = superseded {
            self.remember_superseded(&update.client_id, stamp, claim);
        }
        if let (Some(claim), Some(&sid)) = (
            &update.claim,
            self.by_client_id.get(update.client_id.as_str()),
        ) {
            self.hand_over(sid, &update.stamp, claim);
        }
    }

    /// `peer`'s claim `update` came after this node's own live claim `mine` (stamped `stamp`)
    /// though made before it: the two claimed the client id without knowing of each other.
    /// If `peer` kept the session of the same user there, it ships it here once it learns this
    /// node's claim; the session here waits for that part to keep its messages' order.
    fn older_claim(&mut self, peer: &NodeId, update: &ClaimUpdate, stamp: &Stamp, mine: &Claim) {
        let Some(theirs) = &update.claim else { return };
        let Some(&sid) = self.by_client_id.get(update.client_id.as_str()) else {
            return;
        };
        if update.stamp.node != *peer
            || !(mine.resume && theirs.persistent)
            || theirs.user != mine.user
            || !self.authorizer.vouches(&update.client_id, peer, theirs)
        {
            return;
        }
        // Once per claim: the same claim sent again (or one older than what this node's claim
        // knew it replaced) holds nothing back again.
        let Some(c) = &mut self.cluster else { return };
        if c.claims
            .known_before
            .get(&update.client_id)
            .is_some_and(|known| *known >= update.stamp)
        {
            return;
        }
        c.claims
            .known_before
            .insert(update.client_id.clone(), update.stamp.clone());
        self.expect_shipment(sid, peer, &update.client_id, stamp);
    }

    /// Another node claimed the client id of a session held here: close its connection
    /// (0x8E; its will follows the usual rules) and ship the session to the claimer, or end
    /// it here if the claim does not resume it. A claim of another user (taken only where no
    /// claim of the session's user stood, [`Broker::on_claim`]) takes the client id while it
    /// stands, never the session: that stays here, unconnected, until its expiry or until its
    /// user claims the id again (a node that knows one user's password cannot end another's
    /// session with it).
    fn hand_over(&mut self, sid: SessionId, stamp: &Stamp, claim: &Claim) {
        let Some(session) = self.session(sid) else {
            return;
        };
        let same_user = session.username.as_deref() == claim.user.as_deref();
        if let Some(conn) = session.conn {
            self.close_conn(
                conn,
                DisconnectCause::ByServer(ReasonCode::SESSION_TAKEN_OVER),
            );
        }
        // A session without expiry ended with its connection.
        if self.session(sid).is_none() {
            return;
        }
        if !same_user {
            return;
        }
        if !claim.resume {
            return self.end_session(sid);
        }
        self.move_session(sid, stamp);
    }

    /// A node was forgotten: its claims go with it, so that a client id it claimed (and the
    /// user its claim named) no longer keeps anyone out.
    pub(super) fn forget_claims_of(&mut self, node: &NodeId) {
        let Some(c) = &mut self.cluster else { return };
        for client_id in c.claims.drop_node(node) {
            self.persist(Key::Claim { client_id }.encode(), None);
        }
    }

    /// A link to `peer` came up: tell it the claims this node made.
    pub(super) fn claims_peer_up(&mut self, peer: &NodeId) {
        let Some(c) = &self.cluster else { return };
        if c.leaves.is_leaf(peer) || !c.claims_shared() {
            return;
        }
        let me = &c.owner.node;
        let own: Vec<ClaimUpdate> = c
            .claims
            .map
            .iter()
            .filter(|(_, e)| e.stamp.node == *me)
            .map(|(client_id, e)| ClaimUpdate {
                client_id: client_id.to_string(),
                stamp: e.stamp.clone(),
                claim: e.value.clone(),
            })
            .collect();
        for chunk in own.chunks(SNAPSHOT_CLAIMS) {
            self.send_to_peer(peer.clone(), Frame::ClaimSnapshot(chunk.to_vec()));
        }
    }

    /// This node's own claim `stamp` on `client_id` was replaced by another node's: keep it
    /// (stored), for the sessions it ships or passes on there.
    fn remember_superseded(&mut self, client_id: &str, stamp: Stamp, claim: Claim) {
        let key = Key::SupersededClaim {
            client_id: client_id.to_owned(),
        };
        self.persist(key.encode(), Some(encode_claim(&stamp, Some(&claim))));
        let Some(c) = &mut self.cluster else { return };
        c.claims
            .superseded
            .insert(client_id.to_owned(), (stamp, claim));
        if c.claims.superseded.len() <= CLAIMS_SUPERSEDED_KEPT {
            return;
        }
        // A tenth at a time, the oldest first, so that pruning costs little per claim.
        let mut by_age: Vec<(Stamp, String)> = c
            .claims
            .superseded
            .iter()
            .map(|(client_id, (stamp, _))| (stamp.clone(), client_id.clone()))
            .collect();
        by_age.sort_unstable();
        let excess = c.claims.superseded.len() - CLAIMS_SUPERSEDED_KEPT * 9 / 10;
        by_age.truncate(excess);
        for (_, client_id) in &by_age {
            c.claims.superseded.remove(client_id);
        }
        for (_, client_id) in by_age {
            self.persist(Key::SupersededClaim { client_id }.encode(), None);
        }
    }

    /// This node's own last claim on `client_id` that another node's claim replaced, as a
    /// session it ships there carries it ([`crate::link::SessionTransfer::by`]).
    pub(super) fn superseded_claim(&self, client_id: &str) -> Option<ClaimUpdate> {
        let c = self.cluster.as_ref()?;
        let (stamp, claim) = c.claims.superseded.get(client_id)?;
        Some(ClaimUpdate {
            client_id: client_id.to_owned(),
            stamp: stamp.clone(),
            claim: Some(claim.clone()),
        })
    }

    /// A superseded own claim read back from storage ([`Key::SupersededClaim`]).
    pub(in crate::broker) fn restore_superseded_claim(
        &mut self,
        client_id: String,
        value: &[u8],
    ) -> Result<(), RecordError> {
        let (stamp, claim) = decode_claim(value)?;
        let Some(claim) = claim else {
            return Err(RecordError {
                kind: "superseded claim",
                detail: "a release",
            });
        };
        if let Some(c) = &mut self.cluster {
            c.claims.superseded.insert(client_id, (stamp, claim));
        }
        Ok(())
    }

    /// A claim record read back from storage.
    pub(in crate::broker) fn restore_claim(
        &mut self,
        client_id: &str,
        value: &[u8],
    ) -> Result<(), RecordError> {
        let (stamp, claim) = decode_claim(value)?;
        let Some(c) = &mut self.cluster else {
            return Ok(());
        };
        c.hlc.observe(stamp.hlc, 0);
        c.claims.apply(&ClaimUpdate {
            client_id: client_id.to_owned(),
            stamp,
            claim,
        });
        Ok(())
    }

    /// The node that holds `client_id`'s claim, for admin tools and tests: `None` when no
    /// live claim is known.
    pub fn claim_owner(&self, client_id: &str) -> Option<NodeId> {
        let c = self.cluster.as_ref()?;
        c.claims.live(client_id).map(|(s, _)| s.node.clone())
    }

    /// Live claims known here (the `claims` figure).
    pub(in crate::broker) fn claims_held(&self) -> usize {
        self.cluster.as_ref().map_or(0, |c| c.claims.live)
    }
}
