//! The memory store: blobs as shared [`Bytes`], for tests, caches and benchmarks. Same
//! semantics as the filesystem store (names, routing, resume, gaps, commit, range writers),
//! no durability. An optional capacity makes it report `StorageFull` like a full disk.
//!
//! Range writers (one blob over several connections) share the upload's buffer, reserved
//! at its declared size; `Commit` reads it back once and commits it only if its digest is
//! the sender's (bytes no writer wrote read as zeros).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use bs_meta::{BlobRecord, UploadRecord, now_ms};
use bs_wire::{CHUNK_SIZE, ChunkDigests, ChunkHasher, Digest, DigestAlgo};
use bytes::Bytes;

use crate::error::StoreError;
use crate::events::{Listener, Listeners, StoreEvent};
use crate::name::validate_name;
use crate::source::{BlobSource, CorruptionMarker};
use crate::store::{
    RangeTarget, RangeWriter, RouteSpec, Routed, Store, UploadSink, check_complete, check_write,
    may_replace, range_size,
};

type Result<T> = std::result::Result<T, StoreError>;

/// Blobs held in memory.
#[derive(Clone, Default)]
pub struct MemStore {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    blobs: RwLock<BTreeMap<String, MemBlob>>,
    uploads: Mutex<HashMap<String, Pending>>,
    capacity: Option<u64>,
    listeners: Listeners,
}

/// A committed blob: its bytes, record, chunk digests, and why it is corrupt, if it is.
struct MemBlob {
    bytes: Bytes,
    record: BlobRecord,
    chunks: ChunkDigests,
    /// Set by a reader that found a bad chunk; `id` tells this blob from a replacement.
    corrupt: Option<String>,
    id: String,
}

struct Pending {
    rec: UploadRecord,
    /// `None` while a writer holds the bytes, or while range writers share them.
    data: Option<Buf>,
    /// The bytes, once a range writer opened the upload: shared by the range writers open.
    ranged: Option<Arc<Mutex<Buf>>>,
}

impl Pending {
    /// Whether a writer has the upload now (one, or a range writer).
    fn in_use(&self) -> bool {
        match &self.ranged {
            Some(shared) => Arc::strong_count(shared) > 1,
            None => self.data.is_none(),
        }
    }

    fn held(&self) -> u64 {
        match &self.ranged {
            Some(shared) => shared.lock().unwrap().held(),
            None => self.data.as_ref().map_or(0, Buf::held),
        }
    }
}

/// An upload's bytes. Of known size: allocated zeroed at full size up front (the allocator
/// maps fresh zero pages, nothing is written) so receivers can fill it in place; of unknown
/// size: grown as bytes arrive.
struct Buf {
    bytes: Vec<u8>,
    received: u64,
    /// Chunk digests of `bytes[..chunked.len()]`, taken as the bytes arrive in order (often
    /// still in the cache from the socket) so the commit need not read them all again;
    /// `None` once bytes were rewritten or rolled back (the commit then computes them).
    chunked: Option<ChunkHasher>,
}

impl Buf {
    /// Reserve memory for an upload; a size the machine cannot hold is `StorageFull`, not an
    /// abort.
    fn for_size(size: Option<u64>) -> Result<Self> {
        let bytes = match size {
            Some(n) => {
                usize::try_from(n).ok().and_then(bs_wire::alloc::try_zeroed).ok_or_else(|| {
                    StoreError::StorageFull(format!("cannot reserve {n} bytes of memory"))
                })?
            }
            None => Vec::new(),
        };
        Ok(Self { bytes, received: 0, chunked: Some(ChunkHasher::new()) })
    }

    /// `offset..end` of `bytes` now hold new bytes: on with the chunk digests if they
    /// continue them, else give up on them. The first chunk waits until bytes past it
    /// arrive: a blob of one chunk takes its chunk digest from its whole digest at commit
    /// ([`ChunkDigests::from_whole`]), with no pass of its own.
    fn arrived(&mut self, offset: u64, end: u64) {
        let Some(c) = &mut self.chunked else { return };
        if offset < c.len() {
            self.chunked = None;
        } else if end > CHUNK_SIZE {
            // With the bytes of the first chunk left waiting, if they still are (writes
            // continue the received prefix: no gaps).
            c.update(&self.bytes[c.len() as usize..end as usize]);
        }
    }

