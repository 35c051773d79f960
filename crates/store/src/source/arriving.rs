//! A range of a remote blob handed out as its bytes arrive, each chunk checked when its last
//! byte is in — for the data plane, when its client uses nothing before the stream's final
//! SUM (`NegotiateRequest.whole_before_use`: it reads into memory, or into a file it drops on
//! failure), which is sent only after every chunk the range touches has been checked. A
//! client that passes bytes on as they come gets [`BlobSource::pieces`]: checked chunks only.
//!
//! Checking a chunk before handing any of it out costs a small blob a whole extra hop: the
//! object's GET must end, then the check runs, then the bytes cross the next connection.
//! Handed on as they arrive, the bytes are on their way to the client while the rest of the
//! GET is still coming, and a bad chunk still ends the stream with an error before the end
//! (it is logged, counted and marked as [`BlobSource::pieces`] does): its receiver has bytes
//! it must throw away, never bytes with success. A range that ends inside a chunk keeps its
//! last piece back until the rest of that chunk has arrived and checked.

use std::sync::Arc;

use bytes::Bytes;

use super::{BlobSource, Data, Pieces, REMOTE_WINDOW, RangeRead, Result};
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
    /// The blob's store, asked again for the rest when its answer breaks.
    reader: Arc<dyn RangeRead>,
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
            reader: reader.clone(),
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
                    match self.reader.read(self.at, self.to - self.at) {
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bs_wire::{CHUNK_SIZE, ChunkDigests};

    use super::*;

    const C: usize = CHUNK_SIZE as usize;

    /// A remote store whose early answer is pieces of the lengths in `cuts` (clipped to what
    /// was asked for), then, when `fail_at` names a piece, an error in its place; its plain
    /// reads (the retry) serve `data` and are recorded.
    struct Scripted {
        data: Vec<u8>,
        cuts: Vec<usize>,
        fail_at: Option<usize>,
        reads: Mutex<Vec<(u64, u64)>>,
    }

    impl RangeRead for Scripted {
        fn read(&self, offset: u64, len: u64) -> Result<Bytes> {
            self.reads.lock().unwrap().push((offset, len));
            Ok(Bytes::copy_from_slice(&self.data[offset as usize..(offset + len) as usize]))
        }

        fn arriving(
            &self,
            from: u64,
            to: u64,
        ) -> Option<Box<dyn Iterator<Item = Result<Bytes>> + Send>> {
            let mut out = Vec::new();
            let mut at = from as usize;
            for (i, n) in self.cuts.iter().enumerate() {
                if self.fail_at == Some(i) {
                    out.push(Err(StoreError::Unavailable("connection reset".into())));
                    break;
                }
                let end = (at + n).min(to as usize);
                if at >= end {
                    break;
                }
                out.push(Ok(Bytes::copy_from_slice(&self.data[at..end])));
                at = end;
            }
            Some(Box::new(out.into_iter()))
        }
    }

    fn data() -> Vec<u8> {
        (0..3 * C + 10).map(|i| (i % 251) as u8).collect()
    }

    /// A source over `stored` (as the bucket holds it) whose digests are those of `good`.
    fn source(
        good: &[u8],
        stored: Vec<u8>,
        cuts: Vec<usize>,
        fail_at: Option<usize>,
    ) -> (BlobSource, Arc<Scripted>) {
        let record = crate::source::tests::record(good.len() as u64);
        let reader =
            Arc::new(Scripted { data: stored, cuts, fail_at, reads: Mutex::new(Vec::new()) });
        let src = BlobSource::remote(record, reader.clone(), ChunkDigests::of(good), None).unwrap();
        (src, reader)
    }

    /// Every item of the stream: the pieces' lengths, their bytes, and the error ending it.
    fn drain(src: &BlobSource, from: u64, len: u64) -> (Vec<usize>, Vec<u8>, Option<StoreError>) {
        let (mut lens, mut bytes, mut err) = (Vec::new(), Vec::new(), None);
        let it = src.arriving(from, len).unwrap();
        assert!(matches!(it, Arriving::Early(_)));
        for p in it {
            match p {
                Ok(b) => {
                    assert!(err.is_none(), "a piece after the error");
                    lens.push(b.len());
                    bytes.extend_from_slice(&b);
                }
                Err(e) => err = Some(e),
            }
        }
        (lens, bytes, err)
    }

    #[test]
    fn pieces_are_handed_out_as_they_come_and_the_range_is_cut_from_them() {
        let d = data();
        // Pieces across chunk boundaries; a range from inside chunk 0 to inside chunk 2.
        let (src, _) = source(&d, d.clone(), vec![C / 2, C, C, C + 10], None);
        let (lens, bytes, err) = drain(&src, 100, 2 * C as u64);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(bytes, d[100..100 + 2 * C]);
        // Before the range's end: as they came (cut to the range); the last one kept back
        // until its chunk was whole, then handed out.
        assert_eq!(lens, [C / 2 - 100, C, C / 2 + 100]);
    }

    #[test]
    fn a_bad_chunk_ends_the_stream_before_the_piece_that_completes_it() {
        let d = data();
        let mut rotten = d.clone();
        rotten[C + C / 2] ^= 1; // chunk 1
        let (src, reader) = source(&d, rotten, vec![C, C / 4, C / 4, C, C + 10], None);
        let (lens, _, err) = drain(&src, 0, d.len() as u64);
        // Chunk 0, then the two pieces of chunk 1 before the one completing it, then the
        // error: the rest of chunk 1 and everything after it never handed out.
        assert_eq!(lens, [C, C / 4, C / 4]);
        assert!(
            matches!(&err, Some(StoreError::Corrupt { reason, .. }) if reason.contains("chunk 1")),
            "{err:?}"
        );
        assert!(reader.reads.lock().unwrap().is_empty(), "nothing read again");
    }

    #[test]
    fn a_range_ending_inside_a_bad_chunk_hands_out_nothing_of_its_end() {
        let d = data();
        let mut rotten = d.clone();
        rotten[2 * C - 1] ^= 1; // the last byte of chunk 1, after the range's end
        let (src, _) = source(&d, rotten, vec![C, C / 2, C / 2], None);
        let (lens, _, err) = drain(&src, 0, C as u64 + 10);
        assert_eq!(lens, [C], "the range's last 10 bytes wait for their chunk, which fails");
        assert!(matches!(err, Some(StoreError::Corrupt { .. })), "{err:?}");
    }

    #[test]
    fn a_broken_answer_is_read_again_from_where_it_broke() {
        let d = data();
        let (src, reader) = source(&d, d.clone(), vec![C / 3, C / 3, C], Some(2));
        let (_, bytes, err) = drain(&src, 0, 2 * C as u64);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(bytes, d[..2 * C]);
        let at = 2 * (C / 3) as u64;
        assert_eq!(*reader.reads.lock().unwrap(), [(at, 2 * C as u64 - at)]);
        // An answer that stops short is read again the same way.
        let (src, reader) = source(&d, d.clone(), vec![C / 2], None);
        let (_, bytes, err) = drain(&src, 0, C as u64);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(bytes, d[..C]);
        assert_eq!(*reader.reads.lock().unwrap(), [(C as u64 / 2, C as u64 / 2)]);
    }

    #[test]
    fn an_answer_longer_than_asked_is_refused() {
        let d = data();
        let mut longer = d.clone();
        longer.extend_from_slice(&[0; 100]);
        // The scripted answer is clipped to what was asked: ask the source for one chunk of a
        // blob whose answer is served past it by a reader that ignores `to`.
        struct Longer(Vec<u8>);
        impl RangeRead for Longer {
            fn read(&self, _: u64, _: u64) -> Result<Bytes> {
                Err(StoreError::Unavailable("no".into()))
            }
            fn arriving(
                &self,
                from: u64,
                to: u64,
            ) -> Option<Box<dyn Iterator<Item = Result<Bytes>> + Send>> {
                let piece = Bytes::copy_from_slice(&self.0[from as usize..to as usize + 100]);
                Some(Box::new(std::iter::once(Ok(piece))))
            }
        }
        let record = crate::source::tests::record(d.len() as u64);
        let src = BlobSource::remote(record, Arc::new(Longer(longer)), ChunkDigests::of(&d), None)
            .unwrap();
        let out: Vec<_> = src.arriving(0, C as u64).unwrap().collect();
        assert!(
            matches!(&out[..], [Err(StoreError::Corrupt { reason, .. })] if reason.contains("past")),
            "{out:?}"
        );
    }
}
