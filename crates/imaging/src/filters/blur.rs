//! `blur`: the n×n box mean (MedJava's and xv's Blur filter).
//!
//! # Definition
//!
//! For every pixel (x, y) and every colour channel, the output is the mean of that channel
//! over the window of `size`×`size` pixels centred on (x, y), **clipped to the image**: at
//! the border the window shrinks and the mean divides by the number of pixels actually
//! inside (as xv does). With `r = (size − 1)/2`, `X = [x−r, x+r] ∩ [0, w)`,
//! `Y = [y−r, y+r] ∩ [0, h)` and `S` the sum of the channel over `X × Y`:
//!
//! ```text
//! out = ⌊(S + ⌊|X||Y| / 2⌋) / (|X||Y|)⌋        (the mean rounded half up)
//! ```
//!
//! **Rounding**: xv truncates the mean. We round half up instead: truncation loses half a
//! grey level on average, so repeated blurs (or a blur inside a chain) darken the image
//! step by step, and a blur of an image is not centred on the image's mean. Rounding keeps a
//! constant image constant either way; it differs from xv by at most one level.
//!
//! **Pixel types**: gray8, gray16, rgb8, rgb16 (each colour channel on its own); in rgba8 and
//! rgba16 the colour channels are blurred and alpha is copied unchanged. 16-bit images use
//! the same formula on 0..=65535.
//!
//! **Parameter** `size`: the window side, odd, 1..=31, default 3 (the paper's 3×3 mask of
//! ones). `size = 1` returns the image unchanged.
//!
//! # Speed
//!
//! Separable running sums, O(1) work per sample whatever the size: each band of rows keeps
//! one row of column sums, updated by adding the row that enters the window and subtracting
//! the one that leaves (one vectorised pass per row). For sizes 3 and 5 the full windows of a
//! row are then summed from `size` shifted slices of the column sums and divided in the same
//! pass: for 8-bit images, whose sums fit in 16 bits, by a 16-bit multiply-high and a shift
//! (16 lanes per AVX2 vector); for 16-bit images in exact single precision (see `sums::DivF32`).
//! Above size 5, sums along each row are prefix sums (one scalar add per sample) and one
//! vectorised subtraction, divided by a multiply and a shift by a per-count constant
//! (`common::Div`), exact for every sum. Clipped windows at the edges use `common::Div` too.
//! The inner loops are built for the baseline CPU, for AVX2 and for AVX-512, chosen at run
//! time (`common::multiversion!`; AVX-512 where 512-bit vectors run at full width, Intel and
//! AMD's Zen 5: on a Zen 4 EPYC it measured slower than AVX2). The image is read once, in one
//! pass;
//! bands of rows run in parallel (`common::bands`); the result does not depend on the number
//! of threads or on the CPU.
//!
//! Measured (release build, one thread of a shared 2-core AMD EPYC 9005 machine, AVX-512,
//! size 3; absolute numbers drift by a fifth from run to run): rgb8 512² about 5 Gpixel/s,
//! 2048² about 4.5; gray16 about 8 at 512² and 10 at 2048². `blobstream bench filters`
//! compares them with OpenCV.

use std::sync::Arc;

use super::common::{
    Div, bands, block_pieces, builtin_info, copy_alpha, each_depth, multiversion, odd,
};
use super::sums::Acc;
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, ParamInfo, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Blur));
}

/// The `blur` filter (see the module documentation).
pub struct Blur;

impl Filter for Blur {
    fn info(&self) -> FilterInfo {
        builtin_info(
            "blur",
            "box mean over a size×size window per colour channel (shrinks at the border), rounded",
            vec![ParamInfo::number("size", 3.0, 1.0, 31.0, "window side in pixels, odd")],
        )
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let r = odd(&info, params, "size")? / 2;
        Ok(each_depth!(img, i => box_blur(i, r, run)))
    }
}

