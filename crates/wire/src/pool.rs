//! Pooled payload buffers.
//!
//! Receivers and relays read payload into buffers taken from a [`BufferPool`]; a buffer goes
//! back to its pool when dropped, so transfers reuse the same few chunk-sized allocations
//! instead of allocating per chunk or per transfer. (Blobs held in memory are shared as
//! reference-counted `Bytes`: every reader of a memory blob sees the same bytes, uncopied.)

use std::sync::{Arc, Mutex};

use bytes::BytesMut;

/// A pool of equally sized buffers.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<Inner>,
}

struct Inner {
    size: usize,
    max_idle: usize,
    free: Mutex<Vec<BytesMut>>,
}

impl BufferPool {
    /// A pool handing out buffers of `size` bytes, keeping at most `max_idle` spare ones.
    pub fn new(size: usize, max_idle: usize) -> Self {
        Self { inner: Arc::new(Inner { size, max_idle, free: Mutex::new(Vec::new()) }) }
    }

    /// Size of the buffers this pool hands out.
    pub fn buf_size(&self) -> usize {
        self.inner.size
    }

    /// Take a buffer (length `size`, contents unspecified).
    pub fn get(&self) -> PooledBuf {
        let reused = self.inner.free.lock().unwrap().pop();
        let mut buf = reused.unwrap_or_else(|| BytesMut::zeroed(self.inner.size));
        if buf.len() != self.inner.size {
            buf.resize(self.inner.size, 0);
        }
        PooledBuf { buf: Some(buf), pool: self.clone() }
    }

    /// Number of idle buffers (for instrumentation and tests).
    pub fn idle(&self) -> usize {
        self.inner.free.lock().unwrap().len()
    }

    fn put(&self, buf: BytesMut) {
        let mut free = self.inner.free.lock().unwrap();
        if free.len() < self.inner.max_idle {
            free.push(buf);
        }
    }
}

/// Pools of a few size classes (4 KiB, 64 KiB, 1 MiB, 16 MiB): a buffer of any size up to the
/// largest class comes from the smallest class that holds it; larger ones are allocated for
/// the occasion (and freed, not pooled).
#[derive(Clone)]
pub struct SizedPools {
    classes: Arc<[BufferPool]>,
}

impl Default for SizedPools {
    fn default() -> Self {
        Self::new(16)
    }
}

/// Header room of the large size classes.
const SLACK: usize = 4 << 10;

impl SizedPools {
    /// Size classes, smallest first. The large ones have room for headers on top of a
    /// power-of-two payload (a 1 MiB chunk and its message headers fit the 1 MiB class).
    pub const CLASSES: [usize; 4] = [4 << 10, 64 << 10, (1 << 20) + SLACK, (16 << 20) + SLACK];

    /// Pools keeping at most `max_idle` spare buffers per class (fewer for the large ones).
    pub fn new(max_idle: usize) -> Self {
        let classes = Self::CLASSES
            .iter()
            .map(|&size| BufferPool::new(size, if size > 16 << 20 { 2 } else { max_idle }))
            .collect();
        Self { classes }
    }

    /// A buffer of at least `len` bytes (contents unspecified).
    pub fn get(&self, len: usize) -> PooledBuf {
        match self.classes.iter().find(|p| p.buf_size() >= len) {
            Some(p) => p.get(),
            None => BufferPool::new(len, 0).get(),
        }
    }
}

/// A buffer on loan from a [`BufferPool`]; returns itself on drop.
pub struct PooledBuf {
    buf: Option<BytesMut>,
    pool: BufferPool,
}

impl std::ops::Deref for PooledBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_deref().expect("buffer present until drop")
    }
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::ops::DerefMut for PooledBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().expect("buffer present until drop")
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.put(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused() {
        let pool = BufferPool::new(1024, 4);
        let ptr = {
            let b = pool.get();
            assert_eq!(b.len(), 1024);
            b.as_ptr()
        };
        assert_eq!(pool.idle(), 1);
        let b = pool.get();
        assert_eq!(b.as_ptr(), ptr, "same allocation handed out again");
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn sized_pools_pick_the_smallest_class_that_fits() {
        let pools = SizedPools::new(4);
        assert_eq!(pools.get(1).len(), 4 << 10);
        assert_eq!(pools.get((4 << 10) + 1).len(), 64 << 10);
        assert_eq!(pools.get(1 << 20).len(), (1 << 20) + SLACK);
        assert_eq!(pools.get((1 << 20) + 100).len(), (1 << 20) + SLACK, "a chunk and its headers");
        assert_eq!(pools.get((16 << 20) + SLACK + 1).len(), (16 << 20) + SLACK + 1);
        let ptr = pools.get(100).as_ptr();
        assert_eq!(pools.get(200).as_ptr(), ptr, "reused from its class");
    }

    #[test]
    fn idle_count_is_bounded() {
        let pool = BufferPool::new(8, 2);
        let bufs: Vec<_> = (0..5).map(|_| pool.get()).collect();
        drop(bufs);
        assert_eq!(pool.idle(), 2);
    }
}
