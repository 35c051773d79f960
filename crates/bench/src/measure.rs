//! One measurement point: warm up, time a number of transfers, check every byte that arrived,
//! report the median.

use bytes::Bytes;

use crate::error::BenchError;
use crate::model::{Measurement, Mode, Path};
use crate::paths::{BlobstreamRunner, GrpcRunner, Iperf3Runner, RawTcpRunner};
use crate::payload::{median, payload};

/// What one timed transfer gave.
#[derive(Debug)]
pub struct Transfer {
    /// Throughput of this transfer.
    pub gbit_per_s: f64,
    /// The bytes that arrived on the receiving side, to check against what was sent. `None`
    /// when the path cannot hand them over (iperf3).
    pub received: Option<Bytes>,
}

/// One path with its servers running, ready to move bytes again and again.
pub trait PathRunner {
    fn path(&self) -> Path;

    /// Whether this path measures blobs of `size` bytes.
    fn measures(&self, size: u64) -> bool {
        let _ = size;
        true
    }

    /// Untimed set-up before a series of transfers (e.g. store the blob pulls will read).
    fn prepare(&mut self, mode: Mode, data: &Bytes, buffer: u32) -> Result<(), BenchError> {
        let _ = (mode, data, buffer);
        Ok(())
    }

    /// One timed transfer of all of `data`, the request and the final confirmation included
    /// (on a connection the path keeps from run to run).
    fn transfer(&mut self, mode: Mode, data: &Bytes, buffer: u32) -> Result<Transfer, BenchError>;

    /// Untimed clean-up after a series started by `prepare`.
    fn cleanup(&mut self, mode: Mode, data: &Bytes, buffer: u32) -> Result<(), BenchError> {
        let _ = (mode, data, buffer);
        Ok(())
    }
}

/// Start the servers of `path` (on 127.0.0.1, port 0).
pub fn start_runner(path: Path) -> Result<Box<dyn PathRunner>, BenchError> {
    Ok(match path {
        Path::Blobstream => Box::new(BlobstreamRunner::start()?),
        Path::RawTcp => Box::new(RawTcpRunner::new()),
        Path::Grpc => Box::new(GrpcRunner::start()?),
        Path::Iperf3 => Box::new(Iperf3Runner::start()?.ok_or_else(|| {
            BenchError::Unavailable { path, reason: "iperf3 is not on PATH".into() }
        })?),
    })
}

/// Measure `runs` transfers of `size` bytes over `path` in direction `mode` with socket buffers
/// of `buffer` bytes (0 = kernel default), after one warm-up; starts the path's servers for
/// this measurement alone.
pub fn measure(
    path: Path,
    mode: Mode,
    size: u64,
    buffer: u32,
    runs: u32,
) -> Result<Measurement, BenchError> {
    let mut runner = start_runner(path)?;
    measure_with(runner.as_mut(), mode, &payload(size), buffer, runs)
}

/// [`measure`] with a running path and the bytes to move.
pub fn measure_with(
    runner: &mut dyn PathRunner,
    mode: Mode,
    data: &Bytes,
    buffer: u32,
    runs: u32,
) -> Result<Measurement, BenchError> {
    if runs == 0 {
        return Err(BenchError::Invalid("a measurement needs at least one run".into()));
    }
    measure_interleaved(&mut [runner], mode, data, buffer, runs, 1)
        .pop()
        .expect("one runner, one result")
}

