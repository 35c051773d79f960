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

/// A loopback TCP port free right now (the OS picks it; it is released for the caller).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("loopback has free ports")
}
