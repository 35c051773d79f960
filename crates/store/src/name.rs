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
