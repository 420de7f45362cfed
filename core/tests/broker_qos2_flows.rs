//! QoS 1/2 flows between publishers and subscribers that take their time: a publisher's
//! handshake (PUBACK, or PUBREC then PUBCOMP) never waits for a subscriber's progress
//! (MQTT-4.3.3-1, -4.3.3-4, -4.9.0-1). Subscribers here hold back their acknowledgements, refuse
//! messages with an error PUBREC, and acknowledge out of order; publishers batch their packets
//! in one read, split them across reads, send PUBREL before reading the PUBREC, and reuse
//! packet ids as soon as they are free.
//!
//! The broker answers within the input that completes a packet, so the checks are strict: once
//! the broker has read a publisher's PUBLISH or PUBREL whole, its answer is there.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use bytes::BytesMut;
use common::*;
use meridian_core::codec::{self, Ack, Packet, QoS, ReasonCode, SubscriptionOptions};
use meridian_core::{Config, ConnId};
use proptest::prelude::*;

const TOPICS: [&str; 2] = ["t/0", "t/1"];

/// A PUBREC refusing the message (>= 0x80): the flow ends there, with no PUBREL.
const REFUSED: ReasonCode = ReasonCode::UNSPECIFIED_ERROR;

fn encoded(packet: &Packet) -> BytesMut {
    let mut buf = BytesMut::new();
    codec::encode(packet, V5, &mut buf).expect("test packet encodes");
    buf
}

fn qos2_publish(topic: &str, payload: &[u8], packet_id: u16) -> Packet {
    Packet::Publish(publish_packet(
        topic,
        payload,
        QoS::ExactlyOnce,
        false,
        packet_id,
    ))
}

fn rec_with(packet_id: u16, reason: ReasonCode) -> Packet {
    let mut ack = Ack::new(packet_id);
    ack.reason = reason;
    Packet::PubRec(ack)
}

/// An MQTT 5.0 client with Receive Maximum `receive_maximum`, subscribed to `filter` at QoS 2.
fn subscriber(w: &mut World, id: &str, receive_maximum: u16, filter: &str) -> ConnId {
    let conn = w
        .connect_with(V5, id, |c| {
            c.properties.receive_maximum = Some(receive_maximum);
        })
        .0;
    w.subscribe(conn, filter, QoS::ExactlyOnce);
    conn
}

/// The acknowledgements among `packets`, as (kind, packet id, reason).
fn acks(packets: &[Packet]) -> Vec<(&'static str, u16, ReasonCode)> {
    packets
        .iter()
        .filter_map(|p| match p {
            Packet::PubAck(a) => Some(("PUBACK", a.packet_id, a.reason)),
            Packet::PubRec(a) => Some(("PUBREC", a.packet_id, a.reason)),
            Packet::PubRel(a) => Some(("PUBREL", a.packet_id, a.reason)),
            Packet::PubComp(a) => Some(("PUBCOMP", a.packet_id, a.reason)),
            _ => None,
        })
        .collect()
}

fn publishes(packets: &[Packet]) -> Vec<&codec::Publish> {
    packets
        .iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(p),
            _ => None,
        })
        .collect()
}

/// One QoS 2 handshake of a publisher, answered at each step.
fn publish_qos2_and_complete(w: &mut World, p: ConnId, topic: &str, payload: &[u8], id: u16) {
    w.send(p, qos2_publish(topic, payload, id));
    assert_eq!(
        acks(&w.recv(p)),
        [("PUBREC", id, ReasonCode::SUCCESS)],
        "PUBREC for {payload:?}"
    );
    w.send(p, Packet::PubRel(Ack::new(id)));
    assert_eq!(
        acks(&w.recv(p)),
        [("PUBCOMP", id, ReasonCode::SUCCESS)],
        "PUBCOMP for {payload:?}"
    );
}

