//! Small downloads of a batch pulled ahead: a run of up to [`RUN`] small blobs from one server
//! going to new local files asks for all of them on one kept-alive data connection before it
//! reads the first answer ([`bs_client::Client::pull_each`]), so a folder of small files costs
//! about one round trip per run instead of one per file — what counts on a far-away link.
//!
//! Every blob is verified end to end as any pull is (its digest against the server's), then
//! written as any download is: into its part file, synced, and renamed over the destination.
//! A destination that exists already, or the part file of an interrupted download, goes the
//! usual way (compared, resumed); so does everything when the server cannot take requests
//! ahead (`pull_each` falls back by itself).

use std::ops::Range;

use crate::batch::Job;
use crate::error::BlobError;
use crate::factory::NewBlob;
use crate::key::Location;
use crate::options::Options;
use crate::transporter::{Copied, CopyPath, IO_WAIT, Transporter};

type Result<T> = std::result::Result<T, BlobError>;

/// Largest blob pulled ahead (each is held whole in memory until written).
pub const PULL_AHEAD_UP_TO: u64 = 1 << 20;

/// Most downloads in one run (the requests `pull_each` keeps ahead of their answers).
pub const RUN: usize = 16;

/// The server `job` may be pulled ahead from: a remote blob listed as small, going to a
/// local file.
fn server_of(job: &Job) -> Option<&str> {
    match (job.src.location(), job.dst.location()) {
        (Location::Remote(server), Location::File) if job.size <= PULL_AHEAD_UP_TO => Some(server),
        _ => None,
    }
}

/// `jobs` cut into the units a batch hands to its `workers`: runs of consecutive jobs that
/// may be pulled ahead from the same server, and every other job alone. Runs are at most
/// [`RUN`] long, and short enough that every worker gets one (a few runs of many files would
/// leave workers idle). With a timeout per copy (`opts.timeout`) every job is alone: a run
/// has no per-copy clock.
pub(crate) fn units(jobs: &[Job], workers: usize, opts: &Options) -> Vec<Range<usize>> {
    let run = if opts.timeout.is_some() { 1 } else { jobs.len().div_ceil(workers.max(1)) };
    let run = run.clamp(1, RUN);
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let joins = server_of(job).is_some_and(|s| {
            out.last().is_some_and(|last| {
                last.end == i
                    && last.len() < run
                    && server_of(&jobs[last.start]).is_some_and(|first| first == s)
            })
        });
        match out.last_mut() {
            Some(last) if joins => last.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

impl Transporter {
    /// Run `jobs`, a unit of [`units`] longer than one: those whose destination and part file
    /// do not exist are pulled ahead, the others handed to `usual` (by index in `jobs`);
    /// `done` gets each pulled job's outcome.
    pub(crate) fn pull_run(
        &self,
        jobs: &[Job],
        opts: &Options,
        usual: impl Fn(usize),
        mut done: impl FnMut(usize, Result<Copied>),
    ) {
        let fresh = |j: &Job| {
            j.dst.path().is_some_and(|p| {
                // With resume on, an interrupted download's part file is built on.
                let resumable = opts.resume && crate::proxy::part_path(&p).exists();
                !(p.exists() || resumable)
            })
        };
        let (ahead, rest): (Vec<usize>, Vec<usize>) =
            (0..jobs.len()).partition(|&k| fresh(&jobs[k]));
        for k in rest {
            usual(k);
        }
        let Some(server) = ahead.first().and_then(|&k| server_of(&jobs[k])) else { return };
        let client = match self.factory().client(server) {
            Ok(c) => c.within(IO_WAIT),
            // The usual way names the error for each of them.
            Err(_) => return ahead.into_iter().for_each(usual),
        };
        let names: Vec<&str> = ahead.iter().map(|&k| jobs[k].src.name()).collect();
        client.pull_each_up_to(&names, PULL_AHEAD_UP_TO, |i, pulled| {
            let job = &jobs[ahead[i]];
            let r = match pulled {
                // Grown since the listing: streamed to its file the usual way.
                Err(bs_client::ClientError::TooLarge { .. }) => return usual(ahead[i]),
                Err(e) => Err(BlobError::from(e)),
                Ok(bytes) => self.write_new_file(job, &bytes),
            };
            done(ahead[i], r);
        });
    }

    /// Write `bytes` (a verified pull) as `job`'s local file, as a download writes one.
    fn write_new_file(&self, job: &Job, bytes: &[u8]) -> Result<Copied> {
        let size = bytes.len() as u64;
        let spec = NewBlob { size: Some(size), overwrite: true, ..NewBlob::default() };
        let mut out = self.factory().route(&job.dst, &spec)?;
        let written = out.write(bytes).and_then(|()| out.close());
        if written.is_err() {
            let _ = self.factory().discard(&job.dst);
        }
        written.map(|()| Copied { bytes: size, resumed_from: 0, path: CopyPath::PulledAhead })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::BlobKey;

    fn job(server: &str, name: &str, size: u64) -> Job {
        Job {
            src: BlobKey::remote(server, name),
            dst: BlobKey::file(std::path::PathBuf::from(format!("/tmp/x/{name}"))),
            spec: NewBlob::default(),
            size,
            name: name.into(),
        }
    }

    #[test]
    fn runs_join_small_downloads_from_one_server_up_to_sixteen() {
        let o = Options::blocking();
        let mut jobs: Vec<Job> = (0..20).map(|i| job("a:1", &format!("s{i}"), 1000)).collect();
        jobs.insert(5, job("a:1", "big", PULL_AHEAD_UP_TO + 1));
        jobs.push(job("b:1", "other", 10));
        jobs.push(job("b:1", "other2", 10));
        let mut up = job("a:1", "up", 10);
        std::mem::swap(&mut up.src, &mut up.dst);
        jobs.push(up);
        assert_eq!(units(&jobs, 1, &o), vec![0..5, 5..6, 6..21, 21..23, 23..24]);
        let more: Vec<Job> = (0..40).map(|i| job("a:1", &format!("m{i}"), 1)).collect();
        assert_eq!(units(&more, 1, &o), vec![0..16, 16..32, 32..40]);
        // Eight workers: runs of five, so that each gets one.
        let runs = units(&more, 8, &o);
        assert_eq!((runs.len(), runs[0].clone()), (8, 0..5));
        assert_eq!(units(&more[..3], 8, &o), vec![0..1, 1..2, 2..3]);
        assert!(units(&[], 8, &o).is_empty());
        // A timeout per copy: every job alone.
        let timed = Options::blocking().timeout(std::time::Duration::from_secs(5));
        assert_eq!(units(&more[..3], 1, &timed), vec![0..1, 1..2, 2..3]);
    }
}
