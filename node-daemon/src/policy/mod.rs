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
//!
//! **Compaction.** An automerge document keeps every change it ever had. Every
//! `policy.compact_interval_ms` the node with the smallest peer id of the document's nodes
//! checks whether `policy.compact_after_changes` changes were made since the last compaction,
//! or the history lists a change older than `policy.history_retention_days`; if so, and
//! every node of the document is linked to it with the same document (same heads), it starts
//! the next epoch: a new document holding what this one says, with the history of the
//! retention kept one change at a time and older changes as one summary
//! ([`PolicyDoc::compacted`]). It sends it whole on every policy stream; a node that gets a
//! later epoch takes it and makes again on it the edits it made meanwhile
//! ([`PolicyDoc::replay_onto`]). A node that joins later gets it the same way.
//!
//! On the policy streams each message is a tag (0: a sync message, 1: a whole document), the
//! sender's epoch (8 bytes, big-endian), and the body.

pub mod claim_key;
pub mod document;
pub mod operator;
pub mod tokens;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use automerge::ActorId;
use automerge::sync;
use futures_util::FutureExt as _;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, error, info, warn};

use document::{Author, DocError, Edit, EditError, HistoryEntry, Policy, PolicyDoc, TokenKind, by};
use tokens::TokenSet;

/// The saved document's file name in the data directory.
pub const DOCUMENT_FILE: &str = "policy.automerge";
/// Policy stream message tags.
const TAG_SYNC: u8 = 0;
const TAG_DOCUMENT: u8 = 1;
/// Requests waiting for the policy task.
const QUEUE: usize = 256;
/// What the tokens of `admin.token_file` are named (and the start of their hash).
pub const ADMIN_FILE_TOKEN: &str = "token-file";
/// What the tokens of `cluster.edge.token_file` are named (and the start of their hash).
pub const EDGE_FILE_TOKEN: &str = "edge-token-file";

/// What the document says now (a new one after every change: the policy streams wake on it).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The document's epoch (compactions).
    pub epoch: u64,
    /// How many times the policy task started again after a failure: the policy streams of
    /// an earlier start end (their sync states are gone with it).
    pub restarts: u64,
    pub policy: Arc<Policy>,
    admin_tokens: Arc<TokenSet>,
    edge_tokens: Arc<TokenSet>,
}

