//! `despeckle`: the n×n median (MedJava's and xv's Despeckle filter), for noise reduction.
//!
//! # Definition
//!
//! For every pixel (x, y) and every colour channel, the output is the median of that channel
//! over the `size`×`size` window centred on (x, y), **clipped to the image** (the window
//! shrinks at the border, as in xv). With the `N` values of the window sorted ascending,
//! `v₀ <= v₁ <= … <= v_{N−1}`:
//!
//! ```text
//! out = v_{N/2}                        if N is odd  (always so away from the border)
//! out = ⌊(v_{N/2−1} + v_{N/2}) / 2⌋    if N is even (the mean of the two middle values)
//! ```
//!
//! The mean of the two middle values is truncated, as xv's integer division does; it only
//! occurs in clipped windows (for size 3: the edges, 6 values, and the corners, 4 values).
//!
//! Channels are independent (a per-channel median, xv's definition; the paper says "the
//! median colour"), so the output colour need not occur in the window; a vector median would
//! cost far more and is not what xv measured.
//!
//! **Pixel types**: gray8, gray16, rgb8, rgb16 (each colour channel on its own); in rgba8 and
//! rgba16 the colour channels are filtered and alpha is copied unchanged.
//!
//! **Parameter** `size`: the window side, odd, 3..=15, default 3 (the paper's 3×3).
//!
//! # Speed
//!
//! - Size 3, away from the border: a min/max network. The median of a 3×3 window is
//!   `med3(max of the three rows' minima, med3 of their medians, min of their maxima)`. Each
//!   input row's horizontal triples are sorted once (6 min/max per sample) into a ring of
//!   row buffers, where they serve the three output rows whose windows hold that row; two
//!   output rows are made at a time, sharing their two common rows (32 min/max for two
//!   samples). Every loop runs over blocks of a constant 64 samples held in arrays, which
//!   the compiler turns into vector min/max (32 8-bit or 16-bit samples at a time with
//!   AVX-512), and a row chunk's buffers stay in L1.
//!   The first and last rows and columns are min/max networks too: with the pairs or
//!   triples of each column sorted, the two middle values of a clipped window of 6 (or 4)
//!   are a few more min/max away (see `median3_edge_row` and `median_of_two_triples`).
//! - Larger sizes, 8-bit: Huang's sliding histogram (256 bins per channel; per pixel, the
//!   column entering the window is added and the one leaving removed, and the median found by
//!   walking from the previous median, counting values below it), O(size) per pixel plus the
//!   walk, which is long only on noise.
//! - Larger sizes, 16-bit: the window is gathered and the median selected
//!   (`select_nth_unstable`), O(size²) per pixel: correct but slow (a fallback).
//!
//! Rows run in parallel bands; the size-3 network is built for the baseline CPU, for AVX2
//! and for AVX-512 (used where 512-bit vectors run at full width: Intel, AMD's Zen 5; on a
//! Zen 4 EPYC it measured slower than AVX2), the
//! other inner loops for the baseline CPU and AVX2; the result does not depend on the number
//! of threads or on the CPU.
//!
//! Measured (release, one thread of a shared 2-core AMD EPYC 9005 machine, AVX-512): size 3
//! gray16 about 10 Gpixel/s at 512² and 2048², rgb8 about 6 at 512² and 4 at 2048²; size 5
//! rgb8 (Huang) about 12 Mpixel/s on noise; size 5 gray16 (selection) about 6 Mpixel/s.

use std::sync::Arc;

use super::common::{
    bands, block_pieces, builtin_info, copy_alpha, each_depth, multiversion, odd, prefetch,
};
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, ParamInfo, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Despeckle));
}

/// The `despeckle` filter (see the module documentation).
pub struct Despeckle;

impl Filter for Despeckle {
    fn info(&self) -> FilterInfo {
        builtin_info(
            "despeckle",
            "median of a size×size window per colour channel (shrinks at the border)",
            vec![ParamInfo::number("size", 3.0, 3.0, 15.0, "window side in pixels, odd")],
        )
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let r = odd(&info, params, "size")? / 2;
        Ok(each_depth!(img, i => median(i, r, run)))
    }
}

