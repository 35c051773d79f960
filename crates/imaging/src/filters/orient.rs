//! `rotate` and `flip`: lossless reorientation by multiples of 90°.
//!
//! Both move whole pixels (all channels, alpha included) without changing any sample value, so
//! they behave identically for gray, RGB and RGBA images of 8 or 16 bits.
//!
//! **`rotate`** — parameter `degrees` ∈ {90, 180, 270} (default 90), **clockwise** as seen on
//! screen (row 0 at the top). For an input of `W × H`, with `in(x, y)` the pixel in column `x`
//! of row `y`:
//!
//! - 90°: output `H × W`, `out(x', y') = in(y', H − 1 − x')` (the left column becomes the top row);
//! - 180°: output `W × H`, `out(x', y') = in(W − 1 − x', H − 1 − y')`;
//! - 270°: output `H × W`, `out(x', y') = in(W − 1 − y', x')` (90° counter-clockwise).
//!
//! Any other value is a `BadParam` error. Four 90° turns, or two 180° turns, are the identity.
//!
//! **`flip`** — parameter `axis` = `"horizontal"` (default) or `"vertical"`:
//!
//! - `horizontal` mirrors left ↔ right, as a viewer's "flip horizontal":
//!   `out(x, y) = in(W − 1 − x, y)`;
//! - `vertical` mirrors top ↔ bottom: `out(x, y) = in(x, H − 1 − y)`.
//!
//! Flipping twice on the same axis is the identity.
//!
//! Speed: the 90° and 270° turns read the input a row at a time and write bands of
//! [`BAND`] output rows, so both sides stay in cache; flips and 180° copy whole pixels along
//! rows. The channel count is a const generic so pixel copies are fixed-size moves. Bands run in
//! parallel through [`Run::rows`].

use std::sync::Arc;

use super::invert::check_shape;
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, ParamInfo, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Output rows written together by the 90° and 270° turns.
pub const BAND: usize = 16;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Rotate));
    out.push(Arc::new(Flip));
}

/// A reorientation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    Cw90,
    Half,
    Cw270,
    FlipH,
    FlipV,
}

/// The `rotate` filter.
pub struct Rotate;

impl Filter for Rotate {
    fn info(&self) -> FilterInfo {
        FilterInfo {
            name: "rotate".into(),
            summary: "rotate clockwise by 90, 180 or 270 degrees".into(),
            params: vec![ParamInfo::number(
                "degrees",
                90.0,
                90.0,
                270.0,
                "clockwise turn: 90, 180 or 270",
            )],
            kind: "builtin".into(),
            source: None,
        }
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let d = info.number(params, "degrees")?;
        let turn = if d == 90.0 {
            Turn::Cw90
        } else if d == 180.0 {
            Turn::Half
        } else if d == 270.0 {
            Turn::Cw270
        } else {
            return Err(ImagingError::BadParam {
                filter: info.name,
                param: "degrees".into(),
                reason: format!("{d} is not 90, 180 or 270"),
            });
        };
        reorient(img, turn, run)
    }
}

/// The `flip` filter.
pub struct Flip;

impl Filter for Flip {
    fn info(&self) -> FilterInfo {
        FilterInfo {
            name: "flip".into(),
            summary: "mirror left-right (horizontal) or top-bottom (vertical)".into(),
            params: vec![ParamInfo::text(
                "axis",
                "horizontal",
                "horizontal (left ↔ right) or vertical (top ↔ bottom)",
            )],
            kind: "builtin".into(),
            source: None,
        }
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let turn = match info.text(params, "axis") {
            "horizontal" => Turn::FlipH,
            "vertical" => Turn::FlipV,
            other => {
                return Err(ImagingError::BadParam {
                    filter: info.name.clone(),
                    param: "axis".into(),
                    reason: format!("{other:?} is not \"horizontal\" or \"vertical\""),
                });
            }
        };
        reorient(img, turn, run)
    }
}

fn reorient(img: &DynImage, turn: Turn, run: &Run) -> Result<DynImage, ImagingError> {
    Ok(match img {
        DynImage::U8(i) => DynImage::U8(by_channels(i, turn, run)?),
        DynImage::U16(i) => DynImage::U16(by_channels(i, turn, run)?),
    })
}

