//! DICOM Part 10 input through dicom-rs (dicom-object to parse, dicom-pixeldata for JPEG).
//!
//! # What is read
//!
//! A file is recognised by "DICM" at offset 128 (or at 0 when the preamble is missing). Before
//! dicom-object parses it, the `scan` module walks its element structure and refuses lengths longer than
//! the input, so parsing never allocates more than the input's size; then Rows × Columns is
//! checked against [`Limits`] before any pixel buffer is made. Only the first frame of a
//! multi-frame image is decoded ([`ImageMeta::number_of_frames`] says how many there are,
//! [`ImageMeta::frames_decoded`] is 1).
//!
//! Transfer syntaxes decoded:
//!
//! - Implicit VR Little Endian, Explicit VR Little Endian, Explicit VR Big Endian (retired),
//!   Deflated Explicit VR Little Endian (inflated with a cap of `max_bytes`), Encapsulated
//!   Uncompressed Explicit VR Little Endian, Deflated Image Frame Compression: native samples,
//!   read here from the Pixel Data element.
//! - RLE Lossless: decoded by this crate's `rle` module (dicom-rs's RLE reader panics on
//!   corrupt input).
//! - JPEG Baseline (Process 1), JPEG Extended (Process 2 & 4, 8-bit only), JPEG Lossless
//!   (Process 14) and JPEG Lossless SV1: dicom-pixeldata with the pure-Rust `jpeg-decoder`,
//!   after checking that the JPEG frame header agrees with Rows, Columns and Samples per Pixel.
//!
//! Everything else (JPEG 2000 and HTJ2K, JPEG-LS, JPEG XL, MPEG/H.264/HEVC video, JPIP, unknown
//! UIDs) fails with [`ImageIoError::UnsupportedTransferSyntax`] naming the UID and its name,
//! right after the file meta group is read.
//!
//! # Conversion policy
//!
//! Grayscale (MONOCHROME1, MONOCHROME2), for each sample:
//!
//! 1. the stored value is taken from bits `High Bit − Bits Stored + 1 ..= High Bit` and sign
//!    extended when Pixel Representation is 1 (signed);
//! 2. **rescale first**: the modality value `m = stored × Rescale Slope + Rescale Intercept`
//!    (slope 1 and intercept 0 when absent), rounded to an integer;
//! 3. **signed or negative values are shifted into u16**: over the whole range of values the
//!    header allows, if `m` can fall outside `0..=65535` every value gets `offset = −min(m)`
//!    added (CT signed 16-bit with intercept −1024: offset 33792; unsigned 12-bit with
//!    intercept −1024: offset 1024, so pixels equal the stored values); otherwise offset 0.
//!    A slope whose range does not fit is clamped into `0..=65535`;
//! 4. **MONOCHROME1 is inverted** over that range (`p' = p_min + p_max − p`), so that high
//!    values are bright as in MONOCHROME2.
//!
//! The result is 16-bit gray, except that 8-bit unsigned data without rescale stays 8-bit
//! (pixel = stored value, or `2^bits − 1 − value` for MONOCHROME1). Either way
//! [`ImageMeta::pixel_offset`] and [`ImageMeta::pixel_inverted`] record the mapping
//! (`p = offset + m`, or `p = offset − m` when inverted) and [`ImageMeta::modality_value`]
//! undoes it. The window stored in the file (first Window Center / Width) is reported in
//! [`ImageMeta`] and not applied to [`Decoded::image`]: [`apply_window`](crate::apply_window)
//! applies it (VOI LINEAR, PS3.3 C.11.2.1.2.1) to produce 8-bit for display.
//!
//! Colour: RGB with 8 or 16 bits (planar or interleaved) is returned as RGB8 / RGB16, masked to
//! Bits Stored; 8-bit YBR_FULL is converted to RGB; JPEG colour arrives as RGB from the decoder.
//! Rescale and window do not apply to colour. PALETTE COLOR, YBR_FULL_422 in native form,
//! signed colour and Bits Allocated other than 8 and 16 are refused as
//! [`ImageIoError::Unsupported`].

pub(crate) mod pixels;
pub(crate) mod rle;
pub(crate) mod scan;

use std::borrow::Cow;
use std::panic::AssertUnwindSafe;

