//! A JPEG-LS decoder for the streams DICOM holds most: one grey component in one scan
//! (ITU-T T.87, ISO/IEC 14495-1), lossless or near-lossless, 2 to 16 bits, with the default
//! coding parameters or thresholds and a reset value (up to 255) in an LSE segment. `jpegls`
//! hands every other stream (colour, a maximum sample value below 2^P − 1, restart intervals,
//! point transforms, mapping tables) to CharLS.
//!
//! Why by hand when CharLS, the reference codec, is linked anyway: speed. CharLS decodes the
//! bench's 512 × 512 12-bit phantom at 220–250 MB/s, short of the 5× pydicom the imaging issue
//! asks for; this decoder at 280–300 MB/s (`blobstream bench dicom`, lossless and NEAR = 2).
//! It takes the same steps (T.87 A.2–A.7) with fewer unpredictable branches and a shorter
//! chain from one sample to the next: the Golomb parameter from leading-zero counts instead of
//! a loop, kept in the context when it changes; the mapped error from one leading-zero count of
//! a 64-bit cache; the predictor and the bias update as selects; LZCNT and BMI2 where the CPU
//! has them. Its tests hold it to CharLS's output on CharLS's own encodings of many images,
//! lossless and near-lossless, in both builds.
//!
//! # Stream layout (T.87 annex C, markers as T.81 B.1)
//!
//! `FF D8` (SOI); segments `FF xx` + 2-byte big-endian length (length included): SOF55
//! `FF F7` (P bits, Y lines, X columns, Nf components, then Nf × (id, sampling, 0)), optional
//! APPn `FF Ex` and COM `FF FE` (skipped), DRI `FF DD`, LSE `FF F8`; then SOS `FF DA` (Ns,
//! Ns × (component id, mapping table), NEAR, ILV, point transform) followed by the coded bits
//! (see `entropy_bits`), and `FF D9` (EOI).
//!
//! # Hostile input
//!
//! Every loop is bounded by the frame's size; past the data the bit reader supplies 0 bits and
//! the decode fails afterwards. The checks CharLS makes on the context counters (A and B below
//! 2^24, a Golomb parameter below 16, an error of at most 65,535) are made here too, so no
//! arithmetic overflows. A few more refuse what CharLS would decode as something: more zeros
//! in a code than its length limit allows, a run-interruption error above 2^16, and any bit
//! taken past the data. A damaged stream otherwise decodes to what CharLS makes of it, or fails
//! where it fails.

use super::entropy_bits::{Bits, bit_instructions};
use super::jpeg_markers::{be16, only_scan, segments};

/// T.87 A.2.1: the run-length order J for each run index.
const J: [u32; 32] = [
    0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 9, 10, 11, 12, 13,
    14, 15,
];

/// A frame this decoder takes: its header, and the coded bytes of its one scan.
pub(crate) struct Frame<'a> {
    pub width: usize,
    pub height: usize,
    /// Bits per sample (P), 2 to 16.
    pub bits: u32,
    /// The near-lossless bound (0 for lossless).
    near: i32,
    /// Thresholds T1, T2, T3 and RESET (T.87 C.2.4.1.1).
    presets: [i32; 4],
    coded: &'a [u8],
}

