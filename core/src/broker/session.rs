//! Session state: what survives a connection (subscriptions, QoS 1/2 messages in flight and
//! queued, incoming QoS 2 packet ids) for as long as the session lasts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::client_id::ClientId;
use super::io::{ConnId, Timestamp};
use super::message::{Delivery, Message};
use crate::codec::{ProtocolVersion, SubscriptionOptions};
use crate::link::MessageId;
use crate::routes::NodeId;
use std::sync::Arc;

/// Index of a session in the broker's session table.
pub(crate) type SessionId = u32;

/// A subscription as the session remembers it (key: the full filter text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SubscriptionEntry {
    pub options: SubscriptionOptions,
    pub subscription_id: Option<u32>,
}

/// A session's subscriptions by filter text, in a sorted vector: most sessions hold a few,
/// and a B-tree's smallest node has room for eleven.
#[derive(Debug, Default)]
pub(crate) struct Subscriptions(Vec<(String, SubscriptionEntry)>);

impl Subscriptions {
    fn position(&self, filter: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(f, _)| f.as_str().cmp(filter))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn contains_key(&self, filter: &str) -> bool {
        self.position(filter).is_ok()
    }

    /// Add or replace; the entry it replaced.
    pub fn insert(
        &mut self,
        filter: String,
        entry: SubscriptionEntry,
    ) -> Option<SubscriptionEntry> {
        match self.position(&filter) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, entry)),
            Err(i) => {
                // Most sessions hold one subscription: no room for more until a second comes.
                self.0.reserve_exact(usize::from(self.0.is_empty()));
                self.0.insert(i, (filter, entry));
                None
            }
        }
    }

    pub fn remove(&mut self, filter: &str) -> Option<SubscriptionEntry> {
        let i = self.position(filter).ok()?;
        Some(self.0.remove(i).1)
    }

    /// In filter order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &SubscriptionEntry)> {
        self.0.iter().map(|(f, e)| (f, e))
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(f, _)| f)
    }
}

/// Where an outgoing QoS 1/2 message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InflightState {
    /// PUBLISH sent, waiting for PUBACK (QoS 1) or PUBREC (QoS 2).
    AwaitAck,
    /// PUBREL sent, waiting for PUBCOMP.
    AwaitComp,
}

#[derive(Debug, Clone)]
pub(crate) struct Inflight {
    pub packet_id: u16,
    pub state: InflightState,
    pub delivery: Delivery,
    /// Persistence key sequence, when the session is persistent.
    pub seq: u64,
    /// Sent on the current connection. After a reconnect, entries are re-sent as the client's
    /// Receive Maximum allows.
    pub sent: bool,
}

/// A session's QoS 1/2 messages in flight, oldest first.
///
/// Every delivery and every acknowledgement looks up a packet id, so the ids in use are kept
/// sorted beside the entries, and the entries waiting to be re-sent after a reconnect are
/// counted: nothing on the publish path walks the window. A session that never had a message
/// in flight keeps no window: its storage is boxed and made by the first entry. An emptied
/// window frees its buffers.
#[derive(Debug, Default)]
pub(crate) struct InflightWindow {
    store: Option<Box<WindowStore>>,
    next_packet_id: u16,
}

#[derive(Debug, Default)]
struct WindowStore {
    entries: VecDeque<Inflight>,
    /// The packet ids of `entries`, sorted. Ids are given out in increasing order and mostly
    /// acknowledged in that order, so the ends of this deque take most of the work: a new id
    /// goes at the back, an acknowledged one leaves from the front.
    ids: VecDeque<u16>,
    /// Entries with `sent == false`.
    unsent: usize,
    /// The weight ([`super::Message::weight`]) of the entries' messages.
    bytes: usize,
}

impl WindowStore {
    fn holds(&self, packet_id: u16) -> bool {
        match (self.ids.front(), self.ids.back()) {
            // Outside the range in flight: the usual answer for a new id.
            (Some(&first), Some(&last)) if packet_id < first || packet_id > last => false,
            (Some(_), Some(_)) => self.ids.binary_search(&packet_id).is_ok(),
            _ => false,
        }
    }
}

impl InflightWindow {
    pub fn len(&self) -> usize {
        self.store.as_ref().map_or(0, |s| s.entries.len())
    }

