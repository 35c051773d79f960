//! `invert`: the negative of an image.
//!
//! Definition: every colour sample `v` becomes `MAX − v`, where `MAX` is 255 for 8-bit and
//! 65535 for 16-bit images. Gray, RGB and RGBA images of either depth are accepted; in RGBA
//! images the alpha sample is copied unchanged. Output has the same size, depth and channels.
//! No parameters. Inverting twice gives back the original image.
//!
//! The inner loop is a branch-free subtraction over whole rows (vectorised by the compiler);
//! rows are processed in parallel bands by [`Run::rows`].
//!
//! This module also holds what the radiology filters (window, invert, zoom, orient, unsharp,
//! convolve) share: `check_shape`, which rejects inconsistent images before any indexing, and,
//! for tests, `testkit` with small-image helpers and proptest strategies.

use std::sync::Arc;

use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, Output, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Invert));
}

/// The `invert` filter.
pub struct Invert;

impl Filter for Invert {
    fn info(&self) -> FilterInfo {
        FilterInfo {
            name: "invert".into(),
            summary: "negative: MAX − v per colour channel, alpha kept".into(),
            params: Vec::new(),
            kind: "builtin".into(),
            source: None,
        }
    }

    /// `MAX − v` keeps the scale, not the meaning (no longer HU).
    fn output(&self, _params: &Params) -> Output {
        Output::Scale
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        self.info().check_known(params)?;
        Ok(match img {
            DynImage::U8(i) => DynImage::U8(invert(i, run)?),
            DynImage::U16(i) => DynImage::U16(invert(i, run)?),
        })
    }
}

fn invert<T: Sample>(img: &Image<T>, run: &Run) -> Result<Image<T>, ImagingError> {
    check_shape(img)?;
    let mut out = Image::new(img.width, img.height, img.channels);
    let row_len = img.width * img.channels;
    let alpha = img.has_alpha();
    run.rows(&mut out.data, row_len, |y, row| {
        let src = img.row(y);
        for (o, &v) in row.iter_mut().zip(src) {
            *o = T::from_u32(T::MAX - v.to_u32());
        }
        if alpha {
            for (o, s) in row.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                o[3] = s[3];
            }
        }
    });
    Ok(out)
}

/// Reject images whose public fields disagree (shared by the radiology filters).
pub(crate) use super::common::check_image as check_shape;

#[cfg(test)]
pub(crate) mod testkit {
    //! Helpers for the radiology filters' tests.

    use proptest::prelude::*;

    use crate::filter::{Filter, Run};
    use crate::image::{DynImage, Image};
    use crate::params::Params;

    pub fn gray8(w: usize, h: usize, d: &[u8]) -> DynImage {
        DynImage::U8(Image::from_vec(w, h, 1, d.to_vec()).unwrap())
    }

    pub fn gray16(w: usize, h: usize, d: &[u16]) -> DynImage {
        DynImage::U16(Image::from_vec(w, h, 1, d.to_vec()).unwrap())
    }

    pub fn rgb8(w: usize, h: usize, d: &[u8]) -> DynImage {
        DynImage::U8(Image::from_vec(w, h, 3, d.to_vec()).unwrap())
    }

    pub fn rgba8(w: usize, h: usize, d: &[u8]) -> DynImage {
        DynImage::U8(Image::from_vec(w, h, 4, d.to_vec()).unwrap())
    }

    pub fn rgb16(w: usize, h: usize, d: &[u16]) -> DynImage {
        DynImage::U16(Image::from_vec(w, h, 3, d.to_vec()).unwrap())
    }

    /// Parameters from `key=value` items.
    pub fn p(items: &[&str]) -> Params {
        Params::parse(items).unwrap()
    }

    /// Apply on one thread, panicking on error.
    pub fn run1(f: &dyn Filter, img: &DynImage, items: &[&str]) -> DynImage {
        f.apply(img, &p(items), &Run::single()).unwrap()
    }

    /// Any image of 8 or 16 bits, 1, 3 or 4 channels, 1..=`max_side` on each side.
    pub fn any_image(max_side: usize) -> impl Strategy<Value = DynImage> {
        (any::<bool>(), prop_oneof![Just(1usize), Just(3), Just(4)], 1..=max_side, 1..=max_side)
            .prop_flat_map(|(wide, c, w, h)| {
                if wide {
                    proptest::collection::vec(any::<u16>(), w * h * c)
                        .prop_map(move |d| DynImage::U16(Image::from_vec(w, h, c, d).unwrap()))
                        .boxed()
                } else {
                    proptest::collection::vec(any::<u8>(), w * h * c)
                        .prop_map(move |d| DynImage::U8(Image::from_vec(w, h, c, d).unwrap()))
                        .boxed()
                }
            })
    }

    /// Parameter text that is rarely valid: junk, huge, negative, non-finite.
    pub fn junk_value() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            Just("NaN".to_string()),
            Just("inf".to_string()),
            Just("-inf".to_string()),
            Just("1e308".to_string()),
            Just("-1e308".to_string()),
            any::<f64>().prop_map(|v| v.to_string()),
            any::<i64>().prop_map(|v| v.to_string()),
            "[a-z0-9.,; -]{0,12}",
        ]
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::testkit::*;
    use super::*;

    #[test]
    fn known_pixels() {
        let f = Invert;
        assert_eq!(run1(&f, &gray8(3, 1, &[0, 100, 255]), &[]), gray8(3, 1, &[255, 155, 0]));
        assert_eq!(
            run1(&f, &gray16(2, 2, &[0, 1, 65534, 40000]), &[]),
            gray16(2, 2, &[65535, 65534, 1, 25535])
        );
        assert_eq!(
            run1(&f, &rgb8(2, 1, &[0, 10, 20, 255, 128, 1]), &[]),
            rgb8(2, 1, &[255, 245, 235, 0, 127, 254])
        );
        assert_eq!(
            run1(&f, &rgba8(1, 2, &[0, 10, 20, 7, 255, 128, 1, 200]), &[]),
            rgba8(1, 2, &[255, 245, 235, 7, 0, 127, 254, 200])
        );
        assert_eq!(run1(&f, &gray8(1, 1, &[3]), &[]), gray8(1, 1, &[252]));
    }

    #[test]
    fn rejects_params_and_bad_shapes() {
        let err = Invert.apply(&gray8(1, 1, &[0]), &p(&["x=1"]), &Run::single()).unwrap_err();
        assert!(matches!(err, ImagingError::UnknownParam { .. }), "{err}");
        let bad = DynImage::U8(Image { width: 2, height: 2, channels: 1, data: vec![0; 3] });
        assert!(matches!(
            Invert.apply(&bad, &Params::new(), &Run::single()),
            Err(ImagingError::InvalidImage(_))
        ));
        let bad = DynImage::U16(Image { width: 1, height: 1, channels: 2, data: vec![0; 2] });
        assert!(Invert.apply(&bad, &Params::new(), &Run::single()).is_err());
        let empty = gray8(0, 0, &[]);
        assert_eq!(run1(&Invert, &empty, &[]), empty);
    }

    proptest! {
        #[test]
        fn twice_is_identity_and_threads_agree(img in any_image(9)) {
            let once = run1(&Invert, &img, &[]);
            prop_assert_eq!(run1(&Invert, &once, &[]), img.clone());
            let three = Invert.apply(&img, &Params::new(), &Run::with_threads(3)).unwrap();
            prop_assert_eq!(three, once);
        }
    }
}
