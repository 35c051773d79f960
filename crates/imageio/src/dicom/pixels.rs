//! Native DICOM samples of one frame to a [`DynImage`], by the conversion policy documented in
//! [`crate::dicom`].

use bs_imaging::{DynImage, Image};

use crate::error::ImageIoError;
use crate::format::Format;

const DICOM: Format = Format::Dicom;

/// How the samples of a frame are laid out and what they mean.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub rows: usize,
    pub cols: usize,
    pub samples_per_pixel: usize,
    pub bits_allocated: u16,
    pub bits_stored: u16,
    pub high_bit: u16,
    pub signed: bool,
    /// Colour planes stored one after another (Planar Configuration 1).
    pub planar: bool,
    pub photometric: String,
    pub slope: f64,
    pub intercept: f64,
}

/// The converted image and, for grayscale, `(pixel_offset, inverted)` as in
/// [`ImageMeta::pixel_offset`](crate::ImageMeta::pixel_offset).
pub(crate) type Converted = (DynImage, Option<(f64, bool)>);

impl Layout {
    pub fn bytes_per_sample(&self) -> usize {
        usize::from(self.bits_allocated.div_ceil(8))
    }

    /// Bytes of one frame (`None` on overflow).
    pub fn frame_bytes(&self) -> Option<usize> {
        self.rows
            .checked_mul(self.cols)?
            .checked_mul(self.samples_per_pixel)?
            .checked_mul(self.bytes_per_sample())
    }

    /// Refuse layouts this module cannot convert, before any pixel is decoded.
    pub fn validate(&self) -> Result<(), ImageIoError> {
        if self.rows == 0 || self.cols == 0 {
            return Err(ImageIoError::corrupt(DICOM, "Rows or Columns is 0"));
        }
        if !matches!(self.bits_allocated, 8 | 16) {
            return Err(ImageIoError::unsupported(
                DICOM,
                format!("Bits Allocated {} (8 and 16 are supported)", self.bits_allocated),
            ));
        }
        if self.bits_stored == 0 || self.bits_stored > self.bits_allocated {
            return Err(ImageIoError::corrupt(
                DICOM,
                format!(
                    "Bits Stored {} with Bits Allocated {}",
                    self.bits_stored, self.bits_allocated
                ),
            ));
        }
        if self.high_bit >= self.bits_allocated || self.high_bit + 1 < self.bits_stored {
            return Err(ImageIoError::corrupt(
                DICOM,
                format!("High Bit {} with Bits Stored {}", self.high_bit, self.bits_stored),
            ));
        }
        if !self.slope.is_finite() || !self.intercept.is_finite() {
            return Err(ImageIoError::corrupt(DICOM, "Rescale Slope or Intercept is not a number"));
        }
        match (self.samples_per_pixel, self.photometric.as_str()) {
            (1, "MONOCHROME1" | "MONOCHROME2" | "") => Ok(()),
            (1, other) => Err(ImageIoError::unsupported(
                DICOM,
                format!("Photometric Interpretation {other} (MONOCHROME1/2 and RGB are supported)"),
            )),
            (3, _) if self.signed => Err(ImageIoError::unsupported(DICOM, "signed colour samples")),
            (3, "RGB") => Ok(()),
            (3, "YBR_FULL") if self.bits_allocated == 8 => Ok(()),
            (3, other) => Err(ImageIoError::unsupported(
                DICOM,
                format!(
                    "{}-bit Photometric Interpretation {other} (RGB and 8-bit YBR_FULL are \
                     supported)",
                    self.bits_allocated
                ),
            )),
            (n, _) => Err(ImageIoError::unsupported(
                DICOM,
                format!("{n} samples per pixel (1 and 3 are supported)"),
            )),
        }
    }

    /// Stored value of a raw sample: bits `high_bit - bits_stored + 1 ..= high_bit`, sign
    /// extended when signed.
    fn stored(&self, raw: u32) -> i64 {
        let shift = u32::from(self.high_bit + 1 - self.bits_stored);
        let bits = u32::from(self.bits_stored);
        let v = (raw >> shift) & ((1u32 << bits) - 1);
        if self.signed && v & (1 << (bits - 1)) != 0 {
            i64::from(v) - (1i64 << bits)
        } else {
            i64::from(v)
        }
    }

    /// Smallest and largest stored values.
    fn stored_range(&self) -> (i64, i64) {
        let bits = u32::from(self.bits_stored);
        if self.signed {
            (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1)
        } else {
            (0, (1i64 << bits) - 1)
        }
    }
}

/// Convert one frame of native little-endian samples (`data` holds at least
/// [`Layout::frame_bytes`]).
pub(crate) fn convert(data: &[u8], layout: &Layout) -> Result<Converted, ImageIoError> {
    layout.validate()?;
    let need =
        layout.frame_bytes().ok_or_else(|| ImageIoError::corrupt(DICOM, "image too large"))?;
    let Some(data) = data.get(..need) else {
        return Err(ImageIoError::truncated(
            DICOM,
            format!("pixel data holds {} bytes, the first frame needs {need}", data.len()),
        ));
    };
    if layout.samples_per_pixel == 1 { gray(data, layout) } else { color(data, layout) }
}

