//! Errors of the metadata catalogue.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum MetaError {
    #[error("metadata database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("metadata database holds a malformed record for {name:?}: {reason}")]
    Corrupt { name: String, reason: String },
}
