//! [`BlobProxy`]: the same operations on a blob wherever it lives — the factory's memory
//! store, a local file (read through mmap/pread, written to a `.blobstream-part` file renamed
//! into place on close), or a remote blobstream server (pulled and pushed over the data plane).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

use bs_client::{BlobInfo, Client, PullStream, PushStream};
use bs_store::{BlobSource, MemStore, Store, UploadSink, digest_file_range};
use bs_wire::{Digest, DigestAlgo};
use bytes::Bytes;

use crate::error::BlobError;
use crate::key::BlobKey;

type Result<T> = std::result::Result<T, BlobError>;

/// A handle on one blob, readable (from [`crate::Factory::bind`]) or writable (from
/// [`crate::Factory::route`]).
pub struct BlobProxy {
    key: BlobKey,
    slot: Slot,
    pos: u64,
    open: bool,
    /// Longest wait for a remote peer on one read or write, applied to every stream opened.
    io_limit: Option<Duration>,
}

pub(crate) enum Slot {
    /// Every byte read is checked against the blob's chunk digests (see [`BlobSource`]).
    MemRead {
        store: MemStore,
        src: BlobSource,
    },
    MemWrite {
        sink: Option<Box<dyn UploadSink>>,
        content_type: String,
        held: Held,
    },
    FileRead {
        file: File,
        size: u64,
    },
    FileWrite {
        part: PathBuf,
        dest: PathBuf,
        file: File,
        content_type: String,
    },
    RemoteRead {
        client: Client,
        info: BlobInfo,
        pull: Option<PullStream>,
    },
    RemoteWrite {
        client: Client,
        push: Option<PushStream>,
        /// The upload routed for this writer: its pushes are refused if another put of the
        /// name routed it again meanwhile (empty from a server that does not say).
        upload_id: String,
        size: Option<u64>,
        content_type: String,
        held: Held,
    },
}

/// What a writable destination already holds when it was routed with a resume tag.
#[derive(Debug, Clone, Default)]
pub(crate) struct Held {
    pub(crate) bytes: u64,
    pub(crate) digest: Option<Digest>,
}

/// A readable source as one contiguous slice, when it can be had without copying.
pub(crate) enum SliceSource {
    Bytes(Bytes),
    Map(memmap2::Mmap),
    Empty,
}

impl std::ops::Deref for SliceSource {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Self::Bytes(b) => b,
            Self::Map(m) => m,
            Self::Empty => &[],
        }
    }
}

impl SliceSource {
    /// Make `piece` (part of this source) safe to read: a mapped file's pages are faulted in
    /// first, so a file another program truncated meanwhile is an error here — where reading
    /// a page past its new end would kill the process with `SIGBUS`. Call just before the
    /// piece is read (hashed, sent); `name` names the file in the error.
    pub(crate) fn readable(&self, piece: &[u8], name: &str) -> Result<()> {
        match self {
            Self::Map(_) => match bs_store::populate(piece) {
                Ok(_) => Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => Err(BlobError::file(
                    name,
                    std::io::Error::other("it was truncated while being read"),
                )),
                Err(e) => Err(BlobError::file(name, e)),
            },
            _ => Ok(()),
        }
    }
}

/// The part file a local-file destination is written to before it is renamed into place.
pub fn part_path(dest: &std::path::Path) -> PathBuf {
    let mut p = dest.as_os_str().to_owned();
    p.push(PART_SUFFIX);
    PathBuf::from(p)
}

/// What [`part_path`] adds to a destination's name.
pub const PART_SUFFIX: &str = ".blobstream-part";

/// Is `path` a file this tool keeps beside a download in progress (its part file, or a
/// parallel pull's progress), not a file of the user's?
pub fn is_progress_file(path: &std::path::Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        let ranges = crate::ranges::RANGES_SUFFIX;
        // (The ranges file is written to `NAME.tmp` first, then renamed.)
        n.ends_with(PART_SUFFIX) || n.ends_with(ranges) || n.ends_with(&format!("{ranges}.tmp"))
    })
}

impl BlobProxy {
    pub(crate) fn new(key: BlobKey, slot: Slot) -> Self {
        Self { key, slot, pos: 0, open: true, io_limit: None }
    }

    pub(crate) fn slot(&self) -> &Slot {
        &self.slot
    }

    pub fn key(&self) -> &BlobKey {
        &self.key
    }

    /// True for proxies from `bind`, false for proxies from `route`.
    pub fn is_reader(&self) -> bool {
        matches!(self.slot, Slot::MemRead { .. } | Slot::FileRead { .. } | Slot::RemoteRead { .. })
    }