#[test]
fn a_subscriber_holding_its_pubrec_does_not_hold_up_the_publisher() {
    let mut w = World::new();
    let s = subscriber(&mut w, "s", 1, "t");
    let p = w.connect(V5, "p");
    publish_qos2_and_complete(&mut w, p, "t", b"first", 1);
    publish_qos2_and_complete(&mut w, p, "t", b"second", 2);
    let got = w.recv(s);
    let first = publishes(&got);
    assert_eq!(first.len(), 1, "one message in flight: Receive Maximum 1");
    assert_eq!(&first[0].payload[..], b"first");
    let first_id = first[0].packet_id.unwrap();

    // Many more handshakes while the subscriber still holds its PUBREC, packet ids reused.
    for i in 0..100u16 {
        publish_qos2_and_complete(&mut w, p, "t", &i.to_be_bytes(), 1 + i % 3);
    }
    assert!(w.recv(s).is_empty(), "the slot stays taken until PUBCOMP");

    // The subscriber completes its first flow: the slot goes to the next message, only then.
    w.send(s, Packet::PubRec(Ack::new(first_id)));
    assert_eq!(
        acks(&w.recv(s)),
        [("PUBREL", first_id, ReasonCode::SUCCESS)]
    );
    assert!(w.recv(s).is_empty());
    w.send(s, Packet::PubComp(Ack::new(first_id)));
    let got = w.recv(s);
    let next = publishes(&got);
    assert_eq!(next.len(), 1);
    assert_eq!(&next[0].payload[..], b"second");
    assert_eq!(next[0].qos, QoS::ExactlyOnce);
    assert!(!next[0].dup);
    assert_ne!(next[0].packet_id, Some(0));
}

#[test]
fn an_error_pubrec_ends_the_flow_without_pubrel_and_frees_the_slot() {
    for reason in [0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99] {
        let mut w = World::new();
        let s = subscriber(&mut w, "s", 1, "t");
        let p = w.connect(V5, "p");
        publish_qos2_and_complete(&mut w, p, "t", b"refused", 10);
        publish_qos2_and_complete(&mut w, p, "t", b"next", 10);
        let got = w.recv(s);
        let first = publishes(&got);
        assert_eq!(first.len(), 1);
        let id = first[0].packet_id.unwrap();

        w.send(s, rec_with(id, ReasonCode(reason)));
        let got = w.recv(s);
        assert!(
            acks(&got).is_empty(),
            "no PUBREL after PUBREC {reason:#x}: {got:?}"
        );
        let next = publishes(&got);
        assert_eq!(next.len(), 1, "the slot is free again after {reason:#x}");
        assert_eq!(&next[0].payload[..], b"next");
        assert_eq!(w.broker.stats().inflight_messages, 1);

        assert_ne!(next[0].packet_id, Some(0));
        assert!(!next[0].dup);

        // A PUBREL never follows, even once more messages flow; a stray PUBCOMP for the
        // refused id changes nothing.
        let next = next[0].clone();
        w.send(s, Packet::PubComp(Ack::new(id)));
        publish_qos2_and_complete(&mut w, p, "t", b"third", 11);
        assert!(w.recv(s).is_empty(), "Receive Maximum 1: the third waits");
        w.ack(s, &next);
        let got = w.recv(s);
        assert!(acks(&got).is_empty(), "{got:?}");
        assert_eq!(&publishes(&got)[0].payload[..], b"third");
    }
}

#[test]
fn an_error_pubrec_from_one_subscriber_leaves_the_others_flows_alone() {
    let mut w = World::new();
    let a = subscriber(&mut w, "a", 1, "t");
    let b = subscriber(&mut w, "b", 1, "t");
    let p = w.connect(V5, "p");
    publish_qos2_and_complete(&mut w, p, "t", b"1", 1);
    publish_qos2_and_complete(&mut w, p, "t", b"2", 1);
    let to_a = w.received_publishes(a);
    let to_b = w.received_publishes(b);
    w.send(a, rec_with(to_a[0].packet_id.unwrap(), REFUSED));
    w.ack(b, &to_b[0]);
    assert_eq!(&w.received_publishes(a)[0].payload[..], b"2");
    assert_eq!(&w.received_publishes(b)[0].payload[..], b"2");
}

