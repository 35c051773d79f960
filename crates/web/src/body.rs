//! Blob bytes for HTTP bodies without copying: a file blob is memory-mapped (its file is
//! never modified after commit; a replacement or delete unlinks it, which leaves a mapping
//! valid), a memory blob is shared.

use bs_store::BlobSource;
use bytes::Bytes;

use crate::error::WebError;

/// All bytes of a blob.
pub fn blob_bytes(src: BlobSource) -> Result<Bytes, WebError> {
    match src {
        BlobSource::Memory { bytes, .. } => Ok(bytes),
        BlobSource::File { file, record } => {
            if record.size == 0 {
                return Ok(Bytes::new());
            }
            // SAFETY: committed blob files are immutable (see the module comment), so the
            // mapping's contents cannot change under us.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(WebError::internal)?;
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