    /// Size in bytes: the blob's size for readers, bytes written so far for writers.
    pub fn size(&self) -> u64 {
        match &self.slot {
            Slot::MemRead { src, .. } => src.size(),
            Slot::FileRead { size, .. } => *size,
            Slot::RemoteRead { info, .. } => info.size,
            Slot::MemWrite { sink, .. } => sink.as_ref().map_or(0, |s| s.received()),
            Slot::FileWrite { file, .. } => file.metadata().map(|m| m.len()).unwrap_or(0),
            Slot::RemoteWrite { push, held, .. } => {
                push.as_ref().map_or(held.bytes, |p| p.position())
            }
        }
    }

    /// User metadata of a blob being read (a local file, and a writer, have none).
    pub fn metadata(&self) -> BTreeMap<String, String> {
        match &self.slot {
            Slot::MemRead { src, .. } => src.record().metadata.clone(),
            Slot::RemoteRead { info, .. } => {
                info.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
            }
            _ => BTreeMap::new(),
        }
    }

    /// MIME type (`application/octet-stream` when nobody said).
    pub fn content_type(&self) -> &str {
        let ct = match &self.slot {
            Slot::MemRead { src, .. } => src.record().content_type.as_str(),
            Slot::RemoteRead { info, .. } => info.content_type.as_str(),
            Slot::MemWrite { content_type, .. }
            | Slot::FileWrite { content_type, .. }
            | Slot::RemoteWrite { content_type, .. } => content_type.as_str(),
            // A local file's: the type its name suggests (application/octet-stream if none).
            Slot::FileRead { .. } => {
                let name = self.key.path().and_then(|p| p.file_name().map(|n| n.to_owned()));
                return name.map_or("application/octet-stream", |n| {
                    bs_store::guess_content_type(&n.to_string_lossy())
                });
            }
        };
        if ct.is_empty() { "application/octet-stream" } else { ct }
    }

    /// Stored digest of the whole blob (readers of memory and remote blobs).
    pub fn digest(&self) -> Option<&str> {
        match &self.slot {
            Slot::MemRead { src, .. } => Some(&src.record().digest),
            Slot::RemoteRead { info, .. } => Some(&info.digest),
            _ => None,
        }
    }

    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Move the position. Readers: anywhere up to the size. Writers: anywhere up to what has
    /// been written (no gaps).
    pub fn seek(&mut self, pos: u64) -> Result<()> {
        let limit = self.size();
        if pos > limit {
            return Err(BlobError::InvalidKey {
                key: self.key.to_string(),
                reason: format!("seek to {pos} is past {limit} bytes"),
            });
        }
        if pos != self.pos {
            match &mut self.slot {
                Slot::RemoteRead { pull, .. } => *pull = None,
                Slot::RemoteWrite { push: Some(_), .. } => {
                    return Err(self.state_err("mid-push", "seek", "between pushes"));
                }
                _ => {}
            }
        }
        self.pos = pos;
        Ok(())
    }

    fn state_err(
        &self,
        state: &'static str,
        wanted: &'static str,
        needed: &'static str,
    ) -> BlobError {
        BlobError::WrongState { key: self.key.to_string(), state, wanted, needed }
    }

    fn ensure_open(&self, wanted: &'static str) -> Result<()> {
        if self.open { Ok(()) } else { Err(self.state_err("closed", wanted, "open")) }
    }

