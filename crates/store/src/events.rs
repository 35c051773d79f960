//! Commit and delete notifications: whoever keeps state derived from the blobs (the image
//! index, caches) subscribes once and hears of every change, whichever door it came through —
//! a data-plane push, an HTTP upload, the Blob API, a delete over gRPC.

use std::sync::{Arc, RwLock};

use bs_meta::BlobRecord;

/// A change to the committed blobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreEvent {
    /// A blob became visible (new, or replacing one of the same name).
    Committed(BlobRecord),
    /// A blob was deleted.
    Deleted(String),
}

/// Called after each change, on the thread that made it: keep it short (hand work to a queue).
pub type Listener = Arc<dyn Fn(&StoreEvent) + Send + Sync>;

/// The listeners of one store.
#[derive(Default, Clone)]
pub(crate) struct Listeners(Arc<RwLock<Vec<Listener>>>);

impl Listeners {
    pub(crate) fn add(&self, l: Listener) {
        self.0.write().unwrap_or_else(|p| p.into_inner()).push(l);
    }

    pub(crate) fn notify(&self, e: StoreEvent) {
        for l in self.0.read().unwrap_or_else(|p| p.into_inner()).iter() {
            l(&e);
        }
    }
}
