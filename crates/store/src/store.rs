//! The store interface every backend implements, and the types it trades in.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use bs_meta::BlobRecord;
use bs_wire::{ChunkDigests, ChunkHasher, Digest, DigestAlgo};

use crate::error::StoreError;
use crate::source::BlobSource;

type Result<T> = std::result::Result<T, StoreError>;

/// What `route` reserves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteSpec {
    pub name: String,
    /// `None`: unknown size (streaming); committed when the writer says it is done.
    pub size: Option<u64>,
    pub content_type: String,
    pub metadata: BTreeMap<String, String>,
    /// Replace an existing blob of the same name on commit.
    pub overwrite: bool,
    /// With `overwrite`: still do not replace a blob whose digest is one of these (HTTP
    /// `If-None-Match` with ETags); an entry [`REQUIRE_DIGEST`]`DIGEST` instead names a
    /// digest the blob replaced must have (HTTP `If-Match`): with such entries, only a blob of
    /// one of their digests is replaced. Checked atomically with the commit; a refusal is
    /// [`StoreError::AlreadyExists`].
    pub refuse_digests: Vec<String>,
    /// Non-empty: resume a pending upload with the same name, size and tag.
    pub resume_tag: String,
}

impl RouteSpec {
    /// The pending-upload row this reservation becomes, under a fresh `upload_id`.
    pub(crate) fn upload_record(&self, upload_id: String) -> bs_meta::UploadRecord {
        bs_meta::UploadRecord {
            name: self.name.clone(),
            upload_id,
            size: self.size,
            content_type: self.content_type.clone(),
            metadata: self.metadata.clone(),
            overwrite: self.overwrite,
            refuse_digests: self.refuse_digests.clone(),
            resume_tag: self.resume_tag.clone(),
            created_ms: bs_meta::now_ms(),
        }
    }
}

/// Result of `route`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// The pending upload routed (see [`UploadSink::upload_id`]).
    pub upload_id: String,
    /// Bytes already held (non-zero only when resumed).
    pub received: u64,
    /// Digest of those bytes, in the store's algorithm.
    pub received_digest: Option<Digest>,
    pub resumed: bool,
}

/// Digest of `len` bytes of `file` from `offset`, read in 1 MiB pieces.
pub fn digest_file_range(
    file: &File,
    offset: u64,
    len: u64,
    algo: DigestAlgo,
) -> std::io::Result<Digest> {
    let mut h = algo.hasher();
    read_file_range(file, offset, len, |piece| h.update(piece))?;
    Ok(h.finish())
}

/// Whole-blob digest and chunk digests of the first `len` bytes of `file`, in one pass.
pub(crate) fn digest_and_chunks(
    file: &File,
    len: u64,
    algo: DigestAlgo,
) -> std::io::Result<(Digest, ChunkDigests)> {
    let (d, c, _) = digest_and_chunks_also(file, len, algo, None)?;
    Ok((d, c))
}

/// [`digest_and_chunks`], and in the same pass the digest in `also` (a writer's digest in
/// another algorithm, to check the bytes against).
pub(crate) fn digest_and_chunks_also(
    file: &File,
    len: u64,
    algo: DigestAlgo,
    also: Option<DigestAlgo>,
) -> std::io::Result<(Digest, ChunkDigests, Option<Digest>)> {
    digests_of(len, algo, also, |each| read_file_range(file, 0, len, each))
}

/// [`digest_and_chunks_also`] of bytes in memory.
pub(crate) fn digest_and_chunks_of(
    data: &[u8],
    algo: DigestAlgo,
    also: Option<DigestAlgo>,
) -> (Digest, ChunkDigests, Option<Digest>) {
    let fed = digests_of(data.len() as u64, algo, also, |each| {
        each(data);
        Ok(())
    });
    fed.expect("bytes in memory cannot fail to be read")
}