/// The frame, if `stream` is one this decoder takes (see the module doc); `None` for CharLS to
/// decode or refuse. `stream` starts with SOI.
pub(crate) fn parse(stream: &[u8]) -> Option<Frame<'_>> {
    let mut sof: Option<(u32, usize, usize)> = None;
    // LSE preset coding parameters (type 1): MAXVAL, T1, T2, T3, RESET (0: the default).
    let mut lse = [0i32; 5];
    for (marker, seg, next) in segments(stream) {
        match marker {
            0xF7 => {
                // SOF55 (only one): P, Y, X, Nf, one component.
                if sof.is_some() || seg.len() != 9 || seg[5] != 1 {
                    return None;
                }
                sof = Some((u32::from(seg[0]), be16(seg, 1)?, be16(seg, 3)?));
            }
            0xDD if seg.len() == 2 && be16(seg, 0)? == 0 => {}
            0xF8 if seg.len() == 11 && seg[0] == 1 => {
                for (k, v) in lse.iter_mut().enumerate() {
                    *v = be16(seg, 1 + 2 * k)? as i32;
                }
            }
            0xE0..=0xEF | 0xFE => {}
            0xDA => {
                // SOS: one component, no mapping table, ILV 0, no point transform.
                let (bits, height, width) = sof?;
                if seg.len() != 6 || seg[0] != 1 || seg[2] != 0 || seg[4] != 0 || seg[5] != 0 {
                    return None;
                }
                let near = i32::from(seg[3]);
                let maxval = (1i32 << bits.min(16)) - 1;
                if !(2..=16).contains(&bits) || width == 0 || height == 0 || near > maxval / 2 {
                    return None;
                }
                let presets = presets(lse, maxval, near)?;
                let coded = only_scan::<true>(stream, next)?;
                return Some(Frame { width, height, bits, near, presets, coded });
            }
            _ => return None,
        }
    }
    None
}

/// T1, T2, T3 and RESET from an LSE segment's values (0: the default), checked as CharLS
/// checks them (T.87 C.2.4.1.1, table C.1); `None` for a MAXVAL other than `maxval` or a RESET
/// above 255, which CharLS decodes (or refuses) instead.
fn presets(lse: [i32; 5], maxval: i32, near: i32) -> Option<[i32; 4]> {
    let [max, t1, t2, t3, reset] = lse;
    if (max != 0 && max != maxval) || reset > 255 || (reset != 0 && reset < 3) {
        return None;
    }
    let (d1, d2, d3) = thresholds(maxval, near);
    let pick = |v: i32, default: i32, low: i32| match v {
        0 => Some(default),
        v if (low..=maxval).contains(&v) => Some(v),
        _ => None,
    };
    let t1 = pick(t1, d1, near + 1)?;
    let t2 = pick(t2, d2, t1)?;
    let t3 = pick(t3, d3, t2)?;
    Some([t1, t2, t3, if reset == 0 { 64 } else { reset }])
}

/// Regular-mode context (T.87 A.2.2): error sums A and B, correction C, count N, and the
/// Golomb parameter k that A and N give (worked out when they change, so that a sample in
/// another context than the one before it does not wait for it).
#[derive(Clone, Copy)]
struct Context {
    a: i32,
    b: i32,
    c: i32,
    n: i32,
    k: u32,
}

/// Run-interruption context (T.87 A.7.2).
#[derive(Clone, Copy)]
struct RunContext {
    a: i32,
    n: i32,
    nn: i32,
    kind: i32,
}

/// The smallest k with `n << k >= a` (T.87 A.10 and A.22), from leading-zero counts.
#[inline(always)]
fn golomb_k(n: i32, a: i32) -> u32 {
    let t = (n.leading_zeros() as i32 - a.leading_zeros() as i32).max(0) as u32;
    t + u32::from((n << t) < a)
}

/// The median edge detector (T.87 A.4.1): min(Ra, Rb) when Rc ≥ max(Ra, Rb), max(Ra, Rb)
/// when Rc ≤ min(Ra, Rb), else Ra + Rb − Rc; that is Ra + Rb − Rc clamped between Ra and Rb,
/// which compiles to selects rather than branches that noise makes unpredictable.
#[inline(always)]
fn predict(ra: i32, rb: i32, rc: i32) -> i32 {
    (ra + rb - rc).clamp(ra.min(rb), ra.max(rb))
}

const CORRUPT: &str = "invalid coded data";

/// The scan's fixed parameters (T.87 A.2.1, C.2.4.1.1) and state.
struct Decoder<'a> {
    bits: Bits<'a, true>,
    maxval: i32,
    near: i32,
    /// 2·NEAR + 1.
    step: i32,
    range: i32,
    qbpp: u32,
    limit: u32,
    reset: i32,
    /// Whether a sample is its prediction plus error in P bits (CharLS's `lossless_traits`:
    /// lossless, P of 8, 12 or 16, RESET 64).
    low_bits: bool,
    /// Gradient quantisation, indexed by difference + maxval.
    quant: Vec<i8>,
    contexts: [Context; 365],
    run: [RunContext; 2],
    run_index: usize,
}

