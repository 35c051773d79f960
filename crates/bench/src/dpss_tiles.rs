//! Random tile reads through the web server acting as a block-store client (IIIF) against
//! nginx serving the same tiles as static files in the DZI layout — what a user would pick
//! instead — with the same load: keep-alive HTTP/1.1 connections, each asking its share of one
//! fixed random sequence of tiles — with every cache cold (the kernel's page cache dropped
//! before the run, for both) and warm; and the tiled viewer's time to first tile and to a full
//! viewport in headless Chromium, against the same page and tiles as static IIIF files on nginx.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bs_dpss::layout::Layout;
use bs_dpss::master;
use bs_dpss::pyramid::Synthetic;
use bs_dpss::{BlockId, BlockServer, Client, ClientOptions, ServerConfig, ServerRef};
use bs_imaging::registry::Registry;
use bs_meta::ImageIndex;
use bs_store::FsStore;
use bs_web::{WebConfig, WebServer};

use crate::bindings::Row;
use crate::error::BenchError;
use crate::http::{Nginx, NginxConfig, find_nginx, read_head};
use crate::options::BenchOptions;
use crate::payload::{median, paired_ratio};
use crate::settle::settle;

const SIDE: u64 = 8192;
const TILE: u32 = 256;
/// Concurrent keep-alive connections of the load.
const CONNS: usize = 4;

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Baseline(e.to_string())
}

/// The IIIF path of a tile (what the viewer asks) and its DZI path (what nginx serves).
fn paths(l: &Layout, id: BlockId) -> (String, String) {
    let f = 1u64 << id.level;
    let span = TILE as u64 * f;
    let (x, y) = (id.x as u64 * span, id.y as u64 * span);
    let (w, h) = (span.min(l.width - x), span.min(l.height - y));
    let iiif = format!(
        "/iiif/{}/{x},{y},{w},{h}/{},{}/0/default.png",
        l.dataset,
        w.div_ceil(f),
        h.div_ceil(f)
    );
    let max_dz = (l.width.max(l.height) as f64).log2().ceil() as u64;
    let dzi = format!("/{}_files/{}/{}_{}.png", l.dataset, max_dz - id.level as u64, id.x, id.y);
    (iiif, dzi)
}

/// Times the warm reads and nginx's go over the request sequence.
const WARM_PASSES: usize = 3;

/// Slices the warm reads are cut into, ours and nginx's taking turns slice by slice: a whole
/// pass of one then of the other (a second or two each) lets a burst of host contention
/// land on one side only.
const WARM_SLICES: usize = 12;

/// Ours and nginx's warm reads (`(address, requests)` each), cut into [`WARM_SLICES`]
/// slices that take turns (who goes first alternating with `run`), each side on its own
/// keep-alive connections throughout; tiles per second of each, their requests over their
/// summed time.
fn warm_interleaved(
    ours: (SocketAddr, &[(String, BlockId)]),
    theirs: (SocketAddr, &[(String, BlockId)]),
    run: usize,
    check: Option<&HashMap<BlockId, Vec<u8>>>,
) -> Result<(f64, f64), BenchError> {
    let mut conns = [Conns::open(ours.0)?, Conns::open(theirs.0)?];
    let per = ours.1.len().div_ceil(WARM_SLICES).max(1);
    let mut spent = [0.0f64; 2];
    for (k, (a, b)) in ours.1.chunks(per).zip(theirs.1.chunks(per)).enumerate() {
        let order = if (run + k).is_multiple_of(2) { [(0, a), (1, b)] } else { [(1, b), (0, a)] };
        for (side, reqs) in order {
            spent[side] += reqs.len() as f64 / conns[side].ask(reqs, check)?;
        }
    }
    Ok((ours.1.len() as f64 / spent[0], theirs.1.len() as f64 / spent[1]))
}

/// `CONNS` keep-alive HTTP/1.1 connections to one server, kept from one [`Conns::ask`] to the
/// next.
struct Conns {
    addr: SocketAddr,
    conns: Vec<(TcpStream, BufReader<TcpStream>)>,
}

impl Conns {
    fn open(addr: SocketAddr) -> Result<Self, BenchError> {
        let one = || -> std::io::Result<(TcpStream, BufReader<TcpStream>)> {
            let tcp = TcpStream::connect(addr)?;
            tcp.set_nodelay(true)?;
            tcp.set_read_timeout(Some(Duration::from_secs(60)))?;
            Ok((tcp.try_clone()?, BufReader::with_capacity(256 << 10, tcp)))
        };
        let conns = (0..CONNS).map(|_| one()).collect::<Result<_, _>>().map_err(err)?;
        Ok(Self { addr, conns })
    }

