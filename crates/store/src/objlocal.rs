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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::object::{Backend, OwnRuntime};

/// Clients a store has at most, lent or idle; a GET that finds them all lent goes through
/// the shared client (no client made and thrown away for each GET beyond these).
const MAX_CLIENTS: usize = 8;

/// Makes a client of the store's bucket.
pub(crate) type MakeBackend = Box<dyn Fn() -> Option<Arc<dyn Backend>> + Send + Sync>;

/// A bucket client and the runtime it runs on.
pub(crate) struct Lent {
    pub(crate) rt: OwnRuntime,
    pub(crate) os: Arc<dyn Backend>,
}

impl Lent {
    /// Run `f` to its end on this client's runtime, from a blocking caller (kept off any
    /// executor the caller may be on: see [`bs_meta::off_executor`]).
    pub(crate) fn block_on<F: std::future::Future + Send>(&self, f: F) -> F::Output
    where
        F::Output: Send,
    {
        bs_meta::off_executor(|| self.rt.block_on(f))
    }
}

/// The clients of one store.
pub(crate) struct LocalClients {
    make: MakeBackend,
    idle: Mutex<Vec<Lent>>,
    /// Clients made and not dropped.
    made: AtomicUsize,
}

impl LocalClients {
    pub(crate) fn new(make: MakeBackend) -> Self {
        Self { make, idle: Mutex::new(Vec::new()), made: AtomicUsize::new(0) }
    }

    /// An idle client, or a new one; `None` if [`MAX_CLIENTS`] are lent or none can be
    /// made (the caller then uses the store's shared client).
    pub(crate) fn take(&self) -> Option<Lent> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if let Some(l) = idle {
            // What happened while it sat idle (a connection the server closed) is taken in
            // before its next request; a request sent on such a connection all the same is
            // retried by the client.
            run_ready(&l);
            return Some(l);
        }
        self.made
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_CLIENTS).then_some(n + 1)
            })
            .ok()?;
        let made = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()
            .and_then(|rt| Some(Lent { rt: OwnRuntime::new(rt), os: (self.make)()? }));
        if made.is_none() {
            self.made.fetch_sub(1, Ordering::AcqRel);
        }
        made
    }

    /// Give `l` back for the next GET. Its runtime first runs what is ready — a connection
    /// finishing its answer, or closing after an answer not read to its end — so that it
    /// is pooled again, or dropped, before anyone takes it.
    pub(crate) fn give(&self, l: Lent) {
        run_ready(&l);
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(l);
    }
}

/// Let `l`'s runtime take in I/O events and run the tasks ready, twice (the tasks a poll of
/// its driver wakes run on the next round).
fn run_ready(l: &Lent) {
    l.block_on(async {
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
    });
}
