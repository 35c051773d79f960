//! Browser sessions: `POST /api/session` trades the bearer token for a random session id
//! (the cookie's value), so a leaked cookie is not the master token. The table lives in
//! memory: each id expires after a fixed time, `DELETE /api/session` revokes it, a restart
//! forgets them all, and the table holds at most [`MAX_SESSIONS`] (the oldest go first).
//!
//! Only a hash of each id is kept, so lookups reveal nothing about the ids through timing
//! and a memory dump does not hold live cookies.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most sessions kept at once; logging in beyond it ends the session closest to expiry.
pub const MAX_SESSIONS: usize = 1024;

/// Random bytes in a session id (hex in the cookie).
const ID_BYTES: usize = 32;

type IdHash = [u8; 32];

/// The live sessions: hash of the id → when it expires.
pub struct Sessions {
    ttl: Duration,
    max: usize,
    table: Mutex<HashMap<IdHash, Instant>>,
}

fn hash(id: &str) -> IdHash {
    *blake3::hash(id.as_bytes()).as_bytes()
}

impl Sessions {
    /// Sessions lasting `ttl`, at most `max` at once.
    pub fn new(ttl: Duration, max: usize) -> Self {
        Self { ttl, max: max.max(1), table: Mutex::new(HashMap::new()) }
    }

    /// How long a session lasts.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<IdHash, Instant>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start a session at `now`; returns its id.
    pub fn create(&self, now: Instant) -> String {
        let mut bytes = [0u8; ID_BYTES];
        getrandom::fill(&mut bytes).expect("the OS random source works");
        let id = hex::encode(bytes);
        let mut t = self.table();
        if t.len() >= self.max {
            t.retain(|_, expires| *expires > now);
        }
        while t.len() >= self.max {
            let oldest = t.iter().min_by_key(|(_, e)| **e).map(|(h, _)| *h);
            match oldest {
                Some(h) => t.remove(&h),
                None => break,
            };
        }
        t.insert(hash(&id), now + self.ttl);
        id
    }

    /// Whether `id` names a session alive at `now` (an expired one is dropped).
    pub fn valid(&self, id: &str, now: Instant) -> bool {
        let h = hash(id);
        let mut t = self.table();
        match t.get(&h) {
            Some(expires) if *expires > now => true,
            Some(_) => {
                t.remove(&h);
                false
            }
            None => false,
        }
    }

    /// End the session `id`; returns whether it existed.
    pub fn revoke(&self, id: &str) -> bool {
        self.table().remove(&hash(id)).is_some()
    }

    /// Sessions in the table (expired ones not yet dropped included).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_and_are_revocable() {
        let s = Sessions::new(Duration::from_secs(60), 8);
        let t0 = Instant::now();
        let a = s.create(t0);
        let b = s.create(t0);
        assert_ne!(a, b);
        assert_eq!(a.len(), 2 * ID_BYTES);
        assert!(s.valid(&a, t0 + Duration::from_secs(59)));
        assert!(!s.valid(&a, t0 + Duration::from_secs(60)), "expired");
        assert!(!s.valid(&a, t0), "an expired session is gone for good");
        assert!(s.revoke(&b));
        assert!(!s.valid(&b, t0));
        assert!(!s.revoke(&b));
        assert!(!s.valid("not-a-session", t0));
        assert!(!s.valid("", t0));
    }

    #[test]
    fn the_table_is_bounded_and_drops_the_oldest() {
        let s = Sessions::new(Duration::from_secs(60), 3);
        let t0 = Instant::now();
        let ids: Vec<String> = (0..3).map(|i| s.create(t0 + Duration::from_secs(i))).collect();
        let newest = s.create(t0 + Duration::from_secs(10));
        assert_eq!(s.len(), 3);
        let now = t0 + Duration::from_secs(11);
        assert!(!s.valid(&ids[0], now), "the oldest made room");
        assert!(s.valid(&ids[1], now) && s.valid(&ids[2], now) && s.valid(&newest, now));
        // Expired sessions go before live ones.
        let later = t0 + Duration::from_secs(65);
        let fresh = s.create(later);
        assert!(s.valid(&newest, later) && s.valid(&fresh, later));
        assert_eq!(s.len(), 2);
    }
}
