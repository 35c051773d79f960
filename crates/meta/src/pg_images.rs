//! The image index in PostgreSQL: the SQLite index's table and queries, shared by every
//! front end, so a search through one finds images put through any other.

use crate::error::MetaError;
use crate::images::{
    INSTANCE_ORDER, ImageEntry, IndexRow, Search, SeriesSummary, StudySummary, merge_user_metadata,
    modalities,
};
use crate::pg::PgPool;
use crate::record::now_ms;

type Result<T> = std::result::Result<T, MetaError>;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS images (
    name        TEXT COLLATE "C" PRIMARY KEY NOT NULL,
    digest      TEXT NOT NULL,
    is_image    BOOLEAN NOT NULL,
    patient     TEXT NOT NULL,
    modality    TEXT NOT NULL,
    study_date  TEXT NOT NULL,
    meta        TEXT NOT NULL,
    search_text TEXT NOT NULL,
    indexed_ms  BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS images_modality ON images(modality);
CREATE INDEX IF NOT EXISTS images_study_date ON images(study_date);
ALTER TABLE images ADD COLUMN IF NOT EXISTS study_uid TEXT NOT NULL DEFAULT '';
ALTER TABLE images ADD COLUMN IF NOT EXISTS series_uid TEXT NOT NULL DEFAULT '';
ALTER TABLE images ADD COLUMN IF NOT EXISTS slice_pos DOUBLE PRECISION;
ALTER TABLE images ADD COLUMN IF NOT EXISTS instance_no BIGINT;
CREATE INDEX IF NOT EXISTS images_study_uid ON images(study_uid);
CREATE INDEX IF NOT EXISTS images_series_uid ON images(series_uid);
-- An entry's metadata as jsonb; NULL when it is not JSON (one such row must fail neither the
-- set-up of a front end nor a whole worklist query).
CREATE OR REPLACE FUNCTION blobstream_jsonb(meta TEXT) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $f$
BEGIN
    RETURN meta::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$f$;
UPDATE images SET
    study_uid = coalesce(blobstream_jsonb(meta)->>'study_instance_uid', ''),
    series_uid = coalesce(blobstream_jsonb(meta)->>'series_instance_uid', ''),
    instance_no = (blobstream_jsonb(meta)->>'instance_number')::bigint
WHERE is_image AND study_uid = '' AND blobstream_jsonb(meta) ? 'study_instance_uid';
DELETE FROM images WHERE NOT is_image AND (meta LIKE '%not supported%' OR meta LIKE '%unsupported%')
  AND meta NOT LIKE '%not an image: no Pixel Data%';
DELETE FROM images WHERE NOT is_image AND study_uid != '' AND patient = '';
"#;

