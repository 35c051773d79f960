//! Batch copies: a folder up to a prefix, a prefix down to a folder — N copies in flight, each
//! checked end to end like a single copy, one report at the end naming every failure.
//!
//! Planning ([`plan_upload`], [`plan_download`]) turns a folder or a listing into [`Job`]s and
//! reports what it cannot copy (unreadable files, names that are not valid blob names, blob
//! names that would escape the target folder) as [`Problem`]s; the rest goes ahead.
//! [`Transporter::copy_batch`] runs the jobs. A batch is idempotent and resumable as a whole:
//! run again, every blob already there with the same bytes is reported as such and skipped,
//! and an interrupted copy resumes where it stopped.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::BlobError;
use crate::factory::NewBlob;
use crate::key::{BlobKey, Location};
use crate::options::Options;
use crate::transporter::{Copied, CopyPath, Transporter};

/// One copy of a batch.
#[derive(Debug, Clone)]
pub struct Job {
    pub src: BlobKey,
    pub dst: BlobKey,
    /// Content type and metadata of the new blob (as for a single copy).
    pub spec: NewBlob,
    /// Bytes expected (for the batch's progress; the copy itself uses the source's size).
    pub size: u64,
    /// How the job is named in reports: the blob name.
    pub name: String,
}

/// Something a plan could not turn into a job, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub what: String,
    pub reason: String,
    /// A failure (the batch is incomplete), or only something skipped on purpose (a link to
    /// a folder, a device file).
    pub failed: bool,
    /// The blob name it stands for (prefix + relative path), when it is in the folder: what
    /// `sync --delete` keeps, with every name under it — a folder skipped is not a folder
    /// emptied.
    pub name: Option<String>,
}

impl Problem {
    /// Something the batch could not do (it is incomplete).
    pub fn failure(what: impl Into<String>, reason: impl ToString) -> Self {
        Self { what: what.into(), reason: reason.to_string(), failed: true, name: None }
    }

    fn skipped(what: impl Into<String>, reason: impl ToString) -> Self {
        Self { what: what.into(), reason: reason.to_string(), failed: false, name: None }
    }

    /// Standing for the blob (or folder of blobs) `name`.
    fn at(self, name: Option<String>) -> Self {
        Self { name, ..self }
    }

    /// Whether `blob` is the name this stands for or one under it.
    fn covers(&self, blob: &str) -> bool {
        self.name.as_deref().is_some_and(|n| {
            blob == n || blob.strip_prefix(n).is_some_and(|rest| rest.starts_with('/'))
        })
    }
}

/// How one job ended.
#[derive(Debug)]
pub struct Outcome {
    pub name: String,
    /// The job's bytes as planned (its source's size), whatever became of it.
    pub size: u64,
    pub result: Result<Copied, BlobError>,
}

/// What a batch did.
#[derive(Debug, Default)]
pub struct BatchReport {
    /// Every job, in the order given.
    pub outcomes: Vec<Outcome>,
    /// Bytes moved (not counting blobs already there or bytes kept from interrupted copies).
    pub bytes: u64,
    pub elapsed: Duration,
    /// Why the batch stopped starting jobs on its own: a copy found the server unreachable
    /// (every later one would fail alike); the jobs not started are "not started".
    pub gave_up: Option<String>,
}

