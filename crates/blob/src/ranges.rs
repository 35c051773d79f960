//! One blob over several connections at once (GridFTP's MODE E): a remote blob pulled into a
//! local file as ranges over N data connections, written in place at their offsets — or a
//! local file pushed to a server as N ranges of one upload (see [`push`]).
//!
//! - **How many:** [`Options::connections`]; 0 lets the copy choose: one connection for blobs
//!   under [`AUTO_MIN_SIZE`] or a server nearer than [`AUTO_MIN_RTT`] (a control-plane round
//!   trip, timed), else [`AUTO_CONNECTIONS`] — on a near server one connection already runs at
//!   the disk's or the CPU's speed, on a far one a single TCP window cannot fill the link.
//! - **Ranges:** aligned to the server's 1 MiB chunks (its DATA frames then stay whole). A
//!   push has one per connection, equal. A pull cuts the blob into ranges of at least
//!   [`PULL_RANGE`] (at least one per connection) that the connections take in order, so that
//!   they fill the file from its start and the digest of the whole follows close behind.
//! - **Pieces:** a pull asks for a range in pieces of at most [`PIECE`], each asked for on the
//!   same connection while the ones before it arrive (`Client::ask_after`, in band), the next
//!   range's first pieces too: about four round trips of the connection's rate stay asked for
//!   and unread ([`MIN_AHEAD`] at least), so the server never waits for a request and the
//!   connection keeps its window. Each piece's SUM frame checks that piece's bytes.
//! - **Splits:** a connection out of work takes over the second half of the rest of another
//!   range, in halves of at least [`SPLIT_MIN`], once the range's held bytes are checked:
//!   for a pull, of the rest its connection has not asked for yet, so nothing is cut short;
//!   for a push, of the longest rest, which the push sends up to its new end and closes with
//!   the SUM of what it sent. Without splits a copy over a lossy far link ends on its slowest
//!   connection alone: one whose window a loss halved ran the last tens of megabytes at a
//!   third of the link (measured, 8 connections, 50 ms, 0.01 % loss).
//! - **A dropped connection** (I/O error, timeout, peer gone) costs a new connection, not
//!   the copy: the bytes its ranges hold are checked against the server's digest of the same
//!   ranges (`RangeDigest`), and each continues after them, or starts over when they differ.
//!   At most [`ATTEMPTS`] connections per connection slot (a push: per range). A piece asked
//!   ahead that a busy server turns away ends its connection too, with every piece before it
//!   checked: the next is asked for the usual way, which waits while the server is busy.
//! - **Resume:** the ranges' progress is kept next to the part file, in
//!   `<dest>.blobstream-ranges` (text: a header line `blobstream-ranges 1 <digest> <size>`,
//!   then `<start> <end> <done>` per range, splits included; written to a temporary file and
//!   renamed). A later copy with `resume` takes the ranges it records, over the connections
//!   it is asked for now, and checks every range's bytes the same way before trusting them.
//!   A part file left by a one-connection copy, with no ranges file, counts as its
//!   contiguous prefix.
//! - **A resumed push** needs no file of its own: the upload routed again with the same
//!   resume tag keeps what the interrupted push stored; of each range, the leading 1 MiB
//!   pieces whose digests on the server (`RangeDigest` with `upload`, one call per range)
//!   equal ours are kept, and the range is pushed from the first that differs. The commit
//!   still checks every chunk against ours.
//! - **A push commits** with the digest of the whole file and its 1 MiB chunk digests, both
//!   computed from one copy of each piece: the server makes the upload the blob only if every
//!   chunk it holds equals ours (its range writers hashed them as they wrote them; only
//!   chunks none saw whole are read back), and keeps our digest of the whole.
//! - **End to end:** while the ranges arrive, a hasher follows the contiguous prefix written
//!   so far and digests the whole file in order; at the end it must equal the digest the
//!   server stored at commit, or the copy fails and its part file is discarded. When a
//!   range's bytes failed their check and were pulled again, the file is digested once more
//!   from the start instead (the hasher may have read the bytes that were replaced).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bs_client::{BlobInfo, Client, ClientError};
use bs_store::digest_file_range;
use bs_wire::{ChunkDigests, ChunkHasher, Digest, DigestAlgo};

use crate::error::BlobError;
use crate::options::{Deadline, Options};
use crate::transporter::IO_WAIT;

type Result<T> = std::result::Result<T, BlobError>;

/// Blobs smaller than this go over one connection unless more are asked for.
pub const AUTO_MIN_SIZE: u64 = 64 << 20;
/// A server answering faster than this is near: one connection.
pub const AUTO_MIN_RTT: Duration = bs_client::FAR_RTT;
/// Connections an automatic choice uses for a far server.
pub const AUTO_CONNECTIONS: usize = 4;
/// Most connections one copy opens.
pub const MAX_CONNECTIONS: usize = 32;
/// Connections one pushed range, or one of a pull's connections and the ranges it has, may
/// take: the first, and new ones after dropped ones.
pub const ATTEMPTS: usize = 4;
/// Range boundaries fall on the server's chunk boundaries.
const ALIGN: u64 = 1 << 20;
/// A range is split only if each half would be at least this long: a connection taking over
/// half of another's rest pays a request's round trip before its first byte.
const SPLIT_MIN: u64 = 2 << 20;
/// A pull cuts a blob into ranges of at least this much (more than one per connection, so
/// that they fill the file from its start, in order; see [`pull_ranges_for`]).
const PULL_RANGE: u64 = 16 << 20;
/// A pull asks for a range in pieces of at most this much, ahead of what it has read.
const PIECE: u64 = ALIGN;
/// The least a pull keeps asked for and not yet read ([`ahead`]).
const MIN_AHEAD: u64 = 4 << 20;
/// Most ranges a pull is cut into, splits included (and a ranges file may record).
const MAX_RANGES: usize = 1024;
/// How often progress is reported and the ranges file rewritten.
const TICK: Duration = Duration::from_millis(200);

/// The file that keeps a parallel pull's progress between runs.
pub fn ranges_path(dest: &Path) -> PathBuf {
    let mut p = dest.as_os_str().to_owned();
    p.push(RANGES_SUFFIX);
    PathBuf::from(p)
}

/// What [`ranges_path`] adds to a destination's name.
pub const RANGES_SUFFIX: &str = ".blobstream-ranges";

/// How many connections to move `size` bytes of blob `name` over: `asked` (capped by the
/// blob's chunks and [`MAX_CONNECTIONS`]), or for 0 the automatic choice described at the top
/// of this file (the round trip: the client's quickest `Stat` so far — a pull has just made
/// one of `name` — or else one of `name` timed now, answered or not).
pub(crate) fn connections(client: &Client, name: &str, size: u64, asked: usize) -> usize {
    let most = size.div_ceil(ALIGN).clamp(1, MAX_CONNECTIONS as u64) as usize;
    match asked {
        0 if size < AUTO_MIN_SIZE => 1,
        0 => {
            if client.round_trip().is_none() {
                let _ = client.stat(name); // timed by the client, found or not
            }
            match client.round_trip() {
                Some(rtt) if rtt >= AUTO_MIN_RTT => AUTO_CONNECTIONS.min(most),
                _ => 1,
            }
        }
        n => n.min(most),
    }
}

