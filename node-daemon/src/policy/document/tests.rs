//! The document's tests: each merge rule, bounds, history, compaction, and a property
//! test of convergence.

use std::sync::OnceLock;

use proptest::prelude::*;

use super::*;

/// Three valid password hashes (Argon2 is slow: made once).
fn hashes() -> &'static [String; 3] {
    static H: OnceLock<[String; 3]> = OnceLock::new();
    H.get_or_init(|| ["one", "two", "three"].map(|p| crate::passwd::hash(p.as_bytes()).unwrap()))
}

fn actor(n: u8) -> ActorId {
    ActorId::from(&[n; 16][..])
}

fn by(who: &str) -> Author {
    Author {
        by: who.to_owned(),
        node: format!("node-{who}"),
        region: "eu".to_owned(),
    }
}

fn edit(doc: &mut PolicyDoc, e: Edit, t: i64) -> Result<bool, EditError> {
    doc.apply(&[e], &by("ops"), t)
}

/// Each replica gets every change of the other.
fn merge(a: &mut PolicyDoc, b: &mut PolicyDoc) {
    a.doc.merge(&mut b.doc).unwrap();
    b.doc.merge(&mut a.doc).unwrap();
}

fn rule(permission: &str, action: &str, topic: &str) -> RuleEntry {
    RuleEntry {
        permission: permission.to_owned(),
        action: action.to_owned(),
        topic: topic.to_owned(),
        user: None,
        client_id: None,
    }
}

fn user_set(name: &str, i: usize) -> Edit {
    Edit::UserSet {
        name: name.to_owned(),
        hash: hashes()[i].clone(),
        claim_key: None,
    }
}

#[test]
fn every_node_starts_from_the_same_genesis() {
    let mut a = PolicyDoc::genesis(actor(1));
    let mut b = PolicyDoc::genesis(actor(2));
    assert_eq!(a.heads(), b.heads());
    assert_eq!(a.policy(), Policy::default());
    // Saved and loaded, it is still a policy document; any other document is not.
    let loaded = PolicyDoc::load(&a.save(), actor(3)).unwrap();
    assert_eq!(loaded.policy(), a.policy());
    let mut other = AutoCommit::new();
    other.put(ROOT, "users", "x").unwrap();
    assert!(PolicyDoc::load(&other.save(), actor(3)).is_err());
    assert!(PolicyDoc::load(b"garbage", actor(3)).is_err());
}

#[test]
fn edits_are_checked_and_no_op_edits_write_nothing() {
    let mut d = PolicyDoc::genesis(actor(1));
    assert!(edit(&mut d, user_set("alice", 0), 1).unwrap());
    assert!(!edit(&mut d, user_set("alice", 0), 2).unwrap());
    assert_eq!(d.history().len(), 1);
    for bad in [
        Edit::UserSet {
            name: "a:b".into(),
            hash: hashes()[0].clone(),
            claim_key: None,
        },
        Edit::UserSet {
            name: "bob".into(),
            hash: "plain".into(),
            claim_key: None,
        },
        Edit::AclAdd {
            rule: rule("maybe", "all", "x"),
            before: None,
        },
        Edit::AclAdd {
            rule: rule("deny", "all", "a/#/b"),
            before: None,
        },
        Edit::TokenSet {
            kind: TokenKind::Admin,
            name: "ops".into(),
            hash: "abc".into(),
        },
        Edit::ResidencySet {
            filter: "eu/#".into(),
            regions: vec![],
        },
    ] {
        assert!(
            matches!(edit(&mut d, bad.clone(), 3), Err(EditError::Invalid(_))),
            "{bad:?}"
        );
    }
    assert!(matches!(
        edit(&mut d, Edit::UserRemove { name: "bob".into() }, 4),
        Err(EditError::NotFound(_))
    ));
    // A refused edit among others writes none of them.
    let r = d.apply(
        &[
            user_set("carol", 1),
            Edit::UserSet {
                name: String::new(),
                hash: hashes()[0].clone(),
                claim_key: None,
            },
        ],
        &by("ops"),
        5,
    );
    assert!(r.is_err());
    assert!(!d.policy().users.contains_key("carol"));
    // Nor does one refused for removing what is not there, even after a valid edit.
    let heads = d.heads();
    let r = d.apply(
        &[
            user_set("carol", 1),
            Edit::UserRemove {
                name: "nobody".into(),
            },
        ],
        &by("ops"),
        6,
    );
    assert!(matches!(r, Err(EditError::NotFound(_))));
    assert_eq!(d.heads(), heads, "nothing written, nothing left open");
    assert!(!d.policy().users.contains_key("carol"));
    // Edits of one batch see the ones before them.
    assert!(
        d.apply(
            &[
                user_set("dave", 1),
                Edit::UserRemove {
                    name: "dave".into()
                }
            ],
            &by("ops"),
            7,
        )
        .unwrap()
    );
    assert!(!d.policy().users.contains_key("dave"));
    // A document past its bound takes no more edits.
    let size = d.save().len();
    let r = d.apply_bounded(&[user_set("erin", 2)], &by("ops"), 8, size);
    assert!(matches!(r, Err(EditError::Invalid(e)) if e.contains("max_document_bytes")));
    assert!(!d.policy().users.contains_key("erin"));
}

