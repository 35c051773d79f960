//! `unsharp`: unsharp mask — add back a multiple of the detail a Gaussian blur removes.
//!
//! **Definition.** Per colour channel, for each sample `v` with Gaussian-blurred value `b`:
//!
//! ```text
//! d   = v − b
//! out = v + amount · d     if |d| ≥ threshold
//! out = v                  otherwise
//! ```
//!
//! rounded half up (`floor(out + 0.5)`) and clamped to `0..=MAX` (255 or 65535).
//!
//! The blur is separable: `b = G_y * (G_x * v)`, with the 1-D kernel
//! `g[k] = exp(−k² / 2σ²) / Σ_j exp(−j² / 2σ²)` for `k = −r..=r`, `r = max(1, ceil(3σ))`,
//! computed in `f64` and applied in `f32`, horizontal pass first. Borders are clamp-to-edge
//! (samples outside the image take the value of the nearest edge sample), so a constant image
//! is left unchanged. This module has its own Gaussian; it does not share the `blur` filter's.
//!
//! **Parameters.** `sigma` (0.1..=20, default 1) — blur radius in pixels; `amount` (0..=5,
//! default 1) — how much detail to add (0 returns the input); `threshold` (0..=MAX, default 0)
//! — smallest `|v − b|`, in sample units, that is sharpened, so flat noisy areas can be left
//! alone (a threshold above 255 on an 8-bit image is a `BadParam` error).
//!
//! **Pixel types.** 8- and 16-bit gray, RGB and RGBA; each colour channel on its own (not on
//! luminance, so strong settings can shift hues at coloured edges); alpha copied unchanged.
//!
//! Speed: work is split into bands of output rows ([`Run::rows`] over bands); each band runs the
//! horizontal pass once for the rows it needs (its own rows plus `r` above and below) into an
//! `f32` scratch, then the vertical pass, so memory is read about once and nothing is allocated
//! per pixel. Inner loops are multiply-adds over whole rows, which the compiler vectorises.

use std::sync::Arc;

use super::invert::check_shape;
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, ParamInfo, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Unsharp));
}

/// The `unsharp` filter.
pub struct Unsharp;

impl Filter for Unsharp {
    fn info(&self) -> FilterInfo {
        FilterInfo {
            name: "unsharp".into(),
            summary: "unsharp mask: v + amount·(v − gaussian(v)) where |v − gaussian| ≥ threshold"
                .into(),
            params: vec![
                ParamInfo::number("sigma", 1.0, 0.1, 20.0, "Gaussian standard deviation, pixels"),
                ParamInfo::number("amount", 1.0, 0.0, 5.0, "strength (0 = unchanged)"),
                ParamInfo::number(
                    "threshold",
                    0.0,
                    0.0,
                    65535.0,
                    "least |v − blur| sharpened, sample units (at most 255 on 8-bit images)",
                ),
            ],
            kind: "builtin".into(),
            source: None,
        }
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let sigma = info.number(params, "sigma")?;
        let amount = info.number(params, "amount")? as f32;
        let threshold = info.number(params, "threshold")?;
        let max = match img {
            DynImage::U8(_) => u8::MAX as f64,
            DynImage::U16(_) => u16::MAX as f64,
        };
        if threshold > max {
            return Err(ImagingError::BadParam {
                filter: info.name,
                param: "threshold".into(),
                reason: format!("{threshold} is above {max}, the largest sample of this image"),
            });
        }
        let k = gaussian(sigma);
        let s = Sharpen { k: &k, amount, threshold: threshold as f32 };
        Ok(match img {
            DynImage::U8(i) => DynImage::U8(s.apply(i, run)?),
            DynImage::U16(i) => DynImage::U16(s.apply(i, run)?),
        })
    }
}

/// The normalised 1-D Gaussian of `sigma`, `2r + 1` taps with `r = max(1, ceil(3σ))`.
pub fn gaussian(sigma: f64) -> Vec<f32> {
    let r = ((3.0 * sigma).ceil() as i64).max(1);
    let w: Vec<f64> = (-r..=r).map(|k| (-((k * k) as f64) / (2.0 * sigma * sigma)).exp()).collect();
    let sum: f64 = w.iter().sum();
    w.iter().map(|x| (x / sum) as f32).collect()
}

struct Sharpen<'a> {
    k: &'a [f32],
    amount: f32,
    threshold: f32,
}