#[test]
fn a_publishers_packets_batched_in_one_read_are_all_answered() {
    let mut w = World::new();
    let s = subscriber(&mut w, "s", 1, "t");
    let p = w.connect(V5, "p");

    // PUBLISH and its PUBREL in one read, before the client saw the PUBREC.
    let mut batch = encoded(&qos2_publish("t", b"a", 1));
    batch.extend_from_slice(&encoded(&Packet::PubRel(Ack::new(1))));
    w.send_bytes(p, &batch);
    assert_eq!(
        acks(&w.recv(p)),
        [
            ("PUBREC", 1, ReasonCode::SUCCESS),
            ("PUBCOMP", 1, ReasonCode::SUCCESS)
        ]
    );

    // Many handshakes in one read, the same packet id reused at once.
    let mut batch = BytesMut::new();
    let mut expected = Vec::new();
    for i in 0..20u8 {
        batch.extend_from_slice(&encoded(&qos2_publish("t", &[i], 1)));
        batch.extend_from_slice(&encoded(&Packet::PubRel(Ack::new(1))));
        expected.push(("PUBREC", 1, ReasonCode::SUCCESS));
        expected.push(("PUBCOMP", 1, ReasonCode::SUCCESS));
    }
    w.send_bytes(p, &batch);
    assert_eq!(acks(&w.recv(p)), expected);

    // A PUBREL with the next PUBLISH in one read, the PUBLISH's own PUBREL in a split read.
    w.send(p, qos2_publish("t", b"x", 2));
    assert_eq!(acks(&w.recv(p)), [("PUBREC", 2, ReasonCode::SUCCESS)]);
    let mut batch = encoded(&Packet::PubRel(Ack::new(2)));
    batch.extend_from_slice(&encoded(&qos2_publish("t", b"y", 3)));
    let rel = encoded(&Packet::PubRel(Ack::new(3)));
    batch.extend_from_slice(&rel[..1]);
    w.send_bytes(p, &batch);
    assert_eq!(
        acks(&w.recv(p)),
        [
            ("PUBCOMP", 2, ReasonCode::SUCCESS),
            ("PUBREC", 3, ReasonCode::SUCCESS)
        ]
    );
    w.send_bytes(p, &rel[1..]);
    assert_eq!(acks(&w.recv(p)), [("PUBCOMP", 3, ReasonCode::SUCCESS)]);

    // The subscriber, holding nothing back, gets every message once, in order.
    let mut got = Vec::new();
    loop {
        let batch = w.received_publishes(s);
        if batch.is_empty() {
            break;
        }
        for m in &batch {
            got.push(m.payload.to_vec());
            w.ack(s, m);
        }
    }
    let mut want = vec![b"a".to_vec()];
    want.extend((0..20u8).map(|i| vec![i]));
    want.extend([b"x".to_vec(), b"y".to_vec()]);
    assert_eq!(got, want);
}

#[test]
fn two_publishers_and_two_subscribers_interleaved() {
    let mut w = World::new();
    let s1 = subscriber(&mut w, "s1", 1, "t/+");
    let s2 = subscriber(&mut w, "s2", 2, "t/#");
    let p1 = w.connect(V5, "p1");
    let p2 = w.connect(V5, "p2");
    // s1 holds its first PUBREC throughout; s2 refuses every other message.
    let mut held = None;
    let mut s2_got = Vec::new();
    for i in 0..40u16 {
        let (p, topic) = if i % 2 == 0 { (p1, "t/a") } else { (p2, "t/b") };
        let id = 1 + (i / 2) % 2;
        w.send(p, qos2_publish(topic, &i.to_be_bytes(), id));
        assert_eq!(acks(&w.recv(p)), [("PUBREC", id, ReasonCode::SUCCESS)]);
        for m in w.received_publishes(s1) {
            assert!(held.is_none(), "Receive Maximum 1 while a PUBREC is held");
            held = m.packet_id;
        }
        for m in w.received_publishes(s2) {
            let n = u16::from_be_bytes([m.payload[0], m.payload[1]]);
            s2_got.push(n);
            if n % 2 == 0 {
                w.ack(s2, &m);
            } else {
                w.send(s2, rec_with(m.packet_id.unwrap(), REFUSED));
            }
        }
        w.send(p, Packet::PubRel(Ack::new(id)));
        assert_eq!(acks(&w.recv(p)), [("PUBCOMP", id, ReasonCode::SUCCESS)]);
    }
    loop {
        let batch = w.recv(s2);
        assert!(acks(&batch).is_empty(), "no PUBREL after a refusal");
        let batch = publishes(&batch);
        if batch.is_empty() {
            break;
        }
        for m in batch {
            s2_got.push(u16::from_be_bytes([m.payload[0], m.payload[1]]));
            w.ack(s2, m);
        }
    }
    assert_eq!(s2_got, (0..40).collect::<Vec<_>>());
    assert!(held.is_some());
    assert!(w.recv(s1).is_empty());
    assert_eq!(w.broker.stats().queued_messages, 39);
}

