//! The block server's in-memory LRU cache of verified blocks, bounded in bytes.

use std::hash::BuildHasher;

use hashlink::LinkedHashMap;
use hashlink::linked_hash_map::RawEntryMut;

use bytes::Bytes;

use crate::block::BlockId;

/// A cached block: its bytes and the digest they were verified against.
#[derive(Debug, Clone)]
pub struct Cached {
    pub data: Bytes,
    pub digest: [u8; 16],
}

impl Cached {
    /// Whether the bytes still match the digest.
    pub fn intact(&self) -> bool {
        crate::block::digest(&self.data) == self.digest
    }
}

type Key = (String, BlockId);

/// Least recently used blocks leave first once `budget` bytes are held.
///
/// A linked hash map: a hit is one hash of (data set, block) and a move to the back of the
/// list, O(1). (A tick-ordered `BTreeMap` beside two nested maps cost a B-tree removal and
/// insertion and two hashed lookups per hit: about a microsecond, on the path of every tile
/// a web server serves from its cache.)
#[derive(Debug)]
pub struct Cache {
    budget: usize,
    held: usize,
    /// Least recently used at the front.
    blocks: LinkedHashMap<Key, Cached>,
}

impl Cache {
    pub fn new(budget: usize) -> Self {
        Self { budget, held: 0, blocks: LinkedHashMap::new() }
    }

    /// The hash of `(dataset, id)`, as the map hashes its `(String, BlockId)` keys (a `str`
    /// hashes alike whether owned or borrowed): found without allocating a key.
    fn hash(&self, dataset: &str, id: BlockId) -> u64 {
        self.blocks.hasher().hash_one((dataset, id))
    }

    /// The block, marked as just used.
    pub fn get(&mut self, dataset: &str, id: BlockId) -> Option<Cached> {
        let h = self.hash(dataset, id);
        match self.blocks.raw_entry_mut().from_hash(h, |(d, i)| *i == id && d == dataset) {
            RawEntryMut::Occupied(mut e) => {
                e.to_back();
                Some(e.get().clone())
            }
            RawEntryMut::Vacant(_) => None,
        }
    }

    /// The block from a shared cache, checked against its digest first (after the lock is let
    /// go, so readers of other blocks do not wait behind it): one whose bytes changed in memory
    /// is dropped and not returned (the caller fetches it again).
    pub fn get_verified(
        cache: &std::sync::Mutex<Cache>,
        dataset: &str,
        id: BlockId,
    ) -> Option<Cached> {
        let c = cache.lock().unwrap_or_else(|p| p.into_inner()).get(dataset, id)?;
        if c.intact() {
            return Some(c);
        }
        cache.lock().unwrap_or_else(|p| p.into_inner()).forget_rotten(dataset, id, &c);
        None
    }

    /// Drop `bad` (found not to match its digest), unless the entry has been replaced since.
    fn forget_rotten(&mut self, dataset: &str, id: BlockId, bad: &Cached) {
        tracing::error!(dataset, block = %id, "a cached block no longer matches its digest");
        let same = |c: &Cached| c.data.as_ptr() == bad.data.as_ptr() && c.digest == bad.digest;
        let h = self.hash(dataset, id);
        if let RawEntryMut::Occupied(e) =
            self.blocks.raw_entry_mut().from_hash(h, |(d, i)| *i == id && d == dataset)
            && same(e.get())
        {
            self.held -= e.remove().data.len();
        }
    }

    pub fn contains(&self, dataset: &str, id: BlockId) -> bool {
        let h = self.hash(dataset, id);
        self.blocks.raw_entry().from_hash(h, |(d, i)| *i == id && d == dataset).is_some()
    }

    /// Remove one block; its bytes.
    fn remove(&mut self, dataset: &str, id: BlockId) -> Option<Cached> {
        let h = self.hash(dataset, id);
        match self.blocks.raw_entry_mut().from_hash(h, |(d, i)| *i == id && d == dataset) {
            RawEntryMut::Occupied(e) => {
                let old = e.remove();
                self.held -= old.data.len();
                Some(old)
            }
            RawEntryMut::Vacant(_) => None,
        }
    }

    /// Keep a block (one larger than the whole budget is not kept).
    pub fn insert(&mut self, dataset: &str, id: BlockId, c: Cached) {
        self.remove(dataset, id);
        if c.data.len() > self.budget {
            return;
        }
        self.held += c.data.len();
        while self.held > self.budget {
            let (_, old) = self.blocks.pop_front().expect("held bytes are in the map");
            self.held -= old.data.len();
        }
        self.blocks.insert((dataset.to_string(), id), c);
    }

    /// Forget every block of a data set.
    pub fn drop_dataset(&mut self, dataset: &str) {
        let mut freed = 0;
        self.blocks.retain(|(d, _), c| {
            let keep = d != dataset;
            if !keep {
                freed += c.data.len();
            }
            keep
        });
        self.held -= freed;
    }

    pub fn bytes(&self) -> usize {
        self.held
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
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
        // The same block of another data set is another entry (found by the borrowed name).
        c.insert("e", id(0), block(50));
        assert_eq!(c.get("e", id(0)).map(|b| b.data.len()), Some(50));
        assert_eq!(c.get("d", id(0)).map(|b| b.data.len()), Some(100));
        assert!(!c.contains("d", id(2))); // the least recent, let go for e's
        assert!(c.get("f", id(2)).is_none());
        c.drop_dataset("d");
        assert_eq!((c.len(), c.bytes()), (1, 50));
        assert!(c.contains("e", id(0)) && !c.contains("d", id(0)));
    }

    #[test]
    fn a_block_changed_in_memory_is_dropped_not_returned() {
        let c = std::sync::Mutex::new(Cache::new(1000));
        let data = Bytes::from_static(b"tile bytes");
        let good = Cached { data: data.clone(), digest: crate::block::digest(&data) };
        c.lock().unwrap().insert("d", BlockId::new(0, 0, 0), good);
        assert!(Cache::get_verified(&c, "d", BlockId::new(0, 0, 0)).is_some());
        let bad = Cached { data, digest: [0; 16] };
        c.lock().unwrap().insert("d", BlockId::new(0, 1, 0), bad);
        assert!(Cache::get_verified(&c, "d", BlockId::new(0, 1, 0)).is_none());
        let c = c.into_inner().unwrap();
        assert!(!c.contains("d", BlockId::new(0, 1, 0)));
        assert!(c.contains("d", BlockId::new(0, 0, 0)));
        assert_eq!((c.len(), c.bytes()), (1, 10));
    }
}