/// The search criteria as PostgreSQL parameters $1–$6, as the SQLite index has them.
const MATCH_PG: &str = r"left(name, length($1::text)) = $1::text
    AND ($2::text IS NULL OR search_text LIKE $2::text ESCAPE '\')
    AND ($3::text IS NULL OR patient LIKE $3::text ESCAPE '\')
    AND ($4::text IS NULL OR modality = $4::text)
    AND ($5::text IS NULL OR (study_date != '' AND study_date >= $5::text))
    AND ($6::text IS NULL OR (study_date != '' AND study_date <= $6::text))";

pub(crate) struct PgImages {
    pool: PgPool,
}

impl PgImages {
    pub fn connect(url: &str) -> Result<Self> {
        Ok(Self { pool: PgPool::connect(url, SCHEMA)? })
    }

    pub fn upsert(&self, r: &IndexRow<'_>) -> Result<()> {
        let now = now_ms();
        self.pool.retrying(|c| {
            c.execute(
                "INSERT INTO images
                 (name, digest, is_image, patient, modality, study_date, meta, search_text,
                  indexed_ms, study_uid, series_uid, slice_pos, instance_no)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
                 ON CONFLICT (name) DO UPDATE SET digest = $2, is_image = $3, patient = $4,
                 modality = $5, study_date = $6, meta = $7, search_text = $8, indexed_ms = $9,
                 study_uid = $10, series_uid = $11, slice_pos = $12, instance_no = $13",
                &[
                    &r.name,
                    &r.digest,
                    &r.is_image,
                    &r.patient,
                    &r.modality,
                    &r.study_date,
                    &r.meta,
                    &r.search_text,
                    &now,
                    &r.study_uid,
                    &r.series_uid,
                    &r.slice_pos,
                    &r.instance_no,
                ],
            )
        })?;
        Ok(())
    }

    pub fn get(&self, name: &str) -> Result<Option<ImageEntry>> {
        let row = self.pool.retrying(|c| {
            c.query_opt("SELECT name, digest, is_image, meta FROM images WHERE name = $1", &[&name])
        })?;
        Ok(row.map(|r| entry(&r)))
    }

    pub fn forget(&self, name: &str) -> Result<()> {
        self.pool.retrying(|c| c.execute("DELETE FROM images WHERE name = $1", &[&name]))?;
        Ok(())
    }

    pub fn forget_at(&self, name: &str, digest: &str) -> Result<()> {
        self.pool.retrying(|c| {
            c.execute("DELETE FROM images WHERE name = $1 AND digest = $2", &[&name, &digest])
        })?;
        Ok(())
    }

    pub fn search(&self, s: &Search<'_>) -> Result<Vec<ImageEntry>> {
        let sql = format!(
            "SELECT name, digest, is_image, meta FROM images WHERE is_image AND {MATCH_PG}
             AND ($8::text IS NULL OR name > $8) ORDER BY name LIMIT $7"
        );
        let mut params = pg_params(s).to_vec();
        params.push(&s.name_after);
        let rows = self.pool.retrying(|c| c.query(&sql, &params))?;
        Ok(rows.iter().map(entry).collect())
    }

    pub fn studies(&self, s: &Search<'_>) -> Result<Vec<StudySummary>> {
        // Only the studies named, through the index on study_uid.
        let named = if s.study_uids.is_empty() { "" } else { "AND study_uid = ANY($9::text[])" };
        let sql = format!(
            "SELECT g.study_uid, g.n, g.ni, g.ns, g.mods, i.meta, g.um::text FROM (
               SELECT study_uid, COUNT(DISTINCT sop) AS n,
                      COUNT(DISTINCT sop) FILTER (WHERE is_image) AS ni,
                      COUNT(DISTINCT series_uid) AS ns,
                      string_agg(DISTINCT modality, ',') AS mods,
                      coalesce(MIN(name) FILTER (WHERE is_image), MIN(name)) AS first,
                      json_agg(DISTINCT um) FILTER (WHERE um IS NOT NULL) AS um
               FROM (SELECT name, study_uid, series_uid, modality, is_image,
                            coalesce(nullif(j ->> 'sop_instance_uid', ''), name) AS sop,
                            CASE WHEN jsonb_typeof(j -> 'user_metadata') = 'object'
                                 THEN (j -> 'user_metadata')::text END AS um
                     FROM (SELECT *, blobstream_jsonb(meta) AS j FROM images) parsed) x
               WHERE study_uid IN (
                 SELECT DISTINCT study_uid FROM images
                 WHERE study_uid > coalesce($8::text, '') {named} AND {MATCH_PG}
                 ORDER BY study_uid LIMIT $7)
               GROUP BY study_uid ORDER BY study_uid
             ) g JOIN images i ON i.name = g.first ORDER BY g.study_uid"
        );
        let mut params = pg_params(s).to_vec();
        params.push(&s.study_after);
        if !s.study_uids.is_empty() {
            params.push(&s.study_uids);
        }
        let rows = self.pool.retrying(|c| c.query(&sql, &params))?;
        Ok(rows
            .iter()
            .map(|r| StudySummary {
                study_uid: r.get(0),
                instances: r.get::<_, i64>(1) as u64,
                images: r.get::<_, i64>(2) as u64,
                series: r.get::<_, i64>(3) as u64,
                modalities: modalities(&r.get::<_, Option<String>>(4).unwrap_or_default()),
                meta: r.get(5),
                user_metadata: merge_user_metadata(r.get::<_, Option<String>>(6).as_deref()),
            })
            .collect())
    }

    pub fn series(&self, study_uid: &str) -> Result<Vec<SeriesSummary>> {
        let rows = self.pool.retrying(|c| {
            c.query(
                "SELECT g.series_uid, g.n, g.ni, i.meta FROM (
                   SELECT series_uid, COUNT(DISTINCT sop) AS n,
                          COUNT(DISTINCT sop) FILTER (WHERE is_image) AS ni,
                          coalesce(MIN(name) FILTER (WHERE is_image), MIN(name)) AS first
                   FROM (SELECT name, series_uid, is_image,
                                coalesce(nullif(blobstream_jsonb(meta) ->> 'sop_instance_uid', ''),
                                         name) AS sop
                         FROM images WHERE study_uid = $1) x
                   GROUP BY series_uid
                 ) g JOIN images i ON i.name = g.first ORDER BY g.series_uid",
                &[&study_uid],
            )
        })?;
        Ok(rows
            .iter()
            .map(|r| SeriesSummary {
                series_uid: r.get(0),
                instances: r.get::<_, i64>(1) as u64,
                images: r.get::<_, i64>(2) as u64,
                meta: r.get(3),
            })
            .collect())
    }

    pub fn instances(&self, series_uid: &str) -> Result<Vec<ImageEntry>> {
        let sql = format!(
            "SELECT name, digest, is_image, meta FROM images
             WHERE series_uid = $1 {INSTANCE_ORDER}"
        );
        let rows = self.pool.retrying(|c| c.query(&sql, &[&series_uid]))?;
        Ok(rows.iter().map(entry).collect())
    }
}

/// The criteria as parameters $1–$7 ([`MATCH_PG`] and the limit).
fn pg_params<'a>(s: &'a Search<'_>) -> [&'a (dyn postgres::types::ToSql + Sync); 7] {
    [&s.prefix, &s.text, &s.patient, &s.modality, &s.date_from, &s.date_to, &s.limit]
}

fn entry(r: &postgres::Row) -> ImageEntry {
    ImageEntry { name: r.get(0), digest: r.get(1), is_image: r.get(2), meta: r.get(3) }
}
