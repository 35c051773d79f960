//! The object-storage store: blob bytes in an S3-compatible bucket (AWS S3, Garage, MinIO,
//! Ceph RGW, SeaweedFS — through the `object_store` crate, whose in-memory backend serves
//! too), the catalogue in SQLite or PostgreSQL. Several front ends may share one bucket and
//! one PostgreSQL catalogue.
//!
//! Layout: every upload gets a fresh random key `<prefix>/<id>`, never reused, so no object
//! is ever overwritten in place and a reader holding a catalogue row reads exactly the bytes
//! that row describes.
//!
//! Writing: bytes arrive in order into a buffer (a receiver may read them from its socket
//! straight into it, see `UploadSink::lend`); each full part (8 MiB, a multiple of the
//! chunk size) goes up as one part of a multipart upload while the next fills (up to
//! [`PARTS_IN_FLIGHT`] at once), its digests folded into the running whole-blob and chunk
//! digests. An upload of known size of a part or more starts its multipart upload as it is
//! opened, so the request is answered by the time the first part is full. A blob smaller
//! than a part is one plain PUT at commit, its digests computed while it is in flight (its
//! object unreferenced until the row below); on a plain-`http://` endpoint the CRC-32 the
//! bucket checks that PUT against is taken as its bytes arrive (see `crate::s3http`).
//! A blob of up to [`INLINE_UP_TO`] bytes makes no request to the bucket at all: it is
//! committed inside its catalogue row (location `inline:<id>`), read from there, and shared
//! with every front end through the catalogue like any row.
//! Commit completes the multipart upload, and only then writes the catalogue row: a blob is
//! visible only once all its bytes are stored, and a crash between the two leaves an
//! unreferenced object that [`ObjStore::collect_garbage`] removes (once it is older than
//! [`ORPHAN_AGE`], so objects other front ends are committing right now are left alone).
//! The row's durability does
//! not wait on the disk after the bytes: while the PUT or completion is in flight, the row
//! to come is written durably as an intent, and the commit after it only reaches the WAL;
//! the store's start replays an intent a crash left (committed if its object is whole in
//! the bucket, forgotten if not). See bs_meta's `intent` for why that is safe.
//!
//! The pending upload row records the multipart upload's id once there is one, so an upload
//! abandoned by a front end that died is aborted by whichever front end expires it.
//! Resuming continues where the upload stopped when it was begun by this process (its parts
//! and running digests are here); elsewhere — another front end, after a restart — an
//! upload starts over, because the bytes of an unfinished multipart upload cannot be read
//! back to check them. Rolling back into bytes already sent as parts starts over too.
//! Two front ends writing one name at once each keep their own upload (a route never aborts
//! another front end's multipart upload unless it is older than [`ORPHAN_AGE`]); the
//! catalogue's commit decides which lands, and the other is told it already exists.
//!
//! Reading: ranged GETs of whole chunks, each chunk checked against the catalogue's chunk
//! digests before any byte of it is handed out (see [`BlobSource::remote`]); an object
//! missing from the bucket is reported as corrupt, never served as empty. A long sequential
//! read fetches windows of [`REMOTE_WINDOW`] bytes, several at once, each streamed so its
//! chunks are checked and sent on as they arrive (see `crate::objstream`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bs_meta::{BlobRecord, Catalogue, Commit, CommitIntent, Durability, UploadRecord, now_ms};
use bs_wire::{BufferPool, CHUNK_SIZE, ChunkDigests, ChunkHasher, Digest, DigestAlgo, Hasher};
use bytes::Bytes;
use futures_util::StreamExt;
use object_store::aws::AwsCredential;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as ObjPath;
use object_store::{MultipartId, ObjectStore, PutOptions, PutPayload};
use tokio::task::JoinHandle;

use crate::catalogued::{self, cutoff_ms};
use crate::claim::Claims;
use crate::error::StoreError;
use crate::events::{Listener, Listeners, StoreEvent};
use crate::fs::{INLINE_UP_TO, inline_sized, new_id};
use crate::name::validate_name;
use crate::objearly::EarlyGet;
use crate::objlocal::{LocalClients, MakeBackend};
use crate::objranges::Ranged;
use crate::objstream::ObjStream;
use crate::s3http::{QuickAckConnector, RunningCrc, Signer};
use crate::source::{BlobSource, CorruptionMarker, REMOTE_WINDOW, RangeRead};
use crate::store::{
    RouteSpec, Routed, Store, UploadSink, check_complete, check_write, may_replace, range_size,
};
use crate::tail::Tail;

type Result<T> = std::result::Result<T, StoreError>;

/// Size of each part of a multipart upload (S3 wants at least 5 MiB but for the last).
pub const PART_SIZE: usize = 8 * CHUNK_SIZE as usize;

/// Parts of one upload being sent at once.
pub const PARTS_IN_FLIGHT: usize = 4;

/// A part is digested this much at a time (see [`ObjUpload::send_part`]).
const HASH_PIECE: usize = 256 << 10;

/// Buffers of sent parts (and of small blobs' PUTs, see `tail.rs`) kept for the next ones,
/// at most: one per part in flight, so an upload in full flow fills every part into a
/// buffer used before (at most 32 MiB kept idle by a store that has taken uploads).
const SPARE_PART_BUFFERS: usize = PARTS_IN_FLIGHT;

/// Unreferenced objects younger than this are left alone by garbage collection: they may
/// be uploads another front end is about to commit.
pub const ORPHAN_AGE: Duration = Duration::from_secs(3600);

/// What an object-store backend must offer: objects, and multipart uploads driven part by
/// part (S3 and the in-memory store both do).
pub trait Backend: ObjectStore + MultipartStore {}
impl<T: ObjectStore + MultipartStore> Backend for T {}

/// Where an S3-compatible bucket is and how to reach it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Config {
    /// `http(s)://host:port` of a non-AWS server (Garage, MinIO, ...); `None`: AWS.
    pub endpoint: Option<String>,
    pub region: String,
    pub bucket: String,
    /// Key prefix inside the bucket (no leading or trailing `/`); empty: `blobs`.
    pub prefix: String,
    pub access_key_id: String,
    /// Never printed or logged (see the `Debug` impl).
    pub secret_access_key: String,
    /// Per-request timeout.
    pub timeout: Option<Duration>,
}

/// Retries for requests that each may take up to `timeout`: a few, with backoff, so that a
/// server that is down is reported in seconds.
fn retry_for(timeout: Duration) -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 3,
        // Longer than one request may take, so that a request timed out (a server that took
        // it and never answered) is tried again when it is idempotent, as a PUT of an object
        // or of a part is: one stall is not a failed upload.
        retry_timeout: timeout + Duration::from_secs(20),
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
    }
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"(hidden)")
            .finish()
    }
}

impl S3Config {
    /// The `object_store` client for this bucket: path-style requests, plain HTTP allowed
    /// for an explicit `http://` endpoint, bounded timeouts and a few retries with backoff
    /// so a server that is down is reported in seconds, not minutes. An `http://` endpoint
    /// is reached through the store's own HTTP client, which acknowledges what it receives
    /// at once (see `s3http.rs`: Garage's answers otherwise stall for up to 40 ms).
    pub fn build(&self) -> Result<object_store::aws::AmazonS3> {
        self.build_with(true)
    }

    /// The same client on `object_store`'s own HTTP client (reqwest) whatever the endpoint:
    /// how a plain `object_store` user reaches the bucket (the benchmarks' baseline).
    pub fn build_stock(&self) -> Result<object_store::aws::AmazonS3> {
        self.build_with(false)
    }

