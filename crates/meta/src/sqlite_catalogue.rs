//! The catalogue in embedded SQLite (the default): one database file, WAL, group commit.

use std::path::Path;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rusqlite::{OptionalExtension, Row, params};

use crate::catalogue::StoredBlob;
use crate::db::Db;
use crate::error::MetaError;
use crate::record::{BlobRecord, Commit, UploadRecord, from_json, to_json};

type Result<T> = std::result::Result<T, MetaError>;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS settings (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS blobs (
    name         TEXT PRIMARY KEY NOT NULL,
    location     TEXT NOT NULL,
    size         INTEGER NOT NULL,
    content_type TEXT NOT NULL,
    digest       TEXT NOT NULL,
    created_ms   INTEGER NOT NULL,
    metadata     TEXT NOT NULL,
    chunks       BLOB,
    corrupt      TEXT,
    inline_data  BLOB
);
CREATE TABLE IF NOT EXISTS uploads (
    name         TEXT PRIMARY KEY NOT NULL,
    upload_id    TEXT NOT NULL UNIQUE,
    size         INTEGER,
    content_type TEXT NOT NULL,
    metadata     TEXT NOT NULL,
    overwrite    INTEGER NOT NULL,
    resume_tag   TEXT NOT NULL,
    created_ms   INTEGER NOT NULL,
    refuse_digests TEXT NOT NULL DEFAULT '[]'
);
-- Commit intents (see `intent.rs`): a handful at most, so no index to keep up to date.
CREATE TABLE IF NOT EXISTS intents (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    location       TEXT NOT NULL,
    name           TEXT NOT NULL,
    size           INTEGER NOT NULL,
    content_type   TEXT NOT NULL,
    digest         TEXT NOT NULL,
    created_ms     INTEGER NOT NULL,
    metadata       TEXT NOT NULL,
    chunks         BLOB NOT NULL,
    overwrite      INTEGER NOT NULL,
    refuse_digests TEXT NOT NULL
);
";

/// Columns added after the first release, with their types: added to older databases on open.
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("blobs", "chunks", "BLOB"),
    ("blobs", "corrupt", "TEXT"),
    ("blobs", "inline_data", "BLOB"),
    ("uploads", "refuse_digests", "TEXT NOT NULL DEFAULT '[]'"),
];

/// The SQLite catalogue.
pub(crate) struct SqliteCatalogue {
    pub(crate) db: Db,
    path: Option<std::path::PathBuf>,
    /// Pending-upload rows queued behind (see [`SqliteCatalogue::put_upload`]), by name,
    /// until their write runs: what `upload` answers meanwhile.
    behind: Arc<Mutex<HashMap<String, UploadRecord>>>,
}

