//! [`FilterTrie`]: topic filters in, matched by topic name. The publish hot path.

use core::fmt;
use std::collections::HashMap;

use foldhash::fast::FixedState;

use super::interner::{Interner, LevelId, hash_map_bytes};
use super::levels::Levels;

/// "No node" / "no value".
const NONE: u32 = u32::MAX;
/// The root node never moves and is never freed.
const ROOT: u32 = 0;
/// Frontier entries kept on the stack before spilling to the heap.
const FRONTIER_INLINE: usize = 16;
/// Up to this many literal children are a plain list (one cache line); beyond, a hash map.
const FEW_MAX: usize = 8;

/// The literal children of a node. Most nodes have none or one, which cost no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kids {
    None,
    One(LevelId, u32),
    /// Index into `FilterTrie::maps`.
    Map(u32),
}

/// The literal children of a node with two or more.
#[derive(Debug, Clone)]
enum ChildMap {
    Few(Vec<(LevelId, u32)>),
    Many(HashMap<LevelId, u32, FixedState>),
}

impl ChildMap {
    #[inline]
    fn get(&self, level: LevelId) -> Option<u32> {
        match self {
            ChildMap::Few(v) => v.iter().find(|e| e.0 == level).map(|e| e.1),
            ChildMap::Many(m) => m.get(&level).copied(),
        }
    }

    fn insert(&mut self, level: LevelId, child: u32, seed: u64) {
        match self {
            ChildMap::Few(v) if v.len() < FEW_MAX => v.push((level, child)),
            ChildMap::Few(v) => {
                let mut m =
                    HashMap::with_capacity_and_hasher(2 * FEW_MAX, FixedState::with_seed(seed));
                m.extend(v.drain(..));
                m.insert(level, child);
                *self = ChildMap::Many(m);
            }
            ChildMap::Many(m) => {
                m.insert(level, child);
            }
        }
    }

    fn remove(&mut self, level: LevelId) {
        match self {
            ChildMap::Few(v) => {
                if let Some(i) = v.iter().position(|e| e.0 == level) {
                    v.swap_remove(i);
                }
            }
            ChildMap::Many(m) => {
                m.remove(&level);
                if m.len() <= FEW_MAX / 2 {
                    // Sorted so the result does not depend on the hash table's layout.
                    let mut v: Vec<_> = m.drain().collect();
                    v.sort_unstable();
                    *self = ChildMap::Few(v);
                } else if m.len() * 4 < m.capacity() {
                    m.shrink_to_fit();
                }
            }
        }
    }

    fn len(&self) -> usize {
        match self {
            ChildMap::Few(v) => v.len(),
            ChildMap::Many(m) => m.len(),
        }
    }

    /// The only child left, if exactly one.
    fn single(&self) -> Option<(LevelId, u32)> {
        match self {
            ChildMap::Few(v) if v.len() == 1 => v.first().copied(),
            ChildMap::Many(m) if m.len() == 1 => m.iter().next().map(|(&l, &c)| (l, c)),
            _ => None,
        }
    }

    fn for_each(&self, mut f: impl FnMut(LevelId, u32)) {
        match self {
            ChildMap::Few(v) => v.iter().for_each(|&(l, c)| f(l, c)),
            ChildMap::Many(m) => m.iter().for_each(|(&l, &c)| f(l, c)),
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            ChildMap::Few(v) => v.capacity() * size_of::<(LevelId, u32)>(),
            ChildMap::Many(m) => hash_map_bytes(m.capacity(), size_of::<(LevelId, u32)>()),
        }
    }
}

/// One level of the trie: 24 bytes, no allocation unless it has two or more literal children.
#[derive(Debug, Clone, Copy)]
struct Node {
    /// Slot in `values` of the filter ending here, or `NONE`.
    value: u32,
    /// Slot in `values` of the filter ending here with a further "/#" (or "#" at the root).
    hash: u32,
    /// The '+' child, or `NONE`.
    plus: u32,
    kids: Kids,
}

impl Node {
    const EMPTY: Node = Node {
        value: NONE,
        hash: NONE,
        plus: NONE,
        kids: Kids::None,
    };

