//! `pixelize`: MedJava's and xv's Pixelize filter, the image as a mosaic of flat blocks.
//!
//! # Definition
//!
//! The image is cut into blocks of `block_w`×`block_h` pixels on a grid **centred on the
//! image**: the `w mod block_w` columns left over are split between a partial block at the
//! left (`⌊(w mod block_w) / 2⌋` columns) and one at the right (the rest), and likewise for
//! rows. With `ox = ⌊(w mod block_w)/2⌋` (and `oy` for rows), column `x` belongs to block
//! column `⌊(x + (block_w − ox) mod block_w) / block_w⌋`.
//!
//! Every pixel of a block gets the block's mean colour: per colour channel, the sum over the
//! block's pixels (only those inside the image, for the partial blocks at the edges) divided
//! by their number, rounded half up (`⌊(Σ + ⌊n/2⌋) / n⌋`).
//!
//! When the side divides evenly the grid starts at the image's edge. A side shorter than a
//! block is all leftover, so (from 2 pixels on) it is split in two partial blocks near its
//! middle: a 2-pixel wide image in 4-wide blocks becomes two 1-wide columns.
//!
//! The paper and xv use 4×4 blocks; xv also centres its grid. **Pixel types**: gray8,
//! gray16, rgb8, rgb16; rgba8 and rgba16 as RGB with alpha copied unchanged (a mosaic of a
//! cut-out keeps its outline).
//!
//! **Parameters** `block_w`, `block_h`: 1..=256 pixels, default 4 each. 1×1 returns the
//! image unchanged.
//!
//! # Speed
//!
//! One pass over the image, bands of output rows in parallel (the result does not depend on
//! the number of threads). Each block row's output row is made once and copied to that
//! block row's rows, specialised for 1, 3 and 4 channels and built for AVX2 and AVX-512
//! (`common::multiversion!`):
//!
//! 1. its rows are summed into column sums, up to four rows per pass, in 16 bits for 8-bit
//!    images where a block's sum fits (twice the lanes per vector), else 32 (`sums::Acc`);
//!    while the output rows are written, the next block row's input rows are prefetched
//!    (`common::prefetch`: at 2048², where the image is no longer in the core's caches,
//!    about a fifth faster over many runs);
//! 2. the partial blocks at the left and right edges sum their columns one by one;
//! 3. the inner blocks (up to [`VECTOR_MAX`] wide) are computed at **every sample**, in
//!    vectors: the window sum of `block_w` column sums starting there and its mean, divided
//!    by a multiply-high and a shift or in exact single precision (`sums::Acc::divide_fast`);
//!    then each block's first pixel is copied over the block by `log2(block_w)` passes of
//!    vectorised selects (`hold`). This does `block_w` times the arithmetic needed, but all
//!    of it in wide vectors with no per-block gathers or scatters of 3-sample pixels, which
//!    is what made the per-block version slow. Wider blocks, and blocks without a fast
//!    divider, sum each block on its own.
//!
//! Measured (release, one thread of a Zen 5 EPYC VM, rgb8, 4×4; a harness timing the filter
//! alone, many runs): about 6.5 Gpixel/s at 512² and 5–5.7 at 2048² (3.4–3.8 with the caches
//! flushed before each run); the per-block version it replaced made 1.3 and 1.1 (3-sample
//! pixel writes went through `memcpy` calls: a third of its time). In `bench filters`
//! (few runs per round, after its 25 ms warm-up) 2048² came out at 5.1–5.8.

use std::sync::Arc;

use super::common::{
    bands, block_pieces, builtin_info, copy_alpha, each_depth, multiversion, prefetch, whole,
};
use super::sums::Acc;
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, ParamInfo, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Pixelize));
}

/// The `pixelize` filter (see the module documentation).
pub struct Pixelize;

/// Largest block side.
const MAX_BLOCK: usize = 256;

