//! One owner per client id across the deployment, and sessions that follow their clients.
//!
//! The node a client connects to serves it at once and claims its client id: a [`Claim`]
//! stamped with its hybrid logical clock, sent to every mesh peer. Every node keeps the claim
//! with the greatest stamp per client id (last writer wins, like retained messages), so
//! simultaneous claims resolve the same way everywhere. A node that holds the session of a
//! client id another node claimed closes the client's connection (0x8E Session taken over)
//! and, if the claim asks to resume it and comes from the same user, ships the session there
//! as its storage records ([`Frame::SessionTransfer`]); otherwise the session ends where it
//! was. A session that ends lets go of its claim (a tombstone).
//!
//! A shipped session is kept (as one record) until the claiming node answers that it took it
//! ([`Frame::SessionTaken`]), and sent again on every new link session until then; the taker
//! remembers which transfers it took, so that a transfer sent twice is taken once.
//!
//! A client that resumes on a node that does not hold its session, while a claim of the same
//! user elsewhere says one exists, gets Session Present and keeps its own session state: the
//! node sends it no QoS 1/2 message until the session arrives (or
//! [`ClusterConfig::session_transfer_wait_ms`](super::ClusterConfig::session_transfer_wait_ms)
//! passes), so that the messages the old node had in flight keep their packet ids.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::{BufMut, Bytes, BytesMut};

use super::trust::{PeerFault, PeerLimit};
use super::{Cluster, Peer};
use crate::broker::io::{DisconnectCause, Event};
use crate::broker::message::Delivery;
use crate::broker::persist::{self, Key, RecordError, SessionRecord};
use crate::broker::session::{Inflight, InflightState, SessionId, SubscriptionEntry};
use crate::broker::{Authenticator, Authorizer, Broker, ClientRef, FilterAccess, Timer};
use crate::codec::ReasonCode;
use crate::link::{Claim, ClaimUpdate, Frame, SessionTransfer};
use crate::retained::{Hlc, Stamp};
use crate::routes::NodeId;
use crate::topic::TopicFilter;

/// Bytes of records per [`Frame::SessionTransfer`] part.
const PART_BYTES: usize = 1 << 20;
/// Claims per [`Frame::ClaimSnapshot`].
const SNAPSHOT_CLAIMS: usize = 10_000;
/// Claim tombstones (sessions that ended) remembered, so that a late claim older than the
/// end cannot revive an owner; beyond, the oldest are forgotten.
pub(super) const CLAIM_TOMBSTONES_KEPT: usize = 100_000;
/// Transfers taken that are remembered, so that one sent again is taken once.
const TAKEN_KEPT: usize = 100_000;

/// A session shipped from here, kept until its taker answers.
#[derive(Debug, Clone)]
pub(super) struct Outgoing {
    pub to: NodeId,
    pub records: Vec<(Bytes, Bytes)>,
}

/// The parts of a transfer received so far.
#[derive(Debug)]
pub(super) struct Assembly {
    next: u32,
    records: Vec<(Bytes, Bytes)>,
    bytes: usize,
}

/// A session waited for from another node: its client resumed here while that node held it.
#[derive(Debug, Clone)]
pub(super) struct Awaiting {
    /// When the wait is over.
    until: crate::broker::io::Timestamp,
    /// QoS 2 packet ids the client released (PUBREL) meanwhile: the old node's record of
    /// them, when it comes, is stale.
    released: Vec<u16>,
}

/// Which transfer was taken: its client id, the claim it answered, and its sender.
type TakenKey = (String, Stamp, NodeId);

/// What the cluster keeps about claims and transfers.
#[derive(Debug, Default)]
pub(super) struct Claims {
    /// The greatest claim per client id (tombstones: sessions that ended).
    pub map: crate::retained::LwwMap<Claim>,
    /// Live claims held per claimer other than this node.
    by_node: BTreeMap<NodeId, usize>,
    /// Sessions shipped from here, by client id and the claim they answer.
    pub outgoing: BTreeMap<(String, Stamp), Outgoing>,
    /// Transfers arriving, by sender, client id and claim.
    incoming: BTreeMap<(NodeId, String, Stamp), Assembly>,
    /// Transfers taken, oldest first, and the same as a set.
    taken: VecDeque<TakenKey>,
    taken_set: BTreeSet<TakenKey>,
    /// Sessions of clients that resumed here, waited for from another node, by client id.
    awaiting: BTreeMap<std::sync::Arc<str>, Awaiting>,
}

