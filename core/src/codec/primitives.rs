//! The data representations of MQTT 5.0 §1.5 (also used by 3.1.1): integers, variable byte
//! integers, UTF-8 strings, binary data and string pairs.
//!
//! Reading works on a [`Bytes`] cursor: every read checks the bounds first and fails with
//! `MALFORMED_PACKET`, and binary data is split off the cursor without copying. Writing goes
//! through a [`Sink`], so the same code both counts the encoded length and writes the bytes.

use bytes::{Buf, Bytes};
#[cfg(test)]
use bytes::{BufMut, BytesMut};

use super::error::{DecodeError, EncodeError};
use super::packet::UserProperty;
use super::reason::ReasonCode;

/// The largest value a variable byte integer can hold (and so the largest remaining length).
pub const VAR_INT_MAX: u32 = 268_435_455;

fn truncated() -> DecodeError {
    DecodeError::malformed("packet shorter than its declared content")
}

pub(crate) fn read_u8(buf: &mut Bytes) -> Result<u8, DecodeError> {
    buf.try_get_u8().map_err(|_| truncated())
}

pub(crate) fn read_u16(buf: &mut Bytes) -> Result<u16, DecodeError> {
    buf.try_get_u16().map_err(|_| truncated())
}

pub(crate) fn read_u32(buf: &mut Bytes) -> Result<u32, DecodeError> {
    buf.try_get_u32().map_err(|_| truncated())
}

/// A packet identifier: a non-zero two byte integer (MQTT 5.0 §2.2.1).
pub(crate) fn read_packet_id(buf: &mut Bytes) -> Result<u16, DecodeError> {
    match read_u16(buf)? {
        0 => Err(DecodeError::malformed("packet identifier 0")),
        id => Ok(id),
    }
}

/// Parses a variable byte integer at the start of `bytes`: `Ok(None)` if it is not complete yet,
/// else the value and how many bytes it took. At most 4 bytes, in the shortest form
/// ([MQTT-1.5.5-1]).
pub(crate) fn parse_var_int(bytes: &[u8]) -> Result<Option<(u32, usize)>, DecodeError> {
    let mut value = 0u32;
    for (i, &b) in bytes.iter().take(4).enumerate() {
        value |= u32::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            if i > 0 && b == 0 {
                return Err(DecodeError::malformed(
                    "variable byte integer not in its shortest form",
                ));
            }
            return Ok(Some((value, i + 1)));
        }
    }
    if bytes.len() >= 4 {
        Err(DecodeError::malformed(
            "variable byte integer longer than 4 bytes",
        ))
    } else {
        Ok(None)
    }
}

pub(crate) fn read_var_int(buf: &mut Bytes) -> Result<u32, DecodeError> {
    let (value, len) = parse_var_int(buf.chunk())?.ok_or_else(truncated)?;
    buf.advance(len);
    Ok(value)
}

/// Binary data: a two byte length then that many bytes, shared with the frame (no copy).
pub(crate) fn read_binary(buf: &mut Bytes) -> Result<Bytes, DecodeError> {
    let len = usize::from(read_u16(buf)?);
    if buf.len() < len {
        return Err(truncated());
    }
    Ok(buf.split_to(len))
}

/// Checks that `bytes` is a valid MQTT UTF-8 string: well-formed UTF-8 (which excludes
/// surrogates and overlong forms) without U+0000 (MQTT 5.0 §1.5.4).
pub(crate) fn utf8(bytes: &[u8]) -> Result<&str, DecodeError> {
    if bytes.contains(&0) {
        return Err(DecodeError::malformed("U+0000 in a UTF-8 string"));
    }
    std::str::from_utf8(bytes).map_err(|_| DecodeError::malformed("invalid UTF-8 string"))
}

pub(crate) fn read_string(buf: &mut Bytes) -> Result<String, DecodeError> {
    let len = usize::from(read_u16(buf)?);
    // Copied straight out of the frame: no `Bytes` handle (and reference count) in between.
    let s = buf
        .get(..len)
        .ok_or_else(truncated)
        .and_then(utf8)?
        .to_owned();
    buf.advance(len);
    Ok(s)
}

pub(crate) fn read_string_pair(buf: &mut Bytes) -> Result<UserProperty, DecodeError> {
    let name = read_string(buf)?;
    let value = read_string(buf)?;
    Ok((name, value))
}

/// A reason code byte that must be one of `allowed` (the packet's table in MQTT 5.0).
pub(crate) fn read_reason_code(
    buf: &mut Bytes,
    allowed: &[ReasonCode],
    detail: &'static str,
) -> Result<ReasonCode, DecodeError> {
    let reason = ReasonCode(read_u8(buf)?);
    if allowed.contains(&reason) {
        Ok(reason)
    } else {
        Err(DecodeError::malformed(detail))
    }
}