// ----- the simulation: clients that take their time, in varied interleavings -----

/// Where a message a client received stands, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inbound {
    /// PUBLISH received, not acknowledged yet.
    Published(QoS),
    /// PUBREC (success) written, waiting for PUBREL.
    Received,
    /// PUBREL received, PUBCOMP not written yet.
    Released,
}

/// A client of the simulation: it publishes and subscribes, speaks MQTT 5.0 packet by packet,
/// writes into a buffer of its own and lets the broker read that buffer in arbitrary pieces.
#[derive(Debug)]
struct Client {
    conn: ConnId,
    receive_maximum: u16,
    /// Messages it publishes at most at once (unacknowledged QoS 1/2 flows).
    max_outstanding: usize,
    /// Holds the acknowledgement of the first message it receives for ever.
    stubborn: bool,
    /// Refuses this share (out of 8) of the QoS 2 messages it receives, with an error PUBREC.
    refuse: u8,
    /// Bytes written and not yet read by the broker.
    out: BytesMut,
    /// Bytes written in all, and read by the broker in all.
    written: usize,
    read: usize,
    /// Its QoS 1/2 PUBLISHes not yet acknowledged: packet id, QoS, the offset its bytes end at.
    awaiting_ack: BTreeMap<u16, (QoS, usize)>,
    /// PUBREC received, PUBREL not yet written.
    owes_rel: BTreeSet<u16>,
    /// PUBREL written: the offset its bytes end at.
    awaiting_comp: BTreeMap<u16, usize>,
    /// Messages received and not finished, by the broker's packet id.
    inbound: BTreeMap<u16, Inbound>,
    /// The packet id whose acknowledgement it holds for ever (stubborn clients).
    held: Option<u16>,
    /// Messages received (their numbers), in order.
    received: Vec<u32>,
    /// QoS 2 packet ids it refused: a PUBREL for one of them is a violation.
    refused: BTreeSet<u16>,
}

#[derive(Debug, Clone, Copy)]
struct ClientSetup {
    receive_maximum: u16,
    max_outstanding: usize,
    stubborn: bool,
    refuse: u8,
    /// Subscribed to TOPICS[0], TOPICS[1].
    subscribed: [bool; 2],
    persistent: bool,
}

/// One thing that happens next.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Client `c` writes a QoS 1/2 PUBLISH (with its PUBREL right behind it if `pipelined`).
    Publish {
        c: usize,
        topic: usize,
        qos2: bool,
        pipelined: bool,
        /// Which free packet id: 0 the lowest, others a random one.
        pick: u8,
    },
    /// The broker reads `share` (out of 256) of what client `c` wrote, at least one byte.
    Read { c: usize, share: u8 },
    /// Client `c` reads what the broker sent it and writes what it owes (PUBRELs, PUBCOMPs),
    /// and acknowledges up to `acks` of the messages it received, chosen by `pick`.
    Handle { c: usize, acks: u8, pick: u8 },
    /// The shell reports client `c`'s connection congested, or drained.
    Congest { c: usize, congested: bool },
}

struct Sim {
    w: World,
    clients: Vec<Client>,
    setups: Vec<ClientSetup>,
    /// Every message accepted by the broker (its number and topic), in the order it was
    /// routed.
    routed: Vec<(u32, usize)>,
    next_number: u32,
    /// The number each publisher's PUBLISH carries, by (client, packet id).
    numbers: BTreeMap<(usize, u16), (u32, usize)>,
    window_cap: u16,
}