#[test]
fn a_removed_user_stays_removed_unless_added_again_later() {
    let mut a = PolicyDoc::genesis(actor(1));
    edit(&mut a, user_set("alice", 0), 1).unwrap();
    let mut b = PolicyDoc::load(&a.save(), actor(2)).unwrap();
    // Concurrently: a removes alice, b changes her password.
    edit(
        &mut a,
        Edit::UserRemove {
            name: "alice".into(),
        },
        2,
    )
    .unwrap();
    edit(&mut b, user_set("alice", 1), 2).unwrap();
    merge(&mut a, &mut b);
    assert!(!a.policy().users.contains_key("alice"));
    assert_eq!(a.policy(), b.policy());
    // Added again by an edit that saw the removal: back.
    edit(&mut b, user_set("alice", 2), 3).unwrap();
    merge(&mut a, &mut b);
    assert_eq!(a.policy().users["alice"], hashes()[2]);
}

#[test]
fn a_revoked_token_stays_revoked() {
    let mut a = PolicyDoc::genesis(actor(1));
    let set = |h: char| Edit::TokenSet {
        kind: TokenKind::Admin,
        name: "ops".into(),
        hash: h.to_string().repeat(64),
    };
    edit(&mut a, set('a'), 1).unwrap();
    let mut b = PolicyDoc::load(&a.save(), actor(2)).unwrap();
    edit(
        &mut a,
        Edit::TokenRemove {
            kind: TokenKind::Admin,
            name: "ops".into(),
        },
        2,
    )
    .unwrap();
    edit(&mut b, set('b'), 2).unwrap();
    merge(&mut a, &mut b);
    assert!(a.policy().admin_tokens.is_empty());
    assert!(b.policy().admin_tokens.is_empty());
}

#[test]
fn concurrent_residency_edits_keep_data_where_both_allow() {
    let mut a = PolicyDoc::genesis(actor(1));
    let set = |regions: &[&str]| Edit::ResidencySet {
        filter: "health/#".into(),
        regions: regions.iter().map(|r| (*r).to_owned()).collect(),
    };
    edit(&mut a, set(&["fra", "par", "ams"]), 1).unwrap();
    let mut b = PolicyDoc::load(&a.save(), actor(2)).unwrap();
    let mut c = PolicyDoc::load(&a.save(), actor(3)).unwrap();
    edit(&mut a, set(&["fra", "par"]), 2).unwrap();
    edit(&mut b, set(&["par", "ams"]), 2).unwrap();
    edit(
        &mut c,
        Edit::ResidencyRemove {
            filter: "health/#".into(),
        },
        2,
    )
    .unwrap();
    merge(&mut a, &mut b);
    merge(&mut a, &mut c);
    merge(&mut b, &mut c);
    let want: BTreeSet<String> = ["par".to_owned()].into();
    for d in [&a, &b, &c] {
        assert_eq!(d.policy().residency["health/#"], want);
    }
}

