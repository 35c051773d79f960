//! Cache tiers in front of any store (the paper's memory → local → cluster → central): reads
//! of blobs up to a size are served from the tier after the first — memory, or a directory
//! on local disk — within a byte budget, least recently used first out. Everything else —
//! writes, listings, deletes — goes to the store behind. Tiers stack: a memory tier in front
//! of a disk tier in front of a bucket.
//!
//! Never stale: an entry is kept with the digest of its bytes, and each read first asks the
//! store behind (its catalogue, a cheap lookup) what the blob's digest is now, so a replace
//! or delete through this process or any other front end sharing the catalogue is seen at
//! once. Never unverified: bytes enter a tier only as the store behind's verified read, and
//! each reader checks them again against the chunk digests — in memory as for any memory
//! blob, on disk as for any file blob (the disk tier is a filesystem store of its own).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bs_meta::BlobRecord;
use bs_wire::{ChunkDigests, Digest, DigestAlgo};
use bytes::Bytes;

use crate::error::StoreError;
use crate::events::{Listener, StoreEvent};
use crate::fs::FsStore;
use crate::lru::Lru;
use crate::source::BlobSource;
use crate::store::{RouteSpec, Routed, Store, UploadSink};

type Result<T> = std::result::Result<T, StoreError>;

/// Where a tier keeps its copies.
trait Holder: Send + Sync + 'static {
    /// The copy of the blob `now` describes, if held at its current digest.
    fn get(&self, now: &BlobRecord) -> Option<BlobSource>;
    /// Keep a copy of `src` (a verified read of the store behind); the source to serve.
    fn keep(&self, src: &BlobSource) -> Result<BlobSource>;
    /// Drop any copy of `name`.
    fn forget(&self, name: &str);
    /// Bytes held now.
    fn held(&self) -> u64;
    fn describe(&self) -> String;
}

