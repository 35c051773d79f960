//! The client library: open a data set, send request lists, receive verified blocks as they
//! arrive from every server, and fail over to another copy when a server dies or a block
//! fails its digest.
//!
//! Per server the client holds two connections (see [`crate::msg`]): `requests`, written from
//! the caller's thread, and `blocks`, read by a thread of its own that hands every message to
//! one channel. [`Client::next`] takes from that channel, checks each block against its
//! digest, and re-asks a copy elsewhere for what failed. A caller may also have each intact
//! block handed to it on the reading thread as it arrives ([`Client::on_block`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use bs_binding::Binding;

use crate::block::{BlockId, Priority, digest};
use crate::conn::Peer;
use crate::error::DpssError;
use crate::layout::Layout;
use crate::msg::{self, ListStats, Message};

/// How to reach the block servers and the master: the CA to trust for TLS and the token the
/// block store requires (one token for the master and its servers).
pub type ClientOptions = bs_plane::Credentials;

/// A block's bytes where they arrived: in the pooled buffer the message was read into (no
/// copy); the buffer goes back to its pool when this is dropped.
pub struct BlockBytes {
    msg: bs_binding::Msg,
    start: usize,
    digest: [u8; 16],
}

impl BlockBytes {
    /// The digest the block was stored with (and that these bytes were checked against).
    pub fn digest(&self) -> [u8; 16] {
        self.digest
    }
}

impl std::ops::Deref for BlockBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.msg.payload()[self.start..]
    }
}

impl std::fmt::Debug for BlockBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockBytes({} bytes)", self.len())
    }
}

impl AsRef<[u8]> for BlockBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl PartialEq<[u8]> for BlockBytes {
    fn eq(&self, o: &[u8]) -> bool {
        **self == *o
    }
}

impl PartialEq<Vec<u8>> for BlockBytes {
    fn eq(&self, o: &Vec<u8>) -> bool {
        **self == **o
    }
}

/// What [`Client::next`] gives.
#[derive(Debug)]
pub enum Event {
    /// A block, verified against its digest.
    Block { id: BlockId, data: BlockBytes, server: usize },
    /// No copy of the block could be delivered; `reason` says what each server said.
    Lost { id: BlockId, reason: String },
    /// A server finished (or replaced) one of this client's lists.
    ListDone { server: usize, seq: u32, stats: ListStats },
    /// A server went away; its unserved blocks were re-asked elsewhere.
    ServerLost { server: usize, reason: String },
}

enum Raw {
    /// A message from server `.0` over its connection of generation `.1`; `.3`: for a
    /// `BLOCK`, whether it is intact — its bytes match its digest (checked by the reading
    /// thread, while they are still in its core's cache) and it is of the client's data set.
    Msg(usize, u32, bs_binding::Msg, bool),
    Gone(usize, u32, String),
    /// A lost server tried again (off the client's thread): its session's two connections,
    /// or why there are none.
    Revived(usize, Result<Box<(Binding, Binding)>, String>),
    Wake,
}

/// The first wait before a lost server is tried again, doubled after each failed try up to
/// [`RETRY_MOST`]: a server restarted (a rolling restart, a crash) is used again.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MOST: Duration = Duration::from_secs(30);

/// Called on a server's reading thread with each block that arrived intact (its bytes match
/// its digest, and it is of the client's data set), before [`Client::next`] gives it out: a
/// caller whose waiters are on other threads hands them the block one thread hand-off sooner.
pub type OnBlock = Arc<dyn Fn(BlockId, &[u8], [u8; 16]) + Send + Sync>;

/// Makes a [`Client::next`] waiting in another thread return at once (with `None`), so a
/// thread that owns the client can serve other work without polling.
#[derive(Clone)]
pub struct Waker(mpsc::Sender<Raw>);

impl Waker {
    pub fn wake(&self) {
        let _ = self.0.send(Raw::Wake);
    }
}

/// A server's `requests` connection; its `blocks` connection is read by a detached thread that
/// ends when the connection does.
struct Link {
    requests: Binding,
}

