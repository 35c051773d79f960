//! Window/level for display: decoded (modality-valued) pixels to 8-bit.
//!
//! VOI LINEAR as DICOM PS3.3 C.11.2.1.2.1 defines it, with output range 0..=255, for a window
//! centre `c` and width `w` (a width below 1 counts as 1):
//!
//! - `x ≤ c − 0.5 − (w − 1)/2` → 0
//! - `x > c − 0.5 + (w − 1)/2` → 255
//! - otherwise `((x − (c − 0.5)) / (w − 1) + 0.5) × 255`, rounded
//!
//! where `x` is the modality value ([`ImageMeta::modality_value`], so rescale has been applied
//! and the shift into u16 undone). For MONOCHROME1 the result is inverted (low values white),
//! so the output always reads as MONOCHROME2.

use bs_imaging::filter::{INTERCEPT, open_intercept};
use bs_imaging::{DynImage, Filter, Image, Output, Params};

use crate::meta::{Decoded, ImageMeta};

/// Apply the window stored in the file (first Window Center / Width) and return 8-bit pixels.
///
/// Without a stored window, grayscale uses the full range of the image's own values
/// (min..max); 8-bit images without a window come back unchanged. Colour images are not
/// windowed: 16-bit colour is reduced to 8 bits (`v >> 8`), 8-bit colour returned as is.
pub fn apply_window(decoded: &Decoded) -> DynImage {
    let meta = &decoded.meta;
    match (meta.window_center, meta.window_width) {
        (Some(c), Some(w)) => apply_window_with(decoded, c, w),
        _ => match &decoded.image {
            DynImage::U8(_) => decoded.image.clone(),
            DynImage::U16(img) if img.channels == 1 => {
                let (lo, hi) =
                    img.data.iter().fold((u16::MAX, 0u16), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                let (lo, hi) = (value(meta, lo), value(meta, hi));
                let (lo, hi) = (lo.min(hi), lo.max(hi));
                let step = step(meta);
                apply_window_with(decoded, (lo + hi + step) / 2.0, hi - lo + step)
            }
            DynImage::U16(_) => apply_window_with(decoded, 0.0, 1.0),
        },
    }
}

/// `image` — decoded from a file of `format` with `meta`, or filtered from such an image into
/// `output` — as a format of 8-bit samples takes it. 16-bit pixels are windowed for display:
/// values, or values on their scale, as the input is ([`apply_window`]: the window `meta`
/// states, else the image's own range); grey levels on their own full scale (0 → 0,
/// 65535 → 255), for the input's window means nothing to them. 8-bit pixels stay as they are.
pub fn to_eight_bits(
    image: DynImage,
    format: crate::Format,
    meta: &ImageMeta,
    output: Output,
) -> DynImage {
    if !matches!(image, DynImage::U16(_)) {
        return image;
    }
    if output == Output::GreyLevels {
        let plain = Decoded { image, frames: Vec::new(), format, meta: ImageMeta::default() };
        return apply_window_with(&plain, 32768.0, 65536.0);
    }
    apply_window(&Decoded { image, frames: Vec::new(), format, meta: meta.clone() })
}

/// `params` for `filter`, a step of a chain whose steps so far made `so_far` of a file's
/// values: a window's centre and width in modality units (HU for CT), as radiologists state
/// them, by the intercept [`modality_intercept`] gives — for a filter that takes one and was
/// given none, and only while the pixels are still the file's values.
pub fn in_modality_units(
    meta: &ImageMeta,
    filter: &dyn Filter,
    params: &Params,
    so_far: Output,
) -> Params {
    match modality_intercept(meta) {
        Some(v) if so_far == Output::Values && open_intercept(filter, params) => {
            params.clone().with(INTERCEPT, v)
        }
        _ => params.clone(),
    }
}

/// The intercept a window or level filter takes so that its center and width are given in
/// modality units (HU for CT) on pixels decoded from a file of `meta`: DICOM pixels are
/// decoded as modality value + offset (so signed data fits u16). `None` where the values stay
/// decoded-pixel units (MONOCHROME1 data is stored inverted, 32-bit or float data scaled) or
/// there is no offset.
pub fn modality_intercept(meta: &ImageMeta) -> Option<f64> {
    let plain = meta.pixel_inverted != Some(true) && meta.pixel_scale.is_none();
    meta.pixel_offset.filter(|_| plain).map(|offset| -offset)
}

/// Apply a window of `center` and `width` (modality units) and return 8-bit pixels; colour
/// images are reduced to 8 bits without windowing.
pub fn apply_window_with(decoded: &Decoded, center: f64, width: f64) -> DynImage {
    let meta = &decoded.meta;
    let invert = meta.pixel_inverted == Some(true);
    let step = step(meta);
    let map = |p: u16| {
        let y = voi_linear_in(value(meta, p), center, width, step);
        if invert { 255 - y } else { y }
    };
    match &decoded.image {
        DynImage::U8(img) if img.channels == 1 => {
            let lut: Vec<u8> = (0..=255u16).map(map).collect();
            DynImage::U8(with_data(img, img.data.iter().map(|&v| lut[usize::from(v)]).collect()))
        }
        DynImage::U16(img) if img.channels == 1 => {
            let lut: Vec<u8> = (0..=u16::MAX).map(map).collect();
            DynImage::U8(with_data(img, img.data.iter().map(|&v| lut[usize::from(v)]).collect()))
        }
        DynImage::U8(_) => decoded.image.clone(),
        DynImage::U16(img) => {
            DynImage::U8(with_data(img, img.data.iter().map(|&v| (v >> 8) as u8).collect()))
        }
    }
}

/// The modality value of pixel `p` (the pixel itself when the image has no DICOM mapping).
fn value(meta: &ImageMeta, p: u16) -> f64 {
    meta.modality_value(u32::from(p)).unwrap_or(f64::from(p))
}

/// Modality units between neighbouring pixel values (1 unless 32-bit or float samples were
/// spread over 16 bits).
fn step(meta: &ImageMeta) -> f64 {
    meta.pixel_scale.map(f64::abs).filter(|s| *s > 0.0 && s.is_finite()).unwrap_or(1.0)
}

/// VOI LINEAR (PS3.3 C.11.2.1.2.1) into 0..=255.
pub fn voi_linear(x: f64, center: f64, width: f64) -> u8 {
    voi_linear_in(x, center, width, 1.0)
}

/// VOI LINEAR for values whose neighbouring steps are `step` apart: the standard's formula
/// counts in steps of 1 (the `0.5` and `1` in it are half a step and one step), so fractional
/// values use it in units of their own step.
pub fn voi_linear_in(x: f64, center: f64, width: f64, step: f64) -> u8 {
    let width = if width.is_finite() { width.max(step) } else { step };
    let c = center - step / 2.0;
    let half = (width - step) / 2.0;
    if x.is_nan() || x <= c - half {
        0
    } else if x > c + half {
        255
    } else {
        (((x - c) / (width - step) + 0.5) * 255.0).round().clamp(0.0, 255.0) as u8
    }
}

/// An image of `img`'s shape holding `data`.
fn with_data<T: bs_imaging::Sample, U: bs_imaging::Sample>(
    img: &Image<T>,
    data: Vec<U>,
) -> Image<U> {
    Image { width: img.width, height: img.height, channels: img.channels, data }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CT's metadata: pixels are HU + 32768, a soft-tissue window stated.
    fn ct() -> ImageMeta {
        ImageMeta {
            pixel_offset: Some(32768.0),
            window_center: Some(40.0),
            window_width: Some(400.0),
            ..Default::default()
        }
    }

    #[test]
    fn eight_bits_of_values_take_the_files_window_and_grey_levels_their_full_scale() {
        let img = DynImage::U16(Image::from_vec(3, 1, 1, vec![16384, 32808, 49152]).unwrap());
        let eight = |out| match to_eight_bits(img.clone(), crate::Format::Dicom, &ct(), out) {
            DynImage::U8(i) => i.data.clone(),
            other => panic!("{other:?}"),
        };
        // Values (and their scale) through the file's window: 32808 is 40 HU, its centre, and
        // ±16384 HU are far outside it.
        assert_eq!(eight(Output::Values), [0, 128, 255]);
        assert_eq!(eight(Output::Scale), [0, 128, 255]);
        // Grey levels (a window's output, say) as they are, on the full scale.
        assert_eq!(eight(Output::GreyLevels), [64, 128, 191]);
    }

    #[test]
    fn a_window_takes_modality_units_while_the_pixels_are_the_files_values() {
        let window = bs_imaging::Registry::builtin().get("window").unwrap();
        let blur = bs_imaging::Registry::builtin().get("blur").unwrap();
        let none = Params::new();
        let given = Params::new().with("intercept", 5);
        let got = |f: &dyn Filter, p: &Params, so_far| {
            in_modality_units(&ct(), f, p, so_far).get("intercept").map(str::to_string)
        };
        assert_eq!(got(&*window, &none, Output::Values).as_deref(), Some("-32768"));
        assert_eq!(got(&*window, &given, Output::Values).as_deref(), Some("5"), "its own kept");
        assert_eq!(got(&*window, &none, Output::Scale), None, "after invert: not HU");
        assert_eq!(got(&*window, &none, Output::GreyLevels), None);
        assert_eq!(got(&*blur, &none, Output::Values), None, "blur takes none");
        let png = ImageMeta::default();
        assert_eq!(in_modality_units(&png, &*window, &none, Output::Values).get("intercept"), None);
    }

    #[test]
    fn voi_linear_in_fractional_steps_scales_the_standard() {
        // Values 0..=1 in steps of 1/1000 behave as 0..=1000 in steps of 1.
        for x in [-0.5, 0.0, 0.123, 0.5, 0.999, 1.0, 2.0] {
            assert_eq!(
                voi_linear_in(x, 0.5, 1.0, 0.001),
                voi_linear(x * 1000.0, 500.0, 1000.0),
                "{x}"
            );
        }
    }

    #[test]
    fn voi_linear_matches_the_standard() {
        // c = 40, w = 400: below -160 black, above 239.5 white.
        assert_eq!(voi_linear(-1000.0, 40.0, 400.0), 0);
        assert_eq!(voi_linear(-160.0, 40.0, 400.0), 0);
        assert_eq!(voi_linear(240.0, 40.0, 400.0), 255);
        assert_eq!(voi_linear(39.5, 40.0, 400.0), 128); // (0/399 + 0.5) * 255 = 127.5
        // Width 1 is a threshold at c - 0.5.
        assert_eq!(voi_linear(9.5, 10.0, 1.0), 0);
        assert_eq!(voi_linear(9.6, 10.0, 1.0), 255);
        assert_eq!(voi_linear(5.0, 10.0, 0.0), 0);
        assert_eq!(voi_linear(f64::NAN, 10.0, 10.0), 0);
        // Monotonic.
        let mut last = 0;
        for x in -300..300 {
            let y = voi_linear(f64::from(x), 40.0, 400.0);
            assert!(y >= last);
            last = y;
        }
    }
}
