//! The bit reader under `jpegls_scan` and `jpeg_lossless`: the entropy-coded data of a JPEG-LS
//! scan (ITU-T T.87 A.1) or a JPEG one (T.81 B.1.1.5, F.1.2.3), read most significant bit
//! first from a 64-bit cache.
//!
//! # Wire format
//!
//! A scan's coded bits follow its SOS segment, packed into bytes most significant bit first,
//! up to the marker that ends them; the two standards keep a `0xFF` data byte from reading as
//! a marker differently:
//!
//! - JPEG-LS (`Bits<true>`): after a `0xFF` byte the encoder inserts one 0 bit (the next
//!   byte's top bit), so `0xFF` followed by a byte ≥ `0x80` is a marker. The last byte is
//!   padded with 0 bits.
//! - JPEG (`Bits<false>`): a `0xFF` data byte is followed by a stuffed `0x00` byte, so `0xFF`
//!   followed by anything else is a marker. The last byte is padded with 1 bits.
//!
//! # How it reads
//!
//! The reader is given the coded bytes up to that marker (`jpeg_markers` finds it). Eight bytes
//! at a time are loaded with one big-endian load while no `0xFF` is among them (the next `0xFF`
//! is found with `memchr`), else one byte at a time, dropping the stuffing. Past the end it
//! supplies 0 bits and counts them, so decoding never reads out of bounds and
//! [`Bits::overrun`] tells afterwards whether the data was cut short.

/// Bits left in the cache after a refill: at least this many, until the data runs out.
pub(crate) const REFILLED: u32 = 56;

/// Whether the CPU has LZCNT (the baseline's BSR needs a zero check around it) and BMI2's
/// shifts by a register other than CL: the decoders over this reader are built with them too
/// (JPEG-LS 5–10% faster on a Zen 5), and each calls that build when this holds.
pub(crate) fn bit_instructions() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("bmi1") && has!("bmi2") && has!("lzcnt")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

pub(crate) struct Bits<'a, const JPEG_LS: bool> {
    data: &'a [u8],
    /// Next byte to load.
    pos: usize,
    /// Position of the next `0xFF` at or after `pos` (or `data.len()`).
    next_ff: usize,
    /// Valid bits, most significant first; bits below the valid ones are 0 or copies of the
    /// bytes that follow (a wide load puts them there, a later load puts the same bits again).
    cache: u64,
    /// How many of the top bits of `cache` are valid.
    valid: u32,
    /// Zero bits supplied past the end of the data.
    padded: u64,
}

impl<'a, const JPEG_LS: bool> Bits<'a, JPEG_LS> {
    /// A reader over the coded bytes of one scan (without its ending marker).
    pub(crate) fn new(data: &'a [u8]) -> Self {
        let mut bits = Bits { data, pos: 0, next_ff: 0, cache: 0, valid: 0, padded: 0 };
        bits.find_ff();
        bits.refill();
        bits
    }

    fn find_ff(&mut self) {
        self.next_ff =
            memchr::memchr(0xFF, &self.data[self.pos..]).map_or(self.data.len(), |i| self.pos + i);
    }

    /// Fill the cache to at least [`REFILLED`] valid bits.
    #[inline(always)]
    pub(crate) fn refill(&mut self) {
        if self.valid >= REFILLED {
            return;
        }
        if self.pos + 8 <= self.next_ff {
            let word = u64::from_be_bytes(self.data[self.pos..self.pos + 8].try_into().unwrap());
            self.cache |= word >> self.valid;
            let bytes = (63 - self.valid) / 8;
            self.pos += bytes as usize;
            self.valid += bytes * 8;
        } else {
            self.refill_bytewise();
        }
    }

    #[cold]
    #[inline(never)]
    fn refill_bytewise(&mut self) {
        while self.valid <= REFILLED {
            let Some(&byte) = self.data.get(self.pos) else {
                // Past the end: 0 bits (the cache already holds 0 there), counted.
                self.valid += 8;
                self.padded += 8;
                continue;
            };
            self.cache |= u64::from(byte) << (REFILLED - self.valid);
            self.valid += 8;
            self.pos += 1;
            if byte == 0xFF {
                if JPEG_LS {
                    // The next byte's top bit is the inserted 0: it lands on this byte's last
                    // bit.
                    self.valid -= 1;
                } else {
                    // The stuffed 0x00 (always there: the data ends before any other byte
                    // after 0xFF).
                    self.pos += 1;
                }
            }
        }
        if self.pos > self.next_ff {
            self.find_ff();
        }
    }

