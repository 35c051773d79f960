//! The JSON endpoints under `/api/`: listing by folder, metadata search, filters and filter
//! runs, image metadata, raw pixels for client-side window/level, and thumbnails.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bs_imageio::Format;
use bs_imaging::{Output, Params, Run};
use bs_meta::ImageQuery;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};

use crate::error::WebError;
use crate::images::{bits, display, raw_bytes};
use crate::info::{BlobInfo, describe};
use crate::keys::{key_from_path, validate_key, validate_prefix};
use crate::upload::{UploadSpec, store_stream};
use crate::{AppState, blocking, query, query_only};

/// Most entries (folders + items) one listing page returns, and the default.
const MAX_PAGE: usize = 2000;
const DEFAULT_PAGE: usize = 500;
/// Most steps in one filter request.
const MAX_STEPS: usize = 16;
/// Largest JSON request body.
const MAX_JSON: usize = 64 << 10;

#[derive(Deserialize)]
pub struct ListQuery {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    after: String,
    limit: Option<usize>,
}

#[derive(Serialize)]
struct Folder {
    prefix: String,
    name: String,
}

/// `GET /api/list`: one folder level.
pub async fn list(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let q: ListQuery = query_only(req.uri(), &["prefix", "after", "limit"])?;
    validate_prefix(&q.prefix)?;
    let limit = page_limit(q.limit)?;
    let prefix = q.prefix.clone();
    let st2 = st.clone();
    let (folders, recs, next, marks) = blocking(move || {
        let (mut folders, mut items) = (Vec::new(), Vec::new());
        let mut cursor = q.after.clone();
        let mut next = None;
        'pages: loop {
            let page = st2.store.list(&q.prefix, &cursor, 256)?;
            if page.is_empty() {
                break;
            }
            for rec in page {
                if folders.len() + items.len() >= limit {
                    next = Some(cursor.clone());
                    break 'pages;
                }
                let rest = &rec.name[q.prefix.len()..];
                if let Some(i) = rest.find('/') {
                    let name = rest[..i].to_string();
                    let prefix = format!("{}{name}/", q.prefix);
                    // Skip every name inside this folder with one jump.
                    cursor = format!("{prefix}{}", char::MAX);
                    folders.push(Folder { prefix, name });
                    continue 'pages;
                }
                cursor = rec.name.clone();
                items.push(rec);
            }
        }
        let names: Vec<String> = items.iter().map(|r| r.name.clone()).collect();
        let marks = st2.store.corrupt_marks(&names)?;
        Ok((folders, items, next, marks))
    })
    .await?;
    let mut marks: std::collections::HashMap<_, _> = marks.into_iter().collect();
    let items: Vec<BlobInfo> = recs
        .into_iter()
        .map(|r| {
            let corrupt = marks.remove(&r.name);
            BlobInfo { corrupt, ..describe(&st.images, r) }
        })
        .collect();
    Ok(Json(serde_json::json!({
        "prefix": prefix,
        "folders": folders,
        "items": items,
        "next_after": next,
    }))
    .into_response())
}

/// A study date criterion: empty, or `YYYYMMDD` naming a day of the calendar.
fn check_date(name: &str, d: &Option<String>) -> Result<(), WebError> {
    match d {
        Some(d) if !(d.is_empty() || is_date(d)) => {
            Err(WebError::BadRequest(format!("{name} must be a date as YYYYMMDD, not {d:?}")))
        }
        _ => Ok(()),
    }
}

