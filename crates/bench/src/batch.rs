//! `blobstream bench batch`: a study of many small blobs — 50 files of 250 KB, as a modality
//! sends them — through `put -r` and `get -r` (the `blobstream` process, as a user runs it),
//! against the same bytes through one raw TCP connection (a tar-style stream of length-prefixed
//! files, one fsync at the end on the receiver) and against 50 single `put` processes. Paired
//! runs, alternating which goes first; medians. Then 10,000 blobs of 4 KiB through the Blob
//! API against the HTTP API (see [`crate::small`]).

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use bs_server::{BackgroundServer, ServerConfig};
use bs_store::FsStore;

use crate::bindings::{Row, RowsReport};
use crate::error::BenchError;
use crate::machine::machine_description;
use crate::options::BenchOptions;
use crate::payload::{median, payload};

const FILES: usize = 50;
const FILE_SIZE: u64 = 250_000;

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Invalid(e.to_string())
}

/// Run `bin` with `args`; an error names the command and what it printed.
fn run(bin: &Path, args: &[&str]) -> Result<(), BenchError> {
    let o = Command::new(bin).args(args).output().map_err(BenchError::io("starting blobstream"))?;
    if !o.status.success() {
        let e = String::from_utf8_lossy(&o.stderr);
        return Err(err(format!("blobstream {}: {}", args.join(" "), e.trim())));
    }
    Ok(())
}

/// The raw baseline: every file of `dir` length-prefixed down one TCP connection; the
/// receiver writes the stream to one file and fsyncs it once. Returns seconds.
fn raw_tcp(dir: &Path, out: &Path) -> Result<f64, BenchError> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(BenchError::io("raw listen"))?;
    let addr = l.local_addr().map_err(BenchError::io("raw listen"))?;
    let out = out.to_path_buf();
    let t = Instant::now();
    let rx = thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = l.accept()?;
        let mut f = std::fs::File::create(&out)?;
        let n = std::io::copy(&mut s, &mut f)?;
        f.sync_all()?;
        Ok(n)
    });
    let mut s = TcpStream::connect(addr).map_err(BenchError::io("raw connect"))?;
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map_err(BenchError::io("raw read_dir"))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    names.sort();
    let mut sent = 0;
    for p in &names {
        let bytes = std::fs::read(p).map_err(BenchError::io("raw read"))?;
        let name = p.file_name().unwrap_or_default().as_encoded_bytes();
        s.write_all(&(name.len() as u32).to_le_bytes()).map_err(BenchError::io("raw send"))?;
        s.write_all(name).map_err(BenchError::io("raw send"))?;
        s.write_all(&(bytes.len() as u64).to_le_bytes()).map_err(BenchError::io("raw send"))?;
        s.write_all(&bytes).map_err(BenchError::io("raw send"))?;
        sent += 12 + name.len() as u64 + bytes.len() as u64;
    }
    drop(s);
    let got = rx.join().map_err(|_| err("raw receiver panicked"))?;
    let got = got.map_err(BenchError::io("raw receive"))?;
    if got != sent {
        return Err(err(format!("the raw receiver got {got} of {sent} bytes")));
    }
    Ok(t.elapsed().as_secs_f64())
}

/// MB/s for the study moved in `secs`.
fn rate(secs: f64) -> f64 {
    (FILES as u64 * FILE_SIZE) as f64 / 1e6 / secs
}

