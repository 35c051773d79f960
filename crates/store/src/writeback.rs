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
//! The writer's own final fsync is still what makes the file durable. The syncer syncs through
//! a file description of its own (the file opened again through `/proc`). A writeback error
//! its `fdatasync` meets is then marked seen by the kernel: the writer's description, open
//! before the error, is still told at its fsync, but one opened after it (a commit through a
//! new description, a resumed upload) would not be. So the syncer keeps each error it meets,
//! and writers make such a file durable with [`sync_written`], which reports it. An error kept by
//! a process that then ends (an interrupted client) ends with it.

use std::collections::{HashMap, HashSet};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::SystemTime;

/// Dirty bytes a file may gather before their writeback is started.
pub const WRITEBACK_STEP: u64 = 32 << 20;

/// Files waiting for the syncer, at most; past that a step is left to the final fsync.
const QUEUED: usize = 64;

/// A file: device, inode and birth time (which tells a reused inode number apart).
type FileId = (u64, u64, Option<SystemTime>);

fn id_of(m: &Metadata) -> FileId {
    (m.dev(), m.ino(), m.created().ok())
}

/// Writeback errors the syncer met, by file, until [`sync_written`] of that file reports them:
/// the OS error code, or the error's text.
static FAILED: Mutex<Option<HashMap<FileId, Result<i32, String>>>> = Mutex::new(None);

fn failed() -> std::sync::MutexGuard<'static, Option<HashMap<FileId, Result<i32, String>>>> {
    FAILED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Make `file`, written with [`start_writeback`], durable (`fsync`): an error of the fsync, or
/// one the syncer met writing it back (see the top of this file).
pub fn sync_written(file: &File) -> io::Result<()> {
    file.sync_all()?;
    let id = id_of(&file.metadata()?);
    match failed().as_mut().and_then(|m| m.remove(&id)) {
        Some(Ok(code)) => Err(io::Error::from_raw_os_error(code)),
        Some(Err(text)) => Err(io::Error::other(text)),
        None => Ok(()),
    }
}

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
        // A full queue leaves this step to the final fsync.
        if let Ok(again) = File::open(format!("/proc/self/fd/{}", file.as_raw_fd())) {
            let _ = syncer().try_send(again);
        }
    }
}

/// The syncer thread's queue, the thread started on first use.
fn syncer() -> &'static SyncSender<File> {
    static TX: OnceLock<SyncSender<File>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = sync_channel(QUEUED);
        // Without the thread the queue's sends fail and nothing is synced behind writers:
        // the final fsyncs still make every file durable.
        let _ =
            std::thread::Builder::new().name("bs-writeback".into()).spawn(move || sync_behind(rx));
        tx
    })
}

/// Sync each file sent, once per batch however many steps of it arrived meanwhile; keep the
/// errors met for the files' writers.
fn sync_behind(rx: Receiver<File>) {
    while let Ok(first) = rx.recv() {
        // The batch taken whole first: a step sent while an earlier file syncs is synced in
        // the next batch, not dropped as already seen in this one.
        let batch: Vec<File> = std::iter::once(first).chain(rx.try_iter()).collect();
        let mut seen = HashSet::new();
        for f in batch {
            let Ok(m) = f.metadata() else { continue };
            // Removed meanwhile (replaced, aborted): nobody wants its bytes on disk.
            if m.nlink() == 0 || !seen.insert(id_of(&m)) {
                continue;
            }
            if let Err(e) = f.sync_data() {
                let kept = e.raw_os_error().ok_or_else(|| e.to_string());
                failed().get_or_insert_with(HashMap::new).insert(id_of(&m), kept);
            }
            #[cfg(test)]
            tests::SYNCED.lock().unwrap().push((m.dev(), m.ino()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
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
        sync_written(&f).unwrap();
        let back = std::fs::read(dir.path().join("big")).unwrap();
        assert_eq!(back.len() as u64, WRITEBACK_STEP);
        assert!(back.iter().all(|&b| b == 7));
    }

    #[test]
    fn an_error_the_syncer_met_is_reported_by_the_final_sync_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"bytes").unwrap();
        let f = File::open(&path).unwrap();
        // As the syncer keeps an error it met writing this file back (EIO cannot be had on
        // demand from a real disk).
        let id = id_of(&f.metadata().unwrap());
        failed().get_or_insert_with(HashMap::new).insert(id, Ok(libc::EIO));
        // Reported through a description opened after the error, then gone.
        let again = File::open(&path).unwrap();
        assert_eq!(sync_written(&again).unwrap_err().raw_os_error(), Some(libc::EIO));
        sync_written(&again).unwrap();
        sync_written(&f).unwrap();
    }
}
