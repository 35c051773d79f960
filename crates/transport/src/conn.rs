//! A framed data connection: control frames in and out, and payload bytes moved by the
//! cheapest path for their source and destination.
//!
//! Payload paths and their copies in user space:
//! - memory → socket: one `write` straight from the caller's slice (0 extra copies);
//! - file → socket, digest already known: `sendfile(2)` (0 copies, the kernel moves pages);
//! - file → socket, digest needed: `pread` into a pooled buffer, hash, `write` (1 copy);
//! - socket → memory: `read` straight into the destination slice, hashed while hot (0 extra);
//! - socket → anything else: `read` into a pooled buffer handed to a sink (1 copy).

use std::cell::{Cell, OnceCell};
use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use bs_wire::{BufferPool, Frame, HEADER_LEN, Hasher, Header};

use crate::error::TransportError;
use crate::socket::SocketOptions;
use crate::tls::{TlsClient, TlsServer};

type Result<T> = std::result::Result<T, TransportError>;

/// A byte range of a file to send.
pub struct FileSource<'a> {
    pub file: &'a File,
    pub offset: u64,
    pub len: u64,
}

/// The byte stream under a connection: a plain socket, TLS over one, or a Unix domain socket
/// between processes on one host.
enum Io {
    Plain(TcpStream),
    Unix(UnixStream),
    TlsServer(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
    TlsClient(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Io {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Io::Plain(s) => s.read(buf),
            Io::Unix(s) => s.read(buf),
            Io::TlsServer(s) => s.read(buf),
            Io::TlsClient(s) => s.read(buf),
        }
    }
}

impl Write for Io {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Io::Plain(s) => s.write(buf),
            Io::Unix(s) => s.write(buf),
            Io::TlsServer(s) => s.write(buf),
            Io::TlsClient(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Io::Plain(s) => send_vectored(s.as_raw_fd(), bufs),
            Io::Unix(s) => send_vectored(s.as_raw_fd(), bufs),
            Io::TlsServer(s) => s.write_vectored(bufs),
            Io::TlsClient(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Io::Plain(s) => s.flush(),
            Io::Unix(s) => s.flush(),
            Io::TlsServer(s) => s.flush(),
            Io::TlsClient(s) => s.flush(),
        }
    }
}

/// One data-plane connection.
pub struct Conn {
    stream: Io,
    /// Bytes of a peeked frame or read ahead, `unread[unread_at..unread_end]`, read before
    /// anything from the stream. (The buffer keeps its length between refills, so a refill
    /// does not zero it again.)
    unread: Vec<u8>,
    unread_at: usize,
    unread_end: usize,
    /// Frame-header reads take up to [`READ_AHEAD`] bytes (message streams of small frames).
    read_ahead: bool,
    /// Control frames held back to go out with the next write ([`Conn::hold_frame`]).
    held: Vec<u8>,
    /// The socket options last applied but for their timeouts ([`Conn::apply`]), and the read
    /// and write timeouts last set (`None`: not known): a connection carrying many small
    /// transfers back to back makes no system call to set again what is set already.
    applied: Option<SocketOptions>,
    timeouts: Cell<[Option<Option<Duration>>; 2]>,
    /// A deadline read ([`Conn::read_by`]) shortened the read timeout, which was this (`None`
    /// inside: not known) before; put back by [`Conn::disarm`].
    armed: Option<Option<Option<Duration>>>,
    /// Reads from a plain or Unix socket do not wait ([`Conn::read_by`]).
    nowait: bool,
    /// The peer's and our own address, looked up once (for logs and negotiations).
    addrs: OnceCell<(Option<SocketAddr>, Option<SocketAddr>)>,
    /// A floor on the rate the peer sends at, while set ([`Conn::set_read_floor`]).
    floor: Option<crate::floor::ReadFloor>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("peer", &self.peer_addr())
            .field("tls", &self.is_tls())
            .finish()
    }
}

impl Conn {
    fn on(stream: Io) -> Self {
        Self {
            stream,
            unread: Vec::new(),
            unread_at: 0,
            unread_end: 0,
            read_ahead: false,
            held: Vec::new(),
            applied: None,
            timeouts: Cell::new([None; 2]),
            armed: None,
            nowait: false,
            addrs: OnceCell::new(),
            floor: None,
        }
    }

    /// A plain TCP connection.
    pub fn new(stream: TcpStream) -> Self {
        Self::on(Io::Plain(stream))
    }

    /// A Unix domain socket connection.
    pub fn unix(stream: UnixStream) -> Self {
        Self::on(Io::Unix(stream))
    }

    /// The server side of a TLS connection (the handshake runs on first use).
    pub fn tls_server(stream: TcpStream, tls: &TlsServer) -> Result<Self> {
        let c = rustls::ServerConnection::new(tls.config()).map_err(tls_err)?;
        Ok(Self::on(Io::TlsServer(Box::new(rustls::StreamOwned::new(c, stream)))))
    }

