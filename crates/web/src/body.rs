//! Blob bytes for HTTP bodies, verified: every byte is checked against the blob's chunk
//! digests before it is handed to the connection ([`bs_store::BlobSource`]), and what was
//! checked is what is sent. Ranges up to [`CHECK_FIRST_MAX`] are checked whole before the
//! response head goes out (a corrupt blob is a 500); longer ones stream, each chunk checked
//! just before it is sent, and a bad chunk ends the body
//! with an error — the connection is aborted and the client sees a body shorter than its
//! Content-Length, never a complete, wrong one.

use axum::body::Body;
use bs_store::BlobSource;
use bytes::Bytes;

/// Ranges up to this size are verified (on the blocking pool) before the response starts.
/// (Checked chunks of a file are pages of its mapping, not copies: holding them costs no heap.)
pub const CHECK_FIRST_MAX: u64 = 16 << 20;

/// A body of pieces already checked (in pooled chunk buffers, sent without copying).
pub fn checked_body(mut pieces: Vec<Bytes>) -> Body {
    match pieces.len() {
        0 => Body::empty(),
        1 => Body::from(pieces.pop().expect("one piece")),
        _ => Body::from_stream(tokio_stream::iter(
            pieces.into_iter().map(Ok::<_, std::convert::Infallible>),
        )),
    }
}

/// A streamed body for `len` bytes of `src` from `start`. Each chunk is checked as the
/// connection takes it, on the connection's own task: that is bringing in 1 MiB of pages
/// (`MADV_POPULATE_READ`, from the page cache when warm) and hashing it, about as long as
/// hyper's own copy of the chunk into the socket — the same work nginx's event loop does
/// inline for `sendfile`. (Handing each chunk to the blocking pool measured slower under
/// load, see BENCHMARKS.md.) A slow client holds nothing but the chunk being sent — and,
/// for a blob in object storage, the windows fetched ahead of it (at most 32 MiB).
pub fn verified_stream(src: BlobSource, start: u64, len: u64) -> Body {
    let name = src.record().name.clone();
    let pieces = match src.pieces(start, len) {
        Ok(p) => p,
        Err(e) => {
            let e = std::io::Error::other(e.to_string());
            return Body::from_stream(tokio_stream::iter([Err::<Bytes, _>(e)]));
        }
    };
    Body::from_stream(tokio_stream::iter(pieces.map(move |p| {
        p.map_err(|e| {
            tracing::error!(blob = %name, error = %e, "download aborted: the blob failed verification");
            std::io::Error::other(e.to_string())
        })
    })))
}
