//! [`TopicTree`]: topic names in, matched by a topic filter. Retained messages.

use core::fmt;
use std::collections::BTreeMap;

use super::interner::{Interner, LevelId};
use super::levels::Levels;

const NONE: u32 = u32::MAX;
const ROOT: u32 = 0;
/// Above this many children a node switches from a sorted `Vec` to a `BTreeMap`.
const SMALL_CHILDREN: usize = 16;

/// Children by level id, in ascending id order either way.
#[derive(Debug, Clone)]
enum Children {
    Small(Vec<(LevelId, u32)>),
    Large(BTreeMap<LevelId, u32>),
}

impl Children {
    const EMPTY: Children = Children::Small(Vec::new());

    fn get(&self, id: LevelId) -> Option<u32> {
        match self {
            Children::Small(v) => v
                .binary_search_by_key(&id, |e| e.0)
                .ok()
                .and_then(|i| v.get(i))
                .map(|e| e.1),
            Children::Large(m) => m.get(&id).copied(),
        }
    }

    fn insert(&mut self, id: LevelId, child: u32) {
        match self {
            Children::Small(v) => {
                match v.binary_search_by_key(&id, |e| e.0) {
                    Ok(i) => v[i].1 = child,
                    Err(i) => v.insert(i, (id, child)),
                }
                if v.len() > SMALL_CHILDREN {
                    *self = Children::Large(v.drain(..).collect());
                }
            }
            Children::Large(m) => {
                m.insert(id, child);
            }
        }
    }

    fn remove(&mut self, id: LevelId) {
        match self {
            Children::Small(v) => {
                if let Ok(i) = v.binary_search_by_key(&id, |e| e.0) {
                    v.remove(i);
                }
            }
            Children::Large(m) => {
                m.remove(&id);
                if m.len() <= SMALL_CHILDREN / 2 {
                    *self = Children::Small(core::mem::take(m).into_iter().collect());
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Children::Small(v) => v.is_empty(),
            Children::Large(m) => m.is_empty(),
        }
    }

    /// (level, child) in ascending level-id order.
    fn iter(&self) -> ChildIter<'_> {
        match self {
            Children::Small(v) => ChildIter::Small(v.iter()),
            Children::Large(m) => ChildIter::Large(m.iter()),
        }
    }
}

enum ChildIter<'a> {
    Small(core::slice::Iter<'a, (LevelId, u32)>),
    Large(std::collections::btree_map::Iter<'a, LevelId, u32>),
}

impl Iterator for ChildIter<'_> {
    type Item = (LevelId, u32);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            ChildIter::Small(i) => i.next().copied(),
            ChildIter::Large(i) => i.next().map(|(&l, &c)| (l, c)),
        }
    }
}

impl DoubleEndedIterator for ChildIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            ChildIter::Small(i) => i.next_back().copied(),
            ChildIter::Large(i) => i.next_back().map(|(&l, &c)| (l, c)),
        }
    }
}

#[derive(Debug, Clone)]
struct Node<V> {
    value: Option<V>,
    children: Children,
    parent: u32,
    /// The level leading here from `parent` (meaningless for the root).
    level: LevelId,
}

impl<V> Node<V> {
    fn new(parent: u32, level: LevelId) -> Self {
        Self {
            value: None,
            children: Children::EMPTY,
            parent,
            level,
        }
    }
}

/// A filter level resolved against the interner.
#[derive(Debug, Clone, Copy)]
enum FilterLevel {
    Literal(LevelId),
    Plus,
    Hash,
}

/// A set of topic names with a value each, queried with a topic filter: the retained-message
/// store (MQTT 5.0 §3.3.1.3, §4.7).
///
/// Topic levels are literal (a "+" or "#" in a stored topic is just text). Level strings are
/// interned with reference counts; nodes live in a slab with a free list and parent links, so
/// nothing recurses (a 64 KiB topic of 32k levels is fine). Children are kept in ascending
/// level-id order, so visit order is a pure function of the sequence of operations.
#[derive(Clone)]
pub struct TopicTree<V> {
    levels: Interner,
    nodes: Vec<Node<V>>,
    free_nodes: Vec<u32>,
    len: usize,
}

impl<V> fmt::Debug for TopicTree<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopicTree")
            .field("len", &self.len)
            .field("nodes", &(self.nodes.len() - self.free_nodes.len()))
            .finish_non_exhaustive()
    }
}

