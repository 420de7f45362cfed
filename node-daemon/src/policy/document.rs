//! The cluster policy document: users and their password hashes, access rules, admin and
//! edge-link tokens (as hashes), data-residency rules and the deployment's nodes, in one
//! automerge document of which every node holds a replica.
//!
//! Every replica starts from the same first change (the genesis: the same actor, time and
//! operations on every node, so the same hash), which makes the top-level objects the same
//! objects everywhere; edits are made under a fresh actor per process start, so that no two
//! changes ever share an actor and a sequence number.
//!
//! Entries are JSON strings, one per key, so that concurrent writes of one key stay visible
//! side by side (automerge's conflicts) and a rule per kind of entry decides between them
//! ([`Policy`] is that decision). The rules, one per kind:
//!
//! | entry | concurrent writes of one key |
//! |---|---|
//! | user (`users/NAME`) | a removal beats a concurrent change; otherwise one change wins, the same on every node. A removed user stays removed unless added again by an edit that saw the removal |
//! | admin and edge-link token (`admin_tokens/NAME`, `edge_tokens/NAME`) | as users: a revocation beats a concurrent change |
//! | data-residency rule (`residency/FILTER`) | a change beats a concurrent removal, and two changes keep only the regions both allow: concurrent edits never let data reach further than either meant |
//! | access rule (the `acl` list) | rules are kept in the order they were placed; rules placed at one spot concurrently are ordered the same on every node. The same rule (action, topic, user, client id) placed twice concurrently with different permissions counts once, at its first place, as `deny` |
//! | default permission (`acl_default`) | `deny` beats a concurrent `allow` |
//! | node (`nodes/PEER_ID`) | each node writes its own entry only |
//!
//! An entry that cannot be read (malformed, too long) is left out of the policy and counted
//! ([`Policy::unreadable`]): a node never fails because of what another wrote.

use std::collections::{BTreeMap, BTreeSet};

use automerge::sync::{self, SyncDoc};
use automerge::transaction::{CommitOptions, Transactable};
use automerge::{ActorId, AutoCommit, ObjId, ObjType, ROOT, ReadDoc, Value};
use meridian_core::acl::{Action, Permission, Rule};
use serde::{Deserialize, Serialize};

/// The actor of the genesis change, the same on every node.
const GENESIS_ACTOR: &[u8] = b"meridian-policy-genesis";
/// The actor of the change that starts a compacted document with the state of the previous
/// one ([`PolicyDoc::compacted`]).
const BASE_ACTOR: &[u8] = b"meridian-policy-base";
/// The version of the document's layout, written by the genesis.
const SCHEMA: i64 = 1;
/// What a removal writes in place of an entry.
const REMOVED: &str = r#"{"removed":true}"#;

/// Longest name of a user, token or region, in bytes.
pub const MAX_NAME_LEN: usize = 256;
/// Longest password or token hash, in bytes.
pub const MAX_HASH_LEN: usize = 512;
/// Longest topic filter of a rule, in bytes.
pub const MAX_TOPIC_LEN: usize = 1024;
/// Most regions one residency rule names.
pub const MAX_REGIONS: usize = 64;

/// The document's top-level objects, in the order the genesis makes them.
const OBJECTS: [(&str, ObjType); 7] = [
    ("users", ObjType::Map),
    ("acl", ObjType::List),
    ("admin_tokens", ObjType::Map),
    ("edge_tokens", ObjType::Map),
    ("residency", ObjType::Map),
    ("nodes", ObjType::Map),
    // The history a compaction kept (recent changes, and a summary of older ones).
    ("history", ObjType::List),
];
/// Where each object is in [`OBJECTS`].
const USERS: usize = 0;
const ACL: usize = 1;
const RESIDENCY: usize = 4;
const NODES: usize = 5;
const HISTORY: usize = 6;

/// Which kind of token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenKind {
    /// Bearer tokens of the admin API.
    Admin,
    /// Tokens edge objects link with.
    Edge,
}

impl TokenKind {
    fn object(self) -> usize {
        match self {
            Self::Admin => 2,
            Self::Edge => 3,
        }
    }

    /// The policy's tokens of this kind.
    fn of(self, policy: &Policy) -> &BTreeMap<String, String> {
        match self {
            Self::Admin => &policy.admin_tokens,
            Self::Edge => &policy.edge_tokens,
        }
    }
}