fn gray(data: &[u8], l: &Layout) -> Result<Converted, ImageIoError> {
    let inverted = l.photometric == "MONOCHROME1";
    let (w, h) = (l.cols, l.rows);
    let identity = l.slope == 1.0 && l.intercept == 0.0;
    if l.bits_allocated == 8 && !l.signed && identity {
        // 8-bit stays 8-bit: pixel = stored value (or max - value for MONOCHROME1).
        let max = (1u32 << l.bits_stored) - 1;
        let lut: Vec<u8> = (0..256u32)
            .map(|raw| {
                let v = l.stored(raw) as u32;
                (if inverted { max - v } else { v }) as u8
            })
            .collect();
        let out = data.iter().map(|&b| lut[usize::from(b)]).collect();
        let image = Image::from_vec(w, h, 1, out)
            .map_err(|e| ImageIoError::corrupt(DICOM, e.to_string()))?;
        let offset = if inverted { f64::from(max) } else { 0.0 };
        return Ok((DynImage::U8(image), Some((offset, inverted))));
    }
    // Modality values m = stored × slope + intercept, rounded, shifted by `offset` so that
    // the whole possible range lands in 0..=65535 (offset 0 when it already does).
    let (s_lo, s_hi) = l.stored_range();
    let a = s_lo as f64 * l.slope + l.intercept;
    let b = s_hi as f64 * l.slope + l.intercept;
    let (m_lo, m_hi) = (a.min(b).round(), a.max(b).round());
    let offset = if m_lo >= 0.0 && m_hi <= 65535.0 { 0.0 } else { -m_lo };
    let to_pixel = |m: f64| (m.round() + offset).clamp(0.0, 65535.0);
    let (p_lo, p_hi) = (to_pixel(m_lo), to_pixel(m_hi));
    let map = |raw: u32| {
        let p = to_pixel(l.stored(raw) as f64 * l.slope + l.intercept);
        (if inverted { p_lo + p_hi - p } else { p }) as u16
    };
    let raws: Box<dyn Iterator<Item = u32>> = if l.bits_allocated == 8 {
        Box::new(data.iter().map(|&b| u32::from(b)))
    } else {
        Box::new(data.chunks_exact(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))))
    };
    // A table of every raw value pays off once the image has more pixels than the table.
    let entries = 1usize << l.bits_allocated;
    let out: Vec<u16> = if w * h >= entries {
        let lut: Vec<u16> = (0..entries as u32).map(map).collect();
        raws.map(|r| lut[r as usize]).collect()
    } else {
        raws.map(map).collect()
    };
    let image =
        Image::from_vec(w, h, 1, out).map_err(|e| ImageIoError::corrupt(DICOM, e.to_string()))?;
    // p = offset + m, or after inversion p = (p_lo + p_hi - offset) - m.
    let mapping = if inverted { (p_lo + p_hi - offset, true) } else { (offset, false) };
    Ok((DynImage::U16(image), Some(mapping)))
}

fn color(data: &[u8], l: &Layout) -> Result<Converted, ImageIoError> {
    let (w, h) = (l.cols, l.rows);
    let pixels = w * h;
    let bps = l.bytes_per_sample();
    // Sample c of pixel i, as raw integer.
    let raw = |i: usize, c: usize| -> u32 {
        let index = if l.planar { c * pixels + i } else { i * 3 + c };
        if bps == 1 {
            u32::from(data[index])
        } else {
            u32::from(u16::from_le_bytes([data[2 * index], data[2 * index + 1]]))
        }
    };
    let wrap = |e: bs_imaging::ImagingError| ImageIoError::corrupt(DICOM, e.to_string());
    if l.bits_allocated == 8 {
        let mut out = Vec::with_capacity(pixels * 3);
        for i in 0..pixels {
            let s = [0, 1, 2].map(|c| l.stored(raw(i, c)) as u8);
            if l.photometric == "YBR_FULL" {
                out.extend(ybr_full_to_rgb(s));
            } else {
                out.extend(s);
            }
        }
        Ok((DynImage::U8(Image::from_vec(w, h, 3, out).map_err(wrap)?), None))
    } else {
        let mut out = Vec::with_capacity(pixels * 3);
        for i in 0..pixels {
            out.extend([0, 1, 2].map(|c| l.stored(raw(i, c)) as u16));
        }
        Ok((DynImage::U16(Image::from_vec(w, h, 3, out).map_err(wrap)?), None))
    }
}

