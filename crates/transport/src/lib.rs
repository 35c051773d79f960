//! Data-plane connections: direct TCP sockets tuned per transfer, carrying the frames of
//! `blobstream-wire` and the payload bytes they announce.
//!
//! I/O here is blocking on purpose: each transfer owns its socket and its thread (GOPI's
//! "bindings are not multiplexed"), which lets the kernel's zero-copy paths (`sendfile`) move
//! file bytes straight to the socket and keeps the per-byte cost at the hardware's.

pub mod conn;
pub mod error;
pub mod far;
pub mod floor;
pub mod socket;
pub mod sockopt;
pub mod tls;
pub mod unproven;

pub use conn::{Conn, FileSource, send_vectored};
pub use error::TransportError;
pub use floor::{BelowFloor, ReadFloor};
pub use socket::{SocketOptions, connect_any};
pub use tls::{TlsClient, TlsError, TlsServer, host_of, peer_speaks_no_tls};
pub use unproven::{Unproven, first_message_at_most};
