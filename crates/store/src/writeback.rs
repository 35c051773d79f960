//! Writing a large file behind the writer instead of all at the final fsync.
//!
//! The kernel would otherwise hold a large transfer's pages until the final fsync — a gigabyte
//! takes seconds to write then, while the network idles. Two things keep that fsync short:
//!
//! - each [`WRITEBACK_STEP`] of the file, once written, is sent to the disk at once
//!   (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which does not wait);
//! - a process-wide thread then makes the file durable so far (`fdatasync`) behind the writer.
//!   Starting the writeback alone is not enough: on ext4 the final fsync still had the block
//!   allocations of the whole file to commit, and on this project's test machine it took
//!   0.25–0.8 s after a gigabyte paced at 1 Gbit/s, against about 60 ms (what was written
//!   since the last step) with the syncs behind the writer.
//!
//! The writer's own final fsync is unchanged and still what makes the file durable. The syncer
//! syncs through a file description of its own (the file opened again through `/proc`), so a
//! writeback error it meets is still reported to the writer's fsync: Linux reports such an
//! error once to every open file description, not once per file.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, Sender, channel};

/// Dirty bytes a file may gather before their writeback is started.
pub const WRITEBACK_STEP: u64 = 32 << 20;

/// After `len` bytes were written at `offset` of `file`: when they completed a
/// [`WRITEBACK_STEP`] of the file, start writing that step to disk now, and have the file made
/// durable so far behind the writer (see the top of this file). Best effort: failing is
/// harmless, the final fsync writes everything.
pub fn start_writeback(file: &File, offset: u64, len: u64) {
    let end = offset + len;
    if end / WRITEBACK_STEP > offset / WRITEBACK_STEP {
        let from = (end / WRITEBACK_STEP - 1) * WRITEBACK_STEP;
        // SAFETY: the descriptor is open; the call only starts writeback of a file range and
        // has no memory arguments.
        unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                from as libc::off64_t,
                WRITEBACK_STEP as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        // A file description of the syncer's own (not a dup, which would share the writer's).
        if let Ok(again) = File::open(format!("/proc/self/fd/{}", file.as_raw_fd())) {
            let _ = syncer().send(again);
        }
    }
}

/// The syncer thread's queue, the thread started on first use.
fn syncer() -> &'static Sender<File> {
    static TX: OnceLock<Sender<File>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = channel();
        // Without the thread the queue's sends fail and nothing is synced behind writers:
        // the final fsyncs still make every file durable.
        let _ =
            std::thread::Builder::new().name("bs-writeback".into()).spawn(move || sync_behind(rx));
        tx
    })
}

/// Sync each file sent, once per batch however many steps of it arrived meanwhile.
fn sync_behind(rx: Receiver<File>) {
    while let Ok(first) = rx.recv() {
        let mut seen = HashSet::new();
        for f in std::iter::once(first).chain(rx.try_iter()) {
            let id = f.metadata().map(|m| (m.dev(), m.ino())).ok();
            if id.is_none_or(|id| seen.insert(id)) {
                // Errors are the writer's to see, at its own fsync (see the top of this file).
                let _ = f.sync_data();
                #[cfg(test)]
                if let Some(id) = id {
                    tests::SYNCED.lock().unwrap().push(id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// The files (device, inode) the syncer has synced, in order.
    pub(super) static SYNCED: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

    /// Whether `f` was synced since the syncer's `mark`th sync (before that, another file
    /// since removed may have had its inode number).
    fn synced_since(f: &File, mark: usize) -> bool {
        let m = f.metadata().unwrap();
        SYNCED.lock().unwrap()[mark..].contains(&(m.dev(), m.ino()))
    }

    #[test]
    fn a_file_written_past_a_step_is_synced_behind_its_writer() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(dir.path().join("big"))
            .unwrap();
        let chunk = vec![7u8; 1 << 20];
        let mark = SYNCED.lock().unwrap().len();
        // Just short of a step: nothing to sync yet.
        let mut at = 0;
        while at + (chunk.len() as u64) < WRITEBACK_STEP {
            f.write_all_at(&chunk, at).unwrap();
            start_writeback(&f, at, chunk.len() as u64);
            at += chunk.len() as u64;
        }
        assert!(!synced_since(&f, mark));
        // The write that completes the step: the syncer syncs the file.
        f.write_all_at(&chunk, at).unwrap();
        start_writeback(&f, at, chunk.len() as u64);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !synced_since(&f, mark) {
            assert!(Instant::now() < deadline, "the step was not synced behind the writer");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The writer's own fsync still works and the bytes are the writer's.
        f.sync_all().unwrap();
        let back = std::fs::read(dir.path().join("big")).unwrap();
        assert_eq!(back.len() as u64, WRITEBACK_STEP);
        assert!(back.iter().all(|&b| b == 7));
    }
}