/// The median of the module documentation with window side `2 * radius + 1`.
///
/// # Panics
///
/// If `radius > 7` (size 15) or the image's fields disagree (see [`Image::from_vec`]).
pub fn median<T: Sample + Ord>(img: &Image<T>, radius: usize, run: &Run) -> Image<T> {
    assert!(radius <= 7, "median radius {radius} > 7");
    let (w, h, c) = (img.width, img.height, img.channels);
    if radius == 0 || w == 0 || h == 0 {
        return img.clone();
    }
    let rl = w * c;
    let mut out = Image::for_overwrite(w, h, c);
    bands(run, &mut out.data, rl, |y0, band| {
        if radius == 1 {
            median3_band::<T>(img, y0, band);
        } else if T::MAX == 255 {
            huang_band(img, radius, y0, band);
        } else {
            sorted_band(img, radius, y0, band);
        }
        let start = y0 * rl;
        copy_alpha(band, &img.data[start..start + band.len()], c);
    });
    out
}

/// The median of a clipped window, by sorting it (`buf` is scratch).
fn window_median<T: Sample + Ord>(
    img: &Image<T>,
    x: usize,
    y: usize,
    ch: usize,
    r: usize,
    buf: &mut Vec<T>,
) -> T {
    buf.clear();
    for yy in y.saturating_sub(r)..(y + r + 1).min(img.height) {
        let row = img.row(yy);
        for xx in x.saturating_sub(r)..(x + r + 1).min(img.width) {
            buf.push(row[xx * img.channels + ch]);
        }
    }
    let n = buf.len();
    let hi = *buf.select_nth_unstable(n / 2).1;
    if n % 2 == 1 {
        return hi;
    }
    // v_{n/2 − 1}: the largest of the part below the selected one.
    let lo = buf[..n / 2].iter().copied().max().unwrap_or(hi);
    T::from_u32((lo.to_u32() + hi.to_u32()) / 2)
}

/// [`window_median`] for size 3, on the stack: gather at most 9 values, insertion-sort.
#[inline(always)]
fn window_median3<T: Sample + Ord>(img: &Image<T>, x: usize, y: usize, ch: usize) -> T {
    let mut v = [T::default(); 9];
    let mut n = 0;
    for yy in y.saturating_sub(1)..(y + 2).min(img.height) {
        let row = img.row(yy);
        for xx in x.saturating_sub(1)..(x + 2).min(img.width) {
            let s = row[xx * img.channels + ch];
            let mut i = n;
            while i > 0 && v[i - 1] > s {
                v[i] = v[i - 1];
                i -= 1;
            }
            v[i] = s;
            n += 1;
        }
    }
    if n % 2 == 1 { v[n / 2] } else { T::from_u32((v[n / 2 - 1].to_u32() + v[n / 2].to_u32()) / 2) }
}

#[inline(always)]
fn sort3<T: Ord + Copy>(a: T, b: T, c: T) -> (T, T, T) {
    let (lo, hi) = (a.min(b), a.max(b));
    (lo.min(c), lo.max(hi.min(c)), hi.max(c))
}

#[inline(always)]
fn med3<T: Ord + Copy>(a: T, b: T, c: T) -> T {
    a.min(b).max(a.max(b).min(c))
}

/// Bytes of a row chunk in the size-3 network: the sorted triples of four rows of a chunk,
/// two input and two output rows take 16 × this, which stays in L1 (2048 measured faster
/// than whole rows of 2048² gray16, 10 against 8 Gpixel/s). Unit tests use two blocks, so
/// their small images cross chunk boundaries.
const CHUNK_BYTES: usize = if cfg!(test) { 2 * BLOCK * 2 } else { 2048 };

/// Samples per block of the size-3 network's inner loops: a constant trip count over arrays
/// of constant size, which the compiler turns into whole vectors with no bounds checks and no
/// remainder loop. A chunk's last block overlaps the one before it instead of running short
/// (its samples are computed twice, the same).
const BLOCK: usize = 64;

multiversion! {
    /// Size 3: output rows `y0..` into `band`.
    fn median3_band<T: Sample | Ord>(img: &Image<T>, y0: usize, band: &mut [T]) => median3_body, avx512_full_width
}

