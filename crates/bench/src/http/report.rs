//! The HTTP benchmark's results as JSON, Markdown (for BENCHMARKS.md) and a terminal table,
//! with the target (blobstream ≥ 0.95× nginx on every size) checked against the numbers.

use std::fmt::Write as _;

use serde_json::json;

use crate::payload::{MB, median};
use crate::report::size_text;

/// blobstream must reach this fraction of nginx's download rate on every size.
pub const TARGET_VS_NGINX: f64 = 0.95;
/// The target in words.
pub const HTTP_TARGET: &str = "downloads of every size: blobstream ≥ 0.95× nginx";

/// One blob size downloaded from both servers.
#[derive(Debug, Clone, PartialEq)]
pub struct DownloadMeasurement {
    pub size_bytes: u64,
    /// Bytes/s of each timed run, in run order. Run i of each server ran back to back
    /// (interleaved), so they are compared pairwise.
    pub blobstream: Vec<f64>,
    pub nginx: Vec<f64>,
}

impl DownloadMeasurement {
    pub fn runs(&self) -> usize {
        self.blobstream.len().min(self.nginx.len())
    }

    /// Median MB/s (MB = 2²⁰ bytes).
    pub fn blobstream_mb_per_s(&self) -> f64 {
        median(&self.blobstream) / MB as f64
    }

    pub fn nginx_mb_per_s(&self) -> f64 {
        median(&self.nginx) / MB as f64
    }

    /// blobstream / nginx: the median of the per-run ratios (drift on a shared machine
    /// cancels out of each pair); `None` without a complete set of pairs.
    pub fn ratio(&self) -> Option<f64> {
        let ok = self.runs() > 0
            && self.blobstream.len() == self.nginx.len()
            && self.nginx.iter().all(|n| *n > 0.0);
        ok.then(|| {
            let per_run: Vec<f64> =
                self.blobstream.iter().zip(&self.nginx).map(|(b, n)| b / n).collect();
            median(&per_run)
        })
    }

    pub fn target_met(&self) -> Option<bool> {
        self.ratio().map(|r| r >= TARGET_VS_NGINX)
    }
}

/// How the downloads were run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HttpSetup {
    /// nginx worker processes = blobstream's runtime worker threads.
    pub server_workers: usize,
    pub wrk_threads: usize,
    pub wrk_connections: u32,
    pub seconds_per_run: u32,
    /// e.g. "nginx/1.22.1"; `None` when not installed.
    pub nginx: Option<String>,
    /// e.g. "debian/4.1.0-3+b2"; `None` when not installed.
    pub wrk: Option<String>,
}

/// Time to first image in the browser, beside plain downloads of the same image.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TimeToFirstImage {
    pub key: String,
    pub width: usize,
    pub height: usize,
    /// Size of the stored PNG.
    pub png_bytes: u64,
    /// Size of the raw samples `/api/pixels` sends.
    pub pixel_bytes: u64,
    /// Milliseconds from navigation start to the first image drawn, one per page load after
    /// the warm-up; empty when not measured.
    pub browser_ms: Vec<f64>,
    /// Why the browser was not measured.
    pub not_measured: Option<String>,
    /// Milliseconds of each plain GET of `/api/pixels/{key}` and `/blobs/{key}` (connection
    /// set-up to last byte), after one warm-up.
    pub pixels_ms: Vec<f64>,
    pub blob_ms: Vec<f64>,
}

impl TimeToFirstImage {
    pub fn first_image_ms(&self) -> Option<f64> {
        (!self.browser_ms.is_empty()).then(|| median(&self.browser_ms))
    }

    fn image_text(&self) -> String {
        format!(
            "{}×{} 16-bit grayscale PNG `{}` ({:.1} MB; {} of raw samples)",
            self.width,
            self.height,
            self.key,
            self.png_bytes as f64 / MB as f64,
            size_text(self.pixel_bytes)
        )
    }

    fn browser_text(&self) -> String {
        match (self.first_image_ms(), &self.not_measured) {
            (Some(ms), _) => format!(
                "{ms:.0} ms (median of {} page loads, each in a fresh browser context, after \
                 one warm-up)",
                self.browser_ms.len()
            ),
            (None, Some(why)) => format!("not measured: {why}"),
            (None, None) => "not measured".into(),
        }
    }

