//! Large zeroed buffers for blob payloads.
//!
//! A receiver that lands a 256 MB blob in fresh memory pays one page fault per 4 KiB page it
//! touches — on a VM that, not the network, can be the bottleneck. [`zeroed`] asks the kernel
//! for transparent huge pages on big buffers (`MADV_HUGEPAGE`: one fault per 2 MiB). The memory
//! store allocates uploads with it, and the benchmarks allocate every baseline's receive buffer
//! with it too, so they all do the same work.

/// Buffers at least this big are advised onto huge pages.
pub const HUGE_THRESHOLD: usize = 4 << 20;

const HUGE_PAGE: usize = 2 << 20;

/// A zero-filled `Vec` of `len` bytes. The allocator maps fresh zero pages for big sizes, so
/// nothing is written until the caller fills it.
pub fn zeroed(len: usize) -> Vec<u8> {
    let v = vec![0u8; len];
    if len >= HUGE_THRESHOLD {
        let start = v.as_ptr() as usize;
        let aligned = start.next_multiple_of(HUGE_PAGE);
        let end = (start + len) / HUGE_PAGE * HUGE_PAGE;
        if end > aligned {
            // SAFETY: the range lies inside the live allocation `v`; MADV_HUGEPAGE is advice
            // about how to back it and never changes its contents.
            unsafe {
                libc::madvise(aligned as *mut libc::c_void, end - aligned, libc::MADV_HUGEPAGE);
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn zeroed_is_zero_and_writable() {
        for n in [0, 10, super::HUGE_THRESHOLD + 12345] {
            let mut v = super::zeroed(n);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&b| b == 0));
            if n > 0 {
                v[n - 1] = 7;
                assert_eq!(v[n - 1], 7);
            }
        }
    }
}
