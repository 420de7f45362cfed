//! Peer discovery: the nodes of a deployment meet through any one of them.
//!
//! Each node announces, on a gossip topic of its own, the addresses it can be reached at and
//! those of the peers it is connected to. It announces whenever a peer joins the topic, so a
//! newcomer hears of every node its first peer is connected to, and the newcomer's own
//! announcement, relayed by gossip, reaches the rest. A node dials every announced peer it is
//! not connected to, and dials it again (with backoff) when its connection drops; a peer that
//! fails [`MAX_FAILED_DIALS`] dials in a row is forgotten until it is announced again.
//!
//! Announcements come only from holders of the cluster key (and of an allowed peer id), signed
//! by their author. The addresses a node gives for itself replace those others gave for it.
//! A peer outside the allowlist is never dialled. Announcements are bounded: at most
//! [`MAX_PEERS`] peers of at most [`MAX_ADDRS`] addresses each; the rest is ignored.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use libp2p::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{Multiaddr, PeerId};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The gossipsub topic of announcements.
pub const DISCOVERY_TOPIC: &str = "meridian/members/1";
/// Peers taken from one announcement.
pub const MAX_PEERS: usize = 1024;
/// Addresses taken per peer.
pub const MAX_ADDRS: usize = 16;
/// Failed dials in a row after which a discovered peer is forgotten.
pub const MAX_FAILED_DIALS: u32 = 5;

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

/// Encode an announcement.
pub fn encode(entries: &[(PeerId, &[Multiaddr])]) -> Vec<u8> {
    let wire = Wire {
        peers: entries
            .iter()
            .map(|(id, addrs)| WirePeer {
                id: id.to_string(),
                addrs: addrs.iter().map(ToString::to_string).collect(),
            })
            .collect(),
    };
    serde_json::to_vec(&wire).expect("an announcement always serialises")
}

/// Decode an announcement. Peers and addresses that do not parse are skipped, and so is
/// whatever lies past the bounds; a message that is not an announcement at all is an error.
pub fn decode(bytes: &[u8]) -> Result<Vec<Entry>, serde_json::Error> {
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
    failures: u32,
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
}

impl Directory {
    pub fn new(me: PeerId, allow: &[PeerId], redial_min: Duration, redial_max: Duration) -> Self {
        Self {
            me,
            allow: allow.iter().copied().collect(),
            known: BTreeMap::new(),
            redial_min,
            redial_max,
        }
    }