    fn downloads_text(&self, code: bool) -> String {
        let q = |s: String| if code { format!("`{s}`") } else { s };
        format!(
            "{} {:.1} ms, {} {:.1} ms (median of {})",
            q(format!("/api/pixels/{}", self.key)),
            median(&self.pixels_ms),
            q(format!("/blobs/{}", self.key)),
            median(&self.blob_ms),
            self.pixels_ms.len()
        )
    }
}

/// Everything one `blobstream bench http` found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HttpReport {
    /// One per size, smallest first; empty when nginx or wrk is missing.
    pub downloads: Vec<DownloadMeasurement>,
    pub setup: HttpSetup,
    pub ttfi: TimeToFirstImage,
    pub notes: Vec<String>,
    pub machine: String,
    pub command: String,
}

fn mark(ok: bool) -> &'static str {
    if ok { "✔" } else { "✘" }
}

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "–".into(), |r| format!("{r:.2}×"))
}

impl HttpReport {
    /// Whether the downloads were measured (nginx and wrk were there).
    pub fn downloads_measured(&self) -> bool {
        !self.downloads.is_empty()
    }

    fn target_summary(&self) -> String {
        if self.downloads.is_empty() {
            return "not checked (no download measured) ✘".into();
        }
        let held = self.downloads.iter().filter(|d| d.target_met() == Some(true)).count();
        let all = self.downloads.len();
        format!("{held} of {all} sizes hold {}", mark(held == all))
    }

    fn setup_text(&self) -> String {
        let s = &self.setup;
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        format!(
            "blobstream's HTTP server in this process over a filesystem store in a temporary \
             directory (tokio runtime with {}), and {} ({} each, access log off; once with \
             sendfile on and tcp_nopush on, once with sendfile off and 1 MiB output buffers, the \
             faster of the two counting in each run) serving the same bytes from files in another \
             temporary directory on the same disk; load from wrk {} ({}, {} keep-alive connections, {} s per run) on \
             127.0.0.1",
            plural(s.server_workers, "worker thread", "worker threads"),
            s.nginx.as_deref().unwrap_or("nginx"),
            plural(s.server_workers, "worker process", "worker processes"),
            s.wrk.as_deref().unwrap_or("(not installed)"),
            plural(s.wrk_threads, "thread", "threads"),
            s.wrk_connections,
            s.seconds_per_run,
        )
    }

    /// `{"downloads": [...], "time_to_first_image": {...}, "setup": {...}, "notes": [...]}`.
    pub fn to_json(&self) -> serde_json::Value {
        let round = |x: f64, places: i32| {
            let f = 10f64.powi(places);
            (x * f).round() / f
        };
        let downloads: Vec<_> = self
            .downloads
            .iter()
            .map(|d| {
                json!({
                    "size_bytes": d.size_bytes,
                    "runs": d.runs(),
                    "blobstream_mb_per_s": round(d.blobstream_mb_per_s(), 1),
                    "nginx_mb_per_s": round(d.nginx_mb_per_s(), 1),
                    "ratio": d.ratio().map(|r| round(r, 3)),
                    "target": TARGET_VS_NGINX,
                    "met": d.target_met(),
                })
            })
            .collect();
        let t = &self.ttfi;
        let s = &self.setup;
        json!({
            "downloads": downloads,
            "time_to_first_image": {
                "key": t.key,
                "width": t.width,
                "height": t.height,
                "png_bytes": t.png_bytes,
                "pixel_bytes": t.pixel_bytes,
                "first_image_ms": t.first_image_ms().map(|m| round(m, 1)),
                "runs": t.browser_ms.len(),
                "not_measured": t.not_measured,
                "pixels_download_ms": round(median(&t.pixels_ms), 2),
                "blob_download_ms": round(median(&t.blob_ms), 2),
            },
            "setup": {
                "server_workers": s.server_workers,
                "wrk_threads": s.wrk_threads,
                "wrk_connections": s.wrk_connections,
                "seconds_per_run": s.seconds_per_run,
                "nginx": s.nginx,
                "wrk": s.wrk,
            },
            "notes": self.notes,
        })
    }

