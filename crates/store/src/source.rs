//! The one reader of committed blobs: every byte it hands out has been checked against the
//! blob's per-chunk digests first ([`bs_wire::ChunkDigests`]), whatever the store and whoever
//! reads — the data plane, the HTTP API, image decoding, the Blob API, the scrubber.
//!
//! What is checked is what is handed out. A large file blob (from [`MAP_FROM`]), or one a
//! store keeps open for its next readers (see `crate::mapped`), is memory-mapped; before a
//! chunk is touched its pages are brought in with `MADV_POPULATE_READ`, which reports a disk
//! read error as an error (where touching an unreadable mapped page would kill the process
//! with `SIGBUS`) — unless `mincore` finds them all in memory already, when populating would
//! only walk the page tables again (a tenth of the work of a hot 1 MiB HTTP GET); the chunk is
//! then checked in the mapping and the caller gets those very pages — sent to a socket or
//! decoded with no copy. (Left open: a page reclaimed between the check and its use — the
//! send, or for bytes held longer, such as an image being decoded, the decode — and then read
//! again from disk, or, for the data plane's readers that send part of a chunk before its
//! check (below), reclaimed between that send and the check; a page found in memory, then
//! reclaimed in the microseconds before the check reads it and failing as it is read back,
//! which raises `SIGBUS`; and a blob file truncated in place by hand — restore files by
//! writing a new one and renaming it over.)
//! Smaller file blobs, and every file where the kernel lacks `MADV_POPULATE_READ` (before
//! Linux 5.14) or that cannot be mapped, are read with `pread` and checked in memory: chunk by
//! chunk (into pooled buffers, a chunk smaller than half of one into a buffer of its own
//! size), or a range of several chunks into one buffer of its own. A memory blob is immutable
//! shared bytes: checked once per reader, then sliced without copying.
//!
//! The first chunk that does not match stops the read with [`StoreError::Corrupt`]; it is
//! logged, counted, and the store marks the blob so later readers are refused at once.
//!
//! One reader may be handed bytes before their chunk is checked: the data plane, pulling for a
//! client that uses nothing before the final SUM (it asked so with `whole_before_use`; see
//! [`BlobSource::arriving`], `source/arriving.rs`) — a small range of a remote blob as it
//! arrives; a local blob's chunk in two pieces, the first before the chunk's check, the rest
//! after it. The SUM follows only after every chunk checked, and a bad chunk ends the stream
//! with an error.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bs_meta::BlobRecord;
use bs_wire::{BufferPool, CHUNK_SIZE, ChunkDigests, Digest, DigestAlgo};
use bytes::Bytes;

use crate::error::StoreError;

mod arriving;
pub use arriving::Arriving;

type Result<T> = std::result::Result<T, StoreError>;

/// Buffers chunks of files are read into: reused, so a read costs one copy from the page cache
/// and no allocation or page faults. A buffer returns here when the last `Bytes` cut from it
/// is dropped (after the connection wrote it, say).
static CHUNK_BUFFERS: std::sync::LazyLock<BufferPool> =
    std::sync::LazyLock::new(|| BufferPool::new(CHUNK_SIZE as usize, 64));

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
    /// Shared by the readers of one file kept open (see `crate::mapped`), each with its own
    /// record.
    data: Arc<Data>,
    chunks: ChunkDigests,
    /// Memory blobs: chunks already verified by this reader.
    checked: Box<[AtomicBool]>,
    marker: Option<CorruptionMarker>,
}

/// Where the bytes are.
enum Data {
    Memory(Bytes),
    /// Elsewhere (an object store), fetched in windows of whole chunks, each window checked
    /// chunk by chunk before any of it is handed out (but see [`BlobSource::arriving`], for
    /// the data plane's readers who use nothing before the end); the last window is kept for the reads
    /// that follow it, and the next one asked for ahead of time. A long sequential read
    /// ([`BlobSource::pieces`]) streams its windows instead, several at once, each chunk
    /// checked and handed out as it arrives (see [`RangeRead::streaming_at`]).
    Remote {
        reader: Arc<dyn RangeRead>,
        window: std::sync::Mutex<Option<(u64, Bytes)>>,
    },
    /// The file, and all of it mapped when it is large enough to be worth mapping (see
    /// [`MAP_FROM`]) or kept open for later readers; otherwise its chunks are read with
    /// `pread` (see `BlobSource::chunk`).
    File {
        file: File,
        map: Option<Bytes>,
    },
}

