//! What a peer's policy bytes are checked for before automerge sees them.
//!
//! Automerge trusts its input more than a node may trust a peer: a bloom filter with zero bits
//! per entry divides by zero, one with `u32::MAX` probes asks for 16 GiB, and compressed
//! change chunks and document columns are inflated whole before anything looks at their size.
//! So every sync message and every whole document from a peer passes [`sync_message`] or
//! [`document`] first:
//!
//! - a bloom filter has 1 to [`MAX_BITS_PER_ENTRY`] bits per entry and 1 to [`MAX_PROBES`]
//!   probes (automerge makes 10 and 7), and a message holds at most [`MAX_HAVES`] of them;
//! - chunks are changes, compressed changes or documents (no bundles: no node makes them), and
//!   what their compressed parts inflate to is counted, as it is inflated, against
//!   `max_inflated_bytes`, and refused past it;
//! - counts in the document's header are checked against the bytes that follow them before
//!   anything is read by count.
//!
//! A refusal is a [`DocError::Sync`] (or `Load`) naming what was wrong: the policy stream that
//! brought it ends, and the document stays as it was.

use std::io::Read as _;

use automerge::sync;

use super::DocError;

/// The most bits per entry a peer's bloom filter may use (automerge uses 10).
pub const MAX_BITS_PER_ENTRY: u64 = 64;
/// The most probes a peer's bloom filter may ask for (automerge uses 7).
pub const MAX_PROBES: u64 = 64;
/// The most `have` entries of one sync message (automerge sends at most one).
pub const MAX_HAVES: usize = 8;
/// What the compressed parts of a message or document may inflate to, as a multiple of
/// `policy.max_document_bytes`.
pub const INFLATE_FACTOR: usize = 8;

const MAGIC: [u8; 4] = [0x85, 0x6f, 0x4a, 0x83];
pub(super) const CHUNK_DOCUMENT: u8 = 0;
const CHUNK_CHANGE: u8 = 1;
const CHUNK_COMPRESSED: u8 = 2;
/// A column whose data is deflated (automerge's column specification).
const COLUMN_DEFLATE: u64 = 0b1000;

/// Check a peer's sync message; returns it decoded.
pub fn sync_message(bytes: &[u8], max_inflated_bytes: usize) -> Result<sync::Message, DocError> {
    let refuse = |why: String| DocError::Sync(why);
    let message = sync::Message::decode(bytes).map_err(|e| refuse(e.to_string()))?;
    if message.have.len() > MAX_HAVES {
        return Err(refuse(format!(
            "{} bloom filters (at most {MAX_HAVES})",
            message.have.len()
        )));
    }
    for have in &message.have {
        bloom(&have.bloom.to_bytes()).map_err(refuse)?;
    }
    let mut budget = Budget::new(max_inflated_bytes);
    for chunk in message.changes.iter() {
        chunks(chunk, &mut budget).map_err(refuse)?;
    }
    Ok(message)
}

/// Check a peer's whole document.
pub fn document(bytes: &[u8], max_inflated_bytes: usize) -> Result<(), DocError> {
    chunks(bytes, &mut Budget::new(max_inflated_bytes)).map_err(DocError::Load)
}

/// A bloom filter's encoding: empty, or entries, bits per entry, probes and the bits.
fn bloom(bytes: &[u8]) -> Result<(), String> {
    if bytes.is_empty() {
        return Ok(());
    }
    let mut r = Reader(bytes);
    let entries = r.uleb()?;
    let bits_per_entry = r.uleb()?;
    let probes = r.uleb()?;
    if entries == 0 {
        return Err("a bloom filter of no entries with parameters".to_owned());
    }
    if !(1..=MAX_BITS_PER_ENTRY).contains(&bits_per_entry) {
        return Err(format!(
            "a bloom filter of {bits_per_entry} bits per entry (1 to {MAX_BITS_PER_ENTRY})"
        ));
    }
    if !(1..=MAX_PROBES).contains(&probes) {
        return Err(format!(
            "a bloom filter of {probes} probes (1 to {MAX_PROBES})"
        ));
    }
    Ok(())
}

/// What inflating may still produce.
struct Budget {
    left: usize,
    max: usize,
}

impl Budget {
    fn new(max: usize) -> Self {
        Self { left: max, max }
    }

    /// Inflate `deflated` (raw deflate), counting what it produces; refused past the budget.
    fn inflate(&mut self, deflated: &[u8]) -> Result<(), String> {
        let limit = u64::try_from(self.left)
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let mut sink = std::io::sink();
        let mut decoder = flate2::bufread::DeflateDecoder::new(deflated).take(limit);
        let n = std::io::copy(&mut decoder, &mut sink)
            .map_err(|e| format!("a compressed part that does not inflate: {e}"))?;
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        if n > self.left {
            return Err(format!(
                "compressed parts that inflate past {} bytes",
                self.max
            ));
        }
        self.left -= n;
        Ok(())
    }
}

