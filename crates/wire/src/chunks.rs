//! Per-chunk digests: every stored blob keeps one small digest per [`CHUNK_SIZE`] bytes, so any
//! byte range can be verified on its own, without reading the rest of the blob. Readers check
//! each chunk before they hand its bytes on; a stream stops at the first bad chunk.
//!
//! The digest of a chunk is xxh3-64 of its bytes (the last chunk may be short). xxh3 runs at
//! tens of GB/s per core, so verifying a chunk costs far less than moving it; it guards against
//! bit rot, torn writes and misdirected I/O, not against an adversary who can write the data
//! directory (that one can rewrite the digests too).
//!
//! Stored form (catalogue column, big-endian):
//!
//! ```text
//! +----------------+-----------------+-----------------+-----+
//! | chunk size u32 | digest 0 (u64)  | digest 1 (u64)  | ... |
//! +----------------+-----------------+-----------------+-----+
//! ```
//!
//! A blob of `n` bytes has `ceil(n / chunk size)` digests (none for an empty blob).

use crate::digest::{Digest, DigestAlgo};
use crate::error::WireError;
use crate::xxh3::Xxh3;

/// Bytes covered by one chunk digest.
pub const CHUNK_SIZE: u64 = 1 << 20;

/// Up to this many bytes XXH3 hashes by other paths for 64 and 128 bits, so a chunk digest
/// cannot be taken from a whole digest (see [`ChunkDigests::from_whole`]).
pub const FROM_WHOLE_ABOVE: u64 = crate::xxh3::SHORT as u64;

/// The chunk digests of one blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkDigests {
    chunk: u64,
    size: u64,
    sums: Vec<u64>,
}

impl ChunkDigests {
    /// Digests of `data`, in chunks of [`CHUNK_SIZE`].
    pub fn of(data: &[u8]) -> Self {
        let mut h = ChunkHasher::new();
        h.update(data);
        h.finish()
    }

    /// The digests of a blob of `size` bytes, one per [`CHUNK_SIZE`] in order (digests of
    /// its parts, each a whole number of chunks, put together).
    pub fn from_sums(size: u64, sums: Vec<u64>) -> Result<Self, WireError> {
        if sums.len() as u64 != size.div_ceil(CHUNK_SIZE) {
            return Err(WireError::BadChunkDigests(format!(
                "{} digests for {size} bytes in chunks of {CHUNK_SIZE}",
                sums.len()
            )));
        }
        Ok(Self { chunk: CHUNK_SIZE, size, sums })
    }

    /// The digests of a blob of `size` bytes that is one chunk, taken from `whole`, its
    /// xxh3-128 digest, with no pass over the bytes: `None` for another algorithm, for a blob
    /// of more than one chunk, or of [`FROM_WHOLE_ABOVE`] bytes or fewer.
    ///
    /// XXH3 hashes an input of more than 240 bytes into one accumulator and finishes it into
    /// 64 bits, the 64-bit digest; its 128-bit digest is those same 64 bits as its low half,
    /// and a second finish of the same accumulator as its high half (the XXH3 specification's
    /// long-input path, `XXH3_hashLong_64b` and `XXH3_hashLong_128b`). So a writer that has
    /// the whole digest of a one-chunk blob already has its chunk digest.
    pub fn from_whole(size: u64, whole: &Digest) -> Option<Self> {
        if !Self::from_whole_covers(size, whole.algo) {
            return None;
        }
        let low: [u8; 8] = whole.bytes.get(8..16)?.try_into().ok()?;
        Some(Self { chunk: CHUNK_SIZE, size, sums: vec![u64::from_be_bytes(low)] })
    }

    /// Whether [`ChunkDigests::from_whole`] gives the digests of a blob of `size` bytes from
    /// its whole digest in `algo`.
    pub fn from_whole_covers(size: u64, algo: DigestAlgo) -> bool {
        algo == DigestAlgo::Xxh3_128 && size > FROM_WHOLE_ABOVE && size <= CHUNK_SIZE
    }

