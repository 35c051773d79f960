//! Errors of starting a server.

use std::net::SocketAddr;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("cannot listen for the {what} on {addr}: {source}")]
    Bind { what: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("cannot listen on the Unix socket {}: {source}", path.display())]
    BindUnix { path: std::path::PathBuf, source: std::io::Error },
    #[error("TLS configuration rejected: {0}")]
    Tls(String),
    #[error("server I/O failed: {0}")]
    Io(#[from] std::io::Error),
}
