//! WADO-RS (PS3.18 10.4) and WADO-URI (PS3.18 9): retrieve stored instances.
//!
//! - `GET /dicomweb/studies/{study}[/series/{series}[/instances/{instance}]]`: the instances as
//!   `multipart/related; type="application/dicom"`, each part the file as stored (read back
//!   with every chunk's digest checked), 406 when the `Accept` header takes another transfer
//!   syntax only (see [`super::accept`]);
//! - `…/metadata`: application/dicom+json, one object per instance (the attributes the index
//!   keeps; no bulk data);
//! - `…/instances/{instance}/frames/{list}`: `multipart/related;
//!   type="application/octet-stream"`, each part one decoded frame (native little-endian
//!   samples, as `/api/pixels` gives them), 406 when the `Accept` header takes only other
//!   forms ([`super::accept::native_frames`]);
//! - `…/instances/{instance}/rendered`: the image windowed for display, PNG (or JPEG when the
//!   Accept header asks only for it; 406 when it takes neither);
//! - `GET /dicomweb/wado?requestType=WADO&studyUID=…&seriesUID=…&objectUID=…[&contentType=…]`:
//!   the file (application/dicom, the default) or a rendering (image/jpeg, image/png).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bs_imageio::ImageMeta;
use bs_imaging::DynImage;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

use super::json::Object;
use super::{Instance, check_uid, instances};
use crate::error::WebError;
use crate::images::raw_bytes;
use crate::{AppState, blocking, query};

/// A multipart/related body of `parts` of media type `kind`, sent part by part as they are
/// (no copy into one buffer).
fn multipart(kind: &'static str, parts: Vec<Bytes>) -> Response {
    let boundary = format!("blobstream-{:016x}", rand_u64());
    let head = Bytes::from(format!("--{boundary}\r\nContent-Type: {kind}\r\n\r\n"));
    let mut chunks: Vec<Bytes> = Vec::with_capacity(parts.len() * 3 + 1);
    let mut len = 0usize;
    for p in parts {
        len += head.len() + p.len() + 2;
        chunks.extend([head.clone(), p, Bytes::from_static(b"\r\n")]);
    }
    let tail = Bytes::from(format!("--{boundary}--\r\n"));
    len += tail.len();
    chunks.push(tail);
    let stream = tokio_stream::iter(chunks.into_iter().map(Ok::<_, std::convert::Infallible>));
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    let ct = format!("multipart/related; type=\"{kind}\"; boundary={boundary}");
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_str(&ct).expect("ascii"));
    r
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

/// The stored bytes of an instance, every chunk's digest checked.
fn file(st: &AppState, i: &Instance) -> Result<Bytes, WebError> {
    Ok(st.store.open_read(&i.entry.name)?.all()?)
}

#[derive(Deserialize)]
pub struct Ids {
    study: String,
    series: Option<String>,
    instance: Option<String>,
}

impl Ids {
    fn check(&self) -> Result<(), WebError> {
        check_uid("study", &self.study)?;
        if let Some(s) = &self.series {
            check_uid("series", s)?;
        }
        if let Some(i) = &self.instance {
            check_uid("instance", i)?;
        }
        Ok(())
    }
}