/// The digests of the `len` bytes `feed` hands its callback, in order. A blob of one chunk
/// takes its chunk digest from its whole digest ([`ChunkDigests::from_whole`]), where it can.
fn digests_of(
    len: u64,
    algo: DigestAlgo,
    also: Option<DigestAlgo>,
    feed: impl FnOnce(&mut dyn FnMut(&[u8])) -> std::io::Result<()>,
) -> std::io::Result<(Digest, ChunkDigests, Option<Digest>)> {
    let mut h = algo.hasher();
    let mut c = (!ChunkDigests::from_whole_covers(len, algo)).then(ChunkHasher::new);
    let mut other = also.map(|a| a.hasher());
    feed(&mut |piece| {
        h.update(piece);
        if let Some(c) = &mut c {
            c.update(piece);
        }
        if let Some(o) = &mut other {
            o.update(piece);
        }
    })?;
    let whole = h.finish();
    let chunks = match c {
        Some(c) => c.finish(),
        None => ChunkDigests::from_whole(len, &whole).expect("one chunk of xxh3-128"),
    };
    Ok((whole, chunks, other.map(|o| o.finish())))
}

/// Feed `len` bytes of `file` from `offset` to `f`, in order, in 1 MiB pieces.
pub(crate) fn read_file_range(
    file: &File,
    offset: u64,
    len: u64,
    mut f: impl FnMut(&[u8]),
) -> std::io::Result<()> {
    let mut buf = vec![0u8; (1 << 20).min(len as usize).max(1)];
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(buf.len() as u64) as usize;
        let n = file.read_at(&mut buf[..want], offset + done)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("file ends after {done} of {len} bytes"),
            ));
        }
        f(&buf[..n]);
        done += n as u64;
    }
    Ok(())
}

/// Digests of consecutive `piece`-byte pieces of `offset..offset + len` of `file`, as far as
/// the file goes (a last, shorter piece only where the range ends).
pub(crate) fn piece_digests(
    file: &File,
    offset: u64,
    len: u64,
    piece: u64,
    algo: DigestAlgo,
) -> std::io::Result<Vec<Digest>> {
    let piece = piece.max(1);
    let covered = covered(offset, len, piece, file.metadata()?.len());
    // One read of the range through one buffer, a digest finished at each piece's end.
    let mut out = Vec::new();
    let mut h = algo.hasher();
    let mut in_piece = 0u64;
    read_file_range(file, offset, covered, |mut bytes| {
        while !bytes.is_empty() {
            let take = ((piece - in_piece) as usize).min(bytes.len());
            h.update(&bytes[..take]);
            in_piece += take as u64;
            bytes = &bytes[take..];
            if in_piece == piece {
                out.push(std::mem::replace(&mut h, algo.hasher()).finish());
                in_piece = 0;
            }
        }
    })?;
    if in_piece > 0 {
        out.push(h.finish());
    }
    Ok(out)
}

/// [`piece_digests`] of bytes held in memory (`held`, from the upload's start).
pub(crate) fn piece_digests_of(
    held: &[u8],
    offset: u64,
    len: u64,
    piece: u64,
    algo: DigestAlgo,
) -> Vec<Digest> {
    let piece = piece.max(1);
    let covered = covered(offset, len, piece, held.len() as u64);
    let Some(range) = held.get(offset as usize..(offset + covered) as usize) else {
        return Vec::new();
    };
    range.chunks(piece as usize).map(|p| algo.digest(p)).collect()
}

/// How many bytes from `offset` the piece digests of `offset..offset + len` cover when
/// `held` bytes are held: whole pieces only, but for a last, shorter one where the range
/// itself ends.
fn covered(offset: u64, len: u64, piece: u64, held: u64) -> u64 {
    let end = offset.saturating_add(len);
    let upto = end.min(held);
    if upto == end {
        upto - offset.min(upto)
    } else {
        (upto.saturating_sub(offset) / piece) * piece
    }
}

