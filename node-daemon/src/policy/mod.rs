//! The cluster policy (`[policy] source = "document"`): users, access rules, admin and
//! edge-link tokens and data-residency rules as one replicated document ([`document`]).
//!
//! One task owns the document ([`PolicyHandle`] talks to it): it applies edits from the
//! admin API, applies and produces the sync messages of the mesh's policy streams, saves the
//! document (`storage.data_dir/policy.automerge`, written whole and renamed into place) after
//! every change, and publishes what the document now says ([`Snapshot`]), which the
//! authenticator, the access rules, the admin API and the edge listener follow.
//!
//! On the first start (no saved document) the files seed it: the password file's users, the
//! `[acl]` rules, `admin.token_file` and `cluster.edge.token_file`, in one change by `seed`.
//! Every start then records the node itself (`nodes/PEER_ID`: its name and region).

pub mod api;
pub mod document;
pub mod tokens;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use automerge::ActorId;
use automerge::sync;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};

use document::{Author, DocError, Edit, EditError, HistoryEntry, Policy, PolicyDoc, TokenKind};
use tokens::TokenSet;

/// The saved document's file name in the data directory.
pub const DOCUMENT_FILE: &str = "policy.automerge";
/// Requests waiting for the policy task.
const QUEUE: usize = 256;

/// What the document says now.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Counts the document's changes since this process started (sync sessions wake on it).
    pub version: u64,
    pub policy: Arc<Policy>,
    admin_tokens: Arc<TokenSet>,
    edge_tokens: Arc<TokenSet>,
}

impl Snapshot {
    fn of(version: u64, policy: Policy) -> Self {
        Self {
            version,
            admin_tokens: Arc::new(TokenSet::from_hashes(&policy.admin_tokens)),
            edge_tokens: Arc::new(TokenSet::from_hashes(&policy.edge_tokens)),
            policy: Arc::new(policy),
        }
    }

    /// The tokens of one kind.
    pub fn tokens(&self, kind: TokenKind) -> &TokenSet {
        match kind {
            TokenKind::Admin => &self.admin_tokens,
            TokenKind::Edge => &self.edge_tokens,
        }
    }
}

/// What the policy task needs.
#[derive(Debug, Clone)]
pub struct PolicySettings {
    pub data_dir: PathBuf,
    /// This node's name, region and (cluster mode) peer id, for the history and `nodes`.
    pub node: String,
    pub region: String,
    pub peer_id: Option<String>,
    pub max_document_bytes: usize,
    /// What seeds a new document.
    pub seed: Seed,
}

/// What the files say, for a new document.
#[derive(Debug, Clone, Default)]
pub struct Seed {
    pub users: Vec<(String, String)>,
    pub acl: meridian_core::acl::Acl,
    pub admin_tokens: TokenSet,
    pub edge_tokens: TokenSet,
}

impl PolicySettings {
    /// The settings of a daemon with `config`; `peer_id` in cluster mode. The files are read
    /// only when there is no saved document yet (they seed it).
    pub fn from_config(
        config: &crate::config::DaemonConfig,
        peer_id: Option<String>,
    ) -> anyhow::Result<Self> {
        let data_dir = config.storage.data_dir.clone();
        let seed = if data_dir.join(DOCUMENT_FILE).exists() {
            Seed::default()
        } else {
            Seed::from_files(config)?
        };
        Ok(Self {
            data_dir,
            node: config.node.name.clone(),
            region: if config.cluster.enabled {
                config.cluster.region.clone()
            } else {
                String::new()
            },
            peer_id,
            max_document_bytes: config.policy.max_document_bytes,
            seed,
        })
    }
}

impl Seed {
    /// What `auth.password_file`, `[acl]`, `admin.token_file` and `cluster.edge.token_file`
    /// say.
    pub fn from_files(config: &crate::config::DaemonConfig) -> anyhow::Result<Self> {
        let mut users: Vec<(String, String)> = if config.auth.password_file.is_empty() {
            Vec::new()
        } else {
            crate::passwd::load(Path::new(&config.auth.password_file))?
                .into_iter()
                .collect()
        };
        users.sort();
        let edge_tokens = crate::edge::file_tokens(&config.cluster.edge)?;
        Ok(Self {
            users,
            acl: config.acl.clone(),
            admin_tokens: crate::admin::AdminAccess::file_tokens(&config.admin)?,
            edge_tokens,
        })
    }

