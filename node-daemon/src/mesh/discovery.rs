//! Peer discovery: the nodes of a deployment meet through any one of them.
//!
//! Each node announces, on a gossip topic of its own, the addresses it can be reached at and
//! those of the peers it is connected to: when a peer joins the topic (so a newcomer hears of
//! every node its first peer is connected to, and gossip relays the newcomer's own
//! announcement to the rest), and again every `cluster.announce_interval_ms`, at most once a
//! second ([`MIN_ANNOUNCE_GAP`]). A node dials every announced peer it is not connected to, and
//! dials it again (with backoff) while its connection is down. A peer is forgotten once it has
//! been neither connected nor announced by anyone for three intervals ([`Directory::expire`]):
//! a node that is gone for good stops being dialled, while two nodes that lost the link between
//! them keep dialling each other as long as a third still reaches both.
//!
//! Announcements come only from holders of the cluster key, signed by their author, and count
//! only from an author on the allowlist (if there is one). The addresses a node gives for itself
//! replace those others gave for it; until it speaks for itself, a peer is dialled at the
//! addresses others gave. A peer outside the allowlist is never dialled, and QUIC addresses,
//! which do not carry the cluster key, only with an allowlist. Everything is bounded: at most
//! [`MAX_PEERS`] peers known, of at most [`MAX_ADDRS`] addresses each; the rest is ignored.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use libp2p::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{Multiaddr, PeerId};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The gossipsub topic of announcements.
pub const DISCOVERY_TOPIC: &str = "meridian/members/1";
/// Peers taken from one announcement, and known at once.
pub const MAX_PEERS: usize = 1024;
/// Addresses taken per peer.
pub const MAX_ADDRS: usize = 16;
/// The largest announcement read; larger ones are ignored unparsed. [`MAX_PEERS`] peers with an
/// address each take under a quarter of it.
pub const MAX_ANNOUNCEMENT_BYTES: usize = 512 * 1024;
/// The shortest time between two announcements of a node, however often peers join.
pub const MIN_ANNOUNCE_GAP: Duration = Duration::from_secs(1);

/// An announcement as sent: `{"peers":[{"id":"12D3Koo…","addrs":["/ip4/…/tcp/7000"]}]}`.
#[derive(Debug, Serialize, Deserialize)]
struct Wire {
    peers: Vec<WirePeer>,
}

#[derive(Debug, Serialize, Deserialize)]
struct WirePeer {
    id: String,
    addrs: Vec<String>,
}

/// A peer and the addresses it can be reached at.
pub type Entry = (PeerId, Vec<Multiaddr>);

/// Encode an announcement: at most [`MAX_ADDRS`] addresses per peer, and as many peers as fit
/// in [`MAX_ANNOUNCEMENT_BYTES`] (the first ones; this node comes first).
pub fn encode(entries: &[(PeerId, &[Multiaddr])]) -> Vec<u8> {
    // Room for the brackets and field names around each peer, besides its strings.
    const PEER_OVERHEAD: usize = 32;
    let mut size = 16;
    let mut peers = Vec::new();
    for (id, addrs) in entries.iter().take(MAX_PEERS) {
        let peer = WirePeer {
            id: id.to_string(),
            addrs: addrs
                .iter()
                .take(MAX_ADDRS)
                .map(ToString::to_string)
                .collect(),
        };
        let len =
            PEER_OVERHEAD + peer.id.len() + peer.addrs.iter().map(|a| a.len() + 3).sum::<usize>();
        if size + len > MAX_ANNOUNCEMENT_BYTES {
            break;
        }
        size += len;
        peers.push(peer);
    }
    serde_json::to_vec(&Wire { peers }).expect("an announcement always serialises")
}

/// Why an announcement was not read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("announcement of {0} bytes, more than {MAX_ANNOUNCEMENT_BYTES}")]
    TooLarge(usize),
    #[error("not an announcement: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// Decode an announcement. Peers and addresses that do not parse are skipped, and so is
/// whatever lies past the bounds; a message that is not an announcement at all, or larger than
/// [`MAX_ANNOUNCEMENT_BYTES`], is an error.
pub fn decode(bytes: &[u8]) -> Result<Vec<Entry>, DecodeError> {
    if bytes.len() > MAX_ANNOUNCEMENT_BYTES {
        return Err(DecodeError::TooLarge(bytes.len()));
    }
    let wire: Wire = serde_json::from_slice(bytes)?;
    Ok(wire
        .peers
        .into_iter()
        .take(MAX_PEERS)
        .filter_map(|p| {
            let id = p.id.parse().ok()?;
            let addrs: Vec<Multiaddr> = p
                .addrs
                .iter()
                .take(MAX_ADDRS)
                .filter_map(|a| a.parse().ok())
                .collect();
            (!addrs.is_empty()).then_some((id, addrs))
        })
        .collect())
}

