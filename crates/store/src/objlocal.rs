//! Bucket clients on runtimes of their own, lent one at a time to the thread that sends a
//! small GET's bytes on as they arrive (`objearly.rs`), which drives the client itself.
//!
//! On the store's shared runtime a small GET costs two hand-offs between threads on top of
//! the network: the sending thread asks a runtime worker to write the request, and each
//! piece of the answer that worker reads is handed back. On a 2-core machine that also runs
//! the object store, each hand-off can wait a scheduler slice for a core (a trace of the
//! S3 benchmark showed 0.5 ms between the request being asked for and written). A client of
//! its own on a current-thread runtime lets the sending thread write the request and read
//! the answer with no other thread in between.
//!
//! A current-thread runtime runs its tasks (the client's pooled connections among them)
//! only while a thread blocks on it, so a lent client is used by one thread at a time, and
//! it is given back idle, its connections ready for the next GET. Only S3 backends are made
//! this way (a fresh client of the same bucket); an in-memory store must be shared.

use std::sync::{Arc, Mutex};

use crate::object::{Backend, OwnRuntime};

/// Clients kept idle at most; more are dropped when given back.
const IDLE_CLIENTS: usize = 8;

/// Makes a client of the store's bucket.
pub(crate) type MakeBackend = Box<dyn Fn() -> Option<Arc<dyn Backend>> + Send + Sync>;

/// A bucket client and the runtime it runs on.
pub(crate) struct Lent {
    pub(crate) rt: OwnRuntime,
    pub(crate) os: Arc<dyn Backend>,
}

/// The clients of one store.
pub(crate) struct LocalClients {
    make: MakeBackend,
    idle: Mutex<Vec<Lent>>,
}

impl LocalClients {
    pub(crate) fn new(make: MakeBackend) -> Self {
        Self { make, idle: Mutex::new(Vec::new()) }
    }

    /// An idle client, or a new one; `None` if none can be made (the caller then uses the
    /// store's shared client).
    pub(crate) fn take(&self) -> Option<Lent> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if let Some(l) = idle {
            // A connection the server closed while the client sat idle is noticed now,
            // not by the request sent on it.
            bs_meta::off_executor(|| l.rt.block_on(tokio::task::yield_now()));
            return Some(l);
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        Some(Lent { rt: OwnRuntime::new(rt), os: (self.make)()? })
    }

    /// Give `l` back for the next GET. Its runtime first runs what is ready — a connection
    /// finishing its answer, or noticing that the server closed it — so that it is pooled
    /// again, or dropped, before anyone takes it.
    pub(crate) fn give(&self, l: Lent) {
        bs_meta::off_executor(|| l.rt.block_on(tokio::task::yield_now()));
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < IDLE_CLIENTS {
            idle.push(l);
        }
    }
}
