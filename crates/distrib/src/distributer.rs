//! The distributer: takes each flow from its one sender and forwards every message to every
//! receiver of the flow, in parallel.
//!
//! Threads: one accepting connections; one per sender connection (the forwarder: it reads
//! the sender's messages, queues each one for every receiver in the run, answers `STOP`; a
//! sender in this process, [`Distributer::sender`], does the same on its own thread, through
//! the same [`crate::run::Forwarder`]);
//! one per receiver connection (the writer: it drains that receiver's queue onto its
//! binding, and after `STOP` reads the receiver's `CONFIRM`). A `DATA` message is received
//! once into a pooled buffer and the same buffer (an `Arc`) goes into every queue; each writer
//! sends it from there (no per-receiver copy).
//!
//! Who is in a run: the receivers joined when `START` arrives. One that joins later waits for
//! the next `START`. One that falls behind is handled by the flow's [`Policy`]; one whose
//! connection fails is dropped. Every dropped receiver is reported to the sender (`DROPPED`)
//! and in the `STOPPED` answer, with the bytes it was sent and why.
//!
//! On a `udp` flow each receiver's writer sends `DATA` as datagrams from a UDP socket of its
//! own ([`crate::udp`]), then `SENT` (how many) before `STOP`; the receiver's `CONFIRM` says
//! what it got and what it lost, and a receiver that lost anything is reported with that.

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use bs_binding::{Binding, BindingError, Floor, Limits, Profile, Role, Session};
use bs_transport::{Conn, TlsServer, Unproven};
use bs_wire::ErrorCode;
use serde::Serialize;
use subtle::ConstantTimeEq;

use crate::config::{Config, FlowSpec, MAX_CHUNK, Policy, Transport};
use crate::error::DistribError;
use crate::msg::{self, Message};
use crate::run::{Forwarder, Wire};

/// Messages a receiver's queue holds under `hold` and `timeout` before the sender waits.
pub(crate) const QUEUE_DEPTH: usize = 16;
/// After `STOP`, how long a receiver may go without progress (under `hold` and `buffer`)
/// before it is reported instead of waited for.
pub const STOP_PATIENCE: Duration = Duration::from_secs(30);
/// How long a new connection has to say `JOIN`.
const JOIN_WAIT: Duration = Duration::from_secs(10);
/// Most connections at once that have not said `JOIN` yet (each holds a thread): peers that
/// connect and say nothing, or trickle, hold no more; further ones are closed at once.
pub const MAX_JOINING: usize = 64;
/// Largest first message: a `JOIN` is a few hundred bytes (a body this size or larger is
/// refused before it is read, not buffered for a peer that has proven nothing).
const JOIN_MAX: u64 = 64 << 10;
/// A peer whose host stops answering is given up after this long.
const DEAD_PEER: Duration = Duration::from_secs(30);

/// The profile of every distributer binding: no layers, messages up to the largest chunk.
pub fn profile() -> Profile {
    Profile { max_message: (MAX_CHUNK + 64 * 1024) as u32, ..Profile::default() }
}

/// A binding on `conn` as every distributer connection runs it.
pub fn binding(conn: Conn, role: Role, id: u64) -> Binding {
    let session = Session::new(role, profile(), Limits::default(), Floor::default());
    Binding::new(conn, session, id)
}

/// A running distributer.
pub struct Distributer {
    addr: SocketAddr,
    inner: Arc<Inner>,
    accept: Option<thread::JoinHandle<()>>,
}

struct Inner {
    cfg: Config,
    flows: Mutex<HashMap<String, Arc<Flow>>>,
    next_id: AtomicU64,
    closing: AtomicBool,
    /// Connections that have not said JOIN yet (each a thread): at most [`MAX_JOINING`].
    joining: Arc<std::sync::atomic::AtomicUsize>,
    /// Every open connection, to end them all when the distributer stops.
    conns: Mutex<HashMap<u64, TcpStream>>,
    /// Serve every connection in TLS with this identity.
    tls: Option<TlsServer>,
}

pub(crate) struct Flow {
    pub(crate) stream: String,
    pub(crate) spec: FlowSpec,
    pub(crate) state: Mutex<FlowState>,
    /// Set when the distributer stops: a sender in its process is refused from then on.
    pub(crate) closed: AtomicBool,
}

#[derive(Default)]
pub(crate) struct FlowState {
    pub(crate) sender: bool,
    pub(crate) running: bool,
    pub(crate) receivers: Vec<Arc<Rcv>>,
    /// The receivers that left or were dropped, as status last saw them (the most recent
    /// [`DEPARTED_KEPT`], one per name): so status still says why after they are gone.
    departed: VecDeque<ReceiverStatus>,
}

/// Receivers that have left a flow that its status keeps showing.
const DEPARTED_KEPT: usize = 32;

/// One receiver connection, as the forwarder and its writer share it.
pub(crate) struct Rcv {
    pub(crate) name: String,
    pub(crate) q: Mutex<RcvQ>,
    pub(crate) cv: Condvar,
    /// A second handle on its socket, to unblock the writer when the receiver is dropped.
    kill: Option<TcpStream>,
    /// Set once its writer has ended (its connection closed or handed back).
    ended: Arc<AtomicBool>,
}

