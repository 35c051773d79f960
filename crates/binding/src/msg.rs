//! Messages in pooled buffers with headroom (GOPI's msg module): a layer pushes its header
//! into the space in front of the payload and pops it on the way up, so no layer copies the
//! payload to add or remove a header.
//!
//! ```text
//!   buf: [ headroom ........ | hdr_n … hdr_1 | payload ............ | spare ]
//!                            ^start                                 ^end
//! ```

use std::time::Instant;

use bs_wire::{PooledBuf, SizedPools};

/// One message on its way down (being encoded) or up (being decoded) a layer stack.
pub struct Msg {
    buf: PooledBuf,
    start: usize,
    end: usize,
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
        Self { buf, start: headroom, end: headroom + len, not_before: None }
    }

    /// A message holding a copy of `data`, with `headroom` bytes in front.
    pub fn copy_of(pools: &SizedPools, headroom: usize, data: &[u8]) -> Self {
        let mut m = Self::alloc(pools, headroom, data.len());
        m.payload_mut().copy_from_slice(data);
        m
    }

    pub fn payload(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.end]
    }

    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
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
            let mut bigger = Self::alloc(pools, room, self.len());
            bigger.payload_mut().copy_from_slice(self.payload());
            bigger.not_before = self.not_before;
            *self = bigger;
        }
        self.start -= header.len();
        self.buf[self.start..self.start + header.len()].copy_from_slice(header);
    }

    /// Take `n` header bytes off the front; `None` if the message is shorter than that.
    pub fn pop(&mut self, n: usize) -> Option<&[u8]> {
        if self.len() < n {
            return None;
        }
        self.start += n;
        Some(&self.buf[self.start - n..self.start])
    }

    /// Keep only the first `len` payload bytes.
    pub fn truncate(&mut self, len: usize) {
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
    fn running_out_of_headroom_still_works() {
        let pools = SizedPools::new(4);
        let mut m = Msg::copy_of(&pools, 1, b"x");
        m.push(&pools, b"long header");
        assert_eq!(m.payload(), b"long headerx");
    }
}
