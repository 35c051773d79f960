//! The HTTP API against a real server on port 0: blobs (Range, ETag, streamed and truncated
//! uploads, limits), listing, search, filters, images, OpenAPI, metrics, auth and HTTPS — over
//! both the memory and the filesystem store.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use bs_imaging::registry::Registry;
use bs_meta::ImageIndex;
use bs_store::{FaultyStore, FsStore, MemStore, Store};
use bs_web::{WebConfig, WebServer};
use reqwest::StatusCode;
use serde_json::Value;

struct Srv {
    web: WebServer,
    base: String,
    http: reqwest::Client,
    _dir: Option<tempfile::TempDir>,
}

impl Srv {
    async fn start_with(fs: bool, cfg: WebConfig) -> Srv {
        let (store, index, dir): (Arc<dyn Store>, ImageIndex, _) = if fs {
            let dir = tempfile::tempdir().unwrap();
            let store = FsStore::open(dir.path()).unwrap();
            let index = ImageIndex::open(&dir.path().join("meta.db")).unwrap();
            (Arc::new(store), index, Some(dir))
        } else {
            (Arc::new(MemStore::new()), ImageIndex::open_in_memory().unwrap(), None)
        };
        Self::start_on(store, index, cfg, dir).await
    }

    /// A server over a store the test made (a faulty one, one on a small file system).
    async fn start_on(
        store: Arc<dyn Store>,
        index: ImageIndex,
        cfg: WebConfig,
        dir: Option<tempfile::TempDir>,
    ) -> Srv {
        let registry = Arc::new(Registry::builtin());
        let web = WebServer::start(store, Arc::new(index), registry, cfg).await.unwrap();
        let base = web.url().trim_end_matches('/').to_string();
        Srv { web, base, http: reqwest::Client::new(), _dir: dir }
    }

