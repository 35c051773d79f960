//! A `udp` flow's datagrams, distributer → receiver, and the receiver's reassembly of them
//! into the run's bytes, in order, with every loss counted and placed.
//!
//! ```text
//!  datagram = seq u64 | offset u64 | bytes
//! ```
//!
//! `seq` numbers the datagrams sent to one receiver, from 0 over its whole connection (so a
//! straggler from an earlier run is recognised and dropped); `offset` is where `bytes` sit in
//! the run. Numbers are big-endian. A `DATA` message from the sender becomes as many datagrams
//! as the flow's datagram size makes of it, each sent straight from the message's buffer (the
//! 16-byte head and a slice of the payload, gathered by the kernel).
//!
//! Loss accounting is the bindings' ([`bs_binding::udp::SeqWindow`]): a gap in `seq` is a loss
//! once it falls out of the window or the distributer's `SENT` count says nothing more is
//! coming; a late datagram counts as reordered. The reassembly delivers bytes in order: a
//! datagram ahead of a gap waits (at most [`REORDER`] of them), and a gap given up is reported
//! as lost bytes at its offset before the bytes after it are delivered.

use std::collections::BTreeMap;
use std::io::IoSlice;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;

use bs_binding::udp::{Arrival, SeqWindow};

/// Bytes before a datagram's payload.
pub const HEAD: usize = 16;
/// Datagrams held ahead of a gap before the gap is given up as lost.
pub const REORDER: usize = 256;
/// The most sequence numbers one datagram may jump the window ahead by (a burst lost past the
/// window); one further ahead is not a datagram of this connection's distributer and is
/// dropped, so it cannot make every real one that follows look stale.
pub const MAX_SKIP: u64 = 1 << 32;