pub fn run_batch(opts: &BenchOptions, bin: &Path) -> Result<RowsReport, BenchError> {
    let runs = if opts.quick { 2 } else { 5 };
    let tmp = tempfile::tempdir().map_err(BenchError::io("temp dir"))?;
    let study = tmp.path().join("study");
    std::fs::create_dir_all(&study).map_err(BenchError::io("study dir"))?;
    let data = payload(FILES as u64 * FILE_SIZE);
    for (i, chunk) in data.chunks(FILE_SIZE as usize).enumerate() {
        std::fs::write(study.join(format!("IM{i:04}.dcm")), chunk)
            .map_err(BenchError::io("writing the study"))?;
    }
    let store = FsStore::open(tmp.path().join("store"))?;
    let server = BackgroundServer::start(Arc::new(store), ServerConfig::ephemeral())?;
    let addr = server.control_addr().to_string();
    let study_s = study.to_str().ok_or_else(|| err("temp path is not UTF-8"))?;
    let bs = |args: &[&str]| {
        let mut all = vec!["-q", "--server", &addr];
        all.extend_from_slice(args);
        run(bin, &all)
    };
    let (mut put_r, mut get_r, mut singles, mut raw) = (vec![], vec![], vec![], vec![]);
    for i in 0..runs {
        opts.say(&format!("run {} of {runs}: put -r, get -r, 50 single puts, raw TCP", i + 1));
        let prefix = format!("runs/{i}/");
        let raw_run = |n: usize| raw_tcp(&study, &tmp.path().join(format!("raw-{i}-{n}.tar")));
        if i % 2 == 1 {
            raw.push(raw_run(0)?);
        }
        let t = Instant::now();
        bs(&["put", "-r", study_s, &prefix])?;
        put_r.push(t.elapsed().as_secs_f64());
        let back = tmp.path().join(format!("back-{i}"));
        let t = Instant::now();
        bs(&["get", "-r", &prefix, back.to_str().ok_or_else(|| err("temp path"))?])?;
        get_r.push(t.elapsed().as_secs_f64());
        for (k, chunk) in data.chunks(FILE_SIZE as usize).enumerate() {
            let got = std::fs::read(back.join(format!("IM{k:04}.dcm")))
                .map_err(BenchError::io("reading what get -r wrote"))?;
            if got != chunk {
                return Err(err(format!("get -r wrote other bytes for IM{k:04}.dcm")));
            }
        }
        if i % 2 == 0 {
            raw.push(raw_run(1)?);
        }
        let t = Instant::now();
        for k in 0..FILES {
            let f = study.join(format!("IM{k:04}.dcm"));
            let key = format!("singles/{i}/IM{k:04}.dcm");
            bs(&["put", f.to_str().ok_or_else(|| err("temp path"))?, &key])?;
        }
        singles.push(t.elapsed().as_secs_f64());
    }
    let (p, g, s, r) = (median(&put_r), median(&get_r), median(&singles), median(&raw));
    let study_mb = (FILES as u64 * FILE_SIZE) as f64 / 1e6;
    let what = |how: &str| format!("50 × 250 KB study ({study_mb:.1} MB), {how}");
    let raw_name = "one raw TCP connection, a tar-style stream, one fsync at the end";
    // A row from the seconds ours and the baseline took for the same study.
    let row = |how: &str, ours: f64, base: f64, base_name: &str, target: f64| Row {
        group: "study",
        what: what(how),
        ours: rate(ours),
        baseline: rate(base),
        baseline_name: base_name.into(),
        unit: "MB/s",
        ratio: base / ours,
        ratio_means: "ours / baseline",
        target: Some((target, true)),
    };
    let mut rows = vec![
        row("put -r", p, r, raw_name, 0.5),
        row("get -r", g, r, raw_name, 0.5),
        row("put -r", p, s, "50 single `blobstream put` processes", 5.0),
    ];
    let (small, small_note) = crate::small::small_blob_rows(opts)?;
    rows.extend(small);
    let notes = vec![
        "put -r and get -r are timed as a user runs them: the `blobstream` process from start to \
         exit, 8 files in flight (the default --jobs), every file checked end to end; the server \
         keeps blobs in its filesystem store (each blob fsync'd before it is acknowledged)"
            .into(),
        format!("get -r checked byte for byte after each run; {runs} paired runs"),
        small_note,
    ];
    Ok(RowsReport {
        title: "Batch",
        command: "blobstream bench batch",
        runs,
        machine: machine_description(),
        quick: opts.quick,
        rows,
        notes,
    })
}
