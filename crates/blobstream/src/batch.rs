//! `put -r`, `get -r` and `sync`: a folder up to a prefix, a prefix down to a folder, through
//! the Blob API's batch copies; one progress bar for the whole job and a summary at the end.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bs_blob::{
    BatchReport, BlobKey, Job, Location, NewBlob, Options, Problem, Selection, Transporter,
};

use crate::cli::{GetArgs, Global, ManyFlags, PutArgs, SyncArgs, TransferFlags};
use crate::{commands, progress};

/// In-flight copies when --jobs is not given.
const DEFAULT_JOBS: usize = 8;

pub fn put(g: &Global, a: PutArgs) -> Result<()> {
    let template = NewBlob {
        content_type: a.content_type.unwrap_or_default(),
        metadata: crate::commands::user_metadata(a.meta)?.into_iter().collect(),
        ..NewBlob::default()
    };
    let opts = Options::blocking().resume(!a.no_resume).overwrite(a.overwrite);
    let opts = opts.connections(a.transfer.connections);
    let b = Batch { g, opts, many: &a.batch.many, t: &a.transfer, delete: false, verb: "put -r" };
    b.upload(&a.file, &g.server, &a.key, &template)
}

pub fn get(g: &Global, a: GetArgs) -> Result<()> {
    let opts = Options::blocking().resume(!a.no_resume).connections(a.transfer.connections);
    let b = Batch { g, opts, many: &a.batch.many, t: &a.transfer, delete: false, verb: "get -r" };
    b.download(&g.server, &a.key, Path::new(&a.file))
}

/// `sync SRC DST`: a folder to a prefix or a prefix to a folder, copying only what differs.
pub fn sync(g: &Global, a: SyncArgs) -> Result<()> {
    let src = commands::operand(g, &a.src)?;
    let dst = commands::operand(g, &a.dst)?;
    // Replace what differs; an interrupted copy of the same source still resumes.
    let opts = Options::blocking().resume(true).if_different(true);
    let opts = opts.connections(a.transfer.connections);
    let b = Batch { g, opts, many: &a.many, t: &a.transfer, delete: a.delete, verb: "sync" };
    match (src.location(), dst.location()) {
        (Location::File, Location::Remote(server)) => {
            let dir = src.path().expect("a file key has a path");
            b.upload(&dir, server, dst.name(), &NewBlob::default())
        }
        (Location::Remote(server), Location::File) => {
            let dir = dst.path().expect("a file key has a path");
            b.download(server, src.name(), &dir)
        }
        _ => crate::commands::usage!(
            "sync copies between a local folder and a prefix (bs:PREFIX or \
             blob://HOST:PORT/PREFIX); got {src} and {dst}"
        ),
    }
}

/// What a batch does besides its copies, for the summary.
#[derive(Default)]
struct Extra {
    /// Files or blobs left out by --include/--exclude.
    excluded: usize,
    /// With --delete: what was removed, and what could not be (with why).
    deleted: Vec<String>,
    not_deleted: Vec<(String, String)>,
    delete_asked: bool,
    /// Stopped by a signal (Ctrl-C) while the copies ran; then `--delete` removes nothing
    /// (`delete_skipped`).
    interrupted: bool,
    delete_skipped: bool,
}

/// One folder or prefix command: how its copies run and what it is called in messages.
struct Batch<'a> {
    g: &'a Global,
    opts: Options,
    many: &'a ManyFlags,
    t: &'a TransferFlags,
    delete: bool,
    verb: &'a str,
}

