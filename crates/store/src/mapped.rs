//! The filesystem store's recently read blob files, kept open and mapped for the next reader
//! of the same blob: a hot blob read again costs no `open`, no mapping set-up and tear-down
//! (an unmap interrupts every core to flush its TLB) and no copy out of the page cache — its
//! pages are read in place. Nothing is trusted for having been read before: every reader
//! still checks every chunk it hands out against the catalogue's digests, so a page the
//! kernel dropped and read back from a rotting disk meanwhile is caught like any other.
//!
//! What is kept: a blob file large enough to be mapped anyway ([`MAP_FROM`]) from its first
//! read; a smaller one (above [`READ_WHOLE_UP_TO`], which is copied whole instead) from its
//! second read within the recent past, so a scan reading many blobs once each pays nothing
//! for the mapping. Entries are found by the catalogue row they were opened for — name,
//! location (a blob file's id, never reused) and record — and by the file at that location
//! being the same file still, so a replaced or deleted blob, or a file swapped on disk
//! behind the store's back, is never served from here. The store forgets a blob's entry when
//! it is replaced or deleted, so a deleted file's space is not held by its mapping.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use bs_meta::StoredBlob;

use crate::lru::Lru;
use crate::source::{BlobSource, MAP_FROM, READ_WHOLE_UP_TO};

/// Most bytes of blob files kept mapped (address space: their pages stay the kernel's page
/// cache, which it may drop and read back as it likes).
pub const MAPPED_BYTES: usize = 4 << 30;

/// Most blob files kept open.
pub const MAPPED_FILES: usize = 1024;

/// Blobs read once recently, whose next read maps them.
const SEEN: usize = 4096;

#[derive(Clone)]
struct Kept {
    location: String,
    /// The file's identity (device, inode) when it was opened.
    file_id: (u64, u64),
    source: BlobSource,
}

pub(crate) struct MappedFiles {
    kept: Lru<String, Kept>,
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
        let same_file = std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == k.file_id);
        if same_row && same_file {
            return Some(k.source);
        }
        self.kept.remove(&s.record.name);
        None
    }

    /// Whether the file of the row `s` should be mapped and kept once opened.
    pub fn admits(&self, s: &StoredBlob) -> bool {
        let size = s.record.size;
        if size <= READ_WHOLE_UP_TO {
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

    /// Keep `source`, opened (mapped) for the row `s` from the file `file`.
    pub fn keep(&self, s: &StoredBlob, file: &std::fs::Metadata, source: &BlobSource) {
        let kept = Kept {
            location: s.location.clone(),
            file_id: (file.dev(), file.ino()),
            source: source.clone(),
        };
        // Evicted mappings are unmapped once their last reader lets go.
        drop(self.kept.put(s.record.name.clone(), kept, s.record.size.max(1) as usize));
    }

    /// Forget whatever is kept for `name` (replaced or deleted).
    pub fn forget(&self, name: &str) {
        self.kept.remove(&name.to_string());
    }
}
