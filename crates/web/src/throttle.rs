//! A limit on failed authentication per source address, so that guessing the token is slow
//! however many requests a client sends at once.
//!
//! Each address may fail `burst` times in a row; its allowance then comes back at one failure
//! per `refill` (a generic cell rate algorithm: one instant per address, no timers). While an
//! address has no allowance left, every token check from it is refused with 429 *before* the
//! token is compared — a correct token too, or a throttled guesser would still learn when it
//! guessed right. The check and the recording of its failure happen under one lock, so
//! parallel requests cannot overdraw the allowance.
//!
//! IPv6 addresses count by their /64 (what one host or network is usually given). The table
//! holds at most `max_addrs` addresses; addresses whose allowance is whole again are dropped
//! first, and beyond that new addresses share one allowance.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Whose failures count together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    Addr(IpAddr),
    /// Requests whose peer address is not known (a router used without a listener).
    Unknown,
    /// Addresses beyond the table's capacity.
    Overflow,
}

fn source(peer: Option<IpAddr>) -> Source {
    match peer {
        None => Source::Unknown,
        Some(IpAddr::V4(a)) => Source::Addr(IpAddr::V4(a)),
        Some(IpAddr::V6(a)) => match a.to_ipv4_mapped() {
            Some(v4) => Source::Addr(IpAddr::V4(v4)),
            None => {
                let bits = u128::from(a) & !((1u128 << 64) - 1);
                Source::Addr(IpAddr::V6(bits.into()))
            }
        },
    }
}

/// The failure allowance of every source address.
pub struct Throttle {
    burst: u32,
    refill: Duration,
    max_addrs: usize,
    /// Per source: the instant its failures are all paid off (absent: nothing owed).
    owed_until: Mutex<HashMap<Source, Instant>>,
}

impl Throttle {
    /// `burst` failures in a row, then one per `refill`; at most `max_addrs` addresses tracked.
    pub fn new(burst: u32, refill: Duration, max_addrs: usize) -> Self {
        Self {
            burst: burst.max(1),
            refill: refill.max(Duration::from_millis(1)),
            max_addrs: max_addrs.max(1),
            owed_until: Mutex::new(HashMap::new()),
        }
    }

    /// Check a credential for `peer` at `now`. While the address is throttled, `check` is not
    /// run and the answer is `Err(wait)`: how long until it may try again. Otherwise `check`
    /// runs; a `false` is recorded as a failure. Returns what `check` said.
    pub fn attempt(
        &self,
        peer: Option<IpAddr>,
        now: Instant,
        check: impl FnOnce() -> bool,
    ) -> Result<bool, Duration> {
        let mut t = self.owed_until.lock().unwrap_or_else(|p| p.into_inner());
        let mut src = source(peer);
        if !t.contains_key(&src) && t.len() >= self.max_addrs {
            t.retain(|_, until| *until > now);
            if t.len() >= self.max_addrs {
                src = Source::Overflow;
            }
        }
        let until = t.get(&src).copied().filter(|u| *u > now).unwrap_or(now);
        // Failures in a row still allowed before this attempt: burst − ceil(owed / refill).
        let owed = until - now;
        let slack = self.refill * (self.burst - 1);
        if owed > slack {
            return Err(owed - slack);
        }
        let ok = check();
        if !ok {
            t.insert(src, until + self.refill);
        }
        Ok(ok)
    }

    /// Addresses tracked (for tests).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.owed_until.lock().unwrap().len()
    }
}

/// Whole seconds to announce in `Retry-After` (at least 1).
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1)));
    const B: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2)));

    fn fail(t: &Throttle, peer: Option<IpAddr>, now: Instant) -> Result<bool, Duration> {
        t.attempt(peer, now, || false)
    }

    #[test]
    fn a_burst_of_failures_then_one_per_refill() {
        let t = Throttle::new(3, Duration::from_secs(10), 100);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(fail(&t, A, t0), Ok(false));
        }
        // Throttled: not even a correct credential is looked at.
        let mut looked = false;
        let r = t.attempt(A, t0, || {
            looked = true;
            true
        });
        assert_eq!(r, Err(Duration::from_secs(10)));
        assert!(!looked);
        // Another address is not affected.
        assert_eq!(t.attempt(B, t0, || true), Ok(true));
        assert_eq!(fail(&t, B, t0), Ok(false));
        // Later the address may try again: one failure per refill.
        let t1 = t0 + Duration::from_secs(4);
        assert_eq!(fail(&t, A, t1), Err(Duration::from_secs(6)));
        let t2 = t0 + Duration::from_secs(10);
        assert_eq!(t.attempt(A, t2, || true), Ok(true), "a correct token passes again");
        assert_eq!(fail(&t, A, t2), Ok(false));
        assert_eq!(fail(&t, A, t2), Err(Duration::from_secs(10)));
        // After burst × refill of quiet, the whole allowance is back.
        let t3 = t2 + Duration::from_secs(30);
        for _ in 0..3 {
            assert_eq!(fail(&t, A, t3), Ok(false));
        }
        assert!(fail(&t, A, t3).is_err());
    }

    #[test]
    fn successes_cost_nothing() {
        let t = Throttle::new(1, Duration::from_secs(60), 100);
        let t0 = Instant::now();
        for _ in 0..100 {
            assert_eq!(t.attempt(A, t0, || true), Ok(true));
        }
        assert_eq!(fail(&t, A, t0), Ok(false));
        assert!(t.attempt(A, t0, || true).is_err());
    }

    #[test]
    fn ipv6_counts_by_slash_64_and_mapped_ipv4_as_ipv4() {
        let t = Throttle::new(2, Duration::from_secs(60), 100);
        let t0 = Instant::now();
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(fail(&t, Some(a), t0), Ok(false));
        assert_eq!(fail(&t, Some(b), t0), Ok(false));
        assert!(fail(&t, Some(a), t0).is_err(), "same /64");
        assert_eq!(fail(&t, Some(other), t0), Ok(false));
        let v4: IpAddr = "192.0.2.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(fail(&t, Some(v4), t0), Ok(false));
        assert_eq!(fail(&t, Some(mapped), t0), Ok(false));
        assert!(fail(&t, Some(v4), t0).is_err());
    }

    #[test]
    fn the_table_is_bounded() {
        let t = Throttle::new(1, Duration::from_secs(60), 4);
        let t0 = Instant::now();
        let addr = |i: u8| Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, i)));
        for i in 0..4 {
            assert_eq!(fail(&t, addr(i), t0), Ok(false));
        }
        assert_eq!(t.tracked(), 4);
        // Full of throttled addresses: newcomers share one allowance.
        assert_eq!(fail(&t, addr(10), t0), Ok(false));
        assert!(fail(&t, addr(11), t0).is_err());
        assert_eq!(t.tracked(), 5, "the table plus the shared entry");
        // Once their allowance is whole again, old entries make room.
        let later = t0 + Duration::from_secs(120);
        assert_eq!(fail(&t, addr(12), later), Ok(false));
        assert_eq!(t.tracked(), 1);
        assert!(fail(&t, addr(12), later).is_err());
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(6)), 6);
        assert_eq!(retry_after_secs(Duration::from_millis(6001)), 7);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}
