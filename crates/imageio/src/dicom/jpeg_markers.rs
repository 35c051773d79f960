//! The marker segments of a JPEG or JPEG-LS stream (T.81 B.1.1.4, T.87 C.1), as the crate's
//! own decoders (`jpeg_lossless`, `jpegls_scan`) read them: walking the segments up to the
//! scan, and the coded bytes of a stream's one scan.
//!
//! # Stream layout
//!
//! `FF D8` (SOI), then segments: `FF`, any number of fill `FF` bytes, the marker byte, a
//! 2-byte big-endian length that counts itself, the body. After SOS (`FF DA`) come the scan's
//! coded bytes up to the next marker (see `entropy_bits` for how each standard keeps a `0xFF`
//! data byte from reading as one), and a one-scan stream ends with `FF D9` (EOI).

/// The big-endian 16-bit number at `at`.
pub(crate) fn be16(s: &[u8], at: usize) -> Option<usize> {
    Some(usize::from(u16::from_be_bytes([*s.get(at)?, *s.get(at + 1)?])))
}

/// The segments after SOI, in order: marker, body, and where what follows the segment begins
/// (a scan's coded bytes after SOS). Stops at the first bytes that are not a segment.
pub(crate) fn segments(stream: &[u8]) -> impl Iterator<Item = (u8, &[u8], usize)> {
    let mut i = 2;
    std::iter::from_fn(move || {
        if *stream.get(i)? != 0xFF {
            return None;
        }
        while *stream.get(i + 1)? == 0xFF {
            i += 1;
        }
        let marker = stream[i + 1];
        let len = be16(stream, i + 2)?;
        let body = stream.get(i + 4..i + 2 + len.max(2))?;
        i += 2 + len.max(2);
        Some((marker, body, i))
    })
}

/// Where the coded bytes starting at `start` end: the first `0xFF` that begins a marker
/// (`JPEG_LS`: one followed by a byte ≥ `0x80`; JPEG: by anything but `0x00`), if any.
pub(crate) fn coded_end<const JPEG_LS: bool>(stream: &[u8], start: usize) -> Option<usize> {
    let mut at = start;
    loop {
        let ff = at + memchr::memchr(0xFF, stream.get(at..)?)?;
        let next = *stream.get(ff + 1)?;
        if if JPEG_LS { next >= 0x80 } else { next != 0 } {
            return Some(ff);
        }
        at = ff + 1;
    }
}

/// The coded bytes of the scan starting at `start` when they end the stream: EOI follows
/// them (after any fill bytes).
pub(crate) fn only_scan<const JPEG_LS: bool>(stream: &[u8], start: usize) -> Option<&[u8]> {
    let end = coded_end::<JPEG_LS>(stream, start)?;
    let mut j = end;
    while stream.get(j + 1) == Some(&0xFF) {
        j += 1;
    }
    (stream.get(j + 1) == Some(&0xD9)).then(|| &stream[start..end])
}

/// Where marker `m` first occurs in `stream` (its `0xFF`), for tests that edit a segment.
#[cfg(test)]
pub(crate) fn marker_at(stream: &[u8], m: u8) -> usize {
    stream.windows(2).position(|w| w == [0xFF, m]).expect("the marker")
}

/// `stream` with the bytes `segment` (a whole segment, marker included) put in at `at`.
#[cfg(test)]
pub(crate) fn with_segment(stream: &[u8], at: usize, segment: &[u8]) -> Vec<u8> {
    [&stream[..at], segment, &stream[at..]].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_end_coded_data_by_each_standard() {
        assert_eq!(coded_end::<false>(&[0x12, 0xFF, 0x00, 0xFF, 0xD9], 0), Some(3));
        assert_eq!(coded_end::<true>(&[0x12, 0xFF, 0x00, 0xFF, 0xD9], 0), Some(3));
        assert_eq!(coded_end::<true>(&[0xFF, 0x7F, 0xFF, 0x80], 0), Some(2));
        assert_eq!(coded_end::<false>(&[0xFF, 0x7F, 0xFF, 0x80], 0), Some(0));
        assert_eq!(only_scan::<false>(&[0, 0, 1, 2, 0xFF, 0xFF, 0xD9], 2), Some(&[1, 2][..]));
        assert_eq!(only_scan::<false>(&[0, 0, 1, 2, 0xFF, 0xDA, 0, 2], 2), None);
    }

    #[test]
    fn segments_stop_at_what_is_not_one() {
        let s = [0xFF, 0xD8, 0xFF, 0xFF, 0xE0, 0, 3, 7, 0xFF, 0xDA, 0, 2, 9, 0xFF, 0xD9];
        let all: Vec<_> = segments(&s).collect();
        assert_eq!(all, [(0xE0, &[7][..], 8), (0xDA, &[][..], 12)]);
        assert_eq!(segments(&s[..6]).count(), 0);
    }
}
