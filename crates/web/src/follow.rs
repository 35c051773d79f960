//! Keeps the image index in step with the store, whichever door a write came through (a
//! data-plane push, the Blob API, an HTTP upload, a delete over gRPC): the store announces
//! every commit and delete, and one background thread brings the index entry of each changed
//! name up to date, so `/api/search` finds a study the moment it is stored, not at the next
//! restart.
//!
//! The queue holds names, not events: a name changed many times is looked at once, memory is
//! bounded by the number of distinct names waiting, and each name is settled by what the store
//! holds when the thread gets to it (so a delete and a re-put racing each other cannot leave
//! the index forgetting a blob that exists).

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use bs_store::{StoreError, StoreEvent};

use crate::AppState;
use crate::error::WebError;

/// Names waiting to be looked at.
#[derive(Default)]
struct Dirty {
    names: Mutex<BTreeSet<String>>,
    wake: Condvar,
}

/// Subscribe to `state`'s store and start the indexing thread. The thread holds the state
/// weakly and ends within a second of the state going away.
pub(crate) fn follow_store(state: &Arc<AppState>) {
    let dirty = Arc::new(Dirty::default());
    let d = Arc::downgrade(&dirty);
    state.store.subscribe(Arc::new(move |e: &StoreEvent| {
        let Some(d) = d.upgrade() else { return };
        let name = match e {
            StoreEvent::Committed(rec) => rec.name.clone(),
            StoreEvent::Deleted(name) => name.clone(),
        };
        d.names.lock().unwrap_or_else(|p| p.into_inner()).insert(name);
        d.wake.notify_one();
    }));
    let weak = Arc::downgrade(state);
    let spawned = std::thread::Builder::new()
        .name("blobstream-index".into())
        .spawn(move || run(&weak, &dirty));
    if let Err(e) = spawned {
        tracing::error!("cannot start the indexing thread: {e}; search follows HTTP writes only");
    }
}

fn run(state: &Weak<AppState>, dirty: &Dirty) {
    // Blobs found to be no image, recorded together once no name waits or there are
    // `NOTE_AT_ONCE` of them (see `Images::note_not_images`).
    let mut not_images = Vec::new();
    loop {
        let name = {
            let mut names = dirty.names.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if not_images.len() >= NOTE_AT_ONCE || (names.is_empty() && !not_images.is_empty())
                {
                    drop(names);
                    note(state, &mut not_images);
                    names = dirty.names.lock().unwrap_or_else(|p| p.into_inner());
                }
                if let Some(n) = names.pop_first() {
                    break n;
                }
                if state.strong_count() == 0 {
                    return;
                }
                names = dirty
                    .wake
                    .wait_timeout(names, Duration::from_secs(1))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        };
        let Some(st) = state.upgrade() else { return };
        settle(&st, &name, &mut not_images);
    }
}

/// Most blobs found to be no image that wait to be recorded together.
const NOTE_AT_ONCE: usize = 256;

/// Record `not_images` in the index, in one write.
fn note(state: &Weak<AppState>, not_images: &mut Vec<(String, String)>) {
    let Some(st) = state.upgrade() else { return };
    if let Err(e) = st.images.note_not_images(not_images) {
        tracing::warn!("indexing {} blobs that are no image: {e}", not_images.len());
    }
    not_images.clear();
}

/// Make the index entry of `name` describe what the store holds now (or, for a blob that is
/// no image, add it to `not_images` for the caller to record).
fn settle(st: &AppState, name: &str, not_images: &mut Vec<(String, String)>) {
    // Changed again since it was found to be no image: settled afresh, by what it is now.
    not_images.retain(|(n, _)| n != name);
    match st.store.stat(name) {
        Ok(rec) if st.images.known(&rec).is_some() => {} // indexed already (HTTP uploads do it)
        Ok(_) => match st.images.refresh_or_note(name, not_images, || ()) {
            Ok(_) | Err(WebError::NotFound(_)) => {}
            Err(e) => tracing::warn!("indexing {name}: {e}"),
        },
        Err(StoreError::NotFound(_)) => {
            if let Err(e) = st.images.index().forget(name) {
                tracing::warn!("forgetting {name} in the image index: {e}");
            }
        }
        Err(e) => tracing::warn!("indexing {name}: {e}"),
    }
}
