//! The sending side of a flow: `start`, `send`, `stop`, and the reports of receivers that
//! were dropped on the way — over a connection to a distributer ([`Sender::connect`]), or in
//! the distributer's own process ([`crate::Distributer::sender`]).

use std::time::Duration;

use bs_binding::{Binding, BindingError, Role};
use bs_transport::TransportError;

use bs_wire::{DigestAlgo, Hasher};
use bytes::Bytes;

use crate::distributer::binding;
use crate::error::DistribError;
use crate::msg::{self, Message, Params};
use crate::run::{Forwarder, Wire};
use crate::target::Target;

/// A receiver that left a run early: its name, the bytes it was sent, and why.
pub type Dropped = msg::Outcome;
/// How one receiver ended a run.
pub type ReceiverOutcome = msg::Outcome;

/// What `stop` returns: the exact total, and every receiver of the run with its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopReport {
    pub total: u64,
    pub receivers: Vec<ReceiverOutcome>,
}

impl StopReport {
    /// Every receiver confirmed every byte.
    pub fn all_delivered(&self) -> bool {
        self.receivers.iter().all(|r| r.ok)
    }
}

/// How long connecting and joining may take.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Connect to a distributer and `JOIN` a flow as `role`; returns the binding and the welcome.
pub(crate) fn join(
    target: &Target,
    role: u8,
    j: &msg::Join,
) -> Result<(Binding, msg::Welcome), DistribError> {
    let addr = target.addr.as_str();
    let tcp = bs_transport::connect_any(addr, CONNECT_WAIT).map_err(|e| {
        DistribError::Remote(format!("cannot reach the distributer at {addr}: {e}"))
    })?;
    let conn = target.conn(tcp)?;
    conn.watch_for_dead_peer(crate::distributer::STOP_PATIENCE)?;
    let mut b = binding(conn, Role::Initiator, 0);
    let answer = b.send(&msg::join(role, j)).and_then(|()| b.recv_within(CONNECT_WAIT));
    // The distributer's own refusals (an ERROR frame) pass as they are; anything else at this
    // point is most often TLS on one side only, so say so.
    let answer = answer.map_err(|e| match DistribError::from_binding(e) {
        DistribError::Remote(m) => DistribError::Remote(m),
        e if target.tls.is_some() => {
            // A plain-TCP distributer answers the handshake with bytes that are no TLS.
            let plain = bs_transport::peer_speaks_no_tls(&e.to_string());
            let why = if plain { " (it serves plain TCP: connect without its CA)" } else { "" };
            DistribError::Remote(format!("TLS with the distributer at {addr} failed{why}: {e}"))
        }
        e => DistribError::Remote(format!(
            "the distributer at {addr} did not answer the JOIN ({e}); if it serves TLS, \
             connect with its CA"
        )),
    })?;
    match answer {
        Some(m) => match Message::parse(m.payload())? {
            Message::Welcome(w) => {
                // The flow's socket buffer on this end (best effort: the kernel caps it).
                if let (n @ 1.., Some(tcp)) = (w.socket_buffer, b.conn().tcp()) {
                    let _ = crate::flow_buffers(role == msg::ROLE_SENDER, true, n)
                        .apply_buffers_to(tcp);
                }
                Ok((b, w))
            }
            other => Err(DistribError::Malformed(format!("expected WELCOME, got {other:?}"))),
        },
        None => Err(DistribError::Remote(format!(
            "the distributer at {addr} did not answer the JOIN; if it serves TLS, connect with \
             its CA"
        ))),
    }
}

/// One flow's sender.
pub struct Sender {
    link: Link,
    /// The distributer's address, for errors.
    addr: String,
    welcome: msg::Welcome,
    /// Bytes/s this sender keeps to (the flow's pace, or its own), and when the run began.
    pace: Option<u64>,
    started: std::time::Instant,
    running: bool,
    offset: u64,
    hasher: Hasher,
    dropped: Vec<Dropped>,
}

/// How a sender's messages reach the distributer.
enum Link {
    /// Over its connection (boxed: a binding is large beside a forwarder).
    Remote(Box<Binding>),
    /// Handed over in this process.
    Local(Forwarder),
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("running", &self.running)
            .field("offset", &self.offset)
            .finish()
    }
}

