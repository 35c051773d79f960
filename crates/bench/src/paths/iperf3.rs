//! The reference line: iperf3 over the loopback, when it is installed. It reports its own
//! rate (data phase only, without connection set-up), so it shows what the machine can do
//! rather than doing exactly the same work as the other paths.
//!
//! One `iperf3 -s` serves every run and is stopped when the runner is dropped. (A one-off
//! `iperf3 -s -1` per run cannot be used: it exits after the readiness probe's connection.)

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::error::BenchError;
use crate::measure::{PathRunner, Transfer};
use crate::model::{Mode, Path};
use crate::payload::MB;

/// Smallest blob iperf3 measures: below this its fixed start-up costs dominate.
pub const IPERF3_MIN_SIZE: u64 = 8 * MB;
/// Longest wait for the iperf3 server to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(5);

/// The executable `name` in a directory of `PATH`, if there is one.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let dirs = std::env::var_os("PATH")?;
    std::env::split_paths(&dirs)
        .map(|d| d.join(name))
        .find(|p| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// An `iperf3 -s` on 127.0.0.1.
pub struct Iperf3Runner {
    exe: PathBuf,
    port: u16,
    server: Child,
}

impl Iperf3Runner {
    /// Start the server; `None` when iperf3 is not installed.
    pub fn start() -> Result<Option<Self>, BenchError> {
        let Some(exe) = find_on_path("iperf3") else { return Ok(None) };
        let port = bs_peers::free_port();
        let server = Command::new(&exe)
            .args(["-s", "-p", &port.to_string(), "-B", "127.0.0.1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(BenchError::io(format!("starting {}", exe.display())))?;
        let mut runner = Self { exe, port, server };
        runner.wait_ready()?;
        Ok(Some(runner))
    }

    /// Poll until the server accepts connections (it treats the probe as a failed test and
    /// goes on serving).
    fn wait_ready(&mut self) -> Result<(), BenchError> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.server.try_wait() {
                return Err(BenchError::Iperf3(format!("server exited at start: {status}")));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(BenchError::Iperf3(format!(
                    "server not accepting connections on {addr} after {READY_TIMEOUT:?}"
                )));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Iperf3Runner {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// Receiver-side rate from `iperf3 -J` output, in bit/s.
pub(crate) fn received_bits_per_second(json: &[u8]) -> Result<f64, BenchError> {
    let v: serde_json::Value = serde_json::from_slice(json)
        .map_err(|e| BenchError::Iperf3(format!("unreadable JSON output: {e}")))?;
    if let Some(err) = v.get("error").and_then(|e| e.as_str()) {
        return Err(BenchError::Iperf3(err.to_string()));
    }
    v.pointer("/end/sum_received/bits_per_second")
        .and_then(|b| b.as_f64())
        .ok_or_else(|| BenchError::Iperf3("no end.sum_received.bits_per_second in output".into()))
}

impl PathRunner for Iperf3Runner {
    fn path(&self) -> Path {
        Path::Iperf3
    }

    fn measures(&self, size: u64) -> bool {
        size >= IPERF3_MIN_SIZE
    }

    fn transfer(&mut self, mode: Mode, data: &Bytes, buffer: u32) -> Result<Transfer, BenchError> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(["-c", "127.0.0.1", "-p", &self.port.to_string()]).args([
            "-n",
            &data.len().to_string(),
            "-J",
        ]);
        if mode == Mode::Pull {
            cmd.arg("-R");
        }
        if buffer > 0 {
            cmd.args(["-w", &buffer.to_string()]);
        }
        // The server runs one test at a time and takes a moment to forget the last one (or
        // the readiness probe): "busy" is asked again, briefly.
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let out =
                cmd.stdin(Stdio::null()).output().map_err(BenchError::io("running iperf3"))?;
            match received_bits_per_second(&out.stdout) {
                Ok(bps) => return Ok(Transfer { gbit_per_s: bps / 1e9, received: None }),
                Err(BenchError::Iperf3(e)) if e.contains("busy") && Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) if out.status.success() => return Err(e),
                Err(e) => {
                    return Err(BenchError::Iperf3(format!("{e} (exit status {})", out.status)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf3_json_is_read_or_its_error_reported() {
        let ok = br#"{"end": {"sum_received": {"bits_per_second": 2.5e10}}}"#;
        assert_eq!(received_bits_per_second(ok).unwrap(), 2.5e10);
        let e = received_bits_per_second(br#"{"error": "unable to connect"}"#).unwrap_err();
        assert!(e.to_string().contains("unable to connect"), "{e}");
        assert!(received_bits_per_second(b"not json").is_err());
    }

    #[test]
    fn path_lookup_finds_sh_and_not_nonsense() {
        assert!(find_on_path("sh").is_some());
        assert!(find_on_path("no-such-program-blobstream").is_none());
    }
}