#[test]
fn a_deny_beats_a_concurrent_allow_of_the_same_rule() {
    let mut a = PolicyDoc::genesis(actor(1));
    edit(
        &mut a,
        Edit::AclAdd {
            rule: rule("allow", "all", "public/#"),
            before: None,
        },
        1,
    )
    .unwrap();
    let mut b = PolicyDoc::load(&a.save(), actor(2)).unwrap();
    edit(
        &mut a,
        Edit::AclAdd {
            rule: rule("allow", "subscribe", "secret/#"),
            before: None,
        },
        2,
    )
    .unwrap();
    edit(
        &mut b,
        Edit::AclAdd {
            rule: rule("deny", "subscribe", "secret/#"),
            before: Some(0),
        },
        2,
    )
    .unwrap();
    edit(
        &mut a,
        Edit::AclDefault {
            permission: Permission::Allow,
        },
        3,
    )
    .unwrap();
    edit(
        &mut b,
        Edit::AclDefault {
            permission: Permission::Deny,
        },
        3,
    )
    .unwrap();
    merge(&mut a, &mut b);
    let p = a.policy();
    assert_eq!(p, b.policy());
    assert_eq!(
        p.acl,
        vec![
            rule("deny", "subscribe", "secret/#"),
            rule("allow", "all", "public/#")
        ]
    );
    assert_eq!(p.acl_default, Some(Permission::Deny));
    // Sequential edits: the later permission replaces the earlier, in place.
    edit(
        &mut a,
        Edit::AclAdd {
            rule: rule("allow", "subscribe", "secret/#"),
            before: Some(1),
        },
        4,
    )
    .unwrap();
    assert_eq!(
        a.policy().acl,
        vec![
            rule("allow", "subscribe", "secret/#"),
            rule("allow", "all", "public/#")
        ]
    );
    edit(
        &mut a,
        Edit::AclRemove {
            rule: rule("deny", "subscribe", "secret/#"),
        },
        5,
    )
    .unwrap();
    assert_eq!(a.policy().acl, vec![rule("allow", "all", "public/#")]);
}

#[test]
fn what_cannot_be_read_is_left_out_and_counted() {
    let mut a = PolicyDoc::genesis(actor(1));
    edit(&mut a, user_set("alice", 0), 1).unwrap();
    // A peer writes garbage next to good entries.
    let users = a.objs[0].clone();
    let acl = a.objs[1].clone();
    a.doc.put(&users, "mallory", "{not json").unwrap();
    a.doc.put(&users, "eve", 42).unwrap();
    a.doc
        .insert(
            &acl,
            0,
            r#"{"permission":"deny","action":"all","topic":"a/#/b"}"#,
        )
        .unwrap();
    a.doc.put(ROOT, "acl_default", "sometimes").unwrap();
    a.doc.commit();
    let p = a.policy();
    assert_eq!(p.users.keys().collect::<Vec<_>>(), ["alice"]);
    assert!(p.acl.is_empty());
    assert_eq!(p.acl_default, None);
    assert_eq!(p.unreadable, 3);
}

/// Bring two replicas in sync through the sync protocol; the number of messages.
fn sync_pair(a: &mut PolicyDoc, b: &mut PolicyDoc, max: usize) -> Result<usize, DocError> {
    let (mut sa, mut sb) = (sync::State::new(), sync::State::new());
    let mut n = 0;
    loop {
        let mut quiet = true;
        if let Some(m) = a.sync_message(&mut sa) {
            b.receive_sync(&mut sb, &m, max, None)?;
            quiet = false;
            n += 1;
        }
        if let Some(m) = b.sync_message(&mut sb) {
            a.receive_sync(&mut sa, &m, max, None)?;
            quiet = false;
            n += 1;
        }
        if quiet {
            return Ok(n);
        }
    }
}