/// `GET /dicomweb/studies/{study}[/series/{series}[/instances/{instance}]]`: the instances
/// are read while the answer is sent (up to `READ_AHEAD_BYTES` in `READ_AHEAD_READS` reads
/// ahead of the network, in parallel), so a large study never sits in memory whole. An instance that fails its digest
/// check ends the answer early, so the client sees a cut body, never a wrong byte with success.
///
/// The instances go as stored; an `Accept` header that lists transfer syntaxes without an
/// instance's stored one is answered 406 naming it (see [`super::accept`]).
pub async fn retrieve(
    State(st): State<Arc<AppState>>,
    Path(ids): Path<Ids>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> Result<Response, WebError> {
    let accept = accept(&uri, &headers)?;
    ids.check()?;
    let takes = super::accept::dicom_syntaxes(accept.as_deref())?;
    let st2 = st.clone();
    let found = blocking(move || {
        let found = instances(&st2, &ids.study, ids.series.as_deref(), ids.instance.as_deref())?;
        Ok(found
            .into_iter()
            .map(|i| {
                let ts = i.uid("transfer_syntax_uid").to_string();
                let sop = i.uid("sop_instance_uid").to_string();
                (i.entry.name, i.size, ts, sop)
            })
            .collect::<Vec<_>>())
    })
    .await?;
    if let Some((_, _, ts, sop)) = found.iter().find(|(_, _, ts, _)| !takes.takes(ts)) {
        return Err(not_stored_as(sop, ts, "transfer-syntax"));
    }
    let boundary = format!("blobstream-{:016x}", rand_u64());
    let kind = "application/dicom";
    let head = |ts: &str| {
        let ts = if ts.is_empty() { String::new() } else { format!("; transfer-syntax={ts}") };
        Bytes::from(format!("--{boundary}\r\nContent-Type: {kind}{ts}\r\n\r\n"))
    };
    let tail = Bytes::from(format!("--{boundary}--\r\n"));
    let found: Vec<(String, u64, Bytes)> =
        found.into_iter().map(|(name, size, ts, _)| (name, size, head(&ts))).collect();
    let len: u64 = found.iter().map(|(_, size, head)| head.len() as u64 + size + 2).sum::<u64>()
        + tail.len() as u64;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(2);
    tokio::spawn(async move {
        // Instances are read and checked on blocking threads ahead of the one being sent (up
        // to READ_AHEAD_BYTES of them, at least one), so checking digests on one core overlaps
        // with reading the next and sending on another; the answer keeps their order.
        let read = |name: String| {
            let st = st.clone();
            tokio::task::spawn_blocking(move || {
                let part = st.store.open_read(&name).and_then(|r| r.all());
                part.map_err(|e| format!("{name}: {e}"))
            })
        };
        let mut queue = found.into_iter().peekable();
        let mut pending = std::collections::VecDeque::new();
        let mut ahead = 0u64;
        loop {
            while let Some((_, size, _)) = queue.peek() {
                if !pending.is_empty()
                    && (ahead + size > READ_AHEAD_BYTES || pending.len() >= READ_AHEAD_READS)
                {
                    break;
                }
                let (name, size, head) = queue.next().expect("peeked");
                ahead += size;
                pending.push_back((size, head, read(name)));
            }
            let Some((size, head, job)) = pending.pop_front() else { break };
            ahead -= size;
            let chunk = match job.await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => {
                    tracing::warn!("WADO-RS: {e}; the answer is cut short");
                    let _ = tx.send(Err(std::io::Error::other(e))).await;
                    return;
                }
                Err(e) => {
                    tracing::error!(
                        "WADO-RS: a read did not finish ({e}); the answer is cut short"
                    );
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return;
                }
            };
            for c in [head, chunk, Bytes::from_static(b"\r\n")] {
                if tx.send(Ok(c)).await.is_err() {
                    return; // the client went away
                }
            }
        }
        let _ = tx.send(Ok(tail)).await;
    });
    let mut r = Response::new(Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)));
    let ct = format!("multipart/related; type=\"{kind}\"; boundary={boundary}");
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_str(&ct).expect("ascii"));
    r.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    Ok(r)
}

/// What a WADO-RS request accepts: its Accept header, several lines joined into the one list
/// they are (RFC 9110 5.3), or the `accept` query parameter standing for it (PS3.18 §8.3.3.1);
/// `None` when neither says.
fn accept(
    uri: &axum::http::Uri,
    headers: &axum::http::HeaderMap,
) -> Result<Option<String>, WebError> {
    // No other parameters are taken: one given would otherwise be silently not applied.
    let query = crate::query_only::<Vec<(String, String)>>(uri, super::accept::QUERY_HEADERS)?;
    super::accept::accepted(&query, headers)
}

/// 406 for an instance asked for in a transfer syntax other than its stored one (`param`:
/// how the client asks).
fn not_stored_as(sop: &str, stored: &str, param: &str) -> WebError {
    let (stored, or) = match stored {
        "" => ("an unrecorded transfer syntax", String::new()),
        ts => (ts, format!(" or {param}={ts}")),
    };
    WebError::NotAcceptable(format!(
        "instance {sop} is stored as {stored}, which the request does not take; instances are \
         sent as stored, not transcoded (ask with {param}=*{or})"
    ))
}

