//! Errors of the metadata catalogue.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum MetaError {
    #[error("metadata database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("metadata database holds a malformed record for {name:?}: {reason}")]
    Corrupt { name: String, reason: String },
    /// The transaction a group of writes shared could not begin or commit; none of them
    /// took effect.
    #[error("metadata database error: {reason}")]
    GroupCommit { disk_full: bool, reason: String },
}

impl MetaError {
    /// The database could not grow: the disk (or quota) is full.
    pub fn is_disk_full(&self) -> bool {
        match self {
            Self::Sqlite(e) => Self::sqlite_disk_full(e),
            Self::GroupCommit { disk_full, .. } => *disk_full,
            Self::Corrupt { .. } => false,
        }
    }

    pub(crate) fn sqlite_disk_full(e: &rusqlite::Error) -> bool {
        matches!(e, rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::DiskFull)
    }
}
