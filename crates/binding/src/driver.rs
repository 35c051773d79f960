//! A binding over a blocking connection: the thin driver of a [`Session`]. It writes the
//! frames the session produces (honouring pacing and the process's [`Scheduler`]), reads
//! frames and feeds them to the session, answers the peer's renegotiations, and queues
//! messages that arrive while it waits for a renegotiation to finish.
//!
//! On the wire (after the data connection's `HELLO`): `MSG` frames, each followed by its
//! layered bytes, and `RENEG` frames between them (see `bs_wire::frame`). `ERROR` ends the
//! binding with the reason.

use std::collections::VecDeque;
use std::net::UdpSocket;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bs_transport::{Conn, TransportError};
use bs_wire::{Frame, Header};

use crate::carry::{msg_header, read_msg, wait_pacing, write_msg};
use crate::counters::Counters;
use crate::error::{BindingError, Refusal};
use crate::msg::Msg;
use crate::qos::Profile;
use crate::sched::{Scheduler, Ticket};
use crate::session::{Datagram, Outgoing, RenegEvent, Session};
use crate::udp::SeqWindow;

type Result<T> = std::result::Result<T, BindingError>;

/// How a renegotiation this side started ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renegotiated {
    /// The offer (perhaps lowered) is in force both ways.
    Applied(Profile),
    /// The peer refused the proposal; nothing changed.
    RefusedByPeer(String),
    /// The offer was below this side's floor, so this side refused it; nothing changed.
    Refused(Refusal),
    /// The peer proposed at the same moment and its proposal went first.
    Withdrawn,
}

/// One open binding.
pub struct Binding {
    conn: Conn,
    session: Session,
    id: u64,
    sched: Option<Arc<Scheduler>>,
    inbox: VecDeque<Msg>,
    events: VecDeque<RenegEvent>,
    out: Vec<Outgoing>,
    /// Datagram bindings: the UDP socket messages travel on (the connection keeps `RENEG`
    /// and `REPORT`), the receive window, and the peer's closing report.
    udp: Option<UdpSocket>,
    window: SeqWindow,
    peer_report: Option<Report>,
    inject: Option<Box<dyn FnMut(u64) -> Inject + Send>>,
    held: Option<Vec<u8>>,
}

/// Fault injection on a datagram sender (tests and demonstrations of loss accounting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inject {
    Send,
    /// Do not send this datagram: the receiver counts it lost.
    Drop,
    /// Send this datagram after the next one: the receiver counts it reordered.
    Hold,
}

/// Datagram accounting at the end of a datagram binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Report {
    /// Datagrams sent (sender's report) or received (receiver's).
    pub count: u64,
    pub lost: u64,
    pub reordered: u64,
    pub duplicates: u64,
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding").field("id", &self.id).field("session", &self.session).finish()
    }
}

impl Binding {
    /// Run `session` on `conn` (the `HELLO` is already done). `id` names it in status.
    pub fn new(mut conn: Conn, session: Session, id: u64) -> Self {
        conn.set_read_ahead(true);
        Self {
            conn,
            session,
            id,
            sched: None,
            inbox: VecDeque::new(),
            events: VecDeque::new(),
            out: Vec::new(),
            udp: None,
            window: SeqWindow::new(DATAGRAM_WINDOW),
            peer_report: None,
            inject: None,
            held: None,
        }
    }

    /// Decide per datagram (by its sequence number) whether it is sent, dropped or held back
    /// behind the next one.
    pub fn inject(&mut self, f: impl FnMut(u64) -> Inject + Send + 'static) {
        self.inject = Some(Box::new(f));
    }

    /// Carry messages as datagrams on `sock` (connected to the peer's datagram socket).
    pub fn with_datagrams(mut self, sock: UdpSocket) -> Self {
        self.udp = Some(sock);
        self
    }

    pub fn is_datagram(&self) -> bool {
        self.udp.is_some()
    }

