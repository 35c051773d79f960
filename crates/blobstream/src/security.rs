//! Credentials and TLS from flags, files and environment variables.

use std::path::Path;

use anyhow::{Context, Result, bail};
use bs_client::{Security, TlsClient};
use bs_server::TlsServer;

use crate::cli::{Global, ServerTls};

fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading the {what} {}", path.display()))
}

/// The bearer token: from `--auth-token-file`, else `BLOBSTREAM_AUTH_TOKEN`, else none.
pub fn token(g: &Global) -> Result<Option<String>> {
    let t = match &g.auth_token_file {
        Some(p) => String::from_utf8(read(p, "auth token file")?)
            .with_context(|| format!("{} is not text", p.display()))?,
        None => match std::env::var("BLOBSTREAM_AUTH_TOKEN") {
            Ok(t) => t,
            Err(_) => return Ok(None),
        },
    };
    let t = t.trim().to_string();
    if t.is_empty() {
        match &g.auth_token_file {
            Some(p) => bail!("the auth token file {} is empty", p.display()),
            None => bail!("BLOBSTREAM_AUTH_TOKEN is empty"),
        }
    }
    Ok(Some(t))
}

/// What a client command connects with.
pub fn client(g: &Global) -> Result<Security> {
    let tls = trust(g.tls_ca.as_deref(), g.tls_domain.clone())?;
    Ok(Security { auth_token: token(g)?, tls })
}

/// The CA a client trusts in `ca` (`None`: no TLS), verifying `domain` or the host it reaches.
pub fn trust(ca: Option<&Path>, domain: Option<String>) -> Result<Option<TlsClient>> {
    let Some(ca) = ca else { return Ok(None) };
    let tls = TlsClient::from_pem(&read(ca, "CA certificate")?, domain)
        .with_context(|| format!("using {} as CA", ca.display()))?;
    Ok(Some(tls))
}

/// The server's TLS identity, if `--tls-cert`/`--tls-key` were given.
pub fn server_tls(a: &ServerTls) -> Result<Option<TlsServer>> {
    let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) else { return Ok(None) };
    let tls = TlsServer::from_pem(&read(cert, "certificate")?, &read(key, "private key")?)
        .with_context(|| format!("using {} and {}", cert.display(), key.display()))?;
    Ok(Some(tls))
}
