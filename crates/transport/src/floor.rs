//! A floor on the rate a peer sends at: a per-read timeout alone lets a peer that sends one
//! byte just before each timeout hold a connection (and the server's slot for it) forever.

use std::io;
use std::time::{Duration, Instant};

/// Reads fail once, past `grace` from the start, the bytes read average under `min` a second.
#[derive(Debug, Clone)]
pub struct ReadFloor {
    min: u64,
    grace: Duration,
    since: Instant,
    bytes: u64,
}

/// The error a read fails with under the floor (as the inner error of a `TimedOut`
/// `io::Error`; [`crate::TransportError::from_io`] makes it [`crate::TransportError::TooSlow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{bytes} bytes in {secs} s, under the {min} bytes/s a transfer must keep to")]
pub struct BelowFloor {
    pub bytes: u64,
    pub secs: u64,
    pub min: u64,
}

impl ReadFloor {
    /// At least `min` bytes a second on average, counted from now, enforced after `grace`.
    pub fn new(min: u64, grace: Duration) -> Self {
        Self { min, grace, since: Instant::now(), bytes: 0 }
    }

    /// Count `n` bytes read; an error once the average is under the floor.
    pub(crate) fn count(&mut self, n: usize) -> io::Result<()> {
        if n == 0 {
            // The peer closed: that is said as such, not as slowness.
            return Ok(());
        }
        self.bytes += n as u64;
        self.check(self.since.elapsed())
    }

    fn check(&self, elapsed: Duration) -> io::Result<()> {
        if elapsed <= self.grace {
            return Ok(());
        }
        let secs = elapsed.as_secs();
        if self.bytes >= self.min.saturating_mul(secs) {
            return Ok(());
        }
        let below = BelowFloor { bytes: self.bytes, secs, min: self.min };
        Err(io::Error::new(io::ErrorKind::TimedOut, below))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_holds_only_after_the_grace_and_on_the_average() {
        let mut f = ReadFloor::new(1000, Duration::from_secs(30));
        f.bytes = 10;
        // Within the grace anything goes.
        assert!(f.check(Duration::from_secs(30)).is_ok());
        // Past it, the average counts: 10 bytes in 31 s is under 1000 a second.
        let e = f.check(Duration::from_secs(31)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let below = e.get_ref().and_then(|i| i.downcast_ref::<BelowFloor>()).copied();
        assert_eq!(below, Some(BelowFloor { bytes: 10, secs: 31, min: 1000 }));
        // A burst that brings the average up is fine.
        f.bytes = 31_000;
        assert!(f.check(Duration::from_secs(31)).is_ok());
        assert!(f.check(Duration::from_secs(32)).is_err());
    }
}