impl Claims {
    /// The live claim on `client_id`, with its stamp.
    pub fn live(&self, client_id: &str) -> Option<(&Stamp, &Claim)> {
        let e = self.map.get(client_id)?;
        Some((&e.stamp, e.value.as_ref()?))
    }

    fn count(&mut self, claim: Option<(&Stamp, bool)>, delta: isize) {
        let Some((stamp, true)) = claim else { return };
        let n = self.by_node.entry(stamp.node.clone()).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            self.by_node.remove(&stamp.node);
        }
    }

    /// Apply a claim that wins over what is held (the caller checked), keeping the count of
    /// live claims per claimer (`me`'s own are not counted).
    fn apply(&mut self, me: &NodeId, update: &ClaimUpdate) {
        let old = self
            .map
            .get(&update.client_id)
            .map(|e| (e.stamp.clone(), e.value.is_some()));
        if let Some((stamp, live)) = &old
            && stamp.node != *me
        {
            self.count(Some((stamp, *live)), -1);
        }
        self.map.apply(
            &update.client_id,
            update.stamp.clone(),
            update.claim.clone(),
        );
        if update.stamp.node != *me {
            self.count(Some((&update.stamp, update.claim.is_some())), 1);
        }
    }

    fn live_of(&self, node: &NodeId) -> usize {
        self.by_node.get(node).copied().unwrap_or(0)
    }

    fn remember_taken(&mut self, key: TakenKey) -> Option<TakenKey> {
        self.taken_set.insert(key.clone());
        self.taken.push_back(key);
        if self.taken.len() > TAKEN_KEPT {
            let old = self.taken.pop_front()?;
            self.taken_set.remove(&old);
            return Some(old);
        }
        None
    }

    /// Bytes of transfers from `peer` being assembled.
    fn assembling_bytes(&self, peer: &NodeId) -> usize {
        self.incoming
            .iter()
            .filter(|((from, _, _), _)| from == peer)
            .map(|(_, a)| a.bytes)
            .sum()
    }

    /// Forget the parts received from `peer` (its link session ended: it sends them again).
    pub fn drop_incoming(&mut self, peer: &NodeId) {
        self.incoming.retain(|(from, _, _), _| from != peer);
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

impl Peer {
    pub(super) fn is_up(&self) -> bool {
        self.connected
    }
}

/// The value of a claim record: stamp, then 0 for a tombstone, or 1, flags and the user.
fn encode_claim(stamp: &Stamp, claim: Option<&Claim>) -> Bytes {
    let mut v = BytesMut::with_capacity(32);
    v.put_u8(1);
    v.put_u64(stamp.hlc.wall_ms);
    v.put_u32(stamp.hlc.logical);
    put_str(&mut v, stamp.node.as_str());
    match claim {
        None => v.put_u8(0),
        Some(c) => {
            v.put_u8(1);
            v.put_u8(u8::from(c.resume) | u8::from(c.persistent) << 1);
            match &c.user {
                None => v.put_u8(0),
                Some(u) => {
                    v.put_u8(1);
                    put_str(&mut v, u);
                }
            }
        }
    }
    v.freeze()
}

fn put_str(v: &mut BytesMut, s: &str) {
    v.put_u16(u16::try_from(s.len()).unwrap_or(u16::MAX));
    v.put_slice(&s.as_bytes()[..s.len().min(usize::from(u16::MAX))]);
}

fn record_err(detail: &'static str) -> RecordError {
    RecordError {
        kind: "claim",
        detail,
    }
}

struct ValueReader<'a>(&'a [u8]);

impl ValueReader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], RecordError> {
        if self.0.len() < n {
            return Err(record_err("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, RecordError> {
        let b = self.take(8)?;
        Ok(u64::from_be_bytes(
            b.try_into().map_err(|_| record_err("truncated"))?,
        ))
    }

    fn u32(&mut self) -> Result<u32, RecordError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes(
            b.try_into().map_err(|_| record_err("truncated"))?,
        ))
    }