/// A pending upload opened for writing by one transfer at a time.
pub trait UploadSink: Send {
    /// Declared size, if known.
    fn size(&self) -> Option<u64>;
    /// Which pending upload this is (as [`Routed::upload_id`] named it when it was routed),
    /// where the store tells.
    fn upload_id(&self) -> Option<&str> {
        None
    }
    /// Bytes held so far: always a contiguous prefix of the blob.
    fn received(&self) -> u64;
    /// Write at `offset`, which must not be past `received()` (no gaps).
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()>;
    /// Lend the upload's own memory for `offset..offset + len`, so a receiver can read from
    /// the socket straight into the store with no intermediate copy, appending. Only uploads
    /// of known size gathered in memory can (the memory store's; the object store's, within
    /// the part being filled, whose buffer goes up once full); others, and a range that
    /// crosses a part's end, return `None` (use `write_at`). After filling, report how many
    /// bytes arrived with [`UploadSink::filled`] (a part it fills is sent then; an error
    /// sending it comes from the next write or the commit).
    fn lend(&mut self, _offset: u64, _len: u64) -> Option<&mut [u8]> {
        None
    }
    /// `n` bytes from `offset` were filled into memory lent by [`UploadSink::lend`].
    fn filled(&mut self, _offset: u64, _n: u64) {}
    /// Forget every byte from `len` on (a transfer whose checksum failed is rolled back so no
    /// unverified byte stays behind). No-op if `len >= received()`.
    fn truncate(&mut self, len: u64) -> Result<()>;
    /// Make the upload a visible blob: durable first, then the catalogue. `whole` is the digest
    /// of every byte, if the caller computed it in the store's algorithm; otherwise the store
    /// computes it. Fails with `Incomplete` if a declared size was not reached.
    fn commit(self: Box<Self>, whole: Option<Digest>) -> Result<BlobRecord>;
    /// Commit bytes written by others (range writers) whose digest only the sender knows, only
    /// if they are the sender's: with the sender's chunk digests (`sender`, and `expected` in
    /// the store's algorithm), every chunk must equal the sender's — as a range writer saw it
    /// written, or read back where none could tell — and `expected` is kept as the digest of
    /// the whole; otherwise the upload is read back and must have the digest `expected` (in
    /// any algorithm). A mismatch is [`StoreError::Corrupt`] and commits nothing. A store
    /// that takes no range writers refuses.
    fn commit_expecting(
        self: Box<Self>,
        expected: &Digest,
        sender: Option<&ChunkDigests>,
    ) -> Result<BlobRecord> {
        let _ = (expected, sender);
        Err(StoreError::Unsupported(
            "this store takes one writer per upload: its upload is committed by that writer's \
             final transfer, not by Commit"
                .into(),
        ))
    }
}

/// Where one store's range writer puts its bytes (see [`RangeWriter`]).
pub(crate) trait RangeTarget: Send {
    /// Write `data` at `offset` (inside the declared size, continuing what this writer wrote).
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<()>;
    /// The writer goes back to `len`: bytes from there are written again.
    fn truncate(&mut self, _len: u64) {}
}

/// One range of a pending upload of declared size, written next to other ranges (see
/// [`Store::open_upload_range`]), by the rules every store's range writers share: writes
/// continue what this writer wrote (no gaps) and stay inside the declared size; bytes past a
/// rollback stay until written again (the commit checks every byte against the sender's);
/// it cannot commit.
pub(crate) struct RangeWriter<T> {
    pub name: String,
    /// The upload's id.
    pub id: String,
    pub size: u64,
    /// The next byte this writer expects (its range's start, then as written).
    pub received: u64,
    pub target: T,
}

impl<T: RangeTarget> UploadSink for RangeWriter<T> {
    fn size(&self) -> Option<u64> {
        Some(self.size)
    }

    fn upload_id(&self) -> Option<&str> {
        Some(&self.id)
    }