/// An access rule as the document holds it. Fields it does not know (written by a later
/// version) are ignored, so that such a rule still counts here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleEntry {
    pub permission: String,
    pub action: String,
    pub topic: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
}

impl RuleEntry {
    /// The entry of a rule of the core's engine.
    pub fn of(rule: &Rule) -> Self {
        Self {
            permission: rule.permission().to_string(),
            action: rule.action().to_string(),
            topic: rule.topic().to_owned(),
            user: rule.user().map(str::to_owned),
            client_id: rule.client_id().map(str::to_owned),
        }
    }

    /// The rule it stands for, if it is one.
    pub fn rule(&self) -> Result<Rule, String> {
        let permission: Permission = self.permission.parse().map_err(|e| format!("{e}"))?;
        let action: Action = self.action.parse().map_err(|e| format!("{e}"))?;
        if self.topic.len() > MAX_TOPIC_LEN {
            return Err(format!("topic longer than {MAX_TOPIC_LEN} bytes"));
        }
        let mut rule = Rule::new(permission, action, &self.topic).map_err(|e| format!("{e}"))?;
        for (what, v) in [("user", &self.user), ("client_id", &self.client_id)] {
            if v.as_ref()
                .is_some_and(|v| v.is_empty() || v.len() > MAX_NAME_LEN)
            {
                return Err(format!("{what}: empty or longer than {MAX_NAME_LEN} bytes"));
            }
        }
        if let Some(u) = &self.user {
            rule = rule.for_user(u.clone());
        }
        if let Some(c) = &self.client_id {
            rule = rule.for_client_id(c.clone());
        }
        Ok(rule)
    }

    /// What makes two rules the same rule, whatever their permission.
    fn key(&self) -> (&str, &str, Option<&str>, Option<&str>) {
        (
            &self.action,
            &self.topic,
            self.user.as_deref(),
            self.client_id.as_deref(),
        )
    }
}

impl std::fmt::Display for RuleEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.permission, self.action, self.topic)?;
        if let Some(u) = &self.user {
            write!(f, " user={u}")?;
        }
        if let Some(c) = &self.client_id {
            write!(f, " client_id={c}")?;
        }
        Ok(())
    }
}

/// One change to the policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "edit", rename_all = "snake_case")]
pub enum Edit {
    /// Add a user or change its password (`hash` is a PHC string, `$argon2id$...`).
    UserSet {
        name: String,
        hash: String,
    },
    UserRemove {
        name: String,
    },
    /// Place a rule before the `before`-th rule of the list (from 0), or at its end; the same
    /// rule with another permission is taken out.
    AclAdd {
        rule: RuleEntry,
        #[serde(default)]
        before: Option<usize>,
    },
    /// Take out the rule (whatever its permission).
    AclRemove {
        rule: RuleEntry,
    },
    AclDefault {
        permission: String,
    },
    /// Add a token or replace its hash (`hash` is the token's SHA-256, in hex).
    TokenSet {
        kind: TokenKind,
        name: String,
        hash: String,
    },
    TokenRemove {
        kind: TokenKind,
        name: String,
    },
    /// Restrict the topics `filter` matches to `regions`.
    ResidencySet {
        filter: String,
        regions: Vec<String>,
    },
    ResidencyRemove {
        filter: String,
    },
    /// A node of the deployment says where it is.
    Node {
        peer_id: String,
        name: String,
        region: String,
    },
    /// A node left the deployment for good (it was forgotten).
    NodeRemove {
        peer_id: String,
    },
}

/// Why an edit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    /// Applied and in force, but not saved (the data directory refused the write).
    #[error("{0}")]
    Storage(String),
}

