//! MQTT 3.1.1 and 5.0 wire format: every control packet, both directions.
//!
//! Sans-IO: [`decode`] takes bytes the caller has read and [`encode`] appends to a buffer the
//! caller writes out. Decoding is strict (MQTT 5.0 §1.5, §2, §3): anything malformed is an error
//! carrying the reason code to answer with, never a panic. One file per packet family:
//! the fixed header, the primitives of §1.5, the properties of §2.2.2, then the packets.
//!
//! ```
//! use bytes::BytesMut;
//! use meridian_core::codec::{self, Ack, Packet, ProtocolVersion};
//!
//! let mut wire = BytesMut::new();
//! codec::encode(&Packet::PubAck(Ack::new(7)), ProtocolVersion::V5, &mut wire).unwrap();
//! assert_eq!(&wire[..], [0x40, 2, 0, 7]);
//!
//! // A partial frame: nothing is consumed until the whole packet is there.
//! let mut rx = BytesMut::from(&wire[..3]);
//! assert_eq!(codec::decode(&mut rx, ProtocolVersion::V5, 1024), Ok(None));
//! rx.extend_from_slice(&wire[3..]);
//! let packet = codec::decode(&mut rx, ProtocolVersion::V5, 1024).unwrap();
//! assert_eq!(packet, Some(Packet::PubAck(Ack::new(7))));
//! assert!(rx.is_empty());
//! ```

mod ack;
mod auth;
mod connack;
mod connect;
mod disconnect;
mod error;
mod fixed_header;
mod packet;
mod primitives;
mod properties;
mod publish;
mod reason;
mod subscribe;
mod unsubscribe;

use bytes::{Buf, Bytes, BytesMut};

pub use error::{DecodeError, EncodeError};
pub use packet::*;
pub use primitives::VAR_INT_MAX as MAX_REMAINING_LENGTH;
pub use publish::OutgoingPublish;
pub use reason::ReasonCode;

use ack::AckKind;
use fixed_header::{FixedHeader, PacketType};
use primitives::{Counter, Sink, SliceWriter, put_var_int, var_int_len, var_int_value};

/// Decodes one packet from the front of `buf`.
///
/// - `Ok(None)`: more bytes are needed; `buf` is untouched.
/// - `Ok(Some(packet))`: the packet's bytes were removed from `buf`. Payloads and binary
///   properties are slices of that frame (no copy).
/// - `Err(e)`: the connection must be closed with `e.reason`. If the frame was complete its bytes
///   have been removed; `buf` is of no further use either way.
///
/// `version` says how to read every packet but CONNECT, which is recognised whatever `version`
/// says: its protocol name and level select the version (level 4 is 3.1.1, level 5 is 5.0;
/// anything else, MQTT 3.1's "MQIsdp" included, is `UNSUPPORTED_PROTOCOL_VERSION`).
///
/// `max_packet_size` bounds the whole packet, fixed header included. It is checked as soon as
/// the fixed header is readable, before the rest is waited for: `PACKET_TOO_LARGE`.
pub fn decode(
    buf: &mut BytesMut,
    version: ProtocolVersion,
    max_packet_size: u32,
) -> Result<Option<Packet>, DecodeError> {
    let Some(header) = fixed_header::parse(buf, version)? else {
        return Ok(None);
    };
    let frame_len = header.frame_len();
    if frame_len > usize::try_from(max_packet_size).unwrap_or(usize::MAX) {
        return Err(DecodeError::new(
            ReasonCode::PACKET_TOO_LARGE,
            "packet larger than the maximum packet size",
        ));
    }
    if buf.len() < frame_len {
        return Ok(None);
    }
    let mut body = buf.split_to(frame_len).freeze();
    body.advance(header.header_len);
    let packet = decode_body(&header, &mut body, version)?;
    if !body.is_empty() {
        return Err(DecodeError::malformed(
            "bytes left over after the packet's content",
        ));
    }
    Ok(Some(packet))
}

