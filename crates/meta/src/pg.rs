//! Connections to PostgreSQL, shared by the catalogue and the image index: a small pool of
//! blocking clients (the `postgres` crate; every caller is already off the async executor),
//! schema set-up under an advisory lock so front ends starting together do not race, and
//! the mapping of PostgreSQL's failures onto [`MetaError`].

use std::sync::Mutex;
use std::time::Duration;

use postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::MetaError;

type Result<T> = std::result::Result<T, MetaError>;

/// Idle connections kept for reuse.
const MAX_IDLE: usize = 16;

/// Connections open at once, at most, per pool; more callers wait (up to [`WAIT_FOR_CONN`]).
const MAX_OPEN: usize = 64;

/// How long a caller waits for a connection when [`MAX_OPEN`] are in use.
const WAIT_FOR_CONN: Duration = Duration::from_secs(30);

/// An idle connection unused this long is checked (one round trip) before it is handed out,
/// so a server restarted meanwhile costs a reconnection, not a failed request.
const CHECK_AFTER: Duration = Duration::from_secs(10);

/// Advisory lock key serialising schema changes (any fixed number; "blobstrm" in ASCII).
const SCHEMA_LOCK: i64 = 0x626c_6f62_7374_726d;

pub(crate) struct PgPool {
    config: Config,
    /// TLS as the URL's `sslmode` asks (`prefer`, the default, uses it when the server
    /// offers it; `require` refuses a server without it; `disable` never uses it).
    tls: MakeRustlsConnect,
    /// Idle connections and when each was last used.
    idle: Mutex<Vec<(Client, std::time::Instant)>>,
    /// Connections open now (idle or lent), and a signal when one is returned or closed.
    open: Mutex<usize>,
    returned: std::sync::Condvar,
    /// `postgres://host:port/db` for logs (no user, no password).
    describe: String,
}

impl PgPool {
    /// Parse `url`, connect once (so a wrong URL, a wrong password or a server that is down
    /// is reported at start-up), and apply `schema` under the schema lock.
    pub(crate) fn connect(url: &str, schema: &str) -> Result<Self> {
        let (url, ca) = take_param(url, "sslrootcert");
        let mut config: Config = url.parse().map_err(|e: postgres::Error| {
            MetaError::Config(format!("catalogue URL is not a PostgreSQL URL: {e}"))
        })?;
        let prefer = config.get_ssl_mode() == postgres::config::SslMode::Prefer;
        let tls = MakeRustlsConnect::new(tls_config(ca.as_deref(), prefer)?);
        // A server gone without closing the connection (a host lost) is noticed within a
        // minute, and no statement runs for ever.
        config.keepalives_interval(Duration::from_secs(10)).keepalives_retries(3);
        if config.get_options().is_none() {
            config.options("-c statement_timeout=60000 -c lock_timeout=30000");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        config.keepalives(true).keepalives_idle(Duration::from_secs(30));
        config.application_name("blobstream");
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .map(|h| match h {
                postgres::config::Host::Tcp(h) => h.clone(),
                postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let describe = format!(
            "postgres://{}:{port}/{}",
            hosts.join(","),
            config.get_dbname().unwrap_or("postgres")
        );
        let pool = Self {
            config,
            tls,
            idle: Mutex::new(Vec::new()),
            open: Mutex::new(0),
            returned: std::sync::Condvar::new(),
            describe,
        };
        pool.apply_schema(schema)?;
        Ok(pool)
    }

    fn apply_schema(&self, schema: &str) -> Result<()> {
        let mut c = self.get()?;
        let mut tx = c.transaction().map_err(|e| self.error(e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])
            .map_err(|e| self.error(e))?;
        tx.batch_execute(schema).map_err(|e| self.error(e))?;
        tx.commit().map_err(|e| self.error(e))
    }

    pub(crate) fn describe(&self) -> &str {
        &self.describe
    }

    /// A connection: an idle one that is still good, or a new one while fewer than
    /// [`MAX_OPEN`] are open; otherwise wait for one to come back.
    pub(crate) fn get(&self) -> Result<Pooled<'_>> {
        let until = std::time::Instant::now() + WAIT_FOR_CONN;
        loop {
            loop {
                let c = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
                let Some((mut c, used)) = c else { break };
                if c.is_closed()
                    || used.elapsed() > CHECK_AFTER && c.is_valid(Duration::from_secs(5)).is_err()
                {
                    self.closed(c);
                    continue;
                }
                return Ok(Pooled { pool: self, client: Some(c) });
            }
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            if *open < MAX_OPEN {
                *open += 1;
                drop(open);
                return match self.config.connect(self.tls.clone()) {
                    Ok(c) => Ok(Pooled { pool: self, client: Some(c) }),
                    Err(e) => {
                        self.release_slot();
                        Err(self.error(e))
                    }
                };
            }
            // Checked under the lock a returning connection takes to signal, so its signal
            // cannot fall between this look and the wait.
            if !self.idle.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
                continue;
            }
            let now = std::time::Instant::now();
            if now >= until {
                return Err(MetaError::Unavailable(format!(
                    "all {MAX_OPEN} connections to PostgreSQL at {} stayed busy for {}s",
                    self.describe,
                    WAIT_FOR_CONN.as_secs()
                )));
            }
            let _ = self.returned.wait_timeout(open, until - now);
        }
    }

    /// One connection fewer is open.
    fn release_slot(&self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        *open = open.saturating_sub(1);
        self.returned.notify_one();
    }

    /// Close `c` (off the executor: a client says goodbye to the server, blocking to do so).
    fn closed(&self, c: Client) {
        off_executor(move || drop(c));
        self.release_slot();
    }

    /// What a PostgreSQL failure means to callers: the server unreachable (down, refusing,
    /// connection lost) is [`MetaError::Unavailable`]; a full disk is noted as such.
    pub(crate) fn error(&self, e: postgres::Error) -> MetaError {
        use postgres::error::SqlState;
        let busy = [
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
        ];
        if e.is_closed()
            || e.code().is_none() && e.as_db_error().is_none()
            || e.code().is_some_and(|c| busy.contains(c))
        {
            return MetaError::Unavailable(format!("PostgreSQL at {}: {e}", self.describe));
        }
        let disk_full = e.code() == Some(&postgres::error::SqlState::DISK_FULL);
        MetaError::Postgres {
            disk_full,
            reason: e.as_db_error().map_or(e.to_string(), |d| d.to_string()),
        }
    }

    /// Run `op` on a connection; a connection found closed (the server restarted since it
    /// was pooled) is replaced and `op` run once more. Only for reads and for writes that
    /// are safe to repeat.
    pub(crate) fn retrying<R>(
        &self,
        mut op: impl FnMut(&mut Client) -> std::result::Result<R, postgres::Error>,
    ) -> Result<R> {
        let mut c = self.get()?;
        match op(&mut c) {
            Ok(r) => Ok(r),
            Err(e) if e.is_closed() => {
                drop(c);
                let mut c = self.get()?;
                op(&mut c).map_err(|e| self.error(e))
            }
            Err(e) => Err(self.error(e)),
        }
    }
}

/// `url` without its `name=value` query parameter, and the value. (`sslrootcert` is the
/// libpq name for the CA file; the `postgres` crate does not know it.)
fn take_param(url: &str, name: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else { return (url.to_string(), None) };
    let mut value = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.split_once('=') {
            Some((k, v)) if k == name => {
                value = Some(v.to_string());
                false
            }
            _ => true,
        })
        .collect();
    let url = if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
    (url, value)
}

