//! `/blobs/{key}`: GET (Range, ETag, If-None-Match), HEAD, PUT (streamed), DELETE, and
//! `POST /blobs` multipart uploads.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bs_meta::BlobRecord;
use bs_store::{BlobSource, RouteSpec};
use bytes::Bytes;
use serde::Deserialize;
use tokio_stream::StreamExt;

use crate::body::{CHECK_FIRST_MAX, checked_body, verified_stream};
use crate::error::WebError;
use crate::keys::{key_from_path, path_of, validate_key, validate_prefix};
use crate::upload::{UploadSpec, store_stream};
use crate::{AppState, blocking, info};

pub const ROUTE: &str = "/blobs/";

/// Ranges up to one chunk whose bytes are in memory (or the page cache) are checked on the
/// connection's task: hashing them takes about as long as the copy into the socket.
const CHECK_AT_ONCE_MAX: u64 = bs_wire::CHUNK_SIZE;

/// What a GET or HEAD asks of the blob it names.
struct Ask {
    head: bool,
    if_none_match: Option<String>,
    /// The Range header (`Err`: not ASCII).
    range: Option<Result<String, ()>>,
    if_range: Option<String>,
}

/// The answer settled: the blob, whether the client's copy is fresh, the range to send, and
/// its bytes already checked when they are few enough to check before the response starts.
struct Settled {
    src: BlobSource,
    fresh: bool,
    /// Whether bytes are sent (not for HEAD, nor when the client's copy is fresh).
    sends: bool,
    range: Option<(u64, u64)>,
    checked: Option<Vec<Bytes>>,
}

impl Ask {
    fn settle(self, src: BlobSource) -> Result<Settled, WebError> {
        let (size, etag) = (src.size(), format!("\"{}\"", src.record().digest));
        let fresh = self.if_none_match.as_deref().is_some_and(|inm| client_has(inm, &etag));
        let range = match self.range {
            _ if fresh => None,
            None => None,
            Some(Err(())) => {
                return Err(WebError::RangeNotSatisfiable {
                    size,
                    reason: "Range header is not ASCII".into(),
                });
            }
            // If-Range with a different validator: send everything.
            Some(Ok(v)) if self.if_range.as_deref().is_none_or(|ir| ir.trim() == etag) => {
                crate::range::parse(&v, size)?
            }
            Some(Ok(_)) => None,
        };
        let sends = !(self.head || fresh);
        Ok(Settled { src, fresh, sends, range, checked: None })
    }
}

impl Settled {
    /// (start, length) of what is sent.
    fn span(&self) -> (u64, u64) {
        self.range.map_or((0, self.src.size()), |(a, b)| (a, b - a + 1))
    }

    /// Whether the bytes are to be checked before the response starts (else streamed, each
    /// chunk checked as it is sent).
    fn checks_first(&self) -> bool {
        self.sends && self.span().1 <= CHECK_FIRST_MAX
    }

    /// Whether [`Settled::check`] needs no disk: nothing to check first, or a little that is
    /// resident.
    fn checks_at_once(&self) -> bool {
        let (start, len) = self.span();
        !self.checks_first() || (len <= CHECK_AT_ONCE_MAX && self.src.resident(start, len))
    }

    /// Read and check the bytes to check first (may read the disk).
    fn check(mut self) -> Result<Self, WebError> {
        if self.checks_first() {
            let (start, len) = self.span();
            self.checked = Some(self.src.pieces(start, len)?.collect::<Result<Vec<_>, _>>()?);
        }
        Ok(self)
    }
}

/// Stored blobs may be anything, HTML included: never let one run script in our origin.
const BLOB_CSP: &str = "default-src 'none'; sandbox";

