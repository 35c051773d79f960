//! DICOMweb (PS3.18) under `/dicomweb`: STOW-RS to store instances, QIDO-RS to search
//! studies, series and instances, WADO-RS to retrieve instances, series, studies, their
//! metadata, frames and rendered images, and WADO-URI for single instances. What is and is not
//! supported: `docs/dicomweb.md`.
//!
//! Instances are blobs named `dicomweb/{study}/{series}/{instance}.dcm` (UIDs as the file says
//! them), indexed like any other image, so the worklist, the viewer and search see them too.
//! Searches answer from the image index (Patient → Study → Series → Instance).

pub(crate) mod accept;
pub(crate) mod json;
pub(crate) mod qido;
pub(crate) mod stow;
pub(crate) mod wado;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use bs_meta::ImageEntry;
use serde_json::Value;

use crate::AppState;
use crate::error::WebError;

/// `r` with the DICOMweb routes under `/dicomweb` (PS3.18; its conformance is
/// docs/dicomweb.md, not the OpenAPI document). Uploads are bounded by `--max-upload` in STOW-RS
/// itself, not by the default body limit.
pub(crate) fn routes(r: Router<Arc<AppState>>) -> Router<Arc<AppState>> {
    const STUDY: &str = "/dicomweb/studies/{study}";
    const SERIES: &str = "/dicomweb/studies/{study}/series/{series}";
    const INSTANCE: &str = "/dicomweb/studies/{study}/series/{series}/instances/{instance}";
    let no_limit = DefaultBodyLimit::disable;
    r.route("/dicomweb/studies", get(qido::studies).post(stow::store_any).layer(no_limit()))
        .route(STUDY, get(wado::retrieve).post(stow::store_in).layer(no_limit()))
        .route(&format!("{STUDY}/metadata"), get(wado::metadata))
        .route(&format!("{STUDY}/series"), get(qido::series))
        .route(SERIES, get(wado::retrieve))
        .route(&format!("{SERIES}/metadata"), get(wado::metadata))
        .route(&format!("{SERIES}/instances"), get(qido::instances_of))
        .route(INSTANCE, get(wado::retrieve))
        .route(&format!("{INSTANCE}/metadata"), get(wado::metadata))
        .route(&format!("{INSTANCE}/frames/{{frames}}"), get(wado::frames))
        .route(&format!("{INSTANCE}/rendered"), get(wado::rendered))
        .route("/dicomweb/wado", get(wado::uri))
}

/// A UID as PS3.5 9.1 allows it: digits and dots, at most 64 characters.
pub(crate) fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 64
        && uid.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && !uid.starts_with('.')
        && !uid.ends_with('.')
        && !uid.contains("..")
}

pub(crate) fn check_uid(what: &str, uid: &str) -> Result<(), WebError> {
    if valid_uid(uid) {
        Ok(())
    } else {
        Err(WebError::BadRequest(format!("{what} {uid:?} is not a DICOM UID")))
    }
}

/// The blob an instance is stored as.
pub(crate) fn instance_key(study: &str, series: &str, instance: &str) -> String {
    format!("dicomweb/{study}/{series}/{instance}.dcm")
}

/// An indexed instance with its metadata parsed, and the size of its stored bytes.
pub(crate) struct Instance {
    pub entry: ImageEntry,
    pub meta: Value,
    pub size: u64,
}

impl Instance {
    pub fn uid(&self, key: &str) -> &str {
        meta_text(&self.meta, key)
    }
}

/// A string field of index metadata ("" when absent).
pub(crate) fn meta_text<'a>(meta: &'a Value, key: &str) -> &'a str {
    meta.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The instances of `study` (all series, or only `series`), optionally only `instance`, in
/// slice order. Not found when none is.
pub(crate) fn instances(
    st: &AppState,
    study: &str,
    series: Option<&str>,
    instance: Option<&str>,
) -> Result<Vec<Instance>, WebError> {
    let index = st.images.index();
    let series_uids: Vec<String> = match series {
        Some(s) => vec![s.to_string()],
        None => index.series(study)?.into_iter().map(|s| s.series_uid).collect(),
    };
    let mut out = Vec::new();
    for s in series_uids {
        for entry in index.instances(&s)? {
            let meta: Value = serde_json::from_str(&entry.meta).unwrap_or(Value::Null);
            if meta_text(&meta, "study_instance_uid") != study
                || instance.is_some_and(|u| meta_text(&meta, "sop_instance_uid") != u)
            {
                continue;
            }
            // Only bytes that are still the ones indexed.
            match st.store.stat(&entry.name) {
                Ok(rec) if rec.digest == entry.digest => {
                    out.push(Instance { entry, meta, size: rec.size })
                }
                Ok(_) | Err(bs_store::StoreError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    // Each instance once (the first of its names in slice order) where it was stored under two.
    let out = bs_meta::one_per_instance(out, |i| i.uid("sop_instance_uid").to_string());
    if out.is_empty() {
        let what = match (series, instance) {
            (Some(s), Some(i)) => format!("no instance {i} in series {s} of study {study}"),
            (None, Some(i)) => format!("no instance {i} in study {study}"),
            (Some(s), None) => format!("no series {s} in study {study}"),
            (None, None) => format!("no study {study}"),
        };
        return Err(WebError::Missing(what));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_are_digits_and_dots() {
        assert!(valid_uid("1.2.840.10008.1.2.1"));
        for bad in ["", ".1", "1.", "1..2", "1.2a", "../x", &"1".repeat(65)] {
            assert!(!valid_uid(bad), "{bad}");
        }
    }
}
