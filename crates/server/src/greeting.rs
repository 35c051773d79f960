//! Data connections that have not presented their token yet: how many may wait, how long
//! each may take, and which one makes room when there are too many.
//!
//! Such a connection costs a socket and a small task, never a thread, so many may wait. The
//! limits hold in total and per source address ([`crate::source`]); when one is reached the
//! *oldest* waiting connection — of the same address, for the per-address limit — is evicted,
//! never the new one. A stranger holding connections open only ever displaces its own oldest
//! ones, and a client that presents its token as soon as it connects is never the oldest.
//! Once more than half of a limit is in use, new connections get the shorter deadline.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::source::source_key;

/// How many connections may wait for their token, and for how long.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// From all addresses together.
    pub total: usize,
    /// From one source address.
    pub per_source: usize,
    /// Deadline for the token while there is room.
    pub timeout: Duration,
    /// Deadline once more than half of a limit is in use.
    pub pressed_timeout: Duration,
}

/// The table of waiting connections.
pub(crate) struct Greeting {
    limits: Limits,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Oldest first.
    waiting: BTreeMap<u64, Waiter>,
    by_source: HashMap<IpAddr, BTreeSet<u64>>,
    /// Evictions not yet reported in the log.
    unreported: u64,
    reported: Option<Instant>,
}

struct Waiter {
    source: IpAddr,
    evict: Arc<Notify>,
}

/// One waiting connection's place in the table; leaving it (drop) frees the place.
pub(crate) struct Ticket {
    greeting: Arc<Greeting>,
    id: u64,
    evict: Arc<Notify>,
    deadline: Instant,
}

/// Evictions are logged at most this often (with their count), never one line each.
const REPORT_EVERY: Duration = Duration::from_secs(60);

impl Greeting {
    pub(crate) fn new(limits: Limits) -> Arc<Self> {
        let limits = Limits {
            total: limits.total.max(1),
            per_source: limits.per_source.max(1),
            pressed_timeout: limits.pressed_timeout.min(limits.timeout),
            ..limits
        };
        Arc::new(Self { limits, state: Mutex::new(State::default()) })
    }

    /// Give a new connection from `ip` its place, evicting the oldest waiting connection of
    /// that address, or else of all, when a limit is reached.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Ticket {
        let source = source_key(ip);
        let mut s = self.state.lock().unwrap();
        let mine = s.by_source.get(&source).map_or(0, BTreeSet::len);
        let victim = if mine >= self.limits.per_source {
            s.by_source.get(&source).and_then(|ids| ids.first().copied())
        } else if s.waiting.len() >= self.limits.total {
            s.waiting.keys().next().copied()
        } else {
            None
        };
        if let Some(id) = victim {
            s.evict(id);
        }
        let id = s.next_id;
        s.next_id += 1;
        let evict = Arc::new(Notify::new());
        s.waiting.insert(id, Waiter { source, evict: evict.clone() });
        let ids = s.by_source.entry(source).or_default();
        ids.insert(id);
        let mine = ids.len();
        let pressed = mine * 2 > self.limits.per_source || s.waiting.len() * 2 > self.limits.total;
        let timeout = if pressed { self.limits.pressed_timeout } else { self.limits.timeout };
        s.report();
        drop(s);
        Ticket { greeting: self.clone(), id, evict, deadline: Instant::now() + timeout }
    }

    /// Evict the oldest waiting connection of all (the process ran out of descriptors).
    /// Returns whether there was one.
    pub(crate) fn evict_oldest(&self) -> bool {
        let mut s = self.state.lock().unwrap();
        let oldest = s.waiting.keys().next().copied();
        oldest.is_some_and(|id| s.evict(id))
    }

    /// Evict every waiting connection (the server is shutting down).
    pub(crate) fn evict_all(&self) {
        let mut s = self.state.lock().unwrap();
        let ids: Vec<u64> = s.waiting.keys().copied().collect();
        for id in ids {
            s.evict(id);
        }
        s.unreported = 0;
    }

    /// Connections waiting now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.state.lock().unwrap().waiting.len()
    }
}

impl State {
    fn evict(&mut self, id: u64) -> bool {
        let Some(w) = self.remove(id) else { return false };
        w.evict.notify_one();
        self.unreported += 1;
        true
    }