    fn build_with(&self, own_http: bool) -> Result<object_store::aws::AmazonS3> {
        use object_store::aws::AmazonS3Builder;
        let timeout = self.timeout.unwrap_or(Duration::from_secs(30));
        let connect_timeout = Duration::from_secs(5);
        let region = if self.region.is_empty() { "us-east-1" } else { &self.region };
        let client = object_store::ClientOptions::new()
            .with_timeout(timeout)
            .with_connect_timeout(connect_timeout)
            .with_allow_http(self.endpoint.as_deref().is_some_and(|e| e.starts_with("http://")));
        let retry = retry_for(timeout);
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_region(region)
            .with_access_key_id(&self.access_key_id)
            .with_secret_access_key(&self.secret_access_key)
            .with_virtual_hosted_style_request(false)
            .with_client_options(client)
            .with_retry(retry);
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e);
            if own_http && self.signs_payloads_here() {
                // Signed by the connector's client, payload and all (see `s3http.rs`).
                let signer = Signer {
                    credential: Arc::new(AwsCredential {
                        key_id: self.access_key_id.clone(),
                        secret_key: self.secret_access_key.clone(),
                        token: None,
                    }),
                    region: region.to_string(),
                };
                b = b.with_unsigned_payload(true).with_http_connector(QuickAckConnector {
                    timeout,
                    connect_timeout,
                    signer,
                });
            }
        }
        b.build().map_err(|e| StoreError::Config(format!("S3 bucket {:?}: {e}", self.bucket)))
    }

    /// Whether the bucket is reached through the store's own HTTP client, which signs each
    /// request itself (a plain-`http://` endpoint; see `s3http.rs`).
    fn signs_payloads_here(&self) -> bool {
        self.endpoint.as_deref().is_some_and(|e| e.starts_with("http://"))
    }

    /// `s3://bucket/prefix (endpoint)` — no credentials.
    pub fn describe(&self) -> String {
        let prefix = if self.prefix.is_empty() { "blobs" } else { &self.prefix };
        match &self.endpoint {
            Some(e) => format!("s3://{}/{prefix} at {e}", self.bucket),
            None => format!("s3://{}/{prefix}", self.bucket),
        }
    }
}

/// Blobs in an object store, catalogue in a database.
#[derive(Clone)]
pub struct ObjStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) os: Arc<dyn Backend>,
    prefix: String,
    pub(crate) cat: Arc<Catalogue>,
    pub(crate) algo: DigestAlgo,
    pub(crate) rt: OwnRuntime,
    busy: Claims,
    /// Uploads begun in this process, by name, while no writer has them open.
    staged: Mutex<HashMap<String, Staged>>,
    /// Names whose upload begun here another front end's upload took over, with the id of
    /// the one that did: while it is the name's pending upload, a writer here (a client's
    /// retry) is told busy rather than starting over inside it. Cleared by the next route.
    lost: Mutex<HashMap<String, String>>,
    listeners: Listeners,
    describe: String,
    /// Buffers of parts (and small blobs' PUTs) already sent, for the next ones.
    pub(crate) part_buffers: BufferPool,
    /// Windows read as streams, and streamed GETs that broke (see [`ObjStore::read_counts`]).
    streamed_windows: Arc<AtomicU64>,
    stream_failures: Arc<AtomicU64>,
    /// Clients lent to the threads that send small GETs on as they arrive (S3 only).
    pub(crate) local: Option<LocalClients>,
    /// Whether `os` checks a PUT with a `PayloadCrc32` the upload computed (see
    /// `s3http.rs`).
    signs_payloads: bool,
}

/// An upload's state between writes: what went up as parts, and the bytes after them.
struct Staged {
    upload_id: String,
    key: ObjPath,
    multipart: Option<MultipartId>,
    /// The multipart upload being started ahead of the first part (see
    /// [`Inner::start_multipart_ahead`]), until [`Inner::multipart_of`] takes it.
    creating: Option<JoinHandle<object_store::Result<MultipartId>>>,
    parts: Vec<JoinHandle<object_store::Result<PartId>>>,
    /// Permits for parts in flight (each part's task holds one until it is stored).
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Bytes sent as parts; digests of exactly those bytes.
    flushed: u64,
    hasher: Hasher,
    chunks: ChunkHasher,
    /// Bytes after `flushed`, not yet sent.
    tail: Tail,
    /// Once a range writer opened it: the parts range writers write (see
    /// `crate::objranges`). This writer's own state above then stays empty.
    ranged: Option<Arc<Ranged>>,
}

impl Staged {
    fn new(upload_id: String, key: ObjPath, algo: DigestAlgo) -> Self {
        Self {
            upload_id,
            key,
            multipart: None,
            creating: None,
            parts: Vec::new(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(PARTS_IN_FLIGHT)),
            flushed: 0,
            hasher: algo.hasher(),
            chunks: ChunkHasher::new(),
            tail: Tail::default(),
            ranged: None,
        }
    }

    fn received(&self) -> u64 {
        self.flushed + self.tail.len() as u64
    }
}

/// How the location of a blob kept in its catalogue row begins (no object has it).
const INLINE_LOCATION: &str = "inline:";

/// Whether `location` is a blob kept in its catalogue row.
fn is_inline(location: &str) -> bool {
    location.starts_with(INLINE_LOCATION)
}

