//! The document's history and its compaction into epochs: what `meridian ctl history` shows,
//! the next epoch's document made from this one, and the edits a node makes again on it.

use std::collections::{BTreeMap, BTreeSet};

use automerge::transaction::{CommitOptions, Transactable};
use automerge::{ActorId, ROOT, ReadDoc};
use serde::{Deserialize, Serialize};

use super::{
    ACL, Author, BASE_ACTOR, ChangeNote, GENESIS_ACTOR, HISTORY, NODES, PolicyDoc, RESIDENCY,
    ResidencyEntry, SecretEntry, TokenKind, USERS, json, text,
};

/// One change of the history, or the summary of the changes older than the retention.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// When, in milliseconds since the Unix epoch (the editing node's clock); for a summary,
    /// its last change.
    pub at_ms: i64,
    pub by: String,
    pub node: String,
    pub region: String,
    /// What it did.
    pub what: String,
    /// The change's hash (empty for a summary).
    pub change: String,
    /// The operator key that signed it (64 hex digits), if one did. A node with
    /// `policy.operator_keys` took the change only after checking the signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
    /// For a summary: how many changes, from when, of which kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,
}

/// Changes summarised by a compaction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub count: u64,
    pub from_ms: i64,
    /// Changes by kind (`user`, `acl`, `token`, `residency`, `node`).
    pub kinds: BTreeMap<String, u64>,
}

