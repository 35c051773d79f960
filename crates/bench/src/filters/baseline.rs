//! Runs `bench/filters_baseline.py` with the project's virtualenv and reads its JSON.

use std::path::{Path, PathBuf};
use std::process::Command;

use bs_imaging::DynImage;
use serde::Deserialize;

use super::report::FilterMeasurement;
use crate::error::BenchError;

/// (implementation, "filter on pixel (reason)"): a comparison the baseline could not make.
pub type Gap = (String, String);

/// The virtualenv's Python and the harness script.
pub struct Python {
    python: PathBuf,
    script: PathBuf,
}

#[derive(Deserialize)]
struct Output {
    results: Vec<Row>,
    missing: Vec<Missing>,
}

#[derive(Deserialize)]
struct Row {
    filter: String,
    #[serde(rename = "impl")]
    implementation: String,
    mpix_per_s: f64,
}

#[derive(Deserialize)]
struct Missing {
    filter: String,
    #[serde(rename = "impl")]
    implementation: String,
    reason: String,
}

impl Python {
    /// Look in `./bench` (running from the repository) and then in the repository this was
    /// built from; `BLOBSTREAM_BENCH_PYTHON` overrides the interpreter.
    pub fn find() -> Option<Self> {
        let (python, script) = crate::python::find("filters_baseline.py", "numpy, cv2, PIL")?;
        Some(Self { python, script })
    }

    /// Time the equivalents of `filters` on the image stored raw at `raw`. `all` is the
    /// machine's thread count (OpenCV is told 0 = all cores for it).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        raw: &Path,
        img: &DynImage,
        pixel: &str,
        runs: u32,
        threads: usize,
        filters: &[&str],
    ) -> Result<(Vec<FilterMeasurement>, Vec<Gap>), BenchError> {
        let depth = if matches!(img, DynImage::U16(_)) { "16" } else { "8" };
        let cv_threads = if threads == 1 { "1" } else { "0" };
        let out = Command::new(&self.python)
            .arg(&self.script)
            .arg(raw)
            .args([
                img.width().to_string(),
                img.height().to_string(),
                img.channels().to_string(),
                depth.to_string(),
                runs.to_string(),
                cv_threads.to_string(),
                super::WARM_UP.as_secs_f64().to_string(),
            ])
            .args(filters)
            .output()
            .map_err(BenchError::io("running bench/filters_baseline.py"))?;
        if !out.status.success() {
            return Err(BenchError::Baseline(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        let parsed: Output = serde_json::from_slice(&out.stdout)
            .map_err(|e| BenchError::Baseline(format!("unreadable output: {e}")))?;
        let secs = |mpix_per_s: f64| (img.width() * img.height()) as f64 / 1e6 / mpix_per_s;
        let found = parsed
            .results
            .into_iter()
            .map(|r| {
                let implementation = if r.implementation == "opencv" { "opencv" } else { "pillow" };
                FilterMeasurement::new(
                    &r.filter,
                    img,
                    pixel,
                    threads,
                    implementation,
                    secs(r.mpix_per_s),
                )
            })
            .collect();
        let missing = parsed
            .missing
            .into_iter()
            .map(|m| (m.implementation, format!("{} on {pixel} ({})", m.filter, m.reason)))
            .collect();
        Ok((found, missing))
    }
}
