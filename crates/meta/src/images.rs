//! The image index: metadata extracted from image blobs (dimensions, pixel type, DICOM
//! patient, modality, study date, ...) for search, in the same database as the catalogue
//! (SQLite, or PostgreSQL shared by every front end).
//!
//! Rows are keyed by blob name and carry the digest of the bytes they were extracted from,
//! so a row for bytes that have since been replaced or deleted is recognisably stale: callers
//! compare digests with the catalogue and drop stale rows ([`ImageIndex::forget`]). A row also
//! records blobs that turned out *not* to be images, so they are not decoded again.
//!
//! DICOM instances are also grouped as radiologists look at them, Patient → Study → Series →
//! Instance: [`ImageIndex::studies`] (one row per Study Instance UID, for a worklist),
//! [`ImageIndex::series`] (the series of a study) and [`ImageIndex::instances`] (a series'
//! images in slice order: position along the slice normal, else Slice Location, else Instance
//! Number). The columns for that (`study_uid`, `series_uid`, `slice_pos`, `instance_no`) are
//! added to an older table on open; rows indexed before have them empty until re-indexed.

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

/// Columns added after the first version, with their SQLite definitions.
const ADDED_COLUMNS: [(&str, &str); 4] = [
    ("study_uid", "TEXT NOT NULL DEFAULT ''"),
    ("series_uid", "TEXT NOT NULL DEFAULT ''"),
    ("slice_pos", "REAL"),
    ("instance_no", "INTEGER"),
];

const SERIES_INDEXES: &str = "
CREATE INDEX IF NOT EXISTS images_study_uid ON images(study_uid);
CREATE INDEX IF NOT EXISTS images_series_uid ON images(series_uid);
";

/// Add the columns an older table lacks, then their indexes.
fn migrate_sqlite(db: &Db) -> Result<()> {
    let c = db.lock();
    let have: Vec<String> = c
        .prepare("SELECT name FROM pragma_table_info('images')")?
        .query_map([], |r| r.get(0))?
        .collect::<std::result::Result<_, _>>()?;
    for (col, def) in ADDED_COLUMNS {
        if !have.iter().any(|h| h == col) {
            c.execute_batch(&format!("ALTER TABLE images ADD COLUMN {col} {def}"))?;
        }
    }
    c.execute_batch(SERIES_INDEXES)?;
    c.execute_batch(FILL_SERIES_SQLITE)?;
    Ok(())
}

/// Rows indexed before the series columns existed get them from their metadata; verdicts of
/// "not an image" that only meant "not decoded yet" (an encoding unsupported then) are dropped,
/// so those blobs are looked at again (not an instance with no pixels at all, which no decoder
/// will show), and so are rows of undecodable DICOM instances written before they kept their
/// patient, date and modality (their `patient` column is empty; it is at least the separator
/// now). Cheap and idempotent: it touches only such rows.
const FILL_SERIES_SQLITE: &str = "
UPDATE images SET
    study_uid = coalesce(json_extract(meta, '$.study_instance_uid'), ''),
    series_uid = coalesce(json_extract(meta, '$.series_instance_uid'), ''),
    instance_no = json_extract(meta, '$.instance_number')
WHERE is_image = 1 AND study_uid = '' AND json_valid(meta)
  AND json_extract(meta, '$.study_instance_uid') IS NOT NULL;
DELETE FROM images WHERE is_image = 0 AND (meta LIKE '%not supported%' OR meta LIKE '%unsupported%')
  AND meta NOT LIKE '%not an image: no Pixel Data%';
DELETE FROM images WHERE is_image = 0 AND study_uid != '' AND patient = '';
";

/// One study of the worklist: counts over its instances, the metadata (JSON) of its first
/// decoded image by name (of its first instance when none decodes), which carries the patient and study attributes, and the user metadata
/// given at upload with any of its instances.
#[derive(Debug, Clone, PartialEq)]
pub struct StudySummary {
    pub study_uid: String,
    /// Every instance, whether or not its pixels can be decoded.
    pub instances: u64,
    /// The decoded images among them.
    pub images: u64,
    pub series: u64,
    /// Distinct modalities of its series, sorted.
    pub modalities: Vec<String>,
    pub meta: String,
    /// Each user metadata key of any of its instances (the `user_metadata` object of their
    /// metadata) with its distinct values, sorted.
    pub user_metadata: BTreeMap<String, Vec<String>>,
}