    /// The chunk digests of `bytes[..received]`, whose whole digest is `whole`.
    fn chunk_digests(&mut self, whole: &Digest) -> ChunkDigests {
        let all = |b: &Self| ChunkDigests::of(&b.bytes[..b.received as usize]);
        match self.chunked.take() {
            Some(c) if c.len() == self.received => c.finish(),
            // Only the first chunk arrived, in order: its digest is in the whole one.
            Some(c) if c.is_empty() => {
                ChunkDigests::from_whole(self.received, whole).unwrap_or_else(|| all(self))
            }
            _ => all(self),
        }
    }

    /// Memory this upload holds: all of it for known sizes (reserved up front).
    fn held(&self) -> u64 {
        (self.bytes.len() as u64).max(self.received)
    }
}

impl MemStore {
    /// An unbounded memory store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A memory store that refuses to hold more than `bytes` (committed plus pending).
    pub fn with_capacity(bytes: u64) -> Self {
        Self { inner: Arc::new(Inner { capacity: Some(bytes), ..Inner::default() }) }
    }

    /// Fault injection for tests: flip the bits of `mask` in byte `offset` of the committed
    /// blob `name`, keeping its digests, as memory corruption would.
    pub fn damage(&self, name: &str, offset: u64, mask: u8) -> Result<()> {
        let mut blobs = self.inner.blobs.write().unwrap();
        let b = blobs.get_mut(name).ok_or_else(|| StoreError::NotFound(name.into()))?;
        let mut v = b.bytes.to_vec();
        let byte = v.get_mut(offset as usize).ok_or_else(|| StoreError::OutOfRange {
            name: name.into(),
            offset,
            len: 1,
            size: b.record.size,
        })?;
        *byte ^= mask;
        b.bytes = v.into();
        Ok(())
    }
}

impl Inner {
    fn used(&self) -> u64 {
        let blobs: u64 = self.blobs.read().unwrap().values().map(|b| b.bytes.len() as u64).sum();
        let pending: u64 = self.uploads.lock().unwrap().values().map(Pending::held).sum();
        blobs + pending
    }
}

impl Store for MemStore {
    fn describe(&self) -> String {
        "memory".into()
    }

    fn digest_algo(&self) -> DigestAlgo {
        DigestAlgo::default()
    }

    fn stat(&self, name: &str) -> Result<BlobRecord> {
        validate_name(name)?;
        let blobs = self.inner.blobs.read().unwrap();
        blobs.get(name).map(|b| b.record.clone()).ok_or_else(|| StoreError::NotFound(name.into()))
    }

    fn corrupt_mark(&self, name: &str) -> Result<Option<String>> {
        validate_name(name)?;
        let blobs = self.inner.blobs.read().unwrap();
        blobs.get(name).map(|b| b.corrupt.clone()).ok_or_else(|| StoreError::NotFound(name.into()))
    }

    fn corrupt_marks(&self, names: &[String]) -> Result<Vec<(String, String)>> {
        let blobs = self.inner.blobs.read().unwrap();
        let mut out: Vec<_> = names
            .iter()
            .filter_map(|n| Some((n.clone(), blobs.get(n)?.corrupt.clone()?)))
            .collect();
        out.sort();
        Ok(out)
    }

    fn list(&self, prefix: &str, after: &str, limit: usize) -> Result<Vec<BlobRecord>> {
        let blobs = self.inner.blobs.read().unwrap();
        Ok(blobs
            .range::<str, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            .filter(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(_, b)| b.record.clone())
            .collect())
    }

