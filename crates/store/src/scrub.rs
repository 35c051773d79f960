//! The scrubber: re-reads every blob of a store, checks every chunk against its digest, and
//! reports (and has the store mark) the corrupt ones by name, at a bounded rate so it can run
//! in the background of a busy server.

use std::time::{Duration, Instant};

use bs_meta::BlobRecord;

use crate::error::StoreError;
use crate::store::Store;

/// How a scrub runs.
#[derive(Debug, Clone, Default)]
pub struct ScrubOptions {
    /// Only blobs whose names start with this.
    pub prefix: String,
    /// Most bytes read per second; `None`: as fast as the disk goes.
    pub rate: Option<u64>,
}

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub blobs: u64,
    pub bytes: u64,
    /// (name, reason) of each corrupt blob.
    pub corrupt: Vec<(String, String)>,
    /// (name, error) of blobs that could not be read for another reason (gone meanwhile, I/O).
    pub failed: Vec<(String, String)>,
}

/// Scrub `store`, calling `each(blob, outcome)` after every blob; stops early (with what it
/// found so far) when `each` returns false.
pub fn scrub(
    store: &dyn Store,
    opts: &ScrubOptions,
    mut each: impl FnMut(&BlobRecord, &Result<(), StoreError>) -> bool,
) -> Result<ScrubReport, StoreError> {
    let mut report = ScrubReport::default();
    let start = Instant::now();
    let mut after = String::new();
    loop {
        let page = store.list(&opts.prefix, &after, 256)?;
        let Some(last) = page.last() else { break };
        after = last.name.clone();
        for rec in page {
            let res = store.scrub_blob(&rec.name);
            report.blobs += 1;
            match &res {
                Ok(()) => report.bytes += rec.size,
                Err(StoreError::Corrupt { reason, .. }) => {
                    report.bytes += rec.size;
                    report.corrupt.push((rec.name.clone(), reason.clone()));
                }
                Err(StoreError::NotFound(_)) => {} // deleted since it was listed
                Err(e) => report.failed.push((rec.name.clone(), e.to_string())),
            }
            if !each(&rec, &res) {
                return Ok(report);
            }
            if let Some(rate) = opts.rate.filter(|r| *r > 0) {
                let due = Duration::from_secs_f64(report.bytes as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
    }
    Ok(report)
}