/// Measure every runner in `runners` on the same point, interleaved: one warm-up each, then
/// run after run each path in turn, so drift on a shared machine hits every path alike and
/// the ratios between them hold. A run makes `per_run` transfers on each path, the paths
/// taking turns transfer by transfer, and counts each path's summed time (a transfer of a few
/// hundred microseconds is moved by half by a single late wake-up; a run of many is not).
/// Returns one result per runner, in order.
pub fn measure_interleaved(
    runners: &mut [&mut dyn PathRunner],
    mode: Mode,
    data: &Bytes,
    buffer: u32,
    runs: u32,
    per_run: u32,
) -> Vec<Result<Measurement, BenchError>> {
    let mut samples: Vec<Result<Vec<f64>, BenchError>> = runners
        .iter_mut()
        .map(|r| r.prepare(mode, data, buffer).map(|_| Vec::with_capacity(runs as usize)))
        .collect();
    let per_run = per_run.max(1);
    let n = runners.len();
    let mut order = TurnOrder::new(n);
    for i in 0..=runs {
        // Each path's summed time per gigabit over this run's transfers.
        let mut spent = vec![0.0f64; n];
        // Transfer by transfer the paths take turns, in a new order each round, so a burst of
        // descheduling lands on every path of the run alike, and no path follows another
        // (and what that one leaves running behind it) more often than the rest do.
        for _ in 0..per_run {
            for j in order.next() {
                let Ok(_) = &samples[j] else { continue };
                let r = &mut *runners[j];
                match r.transfer(mode, data, buffer).and_then(|t| {
                    check(r.path(), mode, data, t.received.as_deref()).map(|_| t.gbit_per_s)
                }) {
                    Ok(g) => spent[j] += 1.0 / g,
                    Err(e) => samples[j] = Err(e),
                }
            }
        }
        if i == 0 {
            continue; // run 0 is the warm-up
        }
        for (s, spent) in samples.iter_mut().zip(spent) {
            if let Ok(list) = s {
                // The run's bytes over its summed time.
                list.push(f64::from(per_run) / spent);
            }
        }
    }
    runners
        .iter_mut()
        .zip(samples)
        .map(|(r, s)| {
            let cleaned = r.cleanup(mode, data, buffer);
            let s = s?;
            cleaned?;
            Ok(Measurement {
                mode,
                size_bytes: data.len() as u64,
                path: r.path(),
                socket_buffer: buffer,
                gbit_per_s: median(&s),
                runs,
                per_run,
                samples: s,
            })
        })
        .collect()
}

/// The order the paths take their turns in, round by round: a shuffle from a fixed seed, the
/// same in every benchmark run. (Rotating one fixed order would put the same path after the
/// same other path in most rounds: with three, two rounds in three.)
struct TurnOrder {
    order: Vec<usize>,
    state: u64,
}

impl TurnOrder {
    fn new(n: usize) -> Self {
        Self { order: (0..n).collect(), state: 0x9E37_79B9_7F4A_7C15 }
    }

    /// This round's order (Fisher–Yates over xorshift64).
    fn next(&mut self) -> Vec<usize> {
        for i in (1..self.order.len()).rev() {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            self.order.swap(i, (self.state % (i as u64 + 1)) as usize);
        }
        self.order.clone()
    }
}

/// Every byte sent arrived, in order.
fn check(path: Path, mode: Mode, sent: &[u8], received: Option<&[u8]>) -> Result<(), BenchError> {
    let Some(received) = received else { return Ok(()) };
    let corrupt =
        |detail: String| BenchError::Corrupt { path, mode, size: sent.len() as u64, detail };
    if received.len() != sent.len() {
        return Err(corrupt(format!("{} bytes arrived", received.len())));
    }
    // Compared whole first (memcmp); the first difference is looked for only when there is one.
    if sent == received {
        return Ok(());
    }
    let at = sent.iter().zip(received).position(|(a, b)| a != b).unwrap_or(0);
    Err(corrupt(format!("first difference at byte {at}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every round is an order of all paths, and over many rounds each path follows each
    /// other about as often (a rotation of one order puts path 0 after path 2 in two rounds
    /// of three).
    #[test]
    fn turn_orders_are_permutations_that_balance_who_follows_whom() {
        let mut t = TurnOrder::new(3);
        let mut follows = [[0u32; 3]; 3];
        let mut last: Option<usize> = None;
        for _ in 0..600 {
            let o = t.next();
            let mut sorted = o.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2]);
            for j in o {
                if let Some(p) = last {
                    follows[p][j] += 1;
                }
                last = Some(j);
            }
        }
        for (p, row) in follows.iter().enumerate() {
            for (j, &n) in row.iter().enumerate() {
                if p != j {
                    // About 267 each (200 within rounds, 67 across their ends): ±25 %.
                    assert!((200..=335).contains(&n), "{j} after {p}: {n} times of 1799");
                }
            }
        }
    }

    #[test]
    fn check_finds_short_and_wrong_bytes() {
        let p = Path::RawTcp;
        assert!(check(p, Mode::Push, b"abc", Some(b"abc")).is_ok());
        assert!(check(p, Mode::Push, b"abc", None).is_ok());
        let e = check(p, Mode::Pull, b"abc", Some(b"ab")).unwrap_err();
        assert!(e.to_string().contains("2 bytes arrived"), "{e}");
        let e = check(p, Mode::Pull, b"abc", Some(b"abX")).unwrap_err();
        assert!(e.to_string().contains("byte 2"), "{e}");
    }
}
