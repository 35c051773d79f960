//! The `compress` layer: zstd or lz4 per message, sent as is when compressing does not shrink
//! it. Header: method u8 (0 = none, 1 = zstd, 2 = lz4), original length u32. The original
//! length is checked against the negotiated cap before anything is allocated, and the
//! decompressor writes into a buffer of exactly that size, so a frame that would inflate past
//! what it declares fails instead of growing.

use bs_wire::SizedPools;

use super::{Layer, LayerQos};
use crate::error::LayerError;
use crate::msg::Msg;
use crate::qos::{Codec, LayerSpec};

pub(super) const HEADER: usize = 5;

const NONE: u8 = 0;
const ZSTD: u8 = 1;
const LZ4: u8 = 2;

/// Messages shorter than this are not worth compressing.
const MIN_LEN: usize = 64;

pub struct Compress {
    codec: Codec,
    /// Largest original message (from the QoS above).
    cap: usize,
    /// Header bytes the layers below push.
    below: usize,
    pools: SizedPools,
    zc: Option<zstd::bulk::Compressor<'static>>,
    zd: Option<zstd::bulk::Decompressor<'static>>,
}

impl Compress {
    pub fn new(codec: Codec, cap: usize, below: usize, pools: &SizedPools) -> Self {
        Self { codec, cap, below, pools: pools.clone(), zc: None, zd: None }
    }

    /// Compress `src` into `dst` if it fits (i.e. if it shrinks).
    fn squeeze(&mut self, src: &[u8], dst: &mut [u8]) -> Result<Option<usize>, LayerError> {
        match self.codec {
            Codec::Zstd(level) => {
                if self.zc.is_none() {
                    let c = zstd::bulk::Compressor::new(level)
                        .map_err(|e| LayerError::Compress(e.to_string()))?;
                    self.zc = Some(c);
                }
                let c = self.zc.as_mut().expect("just made");
                // Output larger than `dst` is an error here, which means "does not shrink".
                Ok(c.compress_to_buffer(src, dst).ok())
            }
            Codec::Lz4 => {
                // lz4_flex wants room for its worst case; compress there and keep the result
                // only if it shrank.
                let mut room =
                    Msg::alloc(&self.pools, 0, lz4_flex::block::get_maximum_output_size(src.len()));
                let n = lz4_flex::block::compress_into(src, room.payload_mut())
                    .map_err(|e| LayerError::Compress(e.to_string()))?;
                if n >= dst.len() {
                    return Ok(None);
                }
                dst[..n].copy_from_slice(&room[..n]);
                Ok(Some(n))
            }
        }
    }
}

impl Layer for Compress {
    fn spec(&self) -> LayerSpec {
        LayerSpec::Compress(self.codec)
    }
    fn header_len(&self) -> usize {
        HEADER
    }
    fn lower(&self, above: LayerQos) -> LayerQos {
        // Worst case: sent as is, plus the header.
        LayerQos { max_message: above.max_message + HEADER, ..above }
    }

    fn encode(&mut self, mut msg: Msg, out: &mut Vec<Msg>) -> Result<(), LayerError> {
        let len = msg.len();
        if len >= MIN_LEN {
            msg.make_contiguous(&self.pools);
        }
        let method = match self.codec {
            Codec::Zstd(_) => ZSTD,
            Codec::Lz4 => LZ4,
        };
        if len >= MIN_LEN {
            let mut small = Msg::alloc(&self.pools, self.below + HEADER, len - 1);
            if let Some(n) = self.squeeze(msg.payload(), small.payload_mut())? {
                small.truncate(n);
                small.not_before = msg.not_before;
                let mut head = [method, 0, 0, 0, 0];
                head[1..].copy_from_slice(&(len as u32).to_be_bytes());
                small.push(&self.pools, &head);
                out.push(small);
                return Ok(());
            }
        }
        let mut head = [NONE, 0, 0, 0, 0];
        head[1..].copy_from_slice(&(len as u32).to_be_bytes());
        msg.push(&self.pools, &head);
        out.push(msg);
        Ok(())
    }

