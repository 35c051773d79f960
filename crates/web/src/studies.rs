//! The worklist endpoints: DICOM instances grouped Patient → Study → Series → Instance from
//! the image index. `GET /api/studies` (a sortable, paged worklist), `GET
//! /api/studies/{study}/series` and `GET /api/series/{series}/instances` (in slice order, only
//! instances whose stored bytes are still the ones indexed).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use bs_meta::StudySummary;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::Criteria;
use crate::error::WebError;
use crate::{AppState, blocking, query_only};

/// Studies read from the index at a time (in UID order) while a worklist page is chosen, and
/// the largest page.
const BATCH: usize = 2_000;
const MAX_PAGE: usize = 1000;
const DEFAULT_PAGE: usize = 50;

#[derive(Deserialize)]
pub struct StudiesQuery {
    #[serde(flatten)]
    criteria: Criteria,
    sort: Option<String>,
    order: Option<String>,
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
}

/// One row of the worklist.
#[derive(Debug, Serialize, PartialEq)]
pub struct Study {
    pub study_uid: String,
    pub patient_name: String,
    pub patient_id: String,
    pub patient_birth_date: String,
    pub patient_sex: String,
    pub study_date: String,
    pub study_time: String,
    pub accession_number: String,
    pub study_description: String,
    pub modalities: Vec<String>,
    pub series: u64,
    /// Decoded images, and every instance (reports and documents too).
    pub images: u64,
    pub instances: u64,
    /// The user metadata given at upload with any of the study's instances (`put --meta`): a
    /// key whose instances disagree lists every value, sorted, separated by ", ".
    pub user_metadata: BTreeMap<String, String>,
}

/// The columns a worklist sorts by.
const SORTS: [&str; 8] =
    ["date", "patient", "id", "accession", "modality", "description", "series", "images"];

fn text(meta: &Value, key: &str) -> String {
    crate::dicomweb::meta_text(meta, key).to_string()
}

fn study(s: StudySummary) -> Study {
    let meta: Value = serde_json::from_str(&s.meta).unwrap_or(Value::Null);
    Study {
        study_uid: s.study_uid,
        patient_name: text(&meta, "patient_name"),
        patient_id: text(&meta, "patient_id"),
        patient_birth_date: text(&meta, "patient_birth_date"),
        patient_sex: text(&meta, "patient_sex"),
        study_date: text(&meta, "study_date"),
        study_time: text(&meta, "study_time"),
        accession_number: text(&meta, "accession_number"),
        study_description: text(&meta, "study_description"),
        modalities: s.modalities,
        series: s.series,
        images: s.images,
        instances: s.instances,
        user_metadata: s.user_metadata.into_iter().map(|(k, v)| (k, v.join(", "))).collect(),
    }
}

/// Sort `studies` by `column` (one of [`SORTS`]); ties by date, then UID, so pages are stable.
fn sort(studies: &mut [Study], column: &str, descending: bool) {
    let key = |s: &Study| -> (String, u64) {
        match column {
            "patient" => (s.patient_name.to_lowercase(), 0),
            "id" => (s.patient_id.to_lowercase(), 0),
            "accession" => (s.accession_number.to_lowercase(), 0),
            "modality" => (s.modalities.join(","), 0),
            "description" => (s.study_description.to_lowercase(), 0),
            "series" => (String::new(), s.series),
            "images" => (String::new(), s.images),
            _ => (format!("{}{}", s.study_date, s.study_time), 0),
        }
    };
    studies.sort_by(|a, b| {
        let primary = key(a).cmp(&key(b));
        let primary = if descending { primary.reverse() } else { primary };
        primary
            .then_with(|| (&b.study_date, &b.study_time).cmp(&(&a.study_date, &a.study_time)))
            .then_with(|| a.study_uid.cmp(&b.study_uid))
    });
}

/// `GET /api/studies`.
pub async fn studies(State(st): State<Arc<AppState>>, req: Request) -> Result<Response, WebError> {
    let allowed = [&crate::api::CRITERIA[..], &["sort", "order", "offset", "limit"]].concat();
    let q: StudiesQuery = query_only(req.uri(), &allowed)?;
    let column = q.sort.clone().unwrap_or_else(|| "date".into());
    if !SORTS.contains(&column.as_str()) {
        return Err(WebError::BadRequest(format!(
            "sort {column:?}: use one of {}",
            SORTS.join(", ")
        )));
    }
    let descending = match q.order.as_deref() {
        None => column == "date",
        Some("asc") => false,
        Some("desc") => true,
        Some(o) => return Err(WebError::BadRequest(format!("order {o:?}: use asc or desc"))),
    };
    let limit = match q.limit {
        None => DEFAULT_PAGE,
        Some(n) if (1..=MAX_PAGE).contains(&n) => n,
        Some(n) => return Err(WebError::BadRequest(format!("limit {n} is not in 1..={MAX_PAGE}"))),
    };
    let mut iq = q.criteria.image_query(String::new(), BATCH)?;
    // Every matching study is looked at, in batches, keeping only the first `offset + limit`
    // in the order asked: the page is right however many studies there are, in memory bounded
    // by the page's end, not by the archive.
    let keep = q.offset.saturating_add(limit);
    let sort_by = column.clone();
    let (total, first) = blocking(move || {
        let (mut total, mut first) = (0usize, Vec::<Study>::new());
        loop {
            let rows = st.images.index().studies(&iq)?;
            let last_batch = rows.len() < BATCH;
            iq.study_after = rows.last().map(|s| s.study_uid.clone());
            total += rows.len();
            first.extend(rows.into_iter().map(study));
            sort(&mut first, &sort_by, descending);
            first.truncate(keep);
            if last_batch {
                return Ok((total, first));
            }
        }
    })
    .await?;
    let page: Vec<Study> = first.into_iter().skip(q.offset).take(limit).collect();
    Ok(Json(serde_json::json!({
        "total": total,
        "offset": q.offset,
        "sort": column,
        "order": if descending { "desc" } else { "asc" },
        "studies": page,
    }))
    .into_response())
}

