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
    /// Pull granted in band: the blob as the grant opened it, read by the transfer that
    /// follows at once on the same connection (one catalogue lookup for both). `None` for a
    /// grant behind a token, which opens the blob when the token is redeemed.
    pub source: Option<bs_store::BlobSource>,
}

/// Outstanding tokens, plus a memory of recently redeemed ones so a reuse is named as such.
/// Bounded: a client asking for tokens it never redeems holds at most [`MAX_LIVE`] of them
/// (and [`MAX_LIVE_UDP`] that hold a datagram socket each) until they expire, rather than the
/// server's memory and descriptors.
pub struct TokenTable {
    ttl: Duration,
    max_live: usize,
    max_live_udp: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    live: HashMap<[u8; TOKEN_LEN], (Grant, Instant)>,
    /// Live grants holding a datagram socket.
    live_udp: usize,
    /// Expired tokens are swept when `live` reaches this many (then twice what is left):
    /// amortised, not a scan of the table per token.
    sweep_at: usize,
    used: HashSet<[u8; TOKEN_LEN]>,
    used_order: VecDeque<[u8; TOKEN_LEN]>,
}

const REMEMBER_USED: usize = 4096;
/// Most tokens outstanding (issued, neither redeemed nor expired) at once.
pub const MAX_LIVE: usize = 65_536;
/// Most outstanding binding tokens that hold a datagram socket each.
pub const MAX_LIVE_UDP: usize = 256;

/// The table holds as many tokens as it may: the reason, for the caller to refuse with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Full(pub String);

impl TokenTable {
    pub fn new(ttl: Duration) -> Self {
        Self::with_limits(ttl, MAX_LIVE, MAX_LIVE_UDP)
    }

    /// A table holding at most `max_live` outstanding tokens, `max_live_udp` of them with a
    /// datagram socket.
    pub fn with_limits(ttl: Duration, max_live: usize, max_live_udp: usize) -> Self {
        let inner = Inner { sweep_at: 1024, ..Inner::default() };
        Self { ttl, max_live, max_live_udp, inner: Mutex::new(inner) }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Issue a fresh random token for `grant`, unless as many are outstanding as may be.
    pub fn issue(&self, grant: Grant) -> Result<[u8; TOKEN_LEN], Full> {
        let mut token = [0u8; TOKEN_LEN];
        getrandom::fill(&mut token).expect("the OS random source works");
        let now = Instant::now();
        let udp = grant.bind.udp.is_some();
        let mut i = self.inner.lock().unwrap();
        let full = i.live.len() >= self.max_live || (udp && i.live_udp >= self.max_live_udp);
        if i.live.len() >= i.sweep_at || full {
            let mut swept_udp = 0;
            i.live.retain(|_, (g, exp)| {
                let keep = *exp > now;
                swept_udp += usize::from(!keep && g.bind.udp.is_some());
                keep
            });
            i.live_udp -= swept_udp;
            i.sweep_at = (2 * i.live.len()).max(1024);
        }
        if i.live.len() >= self.max_live {
            return Err(Full(format!(
                "{} tokens are outstanding, the most this server holds: redeem them or let \
                 them expire",
                i.live.len()
            )));
        }
        if udp && i.live_udp >= self.max_live_udp {
            return Err(Full(format!(
                "{} datagram bindings wait to be opened, the most this server holds",
                i.live_udp
            )));
        }
        i.live_udp += usize::from(udp);
        i.live.insert(token, (grant, now + self.ttl));
        Ok(token)
    }

    /// What a live token grants, without redeeming it: a connection's kind decides which
    /// slots it needs before its token is spent.
    pub fn direction(&self, token: &[u8; TOKEN_LEN]) -> Option<Direction> {
        self.inner.lock().unwrap().live.get(token).map(|(g, _)| g.direction)
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
        i.live_udp -= usize::from(grant.bind.udp.is_some());
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
            source: None,
        }
    }

    #[test]
    fn tokens_redeem_once() {
        let t = TokenTable::new(Duration::from_secs(60));
        let tok = t.issue(grant()).unwrap();
        assert_eq!(t.redeem(&tok).unwrap().name, "x");
        assert_eq!(t.redeem(&tok).unwrap_err(), ErrorCode::TokenReused);
        assert_eq!(t.redeem(&[0; TOKEN_LEN]).unwrap_err(), ErrorCode::BadToken);
    }

    #[test]
    fn zero_ttl_tokens_are_expired() {
        let t = TokenTable::new(Duration::ZERO);
        let tok = t.issue(grant()).unwrap();
        assert_eq!(t.redeem(&tok).unwrap_err(), ErrorCode::TokenExpired);
    }

    /// A client that asks for tokens and never redeems them holds at most the table's bound
    /// (datagram bindings a smaller one); redeemed or expired ones make room again.
    #[test]
    fn outstanding_tokens_are_bounded_and_room_comes_back() {
        let t = TokenTable::with_limits(Duration::from_secs(60), 3000, 2);
        let toks: Vec<_> = (0..3000).map(|_| t.issue(grant()).unwrap()).collect();
        let full = t.issue(grant()).unwrap_err();
        assert!(full.0.contains("3000 tokens are outstanding"), "{full:?}");
        t.redeem(&toks[0]).unwrap();
        t.issue(grant()).unwrap();
        let udp = || {
            let mut g = grant();
            let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            g.bind.udp = Some(std::sync::Arc::new(sock));
            g
        };
        let t = TokenTable::with_limits(Duration::from_secs(60), 100, 2);
        let (a, _b) = (t.issue(udp()).unwrap(), t.issue(udp()).unwrap());
        assert!(t.issue(udp()).unwrap_err().0.contains("datagram bindings"));
        t.issue(grant()).unwrap(); // others still go
        t.redeem(&a).unwrap();
        t.issue(udp()).unwrap();
        // Expired ones make room too.
        let t = TokenTable::with_limits(Duration::ZERO, 3, 1);
        for _ in 0..10 {
            t.issue(udp()).unwrap();
        }
    }
}