/// YBR_FULL (PS3.3 C.7.6.3.1.2, the JPEG/JFIF full-range YCbCr) to RGB.
fn ybr_full_to_rgb([y, cb, cr]: [u8; 3]) -> [u8; 3] {
    let (y, cb, cr) = (f64::from(y), f64::from(cb) - 128.0, f64::from(cr) - 128.0);
    let r = y + 1.402 * cr;
    let g = y - 0.344_136 * cb - 0.714_136 * cr;
    let b = y + 1.772 * cb;
    [r, g, b].map(|v| v.round().clamp(0.0, 255.0) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(bits_allocated: u16, bits_stored: u16, signed: bool, pi: &str) -> Layout {
        Layout {
            rows: 1,
            cols: 4,
            samples_per_pixel: 1,
            bits_allocated,
            bits_stored,
            high_bit: bits_stored - 1,
            signed,
            planar: false,
            photometric: pi.into(),
            slope: 1.0,
            intercept: 0.0,
        }
    }

    fn le16(v: &[u16]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn eight_bit_identity_and_monochrome1() {
        let l = layout(8, 8, false, "MONOCHROME2");
        let (img, map) = convert(&[0, 1, 128, 255], &l).unwrap();
        assert_eq!(img, DynImage::U8(Image::from_vec(4, 1, 1, vec![0, 1, 128, 255]).unwrap()));
        assert_eq!(map, Some((0.0, false)));
        let l = layout(8, 8, false, "MONOCHROME1");
        let (img, map) = convert(&[0, 1, 128, 255], &l).unwrap();
        assert_eq!(img, DynImage::U8(Image::from_vec(4, 1, 1, vec![255, 254, 127, 0]).unwrap()));
        assert_eq!(map, Some((255.0, true)));
    }

    #[test]
    fn twelve_bit_masks_unused_high_bits() {
        let l = layout(16, 12, false, "MONOCHROME2");
        let (img, _) = convert(&le16(&[0xF000, 0x0FFF, 0x1001, 5]), &l).unwrap();
        assert_eq!(img, DynImage::U16(Image::from_vec(4, 1, 1, vec![0, 4095, 1, 5]).unwrap()));
    }

    #[test]
    fn signed_values_shift_into_u16() {
        // Signed 16-bit CT with intercept -1024: m ranges over -33792..=31743, offset 33792.
        let mut l = layout(16, 16, true, "MONOCHROME2");
        l.intercept = -1024.0;
        let stored: [i16; 4] = [-2000, 0, 1024, 3071];
        let data: Vec<u8> = stored.iter().flat_map(|v| v.to_le_bytes()).collect();
        let (img, map) = convert(&data, &l).unwrap();
        let DynImage::U16(img) = img else { panic!("16-bit expected") };
        assert_eq!(map, Some((33792.0, false)));
        let hu: Vec<f64> = img.data.iter().map(|&p| f64::from(p) - 33792.0).collect();
        assert_eq!(hu, [-3024.0, -1024.0, 0.0, 2047.0]);
        // 12-bit signed: sign bit 11.
        let l = layout(16, 12, true, "MONOCHROME2");
        let (img, map) = convert(&le16(&[0x0800, 0x07FF, 0x0FFF, 0]), &l).unwrap();
        assert_eq!(map, Some((2048.0, false)));
        assert_eq!(
            img,
            DynImage::U16(Image::from_vec(4, 1, 1, vec![0, 4095, 2047, 2048]).unwrap())
        );
    }

    #[test]
    fn rescale_then_invert() {
        let mut l = layout(16, 8, false, "MONOCHROME1");
        l.slope = 2.0;
        l.intercept = 10.0;
        // m in 10..=520, inside 0..=65535: offset 0; inverted p = 530 - m.
        let (img, map) = convert(&le16(&[0, 1, 255, 100]), &l).unwrap();
        assert_eq!(map, Some((530.0, true)));
        assert_eq!(img, DynImage::U16(Image::from_vec(4, 1, 1, vec![520, 518, 10, 320]).unwrap()));
    }

    #[test]
    fn planar_rgb_and_ybr() {
        let mut l = layout(8, 8, false, "RGB");
        l.samples_per_pixel = 3;
        l.cols = 2;
        l.planar = true;
        let (img, map) = convert(&[1, 2, 3, 4, 5, 6], &l).unwrap();
        assert_eq!(map, None);
        assert_eq!(img, DynImage::U8(Image::from_vec(2, 1, 3, vec![1, 3, 5, 2, 4, 6]).unwrap()));
        l.planar = false;
        l.photometric = "YBR_FULL".into();
        let (img, _) = convert(&[128, 128, 128, 255, 128, 128], &l).unwrap();
        assert_eq!(
            img,
            DynImage::U8(
                Image::from_vec(2, 1, 3, vec![128; 3].into_iter().chain([255; 3]).collect())
                    .unwrap()
            )
        );
    }

    #[test]
    fn refusals() {
        assert!(convert(&[0; 3], &layout(8, 8, false, "MONOCHROME2")).is_err()); // short
        assert!(convert(&[0; 8], &layout(8, 8, false, "PALETTE COLOR")).is_err());
        let mut l = layout(16, 16, false, "MONOCHROME2");
        l.bits_allocated = 32;
        assert!(convert(&[0; 16], &l).is_err());
        let mut l = layout(16, 12, false, "MONOCHROME2");
        l.high_bit = 16;
        assert!(convert(&[0; 8], &l).is_err());
        let mut l = layout(16, 12, false, "MONOCHROME2");
        l.slope = f64::NAN;
        assert!(convert(&[0; 8], &l).is_err());
        let mut l = layout(8, 8, false, "MONOCHROME2");
        l.rows = 0;
        assert!(convert(&[], &l).is_err());
    }
}
