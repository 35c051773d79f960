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
//!   `med3(max of the three rows' minima, med3 of their medians, min of their maxima)`. Two
//!   output rows are made at a time from the four input rows their windows hold: each input
//!   row's horizontal triples are sorted (6 min/max per sample), and the two rows both
//!   windows share give the maximum of their minima, the minimum of their maxima and their
//!   medians as a sorted pair for both outputs (44 min/max for two samples). The loops run
//!   over blocks of a constant 64 samples held in arrays, which the compiler turns into
//!   vector min/max (64 8-bit or 32 16-bit samples at a time with AVX-512), and go down the
//!   image whole rows in order, as the hardware prefetchers expect.
//!   Each row is sorted twice (for two pairs of output rows). Sorting it once into a ring of
//!   row buffers that three output rows read takes fewer min/max (32 for two samples) but
//!   stores and loads three more vectors per row, and with its buffers kept in L1 it went
//!   down the image 2 KiB of a row at a time: in alternating runs of the two builds (one
//!   thread, Gpixel/s), sorting afresh measured 3.7–3.95 against 2.9–3.1 at 2048² RGB, 7.7–8.8
//!   against 6.4–8.2 at 2048² grey and 8.2–8.3 against 6.1–8.0 at 512² grey, the same at 512²
//!   RGB, before the per-piece setup below took a tenth off it as well.
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
//! Measured (release, one thread of a shared 2-core AMD EPYC 9005 machine, AVX-512; this
//! machine's rates drift by a quarter within minutes): size 3 gray16 about 10 Gpixel/s at
//! 512² and 8–10 at 2048², rgb8 about 6 at 512² and 3.5–4.5 at 2048²; size 5 rgb8 (Huang)
//! about 12 Mpixel/s on noise; size 5 gray16 (selection) about 6 Mpixel/s.

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

/// Samples per block of the size-3 network's inner loops: a constant trip count over arrays
/// of constant size, which the compiler turns into whole vectors with no bounds checks and no
/// remainder loop. A row's last block overlaps the one before it instead of running short
/// (its samples are computed twice, the same).
const BLOCK: usize = 64;

/// Image size (bytes) from which the size-3 network fetches the next step's rows ahead: at
/// 512² RGB (768 KiB, in the core's L2) the hints only cost, at 2048² they gain (see
/// `two_rows`). Tests take both paths: small images one, wide ones the other.
const PREFETCH_ABOVE: usize = if cfg!(test) { 4096 } else { 2 << 20 };

multiversion! {
    /// Size 3: output rows `y0..` into `band`.
    fn median3_band<T: Sample | Ord>(img: &Image<T>, y0: usize, band: &mut [T]) => median3_body, avx512_full_width
}

/// The `nb` blocks of `row` from sample `j`, shifted `C` samples left, not, and right: the
/// samples each block's horizontal triples are sorted from.
#[inline(always)]
fn thirds<T, const C: usize>(row: &[T], j: usize, nb: usize) -> [&[[T; BLOCK]]; 3] {
    let part = |from: usize| row[from..from + nb * BLOCK].as_chunks::<BLOCK>().0;
    [part(j - C), part(j), part(j + C)]
}

/// Whether every row's three shifted runs of blocks have `nb` blocks.
#[inline(always)]
fn same_lengths<T, const N: usize>(rows: &[[&[[T; BLOCK]]; 3]; N], nb: usize) -> bool {
    let mut same = true;
    for [l, m, r] in rows {
        same &= l.len() == nb && m.len() == nb && r.len() == nb;
    }
    same
}

/// The interior samples `c..len − c` of a row of `len` samples as [`block_pieces`] in
/// `BLOCK`s: `(first sample, blocks)`.
#[inline(always)]
fn interior_blocks(len: usize, c: usize) -> [(usize, usize); 2] {
    debug_assert!(len - 2 * c >= BLOCK);
    block_pieces(len - 2 * c, BLOCK).map(|(s, n)| (c + s, n / BLOCK))
}

/// Output rows `y` and `y + 1`'s interior samples into `out0` and `out1` (whole rows), from
/// rows `y − 1 ..= y + 2` (`r0..=r3`). The two windows share rows `y` and `y + 1`, so the
/// maximum of those rows' minima, the minimum of their maxima and their medians sorted as a
/// pair serve both.
///
/// With `AHEAD`, each block also asks for the same block of `next` (rows `y + 3` and `y + 4`,
/// or empty past the image): the rows the next step reads first, a step before it needs
/// them. Rows `r2` and `r3` are the first reads of their rows, and beyond the core's caches
/// the loop waited on them (two thirds of its time at 2048² RGB by `perf annotate`); the
/// hardware prefetchers start a new stream with every step's `r3`. In alternating runs of
/// the two builds (one thread, Gpixel/s, 2048²): RGB 3.1 → 4.1 and gray16 9.0–9.8 → 10.3–11.6
/// while this machine's memory was slow, RGB 4.2–4.3 → 4.45–4.55 while it was fast.
#[inline(always)]
fn two_rows<T: Sample + Ord, const C: usize, const AHEAD: bool>(
    [r0, r1, r2, r3]: [&[T]; 4],
    [out0, out1]: [&mut [T]; 2],
    next: [&[T]; 2],
) {
    for (j, nb) in interior_blocks(out0.len(), C) {
        // Written out, not with `map`, which the compiler left as a call per piece: 512²
        // grey went from about 8.1 to 10.2 Gpixel/s, RGB from 4.5 to 6.1.
        let (a, b) = (thirds::<T, C>(r0, j, nb), thirds::<T, C>(r1, j, nb));
        let (c, d) = (thirds::<T, C>(r2, j, nb), thirds::<T, C>(r3, j, nb));
        let o0 = out0[j..j + nb * BLOCK].as_chunks_mut::<BLOCK>().0;
        let o1 = out1[j..j + nb * BLOCK].as_chunks_mut::<BLOCK>().0;
        // Equal lengths, checked once, so the loop's indexing needs no checks.
        assert!(same_lengths(&[a, b, c, d], nb) && o0.len() == nb && o1.len() == nb);
        for i in 0..nb {
            if AHEAD {
                for row in next {
                    if let Some(ahead) = row.get(j + i * BLOCK..j + (i + 1) * BLOCK) {
                        prefetch(ahead);
                    }
                }
            }
            two_blocks(
                [&a[0][i], &a[1][i], &a[2][i]],
                [&b[0][i], &b[1][i], &b[2][i]],
                [&c[0][i], &c[1][i], &c[2][i]],
                [&d[0][i], &d[1][i], &d[2][i]],
                &mut o0[i],
                &mut o1[i],
            );
        }
    }
}

