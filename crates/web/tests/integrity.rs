//! Rotted bytes over HTTP, against a real server on port 0: a flipped byte in a stored blob
//! never reaches a client as a complete, successful body — small blobs and ranges are refused
//! with a 500 naming the corruption, large downloads stop at the bad chunk (the connection is
//! aborted, so the body is shorter than its Content-Length), images are not decoded from
//! rotten bytes, a WADO-RS answer stops before a rotted instance, and `/metrics` counts what
//! was found.

use std::sync::Arc;

use bs_imaging::registry::Registry;
use bs_meta::ImageIndex;
use bs_store::{FsStore, MemStore, Store};
use bs_web::{WebConfig, WebServer};
use bs_wire::CHUNK_SIZE;
use reqwest::StatusCode;

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 13) as u8).collect()
}

fn png() -> Vec<u8> {
    let img = bs_imaging::Image::<u8>::from_vec(
        300,
        200,
        3,
        (0..300 * 200 * 3).map(|i| (i * 7 % 253) as u8).collect(),
    )
    .unwrap();
    bs_imageio::encode(&bs_imaging::DynImage::U8(img), bs_imageio::Format::Png).unwrap()
}

/// A web server over `store` with a fresh in-memory index, and its base URL.
async fn start(store: Arc<dyn Store>) -> (WebServer, String) {
    let index = Arc::new(ImageIndex::open_in_memory().unwrap());
    let web = WebServer::start(store, index, Arc::new(Registry::builtin()), WebConfig::ephemeral())
        .await
        .unwrap();
    let base = web.url().trim_end_matches('/').to_string();
    (web, base)
}

/// What damages a stored blob: (blob name, byte offset).
type Damage = Box<dyn Fn(&str, u64) + Send + Sync>;