    fn is_empty(&self) -> bool {
        self.value == NONE && self.hash == NONE && self.plus == NONE && self.kids == Kids::None
    }
}

/// How a stored filter reached a node, to undo it when pruning.
#[derive(Debug, Clone, Copy)]
enum Step {
    Plus,
    Literal(LevelId),
}

/// A set of topic filters with a value each, matched against topic names (MQTT 5.0 §4.7).
///
/// Filters are given as patterns (a [`TopicFilter::pattern`](super::TopicFilter::pattern):
/// no `$share/{group}/` prefix; keep share groups inside `V`). A level that is exactly "+" is
/// the single-level wildcard, a last level that is exactly "#" the multi-level one; anything
/// else is literal. Patterns are assumed valid: an invalid one is stored without panicking, but
/// what it matches is unspecified.
///
/// Level strings are interned once with reference counts; nodes live in a slab with a free
/// list, each with a '+' slot, a '#' value slot and its literal children keyed by level id
/// (inline when there is one, a short list up to 8, a hash map beyond). Matching a topic costs
/// one interner probe per topic level plus one child lookup per live branch, and allocates
/// nothing unless more than 16 branches are live at once. Nothing depends on OS randomness:
/// the hash seed is passed in, and the order in which
/// [`for_each_match`](Self::for_each_match) visits values depends only on the stored filters.
#[derive(Clone)]
pub struct FilterTrie<V> {
    seed: u64,
    levels: Interner,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    maps: Vec<ChildMap>,
    free_maps: Vec<u32>,
    values: Vec<Option<V>>,
    free_values: Vec<u32>,
    len: usize,
}

impl<V> fmt::Debug for FilterTrie<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FilterTrie")
            .field("len", &self.len)
            .field("nodes", &(self.nodes.len() - self.free_nodes.len()))
            .finish_non_exhaustive()
    }
}

/// Splits a pattern into its levels before any trailing '#', and whether it had one.
/// `None` means no levels (the pattern "#").
fn split_hash(pattern: &str) -> (Option<&str>, bool) {
    if pattern == "#" {
        (None, true)
    } else if let Some(prefix) = pattern.strip_suffix("/#") {
        (Some(prefix), true)
    } else {
        (Some(pattern), false)
    }
}

fn levels_of(prefix: Option<&str>) -> impl Iterator<Item = &str> {
    prefix.into_iter().flat_map(Levels::new)
}

