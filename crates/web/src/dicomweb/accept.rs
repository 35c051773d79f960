//! Media types with their parameters (STOW-RS's Content-Type too), the `Accept` header of
//! a WADO-RS instance retrieval (PS3.18 8.7.3.5): which transfer syntaxes the client takes for
//! its `application/dicom` parts, and that of a search or metadata request, answered only as
//! `application/dicom+json` (a client that takes only XML gets 406).
//!
//! blobstream sends instances as stored (it does not transcode), so the question is only
//! whether the client takes each instance's stored transfer syntax. It does when its Accept
//! header is absent, names `*/*`, `multipart/*` or `multipart/related` without a type, or an
//! `application/dicom` range (in `multipart/related; type=…` or on its own) with
//! `transfer-syntax=*` or without a transfer-syntax parameter (as Orthanc and dcm4chee answer
//! that case); otherwise only the transfer syntaxes it lists. Each transfer syntax is weighed
//! by the most specific range that matches it (one naming it, then `application/dicom`
//! parts, `multipart/related`, `multipart/*`, `*/*`), as RFC 9110 12.5.1 says: a `q=0` there
//! refuses it whatever less specific ranges take; other `q` values do not matter here, as
//! every instance taken is answered the same way.

use crate::error::WebError;

/// The transfer syntaxes a retrieval takes: what the client's Accept ranges say of each
/// (`None`: no Accept, every one).
#[derive(Debug)]
pub(crate) struct Syntaxes(Option<Vec<MediaRange>>);

impl Syntaxes {
    pub(crate) fn takes(&self, ts: &str) -> bool {
        let Some(ranges) = &self.0 else { return true };
        let dicom =
            |media: &str, params: &[_]| part_match(media, params, "application/dicom", ts, true);
        weighed(ranges, dicom).is_some_and(|q| q > 0.0)
    }
}

/// How specifically a range takes `multipart/related` parts of media type `part` in transfer
/// syntax `ts` (higher: more; one naming `ts`, then one of that type, `multipart/related`,
/// `multipart/*`, `*/*`), `None` when it does not match them. `alone`: a range of `part`
/// itself takes them too (as single parts).
fn part_match(
    media: &str,
    params: &[(String, String)],
    part: &str,
    ts: &str,
    alone: bool,
) -> Option<u8> {
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let named = match get("transfer-syntax") {
        None | Some("*") => 0,
        Some(t) if t == ts => 1,
        Some(_) => return None,
    };
    let kind = get("type").map(str::to_ascii_lowercase);
    let base = match media {
        "*/*" => 1,
        "multipart/*" => 2,
        "multipart/related" => match kind.as_deref() {
            None | Some("*/*") => 3,
            // What is sent: parts of that type, in multipart/related.
            Some(k) if k == part => 5,
            Some(_) => return None,
        },
        m if alone && m == part => 4,
        _ => return None,
    };
    Some(base * 2 + named)
}

/// The `q` of the most specific of `ranges` that matches (by `matches`, which says how
/// specifically), the first of equals; `None` when none does. A range whose `q` is no number
/// from 0 to 1 says nothing the server can follow and is passed over.
fn weighed(
    ranges: &[MediaRange],
    matches: impl Fn(&str, &[(String, String)]) -> Option<u8>,
) -> Option<f32> {
    let mut best: Option<(u8, f32)> = None;
    for (media, params) in ranges {
        let (Some(s), Some(q)) = (matches(media, params), q_of(params)) else { continue };
        if best.is_none_or(|(b, _)| s > b) {
            best = Some((s, q));
        }
    }
    best.map(|(_, q)| q)
}

/// Read an `Accept` header (`None`: absent) for an instance retrieval; 406 when it takes no
/// `application/dicom` parts at all.
pub(crate) fn dicom_syntaxes(accept: Option<&str>) -> Result<Syntaxes, WebError> {
    let Some(ranges) = all_ranges(accept) else { return Ok(Syntaxes(None)) };
    let syntaxes = Syntaxes(Some(ranges));
    // It takes some syntax if it takes one it names, or one it does not (the empty name).
    let ranges = syntaxes.0.as_deref().unwrap_or_default();
    let named = ranges.iter().filter_map(|(_, p)| {
        p.iter().find(|(k, _)| k == "transfer-syntax").map(|(_, v)| v.as_str())
    });
    let takes_dicom = named.chain([""]).any(|ts| syntaxes.takes(ts));
    if !takes_dicom {
        return Err(WebError::NotAcceptable(format!(
            "instances are retrieved as multipart/related; type=\"application/dicom\", which \
             Accept: {} does not take",
            accept.unwrap_or_default()
        )));
    }
    Ok(syntaxes)
}

