//! One-time tokens: what a negotiation granted, redeemable once, for a limited time.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bs_transport::SocketOptions;
use bs_wire::{DigestAlgo, ErrorCode, TOKEN_LEN};

/// Which way the bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Push,
    Pull,
    /// A binding to one of the test endpoints (see `Grant::bind`).
    Bind,
}

/// What a token allows.
#[derive(Debug, Clone)]
pub struct Grant {
    pub name: String,
    pub direction: Direction,
    pub offset: u64,
    pub length: u64,
    pub algo: DigestAlgo,
    pub chunk: u32,
    pub socket: SocketOptions,
    /// Pull: digest of the blob when negotiated; a different blob under the name is refused.
    pub blob_digest: Option<String>,
    /// Push: one range of an upload written next to others (never commits).
    pub range: bool,
    /// Push: the pending upload its route named (routed in the same negotiation, or by a
    /// Route the client names). The push is refused (`NotFound`) if the name has been routed
    /// again since, by another put.
    pub upload_id: Option<String>,
    /// Pull: the client uses no byte before the final SUM, so chunks may be sent before
    /// they are checked (`NegotiateRequest.whole_before_use`).
    pub whole_before_use: bool,
    /// The binding this token opens: its id, endpoint and agreed profile.
    pub bind: crate::bindings::BindGrant,
}

/// Outstanding tokens, plus a memory of recently redeemed ones so a reuse is named as such.
pub struct TokenTable {
    ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    live: HashMap<[u8; TOKEN_LEN], (Grant, Instant)>,
    used: HashSet<[u8; TOKEN_LEN]>,
    used_order: VecDeque<[u8; TOKEN_LEN]>,
}

const REMEMBER_USED: usize = 4096;

impl TokenTable {
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, inner: Mutex::new(Inner::default()) }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Issue a fresh random token for `grant`.
    pub fn issue(&self, grant: Grant) -> [u8; TOKEN_LEN] {
        let mut token = [0u8; TOKEN_LEN];
        getrandom::fill(&mut token).expect("the OS random source works");
        let now = Instant::now();
        let mut i = self.inner.lock().unwrap();
        i.live.retain(|_, (_, exp)| *exp > now);
        i.live.insert(token, (grant, now + self.ttl));
        token
    }

    /// Redeem a token, once. Errors say whether it was unknown, expired or already used.
    pub fn redeem(&self, token: &[u8; TOKEN_LEN]) -> Result<Grant, ErrorCode> {
        let mut i = self.inner.lock().unwrap();
        let Some((grant, expires)) = i.live.remove(token) else {
            return Err(if i.used.contains(token) {
                ErrorCode::TokenReused
            } else {
                ErrorCode::BadToken
            });
        };
        i.used.insert(*token);
        i.used_order.push_back(*token);
        if i.used_order.len() > REMEMBER_USED {
            let old = i.used_order.pop_front().expect("non-empty");
            i.used.remove(&old);
        }
        if Instant::now() >= expires {
            return Err(ErrorCode::TokenExpired);
        }
        Ok(grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> Grant {
        Grant {
            name: "x".into(),
            direction: Direction::Pull,
            offset: 0,
            length: 1,
            algo: DigestAlgo::default(),
            chunk: 1024,
            socket: SocketOptions::default(),
            blob_digest: None,
            range: false,
            upload_id: None,
            whole_before_use: false,
            bind: crate::bindings::BindGrant {
                id: 1,
                endpoint: crate::bindings::Endpoint::Pull,
                profile: bs_binding::Profile::default(),
                label: "x".into(),
                udp: None,
            },
        }
    }

    #[test]
    fn tokens_redeem_once() {
        let t = TokenTable::new(Duration::from_secs(60));
        let tok = t.issue(grant());
        assert_eq!(t.redeem(&tok).unwrap().name, "x");
        assert_eq!(t.redeem(&tok).unwrap_err(), ErrorCode::TokenReused);
        assert_eq!(t.redeem(&[0; TOKEN_LEN]).unwrap_err(), ErrorCode::BadToken);
    }

    #[test]
    fn zero_ttl_tokens_are_expired() {
        let t = TokenTable::new(Duration::ZERO);
        let tok = t.issue(grant());
        assert_eq!(t.redeem(&tok).unwrap_err(), ErrorCode::TokenExpired);
    }
}