/// The key of the user metadata object in an entry's metadata.
pub const USER_METADATA: &str = "user_metadata";

/// Merge the distinct user metadata objects of a study's instances (`json`: a JSON array of
/// the objects, each as itself or as its JSON text, as the backends aggregate them).
pub(crate) fn merge_user_metadata(json: Option<&str>) -> BTreeMap<String, Vec<String>> {
    use serde_json::Value;
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let items: Vec<Value> = json.and_then(|j| serde_json::from_str(j).ok()).unwrap_or_default();
    for item in items {
        let object = match item {
            Value::String(t) => serde_json::from_str(&t).ok(),
            v => Some(v),
        };
        let Some(Value::Object(m)) = object else { continue };
        for (k, v) in m {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            let vals = out.entry(k).or_default();
            if let Err(at) = vals.binary_search(&v) {
                vals.insert(at, v);
            }
        }
    }
    out
}

/// One series of a study: how many instances and decoded images, and the metadata of its first
/// image by name (of its first instance when none decodes).
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesSummary {
    pub series_uid: String,
    /// Every instance, whether or not its pixels can be decoded.
    pub instances: u64,
    /// The decoded images among them.
    pub images: u64,
    pub meta: String,
}

/// Where an instance sits along its series: the position's distance along the slice normal
/// (row cosines × column cosines), else Slice Location.
fn slice_position(fields: &BTreeMap<String, String>) -> Option<f64> {
    let nums = |k: &str| -> Option<Vec<f64>> {
        fields.get(k)?.split('\\').map(|v| v.trim().parse::<f64>().ok()).collect()
    };
    if let (Some(p), Some(o)) = (nums("image_position_patient"), nums("image_orientation_patient"))
        && p.len() == 3
        && o.len() == 6
    {
        let n = [o[1] * o[5] - o[2] * o[4], o[2] * o[3] - o[0] * o[5], o[0] * o[4] - o[1] * o[3]];
        let d = p[0] * n[0] + p[1] * n[1] + p[2] * n[2];
        if d.is_finite() {
            return Some(d);
        }
    }
    fields.get("slice_location")?.parse::<f64>().ok().filter(|v| v.is_finite())
}

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
    /// [`ImageIndex::studies`] only: the studies whose UIDs sort after this one (the next
    /// page after a study).
    pub study_after: Option<String>,
    /// [`ImageIndex::studies`] only: just these studies, looked up by UID (empty: any).
    pub study_uids: Vec<String>,
    /// [`ImageIndex::search`] only: the images whose names sort after this one (the next
    /// page after an image).
    pub name_after: Option<String>,
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
    pub study_uid: &'a str,
    pub series_uid: &'a str,
    pub slice_pos: Option<f64>,
    pub instance_no: Option<i64>,
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
    pub study_after: Option<String>,
    /// The study UIDs asked for (empty: any).
    pub study_uids: Vec<String>,
    pub name_after: Option<String>,
}

impl ImageIndex {
    /// Open (creating the table if needed) in the SQLite database at `path`, which may be
    /// the catalogue's own file.
    ///
    /// Its writes are not fsynced each (`synchronous=NORMAL`: they become durable with the
    /// catalogue's next commit or a checkpoint): every row is derived from a blob, and the
    /// server indexes whatever has no current row when it starts (`bs_web::index_all`), so
    /// a crash costs a re-index, never a wrong row. An fsync per row would hold the file's
    /// one write lock through it, stalling the catalogue's commits behind it.
    pub fn open(path: &Path) -> Result<Self> {
        let db = Db::open(path, SCHEMA)?;
        db.lock().pragma_update(None, "synchronous", "NORMAL")?;
        migrate_sqlite(&db)?;
        Ok(Self { backend: Backend::Sqlite(db) })
    }

