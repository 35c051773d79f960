//! The filesystem store (the default): blob bytes in files named by random ids under
//! `<root>/blobs/`, uploads staged in `<root>/staging/`, the catalogue in `<root>/meta.db`,
//! and `<root>/lock`, held while the store is open (one store per directory: `dirlock.rs`).
//!
//! Commit order makes crashes harmless: staged bytes are renamed into `blobs/`, the file and
//! the directory are fsynced, and only then does the catalogue row appear (one SQLite
//! transaction, shared with the blobs committing at the same moment).
//! A crash before the row leaves an unreferenced file, removed at the next start; a blob is
//! visible only when all its bytes are durable.
//!
//! A small blob (declared size up to [`INLINE_UP_TO`]) has no file: its bytes are held in
//! memory while they arrive and committed inside its catalogue row, in the same transaction
//! as the row itself — no file to create, rename and fsync twice, so the many small blobs
//! committing at one moment share a single fsync. Its reads are checked against its chunk
//! digests like any other. An upload of one that breaks off leaves its bytes in a staging
//! file, where a resumed upload finds them (and then commits from that file).

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bs_meta::{BlobRecord, Catalogue, Commit, StoredBlob, UploadRecord, now_ms};
use bs_wire::{CHUNK_SIZE, ChunkDigests, ChunkHasher, Digest, DigestAlgo};
use bytes::Bytes;

use crate::catalogued;
use crate::claim::Claims;
use crate::error::StoreError;
use crate::events::{Listener, Listeners, StoreEvent};
use crate::mapped::MappedFiles;
use crate::name::validate_name;
use crate::source::{BlobSource, CorruptionMarker};
use crate::store::{
    RangeTarget, RangeWriter, RouteSpec, Routed, Store, UploadSink, check_complete, check_write,
    digest_and_chunks, digest_and_chunks_also, digest_and_chunks_of, digest_file_range,
    may_replace, range_size,
};
use crate::written::{Tracker, Written, WrittenChunks};

type Result<T> = std::result::Result<T, StoreError>;

/// Space blob data leaves free for the catalogue: 0.5% of the file system, within these bounds.
const CATALOGUE_RESERVE_MIN: u64 = 1 << 20;
const CATALOGUE_RESERVE_MAX: u64 = 64 << 20;

/// Blobs of a declared size up to this are kept in their catalogue row, not in a file of their
/// own. SQLite reads and writes blobs of this size in its pages faster than a file system
/// creates, syncs and opens files for them (SQLite's "Internal Versus External BLOBs" puts
/// the crossing near 100 KB); measured here by `blobstream bench batch` (small blobs).
pub const INLINE_UP_TO: u64 = 64 << 10;

/// Whether an upload of `size` is kept in its catalogue row.
pub(crate) fn inline_sized(size: Option<u64>) -> bool {
    size.is_some_and(|s| s <= INLINE_UP_TO)
}

/// Pending uploads older than this are removed when the store opens.
pub const PENDING_TTL: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Files plus an SQLite catalogue under one data directory.
#[derive(Clone)]
pub struct FsStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Room kept for deletes on a disk something else filled (`DIR/reserve`).
    ballast: crate::ballast::Ballast,
    root: PathBuf,
    /// This store's hold on its directory (no second store opens it meanwhile).
    _lock: crate::dirlock::DirLock,
    cat: Arc<Catalogue>,
    algo: DigestAlgo,
    /// Names whose pending upload is open by a writer.
    busy: Claims,
    /// Range writers open per pending upload: while any is, the upload cannot be opened whole
    /// (to commit) or aborted.
    range_writers: Mutex<HashMap<String, usize>>,
    listeners: Listeners,
    /// Files of blobs read recently, kept open and mapped for their next readers.
    mapped: MappedFiles,
    /// Chunk digests of pending uploads as their range writers wrote them.
    written: WrittenChunks,
    /// Bytes commits have read back to digest or check them.
    read_back: AtomicU64,
}

impl Inner {
    /// One range writer of `name`'s upload less.
    fn range_writer_done(&self, name: &str) {
        let mut open = self.range_writers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                open.remove(name);
            }
        }
    }

    /// `Busy` while range writers hold `name`'s upload.
    fn no_range_writers(&self, name: &str) -> Result<()> {
        match self.range_writers.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
            Some(n) if *n > 0 => Err(StoreError::Busy(name.to_string())),
            _ => Ok(()),
        }
    }
}

