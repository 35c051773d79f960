//! JPEG 2000 pixel data (1.2.840.10008.1.2.4.90 lossless, .91 lossy; PS3.5 A.4.4) and
//! High-Throughput JPEG 2000 (.201 lossless, .202 lossless RPCL, .203; PS3.5 A.4.11) through
//! `jpeg2k` over OpenJPEG, the reference codec (C, bundled in `openjpeg-sys`), in strict mode
//! so that a cut codestream is an error rather than a partly decoded image. (Its pure-Rust
//! port, openjp2, frees a null pointer through Rust's allocator on valid input: found by
//! `scripts/fuzz-dicom`.)
//!
//! Before the decoder sees a stream, its SIZ marker segment (ISO 15444-1 A.5.1: `FF4F` SOC,
//! then `FF51` SIZ with Lsiz, Rsiz, Xsiz, Ysiz, XOsiz, YOsiz, XTsiz, YTsiz, XTOsiz, YTOsiz,
//! Csiz and per component Ssiz, XRsiz, YRsiz) is read here and checked against the DICOM
//! header: image size, component count and precision, no subsampling, and a bounded number of
//! tiles, so that a hostile header cannot make the decoder allocate or loop beyond the image
//! the limits already allowed. Colour: OpenJPEG undoes the codestream's multiple-component
//! transform itself, so YBR_RCT and YBR_ICT come out as RGB; YBR_FULL is converted after.

use std::panic::AssertUnwindSafe;

use super::pixels::Layout;
use crate::error::ImageIoError;
use crate::format::Format;

const DICOM: Format = Format::Dicom;

/// Most tiles a frame may be cut into (a 65535 × 65535 image in 256 × 256 tiles has 65,536).
const MAX_TILES: u64 = 1 << 16;

/// The SIZ segment's facts that matter here.
#[derive(Debug, Clone, PartialEq)]
struct Siz {
    width: u64,
    height: u64,
    tiles: u64,
    /// (precision in bits, signed, subsampled) per component.
    components: Vec<(u8, bool, bool)>,
    /// Rsiz: the capabilities the stream needs (bit 15: Part 2 extensions, which OpenJPEG
    /// would skip with a warning and decode to other pixels; bit 14: HT code blocks, decoded).
    rsiz: u16,
}

fn bad(reason: impl std::fmt::Display) -> ImageIoError {
    ImageIoError::corrupt(DICOM, format!("JPEG 2000 pixel data: {reason}"))
}

/// The codestream inside `stream` (itself, or a JP2 file's contiguous codestream box).
fn codestream(stream: &[u8]) -> Result<&[u8], ImageIoError> {
    if stream.starts_with(&[0xFF, 0x4F, 0xFF, 0x51]) {
        return Ok(stream);
    }
    if !stream.starts_with(&[0, 0, 0, 12, b'j', b'P', b' ', b' ']) {
        return Err(bad("neither a codestream (FF4F) nor a JP2 file"));
    }
    // Walk the boxes (length, type) to `jp2c`.
    let mut at = 0usize;
    while let Some(head) = stream.get(at..at + 8) {
        let len = u32::from_be_bytes(head[..4].try_into().expect("4")) as usize;
        let (body, len) = match len {
            1 => {
                let l = stream.get(at + 8..at + 16).ok_or_else(|| truncated("a box header"))?;
                (at + 16, u64::from_be_bytes(l.try_into().expect("8")) as usize)
            }
            0 => (at + 8, stream.len() - at),
            n => (at + 8, n),
        };
        if &head[4..8] == b"jp2c" {
            let code = stream.get(body..).ok_or_else(|| truncated("the codestream box"))?;
            // The box must hold the codestream itself (SOC then SIZ), so the SIZ checked here
            // is the one the decoder reads.
            if !code.starts_with(&[0xFF, 0x4F, 0xFF, 0x51]) {
                return Err(bad("the JP2 codestream box does not start with SOC and SIZ"));
            }
            return Ok(code);
        }
        if len < 8 {
            return Err(bad("a JP2 box shorter than its header"));
        }
        at = at.checked_add(len).ok_or_else(|| bad("a JP2 box length"))?;
    }
    Err(truncated("the JP2 file has no codestream box"))
}

fn truncated(what: &str) -> ImageIoError {
    ImageIoError::truncated(DICOM, format!("JPEG 2000 pixel data: cut in {what}"))
}

fn siz(code: &[u8]) -> Result<Siz, ImageIoError> {
    let s = code.get(4..).ok_or_else(|| truncated("SIZ"))?;
    let u16_at = |i: usize| -> Result<u64, ImageIoError> {
        s.get(i..i + 2)
            .map(|b| u64::from(u16::from_be_bytes([b[0], b[1]])))
            .ok_or_else(|| truncated("SIZ"))
    };
    let u32_at = |i: usize| -> Result<u64, ImageIoError> {
        s.get(i..i + 4)
            .map(|b| u64::from(u32::from_be_bytes(b.try_into().expect("4"))))
            .ok_or_else(|| truncated("SIZ"))
    };
    // Lsiz at 0, Rsiz at 2, then the eight 32-bit sizes from 4, Csiz at 36.
    let (x, y, xo, yo) = (u32_at(4)?, u32_at(8)?, u32_at(12)?, u32_at(16)?);
    let (xt, yt, xto, yto) = (u32_at(20)?, u32_at(24)?, u32_at(28)?, u32_at(32)?);
    if x <= xo || y <= yo || xt == 0 || yt == 0 || xto > xo || yto > yo {
        return Err(bad("impossible image or tile sizes in SIZ"));
    }
    let tiles = (x - xto).div_ceil(xt).saturating_mul((y - yto).div_ceil(yt));
    let n = u16_at(36)? as usize;
    let mut components = Vec::with_capacity(n.min(16));
    for c in 0..n {
        let p = s.get(38 + 3 * c..41 + 3 * c).ok_or_else(|| truncated("SIZ"))?;
        components.push(((p[0] & 0x7F) + 1, p[0] & 0x80 != 0, p[1] != 1 || p[2] != 1));
    }
    let rsiz = u16_at(2)? as u16;
    Ok(Siz { width: x - xo, height: y - yo, tiles, components, rsiz })
}