/// Bytes of a blob kept elsewhere, by range (blocking; called off the async executor).
pub trait RangeRead: Send + Sync {
    /// Exactly `len` bytes from `offset`. A blob whose bytes are gone is
    /// [`StoreError::Corrupt`]; a store out of reach some other error.
    fn read(&self, offset: u64, len: u64) -> Result<Bytes>;
    /// A hint that `offset..offset + len` will be read next (may start fetching it).
    fn prefetch(&self, _offset: u64, _len: u64) {}
    /// A hint that bytes `from..to` (whole chunks) will be read next, in order (may start
    /// fetching several windows ahead, none past `to`).
    fn sequential(&self, _from: u64, _to: u64) {}
    /// Whether bytes from `offset` are already streaming in, so a read there should ask for
    /// no more than it needs (each chunk is handed on as it comes) rather than a window.
    fn streaming_at(&self, _offset: u64) -> bool {
        false
    }
    /// Bytes `from..to` (whole chunks) in one request, handed on in pieces as they arrive
    /// (see [`BlobSource::arriving`]), when this reader can; each item an error or the next
    /// bytes, the iterator ending where the store's answer does.
    fn arriving(
        &self,
        _from: u64,
        _to: u64,
    ) -> Option<Box<dyn Iterator<Item = Result<Bytes>> + Send>> {
        None
    }
}

/// How much a remote read fetches at once, at least (a multiple of the chunk size).
pub const REMOTE_WINDOW: u64 = 8 * CHUNK_SIZE;

/// Blob files up to this size are read into memory whole rather than mapped.
pub const READ_WHOLE_UP_TO: u64 = 64 * 1024;

/// Blob files from this size on are mapped; smaller ones are read chunk by chunk with `pread`
/// into memory. Mapping saves the copy from the page cache, but setting up and tearing
/// down a mapping (faulting its pages in, then unmapping, which interrupts every core to flush
/// its TLB) costs more than that copy until blobs are several chunks long.
pub const MAP_FROM: u64 = 4 * CHUNK_SIZE;

/// Whether `MADV_POPULATE_READ` works here (cleared on the first EINVAL: an old kernel).
static POPULATE_WORKS: AtomicBool = AtomicBool::new(true);

/// Fault in `data` (part of a file mapping, or any readable memory) so reading it cannot
/// raise `SIGBUS`: a page the file no longer has (truncated by another program) or cannot
/// read from disk is an error here instead (`EFAULT`, `EIO`). `Ok(false)`: the kernel cannot
/// do this (before Linux 5.14); read the file with `pread` instead. Reading is safe from
/// `SIGBUS` from then on unless the file shrinks, or a page is reclaimed and fails as it is
/// read back, in between.
pub fn populate(data: &[u8]) -> std::io::Result<bool> {
    if data.is_empty() || !POPULATE_WORKS.load(Ordering::Relaxed) {
        return Ok(!data.is_empty());
    }
    // madvise takes page-aligned addresses: from the start of `data`'s first page.
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
    let start = data.as_ptr() as usize;
    let from = start / page * page;
    // SAFETY: [from, start + len) lies in pages that hold `data`, part of a live mapping;
    // madvise only faults the pages in.
    let rc = unsafe {
        libc::madvise(
            from as *mut libc::c_void,
            start - from + data.len(),
            libc::MADV_POPULATE_READ,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINVAL) {
        POPULATE_WORKS.store(false, Ordering::Relaxed);
        return Ok(false);
    }
    Err(e)
}

/// Whether every page of `data`, a page-aligned part of a file mapping, is in the page cache
/// (or mapped in this process) now.
fn pages_resident(data: &[u8]) -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
    // Asked a window at a time into a buffer on the stack (one 1 MiB chunk of 4 KiB pages
    // is one window): no allocation on a read's path.
    let mut pages = [0u8; 256];
    data.chunks(pages.len() * page).all(|window| {
        let n = window.len().div_ceil(page);
        // SAFETY: `window` lies inside a live mapping and starts on a page boundary (chunks
        // start at multiples of 1 MiB from the mapping's start, windows at multiples of a
        // page from there); `pages` holds one byte for each of its `n` pages.
        let rc = unsafe {
            libc::mincore(window.as_ptr() as *mut libc::c_void, window.len(), pages.as_mut_ptr())
        };
        rc == 0 && pages[..n].iter().all(|p| p & 1 == 1)
    })
}

