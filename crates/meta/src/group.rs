//! Group commit: writes that arrive while another is being made durable wait, then commit
//! together in one transaction — one WAL fsync for the lot instead of one each.
//!
//! Leader and followers, without a thread of their own: a writer queues its write and takes
//! the connection; whoever holds it runs every queued write, each in a savepoint of its own
//! (one write's error rolls back only that write), commits once, and only then hands each
//! writer its result. A result is never handed out before the commit that makes it durable
//! has returned, so an acknowledged durable write survives a crash, and a crash mid-group
//! exposes none of the group (one transaction). Lazy writes and writes queued behind skip
//! the fsync and may be lost by a crash: only rows whose loss the caller copes with (a
//! pending upload's, a commit covered by its intent: see `crate::intent`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, mpsc};

use rusqlite::Connection;

use crate::error::MetaError;

/// What a write hands its caller once its group's fate is known.
type Deliver = Box<dyn FnOnce(Result<(), GroupFailure>) + Send>;

/// A queued write: runs inside the group's transaction (`None`: the transaction could not
/// begin, so it does not run), returns how to deliver its result.
type Op = Box<dyn FnOnce(Option<&Connection>) -> Deliver + Send>;

/// Why a whole group failed (its transaction could not begin or commit).
#[derive(Debug, Clone)]
pub(crate) struct GroupFailure {
    pub(crate) disk_full: bool,
    pub(crate) reason: String,
}

impl From<&rusqlite::Error> for GroupFailure {
    fn from(e: &rusqlite::Error) -> Self {
        Self { disk_full: MetaError::sqlite_disk_full(e), reason: e.to_string() }
    }
}

/// How soon a write must be on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Before the write returns (an acknowledgement rests on it).
    Now,
    /// With the next durable group or checkpoint: a crash may lose it, and whatever rests on
    /// it must cope (a pending upload's row: the upload starts again).
    Lazy,
}

/// A write queued for the next group, nobody waiting on its result: called with the
/// group's connection, or with `None` if the group's transaction could not begin.
type Behind = Box<dyn FnOnce(Option<&Connection>) + Send>;

/// Writes waiting for the next group, and what the groups so far amounted to.
#[derive(Default)]
pub(crate) struct Groups {
    queue: Mutex<Vec<(Durability, Op)>>,
    groups: AtomicU64,
    writes: AtomicU64,
}

/// Group commits made by every database of this process, and the writes they held.
static ALL_GROUPS: AtomicU64 = AtomicU64::new(0);
static ALL_WRITES: AtomicU64 = AtomicU64::new(0);

/// Group commits made and the writes they held: by one database since it was opened (for
/// tests), or by the whole process ([`group_commits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupStats {
    pub groups: u64,
    pub writes: u64,
}

/// Group commits made by every catalogue and index of this process (for `/metrics`).
pub fn group_commits() -> GroupStats {
    GroupStats {
        groups: ALL_GROUPS.load(Ordering::Relaxed),
        writes: ALL_WRITES.load(Ordering::Relaxed),
    }
}

impl Groups {
    #[cfg(test)]
    pub(crate) fn stats(&self) -> GroupStats {
        GroupStats {
            groups: self.groups.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
        }
    }

    /// Run `op` in the next group commit on the connection `lock` guards; returns its result
    /// once the group is durable.
    pub(crate) fn write<R, F>(
        &self,
        lock: &Mutex<Connection>,
        durability: Durability,
        op: F,
    ) -> Result<R, MetaError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, MetaError> + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel::<Result<R, MetaError>>(1);
        let op: Op = Box::new(move |conn| {
            let res = conn.map(|c| in_savepoint(c, op));
            Box::new(move |group: Result<(), GroupFailure>| {
                let res = match (group, res) {
                    (Ok(()), Some(res)) => res,
                    (Err(f), _) => {
                        Err(MetaError::GroupCommit { disk_full: f.disk_full, reason: f.reason })
                    }
                    (Ok(()), None) => unreachable!("a group that did not begin cannot succeed"),
                };
                let _ = tx.send(res);
            })
        });
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).push((durability, op));
        loop {
            let conn = lock.lock().unwrap_or_else(|p| p.into_inner());
            // A leader that held the connection meanwhile may have committed this write.
            match rx.try_recv() {
                Ok(r) => return r,
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    // Its leader panicked mid-group (the transaction was never committed).
                    return Err(MetaError::GroupCommit {
                        disk_full: false,
                        reason: "the group this write was in failed".into(),
                    });
                }
            }
            let batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()));
            self.commit(&conn, batch);
        }
    }

    /// Queue `op` for the next group (lazily durable, like [`Durability::Lazy`]) and return
    /// at once: whoever writes next runs it first, in queue order. Its outcome reaches
    /// nobody, so the caller must cope with it never landing (see
    /// `SqliteCatalogue::put_upload`).
    /// `after` runs once the group's transaction has ended, committed or not.
    pub(crate) fn write_behind(&self, op: Behind, after: Box<dyn FnOnce() + Send>) {
        let op: Op = Box::new(move |conn| {
            match conn {
                Some(c) => {
                    let _ = in_savepoint(c, |c| {
                        op(Some(c));
                        Ok(())
                    });
                }
                None => op(None),
            }
            Box::new(move |_| after())
        });
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).push((Durability::Lazy, op));
    }

    /// Run whatever is queued (nothing to do if nothing is).
    pub(crate) fn flush(&self, lock: &Mutex<Connection>) {
        let conn = lock.lock().unwrap_or_else(|p| p.into_inner());
        let batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        self.commit(&conn, batch);
    }

    /// One transaction over `batch`; every write is told the outcome after the commit.
    fn commit(&self, conn: &Connection, batch: Vec<(Durability, Op)>) {
        if batch.is_empty() {
            return;
        }
        // A group of lazy writes only skips the WAL fsync; the next durable group's fsync
        // covers its frames too (the WAL is one file, synced in order).
        let lazy = batch.iter().all(|(d, _)| *d == Durability::Lazy);
        // Said before every group, not only restored after a lazy one: a group that
        // panicked half-way must not leave the next durable one unsynced.
        let _ = exec(
            conn,
            if lazy { "PRAGMA synchronous = NORMAL" } else { "PRAGMA synchronous = FULL" },
        );
        self.run(conn, batch.into_iter().map(|(_, op)| op).collect());
        if lazy {
            let _ = exec(conn, "PRAGMA synchronous = FULL");
        }
    }

    fn run(&self, conn: &Connection, batch: Vec<Op>) {
        let n = batch.len() as u64;
        if !conn.is_autocommit() {
            // A group whose leader panicked mid-way left its transaction open.
            let _ = conn.execute_batch("ROLLBACK");
        }
        // IMMEDIATE: the write lock is taken at BEGIN, where the busy timeout applies.
        if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
            let f = GroupFailure::from(&e);
            // Nothing ran: each write is told why.
            for op in batch {
                op(None)(Err(f.clone()));
            }
            return;
        }
        let delivers: Vec<Deliver> = batch.into_iter().map(|op| op(Some(conn))).collect();
        let outcome = match exec(conn, "COMMIT") {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(GroupFailure::from(&e))
            }
        };
        if outcome.is_ok() {
            self.groups.fetch_add(1, Ordering::Relaxed);
            self.writes.fetch_add(n, Ordering::Relaxed);
            ALL_GROUPS.fetch_add(1, Ordering::Relaxed);
            ALL_WRITES.fetch_add(n, Ordering::Relaxed);
        }
        for d in delivers {
            d(outcome.clone());
        }
    }
}