    fn delete(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let mut ups = self.inner.uploads.lock().unwrap();
        let had_upload = match ups.get(name) {
            Some(p) if p.data.is_some() => ups.remove(name).is_some(),
            _ => false,
        };
        let removed = self.inner.blobs.write().unwrap().remove(name);
        drop(ups);
        match removed {
            Some(_) => {
                self.inner.listeners.notify(StoreEvent::Deleted(name.to_string()));
                Ok(())
            }
            None if had_upload => Ok(()),
            None => Err(StoreError::NotFound(name.into())),
        }
    }

    fn route(&self, spec: &RouteSpec) -> Result<Routed> {
        validate_name(&spec.name)?;
        let i = &self.inner;
        let there = i.blobs.read().unwrap().get(&spec.name).map(|b| b.record.digest.clone());
        if !may_replace(spec.overwrite, &spec.refuse_digests, there.as_deref()) {
            return Err(crate::store::refused(&spec.name, &spec.refuse_digests));
        }
        if let (Some(size), Some(cap)) = (spec.size, i.capacity) {
            let free = cap.saturating_sub(i.used());
            if size > free {
                return Err(StoreError::StorageFull(format!(
                    "{size} bytes requested, {free} bytes free in memory"
                )));
            }
        }
        {
            let mut ups = i.uploads.lock().unwrap();
            match ups.get_mut(&spec.name) {
                Some(p) if p.in_use() => return Err(StoreError::Busy(spec.name.clone())),
                Some(p)
                    if p.ranged.is_none()
                        && !spec.resume_tag.is_empty()
                        && p.rec.size == spec.size
                        && p.rec.resume_tag == spec.resume_tag =>
                {
                    // Keep the bytes; take this request's type, metadata and overwrite flag.
                    p.rec = spec.upload_record(p.rec.upload_id.clone());
                    let data = p.data.as_ref().expect("checked above");
                    let received = data.received;
                    let held = &data.bytes[..received as usize];
                    let received_digest = (received > 0).then(|| self.digest_algo().digest(held));
                    let upload_id = p.rec.upload_id.clone();
                    return Ok(Routed { upload_id, received, received_digest, resumed: true });
                }
                _ => {}
            }
        }
        // Allocate outside the lock; then install, unless a writer appeared meanwhile.
        let buf = Buf::for_size(spec.size)?;
        let rec = spec.upload_record(crate::fs::new_id());
        let upload_id = rec.upload_id.clone();
        let mut ups = i.uploads.lock().unwrap();
        if ups.get(&spec.name).is_some_and(Pending::in_use) {
            return Err(StoreError::Busy(spec.name.clone()));
        }
        ups.insert(spec.name.clone(), Pending { rec, data: Some(buf), ranged: None });
        Ok(Routed { upload_id, received: 0, received_digest: None, resumed: false })
    }

    fn open_upload(&self, name: &str) -> Result<Box<dyn UploadSink>> {
        validate_name(name)?;
        let mut ups = self.inner.uploads.lock().unwrap();
        let p = ups.get_mut(name).ok_or_else(|| StoreError::NoUpload(name.into()))?;
        if p.in_use() {
            return Err(StoreError::Busy(name.into()));
        }
        let data = match p.ranged.take() {
            // Written by range writers, all gone: every byte counts as held (the commit
            // checks them against the sender's digest).
            Some(shared) => {
                let mut buf = Arc::into_inner(shared).expect("no writer").into_inner().unwrap();
                buf.received = buf.bytes.len() as u64;
                buf.chunked = None;
                buf
            }
            None => p.data.take().expect("not in use"),
        };
        Ok(Box::new(MemUpload { store: self.inner.clone(), rec: p.rec.clone(), data: Some(data) }))
    }