/// Decode one frame to native little-endian samples laid out as the returned layout says.
pub(crate) fn decode(stream: &[u8], layout: &Layout) -> Result<(Vec<u8>, Layout), ImageIoError> {
    let siz = siz(codestream(stream)?)?;
    let (w, h, n) = (layout.cols as u64, layout.rows as u64, layout.samples_per_pixel);
    if (siz.width, siz.height, siz.components.len()) != (w, h, n) {
        return Err(bad(format!(
            "the codestream is {}×{} with {} components, the DICOM header says {w}×{h} with {n}",
            siz.width,
            siz.height,
            siz.components.len()
        )));
    }
    if siz.rsiz & 0x8000 != 0 {
        return Err(ImageIoError::unsupported(
            DICOM,
            format!("JPEG 2000 Part 2 extensions (Rsiz {:#06x})", siz.rsiz),
        ));
    }
    if siz.tiles > MAX_TILES {
        return Err(ImageIoError::unsupported(
            DICOM,
            format!("JPEG 2000 with {} tiles (at most {MAX_TILES})", siz.tiles),
        ));
    }
    for &(precision, _, subsampled) in &siz.components {
        if subsampled {
            return Err(ImageIoError::unsupported(DICOM, "JPEG 2000 with subsampled components"));
        }
        if u16::from(precision) > layout.bits_allocated {
            return Err(bad(format!(
                "{precision}-bit samples in {}-bit pixels",
                layout.bits_allocated
            )));
        }
    }
    let params = jpeg2k::DecodeParameters::new().strict(true);
    let image = std::panic::catch_unwind(AssertUnwindSafe(|| {
        jpeg2k::Image::from_bytes_with(stream, params)
    }))
    .map_err(|_| bad("the decoder failed"))?
    .map_err(bad)?;
    let comps = image.components();
    let pixels = layout.rows * layout.cols;
    if comps.len() != n
        || comps.iter().any(|c| (u64::from(c.width()), u64::from(c.height())) != (w, h))
    {
        return Err(bad("the decoded components do not match the frame header"));
    }
    let planes: Vec<&[i32]> = comps.iter().map(|c| c.data()).collect();
    let bytes = layout.bytes_per_sample();
    let mut out = Vec::with_capacity(pixels * n * bytes);
    for i in 0..pixels {
        for plane in &planes {
            // Two's complement in the allocated width: the stored bits are what DICOM keeps.
            let v = plane[i];
            if bytes == 1 {
                out.push(v as u8);
            } else {
                out.extend_from_slice(&(v as u16).to_le_bytes());
            }
        }
    }
    let mut out_layout = Layout { planar: false, ..layout.clone() };
    if matches!(layout.photometric.as_str(), "YBR_RCT" | "YBR_ICT") {
        out_layout.photometric = "RGB".into();
    }
    Ok((out, out_layout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siz_is_read_and_checked() {
        let mut code = vec![0xFF, 0x4F, 0xFF, 0x51, 0, 41, 0, 0];
        for v in [16u32, 12, 0, 0, 16, 12, 0, 0] {
            code.extend(v.to_be_bytes());
        }
        code.extend([0, 1, 0x87, 1, 1]);
        let s = siz(&code).unwrap();
        assert_eq!((s.width, s.height, s.tiles), (16, 12, 1));
        assert_eq!(s.components, vec![(8, true, false)]);
        assert!(matches!(siz(&code[..40]), Err(ImageIoError::Truncated { .. })));
        // 1 × 1 tiles over 65535 × 65535 would be four billion tiles.
        let mut many = code.clone();
        many[8..12].copy_from_slice(&65535u32.to_be_bytes());
        many[12..16].copy_from_slice(&65535u32.to_be_bytes());
        many[24..28].copy_from_slice(&1u32.to_be_bytes());
        many[28..32].copy_from_slice(&1u32.to_be_bytes());
        assert_eq!(siz(&many).unwrap().tiles, 65535 * 65535);
    }

    #[test]
    fn jp2_boxes_lead_to_the_codestream() {
        let mut jp2 = vec![0, 0, 0, 12, b'j', b'P', b' ', b' ', 13, 10, 0x87, 10];
        jp2.extend([0, 0, 0, 9, b'x', b'x', b'x', b'x', 0]);
        jp2.extend([0, 0, 0, 0, b'j', b'p', b'2', b'c', 0xFF, 0x4F, 0xFF, 0x51]);
        assert_eq!(codestream(&jp2).unwrap(), &[0xFF, 0x4F, 0xFF, 0x51]);
        assert!(codestream(&jp2[..20]).is_err());
        // A codestream box that does not start with SOC + SIZ is refused (its SIZ could hide
        // behind a decoy the size check would read).
        let mut decoy = jp2.clone();
        let at = decoy.len() - 4;
        decoy[at..].copy_from_slice(&[0xFF, 0x64, 0, 2]);
        assert!(matches!(codestream(&decoy), Err(ImageIoError::Corrupt { .. })));
        assert!(codestream(b"not jpeg 2000").is_err());
    }
}
