//! `oilpaint`: MedJava's and xv's Oil Paint filter, a local "most frequent colour" that
//! smears the image into flat strokes.
//!
//! # Definition
//!
//! Every pixel is put in one of `levels` intensity bins:
//!
//! ```text
//! I   = (11R + 16G + 5B) >> 5   (xv's grey; gray images: the sample itself)
//! bin = ⌊I · levels / (MAX + 1)⌋    (0 ..= levels − 1)
//! ```
//!
//! For every pixel (x, y), over the `(2·radius + 1)²` window centred on it, **clipped to the
//! image** (it shrinks at the border): the winning bin is the one holding the most window
//! pixels, the lowest-numbered bin on a tie; each colour channel of the output is the mean
//! of that channel over the window pixels in the winning bin, rounded half up
//! (`⌊(Σ + ⌊n/2⌋) / n⌋` for `n` pixels). Alpha is copied unchanged.
//!
//! **Where xv and the paper differ, and what we chose**: the paper describes the most
//! frequent colour of a 3×3 neighbourhood; xv's code counts exact 24-bit colours in a 4×4
//! window offset by −2..+1. On photographs and on 16-bit medical images nearly every colour
//! in a window is distinct, so an exact-colour count is a tie almost everywhere and the
//! "winner" is just one of the neighbours: the image shifts instead of being painted, and
//! the off-centre window moves it by half a pixel. We use a centred window and count
//! *intensity bins* (the usual oil-paint algorithm), then output the mean colour of the
//! winning bin rather than any single pixel: neighbouring pixels of similar brightness then
//! share one flat colour, which gives the painted look on any bit depth. `levels` sets how
//! coarse the strokes are, `radius` how wide.
//!
//! **Pixel types**: gray8, gray16, rgb8, rgb16; rgba8 and rgba16 as RGB with alpha copied.
//!
//! **Parameters** `radius`: 1..=8, default 2 (a 5×5 window; radius 1 is the paper's 3×3);
//! `levels`: 2..=64, default 16.
//!
//! # Speed
//!
//! Each band computes the bin of every pixel it needs once. Along each row the window slides
//! as in Huang's median: per pixel the column leaving is subtracted from, and the column
//! entering added to, a count and a colour sum per bin, then the `levels` counts are scanned.
//! The means divide by a multiply and a shift (`Div`). O(radius + levels) per pixel; rows
//! run in parallel bands; the result does not depend on the number of threads.

use std::sync::Arc;

use super::common::{Div, bands, builtin_info, check_image, copy_alpha, whole};
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, ParamInfo, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(OilPaint));
}

/// The `oilpaint` filter (see the module documentation).
pub struct OilPaint;

/// Largest `radius` and `levels`.
const MAX_RADIUS: usize = 8;
const MAX_LEVELS: usize = 64;

impl Filter for OilPaint {
    fn info(&self) -> FilterInfo {
        builtin_info(
            "oilpaint",
            "mean colour of the most frequent intensity bin in a (2r+1)² window",
            vec![
                ParamInfo::number(
                    "radius",
                    2.0,
                    1.0,
                    MAX_RADIUS as f64,
                    "window half-width in pixels",
                ),
                ParamInfo::number(
                    "levels",
                    16.0,
                    2.0,
                    MAX_LEVELS as f64,
                    "number of intensity bins",
                ),
            ],
        )
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let r = whole(&info, params, "radius")?;
        let levels = whole(&info, params, "levels")?;
        Ok(match img {
            DynImage::U8(i) => {
                check_image(i)?;
                DynImage::U8(oil_paint(i, r, levels, run))
            }
            DynImage::U16(i) => {
                check_image(i)?;
                DynImage::U16(oil_paint(i, r, levels, run))
            }
        })
    }
}

/// The oil paint of the module documentation.
///
/// # Panics
///
/// If `radius` is not in 1..=8, `levels` not in 2..=64, or the image's fields disagree (see
/// [`Image::from_vec`]).
pub fn oil_paint<T: Sample>(img: &Image<T>, radius: usize, levels: usize, run: &Run) -> Image<T> {
    assert!((1..=MAX_RADIUS).contains(&radius), "oil_paint radius {radius}");
    assert!((2..=MAX_LEVELS).contains(&levels), "oil_paint levels {levels}");
    let n = 2 * radius + 1;
    // divs[k] divides a sum of k samples, rounding half up.
    let divs: Vec<Div> =
        (0..=(n * n) as u32).map(|k| Div::new(k.max(1), k.max(1) * T::MAX)).collect();
    let mut out = Image::new(img.width, img.height, img.channels);
    bands(run, &mut out.data, img.width * img.channels, |y0, band| {
        oil_band(img, radius, levels, &divs, y0, band);
    });
    out
}

