//! `blobstream bench dicom`: DICOM decode throughput per transfer syntax, blobstream's
//! `bs_imageio::decode` against pydicom with its pylibjpeg / openjpeg / RLE / JPEG-LS plugins
//! (`bench/dicom_baseline.py`), on the same files in the same run: megabytes of decoded pixels
//! per second, medians.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde::Deserialize;

use crate::bindings::{Row, RowsReport};
use crate::error::BenchError;
use crate::machine::machine_description;
use crate::options::BenchOptions;
use crate::payload::median;

#[derive(Deserialize)]
struct Baseline {
    syntax: String,
    uid: String,
    file: String,
    /// Columns × rows, as the script writes it.
    size: String,
    pixel_bytes: u64,
    seconds: Vec<f64>,
}

/// Run `bench/dicom_baseline.py` with `args`; its standard output.
fn baseline_script(
    python: &Path,
    script: &Path,
    args: &[&std::ffi::OsStr],
) -> Result<Vec<u8>, BenchError> {
    let out = Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .map_err(BenchError::io("running bench/dicom_baseline.py"))?;
    if !out.status.success() {
        return Err(BenchError::Invalid(format!(
            "bench/dicom_baseline.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(out.stdout)
}

/// The 12-bit JPEG streams the baseline script wraps into DICOM files (no Python package here
/// writes them): its phantom, encoded by libjpeg-turbo lossy (Extended, quality 90) and
/// lossless with predictors 6 and 1 (SV1), under the names the script looks for.
fn jpeg12_streams(python: &Path, script: &Path, dir: &Path) -> Result<(), BenchError> {
    baseline_script(python, script, &["--phantom".as_ref(), dir.as_os_str()])?;
    let raw = std::fs::read(dir.join("phantom12.raw")).map_err(BenchError::io("the phantom"))?;
    let samples: Vec<u16> = raw.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
    let side = (samples.len() as f64).sqrt() as usize;
    for (file, psv, quality) in [
        ("jpeg-extended-12.jpg", None, 90),
        ("jpeg-lossless.jpg", Some(6), 0),
        ("jpeg-lossless-sv1.jpg", Some(1), 0),
    ] {
        let stream = bs_imageio::dicom::jpeg12::encode_gray(&samples, side, side, 12, psv, quality)
            .map_err(|e| BenchError::Invalid(format!("{file}: {e}")))?;
        std::fs::write(dir.join(file), stream).map_err(BenchError::io("a 12-bit JPEG stream"))?;
    }
    Ok(())
}

/// Run the benchmark (pydicom and its plugins must be in the bench virtualenv:
/// `scripts/bench-setup.sh`).
pub fn run_dicom(opts: &BenchOptions) -> Result<RowsReport, BenchError> {
    // A native decode takes tens of microseconds: many runs, or the median is scheduling noise.
    // They come in rounds that alternate pydicom's share and ours, so drift on a shared
    // machine falls on both alike.
    let (rounds, per_round) = if opts.quick { (1, 5) } else { (5, 20) };
    let runs = rounds * per_round;
    let imports = "pydicom, pylibjpeg, openjpeg, rle, jpeg_ls, PIL, numpy";
    let Some((python, script)) = crate::python::find("dicom_baseline.py", imports) else {
        return Err(BenchError::Invalid(
            "pydicom and its plugins are not installed: run scripts/bench-setup.sh".into(),
        ));
    };
    let dir = tempfile::tempdir().map_err(BenchError::io("temp dir"))?;
    jpeg12_streams(&python, &script, dir.path())?;
    let limits = bs_imageio::Limits::default();
    // Per syntax, in the script's order: its baseline (all rounds' times), our times, and
    // each round's ratio.
    let mut syntaxes: Vec<(Baseline, Vec<f64>, Vec<f64>)> = Vec::new();
    for round in 0..rounds {
        opts.say(&format!(
            "round {} of {rounds}: pydicom, then blobstream, {per_round} decodes per file",
            round + 1
        ));
        let per = per_round.to_string();
        let out = baseline_script(&python, &script, &[dir.path().as_os_str(), per.as_ref()])?;
        for (i, line) in String::from_utf8_lossy(&out).lines().enumerate() {
            let b: Baseline = serde_json::from_str(line)
                .map_err(|e| BenchError::Invalid(format!("baseline output {line:?}: {e}")))?;
            let bytes = std::fs::read(&b.file).map_err(BenchError::io("reading a test file"))?;
            let mut times = Vec::with_capacity(per_round);
            for _ in 0..per_round + 1 {
                let t = Instant::now();
                let d = bs_imageio::decode(&bytes, Some("bench.dcm"), &limits)
                    .map_err(|e| BenchError::Invalid(format!("{}: {e}", b.syntax)))?;
                times.push(t.elapsed().as_secs_f64());
                std::hint::black_box(&d);
            }
            let ours = &times[1..];
            let ratio = median(&b.seconds) / median(ours);
            if round == 0 {
                syntaxes.push((b, ours.to_vec(), vec![ratio]));
            } else {
                let Some(entry) = syntaxes.get_mut(i) else {
                    return Err(BenchError::Invalid(
                        "the baseline's files changed between rounds".into(),
                    ));
                };
                entry.0.seconds.extend_from_slice(&b.seconds);
                entry.1.extend_from_slice(ours);
                entry.2.push(ratio);
            }
        }
    }
    let mut rows = Vec::new();
    for (b, ours, ratios) in &syntaxes {
        let mb = b.pixel_bytes as f64 / 1e6;
        rows.push(Row {
            group: "decode",
            what: format!("{} ({}), {}", b.syntax, b.uid, b.size),
            ours: mb / median(ours),
            baseline: mb / median(&b.seconds),
            baseline_name: "pydicom + plugins".into(),
            unit: "MB/s",
            ratio: median(ratios),
            ratio_means: "ours / baseline",
            target: Some((5.0, true)),
        });
    }
    let notes = vec![
        "each run decodes one file to pixels: blobstream from bytes in memory, checking the file's \
         structure and the codec header against the DICOM header first and converting to its \
         display mapping (rescale, sign); pydicom from the file (in the page cache), returning the \
         stored samples as a numpy array (for native data a view of the bytes read)"
            .into(),
        "JPEG 2000 decodes on both cores (OpenJPEG's threads), so does 12-bit lossy JPEG (two \
         bands of rows at once, each skipping the other's, the upper one larger as the lower one \
         entropy-decodes it to skip it: `crates/imageio/src/dicom/jpeg12.rs`); the other codecs \
         on one"
            .into(),
        "codecs: blobstream uses libjpeg-turbo (TurboJPEG; its SIMD code is built when NASM is on \
         the build machine, which scripts/build-deps.sh, part of the test command, installs) for \
         grey JPEG (lossy at 8 and 12 bits; lossless where its own decoder, \
         `crates/imageio/src/dicom/jpeg_lossless.rs`, declines) and for colour where its colour \
         conversion is the one DICOM asks for (jpeg-decoder for other colour), its own \
         JPEG-LS decoder for one-component scans (`crates/imageio/src/dicom/jpegls_scan.rs`; \
         CharLS for other JPEG-LS), OpenJPEG (JPEG 2000) and its own RLE decoder; pydicom uses \
         pylibjpeg-libjpeg, pyjpegls (CharLS), pylibjpeg-openjpeg and pylibjpeg-rle"
            .into(),
        "files: the same 12-bit phantom in every syntax but JPEG Baseline (8 bits, grey and a \
         640 × 480 ultrasound-like colour frame in YBR_FULL_422, 4:2:2); JPEG-LS \
         near-lossless with an error bound of 2 and JPEG 2000 lossy at 10:1 by the plugins' own \
         encoders, JPEG Extended 12-bit (quality 90) and JPEG Lossless (predictors 6 and 1) by \
         libjpeg-turbo, as no Python package here writes them"
            .into(),
        format!(
            "{runs} decodes of each file per side, in {rounds} rounds alternating pydicom's \
             share and ours (each after one warm-up); rates from the medians of all, the ratio \
             the median of the rounds' ratios"
        ),
    ];
    Ok(RowsReport {
        title: "DICOM decoding",
        command: "blobstream bench dicom",
        runs,
        machine: machine_description(),
        quick: opts.quick,
        rows,
        notes,
    })
}