/// The box mean of the module documentation with window side `2 * radius + 1`.
///
/// # Panics
///
/// If `radius > 15` or the image's fields disagree (see [`Image::from_vec`]).
pub fn box_blur<T: Sample>(img: &Image<T>, radius: usize, run: &Run) -> Image<T> {
    assert!(radius <= 15, "box_blur radius {radius} > 15");
    if radius == 0 || img.width == 0 || img.height == 0 {
        return img.clone();
    }
    // For 8-bit images and sides up to 13, sums fit in 16 bits and `sum · m` in 32.
    if T::MAX == 255 && radius <= 6 {
        blur_with::<T, u16>(img, radius, run)
    } else {
        blur_with::<T, u32>(img, radius, run)
    }
}

/// Up to this size, row sums are `size` vectorised slice additions; above, prefix sums.
const DIRECT_MAX: usize = 5;

fn blur_with<T: Sample, A: Acc>(img: &Image<T>, r: usize, run: &Run) -> Image<T> {
    let n = 2 * r + 1;
    // Dividers for every clipped window: index (cx − 1) · n + (cy − 1).
    let divs: Vec<Div> = (1..=n as u32)
        .flat_map(|cx| (1..=n as u32).map(move |cy| A::div_for(cx * cy, cx * cy * T::MAX)))
        .collect();
    // Full-width windows of `cy` rows, for the direct sums: index cy − 1.
    let fast: Vec<A::Fast> = if n <= DIRECT_MAX {
        (1..=n as u32).map(|cy| A::fast_for(n as u32 * cy, n as u32 * cy * T::MAX)).collect()
    } else {
        Vec::new()
    };
    let mut out = Image::for_overwrite(img.width, img.height, img.channels);
    bands(run, &mut out.data, img.width * img.channels, |y0, band| {
        blur_band::<T, A>(img, r, &divs, &fast, y0, band)
    });
    out
}

multiversion! {
    /// Output rows `y0..` of the blur into `band`.
    fn blur_band<T: Sample, A: Acc>(
        img: &Image<T>, r: usize, divs: &[Div], fast: &[A::Fast], y0: usize, band: &mut [T]
    ) => blur_band_body, avx512_full_width
}

#[inline(always)]
fn blur_band_body<T: Sample, A: Acc>(
    img: &Image<T>,
    r: usize,
    divs: &[Div],
    fast: &[A::Fast],
    y0: usize,
    band: &mut [T],
) {
    let (w, h, c) = (img.width, img.height, img.channels);
    let n = 2 * r + 1;
    let rl = w * c;
    let mut col = vec![A::default(); rl];
    // Row sums and prefix scratch only where the fused pass does not apply.
    let fused = n <= DIRECT_MAX && w >= n;
    let mut hs = vec![A::default(); if fused { 0 } else { rl }];
    let mut scratch = vec![A::default(); if n > DIRECT_MAX { rl } else { 0 }];
    for yy in y0.saturating_sub(r)..(y0 + r + 1).min(h) {
        for (s, &v) in col.iter_mut().zip(img.row(yy)) {
            *s = s.add(A::of(v));
        }
    }
    for (i, orow) in band.chunks_exact_mut(rl).enumerate() {
        let y = y0 + i;
        if i > 0 {
            match (y + r < h, y > r) {
                (true, true) => {
                    let (add, sub) = (img.row(y + r), img.row(y - r - 1));
                    for ((s, &a), &b) in col.iter_mut().zip(add).zip(sub) {
                        *s = s.add(A::of(a)).sub(A::of(b));
                    }
                }
                (true, false) => {
                    for (s, &a) in col.iter_mut().zip(img.row(y + r)) {
                        *s = s.add(A::of(a));
                    }
                }
                (false, true) => {
                    for (s, &b) in col.iter_mut().zip(img.row(y - r - 1)) {
                        *s = s.sub(A::of(b));
                    }
                }
                (false, false) => {}
            }
        }
        let cy = (y + r).min(h - 1) - y.saturating_sub(r) + 1;
        if fused {
            // Full windows: the sum of n shifted column sums, divided, in one pass.
            let o = &mut orow[r * c..(w - r) * c];
            let f = fast[cy - 1];
            for (at, len) in block_pieces(o.len(), PIECE) {
                let (o, col) = (&mut o[at..at + len], &col[at..]);
                let s = |k: usize| &col[k * c..k * c + len];
                if n == 3 {
                    sum3::<T, A>(s(0), s(1), s(2), o, f);
                } else {
                    sum5::<T, A>(s(0), s(1), s(2), s(3), s(4), o, f);
                }
            }
            // Clipped windows at the left and right ends.
            for x in (0..r).chain(w - r..w) {
                let (x0, x1) = (x.saturating_sub(r), (x + r).min(w - 1));
                let d = divs[(x1 - x0) * n + (cy - 1)];
                for ch in 0..c {
                    let s = (x0..=x1).fold(A::default(), |s, xx| s.add(col[xx * c + ch]));
                    orow[x * c + ch] = T::from_u32(s.divide(d));
                }
            }
            continue;
        }
        row_sums(&col, &mut hs, &mut scratch, w, c, r);
        // Full windows along x, x in [r, w − r): one divider for the whole run of samples.
        let (lo, hi) = (r.min(w), w.saturating_sub(r).max(r.min(w)));
        let d = divs[(n - 1) * n + (cy - 1)];
        for (o, &s) in orow[lo * c..hi * c].iter_mut().zip(&hs[lo * c..hi * c]) {
            *o = T::from_u32(s.divide(d));
        }
        // Clipped windows at the left and right ends.
        for x in (0..lo).chain(hi..w) {
            let cx = (x + r).min(w - 1) - x.saturating_sub(r) + 1;
            let d = divs[(cx - 1) * n + (cy - 1)];
            for k in x * c..(x + 1) * c {
                orow[k] = T::from_u32(hs[k].divide(d));
            }
        }
    }
    let start = y0 * rl;
    copy_alpha(band, &img.data[start..start + band.len()], c);
}

