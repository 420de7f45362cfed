//! Reference-counted interning of topic levels: each distinct level string is stored once.

use core::borrow::Borrow;
use core::fmt;
use core::hash::{Hash, Hasher};
use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::FixedState;

/// A dense id for an interned level string. Ids of released levels are reused (LIFO), so the
/// id a string gets is a pure function of the sequence of operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct LevelId(pub(crate) u32);

/// Longest level kept inline in [`LevelKey`] (no allocation, no pointer to chase on lookup).
const INLINE_MAX: usize = 22;

/// An interned level string: short ones inline, longer ones in one shared allocation.
#[derive(Clone)]
enum LevelKey {
    Inline { len: u8, bytes: [u8; INLINE_MAX] },
    Shared(Arc<str>),
}

impl LevelKey {
    fn new(s: &str) -> Self {
        let mut bytes = [0; INLINE_MAX];
        match (bytes.get_mut(..s.len()), u8::try_from(s.len())) {
            (Some(dst), Ok(len)) => {
                dst.copy_from_slice(s.as_bytes());
                LevelKey::Inline { len, bytes }
            }
            _ => LevelKey::Shared(Arc::from(s)),
        }
    }

    /// The text's bytes: what the table hashes and compares (no UTF-8 check on lookups).
    #[inline]
    fn as_bytes(&self) -> &[u8] {
        match self {
            LevelKey::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or_default(),
            LevelKey::Shared(s) => s.as_bytes(),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Always valid: the bytes were copied from a `&str`.
            LevelKey::Inline { .. } => core::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            LevelKey::Shared(s) => s,
        }
    }

    /// Heap bytes owned (Arc's two counters plus the text, rounded to words).
    fn heap_bytes(&self) -> usize {
        match self {
            LevelKey::Inline { .. } => 0,
            LevelKey::Shared(s) => {
                2 * size_of::<usize>() + s.len().next_multiple_of(size_of::<usize>())
            }
        }
    }
}

impl Borrow<[u8]> for LevelKey {
    #[inline]
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialEq for LevelKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for LevelKey {}

impl Hash for LevelKey {
    // Must hash exactly like the `[u8]` it borrows as.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl fmt::Debug for LevelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    id: LevelId,
    /// How many trie edges use this level; the string is freed when it drops to zero.
    refs: u32,
}

/// Level strings by value, and optionally by id (the reverse table costs 24 bytes a level;
/// [`FilterTrie`](super::FilterTrie) does without it, [`TopicTree`](super::TopicTree) needs it
/// to prune by id).
#[derive(Debug, Clone)]
pub(crate) struct Interner {
    by_name: HashMap<LevelKey, Slot, FixedState>,
    /// `Some` when ids map back to names.
    names: Option<Vec<Option<LevelKey>>>,
    /// Ids handed out so far (the next fresh id).
    next_id: u32,
    free: Vec<LevelId>,
}

impl Interner {
    pub(crate) fn new(seed: u64, by_id: bool) -> Self {
        Self {
            by_name: HashMap::with_hasher(FixedState::with_seed(seed)),
            names: by_id.then(Vec::new),
            next_id: 0,
            free: Vec::new(),
        }
    }

    /// The id of `level`, if some edge uses it. One hash probe.
    #[inline]
    pub(crate) fn lookup(&self, level: &str) -> Option<LevelId> {
        self.by_name.get(level.as_bytes()).map(|s| s.id)
    }

    /// The id of `level`, interning it if needed, with one more reference.
    ///
    /// # Panics
    /// If more than `u32::MAX - 1` distinct levels are live at once (hundreds of GiB of
    /// state; the broker bounds subscriptions and retained messages long before).
    pub(crate) fn acquire(&mut self, level: &str) -> LevelId {
        if let Some(slot) = self.by_name.get_mut(level.as_bytes()) {
            slot.refs = slot.refs.saturating_add(1);
            return slot.id;
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let id = self.next_id;
                assert!(id != u32::MAX, "more than 2^32 - 1 distinct topic levels");
                self.next_id += 1;
                LevelId(id)
            }
        };
        let key = LevelKey::new(level);
        if let Some(names) = &mut self.names {
            let i = id.0 as usize;
            if names.len() <= i {
                names.resize(i + 1, None);
            }
            names[i] = Some(key.clone());
        }
        self.by_name.insert(key, Slot { id, refs: 1 });
        id
    }

    /// Drops one reference to `level`; frees it when none are left.
    pub(crate) fn release_name(&mut self, level: &str) {
        let Some(slot) = self.by_name.get_mut(level.as_bytes()) else {
            return;
        };
        slot.refs = slot.refs.saturating_sub(1);
        if slot.refs == 0 {
            let id = slot.id;
            self.by_name.remove(level.as_bytes());
            if let Some(entry) = self.names.as_mut().and_then(|n| n.get_mut(id.0 as usize)) {
                *entry = None;
            }
            self.free.push(id);
        }
    }

