//! Control-plane authentication: a shared bearer token, compared in constant time, with wrong
//! tokens rate-limited per source address. The data plane needs none of its own: its
//! connections are admitted by one-time tokens that only an authenticated `Negotiate` hands
//! out.
//!
//! Each source address ([`crate::source`]) may present a burst of wrong tokens; after that
//! one more per interval. While over that budget every call from the address is refused with
//! `UNAVAILABLE` without looking at its token, so parallel guessing gains nothing: a guess that
//! is not checked tells nothing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::config::ServerConfig;
use crate::source::source_key;

/// Checks `authorization: Bearer <token>` when a token is configured; lets everything through
/// otherwise.
#[derive(Clone)]
pub(crate) struct Auth {
    expected: Option<Arc<[u8]>>,
    failures: Arc<Failures>,
}

impl Auth {
    pub(crate) fn new(cfg: &ServerConfig) -> Self {
        Self {
            expected: cfg.auth_token.as_ref().map(|t| format!("Bearer {t}").into_bytes().into()),
            failures: Arc::new(Failures::new(cfg.auth_failure_burst, cfg.auth_failure_interval)),
        }
    }
}

impl Interceptor for Auth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else { return Ok(req) };
        let given = req.metadata().get("authorization");
        let right = given.is_some_and(|v| bool::from(v.as_bytes().ct_eq(expected)));
        if let Some(src) = req.remote_addr().map(|a| source_key(a.ip()))
            && let Err(wait) = self.failures.attempt(src, Instant::now(), right || given.is_none())
        {
            return Err(Status::unavailable(format!(
                "too many wrong tokens from {src}; calls from there are refused for {} s",
                wait.as_secs_f64().ceil() as u64
            )));
        }
        match given {
            _ if right => Ok(req),
            Some(_) => Err(Status::unauthenticated("wrong credentials")),
            None => Err(Status::unauthenticated(
                "this server requires a token (BLOBSTREAM_AUTH_TOKEN or --auth-token-file)",
            )),
        }
    }
}

/// Wrong-token counts per source, as a generic cell rate algorithm: each failure moves the
/// source's "theoretical arrival time" one interval on; a source is refused while that time
/// lies more than `burst - 1` intervals ahead.
struct Failures {
    interval: Duration,
    /// How far ahead the arrival time may lie before calls are refused.
    slack: Duration,
    ahead: Mutex<HashMap<IpAddr, Instant>>,
}

/// Sources remembered at most; beyond it those whose failures have all been forgiven go first.
const MAX_SOURCES: usize = 100_000;

impl Failures {
    fn new(burst: u32, interval: Duration) -> Self {
        Self {
            interval,
            slack: interval.saturating_mul(burst.max(1) - 1),
            ahead: Mutex::new(HashMap::new()),
        }
    }

    /// One call from `src`, which carried the right token (or none) if `harmless`: refused
    /// with the time to wait while `src` is over its budget, otherwise let through, and a
    /// wrong token counted. Atomic, so parallel guesses cannot slip past the count.
    fn attempt(&self, src: IpAddr, now: Instant, harmless: bool) -> Result<(), Duration> {
        let mut map = self.ahead.lock().unwrap();
        if let Some(wait) = self.over(map.get(&src).copied(), now) {
            return Err(wait);
        }
        if !harmless {
            Self::record(&mut map, src, now, self.interval);
        }
        Ok(())
    }

    /// How long a source whose arrival time is `ahead` must still wait, if at all.
    fn over(&self, ahead: Option<Instant>, now: Instant) -> Option<Duration> {
        let over = ahead?.checked_duration_since(now.checked_add(self.slack)?)?;
        (!over.is_zero()).then_some(over)
    }