    /// A throw-away in-memory index (for the memory store).
    pub fn open_in_memory() -> Result<Self> {
        let db = Db::in_memory(SCHEMA)?;
        migrate_sqlite(&db)?;
        Ok(Self { backend: Backend::Sqlite(db) })
    }

    /// The index in PostgreSQL at `url` (the catalogue's database), shared by every front
    /// end.
    pub fn connect_postgres(url: &str) -> Result<Self> {
        let pg = Box::new(crate::pg::off_executor(|| PgImages::connect(url))?);
        Ok(Self { backend: Backend::Postgres(pg) })
    }

    fn upsert(&self, row: IndexRow<'_>) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(db) => upsert_on(&db.lock(), &row),
            Backend::Postgres(pg) => crate::pg::off_executor(|| pg.upsert(&row)),
        }
    }

    /// Record that each of `rows` (name, digest) is not a readable image, for `reason`: in
    /// one transaction, so that a stream of blobs indexed one by one takes the database's
    /// write lock once per batch, not once per blob.
    pub fn put_not_images(&self, rows: &[(String, String)], reason: &str) -> Result<()> {
        let meta = serde_json::json!({ "error": reason }).to_string();
        match &self.backend {
            Backend::Sqlite(db) => {
                let mut c = db.lock();
                let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                for (name, digest) in rows {
                    upsert_on(&tx, &not_image_row(name, digest, &meta))?;
                }
                tx.commit()?;
                Ok(())
            }
            Backend::Postgres(pg) => crate::pg::off_executor(|| {
                rows.iter().try_for_each(|(n, d)| pg.upsert(&not_image_row(n, d, &meta)))
            }),
        }
    }
}

/// The row of a blob described by `fields` (metadata as strings, keyed as [`ImageIndex::put`]
/// takes them): the searchable columns and the free text come from them.
fn described_row<'a>(
    name: &'a str,
    digest: &'a str,
    is_image: bool,
    fields: &'a BTreeMap<String, String>,
    meta: &'a str,
) -> IndexRow<'a> {
    let get = |k: &str| fields.get(k).map(String::as_str).unwrap_or("");
    let patient = format!("{}\u{1f}{}", get("patient_name"), get("patient_id"));
    let mut text = name.to_lowercase();
    for v in fields.values() {
        text.push('\u{1f}');
        text.push_str(&v.to_lowercase());
    }
    IndexRow {
        name,
        digest,
        is_image,
        patient: patient.to_lowercase(),
        modality: get("modality").to_uppercase(),
        study_date: get("study_date"),
        meta,
        search_text: text,
        study_uid: get("study_instance_uid"),
        series_uid: get("series_instance_uid"),
        slice_pos: slice_position(fields),
        instance_no: get("instance_number").parse().ok(),
    }
}

/// The row of a blob that is not a readable image (`meta`: the reason, as JSON).
fn not_image_row<'a>(name: &'a str, digest: &'a str, meta: &'a str) -> IndexRow<'a> {
    IndexRow {
        name,
        digest,
        is_image: false,
        patient: String::new(),
        modality: String::new(),
        study_date: "",
        meta,
        search_text: String::new(),
        study_uid: "",
        series_uid: "",
        slice_pos: None,
        instance_no: None,
    }
}