    /// Peers known by discovery.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
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
        for (peer, addrs) in entries {
            if peer == self.me || !(self.allow.is_empty() || self.allow.contains(&peer)) {
                continue;
            }
            let from_itself = peer == author;
            match self.known.get_mut(&peer) {
                Some(k) => {
                    if from_itself || !k.self_reported {
                        k.addrs = addrs;
                        k.self_reported |= from_itself;
                    }
                }
                None => {
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
                            failures: 0,
                        },
                    );
                }
            }
        }
        new
    }

    /// A connection to `peer` is up (whoever dialled).
    pub fn connected(&mut self, peer: PeerId) {
        if let Some(k) = self.known.get_mut(&peer) {
            k.connected = true;
            k.dialing = None;
            k.failures = 0;
            k.backoff = self.redial_min;
        }
    }

    /// The last connection to `peer` closed: dial it again after the backoff.
    pub fn disconnected(&mut self, peer: PeerId, now: Instant) {
        if let Some(k) = self.known.get_mut(&peer) {
            k.connected = false;
            k.next_dial = now + k.backoff;
        }
    }

    /// A dial started for `peer` (by [`Directory::due`]).
    pub fn dialing(&mut self, peer: PeerId, id: ConnectionId) {
        if let Some(k) = self.known.get_mut(&peer) {
            k.dialing = Some(id);
        }
    }

    /// A dial could not even start (the swarm refused it): try again after the backoff, without
    /// counting it as a failure.
    pub fn not_dialled(&mut self, peer: PeerId, now: Instant) {
        if let Some(k) = self.known.get_mut(&peer) {
            k.next_dial = now + k.backoff;
            k.backoff = (k.backoff * 2).min(self.redial_max);
        }
    }

    /// The dial `id` failed. Returns whether it was one of this directory's, and the peer if it
    /// was forgotten for failing too often.
    pub fn dial_failed(&mut self, id: ConnectionId, now: Instant) -> (bool, Option<PeerId>) {
        let Some((&peer, k)) = self.known.iter_mut().find(|(_, k)| k.dialing == Some(id)) else {
            return (false, None);
        };
        k.dialing = None;
        k.failures += 1;
        if k.failures >= MAX_FAILED_DIALS {
            self.known.remove(&peer);
            return (true, Some(peer));
        }
        k.next_dial = now + k.backoff;
        k.backoff = (k.backoff * 2).min(self.redial_max);
        (true, None)
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

    fn directory(me: PeerId) -> Directory {
        Directory::new(me, &[], Duration::from_millis(250), Duration::from_secs(10))
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
        assert!(decode(b"\x00\x01 not json").is_err());
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
        let peers: Vec<(PeerId, Vec<Multiaddr>)> = (0..MAX_PEERS + 10)
            .map(|_| {
                let addrs = (0..MAX_ADDRS as u16 + 5).map(addr).collect();
                (PeerId::random(), addrs)
            })
            .collect();
        let refs: Vec<(PeerId, &[Multiaddr])> =
            peers.iter().map(|(p, a)| (*p, a.as_slice())).collect();
        let got = decode(&encode(&refs)).unwrap();
        assert_eq!(got.len(), MAX_PEERS);
        assert!(got.iter().all(|(_, a)| a.len() == MAX_ADDRS));
    }

    #[test]
    fn a_peer_heard_of_is_dialled_until_connected_and_again_after_it_drops() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut d = directory(me);
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
    fn a_peer_that_keeps_failing_is_forgotten_until_announced_again() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut d = directory(me);
        let mut now = Instant::now();
        d.learn(a, vec![(b, vec![addr(2)])], now, |_| false);
        for i in 1..=MAX_FAILED_DIALS {
            let due = d.due(now);
            assert_eq!(due.len(), 1, "dial {i} is due");
            let id = ConnectionId::new_unchecked(i as usize);
            d.dialing(b, id);
            let (ours, forgotten) = d.dial_failed(id, now);
            assert!(ours);
            assert_eq!(forgotten.is_some(), i == MAX_FAILED_DIALS);
            now += Duration::from_secs(10);
        }
        assert!(d.is_empty());
        assert_eq!(
            d.dial_failed(ConnectionId::new_unchecked(99), now),
            (false, None),
            "not a dial of the directory"
        );
        d.learn(a, vec![(b, vec![addr(2)])], now, |_| false);
        assert_eq!(d.due(now).len(), 1);
    }

    #[test]
    fn a_peer_speaks_for_its_own_addresses() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut d = directory(me);
        let now = Instant::now();
        d.learn(a, vec![(b, vec![addr(2)])], now, |_| false);
        d.learn(b, vec![(b, vec![addr(20)])], now, |_| false);
        d.learn(a, vec![(b, vec![addr(2)])], now, |_| false);
        assert_eq!(d.due(now), vec![(b, vec![addr(20)])]);
    }

    #[test]
    fn peers_outside_the_allowlist_are_ignored() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut d = Directory::new(
            me,
            &[a],
            Duration::from_millis(250),
            Duration::from_secs(10),
        );
        let now = Instant::now();
        d.learn(a, vec![(a, vec![addr(1)]), (b, vec![addr(2)])], now, |_| {
            false
        });
        assert_eq!(d.due(now), vec![(a, vec![addr(1)])]);
    }

    #[test]
    fn the_announcement_names_this_node_and_its_connected_peers() {
        let (me, a, b) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut d = directory(me);
        let now = Instant::now();
        d.learn(a, vec![(a, vec![addr(1)]), (b, vec![addr(2)])], now, |p| {
            *p == a
        });
        let got = decode(&d.announcement(&[addr(3)])).unwrap();
        assert_eq!(got, vec![(me, vec![addr(3)]), (a, vec![addr(1)])]);
    }
}
