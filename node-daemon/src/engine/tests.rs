//! The broker task end to end, on a real store: what goes out, when, and in what order.

use bytes::BytesMut;
use meridian_core::broker::AllowAll;
use tokio::sync::oneshot;

use super::commit::COMMIT_WINDOW_RECORDS;
use super::*;
use crate::mailbox::Outbox;
use crate::mailbox::outbox::End;
use crate::storage::SyncPolicy;

const TEST_LIMITS: WriteLimits = WriteLimits {
    max_bytes: 1 << 20,
    qos0_max_bytes: 1 << 18,
};

fn store(dir: &std::path::Path) -> Store {
    Store::open(
        dir,
        SyncPolicy::Always,
        Duration::from_secs(1),
        crate::storage::MIN_CACHE_BYTES,
        crate::storage::MIN_JOURNAL_BYTES,
    )
    .unwrap()
}

fn tcp_conns() -> TcpConns {
    crate::transport::tcp::new().unwrap().1
}

fn allow_all() -> DaemonBroker {
    let config = meridian_core::Config::default();
    Broker::with_auth(config, Timestamp(0), Box::new(AllowAll), Box::new(AllowAll))
}

#[test]
fn connections_still_open_are_closed_when_the_broker_task_ends() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let mut engine =
        Engine::new(allow_all(), store, TEST_LIMITS, Arc::default(), tcp_conns()).unwrap();
    let outbox = Outbox::new();
    let (reply, _conn) = oneshot::channel();
    engine.handle(ToEngine::Conn(ConnEvent::Accept {
        info: ConnInfo::default(),
        outbox: outbox.clone(),
        reply,
    }));
    drop(engine);
    let mut out = std::collections::VecDeque::new();
    assert_eq!(outbox.take(&mut out), Some(End::Kill));
}

/// The bytes of one packet, as a client would send them (MQTT 5.0).
fn wire(packet: meridian_core::codec::Packet) -> Bytes {
    let mut buf = BytesMut::new();
    meridian_core::codec::encode(&packet, meridian_core::codec::ProtocolVersion::V5, &mut buf)
        .unwrap();
    buf.freeze()
}

/// A connection registered with the engine, connected as `client_id`, its outbox empty.
fn client(engine: &mut Engine, client_id: &str) -> (ConnId, Arc<Outbox>) {
    use meridian_core::codec::{Connect, ConnectProperties, Packet, ProtocolVersion};
    let outbox = Outbox::new();
    let (reply, mut conn) = oneshot::channel();
    engine.handle(ToEngine::Conn(ConnEvent::Accept {
        info: ConnInfo::default(),
        outbox: outbox.clone(),
        reply,
    }));
    let conn = conn.try_recv().unwrap();
    let connect = Connect {
        protocol: ProtocolVersion::V5,
        clean_start: true,
        keep_alive: 0,
        client_id: client_id.to_owned(),
        will: None,
        username: None,
        password: None,
        properties: ConnectProperties::default(),
    };
    engine.handle(ToEngine::Conn(ConnEvent::Bytes {
        conn,
        data: wire(Packet::Connect(connect)),
    }));
    engine.flush().unwrap();
    let mut taken = std::collections::VecDeque::new();
    outbox.take(&mut taken);
    outbox.written(taken.iter().map(Bytes::len).sum());
    (conn, outbox)
}

/// A client `sub` subscribed to `filter`, its SUBACK taken from its outbox.
fn subscriber(engine: &mut Engine, filter: &str) -> (ConnId, Arc<Outbox>) {
    use meridian_core::codec::{Packet, Subscribe, SubscribeFilter};
    let (sub, outbox) = client(engine, "sub");
    engine.handle(ToEngine::Conn(ConnEvent::Bytes {
        conn: sub,
        data: wire(Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters: vec![SubscribeFilter {
                filter: filter.to_owned(),
                options: Default::default(),
            }],
            properties: Default::default(),
        })),
    }));
    engine.flush().unwrap();
    assert!(matches!(
        packets(&outbox)[..],
        [meridian_core::codec::Packet::SubAck(_)]
    ));
    (sub, outbox)
}

