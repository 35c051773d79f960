//! Range writers on the object store: one blob pushed over several connections at once (see
//! [`crate::Store::open_upload_range`]), its parts put together from whichever writers'
//! bytes fall in them, each sent as a part of one multipart upload as soon as it is full, in
//! any order.
//!
//! - **Parts:** [`PART_SIZE`] bytes (the last one shorter), each gathered in a pooled buffer
//!   with the byte ranges written into it. Ranges are the client's choice (aligned to its
//!   1 MiB chunks, not to parts), so a part where two ranges meet takes bytes from both
//!   writers; whichever fills it sends it.
//! - **Kept of a part sent:** its chunk digests (xxh3-64, what the commit checks against the
//!   sender's) and the digests of its 1 MiB pieces in the default algorithm (what a resumed
//!   push asks for, `upload_piece_digests`). Not its bytes: a bucket cannot read back an
//!   unfinished multipart upload.
//! - **Written again:** bytes written again into a part already sent (a range started over,
//!   or resumed from a piece that did not check out) make the whole part forgotten: it is
//!   held again once all of it is written again. A commit until then fails naming the part,
//!   and a resumed push, which asks what is held, sends it.
//! - **Commit:** every part stored and every chunk's digest the sender's; then the multipart
//!   upload is completed (the bucket checks each part's ETag, so a stale copy of a part sent
//!   twice cannot take the place of the last) and the catalogue row written as for one
//!   writer's upload. The digest of the whole kept is the sender's: every chunk being the
//!   sender's, it covers these bytes. It must be in the store's algorithm and come with the
//!   sender's chunk digests.
//! - **Lifetime:** in this process only, like one writer's upload here: after a restart, or
//!   on another front end, the upload is routed again and starts over.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bs_meta::UploadRecord;
use bs_wire::{CHUNK_SIZE, ChunkDigests, Digest, DigestAlgo, PooledBuf};
use bytes::Bytes;
use object_store::multipart::PartId;
use object_store::path::Path as ObjPath;
use object_store::{MultipartId, PutPayload};
use tokio::task::JoinHandle;

use crate::error::StoreError;
use crate::object::{Inner, PART_SIZE, PARTS_IN_FLIGHT, os_error, split_upload_id};
use crate::store::{RangeTarget, RangeWriter};

type Result<T> = std::result::Result<T, StoreError>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The parts of one pending upload written by range writers.
pub(crate) struct Ranged {
    name: String,
    upload_id: String,
    key: ObjPath,
    size: u64,
    parts: Mutex<Parts>,
    /// Permits for parts in flight (each part's task holds one until it is stored).
    in_flight: Arc<tokio::sync::Semaphore>,
    /// Range writers open now.
    writers: AtomicUsize,
}

#[derive(Default)]
struct Parts {
    multipart: Option<MultipartId>,
    /// Parts being written, by index.
    filling: HashMap<usize, Arc<Mutex<Filling>>>,
    /// Parts full and sent (or being sent), by index.
    sent: BTreeMap<usize, Sent>,
    /// Parts taken to be sent so far: a part's digests, made outside the lock, are kept only
    /// if the part was not forgotten meanwhile (see [`Sent::send`]).
    sends: u64,
    /// The upload was discarded (aborted, deleted, routed anew): writers still open are
    /// refused.
    abandoned: bool,
}

struct Filling {
    /// `None` once the part is taken to be sent.
    buf: Option<PooledBuf>,
    len: usize,
    /// Byte ranges written, sorted, neither overlapping nor touching.
    written: Vec<Range<usize>>,
}

impl Filling {
    fn write(&mut self, at: usize, data: &[u8]) {
        let buf = self.buf.as_mut().expect("written only while filling");
        buf[at..at + data.len()].copy_from_slice(data);
        add(&mut self.written, at..at + data.len());
    }

    fn full(&self) -> bool {
        self.written.first() == Some(&(0..self.len))
    }

    fn holds(&self, r: &Range<usize>) -> bool {
        self.written.iter().any(|w| w.start <= r.start && r.end <= w.end)
    }
}

/// Add `r` to `v` (sorted ranges, neither overlapping nor touching), merging.
fn add(v: &mut Vec<Range<usize>>, r: Range<usize>) {
    let (mut start, mut end) = (r.start, r.end);
    v.retain(|w| {
        if w.end < start || w.start > end {
            return true;
        }
        (start, end) = (start.min(w.start), end.max(w.end));
        false
    });
    let at = v.partition_point(|w| w.start < start);
    v.insert(at, start..end);
}

struct Sent {
    /// Which send this is (of [`Parts::sends`]).
    send: u64,
    /// xxh3-64 of each chunk of the part, and its digest in the default algorithm; empty
    /// while it is being hashed.
    chunks: Vec<u64>,
    pieces: Vec<Digest>,
    stored: Stored,
}