    /// Drops one reference to `id` (only with the reverse table); frees it when none are left.
    pub(crate) fn release(&mut self, id: LevelId) {
        let Some(key) = self.key(id).cloned() else {
            return;
        };
        self.release_name(key.as_str());
    }

    fn key(&self, id: LevelId) -> Option<&LevelKey> {
        self.names.as_ref()?.get(id.0 as usize)?.as_ref()
    }

    /// The string of a live id, with the reverse table ("" otherwise; callers never need it).
    pub(crate) fn name(&self, id: LevelId) -> &str {
        self.key(id).map(LevelKey::as_str).unwrap_or_default()
    }

    /// Whether the level `id` starts with '$' (with the reverse table).
    #[inline]
    pub(crate) fn is_dollar(&self, id: LevelId) -> bool {
        self.key(id)
            .is_some_and(|k| k.as_bytes().first() == Some(&b'$'))
    }

    /// Every live level's name by id, built from the forward table (for iteration; not hot).
    pub(crate) fn names_by_id(&self) -> Vec<&str> {
        let mut out = vec![""; self.next_id as usize];
        for (key, slot) in &self.by_name {
            if let Some(name) = out.get_mut(slot.id.0 as usize) {
                *name = key.as_str();
            }
        }
        out
    }

    /// Number of live interned levels.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_name.len()
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        self.by_name.shrink_to_fit();
        if let Some(names) = &mut self.names {
            names.shrink_to_fit();
        }
        self.free.shrink_to_fit();
    }

    /// Estimated heap bytes: the tables plus long strings' allocations.
    pub(crate) fn heap_bytes(&self) -> usize {
        let strings: usize = self.by_name.keys().map(LevelKey::heap_bytes).sum();
        let names = self.names.as_ref().map_or(0, Vec::capacity);
        hash_map_bytes(self.by_name.capacity(), size_of::<(LevelKey, Slot)>())
            + names * size_of::<Option<LevelKey>>()
            + self.free.capacity() * size_of::<LevelId>()
            + strings
    }
}

/// Estimated heap bytes of a std `HashMap` with `capacity` (as reported by `capacity()`) and
/// entries of `entry` bytes: buckets of entries plus one control byte each and a group's slack.
pub(crate) fn hash_map_bytes(capacity: usize, entry: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        capacity + 1
    } else {
        (capacity / 7 * 8).next_power_of_two()
    };
    buckets * (entry + 1) + 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refcounts_free_and_reuse_ids() {
        for by_id in [false, true] {
            let mut i = Interner::new(7, by_id);
            let a = i.acquire("a");
            assert_eq!(i.acquire("b"), LevelId(1));
            assert_eq!(i.acquire("a"), a);
            assert_eq!(i.lookup("a"), Some(a));
            assert_eq!(i.names_by_id(), ["a", "b"]);
            i.release_name("a");
            assert_eq!(i.lookup("a"), Some(a));
            i.release_name("a");
            assert_eq!(i.lookup("a"), None);
            assert_eq!(i.len(), 1);
            // The freed id is reused.
            assert_eq!(i.acquire("c"), a);
            assert_eq!(i.names_by_id(), ["c", "b"]);
            // Releasing a dead or unknown level is harmless.
            i.release_name("zz");
            i.release(LevelId(99));
            i.release_name("b");
            i.release_name("b");
            assert_eq!(i.len(), 1);
            assert!(i.heap_bytes() > 0);
            // Long levels live on the heap.
            let long = "x".repeat(INLINE_MAX + 1);
            let l = i.acquire(&long);
            assert_eq!(i.lookup(&long), Some(l));
            let edge = "y".repeat(INLINE_MAX);
            let e = i.acquire(&edge);
            assert_eq!(i.lookup(&edge), Some(e));
            if by_id {
                assert_eq!(i.name(a), "c");
                assert_eq!(i.name(l), long);
                assert!(!i.is_dollar(l));
                i.release(l);
                i.release(e);
            } else {
                assert_eq!(i.name(a), "");
                i.release_name(&long);
                i.release_name(&edge);
            }
            assert_eq!(i.lookup(&long), None);
            assert_eq!(i.lookup(&edge), None);
            i.release_name("c");
            i.shrink_to_fit();
            assert_eq!(i.len(), 0);
            let d = i.acquire("$d");
            assert_eq!(i.is_dollar(d), by_id);
        }
    }

    #[test]
    fn keys_inline_or_shared() {
        assert!(matches!(
            LevelKey::new(&"y".repeat(INLINE_MAX)),
            LevelKey::Inline { .. }
        ));
        assert!(matches!(
            LevelKey::new(&"y".repeat(INLINE_MAX + 1)),
            LevelKey::Shared(_)
        ));
        assert_eq!(LevelKey::new("é/ü").as_str(), "é/ü");
        assert_eq!(format!("{:?}", LevelKey::new("a")), "\"a\"");
    }
}
