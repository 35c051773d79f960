//! STOW-RS against a real server on port 0, where the body goes wrong: a body that breaks
//! off after instances were stored answers 202 naming what was stored and that the rest
//! failed (the stored ones are found by QIDO-RS); a part bigger than an instance may be here
//! (the server's image byte limit) is refused alone (A700), the parts after it stored; a body
//! whose boundary never comes is refused early, not held whole.

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
async fn a_part_over_what_an_instance_may_be_is_refused_alone_and_the_others_stored() {
    let slice = samples::ct_series_slice(0);
    let (web, base) = start(slice.len() as u64 + 4096).await;
    // Alone: nothing stored, the part refused as out of resources (A700).
    let junk = vec![7u8; 2 * slice.len()];
    let (status, text) = stow(&base, body(std::slice::from_ref(&junk), None)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    let failed = answer["00081198"]["Value"].as_array().unwrap();
    assert_eq!(failed[0]["00081197"]["Value"][0], 0xA700, "{text}");
    let found = reqwest::get(format!("{base}/dicomweb/studies")).await.unwrap();
    let studies: serde_json::Value = found.json().await.unwrap_or(serde_json::json!([]));
    assert_eq!(studies, serde_json::json!([]), "nothing of it stored");
    // Before a good one: that one is stored all the same.
    let (status, text) = stow(&base, body(&[junk, slice], None)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["00081199"]["Value"].as_array().unwrap().len(), 1, "{text}");
    assert_eq!(answer["00081198"]["Value"][0]["00081197"]["Value"][0], 0xA700, "{text}");
    web.shutdown().await;
}

/// A body whose boundary never comes (the header names another) is refused once a few
/// megabytes have gone by, not read (and held) to its end.
#[tokio::test]
async fn a_body_without_its_boundary_is_refused_early() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio_stream::StreamExt;
    let (web, base) = start(64 << 20).await;
    let pulled = Arc::new(AtomicUsize::new(0));
    let p = pulled.clone();
    // 256 MiB in 64 KiB chunks, none of it a boundary.
    let chunks = tokio_stream::iter(0..4096).map(move |_| {
        p.fetch_add(1, Ordering::Relaxed);
        Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'x'; 64 << 10]))
    });
    let ct = "multipart/related; type=\"application/dicom\"; boundary=not-in-this-body";
    let sent = reqwest::Client::new()
        .post(format!("{base}/dicomweb/studies"))
        .header("content-type", ct)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await;
    // The answer comes while the body is still being sent (or the connection is closed on
    // the rest of it); either way the server stopped reading early.
    if let Ok(r) = sent {
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let text = r.text().await.unwrap_or_default();
        assert!(text.is_empty() || text.contains("no boundary or part headers"), "{text}");
    }
    let n = pulled.load(Ordering::Relaxed);
    assert!(n < 1024, "{n} chunks of 64 KiB were taken");
    web.shutdown().await;
}

/// A body sent as fast as the connection takes it: while an instance is being stored, the
/// parser pulls megabytes of what follows at once, and that is no missing boundary.
#[tokio::test]
async fn a_fast_body_of_large_parts_is_taken_whole() {
    let (web, base) = start(64 << 20).await;
    let big = vec![b'x'; 12 << 20];
    let parts = [samples::ct_series_slice(0), big, samples::ct_series_slice(1)];
    let (status, text) = stow(&base, body(&parts, None)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["00081199"]["Value"].as_array().unwrap().len(), 2, "{text}");
    assert_eq!(answer["00081198"]["Value"].as_array().unwrap().len(), 1, "{text}");
    web.shutdown().await;
}