impl FsStore {
    /// Open (creating if needed) a store in `root`, removing files a crash left behind.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        fs::create_dir_all(&root).map_err(|e| crate::dirlock::not_a_folder(&root, e))?;
        let lock = crate::dirlock::DirLock::take(&root)?;
        for dir in ["blobs", "staging"] {
            let dir = root.join(dir);
            fs::create_dir_all(&dir).map_err(|e| crate::dirlock::unwritable(&dir, e))?;
            crate::dirlock::check_writable(&dir)?;
        }
        let cat = Catalogue::open(&root.join("meta.db"))?;
        let ballast = crate::ballast::Ballast::keep(&root);
        let store = Self {
            inner: Arc::new(Inner {
                ballast,
                root,
                _lock: lock,
                cat: Arc::new(cat),
                algo: DigestAlgo::default(),
                busy: Claims::default(),
                range_writers: Mutex::default(),
                listeners: Listeners::default(),
                mapped: MappedFiles::default(),
                written: WrittenChunks::default(),
                read_back: AtomicU64::new(0),
            }),
        };
        store.collect_garbage()?;
        Ok(store)
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Fault injection for tests: flip the bits of `mask` in byte `offset` of the committed
    /// blob `name`'s file (or catalogue row), in place, keeping its digests — bit rot on disk.
    pub fn damage(&self, name: &str, offset: u64, mask: u8) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let mut s = self.stored(name)?;
        if let Some(data) = s.inline.take() {
            return catalogued::damage_inline(&self.inner.cat, &s, data, offset, mask);
        }
        let f =
            OpenOptions::new().read(true).write(true).open(self.inner.blob_path(&s.location))?;
        let mut b = [0u8];
        f.read_exact_at(&mut b, offset)?;
        f.write_all_at(&[b[0] ^ mask], offset)?;
        Ok(())
    }

    fn collect_garbage(&self) -> Result<()> {
        let i = &self.inner;
        self.expire_uploads(PENDING_TTL)?;
        let live: HashSet<String> = i.cat.locations()?.into_iter().collect();
        for shard in fs::read_dir(i.root.join("blobs"))? {
            let shard = shard?.path();
            if !shard.is_dir() {
                continue;
            }
            for f in fs::read_dir(&shard)? {
                let f = f?;
                let id = f.file_name().to_string_lossy().into_owned();
                if !live.contains(&id) {
                    tracing::info!(file = %f.path().display(), "removing unreferenced blob file");
                    // A replaced file's own removal may be under way (see `remove_replaced`).
                    match fs::remove_file(f.path()) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                        _ => {}
                    }
                }
            }
        }
        let pending: HashSet<String> = i.cat.upload_ids()?.into_iter().collect();
        for f in fs::read_dir(i.root.join("staging"))? {
            let f = f?;
            if !pending.contains(&*f.file_name().to_string_lossy()) {
                fs::remove_file(f.path())?;
            }
        }
        Ok(())
    }
}

impl Inner {
    fn blob_path(&self, id: &str) -> PathBuf {
        self.root.join("blobs").join(&id[..2]).join(id)
    }

    /// Write `at`'s bytes at its offset of the staging `file` of `name` (upload `id`), refused with
    /// [`StoreError::StorageFull`] when the `needs` bytes of new space it takes are not free
    /// (less the catalogue's reserve); writeback starts at once.
    fn write_staged(
        &self,
        name: &str,
        id: &str,
        file: &File,
        at: (u64, &[u8]),
        needs: u64,
    ) -> Result<()> {
        let (offset, data) = at;
        self.check_space(name, needs)?;
        file.write_all_at(data, offset).map_err(StoreError::io_at(&self.staging_path(id)))?;
        crate::start_writeback(file, offset, data.len() as u64);
        Ok(())
    }

    /// [`StoreError::StorageFull`] unless `needs` more bytes of `name` fit (less the
    /// catalogue's reserve).
    fn check_space(&self, name: &str, needs: u64) -> Result<()> {
        if needs > 0
            && let Some(free) = self.free_bytes()
            && needs > free
        {
            // (Not where: a client is told this, and the folder is the operator's business.)
            return Err(StoreError::StorageFull(format!(
                "{needs} more bytes for {name:?}, {free} bytes left for blobs"
            )));
        }
        Ok(())
    }

    fn staging_path(&self, id: &str) -> PathBuf {
        self.root.join("staging").join(id)
    }