/// Whether `name` is an object id this store makes (128 random bits in hex).
fn is_object_id(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The pending-upload id as stored: `<id>` or `<id> <multipart id>`.
pub(crate) fn split_upload_id(stored: &str) -> (&str, Option<&str>) {
    match stored.split_once(' ') {
        Some((id, mp)) => (id, Some(mp)),
        None => (stored, None),
    }
}

pub(crate) fn os_error(what: &str, e: object_store::Error) -> StoreError {
    StoreError::Unavailable(format!("object store: {what}: {e}"))
}

impl ObjStore {
    /// Blobs in the S3 bucket `cfg` names, catalogue `cat`. The bucket is checked (a wrong
    /// key, a missing bucket or a server that is down is reported here), then orphans left
    /// by crashes are collected.
    pub fn open_s3(cfg: &S3Config, cat: Catalogue) -> Result<Self> {
        let os = Arc::new(cfg.build()?);
        let prefix = if cfg.prefix.is_empty() { "blobs".to_string() } else { cfg.prefix.clone() };
        let describe = cfg.describe();
        let signs = cfg.signs_payloads_here();
        let cfg = cfg.clone();
        let make: MakeBackend = Box::new(move || match cfg.build() {
            Ok(os) => Some(Arc::new(os) as Arc<dyn Backend>),
            Err(e) => {
                tracing::warn!(error = %e, "cannot make a bucket client for small GETs");
                None
            }
        });
        Self::open_with(os, &prefix, cat, describe, Some(LocalClients::new(make)), signs)
    }

    /// Blobs in `os` under `prefix`, catalogue `cat`.
    pub fn open(
        os: Arc<dyn Backend>,
        prefix: &str,
        cat: Catalogue,
        describe: String,
    ) -> Result<Self> {
        Self::open_with(os, prefix, cat, describe, None, false)
    }

    fn open_with(
        os: Arc<dyn Backend>,
        prefix: &str,
        cat: Catalogue,
        describe: String,
        local: Option<LocalClients>,
        signs_payloads: bool,
    ) -> Result<Self> {
        let prefix = prefix.trim_matches('/').to_string();
        if prefix.is_empty() {
            return Err(StoreError::Config(
                "the blobs need a key prefix of their own in the bucket (e.g. \"blobs\")".into(),
            ));
        }
        let rt = OwnRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("object-store")
                .enable_all()
                .build()?,
        ));
        let store = Self {
            inner: Arc::new(Inner {
                os,
                prefix,
                cat: Arc::new(cat),
                algo: DigestAlgo::default(),
                rt,
                busy: Claims::default(),
                staged: Mutex::new(HashMap::new()),
                lost: Mutex::new(HashMap::new()),
                listeners: Listeners::default(),
                describe,
                part_buffers: BufferPool::new(PART_SIZE, SPARE_PART_BUFFERS),
                streamed_windows: Arc::default(),
                stream_failures: Arc::default(),
                local,
                signs_payloads,
            }),
        };
        store.check_reachable()?;
        store.claim_prefix()?;
        store.replay_intents()?;
        store.collect_garbage(ORPHAN_AGE)?;
        Ok(store)
    }

    /// Commit again what a crash may have lost (see bs_meta's `intent`): an intent whose
    /// object is whole in the bucket is committed as its writer asked (replacing only what
    /// it could), durably; one whose object is not there is forgotten (never stored, never
    /// acknowledged). An intent that cannot be checked stops the start: left for later, it
    /// could be replayed over a newer blob of its name.
    fn replay_intents(&self) -> Result<()> {
        let i = &self.inner;
        let intents = i.cat.intents()?;
        for (k, intent) in intents.iter().enumerate() {
            if intents[k + 1..].iter().any(|later| later.location == intent.location) {
                // A later attempt at the same key (a resend reuses it) describes its bytes;
                // settling that one drops this one with it.
                continue;
            }
            let (name, key) = (intent.record.name.clone(), i.key(&intent.location));
            match i.block_on(i.os.head(&key)) {
                Ok(m) if m.size == intent.record.size => {
                    let (overwrite, refuse) = (intent.overwrite, intent.refuse_digests.clone());
                    let allow = move |d: Option<&str>| may_replace(overwrite, &refuse, d);
                    match i.cat.commit_intended(intent, allow, Durability::Now)? {
                        Commit::Done(old) => {
                            tracing::info!(blob = %name, "committed again after a crash");
                            if let Some(old) = old.filter(|o| *o != intent.location) {
                                let _ = i.block_on(i.os.delete(&i.key(&old)));
                            }
                        }
                        Commit::Refused => {
                            let _ = i.block_on(i.os.delete(&key));
                        }
                    }
                }
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {
                    tracing::info!(blob = %name, "an upload a crash interrupted was not stored");
                    i.cat.forget_intent(&intent.location)?;
                }
                Err(e) => return Err(os_error(&format!("checking the upload of {name:?}"), e)),
            }
        }
        Ok(())
    }

    /// Windows of sequential reads fetched as streams, and streamed GETs that broke off
    /// beyond `object_store`'s own retries (their bytes fetched again), since the store
    /// was opened.
    pub fn read_counts(&self) -> (u64, u64) {
        let i = &self.inner;
        (i.streamed_windows.load(Ordering::Relaxed), i.stream_failures.load(Ordering::Relaxed))
    }

    /// Make sure the prefix's objects belong to this catalogue: `<prefix>/.catalogue` names
    /// the catalogue that owns them (written by the first front end to use the prefix). A
    /// front end with another catalogue — its own SQLite file by mistake, a wrong database
    /// name — would see every object as unreferenced and collect them all, so it is refused.
    fn claim_prefix(&self) -> Result<()> {
        let i = &self.inner;
        let ours = i.cat.instance_id()?;
        let marker = ObjPath::from(format!("{}/.catalogue", i.prefix));
        let read = || -> Result<Option<String>> {
            match i.block_on(async { i.os.get(&marker).await?.bytes().await }) {
                Ok(b) => Ok(Some(String::from_utf8_lossy(&b).trim().to_string())),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(os_error("reading the prefix's catalogue marker", e)),
            }
        };
        let owner = match read()? {
            Some(owner) => owner,
            None => {
                let body = Bytes::from(format!("{ours}\n"));
                i.block_on(i.os.put(&marker, body.into()))
                    .map_err(|e| os_error("writing the prefix's catalogue marker", e))?;
                // Two front ends with different catalogues starting at once: one wins.
                read()?.unwrap_or_default()
            }
        };
        if owner != ours {
            return Err(StoreError::Config(format!(
                "the objects under {} belong to another catalogue (id {owner}; this one is {ours}): \
                 every front end on one bucket prefix must share one catalogue (--catalogue \
                 postgres://...), or use a prefix of its own",
                i.describe
            )));
        }
        Ok(())
    }

    /// One listing request: fails clearly on a wrong key, a missing bucket, a server down.
    fn check_reachable(&self) -> Result<()> {
        let i = &self.inner;
        let prefix = ObjPath::from(i.prefix.as_str());
        let first = i.block_on(async { i.os.list(Some(&prefix)).next().await });
        match first {
            Some(Err(e)) => Err(os_error(&format!("cannot list {}", i.describe), e)),
            _ => Ok(()),
        }
    }

    /// Delete objects under the prefix that no catalogue row references and that are older
    /// than `age`; returns how many.
    pub fn collect_garbage(&self, age: Duration) -> Result<usize> {
        let i = &self.inner;
        self.expire_uploads(crate::fs::PENDING_TTL)?;
        let cutoff = cutoff_ms(age);
        let prefix = ObjPath::from(i.prefix.as_str());
        // The listing first, the catalogue after: an upload committed while the listing ran
        // is in the snapshot (as a blob, or still as a pending upload or a commit intent: a
        // commit changes them in one transaction, and rows written behind are written
        // before the snapshot), so only what was unreferenced after the listing is collected.
        let metas: Vec<object_store::ObjectMeta> = i
            .block_on(async { i.os.list(Some(&prefix)).collect::<Vec<_>>().await })
            .into_iter()
            .collect::<object_store::Result<_>>()
            .map_err(|e| os_error("listing for garbage collection", e))?;
        let live: std::collections::HashSet<String> =
            i.cat.referenced()?.iter().map(|id| split_upload_id(id).0.to_string()).collect();
        let mut removed = 0;
        for m in metas {
            // Only `<prefix>/<id>` objects are ours to collect (not the marker, not keys
            // under a deeper prefix).
            let parts: Vec<_> = m.location.parts().collect();
            let ours = parts.len() == prefix.parts().count() + 1
                && m.location.filename().is_some_and(is_object_id);
            let Some(id) = m.location.filename().filter(|_| ours) else { continue };
            if live.contains(id) || m.last_modified.timestamp_millis() > cutoff {
                continue;
            }
            tracing::info!(object = %m.location, "removing unreferenced object");
            i.block_on(i.os.delete(&m.location)).map_err(|e| os_error("deleting an orphan", e))?;
            removed += 1;
        }
        Ok(removed)
    }

    /// Fault injection for tests: flip the bits of `mask` in byte `offset` of the object
    /// of `name`, in the bucket (or of its catalogue row), keeping the catalogue's digests —
    /// bit rot in storage.
    pub fn damage(&self, name: &str, offset: u64, mask: u8) -> Result<()> {
        let i = &self.inner;
        let mut s = i.cat.stored(name)?.ok_or_else(|| StoreError::NotFound(name.to_string()))?;
        if let Some(data) = s.inline.take() {
            return catalogued::damage_inline(&i.cat, &s, data, offset, mask);
        }
        let key = i.key(&s.location);
        let mut bytes = i
            .block_on(async { i.os.get(&key).await?.bytes().await })
            .map_err(|e| os_error("reading to damage", e))?
            .to_vec();
        bytes[offset as usize] ^= mask;
        i.block_on(i.os.put(&key, Bytes::from(bytes).into()))
            .map_err(|e| os_error("damaging", e))?;
        Ok(())
    }

    /// Fault injection for tests: delete the object of `name` behind the catalogue's back.
    pub fn lose(&self, name: &str) -> Result<()> {
        let i = &self.inner;
        let s = i.cat.stored(name)?.ok_or_else(|| StoreError::NotFound(name.to_string()))?;
        if s.inline.is_some() {
            return Err(StoreError::Config(format!("{name:?} is kept in its catalogue row")));
        }
        i.block_on(i.os.delete(&i.key(&s.location))).map_err(|e| os_error("deleting", e))
    }
}

/// The store's own runtime for the object-store client (its callers block; they may be
/// threads of another runtime's blocking pool). Shut down in the background when the store
/// goes, since the last handle may be dropped inside an async task, where a runtime cannot
/// be dropped by blocking.
pub(crate) struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl OwnRuntime {
    pub(crate) fn new(rt: tokio::runtime::Runtime) -> Self {
        Self(Some(rt))
    }
}

impl std::ops::Deref for OwnRuntime {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("present until drop")
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl Inner {
    fn key(&self, id: &str) -> ObjPath {
        ObjPath::from(format!("{}/{id}", self.prefix))
    }

    /// Run a future on this store's runtime from a blocking caller (kept off any executor
    /// the caller may be on: see [`bs_meta::off_executor`]).
    pub(crate) fn block_on<F: std::future::Future + Send>(&self, f: F) -> F::Output
    where
        F::Output: Send,
    {
        bs_meta::off_executor(|| self.rt.block_on(f))
    }

    /// Abort the multipart upload a stored upload id names, if any (best effort: an upload
    /// already gone is fine).
    /// Delete, in the background, the object of `location`, which a commit of `blob` just
    /// replaced (nothing references it any more: the writer need not wait for it). If the
    /// delete fails, or this process stops first, garbage collection takes it.
    fn drop_replaced(&self, location: &str, blob: &str) {
        if is_inline(location) {
            return;
        }
        let (os, old, blob) = (self.os.clone(), self.key(location), blob.to_string());
        self.rt.spawn(async move {
            if let Err(e) = os.delete(&old).await {
                tracing::warn!(%blob, error = %e, "replaced object stays until collected");
            }
        });
    }

    fn abort_stored(&self, stored_id: &str) {
        if let (id, Some(mp)) = split_upload_id(stored_id) {
            let key = self.key(id);
            if let Err(e) = self.block_on(self.os.abort_multipart(&key, &mp.to_string())) {
                tracing::warn!(%key, error = %e, "cannot abort a multipart upload");
            }
        }
    }

    fn lost_names(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take_staged(&self, name: &str) -> Option<Staged> {
        self.staged.lock().unwrap_or_else(|p| p.into_inner()).remove(name)
    }

    fn put_staged(&self, name: &str, s: Staged) {
        self.staged.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), s);
    }

