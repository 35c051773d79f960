//! A small least-recently-used cache bounded by total weight (bytes), for decoded images and
//! thumbnails: the viewer asks for an image's metadata, pixels and filtered versions in quick
//! succession, and decoding a large DICOM file each time would dominate.

use std::sync::Mutex;

/// Entries most recently used last; evicts from the front when over `capacity` total weight
/// or `max_entries` entries (lookups scan, so the count stays small).
pub struct Lru<K, V> {
    inner: Mutex<Vec<(K, V, usize)>>,
    capacity: usize,
    max_entries: usize,
}

impl<K: PartialEq, V: Clone> Lru<K, V> {
    pub fn new(capacity: usize, max_entries: usize) -> Self {
        Self { inner: Mutex::new(Vec::new()), capacity, max_entries: max_entries.max(1) }
    }

    pub fn get(&self, key: &K) -> Option<V> {
        let mut v = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let i = v.iter().position(|(k, _, _)| k == key)?;
        let e = v.remove(i);
        let out = e.1.clone();
        v.push(e);
        Some(out)
    }

    /// Insert (replacing an equal key). An entry heavier than the whole cache is not kept.
    pub fn put(&self, key: K, value: V, weight: usize) {
        if weight > self.capacity {
            return;
        }
        let mut v = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        v.retain(|(k, _, _)| *k != key);
        v.push((key, value, weight));
        let mut total: usize = v.iter().map(|e| e.2).sum();
        while total > self.capacity || v.len() > self.max_entries {
            total -= v.remove(0).2;
        }
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
    }
}
