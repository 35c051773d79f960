//! One client's request lists on one block server, without I/O: which blocks to read, which
//! to send next, what a new list flushes (the ISS request semantics).
//!
//! - **High**: sent in list order — the first high block that is ready goes first.
//! - **Medium**: sent only when no high block is ready.
//! - **Low**: read into the cache, never sent.
//! - A new list replaces the old one: every request of the old list not yet served is flushed
//!   (counted in its `DONE`); blocks already read stay in the cache, so asking again is a hit.
//! - A block sent that the client had not read yet when it made its new list (the list says
//!   how many blocks it had read) is on its way: the new list's request for it is dropped
//!   (counted `in_flight`), not sent twice. A client that asks again every tile it still
//!   waits for would otherwise get each one sent while it asked duplicated.
//!
//! Every list ends with exactly one `DONE`: when each of its requests is sent, failed or (low)
//! cached, or when the next list replaces it.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use crate::block::{BlockId, Priority};
use crate::cache::Cached;
use crate::msg::ListStats;

#[derive(Debug, Clone)]
enum State {
    /// Waiting for its disk read.
    Wanted,
    Ready(Cached),
    /// Sent (high, medium), read into the cache (low), or failed.
    Served,
}

#[derive(Debug, Clone)]
struct Entry {
    id: BlockId,
    prio: Priority,
    state: State,
}

/// What the server sends next on the client's `blocks` connection.
#[derive(Debug, Clone)]
pub enum Out {
    Block { seq: u32, dataset: Arc<str>, id: BlockId, block: Cached },
    Failed { seq: u32, id: BlockId, reason: String },
    Done { seq: u32, stats: ListStats },
}

/// A read the server must queue on the block's disk.
pub type Read = (BlockId, Priority);

#[derive(Debug)]
pub struct Lists {
    seq: u32,
    dataset: Arc<str>,
    entries: Vec<Entry>,
    stats: ListStats,
    /// The current list's `DONE` is sent (or there is no list yet).
    finished: bool,
    /// Failures and `DONE`s waiting to go out, before any block.
    outbox: VecDeque<Out>,
    /// Blocks given out to send so far, and the ids of the last [`SENT_LOG`] of them.
    given: u64,
    sent_log: VecDeque<BlockId>,
}

/// How many of the last blocks sent a session remembers, to tell those still on their way.
const SENT_LOG: usize = 4096;

impl Default for Lists {
    fn default() -> Self {
        Self::new()
    }
}

impl Lists {
    /// No list yet (so nothing to flush).
    pub fn new() -> Self {
        Self {
            seq: 0,
            dataset: "".into(),
            entries: Vec::new(),
            stats: ListStats::default(),
            finished: true,
            outbox: VecDeque::new(),
            given: 0,
            sent_log: VecDeque::new(),
        }
    }

    /// Replace the current list by `entries` (numbered `seq`, made by a client that had read
    /// `got` blocks). `cached` finds a block already in the cache; `known` says whether the
    /// data set has the block. Returns the reads to queue, in list order. A block asked twice
    /// is served once, at its first place; one sent since the client's `got`th is not served
    /// again.
    pub fn replace(
        &mut self,
        seq: u32,
        got: u64,
        dataset: &str,
        entries: &[(BlockId, Priority)],
        mut cached: impl FnMut(BlockId) -> Option<Cached>,
        mut known: impl FnMut(BlockId) -> bool,
    ) -> Vec<Read> {
        if !self.finished {
            let unserved = self.entries.iter().filter(|e| !matches!(e.state, State::Served));
            self.stats.flushed = unserved.count() as u32;
            self.outbox.push_back(Out::Done { seq: self.seq, stats: self.stats });
        }
        self.seq = seq;
        self.dataset = dataset.into();
        self.stats = ListStats::default();
        self.entries.clear();
        self.finished = false;
        // The blocks sent after the client's `got`th (those still remembered).
        let ahead = self.given.saturating_sub(got).min(self.sent_log.len() as u64) as usize;
        let mut seen: HashSet<BlockId> = self.sent_log.iter().rev().take(ahead).copied().collect();
        let mut in_flight = seen.clone();
        let mut reads = Vec::new();
        for &(id, prio) in entries {
            if !seen.insert(id) {
                // Counted once, however often the list names it.
                if in_flight.remove(&id) {
                    self.stats.in_flight += 1;
                }
                continue;
            }
            self.stats.requested += 1;
            let state = if !known(id) {
                self.stats.failed += 1;
                let reason = format!("data set {dataset:?} has no block {id}");
                self.outbox.push_back(Out::Failed { seq, id, reason });
                State::Served
            } else if let Some(c) = cached(id) {
                self.stats.cache_hits += 1;
                if prio == Priority::Low { State::Served } else { State::Ready(c) }
            } else {
                reads.push((id, prio));
                State::Wanted
            };
            self.entries.push(Entry { id, prio, state });
        }
        self.check_finished();
        reads
    }