/// Map all `len` bytes of `file` read-only; `once`: for one reader going through in order
/// (else kept for many readers, whose use of the pages should keep them cached).
fn map(file: &File, len: u64, once: bool) -> Result<Bytes> {
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: committed blob files are never written in place (see the module comment); pages
    // are only read after `populate` brought them in.
    let m = unsafe { memmap2::MmapOptions::new().len(len as usize).map(file) }?;
    if once {
        let _ = m.advise(memmap2::Advice::Sequential);
    }
    Ok(Bytes::from_owner(m))
}

impl std::fmt::Debug for BlobSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobSource")
            .field("name", &self.inner.record.name)
            .field("size", &self.inner.record.size)
            .field("file", &self.is_file())
            .finish()
    }
}

/// A read of blob `name`'s file that failed (not for being short: that is corruption),
/// naming the blob: "Input/output error" alone does not tell the operator which one.
fn read_failed(name: &str, e: std::io::Error) -> StoreError {
    StoreError::from(std::io::Error::new(e.kind(), format!("reading blob {name:?}: {e}")))
}

impl BlobSource {
    /// A blob held in memory.
    pub fn memory(
        record: BlobRecord,
        data: Bytes,
        chunks: ChunkDigests,
        marker: Option<CorruptionMarker>,
    ) -> Result<Self> {
        if data.len() as u64 != record.size {
            return Err(StoreError::Corrupt {
                name: record.name.clone(),
                reason: format!("{} bytes held, catalogue says {}", data.len(), record.size),
            });
        }
        Self::new(record, Data::Memory(data), chunks, marker)
    }

    /// A blob kept elsewhere, read through `reader`.
    pub fn remote(
        record: BlobRecord,
        reader: Arc<dyn RangeRead>,
        chunks: ChunkDigests,
        marker: Option<CorruptionMarker>,
    ) -> Result<Self> {
        let data = Data::Remote { reader, window: std::sync::Mutex::new(None) };
        Self::new(record, data, chunks, marker)
    }

    /// A blob held in `file`, which must be exactly `record.size` bytes long.
    pub fn file(
        record: BlobRecord,
        file: File,
        chunks: ChunkDigests,
        marker: Option<CorruptionMarker>,
    ) -> Result<Self> {
        Self::file_with(record, file, chunks, marker, false)
    }