/// Output row `y`'s interior samples into `out` (a whole row), from rows `y − 1 ..= y + 1`.
#[inline(always)]
fn one_row<T: Sample + Ord, const C: usize>([r0, r1, r2]: [&[T]; 3], out: &mut [T]) {
    for (j, nb) in interior_blocks(out.len(), C) {
        let (a, b) = (thirds::<T, C>(r0, j, nb), thirds::<T, C>(r1, j, nb));
        let c = thirds::<T, C>(r2, j, nb);
        let o = out[j..j + nb * BLOCK].as_chunks_mut::<BLOCK>().0;
        // Equal lengths, checked once, so the loop's indexing needs no checks.
        assert!(same_lengths(&[a, b, c], nb) && o.len() == nb);
        for i in 0..nb {
            one_block(
                [&a[0][i], &a[1][i], &a[2][i]],
                [&b[0][i], &b[1][i], &b[2][i]],
                [&c[0][i], &c[1][i], &c[2][i]],
                &mut o[i],
            );
        }
    }
}

/// The block kernel of [`two_rows`]: each input row's three shifted blocks. The outputs are
/// parameters of their own: that tells the compiler they overlap nothing else, so that it
/// vectorises the loop without run-time overlap checks.
#[inline(always)]
fn two_blocks<T: Sample + Ord>(
    [a0, a1, a2]: [&[T; BLOCK]; 3],
    [b0, b1, b2]: [&[T; BLOCK]; 3],
    [c0, c1, c2]: [&[T; BLOCK]; 3],
    [d0, d1, d2]: [&[T; BLOCK]; 3],
    o0: &mut [T; BLOCK],
    o1: &mut [T; BLOCK],
) {
    for k in 0..BLOCK {
        let (la, ma, ha) = sort3(a0[k], a1[k], a2[k]);
        let (lb, mb, hb) = sort3(b0[k], b1[k], b2[k]);
        let (lc, mc, hc) = sort3(c0[k], c1[k], c2[k]);
        let (ld, md, hd) = sort3(d0[k], d1[k], d2[k]);
        let (max_lo, min_hi) = (lb.max(lc), hb.min(hc));
        // Rows y and y + 1's medians sorted: med3 with a third x is max(p, min(q, x)).
        let (p, q) = (mb.min(mc), mb.max(mc));
        o0[k] = med3(max_lo.max(la), p.max(q.min(ma)), min_hi.min(ha));
        o1[k] = med3(max_lo.max(ld), p.max(q.min(md)), min_hi.min(hd));
    }
}

/// The block kernel of [`one_row`] (see [`two_blocks`]).
#[inline(always)]
fn one_block<T: Sample + Ord>(
    [a0, a1, a2]: [&[T; BLOCK]; 3],
    [b0, b1, b2]: [&[T; BLOCK]; 3],
    [c0, c1, c2]: [&[T; BLOCK]; 3],
    o: &mut [T; BLOCK],
) {
    for k in 0..BLOCK {
        let (la, ma, ha) = sort3(a0[k], a1[k], a2[k]);
        let (lb, mb, hb) = sort3(b0[k], b1[k], b2[k]);
        let (lc, mc, hc) = sort3(c0[k], c1[k], c2[k]);
        o[k] = med3(la.max(lb).max(lc), med3(ma, mb, mc), ha.min(hb).min(hc));
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
    // Beyond the core's own caches the two rows each step reads first wait on the shared
    // cache or memory: fetched a step ahead (see `two_rows`).
    let far = std::mem::size_of_val(&img.data[..]) > PREFETCH_ABOVE;
    // Interior rows, interior samples, two output rows at a time, in order down the band.
    let (first, end) = (y0.max(1), (y0 + rows).min(h - 1));
    let mut y = first;
    while y < end {
        let at = (y - y0) * rl;
        if y + 1 < end {
            let (o0, o1) = band[at..at + 2 * rl].split_at_mut(rl);
            let rows = [img.row(y - 1), img.row(y), img.row(y + 1), img.row(y + 2)];
            let ahead = |r: usize| if r < h { img.row(r) } else { &[] };
            let next = [ahead(y + 3), ahead(y + 4)];
            if far {
                two_rows::<T, C, true>(rows, [o0, o1], next);
            } else {
                two_rows::<T, C, false>(rows, [o0, o1], next);
            }
            y += 2;
        } else {
            let rows = [img.row(y - 1), img.row(y), img.row(y + 1)];
            one_row::<T, C>(rows, &mut band[at..at + rl]);
            y += 1;
        }
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
    /// channels of samples), whose rows run over several blocks and end in an overlapping
    /// block, in bands of odd and even heights.
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
