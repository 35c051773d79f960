//! The metadata catalogue: which blobs exist, their size, type, digest, times and user
//! metadata, and which uploads are pending — in an embedded SQLite database (WAL mode,
//! `synchronous=FULL`, so an acknowledged commit survives a crash).

mod catalogue;
mod db;
mod error;
mod images;
mod record;

pub use catalogue::{Catalogue, StoredBlob};
pub use error::MetaError;
pub use images::{ImageEntry, ImageIndex, ImageQuery};
pub use record::{BlobRecord, Commit, UploadRecord, now_ms};
