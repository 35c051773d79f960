//! Housekeeping while the server runs: uploads left pending longer than the configured time
//! (a client that never came back, a push of unknown size that ran into a full disk) are
//! discarded every hour, not only at the next start.

use std::sync::Arc;
use std::time::Duration;

use bs_store::Store;
use tokio::sync::watch;

/// How often pending uploads are looked at.
const EVERY: Duration = Duration::from_secs(3600);

pub(crate) async fn run(store: Arc<dyn Store>, ttl: Duration, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.expire_uploads(ttl)).await {
            Ok(Ok(gone)) if !gone.is_empty() => {
                tracing::info!(count = gone.len(), "discarded uploads pending for too long");
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "expiring pending uploads failed"),
            Err(e) => tracing::error!(error = %e, "expiring pending uploads failed"),
        }
    }
}