impl Edit {
    /// Check the edit's values before it is written.
    fn check(&self) -> Result<(), EditError> {
        let bad = |s: String| Err(EditError::Invalid(s));
        let name_ok = |n: &str| !n.is_empty() && n.len() <= MAX_NAME_LEN && !n.contains(':');
        match self {
            Self::UserSet { name, hash } => {
                if !name_ok(name) {
                    return bad(format!("user name: 1 to {MAX_NAME_LEN} bytes, without ':'"));
                }
                if hash.len() > MAX_HASH_LEN
                    || argon2::password_hash::phc::PasswordHash::new(hash).is_err()
                    || !hash.starts_with("$argon2")
                {
                    return bad("hash: not an argon2 PHC string ($argon2id$...)".to_owned());
                }
            }
            Self::UserRemove { name } | Self::TokenRemove { name, .. } => {
                if !name_ok(name) {
                    return bad(format!("name: 1 to {MAX_NAME_LEN} bytes, without ':'"));
                }
            }
            Self::AclAdd { rule, .. } | Self::AclRemove { rule } => {
                rule.rule().map_err(EditError::Invalid)?;
            }
            Self::AclDefault { permission } => {
                permission
                    .parse::<Permission>()
                    .map_err(|e| EditError::Invalid(e.to_string()))?;
            }
            Self::TokenSet { name, hash, .. } => {
                if !name_ok(name) {
                    return bad(format!(
                        "token name: 1 to {MAX_NAME_LEN} bytes, without ':'"
                    ));
                }
                if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return bad("hash: not a SHA-256 in hex (64 characters)".to_owned());
                }
            }
            Self::ResidencySet { filter, regions } => {
                check_filter(filter)?;
                if regions.is_empty() || regions.len() > MAX_REGIONS {
                    return bad(format!("regions: 1 to {MAX_REGIONS}"));
                }
                if regions.iter().any(|r| !name_ok(r)) {
                    return bad(format!("region: 1 to {MAX_NAME_LEN} bytes, without ':'"));
                }
            }
            Self::ResidencyRemove { filter } => check_filter(filter)?,
            Self::NodeRemove { peer_id } => {
                if peer_id.is_empty() || peer_id.len() > MAX_NAME_LEN {
                    return bad(format!("node: 1 to {MAX_NAME_LEN} bytes"));
                }
            }
            Self::Node {
                peer_id,
                name,
                region,
            } => {
                if [peer_id, name, region]
                    .iter()
                    .any(|s| s.len() > MAX_NAME_LEN || s.is_empty())
                {
                    return bad(format!("node: values of 1 to {MAX_NAME_LEN} bytes"));
                }
            }
        }
        Ok(())
    }

    /// A line for the history: what the edit did, without secrets.
    pub fn describe(&self) -> String {
        match self {
            Self::UserSet { name, .. } => format!("user set {name}"),
            Self::UserRemove { name } => format!("user remove {name}"),
            Self::AclAdd { rule, before } => match before {
                Some(i) => format!("acl add {rule} (before rule {})", i.saturating_add(1)),
                None => format!("acl add {rule}"),
            },
            Self::AclRemove { rule } => format!(
                "acl remove {}",
                RuleEntry {
                    permission: "*".to_owned(),
                    ..rule.clone()
                }
            ),
            Self::AclDefault { permission } => format!("acl default {permission}"),
            Self::TokenSet { kind, name, .. } => format!("token set {} {name}", kind_name(*kind)),
            Self::TokenRemove { kind, name } => {
                format!("token remove {} {name}", kind_name(*kind))
            }
            Self::ResidencySet { filter, regions } => {
                format!("residency set {filter} -> {}", regions.join(","))
            }
            Self::ResidencyRemove { filter } => format!("residency remove {filter}"),
            Self::Node {
                peer_id,
                name,
                region,
            } => format!("node {name} ({peer_id}) in region {region}"),
            Self::NodeRemove { peer_id } => format!("node {peer_id} removed"),
        }
    }
}

fn kind_name(kind: TokenKind) -> &'static str {
    match kind {
        TokenKind::Admin => "admin",
        TokenKind::Edge => "edge",
    }
}

/// A residency rule's filter: a topic filter, without placeholders or `$share/`.
fn check_filter(filter: &str) -> Result<(), EditError> {
    if filter.len() > MAX_TOPIC_LEN {
        return Err(EditError::Invalid(format!(
            "filter longer than {MAX_TOPIC_LEN} bytes"
        )));
    }
    meridian_core::residency::ResidencyRule::new(filter, Vec::<String>::new())
        .map(|_| ())
        .map_err(|e| EditError::Invalid(format!("filter: {e}")))
}

/// Who made an edit, and where: written in the change's message (the history).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Author {
    /// The admin token's name, `seed` for what the files seeded, `node` for a node's own
    /// entry, `compaction` for a new epoch, `local` for a request without a token to a node
    /// on loopback that has none.
    pub by: String,
    /// The node's name.
    pub node: String,
    /// Its region (empty outside cluster mode).
    pub region: String,
}

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