    /// Bytes blob data may still take: what is free, less a reserve kept for the catalogue
    /// (so that on a disk full of blobs a delete can still be committed, and space freed).
    fn free_bytes(&self) -> Option<u64> {
        let c = std::ffi::CString::new(self.root.as_os_str().as_encoded_bytes()).ok()?;
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return None;
        }
        let (free, total) =
            (st.f_bavail as u64 * st.f_frsize as u64, st.f_blocks as u64 * st.f_frsize as u64);
        let reserve = (total / 200).clamp(CATALOGUE_RESERVE_MIN, CATALOGUE_RESERVE_MAX);
        Some(free.saturating_sub(reserve))
    }

    /// The chunk digests of the first `len` bytes of `file`, the range-written upload of
    /// `name`, if they are the sender's: each as a range writer recorded it (`written`) or,
    /// where none could, read back now. A chunk that differs is [`StoreError::Corrupt`].
    fn check_chunks(
        &self,
        name: &str,
        file: &File,
        len: u64,
        sender: &ChunkDigests,
        written: Option<&Written>,
    ) -> Result<ChunkDigests> {
        let corrupt = |reason: String| StoreError::Corrupt { name: name.to_string(), reason };
        if sender.size() != len || sender.chunk_size() != CHUNK_SIZE {
            return Err(corrupt(format!(
                "the sender's chunk digests cover {} bytes in chunks of {}; the upload holds \
                 {len} bytes in chunks of {CHUNK_SIZE}",
                sender.size(),
                sender.chunk_size()
            )));
        }
        let mut buf = Vec::new();
        for c in 0..sender.count() {
            let r = sender.range(c);
            let ours = match written.and_then(|w| w.digest(c as u64)) {
                Some(d) => d,
                None => {
                    buf.resize((r.end - r.start) as usize, 0);
                    file.read_exact_at(&mut buf, r.start)?;
                    self.read_back.fetch_add(buf.len() as u64, Ordering::Relaxed);
                    ChunkDigests::of(&buf).sum(0).unwrap_or_default()
                }
            };
            if sender.sum(c) != Some(ours) {
                return Err(corrupt(format!(
                    "bytes {}..{} as stored differ from the sender's (chunk {c})",
                    r.start, r.end
                )));
            }
        }
        Ok(sender.clone())
    }

    /// `op`, a catalogue write that frees space (a delete); on a disk full to the last byte,
    /// once more after giving up the room kept for it (or after another delete gave it up:
    /// then the room is there already).
    fn with_room<T>(
        &self,
        op: impl Fn() -> std::result::Result<T, bs_meta::MetaError>,
    ) -> std::result::Result<T, bs_meta::MetaError> {
        match op() {
            Err(e) if e.is_disk_full() => {
                self.ballast.release();
                op()
            }
            r => r,
        }
    }

    /// Drop the pending upload of `name` from the catalogue; returns its id. Its staged bytes
    /// are emptied first: on a full disk that is what lets SQLite commit the delete.
    fn discard_upload(&self, name: &str) -> Result<Option<String>> {
        if let Some(u) = self.cat.upload(name)?
            && let Ok(f) = OpenOptions::new().write(true).open(self.staging_path(&u.upload_id))
        {
            let _ = f.set_len(0);
        }
        let id = self.with_room(|| self.cat.delete_upload(name))?;
        if let Some(id) = &id {
            self.written.forget(id);
        }
        Ok(id)
    }
}

/// Replaced blob files this large or larger are removed by a thread of their own.
const REMOVE_IN_BACKGROUND_FROM: u64 = 64 << 20;

/// Remove the file of a blob its commit just replaced, then call `then` (which forgets the
/// blob's kept mapping again: one kept by a reader of the old file meanwhile would otherwise
/// hold the removed file's space). The file is unreferenced already, so a large one is removed
/// in the background: unlinking a gigabyte takes ext4 about half a second here, which the
/// writer waiting for its acknowledgement need not wait for. Were the process to stop first,
/// or no thread be had, the next start's garbage collection removes it.
fn remove_replaced(path: PathBuf, then: impl FnOnce() + Send + 'static) {
    let large = fs::metadata(&path).is_ok_and(|m| m.len() >= REMOVE_IN_BACKGROUND_FROM);
    let remove = move || {
        let _ = fs::remove_file(&path);
        then();
    };
    if !large {
        return remove();
    }
    if let Err(e) = std::thread::Builder::new().name("remove-replaced".into()).spawn(remove) {
        tracing::warn!(error = %e, "no thread to remove a replaced blob file: left to the next start");
    }
}

/// A fresh random 128-bit id in hex.
pub(crate) fn new_id() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS random source works");
    hex::encode(b)
}

/// An error opening `path`, a file of blob `name`: a missing file is the blob not found,
/// anything else an I/O error naming the file.
fn not_found_as(e: std::io::Error, name: &str, path: &Path) -> StoreError {
    if e.kind() == std::io::ErrorKind::NotFound {
        StoreError::NotFound(name.to_string())
    } else {
        StoreError::io_at(path)(e)
    }
}

impl Store for FsStore {
    fn describe(&self) -> String {
        format!("fs:{}", self.inner.root.display())
    }

    fn digest_algo(&self) -> DigestAlgo {
        self.inner.algo
    }

    fn stat(&self, name: &str) -> Result<BlobRecord> {
        catalogued::stat(&self.inner.cat, name)
    }

    fn corrupt_mark(&self, name: &str) -> Result<Option<String>> {
        catalogued::corrupt_mark(&self.inner.cat, name)
    }

    fn corrupt_marks(&self, names: &[String]) -> Result<Vec<(String, String)>> {
        Ok(self.inner.cat.corrupt_among(names)?)
    }

    fn list(&self, prefix: &str, after: &str, limit: usize) -> Result<Vec<BlobRecord>> {
        Ok(self.inner.cat.list(prefix, after, limit)?)
    }

