//! Persistence: the opaque records the broker core emits through
//! [`meridian_core::Output::Persist`], in a journal in front of one redb table.
//!
//! The engine hands every record of a turn over as one batch and commits it before any
//! acknowledgement of that turn is written to a socket. A commit writes the batch after the
//! last in the journal (`meridian.journal`, see [`journal`]) and, with `sync = "always"`,
//! waits for the disk to have it: one sequential write of about the records' own size, where a
//! commit to the B-tree would write every page it touches. The changes since the last
//! checkpoint are kept in memory too; once the journal holds `storage.journal_max_bytes`,
//! they are written to redb in one durable transaction (a record put and deleted in between,
//! as most of a link's outbox is, never reaches it) which also moves the journal to its next
//! generation, written from the start of the file again. At start, the batches of the current
//! generation are replayed over redb's table, up to one a crash tore. How a commit reaches the
//! disk is the sync policy ([`SyncPolicy`]).

pub mod journal;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use redb::{Database, Durability, ReadableTable, TableDefinition};
use serde::Deserialize;

/// When a commit reaches the disk (`storage.sync`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SyncPolicy {
    /// Every commit, before what depends on it is acknowledged.
    Always,
    /// At most `storage.sync_interval_ms` after a commit.
    Periodic,
    /// When the operating system writes its cache out.
    None,
}

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
/// The daemon's own bookkeeping (not the core's records).
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The journal's generation, in [`META`].
const GENERATION: &str = "journal_generation";

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "meridian.redb";
/// File name of the journal inside the data directory.
pub const JOURNAL_FILE: &str = "meridian.journal";
/// The least `storage.journal_max_bytes`.
pub const MIN_JOURNAL_BYTES: usize = 64 * 1024;

/// The least memory the store may keep for its pages (`storage.cache_bytes`). The default is
/// 16 MiB; redb's own default, 1 GiB, grows with what is stored, which the broker already holds:
/// the store is read once, at start, and written afterwards. Pages the cache does not keep are
/// read back through the operating system's file cache.
pub const MIN_CACHE_BYTES: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("cannot create data directory {path}: {error}")]
    CreateDir { path: String, error: std::io::Error },
    #[error("cannot open database {path}: {error}")]
    Open {
        path: String,
        error: redb::DatabaseError,
    },
    #[error("storage: {0}")]
    Redb(String),
    #[error("journal {path}: {error}")]
    Journal { path: String, error: std::io::Error },
    #[error("journal: {0}")]
    TooLarge(#[from] journal::TooLarge),
}

fn redb_err(e: impl std::fmt::Display) -> StorageError {
    StorageError::Redb(e.to_string())
}

