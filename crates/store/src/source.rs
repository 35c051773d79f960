//! The one reader of committed blobs: every byte it hands out has been checked against the
//! blob's per-chunk digests first ([`bs_wire::ChunkDigests`]), whatever the store and whoever
//! reads — the data plane, the HTTP API, image decoding, the Blob API.
//!
//! A file blob is memory-mapped (committed files are never modified: a replacement or a delete
//! unlinks the file, which leaves a mapping valid), so a verified chunk is the very page-cache
//! bytes that go out, with no copy. A chunk is verified once per open reader; the first chunk
//! that does not match stops the read with [`StoreError::Corrupt`], logs it, counts it, and has
//! the store mark the blob so later readers are refused at once.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bs_meta::BlobRecord;
use bs_wire::{ChunkDigests, Digest, DigestAlgo};
use bytes::Bytes;

use crate::error::StoreError;

type Result<T> = std::result::Result<T, StoreError>;

/// Blobs up to this size are mapped with every page present up front (one kernel pass instead
/// of a page fault per few pages).
const POPULATE_MAX: u64 = 16 << 20;

/// Corrupt chunks found by readers since the process started (for `/metrics`).
static CORRUPTION_FOUND: AtomicU64 = AtomicU64::new(0);

/// How many times a reader found a chunk that did not match its digest, since start-up.
pub fn corruption_found() -> u64 {
    CORRUPTION_FOUND.load(Ordering::Relaxed)
}

/// Log and count corruption found in `name`.
pub(crate) fn count_corruption(name: &str, reason: &str) {
    CORRUPTION_FOUND.fetch_add(1, Ordering::Relaxed);
    tracing::error!(blob = %name, %reason, "corrupt blob found on read");
}

/// What a store does when a reader finds corruption: record `reason` for the blob.
pub type CorruptionMarker = Arc<dyn Fn(&str) + Send + Sync>;

/// A committed blob opened for reading. Cheap to clone (clones share the verification
/// state); `'static`, so it can feed a response body.
#[derive(Clone)]
pub struct BlobSource {
    inner: Arc<Inner>,
}

struct Inner {
    record: BlobRecord,
    /// Every byte of the blob: a file's mapping or a memory blob's buffer.
    data: Bytes,
    file: Option<File>,
    chunks: ChunkDigests,
    /// Chunks already verified by this reader.
    checked: Box<[AtomicBool]>,
    marker: Option<CorruptionMarker>,
}

impl std::fmt::Debug for BlobSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobSource")
            .field("name", &self.inner.record.name)
            .field("size", &self.inner.record.size)
            .field("file", &self.inner.file.is_some())
            .finish()
    }
}

impl BlobSource {
    /// A blob held in memory.
    pub fn memory(
        record: BlobRecord,
        data: Bytes,
        chunks: ChunkDigests,
        marker: Option<CorruptionMarker>,
    ) -> Result<Self> {
        Self::new(record, data, None, chunks, marker)
    }

    /// A blob held in `file`, which must be exactly `record.size` bytes long.
    pub fn file(
        record: BlobRecord,
        file: File,
        chunks: ChunkDigests,
        marker: Option<CorruptionMarker>,
    ) -> Result<Self> {
        let len = file.metadata()?.len();
        if len != record.size {
            return Err(StoreError::Corrupt {
                name: record.name.clone(),
                reason: format!("file holds {len} bytes, catalogue says {}", record.size),
            });
        }
        let data = map(&file, record.size)?;
        Self::new(record, data, Some(file), chunks, marker)
    }

    fn new(
        record: BlobRecord,
        data: Bytes,
        file: Option<File>,
        chunks: ChunkDigests,
        marker: Option<CorruptionMarker>,
    ) -> Result<Self> {
        if chunks.size() != record.size || data.len() as u64 != record.size {
            return Err(StoreError::Corrupt {
                name: record.name.clone(),
                reason: format!(
                    "{} bytes held and chunk digests for {} bytes, catalogue says {}",
                    data.len(),
                    chunks.size(),
                    record.size
                ),
            });
        }
        let checked = (0..chunks.count()).map(|_| AtomicBool::new(false)).collect();
        Ok(Self { inner: Arc::new(Inner { record, data, file, chunks, checked, marker }) })
    }

    pub fn record(&self) -> &BlobRecord {
        &self.inner.record
    }

    pub fn size(&self) -> u64 {
        self.inner.record.size
    }

    /// The file behind the blob, for zero-copy sends of ranges already [`verify`]'d.
    ///
    /// [`verify`]: BlobSource::verify
    pub fn file_handle(&self) -> Option<&File> {
        self.inner.file.as_ref()
    }