    pub fn iter(&self) -> impl Iterator<Item = &Inflight> {
        self.store.iter().flat_map(|s| s.entries.iter())
    }

    /// The entry holding `packet_id`. Acknowledgements mostly come in order, so the search
    /// starts at the oldest.
    pub fn position(&self, packet_id: u16) -> Option<usize> {
        let s = self.store.as_ref()?;
        if s.entries.front()?.packet_id == packet_id {
            return Some(0);
        }
        if !s.holds(packet_id) {
            return None;
        }
        s.entries.iter().position(|m| m.packet_id == packet_id)
    }

    pub fn holds(&self, packet_id: u16) -> bool {
        self.store.as_ref().is_some_and(|s| s.holds(packet_id))
    }

    /// A packet id no entry holds. The window is bounded by a `u16` Receive Maximum, so a
    /// free id always exists.
    pub fn allocate_packet_id(&mut self) -> u16 {
        loop {
            let id = self.next_packet_id.max(1);
            self.next_packet_id = if id == u16::MAX { 1 } else { id + 1 };
            if !self.holds(id) {
                return id;
            }
        }
    }

    /// Add the newest entry. Its packet id must be free.
    pub fn push(&mut self, entry: Inflight) {
        let s = self.store.get_or_insert_with(Box::default);
        let id = entry.packet_id;
        if s.ids.back().is_none_or(|&last| last < id) {
            s.ids.push_back(id);
        } else {
            match s.ids.binary_search(&id) {
                Ok(_) => debug_assert!(false, "packet id {id} already in flight"),
                Err(i) => s.ids.insert(i, id),
            }
        }
        s.unsent += usize::from(!entry.sent);
        s.bytes += entry.delivery.message.weight();
        s.entries.push_back(entry);
    }

    /// The weight ([`super::Message::weight`]) of the messages in flight.
    pub fn bytes(&self) -> usize {
        self.store.as_ref().map_or(0, |s| s.bytes)
    }

    /// Whether a message of `weight` fits beside what is in flight: within `window` messages,
    /// and within `max_bytes` unless the window is empty (a message larger than the bound
    /// still goes, alone).
    pub fn has_room(&self, window: usize, weight: usize, max_bytes: usize) -> bool {
        let len = self.len();
        len < window && (len == 0 || self.bytes() + weight <= max_bytes)
    }

    pub fn remove(&mut self, pos: usize) -> Option<Inflight> {
        let s = self.store.as_mut()?;
        let entry = s.entries.remove(pos)?;
        if s.ids.front() == Some(&entry.packet_id) {
            s.ids.pop_front();
        } else if let Ok(i) = s.ids.binary_search(&entry.packet_id) {
            s.ids.remove(i);
        }
        s.unsent -= usize::from(!entry.sent);
        // A message's weight never changes (detaching copies its bytes as they are).
        debug_assert!(s.bytes >= entry.delivery.message.weight());
        s.bytes = s.bytes.saturating_sub(entry.delivery.message.weight());
        if s.entries.is_empty() {
            // The buffers go; the box stays for the next message rather than be made again.
            s.entries = VecDeque::new();
            s.ids = VecDeque::new();
        }
        Some(entry)
    }

    /// The first entry not yet sent on the current connection.
    pub fn first_unsent(&self) -> Option<usize> {
        let s = self.store.as_ref()?;
        if s.unsent == 0 {
            return None;
        }
        s.entries.iter().position(|m| !m.sent)
    }

    /// Entries sent on the current connection.
    pub fn sent(&self) -> usize {
        self.store
            .as_ref()
            .map_or(0, |s| s.entries.len() - s.unsent)
    }

    /// Mark an entry sent on the current connection. `pos` must hold an entry.
    pub fn mark_sent(&mut self, pos: usize) -> &Inflight {
        let s = self.store_mut();
        let entry = &mut s.entries[pos];
        s.unsent -= usize::from(!entry.sent);
        entry.sent = true;
        entry
    }

    /// A new connection: every entry is to be re-sent.
    pub fn mark_all_unsent(&mut self) {
        if let Some(s) = self.store.as_mut() {
            for m in &mut s.entries {
                m.sent = false;
            }
            s.unsent = s.entries.len();
        }
    }

