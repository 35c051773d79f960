//! Where blobs live: the [`Store`] trait and its implementations — [`FsStore`] (the
//! default: files under a data directory with atomic commits and an SQLite catalogue),
//! [`ObjStore`] (an S3-compatible bucket, catalogue in SQLite or PostgreSQL, shareable by
//! many front ends) and [`MemStore`] (for tests and caches); a [`Tier`] puts memory or local
//! disk in front of any of them — plus [`FaultyStore`], a wrapper that injects disk
//! faults so error paths can be tested against real stores. Every read goes through
//! [`BlobSource`], which verifies each chunk before handing it on; [`scrub`] re-reads them all.

mod ballast;
mod catalogued;
mod claim;
mod dirlock;
mod error;
mod events;
mod faulty;
mod fs;
mod lru;
mod mapped;
mod media;
mod mem;
mod name;
mod objearly;
mod object;
mod objlocal;
mod objranges;
mod objstream;
mod s3http;
mod scrub;
mod source;
mod store;
mod tail;
mod tier;
mod whole;
mod writeback;
mod written;

pub use bs_meta::{BlobRecord, now_ms};
pub use error::StoreError;
pub use events::{Listener, StoreEvent};
pub use faulty::FaultyStore;
pub use fs::{FsStore, INLINE_UP_TO, PENDING_TTL};
pub use lru::Lru;
pub use media::{content_type_of_extension, guess_content_type};
pub use mem::MemStore;
pub use name::{
    MAX_CONTENT_TYPE_LEN, MAX_METADATA_BYTES, MAX_NAME_LEN, shown_name, validate_name,
    validate_route,
};
pub use object::{Backend as ObjectBackend, ORPHAN_AGE, ObjStore, PART_SIZE, S3Config};
pub use scrub::{ScrubOptions, ScrubReport, scrub};
pub use source::{
    Arriving, BlobSource, CorruptionMarker, MAP_FROM, Pieces, READ_WHOLE_UP_TO, REMOTE_WINDOW,
    RangeRead, corruption_found, populate,
};
pub use store::{
    REQUIRE_DIGEST, RouteSpec, Routed, Store, UploadSink, digest_file_range, is_routed, open_routed,
};
pub use tier::Tier;
pub use whole::put_bytes;
pub use writeback::{WRITEBACK_STEP, start_writeback, sync_written};
