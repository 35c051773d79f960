//! Many small blobs at once (part of `blobstream bench batch`): 10,000 blobs of 4 KiB put and
//! then got back, 8 in flight, through the Blob API's client (kept-alive data connections,
//! in-band negotiation, each put pipelined in one round trip, gets asked for in runs sent
//! ahead of their answers as the Blob API's batches do) against the same blobs through
//! blobstream's HTTP API with a keep-alive HTTP/1.1 client (8 connections). Both servers run
//! in this process over one filesystem store, so every blob is durable before it is
//! acknowledged either way; every get is checked byte for byte. Paired runs, alternating
//! which goes first; blobs/s from the medians, each ratio the median of the per-run ratios.
//!
//! The HTTP client is a minimal one written here (a request line, two headers, the body; the
//! status line and `Content-Length` read back): nothing a general-purpose client does on top
//! slows the baseline down.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use bs_client::{Client, RouteRequest};
use bs_server::{BackgroundServer, ServerConfig};
use bs_store::FsStore;

use crate::bindings::Row;
use crate::error::BenchError;
use crate::options::BenchOptions;
use crate::payload::{median, paired_ratio, payload};

/// Blobs per run, and their size.
const BLOBS: usize = 10_000;
const SIZE: usize = 4096;
/// Transfers in flight (the CLI's default --jobs).
const JOBS: usize = 8;
/// The target of the rows against the HTTP API (the issue's): at least as many blobs a second.
const TARGET: Option<(f64, bool)> = Some((1.0, true));

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Invalid(e.to_string())
}

/// The bytes of blob `i`: distinct per blob, so a mix-up is caught.
fn blob(data: &[u8], i: usize) -> &[u8] {
    let at = (i * 61) % (data.len() - SIZE);
    &data[at..at + SIZE]
}

/// Run `each(job)` on [`JOBS`] threads at once; seconds until all are done.
fn in_flight(each: impl Fn(usize) -> Result<(), BenchError> + Sync) -> Result<f64, BenchError> {
    let t = Instant::now();
    thread::scope(|s| {
        let each = &each;
        let handles: Vec<_> = (0..JOBS).map(|job| s.spawn(move || each(job))).collect();
        handles.into_iter().try_for_each(|h| h.join().map_err(|_| err("a job panicked"))?)
    })?;
    Ok(t.elapsed().as_secs_f64())
}

/// The blobs job `job` of [`JOBS`] moves.
fn share(job: usize, n: usize) -> impl Iterator<Item = usize> {
    (job..n).step_by(JOBS)
}

fn api_put(c: &Client, prefix: &str, data: &[u8], n: usize) -> Result<f64, BenchError> {
    in_flight(|job| {
        for i in share(job, n) {
            let route = RouteRequest { size: Some(SIZE as u64), ..Default::default() };
            c.push_all(&format!("{prefix}{i}"), blob(data, i), Some(route))?;
        }
        Ok(())
    })
}

/// [`api_put`] without pipelining: each put negotiated (in band), then its bytes sent.
fn api_put_unpipelined(c: &Client, prefix: &str, data: &[u8], n: usize) -> Result<f64, BenchError> {
    in_flight(|job| {
        for i in share(job, n) {
            let route = RouteRequest { size: Some(SIZE as u64), ..Default::default() };
            let mut p = c.open_push(&format!("{prefix}{i}"), 0, Some(SIZE as u64), Some(route))?;
            p.write(blob(data, i))?;
            p.finish(true)?;
        }
        Ok(())
    })
}

fn api_get(c: &Client, prefix: &str, data: &[u8], n: usize) -> Result<f64, BenchError> {
    in_flight(|job| {
        let mut buf = vec![0u8; SIZE];
        for i in share(job, n) {
            let mut p = c.open_pull(&format!("{prefix}{i}"), 0, None)?;
            p.read_exact_to_end(&mut buf)?;
            if buf != blob(data, i) {
                return Err(err(format!("{prefix}{i}: the pull returned other bytes")));
            }
        }
        Ok(())
    })
}