    /// Ask every path, split over the connections; tiles per second. With `check`, every
    /// body must equal the tile's bytes.
    fn ask(
        &mut self,
        reqs: &[(String, BlockId)],
        check: Option<&HashMap<BlockId, Vec<u8>>>,
    ) -> Result<f64, BenchError> {
        let addr = self.addr;
        let started = Instant::now();
        let results: Vec<Result<(), String>> = thread::scope(|s| {
            let per = reqs.len().div_ceil(CONNS).max(1);
            let hs: Vec<_> = reqs
                .chunks(per)
                .zip(self.conns.iter_mut())
                .map(|(part, (w, r))| s.spawn(move || ask_on(addr, w, r, part, check)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a load thread panicked".into())))
                .collect()
        });
        for r in results {
            r.map_err(BenchError::Http)?;
        }
        Ok(reqs.len() as f64 / started.elapsed().as_secs_f64())
    }
}

/// Ask every path on one connection, in order, each answer read whole before the next.
fn ask_on(
    addr: SocketAddr,
    w: &mut TcpStream,
    r: &mut BufReader<TcpStream>,
    part: &[(String, BlockId)],
    check: Option<&HashMap<BlockId, Vec<u8>>>,
) -> Result<(), String> {
    for (path, id) in part {
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
        w.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let (status, headers) = read_head(r)?;
        let len = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<usize>().ok())
            .ok_or_else(|| format!("{path}: no Content-Length"))?;
        let mut body = vec![0u8; len];
        r.read_exact(&mut body).map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!("{path}: HTTP {status}: {}", String::from_utf8_lossy(&body)));
        }
        if let Some(c) = check
            && c.get(id).is_none_or(|want| *want != body)
        {
            return Err(format!("{path}: the body is not tile {id}"));
        }
    }
    Ok(())
}

/// Ask every path over `CONNS` new keep-alive connections; tiles per second. With `check`,
/// every body must equal the tile's bytes.
fn load(
    addr: SocketAddr,
    reqs: &[(String, BlockId)],
    check: Option<&HashMap<BlockId, Vec<u8>>>,
) -> Result<f64, BenchError> {
    // Their set-up counted.
    let started = Instant::now();
    Conns::open(addr)?.ask(reqs, check)?;
    Ok(reqs.len() as f64 / started.elapsed().as_secs_f64())
}