/// Samples per piece of the fused pass's output (see [`block_pieces`]): a whole number of
/// the widest vectors' iterations (unrolled, 32 or 64 samples at a time with AVX-512).
const PIECE: usize = 128;

/// The fused pass for size 3: `o[j]` = the mean of `s0[j] + s1[j] + s2[j]` (slices of one
/// length). Each slice is a parameter of its own, which tells the compiler they do not
/// overlap.
#[inline(always)]
fn sum3<T: Sample, A: Acc>(s0: &[A], s1: &[A], s2: &[A], o: &mut [T], f: A::Fast) {
    let len = o.len();
    let (s0, s1, s2) = (&s0[..len], &s1[..len], &s2[..len]);
    for j in 0..len {
        o[j] = T::from_u32(s0[j].add(s1[j]).add(s2[j]).divide_fast(f));
    }
}

/// [`sum3`] for size 5 (each slice a parameter of its own too).
#[inline(always)]
fn sum5<T: Sample, A: Acc>(
    s0: &[A],
    s1: &[A],
    s2: &[A],
    s3: &[A],
    s4: &[A],
    o: &mut [T],
    f: A::Fast,
) {
    let len = o.len();
    let (s0, s1, s2, s3, s4) = (&s0[..len], &s1[..len], &s2[..len], &s3[..len], &s4[..len]);
    for j in 0..len {
        let sum = s0[j].add(s1[j]).add(s2[j]).add(s3[j]).add(s4[j]);
        o[j] = T::from_u32(sum.divide_fast(f));
    }
}

