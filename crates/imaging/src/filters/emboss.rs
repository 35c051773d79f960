//! `emboss`: xv's and MedJava's Emboss filter, a relief in grey: most of the image becomes
//! middle grey, edges facing the light lighter and the others darker.
//!
//! # Definition
//!
//! With `MID = 128` for 8-bit and `32768` for 16-bit images, for every pixel (x, y) not on
//! the 1-pixel border and every colour channel `p`, the kernel
//!
//! ```text
//!       −2 −1  0
//! K =   −1  0  1        s = Σ_{i,j ∈ 0..3} K[j][i] · p(x + i − 1, y + j − 1)
//!        0  1  2            (rows j top to bottom, columns i left to right: a correlation)
//! ```
//!
//! gives `e = clamp(s / 8 + MID, 0, MAX)`, where `/` truncates toward zero (as in xv's C).
//! (`|s| <= 4·MAX`, so `e` is always in `1..=MAX` and the clamp never acts.) The channels are
//! then merged into xv's grey, `(11·e_R + 16·e_G + 5·e_B) >> 5`, and the pixel gets that
//! grey in R, G and B. Gray images keep their one channel, `e` itself.
//!
//! **Border**: the pixels of the 1-pixel frame become `MID` (middle grey), as in xv; images
//! narrower or shorter than 3 pixels are all `MID`.
//!
//! **Pixel types**: gray8 and gray16 stay gray; rgb8 and rgb16 keep three channels, all equal
//! to the grey; rgba8 and rgba16 likewise, with alpha copied unchanged. No parameters.
//!
//! # Speed
//!
//! One pass: the kernel is evaluated on whole rows as differences of shifted slices
//! (vectorised; 16-bit arithmetic for 8-bit images), then merged into grey pixel by pixel
//! (with the channel count a compile-time constant, so that loop vectorises too). Rows run in
//! parallel bands; inner loops are built for the baseline CPU, AVX2 and AVX-512; the result does
//! not depend on the number of threads or on the CPU.
//!
//! Measured (release, 2048², one thread of a shared 2-core machine): rgb8 about
//! 1.4 Gpixel/s, gray8 about 7, gray16 about 3.5.

use std::sync::Arc;

use super::common::{bands, builtin_info, copy_alpha, each_depth, grey, multiversion};
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, Output, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Emboss));
}

/// The `emboss` filter (see the module documentation).
pub struct Emboss;

impl Filter for Emboss {
    fn info(&self) -> FilterInfo {
        builtin_info(
            "emboss",
            "relief: kernel [[-2,-1,0],[-1,0,1],[0,1,2]], sum/8 + mid-grey, merged to grey",
            Vec::new(),
        )
    }

    /// Grey levels for display, no longer the input's values.
    fn output(&self, _params: &Params) -> Output {
        Output::GreyLevels
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        self.info().check_known(params)?;
        Ok(each_depth!(img, i => emboss(i, run)))
    }
}

/// The relief of the module documentation.
///
/// # Panics
///
/// If the image's fields disagree (see [`Image::from_vec`]).
pub fn emboss<T: Sample>(img: &Image<T>, run: &Run) -> Image<T> {
    let mut out = Image::for_overwrite(img.width, img.height, img.channels);
    bands(run, &mut out.data, img.width * img.channels, |y0, band| {
        if T::MAX == 255 {
            emboss_band::<T, i16>(img, y0, band)
        } else {
            emboss_band::<T, i32>(img, y0, band)
        }
    });
    out
}

/// The signed type the kernel sum is kept in: `i16` for 8-bit samples (`|s| <= 1020`),
/// `i32` for 16-bit.
trait Acc: Copy + Default + Send + Sync {
    fn of<T: Sample>(v: T) -> Self;
    /// `clamp(s / 8 + mid, 0, max)` for `s = 2(br − tl) + (r − l) + (b − t)`, the samples
    /// given as `[br, tl, r, l, b, t]`.
    fn relief(p: [Self; 6], mid: Self, max: Self) -> u32;
}

impl Acc for i16 {
    #[inline(always)]
    fn of<T: Sample>(v: T) -> Self {
        v.to_u32() as i16
    }
    #[inline(always)]
    fn relief([br, tl, r, l, b, t]: [Self; 6], mid: Self, max: Self) -> u32 {
        let s = 2 * (br - tl) + (r - l) + (b - t);
        (s / 8 + mid).clamp(0, max) as u32
    }
}

impl Acc for i32 {
    #[inline(always)]
    fn of<T: Sample>(v: T) -> Self {
        v.to_u32() as i32
    }
    #[inline(always)]
    fn relief([br, tl, r, l, b, t]: [Self; 6], mid: Self, max: Self) -> u32 {
        let s = 2 * (br - tl) + (r - l) + (b - t);
        (s / 8 + mid).clamp(0, max) as u32
    }
}

