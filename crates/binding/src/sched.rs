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

/// Map a binding's QoS priority onto the calling thread's OS scheduling priority, so the
/// threads of low-priority bindings yield the CPU to those of high-priority ones: priority 7
/// keeps nice 0, each step down adds 2 (priority 1: nice 12). Priority 0 — no requirement,
/// the default — leaves the thread alone: a binding nobody ranked runs at the normal OS
/// priority. Only ever lowers the thread's priority (raising it needs privileges); call it on
/// a thread that serves that binding alone.
pub fn lower_thread_priority(priority: u8) {
    if priority == 0 || priority >= 7 {
        return;
    }
    let nice = 2 * (7 - i32::from(priority));
    // SAFETY: gettid and setpriority take plain integers; on failure nothing changes.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let now = libc::getpriority(libc::PRIO_PROCESS, tid);
        if now < nice {
            libc::setpriority(libc::PRIO_PROCESS, tid, nice);
        }
    }
}

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
    /// Priorities of the messages leaving now.
    leaving: Vec<u8>,
}

impl Scheduler {
    pub fn new(policy: Policy, slots: usize) -> Self {
        Self {
            slots: slots.max(1),
            state: Mutex::new(State {
                queue: Queue::new(policy),
                busy: 0,
                granted: Vec::new(),
                leaving: Vec::new(),
            }),
            turn: Condvar::new(),
        }
    }

    /// Someone holds a slot or waits for one.
    pub fn contended(&self) -> bool {
        let s = self.state.lock().unwrap();
        s.busy > 0 || !s.queue.is_empty()
    }

    pub fn policy(&self) -> Policy {
        self.state.lock().unwrap().queue.policy
    }

    /// Wait for `t`'s turn, run `send` (the write of one wire message), then let the next go.
    pub fn send<T>(&self, t: Ticket, send: impl FnOnce() -> T) -> T {
        {
            let mut s = self.state.lock().unwrap();
            // Under strict priority a message that outranks everything leaving now goes at
            // once, slot or no slot: waiting for a lower-priority write to finish is priority
            // inversion (and that write's thread may be the one the OS runs least).
            let outranks = s.queue.policy == Policy::Priority
                && s.leaving.iter().all(|p| *p < t.priority)
                && s.queue.waiting.iter().all(|w| w.ticket.priority < t.priority);
            if (s.busy < self.slots && s.queue.is_empty()) || outranks {
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
            s.leaving.push(t.priority);
        }
        let _release = Release(self, t.priority);
        send()
    }
}

/// Frees the slot (and hands it to the next waiter) even if the send panics.
struct Release<'a>(&'a Scheduler, u8);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap();
        if let Some(i) = s.leaving.iter().position(|p| *p == self.1) {
            s.leaving.swap_remove(i);
        }
        if s.busy > self.0.slots {
            // A message that went past the slots: nobody's turn to hand over.
            s.busy -= 1;
            return;
        }
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

    /// Binding 0 (priority 0) holds the one slot; bindings 1 and 2 (priority 0) and then 3
    /// (priority 7) ask to send. Returns the order in which they sent.
    fn gate_order(policy: Policy) -> Vec<u64> {
        use std::sync::Arc;
        let s = Arc::new(Scheduler::new(policy, 1));
        let log = Arc::new(Mutex::new(Vec::new()));
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let first = {
            let (s, log) = (s.clone(), log.clone());
            std::thread::spawn(move || {
                s.send(t(0, 1, 0, 0, 1), || {
                    hold_rx.recv().unwrap();
                    log.lock().unwrap().push(0)
                })
            })
        };
        while s.state.lock().unwrap().leaving.is_empty() {
            std::thread::yield_now();
        }
        let mut threads = Vec::new();
        for (b, p) in [(1u64, 0u8), (2, 0), (3, 7)] {
            let (s2, log2) = (s.clone(), log.clone());
            let th = std::thread::spawn(move || {
                s2.send(t(b, 1, p, 0, 1), || log2.lock().unwrap().push(b))
            });
            // Wait until it is queued, or (going past the slot) done.
            loop {
                let queued = s.state.lock().unwrap().queue.len();
                if queued == threads.len() + 1 || log.lock().unwrap().contains(&b) {
                    break;
                }
                std::thread::yield_now();
            }
            threads.push(th);
        }
        hold_tx.send(()).unwrap();
        first.join().unwrap();
        for th in threads {
            th.join().unwrap();
        }
        log.lock().unwrap().clone()
    }

    #[test]
    fn under_strict_priority_a_message_that_outranks_every_sender_goes_at_once() {
        assert_eq!(gate_order(Policy::Priority), vec![3, 0, 1, 2]);
    }

    #[test]
    fn under_fifo_everyone_waits_their_turn() {
        assert_eq!(gate_order(Policy::Fifo), vec![0, 1, 2, 3]);
    }
}
