//! One SQLite connection behind a mutex (every statement is short), opened the same way for
//! the catalogue and the image index: WAL, `synchronous=FULL`, a 10 s busy timeout, and the
//! caller's schema applied. Writes that must be durable go through [`Db::write`], which
//! commits concurrent ones as a group.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;

use crate::error::MetaError;
#[cfg(test)]
use crate::group::GroupStats;
use crate::group::{Durability, Groups};

pub(crate) struct Db {
    conn: Mutex<Connection>,
    pub(crate) groups: Groups,
}

impl Db {
    /// Open (creating if needed) the database at `path` and apply `schema`.
    pub(crate) fn open(path: &Path, schema: &str) -> Result<Self, MetaError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        Self::init(conn, schema)
    }

    /// A throw-away in-memory database with `schema`.
    pub(crate) fn in_memory(schema: &str) -> Result<Self, MetaError> {
        Self::init(Connection::open_in_memory()?, schema)
    }

    fn init(conn: Connection, schema: &str) -> Result<Self, MetaError> {
        conn.execute_batch(schema)?;
        Ok(Self { conn: Mutex::new(conn), groups: Groups::default() })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `op` as one write of the next group commit (see [`crate::group`]): atomic on its
    /// own, durable when this returns `Ok`.
    pub(crate) fn write<R, F>(&self, op: F) -> Result<R, MetaError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, MetaError> + Send + 'static,
    {
        self.groups.write(&self.conn, Durability::Now, op)
    }

    /// Like [`Db::write`], but the write may be lost by a crash (it becomes durable with the
    /// next durable write): for rows whose loss only costs a retry.
    pub(crate) fn write_lazy<R, F>(&self, op: F) -> Result<R, MetaError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, MetaError> + Send + 'static,
    {
        self.groups.write(&self.conn, Durability::Lazy, op)
    }

    #[cfg(test)]
    pub(crate) fn group_stats(&self) -> GroupStats {
        self.groups.stats()
    }
}
