//! `zoom`: resize by a factor or to a size, with nearest-neighbour or bilinear interpolation.
//!
//! **Output size.** Either `factor` (0.01..=32, default 2) — output `round(W·f) × round(H·f)`,
//! at least 1 × 1 — or `width` and/or `height` (integers 1..=1048576): with only one of them the
//! other follows the aspect ratio, `round(H·width/W)` (at least 1). Giving `factor` together with
//! `width` or `height` is a `BadParam` error. Outputs above [`MAX_PIXELS`] pixels are refused
//! with `TooLarge` before anything is allocated; empty inputs are `InvalidImage`.
//!
//! **Alignment.** Pixel centres are aligned, not corners, and each axis has its own scale
//! `s = in / out` (so the edges of the output map exactly onto the edges of the input, whatever
//! the rounding of the size). Output pixel `d` looks at the source coordinate
//!
//! ```text
//! src(d) = (d + 0.5) · s − 0.5
//! ```
//!
//! - `method = "nearest"`: the source pixel `floor(src(d) + 0.5) = floor((d + 0.5)·s)`, computed
//!   exactly in integers as `((2d + 1)·in) div (2·out)`, at most `in − 1`. Ties (a centre exactly
//!   between two source pixels) take the right / lower one. Every output sample is a copy.
//! - `method = "bilinear"` (default): `src` is clamped to `[0, in − 1]`, `i0 = floor(src)`,
//!   `i1 = min(i0 + 1, in − 1)`, `t = src − i0`; the value is
//!   `lerp(lerp(p00, p10, tx), lerp(p01, p11, tx), ty)` evaluated as
//!   vertical-then-horizontal in `f32` (`lerp(a, b, t) = a + (b − a)·t`), rounded half up. Clamping
//!   makes the outer half-pixel replicate the edge. It samples 2 × 2 pixels, so strong reductions
//!   alias: it is an interpolator, not an area average.
//!
//! With `factor = 1` both methods return the input unchanged.
//!
//! **Pixel types.** 8- and 16-bit gray, RGB and RGBA; every channel, alpha included, is
//! interpolated independently (straight, not premultiplied, alpha). The output keeps the sample
//! type and channel count.
//!
//! Speed: source columns and weights are computed once per call; each output row interpolates its
//! two source rows into one `f32` row (a vectorisable pass), then gathers columns. Rows run in
//! parallel through [`Run::rows`].

use std::sync::Arc;

use super::invert::check_shape;
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, ParamInfo, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Largest output, in pixels (2^26: 8192 × 8192; 512 MiB at rgba16).
pub const MAX_PIXELS: u64 = 1 << 26;

/// Largest `width` / `height` parameter.
const MAX_SIDE: f64 = 1_048_576.0;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Zoom));
}

/// The `zoom` filter.
pub struct Zoom;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Nearest,
    Bilinear,
}