/// How many bytes of instances WADO-RS reads ahead of the one it is sending, and in how many
/// reads at most (so that one request of thousands of small instances does not fill the
/// blocking pool every other request needs).
const READ_AHEAD_BYTES: u64 = 32 << 20;
const READ_AHEAD_READS: usize = 4;

/// `GET …/metadata` at any level.
pub async fn metadata(
    State(st): State<Arc<AppState>>,
    Path(ids): Path<Ids>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> Result<Response, WebError> {
    super::accept::dicom_json(accept(&uri, &headers)?.as_deref())?;
    ids.check()?;
    let found = blocking(move || {
        instances(&st, &ids.study, ids.series.as_deref(), ids.instance.as_deref())
    })
    .await?;
    let items: Vec<Value> = found
        .iter()
        .map(|i| {
            Object::instance(&i.meta)
                .with_meta(
                    &i.meta,
                    &[
                        ("00080016", "UI", "sop_class_uid"),
                        ("00020010", "UI", "transfer_syntax_uid"),
                    ],
                )
                .decimals("00200032", &numbers(&i.meta, "image_position_patient"))
                .decimals("00200037", &numbers(&i.meta, "image_orientation_patient"))
                .with_meta(&i.meta, PIXEL_FIELDS)
                .int("00280002", "US", samples_per_pixel(&i.meta))
                .int("00280100", "US", bits_allocated(&i.meta))
                // Colour frames go out decoded, as interleaved RGB (whatever the file holds:
                // YBR_FULL_422, YBR_ICT, …): the metadata says what the frames are, or a
                // viewer would convert them again.
                .text(
                    "00280004",
                    "CS",
                    if samples_per_pixel(&i.meta) == Some(3) { "RGB" } else { "" },
                )
                .int("00280006", "US", (samples_per_pixel(&i.meta) == Some(3)).then_some(0))
                .int("00280103", "US", i.meta.get("signed").and_then(Value::as_bool).map(i64::from))
                .decimals("00281050", &windows(&i.meta).0)
                .decimals("00281051", &windows(&i.meta).1)
                .decimals("00281052", &numbers(&i.meta, "rescale_intercept"))
                .decimals("00281053", &numbers(&i.meta, "rescale_slope"))
                .build()
        })
        .collect();
    let mut r = Response::new(Body::from(Value::Array(items).to_string()));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/dicom+json"));
    Ok(r)
}

/// Image pixel attributes of the stored instance that the index keeps as text or integers.
const PIXEL_FIELDS: &[(&str, &str, &str)] = &[("00280101", "US", "bits_stored")];

/// A number or numeric array of the index metadata, as a list (empty when absent).
fn numbers(meta: &Value, field: &str) -> Vec<f64> {
    match meta.get(field) {
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_f64).collect(),
        Some(v) => v.as_f64().into_iter().collect(),
        None => Vec::new(),
    }
}

/// The stored windows (centres, widths) a viewer can use: those whose width is at least 1, as
/// PS3.3 C.11.2.1.2 requires (the decoder drops the others, but an index row written before
/// it did may hold one).
fn windows(meta: &Value) -> (Vec<f64>, Vec<f64>) {
    let (centres, widths) = (numbers(meta, "window_center"), numbers(meta, "window_width"));
    centres.into_iter().zip(widths).filter(|(_, w)| *w >= 1.0).unzip()
}

/// Samples per Pixel: 3 for colour images, 1 for grey ones (from the decoded pixel kind).
/// Bits per sample of the frames as sent: the decoded width (8 or 16).
fn bits_allocated(meta: &Value) -> Option<i64> {
    let kind = meta.get("pixel_kind")?.as_str()?;
    if kind.ends_with("16") {
        Some(16)
    } else if kind.ends_with('8') {
        Some(8)
    } else {
        None
    }
}

fn samples_per_pixel(meta: &Value) -> Option<i64> {
    let kind = meta.get("pixel_kind")?.as_str()?;
    Some(if kind.starts_with("rgb") { 3 } else { 1 })
}