    /// Give up an upload begun here that nobody writes: its part uploads and its multipart
    /// upload.
    fn abandon(&self, mut s: Staged) {
        if let Some(r) = &s.ranged {
            r.abandon(self);
        }
        for p in s.parts.drain(..) {
            p.abort();
        }
        if let Some(mp) = self.multipart_of(&mut s).ok().flatten()
            && let Err(e) = self.block_on(self.os.abort_multipart(&s.key, &mp))
        {
            tracing::warn!(key = %s.key, error = %e, "cannot abort a multipart upload");
        }
    }

    /// For an upload of a part or more (so sent in parts), not begun: start its multipart
    /// upload now, while its first part's bytes are still arriving, rather than once they
    /// are all in (on Garage here the request takes ~3 ms, during which the writer's thread
    /// would wait and the client with it).
    fn start_multipart_ahead(&self, s: &mut Staged, size: Option<u64>) {
        // Nothing received: no part sent, so no multipart upload yet.
        if size.is_some_and(|n| n >= PART_SIZE as u64) && s.received() == 0 && s.creating.is_none()
        {
            let (os, key) = (self.os.clone(), s.key.clone());
            s.creating = Some(self.rt.spawn(async move { os.create_multipart(&key).await }));
        }
    }

    /// The upload's multipart upload: the one it has, or the one started ahead once that
    /// request is answered (an error if it failed); `None` when there is neither.
    fn multipart_of(&self, s: &mut Staged) -> object_store::Result<Option<MultipartId>> {
        if let Some(h) = s.creating.take() {
            let created = self
                .block_on(h)
                .unwrap_or_else(|e| Err(object_store::Error::JoinError { source: e }));
            s.multipart = Some(created?);
        }
        Ok(s.multipart.clone())
    }

    /// Abort the multipart upload of another front end's pending upload `u` if it was routed
    /// so long ago that nobody can still be writing it.
    fn abort_if_abandoned(&self, u: &UploadRecord) {
        if u.created_ms < cutoff_ms(ORPHAN_AGE) {
            self.abort_stored(&u.upload_id);
        }
    }

    /// Drop the pending upload of `name`: its row, its multipart upload, its parts here.
    fn discard_upload(&self, name: &str) -> Result<Option<String>> {
        let staged = self.take_staged(name);
        let id = self.cat.delete_upload(name)?;
        match (staged, &id) {
            (Some(s), _) => self.abandon(s),
            (None, Some(id)) => self.abort_stored(id),
            (None, None) => {}
        }
        Ok(id)
    }
}

impl Store for ObjStore {
    fn describe(&self) -> String {
        self.inner.describe.clone()
    }

    fn digest_algo(&self) -> DigestAlgo {
        self.inner.algo
    }

    fn stat(&self, name: &str) -> Result<BlobRecord> {
        catalogued::stat(&self.inner.cat, name)
    }

    fn corrupt_mark(&self, name: &str) -> Result<Option<String>> {
        catalogued::corrupt_mark(&self.inner.cat, name)
    }

    fn corrupt_marks(&self, names: &[String]) -> Result<Vec<(String, String)>> {
        Ok(self.inner.cat.corrupt_among(names)?)
    }

    fn list(&self, prefix: &str, after: &str, limit: usize) -> Result<Vec<BlobRecord>> {
        Ok(self.inner.cat.list(prefix, after, limit)?)
    }

    fn delete(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let i = &self.inner;
        let upload = match i.busy.take(name) {
            Ok(_claim) => i.discard_upload(name)?,
            Err(_) => None,
        };
        // The row first: once it is gone the blob is gone, whatever happens to the object
        // (an object left behind is an orphan, collected later).
        match i.cat.delete_blob(name)? {
            Some(loc) => {
                if !is_inline(&loc)
                    && let Err(e) = i.block_on(i.os.delete(&i.key(&loc)))
                {
                    tracing::warn!(%name, error = %e, "blob deleted; its object stays until collected");
                }
                i.listeners.notify(StoreEvent::Deleted(name.to_string()));
                Ok(())
            }
            None if upload.is_some() => Ok(()),
            None => Err(StoreError::NotFound(name.to_string())),
        }
    }

    fn route(&self, spec: &RouteSpec) -> Result<Routed> {
        validate_name(&spec.name)?;
        let i = &self.inner;
        catalogued::refuse_existing(&i.cat, &spec.name, spec.overwrite, &spec.refuse_digests)?;
        let _claim = i.busy.take(&spec.name)?;
        // Under the claim nobody else touches this name's staged state; the map's lock is
        // held only to take it out and put it back, never across network calls.
        i.lost_names().remove(&spec.name);
        let existing = i.cat.upload(&spec.name)?;
        let (ours, stale) = match i.take_staged(&spec.name) {
            Some(s)
                if existing
                    .as_ref()
                    .is_some_and(|u| s.upload_id == split_upload_id(&u.upload_id).0) =>
            {
                (Some(s), None)
            }
            other => (None, other),
        };
        if let Some(s) = stale {
            // Our upload whose row another front end replaced: nobody writes it any more.
            i.abandon(s);
        }
        if let (Some(u), Some(s)) = (&existing, &ours)
            && !spec.resume_tag.is_empty()
            && u.size == spec.size
            && u.resume_tag == spec.resume_tag
        {
            // Begun here: keep the bytes, take this request's type, metadata and flags.
            let (received, received_digest) = match s.ranged.as_ref() {
                // Written in ranges: what is held from the start, with no digest of it (the
                // bytes of parts sent are not here to digest): a put over one connection
                // starts over, a parallel one asks what each range holds.
                Some(r) => (r.held_prefix(), None),
                None => {
                    let received = s.received();
                    let digest = (received > 0).then(|| {
                        let mut h = s.hasher.clone();
                        h.update(s.tail.as_slice());
                        h.finish()
                    });
                    (received, digest)
                }
            };
            let upload_id = s.upload_id.clone();
            i.put_staged(&spec.name, ours.expect("matched"));
            i.cat.put_upload(&spec.upload_record(u.upload_id.clone()))?;
            return Ok(Routed { upload_id, received, received_digest, resumed: true });
        }
        match (&existing, ours) {
            // Ours and idle (we hold the claim): abort it.
            (Some(_), Some(s)) => i.abandon(s),
            // Another front end's: it may be writing it right now, so its multipart upload
            // is left alone unless it is old enough to be abandoned.
            (Some(u), None) => i.abort_if_abandoned(u),
            (None, _) => {}
        }
        let id = new_id();
        let rec = spec.upload_record(id.clone());
        i.cat.put_upload(&rec)?;
        i.put_staged(&spec.name, Staged::new(id.clone(), i.key(&id), i.algo));
        Ok(Routed { upload_id: id, received: 0, received_digest: None, resumed: false })
    }

