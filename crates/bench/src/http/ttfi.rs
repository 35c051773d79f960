//! Time to first image: a 2048² 16-bit grayscale PNG stored in the server under test, opened
//! in headless Chromium by `web-tests/ttfi.mjs` (node + playwright-core), which reports when
//! the page first drew it; and, as the baseline of the same run, plain GETs of the same
//! image's raw samples and PNG.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::Deserialize;

use super::get::get;
use super::report::TimeToFirstImage;
use crate::error::BenchError;
use crate::paths::find_on_path;

/// Side of the test image.
pub const SIDE: usize = 2048;
/// Where it is stored.
pub const KEY: &str = "bench/ttfi-2048.png";

/// The browser harness and what it needs.
#[derive(Debug, Clone)]
pub struct Harness {
    node: PathBuf,
    script: PathBuf,
}

impl Harness {
    /// node on PATH, Chromium (`$CHROMIUM` or /usr/bin/chromium), and `web-tests/ttfi.mjs`
    /// with playwright-core installed beside it, looked for in the current directory and in
    /// the repository this was built from. `Err` says what is missing.
    pub fn find() -> Result<Self, String> {
        let node = find_on_path("node").ok_or("node is not installed (Node.js 20 or later)")?;
        let chromium = std::env::var_os("CHROMIUM")
            .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
        if !chromium.is_file() {
            return Err(format!(
                "Chromium not found at {} (scripts/browser-setup.sh installs it)",
                chromium.display()
            ));
        }
        let roots =
            [PathBuf::from("."), PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))];
        let mut script_found = false;
        for root in roots {
            let dir = root.join("web-tests");
            let script = dir.join("ttfi.mjs");
            if !script.is_file() {
                continue;
            }
            script_found = true;
            if dir.join("node_modules/playwright-core").is_dir() {
                return Ok(Self { node, script });
            }
        }
        Err(if script_found {
            "web-tests/node_modules has no playwright-core (run scripts/browser-setup.sh)".into()
        } else {
            "web-tests/ttfi.mjs not found (run from the repository)".into()
        })
    }

    /// Open `key` at `url` in `runs` page loads after one warm-up; milliseconds of each.
    pub fn run(&self, url: &str, key: &str, runs: u32) -> Result<Vec<f64>, String> {
        let out = Command::new(&self.node)
            .arg(&self.script)
            .args([url, key, &runs.to_string()])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", self.node.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
            return Err(format!("web-tests/ttfi.mjs failed ({}): {}", out.status, last.trim()));
        }
        parse_output(&stdout)
    }
}

/// The summary line; its `first_image_ms` (the median) is recomputed from `runs`.
#[derive(Deserialize)]
struct Summary {
    runs: Vec<f64>,
}

/// The summary line (`{"first_image_ms": median, "runs": [...]}`), the last line of the
/// harness's output; the per-run times.
pub fn parse_output(stdout: &str) -> Result<Vec<f64>, String> {
    let summary = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Summary>(l.trim()).ok())
        .ok_or_else(|| {
            format!("no summary line in the output of web-tests/ttfi.mjs: {stdout:?}")
        })?;
    if summary.runs.is_empty() || summary.runs.iter().any(|m| !m.is_finite() || *m < 0.0) {
        return Err(format!("unusable times from web-tests/ttfi.mjs: {:?}", summary.runs));
    }
    Ok(summary.runs)
}

/// Time plain GETs of the image's raw samples and PNG, `runs` each after one warm-up, taking
/// turns; checks status, length and (for the PNG) every byte.
pub fn plain_downloads(
    addr: SocketAddr,
    png: &[u8],
    pixel_bytes: u64,
    runs: u32,
) -> Result<(Vec<f64>, Vec<f64>), BenchError> {
    let (mut pixels, mut blob) = (Vec::new(), Vec::new());
    for i in 0..=runs {
        let p = get(addr, &format!("/api/pixels/{KEY}"))?;
        if p.status != 200 || p.body.len() as u64 != pixel_bytes {
            return Err(BenchError::Http(format!(
                "GET /api/pixels/{KEY}: status {}, {} bytes (expected 200, {pixel_bytes})",
                p.status,
                p.body.len()
            )));
        }
        let b = get(addr, &format!("/blobs/{KEY}"))?;
        if b.status != 200 || b.body != png {
            return Err(BenchError::Http(format!(
                "GET /blobs/{KEY}: status {}, {} bytes that are not the stored PNG",
                b.status,
                b.body.len()
            )));
        }
        if i > 0 {
            pixels.push(p.elapsed.as_secs_f64() * 1e3);
            blob.push(b.elapsed.as_secs_f64() * 1e3);
        }
    }
    Ok((pixels, blob))
}

/// Everything about the image but the browser's times.
pub fn describe(png_bytes: u64, pixels_ms: Vec<f64>, blob_ms: Vec<f64>) -> TimeToFirstImage {
    TimeToFirstImage {
        key: KEY.into(),
        width: SIDE,
        height: SIDE,
        png_bytes,
        pixel_bytes: (SIDE * SIDE * 2) as u64,
        pixels_ms,
        blob_ms,
        ..TimeToFirstImage::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_summary_line() {
        let out = "{\"rep\":0,\"warmup\":true,\"first_image_ms\":812.5}\n\
                   {\"rep\":1,\"warmup\":false,\"first_image_ms\":301.2}\n\
                   {\"rep\":2,\"warmup\":false,\"first_image_ms\":299.8}\n\
                   {\"first_image_ms\":300.5,\"runs\":[301.2,299.8]}\n";
        assert_eq!(parse_output(out).unwrap(), [301.2, 299.8]);
        assert!(parse_output("{\"rep\":0,\"first_image_ms\":1}\n").is_err());
        assert!(parse_output("{\"first_image_ms\":1,\"runs\":[]}").is_err());
    }
}
