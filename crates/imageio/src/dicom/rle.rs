//! RLE Lossless (DICOM PS3.5 Annex G) decoding of one frame.
//!
//! Written here rather than taken from dicom-rs because dicom-rs's RLE reader indexes and
//! unwraps on malformed input (a short fragment, a segment that decodes to too few bytes, a
//! huge segment count) and so panics on corrupt files; this one returns errors, and allocates
//! only the output frame, whose size the caller has already checked against the limits, and
//! scratch planes of the same size that the thread keeps for the next frame (up to 64 MiB).
//!
//! A frame is one fragment: a 64-byte header (segment count, then 15 little-endian segment
//! offsets) followed by PackBits-coded segments, one per byte of each sample, the most
//! significant byte's segment first (for 16-bit RGB: R-MSB, R-LSB, G-MSB, G-LSB, B-MSB, B-LSB).
//! The output is the frame's samples interleaved (R G B R G B ...) and little-endian.

use std::mem::MaybeUninit;

use crate::error::ImageIoError;
use crate::format::Format;

const DICOM: Format = Format::Dicom;

/// Decode one RLE frame of `rows × cols` pixels with `samples` samples of `bytes_per_sample`
/// bytes.
pub(crate) fn decode_frame(
    fragment: &[u8],
    rows: usize,
    cols: usize,
    samples: usize,
    bytes_per_sample: usize,
) -> Result<Vec<u8>, ImageIoError> {
    let corrupt = |reason: String| ImageIoError::corrupt(DICOM, format!("RLE frame: {reason}"));
    let pixels = rows.checked_mul(cols).ok_or_else(|| corrupt("image too large".into()))?;
    let segments = samples * bytes_per_sample;
    if fragment.len() < 64 {
        return Err(ImageIoError::truncated(
            DICOM,
            format!("RLE frame of {} bytes is shorter than its 64-byte header", fragment.len()),
        ));
    }
    let word = |i: usize| {
        let b = &fragment[i * 4..i * 4 + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
    };
    let count = word(0);
    if count != segments {
        return Err(corrupt(format!(
            "{count} segments, but {samples} samples of {bytes_per_sample} bytes need {segments}"
        )));
    }
    let mut offsets: Vec<usize> = (1..=count).map(word).collect();
    offsets.push(fragment.len());
    for (i, pair) in offsets.windows(2).enumerate() {
        if pair[0] < 64 || pair[0] > pair[1] {
            return Err(corrupt(format!(
                "segment {i} offset {} is outside the fragment or out of order",
                pair[0]
            )));
        }
    }
    // PackBits expands at most 64-fold (2 bytes make a run of 128): refuse a frame whose
    // segments cannot hold the image before allocating it.
    for (seg, pair) in offsets.windows(2).enumerate() {
        if (pair[1] - pair[0]).saturating_mul(64) < pixels {
            return Err(ImageIoError::truncated(
                DICOM,
                format!(
                    "RLE segment {seg} of {} bytes cannot hold {pixels} pixels",
                    pair[1] - pair[0]
                ),
            ));
        }
    }
    let total = pixels.checked_mul(segments).ok_or_else(|| corrupt("image too large".into()))?;
    // Each segment decodes into its own plane with slice copies and fills; the planes are then
    // interleaved in one pass (a byte written at a stride per PackBits step is several times
    // slower). One segment is its own output.
    let unpack = |planes: &mut [u8]| {
        for (seg, plane) in planes.chunks_exact_mut(pixels.max(1)).enumerate().take(segments) {
            let src = &fragment[offsets[seg]..offsets[seg + 1]];
            let written = unpack_bits(src, plane);
            if written < pixels {
                return Err(ImageIoError::truncated(
                    DICOM,
                    format!("RLE segment {seg} decodes to {written} bytes, {pixels} expected"),
                ));
            }
        }
        Ok(())
    };
    if segments == 1 {
        let mut out = vec![0u8; total];
        unpack(&mut out)?;
        return Ok(out);
    }
    // Not zeroed first: the interleaving writes every byte (a third of the decode's time
    // went to clearing memory about to be overwritten).
    let mut out = Vec::with_capacity(total);
    // The planes live in a buffer this thread keeps from frame to frame (a frame's worth of
    // fresh memory each time costs more in page faults and zeroing than the decoding).
    PLANES.with_borrow_mut(|planes| {
        if planes.len() < total {
            planes.resize(total, 0);
        }
        let res = unpack(&mut planes[..total]);
        if res.is_ok() {
            interleave(
                &planes[..total],
                &mut out.spare_capacity_mut()[..total],
                pixels,
                segments,
                bytes_per_sample,
            );
            // SAFETY: `interleave` wrote all `total` bytes (see there), within the capacity.
            unsafe { out.set_len(total) };
        }
        if planes.len() > KEEP_PLANES {
            *planes = Vec::new(); // a huge frame's planes are not kept, decoded or not
        }
        res
    })?;
    Ok(out)
}

thread_local! {
    /// Scratch planes of the last frame decoded on this thread.
    static PLANES: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most scratch bytes a thread keeps between frames.
const KEEP_PLANES: usize = 64 << 20;

/// Interleave the decoded `planes` (one per segment, `pixels` bytes each) into `out`, writing
/// every one of its `pixels × segments` bytes: each segment one position of every pixel, and
/// the positions of the segments are all different.
fn interleave(
    planes: &[u8],
    out: &mut [MaybeUninit<u8>],
    pixels: usize,
    segments: usize,
    bytes_per_sample: usize,
) {
    // Segment `seg` holds byte `seg % bytes_per_sample` (0 = most significant) of sample
    // `seg / bytes_per_sample`: position `sample · bytes + (bytes − 1 − rank)` of a pixel.
    let position = |seg: usize| {
        let (sample, rank) = (seg / bytes_per_sample, seg % bytes_per_sample);
        sample * bytes_per_sample + (bytes_per_sample - 1 - rank)
    };
    if segments == 2 && bytes_per_sample == 2 {
        // One 16-bit sample: the high byte's plane first, written little-endian.
        let (msb, lsb) = planes.split_at(pixels);
        for ((o, &hi), &lo) in out.chunks_exact_mut(2).zip(msb).zip(lsb) {
            o[0].write(lo);
            o[1].write(hi);
        }
    } else {
        for (seg, plane) in planes.chunks_exact(pixels.max(1)).enumerate().take(segments) {
            let at = position(seg);
            for (o, &v) in out.chunks_exact_mut(segments).zip(plane) {
                o[at].write(v);
            }
        }
    }
}

/// PackBits-decode `src` into `dst`; returns how many bytes were produced (at most
/// `dst.len()`; extra output is padding and ignored).
fn unpack_bits(src: &[u8], dst: &mut [u8]) -> usize {
    let want = dst.len();
    let mut n = 0;
    let mut i = 0;
    // A run is at most 128 bytes. While 128 more fit on both sides, each run is copied or
    // filled as a whole 128-byte block — a few vector moves, where a call to memcpy or memset
    // for every run of a few dozen bytes took most of the decode. The bytes past the run are
    // overwritten by the runs after it; when the segment ends short, the caller refuses it.
    while i + 129 <= src.len() && n + 128 <= want {
        let h = src[i] as i8;
        i += 1;
        if h >= 0 {
            let run = h as usize + 1;
            dst[n..n + 128].copy_from_slice(&src[i..i + 128]);
            n += run;
            i += run;
        } else if h != -128 {
            let run = (1 - h as isize) as usize;
            dst[n..n + 128].fill(src[i]);
            n += run;
            i += 1;
        }
    }
    // The rest exactly, byte counts checked.
    while i < src.len() && n < want {
        let h = src[i] as i8;
        i += 1;
        if h >= 0 {
            let run = (h as usize + 1).min(src.len() - i).min(want - n);
            dst[n..n + run].copy_from_slice(&src[i..i + run]);
            n += run;
            i += h as usize + 1;
        } else if h != -128 {
            let Some(&v) = src.get(i) else { break };
            i += 1;
            let run = ((1 - h as isize) as usize).min(want - n);
            dst[n..n + run].fill(v);
            n += run;
        }
    }
    n
}

/// PackBits-encode one segment (for tests and for writing RLE): literal runs of up to 128
/// bytes and repeat runs of 2 to 128 bytes; the result is padded to an even length.
#[cfg(test)]
pub(crate) fn pack_bits(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let mut run = 1;
        while i + run < data.len() && run < 128 && data[i + run] == data[i] {
            run += 1;
        }
        if run >= 2 {
            out.push((1 - run as i32) as i8 as u8);
            out.push(data[i]);
            i += run;
        } else {
            let start = i;
            while i < data.len()
                && i - start < 128
                && !(i + 1 < data.len() && data[i + 1] == data[i])
            {
                i += 1;
            }
            if i == start {
                i += 1;
            }
            out.push((i - start - 1) as u8);
            out.extend_from_slice(&data[start..i]);
        }
    }
    if out.len() % 2 == 1 {
        out.push(0x80); // no-op
    }
    out
}

/// Build an RLE frame (header + segments) from interleaved little-endian samples.
#[cfg(test)]
pub(crate) fn encode_frame(data: &[u8], samples: usize, bytes_per_sample: usize) -> Vec<u8> {
    let segments = samples * bytes_per_sample;
    let pixels = data.len() / segments;
    let mut header = vec![0u8; 64];
    header[..4].copy_from_slice(&(segments as u32).to_le_bytes());
    let mut body = Vec::new();
    for seg in 0..segments {
        let sample = seg / bytes_per_sample;
        let byte_rank = seg % bytes_per_sample;
        let at = sample * bytes_per_sample + (bytes_per_sample - 1 - byte_rank);
        let plane: Vec<u8> = (0..pixels).map(|p| data[p * segments + at]).collect();
        let offset = 64 + body.len() as u32;
        header[4 + seg * 4..8 + seg * 4].copy_from_slice(&offset.to_le_bytes());
        body.extend(pack_bits(&plane));
    }
    header.extend(body);
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packbits_reference_example() {
        // The example of the TIFF PackBits specification.
        let encoded = [
            0xFE, 0xAA, 0x02, 0x80, 0x00, 0x2A, 0xFD, 0xAA, 0x03, 0x80, 0x00, 0x2A, 0x22, 0xF7,
            0xAA,
        ];
        let mut out = vec![0u8; 24];
        assert_eq!(unpack_bits(&encoded, &mut out[..24]), 24);
        assert_eq!(
            out,
            [
                0xAA, 0xAA, 0xAA, 0x80, 0x00, 0x2A, 0xAA, 0xAA, 0xAA, 0xAA, 0x80, 0x00, 0x2A, 0x22,
                0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA
            ]
        );
    }

    #[test]
    fn round_trip_16bit_rgb() {
        let data: Vec<u8> = (0..5 * 3 * 3 * 2).map(|i| (i * 7 % 13) as u8).collect();
        let frame = encode_frame(&data, 3, 2);
        assert_eq!(decode_frame(&frame, 3, 5, 3, 2).unwrap(), data);
        let gray: Vec<u8> = [vec![9u8; 300], (0..=255).collect()].concat();
        let frame = encode_frame(&gray, 1, 1);
        assert_eq!(decode_frame(&frame, 1, gray.len(), 1, 1).unwrap(), gray);
    }

    /// PackBits decoded one byte at a time: what [`unpack_bits`] must produce.
    fn unpack_slowly(src: &[u8], want: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < src.len() && out.len() < want {
            let h = src[i] as i8;
            i += 1;
            if h >= 0 {
                for _ in 0..=h as usize {
                    if i < src.len() && out.len() < want {
                        out.push(src[i]);
                    }
                    i += 1;
                }
            } else if h != -128 {
                let Some(&v) = src.get(i) else { break };
                i += 1;
                for _ in 0..(1 - h as isize) {
                    if out.len() < want {
                        out.push(v);
                    }
                }
            }
        }
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 2000,
            failure_persistence: None,
            ..Default::default()
        })]

        /// Any bytes at all, decoded into any room: the block copies and fills of long
        /// stretches give exactly the bytes and the count of the byte-at-a-time decoding.
        #[test]
        fn unpack_bits_matches_byte_at_a_time(
            src in proptest::collection::vec(proptest::num::u8::ANY, 0..2000),
            want in 0usize..3000,
        ) {
            let expected = unpack_slowly(&src, want);
            let mut dst = vec![0u8; want];
            let n = unpack_bits(&src, &mut dst);
            proptest::prop_assert_eq!(n, expected.len());
            proptest::prop_assert_eq!(&dst[..n], &expected[..]);
        }

        /// Images made of runs and noise, one to six segments: decoded as encoded.
        #[test]
        fn frames_round_trip(
            pieces in proptest::collection::vec((0u8..4, 1usize..400, proptest::num::u8::ANY), 1..20),
            samples in proptest::sample::select(vec![1usize, 3]),
            bytes in 1usize..=2,
        ) {
            let mut data = Vec::new();
            for (kind, len, v) in pieces {
                match kind {
                    0 => data.extend(std::iter::repeat_n(v, len)),
                    _ => data.extend((0..len).map(|k| (k as u8).wrapping_mul(v | 1) ^ kind)),
                }
            }
            let per_pixel = samples * bytes;
            data.truncate(data.len() / per_pixel * per_pixel);
            proptest::prop_assume!(!data.is_empty());
            let pixels = data.len() / per_pixel;
            let frame = encode_frame(&data, samples, bytes);
            proptest::prop_assert_eq!(decode_frame(&frame, 1, pixels, samples, bytes).unwrap(), data);
        }
    }

    #[test]
    fn malformed_frames_are_errors() {
        let data = vec![1u8; 64];
        let frame = encode_frame(&data, 1, 1);
        assert!(decode_frame(&frame[..10], 8, 8, 1, 1).is_err());
        assert!(decode_frame(&frame, 8, 9, 1, 1).is_err()); // too few bytes decoded
        assert!(decode_frame(&frame, 8, 8, 3, 1).is_err()); // wrong segment count
        let mut bad = frame.clone();
        bad[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_frame(&bad, 8, 8, 1, 1).is_err());
        let mut bad = frame;
        bad[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_frame(&bad, 8, 8, 1, 1).is_err());
        // A literal run longer than the data left.
        let mut short = vec![0u8; 64];
        short[0] = 1;
        short[4] = 64;
        short.extend([0x7F, 1, 2]);
        assert!(decode_frame(&short, 8, 8, 1, 1).is_err());
    }
}
