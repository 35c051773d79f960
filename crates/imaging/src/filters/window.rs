//! `window`: DICOM modality rescale followed by the linear VOI window (window/level).
//!
//! **Definition.** For a stored sample `v`:
//!
//! 1. Modality rescale (DICOM PS3.3 C.11.1.1.2): `x = v · slope + intercept`.
//! 2. The VOI LUT function `LINEAR` of DICOM PS3.3 C.11.2.1.2.1, with `c` = `center`,
//!    `w` = `width`, output range `0..=MAX` (255 for 8-bit, 65535 for 16-bit images):
//!
//! ```text
//! if      x <= c − 0.5 − (w − 1)/2   then y = 0
//! else if x >  c − 0.5 + (w − 1)/2   then y = MAX
//! else                                     y = ((x − (c − 0.5)) / (w − 1) + 0.5) · MAX
//! ```
//!
//!    `y` is rounded half up (`floor(y + 0.5)`) and stored in the input's sample type. DICOM
//!    requires `w ≥ 1` for `LINEAR`; a `width` in `(0, 1)` is used as 1, which makes the window a
//!    hard threshold at `c − 0.5` (below or at → 0, above → MAX).
//!
//! **Parameters.**
//!
//! - `center` (−1e9..=1e9) and `width` (> 0, at most 2e9), in rescaled units (for CT:
//!   Hounsfield units, e.g. `center=40 width=400` for soft tissue). When either is missing it
//!   comes from the image: with `lo`, `hi` the smallest and largest rescaled colour sample,
//!   `width = hi − lo + 1` and `center = (lo + hi)/2 + 0.5`, which by the formula above maps
//!   `lo → 0` and `hi → MAX` linearly (a constant image becomes all 0).
//! - `slope` (> 0, at most 1e6, default 1) and `intercept` (−1e9..=1e9, default 0): the
//!   Rescale Slope / Intercept. A non-positive slope is refused: it would turn the window into a
//!   negative, which is what `invert` is for; so the output is a monotonic non-decreasing
//!   function of the stored value.
//!
//! **Pixel types.** Gray: as above. RGB: the same function (one window, computed over all colour
//! channels) applied to each colour channel. RGBA: alpha copied unchanged. 8- and 16-bit.
//!
//! Speed: the function is tabulated once per call for every possible stored value (256 or 65536
//! entries); pixels are then a table lookup per sample, rows in parallel through [`Run::rows`].

use std::sync::Arc;

use super::invert::check_shape;
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, Output, ParamInfo, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Window));
}

/// The `window` filter.
pub struct Window;

/// A resolved window: rescale then the DICOM `LINEAR` function.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Linear {
    pub slope: f64,
    pub intercept: f64,
    pub center: f64,
    /// At least 1.
    pub width: f64,
}

impl Linear {
    /// `y` for stored value `v`, in `0..=max`, rounded half up.
    pub fn map(&self, v: f64, max: f64) -> f64 {
        let x = v * self.slope + self.intercept;
        let c = self.center - 0.5;
        let half = (self.width - 1.0) / 2.0;
        let y = if x <= c - half {
            0.0
        } else if x > c + half {
            max
        } else {
            ((x - c) / (self.width - 1.0) + 0.5) * max
        };
        (y + 0.5).floor().clamp(0.0, max)
    }
}

impl Filter for Window {
    fn info(&self) -> FilterInfo {
        let auto = |name: &str, range: (f64, f64), help: &str| ParamInfo {
            name: name.into(),
            default: "auto".into(),
            range: Some(range),
            help: help.into(),
        };
        FilterInfo {
            name: "window".into(),
            summary: "window/level (DICOM LINEAR VOI) after rescale slope/intercept".into(),
            params: vec![
                auto(
                    "center",
                    (-1e9, 1e9),
                    "window centre (level), rescaled units; auto: mid-range",
                ),
                auto("width", (0.0, 2e9), "window width (> 0), rescaled units; auto: full range"),
                ParamInfo::number("slope", 1.0, 0.0, 1e6, "rescale slope (> 0)"),
                ParamInfo::number("intercept", 0.0, -1e9, 1e9, "rescale intercept"),
            ],
            kind: "builtin".into(),
            source: None,
        }
    }

    /// Grey levels for display, no longer the input's values.
    fn output(&self, _params: &Params) -> Output {
        Output::GreyLevels
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let positive = |name: &str| -> Result<f64, ImagingError> {
            let v = info.number(params, name)?;
            if v <= 0.0 {
                return Err(ImagingError::BadParam {
                    filter: info.name.clone(),
                    param: name.into(),
                    reason: format!("{v} is not > 0"),
                });
            }
            Ok(v)
        };
        let slope = positive("slope")?;
        let intercept = info.number(params, "intercept")?;
        let center = if params.get("center").is_some() {
            Some(info.number(params, "center")?)
        } else {
            None
        };
        let width = if params.get("width").is_some() { Some(positive("width")?) } else { None };
        let given = Given { slope, intercept, center, width };
        Ok(match img {
            DynImage::U8(i) => DynImage::U8(window(i, given, run)?),
            DynImage::U16(i) => DynImage::U16(window(i, given, run)?),
        })
    }
}