    /// Every chunk's digest, in order.
    pub fn sums(&self) -> &[u64] {
        &self.sums
    }

    /// Bytes per chunk.
    pub fn chunk_size(&self) -> u64 {
        self.chunk
    }

    /// Size of the blob these digests cover.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Number of chunks.
    pub fn count(&self) -> usize {
        self.sums.len()
    }

    /// Byte range of chunk `i` (empty past the last chunk).
    pub fn range(&self, i: usize) -> std::ops::Range<u64> {
        let start = (i as u64).saturating_mul(self.chunk).min(self.size);
        start..start.saturating_add(self.chunk).min(self.size)
    }

    /// Indexes of the chunks that hold any byte of `offset..offset + len`.
    pub fn covering(&self, offset: u64, len: u64) -> std::ops::Range<usize> {
        if len == 0 || offset >= self.size {
            return 0..0;
        }
        let end = offset.saturating_add(len).min(self.size);
        (offset / self.chunk) as usize..end.div_ceil(self.chunk) as usize
    }

    /// The digest of chunk `i` (xxh3-64 of its bytes).
    pub fn sum(&self, i: usize) -> Option<u64> {
        self.sums.get(i).copied()
    }

    /// Whether `data` is exactly chunk `i`.
    pub fn check(&self, i: usize, data: &[u8]) -> bool {
        let Some(sum) = self.sums.get(i) else { return false };
        let r = self.range(i);
        data.len() as u64 == r.end - r.start && *sum == Xxh3::oneshot_64(data)
    }

    /// The stored form.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + 8 * self.sums.len());
        v.extend_from_slice(&(self.chunk as u32).to_be_bytes());
        for s in &self.sums {
            v.extend_from_slice(&s.to_be_bytes());
        }
        v
    }

    /// Parse the stored form of the digests of a blob of `size` bytes.
    pub fn decode(buf: &[u8], size: u64) -> Result<Self, WireError> {
        let bad = |why: String| WireError::BadChunkDigests(why);
        if buf.len() < 4 || !(buf.len() - 4).is_multiple_of(8) {
            return Err(bad(format!("{} bytes is not a chunk size and whole digests", buf.len())));
        }
        let chunk = u32::from_be_bytes(buf[..4].try_into().expect("4 bytes")) as u64;
        if chunk == 0 {
            return Err(bad("chunk size 0".into()));
        }
        let sums: Vec<u64> = buf[4..]
            .chunks_exact(8)
            .map(|c| u64::from_be_bytes(c.try_into().expect("8 bytes")))
            .collect();
        if sums.len() as u64 != size.div_ceil(chunk) {
            return Err(bad(format!(
                "{} digests for {size} bytes in chunks of {chunk}",
                sums.len()
            )));
        }
        Ok(Self { chunk, size, sums })
    }
}

/// Builds [`ChunkDigests`] from bytes fed in order, in pieces of any size.
#[derive(Clone)]
pub struct ChunkHasher {
    chunk: u64,
    cur: Xxh3,
    in_chunk: u64,
    size: u64,
    sums: Vec<u64>,
}

impl std::fmt::Debug for ChunkHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkHasher").field("size", &self.size).finish()
    }
}

impl Default for ChunkHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkHasher {
    pub fn new() -> Self {
        Self { chunk: CHUNK_SIZE, cur: Xxh3::new(), in_chunk: 0, size: 0, sums: Vec::new() }
    }

    /// Bytes fed so far.
    pub fn len(&self) -> u64 {
        self.size
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// Feed the next bytes.
    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let take = ((self.chunk - self.in_chunk) as usize).min(data.len());
            self.cur.write(&data[..take]);
            self.in_chunk += take as u64;
            self.size += take as u64;
            data = &data[take..];
            if self.in_chunk == self.chunk {
                self.sums.push(self.cur.finish_64());
                self.cur = Xxh3::new();
                self.in_chunk = 0;
            }
        }
    }

    /// The digests of everything fed.
    pub fn finish(mut self) -> ChunkDigests {
        if self.in_chunk > 0 {
            self.sums.push(self.cur.finish_64());
        }
        ChunkDigests { chunk: self.chunk, size: self.size, sums: self.sums }
    }
}

