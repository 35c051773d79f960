//! A window of an object fetched as one GET whose body is handed out in whole chunks as
//! they arrive, so a sequential reader can check and send each chunk while the rest of the
//! window — and the windows after it, fetched at the same time — are still coming.
//!
//! Fetched whole, a window's first chunk waits for its last, and windows fetched several at
//! once (which lets the server work on them in parallel) then land together at the end: the
//! reader waits, then has all of them to send at once. Streamed, the reader is busy from the
//! first chunk on.

use std::sync::Arc;

use bs_wire::CHUNK_SIZE;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{GetOptions, GetRange};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::object::Backend;

/// Pieces received and not yet taken, at most (one window's chunks: a window is fetched
/// whole without waiting for its reader).
const PIECES_AHEAD: usize = (crate::source::REMOTE_WINDOW / CHUNK_SIZE) as usize;

/// Bytes `next..end` of an object, arriving in the background.
pub struct ObjStream {
    /// Offset of the next byte [`ObjStream::take`] hands out.
    next: u64,
    end: u64,
    rx: mpsc::Receiver<object_store::Result<Bytes>>,
    /// Received bytes from `next` on, before those still in `rx`.
    held: Bytes,
    task: JoinHandle<()>,
}

impl ObjStream {
    /// Start one GET of bytes `from..to` of `key` (`size` bytes long), on `rt`.
    pub fn start(
        rt: &tokio::runtime::Runtime,
        os: Arc<dyn Backend>,
        key: ObjPath,
        (from, to): (u64, u64),
        size: u64,
    ) -> Self {
        let (tx, rx) = mpsc::channel(PIECES_AHEAD);
        let task = rt.spawn(async move {
            if let Err(e) = pump(&*os, &key, from, to, size, &tx).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        Self { next: from, end: to, rx, held: Bytes::new(), task }
    }

    /// Offset of the next byte this stream hands out.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Where this stream ends.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The next `len` bytes (at most up to the end), or fewer when the object ends first;
    /// an error of the GET once it happens (the stream is of no further use then).
    pub async fn take(&mut self, len: u64) -> object_store::Result<Bytes> {
        let len = len.min(self.end - self.next);
        let mut parts: Vec<Bytes> = Vec::new();
        let mut have = 0u64;
        while have < len {
            let piece = if self.held.is_empty() {
                match self.rx.recv().await {
                    Some(got) => got?,
                    None => break,
                }
            } else {
                std::mem::take(&mut self.held)
            };
            let want = (len - have) as usize;
            let piece = if piece.len() > want {
                self.held = piece.slice(want..);
                piece.slice(..want)
            } else {
                piece
            };
            have += piece.len() as u64;
            parts.push(piece);
        }
        self.next += have;
        Ok(match parts.len() {
            0 => Bytes::new(),
            1 => parts.pop().unwrap_or_default(),
            _ => {
                let mut all = BytesMut::with_capacity(have as usize);
                for p in parts {
                    all.extend_from_slice(&p);
                }
                all.freeze()
            }
        })
    }
}

impl Drop for ObjStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// GET `from..to` of `key` (`size` bytes long) and send it on in pieces that end at chunk
/// boundaries.
async fn pump(
    os: &dyn Backend,
    key: &ObjPath,
    from: u64,
    to: u64,
    size: u64,
    tx: &mpsc::Sender<object_store::Result<Bytes>>,
) -> object_store::Result<()> {
    // The whole object is one plain GET (a ranged request costs the server more).
    let range = (from > 0 || to < size).then_some(GetRange::Bounded(from..to));
    let mut body =
        os.get_opts(key, GetOptions { range, ..Default::default() }).await?.into_stream();
    let mut at = from;
    let mut piece = BytesMut::new();
    while let Some(got) = body.next().await {
        let mut got = got?;
        while !got.is_empty() {
            if at >= to {
                return Err(object_store::Error::Generic {
                    store: "S3",
                    source: format!("{key}: more bytes than the {from}..{to} asked for").into(),
                });
            }
            // The piece under way ends at the next chunk boundary (or the range's end).
            let want = (((at / CHUNK_SIZE + 1) * CHUNK_SIZE).min(to) - at) as usize;
            piece.reserve(want - piece.len());
            let n = (want - piece.len()).min(got.len());
            piece.extend_from_slice(&got.split_to(n));
            if piece.len() == want {
                if tx.send(Ok(piece.split().freeze())).await.is_err() {
                    return Ok(());
                }
                at += want as u64;
            }
        }
    }
    if !piece.is_empty() {
        let _ = tx.send(Ok(piece.freeze())).await;
    }
    Ok(())
}