/// A batch that would take a subscriber past its QoS 0 mark tells the broker as soon as
/// it does: the rest of the batch's QoS 0 messages for it are dropped, not queued.
#[test]
fn a_batch_stops_queueing_qos0_at_the_mark_not_after_it() {
    use meridian_core::codec::{Packet, Publish, QoS};
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let mut engine =
        Engine::new(allow_all(), store, TEST_LIMITS, Arc::default(), tcp_conns()).unwrap();
    let (sub, sub_box) = subscriber(&mut engine, "t");
    let acked = sub_box.queued();
    let (publisher, _) = client(&mut engine, "pub");
    const COUNT: usize = 40;
    let payload = Bytes::from(vec![0u8; 16 * 1024]);
    for _ in 0..COUNT {
        let publish = Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: "t".to_owned(),
            packet_id: None,
            payload: payload.clone(),
            properties: Default::default(),
        };
        engine.handle(ToEngine::Conn(ConnEvent::Bytes {
            conn: publisher,
            data: wire(Packet::Publish(publish)),
        }));
    }
    engine.flush().unwrap();
    let stats = engine.broker.stats();
    let delivered = usize::try_from(stats.messages_sent[0]).unwrap();
    let dropped = usize::try_from(stats.dropped_qos0_congested).unwrap();
    assert_eq!(delivered + dropped, COUNT);
    assert!(dropped > 0, "nothing dropped: {delivered} delivered");
    let backlog = sub_box.queued() - acked;
    assert!(
        backlog <= TEST_LIMITS.qos0_max_bytes + payload.len() + 64,
        "{backlog} bytes queued, past the mark by more than one message"
    );
    assert!(!engine.conns.has_gone() && engine.conns.queued(sub).is_some());
}

/// The packets queued on a connection since the last look.
fn packets(outbox: &Outbox) -> Vec<meridian_core::codec::Packet> {
    use meridian_core::codec::{ProtocolVersion, decode};
    let mut taken = std::collections::VecDeque::new();
    outbox.take(&mut taken);
    let mut buf: BytesMut = taken.iter().flat_map(|b| b.iter().copied()).collect();
    outbox.written(buf.len());
    let mut packets = Vec::new();
    while let Some(p) = decode(&mut buf, ProtocolVersion::V5, u32::MAX).unwrap() {
        packets.push(p);
    }
    packets
}

/// With a commit window, what the turns after a commit send waits for one fsync that
/// makes all their commits durable, and then goes out in order.
#[test]
fn turns_in_a_commit_window_share_one_fsync_and_send_after_it() {
    use meridian_core::codec::{Ack, Packet, Publish, QoS};
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::new(
        allow_all(),
        store(dir.path()),
        TEST_LIMITS,
        Arc::default(),
        tcp_conns(),
    )
    .unwrap();
    let (_, sub_box) = subscriber(&mut engine, "#");
    let publishers = [client(&mut engine, "p1"), client(&mut engine, "p2")];
    engine.commit =
        CommitWindow::new(Duration::from_secs(3600)).with_recent(Duration::from_secs(3600));
    // Retained QoS 1 messages: stored, so their PUBACKs wait for the disk.
    let retained = |topic: &str, packet_id: u16| {
        wire(Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: topic.to_owned(),
            packet_id: Some(packet_id),
            payload: Bytes::from_static(b"m"),
            properties: Default::default(),
        }))
    };
    // A source's first commit is fsynced at once: only one that committed just before waits
    // for company.
    for (conn, outbox) in &publishers {
        engine.handle(ToEngine::Conn(ConnEvent::Bytes {
            conn: *conn,
            data: retained("first", 6),
        }));
        engine.flush().unwrap();
        assert!(!engine.commit.is_open());
        assert!(matches!(
            packets(outbox)[..],
            [Packet::PubAck(Ack { packet_id: 6, .. })]
        ));
    }
    assert_eq!(packets(&sub_box).len(), 2);
    let syncs = engine.store.syncs();
    // One turn each.
    for ((conn, _), topic) in publishers.iter().zip(["a", "b"]) {
        engine.handle(ToEngine::Conn(ConnEvent::Bytes {
            conn: *conn,
            data: retained(topic, 7),
        }));
        engine.flush().unwrap();
        assert!(engine.commit.is_open());
        assert_eq!(
            engine.store.syncs(),
            syncs,
            "fsynced before the window closed"
        );
        for (_, outbox) in &publishers {
            assert!(packets(outbox).is_empty(), "acknowledged before the fsync");
        }
        assert!(packets(&sub_box).is_empty(), "delivered before the fsync");
    }
    engine.commit_held().unwrap();
    assert_eq!(engine.store.syncs(), syncs + 1);
    assert!(!engine.commit.is_open());
    for (_, outbox) in &publishers {
        assert!(matches!(
            packets(outbox)[..],
            [Packet::PubAck(Ack { packet_id: 7, .. })]
        ));
    }
    let delivered: Vec<String> = packets(&sub_box)
        .into_iter()
        .filter_map(|p| match p {
            Packet::Publish(p) => Some(p.topic),
            _ => None,
        })
        .collect();
    assert_eq!(delivered, ["a", "b"], "in the order they came");
    // A turn that brings the window's records to COMMIT_WINDOW_RECORDS closes it at its
    // end, however long the window.
    let (conn, _) = publishers[0];
    for i in 0..COMMIT_WINDOW_RECORDS {
        let packet_id = u16::try_from(i + 1).unwrap();
        engine.handle(ToEngine::Conn(ConnEvent::Bytes {
            conn,
            data: retained(&format!("c/{i}"), packet_id),
        }));
    }
    engine.flush().unwrap();
    assert!(
        engine
            .commit
            .due()
            .is_some_and(|at| at <= std::time::Instant::now())
    );
}
