//! `blobstream bench dicomweb`: STOW-RS of a 200-slice CT series (512 × 512, 16-bit) and WADO-RS
//! retrieval of the whole series, blobstream against Orthanc (Debian's `orthanc` with its
//! `orthanc-dicomweb` plugin) doing the same on the same machine, each on its own disk
//! directory, paired runs in alternating order, medians. Every run stores a new study (its UIDs
//! changed), so neither server can skip instances it already has.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bs_imaging::Registry;
use bs_meta::ImageIndex;
use bs_store::FsStore;
use bs_web::{WebConfig, WebServer};

use crate::bindings::{Row, RowsReport};
use crate::error::BenchError;
use crate::http::get::request;
use crate::machine::machine_description;
use crate::options::BenchOptions;
use crate::payload::median;

const ORTHANC: &str = "/usr/sbin/Orthanc";
const DICOMWEB_PLUGIN: &str = "/usr/share/orthanc/plugins/libOrthancDicomWeb.so";

/// Orthanc on a loopback port with its own storage in `dir`; stopped on drop.
struct Orthanc {
    child: Child,
    addr: SocketAddr,
}

impl Orthanc {
    fn start(dir: &Path) -> Result<Self, BenchError> {
        let port = bs_peers::free_port();
        let config = serde_json::json!({
            "Name": "bench",
            "StorageDirectory": dir.join("storage"),
            "IndexDirectory": dir.join("index"),
            "HttpPort": port,
            "DicomServerEnabled": false,
            "RemoteAccessAllowed": false,
            "AuthenticationEnabled": false,
            "StorageCompression": false,
            "HttpCompressionEnabled": false,
            "Plugins": [DICOMWEB_PLUGIN],
            "DicomWeb": { "Enable": true, "Root": "/dicom-web/" },
        });
        let path = dir.join("orthanc.json");
        std::fs::write(&path, config.to_string()).map_err(BenchError::io("Orthanc config"))?;
        let child = Command::new(ORTHANC)
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(BenchError::io("starting Orthanc"))?;
        let o = Orthanc { child, addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if request(o.addr, "GET", "/system", &[], &[]).is_ok_and(|r| r.status == 200) {
                return Ok(o);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(BenchError::Invalid("Orthanc did not answer within 60 s".into()))
    }
}

impl Drop for Orthanc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A series of `count` slices whose UIDs all carry `digits` (33 of them) instead of the
/// samples' own, and its multipart/related body.
fn series(count: u16, digits: &str, boundary: &str) -> (Vec<u8>, String, String, u64) {
    let mut body = Vec::new();
    let mut bytes = 0u64;
    for i in 0..count {
        let mut f = bs_web::samples::ct_slice_of(512, i, count);
        let old = bs_web::samples::UID_DIGITS.as_bytes();
        let mut at = 0;
        while let Some(p) = f[at..].windows(old.len()).position(|w| w == old) {
            f[at + p..at + p + old.len()].copy_from_slice(digits.as_bytes());
            at += p + old.len();
        }
        bytes += f.len() as u64;
        body.extend_from_slice(
            format!("--{boundary}\r\nContent-Type: application/dicom\r\n\r\n").as_bytes(),
        );
        body.extend_from_slice(&f);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (body, format!("2.25.{digits}.1"), format!("2.25.{digits}.4"), bytes)
}

/// Store `body` at `root` (`/dicomweb` or `/dicom-web`) and retrieve the series: the two times.
fn round(
    addr: SocketAddr,
    root: &str,
    body: &[u8],
    boundary: &str,
    study: &str,
    series: &str,
    stored_bytes: u64,
) -> Result<(f64, f64), BenchError> {
    let ct = format!("multipart/related; type=\"application/dicom\"; boundary={boundary}");
    let t = Instant::now();
    let r = request(
        addr,
        "POST",
        &format!("{root}/studies"),
        &[("Content-Type", &ct), ("Accept", "application/dicom+json")],
        body,
    )?;
    let stow = t.elapsed().as_secs_f64();
    if r.status != 200 {
        return Err(BenchError::Http(format!(
            "STOW-RS to {root}: status {}: {}",
            r.status,
            String::from_utf8_lossy(&r.body[..r.body.len().min(300)])
        )));
    }
    let t = Instant::now();
    let accept = "multipart/related; type=\"application/dicom\"";
    let r = request(
        addr,
        "GET",
        &format!("{root}/studies/{study}/series/{series}"),
        &[("Accept", accept)],
        &[],
    )?;
    let wado = t.elapsed().as_secs_f64();
    if r.status != 200 || (r.body.len() as u64) < stored_bytes {
        return Err(BenchError::Http(format!(
            "WADO-RS from {root}: status {}, {} bytes for {stored_bytes} stored",
            r.status,
            r.body.len()
        )));
    }
    Ok((stow, wado))
}

/// Run the benchmark (Orthanc from `scripts/bench-setup.sh`).
pub fn run_dicomweb(opts: &BenchOptions) -> Result<RowsReport, BenchError> {
    if !Path::new(ORTHANC).exists() || !Path::new(DICOMWEB_PLUGIN).exists() {
        return Err(BenchError::Invalid(
            "Orthanc and its DICOMweb plugin are not installed: run scripts/bench-setup.sh".into(),
        ));
    }
    let (runs, count) = if opts.quick { (2, 50u16) } else { (5, 200u16) };
    let dir = tempfile::tempdir().map_err(BenchError::io("temp dir"))?;
    let orthanc_dir = dir.path().join("orthanc");
    std::fs::create_dir_all(&orthanc_dir).map_err(BenchError::io("bench directory"))?;
    let orthanc = Orthanc::start(&orthanc_dir)?;
    let store = Arc::new(FsStore::open(dir.path().join("blobstream"))?);
    let index = Arc::new(ImageIndex::open(&store.root().join("meta.db"))?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BenchError::io("starting the runtime"))?;
    let cfg = WebConfig::ephemeral();
    let server = rt.block_on(WebServer::start(store, index, Arc::new(Registry::builtin()), cfg))?;
    let ours_addr = server.addr();
    let boundary = "bench-boundary-7d1e";
    let (mut os, mut ow, mut bs, mut bw) = (vec![], vec![], vec![], vec![]);
    let mut mb = 0.0;
    let mut last_series = String::new();
    for run in 0..runs {
        opts.say(&format!("{count} slices: run {} of {runs}", run + 1));
        let ours = format!("{:033}", 100_000 + run);
        let theirs = format!("{:033}", 200_000 + run);
        let (ob, ostudy, oseries, obytes) = series(count, &ours, boundary);
        let (tb, tstudy, tseries, tbytes) = series(count, &theirs, boundary);
        mb = obytes as f64 / 1e6;
        let ours_round = || round(ours_addr, "/dicomweb", &ob, boundary, &ostudy, &oseries, obytes);
        let their_round =
            || round(orthanc.addr, "/dicom-web", &tb, boundary, &tstudy, &tseries, tbytes);
        let ((s1, w1), (s2, w2)) = if run % 2 == 0 {
            let a = ours_round()?;
            (a, their_round()?)
        } else {
            let b = their_round()?;
            (ours_round()?, b)
        };
        last_series = oseries.clone();
        os.push(s1);
        ow.push(w1);
        bs.push(s2);
        bw.push(w2);
    }
    opts.say("series viewer in headless Chromium");
    let viewer = viewer_timing(ours_addr, &last_series, if opts.quick { 1 } else { 3 });
    rt.block_on(server.shutdown());
    drop(orthanc);
    let row = |what: &str, ours: &[f64], theirs: &[f64]| {
        let (o, t) = (median(ours), median(theirs));
        Row {
            group: "DICOMweb",
            what: format!("{what}, {count} CT slices of 512 × 512 ({mb:.0} MB)"),
            ours: mb / o,
            baseline: mb / t,
            baseline_name: "Orthanc 1.10 + DICOMweb plugin".into(),
            unit: "MB/s",
            ratio: t / o,
            ratio_means: "ours / baseline",
            target: Some((1.0, true)),
        }
    };
    let rows = vec![row("STOW-RS of the series", &os, &bs), row("WADO-RS of the series", &ow, &bw)];
    let notes = vec![
        "both servers on loopback with their own directory on the same disk; blobstream stores \
         each instance, fsyncs it, checks its digest and indexes it (decoding its pixels) before \
         answering; Orthanc stores and indexes in its SQLite"
            .into(),
        "WADO-RS: the whole series as multipart/related application/dicom, read to the last byte; \
         blobstream checks every chunk's digest on the way out"
            .into(),
        format!("{runs} paired runs in alternating order, each with a new study; medians"),
        match viewer {
            Ok(v) => format!(
                "series viewer (headless Chromium, a fresh browser context per load, median of the \
                 loads after a warm-up): the {}-slice series opened by link, first slice drawn after \
                 {:.0} ms, every slice fetched ahead into its cache after {:.0} ms",
                v.slices, v.first_slice_ms, v.all_cached_ms
            ),
            Err(why) => format!("series viewer not measured: {why}"),
        },
    ];
    Ok(RowsReport {
        title: "DICOMweb",
        command: "blobstream bench dicomweb",
        runs,
        machine: machine_description(),
        quick: opts.quick,
        rows,
        notes,
    })
}

#[derive(serde::Deserialize)]
struct ViewerTiming {
    first_slice_ms: f64,
    all_cached_ms: f64,
    slices: u64,
}

/// Open the series in headless Chromium through `web-tests/series-timing.mjs`.
fn viewer_timing(addr: SocketAddr, series: &str, runs: u32) -> Result<ViewerTiming, String> {
    let node = crate::paths::find_on_path("node").ok_or("node is not installed")?;
    let roots = [
        std::path::PathBuf::from("."),
        std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")),
    ];
    let script = roots
        .iter()
        .map(|r| r.join("web-tests/series-timing.mjs"))
        .find(|p| p.is_file() && p.with_file_name("node_modules/playwright-core").is_dir())
        .ok_or("web-tests/series-timing.mjs with playwright-core beside it not found (scripts/browser-setup.sh)")?;
    let out = Command::new(node)
        .arg(&script)
        .arg(format!("http://{addr}/"))
        .arg(series)
        .arg(runs.to_string())
        .output()
        .map_err(|e| format!("running node: {e}"))?;
    if !out.status.success() {
        return Err(format!("series-timing.mjs: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().ok_or("series-timing.mjs printed nothing")?;
    serde_json::from_str(last).map_err(|e| format!("series-timing.mjs output {last:?}: {e}"))
}
