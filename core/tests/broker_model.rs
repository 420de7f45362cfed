//! Model-based test: random sequences of client operations against the broker, compared with a
//! small reference model of who must receive what, at which QoS, exactly once, in order.
//!
//! Clients acknowledge everything at once, so nothing is in flight between operations; sessions
//! with clean start 0 are persistent and queue QoS 1/2 messages while offline. With resumable
//! connections, the broker may be rebuilt from its records between operations, every connection
//! staying open: nothing a client sees may change.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use meridian_core::codec::{Packet, ProtocolVersion, QoS};
use meridian_core::topic::matches;
use proptest::prelude::*;

const FILTERS: &[&str] = &["a/b", "a/+", "a/#", "#", "+/b", "x/+/y", "+"];
const TOPICS: &[&str] = &["a/b", "a/c", "x/b", "a", "x/z/y", "a/b/c"];
const CLIENTS: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    Connect {
        client: usize,
        clean: bool,
    },
    Drop {
        client: usize,
    },
    Subscribe {
        client: usize,
        filter: usize,
        qos: u8,
    },
    Unsubscribe {
        client: usize,
        filter: usize,
    },
    Publish {
        client: usize,
        topic: usize,
        qos: u8,
    },
    /// The shell reports the client's connection congested (`true`) or drained.
    Congest {
        client: usize,
        congested: bool,
    },
    /// The broker is rebuilt from its records with every connection still open (when
    /// connections are resumable).
    Wake,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..CLIENTS, any::<bool>()).prop_map(|(client, clean)| Op::Connect { client, clean }),
        1 => (0..CLIENTS).prop_map(|client| Op::Drop { client }),
        3 => (0..CLIENTS, 0..FILTERS.len(), 0..3u8).prop_map(|(client, filter, qos)| Op::Subscribe { client, filter, qos }),
        1 => (0..CLIENTS, 0..FILTERS.len()).prop_map(|(client, filter)| Op::Unsubscribe { client, filter }),
        6 => (0..CLIENTS, 0..TOPICS.len(), 0..3u8).prop_map(|(client, topic, qos)| Op::Publish { client, topic, qos }),
        1 => (0..CLIENTS, any::<bool>()).prop_map(|(client, congested)| Op::Congest { client, congested }),
        1 => Just(Op::Wake),
    ]
}

fn qos(q: u8) -> QoS {
    QoS::from_u8(q).unwrap()
}

#[derive(Debug, Default, Clone)]
struct ModelSession {
    persistent: bool,
    subs: BTreeMap<&'static str, QoS>,
    /// QoS 1/2 messages waiting while offline.
    queued: Vec<(u32, QoS)>,
}

#[derive(Debug, Default)]
struct Model {
    sessions: BTreeMap<usize, ModelSession>,
    connected: BTreeMap<usize, meridian_core::ConnId>,
    /// Connected clients whose connection the shell reported congested: no QoS 0 for them.
    congested: BTreeSet<usize>,
    /// What each client must have received, in order.
    expected: BTreeMap<usize, Vec<(u32, QoS)>>,
}

