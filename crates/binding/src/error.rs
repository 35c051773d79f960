//! Errors of bindings: refusals during negotiation, layer failures on a message, and
//! protocol violations on a live binding.

use bs_transport::TransportError;
use bs_wire::ErrorCode;
use thiserror::Error;

/// Why a negotiation step refused a profile (sent to the peer as text, kept typed here).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("no common transport: asked for {asked:?}, this peer offers {offered:?}")]
    NoTransport { asked: Vec<String>, offered: Vec<String> },
    #[error("encryption asked for, but this peer has no TLS certificate configured")]
    EncryptionUnavailable,
    #[error("no common digest: asked for {0:?}")]
    NoCommonDigest(Vec<String>),
    #[error("cannot meet the profile: {0}")]
    Unmeetable(String),
    #[error("offer refused: {0}")]
    BelowFloor(String),
    #[error("offer raises {0} above the proposal (a peer may only lower)")]
    Raised(&'static str),
    #[error("renegotiation already in progress")]
    Busy,
    #[error("peer refused: {0}")]
    Peer(String),
}

/// A message that broke one of the binding's layers.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum LayerError {
    #[error("checksum mismatch on message: {algo} says {expected}, the bytes give {actual}")]
    Checksum { algo: &'static str, expected: String, actual: String },
    #[error("{layer}: message of {len} bytes exceeds the negotiated cap of {max} bytes")]
    TooLarge { layer: &'static str, len: u64, max: u64 },
    #[error("{layer}: malformed header: {reason}")]
    Malformed { layer: &'static str, reason: String },
    #[error("decompression failed: {0}")]
    Decompress(String),
    #[error("compression failed: {0}")]
    Compress(String),
    #[error("fragment out of order: {0}")]
    Fragment(String),
}

/// What ended a binding (or one operation on it).
#[derive(Debug, Error)]
pub enum BindingError {
    #[error(
        "unknown layer {0:?} (known: null, checksum:xxh3|blake3, compress:zstd[:level]|lz4, encrypt, fragment:<bytes>, pace:<bytes/s>)"
    )]
    UnknownLayer(String),
    #[error("bad profile: {0}")]
    BadProfile(String),
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Layer(#[from] LayerError),
    #[error("renegotiation protocol violated: {0}")]
    Renegotiation(String),
    #[error("message sequence broken: expected {expected}, got {got}")]
    Sequence { expected: u64, got: u64 },
    #[error("unexpected {0} frame on a binding")]
    UnexpectedFrame(&'static str),
    #[error("binding message of {len} wire bytes exceeds the cap of {max}")]
    WireTooLarge { len: u64, max: u64 },
    #[error("datagram out of window: sequence {seq}, window {lo}..{hi}")]
    OutOfWindow { seq: u64, lo: u64, hi: u64 },
    #[error("peer ended the binding: {code:?}: {message}")]
    Remote { code: ErrorCode, message: String },
    #[error(transparent)]
    Transport(#[from] TransportError),
}

impl BindingError {
    /// The code an `ERROR` frame carries for this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Layer(_) | Self::WireTooLarge { .. } | Self::Sequence { .. } => {
                ErrorCode::BadMessage
            }
            Self::Renegotiation(_) => ErrorCode::BadRenegotiation,
            Self::UnexpectedFrame(_) | Self::OutOfWindow { .. } => ErrorCode::BadFrame,
            Self::Transport(TransportError::Wire(_) | TransportError::Unexpected { .. }) => {
                ErrorCode::BadFrame
            }
            Self::Remote { code, .. } => *code,
            _ => ErrorCode::Internal,
        }
    }
}
