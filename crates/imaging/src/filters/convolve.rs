//! Convolution with a small kernel: the [`Convolution`] filter type that kernels loaded from
//! definition files (kind `"kernel"`, see the registry) are made of, and the built-in `convolve`
//! filter that takes its kernel as a parameter.
//!
//! **Definition.** For a kernel of `size_w × size_h` weights `k[j][i]` (both sides odd, at most
//! [`MAX_SIDE`]), centre `(cx, cy) = (size_w / 2, size_h / 2)`, and each colour channel:
//!
//! ```text
//! s        = Σ_j Σ_i k[j][i] · in(clamp(x + i − cx), clamp(y + j − cy))
//! out(x,y) = clamp(floor(s / divisor + offset' + 0.5), 0, MAX)
//! ```
//!
//! - It is a correlation (the kernel is not flipped), as in OpenCV's `filter2D`, GIMP's
//!   convolution matrix and xv; for symmetric kernels the two are the same. `k[0]` is the top
//!   row: a kernel whose only 1 is at the right of the middle row copies each pixel's right
//!   neighbour.
//! - Border: clamp-to-edge — coordinates outside the image are clamped to the nearest edge
//!   pixel (replicated border), so a constant image through a kernel whose weights sum to the
//!   divisor stays constant (exactly so while the partial sums stay below 2^24, as with small
//!   integer weights; huge weights round in `f32`).
//! - `divisor`: given, or the sum of the weights, or 1 when that sum is 0.
//! - `offset` is given in 8-bit units: `offset' = offset` on 8-bit images and
//!   `offset · 65535 / 255` on 16-bit ones, so `offset = 128` is mid-grey for both.
//! - The sum is accumulated in `f32` in a fixed order (kernel rows, then columns), so results
//!   do not depend on the number of threads. Values are rounded half up and clamped.
//!
//! **Pixel types.** 8- and 16-bit gray, RGB and RGBA: each colour channel separately; alpha
//! copied unchanged.
//!
//! **The built-in `convolve` filter** takes `kernel` — rows separated by `;`, weights by `,`
//! or spaces, e.g. `"0,-1,0; -1,5,-1; 0,-1,0"` (default: the 3×3 identity) — `divisor`
//! (−1e6..=1e6, default 0 = automatic as above) and `offset` (−65535..=65535, default 0).
//! Loaded kernels take no parameters.
//!
//! Speed: each output row converts the needed source rows to an edge-padded `f32` row once per
//! kernel row, then adds `weight × shifted row` for each non-zero weight — whole-row
//! multiply-adds that vectorise. Rows run in parallel through [`Run::rows`].

use std::sync::Arc;

use super::invert::check_shape;
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, Output, ParamInfo, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Largest kernel side.
pub const MAX_SIDE: usize = 15;

/// Largest weight magnitude accepted (keeps sums finite).
pub const MAX_WEIGHT: f64 = 1e6;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Convolve));
}

/// A filter that convolves with a fixed kernel (kind `"kernel"`).
#[derive(Debug, Clone, PartialEq)]
pub struct Convolution {
    pub name: String,
    pub summary: String,
    /// `size_h` rows of `size_w` weights, top row first.
    pub kernel: Vec<f32>,
    pub size_w: usize,
    pub size_h: usize,
    /// Non-zero.
    pub divisor: f32,
    /// In 8-bit units (scaled for 16-bit images).
    pub offset: f32,
    /// Definition file it came from.
    pub source: Option<String>,
}

