//! The data plane's transfers: once [`crate::accept`] has redeemed a connection's one-time
//! token, the granted push or pull runs here, on a thread of its own.
//!
//! Any failure is answered with an `ERROR` frame naming the reason (best effort: the peer may
//! be gone) and closes only that connection. A push whose digest does not match is rolled back
//! to where it started, so no unverified byte stays in the upload.
//!
//! Keep-alive: a connection whose transfer ended cleanly (a pull's `SUM` sent, a push's `ACK`
//! sent) may carry another. It then waits up to [`ServerConfig::data_keepalive`] for the next
//! `HELLO` with a fresh one-time token — the same frame a new connection starts with — holding
//! no transfer slot meanwhile; anything else, silence, or shutdown closes it. So a client
//! moving many small blobs pays the TCP (and TLS) handshake once, and every transfer still
//! needs its own token — or, in its place, an in-band `NEGOTIATE` request (see `bs_wire::frame`),
//! granted here as the control plane grants its `Negotiate` call, which saves the control
//! plane's round trip for each of many small transfers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bs_binding::transfer::{PullSender, PushReceiver, Violation};
use bs_binding::{BindingError, Carrier, Counters, Role, Scheduler};
use bs_store::{Store, StoreError};
use bs_transport::{Conn, TransportError};
use bs_wire::{BufferPool, Digest, ErrorCode, Frame, TOKEN_LEN};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::bindings::{self, BindingTable, Endpoint};
use crate::config::ServerConfig;
use crate::negotiate::Negotiator;
use crate::status::store_code;
use crate::tokens::{Direction, Grant, TokenTable};

/// State shared by every data connection.
pub(crate) struct Shared {
    store: Arc<dyn Store>,
    pub(crate) tokens: Arc<TokenTable>,
    /// Transfers admitted by a token.
    pub(crate) slots: Arc<Semaphore>,
    /// Bindings admitted by a token: long-lived and often idle, so they have slots of their
    /// own and never keep a transfer out.
    binding_slots: Arc<Semaphore>,
    /// A push averaging under this many bytes a second, once past its first `io_timeout`,
    /// is ended (0: no floor), so a trickling client cannot hold a transfer slot.
    min_rate: u64,
    /// Permits `slots` was created with.
    slot_count: u32,
    io_timeout: Duration,
    max_unsized_upload: u64,
    pool: BufferPool,
    /// Live bindings and transfers, for status and metrics.
    pub(crate) bindings: Arc<BindingTable>,
    /// Orders the messages of bindings leaving this server.
    sched: Arc<Scheduler>,
    /// What renegotiations on live bindings are countered against.
    limits: bs_binding::Limits,
    /// How long a finished transfer's connection waits for the next token (zero: it does not).
    keepalive: Duration,
    /// How long the next token's frame may take once it has begun to arrive.
    hello_timeout: Duration,
    /// Connections waiting for their next token now, and the most allowed.
    idle: AtomicUsize,
    max_idle: usize,
    /// Set when the server drains: waiting connections close.
    closing: AtomicBool,
    /// Grants in-band requests (`NEGOTIATE` frames) as the control plane grants its calls.
    negotiator: Arc<Negotiator>,
    /// The control plane's token, which in-band requests must carry as its calls do.
    auth: Option<Vec<u8>>,
}

