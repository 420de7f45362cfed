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
//! old one; and a message queued for the new node before the session came (behind a cut
//! link) can come after the session had it. The session carries what it took
//! ([`super::intake`]), so each message is delivered once.
//!
//! Order: a node's message relayed by the old node can come after a newer one the new node
//! got straight. So the new node holds back each node's messages for the session until the
//! old node says it relayed everything that node routed to it first
//! ([`Frame::SessionRelayCaughtUp`], sent once that node echoed its fence, or for the old
//! node itself once its own forwards went), at most
//! [`ClusterConfig::session_order_wait_ms`](super::ClusterConfig::session_order_wait_ms):
//! then the held messages go, each node's in its order. A node that passes on relays for a
//! session that moved on again says a node caught up only once every relay to it said so
//! too, and every relay from it for the session (earlier stays included) had that node's
//! echo; a session back on a node it left holds a node's messages while that node's relay
//! from the earlier stay waits for that node's echo. A shipped session's queued messages
//! carry their identities, so the new node holds them by the same rules (one its old node
//! had ready to go waits only for the ways other than that node's relay).
//!
//! A node cut off from the others may resume a session it still holds while another node took
//! it meanwhile. Once the link is back it learns that node's claim, older than its own
//! ([`Broker::expect_shipment`]): it then waits for that node's part as for a relay (a source
//! marked expected, which relays nothing until the part comes), and fences every node, for
//! what they routed to its stale copy; the session holds every node's messages until both
//! are in, at most the same hold.
//!
//! A relay whose subscriptions went is stored ([`Key::RelayKept`]) until it ends, so that a
//! restart does not drop what older relays to its node still bring; a relay made or restored
//! in an incarnation numbers its messages above every number of the earlier ones.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use super::Cluster;
use super::forward::{link_message, link_publish};
use super::intake::{Intake, Take};
use super::trust::PeerFault;
use crate::broker::io::Timestamp;
use crate::broker::message::Delivery;
use crate::broker::persist::{self, Key, RecordError};
use crate::broker::session::{SessionId, SubscriptionEntry};
use crate::broker::{Authenticator, Authorizer, Broker};
use crate::broker::{ClientId, Timer};
use crate::codec::QoS;
use crate::link::{Frame, FrameKind, MessageId, SessionRelay};
use crate::read::Fields;
use crate::retained::Stamp;
use crate::routes::{NodeId, Owner};
use crate::topic::TopicFilter;

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
    /// Nodes whose echo came (this node, once its own forwards to `to` went).
    echoed: BTreeSet<NodeId>,
    /// Nodes `to` was told are caught up on ([`Frame::SessionRelayCaughtUp`]).
    caught_up: BTreeSet<NodeId>,
}

impl Relay {
    /// A relay towards `to` with nothing relayed yet, made (or read back) in `incarnation`:
    /// its numbers start above every earlier incarnation's ([`first_relay_number`]).
    fn new(
        to: NodeId,
        sid: Option<SessionId>,
        incarnation: u64,
        fence: Option<(u64, BTreeSet<NodeId>)>,
    ) -> Self {
        Relay {
            to,
            sid,
            next_n: first_relay_number(incarnation),
            pending: BTreeMap::new(),
            fence,
            echoed: BTreeSet::new(),
            caught_up: BTreeSet::new(),
        }
    }
}

/// What a node that took a session keeps while relays to it may come.
#[derive(Debug, Default)]
pub(super) struct Window {
    /// Relays that may still come, by sender and claim.
    sources: BTreeMap<(NodeId, Stamp), Source>,
    /// Until when the session holds back messages for their order; `None` once over (or
    /// after a restart).
    hold_until: Option<Timestamp>,
    /// The fence this node sent when it found its copy of the session stale (it went on
    /// elsewhere while this node could not know, [`Broker::expect_shipment`]), and the nodes
    /// whose echo is awaited: what they routed here for that copy may still be on its way.
    fence: Option<(u64, BTreeSet<NodeId>)>,
}

/// A relay that may still come to a session.
#[derive(Debug, Default)]
struct Source {
    /// The last relayed number taken.
    last: u64,
    /// The nodes it relayed everything of ([`Frame::SessionRelayCaughtUp`]).
    caught_up: BTreeSet<NodeId>,
    /// A shipment expected from a node whose claim this node learnt of only after its own
    /// ([`Broker::expect_shipment`]); not a relay (it may send nothing) until it comes.
    expected: bool,
}

impl Window {
    /// Whether `node`'s messages wait: the hold is on, and a relay (but `except`) may still
    /// bring older ones.
    fn holds(&self, node: &NodeId, except: Option<&(NodeId, Stamp)>) -> bool {
        self.hold_until.is_some() && !self.caught_up(node, except)
    }

    /// Whether every relay that may come (but `except`) passed on everything `node` routed to
    /// it first, and `node` echoed this node's own fence.
    fn caught_up(&self, node: &NodeId, except: Option<&(NodeId, Stamp)>) -> bool {
        self.sources
            .iter()
            .all(|(key, s)| Some(key) == except || s.caught_up.contains(node))
            && self.fence.as_ref().is_none_or(|(_, w)| !w.contains(node))
    }

    /// Whether nothing more may come: no relay, no echo awaited.
    fn is_done(&self) -> bool {
        self.sources.is_empty() && self.fence.as_ref().is_none_or(|(_, w)| w.is_empty())
    }
}

/// What a shipped session brings to [`Broker::open_window`].
pub(super) struct Arrived<'a> {
    /// The messages it had.
    pub had: &'a Intake,
    /// Those it holds back for their order.
    pub held: &'a BTreeSet<MessageId>,
    /// Whether the session was whole here before (not on its way, no relay to it running).
    pub settled: bool,
}

/// What a delivery to a session that moves comes to ([`Broker::moving_delivery`]).
#[derive(Debug)]
pub(in crate::broker) enum Moving {
    /// Deliver it as usual.
    Deliver,
    /// Taken care of: relayed (the session left), or dropped (the session had it already).
    Handled,
    /// Queue it held back until older messages of its node can no longer come
    /// ([`crate::broker::session::MessageQueue::hold`]).
    Hold(MessageId),
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

/// A node passed on a session shipped to it (claimed since by another): the node that shipped
/// it is told [`Frame::SessionRouted`] once the node the session went on to says so.
#[derive(Debug)]
pub(super) struct RoutedOnward {
    to: NodeId,
    client_id: String,
    /// The claim the session was shipped here for.
    claim: Stamp,
    /// The claim it went on for.
    next: Stamp,
}

/// What the nodes that shipped a session here said the session had of other nodes' messages:
/// their word, which nothing here can check. A message of such a node that the session had
/// there was published before the session came here, so before that node took a fence this
/// node sends it then; the node's echo says the number its next message was to get at the
/// fence. Such a message can still come two ways: straight from that node (routed here as it
/// published it, sent again after a cut included: its link brings them in order), or relayed
/// (a copy a subscription the session left behind caught). So once a node echoed, the word
/// counts only for its messages numbered below the echo's number, and for those coming
/// straight only until one numbered past it came straight. A sender that says the session had
/// more than it did thus cannot have a message published after the session came dropped as
/// one had.
#[derive(Debug, Default)]
struct Vouched {
    said: Intake,
    /// The fence whose echo is awaited, by node.
    fences: BTreeMap<NodeId, u64>,
    /// What each node's echo said: its incarnation and its next number at the fence.
    echoed: BTreeMap<NodeId, (u64, u64)>,
    /// Nodes a message of which came straight numbered past what their echo said: none below
    /// can come straight any more.
    passed: BTreeSet<NodeId>,
}

impl Vouched {
    /// Whether the word counts for `id` (`relayed`: a copy a relay brought): until its
    /// origin's echo, for any; then only for one numbered below what the echo said (published
    /// before the session came here), and coming straight, only until one past it came.
    fn counts_for(&self, (origin, seq): &MessageId, relayed: bool) -> bool {
        if self.fences.contains_key(&origin.node) {
            return true;
        }
        if !relayed && self.passed.contains(&origin.node) {
            return false;
        }
        self.echoed
            .get(&origin.node)
            .is_some_and(|&(incarnation, next)| {
                origin.incarnation < incarnation
                    || (origin.incarnation == incarnation && *seq < next)
            })
    }

