//! Errors of stores.

use std::io;
use std::path::{Path, PathBuf};

use bs_meta::MetaError;
use thiserror::Error;

/// What went wrong in a store.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("blob {0:?} not found")]
    NotFound(String),
    #[error("no pending upload for {0:?} (route it first)")]
    NoUpload(String),
    #[error("blob {0:?} already exists (set overwrite to replace it)")]
    AlreadyExists(String),
    #[error("invalid blob name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    /// A write conditioned on a version of the blob (HTTP `If-Match`) found that version gone
    /// (replaced, or deleted) when it came to commit or route.
    #[error(
        "blob {0:?} is no longer the version this write was to replace (replaced or deleted meanwhile)"
    )]
    ConditionFailed(String),
    /// User metadata or a content type a blob cannot carry (control characters, too much).
    #[error("{0}")]
    InvalidMetadata(String),
    #[error("write at offset {offset} leaves a gap: only {received} bytes received so far")]
    Gap { offset: u64, received: u64 },
    #[error("write of {len} bytes at offset {offset} exceeds the declared size {size}")]
    BeyondSize { offset: u64, len: u64, size: u64 },
    #[error("range {offset}+{len} is outside blob {name:?} of {size} bytes")]
    OutOfRange { name: String, offset: u64, len: u64, size: u64 },
    #[error("upload of {name:?} is incomplete: {received} of {size} bytes received")]
    Incomplete { name: String, received: u64, size: u64 },
    #[error("upload of {0:?} is in use by another transfer")]
    Busy(String),
    #[error("storage full: {0}")]
    StorageFull(String),
    #[error("blob {name:?} is corrupt on disk: {reason}")]
    Corrupt { name: String, reason: String },
    /// A storage service (object store, catalogue server) cannot be reached or failed a
    /// request: worth a retry later.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A request this store, or this upload, does not take: a second writer of an upload that
    /// takes one, a commit without what the store checks it by.
    #[error("{0}")]
    Unsupported(String),
    /// A store configuration that cannot work (a malformed endpoint, say).
    #[error("store configuration: {0}")]
    Config(String),
    #[error("storage I/O failed: {0}")]
    Io(io::Error),
    /// An I/O error on a file of the store, which the message names for the operator.
    #[error("storage I/O failed on {}: {source}", path.display())]
    IoAt { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Meta(MetaError),
}

impl StoreError {
    /// Whether the upload this error is about belongs to another transfer (on another front
    /// end, say): the caller must not abort it by name on the way out.
    pub fn upload_is_anothers(&self) -> bool {
        matches!(self, Self::Busy(_))
    }

    /// An I/O error on `path`: a full disk is [`StoreError::StorageFull`] as from any I/O
    /// (the file logged for the operator), anything else [`StoreError::IoAt`], naming it.
    pub fn io_at(path: &Path) -> impl FnOnce(io::Error) -> Self + '_ {
        move |e| match Self::from(e) {
            Self::Io(source) => Self::IoAt { path: path.to_path_buf(), source },
            full @ Self::StorageFull(_) => {
                tracing::warn!(path = %path.display(), "{full}");
                full
            }
            other => other,
        }
    }

    /// The message for a client: as `Display` gives it, except that no file of the store is
    /// named — where the server keeps its files is the operator's business, not a client's —
    /// so an [`StoreError::IoAt`] is logged here whole and told without its path.
    pub fn client_message(&self) -> String {
        match self {
            Self::IoAt { path, source } => {
                tracing::error!(path = %path.display(), "storage I/O failed: {source}");
                format!("storage I/O failed: {source}")
            }
            other => other.to_string(),
        }
    }
}

impl From<MetaError> for StoreError {
    /// A catalogue that cannot grow is [`StoreError::StorageFull`], like any full disk.
    fn from(e: MetaError) -> Self {
        if e.is_disk_full() {
            Self::StorageFull(e.to_string())
        } else if e.is_unavailable() {
            Self::Unavailable(e.to_string())
        } else {
            Self::Meta(e)
        }
    }
}

impl From<io::Error> for StoreError {
    /// `ENOSPC`/`EDQUOT` become [`StoreError::StorageFull`]; everything else stays I/O.
    fn from(e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Self::StorageFull(e.to_string()),
            _ if e.kind() == io::ErrorKind::StorageFull => Self::StorageFull(e.to_string()),
            _ => Self::Io(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_on_a_file_names_it_and_a_full_disk_stays_full() {
        let path = Path::new("/data/staging/ab12");
        let e = StoreError::io_at(path)(io::Error::from_raw_os_error(libc::EIO));
        assert!(matches!(e, StoreError::IoAt { .. }), "{e:?}");
        assert!(e.to_string().starts_with("storage I/O failed on /data/staging/ab12: "), "{e}");
        assert!(!e.client_message().contains("/data"), "{}", e.client_message());
        assert!(e.client_message().starts_with("storage I/O failed: "));
        let e = StoreError::io_at(path)(io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(matches!(&e, StoreError::StorageFull(m) if !m.contains("/data")), "{e}");
    }
}