    fn string(&mut self) -> Result<String, RecordError> {
        let b = self.take(2)?;
        let n = usize::from(u16::from_be_bytes([b[0], b[1]]));
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| record_err("not UTF-8"))
    }

    fn stamp(&mut self) -> Result<Stamp, RecordError> {
        let hlc = Hlc {
            wall_ms: self.u64()?,
            logical: self.u32()?,
        };
        let node = NodeId::new(&self.string()?).map_err(|_| record_err("bad node id"))?;
        Ok(Stamp { hlc, node })
    }
}

fn decode_claim(value: &[u8]) -> Result<(Stamp, Option<Claim>), RecordError> {
    let mut r = ValueReader(value);
    if r.u8()? != 1 {
        return Err(record_err("unknown format"));
    }
    let stamp = r.stamp()?;
    let claim = match r.u8()? {
        0 => None,
        1 => {
            let flags = r.u8()?;
            let user = match r.u8()? {
                0 => None,
                _ => Some(r.string()?),
            };
            Some(Claim {
                user,
                resume: flags & 1 != 0,
                persistent: flags & 2 != 0,
            })
        }
        _ => return Err(record_err("unknown operation")),
    };
    Ok((stamp, claim))
}

/// The value of a shipped session's record: its taker, then its records, packed.
fn encode_outgoing(out: &Outgoing) -> Bytes {
    let mut v = BytesMut::new();
    v.put_u8(1);
    put_str(&mut v, out.to.as_str());
    v.put_slice(&persist::pack(&out.records));
    v.freeze()
}

fn decode_outgoing(value: &Bytes) -> Result<Outgoing, RecordError> {
    let mut r = ValueReader(value);
    if r.u8()? != 1 {
        return Err(record_err("unknown format"));
    }
    let to = NodeId::new(&r.string()?).map_err(|_| record_err("bad node id"))?;
    let used = value.len() - r.0.len();
    let records = persist::unpack(&value.slice(used..))?;
    Ok(Outgoing { to, records })
}