impl Filter for Pixelize {
    fn info(&self) -> FilterInfo {
        builtin_info(
            "pixelize",
            "mean colour of each block_w×block_h block, on a grid centred on the image",
            vec![
                ParamInfo::number("block_w", 4.0, 1.0, MAX_BLOCK as f64, "block width in pixels"),
                ParamInfo::number("block_h", 4.0, 1.0, MAX_BLOCK as f64, "block height in pixels"),
            ],
        )
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let bw = whole(&info, params, "block_w")?;
        let bh = whole(&info, params, "block_h")?;
        Ok(each_depth!(img, i => pixelize(i, bw, bh, run)))
    }
}

/// How a side of `len` pixels is cut into blocks of `b`: the shift that makes
/// `(i + shift) / b` the block of pixel `i`, and the number of blocks.
fn grid(len: usize, b: usize) -> (usize, usize) {
    let shift = (b - (len % b) / 2) % b;
    (shift, if len == 0 { 0 } else { (len - 1 + shift) / b + 1 })
}

/// The pixel range of block `k` of a side of `len` pixels.
fn block(k: usize, shift: usize, b: usize, len: usize) -> std::ops::Range<usize> {
    (k * b).saturating_sub(shift)..((k + 1) * b - shift).min(len)
}

/// The mosaic of the module documentation.
///
/// # Panics
///
/// If a block side is not in 1..=256 or the image's fields disagree (see
/// [`Image::from_vec`]).
pub fn pixelize<T: Sample>(img: &Image<T>, bw: usize, bh: usize, run: &Run) -> Image<T> {
    assert!((1..=MAX_BLOCK).contains(&bw) && (1..=MAX_BLOCK).contains(&bh), "pixelize {bw}×{bh}");
    let (w, h, c) = (img.width, img.height, img.channels);
    if (bw == 1 && bh == 1) || w == 0 || h == 0 {
        return img.clone();
    }
    match c {
        1 => mosaic::<T, 1>(img, bw, bh, run),
        3 => mosaic::<T, 3>(img, bw, bh, run),
        _ => mosaic::<T, 4>(img, bw, bh, run),
    }
}

/// Widest blocks whose inner means are computed at every sample in vectors (see the module
/// documentation); wider ones sum each block on its own.
const VECTOR_MAX: usize = 16;

/// How the image is cut into blocks (see [`grid`]).
#[derive(Clone, Copy)]
struct Grid {
    bw: usize,
    bh: usize,
    /// Shifts of the columns and rows (see [`grid`]).
    sx: usize,
    sy: usize,
    /// Block columns.
    nbx: usize,
}

impl Grid {
    /// The pixel columns of the inner block columns (all but the first and the last, all
    /// `bw` wide), if there are any.
    fn inner(&self) -> Option<std::ops::Range<usize>> {
        (self.nbx > 2).then(|| self.bw - self.sx..(self.nbx - 1) * self.bw - self.sx)
    }
}

/// [`pixelize`] for images of `C` channels, with sums in 16 bits where they fit.
fn mosaic<T: Sample, const C: usize>(img: &Image<T>, bw: usize, bh: usize, run: &Run) -> Image<T> {
    let (w, h) = (img.width, img.height);
    let ((sx, nbx), (sy, _)) = (grid(w, bw), grid(h, bh));
    let g = Grid { bw, bh, sx, sy, nbx };
    // Each inner sample's pixel offset in its block, for the hold (see `hold`).
    let offsets: Vec<u8> = match g.inner() {
        Some(cols) if bw <= VECTOR_MAX => {
            (0..cols.len() * C).map(|i| ((i / C) % bw) as u8).collect()
        }
        _ => Vec::new(),
    };
    let mut out = Image::for_overwrite(w, h, C);
    let sixteen =
        T::MAX == 255 && u16::try_fast_for((bw * bh) as u32, (bw * bh) as u32 * 255).is_some();
    bands(run, &mut out.data, w * C, |y0, band| {
        if sixteen {
            mosaic_band::<T, u16>(img, g, &offsets, y0, band)
        } else {
            mosaic_band::<T, u32>(img, g, &offsets, y0, band)
        }
    });
    out
}

