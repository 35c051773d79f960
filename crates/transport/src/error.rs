//! Errors of data-plane connections.

use std::io;

use bs_wire::{ErrorCode, WireError};
use thiserror::Error;

/// What went wrong on a data connection.
#[derive(Debug, Error)]
pub enum TransportError {
    #[error("data connection I/O failed: {0}")]
    Io(#[from] io::Error),
    #[error("data connection timed out waiting for the peer")]
    Timeout,
    #[error("the peer sent too slowly: {0}")]
    TooSlow(crate::floor::BelowFloor),
    #[error("peer closed the data connection after {got} of {expected} announced bytes")]
    Truncated { expected: u64, got: u64 },
    #[error("peer closed the data connection before the next frame")]
    Closed,
    #[error("protocol violation: {0}")]
    Wire(#[from] WireError),
    #[error("unexpected {got} frame (expected {expected})")]
    Unexpected { expected: &'static str, got: &'static str },
    #[error("TLS failed on the data connection: {0}")]
    Tls(String),
    #[error("peer reported {code:?}: {message}")]
    Remote { code: ErrorCode, message: String },
}

impl TransportError {
    /// Classify an I/O error: read/write timeouts become [`TransportError::Timeout`].
    pub fn from_io(e: io::Error) -> Self {
        if let Some(below) = e.get_ref().and_then(|i| i.downcast_ref::<crate::floor::BelowFloor>())
        {
            return Self::TooSlow(*below);
        }
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Self::Timeout,
            // rustls reports handshake and record failures as InvalidData carrying its error.
            io::ErrorKind::InvalidData
                if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) =>
            {
                Self::Tls(e.to_string())
            }
            _ => Self::Io(e),
        }
    }
}