    /// Send through `sched`, shared with the process's other bindings.
    pub fn with_scheduler(mut self, sched: Arc<Scheduler>) -> Self {
        self.sched = Some(sched);
        self
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn profile(&self) -> &Profile {
        self.session.profile()
    }

    pub fn counters(&self) -> &Arc<Counters> {
        self.session.counters()
    }

    /// Judge the peer's counter-offers to this side's proposals against `floor` from now on.
    pub fn set_floor(&mut self, floor: crate::negotiate::Floor) {
        self.session.set_floor(floor);
    }

    pub fn conn(&self) -> &Conn {
        &self.conn
    }

    /// Largest message the binding carries now.
    pub fn max_message(&self) -> usize {
        self.session.max_message()
    }

    /// What the peer's renegotiations did since the last call.
    pub fn take_events(&mut self) -> Vec<RenegEvent> {
        self.events.drain(..).collect()
    }

    /// A message of `len` bytes to fill in place and hand to [`Binding::send_msg`] (no copy).
    pub fn alloc(&self, len: usize) -> Msg {
        self.session.alloc(len)
    }

    /// Send `data` as one message: straight from `data` when no layer changes it (TCP or
    /// Unix, no scheduler), else copied once into a pooled buffer with headroom.
    pub fn send(&mut self, data: &[u8]) -> Result<()> {
        self.send_parts(data, &[])
    }

    /// Send `head` followed by `body` as one message (e.g. an application header and the
    /// payload it describes), gathered from both without a copy when no layer changes it.
    pub fn send_parts(&mut self, head: &[u8], body: &[u8]) -> Result<()> {
        let len = head.len() + body.len();
        if self.udp.is_none()
            && self.sched.is_none()
            && let Some(a) = self.session.encode_in_place(len)?
        {
            let frame = msg_header(a, len);
            return self.conn.write_slices(&[&frame, head, body]).map_err(|e| self.peer_reason(e));
        }
        let mut m = self.session.alloc(len);
        m.payload_mut()[..head.len()].copy_from_slice(head);
        m.payload_mut()[head.len()..].copy_from_slice(body);
        self.send_msg(m)
    }

    /// Send `body` as one message without copying it: layers that only add headers leave it
    /// where it is, and headers and body leave in one vectored write.
    pub fn send_bytes(&mut self, body: bytes::Bytes) -> Result<()> {
        let m = self.session.shared(body);
        self.send_msg(m)
    }

    /// Send one message.
    pub fn send_msg(&mut self, msg: Msg) -> Result<()> {
        let mut out = std::mem::take(&mut self.out);
        let res = self.session.encode(msg, &mut out).and_then(|()| {
            for o in out.drain(..) {
                self.write(o)?;
            }
            Ok(())
        });
        out.clear();
        self.out = out;
        res
    }

    fn write(&mut self, o: Outgoing) -> Result<()> {
        if let Some(sock) = &self.udp {
            wait_pacing(&o);
            let head = msg_header(o.seq, o.wire.len());
            let (h, b) = o.wire.parts();
            let what = match &mut self.inject {
                Some(f) => f(crate::session::split_seq(o.seq).1),
                None => Inject::Send,
            };
            match what {
                Inject::Send => {}
                Inject::Drop => return Ok(()),
                Inject::Hold => {
                    self.held = Some([&head[..], h, b].concat());
                    return Ok(());
                }
            }
            let res = send_datagram(sock, [&head, h, b]);
            if let Some(h) = self.held.take() {
                let _ = sock.send(&h);
            }
            return match res {
                Ok(_) => Ok(()),
                // A full socket buffer or an absent receiver loses the datagram, as the
                // network would; the receiver's report counts it.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
                Err(e) => Err(TransportError::from_io(e).into()),
            };
        }
        let conn = &mut self.conn;
        let res = match &self.sched {
            None => write_msg(conn, &o),
            Some(s) => {
                wait_pacing(&o);
                let p = self.session.profile();
                let ticket = Ticket {
                    binding: self.id,
                    bytes: o.wire.len() + bs_wire::HEADER_LEN,
                    priority: p.priority,
                    latency: p.latency(),
                    weight: p.weight.max(1),
                };
                let c = self.session.counters().clone();
                // Wait for room in the socket before queueing for the slot, so a slot is
                // held for a write that can go, not for a peer that is slow to read.
                if s.contended() {
                    while !conn.writable(Duration::from_secs(1))? {}
                }
                Counters::add(&c.queued, 1);
                s.send(ticket, || {
                    c.queued.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                    let (h, b) = o.wire.parts();
                    conn.write_slices(&[&msg_header(o.seq, o.wire.len()), h, b])
                })
            }
        };
        res.map_err(|e| self.peer_reason(e))
    }

    /// When a write fails because the peer hung up, its `ERROR` frame says why; prefer that.
    fn peer_reason(&mut self, e: TransportError) -> BindingError {
        if matches!(e, TransportError::Io(_))
            && let Ok(true) = self.conn.readable(Duration::from_millis(50))
            && let Ok(Frame::Error { code, message }) = self.conn.read_frame()
        {
            return BindingError::Remote { code, message };
        }
        e.into()
    }

    /// The next message, or `None` when the peer closed the binding cleanly. Renegotiation
    /// frames from the peer are answered on the way (see [`Binding::take_events`]).
    pub fn recv(&mut self) -> Result<Option<Msg>> {
        if let Some(m) = self.inbox.pop_front() {
            return Ok(Some(m));
        }
        loop {
            match self.read_one()? {
                Read::Msg(m) => return Ok(Some(m)),
                Read::Closed => return Ok(None),
                Read::Nothing => {}
            }
        }
    }

    /// Like [`Binding::recv`], but give up after `wait` with no frame (`Ok(None)` then too;
    /// tell the two apart with [`Binding::is_closed`]-style logic in the caller).
    pub fn recv_within(&mut self, wait: Duration) -> Result<Option<Msg>> {
        if let Some(m) = self.inbox.pop_front() {
            return Ok(Some(m));
        }
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.conn.readable(left)? {
                return Ok(None);
            }
            match self.read_one()? {
                Read::Msg(m) => return Ok(Some(m)),
                Read::Closed => return Err(TransportError::Closed.into()),
                Read::Nothing if left.is_zero() => return Ok(None),
                Read::Nothing => {}
            }
        }
    }