impl Batch<'_> {
    fn upload(&self, dir: &Path, server: &str, prefix: &str, template: &NewBlob) -> Result<()> {
        let Self { g, many, delete, verb, .. } = *self;
        if !dir.exists() {
            bail!("{verb}: {} does not exist", dir.display());
        }
        if !dir.is_dir() {
            bail!("{verb}: {} is not a folder", dir.display());
        }
        let selection = crate::commands::selection(&many.include, &many.exclude)?;
        let (mut jobs, problems) = bs_blob::plan_upload(dir, server, prefix);
        let mut extra = Extra { excluded: selection.apply(&mut jobs, prefix), ..Extra::default() };
        for j in &mut jobs {
            j.spec = NewBlob {
                content_type: match template.content_type.as_str() {
                    "" => std::mem::take(&mut j.spec.content_type),
                    ct => ct.to_string(),
                },
                metadata: template.metadata.clone(),
                ..NewBlob::default()
            };
        }
        let what =
            format!("{verb} {} -> {}", dir.display(), BlobKey::remote(server, folder(prefix)));
        let report = self.copy(&what, &jobs, &mut extra)?;
        extra.delete_skipped = delete && extra.interrupted;
        if delete && !extra.interrupted {
            // A server gone by now removes nothing, and the copies' failures are still told.
            let listed = commands::client_for(g, server).and_then(|c| {
                let names = c.list(&folder(prefix)).map_err(anyhow::Error::from)?;
                Ok((c, names))
            });
            match listed {
                Ok((c, names)) => {
                    let present: Vec<String> = names.into_iter().map(|b| b.name).collect();
                    let rm = |name: &str| match c.delete(name) {
                        // Removed meanwhile by someone else: gone either way.
                        Ok(()) | Err(bs_client::ClientError::NotFound(_)) => Ok(()),
                        Err(e) => Err(e.to_string()),
                    };
                    let shown = |name: &str| name.to_string();
                    remove(&mut extra, &present, &jobs, &problems, prefix, &selection, rm, shown);
                }
                Err(e) => {
                    extra.delete_asked = true;
                    let why =
                        format!("nothing removed: listing {:?} failed: {e:#}", folder(prefix));
                    extra.not_deleted.push(("--delete".into(), why));
                }
            }
        }
        finish(g, &what, many, report, &problems, &extra)
    }

    fn download(&self, server: &str, prefix: &str, dir: &Path) -> Result<()> {
        let Self { g, many, delete, verb, .. } = *self;
        let selection = crate::commands::selection(&many.include, &many.exclude)?;
        if dir.exists() && !dir.is_dir() {
            bail!("{verb}: {} is not a folder", dir.display());
        }
        let prefix = folder(prefix);
        let listed = commands::client_for(g, server)?
            .list(&prefix)
            .with_context(|| format!("listing {prefix:?} on {server}"))?;
        if listed.is_empty() {
            bail!("{verb}: no blobs under {prefix:?} on {server}");
        }
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let blobs = listed.into_iter().map(|b| (b.name, b.size));
        let (mut jobs, mut problems) = bs_blob::plan_download(blobs, server, &prefix, dir);
        let mut extra = Extra { excluded: selection.apply(&mut jobs, &prefix), ..Extra::default() };
        // Each file's folder, made here: one that cannot be (a file in its way, no permission,
        // a link on the way out of DIR) fails that file alone.
        jobs.retain(|j| match j.dst.path().map(|p| folders_for(dir, &p)) {
            Some(Err(why)) => {
                problems.push(Problem::failure(j.name.clone(), why));
                false
            }
            _ => true,
        });
        let what = format!("{verb} {} -> {}", BlobKey::remote(server, &prefix), dir.display());
        let report = self.copy(&what, &jobs, &mut extra)?;
        extra.delete_skipped = delete && extra.interrupted;
        if delete && !extra.interrupted {
            // The folder's files, named as blobs would be, so they compare with the listing.
            let (local, local_problems) = bs_blob::plan_upload(dir, server, &prefix);
            let paths: BTreeMap<String, PathBuf> =
                local.into_iter().filter_map(|j| Some((j.name, j.src.path()?))).collect();
            let mut problems = problems.clone();
            problems.extend(local_problems.into_iter().filter(|p| p.failed));
            let present: Vec<String> = paths.keys().cloned().collect();
            let rm = |name: &str| std::fs::remove_file(&paths[name]).map_err(|e| e.to_string());
            // A local file removed is named by its path, not as the blob it would be.
            let shown = |name: &str| paths[name].display().to_string();
            remove(&mut extra, &present, &jobs, &problems, &prefix, &selection, rm, shown);
        }
        finish(g, &what, many, report, &problems, &extra)
    }

    /// Run the copies with one progress bar for the whole job. A first Ctrl-C (or SIGTERM)
    /// lets the copies under way finish and starts no more (`extra.interrupted`); a second
    /// exits at once.
    fn copy(&self, what: &str, jobs: &[Job], extra: &mut Extra) -> Result<BatchReport> {
        let transporter = Transporter::new(commands::factory(self.g, self.t)?);
        let signals =
            crate::signals::BatchStop::install().context("installing the Ctrl-C handler")?;
        let opts = self.opts.clone().stop_when(signals.stop.clone());
        let pb = progress::bar(what);
        let quiet = self.g.quiet || self.many.json;
        let in_flight = self.many.jobs.unwrap_or(DEFAULT_JOBS);
        let report = transporter.copy_batch(jobs.to_vec(), in_flight, &opts, |p| {
            pb.set_message(format!("{what} ({}/{} files)", p.jobs_done, p.jobs));
            progress::update(&pb, p.bytes_done, p.bytes, quiet);
        });
        pb.finish_and_clear();
        signals.copies_over();
        extra.interrupted = signals.asked();
        Ok(report)
    }
}

