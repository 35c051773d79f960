//! The receiving side of a flow: runs arrive as `on_start`, `on_data`…, then `on_stop` once
//! the exact total and digest check out — or `on_error` with the reason. On a `udp` flow the
//! bytes come as datagrams ([`crate::udp`]) and losses are reported with `on_loss`.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use bs_binding::Binding;
use bs_binding::udp::SeqWindow;
use bs_wire::{DigestAlgo, Hasher};

use crate::error::DistribError;
use crate::msg::{self, Message, Params};
use crate::sender::join;
use crate::target::Target;
use crate::udp::{Piece, Reassembly};

/// After `STOP` on a udp flow, how long without a datagram before what is missing is lost.
const LINGER: Duration = Duration::from_millis(100);
/// The most a udp run waits after `STOP` for its last datagrams, however they trickle.
const LINGER_MAX: Duration = Duration::from_secs(10);
/// A udp receiver's socket buffer unless the flow sets one (the kernel caps it at
/// `net.core.rmem_max`).
const UDP_RECV_BUFFER: usize = 4 << 20;

/// What a receiver does with a flow.
pub trait FlowHandler {
    /// A run begins, with the sender's parameters.
    fn on_start(&mut self, _params: &Params) {}
    /// The next bytes of the run, at `offset`: the end of the previous ones, or on a udp
    /// flow the end of the last loss reported by [`FlowHandler::on_loss`].
    fn on_data(&mut self, offset: u64, data: &[u8]);
    /// udp flows: `len` bytes at `offset` were lost on the way (the run will end in
    /// `on_error`, naming the loss; the bytes after the gap still arrive, in order).
    fn on_loss(&mut self, _offset: u64, _len: u64) {}
    /// Every byte arrived and matches the sender's total and digest. An `Err` (e.g. the
    /// archive could not commit) is reported to the sender as this receiver's failure.
    fn on_stop(&mut self, _total: u64) -> Result<(), String> {
        Ok(())
    }
    /// The run ended without a verified stop (sender gone, this receiver dropped, bytes that
    /// do not check out). Nothing of it should be kept as complete.
    fn on_error(&mut self, reason: &str);
}

/// How a run ended, for the caller of [`Receiver::run_once`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Verified and confirmed: this many bytes.
    Stopped(u64),
    /// Ended early for this reason (`on_error` was called with it).
    Failed(String),
    /// The distributer closed the connection between runs.
    Closed,
}

/// One receiver of one flow.
pub struct Receiver {
    b: Binding,
    welcome: msg::Welcome,
    /// udp flows: the socket datagrams arrive on, and their accounting (over every run).
    udp: Option<(UdpSocket, SeqWindow)>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver").field("policy", &self.welcome.policy).finish()
    }
}

impl Receiver {
    /// Join `stream`/`flow` on the distributer at `target` (an address, or a [`Target`] with
    /// TLS) as `name` (reported to the sender).
    pub fn connect(
        target: impl Into<Target>,
        stream: &str,
        flow: &str,
        name: &str,
        token: Option<&str>,
    ) -> Result<Self, DistribError> {
        let j = msg::Join {
            stream: stream.into(),
            flow: flow.into(),
            name: name.into(),
            token: token.unwrap_or_default().into(),
        };
        let (mut b, welcome) = join(&target.into(), msg::ROLE_RECEIVER, &j)?;
        let udp = match welcome.transport.as_str() {
            "tcp" => None,
            "udp" => Some(open_datagrams(&mut b, &welcome)?),
            other => return Err(DistribError::Malformed(format!("unknown transport {other:?}"))),
        };
        Ok(Self { b, welcome, udp })
    }

    pub fn policy(&self) -> &str {
        &self.welcome.policy
    }

    /// How the flow reaches this receiver: "tcp" or "udp".
    pub fn transport(&self) -> &str {
        &self.welcome.transport
    }

    /// udp flows: datagrams lost since this receiver joined.
    pub fn lost_datagrams(&self) -> u64 {
        self.udp.as_ref().map_or(0, |(_, w)| w.lost)
    }

    /// Receive runs until the distributer closes the connection.
    pub fn run(mut self, h: &mut impl FlowHandler) -> Result<(), DistribError> {
        loop {
            if self.run_once(h, None)? == RunEnd::Closed {
                return Ok(());
            }
        }
    }

