//! DICOMweb, the worklist and search against a real server on port 0, where a user's input
//! is unusual: one instance stored under two names is one instance everywhere (QIDO-RS
//! counts and lists, WADO-RS parts, the series viewer); WADO-URI renders the frame asked for
//! and refuses parameters it would not apply; a misspelt query parameter is refused rather
//! than widening a search; a missing study says so in plain words.

use std::sync::Arc;

use bs_imaging::registry::Registry;
use bs_meta::ImageIndex;
use bs_store::MemStore;
use bs_web::{WebConfig, WebServer, samples};
use dicom_core::value::PrimitiveValue;
use dicom_core::{DataElement, VR};
use dicom_dictionary_std::tags;
use dicom_object::{FileMetaTableBuilder, InMemDicomObject};
use reqwest::StatusCode;
use serde_json::Value;

async fn start() -> (WebServer, String) {
    let web = WebServer::start(
        Arc::new(MemStore::new()),
        Arc::new(ImageIndex::open_in_memory().unwrap()),
        Arc::new(Registry::builtin()),
        WebConfig::ephemeral(),
    )
    .await
    .unwrap();
    let base = web.url().trim_end_matches('/').to_string();
    (web, base)
}

async fn put(base: &str, key: &str, bytes: Vec<u8>) {
    let r = reqwest::Client::new()
        .put(format!("{base}/blobs/{key}"))
        .header("content-type", "application/dicom")
        .body(bytes)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "PUT {key}: {}", r.text().await.unwrap());
}

async fn get(url: &str) -> (StatusCode, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status(), r.text().await.unwrap())
}

async fn json(url: &str) -> Value {
    let (status, text) = get(url).await;
    assert_eq!(status, StatusCode::OK, "{url}: {text}");
    serde_json::from_str(&text).unwrap()
}

/// A study's instance count as QIDO-RS gives it (Number of Study Related Instances).
async fn study_instances(base: &str, study: &str) -> Value {
    let found = json(&format!("{base}/dicomweb/studies?StudyInstanceUID={study}")).await;
    found[0]["00201208"]["Value"][0].clone()
}