impl BatchReport {
    /// Jobs that moved bytes.
    pub fn copied(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| matches!(&o.result, Ok(c) if c.path != CopyPath::AlreadyThere))
            .count()
    }

    /// Jobs whose destination already held the same bytes.
    pub fn already_there(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|o| matches!(&o.result, Ok(c) if c.path == CopyPath::AlreadyThere))
            .count()
    }

    /// Jobs that failed, with their errors (not those a stop kept from starting).
    pub fn failed(&self) -> impl Iterator<Item = (&str, &BlobError)> {
        self.outcomes.iter().filter_map(|o| match &o.result {
            Err(BlobError::NotStarted) | Ok(_) => None,
            Err(e) => Some((o.name.as_str(), e)),
        })
    }

    /// Jobs a stop kept from starting ([`crate::Options::stop`]), or the server found
    /// unreachable ([`BatchReport::gave_up`]).
    pub fn not_started(&self) -> usize {
        self.outcomes.iter().filter(|o| matches!(o.result, Err(BlobError::NotStarted))).count()
    }

    /// Bytes of every job of the batch as planned (copied, already there, failed or not
    /// started): the whole job's size, not what got done.
    pub fn total_bytes(&self) -> u64 {
        self.outcomes.iter().map(|o| o.size).sum()
    }
}

/// A batch's progress: jobs finished of all, bytes done of all.
#[derive(Debug, Clone, Copy)]
pub struct BatchProgress {
    pub jobs_done: usize,
    pub jobs: usize,
    pub bytes_done: u64,
    pub bytes: u64,
}

/// Which files of a folder (or blobs of a prefix) a batch takes, by glob on their path
/// relative to the folder or prefix: with `include` patterns, only those matching one; never
/// those matching an `exclude` pattern. A pattern without `/` is matched against the file
/// name alone (`*.dcm` anywhere); one with `/` against the whole relative path, where `*`
/// stays within a folder and `**` spans folders (`se1/*.dcm`, `**/scout/**`).
#[derive(Debug, Clone, Default)]
pub struct Selection {
    include: Option<Patterns>,
    exclude: Option<Patterns>,
}

#[derive(Debug, Clone)]
struct Patterns {
    names: globset::GlobSet,
    paths: globset::GlobSet,
}

impl Patterns {
    fn new(globs: &[String]) -> Result<Option<Self>, BlobError> {
        if globs.is_empty() {
            return Ok(None);
        }
        let (mut names, mut paths) =
            (globset::GlobSetBuilder::new(), globset::GlobSetBuilder::new());
        for g in globs {
            let glob =
                globset::GlobBuilder::new(g).literal_separator(true).build().map_err(|e| {
                    BlobError::InvalidKey { key: g.clone(), reason: e.kind().to_string() }
                })?;
            if g.contains('/') {
                paths.add(glob)
            } else {
                names.add(glob)
            };
        }
        let built = |b: globset::GlobSetBuilder| {
            b.build()
                .map_err(|e| BlobError::InvalidKey { key: globs.join(" "), reason: e.to_string() })
        };
        Ok(Some(Self { names: built(names)?, paths: built(paths)? }))
    }

    fn matches(&self, rel: &str) -> bool {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        self.names.is_match(name) || self.paths.is_match(rel)
    }
}

impl Selection {
    /// Everything (no patterns).
    pub fn all() -> Self {
        Self::default()
    }

    /// From `--include` and `--exclude` patterns; a malformed pattern is an error naming it.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self, BlobError> {
        Ok(Self { include: Patterns::new(include)?, exclude: Patterns::new(exclude)? })
    }

    /// Whether the file or blob at `rel` (relative to the folder or prefix) is taken.
    pub fn takes(&self, rel: &str) -> bool {
        self.include.as_ref().is_none_or(|p| p.matches(rel))
            && !self.exclude.as_ref().is_some_and(|p| p.matches(rel))
    }

    /// Keep the jobs (named `prefix` + relative path) this selection takes; returns how many
    /// were left out.
    pub fn apply(&self, jobs: &mut Vec<Job>, prefix: &str) -> usize {
        let prefix = folder_prefix(prefix);
        let before = jobs.len();
        jobs.retain(|j| self.takes(j.name.strip_prefix(&prefix).unwrap_or(&j.name)));
        before - jobs.len()
    }
}

