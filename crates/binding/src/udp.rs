//! Datagram bindings: each UDP datagram is one `MSG` frame (24-byte header, then the layered
//! bytes) whose `seq` the receiver checks against a sliding window. A gap is a loss once it
//! falls out of the window without arriving; a datagram that fills a gap late counts as
//! reordered; a duplicate is dropped. A sequence number too far ahead or behind the window is
//! an error (`OutOfWindow`), not something to allocate for. The totals are reported to both
//! sides at the end over the binding's TCP connection (`SUM`: datagrams sent; `ACK`: received).

use std::collections::BTreeSet;

use crate::error::BindingError;

/// Largest UDP payload sent (fits a 64 KiB datagram with the frame header).
pub const MAX_DATAGRAM: usize = 65_000;

/// What a datagram was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The next, or ahead of it (the numbers between are missing for now).
    InOrder,
    /// Filled a gap: counted as reordered.
    Late,
    /// Seen before: dropped.
    Duplicate,
}

/// Sequence accounting of one datagram binding.
#[derive(Debug, Clone)]
pub struct SeqWindow {
    window: u64,
    next: u64,
    missing: BTreeSet<u64>,
    pub received: u64,
    pub lost: u64,
    pub reordered: u64,
    pub duplicates: u64,
}

impl SeqWindow {
    /// A window of `window` sequence numbers (a late datagram older than that is lost).
    pub fn new(window: u64) -> Self {
        Self {
            window: window.max(1),
            next: 0,
            missing: BTreeSet::new(),
            received: 0,
            lost: 0,
            reordered: 0,
            duplicates: 0,
        }
    }

    /// Account for datagram `seq`.
    pub fn on(&mut self, seq: u64) -> Result<Arrival, BindingError> {
        let lo = self.next.saturating_sub(self.window);
        let hi = self.next.saturating_add(self.window);
        if seq >= hi || seq < lo {
            return Err(BindingError::OutOfWindow { seq, lo, hi });
        }
        if seq >= self.next {
            self.missing.extend(self.next..seq);
            self.next = seq + 1;
            self.received += 1;
            // Whatever fell out of the window is lost for good.
            let floor = self.next.saturating_sub(self.window);
            let kept = self.missing.split_off(&floor);
            self.lost += self.missing.len() as u64;
            self.missing = kept;
            return Ok(Arrival::InOrder);
        }
        if self.missing.remove(&seq) {
            self.received += 1;
            self.reordered += 1;
            Ok(Arrival::Late)
        } else {
            self.duplicates += 1;
            Ok(Arrival::Duplicate)
        }
    }

    /// The sequence number after the newest one seen.
    pub fn next_expected(&self) -> u64 {
        self.next
    }

    /// Datagram `seq` arrived past the window from a source known to be the sender (a
    /// connected socket): everything before it that has not arrived is lost, and the window
    /// moves on to it (counting, not allocating, the numbers skipped).
    pub fn skip_to(&mut self, seq: u64) -> Arrival {
        if seq >= self.next {
            self.lost += self.missing.len() as u64 + (seq - self.next);
            self.missing.clear();
            self.next = seq;
        }
        self.on(seq).unwrap_or(Arrival::Duplicate)
    }

    /// The sender says it sent `sent` datagrams: everything not received is lost.
    pub fn finish(&mut self, sent: u64) {
        if sent > self.next {
            self.missing.extend(self.next..sent.min(self.next + self.window));
            self.lost += sent.saturating_sub(self.next + self.window);
            self.next = sent;
        }
        self.lost += self.missing.len() as u64;
        self.missing.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_losses_and_late_arrivals_are_reorders() {
        let mut w = SeqWindow::new(8);
        for s in [0, 1, 3, 2, 4, 6, 6] {
            w.on(s).unwrap();
        }
        assert_eq!((w.received, w.reordered, w.duplicates), (6, 1, 1));
        w.finish(10);
        assert_eq!(w.lost, 4, "5, 7, 8, 9");
    }

    #[test]
    fn a_burst_longer_than_the_window_is_skipped_over() {
        let mut w = SeqWindow::new(4);
        w.on(0).unwrap();
        w.on(2).unwrap();
        assert!(w.on(100).is_err());
        assert_eq!(w.skip_to(100), Arrival::InOrder);
        assert_eq!((w.lost, w.received), (1 + 97, 3), "1, then 3..=99");
        assert_eq!(w.on(101).unwrap(), Arrival::InOrder);
    }

    #[test]
    fn a_gap_older_than_the_window_is_lost_and_its_late_datagram_refused() {
        let mut w = SeqWindow::new(4);
        w.on(0).unwrap();
        w.on(10).unwrap_err(); // too far ahead
        for s in 2..8 {
            w.on(s).unwrap();
        }
        assert_eq!(w.lost, 1, "1 fell out of the window");
        assert!(matches!(w.on(1), Err(BindingError::OutOfWindow { seq: 1, .. })));
    }
}
