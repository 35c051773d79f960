//! Waiting for the machine to be idle before a timed operation, so that work one operation
//! leaves behind (a peer's background jobs after a write, page-cache writeback) is not
//! charged to whichever operation comes next.
//!
//! On the 2-core machine, Garage keeps working for tens of milliseconds after answering a
//! PUT: a put timed right after another put took 7–11% longer than one timed after a get,
//! whoever did it. Paired runs alternate who goes first, so each pair's ratio was either
//! one side's slow case against the other's fast one or the reverse, and the median of 15
//! such ratios swung between the two clusters from run to run (0.78–0.97 for the same
//! code). Settled first, both sides are timed from the same quiet state.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Idle means: the machine's busy time grew by at most this many clock ticks ...
const BUSY_TICKS: u64 = 1;
/// ... over this long (at 100 ticks a second and 2 CPUs, 10 ticks could have passed).
const WINDOW: Duration = Duration::from_millis(50);
/// Never wait longer than this: a machine never idle is measured as it is.
const AT_MOST: Duration = Duration::from_secs(2);

/// Ticks the CPUs have spent busy since boot (`/proc/stat`), if it can be read.
fn busy_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    busy_of(stat.lines().next()?)
}

/// The busy ticks on `/proc/stat`'s `cpu` line: everything but idle and iowait.
fn busy_of(line: &str) -> Option<u64> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let n: Vec<u64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice: counted in user]
    let (idle, iowait) = (*n.get(3)?, *n.get(4)?);
    Some(n.iter().take(8).sum::<u64>() - idle - iowait)
}

/// Wait until the machine has been idle for [`WINDOW`], at most [`AT_MOST`]; returns
/// whether it was.
pub fn settle() -> bool {
    let start = Instant::now();
    let Some(mut before) = busy_ticks() else { return false };
    while start.elapsed() < AT_MOST {
        std::thread::sleep(WINDOW);
        let Some(now) = busy_ticks() else { return false };
        if now - before <= BUSY_TICKS {
            return true;
        }
        before = now;
    }
    false
}

/// Times operations, each started once the machine is idle, and counts those that found it
/// busy throughout (to say so in a report).
#[derive(Default)]
pub struct Clock {
    timed: Cell<usize>,
    unsettled: Cell<usize>,
}

impl Clock {
    /// Seconds `f` takes, started once the machine is idle (see [`settle`]).
    pub fn time<E>(&self, f: impl FnOnce() -> Result<(), E>) -> Result<f64, E> {
        self.timed.set(self.timed.get() + 1);
        if !settle() {
            self.unsettled.set(self.unsettled.get() + 1);
        }
        let t = Instant::now();
        f()?;
        Ok(t.elapsed().as_secs_f64())
    }

    /// Operations timed.
    pub fn timed(&self) -> usize {
        self.timed.get()
    }

    /// Operations that found the machine busy for as long as [`settle`] waits.
    pub fn unsettled(&self) -> usize {
        self.unsettled.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_leaves_out_idle_and_iowait() {
        let line = "cpu  100 5 20 9000 300 1 2 3 40 0";
        assert_eq!(busy_of(line), Some(100 + 5 + 20 + 1 + 2 + 3));
        assert_eq!(busy_of("cpu0 1 2 3 4 5 6 7 8"), None, "one CPU's line");
        assert_eq!(busy_of("cpu 1 2"), None, "too few fields");
    }
}
