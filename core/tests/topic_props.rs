//! The tries against the naive matcher, on random filter and topic sets.
//!
//! Case counts follow proptest's default (256); raise them with `PROPTEST_CASES`.

use std::collections::{BTreeMap, BTreeSet};

use meridian_core::topic::{FilterTrie, TopicFilter, TopicName, TopicTree, matches};
use proptest::prelude::*;

/// A valid filter pattern: levels from a small alphabet, cut after the first '#'.
fn filter() -> impl Strategy<Value = String> + Clone {
    let level = prop::sample::select(vec!["", "a", "b", "$sys", "+", "#"]);
    prop::collection::vec(level, 1..5)
        .prop_map(|mut levels| {
            if let Some(i) = levels.iter().position(|l| *l == "#") {
                levels.truncate(i + 1);
            }
            levels.join("/")
        })
        .prop_filter("filters are non-empty", |f| !f.is_empty())
}

/// A topic name: levels from the same alphabet without wildcards.
fn topic() -> impl Strategy<Value = String> + Clone {
    let level = prop::sample::select(vec!["", "a", "b", "$sys", "c"]);
    prop::collection::vec(level, 1..5)
        .prop_map(|levels| levels.join("/"))
        .prop_filter("topics are non-empty", |t| !t.is_empty())
}

/// The values `trie` visits for `topic`, sorted; fails if one is visited twice.
fn trie_matches(trie: &FilterTrie<String>, topic: &str) -> Result<Vec<String>, TestCaseError> {
    let mut seen = Vec::new();
    trie.for_each_match(topic, |v| seen.push(v.clone()));
    let n = seen.len();
    seen.sort();
    seen.dedup();
    prop_assert_eq!(seen.len(), n, "a value was visited twice for {:?}", topic);
    Ok(seen)
}

fn tree_matches(tree: &TopicTree<String>, filter: &str) -> Result<Vec<String>, TestCaseError> {
    let mut seen = Vec::new();
    tree.for_each_match(filter, |v| seen.push(v.clone()));
    let n = seen.len();
    seen.sort();
    seen.dedup();
    prop_assert_eq!(seen.len(), n, "a value was visited twice for {:?}", filter);
    Ok(seen)
}

fn naive<'a>(
    stored: impl IntoIterator<Item = &'a String>,
    keep: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut v: Vec<String> = stored.into_iter().filter(|s| keep(s)).cloned().collect();
    v.sort();
    v
}

#[derive(Debug, Clone)]
enum Op {
    Insert(String),
    Remove(String),
}

fn ops(item: impl Strategy<Value = String> + Clone) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => item.clone().prop_map(Op::Insert),
        2 => item.prop_map(Op::Remove),
    ];
    prop::collection::vec(op, 0..60)
}