multiversion! {
    /// Output rows `y0..` into `band`.
    fn emboss_band<T: Sample, A: Acc>(img: &Image<T>, y0: usize, band: &mut [T]) => emboss_band_body, avx512
}

#[inline(always)]
fn emboss_band_body<T: Sample, A: Acc>(img: &Image<T>, y0: usize, band: &mut [T]) {
    let (w, h, c) = (img.width, img.height, img.channels);
    let rl = w * c;
    let mid = T::from_u32(T::MAX / 2 + 1);
    let (amid, amax) = (A::of(mid), A::of(T::from_u32(T::MAX)));
    let mut e = vec![mid; rl];
    for (i, orow) in band.chunks_exact_mut(rl).enumerate() {
        let y = y0 + i;
        if y == 0 || y + 1 >= h || w < 3 {
            orow.fill(mid);
            copy_alpha(orow, img.row(y), c);
            continue;
        }
        let (a, b, d) = (img.row(y - 1), img.row(y), img.row(y + 1));
        // Samples j in [c, rl − c): neighbours at j ± c in the rows above and below.
        let len = rl - 2 * c;
        let (tl, t) = (&a[..len], &a[c..c + len]);
        let (l, r) = (&b[..len], &b[2 * c..2 * c + len]);
        let (bo, br) = (&d[c..c + len], &d[2 * c..2 * c + len]);
        let dst: &mut [T] = if c == 1 { &mut orow[c..c + len] } else { &mut e[c..c + len] };
        for j in 0..len {
            let p = [br[j], tl[j], r[j], l[j], bo[j], t[j]].map(A::of);
            let v = A::relief(p, amid, amax);
            dst[j] = T::from_u32(v);
        }
        orow[..c].fill(mid);
        orow[rl - c..].fill(mid);
        match c {
            3 => merge_grey::<T, 3>(&mut orow[c..rl - c], &e[c..rl - c]),
            4 => {
                merge_grey::<T, 4>(&mut orow[c..rl - c], &e[c..rl - c]);
                copy_alpha(orow, b, c);
            }
            _ => {}
        }
    }
}

