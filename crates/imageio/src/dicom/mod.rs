//! DICOM Part 10 input through dicom-rs (dicom-object to parse, dicom-pixeldata for JPEG).
//!
//! # What is read
//!
//! A file is recognised by "DICM" at offset 128 (or at 0 when the preamble is missing). Before
//! dicom-object parses it, the `scan` module walks its element structure and refuses lengths longer than
//! the input, so parsing never allocates more than the input's size; then Rows × Columns is
//! checked against [`Limits`] before any pixel buffer is made. Every frame of a multi-frame
//! image is decoded ([`Decoded::image`] is the first, [`Decoded::frames`] the others), found by
//! the `frames` module.
//!
//! Transfer syntaxes decoded:
//!
//! - Implicit VR Little Endian, Explicit VR Little Endian, Explicit VR Big Endian (retired),
//!   Deflated Explicit VR Little Endian (inflated with a cap of `max_bytes`), Encapsulated
//!   Uncompressed Explicit VR Little Endian, Deflated Image Frame Compression: native samples,
//!   read here from the Pixel Data element.
//! - RLE Lossless: decoded by this crate's `rle` module (dicom-rs's RLE reader panics on
//!   corrupt input).
//! - JPEG Baseline (Process 1), JPEG Extended (Process 2 & 4), JPEG Lossless (Process 14, any
//!   predictor) and JPEG Lossless SV1: the `jpeg` module, after checking that the JPEG frame
//!   header agrees with Rows, Columns and Samples per Pixel: grey through libjpeg-turbo
//!   (`jpeg12`), lossless grey first through this crate's `jpeg_lossless`; colour through
//!   libjpeg-turbo where its colour rule is DICOM's, else the pure-Rust `jpeg-decoder`.
//!
//! - JPEG 2000 (lossless only, and lossy) and High-Throughput JPEG 2000 (HTJ2K: lossless,
//!   lossless RPCL, and lossy): the `j2k` module (`jpeg2k` over OpenJPEG), after checking the
//!   codestream's SIZ against the header.
//!
//! - JPEG-LS lossless and near-lossless: the `jpegls` module (one grey component in one scan
//!   by this crate's `jpegls_scan`, everything else by CharLS, the reference codec).
//!
//! Everything else (JPEG XL, MPEG/H.264/HEVC video, JPIP, unknown UIDs) fails with
//! [`ImageIoError::UnsupportedTransferSyntax`] ("unsupported: transfer syntax …") naming the
//! UID and its name, right after the file meta group is read. `docs/imaging.md` has the table.
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
//! (pixel = stored value, or `2^bits − 1 − value` for MONOCHROME1). 32-bit integer and float
//! samples (Float Pixel Data, Double Float Pixel Data) become 16-bit over the range the frames
//! use, with a scale when that range is wider than 65,536 steps or fractional; 1-bit samples
//! become 0 and 255 (scale 1/255). Either way [`ImageMeta::pixel_offset`],
//! [`ImageMeta::pixel_scale`] and [`ImageMeta::pixel_inverted`] record the mapping
//! (`m = (p − offset) × scale`, or `(offset − p) × scale` when inverted) and
//! [`ImageMeta::modality_value`] undoes it. The window stored in the file (first Window Center / Width) is reported in
//! [`ImageMeta`] and not applied to [`Decoded::image`]: [`apply_window`](crate::apply_window)
//! applies it (VOI LINEAR, PS3.3 C.11.2.1.2.1) to produce 8-bit for display.
//!
//! Colour: RGB with 8 or 16 bits (planar or interleaved) is returned as RGB8 / RGB16, masked to
//! Bits Stored; YBR_FULL and YBR_FULL_422 are converted to RGB; PALETTE COLOR is looked up in
//! its tables (RGB8 for 8-bit entries, RGB16 for 16-bit); JPEG colour arrives as RGB from the
//! decoder. Rescale and window do not apply to colour. Segmented palettes, signed colour,
//! colour with 1- or 32-bit samples and Bits Allocated other than 1, 8, 16, 32 (64 for double
//! floats) are refused as [`ImageIoError::Unsupported`], never as corrupt.

