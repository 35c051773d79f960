//! Blob bytes for HTTP bodies, verified and without copying: every byte is checked against the
//! blob's chunk digests before it is handed to the connection ([`bs_store::BlobSource`]).
//! Small ranges are checked whole before the response head goes out (a corrupt blob is a
//! 500); larger ones stream chunk by chunk, each checked as it is taken, and a bad chunk ends
//! the body with an error, so the connection is aborted and the client sees a body shorter
//! than its Content-Length — never a complete, wrong one.

use axum::body::Body;
use bs_store::BlobSource;
use bytes::Bytes;

use crate::error::WebError;

/// Ranges up to this size are verified before the response starts.
const CHECK_FIRST_MAX: u64 = 16 << 20;

/// All bytes of a blob, verified.
pub fn blob_bytes(src: &BlobSource) -> Result<Bytes, WebError> {
    Ok(src.all()?)
}

/// A response body for `len` bytes of `src` from `start`, verified as described above.
pub fn verified_body(src: &BlobSource, start: u64, len: u64) -> Result<Body, WebError> {
    if len <= CHECK_FIRST_MAX {
        return Ok(Body::from(src.bytes(start, len)?));
    }
    let pieces = src.pieces(start, len)?.map(|p| {
        p.map_err(|e| {
            tracing::error!(error = %e, "aborting a download: the blob failed verification");
            std::io::Error::other(e.to_string())
        })
    });
    Ok(Body::from_stream(tokio_stream::iter(pieces)))
}
