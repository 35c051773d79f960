//! Where the peer programs are: from the environment, or from `scripts/peers-setup.sh`
//! (which installs them once and prints `KEY=path` lines).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::error::PeerError;

type Result<T> = std::result::Result<T, PeerError>;

/// The `KEY=path` lines of one run of the setup script, shared by every caller.
fn setup_output() -> Result<&'static Vec<(String, String)>> {
    static OUT: OnceLock<std::result::Result<Vec<(String, String)>, String>> = OnceLock::new();
    OUT.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/peers-setup.sh");
        let out = Command::new(&script)
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!("{} exited with {}", script.display(), out.status));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    })
    .as_ref()
    .map_err(|e| PeerError::Setup(e.clone()))
}

fn located(var: &str) -> Result<PathBuf> {
    if let Ok(v) = std::env::var(var)
        && !v.is_empty()
    {
        return Ok(PathBuf::from(v));
    }
    setup_output()?
        .iter()
        .find(|(k, _)| k == var)
        .map(|(_, v)| PathBuf::from(v))
        .ok_or_else(|| PeerError::Setup(format!("the setup script did not say where {var} is")))
}

/// The `garage` binary.
pub fn garage_binary() -> Result<PathBuf> {
    located("BLOBSTREAM_GARAGE")
}

/// The directory holding PostgreSQL's `initdb` and `postgres`.
pub fn pg_bin_dir() -> Result<PathBuf> {
    located("BLOBSTREAM_PG_BIN")
}

/// Ports handed out by [`free_port`]: below Linux's default ephemeral range (32768–60999),
/// from which the kernel picks every `bind(port 0)` and every outgoing connection's port.
const PEER_PORTS: std::ops::Range<u16> = 20000..32000;

/// A loopback TCP port free right now, for a peer (Garage, PostgreSQL) to bind a while later.
/// Not one the kernel picks for port 0 (with Linux's default `ip_local_port_range`): a test
/// binding port 0, or connecting anywhere, in the meantime could be given that very port.
/// Taken in turn from a start that differs per process, each checked free by binding it;
/// only if all of them are taken, one the kernel picks.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = u32::from(PEER_PORTS.end - PEER_PORTS.start);
    let start = std::process::id().wrapping_mul(7919);
    for _ in 0..span {
        let k = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = PEER_PORTS.start + k as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("loopback has free ports")
}