/// The addresses worth announcing of `addrs`: loopback ones only if there is nothing else (a
/// node listening on 0.0.0.0 lists 127.0.0.1 too, which reaches nobody else's node).
pub fn reachable(addrs: &[Multiaddr]) -> Vec<Multiaddr> {
    let loopback = |a: &Multiaddr| {
        a.iter().any(|p| match p {
            Protocol::Ip4(ip) => ip.is_loopback(),
            Protocol::Ip6(ip) => ip.is_loopback(),
            _ => false,
        })
    };
    if addrs.iter().all(loopback) {
        return addrs.to_vec();
    }
    addrs.iter().filter(|a| !loopback(a)).cloned().collect()
}

/// A known peer as the admin API shows it (`GET /api/discovery`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KnownPeer {
    pub peer_id: String,
    /// The addresses it is dialled at.
    pub addrs: Vec<String>,
    /// Whether those addresses came from the peer itself (else from a node connected to it).
    pub self_reported: bool,
    pub connected: bool,
}

/// What this node knows of one peer.
#[derive(Debug)]
struct Known {
    addrs: Vec<Multiaddr>,
    /// The addresses came from the peer itself.
    self_reported: bool,
    connected: bool,
    dialing: Option<ConnectionId>,
    next_dial: Instant,
    backoff: Duration,
    /// When an announcement last listed it, or its connection last closed.
    last_heard: Instant,
}

/// The peers this node has heard of, and when to dial each.
#[derive(Debug)]
pub struct Directory {
    me: PeerId,
    /// Peer ids allowed in; empty = every holder of the cluster key.
    allow: HashSet<PeerId>,
    known: BTreeMap<PeerId, Known>,
    redial_min: Duration,
    redial_max: Duration,
    /// How long a peer is kept that is neither connected nor announced.
    forget_after: Duration,
}

impl Directory {
    /// `announce_every`: how often nodes announce; a peer no one has announced for three of
    /// those is forgotten.
    pub fn new(
        me: PeerId,
        allow: &[PeerId],
        redial_min: Duration,
        redial_max: Duration,
        announce_every: Duration,
    ) -> Self {
        Self {
            me,
            allow: allow.iter().copied().collect(),
            known: BTreeMap::new(),
            redial_min,
            redial_max,
            forget_after: announce_every * 3,
        }
    }

    fn allowed(&self, peer: &PeerId) -> bool {
        self.allow.is_empty() || self.allow.contains(peer)
    }

    /// Take in an announcement by `author`. `is_connected` says which peers this node is
    /// connected to already. Returns the peers it did not know.
    pub fn learn(
        &mut self,
        author: PeerId,
        entries: Vec<Entry>,
        now: Instant,
        is_connected: impl Fn(&PeerId) -> bool,
    ) -> Vec<PeerId> {
        let mut new = Vec::new();
        if !self.allowed(&author) {
            return new;
        }
        let quic_ok = !self.allow.is_empty();
        for (peer, mut addrs) in entries {
            if peer == self.me || !self.allowed(&peer) {
                continue;
            }
            // The cluster key keeps strangers out of TCP only; over QUIC the allowlist must.
            addrs.retain(|a| quic_ok || !a.iter().any(|p| matches!(p, Protocol::QuicV1)));
            if addrs.is_empty() {
                continue;
            }
            let from_itself = peer == author;
            let room = self.known.len() < MAX_PEERS;
            match self.known.get_mut(&peer) {
                Some(k) => {
                    k.last_heard = now;
                    if from_itself || !k.self_reported {
                        k.addrs = addrs;
                        k.self_reported |= from_itself;
                    }
                }
                None if room => {
                    new.push(peer);
                    self.known.insert(
                        peer,
                        Known {
                            addrs,
                            self_reported: from_itself,
                            connected: is_connected(&peer),
                            dialing: None,
                            next_dial: now,
                            backoff: self.redial_min,
                            last_heard: now,
                        },
                    );
                }
                None => {}
            }
        }
        new
    }

    /// A connection to `peer` is up (whoever dialled).
    pub fn connected(&mut self, peer: PeerId) {
        if let Some(k) = self.known.get_mut(&peer) {
            k.connected = true;
            k.dialing = None;
            k.backoff = self.redial_min;
        }
    }