/// Send `payload` (at `offset` in the run) as datagrams of at most `size` bytes on the
/// connected `sock`, numbering them from `*seq`. A datagram the kernel will not take (a full
/// buffer, no receiver listening) is lost as the network would lose it: the receiver counts
/// it. Other errors end the receiver's connection.
pub fn send(
    sock: &UdpSocket,
    seq: &mut u64,
    offset: u64,
    payload: &[u8],
    size: usize,
) -> std::io::Result<()> {
    for (i, piece) in payload.chunks(size.max(1)).enumerate() {
        let mut head = [0u8; HEAD];
        head[..8].copy_from_slice(&seq.to_be_bytes());
        head[8..].copy_from_slice(&(offset + (i * size) as u64).to_be_bytes());
        *seq += 1;
        let parts = [IoSlice::new(&head), IoSlice::new(piece)];
        match bs_transport::send_vectored(sock.as_raw_fd(), &parts) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// What reassembly hands on, in order of offset.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    Data(u64, &'a [u8]),
    /// `len` bytes at this offset never arrived (or arrived too late to be delivered in order).
    Lost(u64, u64),
}

/// One run's reassembly on a receiver (the window lives as long as its connection).
#[derive(Debug, Default)]
pub struct Reassembly {
    /// The next offset to hand on.
    pub next: u64,
    /// Bytes given up as lost.
    pub lost_bytes: u64,
    /// Datagrams that did not parse or fell outside the window (dropped).
    pub junk: u64,
    ahead: BTreeMap<u64, Vec<u8>>,
}

impl Reassembly {
    /// Take one datagram: hand on what is now in order.
    pub fn on_datagram(
        &mut self,
        window: &mut SeqWindow,
        d: &[u8],
        out: &mut impl FnMut(Piece<'_>),
    ) {
        let (Some(seq), Some(offset)) = (be(d, 0), be(d, 8)) else {
            self.junk += 1;
            return;
        };
        let bytes = &d[HEAD..];
        let (arrival, skipped) = match window.on(seq) {
            // Past the window: a burst longer than it was lost (the socket is connected to
            // the distributer's, so this is its datagram): move the window on, not stall.
            Err(_) if seq >= window_top(window) && seq - window.next_expected() <= MAX_SKIP => {
                (window.skip_to(seq), true)
            }
            Ok(a) => (a, false),
            Err(_) => {
                self.junk += 1;
                return;
            }
        };
        if arrival == Arrival::Duplicate {
            return;
        }
        if offset < self.next || offset.checked_add(bytes.len() as u64).is_none() {
            return; // its place was given up, or it claims an impossible one
        }
        if offset == self.next && self.ahead.is_empty() {
            self.next += bytes.len() as u64;
            return out(Piece::Data(offset, bytes));
        }
        self.ahead.entry(offset).or_insert_with(|| bytes.to_vec());
        self.drain(out);
        // After a skip nothing before this datagram can still come: give up those gaps now.
        while skipped && self.ahead.first_key_value().is_some_and(|(&k, _)| k <= offset) {
            self.skip_gap(out);
        }
        if self.ahead.len() > REORDER {
            self.skip_gap(out);
        }
    }

    /// Hand on the held datagrams that are now in order.
    fn drain(&mut self, out: &mut impl FnMut(Piece<'_>)) {
        while let Some(e) = self.ahead.first_entry() {
            if *e.key() > self.next {
                return;
            }
            let (offset, bytes) = e.remove_entry();
            // A datagram overlapping what was delivered (a sender's duplicate) adds nothing.
            if offset == self.next {
                self.next += bytes.len() as u64;
                out(Piece::Data(offset, &bytes));
            }
        }
    }

    /// Give up the gap before the first held datagram, and hand on what follows it.
    fn skip_gap(&mut self, out: &mut impl FnMut(Piece<'_>)) {
        if let Some((&first, _)) = self.ahead.first_key_value() {
            out(Piece::Lost(self.next, first - self.next));
            self.lost_bytes += first - self.next;
            self.next = first;
            self.drain(out);
        }
    }

    /// Nothing more will come for this run of `total` bytes: give up every gap left.
    pub fn finish(&mut self, total: u64, out: &mut impl FnMut(Piece<'_>)) {
        while !self.ahead.is_empty() {
            self.skip_gap(out);
        }
        if total > self.next {
            out(Piece::Lost(self.next, total - self.next));
            self.lost_bytes += total - self.next;
            self.next = total;
        }
    }

    /// Every byte of a run of `total` bytes is accounted for (handed on or given up).
    pub fn complete(&self, total: u64) -> bool {
        self.ahead.is_empty() && self.next >= total
    }
}

/// The first sequence number past `w`'s window (what `on` refuses as too far ahead).
fn window_top(w: &SeqWindow) -> u64 {
    w.next_expected().saturating_add(bs_binding::driver::DATAGRAM_WINDOW)
}

fn be(d: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = d.get(at..at + 8)?.try_into().ok()?;
    (d.len() >= HEAD).then_some(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgram(seq: u64, offset: u64, bytes: &[u8]) -> Vec<u8> {
        let mut d = seq.to_be_bytes().to_vec();
        d.extend_from_slice(&offset.to_be_bytes());
        d.extend_from_slice(bytes);
        d
    }

    /// Feed datagrams; return what came out, as (offset, bytes or loss length).
    fn run(r: &mut Reassembly, w: &mut SeqWindow, ds: &[Vec<u8>]) -> Vec<(u64, String)> {
        let mut got = Vec::new();
        let mut out = |p: Piece<'_>| match p {
            Piece::Data(o, b) => got.push((o, String::from_utf8_lossy(b).into_owned())),
            Piece::Lost(o, n) => got.push((o, format!("lost {n}"))),
        };
        for d in ds {
            r.on_datagram(w, d, &mut out);
        }
        got
    }

    #[test]
    fn in_order_datagrams_pass_straight_through_and_late_ones_are_put_in_place() {
        let (mut r, mut w) = (Reassembly::default(), SeqWindow::new(64));
        let got = run(
            &mut r,
            &mut w,
            &[dgram(0, 0, b"ab"), dgram(2, 4, b"ef"), dgram(1, 2, b"cd"), dgram(1, 2, b"cd")],
        );
        assert_eq!(got, [(0, "ab".into()), (2, "cd".into()), (4, "ef".into())]);
        assert_eq!((w.reordered, w.duplicates, r.next), (1, 1, 6));
        assert!(r.complete(6));
    }

    #[test]
    fn a_gap_is_given_up_at_the_end_with_its_place_and_length() {
        let (mut r, mut w) = (Reassembly::default(), SeqWindow::new(64));
        let mut got = run(&mut r, &mut w, &[dgram(0, 0, b"ab"), dgram(2, 4, b"ef")]);
        assert!(!r.complete(8));
        r.finish(8, &mut |p| match p {
            Piece::Data(o, b) => got.push((o, String::from_utf8_lossy(b).into_owned())),
            Piece::Lost(o, n) => got.push((o, format!("lost {n}"))),
        });
        w.finish(4);
        assert_eq!(got[1..], [(2, "lost 2".into()), (4, "ef".into()), (6, "lost 2".into())]);
        assert_eq!((r.lost_bytes, w.lost), (4, 2));
    }

    #[test]
    fn too_many_datagrams_ahead_of_a_gap_give_it_up_and_bound_memory() {
        let (mut r, mut w) = (Reassembly::default(), SeqWindow::new(4096));
        let ds: Vec<_> = (1..=REORDER as u64 + 1).map(|i| dgram(i, i, b"x")).collect();
        let got = run(&mut r, &mut w, &ds);
        assert_eq!(got[0], (0, "lost 1".into()));
        assert_eq!(got.len(), REORDER + 2);
        assert_eq!((r.next, r.lost_bytes), (REORDER as u64 + 2, 1));
        // The missing datagram turning up now is too late: dropped, nothing handed on.
        assert!(run(&mut r, &mut w, &[dgram(0, 0, b"x")]).is_empty());
    }

    #[test]
    fn a_burst_lost_past_the_window_does_not_stop_what_follows() {
        let window = bs_binding::driver::DATAGRAM_WINDOW;
        let (mut r, mut w) = (Reassembly::default(), SeqWindow::new(window));
        let far = window + 500;
        let got = run(
            &mut r,
            &mut w,
            &[dgram(0, 0, b"ab"), dgram(far, 9, b"cd"), dgram(far + 1, 11, b"ef")],
        );
        assert_eq!(
            got,
            [(0, "ab".into()), (2, "lost 7".into()), (9, "cd".into()), (11, "ef".into())]
        );
        assert_eq!(w.lost, far - 1);
    }

    #[test]
    fn runts_strangers_and_impossible_offsets_are_dropped() {
        let (mut r, mut w) = (Reassembly::default(), SeqWindow::new(8));
        w.finish(100); // earlier runs: 100 datagrams
        let got = run(
            &mut r,
            &mut w,
            &[vec![1, 2, 3], dgram(3, 0, b"old"), dgram(100, u64::MAX, b"wrap")],
        );
        assert!(got.is_empty());
        assert_eq!(r.junk, 2, "the runt and the straggler far behind");
        // A number absurdly far ahead is not the distributer's: dropped, the window stays.
        assert!(
            run(&mut r, &mut w, &[dgram(u64::MAX, 0, b"x"), dgram(1 << 40, 0, b"y")]).is_empty()
        );
        assert_eq!((r.junk, w.next_expected()), (4, 101));
        assert_eq!(r.next, 0);
        assert_eq!(run(&mut r, &mut w, &[dgram(101, 0, b"z")]), [(0, "z".into())]);
    }
}