pub(crate) struct RcvQ {
    pub(crate) items: VecDeque<Item>,
    /// Payload bytes in `items`: waiting, not yet taken by the writer.
    pub(crate) queued_bytes: u64,
    /// What `items` and the message being written hold for it: each message's bytes and
    /// [`ITEM_COST`] (the `buffer` policy's bound is on this, so a flood of tiny messages is
    /// bounded as large ones are).
    pub(crate) held: u64,
    /// Payload bytes of the current run written to the receiver.
    pub(crate) sent: u64,
    pub(crate) run_started: Instant,
    pub(crate) last_progress: Instant,
    /// Why this receiver is out (connection failed, or dropped by the policy).
    pub(crate) gone: Option<String>,
    /// Its answer to `STOP`.
    pub(crate) confirm: Option<Confirmed>,
    /// Datagrams it lost, over every run (udp flows).
    pub(crate) lost: u64,
    /// Told the sender it is gone.
    pub(crate) reported: bool,
    /// This run's STOP is written to it: from then on it only has to confirm (a commit may
    /// take a while), not to keep up.
    pub(crate) stopped: bool,
}

/// A receiver's `CONFIRM`.
pub(crate) struct Confirmed {
    ok: bool,
    reason: String,
    /// udp flows: the bytes that reached it, and the datagrams that did not.
    got: Option<u64>,
    lost: u64,
}

impl RcvQ {
    /// How the run ended for this receiver, once it has: its confirmation (a receiver that
    /// confirmed and then left delivered its run), else why it is out; `None` while neither.
    pub(crate) fn outcome(&self, name: &str, total: u64) -> Option<msg::Outcome> {
        let (ok, reason, delivered, lost) = match (&self.confirm, &self.gone) {
            (Some(c), _) => {
                let delivered = c.got.unwrap_or(self.sent).min(self.sent);
                let ok = c.ok && delivered == total;
                (ok, if ok { String::new() } else { c.reason.clone() }, delivered, c.lost)
            }
            (None, Some(reason)) => (false, reason.clone(), self.sent, 0),
            (None, None) => return None,
        };
        Some(msg::Outcome { name: name.to_string(), delivered, ok, reason, lost })
    }
}

pub(crate) enum Item {
    /// A message from the sender, forwarded as it is (`len`: its payload bytes, for `DATA`).
    Forward {
        m: Arc<Wire>,
        len: u64,
        stop: bool,
    },
    Abort(String),
}

/// What a queued message costs a receiver's queue besides its bytes (the queue's slot, the
/// shared buffer's count and allocation), as the `buffer` policy counts it.
const ITEM_COST: u64 = 64;

impl Item {
    /// Its payload bytes (`DATA`'s; none for the rest).
    pub(crate) fn len(&self) -> u64 {
        match self {
            Item::Forward { len, .. } => *len,
            Item::Abort(_) => 0,
        }
    }

    /// Its weight against the `buffer` policy's bound.
    pub(crate) fn cost(&self) -> u64 {
        match self {
            Item::Forward { m, .. } => m.wire_len() as u64 + ITEM_COST,
            Item::Abort(r) => r.len() as u64 + ITEM_COST,
        }
    }
}

impl RcvQ {
    fn new() -> Self {
        Self {
            items: VecDeque::new(),
            queued_bytes: 0,
            held: 0,
            sent: 0,
            run_started: Instant::now(),
            last_progress: Instant::now(),
            gone: None,
            confirm: None,
            lost: 0,
            reported: false,
            stopped: false,
        }
    }

    /// The next message for the writer. It waits no more from here (out of `queued_bytes`,
    /// so a message the sender sends once the receiver has this one is not "behind" it),
    /// but is held until written.
    fn take(&mut self) -> Option<Item> {
        let item = self.items.pop_front()?;
        self.queued_bytes -= item.len();
        Some(item)
    }
}

/// A flow's state, for status.
#[derive(Debug, Clone, Serialize)]
pub struct FlowStatus {
    pub stream: String,
    pub flow: String,
    pub policy: String,
    /// How receivers get the flow: "tcp" or "udp".
    pub transport: String,
    pub sender: bool,
    pub running: bool,
    pub receivers: Vec<ReceiverStatus>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReceiverStatus {
    pub name: String,
    /// Whether its connection is open; a receiver that left stays listed (the most recent
    /// 32 of a flow) with why in `last_error`.
    pub connected: bool,
    /// Bytes of the current (or last) run written to it, and its rate over that run in bytes
    /// a second (while a run goes on, over the time since it started: a receiver that stalls
    /// is seen slowing down).
    pub delivered: u64,
    pub rate_bytes_per_second: f64,
    pub queued_messages: usize,
    pub queued_bytes: u64,
    pub last_error: Option<String>,
    /// Datagrams it reported lost, over every run (udp flows; 0 on tcp).
    pub lost: u64,
}

impl Distributer {
    /// Listen on `addr` and serve the streams of `cfg` (in plain TCP).
    pub fn start(cfg: Config, addr: SocketAddr) -> Result<Self, DistribError> {
        Self::start_with_tls(cfg, addr, None)
    }

