//! Blob names: what is allowed, and why.
//!
//! A name is 1..=1024 bytes of UTF-8 made of `/`-separated segments. Segments may not be
//! empty, `.` or `..`; names may not start with `/`, contain NUL, control characters or `\`.
//! Stores never use names as file paths (files are named by random ids), so this is about
//! names meaning one thing everywhere (CLI, HTTP paths, listings), not only about safety.

use crate::error::StoreError;

/// Longest accepted name, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// Check a blob name; the error says what is wrong with it.
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    let bad = |reason| Err(StoreError::InvalidName { name: shown_name(name), reason });
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("longer than 1024 bytes");
    }
    if name.starts_with('/') {
        return bad("absolute (starts with '/')");
    }
    if name.chars().any(|c| c == '\0') {
        return bad("contains NUL");
    }
    if name.chars().any(|c| c.is_control()) {
        return bad("contains a control character");
    }
    if name.contains('\\') {
        return bad("contains '\\'");
    }
    for seg in name.split('/') {
        match seg {
            "" => return bad("has an empty path segment ('//' or trailing '/')"),
            "." | ".." => return bad("has a '.' or '..' segment"),
            _ => {}
        }
    }
    Ok(())
}

/// Most bytes of user metadata (keys and values together) a blob carries.
pub const MAX_METADATA_BYTES: usize = 8 * 1024;

/// Most bytes of a content type.
pub const MAX_CONTENT_TYPE_LEN: usize = 255;

/// Check what a client's upload asks for, at the edges (the gRPC route, the HTTP uploads; not
/// in the stores, which also take back records stored before, as a tier caching one does):
/// its name ([`validate_name`]), and the user metadata and content type it would carry —
/// shown by `stat`, sent as HTTP headers, so no control character but a tab in a value (an
/// escape sequence would rewrite a terminal), keys not empty, a content type of printable
/// ASCII (or tabs) as a header value may be, and 8 KiB of metadata at most (as the HTTP API
/// takes).
pub fn validate_route(spec: &crate::RouteSpec) -> Result<(), StoreError> {
    validate_name(&spec.name)?;
    let bad = |why: String| Err(StoreError::InvalidMetadata(why));
    let ct = &spec.content_type;
    if ct.len() > MAX_CONTENT_TYPE_LEN {
        return bad(format!("the content type is over {MAX_CONTENT_TYPE_LEN} bytes"));
    }
    if !ct.bytes().all(|b| (0x20..0x7f).contains(&b) || b == b'\t') {
        return bad(format!(
            "the content type {:?} is not printable ASCII (a media type: text/plain, image/png)",
            shown_name(ct)
        ));
    }
    let mut bytes = 0;
    for (k, v) in &spec.metadata {
        if k.is_empty() {
            return bad("a metadata key is empty".into());
        }
        if k.chars().any(char::is_control) || v.chars().any(|c| c.is_control() && c != '\t') {
            return bad(format!(
                "metadata {:?} holds a control character (a line break, an escape)",
                shown_name(k)
            ));
        }
        bytes += k.len() + v.len();
    }
    if bytes > MAX_METADATA_BYTES {
        return bad(format!("user metadata is {bytes} bytes, over {MAX_METADATA_BYTES}"));
    }
    Ok(())
}

/// Characters of a refused name an error repeats: a name of any length is refused with a
/// message of bounded size.
const SHOWN_CHARS: usize = 100;

/// `name` for an error message: whole, or its start and how long it is.
pub fn shown_name(name: &str) -> String {
    match name.char_indices().nth(SHOWN_CHARS) {
        None => name.to_string(),
        Some((cut, _)) => format!("{}… ({} bytes)", &name[..cut], name.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn path_tricks_are_refused() {
        for n in [
            "",
            "..",
            "../etc/passwd",
            "a/../../b",
            "a/./b",
            "/etc/passwd",
            "a\0b",
            "a//b",
            "a/",
            "a\\..\\b",
            "line\nbreak",
        ] {
            assert!(validate_name(n).is_err(), "{n:?} accepted");
        }
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
    }

    #[test]
    fn metadata_and_content_types_a_terminal_or_a_header_cannot_take_are_refused() {
        let spec = |ct: &str, meta: &[(&str, &str)]| crate::RouteSpec {
            name: "a".into(),
            content_type: ct.into(),
            metadata: meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        let ok = spec("image/png; q=1", &[("modality", "CT"), ("note", "é 1/2\tand a tab")]);
        assert!(validate_route(&ok).is_ok());
        assert!(validate_route(&spec("", &[])).is_ok(), "no content type: guessed later");
        for (bad, why) in [
            (spec("te\nxt/plain", &[]), "not printable ASCII"),
            (spec("text/\x1b[31m", &[]), "not printable ASCII"),
            (spec(&"t".repeat(300), &[]), "over 255 bytes"),
            (spec("", &[("", "v")]), "key is empty"),
            (spec("", &[("k", "line\nbreak")]), "control character"),
            (spec("", &[("k", "esc\x1b[31m")]), "control character"),
            (spec("", &[("a\tb", "c")]), "control character"),
            (spec("", &[("k", &"v".repeat(9000))]), "over 8192"),
        ] {
            let e = validate_route(&bad).unwrap_err();
            assert!(matches!(e, StoreError::InvalidMetadata(_)), "{e:?}");
            assert!(e.to_string().contains(why), "{e}");
        }
        assert!(matches!(
            validate_route(&crate::RouteSpec { name: "../x".into(), ..Default::default() }),
            Err(StoreError::InvalidName { .. })
        ));
    }

    #[test]
    fn a_long_refused_name_is_not_repeated_whole() {
        let e = validate_name(&"é".repeat(10_000)).unwrap_err().to_string();
        assert!(e.len() < 400 && e.contains("(20000 bytes)"), "{e}");
        assert!(e.contains("longer than 1024 bytes"), "{e}");
        let e = validate_name("a//b").unwrap_err().to_string();
        assert!(e.contains("\"a//b\""), "{e}");
    }

    #[test]
    fn ordinary_names_pass() {
        for n in [
            "a",
            "studies/2026/ct-001.dcm",
            "video.mp4",
            "x".repeat(MAX_NAME_LEN).as_str(),
            "..a/b..",
            "ünïcode/名前",
        ] {
            validate_name(n).unwrap();
        }
    }

    proptest! {
        #[test]
        fn accepted_names_never_escape(name in "\\PC{0,64}") {
            if validate_name(&name).is_ok() {
                prop_assert!(!name.split('/').any(|s| s == ".." || s.is_empty()));
                prop_assert!(!name.starts_with('/'));
            }
        }
    }
}