    /// Process whatever frames are already waiting (without blocking); messages are queued
    /// for [`Binding::recv`]. Returns false once the peer has closed.
    pub fn poll(&mut self) -> Result<bool> {
        self.poll_up_to(usize::MAX)
    }

    /// [`Binding::poll`], but reading no more once `max` messages wait to be received (a
    /// peer that sends without end cannot grow them without end).
    pub fn poll_up_to(&mut self, max: usize) -> Result<bool> {
        while self.inbox.len() < max && self.conn.readable(Duration::ZERO)? {
            match self.read_one()? {
                Read::Msg(m) => self.inbox.push_back(m),
                Read::Closed => return Ok(false),
                Read::Nothing => {}
            }
        }
        Ok(true)
    }

    /// Messages read (by [`Binding::poll`], say) and not received yet.
    pub fn waiting(&self) -> usize {
        self.inbox.len()
    }

    /// Send a request and wait for its reply (request/reply flows).
    pub fn request(&mut self, data: &[u8]) -> Result<Msg> {
        self.send(data)?;
        self.recv()?.ok_or(BindingError::Transport(TransportError::Closed))
    }

    /// Propose `p` for this live binding and wait for the outcome. Messages that arrive
    /// meanwhile are kept for [`Binding::recv`].
    pub fn renegotiate(&mut self, p: Profile) -> Result<Renegotiated> {
        let f = self.session.propose(p)?;
        self.conn.write_frame(&f).map_err(|e| self.peer_reason(e))?;
        loop {
            match self.read_one()? {
                Read::Msg(m) => self.inbox.push_back(m),
                Read::Closed => return Err(TransportError::Closed.into()),
                Read::Nothing => {}
            }
            let mut decided = None;
            while let Some(ev) = self.events.pop_front() {
                match ev {
                    RenegEvent::Applied(p) if !self.session.renegotiating() => {
                        decided = Some(Renegotiated::Applied(p))
                    }
                    RenegEvent::PeerRefused(r) => decided = Some(Renegotiated::RefusedByPeer(r)),
                    RenegEvent::WeRefused(r) => decided = Some(Renegotiated::Refused(r)),
                    RenegEvent::Withdrawn => decided = Some(Renegotiated::Withdrawn),
                    other => self.events.push_back(other),
                }
                if decided.is_some() {
                    break;
                }
            }
            if let Some(d) = decided {
                return Ok(d);
            }
        }
    }

