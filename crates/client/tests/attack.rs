//! A server on port 0 under a stranger's attack. On the data plane: a thousand connections
//! that never present a token, and a thread that keeps opening more, while legitimate 64 MiB
//! puts and gets must all succeed — with and without TLS and a token. On the control plane:
//! guessing the bearer token in parallel is cut off after a small budget, and connections
//! past the limit wait for one to close.

use std::collections::VecDeque;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use bs_client::{Client, ClientError, RouteRequest, Security, TlsClient};
use bs_server::{BackgroundServer, ServerConfig};
use bs_store::{FsStore, MemStore, Store};
use bs_transport::{Conn, TlsServer};
use bs_wire::{ErrorCode, Frame};

/// Connections the attack holds open and never speaks on.
const IDLE: usize = 1000;

/// Connections the reconnecting thread keeps open at a time; each new one replaces its oldest.
const CHURN_HELD: usize = 100;

/// Enough descriptors for the attack's sockets on both ends (the server runs in this process).
fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid, writable struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let want = (8 * IDLE as libc::rlim_t).min(lim.rlim_max);
        if lim.rlim_cur < want {
            lim.rlim_cur = want;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
}

/// A stranger at the data port: idle connections, and a thread that keeps reconnecting (each
/// new connection sends half a header and waits).
struct Attack {
    _idle: Vec<TcpStream>,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
    churn: Option<JoinHandle<()>>,
}

impl Attack {
    fn start(addr: SocketAddr) -> Self {
        raise_fd_limit();
        let idle = (0..IDLE).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicU64::new(0));
        let (s, o) = (stop.clone(), opened.clone());
        let churn = thread::spawn(move || {
            let mut held = VecDeque::with_capacity(CHURN_HELD);
            while !s.load(Ordering::Relaxed) {
                let Ok(mut t) = TcpStream::connect(addr) else { continue };
                let _ = t.write_all(&Frame::Hello { token: [0; 32] }.encode()[..12]);
                if held.len() == CHURN_HELD {
                    held.pop_front();
                }
                held.push_back(t);
                o.fetch_add(1, Ordering::Relaxed);
            }
        });
        Self { _idle: idle, stop, opened, churn: Some(churn) }
    }

    /// Stop reconnecting; returns how many connections the thread opened.
    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.churn.take().unwrap().join().unwrap();
        self.opened.load(Ordering::Relaxed)
    }
}

/// `n` pseudo-random bytes, different for every `seed`.
fn content(n: usize, seed: u8) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(seed);
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(n);
    out
}

fn put(c: &Client, name: &str, bytes: &[u8]) {
    let route = RouteRequest { size: Some(bytes.len() as u64), ..Default::default() };
    let mut p = c.open_push(name, 0, None, Some(route)).unwrap();
    p.write(bytes).unwrap();
    assert!(p.finish(true).unwrap().committed.is_some());
}

fn get(c: &Client, name: &str) -> Vec<u8> {
    let mut p = c.open_pull(name, 0, None).unwrap();
    let mut out = vec![0u8; p.len() as usize];
    p.read_exact_to_end(&mut out).unwrap();
    out
}

/// Puts and gets `rounds` blobs of `size` bytes while the attack runs; all must succeed.
fn legitimate_traffic_gets_through(s: &BackgroundServer, c: &Client, rounds: u8, size: usize) {
    let attack = Attack::start(s.data_addr());
    for round in 0..rounds {
        let bytes = content(size, round);
        let name = format!("scans/{round}");
        put(c, &name, &bytes);
        assert!(get(c, &name) == bytes, "round {round}: the blob came back different");
    }
    assert!(attack.stop() > 0, "the reconnecting thread never got a connection in");
}

fn fs_server(dir: &tempfile::TempDir, cfg: ServerConfig) -> BackgroundServer {
    let store: Arc<dyn Store> = Arc::new(FsStore::open(dir.path()).unwrap());
    BackgroundServer::start(store, cfg).unwrap()
}

#[test]
fn strangers_holding_and_churning_connections_do_not_stop_puts_and_gets() {
    let dir = tempfile::tempdir().unwrap();
    let s = fs_server(&dir, ServerConfig::ephemeral());
    let c = Client::connect(&s.control_addr().to_string()).unwrap();
    legitimate_traffic_gets_through(&s, &c, 1, 64 << 20);
}

