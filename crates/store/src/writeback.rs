//! Writing a large file behind the writer instead of all at the final fsync.

use std::fs::File;
use std::os::fd::AsRawFd;

/// Dirty bytes a file may gather before their writeback is started.
pub const WRITEBACK_STEP: u64 = 32 << 20;

/// After `len` bytes were written at `offset` of `file`: when they completed a
/// [`WRITEBACK_STEP`] of the file, start writing that step to disk now
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)` does not wait). The kernel would otherwise hold a
/// large transfer's pages until the final fsync — a gigabyte takes seconds to write then,
/// while the network idles — instead of writing them behind the transfer.
pub fn start_writeback(file: &File, offset: u64, len: u64) {
    let end = offset + len;
    if end / WRITEBACK_STEP > offset / WRITEBACK_STEP {
        let from = (end / WRITEBACK_STEP - 1) * WRITEBACK_STEP;
        // SAFETY: the descriptor is open; the call only starts writeback of a file range and
        // has no memory arguments. Failing is harmless: the final fsync writes everything.
        unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                from as libc::off64_t,
                WRITEBACK_STEP as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
    }
}