impl Convolution {
    /// Check and build a kernel from rows of weights. The error says what is wrong with it.
    pub fn new(
        name: &str,
        summary: &str,
        weights: &[Vec<f64>],
        divisor: Option<f64>,
        offset: f64,
        source: Option<String>,
    ) -> Result<Self, String> {
        let size_h = weights.len();
        let size_w = weights.first().map_or(0, Vec::len);
        // Rows of one length first: a ragged kernel has no size to speak of.
        if let Some((j, row)) = weights.iter().enumerate().find(|(_, r)| r.len() != size_w) {
            return Err(format!(
                "kernel row {} has {} weights, row 1 has {size_w}",
                j + 1,
                row.len()
            ));
        }
        let side_ok = |n: usize| n % 2 == 1 && n <= MAX_SIDE;
        if !side_ok(size_h) || !side_ok(size_w) {
            return Err(format!(
                "kernel is {size_w}×{size_h}; both sides must be odd and at most {MAX_SIDE}"
            ));
        }
        if let Some(w) = weights.iter().flatten().find(|w| !w.is_finite() || w.abs() > MAX_WEIGHT) {
            return Err(format!("weight {w} is not a number within ±{MAX_WEIGHT}"));
        }
        let divisor = match divisor {
            Some(d) if d.is_finite() && d != 0.0 && d.abs() <= MAX_WEIGHT * 1e3 => d,
            Some(d) => return Err(format!("divisor {d} must be non-zero and finite")),
            None => {
                let sum: f64 = weights.iter().flatten().sum();
                if sum == 0.0 { 1.0 } else { sum }
            }
        };
        if !offset.is_finite() || offset.abs() > 65535.0 {
            return Err(format!("offset {offset} is not within ±65535"));
        }
        Ok(Self {
            name: name.into(),
            summary: summary.into(),
            kernel: weights.iter().flatten().map(|&w| w as f32).collect(),
            size_w,
            size_h,
            divisor: divisor as f32,
            offset: offset as f32,
            source,
        })
    }

    /// Values where the kernel keeps them (its weights sum to the divisor, no offset: a
    /// smoothing or a sharpening), grey levels otherwise (differences, reliefs, gains).
    pub fn output(&self) -> Output {
        let gain = self.kernel.iter().map(|&k| f64::from(k)).sum::<f64>() / f64::from(self.divisor);
        if self.offset == 0.0 && (gain - 1.0).abs() < 1e-6 {
            Output::Values
        } else {
            Output::GreyLevels
        }
    }

    /// Apply to an image of either depth.
    pub fn convolve(&self, img: &DynImage, run: &Run) -> Result<DynImage, ImagingError> {
        Ok(match img {
            DynImage::U8(i) => DynImage::U8(self.convolve_image(i, run)?),
            DynImage::U16(i) => DynImage::U16(self.convolve_image(i, run)?),
        })
    }

    fn convolve_image<T: Sample>(
        &self,
        img: &Image<T>,
        run: &Run,
    ) -> Result<Image<T>, ImagingError> {
        check_shape(img)?;
        if self.kernel.len() != self.size_w * self.size_h || self.size_w == 0 || self.size_h == 0 {
            return Err(ImagingError::BadParam {
                filter: self.name.clone(),
                param: "kernel".into(),
                reason: "weights do not fill size_w × size_h".into(),
            });
        }
        let (w, h, c) = (img.width, img.height, img.channels);
        let rl = w * c;
        let (kw, kh) = (self.size_w, self.size_h);
        let (cx, cy) = (kw / 2, kh / 2);
        let max = T::MAX as f32;
        let offset = self.offset * max / 255.0 + 0.5;
        let colour = img.color_channels();
        let mut out = Image::new(w, h, c);
        run.rows(&mut out.data, rl, |y, orow| {
            let mut acc = vec![0f32; rl];
            let mut pad = vec![0f32; (w + 2 * cx) * c];
            for (j, weights) in self.kernel.chunks_exact(kw).enumerate() {
                if weights.iter().all(|&k| k == 0.0) {
                    continue;
                }
                let sy = (y + j).saturating_sub(cy).min(h - 1);
                let src = img.row(sy);
                let (left, rest) = pad.split_at_mut(cx * c);
                let (mid, right) = rest.split_at_mut(rl);
                for px in left.chunks_exact_mut(c) {
                    px.iter_mut().zip(&src[..c]).for_each(|(d, s)| *d = s.to_u32() as f32);
                }
                mid.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_u32() as f32);
                for px in right.chunks_exact_mut(c) {
                    px.iter_mut().zip(&src[rl - c..]).for_each(|(d, s)| *d = s.to_u32() as f32);
                }
                for (i, &k) in weights.iter().enumerate() {
                    if k != 0.0 {
                        for (a, &p) in acc.iter_mut().zip(&pad[i * c..i * c + rl]) {
                            *a += k * p;
                        }
                    }
                }
            }
            let src = img.row(y);
            for (o, &s) in orow.iter_mut().zip(&acc) {
                *o = T::from_u32((s / self.divisor + offset).floor().clamp(0.0, max) as u32);
            }
            if colour != c {
                for (o, s) in orow.chunks_exact_mut(c).zip(src.chunks_exact(c)) {
                    o[colour..].copy_from_slice(&s[colour..]);
                }
            }
        });
        Ok(out)
    }
}