async fn rot_never_served_as_success(store: Arc<dyn Store>, damage: Damage) {
    // Stored and damaged before the HTTP server starts, so no decoded copy of it is cached.
    let image = png();
    let spec = bs_store::RouteSpec { name: "card.png".into(), ..Default::default() };
    bs_store::put_bytes(&*store, &spec, &image).unwrap();
    damage("card.png", image.len() as u64 / 2);
    let (web, base) = start(store.clone()).await;
    let http = reqwest::Client::new();
    let big = data(80 << 20, 1);
    let small = data(43_000, 2);
    let hot = data(CHUNK_SIZE as usize, 3);
    for (k, b) in [("big.bin", &big), ("small.bin", &small), ("hot.bin", &hot)] {
        let r = http.put(format!("{base}/blobs/{k}")).body(b.clone()).send().await.unwrap();
        assert!(r.status().is_success(), "{k}: {}", r.status());
    }
    // Read, and read again: a hot blob, served from pages already in memory, checked at once.
    for _ in 0..3 {
        let r = http.get(format!("{base}/blobs/hot.bin")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(&r.bytes().await.unwrap()[..], &hot[..]);
    }
    let bad_at = 30 * CHUNK_SIZE + 1234;
    damage("big.bin", bad_at);
    damage("small.bin", 100);
    damage("hot.bin", CHUNK_SIZE - 1);

    // A range that avoids the bad chunk is still served, exactly.
    let r = http
        .get(format!("{base}/blobs/big.bin"))
        .header("range", "bytes=0-999999")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(&r.bytes().await.unwrap()[..], &big[..1_000_000]);

    // The whole big blob: good chunks flow, then the connection is cut at the bad one.
    let mut r = http.get(format!("{base}/blobs/big.bin")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.content_length(), Some(big.len() as u64));
    let mut got = Vec::new();
    let ended_in_error = loop {
        match r.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert!(ended_in_error, "the body must end in an error, not a clean end");
    assert!(got.len() as u64 <= bad_at - bad_at % CHUNK_SIZE, "{} bytes got through", got.len());
    assert_eq!(&got[..], &big[..got.len()], "what got through is the true prefix");

    // Small blobs and ranges over the bad byte: a 500 that says why, no body.
    for (key, range) in [
        ("small.bin", None),
        ("hot.bin", None),
        ("big.bin", Some(format!("bytes={bad_at}-{}", bad_at + 10))),
    ] {
        let mut req = http.get(format!("{base}/blobs/{key}"));
        if let Some(r) = &range {
            req = req.header("range", r);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR, "{key} {range:?}");
        let text = r.text().await.unwrap();
        assert!(text.contains("corrupt"), "{text}");
    }
    // Images are never decoded from rotten bytes.
    for p in ["/api/thumbnail/card.png?size=20", "/api/meta/card.png", "/api/pixels/card.png"] {
        let r = http.get(format!("{base}{p}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR, "{p}");
    }
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    let found = metrics
        .lines()
        .find(|l| l.starts_with("blobstream_http_corrupt_chunks_found_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<u64>().ok());
    assert!(found.is_some_and(|n| n >= 4), "{metrics}");
    web.shutdown().await;
}

#[tokio::test]
async fn memory_store() {
    let store = MemStore::new();
    let h = store.clone();
    rot_never_served_as_success(
        Arc::new(store),
        Box::new(move |name, off| h.damage(name, off, 0x08).unwrap()),
    )
    .await;
}

#[tokio::test]
async fn fs_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = FsStore::open(dir.path()).unwrap();
    let handle = store.clone();
    rot_never_served_as_success(
        Arc::new(store),
        Box::new(move |name, off| handle.damage(name, off, 0x08).unwrap()),
    )
    .await;
}

/// Poll `f` until it holds (bounded): for work the server does in the background.
/// GET `url` and its JSON body.
async fn get_json(http: &reqwest::Client, url: &str) -> serde_json::Value {
    http.get(url).send().await.unwrap().json().await.unwrap()
}

async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    for _ in 0..400 {
        if f().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("{what} did not happen within 10 s");
}

#[tokio::test]
async fn writes_through_any_door_keep_the_image_index_current() {
    let store = Arc::new(MemStore::new());
    let (web, base) = start(store.clone()).await;
    let http = reqwest::Client::new();
    let search = async |q: &str| -> Vec<String> {
        let v = get_json(&http, &format!("{base}/api/search?q={q}")).await;
        v["results"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap().into()).collect()
    };
    // Stored as a data-plane push or the Blob API would store it: not through HTTP.
    let spec = bs_store::RouteSpec { name: "studies/viaGrpc.png".into(), ..Default::default() };
    bs_store::put_bytes(&*store, &spec, &png()).unwrap();
    eventually("indexing a blob stored outside HTTP", async || {
        search("viaGrpc").await == ["studies/viaGrpc.png"]
    })
    .await;
    store.delete("studies/viaGrpc.png").unwrap();
    eventually("forgetting a deleted blob", async || search("viaGrpc").await.is_empty()).await;
    web.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wado_rs_stops_at_a_rotted_instance() {
    let store = MemStore::new();
    let h = store.clone();
    let (web, base) = start(Arc::new(store)).await;
    let http = reqwest::Client::new();
    let slices: Vec<Vec<u8>> = (1..=3).map(bs_web::samples::ct_series_slice).collect();
    for (i, s) in slices.iter().enumerate() {
        let r = http.put(format!("{base}/blobs/s/slice-{i}.dcm")).body(s.clone()).send().await;
        assert!(r.unwrap().status().is_success());
    }
    let v = get_json(&http, &format!("{base}/api/studies")).await;
    let study = v["studies"][0]["study_uid"].as_str().unwrap().to_string();
    let v = get_json(&http, &format!("{base}/api/studies/{study}/series")).await;
    let series = v["series"][0]["series_uid"].as_str().unwrap().to_string();
    let url = format!("{base}/dicomweb/studies/{study}/series/{series}");
    let get = async || {
        let mut r = http.get(&url).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let promised = r.content_length().unwrap();
        let mut got = Vec::new();
        loop {
            match r.chunk().await {
                Ok(Some(c)) => got.extend_from_slice(&c),
                Ok(None) => break (got, promised, false),
                Err(_) => break (got, promised, true),
            }
        }
    };
    // Whole: every slice, in order, and the body as long as promised.
    let (got, promised, failed) = get().await;
    assert!(!failed && got.len() as u64 == promised);
    let at = |needle: &[u8], hay: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    let places: Vec<_> = slices.iter().map(|s| at(s, &got).expect("every slice is sent")).collect();
    assert!(places.windows(2).all(|p| p[0] < p[1]), "slice order: {places:?}");
    // The middle slice rots: the answer stops before it, in error, and never carries its bytes.
    h.damage("s/slice-1.dcm", slices[1].len() as u64 / 2, 0x08).unwrap();
    let (got, promised, failed) = get().await;
    assert!(failed || (got.len() as u64) < promised, "the body must end short or in error");
    assert!(at(&slices[0], &got).is_some(), "the good first slice still arrives");
    let mut rotted = slices[1].clone();
    let mid = rotted.len() / 2;
    rotted[mid] ^= 0x08;
    assert!(at(&rotted[mid - 64..mid + 64], &got).is_none(), "rotted bytes were sent");
    assert!(at(&slices[2], &got).is_none(), "nothing after the rotted slice");
    web.shutdown().await;
}

#[tokio::test]
async fn an_image_found_corrupt_shows_nothing_made_before() {
    let store = MemStore::new();
    let h = store.clone();
    let (web, base) = start(Arc::new(store)).await;
    let http = reqwest::Client::new();
    let image = png();
    let r = http.put(format!("{base}/blobs/card.png")).body(image.clone()).send().await.unwrap();
    assert!(r.status().is_success());
    let thumb = "/api/thumbnail/card.png?size=20";
    for p in [thumb, "/api/pixels/card.png"] {
        let r = http.get(format!("{base}{p}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{p} before the rot (now cached)");
    }
    // It rots; a download finds it and marks it.
    h.damage("card.png", image.len() as u64 / 2, 0x08).unwrap();
    let r = http.get(format!("{base}/blobs/card.png")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let list = get_json(&http, &format!("{base}/api/list?prefix=")).await;
    let item = list["items"].as_array().unwrap().iter().find(|i| i["key"] == "card.png").cloned();
    assert!(item.unwrap()["corrupt"].is_string(), "{list}");
    // Neither the cached thumbnail nor the cached pixels are served as if it were whole.
    for p in [thumb, "/api/pixels/card.png"] {
        let r = http.get(format!("{base}{p}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR, "{p} after the mark");
        let text = r.text().await.unwrap();
        assert!(text.contains("corrupt"), "{p}: {text}");
    }
    web.shutdown().await;
}