/// Insert or replace `row` on `c`.
fn upsert_on(c: &rusqlite::Connection, row: &IndexRow<'_>) -> Result<()> {
    c.prepare_cached(
        "INSERT OR REPLACE INTO images
         (name, digest, is_image, patient, modality, study_date, meta, search_text,
          indexed_ms, study_uid, series_uid, slice_pos, instance_no)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?
    .execute(params![
        row.name,
        row.digest,
        row.is_image,
        row.patient,
        row.modality,
        row.study_date,
        row.meta,
        row.search_text,
        now_ms(),
        row.study_uid,
        row.series_uid,
        row.slice_pos,
        row.instance_no
    ])?;
    Ok(())
}

impl ImageIndex {
    /// Record what was extracted from `name` at `digest`. `fields` are the metadata as
    /// strings (for the searchable columns and free text); `meta_json` the same as JSON.
    pub fn put(
        &self,
        name: &str,
        digest: &str,
        fields: &BTreeMap<String, String>,
        meta_json: &str,
    ) -> Result<()> {
        self.upsert(described_row(name, digest, true, fields, meta_json))
    }

    /// Record a DICOM instance whose pixels cannot be decoded (`reason`), under its study and
    /// series: `fields` are its UIDs and descriptive attributes as strings, keyed as an image's
    /// are, so it is found by UID, patient, date and modality and counted in its study.
    pub fn put_undecodable_dicom(
        &self,
        name: &str,
        digest: &str,
        fields: &BTreeMap<String, String>,
        reason: &str,
    ) -> Result<()> {
        let mut meta = serde_json::Map::new();
        meta.insert("error".into(), reason.into());
        for (k, v) in fields {
            meta.insert(k.clone(), v.clone().into());
        }
        let meta = serde_json::Value::Object(meta).to_string();
        self.upsert(described_row(name, digest, false, fields, &meta))
    }

    /// Record that `name` at `digest` is not a readable image, and why.
    pub fn put_not_image(&self, name: &str, digest: &str, reason: &str) -> Result<()> {
        self.put_undecodable_dicom(name, digest, &BTreeMap::new(), reason)
    }

    /// The entry for `name`, whatever digest it was made from.
    pub fn get(&self, name: &str) -> Result<Option<ImageEntry>> {
        match &self.backend {
            Backend::Sqlite(db) => {
                let c = db.read();
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

    /// Drop the entry for `name` only if it was made from `digest` (an entry written for bytes
    /// that were deleted or replaced while they were decoded; a newer entry stays).
    pub fn forget_at(&self, name: &str, digest: &str) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(db) => {
                db.lock().execute(
                    "DELETE FROM images WHERE name = ?1 AND digest = ?2",
                    [name, digest],
                )?;
                Ok(())
            }
            Backend::Postgres(pg) => crate::pg::off_executor(|| pg.forget_at(name, digest)),
        }
    }

    /// The studies with at least one instance matching every criterion of `q` (its `limit`
    /// bounds the studies; `study_after` starts past a study; `study_uids`, when given, are
    /// looked up by UID rather than searched for), by Study Instance UID, with
    /// counts over all their instances (an instance stored under two names counts once).
    /// Instances whose pixels cannot be decoded (a structured report, an encapsulated PDF)
    /// count as instances and may be what matched; the metadata shown is a decoded image's
    /// where the study has one. Instances without a Study Instance UID are not in any study.
    pub fn studies(&self, q: &ImageQuery) -> Result<Vec<StudySummary>> {
        let s = search_of(q);
        match &self.backend {
            Backend::Sqlite(db) => {
                let c = db.read();
                // Only the studies named, through the index on study_uid.
                // (The UIDs go in as one JSON array, taken apart by `json_each`.)
                let uids = (!s.study_uids.is_empty())
                    .then(|| serde_json::Value::from(s.study_uids.clone()).to_string());
                let named = match uids {
                    Some(_) => "AND study_uid IN (SELECT value FROM json_each(?9))",
                    None => "",
                };
                let mut st = c.prepare_cached(&format!(
                    "SELECT g.study_uid, g.n, g.ni, g.ns, g.mods, i.meta, g.um FROM (
                       SELECT study_uid, COUNT(DISTINCT {SOP_SQLITE}) AS n,
                              COUNT(DISTINCT {SOP_SQLITE}) FILTER (WHERE is_image = 1) AS ni,
                              COUNT(DISTINCT series_uid) AS ns,
                              group_concat(DISTINCT modality) AS mods,
                              coalesce(MIN(name) FILTER (WHERE is_image = 1), MIN(name)) AS first,
                              json_group_array(DISTINCT json_extract(meta, '$.{USER_METADATA}'))
                                FILTER (WHERE json_valid(meta)
                                  AND json_type(meta, '$.{USER_METADATA}') = 'object') AS um
                       FROM images WHERE study_uid IN (
                         SELECT DISTINCT study_uid FROM images
                         WHERE study_uid > coalesce(?8, '') {named} AND {MATCH_SQLITE}
                         ORDER BY study_uid LIMIT ?7)
                       GROUP BY study_uid ORDER BY study_uid
                     ) g JOIN images i ON i.name = g.first ORDER BY g.study_uid"
                ))?;
                let mut params = s.sqlite_params().to_vec();
                params.push(&s.study_after);
                if uids.is_some() {
                    params.push(&uids);
                }
                let rows = st.query_map(&params[..], |r| {
                    Ok(StudySummary {
                        study_uid: r.get(0)?,
                        instances: r.get::<_, i64>(1)? as u64,
                        images: r.get::<_, i64>(2)? as u64,
                        series: r.get::<_, i64>(3)? as u64,
                        modalities: modalities(&r.get::<_, Option<String>>(4)?.unwrap_or_default()),
                        meta: r.get(5)?,
                        user_metadata: merge_user_metadata(
                            r.get::<_, Option<String>>(6)?.as_deref(),
                        ),
                    })
                })?;
                Ok(rows.collect::<std::result::Result<_, _>>()?)
            }
            Backend::Postgres(pg) => crate::pg::off_executor(|| pg.studies(&s)),
        }
    }

    /// The series of study `study_uid`, by Series Instance UID (counting instances whose pixels
    /// cannot be decoded too, and an instance stored under two names once).
    pub fn series(&self, study_uid: &str) -> Result<Vec<SeriesSummary>> {
        match &self.backend {
            Backend::Sqlite(db) => {
                let c = db.read();
                let mut st = c.prepare_cached(&format!(
                    "SELECT g.series_uid, g.n, g.ni, i.meta FROM (
                       SELECT series_uid, COUNT(DISTINCT {SOP_SQLITE}) AS n,
                              COUNT(DISTINCT {SOP_SQLITE}) FILTER (WHERE is_image = 1) AS ni,
                              coalesce(MIN(name) FILTER (WHERE is_image = 1), MIN(name)) AS first
                       FROM images WHERE study_uid = ?1 GROUP BY series_uid
                     ) g JOIN images i ON i.name = g.first ORDER BY g.series_uid"
                ))?;
                let rows = st.query_map([study_uid], |r| {
                    Ok(SeriesSummary {
                        series_uid: r.get(0)?,
                        instances: r.get::<_, i64>(1)? as u64,
                        images: r.get::<_, i64>(2)? as u64,
                        meta: r.get(3)?,
                    })
                })?;
                Ok(rows.collect::<std::result::Result<_, _>>()?)
            }
            Backend::Postgres(pg) => crate::pg::off_executor(|| pg.series(study_uid)),
        }
    }

    /// The instances of series `series_uid` in slice order (see the module documentation), then
    /// by Instance Number and name; those whose pixels cannot be decoded have `is_image` false.
    /// Every blob indexed is listed: one instance stored under two names is listed twice, and
    /// [`one_per_instance`] keeps the first of each once the caller has dropped stale rows.
    pub fn instances(&self, series_uid: &str) -> Result<Vec<ImageEntry>> {
        match &self.backend {
            Backend::Sqlite(db) => {
                let c = db.read();
                let mut st = c.prepare_cached(&format!(
                    "SELECT name, digest, is_image, meta FROM images
                     WHERE series_uid = ?1 {INSTANCE_ORDER}"
                ))?;
                let rows = st.query_map([series_uid], entry_from_row)?;
                Ok(rows.collect::<std::result::Result<_, _>>()?)
            }
            Backend::Postgres(pg) => crate::pg::off_executor(|| pg.instances(series_uid)),
        }
    }

    /// Images matching every criterion of `q`, by name. Only image rows are returned.
    pub fn search(&self, q: &ImageQuery) -> Result<Vec<ImageEntry>> {
        let s = search_of(q);
        match &self.backend {
            Backend::Sqlite(db) => {
                let c = db.read();
                let mut st = c.prepare_cached(&format!(
                    "SELECT name, digest, is_image, meta FROM images
                     WHERE is_image = 1 AND {MATCH_SQLITE} AND (?8 IS NULL OR name > ?8)
                     ORDER BY name LIMIT ?7"
                ))?;
                let mut params = s.sqlite_params().to_vec();
                params.push(&s.name_after);
                let rows = st.query_map(&params[..], entry_from_row)?;
                Ok(rows.collect::<std::result::Result<_, _>>()?)
            }
            Backend::Postgres(pg) => crate::pg::off_executor(|| pg.search(&s)),
        }
    }
}

