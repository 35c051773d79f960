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
    /// PostgreSQL refused or failed a statement.
    #[error("catalogue database (PostgreSQL) error: {reason}")]
    Postgres { disk_full: bool, reason: String },
    /// The catalogue's server cannot be reached (down, refusing, connection lost): worth a
    /// retry later.
    #[error("catalogue database unavailable: {0}")]
    Unavailable(String),
    /// A catalogue URL or setting that cannot work.
    #[error("catalogue configuration: {0}")]
    Config(String),
}

impl MetaError {
    /// The database could not grow: the disk (or quota) is full.
    pub fn is_disk_full(&self) -> bool {
        match self {
            Self::Sqlite(e) => Self::sqlite_disk_full(e),
            Self::GroupCommit { disk_full, .. } | Self::Postgres { disk_full, .. } => *disk_full,
            Self::Corrupt { .. } | Self::Unavailable(_) | Self::Config(_) => false,
        }
    }

    /// The database is out of reach for now.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }

    pub(crate) fn sqlite_disk_full(e: &rusqlite::Error) -> bool {
        matches!(e, rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::DiskFull)
    }
}