/// `GET …/instances/{instance}/frames/{list}` (1-based frame numbers, comma-separated).
pub async fn frames(
    State(st): State<Arc<AppState>>,
    Path((study, series, instance, list)): Path<(String, String, String, String)>,
    req: Request,
) -> Result<Response, WebError> {
    let accept = accept(req.uri(), req.headers())?;
    for (what, uid) in [("study", &study), ("series", &series), ("instance", &instance)] {
        check_uid(what, uid)?;
    }
    super::accept::native_frames(accept.as_deref())?;
    let mut wanted: Vec<usize> = list
        .split(',')
        .map(|f| match f.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(WebError::BadRequest(format!("frame {f:?}: frames are numbered from 1"))),
        })
        .collect::<Result<_, _>>()?;
    // Each frame at most once, in the order first asked: a repeated list cannot multiply the
    // answer.
    let mut seen = std::collections::HashSet::new();
    wanted.retain(|n| seen.insert(*n));
    let turn = st.image_turn().await;
    let st2 = st.clone();
    let parts = blocking(move || {
        let found = instances(&st2, &study, Some(&series), Some(&instance))?;
        let (_, d) = st2.images.decode(&found[0].entry.name)?;
        wanted
            .iter()
            .map(|&n| {
                // DICOMweb numbers frames from 1.
                d.frame(n - 1).map(|f| stored_bytes(f, &d.meta)).ok_or_else(|| {
                    WebError::Missing(format!(
                        "instance {instance} has {} frame(s), not frame {n}",
                        d.frame_count()
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await?;
    drop(turn);
    Ok(multipart("application/octet-stream", parts))
}

/// A frame as the instance stores its pixel values, as an uncompressed frame is sent (PS3.18
/// 8.7.3.5: the Pixel Data of Explicit VR Little Endian), so that a client reading it with the
/// instance's metadata (Pixel Representation, Rescale Slope/Intercept) gets the right values.
/// The decoder's grey samples hold modality values shifted by `pixel_offset` (and mirrored for
/// MONOCHROME1); they are mapped back to stored values, signed ones as two's complement, when
/// that is exact (see below). Colour images, samples the decoder spread over its range
/// (`pixel_scale`: floating-point, 32-bit and 1-bit data) and grey images with a fractional
/// rescale are sent as decoded, as `/api/pixels` gives them.
fn stored_bytes(img: &DynImage, m: &ImageMeta) -> Bytes {
    let slope = m.rescale_slope.unwrap_or(1.0);
    let intercept = m.rescale_intercept.unwrap_or(0.0);
    // Exact only where the decoder's mapping is: slope 1 and a whole intercept (other rescales
    // were rounded to whole modality values), and a sample as wide as the decoded one (an
    // 8-bit image with a sign or a rescale decodes to 16 bits).
    let exact = slope == 1.0
        && intercept.fract() == 0.0
        && match img {
            DynImage::U8(_) => true,
            DynImage::U16(_) => m.bits_stored > 8,
        };
    if img.channels() != 1 || m.pixel_offset.is_none() || m.pixel_scale.is_some() || !exact {
        return raw_bytes(img);
    }
    let stored = |p: u32| -> i64 {
        let modality = m.modality_value(p).unwrap_or(f64::from(p));
        ((modality - intercept) / slope).round() as i64
    };
    match img {
        DynImage::U8(i) => {
            Bytes::from(i.data.iter().map(|&p| stored(u32::from(p)) as u8).collect::<Vec<_>>())
        }
        DynImage::U16(i) => {
            let mut out = Vec::with_capacity(i.data.len() * 2);
            for &p in &i.data {
                // Two's complement keeps signed values right whatever the sign.
                out.extend_from_slice(&(stored(u32::from(p)) as u16).to_le_bytes());
            }
            Bytes::from(out)
        }
    }
}

/// Render frame `frame` (0-based) of instance `key` for display: windowed 8-bit, PNG or JPEG.
fn render(
    st: &AppState,
    key: &str,
    jpeg: bool,
    frame: usize,
) -> Result<(Bytes, &'static str), WebError> {
    let (_, d) = st.images.decode(key)?;
    let shown = if frame == 0 {
        bs_imageio::apply_window(&d)
    } else {
        let image = d.frame(frame).ok_or_else(|| {
            WebError::Missing(format!(
                "{key} has {} frame(s), not frame {}",
                d.frame_count(),
                frame + 1
            ))
        })?;
        let one = bs_imageio::Decoded {
            image: image.clone(),
            frames: Vec::new(),
            format: d.format,
            meta: d.meta.clone(),
        };
        bs_imageio::apply_window(&one)
    };
    let (format, mime) = if jpeg {
        (bs_imageio::Format::Jpeg, "image/jpeg")
    } else {
        (bs_imageio::Format::Png, "image/png")
    };
    Ok((Bytes::from(bs_imageio::encode(&shown, format)?), mime))
}

fn image_response(bytes: Bytes, mime: &'static str) -> Response {
    let mut r = Response::new(Body::from(bytes));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    r
}

/// How the SOP Class UIDs of Encapsulated Document storage begin (PDF, CDA, STL, OBJ, MTL).
const ENCAPSULATED_DOCUMENT: &str = "1.2.840.10008.5.1.4.1.1.104.";

/// How the SOP Class UIDs of structured reports begin (text, enhanced, comprehensive, key
/// object selection, measurement reports…).
const STRUCTURED_REPORT: &str = "1.2.840.10008.5.1.4.1.1.88.";

/// Whether `accept` (an `Accept` header's value, "" when none) takes `mime`.
fn takes(accept: &str, mime: &str) -> bool {
    accept.is_empty()
        || accept.split(',').any(|a| {
            let a = a.split(';').next().unwrap_or("").trim();
            a == mime || a == "*/*"
        })
}

/// A structured report as text: `text/plain` (UTF-8), or `text/html` when that is asked and
/// plain text is not; 406 when neither is taken.
fn report(st: &AppState, i: &Instance, accept: &str) -> Result<Response, WebError> {
    let text = bs_imageio::structured_report(&file(st, i)?, st.images.limits())?;
    let (body, mime) = if takes(accept, "text/plain") {
        (text, "text/plain; charset=utf-8")
    } else if takes(accept, "text/html") {
        let escaped = text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        let title = escaped.lines().next().unwrap_or("").to_string();
        let page = format!(
            "<!doctype html><meta charset=\"utf-8\"><title>{title}</title><pre>{escaped}</pre>\n"
        );
        (page, "text/html; charset=utf-8")
    } else {
        return Err(WebError::NotAcceptable(
            "this instance is a structured report: ask for text/plain or text/html".into(),
        ));
    };
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    Ok(r)
}

/// An Encapsulated Document instance's document as its own media type (a PDF report opens
/// in the browser), from the instance's verified bytes; 406 when `accept` names neither it
/// nor `*/*`.
fn document(st: &AppState, i: &Instance, accept: &str) -> Result<Response, WebError> {
    let (mime, data) = bs_imageio::encapsulated_document(&file(st, i)?, st.images.limits())?;
    let mime = HeaderValue::from_str(mime.trim()).map_err(|_| {
        WebError::Unprocessable(format!("the document's MIME type {mime:?} is not a media type"))
    })?;
    if !takes(accept, mime.to_str().unwrap_or("")) {
        return Err(WebError::NotAcceptable(format!(
            "this instance is a document of type {}: ask for that type (or */*)",
            mime.to_str().unwrap_or("")
        )));
    }
    let sop = i.uid("sop_instance_uid");
    let ext = match mime.as_bytes() {
        b"application/pdf" => "pdf",
        b"text/xml" => "xml",
        _ => "bin",
    };
    let mut r = Response::new(Body::from(data));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, mime);
    if let Ok(v) = HeaderValue::from_str(&format!("inline; filename=\"{sop}.{ext}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(r)
}

/// `GET …/instances/{instance}/rendered`: an image windowed for display (PNG, or JPEG when
/// asked), an Encapsulated Document's document (a PDF report as `application/pdf`), or a
/// structured report as text.
pub async fn rendered(
    State(st): State<Arc<AppState>>,
    Path((study, series, instance)): Path<(String, String, String)>,
    req: Request,
) -> Result<Response, WebError> {
    // The rendering parameters of PS3.18 (window, viewport, quality, annotation) are not
    // taken: refused by name rather than answered with an image that ignored them.
    let accept = accept(req.uri(), req.headers())?.unwrap_or_default();
    for (what, uid) in [("study", &study), ("series", &series), ("instance", &instance)] {
        check_uid(what, uid)?;
    }
    let turn = st.image_turn().await;
    let st2 = st.clone();
    let r = blocking(move || {
        let found = instances(&st2, &study, Some(&series), Some(&instance))?;
        let class = found[0].uid("sop_class_uid");
        if class.starts_with(ENCAPSULATED_DOCUMENT) {
            return document(&st2, &found[0], &accept);
        }
        if class.starts_with(STRUCTURED_REPORT) {
            return report(&st2, &found[0], &accept);
        }
        let jpeg = super::accept::rendered_jpeg(Some(&accept))?;
        let (bytes, mime) = render(&st2, &found[0].entry.name, jpeg, 0)?;
        Ok(image_response(bytes, mime))
    })
    .await?;
    drop(turn);
    Ok(r)
}

/// The parameters of a WADO-URI request this server takes; any other (`rows`, `region`,
/// `windowCenter`, …) is refused rather than silently not applied.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WadoUri {
    request_type: String,
    #[serde(rename = "studyUID")]
    study_uid: String,
    #[serde(rename = "seriesUID")]
    series_uid: String,
    #[serde(rename = "objectUID")]
    object_uid: String,
    content_type: Option<String>,
    /// With application/dicom: the transfer syntax the file must be in (it is sent as stored:
    /// another one is 406).
    transfer_syntax: Option<String>,
    /// With image/jpeg or image/png: the frame to render, from 1 (default 1).
    frame_number: Option<String>,
}

/// `GET /dicomweb/wado` (WADO-URI).
pub async fn uri(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let q: WadoUri = query(req.uri())?;
    if q.request_type != "WADO" {
        return Err(WebError::BadRequest(format!("requestType {:?}: only WADO", q.request_type)));
    }
    for (what, uid) in
        [("studyUID", &q.study_uid), ("seriesUID", &q.series_uid), ("objectUID", &q.object_uid)]
    {
        check_uid(what, uid)?;
    }
    let kind = q.content_type.clone().unwrap_or_else(|| "application/dicom".into());
    let jpeg = match kind.as_str() {
        "application/dicom" => None,
        "image/jpeg" => Some(true),
        "image/png" => Some(false),
        other => {
            // A form of answer this server cannot give (not a body it cannot take): 406.
            return Err(WebError::NotAcceptable(format!(
                "contentType {other:?}: application/dicom, image/jpeg or image/png"
            )));
        }
    };
    let frame = match (&q.frame_number, jpeg) {
        (None, _) => 0,
        (Some(_), None) => {
            return Err(WebError::BadRequest(
                "frameNumber goes with contentType image/jpeg or image/png: application/dicom \
                 is the whole file"
                    .into(),
            ));
        }
        (Some(f), Some(_)) => match f.parse::<usize>() {
            Ok(n) if n >= 1 => n - 1,
            _ => {
                return Err(WebError::BadRequest(format!(
                    "frameNumber {f:?}: frames are numbered from 1"
                )));
            }
        },
    };
    let turn = st.image_turn().await;
    let st2 = st.clone();
    let (bytes, mime) = blocking(move || {
        let found = instances(&st2, &q.study_uid, Some(&q.series_uid), Some(&q.object_uid))?;
        let stored = found[0].uid("transfer_syntax_uid");
        match (jpeg, q.transfer_syntax.as_deref()) {
            (None, Some(ts)) if ts != "*" && ts != stored => {
                Err(not_stored_as(found[0].uid("sop_instance_uid"), stored, "transferSyntax"))
            }
            (None, _) => Ok((file(&st2, &found[0])?, "application/dicom")),
            (Some(j), _) => render(&st2, &found[0].entry.name, j, frame),
        }
    })
    .await?;
    drop(turn);
    Ok(image_response(bytes, mime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_window_narrower_than_one_is_no_window() {
        let meta =
            serde_json::json!({"window_center": [40.0, 300.0], "window_width": [0.0, 1500.0]});
        assert_eq!(windows(&meta), (vec![300.0], vec![1500.0]));
        let meta = serde_json::json!({"window_center": 40.0, "window_width": 0.5});
        assert_eq!(windows(&meta), (vec![], vec![]));
        let meta = serde_json::json!({"window_center": 40.0, "window_width": 400.0});
        assert_eq!(windows(&meta), (vec![40.0], vec![400.0]));
        assert_eq!(windows(&serde_json::json!({})), (vec![], vec![]));
    }
}