    fn open_upload(&self, name: &str) -> Result<Box<dyn UploadSink>> {
        validate_name(name)?;
        let i = &self.inner;
        let claim = i.busy.take(name)?;
        let rec = i.cat.upload(name)?.ok_or_else(|| StoreError::NoUpload(name.to_string()))?;
        let (id, _) = split_upload_id(&rec.upload_id);
        let mut state = match i.take_staged(name) {
            Some(s) if s.upload_id == id => s,
            Some(s) => {
                // Begun here, then taken over by another front end's upload (routed again
                // there, or its first part sent there): it has the name's upload (its size,
                // its flags), so this one has lost it, now and on every retry while the
                // other is the name's upload.
                i.abandon(s);
                i.lost_names().insert(name.into(), id.into());
                return Err(StoreError::Busy(name.to_string()));
            }
            None if i.lost_names().get(name).is_some_and(|l| l == id) => {
                return Err(StoreError::Busy(name.to_string()));
            }
            None => {
                // Routed by another front end, or before a restart: start over here.
                i.lost_names().remove(name);
                i.abort_if_abandoned(&rec);
                let fresh = new_id();
                let rec = UploadRecord { upload_id: fresh.clone(), ..rec.clone() };
                i.cat.put_upload(&rec)?;
                Staged::new(fresh.clone(), i.key(&fresh), i.algo)
            }
        };
        if let Some(r) = &state.ranged {
            if r.writing() {
                // Range writers are at it (they count themselves in under the map's lock
                // while nobody holds the claim, which is held here): theirs until done.
                i.put_staged(name, state);
                return Err(StoreError::Busy(name.to_string()));
            }
            if r.is_empty() {
                state.ranged = None;
            }
        }
        claim.keep(); // from here on the sink releases it when dropped
        if state.ranged.is_none() {
            i.start_multipart_ahead(&mut state, rec.size);
        }
        let rec = UploadRecord { upload_id: state.upload_id.clone(), ..rec };
        // A small blob whose PUT is signed here has its CRC-32 taken as its bytes arrive.
        let small = rec.size.is_some_and(|n| n < PART_SIZE as u64);
        let crc = (i.signs_payloads && small && state.received() == 0).then(RunningCrc::new);
        Ok(Box::new(ObjUpload {
            store: self.inner.clone(),
            rec,
            state: Some(state),
            deferred: None,
            crc,
        }))
    }

    fn open_upload_range(&self, name: &str, start: u64) -> Result<Option<Box<dyn UploadSink>>> {
        validate_name(name)?;
        let i = &self.inner;
        let rec = i.cat.upload(name)?.ok_or_else(|| StoreError::NoUpload(name.to_string()))?;
        let size = range_size(name, rec.size, start, inline_sized(rec.size))?;
        let (id, _) = split_upload_id(&rec.upload_id);
        let ranged = {
            // Counted in under the map's lock, and only while nobody holds the upload's
            // claim: one writer taking it (or its committer) checks the count after taking
            // the claim and the upload out of the map, so the two never write it together.
            let mut staged = i.staged.lock().unwrap_or_else(|p| p.into_inner());
            if i.busy.is_held(name) {
                return Err(StoreError::Busy(name.to_string()));
            }
            match staged.get_mut(name) {
                Some(s) if s.upload_id == id && s.received() == 0 => {
                    let r = s.ranged.get_or_insert_with(|| {
                        Arc::new(Ranged::new(name, id, s.key.clone(), size))
                    });
                    r.writer(i.clone(), start)
                }
                Some(s) if s.upload_id == id => {
                    return Err(StoreError::Unsupported(format!(
                        "the upload of {name:?} is being written over one connection ({} \
                         bytes so far): it takes no range writers",
                        s.received()
                    )));
                }
                // Routed by another front end, or before a restart: its ranges are routed
                // again here (a new id), and start over.
                _ => return Err(StoreError::NoUpload(name.to_string())),
            }
        };
        Ok(Some(Box::new(ranged)))
    }

    fn takes_range_writes(&self) -> bool {
        true
    }

    fn upload_piece_digests(
        &self,
        name: &str,
        offset: u64,
        len: u64,
        piece: u64,
        algo: DigestAlgo,
    ) -> Result<Option<Vec<Digest>>> {
        validate_name(name)?;
        let i = &self.inner;
        let rec = i.cat.upload(name)?.ok_or_else(|| StoreError::NoUpload(name.to_string()))?;
        let (id, _) = split_upload_id(&rec.upload_id);
        let ranged = {
            let staged = i.staged.lock().unwrap_or_else(|p| p.into_inner());
            staged.get(name).filter(|s| s.upload_id == id).and_then(|s| s.ranged.clone())
        };
        // Bytes one writer sent are not told here (a resumed put continues after what its
        // route says it holds); nor are bytes held elsewhere.
        Ok(Some(ranged.map(|r| r.piece_digests(offset, len, piece, algo)).unwrap_or_default()))
    }

    fn abort(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let i = &self.inner;
        let _claim = i.busy.take(name)?;
        i.discard_upload(name)?.ok_or_else(|| StoreError::NoUpload(name.to_string()))?;
        Ok(())
    }

    fn open_read(&self, name: &str) -> Result<BlobSource> {
        let i = &self.inner;
        let s = catalogued::readable(&i.cat, name)?;
        let Some(chunks) = &s.chunks else {
            return Err(StoreError::Corrupt {
                name: name.to_string(),
                reason: "catalogue row has no chunk digests".into(),
            });
        };
        let chunks = ChunkDigests::decode(chunks, s.record.size).map_err(|e| {
            StoreError::Corrupt { name: name.to_string(), reason: format!("catalogue: {e}") }
        })?;
        let marker = catalogued::marker(i.cat.clone(), name, &s.location);
        if let Some(data) = s.inline {
            return BlobSource::memory(s.record, data.into(), chunks, Some(marker));
        }
        let reader = Arc::new(ObjReader {
            store: self.inner.clone(),
            name: name.to_string(),
            key: i.key(&s.location),
            size: s.record.size,
            marker: marker.clone(),
            ahead: Mutex::new(std::collections::VecDeque::new()),
            streams: Mutex::new(std::collections::VecDeque::new()),
            stream_end: AtomicU64::new(s.record.size),
            streamed_windows: i.streamed_windows.clone(),
            stream_failures: i.stream_failures.clone(),
            sequential: std::sync::atomic::AtomicBool::new(false),
        });
        BlobSource::remote(s.record, reader, chunks, Some(marker))
    }

    fn subscribe(&self, listener: Listener) {
        self.inner.listeners.add(listener);
    }

    fn expire_uploads(&self, age: Duration) -> Result<Vec<String>> {
        let i = &self.inner;
        catalogued::expire_uploads(&i.cat, &i.busy, age, |name| {
            // Range writers at it keep it, as one writer does by its claim.
            let staged = i.staged.lock().unwrap_or_else(|p| p.into_inner());
            if staged.get(name).and_then(|s| s.ranged.as_ref()).is_some_and(|r| r.writing()) {
                return Ok(None);
            }
            drop(staged);
            i.discard_upload(name)
        })
    }
}

/// A range being fetched ahead: offset, length, the fetch.
type Ahead = (u64, u64, JoinHandle<object_store::Result<Bytes>>);

/// Windows fetched ahead of a sequential reader, at most.
const READ_AHEAD: usize = 3;

/// Ranged reads of one blob's object, with the next windows fetched ahead.
struct ObjReader {
    store: Arc<Inner>,
    name: String,
    key: ObjPath,
    size: u64,
    marker: CorruptionMarker,
    ahead: Mutex<std::collections::VecDeque<Ahead>>,
    /// A sequential reader's next windows, each one GET handed out chunk by chunk as it
    /// arrives (see `crate::objstream`), [`READ_AHEAD`] after the one being read.
    streams: Mutex<std::collections::VecDeque<ObjStream>>,
    /// Where the sequential run the streams serve ends (they fetch nothing past it).
    stream_end: AtomicU64,
    /// Windows started as streams, and streamed GETs that broke (counted in the store).
    streamed_windows: Arc<AtomicU64>,
    stream_failures: Arc<AtomicU64>,
    /// Whether a window fetched ahead was read: a sequential reader, worth fetching further
    /// ahead for (until then one window ahead, so a reader of one range costs little).
    sequential: std::sync::atomic::AtomicBool,
}

impl RangeRead for ObjReader {
    fn read(&self, offset: u64, len: u64) -> Result<Bytes> {
        // The window whose GET broke, when one did: fetched again after this read.
        let mut broken = None;
        {
            let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
            let covers = streams.front().is_some_and(|st| st.next() == offset)
                && streams.back().is_some_and(|st| offset + len <= st.end());
            if covers {
                match self.take_streamed(&mut streams, len) {
                    // Short only when the object is: the caller reports that.
                    Ok(got) => return Ok(got),
                    Err(e) => {
                        // A GET broken beyond object_store's own retries: this range is
                        // fetched on its own (a missing object handled as below), then the
                        // rest of its window again; the windows after it stay.
                        tracing::debug!(name = %self.name, offset, "streamed GET failed: {e}");
                        self.stream_failures.fetch_add(1, Ordering::Relaxed);
                        broken = streams.pop_front().map(|st| st.end());
                    }
                }
            } else if !streams.is_empty() {
                // A read elsewhere, or past the run the windows were started for.
                streams.clear();
                self.stream_end.store(self.size, Ordering::Relaxed);
            }
        }
        let got = self.read_fetched(offset, len)?;
        if let Some(end) = broken
            && offset + len < end
        {
            let (os, key) = (self.store.os.clone(), self.key.clone());
            let st = ObjStream::start(&self.store.rt, os, key, (offset + len, end), self.size);
            self.streams.lock().unwrap_or_else(|p| p.into_inner()).push_front(st);
        }
        Ok(got)
    }