impl<'a> Decoder<'a> {
    fn new(frame: &Frame<'a>) -> Self {
        let maxval = (1i32 << frame.bits) - 1;
        let near = frame.near;
        let step = 2 * near + 1;
        let range = (maxval + 2 * near) / step + 1;
        let qbpp = 32 - (range as u32 - 1).leading_zeros();
        let bpp = frame.bits;
        let limit = 2 * (bpp + bpp.max(8));
        let [t1, t2, t3, reset] = frame.presets;
        let a = 2.max((range + 32) / 64);
        Decoder {
            bits: Bits::new(frame.coded),
            maxval,
            near,
            step,
            range,
            qbpp,
            limit,
            reset,
            low_bits: near == 0 && matches!(frame.bits, 8 | 12 | 16) && reset == 64,
            quant: quantizer(maxval, near, [t1, t2, t3]),
            contexts: [Context { a, b: 0, c: 0, n: 1, k: golomb_k(1, a) }; 365],
            run: [RunContext { a, n: 1, nn: 0, kind: 0 }, RunContext { a, n: 1, nn: 0, kind: 1 }],
            run_index: 0,
        }
    }

    #[inline(always)]
    fn q(&self, d: i32) -> i32 {
        // |d| <= maxval: samples are in 0..=maxval.
        i32::from(self.quant[(d + self.maxval) as usize])
    }

    /// T.87 A.4.5 inverted: the sample from its prediction and error, wrapped modulo the range
    /// and clamped to the sample range; or, as CharLS's lossless 8-, 12- and 16-bit decoders
    /// take it, its low P bits (the same for every valid stream, not for a damaged one).
    #[inline(always)]
    fn reconstruct(&self, predicted: i32, err: i32) -> i32 {
        if self.low_bits {
            return (predicted + err) & self.maxval;
        }
        let mut v = predicted + err * self.step;
        if v < -self.near {
            v += self.range * self.step;
        } else if v > self.maxval + self.near {
            v -= self.range * self.step;
        }
        v.clamp(0, self.maxval)
    }