/// `--delete`: remove (with `rm`) what `present` holds that no job wrote, unless the source
/// was not read in full. What was removed is reported as `shown` names it (a blob by its
/// name, a local file by its path).
#[allow(clippy::too_many_arguments)]
fn remove(
    extra: &mut Extra,
    present: &[String],
    jobs: &[Job],
    problems: &[Problem],
    prefix: &str,
    selection: &Selection,
    rm: impl Fn(&str) -> Result<(), String>,
    shown: impl Fn(&str) -> String,
) {
    extra.delete_asked = true;
    match bs_blob::plan_delete(
        present.iter().map(String::as_str),
        jobs,
        problems,
        prefix,
        selection,
    ) {
        Ok(names) => {
            for n in names {
                match rm(&n) {
                    Ok(()) => extra.deleted.push(shown(&n)),
                    Err(e) => extra.not_deleted.push((shown(&n), e)),
                }
            }
        }
        Err(why) => extra.not_deleted.push(("--delete".into(), format!("nothing removed: {why}"))),
    }
}

/// Make the folders `file` (a path under `dir`) goes into, following no link below `dir`: a
/// folder on the way that is a link could lead the file out of `dir`.
fn folders_for(dir: &Path, file: &Path) -> Result<(), String> {
    let Some(parent) = file.parent() else { return Ok(()) };
    let rel = parent
        .strip_prefix(dir)
        .map_err(|_| format!("{} is not under {}", file.display(), dir.display()))?;
    let mut at = dir.to_path_buf();
    for part in rel.components() {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!("{} is a link (not followed)", at.display()));
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("{} is in the way: not a folder", at.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&at)
                    .or_else(|e| if at.is_dir() { Ok(()) } else { Err(e) })
                    .map_err(|e| format!("creating {}: {e}", at.display()))?;
            }
            Err(e) => return Err(format!("{}: {e}", at.display())),
        }
    }
    Ok(())
}

fn folder(prefix: &str) -> String {
    bs_blob::folder_prefix(prefix)
}