mod entropy_bits;
pub(crate) mod frames;
pub(crate) mod j2k;
pub(crate) mod jpeg;
pub mod jpeg12;
mod jpeg_lossless;
mod jpeg_markers;
pub(crate) mod jpegls;
mod jpegls_scan;
pub(crate) mod pixels;
pub(crate) mod rle;
pub(crate) mod scan;
mod sr;

use std::borrow::Cow;

use dicom_core::Tag;
use dicom_dictionary_std::tags;
use dicom_encoding::Endianness;
use dicom_encoding::transfer_syntax::{Codec, TransferSyntax, TransferSyntaxIndex};
use dicom_object::file::ReadPreamble;
use dicom_object::{DefaultDicomObject, OpenFileOptions};
use dicom_transfer_syntax_registry::TransferSyntaxRegistry;

use crate::error::{ImageIoError, NO_FILE};
use crate::format::Format;
use crate::meta::{Decoded, ImageMeta, Limits};
use frames::StartMarker;
use pixels::{Layout, Palette};

const DICOM: Format = Format::Dicom;

const DEFLATED_EXPLICIT_VR_LE: &str = "1.2.840.10008.1.2.1.99";
const ENCAPSULATED_UNCOMPRESSED: &str = "1.2.840.10008.1.2.1.98";
const DEFLATED_IMAGE_FRAME: &str = "1.2.840.10008.1.2.8.1";
const RLE_LOSSLESS: &str = "1.2.840.10008.1.2.5";
const JPEG_2000: [&str; 5] = [
    "1.2.840.10008.1.2.4.90", // JPEG 2000 Image Compression (Lossless Only)
    "1.2.840.10008.1.2.4.91", // JPEG 2000 Image Compression
    // High-Throughput JPEG 2000 (ISO 15444-15): the same codestream syntax with HT code
    // blocks, which OpenJPEG (2.5 and later) decodes.
    "1.2.840.10008.1.2.4.201", // HTJ2K Image Compression (Lossless Only)
    "1.2.840.10008.1.2.4.202", // HTJ2K with RPCL Options Image Compression (Lossless Only)
    "1.2.840.10008.1.2.4.203", // HTJ2K Image Compression
];
const JPEG_LS: [&str; 2] = [
    "1.2.840.10008.1.2.4.80", // JPEG-LS Lossless
    "1.2.840.10008.1.2.4.81", // JPEG-LS Near-Lossless
];
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
    Jpeg2000,
    JpegLs,
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
            _ if JPEG.contains(&uid) => Some(PixelCodec::Jpeg),
            _ if JPEG_2000.contains(&uid) => Some(PixelCodec::Jpeg2000),
            _ if JPEG_LS.contains(&uid) => Some(PixelCodec::JpegLs),
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

/// The identifiers of a DICOM instance, read without touching its pixel data (so a file
/// whose pixels cannot be decoded is still identified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DicomIds {
    pub sop_class_uid: String,
    pub sop_instance_uid: String,
    pub study_instance_uid: String,
    pub series_instance_uid: String,
    pub transfer_syntax_uid: String,
    /// The patient, study and series attributes a worklist and a study search show, those of
    /// `DESCRIPTIVE` the file has, keyed as the fields of [`ImageMeta`] are.
    pub descriptive: std::collections::BTreeMap<String, String>,
}

/// The descriptive attributes [`dicom_ids`] reads, by their [`ImageMeta`] field names, so an
/// instance whose pixels cannot be decoded (a structured report, an encapsulated PDF) is
/// found by patient, date or modality as its study's images are.
const DESCRIPTIVE: &[(&str, Tag)] = &[
    ("patient_name", tags::PATIENT_NAME),
    ("patient_id", tags::PATIENT_ID),
    ("patient_birth_date", tags::PATIENT_BIRTH_DATE),
    ("patient_sex", tags::PATIENT_SEX),
    ("study_date", tags::STUDY_DATE),
    ("study_time", tags::STUDY_TIME),
    ("study_description", tags::STUDY_DESCRIPTION),
    ("study_id", tags::STUDY_ID),
    ("accession_number", tags::ACCESSION_NUMBER),
    ("series_number", tags::SERIES_NUMBER),
    ("series_description", tags::SERIES_DESCRIPTION),
    ("modality", tags::MODALITY),
    ("body_part_examined", tags::BODY_PART_EXAMINED),
    ("instance_number", tags::INSTANCE_NUMBER),
];

