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
//!
//! A local blob (in memory, or a file) is not waiting on anyone, but its check still costs
//! time before the first byte leaves: for such a client each chunk goes out in two pieces
//! ([`Deferred`]), all but its last [`CHECKED_TAIL`] bytes before the chunk is checked, the
//! rest once it has — so the check runs while the first piece crosses to the client, and
//! what is handed out last (with the SUM behind it) is always checked.

use std::sync::Arc;

use bytes::Bytes;

use super::{BlobSource, Data, Pieces, REMOTE_WINDOW, RangeRead, Result};
use crate::error::StoreError;
use bs_wire::ChunkChecker;

/// See the module doc; from [`BlobSource::arriving`].
pub enum Arriving {
    /// Checked before handed out (large ranges of a remote blob, a range already held).
    Checked(Pieces),
    /// A small range of a remote blob, handed out as it arrives.
    Early(Box<Early>),
    /// A local blob, each chunk's first piece handed out before its check.
    Deferred(Deferred),
}

/// The bytes of a local blob's chunk handed out only after the chunk has been checked (see
/// the module doc): half a [`bs_wire::CHUNK_SIZE`] chunk, so the client is still reading the
/// first half when the check (a fraction of the time the bytes take to cross) is done and the
/// rest comes. A piece of a chunk no longer than this is checked before it goes.
pub const CHECKED_TAIL: u64 = 512 << 10;

/// See the module doc; from [`BlobSource::arriving`].
pub struct Deferred {
    src: BlobSource,
    /// The chunks still to hand out.
    chunks: std::ops::Range<usize>,
    /// The range handed out.
    start: u64,
    end: u64,
    /// A chunk whose first piece was handed out: its index, all its bytes, and the rest of
    /// the range in it, to hand out once they have checked.
    rest: Option<(usize, Bytes, Bytes)>,
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
    /// Bytes `offset..offset + len` as pieces handed out before their chunk has been checked
    /// (see the module doc): as they arrive when the blob is in a remote store and the range
    /// fits in one window (else [`BlobSource::pieces`]); each chunk in two pieces, the first
    /// before the check, when the blob is local. Only for a caller whose receiver trusts
    /// nothing before this iterator has ended without an error. The last piece handed out
    /// has always been checked.
    pub fn arriving(&self, offset: u64, len: u64) -> Result<Arriving> {
        self.check_range(offset, len)?;
        let i = &self.inner;
        let chunks = i.chunks.covering(offset, len);
        let Data::Remote { reader, window } = &*i.data else {
            let (src, start, end) = (self.clone(), offset, offset + len);
            return Ok(Arriving::Deferred(Deferred { src, chunks, start, end, rest: None }));
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
            Arriving::Deferred(d) => d.next(),
        }
    }
}

impl Deferred {
    /// End the stream with `e`.
    fn fail(&mut self, e: StoreError) -> Option<Result<Bytes>> {
        self.chunks.start = self.chunks.end;
        Some(Err(e))
    }

    /// `out`, of chunk `c` (all of whose bytes are `chunk`), once the chunk has checked.
    fn checked(&mut self, c: usize, chunk: &Bytes, out: Bytes) -> Option<Result<Bytes>> {
        match self.src.check_chunk(c, chunk) {
            Ok(()) => Some(Ok(out)),
            Err(e) => self.fail(e),
        }
    }
}

impl Iterator for Deferred {
    type Item = Result<Bytes>;

    fn next(&mut self) -> Option<Result<Bytes>> {
        if let Some((c, chunk, rest)) = self.rest.take() {
            return self.checked(c, &chunk, rest);
        }
        let c = self.chunks.next()?;
        let chunk = match self.src.chunk_unchecked(c) {
            Ok(b) => b,
            Err(e) => return self.fail(e),
        };
        let r = self.src.inner.chunks.range(c);
        let (s, e) = (r.start.max(self.start), r.end.min(self.end));
        let mut out = chunk.slice((s - r.start) as usize..(e - r.start) as usize);
        if out.len() as u64 <= CHECKED_TAIL {
            return self.checked(c, &chunk, out); // too little to be worth two pieces
        }
        let rest = out.split_off(out.len() - CHECKED_TAIL as usize);
        self.rest = Some((c, chunk, rest));
        Some(Ok(out))
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
    use std::sync::atomic::Ordering;

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

    /// A local blob: every piece, each with whether its chunk had been checked (marked as a
    /// memory blob's chunks are) by the time it was handed out, and the error ending it.
    fn drain_local(
        good: &[u8],
        stored: Vec<u8>,
        from: u64,
        len: u64,
    ) -> (Vec<(usize, bool)>, Vec<u8>, Option<StoreError>) {
        let record = crate::source::tests::record(good.len() as u64);
        let src = BlobSource::memory(record, stored.into(), ChunkDigests::of(good), None).unwrap();
        let it = src.arriving(from, len).unwrap();
        assert!(matches!(it, Arriving::Deferred(_)));
        let (mut pieces, mut bytes, mut err) = (Vec::new(), Vec::new(), None);
        let mut at = from;
        for p in it {
            match p {
                Ok(b) => {
                    assert!(err.is_none(), "a piece after the error");
                    let c = (at / C as u64) as usize;
                    pieces.push((b.len(), src.inner.checked[c].load(Ordering::Acquire)));
                    at += b.len() as u64;
                    bytes.extend_from_slice(&b);
                }
                Err(e) => err = Some(e),
            }
        }
        (pieces, bytes, err)
    }

    #[test]
    fn a_local_chunk_goes_out_in_two_pieces_the_second_after_its_check() {
        let d = data();
        let t = CHECKED_TAIL as usize;
        // From inside chunk 0 to inside chunk 2; chunk 3 (10 bytes) not asked for.
        let (pieces, bytes, err) = drain_local(&d, d.clone(), 100, 2 * C as u64);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(bytes, d[100..100 + 2 * C]);
        let want = [
            (C - 100 - t, false),
            (t, true),
            (C - t, false),
            (t, true),
            (100, true), // too little to split: checked first
        ];
        assert_eq!(pieces, want);

        // A bad chunk: its first piece went out, then the error instead of the rest.
        let mut rotten = d.clone();
        rotten[C + 5] ^= 1;
        let (pieces, _, err) = drain_local(&d, rotten, 0, d.len() as u64);
        assert_eq!(pieces, [(C - t, false), (t, true), (C - t, false)]);
        assert!(
            matches!(&err, Some(StoreError::Corrupt { reason, .. }) if reason.contains("chunk 1")),
            "{err:?}"
        );
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