/// Checks, before encoding, that `reason` is one that `packet` may carry.
pub(crate) fn check_reason_code(
    reason: ReasonCode,
    allowed: &[ReasonCode],
    packet: &'static str,
) -> Result<(), EncodeError> {
    if allowed.contains(&reason) {
        Ok(())
    } else {
        Err(EncodeError::ReasonNotAllowed { packet, reason })
    }
}

/// How many bytes `value` takes as a variable byte integer.
pub(crate) fn var_int_len(value: u32) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// `len` as a variable byte integer value, if it fits.
pub(crate) fn var_int_value(len: usize) -> Result<u32, EncodeError> {
    u32::try_from(len)
        .ok()
        .filter(|&v| v <= VAR_INT_MAX)
        .ok_or(EncodeError::PacketTooLarge { len })
}

/// Where encoded bytes go: a [`Counter`] that only adds up lengths, or a [`SliceWriter`].
///
/// Every packet is first encoded into a `Counter` (which also validates it) and only then into
/// the output buffer, so both agree on the length by construction.
pub(crate) trait Sink: Sized {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_slice(&mut self, v: &[u8]);

    /// A length-prefixed block (a property block): its length as a variable byte integer, then
    /// its content.
    fn put_block<E: Encode + ?Sized>(&mut self, content: &E) -> Result<(), EncodeError> {
        let mut counter = Counter(0);
        content.encode(&mut counter)?;
        put_var_int(self, var_int_value(counter.0)?);
        content.encode(self)
    }
}

/// Something written through a [`Sink`] (property blocks, mostly).
pub(crate) trait Encode {
    fn encode<S: Sink>(&self, s: &mut S) -> Result<(), EncodeError>;
}

/// A [`Sink`] that counts bytes.
#[derive(Debug, Default)]
pub(crate) struct Counter(pub usize);

impl Sink for Counter {
    fn put_u8(&mut self, _: u8) {
        self.0 += 1;
    }
    fn put_u16(&mut self, _: u16) {
        self.0 += 2;
    }
    fn put_u32(&mut self, _: u32) {
        self.0 += 4;
    }
    fn put_slice(&mut self, v: &[u8]) {
        self.0 += v.len();
    }
    fn put_block<E: Encode + ?Sized>(&mut self, content: &E) -> Result<(), EncodeError> {
        let start = self.0;
        content.encode(self)?;
        let len = var_int_value(self.0 - start)?;
        self.0 += var_int_len(len);
        Ok(())
    }
}

/// A [`Sink`] that writes into a slice the counting pass sized. Small writes become plain
/// stores instead of one `extend_from_slice` call each.
#[derive(Debug)]
pub(crate) struct SliceWriter<'a> {
    buf: &'a mut [u8],
    pos: usize,
    /// Set if a write did not fit: a bug (the counting pass disagreed), reported by the caller.
    overflow: bool,
}

impl<'a> SliceWriter<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Self {
            buf,
            pos: 0,
            overflow: false,
        }
    }

    /// True if exactly the whole slice was written.
    pub(crate) fn is_full(&self) -> bool {
        !self.overflow && self.pos == self.buf.len()
    }
}

impl Sink for SliceWriter<'_> {
    #[inline]
    fn put_u8(&mut self, v: u8) {
        self.put_slice(&[v]);
    }
    #[inline]
    fn put_u16(&mut self, v: u16) {
        self.put_slice(&v.to_be_bytes());
    }
    #[inline]
    fn put_u32(&mut self, v: u32) {
        self.put_slice(&v.to_be_bytes());
    }
    #[inline]
    fn put_slice(&mut self, v: &[u8]) {
        let end = self.pos.saturating_add(v.len());
        match self.buf.get_mut(self.pos..end) {
            Some(dst) => {
                dst.copy_from_slice(v);
                self.pos = end;
            }
            None => self.overflow = true,
        }
    }
}

#[cfg(test)]
impl Sink for BytesMut {
    fn put_u8(&mut self, v: u8) {
        BufMut::put_u8(self, v);
    }
    fn put_u16(&mut self, v: u16) {
        BufMut::put_u16(self, v);
    }
    fn put_u32(&mut self, v: u32) {
        BufMut::put_u32(self, v);
    }
    fn put_slice(&mut self, v: &[u8]) {
        self.extend_from_slice(v);
    }
}

