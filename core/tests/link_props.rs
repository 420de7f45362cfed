//! Link frames: every frame round-trips, also when its bytes arrive split anywhere; arbitrary
//! bytes never panic the decoder and never make it allocate past the frame.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use meridian_core::codec::{Publish, PublishProperties, QoS};
use meridian_core::link::{
    self, Claim, ClaimUpdate, DigestEntry, Forward, Frame, LinkError, RetainedUpdate, SessionRelay,
    SessionTransfer,
};
use meridian_core::retained::{Hlc, Stamp};
use meridian_core::routes::{NodeId, Owner, RouteChange, RouteDelta, RouteOp, SnapshotChunk};
use proptest::prelude::*;

fn node() -> impl Strategy<Value = NodeId> {
    "[a-z0-9-]{1,12}".prop_map(|s| NodeId::new(&s).unwrap())
}

fn owner() -> impl Strategy<Value = Owner> {
    (node(), any::<u64>()).prop_map(|(node, incarnation)| Owner { node, incarnation })
}

fn filter() -> impl Strategy<Value = Arc<str>> {
    prop::collection::vec(
        prop_oneof!["[a-z]{1,5}", Just("+".to_string()), Just("".to_string())],
        1..4,
    )
    .prop_flat_map(|levels| {
        let base = levels.join("/");
        let base = if base.is_empty() {
            "x".to_string()
        } else {
            base
        };
        prop_oneof![
            Just(base.clone()),
            Just(format!("{base}/#")),
            Just("#".to_string())
        ]
    })
    .prop_map(Arc::from)
}