/// TLS to PostgreSQL: the server's certificate checked against the CA in `ca_file` (PEM) if
/// given, else against the system's roots — except for `sslmode=prefer` (the default)
/// without a CA, which, as in libpq, encrypts without checking who the server is (Debian's
/// PostgreSQL, say, offers TLS with a self-signed certificate); `require` checks.
fn tls_config(ca_file: Option<&str>, prefer: bool) -> Result<rustls::ClientConfig> {
    if let Some(path) = ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| MetaError::Config(format!("sslrootcert {path}: {e}")))?;
        let client = bs_transport::TlsClient::from_pem(&pem, None)
            .map_err(|e| MetaError::Config(format!("sslrootcert {path}: {e}")))?;
        return Ok((*client.config()).clone());
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| MetaError::Config(format!("TLS: {e}")))?;
    if prefer {
        return Ok(builder
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(Unchecked(provider)))
            .with_no_client_auth());
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// `sslmode=prefer`: encryption against passive listeners only; the server's certificate is
/// not checked (its signatures are, so the handshake is still sound).
#[derive(Debug)]
struct Unchecked(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Run `f`, which blocks (on the network, on another runtime), wherever the caller is: on a
/// plain thread as is; on a worker of a multi-threaded tokio runtime through
/// `block_in_place` (the worker hands its other tasks on meanwhile); inside a
/// current-thread runtime on a thread of its own. Blocking clients (the `postgres` crate,
/// the object store's own runtime) panic if simply called from async code, and callers such
/// as the web server's handlers make quick catalogue lookups without leaving it.
pub fn off_executor<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|s| {
            s.spawn(f).join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        }),
        Err(_) => f(),
    }
}

/// A pooled connection, returned to the pool on drop unless it broke.
pub(crate) struct Pooled<'a> {
    pool: &'a PgPool,
    client: Option<Client>,
}

impl std::ops::Deref for Pooled<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client.as_ref().expect("held until drop")
    }
}

impl std::ops::DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Client {
        self.client.as_mut().expect("held until drop")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        let Some(c) = self.client.take() else { return };
        if !c.is_closed() {
            let mut idle = self.pool.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < MAX_IDLE {
                idle.push((c, std::time::Instant::now()));
                drop(idle);
                let _open = self.pool.open.lock().unwrap_or_else(|p| p.into_inner());
                self.pool.returned.notify_one();
                return;
            }
        }
        self.pool.closed(c);
    }
}

impl Drop for PgPool {
    fn drop(&mut self) {
        let idle = std::mem::take(self.idle.get_mut().unwrap_or_else(|p| p.into_inner()));
        // The last handle may go inside an async task (a server shutting down).
        off_executor(move || drop(idle));
    }
}
