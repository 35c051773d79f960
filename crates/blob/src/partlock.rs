//! A part file locked for one writer: what a download into a local file (`get`) and a
//! receiver writing a run (`blobstream receive`) both take before writing, so two writers
//! into one folder never write one file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What [`lock_part`] found.
#[derive(Debug)]
pub enum PartLock {
    /// Open, locked for this writer alone (or on a file system without locks, unlocked, as
    /// before there were locks), and still the file at its path with no other name.
    Ours(File),
    /// Another writer holds it.
    Held,
    /// It changed between the open and the lock: the writer before let go of it by giving it
    /// another name (renamed or linked into place). Not ours to write; opening again makes a
    /// new one.
    Replaced,
}

/// Open `part` with `options` (which create it) and take its exclusive lock without waiting.
/// Nothing is written: emptying it is the caller's, once it is [`PartLock::Ours`].
pub fn lock_part(part: &Path, options: &OpenOptions) -> io::Result<PartLock> {
    let file = options.open(part)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(PartLock::Held),
        // A file system without locks (NFS without its lock daemon): written unlocked.
        Err(std::fs::TryLockError::Error(e))
            if matches!(e.raw_os_error(), Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS)) => {
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    let ours = match (file.metadata(), std::fs::metadata(part)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino() && a.nlink() == 1,
        _ => false,
    };
    Ok(if ours { PartLock::Ours(file) } else { PartLock::Replaced })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create() -> OpenOptions {
        let mut o = OpenOptions::new();
        o.create(true).write(true).truncate(false);
        o
    }

    #[test]
    fn one_writer_holds_it_and_a_file_linked_away_is_not_ours() {
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join(".x.part");
        let Ok(PartLock::Ours(held)) = lock_part(&part, &create()) else { panic!("free") };
        assert!(matches!(lock_part(&part, &create()), Ok(PartLock::Held)));
        drop(held);
        // Kept under another name (linked) by the writer before: no longer a part file.
        std::fs::hard_link(&part, dir.path().join("x")).unwrap();
        assert!(matches!(lock_part(&part, &create()), Ok(PartLock::Replaced)));
    }
}