    fn received(&self) -> u64 {
        self.received
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        check_write(Some(self.size), self.received, offset, data.len())?;
        self.target.write(offset, data)?;
        self.received = self.received.max(offset + data.len() as u64);
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> Result<()> {
        self.received = self.received.min(len);
        self.target.truncate(len);
        Ok(())
    }

    fn commit(self: Box<Self>, _whole: Option<Digest>) -> Result<BlobRecord> {
        Err(StoreError::Unsupported(format!(
            "a range writer of {:?} cannot commit: commit the upload once every range is written",
            self.name
        )))
    }
}

/// The declared size of the upload `name` a range writer from `start` opens (`kept_whole`:
/// the store keeps it in its catalogue row, so it takes one writer).
pub(crate) fn range_size(
    name: &str,
    size: Option<u64>,
    start: u64,
    kept_whole: bool,
) -> Result<u64> {
    let Some(size) = size else {
        return Err(StoreError::Unsupported(format!(
            "the upload of {name:?} has no declared size: it takes one writer"
        )));
    };
    if kept_whole {
        return Err(StoreError::Unsupported(format!(
            "the upload of {name:?} ({size} bytes) is kept whole for its catalogue row: it \
             takes one writer"
        )));
    }
    if start > size {
        return Err(StoreError::BeyondSize { offset: start, len: 0, size });
    }
    Ok(size)
}

/// A place blobs live. All methods block; call them off the async executor.
pub trait Store: Send + Sync + 'static {
    /// Short description for logs ("fs:/var/lib/blobstream", "memory").
    fn describe(&self) -> String;
    /// Algorithm of the digests this store keeps.
    fn digest_algo(&self) -> DigestAlgo;
    fn stat(&self, name: &str) -> Result<BlobRecord>;
    /// Why `name` is marked corrupt (a reader or the scrubber found a chunk that does not
    /// match: readers are refused until it is restored), or `None`; `NotFound` as `stat`.
    fn corrupt_mark(&self, name: &str) -> Result<Option<String>>;
    /// (name, why) of the blobs among `names` marked corrupt: the marks of a page of a
    /// listing, in one look-up.
    fn corrupt_marks(&self, names: &[String]) -> Result<Vec<(String, String)>>;
    /// Up to `limit` blobs starting with `prefix` whose names sort after `after`.
    fn list(&self, prefix: &str, after: &str, limit: usize) -> Result<Vec<BlobRecord>>;
    fn delete(&self, name: &str) -> Result<()>;
    /// Reserve a new blob or resume a pending one.
    fn route(&self, spec: &RouteSpec) -> Result<Routed>;
    /// Open the pending upload of `name` for one writer.
    fn open_upload(&self, name: &str) -> Result<Box<dyn UploadSink>>;
    /// Open the pending upload of `name` (of declared size) for a writer of bytes from
    /// `start` on, next to writers of other ranges (one blob over several connections). Its
    /// `received` starts at `start`; writes stay inside the declared size; it cannot commit:
    /// once every range is written, [`Store::open_upload`] and
    /// [`UploadSink::commit_expecting`] do. `Ok(None)` where the store cannot (see
    /// [`Store::takes_range_writes`]).
    fn open_upload_range(&self, _name: &str, _start: u64) -> Result<Option<Box<dyn UploadSink>>> {
        Ok(None)
    }
    /// Whether [`Store::open_upload_range`] works here.
    fn takes_range_writes(&self) -> bool {
        false
    }
    /// Digests of consecutive `piece`-byte pieces of `offset..offset + len` of what the
    /// pending upload of `name` holds, as far as it holds them (a last, shorter piece only
    /// where the range ends; bytes no writer wrote read as zeros): how much of each range a
    /// resumed parallel push keeps. `Ok(None)` where the store takes one writer per upload.
    fn upload_piece_digests(
        &self,
        _name: &str,
        _offset: u64,
        _len: u64,
        _piece: u64,
        _algo: DigestAlgo,
    ) -> Result<Option<Vec<Digest>>> {
        Ok(None)
    }
    /// Discard the pending upload of `name`.
    fn abort(&self, name: &str) -> Result<()>;
    /// Open a committed blob for reading. Every byte read through the source is verified
    /// against the blob's chunk digests; a blob already known to be corrupt is refused with
    /// [`StoreError::Corrupt`] at once.
    fn open_read(&self, name: &str) -> Result<BlobSource>;
    /// [`Store::open_read`] if it takes no waiting — no network read, no lock another reader
    /// holds, no file to open; only a catalogue lookup (SQLite, whose pages are normally in
    /// memory) — for a caller on an async executor, which saves a trip to a thread it may
    /// block. `None`: it would wait, or this store cannot tell; the caller then calls
    /// `open_read` where it may block. Reading the source may still wait: see
    /// [`BlobSource::resident`].
    fn open_read_at_once(&self, _name: &str) -> Option<Result<BlobSource>> {
        None
    }
    /// Re-read every byte of `name` and check it (the scrubber's step), calling `pace` with
    /// the bytes of each chunk read (it may stop the check: then `Ok(false)`). A bad blob is
    /// marked corrupt; a blob marked corrupt that now reads back whole (restored) is cleared.
    fn scrub_blob(&self, name: &str, pace: &mut dyn FnMut(u64) -> bool) -> Result<bool> {
        let src = self.open_read(name)?;
        src.verify_paced(0, src.size(), pace)
    }
    /// Hear of every commit and delete from now on (see [`crate::StoreEvent`]).
    fn subscribe(&self, listener: crate::Listener);
    /// Discard pending uploads routed more than `age` ago that no transfer is writing right
    /// now; returns their names.
    fn expire_uploads(&self, age: std::time::Duration) -> Result<Vec<String>>;
}