/// `hs[x·c + ch]` = sum of `col[x'·c + ch]` over `x' ∈ [x − r, x + r] ∩ [0, w)`.
#[inline(always)]
fn row_sums<A: Acc>(col: &[A], hs: &mut [A], scratch: &mut [A], w: usize, c: usize, r: usize) {
    let n = 2 * r + 1;
    if w < n {
        // Every window clipped (narrow image): direct sums.
        for x in 0..w {
            for ch in 0..c {
                let mut s = A::default();
                for xx in x.saturating_sub(r)..(x + r + 1).min(w) {
                    s = s.add(col[xx * c + ch]);
                }
                hs[x * c + ch] = s;
            }
        }
        return;
    }
    if n <= DIRECT_MAX {
        // Full windows: n shifted slice additions (vectorised).
        let len = (w - 2 * r) * c;
        let dst = &mut hs[r * c..r * c + len];
        dst.copy_from_slice(&col[..len]);
        for k in 1..n {
            for (d, &v) in dst.iter_mut().zip(&col[k * c..k * c + len]) {
                *d = d.add(v);
            }
        }
        // Clipped windows at both ends.
        for x in (0..r).chain(w - r..w) {
            for ch in 0..c {
                let mut s = A::default();
                for xx in x.saturating_sub(r)..(x + r + 1).min(w) {
                    s = s.add(col[xx * c + ch]);
                }
                hs[x * c + ch] = s;
            }
        }
    } else {
        // Prefix sums P (one add per sample, wrapping), then hs(x) = P(x + r) − P(x − r − 1):
        // the subtraction is vectorised and the wrap cancels.
        let p = &mut *scratch;
        match c {
            1 => prefix::<A, 1>(col, p),
            3 => prefix::<A, 3>(col, p),
            _ => prefix::<A, 4>(col, p),
        }
        let (rc, rc1) = (r * c, (r + 1) * c);
        // x in [r + 1, w − r): both ends inside.
        if w > 2 * r + 1 {
            let len = (w - 2 * r - 1) * c;
            for ((d, &a), &b) in
                hs[rc1..rc1 + len].iter_mut().zip(&p[rc1 + rc..rc1 + rc + len]).zip(&p[..len])
            {
                *d = a.sub(b);
            }
        }
        for x in (0..=r).chain(w - r..w) {
            for ch in 0..c {
                let hi = p[(x + r).min(w - 1) * c + ch];
                hs[x * c + ch] = if x > r { hi.sub(p[(x - r - 1) * c + ch]) } else { hi };
            }
        }
    }
}

