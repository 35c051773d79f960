//! `put -r` and `get -r`: a folder up to a prefix, a prefix down to a folder, through the Blob
//! API's batch copies; one progress bar for the whole job and a summary at the end.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use bs_blob::{BatchReport, Job, NewBlob, Options, Problem, Transporter};

use crate::cli::{BatchFlags, GetArgs, Global, PutArgs, TransferFlags};
use crate::{commands, progress};

pub fn put(g: &Global, a: PutArgs) -> Result<()> {
    if !a.file.is_dir() {
        bail!("put -r: {} is not a folder", a.file.display());
    }
    let (mut jobs, problems) = bs_blob::plan_upload(&a.file, &g.server, &a.key);
    let meta: std::collections::BTreeMap<_, _> = a.meta.into_iter().collect();
    for j in &mut jobs {
        j.spec = NewBlob {
            content_type: a
                .content_type
                .clone()
                .unwrap_or(std::mem::take(&mut j.spec.content_type)),
            metadata: meta.clone(),
            ..NewBlob::default()
        };
    }
    let opts = Options::blocking().resume(!a.no_resume).overwrite(a.overwrite);
    let what = format!("put -r {} -> {}", a.file.display(), bs_blob::folder_prefix(&a.key));
    run(g, &what, &a.transfer, &a.batch, jobs, problems, &opts)
}

pub fn get(g: &Global, a: GetArgs) -> Result<()> {
    let prefix = bs_blob::folder_prefix(&a.key);
    let listed = commands::client(g)?
        .list(&prefix)
        .with_context(|| format!("listing {prefix:?} on {}", g.server))?;
    if listed.is_empty() {
        bail!("get -r: no blobs under {prefix:?} on {}", g.server);
    }
    let dir = Path::new(&a.file);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let blobs = listed.into_iter().map(|b| (b.name, b.size));
    let (jobs, problems) = bs_blob::plan_download(blobs, &g.server, &prefix, dir);
    for j in &jobs {
        if let Some(parent) = j.dst.path().and_then(|p| p.parent().map(Path::to_path_buf)) {
            std::fs::create_dir_all(&parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
    }
    let opts = Options::blocking().resume(!a.no_resume);
    let what = format!("get -r {prefix} -> {}", dir.display());
    run(g, &what, &a.transfer, &a.batch, jobs, problems, &opts)
}

fn run(
    g: &Global,
    what: &str,
    t: &TransferFlags,
    b: &BatchFlags,
    jobs: Vec<Job>,
    problems: Vec<Problem>,
    opts: &Options,
) -> Result<()> {
    let transporter = Transporter::new(commands::factory(g, t)?);
    let pb = progress::bar(what);
    let quiet = g.quiet || b.json;
    let report = transporter.copy_batch(jobs, b.jobs, opts, |p| {
        pb.set_message(format!("{what} ({}/{} files)", p.jobs_done, p.jobs));
        progress::update(&pb, p.bytes_done, p.bytes, quiet);
    });
    pb.finish_and_clear();
    let not_planned = problems.iter().filter(|p| p.failed).count();
    let failed = report.failed().count() + not_planned;
    let skipped = problems.len() - not_planned;
    if b.json {
        let json = serde_json::to_string_pretty(&summary_json(&report, &problems))?;
        writeln!(std::io::stdout(), "{json}").context(commands::STDOUT)?;
    } else {
        for p in &problems {
            let tag = if p.failed { "FAILED" } else { "skipped" };
            eprintln!("{tag} {}: {}", p.what, p.reason);
        }
        for (name, e) in report.failed() {
            eprintln!("FAILED {name}: {e}");
        }
        if !g.quiet || failed > 0 {
            eprintln!("{what}: {}", summary_line(&report, skipped, failed));
        }
    }
    if failed > 0 {
        let all = report.outcomes.len() + not_planned;
        bail!("{what}: {failed} of {all} failed (each named above); run it again to finish");
    }
    Ok(())
}

fn summary_line(r: &BatchReport, skipped: usize, failed: usize) -> String {
    let secs = r.elapsed.as_secs_f64();
    format!(
        "{} files, {} in {secs:.2} s ({}/s moved): {} copied, {} already there, {skipped} \
         skipped, {failed} failed",
        r.outcomes.len(),
        human(r.total_bytes()),
        human((r.bytes as f64 / secs.max(1e-9)) as u64),
        r.copied(),
        r.already_there(),
    )
}

fn summary_json(r: &BatchReport, problems: &[Problem]) -> serde_json::Value {
    let mut failed: Vec<_> = problems
        .iter()
        .filter(|p| p.failed)
        .map(|p| serde_json::json!({ "name": p.what, "error": p.reason }))
        .collect();
    failed
        .extend(r.failed().map(|(n, e)| serde_json::json!({ "name": n, "error": e.to_string() })));
    let skipped: Vec<_> = problems
        .iter()
        .filter(|p| !p.failed)
        .map(|p| serde_json::json!({ "name": p.what, "reason": p.reason }))
        .collect();
    let secs = r.elapsed.as_secs_f64();
    serde_json::json!({
        "files": r.outcomes.len(),
        "copied": r.copied(),
        "already_there": r.already_there(),
        "skipped": skipped,
        "failed": failed,
        "bytes_moved": r.bytes,
        "bytes_total": r.total_bytes(),
        "seconds": secs,
        "bytes_per_second": (r.bytes as f64 / secs.max(1e-9)) as u64,
    })
}

/// Bytes in KiB/MiB/GiB with one decimal (`ls -h` style).
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(250_000 * 50), "11.9 MiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