/// Checks the chunks of a blob against their digests as their bytes are fed in order, in
/// pieces of any size, from the start of one chunk: for a reader that hands bytes on as they
/// arrive and must know, by the time a chunk's last byte is in, whether the chunk was whole.
#[derive(Clone)]
pub struct ChunkChecker {
    /// The chunk being fed.
    chunk: usize,
    cur: Xxh3,
    in_chunk: u64,
}

impl std::fmt::Debug for ChunkChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkChecker").field("chunk", &self.chunk).finish()
    }
}

impl ChunkChecker {
    /// Start at the first byte of chunk `chunk`.
    pub fn new(chunk: usize) -> Self {
        Self { chunk, cur: Xxh3::new(), in_chunk: 0 }
    }

    /// Feed the next bytes of `digests`' blob. `Err(i)` when chunk `i` is complete and does
    /// not match its digest (or the bytes run past the blob's end); the checker is of no
    /// further use then.
    pub fn update(&mut self, digests: &ChunkDigests, mut data: &[u8]) -> Result<(), usize> {
        while !data.is_empty() {
            let r = digests.range(self.chunk);
            let left = (r.end - r.start) - self.in_chunk;
            if left == 0 {
                return Err(self.chunk); // past the last chunk
            }
            let take = (left as usize).min(data.len());
            self.cur.write(&data[..take]);
            self.in_chunk += take as u64;
            data = &data[take..];
            if self.in_chunk == r.end - r.start {
                if digests.sum(self.chunk) != Some(self.cur.finish_64()) {
                    return Err(self.chunk);
                }
                self.chunk += 1;
                self.cur = Xxh3::new();
                self.in_chunk = 0;
            }
        }
        Ok(())
    }

    /// Whether every chunk fed so far was complete and checked (none is part-way).
    pub fn at_boundary(&self) -> bool {
        self.in_chunk == 0
    }