    /// The server side of a TLS connection whose handshake (and perhaps first frame) already
    /// ran elsewhere, e.g. on an async runtime. `tls` keeps every byte it received or
    /// decrypted but did not deliver yet, so reading continues exactly where the previous
    /// owner stopped.
    pub fn tls_server_established(tls: rustls::ServerConnection, stream: TcpStream) -> Self {
        Self::on(Io::TlsServer(Box::new(rustls::StreamOwned::new(tls, stream))))
    }

    /// The client side of a TLS connection to a server reached as `host`.
    pub fn tls_client(stream: TcpStream, tls: &TlsClient, host: &str) -> Result<Self> {
        let name = tls.server_name(host).map_err(|e| TransportError::Tls(e.to_string()))?;
        let c = rustls::ClientConnection::new(tls.config(), name).map_err(tls_err)?;
        Ok(Self::on(Io::TlsClient(Box::new(rustls::StreamOwned::new(c, stream)))))
    }

    /// Run a TLS connection's handshake now rather than on first use (nothing to do for a
    /// plain one). A server calls it before anything else: once the handshake has failed,
    /// writing to the connection would run it again and wait for the peer, where the failure
    /// (already sent to the peer as an alert) should just close the connection.
    pub fn handshake(&mut self) -> Result<()> {
        let r = match &mut self.stream {
            Io::TlsServer(s) => finish_handshake(&mut s.conn, &mut s.sock),
            Io::TlsClient(s) => finish_handshake(&mut s.conn, &mut s.sock),
            Io::Plain(_) | Io::Unix(_) => Ok(()),
        };
        r.map_err(TransportError::from_io)
    }

    pub fn is_tls(&self) -> bool {
        matches!(self.stream, Io::TlsServer(_) | Io::TlsClient(_))
    }

    pub fn is_unix(&self) -> bool {
        matches!(self.stream, Io::Unix(_))
    }