    fn remove(&mut self, id: u64) -> Option<Waiter> {
        let w = self.waiting.remove(&id)?;
        if let Some(ids) = self.by_source.get_mut(&w.source) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_source.remove(&w.source);
            }
        }
        Some(w)
    }

    fn report(&mut self) {
        if self.unreported == 0 || self.reported.is_some_and(|t| t.elapsed() < REPORT_EVERY) {
            return;
        }
        tracing::warn!(
            evicted = self.unreported,
            waiting = self.waiting.len(),
            "data plane: connections that did not present a token were evicted to make room"
        );
        self.unreported = 0;
        self.reported = Some(Instant::now());
    }
}

impl Ticket {
    /// When this connection's token must have arrived.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Resolves once this connection has been evicted to make room (at once if it already
    /// was).
    pub(crate) async fn evicted(&self) {
        self.evict.notified().await;
    }

    /// Whether this connection still holds its place.
    #[cfg(test)]
    fn is_waiting(&self) -> bool {
        self.greeting.state.lock().unwrap().waiting.contains_key(&self.id)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.greeting.state.lock().unwrap().remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_source: usize) -> Limits {
        Limits {
            total,
            per_source,
            timeout: Duration::from_secs(10),
            pressed_timeout: Duration::from_secs(1),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_at_its_limit_displaces_its_own_oldest_only() {
        let g = Greeting::new(limits(100, 3));
        let other = g.admit(ip("10.0.0.2"));
        let a: Vec<Ticket> = (0..3).map(|_| g.admit(ip("10.0.0.1"))).collect();
        assert!(a.iter().all(Ticket::is_waiting));
        let newest = g.admit(ip("10.0.0.1"));
        assert!(!a[0].is_waiting(), "the oldest of that address made room");
        assert!(a[1].is_waiting() && a[2].is_waiting() && newest.is_waiting());
        assert!(other.is_waiting(), "another address is never touched");
        assert_eq!(g.waiting(), 4);
    }

    #[test]
    fn a_full_table_displaces_the_oldest_of_all() {
        let g = Greeting::new(limits(3, 10));
        let first = g.admit(ip("10.0.0.1"));
        let second = g.admit(ip("10.0.0.2"));
        let third = g.admit(ip("10.0.0.3"));
        let fourth = g.admit(ip("10.0.0.4"));
        assert!(!first.is_waiting());
        assert!(second.is_waiting() && third.is_waiting() && fourth.is_waiting());
        assert_eq!(g.waiting(), 3);
    }

    #[test]
    fn leaving_frees_the_place_without_evicting_anyone() {
        let g = Greeting::new(limits(2, 2));
        let a = g.admit(ip("10.0.0.1"));
        drop(g.admit(ip("10.0.0.1")));
        let c = g.admit(ip("10.0.0.1"));
        assert!(a.is_waiting() && c.is_waiting());
        // A ticket dropped after its eviction leaves the table as it is.
        assert!(g.evict_oldest());
        drop(a);
        assert!(c.is_waiting());
        assert_eq!(g.waiting(), 1);
    }

    #[test]
    fn more_than_half_full_means_the_shorter_deadline() {
        let g = Greeting::new(limits(4, 100));
        let before = Instant::now();
        let relaxed: Vec<Ticket> = (0..2).map(|_| g.admit(ip("10.0.0.1"))).collect();
        assert!(relaxed.iter().all(|t| t.deadline() >= before + Duration::from_secs(10)));
        let pressed = g.admit(ip("10.0.0.2"));
        assert!(pressed.deadline() < before + Duration::from_secs(10));
        // The per-address limit counts too.
        let g = Greeting::new(limits(100, 4));
        let _a = g.admit(ip("10.0.0.1"));
        assert!(g.admit(ip("10.0.0.1")).deadline() >= before + Duration::from_secs(10));
        let _b = g.admit(ip("10.0.0.1"));
        assert!(g.admit(ip("10.0.0.1")).deadline() < before + Duration::from_secs(10));
    }

    #[test]
    fn evicted_tickets_hear_it_even_when_they_listen_late() {
        let g = Greeting::new(limits(1, 1));
        let first = g.admit(ip("10.0.0.1"));
        let _second = g.admit(ip("10.0.0.1"));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(first.evicted());
        g.evict_all();
        assert_eq!(g.waiting(), 0);
    }
}
