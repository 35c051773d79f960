//! The `pace` layer: a token bucket that spaces messages out to a rate. It adds no header; it
//! sets each message's `not_before`, which the driver (or the scheduler) honours.

use std::time::{Duration, Instant};

use super::{Layer, LayerQos};
use crate::error::LayerError;
use crate::msg::Msg;
use crate::qos::LayerSpec;

/// Bytes may leave at `rate` per second, in bursts of at most `burst`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: u64,
    burst: f64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    /// A bucket for `rate` bytes per second; the burst is 10 ms worth (at least 64 KiB).
    pub fn new(rate: u64) -> Self {
        let burst = (rate as f64 / 100.0).max(65536.0);
        Self { rate: rate.max(1), burst, tokens: burst, last: None }
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Spend `n` bytes at `now`: when they may leave (`None`: at once).
    pub fn take(&mut self, n: usize, now: Instant) -> Option<Instant> {
        if let Some(last) = self.last {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + dt * self.rate as f64).min(self.burst);
        }
        self.last = Some(now);
        self.tokens -= n as f64;
        (self.tokens < 0.0).then(|| now + Duration::from_secs_f64(-self.tokens / self.rate as f64))
    }
}

pub struct Pace {
    bucket: TokenBucket,
}

impl Pace {
    pub fn new(rate: u64) -> Self {
        Self { bucket: TokenBucket::new(rate) }
    }
}

impl Layer for Pace {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Pace(self.bucket.rate())
    }
    fn header_len(&self) -> usize {
        0
    }
    fn lower(&self, above: LayerQos) -> LayerQos {
        let rate = match above.rate_bps {
            0 => self.bucket.rate(),
            r => r.min(self.bucket.rate()),
        };
        LayerQos { rate_bps: rate, ..above }
    }
    fn encode(&mut self, mut msg: Msg, out: &mut Vec<Msg>) -> Result<(), LayerError> {
        let at = self.bucket.take(msg.len(), Instant::now());
        msg.not_before = match (msg.not_before, at) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        out.push(msg);
        Ok(())
    }
    fn decode(&mut self, msg: Msg) -> Result<Option<Msg>, LayerError> {
        Ok(Some(msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_holds_the_rate_after_its_burst() {
        let mut b = TokenBucket::new(1_000_000); // 1 MB/s, burst 64 KiB
        let t0 = Instant::now();
        assert_eq!(b.take(65536, t0), None, "the burst goes at once");
        // The next 100 KB may leave 0.1 s later.
        let at = b.take(100_000, t0).unwrap();
        let wait = at - t0;
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // Ten seconds of silence refill only the burst.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(b.take(65536, later), None);
        assert!(b.take(1, later).is_some());
    }
}
