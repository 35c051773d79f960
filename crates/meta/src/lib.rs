//! The metadata catalogue: which blobs exist, their size, type, digest, times and user
//! metadata, and which uploads are pending — in an embedded SQLite database (WAL mode,
//! `synchronous=FULL`, so an acknowledged commit survives a crash; concurrent commits share
//! one transaction and its fsync), or in PostgreSQL shared by many front ends. The image
//! index lives beside it, in the same database.

mod catalogue;
mod db;
mod error;
mod group;
mod images;
mod intent;
mod pg;
mod pg_catalogue;
mod pg_images;
mod record;
mod sqlite_catalogue;

pub use catalogue::{Catalogue, StoredBlob};
pub use error::MetaError;
pub use group::{Durability, GroupStats, group_commits};
pub use images::{
    ImageEntry, ImageIndex, ImageQuery, SeriesSummary, StudySummary, USER_METADATA,
    one_per_instance,
};
pub use intent::CommitIntent;
pub use pg::off_executor;
pub use record::{BlobRecord, Commit, UploadRecord, now_ms};