/// What `sync --delete` removes from the destination: the names (`prefix` + relative path)
/// of `present` the selection takes that no job of `copied` will write and no problem
/// stands for (a folder or file skipped — a link not followed, a device — keeps its blobs).
/// Nothing when the source could not be read in full (a failed problem: a folder that
/// failed to list must not look like a folder that is empty) or holds nothing at all (a
/// mistyped source must not empty the destination).
pub fn plan_delete<'a>(
    present: impl IntoIterator<Item = &'a str>,
    copied: &[Job],
    problems: &[Problem],
    prefix: &str,
    selection: &Selection,
) -> Result<Vec<String>, String> {
    if let Some(p) = problems.iter().find(|p| p.failed) {
        return Err(format!("not everything could be read or planned ({}: {})", p.what, p.reason));
    }
    if copied.is_empty() {
        return Err("the source holds nothing to copy; empty the destination with rm".into());
    }
    let prefix = folder_prefix(prefix);
    let wanted: std::collections::HashSet<&str> = copied.iter().map(|j| j.name.as_str()).collect();
    Ok(present
        .into_iter()
        .filter(|n| !wanted.contains(n))
        .filter(|n| !problems.iter().any(|p| p.covers(n)))
        .filter(|n| n.strip_prefix(&prefix).is_some_and(|rel| selection.takes(rel)))
        .map(str::to_string)
        .collect())
}

/// The prefix as a folder: empty, or ending in one `/`.
pub fn folder_prefix(prefix: &str) -> String {
    let p = prefix.trim_end_matches('/');
    if p.is_empty() { String::new() } else { format!("{p}/") }
}

/// Jobs putting every file under `dir` on `server` as `prefix` + its path relative to `dir`
/// (`/`-separated). Symbolic links to files in the folder are followed; links to files
/// outside it are not (a link must not send a file from elsewhere — `~/.ssh/id_rsa` — to a
/// server), nor links to folders (a link loop cannot trap the walk); both are reported.
pub fn plan_upload(dir: &Path, server: &str, prefix: &str) -> (Vec<Job>, Vec<Problem>) {
    let prefix = folder_prefix(prefix);
    let (mut jobs, mut problems) = (Vec::new(), Vec::new());
    // Where the folder really is, for telling where links lead.
    let real_dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let blob_name = |path: &Path| {
        path.strip_prefix(dir).ok().and_then(Path::to_str).map(|rel| format!("{prefix}{rel}"))
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) => {
                problems.push(Problem::failure(d.display().to_string(), e));
                continue;
            }
        };
        let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        entries.sort();
        for path in entries {
            let what = path.display().to_string();
            let name = blob_name(&path);
            let link = path.symlink_metadata().map(|m| m.file_type().is_symlink());
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                // (The error alone, "No such file or directory", names a file that is there.)
                Err(e) if matches!(link, Ok(true)) && e.kind() == std::io::ErrorKind::NotFound => {
                    let to = std::fs::read_link(&path).map(|t| t.display().to_string());
                    let to = to.unwrap_or_default();
                    let why = format!("a link to nothing ({to} does not exist)");
                    problems.push(Problem::failure(what, why).at(name));
                    continue;
                }
                Err(e) => {
                    problems.push(Problem::failure(what, e).at(name));
                    continue;
                }
            };
            let skip = |why: &str| Problem::skipped(what.clone(), why).at(name.clone());
            if meta.is_dir() {
                if matches!(link, Ok(true)) {
                    problems.push(skip("a link to a folder (not followed)"));
                } else {
                    stack.push(path);
                }
                continue;
            }
            if !meta.is_file() {
                problems.push(skip("not a regular file"));
                continue;
            }
            if matches!(link, Ok(true))
                && !std::fs::canonicalize(&path).is_ok_and(|real| real.starts_with(&real_dir))
            {
                problems.push(skip("a link to a file outside the folder (not followed)"));
                continue;
            }
            if crate::proxy::is_progress_file(&path) {
                problems.push(skip("a download in progress (blobstream's own)"));
                continue;
            }
            let rel = path.strip_prefix(dir).expect("walked from dir");
            let Some(rel) = rel.to_str() else {
                problems.push(Problem::failure(what, "the file name is not UTF-8"));
                continue;
            };
            let name = format!("{prefix}{rel}");
            if let Err(e) = bs_store::validate_name(&name) {
                problems.push(Problem::failure(what, e));
                continue;
            }
            let spec = NewBlob {
                content_type: bs_store::guess_content_type(&name).to_string(),
                ..NewBlob::default()
            };
            jobs.push(Job {
                src: BlobKey::file(&path),
                dst: BlobKey::remote(server, &name),
                spec,
                size: meta.len(),
                name,
            });
        }
    }
    jobs.sort_by(|a, b| a.name.cmp(&b.name));
    (jobs, problems)
}