fn publish() -> impl Strategy<Value = Publish> {
    (
        "[a-z]{1,6}(/[a-z0-9]{1,6}){0,3}",
        prop::collection::vec(any::<u8>(), 0..64),
        0u8..3,
        any::<bool>(),
        prop::option::of(0u8..2),
        prop::option::of(any::<u32>()),
        prop::option::of("[a-z/]{1,10}"),
        prop::collection::vec(("[a-z]{0,4}", "[a-z]{0,4}"), 0..3),
    )
        .prop_map(
            |(topic, payload, qos, retain, pfi, expiry, content_type, user)| {
                let qos = QoS::from_u8(qos).unwrap();
                Publish {
                    dup: false,
                    qos,
                    retain,
                    topic,
                    packet_id: (qos != QoS::AtMostOnce).then_some(1),
                    payload: Bytes::from(payload),
                    properties: PublishProperties {
                        payload_format_indicator: pfi,
                        message_expiry_interval: expiry,
                        content_type,
                        correlation_data: Some(Bytes::from_static(b"c")),
                        user_properties: user,
                        ..Default::default()
                    },
                }
            },
        )
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        (node(), any::<u64>(), any::<u16>(), "[a-z0-9]{0,8}").prop_map(
            |(node, incarnation, protocol, region)| Frame::Hello {
                node,
                incarnation,
                protocol,
                certificate: (protocol % 2 == 1).then(|| Bytes::from(region.clone().into_bytes())),
                region,
            }
        ),
        (
            owner(),
            0u64..1_000_000,
            any::<u64>(),
            prop::collection::vec((any::<bool>(), filter()), 0..6)
        )
            .prop_map(|(owner, after, hash, changes)| {
                let changes = changes
                    .into_iter()
                    .enumerate()
                    .map(|(i, (add, filter))| RouteChange {
                        version: after + 1 + i as u64,
                        filter,
                        op: if add { RouteOp::Add } else { RouteOp::Remove },
                    })
                    .collect();
                Frame::RouteDelta(RouteDelta {
                    owner,
                    after,
                    changes,
                    hash,
                })
            }),
        (owner(), any::<u64>()).prop_map(|(owner, version)| Frame::RouteAck { owner, version }),
        prop::collection::vec((owner(), any::<u64>(), any::<u64>()), 0..4).prop_map(|v| {
            Frame::Digest(
                v.into_iter()
                    .map(|(owner, version, hash)| DigestEntry {
                        owner,
                        version,
                        hash,
                    })
                    .collect(),
            )
        }),
        Just(Frame::SnapshotRequest),
        (
            owner(),
            any::<u64>(),
            any::<u64>(),
            1u32..10,
            prop::collection::vec(filter(), 0..6)
        )
            .prop_flat_map(
                |(owner, version, hash, count, filters)| (0..count).prop_map(move |index| {
                    Frame::SnapshotChunk(SnapshotChunk {
                        owner: owner.clone(),
                        version,
                        hash,
                        index,
                        count,
                        filters: filters.clone(),
                    })
                })
            ),
        (owner(), any::<u64>(), publish()).prop_map(|(origin, seq, message)| Frame::Forward(
            Forward {
                origin,
                seq,
                message
            }
        )),
        (owner(), any::<u64>()).prop_map(|(origin, seq)| Frame::ForwardAck { origin, seq }),
        Just(Frame::KeepAlive),
        retained_update().prop_map(Frame::Retained),
        (any::<u64>(), any::<u64>())
            .prop_map(|(hash, entries)| Frame::RetainedDigest { hash, entries }),
        prop::collection::vec(retained_update(), 0..3).prop_map(Frame::RetainedSnapshot),
        (
            owner(),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..96))
        )
            .prop_map(|(o, signature)| Frame::Forget {
                node: o.node,
                incarnation: o.incarnation,
                signature: signature.map(Bytes::from),
            }),
        claim_update().prop_map(Frame::Claim),
        prop::collection::vec(claim_update(), 0..3).prop_map(Frame::ClaimSnapshot),
        (
            "[a-z0-9]{0,12}",
            stamp(),
            1u32..5,
            prop::option::of(claim_update()),
            prop::collection::vec(
                (
                    prop::collection::vec(any::<u8>(), 0..12),
                    prop::collection::vec(any::<u8>(), 0..24)
                ),
                0..4
            )
        )
            .prop_flat_map(|(client_id, claim, count, by, records)| {
                (0..count).prop_map(move |index| {
                    Frame::SessionTransfer(SessionTransfer {
                        client_id: client_id.clone(),
                        claim: claim.clone(),
                        shipment: Stamp {
                            hlc: Hlc {
                                wall_ms: claim.hlc.wall_ms ^ 1,
                                logical: index,
                            },
                            node: claim.node.clone(),
                        },
                        index,
                        count,
                        by: by.clone(),
                        records: records
                            .iter()
                            .map(|(k, v)| (Bytes::from(k.clone()), Bytes::from(v.clone())))
                            .collect(),
                    })
                })
            }),
        ("[a-z0-9]{0,12}", stamp(), stamp()).prop_map(|(client_id, claim, shipment)| {
            Frame::SessionTaken {
                client_id,
                claim,
                shipment,
            }
        }),
        (
            "[a-z0-9]{0,12}",
            stamp(),
            any::<u64>(),
            owner(),
            any::<u64>(),
            publish()
        )
            .prop_map(|(client_id, claim, n, origin, seq, message)| {
                Frame::SessionRelay(SessionRelay {
                    client_id,
                    claim,
                    n,
                    origin,
                    seq,
                    message,
                })
            }),
        ("[a-z0-9]{0,12}", stamp(), any::<u64>()).prop_map(|(client_id, claim, n)| {
            Frame::SessionRelayAck {
                client_id,
                claim,
                n,
            }
        }),
        ("[a-z0-9]{0,12}", stamp())
            .prop_map(|(client_id, claim)| Frame::SessionRouted { client_id, claim }),
        any::<u64>().prop_map(|token| Frame::Fence { token }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(token, incarnation, next)| {
            Frame::FenceEcho {
                token,
                incarnation,
                next,
            }
        }),
        (
            "[a-z0-9]{0,12}",
            prop::option::of("[a-z]{0,6}"),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..8)),
            any::<u64>()
        )
            .prop_map(|(client_id, user, proof, token)| Frame::ClaimRequest {
                client_id,
                user,
                proof: proof.map(Bytes::from),
                token
            }),
        (
            "[a-z0-9]{0,12}",
            any::<u64>(),
            any::<u8>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(
                |(client_id, token, reason, wall_ms, logical)| Frame::ClaimAnswer {
                    client_id,
                    token,
                    reason,
                    hlc: Hlc { wall_ms, logical },
                }
            ),
        ("[a-z0-9]{0,12}", any::<u64>())
            .prop_map(|(client_id, token)| Frame::Revoke { client_id, token }),
        ("[a-z0-9]{0,12}", any::<u64>())
            .prop_map(|(client_id, token)| Frame::Revoked { client_id, token }),
        prop::collection::vec("[a-z0-9/#+]{0,12}", 0..4)
            .prop_map(|filters| Frame::ScopedRoutes { filters }),
        ("[a-z0-9]{0,12}", stamp(), any::<u64>()).prop_map(|(client_id, claim, last)| {
            Frame::SessionRelayDone {
                client_id,
                claim,
                last,
            }
        }),
        ("[a-z0-9]{0,12}", stamp(), node()).prop_map(|(client_id, claim, node)| {
            Frame::SessionRelayCaughtUp {
                client_id,
                claim,
                node,
            }
        }),
    ]
}