/// [`api_get`] as a batch of the Blob API gets small blobs (`get -r`): each job's blobs in
/// runs of [`bs_blob::PULL_AHEAD_RUN`], every request of a run sent ahead of the first answer
/// ([`Client::pull_each_up_to`]).
fn api_get_ahead(c: &Client, prefix: &str, data: &[u8], n: usize) -> Result<f64, BenchError> {
    in_flight(|job| {
        let ids: Vec<usize> = share(job, n).collect();
        for run in ids.chunks(bs_blob::PULL_AHEAD_RUN) {
            let names: Vec<String> = run.iter().map(|i| format!("{prefix}{i}")).collect();
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut failed = None;
            c.pull_each_up_to(&refs, bs_blob::PULL_AHEAD_UP_TO, |k, r| match r {
                Ok(b) if b == blob(data, run[k]) => {}
                Ok(_) => failed = Some(err(format!("{}: the pull returned other bytes", refs[k]))),
                Err(e) => failed = Some(err(format!("{}: {e}", refs[k]))),
            });
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(())
    })
}

/// One keep-alive HTTP/1.1 connection.
struct Http {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Http {
    fn connect(addr: SocketAddr) -> Result<Self, BenchError> {
        let w = TcpStream::connect(addr).map_err(BenchError::io("connecting to the HTTP API"))?;
        w.set_nodelay(true).map_err(BenchError::io("nodelay"))?;
        let r = BufReader::new(w.try_clone().map_err(BenchError::io("socket"))?);
        Ok(Self { r, w })
    }

    /// Send a request; read the status and the body (by its Content-Length) into `body`.
    fn call(&mut self, head: &str, send: &[u8], body: &mut Vec<u8>) -> Result<u16, BenchError> {
        let io = BenchError::io("HTTP API");
        let mut req = Vec::with_capacity(head.len() + send.len());
        req.extend_from_slice(head.as_bytes());
        req.extend_from_slice(send);
        self.w.write_all(&req).map_err(io)?;
        let mut line = String::new();
        self.r.read_line(&mut line).map_err(BenchError::io("HTTP status"))?;
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| err(format!("bad HTTP status line {line:?}")))?;
        let mut len = 0usize;
        loop {
            line.clear();
            self.r.read_line(&mut line).map_err(BenchError::io("HTTP header"))?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().map_err(err)?;
            }
        }
        body.resize(len, 0);
        self.r.read_exact(body).map_err(BenchError::io("HTTP body"))?;
        Ok(status)
    }
}

fn http_put(addr: SocketAddr, prefix: &str, data: &[u8], n: usize) -> Result<f64, BenchError> {
    in_flight(|job| {
        let mut h = Http::connect(addr)?;
        let mut body = Vec::new();
        for i in share(job, n) {
            let head = format!(
                "PUT /blobs/{prefix}{i} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {SIZE}\r\n\r\n"
            );
            let status = h.call(&head, blob(data, i), &mut body)?;
            if status != 201 {
                return Err(err(format!("PUT {prefix}{i}: HTTP {status}")));
            }
        }
        Ok(())
    })
}