impl<V> FilterTrie<V> {
    /// An empty trie whose hash tables use `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            levels: Interner::new(seed, false),
            nodes: vec![Node::EMPTY],
            free_nodes: Vec::new(),
            maps: Vec::new(),
            free_maps: Vec::new(),
            values: Vec::new(),
            free_values: Vec::new(),
            len: 0,
        }
    }

    /// Number of stored filters.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no filter is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of the filter `pattern`.
    pub fn get(&self, pattern: &str) -> Option<&V> {
        let slot = self.find_slot(pattern)?;
        self.values.get(slot as usize)?.as_ref()
    }

    /// The value of the filter `pattern`, mutably.
    pub fn get_mut(&mut self, pattern: &str) -> Option<&mut V> {
        let slot = self.find_slot(pattern)?;
        self.values.get_mut(slot as usize)?.as_mut()
    }

    /// The value of the filter `pattern`, inserting `V::default()` if it is not stored.
    ///
    /// # Panics
    /// Only if the trie would exceed 2^32 - 1 nodes, values or distinct levels (tens of GiB;
    /// bound the number of subscriptions in config).
    pub fn entry(&mut self, pattern: &str) -> &mut V
    where
        V: Default,
    {
        let slot = self.slot_or_insert(pattern, || Some(V::default()));
        self.values[slot as usize].get_or_insert_with(V::default)
    }

    /// Stores `value` for the filter `pattern`, returning the previous value.
    ///
    /// # Panics
    /// As [`entry`](Self::entry).
    pub fn insert(&mut self, pattern: &str, value: V) -> Option<V> {
        let slot = self.slot_or_insert(pattern, || None);
        self.values[slot as usize].replace(value)
    }

    /// Removes the filter `pattern`, returning its value. Empty nodes are pruned and level
    /// strings no longer used are freed.
    pub fn remove(&mut self, pattern: &str) -> Option<V> {
        self.update_or_remove(pattern, |_| false).flatten()
    }

    /// Calls `f` with the value of the filter `pattern`; if `f` returns false, the filter is
    /// removed as by [`remove`](Self::remove), in the same walk down the trie. Returns `None`
    /// if the filter is not stored, else the removed value (`Some(None)` if it was kept).
    pub fn update_or_remove(
        &mut self,
        pattern: &str,
        f: impl FnOnce(&mut V) -> bool,
    ) -> Option<Option<V>> {
        let (prefix, hash) = split_hash(pattern);
        let mut path: Vec<(u32, Step, &str)> = Vec::new();
        let mut node = ROOT;
        for level in levels_of(prefix) {
            let (child, step) = if level == "+" {
                (self.nodes[node as usize].plus, Step::Plus)
            } else {
                let id = self.levels.lookup(level)?;
                (self.child(node, id)?, Step::Literal(id))
            };
            if child == NONE {
                return None;
            }
            path.push((node, step, level));
            node = child;
        }
        let n = &self.nodes[node as usize];
        let slot = if hash { n.hash } else { n.value };
        if f(self.values.get_mut(slot as usize)?.as_mut()?) {
            return Some(None);
        }
        let n = &mut self.nodes[node as usize];
        *(if hash { &mut n.hash } else { &mut n.value }) = NONE;
        let value = self.values.get_mut(slot as usize)?.take();
        self.free_values.push(slot);
        self.len -= 1;

        while let Some((parent, step, level)) = path.pop() {
            if !self.nodes[node as usize].is_empty() {
                break;
            }
            match step {
                Step::Plus => self.nodes[parent as usize].plus = NONE,
                Step::Literal(id) => {
                    self.remove_child(parent, id);
                    self.levels.release_name(level);
                }
            }
            self.free_nodes.push(node);
            node = parent;
        }
        Some(value)
    }

    /// Calls `f` with the value of every stored filter that matches the topic name `topic`,
    /// each exactly once. Topics starting with '$' are not matched by filters starting with a
    /// wildcard. The visit order depends only on the set of stored filters (a breadth-first
    /// walk: per level, '#' values, then literal children, then '+' children). Allocates only
    /// when more than 16 branches are live at one level.
    pub fn for_each_match(&self, topic: &str, mut f: impl FnMut(&V)) {
        // Two frontiers used in turn: the live nodes after `depth` levels, and the next ones.
        let mut frontiers = [Frontier::new(), Frontier::new()];
        frontiers[0].push(ROOT);
        let mut cur_index = 0;
        let mut first = true;
        for level in Levels::new(topic) {
            let wildcards = !(first && level.starts_with('$'));
            first = false;
            let [a, b] = &mut frontiers;
            let (cur, next) = if cur_index == 0 { (&*a, b) } else { (&*b, a) };
            next.clear();
            // Looked up at most once per level, and only if some live node has literal children.
            let mut id: Option<Option<LevelId>> = None;
            let mut step = |n: u32| {
                let node = &self.nodes[n as usize];
                if wildcards && let Some(v) = self.value(node.hash) {
                    f(v);
                }
                if node.kids != Kids::None
                    && let Some(id) = *id.get_or_insert_with(|| self.levels.lookup(level))
                    && let Some(c) = self.kid(node.kids, id)
                {
                    next.push(c);
                }
                if wildcards && node.plus != NONE {
                    next.push(node.plus);
                }
            };
            cur.inline().iter().for_each(|&n| step(n));
            cur.spill.iter().for_each(|&n| step(n));
            if next.is_empty() {
                return;
            }
            cur_index ^= 1;
        }
        let cur = &frontiers[cur_index];
        let mut last = |n: u32| {
            let node = &self.nodes[n as usize];
            if let Some(v) = self.value(node.value) {
                f(v);
            }
            // "a/#" also matches "a".
            if let Some(v) = self.value(node.hash) {
                f(v);
            }
        };
        cur.inline().iter().for_each(|&n| last(n));
        cur.spill.iter().for_each(|&n| last(n));
    }

    /// Whether any stored filter matches `topic`.
    pub fn matches_any(&self, topic: &str) -> bool {
        let mut any = false;
        self.for_each_match(topic, |_| any = true);
        any
    }

    /// All stored filters with their values, sorted by pattern. Rebuilds the patterns: not for
    /// the hot path.
    pub fn iter(&self) -> impl Iterator<Item = (String, &V)> {
        let mut out = Vec::with_capacity(self.len);
        // Depth-first with one path buffer: (node, level leading to it, length of its parent's
        // path; None below the root). Everything popped between a node and its later siblings
        // lies below it, so the buffer's prefix is always the parent's path.
        let names = self.levels.names_by_id();
        let mut path = String::new();
        let mut stack: Vec<(u32, &str, Option<usize>)> = Vec::new();
        let push_children = |stack: &mut Vec<_>, n: u32, len: Option<usize>| {
            let node: &Node = &self.nodes[n as usize];
            if node.plus != NONE {
                stack.push((node.plus, "+", len));
            }
            self.for_each_kid(node.kids, |level, child| {
                stack.push((
                    child,
                    names.get(level.0 as usize).copied().unwrap_or_default(),
                    len,
                ));
            });
        };
        if let Some(v) = self.value(self.nodes[ROOT as usize].hash) {
            out.push(("#".to_owned(), v));
        }
        push_children(&mut stack, ROOT, None);
        while let Some((n, level, parent_len)) = stack.pop() {
            match parent_len {
                None => path.clear(),
                Some(len) => {
                    path.truncate(len);
                    path.push('/');
                }
            }
            path.push_str(level);
            let node = &self.nodes[n as usize];
            if let Some(v) = self.value(node.value) {
                out.push((path.clone(), v));
            }
            if let Some(v) = self.value(node.hash) {
                out.push((format!("{path}/#"), v));
            }
            push_children(&mut stack, n, Some(path.len()));
        }
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        out.into_iter()
    }

    /// Estimated heap bytes of the trie's own structures (not counting heap owned by the
    /// values themselves).
    pub fn heap_bytes_estimate(&self) -> usize {
        self.levels.heap_bytes()
            + self.nodes.capacity() * size_of::<Node>()
            + self.free_nodes.capacity() * size_of::<u32>()
            + self.maps.capacity() * size_of::<ChildMap>()
            + self.maps.iter().map(ChildMap::heap_bytes).sum::<usize>()
            + self.free_maps.capacity() * size_of::<u32>()
            + self.free_nodes.capacity() * size_of::<u32>()
            + self.values.capacity() * size_of::<Option<V>>()
            + self.free_values.capacity() * size_of::<u32>()
    }

    /// Releases spare capacity (hash tables do not shrink by themselves after removals).
    pub fn shrink_to_fit(&mut self) {
        self.levels.shrink_to_fit();
        self.maps.shrink_to_fit();
        self.free_maps.shrink_to_fit();
        self.nodes.shrink_to_fit();
        self.free_nodes.shrink_to_fit();
        self.values.shrink_to_fit();
        self.free_values.shrink_to_fit();
    }

    #[inline]
    fn value(&self, slot: u32) -> Option<&V> {
        // `NONE` is never a valid index, so it needs no separate check.
        self.values.get(slot as usize)?.as_ref()
    }

    /// The node a pattern without '#' leads to.
    #[cfg(test)]
    fn find_node(&self, pattern: &str) -> Option<u32> {
        let mut node = ROOT;
        for level in pattern.split('/') {
            node = if level == "+" {
                Some(self.nodes[node as usize].plus).filter(|&p| p != NONE)?
            } else {
                self.child(node, self.levels.lookup(level)?)?
            };
        }
        Some(node)
    }

    /// The value slot of `pattern`, if stored.
    fn find_slot(&self, pattern: &str) -> Option<u32> {
        let (prefix, hash) = split_hash(pattern);
        let mut node = ROOT;
        for level in levels_of(prefix) {
            node = if level == "+" {
                self.nodes[node as usize].plus
            } else {
                let level = self.levels.lookup(level)?;
                self.child(node, level)?
            };
            if node == NONE {
                return None;
            }
        }
        let n = &self.nodes[node as usize];
        let slot = if hash { n.hash } else { n.value };
        (slot != NONE).then_some(slot)
    }

    /// The value slot of `pattern`, creating nodes and the slot (filled by `init`) as needed.
    fn slot_or_insert(&mut self, pattern: &str, init: impl FnOnce() -> Option<V>) -> u32 {
        let (prefix, hash) = split_hash(pattern);
        let mut node = ROOT;
        for level in levels_of(prefix) {
            node = self.child_or_insert(node, level);
        }
        let n = &self.nodes[node as usize];
        let slot = if hash { n.hash } else { n.value };
        if slot != NONE {
            return slot;
        }
        let slot = match self.free_values.pop() {
            Some(slot) => {
                self.values[slot as usize] = init();
                slot
            }
            None => {
                let slot = index(self.values.len());
                self.values.push(init());
                slot
            }
        };
        let n = &mut self.nodes[node as usize];
        *(if hash { &mut n.hash } else { &mut n.value }) = slot;
        self.len += 1;
        slot
    }

    fn child_or_insert(&mut self, node: u32, level: &str) -> u32 {
        if level == "+" {
            let plus = self.nodes[node as usize].plus;
            if plus != NONE {
                return plus;
            }
            let child = self.alloc_node();
            self.nodes[node as usize].plus = child;
            return child;
        }
        if let Some(level) = self.levels.lookup(level)
            && let Some(child) = self.child(node, level)
        {
            return child;
        }
        let level = self.levels.acquire(level);
        let child = self.alloc_node();
        self.add_child(node, level, child);
        child
    }

    #[inline]
    fn child(&self, node: u32, level: LevelId) -> Option<u32> {
        self.kid(self.nodes[node as usize].kids, level)
    }

    #[inline]
    fn kid(&self, kids: Kids, level: LevelId) -> Option<u32> {
        match kids {
            Kids::None => None,
            Kids::One(l, c) => (l == level).then_some(c),
            Kids::Map(m) => self.maps.get(m as usize)?.get(level),
        }
    }

    fn for_each_kid(&self, kids: Kids, mut f: impl FnMut(LevelId, u32)) {
        match kids {
            Kids::None => {}
            Kids::One(l, c) => f(l, c),
            Kids::Map(m) => {
                if let Some(map) = self.maps.get(m as usize) {
                    map.for_each(f);
                }
            }
        }
    }

    fn add_child(&mut self, node: u32, level: LevelId, child: u32) {
        let kids = match self.nodes[node as usize].kids {
            Kids::None => Kids::One(level, child),
            Kids::One(l, c) => {
                let map = ChildMap::Few(vec![(l, c), (level, child)]);
                let m = match self.free_maps.pop() {
                    Some(m) => {
                        self.maps[m as usize] = map;
                        m
                    }
                    None => {
                        let m = index(self.maps.len());
                        self.maps.push(map);
                        m
                    }
                };
                Kids::Map(m)
            }
            Kids::Map(m) => {
                self.maps[m as usize].insert(level, child, self.seed);
                Kids::Map(m)
            }
        };
        self.nodes[node as usize].kids = kids;
    }

    fn remove_child(&mut self, node: u32, level: LevelId) {
        let kids = match self.nodes[node as usize].kids {
            Kids::None => Kids::None,
            Kids::One(l, c) => {
                if l == level {
                    Kids::None
                } else {
                    Kids::One(l, c)
                }
            }
            Kids::Map(m) => {
                let map = &mut self.maps[m as usize];
                map.remove(level);
                match map.single() {
                    Some((l, c)) => {
                        *map = ChildMap::Few(Vec::new());
                        self.free_maps.push(m);
                        Kids::One(l, c)
                    }
                    None if map.len() == 0 => {
                        self.free_maps.push(m);
                        Kids::None
                    }
                    None => Kids::Map(m),
                }
            }
        };
        self.nodes[node as usize].kids = kids;
    }

    fn alloc_node(&mut self) -> u32 {
        match self.free_nodes.pop() {
            Some(n) => {
                self.nodes[n as usize] = Node::EMPTY;
                n
            }
            None => {
                let n = index(self.nodes.len());
                self.nodes.push(Node::EMPTY);
                n
            }
        }
    }
}