/// Open the upload `spec` routed, for a writer that routed it itself a moment ago. A name has
/// one pending upload, and another put of it routed in between takes it over: that upload
/// (another id, where the store tells; else another declared size) is that put's to write,
/// so this writer is told [`StoreError::Busy`] (not handed it, to fill with its own bytes
/// under the other put's metadata and flags, or be refused as short or long at commit).
pub fn open_routed(
    store: &dyn Store,
    spec: &RouteSpec,
    routed: &Routed,
) -> Result<Box<dyn UploadSink>> {
    let sink = store.open_upload(&spec.name)?;
    if !is_routed(&*sink, &routed.upload_id) || sink.size() != spec.size {
        return Err(StoreError::Busy(spec.name.clone()));
    }
    Ok(sink)
}

/// Whether `sink` is the pending upload `upload_id` names (as far as its store tells).
pub fn is_routed(sink: &dyn UploadSink, upload_id: &str) -> bool {
    sink.upload_id().is_none_or(|id| id == upload_id)
}

/// What marks an entry of [`RouteSpec::refuse_digests`] as a digest the replaced blob must
/// have (no digest begins with it); alone, it asks for a blob of any digest to be there.
pub const REQUIRE_DIGEST: &str = "=";

/// Whether an upload routed with `overwrite` and `refuse` may replace a blob of `digest`.
pub(crate) fn may_replace(overwrite: bool, refuse: &[String], digest: Option<&str>) -> bool {
    let mut required = refuse.iter().filter_map(|r| r.strip_prefix(REQUIRE_DIGEST)).peekable();
    let Some(digest) = digest else {
        // Nothing there: a commit that must replace a version (one that was deleted while the
        // upload ran) makes nothing anew.
        return required.peek().is_none();
    };
    let required_ok = required.peek().is_none() || required.any(|r| r.is_empty() || r == digest);
    overwrite && required_ok && !refuse.iter().any(|r| r == digest)
}

/// The error of a write `may_replace` refused: the blob there may not be replaced, or the
/// version the write asked for (`REQUIRE_DIGEST` entries of `refuse`) is not there.
pub(crate) fn refused(name: &str, refuse: &[String]) -> StoreError {
    if refuse.iter().any(|r| r.starts_with(REQUIRE_DIGEST)) {
        StoreError::ConditionFailed(name.to_string())
    } else {
        StoreError::AlreadyExists(name.to_string())
    }
}

/// Shared check for the write path: no gaps, no writing past a declared size.
pub(crate) fn check_write(size: Option<u64>, received: u64, offset: u64, len: usize) -> Result<()> {
    if offset > received {
        return Err(StoreError::Gap { offset, received });
    }
    if let Some(size) = size
        && offset.checked_add(len as u64).is_none_or(|end| end > size)
    {
        return Err(StoreError::BeyondSize { offset, len: len as u64, size });
    }
    Ok(())
}

/// Shared check for commit: a declared size must have been reached.
pub(crate) fn check_complete(name: &str, size: Option<u64>, received: u64) -> Result<()> {
    match size {
        Some(size) if received != size => {
            Err(StoreError::Incomplete { name: name.to_string(), received, size })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn piece_digests_stop_where_the_file_ends_inside_a_piece() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..250u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let f = File::open(&path).unwrap();
        let algo = DigestAlgo::default();
        let d = |a: usize, b: usize| algo.digest(&bytes[a..b]);
        // The same rule for a file and for bytes in memory.
        let both = |offset, len| {
            let in_file = piece_digests(&f, offset, len, 100, algo).unwrap();
            assert_eq!(in_file, piece_digests_of(&bytes, offset, len, 100, algo));
            in_file
        };
        // The range ends with the file: its last, shorter piece counts.
        assert_eq!(both(0, 250), [d(0, 100), d(100, 200), d(200, 250)]);
        // The range goes on past the file: the piece the file ends inside does not.
        assert_eq!(both(0, 400), [d(0, 100), d(100, 200)]);
        assert_eq!(both(50, 100), [d(50, 150)]);
        assert!(both(300, 100).is_empty());
    }
}