    fn delete(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let i = &self.inner;
        // A pending upload goes too, unless a transfer is writing it right now.
        let upload = match i.busy.take(name) {
            Ok(_claim) => i.discard_upload(name)?,
            Err(_) => None,
        };
        if let Some(id) = &upload {
            let _ = fs::remove_file(i.staging_path(id));
        }
        // The catalogue first: once the row is gone the blob is gone, whatever happens to
        // the file. A file that cannot be removed now (or a crash right here) is only an
        // unreferenced file, which the next start removes.
        // A disk full to the last byte (not by blobs, which leave the catalogue room): the
        // room kept for this, then the delete again.
        let deleted = i.with_room(|| i.cat.delete_blob(name))?;
        match deleted {
            Some(loc) => {
                match fs::remove_file(i.blob_path(&loc)) {
                    // (A blob kept in its row has no file.)
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        tracing::warn!(%name, error = %e, "blob deleted; its file stays until restart");
                    }
                    _ => {}
                }
                i.mapped.forget(name);
                i.listeners.notify(StoreEvent::Deleted(name.to_string()));
                i.ballast.restore();
                Ok(())
            }
            None if upload.is_some() => {
                i.ballast.restore();
                Ok(())
            }
            None => Err(StoreError::NotFound(name.to_string())),
        }
    }

    fn route(&self, spec: &RouteSpec) -> Result<Routed> {
        validate_name(&spec.name)?;
        let i = &self.inner;
        catalogued::refuse_existing(&i.cat, &spec.name, spec.overwrite, &spec.refuse_digests)?;
        if let (Some(size), Some(free)) = (spec.size, i.free_bytes())
            && size > free
        {
            return Err(StoreError::StorageFull(format!(
                "{size} bytes requested, {free} bytes free for blobs"
            )));
        }
        // Nobody writes, replaces or deletes this upload while we decide.
        let _claim = i.busy.take(&spec.name)?;
        if !spec.resume_tag.is_empty()
            && let Some(u) = i.cat.upload(&spec.name)?
            && u.size == spec.size
            && u.resume_tag == spec.resume_tag
            && let Ok(f) = File::open(i.staging_path(&u.upload_id))
        {
            // Keep the bytes; take this request's type, metadata and overwrite flag.
            i.cat.put_upload(&spec.upload_record(u.upload_id.clone()))?;
            let received = f.metadata()?.len();
            let received_digest =
                (received > 0).then(|| digest_file_range(&f, 0, received, i.algo)).transpose()?;
            let upload_id = u.upload_id;
            return Ok(Routed { upload_id, received, received_digest, resumed: true });
        }
        let id = new_id();
        // A small blob's bytes are held in memory until its commit: no staging file.
        if !inline_sized(spec.size) {
            let path = i.staging_path(&id);
            File::create(&path).map_err(StoreError::io_at(&path))?;
        }
        let rec = spec.upload_record(id.clone());
        if let Some(old) = i.cat.put_upload(&rec)? {
            i.written.forget(&old);
            let _ = fs::remove_file(i.staging_path(&old));
        }
        Ok(Routed { upload_id: id, received: 0, received_digest: None, resumed: false })
    }

    fn open_upload(&self, name: &str) -> Result<Box<dyn UploadSink>> {
        validate_name(name)?;
        let i = &self.inner;
        let claim = i.busy.take(name)?;
        i.no_range_writers(name)?;
        let rec = i.cat.upload(name)?.ok_or_else(|| StoreError::NoUpload(name.to_string()))?;
        claim.keep(); // from here on the sink releases it when dropped
        // What range writers vouched for goes with the writer that now holds the upload.
        let written = i.written.take(&rec.upload_id);
        let mut sink = FsUpload {
            store: self.inner.clone(),
            rec,
            staged: None,
            received: 0,
            chunks: None,
            written,
            checked: None,
        };
        let path = i.staging_path(&sink.rec.upload_id);
        let file = match OpenOptions::new().write(true).read(true).open(&path) {
            Ok(file) => file,
            // A small blob's upload, nothing of it kept so far: held in memory.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && inline_sized(sink.rec.size) => {
                let size = sink.rec.size.unwrap_or_default() as usize;
                sink.staged = Some(Staged::Memory(Vec::with_capacity(size)));
                return Ok(Box::new(sink));
            }
            Err(e) => return Err(not_found_as(e, name, &path)),
        };
        sink.received = file.metadata()?.len();
        sink.chunks = (sink.received == 0).then(ChunkHasher::new);
        sink.staged = Some(Staged::File(file));
        Ok(Box::new(sink))
    }

    fn open_upload_range(&self, name: &str, start: u64) -> Result<Option<Box<dyn UploadSink>>> {
        validate_name(name)?;
        let i = &self.inner;
        let rec = i.cat.upload(name)?.ok_or_else(|| StoreError::NoUpload(name.to_string()))?;
        let kept_whole = inline_sized(rec.size) && !i.staging_path(&rec.upload_id).exists();
        let size = range_size(name, rec.size, start, kept_whole)?;
        {
            // Counted before the file is opened, and only while nobody holds the upload's
            // claim, under the lock its committer checks the count under (after taking the
            // claim): a range writer never holds a file that is being committed.
            let mut open = i.range_writers.lock().unwrap_or_else(|p| p.into_inner());
            if i.busy.is_held(name) {
                return Err(StoreError::Busy(name.to_string()));
            }
            *open.entry(name.to_string()).or_default() += 1;
        }
        let path = i.staging_path(&rec.upload_id);
        let file = match OpenOptions::new().write(true).open(&path) {
            Ok(f) => f,
            Err(e) => {
                i.range_writer_done(name);
                return Err(not_found_as(e, name, &path));
            }
        };
        i.written.open(&rec.upload_id);
        let target = FsRange {
            store: i.clone(),
            name: name.to_string(),
            id: rec.upload_id.clone(),
            file,
            tracker: Tracker::new(size),
        };
        let (name, id) = (name.to_string(), rec.upload_id);
        Ok(Some(Box::new(RangeWriter { name, id, size, received: start, target })))
    }

    fn takes_range_writes(&self) -> bool {
        true
    }

    fn upload_piece_digests(
        &self,
        name: &str,
        offset: u64,
        len: u64,
        piece: u64,
        algo: DigestAlgo,
    ) -> Result<Option<Vec<Digest>>> {
        validate_name(name)?;
        let i = &self.inner;
        let rec = i.cat.upload(name)?.ok_or_else(|| StoreError::NoUpload(name.to_string()))?;
        let path = i.staging_path(&rec.upload_id);
        let file = match File::open(&path) {
            Ok(f) => f,
            // A small blob's upload holds nothing until its writer is done or interrupted.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && inline_sized(rec.size) => {
                return Ok(Some(Vec::new()));
            }
            Err(e) => return Err(not_found_as(e, name, &path)),
        };
        Ok(Some(crate::store::piece_digests(&file, offset, len, piece, algo)?))
    }

    fn abort(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let i = &self.inner;
        let _claim = i.busy.take(name)?;
        i.no_range_writers(name)?;
        let id = i.discard_upload(name)?.ok_or_else(|| StoreError::NoUpload(name.to_string()))?;
        match fs::remove_file(i.staging_path(&id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    fn open_read(&self, name: &str) -> Result<BlobSource> {
        self.open_for_reading(catalogued::readable(&self.inner.cat, name)?)
    }

    /// At once: a blob kept in its catalogue row, or one whose file a recent reader left
    /// open and mapped (see [`crate::mapped`]); opening any other file is left to
    /// `open_read`.
    fn open_read_at_once(&self, name: &str) -> Option<Result<BlobSource>> {
        let s = match catalogued::readable_at_once(&self.inner.cat, name)? {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        if s.inline.is_some() {
            return Some(self.open_stored(s));
        }
        let path = self.inner.blob_path(&s.location);
        self.inner.mapped.get(&s, &path).map(Ok)
    }

    fn subscribe(&self, listener: Listener) {
        self.inner.listeners.add(listener);
    }

    fn expire_uploads(&self, age: std::time::Duration) -> Result<Vec<String>> {
        let i = &self.inner;
        catalogued::expire_uploads(&i.cat, &i.busy, age, |name| {
            let id = i.discard_upload(name)?;
            if let Some(id) = &id {
                let _ = fs::remove_file(i.staging_path(id));
            }
            Ok(id)
        })
    }

    fn scrub_blob(&self, name: &str, pace: &mut dyn FnMut(u64) -> bool) -> Result<bool> {
        validate_name(name)?;
        let stored = self.stored(name)?;
        let (marked, loc) = (stored.corrupt.is_some(), stored.location.clone());
        let want: Option<Digest> = stored.record.digest.parse().ok();
        let src = self.open_stored(stored)?;
        // Every chunk, and the whole: a range-written blob's digest of the whole is its
        // sender's, checked at commit only through the chunks computed with it.
        let mut whole = want.as_ref().map(|d| d.algo.hasher());
        for piece in src.pieces(0, src.size())? {
            let piece = piece?;
            if let Some(h) = &mut whole {
                h.update(&piece);
            }
            if !pace(piece.len() as u64) {
                return Ok(false);
            }
        }
        if let (Some(h), Some(want)) = (whole, want)
            && h.finish() != want
        {
            let reason = format!(
                "every chunk checks out, but the whole reads back as {}, not {want}",
                h.finish()
            );
            self.inner.cat.set_corrupt(name, &loc, Some(&reason))?;
            return Err(StoreError::Corrupt { name: name.to_string(), reason });
        }
        if marked {
            tracing::info!(%name, "blob marked corrupt reads back whole again: mark cleared");
            self.inner.cat.set_corrupt(name, &loc, None)?;
        }
        Ok(true)
    }
}

/// The chunk digests of the row `s`, from their stored form `c`.
fn chunks_of(s: &StoredBlob, c: &[u8]) -> Result<ChunkDigests> {
    ChunkDigests::decode(c, s.record.size).map_err(|e| StoreError::Corrupt {
        name: s.record.name.clone(),
        reason: format!("catalogue: {e}"),
    })
}

impl FsStore {
    /// Bytes commits have read back so far to digest or check them: chunks of range-written
    /// uploads no range writer could vouch for, and whole uploads whose bytes no writer
    /// digested as they arrived in order (range-written ones committed without the sender's
    /// chunk digests, resumed ones).
    pub fn commit_read_back(&self) -> u64 {
        self.inner.read_back.load(Ordering::Relaxed)
    }

    fn stored(&self, name: &str) -> Result<StoredBlob> {
        self.inner.cat.stored(name)?.ok_or_else(|| StoreError::NotFound(name.to_string()))
    }

    /// Open a catalogue row's file for verified reading.
    fn open_stored(&self, mut s: StoredBlob) -> Result<BlobSource> {
        let i = &self.inner;
        let name = s.record.name.clone();
        let marker = self.marker(&name, &s.location);
        if let Some(data) = s.inline.take() {
            let chunks = chunks_of(&s, s.chunks.as_deref().unwrap_or_default())?;
            return BlobSource::memory(s.record, data.into(), chunks, Some(marker));
        }
        let file = match File::open(i.blob_path(&s.location)) {
            Ok(f) => f,
            // Listed, but its bytes are gone: as corrupt as can be (unless it was deleted
            // just now, in which case the row is gone too).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if i.cat.stored(&name)?.is_none_or(|now| now.location != s.location) {
                    return Err(StoreError::NotFound(name));
                }
                let reason = "its file is missing from the data directory".to_string();
                crate::source::count_corruption(&name, &reason);
                marker(&reason);
                return Err(StoreError::Corrupt { name, reason });
            }
            Err(e) => return Err(StoreError::io_at(&i.blob_path(&s.location))(e)),
        };
        let chunks = match &s.chunks {
            Some(c) => chunks_of(&s, c)?,
            None => self.backfill_chunks(&s, &file, &marker)?,
        };
        BlobSource::file(s.record, file, chunks, Some(marker))
    }

    /// [`FsStore::open_stored`] for a reader: the source kept from an earlier read of the
    /// same file when there is one (see [`crate::mapped`]), else opened — and kept, if worth it.
    fn open_for_reading(&self, s: StoredBlob) -> Result<BlobSource> {
        let i = &self.inner;
        if s.inline.is_some() {
            return self.open_stored(s);
        }
        let path = i.blob_path(&s.location);
        if let Some(src) = i.mapped.get(&s, &path) {
            return Ok(src);
        }
        if s.chunks.is_none() || !i.mapped.admits(&s) {
            return self.open_stored(s);
        }
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(_) => return self.open_stored(s),
        };
        let meta = file.metadata()?;
        let chunks = chunks_of(&s, s.chunks.as_deref().unwrap_or_default())?;
        let marker = self.marker(&s.record.name, &s.location);
        let src = BlobSource::file_with(s.record.clone(), file, chunks, Some(marker), true)?;
        // (Not mapped when the mapping was refused: then read as any file, and not kept.)
        if src.is_mapped() {
            i.mapped.keep(&s, &meta, &path, &src);
        }
        Ok(src)
    }

    /// Chunk digests for a blob committed before they existed: computed from the file in one
    /// pass that also checks the whole-blob digest, then kept.
    fn backfill_chunks(
        &self,
        s: &StoredBlob,
        file: &File,
        marker: &CorruptionMarker,
    ) -> Result<ChunkDigests> {
        let name = &s.record.name;
        let len = file.metadata()?.len();
        if len != s.record.size {
            return Err(StoreError::Corrupt {
                name: name.clone(),
                reason: format!("file holds {len} bytes, catalogue says {}", s.record.size),
            });
        }
        let algo = s.record.digest.parse::<Digest>().map(|d| d.algo).unwrap_or(self.inner.algo);
        let (whole, chunks) = digest_and_chunks(file, len, algo).map_err(StoreError::from)?;
        if whole.to_string() != s.record.digest {
            let reason =
                format!("whole-blob digest is {whole}, catalogue says {}", s.record.digest);
            crate::source::count_corruption(name, &reason);
            marker(&reason);
            return Err(StoreError::Corrupt { name: name.clone(), reason });
        }
        // Best effort: the blob was just checked whole; failing to note its chunk digests (a
        // full disk) only means the next reader checks it whole again.
        if let Err(e) = self.inner.cat.set_chunks(name, &s.location, &chunks.encode()) {
            tracing::warn!(blob = %name, error = %e, "cannot keep the chunk digests");
        }
        Ok(chunks)
    }

    /// What a reader calls when it finds `name` (stored at `location`) corrupt.
    fn marker(&self, name: &str, location: &str) -> CorruptionMarker {
        catalogued::marker(self.inner.cat.clone(), name, location)
    }
}