/// Jobs getting `blobs` (name, size) — a listing of `prefix` on `server` — into `dir`, each
/// at its name relative to `prefix`. A name that would land outside `dir` is a problem, not
/// a job.
pub fn plan_download(
    blobs: impl IntoIterator<Item = (String, u64)>,
    server: &str,
    prefix: &str,
    dir: &Path,
) -> (Vec<Job>, Vec<Problem>) {
    let prefix = folder_prefix(prefix);
    let (mut jobs, mut problems) = (Vec::new(), Vec::new());
    for (name, size) in blobs {
        let Some(rel) = name.strip_prefix(&prefix) else {
            problems.push(Problem::failure(name, format!("not under the prefix {prefix:?}")));
            continue;
        };
        match local_path(dir, rel) {
            // The names of blobstream's own files beside a download in progress: a blob so
            // named would be mistaken for (or overwrite) another download's progress.
            Some(path) if crate::proxy::is_progress_file(&path) => problems.push(Problem::failure(
                name,
                "its name is one blobstream gives a download in progress; get it on its own \
                 under another name",
            )),
            Some(path) => jobs.push(Job {
                src: BlobKey::remote(server, &name),
                dst: BlobKey::file(path),
                spec: NewBlob::default(),
                size,
                name,
            }),
            None => problems.push(Problem::failure(name, "its name would leave the target folder")),
        }
    }
    (jobs, problems)
}

/// `dir` joined with the `/`-separated `rel`, if every part of `rel` is a plain name (no
/// root, no `..`, no `.`, nothing empty) — a blob named `a/../../etc/x` never becomes a path.
fn local_path(dir: &Path, rel: &str) -> Option<PathBuf> {
    if rel.is_empty() || rel.contains('\\') || rel.contains('\0') {
        return None;
    }
    let mut p = dir.to_path_buf();
    for seg in rel.split('/') {
        let mut c = Path::new(seg).components();
        match (c.next(), c.next()) {
            (Some(Component::Normal(s)), None) if s == seg => p.push(s),
            _ => return None,
        }
    }
    Some(p)
}

