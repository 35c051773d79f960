//! QIDO-RS (PS3.18 10.6): `GET /dicomweb/studies`, `/dicomweb/studies/{study}/series` and
//! `/dicomweb/studies/{study}/series/{series}/instances`, answered as application/dicom+json
//! arrays from the image index. Query keys by keyword or tag: PatientName, PatientID,
//! StudyDate (a date or a `from-to` range), StudyInstanceUID, AccessionNumber,
//! ModalitiesInStudy / Modality, StudyDescription at study level; Modality, SeriesInstanceUID
//! at series level; SOPInstanceUID at instance level; plus `limit`, `offset`, `includefield`
//! and `fuzzymatching` (accepted; every attribute the index keeps is returned), and `accept`
//! and `charset` in place of their headers (PS3.18 §8.3.3.1). Any other key,
//! a key of another level, or a malformed date, is refused with 400.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bs_meta::ImageQuery;
use serde_json::Value;

use super::json::{Object, SERIES_FIELDS, STUDY_FIELDS};
use super::{check_uid, instances, meta_text as text};
use crate::error::WebError;
use crate::{AppState, blocking, query};

/// Query keys understood, as (keyword, tag).
const KEYS: &[(&str, &str)] = &[
    ("PatientName", "00100010"),
    ("PatientID", "00100020"),
    ("StudyDate", "00080020"),
    ("StudyInstanceUID", "0020000D"),
    ("AccessionNumber", "00080050"),
    ("ModalitiesInStudy", "00080061"),
    ("Modality", "00080060"),
    ("StudyDescription", "00081030"),
    ("SeriesInstanceUID", "0020000E"),
    ("SOPInstanceUID", "00080018"),
];

/// The matching keys of a query, by keyword, and paging.
struct Matching {
    keys: BTreeMap<&'static str, String>,
    limit: usize,
    offset: usize,
}

/// Matching keys applied at each level (others are refused, not silently ignored).
const STUDY_KEYS: &[&str] = &[
    "PatientName",
    "PatientID",
    "StudyDate",
    "StudyInstanceUID",
    "AccessionNumber",
    "ModalitiesInStudy",
    "Modality",
    "StudyDescription",
];
const SERIES_KEYS: &[&str] = &["Modality", "SeriesInstanceUID"];
const INSTANCE_KEYS: &[&str] = &["SOPInstanceUID"];

fn parse(params: Vec<(String, String)>, allowed: &[&str]) -> Result<Matching, WebError> {
    let mut m = Matching { keys: BTreeMap::new(), limit: 1000, offset: 0 };
    for (k, v) in params {
        let number = |v: &str| {
            v.parse::<usize>()
                .map_err(|_| WebError::BadRequest(format!("{k}={v:?} is not a number")))
        };
        match k.as_str() {
            "limit" => {
                m.limit = match number(&v)? {
                    0 => {
                        return Err(WebError::BadRequest(
                            "limit=0 asks for nothing: give 1 to 10000 (more is taken as 10000)"
                                .into(),
                        ));
                    }
                    n => n.min(10_000),
                }
            }
            "offset" => m.offset = number(&v)?,
            "includefield" | "fuzzymatching" => {}
            // Stand-ins for headers, read with them (`super::accept::accepted`).
            k if super::accept::QUERY_HEADERS.contains(&k) => {}
            _ => {
                let Some((kw, _)) =
                    KEYS.iter().find(|(kw, tag)| k == *kw || k.eq_ignore_ascii_case(tag))
                else {
                    return Err(WebError::BadRequest(format!(
                        "QIDO-RS query key {k:?} is not supported (see docs/dicomweb.md)"
                    )));
                };
                if !allowed.contains(kw) {
                    return Err(WebError::BadRequest(format!(
                        "QIDO-RS query key {k:?} does not apply at this level (see docs/dicomweb.md)"
                    )));
                }
                match m.keys.get_mut(kw) {
                    // A UID key given again is a list (as dicomweb-client sends one).
                    Some(was) if UID_KEYS.contains(kw) => {
                        was.push(',');
                        was.push_str(&v);
                    }
                    // Several modalities: one value with several (`CT\\MR`).
                    Some(was) if *kw == "ModalitiesInStudy" => {
                        was.push('\\');
                        was.push_str(&v);
                    }
                    Some(_) => {
                        return Err(WebError::BadRequest(format!(
                            "QIDO-RS query key {k:?} is given twice"
                        )));
                    }
                    None => {
                        m.keys.insert(kw, v);
                    }
                }
            }
        }
    }
    if let Some(d) = m.keys.get("StudyDate") {
        dates(d)?;
    }
    for k in UID_KEYS {
        if let Some(list) = m.keys.get(k) {
            uids(k, list)?;
        }
    }
    Ok(m)
}

