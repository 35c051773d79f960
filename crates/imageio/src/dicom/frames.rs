//! Where each frame's bytes are in the Pixel Data element: native frames one after another
//! (at bit offsets when 1-bit frames do not end on a byte), encapsulated frames found by the
//! Extended or Basic Offset Table, by one fragment per frame, or by the codec's start marker.
//!
//! Encapsulated layout (PS3.5 A.4): an item holding the Basic Offset Table, then one item per
//! fragment. Offsets in either table count bytes from the first byte of the first fragment's
//! item tag, so fragment `i` starts at `Σ_{j<i} (8 + len_j)`; a frame is the fragments from
//! its offset up to the next frame's.

use std::borrow::Cow;

use crate::error::ImageIoError;
use crate::format::Format;

const DICOM: Format = Format::Dicom;

/// The bytes of native frame `n` (0-based) of `frame_bits` bits each: borrowed when frames
/// start on a byte, else the frame's bits copied to start at bit 0.
pub(crate) fn native_frame(
    data: &[u8],
    frame_bits: u64,
    n: usize,
) -> Result<Cow<'_, [u8]>, ImageIoError> {
    let start = frame_bits * n as u64;
    let end = start + frame_bits;
    if end.div_ceil(8) > data.len() as u64 {
        return Err(ImageIoError::truncated(
            DICOM,
            format!(
                "pixel data holds {} bytes, frame {} needs {}",
                data.len(),
                n + 1,
                end.div_ceil(8)
            ),
        ));
    }
    let (first, len) = ((start / 8) as usize, frame_bits.div_ceil(8) as usize);
    let shift = (start % 8) as u32;
    if shift == 0 {
        return Ok(Cow::Borrowed(&data[first..first + len]));
    }
    let out = (0..len)
        .map(|i| {
            let lo = data[first + i] >> shift;
            let hi = data.get(first + i + 1).map_or(0, |b| b << (8 - shift));
            lo | hi
        })
        .collect();
    Ok(Cow::Owned(out))
}

/// What starts a frame's first fragment, for codecs whose streams say so.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum StartMarker {
    /// JPEG and JPEG-LS: start of image, FF D8.
    Jpeg,
    /// JPEG 2000: a codestream (FF 4F FF 51) or a JP2 file's signature box.
    J2k,
    /// No marker (RLE, encapsulated native): one fragment per frame is the rule.
    None,
}

impl StartMarker {
    fn starts(self, fragment: &[u8]) -> bool {
        match self {
            Self::Jpeg => fragment.starts_with(&[0xFF, 0xD8]),
            Self::J2k => {
                fragment.starts_with(&[0xFF, 0x4F, 0xFF, 0x51])
                    || fragment.starts_with(&[0, 0, 0, 12, b'j', b'P', b' ', b' '])
            }
            Self::None => false,
        }
    }
}

/// Split `fragments` into `frames` frames. `offsets` is the Extended Offset Table if the file
/// has one, else the Basic Offset Table (empty when absent).
pub(crate) fn encapsulated_frames<'a>(
    fragments: &'a [Vec<u8>],
    offsets: &[u64],
    frames: usize,
    marker: StartMarker,
) -> Result<Vec<Cow<'a, [u8]>>, ImageIoError> {
    if fragments.is_empty() {
        return Err(ImageIoError::truncated(DICOM, "encapsulated pixel data has no fragments"));
    }
    if frames > fragments.len() {
        return Err(ImageIoError::truncated(
            DICOM,
            format!("{frames} frames in {} fragments", fragments.len()),
        ));
    }
    let groups = if offsets.len() == frames && frames > 1 {
        by_offsets(fragments, offsets)?
    } else if fragments.len() == frames {
        (0..frames).map(|i| i..i + 1).collect()
    } else if frames == 1 {
        std::iter::once(0..fragments.len()).collect()
    } else {
        let starts: Vec<usize> =
            (0..fragments.len()).filter(|&i| i == 0 || marker.starts(&fragments[i])).collect();
        if starts.len() != frames {
            return Err(ImageIoError::corrupt(
                DICOM,
                format!(
                    "{} fragments for {frames} frames, and neither an offset table nor frame \
                     start markers tell them apart",
                    fragments.len()
                ),
            ));
        }
        let mut ends: Vec<usize> = starts[1..].to_vec();
        ends.push(fragments.len());
        starts.into_iter().zip(ends).map(|(s, e)| s..e).collect()
    };
    Ok(groups
        .into_iter()
        .map(|r| {
            if r.len() == 1 {
                Cow::Borrowed(fragments[r.start].as_slice())
            } else {
                Cow::Owned(fragments[r].concat())
            }
        })
        .collect())
}