/// `p[x·C + ch]` = sum of `col[x'·C + ch]` for `x' <= x` (wrapping).
#[inline(always)]
fn prefix<A: Acc, const C: usize>(col: &[A], p: &mut [A]) {
    let mut acc = [A::default(); C];
    for (o, i) in p.chunks_exact_mut(C).zip(col.chunks_exact(C)) {
        for ch in 0..C {
            acc[ch] = acc[ch].add(i[ch]);
            o[ch] = acc[ch];
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::filters::common::testkit::*;

    /// The definition, written as directly as possible.
    fn naive<T: Sample>(img: &Image<T>, size: usize) -> Image<T> {
        let r = size / 2;
        let mut out = img.clone();
        for y in 0..img.height {
            for x in 0..img.width {
                for ch in 0..img.color_channels() {
                    let (mut s, mut cnt) = (0u64, 0u64);
                    for yy in y.saturating_sub(r)..=(y + r).min(img.height - 1) {
                        for xx in x.saturating_sub(r)..=(x + r).min(img.width - 1) {
                            s += img.get(xx, yy, ch).to_u32() as u64;
                            cnt += 1;
                        }
                    }
                    out.data[(y * img.width + x) * img.channels + ch] =
                        T::from_u32(((s + cnt / 2) / cnt) as u32);
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
        let img = img8(3, 3, 1, &[10, 20, 30, 40, 50, 60, 70, 80, 90]);
        let out = apply(&Blur, &img, &[]);
        // Corners average 4 pixels, edges 6, the centre 9.
        assert_eq!(data8(&out), [30, 35, 40, 45, 50, 55, 60, 65, 70]);
    }

    #[test]
    fn rounds_half_up() {
        // Windows {0,1}, {0,1,2}, {1,2}: 0.5 → 1, 1 → 1, 1.5 → 2 (xv's truncation: 0, 1, 1).
        let out = apply(&Blur, &img8(3, 1, 1, &[0, 1, 2]), &[]);
        assert_eq!(data8(&out), [1, 1, 2]);
    }

    #[test]
    fn gray16_every_pixel() {
        // Each 3×3 window covers the whole 2×2 image: 196605 / 4 = 49151.25.
        let out = apply(&Blur, &img16(2, 2, 1, &[0, 65535, 65535, 65535]), &[]);
        assert_eq!(data16(&out), [49151; 4]);
        // 5×1 with size 5: windows of 3, 4, 5, 4, 3 samples.
        let img = img16(5, 1, 1, &[100, 200, 300, 400, 60000]);
        let out = apply(&Blur, &img, &[("size", "5")]);
        // 600/3 = 200; 1000/4 = 250; 61000/5 = 12200; 60900/4 = 15225; 60700/3 = 20233.3.
        assert_eq!(data16(&out), [200, 250, 12200, 15225, 20233]);
    }

    #[test]
    fn rgb_and_rgba_every_pixel() {
        let out = apply(&Blur, &img8(2, 1, 3, &[10, 0, 255, 20, 1, 0]), &[]);
        // R 30/2 = 15, G 1/2 = 0.5 → 1, B 255/2 = 127.5 → 128.
        assert_eq!(data8(&out), [15, 1, 128, 15, 1, 128]);
        let out = apply(&Blur, &img8(2, 1, 4, &[10, 0, 255, 7, 20, 1, 0, 9]), &[]);
        assert_eq!(data8(&out), [15, 1, 128, 7, 15, 1, 128, 9]);
        let out = apply(&Blur, &img16(1, 2, 3, &[1000, 0, 65535, 3001, 1, 65534]), &[]);
        assert_eq!(data16(&out), [2001, 1, 65535, 2001, 1, 65535]);
    }

    #[test]
    fn size_one_is_identity() {
        let img = img8(3, 2, 3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]);
        assert_eq!(apply(&Blur, &img, &[("size", "1")]), img);
    }

    #[test]
    fn bad_parameters_are_errors() {
        let img = img8(2, 2, 1, &[0; 4]);
        for bad in ["0", "2", "33", "3.5", "x", "-1", "NaN"] {
            let e = Blur.apply(&img, &Params::new().with("size", bad), &Run::single());
            assert!(matches!(e, Err(ImagingError::BadParam { .. })), "{bad}: {e:?}");
        }
        let e = Blur.apply(&img, &Params::new().with("radius", 3), &Run::single());
        assert!(matches!(e, Err(ImagingError::UnknownParam { .. })));
    }

    #[test]
    fn tiny_and_broken_images() {
        for img in tiny_images() {
            for size in ["1", "3", "31"] {
                let out = Blur.apply(&img, &Params::new().with("size", size), &Run::single());
                let out = out.unwrap();
                assert_eq!(out, naive_dyn(&img, size.parse().unwrap()));
            }
        }
        for img in broken_images() {
            let e = Blur.apply(&img, &Params::new(), &Run::single());
            assert!(matches!(e, Err(ImagingError::InvalidImage(_))));
        }
    }

    #[test]
    fn every_build_matches_too() {
        on_every_build((any_image(14, 6), 0usize..16), |(img, r)| {
            let p = Params::new().with("size", 2 * r + 1);
            let out = Blur.apply(&img, &p, &Run::single()).unwrap();
            prop_assert_eq!(out, naive_dyn(&img, 2 * r + 1));
            Ok(())
        });
    }

    /// Rows long enough for the fused pass's pieces (`PIECE` samples and more, most not a
    /// multiple of it, so the last piece overlaps), sizes 3 and 5, on every build.
    #[test]
    fn wide_images_on_every_build() {
        on_every_build((any_image(200, 5), 1usize..=2), |(img, r)| {
            let p = Params::new().with("size", 2 * r + 1);
            let out = Blur.apply(&img, &p, &Run::single()).unwrap();
            prop_assert_eq!(out, naive_dyn(&img, 2 * r + 1));
            Ok(())
        });
    }

    proptest! {
        #[test]
        fn matches_the_definition(
            img in any_image(14, 9),
            size in prop::sample::select(vec![1usize, 3, 5, 7, 9, 11, 13, 31]),
        ) {
            let out = Blur.apply(&img, &Params::new().with("size", size), &Run::single()).unwrap();
            prop_assert_eq!(out, naive_dyn(&img, size));
        }

        #[test]
        fn constant_stays_constant(img in constant_image(20, 20), size in 0usize..16) {
            let out = Blur.apply(&img, &Params::new().with("size", 2 * size + 1), &Run::single());
            prop_assert_eq!(out.unwrap(), img);
        }

        #[test]
        fn same_on_one_and_three_threads(img in any_image(9, 40), size in 0usize..8) {
            same_on_threads(&Blur, &img, &Params::new().with("size", 2 * size + 1));
        }
    }
}