impl Sim {
    fn new(setups: &[ClientSetup], config: Config) -> Self {
        let window_cap = config.max_inflight;
        let mut w = World::with_config(config);
        let mut clients = Vec::new();
        for (i, s) in setups.iter().enumerate() {
            let conn = w
                .connect_with(V5, &format!("c{i}"), |c| {
                    c.properties.receive_maximum = Some(s.receive_maximum);
                    c.properties.session_expiry_interval = s.persistent.then_some(3600);
                })
                .0;
            for (t, _) in TOPICS.iter().enumerate().filter(|(t, _)| s.subscribed[*t]) {
                let granted = w.subscribe_with(
                    conn,
                    TOPICS[t],
                    SubscriptionOptions {
                        qos: if t == 0 {
                            QoS::ExactlyOnce
                        } else {
                            QoS::AtLeastOnce
                        },
                        ..Default::default()
                    },
                    None,
                );
                assert!(!granted[0].is_error());
            }
            clients.push(Client {
                conn,
                receive_maximum: s.receive_maximum,
                max_outstanding: s.max_outstanding,
                stubborn: s.stubborn,
                refuse: s.refuse,
                out: BytesMut::new(),
                written: 0,
                read: 0,
                awaiting_ack: BTreeMap::new(),
                owes_rel: BTreeSet::new(),
                awaiting_comp: BTreeMap::new(),
                inbound: BTreeMap::new(),
                held: None,
                received: Vec::new(),
                refused: BTreeSet::new(),
            });
        }
        Self {
            w,
            clients,
            setups: setups.to_vec(),
            routed: Vec::new(),
            next_number: 0,
            numbers: BTreeMap::new(),
            window_cap,
        }
    }

    fn write(&mut self, c: usize, packet: &Packet) -> usize {
        let client = &mut self.clients[c];
        let bytes = encoded(packet);
        client.written += bytes.len();
        client.out.extend_from_slice(&bytes);
        client.written
    }

    fn step(&mut self, step: Step) -> Result<(), String> {
        match step {
            Step::Publish {
                c,
                topic,
                qos2,
                pipelined,
                pick,
            } => {
                let client = &self.clients[c];
                let outstanding =
                    client.awaiting_ack.len() + client.owes_rel.len() + client.awaiting_comp.len();
                if outstanding >= client.max_outstanding {
                    return Ok(());
                }
                let in_use = |id: &u16| {
                    client.awaiting_ack.contains_key(id)
                        || client.owes_rel.contains(id)
                        || client.awaiting_comp.contains_key(id)
                };
                let free: Vec<u16> = (1..=8).filter(|id| !in_use(id)).collect();
                let id = if pick == 0 {
                    free[0]
                } else {
                    free[usize::from(pick) % free.len()]
                };
                let number = self.next_number;
                self.next_number += 1;
                let qos = if qos2 {
                    QoS::ExactlyOnce
                } else {
                    QoS::AtLeastOnce
                };
                let mut payload = number.to_be_bytes().to_vec();
                payload.push(c as u8);
                let publish = publish_packet(TOPICS[topic], &payload, qos, false, id);
                let end = self.write(c, &Packet::Publish(publish));
                self.numbers.insert((c, id), (number, topic));
                self.clients[c].awaiting_ack.insert(id, (qos, end));
                if qos2 && pipelined {
                    // Released before the client saw its PUBREC: the PUBREC is then taken as
                    // the answer to the PUBLISH only.
                    let end = self.write(c, &Packet::PubRel(Ack::new(id)));
                    self.clients[c].awaiting_comp.insert(id, end);
                }
            }
            Step::Read { c, share } => {
                let client = &mut self.clients[c];
                if client.out.is_empty() {
                    return Ok(());
                }
                let n = (client.out.len() * usize::from(share) / 256).max(1);
                let data = client.out.split_to(n);
                client.read += n;
                let conn = client.conn;
                self.w.send_bytes(conn, &data);
                // The broker answers within the input: the client reads it at once.
                self.handle(c, 0, 0)?;
                self.check_answered(c)?;
            }
            Step::Handle { c, acks, pick } => {
                self.handle(c, acks, pick)?;
                self.check_answered(c)?;
            }
            Step::Congest { c, congested } => {
                let conn = self.clients[c].conn;
                self.w.set_congested(conn, congested);
            }
        }
        self.check_no_stall()
    }

