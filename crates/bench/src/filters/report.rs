//! The filter benchmark's results as JSON, Markdown (for BENCHMARKS.md) and a terminal table,
//! with the targets (≥ 1× OpenCV, ≥ 10× Pillow) checked against the numbers.

use std::fmt::Write as _;

use bs_imaging::DynImage;
use serde_json::json;

/// blobstream must be at least this multiple of OpenCV's equivalent...
pub const TARGET_VS_OPENCV: f64 = 1.0;
/// ...and of Pillow's.
pub const TARGET_VS_PILLOW: f64 = 10.0;

/// One filter, image and implementation.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterMeasurement {
    pub filter: String,
    pub width: usize,
    pub height: usize,
    /// "rgb8" or "gray16".
    pub pixel: String,
    pub threads: usize,
    /// "blobstream", "opencv" or "pillow".
    pub implementation: &'static str,
    /// Megapixels per second: the median of its rounds' median runs (one round with
    /// `--quick`).
    pub mpix_per_s: f64,
}

impl FilterMeasurement {
    pub fn new(
        filter: &str,
        img: &DynImage,
        pixel: &str,
        threads: usize,
        implementation: &'static str,
        seconds: f64,
    ) -> Self {
        let mpix = (img.width() * img.height()) as f64 / 1e6;
        Self {
            filter: filter.to_string(),
            width: img.width(),
            height: img.height(),
            pixel: pixel.to_string(),
            threads,
            implementation,
            mpix_per_s: if seconds > 0.0 { mpix / seconds } else { f64::INFINITY },
        }
    }
}

/// Everything one `blobstream bench filters` found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FilterReport {
    pub results: Vec<FilterMeasurement>,
    pub notes: Vec<String>,
    pub machine: String,
    pub command: String,
}

/// A measured row: one filter on one image with one thread count.
type Row = (String, usize, usize); // (filter, side, threads)

impl FilterReport {
    fn get(&self, pixel: &str, row: &Row, implementation: &str) -> Option<f64> {
        self.results
            .iter()
            .find(|m| {
                m.pixel == pixel
                    && m.filter == row.0
                    && m.width == row.1
                    && m.threads == row.2
                    && m.implementation == implementation
            })
            .map(|m| m.mpix_per_s)
    }

    fn rows(&self, pixel: &str) -> Vec<Row> {
        let mut rows: Vec<Row> = Vec::new();
        for m in
            self.results.iter().filter(|m| m.pixel == pixel && m.implementation == "blobstream")
        {
            let r = (m.filter.clone(), m.width, m.threads);
            if !rows.contains(&r) {
                rows.push(r);
            }
        }
        rows
    }

    fn pixels(&self) -> Vec<String> {
        let mut p: Vec<String> = Vec::new();
        for m in &self.results {
            if !p.contains(&m.pixel) {
                p.push(m.pixel.clone());
            }
        }
        p
    }

    /// blobstream / other on a row, when both were measured.
    pub fn ratio(&self, pixel: &str, row: &Row, other: &str) -> Option<f64> {
        let bs = self.get(pixel, row, "blobstream")?;
        let o = self.get(pixel, row, other)?;
        (o > 0.0).then(|| bs / o)
    }

    /// (comparisons that hold, comparisons made) over every row.
    pub fn targets(&self) -> (usize, usize) {
        let (mut ok, mut all) = (0, 0);
        for pixel in self.pixels() {
            for row in self.rows(&pixel) {
                for (other, target) in [("opencv", TARGET_VS_OPENCV), ("pillow", TARGET_VS_PILLOW)]
                {
                    if let Some(r) = self.ratio(&pixel, &row, other) {
                        all += 1;
                        ok += usize::from(r >= target);
                    }
                }
            }
        }
        (ok, all)
    }

    pub fn to_json(&self) -> serde_json::Value {
        let results: Vec<_> = self
            .results
            .iter()
            .map(|m| {
                json!({
                    "filter": m.filter, "width": m.width, "height": m.height, "pixel": m.pixel,
                    "threads": m.threads, "impl": m.implementation, "mpix_per_s": m.mpix_per_s,
                })
            })
            .collect();
        json!({ "results": results, "notes": self.notes })
    }

