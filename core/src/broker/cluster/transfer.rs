//! Sessions shipped to the node that claimed their client id ([`super::claims`]).
//!
//! The session travels as the records it is stored as ([`Frame::SessionTransfer`], in parts
//! of at most a mebibyte), is kept on disk (as one record) until the claiming node answers
//! that it took it ([`Frame::SessionTaken`]), and is sent again on every new link session until
//! then; the taker remembers which shipments it took, so that a transfer sent twice is taken
//! once. A node that is sent a session claimed since by another passes it on as the same
//! shipment ([`SessionTransfer::shipment`]).
//!
//! A client that resumes on a node that does not hold its session, while a claim of the same
//! user elsewhere says one exists, gets Session Present and keeps its own session state: the
//! node sends it no QoS 1/2 message until the session arrives, so that the messages the old
//! node had in flight keep their packet ids. Past
//! [`ClusterConfig::session_transfer_wait_ms`](super::ClusterConfig::session_transfer_wait_ms)
//! (the old node is cut off), QoS 0 and 1 messages go; QoS 2 ones still wait, since the
//! client may hold packet ids of the old node's QoS 2 messages (PUBREC sent, PUBREL not yet
//! received), and a new message under one of them would be taken for a copy of the old one
//! and never delivered. They go once the session arrives (or the old node is forgotten).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::{BufMut, Bytes, BytesMut};

use super::claims::{decode_claim, encode_claim};
use super::relay::Arrived;
use super::trust::{PeerFault, PeerLimit};
use crate::broker::ClientId;
use crate::broker::io::Event;
use crate::broker::message::Delivery;
use crate::broker::persist::{self, Key, RecordError, SessionRecord};
use crate::broker::session::{Inflight, InflightState, SessionId, SubscriptionEntry};
use crate::broker::{Authenticator, Authorizer, Broker, ClientRef, FilterAccess, Timer};
use crate::codec::QoS;
use crate::link::{Claim, ClaimUpdate, Frame, FrameKind, SessionTransfer};
use crate::read::Fields;
use crate::retained::Stamp;
use crate::routes::NodeId;
use crate::topic::TopicFilter;

/// Bytes of records per [`Frame::SessionTransfer`] part.
const PART_BYTES: usize = 1 << 20;
/// Transfers taken that are remembered, so that one sent again is taken once.
const TAKEN_KEPT: usize = 100_000;

/// A session shipped from here, kept until its taker answers.
#[derive(Debug, Clone)]
pub(super) struct Outgoing {
    pub to: NodeId,
    /// The taker's claim it answers.
    pub claim: Stamp,
    /// This node's own claim the taker's replaced ([`SessionTransfer::by`]).
    pub by: Option<ClaimUpdate>,
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
    /// The wait ran out: QoS 0 and 1 messages go, QoS 2 ones still wait.
    over: bool,
    /// The node whose claim said it held the session.
    holder: NodeId,
}

/// Which transfer was taken: its client id, its shipment, and its sender.
type TakenKey = (String, Stamp, NodeId);

/// Sessions on their way between this node and others.
#[derive(Debug, Default)]
pub(super) struct Transfers {
    /// Sessions shipped from here, by client id and shipment.
    pub outgoing: BTreeMap<(String, Stamp), Outgoing>,
    /// Transfers arriving, by sender, client id and shipment.
    incoming: BTreeMap<(NodeId, String, Stamp), Assembly>,
    /// Transfers taken, oldest first, and the same as a set.
    taken: VecDeque<TakenKey>,
    taken_set: BTreeSet<TakenKey>,
    /// Sessions of clients that resumed here, waited for from another node, by client id.
    awaiting: BTreeMap<ClientId, Awaiting>,
    /// Clients told Session Present here while their session was on another node: they kept
    /// their session state, so what arrives of the session keeps its packet ids. With the
    /// QoS 2 packet ids they released (PUBREL) meanwhile: the old node's record of those is
    /// stale.
    resumed: BTreeMap<ClientId, BTreeSet<u16>>,
}

impl Transfers {
    /// Whether no session is waited for.
    pub fn awaiting_none(&self) -> bool {
        self.awaiting.is_empty()
    }