use dicom_core::Tag;
use dicom_dictionary_std::tags;
use dicom_encoding::transfer_syntax::{Codec, TransferSyntax, TransferSyntaxIndex};
use dicom_object::file::ReadPreamble;
use dicom_object::{DefaultDicomObject, OpenFileOptions};
use dicom_pixeldata::PixelDecoder;
use dicom_transfer_syntax_registry::TransferSyntaxRegistry;

use crate::error::{ImageIoError, NO_FILE};
use crate::format::Format;
use crate::meta::{Decoded, ImageMeta, Limits};
use pixels::Layout;

const DICOM: Format = Format::Dicom;

const DEFLATED_EXPLICIT_VR_LE: &str = "1.2.840.10008.1.2.1.99";
const ENCAPSULATED_UNCOMPRESSED: &str = "1.2.840.10008.1.2.1.98";
const DEFLATED_IMAGE_FRAME: &str = "1.2.840.10008.1.2.8.1";
const RLE_LOSSLESS: &str = "1.2.840.10008.1.2.5";
const JPEG: [&str; 4] = [
    "1.2.840.10008.1.2.4.50", // Baseline (Process 1)
    "1.2.840.10008.1.2.4.51", // Extended (Process 2 & 4)
    "1.2.840.10008.1.2.4.57", // Lossless, Non-Hierarchical (Process 14)
    "1.2.840.10008.1.2.4.70", // Lossless, Non-Hierarchical, First-Order Prediction (SV1)
];

/// How the pixel data of a transfer syntax is turned into native samples.
#[derive(Debug, Clone, Copy, PartialEq)]
enum PixelCodec {
    /// Native samples in the Pixel Data element.
    Native,
    /// One native frame per fragment.
    EncapsulatedNative,
    /// One deflated native frame per fragment.
    DeflatedFrames,
    Rle,
    Jpeg,
}

/// Which transfer syntaxes this crate decodes, and how.
fn pixel_codec(ts: &TransferSyntax) -> Option<PixelCodec> {
    let uid = ts.uid();
    match ts.codec() {
        Codec::None => Some(PixelCodec::Native),
        Codec::Dataset(Some(_)) if uid == DEFLATED_EXPLICIT_VR_LE => Some(PixelCodec::Native),
        Codec::Dataset(_) => None,
        Codec::EncapsulatedPixelData(..) => match uid {
            ENCAPSULATED_UNCOMPRESSED => Some(PixelCodec::EncapsulatedNative),
            DEFLATED_IMAGE_FRAME => Some(PixelCodec::DeflatedFrames),
            RLE_LOSSLESS => Some(PixelCodec::Rle),
            _ if JPEG.contains(&uid) && ts.can_decode_all() => Some(PixelCodec::Jpeg),
            _ => None,
        },
    }
}

fn unsupported_ts(uid: &str, name: &str) -> ImageIoError {
    ImageIoError::UnsupportedTransferSyntax {
        file: NO_FILE.into(),
        uid: uid.to_string(),
        name: name.to_string(),
    }
}