    /// The last connection to `peer` closed: dial it again after the backoff.
    pub fn disconnected(&mut self, peer: PeerId, now: Instant) {
        if let Some(k) = self.known.get_mut(&peer) {
            k.connected = false;
            k.next_dial = now + k.backoff;
            k.last_heard = now;
        }
    }

    /// A dial started for `peer` (by [`Directory::due`]).
    pub fn dialing(&mut self, peer: PeerId, id: ConnectionId) {
        if let Some(k) = self.known.get_mut(&peer) {
            k.dialing = Some(id);
        }
    }

    /// A dial could not start (the swarm refused it): try again after the backoff.
    pub fn not_dialled(&mut self, peer: PeerId, now: Instant) {
        if let Some(k) = self.known.get_mut(&peer) {
            k.next_dial = now + k.backoff;
            k.backoff = (k.backoff * 2).min(self.redial_max);
        }
    }

    /// The dial `id` failed: try again after the backoff. Returns whether it was one of this
    /// directory's.
    pub fn dial_failed(&mut self, id: ConnectionId, now: Instant) -> bool {
        let Some(k) = self.known.values_mut().find(|k| k.dialing == Some(id)) else {
            return false;
        };
        k.dialing = None;
        k.next_dial = now + k.backoff;
        k.backoff = (k.backoff * 2).min(self.redial_max);
        true
    }

    /// Forget `peer` now (the broker forgot it: it left the deployment). Returns whether it
    /// was known.
    pub fn forget(&mut self, peer: &PeerId) -> bool {
        self.known.remove(peer).is_some()
    }

    /// Forget the peers that have been neither connected nor announced for three announcement
    /// intervals. Returns them.
    pub fn expire(&mut self, now: Instant) -> Vec<PeerId> {
        let forget_after = self.forget_after;
        let gone: Vec<PeerId> = self
            .known
            .iter()
            .filter(|(_, k)| !k.connected && now.duration_since(k.last_heard) > forget_after)
            .map(|(p, _)| *p)
            .collect();
        for p in &gone {
            self.known.remove(p);
        }
        gone
    }

    /// Peers to dial now, with their addresses: known, not connected, not being dialled, and
    /// whose backoff has passed.
    pub fn due(&self, now: Instant) -> Vec<Entry> {
        self.known
            .iter()
            .filter(|(_, k)| !k.connected && k.dialing.is_none() && k.next_dial <= now)
            .map(|(p, k)| (*p, k.addrs.clone()))
            .collect()
    }

    /// Every known peer, in peer id order.
    pub fn snapshot(&self) -> Vec<KnownPeer> {
        self.known
            .iter()
            .map(|(p, k)| KnownPeer {
                peer_id: p.to_string(),
                addrs: k.addrs.iter().map(ToString::to_string).collect(),
                self_reported: k.self_reported,
                connected: k.connected,
            })
            .collect()
    }

