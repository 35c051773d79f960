//! `sharpen`: xv's and MedJava's Sharpen filter, which exaggerates the difference between a
//! pixel's brightness and the mean brightness around it, keeping hue and saturation.
//!
//! # Definition
//!
//! The brightness of a pixel is its HSV value `v = max(R, G, B)` (gray images: the sample
//! itself), on the image's scale `0..=MAX` (255 or 65535). For every pixel not on the
//! 1-pixel border, with `S` the sum of `v` over the 3×3 window centred on it (so the mean is
//! `S/9`) and `p` the `amount`:
//!
//! ```text
//! v' = clamp(⌊(9v − p·S) · g + 1/2⌋, 0, MAX),   g = 1 / (9(1 − p))
//! ```
//!
//! that is `(v − p·mean)/(1 − p)` rounded half up, computed in double precision (IEEE
//! operations in this order, no fused multiply-add, so every build gives the same result;
//! it can differ from exact real arithmetic only where the value is within about 10⁻¹⁰ of a
//! half). xv and the paper give the same formula on values normalised to 0..1; with the
//! default `p = 0.75`, `v' = 4v − 3·mean`.
//!
//! The new brightness is applied by scaling the colour, which keeps hue and saturation:
//! each colour channel `c` becomes `⌊(c·v' + ⌊v/2⌋) / v⌋` (`c·v'/v` rounded half up, exact:
//! see `Exact` in the source for why its floating-point arithmetic gives this floor). The
//! largest channel becomes exactly `v'`, none exceeds it, and a black pixel (`v = 0`) stays
//! black (HSV has no hue to keep there; xv does the same). Gray: the output is `v'`.
//!
//! **Border**: the pixels of the 1-pixel frame are copied unchanged (as in xv); images
//! narrower or shorter than 3 pixels are returned unchanged.
//!
//! **Pixel types**: gray8, gray16, rgb8, rgb16; rgba8 and rgba16 as RGB with alpha copied
//! unchanged. 16-bit images use the same formula with `MAX = 65535`.
//!
//! **Parameter** `amount` (`p`): 0..=0.99, default 0.75 (xv's default). `p = 0` returns the
//! image unchanged; `p` near 1 amplifies differences without bound (before the clamp).
//!
//! # Speed
//!
//! Each band keeps the value rows (max over the channels) of the three rows around the
//! output row, computed once per input row; window sums are two vectorised passes of slice
//! additions; `v'` is computed on whole rows in double precision. RGB colours are scaled
//! sixteen pixels at a time, split into channels by vector shuffles so that each pixel's
//! divisor serves its three samples where it stands (RGBA: laid out per sample); 8-bit
//! samples multiply by the pixel's reciprocal (exact: see `Exact`), 16-bit ones divide in
//! double precision. Inner loops are built for the baseline CPU, AVX2 and AVX-512; rows run
//! in parallel bands; the result does not depend on the number of threads or on the CPU (no
//! fused multiply-adds).
//!
//! Measured (release, one thread, AVX-512, in one process alternating with the previous
//! per-sample division): rgb8 about 0.48 Gpixel/s at 2048² and 0.45 at 4096² (0.35 and 0.30
//! before), rgb16 0.24 and 0.22 (0.18 and 0.18).

use std::sync::Arc;

use super::common::{bands, builtin_info, copy_alpha, each_depth, multiversion};
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, ParamInfo, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Sharpen));
}

/// The `sharpen` filter (see the module documentation).
pub struct Sharpen;

impl Filter for Sharpen {
    fn info(&self) -> FilterInfo {
        builtin_info(
            "sharpen",
            "brightness v = max(R,G,B) becomes (v − p·mean3×3(v))/(1 − p); hue and saturation kept",
            vec![ParamInfo::number("amount", 0.75, 0.0, 0.99, "p: how strongly to sharpen")],
        )
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let p = info.number(params, "amount")?;
        Ok(each_depth!(img, i => sharpen(i, p, run)))
    }
}