    /// The connection was resumed in a rebuilt broker: every entry restored was sent on it
    /// (its record is stored before it is written), and must not be sent again.
    pub fn mark_all_sent(&mut self) {
        if let Some(s) = self.store.as_mut() {
            for m in &mut s.entries {
                m.sent = true;
            }
            s.unsent = 0;
        }
    }

    /// The session lost its connection: what is in flight may now wait long, so each message
    /// gets bytes of its own ([`Message::detach`]).
    pub fn detach_messages(&mut self) {
        for m in self.store.iter_mut().flat_map(|s| s.entries.iter_mut()) {
            m.delivery.message = Arc::new(m.delivery.message.detached());
        }
    }

    /// `pos` must hold an entry.
    pub fn set_state(&mut self, pos: usize, state: InflightState) {
        self.store_mut().entries[pos].state = state;
    }

    /// The storage, for an operation on an entry that must exist: an empty window has none,
    /// and indexing it is a bug, as indexing an empty `VecDeque` is.
    fn store_mut(&mut self) -> &mut WindowStore {
        match self.store.as_deref_mut() {
            Some(s) => s,
            None => panic!("in-flight window indexed while empty"),
        }
    }
}

impl std::ops::Index<usize> for InflightWindow {
    type Output = Inflight;

    /// `pos` must hold an entry.
    fn index(&self, pos: usize) -> &Inflight {
        match self.store.as_deref() {
            Some(s) => &s.entries[pos],
            None => panic!("in-flight window indexed while empty"),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Queued {
    pub delivery: Delivery,
    pub seq: u64,
    /// The message's identity in the deployment, when it came routed by a cluster: a session
    /// that moves takes it along, so that its new node knows the message's place in its
    /// origin's order (and that it had it).
    pub id: Option<Box<MessageId>>,
}

/// A session's queued QoS 1/2 messages, oldest first, and their weight in bytes. A session that
/// never queued a message keeps no queue: its storage is boxed and made by the first message.
/// An emptied queue keeps its storage: a subscriber that falls behind tends to do so again,
/// and a queue that fills and drains at the message rate must not allocate each time.
///
/// Beside the messages ready to go, a session that just moved holds back the messages of the
/// nodes that may still bring it older ones by its old node
/// ([`crate::broker::cluster`]'s relays): they count as queued (limits, records, a move
/// onward) but go only once released, each node's in its own order.
#[derive(Debug, Default)]
pub(crate) struct MessageQueue(Option<Box<QueueStore>>);

#[derive(Debug, Default)]
struct QueueStore {
    messages: VecDeque<Queued>,
    /// Held back, in the order they came; each has its identity in the deployment.
    held: Vec<Queued>,
    /// The sum of the messages' weights, held ones included.
    bytes: usize,
}

impl MessageQueue {
    /// Queued messages, held ones included.
    pub fn len(&self) -> usize {
        self.0
            .as_ref()
            .map_or(0, |q| q.messages.len() + q.held.len())
    }

    /// Messages held back.
    pub fn held(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.held.len())
    }

    /// Whether no message is ready to go (held ones wait anyway).
    pub fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|q| q.messages.is_empty())
    }