proptest! {
    #[test]
    fn topic_generators_make_valid_input(f in filter(), t in topic()) {
        prop_assert!(TopicFilter::new(f.clone()).is_ok(), "{:?}", f);
        prop_assert!(TopicName::new(t.clone()).is_ok(), "{:?}", t);
    }

    #[test]
    fn topic_trie_matches_like_naive(
        filters in prop::collection::btree_set(filter(), 0..40),
        topics in prop::collection::vec(topic(), 1..20),
        seed in any::<u64>(),
    ) {
        let mut trie = FilterTrie::new(seed);
        for f in &filters {
            prop_assert_eq!(trie.insert(f, f.clone()), None);
        }
        prop_assert_eq!(trie.len(), filters.len());
        for t in &topics {
            prop_assert_eq!(trie_matches(&trie, t)?, naive(&filters, |f| matches(f, t)), "topic {:?}", t);
        }
        let listed: Vec<String> = trie.iter().map(|(p, v)| { assert_eq!(&p, v); p }).collect();
        prop_assert_eq!(listed, filters.iter().cloned().collect::<Vec<_>>());
    }

    #[test]
    fn topic_trie_after_inserts_and_removes(
        ops in ops(filter()),
        topics in prop::collection::vec(topic(), 1..20),
        seed in any::<u64>(),
    ) {
        let mut trie = FilterTrie::new(seed);
        let mut model: BTreeMap<String, u32> = BTreeMap::new();
        let mut removed = BTreeSet::new();
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Insert(f) => {
                    let i = u32::try_from(i).unwrap();
                    *trie.entry(f) += i;
                    *model.entry(f.clone()).or_default() += i;
                    removed.remove(f);
                }
                Op::Remove(f) => {
                    prop_assert_eq!(trie.remove(f), model.remove(f));
                    removed.insert(f.clone());
                }
            }
            prop_assert_eq!(trie.len(), model.len());
        }
        for (f, v) in &model {
            prop_assert_eq!(trie.get(f), Some(v));
        }
        for f in &removed {
            prop_assert_eq!(trie.get(f), None);
        }
        // Values are the filter's text again, so matches can be compared by name.
        let mut named = FilterTrie::new(seed);
        for op in &ops {
            match op {
                Op::Insert(f) => { named.insert(f, f.clone()); }
                Op::Remove(f) => { named.remove(f); }
            }
        }
        let stored: Vec<String> = model.keys().cloned().collect();
        for t in &topics {
            let got = trie_matches(&named, t)?;
            prop_assert_eq!(&got, &naive(&stored, |f| matches(f, t)), "topic {:?}", t);
            for r in &removed {
                prop_assert!(!got.contains(r), "removed {:?} matched {:?}", r, t);
            }
        }
        // Remove everything: the trie is empty and matches nothing.
        for f in &stored {
            prop_assert!(named.remove(f).is_some());
        }
        prop_assert!(named.is_empty());
        for t in &topics {
            prop_assert!(!named.matches_any(t));
        }
    }

    #[test]
    fn topic_trie_visit_order_is_replayable(ops in ops(filter()), t in topic()) {
        let run = |seed| {
            let mut trie = FilterTrie::new(seed);
            for (i, op) in ops.iter().enumerate() {
                match op {
                    Op::Insert(f) => { trie.insert(f, i); }
                    Op::Remove(f) => { trie.remove(f); }
                }
            }
            let mut order = Vec::new();
            trie.for_each_match(&t, |v| order.push(*v));
            order
        };
        let first = run(7);
        prop_assert_eq!(&first, &run(7));
        prop_assert_eq!(&first, &run(8));
    }

    #[test]
    fn topic_tree_matches_like_naive(
        ops in ops(topic()),
        filters in prop::collection::vec(filter(), 1..20),
        seed in any::<u64>(),
    ) {
        let mut tree = TopicTree::new(seed);
        let mut model: BTreeSet<String> = BTreeSet::new();
        for op in &ops {
            match op {
                Op::Insert(t) => {
                    prop_assert_eq!(tree.insert(t, t.clone()).is_some(), !model.insert(t.clone()));
                }
                Op::Remove(t) => {
                    prop_assert_eq!(tree.remove(t).is_some(), model.remove(t));
                }
            }
            prop_assert_eq!(tree.len(), model.len());
        }
        for t in &model {
            prop_assert_eq!(tree.get(t), Some(t));
        }
        for f in &filters {
            prop_assert_eq!(tree_matches(&tree, f)?, naive(&model, |t| matches(f, t)), "filter {:?}", f);
        }
        let listed: Vec<String> = tree.iter().map(|(k, _)| k).collect();
        prop_assert_eq!(listed, model.iter().cloned().collect::<Vec<_>>());

        // An expiry-like sweep: drop topics whose text has an odd length.
        tree.retain(|v| v.len() % 2 == 0);
        model.retain(|t| t.len() % 2 == 0);
        prop_assert_eq!(tree.len(), model.len());
        for f in &filters {
            prop_assert_eq!(tree_matches(&tree, f)?, naive(&model, |t| matches(f, t)), "filter {:?}", f);
        }
    }

    #[test]
    fn topic_arbitrary_strings_never_panic(
        s in "[ab/+#$\\x00]{0,12}",
        others in prop::collection::vec("[ab/+#$]{0,8}", 0..8),
    ) {
        let f = TopicFilter::new(s.clone());
        let _ = TopicName::new(s.clone());
        if let Ok(f) = &f {
            prop_assert!(f.pattern().len() <= f.as_str().len());
            prop_assert!(!f.pattern().is_empty());
        }
        let mut trie = FilterTrie::new(0);
        let mut tree = TopicTree::new(0);
        for o in &others {
            trie.insert(o, ());
            tree.insert(o, ());
        }
        trie.for_each_match(&s, |_| {});
        tree.for_each_match(&s, |_| {});
        let _ = matches(&s, &s);
        for o in &others {
            prop_assert!(trie.remove(o).is_some() || trie.get(o).is_none());
            tree.remove(o);
        }
        prop_assert!(trie.is_empty());
        prop_assert!(tree.is_empty());
    }
}
