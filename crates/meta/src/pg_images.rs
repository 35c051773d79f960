//! The image index in PostgreSQL: the SQLite index's table and queries, shared by every
//! front end, so a search through one finds images put through any other.

use crate::error::MetaError;
use crate::images::{ImageEntry, IndexRow, Search};
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
"#;

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
                  indexed_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 ON CONFLICT (name) DO UPDATE SET digest = $2, is_image = $3, patient = $4,
                 modality = $5, study_date = $6, meta = $7, search_text = $8, indexed_ms = $9",
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

    pub fn search(&self, s: &Search<'_>) -> Result<Vec<ImageEntry>> {
        let rows = self.pool.retrying(|c| {
            c.query(
                r"SELECT name, digest, is_image, meta FROM images
                  WHERE is_image
                    AND left(name, length($1::text)) = $1::text
                    AND ($2::text IS NULL OR search_text LIKE $2::text ESCAPE '\')
                    AND ($3::text IS NULL OR patient LIKE $3::text ESCAPE '\')
                    AND ($4::text IS NULL OR modality = $4::text)
                    AND ($5::text IS NULL OR (study_date != '' AND study_date >= $5::text))
                    AND ($6::text IS NULL OR (study_date != '' AND study_date <= $6::text))
                  ORDER BY name LIMIT $7",
                &[&s.prefix, &s.text, &s.patient, &s.modality, &s.date_from, &s.date_to, &s.limit],
            )
        })?;
        Ok(rows.iter().map(entry).collect())
    }
}

fn entry(r: &postgres::Row) -> ImageEntry {
    ImageEntry { name: r.get(0), digest: r.get(1), is_image: r.get(2), meta: r.get(3) }
}