#[tokio::test]
async fn an_instance_stored_under_two_names_is_one_instance() {
    let (_web, base) = start().await;
    let (first, second) = (samples::ct_series_slice(0), samples::ct_series_slice(1));
    let ids = bs_imageio::dicom_ids(&first, &bs_imageio::Limits::default()).unwrap();
    let (study, series) = (&ids.study_instance_uid, &ids.series_instance_uid);
    put(&base, "upload/one.dcm", first.clone()).await;
    put(&base, "upload/two.dcm", second).await;
    assert_eq!(study_instances(&base, study).await, 2);
    // The first slice again, as a browser upload and a STOW-RS both would store it.
    put(&base, "again/one-copy.dcm", first).await;
    assert_eq!(study_instances(&base, study).await, 2, "a copy is not another instance");
    let series_list = json(&format!("{base}/dicomweb/studies/{study}/series")).await;
    assert_eq!(series_list[0]["00201209"]["Value"][0], 2, "{series_list}");
    let listed = json(&format!("{base}/dicomweb/studies/{study}/series/{series}/instances")).await;
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    let viewer = json(&format!("{base}/api/series/{series}/instances")).await;
    let keys: Vec<&str> =
        viewer["instances"].as_array().unwrap().iter().filter_map(|i| i["key"].as_str()).collect();
    assert_eq!(keys.len(), 2, "{viewer}");
    let worklist = json(&format!("{base}/api/studies/{study}/series")).await;
    assert_eq!(worklist["series"][0]["instances"], 2, "{worklist}");
    // WADO-RS sends each instance once.
    let r = reqwest::get(format!("{base}/dicomweb/studies/{study}")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    let boundary = ct.split("boundary=").nth(1).unwrap().trim_matches('"').to_string();
    let body = r.bytes().await.unwrap();
    let parts = body.windows(boundary.len() + 2).filter(|w| w[2..] == *boundary.as_bytes());
    assert_eq!(parts.count(), 3, "two parts and the closing boundary");
    // Deleting one name leaves the instance, under its other name.
    reqwest::Client::new().delete(format!("{base}/blobs/upload/one.dcm")).send().await.unwrap();
    assert_eq!(study_instances(&base, study).await, 2);
}

/// A 2-frame 8 × 8 MONOCHROME2 instance: frame 1 all 100, frame 2 a ramp.
fn two_frames() -> Vec<u8> {
    let mut px = vec![100u16; 64];
    px.extend((0..64u16).map(|v| v * 1000));
    let el = |tag, vr, v: &str| DataElement::new(tag, vr, PrimitiveValue::from(v));
    let us = |tag, v: u16| DataElement::new(tag, VR::US, PrimitiveValue::from(v));
    let sop = "1.2.826.0.1.3680043.9.7777.3.1";
    let obj = InMemDicomObject::from_element_iter([
        el(tags::SOP_CLASS_UID, VR::UI, "1.2.840.10008.5.1.4.1.1.7"),
        el(tags::SOP_INSTANCE_UID, VR::UI, sop),
        el(tags::STUDY_INSTANCE_UID, VR::UI, "1.2.826.0.1.3680043.9.7777.1"),
        el(tags::SERIES_INSTANCE_UID, VR::UI, "1.2.826.0.1.3680043.9.7777.2"),
        el(tags::MODALITY, VR::CS, "OT"),
        el(tags::NUMBER_OF_FRAMES, VR::IS, "2"),
        us(tags::SAMPLES_PER_PIXEL, 1),
        el(tags::PHOTOMETRIC_INTERPRETATION, VR::CS, "MONOCHROME2"),
        us(tags::ROWS, 8),
        us(tags::COLUMNS, 8),
        us(tags::BITS_ALLOCATED, 16),
        us(tags::BITS_STORED, 16),
        us(tags::HIGH_BIT, 15),
        us(tags::PIXEL_REPRESENTATION, 0),
        DataElement::new(tags::PIXEL_DATA, VR::OW, PrimitiveValue::U16(px.into())),
    ]);
    let file = obj
        .with_meta(
            FileMetaTableBuilder::new()
                .transfer_syntax("1.2.840.10008.1.2.1")
                .media_storage_sop_class_uid("1.2.840.10008.5.1.4.1.1.7")
                .media_storage_sop_instance_uid(sop),
        )
        .unwrap();
    let mut out = Vec::new();
    file.write_all(&mut out).unwrap();
    out
}

#[tokio::test]
async fn wado_uri_renders_the_frame_asked_for_and_refuses_what_it_would_not_apply() {
    let (_web, base) = start().await;
    put(&base, "cine/two.dcm", two_frames()).await;
    let uri = format!(
        "{base}/dicomweb/wado?requestType=WADO&studyUID=1.2.826.0.1.3680043.9.7777.1\
         &seriesUID=1.2.826.0.1.3680043.9.7777.2&objectUID=1.2.826.0.1.3680043.9.7777.3.1\
         &contentType=image/png"
    );
    let png = |extra: &'static str| {
        let url = format!("{uri}{extra}");
        async move {
            let r = reqwest::get(&url).await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{url}");
            let img = bs_imageio::decode(&r.bytes().await.unwrap(), None, &Default::default());
            img.unwrap().image
        }
    };
    let (default, one, two) =
        (png("").await, png("&frameNumber=1").await, png("&frameNumber=2").await);
    assert_eq!(default, one, "frame 1 is the default");
    assert_ne!(one, two, "frame 2 is another picture");
    let bs_imaging::DynImage::U8(two) = two else { panic!("8-bit rendering") };
    assert!(two.data[0] < two.data[63], "frame 2's ramp rises: {:?}", &two.data[..8]);
    for (extra, status, says) in [
        ("&frameNumber=3", StatusCode::NOT_FOUND, "has 2 frame(s), not frame 3"),
        ("&frameNumber=0", StatusCode::BAD_REQUEST, "frames are numbered from 1"),
        ("&rows=4", StatusCode::BAD_REQUEST, "rows"),
        ("&windowCenter=40", StatusCode::BAD_REQUEST, "windowCenter"),
    ] {
        let (got, text) = get(&format!("{uri}{extra}")).await;
        assert_eq!(got, status, "{extra}: {text}");
        assert!(text.contains(says), "{extra}: {text}");
    }
}