/// `GET /api/studies/{study}/series`.
pub async fn series(
    State(st): State<Arc<AppState>>,
    Path(study): Path<String>,
) -> Result<Response, WebError> {
    let uid = study.clone();
    let rows = blocking(move || Ok(st.images.index().series(&uid)?)).await?;
    if rows.is_empty() {
        return Err(WebError::Missing(format!("no study {study}")));
    }
    let series: Vec<Value> = rows
        .into_iter()
        .map(|s| {
            let meta: Value = serde_json::from_str(&s.meta).unwrap_or(Value::Null);
            serde_json::json!({
                "series_uid": s.series_uid,
                "series_number": text(&meta, "series_number"),
                "series_description": text(&meta, "series_description"),
                "modality": text(&meta, "modality"),
                "body_part_examined": text(&meta, "body_part_examined"),
                "images": s.images,
                "instances": s.instances,
            })
        })
        .collect();
    Ok(Json(serde_json::json!({ "study_uid": study, "series": series })).into_response())
}

/// `GET /api/series/{series}/instances`: keys in slice order, each with where it sits.
pub async fn instances(
    State(st): State<Arc<AppState>>,
    Path(series): Path<String>,
) -> Result<Response, WebError> {
    let uid = series.clone();
    let rows = blocking(move || {
        let mut out = Vec::new();
        // The viewer shows what decodes; DICOMweb serves the rest too.
        for e in st.images.index().instances(&uid)?.into_iter().filter(|e| e.is_image) {
            // Only bytes that are still the ones indexed; others are re-indexed when read.
            match st.store.stat(&e.name) {
                Ok(rec) if rec.digest == e.digest => out.push(e),
                Ok(_) | Err(bs_store::StoreError::NotFound(_)) => {}
                Err(err) => return Err(err.into()),
            }
        }
        // One instance stored under two names is one slice.
        Ok(bs_meta::one_per_instance(out, bs_meta::ImageEntry::sop_instance_uid))
    })
    .await?;
    if rows.is_empty() {
        return Err(WebError::Missing(format!("no series {series}")));
    }
    let instances: Vec<Value> = rows
        .into_iter()
        .map(|e| {
            let meta: Value = serde_json::from_str(&e.meta).unwrap_or(Value::Null);
            serde_json::json!({
                "key": e.name,
                "instance_number": meta.get("instance_number"),
                "slice_location": meta.get("slice_location"),
                "image_position_patient": meta.get("image_position_patient"),
                "frames": meta.get("number_of_frames").and_then(Value::as_u64).unwrap_or(1),
            })
        })
        .collect();
    Ok(Json(serde_json::json!({ "series_uid": series, "instances": instances })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(uid: &str, patient: &str, date: &str, images: u64) -> Study {
        Study {
            study_uid: uid.into(),
            patient_name: patient.into(),
            patient_id: String::new(),
            patient_birth_date: String::new(),
            patient_sex: String::new(),
            study_date: date.into(),
            study_time: String::new(),
            accession_number: String::new(),
            study_description: String::new(),
            modalities: vec![],
            series: 1,
            images,
            instances: images,
            user_metadata: BTreeMap::new(),
        }
    }

    #[test]
    fn sorting_by_each_column_with_stable_ties() {
        let mut v = vec![
            s("1", "bob", "20240101", 5),
            s("2", "Alice", "20250101", 5),
            s("3", "carol", "20230101", 9),
        ];
        sort(&mut v, "date", true);
        assert_eq!(v.iter().map(|s| s.study_uid.as_str()).collect::<Vec<_>>(), ["2", "1", "3"]);
        sort(&mut v, "patient", false);
        assert_eq!(v.iter().map(|s| s.study_uid.as_str()).collect::<Vec<_>>(), ["2", "1", "3"]);
        sort(&mut v, "images", true);
        // 9 first; the two 5s by date, newest first.
        assert_eq!(v.iter().map(|s| s.study_uid.as_str()).collect::<Vec<_>>(), ["3", "2", "1"]);
    }
}