enum Stored {
    /// Being hashed, or waiting for a place among the parts in flight.
    Hashing,
    Sending(JoinHandle<object_store::Result<PartId>>),
    Done(PartId),
}

impl Ranged {
    pub(crate) fn new(name: &str, upload_id: &str, key: ObjPath, size: u64) -> Self {
        Self {
            name: name.to_string(),
            upload_id: upload_id.to_string(),
            key,
            size,
            parts: Mutex::default(),
            in_flight: Arc::new(tokio::sync::Semaphore::new(PARTS_IN_FLIGHT)),
            writers: AtomicUsize::new(0),
        }
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Whether nothing was written into it yet.
    pub(crate) fn is_empty(&self) -> bool {
        let p = lock(&self.parts);
        p.filling.is_empty() && p.sent.is_empty()
    }

    /// How many bytes from the blob's start it holds without a gap (what a route that
    /// resumes it says is held).
    pub(crate) fn held_prefix(&self) -> u64 {
        let p = lock(&self.parts);
        let mut held = 0;
        for idx in 0..self.count() {
            let len = self.part_len(idx);
            let n = match p.filling.get(&idx) {
                Some(f) => lock(f).written.first().filter(|w| w.start == 0).map_or(0, |w| w.end),
                None if p.sent.contains_key(&idx) => len,
                None => 0,
            };
            held += n as u64;
            if n < len {
                break;
            }
        }
        held
    }

    /// Whether a range writer has it open.
    pub(crate) fn writing(&self) -> bool {
        self.writers.load(Ordering::SeqCst) > 0
    }

    fn count(&self) -> usize {
        self.size.div_ceil(PART_SIZE as u64) as usize
    }

    fn part_len(&self, idx: usize) -> usize {
        (self.size - idx as u64 * PART_SIZE as u64).min(PART_SIZE as u64) as usize
    }

    /// A writer of bytes from `start` on.
    pub(crate) fn writer(self: &Arc<Self>, store: Arc<Inner>, start: u64) -> RangeWriter<ObjRange> {
        self.writers.fetch_add(1, Ordering::SeqCst);
        let (name, id) = (self.name.clone(), self.upload_id.clone());
        let target = ObjRange { store, ranged: self.clone() };
        RangeWriter { name, id, size: self.size, received: start, target }
    }

    fn write(&self, i: &Inner, mut offset: u64, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let idx = (offset / PART_SIZE as u64) as usize;
            let at = (offset % PART_SIZE as u64) as usize;
            let n = data.len().min(self.part_len(idx) - at);
            let (f, full) = loop {
                let f = self.filling_of(i, idx)?;
                let mut g = lock(&f);
                if g.buf.is_none() {
                    continue; // sent a moment ago: these bytes write it again
                }
                g.write(at, &data[..n]);
                let full = g.full();
                drop(g);
                break (f, full);
            };
            if full {
                self.send(i, idx, &f)?;
            }
            offset += n as u64;
            data = &data[n..];
        }
        Ok(())
    }

    /// The part `idx` being written, begun if it is not (forgetting it if it was sent).
    fn filling_of(&self, i: &Inner, idx: usize) -> Result<Arc<Mutex<Filling>>> {
        let mut p = lock(&self.parts);
        if p.abandoned {
            return Err(StoreError::NoUpload(self.name.clone()));
        }
        if let Some(f) = p.filling.get(&idx) {
            return Ok(f.clone());
        }
        // Bytes of a part sent already, written again: the part is forgotten whole.
        if p.sent.remove(&idx).is_some() {
            tracing::debug!(blob = %self.name, part = idx, "a part sent is written again");
        }
        let buf = Some(i.part_buffers.get());
        let f = Arc::new(Mutex::new(Filling { buf, len: self.part_len(idx), written: Vec::new() }));
        p.filling.insert(idx, f.clone());
        Ok(f)
    }

