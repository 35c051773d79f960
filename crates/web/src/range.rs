//! The `Range` request header (RFC 9110 §14): one `bytes=` range is served as 206; several
//! ranges, other units, malformed or unsatisfiable ranges, and headers over 256 bytes get 416
//! with `Content-Range: bytes */SIZE`, so a client always learns why it got no partial body.

use crate::error::WebError;

/// Longest `Range` header considered.
const MAX_HEADER: usize = 256;

/// The inclusive byte range `start..=end` of a blob of `size` bytes that `header` asks for.
pub fn parse(header: &str, size: u64) -> Result<(u64, u64), WebError> {
    let bad = |reason: &str| WebError::RangeNotSatisfiable { size, reason: reason.to_string() };
    if header.len() > MAX_HEADER {
        return Err(bad("Range header longer than 256 bytes"));
    }
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return Err(bad("only `bytes=` ranges are supported"));
    };
    if spec.contains(',') {
        return Err(bad("only one range per request is supported"));
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
    Ok((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn satisfiable_ranges() {
        assert_eq!(parse("bytes=0-9", 100).unwrap(), (0, 9));
        assert_eq!(parse("bytes=90-", 100).unwrap(), (90, 99));
        assert_eq!(parse("bytes=-10", 100).unwrap(), (90, 99));
        assert_eq!(parse("bytes=-1000", 100).unwrap(), (0, 99));
        assert_eq!(parse("bytes=50-1000", 100).unwrap(), (50, 99), "end is clamped");
        assert_eq!(parse("bytes=5-99999999999999999999999", 100).unwrap(), (5, 99));
    }

    #[test]
    fn unsatisfiable_or_malformed() {
        for h in [
            "bytes=100-",
            "bytes=5-2",
            "bytes=-0",
            "bytes=a-b",
            "bytes=0-1,3-4",
            "items=0-1",
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