/// Keys whose value may be a list of UIDs (PS3.18 8.3.4.1: separated by `,` or `\`, or the
/// key repeated).
const UID_KEYS: &[&str] = &["StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID"];

/// The UIDs of a UID key's value (empty: matches anything), each checked.
fn uids<'a>(key: &str, list: &'a str) -> Result<Vec<&'a str>, WebError> {
    list.split([',', '\\'])
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| check_uid(key, u).map(|()| u))
        .collect()
}

/// Does `uid` match the UID key `key` of `m` (absent or empty: anything; else one of its list)?
fn uid_matches(m: &Matching, key: &str, uid: &str) -> bool {
    match m.keys.get(key).map(|l| uids(key, l)) {
        Some(Ok(list)) => list.is_empty() || list.contains(&uid),
        // (Checked when parsed.)
        Some(Err(_)) => false,
        None => true,
    }
}

/// Does one of `have` match the value of a CS key with several values (`CT\\MR`, each perhaps
/// a wildcard), as ModalitiesInStudy does?
fn any_of(pattern: &str, have: &[String]) -> bool {
    let wanted: Vec<&str> = pattern.split('\\').map(str::trim).filter(|p| !p.is_empty()).collect();
    wanted.is_empty() || wanted.iter().any(|p| have.iter().any(|h| wildcard(p, h)))
}

/// A StudyDate match as an inclusive range (either end open).
fn dates(d: &str) -> Result<(Option<String>, Option<String>), WebError> {
    let one = |s: &str| -> Result<Option<String>, WebError> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(None);
        }
        if crate::api::is_date(s) {
            return Ok(Some(s.to_string()));
        }
        Err(WebError::BadRequest(format!(
            "StudyDate {d:?}: use YYYYMMDD or YYYYMMDD-YYYYMMDD, each a day of the calendar"
        )))
    };
    match d.split_once('-') {
        Some((a, b)) => Ok((one(a)?, one(b)?)),
        None => {
            let day = one(d)?;
            Ok((day.clone(), day))
        }
    }
}