/// Where a range writer of a pending upload writes (see [`RangeWriter`]): its staging file.
/// Ranges are disjoint by the client's choice, and whatever they leave is checked as a whole
/// when the upload commits; while any is open the upload cannot be opened whole or aborted
/// (`Busy`).
struct FsRange {
    store: Arc<Inner>,
    name: String,
    /// The upload's id (its staging file).
    id: String,
    file: File,
    /// The chunk it is writing in order, hashed as written (see `written.rs`).
    tracker: Tracker,
}

impl Drop for FsRange {
    fn drop(&mut self) {
        // An upload replaced, deleted or expired while this writer ran (it began tracking it
        // again): nothing of it is wanted. Not on a catalogue error: forgetting the live
        // upload would drop the count of its other writers' writes still landing.
        let gone = match self.store.cat.upload(&self.name) {
            Ok(Some(u)) => u.upload_id != self.id,
            Ok(None) => true,
            Err(_) => false,
        };
        if gone {
            self.store.written.forget(&self.id);
        }
        self.store.range_writer_done(&self.name);
    }
}

impl RangeTarget for FsRange {
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let (store, name, file, id) = (&self.store, &self.name, &self.file, &self.id);
        store.written.write(id, offset, data, &mut self.tracker, |at, piece| {
            // Every byte may need new space: a range can land in a hole of the sparse file.
            store.write_staged(name, id, file, (at, piece), piece.len() as u64)
        })
    }

    fn truncate(&mut self, len: u64) {
        // Bytes past `len` stay in the file until rewritten; the commit's check keeps any
        // that are not from being committed.
        self.tracker.truncate(len);
    }
}