    /// The queued messages' weight, held ones included.
    pub fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.bytes)
    }

    /// Every queued message: those ready to go, in order, then the held ones, each node's in
    /// its order (a session that moves on takes them in this order).
    pub fn iter(&self) -> impl Iterator<Item = &Queued> {
        self.iter_marked().map(|(_, m)| m)
    }

    /// As [`MessageQueue::iter`], each message with whether it is held back.
    pub fn iter_marked(&self) -> impl Iterator<Item = (bool, &Queued)> {
        self.0.iter().flat_map(|q| {
            let order = origin_order(q.held.iter().filter_map(|m| m.id.as_deref()));
            let held = order.into_iter().map(|i| (true, &q.held[i]));
            q.messages.iter().map(|m| (false, m)).chain(held)
        })
    }

    /// The next message ready to go.
    pub fn front(&self) -> Option<&Queued> {
        self.0.as_ref()?.messages.front()
    }

    pub fn push_back(&mut self, queued: Queued) {
        let store = self.0.get_or_insert_with(Box::default);
        store.bytes += queued.delivery.message.weight();
        store.messages.push_back(queued);
    }

    /// Queue a message, ready to go or held back until [`MessageQueue::release`] lets its
    /// origin go (only a message with its identity can be: its origin's order is known).
    pub fn enqueue(&mut self, held: bool, queued: Queued) {
        if !held || queued.id.is_none() {
            return self.push_back(queued);
        }
        let store = self.0.get_or_insert_with(Box::default);
        store.bytes += queued.delivery.message.weight();
        store.held.push(queued);
    }

    /// Let the held messages whose origin `still_held` does not keep join the messages ready
    /// to go, each origin's in its numbers' order, each taking the next sequence number from
    /// `next_seq` (the queue stays in its numbers' order, as it is stored). Returns the numbers
    /// they had; they are the last ones of the queue now.
    pub fn release(
        &mut self,
        next_seq: &mut u64,
        still_held: impl Fn(&MessageId, &Queued) -> bool,
    ) -> Vec<u64> {
        let Some(store) = self.0.as_mut() else {
            return Vec::new();
        };
        if store.held.is_empty() {
            return Vec::new();
        }
        let (keep, go): (Vec<_>, Vec<_>) = std::mem::take(&mut store.held)
            .into_iter()
            .partition(|m| m.id.as_deref().is_some_and(|id| still_held(id, m)));
        store.held = keep;
        let order = origin_order(go.iter().filter_map(|m| m.id.as_deref()));
        let mut go: Vec<Option<Queued>> = go.into_iter().map(Some).collect();
        let mut had = Vec::with_capacity(go.len());
        for i in order {
            if let Some(mut m) = go[i].take() {
                had.push(m.seq);
                m.seq = *next_seq;
                *next_seq += 1;
                store.messages.push_back(m);
            }
        }
        had
    }

    /// The last `n` messages ready to go.
    pub fn last(&self, n: usize) -> impl Iterator<Item = &Queued> {
        let messages = self.0.iter().flat_map(|q| q.messages.iter());
        let len = self.0.as_ref().map_or(0, |q| q.messages.len());
        messages.skip(len.saturating_sub(n))
    }

    pub fn pop_front(&mut self) -> Option<Queued> {
        let store = self.0.as_mut()?;
        let queued = store.messages.pop_front()?;
        store.bytes -= queued.delivery.message.weight();
        Some(queued)
    }

    /// Take out the message with this sequence number (held or not).
    pub fn remove_seq(&mut self, seq: u64) -> Option<Queued> {
        let store = self.0.as_mut()?;
        let queued = match store.messages.iter().position(|q| q.seq == seq) {
            Some(index) => store.messages.remove(index)?,
            None => {
                let index = store.held.iter().position(|q| q.seq == seq)?;
                store.held.remove(index)
            }
        };
        store.bytes -= queued.delivery.message.weight();
        Some(queued)
    }

    /// Keep the messages (held or not) for which `keep` is true, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&Queued) -> bool) {
        let Some(store) = self.0.as_mut() else {
            return;
        };
        let bytes = &mut store.bytes;
        let mut keep = |q: &Queued| {
            let kept = keep(q);
            if !kept {
                *bytes -= q.delivery.message.weight();
            }
            kept
        };
        store.messages.retain(|q| keep(q));
        store.held.retain(|q| keep(q));
    }

    /// Drop the held messages `gone` names (taken by the session already, as it turned out),
    /// and return their sequence numbers.
    pub fn drop_held(&mut self, gone: impl Fn(&MessageId) -> bool) -> Vec<u64> {
        let Some(store) = self.0.as_mut() else {
            return Vec::new();
        };
        let mut seqs = Vec::new();
        store.held.retain(|q| {
            let drop = q.id.as_deref().is_some_and(&gone);
            if drop {
                store.bytes -= q.delivery.message.weight();
                seqs.push(q.seq);
            }
            !drop
        });
        seqs
    }
}

