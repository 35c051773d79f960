//! The bytes of an object-store upload not yet sent as a part. A part gathers in a buffer
//! from a [`BufferPool`] and goes up as that very buffer (`Bytes::from_owner`), which returns
//! to the pool once the part's PUT lets go of it: a reused buffer has its pages in place,
//! where a fresh 8 MiB one faults in 2,048 pages, each zeroed by the kernel (measured on the
//! 2-core VM putting 32 MB blobs on Garage: 7,800 page faults per blob without the pool, none
//! with it, and 7% less time, alternating in one process). A small blob of known size (one
//! PUT) gathers in a pooled buffer too from [`POOLED_FROM`] bytes on (a fresh 1 MB one cost
//! its PUT 0.8 ms of page faults, a sixth of blobstream's time over the plain client's on
//! the same trace), and in a buffer of its own size below that (not 8 MiB held for a few
//! KB); a receiver may fill either in place ([`Tail::lend`]).

use bs_wire::{BufferPool, PooledBuf};
use bytes::Bytes;

/// A small blob this long or longer gathers in a pooled part buffer.
pub const POOLED_FROM: u64 = 256 << 10;

/// Bytes `0..len()` of what follows the parts already sent.
#[derive(Default)]
pub struct Tail {
    buf: Buf,
    /// Bytes held (the buffer, pooled or owned, may be longer: past `len` it holds nothing).
    len: usize,
    /// End of the memory last lent (at most `len()` when none is): [`Tail::filled`] counts
    /// no byte past it.
    lent_to: usize,
}

#[derive(Default)]
enum Buf {
    #[default]
    None,
    /// Part-sized, contents past `len` unspecified.
    Pooled(PooledBuf),
    /// At least `len` long, contents past `len` unspecified.
    Owned(Vec<u8>),
}

impl Tail {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn as_slice(&self) -> &[u8] {
        match &self.buf {
            Buf::None => &[],
            Buf::Pooled(b) => &b[..self.len],
            Buf::Owned(v) => &v[..self.len],
        }
    }

    /// Write `data` at `at` (at most `len()`: no gaps), as much of it as fits before the
    /// buffer is full; returns how much that was. The first write takes a buffer: from
    /// `pool` when `pooled` or when `rest` (all the blob has left to send) is a small
    /// blob's of at least [`POOLED_FROM`] bytes, else one for `rest` bytes.
    pub fn write(
        &mut self,
        at: usize,
        data: &[u8],
        pooled: bool,
        rest: u64,
        pool: &BufferPool,
    ) -> usize {
        debug_assert!(at <= self.len);
        if matches!(self.buf, Buf::None) {
            self.buf = if pooled || Self::pooled_small(rest, pool) {
                Buf::Pooled(pool.get())
            } else {
                Buf::Owned(Vec::with_capacity(rest.max(data.len() as u64) as usize))
            };
        }
        match &mut self.buf {
            Buf::None => 0,
            Buf::Pooled(b) => {
                let n = data.len().min(b.len() - at);
                b[at..at + n].copy_from_slice(&data[..n]);
                self.len = self.len.max(at + n);
                n
            }
            Buf::Owned(v) => {
                let (keep, more) = data.split_at((v.len() - at).min(data.len()));
                v[at..at + keep.len()].copy_from_slice(keep);
                v.extend_from_slice(more);
                self.len = self.len.max(at + data.len());
                data.len()
            }
        }
    }

    /// The buffer's memory for `at..at + n` (appending: `at` is `len()`), filled in place by
    /// a receiver reading from the socket straight into it, then reported with
    /// [`Tail::filled`]. For a part (`pooled`: the upload goes up in parts) the memory is
    /// the pooled part buffer's, taken here unless held already, and `None` past its end;
    /// for a small blob (`rest`, all it has left, shorter than a pooled buffer) a pooled
    /// buffer from [`POOLED_FROM`] bytes on, else one of `rest` bytes. `None` past `rest`.
    pub fn lend(
        &mut self,
        at: usize,
        n: usize,
        rest: usize,
        pooled: bool,
        pool: &BufferPool,
    ) -> Option<&mut [u8]> {
        if at != self.len || at + n > rest || (!pooled && rest >= pool.buf_size()) {
            return None;
        }
        if matches!(self.buf, Buf::None) {
            self.buf = if pooled || Self::pooled_small(rest as u64, pool) {
                Buf::Pooled(pool.get())
            } else {
                Buf::Owned(bs_wire::alloc::try_zeroed(rest)?)
            };
        }
        let lent = match &mut self.buf {
            Buf::Pooled(b) if at + n <= b.len() => &mut b[at..at + n],
            Buf::Owned(v) if !pooled => {
                if v.len() < at + n {
                    v.resize(at + n, 0);
                }
                &mut v[at..at + n]
            }
            _ => return None,
        };
        self.lent_to = at + n;
        Some(lent)
    }

    /// `n` bytes arrived in memory lent from `at` on.
    pub fn filled(&mut self, at: usize, n: usize) {
        // Only right after `lend`, appending, within what it lent: never counts bytes nobody
        // filled.
        if at == self.len && at + n <= self.lent_to {
            self.len = at + n;
            self.lent_to = self.len;
        }
    }

