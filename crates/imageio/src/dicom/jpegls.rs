//! JPEG-LS pixel data (1.2.840.10008.1.2.4.80 lossless, .81 near-lossless; PS3.5 A.4.3).
//! One grey component in one scan (what DICOM modalities write) is decoded by this crate's
//! `jpegls_scan`, which is faster; everything else by CharLS, the reference JPEG-LS codec (C++,
//! built from the sources bundled in the `charls-sys` crate), which is fuzzed continuously
//! upstream. Either way CharLS reads the header first and it is checked against the DICOM
//! header before any decode, so the buffer filled is the size the limits already allowed.
//!
//! CharLS writes planes one after another when the stream's scans each hold one component
//! (interleave mode "none", seen in the first SOS segment: `FF DA`, Ls, Ns, …), else
//! interleaved samples; 16-bit samples in native byte order.

use std::panic::AssertUnwindSafe;

use charls::CharLS;

use super::jpegls_scan;
use super::pixels::Layout;
use crate::error::ImageIoError;
use crate::format::Format;

const DICOM: Format = Format::Dicom;

fn bad(reason: impl std::fmt::Display) -> ImageIoError {
    ImageIoError::corrupt(DICOM, format!("JPEG-LS pixel data: {reason}"))
}

/// Components in the first scan (Ns of the first SOS), if the stream has one.
fn first_scan_components(stream: &[u8]) -> Option<u8> {
    let mut i = 2;
    while i + 4 <= stream.len() {
        if stream[i] != 0xFF {
            i += 1;
            continue;
        }
        let marker = stream[i + 1];
        if marker == 0xFF || marker == 0xD8 || (0xD0..=0xD7).contains(&marker) {
            i += if marker == 0xFF { 1 } else { 2 };
            continue;
        }
        let len = usize::from(u16::from_be_bytes([stream[i + 2], stream[i + 3]]));
        if marker == 0xDA {
            return stream.get(i + 4).copied();
        }
        i += 2 + len;
    }
    None
}

/// Decode one frame to native little-endian samples laid out as the returned layout says.
pub(crate) fn decode(stream: &[u8], layout: &Layout) -> Result<(Vec<u8>, Layout), ImageIoError> {
    if !stream.starts_with(&[0xFF, 0xD8]) {
        return Err(bad("no start-of-image marker"));
    }
    // A stream cut before its end-of-image marker is refused here: CharLS spends seconds on
    // one (measured: 3–4 s for a cut 200-byte stream, optimised), however small the image.
    let end = stream.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if end < 4 || stream[end - 2..end] != [0xFF, 0xD9] {
        return Err(ImageIoError::truncated(DICOM, "JPEG-LS pixel data: no end-of-image marker"));
    }
    let info = CharLS::default().get_frame_info(stream).map_err(|e| bad(format!("header: {e}")))?;
    let (w, h, n) = (layout.cols as u32, layout.rows as u32, layout.samples_per_pixel as i32);
    if (info.width, info.height, info.component_count) != (w, h, n) {
        return Err(bad(format!(
            "the stream is {}×{} with {} components, the DICOM header says {w}×{h} with {n}",
            info.width, info.height, info.component_count
        )));
    }
    let bits = info.bits_per_sample;
    if !(2..=16).contains(&bits) || bits > i32::from(layout.bits_allocated) {
        return Err(bad(format!("{bits}-bit samples in {}-bit pixels", layout.bits_allocated)));
    }
    // The frame the crate's decoder reads must be the one just checked.
    let checked = |f: &jpegls_scan::Frame<'_>| {
        (f.width as u32, f.height as u32, f.bits as i32) == (info.width, info.height, bits)
    };
    let decoded = match jpegls_scan::parse(stream).filter(checked) {
        Some(frame) => jpegls_scan::decode(&frame).map_err(bad)?,
        // A CharLS decoder reads one stream once: a fresh one decodes.
        None => std::panic::catch_unwind(AssertUnwindSafe(|| CharLS::default().decode(stream)))
            .map_err(|_| bad("the decoder failed"))?
            .map_err(bad)?,
    };
    let in_bytes = if bits > 8 { 2 } else { 1 };
    let samples = layout.rows * layout.cols * layout.samples_per_pixel;
    if decoded.len() != samples * in_bytes {
        return Err(bad(format!(
            "{} bytes decoded, the frame has {}",
            decoded.len(),
            samples * in_bytes
        )));
    }
    let planar = layout.samples_per_pixel > 1 && first_scan_components(stream) == Some(1);
    let out_bytes = layout.bytes_per_sample();
    if in_bytes == out_bytes && (in_bytes == 1 || cfg!(target_endian = "little")) {
        // CharLS's samples are already the frame's bytes (native order is little-endian).
        return Ok((decoded, Layout { planar, ..layout.clone() }));
    }
    let sample = |i: usize| -> u16 {
        if in_bytes == 1 {
            u16::from(decoded[i])
        } else {
            u16::from_ne_bytes([decoded[2 * i], decoded[2 * i + 1]])
        }
    };
    let mut out = Vec::with_capacity(samples * out_bytes);
    for i in 0..samples {
        let v = sample(i);
        if out_bytes == 1 {
            out.push(v as u8);
        } else {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    Ok((out, Layout { planar, ..layout.clone() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_scan_component_count_is_found_past_other_segments() {
        let s = [0xFF, 0xD8, 0xFF, 0xF7, 0, 3, 9, 0xFF, 0xDA, 0, 8, 1, 1, 0];
        assert_eq!(first_scan_components(&s), Some(1));
        assert_eq!(first_scan_components(&s[..9]), None);
    }
}