    /// Client `c` reads what it was sent, writes what it owes, and acknowledges up to `acks`
    /// of the messages it received.
    fn handle(&mut self, c: usize, acks: u8, mut pick: u8) -> Result<(), String> {
        let conn = self.clients[c].conn;
        let packets = self.w.recv(conn);
        let window = usize::from(self.clients[c].receive_maximum.min(self.window_cap));
        for packet in packets {
            let client = &mut self.clients[c];
            match packet {
                Packet::Publish(p) => {
                    let id = p.packet_id.ok_or("a QoS 1/2 PUBLISH without packet id")?;
                    if id == 0 || p.dup {
                        return Err(format!("c{c}: PUBLISH with id {id}, dup {}", p.dup));
                    }
                    if client.inbound.contains_key(&id) {
                        return Err(format!("c{c}: packet id {id} sent while still in use"));
                    }
                    client.inbound.insert(id, Inbound::Published(p.qos));
                    client.refused.remove(&id);
                    if client.inbound.len() > window {
                        return Err(format!(
                            "c{c}: {} messages in flight, Receive Maximum {window}",
                            client.inbound.len()
                        ));
                    }
                    let number = u32::from_be_bytes(p.payload[..4].try_into().unwrap());
                    client.received.push(number);
                    if client.stubborn && client.held.is_none() {
                        client.held = Some(id);
                    }
                }
                Packet::PubRel(a) => match client.inbound.get(&a.packet_id) {
                    Some(Inbound::Received) => {
                        client.inbound.insert(a.packet_id, Inbound::Released);
                    }
                    _ if client.refused.contains(&a.packet_id) => {
                        return Err(format!(
                            "c{c}: PUBREL for packet id {} refused with an error PUBREC \
                             (MQTT-4.3.3-4)",
                            a.packet_id
                        ));
                    }
                    other => {
                        return Err(format!(
                            "c{c}: PUBREL for packet id {} in state {other:?}",
                            a.packet_id
                        ));
                    }
                },
                Packet::PubAck(a) => self.publisher_answer(c, "PUBACK", a)?,
                Packet::PubRec(a) => self.publisher_answer(c, "PUBREC", a)?,
                Packet::PubComp(a) => {
                    if client.awaiting_comp.remove(&a.packet_id).is_none()
                        || a.reason != ReasonCode::SUCCESS
                    {
                        return Err(format!("c{c}: unexpected PUBCOMP {a:?}"));
                    }
                }
                other => return Err(format!("c{c}: unexpected {other:?}")),
            }
        }
        // The PUBRELs it owes.
        for id in std::mem::take(&mut self.clients[c].owes_rel) {
            let end = self.write(c, &Packet::PubRel(Ack::new(id)));
            self.clients[c].awaiting_comp.insert(id, end);
        }
        // Acknowledge some of what it received, in any order.
        for _ in 0..acks {
            let client = &self.clients[c];
            let open: Vec<(u16, Inbound)> = client
                .inbound
                .iter()
                .filter(|(id, _)| client.held != Some(**id))
                .map(|(id, s)| (*id, *s))
                .collect();
            if open.is_empty() {
                break;
            }
            let (id, state) = open[usize::from(pick) % open.len()];
            pick = pick.wrapping_mul(31).wrapping_add(7);
            let refuse = pick % 8 < self.clients[c].refuse;
            match state {
                Inbound::Published(QoS::AtLeastOnce) => {
                    self.write(c, &Packet::PubAck(Ack::new(id)));
                    self.clients[c].inbound.remove(&id);
                }
                Inbound::Published(_) if refuse => {
                    self.write(c, &rec_with(id, REFUSED));
                    self.clients[c].inbound.remove(&id);
                    self.clients[c].refused.insert(id);
                }
                Inbound::Published(_) => {
                    self.write(c, &Packet::PubRec(Ack::new(id)));
                    self.clients[c].inbound.insert(id, Inbound::Received);
                }
                Inbound::Received => {}
                Inbound::Released => {
                    self.write(c, &Packet::PubComp(Ack::new(id)));
                    self.clients[c].inbound.remove(&id);
                }
            }
        }
        Ok(())
    }

    /// A PUBACK or PUBREC to client `c` as a publisher.
    fn publisher_answer(&mut self, c: usize, kind: &str, a: Ack) -> Result<(), String> {
        let client = &mut self.clients[c];
        let Some((qos, _)) = client.awaiting_ack.remove(&a.packet_id) else {
            return Err(format!("c{c}: {kind} {a:?} for no PUBLISH"));
        };
        let expected = if qos == QoS::ExactlyOnce {
            "PUBREC"
        } else {
            "PUBACK"
        };
        if kind != expected || a.reason != ReasonCode::SUCCESS {
            return Err(format!("c{c}: {kind} {a:?} for a QoS {qos:?} PUBLISH"));
        }
        if qos == QoS::ExactlyOnce && !client.awaiting_comp.contains_key(&a.packet_id) {
            client.owes_rel.insert(a.packet_id);
        }
        let (number, topic) = self.numbers[&(c, a.packet_id)];
        self.routed.push((number, topic));
        Ok(())
    }