/// Decode a DICOM Part 10 file.
pub(crate) fn decode(bytes: &[u8], limits: &Limits) -> Result<Decoded, ImageIoError> {
    let body = if bytes.get(128..132) == Some(b"DICM") { &bytes[128..] } else { bytes };
    let meta_info = scan::scan_meta(body)?;
    let uid = meta_info.ts_uid.as_str();
    let Some(ts) = TransferSyntaxRegistry.get(uid) else {
        return Err(unsupported_ts(uid, "unknown transfer syntax"));
    };
    let Some(codec) = pixel_codec(ts) else {
        return Err(unsupported_ts(ts.uid(), ts.name()));
    };
    let dataset = &body[meta_info.dataset_offset..];
    if ts.uid() == DEFLATED_EXPLICIT_VR_LE {
        let inflated = scan::inflate(dataset, limits.max_bytes, "data set")?;
        let explicit = TransferSyntaxRegistry
            .get("1.2.840.10008.1.2.1")
            .ok_or_else(|| unsupported_ts("1.2.840.10008.1.2.1", "Explicit VR Little Endian"))?;
        scan::scan_dataset(&inflated, explicit)?;
    } else {
        scan::scan_dataset(dataset, ts)?;
    }

    let obj = OpenFileOptions::new()
        .read_preamble(ReadPreamble::Never)
        .from_reader(body)
        .map_err(|e| parse_error(&e))?;

    let layout = layout(&obj)?;
    // Header values are untrusted: multiply without overflow (validated in full below).
    let bytes_per_pixel = (layout.samples_per_pixel as u64)
        .checked_mul(layout.bytes_per_sample() as u64)
        .ok_or_else(|| ImageIoError::corrupt(DICOM, "absurd Samples per Pixel"))?;
    limits.check(layout.cols as u64, layout.rows as u64, bytes_per_pixel)?;
    // What the samples look like once decoded: the JPEG decoder delivers colour as interleaved
    // RGB, and this crate's RLE decoder interleaves the planes.
    let decoded_layout = match codec {
        PixelCodec::Jpeg if layout.samples_per_pixel == 3 => {
            Layout { photometric: "RGB".into(), planar: false, ..layout.clone() }
        }
        PixelCodec::Jpeg | PixelCodec::Rle => Layout { planar: false, ..layout.clone() },
        _ => layout.clone(),
    };
    decoded_layout.validate()?;
    let frames = int(&obj, tags::NUMBER_OF_FRAMES).unwrap_or(1).max(1);
    let frame = frame_samples(&obj, &layout, codec, limits)?;
    let (image, mapping) = pixels::convert(&frame, &decoded_layout)?;

    let meta = ImageMeta {
        width: layout.cols as u32,
        height: layout.rows as u32,
        pixel_kind: image.kind().name().to_string(),
        bits_stored: layout.bits_stored,
        signed: layout.signed,
        photometric_interpretation: text(&obj, tags::PHOTOMETRIC_INTERPRETATION)
            .unwrap_or_else(|| "MONOCHROME2".into()),
        number_of_frames: u32::try_from(frames).unwrap_or(u32::MAX),
        frames_decoded: 1,
        patient_name: text(&obj, tags::PATIENT_NAME),
        patient_id: text(&obj, tags::PATIENT_ID),
        study_instance_uid: text(&obj, tags::STUDY_INSTANCE_UID),
        study_date: text(&obj, tags::STUDY_DATE),
        study_description: text(&obj, tags::STUDY_DESCRIPTION),
        series_instance_uid: text(&obj, tags::SERIES_INSTANCE_UID),
        series_number: text(&obj, tags::SERIES_NUMBER),
        series_description: text(&obj, tags::SERIES_DESCRIPTION),
        modality: text(&obj, tags::MODALITY),
        acquisition_date: text(&obj, tags::ACQUISITION_DATE),
        acquisition_time: text(&obj, tags::ACQUISITION_TIME),
        sop_instance_uid: text(&obj, tags::SOP_INSTANCE_UID),
        rescale_slope: float(&obj, tags::RESCALE_SLOPE),
        rescale_intercept: float(&obj, tags::RESCALE_INTERCEPT),
        window_center: float(&obj, tags::WINDOW_CENTER),
        window_width: float(&obj, tags::WINDOW_WIDTH),
        transfer_syntax_uid: Some(ts.uid().to_string()),
        transfer_syntax_name: Some(ts.name().to_string()),
        pixel_offset: mapping.map(|m| m.0),
        pixel_inverted: mapping.map(|m| m.1),
    };
    Ok(Decoded { image, format: DICOM, meta })
}

/// Map a dicom-object read error: a cut file is `Truncated`, anything else `Corrupt`.
fn parse_error(e: &dyn std::error::Error) -> ImageIoError {
    let mut reason = e.to_string();
    let mut cur = e.source();
    let mut eof = false;
    while let Some(err) = cur {
        reason.push_str(": ");
        reason.push_str(&err.to_string());
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            eof |= io.kind() == std::io::ErrorKind::UnexpectedEof;
        }
        cur = err.source();
    }
    if eof { ImageIoError::truncated(DICOM, reason) } else { ImageIoError::corrupt(DICOM, reason) }
}

fn text(obj: &DefaultDicomObject, tag: Tag) -> Option<String> {
    let value = obj.get(tag)?.to_str().ok()?;
    let value = value.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    (!value.is_empty()).then(|| value.to_string())
}

