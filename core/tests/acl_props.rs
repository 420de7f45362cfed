//! Properties of the access-rule engine: what it says of a whole subscription agrees with
//! what it says of every topic the subscription can bring, and a rule's pattern matches a
//! topic exactly as a subscription with the same filter would.

use meridian_core::acl::{Acl, Action, ClientRef, FilterAccess, Permission, Rule};
use meridian_core::topic;
use proptest::prelude::*;

const CLIENT: ClientRef<'static> = ClientRef {
    client_id: "c",
    username: Some("u"),
};

/// Topic levels, from a small alphabet so that rules, filters and topics meet often.
fn name_level() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["a", "b", "u", "c", "$s", ""])
}

fn topic_name() -> impl Strategy<Value = String> {
    prop::collection::vec(name_level(), 1..5)
        .prop_map(|l| l.join("/"))
        .prop_filter("empty topic", |t| !t.is_empty())
}

/// A filter from the alphabet, `+` and a trailing `#`; with `placeholders`, `%u` and `%c` too.
fn filter(placeholders: bool) -> impl Strategy<Value = String> {
    let mut levels = vec!["a", "b", "u", "c", "$s", "", "+"];
    if placeholders {
        levels.extend(["%u", "%c", "x%u"]);
    }
    (
        prop::collection::vec(prop::sample::select(levels), 0..4),
        any::<bool>(),
    )
        .prop_filter_map("empty filter", |(mut l, hash)| {
            if hash {
                l.push("#");
            }
            let f = l.join("/");
            (!f.is_empty()).then_some(f)
        })
}

fn permission() -> impl Strategy<Value = Permission> {
    prop_oneof![Just(Permission::Allow), Just(Permission::Deny)]
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        permission(),
        prop_oneof![
            Just(Action::Subscribe),
            Just(Action::All),
            Just(Action::Publish)
        ],
        filter(true),
        prop::option::weighted(0.2, prop_oneof![Just("u"), Just("v")]),
    )
        .prop_map(|(p, a, t, user)| {
            let rule = Rule::new(p, a, &t).expect("generated rules are valid");
            match user {
                Some(u) => rule.for_user(u),
                None => rule,
            }
        })
}

fn acl() -> impl Strategy<Value = Acl> {
    (permission(), prop::collection::vec(rule(), 0..5)).prop_map(|(d, r)| Acl::new(d, r))
}

proptest! {
    #[test]
    fn a_whole_subscription_is_judged_as_each_of_its_topics(
        acl in acl(),
        filter in filter(false),
        topics in prop::collection::vec(topic_name(), 1..24),
    ) {
        let access = acl.filter_access(&CLIENT, &filter);
        for t in topics.iter().filter(|t| topic::matches(&filter, t)) {
            let receives = acl.may_receive(&CLIENT, t);
            match access {
                FilterAccess::Allowed => prop_assert!(receives, "{filter} allowed but not {t}"),
                FilterAccess::Denied => prop_assert!(!receives, "{filter} denied but not {t}"),
                FilterAccess::Filtered => {}
            }
        }
    }

    #[test]
    fn a_topic_is_never_half_allowed(acl in acl(), t in topic_name()) {
        let expected = if acl.may_receive(&CLIENT, &t) {
            FilterAccess::Allowed
        } else {
            FilterAccess::Denied
        };
        prop_assert_eq!(acl.filter_access(&CLIENT, &t), expected);
    }

    #[test]
    fn a_rule_matches_what_a_subscription_would(pattern in filter(false), t in topic_name()) {
        let acl = Acl::new(
            Permission::Deny,
            vec![Rule::new(Permission::Allow, Action::All, &pattern).unwrap()],
        );
        prop_assert_eq!(acl.may_publish(&CLIENT, &t), topic::matches(&pattern, &t));
    }

    #[test]
    fn one_rule_against_a_filter_is_exact(
        pattern in filter(false),
        filter in filter(false),
        topics in prop::collection::vec(topic_name(), 1..32),
    ) {
        // Default deny and one allow rule: Allowed = the rule covers the filter, Denied = the
        // two share no topic.
        let acl = Acl::new(
            Permission::Deny,
            vec![Rule::new(Permission::Allow, Action::Subscribe, &pattern).unwrap()],
        );
        let access = acl.filter_access(&CLIENT, &filter);
        for t in topics.iter().filter(|t| topic::matches(&filter, t)) {
            let both = topic::matches(&pattern, t);
            match access {
                FilterAccess::Allowed => prop_assert!(both),
                FilterAccess::Denied => prop_assert!(!both),
                FilterAccess::Filtered => {}
            }
        }
    }
}
