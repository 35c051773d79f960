//! Chunk digests of a pending upload's bytes as its range writers wrote them, so that an upload
//! pushed over several connections commits without reading every byte back: each range
//! writer hashes the chunks it writes in order from their first byte, and at commit those
//! digests, compared with the sender's, stand for the file's chunks.
//!
//! A recorded digest must always be that of the bytes the file holds. Every write to an upload
//! by a range writer, before its bytes go to the file, counts itself in flight on each chunk
//! it touches, bumps the chunk's epoch and clears its digest; once its bytes landed (or
//! failed) it leaves the count. A writer hashes a chunk only while each of its writes to it
//! began with no other write in flight on the chunk and with the epoch its own last write
//! left, and it records the digest only if, after its last write landed, that still holds: no
//! other write overlapped any of its own, so none can land after them. A write beginning after
//! the record clears it. Writes are disjoint by the client's choice, but a retried range may
//! race its cut predecessor's last write; then neither records the chunk. Chunks without a digest (written
//! partly, out of order, before a server restart, or raced) are read back at commit; nothing
//! here is kept on disk. An upload is known here from its first range writer's opening until
//! it is committed, aborted, expired or replaced: a straggling writer of a forgotten upload
//! records nothing.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use bs_wire::{CHUNK_SIZE, ChunkHasher};

/// One chunk of an upload: how often a write to it began, how many are under way, and its
/// digest if a writer saw all of it written.
#[derive(Debug, Default, Clone, Copy)]
struct Chunk {
    epoch: u64,
    in_flight: u32,
    digest: Option<u64>,
}

/// The chunks of one upload written so far.
#[derive(Debug, Default)]
pub(crate) struct Written {
    chunks: HashMap<u64, Chunk>,
}

impl Written {
    /// The digest of chunk `i` (xxh3-64 of its bytes) if a writer recorded it.
    pub(crate) fn digest(&self, i: u64) -> Option<u64> {
        self.chunks.get(&i).and_then(|c| c.digest)
    }
}

/// The written chunks of every pending upload of one store, by upload id.
#[derive(Debug, Default)]
pub(crate) struct WrittenChunks {
    uploads: Mutex<HashMap<String, Written>>,
}

impl WrittenChunks {
    /// Take what is known of upload `id` (its writer is about to commit or rewrite it).
    pub(crate) fn take(&self, id: &str) -> Option<Written> {
        self.uploads.lock().unwrap_or_else(PoisonError::into_inner).remove(id)
    }

    /// Upload `id` has a range writer: its chunks are tracked from now on.
    pub(crate) fn open(&self, id: &str) {
        let mut uploads = self.uploads.lock().unwrap_or_else(PoisonError::into_inner);
        uploads.entry(id.to_string()).or_default();
    }