/// The rows: reads with every cache cold, repeated reads, and first reads with the page cache
/// warm, against nginx. `None` when nginx is missing.
pub fn tiles_vs_nginx(
    opts: &BenchOptions,
    runs: usize,
    requests: usize,
) -> Result<Option<Vec<Row>>, BenchError> {
    let Some(nginx_exe) = find_nginx() else { return Ok(None) };
    let dir = tempfile::tempdir().map_err(err)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(err)?;
    let maddr = master::start(&rt, "127.0.0.1:0", &dir.path().join("names.db")).map_err(err)?;
    // The web server gets one worker thread, as nginx gets one worker process (the rule of
    // `bench http`): on two cores shared with the load threads, a second worker only adds
    // wake-ups across threads.
    let web_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(err)?;
    // Block servers without caches of their own: a first read comes from their disk files
    // (through the page cache), and no run starts with blocks an earlier one left.
    let mut servers = Vec::new();
    let mut refs = Vec::new();
    for s in 0..2 {
        let mut cfg = ServerConfig::new(vec![dir.path().join(format!("s{s}"))]);
        cfg.cache_bytes = 0;
        let srv = BlockServer::start("127.0.0.1:0", cfg).map_err(err)?;
        refs.push(ServerRef { name: srv.name().into(), addr: srv.addr().to_string(), disks: 1 });
        servers.push(srv);
    }
    let layout = Layout::plan("tiles", "image", (SIDE, SIDE), TILE, refs, 2).map_err(err)?;
    let src = Synthetic { width: SIDE, height: SIDE, tile: TILE };
    opts.say("random tiles: loading a 8192² image over 2 block servers");
    bs_dpss::loader::load(&maddr, layout, &src, &ClientOptions::default(), &mut |_, _| {})
        .map_err(err)?;
    // The same tiles as files for nginx.
    let mut c = Client::open(&maddr, "tiles", ClientOptions::default()).map_err(err)?;
    let layout = c.layout().clone();
    let ids: Vec<BlockId> = layout.all_blocks().collect();
    let root = dir.path().join("www");
    let mut bytes = HashMap::new();
    for part in ids.chunks(1024) {
        for (id, data) in c.fetch(part, Duration::from_secs(60)).map_err(err)? {
            let (_, dzi) = paths(&layout, id);
            let p = root.join(dzi.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).map_err(err)?;
            std::fs::write(&p, &*data).map_err(err)?;
            bytes.insert(id, data.to_vec());
        }
    }
    drop(c);
    // One random sequence over the three finest levels (fixed seed).
    let pool: Vec<BlockId> = ids.iter().copied().filter(|b| b.level <= 2).collect();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let pick: Vec<BlockId> = (0..requests)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            pool[(x % pool.len() as u64) as usize]
        })
        .collect();
    let ours_reqs: Vec<(String, BlockId)> =
        pick.iter().map(|&b| (paths(&layout, b).0, b)).collect();
    let nginx_reqs: Vec<(String, BlockId)> =
        pick.iter().map(|&b| (paths(&layout, b).1, b)).collect();
    let ncfg = NginxConfig {
        prefix: dir.path().join("nginx"),
        root: root.clone(),
        port: bs_peers::free_port(),
        worker_processes: 1,
        sendfile: true,
    };
    let nginx = Nginx::start(&nginx_exe, &ncfg)?;
    load(nginx.addr(), &nginx_reqs, Some(&bytes))?; // its page cache warm, and the files right
    // The warm reads and nginx's go over the sequence WARM_PASSES times: a single pass takes
    // a tenth of a second, too short to measure steadily on a shared machine.
    let passes = |reqs: &[(String, BlockId)]| -> Vec<(String, BlockId)> {
        (0..WARM_PASSES).flat_map(|_| reqs.iter().cloned()).collect()
    };
    let (ours_warm, nginx_warm) = (passes(&ours_reqs), passes(&nginx_reqs));
    // Cold means every cache empty, nginx's as well as ours: nginx has no cache of its own
    // but the kernel's page cache, so before each cold run that is dropped (as root) and
    // both read from the disk — our block servers their data files, nginx its tile files.
    let disk_cold = match drop_page_cache() {
        Ok(()) => true, // and the set-up's files are written out, once
        Err(e) => {
            opts.say(&format!("{e}: no tile rows with every cache cold"));
            false
        }
    };
    opts.say(&format!("random tiles: {requests} per run over {CONNS} connections, {runs} runs"));
    let mut r = TileRuns::default();
    // Each timed pass starts once the machine is idle: the block servers may still be sending
    // what the last list asked ahead (the ring of medium tiles), and a dropped page cache is
    // being refilled; neither is charged to the pass that follows, ours or nginx's.
    let timed = |addr, reqs: &[(String, BlockId)], check| {
        block_servers_done(&servers);
        settle();
        load(addr, reqs, check)
    };
    for i in 0..runs {
        // The first run checks every body, ours and nginx's alike.
        let check = (i == 0).then_some(&bytes);
        // A fresh web server (its tile cache empty) on block servers reading from the disk;
        // kept for the warm reads.
        let cold_web = if disk_cold {
            let web = web_rt.block_on(start_web(dir.path(), &maddr, 2 * i))?;
            drop_page_cache().map_err(BenchError::Baseline)?;
            r.cold.push(timed(web.addr(), &ours_reqs, check)?);
            Some(web)
        } else {
            None
        };
        // A fresh web server again, the block servers' files now in the page cache.
        let first_web = web_rt.block_on(start_web(dir.path(), &maddr, 2 * i + 1))?;
        r.first.push(timed(first_web.addr(), &ours_reqs, check)?);
        if disk_cold {
            drop_page_cache().map_err(BenchError::Baseline)?;
            r.nginx_cold.push(timed(nginx.addr(), &nginx_reqs, check)?);
        }
        // Warm: our tile cache full (the first web server's if it read cold, else the
        // second's), nginx's files in the page cache (its cold pass read them, or the
        // warm-up did). The two take turns slice by slice.
        let warm_web = cold_web.as_ref().unwrap_or(&first_web);
        block_servers_done(&servers);
        settle();
        let (ours, theirs) =
            warm_interleaved((warm_web.addr(), &ours_warm), (nginx.addr(), &nginx_warm), i, check)?;
        r.warm.push(ours);
        r.nginx_warm.push(theirs);
        web_rt.block_on(first_web.shutdown());
        if let Some(web) = cold_web {
            web_rt.block_on(web.shutdown());
        }
    }
    // The viewer: cold web server against the same page and tiles as static files on nginx.
    let mut browser_rows = Vec::new();
    match harness() {
        None => {
            opts.say("no node/Chromium/playwright-core (scripts/browser-setup.sh): no viewer rows")
        }
        Some((node, script)) => {
            let web = web_rt.block_on(start_web(dir.path(), &maddr, 2 * runs))?;
            let info = crate::http::get(web.addr(), "/iiif/tiles/info.json")?;
            web_rt.block_on(web.shutdown());
            static_viewer(&root, &layout, &bytes, &info.body)?;
            opts.say(&format!(
                "the viewer in Chromium: time to first tile and full viewport ({runs} runs)"
            ));
            let (mut of, mut ov, mut nf, mut nv) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for i in 0..runs {
                let web = web_rt.block_on(start_web(dir.path(), &maddr, 2 * runs + 1 + i))?;
                let (f, v) = ttft(
                    &node,
                    &script,
                    &format!("http://{}/dpss.html?dataset=tiles", web.addr()),
                )?;
                web_rt.block_on(web.shutdown());
                let (g, w) = ttft(
                    &node,
                    &script,
                    &format!("http://{}/dpss.html?dataset=tiles", nginx.addr()),
                )?;
                of.push(f);
                ov.push(v);
                nf.push(g);
                nv.push(w);
            }
            let row = |what: &str, ours: f64, base: f64| Row {
                group: "viewer",
                what: what.into(),
                ours,
                baseline: base,
                baseline_name: "the same page, info.json and tiles as static files on nginx".into(),
                unit: "ms",
                ratio: ours / base,
                ratio_means: "ours / baseline (time: lower is better)",
                target: None,
            };
            browser_rows.push(row(
                "/dpss.html in headless Chromium at 1366×768, the web server cold: time to the first tile",
                median(&of),
                median(&nf),
            ));
            browser_rows.push(row(
                "/dpss.html in headless Chromium at 1366×768, the web server cold: time to every visible tile of the first level",
                median(&ov),
                median(&nv),
            ));
        }
    }
    drop(servers);
    Ok(Some(r.rows().into_iter().chain(browser_rows).collect()))
}