/// A client of one data set.
pub struct Client {
    layout: Layout,
    opts: ClientOptions,
    links: Vec<Option<Link>>,
    dead: Vec<Option<String>>,
    /// Per server, its connection's generation: what an earlier connection's reading thread
    /// still sends is told apart and dropped.
    generation: Vec<u32>,
    /// Per lost server: when to try it again, and the wait after that if it fails.
    retry: Vec<(Instant, Duration)>,
    /// Per server: a try to reach it again is under way.
    reviving: Vec<bool>,
    tx: mpsc::Sender<Raw>,
    rx: mpsc::Receiver<Raw>,
    seq: u32,
    /// Per server: the entries of its current list not yet delivered.
    outstanding: Vec<Vec<(BlockId, Priority)>>,
    /// Per server, the `BLOCK`s read from it so far: each `LIST` says so, and the server
    /// does not send again a block it sent after that count (it is on its way).
    got: Vec<u64>,
    /// Per block asked: servers tried and what they said.
    tried: HashMap<BlockId, Vec<(usize, String)>>,
    queued: VecDeque<Event>,
    /// Shared with every reading thread, those started before it was set too.
    on_block: Arc<OnceLock<OnBlock>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("dataset", &self.layout.dataset).finish()
    }
}

/// A session's two connections to a server: lists go out on one, blocks come back on the
/// other (blocking: TCP, TLS and HELLO, each within the connection wait).
fn open_links(peer: &Peer, opts: &ClientOptions) -> Result<(Binding, Binding), DpssError> {
    let session = session_id();
    let token = opts.token.clone().unwrap_or_default();
    let hello = |role: &str| msg::Hello {
        role: role.into(),
        session: session.clone(),
        token: token.clone(),
    };
    let (requests, _) = peer.open(&hello("requests"))?;
    let (blocks, _) = peer.open(&hello("blocks"))?;
    Ok((requests, blocks))
}

