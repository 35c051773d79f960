//! `BlobInfo`: how a blob is described in every JSON answer.

use bs_meta::BlobRecord;
use serde::Serialize;

use crate::blobs::content_type_of;
use crate::images::Images;

#[derive(Debug, Clone, Serialize)]
pub struct BlobInfo {
    pub key: String,
    pub size: u64,
    pub content_type: String,
    pub digest: String,
    pub created_ms: i64,
    /// True when the blob is (or, not yet indexed, looks like) a readable image.
    pub is_image: bool,
    /// The user metadata given at upload (`X-Blobstream-Meta-*`, `put --meta`), of any blob.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// Extracted metadata, once indexed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<serde_json::Value>,
    /// Why the blob is marked corrupt (a reader or the scrubber found bytes that do not match
    /// its digests; reads are refused): in listings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub corrupt: Option<String>,
}

/// Describe `rec` with what the image index knows about its current bytes.
pub fn describe(images: &Images, rec: BlobRecord) -> BlobInfo {
    let content_type = content_type_of(&rec);
    let (is_image, image) = match images.known(&rec) {
        Some(Some(meta)) => (true, Some(meta)),
        Some(None) => (false, None),
        None => (looks_like_image(&rec.name, &content_type), None),
    };
    BlobInfo {
        key: rec.name,
        size: rec.size,
        content_type,
        digest: rec.digest,
        created_ms: rec.created_ms,
        is_image,
        metadata: rec.metadata,
        image,
        corrupt: None,
    }
}

/// A guess before the bytes have been looked at.
pub fn looks_like_image(name: &str, content_type: &str) -> bool {
    content_type.starts_with("image/")
        || content_type == "application/dicom"
        || bs_imageio::Format::from_name(name).is_some()
}
