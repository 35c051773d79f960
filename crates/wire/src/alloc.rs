//! Large zeroed buffers for blob payloads.
//!
//! A receiver that lands a 256 MB blob in fresh memory pays one page fault per 4 KiB page it
//! touches — on a VM that, not the network, can be the bottleneck. [`zeroed`] asks the kernel
//! for transparent huge pages on big buffers (`MADV_HUGEPAGE`: one fault per 2 MiB). The memory
//! store allocates uploads with it, and `bench transfer` allocates every baseline's receive
//! buffer with it too, so they all do the same work. Huge pages are not free everywhere: with
//! the kernel's THP `defrag=madvise`, once memory is fragmented each first touch may compact
//! and zero 2 MiB at fault time, so where a baseline allocates its own memory (object_store in
//! `bench s3`) our side receives into plain heap memory as it does.

/// Buffers at least this big are advised onto huge pages.
pub const HUGE_THRESHOLD: usize = 4 << 20;

const HUGE_PAGE: usize = 2 << 20;

/// A zero-filled `Vec` of `len` bytes. The allocator maps fresh zero pages for big sizes, so
/// nothing is written until the caller fills it. Panics if memory is exhausted, like `vec!`;
/// see [`try_zeroed`] for sizes that come from a peer.
pub fn zeroed(len: usize) -> Vec<u8> {
    try_zeroed(len).unwrap_or_else(|| std::alloc::handle_alloc_error(layout(len.max(1))))
}

fn layout(len: usize) -> std::alloc::Layout {
    std::alloc::Layout::array::<u8>(len).unwrap_or(std::alloc::Layout::new::<u8>())
}

/// [`zeroed`], or `None` when the memory cannot be had (instead of aborting the process).
pub fn try_zeroed(len: usize) -> Option<Vec<u8>> {
    if len == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len).ok()?;
    // SAFETY: `layout` has non-zero size; a non-null result is a zeroed allocation of exactly
    // `len` bytes with alignment 1, which is what a `Vec<u8>` of length and capacity `len`
    // owns and will free with the same layout.
    let v = unsafe {
        let ptr = std::alloc::alloc_zeroed(layout);
        if ptr.is_null() {
            return None;
        }
        Vec::from_raw_parts(ptr, len, len)
    };
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
    Some(v)
}

#[cfg(test)]
mod tests {
    #[test]
    fn impossible_sizes_are_refused_not_fatal() {
        assert!(super::try_zeroed(usize::MAX).is_none());
        assert!(super::try_zeroed(1 << 62).is_none());
    }

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
