//! Errors raised while parsing frames and digests.

use thiserror::Error;

/// What was wrong with bytes read off the wire.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    #[error("bad frame magic {0:#06x} (not a blobstream data connection?)")]
    BadMagic(u16),
    #[error("unsupported frame version {0}")]
    BadVersion(u8),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("frame body of {len} bytes exceeds the limit of {max} bytes")]
    BodyTooLarge { len: u32, max: u32 },
    #[error("malformed {kind} frame: {reason}")]
    Malformed { kind: &'static str, reason: String },
    #[error("unknown digest algorithm {0:?}")]
    UnknownDigest(String),
    #[error("malformed chunk digests: {0}")]
    BadChunkDigests(String),
}