/// What a change's message holds: who made it, what it did in words, and the edits
/// themselves (so that a change made on a document that was compacted meanwhile can be made
/// again on the compacted one).
#[derive(Debug, Serialize, Deserialize)]
struct ChangeNote {
    #[serde(flatten)]
    author: Author,
    what: Vec<String>,
    #[serde(default)]
    edits: Vec<Edit>,
}

/// A user as the document holds it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretEntry {
    hash: String,
}

/// A residency rule as the document holds it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResidencyEntry {
    regions: Vec<String>,
}

/// A node as the document holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    pub name: String,
    pub region: String,
}

/// What the document says, every conflict decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// User name → PHC hash.
    pub users: BTreeMap<String, String>,
    pub acl_default: Option<Permission>,
    /// The access rules in order, each once.
    pub acl: Vec<RuleEntry>,
    /// Token name → SHA-256 (hex).
    pub admin_tokens: BTreeMap<String, String>,
    pub edge_tokens: BTreeMap<String, String>,
    /// Filter → the regions its topics may reach.
    pub residency: BTreeMap<String, BTreeSet<String>>,
    /// Peer id → the node's entry.
    pub nodes: BTreeMap<String, NodeEntry>,
    /// Entries left out because they could not be read.
    pub unreadable: usize,
}

impl Policy {
    /// The data-residency rules of the core (entries whose filter the core refuses, such as
    /// one with `%u`, are left out).
    pub fn residency(&self) -> meridian_core::residency::Residency {
        meridian_core::residency::Residency::new(
            self.residency
                .iter()
                .filter_map(|(filter, regions)| {
                    meridian_core::residency::ResidencyRule::new(filter, regions.iter().cloned())
                        .ok()
                })
                .collect(),
        )
    }

    /// The regions of the deployment's nodes, by node id (entries whose peer id is not a node
    /// id are left out).
    pub fn node_regions(&self) -> BTreeMap<meridian_core::routes::NodeId, String> {
        self.nodes
            .iter()
            .filter_map(|(peer, n)| {
                meridian_core::routes::NodeId::new(peer)
                    .ok()
                    .map(|id| (id, n.region.clone()))
            })
            .collect()
    }

    /// The access rules of the core's engine (the default is `allow` until one is set).
    pub fn acl(&self) -> meridian_core::acl::Acl {
        meridian_core::acl::Acl::new(
            self.acl_default.unwrap_or(Permission::Allow),
            self.acl.iter().filter_map(|r| r.rule().ok()).collect(),
        )
    }
}

/// Why a document could not be loaded or a sync message applied.
#[derive(Debug, thiserror::Error)]
pub enum DocError {
    #[error("not a policy document: {0}")]
    Load(String),
    #[error("sync message refused: {0}")]
    Sync(String),
    #[error("the document would grow past {max} bytes ({size})")]
    TooLarge { size: usize, max: usize },
}

/// A replica of the policy document.
#[derive(Debug, Clone)]
pub struct PolicyDoc {
    doc: AutoCommit,
    objs: Vec<ObjId>,
    /// How many times the document was compacted: each compaction starts a new document
    /// (a new genesis) from the state of the previous one.
    epoch: u64,
}

impl PolicyDoc {
    /// The document as every node starts it, edited from now on as `actor`.
    pub fn genesis(actor: ActorId) -> Self {
        Self::genesis_of(0, actor)
    }

    /// The genesis of `epoch`, the same on every node.
    fn genesis_of(epoch: u64, actor: ActorId) -> Self {
        let mut doc = AutoCommit::new().with_actor(ActorId::from(GENESIS_ACTOR));
        let mut objs = Vec::with_capacity(OBJECTS.len());
        for (key, kind) in OBJECTS {
            // Infallible on a fresh document: the root is a map.
            objs.push(doc.put_object(ROOT, key, kind).expect("root is a map"));
        }
        doc.put(ROOT, "schema", SCHEMA).expect("root is a map");
        let e = i64::try_from(epoch).unwrap_or(i64::MAX);
        doc.put(ROOT, "epoch", e).expect("root is a map");
        doc.commit_with(
            CommitOptions::default()
                .with_message("genesis")
                .with_time(0),
        );
        doc.set_actor(actor);
        Self { doc, objs, epoch }
    }