impl Transporter {
    /// Run `jobs` with at most `in_flight` copies at once (at least one), each as
    /// [`Transporter::copy_as`] runs it with `opts` (resume, overwrite, timeout per copy;
    /// the batch itself runs in the caller's thread). A local destination that holds other
    /// bytes is replaced, as `cp -r` does; a blob only with `opts.overwrite`. One failure
    /// does not stop the others. `progress` is called as jobs advance.
    pub fn copy_batch(
        &self,
        jobs: Vec<Job>,
        in_flight: usize,
        opts: &Options,
        progress: impl Fn(BatchProgress) + Send + Sync,
    ) -> BatchReport {
        let started = Instant::now();
        let total = BatchProgress {
            jobs_done: 0,
            jobs: jobs.len(),
            bytes_done: 0,
            bytes: jobs.iter().map(|j| j.size).sum(),
        };
        let (done_jobs, done_bytes) = (AtomicUsize::new(0), Arc::new(AtomicU64::new(0)));
        let gave_up = std::sync::OnceLock::new();
        let results: Mutex<Vec<Option<Result<Copied, BlobError>>>> =
            Mutex::new((0..jobs.len()).map(|_| None).collect());
        let report = |jobs_done, bytes_done| {
            progress(BatchProgress { jobs_done, bytes_done, ..total });
        };
        // A job ends: its outcome, and the rest of its bytes counted as done (a blob already
        // there moves none; `seen` is what its progress reported).
        let finish = |i: usize, r: Result<Copied, BlobError>, seen: u64| {
            let rest = jobs[i].size.saturating_sub(seen);
            // Reported under the lock, so the counts a caller sees never go backwards.
            let mut all = results.lock().unwrap();
            if let Err(e) = &r
                && e.is_unreachable()
            {
                let _ = gave_up.set(format!("{}: {e}", jobs[i].name));
            }
            all[i] = Some(r);
            let bytes = done_bytes.fetch_add(rest, Ordering::Relaxed) + rest;
            report(done_jobs.fetch_add(1, Ordering::Relaxed) + 1, bytes);
        };
        let single = |i: usize| {
            let job = &jobs[i];
            // This job's share of the batch's bytes, as its copy reports them.
            let seen = Arc::new(AtomicU64::new(0));
            let (all, mine) = (done_bytes.clone(), seen.clone());
            // A local file holding other bytes is replaced, as `cp -r` does.
            let local = *job.dst.location() == Location::File;
            let job_opts = Options {
                mode: crate::options::Mode::Blocking,
                on_complete: None,
                if_different: opts.if_different || local,
                ..opts.clone()
            }
            .progress(move |done, _| {
                let before = mine.swap(done, Ordering::Relaxed);
                all.fetch_add(done.saturating_sub(before), Ordering::Relaxed);
            });
            let r = self.copy_as(&job.src, &job.dst, &job.spec, &job_opts).wait();
            finish(i, r, seen.load(Ordering::Relaxed));
        };
        // Small downloads from one server go in runs, their requests sent ahead.
        let units = crate::pulls::units(&jobs, in_flight, opts);
        let next = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..in_flight.clamp(1, units.len().max(1)) {
                s.spawn(|| {
                    loop {
                        // Asked to stop, or the server is gone: nothing more starts (what
                        // runs finishes).
                        if opts.stopped() || gave_up.get().is_some() {
                            return;
                        }
                        let Some(unit) = units.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            return;
                        };
                        if unit.len() == 1 {
                            single(unit.start);
                            continue;
                        }
                        let run = &jobs[unit.clone()];
                        self.pull_run(
                            run,
                            opts,
                            |k| single(unit.start + k),
                            |k, r| finish(unit.start + k, r, 0),
                        );
                    }
                });
            }
        });
        // Jobs of units no worker took were kept from starting by a stop; any other job
        // without a result was lost (a worker that died, a run given up).
        let taken = next.into_inner().min(units.len());
        let mut not_started = vec![false; jobs.len()];
        for unit in &units[taken..] {
            not_started[unit.clone()].fill(true);
        }
        let outcomes: Vec<Outcome> = jobs
            .into_iter()
            .zip(results.into_inner().unwrap())
            .zip(not_started)
            .map(|((j, r), kept)| {
                let never = if kept { BlobError::NotStarted } else { BlobError::Lost };
                Outcome { name: j.name, size: j.size, result: r.unwrap_or(Err(never)) }
            })
            .collect();
        let bytes = outcomes.iter().filter_map(|o| o.result.as_ref().ok()).map(|c| c.bytes).sum();
        BatchReport { outcomes, bytes, elapsed: started.elapsed(), gave_up: gave_up.into_inner() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job putting the local file `n` as the blob `n`.
    fn job(n: &str) -> Job {
        Job {
            src: BlobKey::file(n),
            dst: BlobKey::remote("h:1", n),
            spec: NewBlob::default(),
            size: 0,
            name: n.to_string(),
        }
    }

    #[test]
    fn globs_without_a_slash_match_file_names_and_with_one_whole_paths() {
        let s = |inc: &[&str], exc: &[&str]| {
            let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
            Selection::new(&v(inc), &v(exc)).unwrap()
        };
        let dcm = s(&["*.dcm"], &[]);
        assert!(dcm.takes("a.dcm") && dcm.takes("se1/deep/b.dcm"));
        assert!(!dcm.takes("notes.txt") && !dcm.takes("x.dcm/readme"));
        let se1 = s(&["se1/*.dcm"], &[]);
        assert!(se1.takes("se1/a.dcm") && !se1.takes("se1/sub/a.dcm") && !se1.takes("se2/a.dcm"));
        let deep = s(&[], &["**/scout/**", "*.tmp"]);
        assert!(!deep.takes("se1/scout/1.dcm") && !deep.takes("scout/1.dcm"));
        assert!(!deep.takes("a/b.tmp") && deep.takes("se1/1.dcm"));
        assert!(Selection::all().takes("anything/at/all"));
        let both = s(&["*.dcm"], &["bad*"]);
        assert!(both.takes("ok.dcm") && !both.takes("bad.dcm") && !both.takes("ok.txt"));
        let e = Selection::new(&["a[".to_string()], &[]).unwrap_err();
        assert!(e.to_string().contains("a["), "{e}");
    }

    #[test]
    fn delete_takes_only_what_the_source_lacks_and_nothing_after_a_failed_read() {
        let copied = [job("p/a"), job("p/b")];
        let present = ["p/a", "p/old", "p/keep.txt", "p/b"];
        let sel = Selection::new(&[], &["*.txt".to_string()]).unwrap();
        let gone = plan_delete(present, &copied, &[], "p", &sel).unwrap();
        assert_eq!(gone, ["p/old"]);
        let skipped = [Problem::skipped("link", "a link to a folder (not followed)")];
        assert_eq!(plan_delete(present, &copied, &skipped, "p/", &sel).unwrap(), ["p/old"]);
        let failed = [Problem::failure("p/sub", "permission denied")];
        let e = plan_delete(present, &copied, &failed, "p/", &sel).unwrap_err();
        assert!(e.contains("permission denied"), "{e}");
        let e = plan_delete(present, &[], &[], "p/", &sel).unwrap_err();
        assert!(e.contains("nothing to copy"), "{e}");
    }

    /// A batch asked to stop before it starts starts nothing: every job is "not started",
    /// none is a failure (no server is even asked: `h:1` does not exist).
    #[test]
    fn a_stopped_batch_starts_nothing_and_fails_nothing() {
        let t = Transporter::new(crate::Factory::new());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let opts = Options::blocking().stop_when(stop);
        let r = t.copy_batch(vec![job("p/a"), job("p/b"), job("p/c")], 2, &opts, |_| {});
        assert_eq!((r.not_started(), r.failed().count(), r.copied()), (3, 0, 0));
        assert!(r.outcomes.iter().all(|o| matches!(o.result, Err(BlobError::NotStarted))));
    }

    #[test]
    fn blob_names_never_leave_the_target_folder() {
        let d = Path::new("/tmp/out");
        assert_eq!(local_path(d, "a/b.dcm"), Some(PathBuf::from("/tmp/out/a/b.dcm")));
        for bad in ["", "../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", ".", "a\\b", "a/"] {
            assert_eq!(local_path(d, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_listing_becomes_jobs_under_the_folder_and_tricks_become_problems() {
        let blobs = [("s/ct/1.dcm".to_string(), 5), ("s/ct/../../../etc/x".to_string(), 1)];
        let (jobs, problems) = plan_download(blobs, "h:1", "s/ct", Path::new("out"));
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].dst, BlobKey::file("out/1.dcm"));
        assert_eq!(jobs[0].src, BlobKey::remote("h:1", "s/ct/1.dcm"));
        assert_eq!(problems.len(), 1);
        assert!(problems[0].reason.contains("leave the target folder"));
    }

    #[test]
    fn a_folder_becomes_jobs_named_by_relative_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("se1")).unwrap();
        std::fs::write(dir.path().join("se1/i1.dcm"), b"abc").unwrap();
        std::fs::write(dir.path().join("top.png"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("se1/loop")).unwrap();
        // What an interrupted get -r leaves: skipped, never uploaded as blobs.
        std::fs::write(dir.path().join("se1/i2.dcm.blobstream-part"), b"ab").unwrap();
        std::fs::write(dir.path().join("big.raw.blobstream-ranges"), b"r").unwrap();
        std::fs::write(dir.path().join("big.raw.blobstream-ranges.tmp"), b"r").unwrap();
        // A link to a file in the folder is followed; one to a file elsewhere is not.
        std::os::unix::fs::symlink(dir.path().join("top.png"), dir.path().join("alias.png"))
            .unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("id_rsa"), b"secret").unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("id_rsa"), dir.path().join("leak"))
            .unwrap();
        let (jobs, problems) = plan_upload(dir.path(), "h:1", "studies/ct-1/");
        let names: Vec<_> = jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(
            names,
            ["studies/ct-1/alias.png", "studies/ct-1/se1/i1.dcm", "studies/ct-1/top.png"]
        );
        assert_eq!(jobs[1].size, 3);
        assert_eq!(jobs[2].spec.content_type, "image/png");
        let mut reasons: Vec<_> =
            problems.iter().map(|p| (p.reason.as_str(), p.name.as_deref().unwrap())).collect();
        reasons.sort();
        assert_eq!(
            reasons,
            [
                (
                    "a download in progress (blobstream's own)",
                    "studies/ct-1/big.raw.blobstream-ranges"
                ),
                (
                    "a download in progress (blobstream's own)",
                    "studies/ct-1/big.raw.blobstream-ranges.tmp"
                ),
                (
                    "a download in progress (blobstream's own)",
                    "studies/ct-1/se1/i2.dcm.blobstream-part"
                ),
                ("a link to a file outside the folder (not followed)", "studies/ct-1/leak"),
                ("a link to a folder (not followed)", "studies/ct-1/se1/loop"),
            ]
        );
        assert!(problems.iter().all(|p| !p.failed), "skipped, not failed");
    }

    #[test]
    fn delete_keeps_the_blobs_of_whatever_the_walk_skipped() {
        let copied = [job("p/a")];
        // A folder moved elsewhere and linked back, a FIFO where a blob's file was.
        let skipped = [
            Problem::skipped("study/se2", "a link to a folder (not followed)")
                .at(Some("p/se2".into())),
            Problem::skipped("study/pipe", "not a regular file").at(Some("p/pipe".into())),
        ];
        let present = ["p/a", "p/se2/c.dcm", "p/se2/d/e.dcm", "p/se20", "p/pipe", "p/old"];
        let gone = plan_delete(present, &copied, &skipped, "p", &Selection::all()).unwrap();
        assert_eq!(gone, ["p/se20", "p/old"]);
    }

    #[test]
    fn blobs_named_like_a_download_in_progress_are_not_downloaded() {
        let blobs = [
            ("p/x".to_string(), 1),
            ("p/x.blobstream-part".to_string(), 1),
            ("p/y.blobstream-ranges".to_string(), 1),
            ("p/y.blobstream-ranges.tmp".to_string(), 1),
        ];
        let (jobs, problems) = plan_download(blobs, "h:1", "p", Path::new("/tmp/out"));
        assert_eq!(jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>(), ["p/x"]);
        assert_eq!(problems.len(), 3);
        assert!(problems.iter().all(|p| p.failed && p.reason.contains("download in progress")));
    }
}