/// The daemon's store.
pub struct Store {
    db: Database,
    journal: File,
    journal_path: String,
    /// The journal's generation: its batches since the last checkpoint carry it.
    generation: u64,
    /// Bytes of this generation's batches, from the start of the file.
    journal_len: usize,
    /// Past this, the next commit checkpoints.
    journal_max: usize,
    /// The changes since the last checkpoint, by key: the journal's contents, folded.
    pending: BTreeMap<Bytes, Option<Bytes>>,
    /// The batch being framed (kept to reuse its memory).
    frame: BytesMut,
    sync: SyncPolicy,
    interval: Duration,
    last_sync: Instant,
    /// Commits since the last durable one.
    unsynced: bool,
    checkpoints: u64,
    syncs: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("sync", &self.sync)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Open (or create) the store in `dir`, keeping at most `cache_bytes` of its pages in memory
    /// and checkpointing once the journal holds `journal_max` bytes. The journal is replayed
    /// (and cut after its last whole batch).
    pub fn open(
        dir: &Path,
        sync: SyncPolicy,
        interval: Duration,
        cache_bytes: usize,
        journal_max: usize,
    ) -> Result<Self, StorageError> {
        std::fs::create_dir_all(dir).map_err(|error| StorageError::CreateDir {
            path: dir.display().to_string(),
            error,
        })?;
        let path = dir.join(DB_FILE);
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(&path)
            .map_err(|error| StorageError::Open {
                path: path.display().to_string(),
                error,
            })?;
        let txn = db.begin_write().map_err(redb_err)?;
        txn.open_table(RECORDS).map_err(redb_err)?;
        let generation = txn
            .open_table(META)
            .map_err(redb_err)?
            .get(GENERATION)
            .map_err(redb_err)?
            .map_or(0, |v| v.value());
        txn.commit().map_err(redb_err)?;
        let path = dir.join(JOURNAL_FILE);
        let journal_path = path.display().to_string();
        let io = |error| StorageError::Journal {
            path: journal_path.clone(),
            error,
        };
        let created = !path.exists();
        let mut journal = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        if created {
            // The new file's name is on disk before anything relies on what it holds.
            File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        let mut contents = Vec::new();
        journal.read_to_end(&mut contents).map_err(io)?;
        let contents = Bytes::from(contents);
        let replay = journal::replay(&contents, generation);
        let journal_max = journal_max.max(MIN_JOURNAL_BYTES);
        zero_past(&journal, &contents, replay.valid_len, journal_max).map_err(io)?;
        let mut pending = BTreeMap::new();
        for (key, value) in replay.batches.into_iter().flatten() {
            pending.insert(key, value);
        }
        Ok(Self {
            db,
            journal,
            journal_path,
            generation,
            journal_len: replay.valid_len,
            journal_max,
            pending,
            frame: BytesMut::new(),
            sync,
            interval,
            last_sync: Instant::now(),
            unsynced: false,
            checkpoints: 0,
            syncs: 0,
        })
    }

    fn journal_err(&self, error: std::io::Error) -> StorageError {
        StorageError::Journal {
            path: self.journal_path.clone(),
            error,
        }
    }

    /// The node's incarnation for this start: one more than the last start's, durably.
    pub fn next_incarnation(&mut self) -> Result<u64, StorageError> {
        let txn = self.db.begin_write().map_err(redb_err)?;
        let next = {
            let mut meta = txn.open_table(META).map_err(redb_err)?;
            let last = meta
                .get("incarnation")
                .map_err(redb_err)?
                .map_or(0, |v| v.value());
            let next = last + 1;
            meta.insert("incarnation", next).map_err(redb_err)?;
            next
        };
        txn.commit().map_err(redb_err)?;
        Ok(next)
    }

    /// Every stored record in key order, for [`meridian_core::Broker::restore`]: redb's table
    /// with the changes since the last checkpoint over it.
    pub fn load_all(&self) -> Result<Vec<(Bytes, Bytes)>, StorageError> {
        let txn = self.db.begin_read().map_err(redb_err)?;
        let table = txn.open_table(RECORDS).map_err(redb_err)?;
        let mut all = BTreeMap::new();
        for entry in table.iter().map_err(redb_err)? {
            let (k, v) = entry.map_err(redb_err)?;
            all.insert(
                Bytes::copy_from_slice(k.value()),
                Bytes::copy_from_slice(v.value()),
            );
        }
        for (key, value) in &self.pending {
            match value {
                Some(v) => all.insert(key.clone(), v.clone()),
                None => all.remove(key),
            };
        }
        Ok(all.into_iter().collect())
    }

    /// Apply puts (`Some`) and deletes (`None`) in order, as one batch of the journal, and
    /// commit it according to the sync policy. Once the journal is full,
    /// [`Store::checkpoint_due`] says so: a checkpoint writes the B-tree, which the caller may
    /// want to do off the path of its commits.
    pub fn apply(&mut self, records: &[(Bytes, Option<Bytes>)]) -> Result<(), StorageError> {
        self.apply_with(records, self.commit_syncs())
    }

    /// [`Store::apply`] without waiting for the disk, whatever the sync policy, for records
    /// that may wait for the next batch that does
    /// ([`meridian_core::broker::record_may_wait`]): one fsync of the journal takes every
    /// earlier batch along.
    pub fn apply_deferred(
        &mut self,
        records: &[(Bytes, Option<Bytes>)],
    ) -> Result<(), StorageError> {
        self.apply_with(records, false)
    }

    fn apply_with(
        &mut self,
        records: &[(Bytes, Option<Bytes>)],
        durable: bool,
    ) -> Result<(), StorageError> {
        if records.is_empty() {
            return Ok(());
        }
        self.frame.clear();
        journal::encode(self.generation, records, &mut self.frame)?;
        let at = u64::try_from(self.journal_len).unwrap_or(u64::MAX);
        if let Err(error) = self.journal.write_all_at(&self.frame, at) {
            // What was written of it is a torn batch: the next start drops it, the next
            // commit writes over it. Nothing the batch held is acknowledged.
            return Err(self.journal_err(error));
        }
        if durable {
            self.journal.sync_data().map_err(|e| self.journal_err(e))?;
            self.syncs += 1;
            self.last_sync = Instant::now();
            self.unsynced = false;
        } else {
            self.unsynced = true;
        }
        self.journal_len += self.frame.len();
        for (key, value) in records {
            self.pending.insert(key.clone(), value.clone());
        }
        Ok(())
    }

    /// Whether the journal holds `journal_max_bytes`: time for [`Store::checkpoint`].
    pub fn checkpoint_due(&self) -> bool {
        self.journal_len >= self.journal_max
    }

    /// Writes the changes since the last checkpoint to redb in one durable transaction, which
    /// also moves the journal to its next generation: from then on the old batches are
    /// leftovers a replay does not read, and new ones are written from the start of the file.
    pub fn checkpoint(&mut self) -> Result<(), StorageError> {
        if self.pending.is_empty() && self.journal_len == 0 {
            return Ok(());
        }
        let mut txn = self.db.begin_write().map_err(redb_err)?;
        txn.set_durability(Durability::Immediate);
        {
            let mut table = txn.open_table(RECORDS).map_err(redb_err)?;
            for (key, value) in &self.pending {
                match value {
                    Some(v) => {
                        table.insert(key.as_ref(), v.as_ref()).map_err(redb_err)?;
                    }
                    None => {
                        table.remove(key.as_ref()).map_err(redb_err)?;
                    }
                }
            }
            let mut meta = txn.open_table(META).map_err(redb_err)?;
            meta.insert(GENERATION, self.generation + 1)
                .map_err(redb_err)?;
        }
        txn.commit().map_err(redb_err)?;
        self.generation += 1;
        self.pending.clear();
        self.journal_len = 0;
        self.unsynced = false;
        self.last_sync = Instant::now();
        self.checkpoints += 1;
        Ok(())
    }

    /// Checkpoints since the store was opened.
    pub fn checkpoints(&self) -> u64 {
        self.checkpoints
    }

    /// Pages the cache has let go of because it was full, since the store was opened: a count
    /// that keeps growing says `storage.cache_bytes` is smaller than what the broker writes.
    pub fn cache_evictions(&self) -> u64 {
        self.db.cache_stats().evictions()
    }

    /// Whether [`Store::apply`] waits for the disk (an fsync): only with the `always` policy.
    /// The periodic policy fsyncs in [`Store::sync`] when [`Store::sync_due`] says so.
    pub fn commit_syncs(&self) -> bool {
        self.sync == SyncPolicy::Always
    }

    /// When the periodic policy wants the next fsync, if anything is waiting for one.
    pub fn sync_due(&self) -> Option<Instant> {
        (self.sync == SyncPolicy::Periodic && self.unsynced).then(|| self.last_sync + self.interval)
    }

    /// Make every commit so far durable (the journal reaches the disk).
    pub fn sync(&mut self) -> Result<(), StorageError> {
        if !self.unsynced {
            return Ok(());
        }
        self.journal.sync_data().map_err(|e| self.journal_err(e))?;
        self.syncs += 1;
        self.unsynced = false;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Fsyncs of the journal since the store was opened (checkpoints not counted).
    pub fn syncs(&self) -> u64 {
        self.syncs
    }
}

/// Zeros in the journal from `valid_len` (where its current generation's last whole batch
/// ends) to its end, and up to `journal_max` bytes, written and synced; `contents` is what the
/// file holds.
///
/// A batch a crash tore was never acknowledged: it goes, with whatever follows it, so that
/// nothing beyond this generation's last batch can be taken for one of its own (a replay
/// stops at zeros). Every block up to the journal's size is then written once, so a commit
/// writes over blocks the file has, and its fdatasync has no size or extent of the file to
/// write: one data write and a flush, about a quarter less system time and wall time per
/// commit than an append (docs/benchmarks.md, "Across regions").
fn zero_past(
    journal: &File,
    contents: &[u8],
    valid_len: usize,
    journal_max: usize,
) -> std::io::Result<()> {
    // Page by page: the operating system then keeps the file's pages at that size, where
    // larger writes would leave large pages that a small commit dirties, and that count as
    // written, whole (a megabyte per commit in `/proc/PID/io` for a 4 KiB write).
    const CHUNK: usize = 4096;
    let dirty_to = contents[valid_len..]
        .iter()
        .rposition(|&b| b != 0)
        .map_or(valid_len, |last| valid_len + last + 1);
    // What follows the last whole batch and is not zero yet, and what the file lacks of its
    // size.
    let ranges = [
        valid_len..dirty_to,
        contents.len()..contents.len().max(journal_max),
    ];
    if ranges.iter().all(|r| r.is_empty()) {
        return Ok(());
    }
    let zeros = [0u8; CHUNK];
    for range in ranges {
        let mut at = range.start;
        while at < range.end {
            let n = (CHUNK - at % CHUNK).min(range.end - at);
            journal.write_all_at(&zeros[..n], at as u64)?;
            at += n;
        }
    }
    journal.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOURNAL_BYTES: usize = 1 << 20;

    fn open(dir: &Path, sync: SyncPolicy, interval: Duration) -> Store {
        Store::open(dir, sync, interval, MIN_CACHE_BYTES, JOURNAL_BYTES).unwrap()
    }

    #[test]
    fn records_survive_reopen_and_deletes_apply_in_order() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = open(dir.path(), SyncPolicy::Always, Duration::from_secs(1));
            s.apply(&[
                (Bytes::from_static(b"a"), Some(Bytes::from_static(b"1"))),
                (Bytes::from_static(b"b"), Some(Bytes::from_static(b"2"))),
                (Bytes::from_static(b"a"), None),
                (Bytes::from_static(b"c"), Some(Bytes::from_static(b"3"))),
            ])
            .unwrap();
        }
        let s = open(dir.path(), SyncPolicy::Always, Duration::from_secs(1));
        let all = s.load_all().unwrap();
        assert_eq!(
            all,
            vec![
                (Bytes::from_static(b"b"), Bytes::from_static(b"2")),
                (Bytes::from_static(b"c"), Bytes::from_static(b"3")),
            ]
        );
    }

