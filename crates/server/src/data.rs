//! The data plane: accepts TCP connections, redeems the one-time token in the first frame,
//! then runs the granted push or pull on a thread of its own.
//!
//! Any failure is answered with an `ERROR` frame naming the reason (best effort: the peer may
//! be gone) and closes only that connection. A push whose digest does not match is rolled back
//! to where it started, so no unverified byte stays in the upload.

use std::sync::Arc;
use std::time::Duration;

use bs_store::{BlobSource, Store, StoreError};
use bs_transport::{Conn, FileSource, TransportError};
use bs_wire::{BufferPool, Digest, ErrorCode, Frame};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::config::ServerConfig;
use crate::status::store_code;
use crate::tokens::{Direction, Grant, TokenTable};

/// State shared by every data connection.
pub(crate) struct Shared {
    store: Arc<dyn Store>,
    tokens: Arc<TokenTable>,
    /// Connections that have not presented a token yet.
    greeting: Arc<Semaphore>,
    /// Transfers admitted by a token.
    slots: Arc<Semaphore>,
    io_timeout: Duration,
    hello_timeout: Duration,
    pool: BufferPool,
    tls: Option<bs_transport::TlsServer>,
}

impl Shared {
    pub(crate) fn new(store: Arc<dyn Store>, tokens: Arc<TokenTable>, cfg: &ServerConfig) -> Self {
        Self {
            store,
            tokens,
            greeting: Arc::new(Semaphore::new(cfg.max_connections)),
            slots: Arc::new(Semaphore::new(cfg.max_connections)),
            io_timeout: cfg.io_timeout,
            hello_timeout: cfg.hello_timeout,
            pool: BufferPool::new(1 << 20, 64),
            tls: cfg.tls.clone(),
        }
    }
}

/// Accept data connections until shutdown.
pub(crate) async fn accept_loop(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "data plane accept failed");
                continue;
            }
        };
        let stream = match stream.into_std().and_then(|s| s.set_nonblocking(false).map(|_| s)) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, %peer, "cannot hand data connection to a thread");
                continue;
            }
        };
        let permit = shared.greeting.clone().try_acquire_owned();
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = match &shared.tls {
                None => Conn::new(stream),
                Some(tls) => match Conn::tls_server(stream, tls) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, %peer, "cannot start TLS");
                        return;
                    }
                },
            };
            if permit.is_err() {
                let _ = conn.write_frame(&busy());
                return;
            }
            handle(&shared, &mut conn, permit.ok());
        });
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

fn busy() -> Frame {
    Frame::Error {
        code: ErrorCode::Busy,
        message: "server is at its data connection limit; retry later".into(),
    }
}

fn fail(code: ErrorCode, message: impl Into<String>) -> Failure {
    Failure { code, message: message.into(), peer_gone: false }
}

fn handle(shared: &Shared, conn: &mut Conn, greeting: Option<OwnedSemaphorePermit>) {
    let peer = conn.peer_addr();
    let res = (|| -> Result<(), Failure> {
        let token = match conn.read_frame_within(shared.hello_timeout)? {
            Frame::Hello { token } => token,
            other => {
                return Err(fail(ErrorCode::BadFrame, format!("expected HELLO, got {other:?}")));
            }
        };
        let grant = shared.tokens.redeem(&token).map_err(|code| {
            let why = match code {
                ErrorCode::TokenExpired => "token expired; negotiate again",
                ErrorCode::TokenReused => "token already used; negotiate again",
                _ => "unknown token",
            };
            fail(code, why)
        })?;
        drop(greeting);
        let _slot = shared.slots.clone().try_acquire_owned().map_err(|_| {
            fail(ErrorCode::Busy, "server is at its data transfer limit; retry later")
        })?;
        let mut socket = grant.socket;
        socket.io_timeout = Some(shared.io_timeout);
        socket.apply(conn.stream()).map_err(TransportError::from)?;
        match grant.direction {
            Direction::Push => push(shared, conn, &grant),
            Direction::Pull => pull(shared, conn, &grant),
        }
    })();
    if let Err(f) = res {
        tracing::info!(?peer, code = ?f.code, reason = %f.message, "data transfer failed");
        if !f.peer_gone {
            let _ = conn.write_frame(&Frame::Error { code: f.code, message: f.message });
            conn.shutdown_write();
        }
    }
}

fn push(shared: &Shared, conn: &mut Conn, g: &Grant) -> Result<(), Failure> {
    let mut sink = shared.store.open_upload(&g.name)?;
    if g.offset > sink.received() {
        return Err(StoreError::Gap { offset: g.offset, received: sink.received() }.into());
    }
    let end = g.offset.saturating_add(g.length);
    let mut hasher = g.algo.hasher();
    let mut pos = g.offset;
    loop {
        match conn.read_frame()? {
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
    // no hashing and file bytes can go out by sendfile.
    let stored = (g.offset == 0 && g.length == rec.size)
        .then(|| rec.digest.parse::<Digest>().ok())
        .flatten()
        .filter(|d| d.algo == g.algo);
    let mut hasher = g.algo.hasher();
    let h = if stored.is_some() { None } else { Some(&mut hasher) };
    match &src {
        BlobSource::File { file, .. } => {
            let fsrc = FileSource { file, offset: g.offset, len: g.length };
            conn.send_data_file(g.offset, fsrc, h, &shared.pool)?;
        }
        BlobSource::Memory { bytes, .. } => {
            let range = g.offset as usize..(g.offset + g.length) as usize;
            conn.send_data_slice(g.offset, &bytes[range], h)?;
        }
    }
    let digest = stored.unwrap_or_else(|| hasher.finish());
    conn.write_frame(&Frame::Sum { total: g.length, final_: true, digest })?;
    Ok(())
}