    fn read_one(&mut self) -> Result<Read> {
        let f = match self.conn.read_frame() {
            Ok(f) => f,
            Err(TransportError::Closed) => return Ok(Read::Closed),
            Err(e) => return Err(e.into()),
        };
        match f {
            Frame::Msg { seq, len } => {
                Ok(match read_msg(&mut self.conn, &mut self.session, seq, len)? {
                    Some(m) => Read::Msg(m),
                    None => Read::Nothing,
                })
            }
            Frame::Reneg { id, step, body } => {
                let s = self.session.on_reneg(id, step, &body)?;
                for f in &s.frames {
                    self.conn.write_frame(f)?;
                }
                self.events.extend(s.event);
                Ok(Read::Nothing)
            }
            Frame::Report { count, lost, reordered, duplicates } => {
                self.peer_report = Some(Report { count, lost, reordered, duplicates });
                Ok(Read::Nothing)
            }
            Frame::Error { code, message } => Err(BindingError::Remote { code, message }),
            other => Err(BindingError::UnexpectedFrame(other.kind().name())),
        }
    }

    /// Tell the peer why the binding ends (best effort) and close it.
    pub fn fail(self, e: &BindingError) {
        if matches!(e, BindingError::Remote { .. } | BindingError::Transport(_)) {
            return self.close();
        }
        self.end_with(e.code(), e.to_string());
    }

    /// End the binding with an `ERROR` frame of this code and reason (best effort).
    pub fn end_with(mut self, code: bs_wire::ErrorCode, message: String) {
        let _ = self.conn.write_frame(&Frame::Error { code, message });
        self.conn.shutdown_write();
    }

    /// [`Binding::end_with`], then read and drop what the peer still sends (for at most
    /// `within`, `max` bytes) before closing: closing on bytes unread resets the connection,
    /// and the reset can destroy the `ERROR` before the peer has read it.
    pub fn end_lingering(
        mut self,
        code: bs_wire::ErrorCode,
        message: String,
        within: Duration,
        max: usize,
    ) {
        let _ = self.conn.write_frame(&Frame::Error { code, message });
        self.conn.shutdown_write();
        self.conn.linger(within, max);
    }

    /// Close our sending side; the peer's `recv` returns `None`.
    pub fn close(mut self) {
        self.conn.shutdown_write();
    }

    /// Close our sending side but keep reading (e.g. to collect a final report).
    pub fn shutdown_write(&mut self) {
        self.conn.shutdown_write();
    }
}

/// Datagrams a late one may trail the newest by and still count as reordered, not lost.
pub const DATAGRAM_WINDOW: u64 = 4096;

impl Binding {
    /// Datagram sender: say how many datagrams were sent and wait for the receiver's count
    /// of what arrived (kept in this side's counters too).
    pub fn finish_datagrams(&mut self) -> Result<Report> {
        if let (Some(h), Some(sock)) = (self.held.take(), &self.udp) {
            let _ = sock.send(&h);
        }
        let sent = self.session.counters().snapshot().wire_out_count;
        let f = Frame::Report { count: sent, lost: 0, reordered: 0, duplicates: 0 };
        self.conn.write_frame(&f).map_err(|e| self.peer_reason(e))?;
        loop {
            if let Some(r) = self.peer_report.take() {
                let c = self.session.counters();
                Counters::add(&c.lost, r.lost);
                Counters::add(&c.reordered, r.reordered);
                return Ok(r);
            }
            match self.read_one()? {
                Read::Closed => return Err(TransportError::Closed.into()),
                Read::Msg(_) | Read::Nothing => {}
            }
        }
    }

    /// Datagram receiver: take datagrams (and the connection's `RENEG` frames) until the
    /// sender's closing report, handing each message to `each`; answer with this side's
    /// count and return it.
    pub fn receive_datagrams(&mut self, mut each: impl FnMut(Msg)) -> Result<Report> {
        let sock = self.udp.take().ok_or(BindingError::UnexpectedFrame("MSG"))?;
        let res = self.receive_on(&sock, &mut each);
        self.udp = Some(sock);
        res
    }

