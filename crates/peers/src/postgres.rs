//! A throwaway PostgreSQL server: `initdb` into a temporary directory, `postgres` on a free
//! loopback port (its socket in that directory, never the system's), trust authentication
//! for loopback. PostgreSQL refuses to run as root, so as root it runs as the `postgres`
//! user (Debian's package creates it) or `nobody`.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::error::PeerError;
use crate::guard::{Guarded, fresh_dir, wait_until};
use crate::setup::{free_port, pg_bin_dir};

type Result<T> = std::result::Result<T, PeerError>;

/// A running PostgreSQL server; stopped and its directory removed on drop.
pub struct Postgres {
    port: u16,
    dir: PathBuf,
    server: Option<Guarded>,
}

/// (uid, gid) to run as, when we are root.
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    for user in ["postgres", "nobody"] {
        let c = std::ffi::CString::new(user).expect("no NUL");
        // SAFETY: getpwnam returns a pointer to static storage or null; read at once.
        let pw = unsafe { libc::getpwnam(c.as_ptr()) };
        if !pw.is_null() {
            // SAFETY: non-null result of getpwnam.
            let pw = unsafe { &*pw };
            return Some((pw.pw_uid, pw.pw_gid));
        }
    }
    None
}

/// `program args...`, as `who` when given (through util-linux's `setpriv`).
fn as_user(
    who: Option<(u32, u32)>,
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut v = Vec::new();
    if let Some((uid, gid)) = who {
        v.push("setpriv".into());
        v.push(format!("--reuid={uid}").into());
        v.push(format!("--regid={gid}").into());
        v.push("--clear-groups".into());
    }
    v.push(program.into_os_string());
    v.extend(args);
    v
}

impl Postgres {
    /// Start a fresh server and wait until it accepts connections.
    pub fn start() -> Result<Self> {
        Self::start_inner(None)
    }

    /// The same, serving TLS with this PEM certificate and key and refusing connections
    /// without it (`hostssl` only in `pg_hba.conf`).
    pub fn start_tls(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self> {
        Self::start_inner(Some((cert_pem, key_pem)))
    }

    fn start_inner(tls: Option<(&[u8], &[u8])>) -> Result<Self> {
        let bin = pg_bin_dir()?;
        let who = run_as();
        let dir = fresh_dir("blobstream-pg", who)?;
        let data = dir.join("data");
        let log = dir.join("server.log");
        let initdb = as_user(
            who,
            bin.join("initdb"),
            vec![
                "-D".into(),
                data.clone().into_os_string(),
                "-U".into(),
                "postgres".into(),
                "--auth=trust".into(),
                "-E".into(),
                "UTF8".into(),
                "--no-locale".into(),
                "--no-instructions".into(),
            ],
        );
        let out = Command::new(&initdb[0])
            .args(&initdb[1..])
            .output()
            .map_err(PeerError::io("running initdb"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(PeerError::Command {
                program: "initdb".into(),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        let port = free_port();
        let mut args: Vec<std::ffi::OsString> = vec![
            "-D".into(),
            data.clone().into_os_string(),
            "-p".into(),
            port.to_string().into(),
            "-k".into(),
            dir.clone().into_os_string(),
            "-c".into(),
            "listen_addresses=127.0.0.1".into(),
            "-c".into(),
            "max_connections=200".into(),
        ];
        if let Some((cert, key)) = tls {
            use std::os::unix::fs::PermissionsExt;
            let (crt, kf) = (data.join("server.crt"), data.join("server.key"));
            let write = |p: &std::path::Path, b: &[u8]| -> Result<()> {
                std::fs::write(p, b).map_err(PeerError::io(format!("writing {}", p.display())))?;
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600))
                    .map_err(PeerError::io("chmod"))?;
                if let Some((uid, gid)) = who {
                    std::os::unix::fs::chown(p, Some(uid), Some(gid))
                        .map_err(PeerError::io("chown"))?;
                }
                Ok(())
            };
            write(&crt, cert)?;
            write(&kf, key)?;
            // Only TLS connections from loopback (local socket connections stay trusted).
            let hba = "local all all trust\nhostssl all all 127.0.0.1/32 trust\n\
                       hostnossl all all 127.0.0.1/32 reject\n";
            std::fs::write(data.join("pg_hba.conf"), hba)
                .map_err(PeerError::io("writing pg_hba.conf"))?;
            for c in [
                "ssl=on".to_string(),
                format!("ssl_cert_file={}", crt.display()),
                format!("ssl_key_file={}", kf.display()),
            ] {
                args.push("-c".into());
                args.push(c.into());
            }
        }
        let cmd = as_user(who, bin.join("postgres"), args);
        let refs: Vec<&OsStr> = cmd.iter().map(|s| s.as_os_str()).collect();
        // SIGINT: PostgreSQL's fast shutdown (SIGTERM would wait for every client to leave).
        let server = Guarded::spawn("postgres", &dir, &log, "INT", &refs)?;
        let mut pg = Self { port, dir, server: Some(server) };
        // Ready when it answers at all (a TLS-only server refuses plain connections, but
        // only once it is up).
        let url = pg.url("postgres");
        wait_until("postgresql", Duration::from_secs(60), || {
            match postgres::Client::connect(&url, postgres::NoTls) {
                Ok(_) => true,
                // Refused for want of TLS, but up; "starting up" is not up yet.
                Err(e) => e
                    .as_db_error()
                    .is_some_and(|d| *d.code() != postgres::error::SqlState::CANNOT_CONNECT_NOW),
            }
        })
        .inspect_err(|_| {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            tracing::error!(%log, "postgresql did not start");
        })?;
        if !pg.running() {
            return Err(PeerError::Command { program: "postgres".into(), detail: "exited".into() });
        }
        Ok(pg)
    }

    /// A connection URL for database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}?connect_timeout=10", self.port)
    }

    /// Create a new, empty database named `name`; returns its URL (TCP, as clients use).
    /// Done over the server's Unix socket, which works whether or not TCP needs TLS.
    pub fn create_db(&self, name: &str) -> Result<String> {
        let local =
            format!("host={} port={} user=postgres dbname=postgres", self.dir.display(), self.port);
        let mut c = postgres::Client::connect(&local, postgres::NoTls)?;
        // Names come from the caller's code, not from users; quoted all the same.
        c.batch_execute(&format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\"")))?;
        Ok(self.url(name))
    }

    /// A fresh database with a unique name; returns its URL.
    pub fn fresh_db(&self) -> Result<String> {
        let mut b = [0u8; 6];
        getrandom::fill(&mut b).expect("the OS random source works");
        self.create_db(&format!("t_{}", hex::encode(b)))
    }

    /// Whether the server still runs.
    pub fn running(&mut self) -> bool {
        self.server.as_mut().is_some_and(Guarded::running)
    }

    /// Stop the server (as a crash would look to its clients: connections drop).
    pub fn stop(&mut self) {
        if let Some(mut s) = self.server.take() {
            s.stop();
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}