fn int(obj: &DefaultDicomObject, tag: Tag) -> Option<i64> {
    obj.get(tag)?.to_int::<i64>().ok()
}

/// The first value of a numeric attribute, if finite.
fn float(obj: &DefaultDicomObject, tag: Tag) -> Option<f64> {
    obj.get(tag)?.to_multi_float64().ok()?.first().copied().filter(|v| v.is_finite())
}

/// The image pixel module attributes.
fn layout(obj: &DefaultDicomObject) -> Result<Layout, ImageIoError> {
    let required = |tag: Tag, name: &str| -> Result<i64, ImageIoError> {
        int(obj, tag)
            .ok_or_else(|| ImageIoError::corrupt(DICOM, format!("missing or invalid {name} {tag}")))
    };
    let in_u16 = |v: i64, name: &str| -> Result<u16, ImageIoError> {
        u16::try_from(v)
            .map_err(|_| ImageIoError::corrupt(DICOM, format!("{name} {v} out of range")))
    };
    if obj.get(tags::PIXEL_DATA).is_none() {
        return Err(ImageIoError::corrupt(DICOM, "no Pixel Data: not an image"));
    }
    let rows = in_u16(required(tags::ROWS, "Rows")?, "Rows")?;
    let cols = in_u16(required(tags::COLUMNS, "Columns")?, "Columns")?;
    let bits_allocated =
        in_u16(required(tags::BITS_ALLOCATED, "Bits Allocated")?, "Bits Allocated")?;
    let bits_stored = match int(obj, tags::BITS_STORED) {
        Some(v) => in_u16(v, "Bits Stored")?,
        None => bits_allocated,
    };
    let high_bit = match int(obj, tags::HIGH_BIT) {
        Some(v) => in_u16(v, "High Bit")?,
        None => bits_stored.saturating_sub(1),
    };
    let samples = int(obj, tags::SAMPLES_PER_PIXEL).unwrap_or(1);
    let samples_per_pixel = usize::try_from(samples)
        .map_err(|_| ImageIoError::corrupt(DICOM, format!("Samples per Pixel {samples}")))?;
    Ok(Layout {
        rows: usize::from(rows),
        cols: usize::from(cols),
        samples_per_pixel,
        bits_allocated,
        bits_stored,
        high_bit,
        signed: int(obj, tags::PIXEL_REPRESENTATION) == Some(1),
        planar: int(obj, tags::PLANAR_CONFIGURATION) == Some(1),
        photometric: text(obj, tags::PHOTOMETRIC_INTERPRETATION).unwrap_or_default(),
        slope: float(obj, tags::RESCALE_SLOPE).unwrap_or(1.0),
        intercept: float(obj, tags::RESCALE_INTERCEPT).unwrap_or(0.0),
    })
}

