//! The link frame checker: arbitrary bytes as a stream of link frames (`meridian_core::link`).
//!
//! For an input it checks:
//! 1. decoding never panics; `Ok(None)` leaves the buffer untouched and a decoded frame takes
//!    exactly the bytes its length prefix announced;
//! 2. every decoded frame re-encodes to bytes that decode to the same frame, `encoded_len`
//!    agrees, encoding is deterministic and appends without touching what is already in the
//!    buffer; frames other than `Forward` (which embeds an MQTT PUBLISH, whose property order
//!    is free) re-encode to exactly the bytes they were decoded from;
//! 3. the stream delivered one byte at a time, and in two pieces split at any of a few points
//!    the input chooses, decodes to the same frames and ends the same way;
//! 4. with a small frame-size limit (chosen by the input's last byte) the first frame whose
//!    declared length is over it is refused with `TooLarge` as soon as its 4-byte length has
//!    arrived, before its body, and nothing before it changes.

use bytes::BytesMut;
use meridian_core::link::{self, DEFAULT_MAX_FRAME_LEN, Frame, LinkError};

use crate::trace;

/// How a stream of frames ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// `decode` asked for more bytes with this many buffered.
    NeedMore(usize),
    /// `decode` refused a frame.
    Error(LinkError),
}

/// Frames decoded from a stream, each with the bytes it took, and how the stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub frames: Vec<(Frame, usize)>,
    pub end: End,
}

/// Decodes `chunks` as they would arrive from a link: each chunk is appended and every
/// complete frame decoded before the next one arrives. Stops at the first error.
pub fn decode_stream<'a>(chunks: impl IntoIterator<Item = &'a [u8]>, max: u32) -> Decoded {
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            let before = buf.len();
            match link::decode(&mut buf, max) {
                Ok(Some(frame)) => {
                    let used = before - buf.len();
                    assert!(used >= 5, "{frame:?} decoded from {used} bytes");
                    frames.push((frame, used));
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
                        frames,
                        end: End::Error(e),
                    };
                }
            }
        }
    }
    Decoded {
        end: End::NeedMore(buf.len()),
        frames,
    }
}

/// The length a frame's 4-byte prefix announces (not counting the prefix).
fn declared_len(frame: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(frame.get(..4)?.try_into().ok()?))
}

/// decode → encode → decode: the frame survives; encoding is exact and stable.
pub fn check_round_trip(frame: &Frame, original: &[u8]) {
    let mut out = BytesMut::from(&b"prefix"[..]);
    link::encode(frame, &mut out)
        .unwrap_or_else(|e| panic!("decoded frame does not encode ({e}): {frame:?}"));
    let bytes = out.split_off(6);
    assert_eq!(
        &out[..],
        b"prefix",
        "encode touched bytes already in the buffer"
    );
    assert_eq!(
        link::encoded_len(frame),
        Ok(bytes.len()),
        "encoded_len disagrees with encode for {frame:?}"
    );
    assert_eq!(
        declared_len(&bytes).map(|n| n as usize + 4),
        Some(bytes.len()),
        "the length prefix of {frame:?} is not the frame's length"
    );
    if !matches!(frame, Frame::Forward(_)) {
        assert_eq!(
            &bytes[..],
            original,
            "{frame:?} re-encodes to other bytes than it was decoded from"
        );
    }
    let mut buf = bytes.clone();
    let again = link::decode(&mut buf, DEFAULT_MAX_FRAME_LEN);
    assert_eq!(
        again.as_ref(),
        Ok(&Some(frame.clone())),
        "re-decoding the encoding of {frame:?} ({bytes:02x?}) differs"
    );
    assert!(buf.is_empty(), "re-decode left {} bytes", buf.len());
    let mut second = BytesMut::new();
    link::encode(frame, &mut second).expect("encoded once already");
    assert_eq!(second, bytes, "encoding is not deterministic");
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

/// A frame-size limit chosen by the input's last byte: 0 ..= 510 bytes.
fn small_limit(data: &[u8]) -> u32 {
    u32::from(data.last().copied().unwrap_or(0)) * 2
}

/// The whole check for one input (see the module docs).
pub fn check(data: &[u8]) {
    let whole = decode_stream([data], DEFAULT_MAX_FRAME_LEN);
    trace!("{} frame(s), then {:?}", whole.frames.len(), whole.end);
    let mut at = 0;
    for (frame, used) in &whole.frames {
        trace!("  {frame:?}");
        check_round_trip(frame, &data[at..at + used]);
        at += used;
    }

    let bytewise = decode_stream(data.chunks(1), DEFAULT_MAX_FRAME_LEN);
    assert_eq!(bytewise, whole, "one byte at a time decodes differently");
    for cut in split_points(data) {
        let (a, b) = data.split_at(cut);
        let split = decode_stream([a, b], DEFAULT_MAX_FRAME_LEN);
        assert_eq!(
            split,
            whole,
            "split at {cut} of {} decodes differently",
            data.len()
        );
    }

    // A small limit: frames up to it decode as before, the first over it is refused as soon as
    // its length prefix is there (one byte at a time, so before any of its body).
    let limit = small_limit(data);
    let limited = decode_stream(data.chunks(1), limit);
    trace!(
        "limit {limit}: {} frame(s), then {:?}",
        limited.frames.len(),
        limited.end
    );
    let mut at = 0;
    for (i, (frame, used)) in whole.frames.iter().enumerate() {
        let len = (*used - 4) as u32;
        if len > limit {
            assert_eq!(
                limited.frames.len(),
                i,
                "limit {limit}: frame {i} of {len} bytes must be refused"
            );
            assert_eq!(
                limited.end,
                End::Error(LinkError::TooLarge { len, max: limit }),
                "limit {limit}: frame {i}"
            );
            return;
        }
        assert_eq!(
            limited.frames.get(i),
            Some(&(frame.clone(), *used)),
            "limit {limit}: frame {i} of {len} bytes decodes differently"
        );
        at += used;
    }
    assert_eq!(limited.frames.len(), whole.frames.len());
    // Where the unlimited stream stopped: a frame whose prefix announces more than the limit
    // is refused (whatever its body), anything else ends the same way.
    match declared_len(&data[at..]) {
        Some(len) if len > limit => assert_eq!(
            limited.end,
            End::Error(LinkError::TooLarge { len, max: limit }),
            "limit {limit}: the frame at byte {at} announces {len} bytes"
        ),
        _ => assert_eq!(limited.end, whole.end, "limit {limit}: ends differently"),
    }
}
