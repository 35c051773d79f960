//! STOW-RS (PS3.18 10.5): `POST /dicomweb/studies` and `POST /dicomweb/studies/{study}` with a
//! `multipart/related; type="application/dicom"` body. Each part is stored on its own: a part
//! that is not a DICOM file (or, under `{study}`, belongs to another study) is refused with a
//! failure reason and the good parts are kept. The answer (application/dicom+json) lists the
//! stored instances in ReferencedSOPSequence (0008,1199) with their RetrieveURL and the refused
//! ones in FailedSOPSequence (0008,1198); 200 when all were stored, 202 when some were, 409 when
//! none was.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use bs_store::RouteSpec;
use serde_json::Value;

use super::json::Object;
use super::{check_uid, instance_key};
use crate::error::WebError;
use crate::{AppState, blocking};

/// Failure reasons (PS3.4 Annex B / PS3.18 Table 10.5.3-2).
const PROCESSING_FAILURE: i64 = 0x0110;
/// Refused: out of resources (PS3.18 Table I.2-2), for a part larger than an instance may be.
const OUT_OF_RESOURCES: i64 = 0xA700;
const CANNOT_UNDERSTAND: i64 = 0xC000;
const STUDY_MISMATCH: i64 = 0xA900;

/// The boundary of a `multipart/related; type="application/dicom"` content type.
fn boundary(content_type: &str) -> Result<String, WebError> {
    let unsupported = || {
        WebError::UnsupportedMediaType(format!(
            "STOW-RS takes multipart/related; type=\"application/dicom\", not {content_type:?}"
        ))
    };
    let (media, params) = super::accept::media_type(content_type);
    if media != "multipart/related" {
        return Err(unsupported());
    }
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let (boundary, kind) = (get("boundary"), get("type"));
    if kind.as_deref().is_some_and(|k| !k.eq_ignore_ascii_case("application/dicom")) {
        return Err(unsupported());
    }
    match boundary {
        Some(b) if !b.is_empty() && b.len() <= 70 => Ok(b),
        _ => Err(WebError::BadRequest("multipart/related without a usable boundary".into())),
    }
}

/// `POST /dicomweb/studies`.
pub async fn store_any(
    State(st): State<Arc<AppState>>,
    req: Request,
) -> Result<Response, WebError> {
    store(st, None, req).await
}

/// `POST /dicomweb/studies/{study}`.
pub async fn store_in(
    State(st): State<Arc<AppState>>,
    Path(study): Path<String>,
    req: Request,
) -> Result<Response, WebError> {
    check_uid("study", &study)?;
    store(st, Some(study), req).await
}

