//! The image index: metadata extracted from image blobs (dimensions, pixel type, DICOM
//! patient, modality, study date, ...) for search, in the same SQLite database as the
//! catalogue when there is one.
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

/// The index.
pub struct ImageIndex {
    db: Db,
}

impl ImageIndex {
    /// Open (creating the table if needed) in the database at `path`, which may be the
    /// catalogue's own file.
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Self { db: Db::open(path, SCHEMA)? })
    }

    /// A throw-away in-memory index (for the memory store).
    pub fn open_in_memory() -> Result<Self> {
        Ok(Self { db: Db::in_memory(SCHEMA)? })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, rusqlite::Connection> {
        self.db.lock()
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
        self.conn().execute(
            "INSERT OR REPLACE INTO images
             (name, digest, is_image, patient, modality, study_date, meta, search_text, indexed_ms)
             VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                name,
                digest,
                patient.to_lowercase(),
                get("modality").to_uppercase(),
                get("study_date"),
                meta_json,
                text,
                now_ms()
            ],
        )?;
        Ok(())
    }

    /// Record that `name` at `digest` is not a readable image, and why.
    pub fn put_not_image(&self, name: &str, digest: &str, reason: &str) -> Result<()> {
        let meta = serde_json::json!({ "error": reason }).to_string();
        self.conn().execute(
            "INSERT OR REPLACE INTO images
             (name, digest, is_image, patient, modality, study_date, meta, search_text, indexed_ms)
             VALUES (?1, ?2, 0, '', '', '', ?3, '', ?4)",
            params![name, digest, meta, now_ms()],
        )?;
        Ok(())
    }

    /// The entry for `name`, whatever digest it was made from.
    pub fn get(&self, name: &str) -> Result<Option<ImageEntry>> {
        let c = self.conn();
        let mut st =
            c.prepare_cached("SELECT name, digest, is_image, meta FROM images WHERE name = ?1")?;
        Ok(st.query_row([name], entry_from_row).optional()?)
    }

    /// Drop the entry for `name` (deleted, or replaced by other bytes).
    pub fn forget(&self, name: &str) -> Result<()> {
        self.conn().execute("DELETE FROM images WHERE name = ?1", [name])?;
        Ok(())
    }

    /// Images matching every criterion of `q`, by name. Only image rows are returned.
    pub fn search(&self, q: &ImageQuery) -> Result<Vec<ImageEntry>> {
        let like = |s: &Option<String>| {
            s.as_deref().filter(|s| !s.is_empty()).map(|s| format!("%{}%", escape_like(s)))
        };
        let c = self.conn();
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
        let nonempty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
        let rows = st.query_map(
            params![
                q.prefix,
                like(&q.text.as_ref().map(|t| t.to_lowercase())),
                like(&q.patient.as_ref().map(|t| t.to_lowercase())),
                nonempty(&q.modality).map(|m| m.to_uppercase()),
                nonempty(&q.date_from),
                nonempty(&q.date_to),
                q.limit as i64
            ],
            entry_from_row,
        )?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
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
fn escape_like(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn index() -> ImageIndex {
        let ix = ImageIndex::open_in_memory().unwrap();
        let ct = fields(&[
            ("patient_name", "Doe^Jane"),
            ("patient_id", "PID-1"),
            ("modality", "CT"),
            ("study_date", "20240131"),
            ("study_description", "HEAD 100%"),
        ]);
        ix.put("studies/ct.dcm", "x:1", &ct, "{}").unwrap();
        let mr =
            fields(&[("patient_name", "Roe^Rick"), ("modality", "MR"), ("study_date", "20250301")]);
        ix.put("studies/mr.dcm", "x:2", &mr, "{}").unwrap();
        ix.put("photos/card.png", "x:3", &fields(&[("width", "640")]), "{}").unwrap();
        ix.put_not_image("docs/readme.txt", "x:4", "not an image").unwrap();
        ix
    }

    fn names(ix: &ImageIndex, q: ImageQuery) -> Vec<String> {
        ix.search(&ImageQuery { limit: 100, ..q }).unwrap().into_iter().map(|e| e.name).collect()
    }

    #[test]
    fn each_criterion_narrows_the_search() {
        let ix = index();
        let all = names(&ix, ImageQuery::default());
        assert_eq!(all, ["photos/card.png", "studies/ct.dcm", "studies/mr.dcm"]);
        let q = |f: fn(&mut ImageQuery)| {
            let mut q = ImageQuery::default();
            f(&mut q);
            names(&ix, q)
        };
        assert_eq!(q(|q| q.modality = Some("ct".into())), ["studies/ct.dcm"]);
        assert_eq!(q(|q| q.patient = Some("jane".into())), ["studies/ct.dcm"]);
        assert_eq!(q(|q| q.patient = Some("pid-1".into())), ["studies/ct.dcm"]);
        assert_eq!(q(|q| q.text = Some("ROE".into())), ["studies/mr.dcm"]);
        assert_eq!(q(|q| q.text = Some("card".into())), ["photos/card.png"]);
        assert_eq!(q(|q| q.date_from = Some("20250101".into())), ["studies/mr.dcm"]);
        assert_eq!(q(|q| q.date_to = Some("20241231".into())), ["studies/ct.dcm"]);
        assert_eq!(q(|q| q.prefix = "photos/".into()), ["photos/card.png"]);
        assert!(q(|q| q.text = Some("readme".into())).is_empty(), "non-images are not found");
        // LIKE wildcards in the query match only themselves.
        assert_eq!(q(|q| q.text = Some("100%".into())), ["studies/ct.dcm"]);
        assert!(q(|q| q.text = Some("1_0".into())).is_empty());
    }

    #[test]
    fn entries_are_replaced_and_forgotten() {
        let ix = index();
        assert!(!ix.get("docs/readme.txt").unwrap().unwrap().is_image);
        ix.put("docs/readme.txt", "x:5", &fields(&[]), "{\"width\":1}").unwrap();
        let e = ix.get("docs/readme.txt").unwrap().unwrap();
        assert!(e.is_image && e.digest == "x:5");
        ix.forget("docs/readme.txt").unwrap();
        assert_eq!(ix.get("docs/readme.txt").unwrap(), None);
    }
}