fn by_channels<T: Sample>(img: &Image<T>, turn: Turn, run: &Run) -> Result<Image<T>, ImagingError> {
    check_shape(img)?;
    Ok(match img.channels {
        1 => turned::<T, 1>(img, turn, run),
        3 => turned::<T, 3>(img, turn, run),
        _ => turned::<T, 4>(img, turn, run),
    })
}

fn turned<T: Sample, const C: usize>(img: &Image<T>, turn: Turn, run: &Run) -> Image<T> {
    let (w, h) = (img.width, img.height);
    let (ow, oh) = match turn {
        Turn::Cw90 | Turn::Cw270 => (h, w),
        _ => (w, h),
    };
    let mut out = Image::new(ow, oh, C);
    let orow = ow * C;
    let irow = w * C;
    let src = &img.data[..];
    match turn {
        Turn::Cw90 | Turn::Cw270 => run.rows(&mut out.data, orow * BAND, |b, band| {
            // Output rows y0..y0+rows, each `ow = h` pixels.
            let y0 = b * BAND;
            let rows = band.len() / orow;
            for xo in 0..ow {
                // The input row feeding output column xo, and the columns of it this band uses.
                let (sy, dst_col) = match turn {
                    Turn::Cw90 => (h - 1 - xo, xo),
                    _ => (xo, xo),
                };
                let srow = &src[sy * irow..(sy + 1) * irow];
                for i in 0..rows {
                    let sx = match turn {
                        Turn::Cw90 => y0 + i,
                        _ => w - 1 - (y0 + i),
                    };
                    let d = &mut band[i * orow + dst_col * C..i * orow + dst_col * C + C];
                    d.copy_from_slice(&srow[sx * C..sx * C + C]);
                }
            }
        }),
        Turn::Half | Turn::FlipH => run.rows(&mut out.data, orow, |y, row| {
            let sy = if turn == Turn::Half { h - 1 - y } else { y };
            let srow = &src[sy * irow..(sy + 1) * irow];
            for (d, s) in row.chunks_exact_mut(C).zip(srow.chunks_exact(C).rev()) {
                d.copy_from_slice(s);
            }
        }),
        Turn::FlipV => run.rows(&mut out.data, orow, |y, row| {
            let sy = h - 1 - y;
            row.copy_from_slice(&src[sy * irow..(sy + 1) * irow]);
        }),
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::invert::testkit::*;
    use super::*;

    fn rot(img: &DynImage, deg: u32) -> DynImage {
        run1(&Rotate, img, &[&format!("degrees={deg}")])
    }

    fn flip(img: &DynImage, axis: &str) -> DynImage {
        run1(&Flip, img, &[&format!("axis={axis}")])
    }

    // 3×2 gray:  1 2 3
    //            4 5 6
    #[test]
    fn rotate_known_pixels_gray8() {
        let g = gray8(3, 2, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(rot(&g, 90), gray8(2, 3, &[4, 1, 5, 2, 6, 3]));
        assert_eq!(run1(&Rotate, &g, &[]), gray8(2, 3, &[4, 1, 5, 2, 6, 3]));
        assert_eq!(rot(&g, 180), gray8(3, 2, &[6, 5, 4, 3, 2, 1]));
        assert_eq!(rot(&g, 270), gray8(2, 3, &[3, 6, 2, 5, 1, 4]));
    }

    #[test]
    fn rotate_known_pixels_gray16_and_rgb() {
        let g = gray16(2, 2, &[100, 200, 300, 65535]);
        assert_eq!(rot(&g, 90), gray16(2, 2, &[300, 100, 65535, 200]));
        assert_eq!(rot(&g, 270), gray16(2, 2, &[200, 65535, 100, 300]));
        // 2×1 RGB: red, blue → 1×2 column red over blue (90° CW puts the left pixel on top).
        let c = rgb8(2, 1, &[255, 0, 0, 0, 0, 255]);
        assert_eq!(rot(&c, 90), rgb8(1, 2, &[255, 0, 0, 0, 0, 255]));
        assert_eq!(rot(&c, 270), rgb8(1, 2, &[0, 0, 255, 255, 0, 0]));
        assert_eq!(rot(&c, 180), rgb8(2, 1, &[0, 0, 255, 255, 0, 0]));
        let a = rgba8(1, 2, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(rot(&a, 90), rgba8(2, 1, &[5, 6, 7, 8, 1, 2, 3, 4]));
    }

    #[test]
    fn flip_known_pixels() {
        let g = gray8(3, 2, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(flip(&g, "horizontal"), gray8(3, 2, &[3, 2, 1, 6, 5, 4]));
        assert_eq!(run1(&Flip, &g, &[]), gray8(3, 2, &[3, 2, 1, 6, 5, 4]));
        assert_eq!(flip(&g, "vertical"), gray8(3, 2, &[4, 5, 6, 1, 2, 3]));
        let g16 = gray16(2, 1, &[7, 65535]);
        assert_eq!(flip(&g16, "horizontal"), gray16(2, 1, &[65535, 7]));
        assert_eq!(flip(&g16, "vertical"), g16);
        let c = rgb16(2, 1, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(flip(&c, "horizontal"), rgb16(2, 1, &[4, 5, 6, 1, 2, 3]));
        let one = rgb8(1, 1, &[9, 8, 7]);
        for d in [90, 180, 270] {
            assert_eq!(rot(&one, d), one);
        }
        assert_eq!(flip(&one, "vertical"), one);
    }

    #[test]
    fn bad_params() {
        let g = gray8(1, 1, &[0]);
        for d in ["0", "45", "91", "360", "-90", "x", "NaN"] {
            let e = Rotate.apply(&g, &p(&[&format!("degrees={d}")]), &Run::single()).unwrap_err();
            assert!(matches!(e, ImagingError::BadParam { .. }), "{d}: {e}");
        }
        let e = Flip.apply(&g, &p(&["axis=diagonal"]), &Run::single()).unwrap_err();
        assert!(matches!(e, ImagingError::BadParam { .. }), "{e}");
        let e = Flip.apply(&g, &p(&["degrees=90"]), &Run::single()).unwrap_err();
        assert!(matches!(e, ImagingError::UnknownParam { .. }), "{e}");
        let empty = gray8(0, 3, &[]);
        assert_eq!(rot(&empty, 90), gray8(3, 0, &[]));
    }

    #[test]
    fn tall_image_crosses_bands() {
        // More rows than one band, on several threads.
        let (w, h) = (BAND * 2 + 3, 5);
        let data: Vec<u16> = (0..(w * h) as u16).collect();
        let g = gray16(w, h, &data);
        let r = Rotate.apply(&g, &p(&["degrees=90"]), &Run::with_threads(3)).unwrap();
        let DynImage::U16(r) = r else { panic!() };
        for y in 0..w {
            for x in 0..h {
                assert_eq!(r.get(x, y, 0), data[(h - 1 - x) * w + y]);
            }
        }
    }

    proptest! {
        #[test]
        fn turns_compose(img in any_image(BAND + 5)) {
            let mut r = img.clone();
            for _ in 0..4 {
                r = rot(&r, 90);
            }
            prop_assert_eq!(&r, &img);
            prop_assert_eq!(rot(&rot(&img, 180), 180), img.clone());
            prop_assert_eq!(rot(&rot(&img, 90), 270), img.clone());
            prop_assert_eq!(rot(&rot(&img, 90), 90), rot(&img, 180));
            prop_assert_eq!(flip(&flip(&img, "horizontal"), "horizontal"), img.clone());
            prop_assert_eq!(flip(&flip(&img, "vertical"), "vertical"), img.clone());
            prop_assert_eq!(flip(&flip(&img, "vertical"), "horizontal"), rot(&img, 180));
        }

        #[test]
        fn threads_agree(img in any_image(2 * BAND + 3), d in prop_oneof![Just(90), Just(180), Just(270)]) {
            let ps = p(&[&format!("degrees={d}")]);
            let one = Rotate.apply(&img, &ps, &Run::single()).unwrap();
            prop_assert_eq!(Rotate.apply(&img, &ps, &Run::with_threads(3)).unwrap(), one);
            let f3 = Flip.apply(&img, &p(&["axis=vertical"]), &Run::with_threads(3)).unwrap();
            prop_assert_eq!(f3, flip(&img, "vertical"));
        }

        #[test]
        fn junk_never_panics(img in any_image(3), v in junk_value()) {
            let ps = Params::new().with("degrees", &v);
            if let Err(e) = Rotate.apply(&img, &ps, &Run::single()) {
                prop_assert!(matches!(e, ImagingError::BadParam { .. }), "{}", e);
            }
            let ps = Params::new().with("axis", &v);
            let r = Flip.apply(&img, &ps, &Run::single());
            prop_assert!(r.is_err() || v == "horizontal" || v == "vertical");
        }
    }
}
