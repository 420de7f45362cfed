//! Messages that reach a session's old node while the session moves.
//!
//! When a session is shipped ([`super::claims`]), the other nodes still route its messages to
//! the node it left until they learn the new node's routes. So the old node keeps the
//! session's subscriptions for a while, as a **relay**: what they match goes on to the new
//! node ([`Frame::SessionRelay`], numbered, acknowledged, stored while QoS 1/2 and sent again
//! after a cut). The new node answers [`Frame::SessionRouted`] once every node it knows has
//! its routes. What the others routed to the old node before that may still be on its way
//! (in flight, or queued in their outboxes), so the old node sends every node it knows a
//! [`Frame::Fence`], which each echoes after what it had queued for it; once every echo is in
//! (a node that is away echoes when it is back, or is forgotten), the subscriptions go, and
//! once every relayed message is acknowledged, the relay ends ([`Frame::SessionRelayDone`]).
//!
//! Meanwhile a message can reach the session both ways: sent by its publisher's node to both
//! nodes (it knew both routes at once), or published on the new node and relayed back by the
//! old one. The new node tells them apart by the message's identity in the deployment
//! ([`MessageId`]: origin and number), which it remembers for the session until every relay
//! to it ended: each message is delivered once.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use super::Cluster;
use super::forward::{link_message, link_publish};
use super::trust::PeerFault;
use crate::broker::ClientId;
use crate::broker::io::Timestamp;
use crate::broker::message::Delivery;
use crate::broker::persist::{self, Key, RecordError};
use crate::broker::session::SessionId;
use crate::broker::{Authenticator, Authorizer, Broker};
use crate::codec::QoS;
use crate::link::{Frame, FrameKind, MessageId, SessionRelay};
use crate::read::Fields;
use crate::retained::Stamp;
use crate::routes::{NodeId, Owner};

/// Message identities a session remembers while relays may come: past it, the oldest go.
const SEEN_KEPT: usize = 100_000;

/// A session shipped from here whose subscriptions still catch its messages.
#[derive(Debug)]
pub(super) struct Relay {
    /// The node it went to.
    to: NodeId,
    /// The session slot holding the subscriptions; `None` once they are dropped (or after
    /// a restart, which keeps only the messages still to relay).
    sid: Option<SessionId>,
    /// The number the next relayed message gets.
    next_n: u64,
    /// Relayed messages not yet acknowledged, by number.
    pending: BTreeMap<u64, (Option<MessageId>, Delivery)>,
    /// Once the new node has its routes everywhere: the fence sent to every node this one
    /// knows, and those whose echo is awaited. Once all echoed, what they routed here before
    /// they knew the new node's routes is in, and the subscriptions go.
    fence: Option<(u64, BTreeSet<NodeId>)>,
}

/// What a node that took a session remembers while relays to it may come.
#[derive(Debug, Default)]
pub(super) struct Window {
    /// Relays that may still come: (sender, claim) with the last number taken.
    sources: BTreeMap<(NodeId, Stamp), u64>,
    /// Messages delivered to the session meanwhile.
    seen: BTreeSet<MessageId>,
    order: VecDeque<MessageId>,
}

impl Window {
    /// Whether `id` is new to the session (and now remembered).
    fn first_time(&mut self, id: &MessageId) -> bool {
        if !self.seen.insert(id.clone()) {
            return false;
        }
        self.order.push_back(id.clone());
        if self.order.len() > SEEN_KEPT
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        true
    }
}

/// A node that took a session answers [`Frame::SessionRouted`] once every node it knows has
/// the route-set version that holds its subscriptions.
#[derive(Debug)]
pub(super) struct RoutedAnswer {
    to: NodeId,
    client_id: String,
    claim: Stamp,
    target: Option<u64>,
}

/// Relays, windows and answers, kept by the cluster.
#[derive(Debug, Default)]
pub(super) struct Moves {
    /// Relays from here, by client id and the claim their session went for.
    relays: BTreeMap<(String, Stamp), Relay>,
    /// The relay of each session slot kept for one.
    by_sid: BTreeMap<SessionId, (String, Stamp)>,
    /// Sessions taken here that relays may still come for, by client id.
    windows: BTreeMap<ClientId, Window>,
    answers: Vec<RoutedAnswer>,
    /// The token of the next fence.
    next_token: u64,
}