    /// Write `data` at `offset` of upload `id` with `write`, piece by piece within chunks:
    /// before each piece lands, the chunk it touches forgets its digest and `t` learns
    /// whether it may go on hashing that chunk; once a piece finishing a chunk `t` hashed
    /// from its first byte has landed, the chunk's digest is recorded if no other write
    /// touched it meanwhile or is still under way (see the top of this file).
    pub(crate) fn write<E>(
        &self,
        id: &str,
        offset: u64,
        data: &[u8],
        t: &mut Tracker,
        mut write: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut at = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let i = at / CHUNK_SIZE;
            let take = (((i + 1) * CHUNK_SIZE - at) as usize).min(rest.len());
            let (piece, more) = rest.split_at(take);
            let counted = self.before(id, i, at, t);
            let landed = write(at, piece);
            at += take as u64;
            let finished = match (&landed, t.cur.as_mut()) {
                (Ok(()), Some(cur)) => {
                    cur.hasher.update(piece);
                    cur.at = at;
                    at >= ((i + 1) * CHUNK_SIZE).min(t.size)
                }
                _ => false,
            };
            let digest = match finished {
                // One chunk fed: one digest.
                true => t.cur.take().and_then(|c| c.hasher.finish().sum(0).map(|d| (c.epoch, d))),
                false => None,
            };
            if counted {
                self.after(id, i, digest);
            }
            if let Err(e) = landed {
                t.cur = None;
                return Err(e);
            }
            rest = more;
        }
        Ok(())
    }

    /// A piece of chunk `i` from `at` is about to be written; whether it was counted in flight
    /// (the upload is tracked).
    fn before(&self, id: &str, i: u64, at: u64, t: &mut Tracker) -> bool {
        let mut uploads = self.uploads.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(w) = uploads.get_mut(id) else {
            t.cur = None;
            return false;
        };
        let c = w.chunks.entry(i).or_default();
        // Another write still landing may land after this one: nobody hashes the chunk now.
        let quiet = c.in_flight == 0;
        let ours = quiet
            && t.cur
                .as_ref()
                .is_some_and(|cur| cur.index == i && cur.at == at && cur.epoch == c.epoch);
        c.in_flight += 1;
        c.epoch += 1;
        c.digest = None;
        if ours {
            t.cur.as_mut().expect("ours").epoch = c.epoch;
        } else if quiet && at == i * CHUNK_SIZE {
            t.cur = Some(Cur { index: i, at, epoch: c.epoch, hasher: ChunkHasher::new() });
        } else {
            t.cur = None;
        }
        true
    }

    /// A piece of chunk `i` has landed (or failed); `finished`: the chunk's digest, by a
    /// writer whose last write to it left `epoch`.
    fn after(&self, id: &str, i: u64, finished: Option<(u64, u64)>) {
        let mut uploads = self.uploads.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(c) = uploads.get_mut(id).and_then(|w| w.chunks.get_mut(&i)) else { return };
        c.in_flight = c.in_flight.saturating_sub(1);
        if let Some((epoch, digest)) = finished
            && c.in_flight == 0
            && c.epoch == epoch
        {
            c.digest = Some(digest);
        }
    }

    /// Give back what was taken of upload `id` (its writer ended without writing or
    /// committing).
    pub(crate) fn put_back(&self, id: &str, w: Written) {
        let mut uploads = self.uploads.lock().unwrap_or_else(PoisonError::into_inner);
        uploads.entry(id.to_string()).or_insert(w);
    }

    /// Forget upload `id` (committed, aborted or replaced).
    pub(crate) fn forget(&self, id: &str) {
        self.take(id);
    }
}

/// What one range writer is hashing: the chunk it is writing in order, from that chunk's
/// first byte.
#[derive(Debug)]
pub(crate) struct Tracker {
    /// The upload's declared size (its last chunk may be short).
    size: u64,
    cur: Option<Cur>,
}

impl Tracker {
    /// A tracker for a writer of an upload of `size` bytes.
    pub(crate) fn new(size: u64) -> Self {
        Self { size, cur: None }
    }

    /// The writer goes back to `len` (bytes from there will be written again).
    pub(crate) fn truncate(&mut self, len: u64) {
        if self.cur.as_ref().is_some_and(|c| c.at > len) {
            self.cur = None;
        }
    }
}

struct Cur {
    index: u64,
    /// The next byte of the chunk this writer would write.
    at: u64,
    /// The chunk's epoch after this writer's last write to it.
    epoch: u64,
    hasher: ChunkHasher,
}

impl std::fmt::Debug for Cur {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cur").field("index", &self.index).field("at", &self.at).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bs_wire::ChunkDigests;
    use proptest::prelude::*;

    const C: usize = CHUNK_SIZE as usize;

    /// A file in memory and the store's written chunks of it, as upload "u".
    struct Upload {
        file: Vec<u8>,
        written: WrittenChunks,
    }

    impl Upload {
        fn new(size: usize) -> Self {
            let written = WrittenChunks::default();
            written.open("u");
            Self { file: vec![0; size], written }
        }

        fn write(&mut self, t: &mut Tracker, offset: usize, data: &[u8]) {
            let file = &mut self.file;
            self.written
                .write("u", offset as u64, data, t, |at, piece| -> Result<(), ()> {
                    file[at as usize..at as usize + piece.len()].copy_from_slice(piece);
                    Ok(())
                })
                .unwrap();
        }

