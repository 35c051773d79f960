//! A least-recently-used cache bounded by total weight (bytes) and entry count: the memory
//! tier in front of a slow store, and the web server's decoded images and thumbnails. Lookups
//! and inserts are O(log n): entries by key, and their last use in order.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Mutex;

/// Evicts the least recently used entries when over `capacity` total weight or
/// `max_entries` entries.
pub struct Lru<K, V> {
    inner: Mutex<State<K, V>>,
    capacity: usize,
    max_entries: usize,
}

struct State<K, V> {
    entries: HashMap<K, (V, usize, u64)>,
    by_use: BTreeMap<u64, K>,
    weight: usize,
    tick: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> Lru<K, V> {
    pub fn new(capacity: usize, max_entries: usize) -> Self {
        let state = State { entries: HashMap::new(), by_use: BTreeMap::new(), weight: 0, tick: 0 };
        Self { inner: Mutex::new(state), capacity, max_entries: max_entries.max(1) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K, V>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &K) -> Option<V> {
        let mut s = self.lock();
        s.tick += 1;
        let tick = s.tick;
        let (v, _, used) = s.entries.get_mut(key)?;
        let (out, old) = (v.clone(), std::mem::replace(used, tick));
        let k = s.by_use.remove(&old).expect("every entry is in the use order");
        s.by_use.insert(tick, k);
        Some(out)
    }

    /// Insert (replacing an equal key); returns the entries evicted to make room. An entry
    /// heavier than the whole cache is not kept (and returned as evicted).
    pub fn put(&self, key: K, value: V, weight: usize) -> Vec<(K, V)> {
        if weight > self.capacity {
            return vec![(key, value)];
        }
        let mut s = self.lock();
        let replaced = Self::remove_locked(&mut s, &key);
        s.tick += 1;
        let tick = s.tick;
        s.entries.insert(key.clone(), (value, weight, tick));
        s.by_use.insert(tick, key);
        s.weight += weight;
        let mut evicted = Vec::new();
        while s.weight > self.capacity || s.entries.len() > self.max_entries {
            let (_, oldest) = s.by_use.pop_first().expect("not empty while over a bound");
            if let Some((v, w, _)) = s.entries.remove(&oldest) {
                s.weight -= w;
                evicted.push((oldest, v));
            }
        }
        // What it replaced (and what it evicted, with the caller) is dropped unlocked.
        drop(s);
        drop(replaced);
        evicted
    }

    /// Forget `key`; returns its value, to be dropped once the cache is unlocked.
    pub fn remove(&self, key: &K) -> Option<V> {
        Self::remove_locked(&mut self.lock(), key)
    }

    /// Forget `key` if its value is `which`; returns it, to be dropped once unlocked.
    pub fn remove_if(&self, key: &K, which: impl FnOnce(&V) -> bool) -> Option<V> {
        let mut s = self.lock();
        if !s.entries.get(key).is_some_and(|(v, _, _)| which(v)) {
            return None;
        }
        Self::remove_locked(&mut s, key)
    }

    fn remove_locked(s: &mut State<K, V>, key: &K) -> Option<V> {
        let (v, w, used) = s.entries.remove(key)?;
        s.by_use.remove(&used);
        s.weight -= w;
        Some(v)
    }

    /// Total weight held.
    pub fn weight(&self) -> usize {
        self.lock().weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_by_weight() {
        let c = Lru::new(10, 100);
        c.put("a", 1, 4);
        c.put("b", 2, 4);
        assert_eq!(c.get(&"a"), Some(1)); // a is now the most recent
        c.put("c", 3, 4); // over 10: b goes
        assert_eq!(c.get(&"b"), None);
        assert_eq!(c.get(&"a"), Some(1));
        assert_eq!(c.get(&"c"), Some(3));
        c.put("huge", 9, 11);
        assert_eq!(c.get(&"huge"), None);
        c.put("a", 5, 4);
        assert_eq!(c.get(&"a"), Some(5));
        let few = Lru::new(100, 2);
        few.put(1, 1, 1);
        few.put(2, 2, 1);
        few.put(3, 3, 1);
        assert_eq!((few.get(&1), few.get(&2), few.get(&3)), (None, Some(2), Some(3)));
        few.remove(&2);
        assert_eq!((few.get(&2), few.weight()), (None, 1));
        assert_eq!(few.remove_if(&3, |v| *v == 4), None, "not that value");
        assert_eq!(few.remove_if(&3, |v| *v == 3), Some(3));
        assert_eq!(few.get(&3), None);
    }
}