/// Parameters as given (centre and width may be missing).
#[derive(Debug, Clone, Copy)]
struct Given {
    slope: f64,
    intercept: f64,
    center: Option<f64>,
    width: Option<f64>,
}

fn window<T: Sample>(img: &Image<T>, g: Given, run: &Run) -> Result<Image<T>, ImagingError> {
    check_shape(img)?;
    let (center, width) = match (g.center, g.width) {
        (Some(c), Some(w)) => (c, w),
        _ => {
            // The slope is positive, so the rescaled extremes are those of the stored samples.
            let (lo, hi) = color_range(img).unwrap_or((0, T::MAX));
            let lo = lo as f64 * g.slope + g.intercept;
            let hi = hi as f64 * g.slope + g.intercept;
            (g.center.unwrap_or((lo + hi) / 2.0 + 0.5), g.width.unwrap_or(hi - lo + 1.0))
        }
    };
    let lin = Linear { slope: g.slope, intercept: g.intercept, center, width: width.max(1.0) };
    let max = T::MAX as f64;
    let lut: Vec<T> =
        (0..=T::MAX).map(|v| T::from_u32(lin.map(v as f64, max) as u32)).collect::<Vec<_>>();
    let mut out = Image::new(img.width, img.height, img.channels);
    let alpha = img.has_alpha();
    run.rows(&mut out.data, img.width * img.channels, |y, row| {
        let src = img.row(y);
        for (o, &v) in row.iter_mut().zip(src) {
            *o = lut[v.to_u32() as usize];
        }
        if alpha {
            for (o, s) in row.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                o[3] = s[3];
            }
        }
    });
    Ok(out)
}