/// The pieces of `0..len` (`len >= BLOCK`) as `(first sample, blocks, first block's index
/// in a ring slot)`: [`block_pieces`] in `BLOCK`s, its overlapping last block kept in a slot's
/// next block (its first sample rounded up to a block).
fn pieces(len: usize) -> [(usize, usize, usize); 2] {
    debug_assert!(len >= BLOCK);
    block_pieces(len, BLOCK).map(|(s, n)| (s, n / BLOCK, s.div_ceil(BLOCK)))
}

/// One block of a row's sorted horizontal triples: `[lo, mid, hi]`, where `lo[k] <= mid[k]
/// <= hi[k]` are the samples `j − C`, `j` and `j + C` of the row for the block's k-th `j`.
type Triples<T> = [[T; BLOCK]; 3];

/// The `nb` blocks of `row` from sample `j`, shifted `C` samples left, not, and right: the
/// samples each block's triples are sorted from.
#[inline(always)]
fn thirds<T, const C: usize>(row: &[T], j: usize, nb: usize) -> [&[[T; BLOCK]]; 3] {
    let part = |from: usize| row[from..from + nb * BLOCK].as_chunks::<BLOCK>().0;
    [part(j - C), part(j), part(j + C)]
}

/// Output blocks `s..` of `out`, `nb` of them.
#[inline(always)]
fn out_blocks<T>(out: &mut [T], s: usize, nb: usize) -> &mut [[T; BLOCK]] {
    out[s..s + nb * BLOCK].as_chunks_mut::<BLOCK>().0
}

/// Sort the triples of `row`'s samples `js..js + len` into `t` (a ring slot).
#[inline(always)]
fn sort_row<T: Sample + Ord, const C: usize>(
    row: &[T],
    js: usize,
    len: usize,
    t: &mut [Triples<T>],
) {
    for (s, nb, bi) in pieces(len) {
        let [v, m, r] = thirds::<T, C>(row, js + s, nb);
        for (((v, m), r), t) in v.iter().zip(m).zip(r).zip(&mut t[bi..bi + nb]) {
            for k in 0..BLOCK {
                (t[0][k], t[1][k], t[2][k]) = sort3(v[k], m[k], r[k]);
            }
        }
    }
}

/// Output row `y`'s samples `js..js + len` into `out`, given the triples `a` and `b` of rows
/// `y − 1` and `y`; `row` is row `y + 1`, whose triples go into `t`. The median of a 3×3
/// window is med3(max of its three rows' minima, med3 of their medians, min of their maxima).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn one_row<T: Sample + Ord, const C: usize>(
    row: &[T],
    js: usize,
    len: usize,
    t: &mut [Triples<T>],
    [a, b]: [&[Triples<T>]; 2],
    out: &mut [T],
) {
    for (s, nb, bi) in pieces(len) {
        let [v, m, r] = thirds::<T, C>(row, js + s, nb);
        let (t, a, b) = (&mut t[bi..bi + nb], &a[bi..bi + nb], &b[bi..bi + nb]);
        let out = out_blocks(out, s, nb);
        // Equal lengths, checked once, so the loop's indexing needs no checks.
        assert!(v.len() == nb && m.len() == nb && r.len() == nb && out.len() == nb);
        for i in 0..nb {
            one_block(&v[i], &m[i], &r[i], &mut t[i], &a[i], &b[i], &mut out[i]);
        }
    }
}

/// Output rows `y` and `y + 1` at once into `out0` and `out1`, given the triples `a` and `b`
/// of rows `y − 1` and `y`; `rows` are rows `y + 1` and `y + 2`, whose triples go into `t1`
/// and `t2`. The two windows share rows `y` and `y + 1`, so the maximum of those rows'
/// minima, the minimum of their maxima and their medians sorted as a pair serve both (32
/// min/max for two outputs rather than 36).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn two_rows<T: Sample + Ord, const C: usize>(
    [row1, row2]: [&[T]; 2],
    js: usize,
    len: usize,
    [t1, t2]: [&mut [Triples<T>]; 2],
    [a, b]: [&[Triples<T>]; 2],
    [out0, out1]: [&mut [T]; 2],
) {
    for (s, nb, bi) in pieces(len) {
        let [v1, m1, r1] = thirds::<T, C>(row1, js + s, nb);
        let [v2, m2, r2] = thirds::<T, C>(row2, js + s, nb);
        let (t1, t2) = (&mut t1[bi..bi + nb], &mut t2[bi..bi + nb]);
        let (a, b) = (&a[bi..bi + nb], &b[bi..bi + nb]);
        let (o0, o1) = (out_blocks(out0, s, nb), out_blocks(out1, s, nb));
        // Equal lengths, checked once, so the loop's indexing needs no checks.
        assert!([v1.len(), m1.len(), r1.len(), v2.len(), m2.len(), r2.len()] == [nb; 6]);
        assert!(o0.len() == nb && o1.len() == nb);
        for i in 0..nb {
            let (t1, t2, o0, o1) = (&mut t1[i], &mut t2[i], &mut o0[i], &mut o1[i]);
            two_blocks(
                &v1[i], &m1[i], &r1[i], &v2[i], &m2[i], &r2[i], t1, t2, &a[i], &b[i], o0, o1,
            );
        }
    }
}

