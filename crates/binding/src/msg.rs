//! Messages in pooled buffers with headroom (GOPI's msg module): a layer pushes its header
//! into the space in front of the payload and pops it on the way up, so no layer copies the
//! payload to add or remove a header.
//!
//! ```text
//!   buf: [ headroom ........ | hdr_n … hdr_1 | payload ............ | spare ]
//!                            ^start                                 ^end
//! ```
//!
//! A message can also carry a *shared* body (reference-counted `Bytes`, e.g. a mapped file or
//! the application's buffer): then `buf` holds only the headers, layers that merely add a
//! header (checksum, null, a single fragment) never touch the body, and the driver writes
//! headers and body in one vectored write — no copy of the payload at all. A layer that must
//! rewrite the bytes (compression, splitting into fragments) first makes the message
//! contiguous ([`Msg::make_contiguous`]).

use std::time::Instant;

use bs_wire::{PooledBuf, SizedPools};
use bytes::Bytes;

/// One message on its way down (being encoded) or up (being decoded) a layer stack.
pub struct Msg {
    buf: PooledBuf,
    start: usize,
    end: usize,
    /// The payload, when it lives outside `buf` (then `buf[start..end]` holds only headers).
    body: Option<Bytes>,
    /// Set by a pacing layer: do not send before this instant.
    pub not_before: Option<Instant>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Msg").field("len", &self.len()).field("headroom", &self.start).finish()
    }
}

impl Msg {
    /// A message of `len` bytes (contents unspecified) with `headroom` bytes in front.
    pub fn alloc(pools: &SizedPools, headroom: usize, len: usize) -> Self {
        let buf = pools.get(headroom + len);
        Self { buf, start: headroom, end: headroom + len, body: None, not_before: None }
    }

    /// A message whose payload is `body`, shared rather than copied, with room for
    /// `headroom` bytes of headers.
    pub fn shared(pools: &SizedPools, headroom: usize, body: Bytes) -> Self {
        let buf = pools.get(headroom.max(1));
        Self { buf, start: headroom, end: headroom, body: Some(body), not_before: None }
    }

    /// Headers pushed so far and the body behind them: the wire bytes, in order.
    pub fn parts(&self) -> (&[u8], &[u8]) {
        match &self.body {
            Some(b) => (&self.buf[self.start..self.end], b),
            None => (&self.buf[self.start..self.end], &[]),
        }
    }

    /// Copy a shared body (and the headers in front of it) into one owned buffer, keeping the
    /// headroom left. Owned messages are left as they are.
    pub fn make_contiguous(&mut self, pools: &SizedPools) {
        let Some(body) = self.body.take() else { return };
        let head = self.end - self.start;
        let mut m = Self::alloc(pools, self.start, head + body.len());
        m.payload_mut()[..head].copy_from_slice(&self.buf[self.start..self.end]);
        m.payload_mut()[head..].copy_from_slice(&body);
        m.not_before = self.not_before;
        *self = m;
    }

    /// A message holding a copy of `data`, with `headroom` bytes in front.
    pub fn copy_of(pools: &SizedPools, headroom: usize, data: &[u8]) -> Self {
        let mut m = Self::alloc(pools, headroom, data.len());
        m.payload_mut().copy_from_slice(data);
        m
    }

    /// The payload (everything after the headroom). A shared body with headers in front of
    /// it is not contiguous: call [`Msg::make_contiguous`] first (layers that read the whole
    /// message use [`Msg::parts`] instead).
    pub fn payload(&self) -> &[u8] {
        match &self.body {
            None => &self.buf[self.start..self.end],
            Some(b) => {
                assert_eq!(
                    self.start, self.end,
                    "payload() of a shared body with headers in front"
                );
                b
            }
        }
    }

    /// The payload, writable (owned messages only).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        assert!(self.body.is_none(), "a shared body is read-only");
        &mut self.buf[self.start..self.end]
    }

    pub fn len(&self) -> usize {
        self.end - self.start + self.body.as_ref().map_or(0, |b| b.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Free bytes in front of the payload.
    pub fn headroom(&self) -> usize {
        self.start
    }

    /// Put `header` in front of the payload. Without room (a stack deeper than the headroom it
    /// was given) the message moves to a bigger buffer once: correct, just slower.
    pub fn push(&mut self, pools: &SizedPools, header: &[u8]) {
        if header.len() > self.start {
            let room = header.len() + 64;
            let own = self.end - self.start;
            let mut bigger = Self::alloc(pools, room, own);
            bigger.payload_mut().copy_from_slice(&self.buf[self.start..self.end]);
            bigger.not_before = self.not_before;
            bigger.body = self.body.take();
            *self = bigger;
        }
        self.start -= header.len();
        self.buf[self.start..self.start + header.len()].copy_from_slice(header);
    }

    /// Take `n` header bytes off the front; `None` if the message is shorter than that.
    pub fn pop(&mut self, n: usize) -> Option<&[u8]> {
        assert!(self.body.is_none(), "received messages are owned");
        if self.len() < n {
            return None;
        }
        self.start += n;
        Some(&self.buf[self.start - n..self.start])
    }

    /// Keep only the first `len` payload bytes.
    pub fn truncate(&mut self, len: usize) {
        assert!(self.body.is_none(), "a shared body is read-only");
        self.end = self.start + len.min(self.len());
    }
}

impl std::ops::Deref for Msg {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.payload()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_go_in_front_without_moving_the_payload() {
        let pools = SizedPools::new(4);
        let mut m = Msg::copy_of(&pools, 16, b"payload");
        let at = m.payload().as_ptr();
        m.push(&pools, b"h1");
        m.push(&pools, b"hdr2");
        assert_eq!(m.payload(), b"hdr2h1payload");
        assert_eq!(m.pop(4).unwrap(), b"hdr2");
        assert_eq!(m.pop(2).unwrap(), b"h1");
        assert_eq!(m.payload(), b"payload");
        assert_eq!(m.payload().as_ptr(), at, "same bytes, never copied");
        assert!(m.pop(8).is_none());
    }

    #[test]
    fn a_shared_body_is_never_copied_by_header_pushes() {
        let pools = SizedPools::new(4);
        let body = Bytes::from(vec![7u8; 1000]);
        let mut m = Msg::shared(&pools, 8, body.clone());
        m.push(&pools, b"hh");
        m.push(&pools, b"too long for the headroom");
        let (h, b) = m.parts();
        assert_eq!(h, b"too long for the headroomhh");
        assert_eq!(b.as_ptr(), body.as_ptr(), "the body stays where it was");
        assert_eq!(m.len(), 27 + 1000);
        m.make_contiguous(&pools);
        assert_eq!(&m.payload()[..27], b"too long for the headroomhh");
        assert_eq!(&m.payload()[27..], &body[..]);
    }

    #[test]
    fn running_out_of_headroom_still_works() {
        let pools = SizedPools::new(4);
        let mut m = Msg::copy_of(&pools, 1, b"x");
        m.push(&pools, b"long header");
        assert_eq!(m.payload(), b"long headerx");
    }
}