#[test]
fn sync_brings_replicas_together_within_the_size_bound() {
    let mut a = PolicyDoc::genesis(actor(1));
    let mut b = PolicyDoc::genesis(actor(2));
    edit(&mut a, user_set("alice", 0), 1).unwrap();
    edit(&mut b, user_set("bob", 1), 1).unwrap();
    sync_pair(&mut a, &mut b, 1 << 20).unwrap();
    assert_eq!(a.heads(), b.heads());
    assert_eq!(a.policy().users.len(), 2);
    // A peer whose changes would make the document too large: refused, nothing applied.
    let mut big = PolicyDoc::genesis(actor(3));
    for i in 0..200i64 {
        let n = usize::try_from(i).unwrap();
        edit(&mut big, user_set(&format!("user-{i}"), n % 3), i).unwrap();
    }
    let size = a.save().len();
    let before = a.heads();
    assert!(matches!(
        sync_pair(&mut big, &mut a, size + 1000),
        Err(DocError::TooLarge { .. })
    ));
    assert_eq!(a.heads(), before);
    // Malformed bytes are an error, not a panic.
    let mut s = sync::State::new();
    assert!(
        a.receive_sync(&mut s, b"\x42\x00garbage", 1 << 20, None)
            .is_err()
    );
}

#[test]
fn the_history_says_who_changed_what_where_and_when() {
    let mut a = PolicyDoc::genesis(actor(1));
    a.apply(&[user_set("alice", 0)], &by("ops"), 1_000).unwrap();
    a.apply(
        &[Edit::AclAdd {
            rule: rule("deny", "publish", "secret/#"),
            before: None,
        }],
        &by("sec"),
        2_000,
    )
    .unwrap();
    let h = a.history();
    assert_eq!(h.len(), 2);
    assert_eq!((h[0].at_ms, h[0].by.as_str()), (1_000, "ops"));
    assert_eq!(h[0].what, "user set alice");
    assert!(!h[0].what.contains("argon2"), "no secret in the history");
    assert_eq!(h[1].what, "acl add deny publish secret/#");
    assert_eq!(
        (h[1].node.as_str(), h[1].region.as_str()),
        ("node-sec", "eu")
    );
}

#[test]
fn compaction_keeps_the_policy_and_summarises_old_history() {
    let mut a = PolicyDoc::genesis(actor(1));
    // 300 old changes (a password changed over and over), then two recent ones.
    for t in 0..300i64 {
        let i = usize::try_from(t).unwrap() % 3;
        a.apply(&[user_set("alice", i)], &by("ops"), 1_000 + t)
            .unwrap();
    }
    a.apply(
        &[Edit::AclAdd {
            rule: rule("deny", "all", "secret/#"),
            before: None,
        }],
        &by("sec"),
        1_000_000,
    )
    .unwrap();
    a.apply(&[user_set("bob", 1)], &by("ops"), 1_000_500)
        .unwrap();
    let want = a.policy();
    let before = a.save().len();

    let mut next = a.compacted(&by("compaction"), 1_001_000, 10_000, actor(2));
    assert_eq!(next.epoch(), 1);
    assert_eq!(next.policy(), want, "what the document says is kept");
    assert!(
        next.save().len() < before,
        "{} → {}",
        before,
        next.save().len()
    );
    assert_eq!(next.changes_since_base(), 0);
    let h = next.history();
    let summary = h[0].summary.as_ref().expect("the old changes summarised");
    assert_eq!(summary.count, 300);
    assert_eq!(summary.kinds["user"], 300);
    assert_eq!((summary.from_ms, h[0].at_ms), (1_000, 1_299));
    assert_eq!(h[1].what, "acl add deny all secret/#");
    assert_eq!(h[2].what, "user set bob");
    assert_eq!(h.len(), 3);

    // Saved and loaded it is epoch 1; compacted again, the summary grows, nothing else.
    let mut again = PolicyDoc::load(&next.save(), actor(3)).unwrap();
    assert_eq!(again.epoch(), 1);
    again
        .apply(&[user_set("carol", 0)], &by("ops"), 3_000_000)
        .unwrap();
    let mut third = again.compacted(&by("compaction"), 3_000_001, 10_000, actor(4));
    assert_eq!(third.epoch(), 2);
    let h = third.history();
    assert_eq!(h[0].summary.as_ref().unwrap().count, 302);
    assert_eq!(h[1].what, "user set carol");
    assert_eq!(PolicyDoc::load(&third.save(), actor(5)).unwrap().epoch(), 2);
}

