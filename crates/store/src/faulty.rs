//! A store wrapper that injects faults, so tests can drive the real error paths of the data
//! plane: a disk that fills up after a number of bytes.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bs_meta::BlobRecord;
use bs_wire::{Digest, DigestAlgo};

use crate::error::StoreError;
use crate::source::BlobSource;
use crate::store::{RouteSpec, Routed, Store, UploadSink};

type Result<T> = std::result::Result<T, StoreError>;

/// Wraps a store; upload writes fail with `ENOSPC` once `budget` bytes have been written.
pub struct FaultyStore<S> {
    inner: S,
    budget: Arc<AtomicU64>,
}

impl<S: Store> FaultyStore<S> {
    /// Writes beyond `budget` bytes (over all uploads) fail as if the disk were full.
    pub fn disk_full_after(inner: S, budget: u64) -> Self {
        Self { inner, budget: Arc::new(AtomicU64::new(budget)) }
    }
}

impl<S: Store> Store for FaultyStore<S> {
    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
    fn digest_algo(&self) -> DigestAlgo {
        self.inner.digest_algo()
    }
    fn stat(&self, name: &str) -> Result<BlobRecord> {
        self.inner.stat(name)
    }
    fn corrupt_mark(&self, name: &str) -> Result<Option<String>> {
        self.inner.corrupt_mark(name)
    }
    fn corrupt_marks(&self, names: &[String]) -> Result<Vec<(String, String)>> {
        self.inner.corrupt_marks(names)
    }
    fn list(&self, prefix: &str, after: &str, limit: usize) -> Result<Vec<BlobRecord>> {
        self.inner.list(prefix, after, limit)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.inner.delete(name)
    }
    fn route(&self, spec: &RouteSpec) -> Result<Routed> {
        self.inner.route(spec)
    }
    fn open_upload(&self, name: &str) -> Result<Box<dyn UploadSink>> {
        let inner = self.inner.open_upload(name)?;
        Ok(Box::new(FaultySink { inner, budget: self.budget.clone() }))
    }
    fn abort(&self, name: &str) -> Result<()> {
        self.inner.abort(name)
    }
    fn open_read(&self, name: &str) -> Result<BlobSource> {
        self.inner.open_read(name)
    }
    fn scrub_blob(&self, name: &str, pace: &mut dyn FnMut(u64) -> bool) -> Result<bool> {
        self.inner.scrub_blob(name, pace)
    }
    fn subscribe(&self, listener: crate::Listener) {
        self.inner.subscribe(listener)
    }
    fn expire_uploads(&self, age: std::time::Duration) -> Result<Vec<String>> {
        self.inner.expire_uploads(age)
    }
}

/// Does not lend memory: every byte goes through `write_at`, where the faults are.
struct FaultySink {
    inner: Box<dyn UploadSink>,
    budget: Arc<AtomicU64>,
}

impl UploadSink for FaultySink {
    fn size(&self) -> Option<u64> {
        self.inner.size()
    }
    fn upload_id(&self) -> Option<&str> {
        self.inner.upload_id()
    }
    fn received(&self) -> u64 {
        self.inner.received()
    }
    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let left = self.budget.load(Ordering::SeqCst);
        let n = (data.len() as u64).min(left) as usize;
        self.budget.fetch_sub(n as u64, Ordering::SeqCst);
        if n > 0 {
            self.inner.write_at(offset, &data[..n])?;
        }
        if n < data.len() {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC).into());
        }
        Ok(())
    }
    fn truncate(&mut self, len: u64) -> Result<()> {
        self.inner.truncate(len)
    }
    fn commit(self: Box<Self>, whole: Option<Digest>) -> Result<BlobRecord> {
        self.inner.commit(whole)
    }
}