impl SqliteCatalogue {
    /// Open (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let cat = Self {
            db: Db::open(path, SCHEMA)?,
            path: Some(path.to_path_buf()),
            behind: Arc::default(),
        };
        cat.add_missing_columns()?;
        Ok(cat)
    }

    /// Bring a database written by an older version up to the current columns.
    fn add_missing_columns(&self) -> Result<()> {
        let c = self.conn();
        for (table, col, ty) in ADDED_COLUMNS {
            let have: Vec<String> = c
                .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?
                .query_map([], |r| r.get(0))?
                .collect::<std::result::Result<_, _>>()?;
            if !have.iter().any(|h| h == col) {
                c.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {col} {ty}"))?;
            }
        }
        Ok(())
    }

    /// A throw-away in-memory catalogue.
    pub fn open_in_memory() -> Result<Self> {
        Ok(Self { db: Db::in_memory(SCHEMA)?, path: None, behind: Arc::default() })
    }

    pub fn describe(&self) -> String {
        match &self.path {
            Some(p) => format!("sqlite:{}", p.display()),
            None => "sqlite::memory:".into(),
        }
    }

    /// The connection, for reads and single-statement writes. Writes that read first go
    /// through `self.db.write`, whose group transaction is IMMEDIATE (a deferred one that
    /// reads first and writes later fails at once with "database is locked" when another
    /// connection — the image index — wrote in between).
    fn conn(&self) -> std::sync::MutexGuard<'_, rusqlite::Connection> {
        self.db.lock()
    }

    /// A connection for reads, the first free one (see [`Db::read`]).
    fn read(&self) -> std::sync::MutexGuard<'_, rusqlite::Connection> {
        self.db.read()
    }

    /// A committed blob and its store location.
    pub fn blob(&self, name: &str) -> Result<Option<(BlobRecord, String)>> {
        let c = self.read();
        let mut st = c.prepare_cached(
            "SELECT name, size, content_type, digest, created_ms, metadata, location
             FROM blobs WHERE name = ?1",
        )?;
        let row =
            st.query_row([name], |r| Ok((blob_from_row(r), r.get::<_, String>(6)?))).optional()?;
        match row {
            None => Ok(None),
            Some((rec, loc)) => Ok(Some((rec?, loc))),
        }
    }

    /// A committed blob with its location, chunk digests and corruption mark.
    pub fn stored(&self, name: &str) -> Result<Option<StoredBlob>> {
        Self::stored_on(&self.read(), name)
    }

    /// [`SqliteCatalogue::stored`] if a reading connection is free now (`None`: other readers
    /// hold them all).
    pub fn stored_at_once(&self, name: &str) -> Option<Result<Option<StoredBlob>>> {
        let c = self.db.try_read()?;
        Some(Self::stored_on(&c, name))
    }

    fn stored_on(c: &rusqlite::Connection, name: &str) -> Result<Option<StoredBlob>> {
        let mut st = c.prepare_cached(
            "SELECT name, size, content_type, digest, created_ms, metadata, location, chunks,
                    corrupt, inline_data
             FROM blobs WHERE name = ?1",
        )?;
        let row = st
            .query_row([name], |r| {
                let stored = (r.get::<_, String>(6)?, r.get(7)?, r.get(8)?, r.get(9)?);
                Ok((blob_from_row(r), stored))
            })
            .optional()?;
        match row {
            None => Ok(None),
            Some((rec, (location, chunks, corrupt, inline))) => {
                Ok(Some(StoredBlob { record: rec?, location, chunks, corrupt, inline }))
            }
        }
    }

    /// Record the chunk digests of a blob committed without them, if it is still stored at
    /// `location`.
    pub fn set_chunks(&self, name: &str, location: &str, chunks: &[u8]) -> Result<()> {
        self.conn().execute(
            "UPDATE blobs SET chunks = ?3 WHERE name = ?1 AND location = ?2",
            params![name, location, chunks],
        )?;
        Ok(())
    }

    /// Replace the bytes of the inline blob stored at `location` (fault injection for tests:
    /// bit rot inside the catalogue). Returns whether such a row existed.
    pub fn set_inline(&self, name: &str, location: &str, data: &[u8]) -> Result<bool> {
        let n = self.conn().execute(
            "UPDATE blobs SET inline_data = ?3
             WHERE name = ?1 AND location = ?2 AND inline_data IS NOT NULL",
            params![name, location, data],
        )?;
        Ok(n > 0)
    }

    /// Mark the blob stored at `location` corrupt (`Some(reason)`) or sound again (`None`).
    /// Returns whether such a row existed.
    pub fn set_corrupt(&self, name: &str, location: &str, reason: Option<&str>) -> Result<bool> {
        let n = self.conn().execute(
            "UPDATE blobs SET corrupt = ?3 WHERE name = ?1 AND location = ?2",
            params![name, location, reason],
        )?;
        Ok(n > 0)
    }

    /// (name, reason) of every blob marked corrupt.
    pub fn corrupt(&self) -> Result<Vec<(String, String)>> {
        let c = self.read();
        let mut st =
            c.prepare("SELECT name, corrupt FROM blobs WHERE corrupt IS NOT NULL ORDER BY name")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// (name, reason) of the blobs among `names` marked corrupt (each looked up by the name
    /// index, in statements of up to 500 names).
    pub fn corrupt_among(&self, names: &[String]) -> Result<Vec<(String, String)>> {
        let c = self.read();
        let mut out = Vec::new();
        for part in names.chunks(500) {
            let marks = vec!["?"; part.len()].join(", ");
            let sql = format!(
                "SELECT name, corrupt FROM blobs WHERE name IN ({marks}) AND corrupt IS NOT NULL"
            );
            let mut st = c.prepare(&sql)?;
            let rows =
                st.query_map(rusqlite::params_from_iter(part), |r| Ok((r.get(0)?, r.get(1)?)))?;
            for row in rows {
                out.push(row?);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Up to `limit` blobs whose names start with `prefix` and sort after `after`.
    pub fn list(&self, prefix: &str, after: &str, limit: usize) -> Result<Vec<BlobRecord>> {
        let c = self.read();
        let mut st = c.prepare_cached(
            "SELECT name, size, content_type, digest, created_ms, metadata FROM blobs
             WHERE name >= ?1 AND substr(name, 1, length(?1)) = ?1 AND name > ?2
             ORDER BY name LIMIT ?3",
        )?;
        let rows = st.query_map(params![prefix, after, limit as i64], |r| Ok(blob_from_row(r)))?;
        let mut out = Vec::new();
        for r in rows {
            out.push(r??);
        }
        Ok(out)
    }

    /// Commit a blob (insert, or replace as `may_replace` allows) with its chunk digests
    /// (stored form) and drop its pending upload, in one transaction: the check of what is
    /// there and the commit cannot be separated by another writer.
    /// With `inline`, the blob's bytes are kept in its row.
    pub fn commit_blob(
        &self,
        rec: &BlobRecord,
        location: &str,
        chunks: &[u8],
        inline: Option<Bytes>,
        may_replace: impl Fn(Option<&str>) -> bool + Send + 'static,
    ) -> Result<Commit> {
        let (rec, location, chunks) = (rec.clone(), location.to_string(), chunks.to_vec());
        self.db.write(move |tx| {
            let done = commit_row(tx, &rec, &location, &chunks, inline.as_deref(), may_replace)?;
            if matches!(done, Commit::Done(_)) {
                // Intents of blobs this one replaces are void (see `crate::intent`).
                tx.prepare_cached("DELETE FROM intents WHERE name = ?1")?.execute([&rec.name])?;
            }
            Ok(done)
        })
    }

    /// Remove a blob; returns its location if it existed. The delete is committed (durable)
    /// when this returns `Ok`: an explicit transaction, because a `DELETE … RETURNING` in
    /// autocommit mode commits when the statement is reset, and an error there (a full disk)
    /// would be lost after the row had already been returned.
    pub fn delete_blob(&self, name: &str) -> Result<Option<String>> {
        let name = name.to_string();
        self.db.write(move |tx| {
            // A deleted name's intents are void too (see `crate::intent`).
            tx.prepare_cached("DELETE FROM intents WHERE name = ?1")?.execute([&name])?;
            Ok(tx
                .query_row("DELETE FROM blobs WHERE name = ?1 RETURNING location", [&name], |r| {
                    r.get(0)
                })
                .optional()?)
        })
    }

    fn delete_returning(&self, sql: &'static str, name: &str) -> Result<Option<String>> {
        let name = name.to_string();
        self.db.write(move |tx| Ok(tx.query_row(sql, [name], |r| r.get(0)).optional()?))
    }

    /// Every location referenced by a blob, a pending upload or a commit intent, in one
    /// snapshot.
    pub fn referenced(&self) -> Result<Vec<String>> {
        self.db.flush();
        let c = self.read();
        let mut st = c.prepare(
            "SELECT location FROM blobs UNION ALL SELECT upload_id FROM uploads
                 UNION ALL SELECT location FROM intents",
        )?;
        let rows = st.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// The value of setting `key`, set to `value` first if it has none.
    pub fn setting_or_init(&self, key: &str, value: &str) -> Result<String> {
        let (k, v) = (key.to_string(), value.to_string());
        self.db.write(move |tx| {
            tx.execute("INSERT OR IGNORE INTO settings (key, value) VALUES (?1, ?2)", [&k, &v])?;
            Ok(tx.query_row("SELECT value FROM settings WHERE key = ?1", [&k], |r| r.get(0))?)
        })
    }

    /// Every location referenced by a blob (for garbage collection of orphan files).
    pub fn locations(&self) -> Result<Vec<String>> {
        let c = self.read();
        let mut st = c.prepare("SELECT location FROM blobs")?;
        let rows = st.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// Record a pending upload, replacing any other pending upload of the same name.
    /// Returns the replaced upload's id.
    ///
    /// Written behind: queued for the next write anyone makes (the upload's own commit, at
    /// the latest, or the database's flusher within `BEHIND_AT_MOST`), and answered from
    /// memory by [`SqliteCatalogue::upload`] until then, so a route followed by a write
    /// within that time costs no transaction of its own. Not fsynced on its own either (it is with the
    /// next durable write): a crash may forget the row, and then the upload starts again
    /// from its first byte — its staging file, unreferenced, is removed at the next start,
    /// and a replaced upload's row comes back without its file, which routing treats as no
    /// upload. Nothing acknowledged rests on this row.
    pub fn put_upload(&self, u: &UploadRecord) -> Result<Option<String>> {
        let queued = self.behind_lock().get(&u.name).map(|q| q.upload_id.clone());
        let old = match queued {
            Some(id) => Some(id),
            None => self
                .read()
                .prepare_cached("SELECT upload_id FROM uploads WHERE name = ?1")?
                .query_row([&u.name], |r| r.get(0))
                .optional()?,
        };
        self.behind_lock().insert(u.name.clone(), u.clone());
        let (u, behind) = (u.clone(), self.behind.clone());
        let row = u.clone();
        self.db.write_behind(
            move |tx| {
                if let Some(tx) = tx
                    && let Err(e) = insert_upload(tx, &row)
                {
                    tracing::warn!(upload = %row.name, error = %e, "a pending upload's row was not written");
                }
            },
            move || {
                // Answered from the table from now on, written or not: only once the group
                // has committed, so a reader on the other connection sees no gap (a commit
                // that failed loses the row as a crash would). A later route's record for
                // the name stays.
                let mut q = behind.lock().unwrap_or_else(|p| p.into_inner());
                if q.get(&u.name) == Some(&u) {
                    q.remove(&u.name);
                }
            },
        );
        Ok(old)
    }

    fn behind_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, UploadRecord>> {
        self.behind.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pending upload for `name`.
    pub fn upload(&self, name: &str) -> Result<Option<UploadRecord>> {
        if let Some(queued) = self.behind_lock().get(name) {
            return Ok(Some(queued.clone()));
        }
        let c = self.read();
        let mut st = c.prepare_cached(
            "SELECT name, upload_id, size, content_type, metadata, overwrite, resume_tag, created_ms,
                    refuse_digests
             FROM uploads WHERE name = ?1",
        )?;
        let row = st.query_row([name], |r| Ok(upload_from_row(r))).optional()?;
        row.transpose()
    }

    /// Every pending upload id (for garbage collection of orphan staging files).
    pub fn upload_ids(&self) -> Result<Vec<String>> {
        self.db.flush();
        let c = self.read();
        let mut st = c.prepare("SELECT upload_id FROM uploads")?;
        let rows = st.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// (name, upload id) of uploads created before `ms` (Unix milliseconds).
    pub fn uploads_created_before(&self, ms: i64) -> Result<Vec<(String, String)>> {
        self.db.flush();
        let c = self.read();
        let mut st = c.prepare("SELECT name, upload_id FROM uploads WHERE created_ms < ?1")?;
        let rows = st.query_map([ms], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// Forget a pending upload; returns its id if there was one.
    pub fn delete_upload(&self, name: &str) -> Result<Option<String>> {
        self.delete_returning("DELETE FROM uploads WHERE name = ?1 RETURNING upload_id", name)
    }
}

/// Insert `rec` at `location` (its bytes in the row with `inline`), or replace what the name
/// holds, if `may_replace` allows it (given the digest there, `None` for nothing there: a
/// commit that must replace a version refuses to make a name anew), and drop the name's pending
/// upload: the body of a commit, inside the caller's transaction.
pub(crate) fn commit_row(
    tx: &rusqlite::Connection,
    rec: &BlobRecord,
    location: &str,
    chunks: &[u8],
    inline: Option<&[u8]>,
    may_replace: impl Fn(Option<&str>) -> bool,
) -> Result<Commit> {
    let old: Option<(String, String)> = tx
        .prepare_cached("SELECT location, digest FROM blobs WHERE name = ?1")?
        .query_row([&rec.name], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    if !may_replace(old.as_ref().map(|(_, digest)| digest.as_str())) {
        return Ok(Commit::Refused);
    }
    tx.prepare_cached(
        "INSERT OR REPLACE INTO blobs
         (name, location, size, content_type, digest, created_ms, metadata, chunks, corrupt,
          inline_data)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULL, ?9)",
    )?
    .execute(params![
        rec.name,
        location,
        rec.size as i64,
        rec.content_type,
        rec.digest,
        rec.created_ms,
        to_json(&rec.metadata),
        chunks,
        inline
    ])?;
    tx.prepare_cached("DELETE FROM uploads WHERE name = ?1")?.execute([&rec.name])?;
    Ok(Commit::Done(old.map(|(loc, _)| loc)))
}

/// Insert (or replace) the pending upload row of `u`.
fn insert_upload(tx: &rusqlite::Connection, u: &UploadRecord) -> Result<()> {
    tx.prepare_cached(
        "INSERT OR REPLACE INTO uploads
         (name, upload_id, size, content_type, metadata, overwrite, resume_tag, created_ms,
          refuse_digests)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )?
    .execute(params![
        u.name,
        u.upload_id,
        u.size.map(|s| s as i64),
        u.content_type,
        to_json(&u.metadata),
        u.overwrite,
        u.resume_tag,
        u.created_ms,
        serde_json::to_string(&u.refuse_digests).expect("string lists serialise")
    ])?;
    Ok(())
}

fn blob_from_row(r: &Row<'_>) -> Result<BlobRecord> {
    let name: String = r.get(0)?;
    let metadata = from_json(&name, &r.get::<_, String>(5)?)?;
    Ok(BlobRecord {
        size: r.get::<_, i64>(1)? as u64,
        content_type: r.get(2)?,
        digest: r.get(3)?,
        created_ms: r.get(4)?,
        metadata,
        name,
    })
}

fn upload_from_row(r: &Row<'_>) -> Result<UploadRecord> {
    let name: String = r.get(0)?;
    let metadata = from_json(&name, &r.get::<_, String>(4)?)?;
    Ok(UploadRecord {
        upload_id: r.get(1)?,
        size: r.get::<_, Option<i64>>(2)?.map(|s| s as u64),
        content_type: r.get(3)?,
        metadata,
        overwrite: r.get(5)?,
        resume_tag: r.get(6)?,
        created_ms: r.get(7)?,
        refuse_digests: serde_json::from_str(&r.get::<_, String>(8)?).map_err(|e| {
            MetaError::Corrupt { name: name.clone(), reason: format!("refuse_digests: {e}") }
        })?,
        name,
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn lookups_go_on_while_a_group_holds_the_writing_connection() {
        let dir = tempfile::tempdir().unwrap();
        let cat = Arc::new(SqliteCatalogue::open(&dir.path().join("c.db")).unwrap());
        let rec = BlobRecord {
            name: "b".into(),
            size: 1,
            content_type: String::new(),
            digest: "d".into(),
            created_ms: 1,
            metadata: Default::default(),
        };
        cat.commit_blob(&rec, "loc", b"", Some(b"x"[..].into()), |_| true).unwrap();
        // Held as a group holds it through its commit's fsync.
        let writing = cat.conn();
        let (tx, rx) = std::sync::mpsc::channel();
        let c = cat.clone();
        std::thread::spawn(move || {
            let found = (c.stored("b").unwrap(), c.list("", "", 10).unwrap().len());
            tx.send(found).unwrap();
        });
        let (stored, listed) = rx.recv_timeout(Duration::from_secs(60)).expect("not held up");
        assert_eq!(stored.unwrap().inline.as_deref(), Some(&b"x"[..]));
        assert_eq!(listed, 1);
        drop(writing);
        // A reading connection reads only.
        let e = cat.read().execute("DELETE FROM blobs", []).unwrap_err();
        assert!(e.to_string().contains("readonly"), "{e}");
        // At once: answered while the writing connection is held, not while another reader
        // holds the reading one.
        let writing = cat.conn();
        let found = cat.stored_at_once("b").expect("the reading connection is free");
        assert_eq!(found.unwrap().unwrap().inline.as_deref(), Some(&b"x"[..]));
        assert!(cat.stored_at_once("nothing").unwrap().unwrap().is_none());
        drop(writing);
        // Readers side by side: one held does not hold up the next, and only with every
        // reading connection held is a lookup not answered at once.
        let mut reading = vec![cat.read()];
        let found = cat.stored_at_once("b").expect("another reading connection is free");
        assert_eq!(found.unwrap().unwrap().inline.as_deref(), Some(&b"x"[..]));
        while reading.len() < crate::db::READERS {
            reading.push(cat.db.try_read().expect("a free reading connection"));
        }
        assert!(cat.stored_at_once("b").is_none(), "other readers hold them all");
        reading.pop();
        assert!(cat.stored_at_once("b").is_some(), "one is free again");
        drop(reading);
    }

    #[test]
    fn a_pending_upload_written_behind_reaches_the_file_without_another_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let cat = SqliteCatalogue::open(&path).unwrap();
        let u = UploadRecord {
            name: "x".into(),
            upload_id: "u1".into(),
            size: Some(3),
            content_type: String::new(),
            metadata: Default::default(),
            overwrite: false,
            refuse_digests: Vec::new(),
            resume_tag: "t".into(),
            created_ms: 1,
        };
        assert_eq!(cat.put_upload(&u).unwrap(), None);
        assert_eq!(cat.upload("x").unwrap(), Some(u.clone()), "seen by its handle at once");
        // Another connection (another process, or this one after being killed) sees it as
        // soon as the flusher has run, with nothing else written meanwhile.
        let other = SqliteCatalogue::open(&path).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !other.conn().prepare("SELECT 1 FROM uploads").unwrap().exists([]).unwrap() {
            assert!(Instant::now() < deadline, "the row never reached the database file");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(other.upload("x").unwrap(), Some(u));
    }
}
