//! XXH3 with the default secret and seed 0, 64- and 128-bit, streaming: the digest of every
//! transfer and every stored chunk. Inputs of 240 bytes or fewer go to `twox-hash`; longer
//! ones are hashed here, because `twox-hash`'s widest loop is AVX2 and the long-input loop is
//! where the time goes. Written by hand for one reason: on a CPU with full-width AVX-512 (AMD
//! Zen 5) the loop below, which sums each block's stripes in four independent chains before
//! adding them to the accumulator (the same sum modulo 2⁶⁴, so the same digest), hashes a
//! cached MiB in about 15.5 µs against `twox-hash`'s 21.5 µs. Without AVX-512 it runs an AVX2
//! loop (as fast as `twox-hash`'s), else plain code. The tests hold every result to
//! `twox-hash`'s, at every length class, in pieces of every size.
//!
//! The algorithm (the XXH3 specification's long-input path): eight 64-bit accumulators; each
//! 64-byte stripe of the input is mixed in with 64 bytes of the secret, 8 bytes further on for
//! each stripe; after every 16 stripes (a block) the accumulators are scrambled. A stripe is
//! taken only once a byte after it is known: the last 64 bytes of the input, whatever is
//! taken already, go in last with their own part of the secret, and the accumulators are
//! merged into 64 bits (and, for the 128-bit digest, again with another part of the secret
//! into the high 64 bits).

use twox_hash::{XxHash3_64, XxHash3_128};

/// The default secret of the specification (`kSecret`).
const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;
const PRIME_MX1: u64 = 0x1656_6791_9E37_79F9;

const STRIPE: usize = 64;
/// Stripes per block: (secret length − stripe) / 8.
const STRIPES_PER_BLOCK: usize = (SECRET.len() - STRIPE) / 8;
/// Up to this many bytes XXH3 takes other paths (done by `twox-hash`), whose 64- and 128-bit
/// digests do not share an accumulator.
pub(crate) const SHORT: usize = 240;

/// Which loop this CPU runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kernel {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kernel {
    fn best() -> Self {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx512f") {
                    return Kernel::Avx512;
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    return Kernel::Avx2;
                }
            }
            Kernel::Scalar
        })
    }

    /// Mix in `stripes` (whole stripes, each with a byte after it), the first as stripe
    /// `done` of its block, scrambling at each block's end; returns the stripes of the last
    /// block now done.
    fn take(self, acc: &mut [u64; 8], stripes: &[u8], done: usize) -> usize {
        debug_assert!(stripes.len().is_multiple_of(STRIPE) && done < STRIPES_PER_BLOCK);
        match self {
            Kernel::Scalar => {
                let mut done = done;
                for s in stripes.chunks_exact(STRIPE) {
                    accumulate_512(acc, s, &SECRET[8 * done..]);
                    done += 1;
                    if done == STRIPES_PER_BLOCK {
                        scramble(acc);
                        done = 0;
                    }
                }
                done
            }
            // SAFETY: chosen only where the CPU has the feature (`Kernel::best`; the tests
            // run each kernel only where it does).
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { simd::take_avx2(acc, stripes, done) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { simd::take_avx512(acc, stripes, done) },
        }
    }
}

fn read64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

/// One stripe, in plain code (the specification's `XXH3_accumulate_512`).
fn accumulate_512(acc: &mut [u64; 8], stripe: &[u8], secret: &[u8]) {
    for i in 0..8 {
        let v = read64(&stripe[8 * i..]);
        let k = v ^ read64(&secret[8 * i..]);
        acc[i ^ 1] = acc[i ^ 1].wrapping_add(v);
        acc[i] = acc[i].wrapping_add((k & 0xFFFF_FFFF).wrapping_mul(k >> 32));
    }
}

/// After each block (the specification's `XXH3_scrambleAcc`, with the secret's last 64 bytes).
fn scramble(acc: &mut [u64; 8]) {
    let secret = &SECRET[SECRET.len() - STRIPE..];
    for (i, a) in acc.iter_mut().enumerate() {
        let x = (*a ^ (*a >> 47)) ^ read64(&secret[8 * i..]);
        *a = x.wrapping_mul(PRIME32_1);
    }
}