    fn streaming_at(&self, offset: u64) -> bool {
        let streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.front().is_some_and(|st| st.next() == offset)
    }

    fn arriving(
        &self,
        from: u64,
        to: u64,
    ) -> Option<Box<dyn Iterator<Item = Result<Bytes>> + Send>> {
        let (os, key) = (self.store.os.clone(), self.key.clone());
        let store = self.store.clone();
        Some(Box::new(EarlyGet::start(store, &self.name, os, key, (from, to), self.size)))
    }

    fn sequential(&self, from: u64, to: u64) {
        self.sequential.store(true, Ordering::Relaxed);
        let to = to.min(self.size);
        let end = self.stream_end.swap(to, Ordering::Relaxed);
        if end != to || !self.streaming_at(from) {
            self.start_streams(from);
        }
    }

    /// Fetch `offset..offset + len` and the windows of the same length after it, up to
    /// [`READ_AHEAD`] in flight (those already under way are kept) — unless the reader's
    /// streamed windows are on their way there.
    fn prefetch(&self, offset: u64, len: u64) {
        {
            let streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
            if streams.front().is_some_and(|st| st.next() <= offset) {
                return; // on its way
            }
            if offset >= self.stream_end.swap(self.size, Ordering::Relaxed) {
                // Just past the end of the sequential run asked for: not wanted. (The run
                // is over: later reads are fetched ahead as usual.)
                return;
            }
        }
        let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        let mut at = ahead.back().map_or(offset, |(o, l, _)| (o + l).max(offset));
        if ahead.front().is_some_and(|(o, _, _)| *o > offset) {
            // Not the run the windows were fetched for: start again here.
            for (_, _, h) in ahead.drain(..) {
                h.abort();
            }
            at = offset;
        }
        let depth = if self.sequential.load(Ordering::Relaxed) { READ_AHEAD } else { 1 };
        while ahead.len() < depth && at < self.size {
            let n = len.min(self.size - at);
            let (os, key) = (self.store.os.clone(), self.key.clone());
            let size = self.size;
            let h = self.store.rt.spawn(async move { fetch(&*os, &key, at, n, size).await });
            ahead.push_back((at, n, h));
            at += n;
        }
    }
}

impl ObjReader {
    /// Stream windows from `offset` on, replacing any fetched ahead.
    fn start_streams(&self, offset: u64) {
        for (_, _, h) in self.ahead.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            h.abort();
        }
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.clear();
        self.top_up(&mut streams, offset);
    }

    /// Start windows after the last one (from `offset` when there is none) until
    /// [`READ_AHEAD`] follow the one being read, up to the end of the sequential run.
    fn top_up(&self, streams: &mut std::collections::VecDeque<ObjStream>, offset: u64) {
        let end = self.stream_end.load(Ordering::Relaxed);
        let mut at = streams.back().map_or(offset, |st| st.end());
        while streams.len() <= READ_AHEAD && at < end {
            let to = (at + REMOTE_WINDOW).min(end);
            let (os, key) = (self.store.os.clone(), self.key.clone());
            streams.push_back(ObjStream::start(&self.store.rt, os, key, (at, to), self.size));
            self.streamed_windows.fetch_add(1, Ordering::Relaxed);
            at = to;
        }
    }

    /// The next `len` bytes of the streamed windows, across as many as they span.
    fn take_streamed(
        &self,
        streams: &mut std::collections::VecDeque<ObjStream>,
        len: u64,
    ) -> object_store::Result<Bytes> {
        let mut parts = Vec::new();
        let mut have = 0u64;
        while have < len {
            let Some(st) = streams.front_mut() else { break };
            let want = (len - have).min(st.end() - st.next());
            let got = self.store.block_on(st.take(want))?;
            have += got.len() as u64;
            let short = (got.len() as u64) < want;
            parts.push(got);
            if short {
                break; // the object ends early: the caller reports it
            }
            if st.next() == st.end() {
                streams.pop_front();
                if let Some(last) = streams.back().map(|st| st.end()) {
                    self.top_up(streams, last);
                }
            }
        }
        Ok(match parts.len() {
            1 => parts.pop().unwrap_or_default(),
            _ => parts.concat().into(),
        })
    }

    /// `offset..offset + len` from a window fetched ahead, or fetched now.
    fn read_fetched(&self, offset: u64, len: u64) -> Result<Bytes> {
        let s = &self.store;
        let fetched = {
            let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
            // Windows before this read will not be wanted; one at this offset is the read.
            while let Some((o, l, _)) = ahead.front() {
                if (*o, *l) == (offset, len) || *o > offset {
                    break;
                }
                if let Some((_, _, h)) = ahead.pop_front() {
                    h.abort();
                }
            }
            match ahead.front() {
                Some((o, l, _)) if (*o, *l) == (offset, len) => ahead.pop_front().map(|a| a.2),
                _ => None,
            }
        };
        let got = match fetched {
            Some(h) => {
                self.sequential.store(true, Ordering::Relaxed);
                s.block_on(h).unwrap_or_else(|e| Err(object_store::Error::JoinError { source: e }))
            }
            None => s.block_on(fetch(&*s.os, &self.key, offset, len, self.size)),
        };
        // An object reported missing is asked for once more before the blob is marked: a
        // server without read-after-write consistency, or one re-balancing, may say so
        // for a moment.
        let got = match got {
            Err(object_store::Error::NotFound { .. }) => {
                std::thread::sleep(Duration::from_millis(200));
                s.block_on(s.os.get_range(&self.key, offset..offset + len))
            }
            other => other,
        };
        match got {
            Ok(b) => Ok(b),
            Err(object_store::Error::NotFound { .. }) => {
                // Unless the blob was deleted or replaced just now, its bytes are gone.
                if s.cat.stored(&self.name)?.is_none_or(|now| s.key(&now.location) != self.key) {
                    return Err(StoreError::NotFound(self.name.clone()));
                }
                let reason = "its object is missing from the bucket".to_string();
                crate::source::count_corruption(&self.name, &reason);
                (self.marker)(&reason);
                Err(StoreError::Corrupt { name: self.name.clone(), reason })
            }
            Err(e) => Err(os_error(&format!("reading {:?}", self.name), e)),
        }
    }
}

/// Bytes `offset..offset + len` of the object at `key` (`size` bytes long): one plain GET
/// when that is the whole object (a ranged request costs the server more), else a ranged GET.
async fn fetch(
    os: &dyn Backend,
    key: &ObjPath,
    offset: u64,
    len: u64,
    size: u64,
) -> object_store::Result<Bytes> {
    if offset == 0 && len == size {
        os.get(key).await?.bytes().await
    } else {
        os.get_range(key, offset..offset + len).await
    }
}

impl Drop for ObjReader {
    fn drop(&mut self) {
        for (_, _, h) in self.ahead.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            h.abort();
        }
    }
}

/// A pending upload open for writing.
struct ObjUpload {
    store: Arc<Inner>,
    rec: UploadRecord,
    /// `None` once committed.
    state: Option<Staged>,
    /// A part that could not be sent when bytes lent for it filled it (`filled` cannot say
    /// so): the next write or commit reports it.
    deferred: Option<StoreError>,
    /// A small blob's CRC-32 as its bytes arrive, for its one PUT's check (see
    /// `s3http.rs`); `None` when its client does not sign here, for a blob of a part or
    /// more, or once rolled back (the CRC is then taken as the PUT leaves).
    crc: Option<RunningCrc>,
}

impl ObjUpload {
    fn state(&mut self) -> &mut Staged {
        self.state.as_mut().expect("open until commit")
    }