    /// The blob's chunk digests (their boundaries are where verified pieces break).
    pub fn chunks(&self) -> &ChunkDigests {
        &self.inner.chunks
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        let size = self.size();
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(StoreError::OutOfRange {
                name: self.inner.record.name.clone(),
                offset,
                len,
                size,
            });
        }
        Ok(())
    }

    /// Check every chunk holding a byte of `offset..offset + len` (each at most once per
    /// reader). The first bad chunk is reported, counted and marked in the store.
    pub fn verify(&self, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)?;
        let i = &self.inner;
        for c in i.chunks.covering(offset, len) {
            if i.checked[c].load(Ordering::Acquire) {
                continue;
            }
            let r = i.chunks.range(c);
            if !i.chunks.check(c, &i.data[r.start as usize..r.end as usize]) {
                let reason = format!(
                    "bytes {}..{} (chunk {c}) do not match their stored digest",
                    r.start, r.end
                );
                count_corruption(&i.record.name, &reason);
                if let Some(m) = &i.marker {
                    m(&reason);
                }
                return Err(StoreError::Corrupt { name: i.record.name.clone(), reason });
            }
            i.checked[c].store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Check every chunk of the blob.
    pub fn verify_all(&self) -> Result<()> {
        self.verify(0, self.size())
    }

    /// Verified bytes of a range, without copying.
    pub fn bytes(&self, offset: u64, len: u64) -> Result<Bytes> {
        self.verify(offset, len)?;
        Ok(self.inner.data.slice(offset as usize..(offset + len) as usize))
    }

    /// Every byte of the blob, verified, without copying.
    pub fn all(&self) -> Result<Bytes> {
        self.bytes(0, self.size())
    }

    /// A range as a sequence of pieces that break at chunk boundaries, each verified only
    /// when it is taken: a stream stops at the first bad chunk, after sending every good one
    /// before it.
    pub fn pieces(&self, offset: u64, len: u64) -> Result<Pieces> {
        self.check_range(offset, len)?;
        Ok(Pieces { src: self.clone(), next: offset, end: offset + len })
    }

    /// Copy verified bytes at `offset` into `buf`; returns how many (0 at the end).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let offset = offset.min(self.size());
        let n = (buf.len() as u64).min(self.size() - offset);
        let b = self.bytes(offset, n)?;
        buf[..n as usize].copy_from_slice(&b);
        Ok(n as usize)
    }

    /// Digest of a verified byte range.
    pub fn digest_range(&self, offset: u64, len: u64, algo: DigestAlgo) -> Result<Digest> {
        Ok(algo.digest(&self.bytes(offset, len)?))
    }
}

/// Verified pieces of a range; see [`BlobSource::pieces`].
pub struct Pieces {
    src: BlobSource,
    next: u64,
    end: u64,
}

impl Iterator for Pieces {
    type Item = Result<Bytes>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.end {
            return None;
        }
        let chunk = self.src.inner.chunks.chunk_size();
        let stop = ((self.next / chunk + 1) * chunk).min(self.end);
        let piece = self.src.bytes(self.next, stop - self.next);
        // After an error the stream is over.
        self.next = if piece.is_ok() { stop } else { self.end };
        Some(piece)
    }
}

/// Map `size` bytes of `file` read-only as shared bytes.
fn map(file: &File, size: u64) -> Result<Bytes> {
    if size == 0 {
        return Ok(Bytes::new());
    }
    let mut opts = memmap2::MmapOptions::new();
    if size <= POPULATE_MAX {
        opts.populate();
    }
    // SAFETY: committed blob files are never written or truncated in place (see the module
    // comment); the length was checked against the catalogue just before.
    let m = unsafe { opts.len(size as usize).map(file) }?;
    let _ = m.advise(memmap2::Advice::Sequential);
    Ok(Bytes::from_owner(m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bs_wire::CHUNK_SIZE;
    use std::sync::Mutex;

    fn record(size: u64) -> BlobRecord {
        BlobRecord {
            name: "x".into(),
            size,
            content_type: String::new(),
            digest: String::new(),
            created_ms: 0,
            metadata: Default::default(),
        }
    }

    fn data() -> Vec<u8> {
        (0..(3 * CHUNK_SIZE as usize + 10)).map(|i| (i % 253) as u8).collect()
    }

    #[test]
    fn a_bad_chunk_stops_the_stream_after_the_good_ones_and_is_marked() {
        let good = data();
        let chunks = ChunkDigests::of(&good);
        let mut bad = good.clone();
        bad[2 * CHUNK_SIZE as usize + 3] ^= 0x40;
        let marks = Arc::new(Mutex::new(Vec::new()));
        let m = marks.clone();
        let marker: CorruptionMarker =
            Arc::new(move |r: &str| m.lock().unwrap().push(r.to_string()));
        let before = corruption_found();
        let src =
            BlobSource::memory(record(bad.len() as u64), bad.into(), chunks, Some(marker)).unwrap();
        let pieces: Vec<_> = src.pieces(10, src.size() - 10).unwrap().collect();
        assert_eq!(pieces.len(), 3, "two good pieces, then the error, then nothing");
        assert_eq!(pieces[0].as_ref().unwrap().len() as u64, CHUNK_SIZE - 10);
        assert_eq!(
            &pieces[1].as_ref().unwrap()[..],
            &good[CHUNK_SIZE as usize..2 * CHUNK_SIZE as usize]
        );
        assert!(matches!(pieces[2], Err(StoreError::Corrupt { .. })));
        assert!(src.bytes(0, CHUNK_SIZE).is_ok(), "other chunks still read");
        assert!(matches!(
            src.read_at(&mut [0; 8], 2 * CHUNK_SIZE),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(src.digest_range(0, src.size(), DigestAlgo::Blake3).is_err());
        assert!(src.verify_all().is_err());
        assert!(corruption_found() > before);
        assert!(marks.lock().unwrap()[0].contains("chunk 2"), "{:?}", marks.lock().unwrap());
    }

    #[test]
    fn files_are_checked_against_the_catalogue_size_and_read_verified() {
        use std::io::Write;
        let good = data();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&good).unwrap();
        let chunks = ChunkDigests::of(&good);
        let short = BlobSource::file(record(5), f.try_clone().unwrap(), chunks.clone(), None);
        assert!(matches!(short, Err(StoreError::Corrupt { .. })));
        let src = BlobSource::file(record(good.len() as u64), f, chunks, None).unwrap();
        assert!(src.file_handle().is_some());
        assert_eq!(&src.all().unwrap()[..], &good[..]);
        let mut buf = [0u8; 16];
        assert_eq!(src.read_at(&mut buf, src.size() - 4).unwrap(), 4);
        assert!(matches!(src.bytes(1, src.size()), Err(StoreError::OutOfRange { .. })));
    }
}
