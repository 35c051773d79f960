//! The background scrubber: every so often, re-read every blob at a bounded rate and check it
//! against its chunk digests, so bit rot is found (and the blob marked, so readers are refused
//! at once) before anyone asks for the blob — not years later when a study is reopened.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bs_store::{ScrubOptions, Store};
use tokio::sync::watch;

/// When and how fast the background scrubber runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrubSchedule {
    /// Wait before the first pass (let a starting server settle).
    pub first_after: Duration,
    /// Time from the start of one pass to the start of the next.
    pub every: Duration,
    /// Most bytes read per second.
    pub rate: u64,
}

/// Run passes until shutdown. A pass in progress stops at the next blob on shutdown.
pub(crate) async fn run(
    store: Arc<dyn Store>,
    schedule: ScrubSchedule,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut wait = schedule.first_after;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        let started = tokio::time::Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (store.clone(), stop.clone());
        let opts =
            ScrubOptions { prefix: String::new(), rate: Some(schedule.rate), stop: Some(st) };
        let mut pass =
            tokio::task::spawn_blocking(move || bs_store::scrub(&*s, &opts, |_, _| true));
        let res = tokio::select! {
            r = &mut pass => Some(r),
            _ = shutdown.wait_for(|s| *s) => None,
        };
        let Some(res) = res else {
            // The pass sees this within a chunk or a short pause and ends.
            stop.store(true, Ordering::Relaxed);
            let _ = pass.await;
            return;
        };
        match res {
            Ok(Ok(r)) if r.corrupt.is_empty() && r.failed.is_empty() => {
                tracing::info!(blobs = r.blobs, bytes = r.bytes, "scrub pass found nothing wrong");
            }
            Ok(Ok(r)) => {
                for (name, reason) in &r.corrupt {
                    tracing::error!(blob = %name, %reason, "scrub: blob is corrupt (marked)");
                }
                for (name, error) in &r.failed {
                    tracing::warn!(blob = %name, %error, "scrub: blob could not be read");
                }
                tracing::warn!(
                    blobs = r.blobs,
                    corrupt = r.corrupt.len(),
                    failed = r.failed.len(),
                    "scrub pass done"
                );
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "scrub pass stopped"),
            Err(e) => tracing::error!(error = %e, "scrub task failed"),
        }
        wait = schedule.every.saturating_sub(started.elapsed());
    }
}