impl Moves {
    pub fn is_idle(&self) -> bool {
        self.relays.is_empty() && self.windows.is_empty() && self.answers.is_empty()
    }
}

impl Cluster {
    /// Whether every node this one's routes went to has `version` of them.
    fn routes_everywhere(&self, version: u64) -> bool {
        self.peers.keys().all(|p| {
            self.leaves.is_leaf(p) || self.routes.acked(p).is_none_or(|acked| acked >= version)
        })
    }
}

/// A message's identity in a value: origin node, incarnation, number.
fn put_message_id(v: &mut BytesMut, (origin, seq): &MessageId) {
    persist::put_string(v, origin.node.as_str());
    v.put_u64(origin.incarnation);
    v.put_u64(*seq);
}

fn read_message_id(r: &mut persist::Reader<'_>) -> Result<MessageId, RecordError> {
    let node = r.node()?;
    let incarnation = r.u64()?;
    Ok((Owner { node, incarnation }, r.u64()?))
}

/// The value of a relayed message's record: its taker, its identity, then the delivery.
fn encode_relayed(to: &NodeId, id: Option<&MessageId>, delivery: &Delivery) -> Bytes {
    let mut v = BytesMut::new();
    v.put_u8(1);
    persist::put_string(&mut v, to.as_str());
    match id {
        None => v.put_u8(0),
        Some(id) => {
            v.put_u8(1);
            put_message_id(&mut v, id);
        }
    }
    v.put_slice(&persist::encode_queued(None, delivery));
    v.freeze()
}

