//! The scrubber: re-reads every blob of a store, checks every chunk against its digest, and
//! reports (and has the store mark) the corrupt ones by name, at a bounded rate — paced chunk
//! by chunk, so a multi-gigabyte blob is read no faster than the rest — so it can run in the
//! background of a busy server, and stop promptly when asked.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Set to stop the scrub (within a chunk or a short pause).
    pub stop: Option<Arc<AtomicBool>>,
}

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub blobs: u64,
    pub bytes: u64,
    /// (name, reason) of each corrupt blob.
    pub corrupt: Vec<(String, String)>,
    /// (name, error) of blobs that could not be read for another reason (I/O errors).
    pub failed: Vec<(String, String)>,
    /// The scrub was stopped before it had checked everything.
    pub stopped: bool,
}

/// Longest single pause while pacing, so a stop request is seen promptly.
const PAUSE_SLICE: Duration = Duration::from_millis(100);

/// Scrub `store`, calling `each(blob, outcome)` after every blob; stops early (with what it
/// found so far) when `each` returns false or `opts.stop` is set.
pub fn scrub(
    store: &dyn Store,
    opts: &ScrubOptions,
    mut each: impl FnMut(&BlobRecord, &Result<(), StoreError>) -> bool,
) -> Result<ScrubReport, StoreError> {
    let mut report = ScrubReport::default();
    let start = Instant::now();
    let stopped = || opts.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed));
    let mut read = 0u64;
    // After each chunk: wait until the rate allows what was read so far, in short slices.
    let mut pace = |n: u64| {
        read += n;
        if let Some(rate) = opts.rate.filter(|r| *r > 0) {
            let due = Duration::from_secs_f64(read as f64 / rate as f64);
            while let Some(wait) = due.checked_sub(start.elapsed()) {
                if stopped() {
                    return false;
                }
                std::thread::sleep(wait.min(PAUSE_SLICE));
            }
        }
        !stopped()
    };
    let mut after = String::new();
    loop {
        let page = store.list(&opts.prefix, &after, 256)?;
        let Some(last) = page.last() else { break };
        after = last.name.clone();
        for rec in page {
            let res = store.scrub_blob(&rec.name, &mut pace);
            if matches!(res, Ok(false)) {
                report.stopped = true;
                return Ok(report);
            }
            let res = res.map(drop);
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
            if !each(&rec, &res) || stopped() {
                report.stopped = true;
                return Ok(report);
            }
        }
    }
    Ok(report)
}