/// `client` for each of the `n` connections of one transfer: a pace it asked for
/// (`pace:RATE`) is the whole transfer's rate, so each connection keeps to its share.
fn pace_shared(client: &Client, n: usize) -> Client {
    match shares(&client.settings().layers, n) {
        Some(layers) => {
            let settings = bs_client::TransferSettings { layers, ..client.settings().clone() };
            client.clone().with_settings(settings)
        }
        None => client.clone(),
    }
}

/// `layers` with each pace cut to its share of `n` connections (`None` when none paces).
fn shares(layers: &[bs_binding::LayerSpec], n: usize) -> Option<Vec<bs_binding::LayerSpec>> {
    use bs_binding::LayerSpec::Pace;
    layers.iter().any(|l| matches!(l, Pace(_))).then(|| {
        let share = |rate: &u64| Pace((rate / n.max(1) as u64).max(1));
        layers.iter().map(|l| if let Pace(r) = l { share(r) } else { *l }).collect()
    })
}

/// How many range workers have finished; the thread waiting for them wakes as the last one
/// ends, not at its next progress tick.
#[derive(Default)]
struct Finished {
    count: Mutex<usize>,
    all: Condvar,
}

impl Finished {
    fn one(&self) {
        *self.count.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.all.notify_all();
    }

    /// Count a worker finished when the returned guard drops — also if it panics, which
    /// cancels the others (the copy then fails instead of waiting for it forever).
    fn on_end<'a>(&'a self, cancel: &'a AtomicBool) -> OnEnd<'a> {
        OnEnd { finished: self, cancel }
    }

    /// Wait until `n` workers have finished or `tick` has passed; whether all have.
    fn wait(&self, n: usize, tick: Duration) -> bool {
        let count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        let (count, _) = self
            .all
            .wait_timeout_while(count, tick, |c| *c < n)
            .unwrap_or_else(PoisonError::into_inner);
        *count >= n
    }
}

/// See [`Finished::on_end`].
struct OnEnd<'a> {
    finished: &'a Finished,
    cancel: &'a AtomicBool,
}

impl Drop for OnEnd<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.cancel.store(true, Ordering::Release);
        }
        self.finished.one();
    }
}

/// One range of the blob and how much of it is in the file.
#[derive(Debug)]
struct Range {
    start: u64,
    /// Where it ends; moved down, never below what is written, when another connection
    /// takes over the second half of its rest ([`Ranges::split`]).
    end: AtomicU64,
    /// Bytes from `start` written to the file (checked or not yet).
    done: AtomicU64,
    /// Whether bytes held from an earlier run have been checked (the hasher waits for it).
    checked: AtomicBool,
    /// Whether a connection has taken it.
    claimed: AtomicBool,
    /// Bytes from `start` its connection has asked the server for (a pull asks ahead of what
    /// it has written; a split leaves them to it). Never less than `done` on a pull.
    asked: AtomicU64,
    /// Held while bytes are written into it and while it is split, so nothing is written
    /// past an end that moved.
    writing: Mutex<()>,
}

impl Range {
    fn new(start: u64, end: u64, held: u64) -> Self {
        Self {
            start,
            end: AtomicU64::new(end),
            done: AtomicU64::new(held),
            checked: AtomicBool::new(held == 0),
            claimed: AtomicBool::new(false),
            asked: AtomicU64::new(held),
            writing: Mutex::new(()),
        }
    }

    fn end(&self) -> u64 {
        self.end.load(Ordering::Acquire)
    }

    fn len(&self) -> u64 {
        self.end() - self.start
    }

    /// Bytes nobody has asked the server for yet: what a split may take over.
    fn unasked(&self) -> u64 {
        let asked = self.asked.load(Ordering::Acquire).max(self.done.load(Ordering::Acquire));
        self.len().saturating_sub(asked)
    }

    /// Ask for the next at most `most` bytes of the range, if any are left to ask for:
    /// (blob offset, length), ending on a chunk boundary unless at the range's end.
    fn ask(&self, most: u64) -> Option<(u64, u64)> {
        let _w = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let at = self.start + self.asked.load(Ordering::Acquire);
        let end = self.end();
        if at >= end {
            return None;
        }
        let to = if most >= end - at { end } else { (at + most).next_multiple_of(ALIGN).min(end) };
        self.asked.store(to - self.start, Ordering::Release);
        Some((at, to - at))
    }
}

/// The ranges of one parallel pull, in order, covering the blob: fixed at the start, then
/// split as connections run out of work (see the top of this file).
#[derive(Debug)]
struct Ranges {
    list: Mutex<Vec<Arc<Range>>>,
    /// Ranges split so far.
    splits: AtomicUsize,
}

impl Ranges {
    fn new(list: Vec<Range>) -> Self {
        Self { list: Mutex::new(list.into_iter().map(Arc::new).collect()), splits: 0.into() }
    }

    fn all(&self) -> Vec<Arc<Range>> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Every range's (start, end, done), read under the lock a split holds: one after the
    /// other with no gap, whatever splits run meanwhile.
    fn snapshot(&self) -> Vec<(u64, u64, u64)> {
        let list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        list.iter().map(|r| (r.start, r.end(), r.done.load(Ordering::Acquire))).collect()
    }

    /// The first range no connection has taken, now taken.
    fn claim(&self) -> Option<Arc<Range>> {
        let list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        list.iter().find(|r| !r.claimed.swap(true, Ordering::AcqRel)).cloned()
    }

    /// The range holding byte `at`.
    fn holding(&self, at: u64) -> Arc<Range> {
        let list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        let i = list.partition_point(|r| r.start <= at).saturating_sub(1);
        list[i].clone()
    }

    /// Take over the second half of the unasked rest of the range with the most of it, if
    /// each half would be at least [`SPLIT_MIN`]: that range now ends where the new one,
    /// returned taken, begins (on a chunk boundary).
    fn split(&self) -> Option<Arc<Range>> {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        if list.len() >= MAX_RANGES {
            return None;
        }
        let (i, victim) = list
            .iter()
            .enumerate()
            .filter(|(_, r)| r.checked.load(Ordering::Acquire))
            .max_by_key(|(_, r)| r.unasked())?;
        let victim = victim.clone();
        let _w = victim.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let asked = victim.asked.load(Ordering::Acquire).max(victim.done.load(Ordering::Acquire));
        let (at, end) = (victim.start + asked, victim.end());
        if end.saturating_sub(at) < 2 * SPLIT_MIN {
            return None;
        }
        let mid = (at + (end - at) / 2).next_multiple_of(ALIGN);
        victim.end.store(mid, Ordering::Release);
        let taken = Arc::new(Range::new(mid, end, 0));
        taken.claimed.store(true, Ordering::Release);
        list.insert(i + 1, taken.clone());
        self.splits.fetch_add(1, Ordering::Relaxed);
        Some(taken)
    }