multiversion! {
    /// Output rows `y0..` into `band`.
    fn mosaic_band<T: Sample, A: Acc>(img: &Image<T>, g: Grid, offsets: &[u8], y0: usize, band: &mut [T])
        => mosaic_band_body, avx512_full_width
}

#[inline(always)]
fn mosaic_band_body<T: Sample, A: Acc>(
    img: &Image<T>,
    g: Grid,
    offsets: &[u8],
    y0: usize,
    band: &mut [T],
) {
    match img.channels {
        1 => mosaic_rows::<T, A, 1>(img, g, offsets, y0, band),
        3 => mosaic_rows::<T, A, 3>(img, g, offsets, y0, band),
        _ => mosaic_rows::<T, A, 4>(img, g, offsets, y0, band),
    }
}

/// Output rows `y0..` into `band`: each block row's output row is made once (see
/// [`block_row`]) and copied to that block row's rows in the band.
#[inline(always)]
fn mosaic_rows<T: Sample, A: Acc, const C: usize>(
    img: &Image<T>,
    g: Grid,
    offsets: &[u8],
    y0: usize,
    band: &mut [T],
) {
    let row_len = img.width * C;
    let mut template = vec![T::from_u32(0); row_len];
    let mut col = vec![A::default(); row_len];
    let mut scratch = vec![T::from_u32(0); 2 * offsets.len()];
    let mut current = usize::MAX;
    for (i, orow) in band.chunks_exact_mut(row_len).enumerate() {
        let y = y0 + i;
        let by = (y + g.sy) / g.bh;
        if by != current {
            current = by;
            let rows = block(by, g.sy, g.bh, img.height);
            block_row::<T, A, C>(img, g, rows, offsets, &mut col, &mut scratch, &mut template);
        }
        // The input row a block row below, into the cache while this row is written (the
        // next block row's sums start as soon as this one's rows are out).
        if y + g.bh < img.height {
            prefetch(img.row(y + g.bh));
        }
        orow.copy_from_slice(&template);
        copy_alpha(orow, img.row(y), C);
    }
}