async fn store(
    st: Arc<AppState>,
    study: Option<String>,
    req: Request,
) -> Result<Response, WebError> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let boundary = boundary(&content_type)?;
    let _slot = st.upload_slot()?;
    let max = st.cfg.max_upload;
    // A part is held in memory to be identified: no bigger than an image may be here (the
    // decode limit on input bytes), whatever the upload limit.
    let max_part = max.min(st.images.limits().max_bytes);
    let limits = multer::Constraints::new().size_limit(multer::SizeLimit::new().whole_stream(max));
    // Bytes of parts' contents handed out so far: whatever else the parser holds (text before
    // the first boundary, a part's headers) is held to a small allowance, so a body whose
    // boundary never comes is refused early rather than kept whole in memory.
    let handed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Paced: a client that goes silent (before a boundary, inside a part) is let go.
    let req = crate::paced::paced_request(&st, req);
    let body = Guarded {
        inner: req.into_body().into_data_stream(),
        received: 0,
        handed: handed.clone(),
        over_at: None,
    };
    let mut mp = multer::Multipart::with_constraints(body, boundary, limits);
    let mut stored = Vec::new();
    let mut failed = Vec::new();
    let mut parts = 0usize;
    // What ends the body early: too big, or not multipart as announced.
    let broken = |e: multer::Error, part: usize| match e {
        multer::Error::StreamSizeExceeded { .. } => {
            WebError::TooLarge(format!("STOW-RS body over the {max}-byte upload limit"))
        }
        // (Its own text says only that reading failed: the reason is the source's.)
        multer::Error::StreamReadFailed(e) => {
            WebError::BadRequest(format!("multipart body, part {part}: {e}"))
        }
        other => WebError::BadRequest(format!("multipart body, part {part}: {other}")),
    };
    loop {
        let read = match mp.next_field().await {
            Ok(None) => break,
            Ok(Some(mut field)) => {
                parts += 1;
                let part_type = field.content_type().map(|m| m.essence_str().to_string());
                // Read in chunks, counted: a part over the limit is read past (its bytes let
                // go) and refused alone, the parts after it still stored.
                let mut buf = bytes::BytesMut::new();
                let mut over = false;
                loop {
                    match field.chunk().await {
                        Ok(Some(c)) => {
                            handed.fetch_add(c.len() as u64, std::sync::atomic::Ordering::Relaxed);
                            if over || (buf.len() + c.len()) as u64 > max_part {
                                over = true;
                                buf = bytes::BytesMut::new();
                            } else {
                                buf.extend_from_slice(&c);
                            }
                        }
                        Ok(None) => break Ok((part_type, over, buf.freeze())),
                        Err(e) => break Err(e),
                    }
                }
            }
            Err(e) => Err(e),
        };
        let (part_type, over, bytes) = match read {
            Ok(r) => r,
            // Nothing stored yet: the request fails as a whole. Otherwise the instances
            // before the break are stored, and the answer says so (202) with the rest failed.
            Err(e) if stored.is_empty() && failed.is_empty() => return Err(broken(e, parts)),
            Err(e) => {
                let why = broken(e, parts).to_string();
                failed.push((None, CANNOT_UNDERSTAND, format!("the body broke off: {why}")));
                break;
            }
        };
        if over {
            let why =
                format!("part {parts} is over the {max_part} bytes a DICOM instance may have here");
            failed.push((None, OUT_OF_RESOURCES, why));
            continue;
        }
        if part_type.as_deref().is_some_and(|t| !t.eq_ignore_ascii_case("application/dicom")) {
            failed.push((
                None,
                CANNOT_UNDERSTAND,
                format!("part {parts} is {}", part_type.unwrap_or_default()),
            ));
            continue;
        }
        let st2 = st.clone();
        let study = study.clone();
        let outcome = blocking(move || Ok(store_one(&st2, study.as_deref(), &bytes))).await?;
        match outcome {
            Ok(ids) => stored.push(ids),
            Err(refusal) => failed.push(*refusal),
        }
    }
    if parts == 0 {
        return Err(WebError::BadRequest("the multipart body has no parts".into()));
    }
    for (_, _, why) in &failed {
        tracing::info!("STOW-RS refused a part: {why}");
    }
    let referenced: Vec<Value> = stored
        .iter()
        .map(|ids: &bs_imageio::DicomIds| {
            Object::default()
                .text("00081150", "UI", &ids.sop_class_uid)
                .text("00081155", "UI", &ids.sop_instance_uid)
                .text(
                    "00081190",
                    "UR",
                    &format!(
                        "/dicomweb/studies/{}/series/{}/instances/{}",
                        ids.study_instance_uid, ids.series_instance_uid, ids.sop_instance_uid
                    ),
                )
                .build()
        })
        .collect();
    let failures: Vec<Value> = failed
        .iter()
        .map(|(ids, reason, _)| {
            let (class, instance) = ids
                .as_ref()
                .map(|i: &bs_imageio::DicomIds| {
                    (i.sop_class_uid.as_str(), i.sop_instance_uid.as_str())
                })
                .unwrap_or(("", ""));
            Object::default()
                .text("00081150", "UI", class)
                .text("00081155", "UI", instance)
                .int("00081197", "US", Some(*reason))
                .build()
        })
        .collect();
    let mut answer = Object::default();
    if let Some(s) = &study {
        answer = answer.text("00081190", "UR", &format!("/dicomweb/studies/{s}"));
    }
    if !referenced.is_empty() {
        answer = answer.sequence("00081199", referenced);
    }
    if !failures.is_empty() {
        answer = answer.sequence("00081198", failures);
    }
    let status = match (stored.is_empty(), failed.is_empty()) {
        (false, true) => StatusCode::OK,
        (false, false) => StatusCode::ACCEPTED,
        (true, _) => StatusCode::CONFLICT,
    };
    let mut r = Response::new(Body::from(answer.build().to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/dicom+json"));
    Ok(r)
}

type Refusal = (Option<bs_imageio::DicomIds>, i64, String);

/// A part as a Part 10 file. A data set written without the Part 10 header (as pydicom writes
/// one that has no preamble: straight from its file meta elements, without their group length)
/// gets the 128-byte preamble, "DICM" and a File Meta Information Group Length computed from
/// the explicit VR little endian elements of group 0002 that follow.
fn part10(bytes: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    use std::borrow::Cow;
    let magic = bytes.get(128..132) == Some(b"DICM") || bytes.starts_with(b"DICM");
    if magic || !bytes.starts_with(&[0x02, 0x00]) {
        return Cow::Borrowed(bytes);
    }
    // Walk group 0002: tag (4), VR (2), then a 2-byte length, or 2 reserved and 4 bytes.
    let mut at = 0usize;
    let mut has_length = false;
    while let Some(h) = bytes.get(at..at + 8) {
        if h[..2] != [0x02, 0x00] {
            break;
        }
        has_length |= h[2..4] == [0x00, 0x00];
        let long = matches!(
            &h[4..6],
            b"OB"
                | b"OW"
                | b"OF"
                | b"OD"
                | b"OL"
                | b"OV"
                | b"SQ"
                | b"UT"
                | b"UN"
                | b"UC"
                | b"UR"
                | b"SV"
                | b"UV"
        );
        let (head, len) = if long {
            match bytes.get(at + 8..at + 12) {
                Some(l) => (12, u32::from_le_bytes(l.try_into().expect("4")) as usize),
                None => return Cow::Borrowed(bytes),
            }
        } else {
            (8, usize::from(u16::from_le_bytes([h[6], h[7]])))
        };
        at = match at.checked_add(head + len) {
            Some(n) if n <= bytes.len() => n,
            _ => return Cow::Borrowed(bytes),
        };
    }
    let mut v = Vec::with_capacity(bytes.len() + 144);
    v.extend_from_slice(&[0u8; 128]);
    v.extend_from_slice(b"DICM");
    if !has_length {
        v.extend_from_slice(&[0x02, 0x00, 0x00, 0x00, b'U', b'L', 4, 0]);
        v.extend_from_slice(&(at as u32).to_le_bytes());
    }
    v.extend_from_slice(bytes);
    Cow::Owned(v)
}

/// Store one part: identify it, check it belongs where it was sent, store and index it.
fn store_one(
    st: &AppState,
    study: Option<&str>,
    bytes: &[u8],
) -> Result<bs_imageio::DicomIds, Box<Refusal>> {
    let bytes = &*part10(bytes);
    let ids = bs_imageio::dicom_ids(bytes, st.images.limits())
        .map_err(|e| Box::new((None, CANNOT_UNDERSTAND, e.to_string())))?;
    let refuse = |reason, why: String| Box::new((Some(ids.clone()), reason, why));
    for (what, uid) in [
        ("study", &ids.study_instance_uid),
        ("series", &ids.series_instance_uid),
        ("instance", &ids.sop_instance_uid),
    ] {
        if !super::valid_uid(uid) {
            return Err(refuse(
                CANNOT_UNDERSTAND,
                format!("{what} UID {uid:?} is not a DICOM UID"),
            ));
        }
    }
    if study.is_some_and(|s| s != ids.study_instance_uid) {
        return Err(refuse(
            STUDY_MISMATCH,
            format!(
                "instance of study {} sent to study {}",
                ids.study_instance_uid,
                study.unwrap_or("")
            ),
        ));
    }
    let key =
        instance_key(&ids.study_instance_uid, &ids.series_instance_uid, &ids.sop_instance_uid);
    let spec = RouteSpec {
        name: key.clone(),
        content_type: "application/dicom".into(),
        overwrite: true,
        metadata: BTreeMap::new(),
        ..RouteSpec::default()
    };
    bs_store::put_bytes(st.store.as_ref(), &spec, bytes)
        .map_err(|e| refuse(PROCESSING_FAILURE, format!("storing {key}: {e}")))?;
    // Indexing decodes the instance: in one of the server's turns at decoding, as a read.
    if let Err(e) = st.images.refresh_in_turn(&key, || st.image_turn_here()) {
        tracing::warn!("indexing {key}: {e}");
    }
    Ok(ids)
}

/// Bytes of a body that are not parts' contents (before the first boundary, part headers,
/// boundaries) that the parser may hold at once.
const NOT_CONTENT: u64 = 4 << 20;

/// The request body, refused (an error the parser reports) once it has given the parser more
/// than [`NOT_CONTENT`] bytes beyond the parts' contents handed out and the parser, given the
/// chance, hands out nothing more: multer keeps everything it has not matched to a boundary
/// or a header's end, however long the wait. (It also pulls whatever has arrived before it
/// cuts out a part's content, so crossing the allowance alone proves nothing: the first time,
/// the stream says "nothing yet", and the parser hands out what it holds.)
struct Guarded<S> {
    inner: S,
    received: u64,
    handed: Arc<std::sync::atomic::AtomicU64>,
    /// What had been handed out when the allowance was last found crossed.
    over_at: Option<u64>,
}

impl<S> tokio_stream::Stream for Guarded<S>
where
    S: tokio_stream::Stream<Item = Result<bytes::Bytes, axum::Error>> + Unpin,
{
    type Item = Result<bytes::Bytes, std::io::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let handed = self.handed.load(std::sync::atomic::Ordering::Relaxed);
        if self.received.saturating_sub(handed) > NOT_CONTENT {
            if self.over_at == Some(handed) {
                let why = format!(
                    "no boundary or part headers in {NOT_CONTENT} bytes: is the boundary the \
                     body's?"
                );
                return Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    why,
                ))));
            }
            self.over_at = Some(handed);
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.over_at = None;
        match std::pin::Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.received += b.len() as u64;
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(std::io::Error::other(e)))),
            other => other.map(|o| o.map(|r| r.map_err(std::io::Error::other))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the allowance the guard first says "nothing yet" (the parser then hands out
    /// what it holds, and reading goes on); only when nothing more was handed out by the next
    /// poll does it refuse.
    #[test]
    fn the_body_guard_waits_once_for_the_parser_then_refuses() {
        use std::task::{Context, Poll, Waker};
        use tokio_stream::Stream;
        let chunks = || {
            let c = bytes::Bytes::from(vec![b'x'; 1 << 20]);
            tokio_stream::iter((0..6).map(move |_| Ok::<_, axum::Error>(c.clone())))
        };
        let mut cx = Context::from_waker(Waker::noop());
        let guarded = |handed: &Arc<std::sync::atomic::AtomicU64>| Guarded {
            inner: chunks(),
            received: 0,
            handed: handed.clone(),
            over_at: None,
        };
        let poll = |g: &mut Guarded<_>, cx: &mut Context<'_>| std::pin::Pin::new(g).poll_next(cx);
        // The parser hands out content once asked to wait: reading goes on.
        let handed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut g = guarded(&handed);
        for _ in 0..5 {
            assert!(matches!(poll(&mut g, &mut cx), Poll::Ready(Some(Ok(_)))));
        }
        assert!(poll(&mut g, &mut cx).is_pending(), "5 MiB held: the parser's turn first");
        handed.fetch_add(3 << 20, std::sync::atomic::Ordering::Relaxed);
        assert!(matches!(poll(&mut g, &mut cx), Poll::Ready(Some(Ok(_)))));
        // The parser hands out nothing: refused at the next poll.
        let handed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut g = guarded(&handed);
        for _ in 0..5 {
            assert!(matches!(poll(&mut g, &mut cx), Poll::Ready(Some(Ok(_)))));
        }
        assert!(poll(&mut g, &mut cx).is_pending());
        match poll(&mut g, &mut cx) {
            Poll::Ready(Some(Err(e))) => assert!(e.to_string().contains("no boundary"), "{e}"),
            other => panic!("expected a refusal, got {:?}", other.map(|o| o.map(|r| r.is_ok()))),
        }
    }

    #[test]
    fn a_meta_group_without_preamble_becomes_a_part_10_file() {
        // (0002,0010) UI "1.2" then a data set element.
        let mut bare = vec![0x02, 0x00, 0x10, 0x00, b'U', b'I', 4, 0, b'1', b'.', b'2', 0];
        bare.extend([0x08, 0x00, 0x60, 0x00, b'C', b'S', 2, 0, b'C', b'T']);
        let fixed = part10(&bare);
        assert_eq!(&fixed[128..132], b"DICM");
        assert_eq!(&fixed[132..144], &[0x02, 0, 0, 0, b'U', b'L', 4, 0, 12, 0, 0, 0]);
        assert_eq!(&fixed[144..], &bare[..]);
        assert!(matches!(part10(b"not dicom"), std::borrow::Cow::Borrowed(_)));
        // A length past the end leaves the bytes as they are (and the reader refuses them).
        let cut = [0x02, 0x00, 0x10, 0x00, b'U', b'I', 99, 0];
        assert!(matches!(part10(&cut), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn boundaries_and_types() {
        assert_eq!(
            boundary(r#"multipart/related; type="application/dicom"; boundary=abc"#).unwrap(),
            "abc"
        );
        assert_eq!(boundary("Multipart/Related; boundary=\"x y\"").unwrap(), "x y");
        assert!(matches!(boundary("application/dicom"), Err(WebError::UnsupportedMediaType(_))));
        assert!(matches!(
            boundary("multipart/related; type=\"application/dicom+xml\"; boundary=a"),
            Err(WebError::UnsupportedMediaType(_))
        ));
        assert!(matches!(
            boundary("multipart/related; type=application/dicom"),
            Err(WebError::BadRequest(_))
        ));
    }
}
