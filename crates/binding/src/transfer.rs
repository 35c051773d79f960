//! The rules of a blob transfer, without I/O: what a `DATA` frame may carry, when a `SUM`
//! verifies, what is rolled back and what is committed. The server's data plane and the
//! client's streams both drive these (before bindings, the rules were written twice, inline
//! with the socket code on each side).
//!
//! A transfer is a binding: its bytes travel as `DATA` frames of at most the negotiated chunk
//! size — raw, or through the profile's message layers ([`crate::carry`]) — its end-to-end
//! digest is in the closing `SUM` (the digest algorithm is the profile's), and "encrypt" is
//! the connection's TLS.

use bs_wire::{Digest, ErrorCode};

/// A broken rule: what to tell the peer, and where a push rolls back to (if anywhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub code: ErrorCode,
    pub message: String,
    /// Push: truncate the upload back to here before answering.
    pub rollback_to: Option<u64>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The receiving end of a push (the server).
#[derive(Debug, Clone)]
pub struct PushReceiver {
    start: u64,
    end: u64,
    pos: u64,
    size: Option<u64>,
    max_unsized: u64,
}

/// What a verified `SUM` asks of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Final: drop any bytes past the verified end, then commit.
    pub commit: bool,
    /// Truncate the upload to this length first.
    pub truncate_to: Option<u64>,
    /// A final transfer from byte 0: after the truncation its digest is the whole blob's.
    pub covers_whole: bool,
}

impl PushReceiver {
    /// A push granted `offset+length` into an upload of `size` (if known) that holds
    /// `received` bytes; uploads of unknown size may not grow past `max_unsized`.
    pub fn new(
        offset: u64,
        length: u64,
        size: Option<u64>,
        received: u64,
        max_unsized: u64,
    ) -> Result<Self, Violation> {
        if offset > received {
            return Err(Violation {
                code: ErrorCode::OutOfRange,
                message: format!(
                    "write at offset {offset} leaves a gap: only {received} bytes received so far"
                ),
                rollback_to: None,
            });
        }
        Ok(Self {
            start: offset,
            end: offset.saturating_add(length),
            pos: offset,
            size,
            max_unsized,
        })
    }

    /// Blob offset of the next byte expected.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Bytes received (and verified so far by nobody) in this transfer.
    pub fn received(&self) -> u64 {
        self.pos - self.start
    }

    /// A `DATA` header arrived: may its payload be taken?
    pub fn on_data(&self, offset: u64, len: u64) -> Result<(), Violation> {
        let roll = Some(self.start);
        if self.size.is_none() && offset.checked_add(len).is_none_or(|e| e > self.max_unsized) {
            return Err(Violation {
                code: ErrorCode::OutOfRange,
                message: format!(
                    "DATA {offset}+{len} would take an upload of unknown size past this \
                     server's limit of {} bytes; declare the size when routing",
                    self.max_unsized
                ),
                rollback_to: roll,
            });
        }
        let past_size = self.size.is_some_and(|s| offset.saturating_add(len) > s);
        if offset != self.pos || offset.checked_add(len).is_none_or(|e| e > self.end) || past_size {
            return Err(Violation {
                code: ErrorCode::OutOfRange,
                message: format!(
                    "DATA {offset}+{len} outside the granted range {}+{} of a blob of {} bytes (next byte {})",
                    self.start,
                    self.end - self.start,
                    self.size.map_or("unknown".into(), |s| s.to_string()),
                    self.pos
                ),
                rollback_to: roll,
            });
        }
        Ok(())
    }

    /// `n` payload bytes were stored.
    pub fn advance(&mut self, n: u64) {
        self.pos += n;
    }

    /// Any other frame where `DATA` or `SUM` was due.
    pub fn unexpected(&self, what: &str) -> Violation {
        Violation {
            code: ErrorCode::BadFrame,
            message: format!("expected DATA or SUM, got {what}"),
            rollback_to: Some(self.start),
        }
    }