    fn record(map: &mut HashMap<IpAddr, Instant>, src: IpAddr, now: Instant, interval: Duration) {
        if map.len() >= MAX_SOURCES && !map.contains_key(&src) {
            map.retain(|_, t| *t > now);
            if map.len() >= MAX_SOURCES {
                // Still full of active guessers: forget the one closest to being forgiven.
                let first = map.iter().min_by_key(|(_, t)| **t).map(|(ip, _)| *ip);
                first.map(|ip| map.remove(&ip));
            }
        }
        let t = map.entry(src).or_insert(now);
        *t = (*t).max(now).checked_add(interval).unwrap_or(*t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tonic::transport::server::TcpConnectInfo;

    fn with(v: Option<&str>, from: &str) -> Request<()> {
        let mut r = Request::new(());
        if let Some(v) = v {
            r.metadata_mut().insert("authorization", v.parse().unwrap());
        }
        let remote_addr = Some(SocketAddr::new(from.parse().unwrap(), 40000));
        r.extensions_mut().insert(TcpConnectInfo { local_addr: None, remote_addr });
        r
    }

    fn auth(token: Option<&str>, burst: u32, interval: Duration) -> Auth {
        Auth::new(&ServerConfig {
            auth_token: token.map(str::to_string),
            auth_failure_burst: burst,
            auth_failure_interval: interval,
            ..ServerConfig::ephemeral()
        })
    }

    #[test]
    fn tokens_are_checked_only_when_configured() {
        let code = |r: Result<Request<()>, Status>| r.map(drop).map_err(|s| s.code());
        assert!(auth(None, 10, Duration::from_secs(1)).call(with(None, "10.0.0.1")).is_ok());
        let mut a = auth(Some("s3cret"), 10, Duration::from_secs(1));
        assert!(a.call(with(Some("Bearer s3cret"), "10.0.0.1")).is_ok());
        let wrong = a.call(with(Some("Bearer s3creT"), "10.0.0.1"));
        assert_eq!(code(wrong), Err(tonic::Code::Unauthenticated));
        assert_eq!(code(a.call(with(None, "10.0.0.1"))), Err(tonic::Code::Unauthenticated));
    }

    #[test]
    fn a_burst_of_wrong_tokens_shuts_out_that_address_only() {
        // An interval no test run outlasts: nothing is forgiven while the test runs.
        let mut a = auth(Some("s3cret"), 3, Duration::from_secs(3600));
        let code = |r: Result<Request<()>, Status>| r.map(drop).map_err(|s| s.code());
        for guess in ["a", "b", "c"] {
            let r = a.call(with(Some(&format!("Bearer {guess}")), "10.0.0.1"));
            assert_eq!(code(r), Err(tonic::Code::Unauthenticated));
        }
        // Over the budget: refused unchecked, even the right token (a guess gains nothing).
        let r = a.call(with(Some("Bearer d"), "10.0.0.1"));
        let refused = r.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert!(refused.message().contains("too many wrong tokens"), "{}", refused.message());
        let r = a.call(with(Some("Bearer s3cret"), "10.0.0.1"));
        assert_eq!(code(r), Err(tonic::Code::Unavailable));
        // Another address, and another host's /64, are unaffected.
        assert!(a.call(with(Some("Bearer s3cret"), "10.0.0.2")).is_ok());
        assert!(a.call(with(Some("Bearer s3cret"), "2001:db8::1")).is_ok());
    }

    #[test]
    fn failures_are_forgiven_one_interval_at_a_time() {
        let f = Failures::new(2, Duration::from_secs(10));
        let (ip, t0) = ("10.0.0.1".parse().unwrap(), Instant::now());
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(f.attempt(ip, t0, false), Ok(()));
        assert_eq!(f.attempt(ip, t0, true), Ok(()), "right tokens cost nothing");
        assert_eq!(f.attempt(ip, t0, false), Ok(()));
        assert_eq!(f.attempt(ip, t0, true), Err(Duration::from_secs(10)));
        assert_eq!(f.attempt(ip, at(4), false), Err(Duration::from_secs(6)));
        assert_eq!(f.attempt(ip, at(10), false), Ok(()), "one forgiven");
        assert_eq!(f.attempt(ip, at(10), true), Err(Duration::from_secs(10)));
    }
}