/// The output row of the block row made of image rows `rows` into `template` (alpha samples
/// left undefined), `col` and `scratch` (`2 × offsets.len()` samples) as work space.
///
/// The rows are summed into column sums. The first and last block columns, which may be
/// partial, each sum their columns. The inner ones (all `bw` wide, at most [`VECTOR_MAX`])
/// are computed in vectors when their sums have a fast divider: the window sum of `bw`
/// column sums and its mean at *every* sample, then [`hold`] copies each block's first
/// pixel over the block. Otherwise each block sums its columns.
#[inline(always)]
fn block_row<T: Sample, A: Acc, const C: usize>(
    img: &Image<T>,
    g: Grid,
    rows: std::ops::Range<usize>,
    offsets: &[u8],
    col: &mut [A],
    scratch: &mut [T],
    template: &mut [T],
) {
    let w = img.width;
    // Up to four rows at a time: a quarter of the passes over the column sums.
    let mut ys = rows.clone();
    let mut fresh = true;
    while !ys.is_empty() {
        let take = ys.len().min(4);
        let r: [&[T]; 4] = std::array::from_fn(|k| img.row(ys.start + k.min(take - 1)));
        ys.start += take;
        match (take, fresh) {
            (4, true) => add_rows::<T, A, 4, false>(col, [r[0], r[1], r[2], r[3]]),
            (4, false) => add_rows::<T, A, 4, true>(col, [r[0], r[1], r[2], r[3]]),
            (3, true) => add_rows::<T, A, 3, false>(col, [r[0], r[1], r[2]]),
            (3, false) => add_rows::<T, A, 3, true>(col, [r[0], r[1], r[2]]),
            (2, true) => add_rows::<T, A, 2, false>(col, [r[0], r[1]]),
            (2, false) => add_rows::<T, A, 2, true>(col, [r[0], r[1]]),
            (_, true) => add_rows::<T, A, 1, false>(col, [r[0]]),
            (_, false) => add_rows::<T, A, 1, true>(col, [r[0]]),
        }
        fresh = false;
    }
    let mean = |cols: std::ops::Range<usize>| -> [T; C] {
        let n = (rows.len() * cols.len()) as u64;
        let s = block_sums::<A, C>(&col[cols.start * C..cols.end * C]);
        // ⌊(s + ⌊n/2⌋) / n⌋ by a correctly rounded double division, which is exact for
        // integers below 2^53 (a non-integer quotient is >= 1/n from the next integer) and
        // several times faster than a 64-bit integer division.
        std::array::from_fn(|c| T::from_u32(((s[c] + n / 2) as f64 / n as f64) as u32))
    };
    let last = g.nbx - 1;
    for bx in [0, last].into_iter().take(if last > 0 { 2 } else { 1 }) {
        let cols = block(bx, g.sx, g.bw, w);
        let m = mean(cols.clone());
        template[cols.start * C..cols.end * C].as_chunks_mut::<C>().0.fill(m);
    }
    let Some(cols) = g.inner() else { return };
    // `offsets` is empty when the blocks are too wide for the vectors (then n · MAX could
    // even overflow: 256 × 256 × 65535).
    let n = (rows.len() * g.bw) as u32;
    let fast = if offsets.is_empty() { None } else { A::try_fast_for(n, n * T::MAX) };
    let out = &mut template[cols.start * C..cols.end * C];
    let Some(f) = fast else {
        for (b, px) in out.chunks_exact_mut(g.bw * C).enumerate() {
            let x = cols.start + b * g.bw;
            px.as_chunks_mut::<C>().0.fill(mean(x..x + g.bw));
        }
        return;
    };
    // Means of the windows starting at every sample up to the last block's first pixel.
    let (means, spare) = scratch.split_at_mut(offsets.len());
    let len = (cols.len() - g.bw + 1) * C;
    let sums = &col[cols.start * C..];
    for (start, n) in block_pieces(len, LANES) {
        let (whole, short) = means[start..start + n].as_chunks_mut::<LANES>();
        for (k, m) in whole.iter_mut().enumerate() {
            window_means::<T, A, LANES>(sums, start + k * LANES, g.bw * C, C, f, m);
        }
        for (k, m) in short.iter_mut().enumerate() {
            window_means::<T, A, 1>(sums, start + k, g.bw * C, C, f, std::array::from_mut(m));
        }
    }
    hold::<T>(means, spare, offsets, g.bw, C, out);
}

/// Samples per step of the vectorised window sums.
const LANES: usize = 64;

/// `col[i]` (plus its value before, if `ADD`) `+= Σ rows[k][i]`, in steps of [`LANES`].
#[inline(always)]
fn add_rows<T: Sample, A: Acc, const K: usize, const ADD: bool>(col: &mut [A], rows: [&[T]; K]) {
    let n = col.len();
    let (whole, rest) = col.as_chunks_mut::<LANES>();
    for (k, c) in whole.iter_mut().enumerate() {
        let i = k * LANES;
        let mut s: [A; LANES] = if ADD { *c } else { [A::default(); LANES] };
        for r in rows {
            let v: &[T; LANES] = r[i..].first_chunk().expect("rows as long as the sums");
            for l in 0..LANES {
                s[l] = s[l].add(A::of(v[l]));
            }
        }
        *c = s;
    }
    let done = n - rest.len();
    for (i, c) in rest.iter_mut().enumerate() {
        let mut s = if ADD { *c } else { A::default() };
        for r in rows {
            s = s.add(A::of(r[done + i]));
        }
        *c = s;
    }
}