    /// The sender's `SUM`: `ours` is the digest of what arrived.
    pub fn on_sum(
        &self,
        total: u64,
        final_: bool,
        digest: &Digest,
        ours: &Digest,
    ) -> Result<Verified, Violation> {
        let got = self.pos - self.start;
        if total != got || digest != ours {
            return Err(Violation {
                code: ErrorCode::ChecksumMismatch,
                message: format!(
                    "received {got} bytes with digest {ours}, sender says {total} bytes with {digest}; the transfer was rolled back"
                ),
                rollback_to: Some(self.start),
            });
        }
        Ok(Verified {
            commit: final_,
            // Commit ends with this verified transfer: bytes an earlier, unconfirmed transfer
            // left past it are dropped, never committed unchecked.
            truncate_to: final_.then_some(self.pos),
            covers_whole: final_ && self.start == 0,
        })
    }
}

/// The sending end of a pull (the server): what is sent and whether the stored digest
/// stands in for hashing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSender {
    pub offset: u64,
    pub length: u64,
    /// The whole blob is asked for in the algorithm it is stored with: send that digest.
    pub stored_digest: Option<Digest>,
}

impl PullSender {
    /// Check a granted range against the blob as it is now.
    pub fn new(
        name: &str,
        offset: u64,
        length: u64,
        size: u64,
        digest: &str,
        granted_digest: Option<&str>,
        algo: bs_wire::DigestAlgo,
    ) -> Result<Self, Violation> {
        if granted_digest.is_some_and(|d| d != digest) {
            return Err(Violation {
                code: ErrorCode::NotFound,
                message: format!("blob {name:?} changed since negotiation"),
                rollback_to: None,
            });
        }
        if offset.checked_add(length).is_none_or(|e| e > size) {
            return Err(Violation {
                code: ErrorCode::OutOfRange,
                message: format!("range {offset}+{length} is outside {name:?} ({size} bytes)"),
                rollback_to: None,
            });
        }
        let stored = (offset == 0 && length == size)
            .then(|| digest.parse::<Digest>().ok())
            .flatten()
            .filter(|d| d.algo == algo);
        Ok(Self { offset, length, stored_digest: stored })
    }
}

/// The receiving end of a pull (the client).
#[derive(Debug, Clone)]
pub struct PullReceiver {
    offset: u64,
    len: u64,
    got: u64,
    in_frame: u64,
}

