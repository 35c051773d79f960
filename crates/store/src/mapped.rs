//! The filesystem store's recently read blob files, kept open and mapped for the next reader
//! of the same blob: a hot blob read again costs no `open`, no mapping set-up and tear-down
//! (an unmap interrupts every core to flush its TLB) and no copy out of the page cache — its
//! pages are read in place. Nothing is trusted for having been read before: every reader
//! still checks every chunk it hands out against the catalogue's digests, so a page the
//! kernel dropped and read back from a rotting disk before a later read is caught by it like
//! any other.
//!
//! What is kept, per store, up to [`MAPPED_FILES`] files and [`MAPPED_BYTES`]: a blob file
//! large enough to be mapped anyway ([`MAP_FROM`], up to [`MAPPED_MAX_FILE`]) from its first
//! read; a smaller one (above [`READ_WHOLE_UP_TO`], which is copied whole instead) from its
//! second read within the recent past, so a scan reading many small blobs once each pays
//! nothing for the mapping. Entries are found by the catalogue row they were opened for — name,
//! location (a blob file's id, never reused) and record — and by the file at that location
//! being the same file still, so a replaced or deleted blob, or a file swapped on disk
//! behind the store's back, or truncated in place, is never served from here. The store
//! forgets a blob's entry when it is replaced or deleted (and an entry kept for a file
//! deleted while it was being opened is dropped at once), so a deleted file's space is not
//! held by its mapping.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use bs_meta::StoredBlob;

use crate::lru::Lru;
use crate::source::{BlobSource, MAP_FROM, READ_WHOLE_UP_TO};

/// Most bytes of blob files one store keeps mapped (address space: their pages stay the
/// kernel's page cache, which it may drop and read back as it likes).
pub const MAPPED_BYTES: usize = 4 << 30;

/// Blob files larger than this are not kept (one would push out many hot small ones).
pub const MAPPED_MAX_FILE: u64 = (MAPPED_BYTES / 8) as u64;

/// Most blob files one store keeps open (each holds a descriptor).
pub const MAPPED_FILES: usize = 256;

/// Blobs read once recently, whose next read maps them.
const SEEN: usize = 4096;

struct Kept {
    location: String,
    /// The file's identity (device, inode) when it was opened.
    file_id: (u64, u64),
    source: BlobSource,
}

pub(crate) struct MappedFiles {
    /// Shared, so a lookup (one per read) copies no more than a pointer.
    kept: Lru<String, Arc<Kept>>,
    seen: Lru<(String, String), ()>,
}

impl Default for MappedFiles {
    fn default() -> Self {
        Self { kept: Lru::new(MAPPED_BYTES, MAPPED_FILES), seen: Lru::new(SEEN, SEEN) }
    }
}

impl MappedFiles {
    /// The source kept for the row `s`, whose file is at `path`, if it is still that row's
    /// and that file's.
    pub fn get(&self, s: &StoredBlob, path: &Path) -> Option<BlobSource> {
        let k = self.kept.get(&s.record.name)?;
        let same_row = k.location == s.location && k.source.record() == &s.record;
        // The same file, still whole: one truncated in place by hand is opened again (and
        // reported as the wrong size), never read through a mapping past its end.
        let same_file = std::fs::metadata(path)
            .is_ok_and(|m| (m.dev(), m.ino()) == k.file_id && m.len() == s.record.size);
        if same_row && same_file {
            return Some(k.source.clone());
        }
        // Out of date: forget it (not a newer one another reader kept meanwhile).
        drop(self.kept.remove_if(&s.record.name, |now| Arc::ptr_eq(now, &k)));
        None
    }

    /// Whether the file of the row `s` should be mapped and kept once opened.
    pub fn admits(&self, s: &StoredBlob) -> bool {
        let size = s.record.size;
        if size <= READ_WHOLE_UP_TO || size > MAPPED_MAX_FILE {
            return false;
        }
        if size >= MAP_FROM {
            return true;
        }
        let key = (s.record.name.clone(), s.location.clone());
        if self.seen.get(&key).is_some() {
            self.seen.remove(&key);
            return true;
        }
        self.seen.put(key, (), 1);
        false
    }

    /// Keep `source`, opened (mapped) for the row `s` from the file `file`, now at `path`.
    pub fn keep(&self, s: &StoredBlob, file: &std::fs::Metadata, path: &Path, source: &BlobSource) {
        let id = (file.dev(), file.ino());
        let kept =
            Arc::new(Kept { location: s.location.clone(), file_id: id, source: source.clone() });
        // Evicted mappings are unmapped once their last reader lets go.
        drop(self.kept.put(s.record.name.clone(), kept, s.record.size.max(1) as usize));
        // Deleted or replaced while it was being opened: the store removes the file before it
        // forgets the name, so it is normally gone from `path` by now — forget it here too.
        if !std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == id) {
            self.forget_file(&s.record.name, id);
        }
    }

    /// Forget whatever is kept for `name` (replaced or deleted).
    pub fn forget(&self, name: &str) {
        drop(self.kept.remove(&name.to_string()));
    }

    /// Forget what is kept for `name` if it is the file `id` (not a newer file another
    /// reader kept meanwhile).
    fn forget_file(&self, name: &str, id: (u64, u64)) {
        drop(self.kept.remove_if(&name.to_string(), |k| k.file_id == id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bs_meta::BlobRecord;
    use bs_wire::ChunkDigests;

    #[test]
    fn a_file_deleted_while_it_was_opened_is_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data = vec![5u8; 100_000];
        std::fs::write(&path, &data).unwrap();
        let record = BlobRecord {
            name: "n".into(),
            size: data.len() as u64,
            content_type: String::new(),
            digest: String::new(),
            created_ms: 0,
            metadata: Default::default(),
        };
        let chunks = ChunkDigests::of(&data);
        let row = StoredBlob {
            record: record.clone(),
            location: "f".into(),
            chunks: Some(chunks.encode()),
            corrupt: None,
            inline: None,
        };
        let file = std::fs::File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        let src = BlobSource::file_with(record, file, chunks, None, true).unwrap();
        let m = MappedFiles::default();
        m.keep(&row, &meta, &path, &src);
        assert!(m.get(&row, &path).is_some(), "kept");
        m.forget("n");
        assert!(m.get(&row, &path).is_none(), "forgotten");
        // The store deletes the file (then forgets the name) between this reader's open and
        // its keep: the keep must not hold the file.
        std::fs::remove_file(&path).unwrap();
        m.keep(&row, &meta, &path, &src);
        assert!(m.kept.get(&"n".to_string()).is_none(), "a deleted file is not kept");
    }
}