    /// [`Ranges::split`], waiting while a range that could be split has its held bytes still
    /// being checked (its rest is not known yet); `None` once none is left to split or
    /// `cancelled` says so.
    fn split_when_checked(&self, cancelled: impl Fn() -> bool) -> Option<Arc<Range>> {
        loop {
            if cancelled() {
                return None;
            }
            if let Some(taken) = self.split() {
                return Some(taken);
            }
            if self.all().iter().all(|r| r.checked.load(Ordering::Acquire)) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Bytes written into every range.
    fn done(&self) -> u64 {
        self.all().iter().map(|r| r.done.load(Ordering::Acquire)).sum()
    }
}

/// How many ranges a pull of `size` bytes over `n` connections cuts the blob into: one per
/// [`PULL_RANGE`], at least `n`, at most half of [`MAX_RANGES`] (room for splits).
fn pull_ranges_for(size: u64, n: usize) -> usize {
    let by_size = usize::try_from(size.div_ceil(PULL_RANGE)).unwrap_or(usize::MAX);
    by_size.clamp(n.max(1), (MAX_RANGES / 2).max(n))
}

/// `size` bytes cut into `n` ranges of whole chunks (the last may be shorter or empty ranges
/// dropped).
fn split(size: u64, n: usize) -> Vec<(u64, u64)> {
    let chunks = size.div_ceil(ALIGN).max(1);
    let per = chunks.div_ceil(n as u64) * ALIGN;
    (0..n as u64)
        .map(|i| ((i * per).min(size), ((i + 1) * per).min(size)))
        .filter(|(s, e)| s < e || (size == 0 && *s == 0))
        .take(if size == 0 { 1 } else { n })
        .collect()
}

/// The ranges the ranges file records — (start, end, done) each — if it is about this blob
/// (`digest`, `size`) and they cover it exactly, one after the other.
/// Whether an interrupted parallel pull of the blob (`digest`, `size`) into `dest` left its
/// ranges: a resumed copy takes them, however many connections it would choose now.
pub(crate) fn recorded(dest: &Path, digest: &str, size: u64) -> bool {
    read_ranges(&ranges_path(dest), digest, size).is_some()
}

fn read_ranges(path: &Path, digest: &str, size: u64) -> Option<Vec<(u64, u64, u64)>> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    if lines.next()? != format!("blobstream-ranges 1 {digest} {size}") {
        return None;
    }
    let mut at = 0;
    let mut out = Vec::new();
    for line in lines {
        let v: Vec<u64> = line.split(' ').map(|f| f.parse().ok()).collect::<Option<_>>()?;
        let [s, e, done] = v[..] else { return None };
        if s != at || e < s || e > size || done > e - s || out.len() >= MAX_RANGES {
            return None;
        }
        out.push((s, e, done));
        at = e;
    }
    (at == size && !out.is_empty()).then_some(out)
}

/// Record the ranges' progress: a temporary file renamed over the old one, so a crash leaves
/// one or the other whole.
fn write_ranges(path: &Path, digest: &str, size: u64, ranges: &Ranges) -> Result<()> {
    let mut text = format!("blobstream-ranges 1 {digest} {size}\n");
    for (start, end, done) in ranges.snapshot() {
        text.push_str(&format!("{start} {end} {done}\n"));
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| BlobError::file(path, e))
}

/// What to report from the ranges' results: their values, or the first failure that is not a
/// range giving up because another one failed ([`BlobError::Lost`]).
fn all_or_first_failure<T>(results: Vec<Result<T>>) -> Result<Vec<T>> {
    let (mut values, mut failure, mut lost) = (Vec::new(), None, false);
    for r in results {
        match r {
            Ok(v) => values.push(v),
            Err(BlobError::Lost) => lost = true,
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    match (failure, lost) {
        (Some(e), _) => Err(e),
        (None, true) => Err(BlobError::Lost),
        (None, false) => Ok(values),
    }
}

/// What a parallel pull did.
pub(crate) struct Pulled {
    pub moved: u64,
    pub resumed_from: u64,
    pub connections: usize,
    pub reconnects: usize,
    /// Ranges split so that a connection done with its own took over half of another's rest.
    pub splits: usize,
}

/// Pull all of `info` into `file` (the part file of `dest`) over `n` connections.
pub(crate) fn pull(
    client: &Client,
    info: &BlobInfo,
    file: &File,
    dest: &Path,
    n: usize,
    deadline: &Deadline,
    o: &Options,
) -> Result<Pulled> {
    let client = &pace_shared(client, n);
    let whole: Digest = info.digest.parse().map_err(|e| {
        BlobError::Remote(ClientError::Protocol(format!("blob {} has digest {e}", info.name)))
    })?;
    let part = crate::proxy::part_path(dest);
    let size = info.size;
    let sidecar = ranges_path(dest);
    let len = file.metadata().map_err(|e| BlobError::file(&part, e))?.len();
    let recorded = if o.resume { read_ranges(&sidecar, &info.digest, size) } else { None };
    let (bounds, held): (Vec<(u64, u64)>, Vec<u64>) = match recorded {
        Some(r) => r.into_iter().map(|(s, e, done)| ((s, e), done)).unzip(),
        None => {
            let bounds = split(size, pull_ranges_for(size, n));
            // A one-connection copy's part file (no ranges file): its bytes are a prefix.
            // A ranges file about something else: nothing is known, start over.
            let held = if o.resume && !sidecar.exists() {
                bounds.iter().map(|&(s, e)| len.clamp(s, e) - s).collect()
            } else {
                vec![0; bounds.len()]
            };
            (bounds, held)
        }
    };
    // `n` connections (fewer for fewer ranges), each taking ranges in order as it goes.
    let workers = n.clamp(1, MAX_CONNECTIONS).min(bounds.len());
    let ranges = Ranges::new(
        bounds.iter().zip(&held).map(|(&(start, end), &h)| Range::new(start, end, h)).collect(),
    );
    file.set_len(size).map_err(|e| BlobError::file(&part, e))?;
    write_ranges(&sidecar, &info.digest, size, &ranges)?;
    let cancel = AtomicBool::new(false);
    let rehash = AtomicBool::new(false);
    let finished = Finished::default();
    let report = |done: u64| {
        if let Some(p) = &o.progress {
            p(done, size);
        }
    };
    let job = Job {
        client,
        info,
        file,
        part: &part,
        algo: whole.algo,
        cancel: &cancel,
        rehash: &rehash,
        deadline,
    };
    let (results, digest) = std::thread::scope(|s| {
        let hasher = s.spawn(|| follow(&job, &ranges, size));
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let (job, finished, ranges) = (&job, &finished, &ranges);
                s.spawn(move || {
                    let _end = finished.on_end(job.cancel);
                    let res = pull_ranges(job, ranges);
                    if res.is_err() {
                        job.cancel.store(true, Ordering::Release);
                    }
                    res
                })
            })
            .collect();
        let mut last_write = Instant::now();
        while !finished.wait(workers, TICK) {
            report(ranges.done());
            if deadline.check().is_err() {
                cancel.store(true, Ordering::Release);
            }
            if last_write.elapsed() >= Duration::from_secs(1) {
                let _ = write_ranges(&sidecar, &info.digest, size, &ranges);
                last_write = Instant::now();
            }
        }
        let results: Vec<Result<Kept>> =
            handles.into_iter().map(|w| w.join().unwrap_or(Err(BlobError::Lost))).collect();
        cancel.store(true, Ordering::Release);
        (results, hasher.join().unwrap_or(Err(BlobError::Lost)))
    });
    write_ranges(&sidecar, &info.digest, size, &ranges)?;
    deadline.check()?;
    // The first failure that is not another range giving up because of it.
    let kept = all_or_first_failure(results)?;
    let reconnects = kept.iter().map(|k| k.reconnects).sum();
    let kept: u64 = kept.iter().map(|k| k.bytes).sum();
    let ours = match digest?.ok_or(BlobError::Lost)? {
        // Bytes the hasher read were replaced: digest what the file holds now.
        _ if rehash.load(Ordering::Acquire) => {
            digest_file_range(file, 0, size, whole.algo).map_err(|e| BlobError::file(&part, e))?
        }
        d => d,
    };
    if ours != whole {
        return Err(BlobError::Remote(ClientError::ChecksumMismatch {
            expected: whole.to_string(),
            actual: ours.to_string(),
        }));
    }
    report(size);
    let _ = std::fs::remove_file(&sidecar);
    let splits = ranges.splits.load(Ordering::Relaxed);
    Ok(Pulled { moved: size - kept, resumed_from: kept, connections: workers, reconnects, splits })
}

/// Whether a range's failure is the connection's (worth a new one) rather than the blob's.
fn connection_failed(e: &BlobError) -> bool {
    matches!(e, BlobError::Remote(c) if c.is_connection_lost())
}

/// What every range of one parallel pull shares.
struct Job<'a> {
    client: &'a Client,
    info: &'a BlobInfo,
    file: &'a File,
    part: &'a Path,
    algo: DigestAlgo,
    cancel: &'a AtomicBool,
    /// Set when bytes held in the file failed their check and were pulled again.
    rehash: &'a AtomicBool,
    deadline: &'a Deadline,
}