    /// A mapped error value (T.87 A.5.3 inverted) with Golomb parameter `k` and length limit
    /// `limit`, the long way: codes longer than the cache holds, and escape codes.
    #[cold]
    #[inline(never)]
    fn mapped_slow(&mut self, k: u32, limit: u32) -> Result<i32, &'static str> {
        let most = limit - self.qbpp - 1;
        let mut high = 0u32;
        loop {
            self.bits.refill();
            let z = self.bits.peek().leading_zeros().min(32);
            if z < 32 {
                self.bits.skip(z + 1);
                high += z;
                break;
            }
            self.bits.skip(32);
            high += 32;
            if high > most {
                return Err(CORRUPT);
            }
        }
        if high > most {
            return Err(CORRUPT);
        }
        if high == most {
            return Ok(self.bits.value(self.qbpp) as i32 + 1);
        }
        Ok(((high << k) | self.bits.value(k)) as i32)
    }

    /// One regular-mode sample (T.87 A.3–A.6) in context `qs` (non-zero).
    #[inline(always)]
    fn regular(&mut self, qs: i32, ra: i32, rb: i32, rc: i32) -> Result<i32, &'static str> {
        let sign = qs >> 31;
        let ctx = self.contexts[((qs ^ sign) - sign) as usize];
        let k = ctx.k;
        if k >= 16 {
            return Err(CORRUPT);
        }
        let predicted = (predict(ra, rb, rc) + ((ctx.c ^ sign) - sign)).clamp(0, self.maxval);
        self.bits.refill();
        let cache = self.bits.peek();
        let z = cache.leading_zeros();
        let mapped = if z < self.limit - self.qbpp - 1 && z + 1 + k <= self.bits.valid() {
            let m = (z << k) | (((cache << z << 1) >> 1) >> (63 - k)) as u32;
            self.bits.skip(z + 1 + k);
            m as i32
        } else {
            self.mapped_slow(k, self.limit)?
        };
        let mut err = (mapped >> 1) ^ -(mapped & 1);
        if err.abs() > 65535 {
            return Err(CORRUPT);
        }
        if self.near == 0 {
            // T.87 A.5.2 (k = 0, lossless): the error's sign flips where B says it drifts.
            err ^= (2 * ctx.b + ctx.n - 1) >> 31 & -i32::from(k == 0);
        }
        self.contexts[((qs ^ sign) - sign) as usize] = self.update(ctx, err)?;
        Ok(self.reconstruct(predicted, (err ^ sign) - sign))
    }

    /// T.87 A.12–A.13: a regular context after an error.
    #[inline(always)]
    fn update(&self, mut ctx: Context, err: i32) -> Result<Context, &'static str> {
        ctx.a += err.abs();
        ctx.b += err * self.step;
        if ctx.a >= 1 << 24 || ctx.b.abs() >= 1 << 24 {
            return Err(CORRUPT);
        }
        if ctx.n == self.reset {
            ctx.a >>= 1;
            ctx.b >>= 1;
            ctx.n >>= 1;
        }
        ctx.n += 1;
        // Both cases computed and selected: which applies is as random as the image's noise.
        let (b, n) = (ctx.b, ctx.n);
        let (down, up) = (b + n <= 0, b > 0);
        let b = if down { (b + n).max(1 - n) } else { b };
        ctx.b = if up { (b - n).min(0) } else { b };
        ctx.c += i32::from(up && ctx.c < 127) - i32::from(down && ctx.c > -128);
        ctx.k = golomb_k(ctx.n, ctx.a);
        Ok(ctx)
    }

    /// Run mode (T.87 A.7) from column `x` of `cur` (stored one place right, as `line`
    /// describes): the run's length plus the interruption sample if the line goes on; how many
    /// samples were decoded.
    fn run_mode(&mut self, x: usize, prev: &[i32], cur: &mut [i32]) -> Result<usize, &'static str> {
        let width = cur.len() - 2;
        let ra = cur[x];
        let count = width - x;
        let mut len = 0;
        while self.bits.bit() {
            let step = 1usize << J[self.run_index];
            let n = step.min(count - len);
            len += n;
            if n == step {
                self.run_index = (self.run_index + 1).min(31);
            }
            if len == count {
                break;
            }
        }
        if len != count {
            len += self.bits.value(J[self.run_index]) as usize;
        }
        if len > count {
            return Err(CORRUPT);
        }
        cur[x + 1..x + 1 + len].fill(ra);
        let end = x + len;
        if end == width {
            return Ok(len);
        }
        let rb = prev[end + 1];
        cur[end + 1] = if (ra - rb).abs() <= self.near {
            let err = self.interruption(1)?;
            self.reconstruct(ra, err)
        } else {
            let err = self.interruption(0)?;
            self.reconstruct(rb, err * ((rb - ra) >> 31 | 1))
        };
        self.run_index = self.run_index.saturating_sub(1);
        Ok(len + 1)
    }

    /// The error of a run-interruption sample (T.87 A.7.2), in run context `which`.
    fn interruption(&mut self, which: usize) -> Result<i32, &'static str> {
        let ctx = self.run[which];
        let k = golomb_k(ctx.n, ctx.a + (ctx.n >> 1) * ctx.kind);
        let limit = self.limit - J[self.run_index] - 1;
        self.bits.refill();
        let mapped = self.mapped_slow(k, limit)?;
        if mapped > 1 << 17 {
            return Err(CORRUPT);
        }
        let temp = mapped + ctx.kind;
        let map = temp & 1;
        let abs = (temp + map) / 2;
        let err = if (k != 0 || 2 * ctx.nn >= ctx.n) == (map == 1) { -abs } else { abs };
        let ctx = &mut self.run[which];
        ctx.nn += i32::from(err < 0);
        ctx.a += (mapped + 1 - ctx.kind) >> 1;
        if ctx.n == self.reset {
            ctx.a >>= 1;
            ctx.n >>= 1;
            ctx.nn >>= 1;
        }
        ctx.n += 1;
        Ok(err)
    }

    /// One line into `cur` (sample x at `cur[x + 1]`; `cur[0]` and `prev[width + 1]` are the
    /// edge samples T.87 A.2.1 defines, set here).
    #[inline(always)]
    fn line(&mut self, prev: &mut [i32], cur: &mut [i32]) -> Result<(), &'static str> {
        let width = cur.len() - 2;
        prev[width + 1] = prev[width];
        cur[0] = prev[1];
        let mut x = 0;
        let mut rb = prev[0];
        let mut rd = prev[1];
        while x < width {
            let ra = cur[x];
            let rc = rb;
            rb = rd;
            rd = prev[x + 2];
            let qs = (self.q(rd - rb) * 9 + self.q(rb - rc)) * 9 + self.q(rc - ra);
            if qs != 0 {
                cur[x + 1] = self.regular(qs, ra, rb, rc)?;
                x += 1;
            } else {
                let n = self.run_mode(x, prev, cur)?;
                x += n;
                rb = prev[x];
                rd = prev[x + 1];
            }
        }
        Ok(())
    }
}