/// Print the failures and the summary (or the JSON summary); an error when anything failed.
fn finish(
    g: &Global,
    what: &str,
    many: &ManyFlags,
    report: BatchReport,
    problems: &[Problem],
    extra: &Extra,
) -> Result<()> {
    let not_planned = problems.iter().filter(|p| p.failed).count();
    let failed = report.failed().count() + not_planned + extra.not_deleted.len();
    if many.json {
        let json = serde_json::to_string_pretty(&summary_json(&report, problems, extra))?;
        writeln!(std::io::stdout(), "{json}").context(commands::STDOUT)?;
    } else {
        // Local names may hold anything a file name can: shown escaped.
        let say = |line: String| eprintln!("{}", commands::shown(&line));
        for p in problems {
            let tag = if p.failed { "FAILED" } else { "skipped" };
            say(format!("{tag} {}: {}", p.what, p.reason));
        }
        // The server found unreachable: the copies under way each failed alike; one line
        // for them (the first named), as `ls` or `scrub` would say it once.
        let mut unreachable = 0usize;
        for (name, e) in report.failed() {
            match e {
                bs_blob::BlobError::AlreadyExists(m) => {
                    say(format!("FAILED {name}: already exists{}", commands::in_the_way(m)))
                }
                e if e.is_unreachable() && report.gave_up.is_some() => {
                    if unreachable == 0 {
                        say(format!("FAILED {name}: {e}"));
                    }
                    unreachable += 1;
                }
                e => say(format!("FAILED {name}: {e}")),
            }
        }
        if unreachable > 1 {
            say(format!("FAILED {} more copies under way: the same", unreachable - 1));
        }
        for (name, e) in &extra.not_deleted {
            say(format!("FAILED {name}: {e}"));
        }
        if !g.quiet {
            for name in &extra.deleted {
                say(format!("deleted {name}"));
            }
        }
        if !g.quiet || failed > 0 || extra.interrupted {
            let counts = (problems.len(), not_planned);
            eprintln!("{what}: {}", summary_line(&report, counts, extra));
        }
    }
    if extra.interrupted {
        let again = "run the same command again to copy the rest";
        let msg = match (report.not_started(), failed) {
            (0, 0) => format!("{what}: interrupted after every copy had started; {again}"),
            (n, 0) => format!("{what}: interrupted: {n} not started; {again}"),
            (n, f) => format!("{what}: interrupted: {n} not started, {f} failed; {again}"),
        };
        return Err(commands::Interrupted(msg).into());
    }
    if let Some(why) = &report.gave_up {
        let n = report.not_started();
        bail!(
            "{what}: stopped, the server could not be reached ({why}): {n} not started, \
             {failed} failed; run the same command again once it is back"
        );
    }
    if failed > 0 {
        let all = report.outcomes.len() + not_planned + extra.not_deleted.len();
        let named = if many.json { "each in the JSON summary" } else { "each named above" };
        // Running again finishes copies that failed on the way (a server gone, a connection
        // lost); it does not mend a name that is not valid, a file that cannot be read, or a
        // blob its source holds corrupt.
        // Nor a blob in the way: --overwrite replaces it.
        let corrupt = report.failed().filter(|(_, e)| e.is_corrupt_at_source()).count();
        let exist = report
            .failed()
            .filter(|(_, e)| matches!(e, bs_blob::BlobError::AlreadyExists(_)))
            .count();
        let in_the_way = match exist {
            0 => String::new(),
            1 => "; 1 is in the way of a blob that exists (--overwrite replaces it)".into(),
            n => format!("; {n} are in the way of blobs that exist (--overwrite replaces them)"),
        };
        // Nor a local file that cannot be written as it is named (too long a name, a folder
        // in its place, no permission, no space).
        // What the plan could not make a job of is of this kind too (a name not valid, a
        // link or a file where a folder goes).
        let local = report.failed().filter(|(_, e)| e.is_local_fault()).count() + not_planned;
        let in_the_way = match local {
            0 => in_the_way,
            n => format!(
                "{in_the_way}; {n} cannot be copied here as named (a name not valid or too long, \
                 a file or link in the way, no permission or no space: running again meets the \
                 same)"
            ),
        };
        let again = match report.failed().count() + not_planned {
            0 => String::new(),
            n if n == corrupt + exist + local => {
                format!("{}{in_the_way}", corrupt_at_source(corrupt))
            }
            _ if corrupt + exist + local > 0 => format!(
                "; run it again to finish the others{}{in_the_way}",
                corrupt_at_source(corrupt)
            ),
            _ => "; run it again to finish".into(),
        };
        bail!("{what}: {failed} of {all} failed ({named}){again}");
    }
    Ok(())
}

