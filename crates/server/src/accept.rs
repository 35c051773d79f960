//! The data plane's front door, on the async runtime: accept a connection, complete its TLS
//! handshake if any, read exactly its HELLO frame, redeem the token and take a transfer slot;
//! only then hand the socket (with the TLS session and whatever it already decrypted) to a
//! blocking thread for the transfer.
//!
//! Until its token is in, a connection costs a socket and a small task — never a thread, so
//! idle strangers do not take the blocking pool the control plane's store calls run on.
//! [`crate::greeting`] bounds how many may wait and evicts the oldest to make room.

use std::io::{self, Read};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bs_transport::{Conn, TlsServer};
use bs_wire::{ErrorCode, Frame, FrameKind, HEADER_LEN, Header, TOKEN_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::config::ServerConfig;
use crate::data::{self, Shared};
use crate::greeting::{Greeting, Limits, Ticket};

/// Bytes of a HELLO frame: its header and the token.
const HELLO_LEN: usize = HEADER_LEN + TOKEN_LEN;

/// Longest time spent telling a refused peer why (the frame is small; a peer that does not
/// read it is not waited for).
const TELL_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause after the process ran out of descriptors, so the loop does not spin.
const OUT_OF_FDS_PAUSE: Duration = Duration::from_millis(10);

/// Everything the front door needs.
pub(crate) struct FrontDoor {
    shared: Arc<Shared>,
    greeting: Arc<Greeting>,
    tls: Option<TlsAcceptor>,
}

impl FrontDoor {
    pub(crate) fn new(shared: Arc<Shared>, cfg: &ServerConfig) -> Arc<Self> {
        let greeting = Greeting::new(Limits {
            total: cfg.max_unauthenticated,
            per_source: cfg.max_unauthenticated_per_ip,
            timeout: cfg.hello_timeout,
            pressed_timeout: cfg.hello_timeout_under_pressure,
        });
        let tls = cfg.tls.as_ref().map(|t: &TlsServer| TlsAcceptor::from(t.config()));
        Arc::new(Self { shared, greeting, tls })
    }
}

/// Accept data connections until shutdown; then evict those still to present a token.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    door: Arc<FrontDoor>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut warned: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((tcp, peer)) => {
                let ticket = door.greeting.admit(peer.ip());
                tokio::spawn(door.clone().greet(tcp, peer, ticket));
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                // Make room: the oldest connection still to present a token goes.
                let evicted = door.greeting.evict_oldest();
                if warned.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    tracing::warn!(error = %e, evicted, "data plane is out of file descriptors");
                    warned = Some(Instant::now());
                }
                tokio::time::sleep(OUT_OF_FDS_PAUSE).await;
            }
            Err(e) => tracing::debug!(error = %e, "data plane accept failed"),
        }
    }
    door.greeting.evict_all();
}

/// Why a connection is turned away before its transfer: `tell` says whether the peer can
/// still hear an `ERROR` frame about it.
struct Refusal {
    code: ErrorCode,
    message: String,
    tell: bool,
}

impl Refusal {
    fn told(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), tell: true }
    }

    fn silent(message: impl Into<String>) -> Self {
        Self { code: ErrorCode::Internal, message: message.into(), tell: false }
    }

    fn evicted() -> Self {
        Self::told(
            ErrorCode::Busy,
            "too many connections are waiting to present a token; this one was evicted, retry",
        )
    }
}

/// A connection whose HELLO has been read, plain or TLS.
enum Greeted {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(tokio::net::UnixStream),
}

impl Greeted {
    /// Send an `ERROR` frame (best effort, briefly) and close.
    async fn tell(self, code: ErrorCode, message: String) {
        let frame = Frame::Error { code, message }.encode();
        let _ = match self {
            Greeted::Plain(mut s) => tokio::time::timeout(TELL_TIMEOUT, say(&mut s, &frame)).await,
            Greeted::Tls(mut s) => tokio::time::timeout(TELL_TIMEOUT, say(&mut *s, &frame)).await,
            Greeted::Unix(mut s) => tokio::time::timeout(TELL_TIMEOUT, say(&mut s, &frame)).await,
        };
    }

    /// The blocking connection the transfer runs on: the same socket, the same TLS session.
    fn into_conn(self) -> io::Result<Conn> {
        let blocking = |s: TcpStream| -> io::Result<std::net::TcpStream> {
            let s = s.into_std()?;
            s.set_nonblocking(false)?;
            Ok(s)
        };
        let mut conn = match self {
            Greeted::Plain(s) => Conn::new(blocking(s)?),
            Greeted::Tls(s) => {
                let (tcp, session) = s.into_inner();
                Conn::tls_server_established(session, blocking(tcp)?)
            }
            Greeted::Unix(s) => {
                let s = s.into_std()?;
                s.set_nonblocking(false)?;
                Conn::unix(s)
            }
        };
        // A request and the small frames around a transfer come in one read each (a small
        // blob's whole push too); a bulk payload pays one copy of at most 8 KiB per frame.
        conn.set_read_ahead(true);
        Ok(conn)
    }
}