        /// Chunks with a recorded digest; each must be that of the file's bytes.
        fn recorded(&self) -> Vec<u64> {
            let truth = ChunkDigests::of(&self.file);
            let uploads = self.written.uploads.lock().unwrap();
            let Some(w) = uploads.get("u") else { return vec![] };
            let mut out: Vec<u64> =
                (0..truth.count() as u64).filter(|&i| w.digest(i).is_some()).collect();
            for &i in &out {
                assert_eq!(w.digest(i), truth.sum(i as usize), "chunk {i} recorded wrong");
            }
            out.sort();
            out
        }
    }

    /// `n` bytes of a pattern that repeats every 256 bytes (byte i is i·31 + seed, mod 256).
    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        let period: Vec<u8> = (0..=255u8).map(|i| i.wrapping_mul(31).wrapping_add(seed)).collect();
        let mut out = period.repeat(n.div_ceil(256));
        out.truncate(n);
        out
    }

    #[test]
    fn chunks_written_in_order_are_recorded_the_short_last_one_too() {
        let size = 3 * C + 5;
        let mut u = Upload::new(size);
        let data = bytes(size, 1);
        let mut t = Tracker::new(size as u64);
        // Pieces that do not fall on chunk boundaries.
        for (i, piece) in data.chunks(300_007).enumerate() {
            u.write(&mut t, i * 300_007, piece);
        }
        assert_eq!(u.recorded(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_chunk_not_written_from_its_first_byte_by_one_writer_is_not_recorded() {
        let size = 2 * C;
        let mut u = Upload::new(size);
        let data = bytes(size, 2);
        // Chunk 0 from its middle (a range resumed off a chunk boundary); chunk 1 whole.
        let mut t = Tracker::new(size as u64);
        u.write(&mut t, 100, &data[100..]);
        assert_eq!(u.recorded(), vec![1]);
        // Chunk 0 in two writers' halves: neither saw all of it.
        let (mut a, mut b) = (Tracker::new(size as u64), Tracker::new(size as u64));
        u.write(&mut a, 0, &data[..C / 2]);
        u.write(&mut b, C / 2, &data[C / 2..C]);
        assert_eq!(u.recorded(), vec![1]);
    }

    #[test]
    fn a_write_by_another_writer_mid_chunk_or_after_the_record_clears_it() {
        let size = 2 * C;
        let mut u = Upload::new(size);
        let (d1, d2) = (bytes(size, 3), bytes(size, 4));
        let (mut a, mut b) = (Tracker::new(size as u64), Tracker::new(size as u64));
        // a starts chunk 0, b (a retried range racing it) writes part of it, a finishes.
        u.write(&mut a, 0, &d1[..C / 2]);
        u.write(&mut b, C / 4, &d2[C / 4..C / 2]);
        u.write(&mut a, C / 2, &d1[C / 2..C]);
        assert_eq!(u.recorded(), Vec::<u64>::new());
        // Written whole again by a, recorded; then b's stale write lands: cleared.
        let mut a = Tracker::new(size as u64);
        u.write(&mut a, 0, &d1[..C]);
        assert_eq!(u.recorded(), vec![0]);
        u.write(&mut b, 10, &d2[10..20]);
        assert_eq!(u.recorded(), Vec::<u64>::new());
    }

    #[test]
    fn a_truncated_writer_records_only_what_it_writes_again_from_a_chunk_start() {
        let size = 2 * C;
        let mut u = Upload::new(size);
        let data = bytes(size, 5);
        let mut t = Tracker::new(size as u64);
        u.write(&mut t, 0, &data[..C + 100]);
        t.truncate((C + 50) as u64);
        u.write(&mut t, C + 50, &data[C + 50..]);
        assert_eq!(u.recorded(), vec![0]);
        t.truncate(C as u64);
        u.write(&mut t, C, &data[C..]);
        assert_eq!(u.recorded(), vec![0, 1]);
    }

    #[test]
    fn a_write_still_landing_when_another_writer_finishes_the_chunk_keeps_it_unrecorded() {
        let w = WrittenChunks::default();
        w.open("u");
        let file = std::cell::RefCell::new(vec![0u8; C]);
        let (a_bytes, b_bytes) = (bytes(C, 7), bytes(C, 8));
        let (mut a, mut b) = (Tracker::new(C as u64), Tracker::new(C as u64));
        let put = |at: u64, piece: &[u8]| -> Result<(), ()> {
            file.borrow_mut()[at as usize..at as usize + piece.len()].copy_from_slice(piece);
            Ok(())
        };
        // B (a cut range's last write) has begun; before its bytes land, A (the range
        // retried) writes the whole chunk.
        w.write("u", 100, &b_bytes[100..200], &mut b, |at, piece| {
            w.write("u", 0, &a_bytes, &mut a, put).unwrap();
            put(at, piece)
        })
        .unwrap();
        assert_ne!(file.borrow()[..], a_bytes[..], "B's bytes landed after A's");
        assert_eq!(w.take("u").map(|u| u.digest(0)), Some(None), "nothing recorded");
        // A (the retry) begins while B's write is still landing, B's bytes land before A's
        // second half, A finishes last: B's bytes are in the file, nothing may be recorded.
        w.open("u");
        let (mut a, mut b) = (Tracker::new(C as u64), Tracker::new(C as u64));
        w.write("u", 100, &b_bytes[100..200], &mut b, |at, piece| {
            w.write("u", 0, &a_bytes[..C / 2], &mut a, put).unwrap();
            put(at, piece)
        })
        .unwrap();
        w.write("u", (C / 2) as u64, &a_bytes[C / 2..], &mut a, put).unwrap();
        assert_ne!(file.borrow()[..], a_bytes[..], "B's bytes landed over A's");
        assert_eq!(w.take("u").map(|u| u.digest(0)), Some(None), "nothing recorded");
        // A failed write leaves nothing in flight: written whole again, the chunk is recorded.
        w.open("u");
        let mut a = Tracker::new(C as u64);
        assert!(w.write("u", 0, &a_bytes[..10], &mut a, |_, _| Err(())).is_err());
        w.write("u", 0, &a_bytes, &mut a, put).unwrap();
        assert_eq!(w.take("u").and_then(|u| u.digest(0)), ChunkDigests::of(&a_bytes).sum(0));
    }

    #[test]
    fn a_forgotten_upload_is_not_tracked_again_by_a_straggling_writer() {
        let mut u = Upload::new(C);
        let mut t = Tracker::new(C as u64);
        u.written.forget("u");
        u.write(&mut t, 0, &bytes(C, 9));
        assert!(u.written.take("u").is_none());
    }

    #[test]
    fn a_taken_upload_starts_afresh() {
        let mut u = Upload::new(C);
        let mut t = Tracker::new(C as u64);
        u.write(&mut t, 0, &bytes(C, 6));
        assert_eq!(u.written.take("u").and_then(|w| w.digest(0)), ChunkDigests::of(&u.file).sum(0));
        assert!(u.written.take("u").is_none());
    }

    proptest! {
        /// Whatever two writers write, wherever, a recorded digest is the file's.
        #[test]
        fn a_recorded_digest_is_always_the_files(
            writes in prop::collection::vec((any::<bool>(), 0usize..3 * C, 1usize..C, any::<u8>(), any::<bool>()), 1..24)
        ) {
            let size = 3 * C;
            let mut u = Upload::new(size);
            let mut t = [Tracker::new(size as u64), Tracker::new(size as u64)];
            for (who, at, len, seed, aligned) in writes {
                // Often from a chunk start, as ranges are.
                let at = if aligned { at / C * C } else { at };
                let len = len.min(size - at);
                let w = usize::from(who);
                u.write(&mut t[w], at, &bytes(len, seed));
                u.recorded();
            }
        }
    }
}