impl Filter for Convolution {
    fn info(&self) -> FilterInfo {
        FilterInfo {
            name: self.name.clone(),
            summary: self.summary.clone(),
            params: Vec::new(),
            kind: "kernel".into(),
            source: self.source.clone(),
        }
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        self.info().check_known(params)?;
        self.convolve(img, run)
    }

    fn output(&self, _params: &Params) -> Output {
        Convolution::output(self)
    }
}

/// The built-in `convolve` filter: a kernel given as a parameter.
pub struct Convolve;

/// Parse kernel text: rows separated by `;`, weights by `,` and/or whitespace.
pub fn parse_kernel(text: &str) -> Result<Vec<Vec<f64>>, String> {
    text.split(';')
        .map(|row| {
            row.split(|ch: char| ch == ',' || ch.is_whitespace())
                .filter(|t| !t.is_empty())
                .map(|t| t.parse::<f64>().map_err(|_| format!("{t:?} is not a number")))
                .collect()
        })
        .collect()
}

impl Filter for Convolve {
    fn info(&self) -> FilterInfo {
        FilterInfo {
            name: "convolve".into(),
            summary: "convolve with a kernel given as text (clamp-to-edge border)".into(),
            params: vec![
                ParamInfo::text(
                    "kernel",
                    "0,0,0; 0,1,0; 0,0,0",
                    "rows separated by ';', weights by ',' or spaces; odd sides up to 15",
                ),
                ParamInfo::number("divisor", 0.0, -1e6, 1e6, "0 = sum of weights (1 if that is 0)"),
                ParamInfo::number(
                    "offset",
                    0.0,
                    -65535.0,
                    65535.0,
                    "added after dividing, 8-bit units",
                ),
            ],
            kind: "builtin".into(),
            source: None,
        }
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        self.kernel(params)?.convolve(img, run)
    }

    /// As its kernel's (values where a bad kernel will be refused by `apply`).
    fn output(&self, params: &Params) -> Output {
        self.kernel(params).map_or(Output::Values, |k| k.output())
    }
}

impl Convolve {
    /// The kernel `params` give, checked.
    fn kernel(&self, params: &Params) -> Result<Convolution, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let divisor = info.number(params, "divisor")?;
        let offset = info.number(params, "offset")?;
        let bad = |param: &str, reason: String| ImagingError::BadParam {
            filter: info.name.clone(),
            param: param.into(),
            reason,
        };
        let weights = parse_kernel(info.text(params, "kernel")).map_err(|r| bad("kernel", r))?;
        let divisor = (divisor != 0.0).then_some(divisor);
        Convolution::new(&info.name, &info.summary, &weights, divisor, offset, None)
            .map_err(|r| bad("kernel", r))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::invert::testkit::*;
    use super::*;

    fn kernel(rows: &[&[f64]], divisor: Option<f64>, offset: f64) -> Convolution {
        let rows: Vec<Vec<f64>> = rows.iter().map(|r| r.to_vec()).collect();
        Convolution::new("k", "", &rows, divisor, offset, None).unwrap()
    }

    #[test]
    fn known_pixels_gray8() {
        // [1 2 1] / 4 with the left edge replicated: (0+0+40)/4, (0+80+80)/4, ...
        let k = kernel(&[&[1.0, 2.0, 1.0]], None, 0.0);
        let g = gray8(4, 1, &[0, 40, 80, 120]);
        assert_eq!(run1(&k, &g, &[]), gray8(4, 1, &[10, 40, 80, 110]));
        // Sharpen: a bright centre on a flat background, clamped to 255.
        let sharpen =
            kernel(&[&[0.0, -1.0, 0.0], &[-1.0, 5.0, -1.0], &[0.0, -1.0, 0.0]], None, 0.0);
        let g = gray8(3, 3, &[50, 50, 50, 50, 100, 50, 50, 50, 50]);
        assert_eq!(run1(&sharpen, &g, &[]), gray8(3, 3, &[50, 0, 50, 0, 255, 0, 50, 0, 50]));
        // Offset and a negative weight: v(x+1) − v(x−1) + 128.
        let d = kernel(&[&[-1.0, 0.0, 1.0]], Some(1.0), 128.0);
        assert_eq!(run1(&d, &gray8(3, 1, &[0, 10, 30]), &[]), gray8(3, 1, &[138, 158, 148]));
        // x.5 rounds up: (1 + 2)/2.
        let half = kernel(&[&[1.0, 1.0, 0.0]], None, 0.0);
        assert_eq!(run1(&half, &gray8(2, 1, &[1, 2]), &[]), gray8(2, 1, &[1, 2]));
        assert_eq!(run1(&half, &gray8(3, 1, &[1, 2, 5]), &[]), gray8(3, 1, &[1, 2, 4]));
    }