    /// Read at the position into `buf`; returns the bytes read, 0 at the end. Remote reads
    /// verify the transfer's digest when they reach the end.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        self.ensure_open("read")?;
        let pos = self.pos;
        let n = match &mut self.slot {
            Slot::MemRead { src, .. } => src.read_at(buf, pos)?,
            Slot::FileRead { file, .. } => {
                file.read_at(buf, pos).map_err(|e| BlobError::file(self.key.name(), e))?
            }
            Slot::RemoteRead { client, info, pull } => {
                if pos >= info.size {
                    if let Some(p) = pull {
                        p.verify()?;
                    }
                    return Ok(0);
                }
                if pull.is_none() {
                    let c = self.io_limit.map_or_else(|| client.clone(), |t| client.within(t));
                    let p = c.open_pull(&info.name, pos, None)?;
                    if p.info().digest != info.digest {
                        // Overwritten since bound: never hand out a mix of two versions.
                        return Err(BlobError::NotFound(format!(
                            "blob {} changed since it was opened; open it again",
                            self.key
                        )));
                    }
                    if let Some(t) = self.io_limit {
                        p.set_io_timeout(t)?;
                    }
                    *pull = Some(p);
                }
                pull.as_mut().expect("just opened").read(buf)?
            }
            _ => return Err(self.state_err("a writer", "read", "a reader")),
        };
        self.pos += n as u64;
        Ok(n)
    }

    /// Write `data` at the position.
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        self.ensure_open("write")?;
        let pos = self.pos;
        match &mut self.slot {
            Slot::MemWrite { sink, .. } => sink.as_mut().expect("open").write_at(pos, data)?,
            Slot::FileWrite { file, part, .. } => {
                file.write_all_at(data, pos).map_err(|e| BlobError::file(part.clone(), e))?;
                bs_store::start_writeback(file, pos, data.len() as u64);
            }
            Slot::RemoteWrite { client, push, size, upload_id, .. } => {
                if push.is_none() {
                    let len = size.map(|s| s.saturating_sub(pos));
                    let c = self.io_limit.map_or_else(|| client.clone(), |t| client.within(t));
                    let p = c.open_push_into(self.key.name(), upload_id, pos, len)?;
                    if let Some(t) = self.io_limit {
                        p.set_io_timeout(t)?;
                    }
                    *push = Some(p);
                }
                push.as_mut().expect("just opened").write(data)?;
            }
            _ => return Err(self.state_err("a reader", "write", "a writer")),
        }
        self.pos += data.len() as u64;
        Ok(())
    }

    /// Finish: writers make the blob visible (memory commit, file fsync + rename, remote push
    /// confirmed end to end); readers let go of their resources.
    pub fn close(&mut self) -> Result<()> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        match &mut self.slot {
            Slot::MemWrite { sink, .. } => {
                sink.take().expect("open").commit(None)?;
            }
            Slot::FileWrite { part, dest, file, .. } => {
                bs_store::sync_written(file).map_err(|e| BlobError::file(part.clone(), e))?;
                // The file it replaces keeps its permission bits (a part file continued from
                // an earlier run was made before the file it replaces, or with others).
                if let Some(mode) = existing_mode(dest) {
                    use std::os::unix::fs::PermissionsExt;
                    file.set_permissions(std::fs::Permissions::from_mode(mode))
                        .map_err(|e| BlobError::file(part.clone(), e))?;
                }
                std::fs::rename(&*part, &*dest).map_err(|e| BlobError::file(dest.clone(), e))?;
                // Progress of an earlier parallel copy into the same file is moot now.
                let _ = std::fs::remove_file(crate::ranges::ranges_path(dest));
            }
            Slot::RemoteWrite { client, push, upload_id, .. } => match push.take() {
                Some(p) => {
                    p.finish(true)?;
                }
                None => {
                    // Nothing written in this session: commit what the upload holds.
                    let c = self.io_limit.map_or_else(|| client.clone(), |t| client.within(t));
                    let p = c.open_push_into(self.key.name(), upload_id, self.pos, Some(0))?;
                    if let Some(t) = self.io_limit {
                        p.set_io_timeout(t)?;
                    }
                    p.finish(true)?;
                }
            },
            Slot::RemoteRead { pull, .. } => *pull = None,
            Slot::MemRead { .. } | Slot::FileRead { .. } => {}
        }
        Ok(())
    }

    /// Re-open a closed reader (re-reading its blob's current state).
    pub fn open(&mut self) -> Result<()> {
        if self.open {
            return Ok(());
        }
        match &mut self.slot {
            Slot::MemRead { store, src } => *src = store.open_read(&src.record().name)?,
            Slot::RemoteRead { client, info, .. } => *info = client.stat(&info.name)?,
            Slot::FileRead { .. } => {}
            _ => return Err(self.state_err("a closed writer", "open", "a reader")),
        }
        self.pos = 0;
        self.open = true;
        Ok(())
    }

    // ---- crate-private hooks for the transporter's fast paths ----

    /// Advance the position past bytes written behind the proxy's back (by the kernel).
    pub(crate) fn seek_unchecked(&mut self, pos: u64) {
        self.pos = pos;
    }

    /// The whole source as one slice, when that costs no copy (memory, or a mapped file).
    pub(crate) fn slice(&self) -> Result<Option<SliceSource>> {
        Ok(match &self.slot {
            Slot::MemRead { src, .. } => Some(SliceSource::Bytes(src.all()?)),
            Slot::FileRead { size: 0, .. } => Some(SliceSource::Empty),
            Slot::FileRead { file, .. } => {
                // SAFETY: the map is read-only and lives only for this copy; a concurrent
                // truncation by another program would fault, as with any mmap reader.
                let map = unsafe { memmap2::Mmap::map(file) }
                    .map_err(|e| BlobError::file(self.key.name(), e))?;
                Some(SliceSource::Map(map))
            }
            _ => None,
        })
    }

    /// The client and blob behind a remote reader.
    pub(crate) fn remote(&self) -> Option<(&Client, &BlobInfo)> {
        match &self.slot {
            Slot::RemoteRead { client, info, .. } => Some((client, info)),
            _ => None,
        }
    }

    /// The client behind a remote writer, and the upload its route answered.
    pub(crate) fn remote_writer(&self) -> Option<(&Client, &str)> {
        match &self.slot {
            Slot::RemoteWrite { client, push: None, upload_id, .. } => Some((client, upload_id)),
            _ => None,
        }
    }

    /// A writer whose blob was committed behind its back (by a parallel push): closed, with
    /// nothing left to do.
    pub(crate) fn committed_elsewhere(&mut self, size: u64) {
        self.pos = size;
        self.open = false;
    }

    /// A local writer's part file and the path it becomes.
    pub(crate) fn file_dest(&self) -> Option<(&File, &std::path::Path)> {
        match &self.slot {
            Slot::FileWrite { file, dest, .. } => Some((file, dest)),
            _ => None,
        }
    }

    /// The file behind a local reader or writer.
    pub(crate) fn local_file(&self) -> Option<&File> {
        match &self.slot {
            Slot::FileRead { file, .. } | Slot::FileWrite { file, .. } => Some(file),
            _ => None,
        }
    }

    /// Lower the per-read/-write wait of remote streams, open now or later (to meet a deadline).
    pub(crate) fn limit_io(&mut self, t: Duration) -> Result<()> {
        self.io_limit = Some(t);
        match &self.slot {
            Slot::RemoteRead { pull: Some(p), .. } => p.set_io_timeout(t)?,
            Slot::RemoteWrite { push: Some(p), .. } => p.set_io_timeout(t)?,
            _ => {}
        }
        Ok(())
    }

    /// Bytes a writer already holds from an earlier, interrupted copy, with their digest.
    pub(crate) fn held(&self, algo: DigestAlgo) -> Result<Held> {
        match &self.slot {
            Slot::MemWrite { held, .. } | Slot::RemoteWrite { held, .. } => Ok(held.clone()),
            Slot::FileWrite { file, part, .. } => {
                let bytes = file.metadata().map_err(|e| BlobError::file(part.clone(), e))?.len();
                let digest = (bytes > 0)
                    .then(|| digest_file_range(file, 0, bytes, algo))
                    .transpose()
                    .map_err(|e| BlobError::file(part.clone(), e))?;
                Ok(Held { bytes, digest })
            }
            _ => Ok(Held::default()),
        }
    }

    /// Digest of the first `len` bytes of a reader.
    pub(crate) fn prefix_digest(&self, len: u64, algo: DigestAlgo) -> Result<Digest> {
        match &self.slot {
            Slot::RemoteRead { client, info, .. } => {
                Ok(client.range_digest(&info.name, 0, len, algo)?)
            }
            _ => {
                let s = self.slice()?.expect("local readers are slices");
                let piece = &s[..len as usize];
                s.readable(piece, self.key.name())?;
                Ok(algo.digest(piece))
            }
        }
    }
}

