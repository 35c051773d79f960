//! The data plane's transfers: once [`crate::accept`] has redeemed a connection's one-time
//! token, the granted push or pull runs here, on a thread of its own.
//!
//! Any failure is answered with an `ERROR` frame naming the reason (best effort: the peer may
//! be gone) and closes only that connection. A push whose digest does not match is rolled back
//! to where it started, so no unverified byte stays in the upload.

use std::sync::Arc;
use std::time::Duration;

use bs_store::{Store, StoreError};
use bs_transport::{Conn, TransportError};
use bs_wire::{BufferPool, Digest, ErrorCode, Frame};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::ServerConfig;
use crate::status::store_code;
use crate::tokens::{Direction, Grant, TokenTable};

/// State shared by every data connection.
pub(crate) struct Shared {
    store: Arc<dyn Store>,
    pub(crate) tokens: Arc<TokenTable>,
    /// Transfers admitted by a token.
    pub(crate) slots: Arc<Semaphore>,
    /// Permits `slots` was created with.
    slot_count: u32,
    io_timeout: Duration,
    max_unsized_upload: u64,
    pool: BufferPool,
}

impl Shared {
    pub(crate) fn new(store: Arc<dyn Store>, tokens: Arc<TokenTable>, cfg: &ServerConfig) -> Self {
        let slot_count = u32::try_from(cfg.max_connections).unwrap_or(u32::MAX);
        Self {
            store,
            tokens,
            slots: Arc::new(Semaphore::new(slot_count as usize)),
            slot_count,
            io_timeout: cfg.io_timeout,
            max_unsized_upload: cfg.max_unsized_upload,
            pool: BufferPool::new(1 << 20, 64),
        }
    }

    /// Wait up to `grace` for the running transfers to end, admitting no new ones; returns
    /// how many were still running when the time ran out.
    pub(crate) async fn drain(&self, grace: Duration) -> usize {
        match tokio::time::timeout(grace, self.slots.acquire_many(self.slot_count)).await {
            Ok(Ok(all)) => {
                all.forget();
                0
            }
            _ => (self.slot_count as usize).saturating_sub(self.slots.available_permits()),
        }
    }
}

/// Why a transfer ended early: what to tell the peer, and whether it can still hear us.
struct Failure {
    code: ErrorCode,
    message: String,
    peer_gone: bool,
}

impl From<TransportError> for Failure {
    fn from(e: TransportError) -> Self {
        let (code, peer_gone) = match &e {
            TransportError::Wire(_) | TransportError::Unexpected { .. } => {
                (ErrorCode::BadFrame, false)
            }
            TransportError::Remote { code, .. } => (*code, true),
            _ => (ErrorCode::Internal, true),
        };
        Self { code, message: e.to_string(), peer_gone }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Self { code: store_code(&e), message: e.to_string(), peer_gone: false }
    }
}

fn fail(code: ErrorCode, message: impl Into<String>) -> Failure {
    Failure { code, message: message.into(), peer_gone: false }
}

/// Run the transfer `grant` allows on `conn`, holding `slot` until it ends. Blocks: call it on
/// a thread of its own.
pub(crate) fn transfer(shared: &Shared, mut conn: Conn, grant: Grant, slot: OwnedSemaphorePermit) {
    let peer = conn.peer_addr();
    let res = (|| -> Result<(), Failure> {
        let mut socket = grant.socket;
        socket.io_timeout = Some(shared.io_timeout);
        if let Some(tcp) = conn.tcp() {
            socket.apply(tcp).map_err(TransportError::from)?;
        }
        match grant.direction {
            Direction::Push => push(shared, &mut conn, &grant),
            Direction::Pull => pull(shared, &mut conn, &grant),
        }
    })();
    if let Err(f) = res {
        tracing::info!(?peer, code = ?f.code, reason = %f.message, "data transfer failed");
        if !f.peer_gone {
            let _ = conn.write_frame(&Frame::Error { code: f.code, message: f.message });
            conn.shutdown_write();
        }
    }
    drop(slot);
}