    #[test]
    fn orientation_is_correlation() {
        let right = kernel(&[&[0.0, 0.0, 1.0]], None, 0.0);
        assert_eq!(run1(&right, &gray8(3, 1, &[1, 2, 3]), &[]), gray8(3, 1, &[2, 3, 3]));
        let below = kernel(&[&[0.0], &[0.0], &[1.0]], None, 0.0);
        assert_eq!(run1(&below, &gray8(1, 3, &[1, 2, 3]), &[]), gray8(1, 3, &[2, 3, 3]));
        let up_left = kernel(&[&[1.0, 0.0, 0.0], &[0.0; 3], &[0.0; 3]], None, 0.0);
        let g = gray8(2, 2, &[1, 2, 3, 4]);
        assert_eq!(run1(&up_left, &g, &[]), gray8(2, 2, &[1, 1, 1, 1]));
    }

    #[test]
    fn known_pixels_gray16_and_rgb() {
        let sharpen =
            kernel(&[&[0.0, -1.0, 0.0], &[-1.0, 5.0, -1.0], &[0.0, -1.0, 0.0]], None, 0.0);
        let g = gray16(3, 3, &[50, 50, 50, 50, 100, 50, 50, 50, 50]);
        assert_eq!(run1(&sharpen, &g, &[]), gray16(3, 3, &[50, 0, 50, 0, 300, 0, 50, 0, 50]));
        // Offset 128 in 8-bit units is 32896 on 16-bit images.
        let d = kernel(&[&[-1.0, 0.0, 1.0]], Some(1.0), 128.0);
        assert_eq!(
            run1(&d, &gray16(3, 1, &[0, 10, 30]), &[]),
            gray16(3, 1, &[32906, 32926, 32916])
        );
        let k = kernel(&[&[1.0, 2.0, 1.0]], None, 0.0);
        let c = rgb8(2, 1, &[0, 100, 255, 40, 0, 255]);
        // x0: (3·p0 + p1)/4, x1: (p0 + 3·p1)/4 per channel.
        assert_eq!(run1(&k, &c, &[]), rgb8(2, 1, &[10, 75, 255, 30, 25, 255]));
        let a = rgba8(2, 1, &[0, 100, 255, 7, 40, 0, 255, 9]);
        assert_eq!(run1(&k, &a, &[]), rgba8(2, 1, &[10, 75, 255, 7, 30, 25, 255, 9]));
    }

    #[test]
    fn builtin_convolve_parses_its_kernel() {
        let g = gray8(4, 1, &[0, 40, 80, 120]);
        assert_eq!(run1(&Convolve, &g, &["kernel=1 2 1"]), gray8(4, 1, &[10, 40, 80, 110]));
        assert_eq!(
            run1(&Convolve, &g, &["kernel=1,2,1", "divisor=2"]),
            gray8(4, 1, &[20, 80, 160, 220])
        );
        assert_eq!(run1(&Convolve, &g, &[]), g);
        assert_eq!(
            run1(&Convolve, &gray8(3, 1, &[0, 10, 30]), &["kernel=-1,0,1", "offset=128"]),
            gray8(3, 1, &[138, 158, 148])
        );
        assert_eq!(parse_kernel("1, 2;3 4").unwrap(), vec![vec![1.0, 2.0], vec![3.0, 4.0]]);
        for bad in ["", "1 2", "1;2", "1,2,3;4,5", "x", "1,NaN,1", "1,inf,1", "1e7", "1;;1"] {
            let e =
                Convolve.apply(&g, &p(&[&format!("kernel={bad}")]), &Run::single()).unwrap_err();
            assert!(matches!(e, ImagingError::BadParam { .. }), "{bad:?}: {e}");
        }
        let big = vec!["1"; 17].join(",");
        assert!(Convolve.apply(&g, &p(&[&format!("kernel={big}")]), &Run::single()).is_err());
        let ok15 = vec!["1"; 15].join(",");
        assert!(Convolve.apply(&g, &p(&[&format!("kernel={ok15}")]), &Run::single()).is_ok());
        let e = Convolve.apply(&g, &p(&["size=3"]), &Run::single()).unwrap_err();
        assert!(matches!(e, ImagingError::UnknownParam { .. }), "{e}");
    }