/// T.87 A.3.3: the region (−4 ..= 4) of each gradient −maxval ..= maxval.
fn quantize(d: i32, near: i32, [t1, t2, t3]: [i32; 3]) -> i8 {
    match d {
        d if d <= -t3 => -4,
        d if d <= -t2 => -3,
        d if d <= -t1 => -2,
        d if d < -near => -1,
        d if d <= near => 0,
        d if d < t1 => 1,
        d if d < t2 => 2,
        d if d < t3 => 3,
        _ => 4,
    }
}

/// [`quantize`] of every gradient, indexed by gradient + maxval, filled region by region
/// (131,071 entries at 16 bits: one comparison chain each would take a few tenths of a
/// millisecond, a tenth of a frame's decode). Each region ends at one of these gradients, in
/// the order [`quantize`] tests them; one whose end falls below the gradient reached (an LSE
/// segment's T1 above the default T2 it leaves) is never the first match, and is skipped.
fn quantizer(maxval: i32, near: i32, t: [i32; 3]) -> Vec<i8> {
    let [t1, t2, t3] = t;
    let ends = [-t3, -t2, -t1, -near - 1, near, t1 - 1, t2 - 1, t3 - 1, maxval];
    let mut lut = Vec::with_capacity(2 * maxval as usize + 1);
    let mut d = -maxval;
    for end in ends {
        if end >= d {
            let q = quantize(d, near, t);
            lut.extend(std::iter::repeat_n(q, (end - d + 1) as usize));
            d = end + 1;
        }
    }
    lut
}

/// T.87 C.2.4.1.1.1: the default thresholds T1, T2, T3 (as CharLS computes them).
fn thresholds(maxval: i32, near: i32) -> (i32, i32, i32) {
    // T.87 figure C.3's CLAMP: a value above MAXVAL or below the bound becomes the bound.
    let clamp = |i: i32, j: i32| if i > maxval || i < j { j } else { i };
    let (b1, b2, b3) = (3, 7, 21);
    if maxval >= 128 {
        let f = (maxval.min(4095) + 128) / 256;
        let t1 = clamp(f * (b1 - 2) + 2 + 3 * near, near + 1);
        let t2 = clamp(f * (b2 - 3) + 3 + 5 * near, t1);
        (t1, t2, clamp(f * (b3 - 4) + 4 + 7 * near, t2))
    } else {
        let f = 256 / (maxval + 1);
        let t1 = clamp((b1 / f + 3 * near).max(2), near + 1);
        let t2 = clamp((b2 / f + 5 * near).max(3), t1);
        (t1, t2, clamp((b3 / f + 7 * near).max(4), t2))
    }
}