    async fn start(fs: bool) -> Srv {
        Self::start_with(fs, WebConfig::ephemeral()).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn put(&self, key: &str, body: Vec<u8>) -> reqwest::Response {
        self.http.put(self.url(&format!("/blobs/{key}"))).body(body).send().await.unwrap()
    }

    /// PUT `body` to `key` again while the answer is `status` (the server noticing a client
    /// gone takes a moment, longer on a loaded machine): polled for up to 60 s, never a fixed
    /// sleep or a number of tries. The last answer's status.
    async fn put_while(&self, key: &str, body: Vec<u8>, status: StatusCode) -> StatusCode {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let got = self.put(key, body.clone()).await.status();
            if got != status || std::time::Instant::now() >= deadline {
                return got;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    /// One raw HTTP/1.1 exchange (for requests a well-behaved client cannot make).
    /// With `cut`, the client stops sending right after `request` (half-close).
    fn raw_with(&self, request: &[u8], cut: bool) -> String {
        let mut s = TcpStream::connect(self.web.addr()).unwrap();
        s.write_all(request).unwrap();
        if cut {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    fn raw(&self, request: &[u8]) -> String {
        self.raw_with(request, false)
    }

    fn cut(&self, request: &[u8]) -> String {
        self.raw_with(request, true)
    }
}

/// An error response: the status and the JSON body's `error.code`.
async fn error_code(r: reqwest::Response) -> (StatusCode, String) {
    let s = r.status();
    let v: Value = r.json().await.expect("errors are JSON");
    (s, v["error"]["code"].as_str().expect("error.code").to_string())
}

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn png(w: u32, h: u32) -> Vec<u8> {
    let img = bs_imaging::Image::<u8>::from_vec(
        w as usize,
        h as usize,
        3,
        (0..w * h * 3).map(|i| (i % 251) as u8).collect(),
    )
    .unwrap();
    bs_imageio::encode(&bs_imaging::DynImage::U8(img), bs_imageio::Format::Png).unwrap()
}

async fn both(f: impl AsyncFn(Srv)) {
    f(Srv::start(false).await).await;
    f(Srv::start(true).await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn put_get_head_range_etag_delete() {
    both(async |s: Srv| {
        let data = payload(3 << 20);
        let r = s.put("a/b%20c.bin", data.clone()).await;
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(r.headers()["location"], "/blobs/a/b%20c.bin");
        let info: Value = r.json().await.unwrap();
        assert_eq!(info["key"], "a/b c.bin");
        assert_eq!(info["size"], data.len());
        assert_eq!(info["is_image"], false);

        let r = s.http.get(s.url("/blobs/a/b%20c.bin")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let etag = r.headers()["etag"].to_str().unwrap().to_string();
        assert_eq!(r.headers()["accept-ranges"], "bytes");
        assert_eq!(r.bytes().await.unwrap(), data);

        let r = s.http.head(s.url("/blobs/a/b%20c.bin")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["content-length"], &data.len().to_string());

        let r = s.http.get(s.url("/blobs/a/b%20c.bin")).header("Range", "bytes=10-19").send();
        let r = r.await.unwrap();
        assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
        assert_eq!(r.headers()["content-range"], &format!("bytes 10-19/{}", data.len()));
        assert_eq!(r.bytes().await.unwrap(), data[10..20]);
        let r = s.http.get(s.url("/blobs/a/b%20c.bin")).header("Range", "bytes=-5").send();
        assert_eq!(r.await.unwrap().bytes().await.unwrap(), data[data.len() - 5..]);

        // Another unit, or several ranges: the header is ignored, the whole blob sent.
        for ignored in ["items=0-1", "bytes=0-1,5-6"] {
            let r = s.http.get(s.url("/blobs/a/b%20c.bin")).header("Range", ignored).send();
            let r = r.await.unwrap();
            assert_eq!(r.status(), StatusCode::OK, "{ignored}");
            assert!(r.headers().get("content-range").is_none(), "{ignored}");
            assert_eq!(r.bytes().await.unwrap(), data, "{ignored}");
        }
        for bad in ["bytes=99999999-", "bytes=5-2", &format!("bytes=0-{}", "9".repeat(400))] {
            let r = s.http.get(s.url("/blobs/a/b%20c.bin")).header("Range", bad).send();
            let r = r.await.unwrap();
            assert_eq!(r.headers()["content-range"], &format!("bytes */{}", data.len()));
            assert_eq!(
                error_code(r).await,
                (StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable".into())
            );
        }

        let r = s.http.get(s.url("/blobs/a/b%20c.bin")).header("If-None-Match", &etag).send();
        assert_eq!(r.await.unwrap().status(), StatusCode::NOT_MODIFIED);

        // Replace; then the old ETag no longer matches.
        assert_eq!(s.put("a/b%20c.bin", b"new".to_vec()).await.status(), StatusCode::CREATED);
        let r = s.http.get(s.url("/blobs/a/b%20c.bin")).header("If-None-Match", &etag).send();
        let r = r.await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.bytes().await.unwrap(), "new");

        // If-None-Match: * refuses to replace; a list of ETags refuses to replace those.
        let pf = (StatusCode::PRECONDITION_FAILED, "precondition_failed".to_string());
        let r = s.http.put(s.url("/blobs/a/b%20c.bin")).header("If-None-Match", "*").body("x");
        assert_eq!(error_code(r.send().await.unwrap()).await, pf);
        // Refused before its body is read, a large upload still gets the answer (the body is
        // read and dropped first: unread bytes would reset the connection under it).
        let big = vec![7u8; 900 << 10];
        let r = s.http.put(s.url("/blobs/a/b%20c.bin")).header("If-None-Match", "*").body(big);
        assert_eq!(error_code(r.send().await.unwrap()).await, pf);
        let cur = s.http.head(s.url("/blobs/a/b%20c.bin")).send().await.unwrap();
        let cur = cur.headers()["etag"].to_str().unwrap().to_string();
        let r = s
            .http
            .put(s.url("/blobs/a/b%20c.bin"))
            .header("If-None-Match", format!("\"x\", {cur}"));
        assert_eq!(error_code(r.body("x").send().await.unwrap()).await, pf);
        let r = s.http.put(s.url("/blobs/a/b%20c.bin")).header("If-None-Match", "{}").body("x");
        assert_eq!(r.send().await.unwrap().status(), StatusCode::BAD_REQUEST);
        let r = s.http.get(s.url("/blobs/a/b%20c.bin")).send().await.unwrap();
        assert_eq!(r.bytes().await.unwrap(), "new", "refused writes changed nothing");
        let r = s.http.put(s.url("/blobs/new-one")).header("If-None-Match", "*").body("x");
        assert_eq!(r.send().await.unwrap().status(), StatusCode::CREATED);
        let r = s.http.put(s.url("/blobs/new-one")).header("If-None-Match", &etag).body("y");
        assert_eq!(r.send().await.unwrap().status(), StatusCode::CREATED, "other ETag: replaced");

        // If-Match: only the version named is replaced or deleted (no lost update).
        let etag_of = |r: reqwest::Response| r.headers()["etag"].to_str().unwrap().to_string();
        let y = etag_of(s.http.head(s.url("/blobs/new-one")).send().await.unwrap());
        let put_if = |m: &str, body: &'static str| {
            s.http.put(s.url("/blobs/new-one")).header("If-Match", m).body(body).send()
        };
        assert_eq!(error_code(put_if(&etag, "z").await.unwrap()).await, pf, "a stale ETag");
        assert_eq!(error_code(put_if(&format!("W/{y}"), "z").await.unwrap()).await, pf, "weak");
        assert_eq!(
            put_if(&format!("\"x\", {y}"), "z").await.unwrap().status(),
            StatusCode::CREATED
        );
        assert_eq!(put_if("*", "w").await.unwrap().status(), StatusCode::CREATED);
        let r = s.http.put(s.url("/blobs/none-here")).header("If-Match", "*").body("x");
        assert_eq!(error_code(r.send().await.unwrap()).await, pf, "* needs a blob");
        let r = s.http.put(s.url("/blobs/new-one")).header("If-Match", "nope").body("x");
        assert_eq!(r.send().await.unwrap().status(), StatusCode::BAD_REQUEST);
        let r = s.http.get(s.url("/blobs/new-one")).send().await.unwrap();
        assert_eq!(r.bytes().await.unwrap(), "w", "refused writes changed nothing");
        let w = etag_of(s.http.head(s.url("/blobs/new-one")).send().await.unwrap());
        let r = s.http.delete(s.url("/blobs/new-one")).header("If-Match", &y).send();
        assert_eq!(error_code(r.await.unwrap()).await, pf, "deleting a version since replaced");
        for inm in ["*".to_string(), format!("\"x\", {w}")] {
            let r = s.http.delete(s.url("/blobs/new-one")).header("If-None-Match", inm).send();
            assert_eq!(error_code(r.await.unwrap()).await, pf, "If-None-Match on a delete");
        }
        let r = s.http.delete(s.url("/blobs/new-one")).header("If-Match", &w).send();
        assert_eq!(r.await.unwrap().status(), StatusCode::NO_CONTENT);

        let r = s.http.delete(s.url("/blobs/a/b%20c.bin")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        let r = s.http.get(s.url("/blobs/a/b%20c.bin")).send().await.unwrap();
        assert_eq!(error_code(r).await, (StatusCode::NOT_FOUND, "not_found".into()));
        let r = s.http.delete(s.url("/blobs/a/b%20c.bin")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn path_tricks_are_refused_with_json_errors() {
    let s = Srv::start(true).await;
    for p in
        ["/blobs/a%2F..%2Fb", "/blobs/a%2F%2e%2e%2Fb", "/blobs/a%00b", "/blobs/a//b", "/blobs/%FF"]
    {
        let r = s.http.get(s.url(p)).send().await.unwrap();
        assert_eq!(error_code(r).await, (StatusCode::BAD_REQUEST, "invalid_key".into()), "{p}");
        let r = s.http.put(s.url(p)).body("x").send().await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{p}");
    }
    // A 20 KB key is refused with a message of bounded size, not repeated whole.
    let long = format!("/blobs/{}", "k".repeat(20_000));
    let r = s.http.get(s.url(&long)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let text = r.text().await.unwrap();
    assert!(
        text.len() < 1000 && text.contains("(20000 bytes)"),
        "{} bytes: {text:.300}",
        text.len()
    );
    // `..` in the raw request line (clients normalise it away, so send it by hand).
    for p in ["/blobs/a/../../etc/passwd", "/blobs/a/%2e%2e/b", "/api/meta/a/./b"] {
        let req = format!("GET {p} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        let resp = s.raw(req.as_bytes());
        assert!(resp.starts_with("HTTP/1.1 400") && resp.contains("invalid_key"), "{p}: {resp}");
    }
    for q in [
        "/api/list?prefix=../",
        "/api/list?prefix=a",
        "/api/list?prefix=a//",
        "/api/search?prefix=%00/",
    ] {
        let (st, v) = s.get_json(q).await;
        assert_eq!(
            (st, v["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_key")),
            "{q}"
        );
    }
    let (st, _) = s.get_json("/api/list?limit=0").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let (st, _) = s.get_json("/api/list?limit=abc").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let r = s.http.patch(s.url("/blobs/a")).send().await.unwrap();
    assert_eq!(error_code(r).await, (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed".into()));
    let (st, v) = s.get_json("/nothing/here").await;
    assert_eq!((st, v["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
    // Nothing was stored by any of it.
    let (_, v) = s.get_json("/api/list").await;
    assert_eq!(v["items"].as_array().unwrap().len() + v["folders"].as_array().unwrap().len(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn truncated_oversized_and_vanishing_uploads_leave_nothing() {
    both(async |s: Srv| {
        // Content-Length promises more than arrives, then the client goes away.
        let resp = s.cut(b"PUT /blobs/t/short HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nonly this");
        assert!(resp.is_empty() || resp.starts_with("HTTP/1.1 400"), "{resp}");
        // A chunked body cut off mid-chunk.
        let resp = s.cut(
            b"PUT /blobs/t/chunked HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
        );
        assert!(resp.is_empty() || resp.starts_with("HTTP/1.1 400"), "{resp}");
        // A client that connects, sends half, and vanishes without closing cleanly.
        {
            let mut c = TcpStream::connect(s.web.addr()).unwrap();
            c.write_all(b"PUT /blobs/t/vanish HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n")
                .unwrap();
            c.write_all(&[1u8; 5000]).unwrap();
        }
        // Over the size limit, declared up front.
        let big = StatusCode::PAYLOAD_TOO_LARGE;
        let limited = Srv::start_with(false, WebConfig { max_upload: 1000, ..WebConfig::ephemeral() }).await;
        let r = limited.put("t/big", payload(1001)).await;
        assert_eq!(error_code(r).await, (big, "too_large".into()));
        // Over the limit without a declared length (chunked).
        let stream = futures_stream(payload(3000));
        let r = limited.http.put(limited.url("/blobs/t/big2")).body(stream).send().await.unwrap();
        assert_eq!(error_code(r).await, (big, "too_large".into()));
        let (_, v) = limited.get_json("/api/list?prefix=t/").await;
        assert!(v["items"].as_array().unwrap().is_empty(), "{v}");

        for key in ["t/short", "t/chunked", "t/vanish"] {
            let r = s.http.get(s.url(&format!("/blobs/{key}"))).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::NOT_FOUND, "{key} must not be visible");
        }
        // Once the server notices the vanished client, its upload is aborted and the name is
        // free again: until then a new upload of it is told another one is writing (409).
        // Poll for that moment (bounded), never sleep a fixed time.
        let last = s.put_while("t/vanish", payload(100), StatusCode::CONFLICT).await;
        assert_eq!(last, StatusCode::CREATED, "the vanished upload still holds its name");
        let r = s.http.get(s.url("/blobs/t/vanish")).send().await.unwrap();
        assert_eq!(r.bytes().await.unwrap(), payload(100), "only the new upload's bytes");
        // The server still serves, and the same names can be uploaded properly.
        assert_eq!(s.put("t/short", payload(1000)).await.status(), StatusCode::CREATED);
        let r = s.http.get(s.url("/blobs/t/short")).send().await.unwrap();
        assert_eq!(r.bytes().await.unwrap().len(), 1000);
    })
    .await;
}

fn futures_stream(data: Vec<u8>) -> reqwest::Body {
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        data.chunks(500).map(|c| Ok(c.to_vec())).collect();
    reqwest::Body::wrap_stream(tokio_stream::iter(chunks))
}

/// Whether `store` holds a pending upload of `key` (aborting it if so).
fn pending(store: &dyn Store, key: &str) -> bool {
    match store.abort(key) {
        Ok(()) => true,
        Err(bs_store::StoreError::NoUpload(_)) => false,
        Err(e) => panic!("abort {key}: {e}"),
    }
}

/// A chunked PUT and a multipart POST that run out of disk space. The server answers 507 as
/// soon as the disk is full, while the client may still be sending; it then closes the
/// connection, so the client sees either the 507 or the connection cut. Either way the
/// upload was discarded before the answer went out. (Each request on a new connection: the
/// client may have pooled the one the server closed.)
async fn fill_the_disk(s: &mut Srv, size: usize) {
    let refused = async |r: reqwest::Result<reqwest::Response>| match r {
        Ok(r) => assert_eq!(
            error_code(r).await,
            (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage".into())
        ),
        Err(e) => assert!(e.is_request() || e.is_body(), "{e:?}"),
    };
    let r = s.http.put(s.url("/blobs/full/chunked")).body(futures_stream(payload(size))).send();
    refused(r.await).await;
    s.http = reqwest::Client::new();
    let part = reqwest::multipart::Part::bytes(payload(size)).file_name("form.bin");
    let form = reqwest::multipart::Form::new().part("file", part);
    refused(s.http.post(s.url("/blobs?prefix=full/")).multipart(form).send().await).await;
    s.http = reqwest::Client::new();
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_that_fill_the_disk_leave_nothing_pending() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FsStore::open(dir.path()).unwrap();
    let store: Arc<dyn Store> = Arc::new(FaultyStore::disk_full_after(fs, 1 << 20));
    let index = ImageIndex::open(&dir.path().join("meta.db")).unwrap();
    let staging = dir.path().join("staging");
    let mut s = Srv::start_on(store.clone(), index, WebConfig::ephemeral(), Some(dir)).await;
    fill_the_disk(&mut s, 3 << 20).await;
    for key in ["full/chunked", "full/form.bin"] {
        let r = s.http.get(s.url(&format!("/blobs/{key}"))).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{key}");
        assert!(!pending(store.as_ref(), key), "{key} is left pending");
    }
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0, "staged bytes left behind");
    // The names are free: an empty blob needs no disk space.
    assert_eq!(s.put("full/chunked", Vec::new()).await.status(), StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_disk_is_told_without_the_servers_paths() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_string_lossy().to_string();
    let store = FsStore::open(dir.path()).unwrap();
    let index = ImageIndex::open(&dir.path().join("meta.db")).unwrap();
    // The staging folder becomes a file: a staged upload cannot be created (ENOTDIR).
    let staging = dir.path().join("staging");
    std::fs::remove_dir_all(&staging).unwrap();
    std::fs::write(&staging, b"").unwrap();
    let s = Srv::start_on(Arc::new(store), index, WebConfig::ephemeral(), Some(dir)).await;
    let r = s.put("big.bin", payload(1 << 20)).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let text = r.text().await.unwrap();
    assert!(text.contains("storage I/O failed: "), "{text}");
    assert!(!text.contains(&root), "the answer names the server's folder: {text}");
}

/// A tmpfs of `mib` MiB mounted on a temporary directory, unmounted on drop; `None` where the
/// test may not mount file systems.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(mib: u32) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// The same on a really full file system, where removing the pending upload's row needs room
/// in the catalogue's database, whose file is on that same file system.
#[tokio::test(flavor = "multi_thread")]
async fn uploads_that_fill_a_real_disk_leave_nothing_pending() {
    let tmpfs = Tmpfs::mount(4)
        .expect("mounting a tmpfs needs root (the test suite runs as root on CI machines)");
    let root = tmpfs.0.path();
    let store: Arc<dyn Store> = Arc::new(FsStore::open(root).unwrap());
    let index = ImageIndex::open_in_memory().unwrap();
    let mut s = Srv::start_on(store.clone(), index, WebConfig::ephemeral(), None).await;
    fill_the_disk(&mut s, 8 << 20).await;
    for key in ["full/chunked", "full/form.bin"] {
        assert!(!pending(store.as_ref(), key), "{key} is left pending");
    }
    assert_eq!(std::fs::read_dir(root.join("staging")).unwrap().count(), 0);
    // The disk is usable again.
    assert_eq!(s.put("after", payload(1 << 20)).await.status(), StatusCode::CREATED);
    s.web.shutdown().await;
    drop(store);
}

#[tokio::test(flavor = "multi_thread")]
async fn multipart_post_and_content_types() {
    let s = Srv::start(true).await;
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(png(8, 6)).file_name("one.png"))
        .text("key", "other/place/two.png")
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"hello".to_vec()).file_name("../evil/two.png"),
        )
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"text".to_vec()).file_name("c:\\dir\\notes.txt"),
        );
    let r = s.http.post(s.url("/blobs?prefix=up/")).multipart(form).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let v: Value = r.json().await.unwrap();
    let keys: Vec<&str> =
        v["stored"].as_array().unwrap().iter().map(|b| b["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["up/one.png", "other/place/two.png", "up/notes.txt"]);
    assert_eq!(v["stored"][0]["is_image"], true);
    assert_eq!(v["stored"][0]["image"]["width"], 8);
    assert_eq!(v["stored"][0]["content_type"], "image/png");

    // Wrong content types.
    let r = s.http.post(s.url("/blobs")).header("content-type", "application/json").body("{}");
    assert_eq!(
        error_code(r.send().await.unwrap()).await,
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type".into())
    );
    let r = s
        .http
        .put(s.url("/blobs/x"))
        .header("content-type", "multipart/form-data; boundary=x")
        .body("--x--");
    assert_eq!(r.send().await.unwrap().status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // The form type curl sends with --data-binary unless told otherwise is not the blob's:
    // the name's extension says it; a type given is kept.
    for (key, given, stored) in [
        ("x/scan.png", "application/x-www-form-urlencoded", "image/png"),
        (
            "x/notes.bin",
            "application/x-www-form-urlencoded; charset=utf-8",
            "application/octet-stream",
        ),
        ("x/data.png", "application/vnd.example", "application/vnd.example"),
    ] {
        let r = s.http.put(s.url(&format!("/blobs/{key}"))).header("content-type", given);
        let v: Value = r.body(png(2, 2)).send().await.unwrap().json().await.unwrap();
        assert_eq!(v["content_type"], stored, "{key}: {v}");
    }
    let r = s.http.post(s.url("/api/filter")).body("{}").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // A form without files, and a malformed form.
    let form = reqwest::multipart::Form::new().text("key", "k");
    let r = s.http.post(s.url("/blobs")).multipart(form).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // An unknown field is refused, saying what was stored before it.
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(b"1".to_vec()).file_name("first.txt"))
        .text("note", "what is this");
    let r = s.http.post(s.url("/blobs?prefix=up/")).multipart(form).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let msg = r.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("form field \"note\" is no file part") && msg.contains("up/first.txt"),
        "{msg}"
    );
    let r = s
        .http
        .post(s.url("/blobs"))
        .header("content-type", "multipart/form-data; boundary=zz")
        .body("garbage");
    assert_eq!(r.send().await.unwrap().status(), StatusCode::BAD_REQUEST);
    // A stored HTML blob cannot run script in our origin.
    s.put("x/page.html", b"<script>alert(1)</script>".to_vec()).await;
    let r = s.http.get(s.url("/blobs/x/page.html")).send().await.unwrap();
    assert!(r.headers()["content-security-policy"].to_str().unwrap().contains("sandbox"));
}

#[tokio::test(flavor = "multi_thread")]
async fn multipart_post_refuses_unknown_query_parameters_and_keys_are_the_text_sent() {
    let s = Srv::start(true).await;
    let file =
        |name: &str| reqwest::multipart::Part::bytes(b"x".to_vec()).file_name(name.to_string());
    let post = async |query: &str, form: reqwest::multipart::Form| {
        let r = s.http.post(s.url(&format!("/blobs{query}"))).multipart(form).send().await;
        let r = r.unwrap();
        let st = r.status();
        (st, r.json::<Value>().await.unwrap())
    };
    // Unknown query parameters (a typo of prefix, or anything else) are refused, and nothing
    // is stored.
    for q in ["?prefx=up/", "?prefix=up/&x=1", "?prefix=up/&prefix=down/", "?=1", "?key=a"] {
        let form = reqwest::multipart::Form::new().text("key", "null").part("file", file("a.txt"));
        let (st, v) = post(q, form).await;
        assert_eq!(
            (st, v["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("bad_request")),
            "{q}: {v}"
        );
        assert!(v["error"]["message"].as_str().unwrap().contains("query string"), "{v}");
    }
    let (_, v) = s.get_json("/api/list").await;
    assert!(
        v["items"].as_array().unwrap().is_empty() && v["folders"].as_array().unwrap().is_empty(),
        "{v}"
    );
    // Form fields are text: a key field is the key it spells, as the OpenAPI document says
    // (a string matching the key pattern) — `null` and `true` included. Without one, a file is
    // stored as prefix + its file name.
    let form = reqwest::multipart::Form::new()
        .text("key", "null")
        .part("file", file("a.txt"))
        .text("key", "true")
        .part("file", file("b.txt"))
        .part("file", file("c.txt"));
    let (st, v) = post("?prefix=up/", form).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let keys: Vec<&str> =
        v["stored"].as_array().unwrap().iter().map(|i| i["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["null", "true", "up/c.txt"]);
    let (_, doc) = s.get_json("/api/openapi.json").await;
    let post = &doc["paths"]["/blobs"]["post"];
    assert_eq!(post["parameters"].as_array().unwrap().len(), 1, "prefix is the only parameter");
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_is_one_folder_level_with_pages() {
    let s = Srv::start(true).await;
    for k in ["top.txt", "a/1", "a/2", "a/deep/x", "b/1", "c.png", "d/e/f"] {
        assert_eq!(s.put(k, b"x".to_vec()).await.status(), StatusCode::CREATED);
    }
    let (_, v) = s.get_json("/api/list").await;
    let folders: Vec<&str> =
        v["folders"].as_array().unwrap().iter().map(|f| f["prefix"].as_str().unwrap()).collect();
    let items: Vec<&str> =
        v["items"].as_array().unwrap().iter().map(|f| f["key"].as_str().unwrap()).collect();
    assert_eq!(folders, ["a/", "b/", "d/"]);
    assert_eq!(items, ["c.png", "top.txt"]);
    assert_eq!(v["next_after"], Value::Null);
    let (_, v) = s.get_json("/api/list?prefix=a/").await;
    assert_eq!(v["folders"][0]["name"], "deep");
    assert_eq!(v["items"].as_array().unwrap().len(), 2);
    // Pages of two entries walk the same listing.
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let q = format!("/api/list?limit=2&after={}", urlenc(&after));
        let (_, v) = s.get_json(&q).await;
        for f in v["folders"].as_array().unwrap() {
            seen.push(f["prefix"].as_str().unwrap().to_string());
        }
        for i in v["items"].as_array().unwrap() {
            seen.push(i["key"].as_str().unwrap().to_string());
        }
        match v["next_after"].as_str() {
            Some(a) => after = a.to_string(),
            None => break,
        }
    }
    seen.sort();
    assert_eq!(seen, ["a/", "b/", "c.png", "d/", "top.txt"]);
}

fn urlenc(s: &str) -> String {
    s.bytes()
        .map(
            |b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            },
        )
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn uploaded_images_are_indexed_and_searchable() {
    both(async |s: Srv| {
        let ct = bs_web::samples::ct_phantom_dicom(64);
        let r = s.put("studies/p1/ct.dcm", ct.clone()).await;
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["image"]["modality"], "CT");
        assert_eq!(v["content_type"], "application/dicom");
        s.put("photos/card.png", png(16, 16)).await;
        s.put("docs/readme.txt", b"CT is mentioned here".to_vec()).await;

        let find = async |q: &str| -> Vec<String> {
            let (st, v) = s.get_json(&format!("/api/search?{q}")).await;
            assert_eq!(st, StatusCode::OK, "{q}: {v}");
            v["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["key"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(find("modality=CT").await, ["studies/p1/ct.dcm"]);
        assert_eq!(find("modality=ct").await, ["studies/p1/ct.dcm"]);
        assert_eq!(find("patient=phantom").await, ["studies/p1/ct.dcm"]);
        assert_eq!(find("patient=BS-0001").await, ["studies/p1/ct.dcm"]);
        assert_eq!(find("q=shepp").await, ["studies/p1/ct.dcm"]);
        assert_eq!(find("q=card").await, ["photos/card.png"]);
        assert_eq!(find("date_from=20250101&date_to=20261231").await, ["studies/p1/ct.dcm"]);
        assert!(find("date_from=20270101").await.is_empty());
        assert!(find("q=mentioned").await.is_empty(), "text blobs are not images");
        assert_eq!(find("prefix=photos/").await, ["photos/card.png"]);
        let (st, _) = s.get_json("/api/search?date_from=2026-01-01").await;
        assert_eq!(st, StatusCode::BAD_REQUEST);

        // Replaced by something else, then deleted: search follows.
        s.put("studies/p1/ct.dcm", png(4, 4)).await;
        assert!(find("modality=CT").await.is_empty());
        s.put("studies/p1/ct.dcm", ct).await;
        assert_eq!(find("modality=CT").await.len(), 1);
        s.http.delete(s.url("/blobs/studies/p1/ct.dcm")).send().await.unwrap();
        assert!(find("modality=CT").await.is_empty());
    })
    .await;
}

/// Blobs written to the store by another door (the data plane, the Blob API) are indexed by
/// the server's follower: the images found by search, the many others recorded as no image
/// (in batches), and a name re-put as an image between its two looks ends up an image.
#[tokio::test(flavor = "multi_thread")]
async fn blobs_stored_behind_the_http_api_are_indexed_images_and_all() {
    let dir = tempfile::tempdir().unwrap();
    let store = FsStore::open(dir.path()).unwrap();
    let index = Arc::new(ImageIndex::open(&dir.path().join("meta.db")).unwrap());
    let registry = Arc::new(Registry::builtin());
    let web =
        WebServer::start(Arc::new(store.clone()), index.clone(), registry, WebConfig::ephemeral())
            .await
            .unwrap();
    let put = |name: &str, data: &[u8]| {
        let spec = bs_store::RouteSpec { name: name.into(), overwrite: true, ..Default::default() };
        bs_store::put_bytes(&store, &spec, data).unwrap();
    };
    let raw: Vec<String> = (0..600).map(|i| format!("raw/{i:04}")).collect();
    for (i, name) in raw.iter().enumerate() {
        put(name, &payload(100 + i));
    }
    put("raw/0300", &png(8, 8)); // changed its mind: an image after all
    put("photos/a.png", &png(16, 16));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let settled = |name: &str| {
        let rec = store.stat(name).unwrap();
        index.get(name).unwrap().filter(|e| e.digest == rec.digest)
    };
    while raw.iter().chain([&"photos/a.png".to_string()]).any(|n| settled(n).is_none()) {
        assert!(std::time::Instant::now() < deadline, "the follower never indexed everything");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for name in &raw {
        let e = settled(name).unwrap();
        assert_eq!(e.is_image, name == "raw/0300", "{name}: {e:?}");
    }
    assert!(settled("photos/a.png").unwrap().is_image);
    let url = format!("{}api/search?prefix=raw/", web.url());
    let v: Value = reqwest::get(url).await.unwrap().json().await.unwrap();
    assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v}");
    web.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn images_meta_pixels_thumbnails_and_filters() {
    let s = Srv::start(true).await;
    s.put("img/ct.dcm", bs_web::samples::ct_phantom_dicom(128)).await;
    s.put("img/card.png", png(40, 30)).await;
    s.put("img/bad.png", b"\x89PNG\r\n\x1a\nthis is not a png".to_vec()).await;

    let (st, m) = s.get_json("/api/meta/img/ct.dcm").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(m["display"]["center"], 40.0);
    assert_eq!(m["display"]["width"], 400.0);
    assert_eq!(m["display"]["unit"], "HU");
    assert_eq!(m["display"]["min"], -1000.0);
    assert_eq!(m["image"]["format"], "DICOM");

    let r = s.http.get(s.url("/api/pixels/img/ct.dcm")).send().await.unwrap();
    let h = r.headers().clone();
    assert_eq!((h["x-width"].to_str().unwrap(), h["x-bits"].to_str().unwrap()), ("128", "16"));
    let raw = r.bytes().await.unwrap();
    assert_eq!(raw.len(), 128 * 128 * 2);
    // Corner pixel is air: raw - offset = -1000 HU.
    let corner = u16::from_le_bytes([raw[0], raw[1]]) as f64;
    assert_eq!(corner - m["display"]["offset"].as_f64().unwrap(), -1000.0);

    let r = s.http.get(s.url("/api/thumbnail/img/card.png?size=20")).send().await.unwrap();
    assert_eq!(r.headers()["content-type"], "image/png");
    let t = bs_imageio::decode(&r.bytes().await.unwrap(), None, &Default::default()).unwrap();
    assert_eq!((t.meta.width, t.meta.height), (20, 15));
    let r = s.http.get(s.url("/api/thumbnail/img/card.png?size=5")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // Renderings are revalidated by ETag: the same blob is a 304, another size or frame and
    // the blob replaced are new answers.
    let thumb = |size: u32, tag: Option<String>| {
        let mut r = s.http.get(s.url(&format!("/api/thumbnail/img/card.png?size={size}")));
        if let Some(t) = tag {
            r = r.header("if-none-match", t);
        }
        async move {
            let r = r.send().await.unwrap();
            (r.status(), r.headers().get("etag").map(|v| v.to_str().unwrap().to_string()))
        }
    };
    let (_, tag) = thumb(20, None).await;
    let tag = tag.expect("a thumbnail has an ETag");
    assert_eq!(thumb(20, Some(tag.clone())).await, (StatusCode::NOT_MODIFIED, Some(tag.clone())));
    assert_eq!(thumb(40, Some(tag.clone())).await.0, StatusCode::OK);
    let r = s.http.get(s.url("/api/pixels/img/card.png")).send().await.unwrap();
    let pixels_tag = r.headers()["etag"].to_str().unwrap().to_string();
    assert_ne!(pixels_tag, tag);
    let r = s.http.get(s.url("/api/pixels/img/card.png")).header("if-none-match", &pixels_tag);
    assert_eq!(r.send().await.unwrap().status(), StatusCode::NOT_MODIFIED);
    // Another blob replaced: its old tag no longer answers 304.
    let other = |tag: Option<&str>| {
        let mut r = s.http.get(s.url("/api/thumbnail/img/other.png?size=20"));
        if let Some(t) = tag {
            r = r.header("if-none-match", t);
        }
        async move {
            let r = r.send().await.unwrap();
            (r.status(), r.headers().get("etag").map(|v| v.to_str().unwrap().to_string()))
        }
    };
    s.put("img/other.png", png(24, 18)).await;
    let (_, old) = other(None).await;
    s.put("img/other.png", png(30, 20)).await;
    let (status, new) = other(old.as_deref()).await;
    assert_eq!(status, StatusCode::OK, "the blob was replaced");
    assert!(new.is_some() && new != old, "{old:?} {new:?}");

    // Corrupt image, and a blob that is not an image: 422 with a message; server goes on.
    for p in ["/api/meta/img/bad.png", "/api/thumbnail/img/bad.png", "/api/pixels/img/bad.png"] {
        let r = s.http.get(s.url(p)).send().await.unwrap();
        assert_eq!(
            error_code(r).await,
            (StatusCode::UNPROCESSABLE_ENTITY, "unprocessable".into()),
            "{p}"
        );
    }
    let (st, _) = s.get_json("/api/meta/img/none.png").await;
    assert_eq!(st, StatusCode::NOT_FOUND);

    let (_, f) = s.get_json("/api/filters").await;
    let names: Vec<&str> =
        f["filters"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    for n in ["blur", "despeckle", "sharpen", "edge", "emboss", "oilpaint", "pixelize", "spread"] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }

    let body = serde_json::json!({"key": "img/card.png", "steps": [{"filter": "blur", "params": {"size": 5}}, {"filter": "invert"}], "format": "raw"});
    let r = s.http.post(s.url("/api/filter")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let h = r.headers().clone();
    assert!(h["x-filter-ms"].to_str().unwrap().parse::<f64>().unwrap() >= 0.0);
    let steps = h["x-filter-steps"].to_str().unwrap();
    assert!(steps.starts_with("blur=") && steps.contains(",invert="), "{steps}");
    assert_eq!(r.bytes().await.unwrap().len(), 40 * 30 * 3);

    // Same chain, stored: the result is a new image blob.
    let body = serde_json::json!({"key": "img/card.png", "steps": [{"filter": "blur", "params": {"size": "5"}}], "store_as": "img/card-blur.png"});
    let r = s.http.post(s.url("/api/filter")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["blob"]["image"]["width"], 40);
    assert_eq!(v["steps"][0]["filter"], "blur");
    let r = s.http.get(s.url("/blobs/img/card-blur.png")).send().await.unwrap();
    assert_eq!(&r.bytes().await.unwrap()[..4], b"\x89PNG");

    // The filter on a 16-bit DICOM gives 16-bit pixels.
    let body = serde_json::json!({"key": "img/ct.dcm", "steps": [{"filter": "despeckle"}], "format": "raw"});
    let r = s.http.post(s.url("/api/filter")).json(&body).send().await.unwrap();
    assert_eq!(r.headers()["x-bits"], "16");
    // A window given in HU (a soft-tissue window on the CT phantom, whose decoded pixels are
    // HU + an offset) is applied in HU, as the command line's `filter window` does: both black
    // (air) and lighter pixels, not one flat white.
    let body = serde_json::json!({"key": "img/ct.dcm", "steps": [{"filter": "window", "params": {"center": "40", "width": "400"}}], "format": "raw"});
    let r = s.http.post(s.url("/api/filter")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let px: Vec<u16> =
        r.bytes().await.unwrap().chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    assert!(px.contains(&0), "air is below the window");
    assert!(px.iter().any(|&v| v > 0 && v < u16::MAX), "tissue inside it");
    assert_eq!(filter_output(&s, "window", &[]).await, "grey-levels");
    // A window after a blur still takes HU: the blur kept the file's values.
    let blurred_window = serde_json::json!({"key": "img/ct.dcm", "steps": [{"filter": "blur"}, {"filter": "window", "params": {"center": "40", "width": "400"}}], "format": "raw"});
    let r = s.http.post(s.url("/api/filter")).json(&blurred_window).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let bpx: Vec<u16> =
        r.bytes().await.unwrap().chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    assert!(bpx.contains(&0) && bpx.iter().any(|&v| v > 0 && v < u16::MAX), "HU after a blur");
    assert_eq!(filter_output(&s, "invert", &[]).await, "scale");
    assert_eq!(filter_output(&s, "despeckle", &[]).await, "values");
    assert_eq!(
        filter_output(&s, "convolve", &[("kernel", "-1,0,1"), ("offset", "128")]).await,
        "grey-levels"
    );
    // A window's grey levels in JPEG and GIF (8 bits) are those levels on their full scale,
    // not put through the file's window a second time (which leaves little but black and
    // white): the same within what the formats' compression and palettes change.
    for format in ["jpeg", "gif"] {
        let body = serde_json::json!({"key": "img/ct.dcm", "steps": [{"filter": "window", "params": {"center": "40", "width": "400"}}], "format": format});
        let r = s.http.post(s.url("/api/filter")).json(&body).send().await.unwrap();
        let got = bs_imageio::decode(&r.bytes().await.unwrap(), None, &Default::default());
        let bs_imaging::DynImage::U8(shown) = got.unwrap().image else { panic!("8-bit") };
        let want = |v: u16| f64::from(v) * 255.0 / 65535.0;
        let grey = shown.data.iter().step_by(shown.channels);
        let error: f64 = px.iter().zip(grey).map(|(v, g)| (want(*v) - f64::from(*g)).abs()).sum();
        let mean = error / px.len() as f64;
        assert!(mean < 2.0, "{format}: the window's grey levels as they are, off by {mean:.1}");
    }
    // … which JPEG and GIF, 8-bit formats, take windowed for display (as the CLI's filter).
    for (format, magic) in [("jpeg", &b"\xff\xd8"[..]), ("gif", &b"GIF8"[..])] {
        let body = serde_json::json!({"key": "img/ct.dcm", "steps": [{"filter": "despeckle"}], "format": format});
        let r = s.http.post(s.url("/api/filter")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{format}");
        let bytes = r.bytes().await.unwrap();
        assert!(bytes.starts_with(magic), "{format}");
        let shown = bs_imageio::decode(&bytes, None, &Default::default()).unwrap().image;
        assert!(matches!(shown, bs_imaging::DynImage::U8(_)), "{format}");
    }

    let bad = [
        (serde_json::json!({"key": "img/card.png", "steps": [{"filter": "nope"}]}), 422),
        (
            serde_json::json!({"key": "img/card.png", "steps": [{"filter": "blur", "params": {"size": -3}}]}),
            422,
        ),
        (
            serde_json::json!({"key": "img/card.png", "steps": [{"filter": "blur", "params": {"colour": 1}}]}),
            422,
        ),
        (
            serde_json::json!({"key": "img/card.png", "steps": [{"filter": "blur", "params": {"size": [1]}}]}),
            400,
        ),
        (serde_json::json!({"key": "img/card.png", "steps": []}), 400),
        (
            serde_json::json!({"key": "img/card.png", "steps": vec![serde_json::json!({"filter": "blur"}); 17]}),
            400,
        ),
        (
            serde_json::json!({"key": "img/card.png", "steps": [{"filter": "blur"}], "format": "bmp"}),
            400,
        ),
        (
            serde_json::json!({"key": "img/card.png", "steps": [{"filter": "blur"}], "format": "raw", "store_as": "x.png"}),
            400,
        ),
        (serde_json::json!({"key": "img/../x", "steps": [{"filter": "blur"}]}), 400),
        (serde_json::json!({"key": "img/bad.png", "steps": [{"filter": "blur"}]}), 422),
        (serde_json::json!({"key": "img/missing.png", "steps": [{"filter": "blur"}]}), 404),
        (
            serde_json::json!({"key": "img/card.png", "steps": [{"filter": "blur"}], "extra": 1}),
            400,
        ),
    ];
    for (body, code) in bad {
        let r = s.http.post(s.url("/api/filter")).json(&body).send().await.unwrap();
        let (st, _) = error_code(r).await;
        assert_eq!(st.as_u16(), code, "{body}");
    }
    // A parameter given twice is refused, not the last one taken.
    let twice = concat!(
        r#"{"key": "img/card.png", "steps": "#,
        r#"[{"filter": "blur", "params": {"size": 3, "size": 9}}]}"#
    );
    let r = s
        .http
        .post(s.url("/api/filter"))
        .header("content-type", "application/json")
        .body(twice)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    let told = v["error"]["message"].as_str().unwrap_or_default();
    assert!(told.contains("parameter \"size\" given twice"), "{v}");
    let r = s
        .http
        .post(s.url("/api/filter"))
        .header("content-type", "application/json")
        .body("{not json");
    assert_eq!(r.send().await.unwrap().status(), StatusCode::BAD_REQUEST);
    let r = s
        .http
        .post(s.url("/api/filter"))
        .header("content-type", "application/json")
        .body(vec![b' '; 100_000]);
    assert_eq!(r.send().await.unwrap().status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test(flavor = "multi_thread")]
async fn openapi_matches_the_routes_and_metrics_count_requests() {
    let s = Srv::start(false).await;
    let (st, doc) = s.get_json("/api/openapi.json").await;
    assert_eq!(st, StatusCode::OK);
    let paths = doc["paths"].as_object().unwrap();
    let mut documented: Vec<(String, Vec<String>)> = paths
        .iter()
        .map(|(p, ops)| {
            let mut m: Vec<String> = ops.as_object().unwrap().keys().cloned().collect();
            m.sort();
            (p.clone(), m)
        })
        .collect();
    documented.sort();
    let mut routed: Vec<(String, Vec<String>)> = bs_web::ROUTES
        .iter()
        .map(|(p, ms)| {
            let mut m: Vec<String> = ms.iter().map(|s| s.to_string()).collect();
            m.sort();
            (p.to_string(), m)
        })
        .collect();
    routed.sort();
    assert_eq!(documented, routed);
    // Every route table entry is really routed: no answer is the router's own 404 or 405.
    for (path, methods) in bs_web::ROUTES {
        let path = path
            .replace("{key}", "samples/none")
            .replace("{study}", "1.2")
            .replace("{series}", "1.2")
            .replace("{instance}", "1.2")
            .replace("{frames}", "1");
        for m in *methods {
            let method = reqwest::Method::from_bytes(m.to_uppercase().as_bytes()).unwrap();
            let r = s.http.request(method, s.url(&path)).send().await.unwrap();
            let st = r.status();
            assert_ne!(st, StatusCode::METHOD_NOT_ALLOWED, "{m} {path}");
            if st == StatusCode::NOT_FOUND && *m != "head" {
                let (_, code) = error_code(r).await;
                assert_eq!(code, "not_found");
            }
        }
    }
    s.put("m/x", b"abc".to_vec()).await;
    // Requests no route matches, and those the auth check refuses (a cross-site write, under
    // its route), are counted too; a JSON answer's bytes are.
    let r = s.http.get(s.url("/no/such/page")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = s.http.delete(s.url("/blobs/m/x")).header("origin", "http://evil.example");
    assert_eq!(r.send().await.unwrap().status(), StatusCode::FORBIDDEN);
    let listed = s.http.get(s.url("/api/list")).send().await.unwrap().bytes().await.unwrap();
    let r = s.http.get(s.url("/metrics")).send().await.unwrap();
    assert!(r.headers()["content-type"].to_str().unwrap().contains("openmetrics"));
    let text = r.text().await.unwrap();
    assert!(text.contains(r#"route="unmatched",method="GET",status="404"} 1"#), "{text}");
    assert!(text.contains(r#"route="/blobs/{*key}",method="DELETE",status="403"} 1"#), "{text}");
    // (The route was asked once before, above, with another answer.)
    let series = r#"blobstream_http_response_bytes_total{route="/api/list"} "#;
    let counted = text.lines().find_map(|l| l.strip_prefix(series)).map(|n| n.parse::<usize>());
    let counted = counted.expect("the list's bytes are counted").unwrap();
    assert!(counted > listed.len(), "{counted} bytes counted, {} in the last answer", listed.len());
    assert!(
        text.contains(
            r#"blobstream_http_requests_total{route="/blobs/{*key}",method="PUT",status="201"}"#
        ),
        "{text}"
    );
    assert!(text.contains(r#"route="/api/filter",method="POST",status="415"} 1"#), "{text}");
    assert!(text.contains("blobstream_http_upload_bytes_total 3"), "{text}");
    assert!(text.contains("blobstream_http_request_duration_seconds_bucket"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_and_its_assets_are_served() {
    let s = Srv::start(false).await;
    for (p, t) in [
        ("/", "text/html"),
        ("/app.js", "text/javascript"),
        ("/stack.js", "text/javascript"),
        ("/worklist.js", "text/javascript"),
        ("/util.js", "text/javascript"),
        ("/state.js", "text/javascript"),
        ("/status.js", "text/javascript"),
        ("/raster.js", "text/javascript"),
        ("/browse.js", "text/javascript"),
        ("/search.js", "text/javascript"),
        ("/series.js", "text/javascript"),
        ("/upload.js", "text/javascript"),
        ("/viewer.js", "text/javascript"),
        ("/image.js", "text/javascript"),
        ("/filters.js", "text/javascript"),
        ("/app.css", "text/css"),
    ] {
        let r = s.http.get(s.url(p)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.headers()["content-type"].to_str().unwrap().starts_with(t));
        assert!(r.headers().contains_key("content-security-policy"));
        assert!(!r.text().await.unwrap().is_empty());
    }
    let r = s.http.get(s.url("/")).send().await.unwrap();
    assert!(r.text().await.unwrap().contains("/app.js"));
}

#[tokio::test(flavor = "multi_thread")]
async fn samples_seed_an_empty_store_once() {
    let s = Srv::start(true).await;
    let st = s.web.state().clone();
    let n = tokio::task::spawn_blocking(move || bs_web::seed_samples(&st).unwrap()).await.unwrap();
    assert_eq!(n, 3 + usize::from(bs_web::samples::SERIES_SLICES));
    let st = s.web.state().clone();
    let n = tokio::task::spawn_blocking(move || bs_web::seed_samples(&st).unwrap()).await.unwrap();
    assert_eq!(n, 0);
    let (_, v) = s.get_json("/api/search?modality=CT").await;
    assert_eq!(v["results"][0]["key"], "samples/ct-phantom.dcm");
}

/// The `name=value` pairs a response sets, by cookie name.
fn set_cookies(r: &reqwest::Response) -> Vec<(String, String)> {
    r.headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap())
        .map(|c| {
            let pair = c.split(';').next().unwrap();
            let (k, v) = pair.split_once('=').unwrap();
            assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict"), "{c}");
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_guards_the_api_and_the_session_cookie_is_a_revocable_session_id() {
    let cfg = WebConfig { auth_token: Some("s3cret".into()), ..WebConfig::ephemeral() };
    let s = Srv::start_with(false, cfg).await;
    let r = s.http.get(s.url("/api/list")).send().await.unwrap();
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    assert_eq!(error_code(r).await, (StatusCode::UNAUTHORIZED, "unauthorized".into()));
    let r = s.http.put(s.url("/blobs/x")).body("x").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = s.http.get(s.url("/api/list")).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = s.http.get(s.url("/api/list")).bearer_auth("s3cret").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // The scheme's name in any case (RFC 9110 §11.1).
    for scheme in ["bearer", "BEARER"] {
        let r = s.http.get(s.url("/api/list")).header("authorization", format!("{scheme} s3cret"));
        assert_eq!(r.send().await.unwrap().status(), StatusCode::OK, "{scheme}");
    }
    // The page loads without a token so the login form can show.
    assert_eq!(s.http.get(s.url("/")).send().await.unwrap().status(), StatusCode::OK);
    let (_, v) = s.get_json("/api/session").await;
    assert_eq!(
        (v["auth_required"].as_bool(), v["authenticated"].as_bool()),
        (Some(true), Some(false))
    );
    let r = s.http.post(s.url("/api/session")).json(&serde_json::json!({"token": "nope"})).send();
    assert_eq!(r.await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let login = async || {
        let r = s.http.post(s.url("/api/session")).json(&serde_json::json!({"token": "s3cret"}));
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        let cookies = set_cookies(&r);
        // The cookie of earlier versions, which held the token itself, is cleared.
        assert!(cookies.contains(&("blobstream_token".into(), String::new())), "{cookies:?}");
        let (_, id) = cookies.into_iter().find(|(k, _)| k == "blobstream_session").unwrap();
        id
    };
    let id = login().await;
    // The cookie is a random session id, not the token.
    assert!(!id.contains("s3cret") && id.len() >= 32, "{id}");
    assert_ne!(id, login().await, "every login is a new session");
    let with = |path: &str, cookie: &str| {
        s.http.get(s.url(path)).header("cookie", format!("a=1; {cookie}")).send()
    };
    let session = format!("blobstream_session={id}");
    assert_eq!(with("/api/list", &session).await.unwrap().status(), StatusCode::OK);
    let v: Value = with("/api/session", &session).await.unwrap().json().await.unwrap();
    assert_eq!(v["authenticated"], true);
    // The token itself is no cookie, nor is a made-up session id.
    for bad in ["blobstream_session=s3cret", "blobstream_token=s3cret", "blobstream_session=00ff"] {
        assert_eq!(with("/api/list", bad).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    }
    // Logout ends the session on the server: the cookie is cleared, and a copy of it kept
    // elsewhere (a leaked one) no longer works.
    let r = s.http.delete(s.url("/api/session")).header("cookie", &session).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert!(set_cookies(&r).contains(&("blobstream_session".into(), String::new())));
    assert_eq!(with("/api/list", &session).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let v: Value = with("/api/session", &session).await.unwrap().json().await.unwrap();
    assert_eq!(v["authenticated"], false);
    // Logging out again, or without a session, is harmless.
    let r = s.http.delete(s.url("/api/session")).header("cookie", &session).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // Other sessions live on; logging in again from a session ends that one.
    let other = format!("blobstream_session={}", login().await);
    assert_eq!(with("/api/list", &other).await.unwrap().status(), StatusCode::OK);
    let r = s.http.post(s.url("/api/session")).header("cookie", &other);
    let r = r.json(&serde_json::json!({"token": "s3cret"})).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(with("/api/list", &other).await.unwrap().status(), StatusCode::UNAUTHORIZED);
}

/// A client whose requests come from `ip` (any 127.x.y.z reaches a server on 127.0.0.1).
fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(ip.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_tokens_are_throttled_per_source_address() {
    // The allowance does not come back during the test (an hour per failure), so exactly
    // `burst` wrong tokens are answered 401 however the requests interleave.
    let cfg = WebConfig {
        auth_token: Some("s3cret".into()),
        auth_failure_burst: 5,
        auth_failure_refill: std::time::Duration::from_secs(3600),
        ..WebConfig::ephemeral()
    };
    let s = Srv::start_with(false, cfg).await;
    // A browser logged in before the attack.
    let r = s.http.post(s.url("/api/session")).json(&serde_json::json!({"token": "s3cret"}));
    let r = r.send().await.unwrap();
    let (_, id) = set_cookies(&r).into_iter().find(|(k, _)| k == "blobstream_session").unwrap();
    let session = format!("blobstream_session={id}");

    // 40 wrong tokens at once, from one address, at every door that checks one.
    let attempts = (0..40).map(|i| {
        let (http, url) = (s.http.clone(), s.base.clone());
        tokio::spawn(async move {
            let r = match i % 5 {
                0 => http.get(format!("{url}/blobs/x")),
                1 => http.put(format!("{url}/blobs/x")).body("x"),
                2 => http.get(format!("{url}/api/list")),
                3 => http.get(format!("{url}/api/session")),
                _ => {
                    let body = serde_json::json!({"token": format!("guess-{i}")});
                    return http.post(format!("{url}/api/session")).json(&body).send().await;
                }
            };
            r.bearer_auth(format!("guess-{i}")).send().await
        })
    });
    let mut answers = std::collections::BTreeMap::<u16, usize>::new();
    for a in attempts.collect::<Vec<_>>() {
        let r = a.await.unwrap().unwrap();
        let st = r.status();
        *answers.entry(st.as_u16()).or_default() += 1;
        if st == StatusCode::TOO_MANY_REQUESTS {
            let wait: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
            assert!((1..=3600).contains(&wait), "{wait}");
            assert_eq!(error_code(r).await.1, "too_many_requests");
        }
    }
    // GET /api/session answers 200 {"authenticated": false} for a wrong token (and counts it).
    let refused = answers.get(&401).copied().unwrap_or(0) + answers.get(&200).unwrap_or(&0);
    assert_eq!((refused, answers.get(&429).copied()), (5, Some(35)), "{answers:?}");

    // Now even the right token is refused from that address — otherwise a guesser would still
    // learn which guess was right — at every door, login included.
    let r = s.http.get(s.url("/api/list")).bearer_auth("s3cret").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let r = s.http.post(s.url("/api/session")).json(&serde_json::json!({"token": "s3cret"}));
    assert_eq!(r.send().await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    // A request with no credential is just unauthenticated.
    let r = s.http.get(s.url("/api/list")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // The session made before keeps working: a session id is no token check.
    let r = s.http.get(s.url("/api/list")).header("cookie", &session).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // Open endpoints stay open.
    assert_eq!(s.http.get(s.url("/api/health")).send().await.unwrap().status(), StatusCode::OK);
    // Another address is not affected.
    let other = client_from("127.0.0.2");
    let r = other.get(s.url("/api/list")).bearer_auth("s3cret").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = other.get(s.url("/api/list")).bearer_auth("guess").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // The OpenAPI document lists 429 with Retry-After wherever a token is checked.
    let (_, doc) = s.get_json("/api/openapi.json").await;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (m, op) in ops.as_object().unwrap() {
            let rs = &op["responses"];
            if rs.get("401").is_some() {
                assert!(rs["429"]["headers"].get("Retry-After").is_some(), "{m} {path}");
            }
        }
    }
    assert!(doc["paths"]["/api/session"]["get"]["responses"].get("429").is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn https_when_a_certificate_is_given() {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let tls = bs_transport::TlsServer::from_pem(
        c.cert.pem().as_bytes(),
        c.signing_key.serialize_pem().as_bytes(),
    )
    .unwrap();
    let s = Srv::start_with(false, WebConfig { tls: Some(tls), ..WebConfig::ephemeral() }).await;
    assert!(s.base.starts_with("https://"));
    let ca = reqwest::Certificate::from_pem(c.cert.pem().as_bytes()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .resolve("localhost", s.web.addr())
        .build()
        .unwrap();
    let url = format!("https://localhost:{}/api/health", s.web.addr().port());
    let r = client.get(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // Plain HTTP on the HTTPS port gets no answer.
    let plain = s.raw(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    assert!(!plain.contains("200 OK"), "{plain}");
}

#[tokio::test(flavor = "multi_thread")]
async fn cross_site_writes_and_rebound_host_names_are_refused() {
    let s = Srv::start(false).await;
    // A page on another site posting a form, or a fetch it makes, may not write.
    let r = s.http.put(s.url("/blobs/x")).header("origin", "http://evil.example").body("x");
    let (st, code) = error_code(r.send().await.unwrap()).await;
    assert_eq!((st, code.as_str()), (StatusCode::FORBIDDEN, "forbidden"));
    let r = s.http.delete(s.url("/blobs/x")).header("sec-fetch-site", "cross-site");
    assert_eq!(r.send().await.unwrap().status(), StatusCode::FORBIDDEN);
    // The page's own requests may.
    let origin = s.base.clone();
    let r = s.http.put(s.url("/blobs/x")).header("origin", origin).body("x");
    assert_eq!(r.send().await.unwrap().status(), StatusCode::CREATED);
    // Without a token, a DNS name (possibly rebound to 127.0.0.1) is refused, even for reads.
    let resp =
        s.raw(b"GET /blobs/x HTTP/1.1\r\nHost: evil.example:8080\r\nConnection: close\r\n\r\n");
    assert!(resp.starts_with("HTTP/1.1 403") && resp.contains("DNS rebinding"), "{resp}");
    let resp = s.raw(b"GET /blobs/x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    // With a token, names are fine (the token is what protects).
    let cfg = WebConfig { auth_token: Some("t".into()), ..WebConfig::ephemeral() };
    let a = Srv::start_with(false, cfg).await;
    let resp = a.raw(
        b"GET /api/list HTTP/1.1\r\nHost: store.example\r\nAuthorization: Bearer t\r\nConnection: close\r\n\r\n",
    );
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
}

#[tokio::test(flavor = "multi_thread")]
async fn stalled_uploads_are_dropped_and_upload_slots_are_limited() {
    /// A client that sends part of its body and then nothing, keeping the connection open.
    fn stall(s: &Srv, key: &str) -> TcpStream {
        let mut c = TcpStream::connect(s.web.addr()).unwrap();
        let head = format!(
            "PUT /blobs/{key} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\nabc"
        );
        c.write_all(head.as_bytes()).unwrap();
        c
    }
    // Slots: the idle timeout is far beyond the test, so only the limit is at work.
    let cfg = WebConfig { max_uploads: 1, ..WebConfig::ephemeral() };
    let s = Srv::start_with(true, cfg).await;
    let holder = stall(&s, "held");
    // The slot is taken once the server has read the request head: until then the other
    // upload still gets in (and is removed again). Polled until a deadline rather than a
    // number of tries: on a loaded machine the held connection's head was seen to wait longer
    // than 1,000 quick uploads (one run in eight).
    let mut refused = None;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let r = s.put("other", b"y".to_vec()).await;
        if r.status() != StatusCode::CREATED {
            refused = Some(r);
            break;
        }
        s.http.delete(s.url("/blobs/other")).send().await.unwrap();
    }
    let r = refused.expect("a second upload never met the limit of one");
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(error_code(r).await, (StatusCode::SERVICE_UNAVAILABLE, "busy".into()));
    // The holder goes away: its slot comes back (poll, bounded).
    drop(holder);
    let last = s.put_while("other", b"y".to_vec(), StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(last, StatusCode::CREATED);

    // Idle timeout: a stalled upload is answered 400 and leaves nothing.
    let cfg =
        WebConfig { idle_timeout: std::time::Duration::from_millis(300), ..WebConfig::ephemeral() };
    let s = Srv::start_with(true, cfg).await;
    let mut c = stall(&s, "slow");
    c.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let mut resp = String::new();
    let _ = c.read_to_string(&mut resp);
    assert!(resp.starts_with("HTTP/1.1 400") && resp.contains("stalled"), "{resp}");
    let r = s.http.get(s.url("/blobs/slow")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(s.put("slow", b"y".to_vec()).await.status(), StatusCode::CREATED);
    // So is a multipart POST silent before its first boundary, and a STOW-RS silent inside
    // its first part: neither holds its upload slot past the idle time.
    for (head, what) in [
        (
            "POST /blobs?prefix=x/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\
             Content-Type: multipart/form-data; boundary=BB\r\n\r\npreamble, then nothing",
            "POST before its first boundary",
        ),
        (
            "POST /dicomweb/studies HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\
             Content-Type: multipart/related; type=\"application/dicom\"; boundary=BB\r\n\r\n\
             --BB\r\nContent-Type: application/dicom\r\n\r\nDICM, then nothing",
            "STOW-RS inside its first part",
        ),
    ] {
        let mut c = TcpStream::connect(s.web.addr()).unwrap();
        c.write_all(head.as_bytes()).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
        let mut resp = String::new();
        let _ = c.read_to_string(&mut resp);
        assert!(resp.starts_with("HTTP/1.1 400") && resp.contains("stalled"), "{what}: {resp}");
    }
    let (_, v) = s.get_json("/api/list?prefix=x/").await;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(0), "{v}");
}

/// A version deleted while a write to replace it (If-Match: its ETag, or `*`) streams in:
/// the write is refused at its commit (412) and the delete stands.
#[tokio::test(flavor = "multi_thread")]
async fn a_conditional_write_does_not_undo_a_delete_made_while_it_ran() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(FsStore::open(dir.path()).unwrap());
    let index = ImageIndex::open_in_memory().unwrap();
    let s = Srv::start_on(store.clone(), index, WebConfig::ephemeral(), None).await;
    let pf = (StatusCode::PRECONDITION_FAILED, "precondition_failed".to_string());
    let begun = |name: &str| {
        let algo = store.digest_algo();
        matches!(store.upload_piece_digests(name, 0, 0, 1 << 20, algo), Ok(Some(_)))
    };
    for cond in ["etag", "*"] {
        assert_eq!(s.put("raced", b"v1".to_vec()).await.status(), StatusCode::CREATED);
        let head = s.http.head(s.url("/blobs/raced")).send().await.unwrap();
        let m =
            if cond == "*" { "*".into() } else { head.headers()["etag"].to_str().unwrap().into() };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
        tx.send(Ok(b"new ".to_vec())).await.unwrap();
        let body = reqwest::Body::wrap_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let put: String = m;
        let put = tokio::spawn(
            s.http.put(s.url("/blobs/raced")).header("If-Match", put).body(body).send(),
        );
        // Deleted once the write has passed its first check and begun its upload.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !begun("raced") {
            assert!(std::time::Instant::now() < deadline, "the write never began");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let r = s.http.delete(s.url("/blobs/raced")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        tx.send(Ok(b"bytes".to_vec())).await.unwrap();
        drop(tx);
        let r = put.await.unwrap().unwrap();
        assert_eq!(error_code(r).await, pf, "If-Match {cond}");
        let r = s.http.get(s.url("/blobs/raced")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "the delete stands (If-Match {cond})");
    }
}

/// A client that shuts down its sending side once its request is out still gets the answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_whose_client_half_closes_is_answered() {
    let s = Srv::start(true).await;
    let mut c = TcpStream::connect(s.web.addr()).unwrap();
    let req =
        "PUT /blobs/half/closed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nhello";
    c.write_all(req.as_bytes()).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let mut resp = String::new();
    let _ = c.read_to_string(&mut resp);
    assert!(resp.starts_with("HTTP/1.1 201"), "{resp:?}");
    let r = s.http.get(s.url("/blobs/half/closed")).send().await.unwrap();
    assert_eq!(r.bytes().await.unwrap(), "hello");
}

/// `bytes` with every occurrence of `from` replaced by `to` (of the same length).
fn replace_all(mut bytes: Vec<u8>, from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut i = 0;
    while let Some(at) = bytes[i..].windows(from.len()).position(|w| w == from.as_bytes()) {
        bytes[i + at..i + at + to.len()].copy_from_slice(to.as_bytes());
        i += at + to.len();
    }
    bytes
}

#[tokio::test(flavor = "multi_thread")]
async fn user_metadata_of_an_upload_is_shown_and_searchable() {
    let s = Srv::start(true).await;
    // A study of its own: the sample's UIDs with other digits.
    let other = "302227208390563154781239004869999";
    let dcm =
        replace_all(bs_web::samples::ct_phantom_dicom(64), bs_web::samples::UID_DIGITS, other);
    let put = |referral: &'static str, body: Vec<u8>| {
        s.http
            .put(s.url("/blobs/ward/ct.dcm"))
            .header("X-Blobstream-Meta-Referral", referral)
            .header("x-blobstream-meta-priority", "urgent")
            .body(body)
            .send()
    };
    assert_eq!(put("Ward 7 follow-up", dcm.clone()).await.unwrap().status(), StatusCode::CREATED);
    let (code, v) = s.get_json("/api/studies?q=ward%207").await;
    assert_eq!((code, v["total"].as_u64()), (StatusCode::OK, Some(1)), "{v}");
    let study = &v["studies"][0];
    assert!(study["study_uid"].as_str().unwrap().contains(other), "{study}");
    assert_eq!(study["user_metadata"]["referral"], "Ward 7 follow-up");
    assert_eq!(study["user_metadata"]["priority"], "urgent");
    // The image search and the image's metadata have it too.
    let (_, v) = s.get_json("/api/search?q=follow-up").await;
    assert_eq!(v["results"].as_array().unwrap().len(), 1, "{v}");
    let (_, v) = s.get_json("/api/studies?q=ward%208").await;
    assert_eq!(v["total"], 0);
    // The same bytes stored again with other metadata: the index follows.
    assert_eq!(put("Ward 9", dcm.clone()).await.unwrap().status(), StatusCode::CREATED);
    let (_, v) = s.get_json("/api/studies?q=ward%209").await;
    assert_eq!(v["total"], 1, "{v}");
    assert_eq!(v["studies"][0]["user_metadata"]["referral"], "Ward 9");
    let (_, v) = s.get_json("/api/studies?q=ward%207").await;
    assert_eq!(v["total"], 0, "{v}");
    // Another instance of the study uploaded with other metadata: the study shows what was
    // given with every instance, not only with its first.
    let r = s
        .http
        .put(s.url("/blobs/ward/ct-2.dcm"))
        .header("X-Blobstream-Meta-Referral", "Ward 3")
        .header("x-blobstream-meta-reader", "Dr B")
        .body(dcm.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let (_, v) = s.get_json("/api/studies?q=ward%203").await;
    assert_eq!(v["total"], 1, "{v}");
    let um = &v["studies"][0]["user_metadata"];
    assert_eq!(um["referral"], "Ward 3, Ward 9", "{v}");
    assert_eq!((&um["priority"], &um["reader"]), (&"urgent".into(), &"Dr B".into()), "{v}");
    // Any blob's metadata, image or not, reads back in its BlobInfo.
    let r = s.http.put(s.url("/blobs/ward/notes.txt")).header("x-blobstream-meta-reader", "Dr B");
    let v: Value = r.body("text").send().await.unwrap().json().await.unwrap();
    assert_eq!(v["metadata"]["reader"], "Dr B", "{v}");
    let (_, v) = s.get_json("/api/list?prefix=ward/").await;
    let notes = v["items"].as_array().unwrap().iter().find(|i| i["key"] == "ward/notes.txt");
    assert_eq!(notes.unwrap()["metadata"]["reader"], "Dr B", "{v}");
    // Metadata that is not text is refused, and nothing is stored.
    let bad = reqwest::header::HeaderValue::from_bytes(&[b'a', 0xff]).unwrap();
    let r = s
        .http
        .put(s.url("/blobs/ward/bad.dcm"))
        .header("x-blobstream-meta-note", bad)
        .body(dcm)
        .send()
        .await
        .unwrap();
    assert_eq!(error_code(r).await.0, StatusCode::BAD_REQUEST);
    let r = s.http.get(s.url("/blobs/ward/bad.dcm")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

/// A worklist over more studies than the index is read in at a time: the page is chosen among
/// all of them (the newest study is the last by UID), and the total counts all of them.
#[tokio::test(flavor = "multi_thread")]
async fn a_worklist_of_thousands_of_studies_pages_over_all_of_them() {
    let s = Srv::start(false).await;
    const N: usize = 2_500;
    let st = s.web.state().clone();
    tokio::task::spawn_blocking(move || {
        let index = st.images.index();
        for i in 0..N {
            // Dates rise with the UID's number, which sorts as text: 1.2.999 after 1.2.2499.
            let (uid, date) = (format!("1.2.{i}"), format!("{}", 20_000_000 + i));
            let fields: std::collections::BTreeMap<String, String> = [
                ("study_instance_uid", uid.as_str()),
                ("series_instance_uid", &format!("{uid}.1")),
                ("study_date", &date),
                ("patient_name", &format!("P^{i}")),
                ("modality", "CT"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let meta = serde_json::to_string(&fields).unwrap();
            index.put(&format!("w/{i}.dcm"), &format!("x:{i}"), &fields, &meta).unwrap();
        }
    })
    .await
    .unwrap();
    // One field of every study on a page.
    let column = |v: &serde_json::Value, key: &str| -> Vec<String> {
        let studies = v["studies"].as_array().unwrap();
        studies.iter().map(|x| x[key].as_str().unwrap().to_string()).collect()
    };
    let (code, v) = s.get_json("/api/studies?limit=3").await;
    assert_eq!((code, v["total"].as_u64()), (StatusCode::OK, Some(N as u64)), "{v}");
    let dates = column(&v, "study_date");
    assert_eq!(dates, ["20002499", "20002498", "20002497"], "newest first, among all");
    let (_, v) = s.get_json("/api/studies?sort=patient&order=asc&offset=2498&limit=10").await;
    assert_eq!(column(&v, "patient_name"), ["P^998", "P^999"], "the last page holds what is left");
}

#[tokio::test(flavor = "multi_thread")]
async fn worklist_studies_series_instances_and_frames() {
    let s = Srv::start(true).await;
    let st = s.web.state().clone();
    tokio::task::spawn_blocking(move || bs_web::seed_samples(&st).unwrap()).await.unwrap();
    let (code, v) = s.get_json("/api/studies").await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["total"], 1);
    let study = &v["studies"][0];
    assert_eq!(study["patient_name"], "PHANTOM^CT");
    assert_eq!(study["accession_number"], "ACC-0001");
    assert_eq!((study["series"].as_u64(), study["images"].as_u64()), (Some(2), Some(17)));
    let uid = study["study_uid"].as_str().unwrap().to_string();
    for bad in ["sort=size", "order=up", "limit=0", "limit=5000", "date_from=2024", "offset=-1"] {
        let (code, v) = s.get_json(&format!("/api/studies?{bad}")).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    let (_, v) = s.get_json("/api/studies?modality=MR").await;
    assert_eq!(v["total"], 0);
    // Numbers in the query string next to the criteria (a flattened struct) still parse.
    let (code, v) = s.get_json("/api/studies?limit=10&offset=0&sort=images&patient=phantom").await;
    assert_eq!((code, v["total"].as_u64()), (StatusCode::OK, Some(1)), "{v}");
    let (code, v) = s.get_json("/api/search?limit=3&modality=CT").await;
    assert_eq!(code, StatusCode::OK, "{v}");
    assert_eq!(v["results"].as_array().unwrap().len(), 3);
    let (_, v) = s.get_json("/api/studies?offset=1").await;
    assert_eq!((v["total"].as_u64(), v["studies"].as_array().unwrap().len()), (Some(1), 0));

    let (code, v) = s.get_json(&format!("/api/studies/{uid}/series")).await;
    assert_eq!(code, StatusCode::OK);
    let series = v["series"].as_array().unwrap();
    let big = series.iter().find(|x| x["images"] == 16).expect("the 16-slice series");
    assert_eq!(big["body_part_examined"], "HEAD");
    let (code, v) =
        s.get_json(&format!("/api/series/{}/instances", big["series_uid"].as_str().unwrap())).await;
    assert_eq!(code, StatusCode::OK);
    let keys: Vec<&str> =
        v["instances"].as_array().unwrap().iter().map(|i| i["key"].as_str().unwrap()).collect();
    assert_eq!(keys.len(), 16);
    assert_eq!(keys[0], "samples/ct-series/slice-01.dcm");
    assert_eq!(keys[15], "samples/ct-series/slice-16.dcm");
    // A slice deleted since it was indexed is not offered.
    s.http.delete(s.url("/blobs/samples/ct-series/slice-02.dcm")).send().await.unwrap();
    let (_, v) =
        s.get_json(&format!("/api/series/{}/instances", big["series_uid"].as_str().unwrap())).await;
    assert_eq!(v["instances"].as_array().unwrap().len(), 15);
    for missing in ["/api/studies/1.2.3/series", "/api/series/1.2.3/instances"] {
        let (code, _) = s.get_json(missing).await;
        assert_eq!(code, StatusCode::NOT_FOUND, "{missing}");
    }
    // Frames: frame 0 is the image; a single-frame image has no frame 1.
    let r = s.http.get(s.url("/api/pixels/samples/ct-phantom.dcm?frame=0")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["x-frames"], "1");
    let r = s.http.get(s.url("/api/pixels/samples/ct-phantom.dcm?frame=1")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // Filters take a frame too (the series viewer filters the frame it shows).
    let filter = |frame: u32| {
        let body = serde_json::json!({
            "key": "samples/ct-phantom.dcm", "frame": frame, "format": "raw",
            "steps": [{ "filter": "invert" }],
        });
        s.http.post(s.url("/api/filter")).json(&body).send()
    };
    let r = filter(0).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let (code, e) = error_code(filter(1).await.unwrap()).await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{e}");
}

/// Writes do what the request says or nothing: a form whose files would land on one name, or
/// whose last `key` names no file, is refused; a PUT or DELETE with a query parameter it does
/// not take is refused before it writes; a search with a NUL or a day that does not exist is
/// refused rather than matching everything.
#[tokio::test(flavor = "multi_thread")]
async fn ambiguous_writes_and_searches_are_refused_not_guessed() {
    let s = Srv::start(true).await;
    let message = |v: Value| v["error"]["message"].as_str().unwrap_or_default().to_string();
    let part = |body: &'static [u8], name: &'static str| {
        reqwest::multipart::Part::bytes(body.to_vec()).file_name(name)
    };
    // Two folders' x.dcm both flattened to mp/x.dcm: the second is refused, naming the first.
    let form = reqwest::multipart::Form::new()
        .part("file", part(b"one", "a/x.dcm"))
        .part("file", part(b"two", "b/x.dcm"));
    let r = s.http.post(s.url("/blobs?prefix=mp/")).multipart(form).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let msg = message(r.json().await.unwrap());
    assert!(
        msg.contains("both be stored as \"mp/x.dcm\"") && msg.contains("stored before"),
        "{msg}"
    );
    let r = s.http.get(s.url("/blobs/mp/x.dcm")).send().await.unwrap();
    assert_eq!(r.bytes().await.unwrap(), &b"one"[..], "the first stays as it was");
    // A key after the last file, and two keys in a row.
    let form = reqwest::multipart::Form::new()
        .part("file", part(b"late", "late.bin"))
        .text("key", "mp/late.bin");
    let r = s.http.post(s.url("/blobs")).multipart(form).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let msg = message(r.json().await.unwrap());
    assert!(msg.contains("no file part follows"), "{msg}");
    // Parts are stored as they arrive: the file before the stray key is, and is named.
    assert!(msg.contains("stored before this failure: late.bin"), "{msg}");
    let r = s.http.get(s.url("/blobs/late.bin")).send().await.unwrap();
    assert_eq!(r.bytes().await.unwrap(), &b"late"[..]);
    let form = reqwest::multipart::Form::new()
        .text("key", "mp/one")
        .text("key", "mp/two")
        .part("file", part(b"x", "x.bin"));
    let r = s.http.post(s.url("/blobs")).multipart(form).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    for gone in ["/blobs/mp/one", "/blobs/mp/two", "/blobs/mp/late.bin", "/blobs/x.bin"] {
        let r = s.http.get(s.url(gone)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{gone}");
    }
    // A client waiting for `100 Continue` before it sends the body is refused at once, never
    // told to send a body that would be thrown away.
    for (path, status) in [("/blobs/a%2Fb", "400"), ("/blobs/q/x?overwrite=0", "400")] {
        let req = format!(
            "PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50000000\r\n\
             Expect: 100-continue\r\nConnection: close\r\n\r\n"
        );
        let resp = tokio::task::block_in_place(|| s.raw(req.as_bytes()));
        assert!(resp.starts_with(&format!("HTTP/1.1 {status}")), "{path}: {resp}");
    }
    // PUT and DELETE take no query parameters.
    s.put("q/kept.txt", b"kept".to_vec()).await;
    let r = s.http.put(s.url("/blobs/q/kept.txt?overwrite=false")).body("new").send().await;
    let r = r.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(message(r.json().await.unwrap()).contains("unknown query parameter \"overwrite\""));
    let r = s.http.delete(s.url("/blobs/q/kept.txt?dry_run=1")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = s.http.get(s.url("/blobs/q/kept.txt")).send().await.unwrap();
    assert_eq!(r.bytes().await.unwrap(), &b"kept"[..], "neither write happened");
    // One metadata key given twice would lose a value: refused, nothing stored.
    let r = s.http.put(s.url("/blobs/q/twice.txt")).header("x-blobstream-meta-k", "1");
    let r = r.header("x-blobstream-meta-k", "2").body("x").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(message(r.json().await.unwrap()).contains("\"k\" is given twice"));
    let r = s.http.get(s.url("/blobs/q/twice.txt")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // Reads of the API take no parameters they would ignore either.
    for q in ["/api/meta/q/kept.txt?x=1", "/api/filters?x=1"] {
        let r = s.http.get(s.url(q)).send().await.unwrap();
        assert_eq!(error_code(r).await, (StatusCode::BAD_REQUEST, "bad_request".into()), "{q}");
    }
    // Searches.
    for q in [
        "/api/search?q=%00",
        "/api/studies?patient=%00",
        "/api/search?date_from=20251301",
        "/api/list?prefix=%ff/",
    ] {
        let r = s.http.get(s.url(q)).send().await.unwrap();
        assert_eq!(error_code(r).await, (StatusCode::BAD_REQUEST, "bad_request".into()), "{q}");
    }
}

/// `/api/search` pages as `/api/list` does: `next_after` names where the next page starts,
/// and is null on the last.
#[tokio::test(flavor = "multi_thread")]
async fn image_search_pages_with_next_after() {
    let s = Srv::start(true).await;
    for (i, key) in ["pg/a.png", "pg/b.png", "pg/c.png"].iter().enumerate() {
        s.put(key, png(8 + i as u32, 6)).await;
    }
    let s = &s;
    let page = |q: &str| {
        let url = format!("/api/search?prefix=pg/&limit=2{q}");
        async move {
            let (code, v) = s.get_json(&url).await;
            assert_eq!(code, StatusCode::OK, "{v}");
            let names: Vec<String> = v["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["key"].as_str().unwrap().to_string())
                .collect();
            (names, v["next_after"].as_str().map(String::from))
        }
    };
    let (first, next) = page("").await;
    assert_eq!(first, ["pg/a.png", "pg/b.png"]);
    assert_eq!(next.as_deref(), Some("pg/b.png"));
    let (second, next) = page("&after=pg/b.png").await;
    assert_eq!((second, next), (vec!["pg/c.png".to_string()], None));
}

/// The `X-Filter-Output` of `filter` with `params` on the CT phantom.
async fn filter_output(s: &Srv, filter: &str, params: &[(&str, &str)]) -> String {
    let params: serde_json::Map<String, Value> =
        params.iter().map(|(k, v)| (k.to_string(), Value::from(*v))).collect();
    let body = serde_json::json!({"key": "img/ct.dcm", "steps": [{"filter": filter, "params": params}], "format": "raw"});
    let r = s.http.post(s.url("/api/filter")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{filter}");
    r.headers()["x-filter-output"].to_str().unwrap().to_string()
}
