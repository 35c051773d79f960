//! A memory tier in front of any store (the paper's memory → local → cluster → central):
//! reads of blobs up to a size are served from memory after the first, within a byte budget,
//! least recently used first out. Everything else — writes, listings, deletes — goes to the
//! store behind.
//!
//! Never stale: an entry is kept with the digest of its bytes, and each read first asks the
//! store behind (its catalogue, a cheap lookup) what the blob's digest is now, so a replace
//! or delete through this process or any other front end sharing the catalogue is seen at
//! once. Never unverified: bytes enter the tier only as the store behind's verified read,
//! and each reader checks them again against the chunk digests (as for any memory blob).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bs_meta::BlobRecord;
use bs_wire::{ChunkDigests, DigestAlgo};
use bytes::Bytes;

use crate::error::StoreError;
use crate::events::{Listener, StoreEvent};
use crate::lru::Lru;
use crate::source::BlobSource;
use crate::store::{RouteSpec, Routed, Store, UploadSink};

type Result<T> = std::result::Result<T, StoreError>;

/// One blob held in the tier.
#[derive(Clone)]
struct Held {
    record: BlobRecord,
    bytes: Bytes,
    chunks: ChunkDigests,
}

/// Reads through memory, everything else to `back`.
pub struct MemoryTier {
    back: Arc<dyn Store>,
    held: Arc<Lru<String, Held>>,
    max_blob: u64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl MemoryTier {
    /// Hold up to `budget` bytes of blobs no larger than `max_blob` each, in front of `back`.
    pub fn new(back: Arc<dyn Store>, budget: u64, max_blob: u64) -> Self {
        let held: Arc<Lru<String, Held>> = Arc::new(Lru::new(budget as usize, 1 << 20));
        // Writes and deletes through this process leave at once (others are caught by the
        // digest check on read).
        let h = Arc::downgrade(&held);
        back.subscribe(Arc::new(move |e: &StoreEvent| {
            if let Some(h) = h.upgrade() {
                match e {
                    StoreEvent::Committed(r) => h.remove(&r.name),
                    StoreEvent::Deleted(n) => h.remove(n),
                }
            }
        }));
        Self {
            back,
            held,
            max_blob: max_blob.min(budget),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// (reads served from memory, reads that went to the store behind).
    pub fn stats(&self) -> (u64, u64) {
        (self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed))
    }

    /// Bytes held now.
    pub fn held_bytes(&self) -> u64 {
        self.held.weight() as u64
    }
}

impl Store for MemoryTier {
    fn describe(&self) -> String {
        format!("memory tier in front of {}", self.back.describe())
    }

    fn digest_algo(&self) -> DigestAlgo {
        self.back.digest_algo()
    }

    fn stat(&self, name: &str) -> Result<BlobRecord> {
        self.back.stat(name)
    }

    fn list(&self, prefix: &str, after: &str, limit: usize) -> Result<Vec<BlobRecord>> {
        self.back.list(prefix, after, limit)
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.held.remove(&name.to_string());
        self.back.delete(name)
    }

    fn route(&self, spec: &RouteSpec) -> Result<Routed> {
        self.back.route(spec)
    }

    fn open_upload(&self, name: &str) -> Result<Box<dyn UploadSink>> {
        self.back.open_upload(name)
    }

    fn abort(&self, name: &str) -> Result<()> {
        self.back.abort(name)
    }

    fn open_read(&self, name: &str) -> Result<BlobSource> {
        let now = self.back.stat(name)?;
        if let Some(h) = self.held.get(&name.to_string()) {
            if h.record.digest == now.digest && h.record.size == now.size {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return BlobSource::memory(h.record, h.bytes, h.chunks, None);
            }
            self.held.remove(&name.to_string());
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let src = self.back.open_read(name)?;
        if src.size() > self.max_blob {
            return Ok(src);
        }
        let held = Held {
            record: src.record().clone(),
            bytes: src.all()?,
            chunks: src.chunk_digests().clone(),
        };
        self.held.put(name.to_string(), held.clone(), held.bytes.len().max(1));
        BlobSource::memory(held.record, held.bytes, held.chunks, None)
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
