//! Frame encoding and strict decoding.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::{
    Claim, ClaimUpdate, DigestEntry, Forward, Frame, FrameKind, RetainedUpdate, SessionRelay,
    SessionTransfer,
};
use crate::codec::{self as mqtt, Packet, ProtocolVersion};
use crate::read::Fields;
use crate::retained::{Hlc, Stamp};
use crate::routes::{Owner, RouteChange, RouteDelta, RouteOp, SnapshotChunk};
use crate::topic::{Limits, TopicFilter, TopicName};

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// A frame longer than the receiver accepts.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The frame's announced length in bytes (after the 4-byte length).
        len: u32,
        /// The limit in bytes.
        max: u32,
    },
    /// A frame whose body does not follow its type's layout.
    #[error("malformed {frame} frame: {detail}")]
    Malformed {
        /// The frame kind's name (`any` when not even the type byte is there).
        frame: &'static str,
        /// What was wrong.
        detail: &'static str,
    },
    /// A type byte no [`FrameKind`] has.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// A frame that cannot be encoded (a string over 65,535 bytes, say): a bug on the sending side.
    #[error("cannot encode: {0}")]
    Encode(&'static str),
}

/// Decode one frame from the front of `buf`: `Ok(None)` until a whole frame is there (then
/// `buf` is untouched). The length is checked against `max_len` before the body is awaited.
pub fn decode(buf: &mut BytesMut, max_len: u32) -> Result<Option<Frame>, LinkError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len > max_len {
        return Err(LinkError::TooLarge { len, max: max_len });
    }
    let total = 4 + len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let mut frame = buf.split_to(total).freeze();
    frame.advance(4);
    if frame.is_empty() {
        return Err(LinkError::Malformed {
            frame: "any",
            detail: "empty frame",
        });
    }
    let byte = frame.get_u8();
    let kind = FrameKind::from_byte(byte).ok_or(LinkError::UnknownType(byte))?;
    let mut r = Reader {
        buf: frame,
        frame: kind.name(),
    };
    let out = match kind {
        FrameKind::Hello => Frame::Hello {
            node: r.node()?,
            incarnation: r.u64()?,
            protocol: r.u16()?,
            region: r.string()?,
            certificate: match r.u8()? {
                0 => None,
                1 => Some(r.bytes()?),
                _ => return Err(r.bad("bad certificate flag")),
            },
        },
        FrameKind::RouteDelta => Frame::RouteDelta(r.delta()?),
        FrameKind::RouteAck => Frame::RouteAck {
            owner: r.owner()?,
            version: r.u64()?,
        },
        FrameKind::Digest => {
            let n = r.count(8 + 8 + 8)?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push(DigestEntry {
                    owner: r.owner()?,
                    version: r.u64()?,
                    hash: r.u64()?,
                });
            }
            Frame::Digest(entries)
        }
        FrameKind::SnapshotRequest => Frame::SnapshotRequest,
        FrameKind::SnapshotChunk => {
            let owner = r.owner()?;
            let version = r.u64()?;
            let hash = r.u64()?;
            let index = r.u32()?;
            let count = r.u32()?;
            if index >= count {
                return Err(r.bad("chunk index beyond count"));
            }
            let n = r.count(2)?;
            let mut filters = Vec::with_capacity(n);
            for _ in 0..n {
                filters.push(r.filter()?);
            }
            Frame::SnapshotChunk(SnapshotChunk {
                owner,
                version,
                hash,
                index,
                count,
                filters,
            })
        }
        FrameKind::Forward => Frame::Forward(Forward {
            origin: r.owner()?,
            seq: r.u64()?,
            message: r.publish()?,
        }),
        FrameKind::ForwardAck => Frame::ForwardAck {
            origin: r.owner()?,
            seq: r.u64()?,
        },
        FrameKind::KeepAlive => Frame::KeepAlive,
        FrameKind::Retained => Frame::Retained(r.retained()?),
        FrameKind::RetainedDigest => Frame::RetainedDigest {
            hash: r.u64()?,
            entries: r.u64()?,
        },
        FrameKind::RetainedSnapshot => {
            let n = r.count(2 + 8 + 4 + 2 + 1)?;
            let mut updates = Vec::with_capacity(n);
            for _ in 0..n {
                updates.push(r.retained()?);
            }
            Frame::RetainedSnapshot(updates)
        }
        FrameKind::Forget => Frame::Forget {
            node: r.node()?,
            incarnation: r.u64()?,
            signature: match r.u8()? {
                0 => None,
                1 => Some(r.bytes()?),
                _ => return Err(r.bad("bad signature flag")),
            },
        },
        FrameKind::Claim => Frame::Claim(r.claim()?),
        FrameKind::ClaimSnapshot => {
            let n = r.count(2 + 8 + 4 + 2 + 1)?;
            let mut claims = Vec::with_capacity(n);
            for _ in 0..n {
                claims.push(r.claim()?);
            }
            Frame::ClaimSnapshot(claims)
        }
        FrameKind::SessionTransfer => {
            let client_id = r.string()?;
            let claim = r.stamp()?;
            let shipment = r.stamp()?;
            let index = r.u32()?;
            let count = r.u32()?;
            if index >= count {
                return Err(r.bad("part index beyond count"));
            }
            let by = match r.u8()? {
                0 => None,
                1 => Some(r.claim()?),
                _ => return Err(r.bad("bad sender claim flag")),
            };
            let n = r.count(8)?;
            let mut records = Vec::with_capacity(n);
            for _ in 0..n {
                let key = r.bytes()?;
                let value = r.bytes()?;
                records.push((key, value));
            }
            Frame::SessionTransfer(SessionTransfer {
                client_id,
                claim,
                shipment,
                index,
                count,
                by,
                records,
            })
        }
        FrameKind::SessionTaken => Frame::SessionTaken {
            client_id: r.string()?,
            claim: r.stamp()?,
            shipment: r.stamp()?,
        },
        FrameKind::SessionRelay => {
            let client_id = r.string()?;
            let claim = r.stamp()?;
            Frame::SessionRelay(SessionRelay {
                client_id,
                claim,
                n: r.u64()?,
                origin: r.owner()?,
                seq: r.u64()?,
                message: r.publish()?,
            })
        }
        FrameKind::SessionRelayAck => Frame::SessionRelayAck {
            client_id: r.string()?,
            claim: r.stamp()?,
            n: r.u64()?,
        },
        FrameKind::SessionRouted => Frame::SessionRouted {
            client_id: r.string()?,
            claim: r.stamp()?,
        },
        FrameKind::SessionRelayDone => Frame::SessionRelayDone {
            client_id: r.string()?,
            claim: r.stamp()?,
            last: r.u64()?,
        },
        FrameKind::Fence => Frame::Fence { token: r.u64()? },
        FrameKind::ClaimRequest => {
            let client_id = r.string()?;
            let flags = r.u8()?;
            if flags & !0b11 != 0 {
                return Err(r.bad("unknown claim request flags"));
            }
            let user = if flags & 1 != 0 {
                Some(r.string()?)
            } else {
                None
            };
            let proof = if flags & 2 != 0 {
                Some(r.bytes()?)
            } else {
                None
            };
            Frame::ClaimRequest {
                client_id,
                user,
                proof,
                token: r.u64()?,
            }
        }
        FrameKind::ClaimAnswer => Frame::ClaimAnswer {
            client_id: r.string()?,
            token: r.u64()?,
            reason: r.u8()?,
            hlc: Hlc {
                wall_ms: r.u64()?,
                logical: r.u32()?,
            },
        },
        FrameKind::Revoke => Frame::Revoke {
            client_id: r.string()?,
            token: r.u64()?,
        },
        FrameKind::Revoked => Frame::Revoked {
            client_id: r.string()?,
            token: r.u64()?,
        },
        FrameKind::FenceEcho => Frame::FenceEcho {
            token: r.u64()?,
            incarnation: r.u64()?,
            next: r.u64()?,
        },
        FrameKind::ScopedRoutes => {
            let n = r.count(2)?;
            let mut filters = Vec::with_capacity(n);
            for _ in 0..n {
                filters.push(r.string()?);
            }
            Frame::ScopedRoutes { filters }
        }
        FrameKind::SessionRelayCaughtUp => Frame::SessionRelayCaughtUp {
            client_id: r.string()?,
            claim: r.stamp()?,
            node: r.node()?,
        },
    };
    if !r.buf.is_empty() {
        return Err(r.bad("bytes after the frame's content"));
    }
    Ok(Some(out))
}