    /// This node's announcement: its own addresses (the [`reachable`] ones), and those of the
    /// peers it is connected to.
    pub fn announcement(&self, own: &[Multiaddr]) -> Vec<u8> {
        let own = reachable(own);
        let mut entries: Vec<(PeerId, &[Multiaddr])> = vec![(self.me, &own)];
        entries.extend(
            self.known
                .iter()
                .filter(|(_, k)| k.connected)
                .take(MAX_PEERS - 1)
                .map(|(p, k)| (*p, k.addrs.as_slice())),
        );
        encode(&entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> Multiaddr {
        format!("/ip4/127.0.0.1/tcp/{port}").parse().unwrap()
    }

    const EVERY: Duration = Duration::from_secs(1);

    fn directory(me: PeerId, allow: &[PeerId]) -> Directory {
        Directory::new(
            me,
            allow,
            Duration::from_millis(250),
            Duration::from_secs(10),
            EVERY,
        )
    }

    #[test]
    fn announcements_round_trip_and_skip_what_does_not_parse() {
        let (a, b) = (PeerId::random(), PeerId::random());
        let (one, two) = ([addr(7001)], [addr(7002), addr(7003)]);
        let bytes = encode(&[(a, &one), (b, &two)]);
        assert_eq!(
            decode(&bytes).unwrap(),
            vec![(a, one.to_vec()), (b, two.to_vec())]
        );

        let odd = format!(
            r#"{{"peers":[{{"id":"not a peer","addrs":["/ip4/1.2.3.4/tcp/1"]}},
                {{"id":"{a}","addrs":["nonsense","/ip4/1.2.3.4/tcp/1"]}},
                {{"id":"{b}","addrs":[]}}]}}"#
        );
        assert_eq!(
            decode(odd.as_bytes()).unwrap(),
            vec![(a, vec!["/ip4/1.2.3.4/tcp/1".parse().unwrap()])]
        );
        assert!(matches!(
            decode(b"\x00\x01 not json"),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn loopback_addresses_are_announced_only_when_there_is_nothing_else() {
        let lo: Multiaddr = "/ip4/127.0.0.1/tcp/7000".parse().unwrap();
        let lo6: Multiaddr = "/ip6/::1/tcp/7000".parse().unwrap();
        let lan: Multiaddr = "/ip4/10.1.0.5/tcp/7000".parse().unwrap();
        let dns: Multiaddr = "/dns4/euc1.example.net/tcp/7000".parse().unwrap();
        assert_eq!(
            reachable(&[lo.clone(), lo6.clone()]),
            [lo.clone(), lo6.clone()]
        );
        assert_eq!(reachable(&[lo.clone(), lan.clone(), lo6]), [lan]);
        assert_eq!(reachable(&[dns.clone(), lo]), [dns]);
    }

    #[test]
    fn announcements_are_bounded() {
        let many: Vec<(PeerId, Vec<Multiaddr>)> = (0..MAX_PEERS + 10)
            .map(|i| (PeerId::random(), vec![addr(i as u16)]))
            .collect();
        let refs: Vec<(PeerId, &[Multiaddr])> =
            many.iter().map(|(p, a)| (*p, a.as_slice())).collect();
        let bytes = encode(&refs);
        assert!(
            bytes.len() < MAX_ANNOUNCEMENT_BYTES / 4,
            "a full one fits easily"
        );
        assert_eq!(decode(&bytes).unwrap().len(), MAX_PEERS);

        let addrs: Vec<Multiaddr> = (0..MAX_ADDRS as u16 + 5).map(addr).collect();
        let got = decode(&encode(&[(PeerId::random(), &addrs)])).unwrap();
        assert_eq!(got[0].1.len(), MAX_ADDRS);

        let huge = vec![b' '; MAX_ANNOUNCEMENT_BYTES + 1];
        assert!(matches!(decode(&huge), Err(DecodeError::TooLarge(_))));

        // The largest a sender can be asked for (a full directory, every peer with more /ip6
        // addresses than are taken) is cut to fit, and read.
        let long: Vec<Multiaddr> = (0..MAX_ADDRS as u16 + 4)
            .map(|p| {
                format!("/ip6/2001:db8:ffff:ffff:ffff:ffff:ffff:ffff/tcp/{p}")
                    .parse()
                    .unwrap()
            })
            .collect();
        let full: Vec<(PeerId, &[Multiaddr])> = (0..MAX_PEERS)
            .map(|_| (PeerId::random(), long.as_slice()))
            .collect();
        let bytes = encode(&full);
        assert!(bytes.len() <= MAX_ANNOUNCEMENT_BYTES);
        let got = decode(&bytes).unwrap();
        assert!(got.len() > MAX_PEERS / 4, "{} peers", got.len());
        assert_eq!(got[0].0, full[0].0, "the first (this node) comes first");
        assert!(got.iter().all(|(_, a)| a.len() == MAX_ADDRS));
    }

    #[test]
    fn a_peer_heard_of_is_dialled_until_connected_and_again_after_it_drops() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut d = directory(me, &[]);
        let now = Instant::now();
        // a announces itself, b, and this node.
        let new = d.learn(
            a,
            vec![(a, vec![addr(1)]), (b, vec![addr(2)]), (me, vec![addr(3)])],
            now,
            |p| *p == a,
        );
        assert_eq!(new.len(), 2, "never itself");
        assert!(new.contains(&a) && new.contains(&b));
        assert_eq!(
            d.due(now),
            vec![(b, vec![addr(2)])],
            "a is connected already"
        );

        let dial = ConnectionId::new_unchecked(1);
        d.dialing(b, dial);
        assert!(d.due(now).is_empty(), "one dial at a time");
        d.connected(b);
        assert!(d.due(now).is_empty());

        d.disconnected(b, now);
        assert!(d.due(now).is_empty(), "not before the backoff");
        assert_eq!(
            d.due(now + Duration::from_millis(250)),
            vec![(b, vec![addr(2)])]
        );
    }

    #[test]
    fn a_peer_that_fails_is_dialled_again_while_someone_announces_it() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut d = directory(me, &[]);
        let mut now = Instant::now();
        d.learn(a, vec![(b, vec![addr(2)])], now, |_| false);
        for i in 1..=20 {
            let due = d.due(now);
            assert_eq!(due.len(), 1, "dial {i} is due");
            let id = ConnectionId::new_unchecked(i);
            d.dialing(b, id);
            assert!(d.dial_failed(id, now));
            now += Duration::from_secs(10);
            // a still reaches b and says so.
            d.learn(a, vec![(b, vec![addr(2)])], now, |_| false);
            assert!(d.expire(now).is_empty());
        }
        assert!(
            !d.dial_failed(ConnectionId::new_unchecked(99), now),
            "not a dial of the directory"
        );
    }