async fn say<S: AsyncWrite + Unpin>(s: &mut S, frame: &[u8]) -> io::Result<()> {
    s.write_all(frame).await?;
    s.shutdown().await
}

impl FrontDoor {
    /// One connection, from accept to the hand-over to its transfer thread.
    async fn greet(self: Arc<Self>, tcp: TcpStream, peer: SocketAddr, ticket: Ticket) {
        let _ = tcp.set_nodelay(true);
        let greeted = match &self.tls {
            None => hello_plain(tcp, &ticket).await,
            Some(acceptor) => hello_tls(acceptor, tcp, &ticket).await,
        };
        drop(ticket);
        let (io, token) = match greeted {
            Ok(g) => g,
            Err((io, r)) => {
                tracing::debug!(%peer, reason = %r.message, "data connection closed before its token");
                if let (Some(io), true) = (io, r.tell) {
                    io.tell(r.code, r.message).await;
                }
                return;
            }
        };
        self.hand_over(io, token, &peer.to_string()).await;
    }

    /// Redeem the token, take a transfer slot and start the transfer on a thread of its own.
    async fn hand_over(&self, io: Greeted, token: [u8; TOKEN_LEN], peer: &str) {
        let (grant, slot) = match self.shared.admit(&token, peer) {
            Ok(admitted) => admitted,
            Err((code, why)) => return io.tell(code, why).await,
        };
        let conn = match io.into_conn() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "cannot hand data connection to a thread");
                return;
            }
        };
        let shared = self.shared.clone();
        if grant.direction == crate::tokens::Direction::Bind {
            // A binding gets a thread of its own (not one from the blocking pool): its
            // scheduling priority follows the binding's QoS priority and must not outlive it.
            let spawned = std::thread::Builder::new()
                .name(format!("binding-{}", grant.bind.id))
                // Idle bindings are many and their stacks shallow: keep the reservation small.
                .stack_size(512 << 10)
                .spawn(move || data::transfer(&shared, conn, grant, slot));
            if let Err(e) = spawned {
                tracing::warn!(%peer, error = %e, "cannot start a binding thread");
            }
            return;
        }
        tokio::task::spawn_blocking(move || data::transfer(&shared, conn, grant, slot));
    }
}

type Hello = Result<(Greeted, [u8; TOKEN_LEN]), (Option<Greeted>, Refusal)>;

/// Accept bindings on a Unix domain socket (processes on this host) until shutdown. The
/// socket file is made private to this user; the token is still required.
pub(crate) async fn accept_unix_loop(
    listener: tokio::net::UnixListener,
    door: Arc<FrontDoor>,
    hello_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((mut s, _)) => {
                let door = door.clone();
                tokio::spawn(async move {
                    let mut hello = HelloBuf::default();
                    match tokio::time::timeout(hello_timeout, hello.read_from(&mut s)).await {
                        Ok(Ok(token)) => door.hand_over(Greeted::Unix(s), token, "unix").await,
                        Ok(Err(r)) if r.tell => Greeted::Unix(s).tell(r.code, r.message).await,
                        _ => tracing::debug!("unix data connection closed before its token"),
                    }
                });
            }
            Err(e) => {
                tracing::debug!(error = %e, "unix data plane accept failed");
                tokio::time::sleep(OUT_OF_FDS_PAUSE).await;
            }
        }
    }
}

/// Plain TCP: read the HELLO before the deadline or eviction. An evicted connection whose
/// HELLO has already arrived in full is not turned away: it was not idle, just not read yet.
async fn hello_plain(mut tcp: TcpStream, ticket: &Ticket) -> Hello {
    let mut hello = HelloBuf::default();
    let deadline = tokio::time::Instant::from_std(ticket.deadline());
    let outcome = tokio::select! {
        r = hello.read_from(&mut tcp) => Some(r),
        _ = tokio::time::sleep_until(deadline) => {
            return Err((None, Refusal::silent("no token within the deadline")));
        }
        _ = ticket.evicted() => None,
    };
    let res = match outcome {
        Some(r) => r,
        None => match hello.read_now(&tcp) {
            Ok(Some(token)) => Ok(token),
            Ok(None) => Err(Refusal::evicted()),
            Err(r) => Err(r),
        },
    };
    match res {
        Ok(token) => Ok((Greeted::Plain(tcp), token)),
        Err(r) => Err((Some(Greeted::Plain(tcp)), r)),
    }
}

/// TLS: handshake, then read the HELLO, before the deadline or eviction. The session keeps
/// any bytes decrypted past the HELLO for the transfer.
async fn hello_tls(acceptor: &TlsAcceptor, tcp: TcpStream, ticket: &Ticket) -> Hello {
    let deadline = tokio::time::Instant::from_std(ticket.deadline());
    let work = async {
        let mut tls = match acceptor.accept(tcp).await {
            Ok(t) => t,
            Err(e) => return Err((None, Refusal::silent(format!("TLS handshake failed: {e}")))),
        };
        let mut hello = HelloBuf::default();
        match hello.read_from(&mut tls).await {
            Ok(token) => Ok((Greeted::Tls(Box::new(tls)), token)),
            Err(r) => Err((Some(Greeted::Tls(Box::new(tls))), r)),
        }
    };
    tokio::select! {
        r = work => r,
        _ = tokio::time::sleep_until(deadline) => {
            Err((None, Refusal::silent("no token within the deadline")))
        }
        _ = ticket.evicted() => Err((None, Refusal::evicted())),
    }
}