/// The native little-endian samples of the first frame.
fn frame_samples<'a>(
    obj: &'a DefaultDicomObject,
    layout: &Layout,
    codec: PixelCodec,
    limits: &Limits,
) -> Result<Cow<'a, [u8]>, ImageIoError> {
    let need =
        layout.frame_bytes().ok_or_else(|| ImageIoError::corrupt(DICOM, "image too large"))?;
    let element = obj
        .get(tags::PIXEL_DATA)
        .ok_or_else(|| ImageIoError::corrupt(DICOM, "no Pixel Data: not an image"))?;
    let value = element.value();
    let first_fragment = || -> Result<&'a [u8], ImageIoError> {
        match obj.get(tags::PIXEL_DATA).and_then(|e| e.value().fragments()) {
            Some(fragments) => fragments.first().map(|f| f.as_slice()).ok_or_else(|| {
                ImageIoError::truncated(DICOM, "encapsulated pixel data has no fragments")
            }),
            None => Err(ImageIoError::corrupt(
                DICOM,
                "pixel data is not encapsulated as its transfer syntax requires",
            )),
        }
    };
    match codec {
        PixelCodec::Native => {
            if value.fragments().is_some() {
                return Err(ImageIoError::corrupt(
                    DICOM,
                    "encapsulated pixel data in a native transfer syntax",
                ));
            }
            let bytes =
                element.to_bytes().map_err(|e| ImageIoError::corrupt(DICOM, e.to_string()))?;
            if bytes.len() < need {
                return Err(ImageIoError::truncated(
                    DICOM,
                    format!("pixel data holds {} bytes, the first frame needs {need}", bytes.len()),
                ));
            }
            Ok(match bytes {
                Cow::Borrowed(b) => Cow::Borrowed(&b[..need]),
                Cow::Owned(mut v) => {
                    v.truncate(need);
                    Cow::Owned(v)
                }
            })
        }
        PixelCodec::EncapsulatedNative => Ok(Cow::Borrowed(first_fragment()?)),
        PixelCodec::DeflatedFrames => {
            // A frame may carry one padding byte; the cap keeps a deflate bomb out.
            let cap = limits.max_bytes.min(need as u64 + 2);
            Ok(Cow::Owned(scan::inflate(first_fragment()?, cap, "pixel data frame")?))
        }
        PixelCodec::Rle => Ok(Cow::Owned(rle::decode_frame(
            first_fragment()?,
            layout.rows,
            layout.cols,
            layout.samples_per_pixel,
            layout.bytes_per_sample(),
        )?)),
        PixelCodec::Jpeg => {
            check_jpeg_header(first_fragment()?, layout)?;
            let decoded = std::panic::catch_unwind(AssertUnwindSafe(|| {
                obj.decode_pixel_data_frame(0).map(|d| d.to_owned().into_data())
            }));
            match decoded {
                Ok(Ok(data)) => Ok(Cow::Owned(data)),
                Ok(Err(e)) => Err(ImageIoError::corrupt(DICOM, format!("JPEG pixel data: {e}"))),
                Err(_) => Err(ImageIoError::corrupt(DICOM, "JPEG pixel data: the decoder failed")),
            }
        }
    }
}

/// Check that the JPEG stream's frame header (SOF) agrees with the DICOM header, so that the
/// decoder's output fits the frame dicom-pixeldata allocates for it.
fn check_jpeg_header(stream: &[u8], layout: &Layout) -> Result<(), ImageIoError> {
    let bad = |reason: String| ImageIoError::corrupt(DICOM, format!("JPEG pixel data: {reason}"));
    if !stream.starts_with(&[0xFF, 0xD8]) {
        return Err(bad("no JPEG start-of-image marker".into()));
    }
    let mut i = 2;
    loop {
        // Skip to the next marker.
        while i < stream.len() && stream[i] != 0xFF {
            i += 1;
        }
        while i < stream.len() && stream[i] == 0xFF {
            i += 1;
        }
        let Some(&marker) = stream.get(i) else {
            return Err(ImageIoError::truncated(DICOM, "JPEG pixel data: no frame header"));
        };
        i += 1;
        if matches!(marker, 0x01 | 0xD0..=0xD8) {
            continue;
        }
        let len = match stream.get(i..i + 2) {
            Some(b) => usize::from(u16::from_be_bytes([b[0], b[1]])),
            None => return Err(ImageIoError::truncated(DICOM, "JPEG pixel data: cut in a header")),
        };
        let is_sof = matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
        if is_sof {
            let Some(sof) = stream.get(i + 2..i + 8) else {
                return Err(ImageIoError::truncated(DICOM, "JPEG pixel data: cut in frame header"));
            };
            let precision = u16::from(sof[0]);
            let height = usize::from(u16::from_be_bytes([sof[1], sof[2]]));
            let width = usize::from(u16::from_be_bytes([sof[3], sof[4]]));
            let components = usize::from(sof[5]);
            if (width, height, components) != (layout.cols, layout.rows, layout.samples_per_pixel) {
                return Err(bad(format!(
                    "the JPEG frame is {width}×{height} with {components} components, the DICOM \
                     header says {}×{} with {}",
                    layout.cols, layout.rows, layout.samples_per_pixel
                )));
            }
            if (precision > 8) != (layout.bits_allocated > 8) {
                return Err(bad(format!(
                    "{precision}-bit JPEG samples in {}-bit pixels",
                    layout.bits_allocated
                )));
            }
            return Ok(());
        }
        if marker == 0xDA || marker == 0xD9 {
            return Err(bad("no frame header before the scan".into()));
        }
        i += len;
    }
}