/// `m[l]`: the mean of `sums[i + l + j·step]` for `j·step < span`, for each lane `l`.
#[inline(always)]
fn window_means<T: Sample, A: Acc, const L: usize>(
    sums: &[A],
    i: usize,
    span: usize,
    step: usize,
    f: A::Fast,
    m: &mut [T; L],
) {
    let mut a: [A; L] = *sums[i..].first_chunk().expect("window inside the row");
    for j in (step..span).step_by(step) {
        let s: &[A; L] = sums[i + j..].first_chunk().expect("window inside the row");
        for l in 0..L {
            a[l] = a[l].add(s[l]);
        }
    }
    for l in 0..L {
        m[l] = T::from_u32(a[l].divide_fast(f));
    }
}

/// Every sample `i` of `out` becomes `means[i − offsets[i]·c]`: each block's first pixel
/// (`c` samples) copied over the block, `offsets[i]` being sample `i`'s pixel offset in its
/// block (below `bw`). One pass per bit an offset can have, each a vectorised choice, per
/// sample, of itself or the sample `2^k` pixels before it (when bit `k` of its offset is
/// set); the passes alternate between `means` and `spare`, the last writes `out`. (After the
/// passes for bits below `k`, a sample holds the one `offset mod 2^k` pixels before it.)
#[inline(always)]
fn hold<T: Sample>(
    means: &mut [T],
    spare: &mut [T],
    offsets: &[u8],
    bw: usize,
    c: usize,
    out: &mut [T],
) {
    let passes = (usize::BITS - (bw - 1).leading_zeros()) as usize;
    if passes == 0 {
        out.copy_from_slice(means);
        return;
    }
    let (mut from, mut to) = (means, spare);
    for k in 0..passes {
        let dst: &mut [T] = if k + 1 == passes { &mut *out } else { &mut *to };
        let (bit, back) = (1u8 << k, (1 << k) * c);
        dst[..back].copy_from_slice(&from[..back]);
        let n = dst.len() - back;
        let (d, o) = (&mut dst[back..], &offsets[back..][..n]);
        let (here, before) = (&from[back..][..n], &from[..n]);
        for i in 0..n {
            // Both loaded, then chosen (a select, which vectorises; a branch does not).
            d[i] = std::hint::select_unpredictable(o[i] & bit != 0, before[i], here[i]);
        }
        std::mem::swap(&mut from, &mut to);
    }
}