    /// A saved document, edited from now on as `actor`.
    pub fn load(bytes: &[u8], actor: ActorId) -> Result<Self, DocError> {
        let mut doc = AutoCommit::load(bytes).map_err(|e| DocError::Load(e.to_string()))?;
        doc.set_actor(actor);
        let epoch = epoch_of(&mut doc)?;
        let objs = genesis_objects(&doc, epoch)?;
        Ok(Self { doc, objs, epoch })
    }

    /// How many compactions the document has been through.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The whole document, compacted.
    pub fn save(&mut self) -> Vec<u8> {
        self.doc.save()
    }

    /// The current heads (equal heads, equal documents).
    pub fn heads(&mut self) -> Vec<automerge::ChangeHash> {
        self.doc.get_heads()
    }

    /// Apply `edits` as one change. Returns whether anything changed (an edit that changes
    /// nothing writes nothing).
    pub fn apply(
        &mut self,
        edits: &[Edit],
        author: &Author,
        now_ms: i64,
    ) -> Result<bool, EditError> {
        for e in edits {
            e.check()?;
        }
        let mut what = Vec::new();
        for e in edits {
            // What the document says with the edits before this one.
            let before = self.policy();
            match self.write(e, &before) {
                Ok(true) => what.push(e.describe()),
                Ok(false) => {}
                Err(err) => {
                    // None of the batch is written.
                    self.doc.rollback();
                    return Err(err);
                }
            }
        }
        if what.is_empty() {
            self.doc.rollback();
            return Ok(false);
        }
        let note = ChangeNote {
            author: author.clone(),
            what,
            edits: edits.to_vec(),
        };
        let message = serde_json::to_string(&note).unwrap_or_default();
        self.doc.commit_with(
            CommitOptions::default()
                .with_message(message)
                .with_time(now_ms),
        );
        Ok(true)
    }

    /// [`apply`](Self::apply), refused if it would make the saved document larger than
    /// `max_bytes` (the bound every peer holds it to: past it, no peer would take it).
    pub fn apply_bounded(
        &mut self,
        edits: &[Edit],
        author: &Author,
        now_ms: i64,
        max_bytes: usize,
    ) -> Result<bool, EditError> {
        let mut trial = self.clone();
        if !trial.apply(edits, author, now_ms)? {
            return Ok(false);
        }
        let size = trial.save().len();
        if size > max_bytes {
            return Err(EditError::Invalid(format!(
                "the policy document would grow to {size} bytes, past policy.max_document_bytes \
                 ({max_bytes})"
            )));
        }
        *self = trial;
        Ok(true)
    }

