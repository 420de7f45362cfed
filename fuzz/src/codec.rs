//! The codec checker: arbitrary bytes as a stream of frames in one protocol version.
//!
//! For an input it checks:
//! 1. every packet decoded re-encodes (same version) to bytes that decode to the same packet,
//!    re-encode to the same bytes, and whose length `encoded_len` predicts; a PUBLISH encodes
//!    the same through [`codec::encode_publish`];
//! 2. the same bytes delivered in two pieces, split at any of a few points the input chooses,
//!    decode to the same packets and end the same way (more bytes needed, or the same reason);
//! 3. a small `max_packet_size` cuts the stream at the first frame larger than it with
//!    `PACKET_TOO_LARGE` and changes nothing before it.

use bytes::BytesMut;
use meridian_core::codec::{self, OutgoingPublish, Packet, ProtocolVersion, ReasonCode};

use crate::trace;

/// How a stream of frames ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// `decode` asked for more bytes with this many buffered.
    NeedMore(usize),
    /// `decode` refused a frame with this reason.
    Error(ReasonCode),
}

/// Packets decoded from a stream, each with the number of bytes its frame took, and how the
/// stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub packets: Vec<(Packet, usize)>,
    pub end: End,
}

/// Decodes `chunks` as they would arrive from a socket: each chunk is appended to the buffer
/// and every complete packet decoded before the next one arrives. Stops at the first error.
pub fn decode_stream(chunks: &[&[u8]], version: ProtocolVersion, max: u32) -> Decoded {
    let mut buf = BytesMut::new();
    let mut packets = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            let before = buf.len();
            match codec::decode(&mut buf, version, max) {
                Ok(Some(p)) => {
                    let used = before - buf.len();
                    assert!(used > 0, "decode returned {p:?} without consuming a byte");
                    packets.push((p, used));
                }
                Ok(None) => {
                    assert_eq!(
                        buf.len(),
                        before,
                        "Ok(None) must leave the buffer untouched"
                    );
                    break;
                }
                Err(e) => {
                    return Decoded {
                        packets,
                        end: End::Error(e.reason),
                    };
                }
            }
        }
    }
    Decoded {
        end: End::NeedMore(buf.len()),
        packets,
    }
}

/// Encodes `packet`; checks `encoded_len`, and for PUBLISH `encode_publish` and `publish_len`.
/// `None` if the codec refuses to encode it.
pub fn encode_checked(packet: &Packet, version: ProtocolVersion) -> Option<BytesMut> {
    let mut out = BytesMut::from(&b"prefix"[..]);
    let result = codec::encode(packet, version, &mut out);
    let len = codec::encoded_len(packet, version);
    match (&result, &len) {
        (Ok(()), Ok(n)) => assert_eq!(
            *n,
            out.len() - 6,
            "encoded_len disagrees with encode for {packet:?}"
        ),
        (Err(a), Err(b)) => assert_eq!(a, b, "encode and encoded_len fail differently"),
        _ => panic!("encode {result:?} but encoded_len {len:?} for {packet:?}"),
    }
    if result.is_err() {
        assert_eq!(&out[..], b"prefix", "a failed encode appended bytes");
        return None;
    }
    let frame = out.split_off(6);
    assert_eq!(
        &out[..],
        b"prefix",
        "encode touched bytes already in the buffer"
    );
    if let Packet::Publish(p) = packet {
        let view = OutgoingPublish::from(p);
        let mut alt = BytesMut::new();
        codec::encode_publish(&view, version, &mut alt)
            .expect("encode_publish of a publish that encodes");
        assert_eq!(alt, frame, "encode_publish and encode differ for {p:?}");
        assert_eq!(codec::publish_len(&view, version), Ok(frame.len()));
    }
    Some(frame)
}

/// decode → encode → decode: the packet survives, and encoding is stable.
pub fn check_round_trip(packet: &Packet, version: ProtocolVersion) {
    let Some(frame) = encode_checked(packet, version) else {
        // Everything decoded must be encodable again in the same version.
        let err = codec::encode(packet, version, &mut BytesMut::new()).unwrap_err();
        panic!("decoded packet does not encode ({err}): {packet:?}");
    };
    let mut buf = frame.clone();
    let again = codec::decode(&mut buf, version, u32::MAX);
    assert_eq!(
        again.as_ref(),
        Ok(&Some(packet.clone())),
        "re-decoding the encoding of {packet:?} ({frame:02x?}) differs"
    );
    assert!(buf.is_empty(), "re-decode left {} bytes", buf.len());
    let second = encode_checked(packet, version).expect("encoded once already");
    assert_eq!(second, frame, "encoding is not deterministic");
}

/// Split points chosen by the input: one it picks with its first two bytes, the middle and one
/// byte before the end.
fn split_points(data: &[u8]) -> [usize; 3] {
    let n = data.len();
    let pick = match data {
        [a, b, ..] => (usize::from(*a) << 8 | usize::from(*b)) % (n + 1),
        _ => 0,
    };
    [pick, n / 2, n.saturating_sub(1)]
}

/// A packet-size limit chosen by the input's last byte: 2 ..= 512 bytes.
fn small_limit(data: &[u8]) -> u32 {
    2 + u32::from(data.last().copied().unwrap_or(0)) * 2
}

/// The whole check for one input (see the module docs).
pub fn check(data: &[u8], version: ProtocolVersion) {
    let whole = decode_stream(&[data], version, u32::MAX);
    trace!(
        "{version:?}: {} packet(s), then {:?}",
        whole.packets.len(),
        whole.end
    );
    for (packet, _) in &whole.packets {
        trace!("  {packet:?}");
        check_round_trip(packet, version);
    }

    for at in split_points(data) {
        let (a, b) = data.split_at(at);
        let split = decode_stream(&[a, b], version, u32::MAX);
        assert_eq!(
            split,
            whole,
            "split at {at} of {} decodes differently",
            data.len()
        );
    }

    let limit = small_limit(data);
    let limited = decode_stream(&[data], version, limit);
    for (i, (packet, used)) in whole.packets.iter().enumerate() {
        if *used > limit as usize {
            assert_eq!(
                limited.packets.len(),
                i,
                "limit {limit}: frame {i} of {used} bytes must be refused"
            );
            assert_eq!(limited.end, End::Error(ReasonCode::PACKET_TOO_LARGE));
            return;
        }
        assert_eq!(
            limited.packets.get(i),
            Some(&(packet.clone(), *used)),
            "limit {limit}: frame {i} of {used} bytes decodes differently"
        );
    }
    assert_eq!(limited.packets.len(), whole.packets.len());
    // Where the unlimited stream stopped, the limited one may instead have refused a frame
    // whose header announced more than the limit.
    assert!(
        limited.end == whole.end || limited.end == End::Error(ReasonCode::PACKET_TOO_LARGE),
        "limit {limit}: ends {:?}, unlimited ends {:?}",
        limited.end,
        whole.end
    );
}
