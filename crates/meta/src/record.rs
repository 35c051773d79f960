//! Rows of the catalogue.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::MetaError;

/// A committed blob as the catalogue describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobRecord {
    pub name: String,
    pub size: u64,
    pub content_type: String,
    /// `algo:hex` digest of the whole blob.
    pub digest: String,
    pub created_ms: i64,
    pub metadata: BTreeMap<String, String>,
}

/// A pending upload: reserved by `route`, not yet committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadRecord {
    pub name: String,
    /// Store-specific identifier of the staging area (the fs store's temp-file name).
    pub upload_id: String,
    /// `None` for uploads of unknown size.
    pub size: Option<u64>,
    pub content_type: String,
    pub metadata: BTreeMap<String, String>,
    pub overwrite: bool,
    /// With `overwrite`: still refuse to replace a blob whose digest is one of these
    /// (HTTP `If-None-Match` with ETags), checked atomically at commit.
    pub refuse_digests: Vec<String>,
    pub resume_tag: String,
    pub created_ms: i64,
}

/// What a commit found under the blob's name, and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Commit {
    /// Committed; the location of the blob it replaced, if any, for the store to delete.
    Done(Option<String>),
    /// Not committed: a blob is there and the upload may not replace it.
    Refused,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// User metadata as stored (a JSON object).
pub(crate) fn to_json(m: &BTreeMap<String, String>) -> String {
    serde_json::to_string(m).expect("string maps always serialise")
}

/// User metadata from its stored form.
pub(crate) fn from_json(name: &str, s: &str) -> Result<BTreeMap<String, String>, MetaError> {
    serde_json::from_str(s)
        .map_err(|e| MetaError::Corrupt { name: name.to_string(), reason: e.to_string() })
}
