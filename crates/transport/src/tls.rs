//! TLS for data connections (rustls with the ring provider), configured from PEM files — the
//! same certificate and key the control plane's gRPC server uses, and the same CA on clients.
//! TLS costs the zero-copy file path (bytes must pass through the cipher in user space).

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("no PEM certificate found in {0}")]
    NoCertificate(&'static str),
    #[error("no PEM private key found in the key file")]
    NoKey,
    #[error("TLS configuration rejected: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("{0:?} is not a valid TLS server name")]
    BadName(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem).filter_map(Result::ok).collect();
    if certs.is_empty() { Err(TlsError::NoCertificate(what)) } else { Ok(certs) }
}

/// The host part of a `HOST:PORT` address (without the port, and without an IPv6 address's
/// brackets): the name a server's certificate must carry unless the client names another.
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Whether a TLS failure (its text) is the peer answering with bytes that are no TLS: a
/// plain-TCP server reached with TLS.
pub fn peer_speaks_no_tls(failure: &str) -> bool {
    failure.contains("InvalidContentType")
}

/// A server's TLS identity.
#[derive(Clone)]
pub struct TlsServer {
    config: Arc<rustls::ServerConfig>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsServer")
    }
}

impl TlsServer {
    /// From a PEM certificate chain and its PEM private key.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let chain = certs(cert_pem, "the certificate file")?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| TlsError::NoKey)?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        Ok(Self {
            config: Arc::new(config),
            cert_pem: cert_pem.to_vec(),
            key_pem: key_pem.to_vec(),
        })
    }

    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.config.clone()
    }

    /// The PEM text it was built from (for the gRPC server's identity).
    pub fn pem(&self) -> (&[u8], &[u8]) {
        (&self.cert_pem, &self.key_pem)
    }
}

/// What a client trusts.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
    ca_pem: Vec<u8>,
    domain: Option<String>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient").field("domain", &self.domain).finish()
    }
}

impl TlsClient {
    /// Trust the PEM CA certificate(s) in `ca_pem`; verify servers as `domain` (default: the
    /// host the client connects to).
    pub fn from_pem(ca_pem: &[u8], domain: Option<String>) -> Result<Self, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca_pem, "the CA file")? {
            roots.add(c)?;
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self { config: Arc::new(config), ca_pem: ca_pem.to_vec(), domain })
    }

    pub fn config(&self) -> Arc<rustls::ClientConfig> {
        self.config.clone()
    }

    pub fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }

    /// The name to verify for a server reached as `host`.
    pub fn server_name(&self, host: &str) -> Result<ServerName<'static>, TlsError> {
        let name = self.domain.clone().unwrap_or_else(|| host.to_string());
        ServerName::try_from(name.clone()).map_err(|_| TlsError::BadName(name))
    }

    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_is_the_address_without_its_port() {
        assert_eq!(host_of("dist.example:7080"), "dist.example");
        assert_eq!(host_of("10.77.0.2:7080"), "10.77.0.2");
        assert_eq!(host_of("[::1]:7080"), "::1");
    }
}
