//! `blobstream bench filters`: every filter on 512², 2048² and 4096² RGB and 16-bit grayscale
//! images, on one thread and on all, beside the nearest OpenCV and Pillow equivalents timed
//! on the same pixels in the same run (by `bench/filters_baseline.py` in the project's
//! virtualenv, installed by `scripts/bench-setup.sh`).

mod baseline;
mod images;
mod report;

pub use images::test_image;
pub use report::{FilterMeasurement, FilterReport};

use std::time::{Duration, Instant};

use bs_imaging::{Params, Registry, Run};

use crate::error::BenchError;
use crate::machine::machine_description;
use crate::payload::median;

/// The filters measured (MedJava's eight), each with its default parameters.
pub const FILTERS: [&str; 8] =
    ["blur", "despeckle", "sharpen", "edge", "emboss", "oilpaint", "pixelize", "spread"];

/// Image sides measured, with the rounds and the timed runs per round for each. The two
/// sides take turns round by round (blobstream first in even rounds, the baselines in odd
/// ones), so a slow spell of a shared machine falls on both rather than on one.
fn plan(quick: bool) -> Vec<(usize, u32, u32)> {
    if quick {
        vec![(512, 1, 3), (2048, 1, 2)]
    } else {
        vec![(512, 3, 5), (2048, 3, 3), (4096, 3, 2)]
    }
}

/// How long each side calls a filter before timing it (at least once); the Python side
/// (`bench/filters_baseline.py`) is given it on its command line.
pub const WARM_UP: Duration = Duration::from_millis(25);

/// Median seconds of `runs` calls after a warm-up of [`WARM_UP`]: on this kind of machine a
/// memory-bound filter's first milliseconds after other work (or a pause) run slower while
/// the memory system comes up to speed — a 2048² pixelize took 3–5 runs of 1 ms to reach its
/// rate after compute-bound work, a sleep or a busy loop — so one warm-up call is not enough
/// for the fast filters, and a fixed time treats every filter and both sides alike.
fn time(runs: u32, mut f: impl FnMut() -> Result<(), BenchError>) -> Result<f64, BenchError> {
    let warm = Instant::now();
    f()?;
    while warm.elapsed() < WARM_UP {
        f()?;
    }
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
    for (side, rounds, runs) in plan(opts.quick) {
        for pixel in ["rgb8", "gray16"] {
            let img = test_image(side, pixel);
            let raw = dir.path().join(format!("{side}-{pixel}.raw"));
            images::write_raw(&img, &raw).map_err(BenchError::io("writing the test image"))?;
            for threads in dedup([1, all]) {
                say(&format!(
                    "{pixel} {side}×{side}, {threads} thread(s): {rounds} round(s) of {runs} runs per filter"
                ));
                let run = Run::with_threads(threads);
                // Per round: blobstream's median seconds per filter, the baselines' results.
                let mut ours: Vec<Vec<f64>> = vec![Vec::new(); FILTERS.len()];
                let mut theirs: Vec<FilterMeasurement> = Vec::new();
                for round in 0..rounds {
                    let order = if round % 2 == 0 { [true, false] } else { [false, true] };
                    for blobstream in order {
                        if blobstream {
                            for (i, f) in FILTERS.iter().enumerate() {
                                ours[i].push(time(runs, || {
                                    registry.apply(f, &img, &Params::new(), &run)?;
                                    Ok(())
                                })?);
                            }
                            continue;
                        }
                        let Some(py) = &python else { continue };
                        let (found, missing) =
                            py.run(&raw, &img, pixel, runs, threads, &FILTERS)?;
                        theirs.extend(found);
                        for (implementation, what) in missing {
                            let list = gaps.entry(implementation).or_default();
                            if !list.contains(&what) {
                                list.push(what);
                            }
                        }
                    }
                }
                for (f, secs) in FILTERS.iter().zip(&ours) {
                    let secs = median(secs);
                    results.push(FilterMeasurement::new(
                        f,
                        &img,
                        pixel,
                        threads,
                        "blobstream",
                        secs,
                    ));
                }
                results.extend(median_of_rounds(theirs));
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

/// One measurement per filter and implementation: the median rate of its rounds.
fn median_of_rounds(rounds: Vec<FilterMeasurement>) -> Vec<FilterMeasurement> {
    let mut out: Vec<FilterMeasurement> = Vec::new();
    for m in &rounds {
        let same =
            |o: &FilterMeasurement| (&o.filter, o.implementation) == (&m.filter, m.implementation);
        if out.iter().any(same) {
            continue;
        }
        let rates: Vec<f64> = rounds.iter().filter(|o| same(o)).map(|o| o.mpix_per_s).collect();
        out.push(FilterMeasurement { mpix_per_s: median(&rates), ..m.clone() });
    }
    out
}

fn dedup(v: [usize; 2]) -> Vec<usize> {
    if v[0] == v[1] { vec![v[0]] } else { v.to_vec() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(filter: &str, implementation: &'static str, rate: f64) -> FilterMeasurement {
        FilterMeasurement {
            filter: filter.into(),
            width: 512,
            height: 512,
            pixel: "rgb8".into(),
            threads: 1,
            implementation,
            mpix_per_s: rate,
        }
    }

    #[test]
    fn each_filter_and_implementation_gets_the_median_of_its_rounds() {
        let rounds = vec![
            m("blur", "opencv", 10.0),
            m("blur", "pillow", 1.0),
            m("blur", "opencv", 30.0),
            m("edge", "opencv", 5.0),
            m("blur", "pillow", 3.0),
            m("blur", "opencv", 20.0),
            m("blur", "pillow", 2.0),
        ];
        let got: Vec<(String, &str, f64)> = median_of_rounds(rounds)
            .into_iter()
            .map(|m| (m.filter, m.implementation, m.mpix_per_s))
            .collect();
        assert_eq!(
            got,
            [
                ("blur".to_string(), "opencv", 20.0),
                ("blur".to_string(), "pillow", 2.0),
                ("edge".to_string(), "opencv", 5.0)
            ]
        );
    }
}
