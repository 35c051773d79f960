//! `blobstream bench http`: downloads of 1, 32 and 256 MB blobs from blobstream's HTTP server
//! against nginx serving the same bytes from files, in the same run, loaded by wrk; and the
//! time to first image of a 2048² 16-bit image in the browser beside plain downloads of it.
//!
//! Both servers read from disk: blobstream runs in this process over a filesystem store in a
//! temporary directory, nginx as a child process on a generated configuration. Each gets the
//! same number of cores (nginx worker processes = tokio worker threads): half the machine's,
//! the other half going to wrk. Before timing, one GET per server and size checks status,
//! Content-Length and every byte, so both do the same work. The servers then take turns run by
//! run, and the ratio is the median of the per-run ratios.

pub(crate) mod get;
mod nginx;
mod report;
mod ttfi;
mod wrk;

pub(crate) use get::read_head;
pub use get::{Response, get};
pub use nginx::{Nginx, NginxConfig, find_nginx};
pub use report::{
    DownloadMeasurement, HTTP_TARGET, HttpReport, HttpSetup, TARGET_VS_NGINX, TimeToFirstImage,
};
pub use wrk::{WrkRun, parse_output as parse_wrk_output};

use std::fs;
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bs_imaging::registry::Registry;
use bs_meta::ImageIndex;
use bs_store::{FsStore, RouteSpec, Store};
use bs_web::{WebConfig, WebServer};

use crate::error::BenchError;
use crate::filters::test_image;
use crate::machine::machine_description;
use crate::options::BenchOptions;
use crate::paths::find_on_path;
use crate::payload::{MB, payload};
use crate::report::size_text;

/// What a run measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpPlan {
    /// Blob sizes in bytes.
    pub sizes: Vec<u64>,
    /// Timed wrk runs per server and size (after one warm-up run).
    pub runs: u32,
    pub seconds: u32,
    pub warmup_seconds: u32,
    /// wrk's keep-alive connections.
    pub connections: u32,
    /// Page loads (and plain GETs) for the time to first image, after one warm-up.
    pub ttfi_runs: u32,
}

impl HttpPlan {
    pub fn new(quick: bool) -> Self {
        let sizes = vec![MB, 32 * MB, 256 * MB];
        if quick {
            Self { sizes, runs: 3, seconds: 2, warmup_seconds: 1, connections: 4, ttfi_runs: 3 }
        } else {
            Self { sizes, runs: 7, seconds: 5, warmup_seconds: 2, connections: 4, ttfi_runs: 7 }
        }
    }
}

/// (server cores, wrk threads) on a machine of `cpus`: half the cores each, at least one.
pub fn split_cores(cpus: usize) -> (usize, usize) {
    let server = (cpus / 2).max(1);
    (server, cpus.saturating_sub(server).max(1))
}

/// The key both servers serve a download blob under (nginx at `/blobs/KEY` on its root).
fn download_key(size: u64) -> String {
    format!("bench/http-{size}.bin")
}

/// The two servers compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    Blobstream,
    /// nginx with `sendfile on`.
    Nginx,
    /// nginx with `sendfile off` and 1 MiB output buffers.
    NginxCopy,
}

impl Server {
    fn name(self) -> &'static str {
        match self {
            Self::Blobstream => "blobstream",
            Self::Nginx => "nginx (sendfile)",
            Self::NginxCopy => "nginx (buffered)",
        }
    }
}