    /// Receive one run (waiting at most `wait` for it to start, if given).
    pub fn run_once(
        &mut self,
        h: &mut impl FlowHandler,
        wait: Option<Duration>,
    ) -> Result<RunEnd, DistribError> {
        loop {
            let first = match wait {
                Some(w) => self.b.recv_within(w),
                None => self.b.recv(),
            };
            let Some(first) = first.map_err(DistribError::from_binding)? else {
                return Ok(RunEnd::Closed);
            };
            match (Message::parse(first.payload())?, &mut self.udp) {
                (Message::Start(p), _) => {
                    h.on_start(&p);
                    break;
                }
                (Message::Abort(_), _) => return Ok(RunEnd::Closed),
                // Every datagram before the run's first is an earlier run's (an aborted run
                // leaves some on the way): from here on they are recognised and dropped.
                (Message::Sent(n), Some((_, window))) => window.finish(n),
                (other, _) => {
                    return Err(DistribError::Malformed(format!("expected START, got {other:?}")));
                }
            }
        }
        if self.udp.is_some() {
            return self.run_datagrams(h);
        }
        let mut got = 0u64;
        let mut hasher: Hasher = DigestAlgo::Xxh3_128.hasher();
        loop {
            let m = match self.b.recv() {
                Ok(Some(m)) => m,
                Ok(None) => return Ok(fail(h, "the distributer closed the connection mid-flow")),
                Err(e) => return Ok(fail(h, &mid_flow(e))),
            };
            match Message::parse(m.payload())? {
                Message::Data { offset, .. } if offset == got => {
                    let data = msg::data_payload(m.payload());
                    hasher.update(data);
                    h.on_data(offset, data);
                    got += data.len() as u64;
                }
                Message::Data { offset, .. } => {
                    let why = format!("DATA at offset {offset}, expected {got}");
                    let _ = self.b.send(&msg::confirm(got, false, &why));
                    return Ok(fail(h, &why));
                }
                Message::Stop { total, digest } => {
                    let ours = msg::digest_bytes(&hasher.finish());
                    let verdict = if total != got {
                        Err(format!("the stop announces {total} bytes, {got} arrived"))
                    } else if ours != digest {
                        Err("the bytes that arrived do not match the sender's digest".into())
                    } else {
                        Ok(())
                    };
                    return finish_run(&mut self.b, h, verdict, total, got, None);
                }
                Message::Abort(reason) => return Ok(fail(h, &reason)),
                other => {
                    return Err(DistribError::Malformed(format!("unexpected {other:?} in a run")));
                }
            }
        }
    }

