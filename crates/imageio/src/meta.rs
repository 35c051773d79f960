//! What decoding yields: the pixels, the format they came from, and metadata ([`ImageMeta`])
//! flat enough to store as key/value pairs for search.

use std::collections::BTreeMap;

use bs_imaging::DynImage;
use serde::Serialize;

use crate::error::ImageIoError;
use crate::format::Format;

/// Size limits for decoding, checked from the file's header before full-size buffers are
/// allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most pixels (width × height) an image may have. Default 100 000 000.
    pub max_pixels: u64,
    /// Most bytes the input may have, and most bytes a decoder may allocate for decompressed
    /// data or the decoded image (all its frames). Default 1 GiB.
    pub max_bytes: u64,
    /// Most frames a multi-frame image may have. Default 100 000.
    pub max_frames: u64,
    /// Most frames decoded (at least 1); the rest are counted in `number_of_frames` but not
    /// decoded (`frames_decoded` says how many were). Default: all.
    pub max_frames_decoded: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_pixels: 100_000_000,
            max_bytes: 1 << 30,
            max_frames: 100_000,
            max_frames_decoded: u64::MAX,
        }
    }
}

impl Limits {
    /// No practical limit (for trusted input).
    pub fn none() -> Self {
        Self {
            max_pixels: u64::MAX,
            max_bytes: u64::MAX,
            max_frames: u64::MAX,
            max_frames_decoded: u64::MAX,
        }
    }

    /// Refuse `width × height` over `max_pixels`, and a decoded buffer of `bytes_per_pixel`
    /// per pixel over `max_bytes`.
    pub(crate) fn check(
        &self,
        width: u64,
        height: u64,
        bytes_per_pixel: u64,
    ) -> Result<(), ImageIoError> {
        let pixels = width.saturating_mul(height);
        if pixels > self.max_pixels {
            return Err(ImageIoError::too_large(width, height, self.max_pixels));
        }
        let bytes = pixels.saturating_mul(bytes_per_pixel);
        if bytes > self.max_bytes {
            return Err(ImageIoError::too_many_bytes(
                format!("decoded image of {bytes} bytes"),
                self.max_bytes,
            ));
        }
        Ok(())
    }

    /// Refuse `frames` frames of `width × height` whose decoded bytes together exceed
    /// `max_bytes`.
    pub(crate) fn check_frames(
        &self,
        width: u64,
        height: u64,
        bytes_per_pixel: u64,
        frames: u64,
    ) -> Result<(), ImageIoError> {
        let bytes =
            width.saturating_mul(height).saturating_mul(bytes_per_pixel).saturating_mul(frames);
        if bytes > self.max_bytes {
            return Err(ImageIoError::too_many_bytes(
                format!("{frames} decoded frames of {width}×{height} ({bytes} bytes)"),
                self.max_bytes,
            ));
        }
        Ok(())
    }

    pub(crate) fn check_input(&self, len: usize) -> Result<(), ImageIoError> {
        if len as u64 > self.max_bytes {
            return Err(ImageIoError::too_many_bytes(
                format!("input of {len} bytes"),
                self.max_bytes,
            ));
        }
        Ok(())
    }
}

/// A decoded image.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The image, or the first frame of a multi-frame image.
    pub image: DynImage,
    /// The frames after the first, in order (empty for single-frame images); each has the
    /// shape and pixel kind of [`Decoded::image`] and the same [`ImageMeta`] mapping.
    pub frames: Vec<DynImage>,
    pub format: Format,
    pub meta: ImageMeta,
}

impl Decoded {
    /// Frame `n` (0-based: [`Decoded::image`] is frame 0), if the image has it.
    pub fn frame(&self, n: usize) -> Option<&DynImage> {
        match n {
            0 => Some(&self.image),
            n => self.frames.get(n - 1),
        }
    }

    /// How many frames were decoded.
    pub fn frame_count(&self) -> usize {
        self.frames.len() + 1
    }
}