#[test]
fn edits_made_meanwhile_are_made_again_on_the_next_epoch() {
    let mut a = PolicyDoc::genesis(actor(1));
    a.apply(&[user_set("alice", 0)], &by("ops"), 1_000).unwrap();
    let mut b = PolicyDoc::load(&a.save(), actor(2)).unwrap();
    // a compacts while b, not yet told, adds a user and a rule.
    let mut next = a.compacted(&by("compaction"), 2_000, 1 << 40, actor(3));
    b.apply(&[user_set("bob", 1)], &by("ops"), 2_500).unwrap();
    b.apply(
        &[Edit::AclAdd {
            rule: rule("deny", "all", "x/#"),
            before: None,
        }],
        &by("sec"),
        2_600,
    )
    .unwrap();
    let mut b_next = PolicyDoc::load(&next.save(), actor(4)).unwrap();
    assert_eq!(b.replay_onto(&mut b_next), Some(2));
    assert_eq!(b_next.policy().users.len(), 2);
    assert_eq!(b_next.policy().acl, vec![rule("deny", "all", "x/#")]);
    let last = b_next.history().pop().unwrap();
    assert_eq!(
        (last.at_ms, last.by.as_str()),
        (2_600, "sec"),
        "author and time kept"
    );
    // Back at a through the sync protocol: the same everywhere.
    sync_pair(&mut next, &mut b_next, 1 << 20).unwrap();
    assert_eq!(next.policy(), b_next.policy());

    // A node that joins with its own seed takes the deployment's policy as it is.
    let mut fresh = PolicyDoc::genesis(actor(5));
    fresh
        .apply(&[user_set("mallory", 0)], &by("seed"), 3_000)
        .unwrap();
    let mut joined = PolicyDoc::load(&next.save(), actor(6)).unwrap();
    assert_eq!(fresh.replay_onto(&mut joined), Some(0));
    assert!(!joined.policy().users.contains_key("mallory"));
    // One whose edits the base counted, even one that never saw the later ones, makes
    // nothing again: no stale value comes back.
    let mut stale = PolicyDoc::genesis(actor(7));
    stale
        .apply(&[user_set("alice", 0)], &by("ops"), 10)
        .unwrap();
    let mut newer = PolicyDoc::load(&stale.save(), actor(8)).unwrap();
    newer
        .apply(&[user_set("alice", 2)], &by("ops"), 20)
        .unwrap();
    let mut after = newer.compacted(&by("compaction"), 30, 1 << 40, actor(9));
    assert_eq!(stale.replay_onto(&mut after), Some(0));
    assert_eq!(after.policy().users["alice"], hashes()[2]);
    // Two epochs behind: nothing can be told, nothing is made again.
    let mut far = after.compacted(&by("compaction"), 40, 1 << 40, actor(10));
    assert_eq!(stale.replay_onto(&mut far), None);
}

#[derive(Debug, Clone)]
enum Op {
    Edit(usize, Edit),
    /// Replica `.0` takes every change of replica `.1`.
    Sync(usize, usize),
}