/// Reads through a tier, everything else to `back`.
pub struct Tier {
    back: Arc<dyn Store>,
    holder: Arc<dyn Holder>,
    max_blob: u64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Tier {
    /// Hold up to `budget` bytes of blobs no larger than `max_blob` each in memory, in front
    /// of `back`.
    pub fn new(back: Arc<dyn Store>, budget: u64, max_blob: u64) -> Self {
        let held = InMemory(Arc::new(Lru::new(budget as usize, 1 << 20)));
        Self::with(back, Arc::new(held), budget, max_blob)
    }

    /// The same on local disk: a filesystem store in `dir` (created if needed; copies kept
    /// there from an earlier run are used again).
    pub fn on_disk(back: Arc<dyn Store>, dir: &Path, budget: u64, max_blob: u64) -> Result<Self> {
        let holder = OnDisk::open(dir, budget)?;
        Ok(Self::with(back, Arc::new(holder), budget, max_blob))
    }

    fn with(back: Arc<dyn Store>, holder: Arc<dyn Holder>, budget: u64, max_blob: u64) -> Self {
        // Writes and deletes through this process leave at once (others are caught by the
        // digest check on read).
        let h = Arc::downgrade(&holder);
        back.subscribe(Arc::new(move |e: &StoreEvent| {
            if let Some(h) = h.upgrade() {
                match e {
                    StoreEvent::Committed(r) => h.forget(&r.name),
                    StoreEvent::Deleted(n) => h.forget(n),
                }
            }
        }));
        Self {
            back,
            holder,
            max_blob: max_blob.min(budget),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// (reads served from the tier, reads that went to the store behind).
    pub fn stats(&self) -> (u64, u64) {
        (self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed))
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> u64 {
        self.holder.held()
    }
}

impl Store for Tier {
    fn describe(&self) -> String {
        format!("{} in front of {}", self.holder.describe(), self.back.describe())
    }

    fn digest_algo(&self) -> DigestAlgo {
        self.back.digest_algo()
    }

    fn stat(&self, name: &str) -> Result<BlobRecord> {
        self.back.stat(name)
    }

    fn corrupt_mark(&self, name: &str) -> Result<Option<String>> {
        self.back.corrupt_mark(name)
    }

    fn corrupt_marks(&self, names: &[String]) -> Result<Vec<(String, String)>> {
        self.back.corrupt_marks(names)
    }

    fn list(&self, prefix: &str, after: &str, limit: usize) -> Result<Vec<BlobRecord>> {
        self.back.list(prefix, after, limit)
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.holder.forget(name);
        self.back.delete(name)
    }

    fn route(&self, spec: &RouteSpec) -> Result<Routed> {
        self.back.route(spec)
    }

    fn open_upload(&self, name: &str) -> Result<Box<dyn UploadSink>> {
        self.back.open_upload(name)
    }

    fn open_upload_range(&self, name: &str, start: u64) -> Result<Option<Box<dyn UploadSink>>> {
        self.back.open_upload_range(name, start)
    }

    fn takes_range_writes(&self) -> bool {
        self.back.takes_range_writes()
    }

    fn upload_piece_digests(
        &self,
        name: &str,
        offset: u64,
        len: u64,
        piece: u64,
        algo: DigestAlgo,
    ) -> Result<Option<Vec<Digest>>> {
        self.back.upload_piece_digests(name, offset, len, piece, algo)
    }

    fn abort(&self, name: &str) -> Result<()> {
        self.back.abort(name)
    }

    fn open_read(&self, name: &str) -> Result<BlobSource> {
        let now = self.back.stat(name)?;
        if let Some(src) = self.holder.get(&now) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return src.with_record(now);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let src = self.back.open_read(name)?;
        if src.size() > self.max_blob {
            return Ok(src);
        }
        match self.holder.keep(&src) {
            Ok(copy) => copy.with_record(src.record().clone()),
            // A corrupt read of the store behind is the reader's answer too.
            Err(e @ StoreError::Corrupt { .. }) => Err(e),
            Err(e) => {
                tracing::warn!(blob = %name, error = %e, "not kept in the tier");
                Ok(src)
            }
        }
    }

    fn scrub_blob(&self, name: &str, pace: &mut dyn FnMut(u64) -> bool) -> Result<bool> {
        self.back.scrub_blob(name, pace)
    }

    fn subscribe(&self, listener: Listener) {
        self.back.subscribe(listener);
    }

    fn expire_uploads(&self, age: std::time::Duration) -> Result<Vec<String>> {
        self.back.expire_uploads(age)
    }
}

/// One blob held in memory.
#[derive(Clone)]
struct Held {
    record: BlobRecord,
    bytes: Bytes,
    chunks: ChunkDigests,
}

struct InMemory(Arc<Lru<String, Held>>);

impl InMemory {
    /// A reader finding the copy damaged (memory going bad) drops it: the next read goes
    /// to the store behind.
    fn marker(&self, name: &str) -> crate::source::CorruptionMarker {
        let (lru, name) = (Arc::downgrade(&self.0), name.to_string());
        Arc::new(move |_reason: &str| {
            if let Some(lru) = lru.upgrade() {
                lru.remove(&name);
            }
        })
    }
}

impl Holder for InMemory {
    fn get(&self, now: &BlobRecord) -> Option<BlobSource> {
        let h = self.0.get(&now.name)?;
        if h.record.digest != now.digest || h.record.size != now.size {
            self.0.remove(&now.name);
            return None;
        }
        BlobSource::memory(h.record, h.bytes, h.chunks, Some(self.marker(&now.name))).ok()
    }

    fn keep(&self, src: &BlobSource) -> Result<BlobSource> {
        let bytes = src.all()?;
        // Memory of its own: a slice of a file's mapping would keep the mapping (and the
        // file) alive, outside the budget, and read the disk again if its pages were dropped.
        let bytes = if src.is_mapped() { Bytes::copy_from_slice(&bytes) } else { bytes };
        let held =
            Held { record: src.record().clone(), bytes, chunks: src.chunk_digests().clone() };
        let name = held.record.name.clone();
        self.0.put(name.clone(), held.clone(), held.bytes.len().max(1));
        BlobSource::memory(held.record, held.bytes, held.chunks, Some(self.marker(&name)))
    }

    fn forget(&self, name: &str) {
        self.0.remove(&name.to_string());
    }

    fn held(&self) -> u64 {
        self.0.weight() as u64
    }

    fn describe(&self) -> String {
        "memory tier".into()
    }
}

/// Copies in a filesystem store of their own; the LRU keeps each name's digest.
struct OnDisk {
    store: FsStore,
    lru: Lru<String, String>,
}

impl OnDisk {
    fn open(dir: &Path, budget: u64) -> Result<Self> {
        let store = FsStore::open(dir)?;
        let lru = Lru::new(budget as usize, 1 << 22);
        // What an earlier run kept (oldest first in name order: their use order is gone).
        let mut after = String::new();
        loop {
            let page = store.list("", &after, 1024)?;
            let Some(last) = page.last() else { break };
            after = last.name.clone();
            for r in page {
                for (gone, _) in lru.put(r.name.clone(), r.digest.clone(), r.size.max(1) as usize) {
                    let _ = store.delete(&gone);
                }
            }
        }
        Ok(Self { store, lru })
    }
}

impl Holder for OnDisk {
    fn get(&self, now: &BlobRecord) -> Option<BlobSource> {
        if self.lru.get(&now.name)? != now.digest {
            self.forget(&now.name);
            return None;
        }
        match self.store.open_read(&now.name) {
            Ok(src) if src.record().digest == now.digest => Some(src),
            _ => {
                self.forget(&now.name);
                None
            }
        }
    }

    fn keep(&self, src: &BlobSource) -> Result<BlobSource> {
        let rec = src.record();
        let spec = RouteSpec {
            name: rec.name.clone(),
            size: Some(rec.size),
            content_type: rec.content_type.clone(),
            metadata: rec.metadata.clone(),
            overwrite: true,
            ..RouteSpec::default()
        };
        self.store.route(&spec)?;
        let written = self.store.open_upload(&rec.name).and_then(|mut w| {
            let mut at = 0;
            for piece in src.pieces(0, rec.size)? {
                let piece = piece?;
                w.write_at(at, &piece)?;
                at += piece.len() as u64;
            }
            w.commit(rec.digest.parse().ok())
        });
        if let Err(e) = written {
            let _ = self.store.abort(&rec.name);
            return Err(e);
        }
        for (gone, _) in
            self.lru.put(rec.name.clone(), rec.digest.clone(), rec.size.max(1) as usize)
        {
            if let Err(e) = self.store.delete(&gone) {
                tracing::warn!(blob = %gone, error = %e, "cannot drop a copy from the disk tier");
            }
        }
        self.store.open_read(&rec.name)
    }

    fn forget(&self, name: &str) {
        self.lru.remove(&name.to_string());
        match self.store.delete(name) {
            Ok(()) | Err(StoreError::NotFound(_)) => {}
            Err(e) => {
                tracing::warn!(blob = %name, error = %e, "cannot drop a copy from the disk tier")
            }
        }
    }

    fn held(&self) -> u64 {
        self.lru.weight() as u64
    }

    fn describe(&self) -> String {
        format!("disk tier in {}", self.store.root().display())
    }
}