/// Does `value` match the DICOM pattern `pattern` (`*` any run, `?` one character; case
/// insensitive as PN matching usually is)?
fn wildcard(pattern: &str, value: &str) -> bool {
    let p: Vec<char> = pattern.to_lowercase().chars().collect();
    let v: Vec<char> = value.to_lowercase().chars().collect();
    let (mut pi, mut vi, mut star, mut mark) = (0, 0, None, 0);
    while vi < v.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == v[vi]) {
            pi += 1;
            vi += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = vi;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            vi = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Does the metadata match every study-level key given?
fn study_matches(m: &Matching, meta: &Value, uid: &str) -> bool {
    let ok = |key: &str, field_value: &str| match m.keys.get(key) {
        None => true,
        Some(p) if p.is_empty() => true,
        Some(p) => wildcard(p, field_value),
    };
    ok("PatientName", text(meta, "patient_name"))
        && ok("PatientID", text(meta, "patient_id"))
        && ok("AccessionNumber", text(meta, "accession_number"))
        && ok("StudyDescription", text(meta, "study_description"))
        && uid_matches(m, "StudyInstanceUID", uid)
}

/// The page of `items` that `m` asks for, with PS3.18's Warning when more matched than the
/// page holds (`items` holds every match up to the page's end, and one past it if there is
/// one).
fn answer(items: Vec<Value>, m: &Matching) -> Response {
    let more = items.len() > m.offset.saturating_add(m.limit);
    let page: Vec<Value> = items.into_iter().skip(m.offset).take(m.limit).collect();
    let mut r = Response::new(Body::from(Value::Array(page).to_string()));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/dicom+json"));
    if more {
        r.headers_mut().insert(
            header::WARNING,
            HeaderValue::from_static(
                "299 blobstream \"There are additional results that can be requested\"",
            ),
        );
    }
    r
}

fn params(req: &Request) -> Result<Vec<(String, String)>, WebError> {
    query::<Vec<(String, String)>>(req.uri())
}

/// Studies asked of the index at a time while matching a query.
const STUDY_BATCH: usize = 2_000;

/// `GET /dicomweb/studies`.
pub async fn studies(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let query = params(&req)?;
    super::accept::dicom_json(super::accept::accepted(&query, req.headers())?.as_deref())?;
    let m = parse(query, STUDY_KEYS)?;
    let (from, to) = m.keys.get("StudyDate").map(|d| dates(d)).transpose()?.unwrap_or_default();
    let modality = m.keys.get("ModalitiesInStudy").or(m.keys.get("Modality")).cloned();
    // One plain modality is matched by the index; a list or a wildcard here, below.
    let plain = |p: &String| !p.is_empty() && !p.contains(['\\', '*', '?']);
    // Studies named by UID are looked up, not searched for.
    let study_uids = match m.keys.get("StudyInstanceUID") {
        Some(list) => uids("StudyInstanceUID", list)?.into_iter().map(String::from).collect(),
        None => Vec::new(),
    };
    // The longest literal run of a patient, accession or description pattern narrows the
    // index's search (a substring of the instance's patient column or of its text); the
    // pattern itself is matched below.
    let literal = |key: &str| {
        let p = m.keys.get(key)?;
        let run = p.split(['*', '?']).max_by_key(|r| r.len()).filter(|r| !r.is_empty())?;
        Some(run.to_string())
    };
    let mut iq = ImageQuery {
        modality: modality.clone().filter(plain),
        date_from: from,
        date_to: to,
        limit: STUDY_BATCH,
        study_uids,
        patient: literal("PatientID").or_else(|| literal("PatientName")),
        text: literal("AccessionNumber").or_else(|| literal("StudyDescription")),
        ..ImageQuery::default()
    };
    // Every match up to the page's end and one more (to tell whether there are more): the
    // index is read in batches of studies in UID order, each after the last one read, so a
    // query matches over the whole index however large.
    let wanted = m.offset.saturating_add(m.limit).saturating_add(1);
    let (items, m) = blocking(move || {
        let mut items = Vec::new();
        loop {
            let rows = st.images.index().studies(&iq)?;
            let last_batch = rows.len() < STUDY_BATCH;
            iq.study_after = rows.last().map(|s| s.study_uid.clone());
            for s in rows {
                let meta: Value = serde_json::from_str(&s.meta).unwrap_or(Value::Null);
                let modalities_ok = modality.as_ref().is_none_or(|p| any_of(p, &s.modalities));
                if !(modalities_ok && study_matches(&m, &meta, &s.study_uid)) {
                    continue;
                }
                items.push(
                    Object::default()
                        .with_meta(&meta, STUDY_FIELDS)
                        .text("0020000D", "UI", &s.study_uid)
                        .texts("00080061", "CS", &s.modalities)
                        .int("00201206", "IS", Some(s.series as i64))
                        .int("00201208", "IS", Some(s.instances as i64))
                        .text("00081190", "UR", &format!("/dicomweb/studies/{}", s.study_uid))
                        .build(),
                );
                if items.len() == wanted {
                    return Ok((items, m));
                }
            }
            if last_batch {
                return Ok((items, m));
            }
        }
    })
    .await?;
    Ok(answer(items, &m))
}

/// `GET /dicomweb/studies/{study}/series`.
pub async fn series(
    State(st): State<Arc<AppState>>,
    Path(study): Path<String>,
    req: Request,
) -> Result<Response, WebError> {
    let query = params(&req)?;
    super::accept::dicom_json(super::accept::accepted(&query, req.headers())?.as_deref())?;
    check_uid("study", &study)?;
    let m = parse(query, SERIES_KEYS)?;
    let uid = study.clone();
    let rows = blocking(move || Ok(st.images.index().series(&uid)?)).await?;
    let items = rows
        .into_iter()
        .filter_map(|s| {
            let meta: Value = serde_json::from_str(&s.meta).unwrap_or(Value::Null);
            let modality = m.keys.get("Modality").filter(|p| !p.is_empty());
            let keep = modality.is_none_or(|p| wildcard(p, text(&meta, "modality")))
                && uid_matches(&m, "SeriesInstanceUID", &s.series_uid);
            keep.then(|| {
                Object::default()
                    .with_meta(&meta, STUDY_FIELDS)
                    .with_meta(&meta, SERIES_FIELDS)
                    .text("0020000E", "UI", &s.series_uid)
                    .int("00201209", "IS", Some(s.instances as i64))
                    .text(
                        "00081190",
                        "UR",
                        &format!("/dicomweb/studies/{study}/series/{}", s.series_uid),
                    )
                    .build()
            })
        })
        .collect();
    Ok(answer(items, &m))
}

/// `GET /dicomweb/studies/{study}/series/{series}/instances`.
pub async fn instances_of(
    State(st): State<Arc<AppState>>,
    Path((study, series)): Path<(String, String)>,
    req: Request,
) -> Result<Response, WebError> {
    let query = params(&req)?;
    super::accept::dicom_json(super::accept::accepted(&query, req.headers())?.as_deref())?;
    check_uid("study", &study)?;
    check_uid("series", &series)?;
    let m = parse(query, INSTANCE_KEYS)?;
    let (s2, se2) = (study.clone(), series.clone());
    let found = blocking(move || match instances(&st, &s2, Some(&se2), None) {
        Ok(v) => Ok(v),
        Err(WebError::Missing(_)) => Ok(Vec::new()),
        Err(e) => Err(e),
    })
    .await?;
    let items = found
        .into_iter()
        .filter(|i| uid_matches(&m, "SOPInstanceUID", i.uid("sop_instance_uid")))
        .map(|i| {
            Object::instance(&i.meta)
                .text(
                    "00081190",
                    "UR",
                    &format!(
                        "/dicomweb/studies/{study}/series/{series}/instances/{}",
                        i.uid("sop_instance_uid")
                    ),
                )
                .build()
        })
        .collect();
    Ok(answer(items, &m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_and_dates() {
        assert!(wildcard("doe*", "Doe^Jane"));
        assert!(wildcard("*jane", "Doe^Jane"));
        assert!(wildcard("d?e^*", "Doe^Jane"));
        assert!(!wildcard("roe*", "Doe^Jane"));
        assert!(wildcard("*", ""));
        assert_eq!(
            dates("20240101-20241231").unwrap(),
            (Some("20240101".into()), Some("20241231".into()))
        );
        assert_eq!(dates("-20241231").unwrap(), (None, Some("20241231".into())));
        assert_eq!(dates("20240101").unwrap(), (Some("20240101".into()), Some("20240101".into())));
        assert!(dates("2024").is_err());
        for impossible in ["20241301", "20240230", "20240100", "00000000", "99999999"] {
            assert!(dates(impossible).is_err(), "{impossible}");
            assert!(dates(&format!("20240101-{impossible}")).is_err(), "{impossible}");
        }
        assert!(dates("20240229").is_ok(), "a leap day");
        assert!(parse(vec![("limit".into(), "0".into())], STUDY_KEYS).is_err());
        assert!(parse(vec![("Colour".into(), "red".into())], STUDY_KEYS).is_err());
        assert!(parse(vec![("limit".into(), "x".into())], STUDY_KEYS).is_err());
        assert!(parse(vec![("PatientName".into(), "x".into())], SERIES_KEYS).is_err());
        // UID lists: repeated or separated; anything else repeated is refused.
        let two = |k: &str, a: &str, b: &str| {
            parse(vec![(k.into(), a.into()), (k.into(), b.into())], STUDY_KEYS)
        };
        let m = two("StudyInstanceUID", "1.2.3", "1.2.4\\1.2.5").unwrap();
        assert!(
            uid_matches(&m, "StudyInstanceUID", "1.2.5")
                && !uid_matches(&m, "StudyInstanceUID", "1.2")
        );
        assert!(two("StudyInstanceUID", "1.2.3", "x").is_err());
        assert!(two("PatientID", "a", "b").is_err());
        let mods = two("ModalitiesInStudy", "MR", "CT").unwrap();
        assert!(any_of(&mods.keys["ModalitiesInStudy"], &["CT".into()]));
        assert!(any_of("MR\\CT", &["CT".into()]) && any_of("C*", &["CT".into()]));
        assert!(!any_of("MR\\US", &["CT".into()]));
        let q = vec![("00100010".into(), "Doe*".into()), ("limit".into(), "5".into())];
        let m = parse(q, STUDY_KEYS).unwrap();
        assert_eq!((m.keys.get("PatientName").map(String::as_str), m.limit), (Some("Doe*"), 5));
    }
}