/// A checked Part 10 file: its body (from "DICM"), its transfer syntax, and where a
/// defined-length Pixel Data value lies in the body (not known for deflated files).
type Structure<'a> = (&'a [u8], &'static TransferSyntax, Option<std::ops::Range<usize>>);

/// The [`Structure`] of `bytes`, once the file meta group,
/// the transfer syntax (which `accept` may refuse, right after the meta group is read) and the
/// data set's element structure (inflated first when deflated, with a cap) have been checked.
fn structure<'a>(
    bytes: &'a [u8],
    limits: &Limits,
    accept: impl FnOnce(&'static TransferSyntax) -> Result<(), ImageIoError>,
) -> Result<Structure<'a>, ImageIoError> {
    let body = if bytes.get(128..132) == Some(b"DICM") { &bytes[128..] } else { bytes };
    let meta_info = scan::scan_meta(body)?;
    let uid = meta_info.ts_uid.as_str();
    let Some(ts) = TransferSyntaxRegistry.get(uid) else {
        return Err(unsupported_ts(uid, "unknown transfer syntax"));
    };
    accept(ts)?;
    let dataset = &body[meta_info.dataset_offset..];
    if ts.uid() == DEFLATED_EXPLICIT_VR_LE {
        let inflated = scan::inflate(dataset, limits.max_bytes, "data set")?;
        let explicit = TransferSyntaxRegistry
            .get("1.2.840.10008.1.2.1")
            .ok_or_else(|| unsupported_ts("1.2.840.10008.1.2.1", "Explicit VR Little Endian"))?;
        scan::scan_dataset(&inflated, explicit)?;
        Ok((body, ts, None))
    } else {
        let at = meta_info.dataset_offset;
        let pixels = scan::scan_dataset(dataset, ts)?.map(|r| r.start + at..r.end + at);
        Ok((body, ts, pixels))
    }
}

/// The attributes of a DICOM Part 10 file up to its pixel data, and its transfer syntax, after
/// the structural checks of [`crate::decode`].
fn attributes(
    bytes: &[u8],
    limits: &Limits,
) -> Result<(DefaultDicomObject, &'static TransferSyntax), ImageIoError> {
    limits.check_input(bytes.len())?;
    let (body, ts, _) = structure(bytes, limits, |_| Ok(()))?;
    let obj = OpenFileOptions::new()
        .read_preamble(ReadPreamble::Never)
        .read_until(tags::PIXEL_DATA)
        .from_reader(body)
        .map_err(|e| parse_error(&e))?;
    Ok((obj, ts))
}

/// Read the identifiers of a DICOM Part 10 file (with the same structural checks as
/// [`crate::decode`]); each UID must be present.
pub fn dicom_ids(bytes: &[u8], limits: &Limits) -> Result<DicomIds, ImageIoError> {
    let (obj, ts) = attributes(bytes, limits)?;
    let uid = |tag: Tag, name: &str| {
        text(&obj, tag).ok_or_else(|| ImageIoError::corrupt(DICOM, format!("no {name} {tag}")))
    };
    Ok(DicomIds {
        sop_class_uid: uid(tags::SOP_CLASS_UID, "SOP Class UID")?,
        sop_instance_uid: uid(tags::SOP_INSTANCE_UID, "SOP Instance UID")?,
        study_instance_uid: uid(tags::STUDY_INSTANCE_UID, "Study Instance UID")?,
        series_instance_uid: uid(tags::SERIES_INSTANCE_UID, "Series Instance UID")?,
        transfer_syntax_uid: ts.uid().to_string(),
        descriptive: DESCRIPTIVE
            .iter()
            .filter_map(|&(k, tag)| Some((k.to_string(), text(&obj, tag)?)))
            .collect(),
    })
}

