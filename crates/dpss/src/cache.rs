//! The block server's in-memory LRU cache of verified blocks, bounded in bytes.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

use crate::block::BlockId;

/// A cached block: its bytes and the digest they were verified against.
#[derive(Debug, Clone)]
pub struct Cached {
    pub data: Bytes,
    pub digest: [u8; 16],
}

type Key = (String, BlockId);

/// Least recently used blocks leave first once `budget` bytes are held.
#[derive(Debug)]
pub struct Cache {
    budget: usize,
    held: usize,
    tick: u64,
    map: HashMap<Key, (Cached, u64)>,
    order: BTreeMap<u64, Key>,
}

impl Cache {
    pub fn new(budget: usize) -> Self {
        Self { budget, held: 0, tick: 0, map: HashMap::new(), order: BTreeMap::new() }
    }

    /// The block, marked as just used.
    pub fn get(&mut self, dataset: &str, id: BlockId) -> Option<Cached> {
        let key = (dataset.to_string(), id);
        let (c, t) = self.map.get_mut(&key)?;
        self.order.remove(t);
        self.tick += 1;
        *t = self.tick;
        self.order.insert(self.tick, key);
        Some(c.clone())
    }

    /// The block, checked against its digest first: one whose bytes changed in memory is
    /// dropped and not returned (the caller fetches it again).
    pub fn get_verified(&mut self, dataset: &str, id: BlockId) -> Option<Cached> {
        let c = self.get(dataset, id)?;
        if crate::block::digest(&c.data) == c.digest {
            return Some(c);
        }
        tracing::error!(dataset, block = %id, "a cached block no longer matches its digest");
        let (old, t) = self.map.remove(&(dataset.to_string(), id)).expect("just found");
        self.order.remove(&t);
        self.held -= old.data.len();
        None
    }

    pub fn contains(&self, dataset: &str, id: BlockId) -> bool {
        self.map.contains_key(&(dataset.to_string(), id))
    }

    /// Keep a block (one larger than the whole budget is not kept).
    pub fn insert(&mut self, dataset: &str, id: BlockId, c: Cached) {
        let key = (dataset.to_string(), id);
        if let Some((old, t)) = self.map.remove(&key) {
            self.order.remove(&t);
            self.held -= old.data.len();
        }
        if c.data.len() > self.budget {
            return;
        }
        self.held += c.data.len();
        while self.held > self.budget {
            let (_, k) = self.order.pop_first().expect("held bytes are in the order");
            let (old, _) = self.map.remove(&k).expect("order and map agree");
            self.held -= old.data.len();
        }
        self.tick += 1;
        self.order.insert(self.tick, key.clone());
        self.map.insert(key, (c, self.tick));
    }

    /// Forget every block of a data set.
    pub fn drop_dataset(&mut self, dataset: &str) {
        let gone: Vec<Key> = self.map.keys().filter(|(d, _)| d == dataset).cloned().collect();
        for k in gone {
            let (old, t) = self.map.remove(&k).unwrap();
            self.order.remove(&t);
            self.held -= old.data.len();
        }
    }

    pub fn bytes(&self) -> usize {
        self.held
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: usize) -> Cached {
        Cached { data: Bytes::from(vec![1u8; n]), digest: [0; 16] }
    }

    #[test]
    fn least_recently_used_leaves_first_and_the_budget_holds() {
        let mut c = Cache::new(300);
        let id = |x| BlockId::new(0, x, 0);
        c.insert("d", id(0), block(100));
        c.insert("d", id(1), block(100));
        c.insert("d", id(2), block(100));
        assert!(c.get("d", id(0)).is_some()); // 0 is now the most recent
        c.insert("d", id(3), block(100)); // evicts 1, the least recent
        assert!(!c.contains("d", id(1)));
        assert!(c.contains("d", id(0)) && c.contains("d", id(2)) && c.contains("d", id(3)));
        assert_eq!(c.bytes(), 300);
        c.insert("d", id(4), block(1000)); // larger than the budget: not kept
        assert!(!c.contains("d", id(4)));
        assert_eq!(c.bytes(), 300);
        c.insert("e", id(0), block(50));
        c.drop_dataset("d");
        assert_eq!((c.len(), c.bytes()), (1, 50));
    }

    #[test]
    fn a_block_changed_in_memory_is_dropped_not_returned() {
        let mut c = Cache::new(1000);
        let data = Bytes::from_static(b"tile bytes");
        let good = Cached { data: data.clone(), digest: crate::block::digest(&data) };
        c.insert("d", BlockId::new(0, 0, 0), good);
        assert!(c.get_verified("d", BlockId::new(0, 0, 0)).is_some());
        let bad = Cached { data, digest: [0; 16] };
        c.insert("d", BlockId::new(0, 1, 0), bad);
        assert!(c.get_verified("d", BlockId::new(0, 1, 0)).is_none());
        assert!(!c.contains("d", BlockId::new(0, 1, 0)));
        assert_eq!(c.len(), 1);
    }
}