/// Append one frame to `out`, in one pass (its length is written once the body is); on an
/// error `out` is as it was.
pub fn encode(frame: &Frame, out: &mut BytesMut) -> Result<(), LinkError> {
    let start = out.len();
    out.put_u32(0);
    out.put_u8(frame.kind().byte());
    let len = encode_body(frame, out).and_then(|()| {
        u32::try_from(out.len() - start - 4).map_err(|_| LinkError::Encode("frame over 4 GiB"))
    });
    match len {
        Ok(len) => {
            out[start..start + 4].copy_from_slice(&len.to_be_bytes());
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// A frame's body (what follows its type byte), appended to `body`.
fn encode_body(frame: &Frame, body: &mut BytesMut) -> Result<(), LinkError> {
    match frame {
        Frame::Hello {
            node,
            incarnation,
            protocol,
            region,
            certificate,
        } => {
            put_str(body, node.as_str())?;
            body.put_u64(*incarnation);
            body.put_u16(*protocol);
            put_str(body, region)?;
            match certificate {
                None => body.put_u8(0),
                Some(certificate) => {
                    body.put_u8(1);
                    put_count(body, certificate.len())?;
                    body.put_slice(certificate);
                }
            }
        }
        Frame::RouteDelta(d) => {
            put_owner(body, &d.owner)?;
            body.put_u64(d.after);
            body.put_u64(d.hash);
            put_count(body, d.changes.len())?;
            for (i, c) in d.changes.iter().enumerate() {
                if c.version != d.after + 1 + i as u64 {
                    return Err(LinkError::Encode("delta versions are not consecutive"));
                }
                body.put_u8(match c.op {
                    RouteOp::Add => 0,
                    RouteOp::Remove => 1,
                });
                put_str(body, &c.filter)?;
            }
        }
        Frame::RouteAck { owner, version } => {
            put_owner(body, owner)?;
            body.put_u64(*version);
        }
        Frame::Digest(entries) => {
            put_count(body, entries.len())?;
            for e in entries {
                put_owner(body, &e.owner)?;
                body.put_u64(e.version);
                body.put_u64(e.hash);
            }
        }
        Frame::SnapshotRequest | Frame::KeepAlive => {}
        Frame::SnapshotChunk(c) => {
            put_owner(body, &c.owner)?;
            body.put_u64(c.version);
            body.put_u64(c.hash);
            body.put_u32(c.index);
            body.put_u32(c.count);
            put_count(body, c.filters.len())?;
            for f in &c.filters {
                put_str(body, f)?;
            }
        }
        Frame::Forward(f) => {
            put_owner(body, &f.origin)?;
            body.put_u64(f.seq);
            mqtt::encode_publish(&(&f.message).into(), ProtocolVersion::V5, body)
                .map_err(|_| LinkError::Encode("forwarded PUBLISH"))?;
        }
        Frame::ForwardAck { origin, seq } => {
            put_owner(body, origin)?;
            body.put_u64(*seq);
        }
        Frame::Retained(u) => {
            put_retained(body, u)?;
        }
        Frame::RetainedDigest { hash, entries } => {
            body.put_u64(*hash);
            body.put_u64(*entries);
        }
        Frame::RetainedSnapshot(updates) => {
            put_count(body, updates.len())?;
            for u in updates {
                put_retained(body, u)?;
            }
        }
        Frame::Forget {
            node,
            incarnation,
            signature,
        } => {
            put_str(body, node.as_str())?;
            body.put_u64(*incarnation);
            match signature {
                None => body.put_u8(0),
                Some(signature) => {
                    body.put_u8(1);
                    put_count(body, signature.len())?;
                    body.put_slice(signature);
                }
            }
        }
        Frame::Claim(c) => put_claim(body, c)?,
        Frame::ClaimSnapshot(claims) => {
            put_count(body, claims.len())?;
            for c in claims {
                put_claim(body, c)?;
            }
        }
        Frame::SessionTransfer(t) => {
            put_str(body, &t.client_id)?;
            put_stamp(body, &t.claim)?;
            put_stamp(body, &t.shipment)?;
            if t.index >= t.count {
                return Err(LinkError::Encode("part index beyond count"));
            }
            body.put_u32(t.index);
            body.put_u32(t.count);
            match &t.by {
                None => body.put_u8(0),
                Some(by) => {
                    body.put_u8(1);
                    put_claim(body, by)?;
                }
            }
            put_count(body, t.records.len())?;
            for (key, value) in &t.records {
                put_count(body, key.len())?;
                body.put_slice(key);
                put_count(body, value.len())?;
                body.put_slice(value);
            }
        }
        Frame::SessionTaken {
            client_id,
            claim,
            shipment,
        } => {
            put_str(body, client_id)?;
            put_stamp(body, claim)?;
            put_stamp(body, shipment)?;
        }
        Frame::SessionRouted { client_id, claim } => {
            put_str(body, client_id)?;
            put_stamp(body, claim)?;
        }
        Frame::Fence { token } => body.put_u64(*token),
        Frame::FenceEcho {
            token,
            incarnation,
            next,
        } => {
            body.put_u64(*token);
            body.put_u64(*incarnation);
            body.put_u64(*next);
        }
        Frame::ClaimRequest {
            client_id,
            user,
            proof,
            token,
        } => {
            // Flags: bit 0 a user follows, bit 1 a proof follows (u32 length and bytes).
            put_str(body, client_id)?;
            body.put_u8(u8::from(user.is_some()) | u8::from(proof.is_some()) << 1);
            if let Some(u) = user {
                put_str(body, u)?;
            }
            if let Some(proof) = proof {
                put_count(body, proof.len())?;
                body.put_slice(proof);
            }
            body.put_u64(*token);
        }
        Frame::ClaimAnswer {
            client_id,
            token,
            reason,
            hlc,
        } => {
            put_str(body, client_id)?;
            body.put_u64(*token);
            body.put_u8(*reason);
            body.put_u64(hlc.wall_ms);
            body.put_u32(hlc.logical);
        }
        Frame::Revoke { client_id, token } | Frame::Revoked { client_id, token } => {
            put_str(body, client_id)?;
            body.put_u64(*token);
        }
        Frame::ScopedRoutes { filters } => {
            put_count(body, filters.len())?;
            for f in filters {
                put_str(body, f)?;
            }
        }
        Frame::SessionRelay(r) => {
            put_str(body, &r.client_id)?;
            put_stamp(body, &r.claim)?;
            body.put_u64(r.n);
            put_owner(body, &r.origin)?;
            body.put_u64(r.seq);
            mqtt::encode_publish(&(&r.message).into(), ProtocolVersion::V5, body)
                .map_err(|_| LinkError::Encode("relayed PUBLISH"))?;
        }
        Frame::SessionRelayAck {
            client_id,
            claim,
            n: number,
        }
        | Frame::SessionRelayDone {
            client_id,
            claim,
            last: number,
        } => {
            put_str(body, client_id)?;
            put_stamp(body, claim)?;
            body.put_u64(*number);
        }
        Frame::SessionRelayCaughtUp {
            client_id,
            claim,
            node,
        } => {
            put_str(body, client_id)?;
            put_stamp(body, claim)?;
            put_str(body, node.as_str())?;
        }
    }
    Ok(())
}

/// Encoded size of a frame, length prefix included.
pub fn encoded_len(frame: &Frame) -> Result<usize, LinkError> {
    let mut buf = BytesMut::new();
    encode(frame, &mut buf)?;
    Ok(buf.len())
}

fn put_str(out: &mut BytesMut, s: &str) -> Result<(), LinkError> {
    let n = u16::try_from(s.len()).map_err(|_| LinkError::Encode("string over 65,535 bytes"))?;
    out.put_u16(n);
    out.put_slice(s.as_bytes());
    Ok(())
}

fn put_owner(out: &mut BytesMut, owner: &Owner) -> Result<(), LinkError> {
    put_str(out, owner.node.as_str())?;
    out.put_u64(owner.incarnation);
    Ok(())
}

/// topic, clock (u64 ms, u32 counter), node, then 0 for a delete or 1 and the length-prefixed
/// MQTT 5.0 PUBLISH.
fn put_retained(out: &mut BytesMut, u: &RetainedUpdate) -> Result<(), LinkError> {
    put_str(out, &u.topic)?;
    out.put_u64(u.stamp.hlc.wall_ms);
    out.put_u32(u.stamp.hlc.logical);
    put_str(out, u.stamp.node.as_str())?;
    match &u.message {
        None => out.put_u8(0),
        Some(p) => {
            if p.topic != u.topic {
                return Err(LinkError::Encode("retained message under another topic"));
            }
            out.put_u8(1);
            let mut packet = BytesMut::new();
            mqtt::encode_publish(&p.into(), ProtocolVersion::V5, &mut packet)
                .map_err(|_| LinkError::Encode("retained PUBLISH"))?;
            put_count(out, packet.len())?;
            out.put_slice(&packet);
        }
    }
    Ok(())
}

fn put_stamp(out: &mut BytesMut, stamp: &Stamp) -> Result<(), LinkError> {
    out.put_u64(stamp.hlc.wall_ms);
    out.put_u32(stamp.hlc.logical);
    put_str(out, stamp.node.as_str())
}

/// client id, stamp, then 0 for a release or 1, flags (bit 0 resume, bit 1 persistent, bit 2
/// a user follows, bit 3 a proof follows), the user and the proof (u32 length and bytes).
fn put_claim(out: &mut BytesMut, c: &ClaimUpdate) -> Result<(), LinkError> {
    put_str(out, &c.client_id)?;
    put_stamp(out, &c.stamp)?;
    match &c.claim {
        None => out.put_u8(0),
        Some(claim) => {
            out.put_u8(1);
            out.put_u8(
                u8::from(claim.resume)
                    | u8::from(claim.persistent) << 1
                    | u8::from(claim.user.is_some()) << 2
                    | u8::from(claim.proof.is_some()) << 3,
            );
            if let Some(user) = &claim.user {
                put_str(out, user)?;
            }
            if let Some(proof) = &claim.proof {
                put_count(out, proof.len())?;
                out.put_slice(proof);
            }
        }
    }
    Ok(())
}

fn put_count(out: &mut BytesMut, n: usize) -> Result<(), LinkError> {
    out.put_u32(u32::try_from(n).map_err(|_| LinkError::Encode("too many items"))?);
    Ok(())
}

struct Reader {
    buf: Bytes,
    frame: &'static str,
}

impl Fields for Reader {
    type Buf = Bytes;
    type Error = LinkError;

    fn buf(&mut self) -> &mut Bytes {
        &mut self.buf
    }

    fn fail(&self, detail: &'static str) -> LinkError {
        LinkError::Malformed {
            frame: self.frame,
            detail,
        }
    }
}

impl Reader {
    fn bad(&self, detail: &'static str) -> LinkError {
        self.fail(detail)
    }

    /// An item count, refused if the items (at least `min_item` bytes each) cannot fit in
    /// what is left: no allocation beyond the frame's size.
    fn count(&mut self, min_item: usize) -> Result<usize, LinkError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item.max(1)) > self.buf.len() {
            return Err(self.bad("item count larger than the frame"));
        }
        Ok(n)
    }

    /// The rest of the frame as one MQTT 5.0 PUBLISH, with its topic and without an alias.
    fn publish(&mut self) -> Result<mqtt::Publish, LinkError> {
        let mut rest = BytesMut::from(&self.buf[..]);
        self.buf.clear();
        let message = match mqtt::decode(&mut rest, ProtocolVersion::V5, u32::MAX) {
            Ok(Some(Packet::Publish(p))) if rest.is_empty() => p,
            _ => return Err(self.bad("embedded PUBLISH")),
        };
        if message.topic.is_empty() || message.properties.topic_alias.is_some() {
            return Err(self.bad("embedded PUBLISH needs its topic, without alias"));
        }
        Ok(message)
    }

    /// A length-prefixed (u32) run of bytes, within the frame.
    fn bytes(&mut self) -> Result<Bytes, LinkError> {
        let n = self.count(1)?;
        Ok(self.buf.split_to(n))
    }

    fn claim(&mut self) -> Result<ClaimUpdate, LinkError> {
        let client_id = self.string()?;
        let stamp = self.stamp()?;
        let claim = match self.u8()? {
            0 => None,
            1 => {
                let flags = self.u8()?;
                if flags & !0b1111 != 0 {
                    return Err(self.bad("unknown claim flags"));
                }
                let user = if flags & 4 != 0 {
                    Some(self.string()?)
                } else {
                    None
                };
                let proof = if flags & 8 != 0 {
                    Some(self.bytes()?)
                } else {
                    None
                };
                Some(Claim {
                    resume: flags & 1 != 0,
                    persistent: flags & 2 != 0,
                    user,
                    proof,
                })
            }
            _ => return Err(self.bad("unknown claim operation")),
        };
        Ok(ClaimUpdate {
            client_id,
            stamp,
            claim,
        })
    }

    fn owner(&mut self) -> Result<Owner, LinkError> {
        Ok(Owner {
            node: self.node()?,
            incarnation: self.u64()?,
        })
    }

    fn filter(&mut self) -> Result<Arc<str>, LinkError> {
        let s = self.string()?;
        TopicFilter::new(s.as_str()).map_err(|_| self.bad("invalid topic filter"))?;
        Ok(s.into())
    }

    fn retained(&mut self) -> Result<RetainedUpdate, LinkError> {
        let topic = self.string()?;
        TopicName::check(&topic, &Limits::MQTT).map_err(|_| self.bad("invalid topic name"))?;
        let hlc = Hlc {
            wall_ms: self.u64()?,
            logical: self.u32()?,
        };
        let node = self.node()?;
        let message = match self.u8()? {
            0 => None,
            1 => {
                let n = self.count(1)?;
                let mut packet = BytesMut::from(&self.buf.split_to(n)[..]);
                let p = match mqtt::decode(&mut packet, ProtocolVersion::V5, u32::MAX) {
                    Ok(Some(Packet::Publish(p))) if packet.is_empty() => p,
                    _ => return Err(self.bad("embedded PUBLISH")),
                };
                if p.topic != topic || p.properties.topic_alias.is_some() {
                    return Err(self.bad("retained PUBLISH needs the update's topic"));
                }
                Some(p)
            }
            _ => return Err(self.bad("unknown retained operation")),
        };
        Ok(RetainedUpdate {
            topic,
            stamp: Stamp { hlc, node },
            message,
        })
    }

    fn delta(&mut self) -> Result<RouteDelta, LinkError> {
        let owner = self.owner()?;
        let after = self.u64()?;
        let hash = self.u64()?;
        let n = self.count(3)?;
        if after.checked_add(n as u64).is_none() {
            return Err(self.bad("versions overflow"));
        }
        let mut changes = Vec::with_capacity(n);
        for i in 0..n {
            let op = match self.u8()? {
                0 => RouteOp::Add,
                1 => RouteOp::Remove,
                _ => return Err(self.bad("unknown route operation")),
            };
            changes.push(RouteChange {
                version: after + 1 + i as u64,
                filter: self.filter()?,
                op,
            });
        }
        Ok(RouteDelta {
            owner,
            after,
            changes,
            hash,
        })
    }
}