    #[test]
    fn construction_errors() {
        let new = |rows: &[&[f64]], d| {
            let rows: Vec<Vec<f64>> = rows.iter().map(|r| r.to_vec()).collect();
            Convolution::new("k", "", &rows, d, 0.0, None)
        };
        assert!(new(&[], None).is_err());
        assert!(new(&[&[]], None).is_err());
        assert!(new(&[&[1.0, 1.0]], None).is_err());
        assert!(new(&[&[1.0], &[1.0]], None).is_err());
        assert!(new(&[&[1.0, 1.0, 1.0], &[1.0], &[1.0, 1.0, 1.0]], None).is_err());
        // Ragged rows are said to be that, whatever their count.
        let e = new(&[&[1.0, 2.0], &[3.0]], None).unwrap_err();
        assert_eq!(e, "kernel row 2 has 1 weights, row 1 has 2");
        assert!(new(&[&[1.0]], Some(0.0)).is_err());
        assert!(new(&[&[f64::NAN]], None).is_err());
        // Weights summing to 0 divide by 1.
        assert_eq!(new(&[&[-1.0, 0.0, 1.0]], None).unwrap().divisor, 1.0);
        assert_eq!(new(&[&[1.0, 2.0, 1.0]], None).unwrap().divisor, 4.0);
        assert!(Convolution::new("k", "", &[vec![1.0]], None, 1e9, None).is_err());
        // A hand-built kernel whose weights do not match its size is an error, not a panic.
        let k = Convolution { kernel: vec![1.0; 4], ..kernel(&[&[1.0]], None, 0.0) };
        assert!(k.apply(&gray8(1, 1, &[1]), &Params::new(), &Run::single()).is_err());
    }

    fn any_kernel() -> impl Strategy<Value = Vec<Vec<f64>>> {
        // Small integer weights keep every f32 partial sum exact (|s| < 2^24 for 16-bit input).
        (0usize..=2, 0usize..=2).prop_flat_map(|(a, b)| {
            let (w, h) = (2 * a + 1, 2 * b + 1);
            proptest::collection::vec(proptest::collection::vec(-3i32..=3, w), h).prop_map(|rows| {
                rows.into_iter().map(|r| r.into_iter().map(f64::from).collect()).collect()
            })
        })
    }

    proptest! {
        #[test]
        fn identity_kernel_and_constant_images(img in any_image(8), k in any_kernel()) {
            let id = kernel(&[&[0.0; 3], &[0.0, 1.0, 0.0], &[0.0; 3]], None, 0.0);
            prop_assert_eq!(run1(&id, &img, &[]), img.clone());
            // A constant image through a kernel with automatic divisor stays constant when the
            // weights do not sum to 0.
            let k = Convolution::new("k", "", &k, None, 0.0, None).unwrap();
            let flat = match &img {
                DynImage::U8(i) => DynImage::U8(Image { data: vec![i.data[0]; i.data.len()], ..i.clone() }),
                DynImage::U16(i) => DynImage::U16(Image { data: vec![i.data[0]; i.data.len()], ..i.clone() }),
            };
            let sum: f32 = k.kernel.iter().sum();
            if sum != 0.0 {
                prop_assert_eq!(run1(&k, &flat, &[]), flat);
            }
        }

        #[test]
        fn threads_agree(img in any_image(24), k in any_kernel(), off in -200i32..200) {
            let k = Convolution::new("k", "", &k, None, off as f64, None).unwrap();
            let one = k.apply(&img, &Params::new(), &Run::single()).unwrap();
            prop_assert_eq!(k.apply(&img, &Params::new(), &Run::with_threads(3)).unwrap(), one);
        }

        #[test]
        fn junk_never_panics(img in any_image(3), key in prop_oneof![Just("kernel"), Just("divisor"), Just("offset")], v in junk_value()) {
            if let Err(e) = Convolve.apply(&img, &Params::new().with(key, &v), &Run::single()) {
                prop_assert!(matches!(e, ImagingError::BadParam { .. }), "{}", e);
            }
        }
    }
}