/// The document an Encapsulated Document instance carries (PDF, CDA, STL, …: PS3.3
/// A.45): its MIME type (0042,0012) and its bytes (0042,0011), cut to the Encapsulated
/// Document Length (0042,0015) when the file gives one (the element itself is padded to an
/// even length). The file gets the structural checks of [`crate::decode`] first.
pub fn encapsulated_document(
    bytes: &[u8],
    limits: &Limits,
) -> Result<(String, Vec<u8>), ImageIoError> {
    let (obj, _) = attributes(bytes, limits)?;
    let Some(doc) = obj.get(tags::ENCAPSULATED_DOCUMENT) else {
        let class = text(&obj, tags::SOP_CLASS_UID).unwrap_or_default();
        return Err(ImageIoError::unsupported(
            DICOM,
            format!("not an encapsulated document (SOP class {class}): no Encapsulated Document"),
        ));
    };
    let mut data = doc.to_bytes().map_err(|e| parse_error(&e))?.into_owned();
    if let Some(len) = int(&obj, tags::ENCAPSULATED_DOCUMENT_LENGTH) {
        match usize::try_from(len) {
            Ok(n) if n <= data.len() => data.truncate(n),
            _ => {
                return Err(ImageIoError::corrupt(
                    DICOM,
                    format!(
                        "Encapsulated Document Length {len} is more than its {} bytes",
                        data.len()
                    ),
                ));
            }
        }
    }
    let mime = text(&obj, tags::MIME_TYPE_OF_ENCAPSULATED_DOCUMENT)
        .unwrap_or_else(|| "application/octet-stream".into());
    Ok((mime, data))
}

/// A structured report (SOP classes 1.2.840.10008.5.1.4.1.1.88.*, Key Object Selection too)
/// as plain text: its title, patient, completion and verification, then its content tree
/// (see `sr.rs`). The file gets the structural checks of [`crate::decode`] first; one
/// without a Content Sequence is not a report (unsupported).
pub fn structured_report(bytes: &[u8], limits: &Limits) -> Result<String, ImageIoError> {
    let (obj, _) = attributes(bytes, limits)?;
    if obj.get(tags::CONTENT_SEQUENCE).and_then(|e| e.items()).is_none() {
        let class = text(&obj, tags::SOP_CLASS_UID).unwrap_or_default();
        return Err(ImageIoError::unsupported(
            DICOM,
            format!("not a structured report (SOP class {class}): no Content Sequence"),
        ));
    }
    Ok(sr::render(&obj))
}