    /// The TCP socket underneath, if there is one (for socket options).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match &self.stream {
            Io::Plain(s) => Some(s),
            Io::Unix(_) => None,
            Io::TlsServer(s) => Some(&s.sock),
            Io::TlsClient(s) => Some(&s.sock),
        }
    }

    /// The descriptor underneath (to wait on it together with others).
    pub fn raw_fd(&self) -> RawFd {
        self.fd()
    }

    fn fd(&self) -> RawFd {
        match &self.stream {
            Io::Unix(s) => s.as_raw_fd(),
            _ => self.tcp().expect("not unix").as_raw_fd(),
        }
    }

    /// Wait for the peer's next frame as long as it takes, but give up on a peer whose host
    /// is gone within about `after`: TCP keepalive probes an idle connection and
    /// `TCP_USER_TIMEOUT` bounds unacknowledged data, so a blocking read arms no timer of its
    /// own (a timer per read is measurable on a round trip of small messages). For
    /// long-lived message streams; a Unix socket's peer is on this host and its end closes
    /// when its process dies.
    pub fn watch_for_dead_peer(&self, after: Duration) -> io::Result<()> {
        self.set_read_timeout(None)?;
        let Some(tcp) = self.tcp() else { return Ok(()) };
        let probe = (after / 4).max(Duration::from_secs(1));
        let keepalive =
            socket2::TcpKeepalive::new().with_time(probe).with_interval(probe).with_retries(3);
        let s = socket2::SockRef::from(tcp);
        s.set_tcp_keepalive(&keepalive)?;
        s.set_tcp_user_timeout(Some(after))
    }

    /// How long a read may wait for the peer (`None`: forever).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_timeout(0, t, |t| match &self.stream {
            Io::Unix(s) => s.set_read_timeout(t),
            _ => self.tcp().expect("not unix").set_read_timeout(t),
        })
    }

    /// How long a write may wait for the peer (`None`: forever).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.set_timeout(1, t, |t| match &self.stream {
            Io::Unix(s) => s.set_write_timeout(t),
            _ => self.tcp().expect("not unix").set_write_timeout(t),
        })
    }

    /// Set timeout `which` (0 read, 1 write) with `set`, unless it is `t` already.
    fn set_timeout(
        &self,
        which: usize,
        t: Option<Duration>,
        set: impl FnOnce(Option<Duration>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut now = self.timeouts.get();
        if now[which] == Some(t) {
            return Ok(());
        }
        now[which] = None; // unknown if the call fails
        self.timeouts.set(now);
        set(t)?;
        now[which] = Some(t);
        self.timeouts.set(now);
        Ok(())
    }

    /// Apply `opts` for the next transfer: what the connection has already (socket buffers,
    /// `TCP_NODELAY`, the send buffer sized for a far peer) is not set again; the timeouts are
    /// set unless they are these already. Nothing to do on a Unix socket.
    pub fn apply(&mut self, opts: &SocketOptions) -> io::Result<()> {
        if self.tcp().is_none() {
            return Ok(());
        }
        let rest = SocketOptions { io_timeout: None, ..*opts };
        if self.applied != Some(rest) {
            self.applied = None;
            rest.apply_all_but_timeouts(self.tcp().expect("checked above"))?;
            self.applied = Some(rest);
        }
        self.set_read_timeout(opts.io_timeout)?;
        self.set_write_timeout(opts.io_timeout)
    }

    fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        *self.addrs.get_or_init(|| match self.tcp() {
            Some(t) => (t.peer_addr().ok(), t.local_addr().ok()),
            None => (None, None),
        })
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.addrs().0
    }

    /// Our own address on a TCP connection.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addrs().1
    }

    /// Is there something to read within `wait` (a frame, the peer's close)? Bytes already
    /// buffered here or decrypted by TLS count.
    pub fn readable(&mut self, wait: Duration) -> Result<bool> {
        if self.unread_at < self.unread_end {
            return Ok(true);
        }
        // An answer held back must go before we wait for the peer's next word.
        self.flush_held().map_err(TransportError::from_io)?;
        let buffered = match &mut self.stream {
            Io::TlsServer(s) => {
                s.conn.process_new_packets().map_err(tls_err)?.plaintext_bytes_to_read()
            }
            Io::TlsClient(s) => {
                s.conn.process_new_packets().map_err(tls_err)?.plaintext_bytes_to_read()
            }
            _ => 0,
        };
        if buffered > 0 {
            return Ok(true);
        }
        poll_fd(self.fd(), libc::POLLIN, wait)
    }

    /// Let each frame-header read take up to 8 KiB, keeping what follows for the next reads:
    /// a small message then costs one `read` instead of two. For streams of small messages;
    /// bulk transfers leave it off (their payload goes straight into its destination).
    pub fn set_read_ahead(&mut self, on: bool) {
        self.read_ahead = on;
    }

    /// Wait (up to `wait`) until the socket can take more bytes; returns whether it can.
    pub fn writable(&self, wait: Duration) -> Result<bool> {
        poll_fd(self.fd(), libc::POLLOUT, wait)
    }

    /// Hold a small control frame back: it goes out in the same system call as whatever is
    /// written next (a `GRANT` with the first `DATA` or the admission `ACK`), or before the
    /// next read, so the peer is woken once instead of twice.
    pub fn hold_frame(&mut self, f: &Frame) {
        self.held.extend_from_slice(&f.encode());
    }

    /// Send what [`Conn::hold_frame`] held back.
    fn flush_held(&mut self) -> io::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        self.stream.write_all(&held)
    }

    /// Write `parts` back to back in vectored writes (no copy into one buffer).
    pub fn write_slices(&mut self, parts: &[&[u8]]) -> Result<()> {
        if !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            let mut bufs: Vec<io::IoSlice<'_>> = std::iter::once(&held[..])
                .chain(parts.iter().copied())
                .map(io::IoSlice::new)
                .collect();
            return write_all_vectored(&mut self.stream, &mut bufs)
                .map_err(TransportError::from_io);
        }
        if let [a, b] = parts {
            let mut bufs = [io::IoSlice::new(a), io::IoSlice::new(b)];
            return write_all_vectored(&mut self.stream, &mut bufs)
                .map_err(TransportError::from_io);
        }
        if let [a, b, c] = parts {
            let mut bufs = [io::IoSlice::new(a), io::IoSlice::new(b), io::IoSlice::new(c)];
            return write_all_vectored(&mut self.stream, &mut bufs)
                .map_err(TransportError::from_io);
        }
        let mut bufs: Vec<io::IoSlice<'_>> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
        write_all_vectored(&mut self.stream, &mut bufs).map_err(TransportError::from_io)
    }

    /// Read one control frame (for `DATA`, only its header: the payload follows).
    /// A clean close before the first header byte is [`TransportError::Closed`].
    pub fn read_frame(&mut self) -> Result<Frame> {
        self.read_frame_by(None)
    }

    /// [`Conn::read_frame`], but the whole frame must arrive within `limit` — however slowly
    /// a peer trickles bytes (a per-read timeout alone would let it hold the connection).
    /// The socket's read timeout is as it was before, afterwards.
    pub fn read_frame_within(&mut self, limit: std::time::Duration) -> Result<Frame> {
        let deadline = std::time::Instant::now() + limit;
        let res = self.read_frame_by(Some(deadline));
        self.disarm();
        res
    }

    fn read_frame_by(&mut self, deadline: Option<std::time::Instant>) -> Result<Frame> {
        let mut head = [0u8; HEADER_LEN];
        let mut got = 0;
        while got < HEADER_LEN {
            match self.read_by(deadline, &mut head[got..], true) {
                Ok(0) if got == 0 => return Err(TransportError::Closed),
                Ok(0) => return Err(TransportError::Truncated { expected: 24, got: got as u64 }),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TransportError::from_io(e)),
            }
        }
        let h = Header::parse(&head)?;
        let mut body = vec![0u8; h.body_len as usize];
        let (total, mut got) = (body.len(), 0);
        while got < total {
            got += self.read_some_by(deadline, &mut body[got..], total as u64, got as u64)?;
        }
        Ok(Frame::from_parts(h, &body)?)
    }

    /// Read and drop `len` announced payload bytes, all by `deadline` however slowly they
    /// trickle in (each read waits at most what is left). The socket's read timeout is as it
    /// was before, afterwards.
    pub fn discard_by(&mut self, len: u64, deadline: std::time::Instant) -> Result<()> {
        let mut scratch = [0u8; 16 << 10];
        let mut got = 0u64;
        let res = (|| {
            while got < len {
                let want = (len - got).min(scratch.len() as u64) as usize;
                got += self.read_some_by(Some(deadline), &mut scratch[..want], len, got)? as u64;
            }
            Ok(())
        })();
        self.disarm();
        res
    }

    /// One read (of a frame header, `ahead`: see [`Conn::read_ahead`]) that waits at most
    /// until `deadline`, if any. A plain or Unix socket is asked first without waiting — the
    /// bytes are usually there already — so a timer is set only for a read that has to wait:
    /// the socket's read timeout shortened to what is left, until [`Conn::disarm`].
    fn read_by(
        &mut self,
        deadline: Option<std::time::Instant>,
        buf: &mut [u8],
        ahead: bool,
    ) -> io::Result<usize> {
        let read =
            |c: &mut Self, buf: &mut [u8]| if ahead { c.read_ahead(buf) } else { c.read_raw(buf) };
        let Some(d) = deadline else { return read(self, buf) };
        if matches!(self.stream, Io::Plain(_) | Io::Unix(_)) {
            self.nowait = true;
            let r = read(self, buf);
            self.nowait = false;
            match r {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return r,
            }
        }
        let left = d.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        if self.armed.is_none() {
            self.armed = Some(self.timeouts.get()[0]);
        }
        self.set_read_timeout(Some(left))?;
        read(self, buf)
    }

    /// After deadline reads: the read timeout as it was before them (`None` if that is not
    /// known).
    fn disarm(&mut self) {
        if let Some(before) = self.armed.take() {
            let _ = self.set_read_timeout(before.flatten());
        }
    }

    /// A read from the stream, without waiting when [`Conn::nowait`] says so.
    fn stream_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.stream_read_unfloored(buf)?;
        if let Some(f) = &mut self.floor {
            f.count(n)?;
        }
        Ok(n)
    }

    fn stream_read_unfloored(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.nowait {
            return self.stream.read(buf);
        }
        let fd = match &self.stream {
            Io::Plain(s) => s.as_raw_fd(),
            Io::Unix(s) => s.as_raw_fd(),
            _ => return self.stream.read(buf),
        };
        // SAFETY: `buf` is valid for `buf.len()` bytes of writing for the whole call.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
    }

    /// Hold the peer to a floor on the rate it sends at (`None`: none): once past the
    /// floor's grace, a read that leaves the average under it fails with
    /// [`TransportError::TooSlow`]. Counts from the moment it is set.
    pub fn set_read_floor(&mut self, floor: Option<crate::floor::ReadFloor>) {
        self.floor = floor;
    }

    /// Read the next frame (for `DATA`, its header) but leave it to be read again: the next
    /// read returns the same frame.
    pub fn peek_frame(&mut self) -> Result<Frame> {
        let f = self.read_frame()?;
        let mut again = f.encode().to_vec();
        again.extend_from_slice(&self.unread[self.unread_at..self.unread_end]);
        (self.unread_at, self.unread_end) = (0, again.len());
        self.unread = again;
        Ok(f)
    }

    /// One `read`, of peeked bytes first.
    fn read_raw(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = &self.unread[self.unread_at..self.unread_end];
        if left.is_empty() {
            self.flush_held()?;
            return self.stream_read(buf);
        }
        let n = buf.len().min(left.len());
        buf[..n].copy_from_slice(&left[..n]);
        self.unread_at += n;
        if self.unread_at == self.unread_end {
            (self.unread_at, self.unread_end) = (0, 0);
        }
        Ok(n)
    }

    /// Like [`Conn::read_raw`] for a frame header, but one `read` takes up to
    /// [`READ_AHEAD`] bytes, keeping what follows the header for the next reads: a small
    /// message (header and payload) then costs one system call instead of two, and a large
    /// payload at most one small extra copy.
    fn read_ahead(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.read_ahead || self.unread_at < self.unread_end {
            return self.read_raw(buf);
        }
        if self.unread.len() < READ_AHEAD {
            self.unread.resize(READ_AHEAD, 0);
        }
        self.flush_held()?;
        let mut unread = std::mem::take(&mut self.unread);
        let read = self.stream_read(&mut unread);
        self.unread = unread;
        let n = read?;
        (self.unread_at, self.unread_end) = (0, n);
        if n == 0 {
            return Ok(0);
        }
        self.read_raw(buf)
    }

    /// Read a frame and turn a peer's `ERROR` frame into [`TransportError::Remote`].
    pub fn read_frame_or_remote_error(&mut self) -> Result<Frame> {
        match self.read_frame()? {
            Frame::Error { code, message } => Err(TransportError::Remote { code, message }),
            f => Ok(f),
        }
    }

    /// Write one control frame.
    pub fn write_frame(&mut self, f: &Frame) -> Result<()> {
        if !self.held.is_empty() {
            self.hold_frame(f);
            return self.flush_held().map_err(TransportError::from_io);
        }
        self.stream.write_all(&f.encode()).map_err(TransportError::from_io)
    }

    /// Send a DATA header and its payload straight from memory (no copy in user space). With
    /// a hasher, the payload goes out in pieces, each hashed just before the kernel copies it,
    /// so every byte is read from memory once per pass while it is still in cache.
    pub fn send_data_slice(
        &mut self,
        offset: u64,
        data: &[u8],
        hasher: Option<&mut Hasher>,
    ) -> Result<()> {
        let head = Header::data(offset, data.len() as u64).encode();
        let Some(h) = hasher else {
            return self.write_slices(&[&head, data]);
        };
        self.held.extend_from_slice(&head);
        self.flush_held().map_err(TransportError::from_io)?;
        for piece in data.chunks(SEND_PIECE) {
            h.update(piece);
            self.stream.write_all(piece).map_err(TransportError::from_io)?;
        }
        Ok(())
    }

    /// Send a DATA header and a file range as its payload. Without a hasher the kernel moves
    /// the bytes (`sendfile`); with one, each chunk is read into a pooled buffer, hashed and sent.
    pub fn send_data_file(
        &mut self,
        blob_offset: u64,
        src: FileSource<'_>,
        hasher: Option<&mut Hasher>,
        pool: &BufferPool,
    ) -> Result<()> {
        self.write_frame(&Frame::Data { offset: blob_offset, len: src.len })?;
        if hasher.is_none() && !self.is_tls() {
            return self.sendfile(src);
        }
        let mut hasher = hasher;
        let mut buf = pool.get();
        let mut done = 0u64;
        while done < src.len {
            let want = (src.len - done).min(buf.len() as u64) as usize;
            let n = src.file.read_at(&mut buf[..want], src.offset + done)?;
            if n == 0 {
                return Err(short_file(src.len, done));
            }
            if let Some(h) = hasher.as_deref_mut() {
                h.update(&buf[..n]);
            }
            self.stream.write_all(&buf[..n]).map_err(TransportError::from_io)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Zero-copy file → socket. `std::io::copy` only sometimes picks `sendfile` (it depends on
    /// the wrapper types), so the call is made directly to be sure of the path and the offsets.
    fn sendfile(&mut self, src: FileSource<'_>) -> Result<()> {
        let mut off = src.offset as libc::off_t;
        let end = src.offset + src.len;
        while (off as u64) < end {
            let count = ((end - off as u64).min(1 << 30)) as usize;
            // SAFETY: both descriptors are valid for the duration of the call and `off` is a
            // live local the kernel updates.
            let n = unsafe { libc::sendfile(self.fd(), src.file.as_raw_fd(), &mut off, count) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(TransportError::from_io(e));
            }
            if n == 0 {
                return Err(short_file(src.len, off as u64 - src.offset));
            }
        }
        Ok(())
    }

    /// Receive exactly `dst.len()` announced payload bytes straight into `dst`, hashing each
    /// piece while it is still in cache.
    pub fn recv_data_into(&mut self, dst: &mut [u8], hasher: Option<&mut Hasher>) -> Result<()> {
        let total = dst.len() as u64;
        let mut h = hasher;
        let mut got = 0usize;
        while got < dst.len() {
            let end = (got + RECV_PIECE).min(dst.len());
            let n = self.read_some(&mut dst[got..end], total, got as u64)?;
            if let Some(h) = h.as_deref_mut() {
                h.update(&dst[got..got + n]);
            }
            got += n;
        }
        Ok(())
    }

    /// Receive `len` announced payload bytes through a pooled buffer, handing each filled piece
    /// (already hashed) to `sink`.
    pub fn recv_data_with(
        &mut self,
        len: u64,
        hasher: Option<&mut Hasher>,
        pool: &BufferPool,
        mut sink: impl FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<()> {
        let mut h = hasher;
        let mut buf = pool.get();
        let mut got = 0u64;
        while got < len {
            let want = (len - got).min(buf.len() as u64) as usize;
            let n = self.read_some(&mut buf[..want], len, got)?;
            if let Some(h) = h.as_deref_mut() {
                h.update(&buf[..n]);
            }
            sink(&buf[..n])?;
            got += n as u64;
        }
        Ok(())
    }

    /// One `read`, mapping EOF to a truncation report naming how far the payload got.
    fn read_some(&mut self, buf: &mut [u8], expected: u64, got: u64) -> Result<usize> {
        self.read_some_by(None, buf, expected, got)
    }

    /// [`Conn::read_some`] waiting at most until `deadline` (see [`Conn::read_by`]).
    fn read_some_by(
        &mut self,
        deadline: Option<std::time::Instant>,
        buf: &mut [u8],
        expected: u64,
        got: u64,
    ) -> Result<usize> {
        loop {
            match self.read_by(deadline, buf, false) {
                Ok(0) => return Err(TransportError::Truncated { expected, got }),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TransportError::from_io(e)),
            }
        }
    }

    /// Half-close our sending side (tells the peer no more frames come).
    pub fn shutdown_write(&mut self) {
        let _ = self.flush_held();
        match &mut self.stream {
            Io::TlsServer(s) => {
                s.conn.send_close_notify();
                let _ = s.flush();
            }
            Io::TlsClient(s) => {
                s.conn.send_close_notify();
                let _ = s.flush();
            }
            Io::Plain(_) | Io::Unix(_) => {}
        }
        let _ = match &self.stream {
            Io::Unix(s) => s.shutdown(std::net::Shutdown::Write),
            _ => self.tcp().expect("not unix").shutdown(std::net::Shutdown::Write),
        };
    }
}

impl Conn {
    /// After [`Conn::shutdown_write`]: read and discard what the peer still sends until it
    /// closes its side, `within` has passed or `max` bytes came. Closing a TCP socket with
    /// unread bytes in it resets the connection, and a reset makes the peer's kernel throw
    /// away what it received but its reader has not taken yet — the answers to requests it
    /// sent ahead, say, which came before the error that ended this connection.
    pub fn linger(&mut self, within: Duration, max: usize) {
        let until = std::time::Instant::now() + within;
        let mut buf = [0u8; 8192];
        let mut seen = 0;
        while seen < max {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || self.set_read_timeout(Some(left)).is_err() {
                return;
            }
            match self.read_raw(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => seen += n,
            }
        }
    }
}

/// Most bytes one frame-header read takes from the socket (see [`Conn::read_ahead`]).
const READ_AHEAD: usize = 8192;

/// Bytes hashed per `write` on the send path: small enough to stay in L2 cache.
const SEND_PIECE: usize = 256 * 1024;

/// Bytes hashed per `read` on the receive path: small enough to stay in L2 cache.
const RECV_PIECE: usize = 256 * 1024;

/// Wait up to `wait` for `events` on `fd`; an interrupted wait is "not yet".
fn poll_fd(fd: RawFd, events: libc::c_short, wait: Duration) -> Result<bool> {
    let mut pfd = libc::pollfd { fd, events, revents: 0 };
    let ms = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(TransportError::from_io(e));
    }
    Ok(n > 0)
}

fn short_file(expected: u64, got: u64) -> TransportError {
    TransportError::Io(io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("file ended after {got} of {expected} bytes"),
    ))
}