fn stamp() -> impl Strategy<Value = Stamp> {
    (any::<u64>(), any::<u32>(), node()).prop_map(|(wall_ms, logical, node)| Stamp {
        hlc: Hlc { wall_ms, logical },
        node,
    })
}

fn claim_update() -> impl Strategy<Value = ClaimUpdate> {
    (
        "[a-z0-9/]{0,12}",
        stamp(),
        prop::option::of((
            prop::option::of("[a-z]{0,6}"),
            any::<bool>(),
            any::<bool>(),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..80)),
        )),
    )
        .prop_map(|(client_id, stamp, claim)| ClaimUpdate {
            client_id,
            stamp,
            claim: claim.map(|(user, resume, persistent, proof)| Claim {
                user,
                resume,
                persistent,
                proof: proof.map(Bytes::from),
            }),
        })
}

fn retained_update() -> impl Strategy<Value = RetainedUpdate> {
    (
        any::<u64>(),
        any::<u32>(),
        node(),
        prop::option::of(publish()),
    )
        .prop_map(|(wall_ms, logical, node, message)| {
            let message = message.map(|mut p| {
                p.retain = true;
                p
            });
            RetainedUpdate {
                topic: message
                    .as_ref()
                    .map_or_else(|| "gone/topic".to_owned(), |p| p.topic.clone()),
                stamp: Stamp {
                    hlc: Hlc { wall_ms, logical },
                    node,
                },
                message,
            }
        })
}

proptest! {
    #[test]
    fn every_frame_round_trips(f in frame()) {
        let mut buf = BytesMut::new();
        link::encode(&f, &mut buf).unwrap();
        prop_assert_eq!(link::encoded_len(&f).unwrap(), buf.len());
        let got = link::decode(&mut buf, link::DEFAULT_MAX_FRAME_LEN).unwrap();
        prop_assert_eq!(got, Some(f));
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn frames_split_at_every_position_decode_the_same(frames in prop::collection::vec(frame(), 1..4)) {
        let mut all = BytesMut::new();
        for f in &frames {
            link::encode(f, &mut all).unwrap();
        }
        let bytes = all.freeze();
        for cut in 0..=bytes.len() {
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for part in [&bytes[..cut], &bytes[cut..]] {
                buf.extend_from_slice(part);
                while let Some(f) = link::decode(&mut buf, link::DEFAULT_MAX_FRAME_LEN).unwrap() {
                    got.push(f);
                }
            }
            prop_assert_eq!(&got, &frames);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256), max in 0u32..512) {
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(_)) = link::decode(&mut buf, max) {}
    }

    #[test]
    fn corrupted_frames_are_refused_or_decoded_never_panic(f in frame(), at in any::<usize>(), byte in any::<u8>()) {
        let mut buf = BytesMut::new();
        link::encode(&f, &mut buf).unwrap();
        let i = at % buf.len();
        buf[i] = byte;
        let _ = link::decode(&mut buf, link::DEFAULT_MAX_FRAME_LEN);
    }
}

#[test]
fn oversized_frame_is_refused_before_its_body_arrives() {
    let mut buf = BytesMut::from(&[0x01, 0x00, 0x00, 0x00][..]);
    assert_eq!(
        link::decode(&mut buf, 1024),
        Err(LinkError::TooLarge {
            len: 0x0100_0000,
            max: 1024
        })
    );
}

#[test]
fn hostile_item_count_is_refused_without_allocating() {
    // A digest claiming 4 billion entries in a 5-byte body.
    let mut buf = BytesMut::from(&[0, 0, 0, 5, 4, 0xff, 0xff, 0xff, 0xff][..]);
    assert!(matches!(
        link::decode(&mut buf, 1024),
        Err(LinkError::Malformed {
            frame: "digest",
            ..
        })
    ));
}

#[test]
fn unknown_frame_type_is_refused() {
    let mut buf = BytesMut::from(&[0, 0, 0, 1, 200][..]);
    assert_eq!(
        link::decode(&mut buf, 1024),
        Err(LinkError::UnknownType(200))
    );
}