    pub fn to_markdown(&self) -> String {
        let mut md = String::from("## Filters\n\n");
        let _ = writeln!(md, "Command: `{}`  \nMachine: {}\n", self.command, self.machine);
        let _ = writeln!(
            md,
            "Megapixels per second of each filter with its default parameters, beside the \
             nearest OpenCV and Pillow equivalents timed on the same pixels in the same run \
             (`bench/filters_baseline.py`). Each side is timed in rounds (a warm-up of {} ms of \
             calls, at least one, since a memory-bound filter's first milliseconds after other \
             work run slower on this kind of machine, then a few runs) that take turns with the \
             other side's, so a slow spell of a shared machine falls on both; each figure is the \
             median of its rounds' median runs. Pillow is \
             single-threaded and compared on one thread; OpenCV on the same thread count.",
            super::WARM_UP.as_millis()
        );
        let cell = |v: Option<f64>| v.map_or_else(|| "–".to_string(), |v| format!("{v:.1}"));
        let ratio = |v: Option<f64>, target: f64| {
            v.map_or_else(
                || "–".to_string(),
                |r| format!("{r:.2}× {}", if r >= target { "✔" } else { "✘" }),
            )
        };
        for pixel in self.pixels() {
            let _ = writeln!(md, "\n### {pixel}\n");
            md.push_str("| Filter | Size | Threads | blobstream | OpenCV | Pillow | vs OpenCV (≥ 1×) | vs Pillow (≥ 10×) |\n");
            md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
            for row in self.rows(&pixel) {
                let _ = writeln!(
                    md,
                    "| {} | {}² | {} | {} | {} | {} | {} | {} |",
                    row.0,
                    row.1,
                    row.2,
                    cell(self.get(&pixel, &row, "blobstream")),
                    cell(self.get(&pixel, &row, "opencv")),
                    cell(self.get(&pixel, &row, "pillow")),
                    ratio(self.ratio(&pixel, &row, "opencv"), TARGET_VS_OPENCV),
                    ratio(self.ratio(&pixel, &row, "pillow"), TARGET_VS_PILLOW),
                );
            }
        }
        let (ok, all) = self.targets();
        let _ = writeln!(
            md,
            "\n**Targets** (each filter ≥ 1× OpenCV's equivalent and ≥ 10× Pillow's): {ok} of {all} comparisons hold {}",
            if ok == all && all > 0 { "✔" } else { "✘" }
        );
        if !self.notes.is_empty() {
            md.push_str("\nNotes:\n\n");
            for n in &self.notes {
                let _ = writeln!(md, "- {n}");
            }
        }
        md
    }

    pub fn print_table(&self) -> String {
        let mut out = String::from("filters, Mpixel/s (median of runs)\n");
        let _ = writeln!(
            out,
            "{:<7} {:<10} {:>6} {:>3} {:>11} {:>9} {:>9} {:>7} {:>7}",
            "pixel", "filter", "size", "thr", "blobstream", "opencv", "pillow", "vs cv", "vs pil"
        );
        let num = |v: Option<f64>| v.map_or_else(|| "–".into(), |v| format!("{v:.1}"));
        let rat = |v: Option<f64>| v.map_or_else(|| "–".into(), |v| format!("{v:.2}×"));
        for pixel in self.pixels() {
            for row in self.rows(&pixel) {
                let _ = writeln!(
                    out,
                    "{:<7} {:<10} {:>6} {:>3} {:>11} {:>9} {:>9} {:>7} {:>7}",
                    pixel,
                    row.0,
                    row.1,
                    row.2,
                    num(self.get(&pixel, &row, "blobstream")),
                    num(self.get(&pixel, &row, "opencv")),
                    num(self.get(&pixel, &row, "pillow")),
                    rat(self.ratio(&pixel, &row, "opencv")),
                    rat(self.ratio(&pixel, &row, "pillow")),
                );
            }
        }
        let (ok, all) = self.targets();
        let _ =
            writeln!(out, "targets (≥ 1× OpenCV, ≥ 10× Pillow): {ok} of {all} comparisons hold");
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(
        filter: &str,
        implementation: &'static str,
        threads: usize,
        mpix: f64,
    ) -> FilterMeasurement {
        FilterMeasurement {
            filter: filter.into(),
            width: 512,
            height: 512,
            pixel: "rgb8".into(),
            threads,
            implementation,
            mpix_per_s: mpix,
        }
    }

    #[test]
    fn targets_are_computed_from_the_numbers() {
        let r = FilterReport {
            results: vec![
                m("blur", "blobstream", 1, 1000.0),
                m("blur", "opencv", 1, 800.0),
                m("blur", "pillow", 1, 200.0),
                m("spread", "blobstream", 1, 50.0),
                m("spread", "pillow", 1, 10.0),
            ],
            ..Default::default()
        };
        // blur: 1.25× OpenCV ✔, 5× Pillow ✘; spread: 5× Pillow ✘.
        assert_eq!(r.targets(), (1, 3));
        let md = r.to_markdown();
        assert!(md.contains("1.25× ✔") && md.contains("5.00× ✘"), "{md}");
        let j = r.to_json();
        assert_eq!(j["results"][0]["impl"], "blobstream");
        assert_eq!(j["results"][0]["pixel"], "rgb8");
    }
}