/// Run `op` inside a savepoint: released when it succeeds, rolled back when it fails, so a
/// failing write leaves the rest of its group untouched.
fn in_savepoint<R>(
    conn: &Connection,
    op: impl FnOnce(&Connection) -> Result<R, MetaError>,
) -> Result<R, MetaError> {
    exec(conn, "SAVEPOINT grouped_write")?;
    let res = op(conn);
    let end = match res {
        Ok(_) => exec(conn, "RELEASE grouped_write"),
        Err(_) => exec(conn, "ROLLBACK TO grouped_write")
            .and_then(|()| exec(conn, "RELEASE grouped_write")),
    };
    match (res, end) {
        (Ok(r), Ok(())) => Ok(r),
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e.into()),
    }
}

/// Run one statement without rows from the connection's statement cache, so it is parsed
/// once (parsing costs more than running these; SQLite prepares a PRAGMA again each time
/// all the same).
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::db::Db;

    const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY NOT NULL);";

    fn insert(k: i64) -> impl FnOnce(&Connection) -> Result<i64, MetaError> + Send + 'static {
        move |c| {
            c.execute("INSERT INTO t (k) VALUES (?1)", [k])?;
            Ok(k)
        }
    }

    fn queued(db: &Db) -> usize {
        db.groups().queue.lock().unwrap().len()
    }

    #[test]
    fn writes_queued_behind_a_commit_share_the_next_one_and_a_failure_stays_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Db::open(&dir.path().join("g.db"), SCHEMA).unwrap());
        db.write(insert(0)).unwrap();
        assert_eq!(db.group_stats(), GroupStats { groups: 1, writes: 1 });
        // Hold the connection as a leader mid-commit would; four writers queue meanwhile.
        let held = db.lock();
        let writers: Vec<_> = [1, 2, 0, 3]
            .into_iter()
            .map(|k| {
                let db = db.clone();
                std::thread::spawn(move || db.write(insert(k)))
            })
            .collect();
        while queued(&db) < 4 {
            std::thread::yield_now();
        }
        drop(held);
        let results: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        // The duplicate key 0 fails alone; the other three committed with it, in one group.
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 3, "{results:?}");
        assert!(matches!(results[2], Err(MetaError::Sqlite(_))), "{:?}", results[2]);
        assert_eq!(db.group_stats(), GroupStats { groups: 2, writes: 5 });
        drop(db);
        let reopened = Db::open(&dir.path().join("g.db"), SCHEMA).unwrap();
        let keys: Vec<i64> = reopened
            .lock()
            .prepare("SELECT k FROM t ORDER BY k")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(keys, [0, 1, 2, 3]);
    }

    #[test]
    fn a_lazy_group_leaves_the_connection_fully_synchronous() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("g.db"), SCHEMA).unwrap();
        db.write_lazy(insert(1)).unwrap();
        let sync: i64 = db.lock().pragma_query_value(None, "synchronous", |r| r.get(0)).unwrap();
        assert_eq!(sync, 2, "synchronous=FULL after a lazy group");
        db.write(insert(2)).unwrap();
        drop(db);
        let reopened = Db::open(&dir.path().join("g.db"), SCHEMA).unwrap();
        let n: i64 = reopened.lock().query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 2);
    }
}
