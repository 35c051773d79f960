//! The `checksum` layer: a digest of each message in front of it (xxh3-64 or BLAKE3),
//! verified on the way up. Header: algo u8 (1 = xxh3-64, 2 = blake3), then the digest.

use bs_wire::SizedPools;

use super::{Layer, LayerQos};
use crate::error::LayerError;
use crate::msg::Msg;
use crate::qos::{LayerSpec, SumAlgo};

pub struct Checksum {
    algo: SumAlgo,
    head: [u8; 33],
    /// Only used if a message comes without headroom.
    pools: SizedPools,
}

impl Checksum {
    pub fn new(algo: SumAlgo, pools: &SizedPools) -> Self {
        Self { algo, head: [0; 33], pools: pools.clone() }
    }

    pub(super) fn header_for(algo: SumAlgo) -> usize {
        1 + digest_len(algo)
    }

    fn digest(&self, data: &[u8], out: &mut [u8]) {
        self.digest_parts(data, &[], out)
    }

    /// The digest of `a` followed by `b` (headers in front of a shared body).
    fn digest_parts(&self, a: &[u8], b: &[u8], out: &mut [u8]) {
        match self.algo {
            SumAlgo::Xxh3 if b.is_empty() => {
                out.copy_from_slice(&bs_wire::xxh3::Xxh3::oneshot_64(a).to_be_bytes())
            }
            SumAlgo::Xxh3 => {
                let mut h = bs_wire::xxh3::Xxh3::new();
                h.write(a);
                h.write(b);
                out.copy_from_slice(&h.finish_64().to_be_bytes())
            }
            SumAlgo::Blake3 => {
                let mut h = blake3::Hasher::new();
                h.update(a);
                h.update(b);
                out.copy_from_slice(h.finalize().as_bytes())
            }
        }
    }
}

fn digest_len(a: SumAlgo) -> usize {
    match a {
        SumAlgo::Xxh3 => 8,
        SumAlgo::Blake3 => 32,
    }
}

fn id(a: SumAlgo) -> u8 {
    match a {
        SumAlgo::Xxh3 => 1,
        SumAlgo::Blake3 => 2,
    }
}

fn name(a: SumAlgo) -> &'static str {
    match a {
        SumAlgo::Xxh3 => "xxh3-64",
        SumAlgo::Blake3 => "blake3",
    }
}

impl Layer for Checksum {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Checksum(self.algo)
    }
    fn header_len(&self) -> usize {
        Self::header_for(self.algo)
    }
    fn lower(&self, above: LayerQos) -> LayerQos {
        LayerQos { max_message: above.max_message + self.header_len(), ..above }
    }

    fn encode(&mut self, mut msg: Msg, out: &mut Vec<Msg>) -> Result<(), LayerError> {
        let n = self.header_len();
        let mut head = self.head;
        head[0] = id(self.algo);
        let (a, b) = msg.parts();
        self.digest_parts(a, b, &mut head[1..n]);
        msg.push(&self.pools, &head[..n]);
        out.push(msg);
        Ok(())
    }

    fn decode(&mut self, mut msg: Msg) -> Result<Option<Msg>, LayerError> {
        let n = self.header_len();
        let malformed = |reason: String| LayerError::Malformed { layer: "checksum", reason };
        let head: [u8; 33] = {
            let h = msg.pop(n).ok_or_else(|| malformed(format!("message shorter than {n}")))?;
            let mut a = [0u8; 33];
            a[..n].copy_from_slice(h);
            a
        };
        if head[0] != id(self.algo) {
            return Err(malformed(format!(
                "algorithm {} where {} was negotiated",
                head[0],
                name(self.algo)
            )));
        }
        let mut ours = [0u8; 32];
        let d = digest_len(self.algo);
        self.digest(msg.payload(), &mut ours[..d]);
        if ours[..d] != head[1..n] {
            return Err(LayerError::Checksum {
                algo: name(self.algo),
                expected: hex(&head[1..n]),
                actual: hex(&ours[..d]),
            });
        }
        Ok(Some(msg))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_bit_is_a_checksum_failure() {
        let pools = SizedPools::new(1);
        for algo in [SumAlgo::Xxh3, SumAlgo::Blake3] {
            let mut l = Checksum::new(algo, &pools);
            let mut out = Vec::new();
            l.encode(Msg::copy_of(&pools, 33, b"hello"), &mut out).unwrap();
            let mut m = out.pop().unwrap();
            let last = m.len() - 1;
            m.payload_mut()[last] ^= 1;
            assert!(matches!(l.decode(m), Err(LayerError::Checksum { .. })));
        }
    }

    #[test]
    fn a_short_message_is_malformed_not_a_panic() {
        let pools = SizedPools::new(1);
        let mut l = Checksum::new(SumAlgo::Blake3, &pools);
        let e = l.decode(Msg::copy_of(&pools, 0, b"abc")).unwrap_err();
        assert!(matches!(e, LayerError::Malformed { .. }), "{e}");
    }
}
