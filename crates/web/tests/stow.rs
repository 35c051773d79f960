//! STOW-RS against a real server on port 0, where the body goes wrong: a body that breaks
//! off after instances were stored answers 202 naming what was stored and that the rest
//! failed (the stored ones are found by QIDO-RS); a part bigger than an instance may be here
//! (the server's image byte limit) is a 413 naming the part, and nothing of it is stored.

use std::sync::Arc;

use bs_imaging::registry::Registry;
use bs_meta::ImageIndex;
use bs_store::MemStore;
use bs_web::{WebConfig, WebServer, samples};
use reqwest::StatusCode;

const BOUNDARY: &str = "stow-test-boundary";

/// A multipart/related body of `parts` (each application/dicom), closed unless `cut` is set:
/// then it ends `cut` bytes into the last part, without its closing boundary.
fn body(parts: &[Vec<u8>], cut: Option<usize>) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        out.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        out.extend_from_slice(b"Content-Type: application/dicom\r\n\r\n");
        match cut {
            Some(n) if i + 1 == parts.len() => return [out, p[..n].to_vec()].concat(),
            _ => out.extend_from_slice(p),
        }
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    out
}

/// A server whose images (and so DICOM instances) may have at most `max_bytes` bytes.
async fn start(max_bytes: u64) -> (WebServer, String) {
    let limits = bs_imageio::Limits { max_bytes, ..bs_imageio::Limits::default() };
    let web = WebServer::start(
        Arc::new(MemStore::new()),
        Arc::new(ImageIndex::open_in_memory().unwrap()),
        Arc::new(Registry::builtin()),
        WebConfig { limits, ..WebConfig::ephemeral() },
    )
    .await
    .unwrap();
    let base = web.url().trim_end_matches('/').to_string();
    (web, base)
}

async fn stow(base: &str, body: Vec<u8>) -> (StatusCode, String) {
    let ct = format!("multipart/related; type=\"application/dicom\"; boundary={BOUNDARY}");
    let r = reqwest::Client::new()
        .post(format!("{base}/dicomweb/studies"))
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status(), r.text().await.unwrap())
}

#[tokio::test]
async fn a_body_that_breaks_off_keeps_and_names_the_instances_before_the_break() {
    let (web, base) = start(64 << 20).await;
    let (first, second) = (samples::ct_series_slice(0), samples::ct_series_slice(1));
    let ids = bs_imageio::dicom_ids(&first, &bs_imageio::Limits::default()).unwrap();
    let (status, text) = stow(&base, body(&[first, second], Some(1000))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    let referenced = answer["00081199"]["Value"].as_array().unwrap();
    assert_eq!(referenced.len(), 1);
    assert_eq!(referenced[0]["00081155"]["Value"][0], ids.sop_instance_uid.as_str());
    assert_eq!(answer["00081198"]["Value"].as_array().unwrap().len(), 1, "{text}");
    // The stored instance is there to be found; the cut one is not.
    let url = format!(
        "{base}/dicomweb/studies/{}/series/{}/instances",
        ids.study_instance_uid, ids.series_instance_uid
    );
    let found: serde_json::Value =
        reqwest::get(url).await.unwrap().error_for_status().unwrap().json().await.unwrap();
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");

    // Broken before any instance was stored: the request fails as a whole.
    let (status, text) = stow(&base, body(&[samples::ct_series_slice(2)], Some(1000))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("multipart body, part 1"), "{text}");
    web.shutdown().await;
}

#[tokio::test]
async fn a_part_over_what_an_instance_may_be_is_refused_by_name_and_not_stored() {
    let slice = samples::ct_series_slice(0);
    let (web, base) = start(slice.len() as u64 / 2).await;
    let (status, text) = stow(&base, body(&[slice], None)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
    assert!(text.contains("part 1 is over the"), "{text}");
    let found = reqwest::get(format!("{base}/dicomweb/studies")).await.unwrap();
    let studies: serde_json::Value = found.json().await.unwrap_or(serde_json::json!([]));
    assert_eq!(studies, serde_json::json!([]), "nothing of it stored");
    web.shutdown().await;
}
