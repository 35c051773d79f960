//! Many front ends on shared storage: three `blobstream serve` processes on one bucket of a
//! three-node Garage cluster (every object on all three nodes) and one PostgreSQL catalogue.
//! Clients put blobs through all of them; mid-workload one front end is killed (SIGKILL) and
//! one Garage node stopped — a host lost. Every blob a front end acknowledged must then read
//! back whole through each survivor, listings agree, and what one front end indexed is found
//! by a search through another.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_blobstream");

/// A front end: a `serve` process on one Garage node's S3 API and the shared catalogue.
struct FrontEnd {
    child: Child,
    /// `host:port` of its HTTP API.
    http: String,
    _data: tempfile::TempDir,
}

impl FrontEnd {
    fn start(s3: &bs_peers::S3Endpoint, catalogue: &str, samples: bool) -> Self {
        let data = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--addr", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data"])
            .arg(data.path())
            .args(["--s3-bucket", &s3.bucket, "--s3-endpoint", &s3.url, "--s3-region"])
            .arg(&s3.region)
            .args(["--s3-access-key-id", &s3.key_id, "--catalogue", catalogue])
            .env("BLOBSTREAM_S3_SECRET_ACCESS_KEY", &s3.secret)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if !samples {
            cmd.arg("--no-samples");
        }
        let mut child = cmd.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let http = loop {
            let line = lines.next().expect("serve exited before printing its addresses").unwrap();
            if let Some(u) = line.split("web (HTTP):").nth(1) {
                break u.trim().trim_start_matches("http://").trim_end_matches('/').to_string();
            }
        };
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, http, _data: data }
    }
}

impl Drop for FrontEnd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request; (status, body). Errors are connection failures.
fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no end of headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    let mut body = raw[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap_or(rest.len());
            let n = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap_or("0"), 16)
                .unwrap_or(0);
            if n == 0 {
                break;
            }
            out.extend_from_slice(&rest[eol + 2..eol + 2 + n]);
            rest = &rest[eol + 4 + n..];
        }
        body = out;
    }
    Ok((status, body))
}

fn content(k: usize) -> Vec<u8> {
    // Mostly study-sized blobs, now and then one large enough to go up in parts.
    let n = if k % 17 == 5 { 9 << 20 } else { 1000 + (k * 7919) % 300_000 };
    (0..n).map(|i| (i.wrapping_mul(31) ^ k) as u8).collect()
}

#[test]
fn three_front_ends_lose_no_acknowledged_blob_when_a_host_dies() {
    let garage = bs_peers::Garage::cluster(3, 3, "shared").expect("Garage cluster starts");
    let pg = bs_peers::Postgres::start().expect("PostgreSQL starts");
    let catalogue = pg.fresh_db().unwrap();
    // The first seeds the samples into the empty store; the others find it seeded.
    let first = FrontEnd::start(&garage.endpoint_of(0), &catalogue, true);
    let fronts: Vec<Arc<Mutex<Option<FrontEnd>>>> = std::iter::once(first)
        .chain((1..3).map(|i| FrontEnd::start(&garage.endpoint_of(i), &catalogue, true)))
        .map(|f| Arc::new(Mutex::new(Some(f))))
        .collect();
    let garage = Mutex::new(garage);
    let addrs: Vec<String> =
        fronts.iter().map(|f| f.lock().unwrap().as_ref().unwrap().http.clone()).collect();

    let acked = Arc::new(Mutex::new(Vec::<(usize, usize)>::new())); // (blob, front end)
    let refused = Arc::new(AtomicUsize::new(0));
    let next = Arc::new(AtomicUsize::new(0));
    let killed = Arc::new(AtomicBool::new(false));
    const BLOBS: usize = 120;
    std::thread::scope(|t| {
        for _ in 0..4 {
            let (acked, refused, next, addrs) = (&acked, &refused, &next, &addrs);
            t.spawn(move || {
                loop {
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    if k >= BLOBS {
                        return;
                    }
                    let fe = k % 3;
                    match http(&addrs[fe], "PUT", &format!("/blobs/run/{k:04}"), &content(k)) {
                        Ok((201, _)) => acked.lock().unwrap().push((k, fe)),
                        // Refused or cut off by the crash: not acknowledged, nothing promised.
                        Ok(_) | Err(_) => {
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
        // Mid-workload, host 2 dies: its front end and its storage node.
        let (acked, killed, fronts, next, garage) = (&acked, &killed, &fronts, &next, &garage);
        t.spawn(move || {
            while acked.lock().unwrap().len() < BLOBS / 3 && next.load(Ordering::SeqCst) < BLOBS {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(next.load(Ordering::SeqCst) < BLOBS, "a third acknowledged before the end");
            if let Some(mut f) = fronts[2].lock().unwrap().take() {
                let _ = f.child.kill();
                let _ = f.child.wait();
            }
            garage.lock().unwrap().nodes()[2].stop();
            killed.store(true, Ordering::SeqCst);
        });
    });
    assert!(killed.load(Ordering::SeqCst));
    let acked = acked.lock().unwrap().clone();
    // Front ends 0 and 1 kept serving through the loss.
    assert!(acked.iter().filter(|(_, fe)| *fe < 2).count() >= 2 * BLOBS / 3 - 2, "{acked:?}");
    assert!(acked.len() + refused.load(Ordering::SeqCst) == BLOBS);

    for addr in &addrs[..2] {
        for &(k, _) in &acked {
            let (status, body) = http(addr, "GET", &format!("/blobs/run/{k:04}"), b"").unwrap();
            assert_eq!(status, 200, "blob {k} through {addr}");
            assert!(body == content(k), "blob {k} through {addr}: {} bytes", body.len());
        }
        let (status, list) = http(addr, "GET", "/api/list?prefix=run/&limit=500", b"").unwrap();
        assert_eq!(status, 200);
        let list: serde_json::Value = serde_json::from_slice(&list).unwrap();
        let listed = list["items"].as_array().map_or(0, Vec::len);
        assert!(listed >= acked.len(), "{listed} listed, {} acknowledged", acked.len());
    }

    // The samples were indexed by the front end that stored them; search finds them through
    // either survivor.
    for addr in &addrs[..2] {
        let (status, found) = http(addr, "GET", "/api/search?modality=CT", b"").unwrap();
        assert_eq!(status, 200);
        let found: serde_json::Value = serde_json::from_slice(&found).unwrap();
        assert!(found.to_string().contains("samples/"), "{found}");
    }
    // Front ends first: Garage's graceful stop waits for its clients' keep-alive connections
    // to close, which took 20 s while the front ends still held them.
    drop(fronts);
    drop(garage);
}