fn decode_relayed(value: &[u8]) -> Result<(NodeId, Option<MessageId>, Delivery), RecordError> {
    let mut r = persist::Reader::new("relayed message", value)?;
    let to = r.node()?;
    let id = match r.u8()? {
        0 => None,
        _ => Some(read_message_id(&mut r)?),
    };
    let record = persist::decode_queued(r.rest())?;
    Ok((to, id, record.delivery))
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// The identity of the message being routed now, if any ([`MessageId`]).
    pub(in crate::broker) fn routing_id(&self) -> Option<MessageId> {
        self.cluster.as_ref()?.routing.clone()
    }

    /// A message published here is about to be routed: give it this node's next number.
    pub(in crate::broker) fn begin_local_routing(&mut self) {
        if let Some(c) = &mut self.cluster {
            let seq = c.next_message;
            c.next_message += 1;
            c.routing = Some((c.owner.clone(), seq));
        }
    }

    /// A message from another node is about to be routed here, under its own identity.
    pub(super) fn begin_peer_routing(&mut self, id: MessageId) {
        if let Some(c) = &mut self.cluster {
            c.routing = (id.1 > 0).then_some(id);
        }
    }

    pub(in crate::broker) fn end_routing(&mut self) {
        if let Some(c) = &mut self.cluster {
            c.routing = None;
        }
    }

    /// Whether a delivery to `sid` is taken care of here: relayed (the session left), or
    /// dropped (the session had it already, by another way while it moved). `false`: deliver
    /// it as usual.
    pub(in crate::broker) fn moving_delivery(
        &mut self,
        sid: SessionId,
        delivery: &Delivery,
    ) -> bool {
        let Some(c) = &mut self.cluster else {
            return false;
        };
        if c.moves.is_idle() {
            return false;
        }
        if let Some(key) = c.moves.by_sid.get(&sid).cloned() {
            self.relay_delivery(&key, delivery.clone());
            return true;
        }
        let Some(id) = c.routing.clone() else {
            return false;
        };
        let Some(client_id) = self
            .sessions
            .get(sid as usize)
            .and_then(Option::as_ref)
            .map(|s| s.client_id.clone())
        else {
            return false;
        };
        let Some(c) = &mut self.cluster else {
            return false;
        };
        let twice = c
            .moves
            .windows
            .get_mut(&client_id)
            .is_some_and(|w| !w.first_time(&id));
        if twice {
            self.stats.dropped_moved_twice += 1;
        }
        twice
    }

    /// Keep a shipped session's subscriptions on slot `sid`, relaying what they match to the
    /// node it went to, until that node's routes are everywhere.
    pub(super) fn start_relay(
        &mut self,
        sid: SessionId,
        client_id: &str,
        to: &NodeId,
        claim: &Stamp,
    ) {
        let Some(c) = &mut self.cluster else { return };
        let key = (client_id.to_owned(), claim.clone());
        c.moves.by_sid.insert(sid, key.clone());
        c.moves.relays.insert(
            key,
            Relay {
                to: to.clone(),
                sid: Some(sid),
                next_n: 1,
                pending: BTreeMap::new(),
                fence: None,
            },
        );
    }

    fn relay_delivery(&mut self, key: &(String, Stamp), delivery: Delivery) {
        let now = self.now;
        let id = self.routing_id();
        let Some(c) = &mut self.cluster else { return };
        let Some(relay) = c.moves.relays.get(key) else {
            return;
        };
        if !c.residency_allows(&delivery.message.topic, &relay.to) {
            // The session moved to a region this message may not reach.
            self.stats.residency_withheld += 1;
            return;
        }
        let Some(relay) = c.moves.relays.get_mut(key) else {
            return;
        };
        if delivery.qos != QoS::AtMostOnce && relay.pending.len() >= self.config.max_queued_messages
        {
            // What waits for the new node is bounded as the session's queue was.
            self.stats.dropped_queue_full += 1;
            return;
        }
        let n = relay.next_n;
        relay.next_n += 1;
        let to = relay.to.clone();
        let up = c.peers.get(&to).is_some_and(|p| p.connected);
        let frame = relay_frame(key, n, id.as_ref(), &delivery, now);
        if delivery.qos != QoS::AtMostOnce {
            let mut delivery = delivery;
            delivery.message = Arc::new(delivery.message.detached());
            let value = encode_relayed(&to, id.as_ref(), &delivery);
            if let Some(relay) = c.moves.relays.get_mut(key) {
                relay.pending.insert(n, (id, delivery));
            }
            let record = Key::Relay {
                client_id: key.0.clone(),
                claim: key.1.clone(),
                n,
            };
            self.persist(record.encode(), Some(value));
        }
        self.stats.messages_relayed += 1;
        if up {
            self.send_to_peer(to, frame);
        }
    }

    /// The node a session went to has every relayed message up to `n`.
    pub(super) fn on_relay_ack(&mut self, peer: &NodeId, client_id: String, claim: Stamp, n: u64) {
        let Some(c) = &mut self.cluster else { return };
        let key = (client_id, claim);
        let Some(relay) = c.moves.relays.get_mut(&key) else {
            return;
        };
        if relay.to != *peer {
            return;
        }
        let done: Vec<u64> = relay.pending.range(..=n).map(|(n, _)| *n).collect();
        for n in &done {
            relay.pending.remove(n);
        }
        for n in done {
            let record = Key::Relay {
                client_id: key.0.clone(),
                claim: key.1.clone(),
                n,
            };
            self.persist(record.encode(), None);
        }
        self.settle_moves();
    }

    /// The node a session went to routes it everywhere. What the other nodes routed here
    /// before they knew may still be on its way: every node this one knows is sent a fence,
    /// and once all echoed it, the relay's subscriptions go.
    pub(super) fn on_session_routed(&mut self, peer: &NodeId, client_id: String, claim: Stamp) {
        let Some(c) = &mut self.cluster else { return };
        let key = (client_id, claim);
        let token = c.moves.next_token;
        let waiting: BTreeSet<NodeId> = c
            .peers
            .keys()
            .filter(|p| !c.leaves.is_leaf(p))
            .cloned()
            .collect();
        let up: Vec<NodeId> = waiting
            .iter()
            .filter(|p| c.peers.get(*p).is_some_and(|p| p.connected))
            .cloned()
            .collect();
        let Some(relay) = c.moves.relays.get_mut(&key) else {
            return;
        };
        if relay.to != *peer || relay.fence.is_some() {
            return;
        }
        relay.fence = Some((token, waiting));
        c.moves.next_token += 1;
        for p in up {
            self.send_to_peer(p, Frame::Fence { token });
        }
        self.fence_progress(&key);
        self.settle_moves();
    }

    /// A peer asks for a fence: echoed once what waits for it in its outbox is sent.
    pub(super) fn on_fence(&mut self, peer: &NodeId, token: u64) {
        let Some(c) = &mut self.cluster else { return };
        let p = c.peer(peer);
        if p.outbox.has_unsent() {
            // Bounded by the peer's outbox: a fence per queued forward at most matters.
            if p.echoes.len() < 1_024 {
                p.echoes.push(token);
            }
        } else {
            self.send_to_peer(peer.clone(), Frame::FenceEcho { token });
        }
    }

    /// A peer echoed a fence: everything it had routed here before is in.
    pub(super) fn on_fence_echo(&mut self, peer: &NodeId, token: u64) {
        let Some(c) = &mut self.cluster else { return };
        let keys: Vec<(String, Stamp)> = c
            .moves
            .relays
            .iter_mut()
            .filter_map(|(k, r)| {
                let (t, waiting) = r.fence.as_mut()?;
                (*t == token && waiting.remove(peer)).then(|| k.clone())
            })
            .collect();
        for key in keys {
            self.fence_progress(&key);
        }
        self.settle_moves();
    }

    /// Once every fence of a relay is echoed, its subscriptions go.
    fn fence_progress(&mut self, key: &(String, Stamp)) {
        let Some(c) = &mut self.cluster else { return };
        let Some(relay) = c.moves.relays.get_mut(key) else {
            return;
        };
        if !relay.fence.as_ref().is_some_and(|(_, w)| w.is_empty()) {
            return;
        }
        let Some(sid) = relay.sid.take() else { return };
        c.moves.by_sid.remove(&sid);
        self.free_slot(sid);
    }

    /// A route batch went out: the answers waiting for it know their version.
    pub(super) fn moves_flushed(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        if c.moves.answers.is_empty() {
            return;
        }
        let version = c.routes.version();
        for answer in &mut c.moves.answers {
            answer.target.get_or_insert(version);
        }
        self.settle_moves();
    }

    /// Answer the nodes whose sessions' routes are everywhere now, and end the relays that
    /// nothing more can come to.
    pub(in crate::broker) fn settle_moves(&mut self) {
        let Some(c) = &mut self.cluster else { return };
        if c.moves.is_idle() {
            return;
        }
        let answers = std::mem::take(&mut c.moves.answers);
        let (ready, waiting): (Vec<_>, Vec<_>) = answers
            .into_iter()
            .partition(|a| a.target.is_some_and(|t| c.routes_everywhere(t)));
        c.moves.answers = waiting;
        let ended: Vec<(String, Stamp)> = c
            .moves
            .relays
            .iter()
            .filter(|(_, r)| r.pending.is_empty() && r.sid.is_none())
            .map(|(k, _)| k.clone())
            .collect();
        for a in ready {
            self.send_to_peer(
                a.to,
                Frame::SessionRouted {
                    client_id: a.client_id,
                    claim: a.claim,
                },
            );
        }
        for key in ended {
            self.end_relay(&key);
        }
    }

    /// A relay that has nothing more to do: its slot is freed and its taker told.
    fn end_relay(&mut self, key: &(String, Stamp)) {
        let Some(c) = &mut self.cluster else { return };
        let Some(relay) = c.moves.relays.remove(key) else {
            return;
        };
        let up = c.peers.get(&relay.to).is_some_and(|p| p.connected);
        // Sent once: a taker that misses it (its link was down) closes its window with the
        // session, or when this node is forgotten.
        if up {
            self.send_to_peer(
                relay.to,
                Frame::SessionRelayDone {
                    client_id: key.0.clone(),
                    claim: key.1.clone(),
                    last: relay.next_n - 1,
                },
            );
        }
    }

    /// The link to `peer` came up: send again what it has not acknowledged.
    pub(super) fn relays_peer_up(&mut self, peer: &NodeId) {
        let now = self.now;
        let Some(c) = &self.cluster else { return };
        let mut frames = Vec::new();
        for (key, relay) in c.moves.relays.iter() {
            if let Some((token, waiting)) = &relay.fence
                && waiting.contains(peer)
            {
                frames.push(Frame::Fence { token: *token });
            }
            if relay.to != *peer {
                continue;
            }
            for (n, (id, delivery)) in &relay.pending {
                frames.push(relay_frame(key, *n, id.as_ref(), delivery, now));
            }
        }
        for frame in frames {
            self.send_to_peer(peer.clone(), frame);
        }
        self.settle_moves();
    }

    /// A session arrives here from `from` for this node's claim: its relays may follow, and
    /// the messages it was delivered before (`seen`) come no second time.
    pub(super) fn open_window(
        &mut self,
        from: &NodeId,
        client_id: &str,
        claim: &Stamp,
        seen: Vec<MessageId>,
    ) {
        let Some(c) = &mut self.cluster else { return };
        let Ok(key) = ClientId::new(client_id) else {
            return;
        };
        let w = c.moves.windows.entry(key).or_default();
        w.sources.entry((from.clone(), claim.clone())).or_insert(0);
        for id in seen {
            w.first_time(&id);
        }
    }

    /// The session's identities of messages delivered, to ship with it, if relays could
    /// bring any of them again.
    pub(super) fn seen_record(&self, client_id: &str) -> Option<(Bytes, Bytes)> {
        let w = self.cluster.as_ref()?.moves.windows.get(client_id)?;
        let mut v = BytesMut::new();
        v.put_u8(1);
        v.put_u32(u32::try_from(w.order.len()).unwrap_or(u32::MAX));
        for id in &w.order {
            put_message_id(&mut v, id);
        }
        let key = Key::Seen {
            client_id: client_id.to_owned(),
        };
        Some((key.encode(), v.freeze()))
    }

    /// A session arrived here from `from` for this node's claim: `from` is told once this
    /// node's routes for it are everywhere.
    pub(super) fn session_arrived(&mut self, from: &NodeId, client_id: &str, claim: &Stamp) {
        let Some(c) = &mut self.cluster else { return };
        let pending = c.routes.has_pending() || c.leaves.has_pending();
        let version = c.routes.version();
        c.moves.answers.push(RoutedAnswer {
            to: from.clone(),
            client_id: client_id.to_owned(),
            claim: claim.clone(),
            target: (!pending).then_some(version),
        });
        self.settle_moves();
    }

    /// A message the old node of a session relays: delivered to the session here (or to the
    /// relay here, if it moved on), once.
    pub(super) fn on_session_relay(&mut self, peer: &NodeId, r: SessionRelay) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let source = (peer.clone(), r.claim.clone());
        // Only the node that shipped the session here relays to it.
        let Some(last) = c
            .moves
            .windows
            .get_mut(r.client_id.as_str())
            .and_then(|w| w.sources.get_mut(&source))
        else {
            self.peer_fault(peer, PeerFault::NotOwner(FrameKind::SessionRelay));
            return;
        };
        if r.n <= *last {
            // Sent again after a cut: taken already.
            return self.ack_relay(peer, r.client_id, r.claim, r.n);
        }
        *last = r.n;
        let target = self
            .by_client_id
            .get(r.client_id.as_str())
            .copied()
            .or_else(|| {
                let c = self.cluster.as_ref()?;
                c.moves
                    .relays
                    .iter()
                    .find(|((cid, _), relay)| *cid == r.client_id && relay.sid.is_some())
                    .and_then(|(_, relay)| relay.sid)
            });
        let p = r.message;
        if let Some(sid) = target {
            let (qos, retain) = (p.qos, p.retain);
            let message = Arc::new(link_message(p, now));
            let topic = message.topic.clone();
            let delivery = Delivery::new(message, qos, retain, Vec::new(), None);
            self.begin_peer_routing((r.origin, r.seq));
            // For a subscription the session still has, as the access rules allow; once,
            // whichever way it came ([`Broker::moving_delivery`], in `deliver`).
            let subscribed = self.session(sid).is_some_and(|s| {
                s.subscriptions
                    .keys()
                    .any(|f| crate::topic::matches(pattern(f), &topic))
            });
            if subscribed && self.may_receive(sid, &topic) {
                self.deliver(sid, delivery, &mut None);
            }
            self.end_routing();
        } else {
            self.stats.sessions_transfers_refused += 1;
        }
        self.ack_relay(peer, r.client_id, r.claim, r.n);
    }

    fn ack_relay(&mut self, peer: &NodeId, client_id: String, claim: Stamp, n: u64) {
        self.send_to_peer(
            peer.clone(),
            Frame::SessionRelayAck {
                client_id,
                claim,
                n,
            },
        );
    }

    /// The old node of a session relays nothing more to it.
    pub(super) fn on_relay_done(&mut self, peer: &NodeId, client_id: &str, claim: Stamp) {
        let Some(c) = &mut self.cluster else { return };
        if let Some(w) = c.moves.windows.get_mut(client_id) {
            w.sources.remove(&(peer.clone(), claim));
            if w.sources.is_empty() {
                c.moves.windows.remove(client_id);
            }
        }
    }

    /// A node left the deployment: nothing more comes from it, and nothing goes to it.
    pub(super) fn moves_forget_node(&mut self, node: &NodeId) {
        let Some(c) = &mut self.cluster else { return };
        c.moves.windows.retain(|_, w| {
            w.sources.retain(|(from, _), _| from != node);
            !w.sources.is_empty()
        });
        c.moves.answers.retain(|a| a.to != *node);
        let mut waiting_on = Vec::new();
        let mut gone = Vec::new();
        for (key, relay) in c.moves.relays.iter_mut() {
            if let Some((_, waiting)) = &mut relay.fence
                && waiting.remove(node)
            {
                waiting_on.push(key.clone());
            }
            if relay.to == *node {
                gone.push(key.clone());
            }
        }
        for key in waiting_on {
            self.fence_progress(&key);
        }
        for key in gone {
            let Some(c) = &mut self.cluster else { return };
            let Some(relay) = c.moves.relays.get_mut(&key) else {
                continue;
            };
            let dropped = std::mem::take(&mut relay.pending);
            // Nothing more goes to it: the relay's subscriptions go at once.
            relay.fence = Some((0, BTreeSet::new()));
            self.stats.dropped_peer_forgotten += dropped.len() as u64;
            for n in dropped.into_keys() {
                let record = Key::Relay {
                    client_id: key.0.clone(),
                    claim: key.1.clone(),
                    n,
                };
                self.persist(record.encode(), None);
            }
            self.fence_progress(&key);
        }
        self.settle_moves();
    }

    /// A relayed message read back from storage: sent again when its taker's link is up.
    pub(in crate::broker) fn restore_relayed(
        &mut self,
        client_id: String,
        claim: Stamp,
        n: u64,
        value: &[u8],
    ) -> Result<(), RecordError> {
        let (to, id, delivery) = decode_relayed(value)?;
        let Some(c) = &mut self.cluster else {
            return Ok(());
        };
        if let Some(id) = &id
            && id.0 == c.owner
        {
            c.next_message = c.next_message.max(id.1 + 1);
        }
        let relay = c.moves.relays.entry((client_id, claim)).or_insert(Relay {
            to,
            sid: None,
            next_n: 1,
            pending: BTreeMap::new(),
            fence: Some((0, BTreeSet::new())),
        });
        relay.next_n = relay.next_n.max(n + 1);
        relay.pending.insert(n, (id, delivery));
        Ok(())
    }
}