/// The accumulators folded into 64 bits from `start` (the specification's `XXH3_mergeAccs`).
fn merge(acc: &[u64; 8], secret: &[u8], start: u64) -> u64 {
    let mut r = start;
    for i in 0..4 {
        let a = acc[2 * i] ^ read64(&secret[16 * i..]);
        let b = acc[2 * i + 1] ^ read64(&secret[16 * i + 8..]);
        let p = u128::from(a) * u128::from(b);
        r = r.wrapping_add(p as u64 ^ (p >> 64) as u64);
    }
    r ^= r >> 37;
    r = r.wrapping_mul(PRIME_MX1);
    r ^ (r >> 32)
}

/// A streaming XXH3 state, finished in 64 or 128 bits.
#[derive(Clone)]
pub struct Xxh3 {
    kernel: Kernel,
    acc: [u64; 8],
    /// Stripes of the current block taken.
    stripes: usize,
    total: u64,
    /// The first bytes, for an input of [`SHORT`] bytes or fewer.
    head: [u8; SHORT],
    /// The bytes after the last stripe taken (at most a stripe: taken when a byte follows).
    pending: [u8; STRIPE],
    pending_len: usize,
    /// The last stripe taken, for the input's last 64 bytes.
    prev: [u8; STRIPE],
}

impl std::fmt::Debug for Xxh3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xxh3").field("total", &self.total).finish()
    }
}

impl Default for Xxh3 {
    fn default() -> Self {
        Self::with_kernel(Kernel::best())
    }
}

impl Xxh3 {
    pub fn new() -> Self {
        Self::default()
    }

    fn with_kernel(kernel: Kernel) -> Self {
        Self {
            kernel,
            acc: [
                PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5,
                PRIME32_1,
            ],
            stripes: 0,
            total: 0,
            head: [0; SHORT],
            pending: [0; STRIPE],
            pending_len: 0,
            prev: [0; STRIPE],
        }
    }

    /// Feed the next bytes.
    pub fn write(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let before = self.total as usize;
        self.total += data.len() as u64;
        if before < SHORT {
            let n = (SHORT - before).min(data.len());
            self.head[before..before + n].copy_from_slice(&data[..n]);
        }
        let mut d = data;
        if self.pending_len > 0 {
            let n = (STRIPE - self.pending_len).min(d.len());
            self.pending[self.pending_len..self.pending_len + n].copy_from_slice(&d[..n]);
            self.pending_len += n;
            d = &d[n..];
            if d.is_empty() {
                return; // no byte after it yet
            }
            let full = self.pending; // a whole stripe, with a byte after it
            self.take(&full);
            self.pending_len = 0;
        }
        let n = (d.len() - 1) / STRIPE;
        self.take(&d[..n * STRIPE]);
        let rest = &d[n * STRIPE..];
        self.pending[..rest.len()].copy_from_slice(rest);
        self.pending_len = rest.len();
    }

    /// Mix in whole stripes, each with a byte after it, scrambling at each block's end.
    fn take(&mut self, stripes: &[u8]) {
        let Some(last) = stripes.len().checked_sub(STRIPE) else { return };
        self.prev.copy_from_slice(&stripes[last..]);
        self.stripes = self.kernel.take(&mut self.acc, stripes, self.stripes);
    }

    /// The accumulators with the input's last stripe in (inputs over [`SHORT`] bytes).
    fn last(&self) -> [u64; 8] {
        let mut last = [0u8; STRIPE];
        let p = self.pending_len;
        last[..STRIPE - p].copy_from_slice(&self.prev[p..]);
        last[STRIPE - p..].copy_from_slice(&self.pending[..p]);
        let mut acc = self.acc;
        accumulate_512(&mut acc, &last, &SECRET[SECRET.len() - STRIPE - 7..]);
        acc
    }

    /// The 64-bit digest of everything fed.
    pub fn finish_64(&self) -> u64 {
        if self.total as usize <= SHORT {
            return XxHash3_64::oneshot(&self.head[..self.total as usize]);
        }
        merge(&self.last(), &SECRET[11..], self.total.wrapping_mul(PRIME64_1))
    }