fn push(shared: &Shared, conn: &mut Conn, g: &Grant) -> Result<(), Failure> {
    let mut sink = shared.store.open_upload(&g.name)?;
    if g.offset > sink.received() {
        return Err(StoreError::Gap { offset: g.offset, received: sink.received() }.into());
    }
    // Admitted: say so (with the bytes the upload holds) before the client sends anything,
    // so a refusal up to here reaches it while it can still simply try again.
    conn.write_frame(&Frame::Ack { received: sink.received(), committed: None })?;
    let end = g.offset.saturating_add(g.length);
    let mut hasher = g.algo.hasher();
    let mut pos = g.offset;
    loop {
        match conn.read_frame()? {
            Frame::Data { offset, len }
                if sink.size().is_none()
                    && offset.checked_add(len).is_none_or(|e| e > shared.max_unsized_upload) =>
            {
                sink.truncate(g.offset)?;
                return Err(fail(
                    ErrorCode::OutOfRange,
                    format!(
                        "DATA {offset}+{len} would take an upload of unknown size past this \
                         server's limit of {} bytes; declare the size when routing",
                        shared.max_unsized_upload
                    ),
                ));
            }
            Frame::Data { offset, len } => {
                let past_size = sink.size().is_some_and(|s| offset.saturating_add(len) > s);
                if offset != pos || offset.checked_add(len).is_none_or(|e| e > end) || past_size {
                    sink.truncate(g.offset)?;
                    return Err(fail(
                        ErrorCode::OutOfRange,
                        format!(
                            "DATA {offset}+{len} outside the granted range {}+{} of a blob of {} bytes (next byte {pos})",
                            g.offset,
                            g.length,
                            sink.size().map_or("unknown".into(), |s| s.to_string())
                        ),
                    ));
                }
                if let Some(dst) = sink.lend(pos, len) {
                    // In-memory upload: read from the socket straight into the store.
                    let res = conn.recv_data_into(dst, Some(&mut hasher));
                    let got = match &res {
                        Ok(()) => len,
                        Err(TransportError::Truncated { got, .. }) => *got,
                        Err(_) => 0,
                    };
                    sink.filled(pos, got);
                    pos += got;
                    res?;
                    continue;
                }
                let mut store_err = None;
                let res = conn.recv_data_with(len, Some(&mut hasher), &shared.pool, |chunk| {
                    sink.write_at(pos, chunk).map_err(|e| {
                        let io = std::io::Error::other(e.to_string());
                        store_err = Some(e);
                        io
                    })?;
                    pos += chunk.len() as u64;
                    Ok(())
                });
                if let Some(e) = store_err {
                    if matches!(e, StoreError::StorageFull(_)) && sink.size().is_none() {
                        // Bytes of unknown size that filled the disk: free the space now
                        // rather than keep them for a resume that cannot fit either.
                        drop(sink);
                        let _ = shared.store.abort(&g.name);
                        return Err(fail(
                            ErrorCode::StorageFull,
                            format!(
                                "{e}; the upload of unknown size was discarded to free the space"
                            ),
                        ));
                    }
                    return Err(e.into());
                }
                res?;
            }
            Frame::Sum { total, final_, digest } => {
                let ours = hasher.finish();
                if total != pos - g.offset || digest != ours {
                    sink.truncate(g.offset)?;
                    return Err(fail(
                        ErrorCode::ChecksumMismatch,
                        format!(
                            "received {} bytes with digest {ours}, sender says {total} bytes with {digest}; the transfer was rolled back",
                            pos - g.offset
                        ),
                    ));
                }
                if final_ {
                    // Commit ends with this verified transfer: bytes an earlier, unconfirmed
                    // transfer left past it are dropped, never committed unchecked.
                    sink.truncate(pos)?;
                }
                let received = sink.received();
                let committed = if final_ {
                    let whole = (g.offset == 0 && pos == received).then_some(ours);
                    let rec = sink.commit(whole)?;
                    Some(
                        rec.digest
                            .parse::<Digest>()
                            .map_err(|e| fail(ErrorCode::Internal, e.to_string()))?,
                    )
                } else {
                    None
                };
                conn.write_frame(&Frame::Ack { received, committed })?;
                return Ok(());
            }
            other => {
                sink.truncate(g.offset)?;
                return Err(fail(
                    ErrorCode::BadFrame,
                    format!("expected DATA or SUM, got {other:?}"),
                ));
            }
        }
    }
}

fn pull(shared: &Shared, conn: &mut Conn, g: &Grant) -> Result<(), Failure> {
    let src = shared.store.open_read(&g.name)?;
    let rec = src.record();
    if g.blob_digest.as_deref().is_some_and(|d| d != rec.digest) {
        return Err(fail(
            ErrorCode::NotFound,
            format!("blob {:?} changed since negotiation", g.name),
        ));
    }
    if g.offset.checked_add(g.length).is_none_or(|e| e > rec.size) {
        return Err(StoreError::OutOfRange {
            name: g.name.clone(),
            offset: g.offset,
            len: g.length,
            size: rec.size,
        }
        .into());
    }
    // The stored digest covers the whole blob: if that is what is asked for, the payload needs
    // no hashing on the way out.
    let stored = (g.offset == 0 && g.length == rec.size)
        .then(|| rec.digest.parse::<Digest>().ok())
        .flatten()
        .filter(|d| d.algo == g.algo);
    let mut hasher = g.algo.hasher();
    // One DATA frame per stored chunk. Each chunk is checked against its chunk digest in
    // memory (a file's mapping) and those very bytes are sent: a corrupt chunk is never sent
    // (the ERROR frame in its place tells the client why the stream stopped). sendfile is
    // not used: it would read the file again after the check, for the same one copy.
    let mut pos = g.offset;
    for piece in src.pieces(g.offset, g.length)? {
        let piece = piece?;
        let h = if stored.is_some() { None } else { Some(&mut hasher) };
        conn.send_data_slice(pos, &piece, h)?;
        pos += piece.len() as u64;
    }
    let digest = stored.unwrap_or_else(|| hasher.finish());
    conn.write_frame(&Frame::Sum { total: g.length, final_: true, digest })?;
    Ok(())
}