    /// Listen on `addr` and serve the streams of `cfg`, every connection in TLS when `tls` is
    /// given (senders and receivers then connect with a [`crate::Target`] that trusts it).
    pub fn start_with_tls(
        cfg: Config,
        addr: SocketAddr,
        tls: Option<TlsServer>,
    ) -> Result<Self, DistribError> {
        if tls.is_some()
            && let Some((s, f)) = cfg.streams.iter().find_map(|s| {
                s.flows.iter().find(|f| f.transport != Transport::Tcp).map(|f| (s, f))
            })
        {
            return Err(DistribError::Order(format!(
                "flow {}/{} is udp, and its datagrams would travel unencrypted: serve it \
                 without TLS or make it tcp",
                s.name, f.name
            )));
        }
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let mut flows = HashMap::new();
        for s in &cfg.streams {
            for f in &s.flows {
                let flow = Flow {
                    stream: s.name.clone(),
                    spec: f.clone(),
                    state: Mutex::default(),
                    closed: AtomicBool::new(false),
                };
                flows.insert(key(&s.name, &f.name), Arc::new(flow));
            }
        }
        let inner = Arc::new(Inner {
            cfg,
            flows: Mutex::new(flows),
            next_id: AtomicU64::new(1),
            joining: Arc::default(),
            closing: AtomicBool::new(false),
            conns: Mutex::default(),
            tls,
        });
        let i = inner.clone();
        let accept = thread::Builder::new()
            .name("distributer-accept".into())
            .spawn(move || accept_loop(&i, listener))?;
        Ok(Self { addr, inner, accept: Some(accept) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Become the sender of `stream`/`flow` from this process: its bytes go into the
    /// receivers' queues as they are sent, shared, without crossing a connection to the
    /// distributer first (receivers still join over the network). Refused when the flow has
    /// a sender already; no token is asked (this process runs the distributer).
    pub fn sender(&self, stream: &str, flow: &str) -> Result<crate::Sender, DistribError> {
        let f = self.inner.flow(stream, flow)?;
        Ok(crate::Sender::local(Forwarder::claim(f)?, self.addr))
    }

    /// Stop (as dropping it does) once what is queued for the receivers has been written to
    /// them — an `ABORT` of a run its sender in this process left, so they hear why — or
    /// `grace` has passed.
    pub fn stop(self, grace: Duration) {
        let until = Instant::now() + grace;
        let flows: Vec<Arc<Flow>> = self.inner.flows.lock().unwrap().values().cloned().collect();
        let pending = || {
            flows.iter().any(|f| {
                let st = f.state.lock().unwrap_or_else(|p| p.into_inner());
                st.receivers.iter().any(|r| {
                    let q = r.q.lock().unwrap_or_else(|p| p.into_inner());
                    q.gone.is_none() && q.held > 0
                })
            })
        };
        while pending() && Instant::now() < until {
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Wait until `stream`/`flow` has at least `n` receivers connected, for at most `within`;
    /// how many it has when the wait ends.
    pub fn wait_for_receivers(
        &self,
        stream: &str,
        flow: &str,
        n: usize,
        within: Duration,
    ) -> Result<usize, DistribError> {
        let f = self.inner.flow(stream, flow)?;
        let until = Instant::now() + within;
        loop {
            let joined = (f.state.lock().unwrap().receivers.iter()).filter(|r| !r.closed()).count();
            if joined >= n || Instant::now() >= until {
                return Ok(joined);
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Every flow with its sender and receivers (the paper's receiver table).
    pub fn status(&self) -> Vec<FlowStatus> {
        status(&self.inner)
    }

    /// The status, callable from elsewhere (e.g. the network status service) while this
    /// distributer runs.
    pub fn status_source(&self) -> crate::service::StatusSource {
        let inner = self.inner.clone();
        std::sync::Arc::new(move || status(&inner))
    }
}

impl Drop for Distributer {
    /// Stop as a process exit would: no new connections, and every open one ends (senders
    /// and receivers get an error and may connect again to a new distributer).
    fn drop(&mut self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        for f in self.inner.flows.lock().unwrap_or_else(|p| p.into_inner()).values() {
            f.closed.store(true, Ordering::SeqCst);
        }
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for s in self.inner.conns.lock().unwrap().values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Inner {
    /// A flow of the configuration, or why there is none.
    fn flow(&self, stream: &str, flow: &str) -> Result<Arc<Flow>, DistribError> {
        self.cfg.flow(stream, flow)?;
        let f = self.flows.lock().unwrap().get(&key(stream, flow)).cloned();
        // (Every flow of the configuration has one: made with the distributer.)
        Ok(f.expect("a configured flow"))
    }
}

/// What a sender or receiver of this flow is told when it joins (the datagram fields, of a
/// receiver's udp socket, left at 0).
pub(crate) fn welcome(spec: &FlowSpec) -> msg::Welcome {
    msg::Welcome {
        policy: spec.policy.name().into(),
        chunk: spec.chunk,
        pace: spec.pace.unwrap_or(0),
        socket_buffer: spec.socket_buffer.unwrap_or(0),
        transport: spec.transport.name().into(),
        datagram: 0,
        udp_port: 0,
    }
}

pub(crate) fn key(stream: &str, flow: &str) -> String {
    format!("{stream}/{flow}")
}

fn status(inner: &Inner) -> Vec<FlowStatus> {
    let flows = inner.flows.lock().unwrap();
    let mut out: Vec<FlowStatus> = flows
        .values()
        .map(|f| {
            let st = f.state.lock().unwrap();
            FlowStatus {
                stream: f.stream.clone(),
                flow: f.spec.name.clone(),
                policy: f.spec.policy.to_string(),
                transport: f.spec.transport.name().into(),
                sender: st.sender,
                running: st.running,
                receivers: {
                    let mut all: Vec<_> = st.receivers.iter().map(|r| r.status(true)).collect();
                    // A name that joined again shows once, as it is now.
                    let gone: Vec<_> = (st.departed.iter())
                        .filter(|d| all.iter().all(|l| l.name != d.name))
                        .cloned()
                        .collect();
                    all.extend(gone);
                    all
                },
            }
        })
        .collect();
    out.sort_by(|a, b| (&a.stream, &a.flow).cmp(&(&b.stream, &b.flow)));
    out
}

fn accept_loop(inner: &Arc<Inner>, listener: TcpListener) {
    for conn in listener.incoming() {
        if inner.closing.load(Ordering::SeqCst) {
            return;
        }
        let Ok(tcp) = conn else { continue };
        // Counted until it has joined (or gone).
        let Some(joining) = Unproven::take(&inner.joining, MAX_JOINING) else {
            tracing::warn!(
                "distributer: {MAX_JOINING} connections have not joined yet; closing a new one"
            );
            continue;
        };
        let inner = inner.clone();
        let spawned = thread::Builder::new()
            .name("distributer-conn".into())
            .stack_size(512 * 1024)
            .spawn(move || serve(&inner, tcp, joining));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a connection thread");
        }
    }
}

/// Tell the peer why (an `ERROR` frame) and close.
fn refuse(b: Binding, code: ErrorCode, reason: String) {
    tracing::info!(%reason, "distributer connection refused");
    b.end_with(code, reason);
}

fn serve(inner: &Arc<Inner>, tcp: TcpStream, joining: Unproven) {
    let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
    if let Ok(s) = tcp.try_clone() {
        inner.conns.lock().unwrap().insert(id, s);
    }
    // Out of the table however the connection ends — a panic too, or its second handle would
    // keep it open and its peer waiting for ever.
    struct Forget<'a>(&'a Inner, u64);
    impl Drop for Forget<'_> {
        fn drop(&mut self) {
            let mut conns = self.0.conns.lock().unwrap_or_else(|p| p.into_inner());
            conns.remove(&self.1);
        }
    }
    let _forget = Forget(inner, id);
    serve_conn(inner, tcp, id, joining);
}

fn serve_conn(inner: &Arc<Inner>, tcp: TcpStream, id: u64, joining: Unproven) {
    let _ = tcp.set_nodelay(true);
    let kill = tcp.try_clone().ok();
    let mut conn = match &inner.tls {
        None => Conn::new(tcp),
        Some(t) => match Conn::tls_server(tcp, t) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "distributer: TLS refused a connection");
                return;
            }
        },
    };
    // Until the JOIN, every read is bounded (a peer that says nothing, or half a frame, is
    // turned away); after it, a live peer may be idle as long as it likes.
    let _ = conn.set_read_timeout(Some(JOIN_WAIT));
    // A failed handshake (a plain client, an untrusting one) has told the peer with an
    // alert; the connection ends here rather than waiting out JOIN_WAIT to send a refusal.
    if let Err(e) = conn.handshake() {
        tracing::info!(error = %e, "distributer: TLS handshake failed");
        return;
    }
    // The first frame's size before its body is read.
    match bs_transport::first_message_at_most(&mut conn, JOIN_MAX) {
        Ok(Ok(())) => {}
        Ok(Err(why)) => {
            return refuse(binding(conn, Role::Responder, id), ErrorCode::BadFrame, why);
        }
        Err(e) => {
            let why = format!("expected JOIN: {e}");
            let code = BindingError::from(e).code();
            return refuse(binding(conn, Role::Responder, id), code, why);
        }
    }
    let mut b = binding(conn, Role::Responder, id);
    let first = match b.recv_within(JOIN_WAIT) {
        Ok(Some(m)) => Message::parse(m.payload()),
        Ok(None) => return refuse(b, ErrorCode::BadFrame, "no JOIN within 10 s".into()),
        Err(e) => return refuse(b, e.code(), format!("expected JOIN: {e}")),
    };
    let _ = b.conn().watch_for_dead_peer(DEAD_PEER);
    let (role, join) = match first {
        Ok(Message::Join(role, j)) => (role, j),
        Ok(other) => {
            return refuse(b, ErrorCode::BadFrame, format!("expected JOIN first, got {other:?}"));
        }
        Err(e) => return refuse(b, ErrorCode::BadFrame, e.to_string()),
    };
    // The token first: which streams and flows there are is told only to peers that may
    // join. Where any stream needs a token, an unknown stream is answered as a wrong token.
    let bad_token =
        |b| refuse(b, ErrorCode::BadToken, DistribError::BadToken(join.stream.clone()).to_string());
    let Some(stream) = inner.cfg.streams.iter().find(|s| s.name == join.stream) else {
        let guarded =
            (inner.cfg.streams.iter()).any(|s| s.token.is_some() || s.sender_token.is_some());
        if guarded {
            return bad_token(b);
        }
        let e = DistribError::UnknownStream(join.stream.clone());
        return refuse(b, ErrorCode::NotFound, e.to_string());
    };
    // A sender presents the stream's sender token when it has one (the receivers' token then
    // admits no sender), else the stream's token; a receiver the stream's token.
    let needed = match &stream.sender_token {
        Some(t) if role == msg::ROLE_SENDER => Some(t),
        _ => stream.token.as_ref(),
    };
    if let Some(t) = needed
        && !bool::from(t.as_bytes().ct_eq(join.token.as_bytes()))
    {
        return bad_token(b);
    }
    let flow = match inner.flow(&join.stream, &join.flow) {
        Ok(f) => f,
        Err(e) => return refuse(b, ErrorCode::NotFound, e.to_string()),
    };
    // Joined: no longer among the connections that have proven nothing.
    drop(joining);
    // A receiver of a udp flow gets its datagrams from a socket of its own, on the address
    // its connection came to.
    let udp = match flow.spec.transport {
        Transport::Udp { datagram } if role == msg::ROLE_RECEIVER => {
            match datagram_socket(&kill, flow.spec.socket_buffer) {
                Ok(u) => Some((u, datagram as usize)),
                Err(e) => {
                    let why = format!("cannot open a udp socket: {e}");
                    return refuse(b, ErrorCode::Internal, why);
                }
            }
        }
        _ => None,
    };
    let w = msg::Welcome {
        datagram: udp.as_ref().map_or(0, |u| u.1 as u64),
        udp_port: udp.as_ref().and_then(|u| u.0.local_addr().ok()).map_or(0, |a| a.port()),
        ..welcome(&flow.spec)
    };
    // The flow's socket buffer on this end: sending towards a receiver, receiving from the
    // sender (best effort: the kernel caps it).
    if let (Some(n), Some(tcp)) = (flow.spec.socket_buffer, &kill) {
        let _ = crate::flow_buffers(role == msg::ROLE_SENDER, false, n).apply_buffers_to(tcp);
    }
    if role == msg::ROLE_SENDER {
        let fw = match Forwarder::claim(flow) {
            Ok(fw) => fw,
            Err(e) => return refuse(b, ErrorCode::Busy, e.to_string()),
        };
        // (A sender gone before its WELCOME gives the flow's sender place back with `fw`.)
        if b.send(&msg::welcome(&w)).is_ok() {
            forward(fw, b);
        }
        return;
    }
    // Into the flow under a name no other receiver has: a tcp receiver before its WELCOME (it
    // is in every run that starts from then on), a udp one once its PORT says where its
    // datagrams go (a run never waits for a receiver still joining).
    let fk = key(&flow.stream, &flow.spec.name);
    // The name is free, or its receiver's connection has closed (a receiver started again
    // at once: its writer, idle, may not have noticed yet): that one is taken out, and
    // returned to be marked gone once the flow is unlocked.
    let free = |st: &mut FlowState| -> Result<Option<Arc<Rcv>>, DistribError> {
        if join.name.is_empty() {
            return Err(DistribError::Order("a receiver must have a name".into()));
        }
        match st.receivers.iter().position(|o| o.name == join.name) {
            None => Ok(None),
            Some(i) if st.receivers[i].closed() => Ok(Some(st.receivers.remove(i))),
            Some(_) => Err(DistribError::NameTaken { flow: fk.clone(), name: join.name.clone() }),
        }
    };
    let left = |old: Option<Arc<Rcv>>| {
        if let Some(old) = old {
            old.gone("it left (closed its connection)".into());
        }
    };
    let register = |r: &Arc<Rcv>| -> Result<(), DistribError> {
        // Over TLS a receiver's close comes as bytes (its close_notify), not as an end its
        // socket shows: its writer, idle, reads them within half a second and takes it out.
        // So while the name's holder has bytes unread, the name is waited for that long.
        let until = Instant::now() + NAME_WAIT;
        let old = loop {
            let mut st = flow.state.lock().unwrap();
            match free(&mut st) {
                Ok(old) => {
                    st.receivers.push(r.clone());
                    break old;
                }
                Err(e @ DistribError::NameTaken { .. }) => {
                    let unread = st.receivers.iter().any(|o| o.name == join.name && o.unread());
                    drop(st);
                    if !unread || Instant::now() >= until {
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        };
        left(old);
        Ok(())
    };
    let rcv = Arc::new(Rcv {
        name: join.name.clone(),
        q: Mutex::new(RcvQ::new()),
        cv: Condvar::new(),
        kill,
        ended: Arc::default(),
    });
    let first = match udp {
        None => register(&rcv),
        Some(_) => {
            let old = free(&mut flow.state.lock().unwrap());
            old.map(left)
        }
    };
    if let Err(e) = first {
        return refuse(b, ErrorCode::Busy, e.to_string());
    }
    let joined = b.send(&msg::welcome(&w)).map_err(|e| e.to_string()).and_then(|()| match udp {
        Some((sock, size)) => {
            let peer = rcv.kill.as_ref().and_then(|t| t.peer_addr().ok());
            receiver_port(&mut b, peer).and_then(|to| {
                sock.connect(to).map_err(|e| format!("udp to {to}: {e}"))?;
                Ok(Some((sock, size)))
            })
        }
        None => Ok(None),
    });
    match joined {
        Ok(Some(udp)) => match register(&rcv) {
            Ok(()) => write_loop(&flow, &rcv, b, Some(udp)),
            Err(e) => refuse(b, ErrorCode::Busy, e.to_string()),
        },
        Ok(None) => write_loop(&flow, &rcv, b, None),
        Err(why) => {
            let why = format!("it failed to join: {why}");
            refuse(b, ErrorCode::BadFrame, why.clone());
            rcv.gone(why);
        }
    }
    rcv.ended.store(true, Ordering::Release);
    let last = rcv.status(false);
    let mut st = flow.state.lock().unwrap();
    let was_in = st.receivers.len();
    st.receivers.retain(|r| !Arc::ptr_eq(r, &rcv));
    if st.receivers.len() < was_in {
        st.departed.retain(|d| d.name != last.name);
        if st.departed.len() == DEPARTED_KEPT {
            st.departed.pop_front();
        }
        st.departed.push_back(last);
    }
}

impl Rcv {
    /// Its line in the flow's status.
    fn status(&self, connected: bool) -> ReceiverStatus {
        let q = self.q.lock().unwrap();
        // The run goes on until it is confirmed or the receiver is out.
        let until = if q.confirm.is_none() && q.gone.is_none() && q.sent > 0 {
            Instant::now()
        } else {
            q.last_progress
        };
        let secs = (until - q.run_started).as_secs_f64();
        ReceiverStatus {
            name: self.name.clone(),
            connected,
            // What it confirmed having (udp: what arrived), else what was written to it so
            // far.
            delivered: q.confirm.as_ref().and_then(|c| c.got).map_or(q.sent, |got| got.min(q.sent)),
            rate_bytes_per_second: if secs > 0.0 { q.sent as f64 / secs } else { 0.0 },
            queued_messages: if connected { q.items.len() } else { 0 },
            queued_bytes: if connected { q.queued_bytes } else { 0 },
            // Out of the flow, else its last run refused at its end (a file already there, a
            // store that failed, datagrams lost), else gone.
            last_error: q
                .gone
                .clone()
                .or_else(|| {
                    let failed = q.confirm.as_ref().filter(|c| !c.ok);
                    failed.map(|c| format!("its last run failed: {}", c.reason))
                })
                .or_else(|| (!connected).then(|| "it left (closed its connection)".to_string())),
            lost: q.lost,
        }
    }

    /// Whether its peer has closed the connection (end of stream, or an error, seen without
    /// waiting or taking anything from it).
    fn closed(&self) -> bool {
        self.peek() == Some(0)
    }

    /// Whether bytes from its peer wait unread (over TLS, its close_notify when it left).
    fn unread(&self) -> bool {
        self.peek().is_some_and(|n| n > 0)
    }

    /// What its socket holds, without waiting or taking anything: `Some(0)` at its end (or an
    /// error), `Some(1)` with a byte waiting, `None` with nothing yet.
    fn peek(&self) -> Option<isize> {
        use std::os::fd::AsRawFd;
        let s = self.kill.as_ref()?;
        let mut byte = 0u8;
        // SAFETY: a one-byte buffer valid for the call; MSG_PEEK leaves the byte for the writer.
        let n = unsafe {
            libc::recv(
                s.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            n if n >= 0 => Some(n),
            _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock => None,
            _ => Some(0),
        }
    }

    /// Take it out of the run with `reason` (first reason wins) and unblock its writer.
    fn gone(&self, reason: String) {
        let mut q = self.q.lock().unwrap();
        self.gone_locked(&mut q, reason);
    }

    fn gone_locked(&self, q: &mut MutexGuard<'_, RcvQ>, reason: String) {
        self.out_locked(q, reason);
        if let Some(s) = &self.kill {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Out of the run for what the flow's policy says: its writer tells it why once the message
    /// it is writing is written (a slow receiver reads that message, then the reason). Until
    /// the writer ends, its socket is watched: one that sends nothing out for [`DROP_GRACE`]
    /// (a receiver stopped, its socket full), or still has not taken it all after
    /// [`DROP_MOST`], is shut, which unblocks the writer.
    pub(crate) fn dropped_locked(&self, q: &mut MutexGuard<'_, RcvQ>, reason: String) {
        self.out_locked(q, reason);
        let Some(s) = self.kill.as_ref().and_then(|s| s.try_clone().ok()) else { return };
        let ended = self.ended.clone();
        let shut = |s: &TcpStream| {
            let _ = s.shutdown(std::net::Shutdown::Both);
        };
        let watch = move || {
            let (began, mut moved) = (Instant::now(), Instant::now());
            let mut last = unsent(&s);
            while !ended.load(Ordering::Acquire) {
                if moved.elapsed() >= DROP_GRACE || began.elapsed() >= DROP_MOST {
                    return shut(&s);
                }
                std::thread::sleep(Duration::from_millis(100));
                let now = unsent(&s);
                if now.is_none() {
                    return; // (the socket is gone already)
                }
                if now < last {
                    moved = Instant::now();
                }
                last = now;
            }
        };
        if let Err(e) = std::thread::Builder::new().name("dropped".into()).spawn(watch) {
            tracing::warn!(
                "no thread to watch a dropped receiver ({e}): its connection is shut now"
            );
            if let Some(s) = &self.kill {
                shut(s);
            }
        }
    }

    /// Out of the run (its queue emptied, no run waits on it), its connection left as it is.
    fn out_locked(&self, q: &mut MutexGuard<'_, RcvQ>, reason: String) {
        if q.gone.is_none() {
            tracing::info!(receiver = %self.name, %reason, "receiver dropped");
            q.gone = Some(reason);
        }
        q.items.clear();
        q.queued_bytes = 0;
        q.held = 0;
        self.cv.notify_all();
    }
}

/// A UDP socket on the local address of `tcp` (a receiver's connection) to send its
/// datagrams from, with the flow's socket buffer.
fn datagram_socket(tcp: &Option<TcpStream>, buffer: Option<u64>) -> std::io::Result<UdpSocket> {
    let local = match tcp {
        Some(t) => t.local_addr()?,
        None => return Err(std::io::Error::other("no address to send from")),
    };
    let sock = UdpSocket::bind(SocketAddr::new(local.ip(), 0))?;
    // A send that cannot go for this long (a link far slower than the flow) loses its
    // datagram, as a full router queue would, rather than stall the writer.
    sock.set_write_timeout(Some(Duration::from_secs(1)))?;
    if let Some(n) = buffer {
        let _ = socket2::SockRef::from(&sock).set_send_buffer_size(n as usize);
    }
    Ok(sock)
}

/// A udp receiver's `PORT` answer to its `WELCOME`: where its datagrams go.
fn receiver_port(b: &mut Binding, peer: Option<SocketAddr>) -> Result<SocketAddr, String> {
    let peer = peer.ok_or("no peer address")?;
    match b.recv_within(JOIN_WAIT) {
        Ok(Some(m)) => match Message::parse(m.payload()) {
            Ok(Message::Port(p)) if p != 0 => Ok(SocketAddr::new(peer.ip(), p)),
            Ok(other) => Err(format!("expected PORT, got {other:?}")),
            Err(e) => Err(e.to_string()),
        },
        Ok(None) => Err("no PORT within 10 s".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Most messages a receiver's writer keeps unread from it: a receiver sends a few after each
/// STOP (LOST, PORT, CONFIRM), and nothing else.
const IDLE_MESSAGES: usize = 16;

/// How long a joining receiver waits for its name while the receiver holding it has bytes
/// unread (over TLS, the close of a receiver started again: see `register`), a little more
/// than an idle writer takes to notice.
const NAME_WAIT: Duration = Duration::from_millis(1500);

/// How long a receiver dropped for what it sent is read past before its connection closes.
const LINGER: Duration = Duration::from_secs(2);

/// How long the connection of a receiver dropped by the flow's policy may send nothing out
/// while its writer still has the message being written and the reason to write, and how long
/// it may take in all, before it is shut.
const DROP_GRACE: Duration = Duration::from_secs(5);
const DROP_MOST: Duration = Duration::from_secs(60);

/// Bytes written to `s` that its peer has not yet taken (`SIOCOUTQ`); `None` if the socket
/// cannot say (closed).
fn unsent(s: &TcpStream) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int through the pointer, which is valid.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    (r == 0).then_some(n)
}

/// The receiver's writer: its queue onto its binding (and its datagram socket, on a udp
/// flow: the socket and the largest datagram payload), until the connection ends.
fn write_loop(flow: &Flow, r: &Rcv, mut b: Binding, udp: Option<(UdpSocket, usize)>) {
    // Datagrams sent to this receiver so far.
    let mut seq = 0u64;
    let patience = match flow.spec.policy {
        Policy::Timeout(t) => t,
        _ => STOP_PATIENCE,
    };
    loop {
        let item = {
            let mut q = r.q.lock().unwrap();
            loop {
                if let Some(reason) = &q.gone {
                    let reason = reason.clone();
                    drop(q);
                    return refuse(b, ErrorCode::Busy, format!("dropped: {reason}"));
                }
                if let Some(i) = q.take() {
                    break i;
                }
                // Idle: notice a receiver that closes its end meanwhile.
                let (g, _) = r.cv.wait_timeout(q, Duration::from_millis(500)).unwrap();
                q = g;
                if q.items.is_empty() && q.gone.is_none() {
                    drop(q);
                    // What a receiver sends (LOST, PORT, CONFIRM) is a few messages after a
                    // STOP; one that sends more is not kept on reading.
                    match b.poll_up_to(IDLE_MESSAGES) {
                        Ok(true) if b.waiting() >= IDLE_MESSAGES => {
                            let why = format!(
                                "it sent {IDLE_MESSAGES} messages unasked (a receiver answers a \
                                 STOP, and sends nothing else)"
                            );
                            // Out of the run at once (a run starting now must not wait on
                            // it); told, and what it still sends read past for a moment, so
                            // the telling is not reset away; then its socket is shut.
                            r.out_locked(&mut r.q.lock().unwrap(), why.clone());
                            let told = format!("dropped: {why}");
                            b.end_lingering(ErrorCode::BadFrame, told, LINGER, 4 << 20);
                            return r.gone(why);
                        }
                        Ok(true) => {}
                        Ok(false) => return r.gone("it left (closed its connection)".into()),
                        Err(e) => return r.gone(format!("its connection failed: {e}")),
                    }
                    q = r.q.lock().unwrap();
                }
            }
        };
        let res = match &item {
            Item::Forward { m, len, stop } => match (&udp, m.data()) {
                (Some((sock, size)), Some((at, data))) => {
                    crate::udp::send(sock, &mut seq, at, data, *size).map_err(|e| {
                        BindingError::Transport(bs_transport::TransportError::from_io(e))
                    })
                }
                // The count of datagrams sent goes before STOP (what the run should have had)
                // and before START (what earlier runs had: their stragglers are dropped).
                (Some(_), _) if *stop || m.kind() == Some(msg::START) => {
                    b.send(&msg::sent(seq)).and_then(|()| m.send(&mut b))
                }
                _ => m.send(&mut b),
            }
            .map(|()| {
                let mut q = r.q.lock().unwrap();
                // (A receiver dropped while this was written has its queue counted out.)
                if q.gone.is_none() {
                    q.held -= item.cost();
                }
                // Counted from the START written: an aborted run's DATA still queued before it
                // (written after the run was given up) is not the new run's.
                if m.kind() == Some(msg::START) {
                    q.sent = 0;
                }
                q.sent += len;
                q.stopped |= *stop;
                q.last_progress = Instant::now();
                r.cv.notify_all();
                *stop
            }),
            Item::Abort(reason) => b.send(&msg::abort(reason)).map(|()| false),
        };
        match res {
            Ok(false) => {}
            Ok(true) => {
                // After STOP: the receiver's CONFIRM (or its silence, within the patience),
                // after its LOST on a udp flow.
                let mut lost = 0;
                let answer = loop {
                    break match b.recv_within(patience.max(STOP_PATIENCE)) {
                        Ok(Some(m)) => match Message::parse(m.payload()) {
                            Ok(Message::Lost(n)) if udp.is_some() => {
                                lost = n;
                                continue;
                            }
                            Ok(Message::Confirm { total, ok, reason }) => Ok(Confirmed {
                                ok,
                                reason,
                                got: udp.is_some().then_some(total),
                                lost,
                            }),
                            Ok(other) => Err(format!("expected CONFIRM, got {other:?}")),
                            Err(e) => Err(e.to_string()),
                        },
                        Ok(None) => Err(format!(
                            "had every byte but did not confirm the stop within {} ms",
                            patience.max(STOP_PATIENCE).as_millis()
                        )),
                        Err(e) => Err(format!("its connection failed: {e}")),
                    };
                };
                match answer {
                    Ok(c) => {
                        let mut q = r.q.lock().unwrap();
                        q.lost += c.lost;
                        q.confirm = Some(c);
                        r.cv.notify_all();
                    }
                    Err(reason) => return r.gone(reason),
                }
            }
            Err(e) => {
                let reason = match r.q.lock().unwrap().gone.clone() {
                    Some(g) => g,
                    None => format!("its connection failed: {e}"),
                };
                return r.gone(reason);
            }
        }
    }
}

/// The forwarder: a sender's messages, from its connection, to every receiver in the run.
fn forward(mut fw: Forwarder, mut b: Binding) {
    let res = (|| -> Result<(), DistribError> {
        while let Some(m) = b.recv().map_err(DistribError::from_binding)? {
            match Message::parse(m.payload())? {
                Message::Start(_) => fw.start(Wire::Received(m))?,
                Message::Data { offset, len } => {
                    fw.data(offset, len as u64, Wire::Received(m))?;
                    tell_gone(&mut b, fw.newly_gone())?;
                }
                Message::Stop { total, .. } => {
                    let (gone, stopped) = fw.stop(total, Wire::Received(m))?;
                    tell_gone(&mut b, gone)?;
                    b.send(&msg::stopped(&stopped))?;
                }
                other => {
                    return Err(DistribError::Malformed(format!("a sender cannot send {other:?}")));
                }
            }
        }
        Ok(())
    })();
    fw.finish(&match &res {
        Ok(()) => "the sender left mid-flow".to_string(),
        Err(e) => format!("the sender failed mid-flow: {e}"),
    });
    if let Err(e) = res {
        let code = match &e {
            DistribError::Binding(be) => be.code(),
            DistribError::Order(_) => ErrorCode::BadFrame,
            _ => ErrorCode::BadMessage,
        };
        if !matches!(e, DistribError::Remote(_) | DistribError::Binding(BindingError::Transport(_)))
        {
            refuse(b, code, e.to_string());
        }
    }
}

/// Tell the sender about receivers that left the run (`DROPPED`).
fn tell_gone(b: &mut Binding, gone: Vec<msg::Outcome>) -> Result<(), DistribError> {
    for o in gone {
        b.send(&msg::dropped(&o))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bs_binding::Msg;

    fn flow(policy: Policy) -> Flow {
        let spec = FlowSpec {
            name: "f".into(),
            policy,
            chunk: 256 << 10,
            pace: None,
            socket_buffer: None,
            transport: Transport::Tcp,
        };
        Flow { stream: "s".into(), spec, state: Mutex::default(), closed: AtomicBool::new(false) }
    }

    fn rcv() -> Rcv {
        Rcv {
            name: "r".into(),
            q: Mutex::new(RcvQ::new()),
            cv: Condvar::new(),
            kill: None,
            ended: Arc::default(),
        }
    }

    /// Under a `buffer` bound of one chunk, the writer takes a chunk and sends it; the
    /// receiver has all of it (and the sender, keeping pace, sends the next) before the
    /// writer's bookkeeping of that send has run — a loaded machine's usual order. Only a
    /// chunk waiting behind another that waits is behind.
    #[test]
    fn the_message_being_written_is_not_waiting_against_the_buffer_bound() {
        let (f, r) = (flow(Policy::Buffer(256 << 10)), rcv());
        let pools = bs_wire::SizedPools::new(2);
        let chunk = || {
            let m = Wire::Received(Msg::copy_of(&pools, 0, &vec![7u8; (256 << 10) + 9]));
            Item::Forward { m: Arc::new(m), len: 256 << 10, stop: false }
        };
        crate::run::push(&f, &r, chunk());
        let writing = r.q.lock().unwrap().take().expect("queued");
        crate::run::push(&f, &r, chunk());
        {
            let q = r.q.lock().unwrap();
            assert_eq!(q.gone, None, "a receiver keeping up was dropped");
            assert_eq!((q.items.len(), q.queued_bytes), (1, 256 << 10));
            assert_eq!(q.held, 2 * writing.cost());
        }
        // A third while the second still waits: that receiver has fallen behind.
        crate::run::push(&f, &r, chunk());
        let q = r.q.lock().unwrap();
        let why = q.gone.as_deref().expect("dropped");
        assert!(why.contains("bytes behind (the bound is 262144)"), "{why}");
    }
}