    /// Send part `idx`, full in `f`, unless another writer took it first.
    fn send(&self, i: &Inner, idx: usize, f: &Arc<Mutex<Filling>>) -> Result<()> {
        let (buf, len, send) = {
            let mut p = lock(&self.parts);
            let mut g = lock(f);
            if !g.full() {
                return Ok(());
            }
            let Some(buf) = g.buf.take() else { return Ok(()) };
            if p.filling.get(&idx).is_some_and(|x| Arc::ptr_eq(x, f)) {
                p.filling.remove(&idx);
            }
            p.sends += 1;
            let send = p.sends;
            let sent =
                Sent { send, chunks: Vec::new(), pieces: Vec::new(), stored: Stored::Hashing };
            p.sent.insert(idx, sent);
            (buf, g.len, send)
        };
        let part = Bytes::from_owner(buf).slice(..len);
        let chunks = ChunkDigests::of(&part).sums().to_vec();
        let algo = DigestAlgo::default();
        let pieces: Vec<Digest> =
            part.chunks(CHUNK_SIZE as usize).map(|c| algo.digest(c)).collect();
        let mp = match self.multipart(i) {
            Ok(mp) => mp,
            Err(e) => {
                let mut p = lock(&self.parts);
                if p.sent.get(&idx).is_some_and(|s| s.send == send) {
                    p.sent.remove(&idx);
                }
                return Err(e);
            }
        };
        let permit = i
            .block_on(self.in_flight.clone().acquire_owned())
            .expect("the semaphore is never closed");
        let (os, key, payload) = (i.os.clone(), self.key.clone(), PutPayload::from(part));
        let handle = i.rt.spawn(async move {
            let stored = os.put_part(&key, &mp, idx, payload).await;
            drop(permit);
            stored
        });
        let mut p = lock(&self.parts);
        // Forgotten meanwhile (written again), this send counts for nothing: should it land
        // after the part's next send, the completion names that one's ETag and fails.
        if let Some(s) = p.sent.get_mut(&idx).filter(|s| s.send == send) {
            (s.chunks, s.pieces, s.stored) = (chunks, pieces, Stored::Sending(handle));
        }
        Ok(())
    }

    /// The multipart upload, started by the first part sent.
    fn multipart(&self, i: &Inner) -> Result<MultipartId> {
        let mut p = lock(&self.parts);
        if let Some(mp) = &p.multipart {
            return Ok(mp.clone());
        }
        let mp = i
            .block_on(i.os.create_multipart(&self.key))
            .map_err(|e| os_error("starting a multipart upload", e))?;
        // Recorded so a front end that expires this upload can abort it.
        if let Some(u) = i.cat.upload(&self.name)?
            && split_upload_id(&u.upload_id).0 == self.upload_id
        {
            i.cat
                .put_upload(&UploadRecord { upload_id: format!("{} {mp}", self.upload_id), ..u })?;
        }
        p.multipart = Some(mp.clone());
        Ok(mp)
    }

    /// Digests of the 1 MiB pieces of `offset..offset + len` in `algo`, as far as this upload
    /// holds them whole (see `Store::upload_piece_digests`): none in a piece size or
    /// algorithm other than the ones kept.
    pub(crate) fn piece_digests(
        &self,
        offset: u64,
        len: u64,
        piece: u64,
        algo: DigestAlgo,
    ) -> Vec<Digest> {
        let mut out = Vec::new();
        if piece != CHUNK_SIZE
            || algo != DigestAlgo::default()
            || !offset.is_multiple_of(CHUNK_SIZE)
        {
            return out;
        }
        let end = offset.saturating_add(len).min(self.size);
        let p = lock(&self.parts);
        let mut at = offset;
        while at < end {
            let chunk = CHUNK_SIZE.min(self.size - at);
            if end - at < chunk {
                break; // a piece cut short inside the blob: not one kept
            }
            let idx = (at / PART_SIZE as u64) as usize;
            let inside = (at % PART_SIZE as u64) as usize;
            let digest = if let Some(f) = p.filling.get(&idx) {
                let g = lock(f);
                let r = inside..inside + chunk as usize;
                match &g.buf {
                    Some(buf) if g.holds(&r) => algo.digest(&buf[r]),
                    _ => break,
                }
            } else {
                let sent = p.sent.get(&idx).filter(|s| !matches!(s.stored, Stored::Hashing));
                match sent.and_then(|s| s.pieces.get(inside / CHUNK_SIZE as usize)) {
                    Some(d) => d.clone(),
                    None => break,
                }
            };
            out.push(digest);
            at += chunk;
        }
        out
    }