impl PullReceiver {
    pub fn new(offset: u64, len: u64) -> Self {
        Self { offset, len, got: 0, in_frame: 0 }
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes delivered so far.
    pub fn got(&self) -> u64 {
        self.got
    }
    pub fn left(&self) -> u64 {
        self.len - self.got
    }
    /// Payload bytes of the current `DATA` frame still to read.
    pub fn in_frame(&self) -> u64 {
        self.in_frame
    }

    /// A `DATA` header must continue exactly where the last ended, and stay in range.
    pub fn on_data(&mut self, offset: u64, len: u64) -> Result<(), String> {
        let at = self.offset + self.got;
        if offset == at && len > 0 && len <= self.left() {
            self.in_frame = len;
            Ok(())
        } else {
            Err(format!(
                "expected DATA at {at} of at most {} bytes, got DATA {offset}+{len}",
                self.left()
            ))
        }
    }

    /// `n` payload bytes were read.
    pub fn advance(&mut self, n: u64) {
        debug_assert!(n <= self.in_frame);
        self.got += n;
        self.in_frame -= n;
    }

    /// The closing `SUM`, against the digest of what arrived.
    pub fn on_sum(
        &self,
        total: u64,
        digest: &Digest,
        ours: &Digest,
    ) -> Result<(), (String, String)> {
        if total != self.len || digest != ours {
            return Err((digest.to_string(), ours.to_string()));
        }
        Ok(())
    }
}

/// The sending end of a push (the client).
#[derive(Debug, Clone)]
pub struct PushSender {
    chunk: usize,
    start: u64,
    next: u64,
    end: u64,
}

impl PushSender {
    pub fn new(offset: u64, length: u64, chunk: u32) -> Self {
        Self {
            chunk: (chunk as usize).max(1),
            start: offset,
            next: offset,
            end: offset.saturating_add(length),
        }
    }
    pub fn position(&self) -> u64 {
        self.next
    }
    pub fn sent(&self) -> u64 {
        self.next - self.start
    }
    pub fn chunk(&self) -> usize {
        self.chunk
    }
    /// May `len` more bytes go?
    pub fn check(&self, len: usize) -> Result<(), String> {
        if self.next.checked_add(len as u64).is_none_or(|e| e > self.end) {
            return Err(format!(
                "push of {len} more bytes at {} exceeds the negotiated end {}",
                self.next, self.end
            ));
        }
        Ok(())
    }
    pub fn advance(&mut self, n: usize) {
        self.next += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bs_wire::DigestAlgo;

    #[test]
    fn a_push_takes_only_the_next_bytes_in_range() {
        let mut r = PushReceiver::new(10, 100, Some(200), 10, 1 << 30).unwrap();
        r.on_data(10, 50).unwrap();
        r.advance(50);
        let e = r.on_data(10, 10).unwrap_err();
        assert_eq!((e.code, e.rollback_to), (ErrorCode::OutOfRange, Some(10)));
        assert!(r.on_data(60, 51).is_err(), "past the granted end");
        r.on_data(60, 50).unwrap();
        assert!(PushReceiver::new(20, 1, None, 10, 100).is_err(), "a gap");
        let open_ended = PushReceiver::new(0, u64::MAX, None, 0, 100).unwrap();
        assert!(open_ended.on_data(0, 101).unwrap_err().message.contains("unknown size"));
    }

    #[test]
    fn a_sum_verifies_count_and_digest_or_rolls_back() {
        let mut r = PushReceiver::new(0, 3, Some(3), 0, 0).unwrap();
        r.on_data(0, 3).unwrap();
        r.advance(3);
        let d = DigestAlgo::Xxh3_128.digest(b"abc");
        let v = r.on_sum(3, true, &d, &d).unwrap();
        assert_eq!(v, Verified { commit: true, truncate_to: Some(3), covers_whole: true });
        let other = DigestAlgo::Xxh3_128.digest(b"abd");
        let e = r.on_sum(3, true, &d, &other).unwrap_err();
        assert_eq!((e.code, e.rollback_to), (ErrorCode::ChecksumMismatch, Some(0)));
        assert!(r.on_sum(2, true, &d, &d).is_err(), "count differs");
    }

    #[test]
    fn a_pull_reader_wants_contiguous_frames_and_the_exact_sum() {
        let mut p = PullReceiver::new(100, 10);
        assert!(p.on_data(101, 5).is_err());
        assert!(p.on_data(100, 11).is_err());
        assert!(p.on_data(100, 0).is_err());
        p.on_data(100, 6).unwrap();
        p.advance(6);
        p.on_data(106, 4).unwrap();
        p.advance(4);
        let d = DigestAlgo::Blake3.digest(b"x");
        p.on_sum(10, &d, &d).unwrap();
        assert!(p.on_sum(9, &d, &d).is_err());
    }

    #[test]
    fn a_pull_of_the_whole_blob_reuses_its_stored_digest() {
        let d = DigestAlgo::Xxh3_128.digest(b"abc").to_string();
        let whole = PullSender::new("b", 0, 3, 3, &d, Some(&d), DigestAlgo::Xxh3_128).unwrap();
        assert!(whole.stored_digest.is_some());
        let part = PullSender::new("b", 1, 2, 3, &d, None, DigestAlgo::Xxh3_128).unwrap();
        assert!(part.stored_digest.is_none());
        let other = PullSender::new("b", 0, 3, 3, &d, None, DigestAlgo::Blake3).unwrap();
        assert!(other.stored_digest.is_none());
        let changed = PullSender::new("b", 0, 3, 3, &d, Some("xxh3-128:00"), DigestAlgo::Xxh3_128);
        assert_eq!(changed.unwrap_err().code, ErrorCode::NotFound);
        assert!(PullSender::new("b", 2, 2, 3, &d, None, DigestAlgo::Xxh3_128).is_err());
    }

    #[test]
    fn a_push_sender_stays_inside_its_grant() {
        let mut s = PushSender::new(5, 10, 4);
        s.check(10).unwrap();
        assert!(s.check(11).is_err());
        s.advance(8);
        assert_eq!((s.position(), s.sent()), (13, 8));
        assert!(s.check(3).is_err());
    }
}