impl Job<'_> {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    fn file_error(&self, e: std::io::Error) -> BlobError {
        BlobError::file(self.part, e)
    }
}

/// What a connection's finished ranges kept from an earlier run, and how often it
/// reconnected.
#[derive(Default)]
struct Kept {
    bytes: u64,
    reconnects: usize,
}

/// One connection's work ([`Worker::pull`]); on a new connection after a dropped one, at
/// most [`ATTEMPTS`] connections in all.
fn pull_ranges(j: &Job, ranges: &Ranges) -> Result<Kept> {
    let mut w = Worker { mine: Vec::new(), kept: Kept::default() };
    loop {
        if j.cancelled() {
            return Err(BlobError::Lost);
        }
        match w.pull(j, ranges) {
            Ok(Ended::All) => return Ok(w.kept),
            // Every piece before the refused one was read whole and checked: the rest from
            // there, its first request the usual way (which waits while the server is busy).
            Ok(Ended::TurnedAway) => {}
            // A dropped connection: the rest on a new one.
            Err(e)
                if connection_failed(&e)
                    && w.kept.reconnects + 1 < ATTEMPTS
                    && j.deadline.check().is_ok() =>
            {
                tracing::warn!(
                    blob = %j.info.name, "a range connection failed, continuing on a new one: {e}"
                );
                w.kept.reconnects += 1;
                // What the pieces under way wrote is checked like bytes held from an earlier
                // run, and pulled again if it is not the server's.
                for r in &w.mine {
                    check_held(j, r)?;
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// How [`Worker::pull`] ended.
enum Ended {
    /// Nothing is left to take.
    All,
    /// A busy server turned away a piece asked ahead (before any of its bytes).
    TurnedAway,
}

/// One connection's ranges: those it took (claimed in order, or split off another's rest)
/// and has not finished, and what it kept from an earlier run.
struct Worker {
    mine: Vec<Arc<Range>>,
    kept: Kept,
}

impl Worker {
    /// Pull ranges over one connection and write them in place: the ranges nobody has taken,
    /// in order, then halves of others' unasked rests while they are long enough.
    ///
    /// Each range goes in pieces of at most [`PIECE`], each asked for on the same connection
    /// while the ones before it arrive ([`Client::ask_after`]) — the next range's first
    /// pieces too, before this one's last — so that about [`ahead`] bytes are asked for and
    /// not yet read: the server never waits for a request, the connection never idles, and a
    /// connection done with its work can take over what another has not asked for yet
    /// without cutting it short. The ranges, taken in order, fill the file from its start, so
    /// the digest of the whole follows close behind. A connection that takes no requests
    /// ahead (an older server, or one that keeps no connection) asks for a range's whole rest
    /// at once. Every piece's bytes are checked against its SUM as it ends.
    fn pull(&mut self, j: &Job, ranges: &Ranges) -> Result<Ended> {
        let c = j.client.within(j.deadline.left(IO_WAIT));
        // Whatever was asked on a connection before this one died with it.
        for r in &self.mine {
            r.asked.store(r.done.load(Ordering::Acquire), Ordering::Release);
        }
        let mut whole_rest = false;
        let mut buf = vec![0u8; 1 << 20];
        let mut rate = Rate::new();
        loop {
            let most = if whole_rest { u64::MAX } else { PIECE };
            let Some((r, at, len)) = self.next_piece(j, ranges, most, true)? else {
                return Ok(Ended::All);
            };
            let mut pull = c.open_pull(&j.info.name, at, Some(len))?;
            whole_rest |= !c.takes_asks(&pull);
            let round_trip = pull.round_trip().unwrap_or(Duration::ZERO);
            // The pieces asked on this connection and not yet read through, in order.
            let mut asked = std::collections::VecDeque::from([r]);
            let mut unread = len;
            loop {
                same_blob(j, &pull)?;
                pull.set_io_timeout(j.deadline.left(IO_WAIT))?;
                let r = asked.front().cloned().expect("the piece being read");
                loop {
                    if j.cancelled() {
                        return Err(BlobError::Lost);
                    }
                    let want = ahead(rate.per_second(), round_trip);
                    while !whole_rest
                        && unread < want
                        && let Some((r, at, len)) = self.next_piece(j, ranges, PIECE, false)?
                    {
                        c.ask_after(&mut pull, at, len)?;
                        asked.push_back(r);
                        unread += len;
                    }
                    let n = pull.read(&mut buf)?;
                    if n == 0 {
                        break; // read verified the piece's digest
                    }
                    let at = pull.offset() + pull.position() - n as u64;
                    j.file.write_all_at(&buf[..n], at).map_err(|e| j.file_error(e))?;
                    bs_store::start_writeback(j.file, at, n as u64);
                    r.done.fetch_add(n as u64, Ordering::AcqRel);
                    unread -= n as u64;
                    rate.add(n as u64);
                }
                asked.pop_front();
                if pull.asked_after() == 0 {
                    break;
                }
                pull = match c.next_asked(pull) {
                    Err(ClientError::Rpc { code: tonic::Code::Unavailable, .. }) => {
                        return Ok(Ended::TurnedAway);
                    }
                    next => next?,
                };
            }
        }
    }

    /// The next piece to ask for, of at most `most` bytes: (its range, blob offset, length)
    /// — the rest of a range this connection has, else the next range nobody has taken (its
    /// held bytes checked first), else the second half of another's unasked rest. `idle`:
    /// nothing is under way on this connection, so it waits while ranges that could be split
    /// are still being checked; else it does not wait.
    fn next_piece(
        &mut self,
        j: &Job,
        ranges: &Ranges,
        most: u64,
        idle: bool,
    ) -> Result<Option<(Arc<Range>, u64, u64)>> {
        loop {
            if let Some(p) = self.mine.iter().find_map(|r| r.ask(most).map(|(a, l)| (r, a, l))) {
                return Ok(Some((p.0.clone(), p.1, p.2)));
            }
            self.mine.retain(|r| r.done.load(Ordering::Acquire) < r.len());
            let taken = match ranges.claim() {
                Some(r) => {
                    check_held(j, &r)?;
                    let held = r.done.load(Ordering::Acquire);
                    r.asked.store(held, Ordering::Release);
                    self.kept.bytes += held;
                    r
                }
                None if idle => match ranges.split_when_checked(|| j.cancelled()) {
                    Some(r) => r,
                    None => return Ok(None),
                },
                None => match ranges.split() {
                    Some(r) => r,
                    None => return Ok(None),
                },
            };
            self.mine.push(taken);
        }
    }
}

/// Keep the bytes the file holds of `r` only if they are the server's: same digest.
fn check_held(j: &Job, r: &Range) -> Result<()> {
    let held = r.done.load(Ordering::Acquire);
    if held == 0 {
        return Ok(());
    }
    let ours = digest_file_range(j.file, r.start, held, j.algo).map_err(|e| j.file_error(e))?;
    if j.client.range_digest(&j.info.name, r.start, held, j.algo)? != ours {
        r.done.store(0, Ordering::Release);
        j.rehash.store(true, Ordering::Release);
    }
    r.checked.store(true, Ordering::Release);
    Ok(())
}

/// The pull `pull` must be of the blob being copied, not one that replaced it meanwhile.
fn same_blob(j: &Job, pull: &bs_client::PullStream) -> Result<()> {
    if pull.info().digest != j.info.digest {
        return Err(BlobError::NotFound(format!(
            "blob {} changed while it was being copied; copy it again",
            j.info.name
        )));
    }
    Ok(())
}

/// Bytes a connection keeps asked for and not yet read: more than the server has written
/// ahead of the reader when it ends a piece (the path's data in flight, about two round trips
/// of the connection's rate, and its unsent bytes) plus a request's way there, so the server
/// always finds the next request waiting; at least [`MIN_AHEAD`], and whole chunks.
fn ahead(bytes_per_second: f64, round_trip: Duration) -> u64 {
    let in_flight = bytes_per_second * round_trip.as_secs_f64() * 4.0;
    (in_flight as u64).max(MIN_AHEAD).next_multiple_of(ALIGN)
}

/// A connection's receiving rate: the highest of its last [`Rate::KEPT`] rates over
/// [`Rate::WINDOW`] each (reads come in bursts, and two connections trade the link back and
/// forth: a low reading taken for the rate would let the server run out of requests).
struct Rate {
    since: Instant,
    bytes: u64,
    recent: [f64; Rate::KEPT],
    next: usize,
}

impl Rate {
    const WINDOW: Duration = Duration::from_millis(200);
    const KEPT: usize = 5;

    fn new() -> Self {
        Self { since: Instant::now(), bytes: 0, recent: [0.0; Self::KEPT], next: 0 }
    }

    fn add(&mut self, n: u64) {
        self.bytes += n;
        let t = self.since.elapsed();
        if t >= Self::WINDOW {
            self.recent[self.next] = self.bytes as f64 / t.as_secs_f64();
            self.next = (self.next + 1) % Self::KEPT;
            self.since = Instant::now();
            self.bytes = 0;
        }
    }

    fn per_second(&self) -> f64 {
        self.recent.iter().copied().fold(0.0, f64::max)
    }
}

/// Digest the file in order as the ranges fill it: at each step, hash what the range holding
/// the next byte has written past it. `None` when cancelled.
fn follow(j: &Job, ranges: &Ranges, size: u64) -> Result<Option<Digest>> {
    let mut h = j.algo.hasher();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < size {
        let r = ranges.holding(at);
        let checked = r.checked.load(Ordering::Acquire);
        let avail = r.start + r.done.load(Ordering::Acquire);
        if !checked || avail <= at {
            if j.cancelled() {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let want = (avail - at).min(buf.len() as u64) as usize;
        j.file.read_exact_at(&mut buf[..want], at).map_err(|e| j.file_error(e))?;
        h.update(&buf[..want]);
        at += want as u64;
    }
    Ok(Some(h.finish()))
}

/// What a parallel push did.
/// The routed upload a parallel push fills: its name, and the id its route answered
/// (`RouteResponse.upload_id`), so a range never lands in an upload another put of the name
/// routed again meanwhile.
#[derive(Clone, Copy)]
pub(crate) struct Upload<'a> {
    pub name: &'a str,
    pub id: &'a str,
}

pub(crate) struct Pushed {
    pub connections: usize,
    pub reconnects: usize,
    /// Bytes of ranges an interrupted push had already stored, checked and kept.
    pub kept: u64,
    /// Ranges split so that a connection done with its own took over half of another's rest.
    pub splits: usize,
}

/// Push `data` (all of a local file) into the upload `name`, routed with its size, as `n`
/// ranges over as many connections, then commit it with the digest of the whole: the server
/// makes it the blob only if every chunk equals ours (see the top of this file). A range whose
/// connection drops is pushed again from its start on a new one (up to [`ATTEMPTS`] tries).
/// `Ok(None)`, before any byte moved, when the server's store takes one writer per upload.
///
/// `resume` (the upload was routed again and holds bytes of an interrupted push): of each
/// range, the leading 1 MiB pieces the upload already holds — the server's digest of each
/// equal to ours — are kept, and the range is pushed from the first that is not. Ranges are
/// those `n` gives now.
pub(crate) fn push(
    client: &Client,
    upload: Upload<'_>,
    source: Source<'_>,
    n: usize,
    resume: bool,
    deadline: &Deadline,
    o: &Options,
) -> Result<Option<Pushed>> {
    let client = &pace_shared(client, n);
    let Upload { name, id: upload_id } = upload;
    let Source { data, readable } = source;
    let size = data.len() as u64;
    let bounds = split(size, n);
    let algo = DigestAlgo::default();
    let unimplemented =
        |e: &ClientError| matches!(e, ClientError::Rpc { code: tonic::Code::Unimplemented, .. });
    // Before any byte moves, a store that takes one writer per upload says so: resuming, when
    // the first range is checked; else when the ranges are opened, all at once (an opening
    // takes a few round trips, which on a far link would otherwise hold back every range but
    // the first).
    let (opened, first_held) =
        if resume {
            let (start, end) = bounds[0];
            let held = client
                .within(deadline.left(read_back_wait(end - start)))
                .upload_piece_digests(name, start, end - start, ALIGN, algo);
            match held {
                Err(e) if unimplemented(&e) => return Ok(None),
                held => (Vec::new(), Some(held.ok())),
            }
        } else {
            let tries: Vec<std::result::Result<bs_client::PushStream, ClientError>> =
                std::thread::scope(|s| {
                    let opening: Vec<_> = bounds
                        .iter()
                        .map(|&(start, end)| {
                            s.spawn(move || {
                                client.within(deadline.left(IO_WAIT)).open_push_range(
                                    name,
                                    upload_id,
                                    start,
                                    end - start,
                                )
                            })
                        })
                        .collect();
                    opening
                        .into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|_| {
                                Err(ClientError::Protocol("opening a range panicked".into()))
                            })
                        })
                        .collect()
                });
            if tries.iter().any(|t| t.as_ref().is_err_and(unimplemented)) {
                return Ok(None);
            }
            // A range that could not be opened opens again itself (and tries again, as after
            // a dropped connection); only if none could is the failure the push's.
            if tries.iter().all(|t| t.is_err()) {
                return Err(tries.into_iter().find_map(|t| t.err()).expect("one failed").into());
            }
            (tries.into_iter().map(|t| t.ok()).collect(), None)
        };
    let mut opened = opened.into_iter();
    let cancel = AtomicBool::new(false);
    let finished = Finished::default();
    // Each range its connection's from the start; splits as for pulls. A range's `done` is
    // what its connection has taken to send, and it is not split before its connection
    // knows what the upload holds of it (`checked`).
    let ranges = Ranges::new(
        bounds
            .iter()
            .map(|&(start, end)| {
                let r = Range::new(start, end, 0);
                r.claimed.store(true, Ordering::Release);
                r.checked.store(!resume, Ordering::Release);
                r
            })
            .collect(),
    );
    let initial = ranges.all();
    let report = |done: u64| {
        if let Some(p) = &o.progress {
            p(done, size);
        }
    };
    let mut first_held = first_held;
    let (results, whole) = std::thread::scope(|s| {
        // The whole's digest and the chunks' from one copy of each piece (the file is
        // mapped: were it changed meanwhile, both still describe the same bytes). The server
        // checks its chunks against ours and keeps the whole's.
        let hasher = s.spawn(|| {
            let (mut whole, mut chunks) = (algo.hasher(), ChunkHasher::new());
            let mut copy = vec![0u8; ALIGN as usize];
            for piece in data.chunks(ALIGN as usize) {
                let copy = &mut copy[..piece.len()];
                copy.copy_from_slice(piece);
                whole.update(copy);
                chunks.update(copy);
            }
            (whole.finish(), chunks.finish())
        });
        let workers: Vec<_> = initial
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let opened = opened.next().flatten();
                let checked = if i == 0 { first_held.take() } else { None };
                let (cancel, finished) = (&cancel, &finished);
                let ranges = &ranges;
                s.spawn(move || {
                    let _end = finished.on_end(cancel);
                    let job = PushJob { client, name, upload_id, data, readable, cancel, deadline };
                    let res = (|| {
                        let kept = if resume {
                            let part = &data[r.start as usize..r.end() as usize];
                            readable(part)?;
                            // Nothing splits the range before this (it is not checked yet):
                            // its end is the one `part` was cut to.
                            let kept = held(client, name, r.start, part, checked, deadline);
                            r.done.store(kept, Ordering::Release);
                            r.checked.store(true, Ordering::Release);
                            kept
                        } else {
                            0
                        };
                        let mut reconnects = push_range(&job, r, kept, opened)?;
                        let cancelled = || cancel.load(Ordering::Acquire);
                        while let Some(taken) = ranges.split_when_checked(cancelled) {
                            reconnects += push_range(&job, &taken, 0, None)?;
                        }
                        Ok((reconnects, kept))
                    })();
                    if res.is_err() {
                        cancel.store(true, Ordering::Release);
                    }
                    res
                })
            })
            .collect();
        while !finished.wait(initial.len(), TICK) {
            // Taken to send, and what the upload held already.
            report(ranges.done());
            if deadline.check().is_err() {
                cancel.store(true, Ordering::Release);
            }
        }
        let results: Vec<Result<(usize, u64)>> =
            workers.into_iter().map(|w| w.join().unwrap_or(Err(BlobError::Lost))).collect();
        (results, hasher.join().map_err(|_| BlobError::Lost))
    });
    deadline.check()?;
    let done = all_or_first_failure(results)?;
    let reconnects = done.iter().map(|d| d.0).sum();
    let kept = done.iter().map(|d| d.1).sum();
    let (whole, chunks) = whole?;
    let info = match commit(client, name, &whole, &chunks, size, deadline) {
        // Bytes the upload does not hold after all: a store that sends an upload's parts as
        // they fill (S3) forgets a part sent when bytes of it are written again, so a range
        // that a resume pushed again can take with it bytes of the range beside it. Pushing
        // what each range misses, range after range, can do the same again (a part shared
        // by two ranges, written again for the second, forgets the first's bytes in it). So
        // the blob is pushed once more in order from the first byte the upload lacks: the
        // part holding that byte is not full (else it would hold it), so was not sent, and
        // each part after it is written whole. Then the commit is asked again.
        Err(BlobError::Remote(ClientError::Rpc {
            code: tonic::Code::FailedPrecondition, ..
        })) => {
            let job =
                PushJob { client, name, upload_id, data, readable, cancel: &cancel, deadline };
            let kept = held(client, name, 0, data, None, deadline);
            if kept < size {
                tracing::debug!(blob = %name, kept, "the rest is pushed again before the commit");
                let r = Range::new(0, size, kept);
                r.claimed.store(true, Ordering::Release);
                push_range(&job, &r, kept, None)?;
            }
            commit(client, name, &whole, &chunks, size, deadline)?
        }
        other => other?,
    };
    // The server checked its chunks against ours and keeps our digest of the whole: in our
    // algorithm its stored digest must be that one.
    if let Ok(stored) = info.digest.parse::<Digest>()
        && stored.algo == whole.algo
        && stored != whole
    {
        return Err(BlobError::Remote(ClientError::ChecksumMismatch {
            expected: whole.to_string(),
            actual: stored.to_string(),
        }));
    }
    report(size);
    let splits = ranges.splits.load(Ordering::Relaxed);
    Ok(Some(Pushed { connections: bounds.len(), reconnects, kept, splits }))
}

/// How many leading bytes of `part` (the blob's bytes from `start`) the upload `name` holds
/// already: its pieces of [`ALIGN`] bytes, in order, as long as the server's digest of each
/// equals ours (`checked`: the server's answer, asked already). Any failure to tell counts
/// as none: the whole range is pushed.
fn held(
    client: &Client,
    name: &str,
    start: u64,
    part: &[u8],
    checked: Option<Option<Vec<Digest>>>,
    deadline: &Deadline,
) -> u64 {
    let algo = DigestAlgo::default();
    let theirs = checked.unwrap_or_else(|| {
        let c = client.within(deadline.left(read_back_wait(part.len() as u64)));
        c.upload_piece_digests(name, start, part.len() as u64, ALIGN, algo).ok()
    });
    let mut kept = 0;
    for (ours, theirs) in part.chunks(ALIGN as usize).zip(theirs.unwrap_or_default()) {
        if algo.digest(ours) != theirs {
            break;
        }
        kept += ours.len() as u64;
    }
    kept
}

/// How long the server may take to read back and digest `len` bytes of an upload before it
/// answers (at 50 MiB/s at least, on top of the usual wait).
fn read_back_wait(len: u64) -> Duration {
    IO_WAIT + Duration::from_secs(len / (50 << 20))
}

/// Commit the ranges pushed into `name` (`chunks`: ours). The server may read chunks of the
/// upload back first (those no range writer could vouch for), so the wait grows with the
/// size; a commit that outlived the wait is recognised by the blob's digest.
/// A server thread of a cut connection may still hold a range for a moment (the store then
/// answers busy): asked again for a few seconds.
fn commit(
    client: &Client,
    name: &str,
    whole: &Digest,
    chunks: &ChunkDigests,
    size: u64,
    deadline: &Deadline,
) -> Result<BlobInfo> {
    let wait = read_back_wait(size);
    let busy_until = Instant::now() + Duration::from_secs(10);
    loop {
        match client.within(deadline.left(wait)).commit(name, whole, Some(chunks)) {
            Ok(info) => return Ok(info),
            Err(ClientError::Rpc { code: tonic::Code::Aborted, .. })
                if Instant::now() < busy_until =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) if e.is_timeout() => {
                return match client.stat(name) {
                    Ok(info) if info.digest.parse::<Digest>().ok().as_ref() == Some(whole) => {
                        Ok(info)
                    }
                    _ => Err(e.into()),
                };
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// What every range of one parallel push shares.
/// Makes a piece of the data safe to read just before it is read (see
/// `SliceSource::readable`: a mapped file truncated meanwhile is an error, not `SIGBUS`).
pub(crate) type Readable<'a> = dyn Fn(&[u8]) -> Result<()> + Sync + 'a;

/// What a parallel push sends: all of the file's bytes, and how to make a piece of them safe
/// to read.
pub(crate) struct Source<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) readable: &'a Readable<'a>,
}

struct PushJob<'a> {
    client: &'a Client,
    name: &'a str,
    upload_id: &'a str,
    /// All of the file.
    data: &'a [u8],
    readable: &'a Readable<'a>,
    cancel: &'a AtomicBool,
    deadline: &'a Deadline,
}

/// Push range `r` from `from` bytes into it (what the upload held already) up to its end,
/// which a split may move nearer meanwhile, on `opened` or a new connection; again from
/// there on a new connection after a dropped one. Returns the reconnects.
fn push_range(
    j: &PushJob,
    r: &Range,
    from: u64,
    mut opened: Option<bs_client::PushStream>,
) -> Result<usize> {
    let mut reconnects = 0;
    loop {
        {
            let _w = r.writing.lock().unwrap_or_else(PoisonError::into_inner);
            r.done.store(from, Ordering::Release);
        }
        let mut attempt = || -> Result<()> {
            let at = r.start + from;
            if at >= r.end() && opened.is_none() {
                return Ok(());
            }
            let mut push = match opened.take() {
                Some(p) => p,
                None => {
                    let c = j.client.within(j.deadline.left(IO_WAIT));
                    c.open_push_range(j.name, j.upload_id, at, r.end() - at)?
                }
            };
            push.set_io_timeout(j.deadline.left(IO_WAIT))?;
            loop {
                if j.cancel.load(Ordering::Acquire) {
                    return Err(BlobError::Lost);
                }
                // The next piece is taken under the lock a split takes: the range's end
                // never moves below what its connection has taken to send.
                let (at, n) = {
                    let _w = r.writing.lock().unwrap_or_else(PoisonError::into_inner);
                    let (at, end) = (r.start + r.done.load(Ordering::Acquire), r.end());
                    let n = (end - at).min(1 << 20);
                    r.done.fetch_add(n, Ordering::AcqRel);
                    (at, n)
                };
                if n == 0 {
                    break;
                }
                let piece = &j.data[at as usize..(at + n) as usize];
                (j.readable)(piece)?;
                push.write(piece)?;
            }
            // The range ends here now; what a split took is another connection's.
            let ack = push.finish(false)?;
            let end = r.end();
            if ack.received != end {
                return Err(BlobError::Remote(ClientError::Protocol(format!(
                    "the server holds the range up to byte {}, not {end}",
                    ack.received
                ))));
            }
            Ok(())
        };
        match attempt() {
            Ok(()) => return Ok(reconnects),
            Err(e)
                if connection_failed(&e)
                    && reconnects + 1 < ATTEMPTS
                    && j.deadline.check().is_ok()
                    && !j.cancel.load(Ordering::Acquire) =>
            {
                tracing::warn!(
                    blob = %j.name, start = r.start, "a range's connection failed, pushing it again: {e}"
                );
                reconnects += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pace_is_shared_by_the_connections() {
        let l = |s: &str| s.parse::<bs_binding::LayerSpec>().unwrap();
        let asked = [l("compress:lz4"), l("pace:8000000")];
        assert_eq!(shares(&asked, 4), Some(vec![l("compress:lz4"), l("pace:2000000")]));
        assert_eq!(shares(&asked, 1).unwrap(), asked);
        assert_eq!(shares(&[l("pace:3")], 8), Some(vec![l("pace:1")]), "never 0 (unpaced)");
        assert_eq!(shares(&[l("compress:lz4")], 4), None);
    }

    #[test]
    fn ranges_are_whole_chunks_that_cover_the_blob() {
        for (size, n) in [(10 * ALIGN + 5, 4), (ALIGN, 4), (3 * ALIGN, 3), (100, 8), (0, 4)] {
            let b = split(size, n);
            assert!(!b.is_empty() && b.len() <= n, "{size} in {n}: {b:?}");
            assert_eq!(b[0].0, 0);
            assert_eq!(b.last().unwrap().1, size);
            for w in b.windows(2) {
                assert_eq!(w[0].1, w[1].0, "contiguous");
                assert_eq!(w[0].1 % ALIGN, 0, "aligned");
            }
        }
        assert_eq!(split(10 * ALIGN + 5, 4).len(), 4);
        assert_eq!(split(ALIGN, 4), vec![(0, ALIGN)]);
    }

    #[test]
    fn the_ranges_file_is_trusted_only_for_the_same_blob_covered_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.blobstream-ranges");
        let ranges = Ranges::new(
            split(9 * ALIGN, 3)
                .iter()
                .enumerate()
                .map(|(i, &(start, end))| Range::new(start, end, i as u64 * 7))
                .collect(),
        );
        write_ranges(&p, "xxh3:ab", 9 * ALIGN, &ranges).unwrap();
        let m = ALIGN * 3;
        let want = vec![(0, m, 0), (m, 2 * m, 7), (2 * m, 3 * m, 14)];
        assert_eq!(read_ranges(&p, "xxh3:ab", 9 * ALIGN), Some(want));
        assert_eq!(read_ranges(&p, "xxh3:cd", 9 * ALIGN), None, "another blob");
        assert_eq!(read_ranges(&p, "xxh3:ab", 10 * ALIGN), None, "another size");
        let bad = |body: &str| {
            std::fs::write(&p, format!("blobstream-ranges 1 xxh3:ab 9437184\n{body}")).unwrap();
            read_ranges(&p, "xxh3:ab", 9 * ALIGN)
        };
        assert_eq!(bad("0 3145728 9999999\n3145728 9437184 0\n"), None, "done past the end");
        assert_eq!(bad("0 3145728 0\n4145728 9437184 0\n"), None, "a gap");
        assert_eq!(bad("0 3145728 0\n"), None, "short of the end");
        assert_eq!(bad("0 9437184 5\n"), Some(vec![(0, 9 * ALIGN, 5)]), "one range is fine");
    }

    #[test]
    fn a_split_takes_the_second_half_of_the_longest_rest_on_a_chunk_boundary() {
        const M: u64 = ALIGN;
        let list = vec![Range::new(0, 10 * M, 0), Range::new(10 * M, 41 * M, 2 * M)];
        let ranges = Ranges::new(list);
        assert_eq!(ranges.claim().map(|r| r.start), Some(0));
        assert_eq!(ranges.claim().map(|r| r.start), Some(10 * M));
        assert!(ranges.claim().is_none(), "both taken");
        // The first has 2 MiB left, too little to split.
        ranges.all()[0].done.store(8 * M, Ordering::Release);
        assert!(ranges.split().is_none(), "not while the second's held bytes are unchecked");
        ranges.all()[1].checked.store(true, Ordering::Release);
        // The second has 29 MiB left from byte 12 MiB: it keeps 12..27 (rounded up to a
        // chunk), the new range takes 27..41.
        let taken = ranges.split().expect("long enough to split");
        assert_eq!(
            (taken.start, taken.end(), taken.done.load(Ordering::Acquire)),
            (27 * M, 41 * M, 0)
        );
        assert!(taken.claimed.load(Ordering::Acquire), "taken by whoever split it");
        let all = ranges.all();
        let bounds: Vec<_> = all.iter().map(|r| (r.start, r.end())).collect();
        assert_eq!(bounds, vec![(0, 10 * M), (10 * M, 27 * M), (27 * M, 41 * M)]);
        assert_eq!(ranges.holding(27 * M - 1).start, 10 * M);
        assert_eq!(ranges.holding(27 * M).start, 27 * M);
        assert_eq!(ranges.holding(0).start, 0);
        assert_eq!(ranges.splits.load(Ordering::Relaxed), 1);
        // The second has 15 MiB left from 12 MiB, the most: split again, at 20 MiB.
        let again = ranges.split().expect("15 MiB left");
        assert_eq!((again.start, again.end()), (20 * M, 27 * M));
        // 3 MiB left of each: halves would be under SPLIT_MIN.
        for r in ranges.all() {
            r.done.store(r.len() - 3 * M, Ordering::Release);
        }
        assert!(ranges.split().is_none());
        assert_eq!(ranges.all().len(), 4);
    }

    #[test]
    fn a_pull_asks_in_pieces_and_a_split_leaves_it_what_it_asked_for() {
        const M: u64 = ALIGN;
        let ranges = Ranges::new(vec![Range::new(0, 20 * M + 5, 0)]);
        let r = ranges.claim().unwrap();
        assert_eq!(r.ask(PIECE), Some((0, M)));
        assert_eq!(r.ask(3 * M + 1), Some((M, 4 * M)), "up to a chunk boundary");
        // 5 MiB asked, none written yet: the split halves the 15 MiB (and 5 bytes) after it.
        let taken = ranges.split().expect("long enough to split");
        assert_eq!((taken.start, taken.end()), (13 * M, 20 * M + 5));
        assert_eq!(r.end(), 13 * M);
        r.done.store(5 * M, Ordering::Release);
        assert_eq!(r.ask(u64::MAX), Some((5 * M, 8 * M)), "the rest, up to the new end");
        assert_eq!(r.ask(PIECE), None, "all asked");
        assert_eq!(taken.ask(u64::MAX), Some((13 * M, 7 * M + 5)), "to the blob's last byte");
        // 0 unasked in the first, none in the second: nothing to split.
        assert!(ranges.split().is_none());
    }

    #[test]
    fn a_pull_cuts_a_large_blob_into_more_ranges_than_connections() {
        assert_eq!(pull_ranges_for(10 * ALIGN, 4), 4, "at least one per connection");
        assert_eq!(pull_ranges_for(1 << 30, 8), 64, "one per 16 MiB");
        assert_eq!(pull_ranges_for(1 << 40, 8), MAX_RANGES / 2, "room left for splits");
        assert_eq!(pull_ranges_for(0, 1), 1);
    }

    #[test]
    fn a_pull_keeps_more_asked_on_a_faster_or_longer_path() {
        let rtt = Duration::from_millis(50);
        assert_eq!(ahead(0.0, rtt), MIN_AHEAD, "before any rate is known");
        assert_eq!(ahead(1e6, Duration::ZERO), MIN_AHEAD, "a near peer");
        // 125 MB/s over 50 ms: four round trips' worth, 25 MB, in whole chunks.
        assert_eq!(ahead(125e6, rtt), 24 * ALIGN);
    }

    #[test]
    fn a_failure_is_reported_over_the_ranges_it_stopped() {
        let lost = || Err::<u8, _>(BlobError::Lost);
        let real = || Err::<u8, _>(BlobError::NotFound("gone".into()));
        let r = all_or_first_failure(vec![lost(), Ok(1), real(), lost()]);
        assert!(matches!(r, Err(BlobError::NotFound(_))), "{r:?}");
        assert!(matches!(all_or_first_failure(vec![Ok(1), lost()]), Err(BlobError::Lost)));
        assert_eq!(all_or_first_failure(vec![Ok(1), Ok(2)]).unwrap(), vec![1, 2]);
    }
}
