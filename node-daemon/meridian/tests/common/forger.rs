//! A hostile member: a node of its own, built from the daemon's mesh code, holding the
//! cluster key (and nothing the operator signed), that sends the nodes it connects to whatever
//! frames it likes and sees what they send it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use bytes::BytesMut;
use meridian_core::link::{self, Frame};
use meridian_core::routes::{NodeId, Owner};
use meridian_daemon::testing::{
    LinkEvent, LinkLimits, Mesh, MeshCmd, MeshSettings, MeshStats, PeerWriter, ToEngine,
    load_cluster_key, start_mesh,
};
use tokio::sync::mpsc;

use super::mesh::{MESH_DEADLINE, Node};

pub struct Forger {
    pub mesh: Mesh,
    /// Its link sessions, by peer id, as the broker task would get them.
    pub writers: HashMap<String, PeerWriter>,
    /// Gossip.
    pub cmds: mpsc::Sender<MeshCmd>,
    /// What the nodes send it, by sender (past a backlog of 4,096 frames, dropped).
    pub heard: mpsc::Receiver<(NodeId, Frame)>,
}

impl Forger {
    /// Connects to `nodes` with the cluster key in `dir` (`cluster.key`), once a link session
    /// with each is open.
    pub async fn start(dir: &Path, nodes: &[&Node]) -> Self {
        let node_port = |n: &Node| {
            format!("/ip4/127.0.0.1/tcp/{}", n.p2p)
                .parse::<libp2p::Multiaddr>()
                .expect("multiaddr")
        };
        let settings = MeshSettings {
            listen: vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
            bootstrap: nodes.iter().map(|n| node_port(n)).collect(),
            cluster_key: load_cluster_key(&dir.join("cluster.key")).unwrap(),
            allow: Vec::new(),
            ping_interval: Duration::from_secs(1),
            redial_min: Duration::from_millis(50),
            redial_max: Duration::from_secs(1),
            discover: false,
            advertise: Vec::new(),
            announce_every: Duration::from_secs(10),
            link_limits: LinkLimits::default(),
            max_connections: 1024,
            max_connections_per_address: 64,
            policy: None,
            members: None,
        };
        let (engine_tx, mut engine_rx) = mpsc::channel(1024);
        let (cmds, cmd_rx) = mpsc::channel(64);
        let keypair = libp2p::identity::Keypair::generate_ed25519();
        let mesh = start_mesh(
            settings,
            keypair,
            engine_tx,
            cmd_rx,
            std::sync::Arc::new(MeshStats::default()),
            "forger",
        )
        .await
        .expect("the forger's mesh starts");
        let (heard_tx, heard) = mpsc::channel(4096);
        let mut writers = HashMap::new();
        tokio::time::timeout(MESH_DEADLINE, async {
            while writers.len() < nodes.len() {
                match engine_rx.recv().await {
                    Some(ToEngine::Link(LinkEvent::PeerUp { peer, writer, .. })) => {
                        writers.insert(peer.to_string(), writer);
                    }
                    Some(ToEngine::Link(LinkEvent::Frames { peer, frames })) => {
                        for f in frames {
                            let _ = heard_tx.try_send((peer.clone(), f));
                        }
                    }
                    _ => {}
                }
            }
        })
        .await
        .expect("the forger's sessions open");
        // Keep reading what the nodes send it (hellos, digests, claims), as a peer does.
        tokio::spawn(async move {
            while let Some(event) = engine_rx.recv().await {
                if let ToEngine::Link(LinkEvent::Frames { peer, frames }) = event {
                    for f in frames {
                        let _ = heard_tx.try_send((peer.clone(), f));
                    }
                }
            }
        });
        Self {
            mesh,
            writers,
            cmds,
            heard,
        }
    }

    /// Sends `frame` on its link session with `node`.
    pub fn send(&self, node: &Node, frame: &Frame) {
        self.writers[&node.peer_id]
            .send(encode(frame))
            .expect("the session is open");
    }

    /// The first frame `node` sends it that `pick` takes, within the mesh deadline.
    pub async fn hear<T>(&mut self, node: &Node, mut pick: impl FnMut(&Frame) -> Option<T>) -> T {
        let from = NodeId::new(&node.peer_id).unwrap();
        tokio::time::timeout(MESH_DEADLINE, async {
            loop {
                let (peer, frame) = self.heard.recv().await.expect("the forger hears");
                if peer == from
                    && let Some(t) = pick(&frame)
                {
                    return t;
                }
            }
        })
        .await
        .expect("the node said it")
    }
}

pub fn owner(node: &str, incarnation: u64) -> Owner {
    Owner {
        node: NodeId::new(node).unwrap(),
        incarnation,
    }
}

pub fn encode(frame: &Frame) -> bytes::Bytes {
    let mut out = BytesMut::new();
    link::encode(frame, &mut out).expect("frame encodes");
    out.freeze()
}
