//! Keeps the image index in step with the store, whichever door a write came through (a
//! data-plane push, the Blob API, an HTTP upload, a delete over gRPC): the store announces
//! every commit and delete, and one background thread indexes new images and forgets deleted
//! ones, so `/api/search` finds a study the moment it is stored, not at the next restart.

use std::sync::{Arc, mpsc};

use bs_store::StoreEvent;

use crate::AppState;
use crate::error::WebError;

/// Subscribe to `state`'s store and start the indexing thread. The thread holds the state
/// weakly and ends when the store (and so the subscription) goes away.
pub(crate) fn follow_store(state: &Arc<AppState>) {
    let (tx, rx) = mpsc::channel::<StoreEvent>();
    state.store.subscribe(Arc::new(move |e: &StoreEvent| {
        let _ = tx.send(e.clone());
    }));
    let weak = Arc::downgrade(state);
    let spawned = std::thread::Builder::new().name("blobstream-index".into()).spawn(move || {
        for event in rx {
            let Some(st) = weak.upgrade() else { return };
            match event {
                StoreEvent::Committed(rec) => {
                    if st.images.known(&rec).is_some() {
                        continue; // indexed already (the HTTP upload path does it in line)
                    }
                    match st.images.refresh(&rec.name) {
                        Ok(_) | Err(WebError::NotFound(_)) => {}
                        Err(e) => tracing::warn!("indexing {}: {e}", rec.name),
                    }
                }
                StoreEvent::Deleted(name) => {
                    if let Err(e) = st.images.index().forget(&name) {
                        tracing::warn!("forgetting {name} in the image index: {e}");
                    }
                }
            }
        }
    });
    if let Err(e) = spawned {
        tracing::error!("cannot start the indexing thread: {e}; search follows HTTP writes only");
    }
}