    fn open_upload_range(&self, name: &str, start: u64) -> Result<Option<Box<dyn UploadSink>>> {
        validate_name(name)?;
        let mut ups = self.inner.uploads.lock().unwrap();
        let p = ups.get_mut(name).ok_or_else(|| StoreError::NoUpload(name.into()))?;
        let size = range_size(name, p.rec.size, start, false)?;
        if p.ranged.is_none() {
            // A writer of its own holds it: not shared under it.
            let mut buf = p.data.take().ok_or_else(|| StoreError::Busy(name.into()))?;
            buf.chunked = None;
            p.ranged = Some(Arc::new(Mutex::new(buf)));
        }
        let target = MemRange(p.ranged.clone().expect("shared above"));
        let (name, id) = (name.to_string(), p.rec.upload_id.clone());
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
        let ups = self.inner.uploads.lock().unwrap();
        let p = ups.get(name).ok_or_else(|| StoreError::NoUpload(name.into()))?;
        let digests = |held: &[u8]| crate::store::piece_digests_of(held, offset, len, piece, algo);
        Ok(Some(match (&p.ranged, &p.data) {
            (Some(shared), _) => digests(&shared.lock().unwrap().bytes),
            (None, Some(buf)) => digests(&buf.bytes[..buf.received as usize]),
            (None, None) => return Err(StoreError::Busy(name.into())),
        }))
    }

    fn abort(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let mut ups = self.inner.uploads.lock().unwrap();
        match ups.get(name) {
            None => Err(StoreError::NoUpload(name.into())),
            Some(p) if p.in_use() => Err(StoreError::Busy(name.into())),
            Some(_) => {
                ups.remove(name);
                Ok(())
            }
        }
    }

    fn open_read(&self, name: &str) -> Result<BlobSource> {
        self.open(name, false)
    }

    fn open_read_at_once(&self, name: &str) -> Option<Result<BlobSource>> {
        Some(self.open(name, false))
    }

    fn subscribe(&self, listener: Listener) {
        self.inner.listeners.add(listener);
    }

    fn expire_uploads(&self, age: std::time::Duration) -> Result<Vec<String>> {
        let cutoff = now_ms().saturating_sub(age.as_millis() as i64);
        let mut ups = self.inner.uploads.lock().unwrap();
        // Uploads a writer has are in use: kept.
        let gone: Vec<String> = ups
            .iter()
            .filter(|(_, p)| !p.in_use() && p.rec.created_ms < cutoff)
            .map(|(n, _)| n.clone())
            .collect();
        for n in &gone {
            ups.remove(n);
        }
        Ok(gone)
    }

    fn scrub_blob(&self, name: &str, pace: &mut dyn FnMut(u64) -> bool) -> Result<bool> {
        let id = self.inner.blobs.read().unwrap().get(name).map(|b| b.id.clone());
        let src = self.open(name, true)?;
        if !src.verify_paced(0, src.size(), pace)? {
            return Ok(false);
        }
        // Clear the mark of the blob just checked, not of a replacement stored meanwhile.
        let mut blobs = self.inner.blobs.write().unwrap();
        if let Some(b) = blobs.get_mut(name)
            && Some(&b.id) == id.as_ref()
        {
            b.corrupt = None;
        }
        Ok(true)
    }
}

impl MemStore {
    fn open(&self, name: &str, even_if_marked: bool) -> Result<BlobSource> {
        validate_name(name)?;
        let blobs = self.inner.blobs.read().unwrap();
        let b = blobs.get(name).ok_or_else(|| StoreError::NotFound(name.into()))?;
        if let (Some(reason), false) = (&b.corrupt, even_if_marked) {
            return Err(StoreError::Corrupt {
                name: name.into(),
                reason: format!("marked corrupt ({reason}); restore or delete it"),
            });
        }
        let (inner, n, id) = (self.inner.clone(), name.to_string(), b.id.clone());
        let marker: CorruptionMarker = Arc::new(move |reason: &str| {
            if let Some(b) = inner.blobs.write().unwrap().get_mut(&n)
                && b.id == id
            {
                b.corrupt = Some(reason.to_string());
            }
        });
        BlobSource::memory(b.record.clone(), b.bytes.clone(), b.chunks.clone(), Some(marker))
    }
}

struct MemUpload {
    store: Arc<Inner>,
    rec: UploadRecord,
    /// Taken out of the store while this writer exists; put back on drop unless committed.
    data: Option<Buf>,
}

