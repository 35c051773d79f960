//! The catalogue in PostgreSQL: the same two tables as the SQLite catalogue, shared by every
//! front end that connects. Names sort byte-wise (`COLLATE "C"`), as in SQLite, so listings
//! page the same way on both. Each write is one transaction, durable when PostgreSQL
//! acknowledges it (`synchronous_commit` on, its default); a commit locks the name's row
//! (`SELECT … FOR UPDATE`) so its check-then-write cannot interleave with another front
//! end's, and two front ends inserting the same new name meet at the primary key: the loser
//! retries and then sees the winner's row.

use bytes::Bytes;
use postgres::Row;

use crate::catalogue::StoredBlob;
use crate::error::MetaError;
use crate::pg::PgPool;
use crate::record::{BlobRecord, Commit, UploadRecord, from_json, to_json};

type Result<T> = std::result::Result<T, MetaError>;

/// The schema, and the columns added since the first release (as in SQLite).
const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS settings (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS blobs (
    name         TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    location     TEXT NOT NULL,
    size         BIGINT NOT NULL,
    content_type TEXT NOT NULL,
    digest       TEXT NOT NULL,
    created_ms   BIGINT NOT NULL,
    metadata     TEXT NOT NULL
);
ALTER TABLE blobs ADD COLUMN IF NOT EXISTS chunks BYTEA;
ALTER TABLE blobs ADD COLUMN IF NOT EXISTS corrupt TEXT;
ALTER TABLE blobs ADD COLUMN IF NOT EXISTS inline_data BYTEA;
CREATE TABLE IF NOT EXISTS uploads (
    name         TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    upload_id    TEXT NOT NULL UNIQUE,
    size         BIGINT,
    content_type TEXT NOT NULL,
    metadata     TEXT NOT NULL,
    overwrite    BOOLEAN NOT NULL,
    resume_tag   TEXT NOT NULL,
    created_ms   BIGINT NOT NULL
);
ALTER TABLE uploads ADD COLUMN IF NOT EXISTS refuse_digests TEXT NOT NULL DEFAULT '[]';
"#;

const BLOB_COLUMNS: &str = "name, size, content_type, digest, created_ms, metadata";
const UPLOAD_COLUMNS: &str = "name, upload_id, size, content_type, metadata, overwrite, \
                              resume_tag, created_ms, refuse_digests";

pub(crate) struct PgCatalogue {
    pool: PgPool,
}

impl PgCatalogue {
    pub fn connect(url: &str) -> Result<Self> {
        Ok(Self { pool: PgPool::connect(url, SCHEMA)? })
    }

    pub fn describe(&self) -> String {
        self.pool.describe().to_string()
    }

    pub fn blob(&self, name: &str) -> Result<Option<(BlobRecord, String)>> {
        let sql = format!("SELECT {BLOB_COLUMNS}, location FROM blobs WHERE name = $1");
        let row = self.pool.retrying(|c| c.query_opt(&sql, &[&name]))?;
        row.map(|r| Ok((blob_from_row(&r)?, r.get(6)))).transpose()
    }

    pub fn stored(&self, name: &str) -> Result<Option<StoredBlob>> {
        let sql = format!(
            "SELECT {BLOB_COLUMNS}, location, chunks, corrupt, inline_data FROM blobs
             WHERE name = $1"
        );
        let row = self.pool.retrying(|c| c.query_opt(&sql, &[&name]))?;
        row.map(|r| {
            Ok(StoredBlob {
                record: blob_from_row(&r)?,
                location: r.get(6),
                chunks: r.get(7),
                corrupt: r.get(8),
                inline: r.get(9),
            })
        })
        .transpose()
    }

    pub fn set_chunks(&self, name: &str, location: &str, chunks: &[u8]) -> Result<()> {
        self.pool.retrying(|c| {
            c.execute(
                "UPDATE blobs SET chunks = $3 WHERE name = $1 AND location = $2",
                &[&name, &location, &chunks],
            )
        })?;
        Ok(())
    }

    pub fn set_inline(&self, name: &str, location: &str, data: &[u8]) -> Result<bool> {
        let n = self.pool.retrying(|c| {
            c.execute(
                "UPDATE blobs SET inline_data = $3
                 WHERE name = $1 AND location = $2 AND inline_data IS NOT NULL",
                &[&name, &location, &data],
            )
        })?;
        Ok(n > 0)
    }

    pub fn set_corrupt(&self, name: &str, location: &str, reason: Option<&str>) -> Result<bool> {
        let n = self.pool.retrying(|c| {
            c.execute(
                "UPDATE blobs SET corrupt = $3 WHERE name = $1 AND location = $2",
                &[&name, &location, &reason],
            )
        })?;
        Ok(n > 0)
    }

    pub fn corrupt(&self) -> Result<Vec<(String, String)>> {
        let rows = self.pool.retrying(|c| {
            c.query("SELECT name, corrupt FROM blobs WHERE corrupt IS NOT NULL ORDER BY name", &[])
        })?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    pub fn corrupt_among(&self, names: &[String]) -> Result<Vec<(String, String)>> {
        let rows = self.pool.retrying(|c| {
            c.query(
                "SELECT name, corrupt FROM blobs
                 WHERE name = ANY($1) AND corrupt IS NOT NULL ORDER BY name",
                &[&names],
            )
        })?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    pub fn list(&self, prefix: &str, after: &str, limit: usize) -> Result<Vec<BlobRecord>> {
        let sql = format!(
            "SELECT {BLOB_COLUMNS} FROM blobs
             WHERE name >= $1 AND left(name, length($1)) = $1 AND name > $2
             ORDER BY name LIMIT $3"
        );
        let limit = limit.min(i64::MAX as usize) as i64;
        let rows = self.pool.retrying(|c| c.query(&sql, &[&prefix, &after, &limit]))?;
        rows.iter().map(blob_from_row).collect()
    }

    pub fn commit_blob(
        &self,
        rec: &BlobRecord,
        location: &str,
        chunks: &[u8],
        inline: Option<Bytes>,
        may_replace: impl Fn(Option<&str>) -> bool + Send + 'static,
    ) -> Result<Commit> {
        let p = &self.pool;
        let mut c = p.get()?;
        let (size, metadata) = (rec.size as i64, to_json(&rec.metadata));
        let inline = inline.as_deref();
        // Twice at most: the second time the row another front end inserted is there.
        for _ in 0..2 {
            let mut tx = c.transaction().map_err(|e| p.error(e))?;
            let old = tx
                .query_opt(
                    "SELECT location, digest FROM blobs WHERE name = $1 FOR UPDATE",
                    &[&rec.name],
                )
                .map_err(|e| p.error(e))?;
            let row: [&(dyn postgres::types::ToSql + Sync); 9] = [
                &rec.name,
                &location,
                &size,
                &rec.content_type,
                &rec.digest,
                &rec.created_ms,
                &metadata,
                &chunks,
                &inline,
            ];
            let written = match &old {
                Some(old) => {
                    if !may_replace(Some(old.get::<_, &str>(1))) {
                        return Ok(Commit::Refused);
                    }
                    tx.execute(
                        "UPDATE blobs SET location = $2, size = $3, content_type = $4,
                         digest = $5, created_ms = $6, metadata = $7, chunks = $8,
                         corrupt = NULL, inline_data = $9
                         WHERE name = $1",
                        &row,
                    )
                }
                None if !may_replace(None) => return Ok(Commit::Refused),
                None => tx.execute(
                    "INSERT INTO blobs
                     (name, location, size, content_type, digest, created_ms, metadata, chunks,
                      inline_data)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                     ON CONFLICT (name) DO NOTHING",
                    &row,
                ),
            }
            .map_err(|e| p.error(e))?;
            if written == 0 {
                // Another front end inserted this name since the SELECT: look again.
                tx.rollback().map_err(|e| p.error(e))?;
                continue;
            }
            tx.execute("DELETE FROM uploads WHERE name = $1", &[&rec.name])
                .map_err(|e| p.error(e))?;
            tx.commit().map_err(|e| p.error(e))?;
            return Ok(Commit::Done(old.map(|o| o.get(0))));
        }
        Err(MetaError::Postgres {
            disk_full: false,
            reason: format!("commit of {:?} kept racing another writer", rec.name),
        })
    }

    pub fn delete_blob(&self, name: &str) -> Result<Option<String>> {
        let mut c = self.pool.get()?;
        let row = c
            .query_opt("DELETE FROM blobs WHERE name = $1 RETURNING location", &[&name])
            .map_err(|e| self.pool.error(e))?;
        Ok(row.map(|r| r.get(0)))
    }

    pub fn referenced(&self) -> Result<Vec<String>> {
        let rows = self.pool.retrying(|c| {
            c.query("SELECT location FROM blobs UNION ALL SELECT upload_id FROM uploads", &[])
        })?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    pub fn setting_or_init(&self, key: &str, value: &str) -> Result<String> {
        let row = self.pool.retrying(|c| {
            c.execute(
                "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
                &[&key, &value],
            )?;
            c.query_one("SELECT value FROM settings WHERE key = $1", &[&key])
        })?;
        Ok(row.get(0))
    }

    pub fn locations(&self) -> Result<Vec<String>> {
        let rows = self.pool.retrying(|c| c.query("SELECT location FROM blobs", &[]))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    pub fn put_upload(&self, u: &UploadRecord) -> Result<Option<String>> {
        let p = &self.pool;
        let mut c = p.get()?;
        let mut tx = c.transaction().map_err(|e| p.error(e))?;
        // Lock the name (the row if there is one) so the id returned is the one replaced.
        let old: Option<String> = tx
            .query_opt("SELECT upload_id FROM uploads WHERE name = $1 FOR UPDATE", &[&u.name])
            .map_err(|e| p.error(e))?
            .map(|r| r.get(0));
        let sql = format!(
            "INSERT INTO uploads ({UPLOAD_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (name) DO UPDATE SET upload_id = $2, size = $3, content_type = $4,
             metadata = $5, overwrite = $6, resume_tag = $7, created_ms = $8,
             refuse_digests = $9"
        );
        tx.execute(
            &sql,
            &[
                &u.name,
                &u.upload_id,
                &u.size.map(|s| s as i64),
                &u.content_type,
                &to_json(&u.metadata),
                &u.overwrite,
                &u.resume_tag,
                &u.created_ms,
                &serde_json::to_string(&u.refuse_digests).expect("string lists serialise"),
            ],
        )
        .map_err(|e| p.error(e))?;
        tx.commit().map_err(|e| p.error(e))?;
        Ok(old)
    }

    pub fn upload(&self, name: &str) -> Result<Option<UploadRecord>> {
        let sql = format!("SELECT {UPLOAD_COLUMNS} FROM uploads WHERE name = $1");
        let row = self.pool.retrying(|c| c.query_opt(&sql, &[&name]))?;
        row.map(|r| upload_from_row(&r)).transpose()
    }

    pub fn upload_ids(&self) -> Result<Vec<String>> {
        let rows = self.pool.retrying(|c| c.query("SELECT upload_id FROM uploads", &[]))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    pub fn uploads_created_before(&self, ms: i64) -> Result<Vec<(String, String)>> {
        let rows = self.pool.retrying(|c| {
            c.query("SELECT name, upload_id FROM uploads WHERE created_ms < $1", &[&ms])
        })?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    pub fn delete_upload(&self, name: &str) -> Result<Option<String>> {
        let mut c = self.pool.get()?;
        let row = c
            .query_opt("DELETE FROM uploads WHERE name = $1 RETURNING upload_id", &[&name])
            .map_err(|e| self.pool.error(e))?;
        Ok(row.map(|r| r.get(0)))
    }
}

fn blob_from_row(r: &Row) -> Result<BlobRecord> {
    let name: String = r.get(0);
    Ok(BlobRecord {
        size: r.get::<_, i64>(1) as u64,
        content_type: r.get(2),
        digest: r.get(3),
        created_ms: r.get(4),
        metadata: from_json(&name, r.get(5))?,
        name,
    })
}

fn upload_from_row(r: &Row) -> Result<UploadRecord> {
    let name: String = r.get(0);
    Ok(UploadRecord {
        upload_id: r.get(1),
        size: r.get::<_, Option<i64>>(2).map(|s| s as u64),
        content_type: r.get(3),
        metadata: from_json(&name, r.get(4))?,
        overwrite: r.get(5),
        resume_tag: r.get(6),
        created_ms: r.get(7),
        refuse_digests: serde_json::from_str(r.get(8)).map_err(|e| MetaError::Corrupt {
            name: name.clone(),
            reason: format!("refuse_digests: {e}"),
        })?,
        name,
    })
}
