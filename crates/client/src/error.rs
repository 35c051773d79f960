//! Errors a client can meet, named so callers can act on them.

use bs_transport::TransportError;
use thiserror::Error;
use tonic::Code;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("cannot reach blobstream server at {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("not allowed: {0}")]
    Unauthenticated(String),
    #[error("server is out of space: {0}")]
    StorageFull(String),
    #[error("server error ({code:?}): {message}")]
    Rpc { code: Code, message: String },
    #[error("data transfer failed: {0}")]
    Transfer(#[from] TransportError),
    #[error("corrupt on the server: {0}")]
    Corrupt(String),
    #[error("checksum mismatch: received bytes hash to {actual}, sender says {expected}")]
    ChecksumMismatch { expected: String, actual: String },
    #[error("timed out")]
    Timeout,
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Something answered, but not as a blobstream control plane (an HTTP server, say).
    #[error(
        "the server did not answer as a blobstream control plane; is --server its HTTP port? \
         (the control plane listens on 7070 unless `serve --addr` says otherwise): {0}"
    )]
    NotBlobstream(String),
    #[error("binding refused: {0}")]
    Refused(String),
    /// A blob larger than the caller would take whole (see `Client::pull_each_up_to`).
    #[error("blob {name} is {size} bytes, more than the {max} taken whole")]
    TooLarge { name: String, size: u64, max: u64 },
    #[error("binding failed: {0}")]
    Binding(#[from] bs_binding::BindingError),
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        let message = s.message().to_string();
        // tonic's words for a peer that speaks HTTP but not gRPC (e.g. the HTTP API's port).
        if message.contains("invalid compression flag")
            || message.contains("while receiving response with status")
            || message.contains("invalid content-type")
        {
            return Self::NotBlobstream(message);
        }
        match s.code() {
            Code::NotFound => Self::NotFound(message),
            Code::AlreadyExists => Self::AlreadyExists(message),
            Code::InvalidArgument | Code::OutOfRange => Self::InvalidArgument(message),
            Code::ResourceExhausted => Self::StorageFull(message),
            Code::Unauthenticated | Code::PermissionDenied => Self::Unauthenticated(message),
            Code::DeadlineExceeded => Self::Timeout,
            Code::DataLoss => Self::Corrupt(message),
            code => Self::Rpc { code, message },
        }
    }
}

impl ClientError {
    /// Whether bytes failed a digest check: in transit, or on the server's disk.
    pub fn is_integrity(&self) -> bool {
        use bs_wire::ErrorCode;
        match self {
            Self::Corrupt(_) | Self::ChecksumMismatch { .. } => true,
            Self::Transfer(TransportError::Remote { code, .. }) => {
                matches!(code, ErrorCode::Corrupt | ErrorCode::ChecksumMismatch)
            }
            _ => false,
        }
    }

    /// Whether the server found the blob corrupt on its side (a chunk failing its stored
    /// digest), not bytes damaged on the way.
    pub fn is_corrupt_at_server(&self) -> bool {
        match self {
            Self::Corrupt(_) => true,
            Self::Transfer(TransportError::Remote { code, .. }) => {
                *code == bs_wire::ErrorCode::Corrupt
            }
            _ => false,
        }
    }

    /// Whether the data connection was lost (an I/O error, the peer gone, a timeout, or
    /// none could be made): worth another connection, unlike a refusal or bad bytes.
    pub fn is_connection_lost(&self) -> bool {
        let lost = |t: &TransportError| {
            matches!(
                t,
                TransportError::Io(_)
                    | TransportError::Timeout
                    | TransportError::Truncated { .. }
                    | TransportError::Closed
            )
        };
        match self {
            Self::Connect { .. } | Self::Timeout => true,
            Self::Transfer(t) | Self::Binding(bs_binding::BindingError::Transport(t)) => lost(t),
            _ => false,
        }
    }

    /// A control-plane call whose connection failed under it without a gRPC answer: the
    /// peer closed it (tonic's "transport error"), or answered with bytes that are no HTTP/2
    /// ("h2 protocol error"). The peer is gone, or is no gRPC server (the data plane's port
    /// does either, depending on which comes first).
    pub fn is_transport_failure(&self) -> bool {
        match self {
            Self::Rpc { code: Code::Unknown, message } => message == "transport error",
            Self::Rpc { code: Code::Internal, message } => message.starts_with("h2 protocol error"),
            _ => false,
        }
    }

    /// The server cannot be reached at all: its address refuses connections or has no route
    /// (not a connection that merely timed out, nor a local socket error). Every further call
    /// to it would fail alike, so a batch stops starting them.
    pub fn is_unreachable(&self) -> bool {
        let refused = |why: &str| {
            let why = why.to_ascii_lowercase();
            ["connection refused", "no route to host", "network is unreachable"]
                .iter()
                .any(|s| why.contains(s))
        };
        match self {
            Self::Connect { reason, .. } => refused(reason),
            // A kept channel to a server that has gone: tonic says only this.
            Self::Rpc { code: Code::Unavailable, message } => {
                message.contains("tcp connect error") || refused(message)
            }
            _ => false,
        }
    }

    /// Timeouts on either plane.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout | Self::Transfer(TransportError::Timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_is_no_grpc_server_is_a_transport_failure_either_way() {
        let rpc = |code, message: &str| ClientError::Rpc { code, message: message.into() };
        assert!(rpc(Code::Unknown, "transport error").is_transport_failure(), "it closed");
        let garbled = rpc(Code::Internal, "h2 protocol error: http2 error");
        assert!(garbled.is_transport_failure(), "it answered with bytes that are no HTTP/2");
        assert!(!rpc(Code::Internal, "a bug on the server").is_transport_failure());
        assert!(!rpc(Code::Unavailable, "transport error").is_transport_failure());
    }

    #[test]
    fn only_a_server_that_refuses_or_has_no_route_is_unreachable() {
        let connect =
            |reason: &str| ClientError::Connect { addr: "h:1".into(), reason: reason.into() };
        assert!(connect("Connection refused (os error 111)").is_unreachable());
        assert!(connect("data plane: No route to host (os error 113)").is_unreachable());
        assert!(!connect("data plane: connection timed out").is_unreachable(), "a slow connect");
        assert!(!connect("udp: Too many open files (os error 24)").is_unreachable());
        let rpc =
            |message: &str| ClientError::Rpc { code: Code::Unavailable, message: message.into() };
        assert!(rpc("tcp connect error").is_unreachable());
        assert!(!rpc("too many wrong tokens").is_unreachable());
    }
}