pub async fn get(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let head = req.method() == Method::HEAD;
    let key = key_from_path(req.uri().path(), ROUTE)?;
    let store = st.store.clone();
    let h = req.headers();
    let ask = Ask {
        head,
        if_none_match: h.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).map(Into::into),
        range: h.get(header::RANGE).map(|v| v.to_str().map(str::to_string).map_err(|_| ())),
        if_range: h.get(header::IF_RANGE).and_then(|v| v.to_str().ok()).map(str::to_string),
    };
    // A hot blob is looked up, settled and checked on this task (no hand-off to a thread and
    // back); anything that may wait — the catalogue busy, a file to open, pages to read from
    // disk — takes one trip to the blocking pool.
    let Settled { src, fresh, range, checked, .. } = match store.open_read_at_once(&key) {
        Some(src) => {
            let s = ask.settle(src?)?;
            if s.checks_at_once() { s.check()? } else { blocking(move || s.check()).await? }
        }
        None => blocking(move || ask.settle(store.open_read(&key)?)?.check()).await?,
    };
    let rec = src.record().clone();
    let etag = format!("\"{}\"", rec.digest);
    if fresh {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        r.headers_mut().insert(header::ETAG, hv(&etag));
        return Ok(r);
    }
    let (status, start, len) = match range {
        Some((a, b)) => (StatusCode::PARTIAL_CONTENT, a, b - a + 1),
        None => (StatusCode::OK, 0, rec.size),
    };
    let body = match (head, checked) {
        (true, _) => Body::empty(),
        (false, Some(pieces)) => checked_body(pieces),
        (false, None) => verified_stream(src, start, len),
    };
    let ct = content_type_of(&rec);
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let hs = r.headers_mut();
    hs.insert(header::CONTENT_TYPE, hv(&ct));
    hs.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    hs.insert(header::ETAG, hv(&etag));
    hs.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    hs.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    hs.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(BLOB_CSP));
    hs.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // Pictures and video open in the browser; anything else is offered as a download.
    if !(ct.starts_with("image/") || ct.starts_with("video/")) {
        let base = rec.name.rsplit('/').next().unwrap_or("blob");
        hs.insert(header::CONTENT_DISPOSITION, hv(&attachment(base)));
    }
    if status == StatusCode::PARTIAL_CONTENT {
        let cr = format!("bytes {}-{}/{}", start, start + len - 1, rec.size);
        hs.insert(header::CONTENT_RANGE, hv(&cr));
    }
    Ok(r)
}

pub async fn put(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let (parts, body) = req.into_parts();
    let body = body.into_data_stream();
    // Refused before its body is read (412, 503, …): the body is read and dropped first, up to
    // a bound, so the answer is not lost to the reset that unread bytes cause.
    let (spec, slot) = match put_spec(&st, &parts).await {
        Ok(s) => s,
        Err(e) => {
            // A client that waits for `100 Continue` has sent no body: none is asked for
            // (reading it would send the 100), and the refusal goes out at once.
            let waits = parts.headers.get(header::EXPECT).is_some_and(|v| {
                v.to_str().is_ok_and(|v| v.trim().eq_ignore_ascii_case("100-continue"))
            });
            if !waits {
                crate::upload::drain(&mut std::pin::pin!(body)).await;
            }
            return Err(e);
        }
    };
    let rec = store_stream(st.store.clone(), spec, body).await?;
    st.metrics.uploaded(rec.size);
    let info = stored(&st, rec).await;
    drop(slot);
    let mut r = (StatusCode::CREATED, axum::Json(&info)).into_response();
    r.headers_mut().insert(header::LOCATION, hv(&path_of(ROUTE, &info.key)));
    r.headers_mut().insert(header::ETAG, hv(&format!("\"{}\"", info.digest)));
    Ok(r)
}