    /// Failures and `DONE`s waiting to go out.
    pub fn unsent(&self) -> usize {
        self.outbox.len()
    }

    /// Whether the current list still waits for any read.
    pub fn waiting(&self) -> bool {
        self.entries.iter().any(|e| matches!(e.state, State::Wanted))
    }

    /// Whether list `seq` still wants `id` read (a flushed list's reads are skipped).
    pub fn wants(&self, seq: u32, id: BlockId) -> bool {
        seq == self.seq
            && self.entries.iter().any(|e| e.id == id && matches!(e.state, State::Wanted))
    }

    /// A read for list `seq` finished: the block (`from_cache` when another read had already
    /// brought it in) or why it cannot be had.
    pub fn on_read(&mut self, seq: u32, id: BlockId, got: Result<(Cached, bool), String>) {
        if seq != self.seq {
            return;
        }
        let Some(e) =
            self.entries.iter_mut().find(|e| e.id == id && matches!(e.state, State::Wanted))
        else {
            return;
        };
        match got {
            Ok((c, from_cache)) => {
                if from_cache {
                    self.stats.cache_hits += 1;
                } else {
                    self.stats.read += 1;
                }
                e.state = if e.prio == Priority::Low { State::Served } else { State::Ready(c) };
            }
            Err(reason) => {
                e.state = State::Served;
                self.stats.failed += 1;
                self.outbox.push_back(Out::Failed { seq, id, reason });
            }
        }
        self.check_finished();
    }

    /// What to send next, if anything is ready: failures and `DONE`s first, then the first
    /// ready high block, then the first ready medium block.
    pub fn next_out(&mut self) -> Option<Out> {
        if let Some(o) = self.outbox.pop_front() {
            return Some(o);
        }
        let ready =
            |p: Priority| move |e: &Entry| e.prio == p && matches!(e.state, State::Ready(_));
        let i = self
            .entries
            .iter()
            .position(ready(Priority::High))
            .or_else(|| self.entries.iter().position(ready(Priority::Medium)))?;
        let e = &mut self.entries[i];
        let State::Ready(block) = std::mem::replace(&mut e.state, State::Served) else {
            unreachable!("position() found a ready entry")
        };
        self.stats.sent += 1;
        self.given += 1;
        self.sent_log.push_back(e.id);
        if self.sent_log.len() > SENT_LOG {
            self.sent_log.pop_front();
        }
        let out = Out::Block { seq: self.seq, dataset: self.dataset.clone(), id: e.id, block };
        self.check_finished();
        Some(out)
    }