fn session_id() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS random source works");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Client {
    /// Look `dataset` up on the master at `master` and connect to its servers.
    pub fn open(master: &str, dataset: &str, opts: ClientOptions) -> Result<Self, DpssError> {
        let layout = lookup(master, dataset, &opts)?;
        Self::with_layout(layout, opts)
    }

    /// Connect to the servers of a layout already known. A server that cannot be reached is
    /// marked lost at once (its blocks come from copies elsewhere).
    pub fn with_layout(layout: Layout, opts: ClientOptions) -> Result<Self, DpssError> {
        let (tx, rx) = mpsc::channel();
        let n = layout.servers.len();
        let mut c = Self {
            layout,
            opts,
            links: (0..n).map(|_| None).collect(),
            dead: vec![None; n],
            generation: vec![0; n],
            retry: vec![(Instant::now(), RETRY_FIRST); n],
            reviving: vec![false; n],
            tx,
            rx,
            seq: 0,
            outstanding: vec![Vec::new(); n],
            got: vec![0; n],
            tried: HashMap::new(),
            queued: VecDeque::new(),
            on_block: Arc::default(),
        };
        for s in 0..n {
            if let Err(e) = c.connect(s) {
                tracing::warn!(server = %c.layout.servers[s].addr, error = %e, "block server unreachable");
                c.dead[s] = Some(e.to_string());
                c.retry[s] = (Instant::now() + RETRY_FIRST, RETRY_FIRST);
            }
        }
        if c.dead.iter().all(Option::is_some) {
            return Err(DpssError::Remote(format!(
                "no server of {:?} can be reached: {}",
                c.layout.dataset,
                c.dead[0].as_deref().unwrap_or_default()
            )));
        }
        Ok(c)
    }

    fn connect(&mut self, s: usize) -> Result<(), DpssError> {
        let peer = Peer::new(self.layout.servers[s].addr.clone(), self.opts.tls.clone());
        let (requests, blocks) = open_links(&peer, &self.opts)?;
        self.attach(s, requests, blocks)
    }

    /// Use `requests` and `blocks` as server `s`'s connections from now on: a thread reads
    /// the blocks, tagged with a new generation.
    fn attach(
        &mut self,
        s: usize,
        requests: Binding,
        mut blocks: Binding,
    ) -> Result<(), DpssError> {
        let tx = self.tx.clone();
        self.generation[s] += 1;
        let g = self.generation[s];
        let (on_block, dataset) = (self.on_block.clone(), self.layout.dataset.clone());
        thread::Builder::new().name(format!("dpss-client-{s}")).spawn(move || {
            loop {
                match blocks.recv() {
                    Ok(Some(m)) => {
                        let intact = match Message::parse(m.payload(), 0) {
                            Ok(Message::Block { id, dataset: d, digest: want, data, .. }) => {
                                let intact = d == dataset && digest(data) == want;
                                if let Some(f) = on_block.get().filter(|_| intact) {
                                    f(id, data, want);
                                }
                                intact
                            }
                            _ => true,
                        };
                        if tx.send(Raw::Msg(s, g, m, intact)).is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        let why = "the server closed the connection".into();
                        let _ = tx.send(Raw::Gone(s, g, why));
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Raw::Gone(s, g, DpssError::from(e).to_string()));
                        return;
                    }
                }
            }
        })?;
        self.links[s] = Some(Link { requests });
        Ok(())
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Have `f` called with each intact block as it is read, on the reading thread (see
    /// [`OnBlock`]); [`Client::next`] still gives every block out. Set once: false if it was
    /// set already.
    pub fn on_block(&self, f: OnBlock) -> bool {
        self.on_block.set(f).is_ok()
    }

    /// A handle that wakes this client's [`Client::next`].
    pub fn waker(&self) -> Waker {
        Waker(self.tx.clone())
    }

    /// Servers given up on, with why.
    pub fn lost_servers(&self) -> Vec<(usize, String)> {
        self.dead.iter().enumerate().filter_map(|(i, d)| d.clone().map(|d| (i, d))).collect()
    }

    /// Try again the lost servers whose wait is over: one that answers is used again, from a
    /// fresh session (it was restarted, or the network came back).
    fn revive(&mut self) {
        let now = Instant::now();
        for s in 0..self.links.len() {
            if self.dead[s].is_none() || self.reviving[s] || now < self.retry[s].0 {
                continue;
            }
            // Tried off this thread: a server that does not answer (its host down) must not
            // hold up the lists of the others for the connection's wait.
            let peer = Peer::new(self.layout.servers[s].addr.clone(), self.opts.tls.clone());
            let (opts, tx) = (self.opts.clone(), self.tx.clone());
            let tried = thread::Builder::new().name(format!("dpss-revive-{s}")).spawn(move || {
                let links = open_links(&peer, &opts).map(Box::new).map_err(|e| e.to_string());
                let _ = tx.send(Raw::Revived(s, links));
            });
            self.reviving[s] = tried.is_ok();
        }
    }

    /// What a try to reach lost server `s` again gave.
    fn revived(&mut self, s: usize, links: Result<Box<(Binding, Binding)>, String>) {
        self.reviving[s] = false;
        let now = Instant::now();
        match links.and_then(|l| self.attach(s, l.0, l.1).map_err(|e| e.to_string())) {
            Ok(()) => {
                tracing::info!(server = %self.layout.servers[s].addr, "block server back");
                self.dead[s] = None;
                self.got[s] = 0;
                self.outstanding[s].clear();
                self.retry[s] = (now, RETRY_FIRST);
            }
            Err(e) => {
                let wait = self.retry[s].1;
                self.dead[s] = Some(e);
                self.retry[s] = (now + wait, (wait * 2).min(RETRY_MOST));
            }
        }
    }

    /// Replace every server's list by this one (most urgent first): each block goes to its
    /// first copy on a server not lost (a lost one is tried again now and then). Returns the
    /// list number.
    pub fn request(&mut self, list: &[(BlockId, Priority)]) -> Result<u32, DpssError> {
        for (id, _) in list {
            if !self.layout.contains(*id) {
                return Err(DpssError::UnknownBlock {
                    dataset: self.layout.dataset.clone(),
                    block: id.to_string(),
                });
            }
        }
        // What has arrived is taken in first (a lost server back, blocks of the last list).
        let mut woken = false;
        while let Ok(raw) = self.rx.try_recv() {
            match raw {
                Raw::Wake => woken = true,
                raw => self.handle(raw),
            }
        }
        if woken {
            // Still owed to the next wait (a waker asked it to return at once).
            let _ = self.tx.send(Raw::Wake);
        }
        self.revive();
        self.seq += 1;
        self.tried.clear();
        let mut per: Vec<Vec<(BlockId, Priority)>> = vec![Vec::new(); self.links.len()];
        let mut lost = Vec::new();
        for &(id, p) in list {
            match self.pick(id) {
                Some(s) => per[s].push((id, p)),
                None => lost.push(id),
            }
        }
        for (s, entries) in per.into_iter().enumerate() {
            if self.dead[s].is_none() {
                self.send_list(s, entries);
            }
        }
        for id in lost {
            let ev = self.lost(id);
            self.queued.push_back(ev);
        }
        Ok(self.seq)
    }

    /// The first copy of `id` on a live server not yet tried for it.
    fn pick(&self, id: BlockId) -> Option<usize> {
        let tried = self.tried.get(&id);
        self.layout
            .locations(id)
            .into_iter()
            .map(|(s, _)| s)
            .find(|&s| self.dead[s].is_none() && !tried.is_some_and(|t| t.iter().any(|x| x.0 == s)))
    }

    fn send_list(&mut self, s: usize, entries: Vec<(BlockId, Priority)>) {
        let m = msg::list(self.seq, self.got[s], &self.layout.dataset, &entries);
        let res = match self.links[s].as_mut() {
            Some(l) => l.requests.send(&m).map_err(DpssError::from),
            None => Err(DpssError::Remote("not connected".into())),
        };
        self.outstanding[s] = entries.into_iter().filter(|(_, p)| *p != Priority::Low).collect();
        if let Err(e) = res {
            let _ = self.tx.send(Raw::Gone(s, self.generation[s], e.to_string()));
        }
    }

    /// Ask `ids` again from their next copies (after `s` failed them for `reason`).
    fn fail_over(&mut self, s: usize, ids: Vec<(BlockId, Priority)>, reason: &str) -> Vec<Event> {
        let mut events = Vec::new();
        let mut extra: HashMap<usize, Vec<(BlockId, Priority)>> = HashMap::new();
        for (id, p) in ids {
            self.tried.entry(id).or_default().push((s, reason.to_string()));
            match self.pick(id) {
                Some(t) => extra.entry(t).or_default().push((id, p)),
                None => events.push(self.lost(id)),
            }
        }
        for (t, more) in extra {
            // The replica's list is replaced by what it still owes plus these.
            let mut entries = std::mem::take(&mut self.outstanding[t]);
            let have: HashSet<BlockId> = entries.iter().map(|e| e.0).collect();
            entries.extend(more.into_iter().filter(|e| !have.contains(&e.0)));
            self.send_list(t, entries);
        }
        events
    }

    fn lost(&self, id: BlockId) -> Event {
        let reasons = self.tried.get(&id).map_or(String::new(), |t| {
            t.iter()
                .map(|(s, r)| format!("{}: {r}", self.layout.servers[*s].name))
                .collect::<Vec<_>>()
                .join("; ")
        });
        let reason =
            if reasons.is_empty() { "every server holding it is lost".into() } else { reasons };
        Event::Lost { id, reason }
    }

    /// The next event, waiting at most `wait` (`None` when nothing came).
    pub fn next(&mut self, wait: Duration) -> Option<Event> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(e) = self.queued.pop_front() {
                return Some(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Raw::Wake) => return self.queued.pop_front(),
                Ok(raw) => self.handle(raw),
                Err(_) => return None,
            }
        }
    }

    fn handle(&mut self, raw: Raw) {
        let (s, m, intact) = match raw {
            // From a connection since replaced: nothing to do with the current one.
            Raw::Gone(s, g, _) | Raw::Msg(s, g, ..) if g != self.generation[s] => return,
            Raw::Gone(s, _, reason) => return self.server_lost(s, reason),
            Raw::Revived(s, links) => return self.revived(s, links),
            Raw::Msg(s, _, m, intact) => (s, m, intact),
            Raw::Wake => return,
        };
        if self.dead[s].is_some() {
            return;
        }
        let parsed = match Message::parse(m.payload(), 0) {
            Ok(p) => p,
            Err(e) => return self.server_lost(s, e.to_string()),
        };
        match parsed {
            Message::Block { id, data, digest: want, .. } => {
                self.got[s] += 1;
                let prio = self.take_outstanding(s, id);
                if !intact {
                    let why = format!("block {id} arrived damaged (digest or data set mismatch)");
                    let ev = self.fail_over(s, vec![(id, prio.unwrap_or(Priority::High))], &why);
                    self.queued.extend(ev);
                    return;
                }
                let start = m.payload().len() - data.len();
                let data = BlockBytes { msg: m, start, digest: want };
                self.queued.push_back(Event::Block { id, data, server: s });
            }
            Message::Failed { seq, id, reason } => {
                // A late failure of an earlier list says nothing about the current one.
                if seq != self.seq {
                    return;
                }
                if let Some(p) = self.take_outstanding(s, id) {
                    let ev = self.fail_over(s, vec![(id, p)], reason);
                    self.queued.extend(ev);
                }
            }
            Message::Done { seq, stats } => {
                self.queued.push_back(Event::ListDone { server: s, seq, stats });
            }
            other => self.server_lost(s, format!("unexpected {other:?}")),
        }
    }

    fn take_outstanding(&mut self, s: usize, id: BlockId) -> Option<Priority> {
        let o = &mut self.outstanding[s];
        let i = o.iter().position(|e| e.0 == id)?;
        Some(o.remove(i).1)
    }

    fn server_lost(&mut self, s: usize, reason: String) {
        if self.dead[s].is_some() {
            return;
        }
        tracing::warn!(server = %self.layout.servers[s].addr, %reason, "block server lost");
        self.dead[s] = Some(reason.clone());
        self.retry[s] = (Instant::now() + RETRY_FIRST, RETRY_FIRST);
        if let Some(mut l) = self.links[s].take() {
            l.requests.shutdown_write();
        }
        self.queued.push_back(Event::ServerLost { server: s, reason: reason.clone() });
        let owed = std::mem::take(&mut self.outstanding[s]);
        let ev = self.fail_over(s, owed, &format!("server lost: {reason}"));
        self.queued.extend(ev);
    }

    /// Fetch `ids` (all high priority), waiting at most `wait` overall; fails naming the
    /// first block no copy could deliver.
    pub fn fetch(
        &mut self,
        ids: &[BlockId],
        wait: Duration,
    ) -> Result<HashMap<BlockId, BlockBytes>, DpssError> {
        let list: Vec<_> = ids.iter().map(|&id| (id, Priority::High)).collect();
        self.request(&list)?;
        let mut want: HashSet<BlockId> = ids.iter().copied().collect();
        let mut got = HashMap::with_capacity(want.len());
        let deadline = Instant::now() + wait;
        while !want.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left) {
                Some(Event::Block { id, data, .. }) => {
                    if want.remove(&id) {
                        got.insert(id, data);
                    }
                }
                Some(Event::Lost { id, reason }) if want.contains(&id) => {
                    return Err(DpssError::Unavailable { block: id.to_string(), reasons: reason });
                }
                Some(_) => {}
                None => {
                    return Err(DpssError::Remote(format!(
                        "{} of {} blocks did not arrive within {wait:?}",
                        want.len(),
                        ids.len()
                    )));
                }
            }
        }
        Ok(got)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        for l in self.links.iter_mut().flatten() {
            l.requests.shutdown_write();
        }
    }
}