    /// [`BlobSource::file`]; with `keep`, mapped whatever its size when it is larger than
    /// [`READ_WHOLE_UP_TO`]: for a source kept for the readers after this one, who then
    /// pay nothing to set the mapping up.
    pub(crate) fn file_with(
        record: BlobRecord,
        file: File,
        chunks: ChunkDigests,
        marker: Option<CorruptionMarker>,
        keep: bool,
    ) -> Result<Self> {
        let len = file.metadata()?.len();
        if len != record.size {
            let reason = format!("file holds {len} bytes, catalogue says {}", record.size);
            count_corruption(&record.name, &reason);
            if let Some(m) = &marker {
                m(&reason);
            }
            return Err(StoreError::Corrupt { name: record.name.clone(), reason });
        }
        if record.size <= READ_WHOLE_UP_TO {
            // Copying a small blob costs less than mapping it: unmapping interrupts every
            // core to flush its TLB, which at thousands of small reads a second dominates.
            // Its chunks are checked in memory as they are read, as any memory blob's.
            let mut buf = vec![0u8; record.size as usize];
            if let Err(e) = file.read_exact_at(&mut buf, 0) {
                if e.kind() != std::io::ErrorKind::UnexpectedEof {
                    return Err(read_failed(&record.name, e));
                }
                let reason = "file is shorter than the catalogue says".to_string();
                count_corruption(&record.name, &reason);
                if let Some(m) = &marker {
                    m(&reason);
                }
                return Err(StoreError::Corrupt { name: record.name.clone(), reason });
            }
            return Self::new(record, Data::Memory(buf.into()), chunks, marker);
        }
        let mapped = keep || record.size >= MAP_FROM;
        let map = match mapped.then(|| map(&file, record.size, !keep)) {
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                // Out of memory or of mappings: read it with `pread` as a small file is.
                tracing::warn!(blob = %record.name, error = %e, "cannot map the blob file; reading it instead");
                None
            }
            None => None,
        };
        Self::new(record, Data::File { file, map }, chunks, marker)
    }

    fn new(
        record: BlobRecord,
        data: Data,
        chunks: ChunkDigests,
        marker: Option<CorruptionMarker>,
    ) -> Result<Self> {
        if chunks.size() != record.size {
            return Err(StoreError::Corrupt {
                name: record.name.clone(),
                reason: format!(
                    "chunk digests cover {} bytes, catalogue says {}",
                    chunks.size(),
                    record.size
                ),
            });
        }
        let checked = (0..chunks.count()).map(|_| AtomicBool::new(false)).collect();
        let data = Arc::new(data);
        Ok(Self { inner: Arc::new(Inner { record, data, chunks, checked, marker }) })
    }

    pub fn record(&self) -> &BlobRecord {
        &self.inner.record
    }

    /// The same bytes described by `record` (a cached copy speaking for the original: same
    /// name, size and digest, the original's times and metadata). Refused unless size and
    /// digest agree.
    pub fn with_record(self, record: BlobRecord) -> Result<Self> {
        let i = &self.inner;
        if record.size != i.record.size || record.digest != i.record.digest {
            return Err(StoreError::Corrupt {
                name: record.name.clone(),
                reason: format!(
                    "cached copy is {} bytes {}, the blob {} bytes {}",
                    i.record.size, i.record.digest, record.size, record.digest
                ),
            });
        }
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                inner.record = record;
                Ok(Self { inner: Arc::new(inner) })
            }
            // Shared with other readers: the same bytes under this record.
            Err(shared) => {
                let checked = (0..shared.chunks.count()).map(|_| AtomicBool::new(false)).collect();
                let inner = Inner {
                    record,
                    data: shared.data.clone(),
                    chunks: shared.chunks.clone(),
                    checked,
                    marker: shared.marker.clone(),
                };
                Ok(Self { inner: Arc::new(inner) })
            }
        }
    }

    /// The per-chunk digests every byte is checked against.
    pub fn chunk_digests(&self) -> &ChunkDigests {
        &self.inner.chunks
    }

    pub fn size(&self) -> u64 {
        self.inner.record.size
    }

    /// Whether the bytes are read from a file (rather than memory: a small file is read
    /// whole, see [`READ_WHOLE_UP_TO`]).
    pub fn is_file(&self) -> bool {
        matches!(*self.inner.data, Data::File { .. })
    }

    /// Whether the bytes are a mapping of the file (see [`MAP_FROM`] and `crate::mapped`).
    pub fn is_mapped(&self) -> bool {
        matches!(*self.inner.data, Data::File { map: Some(_), .. })
    }

    /// Whether reading `len` bytes from `offset` (and checking the chunks they fall in) needs
    /// no disk or network read: a blob in memory, or a mapped file whose pages for those
    /// chunks are all in the page cache now (`mincore`). A caller on an async executor reads
    /// at once what is resident, and hands the rest to a thread it may block.
    pub fn resident(&self, offset: u64, len: u64) -> bool {
        let i = &self.inner;
        match &*i.data {
            Data::Memory(_) => true,
            Data::File { map: Some(map), .. } if self.check_range(offset, len).is_ok() => {
                let c = i.chunks.covering(offset, len);
                if c.is_empty() {
                    return true;
                }
                let (start, end) = (i.chunks.range(c.start).start, i.chunks.range(c.end - 1).end);
                pages_resident(&map[start as usize..end as usize])
            }
            _ => false,
        }
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

    /// Report chunk `c` bad: count, log, mark, and the error to return.
    fn bad_chunk(&self, c: usize) -> StoreError {
        let i = &self.inner;
        let r = i.chunks.range(c);
        let reason =
            format!("bytes {}..{} (chunk {c}) do not match their stored digest", r.start, r.end);
        count_corruption(&i.record.name, &reason);
        if let Some(m) = &i.marker {
            m(&reason);
        }
        StoreError::Corrupt { name: i.record.name.clone(), reason }
    }

    /// Chunk `c` of a file, brought in and checked in the mapping; or, for a file not mapped
    /// (or without `MADV_POPULATE_READ`), read with `pread` and checked in memory: in a pooled
    /// buffer when the chunk fills at least half of one, else in a buffer of its own size (a small
    /// chunk kept by a cache tier must not pin a whole pooled buffer, and a catalogue's
    /// chunks may be larger than the buffers).
    fn chunk(&self, c: usize) -> Result<Bytes> {
        if !self.is_file() {
            let r = self.inner.chunks.range(c);
            return self.bytes(r.start, r.end - r.start);
        }
        let bytes = self.chunk_unchecked(c)?;
        self.check_chunk(c, &bytes)?;
        Ok(bytes)
    }

    /// Chunk `c` as stored, not checked yet: for [`BlobSource::chunk`], and for a reader that
    /// hands part of it out before it checks it with [`BlobSource::check_chunk`]
    /// (`source/arriving.rs`). A file's pages are brought in as for a checked read; a remote
    /// blob's chunk comes checked.
    fn chunk_unchecked(&self, c: usize) -> Result<Bytes> {
        let i = &self.inner;
        let r = i.chunks.range(c);
        let (file, map) = match &*i.data {
            Data::Memory(data) => return Ok(data.slice(r.start as usize..r.end as usize)),
            Data::Remote { .. } => return self.bytes(r.start, r.end - r.start),
            Data::File { file, map } => (file, map),
        };
        let (start, end) = (r.start as usize, r.end as usize);
        if let Some(map) = map
            && ((POPULATE_WORKS.load(Ordering::Relaxed) && pages_resident(&map[start..end]))
                || populate(&map[start..end]).map_err(|e| self.read_error(e))?)
        {
            return Ok(map.slice(start..end));
        }
        let n = end - start;
        let pool = CHUNK_BUFFERS.buf_size();
        if (pool / 2..=pool).contains(&n) {
            let mut buf = CHUNK_BUFFERS.get();
            file.read_exact_at(&mut buf[..n], r.start).map_err(|e| self.read_error(e))?;
            return Ok(Bytes::from_owner(buf).slice(..n));
        }
        let mut buf = vec![0u8; n];
        file.read_exact_at(&mut buf, r.start).map_err(|e| self.read_error(e))?;
        Ok(buf.into())
    }

    /// Check `bytes`, chunk `c` as [`BlobSource::chunk_unchecked`] gave it, against the
    /// chunk's digest; a bad chunk is reported ([`BlobSource::bad_chunk`]). A memory blob's
    /// chunk is checked once per reader.
    fn check_chunk(&self, c: usize, bytes: &[u8]) -> Result<()> {
        let i = &self.inner;
        let memory = matches!(*i.data, Data::Memory(_));
        if memory && i.checked[c].load(Ordering::Acquire) {
            return Ok(());
        }
        if !i.chunks.check(c, bytes) {
            return Err(self.bad_chunk(c));
        }
        if memory {
            i.checked[c].store(true, Ordering::Release);
        }
        Ok(())
    }

    fn read_error(&self, e: std::io::Error) -> StoreError {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            StoreError::Corrupt {
                name: self.inner.record.name.clone(),
                reason: "file is shorter than the catalogue says".into(),
            }
        } else {
            read_failed(&self.inner.record.name, e)
        }
    }

    /// Verified bytes of a range: whole chunks are read (for a file, into one buffer) and
    /// checked, and the range is cut out of what was checked. A memory blob is not copied.
    pub fn bytes(&self, offset: u64, len: u64) -> Result<Bytes> {
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(Bytes::new());
        }
        let i = &self.inner;
        let chunks = i.chunks.covering(offset, len);
        if chunks.len() == 1 && self.is_file() {
            let at = (offset - i.chunks.range(chunks.start).start) as usize;
            return Ok(self.chunk(chunks.start)?.slice(at..at + len as usize));
        }
        let (first, last) = (i.chunks.range(chunks.start), i.chunks.range(chunks.end - 1));
        match &*i.data {
            Data::Memory(data) => {
                for c in chunks {
                    let r = i.chunks.range(c);
                    self.check_chunk(c, &data[r.start as usize..r.end as usize])?;
                }
                Ok(data.slice(offset as usize..(offset + len) as usize))
            }
            Data::Remote { reader, window } => {
                let (start, end) = (offset, offset + len);
                let mut w = window.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((at, held)) = &*w
                    && *at <= start
                    && end <= at + held.len() as u64
                {
                    return Ok(held.slice((start - at) as usize..(end - at) as usize));
                }
                // Whole chunks from the first one touched, at least a window's worth.
                let from = first.start;
                let to = if reader.streaming_at(from) {
                    last.end
                } else {
                    last.end.max((from + REMOTE_WINDOW).min(self.size()))
                };
                let all = i.chunks.covering(from, to - from);
                let to = i.chunks.range(all.end - 1).end;
                let got = reader.read(from, to - from)?;
                if got.len() as u64 != to - from {
                    return Err(StoreError::Corrupt {
                        name: i.record.name.clone(),
                        reason: format!(
                            "asked for bytes {from}..{to}, the store returned {} bytes",
                            got.len()
                        ),
                    });
                }
                // Every chunk asked for must check; past them, the window keeps only the
                // chunks before a bad one (the read that reaches it reports it).
                let mut good = got.len();
                for c in all {
                    let r = i.chunks.range(c);
                    if !i.chunks.check(c, &got[(r.start - from) as usize..(r.end - from) as usize])
                    {
                        if c < chunks.end {
                            return Err(self.bad_chunk(c));
                        }
                        good = (r.start - from) as usize;
                        break;
                    }
                }
                if good == got.len() && to < self.size() {
                    reader.prefetch(to, (to + REMOTE_WINDOW).min(self.size()) - to);
                }
                let out = got.slice((start - from) as usize..(end - from) as usize);
                *w = Some((from, got.slice(..good)));
                Ok(out)
            }
            Data::File { map: Some(map), file } if POPULATE_WORKS.load(Ordering::Relaxed) => {
                // Chunk by chunk, each checked in the mapping; then one slice of them all —
                // unless populating was found unsupported meanwhile, when the chunks were
                // checked in copies instead: then copies are what is handed out.
                for c in chunks.clone() {
                    self.chunk(c)?;
                }
                if POPULATE_WORKS.load(Ordering::Relaxed) {
                    return Ok(map.slice(offset as usize..(offset + len) as usize));
                }
                self.checked_copy(file, chunks, offset, len)
            }
            Data::File { file, .. } => self.checked_copy(file, chunks, offset, len),
        }
    }

    /// `len` bytes from `offset` of the blob's file, read into memory (covering `chunks`
    /// whole) and checked there.
    fn checked_copy(
        &self,
        file: &File,
        chunks: std::ops::Range<usize>,
        offset: u64,
        len: u64,
    ) -> Result<Bytes> {
        let i = &self.inner;
        let (first, last) = (i.chunks.range(chunks.start), i.chunks.range(chunks.end - 1));
        let mut buf = vec![0u8; (last.end - first.start) as usize];
        file.read_exact_at(&mut buf, first.start).map_err(|e| self.read_error(e))?;
        for c in chunks {
            let r = i.chunks.range(c);
            let at = (r.start - first.start) as usize..(r.end - first.start) as usize;
            if !i.chunks.check(c, &buf[at]) {
                return Err(self.bad_chunk(c));
            }
        }
        let start = (offset - first.start) as usize;
        Ok(Bytes::from(buf).slice(start..start + len as usize))
    }

    /// Every byte of the blob, verified (held whole in memory: for images and small blobs).
    pub fn all(&self) -> Result<Bytes> {
        self.bytes(0, self.size())
    }

    /// Check every chunk of a range without keeping the bytes, one chunk at a time;
    /// `pace(bytes)` is called after each chunk and may stop the check by returning false
    /// (then `Ok(false)` is returned).
    pub fn verify_paced(
        &self,
        offset: u64,
        len: u64,
        pace: &mut dyn FnMut(u64) -> bool,
    ) -> Result<bool> {
        for piece in self.pieces(offset, len)? {
            if !pace(piece?.len() as u64) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Check every chunk of the blob.
    pub fn verify_all(&self) -> Result<()> {
        self.verify_paced(0, self.size(), &mut |_| true).map(drop)
    }

    /// A range as a sequence of pieces that break at chunk boundaries, each verified only
    /// when it is taken: a stream stops at the first bad chunk, after sending every good one
    /// before it.
    pub fn pieces(&self, offset: u64, len: u64) -> Result<Pieces> {
        self.check_range(offset, len)?;
        if let Data::Remote { reader, window } = &*self.inner.data
            && len > REMOTE_WINDOW
        {
            let mut from =
                self.inner.chunks.range(self.inner.chunks.covering(offset, 1).start).start;
            // Past the window already held, if the range starts inside it.
            if let Some((at, held)) = &*window.lock().unwrap_or_else(|p| p.into_inner())
                && *at <= from
                && from < at + held.len() as u64
            {
                from = at + held.len() as u64;
            }
            let chunks = self.inner.chunks.covering(offset, len);
            let to = self.inner.chunks.range(chunks.end - 1).end;
            if from < to {
                reader.sequential(from, to);
            }
        }
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

    /// Digest of a verified byte range, read a chunk at a time.
    pub fn digest_range(&self, offset: u64, len: u64, algo: DigestAlgo) -> Result<Digest> {
        let mut h = algo.hasher();
        for piece in self.pieces(offset, len)? {
            h.update(&piece?);
        }
        Ok(h.finish())
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_failed_read_names_the_blob_and_keeps_its_kind() {
        let eio = std::io::Error::from_raw_os_error(libc::EIO);
        let kind = eio.kind();
        let e = read_failed("scans/ct 1", eio);
        assert!(e.to_string().contains("reading blob \"scans/ct 1\": "), "{e}");
        assert!(matches!(&e, StoreError::Io(io) if io.kind() == kind), "{e:?}");
        let e = read_failed("x", std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(matches!(e, StoreError::StorageFull(_)), "{e:?}");
    }

    use super::*;
    use bs_wire::CHUNK_SIZE;
    use std::sync::Mutex;

    /// A catalogue record of `size` bytes (also for the tests of `arriving`).
    pub(super) fn record(size: u64) -> BlobRecord {
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
        assert!(src.bytes(0, 0).unwrap().is_empty());
        assert!(corruption_found() > before);
        assert!(marks.lock().unwrap()[0].contains("chunk 2"), "{:?}", marks.lock().unwrap());
    }

    #[test]
    fn chunks_of_any_size_are_read_from_unmapped_files_and_checked() {
        use std::io::Write;
        // Chunks of 2 MiB (larger than the pooled buffers), as a catalogue may hold.
        let big = (2 * CHUNK_SIZE) as usize;
        let good: Vec<u8> = (0..big + 1000).map(|i| (i % 251) as u8).collect();
        let mut stored = (big as u32).to_be_bytes().to_vec();
        for c in good.chunks(big) {
            stored.extend_from_slice(&twox_hash::XxHash3_64::oneshot(c).to_be_bytes());
        }
        let chunks = ChunkDigests::decode(&stored, good.len() as u64).unwrap();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&good).unwrap();
        let src = BlobSource::file(record(good.len() as u64), f, chunks, None).unwrap();
        assert!(src.is_file() && !src.is_mapped());
        let pieces: Vec<Bytes> = src.pieces(0, src.size()).unwrap().map(Result::unwrap).collect();
        assert_eq!(pieces.iter().map(|p| p.len()).collect::<Vec<_>>(), [big, 1000]);
        assert_eq!(&src.all().unwrap()[..], &good[..]);
        // A small blob's one chunk is its own buffer, not a slice of a pooled one.
        let small: Vec<u8> = (0..100_000).map(|i| (i % 13) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&small).unwrap();
        let chunks = ChunkDigests::of(&small);
        let src = BlobSource::file(record(small.len() as u64), f, chunks, None).unwrap();
        let all = src.all().unwrap();
        assert_eq!(&all[..], &small[..]);
        let owned: Vec<u8> = all.try_into_mut().expect("not shared with a pooled buffer").into();
        assert_eq!(owned.capacity(), small.len());
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
        assert!(src.is_file());
        assert_eq!(&src.all().unwrap()[..], &good[..]);
        let mut buf = [0u8; 16];
        assert_eq!(src.read_at(&mut buf, src.size() - 4).unwrap(), 4);
        assert!(matches!(src.bytes(1, src.size()), Err(StoreError::OutOfRange { .. })));
    }
}