impl Shared {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        negotiator: Arc<Negotiator>,
        cfg: &ServerConfig,
    ) -> Self {
        let slot_count = u32::try_from(cfg.max_connections).unwrap_or(u32::MAX);
        Self {
            store,
            tokens: negotiator.tokens.clone(),
            slots: Arc::new(Semaphore::new(slot_count as usize)),
            binding_slots: Arc::new(Semaphore::new(cfg.max_bindings)),
            min_rate: cfg.min_transfer_rate,
            slot_count,
            io_timeout: cfg.io_timeout,
            max_unsized_upload: cfg.max_unsized_upload,
            pool: BufferPool::new(1 << 20, 64),
            bindings: negotiator.bindings.clone(),
            negotiator,
            sched: Arc::new(Scheduler::new(cfg.schedule, 1)),
            limits: cfg.binding_limits(false),
            keepalive: cfg.data_keepalive,
            hello_timeout: cfg.hello_timeout,
            idle: AtomicUsize::new(0),
            max_idle: cfg.max_idle_data_connections,
            closing: AtomicBool::new(false),
            auth: cfg.auth_token.as_ref().map(|t| t.as_bytes().to_vec()),
        }
    }

    /// Redeem a HELLO's token and take a transfer slot; or the code and reason to tell the
    /// peer.
    pub(crate) fn admit(
        &self,
        token: &[u8; TOKEN_LEN],
        peer: &str,
    ) -> Result<(Grant, OwnedSemaphorePermit), (ErrorCode, String)> {
        // The slot first: a busy server leaves the token unredeemed, so the client may
        // present it again (on a new connection, say) rather than negotiate anew.
        let (slots, what) = match self.tokens.direction(token) {
            Some(Direction::Bind) => (&self.binding_slots, "binding"),
            _ => (&self.slots, "data transfer"),
        };
        let slot = slots.clone().try_acquire_owned().map_err(|_| {
            tracing::info!(%peer, "{what} refused: at the {what} limit");
            (ErrorCode::Busy, format!("server is at its {what} limit; retry later"))
        })?;
        let grant = self.tokens.redeem(token).map_err(|code| {
            let why = match code {
                ErrorCode::TokenExpired => "token expired; negotiate again",
                ErrorCode::TokenReused => "token already used; negotiate again",
                _ => "unknown token",
            };
            tracing::info!(%peer, ?code, "data connection refused: {why}");
            (code, why.to_string())
        })?;
        Ok((grant, slot))
    }

    /// Wait up to `grace` for the running transfers to end, admitting no new ones; returns
    /// how many were still running when the time ran out. Bindings (long-lived, on slots of
    /// their own) are not waited for: they end with the process.
    pub(crate) async fn drain(&self, grace: Duration) -> usize {
        self.closing.store(true, Ordering::Relaxed);
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
            // Slow, not gone: it hears why it was cut off.
            TransportError::TooSlow { .. } => (ErrorCode::TooSlow, false),
            _ => (ErrorCode::Internal, true),
        };
        Self { code, message: e.to_string(), peer_gone }
    }
}

impl From<BindingError> for Failure {
    fn from(e: BindingError) -> Self {
        match e {
            BindingError::Transport(t) => t.into(),
            BindingError::Remote { code, message } => Self { code, message, peer_gone: true },
            e => Self { code: e.code(), message: e.to_string(), peer_gone: false },
        }
    }
}

impl From<Violation> for Failure {
    fn from(v: Violation) -> Self {
        Self { code: v.code, message: v.message, peer_gone: false }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Self { code: store_code(&e), message: e.client_message(), peer_gone: false }
    }
}

fn fail(code: ErrorCode, message: impl Into<String>) -> Failure {
    Failure { code, message: message.into(), peer_gone: false }
}

/// Run the transfer `grant` allows on `conn`, holding `slot` until it ends; then, while the
/// connection is kept alive, the transfers of the tokens it presents next. Blocks: call it on
/// a thread of its own.
pub(crate) fn transfer(
    shared: &Shared,
    mut conn: Conn,
    mut grant: Grant,
    mut slot: OwnedSemaphorePermit,
) {
    if grant.direction == Direction::Bind {
        bindings::serve(&shared.bindings, &shared.sched, shared.limits.clone(), conn, grant.bind);
        drop(slot);
        return;
    }
    loop {
        let clean = one_transfer(shared, &mut conn, &grant);
        drop(slot);
        if !clean {
            // Not closed on bytes the client is still sending (requests it sent ahead): that
            // would reset the connection and destroy answers it has not read yet.
            conn.linger(LINGER, LINGER_BYTES);
            return;
        }
        match next_token(shared, &mut conn) {
            Some(next) => (grant, slot) = next,
            None => return,
        }
    }
}

/// How long, and for how many bytes, a connection closed after a failed transfer waits for
/// the client to close its side (see `Conn::linger`).
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 1 << 20;