/// The bin of one pixel.
#[inline(always)]
fn bin_of<T: Sample>(px: &[T], levels: u32) -> u8 {
    let i = if px.len() == 1 {
        px[0].to_u32()
    } else {
        (11 * px[0].to_u32() + 16 * px[1].to_u32() + 5 * px[2].to_u32()) >> 5
    };
    let bits = if T::MAX == 255 { 8 } else { 16 };
    ((i * levels) >> bits) as u8
}

/// Per-bin counts and colour sums of the current window. A count is kept as the key
/// `count · 64 + (63 − bin)`, so that the largest key is the winning bin (most pixels, the
/// lowest bin on a tie) and the scan for it is a plain, branch-free maximum.
struct Hist<const CC: usize> {
    key: [u32; MAX_LEVELS],
    sum: [[u32; CC]; MAX_LEVELS],
}

impl<const CC: usize> Hist<CC> {
    fn clear(&mut self) {
        for (b, k) in self.key.iter_mut().enumerate() {
            *k = (MAX_LEVELS - 1 - b) as u32;
        }
        self.sum.fill([0; CC]);
    }

    /// Add (`add`) or remove column `x` of rows `rows` of the window.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn column<T: Sample>(
        &mut self,
        img: &Image<T>,
        bins: &[u8],
        ylo: usize,
        rows: std::ops::Range<usize>,
        x: usize,
        add: bool,
    ) {
        let (w, c) = (img.width, img.channels);
        for yy in rows {
            // Bins are below MAX_LEVELS by construction (levels <= 64).
            let b = bins[(yy - ylo) * w + x] as usize % MAX_LEVELS;
            let px = &img.data[(yy * w + x) * c..][..CC];
            let (k, sum) = (&mut self.key[b], &mut self.sum[b]);
            if add {
                *k += MAX_LEVELS as u32;
                for ch in 0..CC {
                    sum[ch] += px[ch].to_u32();
                }
            } else {
                *k -= MAX_LEVELS as u32;
                for ch in 0..CC {
                    sum[ch] -= px[ch].to_u32();
                }
            }
        }
    }
}

fn oil_band<T: Sample>(
    img: &Image<T>,
    r: usize,
    levels: usize,
    divs: &[Div],
    y0: usize,
    band: &mut [T],
) {
    let (w, h, c) = (img.width, img.height, img.channels);
    let rl = w * c;
    // Bins of the input rows this band's windows cover.
    let (ylo, yhi) = (y0.saturating_sub(r), (y0 + band.len() / rl + r).min(h));
    let mut bins = vec![0u8; (yhi - ylo) * w];
    for (brow, yy) in bins.chunks_exact_mut(w).zip(ylo..yhi) {
        for (b, px) in brow.iter_mut().zip(img.row(yy).chunks_exact(c)) {
            *b = bin_of(px, levels as u32);
        }
    }
    if c == 1 {
        oil_rows::<T, 1>(img, r, levels, divs, y0, band, &bins, ylo);
    } else {
        oil_rows::<T, 3>(img, r, levels, divs, y0, band, &bins, ylo);
    }
}