    fn receive_on(&mut self, sock: &UdpSocket, each: &mut impl FnMut(Msg)) -> Result<Report> {
        use std::os::fd::AsRawFd;
        sock.set_nonblocking(true).map_err(TransportError::from_io)?;
        let pools = bs_wire::SizedPools::new(4);
        loop {
            // Drain what the socket holds, then wait for either socket. Each datagram lands in
            // a pooled buffer that then travels up the stack as the message (no copy).
            loop {
                let mut buf = Msg::alloc(&pools, 0, 1 << 16);
                match sock.recv(buf.payload_mut()) {
                    Ok(n) => {
                        buf.truncate(n);
                        self.on_datagram(buf, each)?
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
                    Err(e) => return Err(TransportError::from_io(e).into()),
                }
            }
            if self.conn.readable(Duration::ZERO)? {
                match self.read_one()? {
                    Read::Closed => return Err(TransportError::Closed.into()),
                    Read::Msg(_) => return Err(BindingError::UnexpectedFrame("MSG")),
                    Read::Nothing => {}
                }
                if let Some(r) = self.peer_report.take() {
                    // Datagrams sent before the report may still be in the socket.
                    loop {
                        let mut buf = Msg::alloc(&pools, 0, 1 << 16);
                        let Ok(n) = sock.recv(buf.payload_mut()) else { break };
                        buf.truncate(n);
                        self.on_datagram(buf, each)?;
                    }
                    self.window.finish(r.count);
                    let c = self.session.counters();
                    let mine = Report {
                        count: self.window.received,
                        lost: self.window.lost,
                        reordered: self.window.reordered,
                        duplicates: self.window.duplicates,
                    };
                    c.lost.store(mine.lost, std::sync::atomic::Ordering::Relaxed);
                    let f = Frame::Report {
                        count: mine.count,
                        lost: mine.lost,
                        reordered: mine.reordered,
                        duplicates: mine.duplicates,
                    };
                    self.conn.write_frame(&f)?;
                    return Ok(mine);
                }
                continue;
            }
            let mut fds = [
                libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.conn.raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: two valid pollfds for the duration of the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(TransportError::from_io(e).into());
                }
            }
        }
    }

    fn on_datagram(&mut self, mut d: Msg, each: &mut impl FnMut(Msg)) -> Result<()> {
        let Some(head) = d.pop(bs_wire::HEADER_LEN) else {
            return Err(BindingError::UnexpectedFrame("runt datagram"));
        };
        let head: [u8; bs_wire::HEADER_LEN] = head.try_into().expect("exactly a header");
        let h = Header::parse(&head).map_err(TransportError::from)?;
        if h.kind != bs_wire::FrameKind::Msg || h.b != d.len() as u64 {
            return Err(BindingError::UnexpectedFrame("datagram that is not one whole MSG"));
        }
        self.session.check_wire_len(h.b)?;
        let (_, seq) = crate::session::split_seq(h.a);
        let arrival = self.window.on(seq)?;
        let c = self.session.counters().clone();
        c.lost.store(self.window.lost, std::sync::atomic::Ordering::Relaxed);
        c.reordered.store(self.window.reordered, std::sync::atomic::Ordering::Relaxed);
        if arrival == crate::udp::Arrival::Duplicate {
            return Ok(());
        }
        for _ in 0..8 {
            match self.session.decode_datagram(h.a, d)? {
                Datagram::Decoded(Some(m)) => {
                    each(m);
                    return Ok(());
                }
                Datagram::Decoded(None) | Datagram::Stale => return Ok(()),
                // Sent under a profile whose ACCEPT is still on its way: read it first.
                Datagram::Ahead(back) => {
                    d = back;
                    if let Read::Closed = self.read_one()? {
                        return Err(TransportError::Closed.into());
                    }
                }
            }
        }
        Err(BindingError::Renegotiation("datagram from a profile never accepted".into()))
    }
}

/// Send `parts` as one datagram on the connected `sock`, gathered by the kernel (no copy into
/// one buffer; std's `UdpSocket` has no vectored send).
fn send_datagram(sock: &UdpSocket, parts: [&[u8]; 3]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    bs_transport::send_vectored(sock.as_raw_fd(), &parts.map(std::io::IoSlice::new))
}

enum Read {
    Msg(Msg),
    Closed,
    Nothing,
}