    /// The valid bits, most significant first (call [`Bits::refill`] first).
    #[inline(always)]
    pub(crate) fn peek(&self) -> u64 {
        self.cache
    }

    /// How many bits [`Bits::peek`] holds that are valid.
    #[inline(always)]
    pub(crate) fn valid(&self) -> u32 {
        self.valid
    }

    /// Drop `n` bits (`n` at most [`Bits::valid`] and below 64).
    #[inline(always)]
    pub(crate) fn skip(&mut self, n: u32) {
        debug_assert!(n <= self.valid && n < 64);
        self.cache <<= n;
        self.valid -= n;
    }

    /// One bit.
    #[inline(always)]
    pub(crate) fn bit(&mut self) -> bool {
        self.refill();
        let set = self.cache >> 63 == 1;
        self.skip(1);
        set
    }

    /// The next `n` bits as a number (`n` at most 32).
    #[inline(always)]
    pub(crate) fn value(&mut self, n: u32) -> u32 {
        debug_assert!(n <= 32);
        self.refill();
        // Two shifts, so that n = 0 gives 0 without shifting by 64.
        let v = ((self.cache >> 1) >> (63 - n)) as u32;
        self.skip(n);
        v
    }

    /// Bits of the data not taken yet, counting stuffed bytes as data (JPEG-LS: an upper
    /// bound by one bit per `0xFF`).
    pub(crate) fn left(&self) -> u64 {
        let unloaded = self.data.len().saturating_sub(self.pos);
        (u64::from(self.valid) + 8 * unloaded as u64).saturating_sub(self.padded)
    }

    /// Whether more bits were taken than the data holds.
    pub(crate) fn overrun(&self) -> bool {
        self.padded > u64::from(self.valid)
    }

    /// Whether the bits not yet taken are the end of a scan decoded whole: all 0, and fewer
    /// than 8 of them (the encoder pads its last byte with 0 bits; CharLS too refuses a scan
    /// with a whole byte left over).
    pub(crate) fn only_padding_left(&self) -> bool {
        if self.overrun() {
            return false;
        }
        let unloaded = &self.data[self.pos.min(self.data.len())..];
        // The cache's bits below the valid ones are copies of unloaded bytes: 0 too.
        self.cache == 0 && self.left() < 8 && unloaded.iter().all(|&b| b == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_across_stuffed_bytes_and_wide_loads() {
        // 0xFF then 0x7F: the 7 bits after 0xFF are 1111111 (the top 0 is the inserted bit).
        let mut data = vec![0xA5; 12];
        data.extend_from_slice(&[0xFF, 0x7F, 0x00, 0x80]);
        let mut bits = Bits::<true>::new(&data);
        for _ in 0..12 {
            assert_eq!(bits.value(8), 0xA5);
        }
        assert_eq!(bits.value(15), 0x7FFF);
        assert_eq!(bits.value(8), 0);
        assert!(!bits.only_padding_left(), "a byte with a 1 in it left");
        assert!(bits.bit());
        assert!(!bits.overrun());
        assert!(bits.only_padding_left());
        assert_eq!(bits.value(7), 0);
        assert!(!bits.overrun());
        assert!(bits.only_padding_left());
        assert_eq!(bits.value(1), 0);
        assert!(bits.overrun());
    }

    #[test]
    fn jpeg_drops_stuffed_zero_bytes() {
        let data = [0x12, 0xFF, 0x00, 0x34, 0xFF, 0x00];
        let mut bits = Bits::<false>::new(&data);
        assert_eq!(bits.value(32), 0x12FF_34FF);
        assert_eq!(bits.left(), 0);
        assert!(!bits.overrun());
        assert_eq!(bits.value(1), 0);
        assert!(bits.overrun());
    }

    #[test]
    fn padding_left_over_must_be_zero() {
        let bits = Bits::<true>::new(&[0x00, 0x01]);
        assert!(!bits.only_padding_left());
        let mut bits = Bits::<true>::new(&[0x80, 0x00]);
        assert!(bits.bit());
        assert!(!bits.only_padding_left(), "a whole byte left over");
        let mut bits = Bits::<true>::new(&[0x80]);
        assert!(bits.bit());
        assert!(bits.only_padding_left());
        let mut bits = Bits::<true>::new(&[0x81]);
        assert!(bits.bit());
        assert!(!bits.only_padding_left());
    }
}
