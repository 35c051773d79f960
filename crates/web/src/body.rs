//! Blob bytes for HTTP bodies without copying: a file blob is memory-mapped (its file is
//! never modified after commit; a replacement or delete unlinks it, which leaves a mapping
//! valid), a memory blob is shared.

use bs_store::BlobSource;
use bytes::Bytes;

use crate::error::WebError;

/// Blobs up to this size are mapped with their pages populated up front.
const POPULATE_MAX: u64 = 16 << 20;

/// All bytes of a blob.
pub fn blob_bytes(src: BlobSource) -> Result<Bytes, WebError> {
    match src {
        BlobSource::Memory { bytes, .. } => Ok(bytes),
        BlobSource::File { file, record } => {
            if record.size == 0 {
                return Ok(Bytes::new());
            }
            // Small blobs are mapped with every page present (one kernel pass instead of a
            // page fault per few pages while sending); large ones fault in as they are sent.
            let mut opts = memmap2::MmapOptions::new();
            if record.size <= POPULATE_MAX {
                opts.populate();
            }
            // SAFETY: committed blob files are immutable (see the module comment), so the
            // mapping's contents cannot change under us.
            let map = unsafe { opts.map(&file) }.map_err(WebError::internal)?;
            if (map.len() as u64) < record.size {
                return Err(WebError::Internal(format!(
                    "blob {:?} is corrupt on disk: file holds {} bytes, catalogue says {}",
                    record.name,
                    map.len(),
                    record.size
                )));
            }
            let _ = map.advise(memmap2::Advice::Sequential);
            Ok(Bytes::from_owner(map).slice(..record.size as usize))
        }
    }
}