    /// Forget what was said of `node`'s messages.
    fn forget(&mut self, node: &NodeId) {
        self.said.forget_node(node);
        self.fences.remove(node);
        self.echoed.remove(node);
        self.passed.remove(node);
    }
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
    /// What sessions that moved here took, until this node's own streams catch up.
    intakes: BTreeMap<ClientId, Intake>,
    /// What their senders said they had of other nodes' messages, while it counts ([`Vouched`]).
    vouched: BTreeMap<ClientId, Vouched>,
    /// Relays ended while their taker was away: told when it is back.
    dones: BTreeMap<NodeId, Vec<(String, Stamp, u64)>>,
    answers: Vec<RoutedAnswer>,
    /// Sessions passed on, whose senders wait for [`Frame::SessionRouted`].
    routed_onward: Vec<RoutedOnward>,
    /// The token of the next fence.
    next_token: u64,
}

impl Moves {
    /// Whether `client_id`'s session here holds `node`'s messages back for their order: its
    /// hold is on, and a relay may still bring older ones of `node`, from the node it came
    /// from, or from a stay here before (its relay from here waits for `node`'s fence echo:
    /// messages routed here for that stay may still be on their way from `node`).
    fn holds(
        &self,
        me: &NodeId,
        client_id: &str,
        node: &NodeId,
        except: Option<&(NodeId, Stamp)>,
    ) -> bool {
        let Some(w) = self.windows.get(client_id) else {
            return false;
        };
        w.holds(node, except)
            || (w.hold_until.is_some()
                && node != me
                && self
                    .relays
                    .iter()
                    .any(|((c, _), r)| c == client_id && !r.echoed.contains(node)))
    }

    /// The relay for `client_id`'s latest claim: to where its session went last.
    fn latest_relay(&self, client_id: &str) -> Option<(String, Stamp)> {
        self.relays
            .keys()
            .filter(|(cid, _)| cid == client_id)
            .max_by(|a, b| a.1.cmp(&b.1))
            .cloned()
    }

    /// Whether relays may still come to `client_id`'s session here.
    pub fn has_window(&self, client_id: &str) -> bool {
        self.windows.contains_key(client_id)
    }

    pub fn is_idle(&self) -> bool {
        self.relays.is_empty()
            && self.windows.is_empty()
            && self.answers.is_empty()
            && self.intakes.is_empty()
            && self.vouched.is_empty()
    }

    /// Whether a sender of `client_id`'s session said the session had `id`, and the word still
    /// counts for `id` coming straight from its origin (`relayed`: by a relay).
    fn vouched_has(&self, client_id: &str, id: &MessageId, relayed: bool) -> bool {
        self.vouched
            .get(client_id)
            .is_some_and(|v| v.said.has(id) && v.counts_for(id, relayed))
    }

    /// Let go of what senders said of `client_id`'s session once it counts for nothing more:
    /// no relay to the session may come, and every node's messages it spoke of came past
    /// what the node's echo said (or the node is gone).
    fn settle_vouched(&mut self, client_id: &str) {
        if self.windows.contains_key(client_id) {
            return;
        }
        let Some(v) = self.vouched.get_mut(client_id) else {
            return;
        };
        let pending: BTreeSet<NodeId> = v
            .fences
            .keys()
            .chain(v.echoed.keys().filter(|n| !v.passed.contains(*n)))
            .cloned()
            .collect();
        for node in v.said.nodes() {
            if !pending.contains(&node) {
                v.forget(&node);
            }
        }
        if v.said.is_empty() {
            self.vouched.remove(client_id);
        }
    }

    /// What `client_id`'s session took here, with what its sender's word still says it had.
    fn had_with_vouched(&self, client_id: &str) -> Option<Intake> {
        let vouched = self.vouched.get(client_id).map(|v| &v.said);
        match (self.intakes.get(client_id), vouched) {
            (None, None) => None,
            (intake, vouched) => {
                let mut had = intake.cloned().unwrap_or_default();
                if let Some(vouched) = vouched {
                    had.merge(vouched);
                }
                Some(had)
            }
        }
    }
}

impl Cluster {
    /// The nodes a fence goes to: every node that may have routed here, those with a link
    /// now, and those whose routes this node holds (one cut off, or not met again since a
    /// restart here, echoes when it is back, or is forgotten); and of those, the ones with a
    /// link now.
    fn fence_targets(&self) -> (BTreeSet<NodeId>, Vec<NodeId>) {
        let me = &self.owner.node;
        let waiting: BTreeSet<NodeId> = self
            .peers
            .keys()
            .chain(self.table.replicas().map(|(node, _)| node))
            .filter(|p| *p != me && !self.leaves.is_leaf(p))
            .cloned()
            .collect();
        let up = waiting
            .iter()
            .filter(|p| self.peers.get(*p).is_some_and(|p| p.connected))
            .cloned()
            .collect();
        (waiting, up)
    }