/// Metadata of a decoded image. The first block is filled for every format; the DICOM fields
/// are `None` for other formats (and when the file lacks the attribute). Serialises flat, with
/// absent fields left out; [`ImageMeta::to_map`] gives the same as strings.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ImageMeta {
    pub width: u32,
    pub height: u32,
    /// Layout of the decoded pixels: gray8, gray16, rgb8, rgb16, rgba8 or rgba16.
    pub pixel_kind: String,
    /// Significant bits per sample in the file (12 for most CT, 8 for a PNG of RGB8).
    pub bits_stored: u16,
    /// Whether the file stores signed samples (DICOM Pixel Representation 1).
    pub signed: bool,
    /// As in DICOM: MONOCHROME1, MONOCHROME2, RGB, YBR_FULL, ... For other formats MONOCHROME2
    /// for gray and RGB for colour (with or without alpha).
    pub photometric_interpretation: String,
    /// Frames in the file (DICOM Number of Frames; an animated GIF's frames; a TIFF's pages
    /// that are frames of its first, see the `raster` module; 1 for other formats).
    pub number_of_frames: u32,
    /// Frames decoded: [`Decoded::image`] and [`Decoded::frames`] (all of them).
    pub frames_decoded: u32,

    #[serde(skip_serializing_if = "Option::is_none")]
    pub patient_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patient_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub study_instance_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub study_date: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub study_description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series_instance_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series_number: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub series_description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modality: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquisition_date: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquisition_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sop_instance_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sop_class_uid: Option<String>,
    /// Worklist attributes (DICOM): Accession Number, Body Part Examined, Study Time, Patient's
    /// Birth Date and Sex, Study ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accession_number: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_part_examined: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub study_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patient_birth_date: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patient_sex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub study_id: Option<String>,
    /// Where the instance sits in its series: Instance Number, Slice Location, Image
    /// Position (Patient) x\y\z and Image Orientation (Patient) row and column cosines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_number: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slice_location: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_position_patient: Option<[f64; 3]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_orientation_patient: Option<[f64; 6]>,
    /// Rescale Slope as stored (the decoded pixels already have it applied).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rescale_slope: Option<f64>,
    /// Rescale Intercept as stored (the decoded pixels already have it applied).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rescale_intercept: Option<f64>,
    /// First Window Center, in modality units (after rescale).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_center: Option<f64>,
    /// First Window Width, in modality units.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_width: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer_syntax_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer_syntax_name: Option<String>,
    /// DICOM grayscale only: how a decoded pixel value `p` relates to the modality value `m`
    /// (stored value × slope + intercept): `m = (p − pixel_offset) × scale`, or
    /// `m = (pixel_offset − p) × scale` when [`pixel_inverted`](Self::pixel_inverted)
    /// (MONOCHROME1), with `scale` [`pixel_scale`](Self::pixel_scale) or 1. See
    /// [`modality_value`](Self::modality_value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pixel_offset: Option<f64>,
    /// DICOM grayscale only: true when MONOCHROME1 values were inverted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pixel_inverted: Option<bool>,
    /// DICOM grayscale only, when not 1: modality units per pixel step (32-bit and float
    /// samples spread over 16 bits; 1/255 for 1-bit samples shown as 0 and 255).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pixel_scale: Option<f64>,
}

impl ImageMeta {
    /// The modality value (for CT, Hounsfield units) of a decoded grayscale pixel value, for
    /// DICOM grayscale images; `None` for other images.
    pub fn modality_value(&self, pixel: u32) -> Option<f64> {
        let offset = self.pixel_offset?;
        let p = f64::from(pixel);
        let steps = if self.pixel_inverted == Some(true) { offset - p } else { p - offset };
        Some(steps * self.pixel_scale.unwrap_or(1.0))
    }

    /// Every field that has a value, as strings, keyed by field name.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            m.insert(k.to_string(), v);
        };
        put("width", self.width.to_string());
        put("height", self.height.to_string());
        put("pixel_kind", self.pixel_kind.clone());
        put("bits_stored", self.bits_stored.to_string());
        put("signed", self.signed.to_string());
        put("photometric_interpretation", self.photometric_interpretation.clone());
        put("number_of_frames", self.number_of_frames.to_string());
        put("frames_decoded", self.frames_decoded.to_string());
        let texts = [
            ("patient_name", &self.patient_name),
            ("patient_id", &self.patient_id),
            ("study_instance_uid", &self.study_instance_uid),
            ("study_date", &self.study_date),
            ("study_description", &self.study_description),
            ("series_instance_uid", &self.series_instance_uid),
            ("series_number", &self.series_number),
            ("series_description", &self.series_description),
            ("modality", &self.modality),
            ("acquisition_date", &self.acquisition_date),
            ("acquisition_time", &self.acquisition_time),
            ("sop_instance_uid", &self.sop_instance_uid),
            ("sop_class_uid", &self.sop_class_uid),
            ("accession_number", &self.accession_number),
            ("body_part_examined", &self.body_part_examined),
            ("study_time", &self.study_time),
            ("patient_birth_date", &self.patient_birth_date),
            ("patient_sex", &self.patient_sex),
            ("study_id", &self.study_id),
            ("transfer_syntax_uid", &self.transfer_syntax_uid),
            ("transfer_syntax_name", &self.transfer_syntax_name),
        ];
        for (k, v) in texts {
            if let Some(v) = v {
                put(k, v.clone());
            }
        }
        let numbers = [
            ("rescale_slope", self.rescale_slope),
            ("rescale_intercept", self.rescale_intercept),
            ("window_center", self.window_center),
            ("window_width", self.window_width),
            ("pixel_offset", self.pixel_offset),
            ("pixel_scale", self.pixel_scale),
        ];
        for (k, v) in numbers {
            if let Some(v) = v {
                put(k, v.to_string());
            }
        }
        if let Some(v) = self.instance_number {
            put("instance_number", v.to_string());
        }
        if let Some(v) = self.slice_location {
            put("slice_location", v.to_string());
        }
        let joined = |v: &[f64]| v.iter().map(f64::to_string).collect::<Vec<_>>().join("\\");
        if let Some(v) = &self.image_position_patient {
            put("image_position_patient", joined(v));
        }
        if let Some(v) = &self.image_orientation_patient {
            put("image_orientation_patient", joined(v));
        }
        if let Some(v) = self.pixel_inverted {
            put("pixel_inverted", v.to_string());
        }
        m
    }
}
