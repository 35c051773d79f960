//! The image index: metadata extracted from image blobs (dimensions, pixel type, DICOM
//! patient, modality, study date, ...) for search, in the same database as the catalogue
//! (SQLite, or PostgreSQL shared by every front end).
//!
//! Rows are keyed by blob name and carry the digest of the bytes they were extracted from,
//! so a row for bytes that have since been replaced or deleted is recognisably stale: callers
//! compare digests with the catalogue and drop stale rows ([`ImageIndex::forget`]). A row also
//! records blobs that turned out *not* to be images, so they are not decoded again.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{OptionalExtension, params};

use crate::db::Db;
use crate::error::MetaError;
use crate::pg_images::PgImages;
use crate::record::now_ms;

type Result<T> = std::result::Result<T, MetaError>;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS images (
    name        TEXT PRIMARY KEY NOT NULL,
    digest      TEXT NOT NULL,
    is_image    INTEGER NOT NULL,
    patient     TEXT NOT NULL,
    modality    TEXT NOT NULL,
    study_date  TEXT NOT NULL,
    meta        TEXT NOT NULL,
    search_text TEXT NOT NULL,
    indexed_ms  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS images_modality ON images(modality);
CREATE INDEX IF NOT EXISTS images_study_date ON images(study_date);
";

/// What the index knows about one blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageEntry {
    pub name: String,
    /// Digest of the bytes the entry describes (`algo:hex`, as in the catalogue).
    pub digest: String,
    /// False: the blob was looked at and is not a readable image (`meta` then holds
    /// `{"error": reason}`).
    pub is_image: bool,
    /// Metadata as a JSON object (the fields of the image decoder's `ImageMeta`).
    pub meta: String,
}

/// Criteria for [`ImageIndex::search`]; every criterion given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageQuery {
    /// Case-insensitive substring of the name or any metadata value.
    pub text: Option<String>,
    /// Case-insensitive substring of the patient name or ID.
    pub patient: Option<String>,
    /// Exact modality (case-insensitive), e.g. `CT`.
    pub modality: Option<String>,
    /// Study date `YYYYMMDD`, inclusive bounds.
    pub date_from: Option<String>,
    pub date_to: Option<String>,
    /// Only names starting with this.
    pub prefix: String,
    pub limit: usize,
}

/// The index, on whichever database the catalogue is on.
pub struct ImageIndex {
    backend: Backend,
}

enum Backend {
    Sqlite(Db),
    Postgres(Box<PgImages>),
}

/// One row as both databases store it.
pub(crate) struct IndexRow<'a> {
    pub name: &'a str,
    pub digest: &'a str,
    pub is_image: bool,
    pub patient: String,
    pub modality: String,
    pub study_date: &'a str,
    pub meta: &'a str,
    pub search_text: String,
}

/// A search with its criteria in stored form (lower/upper case, LIKE patterns escaped).
pub(crate) struct Search<'a> {
    pub prefix: &'a str,
    pub text: Option<String>,
    pub patient: Option<String>,
    pub modality: Option<String>,
    pub date_from: Option<String>,
    pub date_to: Option<String>,
    pub limit: i64,
}

