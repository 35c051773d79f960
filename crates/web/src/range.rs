//! The `Range` request header (RFC 9110 §14): one `bytes=` range is served as 206. A header
//! the server may ignore is ignored, so the whole blob is sent (200): another unit (which RFC
//! 9110 §14.2 says must be ignored) and several ranges (not served as multipart here). A
//! malformed or unsatisfiable range, or a header over 256 bytes, gets 416 with
//! `Content-Range: bytes */SIZE`, so a client learns why it got no partial body.

use crate::error::WebError;

/// Longest `Range` header considered.
const MAX_HEADER: usize = 256;

/// The inclusive byte range `start..=end` of a blob of `size` bytes that `header` asks for,
/// or `None` when the header is to be ignored (the whole blob sent).
pub fn parse(header: &str, size: u64) -> Result<Option<(u64, u64)>, WebError> {
    let bad = |reason: &str| WebError::RangeNotSatisfiable { size, reason: reason.to_string() };
    if header.len() > MAX_HEADER {
        return Err(bad("Range header longer than 256 bytes"));
    }
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Err(bad("expected `bytes=START-END`, `bytes=START-` or `bytes=-SUFFIX`"));
    };
    let num = |s: &str| -> Result<u64, WebError> {
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad("range bounds must be decimal numbers"));
        }
        // A bound past u64 is past any blob: clamp it (RFC 9110 §14.1.2).
        Ok(s.parse::<u64>().unwrap_or(u64::MAX))
    };
    let (a, b) = (a.trim(), b.trim());
    let (start, end) = if a.is_empty() {
        let n = num(b)?;
        if n == 0 {
            return Err(bad("a suffix range of 0 bytes is empty"));
        }
        (size.saturating_sub(n), size.saturating_sub(1))
    } else {
        let start = num(a)?;
        let end =
            if b.is_empty() { size.saturating_sub(1) } else { num(b)?.min(size.saturating_sub(1)) };
        if !b.is_empty() && num(b)? < start {
            return Err(bad("range end is before its start"));
        }
        (start, end)
    };
    if size == 0 || start >= size {
        return Err(bad(&format!("range starts at or beyond the end of the {size}-byte blob")));
    }
    Ok(Some((start, end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn satisfiable_ranges() {
        let ok = |h: &str| parse(h, 100).unwrap().unwrap();
        assert_eq!(ok("bytes=0-9"), (0, 9));
        assert_eq!(ok("bytes=90-"), (90, 99));
        assert_eq!(ok("bytes=-10"), (90, 99));
        assert_eq!(ok("bytes=-1000"), (0, 99));
        assert_eq!(ok("bytes=50-1000"), (50, 99), "end is clamped");
        assert_eq!(ok("bytes=5-99999999999999999999999"), (5, 99));
    }

    #[test]
    fn other_units_and_several_ranges_are_ignored() {
        for h in ["items=0-1", "bytes=0-1,3-4", "bytes=0-1, 5-", "none"] {
            assert_eq!(parse(h, 100).unwrap(), None, "{h}");
        }
    }

    #[test]
    fn unsatisfiable_or_malformed() {
        for h in [
            "bytes=100-",
            "bytes=5-2",
            "bytes=-0",
            "bytes=a-b",
            "bytes=99999999999999999999999-",
            "bytes=-0000",
            "bytes=",
            "bytes=--1",
        ] {
            assert!(parse(h, 100).is_err(), "{h}");
        }
        assert!(parse("bytes=0-0", 0).is_err());
        assert!(parse(&format!("bytes=0-{}", "9".repeat(300)), 100).is_err());
    }
}