/// The sharpen of the module documentation with amount `p`.
///
/// # Panics
///
/// If `p` is not in `0..1` or the image's fields disagree (see [`Image::from_vec`]).
pub fn sharpen<T: Sample>(img: &Image<T>, p: f64, run: &Run) -> Image<T> {
    assert!((0.0..1.0).contains(&p), "sharpen amount {p} outside 0..1");
    let (w, h, c) = (img.width, img.height, img.channels);
    if w < 3 || h < 3 || p == 0.0 {
        return img.clone();
    }
    let rl = w * c;
    let g = 1.0 / (9.0 * (1.0 - p));
    let mut out = Image::for_overwrite(w, h, c);
    bands(run, &mut out.data, rl, |y0, band| sharpen_band::<T>(img, p, g, y0, band));
    out
}

multiversion! {
    /// Output rows `y0..` into `band`.
    fn sharpen_band<T: Sample>(img: &Image<T>, p: f64, g: f64, y0: usize, band: &mut [T])
        => sharpen_band_body, avx512
}

#[inline(always)]
fn sharpen_band_body<T: Sample>(img: &Image<T>, p: f64, g: f64, y0: usize, band: &mut [T]) {
    let (w, h, c) = (img.width, img.height, img.channels);
    let rl = w * c;
    // Value rows of y − 1, y, y + 1 (rotated as y advances), window sums, new values.
    let mut vals = [vec![0u32; w], vec![0u32; w], vec![0u32; w]];
    let mut vs = vec![0u32; w];
    let mut nv = vec![0u32; w];
    let (mut scratch32, mut scratch64) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    let mut loaded = usize::MAX; // the y whose rows y − 1 ..= y + 1 are in `vals`
    for (i, orow) in band.chunks_exact_mut(rl).enumerate() {
        let y = y0 + i;
        let src = img.row(y);
        if y == 0 || y + 1 == h {
            orow.copy_from_slice(src);
            continue;
        }
        if loaded != usize::MAX && loaded + 1 == y {
            vals.rotate_left(1);
            value_row(img.row(y + 1), c, &mut vals[2]);
        } else {
            for (k, v) in vals.iter_mut().enumerate() {
                value_row(img.row(y + k - 1), c, v);
            }
        }
        loaded = y;
        for (((d, &a), &b), &e) in vs.iter_mut().zip(&vals[0]).zip(&vals[1]).zip(&vals[2]) {
            *d = a + b + e;
        }
        // v' for x in 1..w − 1: S = vs[x − 1] + vs[x] + vs[x + 1].
        let n = w - 2;
        let (s0, s1, s2, v) = (&vs[..n], &vs[1..n + 1], &vs[2..n + 2], &vals[1][1..n + 1]);
        let max = T::MAX as f64;
        for (j, o) in nv[1..n + 1].iter_mut().enumerate() {
            let s = (s0[j] + s1[j] + s2[j]) as f64;
            let x = ((9 * v[j]) as f64 - p * s) * g + 0.5;
            // Clamped into 0..=MAX, truncation is the floor (and vectorises, unlike floor()).
            let x = if x < 0.0 {
                0.0
            } else if x > max {
                max
            } else {
                x
            };
            // SAFETY: x is finite (from finite sums, p and g) and in 0..=MAX, which an i32
            // holds; the unchecked conversion vectorises where `as` (saturating) does not.
            *o = unsafe { x.to_int_unchecked::<i32>() } as u32;
        }
        // The frame columns are copied; the rest scaled to the new value.
        orow[..c].copy_from_slice(&src[..c]);
        orow[rl - c..].copy_from_slice(&src[rl - c..]);
        let (o, s) = (&mut orow[c..rl - c], &src[c..rl - c]);
        let (nv, v) = (&nv[1..n + 1], &vals[1][1..n + 1]);
        match (c, T::MAX == 255) {
            (1, _) => {
                for (o, &n) in o.iter_mut().zip(nv) {
                    *o = T::from_u32(n);
                }
            }
            (3, true) => scale_rgb::<T, f32>(o, s, nv, v),
            (_, true) => scale_colours::<T, f32, 4>(o, s, nv, v, &mut scratch32),
            (3, false) => scale_rgb::<T, f64>(o, s, nv, v),
            (_, false) => scale_colours::<T, f64, 4>(o, s, nv, v, &mut scratch64),
        }
        copy_alpha(orow, src, c);
    }
}