/// The query parameters PS3.18 §8.3.3.1 lets every DICOMweb request carry in place of its
/// headers: `accept` (for Accept) and `charset` (for Accept-Charset).
pub(crate) const QUERY_HEADERS: &[&str] = &["accept", "charset"];

/// What a client accepts: its `accept` query parameters (PS3.18 §8.3.3.1), which replace the
/// Accept header when given, else the header's lines joined; `None` when neither says.
/// `charset`, the query's Accept-Charset, must allow UTF-8, the one charset answered in (406
/// otherwise).
pub(crate) fn accepted(
    query: &[(String, String)],
    headers: &axum::http::HeaderMap,
) -> Result<Option<String>, WebError> {
    let asked = |name: &str| -> Vec<String> {
        query.iter().filter(|(k, _)| k == name).map(|(_, v)| plus_restored(v)).collect()
    };
    let charsets = asked("charset");
    if !charsets.is_empty() {
        // UTF-8 by name, else `*`: its weight decides, as a media type's most specific range.
        let list = charsets.join(",");
        // (A name whose q is no number from 0 to 1 is ignored.)
        let weight = |names: &[&str]| {
            split(&list, ',')
                .map(media_type)
                .filter(|(n, _)| names.contains(&n.as_str()))
                .find_map(|(_, params)| q_of(&params))
        };
        let takes = weight(&["utf-8", "utf8"]).or_else(|| weight(&["*"])).unwrap_or(0.0) > 0.0;
        if !takes {
            return Err(WebError::NotAcceptable(format!(
                "answers are in UTF-8, which charset={} does not take",
                charsets.join(",")
            )));
        }
    }
    let given = asked("accept");
    if !given.is_empty() {
        return Ok(Some(given.join(", ")));
    }
    let mut lines = Vec::new();
    for value in headers.get_all(axum::http::header::ACCEPT) {
        let value = value.to_str().map_err(|_| {
            WebError::BadRequest("the Accept header is not visible ASCII".to_string())
        })?;
        lines.push(value);
    }
    Ok((!lines.is_empty()).then(|| lines.join(", ")))
}

/// A query value as sent: a `+` in a media type (`application/dicom+json`) that a client left
/// unencoded arrives as a space, and a space between two letters or digits is in no media
/// type or parameter, so it is a `+` again.
fn plus_restored(v: &str) -> String {
    let c: Vec<char> = v.chars().collect();
    let word = |i: Option<&char>| i.is_some_and(|c| c.is_ascii_alphanumeric());
    let at = |i: usize| c[i] == ' ' && i > 0 && word(c.get(i - 1)) && word(c.get(i + 1));
    (0..c.len()).map(|i| if at(i) { '+' } else { c[i] }).collect()
}

/// Does `accept` (see [`accepted`]) take `application/dicom+json` — by its most specific
/// range ([`quality`]: itself, `application/*`, `*/*`) with a `q` above 0, or by
/// `application/json` where it is not refused by name? 406 when it does not: a client that
/// asks for `multipart/related; type="application/dicom+xml"` is told, not sent JSON it cannot
/// read.
pub(crate) fn dicom_json(accept: Option<&str>) -> Result<(), WebError> {
    const DICOM_JSON: &str = "application/dicom+json";
    let named = accept.is_some_and(|a| {
        split(a, ',').map(media_type).any(|(m, p)| m == DICOM_JSON && q_of(&p).is_some())
    });
    let json =
        quality(accept, DICOM_JSON) > 0.0 || (!named && quality(accept, "application/json") > 0.0);
    if json {
        Ok(())
    } else {
        Err(WebError::NotAcceptable(format!(
            "this is answered as application/dicom+json, which Accept: {} does not take \
             (the XML form is not supported)",
            accept.unwrap_or_default()
        )))
    }
}

/// A media type (lower case) and its parameters, as [`media_type`] reads them.
type MediaRange = (String, Vec<(String, String)>);