/// The search criteria as SQLite parameters ?1–?6 (prefix, text, patient, modality, dates),
/// over every row: decoded images and instances whose pixels cannot be decoded.
const MATCH_SQLITE: &str = "substr(name, 1, length(?1)) = ?1
    AND (?2 IS NULL OR search_text LIKE ?2 ESCAPE '\\')
    AND (?3 IS NULL OR patient LIKE ?3 ESCAPE '\\')
    AND (?4 IS NULL OR modality = ?4)
    AND (?5 IS NULL OR (study_date != '' AND study_date >= ?5))
    AND (?6 IS NULL OR (study_date != '' AND study_date <= ?6))";

impl Search<'_> {
    /// The criteria as SQLite parameters ?1–?7 ([`MATCH_SQLITE`] and the limit).
    fn sqlite_params(&self) -> [&dyn rusqlite::ToSql; 7] {
        [
            &self.prefix,
            &self.text,
            &self.patient,
            &self.modality,
            &self.date_from,
            &self.date_to,
            &self.limit,
        ]
    }
}

/// What tells instances apart in SQLite: the SOP Instance UID, or the blob name where there is
/// none (the same instance stored under two names is one).
const SOP_SQLITE: &str = "coalesce(nullif(CASE WHEN json_valid(meta) \
                          THEN json_extract(meta, '$.sop_instance_uid') END, ''), name)";

