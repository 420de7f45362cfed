//! The store's journal: batches of record changes written one after the other into one file,
//! each framed so that a batch torn by a crash is recognised and dropped on replay.
//!
//! A batch is `[payload length: u32 LE][CRC-32 of the payload: u32 LE][payload]`; the payload
//! is the journal's generation (`u64 LE`), then its changes in order, each
//! `[1][key length: u32 LE][key][value length: u32 LE][value]` for a put or
//! `[0][key length: u32 LE][key]` for a delete. Each checkpoint starts a new generation from
//! the start of the file, over the old one's batches: writing over blocks the file has already
//! makes a commit one data write, with no change to the file's size or extents to journal. A
//! replay reads the batches of the current generation only, so it stops where the old
//! generation's leftovers begin.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// A record change: a put (`Some`) or a delete (`None`).
pub type Change = (Bytes, Option<Bytes>);

const HEADER: usize = 8;
const PUT: u8 = 1;
const DELETE: u8 = 0;

/// A batch of 4 GiB or more, which a journal cannot frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a batch of records of 4 GiB or more")]
pub struct TooLarge;

/// Appends `changes` to `out` as one batch of `generation` (`out` is left as it was if they are
/// too large).
pub fn encode(generation: u64, changes: &[Change], out: &mut BytesMut) -> Result<(), TooLarge> {
    let start = out.len();
    out.put_u64_le(0);
    out.put_u64_le(generation);
    for (key, value) in changes {
        out.put_u8(if value.is_some() { PUT } else { DELETE });
        let written = put_bytes(out, key).and_then(|()| match value {
            Some(value) => put_bytes(out, value),
            None => Ok(()),
        });
        if written.is_err() {
            out.truncate(start);
            return Err(TooLarge);
        }
    }
    let payload = &out[start + HEADER..];
    let Ok(len) = u32::try_from(payload.len()) else {
        out.truncate(start);
        return Err(TooLarge);
    };
    let crc = crc32fast::hash(payload);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn put_bytes(out: &mut BytesMut, bytes: &[u8]) -> Result<(), TooLarge> {
    let len = u32::try_from(bytes.len()).map_err(|_| TooLarge)?;
    out.put_u32_le(len);
    out.put_slice(bytes);
    Ok(())
}

/// What a journal file holds: its whole batches in order, and the length they take. Bytes
/// past that (a batch the crash tore, or that does not check out) are not part of it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Replay {
    pub batches: Vec<Vec<Change>>,
    pub valid_len: usize,
}

/// Reads the batches of `generation` from the start of `file`, stopping at the first that is
/// torn, does not check out, or is of another generation.
pub fn replay(file: &Bytes, generation: u64) -> Replay {
    let mut replay = Replay::default();
    let mut rest = file.clone();
    while rest.len() >= HEADER {
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len < 8 || rest.len() - HEADER < len {
            break;
        }
        let mut payload = rest.slice(HEADER..HEADER + len);
        if crc32fast::hash(&payload) != crc || payload.get_u64_le() != generation {
            break;
        }
        let Some(changes) = decode(payload) else {
            break;
        };
        replay.batches.push(changes);
        replay.valid_len += HEADER + len;
        rest.advance(HEADER + len);
    }
    replay
}

fn decode(mut payload: Bytes) -> Option<Vec<Change>> {
    let mut changes = Vec::new();
    while payload.has_remaining() {
        let op = payload.get_u8();
        let key = take_bytes(&mut payload)?;
        let value = match op {
            PUT => Some(take_bytes(&mut payload)?),
            DELETE => None,
            _ => return None,
        };
        changes.push((key, value));
    }
    Some(changes)
}

fn take_bytes(payload: &mut Bytes) -> Option<Bytes> {
    if payload.remaining() < 4 {
        return None;
    }
    let len = payload.get_u32_le() as usize;
    (payload.remaining() >= len).then(|| payload.split_to(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn change() -> impl Strategy<Value = Change> {
        (
            proptest::collection::vec(any::<u8>(), 0..12),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
        )
            .prop_map(|(k, v)| (Bytes::from(k), v.map(Bytes::from)))
    }

    proptest! {
        /// Whole batches come back as written; a file cut anywhere gives back exactly the
        /// batches wholly before the cut; a flipped byte loses its batch and those after.
        #[test]
        fn batches_come_back_and_a_torn_tail_is_dropped(
            batches in proptest::collection::vec(proptest::collection::vec(change(), 0..6), 0..8),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
        ) {
            let mut file = BytesMut::new();
            let mut ends = Vec::new();
            for b in &batches {
                encode(7, b, &mut file).unwrap();
                ends.push(file.len());
            }
            // What an older generation left beyond them.
            let mut old = BytesMut::new();
            encode(6, &[(Bytes::from_static(b"k"), None)], &mut old).unwrap();
            let file = file.freeze();
            let with_old = Bytes::from([&file[..], &old[..]].concat());
            let whole = replay(&with_old, 7);
            prop_assert_eq!(&whole.batches, &batches);
            prop_assert_eq!(whole.valid_len, file.len());
            if !batches.is_empty() {
                prop_assert_eq!(replay(&with_old, 6).batches.len(), 0, "another generation's");
            }

            let at = cut.index(file.len() + 1);
            let kept = ends.iter().filter(|e| **e <= at).count();
            let torn = replay(&file.slice(..at), 7);
            prop_assert_eq!(&torn.batches[..], &batches[..kept]);
            prop_assert_eq!(torn.valid_len, if kept == 0 { 0 } else { ends[kept - 1] });

            if !file.is_empty() {
                let i = flip.index(file.len());
                let mut bad = file.to_vec();
                bad[i] ^= 0x5a;
                let hit = ends.iter().position(|e| *e > i).unwrap();
                let flipped = replay(&Bytes::from(bad), 7);
                prop_assert!(flipped.batches.len() <= hit, "{} > {}", flipped.batches.len(), hit);
                prop_assert_eq!(&flipped.batches[..], &batches[..flipped.batches.len()]);
            }
        }
    }
}
