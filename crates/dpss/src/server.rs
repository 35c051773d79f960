//! The block server: one reader thread per disk, one sender thread per client connection, an
//! LRU cache in between, and the request-list rules of [`crate::lists`].
//!
//! Threads: one accepting connections; per connection one thread that owns its binding — a
//! client's `requests` connection reads `LIST`s and queues disk reads, its `blocks` connection
//! sends whatever [`Lists::next_out`] gives, a loader's connection stages and commits blocks;
//! per disk one reader that takes the most urgent queued read of any client (high before
//! medium before low, then first come), reads the block, checks its digest and puts it in the
//! cache. A new list takes its client's earlier reads out of the queues; a read already taken
//! by a reader when its list was replaced is skipped.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};
use std::thread;
use std::time::{Duration, Instant};

use bs_binding::{Binding, Role};
use bs_transport::{Conn, TlsServer, Unproven};
use bytes::Bytes;
use serde::Serialize;
use subtle::ConstantTimeEq;

use crate::block::{BlockId, Priority, check_name};
use crate::cache::{Cache, Cached};
use crate::conn::{CONNECT_WAIT, DEAD_PEER, MAX_LIST, binding};
use crate::disk::{Dataset, Disks, Loc, MAX_BLOCK};
use crate::error::DpssError;
use crate::lists::{Lists, Out};
use crate::msg::{self, Message};

/// How a block server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Its name in status (default: its address).
    pub name: String,
    pub disks: Vec<PathBuf>,
    /// Bytes of blocks the cache keeps.
    pub cache_bytes: usize,
    /// Peers must say this in their `HELLO` (none: anyone may connect).
    pub token: Option<String>,
    /// When set, only this opens the loader role (loading and dropping data sets); the other
    /// roles take it as well as `token`.
    pub admin_token: Option<String>,
    pub tls: Option<TlsServer>,
    /// The host name the master is told clients reach this server by, with the bound port
    /// (default: the bound address). Needed when it listens on 0.0.0.0, and with TLS, whose
    /// certificate names a host rather than an address.
    pub advertise_host: Option<String>,
    /// Most connections served at once once they have said HELLO with the token (clients'
    /// requests and blocks connections, loaders); each holds a thread. Past it a new one is
    /// told the server is busy.
    pub max_connections: usize,
}

impl ServerConfig {
    pub fn new(disks: Vec<PathBuf>) -> Self {
        Self {
            name: String::new(),
            disks,
            cache_bytes: 256 << 20,
            token: None,
            admin_token: None,
            tls: None,
            advertise_host: None,
            max_connections: 512,
        }
    }
}

/// Counters of one server, for the master and `/metrics`.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ServerStats {
    pub name: String,
    pub addr: String,
    pub disks: u32,
    pub datasets: u32,
    /// Bytes and blocks read from each disk since start.
    pub disk_bytes: Vec<u64>,
    pub disk_reads: Vec<u64>,
    pub cache_hits: u64,
    pub cache_bytes: u64,
    /// Reads waiting on each disk now.
    pub queued: Vec<u32>,
    pub sent_blocks: u64,
    pub sent_bytes: u64,
    pub lists: u64,
    pub flushed: u64,
    /// Blocks that failed their digest when read from disk.
    pub corrupt: u64,
    pub clients: u32,
}

struct Job {
    prio: Priority,
    order: u64,
    sess: Weak<Sess>,
    seq: u32,
    dataset: Arc<Dataset>,
    name: Arc<str>,
    id: BlockId,
    loc: Loc,
}

impl PartialEq for Job {
    fn eq(&self, o: &Self) -> bool {
        (self.prio, self.order) == (o.prio, o.order)
    }
}
impl Eq for Job {}
impl PartialOrd for Job {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Job {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.prio, self.order).cmp(&(o.prio, o.order))
    }
}

#[derive(Default)]
struct DiskQueue {
    q: Mutex<BinaryHeap<Reverse<Job>>>,
    cv: Condvar,
    bytes: AtomicU64,
    reads: AtomicU64,
}