/// Decode a DICOM Part 10 file.
pub(crate) fn decode(bytes: &[u8], limits: &Limits) -> Result<Decoded, ImageIoError> {
    let mut codec = None;
    let (body, ts, native_pixels) = structure(bytes, limits, |ts| {
        codec = Some(pixel_codec(ts).ok_or_else(|| unsupported_ts(ts.uid(), ts.name()))?);
        Ok(())
    })?;
    let codec = codec.expect("set when the transfer syntax was accepted");
    // Native pixels are taken straight from the input: the parser stops before them instead
    // of copying them (a 300 MB cine would otherwise be held twice).
    let native_pixels = native_pixels
        .filter(|_| codec == PixelCodec::Native && ts.endianness() == Endianness::Little);
    let mut options = OpenFileOptions::new().read_preamble(ReadPreamble::Never);
    if native_pixels.is_some() {
        options = options.read_until(tags::PIXEL_DATA);
    }
    let obj = options.from_reader(body).map_err(|e| parse_error(&e))?;

    let layout = layout(&obj, native_pixels.is_some())?;
    let frames = number_of_frames(&obj, limits)?;
    // Header values are untrusted: the checks multiply without overflow.
    limits.check(layout.cols as u64, layout.rows as u64, layout.output_bytes_per_pixel())?;
    limits.check_frames(
        layout.cols as u64,
        layout.rows as u64,
        layout.output_bytes_per_pixel(),
        frames as u64,
    )?;
    // Colour that a codec converts (JPEG's YCbCr, JPEG 2000's component transforms) is
    // checked as the RGB it becomes; `pixels::convert` checks the decoded layout again.
    let coded_colour = matches!(codec, PixelCodec::Jpeg | PixelCodec::Jpeg2000)
        && layout.samples_per_pixel == 3
        && matches!(
            layout.photometric.as_str(),
            "YBR_FULL_422" | "YBR_PARTIAL_420" | "YBR_PARTIAL_422" | "YBR_ICT" | "YBR_RCT"
        );
    if coded_colour {
        Layout { photometric: "RGB".into(), ..layout.clone() }.validate()?;
    } else {
        layout.validate()?;
    }
    // Frames past the limit are counted, not decoded.
    let decoded =
        frames.min(usize::try_from(limits.max_frames_decoded).unwrap_or(usize::MAX).max(1));
    let element = || {
        obj.get(tags::PIXEL_DATA)
            .or_else(|| obj.get(tags::FLOAT_PIXEL_DATA))
            .or_else(|| obj.get(tags::DOUBLE_FLOAT_PIXEL_DATA))
            .ok_or_else(|| not_an_image(&obj))
    };
    let (mut images, mapping) = if codec == PixelCodec::Native {
        let bytes = match native_pixels {
            Some(range) => Cow::Borrowed(&body[range]),
            None => {
                let element = element()?;
                if element.value().fragments().is_some() {
                    return Err(ImageIoError::corrupt(
                        DICOM,
                        "encapsulated pixel data in a native transfer syntax",
                    ));
                }
                element.to_bytes().map_err(|e| ImageIoError::corrupt(DICOM, e.to_string()))?
            }
        };
        let bits =
            layout.frame_bits().ok_or_else(|| ImageIoError::corrupt(DICOM, "image too large"))?;
        // Every frame counted must be there, decoded or not (the last one is the test).
        frames::native_frame(&bytes, bits, frames - 1)?;
        let data = (0..decoded)
            .map(|n| frames::native_frame(&bytes, bits, n))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_ref()).collect();
        pixels::convert(&refs, &layout)?
    } else {
        let element = element()?;
        let (Some(fragments), Some(bot)) =
            (element.value().fragments(), element.value().offset_table())
        else {
            return Err(ImageIoError::corrupt(
                DICOM,
                "pixel data is not encapsulated as its transfer syntax requires",
            ));
        };
        let offsets = match extended_offsets(&obj) {
            Some(eot) => eot,
            None => bot.iter().map(|&o| u64::from(o)).collect(),
        };
        let marker = match codec {
            PixelCodec::Jpeg | PixelCodec::JpegLs => StartMarker::Jpeg,
            PixelCodec::Jpeg2000 => StartMarker::J2k,
            _ => StartMarker::None,
        };
        let streams = frames::encapsulated_frames(fragments, &offsets, frames, marker)?;
        let mut decoded_layout = layout.clone();
        let mut data = Vec::with_capacity(frames);
        for (d, l) in decode_frames(&streams[..decoded], &layout, codec, limits)? {
            data.push(d);
            decoded_layout = l;
        }
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_ref()).collect();
        pixels::convert(&refs, &decoded_layout)?
    };
    let image = images.remove(0);
    // A window DICOM does not allow (a width below 1: PS3.3 C.11.2.1.2) is no window: the
    // image is shown over its own range, not as one flat shade.
    let window_width = float(&obj, tags::WINDOW_WIDTH).filter(|w| *w >= 1.0);
    let meta = ImageMeta {
        width: layout.cols as u32,
        height: layout.rows as u32,
        pixel_kind: image.kind().name().to_string(),
        bits_stored: layout.bits_stored,
        signed: layout.signed,
        photometric_interpretation: text(&obj, tags::PHOTOMETRIC_INTERPRETATION)
            .unwrap_or_else(|| "MONOCHROME2".into()),
        number_of_frames: u32::try_from(frames).unwrap_or(u32::MAX),
        frames_decoded: u32::try_from(decoded).unwrap_or(u32::MAX),
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
        sop_class_uid: text(&obj, tags::SOP_CLASS_UID),
        accession_number: text(&obj, tags::ACCESSION_NUMBER),
        body_part_examined: text(&obj, tags::BODY_PART_EXAMINED),
        study_time: text(&obj, tags::STUDY_TIME),
        patient_birth_date: text(&obj, tags::PATIENT_BIRTH_DATE),
        patient_sex: text(&obj, tags::PATIENT_SEX),
        study_id: text(&obj, tags::STUDY_ID),
        instance_number: int(&obj, tags::INSTANCE_NUMBER),
        slice_location: float(&obj, tags::SLICE_LOCATION),
        image_position_patient: floats(&obj, tags::IMAGE_POSITION_PATIENT),
        image_orientation_patient: floats(&obj, tags::IMAGE_ORIENTATION_PATIENT),
        rescale_slope: float(&obj, tags::RESCALE_SLOPE),
        rescale_intercept: float(&obj, tags::RESCALE_INTERCEPT),
        window_center: window_width.and(float(&obj, tags::WINDOW_CENTER)),
        window_width,
        transfer_syntax_uid: Some(ts.uid().to_string()),
        transfer_syntax_name: Some(ts.name().to_string()),
        pixel_offset: mapping.map(|m| m.offset),
        pixel_inverted: mapping.map(|m| m.inverted),
        pixel_scale: mapping.map(|m| m.scale).filter(|&s| s != 1.0),
    };
    Ok(Decoded { image, frames: images, format: DICOM, meta })
}

