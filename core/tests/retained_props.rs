//! Last-writer-wins laws of the retained replication: merging writes is commutative,
//! associative and idempotent, so replicas that saw the same writes in any order, with
//! duplicates, agree; deletes are never undone by older writes.

use meridian_core::retained::{Hlc, LwwMap, Stamp};
use meridian_core::routes::NodeId;
use proptest::prelude::*;

type Write = (String, Stamp, Option<u8>);

fn write() -> impl Strategy<Value = Write> {
    (0..4u8, 0..6u64, 0..3u32, 0..3u8).prop_map(|(topic, wall_ms, logical, node)| {
        // One stamp is one write: its value (or delete) follows from the stamp.
        let key = (wall_ms as u8) ^ ((logical as u8) << 3) ^ (node << 5);
        let value = (!key.is_multiple_of(3)).then_some(key);
        (
            format!("t/{topic}"),
            Stamp {
                hlc: Hlc { wall_ms, logical },
                node: NodeId::new(&format!("n{node}")).unwrap(),
            },
            value,
        )
    })
}

fn state(m: &LwwMap<u8>) -> Vec<(String, Stamp, Option<u8>)> {
    m.iter()
        .map(|(t, e)| (t.to_string(), e.stamp.clone(), e.value))
        .collect()
}

fn merged(writes: &[Write]) -> LwwMap<u8> {
    let mut m = LwwMap::new();
    for (t, s, v) in writes {
        m.apply(t, s.clone(), *v);
    }
    m
}

proptest! {
    #[test]
    fn any_order_any_duplicates_same_state(
        writes in prop::collection::vec(write(), 0..30),
        order in prop::collection::vec(any::<prop::sample::Index>(), 0..60),
    ) {
        let a = merged(&writes);
        let mut shuffled: Vec<Write> = if writes.is_empty() {
            Vec::new()
        } else {
            order.iter().map(|i| writes[i.index(writes.len())].clone()).collect()
        };
        shuffled.extend(writes.iter().rev().cloned());
        let b = merged(&shuffled);
        prop_assert_eq!(state(&a), state(&b));
        prop_assert_eq!(a.digest(), b.digest());
        // Each topic holds its greatest stamp.
        for (t, e) in a.iter() {
            let best = writes.iter().filter(|w| *w.0 == **t).map(|w| w.1.clone()).max();
            prop_assert_eq!(Some(e.stamp.clone()), best);
        }
    }

    #[test]
    fn merging_replicas_is_commutative_and_associative(
        x in prop::collection::vec(write(), 0..15),
        y in prop::collection::vec(write(), 0..15),
        z in prop::collection::vec(write(), 0..15),
    ) {
        let merge = |into: &mut LwwMap<u8>, from: &LwwMap<u8>| {
            for (t, e) in from.iter() {
                into.apply(t, e.stamp.clone(), e.value);
            }
        };
        let (mx, my, mz) = (merged(&x), merged(&y), merged(&z));
        // (x + y) + z
        let mut left = mx.clone();
        merge(&mut left, &my);
        merge(&mut left, &mz);
        // x + (z + y)
        let mut zy = mz.clone();
        merge(&mut zy, &my);
        let mut right = mx.clone();
        merge(&mut right, &zy);
        // z + y + x, and merging twice
        let mut other = mz.clone();
        merge(&mut other, &my);
        merge(&mut other, &mx);
        merge(&mut other, &mx);
        prop_assert_eq!(state(&left), state(&right));
        prop_assert_eq!(state(&left), state(&other));
        prop_assert_eq!(left.digest(), other.digest());
    }
}