impl std::fmt::Debug for BlobProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobProxy")
            .field("key", &self.key.to_string())
            .field("pos", &self.pos)
            .finish()
    }
}

/// The permission bits of the regular file at `dest`, if there is one.
fn existing_mode(dest: &std::path::Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let m = std::fs::metadata(dest).ok().filter(|m| m.is_file())?;
    Some(m.permissions().mode() & 0o7777)
}

/// Open (creating or continuing) the part file of a local destination, locked for this
/// download alone (an exclusive lock held while the file is open): a second download into the
/// same file — another `get -r` into the same folder — is refused, rather than both writing
/// one part file and one renaming the other's into place.
pub(crate) fn open_part(dest: &std::path::Path, keep: bool) -> Result<(PathBuf, File)> {
    use crate::partlock::{PartLock, lock_part};
    let part = part_path(dest);
    // Twice at most: a part file the download before this one renamed into place between
    // our open and our lock is not ours to write (the second open makes a new one).
    for _ in 0..2 {
        // A file being replaced keeps its permission bits, as cp(1) keeps them: a private
        // file's new bytes are private from the first one.
        let mode = existing_mode(dest).unwrap_or(0o666);
        let mut options = OpenOptions::new();
        options.create(true).read(true).write(true).truncate(false).mode(mode);
        match lock_part(&part, &options).map_err(|e| BlobError::file(part.clone(), e))? {
            PartLock::Ours(file) => {
                // Emptied only once it is ours.
                if !keep {
                    file.set_len(0).map_err(|e| BlobError::file(part.clone(), e))?;
                }
                return Ok((part, file));
            }
            PartLock::Held => {
                let why = format!("another download into {} is running", dest.display());
                let e = std::io::Error::new(std::io::ErrorKind::ResourceBusy, why);
                return Err(BlobError::file(part, e));
            }
            PartLock::Replaced => continue,
        }
    }
    let why = format!("another download into {} keeps replacing its part file", dest.display());
    Err(BlobError::file(part, std::io::Error::new(std::io::ErrorKind::ResourceBusy, why)))
}