/// Number of Frames (1 when absent), refused past [`Limits::max_frames`].
fn number_of_frames(obj: &DefaultDicomObject, limits: &Limits) -> Result<usize, ImageIoError> {
    let n = match obj.get(tags::NUMBER_OF_FRAMES) {
        None => 1,
        Some(e) => match e.to_int::<i64>() {
            Ok(n) if n >= 1 => n,
            // An empty value is common in single-frame files.
            _ if e.to_str().is_ok_and(|s| s.trim_matches(['\0', ' ']).is_empty()) => 1,
            _ => {
                return Err(ImageIoError::corrupt(
                    DICOM,
                    "Number of Frames is not a positive number",
                ));
            }
        },
    };
    if n as u64 > limits.max_frames {
        return Err(ImageIoError::too_many_frames(n, limits.max_frames));
    }
    Ok(n as usize)
}

/// The Extended Offset Table (7FE0,0001), when present: 64-bit offsets, as the Basic one.
fn extended_offsets(obj: &DefaultDicomObject) -> Option<Vec<u64>> {
    let bytes = obj.get(tags::EXTENDED_OFFSET_TABLE)?.to_bytes().ok()?;
    if bytes.is_empty() || bytes.len() % 8 != 0 {
        return None;
    }
    Some(bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8"))).collect())
}

/// One encapsulated frame to native samples, and the layout they have then.
/// A frame's samples and the layout they came out in.
type DecodedFrame<'a> = (Cow<'a, [u8]>, Layout);

/// Decode each of `streams`, in order; with several frames, over the machine's cores (a cine
/// loop of hundreds of frames in about a core's share of the time). The same frames either
/// way, and the first failing frame's error.
fn decode_frames<'a>(
    streams: &'a [Cow<'a, [u8]>],
    layout: &Layout,
    codec: PixelCodec,
    limits: &Limits,
) -> Result<Vec<DecodedFrame<'a>>, ImageIoError> {
    // One frame (the usual case) is decoded here, without asking how many cores there are.
    let threads = match streams.len() {
        0 | 1 => 1,
        n => std::thread::available_parallelism().map_or(1, |c| c.get()).min(n),
    };
    if threads <= 1 {
        return streams.iter().map(|s| decode_frame(s, layout, codec, limits)).collect();
    }
    let per = streams.len().div_ceil(threads);
    let decode_part = |part: &'a [Cow<'a, [u8]>]| {
        part.iter().map(|s| decode_frame(s, layout, codec, limits)).collect::<Vec<_>>()
    };
    // Every part is joined before any result is looked at: an early return would leave the
    // scope to join the rest, and re-raise a panic of theirs.
    let parts: Vec<_> = std::thread::scope(|scope| {
        let running: Vec<_> =
            streams.chunks(per).map(|part| scope.spawn(move || decode_part(part))).collect();
        running.into_iter().map(|h| h.join()).collect()
    });
    let mut out = Vec::with_capacity(streams.len());
    for part in parts {
        let part = part.map_err(|_| ImageIoError::corrupt(DICOM, "a frame's decoder failed"))?;
        for frame in part {
            out.push(frame?);
        }
    }
    Ok(out)
}