/// The block kernel of [`one_row`]. Every array is a parameter of its own: only those tell
/// the compiler that the arrays do not overlap, so that it vectorises the loop without
/// run-time overlap checks (references inside an array or tuple parameter do not).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn one_block<T: Sample + Ord>(
    v: &[T; BLOCK],
    m: &[T; BLOCK],
    r: &[T; BLOCK],
    t: &mut Triples<T>,
    a: &Triples<T>,
    b: &Triples<T>,
    out: &mut [T; BLOCK],
) {
    for k in 0..BLOCK {
        let (lo, mid, hi) = sort3(v[k], m[k], r[k]);
        (t[0][k], t[1][k], t[2][k]) = (lo, mid, hi);
        let max_lo = lo.max(a[0][k]).max(b[0][k]);
        let min_hi = hi.min(a[2][k]).min(b[2][k]);
        out[k] = med3(max_lo, med3(mid, a[1][k], b[1][k]), min_hi);
    }
}

/// The block kernel of [`two_rows`] (each array a parameter of its own, as in [`one_block`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn two_blocks<T: Sample + Ord>(
    v1: &[T; BLOCK],
    m1: &[T; BLOCK],
    r1: &[T; BLOCK],
    v2: &[T; BLOCK],
    m2: &[T; BLOCK],
    r2: &[T; BLOCK],
    t1: &mut Triples<T>,
    t2: &mut Triples<T>,
    a: &Triples<T>,
    b: &Triples<T>,
    o0: &mut [T; BLOCK],
    o1: &mut [T; BLOCK],
) {
    for k in 0..BLOCK {
        let (lo1, mid1, hi1) = sort3(v1[k], m1[k], r1[k]);
        let (lo2, mid2, hi2) = sort3(v2[k], m2[k], r2[k]);
        (t1[0][k], t1[1][k], t1[2][k]) = (lo1, mid1, hi1);
        (t2[0][k], t2[1][k], t2[2][k]) = (lo2, mid2, hi2);
        let (max_lo, min_hi) = (b[0][k].max(lo1), b[2][k].min(hi1));
        // Rows y and y + 1's medians sorted: med3 with a third x is max(p, min(q, x)).
        let (p, q) = (b[1][k].min(mid1), b[1][k].max(mid1));
        o0[k] = med3(max_lo.max(a[0][k]), p.max(q.min(a[1][k])), min_hi.min(a[2][k]));
        o1[k] = med3(max_lo.max(lo2), p.max(q.min(mid2)), min_hi.min(hi2));
    }
}

#[inline(always)]
fn median3_body<T: Sample + Ord>(img: &Image<T>, y0: usize, band: &mut [T]) {
    match img.channels {
        1 => median3_rows::<T, 1>(img, y0, band),
        3 => median3_rows::<T, 3>(img, y0, band),
        _ => median3_rows::<T, 4>(img, y0, band),
    }
}