    fn edits(&self) -> Vec<Edit> {
        let mut edits: Vec<Edit> = self
            .users
            .iter()
            .map(|(name, hash)| Edit::UserSet {
                name: name.clone(),
                hash: hash.clone(),
            })
            .collect();
        edits.push(Edit::AclDefault {
            permission: self.acl.default_permission().to_string(),
        });
        edits.extend(self.acl.rules().iter().map(|r| Edit::AclAdd {
            rule: document::RuleEntry::of(r),
            before: None,
        }));
        for (kind, set) in [
            (TokenKind::Admin, &self.admin_tokens),
            (TokenKind::Edge, &self.edge_tokens),
        ] {
            edits.extend(set.iter().map(|(name, hash)| Edit::TokenSet {
                kind,
                name: name.clone(),
                hash: hash.clone(),
            }));
        }
        edits
    }
}

enum Cmd {
    Edit {
        edits: Vec<Edit>,
        by: String,
        reply: oneshot::Sender<Result<bool, EditError>>,
    },
    History(oneshot::Sender<Vec<HistoryEntry>>),
    SyncOut {
        session: u64,
        reply: oneshot::Sender<Option<Vec<u8>>>,
    },
    SyncIn {
        session: u64,
        message: Vec<u8>,
        reply: oneshot::Sender<Result<(), DocError>>,
    },
    SyncEnd {
        session: u64,
    },
}

/// The way to the policy task.
#[derive(Debug, Clone)]
pub struct PolicyHandle {
    tx: mpsc::Sender<Cmd>,
    snapshot: watch::Receiver<Snapshot>,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Edit { .. } => "Edit",
            Self::History(_) => "History",
            Self::SyncOut { .. } => "SyncOut",
            Self::SyncIn { .. } => "SyncIn",
            Self::SyncEnd { .. } => "SyncEnd",
        })
    }
}

fn stopped() -> EditError {
    EditError::Invalid("the policy task has stopped".to_owned())
}

impl PolicyHandle {
    /// Load the saved document, or seed a new one; record this node in it; start the task.
    pub async fn start(settings: PolicySettings) -> anyhow::Result<Self> {
        let path = settings.data_dir.join(DOCUMENT_FILE);
        let actor = fresh_actor()?;
        let author = |by: &str| Author {
            by: by.to_owned(),
            node: settings.node.clone(),
            region: settings.region.clone(),
        };
        let now = now_ms();
        let mut doc = match std::fs::read(&path) {
            Ok(bytes) => PolicyDoc::load(&bytes, actor)
                .with_context(|| format!("the policy document {}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut doc = PolicyDoc::genesis(actor);
                doc.apply(&settings.seed.edits(), &author("seed"), now)
                    .context("seeding the policy document from the configuration's files")?;
                info!(path = %path.display(), "policy document seeded from the files");
                doc
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", path.display()));
            }
        };
        if let Some(peer_id) = &settings.peer_id {
            let me = Edit::Node {
                peer_id: peer_id.clone(),
                name: settings.node.clone(),
                region: settings.region.clone(),
            };
            doc.apply(&[me], &author("node"), now)
                .context("recording this node in the policy document")?;
        }
        std::fs::create_dir_all(&settings.data_dir).with_context(|| {
            format!(
                "cannot create data directory {}",
                settings.data_dir.display()
            )
        })?;
        save(&path, &doc.save()).with_context(|| format!("cannot write {}", path.display()))?;
        let policy = doc.policy();
        if policy.unreadable > 0 {
            warn!(
                entries = policy.unreadable,
                "policy document: entries that cannot be read are left out"
            );
        }
        let (snapshot_tx, snapshot) = watch::channel(Snapshot::of(0, policy));
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = PolicyTask {
            doc,
            path,
            settings,
            sessions: HashMap::new(),
            version: 0,
            snapshot: snapshot_tx,
        };
        tokio::spawn(task.run(rx));
        Ok(Self { tx, snapshot })
    }

    /// What the document says now, and every later change.
    pub fn watch(&self) -> watch::Receiver<Snapshot> {
        self.snapshot.clone()
    }

    /// What the document says now.
    pub fn current(&self) -> Arc<Policy> {
        self.snapshot.borrow().policy.clone()
    }

    /// Apply `edits` as one change made by `by` (an admin token's name). Whether anything
    /// changed.
    pub async fn edit(&self, edits: Vec<Edit>, by: String) -> Result<bool, EditError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Cmd::Edit { edits, by, reply })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Every change, oldest first.
    pub async fn history(&self) -> Vec<HistoryEntry> {
        let (reply, answer) = oneshot::channel();
        if self.tx.send(Cmd::History(reply)).await.is_err() {
            return Vec::new();
        }
        answer.await.unwrap_or_default()
    }

