//! Where a sender or receiver finds its distributer: an address, and what to trust when the
//! distributer serves TLS.

use std::net::TcpStream;

use bs_transport::{Conn, TlsClient};

use crate::error::DistribError;

/// A distributer to connect to: `host:port`, over TLS when `tls` is set (the distributer was
/// started with a certificate; see [`crate::Distributer::start_with_tls`]).
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: String,
    pub tls: Option<TlsClient>,
}

impl Target {
    /// Connect over TLS, trusting `tls`'s CA (and verifying its domain, or the host of `addr`).
    pub fn with_tls(mut self, tls: TlsClient) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The connection on `tcp`, in TLS when asked (the handshake runs on its first use).
    pub(crate) fn conn(&self, tcp: TcpStream) -> Result<Conn, DistribError> {
        match &self.tls {
            None => Ok(Conn::new(tcp)),
            Some(t) => Conn::tls_client(tcp, t, bs_transport::host_of(&self.addr)).map_err(|e| {
                DistribError::Remote(format!("TLS to the distributer at {}: {e}", self.addr))
            }),
        }
    }
}

impl From<&str> for Target {
    fn from(addr: &str) -> Self {
        Self { addr: addr.to_string(), tls: None }
    }
}

impl From<String> for Target {
    fn from(addr: String) -> Self {
        Self { addr, tls: None }
    }
}

impl From<&String> for Target {
    fn from(addr: &String) -> Self {
        Self::from(addr.as_str())
    }
}