/// What a PUT asks for, checked before its body is read: the upload, and the upload slot it
/// holds.
async fn put_spec(
    st: &Arc<AppState>,
    parts: &axum::http::request::Parts,
) -> Result<(UploadSpec, tokio::sync::OwnedSemaphorePermit), WebError> {
    let key = key_from_path(parts.uri.path(), ROUTE)?;
    crate::no_query(&parts.uri)?;
    let h = &parts.headers;
    let ct = header_str(h, header::CONTENT_TYPE);
    if ct.to_ascii_lowercase().starts_with("multipart/") {
        return Err(WebError::UnsupportedMediaType(
            "PUT takes the blob's bytes as the body; send multipart/form-data with POST /blobs"
                .into(),
        ));
    }
    let size = match h.get(header::CONTENT_LENGTH) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| WebError::BadRequest("Content-Length is not a number".into()))?,
        ),
    };
    // If-None-Match on a write (RFC 9110 §13.1.2): `*` — only if nothing is stored there;
    // a list of ETags — only if the stored blob is none of them. Either way 412 if not.
    let condition = match h.get(header::IF_NONE_MATCH) {
        None => None,
        Some(v) => Some(entity_tags("If-None-Match", v.to_str().unwrap_or("\u{0}"), true)?),
    };
    // If-Match (§13.1.1): `*` — only if a blob is stored there; a list of ETags — only if the
    // stored blob is one of them (strong comparison). Either way 412 if not.
    let must_match = match h.get(header::IF_MATCH) {
        None => None,
        Some(v) => Some(entity_tags("If-Match", v.to_str().unwrap_or("\u{0}"), false)?),
    };
    let overwrite = !matches!(condition, Some(None));
    // The ETags the stored blob must not have, and those it must have one of: also checked
    // again atomically at commit.
    let mut refuse_digests: Vec<String> = match &condition {
        Some(Some(tags)) => tags.iter().map(|t| t.trim_matches('"').to_string()).collect(),
        _ => Vec::new(),
    };
    match &must_match {
        Some(Some(tags)) => {
            let required = tags.iter().filter(|t| !t.starts_with("W/"));
            refuse_digests.extend(
                required.map(|t| format!("{}{}", bs_store::REQUIRE_DIGEST, t.trim_matches('"'))),
            );
        }
        // `*`: a blob of any digest must still be there at the commit.
        Some(None) => refuse_digests.push(bs_store::REQUIRE_DIGEST.to_string()),
        None => {}
    }
    if condition.is_some() || must_match.is_some() {
        let current = current_etag(st, &key).await?;
        if let Some(c) = &condition {
            if_none_match(&key, c, current.as_deref(), "replacing")?;
        }
        if let Some(m) = &must_match {
            if_match(&key, m, current.as_deref())?;
        }
    }
    // No type, or the form type `curl -d`/`--data-binary` sends unless told otherwise (a PUT
    // body is the blob, never a form): the type its name suggests.
    let said_nothing =
        ct.is_empty() || ct.to_ascii_lowercase().starts_with("application/x-www-form-urlencoded");
    let content_type =
        if said_nothing { bs_store::guess_content_type(&key).to_string() } else { ct };
    let metadata = user_metadata(h)?;
    let slot = st.upload_slot()?;
    let route = RouteSpec {
        name: key,
        size,
        content_type,
        metadata,
        overwrite,
        refuse_digests,
        ..RouteSpec::default()
    };
    let spec = UploadSpec::new(st, route);
    Ok((spec, slot))
}

/// Index a freshly stored blob and describe it. The blob is stored whatever happens here:
/// an indexing failure is logged (the start-up sweep and later reads index it again).
async fn stored(st: &Arc<AppState>, rec: BlobRecord) -> info::BlobInfo {
    let st2 = st.clone();
    let name = rec.name.clone();
    // An entry for these very bytes (same digest) is already right; any other is redone.
    // A decode waits for one of the server's turns at decoding, as a read's does (so uploads
    // of small files that decode to huge images do not all decode at once).
    let indexed =
        blocking(move || st2.images.refresh_in_turn(&name, || st2.image_turn_here()).map(drop))
            .await;
    if let Err(e) = indexed {
        tracing::warn!("indexing {} after upload: {e}", rec.name);
    }
    info::describe(&st.images, rec)
}