/// The value row (max over the colour channels) of `row` into `dst`. A function rather than
/// a closure so that it is inlined into, and built for, each build of the band function.
#[inline(always)]
fn value_row<T: Sample>(row: &[T], c: usize, dst: &mut [u32]) {
    if c == 1 {
        for (d, &s) in dst.iter_mut().zip(row) {
            *d = s.to_u32();
        }
    } else if c == 3 {
        // Sixteen pixels at a time: split into channels at fixed offsets (which the compiler
        // turns into vector shuffles; a stride-3 loop of unknown length stays scalar), then
        // the maximum of whole channel arrays.
        const P: usize = 16;
        let whole = dst.len() / P * P;
        let (head, tail) = dst.split_at_mut(whole);
        for (d, px) in head.chunks_exact_mut(P).zip(row.chunks_exact(3 * P)) {
            let (mut r, mut g, mut b) = ([T::default(); P], [T::default(); P], [T::default(); P]);
            for i in 0..P {
                (r[i], g[i], b[i]) = (px[3 * i], px[3 * i + 1], px[3 * i + 2]);
            }
            for i in 0..P {
                d[i] = r[i].to_u32().max(g[i].to_u32()).max(b[i].to_u32());
            }
        }
        for (d, px) in tail.iter_mut().zip(row[3 * whole..].chunks_exact(3)) {
            *d = px[0].to_u32().max(px[1].to_u32()).max(px[2].to_u32());
        }
    } else {
        for (d, px) in dst.iter_mut().zip(row.chunks_exact(c)) {
            *d = px[0].to_u32().max(px[1].to_u32()).max(px[2].to_u32());
        }
    }
}

/// How `⌊num / v⌋` is computed exactly in floating point for this sample type's numerators
/// `num = c·v' + ⌊v/2⌋` (integers, `v >= 1`): `per_pixel(v)` once per pixel, then
/// `div_floor(num, per_pixel(v))` per colour sample.
trait Exact: Copy + Default {
    fn of(v: u32) -> Self;
    fn per_pixel(v: u32) -> Self;
    fn div_floor(num: Self, per_pixel: Self) -> u32;
}

/// 8-bit samples: a multiplication by the pixel's reciprocal, nudged up by `2^-12`.
/// `num <= 255·255 + 127 < 2^16` is exact in f32 and the quotient `q` is at most 255.5. The
/// reciprocal and the product are each within a relative `2^-24`, the sum within half an ulp
/// below 256 (`2^-17`): the computed `num·(1/v) + 2^-12` lies within `256·2^-23 + 2^-17 <
/// 2^-14` of `q + 2^-12`, so above `q` (an integer quotient truncates to itself) and, as a
/// `q` that is not an integer lies at least `1/v >= 1/255` below the next integer, below that
/// integer: truncation gives the exact floor. One division per pixel rather than per sample.
impl Exact for f32 {
    #[inline(always)]
    fn of(v: u32) -> Self {
        v as i32 as f32
    }
    #[inline(always)]
    fn per_pixel(v: u32) -> Self {
        1.0 / v as i32 as f32
    }
    #[inline(always)]
    fn div_floor(num: Self, inv: Self) -> u32 {
        // SAFETY: 0 <= num·inv + 2^-12 < 256 (above), in i32's range; the unchecked
        // conversion vectorises where `as` (saturating) does not.
        unsafe { (num * inv + 1.0 / 4096.0).to_int_unchecked::<i32>() as u32 }
    }
}