/// Every range of an `Accept` header (those with `q=0` or an invalid `q` too: [`weighed`]
/// sorts them out), each a media type and its parameters; `None` when the header is absent or
/// empty (anything is taken).
fn all_ranges(accept: Option<&str>) -> Option<Vec<MediaRange>> {
    let accept = accept.map(str::trim).filter(|a| !a.is_empty())?;
    Some(split(accept, ',').map(media_type).collect())
}

/// How much a client with this `Accept` header wants `media` (a `type/subtype`): the `q` of
/// the most specific range that matches it (`type/subtype`, then `type/*`, then `*/*`, as
/// RFC 9110 12.5.1 says), 1 when there is no header, 0 when no range matches.
fn quality(accept: Option<&str>, media: &str) -> f32 {
    let Some(ranges) = all_ranges(accept) else { return 1.0 };
    let kind = media.split('/').next().unwrap_or_default();
    let specificity = |range: &str, _: &[(String, String)]| {
        if range == media {
            Some(3)
        } else if range.strip_suffix("/*") == Some(kind) {
            Some(2)
        } else {
            (range == "*/*").then_some(1)
        }
    };
    weighed(&ranges, specificity).unwrap_or(0.0)
}

/// The weight (`q`) of a range's parameters: 1 when it has none, `None` when it is no number
/// from 0 to 1 (RFC 9110 12.4.2).
fn q_of(params: &[(String, String)]) -> Option<f32> {
    match params.iter().find(|(k, _)| k == "q") {
        None => Some(1.0),
        Some((_, v)) => v.parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q)),
    }
}

/// May a rendered image go to a client with this `Accept` header, and as JPEG? The one it
/// wants more (the `q` of [`quality`]), PNG on a tie; 406 when it takes neither.
pub(crate) fn rendered_jpeg(accept: Option<&str>) -> Result<bool, WebError> {
    let (png, jpeg) = (quality(accept, "image/png"), quality(accept, "image/jpeg"));
    if png <= 0.0 && jpeg <= 0.0 {
        return Err(WebError::NotAcceptable(format!(
            "a rendered image is image/png or image/jpeg, which Accept: {} does not take",
            accept.unwrap_or_default()
        )));
    }
    Ok(jpeg > png)
}

/// Does `Accept` take frames as they are sent: `multipart/related; type=
/// "application/octet-stream"`, each part a frame's samples in Explicit VR Little Endian's
/// layout (`transfer-syntax` absent, `*` or 1.2.840.10008.1.2.1)? 406 when it does not (a
/// client asking for compressed frames, or one part without multipart, is told, not sent
/// what it cannot read).
pub(crate) fn native_frames(accept: Option<&str>) -> Result<(), WebError> {
    let Some(ranges) = all_ranges(accept) else { return Ok(()) };
    // The most specific range matching such a part decides (as for instances' syntaxes).
    let native = |media: &str, params: &[_]| {
        part_match(media, params, "application/octet-stream", "1.2.840.10008.1.2.1", false)
    };
    if weighed(&ranges, native).is_some_and(|q| q > 0.0) {
        Ok(())
    } else {
        Err(WebError::NotAcceptable(format!(
            "frames are sent as multipart/related; type=\"application/octet-stream\" (native \
             samples, transfer-syntax=1.2.840.10008.1.2.1), which Accept: {} does not take",
            accept.unwrap_or_default()
        )))
    }
}

/// A media type (lower case) and its parameters (names lower case, values unquoted), as in
/// `multipart/related; type="application/dicom"; boundary=x`.
pub(crate) fn media_type(s: &str) -> MediaRange {
    let mut parts = split(s, ';');
    let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let params = parts
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"').to_string()))
        .collect();
    (media, params)
}

