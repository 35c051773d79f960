//! JPEG pixel data (Baseline, Extended at 8 bits, Lossless Process 14 and SV1) through the
//! pure-Rust `jpeg-decoder`, with DICOM's colour rule and a check of the stream's frame header
//! against the DICOM header before any pixel is decoded; grey goes to the `jpeg12` module
//! (libjpeg-turbo): lossy at 8 and 12 bits, lossless at any precision (lossless grey first to
//! this crate's `jpeg_lossless`, which leaves to libjpeg-turbo what it does not take or decode
//! cleanly); so does 8-bit lossy colour whenever libjpeg's own colour rule gives what DICOM's
//! rule below asks for.
//!
//! Colour: PS3.5 §8.2.1 says the Photometric Interpretation describes the compressed stream.
//! So a lossy three-component stream labelled YBR_* is converted from YCbCr, and one labelled
//! RGB is taken as RGB unless an Adobe APP14 marker says it was transformed. That is what
//! dcmtk and pydicom do. jpeg-decoder's own guess follows JFIF conventions and would turn RGB
//! into magenta. Lossless streams are never colour-converted by the codec.

use std::panic::AssertUnwindSafe;

use jpeg_decoder::{ColorTransform, Decoder, Error as JpegError, UnsupportedFeature};

use super::pixels::Layout;
use crate::error::ImageIoError;
use crate::format::Format;

const DICOM: Format = Format::Dicom;

/// What the marker segments before the first scan say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct JpegHeader {
    pub precision: u8,
    pub lossless: bool,
    pub adobe: bool,
    /// The Adobe APP14 marker's colour transform (0: none, 1: YCbCr), if it has one.
    pub adobe_transform: Option<u8>,
    /// A JFIF APP0 marker (which says YCbCr).
    pub jfif: bool,
    /// The first three components' identifiers.
    pub ids: [u8; 3],
}

impl JpegHeader {
    /// Whether libjpeg converts this three-component stream from YCbCr on its own: its
    /// `default_decompress_parms` rule — a JFIF marker says YCbCr, else an Adobe marker's
    /// transform decides, else the component identifiers (`R`, `G`, `B` are RGB; anything
    /// else is taken as YCbCr).
    fn libjpeg_converts(&self) -> bool {
        if self.jfif {
            return true;
        }
        if self.adobe {
            return self.adobe_transform != Some(0);
        }
        self.ids != *b"RGB"
    }
}

/// Check that the stream's frame header (SOF) agrees with the DICOM header.
pub(crate) fn check_header(stream: &[u8], layout: &Layout) -> Result<JpegHeader, ImageIoError> {
    let bad = |reason: String| ImageIoError::corrupt(DICOM, format!("JPEG pixel data: {reason}"));
    if !stream.starts_with(&[0xFF, 0xD8]) {
        return Err(bad("no JPEG start-of-image marker".into()));
    }
    let (mut adobe, mut adobe_transform, mut jfif) = (false, None, false);
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
        if marker == 0xEE && stream.get(i + 2..i + 7) == Some(b"Adobe") {
            adobe = true;
            // "Adobe", version (2), flags0 (2), flags1 (2), transform (1).
            adobe_transform = (len >= 14).then(|| stream.get(i + 13).copied()).flatten();
        }
        if marker == 0xE0 && stream.get(i + 2..i + 7) == Some(b"JFIF\0") {
            jfif = true;
        }
        let is_sof = matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
        if is_sof {
            let Some(sof) = stream.get(i + 2..i + 8) else {
                return Err(ImageIoError::truncated(DICOM, "JPEG pixel data: cut in frame header"));
            };
            let precision = sof[0];
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
            if matches!(marker, 0xC9..=0xCF) {
                return Err(ImageIoError::unsupported(
                    DICOM,
                    "JPEG with arithmetic coding or hierarchical frames",
                ));
            }
            let lossless = marker == 0xC3;
            if precision > 12 && !lossless {
                return Err(bad(format!("{precision}-bit lossy JPEG (at most 12 bits exist)")));
            }
            // Each component: identifier, sampling factors, quantisation table.
            let id = |k: usize| stream.get(i + 8 + 3 * k).copied().unwrap_or(0);
            let ids = [id(0), id(1), id(2)];
            return Ok(JpegHeader { precision, lossless, adobe, adobe_transform, jfif, ids });
        }
        if marker == 0xDA || marker == 0xD9 {
            return Err(bad("no frame header before the scan".into()));
        }
        i += len;
    }
}