/// One push or pull; whether it ended cleanly (the connection may carry another).
fn one_transfer(shared: &Shared, conn: &mut Conn, grant: &Grant) -> bool {
    let peer = conn.peer_addr();
    // A transfer is a binding too: listed while it runs, with its counters.
    let counters = Arc::new(Counters::default());
    let b = &grant.bind;
    counters.set_profile(&b.profile);
    let transport = if conn.is_unix() { "unix" } else { "tcp" };
    let _reg =
        shared.bindings.register(b.id, grant.name.clone(), b.endpoint, transport, counters.clone());
    let res = (|| -> Result<(), Failure> {
        let mut socket = grant.socket;
        socket.io_timeout = Some(shared.io_timeout);
        conn.apply(&socket).map_err(TransportError::from)?;
        match b.endpoint {
            Endpoint::Push => {
                let res = push(shared, conn, grant, &counters);
                conn.set_read_floor(None);
                res
            }
            _ => pull(shared, conn, grant, &counters),
        }
    })();
    match res {
        Ok(()) => true,
        Err(f) => {
            tracing::info!(?peer, code = ?f.code, reason = %f.message, "data transfer failed");
            if !f.peer_gone {
                let _ = conn.write_frame(&Frame::Error { code: f.code, message: f.message });
                conn.shutdown_write();
            }
            false
        }
    }
}

