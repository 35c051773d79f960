//! `blobstream bench filters`: every filter on 512², 2048² and 4096² RGB and 16-bit grayscale
//! images, on one thread and on all, beside the nearest OpenCV and Pillow equivalents timed
//! on the same pixels in the same run (by `bench/filters_baseline.py` in the project's
//! virtualenv, installed by `scripts/bench-setup.sh`).

mod baseline;
mod images;
mod report;

pub use images::test_image;
pub use report::{FilterMeasurement, FilterReport};

use std::time::Instant;

use bs_imaging::{Params, Registry, Run};

use crate::error::BenchError;
use crate::machine::machine_description;
use crate::payload::median;

/// The filters measured (MedJava's eight), each with its default parameters.
pub const FILTERS: [&str; 8] =
    ["blur", "despeckle", "sharpen", "edge", "emboss", "oilpaint", "pixelize", "spread"];

/// Image sides measured, and timed runs for each.
fn plan(quick: bool) -> Vec<(usize, u32)> {
    if quick { vec![(512, 3), (2048, 2)] } else { vec![(512, 9), (2048, 7), (4096, 5)] }
}

/// Median seconds of `runs` calls after one warm-up.
fn time(runs: u32, mut f: impl FnMut() -> Result<(), BenchError>) -> Result<f64, BenchError> {
    f()?;
    let mut s = Vec::with_capacity(runs as usize);
    for _ in 0..runs {
        let t = Instant::now();
        f()?;
        s.push(t.elapsed().as_secs_f64());
    }
    Ok(median(&s))
}

/// Run the benchmark.
/// Quick: 512² and 2048² only, fewer runs.
pub fn run_filters(opts: &crate::options::BenchOptions) -> Result<FilterReport, BenchError> {
    let say = |line: &str| opts.say(line);
    let registry = Registry::builtin();
    let all = Run::all().thread_count();
    let mut results = Vec::new();
    let mut notes = Vec::new();
    if cfg!(debug_assertions) {
        notes.push("debug build: numbers are not representative; build with --release".into());
    }
    let python = baseline::Python::find();
    if python.is_none() {
        notes.push(
            "OpenCV and Pillow not installed: run scripts/bench-setup.sh; blobstream measured alone"
                .into(),
        );
    }
    let mut gaps: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let dir = tempfile::tempdir().map_err(BenchError::io("temporary directory"))?;
    for (side, runs) in plan(opts.quick) {
        for pixel in ["rgb8", "gray16"] {
            let img = test_image(side, pixel);
            let raw = dir.path().join(format!("{side}-{pixel}.raw"));
            images::write_raw(&img, &raw).map_err(BenchError::io("writing the test image"))?;
            for threads in dedup([1, all]) {
                say(&format!("{pixel} {side}×{side}, {threads} thread(s): {runs} runs per filter"));
                let run = Run::with_threads(threads);
                for f in FILTERS {
                    let secs = time(runs, || {
                        registry.apply(f, &img, &Params::new(), &run)?;
                        Ok(())
                    })?;
                    results.push(FilterMeasurement::new(
                        f,
                        &img,
                        pixel,
                        threads,
                        "blobstream",
                        secs,
                    ));
                }
                if let Some(py) = &python {
                    let (found, missing) =
                        py.run(&raw, &img, pixel, runs, threads, all, &FILTERS)?;
                    results.extend(found);
                    for (implementation, what) in missing {
                        let list = gaps.entry(implementation).or_default();
                        if !list.contains(&what) {
                            list.push(what);
                        }
                    }
                }
            }
        }
    }
    for (implementation, list) in gaps {
        notes.push(format!("not compared with {implementation}: {}", list.join(", ")));
    }
    let command =
        if opts.quick { "blobstream bench filters --quick" } else { "blobstream bench filters" };
    Ok(FilterReport { results, notes, machine: machine_description(), command: command.into() })
}

fn dedup(v: [usize; 2]) -> Vec<usize> {
    if v[0] == v[1] { vec![v[0]] } else { v.to_vec() }
}
