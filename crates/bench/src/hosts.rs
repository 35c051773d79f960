//! Benchmarks across real hosts: run one of the namespace scripts (`scripts/*-hosts.py
//! --bench RUNS`) with this binary and read the JSON it prints.

use std::path::PathBuf;
use std::process::Command;

use crate::error::BenchError;
use crate::options::BenchOptions;

/// Run `scripts/{script} --bench {runs}` (saying `what` first) and parse its JSON; `None` when
/// this process cannot create namespaces (not root, or no `ip`/`tc`) or the script is missing.
pub fn run_script(
    opts: &BenchOptions,
    script: &str,
    runs: usize,
    what: &str,
) -> Result<Option<serde_json::Value>, BenchError> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let path = [PathBuf::from("."), PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))]
        .into_iter()
        .map(|r| r.join("scripts").join(script))
        .find(|p| p.is_file());
    let tools = ["ip", "tc"]
        .iter()
        .all(|t| Command::new(t).arg("-V").output().is_ok_and(|o| o.status.success()));
    let (true, Some(path), true) = (root, path, tools) else { return Ok(None) };
    opts.say(&format!("{what} ({runs} runs)"));
    let exe = std::env::current_exe().map_err(BenchError::io("finding this binary"))?;
    let out = Command::new("python3")
        .arg(&path)
        .args(["--bench", &runs.to_string()])
        .env("BLOBSTREAM_BIN", exe)
        .output()
        .map_err(BenchError::io(format!("running scripts/{script}")))?;
    if !out.status.success() {
        return Err(BenchError::Baseline(String::from_utf8_lossy(&out.stderr).trim().to_string()));
    }
    serde_json::from_slice(&out.stdout)
        .map(Some)
        .map_err(|e| BenchError::Baseline(format!("scripts/{script}: unreadable output: {e}")))
}

/// The numbers of a JSON array in a script's output (none when it is missing or no array).
pub fn numbers(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().into_iter().flatten().filter_map(|x| x.as_f64()).collect()
}
