//! A binding over a blocking connection: the thin driver of a [`Session`]. It writes the
//! frames the session produces (honouring pacing and the process's [`Scheduler`]), reads
//! frames and feeds them to the session, answers the peer's renegotiations, and queues
//! messages that arrive while it waits for a renegotiation to finish.
//!
//! On the wire (after the data connection's `HELLO`): `MSG` frames, each followed by its
//! layered bytes, and `RENEG` frames between them (see `bs_wire::frame`). `ERROR` ends the
//! binding with the reason.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bs_transport::{Conn, TransportError};
use bs_wire::{Frame, Header};

use crate::counters::Counters;
use crate::error::{BindingError, Refusal};
use crate::msg::Msg;
use crate::qos::Profile;
use crate::sched::{Scheduler, Ticket};
use crate::session::{Outgoing, RenegEvent, Session};

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
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding").field("id", &self.id).field("session", &self.session).finish()
    }
}

impl Binding {
    /// Run `session` on `conn` (the `HELLO` is already done). `id` names it in status.
    pub fn new(conn: Conn, session: Session, id: u64) -> Self {
        Self {
            conn,
            session,
            id,
            sched: None,
            inbox: VecDeque::new(),
            events: VecDeque::new(),
            out: Vec::new(),
        }
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

    /// Send `data` as one message (copied once into a pooled buffer with headroom).
    pub fn send(&mut self, data: &[u8]) -> Result<()> {
        let m = self.session.message(data);
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
        if let Some(t) = o.wire.not_before {
            let now = Instant::now();
            if t > now {
                std::thread::sleep(t - now);
            }
        }
        let head =
            Header { kind: bs_wire::FrameKind::Msg, body_len: 0, a: o.seq, b: o.wire.len() as u64 }
                .encode();
        let conn = &mut self.conn;
        let res = match &self.sched {
            None => conn.write_parts(&head, &o.wire),
            Some(s) => {
                let p = self.session.profile();
                let ticket = Ticket {
                    binding: self.id,
                    bytes: o.wire.len() + head.len(),
                    priority: p.priority,
                    latency: p.latency(),
                    weight: p.weight.max(1),
                };
                let c = self.session.counters().clone();
                Counters::add(&c.queued, 1);
                s.send(ticket, || {
                    c.queued.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                    conn.write_parts(&head, &o.wire)
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
        while self.conn.readable(Duration::ZERO)? {
            match self.read_one()? {
                Read::Msg(m) => self.inbox.push_back(m),
                Read::Closed => return Ok(false),
                Read::Nothing => {}
            }
        }
        Ok(true)
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
                let mut buf = self.session.wire_buffer(len)?;
                self.conn.recv_data_into(buf.payload_mut(), None)?;
                Ok(match self.session.decode(seq, buf)? {
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
            Frame::Error { code, message } => Err(BindingError::Remote { code, message }),
            other => Err(BindingError::UnexpectedFrame(kind_name(&other))),
        }
    }

    /// Tell the peer why the binding ends (best effort) and close it.
    pub fn fail(mut self, e: &BindingError) {
        if !matches!(e, BindingError::Remote { .. } | BindingError::Transport(_)) {
            let _ = self.conn.write_frame(&Frame::Error { code: e.code(), message: e.to_string() });
        }
        self.conn.shutdown_write();
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

enum Read {
    Msg(Msg),
    Closed,
    Nothing,
}

fn kind_name(f: &Frame) -> &'static str {
    match f {
        Frame::Hello { .. } => "HELLO",
        Frame::Data { .. } => "DATA",
        Frame::Sum { .. } => "SUM",
        Frame::Ack { .. } => "ACK",
        Frame::Error { .. } => "ERROR",
        Frame::Msg { .. } => "MSG",
        Frame::Reneg { .. } => "RENEG",
    }
}