/// Where a pending upload's bytes wait for their commit.
enum Staged {
    File(File),
    /// A small blob's (see [`INLINE_UP_TO`]).
    Memory(Vec<u8>),
}

/// A pending upload open for writing.
struct FsUpload {
    store: Arc<Inner>,
    rec: UploadRecord,
    staged: Option<Staged>,
    received: u64,
    /// Chunk digests of the bytes written so far, while they were written in order from 0;
    /// `None` once a write or truncation broke that (then commit reads the file once).
    chunks: Option<ChunkHasher>,
    /// The chunk digests range writers recorded, while this writer has written nothing.
    written: Option<Written>,
    /// Chunk digests checked against the sender's (`commit_expecting`), for `commit`.
    checked: Option<ChunkDigests>,
}

impl Drop for FsUpload {
    fn drop(&mut self) {
        // Not committed, nothing written: what range writers vouched for still holds.
        if let Some(w) = self.written.take() {
            self.store.written.put_back(&self.rec.upload_id, w);
        }
        // A small blob's bytes not committed go to a staging file, where a resumed upload
        // finds them as it finds a larger one's (only on this path does it get a file).
        if let Some(Staged::Memory(held)) = self.staged.take()
            && !held.is_empty()
        {
            let path = self.store.staging_path(&self.rec.upload_id);
            let kept = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, &held));
            if let Err(e) = kept {
                let _ = fs::remove_file(&path);
                tracing::warn!(upload = %self.rec.name, error = %e, "an interrupted upload's bytes were not kept: it starts again");
            }
        }
        self.store.busy.release(&self.rec.name);
    }
}