    fn put(k: &str, v: &str) -> (Bytes, Option<Bytes>) {
        (Bytes::from(k.to_owned()), Some(Bytes::from(v.to_owned())))
    }

    fn del(k: &str) -> (Bytes, Option<Bytes>) {
        (Bytes::from(k.to_owned()), None)
    }

    fn records(s: &Store) -> Vec<(String, String)> {
        s.load_all()
            .unwrap()
            .into_iter()
            .map(|(k, v)| {
                (
                    String::from_utf8(k.to_vec()).unwrap(),
                    String::from_utf8(v.to_vec()).unwrap(),
                )
            })
            .collect()
    }

    fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Changes since a checkpoint come back from the journal, over what the checkpoint wrote;
    /// a record put and deleted between two checkpoints never reaches the database.
    #[test]
    fn the_journal_replays_over_the_last_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = open(dir.path(), SyncPolicy::Always, Duration::ZERO);
            s.apply(&[put("a", "1"), put("b", "1"), put("gone", "x")])
                .unwrap();
            s.apply(&[del("gone")]).unwrap();
            let size = std::fs::metadata(dir.path().join(JOURNAL_FILE))
                .unwrap()
                .len();
            s.checkpoint().unwrap();
            // The next generation writes over the last one's batches, in the file as it is.
            s.apply(&[put("a", "2"), del("b"), put("c", "3")]).unwrap();
            assert_eq!(
                std::fs::metadata(dir.path().join(JOURNAL_FILE))
                    .unwrap()
                    .len(),
                size
            );
        }
        let s = open(dir.path(), SyncPolicy::Always, Duration::ZERO);
        assert_eq!(records(&s), kv(&[("a", "2"), ("c", "3")]));
        let txn = s.db.begin_read().unwrap();
        let table = txn.open_table(RECORDS).unwrap();
        let in_db: Vec<String> = table
            .iter()
            .unwrap()
            .map(|e| String::from_utf8(e.unwrap().0.value().to_vec()).unwrap())
            .collect();
        assert_eq!(
            in_db,
            ["a", "b"],
            "the checkpoint wrote a and b, never gone"
        );
    }

    /// A batch a crash tore (half written) is dropped at the next start and cut from the
    /// file, and what follows is written after the last whole batch.
    #[test]
    fn a_torn_batch_is_dropped_and_the_journal_goes_on_after_the_last_whole_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        {
            let mut s = open(dir.path(), SyncPolicy::Always, Duration::ZERO);
            s.apply(&[put("a", "1")]).unwrap();
            s.apply(&[put("b", "2"), put("c", "3")]).unwrap();
        }
        let whole = Bytes::from(std::fs::read(&path).unwrap());
        let batches = journal::replay(&whole, 0).valid_len;
        // The second batch, cut short, and garbage after it.
        let mut torn = whole[..batches - 3].to_vec();
        torn.extend_from_slice(b"garbage");
        std::fs::write(&path, &torn).unwrap();
        {
            let mut s = open(dir.path(), SyncPolicy::Always, Duration::ZERO);
            assert_eq!(records(&s), kv(&[("a", "1")]));
            let file = std::fs::read(&path).unwrap();
            assert_eq!(file.len(), JOURNAL_BYTES, "written up to its size");
            assert!(
                file[s.journal_len..].iter().all(|&b| b == 0),
                "the torn batch and what followed it are gone"
            );
            s.apply(&[put("d", "4")]).unwrap();
        }
        let s = open(dir.path(), SyncPolicy::Always, Duration::ZERO);
        assert_eq!(records(&s), kv(&[("a", "1"), ("d", "4")]));
    }

    /// The journal is written whole when it is created, so that a commit writes over blocks
    /// the file has and never changes its size.
    #[test]
    fn commits_write_over_the_journal_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        let mut s = open(dir.path(), SyncPolicy::Always, Duration::ZERO);
        let file = std::fs::read(&path).unwrap();
        assert_eq!(file.len(), JOURNAL_BYTES);
        assert!(file.iter().all(|&b| b == 0));
        s.apply(&[put("a", "1")]).unwrap();
        s.apply(&[put("b", "2")]).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            JOURNAL_BYTES as u64
        );
        drop(s);
        let s = open(dir.path(), SyncPolicy::Always, Duration::ZERO);
        assert_eq!(records(&s), kv(&[("a", "1"), ("b", "2")]));
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            JOURNAL_BYTES as u64
        );
    }

    /// Once a checkpoint has moved the journal on, the batches it wrote are not read again,
    /// even where the file still holds them whole.
    #[test]
    fn a_checkpoint_leaves_its_batches_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL_FILE);
        {
            let mut s = open(dir.path(), SyncPolicy::Always, Duration::ZERO);
            s.apply(&[put("a", "1"), put("b", "1")]).unwrap();
            s.apply(&[del("a"), put("b", "2"), put("a", "3"), del("b")])
                .unwrap();
            let journal = std::fs::read(&path).unwrap();
            s.checkpoint().unwrap();
            drop(s);
            std::fs::write(&path, journal).unwrap();
        }
        let s = open(dir.path(), SyncPolicy::Always, Duration::ZERO);
        assert_eq!(records(&s), kv(&[("a", "3")]));
    }

    /// Past `journal_max_bytes` a checkpoint is due, as the engine asks after each commit.
    #[test]
    fn a_full_journal_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(
            dir.path(),
            SyncPolicy::None,
            Duration::ZERO,
            MIN_CACHE_BYTES,
            MIN_JOURNAL_BYTES,
        )
        .unwrap();
        let value = "v".repeat(1000);
        for i in 0..200 {
            s.apply(&[put(&format!("k{i:03}"), &value)]).unwrap();
            if s.checkpoint_due() {
                s.checkpoint().unwrap();
            }
        }
        assert!(s.checkpoints() >= 2, "{}", s.checkpoints());
        assert!(s.journal_len < MIN_JOURNAL_BYTES);
        drop(s);
        let s = open(dir.path(), SyncPolicy::None, Duration::ZERO);
        assert_eq!(s.load_all().unwrap().len(), 200);
    }

    #[test]
    fn incarnation_grows_on_every_start() {
        let dir = tempfile::tempdir().unwrap();
        let first = {
            let mut s = open(dir.path(), SyncPolicy::None, Duration::ZERO);
            s.next_incarnation().unwrap()
        };
        let mut s = open(dir.path(), SyncPolicy::None, Duration::ZERO);
        let second = s.next_incarnation().unwrap();
        assert_eq!((first, second), (1, 2));
        assert!(
            s.load_all().unwrap().is_empty(),
            "not one of the core's records"
        );
    }

    #[test]
    fn non_durable_commits_become_durable_on_sync() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut s = open(dir.path(), SyncPolicy::None, Duration::from_secs(1));
            s.apply(&[(Bytes::from_static(b"k"), Some(Bytes::from_static(b"v")))])
                .unwrap();
            assert!(s.unsynced);
            s.sync().unwrap();
            assert!(!s.unsynced);
        }
        let s = open(dir.path(), SyncPolicy::None, Duration::from_secs(1));
        assert_eq!(s.load_all().unwrap().len(), 1);
    }

    #[test]
    fn periodic_policy_defers_fsync_until_due() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path(), SyncPolicy::Periodic, Duration::from_secs(3600));
        assert_eq!(s.sync_due(), None);
        s.apply(&[(Bytes::from_static(b"k"), Some(Bytes::from_static(b"v")))])
            .unwrap();
        let due = s.sync_due().expect("a sync is pending");
        assert!(due > Instant::now());
        s.sync().unwrap();
        assert_eq!(s.sync_due(), None);
        let mut always = open(&dir.path().join("b"), SyncPolicy::Always, Duration::ZERO);
        always
            .apply(&[(Bytes::from_static(b"k"), Some(Bytes::from_static(b"v")))])
            .unwrap();
        assert_eq!(always.sync_due(), None, "always: durable at commit");
    }

    /// A batch that may wait does not wait for the disk; the next durable one takes it along.
    #[test]
    fn a_deferred_batch_waits_for_the_next_durable_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path(), SyncPolicy::Always, Duration::ZERO);
        s.apply_deferred(&[(Bytes::from_static(b"gone"), None)])
            .unwrap();
        assert!(s.unsynced, "written, not yet on the disk");
        s.apply(&[(Bytes::from_static(b"k"), Some(Bytes::from_static(b"v")))])
            .unwrap();
        assert!(!s.unsynced, "one fsync for both");
    }

    /// A periodic commit never waits for the disk itself, even when the interval has passed:
    /// the sync it is due is the caller's, at once.
    #[test]
    fn a_periodic_commit_past_its_interval_leaves_the_sync_to_the_caller() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path(), SyncPolicy::Periodic, Duration::ZERO);
        assert!(!s.commit_syncs());
        s.apply(&[(Bytes::from_static(b"k"), Some(Bytes::from_static(b"v")))])
            .unwrap();
        assert!(s.unsynced);
        assert!(s.sync_due().is_some_and(|due| due <= Instant::now()));
        s.sync().unwrap();
        assert_eq!(s.sync_due(), None);
    }

    /// The cache keeps at most what it was given: 4 MiB of records overflow a 1 MiB cache,
    /// and a 64 MiB one keeps them all.
    #[test]
    fn the_cache_is_bounded_by_what_it_was_given() {
        let evictions = |cache_bytes| {
            let dir = tempfile::tempdir().unwrap();
            let mut s = Store::open(
                dir.path(),
                SyncPolicy::None,
                Duration::ZERO,
                cache_bytes,
                MIN_JOURNAL_BYTES,
            )
            .unwrap();
            for batch in 0..64u32 {
                let records: Vec<_> = (0..16u32)
                    .map(|i| {
                        let key = Bytes::from(format!("r/{batch}/{i}"));
                        (key, Some(Bytes::from(vec![b'x'; 4096])))
                    })
                    .collect();
                s.apply(&records).unwrap();
                if s.checkpoint_due() {
                    s.checkpoint().unwrap();
                }
            }
            assert!(s.checkpoints() >= 60, "each batch fills the journal");
            s.cache_evictions()
        };
        assert!(evictions(MIN_CACHE_BYTES) > 0);
        assert_eq!(evictions(64 << 20), 0);
    }
}