/// How long a lookup waits for the master's answer once connected.
const LOOKUP_WAIT: Duration = Duration::from_secs(30);

/// A data set's layout from the master at `master` (host:port).
pub fn lookup(master: &str, dataset: &str, opts: &ClientOptions) -> Result<Layout, DpssError> {
    Lookups::new(master, opts)?.lookup(dataset)
}

/// Layouts asked of one master again and again (the web server's watcher asks every second):
/// one runtime and one connection for them all, connected again only after one failed.
pub struct Lookups {
    master: String,
    opts: ClientOptions,
    rt: tokio::runtime::Runtime,
    conn: Option<crate::master::MasterClient>,
}

impl Lookups {
    pub fn new(master: &str, opts: &ClientOptions) -> Result<Self, DpssError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DpssError::Master(format!("no runtime to ask the master: {e}")))?;
        Ok(Self { master: master.into(), opts: opts.clone(), rt, conn: None })
    }

    /// `dataset`'s layout now.
    pub fn lookup(&mut self, dataset: &str) -> Result<Layout, DpssError> {
        let Self { master, opts, rt, conn } = self;
        rt.block_on(async {
            let c = match conn {
                Some(c) => c,
                None => conn.insert(crate::master::connect(master, opts).await?),
            };
            let ask = c.lookup(bs_proto::DpssLookupRequest { dataset: dataset.into() });
            let answer = match tokio::time::timeout(LOOKUP_WAIT, ask).await {
                Ok(Ok(l)) => l.into_inner(),
                Ok(Err(s)) => {
                    // The master's own answer keeps the connection; anything else may have
                    // broken it.
                    if s.code() != tonic::Code::NotFound {
                        *conn = None;
                    }
                    return Err(s.into());
                }
                Err(_) => {
                    *conn = None;
                    return Err(DpssError::Master(format!(
                        "the master at {master} did not answer within {LOOKUP_WAIT:?}"
                    )));
                }
            };
            Layout::try_from(answer)
        })
    }
}