    /// The rest of a run on a udp flow: datagrams reassembled in order, the control
    /// messages (`SENT`, `STOP`, `ABORT`) from the connection.
    fn run_datagrams(&mut self, h: &mut impl FlowHandler) -> Result<RunEnd, DistribError> {
        let Receiver { b, udp, .. } = self;
        let (sock, window) = udp.as_mut().expect("a udp receiver");
        let mut re = Reassembly::default();
        let lost_before = window.lost;
        let mut hasher: Hasher = DigestAlgo::Xxh3_128.hasher();
        let mut out = |p: Piece<'_>| match p {
            Piece::Data(offset, data) => {
                hasher.update(data);
                h.on_data(offset, data);
            }
            Piece::Lost(offset, len) => h.on_loss(offset, len),
        };
        let mut buf = vec![0u8; 1 << 16];
        let mut sent = 0u64;
        let mut stop: Option<(u64, [u8; 16], Instant)> = None;
        let mut last_datagram = Instant::now();
        loop {
            loop {
                match sock.recv(&mut buf) {
                    Ok(n) => {
                        re.on_datagram(window, &buf[..n], &mut out);
                        last_datagram = Instant::now();
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // An ICMP error about an earlier datagram of ours (the PORT's socket).
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                    Err(e) => {
                        return Ok(fail(h, &format!("the udp socket failed mid-flow: {e}")));
                    }
                }
            }
            if let Some((total, digest, at)) = stop {
                let quiet = last_datagram.max(at).elapsed() >= LINGER;
                if re.complete(total) || quiet || at.elapsed() >= LINGER_MAX {
                    re.finish(total, &mut out);
                    window.finish(sent);
                    let lost = window.lost - lost_before;
                    let got = re.next - re.lost_bytes;
                    let verdict = if re.lost_bytes > 0 || lost > 0 {
                        Err(format!(
                            "lost {} of {total} bytes on the udp flow ({lost} datagrams never \
                             arrived)",
                            re.lost_bytes
                        ))
                    } else if re.next != total {
                        Err(format!("the stop announces {total} bytes, {} arrived", re.next))
                    } else if msg::digest_bytes(&hasher.finish()) != digest {
                        Err("the bytes that arrived do not match the sender's digest".into())
                    } else {
                        Ok(())
                    };
                    return finish_run(b, h, verdict, total, got, Some(lost));
                }
            } else {
                match b.recv_within(Duration::ZERO) {
                    Ok(Some(m)) => {
                        match Message::parse(m.payload())? {
                            Message::Sent(n) => sent = n,
                            Message::Stop { total, digest } => {
                                stop = Some((total, digest, Instant::now()));
                            }
                            Message::Abort(reason) => {
                                return Ok(fail(h, &reason));
                            }
                            other => {
                                return Err(DistribError::Malformed(format!(
                                    "unexpected {other:?} in a udp run"
                                )));
                            }
                        }
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        return Ok(fail(h, &mid_flow(e)));
                    }
                }
            }
            // Wait for a datagram or a control message.
            let mut fds = [
                libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: b.conn().raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            let n = if stop.is_some() { 1 } else { 2 };
            // SAFETY: `n` valid pollfds for the duration of the call.
            unsafe { libc::poll(fds.as_mut_ptr(), n, 20) };
        }
    }

    /// Leave the flow.
    pub fn close(self) {
        self.b.close();
    }
}

/// Open a udp receiver's datagram socket, connected to the distributer's, and tell the
/// distributer its port (`PORT`).
fn open_datagrams(
    b: &mut Binding,
    w: &msg::Welcome,
) -> Result<(UdpSocket, SeqWindow), DistribError> {
    let (Some(tcp), true) = (b.conn().tcp(), w.udp_port != 0) else {
        return Err(DistribError::Malformed("a udp flow needs a TCP connection and a port".into()));
    };
    let (local, peer) = (tcp.local_addr()?, tcp.peer_addr()?);
    let sock = UdpSocket::bind(SocketAddr::new(local.ip(), 0))?;
    let n = if w.socket_buffer > 0 { w.socket_buffer as usize } else { UDP_RECV_BUFFER };
    force_recv_buffer(&sock, n);
    sock.connect(SocketAddr::new(peer.ip(), w.udp_port))?;
    sock.set_nonblocking(true)?;
    b.send(&msg::port(sock.local_addr()?.port())).map_err(DistribError::from_binding)?;
    Ok((sock, SeqWindow::new(bs_binding::driver::DATAGRAM_WINDOW)))
}

/// Give `sock` a receive buffer of `n` bytes: past `net.core.rmem_max` when the process may
/// (`SO_RCVBUFFORCE`, as root), else as much as the kernel allows. Datagrams that find the
/// buffer full are lost, so a receiver wants the buffer it was configured with.
fn force_recv_buffer(sock: &UdpSocket, n: usize) {
    use bs_transport::sockopt::set_int;
    if set_int(sock, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, n).is_err() {
        let _ = socket2::SockRef::from(sock).set_recv_buffer_size(n);
    }
}

/// Why a run's connection ended it.
fn mid_flow(e: bs_binding::BindingError) -> String {
    match DistribError::from_binding(e) {
        DistribError::Binding(bs_binding::BindingError::Transport(
            bs_transport::TransportError::Closed,
        )) => "the distributer closed the connection mid-flow".into(),
        e => format!("the connection failed mid-flow: {e}"),
    }
}

/// Tell the handler and the distributer how a run ended (`got` bytes arrived; on a udp flow
/// `lost` datagrams did not, said in `LOST` before the `CONFIRM`).
fn finish_run(
    b: &mut Binding,
    h: &mut impl FlowHandler,
    verdict: Result<(), String>,
    total: u64,
    got: u64,
    lost: Option<u64>,
) -> Result<RunEnd, DistribError> {
    let verdict = match verdict {
        Ok(()) => h.on_stop(total),
        Err(why) => {
            h.on_error(&why);
            Err(why)
        }
    };
    let (ok, why) = match &verdict {
        Ok(()) => (true, ""),
        Err(w) => (false, w.as_str()),
    };
    if let Some(n) = lost {
        b.send(&msg::lost(n)).map_err(DistribError::from_binding)?;
    }
    b.send(&msg::confirm(got, ok, why)).map_err(DistribError::from_binding)?;
    Ok(match verdict {
        Ok(()) => RunEnd::Stopped(total),
        Err(w) => RunEnd::Failed(w),
    })
}

fn fail(h: &mut impl FlowHandler, reason: &str) -> RunEnd {
    h.on_error(reason);
    RunEnd::Failed(reason.to_string())
}
