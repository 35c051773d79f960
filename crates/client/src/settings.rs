//! What a client proposes when it negotiates a transfer.

use std::time::Duration;

use bs_transport::TlsClient;
use bs_wire::DigestAlgo;

/// Transfer parameters a client proposes (the server may lower them).
#[derive(Debug, Clone)]
pub struct TransferSettings {
    /// Chunk size proposal; 0 = server default.
    pub chunk_size: u32,
    /// `SO_SNDBUF` / `SO_RCVBUF` for both ends; 0 = kernel autotuning. A kept-alive data
    /// connection is reused only by clones that ask for the same size.
    pub socket_buffer: u32,
    /// Acceptable digests, preferred first.
    pub digests: Vec<DigestAlgo>,
    /// Longest wait for the peer on one read or write.
    pub io_timeout: Duration,
    /// Longest wait to establish a connection.
    pub connect_timeout: Duration,
    /// How long opening a transfer keeps asking again while the server turns its data
    /// connection away (BUSY: at its transfer limit, another writer on the upload, or too
    /// many connections waiting to present a token).
    pub busy_timeout: Duration,
    /// Message layers the transfer's bytes go through (e.g. `compress:zstd` for a slow
    /// link, `checksum:xxh3` per frame); empty: the raw bytes, sent straight from memory. The
    /// end-to-end digest is checked either way; encryption is the connection's TLS.
    pub layers: Vec<bs_binding::LayerSpec>,
}

impl Default for TransferSettings {
    fn default() -> Self {
        Self {
            chunk_size: 0,
            socket_buffer: 0,
            digests: vec![DigestAlgo::Xxh3_128],
            io_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            busy_timeout: Duration::from_secs(30),
            layers: Vec::new(),
        }
    }
}

/// Credentials and TLS for talking to a server.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// Sent as `authorization: Bearer <token>` on every control-plane call.
    pub auth_token: Option<String>,
    /// Speak TLS on both planes, trusting this CA.
    pub tls: Option<TlsClient>,
}