    fn decode(&mut self, mut msg: Msg) -> Result<Option<Msg>, LayerError> {
        let malformed = |reason: String| LayerError::Malformed { layer: "compress", reason };
        let head = msg.pop(HEADER).ok_or_else(|| malformed("message shorter than 5".into()))?;
        let method = head[0];
        let orig = u32::from_be_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
        if orig > self.cap {
            return Err(LayerError::TooLarge {
                layer: "compress",
                len: orig as u64,
                max: self.cap as u64,
            });
        }
        match method {
            NONE => {
                if msg.len() != orig {
                    return Err(malformed(format!(
                        "uncompressed message of {} bytes declares {orig}",
                        msg.len()
                    )));
                }
                Ok(Some(msg))
            }
            ZSTD | LZ4 => {
                let mut big = Msg::alloc(&self.pools, 0, orig);
                let n = if method == ZSTD {
                    if self.zd.is_none() {
                        let d = zstd::bulk::Decompressor::new()
                            .map_err(|e| LayerError::Decompress(e.to_string()))?;
                        self.zd = Some(d);
                    }
                    let d = self.zd.as_mut().expect("just made");
                    d.decompress_to_buffer(msg.payload(), big.payload_mut())
                        .map_err(|e| LayerError::Decompress(format!("zstd: {e}")))?
                } else {
                    lz4_flex::block::decompress_into(msg.payload(), big.payload_mut())
                        .map_err(|e| LayerError::Decompress(format!("lz4: {e}")))?
                };
                if n != orig {
                    return Err(LayerError::Decompress(format!(
                        "decompressed to {n} bytes, the header declares {orig}"
                    )));
                }
                Ok(Some(big))
            }
            other => Err(malformed(format!("unknown method {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(codec: Codec, data: &[u8]) -> Msg {
        let pools = SizedPools::new(2);
        let mut l = Compress::new(codec, 1 << 20, 0, &pools);
        let mut out = Vec::new();
        l.encode(Msg::copy_of(&pools, HEADER, data), &mut out).unwrap();
        out.pop().unwrap()
    }

    #[test]
    fn compressible_data_shrinks_and_random_data_travels_as_is() {
        for codec in [Codec::Zstd(3), Codec::Lz4] {
            let zeros = wire(codec, &[0u8; 100_000]);
            assert!(zeros.len() < 1000, "{codec:?}: {}", zeros.len());
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            let noise: Vec<u8> = (0..10_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect();
            let w = wire(codec, &noise);
            assert_eq!(w.len(), noise.len() + HEADER, "{codec:?}");
            assert_eq!(w[0], NONE);
        }
    }

    #[test]
    fn a_bomb_is_refused_before_allocating() {
        // 100 KB of zeros compressed, but the receiver's cap is 1000 bytes.
        for codec in [Codec::Zstd(3), Codec::Lz4] {
            let w = wire(codec, &[0u8; 100_000]);
            let pools = SizedPools::new(2);
            let mut l = Compress::new(codec, 1000, 0, &pools);
            let e = l.decode(w).unwrap_err();
            assert!(matches!(e, LayerError::TooLarge { len: 100_000, max: 1000, .. }), "{e}");
        }
    }

    #[test]
    fn a_frame_that_inflates_past_its_declared_size_fails() {
        for codec in [Codec::Zstd(3), Codec::Lz4] {
            let mut w = wire(codec, &[0u8; 100_000]);
            // Lie: declare 1000 bytes.
            w.payload_mut()[1..5].copy_from_slice(&1000u32.to_be_bytes());
            let pools = SizedPools::new(2);
            let mut l = Compress::new(codec, 1 << 20, 0, &pools);
            let e = l.decode(w).unwrap_err();
            assert!(matches!(e, LayerError::Decompress(_)), "{codec:?}: {e}");
        }
    }
}
