//! The `fragment` layer: messages longer than the fragment size leave as several pieces and
//! are put back together on the way up. Header: flags u8 (1 = first, 2 = last), index u32
//! (0 for the first piece), total length u32 (of the whole message). Pieces of one message
//! arrive in order on a reliable transport; anything else — a piece out of turn, a new message
//! before the last ended, a total over the negotiated cap, pieces that overfill it — is an
//! error, never a silently wrong message.

use bs_wire::SizedPools;

use super::{Layer, LayerQos};
use crate::error::LayerError;
use crate::msg::Msg;
use crate::qos::LayerSpec;

pub(super) const HEADER: usize = 9;
const FIRST: u8 = 1;
const LAST: u8 = 2;

pub struct Fragment {
    size: usize,
    /// Largest whole message (from the QoS above).
    cap: usize,
    below: usize,
    pools: SizedPools,
    /// The message being put back together: buffer, bytes filled, next index.
    assembling: Option<(Msg, usize, u32)>,
}

impl Fragment {
    pub fn new(size: usize, cap: usize, below: usize, pools: &SizedPools) -> Self {
        Self { size, cap, below, pools: pools.clone(), assembling: None }
    }
}

fn header(flags: u8, index: u32, total: u32) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0] = flags;
    h[1..5].copy_from_slice(&index.to_be_bytes());
    h[5..9].copy_from_slice(&total.to_be_bytes());
    h
}

impl Layer for Fragment {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Fragment(self.size as u32)
    }
    fn header_len(&self) -> usize {
        HEADER
    }
    fn lower(&self, above: LayerQos) -> LayerQos {
        LayerQos { max_message: above.max_message.min(self.size) + HEADER, ..above }
    }
    fn pending(&self) -> bool {
        self.assembling.is_some()
    }

    fn encode(&mut self, mut msg: Msg, out: &mut Vec<Msg>) -> Result<(), LayerError> {
        let total = msg.len() as u32;
        if msg.len() <= self.size {
            msg.push(&self.pools, &header(FIRST | LAST, 0, total));
            out.push(msg);
            return Ok(());
        }
        msg.make_contiguous(&self.pools);
        let pieces = msg.payload().chunks(self.size);
        let n = pieces.len();
        for (i, piece) in pieces.enumerate() {
            let mut flags = 0;
            if i == 0 {
                flags |= FIRST;
            }
            if i + 1 == n {
                flags |= LAST;
            }
            let mut m = Msg::copy_of(&self.pools, self.below + HEADER, piece);
            m.not_before = msg.not_before;
            m.push(&self.pools, &header(flags, i as u32, total));
            out.push(m);
        }
        Ok(())
    }

    fn decode(&mut self, mut msg: Msg) -> Result<Option<Msg>, LayerError> {
        let malformed =
            |reason: &str| LayerError::Malformed { layer: "fragment", reason: reason.to_string() };
        let h = msg.pop(HEADER).ok_or_else(|| malformed("message shorter than 9"))?;
        let flags = h[0];
        let index = u32::from_be_bytes(h[1..5].try_into().expect("4 bytes"));
        let total = u32::from_be_bytes(h[5..9].try_into().expect("4 bytes")) as usize;
        if flags & !(FIRST | LAST) != 0 {
            return Err(malformed("unknown flags"));
        }
        if msg.len() > self.size {
            return Err(LayerError::TooLarge {
                layer: "fragment",
                len: msg.len() as u64,
                max: self.size as u64,
            });
        }
        if flags & FIRST != 0 {
            if self.assembling.is_some() {
                return Err(LayerError::Fragment(
                    "a new message began before the last one ended".into(),
                ));
            }
            if index != 0 {
                return Err(LayerError::Fragment(format!("first piece has index {index}")));
            }
            if total > self.cap {
                return Err(LayerError::TooLarge {
                    layer: "fragment",
                    len: total as u64,
                    max: self.cap as u64,
                });
            }
            if flags & LAST != 0 {
                if msg.len() != total {
                    return Err(malformed("single piece shorter or longer than its total"));
                }
                return Ok(Some(msg));
            }
            let mut whole = Msg::alloc(&self.pools, 0, total);
            if msg.len() > total {
                return Err(LayerError::Fragment("pieces exceed the declared total".into()));
            }
            whole.payload_mut()[..msg.len()].copy_from_slice(&msg);
            self.assembling = Some((whole, msg.len(), 1));
            return Ok(None);
        }
        let Some((mut whole, filled, next)) = self.assembling.take() else {
            return Err(LayerError::Fragment(format!("piece {index} of no message")));
        };
        if index != next {
            return Err(LayerError::Fragment(format!("piece {index} where {next} was due")));
        }
        if whole.len() != total {
            return Err(LayerError::Fragment("pieces disagree on the total".into()));
        }
        let end = filled + msg.len();
        if end > total {
            return Err(LayerError::Fragment("pieces exceed the declared total".into()));
        }
        whole.payload_mut()[filled..end].copy_from_slice(&msg);
        if flags & LAST != 0 {
            if end != total {
                return Err(LayerError::Fragment(format!(
                    "last piece ends at {end} of {total} bytes"
                )));
            }
            return Ok(Some(whole));
        }
        self.assembling = Some((whole, end, next + 1));
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(data: &[u8], size: usize) -> Vec<Msg> {
        let pools = SizedPools::new(2);
        let mut l = Fragment::new(size, 1 << 20, 0, &pools);
        let mut out = Vec::new();
        l.encode(Msg::copy_of(&pools, HEADER, data), &mut out).unwrap();
        out
    }

    #[test]
    fn pieces_out_of_turn_are_errors() {
        let pools = SizedPools::new(2);
        let mut p = pieces(&[7u8; 1000], 300);
        assert_eq!(p.len(), 4);
        let mut l = Fragment::new(300, 1 << 20, 0, &pools);
        assert!(l.decode(p.remove(0)).unwrap().is_none());
        assert!(l.pending());
        let e = l.decode(p.remove(1)).unwrap_err();
        assert!(matches!(e, LayerError::Fragment(_)), "{e}");
        // A middle piece with no first is an error too.
        let mut l = Fragment::new(300, 1 << 20, 0, &pools);
        assert!(l.decode(pieces(&[7u8; 1000], 300).remove(1)).is_err());
    }

    #[test]
    fn a_total_over_the_cap_is_refused_at_the_first_piece() {
        let pools = SizedPools::new(2);
        let mut l = Fragment::new(300, 500, 0, &pools);
        let e = l.decode(pieces(&[7u8; 1000], 300).remove(0)).unwrap_err();
        assert!(matches!(e, LayerError::TooLarge { len: 1000, max: 500, .. }), "{e}");
    }
}