/// Split at `sep` outside double quotes.
fn split(s: &str, sep: char) -> impl Iterator<Item = &str> {
    let mut quoted = false;
    let mut start = 0;
    let mut cuts = Vec::new();
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                cuts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    cuts.push(&s[start..]);
    cuts.into_iter()
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVRLE: &str = "1.2.840.10008.1.2.1";
    const J2K: &str = "1.2.840.10008.1.2.4.90";
    const JPEG: &str = "1.2.840.10008.1.2.4.50";

    #[test]
    fn as_stored_unless_the_client_lists_transfer_syntaxes() {
        for a in [
            None,
            Some(""),
            Some("*/*"),
            Some("text/html, application/xhtml+xml, */*;q=0.8"),
            Some("multipart/related"),
            Some("multipart/related; type=\"application/dicom\""),
            Some("multipart/related; type=\"application/dicom\"; transfer-syntax=*"),
            Some("application/dicom"),
            Some(&format!("multipart/related; type=application/dicom; transfer-syntax={J2K}, */*")),
        ] {
            let s = dicom_syntaxes(a).unwrap();
            assert!([EVRLE, J2K, JPEG].iter().all(|ts| s.takes(ts)), "{a:?}");
        }
    }

    #[test]
    fn listed_transfer_syntaxes_are_the_only_ones_taken() {
        let a = format!(
            "multipart/related; type=\"application/dicom\"; transfer-syntax={EVRLE}, \
             multipart/related; type=\"application/dicom\"; transfer-syntax={J2K}; q=0.5, \
             multipart/related; type=\"application/dicom\"; transfer-syntax=*; q=0"
        );
        let s = dicom_syntaxes(Some(&a)).unwrap();
        assert!(s.takes(EVRLE) && s.takes(J2K) && !s.takes(JPEG));
        let only = format!("multipart/related; type=application/dicom; transfer-syntax={J2K}");
        let s = dicom_syntaxes(Some(&only)).unwrap();
        assert!(s.takes(J2K) && !s.takes(EVRLE));
    }

    /// The most specific range that matches a syntax decides: a `q=0` there refuses it,
    /// whatever a broader range takes (RFC 9110 12.5.1).
    #[test]
    fn a_refusal_by_name_outweighs_a_broader_range() {
        // What is sent is multipart: its own range outweighs a bare application/dicom.
        let a = "application/dicom; q=0, multipart/related; type=\"application/dicom\"";
        assert!(dicom_syntaxes(Some(a)).unwrap().takes(EVRLE));
        let dicom = "multipart/related; type=\"application/dicom\"";
        let a = format!("{dicom}; transfer-syntax={JPEG}; q=0, {dicom}, */*");
        let s = dicom_syntaxes(Some(&a)).unwrap();
        assert!(s.takes(EVRLE) && s.takes(J2K) && !s.takes(JPEG));
        // Refused as a type: no syntax is taken through */*.
        let e = dicom_syntaxes(Some(&format!("{dicom}; q=0, */*"))).unwrap_err();
        assert!(matches!(e, WebError::NotAcceptable(_)), "{e}");
        let a = format!("{dicom}; q=0, {dicom}; transfer-syntax={J2K}");
        let s = dicom_syntaxes(Some(&a)).unwrap();
        assert!(s.takes(J2K) && !s.takes(EVRLE), "only the one named");
        // A range whose q is no number says nothing: the broader one stands.
        let s = dicom_syntaxes(Some(&format!("{dicom}; q=x, */*"))).unwrap();
        assert!(s.takes(EVRLE));
    }

    #[test]
    fn an_accept_without_dicom_is_not_acceptable() {
        for a in [
            "application/json",
            "multipart/related; type=\"application/octet-stream\"",
            "multipart/related; type=\"application/dicom\"; q=0",
        ] {
            let e = dicom_syntaxes(Some(a)).unwrap_err();
            assert!(matches!(e, WebError::NotAcceptable(_)), "{a}: {e}");
        }
    }

    #[test]
    fn rendered_images_are_png_or_jpeg_or_refused() {
        for (a, jpeg) in [
            (None, false),
            (Some("*/*"), false),
            (Some("image/*"), false),
            (Some("image/png"), false),
            (Some("image/jpeg"), true),
            (Some("image/jpeg, image/png;q=0.5"), true),
            (Some("image/png;q=0.4, image/jpeg;q=0.6"), true),
            (Some("image/png;q=0.6, image/jpeg;q=0.4"), false),
            (Some("image/jpeg, image/png"), false),
            (Some("image/jpeg, image/png;q=0"), true),
            (Some("image/webp, image/jpeg;q=0.8"), true),
            (Some("image/*;q=0.5, image/jpeg"), true),
            (Some("image/png;q=0, */*"), true),
        ] {
            assert_eq!(rendered_jpeg(a).unwrap(), jpeg, "{a:?}");
        }
        for a in [
            "image/gif",
            "application/json",
            "image/png;q=0",
            "text/html",
            "image/*;q=0",
            "image/png;q=abc",
            "image/jpeg;q=2",
        ] {
            let e = rendered_jpeg(Some(a)).unwrap_err();
            assert!(matches!(e, WebError::NotAcceptable(_)), "{a}: {e}");
        }
    }

    #[test]
    fn frames_are_native_octet_streams_or_refused() {
        for a in [
            None,
            Some("*/*"),
            Some("multipart/related"),
            Some("multipart/related; type=\"application/octet-stream\""),
            Some("multipart/related; type=application/octet-stream; transfer-syntax=*"),
            Some(&format!(
                "multipart/related; type=\"application/octet-stream\"; transfer-syntax={EVRLE}"
            )),
            Some("multipart/related; type=\"image/jls\", multipart/*;q=0.1"),
        ] {
            native_frames(a).unwrap_or_else(|e| panic!("{a:?}: {e}"));
        }
        for a in [
            "multipart/related; type=\"image/jpeg\"",
            concat!(
                "multipart/related; type=\"application/octet-stream\"; ",
                "transfer-syntax=1.2.840.10008.1.2.4.50"
            ),
            "application/octet-stream",
            "multipart/related; type=\"application/octet-stream\"; q=0",
            "multipart/related; type=\"application/octet-stream\"; q=0, */*",
            "multipart/related; q=0, multipart/*",
            "image/png",
        ] {
            let e = native_frames(Some(a)).unwrap_err();
            assert!(matches!(e, WebError::NotAcceptable(_)), "{a}: {e}");
        }
    }

    fn headers(values: &[&str]) -> axum::http::HeaderMap {
        let mut h = axum::http::HeaderMap::new();
        for v in values {
            h.append(axum::http::header::ACCEPT, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_query_may_stand_for_the_headers() {
        let q = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let h = headers(&["application/dicom+xml"]);
        assert_eq!(accepted(&[], &h).unwrap().as_deref(), Some("application/dicom+xml"));
        assert_eq!(accepted(&[], &headers(&[])).unwrap(), None);
        // The query's accept replaces the header; an unencoded + (a space) is a + again.
        let json = q(&[("accept", "application/dicom json")]);
        assert_eq!(accepted(&json, &h).unwrap().as_deref(), Some("application/dicom+json"));
        let two = q(&[("accept", "image/png, multipart/related; type=\"application/dicom\"")]);
        let got = accepted(&two, &h).unwrap().unwrap();
        assert_eq!(got, "image/png, multipart/related; type=\"application/dicom\"");
        for ok in ["utf-8", "UTF-8", "iso-8859-1, utf-8;q=0.5", "*", "utf-8;q=abc, *"] {
            assert!(accepted(&q(&[("charset", ok)]), &h).is_ok(), "{ok}");
        }
        for refused in ["iso-8859-1", "utf-8;q=0", "utf-8;q=0, *"] {
            let e = accepted(&q(&[("charset", refused)]), &h).unwrap_err();
            assert!(matches!(e, WebError::NotAcceptable(_)), "{refused}: {e}");
        }
    }

    #[test]
    fn searches_and_metadata_are_json_or_refused() {
        let with =
            |values: &[&str]| dicom_json(accepted(&[], &headers(values)).unwrap().as_deref());
        for ok in [
            &[][..],
            &[""],
            &["*/*"],
            &["application/dicom+json"],
            &["application/json; q=0.5"],
            &["text/html, application/*;q=0.8"],
            &["application/dicom+xml", "application/dicom+json"],
            &["application/dicom+json;q=x, application/json"],
        ] {
            assert!(with(ok).is_ok(), "{ok:?}");
        }
        for refused in [
            &["application/dicom+xml"][..],
            &["multipart/related; type=\"application/dicom+xml\""],
            &["application/dicom+json; q=0"],
            &["application/dicom+json;q=0, */*"],
            &["application/*;q=0, */*"],
            &["text/html"],
        ] {
            let e = with(refused).unwrap_err();
            assert!(matches!(e, WebError::NotAcceptable(_)), "{refused:?}: {e}");
        }
    }
}