fn edit_strategy() -> impl Strategy<Value = Edit> {
    let name = prop::sample::select(vec!["alice", "bob", "carol"]);
    let topic = prop::sample::select(vec!["a/#", "a/b", "+/b", "#"]);
    let perm = prop::sample::select(vec!["allow", "deny"]);
    let kind = prop::sample::select(vec![TokenKind::Admin, TokenKind::Edge]);
    let regions = prop::sample::subsequence(vec!["fra", "par", "nyc"], 1..=3);
    prop_oneof![
        (name.clone(), 0..3usize).prop_map(|(n, i)| user_set(n, i)),
        name.clone()
            .prop_map(|n| Edit::UserRemove { name: n.into() }),
        (perm.clone(), topic.clone(), prop::option::of(0..3usize)).prop_map(|(p, t, b)| {
            Edit::AclAdd {
                rule: rule(p, "all", t),
                before: b,
            }
        }),
        topic.clone().prop_map(|t| Edit::AclRemove {
            rule: rule("allow", "all", t)
        }),
        perm.prop_map(|p| Edit::AclDefault {
            permission: p.parse().expect("a permission")
        }),
        (kind.clone(), name.clone(), 0..3u8).prop_map(|(kind, n, h)| Edit::TokenSet {
            kind,
            name: n.into(),
            hash: format!("{h:x}").repeat(64),
        }),
        (kind, name).prop_map(|(kind, n)| Edit::TokenRemove {
            kind,
            name: n.into()
        }),
        (topic.clone(), regions).prop_map(|(t, r)| Edit::ResidencySet {
            filter: t.into(),
            regions: r.into_iter().map(str::to_owned).collect(),
        }),
        topic.prop_map(|t| Edit::ResidencyRemove { filter: t.into() }),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, edit_strategy()).prop_map(|(r, e)| Op::Edit(r, e)),
        1 => (0..3usize, 0..3usize).prop_map(|(a, b)| Op::Sync(a, b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Three replicas edit concurrently and sync now and then. However the same changes
    /// reach a replica — in any order, through any path — it says the same.
    #[test]
    fn any_order_of_the_same_edits_gives_the_same_policy(
        ops in prop::collection::vec(op_strategy(), 1..40),
        order in Just(()).prop_perturb(|(), mut rng| rng.random::<u64>()),
    ) {
        let mut replicas: Vec<PolicyDoc> =
            (0..3).map(|i| PolicyDoc::genesis(actor(i + 1))).collect();
        for (t, op) in ops.iter().enumerate() {
            match op {
                Op::Edit(r, e) => {
                    // Refused edits (removing what is not there) are part of the game.
                    let _ = replicas[*r].apply(std::slice::from_ref(e), &by("p"), t as i64);
                }
                Op::Sync(a, b) if a != b => {
                    let (x, y) = if a < b {
                        let (l, r) = replicas.split_at_mut(*b);
                        (&mut l[*a], &mut r[0])
                    } else {
                        let (l, r) = replicas.split_at_mut(*a);
                        (&mut r[0], &mut l[*b])
                    };
                    x.doc.merge(&mut y.doc).unwrap();
                }
                Op::Sync(..) => {}
            }
        }
        // Every change, applied to fresh replicas in shuffled orders.
        let mut all = PolicyDoc::genesis(actor(9));
        for r in &mut replicas {
            all.doc.merge(&mut r.doc).unwrap();
        }
        let want = all.policy();
        let changes = all.doc.get_changes(&[]);
        let mut seed = order;
        for _ in 0..3 {
            let mut shuffled = changes.clone();
            for i in (1..shuffled.len()).rev() {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                shuffled.swap(i, (seed >> 33) as usize % (i + 1));
            }
            let mut fresh = PolicyDoc::genesis(actor(10));
            fresh.doc.apply_changes(shuffled).unwrap();
            prop_assert_eq!(fresh.policy(), want.clone());
            prop_assert_eq!(fresh.heads(), all.heads());
        }
        // And through the sync protocol, pairwise, every replica ends up the same.
        for i in 0..3 {
            for j in 0..3 {
                if i < j {
                    let (l, r) = replicas.split_at_mut(j);
                    sync_pair(&mut l[i], &mut r[0], 1 << 24).unwrap();
                }
            }
        }
        for r in &mut replicas {
            prop_assert_eq!(r.policy(), want.clone());
        }
        // Compaction changes nothing the document says.
        let compacted = all.compacted(&by("compaction"), 1_000, 10, actor(11));
        prop_assert_eq!(compacted.policy(), want);
    }
}
