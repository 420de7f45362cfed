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

mod history;
pub mod screen;
pub mod signed;

pub use history::HistoryEntry;

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

/// Who made a change, where no admin token did: the names [`Author::by`] takes then.
pub mod by {
    /// What the files seeded a new document with.
    pub const SEED: &str = "seed";
    /// A node's own entry.
    pub const NODE: &str = "node";
    /// A new epoch.
    pub const COMPACTION: &str = "compaction";
    /// A node taken out of the document for want of news from it.
    pub const EXPIRY: &str = "expiry";
    /// A request without a token to an admin API on loopback that has none.
    pub const LOCAL: &str = "local";
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
    /// Add a user or change its password (`hash` is a PHC string, `$argon2id$...`), with the
    /// public half of the key its password derives for claims (`claim_key`, 64 hex digits;
    /// [`crate::policy::claim_key`]).
    UserSet {
        name: String,
        hash: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        claim_key: Option<String>,
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
        #[serde(with = "as_text")]
        permission: Permission,
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
    /// Not this way: with operator keys, edits are made by `meridian ctl --operator-key`.
    #[error("{0}")]
    Refused(String),
}

impl Edit {
    /// Check the edit's values before it is written.
    fn check(&self) -> Result<(), EditError> {
        let bad = |s: String| Err(EditError::Invalid(s));
        let name_ok = |n: &str| !n.is_empty() && n.len() <= MAX_NAME_LEN && !n.contains(':');
        match self {
            Self::UserSet {
                name,
                hash,
                claim_key,
            } => {
                if claim_key
                    .as_deref()
                    .is_some_and(|k| k.len() != 64 || hex::decode(k).is_err())
                {
                    return bad("claim_key: 64 hex digits".to_owned());
                }
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
            Self::AclDefault { .. } => {}
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
    /// The admin token's name, or one of [`by`]'s names for the changes a node makes itself
    /// or a request without a token to a node on loopback that has none.
    pub by: String,
    /// The node's name.
    pub node: String,
    /// Its region (empty outside cluster mode).
    pub region: String,
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
    /// A user's claim key ([`Edit::UserSet`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    claim_key: Option<String>,
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
    /// User name → the public half of the key its password derives for claims (64 hex
    /// digits), for the users that have one.
    pub claim_keys: BTreeMap<String, String>,
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
    /// With operator keys: a change no operator key signed.
    #[error("not signed by an operator key: {0}")]
    Unsigned(String),
    /// A change that depends on what this document does not hold.
    #[error("{0}")]
    Behind(String),
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
            Edit::UserSet {
                name,
                hash,
                claim_key,
            } => {
                if before.users.get(name) == Some(hash)
                    && before.claim_keys.get(name) == claim_key.as_ref()
                {
                    return Ok(false);
                }
                let v = json(&SecretEntry {
                    hash: hash.clone(),
                    claim_key: claim_key.clone(),
                });
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
                let v = json(&SecretEntry {
                    hash: hash.clone(),
                    claim_key: None,
                });
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
            Edit::AclDefault { permission: p } => {
                let p = *p;
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
        let users = self.secrets(0, &mut unreadable);
        p.claim_keys = users
            .iter()
            .filter_map(|(n, e)| Some((n.clone(), e.claim_key.clone()?)))
            .collect();
        p.users = users.into_iter().map(|(n, e)| (n, e.hash)).collect();
        p.admin_tokens = hashes(self.secrets(2, &mut unreadable));
        p.edge_tokens = hashes(self.secrets(3, &mut unreadable));
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
    fn secrets(&self, obj: usize, unreadable: &mut usize) -> BTreeMap<String, SecretEntry> {
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
                    out.insert(name, e);
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

    /// The next message for a peer whose sync state is `state`, if it needs one.
    pub fn sync_message(&mut self, state: &mut sync::State) -> Option<Vec<u8>> {
        self.doc
            .sync()
            .generate_sync_message(state)
            .map(sync::Message::encode)
    }

    /// Apply a peer's sync message. Refused, leaving the document as it was, when it is
    /// malformed, fails the [`screen`], holds a change none of `keys` signed (with operator
    /// keys), or would make the saved document larger than `max_bytes`. Returns whether
    /// the document changed.
    pub fn receive_sync(
        &mut self,
        state: &mut sync::State,
        message: &[u8],
        max_bytes: usize,
        keys: Option<&crate::policy::operator::OperatorKeys>,
    ) -> Result<bool, DocError> {
        let inflated = max_bytes.saturating_mul(screen::INFLATE_FACTOR);
        let message = screen::sync_message(message, inflated)?;
        if let Some(keys) = keys {
            for change in signed::changes_of(&message).map_err(DocError::Sync)? {
                signed::verify_change(&change, self.epoch, keys).map_err(DocError::Unsigned)?;
            }
        }
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
        let changed = self.keep_trial(doc, max_bytes)?;
        *state = trial;
        Ok(changed)
    }

    /// Keep `doc`, a copy of this document that took a peer's changes, if its saved form is
    /// within `max_bytes` and it is still a policy document of this epoch. Whether it
    /// differs from this one.
    fn keep_trial(&mut self, mut doc: AutoCommit, max_bytes: usize) -> Result<bool, DocError> {
        let size = doc.save().len();
        if size > max_bytes {
            return Err(DocError::TooLarge {
                size,
                max: max_bytes,
            });
        }
        let objs = genesis_objects(&doc, self.epoch)?;
        let changed = doc.get_heads() != self.doc.get_heads();
        self.doc = doc;
        self.objs = objs;
        Ok(changed)
    }
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
        .find(|&e| genesis_hash(e).is_some_and(|h| doc.get_change_meta_by_hash(&h).is_some()))
        .ok_or_else(|| DocError::Load("it holds no policy document's genesis".to_owned()))
}

/// The hash of the genesis of `epoch` (the same change on every node).
fn genesis_hash(epoch: u64) -> Option<automerge::ChangeHash> {
    PolicyDoc::genesis_of(epoch, ActorId::from(GENESIS_ACTOR))
        .doc
        .get_heads()
        .first()
        .copied()
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

/// The hashes of secrets by name.
fn hashes(secrets: BTreeMap<String, SecretEntry>) -> BTreeMap<String, String> {
    secrets.into_iter().map(|(n, e)| (n, e.hash)).collect()
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
mod tests;

/// A value written as its text (`Display`) and read back from it (`FromStr`), in the JSON of
/// edits and change notes: a permission is `"allow"` or `"deny"`.
mod as_text {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<T: Display, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}
