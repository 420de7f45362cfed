//! Frames as bytes on a link: a frame encoded once ([`EncodedFrame`]), and the one reader of
//! frames from bytes that every shell uses ([`FrameReader`] for a byte stream,
//! [`decode_message`] for a transport that keeps messages whole).

use std::fmt;

use bytes::{Bytes, BytesMut};

use super::codec::{decode, encode};
use super::{Forward, Frame, FrameKind, LinkError};

/// A frame encoded once, as it goes on the wire (length prefix included). The broker's
/// [`Output::ToPeer`](crate::Output::ToPeer) and [`Output::Broadcast`](crate::Output::Broadcast)
/// carry one, so that a shell writes its bytes as they are: no shell encodes a frame, or
/// walks one for its length, again. A QoS 1/2 forward's bytes are also its outbox record's
/// value.
#[derive(Clone, PartialEq, Eq)]
pub struct EncodedFrame {
    kind: FrameKind,
    bytes: Bytes,
}

impl EncodedFrame {
    /// `frame`, encoded.
    pub fn encode(frame: &Frame) -> Result<Self, LinkError> {
        let mut out = BytesMut::new();
        encode(frame, &mut out)?;
        Ok(Self {
            kind: frame.kind(),
            bytes: out.freeze(),
        })
    }

    /// What kind of frame it is.
    pub fn kind(&self) -> FrameKind {
        self.kind
    }

    /// The bytes to write.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// The bytes to write, taken.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// Its length in bytes, length prefix included.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Never: a frame is at least its length prefix and type byte.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The frame it encodes (for simulators, tests and logs: a shell writes the bytes).
    pub fn decode(&self) -> Result<Frame, LinkError> {
        let mut buf = BytesMut::from(&self.bytes[..]);
        match decode(&mut buf, u32::MAX)? {
            Some(frame) if buf.is_empty() => Ok(frame),
            _ => Err(LinkError::Malformed {
                frame: self.kind.name(),
                detail: "not one whole frame",
            }),
        }
    }

    /// This forward with another sequence number: the same bytes but the number's, so that
    /// one encoding serves every peer a message goes to.
    pub(crate) fn with_forward_seq(&self, forward: &Forward, seq: u64) -> Self {
        // Length (4), type (1), the origin's node id (2 + its length) and incarnation (8).
        let at = 4 + 1 + 2 + forward.origin.node.as_str().len() + 8;
        let mut bytes = BytesMut::from(&self.bytes[..]);
        if let Some(field) = bytes.get_mut(at..at + 8) {
            field.copy_from_slice(&seq.to_be_bytes());
        }
        Self {
            kind: self.kind,
            bytes: bytes.freeze(),
        }
    }

    /// A frame read back from storage, as it was encoded.
    pub(crate) fn from_stored(kind: FrameKind, bytes: Bytes) -> Self {
        Self { kind, bytes }
    }
}

impl fmt::Debug for EncodedFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "EncodedFrame({}, {} bytes)",
            self.kind.name(),
            self.len()
        )
    }
}

/// The frames of a byte stream (a link session's), read as its bytes come in whatever
/// pieces. Every frame is checked against the largest length taken before its body is
/// awaited, so a peer makes the reader hold at most that much.
#[derive(Debug)]
pub struct FrameReader {
    buf: BytesMut,
    max_len: u32,
}

impl FrameReader {
    /// A reader that refuses frames longer than `max_len` bytes (after the length prefix).
    pub fn new(max_len: u32) -> Self {
        Self {
            buf: BytesMut::new(),
            max_len,
        }
    }