/// One client: its lists, and the condition its `blocks` sender waits on.
#[derive(Default)]
struct Sess {
    lists: Mutex<Lists>,
    cv: Condvar,
    closed: AtomicBool,
}

struct Inner {
    cfg: ServerConfig,
    addr: SocketAddr,
    disks: Disks,
    datasets: RwLock<HashMap<String, Arc<Dataset>>>,
    cache: Mutex<Cache>,
    queues: Vec<DiskQueue>,
    sessions: Mutex<HashMap<String, Arc<Sess>>>,
    /// Data sets a loader is staging now (one loader per name at a time).
    loading: Mutex<std::collections::HashSet<String>>,
    order: AtomicU64,
    closing: AtomicBool,
    conns: Mutex<HashMap<u64, TcpStream>>,
    /// Connections that have not presented their HELLO and token yet (each a thread): at most
    /// [`MAX_UNPROVEN`].
    unproven: Arc<std::sync::atomic::AtomicUsize>,
    /// Connections that have (each a thread): at most [`ServerConfig::max_connections`].
    proven: Arc<std::sync::atomic::AtomicUsize>,
    next_id: AtomicU64,
    cache_hits: AtomicU64,
    sent_blocks: AtomicU64,
    sent_bytes: AtomicU64,
    lists: AtomicU64,
    flushed: AtomicU64,
    corrupt: AtomicU64,
}