/// Decode one frame to native little-endian samples laid out as `decoded_layout` says, and
/// that layout: interleaved, and RGB when the codec converted colour.
pub(crate) fn decode(
    stream: &[u8],
    layout: &Layout,
    max_bytes: u64,
) -> Result<(Vec<u8>, Layout), ImageIoError> {
    let header = check_header(stream, layout)?;
    if header.precision > 8 && !header.lossless {
        let data = super::jpeg12::decode(stream, layout)?;
        return Ok((data, Layout { planar: false, ..layout.clone() }));
    }
    if header.lossless && layout.samples_per_pixel == 1 {
        // The crate's decoder where it takes the stream and decodes it cleanly, else
        // libjpeg-turbo (which also gives the error of a damaged stream).
        let fast = super::jpeg_lossless::parse(stream)
            .filter(|f| (f.width, f.height) == (layout.cols, layout.rows))
            .filter(|f| f.bits == u32::from(header.precision))
            .and_then(|f| super::jpeg_lossless::decode(&f));
        let data = match fast {
            Some(data) => data,
            None => super::jpeg12::decode_lossless_gray(stream, layout, header.precision)?,
        };
        return Ok((data, Layout { planar: false, ..layout.clone() }));
    }
    if header.precision == 8 && !header.lossless && layout.samples_per_pixel == 1 {
        let data = super::jpeg12::decode8_gray(stream, layout)?;
        return Ok((data, Layout { planar: false, ..layout.clone() }));
    }
    if header.precision == 8
        && !header.lossless
        && layout.samples_per_pixel == 3
        && let Some(convert) = dicom_converts(&header, layout)
        && convert == header.libjpeg_converts()
    {
        // libjpeg-turbo, about twice as fast as jpeg-decoder on colour (1.3 against 2.7 ms
        // for a 640 × 480 4:2:2 frame), where its own colour rule agrees with DICOM's.
        let data = super::jpeg12::decode8_rgb(stream, layout)?;
        return Ok((data, Layout { planar: false, photometric: "RGB".into(), ..layout.clone() }));
    }
    let mut decoder = Decoder::new(stream);
    decoder.set_max_decoding_buffer_size(usize::try_from(max_bytes).unwrap_or(usize::MAX));
    let mut out_layout = Layout { planar: false, ..layout.clone() };
    if layout.samples_per_pixel == 3 {
        if header.lossless {
            // Samples come out as coded; YBR_FULL is converted after, like native data.
            if out_layout.photometric == "YBR_FULL_422" {
                out_layout.photometric = "YBR_FULL".into();
            }
        } else {
            let transform = match layout.photometric.as_str() {
                "RGB" if !header.adobe => Some(ColorTransform::RGB),
                p if p.starts_with("YBR") => Some(ColorTransform::YCbCr),
                _ => None,
            };
            if let Some(t) = transform {
                decoder.set_color_transform(t);
            }
            out_layout.photometric = "RGB".into();
        }
    }
    let decoded = std::panic::catch_unwind(AssertUnwindSafe(|| decoder.decode()));
    let mut data = match decoded {
        Ok(Ok(data)) => data,
        Ok(Err(e)) => return Err(map_error(e)),
        Err(_) => return Err(ImageIoError::corrupt(DICOM, "JPEG pixel data: the decoder failed")),
    };
    let bytes = if header.precision > 8 { 2 } else { 1 };
    let need = layout.rows * layout.cols * layout.samples_per_pixel * bytes;
    if data.len() != need {
        return Err(ImageIoError::corrupt(
            DICOM,
            format!("JPEG pixel data: {} bytes decoded, the frame has {need}", data.len()),
        ));
    }
    if bytes == 2 && cfg!(target_endian = "big") {
        // jpeg-decoder gives native-endian 16-bit samples.
        for pair in data.chunks_exact_mut(2) {
            pair.swap(0, 1);
        }
    }
    Ok((data, out_layout))
}

