//! Who sends next when several bindings leave one process.
//!
//! Each binding keeps its own connection and task (bindings are never multiplexed onto one
//! another); the [`Scheduler`] only decides the order in which their wire messages may start
//! leaving, `slots` at a time. Policies:
//! - [`Policy::Fifo`]: arrival order (the baseline);
//! - [`Policy::Priority`]: highest priority first, arrival order among equals;
//! - [`Policy::Deadline`]: earliest deadline first, the deadline being arrival + the binding's
//!   latency bound (no bound: after every bounded message);
//! - [`Policy::Fair`]: weighted fair share (self-clocked fair queueing): each message's
//!   virtual finish time is `max(now_virtual, binding's last finish) + bytes / weight`, and the
//!   smallest goes first, so over time each busy binding gets bytes in proportion to its weight.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How the scheduler orders waiting messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    Fifo,
    #[default]
    Priority,
    Deadline,
    Fair,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "fifo" => Self::Fifo,
            "priority" => Self::Priority,
            "deadline" | "edf" => Self::Deadline,
            "fair" | "wfq" => Self::Fair,
            _ => return Err(format!("unknown policy {s:?} (fifo, priority, deadline, fair)")),
        })
    }
}

/// One wire message asking to leave.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ticket {
    pub binding: u64,
    pub bytes: usize,
    pub priority: u8,
    pub latency: Option<Duration>,
    pub weight: u32,
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    id: u64,
    ticket: Ticket,
    arrival: u64,
    deadline: Option<Instant>,
    finish: f64,
}

/// The order, without threads: push tickets, pop the one to go next.
#[derive(Debug)]
pub struct Queue {
    policy: Policy,
    waiting: Vec<Waiting>,
    arrivals: u64,
    virtual_now: f64,
    last_finish: HashMap<u64, f64>,
}

impl Queue {
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            waiting: Vec::new(),
            arrivals: 0,
            virtual_now: 0.0,
            last_finish: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Queue `t` (arriving at `now`); returns its id.
    pub fn push(&mut self, t: Ticket, now: Instant) -> u64 {
        let id = self.arrivals;
        self.arrivals += 1;
        let start = self.last_finish.get(&t.binding).copied().unwrap_or(0.0).max(self.virtual_now);
        let finish = start + t.bytes.max(1) as f64 / t.weight.max(1) as f64;
        self.last_finish.insert(t.binding, finish);
        let deadline = t.latency.map(|l| now + l);
        self.waiting.push(Waiting { id, ticket: t, arrival: id, deadline, finish });
        id
    }

    /// The next to go: its id and ticket.
    pub fn pop(&mut self) -> Option<(u64, Ticket)> {
        let i = match self.policy {
            Policy::Fifo => self.position_min_by(|w| (0u8, 0f64, w.arrival)),
            Policy::Priority => self.position_min_by(|w| (7 - w.ticket.priority, 0.0, w.arrival)),
            Policy::Deadline => self.position_min_by(|w| match w.deadline {
                Some(d) => (0, d.duration_since(self.epoch()).as_secs_f64(), w.arrival),
                None => (1, 0.0, w.arrival),
            }),
            Policy::Fair => self.position_min_by(|w| (0, w.finish, w.arrival)),
        }?;
        let w = self.waiting.swap_remove(i);
        if self.policy == Policy::Fair {
            self.virtual_now = self.virtual_now.max(w.finish);
        }
        if self.waiting.is_empty() {
            // Idle: forget history, so a binding that was quiet does not bank credit.
            self.last_finish.clear();
        }
        Some((w.id, w.ticket))
    }

    fn epoch(&self) -> Instant {
        self.waiting.iter().filter_map(|w| w.deadline).min().unwrap_or_else(Instant::now)
    }

    fn position_min_by<K: PartialOrd>(&self, key: impl Fn(&Waiting) -> K) -> Option<usize> {
        let mut best: Option<(usize, K)> = None;
        for (i, w) in self.waiting.iter().enumerate() {
            let k = key(w);
            if best.as_ref().is_none_or(|(_, b)| k < *b) {
                best = Some((i, k));
            }
        }
        best.map(|(i, _)| i)
    }
}

/// A process-wide gate: at most `slots` wire messages leave at once, the rest wait their
/// turn under the policy. Share one (in an `Arc`) between every binding of a process.
#[derive(Debug)]
pub struct Scheduler {
    slots: usize,
    state: Mutex<State>,
    turn: Condvar,
}

#[derive(Debug)]
struct State {
    queue: Queue,
    busy: usize,
    granted: Vec<u64>,
}

impl Scheduler {
    pub fn new(policy: Policy, slots: usize) -> Self {
        Self {
            slots: slots.max(1),
            state: Mutex::new(State { queue: Queue::new(policy), busy: 0, granted: Vec::new() }),
            turn: Condvar::new(),
        }
    }

