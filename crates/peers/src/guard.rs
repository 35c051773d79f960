//! Peer processes that cannot outlive their owner. Each server runs under a small shell
//! watchdog that stops it (SIGTERM, then waits) and removes its directory when the server is
//! dropped — or when the owning process is gone, even if it was killed, because statics are
//! never dropped and a test binary exits without unwinding. `PR_SET_PDEATHSIG` is no help
//! here: it fires when the *thread* that spawned the child ends, and tests end threads.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::error::PeerError;

/// A running peer process under its watchdog.
pub struct Guarded {
    watchdog: Child,
    name: String,
}

/// The watchdog: runs the command in the background, then waits while both its owner
/// (`$1`) and the server live; then stops the server with signal `$4` and removes the
/// directory (`$2`).
const WATCHDOG: &str = r#"
owner=$1; dir=$2; log=$3; sig=$4; shift 4
"$@" >>"$log" 2>&1 &
child=$!
trap 'kill -$sig $child 2>/dev/null' TERM
while kill -0 "$owner" 2>/dev/null && kill -0 "$child" 2>/dev/null; do sleep 0.2; done
kill -$sig $child 2>/dev/null
wait $child 2>/dev/null
rm -rf "$dir"
"#;

impl Guarded {
    /// Start `cmd` (program and arguments) logging to `log`; it is stopped with signal
    /// `stop_signal` (`TERM`, `INT`, ...) and `dir` removed.
    pub fn spawn(
        name: &str,
        dir: &Path,
        log: &Path,
        stop_signal: &str,
        cmd: &[&std::ffi::OsStr],
    ) -> Result<Self, PeerError> {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(WATCHDOG)
            .arg("watchdog")
            .arg(std::process::id().to_string())
            .arg(dir)
            .arg(log)
            .arg(stop_signal)
            .args(cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let watchdog = c.spawn().map_err(PeerError::io(format!("starting {name}")))?;
        Ok(Self { watchdog, name: name.to_string() })
    }

    /// Whether the server (and its watchdog) still run.
    pub fn running(&mut self) -> bool {
        matches!(self.watchdog.try_wait(), Ok(None))
    }

    /// Stop the server and wait until it is gone and its directory removed.
    pub fn stop(&mut self) {
        if self.running() {
            // SAFETY: plain kill(2) of our own child's pid.
            unsafe { libc::kill(self.watchdog.id() as libc::pid_t, libc::SIGTERM) };
        }
        if let Err(e) = self.watchdog.wait() {
            tracing::warn!(peer = %self.name, error = %e, "waiting for the watchdog");
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A fresh directory for one server, readable by `owner` (uid, gid) when given.
pub fn fresh_dir(prefix: &str, owner: Option<(u32, u32)>) -> Result<PathBuf, PeerError> {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).expect("the OS random source works");
    let dir =
        std::env::temp_dir().join(format!("{prefix}-{}-{}", std::process::id(), hex::encode(b)));
    std::fs::create_dir_all(&dir).map_err(PeerError::io(format!("creating {}", dir.display())))?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .map_err(PeerError::io(format!("chown {}", dir.display())))?;
    }
    Ok(dir)
}

/// Wait until `ready()` holds, polling; `Err` after `within`.
pub fn wait_until(
    what: &str,
    within: std::time::Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<(), PeerError> {
    let until = std::time::Instant::now() + within;
    let mut pause = std::time::Duration::from_millis(20);
    loop {
        if ready() {
            return Ok(());
        }
        if std::time::Instant::now() > until {
            return Err(PeerError::NotReady(what.to_string(), within));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(250));
    }
}