fn run(versions: &[ProtocolVersion], resumable: bool, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut w = World::with_config(meridian_core::Config {
        resumable_connections: resumable,
        ..Default::default()
    });
    let mut m = Model::default();
    let mut received: BTreeMap<usize, Vec<(u32, QoS)>> = BTreeMap::new();
    let mut next_msg = 0u32;
    let mut next_pid = 0u16;

    for op in ops {
        match *op {
            Op::Connect { client, clean } => {
                let version = versions[client];
                let (conn, ack) = w.connect_with(version, &format!("c{client}"), |c| {
                    c.clean_start = clean;
                    if version == V5 {
                        c.properties.session_expiry_interval = Some(if clean { 0 } else { 3600 });
                    }
                });
                m.congested.remove(&client);
                if let Some(old) = m.connected.remove(&client) {
                    prop_assert!(w.is_closed(old), "takeover closes the old connection");
                    if !m.sessions[&client].persistent {
                        m.sessions.remove(&client);
                    }
                }
                let present = !clean && m.sessions.contains_key(&client);
                prop_assert_eq!(
                    ack.session_present,
                    present,
                    "session present for c{}",
                    client
                );
                let mut session = if present {
                    m.sessions.remove(&client).unwrap()
                } else {
                    ModelSession::default()
                };
                session.persistent = !clean;
                let queued = std::mem::take(&mut session.queued);
                m.expected.entry(client).or_default().extend(queued);
                m.sessions.insert(client, session);
                m.connected.insert(client, conn);
            }
            Op::Drop { client } => {
                m.congested.remove(&client);
                if let Some(conn) = m.connected.remove(&client) {
                    w.close(conn);
                    if !m.sessions[&client].persistent {
                        m.sessions.remove(&client);
                    }
                }
            }
            Op::Subscribe {
                client,
                filter,
                qos: q,
            } => {
                if let Some(&conn) = m.connected.get(&client) {
                    let granted = w.subscribe(conn, FILTERS[filter], qos(q));
                    prop_assert_eq!(granted, vec![meridian_core::codec::ReasonCode(q)]);
                    m.sessions
                        .get_mut(&client)
                        .unwrap()
                        .subs
                        .insert(FILTERS[filter], qos(q));
                }
            }
            Op::Unsubscribe { client, filter } => {
                if let Some(&conn) = m.connected.get(&client) {
                    w.unsubscribe(conn, FILTERS[filter]);
                    m.sessions
                        .get_mut(&client)
                        .unwrap()
                        .subs
                        .remove(FILTERS[filter]);
                }
            }
            Op::Publish {
                client,
                topic,
                qos: q,
            } => {
                if let Some(&conn) = m.connected.get(&client) {
                    let id = next_msg;
                    next_msg += 1;
                    next_pid = next_pid % 60_000 + 1;
                    let topic = TOPICS[topic];
                    w.publish(conn, topic, &id.to_be_bytes(), qos(q), false, next_pid);
                    if qos(q) == QoS::ExactlyOnce {
                        // Complete the handshake; keep whatever else arrived for the read loop.
                        let packets = w.recv(conn);
                        w.pending.insert(conn, packets);
                        w.send(
                            conn,
                            Packet::PubRel(meridian_core::codec::Ack::new(next_pid)),
                        );
                    }
                    for (&c, session) in m.sessions.iter_mut() {
                        let best = session
                            .subs
                            .iter()
                            .filter(|(f, _)| matches(f, topic))
                            .map(|(_, q)| *q)
                            .max();
                        let Some(best) = best else { continue };
                        let eff = qos(q).min(best);
                        if m.connected.contains_key(&c) {
                            if eff != QoS::AtMostOnce || !m.congested.contains(&c) {
                                m.expected.entry(c).or_default().push((id, eff));
                            }
                        } else if eff != QoS::AtMostOnce {
                            session.queued.push((id, eff));
                        }
                    }
                }
            }
            Op::Wake if resumable => {
                let open: Vec<_> = m.connected.values().copied().collect();
                let report = w.wake(&open);
                prop_assert_eq!(report.connections, open.len());
                // Congestion is the shell's to report again.
                m.congested.clear();
            }
            Op::Wake => {}
            Op::Congest { client, congested } => {
                if let Some(&conn) = m.connected.get(&client) {
                    w.set_congested(conn, congested);
                    if congested {
                        m.congested.insert(client);
                    } else {
                        m.congested.remove(&client);
                    }
                }
            }
        }
        // Every connected client reads and acknowledges everything, until quiet.
        loop {
            let mut any = false;
            for (&c, &conn) in &m.connected {
                for packet in w.recv(conn) {
                    match packet {
                        Packet::Publish(p) => {
                            any = true;
                            prop_assert!(!p.dup, "no redelivery expected: {:?}", p);
                            let id = u32::from_be_bytes(p.payload[..4].try_into().unwrap());
                            received.entry(c).or_default().push((id, p.qos));
                            w.ack(conn, &p);
                        }
                        Packet::PubAck(_)
                        | Packet::PubRec(_)
                        | Packet::PubComp(_)
                        | Packet::SubAck(_)
                        | Packet::UnsubAck(_) => {}
                        other => prop_assert!(false, "unexpected packet for c{}: {:?}", c, other),
                    }
                }
            }
            if !any {
                break;
            }
        }
        for c in 0..CLIENTS {
            let exp = m.expected.get(&c).cloned().unwrap_or_default();
            let got = received.get(&c).cloned().unwrap_or_default();
            prop_assert_eq!(got, exp, "client c{} after {:?}", c, op);
        }
        prop_assert_eq!(
            w.broker.held_bytes(),
            w.broker.held_bytes_recounted(),
            "the running count of held bytes after {:?}",
            op
        );
    }
    Ok(())
}

proptest! {
    // 256 cases by default; PROPTEST_CASES raises it (CI does, in its own step).
    #[test]
    fn broker_agrees_with_the_reference_model(
        versions in proptest::collection::vec(prop_oneof![Just(V3), Just(V5)], CLIENTS),
        resumable in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        run(&versions, resumable, &ops)?;
    }
}