    /// A Markdown section: command and machine, the download table with the target checked,
    /// time to first image, notes.
    pub fn to_markdown(&self) -> String {
        let mut md = String::from("## HTTP download\n\n");
        let _ = writeln!(md, "Command: `{}`  \nMachine: {}\n", self.command, self.machine);
        let _ = writeln!(
            md,
            "GET `/blobs/{{key}}` of blobs of each size: {}. MB/s = bytes wrk read ÷ run time \
             (MB = 2²⁰ bytes), median of the runs after one warm-up. nginx runs twice over the \
             same files, with `sendfile on; tcp_nopush on` and with `sendfile off; output_buffers \
             2 1m` (which is faster depends on the machine); the nginx figure of each run is the \
             faster of the two. The servers take turns run by run (which goes first rotates), \
             and the ratio is the median of the per-run ratios (blobstream's run i against \
             nginx's run i), so drift on a shared machine cancels out. Before timing, one GET per server and size checked status 200, \
             Content-Length and every byte.\n",
            self.setup_text()
        );
        if self.downloads.is_empty() {
            md.push_str("Downloads not measured (see the notes).\n");
        } else {
            md.push_str(
                "| Size | Runs | blobstream MB/s | nginx MB/s | blobstream / nginx | Target | Met |\n\
                 |---:|---:|---:|---:|---:|---:|:---:|\n",
            );
            for d in &self.downloads {
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.0} | {:.0} | {} | ≥ {TARGET_VS_NGINX:.2}× | {} |",
                    size_text(d.size_bytes),
                    d.runs(),
                    d.blobstream_mb_per_s(),
                    d.nginx_mb_per_s(),
                    ratio_text(d.ratio()),
                    d.target_met().map_or("–", mark),
                );
            }
        }
        let _ = writeln!(md, "\n**Target** ({HTTP_TARGET}): {}\n", self.target_summary());
        let t = &self.ttfi;
        md.push_str("### Time to first image\n\n");
        let _ = writeln!(md, "- Image: {}", t.image_text());
        let _ = writeln!(
            md,
            "- Time to first image in the browser (headless Chromium; from navigation start to \
             the image drawn on the canvas, opened by its `#/KEY` link): **{}**",
            t.browser_text()
        );
        let _ = writeln!(
            md,
            "- The same image downloaded in the same run by a plain HTTP/1.1 GET (new connection \
             each, connect to last byte): {}",
            t.downloads_text(true)
        );
        if !self.notes.is_empty() {
            md.push_str("\nNotes:\n\n");
            for n in &self.notes {
                let _ = writeln!(md, "- {n}");
            }
        }
        md
    }

    /// A compact plain-text table for the terminal.
    pub fn print_table(&self) -> String {
        let mut out = String::from(
            "HTTP download, MB/s (median of runs; MB = 2^20 bytes; ratio = median of per-run \
             ratios)\n",
        );
        let _ = writeln!(
            out,
            "{:>7} {:>4} {:>11} {:>9} {:>9} {:>4}",
            "size", "runs", "blobstream", "nginx", "bs/nginx", "met"
        );
        for d in &self.downloads {
            let _ = writeln!(
                out,
                "{:>7} {:>4} {:>11.0} {:>9.0} {:>9} {:>4}",
                size_text(d.size_bytes),
                d.runs(),
                d.blobstream_mb_per_s(),
                d.nginx_mb_per_s(),
                ratio_text(d.ratio()),
                d.target_met().map_or("–", mark),
            );
        }
        let _ = writeln!(out, "target ({HTTP_TARGET}): {}", self.target_summary());
        let _ = writeln!(out, "setup: {}", self.setup_text());
        let t = &self.ttfi;
        let _ = writeln!(out, "time to first image, {}: {}", t.image_text(), t.browser_text());
        let _ = writeln!(out, "  plain GET of the same image: {}", t.downloads_text(false));
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        let _ = writeln!(out, "machine: {}", self.machine);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> HttpReport {
        let mb = MB as f64;
        HttpReport {
            downloads: vec![
                DownloadMeasurement {
                    size_bytes: MB,
                    blobstream: vec![900.0 * mb, 1000.0 * mb, 1100.0 * mb],
                    nginx: vec![1000.0 * mb, 1000.0 * mb, 1000.0 * mb],
                },
                DownloadMeasurement {
                    size_bytes: 32 * MB,
                    // Per-run ratios 0.25, 1.0, 2.0 (nginx's runs reversed): median 1.0.
                    blobstream: vec![1000.0 * mb, 3000.0 * mb, 4000.0 * mb],
                    nginx: vec![2000.0 * mb, 3000.0 * mb, 4000.0 * mb].into_iter().rev().collect(),
                },
            ],
            setup: HttpSetup {
                server_workers: 1,
                wrk_threads: 1,
                wrk_connections: 4,
                seconds_per_run: 2,
                nginx: Some("nginx/1.22.1".into()),
                wrk: Some("debian/4.1.0-3+b2".into()),
            },
            ttfi: TimeToFirstImage {
                key: "bench/ttfi-2048.png".into(),
                width: 2048,
                height: 2048,
                png_bytes: 5 * MB,
                pixel_bytes: 8 * MB,
                browser_ms: vec![300.0, 250.0, 280.0],
                not_measured: None,
                pixels_ms: vec![10.0, 12.0, 11.0],
                blob_ms: vec![3.0, 4.0, 5.0],
            },
            notes: vec!["a note".into()],
            machine: "Linux test x86_64, 2 CPUs".into(),
            command: "blobstream bench http --quick".into(),
        }
    }

    #[test]
    fn ratios_pair_runs_and_targets_follow() {
        let r = report();
        assert!((r.downloads[0].ratio().unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(r.downloads[0].target_met(), Some(true));
        // 32 MB: nginx runs 4000, 3000, 2000 → per-run 0.25, 1.0, 2.0 → median 1.0.
        assert!((r.downloads[1].ratio().unwrap() - 1.0).abs() < 1e-9);
        let uneven = DownloadMeasurement { size_bytes: MB, blobstream: vec![1.0], nginx: vec![] };
        assert_eq!((uneven.ratio(), uneven.target_met()), (None, None));
    }

    #[test]
    fn json_has_downloads_ttfi_setup_and_notes() {
        let v = report().to_json();
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["downloads", "notes", "setup", "time_to_first_image"]);
        assert_eq!(
            v["downloads"][0],
            json!({"size_bytes": MB, "runs": 3, "blobstream_mb_per_s": 1000.0,
                   "nginx_mb_per_s": 1000.0, "ratio": 1.0, "target": 0.95, "met": true})
        );
        assert_eq!(v["time_to_first_image"]["first_image_ms"], 280.0);
        assert_eq!(v["time_to_first_image"]["not_measured"], serde_json::Value::Null);
        assert_eq!(v["time_to_first_image"]["pixels_download_ms"], 11.0);
        assert_eq!(v["setup"]["server_workers"], 1);
    }

    #[test]
    fn markdown_shows_table_target_and_ttfi() {
        let mut r = report();
        r.downloads[1].blobstream[1] = 1000.0 * MB as f64; // per-run 0.25, 0.33, 2.0
        let md = r.to_markdown();
        assert!(md.starts_with("## HTTP download\n"), "{md}");
        assert!(md.contains("`blobstream bench http --quick`"), "{md}");
        assert!(md.contains("Machine: Linux test x86_64, 2 CPUs"), "{md}");
        assert!(md.contains("| 1 MB | 3 | 1000 | 1000 | 1.00× | ≥ 0.95× | ✔ |"), "{md}");
        assert!(md.contains("| 32 MB | 3 | 1000 | 3000 | 0.33× | ≥ 0.95× | ✘ |"), "{md}");
        assert!(md.contains("1 of 2 sizes hold ✘"), "{md}");
        assert!(md.contains("1 worker process"), "{md}");
        assert!(md.contains("**280 ms (median of 3 page loads"), "{md}");
        assert!(md.contains("`/api/pixels/bench/ttfi-2048.png` 11.0 ms"), "{md}");
        assert!(md.contains("- a note"), "{md}");

        let t = r.print_table();
        assert!(
            t.lines().any(|l| l.trim_start().starts_with("32 MB") && l.contains("0.33×")),
            "{t}"
        );
    }

    #[test]
    fn missing_baseline_and_browser_are_said() {
        let mut r = report();
        r.downloads.clear();
        r.ttfi.browser_ms.clear();
        r.ttfi.not_measured = Some("node is not installed".into());
        let md = r.to_markdown();
        assert!(md.contains("Downloads not measured"), "{md}");
        assert!(md.contains("not checked (no download measured) ✘"), "{md}");
        assert!(md.contains("not measured: node is not installed"), "{md}");
        assert_eq!(r.to_json()["time_to_first_image"]["first_image_ms"], serde_json::Value::Null);
        assert!(!r.downloads_measured());
    }
}