    /// The 128-bit digest of everything fed (high half first).
    pub fn finish_128(&self) -> u128 {
        if self.total as usize <= SHORT {
            return XxHash3_128::oneshot(&self.head[..self.total as usize]);
        }
        let acc = self.last();
        let low = merge(&acc, &SECRET[11..], self.total.wrapping_mul(PRIME64_1));
        let start = !self.total.wrapping_mul(PRIME64_2);
        let high = merge(&acc, &SECRET[SECRET.len() - STRIPE - 11..], start);
        (u128::from(high) << 64) | u128::from(low)
    }

    /// The 64-bit digest of `data`.
    pub fn oneshot_64(data: &[u8]) -> u64 {
        if data.len() <= SHORT {
            return XxHash3_64::oneshot(data);
        }
        Self::fed(data).finish_64()
    }

    /// The 128-bit digest of `data`.
    pub fn oneshot_128(data: &[u8]) -> u128 {
        if data.len() <= SHORT {
            return XxHash3_128::oneshot(data);
        }
        Self::fed(data).finish_128()
    }

    fn fed(data: &[u8]) -> Self {
        let mut h = Self::new();
        h.write(data);
        h
    }
}

/// Bytes of a xorshift stream from `seed`: test inputs that no short pattern repeats in.
#[cfg(test)]
pub(crate) fn test_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{PRIME32_1, SECRET, STRIPE, STRIPES_PER_BLOCK};

    /// [`super::Kernel::take`] with AVX2: the accumulators in two 32-byte halves.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn take_avx2(acc: &mut [u64; 8], stripes: &[u8], done: usize) -> usize {
        // SAFETY: loads and stores within `acc`, `stripes` and `SECRET` (a stripe's key is
        // the 64 bytes from 8 × its place in the block, at most 8 × 15 + 64 ≤ 192).
        unsafe {
            let a = acc.as_mut_ptr() as *mut __m256i;
            let mut halves = [_mm256_loadu_si256(a), _mm256_loadu_si256(a.add(1))];
            let prime = _mm256_set1_epi32(PRIME32_1 as i32);
            let last = SECRET.as_ptr().add(SECRET.len() - STRIPE);
            let mut done = done;
            for s in stripes.chunks_exact(STRIPE) {
                let k = SECRET.as_ptr().add(8 * done);
                for (h, acc) in halves.iter_mut().enumerate() {
                    let d = _mm256_loadu_si256(s.as_ptr().add(32 * h) as *const __m256i);
                    let key = _mm256_loadu_si256(k.add(32 * h) as *const __m256i);
                    let dk = _mm256_xor_si256(d, key);
                    let p = _mm256_mul_epu32(dk, _mm256_srli_epi64(dk, 32));
                    let swapped = _mm256_shuffle_epi32(d, 0b01_00_11_10);
                    *acc = _mm256_add_epi64(*acc, _mm256_add_epi64(swapped, p));
                }
                done += 1;
                if done == STRIPES_PER_BLOCK {
                    for (h, acc) in halves.iter_mut().enumerate() {
                        let key = _mm256_loadu_si256(last.add(32 * h) as *const __m256i);
                        let x = _mm256_xor_si256(*acc, _mm256_srli_epi64(*acc, 47));
                        let x = _mm256_xor_si256(x, key);
                        let lo = _mm256_mul_epu32(x, prime);
                        let hi = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), prime);
                        *acc = _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
                    }
                    done = 0;
                }
            }
            _mm256_storeu_si256(a, halves[0]);
            _mm256_storeu_si256(a.add(1), halves[1]);
            done
        }
    }

    /// [`super::Kernel::take`] with AVX-512: all eight accumulators in one register, a
    /// block's stripes summed in four chains (modulo 2⁶⁴ the same sum, so the same digest)
    /// so that each addition need not wait for the one before.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn take_avx512(acc: &mut [u64; 8], stripes: &[u8], done: usize) -> usize {
        // SAFETY: as in `take_avx2`.
        unsafe {
            let mut a = _mm512_loadu_si512(acc.as_ptr() as *const _);
            let prime = _mm512_set1_epi32(PRIME32_1 as i32);
            let last = _mm512_loadu_si512(SECRET.as_ptr().add(SECRET.len() - STRIPE) as *const _);
            let mut done = done;
            let mut rest = stripes;
            while !rest.is_empty() {
                let n = (rest.len() / STRIPE).min(STRIPES_PER_BLOCK - done);
                let mut sums = [_mm512_setzero_si512(); 4];
                for (j, s) in rest[..n * STRIPE].chunks_exact(STRIPE).enumerate() {
                    let d = _mm512_loadu_si512(s.as_ptr() as *const _);
                    let k = SECRET.as_ptr().add(8 * (done + j));
                    let dk = _mm512_xor_si512(d, _mm512_loadu_si512(k as *const _));
                    let p = _mm512_mul_epu32(dk, _mm512_srli_epi64(dk, 32));
                    let swapped = _mm512_shuffle_epi32(d, _MM_PERM_BADC);
                    sums[j % 4] = _mm512_add_epi64(sums[j % 4], _mm512_add_epi64(swapped, p));
                }
                let s = _mm512_add_epi64(
                    _mm512_add_epi64(sums[0], sums[1]),
                    _mm512_add_epi64(sums[2], sums[3]),
                );
                a = _mm512_add_epi64(a, s);
                done += n;
                rest = &rest[n * STRIPE..];
                if done == STRIPES_PER_BLOCK {
                    let x = _mm512_xor_si512(a, _mm512_srli_epi64(a, 47));
                    let x = _mm512_xor_si512(x, last);
                    let lo = _mm512_mul_epu32(x, prime);
                    let hi = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), prime);
                    a = _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32));
                    done = 0;
                }
            }
            _mm512_storeu_si512(acc.as_mut_ptr() as *mut _, a);
            done
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every kernel this CPU runs.
    fn kernels() -> Vec<Kernel> {
        let mut k = vec![Kernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                k.push(Kernel::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                k.push(Kernel::Avx512);
            }
        }
        k
    }

    fn check(data: &[u8], cuts: &[usize]) {
        let want64 = XxHash3_64::oneshot(data);
        let want128 = XxHash3_128::oneshot(data);
        for k in kernels() {
            let mut h = Xxh3::with_kernel(k);
            let mut at = 0;
            for &c in cuts.iter().chain([&data.len()]) {
                let c = c.clamp(at, data.len());
                h.write(&data[at..c]);
                at = c;
            }
            assert_eq!(h.finish_64(), want64, "{k:?}, {} bytes, cuts {cuts:?}", data.len());
            assert_eq!(h.finish_128(), want128, "{k:?}, {} bytes, cuts {cuts:?}", data.len());
        }
        assert_eq!(Xxh3::oneshot_64(data), want64);
        assert_eq!(Xxh3::oneshot_128(data), want128);
    }

    /// Every length class and the edges of stripes and blocks, whole and in pieces.
    #[test]
    fn digests_are_twox_hashs() {
        let d = test_bytes(3 << 20, 7);
        let block = STRIPE * STRIPES_PER_BLOCK;
        let mut lens = vec![0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 239, 240, 241, 255, 256, 257];
        for m in [1, 2, 3, 16, 17, 1000] {
            for edge in [block * m, STRIPE * m] {
                lens.extend([edge - 1, edge, edge + 1]);
            }
        }
        lens.extend([1 << 20, (1 << 20) + 5, 3 << 20]);
        for n in lens {
            let data = &d[..n];
            check(data, &[]);
            check(data, &[n / 2]);
            check(data, &[1, 64, 65, 1024, 1025, n - n.min(64)]);
            let every: Vec<usize> = (0..n).step_by(63).collect();
            check(data, &every);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn any_input_in_any_pieces_is_twox_hashs(
            n in 0usize..40_000,
            seed in any::<u64>(),
            cuts in proptest::collection::vec(0usize..40_000, 0..8),
        ) {
            let data = test_bytes(n, seed);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (n + 1)).collect();
            cuts.sort();
            check(&data, &cuts);
        }
    }
}