/// [`median3_body`] for images of `C` channels (a constant, so the three samples of a triple
/// are constant offsets apart).
#[inline(always)]
fn median3_rows<T: Sample + Ord, const C: usize>(img: &Image<T>, y0: usize, band: &mut [T]) {
    let (w, h) = (img.width, img.height);
    debug_assert_eq!(img.channels, C);
    let rl = w * C;
    let rows = band.len() / rl;
    if h < 3 || w < 3 || rl - 2 * C < BLOCK {
        // Small images: the window of every sample, gathered and sorted.
        for (i, orow) in band.chunks_exact_mut(rl).enumerate() {
            for x in 0..w {
                for ch in 0..C {
                    orow[x * C + ch] = window_median3(img, x, y0 + i, ch);
                }
            }
        }
        return;
    }
    // The first and last rows of the image: two rows in the window.
    for (i, orow) in band.chunks_exact_mut(rl).enumerate() {
        let y = y0 + i;
        if y == 0 || y + 1 == h {
            let other = if y == 0 { img.row(1) } else { img.row(h - 2) };
            median3_edge_row(img.row(y), other, C, orow);
        }
    }
    // Interior rows, interior samples j in [C, rl − C), chunk by chunk down the band, two
    // output rows at a time. Each row's sorted triples serve the three output rows whose
    // windows hold it, so every input row is sorted once, not three times, and every load of
    // the combining step is at the same offset as its store.
    let (first, end) = (y0.max(1), (y0 + rows).min(h - 1));
    if first >= end {
        return;
    }
    let interior = rl - 2 * C;
    let chunk = (CHUNK_BYTES / std::mem::size_of::<T>()).max(BLOCK).min(interior);
    // Blocks in a ring slot: a chunk, a short remainder merged into it, the overlapping block.
    let slot = (chunk + BLOCK).div_ceil(BLOCK) + 1;
    let mut ring = vec![[[T::default(); BLOCK]; 3]; 4 * slot];
    let mut js = C;
    while js < rl - C {
        let left = rl - C - js;
        // A remainder shorter than a block joins this chunk.
        let len = if left < chunk + BLOCK { left } else { chunk };
        // `old`: the triples of the two rows above the next output row; `new`: room for two.
        let (old, new) = ring.split_at_mut(2 * slot);
        let (mut old, mut new) = (old, new);
        for (y, t) in [first - 1, first].into_iter().zip(old.chunks_exact_mut(slot)) {
            sort_row::<T, C>(img.row(y), js, len, t);
        }
        let mut y = first;
        while y < end {
            let (a, b) = old.split_at(slot);
            let (t1, t2) = new.split_at_mut(slot);
            let at = (y - y0) * rl + js;
            // This chunk of the rows two steps down, into the cache while this step runs: the
            // chunks go down the image 2 KiB a row, a stride the hardware prefetchers do not
            // follow far (rgb8 2048², one thread: about 3.4–4.0 → 4.2–4.7 Gpixel/s; one step
            // ahead gained half that, 512² is in cache either way).
            for ahead in [y + 5, y + 6].into_iter().filter(|&r| r < h) {
                prefetch(&img.row(ahead)[js..js + len]);
            }
            if y + 1 < end {
                let (o0, o1) = band[at..at + rl + len].split_at_mut(rl);
                let rows = [img.row(y + 1), img.row(y + 2)];
                two_rows::<T, C>(rows, js, len, [t1, t2], [a, b], [o0, o1]);
                std::mem::swap(&mut old, &mut new);
                y += 2;
            } else {
                one_row::<T, C>(img.row(y + 1), js, len, t1, [a, b], &mut band[at..at + len]);
                y += 1;
            }
        }
        js += len;
    }
    // The first and last pixels of interior rows: windows of two columns of three rows.
    for y in first..end {
        let (a, b, d) = (img.row(y - 1), img.row(y), img.row(y + 1));
        let orow = &mut band[(y - y0) * rl..(y - y0 + 1) * rl];
        for (x, nx) in [(0, 1), (w - 1, w - 2)] {
            for ch in 0..C {
                let at = |row: &[T], x: usize| row[x * C + ch];
                let t = sort3(at(a, x), at(b, x), at(d, x));
                let u = sort3(at(a, nx), at(b, nx), at(d, nx));
                orow[x * C + ch] = median_of_two_triples(t, u);
            }
        }
    }
}

/// The mean of the two middle values of six given as two sorted triples `t` and `u`: the
/// third smallest is `min(u₂, max(t₀, u₁), max(t₁, u₀), t₂)` (the k-th smallest of two sorted
/// lists is the least, over every split i + j = k, of the larger of `t_{i−1}` and `u_{j−1}`),
/// and the fourth smallest, by symmetry, `max(u₀, min(t₂, u₁), min(t₁, u₂), t₀)`.
#[inline(always)]
fn median_of_two_triples<T: Sample + Ord>(t: (T, T, T), u: (T, T, T)) -> T {
    let v2 = u.2.min(t.0.max(u.1)).min(t.1.max(u.0)).min(t.2);
    let v3 = u.0.max(t.2.min(u.1)).max(t.1.min(u.2)).max(t.0);
    T::from_u32((v2.to_u32() + v3.to_u32()) / 2)
}