/// The chunks of `bytes` (through the screen already), each with its kind.
pub(super) fn split_chunks(bytes: &[u8]) -> Result<Vec<(u8, &[u8])>, String> {
    let mut out = Vec::new();
    let mut r = Reader(bytes);
    while !r.0.is_empty() {
        let start = r.0;
        r.take(8)?;
        let kind = r.take(1)?[0];
        let len = r.len()?;
        r.take(len)?;
        let whole = start.len() - r.0.len();
        out.push((kind, &start[..whole]));
    }
    Ok(out)
}

/// A sequence of automerge chunks.
fn chunks(bytes: &[u8], budget: &mut Budget) -> Result<(), String> {
    let mut r = Reader(bytes);
    while !r.0.is_empty() {
        if r.take(4)? != MAGIC {
            return Err("a chunk without automerge's magic bytes".to_owned());
        }
        r.take(4)?; // checksum: automerge checks it
        let kind = r.take(1)?[0];
        let len = r.len()?;
        let data = r.take(len)?;
        match kind {
            CHUNK_CHANGE => {}
            CHUNK_COMPRESSED => budget.inflate(data)?,
            CHUNK_DOCUMENT => document_columns(data, budget)?,
            other => return Err(format!("a chunk of type {other} (a peer sends 0, 1 or 2)")),
        }
    }
    Ok(())
}

/// A document chunk's body: actors, heads, the change and op column descriptions, then the
/// columns' data. Deflated columns are inflated against the budget.
fn document_columns(data: &[u8], budget: &mut Budget) -> Result<(), String> {
    let mut r = Reader(data);
    let actors = r.count(1)?;
    for _ in 0..actors {
        let len = r.len()?;
        r.take(len)?;
    }
    let heads = r.count(32)?;
    r.take(heads * 32)?;
    let mut columns = Vec::new();
    for _ in 0..2 {
        let n = r.count(2)?;
        for _ in 0..n {
            let spec = r.uleb()?;
            let len = r.len()?;
            columns.push((spec, len));
        }
    }
    for (spec, len) in columns {
        let column = r.take(len)?;
        if spec & COLUMN_DEFLATE != 0 {
            budget.inflate(column)?;
        }
    }
    Ok(())
}

