//! One GET of an object whose body the reading thread takes as it arrives — for
//! [`crate::RangeRead::arriving`]: the data plane sends a small blob's bytes on while the rest
//! are still coming, each chunk checked as its last byte goes by (`BlobSource::arriving`).
//!
//! The reading thread polls the response body itself (no task in between handing pieces
//! over: one wake-up per piece less), and takes with each piece whatever else has already
//! arrived, so the pieces it hands on are few and large. That costs a copy of what is put
//! together, and is still faster: handing on each piece as the HTTP client received it
//! (no copy, many more DATA frames) measured slower — a 1 MB get at 0.77–0.89 of
//! object_store alone against 0.86–0.92 put together, paired runs on a 2-core machine.
//!
//! On S3 the GET goes through a client lent to the reading thread (`objlocal.rs`), which
//! then also writes the request and reads the answer's bytes off the socket itself.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::stream::BoxStream;
use futures_util::{FutureExt, StreamExt};
use object_store::path::Path as ObjPath;
use object_store::{GetOptions, GetRange, GetResult};
use tokio::task::JoinHandle;

use crate::error::StoreError;
use crate::object::{Backend, Inner, os_error};
use crate::objlocal::Lent;

type Result<T> = std::result::Result<T, StoreError>;

/// Bytes `from..to` of one object, as they arrive; see the module doc.
pub(crate) struct EarlyGet {
    store: Arc<Inner>,
    name: String,
    /// The request, until its answer is in.
    response: Option<JoinHandle<object_store::Result<GetResult>>>,
    body: Option<BoxStream<'static, object_store::Result<Bytes>>>,
    /// An error that came after bytes taken with it: the next item.
    failed: Option<object_store::Error>,
    /// The client the GET runs on, if lent one; else the store's shared one.
    lent: Option<Lent>,
}

impl EarlyGet {
    /// Send the GET of `from..to` of `key` (`size` bytes long): now on the shared client, at
    /// the first [`Iterator::next`] on a lent one.
    pub(crate) fn start(
        store: Arc<Inner>,
        name: &str,
        os: Arc<dyn Backend>,
        key: ObjPath,
        (from, to): (u64, u64),
        size: u64,
    ) -> Self {
        // The whole object is one plain GET (a ranged request costs the server more).
        let range = (from > 0 || to < size).then_some(GetRange::Bounded(from..to));
        let lent = store.local.as_ref().and_then(|l| l.take());
        let (rt, os) = match &lent {
            Some(l) => (&*l.rt, l.os.clone()),
            None => (&*store.rt, os),
        };
        // On a lent client's runtime the task starts when the reader first waits for it.
        let response =
            rt.spawn(
                async move { os.get_opts(&key, GetOptions { range, ..Default::default() }).await },
            );
        let name = name.to_string();
        Self { store, name, response: Some(response), body: None, failed: None, lent }
    }

    /// Run `f` to its end on the runtime the GET runs on.
    fn run<F: std::future::Future + Send>(&self, f: F) -> F::Output
    where
        F::Output: Send,
    {
        match &self.lent {
            Some(l) => l.block_on(f),
            None => self.store.block_on(f),
        }
    }

    fn error(&self, e: object_store::Error) -> StoreError {
        os_error(&format!("reading {:?}", self.name), e)
    }
}

impl Iterator for EarlyGet {
    type Item = Result<Bytes>;

    fn next(&mut self) -> Option<Result<Bytes>> {
        if let Some(e) = self.failed.take() {
            self.body = None;
            return Some(Err(self.error(e)));
        }
        if let Some(response) = self.response.take() {
            let got = self
                .run(response)
                .unwrap_or_else(|e| Err(object_store::Error::JoinError { source: e }));
            match got {
                Ok(r) => self.body = Some(r.into_stream()),
                Err(e) => return Some(Err(self.error(e))),
            }
        }
        let mut body = self.body.take()?;
        let (got, failed) = self.run(async {
            let first = match body.next().await {
                Some(Ok(b)) => b,
                Some(Err(e)) => return (Some(Err(e)), None),
                None => return (None, None),
            };
            // With it, whatever else is here already.
            let mut more: Option<BytesMut> = None;
            let mut failed = None;
            loop {
                match body.next().now_or_never() {
                    Some(Some(Ok(b))) => more
                        .get_or_insert_with(|| {
                            let mut m = BytesMut::with_capacity(first.len() + b.len());
                            m.extend_from_slice(&first);
                            m
                        })
                        .extend_from_slice(&b),
                    Some(Some(Err(e))) => {
                        failed = Some(e);
                        break;
                    }
                    Some(None) | None => break,
                }
            }
            (Some(Ok(more.map_or(first, BytesMut::freeze))), failed)
        });
        self.body = Some(body);
        self.failed = failed;
        match got {
            Some(Ok(b)) => Some(Ok(b)),
            Some(Err(e)) => {
                self.body = None;
                Some(Err(self.error(e)))
            }
            None => {
                self.body = None;
                None
            }
        }
    }
}

impl Drop for EarlyGet {
    fn drop(&mut self) {
        if let Some(r) = self.response.take() {
            r.abort();
        }
        // A body not read to its end closes its connection rather than pool it.
        self.body = None;
        if let (Some(l), Some(local)) = (self.lent.take(), self.store.local.as_ref()) {
            local.give(l);
        }
    }
}
