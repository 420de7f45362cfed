//! Persistence in redb: one table of the opaque records the broker core emits through
//! [`meridian_core::Output::Persist`].
//!
//! The engine applies every record of a batch in one write transaction and commits it before
//! any acknowledgement of that batch is written to a socket. How a commit reaches the disk is
//! the sync policy ([`SyncPolicy`]).

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
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

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "meridian.redb";

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
}

fn redb_err(e: impl std::fmt::Display) -> StorageError {
    StorageError::Redb(e.to_string())
}

/// The daemon's store.
pub struct Store {
    db: Database,
    sync: SyncPolicy,
    interval: Duration,
    last_sync: Instant,
    /// Commits since the last durable one.
    unsynced: bool,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("sync", &self.sync)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Open (or create) the store in `dir`, keeping at most `cache_bytes` of its pages in memory.
    pub fn open(
        dir: &Path,
        sync: SyncPolicy,
        interval: Duration,
        cache_bytes: usize,
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
        txn.commit().map_err(redb_err)?;
        Ok(Self {
            db,
            sync,
            interval,
            last_sync: Instant::now(),
            unsynced: false,
        })
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

    /// Every stored record, for [`meridian_core::Broker::restore`].
    pub fn load_all(&self) -> Result<Vec<(Bytes, Bytes)>, StorageError> {
        let txn = self.db.begin_read().map_err(redb_err)?;
        let table = txn.open_table(RECORDS).map_err(redb_err)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(redb_err)? {
            let (k, v) = entry.map_err(redb_err)?;
            out.push((
                Bytes::copy_from_slice(k.value()),
                Bytes::copy_from_slice(v.value()),
            ));
        }
        Ok(out)
    }

    /// Apply puts (`Some`) and deletes (`None`) in order, in one transaction, and commit it
    /// according to the sync policy.
    pub fn apply(&mut self, records: &[(Bytes, Option<Bytes>)]) -> Result<(), StorageError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut txn = self.db.begin_write().map_err(redb_err)?;
        let durable = self.commit_syncs();
        txn.set_durability(if durable {
            Durability::Immediate
        } else {
            Durability::None
        });
        {
            let mut table = txn.open_table(RECORDS).map_err(redb_err)?;
            for (key, value) in records {
                match value {
                    Some(v) => {
                        table.insert(key.as_ref(), v.as_ref()).map_err(redb_err)?;
                    }
                    None => {
                        table.remove(key.as_ref()).map_err(redb_err)?;
                    }
                }
            }
        }
        txn.commit().map_err(redb_err)?;
        if durable {
            self.last_sync = Instant::now();
            self.unsynced = false;
        } else {
            self.unsynced = true;
        }
        Ok(())
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

    /// Make every commit so far durable (an empty durable commit).
    pub fn sync(&mut self) -> Result<(), StorageError> {
        if !self.unsynced {
            return Ok(());
        }
        let mut txn = self.db.begin_write().map_err(redb_err)?;
        txn.set_durability(Durability::Immediate);
        txn.commit().map_err(redb_err)?;
        self.unsynced = false;
        self.last_sync = Instant::now();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path, sync: SyncPolicy, interval: Duration) -> Store {
        Store::open(dir, sync, interval, MIN_CACHE_BYTES).unwrap()
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
            let mut s =
                Store::open(dir.path(), SyncPolicy::None, Duration::ZERO, cache_bytes).unwrap();
            for batch in 0..64u32 {
                let records: Vec<_> = (0..16u32)
                    .map(|i| {
                        let key = Bytes::from(format!("r/{batch}/{i}"));
                        (key, Some(Bytes::from(vec![b'x'; 4096])))
                    })
                    .collect();
                s.apply(&records).unwrap();
            }
            s.cache_evictions()
        };
        assert!(evictions(MIN_CACHE_BYTES) > 0);
        assert_eq!(evictions(64 << 20), 0);
    }
}