/// The order held messages go in, as indices into `ids`: the order they came, except that
/// each node's messages take the places its messages came in, in the order they were
/// published (by incarnation, then number).
pub(in crate::broker) fn origin_order<'a>(ids: impl Iterator<Item = &'a MessageId>) -> Vec<usize> {
    let ids: Vec<&MessageId> = ids.collect();
    let mut slots: BTreeMap<&NodeId, Vec<usize>> = BTreeMap::new();
    for (i, id) in ids.iter().enumerate() {
        slots.entry(&id.0.node).or_default().push(i);
    }
    let mut order: Vec<usize> = (0..ids.len()).collect();
    for positions in slots.values() {
        let mut by_number = positions.clone();
        by_number.sort_by_key(|&i| (ids[i].0.incarnation, ids[i].1));
        for (&slot, &i) in positions.iter().zip(&by_number) {
            order[slot] = i;
        }
    }
    order
}

/// Packet ids of incoming QoS 2 messages PUBREC'd and waiting for their PUBREL. Made on the
/// first: most sessions never receive QoS 2, and an empty set inline takes 24 bytes.
#[derive(Debug, Default)]
#[expect(
    clippy::box_collection,
    reason = "boxed, the set takes 8 bytes in every session instead of 24"
)]
pub(crate) struct PacketIdSet(Option<Box<BTreeSet<u16>>>);

impl PacketIdSet {
    pub fn contains(&self, id: u16) -> bool {
        self.0.as_ref().is_some_and(|ids| ids.contains(&id))
    }

    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |ids| ids.len())
    }

    pub fn insert(&mut self, id: u16) {
        self.0.get_or_insert_default().insert(id);
    }

    /// Whether `id` was there.
    pub fn remove(&mut self, id: u16) -> bool {
        self.0.as_mut().is_some_and(|ids| ids.remove(&id))
    }

    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().flat_map(|ids| ids.iter().copied())
    }
}

/// Whether a checkpoint of a session may be in storage, and whether it changed since: one
/// byte, so that it fits beside the session's other small fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Checkpoint {
    #[default]
    None,
    Unsaved,
    Stored,
    StoredUnsaved,
}

impl Checkpoint {
    /// A checkpoint of it may be in storage (so ending it must delete it).
    pub fn is_stored(self) -> bool {
        matches!(self, Self::Stored | Self::StoredUnsaved)
    }

    /// Changed since the last checkpoint.
    pub fn is_unsaved(self) -> bool {
        matches!(self, Self::Unsaved | Self::StoredUnsaved)
    }

    pub fn with_stored(self, stored: bool) -> Self {
        Self::of(stored, self.is_unsaved())
    }

    pub fn with_unsaved(self, unsaved: bool) -> Self {
        Self::of(self.is_stored(), unsaved)
    }

    fn of(stored: bool, unsaved: bool) -> Self {
        match (stored, unsaved) {
            (false, false) => Self::None,
            (false, true) => Self::Unsaved,
            (true, false) => Self::Stored,
            (true, true) => Self::StoredUnsaved,
        }
    }
}

/// A will message waiting for its connection to end or its delay to pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Will {
    pub message: Message,
    pub delay_secs: u32,
}

#[derive(Debug)]
pub(crate) struct Session {
    pub client_id: ClientId,
    pub username: Option<Box<str>>,
    pub protocol: ProtocolVersion,
    pub conn: Option<ConnId>,
    /// Seconds the session outlives its connection; 0 ends it with the connection,
    /// `u32::MAX` never expires.
    pub expiry_secs: u32,
    /// When the session lost its connection (persisted: expiry counts from here).
    pub disconnected_at: Option<Timestamp>,
    pub subscriptions: Subscriptions,
    pub inflight: InflightWindow,
    pub queue: MessageQueue,
    /// Incoming QoS 2 packet ids PUBREC'd and waiting for PUBREL.
    pub incoming_qos2: PacketIdSet,
    pub next_seq: u64,
    /// The will of the current connection (boxed: most sessions have none).
    pub will: Option<Box<Will>>,
    /// A will whose connection ended, published at the given time unless the client comes back.
    pub pending_will: Option<(Box<Will>, Timestamp)>,
    /// Bumped on every connect and disconnect so that stale timers are recognised.
    pub generation: u64,
    /// Whether records of this session may be in storage (so ending it must delete them).
    pub persisted: bool,
    /// Where it stands against [`super::Broker::checkpoint`] (resumable connections only).
    pub checkpoint: Checkpoint,
    /// Bytes of its queued and in-flight messages as last counted in the broker's total
    /// ([`Session::held_bytes`]).
    pub accounted: usize,
    /// Changed since last counted (it is on the broker's list of sessions to count again).
    pub touched: bool,
}