    /// The chunk being fed (the next one, at a boundary).
    pub fn chunk(&self) -> usize {
        self.chunk
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    /// Chunk digests are stored: XXH3-64 of the reference implementation, fed whole or in
    /// pieces.
    #[test]
    fn chunk_digests_are_the_reference_values() {
        let d = data(CHUNK_SIZE as usize + 5);
        let want = [0x09fe1c343d88bef7u64, 0x33a2f6ebde078b75];
        assert_eq!(ChunkDigests::of(&d).sums, want);
        let mut h = ChunkHasher::new();
        for piece in d.chunks(100_003) {
            h.update(piece);
        }
        assert_eq!(h.finish().sums, want);
    }

    /// A one-chunk blob's chunk digest is the low half of its xxh3-128 digest, at every
    /// length where `from_whole` gives one; at the others it gives none.
    #[test]
    fn a_one_chunk_blob_takes_its_chunk_digest_from_its_whole_digest() {
        let c = CHUNK_SIZE;
        let d = data(c as usize + 1);
        for n in [241, 242, 255, 256, 1023, 1024, 1025, 65_536, 250_000, c - 1, c] {
            let bytes = &d[..n as usize];
            let whole = DigestAlgo::Xxh3_128.digest(bytes);
            let got = ChunkDigests::from_whole(n, &whole).unwrap();
            assert_eq!(got, ChunkDigests::of(bytes), "{n} bytes");
            assert!(got.check(0, bytes));
        }
        for n in [0, 1, 16, 128, 129, 240, c + 1] {
            let whole = DigestAlgo::Xxh3_128.digest(&d[..n as usize]);
            assert_eq!(ChunkDigests::from_whole(n, &whole), None, "{n} bytes");
        }
        let blake = DigestAlgo::Blake3.digest(&d[..1000]);
        assert_eq!(ChunkDigests::from_whole(1000, &blake), None);
    }

    proptest! {
        #[test]
        fn from_whole_is_the_chunk_digest(
            n in (FROM_WHOLE_ABOVE + 1)..=CHUNK_SIZE,
            seed in any::<u64>(),
        ) {
            let bytes = crate::xxh3::test_bytes(n as usize, seed);
            let whole = DigestAlgo::Xxh3_128.digest(&bytes);
            prop_assert_eq!(ChunkDigests::from_whole(n, &whole), Some(ChunkDigests::of(&bytes)));
        }
    }

    #[test]
    fn chunks_cover_the_blob_and_check_each_piece() {
        let d = data(2 * CHUNK_SIZE as usize + 5);
        let c = ChunkDigests::of(&d);
        assert_eq!(c.count(), 3);
        assert_eq!(c.range(2), 2 * CHUNK_SIZE..2 * CHUNK_SIZE + 5);
        for i in 0..3 {
            let r = c.range(i);
            assert!(c.check(i, &d[r.start as usize..r.end as usize]));
        }
        let mut bad = d[..CHUNK_SIZE as usize].to_vec();
        bad[77] ^= 1;
        assert!(!c.check(0, &bad));
        assert!(!c.check(2, &d[..4]), "a short piece is not the chunk");
        assert!(!c.check(3, &[]), "no such chunk");
        assert_eq!(c.covering(0, 0), 0..0);
        assert_eq!(c.covering(CHUNK_SIZE - 1, 2), 0..2);
        assert_eq!(c.covering(CHUNK_SIZE, CHUNK_SIZE), 1..2);
        assert_eq!(c.covering(5, u64::MAX), 0..3);
        assert_eq!(ChunkDigests::of(&[]).count(), 0);
    }

    #[test]
    fn stored_form_round_trips_and_rejects_mismatches() {
        let d = data(CHUNK_SIZE as usize + 1);
        let c = ChunkDigests::of(&d);
        let enc = c.encode();
        assert_eq!(ChunkDigests::decode(&enc, d.len() as u64).unwrap(), c);
        assert!(ChunkDigests::decode(&enc, 3 * CHUNK_SIZE).is_err(), "wrong count");
        assert!(ChunkDigests::decode(&enc[..enc.len() - 1], d.len() as u64).is_err());
        assert!(ChunkDigests::decode(&[0, 0, 0, 0], 0).is_err(), "chunk size 0");
        assert_eq!(ChunkDigests::decode(&ChunkDigests::of(&[]).encode(), 0).unwrap().count(), 0);
    }

    #[test]
    fn a_checker_fed_in_pieces_passes_whole_chunks_and_stops_at_a_bad_one() {
        let d = data(2 * CHUNK_SIZE as usize + 5);
        let c = ChunkDigests::of(&d);
        let mut k = ChunkChecker::new(0);
        for piece in d.chunks(77_777) {
            assert_eq!(k.update(&c, piece), Ok(()));
        }
        assert!(k.at_boundary());
        assert_eq!(k.chunk(), 3);
        assert_eq!(k.update(&c, &[0]), Err(3), "past the end");
        // From chunk 1; a flipped byte in it is found when its last byte arrives.
        let mut bad = d.clone();
        bad[CHUNK_SIZE as usize + 9] ^= 1;
        let mut k = ChunkChecker::new(1);
        let rest = &bad[CHUNK_SIZE as usize..];
        assert_eq!(k.update(&c, &rest[..CHUNK_SIZE as usize - 1]), Ok(()));
        assert!(!k.at_boundary());
        assert_eq!(k.update(&c, &rest[CHUNK_SIZE as usize - 1..]), Err(1));
    }

    proptest! {
        #[test]
        fn any_split_gives_the_same_digests(n in 0usize..3_000_000, cuts in proptest::collection::vec(0usize..3_000_000, 0..6)) {
            let d = data(n);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (n + 1)).collect();
            cuts.sort();
            let mut h = ChunkHasher::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([n]) {
                h.update(&d[at..c]);
                at = c;
            }
            prop_assert_eq!(h.finish(), ChunkDigests::of(&d));
        }
    }
}