/// Keep-alive: wait for the connection's next HELLO and admit its token, or for an in-band
/// `NEGOTIATE` and grant it. `None`: closed — keep-alive is off or at its limit, the peer went
/// quiet or away, the server is draining, or the token was refused (the peer was told why).
/// A refused in-band request leaves the connection waiting for the next.
fn next_token(shared: &Shared, conn: &mut Conn) -> Option<(Grant, OwnedSemaphorePermit)> {
    if shared.keepalive.is_zero() {
        return None;
    }
    let _waiting = Waiting::take(&shared.idle, shared.max_idle)?;
    let peer = conn.peer_addr().map_or_else(|| "unix".to_string(), |p| p.to_string());
    // One keep-alive for the whole idle time: refused requests do not extend it.
    let until = Instant::now() + shared.keepalive;
    loop {
        // Wait in short slices so a draining server is noticed soon.
        loop {
            if shared.closing.load(Ordering::Relaxed) {
                return None;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            match conn.readable(left.min(Duration::from_millis(100))) {
                Ok(true) => break,
                Ok(false) => {}
                Err(_) => return None,
            }
        }
        let token = match conn.read_frame_within(shared.hello_timeout) {
            Ok(Frame::Hello { token }) => token,
            Ok(Frame::Negotiate { body }) => match in_band(shared, conn, &body) {
                Ok(Some(granted)) => return Some(granted),
                Ok(None) => continue,
                Err(()) => return None,
            },
            // The client closed its idle connection: the normal end.
            Err(TransportError::Closed) => return None,
            Ok(other) => {
                let why = format!(
                    "expected HELLO or NEGOTIATE after a finished transfer, got {}",
                    other.kind().name()
                );
                let _ = conn.write_frame(&Frame::Error { code: ErrorCode::BadFrame, message: why });
                conn.shutdown_write();
                return None;
            }
            Err(e) => {
                tracing::debug!(%peer, error = %e, "kept-alive data connection ended");
                return None;
            }
        };
        let (code, message) = match shared.admit(&token, &peer) {
            // A binding runs on a thread of its own, whose priority follows its QoS: it opens
            // a connection of its own rather than inheriting this pooled thread.
            Ok((grant, _)) if grant.direction == Direction::Bind => (
                ErrorCode::BadFrame,
                "a binding opens a data connection of its own, not a kept-alive one".to_string(),
            ),
            Ok(admitted) => return Some(admitted),
            Err(refused) => refused,
        };
        let _ = conn.write_frame(&Frame::Error { code, message });
        conn.shutdown_write();
        return None;
    }
}

/// An in-band request: take a transfer slot and grant it (the `GRANT` sent), or refuse it
/// with the status the control plane would have given (`Ok(None)`: told, and the connection
/// may carry the next request). `Err`: the connection is done.
fn in_band(
    shared: &Shared,
    conn: &mut Conn,
    body: &[u8],
) -> Result<Option<(Grant, OwnedSemaphorePermit)>, ()> {
    use prost::Message;
    let req = match bs_proto::NegotiateRequest::decode(body) {
        Ok(r) => r,
        Err(e) => {
            let message = format!("NEGOTIATE does not hold a NegotiateRequest: {e}");
            let _ = conn.write_frame(&Frame::Error { code: ErrorCode::BadFrame, message });
            conn.shutdown_write();
            return Err(());
        }
    };
    // What a control-plane call must prove, an in-band request proves too: a connection a
    // one-time token admitted is no open-ended session for whoever holds it. Without it the
    // connection ends (coming back takes a token, from a call that checks the credential).
    if let Some(expected) = &shared.auth
        && !bool::from(subtle::ConstantTimeEq::ct_eq(req.auth.as_bytes(), expected.as_slice()))
    {
        let message = "an in-band request needs the server's token, as its calls do".to_string();
        let _ = conn.write_frame(&Frame::Error { code: ErrorCode::BadToken, message });
        conn.shutdown_write();
        return Err(());
    }
    // Only a push of a known length sends its frames along (anything else marked pipelined
    // is refused by the grant, and sent none the client would wait on).
    let pipelined = req.pipelined
        && req.direction == bs_proto::Direction::Push as i32
        && !req.range
        && req.length.is_some();
    let refuse = |conn: &mut Conn, status: tonic::Status| {
        if pipelined {
            // Its frames follow the request: read past them, so the connection is ready
            // for the next request once the refusal arrives.
            drop_pipelined(shared, conn)?;
        }
        let body = bytes::Bytes::from(status.message().to_string());
        conn.write_frame(&Frame::Grant { code: status.code() as u32, body }).map_err(drop)?;
        Ok(None)
    };
    // The slot first, so a busy server does no store work for a request it cannot run.
    let Ok(slot) = shared.slots.clone().try_acquire_owned() else {
        return refuse(
            conn,
            tonic::Status::unavailable("server is at its data transfer limit; retry later"),
        );
    };
    let local = conn.local_addr();
    match shared.negotiator.grant_in_band(req, local) {
        Ok((grant, answer)) => {
            // Held back to leave with the transfer's first frame: one wake-up for the peer.
            conn.hold_frame(&Frame::Grant { code: 0, body: answer.encode_to_vec().into() });
            Ok(Some((grant, slot)))
        }
        Err(status) => {
            // Not held while the refused request's frames are read past.
            drop(slot);
            refuse(conn, status)
        }
    }
}

/// Read and drop a refused pipelined push's frames: DATA (at most
/// [`crate::negotiate::PIPELINE_UP_TO`] bytes in all) through the final SUM, all within one
/// deadline (the time a token may take, and as long again for the bytes), however slowly they
/// trickle in. `Err`: the peer sent something else or too much (told, and the connection is
/// done), went away or ran out of time.
fn drop_pipelined(shared: &Shared, conn: &mut Conn) -> Result<(), ()> {
    let deadline = Instant::now() + shared.hello_timeout * 2;
    let left = || {
        let left = deadline.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left).ok_or(())
    };
    let mut dropped = 0u64;
    let bad = |conn: &mut Conn, message: String| {
        let _ = conn.write_frame(&Frame::Error { code: ErrorCode::BadFrame, message });
        conn.shutdown_write();
        Err(())
    };
    loop {
        match conn.read_frame_within(left()?) {
            Ok(Frame::Data { len, .. }) => {
                dropped = dropped.saturating_add(len);
                if dropped > crate::negotiate::PIPELINE_UP_TO {
                    return bad(conn, "a pipelined push sent more than it may".into());
                }
                conn.discard_by(len, deadline).map_err(drop)?;
            }
            Ok(Frame::Sum { final_: true, .. }) => return Ok(()),
            Ok(other) => {
                let got = other.kind().name();
                return bad(conn, format!("expected a pipelined push's DATA or SUM, got {got}"));
            }
            Err(_) => return Err(()),
        }
    }
}