/// A HELLO frame as it arrives. Exactly its bytes are read from the connection, never more,
/// so the transfer finds the stream where the frame ended.
struct HelloBuf {
    buf: [u8; HELLO_LEN],
    got: usize,
}

impl Default for HelloBuf {
    fn default() -> Self {
        Self { buf: [0; HELLO_LEN], got: 0 }
    }
}

impl HelloBuf {
    /// How many more bytes the frame needs (0: complete); an error once the header shows it
    /// is no HELLO.
    fn want(&self) -> Result<usize, Refusal> {
        if self.got < HEADER_LEN {
            return Ok(HEADER_LEN - self.got);
        }
        let head = self.buf.first_chunk::<HEADER_LEN>().expect("HELLO_LEN > HEADER_LEN");
        let h =
            Header::parse(head).map_err(|e| Refusal::told(ErrorCode::BadFrame, e.to_string()))?;
        if h.kind == FrameKind::Negotiate {
            return Err(Refusal::told(
                ErrorCode::BadFrame,
                "a new data connection starts with HELLO and a one-time token; NEGOTIATE is \
                 taken only on a connection kept alive after a transfer",
            ));
        }
        if h.kind != FrameKind::Hello {
            let got = h.kind.name();
            return Err(Refusal::told(ErrorCode::BadFrame, format!("expected HELLO, got {got}")));
        }
        if h.body_len as usize != TOKEN_LEN {
            return Err(Refusal::told(
                ErrorCode::BadFrame,
                format!("HELLO must carry a {TOKEN_LEN}-byte token, not {} bytes", h.body_len),
            ));
        }
        Ok(HELLO_LEN - self.got)
    }

    fn token(&self) -> [u8; TOKEN_LEN] {
        *self.buf.last_chunk::<TOKEN_LEN>().expect("HELLO_LEN > TOKEN_LEN")
    }

    /// Take in `n` bytes just read; `Ok(true)` once the frame is complete.
    fn took(&mut self, n: usize) -> Result<bool, Refusal> {
        if n == 0 {
            return Err(Refusal::silent(format!("peer closed after {} bytes", self.got)));
        }
        self.got += n;
        Ok(self.want()? == 0)
    }

    async fn read_from<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
    ) -> Result<[u8; TOKEN_LEN], Refusal> {
        loop {
            let want = self.want()?;
            if want == 0 {
                return Ok(self.token());
            }
            let n = r
                .read(&mut self.buf[self.got..self.got + want])
                .await
                .map_err(|e| Refusal::silent(e.to_string()))?;
            self.took(n)?;
        }
    }

    /// Whatever of the frame has already arrived, without waiting (the socket is
    /// non-blocking, and asked directly: the runtime may not have noticed it is readable).
    /// `Ok(None)`: incomplete.
    fn read_now(&mut self, tcp: &TcpStream) -> Result<Option<[u8; TOKEN_LEN]>, Refusal> {
        let sock = socket2::SockRef::from(tcp);
        loop {
            let want = self.want()?;
            if want == 0 {
                return Ok(Some(self.token()));
            }
            match (&*sock).read(&mut self.buf[self.got..self.got + want]) {
                Ok(n) => {
                    self.took(n)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Refusal::silent(e.to_string())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(bytes: &[u8]) -> Result<Option<[u8; TOKEN_LEN]>, ErrorCode> {
        let mut h = HelloBuf::default();
        for &b in bytes {
            let want = h.want().map_err(|r| r.code)?;
            assert!(want > 0, "asked for nothing while incomplete");
            h.buf[h.got] = b;
            if h.took(1).map_err(|r| r.code)? {
                assert_eq!(h.got, HELLO_LEN, "never more than the frame");
                return Ok(Some(h.token()));
            }
        }
        Ok(None)
    }

    #[test]
    fn a_hello_is_read_to_its_last_byte_and_no_further() {
        let hello = Frame::Hello { token: [7; TOKEN_LEN] }.encode();
        assert_eq!(fed(&hello), Ok(Some([7; TOKEN_LEN])));
        assert_eq!(fed(&hello[..30]), Ok(None));
    }

    #[test]
    fn anything_but_a_hello_is_a_bad_frame_from_its_header() {
        assert_eq!(
            fed(&Frame::Data { offset: 0, len: 1 << 60 }.encode()),
            Err(ErrorCode::BadFrame)
        );
        assert_eq!(fed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Err(ErrorCode::BadFrame));
        let long = Header { kind: FrameKind::Hello, body_len: 33, a: 0, b: 0 }.encode();
        assert_eq!(fed(&long), Err(ErrorCode::BadFrame));
    }
}