/// Decode the frame to samples as CharLS returns them: one byte each up to 8 bits, else two in
/// native byte order.
pub(crate) fn decode(frame: &Frame<'_>) -> Result<Vec<u8>, &'static str> {
    #[cfg(target_arch = "x86_64")]
    if bit_instructions() {
        #[target_feature(enable = "bmi1,bmi2,lzcnt")]
        fn bmi(frame: &Frame<'_>) -> Result<Vec<u8>, &'static str> {
            decode_any(frame)
        }
        // SAFETY: the CPU has BMI1, BMI2 and LZCNT (`bit_instructions`).
        return unsafe { bmi(frame) };
    }
    decode_any(frame)
}

/// [`decode`] for whichever instruction set the caller is built for.
#[inline(always)]
fn decode_any(frame: &Frame<'_>) -> Result<Vec<u8>, &'static str> {
    let mut dec = Decoder::new(frame);
    let (w, h) = (frame.width, frame.height);
    let wide = frame.bits > 8;
    let mut out = Vec::with_capacity(w * h * if wide { 2 } else { 1 });
    let mut prev = vec![0i32; w + 2];
    let mut cur = vec![0i32; w + 2];
    for _ in 0..h {
        dec.line(&mut prev, &mut cur)?;
        if dec.bits.overrun() {
            return Err("the coded data ends before the last line");
        }
        if wide {
            out.extend(cur[1..=w].iter().flat_map(|&s| (s as u16).to_ne_bytes()));
        } else {
            out.extend(cur[1..=w].iter().map(|&s| s as u8));
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    if !dec.bits.only_padding_left() {
        return Err("coded data left after the last line");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use charls::{CharLS, FrameInfo};

    use crate::dicom::jpeg_markers::{marker_at, with_segment};

    /// Samples of a `w` × `h` image of `bits` bits made of pieces: flat stretches (run mode),
    /// smooth ramps, noise of every amplitude up to the full range (long and escape codes).
    fn image(pieces: &[(u8, u16, u16)], w: usize, h: usize, bits: u32) -> Vec<u16> {
        let max = (1u32 << bits) - 1;
        let mut out = Vec::with_capacity(w * h);
        let mut state = 0x9E37_79B9u32;
        let mut noise = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        'fill: loop {
            for &(kind, len, v) in pieces {
                let base = u32::from(v) & max;
                for k in 0..usize::from(len) {
                    if out.len() == w * h {
                        break 'fill;
                    }
                    let s = match kind % 4 {
                        0 => base,
                        1 => (base + k as u32) & max,
                        2 => (base + noise() % (1 + (u32::from(v) >> 8))) & max,
                        _ => noise() & max,
                    };
                    out.push(s as u16);
                }
            }
        }
        out
    }

    /// Up to `most` pieces for [`image`]: kind, length, value.
    fn pieces(most: usize) -> impl proptest::strategy::Strategy<Value = Vec<(u8, u16, u16)>> {
        proptest::collection::vec((0u8..4, 1u16..300, proptest::num::u16::ANY), 1..most)
    }

    fn encode(samples: &[u16], w: usize, h: usize, bits: u32, near: i32) -> Vec<u8> {
        let bytes: Vec<u8> = if bits > 8 {
            samples.iter().flat_map(|s| s.to_ne_bytes()).collect()
        } else {
            samples.iter().map(|&s| s as u8).collect()
        };
        let info = FrameInfo {
            width: w as u32,
            height: h as u32,
            bits_per_sample: bits as i32,
            component_count: 1,
        };
        CharLS::default().encode(info, near, &bytes).expect("CharLS encodes")
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 400,
            failure_persistence: None,
            ..Default::default()
        })]

        /// CharLS's encoding of any image, lossless or near-lossless, at any depth: decoded to
        /// exactly CharLS's samples.
        #[test]
        fn decodes_as_charls_does(
            pieces in pieces(12),
            w in 1usize..90,
            h in 1usize..40,
            bits in 2u32..=16,
            near in proptest::sample::select(vec![0i32, 0, 1, 2, 3, 7, 40]),
        ) {
            let near = near.min(((1 << bits) - 1) / 2);
            let stream = encode(&image(&pieces, w, h, bits), w, h, bits, near);
            let frame = parse(&stream).expect("a one-component scan");
            proptest::prop_assert_eq!((frame.width, frame.height, frame.bits), (w, h, bits));
            let theirs = CharLS::default().decode(&stream).unwrap();
            proptest::prop_assert_eq!(decode(&frame).unwrap(), &theirs[..]);
            // The baseline build too, whichever build `decode` chose.
            proptest::prop_assert_eq!(decode_any(&frame).unwrap(), theirs);
        }

        /// A corrupted stream is an error or, when it decodes, decodes as CharLS decodes it;
        /// one cut anywhere in its coded bytes is an error. Never a panic.
        #[test]
        fn damaged_streams_fail_or_agree_with_charls(
            pieces in pieces(8),
            bits in proptest::sample::select(vec![8u32, 10, 12, 16]),
            near in 0i32..3,
            flips in proptest::collection::vec((proptest::num::usize::ANY, 1u8..=255), 1..4),
            cut in proptest::num::usize::ANY,
        ) {
            let (w, h) = (48, 24);
            let stream = encode(&image(&pieces, w, h, bits), w, h, bits, near);
            let frame = parse(&stream).expect("a one-component scan");
            let start = frame.coded.as_ptr() as usize - stream.as_ptr() as usize;
            let coded = stream.len() - 2 - start;
            let mut bad = stream.clone();
            for (at, x) in flips {
                bad[start + at % coded] ^= x;
            }
            if let Some(Ok(ours)) = parse(&bad).map(|frame| decode(&frame)) {
                let theirs = CharLS::default().decode(&bad);
                proptest::prop_assert_eq!(Some(ours), theirs.ok());
            }
            let keep = start + cut % coded;
            let mut cut = stream[..keep].to_vec();
            cut.extend_from_slice(&[0xFF, 0xD9]);
            if let Some(frame) = parse(&cut) {
                proptest::prop_assert!(decode(&frame).is_err());
            }
        }
    }

    #[test]
    fn other_streams_are_left_to_charls() {
        let samples = image(&[(3, 100, 0)], 16, 8, 8);
        let stream = encode(&samples, 16, 8, 8, 0);
        assert!(parse(&stream).is_some());
        // Three components, a point transform, a non-zero restart interval: not taken.
        let rgb = FrameInfo { width: 4, height: 4, bits_per_sample: 8, component_count: 3 };
        let colour = CharLS::default().encode(rgb, 0, &[7; 48]).unwrap();
        assert!(parse(&colour).is_none());
        let mut pt = stream.clone();
        pt[marker_at(&stream, 0xDA) + 9] = 1;
        assert!(parse(&pt).is_none());
        let mut dri = with_segment(&stream, 2, &[0xFF, 0xDD, 0, 4, 0, 1]);
        assert!(parse(&dri).is_none());
        dri[7] = 0;
        assert!(parse(&dri).is_some());
        // A DRI CharLS reads with a 3-byte interval, and a second frame header: CharLS's.
        assert!(parse(&with_segment(&stream, 2, &[0xFF, 0xDD, 0, 5, 0, 0, 0])).is_none());
        let sof = marker_at(&stream, 0xF7);
        assert!(parse(&with_segment(&stream, sof, &stream[sof..sof + 13])).is_none());
    }

    #[test]
    fn the_table_quantizes_every_gradient() {
        for (bits, near, lse) in
            [(2, 0, [0; 3]), (8, 0, [0; 3]), (12, 2, [0; 3]), (16, 0, [0; 3]), (5, 7, [0; 3])]
                .into_iter()
                .chain([(8, 1, [5, 5, 9]), (12, 0, [3, 200, 4095]), (4, 0, [15, 15, 15])])
                // T1 above the default T2 and T3 an LSE segment leaves to them.
                .chain([(12, 0, [200, 0, 0]), (8, 2, [60, 0, 0])])
        {
            let maxval = (1 << bits) - 1;
            let [t1, t2, t3, _] =
                presets([0, lse[0], lse[1], lse[2], 0], maxval, near).expect("valid presets");
            let lut = quantizer(maxval, near, [t1, t2, t3]);
            assert_eq!(lut.len(), 2 * maxval as usize + 1);
            for (i, &q) in lut.iter().enumerate() {
                let d = i as i32 - maxval;
                assert_eq!(q, quantize(d, near, [t1, t2, t3]), "{bits} bits near {near} d {d}");
            }
        }
    }

    #[test]
    fn golomb_parameter_matches_the_loop() {
        for n in 1..300 {
            for a in 0..5000 {
                let mut k = 0;
                while (n << k) < a {
                    k += 1;
                }
                assert_eq!(golomb_k(n, a), k, "n {n} a {a}");
            }
        }
    }
}