/// A place among the connections waiting for their next token, given back when dropped.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn take(count: &'a AtomicUsize, max: usize) -> Option<Self> {
        count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < max).then_some(n + 1))
            .ok()?;
        Some(Self(count))
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn push(shared: &Shared, conn: &mut Conn, g: &Grant, c: &Arc<Counters>) -> Result<(), Failure> {
    let sink = if g.range {
        shared
            .store
            .open_upload_range(&g.name, g.offset)?
            .ok_or_else(|| fail(ErrorCode::BadFrame, "this store takes one writer per upload"))?
    } else {
        shared.store.open_upload(&g.name)?
    };
    if let Some(id) = &g.upload_id
        && !bs_store::is_routed(&*sink, id)
    {
        // Routed again since this push's route: that upload is another put's, for good (not
        // Busy, which a client waits out and asks again).
        let message = format!(
            "the upload routed for {:?} is gone: another put of the name routed it again; \
             put it again",
            g.name
        );
        return Err(fail(ErrorCode::NotFound, message));
    }
    let mut sink = sink;
    let mut rules = PushReceiver::new(
        g.offset,
        g.length,
        sink.size(),
        sink.received(),
        shared.max_unsized_upload,
    )?;
    // Admitted: say so (with the bytes the upload holds) before the client sends anything,
    // so a refusal up to here reaches it while it can still simply try again.
    conn.write_frame(&Frame::Ack { received: sink.received(), committed: None })?;
    // From here the bytes must keep coming — for a push of a known length, whose bytes the
    // client has (a file, a buffer), and that did not ask to be paced: an upload of unknown
    // length (a pipe, an instrument's stream) may come as slowly as it is made.
    let paced = g.bind.profile.layers.iter().any(|l| matches!(l, bs_binding::LayerSpec::Pace(_)))
        || g.bind.profile.throughput_bps > 0;
    if shared.min_rate > 0 && sink.size().is_some() && !paced {
        conn.set_read_floor(Some(bs_transport::ReadFloor::new(shared.min_rate, shared.io_timeout)));
    }
    let mut hasher = g.algo.hasher();
    // Message layers asked for (compress, checksum, …): each DATA frame's bytes arrive as
    // one layered message, checked by its layers before a byte of it reaches the store.
    let mut carrier = Carrier::for_profile(&g.bind.profile, Role::Responder, c.clone());
    loop {
        let len = match conn.read_frame()? {
            Frame::Data { offset, len } => match rules.on_data(offset, len) {
                Ok(()) => len,
                Err(v) => return Err(rolled_back(&mut *sink, v)),
            },
            Frame::Sum { final_: true, .. } if g.range => {
                let v = Violation {
                    code: ErrorCode::BadFrame,
                    message: "a range push cannot commit: call Commit once every range is in"
                        .into(),
                    rollback_to: Some(g.offset),
                };
                return Err(rolled_back(&mut *sink, v));
            }
            Frame::Sum { total, final_, digest } => {
                let ours = hasher.finish();
                let v = match rules.on_sum(total, final_, &digest, &ours) {
                    Ok(v) => v,
                    Err(v) => return Err(rolled_back(&mut *sink, v)),
                };
                if let Some(end) = v.truncate_to {
                    sink.truncate(end)?;
                }
                let received = sink.received();
                let committed = if v.commit {
                    let rec = sink.commit(v.covers_whole.then_some(ours))?;
                    Some(
                        rec.digest
                            .parse::<Digest>()
                            .map_err(|e| fail(ErrorCode::Internal, e.to_string()))?,
                    )
                } else {
                    // Let go of the upload before saying so: the client may open it again
                    // (or commit the ranges) the moment the ACK arrives.
                    drop(sink);
                    None
                };
                conn.write_frame(&Frame::Ack { received, committed })?;
                return Ok(());
            }
            other => return Err(rolled_back(&mut *sink, rules.unexpected(&format!("{other:?}")))),
        };
        let pos = rules.pos();
        if let Some(carrier) = carrier.as_mut() {
            let m = carrier.recv(conn, len)?;
            hasher.update(m.payload());
            if let Err(e) = sink.write_at(pos, m.payload()) {
                return Err(store_failed(shared, sink, g, e));
            }
            rules.advance(len);
            continue;
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
            rules.advance(got);
            c.raw_in(got);
            res?;
            continue;
        }
        let mut store_err = None;
        let mut at = pos;
        let res = conn.recv_data_with(len, Some(&mut hasher), &shared.pool, |chunk| {
            sink.write_at(at, chunk).map_err(|e| {
                let io = std::io::Error::other(e.to_string());
                store_err = Some(e);
                io
            })?;
            at += chunk.len() as u64;
            Ok(())
        });
        rules.advance(at - pos);
        c.raw_in(at - pos);
        if let Some(e) = store_err {
            return Err(store_failed(shared, sink, g, e));
        }
        res?;
    }
}