/// `YYYYMMDD` of a day that exists (20240229 does, 20251301 and 20230229 do not).
pub(crate) fn is_date(d: &str) -> bool {
    if d.len() != 8 || !d.bytes().all(|c| c.is_ascii_digit()) {
        return false;
    }
    let n = |r: std::ops::Range<usize>| d[r].parse::<u32>().unwrap_or(0);
    let (y, m, day) = (n(0..4), n(4..6), n(6..8));
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

/// A text criterion with a control character (a NUL ends SQL's LIKE pattern early, so it
/// would match everything) is refused.
fn check_text(name: &str, t: &Option<String>) -> Result<(), WebError> {
    match t {
        Some(t) if t.chars().any(char::is_control) => {
            Err(WebError::BadRequest(format!("{name} contains a control character")))
        }
        _ => Ok(()),
    }
}

fn page_limit(limit: Option<usize>) -> Result<usize, WebError> {
    match limit {
        None => Ok(DEFAULT_PAGE),
        Some(n) if (1..=MAX_PAGE).contains(&n) => Ok(n),
        Some(n) => Err(WebError::BadRequest(format!("limit {n} is not in 1..={MAX_PAGE}"))),
    }
}

/// The query parameters of [`Criteria`].
pub(crate) const CRITERIA: [&str; 5] = ["q", "patient", "modality", "date_from", "date_to"];

/// The image search criteria of `/api/search` and `/api/studies`.
#[derive(Deserialize)]
pub struct Criteria {
    q: Option<String>,
    patient: Option<String>,
    modality: Option<String>,
    date_from: Option<String>,
    date_to: Option<String>,
}

impl Criteria {
    /// The index query for these criteria (dates checked) under `prefix`, at most `limit`.
    pub(crate) fn image_query(self, prefix: String, limit: usize) -> Result<ImageQuery, WebError> {
        check_date("date_from", &self.date_from)?;
        check_date("date_to", &self.date_to)?;
        check_text("q", &self.q)?;
        check_text("patient", &self.patient)?;
        check_text("modality", &self.modality)?;
        Ok(ImageQuery {
            text: self.q,
            patient: self.patient,
            modality: self.modality,
            date_from: self.date_from,
            date_to: self.date_to,
            prefix,
            limit,
            study_after: None,
            study_uids: Vec::new(),
            name_after: None,
        })
    }
}

#[derive(Deserialize)]
pub struct SearchQuery {
    #[serde(flatten)]
    criteria: Criteria,
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
    /// The next page: images whose names sort after this (a page's `next_after`).
    after: Option<String>,
}

/// `GET /api/search`.
pub async fn search(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let allowed = [&CRITERIA[..], &["prefix", "limit", "after"]].concat();
    let q: SearchQuery = query_only(req.uri(), &allowed)?;
    validate_prefix(&q.prefix)?;
    let limit = page_limit(q.limit)?;
    // One more than a page: whether there is a next one.
    let mut iq = q.criteria.image_query(q.prefix, limit + 1)?;
    iq.name_after = q.after;
    let st2 = st.clone();
    let (results, next_after) = blocking(move || {
        // Rows made from bytes that have since been replaced (over gRPC, say) are indexed
        // again and the search rerun once, so results always describe what is stored now.
        for attempt in 0..2 {
            let mut out = Vec::new();
            let mut stale = 0;
            let mut rows = st2.images.index().search(&iq)?;
            let next = (rows.len() > limit).then(|| rows[limit - 1].name.clone());
            rows.truncate(limit);
            for e in rows {
                match st2.store.stat(&e.name) {
                    Ok(rec) if rec.digest == e.digest => out.push(describe(&st2.images, rec)),
                    Ok(_) => {
                        stale += 1;
                        if let Err(err) = st2.images.refresh(&e.name) {
                            tracing::warn!("re-indexing {}: {err}", e.name);
                            let _ = st2.images.index().forget(&e.name);
                        }
                    }
                    Err(bs_store::StoreError::NotFound(_)) => {
                        let _ = st2.images.index().forget(&e.name);
                    }
                    Err(err) => return Err(err.into()),
                }
            }
            if stale == 0 || attempt == 1 {
                return Ok((out, next));
            }
        }
        unreachable!("the loop returns on its second pass")
    })
    .await?;
    Ok(Json(serde_json::json!({ "results": results, "next_after": next_after })).into_response())
}

/// `GET /api/filters`.
pub async fn filters(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    crate::no_query(req.uri())?;
    let list: Vec<_> = st
        .registry
        .list()
        .into_iter()
        .map(|f| {
            let params: Vec<_> = f
                .params
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "name": p.name,
                        "default": p.default,
                        "min": p.range.map(|r| r.0),
                        "max": p.range.map(|r| r.1),
                        "help": p.help,
                    })
                })
                .collect();
            serde_json::json!({
                "name": f.name, "summary": f.summary, "kind": f.kind, "params": params,
            })
        })
        .collect();
    Ok(Json(serde_json::json!({ "filters": list })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterRequest {
    key: String,
    /// 0-based frame of a multi-frame image (default the first).
    #[serde(default)]
    frame: Option<usize>,
    steps: Vec<Step>,
    #[serde(default)]
    format: Option<String>,
    #[serde(default)]
    store_as: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    filter: String,
    /// A parameter given twice is refused (as `filter --param` given twice is), not the last
    /// one taken.
    #[serde(default, deserialize_with = "unique_keys")]
    params: BTreeMap<String, serde_json::Value>,
}

/// A JSON object as a map, refusing a key it has twice (serde's maps keep the last).
fn unique_keys<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, serde_json::Value>, D::Error> {
    struct Unique;
    impl<'de> serde::de::Visitor<'de> for Unique {
        type Value = BTreeMap<String, serde_json::Value>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object of parameters")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut m: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((k, v)) = m.next_entry::<String, serde_json::Value>()? {
                if out.contains_key(&k) {
                    return Err(serde::de::Error::custom(format!("parameter {k:?} given twice")));
                }
                out.insert(k, v);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Unique)
}

/// `POST /api/filter`.
pub async fn filter(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    crate::no_query(req.uri())?;
    let fr: FilterRequest = read_json(req).await?;
    validate_key(&fr.key)?;
    if fr.steps.is_empty() || fr.steps.len() > MAX_STEPS {
        return Err(WebError::BadRequest(format!("steps: give 1 to {MAX_STEPS} filter steps")));
    }
    let format = fr.format.as_deref().unwrap_or("png").to_ascii_lowercase();
    let out_format = match format.as_str() {
        "raw" if fr.store_as.is_none() => None,
        "raw" => {
            return Err(WebError::BadRequest("store_as needs an image format, not raw".into()));
        }
        f => Some(Format::from_name(f).filter(|f| f.can_encode()).ok_or_else(|| {
            WebError::BadRequest(format!("format {f:?}: use raw, png, tiff, jpeg, gif or pgm"))
        })?),
    };
    if let Some(k) = &fr.store_as {
        validate_key(k)?;
    }
    let mut steps = Vec::with_capacity(fr.steps.len());
    for s in &fr.steps {
        let mut p = BTreeMap::new();
        for (k, v) in &s.params {
            let v = match v {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::Bool(b) => b.to_string(),
                other => {
                    return Err(WebError::BadRequest(format!(
                        "parameter {k} of {}: expected a string or number, got {other}",
                        s.filter
                    )));
                }
            };
            p.insert(k.clone(), v);
        }
        steps.push((s.filter.clone(), Params(p)));
    }
    let st2 = st.clone();
    let key = fr.key.clone();
    let frame = fr.frame.unwrap_or(0);
    let turn = st.image_turn().await;
    let (result, times, encoded, output) = blocking(move || {
        let (_, d) = st2.images.decode(&key)?;
        let source = d.frame(frame).ok_or_else(|| {
            WebError::Missing(format!("{key} has {} frame(s), not frame {frame}", d.frame_count()))
        })?;
        let run = Run::all();
        let max_pixels = st2.images.limits().max_pixels;
        let mut img: Option<bs_imaging::DynImage> = None;
        let mut times = Vec::new();
        // A window takes modality units (HU for CT) for its center and width, as the command
        // line's `filter` does, while the pixels are still the file's values.
        let mut output = Output::Values;
        for (name, params) in &steps {
            let t = Instant::now();
            let f = st2.registry.get(name)?;
            let params = bs_imageio::in_modality_units(&d.meta, &*f, params, output);
            output = output.max(f.output(&params));
            let out = f.apply(img.as_ref().unwrap_or(source), &params, &run)?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            st2.metrics.filtered(name, ms / 1e3);
            times.push((name.clone(), ms));
            let pixels = (out.width() as u64).saturating_mul(out.height() as u64);
            if pixels > max_pixels {
                return Err(WebError::TooLarge(format!(
                    "{name} made an image of {}×{} pixels, over the limit of {max_pixels}",
                    out.width(),
                    out.height()
                )));
            }
            img = Some(out);
        }
        let img = img.expect("at least one step");
        let encoded = match out_format {
            None => raw_bytes(&img),
            // JPEG and GIF hold 8 bits: a 16-bit result windowed for display, as the command
            // line's `filter` does.
            Some(f) if f.eight_bits_only() => {
                let shown = bs_imageio::to_eight_bits(img.clone(), d.format, &d.meta, output);
                Bytes::from(bs_imageio::encode(&shown, f)?)
            }
            Some(f) => Bytes::from(bs_imageio::encode(&img, f)?),
        };
        Ok((img, times, encoded, output))
    })
    .await?;
    drop(turn);
    let total: f64 = times.iter().map(|t| t.1).sum();
    let steps_header: Vec<String> = times.iter().map(|(n, ms)| format!("{n}={ms:.3}")).collect();
    if let Some(target) = fr.store_as {
        let f = out_format.expect("raw was refused with store_as");
        let route = bs_store::RouteSpec {
            name: target,
            size: Some(encoded.len() as u64),
            content_type: mime_of(f).into(),
            overwrite: true,
            ..Default::default()
        };
        let spec = UploadSpec::new(&st, route);
        let body = tokio_stream::iter([Ok::<_, std::convert::Infallible>(encoded)]);
        let rec = store_stream(st.store.clone(), spec, body).await?;
        let st2 = st.clone();
        let name = rec.name.clone();
        blocking(move || {
            st2.images.refresh(&name)?;
            Ok(())
        })
        .await?;
        let steps: Vec<_> =
            times.iter().map(|(n, ms)| serde_json::json!({"filter": n, "ms": ms})).collect();
        let info = describe(&st.images, rec);
        let body = serde_json::json!({
            "key": info.key, "filter_ms": total, "steps": steps, "blob": info,
        });
        return Ok((StatusCode::CREATED, Json(body)).into_response());
    }
    let mut r = Response::new(Body::from(encoded));
    let h = r.headers_mut();
    match out_format {
        None => {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            pixel_headers(h, &result);
        }
        Some(f) => {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime_of(f)));
        }
    }
    h.insert("x-filter-ms", hv(&format!("{total:.3}")));
    h.insert("x-filter-steps", hv(&steps_header.join(",")));
    h.insert("x-filter-output", HeaderValue::from_static(output.name()));
    h.insert("server-timing", hv(&format!("filter;dur={total:.3}")));
    Ok(r)
}