/// Whether every record is one of `client_id`'s session (session, subscription, message,
/// QoS 2 packet id), so that a transfer cannot write anything else.
fn records_of(client_id: &str, records: &[(Bytes, Bytes)]) -> bool {
    records.iter().all(|(key, _)| match Key::decode(key) {
        Ok(
            Key::Session { client_id: c }
            | Key::Subscription { client_id: c, .. }
            | Key::Queued { client_id: c, .. }
            | Key::Incoming { client_id: c, .. }
            | Key::Seen { client_id: c },
        ) => c == client_id,
        _ => false,
    })
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// Whether the claims known here refuse `client_id` to `user`: a live claim of another
    /// node belongs to another user (the session is theirs).
    pub(in crate::broker) fn claim_refuses(&self, client_id: &str, user: Option<&str>) -> bool {
        let Some(c) = &self.cluster else { return false };
        c.claims.live(client_id).is_some_and(|(stamp, claim)| {
            stamp.node != c.owner.node && claim.user.as_deref() != user
        })
    }

    /// Whether the claims known here say another node holds the session a resuming client
    /// of `user` left there.
    pub(in crate::broker) fn session_elsewhere(&self, client_id: &str, user: Option<&str>) -> bool {
        let Some(c) = &self.cluster else { return false };
        c.claims.live(client_id).is_some_and(|(stamp, claim)| {
            stamp.node != c.owner.node && claim.persistent && claim.user.as_deref() == user
        })
    }

    /// A client connected here: claim its client id, and tell the mesh.
    pub(in crate::broker) fn claim_client(
        &mut self,
        client_id: &str,
        user: Option<&str>,
        resume: bool,
        persistent: bool,
    ) {
        let now = self.now;
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
            }),
        };
        self.publish_claim(update);
    }

    /// A session ended here: let go of its client id, if this node's claim is the one that
    /// stands.
    pub(in crate::broker) fn release_claim(&mut self, client_id: &str) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let ours = c
            .claims
            .live(client_id)
            .is_some_and(|(stamp, _)| stamp.node == c.owner.node);
        if !ours {
            return;
        }
        let update = ClaimUpdate {
            client_id: client_id.to_owned(),
            stamp: Stamp {
                hlc: c.hlc.tick(now.as_millis()),
                node: c.owner.node.clone(),
            },
            claim: None,
        };
        self.publish_claim(update);
    }

    fn publish_claim(&mut self, update: ClaimUpdate) {
        let Some(c) = &mut self.cluster else { return };
        let me = c.owner.node.clone();
        c.claims.apply(&me, &update);
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
        let Some(c) = &mut self.cluster else { return };
        let ahead_ms = update.stamp.hlc.wall_ms.saturating_sub(now.as_millis());
        if ahead_ms > c.config.max_clock_drift_ms {
            self.peer_fault(peer, PeerFault::ClockAhead);
            return;
        }
        if c.claims
            .map
            .get(&update.client_id)
            .is_some_and(|e| e.stamp >= update.stamp)
        {
            return;
        }
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
        let me = c.owner.node.clone();
        c.hlc.observe(update.stamp.hlc, now.as_millis());
        c.claims.apply(&me, &update);
        self.persist_claim(&update);
        self.prune_claim_tombstones();
        if let (Some(claim), Some(&sid)) = (
            &update.claim,
            self.by_client_id.get(update.client_id.as_str()),
        ) {
            self.hand_over(sid, &update.stamp, claim);
        }
    }

    /// Another node claimed the client id of a session held here: close its connection
    /// (0x8E; its will follows the usual rules) and ship the session to the claimer, or end
    /// it here if the claim does not resume it or is another user's.
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
        if !(claim.resume && same_user) {
            return self.end_session(sid);
        }
        self.move_session(sid, stamp);
    }

    /// Ship a session to the node whose claim (`stamp`) took it over, and let it go here.
    fn move_session(&mut self, sid: SessionId, stamp: &Stamp) {
        // The client connected again there: a will waiting here is not sent (MQTT-3.1.3-9).
        self.cancel_session_timers(sid);
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        session.pending_will = None;
        let client_id = session.client_id.to_string();
        let mut records = crate::broker::resume::session_records(session);
        records.extend(self.seen_record(&client_id));
        self.vacate_session(sid);
        self.start_relay(sid, &client_id, &stamp.node, stamp);
        let out = Outgoing {
            to: stamp.node.clone(),
            records,
        };
        let key = Key::Transfer {
            client_id: client_id.clone(),
            claim: stamp.clone(),
        };
        self.persist(key.encode(), Some(encode_outgoing(&out)));
        self.stats.sessions_moved_out += 1;
        self.event(Event::SessionMoved {
            client_id: client_id.clone(),
            to: stamp.node.clone(),
        });
        let Some(c) = &mut self.cluster else { return };
        let up = c.peers.get(&out.to).is_some_and(Peer::is_up);
        let to = out.to.clone();
        c.claims
            .outgoing
            .insert((client_id.clone(), stamp.clone()), out);
        if up {
            self.send_transfer(&to, &client_id, stamp);
        }
    }

    /// Send a shipped session's parts.
    fn send_transfer(&mut self, to: &NodeId, client_id: &str, claim: &Stamp) {
        let Some(c) = &self.cluster else { return };
        let Some(out) = c
            .claims
            .outgoing
            .get(&(client_id.to_owned(), claim.clone()))
        else {
            return;
        };
        let mut parts: Vec<Vec<(Bytes, Bytes)>> = vec![Vec::new()];
        let mut bytes = 0;
        for record in &out.records {
            let size = record.0.len() + record.1.len();
            if bytes + size > PART_BYTES && parts.last().is_some_and(|p| !p.is_empty()) {
                parts.push(Vec::new());
                bytes = 0;
            }
            bytes += size;
            if let Some(part) = parts.last_mut() {
                part.push(record.clone());
            }
        }
        let count = u32::try_from(parts.len()).unwrap_or(u32::MAX);
        for (index, records) in parts.into_iter().enumerate() {
            let frame = Frame::SessionTransfer(SessionTransfer {
                client_id: client_id.to_owned(),
                claim: claim.clone(),
                index: u32::try_from(index).unwrap_or(u32::MAX),
                count,
                records,
            });
            self.send_to_peer(to.clone(), frame);
        }
    }

    /// A link to `peer` came up: tell it this node's own claims, and send the sessions
    /// shipped to it that it has not taken yet.
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
        let shipped: Vec<(String, Stamp)> = c
            .claims
            .outgoing
            .iter()
            .filter(|(_, o)| o.to == *peer)
            .map(|(k, _)| k.clone())
            .collect();
        for chunk in own.chunks(SNAPSHOT_CLAIMS) {
            self.send_to_peer(peer.clone(), Frame::ClaimSnapshot(chunk.to_vec()));
        }
        for (client_id, claim) in shipped {
            self.send_transfer(peer, &client_id, &claim);
        }
    }

    /// A part of a session `peer` ships here.
    pub(super) fn on_session_transfer(&mut self, peer: &NodeId, t: SessionTransfer) {
        let Some(c) = &mut self.cluster else { return };
        let key = (peer.clone(), t.client_id.clone(), t.claim.clone());
        let size: usize = t.records.iter().map(|(k, v)| k.len() + v.len()).sum();
        if t.index == 0 {
            c.claims.incoming.remove(&key);
        }
        let assembled = c.claims.assembling_bytes(peer);
        if assembled.saturating_add(size) > c.config.peer_limits.max_transfer_bytes {
            c.claims.drop_incoming(peer);
            self.peer_fault(peer, PeerFault::OverLimit(PeerLimit::TransferBytes));
            return;
        }
        let Some(c) = &mut self.cluster else { return };
        let assembly = c.claims.incoming.entry(key.clone()).or_insert(Assembly {
            next: 0,
            records: Vec::new(),
            bytes: 0,
        });
        if assembly.next != t.index {
            // A part out of order (a part lost with a link session): wait for the sender's
            // next attempt, from its first part.
            c.claims.incoming.remove(&key);
            return;
        }
        assembly.next += 1;
        assembly.bytes += size;
        assembly.records.extend(t.records);
        if assembly.next < t.count {
            return;
        }
        let Some(assembly) = c.claims.incoming.remove(&key) else {
            return;
        };
        self.take_session(peer, &t.client_id, &t.claim, assembly.records);
    }

    /// A whole session shipped by `peer` for this node's claim `claim` on `client_id`.
    fn take_session(
        &mut self,
        peer: &NodeId,
        client_id: &str,
        claim: &Stamp,
        records: Vec<(Bytes, Bytes)>,
    ) {
        let taken_key = (client_id.to_owned(), claim.clone(), peer.clone());
        let Some(c) = &mut self.cluster else { return };
        let answer = Frame::SessionTaken {
            client_id: client_id.to_owned(),
            claim: claim.clone(),
        };
        if c.claims.taken_set.contains(&taken_key) {
            self.send_to_peer(peer.clone(), answer);
            return;
        }
        if !records_of(client_id, &records) {
            self.stats.sessions_transfers_refused += 1;
            self.peer_fault(
                peer,
                PeerFault::NotOwner(crate::link::FrameKind::SessionTransfer),
            );
            return;
        }
        let winner = c
            .claims
            .map
            .get(client_id)
            .map(|e| (e.stamp.clone(), e.value.clone()));
        let me = c.owner.node.clone();
        match winner {
            // Claimed since by another node: the session goes on there (what the sender may
            // still relay meanwhile has nowhere to go here: it ends its relay at once).
            Some((stamp, Some(_))) if stamp.node != me => {
                self.forward_transfer(client_id, &stamp, records);
                self.send_to_peer(
                    peer.clone(),
                    Frame::SessionRouted {
                        client_id: client_id.to_owned(),
                        claim: claim.clone(),
                    },
                );
            }
            // This node's claim stands: the session joins the one here, and what the sender
            // relays until the routes moved joins it too.
            Some((_, Some(claim_now))) => {
                if self.merge_session(peer, client_id, claim, &claim_now, records) {
                    self.session_arrived(peer, client_id, claim);
                }
            }
            // The session ended here since (or was never claimed): nothing to join.
            _ => self.stats.sessions_transfers_refused += 1,
        }
        self.remember_taken(taken_key);
        self.send_to_peer(peer.clone(), answer);
    }

    fn remember_taken(&mut self, key: TakenKey) {
        let Some(c) = &mut self.cluster else { return };
        let forgotten = c.claims.remember_taken(key.clone());
        self.persist(
            Key::TransferTaken {
                client_id: key.0,
                claim: key.1,
                from: key.2.to_string(),
            }
            .encode(),
            Some(persist::marker()),
        );
        if let Some((client_id, claim, from)) = forgotten {
            let key = Key::TransferTaken {
                client_id,
                claim,
                from: from.to_string(),
            };
            self.persist(key.encode(), None);
        }
    }

    /// A session that arrived for a claim another node has since won: shipped on to it.
    fn forward_transfer(&mut self, client_id: &str, stamp: &Stamp, records: Vec<(Bytes, Bytes)>) {
        let out = Outgoing {
            to: stamp.node.clone(),
            records,
        };
        let key = Key::Transfer {
            client_id: client_id.to_owned(),
            claim: stamp.clone(),
        };
        self.persist(key.encode(), Some(encode_outgoing(&out)));
        let Some(c) = &mut self.cluster else { return };
        let up = c.peers.get(&out.to).is_some_and(Peer::is_up);
        let to = out.to.clone();
        c.claims
            .outgoing
            .insert((client_id.to_owned(), stamp.clone()), out);
        if up {
            self.send_transfer(&to, client_id, stamp);
        }
    }

    /// Join a shipped session to the one held here (made by the claim's CONNECT): its
    /// subscriptions, as this node's access rules allow; its messages, in their order, with
    /// their packet ids if the client kept its session state (it was told Session Present
    /// and waits for them); its QoS 2 packet ids waiting for PUBREL. Its will is not sent:
    /// the client connected again.
    fn merge_session(
        &mut self,
        from: &NodeId,
        client_id: &str,
        claim_stamp: &Stamp,
        claim: &Claim,
        records: Vec<(Bytes, Bytes)>,
    ) -> bool {
        let sid = match self.by_client_id.get(client_id).copied() {
            Some(sid) => sid,
            None => {
                // The claim stands, but its session is gone (expired before the transfer came):
                // nothing to join.
                self.stats.sessions_transfers_refused += 1;
                return false;
            }
        };
        let mut session_record = None;
        let mut subscriptions = Vec::new();
        let mut messages = BTreeMap::new();
        let mut incoming = Vec::new();
        let mut seen = Vec::new();
        for (key, value) in &records {
            let Ok(key) = Key::decode(key) else { continue };
            match key {
                Key::Seen { .. } => seen = super::relay::decode_seen(value).unwrap_or_default(),
                Key::Session { .. } => session_record = SessionRecord::decode(value).ok(),
                Key::Subscription { filter, .. } => {
                    if let (Ok(entry), Ok(filter)) = (
                        persist::decode_subscription(value),
                        TopicFilter::with_limits(filter.as_str(), &self.topic_limits),
                    ) {
                        subscriptions.push((filter, entry));
                    }
                }
                Key::Queued { seq, .. } => {
                    if let Ok(record) = persist::decode_queued(value) {
                        messages.insert(seq, record);
                    }
                }
                Key::Incoming { packet_id, .. } => incoming.push(packet_id),
                _ => {}
            }
        }
        let Some(record) = session_record else {
            self.stats.sessions_transfers_refused += 1;
            return false;
        };
        if record.username.as_deref() != claim.user.as_deref() {
            self.stats.sessions_transfers_refused += 1;
            return false;
        }
        let waiting = self
            .cluster
            .as_mut()
            .and_then(|c| c.claims.awaiting.remove(client_id));
        // Relays from the sender may follow; what the session had before it left there comes
        // no second time.
        self.open_window(from, client_id, claim_stamp, seen);
        for (filter, entry) in subscriptions {
            self.add_transferred_subscription(sid, &filter, entry);
        }
        for (_, record) in messages {
            let topic = record.delivery.message.topic.clone();
            if !self.may_receive(sid, &topic) {
                continue;
            }
            match (record.inflight, &waiting) {
                (Some((packet_id, state)), Some(_)) => {
                    self.restore_inflight(sid, packet_id, state, record.delivery)
                }
                // The client dropped its session state (no Session Present): a QoS 2 message
                // it acknowledged with PUBREC is its own already.
                (Some((_, InflightState::AwaitComp)), None) => {}
                _ => self.deliver(sid, record.delivery, &mut None),
            }
        }
        if let Some(w) = &waiting {
            for packet_id in incoming {
                if !w.released.contains(&packet_id) {
                    self.keep_incoming(sid, packet_id);
                }
            }
        }
        self.stats.sessions_moved_in += 1;
        self.event(Event::SessionArrived {
            client_id: client_id.to_owned(),
        });
        self.pump(sid);
        true
    }

    /// A subscription that came with a shipped session, as the access rules here allow.
    fn add_transferred_subscription(
        &mut self,
        sid: SessionId,
        filter: &TopicFilter,
        entry: SubscriptionEntry,
    ) {
        let Some(session) = self.session(sid) else {
            return;
        };
        if session.subscriptions.contains_key(filter.as_str()) {
            // Subscribed again on this node: the client's latest wins.
            return;
        }
        if session.subscriptions.len() >= self.config.max_subscriptions_per_client
            || self.route_set_full(filter.pattern())
        {
            return;
        }
        let client = ClientRef {
            client_id: &session.client_id,
            username: session.username.as_deref(),
        };
        let filtered = match self.authorizer.may_subscribe(&client, filter) {
            FilterAccess::Allowed => false,
            FilterAccess::Filtered => true,
            FilterAccess::Denied => return,
        };
        self.add_subscription(sid, filter, entry, filtered);
    }

    /// An in-flight message of a shipped session, with its packet id (re-sent with DUP, or its
    /// PUBREL), stored as the session's own.
    fn restore_inflight(
        &mut self,
        sid: SessionId,
        packet_id: u16,
        state: InflightState,
        delivery: Delivery,
    ) {
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        if session.inflight.holds(packet_id) {
            // Given out here meanwhile (the wait was over): delivered as a new message.
            if state == InflightState::AwaitAck {
                self.deliver(sid, delivery, &mut None);
            }
            return;
        }
        let seq = session.take_seq();
        if session.is_persistent() {
            session.persisted = true;
            let key = Key::Queued {
                client_id: session.client_id.to_string(),
                seq,
            };
            let value = persist::encode_queued(Some((packet_id, state)), &delivery);
            session.inflight.push(Inflight {
                packet_id,
                state,
                delivery,
                seq,
                sent: false,
            });
            self.persist(key.encode(), Some(value));
        } else {
            session.inflight.push(Inflight {
                packet_id,
                state,
                delivery,
                seq,
                sent: false,
            });
        }
    }

    /// A QoS 2 packet id the client sent the old node and has not released yet.
    fn keep_incoming(&mut self, sid: SessionId, packet_id: u16) {
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        if session.incoming_qos2.contains(packet_id) {
            return;
        }
        session.incoming_qos2.insert(packet_id);
        if session.is_persistent() {
            session.persisted = true;
            let key = Key::Incoming {
                client_id: session.client_id.to_string(),
                packet_id,
            };
            self.persist(key.encode(), Some(persist::marker()));
        }
    }

    /// `peer` took the session shipped for its claim: let go of it here.
    pub(super) fn on_session_taken(&mut self, peer: &NodeId, client_id: String, claim: Stamp) {
        let Some(c) = &mut self.cluster else { return };
        let key = (client_id, claim);
        if c.claims.outgoing.get(&key).is_none_or(|o| o.to != *peer) {
            return;
        }
        c.claims.outgoing.remove(&key);
        let (client_id, claim) = key;
        self.persist(Key::Transfer { client_id, claim }.encode(), None);
    }

    /// A resuming client whose session is on another node: no QoS 1/2 message goes to it
    /// until the session arrives or the wait is over.
    pub(in crate::broker) fn await_transfer(&mut self, sid: SessionId) {
        let Some(client_id) = self.session(sid).map(|s| s.client_id.clone()) else {
            return;
        };
        let Some(c) = &mut self.cluster else { return };
        let until = self.now.plus_ms(c.config.session_transfer_wait_ms);
        c.claims.awaiting.insert(
            client_id,
            Awaiting {
                until,
                released: Vec::new(),
            },
        );
        self.timers.insert((until, Timer::TransferWait(sid)));
    }

    /// Whether a session waits for its state from another node (no QoS 1/2 message goes to
    /// its client meanwhile).
    pub(in crate::broker) fn awaits_transfer(&self, sid: SessionId) -> bool {
        let Some(c) = &self.cluster else { return false };
        !c.claims.awaiting.is_empty()
            && self
                .session(sid)
                .is_some_and(|s| c.claims.awaiting.contains_key(&s.client_id))
    }

    /// The client released (PUBREL) a QoS 2 packet id while its session was on its way.
    pub(in crate::broker) fn released_before_transfer(&mut self, sid: SessionId, packet_id: u16) {
        let Some(client_id) = self.session(sid).map(|s| s.client_id.clone()) else {
            return;
        };
        if let Some(w) = self
            .cluster
            .as_mut()
            .and_then(|c| c.claims.awaiting.get_mut(&client_id))
        {
            w.released.push(packet_id);
        }
    }

    /// A session that ends or leaves waits for nothing.
    pub(in crate::broker) fn forget_transfer_wait(&mut self, client_id: &str) {
        if let Some(c) = &mut self.cluster
            && !c.claims.awaiting.is_empty()
        {
            c.claims.awaiting.remove(client_id);
        }
    }

    /// The wait for a session from another node is over: what waited here goes out now
    /// (a session that arrives later still joins, as for a client without session state).
    pub(in crate::broker) fn transfer_wait_over(&mut self, sid: SessionId) {
        let now = self.now;
        let Some(client_id) = self.session(sid).map(|s| s.client_id.clone()) else {
            return;
        };
        let Some(c) = &mut self.cluster else { return };
        // A slot given to another session since, or a later wait, is not this timer's.
        if c.claims
            .awaiting
            .get(&client_id)
            .is_some_and(|w| w.until <= now)
        {
            c.claims.awaiting.remove(&client_id);
            self.stats.sessions_transfer_waits_over += 1;
            self.pump(sid);
        }
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
        let me = c.owner.node.clone();
        c.hlc.observe(stamp.hlc, 0);
        c.claims.apply(
            &me,
            &ClaimUpdate {
                client_id: client_id.to_owned(),
                stamp,
                claim,
            },
        );
        Ok(())
    }

    /// A shipped session read back from storage: sent again when its taker's link is up.
    pub(in crate::broker) fn restore_transfer(
        &mut self,
        client_id: &str,
        claim: Stamp,
        value: &Bytes,
    ) -> Result<(), RecordError> {
        let out = decode_outgoing(value)?;
        if let Some(c) = &mut self.cluster {
            c.claims.outgoing.insert((client_id.to_owned(), claim), out);
        }
        Ok(())
    }

    /// A taken-transfer marker read back from storage.
    pub(in crate::broker) fn restore_taken(&mut self, client_id: String, claim: Stamp, from: &str) {
        let Ok(from) = NodeId::new(from) else { return };
        if let Some(c) = &mut self.cluster {
            c.claims.remember_taken((client_id, claim, from));
        }
    }

    /// The node that holds `client_id`'s claim, for admin tools and tests: `None` when no
    /// live claim is known.
    pub fn claim_owner(&self, client_id: &str) -> Option<NodeId> {
        let c = self.cluster.as_ref()?;
        c.claims.live(client_id).map(|(s, _)| s.node.clone())
    }

    /// Live claims known here (the `claims` figure).
    pub(in crate::broker) fn claims_held(&self) -> usize {
        self.cluster.as_ref().map_or(0, |c| {
            c.claims
                .map
                .iter()
                .filter(|(_, e)| e.value.is_some())
                .count()
        })
    }

    /// Sessions shipped from here that their taker has not answered yet.
    pub fn sessions_in_transit(&self) -> usize {
        self.cluster.as_ref().map_or(0, |c| c.claims.outgoing.len())
    }
}