fn tls_err(e: rustls::Error) -> TransportError {
    TransportError::Tls(e.to_string())
}

/// One `sendmsg` of `bufs`, gathered (no copy into one buffer). Std's `write_vectored` is
/// `writev`, which on a socket also pays the file layer's bookkeeping (position lock, change
/// notification) that `sendmsg` skips: measurable on a round trip of small messages. Works on
/// connected TCP, Unix and UDP sockets; no `SIGPIPE` on a closed peer (an error instead).
pub fn send_vectored(fd: RawFd, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: a zeroed msghdr is valid (no address: the socket is connected). `IoSlice` is
    // ABI-compatible with `iovec` on Unix, and `bufs` outlives the call, which only reads it.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len() as _;
        libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL)
    };
    if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
}

fn write_all_vectored(s: &mut impl Write, mut bufs: &mut [io::IoSlice<'_>]) -> io::Result<()> {
    io::IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match s.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Drive a TLS handshake to its end, or to the error that ends it.
fn finish_handshake<C, D>(c: &mut C, sock: &mut TcpStream) -> io::Result<()>
where
    C: std::ops::DerefMut<Target = rustls::ConnectionCommon<D>>,
{
    while c.is_handshaking() {
        c.complete_io(sock)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bs_wire::{DigestAlgo, ErrorCode};
    use std::net::TcpListener;
    use std::thread;

    fn pair() -> (Conn, Conn) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (Conn::new(c), Conn::new(s))
    }

    /// Options applied transfer after transfer on one connection are in force each time,
    /// whatever deadline reads did in between (the connection skips only what is set
    /// already); a deadline read that had to wait leaves the read timeout as it found it.
    #[test]
    fn options_applied_again_hold_whatever_was_set_in_between() {
        let (mut a, mut b) = pair();
        let timeouts = |c: &Conn| {
            let t = c.tcp().unwrap();
            (t.read_timeout().unwrap(), t.write_timeout().unwrap())
        };
        let io = Some(Duration::from_secs(30));
        let opts = SocketOptions { io_timeout: io, ..Default::default() };
        for round in 0..3 {
            b.apply(&opts).unwrap();
            assert_eq!(timeouts(&b), (io, io), "round {round}");
            assert!(b.tcp().unwrap().nodelay().unwrap());
            // A negotiation read within a deadline, as the server's keep-alive does.
            a.write_frame(&Frame::Hello { token: [round; 32] }).unwrap();
            assert!(matches!(
                b.read_frame_within(Duration::from_secs(5)).unwrap(),
                Frame::Hello { token } if token == [round; 32]
            ));
            assert_eq!(timeouts(&b).0, io, "a deadline read leaves the timeout as it was");
        }
        // A frame that comes only after a while: the read waits (its timer set), then the
        // timeout is put back.
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            a.write_frame(&Frame::Hello { token: [9; 32] }).unwrap();
            a
        });
        assert!(matches!(
            b.read_frame_within(Duration::from_secs(5)).unwrap(),
            Frame::Hello { .. }
        ));
        assert_eq!(timeouts(&b).0, io);
        let a = late.join().unwrap();
        // Another transfer's options on the same connection.
        let other =
            SocketOptions { io_timeout: Some(Duration::from_secs(7)), nodelay: false, ..opts };
        b.apply(&other).unwrap();
        assert_eq!(timeouts(&b), (other.io_timeout, other.io_timeout));
        assert!(!b.tcp().unwrap().nodelay().unwrap());
        b.set_write_timeout(None).unwrap();
        b.apply(&other).unwrap();
        assert_eq!(timeouts(&b), (other.io_timeout, other.io_timeout));
        let peer = a.tcp().unwrap().local_addr().unwrap();
        assert_eq!((b.peer_addr(), a.local_addr()), (Some(peer), Some(peer)));
    }

    #[test]
    fn a_watched_connection_waits_without_a_timer_and_probes_its_peer() {
        let (a, _b) = pair();
        a.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        a.watch_for_dead_peer(Duration::from_secs(20)).unwrap();
        let tcp = a.tcp().unwrap();
        assert_eq!(tcp.read_timeout().unwrap(), None);
        let s = socket2::SockRef::from(tcp);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(5));
        assert_eq!(s.tcp_user_timeout().unwrap(), Some(Duration::from_secs(20)));
    }

    #[test]
    fn file_payload_by_sendfile_and_by_read_arrive_identical() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        let pool = BufferPool::new(64 * 1024, 2);
        for hashed in [false, true] {
            let (mut a, mut b) = pair();
            let f2 = f.try_clone().unwrap();
            let p2 = pool.clone();
            let t = thread::spawn(move || {
                let mut h = DigestAlgo::Xxh3_128.hasher();
                let src = FileSource { file: &f2, offset: 1000, len: 2_000_000 };
                a.send_data_file(1000, src, hashed.then_some(&mut h), &p2).unwrap();
                hashed.then(|| h.finish())
            });
            let Frame::Data { offset, len } = b.read_frame().unwrap() else { panic!() };
            assert_eq!((offset, len), (1000, 2_000_000));
            let mut got = vec![0u8; len as usize];
            let mut h = DigestAlgo::Xxh3_128.hasher();
            b.recv_data_into(&mut got, Some(&mut h)).unwrap();
            assert_eq!(&got[..], &data[1000..2_001_000]);
            if let Some(sent) = t.join().unwrap() {
                assert_eq!(sent, h.finish());
            }
        }
    }

    #[test]
    fn peer_vanishing_mid_payload_is_reported_with_progress() {
        let (mut a, mut b) = pair();
        a.write_frame(&Frame::Data { offset: 0, len: 100 }).unwrap();
        a.stream.write_all(&[1u8; 40]).unwrap();
        drop(a);
        let Frame::Data { len, .. } = b.read_frame().unwrap() else { panic!() };
        let pool = BufferPool::new(16, 1);
        let err = b.recv_data_with(len, None, &pool, |_| Ok(())).unwrap_err();
        assert!(matches!(err, TransportError::Truncated { expected: 100, got: 40 }), "{err}");
    }

    #[test]
    fn remote_error_frames_become_typed_errors() {
        let (mut a, mut b) = pair();
        a.write_frame(&Frame::Error { code: ErrorCode::TokenExpired, message: "late".into() })
            .unwrap();
        let err = b.read_frame_or_remote_error().unwrap_err();
        assert!(matches!(err, TransportError::Remote { code: ErrorCode::TokenExpired, .. }));
        drop(a);
        assert!(matches!(b.read_frame(), Err(TransportError::Closed)));
    }

    /// A self-signed certificate for "localhost": (cert PEM, key PEM).
    pub(crate) fn self_signed() -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    #[test]
    fn tls_connections_carry_frames_and_file_payloads() {
        let (cert, key) = self_signed();
        let server = TlsServer::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let client = TlsClient::from_pem(cert.as_bytes(), None).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let data: Vec<u8> = (0..500_000u32).map(|i| (i % 253) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        let t = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut conn = Conn::tls_server(s, &server).unwrap();
            let Frame::Hello { token } = conn.read_frame().unwrap() else { panic!() };
            assert_eq!(token, [5; bs_wire::TOKEN_LEN]);
            let pool = BufferPool::new(4096, 1);
            // No hasher: over TLS this cannot be sendfile, it must still arrive intact.
            conn.send_data_file(0, FileSource { file: &f, offset: 0, len: 500_000 }, None, &pool)
                .unwrap();
            conn.shutdown_write();
        });
        let mut c =
            Conn::tls_client(TcpStream::connect(addr).unwrap(), &client, "localhost").unwrap();
        assert!(c.is_tls());
        c.write_frame(&Frame::Hello { token: [5; bs_wire::TOKEN_LEN] }).unwrap();
        let Frame::Data { len, .. } = c.read_frame().unwrap() else { panic!() };
        let mut got = vec![0u8; len as usize];
        c.recv_data_into(&mut got, None).unwrap();
        assert_eq!(got, data);
        t.join().unwrap();
    }

    #[test]
    fn an_established_tls_session_handed_over_loses_no_decrypted_byte() {
        let (cert, key) = self_signed();
        let server = TlsServer::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let client = TlsClient::from_pem(cert.as_bytes(), None).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = thread::spawn(move || {
            let mut c =
                Conn::tls_client(TcpStream::connect(addr).unwrap(), &client, "localhost").unwrap();
            // HELLO and DATA in one write: they arrive in one TLS record.
            let mut both = Frame::Hello { token: [3; bs_wire::TOKEN_LEN] }.encode().to_vec();
            both.extend_from_slice(&Frame::Data { offset: 7, len: 5 }.encode());
            both.extend_from_slice(b"bytes");
            c.stream.write_all(&both).unwrap();
            c.stream.flush().unwrap();
            let Frame::Ack { received, .. } = c.read_frame().unwrap() else { panic!() };
            received
        });
        let (s, _) = l.accept().unwrap();
        let session = rustls::ServerConnection::new(server.config()).unwrap();
        let mut first = rustls::StreamOwned::new(session, s);
        // The first owner reads exactly the HELLO; the rest stays decrypted in the session.
        let mut hello = [0u8; HEADER_LEN + bs_wire::TOKEN_LEN];
        first.read_exact(&mut hello).unwrap();
        assert_eq!(Frame::parse(&hello).unwrap().unwrap().1, hello.len());
        let (session, s) = first.into_parts();
        let mut conn = Conn::tls_server_established(session, s);
        assert!(conn.is_tls());
        let Frame::Data { offset: 7, len: 5 } = conn.read_frame().unwrap() else { panic!() };
        let mut got = [0u8; 5];
        conn.recv_data_into(&mut got, None).unwrap();
        assert_eq!(&got, b"bytes");
        conn.write_frame(&Frame::Ack { received: 12, committed: None }).unwrap();
        assert_eq!(t.join().unwrap(), 12);
    }

    #[test]
    fn tls_with_an_untrusted_certificate_fails_as_tls() {
        let (cert, key) = self_signed();
        let (other_ca, _) = self_signed();
        let server = TlsServer::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let client = TlsClient::from_pem(other_ca.as_bytes(), None).unwrap();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut conn = Conn::tls_server(s, &server).unwrap();
            let _ = conn.read_frame();
        });
        let mut c =
            Conn::tls_client(TcpStream::connect(addr).unwrap(), &client, "localhost").unwrap();
        let e = c
            .write_frame(&Frame::Hello { token: [0; bs_wire::TOKEN_LEN] })
            .and_then(|_| c.read_frame().map(|_| ()));
        assert!(matches!(e, Err(TransportError::Tls(_))), "{e:?}");
        t.join().unwrap();
    }

    #[test]
    fn a_trickling_peer_cannot_outlast_the_frame_deadline() {
        let (mut a, mut b) = pair();
        let t = thread::spawn(move || {
            // One byte every 30 ms: each read succeeds quickly, the frame never completes.
            for _ in 0..20 {
                if a.stream.write_all(b"B").is_err() {
                    break;
                }
                thread::sleep(std::time::Duration::from_millis(30));
            }
        });
        let e = b.read_frame_within(std::time::Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, TransportError::Timeout), "{e:?}");
        drop(b);
        t.join().unwrap();
    }

    #[test]
    fn a_peeked_frame_is_read_again_and_its_payload_follows() {
        let (mut a, mut b) = pair();
        a.write_frame(&Frame::Data { offset: 3, len: 4 }).unwrap();
        a.stream.write_all(b"abcd").unwrap();
        a.write_frame(&Frame::Ack { received: 7, committed: None }).unwrap();
        let first = b.peek_frame().unwrap();
        assert!(matches!(first, Frame::Data { offset: 3, len: 4 }));
        assert!(matches!(b.peek_frame().unwrap(), Frame::Data { offset: 3, len: 4 }));
        assert!(matches!(b.read_frame().unwrap(), Frame::Data { offset: 3, len: 4 }));
        let mut got = [0u8; 4];
        b.recv_data_into(&mut got, None).unwrap();
        assert_eq!(&got, b"abcd");
        assert!(matches!(b.read_frame().unwrap(), Frame::Ack { received: 7, .. }));
    }

    #[test]
    fn read_timeout_is_a_timeout() {
        let (_a, mut b) = pair();
        b.set_read_timeout(Some(std::time::Duration::from_millis(20))).unwrap();
        assert!(matches!(b.read_frame(), Err(TransportError::Timeout)));
    }
}