#[tokio::test]
async fn misspelt_query_parameters_are_refused_and_missing_things_named_plainly() {
    let (_web, base) = start().await;
    put(&base, "upload/one.dcm", samples::ct_series_slice(0)).await;
    for path in ["/api/studies?patinet=doe", "/api/search?modalty=CT", "/api/list?lmit=1"] {
        let (status, text) = get(&format!("{base}{path}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {text}");
        assert!(text.contains("unknown query parameter"), "{path}: {text}");
    }
    // Spelt right, they are taken.
    for path in ["/api/studies?patient=PHANTOM", "/api/search?modality=CT", "/api/list?limit=1"] {
        let (status, text) = get(&format!("{base}{path}")).await;
        assert_eq!(status, StatusCode::OK, "{path}: {text}");
    }
    for (path, says) in [
        ("/dicomweb/studies/1.2.3", "\"no study 1.2.3\""),
        ("/api/studies/1.2.3/series", "\"no study 1.2.3\""),
    ] {
        let (status, text) = get(&format!("{base}{path}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {text}");
        assert!(text.contains(says) && !text.contains("no blob named"), "{path}: {text}");
    }
}

/// Frames and renderings go only to a client whose `Accept` takes them as they are sent; one
/// that asks only for another form is told 406, not sent what it cannot read.
#[tokio::test]
async fn frames_and_renderings_answer_an_accept_they_cannot_meet_with_406() {
    let (_web, base) = start().await;
    put(&base, "cine/two.dcm", two_frames()).await;
    let instance = format!(
        "{base}/dicomweb/studies/1.2.826.0.1.3680043.9.7777.1/series/\
         1.2.826.0.1.3680043.9.7777.2/instances/1.2.826.0.1.3680043.9.7777.3.1"
    );
    let ask = |path: &str, accept: &'static str| {
        let url = format!("{instance}/{path}");
        async move {
            let r = reqwest::Client::new().get(&url).header("accept", accept).send().await;
            let r = r.unwrap();
            let kind = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
            (r.status(), kind.unwrap_or_default(), r.text().await.unwrap())
        }
    };
    let octets = "multipart/related; type=\"application/octet-stream\"; transfer-syntax=*";
    let (status, kind, _) = ask("frames/1", octets).await;
    assert_eq!(status, StatusCode::OK);
    assert!(kind.starts_with("multipart/related"), "{kind}");
    for accept in ["multipart/related; type=\"image/jpeg\"", "application/octet-stream"] {
        let (status, _, text) = ask("frames/1", accept).await;
        assert_eq!(status, StatusCode::NOT_ACCEPTABLE, "{accept}: {text}");
        assert!(text.contains("application/octet-stream"), "{accept}: {text}");
    }
    let (status, kind, _) = ask("rendered", "image/jpeg").await;
    assert_eq!((status, kind.as_str()), (StatusCode::OK, "image/jpeg"));
    let (status, kind, _) = ask("rendered", "image/*").await;
    assert_eq!((status, kind.as_str()), (StatusCode::OK, "image/png"));
    let (status, _, text) = ask("rendered", "image/gif").await;
    assert_eq!(status, StatusCode::NOT_ACCEPTABLE, "{text}");
    assert!(text.contains("image/png or image/jpeg"), "{text}");
    // Parameters a route does not take are refused by name, not silently not applied.
    for (path, param) in [
        ("rendered?window=40,400,linear", "window"),
        ("rendered?viewport=4,4", "viewport"),
        ("frames/1?foo=1", "foo"),
        ("metadata?includefield=all", "includefield"),
    ] {
        let (status, _, text) = ask(path, "*/*").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(&format!("unknown query parameter \"{param}\"")), "{text}");
    }
    let r = reqwest::Client::new().get(format!("{instance}?foo=1")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST, "the instance itself");
    // QIDO-RS: a date that is no day of the calendar, and limit=0, are refused.
    let qido = |q: &str| reqwest::Client::new().get(format!("{base}/dicomweb/studies?{q}")).send();
    for q in ["StudyDate=20241301", "StudyDate=20240230", "StudyDate=20240101-20240230", "limit=0"]
    {
        assert_eq!(qido(q).await.unwrap().status(), StatusCode::BAD_REQUEST, "{q}");
    }
    // PS3.18 §8.3.3.1: `accept` and `charset` stand for their headers, on every route; the
    // query's accept replaces the header's (and a + sent unencoded is a +).
    for (path, status, kind) in [
        ("rendered?accept=image/jpeg", StatusCode::OK, "image/jpeg"),
        ("rendered?accept=image/gif", StatusCode::NOT_ACCEPTABLE, ""),
        ("metadata?accept=application/dicom+json", StatusCode::OK, "application/dicom+json"),
        ("metadata?accept=application/dicom%2Bxml", StatusCode::NOT_ACCEPTABLE, ""),
        ("metadata?charset=utf-8", StatusCode::OK, "application/dicom+json"),
        ("metadata?charset=iso-8859-1", StatusCode::NOT_ACCEPTABLE, ""),
        ("frames/1?accept=image/png", StatusCode::NOT_ACCEPTABLE, ""),
    ] {
        let (got, got_kind, text) = ask(path, "*/*").await;
        assert_eq!(got, status, "{path}: {text}");
        assert!(got_kind.starts_with(kind), "{path}: {got_kind}");
    }
    let r = qido("accept=application/dicom%2Bxml").await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_ACCEPTABLE);
    let r = qido("accept=application/json&charset=utf-8").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}