/// Smallest and largest colour sample (alpha excluded), or `None` for an empty image.
fn color_range<T: Sample>(img: &Image<T>) -> Option<(u32, u32)> {
    let cc = img.color_channels();
    let mut lo = u32::MAX;
    let mut hi = 0;
    for px in img.data.chunks_exact(img.channels) {
        for &v in &px[..cc] {
            let v = v.to_u32();
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    (lo <= hi).then_some((lo, hi))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::invert::testkit::*;
    use super::*;

    #[test]
    fn known_pixels_gray8() {
        // c = 60.5, w = 101: x ≤ 10 → 0, x > 110 → 255, else ((x − 60)/100 + 0.5)·255.
        let g = gray8(6, 1, &[0, 10, 35, 60, 110, 160]);
        assert_eq!(
            run1(&Window, &g, &["center=60.5", "width=101"]),
            gray8(6, 1, &[0, 0, 64, 128, 255, 255])
        );
        // Width below 1 acts as 1: a threshold at c − 0.5 = 60.
        assert_eq!(
            run1(&Window, &g, &["center=60.5", "width=0.25"]),
            gray8(6, 1, &[0, 0, 0, 0, 255, 255])
        );
    }

    #[test]
    fn known_pixels_gray16_with_rescale() {
        // x = 2v − 100; c = 100.5, w = 201: x ≤ 0 → 0, x > 200 → MAX.
        let g = gray16(6, 1, &[0, 50, 75, 100, 150, 200]);
        assert_eq!(
            run1(&Window, &g, &["center=100.5", "width=201", "slope=2", "intercept=-100"]),
            gray16(6, 1, &[0, 0, 16384, 32768, 65535, 65535])
        );
        // CT soft tissue: v − 1024 HU, centre 40, width 400 → lower edge −160, upper 239.
        let ct = gray16(4, 1, &[0, 864, 1064, 1300]);
        let y = |x: f64| (((x - 39.5) / 399.0 + 0.5) * 65535.0 + 0.5).floor() as u16;
        assert_eq!(
            run1(&Window, &ct, &["center=40", "width=400", "intercept=-1024"]),
            gray16(4, 1, &[0, 0, y(40.0), 65535])
        );
        assert_eq!(y(40.0), 32850);
    }

    #[test]
    fn auto_window_is_a_stretch() {
        assert_eq!(run1(&Window, &gray8(3, 1, &[10, 20, 30]), &[]), gray8(3, 1, &[0, 128, 255]));
        assert_eq!(
            run1(&Window, &gray16(3, 1, &[1000, 1500, 2000]), &["intercept=-1024"]),
            gray16(3, 1, &[0, 32768, 65535])
        );
        // One window for all colour channels; alpha is kept and does not count.
        let c = rgba8(2, 1, &[10, 20, 30, 0, 30, 20, 10, 255]);
        assert_eq!(run1(&Window, &c, &[]), rgba8(2, 1, &[0, 128, 255, 0, 255, 128, 0, 255]));
        let c = rgb8(1, 1, &[10, 20, 30]);
        assert_eq!(run1(&Window, &c, &[]), rgb8(1, 1, &[0, 128, 255]));
        // Centre given, width from the image (21) and the other way round.
        assert_eq!(
            run1(&Window, &gray8(3, 1, &[10, 20, 30]), &["center=30.5"]),
            gray8(3, 1, &[0, 0, 128])
        );
        assert_eq!(
            run1(&Window, &gray8(3, 1, &[10, 20, 30]), &["width=11"]),
            gray8(3, 1, &[0, 128, 255])
        );
        // A constant image becomes 0.
        assert_eq!(run1(&Window, &gray8(2, 1, &[7, 7]), &[]), gray8(2, 1, &[0, 0]));
        assert_eq!(run1(&Window, &gray8(1, 1, &[200]), &[]), gray8(1, 1, &[0]));
    }

    #[test]
    fn bad_params() {
        let g = gray8(1, 1, &[0]);
        for (k, v) in [
            ("width", "0"),
            ("width", "-5"),
            ("slope", "0"),
            ("slope", "-1"),
            ("center", "1e10"),
            ("center", "x"),
            ("intercept", "NaN"),
        ] {
            let e = Window.apply(&g, &Params::new().with(k, v), &Run::single()).unwrap_err();
            assert!(matches!(e, ImagingError::BadParam { .. }), "{k}={v}: {e}");
        }
        let e = Window.apply(&g, &p(&["level=3"]), &Run::single()).unwrap_err();
        assert!(matches!(e, ImagingError::UnknownParam { .. }), "{e}");
    }

    fn window_params() -> impl Strategy<Value = Vec<String>> {
        (
            proptest::option::of(-70000.0f64..70000.0),
            proptest::option::of(0.001f64..140000.0),
            proptest::option::of(0.001f64..10.0),
            proptest::option::of(-5000.0f64..5000.0),
        )
            .prop_map(|(c, w, s, i)| {
                let mut v = Vec::new();
                for (k, x) in [("center", c), ("width", w), ("slope", s), ("intercept", i)] {
                    if let Some(x) = x {
                        v.push(format!("{k}={x}"));
                    }
                }
                v
            })
    }

    proptest! {
        #[test]
        fn monotonic_in_the_input(ps in window_params(), wide in any::<bool>()) {
            let ps: Vec<&str> = ps.iter().map(String::as_str).collect();
            // A ramp over every stored value (a sample of them for 16 bits) plus the extremes.
            if wide {
                let ramp: Vec<u16> = (0..=65535u32).step_by(97).map(|v| v as u16).chain([65535]).collect();
                let out = run1(&Window, &gray16(ramp.len(), 1, &ramp), &ps);
                let DynImage::U16(o) = out else { panic!() };
                prop_assert!(o.data.windows(2).all(|w| w[0] <= w[1]));
            } else {
                let ramp: Vec<u8> = (0..=255).collect();
                let out = run1(&Window, &gray8(256, 1, &ramp), &ps);
                let DynImage::U8(o) = out else { panic!() };
                prop_assert!(o.data.windows(2).all(|w| w[0] <= w[1]));
            }
        }

        #[test]
        fn pixelwise_and_threads_agree(img in any_image(8), ps in window_params()) {
            let ps: Vec<&str> = ps.iter().map(String::as_str).collect();
            let one = run1(&Window, &img, &ps);
            prop_assert_eq!(&Window.apply(&img, &p(&ps), &Run::with_threads(3)).unwrap(), &one);
            prop_assert_eq!((one.width(), one.height(), one.channels()), (img.width(), img.height(), img.channels()));
            if let (DynImage::U8(a), DynImage::U8(b)) = (&img, &one) && a.channels == 4 {
                for (s, o) in a.data.chunks(4).zip(b.data.chunks(4)) {
                    prop_assert_eq!(s[3], o[3]);
                }
            }
        }

        #[test]
        fn junk_never_panics(img in any_image(3), key in prop_oneof![Just("center"), Just("width"), Just("slope"), Just("intercept")], v in junk_value()) {
            if let Err(e) = Window.apply(&img, &Params::new().with(key, &v), &Run::single()) {
                prop_assert!(matches!(e, ImagingError::BadParam { .. }), "{}", e);
            }
        }
    }
}