/// Reads automerge's encodings, every count checked against what is left.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err(format!(
                "{n} bytes announced where {} are left",
                self.0.len()
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    /// An unsigned LEB128 number of at most 64 bits.
    fn uleb(&mut self) -> Result<u64, String> {
        let mut value: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1).map_err(|_| "a number cut short".to_owned())?[0];
            let part = u64::from(byte & 0x7f);
            if shift == 63 && part > 1 {
                return Err("a number past 64 bits".to_owned());
            }
            value |= part << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a number past 64 bits".to_owned())
    }

    /// A length of bytes that follow.
    fn len(&mut self) -> Result<usize, String> {
        let n = self.uleb()?;
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.0.len())
            .ok_or_else(|| format!("{n} bytes announced where {} are left", self.0.len()))
    }

    /// A count of items that take at least `min_bytes` each.
    fn count(&mut self, min_bytes: usize) -> Result<usize, String> {
        let n = self.uleb()?;
        usize::try_from(n)
            .ok()
            .filter(|n| n.saturating_mul(min_bytes) <= self.0.len())
            .ok_or_else(|| format!("{n} items announced in {} bytes", self.0.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::document::{Author, Edit, PolicyDoc};
    use automerge::ActorId;

    fn doc_with_users(n: usize) -> PolicyDoc {
        let mut doc = PolicyDoc::genesis(ActorId::from(&[7u8; 16][..]));
        let hash = crate::passwd::hash(b"secret").expect("hashes");
        let edits: Vec<Edit> = (0..n)
            .map(|i| Edit::UserSet {
                name: format!("user-{i}"),
                hash: hash.clone(),
                claim_key: None,
            })
            .collect();
        let author = Author {
            by: "test".to_owned(),
            node: "n".to_owned(),
            region: "r".to_owned(),
        };
        doc.apply(&edits, &author, 1).expect("edits apply");
        doc
    }

    /// A sync message with `have` holding `bloom` and nothing else.
    fn with_bloom(bloom: &[u8]) -> Vec<u8> {
        let mut m = vec![0x42, 0, 0, 1, 0];
        m.push(u8::try_from(bloom.len()).expect("short"));
        m.extend_from_slice(bloom);
        m.push(0);
        m
    }

    #[test]
    fn what_automerge_sends_passes() {
        let mut a = doc_with_users(200);
        let mut b = PolicyDoc::genesis(ActorId::from(&[8u8; 16][..]));
        let (mut sa, mut sb) = (sync::State::new(), sync::State::new());
        let mut rounds = 0;
        loop {
            rounds += 1;
            assert!(rounds < 20, "sync converges");
            let mut quiet = true;
            if let Some(m) = a.sync_message(&mut sa) {
                quiet = false;
                sync_message(&m, 1 << 20).expect("a's message passes");
                b.receive_sync(&mut sb, &m, 1 << 24, None)
                    .expect("b takes it");
            }
            if let Some(m) = b.sync_message(&mut sb) {
                quiet = false;
                sync_message(&m, 1 << 20).expect("b's message passes");
                a.receive_sync(&mut sa, &m, 1 << 24, None)
                    .expect("a takes it");
            }
            if quiet {
                break;
            }
        }
        assert_eq!(a.heads(), b.heads());
        document(&a.save(), 1 << 20).expect("a saved document passes");
    }

    #[test]
    fn bloom_filters_automerge_cannot_take_are_refused() {
        // One entry, 0 bits per entry: automerge divides by zero on its next message.
        let zero_bits = with_bloom(&[1, 0, 7]);
        let err = sync_message(&zero_bits, 1 << 20).expect_err("refused");
        assert!(err.to_string().contains("0 bits per entry"), "{err}");
        // u32::MAX probes: 16 GiB of probes.
        let mut probes = vec![1, 10, 0xff, 0xff, 0xff, 0xff, 0x0f];
        probes.extend_from_slice(&[0xff, 0xff]);
        let err = sync_message(&with_bloom(&probes), 1 << 20).expect_err("refused");
        assert!(err.to_string().contains("probes"), "{err}");
        // The issue's frame body: `42 00 00 01 00 03 01 00 01 00`.
        let issue = [0x42, 0, 0, 1, 0, 3, 1, 0, 1, 0];
        assert!(sync_message(&issue, 1 << 20).is_err());
    }

    /// A chunk of `kind` around `data`.
    fn chunk(kind: u8, data: &[u8]) -> Vec<u8> {
        let mut c = MAGIC.to_vec();
        c.extend_from_slice(&[0; 4]);
        c.push(kind);
        let mut len = data.len();
        loop {
            let byte = u8::try_from(len & 0x7f).expect("7 bits");
            len >>= 7;
            if len == 0 {
                c.push(byte);
                break;
            }
            c.push(byte | 0x80);
        }
        c.extend_from_slice(data);
        c
    }

    fn deflate(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::bufread::DeflateEncoder::new(bytes, flate2::Compression::best())
            .read_to_end(&mut out)
            .expect("deflates");
        out
    }

    #[test]
    fn compressed_chunks_that_inflate_past_the_budget_are_refused() {
        let bomb = deflate(&vec![0u8; 4 << 20]);
        assert!(bomb.len() < 8 << 10, "{} bytes", bomb.len());
        let err = document(&chunk(CHUNK_COMPRESSED, &bomb), 1 << 20).expect_err("refused");
        assert!(err.to_string().contains("inflate past"), "{err}");
        assert!(document(&chunk(CHUNK_COMPRESSED, &bomb), 8 << 20).is_ok());
        // The same inside a document's column.
        let mut body = vec![0, 0, 1, 0b1000, 0x80, 0x80, 0x80, 0];
        let len = bomb.len();
        body[4] = u8::try_from(len & 0x7f).expect("7 bits") | 0x80;
        body[5] = u8::try_from((len >> 7) & 0x7f).expect("7 bits") | 0x80;
        body[6] = u8::try_from(len >> 14).expect("7 bits");
        body.extend_from_slice(&bomb);
        let err = document(&chunk(CHUNK_DOCUMENT, &body), 1 << 20).expect_err("refused");
        assert!(err.to_string().contains("inflate past"), "{err}");
    }

    #[test]
    fn counts_past_the_bytes_and_unknown_chunks_are_refused() {
        // 2^40 actors in a few bytes.
        let body = [0x80, 0x80, 0x80, 0x80, 0x80, 0x20];
        let err = document(&chunk(CHUNK_DOCUMENT, &body), 1 << 20).expect_err("refused");
        assert!(err.to_string().contains("items announced"), "{err}");
        let err = document(&chunk(3, &[]), 1 << 20).expect_err("refused");
        assert!(err.to_string().contains("type 3"), "{err}");
        let mut long = chunk(CHUNK_CHANGE, &[1, 2, 3]);
        long.truncate(long.len() - 1);
        assert!(document(&long, 1 << 20).is_err());
        assert!(document(b"not a document", 1 << 20).is_err());
    }
}
