//! The floor of what any protocol can do: plain blocking TCP sockets, a length prefix, the
//! bytes, and a one-byte confirmation for pushes.
//!
//! The client writes an 8-byte big-endian word: the blob size, with the top bit set for a
//! pull. A push follows it with the bytes and waits for one byte back; a pull reads the bytes
//! the server sends. The connection carries the next run's request too (as blobstream's
//! client keeps its data connection alive between transfers): one connection per socket
//! buffer setting, opened by the first run (a warm-up).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::Bytes;
use socket2::{Domain, Protocol, Socket, Type};

use super::IO_TIMEOUT;
use crate::error::BenchError;
use crate::measure::{PathRunner, Transfer};
use crate::model::{Mode, Path};
use crate::payload::gbit_per_s;

const PULL_FLAG: u64 = 1 << 63;

/// What the server made of one connection: the bytes a push delivered, nothing for a pull.
type Outcome = io::Result<Option<Vec<u8>>>;

/// Raw TCP servers on 127.0.0.1 (port 0), one per socket buffer setting (a buffer size set on
/// a listener cannot be taken back), each started on first use and reused.
pub struct RawTcpRunner {
    source: Arc<Mutex<Bytes>>,
    servers: HashMap<u32, RawServer>,
}

impl Default for RawTcpRunner {
    fn default() -> Self {
        Self::new()
    }
}

impl RawTcpRunner {
    pub fn new() -> Self {
        Self { source: Arc::default(), servers: HashMap::new() }
    }

    fn server(&mut self, buffer: u32) -> Result<&RawServer, BenchError> {
        if !self.servers.contains_key(&buffer) {
            let server = RawServer::start(buffer, self.source.clone())
                .map_err(BenchError::io("starting the raw TCP server"))?;
            self.servers.insert(buffer, server);
        }
        Ok(&self.servers[&buffer])
    }
}

/// A new TCP socket with `SO_SNDBUF`/`SO_RCVBUF` set when `buffer` > 0.
fn socket(buffer: u32) -> io::Result<Socket> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    if buffer > 0 {
        s.set_send_buffer_size(buffer as usize)?;
        s.set_recv_buffer_size(buffer as usize)?;
    }
    Ok(s)
}

fn tune(s: &TcpStream) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))
}

/// Connect with the buffers set before the handshake, so window scaling sees them.
fn connect(addr: SocketAddr, buffer: u32) -> io::Result<TcpStream> {
    let s = socket(buffer)?;
    s.connect_timeout(&addr.into(), IO_TIMEOUT)?;
    let s: TcpStream = s.into();
    tune(&s)?;
    Ok(s)
}

struct RawServer {
    addr: SocketAddr,
    /// The client's connection, kept between runs.
    conn: Option<TcpStream>,
    outcomes: Receiver<Outcome>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RawServer {
    fn start(buffer: u32, source: Arc<Mutex<Bytes>>) -> io::Result<Self> {
        // Buffers set on the listener are inherited by the sockets it accepts.
        let s = socket(buffer)?;
        s.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
        s.listen(16)?;
        let listener: TcpListener = s.into();
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, outcomes) = mpsc::channel();
        let stopping = stop.clone();
        let thread = thread::Builder::new()
            .name("bench-raw-tcp".into())
            .spawn(move || serve(listener, source, stopping, tx))?;
        Ok(Self { addr, conn: None, outcomes, stop, thread: Some(thread) })
    }

    /// The client's side of this connection failed with `e`: drop the connection, and say
    /// what the server's side met, if it met something first (a closed connection on our
    /// side is often only the echo of its error).
    fn failed(&mut self, what: &str, e: io::Error) -> BenchError {
        self.conn = None;
        let theirs = self.outcomes.recv_timeout(Duration::from_secs(1)).ok().and_then(Result::err);
        match theirs {
            Some(t) => BenchError::io(format!("{what} (the server's side: {t})"))(e),
            None => BenchError::io(what)(e),
        }
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        // Closing the kept connection ends the server's loop on it.
        self.conn = None;
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept call.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    listener: TcpListener,
    source: Arc<Mutex<Bytes>>,
    stop: Arc<AtomicBool>,
    tx: Sender<Outcome>,
) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let mut s = match conn.and_then(|s| tune(&s).map(|()| s)) {
            Ok(s) => s,
            Err(e) => {
                if tx.send(Err(e)).is_err() {
                    break;
                }
                continue;
            }
        };
        // Requests on this connection until the client closes it.
        loop {
            let mut word = [0u8; 8];
            match s.read_exact(&mut word) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    break;
                }
            }
            let outcome = handle(&mut s, u64::from_be_bytes(word), &source);
            let failed = outcome.is_err();
            if tx.send(outcome).is_err() || failed {
                break;
            }
        }
    }
}

fn handle(s: &mut TcpStream, word: u64, source: &Mutex<Bytes>) -> Outcome {
    let n = (word & !PULL_FLAG) as usize;
    if word & PULL_FLAG != 0 {
        let data = source.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if n > data.len() {
            return Err(io::Error::other(format!("pull of {n} bytes, {} held", data.len())));
        }
        s.write_all(&data[..n])?;
        Ok(None)
    } else {
        let mut buf = bs_wire::alloc::zeroed(n);
        s.read_exact(&mut buf)?;
        s.write_all(&[1])?;
        Ok(Some(buf))
    }
}

impl PathRunner for RawTcpRunner {
    fn path(&self) -> Path {
        Path::RawTcp
    }

    fn transfer(&mut self, mode: Mode, data: &Bytes, buffer: u32) -> Result<Transfer, BenchError> {
        *self.source.lock().unwrap_or_else(|e| e.into_inner()) = data.clone();
        self.server(buffer)?;
        let server = self.servers.get_mut(&buffer).expect("just started");
        while server.outcomes.try_recv().is_ok() {} // left over from a failed run
        let n = data.len();
        let start = Instant::now();
        let s = match &mut server.conn {
            Some(s) => s,
            None => server
                .conn
                .insert(connect(server.addr, buffer).map_err(BenchError::io("raw TCP connect"))?),
        };
        let (elapsed, pulled) = match mode {
            Mode::Push => {
                let sent = (|| {
                    s.write_all(&(n as u64).to_be_bytes())?;
                    s.write_all(data)?;
                    let mut ok = [0u8; 1];
                    s.read_exact(&mut ok)
                })();
                if let Err(e) = sent {
                    return Err(server.failed("raw TCP push", e));
                }
                (start.elapsed(), None)
            }
            Mode::Pull => {
                let mut out = bs_wire::alloc::zeroed(n);
                let got = (|| {
                    s.write_all(&(n as u64 | PULL_FLAG).to_be_bytes())?;
                    s.read_exact(&mut out)
                })();
                if let Err(e) = got {
                    return Err(server.failed("raw TCP pull", e));
                }
                (start.elapsed(), Some(out))
            }
        };
        let outcome = server
            .outcomes
            .recv_timeout(IO_TIMEOUT)
            .map_err(|e| BenchError::io("raw TCP server")(io::Error::other(e)))?
            .map_err(BenchError::io("raw TCP server"))?;
        let received = pulled.or(outcome).map(Bytes::from);
        Ok(Transfer { gbit_per_s: gbit_per_s(n as u64, elapsed), received })
    }
}