impl FsUpload {
    /// On with the chunk digests for `data`, just written at `offset` of the staged file that
    /// held `before` bytes, if it continues them; else give up on them. The first chunk waits
    /// until bytes past it are written: a blob of one chunk takes its chunk digest from its
    /// whole digest at commit ([`ChunkDigests::from_whole`]), with no pass of its own; a
    /// longer one reads it back then (from the page cache, where it was just written).
    fn track_chunks(&mut self, before: u64, offset: u64, data: &[u8]) {
        let Some(c) = &mut self.chunks else { return };
        let end = offset + data.len() as u64;
        if offset != before {
            self.chunks = None;
            return;
        }
        if end <= CHUNK_SIZE && c.is_empty() {
            return; // the first chunk waits
        }
        if c.len() < offset {
            let Some(Staged::File(file)) = &self.staged else { return };
            let waiting =
                crate::store::read_file_range(file, c.len(), offset - c.len(), |p| c.update(p));
            if waiting.is_err() {
                self.chunks = None; // the commit reads the file instead
                return;
            }
        }
        c.update(data);
    }
}

impl UploadSink for FsUpload {
    fn size(&self) -> Option<u64> {
        self.rec.size
    }

    fn upload_id(&self) -> Option<&str> {
        Some(&self.rec.upload_id)
    }