/// Fragment ranges of each frame from its table offset.
fn by_offsets(
    fragments: &[Vec<u8>],
    offsets: &[u64],
) -> Result<Vec<std::ops::Range<usize>>, ImageIoError> {
    let mut positions = Vec::with_capacity(fragments.len());
    let mut at = 0u64;
    for f in fragments {
        positions.push(at);
        at += 8 + f.len() as u64;
    }
    let mut starts = Vec::with_capacity(offsets.len());
    for (k, &off) in offsets.iter().enumerate() {
        let Ok(i) = positions.binary_search(&off) else {
            return Err(ImageIoError::corrupt(
                DICOM,
                format!(
                    "the offset table puts frame {} at byte {off}, not a fragment start",
                    k + 1
                ),
            ));
        };
        if starts.last().is_some_and(|&prev| prev >= i) || (k == 0 && i != 0) {
            return Err(ImageIoError::corrupt(DICOM, "the offset table is not in frame order"));
        }
        starts.push(i);
    }
    let mut ends: Vec<usize> = starts[1..].to_vec();
    ends.push(fragments.len());
    Ok(starts.into_iter().zip(ends).map(|(s, e)| s..e).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_frames_on_and_off_byte_boundaries() {
        let data = [1, 2, 3, 4, 5, 6];
        assert_eq!(&*native_frame(&data, 16, 2).unwrap(), &[5, 6]);
        assert!(matches!(native_frame(&data, 16, 3), Err(ImageIoError::Truncated { .. })));
        // 12-bit frames: the second starts at bit 12.
        let f = native_frame(&[0xAB, 0xCD, 0xEF], 12, 1).unwrap();
        assert_eq!(&*f, &[0xFC, 0x0E]);
    }

    fn frags(lens: &[usize]) -> Vec<Vec<u8>> {
        lens.iter().enumerate().map(|(i, &n)| vec![i as u8; n]).collect()
    }

    #[test]
    fn frames_by_offset_table() {
        let f = frags(&[4, 2, 6]);
        // Fragment starts: 0, 12, 22. Frame 1 = fragments 0 and 1, frame 2 = fragment 2.
        let out = encapsulated_frames(&f, &[0, 22], 2, StartMarker::None).unwrap();
        assert_eq!(out[0].as_ref(), &[0, 0, 0, 0, 1, 1]);
        assert_eq!(out[1].as_ref(), &[2; 6]);
        assert!(matches!(
            encapsulated_frames(&f, &[0, 13], 2, StartMarker::None),
            Err(ImageIoError::Corrupt { .. })
        ));
        assert!(matches!(
            encapsulated_frames(&f, &[22, 0], 2, StartMarker::None),
            Err(ImageIoError::Corrupt { .. })
        ));
    }

    #[test]
    fn frames_by_fragment_count_and_markers() {
        let f = frags(&[1, 1, 1]);
        assert_eq!(encapsulated_frames(&f, &[], 3, StartMarker::None).unwrap().len(), 3);
        assert_eq!(encapsulated_frames(&f, &[], 1, StartMarker::None).unwrap()[0].len(), 3);
        assert!(matches!(
            encapsulated_frames(&f, &[], 2, StartMarker::None),
            Err(ImageIoError::Corrupt { .. })
        ));
        assert!(matches!(
            encapsulated_frames(&f, &[], 4, StartMarker::None),
            Err(ImageIoError::Truncated { .. })
        ));
        let f = vec![vec![0xFF, 0xD8, 1], vec![2], vec![0xFF, 0xD8, 3]];
        let out = encapsulated_frames(&f, &[], 2, StartMarker::Jpeg).unwrap();
        assert_eq!(out[0].as_ref(), &[0xFF, 0xD8, 1, 2]);
        assert_eq!(out[1].as_ref(), &[0xFF, 0xD8, 3]);
    }
}
