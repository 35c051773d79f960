//! Native DICOM samples of one or more frames to [`DynImage`]s, by the conversion policy
//! documented in [`crate::dicom`].

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
    /// Samples are IEEE floats (Float Pixel Data, Bits Allocated 32; Double Float Pixel Data,
    /// Bits Allocated 64).
    pub float: bool,
    /// The lookup tables of PALETTE COLOR.
    pub palette: Option<Palette>,
}

/// PALETTE COLOR lookup tables (PS3.3 C.7.6.3.1.5): a stored value `v` shows as entry
/// `v − first`, clamped to the table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Palette {
    pub first: i64,
    pub red: Vec<u16>,
    pub green: Vec<u16>,
    pub blue: Vec<u16>,
    /// 8 when every entry fits in a byte (the image is RGB8), else 16 (RGB16).
    pub bits: u8,
}

/// How a decoded grayscale pixel `p` relates to the modality value `m`:
/// `m = (p − offset) × scale`, or `m = (offset − p) × scale` when `inverted` (see
/// [`ImageMeta::pixel_offset`](crate::ImageMeta::pixel_offset)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Mapping {
    pub offset: f64,
    pub inverted: bool,
    pub scale: f64,
}

/// The converted frames and, for grayscale, their [`Mapping`] (one for all frames).
pub(crate) type Converted = (Vec<DynImage>, Option<Mapping>);

impl Layout {
    pub fn bytes_per_sample(&self) -> usize {
        usize::from(self.bits_allocated.div_ceil(8))
    }

    /// YBR_FULL_422 in native form: two luma samples and one pair of chroma samples for each
    /// two pixels of a row (PS3.3 C.7.6.3.1.2).
    fn is_ybr_422(&self) -> bool {
        self.samples_per_pixel == 3 && self.photometric == "YBR_FULL_422"
    }

    /// Samples one frame holds.
    fn samples_per_frame(&self) -> Option<usize> {
        let pixels = self.rows.checked_mul(self.cols)?;
        if self.is_ybr_422() {
            pixels.checked_mul(2)
        } else {
            pixels.checked_mul(self.samples_per_pixel)
        }
    }

    /// Bits of one frame (`None` on overflow): frames of 1-bit pixels need not end on a byte.
    pub fn frame_bits(&self) -> Option<u64> {
        (self.samples_per_frame()? as u64).checked_mul(u64::from(self.bits_allocated))
    }

    /// Bytes of one frame (`None` on overflow).
    pub fn frame_bytes(&self) -> Option<usize> {
        usize::try_from(self.frame_bits()?.div_ceil(8)).ok()
    }

    /// Bytes per pixel of the decoded image (at least), for the size limits.
    pub fn output_bytes_per_pixel(&self) -> u64 {
        let in_sample = self.bytes_per_sample().max(1) as u64;
        if self.palette.is_some() {
            6
        } else {
            self.samples_per_pixel as u64 * in_sample.clamp(1, 2)
        }
    }