    /// Every PUBLISH and PUBREL the broker read whole from client `c` is answered.
    fn check_answered(&self, c: usize) -> Result<(), String> {
        let client = &self.clients[c];
        let read = client.read;
        if let Some((id, _)) = client
            .awaiting_ack
            .iter()
            .find(|(_, (_, end))| *end <= read)
        {
            return Err(format!(
                "c{c}: PUBLISH {id} read by the broker, not answered"
            ));
        }
        if let Some((id, _)) = client.awaiting_comp.iter().find(|(_, end)| **end <= read) {
            return Err(format!("c{c}: PUBREL {id} read by the broker, no PUBCOMP"));
        }
        Ok(())
    }

    /// No session keeps messages queued while its client has room for them.
    fn check_no_stall(&self) -> Result<(), String> {
        for summary in self.w.broker.clients() {
            let c: usize = summary.client_id[1..].parse().unwrap();
            let window = usize::from(self.clients[c].receive_maximum.min(self.window_cap));
            if summary.queued > 0 && summary.inflight < window {
                return Err(format!(
                    "c{c}: {} queued with {} of {window} in flight",
                    summary.queued, summary.inflight
                ));
            }
        }
        Ok(())
    }

    /// Everyone writes and reads everything, acknowledging all but what is held for ever,
    /// until nothing moves; then every handshake is complete and every message delivered.
    fn finish(&mut self) -> Result<(), String> {
        for round in 0.. {
            if round > 10_000 {
                return Err("no quiet after 10,000 rounds".into());
            }
            let mut moved = false;
            for c in 0..self.clients.len() {
                if !self.clients[c].out.is_empty() {
                    moved = true;
                    self.step(Step::Read { c, share: 255 })?;
                }
                let before = self.clients[c].out.len();
                self.step(Step::Handle {
                    c,
                    acks: u8::MAX,
                    pick: round as u8,
                })?;
                moved |= self.clients[c].out.len() != before;
            }
            if !moved {
                break;
            }
        }
        for (c, client) in self.clients.iter().enumerate() {
            if !client.awaiting_ack.is_empty() || !client.awaiting_comp.is_empty() {
                return Err(format!(
                    "c{c}: handshakes left: {:?} {:?}",
                    client.awaiting_ack, client.awaiting_comp
                ));
            }
            let expected: Vec<u32> = self
                .routed
                .iter()
                .filter(|(_, t)| self.setups[c].subscribed[*t])
                .map(|(n, _)| *n)
                .collect();
            let window = usize::from(client.receive_maximum.min(self.window_cap));
            let complete = !client.stubborn || window > 1 || expected.is_empty();
            let ok = if complete {
                client.received == expected
            } else {
                client.received == expected[..1]
            };
            if !ok {
                return Err(format!(
                    "c{c} received {:?}, expected {expected:?}",
                    client.received
                ));
            }
        }
        if self.w.broker.held_bytes() != self.w.broker.held_bytes_recounted() {
            return Err("held bytes miscounted".into());
        }
        Ok(())
    }
}

/// splitmix64, for seeded runs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

/// The shape: a subscriber with Receive Maximum 1 holding its first PUBREC, one that
/// refuses some messages, and two publishers that wait for each PUBCOMP or pipeline.
fn setups_from(rng: &mut Rng) -> (Vec<ClientSetup>, Config) {
    let n = 2 + rng.below(3) as usize;
    let mut setups = vec![
        ClientSetup {
            receive_maximum: 1,
            max_outstanding: 1,
            stubborn: true,
            refuse: 0,
            subscribed: [true, rng.below(2) == 0],
            persistent: rng.below(2) == 0,
        },
        ClientSetup {
            receive_maximum: 1 + rng.below(3) as u16,
            max_outstanding: 1,
            stubborn: false,
            refuse: rng.below(5) as u8,
            subscribed: [true, true],
            persistent: rng.below(2) == 0,
        },
    ];
    for _ in setups.len()..n {
        setups.push(ClientSetup {
            receive_maximum: 1 + rng.below(4) as u16,
            max_outstanding: 1 + rng.below(3) as usize,
            stubborn: rng.below(4) == 0,
            refuse: rng.below(3) as u8,
            subscribed: [rng.below(3) == 0, rng.below(3) == 0],
            persistent: rng.below(2) == 0,
        });
    }
    let config = Config {
        max_inflight: if rng.below(4) == 0 { 2 } else { 256 },
        resumable_connections: rng.below(2) == 0,
        ..Config::default()
    };
    (setups, config)
}