impl Session {
    /// Payload and topic bytes of the messages it holds: queued and in flight.
    pub fn held_bytes(&self) -> usize {
        self.queue.bytes() + self.inflight.bytes()
    }

    pub fn new(client_id: ClientId, protocol: ProtocolVersion) -> Self {
        Self {
            client_id,
            username: None,
            protocol,
            conn: None,
            expiry_secs: 0,
            disconnected_at: None,
            subscriptions: Subscriptions::default(),
            inflight: InflightWindow::default(),
            queue: MessageQueue::default(),
            incoming_qos2: PacketIdSet::default(),
            next_seq: 1,
            will: None,
            pending_will: None,
            generation: 0,
            persisted: false,
            checkpoint: Checkpoint::default(),
            accounted: 0,
            touched: false,
        }
    }

    /// When the session expires: set while it has no connection, unless it never expires.
    pub fn expires_at(&self) -> Option<Timestamp> {
        self.disconnected_at
            .filter(|_| self.expiry_secs != u32::MAX)
            .map(|at| at.plus_secs(self.expiry_secs))
    }

    /// Persistent sessions outlive their connection and are written to storage.
    pub fn is_persistent(&self) -> bool {
        self.expiry_secs > 0
    }

    pub fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::QoS;
    use proptest::prelude::*;

    /// Bytes a session may take. Sessions are kept inline in the broker's session table, so
    /// every byte here is a byte per client. (176: 8 of them count its held bytes for the
    /// broker-wide budget, `max_held_bytes`.)
    const SESSION_BUDGET: usize = 176;

    /// Bytes a queued message takes in its session's queue, and an in-flight one in its
    /// window: one each per message and subscriber, so a fan-out to many slow or absent
    /// subscribers is counted in these. (40: 8 of them point to the message's identity in
    /// the deployment, boxed, as only a cluster gives one.)
    const QUEUED_BUDGET: usize = 40;
    const INFLIGHT_BUDGET: usize = 40;

    #[test]
    fn queued_and_inflight_messages_stay_within_their_budgets() {
        let (queued, inflight) = (size_of::<Queued>(), size_of::<Inflight>());
        assert!(
            queued <= QUEUED_BUDGET,
            "a queued message takes {queued} bytes"
        );
        assert!(
            inflight <= INFLIGHT_BUDGET,
            "an in-flight message takes {inflight} bytes"
        );
    }

    #[test]
    fn a_session_stays_within_its_budget() {
        let size = std::mem::size_of::<Option<Session>>();
        assert!(size <= SESSION_BUDGET, "a session takes {size} bytes");
    }

    #[test]
    fn packet_ids_are_kept_once_until_removed() {
        let mut ids = PacketIdSet::default();
        assert!(!ids.contains(7) && ids.len() == 0 && !ids.remove(7));
        ids.insert(7);
        ids.insert(3);
        ids.insert(7);
        assert_eq!(ids.len(), 2);
        assert_eq!(ids.iter().collect::<Vec<_>>(), [3, 7]);
        assert!(ids.remove(7) && !ids.remove(7) && ids.contains(3));
    }

    fn entry(packet_id: u16, seq: u64, sent: bool) -> Inflight {
        let message = Arc::new(Message {
            topic: "t".into(),
            payload: bytes::Bytes::new(),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: Default::default(),
            expires_at: None,
            origin: None,
        });
        Inflight {
            packet_id,
            state: InflightState::AwaitAck,
            delivery: Delivery::new(message, QoS::AtLeastOnce, false, Vec::new(), None),
            seq,
            sent,
        }
    }

    fn queued(seq: u64, payload: &'static [u8]) -> Queued {
        let mut q = entry(0, seq, false);
        Arc::make_mut(&mut q.delivery.message).payload = bytes::Bytes::from_static(payload);
        Queued {
            delivery: q.delivery,
            seq,
            id: None,
        }
    }