    /// Every whole frame that `data` completes, in order, and, if the stream then carries
    /// something that is not a frame, why: feed the frames, then end the link.
    pub fn read(&mut self, data: &[u8]) -> StreamRead {
        self.buf.extend_from_slice(data);
        let mut frames = Vec::new();
        let error = loop {
            match decode(&mut self.buf, self.max_len) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        if self.buf.is_empty() && self.buf.capacity() > 64 * 1024 {
            // A large frame's room is given back once it is read.
            self.buf = BytesMut::new();
        }
        StreamRead { frames, error }
    }

    /// Bytes held of a frame not yet whole.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

/// What one read of a link's byte stream gave ([`FrameReader::read`]).
#[derive(Debug, Default)]
pub struct StreamRead {
    /// The whole frames the read completed, in order.
    pub frames: Vec<Frame>,
    /// Set when the stream then carried something that is not a frame: the link is unusable.
    pub error: Option<LinkError>,
}

/// The frames of one message of a transport that keeps messages whole (a WebSocket message,
/// a gossip message): every byte must belong to a whole frame.
pub fn decode_message(data: &[u8], max_len: u32) -> Result<Vec<Frame>, LinkError> {
    let mut buf = BytesMut::from(data);
    let mut frames = Vec::new();
    while let Some(frame) = decode(&mut buf, max_len)? {
        frames.push(frame);
    }
    if buf.is_empty() {
        Ok(frames)
    } else {
        Err(LinkError::Malformed {
            frame: "any",
            detail: "a partial frame at the end of a message",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Publish, QoS};
    use crate::routes::{NodeId, Owner};

    fn forward(seq: u64) -> Forward {
        Forward {
            origin: Owner {
                node: NodeId::new("origin-node").unwrap(),
                incarnation: 3,
            },
            seq,
            message: Publish {
                dup: false,
                qos: QoS::AtLeastOnce,
                retain: false,
                topic: "a/b".into(),
                packet_id: Some(1),
                payload: Bytes::from_static(b"payload"),
                properties: Default::default(),
            },
        }
    }

    #[test]
    fn a_forward_renumbered_is_the_forward_encoded_with_that_number() {
        let f = forward(7);
        let once = EncodedFrame::encode(&Frame::Forward(f.clone())).unwrap();
        let renumbered = once.with_forward_seq(&f, 42);
        let expected = EncodedFrame::encode(&Frame::Forward(forward(42))).unwrap();
        assert_eq!(renumbered, expected);
        assert_eq!(renumbered.decode().unwrap(), Frame::Forward(forward(42)));
        assert_eq!(once.kind(), FrameKind::Forward);
        assert_eq!(
            once.len(),
            super::super::encoded_len(&Frame::Forward(f)).unwrap()
        );
    }

    #[test]
    fn a_stream_is_read_in_any_pieces_and_a_message_must_hold_whole_frames() {
        let frames = [
            Frame::Forward(forward(1)),
            Frame::KeepAlive,
            Frame::Forward(forward(2)),
        ];
        let mut stream = BytesMut::new();
        for f in &frames {
            encode(f, &mut stream).unwrap();
        }
        for cut in 0..stream.len() {
            let mut reader = FrameReader::new(1024);
            let first = reader.read(&stream[..cut]);
            let second = reader.read(&stream[cut..]);
            assert!(first.error.is_none() && second.error.is_none());
            let got: Vec<Frame> = first.frames.into_iter().chain(second.frames).collect();
            assert_eq!(got, frames, "cut at {cut}");
            assert_eq!(reader.buffered(), 0);
        }
        assert_eq!(decode_message(&stream, 1024).unwrap(), frames);
        assert!(decode_message(&stream[..stream.len() - 1], 1024).is_err());
        // A frame too long for the reader ends the stream; those before it are read.
        let mut small = FrameReader::new(8);
        let mut keep_alive = BytesMut::new();
        encode(&Frame::KeepAlive, &mut keep_alive).unwrap();
        keep_alive.extend_from_slice(&stream);
        let read = small.read(&keep_alive);
        assert_eq!(read.frames, [Frame::KeepAlive]);
        assert!(matches!(read.error, Some(LinkError::TooLarge { .. })));
    }
}