/// The identities in a [`Key::Seen`] record (at most [`SEEN_KEPT`]).
pub(super) fn decode_seen(value: &[u8]) -> Result<Vec<MessageId>, RecordError> {
    let mut r = persist::Reader::new("seen messages", value)?;
    let count = r.u32()? as usize;
    // Each identity takes at least 19 bytes: no allocation beyond what the value holds.
    let mut ids = Vec::with_capacity(count.min(SEEN_KEPT).min(value.len() / 19));
    for _ in 0..count.min(SEEN_KEPT) {
        ids.push(read_message_id(&mut r)?);
    }
    Ok(ids)
}

/// A subscription's filter without its `$share/{group}/` prefix.
fn pattern(filter: &str) -> &str {
    filter
        .strip_prefix("$share/")
        .and_then(|rest| rest.split_once('/'))
        .map_or(filter, |(_, pattern)| pattern)
}

/// The frame that relays `delivery` as relayed message `n` of the relay `key`.
fn relay_frame(
    key: &(String, Stamp),
    n: u64,
    id: Option<&MessageId>,
    delivery: &Delivery,
    now: Timestamp,
) -> Frame {
    let mut message = link_publish(&delivery.message, now);
    message.qos = delivery.qos;
    message.packet_id = (delivery.qos != QoS::AtMostOnce).then_some(1);
    message.retain = delivery.retain;
    let (origin, seq) = match id {
        Some((origin, seq)) => (origin.clone(), *seq),
        None => (
            Owner {
                node: key.1.node.clone(),
                incarnation: 0,
            },
            0,
        ),
    };
    Frame::SessionRelay(SessionRelay {
        client_id: key.0.clone(),
        claim: key.1.clone(),
        n,
        origin,
        seq,
        message,
    })
}