    /// The next sync message for the peer of `session`, if it needs one.
    pub async fn sync_out(&self, session: u64) -> Option<Vec<u8>> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Cmd::SyncOut { session, reply }).await.ok()?;
        answer.await.ok().flatten()
    }

    /// A sync message from the peer of `session`.
    pub async fn sync_in(&self, session: u64, message: Vec<u8>) -> Result<(), DocError> {
        let (reply, answer) = oneshot::channel();
        let gone = || DocError::Sync("the policy task has stopped".to_owned());
        self.tx
            .send(Cmd::SyncIn {
                session,
                message,
                reply,
            })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// The session ended: forget its sync state.
    pub async fn sync_end(&self, session: u64) {
        let _ = self.tx.send(Cmd::SyncEnd { session }).await;
    }
}

struct PolicyTask {
    doc: PolicyDoc,
    path: PathBuf,
    settings: PolicySettings,
    /// Sync state per mesh policy stream.
    sessions: HashMap<u64, sync::State>,
    version: u64,
    snapshot: watch::Sender<Snapshot>,
}

impl PolicyTask {
    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        while let Some(cmd) = rx.recv().await {
            match cmd {
                Cmd::Edit { edits, by, reply } => {
                    let author = Author {
                        by,
                        node: self.settings.node.clone(),
                        region: self.settings.region.clone(),
                    };
                    let r = self.doc.apply(&edits, &author, now_ms());
                    let r = match r {
                        Ok(true) => self.changed().await.map(|()| true),
                        other => other,
                    };
                    let _ = reply.send(r);
                }
                Cmd::History(reply) => {
                    let _ = reply.send(self.doc.history());
                }
                Cmd::SyncOut { session, reply } => {
                    let state = self.sessions.entry(session).or_default();
                    let _ = reply.send(self.doc.sync_message(state));
                }
                Cmd::SyncIn {
                    session,
                    message,
                    reply,
                } => {
                    let state = self.sessions.entry(session).or_default();
                    let r =
                        self.doc
                            .receive_sync(state, &message, self.settings.max_document_bytes);
                    let r = match r {
                        Ok(true) => self
                            .changed()
                            .await
                            .map_err(|e| DocError::Sync(e.to_string())),
                        Ok(false) => Ok(()),
                        Err(e) => Err(e),
                    };
                    let _ = reply.send(r);
                }
                Cmd::SyncEnd { session } => {
                    self.sessions.remove(&session);
                }
            }
        }
    }

    /// The document changed: save it and tell everyone who follows it.
    async fn changed(&mut self) -> Result<(), EditError> {
        self.version += 1;
        let policy = self.doc.policy();
        let bytes = self.doc.save();
        self.snapshot
            .send_replace(Snapshot::of(self.version, policy));
        let path = self.path.clone();
        match tokio::task::spawn_blocking(move || save(&path, &bytes)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                warn!(error = %e, path = %self.path.display(), "cannot save the policy document");
                Err(EditError::Invalid(format!(
                    "applied, but the document could not be saved: {e}"
                )))
            }
            Err(e) => Err(EditError::Invalid(format!("saving panicked: {e}"))),
        }
    }
}

/// Write `bytes` to `path` whole: a temporary file, synced, renamed over it.
fn save(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension("automerge.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A new actor for this process's edits: no two processes ever share one.
fn fresh_actor() -> anyhow::Result<ActorId> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(ActorId::from(&bytes[..]))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
