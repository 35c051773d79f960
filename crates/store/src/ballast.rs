//! Room kept for deletes on a full disk: a file of [`BALLAST`] bytes in the data directory
//! (`DIR/reserve`), given up when a catalogue delete finds no room and made again once there is.
//! Blob writes leave the catalogue a reserve of their own (see `fs.rs`), but a disk filled by
//! something else (logs, another program) leaves none: then SQLite cannot even write the
//! delete that would free space, and the store could not be emptied with its own commands.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes kept: a delete's journal pages, many times over.
pub const BALLAST: usize = 1 << 20;

/// The reserve file of one data directory.
#[derive(Debug)]
pub struct Ballast {
    path: PathBuf,
    /// Given up, not made again yet.
    spent: AtomicBool,
}

impl Ballast {
    /// The reserve of `root`, made now if it is missing (best effort: a disk already full
    /// leaves it missing until space is freed).
    pub fn keep(root: &Path) -> Self {
        let b = Self { path: root.join("reserve"), spent: AtomicBool::new(false) };
        let whole = fs::metadata(&b.path).is_ok_and(|m| m.len() == BALLAST as u64);
        if !whole && let Err(e) = b.make() {
            tracing::warn!(file = %b.path.display(), error = %e, "cannot keep room for deletes");
            b.spent.store(true, Ordering::Relaxed);
        }
        b
    }

    /// Give the room up for a write that found the disk full; whether there was any.
    pub fn release(&self) -> bool {
        if self.spent.swap(true, Ordering::AcqRel) {
            return false;
        }
        match fs::remove_file(&self.path) {
            Ok(()) => {
                tracing::warn!(file = %self.path.display(), "disk full: the room kept for deletes is used");
                true
            }
            Err(_) => false,
        }
    }

    /// Make the room again if it was given up (after a delete freed space); best effort.
    pub fn restore(&self) {
        if self.spent.load(Ordering::Acquire) && self.make().is_ok() {
            self.spent.store(false, Ordering::Release);
        }
    }

    /// Write the reserve file whole and durable, or leave none.
    fn make(&self) -> std::io::Result<()> {
        let tmp = self.path.with_extension("new");
        let made = (|| {
            let mut f = File::create(&tmp)?;
            // Written, not a sparse file nor one merely allocated: its blocks are this file's
            // whatever the file system does with fallocate.
            f.write_all(&vec![0u8; BALLAST])?;
            f.sync_all()?;
            fs::rename(&tmp, &self.path)
        })();
        if made.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_room_is_kept_given_up_once_and_made_again() {
        let t = tempfile::tempdir().unwrap();
        let b = Ballast::keep(t.path());
        let file = t.path().join("reserve");
        assert_eq!(fs::metadata(&file).unwrap().len(), BALLAST as u64);
        assert!(b.release() && !file.exists());
        assert!(!b.release(), "given up once");
        b.restore();
        assert_eq!(fs::metadata(&file).unwrap().len(), BALLAST as u64);
        assert!(b.release(), "made again: can be given up again");
    }
}