    /// Whether a small blob of `rest` bytes gathers in a pooled part buffer.
    fn pooled_small(rest: u64, pool: &BufferPool) -> bool {
        (POOLED_FROM..pool.buf_size() as u64).contains(&rest)
    }

    /// Whether the buffer is full (a pooled one holds a whole part).
    pub fn full(&self) -> bool {
        matches!(&self.buf, Buf::Pooled(b) if self.len == b.len())
    }

    /// Forget every byte from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.lent_to = self.len;
    }

    /// Everything held, without a copy; the tail is empty after.
    pub fn take(&mut self) -> Bytes {
        self.lent_to = 0;
        let len = std::mem::take(&mut self.len);
        match std::mem::take(&mut self.buf) {
            Buf::None => Bytes::new(),
            Buf::Pooled(b) => Bytes::from_owner(b).slice(..len),
            Buf::Owned(mut v) => {
                v.truncate(len);
                Bytes::from(v)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_rewrites_and_truncates_in_either_buffer() {
        let pool = BufferPool::new(8, 1);
        for pooled in [true, false] {
            let mut t = Tail::default();
            assert_eq!(t.write(0, b"abcdef", pooled, 8, &pool), 6);
            assert_eq!(t.write(4, b"XYZW", pooled, 8, &pool), 4, "a rewrite that grows");
            assert_eq!(t.as_slice(), b"abcdXYZW");
            assert_eq!(t.full(), pooled, "a pooled buffer holds 8 here");
            t.truncate(3);
            assert_eq!(t.as_slice(), b"abc");
            assert_eq!(t.write(3, b"defghijk", pooled, 5, &pool), if pooled { 5 } else { 8 });
            let all = t.take();
            assert_eq!(&all[..], if pooled { &b"abcdefgh"[..] } else { &b"abcdefghijk"[..] });
            assert_eq!((t.len(), t.as_slice()), (0, &b""[..]));
        }
        // The part's buffer went back to the pool when its bytes were let go.
        assert_eq!(pool.idle(), 1);
    }

    #[test]
    fn a_small_blobs_buffer_is_lent_for_appends_and_holds_what_was_filled() {
        let part = 2 * POOLED_FROM as usize;
        let pool = BufferPool::new(part, 1);
        // Below POOLED_FROM a buffer of its own, from it on a pooled one: lent alike.
        for rest in [10, POOLED_FROM as usize + 10] {
            let mut t = Tail::default();
            t.lend(0, 4, rest, false, &pool).unwrap().copy_from_slice(b"abcd");
            t.filled(0, 3); // one byte short: only three arrived
            assert_eq!(t.as_slice(), b"abc");
            t.filled(3, 1);
            assert_eq!(t.len(), 3, "the byte that did not arrive is not counted later");
            assert!(t.lend(4, 2, rest, false, &pool).is_none(), "a gap");
            assert!(t.lend(3, rest, rest, false, &pool).is_none(), "past the blob's rest");
            t.lend(3, 2, rest, false, &pool).unwrap().copy_from_slice(b"de");
            t.filled(3, 4);
            assert_eq!(t.len(), 3, "more than was lent is not counted");
            t.filled(3, 2);
            assert_eq!(t.write(5, b"fg", false, rest as u64, &pool), 2, "written after lent");
            t.truncate(6);
            assert_eq!(t.as_slice(), b"abcdef");
            assert!(!t.full(), "a small blob never fills a part");
            let bytes = t.take();
            assert_eq!(&bytes[..], b"abcdef");
            let pooled = rest >= POOLED_FROM as usize;
            assert_eq!(pool.idle(), 0, "none idle while a pooled buffer is out");
            drop(bytes);
            assert_eq!(pool.idle(), usize::from(pooled), "a pooled buffer is back once let go");
        }
        let mut p = Tail::default();
        assert_eq!(p.write(0, b"ab", true, part as u64, &pool), 2);
        assert!(p.lend(2, 2, part, false, &pool).is_none(), "a part is lent only as one");
        // A part's buffer: lent up to its end, the rest of the frame written after.
        p.lend(2, part - 3, part * 3, true, &pool).unwrap().fill(b'x');
        p.filled(2, part - 3);
        assert!(p.lend(part - 1, 2, part * 3, true, &pool).is_none(), "past the part's end");
        assert_eq!(p.write(part - 1, b"yz", true, part as u64 * 3, &pool), 1);
        assert!(p.full());
        assert_eq!(&p.as_slice()[..3], b"abx");
        assert_eq!(p.as_slice()[part - 1], b'y');
        drop(p);
        assert_eq!(pool.idle(), 1);
        let mut q = Tail::default();
        assert_eq!(q.write(0, b"ab", false, POOLED_FROM, &pool), 2, "a small blob's write");
        assert_eq!(pool.idle(), 0, "takes a pooled buffer from POOLED_FROM bytes on");
        let mut r = Tail::default();
        drop(q);
        assert_eq!(r.write(0, b"ab", false, 4, &pool), 2);
        assert_eq!(pool.idle(), 1, "a few bytes take a buffer of their own");
    }
}