fn decode_frame<'a>(
    stream: &'a [u8],
    layout: &Layout,
    codec: PixelCodec,
    limits: &Limits,
) -> Result<DecodedFrame<'a>, ImageIoError> {
    let need =
        layout.frame_bytes().ok_or_else(|| ImageIoError::corrupt(DICOM, "image too large"))?;
    match codec {
        PixelCodec::Native | PixelCodec::EncapsulatedNative => {
            Ok((Cow::Borrowed(stream), layout.clone()))
        }
        PixelCodec::DeflatedFrames => {
            // A frame may carry one padding byte; the cap keeps a deflate bomb out.
            let cap = limits.max_bytes.min(need as u64 + 2);
            Ok((Cow::Owned(scan::inflate(stream, cap, "pixel data frame")?), layout.clone()))
        }
        PixelCodec::Rle => {
            let data = rle::decode_frame(
                stream,
                layout.rows,
                layout.cols,
                layout.samples_per_pixel,
                layout.bytes_per_sample(),
            )?;
            // This crate's RLE decoder interleaves the planes.
            Ok((Cow::Owned(data), Layout { planar: false, ..layout.clone() }))
        }
        PixelCodec::Jpeg => {
            let (data, l) = jpeg::decode(stream, layout, limits.max_bytes)?;
            Ok((Cow::Owned(data), l))
        }
        PixelCodec::Jpeg2000 => {
            let (data, l) = j2k::decode(stream, layout)?;
            Ok((Cow::Owned(data), l))
        }
        PixelCodec::JpegLs => {
            let (data, l) = jpegls::decode(stream, layout)?;
            Ok((Cow::Owned(data), l))
        }
    }
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

/// An instance without Pixel Data. One with an image's Rows is a broken image (corrupt); one
/// without (a structured report, an encapsulated PDF, a key object selection) is not corrupt,
/// only not an image, named by its SOP class.
fn not_an_image(obj: &DefaultDicomObject) -> ImageIoError {
    if obj.get(tags::ROWS).is_some() {
        return ImageIoError::corrupt(DICOM, "no Pixel Data, though Rows says it is an image");
    }
    let class = text(obj, tags::SOP_CLASS_UID).unwrap_or_else(|| "not given".into());
    ImageIoError::unsupported(DICOM, format!("not an image: no Pixel Data (SOP class {class})"))
}

fn text(obj: &dicom_object::InMemDicomObject, tag: Tag) -> Option<String> {
    let value = obj.get(tag)?.to_str().ok()?;
    let value = value.trim_matches(|c: char| c == '\0' || c.is_whitespace());
    (!value.is_empty()).then(|| value.to_string())
}

fn int(obj: &DefaultDicomObject, tag: Tag) -> Option<i64> {
    obj.get(tag)?.to_int::<i64>().ok()
}

/// Exactly `N` finite values of a numeric attribute.
fn floats<const N: usize>(obj: &DefaultDicomObject, tag: Tag) -> Option<[f64; N]> {
    let v = obj.get(tag)?.to_multi_float64().ok()?;
    let a: [f64; N] = v.try_into().ok()?;
    a.iter().all(|x| x.is_finite()).then_some(a)
}

/// The first value of a numeric attribute, if finite.
fn float(obj: &DefaultDicomObject, tag: Tag) -> Option<f64> {
    obj.get(tag)?.to_multi_float64().ok()?.first().copied().filter(|v| v.is_finite())
}

/// The image pixel module attributes (`pixel_data_after`: the parser stopped before a Pixel
/// Data element it did not read).
fn layout(obj: &DefaultDicomObject, pixel_data_after: bool) -> Result<Layout, ImageIoError> {
    let required = |tag: Tag, name: &str| -> Result<i64, ImageIoError> {
        int(obj, tag)
            .ok_or_else(|| ImageIoError::corrupt(DICOM, format!("missing or invalid {name} {tag}")))
    };
    let in_u16 = |v: i64, name: &str| -> Result<u16, ImageIoError> {
        u16::try_from(v)
            .map_err(|_| ImageIoError::corrupt(DICOM, format!("{name} {v} out of range")))
    };
    let float_samples = if pixel_data_after || obj.get(tags::PIXEL_DATA).is_some() {
        false
    } else if obj.get(tags::FLOAT_PIXEL_DATA).is_some()
        || obj.get(tags::DOUBLE_FLOAT_PIXEL_DATA).is_some()
    {
        true
    } else {
        return Err(not_an_image(obj));
    };
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
    let signed = int(obj, tags::PIXEL_REPRESENTATION) == Some(1);
    let photometric = text(obj, tags::PHOTOMETRIC_INTERPRETATION).unwrap_or_default();
    let palette = if photometric == "PALETTE COLOR" { Some(palette(obj, signed)?) } else { None };
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
        signed,
        planar: int(obj, tags::PLANAR_CONFIGURATION) == Some(1),
        photometric,
        slope: float(obj, tags::RESCALE_SLOPE).unwrap_or(1.0),
        intercept: float(obj, tags::RESCALE_INTERCEPT).unwrap_or(0.0),
        float: float_samples,
        palette,
    })
}