/// Run the HTTP benchmark. Quick: fewer and shorter runs (under a minute and a half).
pub fn run_http(opts: &BenchOptions) -> Result<HttpReport, BenchError> {
    let plan = HttpPlan::new(opts.quick);
    let say = |line: &str| opts.say(line);
    let mut notes = Vec::new();
    if cfg!(debug_assertions) {
        notes.push("debug build: numbers are not representative; build with --release".into());
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (workers, wrk_threads) = split_cores(cpus);
    let nginx_exe = find_nginx();
    let wrk_exe = find_on_path("wrk");
    let setup = HttpSetup {
        server_workers: workers,
        wrk_threads,
        wrk_connections: plan.connections,
        seconds_per_run: plan.seconds,
        nginx: nginx_exe.as_deref().and_then(nginx::nginx_version),
        wrk: wrk_exe.as_deref().and_then(wrk::wrk_version),
    };
    let missing: Vec<&str> = [("nginx", nginx_exe.is_none()), ("wrk", wrk_exe.is_none())]
        .into_iter()
        .filter_map(|(name, gone)| gone.then_some(name))
        .collect();
    if !missing.is_empty() {
        notes.push(format!(
            "{} not installed, so the nginx baseline is missing and no download was measured: \
             run scripts/bench-setup.sh (Debian packages nginx and wrk)",
            missing.join(" and ")
        ));
    }

    let dir = tempfile::tempdir().map_err(BenchError::io("temporary directory"))?;
    let store = Arc::new(FsStore::open(dir.path().join("store"))?);
    let index = Arc::new(ImageIndex::open(&store.root().join("meta.db"))?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("bench-http")
        .enable_all()
        .build()
        .map_err(BenchError::io("starting the runtime"))?;
    let server = rt.block_on(WebServer::start(
        store.clone(),
        index,
        Arc::new(Registry::builtin()),
        WebConfig::ephemeral(),
    ))?;
    let result = (|| {
        let downloads = match (&nginx_exe, &wrk_exe) {
            (Some(n), Some(w)) => {
                let tools = Tools { nginx: n, wrk: w, workers, wrk_threads };
                downloads(&plan, &tools, server.addr(), store.as_ref(), &say)?
            }
            _ => Vec::new(),
        };
        let ttfi = time_to_first_image(&plan, &server, store.as_ref(), &say)?;
        Ok::<_, BenchError>((downloads, ttfi))
    })();
    rt.block_on(server.shutdown());
    let (downloads, ttfi) = result?;
    let command =
        if opts.quick { "blobstream bench http --quick" } else { "blobstream bench http" };
    Ok(HttpReport {
        downloads,
        setup,
        ttfi,
        notes,
        machine: machine_description(),
        command: command.into(),
    })
}

/// Put `data` into `store` under `key`.
fn store_blob(
    store: &dyn Store,
    key: &str,
    content_type: &str,
    data: &[u8],
) -> Result<(), BenchError> {
    let spec = RouteSpec {
        name: key.into(),
        content_type: content_type.into(),
        overwrite: true,
        ..RouteSpec::default()
    };
    bs_store::put_bytes(store, &spec, data)?;
    Ok(())
}

/// Write `data` to `path` and flush it to disk, as the store does on commit, so both servers
/// read files in the same state (on disk, in the page cache).
fn write_synced(path: &Path, data: &[u8]) -> Result<(), BenchError> {
    let what = || format!("writing {}", path.display());
    let mut f = fs::File::create(path).map_err(BenchError::io(what()))?;
    f.write_all(data).map_err(BenchError::io(what()))?;
    f.sync_all().map_err(BenchError::io(what()))
}

/// GET `path` from `server` and check it is `data`, whole, with status 200 and a matching
/// Content-Length.
fn verify(server: Server, addr: SocketAddr, path: &str, data: &[u8]) -> Result<(), BenchError> {
    let r = get(addr, path)?;
    let corrupt = |detail: String| BenchError::HttpCorrupt {
        server: server.name(),
        url: format!("http://{addr}{path}"),
        detail,
    };
    if r.status != 200 {
        return Err(corrupt(format!("status {}", r.status)));
    }
    if r.content_length() != Some(data.len() as u64) {
        let got = r.header("content-length").unwrap_or("none");
        return Err(corrupt(format!("Content-Length {got}, expected {}", data.len())));
    }
    if r.body.len() != data.len() {
        return Err(corrupt(format!("{} bytes arrived", r.body.len())));
    }
    match data.iter().zip(&r.body).position(|(a, b)| a != b) {
        Some(at) => Err(corrupt(format!("first difference at byte {at}"))),
        None => Ok(()),
    }
}

/// The outside programs and how many cores each side gets.
struct Tools<'a> {
    nginx: &'a Path,
    wrk: &'a Path,
    workers: usize,
    wrk_threads: usize,
}

/// Store every size in both servers, check them, then time them run by run, the servers
/// taking turns.
fn downloads(
    plan: &HttpPlan,
    tools: &Tools<'_>,
    bs_addr: SocketAddr,
    store: &dyn Store,
    say: &dyn Fn(&str),
) -> Result<Vec<DownloadMeasurement>, BenchError> {
    // nginx's own directory: when started as root its workers run as `nobody`.
    let dir = tempfile::tempdir().map_err(BenchError::io("temporary directory for nginx"))?;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))
        .map_err(BenchError::io("opening nginx's temporary directory"))?;
    let cfg = NginxConfig {
        prefix: dir.path().join("prefix"),
        root: dir.path().join("root"),
        port: bs_peers::free_port(),
        worker_processes: tools.workers,
        sendfile: true,
    };
    let ngx = Nginx::start(tools.nginx, &cfg)?;
    // The same files through nginx's other way of sending them; the baseline of each run is
    // whichever nginx was faster in it.
    let cfg_copy = NginxConfig {
        prefix: dir.path().join("prefix-copy"),
        port: bs_peers::free_port(),
        sendfile: false,
        ..cfg.clone()
    };
    let ngx_copy = Nginx::start(tools.nginx, &cfg_copy)?;
    for &size in &plan.sizes {
        say(&format!("storing {} in both servers and checking what they serve", size_text(size)));
        let data = payload(size);
        let key = download_key(size);
        store_blob(store, &key, "application/octet-stream", &data)?;
        let file: PathBuf = cfg.root.join("blobs").join(&key);
        if let Some(parent) = file.parent() {
            fs::create_dir_all(parent)
                .map_err(BenchError::io(format!("creating {}", parent.display())))?;
        }
        write_synced(&file, &data)?;
        let path = format!("/blobs/{key}");
        verify(Server::Blobstream, bs_addr, &path, &data)?;
        verify(Server::Nginx, ngx.addr(), &path, &data)?;
        verify(Server::NginxCopy, ngx_copy.addr(), &path, &data)?;
    }
    let wrk =
        wrk::Wrk::new(tools.wrk.to_path_buf(), dir.path(), tools.wrk_threads, plan.connections)?;
    let mut results: Vec<DownloadMeasurement> = plan
        .sizes
        .iter()
        .map(|&s| DownloadMeasurement { size_bytes: s, blobstream: Vec::new(), nginx: Vec::new() })
        .collect();
    let servers = [Server::Blobstream, Server::Nginx, Server::NginxCopy];
    for rep in 0..=plan.runs {
        let (seconds, label) = match rep {
            0 => (plan.warmup_seconds, "warm-up".to_string()),
            r => (plan.seconds, format!("run {r}/{}", plan.runs)),
        };
        // Which server goes first rotates run by run.
        let mut order = servers;
        order.rotate_left(rep as usize % servers.len());
        for m in &mut results {
            say(&format!(
                "{label}: {} for {seconds} s from {}, {}, then {}",
                size_text(m.size_bytes),
                order[0].name(),
                order[1].name(),
                order[2].name()
            ));
            let mut best_nginx = 0.0f64;
            for server in order {
                let addr = match server {
                    Server::Blobstream => bs_addr,
                    Server::Nginx => ngx.addr(),
                    Server::NginxCopy => ngx_copy.addr(),
                };
                let url = format!("http://{addr}/blobs/{}", download_key(m.size_bytes));
                let run = wrk
                    .run(seconds, &url)
                    .map_err(|e| BenchError::Wrk(format!("against {}: {e}", server.name())))?;
                if rep > 0 {
                    match server {
                        Server::Blobstream => m.blobstream.push(run.bytes_per_s()),
                        Server::Nginx | Server::NginxCopy => {
                            best_nginx = best_nginx.max(run.bytes_per_s())
                        }
                    }
                }
            }
            if rep > 0 {
                m.nginx.push(best_nginx);
            }
        }
    }
    drop(ngx_copy);
    drop(ngx);
    Ok(results)
}

