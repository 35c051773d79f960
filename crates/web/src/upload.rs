//! Streaming an HTTP body into the store: chunks go through a bounded channel to one blocking
//! writer (the store's calls block), so a blob is never held in memory whole and a slow disk
//! slows the client down instead of filling memory. The upload commits only when the body
//! ended normally with every promised byte; otherwise it is aborted and nothing is visible.

use std::sync::Arc;

use bs_meta::BlobRecord;
use bs_store::{RouteSpec, Store, UploadSink};
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};

use crate::error::WebError;

/// What to store, and the limits of this upload.
pub struct UploadSpec {
    /// Name, declared length (Content-Length, if any: fewer or more bytes fail the upload),
    /// content type, metadata, and whether (and over which digests not) to replace.
    pub route: RouteSpec,
    /// Refuse more than this many bytes.
    pub max_bytes: u64,
    /// How the client must keep sending; `None` when the body this upload is a part of is
    /// paced as a whole already (a multipart POST), so the part is not paced again.
    pub pace: Option<Pace>,
}

/// How an upload's client must keep sending.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Give up when the client sends nothing for this long.
    pub idle: std::time::Duration,
    /// Give up when, past the first `idle`, fewer bytes than this a second (on average since
    /// the start) have come: a client trickling a byte now and then holds an upload slot and a
    /// thread no longer. 0: no floor.
    pub min_rate: u64,
}

impl UploadSpec {
    /// The limits of `st`'s uploads for `route`.
    pub(crate) fn new(st: &crate::AppState, route: RouteSpec) -> Self {
        Self {
            route,
            max_bytes: st.cfg.max_upload,
            pace: Some(Pace { idle: st.cfg.idle_timeout, min_rate: st.cfg.min_upload_rate }),
        }
    }
}

enum Msg {
    Data(Bytes),
    Finish,
}

/// Store everything `body` yields under `spec.route.name`.
pub async fn store_stream<E, S>(
    store: Arc<dyn Store>,
    spec: UploadSpec,
    body: S,
) -> Result<BlobRecord, WebError>
where
    E: std::fmt::Display,
    S: Stream<Item = Result<Bytes, E>>,
{
    let body = match spec.pace {
        None => crate::paced::Paced::unpaced(Box::pin(body)),
        Some(p) => crate::paced::Paced::new(Box::pin(body), p.idle, p.min_rate),
    };
    let mut body = std::pin::pin!(body);
    if let Some(size) = spec.route.size
        && size > spec.max_bytes
    {
        if size <= DRAIN_MAX {
            drain(&mut body).await;
        }
        return Err(too_large(size, spec.max_bytes));
    }
    // What a client asks to store is checked here, at the edge (the stores take back records
    // stored before as they are).
    bs_store::validate_route(&spec.route)?;
    let (tx, rx) = mpsc::channel::<Msg>(16);
    let writer = {
        let store = store.clone();
        let route = spec.route.clone();
        tokio::task::spawn_blocking(move || write_all(store, route, rx))
    };
    let mut total = 0u64;
    let outcome = loop {
        match body.next().await.transpose() {
            Ok(Some(chunk)) => {
                total += chunk.len() as u64;
                if total > spec.max_bytes {
                    drain(&mut body).await;
                    break Err(too_large(total, spec.max_bytes));
                }
                if let Some(size) = spec.route.size
                    && total > size
                {
                    break Err(WebError::BadRequest(format!(
                        "body is longer than its Content-Length of {size} bytes"
                    )));
                }
                if tx.send(Msg::Data(chunk)).await.is_err() {
                    // The writer failed (storage full, the name busy, …); its error is
                    // reported below, after the rest of the body is read (see `drain`).
                    drain(&mut body).await;
                    break Ok(());
                }
            }
            Ok(None) => {
                if let Some(size) = spec.route.size
                    && total < size
                {
                    break Err(truncated(total, Some(size)));
                }
                let _ = tx.send(Msg::Finish).await;
                break Ok(());
            }
            // (For a part of a body paced as a whole, the body's own pace failure is `e`:
            // its count is the body's, `total` this part's.)
            Err(crate::paced::PaceError::Body(e)) => {
                let name = &spec.route.name;
                break Err(WebError::BadRequest(format!(
                    "upload of {name:?} interrupted after {total} bytes: {e}"
                )));
            }
            // Stalled, or too slow: said as such.
            Err(e) => break Err(WebError::BadRequest(e.to_string())),
        }
    };
    drop(tx); // without Finish, the writer aborts
    let written = writer.await.map_err(WebError::internal)?;
    outcome?;
    written
}

/// A refused body up to this size is read (and dropped) before the answer goes out.
const DRAIN_MAX: u64 = 1 << 20;

/// Read and drop what is left of a refused body — at most [`DRAIN_MAX`] bytes, for at most two
/// seconds. Closing a connection with unread bytes makes the kernel reset it, and a reset can
/// destroy the error response before the client reads it.
pub(crate) async fn drain<E, S: Stream<Item = Result<Bytes, E>>>(body: &mut std::pin::Pin<&mut S>) {
    let work = async {
        let mut n = 0u64;
        while let Some(Ok(chunk)) = body.next().await {
            n += chunk.len() as u64;
            if n > DRAIN_MAX {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), work).await;
}

fn too_large(n: u64, max: u64) -> WebError {
    WebError::TooLarge(format!("upload of {n} bytes or more exceeds the limit of {max} bytes"))
}

fn truncated(got: u64, size: Option<u64>) -> WebError {
    match size {
        Some(s) => WebError::BadRequest(format!("upload truncated: {got} of {s} bytes arrived")),
        None => WebError::BadRequest(format!("upload truncated after {got} bytes")),
    }
}

/// The blocking side: route, write every chunk, commit on `Finish`, abort otherwise.
fn write_all(
    store: Arc<dyn Store>,
    route: RouteSpec,
    mut rx: mpsc::Receiver<Msg>,
) -> Result<BlobRecord, WebError> {
    let name = route.name.clone();
    let routed = store.route(&route)?;
    let mut sink = match bs_store::open_routed(store.as_ref(), &route, &routed) {
        Ok(s) => s,
        Err(e) => {
            if !e.upload_is_anothers() {
                abort(store.as_ref(), &name);
            }
            return Err(e.into());
        }
    };
    let mut offset = sink.received();
    loop {
        match rx.blocking_recv() {
            Some(Msg::Data(b)) => {
                if let Err(e) = sink.write_at(offset, &b) {
                    discard(store.as_ref(), &name, sink);
                    return Err(e.into());
                }
                offset += b.len() as u64;
            }
            Some(Msg::Finish) => {
                return sink.commit(None).map_err(|e| {
                    abort(store.as_ref(), &name);
                    e.into()
                });
            }
            None => {
                discard(store.as_ref(), &name, sink);
                return Err(truncated(offset, route.size));
            }
        }
    }
}

/// Drop a failed upload. Its staged bytes are given back first: when the disk is full (often
/// because of this very upload), removing the pending-upload row needs room in the catalogue's
/// database, and a row whose removal failed would stay behind, pending, with its bytes.
fn discard(store: &dyn Store, name: &str, mut sink: Box<dyn UploadSink>) {
    if let Err(e) = sink.truncate(0) {
        tracing::warn!("discarding the upload of {name}: truncating its staged bytes: {e}");
    }
    drop(sink); // the writer's claim on the name goes with it
    abort(store, name);
}

fn abort(store: &dyn Store, name: &str) {
    if let Err(e) = store.abort(name) {
        tracing::warn!("discarding the upload of {name}: {e}");
    }
}
