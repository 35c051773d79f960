//! Blob keys in URLs: `/blobs/a/b%20c.png` → `a/b c.png`.
//!
//! Each `/`-separated segment of the raw (still percent-encoded) path is decoded on its own,
//! so an encoded slash (`%2F`) can never turn one segment into two, and the result must be a
//! valid blob name (no empty, `.` or `..` segment, no NUL or control character). Routers that
//! decode the whole path first would let `a%2F..%2Fb` through as `a/../b`; this one refuses it.

use bs_store::{shown_name, validate_name};
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

use crate::error::WebError;

/// The key in `path` after `route_prefix` (e.g. `/blobs/`), decoded and validated.
pub fn key_from_path(path: &str, route_prefix: &str) -> Result<String, WebError> {
    let raw = path.strip_prefix(route_prefix).unwrap_or_default();
    let bad = |reason: &str| WebError::InvalidKey { key: shown_name(raw), reason: reason.into() };
    if raw.is_empty() {
        return Err(bad("empty"));
    }
    let mut key = String::with_capacity(raw.len());
    for (i, seg) in raw.split('/').enumerate() {
        let decoded = percent_decode_str(seg)
            .decode_utf8()
            .map_err(|_| bad("percent-encoding that is not UTF-8"))?;
        if decoded.contains('/') {
            return Err(bad("contains an encoded '/' (%2F) inside a segment"));
        }
        if i > 0 {
            key.push('/');
        }
        key.push_str(&decoded);
    }
    validate_key(&key)?;
    Ok(key)
}

/// A key given in a query string or JSON body.
pub fn validate_key(key: &str) -> Result<(), WebError> {
    validate_name(key).map_err(WebError::from)
}

/// A folder prefix for listing and search: empty, or a valid name followed by `/`.
pub fn validate_prefix(prefix: &str) -> Result<(), WebError> {
    if prefix.is_empty() {
        return Ok(());
    }
    let bad =
        |reason: &str| WebError::InvalidKey { key: shown_name(prefix), reason: reason.into() };
    let Some(folder) = prefix.strip_suffix('/') else {
        return Err(bad("a folder prefix must be empty or end with '/'"));
    };
    validate_name(folder).map_err(|_| bad("not a valid folder name"))
}

/// Characters escaped in one path segment of a URL.
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// The URL path of a key under `route_prefix` (the inverse of [`key_from_path`]).
pub fn path_of(route_prefix: &str, key: &str) -> String {
    let segs: Vec<String> =
        key.split('/').map(|s| utf8_percent_encode(s, SEGMENT).to_string()).collect();
    format!("{route_prefix}{}", segs.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_decode_per_segment() {
        assert_eq!(key_from_path("/blobs/a/b%20c.png", "/blobs/").unwrap(), "a/b c.png");
        assert_eq!(key_from_path("/blobs/%C3%A9t%C3%A9", "/blobs/").unwrap(), "été");
    }

    #[test]
    fn path_tricks_are_refused() {
        for p in [
            "/blobs/",
            "/blobs/..",
            "/blobs/a/../b",
            "/blobs/a/%2E%2E/b",
            "/blobs/a%2F..%2Fb",
            "/blobs/a%2fb",
            "/blobs/a%00b",
            "/blobs/a//b",
            "/blobs/a/",
            "/blobs/%FF",
            "/blobs/a%5Cb",
        ] {
            assert!(key_from_path(p, "/blobs/").is_err(), "{p} must be refused");
        }
    }

    #[test]
    fn paths_round_trip() {
        for k in ["a/b c.png", "x/%41?#/y", "été/z"] {
            assert_eq!(key_from_path(&path_of("/blobs/", k), "/blobs/").unwrap(), k);
        }
    }

    #[test]
    fn prefixes() {
        assert!(validate_prefix("").is_ok());
        assert!(validate_prefix("a/b/").is_ok());
        for p in ["a", "/", "../", "a//", "a/../"] {
            assert!(validate_prefix(p).is_err(), "{p}");
        }
    }
}