impl Filter for Zoom {
    fn info(&self) -> FilterInfo {
        let side = |name: &str, help: &str| ParamInfo {
            name: name.into(),
            default: "auto".into(),
            range: Some((1.0, MAX_SIDE)),
            help: help.into(),
        };
        FilterInfo {
            name: "zoom".into(),
            summary: "resize by a factor or to a size (nearest or bilinear, centres aligned)"
                .into(),
            params: vec![
                ParamInfo::number(
                    "factor",
                    2.0,
                    0.01,
                    32.0,
                    "scale factor (not with width/height)",
                ),
                side("width", "output width in pixels (height follows unless given)"),
                side("height", "output height in pixels (width follows unless given)"),
                ParamInfo::text("method", "bilinear", "nearest or bilinear"),
            ],
            kind: "builtin".into(),
            source: None,
        }
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let bad = |param: &str, reason: String| ImagingError::BadParam {
            filter: info.name.clone(),
            param: param.into(),
            reason,
        };
        let method = match info.text(params, "method") {
            "nearest" => Method::Nearest,
            "bilinear" => Method::Bilinear,
            other => {
                return Err(bad("method", format!("{other:?} is not \"nearest\" or \"bilinear\"")));
            }
        };
        let side = |name: &str| -> Result<Option<f64>, ImagingError> {
            if params.get(name).is_none() {
                return Ok(None);
            }
            let v = info.number(params, name)?;
            if v.fract() != 0.0 {
                return Err(bad(name, format!("{v} is not a whole number of pixels")));
            }
            Ok(Some(v))
        };
        let (gw, gh) = (side("width")?, side("height")?);
        if params.get("factor").is_some() && (gw.is_some() || gh.is_some()) {
            return Err(bad("factor", "give factor or width/height, not both".into()));
        }
        let (w, h) = (img.width() as f64, img.height() as f64);
        if img.width() == 0 || img.height() == 0 {
            return Err(ImagingError::InvalidImage(format!(
                "cannot zoom an empty {}×{} image",
                img.width(),
                img.height()
            )));
        }
        let (ow, oh) = match (gw, gh) {
            (Some(a), Some(b)) => (a, b),
            (Some(a), None) => (a, (h * a / w).round().max(1.0)),
            (None, Some(b)) => ((w * b / h).round().max(1.0), b),
            (None, None) => {
                let f = info.number(params, "factor")?;
                ((w * f).round().max(1.0), (h * f).round().max(1.0))
            }
        };
        if ow * oh > MAX_PIXELS as f64 {
            return Err(ImagingError::TooLarge {
                width: ow as u64,
                height: oh as u64,
                limit: MAX_PIXELS,
            });
        }
        let (ow, oh) = (ow as usize, oh as usize);
        Ok(match img {
            DynImage::U8(i) => DynImage::U8(zoom(i, ow, oh, method, run)?),
            DynImage::U16(i) => DynImage::U16(zoom(i, ow, oh, method, run)?),
        })
    }
}

fn zoom<T: Sample>(
    img: &Image<T>,
    ow: usize,
    oh: usize,
    method: Method,
    run: &Run,
) -> Result<Image<T>, ImagingError> {
    check_shape(img)?;
    Ok(match (img.channels, method) {
        (1, Method::Nearest) => nearest::<T, 1>(img, ow, oh, run),
        (3, Method::Nearest) => nearest::<T, 3>(img, ow, oh, run),
        (_, Method::Nearest) => nearest::<T, 4>(img, ow, oh, run),
        (1, Method::Bilinear) => bilinear::<T, 1>(img, ow, oh, run),
        (3, Method::Bilinear) => bilinear::<T, 3>(img, ow, oh, run),
        (_, Method::Bilinear) => bilinear::<T, 4>(img, ow, oh, run),
    })
}

/// Source index of each of `n_out` nearest-neighbour samples over `n_in`.
fn nearest_index(n_in: usize, n_out: usize) -> Vec<usize> {
    (0..n_out)
        .map(|d| {
            let i = ((2 * d as u128 + 1) * n_in as u128) / (2 * n_out as u128);
            (i as usize).min(n_in - 1)
        })
        .collect()
}

fn nearest<T: Sample, const C: usize>(img: &Image<T>, ow: usize, oh: usize, run: &Run) -> Image<T> {
    let xs = nearest_index(img.width, ow);
    let ys = nearest_index(img.height, oh);
    let mut out = Image::new(ow, oh, C);
    run.rows(&mut out.data, ow * C, |y, row| {
        let src = img.row(ys[y]);
        for (d, &sx) in row.chunks_exact_mut(C).zip(&xs) {
            d.copy_from_slice(&src[sx * C..sx * C + C]);
        }
    });
    out
}

/// A bilinear tap: the two source indices and the weight of the second.
#[derive(Debug, Clone, Copy)]
struct Tap {
    i0: usize,
    i1: usize,
    t: f32,
}

fn taps(n_in: usize, n_out: usize) -> Vec<Tap> {
    let s = n_in as f64 / n_out as f64;
    let last = (n_in - 1) as f64;
    (0..n_out)
        .map(|d| {
            let src = ((d as f64 + 0.5) * s - 0.5).clamp(0.0, last);
            let i0 = src.floor() as usize;
            Tap { i0, i1: (i0 + 1).min(n_in - 1), t: (src - i0 as f64) as f32 }
        })
        .collect()
}