/// Writes `value` (at most [`VAR_INT_MAX`], checked by the caller) as a variable byte integer.
pub(crate) fn put_var_int<S: Sink>(s: &mut S, mut value: u32) {
    loop {
        // `value % 128` always fits in a byte.
        let mut byte = (value % 128) as u8;
        value /= 128;
        if value > 0 {
            byte |= 0x80;
        }
        s.put_u8(byte);
        if value == 0 {
            return;
        }
    }
}

pub(crate) fn put_binary<S: Sink>(s: &mut S, v: &[u8]) -> Result<(), EncodeError> {
    let len = u16::try_from(v.len()).map_err(|_| EncodeError::BinaryTooLong { len: v.len() })?;
    s.put_u16(len);
    s.put_slice(v);
    Ok(())
}

pub(crate) fn put_string<S: Sink>(s: &mut S, v: &str) -> Result<(), EncodeError> {
    let len = u16::try_from(v.len()).map_err(|_| EncodeError::StringTooLong { len: v.len() })?;
    s.put_u16(len);
    s.put_slice(v.as_bytes());
    Ok(())
}

pub(crate) fn put_packet_id<S: Sink>(s: &mut S, id: u16) -> Result<(), EncodeError> {
    if id == 0 {
        return Err(EncodeError::ZeroPacketId);
    }
    s.put_u16(id);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[u8]) -> Bytes {
        Bytes::copy_from_slice(v)
    }

    #[test]
    fn var_int_boundaries_round_trip() {
        for (value, encoded) in [
            (0u32, &[0x00][..]),
            (127, &[0x7F]),
            (128, &[0x80, 0x01]),
            (16_383, &[0xFF, 0x7F]),
            (16_384, &[0x80, 0x80, 0x01]),
            (2_097_151, &[0xFF, 0xFF, 0x7F]),
            (2_097_152, &[0x80, 0x80, 0x80, 0x01]),
            (VAR_INT_MAX, &[0xFF, 0xFF, 0xFF, 0x7F]),
        ] {
            let mut out = BytesMut::new();
            put_var_int(&mut out, value);
            assert_eq!(&out[..], encoded, "{value}");
            assert_eq!(var_int_len(value), encoded.len());
            assert_eq!(parse_var_int(encoded), Ok(Some((value, encoded.len()))));
        }
    }

    #[test]
    fn var_int_of_five_bytes_is_malformed() {
        let err = parse_var_int(&[0xFF, 0xFF, 0xFF, 0xFF, 0x01]).unwrap_err();
        assert_eq!(err.reason, crate::codec::ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn var_int_incomplete_is_none() {
        assert_eq!(parse_var_int(&[]), Ok(None));
        assert_eq!(parse_var_int(&[0x80, 0x80, 0x80]), Ok(None));
    }

    #[test]
    fn var_int_non_minimal_is_malformed() {
        assert!(parse_var_int(&[0x80, 0x00]).is_err());
        assert!(parse_var_int(&[0x81, 0x80, 0x00]).is_err());
    }

    #[test]
    fn string_with_nul_is_malformed() {
        let err = read_string(&mut bytes(&[0, 3, b'a', 0, b'b'])).unwrap_err();
        assert_eq!(err.reason, crate::codec::ReasonCode::MALFORMED_PACKET);
    }

    #[test]
    fn string_invalid_utf8_is_malformed() {
        // A UTF-16 surrogate (U+D800) encoded as UTF-8, and an overlong '/'.
        for raw in [&[0, 3, 0xED, 0xA0, 0x80][..], &[0, 2, 0xC0, 0xAF]] {
            let err = read_string(&mut bytes(raw)).unwrap_err();
            assert_eq!(err.reason, crate::codec::ReasonCode::MALFORMED_PACKET);
        }
    }

    #[test]
    fn string_longer_than_buffer_is_malformed() {
        assert!(read_string(&mut bytes(&[0, 5, b'a'])).is_err());
        assert!(read_u16(&mut bytes(&[1])).is_err());
        assert!(read_u32(&mut bytes(&[1, 2, 3])).is_err());
    }

    #[test]
    fn binary_is_zero_copy() {
        let frame = bytes(&[0, 2, 7, 8, 9]);
        let mut cursor = frame.clone();
        let data = read_binary(&mut cursor).unwrap();
        assert_eq!(&data[..], &[7, 8]);
        assert_eq!(data.as_ptr(), frame[2..].as_ptr());
        assert_eq!(&cursor[..], &[9]);
    }

    #[test]
    fn string_too_long_is_encode_error() {
        let long = "a".repeat(65_536);
        assert_eq!(
            put_string(&mut Counter(0), &long),
            Err(EncodeError::StringTooLong { len: 65_536 })
        );
        assert!(put_string(&mut Counter(0), &long[1..]).is_ok());
    }
}