impl Sharpen<'_> {
    fn apply<T: Sample>(&self, img: &Image<T>, run: &Run) -> Result<Image<T>, ImagingError> {
        check_shape(img)?;
        let (w, h, c) = (img.width, img.height, img.channels);
        let rl = w * c;
        let r = self.k.len() / 2;
        let band = (4 * r).max(32);
        let max = T::MAX as f32;
        let alpha = img.has_alpha();
        let mut out = Image::new(w, h, c);
        run.rows(&mut out.data, rl * band, |b, chunk| {
            let y0 = b * band;
            let rows = chunk.len() / rl;
            // Horizontal pass over the rows this band reads: s0..s1.
            let s0 = y0.saturating_sub(r);
            let s1 = (y0 + rows + r).min(h);
            let mut hz = vec![0f32; (s1 - s0) * rl];
            let mut pad = vec![0f32; (w + 2 * r) * c];
            for sy in s0..s1 {
                let src = img.row(sy);
                let (left, rest) = pad.split_at_mut(r * c);
                let (mid, right) = rest.split_at_mut(rl);
                for px in left.chunks_exact_mut(c) {
                    px.iter_mut().zip(&src[..c]).for_each(|(d, s)| *d = s.to_u32() as f32);
                }
                mid.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_u32() as f32);
                for px in right.chunks_exact_mut(c) {
                    px.iter_mut().zip(&src[rl - c..]).for_each(|(d, s)| *d = s.to_u32() as f32);
                }
                let dst = &mut hz[(sy - s0) * rl..(sy - s0 + 1) * rl];
                for (i, &wt) in self.k.iter().enumerate() {
                    for (d, &p) in dst.iter_mut().zip(&pad[i * c..i * c + rl]) {
                        *d += wt * p;
                    }
                }
            }
            // Vertical pass and the mask, row by row.
            let mut acc = vec![0f32; rl];
            for (i, orow) in chunk.chunks_exact_mut(rl).enumerate() {
                let y = y0 + i;
                acc.fill(0.0);
                for (j, &wt) in self.k.iter().enumerate() {
                    let sy = (y + j).saturating_sub(r).min(h - 1);
                    let hrow = &hz[(sy - s0) * rl..(sy - s0 + 1) * rl];
                    for (a, &p) in acc.iter_mut().zip(hrow) {
                        *a += wt * p;
                    }
                }
                let src = img.row(y);
                for ((o, &v), &blur) in orow.iter_mut().zip(src).zip(&acc) {
                    let v = v.to_u32() as f32;
                    let d = v - blur;
                    let s = if d.abs() >= self.threshold { v + self.amount * d } else { v };
                    *o = T::from_u32((s + 0.5).floor().clamp(0.0, max) as u32);
                }
                if alpha {
                    for (o, s) in orow.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                        o[3] = s[3];
                    }
                }
            }
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::invert::testkit::*;
    use super::*;

    // Expected values: the definition evaluated in f64 (none is near a rounding tie).
    // σ = 1: normalised weights 0.39905, 0.24203, 0.05400, 0.00443 for |k| = 0..3.

    #[test]
    fn known_pixels_gray8() {
        let g = gray8(5, 1, &[100, 100, 200, 100, 100]);
        // Centre: 200 + (200 − 139.905) = 260.1 → 255; next: 100 − 24.2 = 75.8 → 76;
        // edges: 100 − 5.40 = 94.6 → 95.
        assert_eq!(run1(&Unsharp, &g, &[]), gray8(5, 1, &[95, 76, 255, 76, 95]));
        // With threshold 10 the edges (|d| = 5.4) stay.
        assert_eq!(run1(&Unsharp, &g, &["threshold=10"]), gray8(5, 1, &[100, 76, 255, 76, 100]));
        assert_eq!(run1(&Unsharp, &g, &["amount=0"]), g);
        assert_eq!(run1(&Unsharp, &g, &["threshold=255"]), g);
        // Vertical: the same along a column.
        let col = gray8(1, 5, &[100, 100, 200, 100, 100]);
        assert_eq!(run1(&Unsharp, &col, &[]), gray8(1, 5, &[95, 76, 255, 76, 95]));
    }

    #[test]
    fn known_pixels_gray16() {
        let g = gray16(5, 1, &[100, 100, 200, 100, 100]);
        assert_eq!(run1(&Unsharp, &g, &[]), gray16(5, 1, &[95, 76, 260, 76, 95]));
        // σ = 0.5 (r = 2) in 2-D: a bright centre on a 100 background.
        let g = gray16(3, 3, &[100, 100, 100, 100, 1100, 100, 100, 100, 100]);
        assert_eq!(
            run1(&Unsharp, &g, &["sigma=0.5"]),
            gray16(3, 3, &[89, 16, 89, 16, 1481, 16, 89, 16, 89])
        );
        // amount 2, threshold 20: the corners' |d| = 11.3 is below it; the sides go below 0.
        assert_eq!(
            run1(&Unsharp, &g, &["sigma=0.5", "amount=2", "threshold=20"]),
            gray16(3, 3, &[100, 0, 100, 0, 1863, 0, 100, 0, 100])
        );
    }

    #[test]
    fn known_pixels_rgb_per_channel() {
        #[rustfmt::skip]
        let c = rgb8(5, 1, &[
            100, 50, 0,  100, 50, 0,  200, 50, 0,  100, 50, 0,  100, 50, 0,
        ]);
        #[rustfmt::skip]
        let want = rgb8(5, 1, &[
            95, 50, 0,  76, 50, 0,  255, 50, 0,  76, 50, 0,  95, 50, 0,
        ]);
        assert_eq!(run1(&Unsharp, &c, &[]), want);
        let a = rgba8(2, 1, &[10, 200, 30, 40, 200, 10, 30, 250]);
        let out = run1(&Unsharp, &a, &["amount=5"]);
        let DynImage::U8(o) = out else { panic!() };
        assert_eq!((o.data[3], o.data[7]), (40, 250));
        assert_eq!((o.data[2], o.data[6]), (30, 30));
    }

    #[test]
    fn kernel_is_normalised_and_sized() {
        for (s, r) in [(0.1, 1), (0.5, 2), (1.0, 3), (20.0, 60)] {
            let k = gaussian(s);
            assert_eq!(k.len(), 2 * r + 1, "σ {s}");
            assert!((k.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            assert!(k.windows(2).take(r).all(|w| w[0] <= w[1]));
        }
    }

    #[test]
    fn bad_params() {
        let g8 = gray8(1, 1, &[0]);
        for (k, v) in [
            ("sigma", "0"),
            ("sigma", "21"),
            ("amount", "-1"),
            ("amount", "6"),
            ("threshold", "-1"),
            ("threshold", "256"),
            ("threshold", "x"),
        ] {
            let e = Unsharp.apply(&g8, &Params::new().with(k, v), &Run::single()).unwrap_err();
            assert!(matches!(e, ImagingError::BadParam { .. }), "{k}={v}: {e}");
        }
        let g16 = gray16(1, 1, &[0]);
        assert!(Unsharp.apply(&g16, &p(&["threshold=256"]), &Run::single()).is_ok());
        let e = Unsharp.apply(&g8, &p(&["radius=1"]), &Run::single()).unwrap_err();
        assert!(matches!(e, ImagingError::UnknownParam { .. }), "{e}");
        // A large σ on a tiny image: every tap clamps to the one pixel.
        assert_eq!(run1(&Unsharp, &g16, &["sigma=20", "amount=5"]), g16);
        assert_eq!(run1(&Unsharp, &gray8(0, 0, &[]), &[]), gray8(0, 0, &[]));
    }

    #[test]
    fn bands_and_threads_agree_on_a_tall_image() {
        let (w, h) = (7, 150);
        let data: Vec<u16> = (0..w * h).map(|i| ((i * 7919) % 65536) as u16).collect();
        let g = gray16(w, h, &data);
        let ps = p(&["sigma=2.5", "amount=1.5"]);
        let one = Unsharp.apply(&g, &ps, &Run::single()).unwrap();
        assert_eq!(Unsharp.apply(&g, &ps, &Run::with_threads(3)).unwrap(), one);
        assert_eq!(Unsharp.apply(&g, &ps, &Run::with_threads(2)).unwrap(), one);
    }

    proptest! {
        #[test]
        fn constant_images_and_zero_amount_are_unchanged(
            img in any_image(6),
            sigma in 0.1f64..=20.0,
            amount in 0.0f64..=5.0,
        ) {
            let ps = [format!("sigma={sigma}"), format!("amount={amount}")];
            let ps: Vec<&str> = ps.iter().map(String::as_str).collect();
            let zero = [ps[0], "amount=0"];
            prop_assert_eq!(run1(&Unsharp, &img, &zero), img.clone());
            let flat = match &img {
                DynImage::U8(i) => DynImage::U8(Image { data: i.data.iter().map(|_| i.data[0]).collect(), ..i.clone() }),
                DynImage::U16(i) => DynImage::U16(Image { data: i.data.iter().map(|_| i.data[0]).collect(), ..i.clone() }),
            };
            prop_assert_eq!(run1(&Unsharp, &flat, &ps), flat);
        }

        #[test]
        fn threads_agree(img in any_image(40), sigma in 0.1f64..=6.0, amount in 0.0f64..=5.0, t in 0u32..100) {
            let ps = p(&[&format!("sigma={sigma}"), &format!("amount={amount}"), &format!("threshold={t}")]);
            let one = Unsharp.apply(&img, &ps, &Run::single()).unwrap();
            prop_assert_eq!(Unsharp.apply(&img, &ps, &Run::with_threads(3)).unwrap(), one);
        }

        #[test]
        fn junk_never_panics(img in any_image(3), key in prop_oneof![Just("sigma"), Just("amount"), Just("threshold")], v in junk_value()) {
            if let Err(e) = Unsharp.apply(&img, &Params::new().with(key, &v), &Run::single()) {
                prop_assert!(matches!(e, ImagingError::BadParam { .. }), "{}", e);
            }
        }
    }
}