    fn check_finished(&mut self) {
        if !self.finished && self.entries.iter().all(|e| matches!(e.state, State::Served)) {
            self.finished = true;
            self.outbox.push_back(Out::Done { seq: self.seq, stats: self.stats });
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn id(x: u32) -> BlockId {
        BlockId::new(0, x, 0)
    }

    fn blk(x: u32) -> Cached {
        Cached { data: Bytes::from(vec![x as u8]), digest: [0; 16] }
    }

    fn sent(l: &mut Lists) -> Vec<String> {
        std::iter::from_fn(|| l.next_out())
            .map(|o| match o {
                Out::Block { id, .. } => format!("B{}", id.x),
                Out::Failed { id, .. } => format!("F{}", id.x),
                Out::Done { seq, stats } => format!("D{seq}:{}/{}", stats.sent, stats.flushed),
            })
            .collect()
    }

    #[test]
    fn waiting_while_any_read_is_outstanding() {
        let mut l = Lists::new();
        assert!(!l.waiting(), "no list yet");
        l.replace(
            1,
            0,
            "d",
            &[(id(1), Priority::High), (id(2), Priority::Low)],
            |_| None,
            |_| true,
        );
        assert!(l.waiting());
        l.on_read(1, id(1), Ok((blk(1), false)));
        assert!(l.waiting(), "the low read is still out");
        l.on_read(1, id(2), Ok((blk(2), false)));
        assert!(!l.waiting());
        // Cached blocks need no read; a block the data set lacks fails at once.
        l.replace(
            2,
            0,
            "d",
            &[(id(3), Priority::High), (id(4), Priority::High)],
            |b| (b == id(3)).then(|| blk(3)),
            |b| b != id(4),
        );
        assert!(!l.waiting());
    }

    #[test]
    fn high_goes_in_list_order_medium_only_when_no_high_is_ready_low_never() {
        let mut l = Lists::new();
        let list = [
            (id(1), Priority::High),
            (id(2), Priority::Medium),
            (id(3), Priority::High),
            (id(4), Priority::Low),
        ];
        let reads = l.replace(1, 0, "d", &list, |_| None, |_| true);
        assert_eq!(reads.len(), 4);
        // Reads finish out of order: the medium first, then the second high.
        l.on_read(1, id(2), Ok((blk(2), false)));
        l.on_read(1, id(3), Ok((blk(3), false)));
        // High 3 is ready, so it goes before medium 2; high 1 is not ready yet.
        assert_eq!(
            l.next_out().map(|o| matches!(o, Out::Block { id, .. } if id.x == 3)),
            Some(true)
        );
        // Now no high block is ready: the medium one goes.
        assert_eq!(sent(&mut l), ["B2"]);
        l.on_read(1, id(1), Ok((blk(1), false)));
        l.on_read(1, id(4), Ok((blk(4), false)));
        // The low block is read but never sent; then the list is done.
        assert_eq!(sent(&mut l), ["B1", "D1:3/0"]);
    }

    #[test]
    fn a_new_list_flushes_the_unserved_and_cached_blocks_come_first() {
        let mut l = Lists::new();
        let first = [(id(1), Priority::High), (id(2), Priority::High), (id(3), Priority::Medium)];
        l.replace(1, 0, "d", &first, |_| None, |_| true);
        l.on_read(1, id(1), Ok((blk(1), false)));
        assert_eq!(sent(&mut l), ["B1"]);
        l.on_read(1, id(2), Ok((blk(2), false))); // read (so cached) but not yet sent
        // The new list asks 2 again (a cache hit) and 5 (a read).
        let second = [(id(5), Priority::High), (id(2), Priority::High)];
        let cache = |b: BlockId| (b.x == 2).then(|| blk(2));
        let reads = l.replace(2, 0, "d", &second, cache, |_| true);
        assert_eq!(reads, [(id(5), Priority::High)]);
        // The old list's late read is ignored; it reports two flushed (2 unsent, 3 unread).
        l.on_read(1, id(3), Ok((blk(3), false)));
        assert!(!l.wants(1, id(3)));
        assert_eq!(sent(&mut l), ["D1:1/2", "B2"]);
        l.on_read(2, id(5), Ok((blk(5), false)));
        assert_eq!(sent(&mut l), ["B5", "D2:2/0"]);
    }

    #[test]
    fn unknown_and_failed_blocks_are_reported_and_duplicates_served_once() {
        let mut l = Lists::new();
        let list = [(id(1), Priority::High), (id(9), Priority::High), (id(1), Priority::Low)];
        let reads = l.replace(7, 0, "d", &list, |_| None, |b| b.x != 9);
        assert_eq!(reads, [(id(1), Priority::High)]);
        l.on_read(7, id(1), Err("digest".into()));
        let out: Vec<_> = std::iter::from_fn(|| l.next_out()).collect();
        assert!(
            matches!(&out[0], Out::Failed { id, reason, .. } if id.x == 9 && reason.contains("no block"))
        );
        assert!(
            matches!(&out[1], Out::Failed { id, reason, .. } if id.x == 1 && reason == "digest")
        );
        assert!(
            matches!(&out[2], Out::Done { stats, .. } if stats.failed == 2 && stats.requested == 2)
        );
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn a_block_on_its_way_is_not_sent_again_by_the_next_list() {
        let mut l = Lists::new();
        let (high, medium) = (Priority::High, Priority::Medium);
        let cache = |b: BlockId| (b.x != 4).then(|| blk(b.x));
        l.replace(1, 0, "d", &[(id(1), high), (id(2), medium), (id(3), medium)], cache, |_| true);
        assert_eq!(
            l.next_out().map(|o| matches!(o, Out::Block { id, .. } if id.x == 1)),
            Some(true)
        );
        assert_eq!(
            l.next_out().map(|o| matches!(o, Out::Block { id, .. } if id.x == 2)),
            Some(true)
        );
        // Made before the client read either: 2 is on its way, 3 and 4 are asked.
        let list = [(id(2), high), (id(3), high), (id(4), high)];
        assert_eq!(l.replace(2, 0, "d", &list, cache, |_| true), [(id(4), high)]);
        l.on_read(2, id(4), Ok((blk(4), false)));
        assert_eq!(sent(&mut l), ["D1:2/1", "B3", "B4", "D2:2/0"]);
        // Having read 1 of the 4 blocks sent, the client asks 2 and 3 again: both are still
        // on their way. Once it has read all 4, 2 asked again is sent again.
        l.replace(3, 1, "d", &[(id(2), high), (id(3), high)], cache, |_| true);
        assert_eq!(sent(&mut l), ["D3:0/0"]);
        assert_eq!(l.stats.in_flight, 2);
        l.replace(4, 4, "d", &[(id(2), high)], cache, |_| true);
        assert_eq!(sent(&mut l), ["B2", "D4:1/0"]);
    }

    #[test]
    fn a_list_served_wholly_from_the_cache_is_done_at_once() {
        let mut l = Lists::new();
        l.replace(1, 0, "d", &[(id(1), Priority::Low)], |_| Some(blk(1)), |_| true);
        assert_eq!(sent(&mut l), ["D1:0/0"]);
        // An empty list is done at once too, and a finished list flushes nothing.
        l.replace(2, 0, "d", &[], |_| None, |_| true);
        assert_eq!(sent(&mut l), ["D2:0/0"]);
    }
}
