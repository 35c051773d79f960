//! One SQLite connection behind a mutex (every statement is short), opened the same way for
//! the catalogue and the image index: WAL, `synchronous=FULL`, a 10 s busy timeout, and the
//! caller's schema applied.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;

use crate::error::MetaError;

pub(crate) struct Db(Mutex<Connection>);

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
        Ok(Self(Mutex::new(conn)))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Connection> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