fn bilinear<T: Sample, const C: usize>(
    img: &Image<T>,
    ow: usize,
    oh: usize,
    run: &Run,
) -> Image<T> {
    let xt = taps(img.width, ow);
    let yt = taps(img.height, oh);
    let max = T::MAX as f32;
    let mut out = Image::new(ow, oh, C);
    run.rows(&mut out.data, ow * C, |y, row| {
        let Tap { i0, i1, t } = yt[y];
        let (r0, r1) = (img.row(i0), img.row(i1));
        let mut vert = vec![0f32; r0.len()];
        for ((v, &a), &b) in vert.iter_mut().zip(r0).zip(r1) {
            let (a, b) = (a.to_u32() as f32, b.to_u32() as f32);
            *v = a + (b - a) * t;
        }
        for (d, tap) in row.chunks_exact_mut(C).zip(&xt) {
            let p0 = &vert[tap.i0 * C..tap.i0 * C + C];
            let p1 = &vert[tap.i1 * C..tap.i1 * C + C];
            for c in 0..C {
                let v = p0[c] + (p1[c] - p0[c]) * tap.t;
                d[c] = T::from_u32((v + 0.5).clamp(0.0, max) as u32);
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::invert::testkit::*;
    use super::*;

    #[test]
    fn doubling_known_pixels() {
        let g = gray8(2, 1, &[0, 100]);
        assert_eq!(run1(&Zoom, &g, &[]), gray8(4, 2, &[0, 25, 75, 100, 0, 25, 75, 100]));
        assert_eq!(
            run1(&Zoom, &g, &["method=nearest", "factor=2"]),
            gray8(4, 2, &[0, 0, 100, 100, 0, 0, 100, 100])
        );
        let g16 = gray16(2, 2, &[0, 100, 200, 300]);
        #[rustfmt::skip]
        let want = gray16(4, 4, &[
            0, 25, 75, 100,
            50, 75, 125, 150,
            150, 175, 225, 250,
            200, 225, 275, 300,
        ]);
        assert_eq!(run1(&Zoom, &g16, &["factor=2"]), want);
        let c = rgb8(2, 1, &[0, 0, 0, 200, 100, 40]);
        let row = [0, 0, 0, 50, 25, 10, 150, 75, 30, 200, 100, 40];
        assert_eq!(run1(&Zoom, &c, &["width=4", "height=1"]), rgb8(4, 1, &row));
    }

    #[test]
    fn reducing_known_pixels() {
        let data: Vec<u8> = (0..16).collect();
        let g = gray8(4, 4, &data);
        // Bilinear at ½ averages 2×2 blocks (x.5 rounds up); nearest takes columns/rows 1 and 3.
        assert_eq!(run1(&Zoom, &g, &["factor=0.5"]), gray8(2, 2, &[3, 5, 11, 13]));
        assert_eq!(
            run1(&Zoom, &g, &["factor=0.5", "method=nearest"]),
            gray8(2, 2, &[5, 7, 13, 15])
        );
        // Width only: the height follows the aspect ratio (round(1·2/3) = 1).
        let g = gray8(3, 1, &[10, 20, 30]);
        assert_eq!(run1(&Zoom, &g, &["width=2", "method=nearest"]), gray8(2, 1, &[10, 30]));
        assert_eq!(run1(&Zoom, &g, &["width=2"]), gray8(2, 1, &[13, 28]));
        assert_eq!(run1(&Zoom, &g, &["height=2", "method=nearest"]).width(), 6);
        let one = rgba8(1, 1, &[1, 2, 3, 4]);
        assert_eq!(run1(&Zoom, &one, &["factor=0.01"]), one);
        assert_eq!(run1(&Zoom, &one, &["factor=3"]), rgba8(3, 3, &[1, 2, 3, 4].repeat(9)));
    }

    #[test]
    fn bad_params() {
        let g = gray8(2, 2, &[0; 4]);
        let cases: &[&[&str]] = &[
            &["factor=0"],
            &["factor=33"],
            &["factor=-1"],
            &["factor=x"],
            &["factor=2", "width=3"],
            &["width=0"],
            &["width=2.5"],
            &["height=1e9"],
            &["method=cubic"],
        ];
        for c in cases {
            let e = Zoom.apply(&g, &p(c), &Run::single()).unwrap_err();
            assert!(matches!(e, ImagingError::BadParam { .. }), "{c:?}: {e}");
        }
        let e = Zoom.apply(&g, &p(&["scale=2"]), &Run::single()).unwrap_err();
        assert!(matches!(e, ImagingError::UnknownParam { .. }), "{e}");
        let e = Zoom.apply(&g, &p(&["width=1048576", "height=1048576"]), &Run::single());
        assert!(matches!(e, Err(ImagingError::TooLarge { .. })), "{e:?}");
        let big = gray8(600, 600, &vec![0; 360_000]);
        let e = Zoom.apply(&big, &p(&["factor=32"]), &Run::single());
        assert!(matches!(e, Err(ImagingError::TooLarge { .. })), "{e:?}");
        let e = Zoom.apply(&gray8(0, 4, &[]), &Params::new(), &Run::single());
        assert!(matches!(e, Err(ImagingError::InvalidImage(_))), "{e:?}");
    }

    fn method() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just("nearest"), Just("bilinear")]
    }

    proptest! {
        #[test]
        fn factor_one_is_identity(img in any_image(9), m in method()) {
            let m = format!("method={m}");
            prop_assert_eq!(run1(&Zoom, &img, &["factor=1", &m]), img.clone());
            let size = [format!("width={}", img.width()), format!("height={}", img.height())];
            prop_assert_eq!(run1(&Zoom, &img, &[&size[0], &size[1], &m]), img);
        }

        #[test]
        fn sizes_ranges_and_threads(
            img in any_image(7),
            f in 0.01f64..=6.0,
            m in method(),
        ) {
            let ps = p(&[&format!("factor={f}"), &format!("method={m}")]);
            let out = Zoom.apply(&img, &ps, &Run::single()).unwrap();
            let side = |n: usize| ((n as f64 * f).round() as usize).max(1);
            prop_assert_eq!((out.width(), out.height()), (side(img.width()), side(img.height())));
            prop_assert_eq!(out.channels(), img.channels());
            prop_assert_eq!(&Zoom.apply(&img, &ps, &Run::with_threads(3)).unwrap(), &out);
            // Every output sample lies within its channel's input range (nearest: is one).
            let c = img.channels();
            let (src, dst): (Vec<u32>, Vec<u32>) = match (&img, &out) {
                (DynImage::U8(a), DynImage::U8(b)) => (
                    a.data.iter().map(|&v| v as u32).collect(),
                    b.data.iter().map(|&v| v as u32).collect(),
                ),
                (DynImage::U16(a), DynImage::U16(b)) => (
                    a.data.iter().map(|&v| v as u32).collect(),
                    b.data.iter().map(|&v| v as u32).collect(),
                ),
                _ => unreachable!("sample type changed"),
            };
            for ch in 0..c {
                let s: Vec<u32> = src.iter().skip(ch).step_by(c).copied().collect();
                let (lo, hi) = (*s.iter().min().unwrap(), *s.iter().max().unwrap());
                for &v in dst.iter().skip(ch).step_by(c) {
                    prop_assert!(lo <= v && v <= hi);
                    if m == "nearest" {
                        prop_assert!(s.contains(&v));
                    }
                }
            }
        }

        #[test]
        fn junk_never_panics(img in any_image(3), key in prop_oneof![Just("factor"), Just("width"), Just("height"), Just("method")], v in junk_value()) {
            if let Err(e) = Zoom.apply(&img, &Params::new().with(key, &v), &Run::single()) {
                prop_assert!(matches!(e, ImagingError::BadParam { .. } | ImagingError::TooLarge { .. }), "{}", e);
            }
        }
    }
}
