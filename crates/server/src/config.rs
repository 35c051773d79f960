//! Server settings and their defaults.

use std::net::SocketAddr;
use std::time::Duration;

use bs_transport::TlsServer;

/// How a server listens and what it allows.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// gRPC control plane address.
    pub control_addr: SocketAddr,
    /// Data plane address; `None`: the control plane's IP with a port chosen by the OS.
    pub data_addr: Option<SocketAddr>,
    /// Data endpoint announced to clients instead of the bound address (for NAT, proxies and
    /// fault-injection tests).
    pub advertise_data: Option<String>,
    /// How long a negotiated token stays valid.
    pub token_ttl: Duration,
    /// Longest wait for a peer on one read or write of the data plane.
    pub io_timeout: Duration,
    /// A new data connection must present its token within this time, however slowly it
    /// sends.
    pub hello_timeout: Duration,
    /// Most concurrent data transfers, and separately most connections still to present a
    /// token; further ones are refused with a BUSY error frame.
    pub max_connections: usize,
    /// Chunk size used when a client proposes none.
    pub default_chunk: u32,
    /// Largest socket buffer a client may ask for.
    pub max_socket_buffer: u32,
    /// When set, every control-plane call must carry `authorization: Bearer <token>`.
    pub auth_token: Option<String>,
    /// When set, both planes speak TLS only.
    pub tls: Option<TlsServer>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            control_addr: SocketAddr::from(([127, 0, 0, 1], 7070)),
            data_addr: None,
            advertise_data: None,
            token_ttl: Duration::from_secs(60),
            io_timeout: Duration::from_secs(30),
            hello_timeout: Duration::from_secs(10),
            max_connections: 256,
            default_chunk: 4 << 20,
            max_socket_buffer: 64 << 20,
            auth_token: None,
            tls: None,
        }
    }
}

impl ServerConfig {
    /// Defaults, listening on loopback port 0 (for tests and benchmarks).
    pub fn ephemeral() -> Self {
        Self { control_addr: SocketAddr::from(([127, 0, 0, 1], 0)), ..Self::default() }
    }

    /// Smallest and largest chunk sizes accepted.
    pub const CHUNK_RANGE: (u32, u32) = (64 << 10, 16 << 20);
}
