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

    /// The host part of `addr` (without the port and an IPv6 address's brackets): the name
    /// the distributer's certificate must carry unless the TLS client names another.
    pub fn host(&self) -> &str {
        let host = self.addr.rsplit_once(':').map_or(self.addr.as_str(), |(h, _)| h);
        host.trim_start_matches('[').trim_end_matches(']')
    }

    /// The connection on `tcp`, in TLS when asked (the handshake runs on its first use).
    pub(crate) fn conn(&self, tcp: TcpStream) -> Result<Conn, DistribError> {
        match &self.tls {
            None => Ok(Conn::new(tcp)),
            Some(t) => Conn::tls_client(tcp, t, self.host()).map_err(|e| {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_the_address_without_its_port() {
        assert_eq!(Target::from("dist.example:7080").host(), "dist.example");
        assert_eq!(Target::from("10.77.0.2:7080").host(), "10.77.0.2");
        assert_eq!(Target::from("[::1]:7080").host(), "::1");
    }
}