impl Snapshot {
    fn of(epoch: u64, restarts: u64, policy: Policy) -> Self {
        Self {
            epoch,
            restarts,
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
    /// History listed change by change; older changes are summarised at the next compaction.
    pub history_retention_ms: u64,
    /// Changes since the last compaction that call for the next one.
    pub compact_after_changes: usize,
    /// How often compaction is considered.
    pub compact_interval_ms: u64,
    /// A node of the document with no policy stream to this one for this long is taken out
    /// of it (`cluster.peer_expiry_ms`, as the mesh forgets it); 0 = never.
    pub node_expiry_ms: u64,
    /// What seeds a new document.
    pub seed: Seed,
    /// Where refused sync messages and restarts of the task are counted.
    pub counters: Arc<crate::mailbox::DaemonCounters>,
    /// `policy.operator_keys`: with any, a change counts only if one of them signed it
    /// ([`operator`]).
    pub operator_keys: operator::OperatorKeys,
}

/// What the files say, for a new document.
#[derive(Debug, Clone, Default)]
pub struct Seed {
    pub users: Vec<(String, String)>,
    pub acl: meridian_core::acl::Acl,
    pub admin_tokens: TokenSet,
    pub edge_tokens: TokenSet,
}

/// The files that seed a new document (`policy.source = "document"`, first start); an empty
/// path is no file.
#[derive(Debug, Clone, Default)]
pub struct SeedFiles {
    /// `auth.password_file`.
    pub password_file: PathBuf,
    /// `[acl]`, read with the configuration.
    pub acl: meridian_core::acl::Acl,
    /// `admin.token_file`.
    pub admin_token_file: PathBuf,
    /// `cluster.edge.token_file`.
    pub edge_token_file: PathBuf,
}

impl Seed {
    /// What the files say; nothing is read for a data directory that holds a document
    /// already (the files seed a new one only).
    pub fn read(data_dir: &Path, files: &SeedFiles) -> anyhow::Result<Self> {
        if data_dir.join(DOCUMENT_FILE).exists() {
            return Ok(Self::default());
        }
        let mut users: Vec<(String, String)> = if files.password_file.as_os_str().is_empty() {
            Vec::new()
        } else {
            crate::passwd::load(&files.password_file)?
                .into_iter()
                .collect()
        };
        users.sort();
        Ok(Self {
            users,
            acl: files.acl.clone(),
            admin_tokens: TokenSet::from_file(
                &files.admin_token_file,
                "admin.token_file",
                ADMIN_FILE_TOKEN,
            )?,
            edge_tokens: TokenSet::from_file(
                &files.edge_token_file,
                "cluster.edge.token_file",
                EDGE_FILE_TOKEN,
            )?,
        })
    }

    fn edits(&self) -> Vec<Edit> {
        let mut edits: Vec<Edit> = self
            .users
            .iter()
            .map(|(name, hash)| Edit::UserSet {
                name: name.clone(),
                hash: hash.clone(),
                claim_key: None,
            })
            .collect();
        edits.push(Edit::AclDefault {
            permission: self.acl.default_permission(),
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
        peer: String,
        reply: oneshot::Sender<Option<Vec<u8>>>,
    },
    SyncIn {
        session: u64,
        peer: String,
        message: Vec<u8>,
        reply: oneshot::Sender<Result<(), DocError>>,
    },
    SyncEnd {
        session: u64,
    },
    /// The whole document and its epoch.
    Document(oneshot::Sender<(u64, Vec<u8>)>),
    /// Signed changes (`meridian ctl --operator-key`).
    Changes {
        changes: Vec<automerge::Change>,
        reply: oneshot::Sender<Result<bool, DocError>>,
    },
    /// A signed document of a later epoch (`meridian ctl --operator-key ... policy compact`).
    Epoch {
        document: Vec<u8>,
        reply: oneshot::Sender<Result<u64, DocError>>,
    },
    /// Fails half-way, as a bug would (the tests of [`PolicyTask::restart`]).
    #[cfg(test)]
    Fail,
}

/// The way to the policy task.
#[derive(Debug, Clone)]
pub struct PolicyHandle {
    tx: mpsc::Sender<Cmd>,
    snapshot: watch::Receiver<Snapshot>,
    /// Shared with the task ([`PolicyHandle::compaction_waits_for`]).
    waiting: Arc<Mutex<Vec<String>>>,
    /// `policy.max_document_bytes`: what a policy stream takes at most in one message.
    max_document_bytes: usize,
    /// `policy.operator_keys` is set.
    signed: bool,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Edit { .. } => "Edit",
            Self::History(_) => "History",
            Self::SyncOut { .. } => "SyncOut",
            Self::SyncIn { .. } => "SyncIn",
            Self::SyncEnd { .. } => "SyncEnd",
            Self::Document(_) => "Document",
            Self::Changes { .. } => "Changes",
            Self::Epoch { .. } => "Epoch",
            #[cfg(test)]
            Self::Fail => "Fail",
        })
    }
}

fn stopped() -> EditError {
    EditError::Storage("the policy task has stopped".to_owned())
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
        let signed = !settings.operator_keys.is_empty();
        let mut doc = match std::fs::read(&path) {
            Ok(bytes) => PolicyDoc::load(&bytes, actor)
                .with_context(|| format!("the policy document {}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && signed => {
                info!(
                    path = %path.display(),
                    "policy document: new and empty; with policy.operator_keys, users, rules and \
                     tokens come from changes an operator key signs (`meridian ctl \
                     --operator-key FILE`), not from the files"
                );
                PolicyDoc::genesis(actor)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut doc = PolicyDoc::genesis(actor);
                doc.apply(&settings.seed.edits(), &author(by::SEED), now)
                    .context("seeding the policy document from the configuration's files")?;
                info!(path = %path.display(), "policy document seeded from the files");
                doc
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", path.display()));
            }
        };
        if signed {
            let unsigned = doc.unsigned_changes(&settings.operator_keys);
            if unsigned > 0 {
                warn!(
                    changes = unsigned,
                    "policy document: changes no operator key signed (made before \
                     policy.operator_keys was set) stay in force on this node, but no other \
                     node takes them: `meridian ctl --operator-key FILE policy compact` signs \
                     what the document says now as the deployment's next epoch"
                );
            }
        } else if let Some(peer_id) = &settings.peer_id {
            let me = Edit::Node {
                peer_id: peer_id.clone(),
                name: settings.node.clone(),
                region: settings.region.clone(),
            };
            doc.apply(&[me], &author(by::NODE), now)
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
        let (snapshot_tx, snapshot) = watch::channel(Snapshot::of(doc.epoch(), 0, policy));
        let (tx, rx) = mpsc::channel(QUEUE);
        let max_document_bytes = settings.max_document_bytes;
        let waiting = Arc::new(Mutex::new(Vec::new()));
        let task = PolicyTask {
            waiting: waiting.clone(),
            doc,
            path,
            settings,
            sessions: HashMap::new(),
            snapshot: snapshot_tx,
            quiet_heads: None,
            last_seen: HashMap::new(),
            started_ms: now_ms(),
            restarts: 0,
        };
        tokio::spawn(task.run(rx));
        Ok(Self {
            tx,
            snapshot,
            waiting,
            max_document_bytes,
            signed,
        })
    }

    /// The nodes a compaction that is due waits for: those that do not hold this node's
    /// document yet (cut off, or behind). Empty when none is due, or none is waited for.
    pub fn compaction_waits_for(&self) -> Vec<String> {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The largest document it takes (`policy.max_document_bytes`).
    pub fn max_document_bytes(&self) -> usize {
        self.max_document_bytes
    }

    /// What the document says now, and every later change.
    pub fn watch(&self) -> watch::Receiver<Snapshot> {
        self.snapshot.clone()
    }

    /// How many times the document was compacted.
    pub fn epoch(&self) -> u64 {
        self.snapshot.borrow().epoch
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

    /// The next message for `peer` on `session`, if it needs one.
    pub async fn sync_out(&self, session: u64, peer: &str) -> Option<Vec<u8>> {
        let (reply, answer) = oneshot::channel();
        let peer = peer.to_owned();
        let cmd = Cmd::SyncOut {
            session,
            peer,
            reply,
        };
        self.tx.send(cmd).await.ok()?;
        answer.await.ok().flatten()
    }

    /// A message from `peer` on `session`.
    pub async fn sync_in(
        &self,
        session: u64,
        peer: &str,
        message: Vec<u8>,
    ) -> Result<(), DocError> {
        let peer = peer.to_owned();
        self.ask(|reply| Cmd::SyncIn {
            session,
            peer,
            message,
            reply,
        })
        .await
    }

    /// Send the task the command `cmd` makes with a reply channel, and wait for the answer; a
    /// task that stopped (or failed on the command) is an error.
    async fn ask<T>(
        &self,
        cmd: impl FnOnce(oneshot::Sender<Result<T, DocError>>) -> Cmd,
    ) -> Result<T, DocError> {
        let (reply, answer) = oneshot::channel();
        let gone = || DocError::Sync("the policy task did not answer".to_owned());
        self.tx.send(cmd(reply)).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// The session ended: forget its sync state.
    pub async fn sync_end(&self, session: u64) {
        let _ = self.tx.send(Cmd::SyncEnd { session }).await;
    }

    /// Whether changes count only when an operator key signed them (`policy.operator_keys`).
    pub fn signed(&self) -> bool {
        self.signed
    }

    /// The whole document (what `meridian ctl --operator-key` makes its change on) and its
    /// epoch.
    pub async fn document(&self) -> Option<(u64, Vec<u8>)> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Cmd::Document(reply)).await.ok()?;
        answer.await.ok()
    }

    /// Apply changes an operator key signed (each one checked). Whether the document changed.
    pub async fn submit_changes(&self, changes: Vec<automerge::Change>) -> Result<bool, DocError> {
        self.ask(|reply| Cmd::Changes { changes, reply }).await
    }

    /// Take a signed document of a later epoch. Its epoch.
    pub async fn submit_epoch(&self, document: Vec<u8>) -> Result<u64, DocError> {
        self.ask(|reply| Cmd::Epoch { document, reply }).await
    }
}

struct PolicyTask {
    doc: PolicyDoc,
    path: PathBuf,
    settings: PolicySettings,
    /// Per mesh policy stream.
    sessions: HashMap<u64, Session>,
    snapshot: watch::Sender<Snapshot>,
    /// The heads at the last compaction check: a document compacts only once it stayed the
    /// same for a whole interval.
    quiet_heads: Option<Vec<automerge::ChangeHash>>,
    /// When each peer last sent a policy message (ms since the Unix epoch).
    last_seen: HashMap<String, i64>,
    started_ms: i64,
    /// Times the task started again after a failure ([`Snapshot::restarts`]).
    restarts: u64,
    /// The nodes the last compaction check found without this node's document, while one
    /// was due ([`PolicyHandle::compaction_waits_for`]).
    waiting: Arc<Mutex<Vec<String>>>,
}

/// A policy stream to a peer.
#[derive(Debug, Default)]
struct Session {
    peer: String,
    /// Automerge's sync state, for this node's epoch.
    state: sync::State,
    /// The epoch the peer's last message named.
    their_epoch: Option<u64>,
    /// Messages to send before any sync message (a whole document).
    outbox: std::collections::VecDeque<Vec<u8>>,
    /// The epoch whose document it was sent.
    sent_document: Option<u64>,
}

/// The state of a policy stream, new at its first message.
fn session_in(sessions: &mut HashMap<u64, Session>, session: u64, peer: String) -> &mut Session {
    sessions.entry(session).or_insert_with(|| Session {
        peer,
        ..Session::default()
    })
}

/// A policy stream message.
fn frame(tag: u8, epoch: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + body.len());
    out.push(tag);
    out.extend_from_slice(&epoch.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A policy stream message's tag, epoch and body.
fn unframe(message: &[u8]) -> Result<(u8, u64, &[u8]), DocError> {
    let bad = || DocError::Sync("a policy message shorter than its header".to_owned());
    let (&tag, rest) = message.split_first().ok_or_else(bad)?;
    let (epoch, body) = rest.split_first_chunk::<8>().ok_or_else(bad)?;
    Ok((tag, u64::from_be_bytes(*epoch), body))
}

impl PolicyTask {
    async fn run(mut self, mut rx: mpsc::Receiver<Cmd>) {
        let every = std::time::Duration::from_millis(self.settings.compact_interval_ms.max(10));
        let mut compaction = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        compaction.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let cmd = tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(cmd) => cmd,
                    None => return,
                },
                _ = compaction.tick() => {
                    if AssertUnwindSafe(self.tick()).catch_unwind().await.is_err() {
                        self.restart("compaction");
                    }
                    continue;
                }
            };
            let what = format!("{cmd:?}");
            if AssertUnwindSafe(self.handle(cmd))
                .catch_unwind()
                .await
                .is_err()
            {
                self.restart(&what);
            }
        }
    }

    /// What is due every `compact_interval_ms`.
    async fn tick(&mut self) {
        self.expire_nodes().await;
        if self.compaction_due() {
            self.compact().await;
        }
    }

    /// A request made the task fail half-way: start again from the saved document (every
    /// change it holds was saved before it counted), with fresh sync states (peers send
    /// again what this node lacks). The request's caller gets no answer; a policy stream
    /// whose message it was ends.
    fn restart(&mut self, what: &str) {
        self.settings
            .counters
            .policy_task_restarts
            .fetch_add(1, Ordering::Relaxed);
        self.sessions.clear();
        self.quiet_heads = None;
        let saved = fresh_actor().map_err(|e| e.to_string()).and_then(|actor| {
            let bytes = std::fs::read(&self.path).map_err(|e| e.to_string())?;
            PolicyDoc::load(&bytes, actor).map_err(|e| e.to_string())
        });
        match saved {
            Ok(doc) => {
                self.doc = doc;
                error!(
                    request = what,
                    path = %self.path.display(),
                    "policy task failed; started again from its saved document"
                );
            }
            Err(e) => error!(
                error = %e,
                request = what,
                "policy task failed, and its saved document cannot be read; it goes on with \
                 the document it had"
            ),
        }
        self.restarts += 1;
        let snapshot = Snapshot::of(self.doc.epoch(), self.restarts, self.doc.policy());
        self.snapshot.send_replace(snapshot);
    }

    async fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Edit { reply, .. } if self.signed() => {
                let _ = reply.send(Err(EditError::Refused(
                    "this deployment's policy changes are signed by an operator key: \
                     `meridian ctl --operator-key FILE ...` makes them"
                        .to_owned(),
                )));
            }
            Cmd::Edit { edits, by, reply } => {
                let author = self.author(by);
                let max = self.settings.max_document_bytes;
                let r = self.doc.apply_bounded(&edits, &author, now_ms(), max);
                let r = match r {
                    Ok(true) => self.changed().await.map(|()| true),
                    other => other,
                };
                let _ = reply.send(r);
            }
            Cmd::History(reply) => {
                let _ = reply.send(self.doc.history());
            }
            Cmd::SyncOut {
                session,
                peer,
                reply,
            } => {
                let epoch = self.doc.epoch();
                let s = session_in(&mut self.sessions, session, peer);
                let message = match s.outbox.pop_front() {
                    Some(m) => Some(m),
                    None => self
                        .doc
                        .sync_message(&mut s.state)
                        .map(|m| frame(TAG_SYNC, epoch, &m)),
                };
                let _ = reply.send(message);
            }
            Cmd::SyncIn {
                session,
                peer,
                message,
                reply,
            } => {
                let r = self.receive(session, peer, &message).await;
                if r.is_err() {
                    self.settings
                        .counters
                        .policy_sync_refused
                        .fetch_add(1, Ordering::Relaxed);
                }
                let _ = reply.send(r);
            }
            Cmd::SyncEnd { session } => {
                self.sessions.remove(&session);
            }
            Cmd::Document(reply) => {
                let _ = reply.send((self.doc.epoch(), self.doc.save()));
            }
            Cmd::Changes { changes, reply } => {
                let max = self.settings.max_document_bytes;
                let keys = &self.settings.operator_keys;
                let r = if keys.is_empty() {
                    Err(DocError::Unsigned(
                        "this node has no policy.operator_keys: it takes edits (POST /api/policy)"
                            .to_owned(),
                    ))
                } else {
                    self.doc.receive_changes(changes, keys, max)
                };
                let r = match r {
                    Ok(true) => self
                        .changed()
                        .await
                        .map(|()| true)
                        .map_err(|e| DocError::Sync(e.to_string())),
                    other => other,
                };
                let _ = reply.send(r);
            }
            Cmd::Epoch { document, reply } => {
                let r = if self.signed() {
                    self.take_epoch(&document, None, "meridian ctl").await
                } else {
                    Err(DocError::Unsigned(
                        "this node has no policy.operator_keys: it compacts by itself".to_owned(),
                    ))
                };
                let _ = reply.send(r.map(|()| self.doc.epoch()));
            }
            #[cfg(test)]
            Cmd::Fail => {
                // The document as a bug might leave it: changed in memory, not saved.
                let author = self.author("bug".to_owned());
                let edit = Edit::AclDefault {
                    permission: meridian_core::acl::Permission::Deny,
                };
                let _ = self.doc.apply(&[edit], &author, now_ms());
                panic!("a failure half-way");
            }
        }
    }

    fn author(&self, by: String) -> Author {
        Author {
            by,
            node: self.settings.node.clone(),
            region: self.settings.region.clone(),
        }
    }

    /// A message from a peer: a sync message of its epoch, or a whole document.
    async fn receive(
        &mut self,
        session: u64,
        peer: String,
        message: &[u8],
    ) -> Result<(), DocError> {
        let (tag, epoch, body) = unframe(message)?;
        self.last_seen.insert(peer.clone(), now_ms());
        let mine = self.doc.epoch();
        let max = self.settings.max_document_bytes;
        match tag {
            TAG_SYNC => {
                let s = session_in(&mut self.sessions, session, peer);
                s.their_epoch = Some(epoch);
                if epoch < mine {
                    // Behind: it gets this epoch's document, once.
                    if s.sent_document != Some(mine) {
                        s.sent_document = Some(mine);
                        let whole = frame(TAG_DOCUMENT, mine, &self.doc.save());
                        if let Some(s) = self.sessions.get_mut(&session) {
                            s.outbox.push_back(whole);
                        }
                    }
                    return Ok(());
                }
                if epoch > mine {
                    // Ahead: its document is on its way.
                    return Ok(());
                }
                let keys = Some(&self.settings.operator_keys).filter(|k| !k.is_empty());
                if self.doc.receive_sync(&mut s.state, body, max, keys)? {
                    self.changed()
                        .await
                        .map_err(|e| DocError::Sync(e.to_string()))?;
                }
                Ok(())
            }
            TAG_DOCUMENT if epoch > mine => {
                self.take_epoch(body, Some(epoch), &peer).await?;
                session_in(&mut self.sessions, session, peer).their_epoch = Some(epoch);
                Ok(())
            }
            TAG_DOCUMENT => Ok(()),
            _ => Err(DocError::Sync(format!("unknown policy message tag {tag}"))),
        }
    }

    /// Take a whole document of a later epoch than this node's (from a peer's policy stream,
    /// naming `named` as its epoch, or from `meridian ctl`), checked as every peer's bytes
    /// are, and with operator keys, signed. Without operator keys this node's edits since
    /// the previous epoch are made again on it.
    async fn take_epoch(
        &mut self,
        body: &[u8],
        named: Option<u64>,
        from: &str,
    ) -> Result<(), DocError> {
        let max = self.settings.max_document_bytes;
        let mine = self.doc.epoch();
        if body.len() > max {
            return Err(DocError::TooLarge {
                size: body.len(),
                max,
            });
        }
        document::screen::document(body, max.saturating_mul(document::screen::INFLATE_FACTOR))?;
        let mut next = PolicyDoc::load(
            body,
            fresh_actor().map_err(|e| DocError::Load(e.to_string()))?,
        )?;
        let epoch = next.epoch();
        if named.is_some_and(|n| n != epoch) {
            return Err(DocError::Load(
                "its epoch is not the one it names".to_owned(),
            ));
        }
        if epoch <= mine {
            return Err(DocError::Behind(format!(
                "a document of epoch {epoch}, where this node's is {mine}"
            )));
        }
        if self.signed() {
            next.verify(&self.settings.operator_keys)?;
            info!(
                from,
                epoch,
                "policy document: took the deployment's next epoch, signed by an operator key"
            );
        } else {
            match self.doc.replay_onto(&mut next) {
                Some(replayed) => info!(
                    from,
                    epoch,
                    replayed,
                    "policy document: took the deployment's next epoch, with this node's \
                     edits since"
                ),
                None => warn!(
                    from,
                    epoch,
                    mine,
                    "policy document: took the deployment's document; this node missed \
                     more than one compaction, its edits since are not carried over"
                ),
            }
            // This node is one of the deployment's, whatever the document it took says.
            if let Some(peer_id) = &self.settings.peer_id {
                let me = Edit::Node {
                    peer_id: peer_id.clone(),
                    name: self.settings.node.clone(),
                    region: self.settings.region.clone(),
                };
                let _ = next.apply(&[me], &self.author(by::NODE.to_owned()), now_ms());
            }
        }
        self.switch(next).await;
        Ok(())
    }

    fn signed(&self) -> bool {
        !self.settings.operator_keys.is_empty()
    }

    /// Whether this node should compact the document now: it is the one that does (the
    /// smallest peer id among the document's nodes), there is something to compact, and
    /// every other node of the document holds the same document.
    fn compaction_due(&mut self) -> bool {
        self.set_waiting(Vec::new());
        // With operator keys, an operator compacts (`meridian ctl policy compact`).
        if self.signed() {
            return false;
        }
        let policy = self.doc.policy();
        let me = self.settings.peer_id.as_deref();
        // One node compacts: the smallest of the document's nodes, if it is one of them.
        if me.is_some_and(|me| !policy.nodes.contains_key(me))
            || policy.nodes.keys().map(String::as_str).chain(me).min() != me
        {
            return false;
        }
        // The document stayed the same for a whole interval: every peer's latest word on it
        // is fresher than the last change.
        let heads = self.doc.heads();
        let unchanged = self.quiet_heads.as_ref() == Some(&heads);
        self.quiet_heads = Some(heads.clone());
        if !unchanged {
            return false;
        }
        let enough = self.doc.changes_since_base() >= self.settings.compact_after_changes.max(1);
        let cutoff = now_ms()
            .saturating_sub(i64::try_from(self.settings.history_retention_ms).unwrap_or(i64::MAX));
        let aged = self.doc.oldest_listed_ms().is_some_and(|t| t < cutoff);
        if !enough && !aged {
            return false;
        }
        let epoch = self.doc.epoch();
        let behind: Vec<&String> = policy
            .nodes
            .keys()
            .filter(|n| Some(n.as_str()) != me)
            .filter(|n| {
                !self.sessions.values().any(|s| {
                    s.peer == **n
                        && s.their_epoch == Some(epoch)
                        && s.state.their_heads.as_ref() == Some(&heads)
                })
            })
            .collect();
        if behind.is_empty() {
            return true;
        }
        debug!(
            nodes = ?behind,
            "policy compaction waits for every node to hold the same document"
        );
        let behind = behind.into_iter().cloned().collect();
        self.set_waiting(behind);
        false
    }

    fn set_waiting(&self, nodes: Vec<String>) {
        *self.waiting.lock().unwrap_or_else(PoisonError::into_inner) = nodes;
    }

    /// Take out of the document the nodes no policy stream came from for
    /// `node_expiry_ms` (counted from this node's start at the earliest): the mesh forgets
    /// them after as long, and compaction does not wait for them.
    async fn expire_nodes(&mut self) {
        let expiry = self.settings.node_expiry_ms;
        // With operator keys, nodes do not write the document.
        if expiry == 0 || self.signed() {
            return;
        }
        let now = now_ms();
        let cutoff = now.saturating_sub(i64::try_from(expiry).unwrap_or(i64::MAX));
        let me = self.settings.peer_id.as_deref();
        let gone: Vec<Edit> = self
            .doc
            .policy()
            .nodes
            .keys()
            .filter(|n| Some(n.as_str()) != me)
            .filter(|n| !self.sessions.values().any(|s| s.peer == **n))
            .filter(|n| self.last_seen.get(*n).copied().unwrap_or(self.started_ms) < cutoff)
            .map(|n| Edit::NodeRemove { peer_id: n.clone() })
            .collect();
        if gone.is_empty() {
            return;
        }
        let author = self.author(by::EXPIRY.to_owned());
        match self.doc.apply(&gone, &author, now) {
            Ok(true) => {
                info!(
                    nodes = gone.len(),
                    "policy document: nodes gone for good taken out"
                );
                if let Err(e) = self.changed().await {
                    warn!(error = %e, "policy document: not saved");
                }
            }
            Ok(false) => {}
            Err(e) => warn!(error = %e, "policy document: cannot take out nodes gone for good"),
        }
    }

    /// Start the next epoch from this document.
    async fn compact(&mut self) {
        let author = self.author(by::COMPACTION.to_owned());
        let actor = match fresh_actor() {
            Ok(a) => a,
            Err(e) => {
                warn!(error = %e, "policy document: cannot compact");
                return;
            }
        };
        let changes = self.doc.changes_since_base();
        let before = self.doc.save().len();
        let next = self
            .doc
            .compacted(&author, now_ms(), self.settings.history_retention_ms, actor);
        self.switch(next).await;
        let after = self.doc.save().len();
        info!(
            epoch = self.doc.epoch(),
            changes,
            bytes_before = before,
            bytes_after = after,
            "policy document compacted"
        );
    }

    /// This node's document is now `next` (a later epoch): every peer behind gets it whole.
    async fn switch(&mut self, next: PolicyDoc) {
        self.doc = next;
        let epoch = self.doc.epoch();
        let whole = frame(TAG_DOCUMENT, epoch, &self.doc.save());
        for s in self.sessions.values_mut() {
            s.state = sync::State::new();
            if s.their_epoch.is_none_or(|e| e < epoch) && s.sent_document != Some(epoch) {
                s.sent_document = Some(epoch);
                s.outbox.push_back(whole.clone());
            }
        }
        if let Err(e) = self.changed().await {
            warn!(error = %e, "policy document: the new epoch is in force but not saved");
        }
    }

    /// The document changed: save it and tell everyone who follows it.
    async fn changed(&mut self) -> Result<(), EditError> {
        let policy = self.doc.policy();
        let bytes = self.doc.save();
        self.snapshot
            .send_replace(Snapshot::of(self.doc.epoch(), self.restarts, policy));
        let path = self.path.clone();
        match tokio::task::spawn_blocking(move || save(&path, &bytes)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                warn!(error = %e, path = %self.path.display(), "cannot save the policy document");
                Err(EditError::Storage(format!(
                    "applied, but the document could not be saved: {e}"
                )))
            }
            Err(e) => Err(EditError::Storage(format!("saving panicked: {e}"))),
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
    i64::try_from(crate::clock::unix_ms()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, counters: Arc<crate::mailbox::DaemonCounters>) -> PolicySettings {
        PolicySettings {
            data_dir: dir.to_owned(),
            node: "n".to_owned(),
            region: "r".to_owned(),
            peer_id: None,
            max_document_bytes: 1 << 20,
            history_retention_ms: 86_400_000,
            compact_after_changes: 1_000,
            compact_interval_ms: 3_600_000,
            node_expiry_ms: 0,
            seed: Seed::default(),
            counters,
            operator_keys: operator::OperatorKeys::default(),
        }
    }

    #[tokio::test]
    async fn a_task_that_fails_starts_again_from_its_saved_document() {
        let dir = tempfile::tempdir().unwrap();
        let counters = Arc::new(crate::mailbox::DaemonCounters::default());
        let policy = PolicyHandle::start(settings(dir.path(), counters.clone()))
            .await
            .unwrap();
        let rule = |filter: &str| Edit::AclAdd {
            rule: document::RuleEntry {
                permission: "deny".to_owned(),
                action: "subscribe".to_owned(),
                topic: filter.to_owned(),
                user: None,
                client_id: None,
            },
            before: None,
        };
        assert!(
            policy
                .edit(vec![rule("saved/#")], "t".into())
                .await
                .unwrap()
        );
        let mut watch = policy.watch();
        watch.borrow_and_update();
        policy.tx.send(Cmd::Fail).await.unwrap();
        watch.changed().await.unwrap();
        assert_eq!(watch.borrow().restarts, 1);
        assert_eq!(counters.policy_task_restarts.load(Ordering::Relaxed), 1);
        // It answers again, with the saved document: the saved rule, not what the failure
        // left in memory.
        assert!(
            policy
                .edit(vec![rule("after/#")], "t".into())
                .await
                .unwrap()
        );
        let now = policy.current();
        let filters: Vec<&str> = now.acl.iter().map(|r| r.topic.as_str()).collect();
        assert_eq!(filters, ["saved/#", "after/#"]);
        assert_eq!(now.acl_default, Some(meridian_core::acl::Permission::Allow));
    }
}