    /// Write one edit (uncommitted). Whether it changes what the document says.
    fn write(&mut self, edit: &Edit, before: &Policy) -> Result<bool, EditError> {
        let put = |doc: &mut AutoCommit, obj: &ObjId, key: &str, value: String| {
            doc.put(obj, key, value)
                .map_err(|e| EditError::Invalid(e.to_string()))
        };
        match edit {
            Edit::UserSet { name, hash } => {
                if before.users.get(name) == Some(hash) {
                    return Ok(false);
                }
                let v = json(&SecretEntry { hash: hash.clone() });
                put(&mut self.doc, &self.objs[0], name, v)?;
            }
            Edit::UserRemove { name } => {
                if !before.users.contains_key(name) {
                    return Err(EditError::NotFound(format!("no user {name:?}")));
                }
                put(&mut self.doc, &self.objs[0], name, REMOVED.to_owned())?;
            }
            Edit::TokenSet { kind, name, hash } => {
                let current = match kind {
                    TokenKind::Admin => &before.admin_tokens,
                    TokenKind::Edge => &before.edge_tokens,
                };
                if current.get(name) == Some(hash) {
                    return Ok(false);
                }
                let v = json(&SecretEntry { hash: hash.clone() });
                let obj = self.objs[kind.object()].clone();
                put(&mut self.doc, &obj, name, v)?;
            }
            Edit::TokenRemove { kind, name } => {
                let current = match kind {
                    TokenKind::Admin => &before.admin_tokens,
                    TokenKind::Edge => &before.edge_tokens,
                };
                if !current.contains_key(name) {
                    return Err(EditError::NotFound(format!(
                        "no {} token {name:?}",
                        kind_name(*kind)
                    )));
                }
                let obj = self.objs[kind.object()].clone();
                put(&mut self.doc, &obj, name, REMOVED.to_owned())?;
            }
            Edit::ResidencySet { filter, regions } => {
                let set: BTreeSet<String> = regions.iter().cloned().collect();
                if before.residency.get(filter) == Some(&set) {
                    return Ok(false);
                }
                let v = json(&ResidencyEntry {
                    regions: set.into_iter().collect(),
                });
                put(&mut self.doc, &self.objs[4], filter, v)?;
            }
            Edit::ResidencyRemove { filter } => {
                if !before.residency.contains_key(filter) {
                    return Err(EditError::NotFound(format!(
                        "no residency rule for {filter:?}"
                    )));
                }
                put(&mut self.doc, &self.objs[4], filter, REMOVED.to_owned())?;
            }
            Edit::Node {
                peer_id,
                name,
                region,
            } => {
                let entry = NodeEntry {
                    name: name.clone(),
                    region: region.clone(),
                };
                if before.nodes.get(peer_id) == Some(&entry) {
                    return Ok(false);
                }
                let v = json(&entry);
                put(&mut self.doc, &self.objs[NODES], peer_id, v)?;
            }
            Edit::NodeRemove { peer_id } => {
                if !before.nodes.contains_key(peer_id) {
                    return Ok(false);
                }
                put(
                    &mut self.doc,
                    &self.objs[NODES],
                    peer_id,
                    REMOVED.to_owned(),
                )?;
            }
            Edit::AclDefault { permission } => {
                let p: Permission =
                    permission
                        .parse()
                        .map_err(|e: meridian_core::acl::RuleError| {
                            EditError::Invalid(e.to_string())
                        })?;
                if before.acl_default == Some(p) {
                    return Ok(false);
                }
                put(&mut self.doc, &ROOT, "acl_default", p.to_string())?;
            }
            Edit::AclAdd { rule, before: at } => {
                if before.acl.iter().any(|r| r == rule) {
                    return Ok(false);
                }
                // The list's own index of the `at`-th rule of the policy (or the end), found
                // before the same rule's other entries are taken out.
                let list = self.objs[1].clone();
                let place = at
                    .and_then(|i| before.acl.get(i))
                    .and_then(|r| self.raw_index(r));
                let removed = self.remove_rule(rule);
                let index = match place {
                    Some(i) => i - removed.iter().filter(|&&r| r < i).count(),
                    None => self.doc.length(&list),
                };
                self.doc
                    .insert(&list, index, json(rule))
                    .map_err(|e| EditError::Invalid(e.to_string()))?;
            }
            Edit::AclRemove { rule } => {
                if self.remove_rule(rule).is_empty() {
                    return Err(EditError::NotFound(format!("no rule {rule}")));
                }
            }
        }
        Ok(true)
    }