    fn received(&self) -> u64 {
        self.received
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        check_write(self.rec.size, self.received, offset, data.len())?;
        // Written in order from 0: only bytes past what it holds take new space.
        let grows = (offset + data.len() as u64).saturating_sub(self.received);
        let (store, name, id) = (&self.store, &self.rec.name, &self.rec.upload_id);
        match self.staged.as_mut().expect("open until commit") {
            Staged::File(file) => store.write_staged(name, id, file, (offset, data), grows)?,
            Staged::Memory(held) => {
                store.check_space(name, grows)?;
                // Over what it holds (a rewrite, no gaps), then appended.
                let (at, end) = (offset as usize, offset as usize + data.len());
                let over = end.min(held.len()) - at;
                held[at..at + over].copy_from_slice(&data[..over]);
                held.extend_from_slice(&data[over..]);
                // Digested whole at commit.
                self.received = self.received.max(end as u64);
                return Ok(());
            }
        }
        let before = self.received;
        self.received = self.received.max(offset + data.len() as u64);
        self.written = None;
        self.track_chunks(before, offset, data);
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> Result<()> {
        if len < self.received {
            match self.staged.as_mut().expect("open until commit") {
                Staged::File(file) => file.set_len(len)?,
                Staged::Memory(held) => held.truncate(len as usize),
            }
            self.received = len;
            self.chunks = None;
            self.written = None;
        }
        Ok(())
    }

    fn commit_expecting(
        mut self: Box<Self>,
        expected: &Digest,
        sender: Option<&ChunkDigests>,
    ) -> Result<BlobRecord> {
        // Written by others: never trust this writer's tracked chunks or the given digest.
        self.chunks = None;
        let i = self.store.clone();
        match sender {
            // Each chunk, as the range writers saw it written or read back now, must be the
            // sender's; the sender's digest of the whole covers the same bytes.
            Some(sender) if expected.algo == i.algo => {
                check_complete(&self.rec.name, self.rec.size, self.received)?;
                let Some(Staged::File(file)) = self.staged.as_ref() else {
                    // Held in memory, written by this writer alone: digested whole at commit.
                    return self.commit(Some(expected.clone()));
                };
                let name = &self.rec.name;
                let written = self.written.as_ref();
                self.checked = Some(i.check_chunks(name, file, self.received, sender, written)?);
            }
            // Read back once, in either algorithm (counted there).
            _ => {}
        }
        self.commit(Some(expected.clone()))
    }

    fn commit(mut self: Box<Self>, whole: Option<Digest>) -> Result<BlobRecord> {
        let i = self.store.clone();
        let name = self.rec.name.clone();
        check_complete(&name, self.rec.size, self.received)?;
        let (overwrite, refuse) = (self.rec.overwrite, self.rec.refuse_digests.clone());
        catalogued::refuse_existing(&i.cat, &name, overwrite, &refuse)?;
        let staged = self.staged.take().expect("open until commit");
        let tracked = match self.checked.take() {
            Some(c) => Some(c),
            None => match self.chunks.take() {
                Some(c) if c.len() == self.received => Some(c.finish()),
                // Only the first chunk written, in order: its digest is in the whole one.
                Some(c) if c.is_empty() => {
                    whole.as_ref().and_then(|w| ChunkDigests::from_whole(self.received, w))
                }
                _ => None,
            },
        };
        let (digest, chunks) = match (whole, tracked, &staged) {
            (Some(d), Some(c), Staged::File(_)) if d.algo == i.algo => (d, c),
            (given, _, staged) => {
                // The given digest is checked in its own algorithm, in the same read.
                let also = given.as_ref().map(|g| g.algo).filter(|a| *a != i.algo);
                let (d, c, other) = match staged {
                    Staged::File(file) => {
                        i.read_back.fetch_add(self.received, Ordering::Relaxed);
                        digest_and_chunks_also(file, self.received, i.algo, also)?
                    }
                    Staged::Memory(held) => digest_and_chunks_of(held, i.algo, also),
                };
                let read_back =
                    |g: &Digest| if g.algo == i.algo { Some(&d) } else { other.as_ref() };
                if let Some(g) = given.as_ref()
                    && let Some(r) = read_back(g)
                    && r != g
                {
                    return Err(StoreError::Corrupt {
                        name,
                        reason: format!("staged bytes read back as {r}, {g} was written"),
                    });
                }
                (d, c)
            }
        };
        let id = self.rec.upload_id.clone();
        let dest = i.blob_path(&id);
        let inline = match staged {
            Staged::File(file) => {
                let shard = dest.parent().expect("blob paths have a shard directory");
                fs::create_dir_all(shard).map_err(StoreError::io_at(shard))?;
                // Renamed first, then the file and its directory fsynced: the same two syncs,
                // but a journaling file system commits the rename with the file's sync,
                // leaving the directory's sync little or nothing to do. Until the catalogue
                // row exists the file under blobs/ is unreferenced (removed at the next
                // start), so its being there before its bytes are durable exposes nothing.
                let staging = i.staging_path(&id);
                fs::rename(&staging, &dest).map_err(StoreError::io_at(&staging))?;
                let synced =
                    crate::sync_written(&file).and_then(|()| File::open(shard)?.sync_all());
                drop(file);
                if let Err(e) = synced {
                    let _ = fs::rename(&dest, &staging);
                    return Err(StoreError::io_at(&dest)(e));
                }
                None
            }
            Staged::Memory(held) => Some(Bytes::from(held)),
        };
        let record = BlobRecord {
            name: name.clone(),
            size: self.received,
            content_type: self.rec.content_type.clone(),
            digest: digest.to_string(),
            created_ms: now_ms(),
            metadata: self.rec.metadata.clone(),
        };
        let committed =
            i.cat.commit_blob(&record, &id, &chunks.encode(), inline.clone(), move |d| {
                may_replace(overwrite, &refuse, d)
            });
        if !matches!(committed, Ok(Commit::Done(_))) {
            // Back to staging, bytes the catalogue did not take (as they were).
            match inline {
                None => {
                    let _ = fs::rename(&dest, i.staging_path(&id));
                }
                held => self.staged = held.map(|b| Staged::Memory(Vec::from(b))),
            }
        }
        match committed {
            Ok(Commit::Done(Some(old))) => {
                let (inner, name) = (i.clone(), name.clone());
                remove_replaced(i.blob_path(&old), move || inner.mapped.forget(&name));
            }
            Ok(Commit::Done(None)) => {}
            Ok(Commit::Refused) => {
                // Another writer committed a blob this upload may not replace meanwhile (or
                // deleted the version it was to replace).
                return Err(crate::store::refused(&name, &self.rec.refuse_digests));
            }
            Err(e) => return Err(e.into()),
        }
        // The upload is the blob now: nothing of it to keep.
        self.written = None;
        i.mapped.forget(&name);
        i.listeners.notify(StoreEvent::Committed(record.clone()));
        Ok(record)
    }
}
