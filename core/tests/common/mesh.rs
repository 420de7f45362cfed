//! Several broker nodes joined by links that carry link frames in order, can be cut and
//! restored, and move in virtual time together.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::BytesMut;
use meridian_core::broker::ClusterConfig;
use meridian_core::link::{self, Frame};
use meridian_core::routes::NodeId;
use meridian_core::{Config, Input, Timestamp};

use super::World;

pub struct Mesh {
    pub nodes: BTreeMap<NodeId, World>,
    /// Links that are up (unordered pairs, stored with the smaller id first).
    up: BTreeSet<(NodeId, NodeId)>,
    /// Frames in flight on each directed link, in order.
    wire: BTreeMap<(NodeId, NodeId), VecDeque<Frame>>,
    /// Frames delivered per directed link (every frame goes through the real codec).
    pub carried: BTreeMap<(NodeId, NodeId), usize>,
    /// Each leaf and the node it hangs off: that node's broadcasts (its own route set, meant
    /// for the mesh) do not go to it, as a shell keeps its mesh broadcasts off leaf links.
    pub leaf_of: BTreeMap<NodeId, NodeId>,
}

pub fn id(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

fn pair(a: &NodeId, b: &NodeId) -> (NodeId, NodeId) {
    if a < b {
        (a.clone(), b.clone())
    } else {
        (b.clone(), a.clone())
    }
}

impl Mesh {
    /// Nodes named `names`, all linked to each other and up.
    pub fn new(names: &[&str], config: Config, tweak: impl Fn(&mut ClusterConfig)) -> Self {
        let mut nodes = BTreeMap::new();
        for name in names {
            let mut cluster = ClusterConfig::new(id(name), 1, format!("region-{name}"));
            tweak(&mut cluster);
            nodes.insert(id(name), World::node(config.clone(), cluster));
        }
        let mut mesh = Self {
            nodes,
            up: BTreeSet::new(),
            wire: BTreeMap::new(),
            carried: BTreeMap::new(),
            leaf_of: BTreeMap::new(),
        };
        let ids: Vec<NodeId> = mesh.nodes.keys().cloned().collect();
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                mesh.link_up(a, b);
            }
        }
        mesh.settle();
        mesh
    }

    /// The mesh nodes `names`, all linked, and `leaves` as (leaf, the mesh node it hangs
    /// off), each linked to its node only.
    pub fn with_leaves(
        names: &[&str],
        leaves: &[(&str, &str)],
        config: Config,
        tweak: impl Fn(&mut ClusterConfig),
    ) -> Self {
        let mut mesh = Self::new(names, config.clone(), &tweak);
        for (leaf, hub) in leaves {
            mesh.join_leaf(leaf, hub, config.clone(), &tweak);
        }
        mesh.settle();
        mesh
    }

    /// A new mesh node `name` (its own broker, `config`), linked to every mesh node; nothing
    /// is delivered yet.
    pub fn join(&mut self, name: &str, config: Config, tweak: impl Fn(&mut ClusterConfig)) {
        let mut cluster = ClusterConfig::new(id(name), 1, format!("region-{name}"));
        tweak(&mut cluster);
        let members: Vec<NodeId> = self
            .nodes
            .keys()
            .filter(|n| !self.leaf_of.contains_key(*n))
            .cloned()
            .collect();
        self.nodes.insert(id(name), World::node(config, cluster));
        for member in members {
            self.link_up(&id(name), &member);
        }
    }

    /// A new leaf `leaf` (its own broker, `config`) made a leaf of `hub` and linked to it, as
    /// a shell does when an edge object links; nothing is delivered yet.
    pub fn join_leaf(
        &mut self,
        leaf: &str,
        hub: &str,
        config: Config,
        tweak: impl Fn(&mut ClusterConfig),
    ) {
        let mut cluster = ClusterConfig::new(id(leaf), 1, leaf);
        tweak(&mut cluster);
        self.nodes.insert(id(leaf), World::node(config, cluster));
        let hub_node = self.node(hub);
        let now = Timestamp(hub_node.now);
        hub_node
            .broker
            .add_leaf(now, &id(leaf))
            .expect("a new name may be a leaf");
        self.node(hub).drain();
        self.leaf_of.insert(id(leaf), id(hub));
        self.link_up(&id(leaf), &id(hub));
    }

    pub fn node(&mut self, name: &str) -> &mut World {
        self.nodes.get_mut(&id(name)).expect("node exists")
    }

    pub fn is_up(&self, a: &NodeId, b: &NodeId) -> bool {
        self.up.contains(&pair(a, b))
    }

    pub fn link_up(&mut self, a: &NodeId, b: &NodeId) {
        if self.up.insert(pair(a, b)) {
            for (x, y) in [(a, b), (b, a)] {
                let w = self.nodes.get_mut(x).unwrap();
                w.broker
                    .handle_input(Timestamp(w.now), Input::PeerUp { peer: y.clone() });
                w.drain();
            }
        }
    }

    /// Cut a link: frames in flight on it are lost.
    pub fn link_down(&mut self, a: &NodeId, b: &NodeId) {
        if self.up.remove(&pair(a, b)) {
            self.wire.remove(&(a.clone(), b.clone()));
            self.wire.remove(&(b.clone(), a.clone()));
            for (x, y) in [(a, b), (b, a)] {
                let w = self.nodes.get_mut(x).unwrap();
                w.broker
                    .handle_input(Timestamp(w.now), Input::PeerDown { peer: y.clone() });
                w.drain();
            }
        }
    }

    /// Crash a node and restart it from its storage (new incarnation); its links drop and
    /// come back.
    pub fn crash_and_restart(&mut self, name: &str) {
        let me = id(name);
        let others: Vec<NodeId> = self.nodes.keys().filter(|n| **n != me).cloned().collect();
        let was_up: Vec<NodeId> = others
            .iter()
            .filter(|o| self.is_up(&me, o))
            .cloned()
            .collect();
        for o in &was_up {
            self.link_down(&me, o);
        }
        self.node(name).restart();
        for o in &was_up {
            self.link_up(&me, o);
        }
    }

    /// Move every pending frame onto the wires, and end the sessions nodes cut (the next one
    /// starts at once, as a daemon's would).
    fn collect(&mut self) {
        let ids: Vec<NodeId> = self.nodes.keys().cloned().collect();
        for from in &ids {
            let cuts = std::mem::take(&mut self.nodes.get_mut(from).unwrap().cut_peers);
            for peer in cuts {
                if self.nodes.contains_key(&peer) && self.is_up(from, &peer) {
                    self.link_down(from, &peer);
                    self.link_up(from, &peer);
                }
            }
        }
        for from in &ids {
            let out = std::mem::take(&mut self.nodes.get_mut(from).unwrap().peer_out);
            for (to, frame) in out {
                let targets: Vec<NodeId> = match to {
                    Some(t) => vec![t],
                    None => ids
                        .iter()
                        .filter(|n| *n != from && self.leaf_of.get(*n) != Some(from))
                        .cloned()
                        .collect(),
                };
                for t in targets {
                    if self.is_up(from, &t) {
                        self.wire
                            .entry((from.clone(), t))
                            .or_default()
                            .push_back(frame.clone());
                    }
                }
            }
        }
    }

    /// Deliver one frame per non-empty link, through the link codec. Returns whether any moved.
    fn step(&mut self) -> bool {
        self.collect();
        let links: Vec<(NodeId, NodeId)> = self
            .wire
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        for (from, to) in &links {
            let Some(frame) = self
                .wire
                .get_mut(&(from.clone(), to.clone()))
                .and_then(VecDeque::pop_front)
            else {
                continue;
            };
            let mut bytes = BytesMut::new();
            link::encode(&frame, &mut bytes).expect("frames encode");
            let decoded = link::decode(&mut bytes, link::DEFAULT_MAX_FRAME_LEN)
                .expect("frames decode")
                .expect("whole frame");
            *self.carried.entry((from.clone(), to.clone())).or_default() += 1;
            let w = self.nodes.get_mut(to).unwrap();
            w.broker.handle_input(
                Timestamp(w.now),
                Input::PeerFrame {
                    peer: from.clone(),
                    frame: Box::new(decoded),
                },
            );
            w.drain();
        }
        !links.is_empty()
    }

    /// Hand `to` a frame as if `from` sent it (what a peer holding the key could send).
    pub fn inject(&mut self, from: &str, to: &str, frame: Frame) {
        let w = self.node(to);
        w.broker.handle_input(
            Timestamp(w.now),
            Input::PeerFrame {
                peer: id(from),
                frame: Box::new(frame),
            },
        );
        w.drain();
    }

    /// The frames waiting on the link from `from` to `to` (what that peer is about to learn),
    /// left in place.
    pub fn peek(&mut self, from: &str, to: &str) -> Vec<Frame> {
        self.collect();
        self.wire
            .get(&(id(from), id(to)))
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Take the frames waiting on the link from `from` to `to` that `pick` picks off it (what
    /// a node that sends them itself could send otherwise, [`Mesh::inject`]).
    pub fn take(&mut self, from: &str, to: &str, pick: impl Fn(&Frame) -> bool) -> Vec<Frame> {
        self.collect();
        let Some(q) = self.wire.get_mut(&(id(from), id(to))) else {
            return Vec::new();
        };
        let (taken, left): (Vec<Frame>, Vec<Frame>) = q.drain(..).partition(|f| pick(f));
        q.extend(left);
        taken
    }

    /// Deliver everything queued from `from` to `to`, and nothing else (answers stay queued).
    pub fn deliver_one_way(&mut self, from: &str, to: &str) {
        self.collect();
        let key = (id(from), id(to));
        while let Some(frame) = self.wire.get_mut(&key).and_then(VecDeque::pop_front) {
            let w = self.nodes.get_mut(&key.1).unwrap();
            w.broker.handle_input(
                Timestamp(w.now),
                Input::PeerFrame {
                    peer: key.0.clone(),
                    frame: Box::new(frame),
                },
            );
            w.drain();
        }
    }

    /// Deliver frames until the wires are empty (bounded).
    /// Everything waiting on the link from `from` to `to`, fed to `to` as one read
    /// ([`Input::PeerFrames`]); nothing the other way.
    pub fn deliver_as_one_read(&mut self, from: &str, to: &str) {
        self.collect();
        let key = (id(from), id(to));
        let frames: Vec<Frame> = self
            .wire
            .get_mut(&key)
            .map(|q| q.drain(..).collect())
            .unwrap_or_default();
        let w = self.nodes.get_mut(&key.1).unwrap();
        w.broker.handle_input(
            Timestamp(w.now),
            Input::PeerFrames {
                peer: key.0.clone(),
                frames,
            },
        );
        w.drain();
    }

    pub fn settle(&mut self) {
        for _ in 0..100_000 {
            if !self.step() {
                self.collect();
                if self.wire.values().all(VecDeque::is_empty) {
                    return;
                }
            }
        }
        panic!("mesh did not settle: {:?}", self.carried);
    }

    /// Advance every node's clock by `ms` (firing timers), then settle.
    pub fn advance(&mut self, ms: u64) {
        for w in self.nodes.values_mut() {
            w.advance(ms);
        }
        self.settle();
    }
}