    /// For the commit: once every part is stored and every chunk is the sender's, the chunk
    /// digests and the completion of the multipart upload, under way.
    pub(crate) fn complete(
        &self,
        i: &Inner,
        expected: &Digest,
        sender: Option<&ChunkDigests>,
    ) -> Result<(ChunkDigests, JoinHandle<object_store::Result<()>>)> {
        let name = &self.name;
        let Some(sender) = sender.filter(|_| expected.algo == i.algo) else {
            return Err(StoreError::Unsupported(format!(
                "the ranges of {name:?} are checked by the sender's chunk digests, with its \
                 digest of the whole in {}: commit with both",
                i.algo.name()
            )));
        };
        let mut p = lock(&self.parts);
        let mut failed = None;
        for (idx, s) in p.sent.iter_mut() {
            if let Stored::Sending(h) = &mut s.stored {
                match i.block_on(h) {
                    Ok(Ok(id)) => s.stored = Stored::Done(id),
                    Ok(Err(e)) => failed = failed.or(Some((*idx, e.to_string()))),
                    Err(e) => failed = failed.or(Some((*idx, e.to_string()))),
                }
            }
        }
        if let Some((idx, e)) = failed {
            // Every part that failed is forgotten, so a resumed push sends it again.
            p.sent.retain(|_, s| matches!(s.stored, Stored::Done(_)));
            return Err(StoreError::Unavailable(format!(
                "object store: storing part {} of {name:?}: {e} (resume the push to send it again)",
                idx + 1
            )));
        }
        let held =
            |idx: usize| p.sent.get(&idx).is_some_and(|s| matches!(s.stored, Stored::Done(_)));
        if let Some(idx) = (0..self.count()).find(|&idx| !held(idx)) {
            let received =
                (0..self.count()).filter(|&k| held(k)).map(|k| self.part_len(k) as u64).sum();
            tracing::info!(
                blob = %name,
                part = idx,
                "the ranges' commit misses bytes {}.. of part {}",
                idx as u64 * PART_SIZE as u64,
                idx + 1
            );
            return Err(StoreError::Incomplete { name: name.clone(), received, size: self.size });
        }
        let mut sums = Vec::with_capacity(self.size.div_ceil(CHUNK_SIZE) as usize);
        let mut parts = Vec::with_capacity(self.count());
        for s in p.sent.values() {
            sums.extend_from_slice(&s.chunks);
            if let Stored::Done(id) = &s.stored {
                parts.push(id.clone());
            }
        }
        let corrupt = |reason: String| StoreError::Corrupt { name: name.clone(), reason };
        let chunks =
            ChunkDigests::from_sums(self.size, sums).map_err(|e| corrupt(e.to_string()))?;
        if sender.size() != self.size || sender.chunk_size() != CHUNK_SIZE {
            return Err(corrupt(format!(
                "the sender's chunk digests are of {} bytes in chunks of {}, the upload is {} \
                 bytes in chunks of {CHUNK_SIZE}",
                sender.size(),
                sender.chunk_size(),
                self.size
            )));
        }
        if let Some(c) = (0..chunks.count()).find(|&c| chunks.sum(c) != sender.sum(c)) {
            let r = chunks.range(c);
            return Err(corrupt(format!(
                "chunk {c} (bytes {}..{}) is not the sender's",
                r.start, r.end
            )));
        }
        let mp = p.multipart.clone().expect("a part was sent, so the upload was started");
        let (os, key) = (i.os.clone(), self.key.clone());
        let storing =
            i.rt.spawn(async move { os.complete_multipart(&key, &mp, parts).await.map(drop) });
        Ok((chunks, storing))
    }

    /// Forget every part (a commit that did not land: the writers send everything again),
    /// and abort the multipart upload.
    pub(crate) fn start_over(&self, i: &Inner) {
        let mut p = lock(&self.parts);
        for s in std::mem::take(&mut p.sent).into_values() {
            if let Stored::Sending(h) = s.stored {
                h.abort();
            }
        }
        p.filling.clear();
        if let Some(mp) = p.multipart.take()
            && let Err(e) = i.block_on(i.os.abort_multipart(&self.key, &mp))
        {
            // Already completed, it is not there to abort.
            tracing::debug!(key = %self.key, error = %e, "cannot abort a multipart upload");
        }
    }

    /// The upload is discarded: [`Ranged::start_over`], and refuse its writers.
    pub(crate) fn abandon(&self, i: &Inner) {
        lock(&self.parts).abandoned = true;
        self.start_over(i);
    }
}

/// Where a range writer writes (see [`RangeWriter`]): the parts of the upload (see the
/// module's doc). Bytes past a rollback stay until written again: the commit checks every
/// chunk against the sender's, and a resumed push compares the pieces held with its own.
pub(crate) struct ObjRange {
    store: Arc<Inner>,
    ranged: Arc<Ranged>,
}

impl Drop for ObjRange {
    fn drop(&mut self) {
        self.ranged.writers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl RangeTarget for ObjRange {
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.ranged.write(&self.store, offset, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_ranges_merge_when_they_meet_or_overlap() {
        let mut v = Vec::new();
        for r in [4..6, 0..2, 8..9, 2..3, 5..8] {
            add(&mut v, r);
        }
        assert_eq!(v, [0..3, 4..9]);
        add(&mut v, 3..4);
        assert_eq!(v, vec![Range { start: 0, end: 9 }]);
        add(&mut v, 1..2);
        assert_eq!(v, vec![Range { start: 0, end: 9 }]);
    }
}