/// The media type of a format: the one its usual extension gives.
fn mime_of(f: Format) -> &'static str {
    bs_store::content_type_of_extension(f.extensions()[0])
}

fn pixel_headers(h: &mut axum::http::HeaderMap, img: &bs_imaging::DynImage) {
    h.insert("x-width", HeaderValue::from(img.width()));
    h.insert("x-height", HeaderValue::from(img.height()));
    h.insert("x-channels", HeaderValue::from(img.channels()));
    h.insert("x-bits", HeaderValue::from(bits(img)));
}

/// `GET /api/meta/{key}`.
pub async fn meta(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let key = key_from_path(req.uri().path(), "/api/meta/")?;
    crate::no_query(req.uri())?;
    let st2 = st.clone();
    let turn = st.image_turn().await;
    let (rec, d) = blocking(move || st2.images.decode(&key)).await?;
    drop(turn);
    let info = describe(&st.images, rec);
    let mut meta = serde_json::to_value(&d.meta).map_err(WebError::internal)?;
    if let Some(m) = meta.as_object_mut() {
        m.insert("format".into(), d.format.name().into());
    }
    Ok(Json(serde_json::json!({ "blob": info, "image": meta, "display": display(&d) }))
        .into_response())
}

/// A rendering of `key` (`variant`: which, e.g. `t160` for a 160-pixel thumbnail) is
/// revalidated by an ETag made from the blob's current digest: `Ok(Err(304))` when the
/// request's `If-None-Match` names it already (nothing is decoded), else the ETag to send.
async fn rendering_etag(
    st: &Arc<AppState>,
    key: &str,
    variant: &str,
    headers: &axum::http::HeaderMap,
) -> Result<Result<HeaderValue, Response>, WebError> {
    let Some(digest) = crate::blobs::current_etag(st, key).await? else {
        return Err(WebError::NotFound(key.to_string()));
    };
    let etag = format!("\"{}-{variant}\"", digest.trim_matches('"'));
    let etag = HeaderValue::from_str(&etag).map_err(WebError::internal)?;
    let named = (headers.get_all(header::IF_NONE_MATCH).iter()).any(|v| {
        crate::blobs::client_has(v.to_str().unwrap_or_default(), etag.to_str().unwrap_or(""))
    });
    if !named {
        return Ok(Ok(etag));
    }
    let mut r = Response::new(Body::empty());
    *r.status_mut() = axum::http::StatusCode::NOT_MODIFIED;
    r.headers_mut().insert(header::ETAG, etag);
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(Err(r))
}