    /// Send the tail as the next part, keeping at most [`PARTS_IN_FLIGHT`] in flight.
    fn send_part(&mut self) -> Result<()> {
        let store = self.store.clone();
        let name = self.rec.name.clone();
        let rec = self.rec.clone();
        let s = self.state();
        if s.multipart.is_none() {
            let starting = |e| os_error("starting a multipart upload", e);
            let mp = match store.multipart_of(s).map_err(starting)? {
                Some(ahead) => ahead,
                None => store.block_on(store.os.create_multipart(&s.key)).map_err(starting)?,
            };
            s.multipart = Some(mp.clone());
            // Recorded so a front end that expires this upload can abort it.
            let stored = UploadRecord { upload_id: format!("{} {mp}", s.upload_id), ..rec };
            store.cat.put_upload(&stored)?;
        }
        // Wait while too many parts are in flight.
        let permit = store
            .block_on(s.in_flight.clone().acquire_owned())
            .expect("the semaphore is never closed");
        // The tail's buffer goes up as it is (back to the pool once the PUT lets go of it,
        // before the permit: the writer waiting for the permit may take it).
        let part = s.tail.take();
        // Both digests a slice at a time: the second pass over it reads it from the cache,
        // not from memory (a part is 8 MiB).
        for piece in part.chunks(HASH_PIECE) {
            s.hasher.update(piece);
            s.chunks.update(piece);
        }
        s.flushed += part.len() as u64;
        let (os, key, mp, idx) =
            (store.os.clone(), s.key.clone(), s.multipart.clone().expect("created"), s.parts.len());
        let payload = PutPayload::from(part);
        s.parts.push(store.rt.spawn(async move {
            let stored = os.put_part(&key, &mp, idx, payload).await;
            drop(permit);
            stored
        }));
        tracing::trace!(blob = %name, part = idx, "part sent");
        Ok(())
    }

    /// Wait for a PUT or multipart completion that will not be committed, and delete the
    /// object if it was stored (a resend reuses its key).
    fn undo_stored(&mut self, storing: JoinHandle<object_store::Result<()>>) {
        let i = self.store.clone();
        let key = self.state().key.clone();
        if matches!(i.block_on(storing), Ok(Ok(()))) {
            // A completed multipart upload is no longer there to abort.
            self.state().multipart = None;
            if let Err(e) = i.block_on(i.os.delete(&key)) {
                tracing::warn!(%key, error = %e, "an object not committed stays until collected");
            }
        }
    }

    /// Commit a blob of up to [`INLINE_UP_TO`] bytes, all of them in the tail, inside its
    /// catalogue row (durable when this returns). A commit that fails starts the upload over.
    /// `wrong`: the error for bytes of that digest, if they are not what was written.
    fn commit_inline(
        mut self: Box<Self>,
        wrong: &dyn Fn(&Digest) -> Option<StoreError>,
    ) -> Result<BlobRecord> {
        let i = self.store.clone();
        let name = self.rec.name.clone();
        let (overwrite, refuse) = (self.rec.overwrite, self.rec.refuse_digests.clone());
        let s = self.state();
        let body = s.tail.take();
        let (mut hasher, mut chunks) = (s.hasher.clone(), s.chunks.clone());
        hasher.update(&body);
        chunks.update(&body);
        let digest = hasher.finish();
        if let Some(e) = wrong(&digest) {
            self.restart();
            return Err(e);
        }
        let record = BlobRecord {
            name: name.clone(),
            size: body.len() as u64,
            content_type: self.rec.content_type.clone(),
            digest: digest.to_string(),
            created_ms: now_ms(),
            metadata: self.rec.metadata.clone(),
        };
        let location = format!("{INLINE_LOCATION}{}", self.state().upload_id);
        let chunks = chunks.finish().encode();
        let committed = i.cat.commit_blob(&record, &location, &chunks, Some(body), move |d| {
            may_replace(overwrite, &refuse, d)
        });
        match committed {
            Ok(Commit::Done(old)) => {
                self.state = None;
                if let Some(old) = old {
                    i.drop_replaced(&old, &name);
                }
                i.listeners.notify(StoreEvent::Committed(record.clone()));
                Ok(record)
            }
            Ok(Commit::Refused) => {
                self.restart();
                Err(crate::store::refused(&name, &self.rec.refuse_digests))
            }
            Err(e) => {
                self.restart();
                Err(e.into())
            }
        }
    }

    /// Take the bytes just arrived into the running CRC-32, if there is one.
    fn feed_crc(&mut self) {
        // Only a blob smaller than a part has one: its tail is the whole blob.
        if let (Some(crc), Some(s)) = (self.crc.as_mut(), self.state.as_ref())
            && !crc.feed(s.tail.as_slice())
        {
            self.crc = None;
        }
    }

    /// Start this upload over from its first byte (a rollback into bytes already sent).
    /// Make the bytes `storing` puts in the bucket (one PUT, or the completion of the
    /// multipart upload) the blob: its row made durable as an intent while they are stored,
    /// then committed. Whatever fails before the row is written starts the upload over.
    fn land(
        mut self: Box<Self>,
        digest: Digest,
        chunks: Vec<u8>,
        size: u64,
        storing: JoinHandle<object_store::Result<()>>,
    ) -> Result<BlobRecord> {
        let i = self.store.clone();
        let name = self.rec.name.clone();
        let (overwrite, refuse) = (self.rec.overwrite, self.rec.refuse_digests.clone());
        let s = self.state();
        let (key, id) = (s.key.clone(), s.upload_id.clone());
        // While the bucket stores the bytes, the row they will have is made durable as an
        // intent, so the commit after them need not wait for the disk (see bs_meta's
        // `intent`): the catalogue's fsync and the bucket's work overlap.
        let intent = CommitIntent {
            record: BlobRecord {
                name: name.clone(),
                size,
                content_type: self.rec.content_type.clone(),
                digest: digest.to_string(),
                created_ms: now_ms(),
                metadata: self.rec.metadata.clone(),
            },
            location: id.clone(),
            chunks,
            overwrite,
            refuse_digests: refuse.clone(),
        };
        let kept = match i.cat.intend(&intent) {
            Ok(kept) => kept,
            Err(e) => {
                // Nothing may rest on an intent that is not there: the upload is not
                // committed, and the writer may send it all again.
                self.undo_stored(storing);
                self.restart();
                return Err(e.into());
            }
        };
        let stored = i
            .block_on(storing)
            .unwrap_or_else(|e| Err(object_store::Error::JoinError { source: e }));
        if let Err(e) = stored {
            // Nothing of it is visible; the writer may send it all again.
            if kept && let Err(f) = i.cat.forget_intent(&id) {
                // Left behind, it is replayed at the next start only if the object is there.
                tracing::warn!(blob = %name, error = %f, "cannot drop the intent of a failed upload");
            }
            self.restart();
            return Err(os_error(&format!("storing {name:?}"), e));
        }
        self.state = None; // committed or not, these bytes are the object's now
        let outcome = i.cat.commit_intended(
            &intent,
            move |d| may_replace(overwrite, &refuse, d),
            Durability::Lazy,
        );
        match outcome {
            // The replaced object goes while the writer is told, not before (one request
            // to the bucket less on every replace).
            Ok(Commit::Done(Some(old))) => i.drop_replaced(&old, &name),
            Ok(Commit::Done(None)) => {}
            Ok(Commit::Refused) => {
                if let Err(e) = i.block_on(i.os.delete(&key)) {
                    tracing::warn!(%key, error = %e, "commit refused; the object stays until collected");
                }
                return Err(crate::store::refused(&name, &self.rec.refuse_digests));
            }
            // Whether the row was written is not known for every error (a connection lost
            // after the commit was sent, a lazy commit whose making durable failed): the
            // object stays, and is collected if unreferenced.
            Err(e) => {
                if kept && let Err(f) = i.cat.forget_intent(&id) {
                    tracing::warn!(blob = %name, error = %f, "cannot drop the intent of a failed commit");
                }
                // Landed all the same: whoever follows the store (a tier's copies, the image
                // index) hears of it as of any commit, so nothing keeps serving what it
                // replaced.
                if i.cat.stored(&name).ok().flatten().is_some_and(|s| s.location == id) {
                    i.listeners.notify(StoreEvent::Committed(intent.record.clone()));
                }
                return Err(e.into());
            }
        }
        let record = intent.record;
        i.listeners.notify(StoreEvent::Committed(record.clone()));
        Ok(record)
    }