/// A slab index as `u32`; `u32::MAX` is reserved for `NONE`.
fn index(len: usize) -> u32 {
    u32::try_from(len)
        .ok()
        .filter(|&i| i != NONE)
        .expect("topic trie exceeds 2^32 - 1 nodes or values")
}

/// The live nodes at one level of a match: inline up to `FRONTIER_INLINE`, then on the heap.
struct Frontier {
    inline: [u32; FRONTIER_INLINE],
    len: usize,
    spill: Vec<u32>,
}

impl Frontier {
    fn new() -> Self {
        Self {
            inline: [0; FRONTIER_INLINE],
            len: 0,
            spill: Vec::new(),
        }
    }

    #[inline]
    fn push(&mut self, n: u32) {
        match self.inline.get_mut(self.len) {
            Some(slot) => {
                *slot = n;
                self.len += 1;
            }
            None => self.spill.push(n),
        }
    }

    #[inline]
    fn clear(&mut self) {
        self.len = 0;
        self.spill.clear();
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first (up to `FRONTIER_INLINE`) entries; the rest are in `spill`.
    #[inline]
    fn inline(&self) -> &[u32] {
        self.inline.get(..self.len).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topic::matches;

    fn matched(t: &FilterTrie<String>, topic: &str) -> Vec<String> {
        let mut out = Vec::new();
        t.for_each_match(topic, |v| out.push(v.clone()));
        out.sort();
        out
    }

    fn trie(filters: &[&str]) -> FilterTrie<String> {
        let mut t = FilterTrie::new(1);
        for f in filters {
            assert_eq!(t.insert(f, (*f).to_owned()), None);
        }
        t
    }

    #[test]
    fn update_or_remove_keeps_or_prunes_in_one_walk() {
        let mut t = trie(&["a/+/c", "a/b/#", "x"]);
        assert_eq!(
            t.update_or_remove("a/+/c", |v| {
                v.push('!');
                true
            }),
            Some(None)
        );
        assert_eq!(t.get("a/+/c").map(String::as_str), Some("a/+/c!"));
        assert_eq!(
            t.update_or_remove("a/b/#", |_| false),
            Some(Some("a/b/#".to_owned()))
        );
        assert_eq!(t.get("a/b/#"), None);
        assert_eq!(t.len(), 2);
        assert_eq!(t.update_or_remove("nope/#", |_| true), None);
        assert_eq!(matched(&t, "a/b/c"), vec!["a/+/c!".to_owned()]);
    }

    const SPEC_FILTERS: &[&str] = &[
        "sport/tennis/player1/#",
        "sport/#",
        "sport/+",
        "+/+",
        "/+",
        "+",
        "#",
        "+/monitor/Clients",
        "$SYS/#",
        "$SYS/monitor/+",
        "sport/tennis/+",
        "+/tennis/#",
        "a/#",
        "a",
        "",
        "/",
        "+/#",
    ];

    #[test]
    fn spec_examples_agree_with_naive() {
        let t = trie(SPEC_FILTERS);
        for topic in [
            "sport/tennis/player1",
            "sport/tennis/player1/ranking",
            "sport/tennis/player1/score/wimbledon",
            "sport",
            "sport/",
            "/finance",
            "$SYS/monitor/Clients",
            "$SYS",
            "$SYS/",
            "a",
            "a/b",
            "",
            "/",
            "//",
            "x",
        ] {
            let mut want: Vec<String> = SPEC_FILTERS
                .iter()
                .filter(|f| matches(f, topic))
                .map(|f| (*f).to_owned())
                .collect();
            want.sort();
            assert_eq!(matched(&t, topic), want, "topic {topic:?}");
        }
        let sys = matched(&t, "$SYS/monitor/Clients");
        assert_eq!(sys, ["$SYS/#", "$SYS/monitor/+"]);
        assert!(matched(&t, "sport").contains(&"sport/#".to_owned()));
        assert!(!matched(&t, "sport").contains(&"sport/+".to_owned()));
        assert!(matched(&t, "sport/").contains(&"sport/+".to_owned()));
    }

    #[test]
    fn get_entry_insert_remove() {
        let mut t: FilterTrie<u32> = FilterTrie::new(0);
        assert!(t.is_empty());
        *t.entry("a/+/#") += 1;
        *t.entry("a/+/#") += 1;
        *t.entry("a/+") += 5;
        assert_eq!(t.len(), 2);
        assert_eq!(t.get("a/+/#"), Some(&2));
        assert_eq!(t.get("a/+"), Some(&5));
        assert_eq!(t.get("a"), None);
        assert_eq!(t.get("a/#"), None);
        assert_eq!(t.get("a/b"), None);
        *t.get_mut("a/+").unwrap() = 6;
        assert_eq!(t.insert("a/+", 7), Some(6));
        assert_eq!(t.remove("a/b"), None);
        assert_eq!(t.remove("a"), None);
        assert_eq!(t.remove("a/+"), Some(7));
        assert_eq!(t.remove("a/+"), None);
        assert_eq!(t.len(), 1);
        assert_eq!(t.remove("a/+/#"), Some(2));
        assert!(t.is_empty());
        // Everything pruned: only the root is left, no edges, no levels.
        assert_eq!(t.nodes.len() - t.free_nodes.len(), 1);
        assert_eq!(t.maps.len(), t.free_maps.len());
        assert_eq!(t.levels.len(), 0);
    }

    #[test]
    fn remove_prunes_only_unused() {
        let mut t = trie(&["a/b/c", "a/b", "a/x/#", "#", "+/b"]);
        assert_eq!(t.remove("a/b/c").as_deref(), Some("a/b/c"));
        assert_eq!(t.levels.lookup("c"), None);
        assert!(t.levels.lookup("b").is_some());
        assert_eq!(matched(&t, "a/b"), ["#", "+/b", "a/b"]);
        assert_eq!(t.remove("a/b").as_deref(), Some("a/b"));
        // "b" is still used by "+/b".
        assert!(t.levels.lookup("b").is_some());
        assert_eq!(matched(&t, "a/b"), ["#", "+/b"]);
        assert_eq!(t.remove("+/b").as_deref(), Some("+/b"));
        assert_eq!(t.levels.lookup("b"), None);
        assert_eq!(matched(&t, "a/x"), ["#", "a/x/#"]);
        assert_eq!(t.remove("#").as_deref(), Some("#"));
        assert_eq!(t.remove("a/x/#").as_deref(), Some("a/x/#"));
        assert!(t.is_empty());
        assert_eq!(t.levels.len(), 0);
        assert!(t.iter().next().is_none());
    }

    #[test]
    fn iter_rebuilds_patterns() {
        let filters = ["#", "+", "a/#", "a", "", "/", "+/+/x", "$SYS/#", "a/b/+"];
        let t = trie(&filters);
        let mut want: Vec<&str> = filters.to_vec();
        want.sort_unstable();
        let got: Vec<(String, String)> = t.iter().map(|(p, v)| (p, v.clone())).collect();
        assert_eq!(got.len(), filters.len());
        for ((p, v), w) in got.iter().zip(want) {
            assert_eq!(p, w);
            assert_eq!(v, w);
        }
    }

    #[test]
    fn visit_order_is_deterministic() {
        let build = |seed| {
            let mut t = FilterTrie::new(seed);
            for (i, f) in ["#", "a/+", "+/b", "a/b", "a/#", "+/+", "+/#"]
                .iter()
                .enumerate()
            {
                t.insert(f, i);
            }
            t.remove("a/b");
            t.insert("a/b", 9);
            let mut order = Vec::new();
            t.for_each_match("a/b", |v| order.push(*v));
            order
        };
        let first = build(1);
        assert_eq!(first.len(), 7);
        assert_eq!(first, build(1));
        // Independent of the seed too: the walk never iterates a hash table.
        assert_eq!(first, build(42));
    }

    #[test]
    fn wide_frontier_spills() {
        // 2^5 = 32 live branches at the last level: more than the inline frontier.
        let mut t = FilterTrie::new(3);
        let mut n = 0;
        for mask in 0..32u32 {
            let f: Vec<&str> = (0..5)
                .map(|i| if mask & (1 << i) != 0 { "+" } else { "x" })
                .collect();
            t.insert(&f.join("/"), mask);
            n += 1;
        }
        let mut seen = Vec::new();
        t.for_each_match("x/x/x/x/x", |v| seen.push(*v));
        seen.sort_unstable();
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
        let mut none = 0;
        t.for_each_match("x/x/x/x", |_| none += 1);
        assert_eq!(none, 0);
    }

    #[test]
    fn odd_inputs_do_not_panic() {
        let mut t = FilterTrie::new(0);
        for p in ["a/#/b", "#/#", "++", "a\0", "//#", "/#", "#"] {
            t.insert(p, p.to_owned());
            assert_eq!(t.get(p).map(String::as_str), Some(p));
        }
        for topic in ["", "#", "+", "a/#/b", "//", "$", "$/#"] {
            t.for_each_match(topic, |_| {});
        }
        let deep = "x/".repeat(40_000);
        t.insert(&deep, "deep".into());
        assert!(t.matches_any(&deep));
        assert_eq!(t.iter().filter(|(p, _)| *p == deep).count(), 1);
        for p in ["a/#/b", "#/#", "++", "a\0", "//#", "/#", "#", &deep] {
            assert!(t.remove(p).is_some(), "{p}");
        }
        assert!(t.is_empty());
        assert_eq!(t.levels.len(), 0);
    }

    #[test]
    fn child_representations() {
        let mut t = FilterTrie::new(9);
        let kids = |t: &FilterTrie<u32>| t.nodes[t.find_node("p").unwrap() as usize].kids;
        t.insert("p/0", 0);
        assert!(matches!(kids(&t), Kids::One(..)));
        for i in 1..40 {
            t.insert(&format!("p/{i}"), i);
        }
        let Kids::Map(m) = kids(&t) else {
            panic!("expected a map")
        };
        assert!(matches!(t.maps[m as usize], ChildMap::Many(_)));
        for i in 0..40 {
            let mut seen = Vec::new();
            t.for_each_match(&format!("p/{i}"), |v| seen.push(*v));
            assert_eq!(seen, [i]);
        }
        for i in 0..38 {
            assert_eq!(t.remove(&format!("p/{i}")), Some(i));
            if i == 35 {
                assert!(matches!(t.maps[m as usize], ChildMap::Few(_)));
            }
        }
        assert!(matches!(kids(&t), Kids::Map(_)));
        t.remove("p/38");
        assert_eq!(
            kids(&t),
            Kids::One(t.levels.lookup("39").unwrap(), t.find_node("p/39").unwrap())
        );
        assert_eq!(t.free_maps, [m]);
        t.insert("p/x", 1);
        assert_eq!(kids(&t), Kids::Map(m), "map slot reused");
        t.remove("p/x");
        t.remove("p/39");
        assert!(t.is_empty());
        assert_eq!(t.nodes.len() - t.free_nodes.len(), 1);
    }

    #[test]
    fn slots_are_reused() {
        let mut t = FilterTrie::new(0);
        for round in 0..3 {
            for i in 0..100 {
                t.insert(&format!("r/{i}/#"), round);
            }
            for i in 0..100 {
                assert_eq!(t.remove(&format!("r/{i}/#")), Some(round));
            }
        }
        assert!(t.nodes.len() <= 102);
        assert!(t.values.len() <= 100);
        assert!(t.heap_bytes_estimate() > 0);
        t.shrink_to_fit();
    }
}