#[test]
fn with_tls_and_a_token_strangers_do_not_stop_an_authorised_client() {
    let pki = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (pki.cert.pem(), pki.signing_key.serialize_pem());
    let cfg = ServerConfig {
        auth_token: Some("s3cret".into()),
        tls: Some(TlsServer::from_pem(cert.as_bytes(), key.as_bytes()).unwrap()),
        ..ServerConfig::ephemeral()
    };
    let s = BackgroundServer::start(Arc::new(MemStore::new()), cfg).unwrap();
    let security = Security {
        auth_token: Some("s3cret".into()),
        tls: Some(TlsClient::from_pem(cert.as_bytes(), Some("localhost".into())).unwrap()),
    };
    let c = Client::connect_with(&s.control_addr().to_string(), security).unwrap();
    legitimate_traffic_gets_through(&s, &c, 1, 64 << 20);
}

#[test]
fn a_full_table_of_waiting_connections_makes_room_by_evicting_the_oldest() {
    // Every address may fill the table: only the total limit applies.
    let cfg = ServerConfig {
        max_unauthenticated: 50,
        max_unauthenticated_per_ip: usize::MAX,
        ..ServerConfig::ephemeral()
    };
    let s = BackgroundServer::start(Arc::new(MemStore::new()), cfg).unwrap();
    let c = Client::connect(&s.control_addr().to_string()).unwrap();
    let first = TcpStream::connect(s.data_addr()).unwrap();
    legitimate_traffic_gets_through(&s, &c, 3, 1 << 20);
    // The oldest waiting connection was told why it had to go.
    first.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    match Conn::new(first).read_frame() {
        Ok(Frame::Error { code: ErrorCode::Busy, message }) => {
            assert!(message.contains("evicted"), "{message}");
        }
        other => panic!("expected an eviction notice, got {other:?}"),
    }
}

#[test]
fn guessing_the_token_in_parallel_gets_only_the_budgeted_answers() {
    let cfg = ServerConfig {
        auth_token: Some("s3cret".into()),
        auth_failure_burst: 6,
        // Longer than any test run: nothing is forgiven while this one runs.
        auth_failure_interval: Duration::from_secs(3600),
        ..ServerConfig::ephemeral()
    };
    let s = BackgroundServer::start(Arc::new(MemStore::new()), cfg).unwrap();
    let addr = s.control_addr().to_string();
    // Every guesser started before any is waited for: they guess at the same time.
    let threads: Vec<_> = (0..4)
        .map(|g| {
            let addr = addr.clone();
            thread::spawn(move || {
                let token = Some(format!("guess-{g}"));
                let c =
                    Client::connect_with(&addr, Security { auth_token: token, tls: None }).unwrap();
                (0..5).map(|_| c.stat("x").unwrap_err()).collect::<Vec<_>>()
            })
        })
        .collect();
    let guessers: Vec<_> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let checked = guessers.iter().filter(|e| matches!(e, ClientError::Unauthenticated(_))).count();
    let refused = guessers
        .iter()
        .filter(|e| matches!(e, ClientError::Rpc { code: tonic::Code::Unavailable, .. }))
        .count();
    assert_eq!((checked, refused), (6, 14), "{guessers:?}");
    // Now even the right token is refused from this address: a guess learns nothing.
    let right = Security { auth_token: Some("s3cret".into()), tls: None };
    let e = Client::connect_with(&addr, right).unwrap().stat("x").unwrap_err();
    assert!(
        matches!(&e, ClientError::Rpc { code: tonic::Code::Unavailable, message } if message.contains("too many wrong tokens")),
        "{e:?}"
    );
}

/// The control plane holds at most `max_control_connections` open: the next ones wait in the
/// kernel's backlog (unserved, not refused) until one closes, instead of the process running
/// out of descriptors for everyone.
#[test]
fn control_plane_connections_past_the_limit_wait_for_one_to_close() {
    let cfg = ServerConfig { max_control_connections: 2, ..ServerConfig::ephemeral() };
    let s = BackgroundServer::start(Arc::new(MemStore::new()), cfg).unwrap();
    let addr = s.control_addr();
    // One client served (it keeps its connection), one stranger connected and silent.
    let first = Client::connect(&addr.to_string()).unwrap();
    assert!(first.list("").unwrap().is_empty());
    let stranger = TcpStream::connect(addr).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let second = thread::spawn(move || {
        let c = Client::connect(&addr.to_string())?;
        let listed = c.list("");
        d.store(true, Ordering::SeqCst);
        listed
    });
    // Not served while both places are taken (however long this waits, it cannot be)...
    thread::sleep(Duration::from_millis(500));
    assert!(!done.load(Ordering::SeqCst), "a third control connection was served");
    assert!(first.list("").unwrap().is_empty(), "the connections held are served");
    // ...and served once one closes.
    drop(stranger);
    assert!(second.join().unwrap().unwrap().is_empty());
}