    fn restart(&mut self) {
        self.crc = None;
        let store = self.store.clone();
        let s = self.state();
        for p in s.parts.drain(..) {
            p.abort();
        }
        if let Some(mp) = store.multipart_of(s).ok().flatten()
            && let Err(e) = store.block_on(store.os.abort_multipart(&s.key, &mp))
        {
            tracing::warn!(key = %s.key, error = %e, "cannot abort a multipart upload");
        }
        let (id, key, ranged) = (s.upload_id.clone(), s.key.clone(), s.ranged.take());
        *s = Staged::new(id, key, store.algo);
        if let Some(r) = ranged {
            r.start_over(&store);
            s.ranged = Some(r);
        }
    }

    /// Refuse one writer's bytes (or commit) into an upload range writers write.
    fn one_writer(&self) -> Result<()> {
        match self.state.as_ref().and_then(|s| s.ranged.as_ref()) {
            Some(_) => Err(StoreError::Unsupported(format!(
                "the upload of {:?} is written in ranges over several connections: commit it \
                 once every range is in (with the chunk digests), or abort it",
                self.rec.name
            ))),
            None => Ok(()),
        }
    }
}

impl Drop for ObjUpload {
    fn drop(&mut self) {
        // The writer went away: keep what it wrote for a resume from this process.
        if let Some(s) = self.state.take() {
            self.store
                .staged
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(self.rec.name.clone(), s);
        }
        self.store.busy.release(&self.rec.name);
    }
}

impl UploadSink for ObjUpload {
    fn size(&self) -> Option<u64> {
        self.rec.size
    }

    fn upload_id(&self) -> Option<&str> {
        Some(&self.rec.upload_id)
    }

    fn received(&self) -> u64 {
        self.state.as_ref().map_or(0, Staged::received)
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        self.one_writer()?;
        check_write(self.rec.size, self.received(), offset, data.len())?;
        if offset < self.received() {
            self.crc = None; // bytes taken into the CRC are written again
        }
        let s = self.state();
        if offset < s.flushed {
            // Those bytes went up as parts already; take the rewrite as a rollback to it.
            let keep = offset;
            self.truncate(keep)?;
            if self.received() != offset {
                return Err(StoreError::Gap { offset, received: self.received() });
            }
        }
        let (mut offset, mut data) = (offset, data);
        while !data.is_empty() {
            // What the blob has left from the tail's start: a part or more goes into a
            // part's buffer, as does every part of an upload sent in parts; a small blob of
            // known size into one too from `tail::POOLED_FROM` bytes on, else into a
            // buffer of its size.
            let s = self.state.as_mut().expect("open until commit");
            let rest = self.rec.size.map_or(u64::MAX, |n| n - s.flushed);
            let pooled = rest >= PART_SIZE as u64 || s.multipart.is_some();
            let at = (offset - s.flushed) as usize;
            let n = s.tail.write(at, data, pooled, rest, &self.store.part_buffers);
            (offset, data) = (offset + n as u64, &data[n..]);
            if s.tail.full() {
                self.send_part()?;
            }
        }
        self.feed_crc();
        Ok(())
    }

    fn lend(&mut self, offset: u64, len: u64) -> Option<&mut [u8]> {
        // An upload of known size, appended to: a small blob's one PUT buffer, or the
        // buffer of the part under way, is filled in place.
        let size = self.rec.size?;
        if self.deferred.is_some() || self.one_writer().is_err() {
            return None;
        }
        check_write(Some(size), self.received(), offset, len as usize).ok()?;
        let s = self.state.as_mut()?;
        let rest = size - s.flushed;
        let pooled = s.multipart.is_some() || rest >= PART_SIZE as u64;
        let pool = &self.store.part_buffers;
        s.tail.lend((offset - s.flushed) as usize, len as usize, rest as usize, pooled, pool)
    }

    fn filled(&mut self, offset: u64, n: u64) {
        if let Some(s) = self.state.as_mut()
            && let Some(at) = offset.checked_sub(s.flushed)
        {
            s.tail.filled(at as usize, n as usize);
            if s.tail.full()
                && let Err(e) = self.send_part()
            {
                self.deferred = Some(e);
            }
        }
        self.feed_crc();
    }

    fn truncate(&mut self, len: u64) -> Result<()> {
        let s = self.state();
        if len >= s.received() {
            return Ok(());
        }
        self.crc = None;
        let s = self.state();
        if len >= s.flushed {
            s.tail.truncate((len - s.flushed) as usize);
        } else {
            // Part of what is to be forgotten was sent: everything is forgotten, and the
            // writer (which reads `received()` back) sends again from the start.
            self.restart();
        }
        Ok(())
    }

    fn commit_expecting(
        self: Box<Self>,
        expected: &Digest,
        sender: Option<&ChunkDigests>,
    ) -> Result<BlobRecord> {
        let Some(r) = self.state.as_ref().and_then(|s| s.ranged.clone()) else {
            // Written by this one writer, whose own digest of the bytes is checked.
            if expected.algo != self.store.algo {
                return Err(StoreError::Unsupported(format!(
                    "{:?} is checked against a digest in {}, not {}",
                    self.rec.name,
                    self.store.algo.name(),
                    expected.algo.name()
                )));
            }
            return self.commit(Some(expected.clone()));
        };
        let i = self.store.clone();
        catalogued::refuse_existing(
            &i.cat,
            &self.rec.name,
            self.rec.overwrite,
            &self.rec.refuse_digests,
        )?;
        let (chunks, storing) = r.complete(&i, expected, sender)?;
        self.land(expected.clone(), chunks.encode(), r.size(), storing)
    }

    fn commit(mut self: Box<Self>, whole: Option<Digest>) -> Result<BlobRecord> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        self.one_writer()?;
        let i = self.store.clone();
        let name = self.rec.name.clone();
        check_complete(&name, self.rec.size, self.received())?;
        let (overwrite, refuse) = (self.rec.overwrite, self.rec.refuse_digests.clone());
        catalogued::refuse_existing(&i.cat, &name, overwrite, &refuse)?;
        let s = self.state();
        let size = s.received();
        let key = s.key.clone();
        let wrong = |digest: &Digest| {
            whole.as_ref().filter(|g| g.algo == i.algo && *g != digest).map(|g| {
                StoreError::Corrupt {
                    name: name.clone(),
                    reason: format!("received bytes digest to {digest}, {g} was written"),
                }
            })
        };
        if s.multipart.is_none() && size <= INLINE_UP_TO {
            return self.commit_inline(&wrong);
        }
        // Store every byte: one PUT for a small blob, else the last part and completion.
        let (digest, chunks, storing) = if s.multipart.is_none() {
            // The PUT leaves first and the digests are computed from the same bytes while it
            // is in flight: the object's key is fresh and nothing references it until the
            // catalogue row below, so bytes found wrong meanwhile leave only an object to
            // delete.
            let body = s.tail.take();
            let mut opts = PutOptions::default();
            if let Some(crc) = self.crc.take().and_then(|h| h.finish_for(&body)) {
                opts.extensions.insert(crc);
            }
            let (os, k, b) = (i.os.clone(), key.clone(), body.clone());
            let put = i.rt.spawn(async move { os.put_opts(&k, b.into(), opts).await.map(drop) });
            let s = self.state();
            let (mut hasher, mut chunks) = (s.hasher.clone(), s.chunks.clone());
            hasher.update(&body);
            chunks.update(&body);
            let digest = hasher.finish();
            if let Some(e) = wrong(&digest) {
                // Gone before the writer may send again: a resend reuses this key.
                self.undo_stored(put);
                self.restart();
                return Err(e);
            }
            (digest, chunks, put)
        } else {
            // The last part folds the tail into the running digests as it goes up.
            if s.tail.len() > 0 {
                self.send_part()?;
            }
            let s = self.state();
            let (digest, chunks) = (s.hasher.clone().finish(), s.chunks.clone());
            if let Some(e) = wrong(&digest) {
                // Never completed: its parts are aborted and the writer sends it all again.
                self.restart();
                return Err(e);
            }
            let s = self.state();
            let mp = s.multipart.clone().expect("created");
            let handles: Vec<_> = s.parts.drain(..).collect();
            let (os, k) = (i.os.clone(), key.clone());
            let complete = i.rt.spawn(async move {
                let mut parts = Vec::with_capacity(handles.len());
                for h in handles {
                    parts.push(h.await.map_err(|e| object_store::Error::JoinError { source: e })??);
                }
                os.complete_multipart(&k, &mp, parts).await.map(drop)
            });
            (digest, chunks, complete)
        };
        self.land(digest, chunks.finish().encode(), size, storing)
    }
}

#[cfg(test)]
mod tests;