/// The per-channel sums of the pixels `px` (`C` samples each; for `C = 4` the alpha sum is
/// made too and not used).
#[inline(always)]
fn block_sums<A: Acc, const C: usize>(px: &[A]) -> [u64; C] {
    let mut s = [0u64; C];
    for px in px.as_chunks::<C>().0 {
        for c in 0..C {
            s[c] += px[c].get() as u64;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::filters::common::testkit::*;

    /// The definition, written as directly as possible.
    fn naive<T: Sample>(img: &Image<T>, bw: usize, bh: usize) -> Image<T> {
        let (w, h, c) = (img.width, img.height, img.channels);
        let (ox, oy) = ((w % bw) / 2, (h % bh) / 2);
        let bx = |x: usize| (x + (bw - ox) % bw) / bw;
        let by = |y: usize| (y + (bh - oy) % bh) / bh;
        // Sum and count of every (block column, block row, channel).
        let mut sums = std::collections::HashMap::<_, (u64, u64)>::new();
        for y in 0..h {
            for x in 0..w {
                for ch in 0..img.color_channels() {
                    let e = sums.entry((bx(x), by(y), ch)).or_default();
                    *e = (e.0 + img.get(x, y, ch).to_u32() as u64, e.1 + 1);
                }
            }
        }
        let mut out = img.clone();
        for y in 0..h {
            for x in 0..w {
                for ch in 0..img.color_channels() {
                    let (s, n) = sums[&(bx(x), by(y), ch)];
                    out.data[(y * w + x) * c + ch] = T::from_u32(((s + n / 2) / n) as u32);
                }
            }
        }
        out
    }

    fn naive_dyn(img: &DynImage, bw: usize, bh: usize) -> DynImage {
        match img {
            DynImage::U8(i) => DynImage::U8(naive(i, bw, bh)),
            DynImage::U16(i) => DynImage::U16(naive(i, bw, bh)),
        }
    }

    fn p(bw: usize, bh: usize) -> Params {
        Params::new().with("block_w", bw).with("block_h", bh)
    }

    #[test]
    fn grid_is_centred() {
        // 10 columns in blocks of 4: 1 + 4 + 4 + 1.
        let (s, n) = grid(10, 4);
        assert_eq!(n, 4);
        let blocks: Vec<_> = (0..n).map(|k| block(k, s, 4, 10)).collect();
        assert_eq!(blocks, [0..1, 1..5, 5..9, 9..10]);
        // 11 in blocks of 4: 1 + 4 + 4 + 2; 8 in blocks of 4: 4 + 4; 3 in blocks of 4: 3.
        let (s, n) = grid(11, 4);
        assert_eq!(
            (0..n).map(|k| block(k, s, 4, 11)).collect::<Vec<_>>(),
            [0..1, 1..5, 5..9, 9..11]
        );
        let (s, n) = grid(8, 4);
        assert_eq!((0..n).map(|k| block(k, s, 4, 8)).collect::<Vec<_>>(), [0..4, 4..8]);
        let (s, n) = grid(3, 4);
        assert_eq!((0..n).map(|k| block(k, s, 4, 3)).collect::<Vec<_>>(), [0..1, 1..3]);
    }

    #[test]
    fn gray8_every_pixel() {
        // 5×3 in 2×2 blocks: columns 0..2, 2..4, 4..5 (the odd column goes right); rows
        // 0..2, 2..3.
        #[rustfmt::skip]
        let img = img8(5, 3, 1, &[
            1, 2, 10, 20, 100,
            3, 5, 30, 40, 101,
            7, 8, 50, 61, 200,
        ]);
        let out = data8(&apply(&Pixelize, &img, &[("block_w", "2"), ("block_h", "2")]));
        // Means: (1+2+3+5)/4 = 2.75 → 3; (10+20+30+40)/4 = 25; (100+101)/2 = 100.5 → 101;
        // (7+8)/2 = 7.5 → 8; (50+61)/2 = 55.5 → 56; 200.
        #[rustfmt::skip]
        assert_eq!(out, [
            3, 3, 25, 25, 101,
            3, 3, 25, 25, 101,
            8, 8, 56, 56, 200,
        ]);
    }

    #[test]
    fn gray16_and_rgba_every_pixel() {
        // 3×1 in 3×1 blocks: one block, mean (0 + 65535 + 65535)/3 = 43690.
        let out = apply(
            &Pixelize,
            &img16(3, 1, 1, &[0, 65535, 65535]),
            &[("block_w", "3"), ("block_h", "1")],
        );
        assert_eq!(data16(&out), [43690; 3]);
        // 2×2 rgba in one 2×2 block: colour means, alpha kept.
        let img = img8(2, 2, 4, &[0, 10, 255, 1, 2, 10, 255, 2, 4, 20, 0, 3, 6, 21, 0, 4]);
        let out = data8(&apply(&Pixelize, &img, &[("block_w", "2"), ("block_h", "2")]));
        // R 12/4 = 3; G 61/4 = 15.25 → 15; B 510/4 = 127.5 → 128.
        assert_eq!(out, [3, 15, 128, 1, 3, 15, 128, 2, 3, 15, 128, 3, 3, 15, 128, 4]);
        let img = img16(2, 1, 3, &[1, 2, 3, 4, 5, 7]);
        let out = apply(&Pixelize, &img, &[("block_w", "2"), ("block_h", "1")]);
        assert_eq!(data16(&out), [3, 4, 5, 3, 4, 5]);
        // With the default 4×4 the 2 leftover columns are split 1 + 1: two blocks.
        assert_eq!(apply(&Pixelize, &img, &[]), img);
    }

    #[test]
    fn bad_parameters_are_errors() {
        let img = img8(2, 2, 1, &[0; 4]);
        for (k, v) in [("block_w", "0"), ("block_h", "257"), ("block_w", "2.5"), ("block_h", "")] {
            let e = Pixelize.apply(&img, &Params::new().with(k, v), &Run::single());
            assert!(matches!(e, Err(ImagingError::BadParam { .. })), "{k}={v}: {e:?}");
        }
        let e = Pixelize.apply(&img, &Params::new().with("size", 3), &Run::single());
        assert!(matches!(e, Err(ImagingError::UnknownParam { .. })));
    }

    #[test]
    fn tiny_and_broken_images() {
        for img in tiny_images() {
            for (bw, bh) in [(1, 1), (4, 4), (1, 256), (256, 3)] {
                let out = Pixelize.apply(&img, &p(bw, bh), &Run::single()).unwrap();
                assert_eq!(out, naive_dyn(&img, bw, bh));
            }
        }
        for img in broken_images() {
            let e = Pixelize.apply(&img, &Params::new(), &Run::single());
            assert!(matches!(e, Err(ImagingError::InvalidImage(_))));
        }
    }

    /// Images wide enough for the vectorised inner blocks (64 samples a step), on every
    /// build: blocks up to 16 wide take the vector path, wider ones and those whose sums
    /// have no fast divider (8-bit blocks of more than 128 pixels, 16-bit of more than 25)
    /// sum each block.
    #[test]
    fn wide_images_on_every_build() {
        on_every_build((any_image(200, 9), 1usize..=20, 1usize..=12), |(img, bw, bh)| {
            let out = Pixelize.apply(&img, &p(bw, bh), &Run::single()).unwrap();
            prop_assert_eq!(out, naive_dyn(&img, bw, bh));
            Ok(())
        });
    }

    proptest! {
        #[test]
        fn matches_the_definition(img in any_image(13, 11), bw in 1usize..=7, bh in 1usize..=7) {
            let out = Pixelize.apply(&img, &p(bw, bh), &Run::single()).unwrap();
            prop_assert_eq!(out, naive_dyn(&img, bw, bh));
        }

        #[test]
        fn constant_within_blocks(img in any_image(20, 20), bw in 1usize..=9, bh in 1usize..=9) {
            let out = Pixelize.apply(&img, &p(bw, bh), &Run::single()).unwrap();
            let (w, h, c) = (img.width(), img.height(), img.channels());
            let ((sx, _), (sy, _)) = (grid(w, bw), grid(h, bh));
            let at = |x: usize, y: usize, ch: usize| match &out {
                DynImage::U8(i) => i.get(x, y, ch) as u32,
                DynImage::U16(i) => i.get(x, y, ch) as u32,
            };
            for y in 0..h {
                for x in 0..w {
                    // Same block as the pixel to the left / above: same colour.
                    for ch in 0..c.min(3) {
                        if x > 0 && (x + sx) / bw == (x - 1 + sx) / bw {
                            prop_assert_eq!(at(x, y, ch), at(x - 1, y, ch));
                        }
                        if y > 0 && (y + sy) / bh == (y - 1 + sy) / bh {
                            prop_assert_eq!(at(x, y, ch), at(x, y - 1, ch));
                        }
                    }
                }
            }
        }

        #[test]
        fn same_on_one_and_three_threads(img in any_image(20, 40), bw in 1usize..=6, bh in 1usize..=6) {
            same_on_threads(&Pixelize, &img, &p(bw, bh));
        }
    }
}
