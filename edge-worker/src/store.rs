//! The broker's records in the Durable Object's own SQLite database.
//!
//! The core names each record with an opaque key and value (sessions, subscriptions, queued and
//! retained messages); this is one table of them. Writes are synchronous calls whose commit the
//! runtime confirms before any later outgoing message leaves the object (its output gate), which
//! is the order the core asks for: a record is durable before the acknowledgement that follows
//! it is sent.

use bytes::Bytes;
use js_sys::Uint8Array;
use wasm_bindgen::JsValue;
use worker::{SqlStorage, SqlStorageValue};

/// One table, `records(key, value)`, both BLOBs.
#[derive(Debug)]
pub struct RecordStore {
    sql: SqlStorage,
}

impl RecordStore {
    /// Opens the table, creating it in a new object.
    pub fn open(sql: SqlStorage) -> worker::Result<Self> {
        sql.exec(
            "CREATE TABLE IF NOT EXISTS records (key BLOB PRIMARY KEY, value BLOB NOT NULL) \
             WITHOUT ROWID",
            None,
        )?;
        Ok(Self { sql })
    }

    /// Stores a record, or deletes it when `value` is `None`.
    pub fn apply(&self, key: &[u8], value: Option<&[u8]>) -> worker::Result<()> {
        let key = JsValue::from(Uint8Array::from(key));
        match value {
            Some(value) => self.sql.exec_raw(
                "INSERT OR REPLACE INTO records (key, value) VALUES (?, ?)",
                vec![key, Uint8Array::from(value).into()],
            )?,
            None => self
                .sql
                .exec_raw("DELETE FROM records WHERE key = ?", vec![key])?,
        };
        Ok(())
    }

    /// The object's name, as first given (`given`, from the request that created it) and kept
    /// beside the records: an object started by its alarm is not told its name.
    pub fn name(&self, given: Option<String>) -> worker::Result<Option<String>> {
        self.meta_table()?;
        if let Some(name) = given {
            self.sql.exec_raw(
                "INSERT INTO meta (key, value) VALUES ('name', ?) ON CONFLICT(key) DO NOTHING",
                vec![JsValue::from(name.as_str())],
            )?;
        }
        for row in self
            .sql
            .exec("SELECT value FROM meta WHERE key = 'name'", None)?
            .raw()
        {
            if let Ok([SqlStorageValue::String(name)]) = <[SqlStorageValue; 1]>::try_from(row?) {
                return Ok(Some(name));
            }
        }
        Ok(None)
    }

    fn meta_table(&self) -> worker::Result<()> {
        self.sql.exec(
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value ANY NOT NULL) STRICT",
            None,
        )?;
        Ok(())
    }

    /// The next incarnation of the broker as a leaf of its region: one more than at the last
    /// start (kept beside the records).
    pub fn next_incarnation(&self) -> worker::Result<u64> {
        self.meta_table()?;
        let rows = self.sql.exec(
            "INSERT INTO meta (key, value) VALUES ('incarnation', 1) \
             ON CONFLICT(key) DO UPDATE SET value = value + 1 RETURNING value",
            None,
        )?;
        for row in rows.raw() {
            if let Ok([SqlStorageValue::Integer(n)]) = <[SqlStorageValue; 1]>::try_from(row?) {
                return u64::try_from(n)
                    .map_err(|_| worker::Error::RustError("a negative incarnation".into()));
            }
        }
        Err(worker::Error::RustError(
            "the incarnation counter did not answer".into(),
        ))
    }

    /// Every stored record, for [`meridian_core::Broker::restore`].
    pub fn load(&self) -> worker::Result<Vec<(Bytes, Bytes)>> {
        let mut records = Vec::new();
        for row in self.sql.exec("SELECT key, value FROM records", None)?.raw() {
            match <[SqlStorageValue; 2]>::try_from(row?) {
                Ok([SqlStorageValue::Blob(key), SqlStorageValue::Blob(value)]) => {
                    records.push((Bytes::from(key), Bytes::from(value)));
                }
                // Only this module writes the table; a row of another shape is left for the
                // operator to see rather than fed to the broker.
                _ => worker::console_error!("meridian: a stored record is not two blobs; skipped"),
            }
        }
        Ok(records)
    }
}