/// Run `f` to completion from blocking code (a runtime of its own on this thread).
pub fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds")
        .block_on(f)
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::Mutex;

    use bs_binding::Role;
    use bs_transport::Conn;

    use super::*;
    use crate::layout::ServerRef;

    /// A block server that answers the first list with three blocks of `img`: one intact, one
    /// whose bytes do not match its digest, and one that says it is of another data set.
    fn lying_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        thread::spawn(move || {
            // The blocks go out once the list is in.
            let (listed_tx, listed_rx) = mpsc::channel::<()>();
            let (mut listed_tx, mut listed_rx) = (Some(listed_tx), Some(listed_rx));
            let mut kept = Vec::new();
            for tcp in listener.incoming().take(2) {
                let mut b = crate::conn::binding(Conn::new(tcp.unwrap()), Role::Responder, 0);
                let m = b.recv().unwrap().unwrap();
                let Ok(Message::Hello(h)) = Message::parse(m.payload(), 0) else { panic!() };
                let w = msg::Welcome { name: "liar".into(), disks: 1, max_list: 64, max_block: 64 };
                b.send(&msg::welcome(&w)).unwrap();
                let (tx, rx) = match h.role.as_str() {
                    "requests" => (listed_tx.take(), None),
                    _ => (None, listed_rx.take()),
                };
                kept.push(thread::spawn(move || {
                    if h.role == "requests" {
                        let _list = b.recv().unwrap().unwrap();
                        drop(tx);
                        while let Ok(Some(_)) = b.recv() {}
                        return;
                    }
                    let _ = rx.expect("one blocks connection").recv();
                    let mut block = |x: u32, data: &[u8], sum: &[u8], set: &str| {
                        let id = BlockId::new(0, x, 0);
                        let head = msg::block_head(1, id, data.len(), &digest(sum), set);
                        b.send_parts(&head, data).unwrap();
                    };
                    block(0, b"tile 0", b"tile 0", "img");
                    block(1, b"tile 1, rotted", b"tile 1", "img");
                    block(2, b"tile 2", b"tile 2", "other");
                    while let Ok(Some(_)) = b.recv() {}
                }));
            }
            for k in kept {
                let _ = k.join();
            }
        });
        addr
    }

    #[test]
    fn on_block_sees_only_intact_blocks_of_the_data_set() {
        let servers = vec![ServerRef { name: "liar".into(), addr: lying_server(), disks: 1 }];
        let layout = Layout::plan("img", "image", (768, 256), 256, servers, 1).unwrap();
        let mut c = Client::with_layout(layout, ClientOptions::default()).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        assert!(
            c.on_block(Arc::new(move |id, data, _| s.lock().unwrap().push((id, data.to_vec()))))
        );
        assert!(!c.on_block(Arc::new(|_, _, _| {})), "set once");
        let ids: Vec<_> = (0..3).map(|x| (BlockId::new(0, x, 0), Priority::High)).collect();
        c.request(&ids).unwrap();
        let (mut blocks, mut lost) = (Vec::new(), Vec::new());
        while blocks.len() + lost.len() < 3 {
            match c.next(Duration::from_secs(10)).expect("an event") {
                Event::Block { id, .. } => blocks.push(id),
                Event::Lost { id, .. } => lost.push(id),
                _ => {}
            }
        }
        assert_eq!(blocks, [BlockId::new(0, 0, 0)]);
        assert_eq!(lost, [BlockId::new(0, 1, 0), BlockId::new(0, 2, 0)]);
        assert_eq!(*seen.lock().unwrap(), [(BlockId::new(0, 0, 0), b"tile 0".to_vec())]);
    }
}