    #[test]
    fn a_queue_counts_its_weight_and_is_made_by_its_first_message() {
        let mut queue = MessageQueue::default();
        assert!(queue.is_empty() && queue.0.is_none());
        let weights: Vec<usize> = [&b"a"[..], b"bbbb", b"cccccccc"]
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let q = queued(i as u64, p);
                let w = q.delivery.message.weight();
                queue.push_back(q);
                w
            })
            .collect();
        assert_eq!(queue.len(), 3);
        assert_eq!(queue.bytes(), weights.iter().sum::<usize>());
        assert_eq!(queue.remove_seq(1).map(|q| q.seq), Some(1));
        assert_eq!(queue.bytes(), weights[0] + weights[2]);
        queue.retain(|q| q.seq != 0);
        assert_eq!(queue.bytes(), weights[2]);
        assert_eq!(queue.pop_front().map(|q| q.seq), Some(2));
        assert!(queue.is_empty());
        assert_eq!((queue.len(), queue.bytes()), (0, 0));
        assert!(queue.pop_front().is_none() && queue.remove_seq(0).is_none());
        queue.push_back(queued(3, b"x"));
        queue.retain(|_| false);
        assert_eq!((queue.len(), queue.bytes()), (0, 0));
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// Allocate a packet id and add an entry (sent unless resending is under way).
        Deliver,
        /// Restore an entry with this packet id (unsent), as from storage.
        Restore(u16),
        /// Acknowledge the entry at this index (modulo the length).
        Ack(usize),
        Reconnect,
        ResendOne,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => Just(Op::Deliver),
            1 => (1u16..=8).prop_map(Op::Restore),
            4 => any::<usize>().prop_map(Op::Ack),
            1 => Just(Op::Reconnect),
            2 => Just(Op::ResendOne),
        ]
    }

    proptest! {
        /// The window answers as a plain list of entries would: free packet ids are never held,
        /// lookups find the entry, and the unsent count matches the flags.
        #[test]
        fn window_agrees_with_a_plain_list(
            ops in proptest::collection::vec(op(), 0..300),
            // Near the top, packet ids wrap around to 1 during the run.
            start in prop_oneof![Just(0u16), (u16::MAX - 200)..=u16::MAX],
        ) {
            let mut w = InflightWindow {
                next_packet_id: start,
                ..Default::default()
            };
            let mut model: Vec<(u16, bool)> = Vec::new();
            for (seq, op) in (0u64..).zip(ops) {
                match op {
                    Op::Deliver => {
                        let id = w.allocate_packet_id();
                        prop_assert!(id != 0);
                        prop_assert!(!model.iter().any(|(m, _)| *m == id), "id {} is held", id);
                        w.push(entry(id, seq, true));
                        model.push((id, true));
                    }
                    Op::Restore(id) => {
                        if !w.holds(id) {
                            w.push(entry(id, seq, false));
                            model.push((id, false));
                        }
                    }
                    Op::Ack(i) if !model.is_empty() => {
                        let id = model[i % model.len()].0;
                        let pos = w.position(id);
                        prop_assert_eq!(pos, model.iter().position(|(m, _)| *m == id));
                        prop_assert_eq!(w.remove(pos.unwrap()).map(|e| e.packet_id), Some(id));
                        model.remove(i % model.len());
                    }
                    Op::Ack(_) => {}
                    Op::Reconnect => {
                        w.mark_all_unsent();
                        model.iter_mut().for_each(|m| m.1 = false);
                    }
                    Op::ResendOne => {
                        let pos = w.first_unsent();
                        prop_assert_eq!(pos, model.iter().position(|(_, sent)| !sent));
                        if let Some(pos) = pos {
                            prop_assert_eq!(w.mark_sent(pos).packet_id, model[pos].0);
                            model[pos].1 = true;
                        }
                    }
                }
                prop_assert_eq!(w.len(), model.len());
                prop_assert_eq!(w.sent(), model.iter().filter(|(_, s)| *s).count());
                let ids: Vec<u16> = w.iter().map(|e| e.packet_id).collect();
                let expected: Vec<u16> = model.iter().map(|(id, _)| *id).collect();
                prop_assert_eq!(ids, expected);
            }
        }
    }

    #[test]
    fn packet_ids_wrap_past_the_ones_in_flight() {
        let mut w = InflightWindow {
            next_packet_id: u16::MAX,
            ..Default::default()
        };
        w.push(entry(1, 0, true));
        assert_eq!(w.allocate_packet_id(), u16::MAX);
        assert_eq!(w.allocate_packet_id(), 2, "1 is in flight, 0 is never used");
    }
}