impl MemUpload {
    fn buf(&mut self) -> &mut Buf {
        self.data.as_mut().expect("present until commit")
    }
}

impl Drop for MemUpload {
    fn drop(&mut self) {
        if let Some(data) = self.data.take() {
            let mut ups = self.store.uploads.lock().unwrap();
            if let Some(p) = ups.get_mut(&self.rec.name)
                && p.rec.upload_id == self.rec.upload_id
            {
                p.data = Some(data);
            }
        }
    }
}

impl UploadSink for MemUpload {
    fn size(&self) -> Option<u64> {
        self.rec.size
    }

    fn upload_id(&self) -> Option<&str> {
        Some(&self.rec.upload_id)
    }

    fn received(&self) -> u64 {
        self.data.as_ref().map_or(0, |d| d.received)
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        check_write(self.rec.size, self.received(), offset, data.len())?;
        let end = offset + data.len() as u64;
        // Known sizes were reserved (and counted) when routed; only streams grow.
        if let (None, Some(cap)) = (self.rec.size, self.store.capacity)
            && self.store.used() + end.max(self.received()) > cap
        {
            return Err(StoreError::StorageFull(format!("memory store capacity {cap} bytes")));
        }
        let buf = self.buf();
        let start = offset as usize;
        // Overwrite what is already there, append the rest (no zero-filling on the way).
        let overlap = (buf.bytes.len() - start).min(data.len());
        buf.bytes[start..start + overlap].copy_from_slice(&data[..overlap]);
        buf.bytes.extend_from_slice(&data[overlap..]);
        buf.received = buf.received.max(end);
        buf.arrived(offset, end);
        Ok(())
    }

    fn lend(&mut self, offset: u64, len: u64) -> Option<&mut [u8]> {
        let size = self.rec.size?;
        check_write(Some(size), self.received(), offset, len as usize).ok()?;
        let buf = self.buf();
        if buf.chunked.as_ref().is_some_and(|c| c.len() > offset) {
            // Lent over bytes already digested: they may change.
            buf.chunked = None;
        }
        Some(&mut buf.bytes[offset as usize..(offset + len) as usize])
    }

    fn filled(&mut self, offset: u64, n: u64) {
        let buf = self.buf();
        buf.received = buf.received.max(offset + n);
        buf.arrived(offset, offset + n);
    }

    fn truncate(&mut self, len: u64) -> Result<()> {
        let known = self.rec.size.is_some();
        let buf = self.buf();
        buf.received = buf.received.min(len);
        if buf.chunked.as_ref().is_some_and(|c| c.len() > len) {
            buf.chunked = None;
        }
        if !known {
            buf.bytes.truncate(buf.received as usize);
        }
        Ok(())
    }

    fn commit_expecting(
        self: Box<Self>,
        expected: &Digest,
        _sender: Option<&ChunkDigests>,
    ) -> Result<BlobRecord> {
        // Read back once, in the digest's algorithm: every byte is in memory here.
        check_complete(&self.rec.name, self.rec.size, self.received())?;
        let buf = self.data.as_ref().expect("present until commit");
        let held = expected.algo.digest(&buf.bytes[..buf.received as usize]);
        if held != *expected {
            return Err(StoreError::Corrupt {
                name: self.rec.name.clone(),
                reason: format!("staged bytes read back as {held}, {expected} was written"),
            });
        }
        self.commit(Some(expected.clone()))
    }