fn decode_body(
    header: &FixedHeader,
    body: &mut Bytes,
    version: ProtocolVersion,
) -> Result<Packet, DecodeError> {
    Ok(match header.kind {
        PacketType::Connect => Packet::Connect(connect::decode(body)?),
        PacketType::ConnAck => Packet::ConnAck(connack::decode(body, version)?),
        PacketType::Publish => Packet::Publish(publish::decode(header.flags, body, version)?),
        PacketType::PubAck => Packet::PubAck(ack::decode(AckKind::Ack, body, version)?),
        PacketType::PubRec => Packet::PubRec(ack::decode(AckKind::Rec, body, version)?),
        PacketType::PubRel => Packet::PubRel(ack::decode(AckKind::Rel, body, version)?),
        PacketType::PubComp => Packet::PubComp(ack::decode(AckKind::Comp, body, version)?),
        PacketType::Subscribe => Packet::Subscribe(subscribe::decode_subscribe(body, version)?),
        PacketType::SubAck => Packet::SubAck(subscribe::decode_suback(body, version)?),
        PacketType::Unsubscribe => {
            Packet::Unsubscribe(unsubscribe::decode_unsubscribe(body, version)?)
        }
        PacketType::UnsubAck => Packet::UnsubAck(unsubscribe::decode_unsuback(body, version)?),
        // Their bodies are empty: anything there is refused as leftover bytes.
        PacketType::PingReq => Packet::PingReq,
        PacketType::PingResp => Packet::PingResp,
        PacketType::Disconnect => Packet::Disconnect(disconnect::decode(body, version)?),
        PacketType::Auth => Packet::Auth(auth::decode(body)?),
    })
}

/// A packet body the encoder can write: a [`Packet`] or an [`OutgoingPublish`].
trait Body {
    fn first_byte(&self) -> u8;
    fn write<S: Sink>(&self, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError>;
}

impl Body for OutgoingPublish<'_> {
    fn first_byte(&self) -> u8 {
        OutgoingPublish::first_byte(self)
    }
    fn write<S: Sink>(&self, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
        OutgoingPublish::write(self, version, s)
    }
}

impl Body for Packet {
    fn first_byte(&self) -> u8 {
        let kind = match self {
            Packet::Publish(p) => return OutgoingPublish::from(p).first_byte(),
            Packet::Connect(_) => PacketType::Connect,
            Packet::ConnAck(_) => PacketType::ConnAck,
            Packet::PubAck(_) => PacketType::PubAck,
            Packet::PubRec(_) => PacketType::PubRec,
            Packet::PubRel(_) => PacketType::PubRel,
            Packet::PubComp(_) => PacketType::PubComp,
            Packet::Subscribe(_) => PacketType::Subscribe,
            Packet::SubAck(_) => PacketType::SubAck,
            Packet::Unsubscribe(_) => PacketType::Unsubscribe,
            Packet::UnsubAck(_) => PacketType::UnsubAck,
            Packet::PingReq => PacketType::PingReq,
            Packet::PingResp => PacketType::PingResp,
            Packet::Disconnect(_) => PacketType::Disconnect,
            Packet::Auth(_) => PacketType::Auth,
        };
        kind.first_byte(kind.required_flags())
    }

    fn write<S: Sink>(&self, version: ProtocolVersion, s: &mut S) -> Result<(), EncodeError> {
        match self {
            Packet::Connect(c) => connect::write(c, s),
            Packet::ConnAck(c) => connack::write(c, version, s),
            Packet::Publish(p) => OutgoingPublish::from(p).write(version, s),
            Packet::PubAck(a) => ack::write(AckKind::Ack, a, version, s),
            Packet::PubRec(a) => ack::write(AckKind::Rec, a, version, s),
            Packet::PubRel(a) => ack::write(AckKind::Rel, a, version, s),
            Packet::PubComp(a) => ack::write(AckKind::Comp, a, version, s),
            Packet::Subscribe(sub) => subscribe::write_subscribe(sub, version, s),
            Packet::SubAck(a) => subscribe::write_suback(a, version, s),
            Packet::Unsubscribe(u) => unsubscribe::write_unsubscribe(u, version, s),
            Packet::UnsubAck(a) => unsubscribe::write_unsuback(a, version, s),
            Packet::PingReq | Packet::PingResp => Ok(()),
            Packet::Disconnect(d) => disconnect::write(d, version, s),
            Packet::Auth(a) => auth::write(a, version, s),
        }
    }
}