    pub fn policy(&self) -> Policy {
        self.state.lock().unwrap().queue.policy
    }

    /// Wait for `t`'s turn, run `send` (the write of one wire message), then let the next go.
    pub fn send<T>(&self, t: Ticket, send: impl FnOnce() -> T) -> T {
        {
            let mut s = self.state.lock().unwrap();
            if s.busy < self.slots && s.queue.is_empty() {
                s.busy += 1;
            } else {
                let id = s.queue.push(t, Instant::now());
                loop {
                    s = self.turn.wait(s).unwrap();
                    if let Some(i) = s.granted.iter().position(|g| *g == id) {
                        s.granted.swap_remove(i);
                        break;
                    }
                }
            }
        }
        let _release = Release(self);
        send()
    }
}

/// Frees the slot (and hands it to the next waiter) even if the send panics.
struct Release<'a>(&'a Scheduler);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap();
        match s.queue.pop() {
            Some((id, _)) => {
                s.granted.push(id);
                drop(s);
                self.0.turn.notify_all();
            }
            None => s.busy -= 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(binding: u64, bytes: usize, priority: u8, latency_ms: u64, weight: u32) -> Ticket {
        Ticket {
            binding,
            bytes,
            priority,
            latency: (latency_ms > 0).then(|| Duration::from_millis(latency_ms)),
            weight,
        }
    }

    fn order(policy: Policy, tickets: &[Ticket]) -> Vec<u64> {
        let mut q = Queue::new(policy);
        let now = Instant::now();
        for x in tickets {
            q.push(*x, now);
        }
        std::iter::from_fn(|| q.pop().map(|(_, t)| t.binding)).collect()
    }

    #[test]
    fn fifo_keeps_arrival_order() {
        let ts = [t(1, 10, 0, 0, 1), t(2, 10, 7, 1, 1), t(3, 10, 3, 0, 1)];
        assert_eq!(order(Policy::Fifo, &ts), vec![1, 2, 3]);
    }

    #[test]
    fn priority_goes_highest_first_then_by_arrival() {
        let ts = [t(1, 10, 0, 0, 1), t(2, 10, 7, 0, 1), t(3, 10, 3, 0, 1), t(4, 10, 7, 0, 1)];
        assert_eq!(order(Policy::Priority, &ts), vec![2, 4, 3, 1]);
    }

    #[test]
    fn deadline_goes_earliest_first_and_unbounded_last() {
        let ts = [t(1, 10, 0, 0, 1), t(2, 10, 0, 50, 1), t(3, 10, 0, 5, 1), t(4, 10, 0, 20, 1)];
        assert_eq!(order(Policy::Deadline, &ts), vec![3, 4, 2, 1]);
    }

    #[test]
    fn fair_share_follows_the_weights() {
        // Binding 1 (weight 3) and binding 2 (weight 1) each queue 40 equal messages.
        let mut ts = Vec::new();
        for _ in 0..40 {
            ts.push(t(1, 1000, 0, 0, 3));
            ts.push(t(2, 1000, 0, 0, 1));
        }
        let served = order(Policy::Fair, &ts);
        let first_40 = &served[..40];
        let ones = first_40.iter().filter(|b| **b == 1).count();
        assert!((29..=31).contains(&ones), "3:1 while both are busy: {first_40:?}");
        // Binding 2 is never starved: it gets a turn at least every 5 messages.
        let gaps = served[..40].split(|b| *b == 2).map(|run| run.len()).max().unwrap();
        assert!(gaps <= 4, "{served:?}");
    }

    #[test]
    fn the_gate_lets_a_waiting_high_priority_message_go_before_earlier_bulk() {
        use std::sync::Arc;
        let s = Arc::new(Scheduler::new(Policy::Priority, 1));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        // Binding 0 holds the one slot until told to let go.
        let first = {
            let (s, log) = (s.clone(), log.clone());
            std::thread::spawn(move || {
                s.send(t(0, 1, 0, 0, 1), || {
                    hold_rx.recv().unwrap();
                    log.lock().unwrap().push(0)
                })
            })
        };
        let wait_queued = |n: usize| {
            while s.state.lock().unwrap().queue.len() < n {
                std::thread::yield_now();
            }
        };
        while s.state.lock().unwrap().busy == 0 {
            std::thread::yield_now();
        }
        let mut threads = Vec::new();
        for (i, (b, p)) in [(1u64, 0u8), (2, 0), (3, 7)].into_iter().enumerate() {
            let (s2, log2) = (s.clone(), log.clone());
            threads.push(std::thread::spawn(move || {
                s2.send(t(b, 1, p, 0, 1), || log2.lock().unwrap().push(b))
            }));
            wait_queued(i + 1);
        }
        hold_tx.send(()).unwrap();
        first.join().unwrap();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(*log.lock().unwrap(), vec![0, 3, 1, 2]);
    }
}