fn step_from(rng: &mut Rng, clients: usize) -> Step {
    let c = rng.below(clients as u64) as usize;
    match rng.below(10) {
        0..=2 => Step::Publish {
            c,
            topic: rng.below(2) as usize,
            qos2: rng.below(4) != 0,
            pipelined: rng.below(4) == 0,
            pick: rng.byte() % 2,
        },
        3..=5 => Step::Read {
            c,
            share: if rng.below(2) == 0 { 255 } else { rng.byte() },
        },
        6..=8 => Step::Handle {
            c,
            acks: rng.below(3) as u8,
            pick: rng.byte(),
        },
        _ => Step::Congest {
            c,
            congested: rng.below(2) == 0,
        },
    }
}

fn run_seed(seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let (setups, config) = setups_from(&mut rng);
    let mut sim = Sim::new(&setups, config);
    for _ in 0..rng.below(400) {
        let step = step_from(&mut rng, setups.len());
        sim.step(step).map_err(|e| format!("after {step:?}: {e}"))?;
    }
    sim.finish()
}

/// Varied interleavings drawn from a seeded generator, 400 runs: a stall that one interleaving
/// in six shows would go unseen with a chance of (5/6)^400, about 10^-32. Set
/// `QOS2_FLOWS_SEED` to start from another seed (a failure prints the seed to rerun).
#[test]
fn qos_handshakes_complete_in_every_interleaving() {
    let base = std::env::var("QOS2_FLOWS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_f10a_u64);
    for round in 0..400 {
        let seed = base.wrapping_add(round);
        if let Err(e) = run_seed(seed) {
            panic!("seed {seed} (QOS2_FLOWS_SEED={seed} reruns it first): {e}");
        }
    }
}

fn setup_strategy() -> impl Strategy<Value = ClientSetup> {
    (
        1..=3u16,
        1..=3usize,
        any::<bool>(),
        0..4u8,
        any::<[bool; 2]>(),
        any::<bool>(),
    )
        .prop_map(
            |(receive_maximum, max_outstanding, stubborn, refuse, subscribed, persistent)| {
                ClientSetup {
                    receive_maximum,
                    max_outstanding,
                    stubborn,
                    refuse,
                    subscribed,
                    persistent,
                }
            },
        )
}

fn step_strategy(clients: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..clients, 0..2usize, any::<bool>(), any::<bool>(), 0..2u8).prop_map(
            |(c, topic, qos2, pipelined, pick)| Step::Publish { c, topic, qos2, pipelined, pick }
        ),
        3 => (0..clients, any::<u8>()).prop_map(|(c, share)| Step::Read { c, share }),
        3 => (0..clients, 0..3u8, any::<u8>()).prop_map(|(c, acks, pick)| Step::Handle { c, acks, pick }),
        1 => (0..clients, any::<bool>()).prop_map(|(c, congested)| Step::Congest { c, congested }),
    ]
}

proptest! {
    /// Subscribers hold back their acknowledgements as they like (some for ever, some refuse
    /// messages): every publisher's QoS 1/2 handshake completes regardless, each step answered
    /// as soon as the broker has read it, and every subscriber that acknowledges gets every
    /// message once, in order.
    #[test]
    fn publishers_never_wait_for_subscribers(
        (setups, steps) in proptest::collection::vec(setup_strategy(), 2..5).prop_flat_map(|setups| {
            let n = setups.len();
            (Just(setups), proptest::collection::vec(step_strategy(n), 0..200))
        }),
        small_window in any::<bool>(),
    ) {
        let config = Config {
            max_inflight: if small_window { 2 } else { 256 },
            ..Config::default()
        };
        let mut sim = Sim::new(&setups, config);
        for step in steps {
            sim.step(step).map_err(|e| TestCaseError::fail(format!("after {step:?}: {e}")))?;
        }
        sim.finish().map_err(TestCaseError::fail)?;
    }
}