    /// Refuse layouts this module cannot convert, before any pixel is decoded.
    pub fn validate(&self) -> Result<(), ImageIoError> {
        let unsupported = |what: String| Err(ImageIoError::unsupported(DICOM, what));
        if self.rows == 0 || self.cols == 0 {
            return Err(ImageIoError::corrupt(DICOM, "Rows or Columns is 0"));
        }
        if self.float {
            if !matches!(self.bits_allocated, 32 | 64) {
                return Err(ImageIoError::corrupt(
                    DICOM,
                    format!("float pixel data with Bits Allocated {}", self.bits_allocated),
                ));
            }
        } else {
            if !matches!(self.bits_allocated, 1 | 8 | 16 | 32) {
                return unsupported(format!(
                    "Bits Allocated {} (1, 8, 16 and 32 are supported)",
                    self.bits_allocated
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
        }
        if !self.slope.is_finite() || !self.intercept.is_finite() || self.slope == 0.0 {
            return Err(ImageIoError::corrupt(DICOM, "Rescale Slope or Intercept is not usable"));
        }
        let wide = self.float || self.bits_allocated == 32;
        match (self.samples_per_pixel, self.photometric.as_str()) {
            (1, "MONOCHROME1" | "MONOCHROME2" | "") => Ok(()),
            (1, "PALETTE COLOR") => match &self.palette {
                _ if wide || self.bits_allocated == 1 => unsupported(format!(
                    "PALETTE COLOR with {}-bit samples (8 and 16 are supported)",
                    self.bits_allocated
                )),
                Some(_) => Ok(()),
                None => {
                    Err(ImageIoError::corrupt(DICOM, "PALETTE COLOR without its lookup tables"))
                }
            },
            (1, other) => {
                unsupported(format!("Photometric Interpretation {other} with one sample per pixel"))
            }
            (3, _) if wide || self.bits_allocated == 1 => {
                unsupported(format!("colour with {}-bit samples", self.bits_allocated))
            }
            (3, _) if self.signed => unsupported("signed colour samples".into()),
            (3, "RGB" | "YBR_FULL") => Ok(()),
            (3, "YBR_FULL_422") if self.cols % 2 == 1 => {
                unsupported("YBR_FULL_422 with an odd number of columns".into())
            }
            (3, "YBR_FULL_422") => Ok(()),
            (3, other) => unsupported(format!(
                "Photometric Interpretation {other} in native form (RGB, YBR_FULL and \
                 YBR_FULL_422 are supported)"
            )),
            (n, _) => unsupported(format!("{n} samples per pixel (1 and 3 are supported)")),
        }
    }

    /// Stored value of a raw integer sample: bits `high_bit - bits_stored + 1 ..= high_bit`,
    /// sign extended when signed.
    fn stored(&self, raw: u64) -> i64 {
        let shift = u32::from(self.high_bit + 1 - self.bits_stored);
        let bits = u32::from(self.bits_stored);
        let v = (raw >> shift) & ((1u64 << bits) - 1);
        if self.signed && v & (1 << (bits - 1)) != 0 { v as i64 - (1i64 << bits) } else { v as i64 }
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

    /// The raw value of sample `i` of a frame (integer samples of 8, 16 or 32 bits).
    fn raw(&self, data: &[u8], i: usize) -> u64 {
        match self.bits_allocated {
            8 => u64::from(data[i]),
            16 => u64::from(u16::from_le_bytes([data[2 * i], data[2 * i + 1]])),
            _ => u64::from(u32::from_le_bytes(data[4 * i..4 * i + 4].try_into().expect("4 bytes"))),
        }
    }
}

/// Convert frames of native little-endian samples (each holds at least
/// [`Layout::frame_bytes`]); grayscale frames share one [`Mapping`].
pub(crate) fn convert(frames: &[&[u8]], layout: &Layout) -> Result<Converted, ImageIoError> {
    layout.validate()?;
    let need =
        layout.frame_bytes().ok_or_else(|| ImageIoError::corrupt(DICOM, "image too large"))?;
    let mut data = Vec::with_capacity(frames.len());
    for (n, f) in frames.iter().enumerate() {
        let Some(d) = f.get(..need) else {
            return Err(ImageIoError::truncated(
                DICOM,
                format!("frame {} holds {} bytes, a frame needs {need}", n + 1, f.len()),
            ));
        };
        data.push(d);
    }
    let wrap = |e: bs_imaging::ImagingError| ImageIoError::corrupt(DICOM, e.to_string());
    if layout.samples_per_pixel == 3 {
        let images = data.iter().map(|d| color(d, layout)).collect::<Result<_, _>>()?;
        return Ok((images, None));
    }
    if layout.photometric == "PALETTE COLOR" {
        let p = layout.palette.as_ref().expect("validated");
        let images = data.iter().map(|d| palette(d, layout, p)).collect::<Result<_, _>>()?;
        return Ok((images, None));
    }
    if layout.bits_allocated == 1 {
        return one_bit(&data, layout).map_err(wrap);
    }
    if layout.float || layout.bits_allocated == 32 {
        return wide_gray(&data, layout).map_err(wrap);
    }
    let mut images = Vec::with_capacity(data.len());
    let mut mapping = None;
    for d in &data {
        let (image, m) = gray(d, layout)?;
        images.push(image);
        mapping = Some(m);
    }
    Ok((images, mapping))
}

fn gray(data: &[u8], l: &Layout) -> Result<(DynImage, Mapping), ImageIoError> {
    let inverted = l.photometric == "MONOCHROME1";
    let (w, h) = (l.cols, l.rows);
    let identity = l.slope == 1.0 && l.intercept == 0.0;
    if l.bits_allocated == 8 && !l.signed && identity {
        // 8-bit stays 8-bit: pixel = stored value (or max - value for MONOCHROME1).
        let max = (1u64 << l.bits_stored) - 1;
        let lut: Vec<u8> = (0..256u64)
            .map(|raw| {
                let v = l.stored(raw) as u64;
                (if inverted { max - v } else { v }) as u8
            })
            .collect();
        // Most 8-bit images map every value to itself: a copy, not a lookup per sample.
        let same = lut.iter().enumerate().all(|(i, &v)| usize::from(v) == i);
        let out = if same {
            data[..w * h].to_vec()
        } else {
            data[..w * h].iter().map(|&b| lut[usize::from(b)]).collect()
        };
        let image = Image::from_vec(w, h, 1, out)
            .map_err(|e| ImageIoError::corrupt(DICOM, e.to_string()))?;
        let offset = if inverted { max as f64 } else { 0.0 };
        return Ok((DynImage::U8(image), Mapping { offset, inverted, scale: 1.0 }));
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
    let map = |raw: u64| {
        let p = to_pixel(l.stored(raw) as f64 * l.slope + l.intercept);
        (if inverted { p_lo + p_hi - p } else { p }) as u16
    };
    let samples = w * h;
    // A whole-number rescale with slope 1 (how CT stores Hounsfield units) is an addition:
    // done in registers on whole rows, where a table lookup per sample is a gather that does
    // not vectorise. The same values as `map` (checked for every bit pattern in the tests).
    if l.bits_allocated == 16
        && l.slope == 1.0
        && let Some(add) = whole_i32(l.intercept + offset)
    {
        let flip = inverted.then_some((p_lo + p_hi) as i32);
        let out =
            add_rescale16(&data[..2 * samples], shift_of(l), l.bits_stored, l.signed, add, flip);
        let image = Image::from_vec(w, h, 1, out)
            .map_err(|e| ImageIoError::corrupt(DICOM, e.to_string()))?;
        let offset = if inverted { p_lo + p_hi - offset } else { offset };
        return Ok((DynImage::U16(image), Mapping { offset, inverted, scale: 1.0 }));
    }
    // A table of every stored bit pattern (2^Bits Stored entries, indexed by the bits
    // `stored` keeps) pays off once the image has more pixels than the table.
    let shift = u32::from(l.high_bit + 1 - l.bits_stored);
    let mask = (1u64 << l.bits_stored) - 1;
    let entries = 1usize << l.bits_stored;
    let out: Vec<u16> = if samples >= entries && l.bits_allocated == 16 {
        let lut: Vec<u16> = (0..entries as u64).map(|v| map(v << shift)).collect();
        data.chunks_exact(2)
            .take(samples)
            .map(|c| lut[((u64::from(u16::from_le_bytes([c[0], c[1]])) >> shift) & mask) as usize])
            .collect()
    } else if samples >= entries {
        let lut: Vec<u16> = (0..entries as u64).map(|v| map(v << shift)).collect();
        (0..samples).map(|i| lut[((l.raw(data, i) >> shift) & mask) as usize]).collect()
    } else {
        (0..samples).map(|i| map(l.raw(data, i))).collect()
    };
    let image =
        Image::from_vec(w, h, 1, out).map_err(|e| ImageIoError::corrupt(DICOM, e.to_string()))?;
    // p = offset + m, or after inversion p = (p_lo + p_hi - offset) - m.
    let offset = if inverted { p_lo + p_hi - offset } else { offset };
    Ok((DynImage::U16(image), Mapping { offset, inverted, scale: 1.0 }))
}

/// Where the stored bits start in a sample (High Bit + 1 − Bits Stored).
fn shift_of(l: &Layout) -> u32 {
    u32::from(l.high_bit + 1 - l.bits_stored)
}

/// `v` as an `i32` if it is a whole number well inside its range.
fn whole_i32(v: f64) -> Option<i32> {
    (v.fract() == 0.0 && v.abs() <= f64::from(1 << 24)).then_some(v as i32)
}

/// 16-bit samples to pixels `clamp(stored + add, 0, 65535)`, mirrored to `flip − p` for
/// MONOCHROME1: the stored value is the `bits` bits at `shift`, sign-extended when `signed`.
fn add_rescale16(
    data: &[u8],
    shift: u32,
    bits: u16,
    signed: bool,
    add: i32,
    flip: Option<i32>,
) -> Vec<u16> {
    let mask = ((1u32 << bits) - 1) as u16;
    // Sign extension by shifting the top stored bit into the sign bit and back.
    let up = if signed { 32 - u32::from(bits) } else { 0 };
    let args = Rescale { shift, mask, up, add, flip: flip.unwrap_or(0) };
    let mirror = flip.is_some();
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // Twice the lanes of the baseline build, and 32-bit min/max that SSE2 lacks.
        #[target_feature(enable = "avx2")]
        fn avx2(data: &[u8], a: Rescale, mirror: bool) -> Vec<u16> {
            rescale_any(data, a, mirror)
        }
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { avx2(data, args, mirror) };
    }
    rescale_any(data, args, mirror)
}

/// [`rescale_into`] with or without the mirror.
#[inline(always)]
fn rescale_any(data: &[u8], a: Rescale, mirror: bool) -> Vec<u16> {
    if mirror { rescale_into::<true>(data, a) } else { rescale_into::<false>(data, a) }
}

/// The parameters of [`add_rescale16`]'s loop.
#[derive(Clone, Copy)]
struct Rescale {
    shift: u32,
    mask: u16,
    up: u32,
    add: i32,
    flip: i32,
}

/// The loop of [`add_rescale16`], one copy with and one without the mirror so that each
/// vectorises; the same integer operations whatever the CPU. Written into fresh memory, not
/// into a zeroed buffer: clearing it first cost as much as the loop.
#[inline(always)]
fn rescale_into<const FLIP: bool>(data: &[u8], a: Rescale) -> Vec<u16> {
    let n = data.len() / 2;
    let mut out = Vec::with_capacity(n);
    for (o, c) in out.spare_capacity_mut()[..n].iter_mut().zip(data.chunks_exact(2)) {
        let x = i32::from((u16::from_le_bytes([c[0], c[1]]) >> a.shift) & a.mask);
        let stored = (x << a.up) >> a.up;
        let p = (stored + a.add).clamp(0, 65535);
        o.write((if FLIP { a.flip - p } else { p }) as u16);
    }
    // SAFETY: the loop wrote all `n` values (`data` holds `n` whole pairs), within capacity.
    unsafe { out.set_len(n) };
    out
}

/// 1-bit pixels (bit 0 of the first byte is the first pixel): 0 and 1 become 0 and 255 in
/// 8-bit gray (255 and 0 for MONOCHROME1), scale 1/255.
fn one_bit(frames: &[&[u8]], l: &Layout) -> Result<Converted, bs_imaging::ImagingError> {
    let inverted = l.photometric == "MONOCHROME1";
    let pixels = l.rows * l.cols;
    let mut images = Vec::with_capacity(frames.len());
    for d in frames {
        let out = (0..pixels)
            .map(|i| {
                let bit = (d[i / 8] >> (i % 8)) & 1 == 1;
                if bit != inverted { 255 } else { 0 }
            })
            .collect();
        images.push(DynImage::U8(Image::from_vec(l.cols, l.rows, 1, out)?));
    }
    let offset = if inverted { 255.0 } else { 0.0 };
    Ok((images, Some(Mapping { offset, inverted, scale: 1.0 / 255.0 })))
}

/// Modality value of sample `i` of a 32-bit integer or float frame (`NaN` for a float that is
/// not a number).
fn wide_value(l: &Layout, data: &[u8], i: usize) -> f64 {
    let v = if l.float && l.bits_allocated == 64 {
        f64::from_le_bytes(data[8 * i..8 * i + 8].try_into().expect("8 bytes"))
    } else if l.float {
        f64::from(f32::from_le_bytes(data[4 * i..4 * i + 4].try_into().expect("4 bytes")))
    } else {
        l.stored(l.raw(data, i)) as f64
    };
    v * l.slope + l.intercept
}

/// 32-bit integer and float grayscale to 16-bit over the range the frames actually use (one
/// mapping for all frames): integer values that span at most 65,536 keep their steps (scale
/// 1); wider or fractional ones are spread over 0..=65535. Values that are not numbers show as
/// the lowest.
fn wide_gray(frames: &[&[u8]], l: &Layout) -> Result<Converted, bs_imaging::ImagingError> {
    let pixels = l.rows * l.cols;
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for d in frames {
        for i in 0..pixels {
            let m = wide_value(l, d, i);
            if m.is_finite() {
                lo = lo.min(m);
                hi = hi.max(m);
            }
        }
    }
    if lo > hi {
        (lo, hi) = (0.0, 0.0);
    }
    let integral = !l.float && l.slope.fract() == 0.0 && l.intercept.fract() == 0.0;
    let (scale, shift) = if integral && hi - lo <= 65535.0 {
        (1.0, if lo >= 0.0 && hi <= 65535.0 { 0.0 } else { -lo })
    } else if hi > lo {
        let scale = (hi - lo) / 65535.0;
        (scale, -lo / scale)
    } else {
        (1.0, -lo)
    };
    let inverted = l.photometric == "MONOCHROME1";
    let to_pixel =
        |m: f64| if m.is_finite() { (m / scale + shift).round().clamp(0.0, 65535.0) } else { 0.0 };
    let (p_lo, p_hi) = (to_pixel(lo), to_pixel(hi));
    let mut images = Vec::with_capacity(frames.len());
    for d in frames {
        let out = (0..pixels)
            .map(|i| {
                let p = to_pixel(wide_value(l, d, i));
                (if inverted { p_lo + p_hi - p } else { p }) as u16
            })
            .collect();
        images.push(DynImage::U16(Image::from_vec(l.cols, l.rows, 1, out)?));
    }
    let offset = if inverted { p_lo + p_hi - shift } else { shift };
    Ok((images, Some(Mapping { offset, inverted, scale })))
}

fn palette(data: &[u8], l: &Layout, p: &Palette) -> Result<DynImage, ImageIoError> {
    let wrap = |e: bs_imaging::ImagingError| ImageIoError::corrupt(DICOM, e.to_string());
    let last = p.red.len().min(p.green.len()).min(p.blue.len()) as i64 - 1;
    let pixels = l.rows * l.cols;
    let entry = |i: usize| (l.stored(l.raw(data, i)) - p.first).clamp(0, last) as usize;
    if p.bits == 8 {
        let mut out = Vec::with_capacity(pixels * 3);
        for i in 0..pixels {
            let e = entry(i);
            out.extend([p.red[e], p.green[e], p.blue[e]].map(|v| v as u8));
        }
        Ok(DynImage::U8(Image::from_vec(l.cols, l.rows, 3, out).map_err(wrap)?))
    } else {
        let mut out = Vec::with_capacity(pixels * 3);
        for i in 0..pixels {
            let e = entry(i);
            out.extend([p.red[e], p.green[e], p.blue[e]]);
        }
        Ok(DynImage::U16(Image::from_vec(l.cols, l.rows, 3, out).map_err(wrap)?))
    }
}

fn color(data: &[u8], l: &Layout) -> Result<DynImage, ImageIoError> {
    let (w, h) = (l.cols, l.rows);
    let pixels = w * h;
    let wrap = |e: bs_imaging::ImagingError| ImageIoError::corrupt(DICOM, e.to_string());
    // 8-bit RGB as stored (what every colour codec here decodes to, and most uncompressed
    // colour): the samples are the pixels, interleaved or planes to interleave. The general
    // path below, a sample at a time, took 70% of a colour JPEG frame's decode.
    if l.bits_allocated == 8
        && (l.bits_stored, l.high_bit, l.signed) == (8, 7, false)
        && l.photometric == "RGB"
    {
        let out = if l.planar {
            let (r, rest) = data[..3 * pixels].split_at(pixels);
            let (g, b) = rest.split_at(pixels);
            r.iter().zip(g).zip(b).flat_map(|((&r, &g), &b)| [r, g, b]).collect()
        } else {
            data[..3 * pixels].to_vec()
        };
        return Ok(DynImage::U8(Image::from_vec(w, h, 3, out).map_err(wrap)?));
    }
    // Sample c of pixel i, as stored value.
    let sample = |i: usize, c: usize| -> u64 {
        let index = if l.is_ybr_422() {
            // Y1 Y2 Cb Cr for each pair of pixels.
            let pair = i / 2;
            if c == 0 { pair * 4 + i % 2 } else { pair * 4 + 1 + c }
        } else if l.planar {
            c * pixels + i
        } else {
            i * 3 + c
        };
        l.stored(l.raw(data, index)) as u64
    };
    let ybr = l.photometric.starts_with("YBR_FULL");
    let max = (1u64 << l.bits_stored) - 1;
    let mut out = Vec::with_capacity(pixels * 3);
    for i in 0..pixels {
        let s = [0, 1, 2].map(|c| sample(i, c));
        out.extend(if ybr { ybr_full_to_rgb(s, max) } else { s });
    }
    if l.bits_allocated == 8 {
        let out = out.into_iter().map(|v| v as u8).collect();
        Ok(DynImage::U8(Image::from_vec(w, h, 3, out).map_err(wrap)?))
    } else {
        let out = out.into_iter().map(|v| v as u16).collect();
        Ok(DynImage::U16(Image::from_vec(w, h, 3, out).map_err(wrap)?))
    }
}

/// YBR_FULL (PS3.3 C.7.6.3.1.2, the JPEG/JFIF full-range YCbCr) to RGB, for samples of
/// `0..=max`.
fn ybr_full_to_rgb([y, cb, cr]: [u64; 3], max: u64) -> [u64; 3] {
    let mid = (max + 1) as f64 / 2.0;
    let (y, cb, cr) = (y as f64, cb as f64 - mid, cr as f64 - mid);
    let r = y + 1.402 * cr;
    let g = y - 0.344_136 * cb - 0.714_136 * cr;
    let b = y + 1.772 * cb;
    [r, g, b].map(|v| v.round().clamp(0.0, max as f64) as u64)
}

/// A MONOCHROME2 frame of `rows` × `cols` unsigned samples of `bits` bits, without rescale:
/// the layout codec tests decode into.
#[cfg(test)]
pub(crate) fn grey_layout(rows: usize, cols: usize, bits: u16) -> Layout {
    Layout {
        rows,
        cols,
        samples_per_pixel: 1,
        bits_allocated: if bits > 8 { 16 } else { 8 },
        bits_stored: bits,
        high_bit: bits - 1,
        signed: false,
        planar: false,
        photometric: "MONOCHROME2".into(),
        slope: 1.0,
        intercept: 0.0,
        float: false,
        palette: None,
    }
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
            float: false,
            palette: None,
        }
    }

    #[test]
    fn whole_number_rescale_matches_the_table_for_every_bit_pattern() {
        // Every 16-bit pattern, through the addition and through the general formula.
        let data: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
        for (bits, high, signed, intercept, pi) in [
            (12, 11, false, -1024.0, "MONOCHROME2"),
            (12, 11, true, 0.0, "MONOCHROME2"),
            (12, 13, true, -1024.0, "MONOCHROME2"),
            (16, 15, true, 0.0, "MONOCHROME2"),
            (16, 15, false, -1024.0, "MONOCHROME2"),
            (16, 15, false, 0.0, "MONOCHROME1"),
            (10, 9, true, 3000.0, "MONOCHROME1"),
            (16, 15, true, -32768.0, "MONOCHROME2"),
        ] {
            let mut l = layout(16, bits, signed, pi);
            (l.rows, l.cols, l.high_bit, l.intercept) = (256, 256, high, intercept);
            let (img, mapping) = gray(&data, &l).unwrap();
            let DynImage::U16(img) = img else { panic!("16-bit") };
            // The definition: m = stored + intercept, p = m + offset, mirrored for MONOCHROME1.
            let (lo, hi) = l.stored_range();
            let (m_lo, m_hi) = (lo as f64 + intercept, hi as f64 + intercept);
            let offset = if m_lo >= 0.0 && m_hi <= 65535.0 { 0.0 } else { -m_lo };
            // The baseline build of the loop gives the same as the one this CPU ran.
            let mirror = pi == "MONOCHROME1";
            let a = Rescale {
                shift: u32::from(high + 1 - bits),
                mask: ((1u32 << bits) - 1) as u16,
                up: if signed { 32 - u32::from(bits) } else { 0 },
                add: (intercept + offset) as i32,
                flip: (m_lo + m_hi + 2.0 * offset) as i32,
            };
            let base = rescale_any(&data, a, mirror);
            assert_eq!(base, img.data, "baseline build, {bits} bits at {high}, {pi}");
            for (raw, &p) in (0..=u16::MAX).zip(&img.data) {
                let want =
                    (l.stored(u64::from(raw)) as f64 + intercept + offset).clamp(0.0, 65535.0);
                let want = if pi == "MONOCHROME1" {
                    (m_lo + offset).clamp(0.0, 65535.0) + (m_hi + offset).clamp(0.0, 65535.0) - want
                } else {
                    want
                };
                assert_eq!(
                    f64::from(p),
                    want,
                    "{bits} bits at {high}, signed {signed}, {intercept}, {pi}: raw {raw}"
                );
                // The mapping reported gives the modality value back.
                let m = if mapping.inverted {
                    mapping.offset - f64::from(p)
                } else {
                    f64::from(p) - mapping.offset
                };
                assert_eq!(m, l.stored(u64::from(raw)) as f64 + intercept);
            }
        }
    }

    /// One frame through [`convert`], its mapping as `(offset, inverted)` (scale 1).
    fn convert1(data: &[u8], l: &Layout) -> Result<(DynImage, Option<(f64, bool)>), ImageIoError> {
        let (mut images, map) = convert(&[data], l)?;
        if let Some(m) = map {
            assert_eq!(m.scale, 1.0);
        }
        Ok((images.remove(0), map.map(|m| (m.offset, m.inverted))))
    }

    fn le16(v: &[u16]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn eight_bit_identity_and_monochrome1() {
        let l = layout(8, 8, false, "MONOCHROME2");
        let (img, map) = convert1(&[0, 1, 128, 255], &l).unwrap();
        assert_eq!(img, DynImage::U8(Image::from_vec(4, 1, 1, vec![0, 1, 128, 255]).unwrap()));
        assert_eq!(map, Some((0.0, false)));
        let l = layout(8, 8, false, "MONOCHROME1");
        let (img, map) = convert1(&[0, 1, 128, 255], &l).unwrap();
        assert_eq!(img, DynImage::U8(Image::from_vec(4, 1, 1, vec![255, 254, 127, 0]).unwrap()));
        assert_eq!(map, Some((255.0, true)));
    }

    #[test]
    fn twelve_bit_masks_unused_high_bits() {
        let l = layout(16, 12, false, "MONOCHROME2");
        let (img, _) = convert1(&le16(&[0xF000, 0x0FFF, 0x1001, 5]), &l).unwrap();
        assert_eq!(img, DynImage::U16(Image::from_vec(4, 1, 1, vec![0, 4095, 1, 5]).unwrap()));
    }

    #[test]
    fn signed_values_shift_into_u16() {
        // Signed 16-bit CT with intercept -1024: m ranges over -33792..=31743, offset 33792.
        let mut l = layout(16, 16, true, "MONOCHROME2");
        l.intercept = -1024.0;
        let stored: [i16; 4] = [-2000, 0, 1024, 3071];
        let data: Vec<u8> = stored.iter().flat_map(|v| v.to_le_bytes()).collect();
        let (img, map) = convert1(&data, &l).unwrap();
        let DynImage::U16(img) = img else { panic!("16-bit expected") };
        assert_eq!(map, Some((33792.0, false)));
        let hu: Vec<f64> = img.data.iter().map(|&p| f64::from(p) - 33792.0).collect();
        assert_eq!(hu, [-3024.0, -1024.0, 0.0, 2047.0]);
        // 12-bit signed: sign bit 11.
        let l = layout(16, 12, true, "MONOCHROME2");
        let (img, map) = convert1(&le16(&[0x0800, 0x07FF, 0x0FFF, 0]), &l).unwrap();
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
        let (img, map) = convert1(&le16(&[0, 1, 255, 100]), &l).unwrap();
        assert_eq!(map, Some((530.0, true)));
        assert_eq!(img, DynImage::U16(Image::from_vec(4, 1, 1, vec![520, 518, 10, 320]).unwrap()));
    }

    #[test]
    fn planar_rgb_and_ybr() {
        let mut l = layout(8, 8, false, "RGB");
        l.samples_per_pixel = 3;
        l.cols = 2;
        l.planar = true;
        let (img, map) = convert1(&[1, 2, 3, 4, 5, 6], &l).unwrap();
        assert_eq!(map, None);
        assert_eq!(img, DynImage::U8(Image::from_vec(2, 1, 3, vec![1, 3, 5, 2, 4, 6]).unwrap()));
        l.planar = false;
        l.photometric = "YBR_FULL".into();
        let (img, _) = convert1(&[128, 128, 128, 255, 128, 128], &l).unwrap();
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
        assert!(convert1(&[0; 3], &layout(8, 8, false, "MONOCHROME2")).is_err()); // short
        assert!(convert1(&[0; 8], &layout(8, 8, false, "PALETTE COLOR")).is_err()); // no LUT
        let mut l = layout(16, 16, false, "MONOCHROME2");
        l.bits_allocated = 24;
        assert!(matches!(convert1(&[0; 16], &l), Err(ImageIoError::Unsupported { .. })));
        let mut l = layout(16, 16, false, "MONOCHROME2");
        l.float = true;
        assert!(matches!(convert1(&[0; 16], &l), Err(ImageIoError::Corrupt { .. })));
        let mut l = layout(8, 8, false, "YBR_FULL_422");
        l.samples_per_pixel = 3;
        l.cols = 3;
        assert!(matches!(convert1(&[0; 16], &l), Err(ImageIoError::Unsupported { .. })));
        let mut l = layout(8, 8, false, "YBR_PARTIAL_420");
        l.samples_per_pixel = 3;
        assert!(matches!(convert1(&[0; 16], &l), Err(ImageIoError::Unsupported { .. })));
        let mut l = layout(16, 12, false, "MONOCHROME2");
        l.high_bit = 16;
        assert!(convert1(&[0; 8], &l).is_err());
        let mut l = layout(16, 12, false, "MONOCHROME2");
        l.slope = f64::NAN;
        assert!(convert1(&[0; 8], &l).is_err());
        let mut l = layout(8, 8, false, "MONOCHROME2");
        l.rows = 0;
        assert!(convert1(&[], &l).is_err());
    }

    #[test]
    fn one_bit_frames_unpack_lsb_first() {
        let mut l = layout(8, 8, false, "MONOCHROME2");
        (l.bits_allocated, l.bits_stored, l.high_bit, l.cols, l.rows) = (1, 1, 0, 5, 2);
        assert_eq!(l.frame_bits(), Some(10));
        // 10 pixels: bits 0..9 of 0b10_0000_0101 (0x05, 0x02).
        let (images, map) = convert(&[&[0x05, 0x02]], &l).unwrap();
        let px = [255, 0, 255, 0, 0, 0, 0, 0, 0, 255];
        assert_eq!(images, vec![DynImage::U8(Image::from_vec(5, 2, 1, px.to_vec()).unwrap())]);
        let m = map.unwrap();
        assert_eq!((m.offset, m.inverted), (0.0, false));
        assert!((m.scale - 1.0 / 255.0).abs() < 1e-12);
        l.photometric = "MONOCHROME1".into();
        let (images, _) = convert(&[&[0x05, 0x02]], &l).unwrap();
        let DynImage::U8(img) = &images[0] else { panic!("8-bit") };
        assert_eq!(img.data, px.map(|p| 255 - p));
    }

    #[test]
    fn thirty_two_bit_integers_keep_their_steps_or_spread() {
        let mut l = layout(8, 8, true, "MONOCHROME2");
        (l.bits_allocated, l.bits_stored, l.high_bit) = (32, 32, 31);
        let le32 = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        // A narrow range (−100..=900) keeps integer steps: offset 100, scale 1.
        let a = le32(&[-100, 0, 500, 900]);
        let (images, map) = convert(&[&a], &l).unwrap();
        let m = map.unwrap();
        assert_eq!((m.offset, m.scale), (100.0, 1.0));
        assert_eq!(
            images[0],
            DynImage::U16(Image::from_vec(4, 1, 1, vec![0, 100, 600, 1000]).unwrap())
        );
        // Two frames share one mapping; a wide range is spread over 0..=65535.
        let b = le32(&[-2_000_000_000, 0, 2_000_000_000, 1]);
        let (images, map) = convert(&[&a, &b], &l).unwrap();
        let m = map.unwrap();
        assert_eq!(images.len(), 2);
        let DynImage::U16(second) = &images[1] else { panic!("16-bit") };
        assert_eq!((second.data[0], second.data[2]), (0, 65535));
        let value = |p: u16| (f64::from(p) - m.offset) * m.scale;
        assert!((value(second.data[0]) + 2e9).abs() < 1.0);
        assert!((value(second.data[2]) - 2e9).abs() < 1.0);
        assert!(value(second.data[1]).abs() <= m.scale);
    }

    #[test]
    fn float_pixels_map_linearly_and_nan_is_lowest() {
        let mut l = layout(8, 8, false, "MONOCHROME2");
        (l.bits_allocated, l.float) = (32, true);
        let data: Vec<u8> =
            [0.0f32, 0.25, 1.0, f32::NAN].iter().flat_map(|x| x.to_le_bytes()).collect();
        let (images, map) = convert(&[&data], &l).unwrap();
        let m = map.unwrap();
        let DynImage::U16(img) = &images[0] else { panic!("16-bit") };
        assert_eq!(img.data, vec![0, 16384, 65535, 0]);
        assert!(((f64::from(img.data[1]) - m.offset) * m.scale - 0.25).abs() < 1e-4);
        l.bits_allocated = 64;
        let data: Vec<u8> = [-1.0f64, 1.0, 0.0, 0.5].iter().flat_map(|x| x.to_le_bytes()).collect();
        let (images, _) = convert(&[&data], &l).unwrap();
        let DynImage::U16(img) = &images[0] else { panic!("16-bit") };
        assert_eq!((img.data[0], img.data[1]), (0, 65535));
    }

    #[test]
    fn palette_color_looks_up_each_value() {
        let mut l = layout(8, 8, false, "PALETTE COLOR");
        l.palette = Some(Palette {
            first: 10,
            red: vec![0, 100, 200],
            green: vec![1, 101, 201],
            blue: vec![2, 102, 202],
            bits: 8,
        });
        // 5 and 10 map to entry 0, 11 to 1, 200 past the end to the last.
        let (img, map) = convert1(&[5, 10, 11, 200], &l).unwrap();
        assert_eq!(map, None);
        let want = vec![0, 1, 2, 0, 1, 2, 100, 101, 102, 200, 201, 202];
        assert_eq!(img, DynImage::U8(Image::from_vec(4, 1, 3, want).unwrap()));
        let mut l = layout(16, 16, false, "PALETTE COLOR");
        l.palette = Some(Palette {
            first: 0,
            red: vec![0, 65535],
            green: vec![7, 8],
            blue: vec![9, 10],
            bits: 16,
        });
        let (img, _) = convert1(&le16(&[1, 0, 1, 1]), &l).unwrap();
        let DynImage::U16(img) = img else { panic!("16-bit") };
        assert_eq!(&img.data[..6], &[65535, 8, 10, 0, 7, 9]);
    }

    #[test]
    fn ybr_full_422_and_16_bit_ybr_full() {
        let mut l = layout(8, 8, false, "YBR_FULL_422");
        (l.samples_per_pixel, l.cols) = (3, 2);
        assert_eq!(l.frame_bytes(), Some(4));
        // Y1 Y2 Cb Cr: grey 100 and grey 200.
        let (img, _) = convert1(&[100, 200, 128, 128], &l).unwrap();
        let want = vec![100, 100, 100, 200, 200, 200];
        assert_eq!(img, DynImage::U8(Image::from_vec(2, 1, 3, want).unwrap()));
        let mut l = layout(16, 16, false, "YBR_FULL");
        (l.samples_per_pixel, l.cols) = (3, 1);
        let (img, _) = convert1(&le16(&[1000, 32768, 32768]), &l).unwrap();
        assert_eq!(img, DynImage::U16(Image::from_vec(1, 1, 3, vec![1000; 3]).unwrap()));
    }
}
