//! Data residency: topic filters whose messages may reach only some regions.
//!
//! A [`ResidencyRule`] names a topic filter and the regions its topics' messages may reach. A
//! message reaches a region only if every rule whose filter matches its topic names that
//! region; where no rule matches, it goes wherever there is interest. A subscription whose
//! filter lies wholly inside rules is advertised only to the regions every one of them names
//! ([`Residency::scope`]); one that only overlaps a rule (`#`) is advertised as usual, and
//! each message is checked on its way out.
//!
//! ```
//! use meridian_core::residency::{Residency, ResidencyRule};
//!
//! let eu = ResidencyRule::new("health/#", ["fra", "par"]).unwrap();
//! let residency = Residency::new(vec![eu]);
//! assert!(residency.allows("health/p1", "fra"));
//! assert!(!residency.allows("health/p1", "nyc"));
//! assert!(residency.allows("news/today", "nyc"));
//! assert_eq!(
//!     residency.scope("health/+/heart").map(|r| r.into_iter().collect::<Vec<_>>()),
//!     Some(vec!["fra".to_owned(), "par".to_owned()])
//! );
//! assert_eq!(residency.scope("#"), None);
//! ```

use std::collections::BTreeSet;

use crate::acl::{ClientRef, Pattern, Relation, RuleError};

/// Rules have no placeholders: they are evaluated without a client.
pub(crate) const NO_CLIENT: ClientRef<'static> = ClientRef {
    client_id: "",
    username: None,
};

/// The topics of a filter may reach only some regions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResidencyRule {
    filter: String,
    pattern: Pattern,
    regions: BTreeSet<String>,
}

impl ResidencyRule {
    /// A rule for `filter` (a topic filter without `%u` or `%c`), allowing `regions`.
    pub fn new<R: Into<String>>(
        filter: &str,
        regions: impl IntoIterator<Item = R>,
    ) -> Result<Self, RuleError> {
        let pattern = Pattern::parse(filter)?;
        if pattern.uses_user || pattern.uses_client_id {
            return Err(RuleError::Topic {
                topic: filter.to_owned(),
                reason: "a residency rule names topics, without %u or %c",
            });
        }
        Ok(Self {
            filter: filter.to_owned(),
            pattern,
            regions: regions.into_iter().map(Into::into).collect(),
        })
    }

    /// The filter as written.
    pub fn filter(&self) -> &str {
        &self.filter
    }

    /// The regions its topics may reach.
    pub fn regions(&self) -> &BTreeSet<String> {
        &self.regions
    }
}

/// Every residency rule in force.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Residency {
    rules: Vec<ResidencyRule>,
}

impl Residency {
    /// The rules, all in force at once.
    pub fn new(rules: Vec<ResidencyRule>) -> Self {
        Self { rules }
    }

    /// No rule: every message may go anywhere.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules.
    pub fn rules(&self) -> &[ResidencyRule] {
        &self.rules
    }

    /// The regions a message on `topic` may reach, or `None` for anywhere.
    pub fn regions_for(&self, topic: &str) -> Option<BTreeSet<String>> {
        self.intersect(|p| p.relation(topic, &NO_CLIENT) == Relation::Covers)
    }

    /// Whether a message on `topic` may reach `region`.
    pub fn allows(&self, topic: &str, region: &str) -> bool {
        self.rules.iter().all(|r| {
            r.regions.contains(region) || r.pattern.relation(topic, &NO_CLIENT) != Relation::Covers
        })
    }

    /// The regions a subscription to `filter` may be advertised to: those every rule that
    /// holds the whole filter names, or `None` (anywhere) when no rule holds it whole.
    pub fn scope(&self, filter: &str) -> Option<BTreeSet<String>> {
        self.intersect(|p| p.relation(filter, &NO_CLIENT) == Relation::Covers)
    }

    fn intersect(&self, applies: impl Fn(&Pattern) -> bool) -> Option<BTreeSet<String>> {
        let mut out: Option<BTreeSet<String>> = None;
        for rule in self.rules.iter().filter(|r| applies(&r.pattern)) {
            out = Some(match out {
                None => rule.regions.clone(),
                Some(set) => set.intersection(&rule.regions).cloned().collect(),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(r: &[&str]) -> Option<BTreeSet<String>> {
        Some(r.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn nested_rules_allow_only_what_every_one_allows() {
        let r = Residency::new(vec![
            ResidencyRule::new("health/#", ["fra", "par", "ams"]).unwrap(),
            ResidencyRule::new("health/fr/#", ["par", "lyon"]).unwrap(),
        ]);
        assert_eq!(r.regions_for("health/de/p1"), set(&["ams", "fra", "par"]));
        assert_eq!(r.regions_for("health/fr/p1"), set(&["par"]));
        assert_eq!(r.regions_for("health"), set(&["ams", "fra", "par"]));
        assert_eq!(r.regions_for("wealth/x"), None);
        assert!(r.allows("health/fr/x", "par") && !r.allows("health/fr/x", "fra"));
        assert!(r.allows("other", "anywhere"));
        // Subscriptions: wholly inside, partly inside, outside.
        assert_eq!(r.scope("health/fr/+"), set(&["par"]));
        assert_eq!(r.scope("health/+/x"), set(&["ams", "fra", "par"]));
        assert_eq!(r.scope("+/fr/#"), None);
        assert_eq!(r.scope("#"), None);
        // `$` topics are not matched by a leading wildcard.
        let all = Residency::new(vec![ResidencyRule::new("#", ["fra"]).unwrap()]);
        assert!(all.allows("$SYS/x", "nyc"));
        assert!(!all.allows("a", "nyc"));
    }

    #[test]
    fn rules_name_topics_without_placeholders() {
        assert!(ResidencyRule::new("users/%u/#", ["fra"]).is_err());
        assert!(ResidencyRule::new("a/#/b", ["fra"]).is_err());
        assert!(ResidencyRule::new("$share/g/a", ["fra"]).is_err());
    }
}
