//! The catalogue every store keeps its blobs and pending uploads in, on one of two
//! databases with the same tables and the same guarantees: embedded SQLite (the default, one
//! host) or PostgreSQL (shared by many front ends on many hosts).

use std::path::Path;

use bytes::Bytes;

use crate::error::MetaError;
use crate::group::Durability;
use crate::intent::CommitIntent;
use crate::pg_catalogue::PgCatalogue;
use crate::record::{BlobRecord, Commit, UploadRecord};
use crate::sqlite_catalogue::SqliteCatalogue;

type Result<T> = std::result::Result<T, MetaError>;

/// A committed blob with what a reader needs besides its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredBlob {
    pub record: BlobRecord,
    /// Store-specific location of the bytes (the fs store's file id, an object key).
    pub location: String,
    /// Stored form of the per-chunk digests (`bs_wire::ChunkDigests`); `None` for blobs
    /// committed before chunk digests existed.
    pub chunks: Option<Vec<u8>>,
    /// Why the blob is known to be corrupt in storage, if it is.
    pub corrupt: Option<String>,
    /// The blob's bytes, for a small blob kept in its catalogue row (the fs store's);
    /// `location` then names no file.
    pub inline: Option<Vec<u8>>,
}

/// The catalogue.
pub struct Catalogue {
    backend: Backend,
}

enum Backend {
    Sqlite(SqliteCatalogue),
    Postgres(Box<PgCatalogue>),
}

/// The same call on whichever database this is.
macro_rules! on_backend {
    ($self:ident, $c:ident => $e:expr) => {
        match &$self.backend {
            Backend::Sqlite($c) => $e,
            // The PostgreSQL client blocks on its own runtime: keep it off any executor.
            Backend::Postgres($c) => crate::pg::off_executor(|| $e),
        }
    };
}

