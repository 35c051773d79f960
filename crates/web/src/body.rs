//! Blob bytes for HTTP bodies, verified: every byte is checked against the blob's chunk
//! digests before it is handed to the connection ([`bs_store::BlobSource`]), and what was
//! checked is what is sent. Ranges up to [`CHECK_FIRST_MAX`] are checked whole before the
//! response head goes out (a corrupt blob is a 500); longer ones stream, checked a few chunks
//! at a time on the blocking pool shortly before they are sent, and a bad chunk ends the body
//! with an error — the connection is aborted and the client sees a body shorter than its
//! Content-Length, never a complete, wrong one.

use axum::body::Body;
use bs_store::BlobSource;
use bytes::Bytes;

use crate::error::WebError;

/// Ranges up to this size are verified before the response starts. (Checked chunks of a file
/// are pages of its mapping, not copies: holding them costs no heap.)
pub const CHECK_FIRST_MAX: u64 = 64 << 20;

/// Chunks checked per trip to the blocking pool while streaming.
const BATCH: usize = 8;

/// Checked chunks waiting for a slow client: bounds what one download holds.
const READ_AHEAD: usize = 2 * BATCH;

/// All bytes of a blob, verified (call off the async executor).
pub fn blob_bytes(src: &BlobSource) -> Result<Bytes, WebError> {
    Ok(src.all()?)
}

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

/// A streamed body for `len` bytes of `src` from `start`. A task hands each chunk's read and
/// check to the blocking pool and waits for the client to take it, so a slow client holds
/// no thread and at most [`READ_AHEAD`] chunks of memory.
pub fn verified_stream(src: BlobSource, start: u64, len: u64) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(READ_AHEAD);
    tokio::spawn(async move {
        let name = src.record().name.clone();
        let Ok(mut pieces) = src.pieces(start, len) else { return };
        loop {
            let step = tokio::task::spawn_blocking(move || {
                let batch: Vec<_> = pieces.by_ref().take(BATCH).collect();
                (batch, pieces)
            })
            .await;
            let Ok((batch, rest)) = step else { return };
            pieces = rest;
            if batch.is_empty() {
                return; // the whole range went out
            }
            for next in batch {
                let item = next.map_err(|e| {
                    tracing::error!(blob = %name, error = %e, "download aborted: the blob failed verification");
                    std::io::Error::other(e.to_string())
                });
                let last = item.is_err();
                if tx.send(item).await.is_err() || last {
                    return; // the client went away, or the stream is over
                }
            }
        }
    });
    Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}