pub async fn delete(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let key = key_from_path(req.uri().path(), ROUTE)?;
    crate::no_query(req.uri())?;
    // If-Match: delete only the version named (checked just before the delete, which the
    // store does not take a condition for: a replacement in between is not seen).
    if let Some(v) = req.headers().get(header::IF_MATCH) {
        let m = entity_tags("If-Match", v.to_str().unwrap_or("\u{0}"), false)?;
        if_match(&key, &m, current_etag(&st, &key).await?.as_deref())?;
    }
    // If-None-Match (RFC 9110 §13.1.2): `*` — nothing may be there; ETags — the blob there
    // must be none of them. A state-changing request that fails it is a 412.
    if let Some(v) = req.headers().get(header::IF_NONE_MATCH) {
        let tags = entity_tags("If-None-Match", v.to_str().unwrap_or("\u{0}"), true)?;
        if_none_match(&key, &tags, current_etag(&st, &key).await?.as_deref(), "deleting")?;
    }
    let st2 = st.clone();
    blocking(move || {
        st2.store.delete(&key)?;
        st2.images.index().forget(&key)?;
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The query of `POST /blobs`: a write refuses parameters it does not know (400), so a typo
/// such as `?prefx=a/` cannot silently store at the top level.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostQuery {
    #[serde(default)]
    prefix: String,
}

/// `POST /blobs?prefix=folder/` with `multipart/form-data`.
pub async fn post(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let q: PostQuery = crate::query(req.uri())?;
    validate_prefix(&q.prefix)?;
    let ct = header_str(req.headers(), header::CONTENT_TYPE);
    if !ct.to_ascii_lowercase().starts_with("multipart/form-data") {
        return Err(WebError::UnsupportedMediaType(format!(
            "POST /blobs takes multipart/form-data (got {:?}); PUT /blobs/KEY takes raw bytes",
            if ct.is_empty() { "nothing" } else { &ct }
        )));
    }
    // Paced as a whole: a client silent before its first boundary, or between parts, holds
    // no upload slot for longer than one that stalls inside a file.
    let req = crate::paced::paced_request(&st, req);
    let mut mp = Multipart::from_request(req, &())
        .await
        .map_err(|e| WebError::BadRequest(format!("multipart body: {}", e.body_text())))?;
    let bad =
        |e: axum::extract::multipart::MultipartError| WebError::BadRequest(multipart_failure(&e));
    let _slot = st.upload_slot()?;
    let mut out: Vec<info::BlobInfo> = Vec::new();
    // Files are stored one by one as they arrive; if one fails, say which were stored.
    let with_stored = |e: WebError, out: &[info::BlobInfo]| {
        if out.is_empty() {
            return e;
        }
        let keys: Vec<&str> = out.iter().map(|i| i.key.as_str()).collect();
        let (status, _) = e.status();
        let msg = format!("{e} (stored before this failure: {})", keys.join(", "));
        match status.as_u16() {
            413 => WebError::TooLarge(msg),
            503 => WebError::Busy(msg),
            507 => WebError::StorageFull(msg),
            500 => WebError::Internal(msg),
            _ => WebError::BadRequest(msg),
        }
    };
    let mut next_key: Option<String> = None;
    loop {
        let field = mp.next_field().await.map_err(bad);
        let mut field = match field {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(with_stored(e, &out)),
        };
        let name = field.name().unwrap_or_default().to_string();
        if name == "key" && field.file_name().is_none() {
            let k = match small_text(&mut field).await {
                Ok(k) => k,
                Err(e) => return Err(with_stored(e, &out)),
            };
            validate_key(&k).map_err(|e| with_stored(e, &out))?;
            if let Some(unused) = next_key.replace(k) {
                let e = WebError::BadRequest(format!(
                    "two `key` fields in a row ({unused:?} names no file): a `key` names the \
                     file part right after it"
                ));
                return Err(with_stored(e, &out));
            }
            continue;
        }
        let Some(file_name) = field.file_name().map(str::to_string) else {
            // A field this endpoint does not know is a client mistake worth hearing about; a
            // part without a filename (`curl -F file=text`, or only RFC 5987's `filename*`) is
            // said to be that.
            let e = WebError::BadRequest(format!(
                "form field {name:?} is no file part (a file part has a filename in its \
                 Content-Disposition: curl -F 'file=@path'); send file parts, each optionally \
                 preceded by a `key` field"
            ));
            return Err(with_stored(e, &out));
        };
        let key = match next_key.take() {
            Some(k) => k,
            None => {
                // Browsers send a base name; others might send a path: keep its last part.
                let base = file_name.rsplit(['/', '\\']).next().unwrap_or_default();
                let k = format!("{}{}", q.prefix, base);
                validate_key(&k).map_err(|e| with_stored(e, &out))?;
                k
            }
        };
        // Two parts of one form under one name: the second would silently replace the
        // first (files of two folders, `a/x.dcm` and `b/x.dcm`, both end up `PREFIX/x.dcm`).
        if out.iter().any(|i| i.key == key) {
            let e = WebError::BadRequest(format!(
                "two files of this form would both be stored as {key:?}: give each its own \
                 `key` field"
            ));
            return Err(with_stored(e, &out));
        }
        let content_type = match field.content_type() {
            Some(t) if t != "application/octet-stream" => t.to_string(),
            _ => bs_store::guess_content_type(&key).to_string(),
        };
        let route = RouteSpec { name: key, content_type, overwrite: true, ..RouteSpec::default() };
        // The whole body is paced (`paced_request`): not this part again.
        let spec = UploadSpec { pace: None, ..UploadSpec::new(&st, route) };
        let chunks = (&mut field).map(|c| c.map_err(|e| multipart_failure(&e)));
        let rec = match store_stream(st.store.clone(), spec, chunks).await {
            Ok(r) => r,
            Err(e) => return Err(with_stored(e, &out)),
        };
        st.metrics.uploaded(rec.size);
        out.push(stored(&st, rec).await);
    }
    if let Some(k) = next_key {
        let e = WebError::BadRequest(format!(
            "the form ends with a `key` field ({k:?}) that no file part follows: a `key` names \
             the file part right after it"
        ));
        return Err(with_stored(e, &out));
    }
    if out.is_empty() {
        return Err(WebError::BadRequest("the form holds no file".into()));
    }
    Ok((StatusCode::CREATED, axum::Json(serde_json::json!({ "stored": out }))).into_response())
}

/// Bytes RFC 8187 lets stand in an extended parameter value (`attr-char`); all others are
/// percent-encoded.
const ATTR_CHAR: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'!')
    .remove(b'#')
    .remove(b'$')
    .remove(b'&')
    .remove(b'+')
    .remove(b'-')
    .remove(b'.')
    .remove(b'^')
    .remove(b'_')
    .remove(b'`')
    .remove(b'|')
    .remove(b'~');

/// `Content-Disposition` of a download named `name`: an ASCII `filename` for old clients and,
/// when the name is not plain ASCII, `filename*` with its UTF-8 (RFC 6266 §4.3), which
/// browsers prefer, so `résumé.txt` is saved as that, not `r_sum_.txt`.
pub(crate) fn attachment(name: &str) -> String {
    let ascii: String = name
        .chars()
        .map(|c| if c.is_ascii_graphic() && c != '"' && c != '\\' { c } else { '_' })
        .collect();
    if ascii == name {
        return format!("attachment; filename=\"{ascii}\"");
    }
    let utf8 = percent_encoding::utf8_percent_encode(name, ATTR_CHAR);
    format!("attachment; filename=\"{ascii}\"; filename*=UTF-8''{utf8}")
}

/// Does a read's `If-None-Match` value name `etag` (or `*`), so the client's copy is fresh?
/// (Weak tags compared by their opaque part, RFC 9110 §13.1.2.)
pub(crate) fn client_has(if_none_match: &str, etag: &str) -> bool {
    if_none_match.split(',').map(str::trim).any(|t| t == "*" || t.trim_start_matches("W/") == etag)
}

/// `*` → `None`; otherwise the listed entity tags (weak ones compared by their opaque part).
/// The value of `If-None-Match` or `If-Match` (`header`): `None` for `*`, else its entity
/// tags. With `weak_too` (If-None-Match's weak comparison) a `W/` tag counts as its strong
/// one; otherwise it is kept as written, so it matches no ETag (If-Match compares strongly).
fn entity_tags(header: &str, v: &str, weak_too: bool) -> Result<Option<Vec<String>>, WebError> {
    let v = v.trim();
    if v == "*" {
        return Ok(None);
    }
    let mut tags = Vec::new();
    for t in v.split(',').map(str::trim) {
        let (weak, bare) = match t.strip_prefix("W/") {
            Some(b) => (true, b),
            None => (false, t),
        };
        let ok = bare.len() >= 2
            && bare.starts_with('"')
            && bare.ends_with('"')
            && !bare[1..bare.len() - 1].contains('"');
        if !ok {
            return Err(WebError::BadRequest(format!(
                "{header} must be * or a list of quoted entity tags, not {v:?}"
            )));
        }
        tags.push(if weak && !weak_too { t.to_string() } else { bare.to_string() });
    }
    Ok(Some(tags))
}

/// The ETag of what `key` holds now, `None` when nothing.
pub(crate) async fn current_etag(
    st: &Arc<AppState>,
    key: &str,
) -> Result<Option<String>, WebError> {
    let (store, k) = (st.store.clone(), key.to_string());
    blocking(move || match store.stat(&k) {
        Ok(r) => Ok(Some(format!("\"{}\"", r.digest))),
        Err(bs_store::StoreError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    })
    .await
}

/// A write's `If-None-Match` (`None`: `*`) against the blob there: 412 if `*` and a blob is
/// there, or the blob's ETag is one listed; `doing` names the write ("replacing").
fn if_none_match(
    key: &str,
    m: &Option<Vec<String>>,
    current: Option<&str>,
    doing: &str,
) -> Result<(), WebError> {
    let failed = match (m, current) {
        (None, Some(_)) => true,
        (Some(tags), Some(etag)) => tags.iter().any(|t| t == etag),
        _ => false,
    };
    if failed {
        return Err(WebError::PreconditionFailed(format!(
            "blob {key:?} exists and If-None-Match forbids {doing} it"
        )));
    }
    Ok(())
}

/// 412 unless the blob's `current` ETag meets `If-Match` `m` (`None`: `*`, any blob).
fn if_match(key: &str, m: &Option<Vec<String>>, current: Option<&str>) -> Result<(), WebError> {
    match (m, current) {
        (_, None) => Err(WebError::PreconditionFailed(format!(
            "no blob {key:?} is stored, and If-Match asks for one"
        ))),
        (Some(tags), Some(etag)) if !tags.iter().any(|t| t == etag) => {
            Err(WebError::PreconditionFailed(format!(
                "blob {key:?} is {etag}, not what If-Match names (it changed since it was read)"
            )))
        }
        _ => Ok(()),
    }
}

/// What broke a multipart body, for the client: the pace it fell behind, or the parser's
/// own reason (axum's text alone says only "Error parsing `multipart/form-data` request").
fn multipart_failure(e: &axum::extract::multipart::MultipartError) -> String {
    let mut why = None;
    let mut at: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(cause) = at {
        if let Some(pace) = cause.downcast_ref::<crate::paced::BodyPaceError>() {
            return pace.to_string();
        }
        why = Some(cause.to_string());
        at = cause.source();
    }
    format!("multipart body: {}", why.unwrap_or_else(|| e.body_text()))
}

/// A short text field (a key), read with a bound so a huge field cannot exhaust memory.
async fn small_text(field: &mut axum::extract::multipart::Field<'_>) -> Result<String, WebError> {
    let mut buf = Vec::new();
    while let Some(chunk) =
        field.chunk().await.map_err(|e| WebError::BadRequest(multipart_failure(&e)))?
    {
        buf.extend_from_slice(&chunk);
        if buf.len() > bs_store::MAX_NAME_LEN {
            return Err(WebError::BadRequest(format!(
                "the key field is longer than {} bytes",
                bs_store::MAX_NAME_LEN
            )));
        }
    }
    String::from_utf8(buf).map_err(|_| WebError::BadRequest("the key field is not UTF-8".into()))
}

fn hv(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> String {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().trim().to_string()
}

/// The stored type, unless it says nothing; then a guess from the name.
pub fn content_type_of(rec: &BlobRecord) -> String {
    let t = rec.content_type.trim();
    if t.is_empty() || t == "application/octet-stream" {
        bs_store::guess_content_type(&rec.name).to_string()
    } else {
        t.to_string()
    }
}

/// Header prefix of user metadata on `PUT /blobs/{key}` (as S3's `x-amz-meta-`): each
/// `X-Blobstream-Meta-<key>: <value>` becomes the metadata entry `<key>` (lower case, as HTTP
/// header names are case-insensitive), the same metadata `blobstream put --meta` sets.
pub const META_HEADER: &str = "x-blobstream-meta-";

/// Most bytes of user metadata (keys and values) one upload may carry.
const MAX_META_BYTES: usize = bs_store::MAX_METADATA_BYTES;

/// The user metadata of a `PUT`'s headers; 400 for values that are not UTF-8 text or too much.
fn user_metadata(h: &HeaderMap) -> Result<BTreeMap<String, String>, WebError> {
    let mut out = BTreeMap::new();
    let mut bytes = 0;
    for (name, value) in h {
        let Some(key) = name.as_str().strip_prefix(META_HEADER) else { continue };
        let value = std::str::from_utf8(value.as_bytes()).map_err(|_| {
            WebError::BadRequest(format!("metadata {key:?}: the value is not UTF-8 text"))
        })?;
        if key.is_empty() {
            return Err(WebError::BadRequest(format!("{META_HEADER} needs a key after it")));
        }
        bytes += key.len() + value.len();
        if bytes > MAX_META_BYTES {
            return Err(WebError::BadRequest(format!(
                "user metadata is over {MAX_META_BYTES} bytes"
            )));
        }
        // Given twice, one value would be dropped without a word.
        if out.insert(key.to_string(), value.trim().to_string()).is_some() {
            return Err(WebError::BadRequest(format!(
                "metadata {key:?} is given twice: give one value (several can be one text)"
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::attachment;

    #[test]
    fn download_names_keep_their_letters() {
        assert_eq!(attachment("scan.txt"), "attachment; filename=\"scan.txt\"");
        assert_eq!(
            attachment("résumé 1.txt"),
            "attachment; filename=\"r_sum__1.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9%201.txt"
        );
        assert_eq!(
            attachment("a\"b\\c.txt"),
            "attachment; filename=\"a_b_c.txt\"; filename*=UTF-8''a%22b%5Cc.txt"
        );
    }
}