/// The store refused bytes of an upload.
fn store_failed(
    shared: &Shared,
    sink: Box<dyn bs_store::UploadSink>,
    g: &Grant,
    e: StoreError,
) -> Failure {
    if matches!(e, StoreError::StorageFull(_)) && sink.size().is_none() {
        // Bytes of unknown size that filled the disk: free the space now rather than keep
        // them for a resume that cannot fit either.
        drop(sink);
        let _ = shared.store.abort(&g.name);
        return fail(
            ErrorCode::StorageFull,
            format!("{e}; the upload of unknown size was discarded to free the space"),
        );
    }
    e.into()
}

/// Undo what a broken transfer wrote, then report the broken rule.
fn rolled_back(sink: &mut dyn bs_store::UploadSink, v: Violation) -> Failure {
    if let Some(to) = v.rollback_to
        && let Err(e) = sink.truncate(to)
    {
        return e.into();
    }
    v.into()
}

fn pull(shared: &Shared, conn: &mut Conn, g: &Grant, c: &Arc<Counters>) -> Result<(), Failure> {
    let src = match &g.source {
        Some(src) => src.clone(),
        None => shared.store.open_read(&g.name)?,
    };
    let rec = src.record();
    let plan = PullSender::new(
        &g.name,
        g.offset,
        g.length,
        rec.size,
        &rec.digest,
        g.blob_digest.as_deref(),
        g.algo,
    )?;
    let mut hasher = g.algo.hasher();
    // One DATA frame per stored chunk. Each chunk is checked against its chunk digest in
    // memory (a file's mapping) and those very bytes are sent: a corrupt chunk is never sent
    // (the ERROR frame in its place tells the client why the stream stopped). sendfile is
    // not used: it would read the file again after the check, for the same one copy.
    // For a client that uses no byte before the SUM (`whole_before_use`), bytes go out before
    // their chunk's check instead (`BlobSource::arriving`): a small range of a remote blob as
    // it arrives, each chunk checked when its last byte is in; a local blob's chunk in two
    // pieces, the check between them, so it runs while the first crosses to the client. A
    // bad chunk still ends the stream with ERROR(Corrupt), and the SUM, the only word that
    // makes the client accept what it read, follows only after every chunk checked.
    let mut pos = plan.offset;
    let mut carrier = Carrier::for_profile(&g.bind.profile, Role::Responder, c.clone());
    let hash = plan.stored_digest.is_none();
    let pieces = if g.whole_before_use {
        src.arriving(plan.offset, plan.length)?
    } else {
        bs_store::Arriving::Checked(src.pieces(plan.offset, plan.length)?)
    };
    for piece in pieces {
        let piece = piece?;
        match carrier.as_mut() {
            // Through the negotiated message layers, in pieces one message holds.
            Some(carrier) => {
                let mut at = pos;
                for part in piece.chunks(carrier.max_piece()) {
                    carrier.send(conn, at, part, if hash { Some(&mut hasher) } else { None })?;
                    at += part.len() as u64;
                }
            }
            None => match &plan.stored_digest {
                // The last piece, its SUM known: both in one system call (a small blob's
                // whole answer — with the GRANT held before it — in one).
                Some(d) if pos + piece.len() as u64 == plan.offset + plan.length => {
                    let head = bs_wire::Header::data(pos, piece.len() as u64).encode();
                    let sum = Frame::Sum { total: plan.length, final_: true, digest: d.clone() };
                    conn.write_slices(&[&head, &piece, &sum.encode()])?;
                    c.raw_out(piece.len() as u64);
                    return Ok(());
                }
                _ => {
                    let h = if hash { Some(&mut hasher) } else { None };
                    conn.send_data_slice(pos, &piece, h)?;
                    c.raw_out(piece.len() as u64);
                }
            },
        }
        pos += piece.len() as u64;
    }
    let digest = plan.stored_digest.unwrap_or_else(|| hasher.finish());
    conn.write_frame(&Frame::Sum { total: plan.length, final_: true, digest })?;
    Ok(())
}