    fn commit(mut self: Box<Self>, whole: Option<Digest>) -> Result<BlobRecord> {
        let name = self.rec.name.clone();
        check_complete(&name, self.rec.size, self.received())?;
        let mut buf = self.data.take().expect("present until commit");
        buf.bytes.truncate(buf.received as usize);
        let algo = DigestAlgo::default();
        let digest = match whole {
            Some(d) if d.algo == algo => d,
            _ => algo.digest(&buf.bytes),
        };
        let record = BlobRecord {
            name: name.clone(),
            size: buf.received,
            content_type: self.rec.content_type.clone(),
            digest: digest.to_string(),
            created_ms: now_ms(),
            metadata: self.rec.metadata.clone(),
        };
        let chunks = buf.chunk_digests(&digest); // before taking the store-wide lock
        let mut blobs = self.store.blobs.write().unwrap();
        let there = blobs.get(&name).map(|b| b.record.digest.as_str());
        if !may_replace(self.rec.overwrite, &self.rec.refuse_digests, there) {
            self.data = Some(buf); // back to pending on drop
            return Err(crate::store::refused(&name, &self.rec.refuse_digests));
        }
        let id = self.rec.upload_id.clone();
        let blob = MemBlob {
            bytes: Bytes::from(buf.bytes),
            record: record.clone(),
            chunks,
            corrupt: None,
            id,
        };
        blobs.insert(name.clone(), blob);
        drop(blobs);
        self.store.uploads.lock().unwrap().remove(&name);
        self.store.listeners.notify(StoreEvent::Committed(record.clone()));
        Ok(record)
    }
}

/// Where a range writer writes (see [`RangeWriter`]): the buffer the upload's range writers
/// share. Bytes past a rollback stay until written again: the commit checks them all.
struct MemRange(Arc<Mutex<Buf>>);

impl RangeTarget for MemRange {
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let at = offset as usize;
        self.0.lock().unwrap().bytes[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed)).collect()
    }

    /// The chunk digests taken as bytes arrive are those of the bytes committed, whatever
    /// way they came: lent memory, writes, rewrites and roll-backs; for a blob of one chunk,
    /// committed with its whole digest (the chunk's then taken from it) or without.
    #[test]
    fn chunk_digests_taken_on_arrival_are_the_committed_bytes() {
        for (n, piece) in [(3 * CHUNK_SIZE as usize + 1234, 300_000), (700_000, 100_000)] {
            for whole in [false, true] {
                chunk_digests_of_blob(n, piece, whole);
            }
        }
    }

    fn chunk_digests_of_blob(n: usize, piece: usize, whole: bool) {
        let good = data(n, 1);
        let s = MemStore::new();
        let ways = ["lent", "written", "rewritten", "rolled back", "lent over"];
        for (k, how) in ways.iter().enumerate() {
            let how = &format!("{how}, {n} bytes, whole digest given: {whole}");
            let name = format!("b{k}");
            let spec = RouteSpec { name: name.clone(), size: Some(n as u64), ..Default::default() };
            s.route(&spec).unwrap();
            let mut up = s.open_upload(&name).unwrap();
            let mut at = 0;
            while at < n {
                let end = (at + piece).min(n);
                if at == piece * 4 && how.starts_with("rewritten") {
                    // Wrong bytes first, then the right ones over them.
                    up.write_at(at as u64, &data(end - at, 9)).unwrap();
                }
                if at == piece * 5 && how.starts_with("rolled back") {
                    up.write_at(at as u64, &data(end - at + 1000, 9)).unwrap();
                    up.truncate(at as u64).unwrap();
                }
                if how.starts_with("lent,") {
                    let dst = up.lend(at as u64, (end - at) as u64).unwrap();
                    dst.copy_from_slice(&good[at..end]);
                    up.filled(at as u64, (end - at) as u64);
                } else {
                    up.write_at(at as u64, &good[at..end]).unwrap();
                }
                at = end;
            }
            let mut want = good.clone();
            if how.starts_with("lent over") {
                // Lent again over bytes already digested, and changed there (no `filled`:
                // nothing new arrived).
                up.lend(0, 10).unwrap().copy_from_slice(&data(10, 9));
                want[..10].copy_from_slice(&data(10, 9));
            }
            up.commit(whole.then(|| DigestAlgo::default().digest(&want))).unwrap();
            let src = s.open_read(&name).unwrap();
            assert_eq!(src.chunk_digests(), &ChunkDigests::of(&want), "{how}");
            assert_eq!(&src.all().unwrap()[..], &want[..], "{how}");
        }
    }
}