/// Tiles per second of each run: ours and nginx's, every cache cold (when the page cache can
/// be dropped) and warm, and our first reads with the page cache warm.
#[derive(Default)]
struct TileRuns {
    cold: Vec<f64>,
    nginx_cold: Vec<f64>,
    warm: Vec<f64>,
    nginx_warm: Vec<f64>,
    first: Vec<f64>,
}

impl TileRuns {
    fn rows(&self) -> Vec<Row> {
        // Each ratio is the median of the per-run ratios (run i against nginx's run i).
        let secs = |rates: &[f64]| rates.iter().map(|r| 1.0 / r).collect::<Vec<_>>();
        let row = |what: String, ours: &[f64], theirs: &[f64], how: &str, target: bool| Row {
            group: "tiles",
            what,
            ours: median(ours),
            baseline: median(theirs),
            baseline_name: format!("nginx, the same tiles as static files (DZI layout), {how}"),
            unit: "tiles/s",
            ratio: paired_ratio(&secs(ours), &secs(theirs)),
            ratio_means: "ours / baseline",
            target: target.then_some((1.0, true)),
        };
        let mut rows = Vec::new();
        if !self.cold.is_empty() {
            rows.push(row(
                format!(
                    "random 256² tiles of an 8192² image over IIIF, {CONNS} keep-alive \
                     connections, every cache cold: the page cache dropped before the run, so \
                     2 block servers (no cache of their own) read their data files from the \
                     disk, and the web server's tile cache empty (the web server on 1 tokio \
                     worker thread, nginx 1 worker process)"
                ),
                &self.cold,
                &self.nginx_cold,
                "its page cache dropped before the run",
                true,
            ));
        }
        rows.push(row(
            format!(
                "the same tiles read again, {WARM_PASSES} times over (the web server's cache \
                 warm; nginx read them as often), ours and nginx's taking turns in \
                 {WARM_SLICES} slices"
            ),
            &self.warm,
            &self.nginx_warm,
            "its files in the page cache",
            true,
        ));
        rows.push(row(
            "first reads of the same sequence with the page cache warm: the web server's tile \
             cache empty, the block servers' files in the page cache (each miss is a round trip \
             to a block server that nginx does not make)"
                .to_string(),
            &self.first,
            &self.nginx_warm,
            "its files in the page cache",
            false,
        ));
        rows
    }
}