impl Sender {
    /// Become the sender of `stream`/`flow` on the distributer at `target` (an address, or a
    /// [`Target`] with TLS).
    pub fn connect(
        target: impl Into<Target>,
        stream: &str,
        flow: &str,
        token: Option<&str>,
    ) -> Result<Self, DistribError> {
        let j = msg::Join {
            stream: stream.into(),
            flow: flow.into(),
            name: String::new(),
            token: token.unwrap_or_default().into(),
        };
        let target = target.into();
        let (b, welcome) = join(&target, msg::ROLE_SENDER, &j)?;
        Ok(Self::new(Link::Remote(Box::new(b)), target.addr.clone(), welcome))
    }

    /// The sender of a distributer in this process (see [`crate::Distributer::sender`]).
    pub(crate) fn local(fw: Forwarder, at: std::net::SocketAddr) -> Self {
        // (No socket of its own: the flow's socket buffer is the distributer's business.)
        let welcome =
            msg::Welcome { socket_buffer: 0, ..crate::distributer::welcome(&fw.flow().spec) };
        Self::new(Link::Local(fw), format!("{at} (in this process)"), welcome)
    }

    fn new(link: Link, addr: String, welcome: msg::Welcome) -> Self {
        Self {
            link,
            addr,
            pace: (welcome.pace > 0).then_some(welcome.pace),
            started: std::time::Instant::now(),
            welcome,
            running: false,
            offset: 0,
            hasher: DigestAlgo::Xxh3_128.hasher(),
            dropped: Vec::new(),
        }
    }

    /// The flow's slow-receiver policy (hold, buffer or timeout).
    pub fn policy(&self) -> &str {
        &self.welcome.policy
    }

    /// Bytes sent in the current run.
    pub fn position(&self) -> u64 {
        self.offset
    }

    /// The send buffer this sender's connection runs with, as the kernel reports it (Linux
    /// reports twice what was set; the flow's `socket_buffer` sets it); `None` over a Unix
    /// socket, in the distributer's process, or when the kernel does not say.
    pub fn socket_buffer(&self) -> Option<usize> {
        let Link::Remote(b) = &self.link else { return None };
        let tcp = b.conn().tcp()?;
        socket2::SockRef::from(tcp).send_buffer_size().ok()
    }

    /// The rate `send` keeps to (bytes/s), if any: the flow's `pace` unless set here.
    pub fn pace(&self) -> Option<u64> {
        self.pace
    }

    /// Send at most `bytes_per_s` from now on (`None`: as fast as the flow allows), as an
    /// instrument that produces data at a set rate does.
    pub fn set_pace(&mut self, bytes_per_s: Option<u64>) {
        self.pace = bytes_per_s.filter(|r| *r > 0);
    }

    /// Begin a run with these parameters (every receiver's `on_start` gets them).
    pub fn start(&mut self, params: &Params) -> Result<(), DistribError> {
        if self.running {
            return Err(DistribError::Order("start: the flow is already running".into()));
        }
        match &mut self.link {
            Link::Remote(b) => b.send(&msg::start(params)).map_err(DistribError::from_binding)?,
            Link::Local(fw) => fw.start(Wire::Built(msg::start(params)))?,
        }
        (self.running, self.offset) = (true, 0);
        self.started = std::time::Instant::now();
        self.hasher = DigestAlgo::Xxh3_128.hasher();
        Ok(())
    }

    /// Send the next bytes of the run (blocks while a `hold` flow waits for its slowest
    /// receiver, and to keep to the pace, if any). In the distributer's process the bytes
    /// are copied once, to be shared by every receiver's queue ([`Sender::send_bytes`] shares
    /// them as they are).
    pub fn send(&mut self, data: &[u8]) -> Result<(), DistribError> {
        self.send_from(data, None)
    }

    /// As [`Sender::send`], with bytes the distributer in this process may keep as they are
    /// until every receiver has them (no copy); over a connection the same as `send`.
    pub fn send_bytes(&mut self, data: &Bytes) -> Result<(), DistribError> {
        self.send_from(data, Some(data))
    }