    /// The list index of the first entry of `rule`'s key.
    fn raw_index(&self, rule: &RuleEntry) -> Option<usize> {
        self.raw_rules()
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.key() == rule.key()))
    }

    /// Take out every entry of `rule`'s key; the list indexes they had.
    fn remove_rule(&mut self, rule: &RuleEntry) -> Vec<usize> {
        let list = self.objs[1].clone();
        let hits: Vec<usize> = self
            .raw_rules()
            .iter()
            .enumerate()
            .filter(|(_, r)| r.as_ref().is_some_and(|r| r.key() == rule.key()))
            .map(|(i, _)| i)
            .collect();
        for &i in hits.iter().rev() {
            // The index was read just now from the same list.
            let _ = self.doc.delete(&list, i);
        }
        hits
    }

    /// The access-rule list as written, `None` where an entry cannot be read.
    fn raw_rules(&self) -> Vec<Option<RuleEntry>> {
        let list = &self.objs[1];
        (0..self.doc.length(list))
            .map(|i| {
                text(self.doc.get(list, i).ok().flatten().map(|(v, _)| v))
                    .and_then(|s| serde_json::from_str::<RuleEntry>(&s).ok())
                    .filter(|r| r.rule().is_ok())
            })
            .collect()
    }

    /// What the document says, every conflict decided by its kind's rule.
    pub fn policy(&self) -> Policy {
        let mut p = Policy::default();
        let mut unreadable = 0;
        p.users = self.secrets(0, &mut unreadable);
        p.admin_tokens = self.secrets(2, &mut unreadable);
        p.edge_tokens = self.secrets(3, &mut unreadable);
        for (filter, values) in self.entries(RESIDENCY) {
            if check_filter(&filter).is_err() {
                unreadable += 1;
                continue;
            }
            // A value that cannot be read is a rule this node cannot follow: it keeps the
            // filter's messages in no other region (fails closed).
            let sets: Vec<BTreeSet<String>> = values
                .iter()
                .filter(|v| v.as_str() != REMOVED)
                .map(|v| match serde_json::from_str::<ResidencyEntry>(v) {
                    Ok(e) => e.regions.into_iter().collect(),
                    Err(_) => {
                        unreadable += 1;
                        BTreeSet::new()
                    }
                })
                .collect();
            // The regions every concurrent change allows.
            if let Some(first) = sets.first() {
                let keep = sets.iter().skip(1).fold(first.clone(), |acc, s| {
                    acc.intersection(s).cloned().collect()
                });
                p.residency.insert(filter, keep);
            }
        }
        for (peer, values) in self.entries(NODES) {
            if values.iter().any(|v| v == REMOVED) {
                continue;
            }
            match values
                .last()
                .and_then(|v| serde_json::from_str::<NodeEntry>(v).ok())
            {
                Some(n) => {
                    p.nodes.insert(peer, n);
                }
                None => unreadable += 1,
            }
        }
        let defaults = self
            .doc
            .get_all(ROOT, "acl_default")
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(v, _)| text(Some(v)).and_then(|s| s.parse::<Permission>().ok()))
            .collect::<Vec<_>>();
        p.acl_default = if defaults.contains(&Permission::Deny) {
            Some(Permission::Deny)
        } else {
            defaults.first().copied()
        };
        for r in self.raw_rules() {
            let Some(r) = r else {
                unreadable += 1;
                continue;
            };
            match p.acl.iter_mut().find(|seen| seen.key() == r.key()) {
                Some(seen) => {
                    if r.permission == "deny" {
                        seen.permission = r.permission;
                    }
                }
                None => p.acl.push(r),
            }
        }
        p.unreadable = unreadable;
        p
    }

    /// The live entries of a map of secrets (users, tokens): a removal among concurrent
    /// values wins, else the value automerge picks (the same on every node).
    fn secrets(&self, obj: usize, unreadable: &mut usize) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for (name, values) in self.entries(obj) {
            if values.iter().any(|v| v == REMOVED) {
                continue;
            }
            match values
                .last()
                .and_then(|v| serde_json::from_str::<SecretEntry>(v).ok())
                .filter(|e| e.hash.len() <= MAX_HASH_LEN && name.len() <= MAX_NAME_LEN)
            {
                Some(e) => {
                    out.insert(name, e.hash);
                }
                None => *unreadable += 1,
            }
        }
        out
    }

    /// Every key of a map with its concurrent values (automerge's winner last).
    fn entries(&self, obj: usize) -> Vec<(String, Vec<String>)> {
        let obj = &self.objs[obj];
        self.doc
            .keys(obj)
            .map(|key| {
                let values = self
                    .doc
                    .get_all(obj, key.as_str())
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|(v, _)| text(Some(v)))
                    .collect();
                (key, values)
            })
            .collect()
    }

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
                let note = c
                    .message
                    .as_deref()
                    .and_then(|m| serde_json::from_str::<ChangeNote>(m).ok());
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
            put(USERS, name, json(&SecretEntry { hash: hash.clone() }));
        }
        for kind in [TokenKind::Admin, TokenKind::Edge] {
            for (name, hash) in kind.of(&policy) {
                let hash = hash.clone();
                put(kind.object(), name, json(&SecretEntry { hash }));
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
            let Some(note) = change
                .message()
                .and_then(|m| serde_json::from_str::<ChangeNote>(m).ok())
            else {
                continue;
            };
            if note.author.by == "seed" {
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

    /// The next message for a peer whose sync state is `state`, if it needs one.
    pub fn sync_message(&mut self, state: &mut sync::State) -> Option<Vec<u8>> {
        self.doc
            .sync()
            .generate_sync_message(state)
            .map(sync::Message::encode)
    }

    /// Apply a peer's sync message. Refused, leaving the document as it was, when it is
    /// malformed or would make the saved document larger than `max_bytes`. Returns whether
    /// the document changed.
    pub fn receive_sync(
        &mut self,
        state: &mut sync::State,
        message: &[u8],
        max_bytes: usize,
    ) -> Result<bool, DocError> {
        let message = sync::Message::decode(message).map_err(|e| DocError::Sync(e.to_string()))?;
        let heads = self.doc.get_heads();
        if message.changes.is_empty() {
            self.doc
                .sync()
                .receive_sync_message(state, message)
                .map_err(|e| DocError::Sync(e.to_string()))?;
            return Ok(false);
        }
        // Changes: tried on a copy, kept only if the result is within bounds and still a
        // policy document.
        let mut doc = self.doc.clone();
        let mut trial = state.clone();
        doc.sync()
            .receive_sync_message(&mut trial, message)
            .map_err(|e| DocError::Sync(e.to_string()))?;
        let size = doc.save().len();
        if size > max_bytes {
            return Err(DocError::TooLarge {
                size,
                max: max_bytes,
            });
        }
        let objs = genesis_objects(&doc, self.epoch)?;
        let changed = doc.get_heads() != heads;
        self.doc = doc;
        self.objs = objs;
        *state = trial;
        Ok(changed)
    }
}

/// What a change of the history is, from its metadata.
#[derive(Debug)]
struct ChangeMeta {
    hash: automerge::ChangeHash,
    timestamp: i64,
    message: Option<String>,
}

/// The epoch a document's genesis names: of the values at `epoch`, the one whose genesis the
/// document holds (another written there by a peer changes nothing).
fn epoch_of(doc: &mut AutoCommit) -> Result<u64, DocError> {
    let candidates: Vec<u64> = doc
        .get_all(ROOT, "epoch")
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(v, _)| match v {
            Value::Scalar(v) => match v.as_ref() {
                automerge::ScalarValue::Int(e) => u64::try_from(*e).ok(),
                _ => None,
            },
            Value::Object(_) => None,
        })
        .collect();
    candidates
        .into_iter()
        .find(|&e| {
            let mut genesis = PolicyDoc::genesis_of(e, ActorId::from(GENESIS_ACTOR));
            genesis
                .doc
                .get_heads()
                .first()
                .is_some_and(|h| doc.get_change_meta_by_hash(h).is_some())
        })
        .ok_or_else(|| DocError::Load("it holds no policy document's genesis".to_owned()))
}

/// The genesis's objects in `doc`, which must hold the genesis of `epoch`.
fn genesis_objects(doc: &AutoCommit, epoch: u64) -> Result<Vec<ObjId>, DocError> {
    let genesis = PolicyDoc::genesis_of(epoch, ActorId::from(GENESIS_ACTOR));
    genesis
        .objs
        .iter()
        .map(|id| {
            doc.import_obj(&id.to_string())
                .ok()
                .filter(|id| doc.object_type(id).is_ok())
                .ok_or_else(|| DocError::Load("it lacks the policy document's genesis".to_owned()))
        })
        .collect()
}

/// A string value.
fn text(v: Option<Value<'_>>) -> Option<String> {
    match v? {
        Value::Scalar(s) => match s.as_ref() {
            automerge::ScalarValue::Str(s) => Some(s.to_string()),
            _ => None,
        },
        Value::Object(_) => None,
    }
}

/// An entry's JSON. The entry types are plain structs of strings: serializing them cannot
/// fail.
fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;

    /// Three valid password hashes (Argon2 is slow: made once).
    fn hashes() -> &'static [String; 3] {
        static H: OnceLock<[String; 3]> = OnceLock::new();
        H.get_or_init(|| {
            ["one", "two", "three"].map(|p| crate::passwd::hash(p.as_bytes()).unwrap())
        })
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
            },
            Edit::UserSet {
                name: "bob".into(),
                hash: "plain".into(),
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
                permission: "allow".into(),
            },
            3,
        )
        .unwrap();
        edit(
            &mut b,
            Edit::AclDefault {
                permission: "deny".into(),
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
                b.receive_sync(&mut sb, &m, max)?;
                quiet = false;
                n += 1;
            }
            if let Some(m) = b.sync_message(&mut sb) {
                a.receive_sync(&mut sa, &m, max)?;
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
        assert!(a.receive_sync(&mut s, b"\x42\x00garbage", 1 << 20).is_err());
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
                permission: p.into()
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
}