/// R, G and B of every pixel of `out` set to xv's grey of `e`'s channels.
#[inline(always)]
fn merge_grey<T: Sample, const C: usize>(out: &mut [T], e: &[T]) {
    for (o, e) in out.chunks_exact_mut(C).zip(e.chunks_exact(C)) {
        let g = T::from_u32(grey(e[0].to_u32(), e[1].to_u32(), e[2].to_u32()));
        o[0] = g;
        o[1] = g;
        o[2] = g;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::filters::common::testkit::*;

    /// The definition, written as directly as possible.
    fn naive<T: Sample>(img: &Image<T>) -> Image<T> {
        const K: [[i64; 3]; 3] = [[-2, -1, 0], [-1, 0, 1], [0, 1, 2]];
        let (w, h, c) = (img.width, img.height, img.channels);
        let mid = (T::MAX / 2 + 1) as i64;
        let mut out = img.clone();
        for y in 0..h {
            for x in 0..w {
                let mut e = [mid; 3];
                if x >= 1 && y >= 1 && x + 1 < w && y + 1 < h {
                    for (ch, e) in e.iter_mut().enumerate().take(img.color_channels()) {
                        let mut s = 0;
                        for (j, row) in K.iter().enumerate() {
                            for (i, k) in row.iter().enumerate() {
                                s += k * img.get(x + i - 1, y + j - 1, ch).to_u32() as i64;
                            }
                        }
                        *e = (s / 8 + mid).clamp(0, T::MAX as i64);
                    }
                }
                let g = if c == 1 { e[0] } else { (11 * e[0] + 16 * e[1] + 5 * e[2]) >> 5 };
                for ch in 0..img.color_channels() {
                    out.data[(y * w + x) * c + ch] = T::from_u32(g as u32);
                }
            }
        }
        out
    }

    fn naive_dyn(img: &DynImage) -> DynImage {
        match img {
            DynImage::U8(i) => DynImage::U8(naive(i)),
            DynImage::U16(i) => DynImage::U16(naive(i)),
        }
    }

    #[test]
    fn gray8_every_pixel() {
        // 4×3: the interior is (1,1) and (2,1).
        #[rustfmt::skip]
        let img = img8(4, 3, 1, &[
            0, 0, 0, 0,
            0, 100, 200, 0,
            0, 0, 255, 255,
        ]);
        // (1,1): s = −2·0 − 0 − 0 + 200 + 0 + 2·255 = 710 → 710/8 = 88 → 216.
        // (2,1): s = −2·0 − 0 − 100 + 0 + 255 + 2·255 = 665 → 83 → 211.
        let out = data8(&apply(&Emboss, &img, &[]));
        assert_eq!(out, [128, 128, 128, 128, 128, 216, 211, 128, 128, 128, 128, 128]);
        // Negative sums truncate toward zero: −9/8 = −1 → 127 (flooring would give 126).
        let img = img8(3, 3, 1, &[0, 9, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(data8(&apply(&Emboss, &img, &[]))[4], 127);
    }

    #[test]
    fn gray16_every_pixel() {
        // A bright lower-right corner: s = 2·65535 → 16383 → 49151; the frame is MID.
        let img = img16(3, 3, 1, &[0, 0, 0, 0, 0, 0, 0, 0, 65535]);
        assert_eq!(
            data16(&apply(&Emboss, &img, &[])),
            [32768, 32768, 32768, 32768, 49151, 32768, 32768, 32768, 32768]
        );
        // The top-left corner: s = −2·65535 → −16383 → 16385.
        let img = img16(3, 3, 1, &[65535, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(data16(&apply(&Emboss, &img, &[]))[4], 16385);
    }

    #[test]
    fn rgb_and_rgba_become_grey() {
        // Only the lower-right pixel is non-zero: (80, 0, 255): s = 2·value per channel.
        // e = (128 + 20, 128, 128 + 63) = (148, 128, 191); grey = (1628 + 2048 + 955) >> 5
        // = 4631 >> 5 = 144.
        let mut px = vec![0u8; 27];
        px[24..27].copy_from_slice(&[80, 0, 255]);
        let out = data8(&apply(&Emboss, &img8(3, 3, 3, &px), &[]));
        assert_eq!(&out[12..15], [144, 144, 144]);
        assert!(out.iter().enumerate().all(|(i, &v)| (12..15).contains(&i) || v == 128));
        let mut px = vec![0u8; 36];
        px[32..36].copy_from_slice(&[80, 0, 255, 77]);
        px[19] = 5;
        let out = data8(&apply(&Emboss, &img8(3, 3, 4, &px), &[]));
        assert_eq!(&out[16..20], [144, 144, 144, 5]);
        assert_eq!(&out[32..36], [128, 128, 128, 77]);
        // rgb16: (0, 65535, 0) at the lower right: e = (MID, MID + 16383, MID) =
        // (32768, 49151, 32768); grey = (11·32768 + 16·49151 + 5·32768) >> 5 = 40959.
        let mut px = vec![0u16; 27];
        px[25] = 65535;
        assert_eq!(&data16(&apply(&Emboss, &img16(3, 3, 3, &px), &[]))[12..15], [40959; 3]);
    }

    #[test]
    fn bad_parameters_are_errors() {
        let e = Emboss.apply(&img8(1, 1, 1, &[0]), &Params::new().with("depth", 3), &Run::single());
        assert!(matches!(e, Err(ImagingError::UnknownParam { .. })));
    }

    #[test]
    fn tiny_and_broken_images() {
        for img in tiny_images() {
            assert_eq!(apply(&Emboss, &img, &[]), naive_dyn(&img));
        }
        for img in broken_images() {
            let e = Emboss.apply(&img, &Params::new(), &Run::single());
            assert!(matches!(e, Err(ImagingError::InvalidImage(_))));
        }
    }

    #[test]
    fn every_build_matches_too() {
        on_every_build(any_image(12, 6), |img| {
            prop_assert_eq!(apply(&Emboss, &img, &[]), naive_dyn(&img));
            Ok(())
        });
    }

    proptest! {
        #[test]
        fn matches_the_definition(img in any_image(16, 10)) {
            prop_assert_eq!(apply(&Emboss, &img, &[]), naive_dyn(&img));
        }

        #[test]
        fn constant_is_mid_grey(img in constant_image(12, 12)) {
            let out = apply(&Emboss, &img, &[]);
            let (c, cc) = (img.channels(), if img.channels() == 4 { 3 } else { img.channels() });
            match (&img, &out) {
                (DynImage::U8(i), DynImage::U8(o)) => {
                    for (k, (&v, &o)) in i.data.iter().zip(&o.data).enumerate() {
                        prop_assert_eq!(o, if k % c < cc { 128 } else { v });
                    }
                }
                (DynImage::U16(i), DynImage::U16(o)) => {
                    for (k, (&v, &o)) in i.data.iter().zip(&o.data).enumerate() {
                        prop_assert_eq!(o, if k % c < cc { 32768 } else { v });
                    }
                }
                _ => prop_assert!(false, "depth changed"),
            }
        }

        #[test]
        fn same_on_one_and_three_threads(img in any_image(9, 40)) {
            same_on_threads(&Emboss, &img, &Params::new());
        }
    }
}