/// The mean of the two middle values of four given as two sorted pairs: `max(p₀, q₀)` and
/// `min(p₁, q₁)` (the smallest and largest of the four are `min(p₀, q₀)` and `max(p₁, q₁)`).
#[inline(always)]
fn median_of_two_pairs<T: Sample + Ord>(p: (T, T), q: (T, T)) -> T {
    T::from_u32((p.0.max(q.0).to_u32() + p.1.min(q.1).to_u32()) / 2)
}

/// Size 3 on the first or last row of an image at least 3×3: the window has the row `a` and
/// its one neighbour `b`, six values (four at the corners). Away from the corners, with each
/// column's pair sorted (`lₖ <= hₖ`) and the lows and highs sorted among themselves, the
/// smallest value is the least low and the largest the greatest high, so the two middle
/// values are the middle two of {2nd and 3rd low, 1st and 2nd high}: two sorted pairs.
#[inline(always)]
fn median3_edge_row<T: Sample + Ord>(a: &[T], b: &[T], c: usize, out: &mut [T]) {
    let rl = a.len();
    let len = rl - 2 * c;
    let (a0, a1, a2) = (&a[..len], &a[c..c + len], &a[2 * c..]);
    let (b0, b1, b2) = (&b[..len], &b[c..c + len], &b[2 * c..]);
    for (j, o) in out[c..rl - c].iter_mut().enumerate() {
        let (l0, h0) = (a0[j].min(b0[j]), a0[j].max(b0[j]));
        let (l1, h1) = (a1[j].min(b1[j]), a1[j].max(b1[j]));
        let (l2, h2) = (a2[j].min(b2[j]), a2[j].max(b2[j]));
        let (_, lm, lx) = sort3(l0, l1, l2);
        let (hn, hm, _) = sort3(h0, h1, h2);
        *o = median_of_two_pairs((lm, lx), (hn, hm));
    }
    for (x, nx) in [(0, 1), (rl / c - 1, rl / c - 2)] {
        for ch in 0..c {
            let (p, q) = ((a[x * c + ch], b[x * c + ch]), (a[nx * c + ch], b[nx * c + ch]));
            out[x * c + ch] =
                median_of_two_pairs((p.0.min(p.1), p.0.max(p.1)), (q.0.min(q.1), q.0.max(q.1)));
        }
    }
}

/// Larger sizes, 8-bit: Huang's sliding histogram, channel by channel.
fn huang_band<T: Sample + Ord>(img: &Image<T>, r: usize, y0: usize, band: &mut [T]) {
    let (w, h, c) = (img.width, img.height, img.channels);
    let rl = w * c;
    let mut hist = [0u16; 256];
    for (i, orow) in band.chunks_exact_mut(rl).enumerate() {
        let y = y0 + i;
        let rows = y.saturating_sub(r)..(y + r + 1).min(h);
        let ny = rows.len();
        for ch in 0..img.color_channels() {
            hist.fill(0);
            // Values at column x of the window's rows.
            let column = |x: usize| rows.clone().map(move |yy| img.data[(yy * w + x) * c + ch]);
            for x in 0..(r + 1).min(w) {
                column(x).for_each(|v| hist[v.to_u32() as usize] += 1);
            }
            // `m` is a value and `below` the number of window values less than `m`.
            let (mut m, mut below) = (0usize, 0usize);
            for x in 0..w {
                let n = ny * ((x + r).min(w - 1) - x.saturating_sub(r) + 1);
                let (k1, k2) = ((n - 1) / 2, n / 2);
                // Move m to the value of rank k1: below <= k1 < below + hist[m].
                while below > k1 {
                    m -= 1;
                    below -= hist[m] as usize;
                }
                while below + hist[m] as usize <= k1 {
                    below += hist[m] as usize;
                    m += 1;
                }
                let v = if k2 == k1 || below + (hist[m] as usize) > k2 {
                    m as u32
                } else {
                    let next = (m + 1..256).find(|&v| hist[v] > 0).unwrap_or(m);
                    (m as u32 + next as u32) / 2
                };
                orow[x * c + ch] = T::from_u32(v);
                // Slide: the column x − r leaves, x + r + 1 enters.
                if x >= r {
                    for v in column(x - r) {
                        let v = v.to_u32() as usize;
                        hist[v] -= 1;
                        below -= usize::from(v < m);
                    }
                }
                if x + r + 1 < w {
                    for v in column(x + r + 1) {
                        let v = v.to_u32() as usize;
                        hist[v] += 1;
                        below += usize::from(v < m);
                    }
                }
            }
        }
    }
}