/// The PALETTE COLOR lookup tables (PS3.3 C.7.6.3.1.5–6). A descriptor is
/// `[entries (0 means 65,536), first value mapped, bits per entry]`; the data are 16-bit words,
/// or bytes when there is one byte per entry.
fn palette(obj: &DefaultDicomObject, signed: bool) -> Result<Palette, ImageIoError> {
    if obj.get(tags::SEGMENTED_RED_PALETTE_COLOR_LOOKUP_TABLE_DATA).is_some()
        && obj.get(tags::RED_PALETTE_COLOR_LOOKUP_TABLE_DATA).is_none()
    {
        return Err(ImageIoError::unsupported(DICOM, "segmented PALETTE COLOR lookup tables"));
    }
    let bad = |what: &str| ImageIoError::corrupt(DICOM, format!("PALETTE COLOR: {what}"));
    let table = |descriptor: Tag,
                 data: Tag,
                 colour: &str|
     -> Result<(i64, Vec<u16>, i64), ImageIoError> {
        let d: Vec<i64> = obj
            .get(descriptor)
            .and_then(|e| e.to_multi_int::<i64>().ok())
            .ok_or_else(|| bad(&format!("no {colour} lookup table descriptor")))?;
        let [entries, first, bits] = d[..] else {
            return Err(bad(&format!("the {colour} descriptor has {} values, not 3", d.len())));
        };
        // Values may have been read as signed (the descriptor's VR is US or SS).
        let entries = match entries & 0xFFFF {
            0 => 65536,
            n => n,
        };
        if !matches!(bits, 8 | 16) {
            return Err(bad(&format!("{bits} bits per {colour} entry")));
        }
        let bytes = obj
            .get(data)
            .and_then(|e| e.to_bytes().ok())
            .ok_or_else(|| bad(&format!("no {colour} lookup table data")))?;
        let n = entries as usize;
        let values: Vec<u16> = if bytes.len() == n {
            bytes.iter().map(|&b| u16::from(b)).collect()
        } else if bytes.len() >= 2 * n {
            bytes[..2 * n].chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
        } else {
            return Err(ImageIoError::truncated(
                DICOM,
                format!("the {colour} lookup table holds {} bytes for {n} entries", bytes.len()),
            ));
        };
        Ok((first, values, bits))
    };
    let (first, red, bits) = table(
        tags::RED_PALETTE_COLOR_LOOKUP_TABLE_DESCRIPTOR,
        tags::RED_PALETTE_COLOR_LOOKUP_TABLE_DATA,
        "red",
    )?;
    let (_, green, _) = table(
        tags::GREEN_PALETTE_COLOR_LOOKUP_TABLE_DESCRIPTOR,
        tags::GREEN_PALETTE_COLOR_LOOKUP_TABLE_DATA,
        "green",
    )?;
    let (_, blue, _) = table(
        tags::BLUE_PALETTE_COLOR_LOOKUP_TABLE_DESCRIPTOR,
        tags::BLUE_PALETTE_COLOR_LOOKUP_TABLE_DATA,
        "blue",
    )?;
    // The descriptor's VR is US or SS: take its 16 bits as the pixel data's signedness says.
    let first = if signed { i64::from(first as u16 as i16) } else { first & 0xFFFF };
    let mut p = Palette { first, red, green, blue, bits: 16 };
    if bits == 8 {
        // 8-bit entries stored in 16-bit words: some writers use the high byte.
        let high = p.red.iter().chain(&p.green).chain(&p.blue).any(|&v| v > 255);
        for v in p.red.iter_mut().chain(p.green.iter_mut()).chain(p.blue.iter_mut()) {
            *v = if high { *v >> 8 } else { *v };
        }
        p.bits = 8;
    }
    Ok(p)
}