impl ImageIndex {
    /// Open (creating the table if needed) in the SQLite database at `path`, which may be
    /// the catalogue's own file.
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Self { backend: Backend::Sqlite(Db::open(path, SCHEMA)?) })
    }

    /// A throw-away in-memory index (for the memory store).
    pub fn open_in_memory() -> Result<Self> {
        Ok(Self { backend: Backend::Sqlite(Db::in_memory(SCHEMA)?) })
    }

    /// The index in PostgreSQL at `url` (the catalogue's database), shared by every front
    /// end.
    pub fn connect_postgres(url: &str) -> Result<Self> {
        let pg = Box::new(crate::pg::off_executor(|| PgImages::connect(url))?);
        Ok(Self { backend: Backend::Postgres(pg) })
    }

    fn upsert(&self, row: IndexRow<'_>) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(db) => {
                db.lock().execute(
                    "INSERT OR REPLACE INTO images
                     (name, digest, is_image, patient, modality, study_date, meta, search_text,
                      indexed_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    params![
                        row.name,
                        row.digest,
                        row.is_image,
                        row.patient,
                        row.modality,
                        row.study_date,
                        row.meta,
                        row.search_text,
                        now_ms()
                    ],
                )?;
                Ok(())
            }
            Backend::Postgres(pg) => crate::pg::off_executor(|| pg.upsert(&row)),
        }
    }

    /// Record what was extracted from `name` at `digest`. `fields` are the metadata as
    /// strings (for the searchable columns and free text); `meta_json` the same as JSON.
    pub fn put(
        &self,
        name: &str,
        digest: &str,
        fields: &BTreeMap<String, String>,
        meta_json: &str,
    ) -> Result<()> {
        let get = |k: &str| fields.get(k).map(String::as_str).unwrap_or("");
        let patient = format!("{}\u{1f}{}", get("patient_name"), get("patient_id"));
        let mut text = name.to_lowercase();
        for v in fields.values() {
            text.push('\u{1f}');
            text.push_str(&v.to_lowercase());
        }
        self.upsert(IndexRow {
            name,
            digest,
            is_image: true,
            patient: patient.to_lowercase(),
            modality: get("modality").to_uppercase(),
            study_date: get("study_date"),
            meta: meta_json,
            search_text: text,
        })
    }

    /// Record that `name` at `digest` is not a readable image, and why.
    pub fn put_not_image(&self, name: &str, digest: &str, reason: &str) -> Result<()> {
        let meta = serde_json::json!({ "error": reason }).to_string();
        self.upsert(IndexRow {
            name,
            digest,
            is_image: false,
            patient: String::new(),
            modality: String::new(),
            study_date: "",
            meta: &meta,
            search_text: String::new(),
        })
    }

    /// The entry for `name`, whatever digest it was made from.
    pub fn get(&self, name: &str) -> Result<Option<ImageEntry>> {
        match &self.backend {
            Backend::Sqlite(db) => {
                let c = db.lock();
                let mut st = c.prepare_cached(
                    "SELECT name, digest, is_image, meta FROM images WHERE name = ?1",
                )?;
                Ok(st.query_row([name], entry_from_row).optional()?)
            }
            Backend::Postgres(pg) => crate::pg::off_executor(|| pg.get(name)),
        }
    }

    /// Drop the entry for `name` (deleted, or replaced by other bytes).
    pub fn forget(&self, name: &str) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(db) => {
                db.lock().execute("DELETE FROM images WHERE name = ?1", [name])?;
                Ok(())
            }
            Backend::Postgres(pg) => crate::pg::off_executor(|| pg.forget(name)),
        }
    }

    /// Images matching every criterion of `q`, by name. Only image rows are returned.
    pub fn search(&self, q: &ImageQuery) -> Result<Vec<ImageEntry>> {
        let like = |s: &Option<String>| {
            s.as_deref()
                .filter(|s| !s.is_empty())
                .map(|s| format!("%{}%", escape_like(&s.to_lowercase())))
        };
        let nonempty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
        let s = Search {
            prefix: &q.prefix,
            text: like(&q.text),
            patient: like(&q.patient),
            modality: nonempty(&q.modality).map(|m| m.to_uppercase()),
            date_from: nonempty(&q.date_from),
            date_to: nonempty(&q.date_to),
            limit: q.limit.min(i64::MAX as usize) as i64,
        };
        match &self.backend {
            Backend::Sqlite(db) => {
                let c = db.lock();
                let mut st = c.prepare_cached(
                    "SELECT name, digest, is_image, meta FROM images
                     WHERE is_image = 1
                       AND substr(name, 1, length(?1)) = ?1
                       AND (?2 IS NULL OR search_text LIKE ?2 ESCAPE '\\')
                       AND (?3 IS NULL OR patient LIKE ?3 ESCAPE '\\')
                       AND (?4 IS NULL OR modality = ?4)
                       AND (?5 IS NULL OR (study_date != '' AND study_date >= ?5))
                       AND (?6 IS NULL OR (study_date != '' AND study_date <= ?6))
                     ORDER BY name LIMIT ?7",
                )?;
                let rows = st.query_map(
                    params![
                        s.prefix,
                        s.text,
                        s.patient,
                        s.modality,
                        s.date_from,
                        s.date_to,
                        s.limit
                    ],
                    entry_from_row,
                )?;
                Ok(rows.collect::<std::result::Result<_, _>>()?)
            }
            Backend::Postgres(pg) => crate::pg::off_executor(|| pg.search(&s)),
        }
    }
}

fn entry_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ImageEntry> {
    Ok(ImageEntry {
        name: r.get(0)?,
        digest: r.get(1)?,
        is_image: r.get::<_, i64>(2)? != 0,
        meta: r.get(3)?,
    })
}

/// `%`, `_` and `\` match themselves in a LIKE pattern escaped with `\`.
pub(crate) fn escape_like(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