/// Whether DICOM's rule (module documentation) converts a lossy three-component stream from
/// YCbCr: yes for YBR_* labels, no for RGB without an Adobe marker; `None` where the stream's
/// own markers decide (RGB with an Adobe marker, other labels).
fn dicom_converts(header: &JpegHeader, layout: &Layout) -> Option<bool> {
    match layout.photometric.as_str() {
        "RGB" if !header.adobe => Some(false),
        p if p.starts_with("YBR") => Some(true),
        _ => None,
    }
}

fn map_error(e: JpegError) -> ImageIoError {
    match e {
        JpegError::Unsupported(UnsupportedFeature::SamplePrecision(p)) => {
            ImageIoError::unsupported(DICOM, format!("{p}-bit lossy JPEG"))
        }
        JpegError::Unsupported(f) => ImageIoError::unsupported(DICOM, format!("JPEG {f:?}")),
        JpegError::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            ImageIoError::truncated(DICOM, "JPEG pixel data ends early")
        }
        other => ImageIoError::corrupt(DICOM, format!("JPEG pixel data: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(jfif: bool, adobe: Option<Option<u8>>, ids: &[u8; 3]) -> JpegHeader {
        JpegHeader {
            precision: 8,
            lossless: false,
            adobe: adobe.is_some(),
            adobe_transform: adobe.flatten(),
            jfif,
            ids: *ids,
        }
    }

    #[test]
    fn libjpegs_colour_rule_is_jfif_then_adobe_then_the_component_ids() {
        assert!(header(true, None, b"RGB").libjpeg_converts(), "JFIF says YCbCr");
        assert!(header(true, Some(Some(0)), &[1, 2, 3]).libjpeg_converts(), "JFIF first");
        assert!(!header(false, Some(Some(0)), &[1, 2, 3]).libjpeg_converts());
        assert!(header(false, Some(Some(1)), b"RGB").libjpeg_converts());
        assert!(header(false, Some(None), b"RGB").libjpeg_converts(), "no transform byte");
        assert!(!header(false, None, b"RGB").libjpeg_converts());
        assert!(header(false, None, &[1, 2, 3]).libjpeg_converts());
        assert!(header(false, None, &[0, 1, 2]).libjpeg_converts(), "unknown ids: YCbCr");
    }

    #[test]
    fn dicoms_colour_rule_follows_the_label_and_leaves_adobe_rgb_to_the_stream() {
        let layout = |p: &str| Layout {
            rows: 1,
            cols: 1,
            samples_per_pixel: 3,
            bits_allocated: 8,
            bits_stored: 8,
            high_bit: 7,
            signed: false,
            planar: false,
            photometric: p.into(),
            slope: 1.0,
            intercept: 0.0,
            float: false,
            palette: None,
        };
        let plain = header(false, None, &[1, 2, 3]);
        assert_eq!(dicom_converts(&plain, &layout("RGB")), Some(false));
        assert_eq!(dicom_converts(&plain, &layout("YBR_FULL_422")), Some(true));
        assert_eq!(dicom_converts(&plain, &layout("YBR_FULL")), Some(true));
        assert_eq!(dicom_converts(&header(false, Some(Some(1)), b"RGB"), &layout("RGB")), None);
        assert_eq!(dicom_converts(&plain, &layout("PALETTE COLOR")), None);
    }
}