impl ImageEntry {
    /// The SOP Instance UID the entry's metadata names ("" when none).
    pub fn sop_instance_uid(&self) -> String {
        serde_json::from_str::<serde_json::Value>(&self.meta)
            .ok()
            .and_then(|m| m.get("sop_instance_uid")?.as_str().map(String::from))
            .unwrap_or_default()
    }
}

/// `items` with each SOP Instance UID (as `sop` reads it) only once: its first item, so a
/// list in slice order stays in it; items without one are all kept. A DICOM instance put
/// under two names (an upload and a STOW-RS of the same file) is one instance to a viewer and
/// to DICOMweb.
pub fn one_per_instance<T>(items: Vec<T>, sop: impl Fn(&T) -> String) -> Vec<T> {
    let mut seen = std::collections::HashSet::new();
    items
        .into_iter()
        .filter(|i| {
            let uid = sop(i);
            uid.is_empty() || seen.insert(uid)
        })
        .collect()
}

/// Slice order within a series, the same in both databases.
pub(crate) const INSTANCE_ORDER: &str =
    "ORDER BY (slice_pos IS NULL), slice_pos, (instance_no IS NULL), instance_no, name";

/// A comma-separated aggregate of modalities as a sorted list without blanks.
pub(crate) fn modalities(joined: &str) -> Vec<String> {
    let mut v: Vec<String> =
        joined.split(',').map(str::trim).filter(|m| !m.is_empty()).map(String::from).collect();
    v.sort();
    v.dedup();
    v
}

/// `q` in stored form (LIKE patterns escaped, case folded).
fn search_of(q: &ImageQuery) -> Search<'_> {
    let like = |s: &Option<String>| {
        s.as_deref()
            .filter(|s| !s.is_empty())
            .map(|s| format!("%{}%", escape_like(&s.to_lowercase())))
    };
    let nonempty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    Search {
        prefix: &q.prefix,
        text: like(&q.text),
        patient: like(&q.patient),
        modality: nonempty(&q.modality).map(|m| m.to_uppercase()),
        date_from: nonempty(&q.date_from),
        date_to: nonempty(&q.date_to),
        limit: q.limit.min(i64::MAX as usize) as i64,
        study_after: q.study_after.clone(),
        study_uids: q.study_uids.clone(),
        name_after: q.name_after.clone(),
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