impl<V> TopicTree<V> {
    /// An empty tree whose level interner hashes with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            levels: Interner::new(seed, true),
            nodes: vec![Node::new(NONE, LevelId(NONE))],
            free_nodes: Vec::new(),
            len: 0,
        }
    }

    /// Number of stored topics.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no topic is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Stores `value` under `topic`, returning the value it replaces.
    ///
    /// # Panics
    /// Only if the tree would exceed 2^32 - 1 nodes or distinct levels.
    pub fn insert(&mut self, topic: &str, value: V) -> Option<V> {
        let mut node = ROOT;
        for level in Levels::new(topic) {
            node = self.child_or_insert(node, level);
        }
        let old = self.nodes[node as usize].value.replace(value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// The value stored under `topic`.
    pub fn get(&self, topic: &str) -> Option<&V> {
        let node = self.find(topic)?;
        self.nodes[node as usize].value.as_ref()
    }

    /// The value stored under `topic`, mutably.
    pub fn get_mut(&mut self, topic: &str) -> Option<&mut V> {
        let node = self.find(topic)?;
        self.nodes[node as usize].value.as_mut()
    }

    /// Removes `topic`, returning its value; prunes empty nodes and unused level strings.
    pub fn remove(&mut self, topic: &str) -> Option<V> {
        let node = self.find(topic)?;
        let value = self.nodes[node as usize].value.take()?;
        self.len -= 1;
        self.prune(node);
        Some(value)
    }

    /// Keeps only the entries for which `keep` returns true (e.g. an expiry sweep), visiting
    /// them in slab order.
    pub fn retain(&mut self, mut keep: impl FnMut(&mut V) -> bool) {
        for n in 0..self.nodes.len() {
            let Some(v) = self.nodes[n].value.as_mut() else {
                continue;
            };
            if keep(v) {
                continue;
            }
            self.nodes[n].value = None;
            self.len -= 1;
            // `n` < nodes.len() <= u32::MAX: the slab never grows past u32 indices.
            self.prune(n as u32);
        }
    }

    /// Calls `f` with the value of every stored topic that the filter `filter` (a pattern,
    /// without `$share/{group}/`) matches, each once. '+' visits every child of a level, '#'
    /// the whole subtree including its parent level's own value; a first-level wildcard skips
    /// topics starting with '$'. Depth-first, children in ascending level-id order.
    pub fn for_each_match(&self, filter: &str, mut f: impl FnMut(&V)) {
        let mut levels = Vec::new();
        for level in Levels::new(filter) {
            match level {
                "+" => levels.push(FilterLevel::Plus),
                "#" => {
                    // Like the naive matcher, '#' matches everything below, wherever it is.
                    levels.push(FilterLevel::Hash);
                    break;
                }
                _ => match self.levels.lookup(level) {
                    Some(id) => levels.push(FilterLevel::Literal(id)),
                    // No stored topic has this level: nothing can match.
                    None => return,
                },
            }
        }
        // (node, number of filter levels consumed); `SUBTREE` marks "everything below".
        const SUBTREE: usize = usize::MAX;
        let mut stack: Vec<(u32, usize)> = vec![(ROOT, 0)];
        while let Some((n, depth)) = stack.pop() {
            let node = &self.nodes[n as usize];
            let skip_dollar = |id: LevelId| depth == 0 && self.levels.is_dollar(id);
            if depth == SUBTREE {
                if let Some(v) = &node.value {
                    f(v);
                }
                stack.extend(node.children.iter().rev().map(|(_, c)| (c, SUBTREE)));
                continue;
            }
            match levels.get(depth) {
                None => {
                    if let Some(v) = &node.value {
                        f(v);
                    }
                }
                Some(FilterLevel::Literal(id)) => {
                    if let Some(c) = node.children.get(*id) {
                        stack.push((c, depth + 1));
                    }
                }
                Some(FilterLevel::Plus) => stack.extend(
                    node.children
                        .iter()
                        .rev()
                        .filter(|&(id, _)| !skip_dollar(id))
                        .map(|(_, c)| (c, depth + 1)),
                ),
                Some(FilterLevel::Hash) => {
                    // "a/#" matches "a" (the root never holds a value).
                    if let Some(v) = &node.value {
                        f(v);
                    }
                    stack.extend(
                        node.children
                            .iter()
                            .rev()
                            .filter(|&(id, _)| !skip_dollar(id))
                            .map(|(_, c)| (c, SUBTREE)),
                    );
                }
            }
        }
    }

    /// All stored topics with their values, sorted by topic. Rebuilds the topics.
    pub fn iter(&self) -> impl Iterator<Item = (String, &V)> {
        let mut out = Vec::with_capacity(self.len);
        // Depth-first with one path buffer: (node, length of its parent's path). Everything
        // popped between a node and its later siblings lies below it, so the buffer's prefix
        // is always the parent's path.
        let mut path = String::new();
        let mut stack: Vec<(u32, Option<usize>)> = Vec::new();
        let root = &self.nodes[ROOT as usize];
        stack.extend(root.children.iter().rev().map(|(_, c)| (c, None)));
        while let Some((n, parent_len)) = stack.pop() {
            let node = &self.nodes[n as usize];
            match parent_len {
                None => path.clear(),
                Some(len) => {
                    path.truncate(len);
                    path.push('/');
                }
            }
            path.push_str(self.levels.name(node.level));
            if let Some(v) = &node.value {
                out.push((path.clone(), v));
            }
            let len = path.len();
            stack.extend(node.children.iter().rev().map(|(_, c)| (c, Some(len))));
        }
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        out.into_iter()
    }

    /// Estimated heap bytes of the tree's own structures (not counting heap owned by the
    /// values themselves).
    pub fn heap_bytes_estimate(&self) -> usize {
        let children: usize = self
            .nodes
            .iter()
            .map(|n| match &n.children {
                Children::Small(v) => v.capacity() * size_of::<(LevelId, u32)>(),
                // B-tree leaves hold up to 11 entries; assume them two-thirds full.
                Children::Large(m) => m.len() * size_of::<(LevelId, u32)>() * 3 / 2 + 64,
            })
            .sum();
        self.levels.heap_bytes()
            + self.nodes.capacity() * size_of::<Node<V>>()
            + self.free_nodes.capacity() * size_of::<u32>()
            + children
    }

    fn find(&self, topic: &str) -> Option<u32> {
        let mut node = ROOT;
        for level in Levels::new(topic) {
            let id = self.levels.lookup(level)?;
            node = self.nodes[node as usize].children.get(id)?;
        }
        Some(node)
    }

    fn child_or_insert(&mut self, node: u32, level: &str) -> u32 {
        if let Some(id) = self.levels.lookup(level)
            && let Some(child) = self.nodes[node as usize].children.get(id)
        {
            return child;
        }
        let id = self.levels.acquire(level);
        let child = match self.free_nodes.pop() {
            Some(c) => {
                self.nodes[c as usize] = Node::new(node, id);
                c
            }
            None => {
                let c = u32::try_from(self.nodes.len())
                    .ok()
                    .filter(|&c| c != NONE)
                    .expect("topic tree exceeds 2^32 - 1 nodes");
                self.nodes.push(Node::new(node, id));
                c
            }
        };
        self.nodes[node as usize].children.insert(id, child);
        child
    }

    /// Frees `node` and its ancestors while they hold neither a value nor children.
    fn prune(&mut self, mut node: u32) {
        while node != ROOT {
            let n = &mut self.nodes[node as usize];
            if n.value.is_some() || !n.children.is_empty() {
                return;
            }
            let (parent, level) = (n.parent, n.level);
            n.children = Children::EMPTY;
            n.parent = NONE;
            self.nodes[parent as usize].children.remove(level);
            self.levels.release(level);
            self.free_nodes.push(node);
            node = parent;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topic::matches;

    const TOPICS: &[&str] = &[
        "sport/tennis/player1",
        "sport/tennis/player1/ranking",
        "sport/tennis/player1/score/wimbledon",
        "sport",
        "sport/",
        "/finance",
        "$SYS/monitor/Clients",
        "$SYS",
        "a",
        "a/b",
        "",
        "/",
    ];

    fn tree() -> TopicTree<String> {
        let mut t = TopicTree::new(5);
        for topic in TOPICS {
            assert_eq!(t.insert(topic, (*topic).to_owned()), None);
        }
        t
    }

    fn matched(t: &TopicTree<String>, filter: &str) -> Vec<String> {
        let mut out = Vec::new();
        t.for_each_match(filter, |v| out.push(v.clone()));
        out.sort();
        out
    }

    #[test]
    fn spec_examples_agree_with_naive() {
        let t = tree();
        for filter in [
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
            "+/#",
            "a/#",
            "",
            "/",
            "nope/#",
            "+/nope",
        ] {
            let mut want: Vec<String> = TOPICS
                .iter()
                .filter(|topic| matches(filter, topic))
                .map(|topic| (*topic).to_owned())
                .collect();
            want.sort();
            assert_eq!(matched(&t, filter), want, "filter {filter:?}");
        }
        assert_eq!(
            matched(&t, "sport/tennis/player1/#"),
            [
                "sport/tennis/player1",
                "sport/tennis/player1/ranking",
                "sport/tennis/player1/score/wimbledon"
            ]
        );
        assert!(!matched(&t, "#").iter().any(|s| s.starts_with('$')));
        assert_eq!(matched(&t, "$SYS/#"), ["$SYS", "$SYS/monitor/Clients"]);
    }

    #[test]
    fn insert_get_remove_prune() {
        let mut t = tree();
        assert_eq!(t.len(), TOPICS.len());
        assert_eq!(t.insert("a", "A".into()).as_deref(), Some("a"));
        assert_eq!(t.get("a").map(String::as_str), Some("A"));
        t.get_mut("a").unwrap().push('!');
        assert_eq!(t.get("a").map(String::as_str), Some("A!"));
        assert_eq!(t.get("sport/tennis"), None);
        assert_eq!(t.remove("sport/tennis"), None);
        assert_eq!(t.remove("nope"), None);
        for topic in TOPICS {
            assert!(t.remove(topic).is_some(), "{topic}");
            assert_eq!(t.get(topic), None);
        }
        assert!(t.is_empty());
        assert_eq!(t.levels.len(), 0);
        assert_eq!(t.nodes.len() - t.free_nodes.len(), 1);
        assert!(t.heap_bytes_estimate() > 0);
    }

    #[test]
    fn retain_sweeps_and_prunes() {
        let mut t = TopicTree::new(0);
        for i in 0..100u32 {
            t.insert(&format!("r/{i}/x"), i);
        }
        t.retain(|v| {
            *v += 1000;
            *v % 2 == 0
        });
        assert_eq!(t.len(), 50);
        assert_eq!(t.get("r/2/x"), Some(&1002));
        assert_eq!(t.get("r/3/x"), None);
        assert_eq!(t.levels.lookup("3"), None);
        let mut n = 0;
        t.for_each_match("r/+/x", |_| n += 1);
        assert_eq!(n, 50);
        t.retain(|_| false);
        assert!(t.is_empty());
        assert_eq!(t.levels.len(), 0);
    }

    #[test]
    fn iter_is_sorted_and_complete() {
        let t = tree();
        let got: Vec<String> = t
            .iter()
            .map(|(k, v)| {
                assert_eq!(&k, v);
                k
            })
            .collect();
        let mut want: Vec<String> = TOPICS.iter().map(|s| (*s).to_owned()).collect();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn many_children_switch_representation() {
        let mut t = TopicTree::new(0);
        for i in 0..100u32 {
            t.insert(&format!("c/{i}"), i);
        }
        assert!(matches!(
            t.nodes[t.find("c").unwrap() as usize].children,
            Children::Large(_)
        ));
        let mut order = Vec::new();
        t.for_each_match("c/+", |v| order.push(*v));
        // Level ids were handed out in insertion order.
        assert_eq!(order, (0..100).collect::<Vec<_>>());
        for i in 5..100u32 {
            t.remove(&format!("c/{i}"));
        }
        assert!(matches!(
            t.nodes[t.find("c").unwrap() as usize].children,
            Children::Small(_)
        ));
        let mut order = Vec::new();
        t.for_each_match("c/#", |v| order.push(*v));
        assert_eq!(order, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn deep_topic_does_not_recurse() {
        let mut t = TopicTree::new(0);
        let deep = "x/".repeat(40_000);
        t.insert(&deep, 1);
        let mut n = 0;
        t.for_each_match("#", |_| n += 1);
        assert_eq!(n, 1);
        assert_eq!(t.iter().count(), 1);
        assert_eq!(t.remove(&deep), Some(1));
        assert!(t.is_empty());
        t.insert(&deep, 2);
        drop(t);
    }
}