    /// Whether `client_id`'s session is waited for, and the wait is not over.
    pub fn awaits(&self, client_id: &str) -> bool {
        !self.awaiting.is_empty() && self.awaiting.get(client_id).is_some_and(|w| !w.over)
    }

    /// The node `client_id`'s session is waited for from.
    pub fn holder(&self, client_id: &str) -> Option<&NodeId> {
        self.awaiting.get(client_id).map(|w| &w.holder)
    }

    /// A wait read back from storage (over: a restart ended it).
    pub fn restore_awaiting(
        &mut self,
        client_id: ClientId,
        holder: NodeId,
        now: crate::broker::io::Timestamp,
    ) {
        self.resumed.entry(client_id.clone()).or_default();
        self.awaiting.insert(
            client_id,
            Awaiting {
                until: now,
                over: true,
                holder,
            },
        );
    }

    /// Whether `client_id`'s session is on its way, wait over or not.
    pub fn on_its_way(&self, client_id: &str) -> bool {
        !self.awaiting.is_empty() && self.awaiting.contains_key(client_id)
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

/// The value of a shipped session's record: its taker and the claim it answers, then its
/// records, packed, and among them the claim it was held by (as its own record).
fn encode_outgoing(out: &Outgoing) -> Bytes {
    let mut v = BytesMut::new();
    v.put_u8(1);
    persist::put_string(&mut v, out.to.as_str());
    persist::put_stamp_value(&mut v, &out.claim);
    let by = out.by.as_ref().map(|by| {
        let key = Key::SupersededClaim {
            client_id: by.client_id.clone(),
        };
        (key.encode(), encode_claim(&by.stamp, by.claim.as_ref()))
    });
    v.put_slice(&persist::pack(&[&out.records[..], by.as_slice()].concat()));
    v.freeze()
}

fn decode_outgoing(value: &Bytes) -> Result<Outgoing, RecordError> {
    let mut r = persist::Reader::new("shipped session", value)?;
    let to = r.node()?;
    let claim = r.stamp()?;
    let used = value.len() - r.rest().len();
    let mut records = persist::unpack(&value.slice(used..))?;
    let mut by = None;
    records.retain(|(key, value)| match Key::decode(key) {
        Ok(Key::SupersededClaim { client_id }) => {
            by = decode_claim(value).ok().map(|(stamp, claim)| ClaimUpdate {
                client_id,
                stamp,
                claim,
            });
            false
        }
        _ => true,
    });
    Ok(Outgoing {
        to,
        claim,
        by,
        records,
    })
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
    /// Ship a session to the node whose claim (`stamp`) took it over, and let it go here.
    pub(super) fn move_session(&mut self, sid: SessionId, stamp: &Stamp) {
        // The client connected again there: a will waiting here is not sent (MQTT-3.1.3-9).
        self.cancel_session_timers(sid);
        let Some(session) = self.session_mut(sid) else {
            return;
        };
        session.pending_will = None;
        let client_id = session.client_id.to_string();
        let Some(session) = self.session(sid) else {
            return;
        };
        // Messages a residency rule keeps from the new node's region stay behind (and go).
        let (mut records, withheld) =
            crate::broker::resume::session_records_where(session, |topic| {
                self.cluster
                    .as_ref()
                    .is_none_or(|c| c.residency_allows(topic, &stamp.node))
            });
        self.stats.residency_withheld += withheld;
        // The taker goes through the messages by number: they are numbered in the order the
        // session holds them (held ones were put in their origins' order here).
        let mut n = 0;
        for (key, _) in &mut records {
            if let Ok(Key::Queued { client_id, .. }) = Key::decode(key) {
                n += 1;
                *key = Key::Queued { client_id, seq: n }.encode();
            }
        }
        records.push(self.had_record(&client_id));
        self.vacate_session(sid);
        self.start_relay(sid, &client_id, &stamp.node, stamp);
        self.stats.sessions_moved_out += 1;
        self.event(Event::SessionMoved {
            client_id: client_id.clone(),
            to: stamp.node.clone(),
        });
        let now = self.now.as_millis();
        let Some(c) = &mut self.cluster else { return };
        let shipment = Stamp {
            hlc: c.hlc.tick(now),
            node: c.owner.node.clone(),
        };
        self.ship(&client_id, shipment, stamp, records);
    }

    /// Keep a session's records (stored) until the node whose claim is `claim` takes them,
    /// and send them if its link is up.
    fn ship(
        &mut self,
        client_id: &str,
        shipment: Stamp,
        claim: &Stamp,
        records: Vec<(Bytes, Bytes)>,
    ) {
        let out = Outgoing {
            to: claim.node.clone(),
            claim: claim.clone(),
            by: self.superseded_claim(client_id),
            records,
        };
        let key = Key::Transfer {
            client_id: client_id.to_owned(),
            shipment: shipment.clone(),
        };
        self.persist(key.encode(), Some(encode_outgoing(&out)));
        let Some(c) = &mut self.cluster else { return };
        let up = c.peers.get(&out.to).is_some_and(|p| p.connected);
        let to = out.to.clone();
        c.transfers
            .outgoing
            .insert((client_id.to_owned(), shipment.clone()), out);
        if up {
            self.send_transfer(&to, client_id, &shipment);
        }
    }

    /// Send a shipped session's parts.
    fn send_transfer(&mut self, to: &NodeId, client_id: &str, shipment: &Stamp) {
        let Some(c) = &self.cluster else { return };
        let Some(out) = c
            .transfers
            .outgoing
            .get(&(client_id.to_owned(), shipment.clone()))
        else {
            return;
        };
        let (claim, by) = (out.claim.clone(), out.by.clone());
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
                shipment: shipment.clone(),
                index: u32::try_from(index).unwrap_or(u32::MAX),
                count,
                by: by.clone(),
                records,
            });
            self.send_to_peer(to.clone(), frame);
        }
    }

    /// A link to `peer` came up: send the sessions shipped to it that it has not taken yet.
    pub(super) fn transfers_peer_up(&mut self, peer: &NodeId) {
        let Some(c) = &self.cluster else { return };
        let shipped: Vec<(String, Stamp)> = c
            .transfers
            .outgoing
            .iter()
            .filter(|(_, o)| o.to == *peer)
            .map(|(k, _)| k.clone())
            .collect();
        for (client_id, shipment) in shipped {
            self.send_transfer(peer, &client_id, &shipment);
        }
    }

    /// A part of a session `peer` ships here.
    pub(super) fn on_session_transfer(&mut self, peer: &NodeId, t: SessionTransfer) {
        let Some(c) = &mut self.cluster else { return };
        let key = (peer.clone(), t.client_id.clone(), t.shipment.clone());
        let size: usize = t.records.iter().map(|(k, v)| k.len() + v.len()).sum();
        if t.index == 0 {
            c.transfers.incoming.remove(&key);
        }
        let assembled = c.transfers.assembling_bytes(peer);
        if assembled.saturating_add(size) > c.config.peer_limits.max_transfer_bytes {
            c.transfers.drop_incoming(peer);
            self.peer_fault(peer, PeerFault::OverLimit(PeerLimit::TransferBytes));
            return;
        }
        let Some(c) = &mut self.cluster else { return };
        let assembly = c.transfers.incoming.entry(key.clone()).or_insert(Assembly {
            next: 0,
            records: Vec::new(),
            bytes: 0,
        });
        if assembly.next != t.index {
            // A part out of order (a part lost with a link session): wait for the sender's
            // next attempt, from its first part.
            c.transfers.incoming.remove(&key);
            return;
        }
        assembly.next += 1;
        assembly.bytes += size;
        assembly.records.extend(t.records);
        if assembly.next < t.count {
            return;
        }
        let Some(assembly) = c.transfers.incoming.remove(&key) else {
            return;
        };
        if !self.may_ship_here(peer, &t.client_id, t.by.as_ref()) {
            // Not kept, not answered: a sender with the right to ship it sends it again.
            self.stats.sessions_transfers_refused += 1;
            return self.peer_fault(peer, PeerFault::NotOwner(FrameKind::SessionTransfer));
        }
        self.take_session(peer, &t.client_id, &t.claim, t.shipment, assembly.records);
    }

    /// Whether `peer` may ship `client_id`'s session here: its own claim `by`, which this
    /// node's replaced (its naming the sender and coming first are checked with the frame,
    /// [`super::trust::foreign_origin`]), is one the authorizer vouches for (with operator
    /// keys, a proof that the client logged in there as the claim's user). A sender without
    /// a claim of its own is taken at its word only where claims need no proof.
    fn may_ship_here(&self, peer: &NodeId, client_id: &str, by: Option<&ClaimUpdate>) -> bool {
        match by {
            Some(by) => by
                .claim
                .as_ref()
                .is_some_and(|theirs| self.authorizer.vouches(client_id, peer, theirs)),
            None => {
                let user = self.cluster.as_ref().and_then(|c| {
                    let (_, mine) = c.claims.live(client_id)?;
                    mine.user.clone()
                });
                let unproven = Claim {
                    user,
                    resume: true,
                    persistent: true,
                    proof: None,
                };
                self.authorizer.vouches(client_id, peer, &unproven)
            }
        }
    }

    /// A whole session shipped by `peer` for this node's claim `claim` on `client_id`.
    fn take_session(
        &mut self,
        peer: &NodeId,
        client_id: &str,
        claim: &Stamp,
        shipment: Stamp,
        records: Vec<(Bytes, Bytes)>,
    ) {
        let taken_key = (client_id.to_owned(), shipment.clone(), peer.clone());
        let Some(c) = &mut self.cluster else { return };
        let answer = Frame::SessionTaken {
            client_id: client_id.to_owned(),
            claim: claim.clone(),
            shipment: shipment.clone(),
        };
        if c.transfers.taken_set.contains(&taken_key) {
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
            // Claimed since by another node: the session goes on there, and what the sender
            // still relays for it goes on there too.
            Some((stamp, Some(_))) if stamp.node != me => {
                let subscriptions = self.shipped_subscriptions(&records);
                self.ship(client_id, shipment, &stamp, records);
                self.pass_on_relay(peer, client_id, claim, &stamp);
                self.relay_takes_subscriptions(client_id, subscriptions);
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
        let forgotten = c.transfers.remember_taken(key.clone());
        self.persist(
            Key::TransferTaken {
                client_id: key.0,
                shipment: key.1,
                from: key.2.clone(),
            }
            .encode(),
            Some(persist::marker()),
        );
        if let Some((client_id, claim, from)) = forgotten {
            let key = Key::TransferTaken {
                client_id,
                shipment: claim,
                from,
            };
            self.persist(key.encode(), None);
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
        let subscriptions = self.shipped_subscriptions(&records);
        let mut messages = BTreeMap::new();
        let mut incoming = Vec::new();
        let mut had = super::intake::Intake::default();
        // The sender was itself waiting for the session: what it ships is not all of it.
        let mut more_coming = false;
        for (key, value) in &records {
            let Ok(key) = Key::decode(key) else { continue };
            match key {
                Key::Seen { .. } => {
                    if let Ok(seen) = super::relay::decode_seen(value) {
                        had.merge(&seen.intake);
                        more_coming |= seen.awaiting.is_some();
                    }
                }
                Key::Session { .. } => session_record = SessionRecord::decode(value).ok(),
                Key::Queued { seq, .. } => {
                    if let Ok(record) = persist::decode_queued(value) {
                        messages.insert(seq, record);
                    }
                }
                Key::Incoming { packet_id, .. } => incoming.push(packet_id),
                _ => {}
            }
        }
        // What the session had of this node's own messages is held to what this node
        // published: a sender saying more would have later ones dropped as had.
        let own = self
            .cluster
            .as_ref()
            .map(|c| (c.owner.clone(), c.next_message));
        if let Some((me, next)) = own
            && had.bound_own(&me, next)
        {
            self.peer_fault(from, PeerFault::NotOwner(FrameKind::SessionTransfer));
        }
        let Some(record) = session_record else {
            self.stats.sessions_transfers_refused += 1;
            return false;
        };
        if record.username.as_deref() != claim.user.as_deref() {
            self.stats.sessions_transfers_refused += 1;
            return false;
        }
        // The session was whole here (not waiting for its state, no relay to it running):
        // until now it took each origin's messages in this node's order.
        let settled = self
            .cluster
            .as_ref()
            .is_some_and(|c| !c.transfers.on_its_way(client_id) && !c.moves.has_window(client_id));
        // The client kept its session state (it was told Session Present here): what it
        // holds keeps its packet ids.
        let kept_state = self.cluster.as_mut().and_then(|c| {
            if !more_coming {
                c.transfers.awaiting.remove(client_id);
            }
            c.transfers.resumed.get(client_id).cloned()
        });
        // Relays from the sender may follow; what the session had before it left there comes
        // no second time.
        let shipped_held: BTreeSet<_> = messages
            .values()
            .filter(|m| m.held)
            .filter_map(|m| m.id.clone())
            .collect();
        self.open_window(
            sid,
            from,
            client_id,
            claim_stamp,
            Arrived {
                had: &had,
                held: &shipped_held,
                settled,
            },
        );
        for (filter, entry) in subscriptions {
            self.add_transferred_subscription(sid, &filter, entry);
        }
        self.take_back_relayed(sid, client_id, &had);
        // The relay the shipped messages came by.
        let source = (from.clone(), claim_stamp.clone());
        for (_, record) in messages {
            let topic = record.delivery.message.topic.clone();
            if !self.may_receive(sid, &topic) {
                continue;
            }
            match record.inflight {
                // With its packet id: a client that kept its session state holds it (a QoS 2
                // one it acknowledged with PUBREC is released with PUBREL, never sent again),
                // and one that dropped it answers the PUBREL all the same.
                Some((packet_id, state)) => {
                    self.restore_inflight(sid, packet_id, state, record.delivery)
                }
                // Its place in its origin's order is known: held here while older ones of
                // its origin may still come.
                None => match record.id {
                    Some(id) => {
                        self.deliver_shipped(sid, id, record.delivery, &source, record.held)
                    }
                    None => self.deliver(sid, record.delivery, &mut None),
                },
            }
        }
        // What it says of other nodes' messages is its word only: it counts for what they
        // published before the session came ([`Broker::vouch`]).
        let me = self.node_id().cloned();
        let vouched = had.split_off(|node| Some(node) != me.as_ref() && node != from);
        self.merge_had(client_id, &had);
        self.vouch(client_id, vouched);
        if let Some(released) = &kept_state {
            for packet_id in incoming {
                if !released.contains(&packet_id) {
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

    /// The subscriptions among a shipped session's records.
    fn shipped_subscriptions(
        &self,
        records: &[(Bytes, Bytes)],
    ) -> Vec<(TopicFilter, SubscriptionEntry)> {
        records
            .iter()
            .filter_map(|(key, value)| match Key::decode(key) {
                Ok(Key::Subscription { filter, .. }) => Some((
                    TopicFilter::with_limits(filter.as_str(), &self.topic_limits).ok()?,
                    persist::decode_subscription(value).ok()?,
                )),
                _ => None,
            })
            .collect()
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
        let record = session.is_persistent().then(|| {
            let key = Key::Queued {
                client_id: session.client_id.to_string(),
                seq,
            };
            (
                key,
                persist::encode_queued(Some((packet_id, state)), &delivery),
            )
        });
        session.inflight.push(Inflight {
            packet_id,
            state,
            delivery,
            seq,
            sent: false,
        });
        if let Some((key, value)) = record {
            session.persisted = true;
            self.persist(key.encode(), Some(value));
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

    /// `peer` took the session shipped to it: let go of it here.
    pub(super) fn on_session_taken(&mut self, peer: &NodeId, client_id: String, shipment: Stamp) {
        let Some(c) = &mut self.cluster else { return };
        let key = (client_id, shipment);
        if c.transfers.outgoing.get(&key).is_none_or(|o| o.to != *peer) {
            return;
        }
        c.transfers.outgoing.remove(&key);
        let (client_id, shipment) = key;
        self.persist(
            Key::Transfer {
                client_id,
                shipment,
            }
            .encode(),
            None,
        );
    }

    /// A resuming client whose session `holder` holds (its claim says): no QoS 1/2 message
    /// goes to it until the session arrives or the wait is over, and no QoS 2 one until the
    /// session arrives.
    pub(in crate::broker) fn await_transfer(&mut self, sid: SessionId, holder: NodeId) {
        let Some(client_id) = self.session(sid).map(|s| s.client_id.clone()) else {
            return;
        };
        let Some(c) = &mut self.cluster else { return };
        let until = self.now.plus_ms(c.config.session_transfer_wait_ms);
        c.transfers.resumed.entry(client_id.clone()).or_default();
        c.transfers.awaiting.insert(
            client_id.clone(),
            Awaiting {
                until,
                over: false,
                holder,
            },
        );
        self.timers.insert((until, Timer::TransferWait(sid)));
        self.persist_intake(&client_id);
    }

    /// Whether a message of `qos` waits for a session's state from another node: every QoS
    /// 1/2 message while the wait lasts, QoS 2 ones once it is over.
    pub(in crate::broker) fn transfer_blocks(&self, sid: SessionId, qos: QoS) -> bool {
        let Some(c) = &self.cluster else { return false };
        if c.transfers.awaiting.is_empty() {
            return false;
        }
        self.session(sid)
            .and_then(|s| c.transfers.awaiting.get(&s.client_id))
            .is_some_and(|w| !w.over || qos == QoS::ExactlyOnce)
    }

    /// Whether a session's state is on its way from another node (wait over or not).
    pub(in crate::broker) fn awaits_transfer(&self, sid: SessionId) -> bool {
        let Some(c) = &self.cluster else { return false };
        !c.transfers.awaiting.is_empty()
            && self
                .session(sid)
                .is_some_and(|s| c.transfers.awaiting.contains_key(&s.client_id))
    }

    /// The client released (PUBREL) a QoS 2 packet id while its session was on its way.
    pub(in crate::broker) fn released_before_transfer(&mut self, sid: SessionId, packet_id: u16) {
        let Some(client_id) = self.session(sid).map(|s| s.client_id.clone()) else {
            return;
        };
        if let Some(released) = self
            .cluster
            .as_mut()
            .and_then(|c| c.transfers.resumed.get_mut(&client_id))
        {
            released.insert(packet_id);
        }
    }

    /// A session that ends or leaves waits for nothing.
    pub(in crate::broker) fn forget_transfer_wait(&mut self, client_id: &str) {
        let Some(c) = &mut self.cluster else { return };
        c.transfers.resumed.remove(client_id);
        if c.transfers.awaiting.remove(client_id).is_some() {
            self.persist_intake(client_id);
        }
    }

    /// A node was forgotten: sessions waited for from it come no more.
    pub(super) fn transfers_forget_node(&mut self, node: &NodeId) {
        let Some(c) = &mut self.cluster else { return };
        let gone: Vec<ClientId> = c
            .transfers
            .awaiting
            .iter()
            .filter(|(_, w)| w.holder == *node)
            .map(|(client_id, _)| client_id.clone())
            .collect();
        for client_id in gone {
            if let Some(c) = &mut self.cluster {
                c.transfers.awaiting.remove(&client_id);
            }
            self.persist_intake(&client_id);
            self.release_held(&client_id);
            if let Some(sid) = self.by_client_id.get(client_id.as_str()).copied() {
                self.pump(sid);
            }
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
        if let Some(w) = c.transfers.awaiting.get_mut(&client_id)
            && w.until <= now
            && !w.over
        {
            w.over = true;
            self.stats.sessions_transfer_waits_over += 1;
            self.release_held(&client_id);
            self.pump(sid);
            // What arrived of the session is answered without the rest.
            self.settle_moves();
        }
    }

    /// A shipped session read back from storage: sent again when its taker's link is up.
    pub(in crate::broker) fn restore_transfer(
        &mut self,
        client_id: &str,
        shipment: Stamp,
        value: &Bytes,
    ) -> Result<(), RecordError> {
        let out = decode_outgoing(value)?;
        if let Some(c) = &mut self.cluster {
            c.transfers
                .outgoing
                .insert((client_id.to_owned(), shipment), out);
        }
        Ok(())
    }

    /// A taken-transfer marker read back from storage.
    pub(in crate::broker) fn restore_taken(
        &mut self,
        client_id: String,
        claim: Stamp,
        from: NodeId,
    ) {
        if let Some(c) = &mut self.cluster {
            c.transfers.remember_taken((client_id, claim, from));
        }
    }

    /// Sessions shipped from here that their taker has not answered yet.
    pub fn sessions_in_transit(&self) -> usize {
        self.cluster
            .as_ref()
            .map_or(0, |c| c.transfers.outgoing.len())
    }
}