/// `GET /api/pixels/{key}`.
pub async fn pixels(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let key = key_from_path(req.uri().path(), "/api/pixels/")?;
    let q: PixelsQuery = query(req.uri())?;
    let frame = q.frame.unwrap_or(0);
    let etag = match rendering_etag(&st, &key, &format!("f{frame}"), req.headers()).await? {
        Ok(etag) => etag,
        Err(not_modified) => return Ok(not_modified),
    };
    let st2 = st.clone();
    let turn = st.image_turn().await;
    let (d, bytes) = blocking(move || {
        let (_, d) = st2.images.decode(&key)?;
        let img = d.frame(frame).ok_or_else(|| {
            WebError::Missing(format!("{key} has {} frame(s), not frame {frame}", d.frame_count()))
        })?;
        let bytes = raw_bytes(img);
        Ok((d, bytes))
    })
    .await?;
    drop(turn);
    let mut r = Response::new(Body::from(bytes));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::ETAG, etag);
    h.insert("x-frames", HeaderValue::from(d.frame_count()));
    pixel_headers(h, d.frame(frame).expect("checked above"));
    Ok(r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PixelsQuery {
    /// 0-based frame of a multi-frame image.
    frame: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThumbQuery {
    size: Option<u32>,
}

/// `GET /api/thumbnail/{key}`.
pub async fn thumbnail(
    State(st): State<Arc<AppState>>,
    req: Request,
) -> Result<Response, WebError> {
    let key = key_from_path(req.uri().path(), "/api/thumbnail/")?;
    let q: ThumbQuery = query(req.uri())?;
    let size = q.size.unwrap_or(160);
    if !(16..=512).contains(&size) {
        return Err(WebError::BadRequest(format!("size {size} is not in 16..=512")));
    }
    let etag = match rendering_etag(&st, &key, &format!("t{size}"), req.headers()).await? {
        Ok(etag) => etag,
        Err(not_modified) => return Ok(not_modified),
    };
    let st2 = st.clone();
    let turn = st.image_turn().await;
    let png = blocking(move || st2.images.thumbnail(&key, size)).await?;
    drop(turn);
    let mut r = Response::new(Body::from(png));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("image/png"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r.headers_mut().insert(header::ETAG, etag);
    Ok(r)
}

/// `GET /api/health`.
pub async fn health() -> Response {
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

/// A JSON request body of at most [`MAX_JSON`] bytes, with `Content-Type: application/json`.
pub async fn read_json<T: serde::de::DeserializeOwned>(req: Request) -> Result<T, WebError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if !ct.starts_with("application/json") {
        return Err(WebError::UnsupportedMediaType(format!(
            "expected Content-Type: application/json, got {:?}",
            if ct.is_empty() { "nothing".to_string() } else { ct }
        )));
    }
    let body = http_body_util::Limited::new(req.into_body(), MAX_JSON);
    let bytes = body.collect().await.map_err(|e| {
        if e.is::<http_body_util::LengthLimitError>() {
            WebError::TooLarge(format!("JSON body over {MAX_JSON} bytes"))
        } else {
            WebError::BadRequest(format!("reading the body: {e}"))
        }
    })?;
    serde_json::from_slice(&bytes.to_bytes())
        .map_err(|e| WebError::BadRequest(format!("JSON body: {e}")))
}

fn hv(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_must_be_days_of_the_calendar() {
        for d in ["20240229", "20000229", "20251231", "19700101"] {
            assert!(is_date(d), "{d}");
        }
        for d in ["20251301", "20230229", "19000229", "20250431", "20250100", "2025011", "2025-1-1"]
        {
            assert!(!is_date(d), "{d}");
        }
    }
}
