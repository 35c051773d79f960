//! A range of a remote blob handed out as its bytes arrive, each chunk checked when its last
//! byte is in — for the data plane, whose client accepts nothing before the stream's final
//! SUM, which is sent only after every chunk the range touches has been checked.
//!
//! Checking a chunk before handing any of it out costs a small blob a whole extra hop: the
//! object's GET must end, then the check runs, then the bytes cross the next connection.
//! Handed on as they arrive, the bytes are on their way to the client while the rest of the
//! GET is still coming, and a bad chunk still ends the stream with an error before the end
//! (it is logged, counted and marked as [`BlobSource::pieces`] does): its receiver has bytes
//! it must throw away, never bytes with success. A range that ends inside a chunk keeps its
//! last piece back until the rest of that chunk has arrived and checked.

use bytes::Bytes;

use super::{BlobSource, Data, Pieces, REMOTE_WINDOW, Result};
use crate::error::StoreError;
use bs_wire::ChunkChecker;

/// See the module doc; from [`BlobSource::arriving`].
pub enum Arriving {
    /// Checked before handed out (local stores, large ranges, a range already held).
    Checked(Pieces),
    Early(Box<Early>),
}

pub struct Early {
    src: BlobSource,
    /// The store's answer for bytes `at..to`.
    raw: Box<dyn Iterator<Item = Result<Bytes>> + Send>,
    /// Whether `raw` is already the second try (after the first broke).
    retried: bool,
    checker: ChunkChecker,
    /// Blob offset of the next byte `raw` gives.
    at: u64,
    /// Where the chunks the range touches end.
    to: u64,
    /// The range handed out.
    start: u64,
    end: u64,
    /// The range's last piece, kept until its chunk has checked.
    last: Option<Bytes>,
}

impl BlobSource {
    /// Bytes `offset..offset + len` as pieces handed out before their chunk is whole (see the
    /// module doc) when the blob is in a remote store and the range fits in one window;
    /// otherwise [`BlobSource::pieces`]. Only for a caller whose receiver trusts nothing
    /// before this iterator has ended without an error.
    pub fn arriving(&self, offset: u64, len: u64) -> Result<Arriving> {
        self.check_range(offset, len)?;
        let i = &self.inner;
        let chunks = i.chunks.covering(offset, len);
        let Data::Remote { reader, window } = &*i.data else {
            return self.pieces(offset, len).map(Arriving::Checked);
        };
        if chunks.is_empty() {
            return self.pieces(offset, len).map(Arriving::Checked);
        }
        let (from, to) = (i.chunks.range(chunks.start).start, i.chunks.range(chunks.end - 1).end);
        let held = window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|(at, held)| *at <= offset && offset + len <= at + held.len() as u64);
        let raw =
            (to - from <= REMOTE_WINDOW && !held).then(|| reader.arriving(from, to)).flatten();
        let Some(raw) = raw else {
            return self.pieces(offset, len).map(Arriving::Checked);
        };
        Ok(Arriving::Early(Box::new(Early {
            src: self.clone(),
            raw,
            retried: false,
            checker: ChunkChecker::new(chunks.start),
            at: from,
            to,
            start: offset,
            end: offset + len,
            last: None,
        })))
    }
}

impl Iterator for Arriving {
    type Item = Result<Bytes>;

    fn next(&mut self) -> Option<Result<Bytes>> {
        match self {
            Arriving::Checked(p) => p.next(),
            Arriving::Early(e) => e.next(),
        }
    }
}

impl Early {
    /// End the stream with `e`.
    fn fail(&mut self, e: StoreError) -> Option<Result<Bytes>> {
        self.at = self.to;
        self.last = None;
        Some(Err(e))
    }

    fn next(&mut self) -> Option<Result<Bytes>> {
        while self.at < self.to {
            let piece = match self.raw.next() {
                Some(Ok(p)) => p,
                // A GET that broke (or ended early) is asked once more for the rest, by a
                // plain read of the store, which reports a vanished object as such.
                Some(Err(_)) | None if !self.retried => {
                    self.retried = true;
                    let reader = match &*self.src.inner.data {
                        Data::Remote { reader, .. } => reader.clone(),
                        _ => unreachable!("an early stream reads a remote blob"),
                    };
                    match reader.read(self.at, self.to - self.at) {
                        Ok(rest) => {
                            self.raw = Box::new(std::iter::once(Ok(rest)));
                            continue;
                        }
                        Err(e) => return self.fail(e),
                    }
                }
                Some(Err(e)) => return self.fail(e),
                None => {
                    let name = self.src.inner.record.name.clone();
                    let reason =
                        format!("the store's answer ended at byte {} of {}", self.at, self.to);
                    return self.fail(StoreError::Corrupt { name, reason });
                }
            };
            let (from, to) = (self.at, self.at + piece.len() as u64);
            if to > self.to {
                let name = self.src.inner.record.name.clone();
                let reason = format!("the store returned bytes past {}", self.to);
                return self.fail(StoreError::Corrupt { name, reason });
            }
            if let Err(c) = self.checker.update(&self.src.inner.chunks, &piece) {
                let e = self.src.bad_chunk(c);
                return self.fail(e);
            }
            self.at = to;
            let (s, e) = (from.max(self.start), to.min(self.end));
            if s >= e {
                continue; // before or after the range: checked, not handed out
            }
            let out = piece.slice((s - from) as usize..(e - from) as usize);
            if e == self.end && self.at < self.to {
                self.last = Some(out); // the rest of its chunk is checked first
                continue;
            }
            return Some(Ok(out));
        }
        self.last.take().map(Ok)
    }
}
