//! Errors of the metadata catalogue.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum MetaError {
    #[error("metadata database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("metadata database holds a malformed record for {name:?}: {reason}")]
    Corrupt { name: String, reason: String },
}

impl MetaError {
    /// The database could not grow: the disk (or quota) is full.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, Self::Sqlite(rusqlite::Error::SqliteFailure(e, _))
            if e.code == rusqlite::ErrorCode::DiskFull)
    }
}