/// Validates `body` and returns its remaining length and the whole frame's length.
fn measure<B: Body>(body: &B, version: ProtocolVersion) -> Result<(u32, usize), EncodeError> {
    let mut counter = Counter(0);
    body.write(version, &mut counter)?;
    let remaining = var_int_value(counter.0)?;
    Ok((remaining, 1 + var_int_len(remaining) + counter.0))
}

fn encode_body<B: Body>(
    body: &B,
    version: ProtocolVersion,
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    let (remaining, frame_len) = measure(body, version)?;
    let start = out.len();
    out.resize(start + frame_len, 0);
    let (_, frame) = out.split_at_mut(start);
    let mut w = SliceWriter::new(frame);
    w.put_u8(body.first_byte());
    put_var_int(&mut w, remaining);
    let written = body.write(version, &mut w);
    let full = w.is_full();
    match written {
        Ok(()) if full => Ok(()),
        // Not expected: `measure` ran the same code. Leave `out` as it was all the same.
        result => {
            out.truncate(start);
            debug_assert!(
                result.is_err(),
                "encoded length differs from the measured one"
            );
            result.and(Err(EncodeError::LengthMismatch))
        }
    }
}

/// Appends the encoded packet to `out`. On error nothing is appended.
///
/// MQTT 5.0-only fields (properties, most reason codes) are not written for
/// [`ProtocolVersion::V311`]; a CONNACK's reason becomes a 3.1.1 return code with
/// [`ReasonCode::to_v3_connack`] and a SUBACK's failures become `0x80`. AUTH cannot be encoded
/// for 3.1.1. A CONNECT is written in its own `protocol` version, whatever `version` says.
pub fn encode(
    packet: &Packet,
    version: ProtocolVersion,
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    encode_body(packet, version, out)
}

/// The total encoded size of `packet` in bytes (fixed header included), without encoding it.
pub fn encoded_len(packet: &Packet, version: ProtocolVersion) -> Result<usize, EncodeError> {
    measure(packet, version).map(|(_, len)| len)
}

/// Appends a PUBLISH built from borrowed, per-subscriber parts to `out` (see
/// [`OutgoingPublish`]). On error nothing is appended.
pub fn encode_publish(
    p: &OutgoingPublish<'_>,
    version: ProtocolVersion,
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    encode_body(p, version, out)
}

/// The total encoded size of `p` in bytes (fixed header included), without encoding it.
pub fn publish_len(
    p: &OutgoingPublish<'_>,
    version: ProtocolVersion,
) -> Result<usize, EncodeError> {
    measure(p, version).map(|(_, len)| len)
}

#[cfg(test)]
pub(crate) mod test_util {
    use super::*;

    /// Decodes `bytes`, which must be exactly one whole frame.
    pub(crate) fn decode_one(
        bytes: &[u8],
        version: ProtocolVersion,
    ) -> Result<Packet, DecodeError> {
        let mut buf = BytesMut::from(bytes);
        let packet = decode(&mut buf, version, u32::MAX)?;
        assert!(buf.is_empty(), "decode left {} bytes", buf.len());
        Ok(packet.expect("test frame is complete"))
    }

    pub(crate) fn encode_vec(packet: &Packet, version: ProtocolVersion) -> Vec<u8> {
        let mut buf = BytesMut::new();
        encode(packet, version, &mut buf).expect("test packet encodes");
        assert_eq!(encoded_len(packet, version), Ok(buf.len()));
        buf.to_vec()
    }

    pub(crate) fn round_trip(packet: &Packet, version: ProtocolVersion) {
        assert_eq!(
            decode_one(&encode_vec(packet, version), version).as_ref(),
            Ok(packet)
        );
    }

