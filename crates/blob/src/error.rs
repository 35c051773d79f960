//! Errors of the Blob API. A timeout is its own variant, never folded into a failure.

use std::path::PathBuf;
use std::time::Duration;

use bs_client::ClientError;
use bs_store::StoreError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum BlobError {
    #[error("invalid blob key {key:?}: {reason}")]
    InvalidKey { key: String, reason: String },
    /// The message names the blob.
    #[error("{0}")]
    NotFound(String),
    /// The message names the blob.
    #[error("{0}")]
    AlreadyExists(String),
    #[error("operation did not finish within {0:?}")]
    Timeout(Duration),
    #[error("{path}: {source}")]
    File { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Store(StoreError),
    #[error(transparent)]
    Remote(ClientError),
    #[error("blob proxy for {key} is {state}; {wanted} needs it {needed}")]
    WrongState { key: String, state: &'static str, wanted: &'static str, needed: &'static str },
    #[error("the copy task ended without a result")]
    Lost,
    #[error("not started: the batch was stopped")]
    NotStarted,
}

impl BlobError {
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout(_))
    }

    /// Whether bytes failed a digest check: in transit, or at rest in a store.
    pub fn is_integrity(&self) -> bool {
        match self {
            Self::Store(e) => matches!(e, StoreError::Corrupt { .. }),
            Self::Remote(e) => e.is_integrity(),
            _ => false,
        }
    }

    /// Whether the source holds the blob corrupt (its bytes at rest fail their digests, as
    /// the store that holds them found): copying it again meets the same bytes, unlike a
    /// mismatch in transit.
    pub fn is_corrupt_at_source(&self) -> bool {
        match self {
            Self::Store(e) => matches!(e, StoreError::Corrupt { .. }),
            Self::Remote(e) => e.is_corrupt_at_server(),
            _ => false,
        }
    }

    /// A local file the copy cannot write or read as it is, whatever the network does: a name
    /// too long, a folder where a file goes (or a file where a folder does), no permission, no
    /// space, a read-only file system. Running the copy again meets the same.
    pub fn is_local_fault(&self) -> bool {
        let Self::File { source, .. } = self else { return false };
        if source.kind() == std::io::ErrorKind::IsADirectory {
            return true;
        }
        matches!(
            source.raw_os_error(),
            Some(
                libc::ENAMETOOLONG
                    | libc::EISDIR
                    | libc::ENOTDIR
                    | libc::EACCES
                    | libc::EPERM
                    | libc::ENOSPC
                    | libc::EDQUOT
                    | libc::EROFS
                    | libc::ELOOP
            )
        )
    }

    /// The server the copy went to cannot be reached at all (see
    /// `ClientError::is_unreachable`).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Remote(e) if e.is_unreachable())
    }

    pub(crate) fn file(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            Self::NotFound(format!("file {} not found", path.into().display()))
        } else {
            Self::File { path: path.into(), source }
        }
    }
}

impl From<StoreError> for BlobError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(n) => Self::NotFound(format!("blob mem:{n} not found")),
            StoreError::AlreadyExists(n) => Self::AlreadyExists(format!(
                "blob mem:{n} already exists (overwrite it explicitly)"
            )),
            e => Self::Store(e),
        }
    }
}

impl From<ClientError> for BlobError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::NotFound(m) => Self::NotFound(m),
            ClientError::AlreadyExists(m) => Self::AlreadyExists(m),
            e => Self::Remote(e),
        }
    }
}