/// What to say of `n` failures whose source holds the blob corrupt.
fn corrupt_at_source(n: usize) -> String {
    if n == 0 {
        return String::new();
    }
    let (them, are) = if n == 1 { ("it", "is") } else { ("them", "are") };
    format!(
        "; {n} {are} corrupt where {} held (running again will not mend {them}: put {them} \
         again from a good copy with --overwrite; `blobstream scrub` lists every corrupt blob \
         of a server)",
        if n == 1 { "it is" } else { "they are" }
    )
}

/// The summary: every file the plan met (copied, already there, skipped, failed, not started
/// add up to it), then deletions. `(problems, not_planned)`: what the plan could not make a
/// job of, and how many of those failed (the others were skipped).
fn summary_line(r: &BatchReport, (problems, not_planned): (usize, usize), extra: &Extra) -> String {
    let secs = r.elapsed.as_secs_f64();
    let not_deleted = extra.not_deleted.len();
    let skipped = problems - not_planned;
    let mut line = format!(
        "{} files, {} in {secs:.2} s ({}/s moved): {} copied, {} already there, {skipped} \
         skipped",
        r.outcomes.len() + problems,
        human(r.total_bytes()),
        human((r.bytes as f64 / secs.max(1e-9)) as u64),
        r.copied(),
        r.already_there(),
    );
    if extra.excluded > 0 {
        line += &format!(", {} excluded", extra.excluded);
    }
    line += &format!(", {} failed", r.failed().count() + not_planned);
    if extra.delete_asked {
        line += &format!(", {} deleted", extra.deleted.len());
    }
    if not_deleted > 0 {
        line += &format!(", {not_deleted} could not be deleted");
    }
    if extra.interrupted {
        line += &format!(", {} not started (interrupted)", r.not_started());
    } else if r.gave_up.is_some() {
        line += &format!(", {} not started (the server could not be reached)", r.not_started());
    }
    if extra.delete_skipped {
        line += ", --delete skipped (interrupted)";
    }
    line
}

fn summary_json(r: &BatchReport, problems: &[Problem], extra: &Extra) -> serde_json::Value {
    // `name` as the text says it (a local path for what the plan met, else the job's name);
    // `blob` the blob's name wherever one is known, so a script can match either way.
    let mut failed: Vec<_> = problems
        .iter()
        .filter(|p| p.failed)
        .map(|p| serde_json::json!({ "name": p.what, "blob": p.name, "error": p.reason }))
        .collect();
    failed.extend(
        r.failed()
            .map(|(n, e)| serde_json::json!({ "name": n, "blob": n, "error": e.to_string() })),
    );
    failed.extend(
        extra.not_deleted.iter().map(|(n, e)| serde_json::json!({ "name": n, "error": e })),
    );
    let skipped: Vec<_> = problems
        .iter()
        .filter(|p| !p.failed)
        .map(|p| serde_json::json!({ "name": p.what, "blob": p.name, "reason": p.reason }))
        .collect();
    let secs = r.elapsed.as_secs_f64();
    serde_json::json!({
        "files": r.outcomes.len() + problems.len(),
        "copied": r.copied(),
        "already_there": r.already_there(),
        "skipped": skipped,
        "excluded": extra.excluded,
        "deleted": extra.deleted,
        "failed": failed,
        "interrupted": extra.interrupted,
        "delete_skipped": extra.delete_skipped,
        "not_started": r.not_started(),
        "server_unreachable": r.gave_up,
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