/// Larger sizes, 16-bit: select the median of each gathered window.
fn sorted_band<T: Sample + Ord>(img: &Image<T>, r: usize, y0: usize, band: &mut [T]) {
    let (w, c) = (img.width, img.channels);
    let mut buf = Vec::with_capacity((2 * r + 1) * (2 * r + 1));
    for (i, orow) in band.chunks_exact_mut(w * c).enumerate() {
        for x in 0..w {
            for ch in 0..img.color_channels() {
                orow[x * c + ch] = window_median(img, x, y0 + i, ch, r, &mut buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::filters::common::testkit::*;

    /// The definition, written as directly as possible.
    fn naive<T: Sample + Ord>(img: &Image<T>, size: usize) -> Image<T> {
        let r = size / 2;
        let mut out = img.clone();
        for y in 0..img.height {
            for x in 0..img.width {
                for ch in 0..img.color_channels() {
                    let mut v = Vec::new();
                    for yy in y.saturating_sub(r)..=(y + r).min(img.height - 1) {
                        for xx in x.saturating_sub(r)..=(x + r).min(img.width - 1) {
                            v.push(img.get(xx, yy, ch).to_u32());
                        }
                    }
                    v.sort();
                    let n = v.len();
                    let m = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2 };
                    out.data[(y * img.width + x) * img.channels + ch] = T::from_u32(m);
                }
            }
        }
        out
    }

    fn naive_dyn(img: &DynImage, size: usize) -> DynImage {
        match img {
            DynImage::U8(i) => DynImage::U8(naive(i, size)),
            DynImage::U16(i) => DynImage::U16(naive(i, size)),
        }
    }

    #[test]
    fn gray8_3x3_every_pixel() {
        // A speck (200) in a dark field with one bright corner.
        let img = img8(3, 3, 1, &[10, 20, 90, 40, 200, 60, 70, 80, 30]);
        let out = apply(&Despeckle, &img, &[]);
        // (0,0) {10,20,40,200}: (20+40)/2 = 30. (1,0) {10,20,90,40,200,60}: (40+60)/2 = 50.
        // (2,0) {20,90,200,60}: (60+90)/2 = 75. (0,1) {10,20,40,200,70,80}: (40+70)/2 = 55.
        // (1,1) all nine: 60. (2,1) {20,90,200,60,80,30}: (60+80)/2 = 70.
        // (0,2) {40,200,70,80}: (70+80)/2 = 75. (1,2) {40,200,60,70,80,30}: (60+70)/2 = 65.
        // (2,2) {200,60,80,30}: (60+80)/2 = 70.
        assert_eq!(data8(&out), [30, 50, 75, 55, 60, 70, 75, 65, 70]);
    }

    #[test]
    fn even_count_mean_truncates() {
        // 2×1: both windows are {1, 4}: (1 + 4) / 2 = 2.5 → 2.
        assert_eq!(data8(&apply(&Despeckle, &img8(2, 1, 1, &[1, 4]), &[])), [2, 2]);
    }

    #[test]
    fn gray16_and_rgba_every_pixel() {
        // 5×3 gray16, size 3: the interior pixels (1..=3, 1) see full windows.
        #[rustfmt::skip]
        let img = img16(5, 3, 1, &[
            1, 2, 3, 4, 5,
            60000, 7, 60000, 9, 10,
            11, 12, 13, 14, 15,
        ]);
        let out = data16(&apply(&Despeckle, &img, &[]));
        // Row 1, x = 1: {1,2,3,60000,7,60000,11,12,13} → 11; x = 2: {2,3,4,7,60000,9,12,13,14}
        // → 9; x = 3: {3,4,5,60000,9,10,13,14,15} → 10.
        assert_eq!(&out[6..9], [11, 9, 10]);
        // Corners: (0,0) {1,2,60000,7}: (2+7)/2 = 4; (4,2) {9,10,14,15}: (10+14)/2 = 12.
        assert_eq!((out[0], out[14]), (4, 12));
        assert_eq!(out, data16(&naive_dyn(&img, 3)));
        // rgba8: the red speck goes, alpha stays.
        let mut px = vec![];
        for i in 0..9u8 {
            px.extend_from_slice(&[if i == 4 { 255 } else { 10 }, 20, 30, i]);
        }
        let out = data8(&apply(&Despeckle, &img8(3, 3, 4, &px), &[]));
        assert_eq!(&out[16..20], [10, 20, 30, 4]);
        for (i, p) in out.chunks(4).enumerate() {
            assert_eq!(p[3], i as u8);
        }
    }

    #[test]
    fn removes_salt_and_pepper() {
        let mut d = vec![100u8; 64];
        d[9] = 255;
        d[30] = 0;
        d[45] = 255;
        for size in ["3", "5", "7"] {
            let out = apply(&Despeckle, &img8(8, 8, 1, &d), &[("size", size)]);
            assert_eq!(data8(&out), vec![100; 64], "size {size}");
        }
    }

    #[test]
    fn bad_parameters_are_errors() {
        let img = img8(2, 2, 1, &[0; 4]);
        for bad in ["1", "4", "17", "3.5", "", "-3"] {
            let e = Despeckle.apply(&img, &Params::new().with("size", bad), &Run::single());
            assert!(matches!(e, Err(ImagingError::BadParam { .. })), "{bad}: {e:?}");
        }
        let e = Despeckle.apply(&img, &Params::new().with("radius", 1), &Run::single());
        assert!(matches!(e, Err(ImagingError::UnknownParam { .. })));
    }

    #[test]
    fn tiny_and_broken_images() {
        for img in tiny_images() {
            for size in [3, 5, 15] {
                let out = Despeckle.apply(&img, &Params::new().with("size", size), &Run::single());
                assert_eq!(out.unwrap(), naive_dyn(&img, size));
            }
        }
        for img in broken_images() {
            let e = Despeckle.apply(&img, &Params::new(), &Run::single());
            assert!(matches!(e, Err(ImagingError::InvalidImage(_))));
        }
    }

    #[test]
    fn every_build_matches_too() {
        on_every_build(any_image(12, 6), |img| {
            prop_assert_eq!(apply(&Despeckle, &img, &[]), naive_dyn(&img, 3));
            Ok(())
        });
    }

    /// Images wide enough for the size-3 network's blocks (rows of at least `BLOCK` + 2
    /// channels of samples), whose rows cross chunk boundaries (a few blocks in tests) and
    /// end in an overlapping block, in bands of odd and even heights.
    #[test]
    fn wide_images_on_every_build() {
        on_every_build(any_image(300, 9), |img| {
            prop_assert_eq!(apply(&Despeckle, &img, &[]), naive_dyn(&img, 3));
            Ok(())
        });
    }

    proptest! {
        #[test]
        fn wide_images_same_on_one_and_three_threads(img in any_image(300, 14)) {
            same_on_threads(&Despeckle, &img, &Params::new());
        }

        #[test]
        fn matches_the_definition(
            img in any_image(20, 12),
            size in prop::sample::select(vec![3usize, 5, 7, 15]),
        ) {
            let out = Despeckle.apply(&img, &Params::new().with("size", size), &Run::single());
            prop_assert_eq!(out.unwrap(), naive_dyn(&img, size));
        }

        #[test]
        fn constant_stays_constant(img in constant_image(20, 20), size in 1usize..8) {
            let out = Despeckle.apply(&img, &Params::new().with("size", 2 * size + 1), &Run::single());
            prop_assert_eq!(out.unwrap(), img);
        }

        #[test]
        fn same_on_one_and_three_threads(img in any_image(9, 40), size in 1usize..4) {
            same_on_threads(&Despeckle, &img, &Params::new().with("size", 2 * size + 1));
        }
    }
}
