//! `blobstream bench transfer`: every path, mode, size and socket buffer of the plan, each
//! path's servers started once and reused.

use crate::error::BenchError;
use crate::machine::machine_description;
use crate::measure::{PathRunner, measure_interleaved};
use crate::model::{Mode, Path};
use crate::options::BenchOptions;
use crate::paths::{BlobstreamRunner, GrpcRunner, Iperf3Runner, RawTcpRunner};
use crate::payload::{MB, payload};
use crate::report::{TransferReport, size_text};

/// The socket buffer size tried besides the kernel default.
pub const CHOSEN_SOCKET_BUFFER: u32 = 4 << 20;

/// What a run measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferPlan {
    /// Blob sizes in bytes.
    pub sizes: Vec<u64>,
    /// Socket buffer sizes; 0 = kernel default.
    pub buffers: Vec<u32>,
    /// Timed runs per measurement (blobs of up to 8 MB get `small_runs`, of 256 MB and more
    /// `large_runs`).
    pub runs: u32,
    pub large_runs: u32,
    /// A transfer of a few MB takes a millisecond or so, where one descheduling of either
    /// end on a shared machine moves a run by half: many runs cost little and steady the
    /// median.
    pub small_runs: u32,
}

impl TransferPlan {
    pub fn new(quick: bool) -> Self {
        if quick {
            Self {
                sizes: vec![MB, 32 * MB],
                buffers: vec![0],
                runs: 3,
                large_runs: 3,
                small_runs: 11,
            }
        } else {
            Self {
                sizes: vec![MB, 8 * MB, 32 * MB, 256 * MB],
                buffers: vec![0, CHOSEN_SOCKET_BUFFER],
                runs: 21,
                large_runs: 15,
                small_runs: 41,
            }
        }
    }

    /// Transfers a run of blobs of `size` bytes makes on each path: 16 of 1 MB (a run of
    /// about as many bytes as one of 16 MB), one of anything larger.
    pub fn per_run(&self, size: u64) -> u32 {
        if size <= MB { 16 } else { 1 }
    }

    /// Timed runs for blobs of `size` bytes.
    pub fn runs_for(&self, size: u64) -> u32 {
        match size {
            s if s <= 8 * MB => self.small_runs,
            s if s >= 256 * MB => self.large_runs,
            _ => self.runs,
        }
    }
}

/// Run the transfer benchmark (the Blob Streaming paper's request/response test) with every
/// server in this process on 127.0.0.1. Quick: fewer sizes, only the default socket buffer,
/// fewer runs (well under a minute).
pub fn run_transfer(opts: &BenchOptions) -> Result<TransferReport, BenchError> {
    let plan = TransferPlan::new(opts.quick);
    let say = |line: &str| opts.say(line);
    let mut notes = Vec::new();
    if cfg!(debug_assertions) {
        notes.push("debug build: numbers are not representative; build with --release".into());
    }
    notes.push(
        "every path receives into memory allocated alike (bs_wire::alloc::zeroed: fresh zeroed \
         pages, transparent huge pages from 4 MiB), as the memory store allocates uploads; the \
         blobstream server runs on the memory store, so these figures measure the transport, \
         not a disk"
            .into(),
    );
    let mut runners: Vec<Box<dyn PathRunner>> = vec![
        Box::new(BlobstreamRunner::start()?),
        Box::new(RawTcpRunner::new()),
        Box::new(GrpcRunner::start()?),
    ];
    match Iperf3Runner::start() {
        Ok(Some(r)) => {
            runners.push(Box::new(r));
            notes.push(
                "iperf3: its own receiver-side rate (data phase only, no connection set-up), \
                 sizes ≥ 8 MB only"
                    .into(),
            );
        }
        Ok(None) => {
            notes.push("iperf3 not installed; install it with scripts/bench-setup.sh".into())
        }
        Err(e) => notes.push(format!("iperf3 skipped: {e}")),
    }

    let mut results = Vec::new();
    for &size in &plan.sizes {
        let data = payload(size);
        let (runs, per_run) = (plan.runs_for(size), plan.per_run(size));
        for &buffer in &plan.buffers {
            for mode in Mode::ALL {
                let buf = if buffer == 0 { "default".into() } else { size_text(buffer.into()) };
                let mut active: Vec<&mut dyn PathRunner> = runners
                    .iter_mut()
                    .filter(|r| r.measures(size))
                    .map(|r| &mut **r as &mut dyn PathRunner)
                    .collect();
                let paths: Vec<Path> = active.iter().map(|r| r.path()).collect();
                let names: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
                let each =
                    if per_run > 1 { format!(" ({per_run} transfers each)") } else { "".into() };
                say(&format!(
                    "{mode} {}, socket buffer {buf}: {runs} runs{each} each of {}, interleaved",
                    size_text(size),
                    names.join(", ")
                ));
                let mut failed = None;
                let measured = measure_interleaved(&mut active, mode, &data, buffer, runs, per_run);
                for (path, m) in paths.into_iter().zip(measured) {
                    match m {
                        Ok(m) => results.push(m),
                        // An outside tool failing does not void the benchmark.
                        Err(e) if path == Path::Iperf3 => {
                            notes.push(format!("iperf3 failed and was skipped from then on: {e}"));
                            failed = Some(Path::Iperf3);
                        }
                        Err(e) => return Err(e),
                    }
                }
                if let Some(p) = failed {
                    runners.retain(|r| r.path() != p);
                }
            }
        }
    }
    let command =
        if opts.quick { "blobstream bench transfer --quick" } else { "blobstream bench transfer" };
    Ok(TransferReport { results, notes, machine: machine_description(), command: command.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let q = TransferPlan::new(true);
        assert_eq!((q.sizes.as_slice(), q.buffers.as_slice()), (&[MB, 32 * MB][..], &[0][..]));
        assert_eq!(q.runs_for(32 * MB), 3);
        let f = TransferPlan::new(false);
        assert_eq!(f.sizes, [MB, 8 * MB, 32 * MB, 256 * MB]);
        assert_eq!(f.buffers, [0, 4 << 20]);
        assert_eq!((f.runs_for(MB), f.runs_for(32 * MB), f.runs_for(256 * MB)), (41, 21, 15));
        assert_eq!((f.per_run(MB), f.per_run(8 * MB), q.per_run(MB)), (16, 1, 16));
    }
}