#[allow(clippy::too_many_arguments)]
fn oil_rows<T: Sample, const CC: usize>(
    img: &Image<T>,
    r: usize,
    levels: usize,
    divs: &[Div],
    y0: usize,
    band: &mut [T],
    bins: &[u8],
    ylo: usize,
) {
    let (w, h, c) = (img.width, img.height, img.channels);
    let rl = w * c;
    let mut hist = Hist::<CC> { key: [0; MAX_LEVELS], sum: [[0; CC]; MAX_LEVELS] };
    for (i, orow) in band.chunks_exact_mut(rl).enumerate() {
        let y = y0 + i;
        let rows = y.saturating_sub(r)..(y + r + 1).min(h);
        hist.clear();
        for x in 0..(r + 1).min(w) {
            hist.column(img, bins, ylo, rows.clone(), x, true);
        }
        for (x, out) in orow.chunks_exact_mut(c).enumerate() {
            let key = hist.key[..levels].iter().copied().max().unwrap_or(0);
            let best = MAX_LEVELS - 1 - (key as usize % MAX_LEVELS);
            let d = divs[(key as usize / MAX_LEVELS).min(divs.len() - 1)];
            for (o, &s) in out[..CC].iter_mut().zip(&hist.sum[best]) {
                *o = T::from_u32(d.apply(s));
            }
            if x >= r {
                hist.column(img, bins, ylo, rows.clone(), x - r, false);
            }
            if x + r + 1 < w {
                hist.column(img, bins, ylo, rows.clone(), x + r + 1, true);
            }
        }
        copy_alpha(orow, img.row(y), c);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::filters::common::testkit::*;

    /// The definition, written as directly as possible.
    fn naive<T: Sample>(img: &Image<T>, r: usize, levels: usize) -> Image<T> {
        let (w, h, c, cc) = (img.width, img.height, img.channels, img.color_channels());
        let intensity = |x, y| {
            if cc == 1 {
                img.get(x, y, 0).to_u32() as u64
            } else {
                let (r, g, b) = (img.get(x, y, 0), img.get(x, y, 1), img.get(x, y, 2));
                ((11 * r.to_u32() + 16 * g.to_u32() + 5 * b.to_u32()) >> 5) as u64
            }
        };
        let bin = |x, y| (intensity(x, y) * levels as u64 / (T::MAX as u64 + 1)) as usize;
        let mut out = img.clone();
        for y in 0..h {
            for x in 0..w {
                let mut cnt = vec![0u64; levels];
                for yy in y.saturating_sub(r)..=(y + r).min(h - 1) {
                    for xx in x.saturating_sub(r)..=(x + r).min(w - 1) {
                        cnt[bin(xx, yy)] += 1;
                    }
                }
                let most = *cnt.iter().max().unwrap();
                let best = cnt.iter().position(|&k| k == most).unwrap();
                for ch in 0..cc {
                    let mut s = 0u64;
                    for yy in y.saturating_sub(r)..=(y + r).min(h - 1) {
                        for xx in x.saturating_sub(r)..=(x + r).min(w - 1) {
                            if bin(xx, yy) == best {
                                s += img.get(xx, yy, ch).to_u32() as u64;
                            }
                        }
                    }
                    out.data[(y * w + x) * c + ch] = T::from_u32(((s + most / 2) / most) as u32);
                }
            }
        }
        out
    }

    fn naive_dyn(img: &DynImage, r: usize, levels: usize) -> DynImage {
        match img {
            DynImage::U8(i) => DynImage::U8(naive(i, r, levels)),
            DynImage::U16(i) => DynImage::U16(naive(i, r, levels)),
        }
    }

    #[test]
    fn gray8_every_pixel() {
        // Two bins: below 128 and from 128. x = 0: {10 | 200} tie → bin 0 → 10; x = 1 and 2:
        // bin 1 wins with {200, 210} / {201, 210}: means 205 and 205.5 → 206.
        let p = [("radius", "1"), ("levels", "2")];
        assert_eq!(data8(&apply(&OilPaint, &img8(3, 1, 1, &[10, 200, 210]), &p)), [10, 205, 205]);
        assert_eq!(data8(&apply(&OilPaint, &img8(3, 1, 1, &[10, 201, 210]), &p)), [10, 206, 206]);
        // 3×3, default levels (16 bins of 16): the five 100s (bin 6) outvote the rest in the
        // full window; corners see 4 pixels.
        #[rustfmt::skip]
        let img = img8(3, 3, 1, &[
            100, 0, 100,
            0, 100, 50,
            100, 30, 100,
        ]);
        // (0,0): {100, 0, 0, 100}: tie 2–2, bin 0 wins → 0. (1,0): {100,0,100,0,100,50}:
        // 100 ×3 → 100. (2,0): {0,100,100,50} → 100. (0,1): {100,0,0,100,100,30}: bin 6
        // has 3 → 100. (1,1) → 100. (2,1): {0,100,100,50,30,100} → 100. (0,2):
        // {0,100,100,30} → 100. (1,2): {0,100,50,100,30,100} → 100. (2,2): {100,50,30,100}
        // → 100.
        let out = data8(&apply(&OilPaint, &img, &[("radius", "1")]));
        assert_eq!(out, [0, 100, 100, 100, 100, 100, 100, 100, 100]);
    }

    #[test]
    fn gray16_every_pixel() {
        // Bins of 32768: 1000 → 0; 50000, 60001 → 1. Means: (110001 + 1) / 2 = 55001.
        let p = [("radius", "1"), ("levels", "2")];
        let out = apply(&OilPaint, &img16(3, 1, 1, &[1000, 50000, 60001]), &p);
        assert_eq!(data16(&out), [1000, 55001, 55001]);
    }

    #[test]
    fn rgb_and_rgba_every_pixel() {
        // Greys 34 (bin 2) and 30 (bin 1): a 1–1 tie, the lower bin wins: (0, 60, 0) everywhere.
        let img = img8(2, 1, 3, &[100, 0, 0, 0, 60, 0]);
        assert_eq!(data8(&apply(&OilPaint, &img, &[])), [0, 60, 0, 0, 60, 0]);
        // Two bins: both in bin 0, the mean colour (50, 30, 0).
        let p = [("levels", "2")];
        assert_eq!(data8(&apply(&OilPaint, &img, &p)), [50, 30, 0, 50, 30, 0]);
        let img = img8(2, 1, 4, &[100, 0, 0, 9, 0, 60, 0, 8]);
        assert_eq!(data8(&apply(&OilPaint, &img, &p)), [50, 30, 0, 9, 50, 30, 0, 8]);
        let img = img16(2, 1, 3, &[1, 2, 3, 4, 6, 9]);
        // Same bin; means 2.5 → 3, 4, 6.
        assert_eq!(data16(&apply(&OilPaint, &img, &[])), [3, 4, 6, 3, 4, 6]);
    }

    #[test]
    fn bad_parameters_are_errors() {
        let img = img8(2, 2, 1, &[0; 4]);
        for (k, v) in [
            ("radius", "0"),
            ("radius", "9"),
            ("radius", "1.5"),
            ("levels", "1"),
            ("levels", "65"),
            ("levels", "x"),
        ] {
            let e = OilPaint.apply(&img, &Params::new().with(k, v), &Run::single());
            assert!(matches!(e, Err(ImagingError::BadParam { .. })), "{k}={v}: {e:?}");
        }
        let e = OilPaint.apply(&img, &Params::new().with("size", 3), &Run::single());
        assert!(matches!(e, Err(ImagingError::UnknownParam { .. })));
    }

    #[test]
    fn tiny_and_broken_images() {
        for img in tiny_images() {
            for (r, l) in [(1, 2), (2, 16), (8, 64)] {
                let p = [("radius", r.to_string()), ("levels", l.to_string())];
                let p: Vec<_> = p.iter().map(|(k, v)| (*k, v.as_str())).collect();
                assert_eq!(apply(&OilPaint, &img, &p), naive_dyn(&img, r, l));
            }
        }
        for img in broken_images() {
            let e = OilPaint.apply(&img, &Params::new(), &Run::single());
            assert!(matches!(e, Err(ImagingError::InvalidImage(_))));
        }
    }

    proptest! {
        #[test]
        fn matches_the_definition(
            img in any_image(14, 10),
            r in 1usize..=4,
            levels in prop::sample::select(vec![2usize, 3, 7, 16, 64]),
        ) {
            let p = Params::new().with("radius", r).with("levels", levels);
            let out = OilPaint.apply(&img, &p, &Run::single()).unwrap();
            prop_assert_eq!(out, naive_dyn(&img, r, levels));
        }

        #[test]
        fn constant_stays_constant(img in constant_image(12, 12), r in 1usize..=8) {
            let out = OilPaint.apply(&img, &Params::new().with("radius", r), &Run::single());
            prop_assert_eq!(out.unwrap(), img);
        }

        #[test]
        fn same_on_one_and_three_threads(img in any_image(9, 40), r in 1usize..=3) {
            same_on_threads(&OilPaint, &img, &Params::new().with("radius", r));
        }
    }
}