    #[track_caller]
    pub(crate) fn assert_error(bytes: &[u8], version: ProtocolVersion, reason: ReasonCode) {
        let mut buf = BytesMut::from(bytes);
        match decode(&mut buf, version, u32::MAX) {
            Err(e) => assert_eq!(e.reason, reason, "{e}"),
            other => panic!("expected {reason}, got {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::{assert_error, decode_one, encode_vec};
    use super::*;

    #[test]
    fn ping_bytes() {
        for version in [ProtocolVersion::V311, ProtocolVersion::V5] {
            assert_eq!(encode_vec(&Packet::PingReq, version), [0xC0, 0]);
            assert_eq!(encode_vec(&Packet::PingResp, version), [0xD0, 0]);
            assert_eq!(decode_one(&[0xC0, 0], version), Ok(Packet::PingReq));
            assert_eq!(decode_one(&[0xD0, 0], version), Ok(Packet::PingResp));
        }
    }

    #[test]
    fn ping_with_payload_is_malformed() {
        assert_error(
            &[0xC0, 1, 0],
            ProtocolVersion::V5,
            ReasonCode::MALFORMED_PACKET,
        );
        assert_error(
            &[0xD0, 1, 0],
            ProtocolVersion::V311,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn packet_too_large_refused_before_body_arrives() {
        // A PUBLISH announcing 200 bytes of body, of which none has arrived yet.
        let mut buf = BytesMut::from(&[0x30, 0xC8, 0x01][..]);
        let err = decode(&mut buf, ProtocolVersion::V5, 100).unwrap_err();
        assert_eq!(err.reason, ReasonCode::PACKET_TOO_LARGE);
        // The limit covers the fixed header too: 3 + 200 bytes.
        let mut buf = BytesMut::from(&[0x30, 0xC8, 0x01][..]);
        assert_eq!(decode(&mut buf, ProtocolVersion::V5, 203), Ok(None));
        let mut buf = BytesMut::from(&[0x30, 0xC8, 0x01][..]);
        assert!(decode(&mut buf, ProtocolVersion::V5, 202).is_err());
    }

    #[test]
    fn need_more_bytes_leaves_buffer_untouched() {
        let mut buf = BytesMut::from(&[0x30, 5, 0, 1][..]);
        assert_eq!(decode(&mut buf, ProtocolVersion::V311, 1024), Ok(None));
        assert_eq!(&buf[..], [0x30, 5, 0, 1]);
    }

    #[test]
    fn content_shorter_than_declared_is_malformed() {
        // PUBACK with a remaining length of 1 cannot hold its packet identifier.
        assert_error(
            &[0x40, 1, 0],
            ProtocolVersion::V311,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn leftover_bytes_are_malformed() {
        assert_error(
            &[0x40, 3, 0, 1, 0],
            ProtocolVersion::V311,
            ReasonCode::MALFORMED_PACKET,
        );
        assert_error(
            &[0xE0, 1, 0],
            ProtocolVersion::V311,
            ReasonCode::MALFORMED_PACKET,
        );
    }

    #[test]
    fn decode_consumes_one_packet_at_a_time() {
        let mut buf = BytesMut::from(&[0xC0, 0, 0xD0, 0, 0x40][..]);
        let v = ProtocolVersion::V311;
        assert_eq!(decode(&mut buf, v, 1024), Ok(Some(Packet::PingReq)));
        assert_eq!(decode(&mut buf, v, 1024), Ok(Some(Packet::PingResp)));
        assert_eq!(decode(&mut buf, v, 1024), Ok(None));
        assert_eq!(&buf[..], [0x40]);
    }

    #[test]
    fn packet_larger_than_remaining_length_limit_is_encode_error() {
        let payload = Bytes::from(vec![0u8; MAX_REMAINING_LENGTH as usize]);
        let p = Packet::Publish(Publish {
            dup: false,
            qos: QoS::AtMostOnce,
            retain: false,
            topic: "t".into(),
            packet_id: None,
            payload,
            properties: Default::default(),
        });
        assert!(matches!(
            encoded_len(&p, ProtocolVersion::V311),
            Err(EncodeError::PacketTooLarge { .. })
        ));
        let mut out = BytesMut::from(&b"keep"[..]);
        assert!(encode(&p, ProtocolVersion::V311, &mut out).is_err());
        assert_eq!(&out[..], b"keep");
    }

    #[test]
    fn largest_remaining_length_is_accepted() {
        let mut buf = BytesMut::from(&[0x30, 0xFF, 0xFF, 0xFF, 0x7F][..]);
        assert_eq!(decode(&mut buf, ProtocolVersion::V5, u32::MAX), Ok(None));
    }
}