impl Catalogue {
    /// Open (creating if needed) the SQLite database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Self { backend: Backend::Sqlite(SqliteCatalogue::open(path)?) })
    }

    /// A throw-away in-memory SQLite catalogue.
    pub fn open_in_memory() -> Result<Self> {
        Ok(Self { backend: Backend::Sqlite(SqliteCatalogue::open_in_memory()?) })
    }

    /// Connect to PostgreSQL at `url` (`postgres://user:password@host:port/database`),
    /// creating the tables (and adding newer columns) if needed.
    pub fn connect_postgres(url: &str) -> Result<Self> {
        let c = crate::pg::off_executor(|| PgCatalogue::connect(url))?;
        Ok(Self { backend: Backend::Postgres(Box::new(c)) })
    }

    /// `sqlite:<path>` or `postgres://host:port/db` — never a password.
    pub fn describe(&self) -> String {
        on_backend!(self, c => c.describe())
    }

    /// A committed blob and its store location.
    pub fn blob(&self, name: &str) -> Result<Option<(BlobRecord, String)>> {
        on_backend!(self, c => c.blob(name))
    }

    /// A committed blob with its location, chunk digests and corruption mark.
    pub fn stored(&self, name: &str) -> Result<Option<StoredBlob>> {
        on_backend!(self, c => c.stored(name))
    }

    /// [`Catalogue::stored`] if it can be answered without waiting on another — for a caller
    /// on an async executor: `None` when it would (PostgreSQL is a network round trip;
    /// SQLite's reading connections may all be other readers' just now). SQLite may still read
    /// a page of its file it does not hold, normally from the kernel's page cache.
    pub fn stored_at_once(&self, name: &str) -> Option<Result<Option<StoredBlob>>> {
        match &self.backend {
            Backend::Sqlite(c) => c.stored_at_once(name),
            Backend::Postgres(_) => None,
        }
    }

    /// Record the chunk digests of a blob committed without them, if it is still stored at
    /// `location`.
    pub fn set_chunks(&self, name: &str, location: &str, chunks: &[u8]) -> Result<()> {
        on_backend!(self, c => c.set_chunks(name, location, chunks))
    }

    /// Mark the blob stored at `location` corrupt (`Some(reason)`) or sound again (`None`).
    /// Returns whether such a row existed.
    pub fn set_corrupt(&self, name: &str, location: &str, reason: Option<&str>) -> Result<bool> {
        on_backend!(self, c => c.set_corrupt(name, location, reason))
    }

    /// (name, reason) of every blob marked corrupt.
    pub fn corrupt(&self) -> Result<Vec<(String, String)>> {
        on_backend!(self, c => c.corrupt())
    }

    /// (name, reason) of the blobs among `names` marked corrupt: the marks of one page of a
    /// listing, in one look-up.
    pub fn corrupt_among(&self, names: &[String]) -> Result<Vec<(String, String)>> {
        on_backend!(self, c => c.corrupt_among(names))
    }

    /// Up to `limit` blobs whose names start with `prefix` and sort after `after` (byte
    /// order).
    pub fn list(&self, prefix: &str, after: &str, limit: usize) -> Result<Vec<BlobRecord>> {
        on_backend!(self, c => c.list(prefix, after, limit))
    }

    /// Commit a blob (insert, or replace as `may_replace` allows) with its chunk digests
    /// (stored form) and drop its pending upload, in one transaction: the check of what is
    /// there and the commit cannot be separated by another writer, in this process or any
    /// other. Durable when this returns `Ok`. With `inline`, the blob's bytes are kept in its
    /// row (and `location` names nothing else).
    pub fn commit_blob(
        &self,
        rec: &BlobRecord,
        location: &str,
        chunks: &[u8],
        inline: Option<Bytes>,
        may_replace: impl Fn(Option<&str>) -> bool + Send + 'static,
    ) -> Result<Commit> {
        on_backend!(self, c => c.commit_blob(rec, location, chunks, inline, may_replace))
    }

    /// Replace the bytes of the inline blob stored at `location` (fault injection for tests:
    /// bit rot inside the catalogue). Returns whether such a row existed.
    pub fn set_inline(&self, name: &str, location: &str, data: &[u8]) -> Result<bool> {
        on_backend!(self, c => c.set_inline(name, location, data))
    }

    /// Record `intent` durably before its bytes are known to be stored, so that
    /// [`Catalogue::commit_intended`] need not wait for the disk (see `crate::intent`).
    /// Returns whether it was kept: PostgreSQL keeps none, its commits being durable alone.
    pub fn intend(&self, intent: &CommitIntent) -> Result<bool> {
        match &self.backend {
            Backend::Sqlite(c) => c.intend(intent).map(|()| true),
            Backend::Postgres(_) => Ok(false),
        }
    }

    /// Commit what `intent` says, as [`Catalogue::commit_blob`] would, and drop the intent.
    /// Visible to every reader when this returns `Ok`, and durable: with
    /// [`Durability::Lazy`], through the intent kept by [`Catalogue::intend`] (replayed by
    /// the store's start-up if a crash loses the commit); with [`Durability::Now`], at
    /// once.
    pub fn commit_intended(
        &self,
        intent: &CommitIntent,
        may_replace: impl Fn(Option<&str>) -> bool + Send + 'static,
        durability: Durability,
    ) -> Result<Commit> {
        match &self.backend {
            Backend::Sqlite(c) => c.commit_intended(intent, may_replace, durability),
            Backend::Postgres(c) => crate::pg::off_executor(|| {
                c.commit_blob(&intent.record, &intent.location, &intent.chunks, None, may_replace)
            }),
        }
    }

    /// Drop the intent for `location`, durably: its bytes were not stored.
    pub fn forget_intent(&self, location: &str) -> Result<()> {
        match &self.backend {
            Backend::Sqlite(c) => c.forget_intent(location),
            Backend::Postgres(_) => Ok(()),
        }
    }

    /// Every intent left by commits a crash may have lost, oldest first.
    pub fn intents(&self) -> Result<Vec<CommitIntent>> {
        match &self.backend {
            Backend::Sqlite(c) => c.intents(),
            Backend::Postgres(_) => Ok(Vec::new()),
        }
    }

    /// Remove a blob; returns its location if it existed. Durable when this returns `Ok`.
    pub fn delete_blob(&self, name: &str) -> Result<Option<String>> {
        on_backend!(self, c => c.delete_blob(name))
    }

    /// Every location referenced by a blob, a pending upload or an intent, read in one
    /// snapshot — so an upload committing meanwhile is in it one way or the other (its
    /// pending row and its blob row change in one transaction).
    pub fn referenced(&self) -> Result<Vec<String>> {
        on_backend!(self, c => c.referenced())
    }

    /// This catalogue's identity: a random id made the first time it is asked for and kept
    /// in the database, the same for every front end sharing it.
    pub fn instance_id(&self) -> Result<String> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).map_err(|e| MetaError::Config(format!("random source: {e}")))?;
        let fresh: String = b.iter().map(|x| format!("{x:02x}")).collect();
        on_backend!(self, c => c.setting_or_init("instance_id", &fresh))
    }

    /// Every location referenced by a blob (for garbage collection of orphans).
    pub fn locations(&self) -> Result<Vec<String>> {
        on_backend!(self, c => c.locations())
    }

    /// Record a pending upload, replacing any other pending upload of the same name.
    /// Returns the replaced upload's id. Seen by this handle at once; SQLite writes it with
    /// the handle's next transaction, so another handle on the same file sees it from then
    /// on, and a crash may lose it (see the SQLite implementation); nothing acknowledged
    /// rests on it. PostgreSQL writes it before returning, for every front end to see.
    pub fn put_upload(&self, u: &UploadRecord) -> Result<Option<String>> {
        on_backend!(self, c => c.put_upload(u))
    }

    /// The pending upload for `name`.
    pub fn upload(&self, name: &str) -> Result<Option<UploadRecord>> {
        on_backend!(self, c => c.upload(name))
    }

    /// Every pending upload id (for garbage collection of orphan staging data).
    pub fn upload_ids(&self) -> Result<Vec<String>> {
        on_backend!(self, c => c.upload_ids())
    }

    /// (name, upload id) of uploads created before `ms` (Unix milliseconds).
    pub fn uploads_created_before(&self, ms: i64) -> Result<Vec<(String, String)>> {
        on_backend!(self, c => c.uploads_created_before(ms))
    }

    /// Forget a pending upload; returns its id if there was one.
    pub fn delete_upload(&self, name: &str) -> Result<Option<String>> {
        on_backend!(self, c => c.delete_upload(name))
    }
}
