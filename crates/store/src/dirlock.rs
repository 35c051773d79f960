//! One store per data directory: a file store holds an exclusive lock on `DIR/lock` while it
//! is open, so a second server started on the same directory is refused at start-up instead
//! of removing, as "unreferenced", the files of blobs the first one is committing. The lock
//! file holds the process id of its holder, for the message; the kernel drops the lock when
//! the holder exits, however it ends.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::StoreError;

/// How long an open waits for the lock before it says who holds it: a store closed in this
/// process a moment ago (a restart) may still be letting go of it.
const WAIT: Duration = Duration::from_secs(3);

/// [`unwritable`] for the data directory itself: one given as a file is said to be that
/// (creating it over a file says only "File exists").
pub(crate) fn not_a_folder(root: &Path, e: std::io::Error) -> StoreError {
    if root.exists() && !root.is_dir() {
        return StoreError::Config(format!(
            "the data directory {} is a file, not a folder: give a folder's path to --data",
            root.display()
        ));
    }
    unwritable(root, e)
}

/// A data directory's file or folder that the server cannot write, named.
pub(crate) fn unwritable(path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Config(format!("cannot write in the data directory: {}: {e}", path.display()))
}

/// Check at start-up that `dir` takes new files (a folder left read-only, or owned by another
/// user, would otherwise fail every upload later with an error naming no path).
pub(crate) fn check_writable(dir: &Path) -> Result<(), StoreError> {
    let probe = dir.join(format!(".write-check-{}", std::process::id()));
    File::create(&probe).map_err(|e| unwritable(dir, e))?;
    std::fs::remove_file(&probe).map_err(|e| unwritable(dir, e))
}

/// The lock on a data directory, released when dropped.
pub(crate) struct DirLock {
    _file: File,
}

impl DirLock {
    pub(crate) fn take(root: &Path) -> Result<Self, StoreError> {
        let path = root.join("lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| unwritable(&path, e))?;
        let until = Instant::now() + WAIT;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    let holder = match holder.trim() {
                        "" => String::new(),
                        pid => format!(" (process {pid})"),
                    };
                    return Err(StoreError::Config(format!(
                        "the data directory {} is in use by another blobstream server{holder}: \
                         stop it first, or give this one a directory of its own",
                        root.display()
                    )));
                }
                // A filesystem without locks (some network mounts): said, and served unlocked.
                Err(std::fs::TryLockError::Error(e))
                    if e.kind() == std::io::ErrorKind::Unsupported =>
                {
                    tracing::warn!(
                        "{} cannot be locked ({e}): nothing stops a second server on this \
                         directory",
                        path.display()
                    );
                    break;
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(unwritable(&path, e)),
            }
        }
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_first_and_gets_it_once_released() {
        let t = tempfile::tempdir().unwrap();
        let first = DirLock::take(t.path()).unwrap();
        let e = DirLock::take(t.path()).err().expect("refused while held").to_string();
        assert!(e.contains("in use by another blobstream server"), "{e}");
        assert!(e.contains(&format!("(process {})", std::process::id())), "{e}");
        drop(first);
        DirLock::take(t.path()).unwrap();
    }

    #[test]
    fn a_file_given_as_the_data_directory_is_said_to_be_one() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("afile");
        std::fs::write(&file, b"x").unwrap();
        let e = std::fs::create_dir_all(&file).unwrap_err();
        let said = not_a_folder(&file, e).to_string();
        assert!(said.contains("is a file, not a folder"), "{said}");
    }
}