/// Store the 2048² image, time plain GETs of it, then open it in the browser.
fn time_to_first_image(
    plan: &HttpPlan,
    server: &WebServer,
    store: &dyn Store,
    say: &dyn Fn(&str),
) -> Result<TimeToFirstImage, BenchError> {
    let side = ttfi::SIDE;
    say(&format!("time to first image: storing a {side}×{side} 16-bit grayscale PNG"));
    let png = bs_imageio::encode(&test_image(side, "gray16"), bs_imageio::Format::Png)?;
    store_blob(store, ttfi::KEY, "image/png", &png)?;
    // Indexed as an upload over HTTP would be.
    server.state().images.refresh(ttfi::KEY)?;
    let pixel_bytes = (side * side * 2) as u64;
    say(&format!(
        "time to first image: {} plain GETs of the pixels and of the PNG",
        plan.ttfi_runs
    ));
    let (pixels_ms, blob_ms) =
        ttfi::plain_downloads(server.addr(), &png, pixel_bytes, plan.ttfi_runs)?;
    let mut t = ttfi::describe(png.len() as u64, pixels_ms, blob_ms);
    match ttfi::Harness::find() {
        Err(why) => t.not_measured = Some(why),
        Ok(h) => {
            say(&format!(
                "time to first image: {} page loads in headless Chromium after one warm-up",
                plan.ttfi_runs
            ));
            match h.run(&server.url(), ttfi::KEY, plan.ttfi_runs) {
                Ok(ms) => t.browser_ms = ms,
                Err(why) => t.not_measured = Some(why),
            }
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_and_core_split() {
        let q = HttpPlan::new(true);
        assert_eq!(q.sizes, [MB, 32 * MB, 256 * MB]);
        assert!(q.runs >= 3 && q.runs < HttpPlan::new(false).runs);
        assert_eq!(split_cores(1), (1, 1));
        assert_eq!(split_cores(2), (1, 1));
        assert_eq!(split_cores(8), (4, 4));
        assert_eq!(split_cores(3), (1, 2));
    }

    /// The real servers on tiny blobs: both serve the same bytes, and a wrong blob is caught.
    #[test]
    fn verify_catches_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(FsStore::open(dir.path().join("s")).unwrap());
        let index = Arc::new(ImageIndex::open_in_memory().unwrap());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = rt
            .block_on(WebServer::start(
                store.clone(),
                index,
                Arc::new(Registry::builtin()),
                WebConfig::ephemeral(),
            ))
            .unwrap();
        let data = payload(100_000);
        store_blob(store.as_ref(), "bench/x.bin", "application/octet-stream", &data).unwrap();
        verify(Server::Blobstream, server.addr(), "/blobs/bench/x.bin", &data).unwrap();
        let other = payload(100_001);
        let e = verify(Server::Blobstream, server.addr(), "/blobs/bench/x.bin", &other[..100_000])
            .unwrap_err();
        assert!(e.to_string().contains("first difference at byte"), "{e}");
        let e = verify(Server::Blobstream, server.addr(), "/blobs/bench/nope", &data).unwrap_err();
        assert!(e.to_string().contains("status 404"), "{e}");
        rt.block_on(server.shutdown());
    }
}