    #[test]
    fn a_peer_no_one_announces_is_forgotten_after_three_intervals() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut d = directory(me, &[]);
        let now = Instant::now();
        d.learn(a, vec![(a, vec![addr(1)]), (b, vec![addr(2)])], now, |p| {
            *p == a
        });
        d.connected(a);
        assert!(d.expire(now + EVERY * 3).is_empty(), "not before");
        assert_eq!(
            d.expire(now + EVERY * 3 + Duration::from_millis(1)),
            vec![b],
            "a is connected: kept"
        );
        // Its connection closing gives a a full three intervals of dials.
        let later = now + EVERY * 10;
        d.disconnected(a, later);
        assert!(d.expire(later + EVERY * 3).is_empty());
        assert_eq!(d.expire(later + EVERY * 4), vec![a]);
        assert!(d.known.is_empty());
        d.learn(a, vec![(b, vec![addr(2)])], later, |_| false);
        assert_eq!(d.due(later).len(), 1, "announced again, known again");
    }

    #[test]
    fn the_directory_is_bounded() {
        let (me, a) = (PeerId::random(), PeerId::random());
        let mut d = directory(me, &[]);
        let now = Instant::now();
        for _ in 0..3 {
            let junk = (0..MAX_PEERS).map(|i| (PeerId::random(), vec![addr(i as u16)]));
            d.learn(a, junk.collect(), now, |_| false);
        }
        assert_eq!(d.known.len(), MAX_PEERS);
    }

    #[test]
    fn a_peer_speaks_for_its_own_addresses() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut d = directory(me, &[]);
        let now = Instant::now();
        d.learn(a, vec![(b, vec![addr(2)])], now, |_| false);
        d.learn(b, vec![(b, vec![addr(20)])], now, |_| false);
        d.learn(a, vec![(b, vec![addr(2)])], now, |_| false);
        assert_eq!(d.due(now), vec![(b, vec![addr(20)])]);
    }

    #[test]
    fn peers_and_authors_outside_the_allowlist_are_ignored() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut d = directory(me, &[a]);
        let now = Instant::now();
        d.learn(b, vec![(a, vec![addr(1)])], now, |_| false);
        assert!(d.known.is_empty(), "b may not speak here");
        d.learn(a, vec![(a, vec![addr(1)]), (b, vec![addr(2)])], now, |_| {
            false
        });
        assert_eq!(d.due(now), vec![(a, vec![addr(1)])]);
    }

    #[test]
    fn quic_addresses_are_dialled_only_with_an_allowlist() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let quic: Multiaddr = "/ip4/127.0.0.1/udp/7000/quic-v1".parse().unwrap();
        let entries = || vec![(b, vec![quic.clone(), addr(2)]), (a, vec![quic.clone()])];
        let now = Instant::now();
        let mut open = directory(me, &[]);
        open.learn(a, entries(), now, |_| false);
        assert_eq!(open.due(now), vec![(b, vec![addr(2)])]);
        let mut listed = directory(me, &[a, b]);
        listed.learn(a, entries(), now, |_| false);
        assert_eq!(listed.known.len(), 2);
    }

    #[test]
    fn the_announcement_names_this_node_and_its_connected_peers() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut d = directory(me, &[]);
        let now = Instant::now();
        d.learn(a, vec![(a, vec![addr(1)]), (b, vec![addr(2)])], now, |p| {
            *p == a
        });
        let got = decode(&d.announcement(&[addr(3)])).unwrap();
        assert_eq!(got, vec![(me, vec![addr(3)]), (a, vec![addr(1)])]);
        let mut shown = d.snapshot();
        shown.sort_by_key(|p| p.connected);
        assert_eq!(
            shown,
            [
                KnownPeer {
                    peer_id: b.to_string(),
                    addrs: vec![addr(2).to_string()],
                    self_reported: false,
                    connected: false
                },
                KnownPeer {
                    peer_id: a.to_string(),
                    addrs: vec![addr(1).to_string()],
                    self_reported: true,
                    connected: true
                }
            ]
        );
    }
}
