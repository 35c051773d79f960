//! One SQLite connection behind a mutex (every statement is short), opened the same way for
//! the catalogue and the image index: WAL, `synchronous=FULL`, about 10 s of waiting for a
//! lock another connection holds ([`wait_for_lock`]), and the caller's schema applied.
//! Writes that must be durable go through [`Db::write`], which commits concurrent ones as a
//! group; writes queued behind ([`Db::write_behind`]) run with the next group, or within
//! [`BEHIND_AT_MOST`] on a thread of the database's own.
//!
//! A database in a file has a few more connections for reads ([`Db::read`], [`READERS`]): WAL
//! lets them read the last committed state while a group holds the first one through its
//! commit's fsync, so lookups (a new upload's routing, a reader's open) do not queue behind
//! the disk, nor, when many transfers start at once, behind each other.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use rusqlite::Connection;

use crate::error::MetaError;
#[cfg(test)]
use crate::group::GroupStats;
use crate::group::{Durability, Groups};

/// How long a write queued behind waits for another write to carry it before the
/// database's flusher runs it alone (so it reaches the WAL even if nothing else is written,
/// and survives the process being killed).
pub(crate) const BEHIND_AT_MOST: Duration = Duration::from_millis(20);

/// Tries of [`wait_for_lock`] with short waits, and how long each is.
const SHORT_TRIES: i32 = 200;
const SHORT_WAIT: Duration = Duration::from_micros(50);
/// Then how long each try waits, and the tries in all (about 10 s).
const LONG_WAIT: Duration = Duration::from_millis(1);
const TRIES: i32 = SHORT_TRIES + 10_000;

/// SQLite's busy handler: whether to try again for a lock another connection holds (`tries`
/// made so far). The other connection is usually this process's own (the catalogue's and the
/// image index's share one file) holding the write lock through a commit — a fraction of a
/// millisecond — so the first waits are short: SQLite's own timeout waits 1, 2, 5, 10 … ms,
/// and a group commit that met the index's write stalled every writer behind it for that long.
fn wait_for_lock(tries: i32) -> bool {
    match tries {
        t if t < SHORT_TRIES => std::thread::sleep(SHORT_WAIT),
        t if t < TRIES => std::thread::sleep(LONG_WAIT),
        _ => return false,
    }
    true
}

/// Connections for reads of a database in a file. One was a queue when many small transfers
/// started at once (each looks its blob up), and a thread holding it could be descheduled
/// with others waiting behind; a few let lookups run side by side. Each costs a file handle
/// and its own page cache (SQLite's default, about 2 MB).
pub(crate) const READERS: usize = 4;

pub(crate) struct Db {
    shared: Arc<Shared>,
    flusher: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    conn: Mutex<Connection>,
    /// Reads only (`query_only`); empty in memory, where a second connection would open
    /// another database.
    readers: Vec<Mutex<Connection>>,
    /// Where the next read starts looking for a free reader (so they take turns).
    next_reader: AtomicUsize,
    groups: Groups,
    /// (writes queued behind since the last flush, closing), and its signal.
    behind: (Mutex<(bool, bool)>, Condvar),
}

impl Shared {
    fn flush(&self) {
        self.groups.flush(&self.conn);
    }