    /// `data`, which is `shared` when given.
    fn send_from(&mut self, data: &[u8], shared: Option<&Bytes>) -> Result<(), DistribError> {
        if !self.running {
            return Err(DistribError::Order("send before start (or after stop)".into()));
        }
        let mut at = 0;
        for piece in data.chunks(self.welcome.chunk.max(1) as usize) {
            let head = msg::data_head(self.offset);
            let len = piece.len();
            let sent = match &mut self.link {
                Link::Remote(b) => b.send_parts(&head, piece),
                Link::Local(fw) => {
                    let body = match shared {
                        Some(s) => s.slice(at..at + len),
                        None => Bytes::copy_from_slice(piece),
                    };
                    fw.data(self.offset, len as u64, Wire::Data { head, body })?;
                    Ok(())
                }
            };
            sent.map_err(|e| self.lost(e))?;
            at += len;
            self.hasher.update(piece);
            self.offset += piece.len() as u64;
            if let Some(rate) = self.pace {
                let due = Duration::from_secs_f64(self.offset as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(self.started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
        self.collect_reports()
    }

    /// Reports that arrived without waiting for them.
    fn collect_reports(&mut self) -> Result<(), DistribError> {
        let b = match &mut self.link {
            Link::Remote(b) => b,
            Link::Local(fw) => {
                self.dropped.extend(fw.newly_gone());
                return Ok(());
            }
        };
        let (addr, running, offset) = (&self.addr, self.running, self.offset);
        let lost = |e| lost(addr, running, offset, e);
        if !b.poll().map_err(lost)? {
            return Err(lost(BindingError::Transport(TransportError::Closed)));
        }
        while let Some(m) = b.recv_within(Duration::ZERO).map_err(lost)? {
            match Message::parse(m.payload())? {
                Message::Dropped(d) => self.dropped.push(d),
                other => {
                    return Err(DistribError::Malformed(format!("unexpected {other:?}")));
                }
            }
        }
        Ok(())
    }

    /// Receivers dropped from the run since the last call (they are in the stop report too).
    pub fn take_dropped(&mut self) -> Vec<Dropped> {
        let _ = self.collect_reports();
        std::mem::take(&mut self.dropped)
    }

    /// End the run: announce the exact total and its digest, and return once every receiver
    /// has confirmed both or has been reported.
    pub fn stop(&mut self) -> Result<StopReport, DistribError> {
        if !self.running {
            return Err(DistribError::Order("stop before start".into()));
        }
        let digest = msg::digest_bytes(&self.hasher.finish());
        let stop = msg::stop(self.offset, &digest);
        let b = match &mut self.link {
            Link::Remote(b) => b,
            Link::Local(fw) => {
                let (gone, s) = fw.stop(self.offset, Wire::Built(stop))?;
                self.dropped.extend(gone);
                self.running = false;
                return Ok(StopReport { total: s.total, receivers: s.receivers });
            }
        };
        let (addr, running, offset) = (&self.addr, self.running, self.offset);
        let lost = |e| lost(addr, running, offset, e);
        b.send(&stop).map_err(lost)?;
        // Still the run's until its report is in: a connection lost now loses the run.
        let report = loop {
            let m = match b.recv() {
                Ok(Some(m)) => m,
                Ok(None) => break Err(lost(BindingError::Transport(TransportError::Closed))),
                Err(e) => break Err(lost(e)),
            };
            match Message::parse(m.payload()) {
                Ok(Message::Dropped(d)) => self.dropped.push(d),
                Ok(Message::Stopped(s)) => {
                    break Ok(StopReport { total: s.total, receivers: s.receivers });
                }
                Ok(other) => break Err(DistribError::Malformed(format!("unexpected {other:?}"))),
                Err(e) => break Err(e),
            }
        };
        self.running = false;
        report
    }

    /// See [`lost`].
    fn lost(&self, e: BindingError) -> DistribError {
        lost(&self.addr, self.running, self.offset, e)
    }

    /// Leave (a run in progress is aborted: its receivers get `on_error`).
    pub fn close(self) {
        match self.link {
            Link::Remote(b) => b.close(),
            Link::Local(fw) => drop(fw),
        }
    }
}

/// What a failed call on the connection to the distributer at `addr` means to the user: the
/// distributer's own word (an ERROR it sent) as it is; the connection gone, the run lost
/// (when `running`, `offset` bytes in), said so.
fn lost(addr: &str, running: bool, offset: u64, e: BindingError) -> DistribError {
    match e {
        BindingError::Remote { message, .. } => DistribError::Remote(message),
        e @ BindingError::Transport(_) => {
            let run = if running {
                format!(
                    " after {offset} bytes of the run were written to it (some perhaps never \
                     read): the run is lost for every receiver; \
                     connect again and send it again"
                )
            } else {
                String::new()
            };
            DistribError::Remote(format!(
                "the distributer at {addr} closed the connection{run} ({e})"
            ))
        }
        e => DistribError::from_binding(e),
    }
}