    /// Whether every node of the deployment this one knows (linked now or not: one cut off
    /// learns the routes when it is back) has `version` of its routes.
    fn routes_everywhere(&self, version: u64) -> bool {
        self.peers
            .keys()
            .chain(self.table.replicas().map(|(node, _)| node))
            .filter(|p| **p != self.owner.node && !self.leaves.is_leaf(p))
            .all(|p| self.routes.acked(p).is_some_and(|acked| acked >= version))
    }
}

/// What a session that took each origin's messages on this node, in order, had of them:
/// everything this node had (its inbox's marks, its own messages numbered below `next`, and
/// every message of its earlier incarnations).
fn had_here(inbox: &crate::link::Inbox, me: &Owner, next: u64, intake: &mut Intake) {
    for (origin, mark) in inbox.marks() {
        intake.had_up_to(&origin, mark);
    }
    intake.had_up_to(me, next.saturating_sub(1));
    intake.had_below(&me.node, me.incarnation);
}

/// The number of the first message a relay made in `incarnation` sends: above every number
/// an earlier incarnation's relay sent (the taker takes a number it had as one sent again),
/// with room for 2^32 messages per relay and incarnation.
fn first_relay_number(incarnation: u64) -> u64 {
    (incarnation.min(u64::from(u32::MAX)) << 32) | 1
}

/// The value of a [`Key::RelayKept`] record: where the relay goes, and the nodes that
/// echoed its fence.
fn encode_kept(to: &NodeId, echoed: &BTreeSet<NodeId>) -> Bytes {
    let mut v = BytesMut::new();
    v.put_u8(1);
    persist::put_string(&mut v, to.as_str());
    v.put_u32(u32::try_from(echoed.len()).unwrap_or(u32::MAX));
    for node in echoed {
        persist::put_string(&mut v, node.as_str());
    }
    v.freeze()
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

    /// What a delivery to `sid` comes to while sessions move: relayed (the session left),
    /// dropped (the session had it already, by another way while it moved), held back for
    /// its order, or delivered as usual.
    pub(in crate::broker) fn moving_delivery(
        &mut self,
        sid: SessionId,
        delivery: &Delivery,
    ) -> Moving {
        let Some(c) = &mut self.cluster else {
            return Moving::Deliver;
        };
        if c.moves.is_idle() && c.transfers.awaiting_none() {
            return Moving::Deliver;
        }
        if let Some(key) = c.moves.by_sid.get(&sid).cloned() {
            self.relay_delivery(&key, delivery.clone());
            return Moving::Handled;
        }
        let Some(id) = c.routing.clone() else {
            return Moving::Deliver;
        };
        let Some(client_id) = self
            .sessions
            .get(sid as usize)
            .and_then(Option::as_ref)
            .map(|s| s.client_id.clone())
        else {
            return Moving::Deliver;
        };
        let Some(c) = &mut self.cluster else {
            return Moving::Deliver;
        };
        if c.moves.vouched_has(&client_id, &id, false) {
            self.stats.dropped_moved_twice += 1;
            return Moving::Handled;
        }
        // A QoS 2 message waits for the session's state anyway, wait over or not.
        let awaiting = c.transfers.awaits(&client_id)
            || (delivery.qos == QoS::ExactlyOnce && c.transfers.on_its_way(&client_id));
        let window = c.moves.windows.get(&client_id);
        // While relays may come (or the session is on its way), numbers are kept exactly.
        let exact = window.is_some() || c.transfers.on_its_way(&client_id);
        let intake = if exact {
            Some(c.moves.intakes.entry(client_id.clone()).or_default())
        } else {
            c.moves.intakes.get_mut(&client_id)
        };
        let Some(intake) = intake else {
            return Moving::Deliver;
        };
        let take = intake.take(&id, exact);
        let held = awaiting || c.moves.holds(&c.owner.node, &client_id, &id.0.node, None);
        match take {
            Take::Twice => {
                self.stats.dropped_moved_twice += 1;
                return Moving::Handled;
            }
            Take::Late if !held => self.stats.messages_delivered_late += 1,
            Take::Late | Take::InOrder => {}
        }
        if exact {
            // Remembered across a restart: a relay may bring it again after one.
            let record = Key::Took {
                client_id: client_id.to_string(),
                origin: id.0.clone(),
                seq: id.1,
            };
            self.persist(record.encode(), Some(persist::marker()));
        }
        let Some(c) = &mut self.cluster else {
            return Moving::Deliver;
        };
        if !exact {
            let Some(intake) = c.moves.intakes.get_mut(&client_id) else {
                return Moving::Deliver;
            };
            // In order on this node's own stream of that origin: once it went past what the
            // session had, nothing older can come here again.
            let (owner, next, inbox) = (&c.owner, c.next_message, &c.inbox);
            intake.forget_passed(|origin, upto| {
                if origin == owner {
                    next > upto
                } else {
                    inbox.mark(origin).is_some_and(|mark| mark >= upto)
                }
            });
            if intake.is_empty() {
                c.moves.intakes.remove(&client_id);
                self.persist_intake(&client_id);
            }
        }
        if held && delivery.qos != QoS::AtMostOnce {
            self.stats.messages_held_for_order += 1;
            return Moving::Hold(id);
        }
        Moving::Deliver
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
        self.persist_relay_slot(sid, client_id, to, claim);
        let Some(c) = &mut self.cluster else { return };
        let key = (client_id.to_owned(), claim.clone());
        c.moves.by_sid.insert(sid, key.clone());
        // The relay the session went by before carries nothing passed on any more.
        let earlier = c.moves.relays.keys().any(|(cid, _)| cid == client_id);
        let relay = Relay::new(to.clone(), Some(sid), c.owner.incarnation, None);
        c.moves.relays.insert(key, relay);
        if earlier {
            self.relay_markers(client_id);
        }
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
        // The node a session was passed on to: its sender may let go too.
        let (told, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut c.moves.routed_onward)
            .into_iter()
            .partition(|o| o.client_id == client_id && o.next == claim && o.next.node == *peer);
        c.moves.routed_onward = waiting;
        self.tell_routed(told);
        let Some(c) = &mut self.cluster else { return };
        let key = (client_id, claim);
        let token = c.moves.next_token;
        // Every node that may have routed here.
        let (waiting, up) = c.fence_targets();
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
        self.relay_markers(&key.0);
        self.settle_moves();
    }

    /// A peer asks for a fence: echoed once what waits for it in its outbox is sent.
    pub(super) fn on_fence(&mut self, peer: &NodeId, token: u64) {
        let Some(c) = &mut self.cluster else { return };
        let (incarnation, next) = (c.owner.incarnation, c.next_message);
        let p = c.peer(peer);
        if p.outbox.has_unsent() {
            // Bounded by the peer's outbox: a fence per queued forward at most matters.
            if p.echoes.len() < 1_024 {
                p.echoes.push((token, next));
            }
        } else {
            let echo = Frame::FenceEcho {
                token,
                incarnation,
                next,
            };
            self.send_to_peer(peer.clone(), echo);
        }
    }

    /// A peer echoed a fence: everything it had routed here before is in.
    pub(super) fn on_fence_echo(&mut self, peer: &NodeId, token: u64, at: (u64, u64)) {
        self.vouched_echo(peer, Some((token, at)));
        let Some(c) = &mut self.cluster else { return };
        let keys: Vec<(String, Stamp)> = c
            .moves
            .relays
            .iter_mut()
            .filter_map(|(k, r)| {
                let (t, waiting) = r.fence.as_mut()?;
                let echoed = *t == token && waiting.remove(peer);
                if echoed {
                    r.echoed.insert(peer.clone());
                }
                echoed.then(|| k.clone())
            })
            .collect();
        let Some(c) = &mut self.cluster else { return };
        let mut windows: Vec<(ClientId, bool)> = Vec::new();
        for (client_id, w) in c.moves.windows.iter_mut() {
            if let Some((t, waiting)) = &mut w.fence
                && *t == token
                && waiting.remove(peer)
            {
                windows.push((client_id.clone(), w.is_done()));
            }
        }
        for key in &keys {
            self.fence_progress(key);
            self.relay_markers(&key.0);
            // The session may be back here, holding `peer`'s messages for this relay's echo.
            self.release_held(&key.0);
        }
        for (client_id, done) in windows {
            if done {
                self.close_window(&client_id);
            } else {
                self.release_held(&client_id);
                self.relay_markers(&client_id);
            }
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
        let kept = encode_kept(&relay.to, &relay.echoed);
        c.moves.by_sid.remove(&sid);
        self.free_slot(sid);
        let record = Key::RelaySlot {
            client_id: key.0.clone(),
            claim: key.1.clone(),
        };
        self.persist(record.encode(), None);
        // The relay itself stays while relays to here may bring it more: so after a restart.
        let record = Key::RelayKept {
            client_id: key.0.clone(),
            claim: key.1.clone(),
        };
        self.persist(record.encode(), Some(kept));
    }

    /// A relay whose subscriptions had gone, read back from storage: it passes on again what
    /// relays to this node bring, until it ends.
    pub(in crate::broker) fn restore_relay_kept(
        &mut self,
        client_id: String,
        claim: Stamp,
        value: &[u8],
    ) -> Result<(), RecordError> {
        let mut r = persist::Reader::new("kept relay", value)?;
        let to = r.node()?;
        let mut echoed = BTreeSet::new();
        for _ in 0..r.u32()? {
            echoed.insert(r.node()?);
        }
        let Some(c) = &mut self.cluster else {
            return Ok(());
        };
        let incarnation = c.owner.incarnation;
        let relay = c
            .moves
            .relays
            .entry((client_id, claim))
            .or_insert_with(|| Relay::new(to, None, incarnation, None));
        // Its fence was echoed by all.
        relay.fence = Some((0, BTreeSet::new()));
        relay.echoed.extend(echoed);
        Ok(())
    }

    /// Store a relay's subscriptions, so that it goes on matching after a restart.
    fn persist_relay_slot(&mut self, sid: SessionId, client_id: &str, to: &NodeId, claim: &Stamp) {
        let Some(session) = self.session(sid) else {
            return;
        };
        let subscriptions: Vec<(Bytes, Bytes)> = session
            .subscriptions
            .iter()
            .map(|(filter, entry)| {
                let filter = Bytes::copy_from_slice(filter.as_bytes());
                (filter, persist::encode_subscription(entry))
            })
            .collect();
        let mut v = BytesMut::new();
        v.put_u8(1);
        persist::put_string(&mut v, to.as_str());
        persist::put_opt_string(&mut v, session.username.as_deref());
        v.put_slice(&persist::pack(&subscriptions));
        let key = Key::RelaySlot {
            client_id: client_id.to_owned(),
            claim: claim.clone(),
        };
        self.persist(key.encode(), Some(v.freeze()));
    }

    /// A session passed on (shipped here for an earlier claim of this node, claimed elsewhere
    /// since) brings `subscriptions` the part of it this node held may have lacked (a part
    /// that waited here for the rest, shipped on before the rest came). The relay to where
    /// the session went takes them too, so that what is published or routed here before the
    /// session's new routes are everywhere still reaches it.
    pub(super) fn relay_takes_subscriptions(
        &mut self,
        client_id: &str,
        subscriptions: Vec<(TopicFilter, SubscriptionEntry)>,
    ) {
        let Some(c) = &self.cluster else { return };
        let Some((key, relay)) = c
            .moves
            .latest_relay(client_id)
            .and_then(|key| c.moves.relays.get(&key).map(|r| (key, r)))
        else {
            return;
        };
        let (Some(sid), to, claim) = (relay.sid, relay.to.clone(), key.1) else {
            return;
        };
        let mut added = false;
        for (filter, entry) in subscriptions {
            if self
                .session(sid)
                .is_none_or(|s| s.subscriptions.contains_key(filter.as_str()))
            {
                continue;
            }
            let filtered = self.access_filtered(sid, &filter);
            self.hold_subscription(sid, &filter, entry, filtered);
            added = true;
        }
        if added {
            self.persist_relay_slot(sid, client_id, &to, &claim);
        }
    }

    /// A relay's subscriptions read back from storage: a slot of their own again (under no
    /// client id), matching for the relay until its taker's routes are everywhere.
    pub(in crate::broker) fn restore_relay_slot(
        &mut self,
        client_id: &str,
        claim: Stamp,
        value: &Bytes,
    ) -> Result<(), RecordError> {
        let mut r = persist::Reader::new("relay subscriptions", value)?;
        let to = r.node()?;
        let username = r.opt_string()?;
        let used = value.len() - r.rest().len();
        let subscriptions = persist::unpack(&value.slice(used..))?;
        let Ok(id) = ClientId::new(client_id) else {
            return Ok(());
        };
        if self.cluster.is_none() {
            return Ok(());
        }
        let here = self.by_client_id.get(client_id).copied();
        let sid = self.new_session(id.clone(), crate::codec::ProtocolVersion::V5);
        match here {
            Some(session) => self.by_client_id.insert(id, session),
            None => self.by_client_id.remove(&id),
        };
        if let Some(session) = self.session_mut(sid) {
            session.username = username.map(Box::from);
        }
        for (filter, entry) in subscriptions {
            let filter = std::str::from_utf8(&filter)
                .ok()
                .and_then(|f| crate::topic::TopicFilter::new(f).ok());
            let (Some(filter), Ok(entry)) = (filter, persist::decode_subscription(&entry)) else {
                continue;
            };
            let filtered = self.access_filtered(sid, &filter);
            self.hold_subscription(sid, &filter, entry, filtered);
        }
        let Some(c) = &mut self.cluster else {
            return Ok(());
        };
        let key = (client_id.to_owned(), claim);
        let incarnation = c.owner.incarnation;
        let relay = c
            .moves
            .relays
            .entry(key.clone())
            .or_insert_with(|| Relay::new(to, None, incarnation, None));
        // Its taker says again that its routes are everywhere: then the fence.
        relay.sid = Some(sid);
        relay.fence = None;
        c.moves.by_sid.insert(sid, key);
        Ok(())
    }

    /// Tell the nodes `client_id`'s sessions went to which nodes' messages are all relayed:
    /// those whose fence echo came (this node's own, once its forwards to the taker went),
    /// and, for the relay where the session went last (what relays to this node bring is
    /// passed on there), where those relays said so too.
    pub(super) fn relay_markers(&mut self, client_id: &str) {
        // With the session here, what relays bring is delivered here, not passed on.
        let here = self.by_client_id.contains_key(client_id);
        let Some(c) = &mut self.cluster else { return };
        let me = c.owner.node.clone();
        // What relays to here may still bring of a node is passed on, by whichever relay: no
        // relay from here says that node caught up before every relay to here did.
        let window = c.moves.windows.get(client_id).filter(|_| !here);
        // What each relay from here for the session has had echoed: a relay says a node
        // caught up only once every other one did (what a node routed here for an earlier
        // stay of the session goes to it too, later).
        let echoes: Vec<(Stamp, Option<BTreeSet<NodeId>>)> = c
            .moves
            .relays
            .iter()
            .filter(|((cid, _), _)| cid == client_id)
            .map(|((_, claim), r)| (claim.clone(), r.fence.as_ref().map(|_| r.echoed.clone())))
            .collect();
        let mut frames = Vec::new();
        for ((cid, claim), relay) in c.moves.relays.iter_mut() {
            if cid != client_id || relay.fence.is_none() {
                continue;
            }
            let up = c.peers.get(&relay.to).is_some_and(|p| p.connected);
            // What holds only while the session is here is said now or not at all: kept to be
            // said once the link is back, it would reach a copy of the session there after
            // the session left (a stale copy resumed behind a cut would take it). The link
            // coming back asks again ([`Broker::relays_peer_up`]).
            if here && !up {
                continue;
            }
            let own_sent = c
                .peers
                .get(&relay.to)
                .is_some_and(|p| !p.outbox.has_unsent());
            if own_sent {
                relay.echoed.insert(me.clone());
            }
            let due: Vec<NodeId> = relay
                .echoed
                .iter()
                .filter(|n| !relay.caught_up.contains(*n))
                .filter(|n| window.is_none_or(|w| w.caught_up(n, None)))
                .filter(|n| {
                    echoes.iter().all(|(other, echoed)| {
                        other == claim || echoed.as_ref().is_some_and(|e| e.contains(*n))
                    })
                })
                .cloned()
                .collect();
            for node in due {
                relay.caught_up.insert(node.clone());
                if up {
                    frames.push((
                        relay.to.clone(),
                        Frame::SessionRelayCaughtUp {
                            client_id: cid.clone(),
                            claim: claim.clone(),
                            node,
                        },
                    ));
                }
            }
        }
        for (to, frame) in frames {
            self.send_to_peer(to, frame);
        }
    }

    /// This node's outbox to `peer` sent what it held: relays to it may say this node
    /// caught up.
    pub(super) fn relays_outbox_sent(&mut self, peer: &NodeId) {
        let Some(c) = &self.cluster else { return };
        let clients: BTreeSet<String> = c
            .moves
            .relays
            .iter()
            .filter(|(_, r)| {
                r.to == *peer && r.fence.is_some() && !r.echoed.contains(&c.owner.node)
            })
            .map(|((cid, _), _)| cid.clone())
            .collect();
        for client_id in clients {
            self.relay_markers(&client_id);
        }
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
        // A shipment is answered once the routes of everything shipped for the same claim
        // are everywhere: a part whose sender waited for the rest itself (it passes that on
        // when it comes, and its relay holds the rest's subscriptions meanwhile) is answered
        // with the rest, or once the wait for it is over.
        let answers = std::mem::take(&mut c.moves.answers);
        let everywhere = |a: &RoutedAnswer| a.target.is_some_and(|t| c.routes_everywhere(t));
        let ready: Vec<bool> = answers
            .iter()
            .map(|a| {
                !c.transfers.awaits(&a.client_id)
                    && answers
                        .iter()
                        .filter(|b| {
                            b.to == a.to && b.client_id == a.client_id && b.claim == a.claim
                        })
                        .all(everywhere)
            })
            .collect();
        let (ready, waiting): (Vec<_>, Vec<_>) = answers
            .into_iter()
            .zip(ready)
            .partition(|(_, ready)| *ready);
        c.moves.answers = waiting.into_iter().map(|(a, _)| a).collect();
        let ready = ready.into_iter().map(|(a, _)| a);
        // A relay ends once nothing is left to send and nothing more can come: its
        // subscriptions went, and no relay to this node for the same client may still bring
        // it messages to pass on.
        let windows = &c.moves.windows;
        let ended: Vec<(String, Stamp)> = c
            .moves
            .relays
            .iter()
            .filter(|((client_id, _), r)| {
                r.pending.is_empty() && r.sid.is_none() && !windows.contains_key(client_id.as_str())
            })
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
        if let Some(sid) = relay.sid {
            c.moves.by_sid.remove(&sid);
            self.free_slot(sid);
            let record = Key::RelaySlot {
                client_id: key.0.clone(),
                claim: key.1.clone(),
            };
            self.persist(record.encode(), None);
        } else {
            let record = Key::RelayKept {
                client_id: key.0.clone(),
                claim: key.1.clone(),
            };
            self.persist(record.encode(), None);
        }
        let Some(c) = &mut self.cluster else { return };
        let up = c.peers.get(&relay.to).is_some_and(|p| p.connected);
        let last = relay.next_n - 1;
        if up {
            self.send_to_peer(
                relay.to,
                Frame::SessionRelayDone {
                    client_id: key.0.clone(),
                    claim: key.1.clone(),
                    last,
                },
            );
        } else {
            // Told when its link is back (a restart here meanwhile forgets it: the taker's
            // window then ends with the session, or when this node is forgotten).
            c.moves
                .dones
                .entry(relay.to)
                .or_default()
                .push((key.0.clone(), key.1.clone(), last));
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
            // After what they speak of.
            for node in &relay.caught_up {
                frames.push(Frame::SessionRelayCaughtUp {
                    client_id: key.0.clone(),
                    claim: key.1.clone(),
                    node: node.clone(),
                });
            }
        }
        for w in c.moves.windows.values() {
            if let Some((token, waiting)) = &w.fence
                && waiting.contains(peer)
            {
                frames.push(Frame::Fence { token: *token });
            }
        }
        for v in c.moves.vouched.values() {
            if let Some(token) = v.fences.get(peer) {
                frames.push(Frame::Fence { token: *token });
            }
        }
        let dones = self
            .cluster
            .as_mut()
            .and_then(|c| c.moves.dones.remove(peer))
            .unwrap_or_default();
        for (client_id, claim, last) in dones {
            frames.push(Frame::SessionRelayDone {
                client_id,
                claim,
                last,
            });
        }
        for frame in frames {
            self.send_to_peer(peer.clone(), frame);
        }
        // Relays `peer` keeps for sessions here: told again that their routes are everywhere
        // (once they are), in case that answer was lost with a link or a restart there.
        let Some(c) = &self.cluster else { return };
        let answers: Vec<(String, Stamp)> = c
            .moves
            .windows
            .iter()
            .filter(|(client_id, _)| self.by_client_id.contains_key(client_id.as_str()))
            .flat_map(|(client_id, w)| {
                w.sources
                    .keys()
                    .filter(|(from, _)| from == peer)
                    .map(|(_, claim)| (client_id.to_string(), claim.clone()))
            })
            .collect();
        for (client_id, claim) in answers {
            self.session_arrived(peer, &client_id, &claim);
        }
        // What relays to `peer` could not say while it was away, asked again as things are now.
        let Some(c) = &self.cluster else { return };
        let relayed: BTreeSet<String> = c
            .moves
            .relays
            .iter()
            .filter(|(_, r)| r.to == *peer)
            .map(|((client_id, _), _)| client_id.clone())
            .collect();
        for client_id in relayed {
            self.relay_markers(&client_id);
        }
        self.settle_moves();
    }

    /// A session arrives here from `from` for this node's claim: its relays may follow, and
    /// the messages it had (`had`) come no second time. What it was held back here while it
    /// was on its way and turns out to have had goes (unless the shipment carries it held
    /// too, `shipped_held`: then the copy here stays, and the shipment's is taken no second
    /// time); the rest waits, each node's messages until `from` relayed everything older of
    /// that node.
    pub(super) fn open_window(
        &mut self,
        sid: SessionId,
        from: &NodeId,
        client_id: &str,
        claim: &Stamp,
        arrived: Arrived<'_>,
    ) {
        let Arrived {
            had,
            held: shipped_held,
            settled,
        } = arrived;
        let now = self.now;
        let Ok(key) = ClientId::new(client_id) else {
            return;
        };
        if let Some(session) = self.sessions.get_mut(sid as usize).and_then(Option::as_mut) {
            let gone = session
                .queue
                .drop_held(|id| had.has(id) && !shipped_held.contains(id));
            let persistent = session.is_persistent();
            self.stats.dropped_moved_twice += gone.len() as u64;
            if !gone.is_empty() {
                self.touch(sid);
            }
            for seq in gone.into_iter().filter(|_| persistent) {
                let record = Key::Queued {
                    client_id: client_id.to_owned(),
                    seq,
                };
                self.persist(record.encode(), None);
            }
        }
        let Some(c) = &mut self.cluster else { return };
        let intake = c.moves.intakes.entry(key.clone()).or_default();
        if settled {
            // Until now the session took each origin's messages here in order: what it had
            // of them is what this node had (kept exactly from now on, as relays may bring
            // older ones).
            had_here(&c.inbox, &c.owner, c.next_message, intake);
        }
        let until = now.plus_ms(c.config.session_order_wait_ms);
        let w = c.moves.windows.entry(key).or_default();
        // Another shipment by the same relay (a session it passed on): what it said before
        // spoke of less than it may carry now; it says it again.
        let source = w.sources.entry((from.clone(), claim.clone())).or_default();
        source.caught_up.clear();
        source.expected = false;
        w.hold_until = Some(w.hold_until.map_or(until, |t| t.max(until)));
        self.timers.insert((until, Timer::OrderWait(sid)));
        // Relays from here for the session wait on relays to here no more.
        self.relay_markers(client_id);
    }

    /// `peer` claimed `client_id` before this node's live claim `claim`, and this node learns
    /// of it only now (the two claimed while they could not reach each other, or their claims
    /// crossed): the session `sid` here is not all of it. `peer` may hold a part taken after
    /// this node last had the session, with older messages of any node among it, and ships it
    /// here once it learns this node's claim. Until it does (or the hold runs out), the
    /// session holds every node's messages back for their order, as for a relay.
    pub(super) fn expect_shipment(
        &mut self,
        sid: SessionId,
        peer: &NodeId,
        client_id: &str,
        claim: &Stamp,
    ) {
        let now = self.now;
        let Ok(key) = ClientId::new(client_id) else {
            return;
        };
        let Some(c) = &mut self.cluster else { return };
        let settled =
            !c.moves.windows.contains_key(client_id) && !c.transfers.on_its_way(client_id);
        let source = (peer.clone(), claim.clone());
        if c.moves
            .windows
            .get(client_id)
            .is_some_and(|w| w.sources.contains_key(&source))
        {
            return;
        }
        let intake = c.moves.intakes.entry(key.clone()).or_default();
        if settled {
            had_here(&c.inbox, &c.owner, c.next_message, intake);
        }
        let until = now.plus_ms(c.config.session_order_wait_ms);
        let (waiting, up) = c.fence_targets();
        let token = c.moves.next_token;
        let w = c.moves.windows.entry(key).or_default();
        w.sources.insert(
            source,
            Source {
                expected: true,
                ..Source::default()
            },
        );
        w.hold_until = Some(w.hold_until.map_or(until, |t| t.max(until)));
        // What the others routed here while this copy seemed the session's is in once each
        // echoes a fence (sent after what it had queued for here).
        let fence = w.fence.is_none().then(|| {
            w.fence = Some((token, waiting));
            c.moves.next_token += 1;
            up
        });
        self.timers.insert((until, Timer::OrderWait(sid)));
        for p in fence.into_iter().flatten() {
            self.send_to_peer(p, Frame::Fence { token });
        }
        self.stats.session_shipments_expected += 1;
        self.persist_intake(client_id);
    }

    /// The messages of a shipped session are in: what it had joins what it took here.
    pub(super) fn merge_had(&mut self, client_id: &str, had: &Intake) {
        let Some(c) = &mut self.cluster else { return };
        if let Some(intake) = c.moves.intakes.get_mut(client_id) {
            intake.merge(had);
        }
        self.persist_intake(client_id);
    }

    /// A session shipped here from `from` for this node's claim `claim` went on to the node
    /// whose claim `next` took it over since: what `from` still relays for it is passed on
    /// there, and `from` is told the session's routes are everywhere once that node says so.
    pub(super) fn pass_on_relay(
        &mut self,
        from: &NodeId,
        client_id: &str,
        claim: &Stamp,
        next: &Stamp,
    ) {
        let Some(c) = &mut self.cluster else { return };
        let Ok(key) = ClientId::new(client_id) else {
            return;
        };
        let w = c.moves.windows.entry(key).or_default();
        w.sources
            .entry((from.clone(), claim.clone()))
            .or_default()
            .expected = false;
        // The relay from here where the session went carries what `from` relays now: what it
        // said caught up before, it says again once that is in too.
        if let Some(relay) = c
            .moves
            .latest_relay(client_id)
            .and_then(|key| c.moves.relays.get_mut(&key))
        {
            relay.caught_up.clear();
        }
        c.moves.routed_onward.push(RoutedOnward {
            to: from.clone(),
            client_id: client_id.to_owned(),
            claim: claim.clone(),
            next: next.clone(),
        });
        self.persist_intake(client_id);
    }

    /// What the session of `client_id` had, to ship with it: exactly, while it may still get
    /// messages out of order; else, of each origin, everything this node had of it.
    pub(super) fn had_record(&self, client_id: &str) -> (Bytes, Bytes) {
        let mut had = Intake::default();
        let mut awaiting = None;
        if let Some(c) = &self.cluster {
            if let Some(intake) = c.moves.had_with_vouched(client_id) {
                had = intake;
            }
            awaiting = c.transfers.holder(client_id).cloned();
            if !c.moves.windows.contains_key(client_id) && awaiting.is_none() {
                had_here(&c.inbox, &c.owner, c.next_message, &mut had);
            }
        }
        let key = Key::Seen {
            client_id: client_id.to_owned(),
        };
        let seen = Seen {
            sources: Vec::new(),
            intake: had,
            awaiting,
        };
        (key.encode(), seen.encode())
    }

    /// Store what a session that moved here took and the relays it waits for (or delete the
    /// record once there is neither).
    pub(super) fn persist_intake(&mut self, client_id: &str) {
        let Some(c) = &self.cluster else { return };
        // With the sender's word: after a restart it counts until the session leaves.
        let intake = c.moves.had_with_vouched(client_id);
        let sources: Vec<(NodeId, Stamp)> = c
            .moves
            .windows
            .get(client_id)
            .map(|w| {
                w.sources
                    .iter()
                    .filter(|(_, s)| !s.expected)
                    .map(|(k, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default();
        let key = Key::Seen {
            client_id: client_id.to_owned(),
        }
        .encode();
        let awaiting = c.transfers.holder(client_id).cloned();
        let value = (intake.is_some() || !sources.is_empty() || awaiting.is_some()).then(|| {
            let seen = Seen {
                sources,
                intake: intake.unwrap_or_default(),
                awaiting,
            };
            seen.encode()
        });
        self.persist(key, value);
    }

    /// A session left this node or ended: what it took goes with it (or with it), and no
    /// message waits here for it any more.
    pub(in crate::broker) fn moved_session_left(&mut self, client_id: &str) {
        self.forget_took(client_id);
        let Some(c) = &mut self.cluster else { return };
        let vouched = c.moves.vouched.remove(client_id).is_some();
        let had = c.moves.intakes.remove(client_id).is_some() || vouched;
        let window = c.moves.windows.get_mut(client_id);
        let windowed = window.is_some();
        if let Some(w) = window {
            w.hold_until = None;
        }
        if had || windowed {
            // What relays to here still bring is passed on: the window stays.
            self.persist_intake(client_id);
        }
    }

    /// Delete the records of what `client_id`'s session took one by one (they are settled,
    /// or went with it).
    fn forget_took(&mut self, client_id: &str) {
        let Some(c) = &self.cluster else { return };
        let Some(intake) = c.moves.intakes.get(client_id) else {
            return;
        };
        let ids: Vec<MessageId> = intake.exact_ids().collect();
        for (origin, seq) in ids {
            let record = Key::Took {
                client_id: client_id.to_owned(),
                origin,
                seq,
            };
            self.persist(record.encode(), None);
        }
    }

    /// A message a session that moved here took one by one, read back from storage.
    pub(in crate::broker) fn restore_took(&mut self, client_id: &str, id: MessageId) {
        let Some(c) = &mut self.cluster else { return };
        let Ok(key) = ClientId::new(client_id) else {
            return;
        };
        c.moves.intakes.entry(key).or_default().take(&id, true);
    }

    /// A message that came with a shipped session (from the relay `source`), with its
    /// identity in the deployment: held back here as long as older ones of its origin may
    /// still come, else delivered.
    ///
    /// One its sender held back for its order (`held_there`) may have reached the session
    /// here by another way (the same message in two shipments of the session, or relayed):
    /// it comes no second time. One its sender had ready to go came after every older one of
    /// its origin that reached the sender: only another way (another relay, a fence, a stay
    /// here before) can still bring older ones, so `source` holds it back no further.
    pub(super) fn deliver_shipped(
        &mut self,
        sid: SessionId,
        id: MessageId,
        delivery: Delivery,
        source: &(NodeId, Stamp),
        held_there: bool,
    ) {
        let Some(client_id) = self.session(sid).map(|s| s.client_id.clone()) else {
            return;
        };
        if held_there {
            let twice = self.cluster.as_mut().is_some_and(|c| {
                c.moves.vouched_has(&client_id, &id, true)
                    || c.moves
                        .intakes
                        .get_mut(&client_id)
                        .is_some_and(|intake| intake.take(&id, true) == Take::Twice)
            });
            if twice {
                self.stats.dropped_moved_twice += 1;
                return;
            }
            let record = Key::Took {
                client_id: client_id.to_string(),
                origin: id.0.clone(),
                seq: id.1,
            };
            self.persist(record.encode(), Some(persist::marker()));
        }
        let except = (!held_there).then_some(source);
        let held = delivery.qos != QoS::AtMostOnce
            && self.cluster.as_ref().is_some_and(|c| {
                c.transfers.awaits(&client_id)
                    || (c.transfers.on_its_way(&client_id) && delivery.qos == QoS::ExactlyOnce)
                    || c.moves.holds(&c.owner.node, &client_id, &id.0.node, except)
            });
        if held {
            self.stats.messages_held_for_order += 1;
        }
        self.hand_to_session(sid, delivery, &mut None, Some(id), held);
    }

    /// Take the word of the node that shipped `client_id`'s session here for what the session
    /// had of other nodes' messages (`said`), as far as it counts: each of those nodes is sent
    /// a fence now, whose echo bounds it to what the node published before ([`Vouched`]).
    pub(super) fn vouch(&mut self, client_id: &str, said: Intake) {
        let Ok(key) = ClientId::new(client_id) else {
            return;
        };
        if said.is_empty() {
            return;
        }
        let Some(c) = &mut self.cluster else { return };
        let token = c.moves.next_token;
        c.moves.next_token += 1;
        let nodes = said.nodes();
        let up: Vec<NodeId> = nodes
            .iter()
            .filter(|n| c.peers.get(*n).is_some_and(|p| p.connected))
            .cloned()
            .collect();
        let v = c.moves.vouched.entry(key).or_default();
        v.said.merge(&said);
        for node in nodes {
            v.fences.insert(node, token);
        }
        for node in up {
            self.send_to_peer(node, Frame::Fence { token });
        }
        self.persist_intake(client_id);
    }

    /// A message of `origin` numbered `seq` came straight from it: its link brings them in
    /// order, so what senders said of its messages numbered below what its echo said is of
    /// none that may still come.
    pub(super) fn vouched_passed(&mut self, origin: &Owner, seq: u64) {
        let Some(c) = &mut self.cluster else { return };
        if c.moves.vouched.is_empty() {
            return;
        }
        let mut passed = Vec::new();
        for (client_id, v) in c.moves.vouched.iter_mut() {
            let past = v
                .echoed
                .get(&origin.node)
                .is_some_and(|&(incarnation, next)| {
                    origin.incarnation > incarnation
                        || (origin.incarnation == incarnation && seq >= next)
                });
            if past && v.passed.insert(origin.node.clone()) {
                passed.push(client_id.clone());
            }
        }
        for client_id in passed {
            let Some(c) = &mut self.cluster else { return };
            c.moves.settle_vouched(&client_id);
            self.persist_intake(&client_id);
        }
    }

    /// `node` echoed fence `token`, saying its incarnation and next number then (or, `None`,
    /// is gone): what senders said of its messages counts, where that fence was the one
    /// awaited, only for messages numbered below (or for none).
    fn vouched_echo(&mut self, node: &NodeId, echo: Option<(u64, (u64, u64))>) {
        let Some(c) = &mut self.cluster else { return };
        if c.moves.vouched.is_empty() {
            return;
        }
        let mut changed = Vec::new();
        for (client_id, v) in c.moves.vouched.iter_mut() {
            match echo {
                Some((token, at)) if v.fences.get(node) == Some(&token) => {
                    v.fences.remove(node);
                    v.echoed.insert(node.clone(), at);
                }
                // Gone: nothing of it comes any more, by any way.
                None if v.fences.contains_key(node) || v.echoed.contains_key(node) => {
                    v.forget(node);
                }
                _ => continue,
            }
            changed.push(client_id.clone());
        }
        for client_id in changed {
            let Some(c) = &mut self.cluster else { return };
            c.moves.settle_vouched(&client_id);
            self.persist_intake(&client_id);
        }
    }

    /// A session back on a node whose relay from an earlier stay still holds messages for the
    /// node it went then (behind a cut, or not acknowledged yet): they are the session's, older
    /// than what comes here from now on, so they are delivered here, before what the shipment
    /// brings, unless the session had them (`had`). The relay still sends them; what comes
    /// back of them by the relays the session went since is taken no second time.
    pub(super) fn take_back_relayed(&mut self, sid: SessionId, client_id: &str, had: &Intake) {
        let Some(c) = &self.cluster else { return };
        let pending: Vec<(MessageId, Delivery)> = c
            .moves
            .relays
            .iter()
            .filter(|((cid, _), _)| cid == client_id)
            .flat_map(|(_, r)| r.pending.values())
            .filter_map(|(id, delivery)| Some((id.clone()?, delivery.clone())))
            .filter(|(id, _)| !had.has(id) && !c.moves.vouched_has(client_id, id, true))
            .collect();
        for (id, delivery) in pending {
            let topic = delivery.message.topic.clone();
            let subscribed = self.session(sid).is_some_and(|s| {
                s.subscriptions
                    .keys()
                    .any(|f| crate::topic::matches(pattern(f), &topic))
            });
            if subscribed && self.may_receive(sid, &topic) {
                self.stats.messages_taken_back += 1;
                self.begin_peer_routing(id);
                self.deliver(sid, delivery, &mut None);
                self.end_routing();
            }
        }
    }

    /// Let the held messages of `client_id`'s session go whose node no relay may bring older
    /// messages of any more.
    pub(in crate::broker) fn release_held(&mut self, client_id: &str) {
        let Some(sid) = self.by_client_id.get(client_id).copied() else {
            return;
        };
        let Some(c) = &self.cluster else { return };
        let awaiting = c.transfers.awaits(client_id);
        let on_its_way = c.transfers.on_its_way(client_id);
        let (moves, me) = (&c.moves, &c.owner.node);
        let Some(session) = self.sessions.get_mut(sid as usize).and_then(Option::as_mut) else {
            return;
        };
        if session.queue.held() == 0 {
            return;
        }
        let had = session.queue.release(&mut session.next_seq, |id, m| {
            awaiting
                || (on_its_way && m.delivery.qos == QoS::ExactlyOnce)
                || moves.holds(me, client_id, &id.0.node, None)
        });
        if had.is_empty() {
            return;
        }
        // Stored again at their new places, no longer held: a restart finds them there.
        if session.is_persistent() {
            let records: Vec<_> = session
                .queue
                .last(had.len())
                .map(|m| {
                    let key = Key::Queued {
                        client_id: client_id.to_owned(),
                        seq: m.seq,
                    };
                    let value =
                        persist::encode_queued_with(None, &m.delivery, m.id.as_deref(), false);
                    (key.encode(), value)
                })
                .collect();
            for seq in had {
                let key = Key::Queued {
                    client_id: client_id.to_owned(),
                    seq,
                };
                self.persist(key.encode(), None);
            }
            for (key, value) in records {
                self.persist(key, Some(value));
            }
        }
        self.pump(sid);
    }

    /// The hold of a session that moved here ran out: what it held goes.
    pub(in crate::broker) fn order_wait_over(&mut self, sid: SessionId) {
        let now = self.now;
        let Some(session) = self.session(sid) else {
            return;
        };
        let (client_id, held) = (session.client_id.clone(), session.queue.held());
        let Some(w) = self
            .cluster
            .as_mut()
            .and_then(|c| c.moves.windows.get_mut(&client_id))
        else {
            return;
        };
        // A later hold, or a slot given to another session since, is not this timer's.
        if w.hold_until.is_none_or(|t| t > now) {
            return;
        }
        w.hold_until = None;
        // A shipment expected that did not come: the node it was expected from had no part
        // of the session (or passed it on); what it ships later is taken as it comes.
        w.sources.retain(|_, s| !s.expected);
        w.fence = None;
        let closed = w.is_done();
        if held > 0 {
            self.stats.session_order_waits_over += 1;
        }
        if closed {
            return self.close_window(&client_id);
        }
        self.release_held(&client_id);
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
            .filter(|s| !s.expected)
            .map(|s| &mut s.last)
        else {
            self.peer_fault(peer, PeerFault::NotOwner(FrameKind::SessionRelay));
            return;
        };
        if r.n <= *last {
            // Sent again after a cut: taken already.
            return self.ack_relay(peer, r.client_id, r.claim, r.n);
        }
        *last = r.n;
        let here = self.by_client_id.get(r.client_id.as_str()).copied();
        // The session moved on: what comes for it goes where it went last (the relay for the
        // latest claim), as it is (the node before matched it to the session).
        let onward = here
            .is_none()
            .then(|| self.cluster.as_ref()?.moves.latest_relay(&r.client_id));
        let p = r.message;
        let (qos, retain) = (p.qos, p.retain);
        let message = Arc::new(link_message(p, now));
        let topic = message.topic.clone();
        let delivery = Delivery::new(message, qos, retain, Vec::new(), None);
        self.begin_peer_routing((r.origin, r.seq));
        match (here, onward) {
            (_, Some(Some(key))) => self.relay_delivery(&key, delivery),
            (Some(sid), _) => {
                // For a subscription the session still has (or whose subscriptions are on
                // their way here), as the access rules allow; once, whichever way it came
                // ([`Broker::moving_delivery`], in `deliver`).
                let on_its_way = self
                    .cluster
                    .as_ref()
                    .is_some_and(|c| c.transfers.on_its_way(&r.client_id));
                let subscribed = on_its_way
                    || self.session(sid).is_some_and(|s| {
                        s.subscriptions
                            .keys()
                            .any(|f| crate::topic::matches(pattern(f), &topic))
                    });
                // A copy of one its sender said the session had: taken no second time.
                let vouched = self.routing_id().is_some_and(|id| {
                    self.cluster
                        .as_ref()
                        .is_some_and(|c| c.moves.vouched_has(&r.client_id, &id, true))
                });
                if vouched {
                    self.stats.dropped_moved_twice += 1;
                } else if subscribed && self.may_receive(sid, &topic) {
                    self.deliver(sid, delivery, &mut None);
                }
            }
            _ => self.stats.sessions_transfers_refused += 1,
        }
        self.end_routing();
        self.ack_relay(peer, r.client_id, r.claim, r.n);
    }

    /// The nodes that shipped these sessions on: their routes are everywhere now.
    fn tell_routed(&mut self, told: Vec<RoutedOnward>) {
        for o in told {
            self.send_to_peer(
                o.to,
                Frame::SessionRouted {
                    client_id: o.client_id,
                    claim: o.claim,
                },
            );
        }
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

    /// The old node of a session relays nothing more to it (and the relay from here, if the
    /// session moved on, may end).
    pub(super) fn on_relay_done(&mut self, peer: &NodeId, client_id: &str, claim: Stamp) {
        let Some(c) = &mut self.cluster else { return };
        let closed = c.moves.windows.get_mut(client_id).is_some_and(|w| {
            let source = (peer.clone(), claim);
            if w.sources.get(&source).is_some_and(|s| !s.expected) {
                w.sources.remove(&source);
            }
            w.is_done()
        });
        if closed {
            self.close_window(client_id);
        } else {
            // One relay fewer to wait for: its nodes' messages may go.
            self.release_held(client_id);
            self.relay_markers(client_id);
        }
        self.settle_moves();
    }

    /// The old node of a session relayed everything `node` had routed to it first.
    pub(super) fn on_relay_caught_up(
        &mut self,
        peer: &NodeId,
        client_id: &str,
        claim: Stamp,
        node: NodeId,
    ) {
        let Some(c) = &mut self.cluster else { return };
        let max_nodes = c.config.max_nodes;
        // Only the node that shipped the session here speaks for its relay.
        let Some(source) = c
            .moves
            .windows
            .get_mut(client_id)
            .and_then(|w| w.sources.get_mut(&(peer.clone(), claim)))
            .filter(|s| !s.expected)
        else {
            self.peer_fault(peer, PeerFault::NotOwner(FrameKind::SessionRelayCaughtUp));
            return;
        };
        if source.caught_up.len() > max_nodes {
            return;
        }
        source.caught_up.insert(node);
        self.release_held(client_id);
        self.relay_markers(client_id);
    }

    /// No relay may come to `client_id`'s session any more: what it took is settled, and
    /// nothing waits for its order.
    fn close_window(&mut self, client_id: &str) {
        let Some(c) = &mut self.cluster else { return };
        c.moves.windows.remove(client_id);
        // No relay comes any more: what senders said counts for what comes straight only.
        c.moves.settle_vouched(client_id);
        self.forget_took(client_id);
        let Some(c) = &mut self.cluster else { return };
        // Unless the session here is a part, another node holding the rest (what was routed
        // there, older messages among it, comes with that rest or relayed after it).
        if !c.transfers.on_its_way(client_id)
            && let Some(intake) = c.moves.intakes.get_mut(client_id)
        {
            intake.settle();
        }
        self.persist_intake(client_id);
        self.release_held(client_id);
        self.relay_markers(client_id);
    }

    /// A node left the deployment: nothing more comes from it, and nothing goes to it.
    pub(super) fn moves_forget_node(&mut self, node: &NodeId) {
        self.transfers_forget_node(node);
        // A node gone sends nothing more: what was said of its messages matters no more.
        self.vouched_echo(node, None);
        let Some(c) = &mut self.cluster else { return };
        let closed: Vec<ClientId> = c
            .moves
            .windows
            .iter_mut()
            .filter_map(|(client_id, w)| {
                let before = w.sources.len();
                w.sources.retain(|(from, _), _| from != node);
                let echoed = w
                    .fence
                    .as_mut()
                    .is_some_and(|(_, waiting)| waiting.remove(node));
                ((w.sources.len() < before || echoed) && w.is_done()).then(|| client_id.clone())
            })
            .collect();
        for client_id in closed {
            self.close_window(&client_id);
        }
        let Some(c) = &mut self.cluster else { return };
        c.moves.answers.retain(|a| a.to != *node);
        // A node gone can answer no more: those waiting for it are told now.
        let (told, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut c.moves.routed_onward)
            .into_iter()
            .filter(|o| o.to != *node)
            .partition(|o| o.next.node == *node);
        c.moves.routed_onward = waiting;
        self.tell_routed(told);
        let Some(c) = &mut self.cluster else { return };
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

    /// What a session that moved here took, and the relays it waits for, read back from
    /// storage (its hold for order is over: what it held goes).
    pub(in crate::broker) fn restore_seen(
        &mut self,
        client_id: String,
        value: &[u8],
    ) -> Result<(), RecordError> {
        let Seen {
            sources,
            intake,
            awaiting,
        } = decode_seen(value)?;
        let Some(c) = &mut self.cluster else {
            return Ok(());
        };
        let Ok(key) = ClientId::new(&client_id) else {
            return Ok(());
        };
        if let Some(holder) = awaiting {
            // Its wait ran out with the restart: QoS 2 messages still wait for its state.
            c.transfers.restore_awaiting(key.clone(), holder, self.now);
        }
        if !sources.is_empty() {
            let w = c.moves.windows.entry(key.clone()).or_default();
            for source in sources {
                w.sources.entry(source).or_default();
            }
        }
        if !intake.is_empty() {
            c.moves.intakes.entry(key).or_default().merge(&intake);
        }
        Ok(())
    }

    /// Whether relays may still bring `client_id`'s session older messages (its state is on
    /// its way, or a relay to it runs).
    pub(in crate::broker) fn may_get_older(&self, client_id: &str) -> bool {
        self.cluster.as_ref().is_some_and(|c| {
            c.moves.windows.contains_key(client_id) || c.transfers.on_its_way(client_id)
        })
    }

    /// After a restart: what sessions took here that are no longer here (shipped on, ended)
    /// goes, records included, as it went when they left ([`Broker::moved_session_left`]; a
    /// window that passes relays on stays). A record of a message a session took, left behind
    /// when the session went on (one its intake had folded, or let go of, since), would
    /// otherwise count that message as had here: held here once and shipped on, it would be
    /// dropped as a duplicate when the session, back here later, brings it.
    fn forget_intakes_of_sessions_gone(&mut self) {
        let Some(c) = &self.cluster else { return };
        let gone: Vec<String> = c
            .moves
            .intakes
            .keys()
            .filter(|client_id| {
                !self.by_client_id.contains_key(client_id.as_str())
                    && !c.transfers.on_its_way(client_id.as_str())
            })
            .map(ToString::to_string)
            .collect();
        for client_id in gone {
            self.forget_took(&client_id);
            if let Some(c) = &mut self.cluster {
                c.moves.intakes.remove(client_id.as_str());
            }
            self.persist_intake(&client_id);
        }
    }

    /// After a restart: the sessions that moved here and may still get older messages by
    /// relays hold back what they held for a bound of their own again (what nothing holds
    /// any more goes).
    pub(in crate::broker) fn restart_holds(&mut self) {
        self.forget_intakes_of_sessions_gone();
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let until = now.plus_ms(c.config.session_order_wait_ms);
        let mut held = Vec::new();
        for (client_id, w) in c.moves.windows.iter_mut() {
            if let Some(&sid) = self.by_client_id.get(client_id.as_str()) {
                w.hold_until = Some(until);
                held.push((client_id.clone(), sid));
            }
        }
        for (client_id, sid) in held {
            self.timers.insert((until, Timer::OrderWait(sid)));
            self.release_held(&client_id);
        }
        let sessions: Vec<(ClientId, SessionId)> = self
            .by_client_id
            .iter()
            .map(|(c, s)| (c.clone(), *s))
            .collect();
        for (client_id, sid) in sessions {
            if self.session(sid).is_some_and(|s| s.queue.held() > 0) {
                self.release_held(&client_id);
            }
        }
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
        let incarnation = c.owner.incarnation;
        let relay = c
            .moves
            .relays
            .entry((client_id, claim))
            .or_insert_with(|| Relay::new(to, None, incarnation, Some((0, BTreeSet::new()))));
        relay.next_n = relay.next_n.max(n + 1);
        relay.pending.insert(n, (id, delivery));
        Ok(())
    }
}

/// What a [`Key::Seen`] record holds.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// The relays a session that moved here waits for (none in a shipped session).
    pub sources: Vec<(NodeId, Stamp)>,
    /// What the session took.
    pub intake: Intake,
    /// The node the session's state was waiting for, from there; in a shipped session: its
    /// sender was itself waiting for it, so more of it comes.
    pub awaiting: Option<NodeId>,
}

/// Relays are bounded by the nodes a deployment may have.
const SOURCES_KEPT: usize = 4_096;

impl Seen {
    fn encode(&self) -> Bytes {
        let mut v = BytesMut::new();
        v.put_u8(1);
        match &self.awaiting {
            None => v.put_u8(0),
            Some(holder) => {
                v.put_u8(1);
                persist::put_string(&mut v, holder.as_str());
            }
        }
        v.put_u32(u32::try_from(self.sources.len()).unwrap_or(u32::MAX));
        for (from, claim) in &self.sources {
            persist::put_string(&mut v, from.as_str());
            persist::put_stamp_value(&mut v, claim);
        }
        self.intake.encode(&mut v);
        v.freeze()
    }
}

pub(super) fn decode_seen(value: &[u8]) -> Result<Seen, RecordError> {
    let mut r = persist::Reader::new("seen messages", value)?;
    let awaiting = match r.u8()? {
        0 => None,
        _ => Some(r.node()?),
    };
    let count = r.u32()? as usize;
    if count > SOURCES_KEPT {
        return Err(r.fail("too many relays"));
    }
    let mut sources = Vec::with_capacity(count);
    for _ in 0..count {
        sources.push((r.node()?, r.stamp()?));
    }
    Ok(Seen {
        sources,
        intake: Intake::decode(&mut r)?,
        awaiting,
    })
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