/// Wait until the block servers have no read queued and have stopped sending (what the web
/// server's last list asked ahead is delivered): a disk read waiting on the disk is not busy
/// CPU time, so [`settle`] alone would not see it. At most 10 s.
fn block_servers_done(servers: &[BlockServer]) {
    let sent = || -> (u64, bool) {
        let st: Vec<_> = servers.iter().map(BlockServer::stats).collect();
        let queued = st.iter().flat_map(|s| s.queued.iter()).any(|&q| q > 0);
        (st.iter().map(|s| s.sent_blocks).sum(), queued)
    };
    let (mut last, _) = sent();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        let (now, queued) = sent();
        if !queued && now == last {
            return;
        }
        last = now;
    }
}

/// Empty the kernel's page, dentry and inode caches, so that what is read next comes from
/// the disk: `sync`, then `3` into `/proc/sys/vm/drop_caches` (as root).
fn drop_page_cache() -> Result<(), String> {
    match std::process::Command::new("sync").status() {
        Ok(s) if s.success() => {}
        Ok(s) => return Err(format!("sync: {s}")),
        Err(e) => return Err(format!("sync: {e}")),
    }
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| format!("the page cache cannot be dropped ({e})"))
}

async fn start_web(dir: &Path, master: &str, i: usize) -> Result<WebServer, BenchError> {
    let store = Arc::new(FsStore::open(dir.join(format!("store{i}")))?);
    let index = Arc::new(ImageIndex::open(&store.root().join("meta.db"))?);
    let cfg = WebConfig { dpss_master: Some(master.to_string()), ..WebConfig::ephemeral() };
    Ok(WebServer::start(store, index, Arc::new(Registry::builtin()), cfg).await?)
}

/// The viewer's time to first tile and to a full viewport (ms), cold, in headless Chromium
/// (`web-tests/dpss-ttft.mjs`).
fn ttft(node: &Path, script: &Path, url: &str) -> Result<(f64, f64), BenchError> {
    let out = std::process::Command::new(node)
        .arg(script)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(BenchError::io("running web-tests/dpss-ttft.mjs"))?;
    if !out.status.success() {
        return Err(BenchError::Baseline(format!(
            "web-tests/dpss-ttft.mjs {url}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| BenchError::Baseline(format!("web-tests/dpss-ttft.mjs: {e}")))?;
    match (v["first_tile_ms"].as_f64(), v["full_view_ms"].as_f64()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(BenchError::Baseline(format!("web-tests/dpss-ttft.mjs printed {v}"))),
    }
}

/// node and the harness with playwright-core beside it, if the browser tests are set up.
fn harness() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let node = crate::paths::find_on_path("node")?;
    let chromium = std::env::var_os("CHROMIUM")
        .map_or_else(|| std::path::PathBuf::from("/usr/bin/chromium"), Into::into);
    if !chromium.is_file() {
        return None;
    }
    [
        std::path::PathBuf::from("."),
        std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")),
    ]
    .into_iter()
    .map(|r| r.join("web-tests"))
    .find(|d| d.join("dpss-ttft.mjs").is_file() && d.join("node_modules/playwright-core").is_dir())
    .map(|d| (node, d.join("dpss-ttft.mjs")))
}

/// The same viewer page, info.json and tiles as static files (IIIF level 0 is made to be
/// served so) under `root`, for nginx.
fn static_viewer(
    root: &Path,
    layout: &Layout,
    bytes: &HashMap<BlockId, Vec<u8>>,
    info: &[u8],
) -> Result<(), BenchError> {
    let dir = root.join("iiif").join(&layout.dataset);
    std::fs::create_dir_all(&dir).map_err(err)?;
    std::fs::write(dir.join("info.json"), info).map_err(err)?;
    for (id, data) in bytes {
        let (iiif, _) = paths(layout, *id);
        let p = root.join(iiif.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).map_err(err)?;
        std::fs::write(&p, data).map_err(err)?;
    }
    let assets = concat!(env!("CARGO_MANIFEST_DIR"), "/../web/assets");
    for f in ["dpss.html", "dpss.js"] {
        std::fs::copy(Path::new(assets).join(f), root.join(f)).map_err(err)?;
    }
    Ok(())
}
