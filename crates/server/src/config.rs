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
    /// A new data connection must present its token (TLS handshake included) within this
    /// time, however slowly it sends.
    pub hello_timeout: Duration,
    /// [`ServerConfig::hello_timeout`] for connections that arrive while more than half of
    /// either limit on waiting connections is in use.
    pub hello_timeout_under_pressure: Duration,
    /// Most data connections still to present their token, from all addresses together.
    /// They are cheap (a socket and a small task each); at the limit the oldest is evicted to
    /// make room, never the new one.
    pub max_unauthenticated: usize,
    /// Most data connections still to present their token from one source address (an IPv6
    /// /64 counts as one); at the limit the oldest from that address is evicted.
    pub max_unauthenticated_per_ip: usize,
    /// Most concurrent data transfers (connections whose token was accepted); further ones
    /// are told BUSY, which clients retry.
    pub max_connections: usize,
    /// Most control-plane (gRPC) connections open at once; the next wait in the kernel's
    /// backlog until one closes. Each must say something within 30 s of connecting.
    pub max_control_connections: usize,
    /// Most bindings open at once (each a connection and a thread, often idle for long);
    /// they do not count among [`ServerConfig::max_connections`]. Further ones are told BUSY.
    pub max_bindings: usize,
    /// A push of a known length (not paced by its own asking) averaging fewer bytes a second
    /// than this from its admission, once past its first [`ServerConfig::io_timeout`], is
    /// ended with `ERROR(TooSlow)`, so a client trickling bytes cannot hold a transfer slot;
    /// an upload of unknown length may come as slowly as it is made; 0: no floor.
    pub min_transfer_rate: u64,
    /// After a transfer, how long its data connection waits for the client's next token
    /// (one more transfer on the same connection, without a new TCP or TLS handshake); zero:
    /// one transfer per connection.
    pub data_keepalive: Duration,
    /// Most data connections waiting so between transfers; past it, a finished transfer's
    /// connection is closed.
    pub max_idle_data_connections: usize,
    /// Largest upload of unknown size: a DATA frame reaching past it is refused (OutOfRange).
    pub max_unsized_upload: u64,
    /// Wrong bearer tokens one source address may present in a burst on the control plane...
    pub auth_failure_burst: u32,
    /// ...after which it may try one more per this interval; meanwhile its calls are refused
    /// with UNAVAILABLE, whatever token they carry.
    pub auth_failure_interval: Duration,
    /// Pending uploads older than this are discarded (checked hourly).
    pub pending_ttl: Duration,
    /// When set, a background pass re-reads and checks every blob on this schedule.
    pub scrub: Option<crate::ScrubSchedule>,
    /// Chunk size used when a client proposes none.
    pub default_chunk: u32,
    /// Largest socket buffer a client may ask for.
    pub max_socket_buffer: u32,
    /// When set, every control-plane call must carry `authorization: Bearer <token>`.
    pub auth_token: Option<String>,
    /// When set, both planes speak TLS only.
    pub tls: Option<TlsServer>,
    /// Order in which the bindings' messages leave this server.
    pub schedule: bs_binding::Policy,
    /// Most bytes per second one binding gets; 0: no limit.
    pub max_binding_rate: u64,
    /// A Unix domain socket for bindings from processes on this host (none: TCP only).
    pub unix_socket: Option<std::path::PathBuf>,
    /// Offer UDP to bindings that stream into the sink and tolerate loss.
    pub udp: bool,
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
            hello_timeout_under_pressure: Duration::from_secs(2),
            max_unauthenticated: 4096,
            max_unauthenticated_per_ip: 64,
            max_connections: 256,
            max_bindings: 1024,
            max_control_connections: 1024,
            min_transfer_rate: 1024,
            data_keepalive: Duration::from_secs(3),
            max_idle_data_connections: 64,
            max_unsized_upload: 1 << 40,
            auth_failure_burst: 10,
            auth_failure_interval: Duration::from_secs(2),
            pending_ttl: bs_store::PENDING_TTL,
            scrub: None,
            default_chunk: 4 << 20,
            max_socket_buffer: 64 << 20,
            auth_token: None,
            tls: None,
            schedule: bs_binding::Policy::Priority,
            max_binding_rate: 0,
            unix_socket: None,
            udp: true,
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

    /// What this server can meet of a binding's (or transfer's) QoS proposal. `same_host`:
    /// the initiator runs on this host, so a Unix domain socket is offered too.
    pub fn binding_limits(&self, same_host: bool) -> bs_binding::Limits {
        let mut transports = Vec::new();
        if same_host && self.unix_socket.is_some() {
            transports.push(bs_binding::TransportKind::Unix);
        }
        transports.push(bs_binding::TransportKind::Tcp);
        if self.udp {
            transports.push(bs_binding::TransportKind::Udp);
        }
        bs_binding::Limits {
            max_throughput_bps: self.max_binding_rate,
            transports,
            tls: self.tls.is_some(),
            chunk_range: Self::CHUNK_RANGE,
            default_chunk: self.default_chunk,
            max_socket_buffer: self.max_socket_buffer,
            digests: bs_wire::DigestAlgo::ALL.iter().map(|a| a.name().to_string()).collect(),
            ..bs_binding::Limits::default()
        }
    }
}