impl HistoryEntry {
    /// The changes of `entries` (changes and summaries) as one summary.
    fn summarise(entries: &[HistoryEntry]) -> Option<HistoryEntry> {
        let mut summary = Summary {
            from_ms: i64::MAX,
            ..Summary::default()
        };
        let mut to_ms = i64::MIN;
        for e in entries {
            match &e.summary {
                Some(s) => {
                    summary.count = summary.count.saturating_add(s.count);
                    summary.from_ms = summary.from_ms.min(s.from_ms);
                    for (k, n) in &s.kinds {
                        let count = summary.kinds.entry(k.clone()).or_default();
                        *count = count.saturating_add(*n);
                    }
                }
                None => {
                    summary.count += 1;
                    summary.from_ms = summary.from_ms.min(e.at_ms);
                    let kind = e.what.split(' ').next().unwrap_or("").to_owned();
                    *summary.kinds.entry(kind).or_default() += 1;
                }
            }
            to_ms = to_ms.max(e.at_ms);
        }
        (summary.count > 0).then(|| HistoryEntry {
            at_ms: to_ms,
            by: "summary".to_owned(),
            node: String::new(),
            region: String::new(),
            signed_by: None,
            what: format!(
                "{} earlier changes ({})",
                summary.count,
                summary
                    .kinds
                    .iter()
                    .map(|(k, n)| format!("{k}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            change: String::new(),
            summary: Some(summary),
        })
    }
}

/// What a change of the history is, from its metadata.
#[derive(Debug)]
struct ChangeMeta {
    hash: automerge::ChangeHash,
    timestamp: i64,
    message: Option<String>,
}

impl PolicyDoc {
    /// The document's history, oldest first: what the last compaction kept (a summary of
    /// older changes, then each recent one), then every change since.
    pub fn history(&mut self) -> Vec<HistoryEntry> {
        let mut out: Vec<HistoryEntry> = self.kept_history();
        let mut changes: Vec<HistoryEntry> = self
            .edits()
            .into_iter()
            .map(|(c, note)| {
                let (author, what) = match note {
                    Some(n) => (n.author, n.what.join("; ")),
                    None => (
                        Author {
                            by: "?".to_owned(),
                            node: "?".to_owned(),
                            region: String::new(),
                        },
                        c.message.clone().unwrap_or_default(),
                    ),
                };
                HistoryEntry {
                    at_ms: c.timestamp,
                    by: author.by,
                    node: author.node,
                    region: author.region,
                    what,
                    change: c.hash.to_string(),
                    signed_by: super::signed::signed_by(c.message.as_deref()),
                    summary: None,
                }
            })
            .collect();
        changes.sort_by(|a, b| a.at_ms.cmp(&b.at_ms).then_with(|| a.change.cmp(&b.change)));
        // An edit made again on the compacted document by two nodes is one edit.
        let key = |e: &HistoryEntry| {
            (
                e.at_ms,
                e.by.clone(),
                e.node.clone(),
                e.region.clone(),
                e.what.clone(),
            )
        };
        let mut seen: BTreeSet<_> = out.iter().map(key).collect();
        changes.retain(|e| seen.insert(key(e)));
        out.extend(changes);
        out
    }

    /// The history the last compaction wrote into the document.
    fn kept_history(&self) -> Vec<HistoryEntry> {
        let list = &self.objs[HISTORY];
        (0..self.doc.length(list))
            .filter_map(|i| text(self.doc.get(list, i).ok().flatten().map(|(v, _)| v)))
            .filter_map(|s| serde_json::from_str(&s).ok())
            .collect()
    }

    /// Every change since the document's genesis and base, with its note.
    fn edits(&mut self) -> Vec<(ChangeMeta, Option<ChangeNote>)> {
        self.doc
            .get_changes_meta(&[])
            .into_iter()
            .filter(|c| {
                let actor = c.actor.as_ref().to_bytes();
                actor != GENESIS_ACTOR && actor != BASE_ACTOR
            })
            .map(|c| {
                let note = super::signed::note_of(c.message.as_deref());
                let meta = ChangeMeta {
                    hash: c.hash,
                    timestamp: c.timestamp,
                    message: c.message.as_deref().map(str::to_owned),
                };
                (meta, note)
            })
            .collect()
    }

    /// Changes since the last compaction (or the genesis).
    pub fn changes_since_base(&mut self) -> usize {
        self.edits().len()
    }

    /// When the oldest change the history lists one by one was made.
    pub fn oldest_listed_ms(&mut self) -> Option<i64> {
        self.history()
            .iter()
            .filter(|e| e.summary.is_none())
            .map(|e| e.at_ms)
            .min()
    }

    /// What the previous epoch's document held when this one was made from it: each
    /// actor's last change (automerge numbers an actor's changes 1, 2, ...). Empty for
    /// epoch 0.
    fn base_clock(&self) -> BTreeMap<String, u64> {
        text(
            self.doc
                .get(ROOT, "base_clock")
                .ok()
                .flatten()
                .map(|(v, _)| v),
        )
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default()
    }

    /// The next epoch's document: what this one says now, every conflict decided, in one
    /// change (so none of this document's history weighs on it), with its history kept as
    /// data — the changes of the last `retention_ms` one by one, older ones as one summary.
    /// Edited from then on as `actor`.
    pub fn compacted(
        &mut self,
        author: &Author,
        now_ms: i64,
        retention_ms: u64,
        actor: ActorId,
    ) -> Self {
        let policy = self.policy();
        let history = self.history();
        let cutoff = now_ms.saturating_sub(i64::try_from(retention_ms).unwrap_or(i64::MAX));
        let (recent, old): (Vec<HistoryEntry>, Vec<HistoryEntry>) = history
            .into_iter()
            .partition(|e| e.summary.is_none() && e.at_ms >= cutoff);
        let mut clock: BTreeMap<String, u64> = BTreeMap::new();
        for c in self.doc.get_changes_meta(&[]) {
            let last = clock.entry(c.actor.to_hex_string()).or_default();
            *last = (*last).max(c.seq);
        }
        let mut next = Self::genesis_of(self.epoch + 1, ActorId::from(BASE_ACTOR));
        // Writes to a new document's own objects: they cannot fail.
        let doc = &mut next.doc;
        let objs = &next.objs;
        let mut put = |obj: usize, key: &str, value: String| {
            let _ = doc.put(&objs[obj], key, value);
        };
        for (name, hash) in &policy.users {
            let claim_key = policy.claim_keys.get(name).cloned();
            let hash = hash.clone();
            put(USERS, name, json(&SecretEntry { hash, claim_key }));
        }
        for kind in [TokenKind::Admin, TokenKind::Edge] {
            for (name, hash) in kind.of(&policy) {
                let hash = hash.clone();
                let claim_key = None;
                put(kind.object(), name, json(&SecretEntry { hash, claim_key }));
            }
        }
        for (filter, regions) in &policy.residency {
            let regions = regions.iter().cloned().collect();
            put(RESIDENCY, filter, json(&ResidencyEntry { regions }));
        }
        for (peer, node) in &policy.nodes {
            put(NODES, peer, json(node));
        }
        for (i, rule) in policy.acl.iter().enumerate() {
            let _ = doc.insert(&objs[ACL], i, json(rule));
        }
        if let Some(d) = policy.acl_default {
            let _ = doc.put(ROOT, "acl_default", d.to_string());
        }
        let kept: Vec<HistoryEntry> = HistoryEntry::summarise(&old)
            .into_iter()
            .chain(recent)
            .collect();
        for (i, e) in kept.iter().enumerate() {
            let _ = doc.insert(&objs[HISTORY], i, json(e));
        }
        let _ = doc.put(ROOT, "base_clock", json(&clock));
        let note = ChangeNote {
            author: author.clone(),
            what: vec![format!("compacted into epoch {}", self.epoch + 1)],
            edits: Vec::new(),
        };
        doc.commit_with(
            CommitOptions::default()
                .with_message(json(&note))
                .with_time(now_ms),
        );
        doc.set_actor(actor);
        next
    }

    /// Make again on `next`, the next epoch's document, the edits of this document that it
    /// does not hold (those its base did not count: made after it was compacted from this
    /// epoch, or on a node that was not part of it), but not what the files seeded (a node
    /// that joins a deployment takes the deployment's policy). Each keeps its author and
    /// time; one that no longer applies (removing what is not there) is skipped. A document
    /// more than one epoch behind cannot tell what the later one holds: nothing is made again
    /// (`None`). Returns how many changes were made again.
    pub fn replay_onto(&mut self, next: &mut Self) -> Option<usize> {
        if next.epoch != self.epoch + 1 {
            return None;
        }
        let clock = next.base_clock();
        let mut replayed = 0;
        for change in self.doc.get_changes(&[]) {
            let actor = change.actor_id();
            if [GENESIS_ACTOR, BASE_ACTOR].contains(&actor.to_bytes())
                || clock
                    .get(&actor.to_hex_string())
                    .is_some_and(|&last| change.seq() <= last)
            {
                continue;
            }
            let Some(note) = super::signed::note_of(change.message()) else {
                continue;
            };
            if note.author.by == super::by::SEED {
                continue;
            }
            let mut any = false;
            for edit in &note.edits {
                any |= next
                    .apply(std::slice::from_ref(edit), &note.author, change.timestamp())
                    .unwrap_or(false);
            }
            replayed += usize::from(any);
        }
        Some(replayed)
    }
}