fn http_get(addr: SocketAddr, prefix: &str, data: &[u8], n: usize) -> Result<f64, BenchError> {
    in_flight(|job| {
        let mut h = Http::connect(addr)?;
        let mut body = Vec::new();
        for i in share(job, n) {
            let head = format!("GET /blobs/{prefix}{i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
            let status = h.call(&head, &[], &mut body)?;
            if status != 200 || body != blob(data, i) {
                return Err(err(format!("GET {prefix}{i}: HTTP {status} or other bytes")));
            }
        }
        Ok(())
    })
}

/// The rows: puts and gets of many small blobs, ours against the HTTP API.
pub(crate) fn small_blob_rows(opts: &BenchOptions) -> Result<(Vec<Row>, String), BenchError> {
    let (runs, n) = if opts.quick { (1, 2000) } else { (5, BLOBS) };
    let tmp = tempfile::tempdir().map_err(BenchError::io("temp dir"))?;
    let store = Arc::new(FsStore::open(tmp.path().join("store"))?);
    let index = Arc::new(bs_meta::ImageIndex::open(&store.root().join("meta.db"))?);
    let server = BackgroundServer::start(store.clone(), ServerConfig::ephemeral())?;
    let client = Client::connect(&server.control_addr().to_string())?;
    // The HTTP API on as many worker threads as the data plane's server has.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::io("runtime"))?;
    let web = rt.block_on(bs_web::WebServer::start(
        store,
        index,
        Arc::new(bs_imaging::Registry::builtin()),
        bs_web::WebConfig::ephemeral(),
    ))?;
    let addr = web.addr();
    let data = payload(SIZE as u64 * 64);
    let (mut op, mut hp, mut og, mut hg, mut up) = (vec![], vec![], vec![], vec![], vec![]);
    let mut ag = vec![];
    for r in 0..runs {
        opts.say(&format!("{n} × 4 KiB blobs: run {} of {runs}", r + 1));
        let (ours, http) = (format!("small/{r}/api/"), format!("small/{r}/http/"));
        let unpipelined = format!("small/{r}/unpipelined/");
        if r % 2 == 0 {
            op.push(api_put(&client, &ours, &data, n)?);
            hp.push(http_put(addr, &http, &data, n)?);
            up.push(api_put_unpipelined(&client, &unpipelined, &data, n)?);
            og.push(api_get(&client, &ours, &data, n)?);
            hg.push(http_get(addr, &http, &data, n)?);
            ag.push(api_get_ahead(&client, &ours, &data, n)?);
        } else {
            up.push(api_put_unpipelined(&client, &unpipelined, &data, n)?);
            hp.push(http_put(addr, &http, &data, n)?);
            op.push(api_put(&client, &ours, &data, n)?);
            hg.push(http_get(addr, &http, &data, n)?);
            ag.push(api_get_ahead(&client, &ours, &data, n)?);
            og.push(api_get(&client, &ours, &data, n)?);
        }
    }
    rt.block_on(web.shutdown());
    let per_s = |secs: f64| n as f64 / secs;
    let row = |what: String, ours: &[f64], base: &[f64], base_name: String, target| Row {
        group: "small blobs",
        what,
        ours: per_s(median(ours)),
        baseline: per_s(median(base)),
        baseline_name: base_name,
        unit: "blobs/s",
        ratio: paired_ratio(ours, base),
        ratio_means: "ours / baseline",
        target,
    };
    let http = || format!("the HTTP API, {JOBS} keep-alive connections");
    let blobs = format!("{n} × 4 KiB blobs");
    let rows = vec![
        row(format!("{blobs}, put, {JOBS} in flight (Blob API client)"), &op, &hp, http(), TARGET),
        row(
            format!(
                "{blobs}, get, {JOBS} in flight, each asking for runs of {} ahead of their \
                 answers as the Blob API's batches do",
                bs_blob::PULL_AHEAD_RUN
            ),
            &ag,
            &hg,
            http(),
            TARGET,
        ),
        // What pipelining buys: puts against the same puts without it, and gets without it
        // against the HTTP API.
        row(
            format!("{blobs}, put pipelined (request, bytes, commit in one write)"),
            &op,
            &up,
            "the same puts negotiated in band, then sent (two round trips)".into(),
            None,
        ),
        row(
            format!("{blobs}, get one request at a time, {JOBS} in flight"),
            &og,
            &hg,
            http(),
            None,
        ),
    ];
    let note = format!(
        "small blobs: both servers in this process over one filesystem store (every blob \
         fsync'd before it is acknowledged, commits sharing fsyncs); every get checked byte \
         for byte; {runs} paired run(s), rates the medians, each ratio the median of the \
         per-run ratios. For scale, the issue quotes SeaweedFS at about 4,000 \
         writes/s and 11,000 reads/s of 1 KiB objects with 16 clients (not measured here)"
    );
    Ok((rows, note))
}