/// 16-bit samples: a correctly rounded division. The numerators are below 2^33, exact in
/// f64, and a quotient that is not an integer lies at least `1/v` below the next one, far
/// more than the rounding error, so truncating the rounded quotient gives the exact floor.
impl Exact for f64 {
    #[inline(always)]
    fn of(v: u32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn per_pixel(v: u32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn div_floor(num: Self, den: Self) -> u32 {
        // SAFETY: den >= 1 and 0 <= num < 2^33, and num/den <= v' + 1/2 <= 65535.5, so the
        // quotient is finite and in i32's range; the unchecked conversion vectorises.
        unsafe { (num / den).to_int_unchecked::<i32>() as u32 }
    }
}

/// [`scale_colours`] for RGB, sixteen pixels at a time: split into channels at fixed offsets
/// (vector shuffles), each channel scaled by its pixels' own divisors, then merged back, so
/// no divisor is laid out per sample. A row that is not a whole number of blocks ends with
/// one more block over its last sixteen pixels (scaling is per pixel, so pixels done twice
/// come out the same).
#[inline(always)]
fn scale_rgb<T: Sample, F: Exact>(out: &mut [T], src: &[T], nv: &[u32], v: &[u32]) {
    const P: usize = 16;
    let n = nv.len();
    if n < P {
        return scale_rgb_block::<T, F>(out, src, nv, v);
    }
    let starts = (0..n / P).map(|b| b * P).chain((!n.is_multiple_of(P)).then_some(n - P));
    for i in starts {
        let (o, s) = (&mut out[3 * i..3 * (i + P)], &src[3 * i..3 * (i + P)]);
        scale_rgb_block::<T, F>(o, s, &nv[i..i + P], &v[i..i + P]);
    }
}

/// [`scale_rgb`] of the pixels of one block (sixteen, or fewer in a short row).
#[inline(always)]
fn scale_rgb_block<T: Sample, F: Exact>(out: &mut [T], src: &[T], nv: &[u32], v: &[u32]) {
    const P: usize = 16;
    if nv.len() == P {
        let mut num = [[F::default(); P]; 3];
        let mut div = [F::default(); P];
        for i in 0..P {
            let half = v[i] / 2;
            div[i] = F::per_pixel(v[i].max(1));
            for k in 0..3 {
                num[k][i] = F::of(src[3 * i + k].to_u32() * nv[i] + half);
            }
        }
        for i in 0..P {
            for k in 0..3 {
                out[3 * i + k] = T::from_u32(F::div_floor(num[k][i], div[i]));
            }
        }
        return;
    }
    let px = out.chunks_exact_mut(3).zip(src.chunks_exact(3));
    for ((o, s), (&nv, &v)) in px.zip(nv.iter().zip(v)) {
        let (half, d) = (v / 2, F::per_pixel(v.max(1)));
        for k in 0..3 {
            o[k] = T::from_u32(F::div_floor(F::of(s[k].to_u32() * nv + half), d));
        }
    }
}

/// Colour samples scaled to the new value: `⌊(s·v' + ⌊v/2⌋) / v⌋` (0 where `v = 0`). The
/// numerators and the pixels' divisors are laid out per sample first, so that the last step
/// runs on whole vectors.
#[inline(always)]
fn scale_colours<T: Sample, F: Exact, const C: usize>(
    out: &mut [T],
    src: &[T],
    nv: &[u32],
    v: &[u32],
    (num, den): &mut (Vec<F>, Vec<F>),
) {
    num.resize(src.len(), F::default());
    // Alpha positions (C = 4) are never set: they stay 0 / the divisor of 1, and the caller
    // copies alpha.
    den.resize(src.len(), F::per_pixel(1));
    let per_px = num.chunks_exact_mut(C).zip(den.chunks_exact_mut(C)).zip(src.chunks_exact(C));
    for (((num, den), px), (&nv, &v)) in per_px.zip(nv.iter().zip(v)) {
        let (half, d) = (v / 2, F::per_pixel(v.max(1)));
        for k in 0..3 {
            // s <= v, so v = 0 means s = 0 and the quotient 0.
            num[k] = F::of(px[k].to_u32() * nv + half);
            den[k] = d;
        }
    }
    for (o, (&n, &d)) in out.iter_mut().zip(num.iter().zip(den.iter())) {
        *o = T::from_u32(F::div_floor(n, d));
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::filters::common::testkit::*;

    #[test]
    fn eight_bit_scaling_is_the_exact_floor_for_every_input() {
        // Every value v, channel s <= v and new value v' of an 8-bit pixel.
        for v in 1u32..=255 {
            let inv = f32::per_pixel(v);
            for s in 0..=v {
                for nv in 0..=255 {
                    let num = s * nv + v / 2;
                    assert_eq!(f32::div_floor(f32::of(num), inv), num / v, "s {s} v' {nv} v {v}");
                }
            }
        }
    }

    #[test]
    fn rgb_rows_of_every_width_around_the_blocks() {
        // Inner rows of 1 to 38 pixels: shorter than a 16-pixel block, exactly one or two,
        // and whole blocks followed by a last block overlapping them.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for w in 3..=40 {
            let h = 4;
            let d8: Vec<u8> = (0..w * h * 3).map(|_| next() as u8).collect();
            let d16: Vec<u16> = (0..w * h * 3).map(|_| next() as u16).collect();
            for img in [img8(w, h, 3, &d8), img16(w, h, 3, &d16)] {
                each_build(|| assert_eq!(apply(&Sharpen, &img, &[]), naive_dyn(&img, 0.75)));
            }
        }
    }

    /// The definition, written as directly as possible (exact integer arithmetic where the
    /// definition's double-precision value cannot round differently).
    fn naive<T: Sample>(img: &Image<T>, p: f64) -> Image<T> {
        let (w, h, c) = (img.width, img.height, img.channels);
        let mut out = img.clone();
        let val = |x: usize, y: usize| {
            (0..img.color_channels()).map(|k| img.get(x, y, k).to_u32()).max().unwrap()
        };
        for y in 1..h.saturating_sub(1) {
            for x in 1..w.saturating_sub(1) {
                let v = val(x, y);
                let mut s = 0;
                for yy in y - 1..=y + 1 {
                    for xx in x - 1..=x + 1 {
                        s += val(xx, yy);
                    }
                }
                let nv =
                    (((9 * v) as f64 - p * s as f64) * (1.0 / (9.0 * (1.0 - p))) + 0.5).floor();
                let nv = nv.clamp(0.0, T::MAX as f64) as u64;
                for k in 0..img.color_channels() {
                    let o = if v == 0 {
                        0
                    } else {
                        (img.get(x, y, k).to_u32() as u64 * nv + (v / 2) as u64) / v as u64
                    };
                    out.data[(y * w + x) * c + k] = T::from_u32(o as u32);
                }
            }
        }
        out
    }

    fn naive_dyn(img: &DynImage, p: f64) -> DynImage {
        match img {
            DynImage::U8(i) => DynImage::U8(naive(i, p)),
            DynImage::U16(i) => DynImage::U16(naive(i, p)),
        }
    }

    #[test]
    fn gray8_every_pixel() {
        // 4×3: only (1,1) and (2,1) are inside the frame.
        #[rustfmt::skip]
        let img = img8(4, 3, 1, &[
            10, 10, 10, 10,
            10, 40, 10, 10,
            10, 10, 10, 100,
        ]);
        let out = data8(&apply(&Sharpen, &img, &[]));
        // (1,1): S = 8·10 + 40 = 120, v' = 4·40 − 120/3 = 120.
        // (2,1): S = 10·7 + 40 + 100 = 210, v' = 40 − 70 = −30 → 0.
        assert_eq!(out, [10, 10, 10, 10, 10, 120, 0, 10, 10, 10, 10, 100]);
        // amount 0.5: v' = 2v − S/9: (1,1): 80 − 13.33 = 66.67 → 67; (2,1): 20 − 23.3 → 0.
        let out = data8(&apply(&Sharpen, &img, &[("amount", "0.5")]));
        assert_eq!(&out[5..7], [67, 0]);
        // Bright: 4·250 − 10 → clamped to 255.
        let img = img8(3, 3, 1, &[10, 10, 10, 0, 250, 0, 0, 0, 0]);
        assert_eq!(data8(&apply(&Sharpen, &img, &[]))[4], 255);
    }

    #[test]
    fn gray16_every_pixel() {
        let img = img16(3, 3, 1, &[1000, 1000, 1000, 1000, 2000, 1000, 1000, 1000, 1000]);
        let out = data16(&apply(&Sharpen, &img, &[]));
        // S = 10000, v' = 8000 − 3333.3 = 4666.7 → 4667; frame unchanged.
        assert_eq!(out, [1000, 1000, 1000, 1000, 4667, 1000, 1000, 1000, 1000]);
        let img = img16(3, 3, 1, &[0, 0, 0, 0, 30000, 0, 0, 0, 0]);
        assert_eq!(data16(&apply(&Sharpen, &img, &[]))[4], 65535);
    }

    #[test]
    fn rgb_and_rgba_keep_hue() {
        // Centre (100, 50, 0) in a field of (20, 20, 20): v = 100, S = 8·20 + 100 = 260,
        // v' = 400 − 86.67 = 313.3 → 255 (clamped); colour scaled by 255/100:
        // R 255, G (50·255 + 50)/100 = 128 (127.5 rounded up), B 0.
        let mut px = vec![];
        for i in 0..9 {
            px.extend_from_slice(if i == 4 { &[100, 50, 0, 7] } else { &[20, 20, 20, 9] });
        }
        let out = data8(&apply(&Sharpen, &img8(3, 3, 4, &px), &[]));
        assert_eq!(&out[16..20], [255, 128, 0, 7]);
        assert_eq!(&out[..16], &px[..16]);
        // Darker: centre (40, 20, 10) among (60, 60, 60): S = 520, v' = 160 − 173.3 → 0: black.
        let mut px = vec![];
        for i in 0..9 {
            px.extend_from_slice(if i == 4 { &[40, 20, 10] } else { &[60, 60, 60] });
        }
        let out = data8(&apply(&Sharpen, &img8(3, 3, 3, &px), &[]));
        assert_eq!(&out[12..15], [0, 0, 0]);
        // rgb16: centre (3000, 1000, 2000) among (1000, 1000, 1000): S = 11000,
        // v' = 12000 − 3666.7 = 8333.3 → 8333; G = (1000·8333 + 1500)/3000 = 2778,
        // B = (2000·8333 + 1500)/3000 = 5555.
        let mut px = vec![];
        for i in 0..9 {
            px.extend_from_slice(if i == 4 { &[3000, 1000, 2000] } else { &[1000, 1000, 1000] });
        }
        let out = data16(&apply(&Sharpen, &img16(3, 3, 3, &px), &[]));
        assert_eq!(&out[12..15], [8333, 2778, 5555]);
        // A black pixel stays black.
        let mut px = vec![200u8; 27];
        px[12..15].fill(0);
        assert_eq!(&data8(&apply(&Sharpen, &img8(3, 3, 3, &px), &[]))[12..15], [0, 0, 0]);
    }

    #[test]
    fn bad_parameters_are_errors() {
        let img = img8(3, 3, 1, &[0; 9]);
        for bad in ["1", "-0.1", "0.995", "x", "inf"] {
            let e = Sharpen.apply(&img, &Params::new().with("amount", bad), &Run::single());
            assert!(matches!(e, Err(ImagingError::BadParam { .. })), "{bad}: {e:?}");
        }
        let e = Sharpen.apply(&img, &Params::new().with("p", 0.5), &Run::single());
        assert!(matches!(e, Err(ImagingError::UnknownParam { .. })));
    }

    #[test]
    fn tiny_and_broken_images() {
        for img in tiny_images() {
            assert_eq!(apply(&Sharpen, &img, &[]), img);
        }
        for img in broken_images() {
            let e = Sharpen.apply(&img, &Params::new(), &Run::single());
            assert!(matches!(e, Err(ImagingError::InvalidImage(_))));
        }
    }

    #[test]
    fn every_build_matches_too() {
        on_every_build(any_image(12, 6), |img| {
            prop_assert_eq!(apply(&Sharpen, &img, &[]), naive_dyn(&img, 0.75));
            Ok(())
        });
        // Rows long enough for the 16-pixel RGB blocks and a tail after them.
        on_every_build(any_image(40, 4), |img| {
            prop_assert_eq!(apply(&Sharpen, &img, &[]), naive_dyn(&img, 0.75));
            Ok(())
        });
    }

    proptest! {
        #[test]
        fn matches_the_definition(
            img in any_image(16, 10),
            p in prop::sample::select(vec![0.0, 0.25, 0.5, 0.75, 0.9, 0.99]),
        ) {
            let out = Sharpen.apply(&img, &Params::new().with("amount", p), &Run::single());
            prop_assert_eq!(out.unwrap(), naive_dyn(&img, p));
        }

        #[test]
        fn constant_stays_constant(img in constant_image(12, 12), p in 0.0f64..0.99) {
            // v' = (9v − 9pv)/(9(1 − p)) = v, and the colour scale factor is 1.
            let out = Sharpen.apply(&img, &Params::new().with("amount", p), &Run::single());
            prop_assert_eq!(out.unwrap(), img);
        }

        #[test]
        fn same_on_one_and_three_threads(img in any_image(9, 40)) {
            same_on_threads(&Sharpen, &img, &Params::new());
        }
    }
}