    /// The flusher: wait for a write queued behind, give it [`BEHIND_AT_MOST`] to be carried
    /// by another, then run whatever is still queued.
    fn flush_behind(&self) {
        let (state, signal) = &self.behind;
        loop {
            let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
            while !s.0 && !s.1 {
                s = signal.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            let deadline = std::time::Instant::now() + BEHIND_AT_MOST;
            while !s.1 {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                s = signal.wait_timeout(s, left).unwrap_or_else(|p| p.into_inner()).0;
            }
            let closing = s.1;
            s.0 = false;
            drop(s);
            self.flush();
            if closing {
                return;
            }
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        // Writes queued behind land on a clean close.
        let (state, signal) = &self.shared.behind;
        state.lock().unwrap_or_else(|p| p.into_inner()).1 = true;
        signal.notify_all();
        if let Some(f) = self.flusher.take() {
            let _ = f.join();
        }
        self.shared.flush();
    }
}

/// `m` if nobody holds it now.
fn free(m: &Mutex<Connection>) -> Option<MutexGuard<'_, Connection>> {
    match m.try_lock() {
        Ok(c) => Some(c),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

impl Db {
    /// Open (creating if needed) the database at `path` and apply `schema`.
    pub(crate) fn open(path: &Path, schema: &str) -> Result<Self, MetaError> {
        let mut conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_handler(Some(wait_for_lock))?;
        Self::init(conn, schema, Some(path))
    }

    /// A throw-away in-memory database with `schema`.
    pub(crate) fn in_memory(schema: &str) -> Result<Self, MetaError> {
        Self::init(Connection::open_in_memory()?, schema, None)
    }

    /// With `reader_at`, the file's second connection for reads is opened too.
    fn init(conn: Connection, schema: &str, reader_at: Option<&Path>) -> Result<Self, MetaError> {
        conn.execute_batch(schema)?;
        // Opened once the schema exists (and with it the WAL).
        let readers = match reader_at {
            Some(path) => (0..READERS)
                .map(|_| {
                    let mut r = Connection::open(path)?;
                    r.busy_handler(Some(wait_for_lock))?;
                    r.pragma_update(None, "query_only", true)?;
                    r.set_prepared_statement_cache_capacity(64);
                    Ok(Mutex::new(r))
                })
                .collect::<Result<Vec<_>, MetaError>>()?,
            None => Vec::new(),
        };
        // Room for every statement the catalogue runs often, parsed once each.
        conn.set_prepared_statement_cache_capacity(64);
        let shared = Arc::new(Shared {
            conn: Mutex::new(conn),
            readers,
            next_reader: AtomicUsize::new(0),
            groups: Groups::default(),
            behind: (Mutex::new((false, false)), Condvar::new()),
        });
        let flusher = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("sqlite-behind".into())
                .spawn(move || shared.flush_behind())
                .map_err(|e| MetaError::Config(format!("cannot start a thread: {e}")))?
        };
        Ok(Self { shared, flusher: Some(flusher) })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Connection> {
        self.shared.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection for reads: it sees every write whose group has committed (in this
    /// process or another), none still in one. The first reader free now, else it waits for
    /// one (in memory, the writer's connection).
    pub(crate) fn read(&self) -> MutexGuard<'_, Connection> {
        let readers = &self.shared.readers;
        if readers.is_empty() {
            return self.lock();
        }
        let start = self.shared.next_reader.fetch_add(1, Ordering::Relaxed);
        self.try_read_from(start).unwrap_or_else(|| {
            readers[start % readers.len()].lock().unwrap_or_else(|p| p.into_inner())
        })
    }

    /// [`Db::read`] if a connection is free now: `None` while other readers hold them all.
    pub(crate) fn try_read(&self) -> Option<MutexGuard<'_, Connection>> {
        if self.shared.readers.is_empty() {
            return free(&self.shared.conn);
        }
        self.try_read_from(self.shared.next_reader.fetch_add(1, Ordering::Relaxed))
    }

    /// The first free reader, looking from `start` round.
    fn try_read_from(&self, start: usize) -> Option<MutexGuard<'_, Connection>> {
        let readers = &self.shared.readers;
        (0..readers.len()).find_map(|i| free(&readers[(start + i) % readers.len()]))
    }

    #[cfg(test)]
    pub(crate) fn groups(&self) -> &Groups {
        &self.shared.groups
    }

    /// Run `op` as one write of the next group commit (see [`crate::group`]): atomic on its
    /// own, durable when this returns `Ok`.
    pub(crate) fn write<R, F>(&self, op: F) -> Result<R, MetaError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, MetaError> + Send + 'static,
    {
        self.shared.groups.write(&self.shared.conn, Durability::Now, op)
    }

    /// Like [`Db::write`], but the write may be lost by a crash (it becomes durable with the
    /// next durable write): for rows whose loss only costs a retry.
    pub(crate) fn write_lazy<R, F>(&self, op: F) -> Result<R, MetaError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, MetaError> + Send + 'static,
    {
        self.shared.groups.write(&self.shared.conn, Durability::Lazy, op)
    }

    /// Queue `op` for the next group and return at once (see [`Groups::write_behind`]);
    /// `after` runs once that group's transaction has ended, committed or not.
    pub(crate) fn write_behind(
        &self,
        op: impl FnOnce(Option<&Connection>) + Send + 'static,
        after: impl FnOnce() + Send + 'static,
    ) {
        self.shared.groups.write_behind(Box::new(op), Box::new(after));
        let (state, signal) = &self.shared.behind;
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        if !s.0 {
            // The flusher's wait starts with the first write queued, not the last.
            s.0 = true;
            signal.notify_one();
        }
    }

    /// Run the writes queued behind, if any.
    pub(crate) fn flush(&self) {
        self.shared.flush();
    }

    #[cfg(test)]
    pub(crate) fn group_stats(&self) -> GroupStats {
        self.shared.groups.stats()
    }
}
