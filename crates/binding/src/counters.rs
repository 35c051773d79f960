//! Live per-binding counters, shared between the task running a binding and whoever reports
//! on it (the status call, `/metrics`, the CLI).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use crate::qos::Profile;

/// Counters of one binding (all monotonic except `queued`).
#[derive(Debug)]
pub struct Counters {
    pub started: Instant,
    /// Application bytes and messages sent and received.
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub messages_out: AtomicU64,
    pub messages_in: AtomicU64,
    /// Bytes on the wire (after every layer).
    pub wire_out: AtomicU64,
    pub wire_in: AtomicU64,
    /// Wire messages (datagrams, on a datagram binding) sent.
    pub wire_messages_out: AtomicU64,
    /// Datagrams missing, and datagrams that arrived after a later one (UDP).
    pub lost: AtomicU64,
    pub reordered: AtomicU64,
    /// Renegotiations applied.
    pub renegotiations: AtomicU64,
    /// Wire messages waiting for the scheduler.
    pub queued: AtomicU64,
    /// The profile in force (it changes when a renegotiation applies).
    profile: Mutex<Profile>,
}

impl Counters {
    /// `n` bytes received with no layer between them and the wire (a raw transfer's DATA).
    pub fn raw_in(&self, n: u64) {
        Self::add(&self.bytes_in, n);
        Self::add(&self.wire_in, n);
    }

    /// One raw message of `n` bytes sent.
    pub fn raw_out(&self, n: u64) {
        Self::add(&self.bytes_out, n);
        Self::add(&self.wire_out, n);
        Self::add(&self.messages_out, 1);
    }
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            bytes_out: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            messages_out: AtomicU64::new(0),
            messages_in: AtomicU64::new(0),
            wire_out: AtomicU64::new(0),
            wire_in: AtomicU64::new(0),
            wire_messages_out: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            reordered: AtomicU64::new(0),
            renegotiations: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            profile: Mutex::new(Profile::default()),
        }
    }
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub age_ms: u64,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub messages_out: u64,
    pub messages_in: u64,
    pub wire_out: u64,
    pub wire_in: u64,
    pub wire_out_count: u64,
    pub lost: u64,
    pub reordered: u64,
    pub renegotiations: u64,
    pub queued: u64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    /// The profile in force now.
    pub fn profile(&self) -> Profile {
        self.profile.lock().unwrap().clone()
    }

    pub fn set_profile(&self, p: &Profile) {
        *self.profile.lock().unwrap() = p.clone();
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            age_ms: self.started.elapsed().as_millis() as u64,
            bytes_out: self.bytes_out.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            messages_out: self.messages_out.load(Relaxed),
            messages_in: self.messages_in.load(Relaxed),
            wire_out: self.wire_out.load(Relaxed),
            wire_in: self.wire_in.load(Relaxed),
            wire_out_count: self.wire_messages_out.load(Relaxed),
            lost: self.lost.load(Relaxed),
            reordered: self.reordered.load(Relaxed),
            renegotiations: self.renegotiations.load(Relaxed),
            queued: self.queued.load(Relaxed),
        }
    }
}