/// A running block server (stops when dropped).
pub struct BlockServer {
    inner: Arc<Inner>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl BlockServer {
    /// Open the disks and serve on `addr` (port 0: any).
    pub fn start(addr: &str, mut cfg: ServerConfig) -> Result<Self, DpssError> {
        let disks = Disks::open(cfg.disks.clone())?;
        let datasets = disks.load_all()?.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        if cfg.name.is_empty() {
            cfg.name = addr.to_string();
        }
        let queues = (0..disks.count()).map(|_| DiskQueue::default()).collect();
        let inner = Arc::new(Inner {
            cache: Mutex::new(Cache::new(cfg.cache_bytes)),
            cfg,
            addr,
            disks,
            datasets: RwLock::new(datasets),
            queues,
            sessions: Mutex::default(),
            loading: Mutex::default(),
            order: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            conns: Mutex::default(),
            next_id: AtomicU64::new(0),
            unproven: Arc::default(),
            proven: Arc::default(),
            cache_hits: AtomicU64::new(0),
            sent_blocks: AtomicU64::new(0),
            sent_bytes: AtomicU64::new(0),
            lists: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
        });
        let mut threads = Vec::new();
        for disk in 0..inner.queues.len() {
            let i = inner.clone();
            threads.push(
                thread::Builder::new()
                    .name(format!("dpss-disk-{disk}"))
                    .spawn(move || reader(&i, disk))?,
            );
        }
        let i = inner.clone();
        threads.push(
            thread::Builder::new()
                .name("dpss-accept".into())
                .spawn(move || accept(&i, listener))?,
        );
        tracing::info!(%addr, disks = inner.queues.len(), "block server up");
        Ok(Self { inner, threads })
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    pub fn name(&self) -> &str {
        &self.inner.cfg.name
    }

    /// This server's counters now.
    pub fn stats(&self) -> ServerStats {
        stats(&self.inner)
    }

    /// A function giving the counters while the server runs (`None` once it stopped), for
    /// [`crate::master::heartbeat`].
    pub fn stats_source(&self) -> impl Fn() -> Option<ServerStats> + Send + Sync + 'static {
        let i = Arc::downgrade(&self.inner);
        move || i.upgrade().filter(|i| !i.closing.load(Ordering::SeqCst)).map(|i| stats(&i))
    }

    /// The directory of disk `n`.
    pub fn disk_dir(&self, n: usize) -> PathBuf {
        self.inner.disks.dir(n).to_path_buf()
    }
}

impl Drop for BlockServer {
    /// Stop as a process exit would: no new connections, every open one ends.
    fn drop(&mut self) {
        let i = &self.inner;
        i.closing.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(i.addr);
        for s in i.conns.lock().unwrap().values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for q in &i.queues {
            let _guard = q.q.lock().unwrap();
            q.cv.notify_all();
        }
        let sessions: Vec<Arc<Sess>> = i.sessions.lock().unwrap().values().cloned().collect();
        for s in sessions {
            s.closed.store(true, Ordering::SeqCst);
            let _guard = s.lists.lock().unwrap();
            s.cv.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn stats(i: &Inner) -> ServerStats {
    // One lock at a time: other threads take these in other orders.
    let cache_bytes = i.cache.lock().unwrap().bytes() as u64;
    ServerStats {
        name: i.cfg.name.clone(),
        addr: match &i.cfg.advertise_host {
            Some(host) => format!("{host}:{}", i.addr.port()),
            None => i.addr.to_string(),
        },
        disks: i.queues.len() as u32,
        datasets: i.datasets.read().unwrap().len() as u32,
        disk_bytes: i.queues.iter().map(|q| q.bytes.load(Ordering::Relaxed)).collect(),
        disk_reads: i.queues.iter().map(|q| q.reads.load(Ordering::Relaxed)).collect(),
        cache_hits: i.cache_hits.load(Ordering::Relaxed),
        cache_bytes,
        queued: i.queues.iter().map(|q| q.q.lock().unwrap().len() as u32).collect(),
        sent_blocks: i.sent_blocks.load(Ordering::Relaxed),
        sent_bytes: i.sent_bytes.load(Ordering::Relaxed),
        lists: i.lists.load(Ordering::Relaxed),
        flushed: i.flushed.load(Ordering::Relaxed),
        corrupt: i.corrupt.load(Ordering::Relaxed),
        clients: i.sessions.lock().unwrap().len() as u32,
    }
}

/// A disk's reader: the most urgent wanted block next.
fn reader(i: &Arc<Inner>, disk: usize) {
    let q = &i.queues[disk];
    loop {
        let job = {
            let mut heap = q.q.lock().unwrap();
            loop {
                if i.closing.load(Ordering::SeqCst) {
                    return;
                }
                if let Some(Reverse(j)) = heap.pop() {
                    break j;
                }
                heap = q.cv.wait(heap).unwrap();
            }
        };
        let Some(sess) = job.sess.upgrade() else { continue };
        if !sess.lists.lock().unwrap().wants(job.seq, job.id) {
            continue; // its list was replaced after the reader took it: flushed
        }
        let hit = i.cache.lock().unwrap().get(&job.name, job.id);
        let got = match hit {
            Some(c) => {
                i.cache_hits.fetch_add(1, Ordering::Relaxed);
                Ok((c, true))
            }
            None => match job.dataset.read_verified(job.id, &job.loc) {
                Ok(buf) => {
                    q.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
                    q.reads.fetch_add(1, Ordering::Relaxed);
                    let c = Cached { data: Bytes::from(buf), digest: job.loc.digest };
                    // Only a block of the data set now under this name is cached: one removed
                    // (and maybe loaded again) meanwhile must not come back from the cache.
                    let current = i.datasets.read().unwrap().get(&*job.name).cloned();
                    if current.is_some_and(|d| Arc::ptr_eq(&d, &job.dataset)) {
                        i.cache.lock().unwrap().insert(&job.name, job.id, c.clone());
                        Ok((c, false))
                    } else {
                        Err(format!("data set {:?} was removed", job.name))
                    }
                }
                Err(DpssError::Corrupt(_)) => {
                    i.corrupt.fetch_add(1, Ordering::Relaxed);
                    let why = format!(
                        "block {} of {:?} fails its digest on disk {disk} of server {}",
                        job.id, job.name, i.cfg.name
                    );
                    tracing::error!("{why}");
                    Err(why)
                }
                Err(e) => Err(format!("reading block {} on server {}: {e}", job.id, i.cfg.name)),
            },
        };
        sess.lists.lock().unwrap().on_read(job.seq, job.id, got);
        sess.cv.notify_all();
    }
}

/// Most connections at once that have not said HELLO with the token yet (each holds a
/// thread): peers that connect and say nothing, or trickle, hold no more; further ones are
/// closed at once.
pub const MAX_UNPROVEN: usize = 64;
/// Largest first message: a HELLO is a few hundred bytes.
const HELLO_MAX: u64 = 64 << 10;

fn accept(i: &Arc<Inner>, listener: TcpListener) {
    for conn in listener.incoming() {
        if i.closing.load(Ordering::SeqCst) {
            return;
        }
        let Ok(tcp) = conn else { continue };
        // Counted until its HELLO and token check out (or it goes).
        let Some(unproven) = Unproven::take(&i.unproven, MAX_UNPROVEN) else {
            tracing::warn!(
                "block server: {MAX_UNPROVEN} connections have not said HELLO; closing a new one"
            );
            continue;
        };
        let inner = i.clone();
        let spawned = thread::Builder::new().name("dpss-conn".into()).stack_size(512 * 1024).spawn(
            move || {
                let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
                if let Ok(s) = tcp.try_clone() {
                    inner.conns.lock().unwrap().insert(id, s);
                }
                serve(&inner, tcp, id, unproven);
                inner.conns.lock().unwrap().remove(&id);
            },
        );
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a connection thread");
        }
    }
}

fn refuse(b: Binding, e: &DpssError) {
    tracing::info!(reason = %e, "block server ends a connection");
    b.end_with(e.code(), e.to_string());
}

fn serve(i: &Arc<Inner>, tcp: TcpStream, id: u64, unproven: Unproven) {
    let _ = tcp.set_nodelay(true);
    let mut conn = match &i.cfg.tls {
        None => Conn::new(tcp),
        Some(t) => match Conn::tls_server(tcp, t) {
            Ok(c) => c,
            Err(e) => return tracing::warn!(error = %e, "block server: TLS refused a connection"),
        },
    };
    let _ = conn.set_read_timeout(Some(CONNECT_WAIT));
    // A failed handshake has told the peer with an alert; end here rather than wait out
    // CONNECT_WAIT trying to send a refusal over a connection that has no TLS session.
    if let Err(e) = conn.handshake() {
        return tracing::info!(error = %e, "block server: TLS handshake failed");
    }
    // The first frame's size before its body is read.
    match bs_transport::first_message_at_most(&mut conn, HELLO_MAX) {
        Ok(Ok(())) => {}
        Ok(Err(why)) => {
            return refuse(binding(conn, Role::Responder, id), &DpssError::Malformed(why));
        }
        Err(e) => {
            let e = DpssError::Malformed(format!("expected HELLO: {e}"));
            return refuse(binding(conn, Role::Responder, id), &e);
        }
    }
    let mut b = binding(conn, Role::Responder, id);
    let first = match b.recv_within(CONNECT_WAIT) {
        Ok(Some(m)) => m,
        Ok(None) => return refuse(b, &DpssError::Malformed("no HELLO within 10 s".into())),
        Err(e) => return refuse(b, &DpssError::Malformed(format!("expected HELLO: {e}"))),
    };
    let hello = match Message::parse(first.payload(), 0) {
        Ok(Message::Hello(h)) => h,
        Ok(other) => {
            let e = DpssError::Malformed(format!("expected HELLO, got {other:?}"));
            return refuse(b, &e);
        }
        Err(e) => return refuse(b, &e),
    };
    // A loader changes what the server holds: with an admin token set, only it opens that
    // role; the others take the token (or the admin's), or nothing when there is none.
    let is = |t: &Option<String>| {
        t.as_ref().is_some_and(|t| bool::from(t.as_bytes().ct_eq(hello.token.as_bytes())))
    };
    let (token, admin) = (&i.cfg.token, &i.cfg.admin_token);
    if hello.role == "loader" && admin.is_some() {
        if !is(admin) {
            return refuse(b, &DpssError::NeedsAdmin);
        }
    } else if token.is_some() && !is(token) && !is(admin) {
        return refuse(b, &DpssError::BadToken);
    }
    // Proven: no longer among the connections that have shown nothing, but among those
    // served.
    drop(unproven);
    let max = i.cfg.max_connections;
    let Some(_proven) = Unproven::take(&i.proven, max) else {
        return refuse(b, &DpssError::Busy(format!("{max} connections are served already")));
    };
    let _ = b.conn().set_read_timeout(None);
    let _ = b.conn().watch_for_dead_peer(DEAD_PEER);
    let welcome = msg::Welcome {
        name: i.cfg.name.clone(),
        disks: i.queues.len() as u32,
        max_list: MAX_LIST as u32,
        max_block: MAX_BLOCK as u32,
    };
    let session_ok =
        hello.session.len() == 32 && hello.session.bytes().all(|c| c.is_ascii_hexdigit());
    let res = match hello.role.as_str() {
        "requests" | "blocks" if !session_ok => {
            Err(DpssError::Malformed("a session is 32 hex digits".into()))
        }
        "requests" => {
            let s = session(i, &hello.session);
            let r = b.send(&msg::welcome(&welcome)).map_err(DpssError::from);
            let r = r.and_then(|()| requests(i, &mut b, &s));
            s.closed.store(true, Ordering::SeqCst);
            drop(s.lists.lock().unwrap());
            s.cv.notify_all();
            i.sessions.lock().unwrap().remove(&hello.session);
            r
        }
        "blocks" => {
            // Only for a session its `requests` connection opened (which also ends it), so a
            // stray `blocks` connection cannot hold a session and a thread forever.
            let s = i.sessions.lock().unwrap().get(&hello.session).cloned();
            match s {
                None => Err(DpssError::Malformed(
                    "a blocks connection comes after its session's requests connection".into(),
                )),
                Some(s) => {
                    let r = b.send(&msg::welcome(&welcome)).map_err(DpssError::from);
                    r.and_then(|()| blocks(i, &mut b, &s))
                }
            }
        }
        "loader" => {
            b.send(&msg::welcome(&welcome)).map_err(DpssError::from).and_then(|()| load(i, &mut b))
        }
        other => Err(DpssError::Malformed(format!("role {other:?} (requests, blocks or loader)"))),
    };
    match res {
        Ok(()) => b.close(),
        Err(e @ (DpssError::Binding(_) | DpssError::Transport(_) | DpssError::Io(_))) => {
            tracing::debug!(error = %e, "block server connection ended");
        }
        Err(e) => refuse(b, &e),
    }
}

/// Most answers other than blocks (failures and `DONE`s) one session may leave unread before
/// its next list is refused: a few full lists' worth.
const MAX_UNSENT: usize = 4 * MAX_LIST;

fn session(i: &Inner, id: &str) -> Arc<Sess> {
    i.sessions.lock().unwrap().entry(id.to_string()).or_default().clone()
}

/// A client's `requests` connection: each `LIST` replaces the last.
fn requests(i: &Inner, b: &mut Binding, s: &Arc<Sess>) -> Result<(), DpssError> {
    while let Some(m) = b.recv()? {
        let Message::List { seq, got, dataset, entries } = Message::parse(m.payload(), MAX_LIST)?
        else {
            return Err(DpssError::Malformed("a requests connection carries only LIST".into()));
        };
        let ds = i.datasets.read().unwrap().get(dataset).cloned();
        let ds = ds.ok_or_else(|| DpssError::UnknownDataset(dataset.to_string()))?;
        let name: Arc<str> = dataset.into();
        i.lists.fetch_add(1, Ordering::Relaxed);
        let mut hits = 0;
        // The session's lists stay locked until the new list's reads are queued, so a second
        // connection of the same session cannot slip its list in between.
        let mut l = s.lists.lock().unwrap();
        // A client that reads none of its answers cannot pile them up without end.
        if l.unsent() > MAX_UNSENT {
            return Err(DpssError::TooSlow(format!(
                "{} answers (failures and DONEs) wait unread on this session's blocks \
                 connection; read them before sending more lists",
                l.unsent()
            )));
        }
        let had_reads = l.waiting();
        let reads = {
            let mut cache = i.cache.lock().unwrap();
            let cached = |id| {
                let c = cache.get(dataset, id);
                hits += u64::from(c.is_some());
                c
            };
            l.replace(seq, got, dataset, &entries, cached, |id| ds.blocks.contains_key(&id))
        };
        i.cache_hits.fetch_add(hits, Ordering::Relaxed);
        if had_reads {
            // The replaced list's reads still queued are flushed: out of the queues now (with
            // those of clients gone), so readers do not wake for them and `queued` counts only
            // reads someone still wants — a client sending a list per wanted tile would
            // otherwise pile up its rings' reads.
            let mine = Arc::as_ptr(s);
            for q in &i.queues {
                q.q.lock().unwrap().retain(|Reverse(j)| {
                    !std::ptr::eq(j.sess.as_ptr(), mine) && j.sess.strong_count() > 0
                });
            }
        }
        for (id, prio) in reads {
            let loc = ds.blocks[&id];
            let q = &i.queues[loc.disk as usize];
            let job = Job {
                prio,
                order: i.order.fetch_add(1, Ordering::Relaxed),
                sess: Arc::downgrade(s),
                seq,
                dataset: ds.clone(),
                name: name.clone(),
                id,
                loc,
            };
            q.q.lock().unwrap().push(Reverse(job));
            q.cv.notify_one();
        }
        drop(l);
        s.cv.notify_all();
    }
    Ok(())
}

/// A client's `blocks` connection: whatever is ready, most urgent first.
fn blocks(i: &Inner, b: &mut Binding, s: &Arc<Sess>) -> Result<(), DpssError> {
    let mut head = Vec::with_capacity(64);
    loop {
        let out = {
            let mut l = s.lists.lock().unwrap();
            loop {
                if let Some(o) = l.next_out() {
                    break o;
                }
                if s.closed.load(Ordering::SeqCst) || i.closing.load(Ordering::SeqCst) {
                    return Ok(());
                }
                let (g, waited) = s.cv.wait_timeout(l, Duration::from_secs(1)).unwrap();
                l = g;
                if waited.timed_out() {
                    // Idle: notice a client that went away (it never sends on this side).
                    drop(l);
                    if !b.poll()? {
                        return Ok(());
                    }
                    l = s.lists.lock().unwrap();
                }
            }
        };
        match out {
            Out::Block { seq, dataset, id, block } => {
                msg::block_head_into(&mut head, seq, id, block.data.len(), &block.digest, &dataset);
                b.send_parts(&head, &block.data)?;
                i.sent_blocks.fetch_add(1, Ordering::Relaxed);
                i.sent_bytes.fetch_add(block.data.len() as u64, Ordering::Relaxed);
            }
            Out::Failed { seq, id, reason } => b.send(&msg::failed(seq, id, &reason))?,
            Out::Done { seq, stats } => {
                i.flushed.fetch_add(stats.flushed as u64, Ordering::Relaxed);
                b.send(&msg::done(seq, &stats))?;
            }
        }
    }
}

/// The error for a name another loader connection holds.
fn busy(dataset: &str) -> DpssError {
    DpssError::Malformed(format!("data set {dataset:?} is being loaded by another loader"))
}

/// Hold `dataset` for one loader connection, or say another holds it.
fn hold(i: &Inner, dataset: &str) -> Result<(), DpssError> {
    if i.loading.lock().unwrap().insert(dataset.to_string()) { Ok(()) } else { Err(busy(dataset)) }
}

/// A loader's connection: perhaps `BEGIN`, `PUT`s staged, then one `COMMIT` (or a `DROP`,
/// taking a load back). The name stays held from `BEGIN` or the first `PUT` until the
/// connection ends.
fn load(i: &Inner, b: &mut Binding) -> Result<(), DpssError> {
    let mut staging = None;
    let mut reserved: Option<String> = None;
    let started = Instant::now();
    let res = (|| {
        while let Some(m) = b.recv()? {
            match Message::parse(m.payload(), 0)? {
                Message::Begin(dataset) => {
                    if reserved.is_some() {
                        return Err(DpssError::Malformed(
                            "BEGIN comes first, once per connection".into(),
                        ));
                    }
                    check_name(dataset)?;
                    hold(i, dataset)?;
                    reserved = Some(dataset.to_string());
                    let exists = i.datasets.read().unwrap().contains_key(dataset);
                    b.send(&msg::held(exists))?;
                }
                Message::Put { disk, id, digest, dataset, data } => {
                    if staging.is_none() {
                        check_name(dataset)?;
                        if i.datasets.read().unwrap().contains_key(dataset) {
                            return Err(DpssError::DatasetExists(dataset.to_string()));
                        }
                        match &reserved {
                            Some(held) if held == dataset => {}
                            Some(held) => {
                                return Err(DpssError::Malformed(format!(
                                    "a loader connection carries one data set ({held:?}), not {dataset:?}"
                                )));
                            }
                            None => {
                                hold(i, dataset)?;
                                reserved = Some(dataset.to_string());
                            }
                        }
                        staging = Some(i.disks.stage(dataset)?);
                    }
                    let s = staging.as_mut().unwrap();
                    if s.dataset != dataset {
                        return Err(DpssError::Malformed(format!(
                            "a loader connection carries one data set ({:?}), not {dataset:?}",
                            s.dataset
                        )));
                    }
                    i.disks.put(s, disk, id, digest, data)?;
                }
                Message::Commit(name) => {
                    let s = match staging.take() {
                        Some(s) => s,
                        // A server given no block of the data set (a small one over many
                        // servers) holds it empty: every server has it once it is published.
                        None if reserved.as_deref() == Some(name) => {
                            if i.datasets.read().unwrap().contains_key(name) {
                                return Err(DpssError::DatasetExists(name.to_string()));
                            }
                            i.disks.stage(name)?
                        }
                        None => {
                            return Err(DpssError::Malformed(
                                "COMMIT before BEGIN or any PUT".into(),
                            ));
                        }
                    };
                    if s.dataset != name {
                        i.disks.discard(s);
                        return Err(DpssError::Malformed(format!("COMMIT of {name:?}")));
                    }
                    let placed = i.disks.commit(s)?;
                    let ds = Arc::new(i.disks.load(name)?);
                    i.cache.lock().unwrap().drop_dataset(name);
                    i.datasets.write().unwrap().insert(name.to_string(), ds);
                    b.send(&msg::committed(&placed))?;
                    tracing::info!(dataset = name, blocks = placed.len(), secs = ?started.elapsed(), "data set committed");
                }
                Message::Drop(name) => {
                    check_name(name)?;
                    // Not while another connection holds the name (its loader may be about to
                    // publish what it committed), and held while dropping, so no loader
                    // begins on it half way.
                    let borrowed = reserved.as_deref() != Some(name);
                    if borrowed {
                        hold(i, name)?;
                    }
                    i.datasets.write().unwrap().remove(name);
                    i.cache.lock().unwrap().drop_dataset(name);
                    let removed = i.disks.remove(name);
                    if borrowed {
                        i.loading.lock().unwrap().remove(name);
                    }
                    b.send(&msg::held(removed?))?;
                }
                other => {
                    return Err(DpssError::Malformed(format!("a loader sent {other:?}")));
                }
            }
        }
        Ok(())
    })();
    if let Some(s) = staging {
        i.disks.discard(s);
    }
    if let Some(name) = reserved {
        i.loading.lock().unwrap().remove(&name);
    }
    res
}
