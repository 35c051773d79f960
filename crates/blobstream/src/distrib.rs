//! `blobstream distributer`, `send` and `receive`: the distributer's three roles as processes.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bs_client::{Client, PushStream, RouteRequest};
use bs_distrib::{Config, Distributer, FlowHandler, Params, Receiver, RunEnd, Sender, Target};

use crate::cli::{DistributerArgs, DistributerCommand, FlowArgs, Global, ReceiveArgs, SendArgs};
use crate::progress;

pub fn distributer(a: DistributerArgs) -> Result<()> {
    if let Some(DistributerCommand::Status { addr, json, token, distributer_ca }) = a.command {
        let tls = crate::security::trust(distributer_ca.as_deref(), None)?;
        return status(&addr, json, &bs_plane::Credentials { tls, token });
    }
    let Some(path) = a.config else {
        crate::commands::usage!("--config FILE is required (see docs/distributer.md)");
    };
    let cfg = Config::load(&path)?;
    let (d, secure, over) = start(cfg, ("--addr", &a.addr), &a.tls, &a.status_token)?;
    let (rt, status, says) = status_listener(&a.status_addr, &secure)?;
    println!("blobstream distributer listening on {} ({over})", d.addr());
    println!("  {says}");
    for s in &d.config().streams {
        for f in &s.flows {
            let over = match f.transport {
                bs_distrib::Transport::Tcp => "tcp".to_string(),
                bs_distrib::Transport::Udp { datagram } => {
                    format!("udp (datagrams of up to {datagram} bytes)")
                }
            };
            println!(
                "  {}/{}: {over}, policy {}, chunk {} bytes",
                s.name, f.name, f.policy, f.chunk
            );
        }
    }
    // Runs until SIGTERM or SIGINT; connections end with the process.
    let source = d.status_source();
    let sig = rt.block_on(async {
        let mut s = crate::signals::Signals::install()?;
        tokio::select! {
            sig = s.next() => Ok::<_, std::io::Error>(sig),
            res = bs_distrib::service::serve(status, source, secure) => {
                res?;
                Ok("the status service ended")
            }
        }
    })?;
    // Best effort: whoever read our output may be gone by now.
    let _ = writeln!(std::io::stdout(), "{sig}: distributer stopped");
    Ok(())
}

/// A distributer of `cfg` on the address a flag gave (its name, its value), in TLS when `tls`
/// has a certificate; with what its status service asks (TLS as it, `status_token`) and what
/// it speaks.
fn start(
    cfg: Config,
    (flag, addr): (&str, &str),
    tls: &crate::cli::ServerTls,
    status_token: &Option<String>,
) -> Result<(Distributer, bs_plane::Secure, &'static str)> {
    let at: std::net::SocketAddr = addr.parse().with_context(|| format!("{flag} {addr:?}"))?;
    let tls = crate::security::server_tls(tls)?;
    let over = if tls.is_some() { "TLS" } else { "plain TCP" };
    let secure =
        bs_plane::Secure { tls: tls.clone(), token: status_token.clone(), ..Default::default() };
    let d =
        Distributer::start_with_tls(cfg, at, tls).with_context(|| format!("listening on {at}"))?;
    Ok((d, secure, over))
}

/// The status service's listener on `addr`, bound on a runtime of its own, and a line saying
/// where it is and what it asks.
fn status_listener(
    addr: &str,
    secure: &bs_plane::Secure,
) -> Result<(tokio::runtime::Runtime, tokio::net::TcpListener, String)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("--status-addr {addr}"))?;
    let at = listener.local_addr()?;
    let says = format!("status (gRPC) and /metrics ({}) on {at}", secure.describe());
    Ok((rt, listener, says))
}

fn status(addr: &str, json: bool, creds: &bs_plane::Credentials) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let flows = rt.block_on(bs_distrib::service::fetch(addr, creds))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&flows)?);
        return Ok(());
    }
    for f in flows {
        let state = match (f.sender, f.running) {
            (true, true) => "running",
            (true, false) => "sender connected",
            _ => "no sender",
        };
        println!("{}/{} ({}, {}, {state})", f.stream, f.flow, f.transport, f.policy);
        for r in f.receivers {
            let err = r.last_error.map(|e| format!(", last error: {e}")).unwrap_or_default();
            let lost = if f.transport == "udp" {
                format!(", {} datagrams lost", r.lost)
            } else {
                String::new()
            };
            if r.connected {
                println!(
                    "  {:<20} {} bytes delivered ({:.1} MB/s), {} queued ({} bytes){lost}{err}",
                    r.name,
                    r.delivered,
                    r.rate_bytes_per_second / 1e6,
                    r.queued_messages,
                    r.queued_bytes
                );
            } else {
                println!(
                    "  {:<20} gone after {} bytes of its last run{lost}{err}",
                    r.name, r.delivered
                );
            }
        }
    }
    Ok(())
}

fn param_value(v: &str) -> serde_json::Value {
    match serde_json::from_str::<serde_json::Value>(v) {
        Ok(n @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => n,
        _ => serde_json::Value::String(v.to_string()),
    }
}

/// The distributer `f` names, over TLS when it gives a CA to trust.
fn target(f: &FlowArgs) -> Result<Target> {
    let t = Target::from(&f.distributer);
    Ok(match crate::security::trust(f.distributer_ca.as_deref(), None)? {
        Some(tls) => t.with_tls(tls),
        None => t,
    })
}

pub fn send(g: &Global, a: SendArgs) -> Result<()> {
    let f = &a.flow;
    // The input first: one that cannot be read starts no run on every receiver.
    let (mut input, size): (Box<dyn Read>, Option<u64>) = if a.file == "-" {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        let file = File::open(&a.file).with_context(|| format!("opening {}", a.file))?;
        let meta = file.metadata().with_context(|| format!("reading {}", a.file))?;
        if meta.is_dir() {
            bail!("{} is a directory: send takes one file (or - for standard input)", a.file);
        }
        (Box::new(file), Some(meta.len()).filter(|_| meta.is_file()))
    };
    // With --serve this process is the distributer too: declared before the sender, so the
    // sender goes first however this ends (a run it leaves is aborted), then the distributer,
    // once the receivers have been told.
    let serving = match &a.serve {
        Some(path) => Some(Serving(Some(serve_flow(g, &a, path)?))),
        None => None,
    };
    let mut s = match serving.as_ref().and_then(|s| s.0.as_ref()) {
        Some(d) => d.sender(&f.stream, &f.flow)?,
        None => {
            if a.tls.tls_cert.is_some() {
                crate::commands::usage!("--tls-cert serves TLS with --serve only");
            }
            Sender::connect(target(f)?, &f.stream, &f.flow, f.token.as_deref())
                .with_context(|| format!("joining {}/{} as its sender", f.stream, f.flow))?
        }
    };
    let params: Params = a.params.iter().map(|(k, v)| (k.clone(), param_value(v))).collect();
    s.start(&params)?;
    let pb = progress::bar(&format!("{}/{}", f.stream, f.flow));
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", a.file)),
        };
        s.send(&buf[..n])?;
        progress::update(&pb, s.position(), size.unwrap_or(0), g.quiet);
        for d in s.take_dropped() {
            pb.suspend(|| {
                eprintln!("receiver {} dropped after {} bytes: {}", d.name, d.delivered, d.reason)
            });
        }
    }
    let report = s.stop()?;
    pb.finish_and_clear();
    let n = report.receivers.len();
    println!("sent {} bytes to {n} receiver{}", report.total, if n == 1 { "" } else { "s" });
    if report.receivers.is_empty() {
        // Not a failure (no receiver was left out), but rarely what was meant.
        eprintln!(
            "warning: no receiver had joined {}/{}: the run reached nobody",
            f.stream, f.flow
        );
    }
    let mut failed = 0;
    for r in &report.receivers {
        if r.ok {
            println!("  {:<20} ok ({} bytes, digest verified)", r.name, r.delivered);
        } else {
            failed += 1;
            println!("  {:<20} FAILED after {} bytes: {}", r.name, r.delivered, r.reason);
            if r.lost > 0 {
                println!("  {:<20} {} datagrams lost", "", r.lost);
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} receivers did not get every byte", report.receivers.len());
    }
    Ok(())
}

/// `send --serve`: a distributer in this process on --distributer's address, once the flow
/// has the receivers asked for.
fn serve_flow(g: &Global, a: &SendArgs, path: &Path) -> Result<Distributer> {
    let f = &a.flow;
    let cfg = Config::load(path)?;
    cfg.flow(&f.stream, &f.flow)?;
    let (d, secure, over) = start(cfg, ("--distributer", &f.distributer), &a.tls, &a.status_token)?;
    // The status service, for as long as this process runs.
    let status = match &a.status_addr {
        Some(at) => {
            let (rt, listener, says) = status_listener(at, &secure)?;
            let source = d.status_source();
            std::thread::Builder::new().name("status".into()).spawn(move || {
                if let Err(e) = rt.block_on(bs_distrib::service::serve(listener, source, secure)) {
                    tracing::warn!(error = %e, "the status service ended");
                }
            })?;
            Some(says)
        }
        None => None,
    };
    let want = a.receivers;
    let wait = std::time::Duration::from_secs(a.wait);
    if !g.quiet {
        eprintln!(
            "serving {}/{} on {} ({over}): waiting for {want} receiver{}",
            f.stream,
            f.flow,
            d.addr(),
            if want == 1 { "" } else { "s" }
        );
        if let Some(says) = status {
            eprintln!("  {says}");
        }
    }
    let joined = d.wait_for_receivers(&f.stream, &f.flow, want, wait)?;
    if joined < want {
        bail!(
            "{joined} of {want} receivers joined {}/{} within {} s (--wait): nothing sent",
            f.stream,
            f.flow,
            a.wait
        );
    }
    Ok(d)
}

/// `send --serve`'s distributer: stopped once its receivers have been written what is queued
/// for them (at most [`TELL_WITHIN`]), so a run the sender leaves ends for them with why.
struct Serving(Option<Distributer>);

const TELL_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            d.stop(TELL_WITHIN);
        }
    }
}

/// Writes each run to `DIR/.NAME.blobstream-part` (hidden: no run is named so, nor is a file a
/// user keeps there likely to be); makes it `DIR/NAME` once verified.
struct ToFiles {
    dir: PathBuf,
    run: u64,
    /// When the current run started here.
    started: std::time::Instant,
    current: Option<(File, PathBuf, PathBuf)>,
    error: Option<String>,
}

/// A run's name from its `name` parameter, if it has one: a relative path of plain parts
/// (`obs/2026/x.bin`: folders under the output directory, or in the blob's key), or why
/// it cannot be one — a run is refused rather than stored under a name nobody gave.
fn named(p: &Params) -> Result<Option<String>, String> {
    let Some(v) = p.get("name") else { return Ok(None) };
    let Some(n) = v.as_str() else {
        return Err(format!("the run's name parameter is {v}, not text"));
    };
    let refuse = |why: &str| Err(format!("the run's name {:?} {why}", crate::commands::shown(n)));
    if n.is_empty() {
        return refuse("is empty");
    }
    if n.chars().any(char::is_control) {
        return refuse("holds a control character");
    }
    if n.starts_with('/') {
        return refuse("is absolute: it must be a path under the receiver's output");
    }
    for part in n.split('/') {
        if part.is_empty() || part.starts_with('.') {
            return refuse(
                "has an empty part, or one starting with '.' (\"..\", a hidden file): \
                 give it as folder/file names",
            );
        }
    }
    Ok(Some(n.to_string()))
}

/// Where a run named `name` is written until it is verified: a hidden file next to it.
fn part_path(dir: &Path, name: &str) -> PathBuf {
    let done = dir.join(name);
    let file = done.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    done.with_file_name(format!(".{file}.blobstream-part"))
}

/// An unnamed run's number: the first N from `run` up whose `run-N` is not `taken` — a
/// receiver started again counts from 1 again, and must not replace the runs it kept before.
fn unnamed(run: u64, taken: impl Fn(&str) -> bool) -> u64 {
    // (Bounded: past so many, the run takes the last and is refused by name, said.)
    (run..run + 100_000).find(|n| !taken(&format!("run-{n}"))).unwrap_or(run + 100_000)
}

/// The part file of an unnamed run in `dir`: the first `run-N` (N from `run` up) neither
/// `taken` nor held by another receiver — one that claimed it between the look and the claim
/// is passed over, so the unnamed runs of two receivers in one folder never meet.
fn claim_unnamed(
    dir: &Path,
    run: u64,
    taken: impl Fn(&str) -> bool,
) -> Result<(std::fs::File, PathBuf, PathBuf), Claim> {
    let mut from = run;
    loop {
        let n = unnamed(from, &taken);
        match claim(dir, &format!("run-{n}")) {
            Err(Claim::Held(_)) if n < run + 100 => from = n + 1,
            other => return other,
        }
    }
}

/// Why a run's part file could not be had: another receiver holds it (a run of the same name
/// into the same folder, at the same moment), or something else went wrong; both say which.
enum Claim {
    Held(String),
    Failed(String),
}

impl Claim {
    fn message(self) -> String {
        match self {
            Claim::Held(m) | Claim::Failed(m) => m,
        }
    }
}

/// The part file of a run named `name` in `dir`, created (or taken over from a receiver killed
/// mid-run), locked and empty, with the path it is kept under once verified.
fn claim(dir: &Path, name: &str) -> Result<(std::fs::File, PathBuf, PathBuf), Claim> {
    use bs_blob::partlock::PartLock;
    let done = dir.join(name);
    let part = part_path(dir, name);
    if let Some(folder) = done.parent()
        && let Err(e) = std::fs::create_dir_all(folder)
    {
        return Err(Claim::Failed(format!("cannot create {}: {e}", folder.display())));
    }
    // A run replaces no file: one kept before (a verified run, say) stays as it is.
    if done.exists() {
        return Err(Claim::Failed(format!(
            "{} already exists (a run replaces no file): move it away, or send the run under \
             another name",
            done.display()
        )));
    }
    // Locked while written: a part file another receiver holds (a run of the same name into
    // the same folder) is not written over; one nobody holds (a receiver killed mid-run left
    // it) is taken over; one another receiver just kept under its name (linked into place,
    // the file is its NAME now) is not emptied.
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    let f = match bs_blob::partlock::lock_part(&part, &options) {
        Ok(PartLock::Ours(f)) => f,
        Ok(PartLock::Held) => {
            return Err(Claim::Held(format!(
                "{} is being written by another receiver (a run of the same name into the \
                 same folder)",
                part.display()
            )));
        }
        Ok(PartLock::Replaced) => {
            return Err(Claim::Held(format!(
                "{} changed while it was opened (another receiver's run of the same name \
                 into the same folder)",
                part.display()
            )));
        }
        Err(e) => return Err(Claim::Failed(format!("cannot open {}: {e}", part.display()))),
    };
    f.set_len(0).map_err(|e| Claim::Failed(format!("cannot write {}: {e}", part.display())))?;
    Ok((f, part, done))
}

impl FlowHandler for ToFiles {
    fn on_start(&mut self, p: &Params) {
        self.run += 1;
        self.error = None;
        self.started = std::time::Instant::now();
        let dir = &self.dir;
        let claimed = match named(p) {
            Ok(Some(name)) => claim(dir, &name),
            // The first number free in this folder: one another receiver is writing is taken
            // too.
            Ok(None) => {
                claim_unnamed(dir, self.run, |n| dir.join(n).exists() || part_path(dir, n).exists())
            }
            Err(why) => Err(Claim::Failed(why)),
        };
        match claimed {
            Ok(current) => self.current = Some(current),
            Err(why) => self.error = Some(why.message()),
        }
    }

    fn on_data(&mut self, offset: u64, data: &[u8]) {
        use std::os::unix::fs::FileExt;
        // At its offset: on a udp flow a loss leaves a hole (and the run then fails).
        if let Some((f, part, _)) = &mut self.current
            && self.error.is_none()
            && let Err(e) = f.write_all_at(data, offset)
        {
            self.error = Some(format!("writing {}: {e}", part.display()));
        }
    }

    fn on_stop(&mut self, total: u64) -> Result<(), String> {
        let current = self.current.take();
        // Why the run failed, if it did: what went wrong first (its file perhaps never made).
        if let Some(e) = self.error.take() {
            if let Some((_, part, _)) = current {
                let _ = std::fs::remove_file(&part);
            }
            return Err(e);
        }
        let (f, part, done) = current.ok_or("no file for this run")?;
        f.sync_all().map_err(|e| format!("syncing {}: {e}", part.display()))?;
        // Linked, then unlinked, rather than renamed: a rename would replace a file that
        // took the name meanwhile; a link fails instead (the run's bytes stay in the part).
        match std::fs::hard_link(&part, &done) {
            Ok(()) => {
                let _ = std::fs::remove_file(&part);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(format!(
                    "{} appeared during the run (a run replaces no file); the run is kept in {}",
                    done.display(),
                    part.display()
                ));
            }
            // A file system without hard links (vfat, some network shares): renamed, the
            // name checked just before.
            Err(_) if !done.exists() => std::fs::rename(&part, &done)
                .map_err(|e| format!("keeping {} as {}: {e}", part.display(), done.display()))?,
            Err(e) => return Err(format!("keeping {} as {}: {e}", part.display(), done.display())),
        }
        if let Some(d) = done.parent().and_then(|d| File::open(d).ok()) {
            let _ = d.sync_all();
        }
        let secs = self.started.elapsed().as_secs_f64();
        println!(
            "{}: {total} bytes, digest verified ({secs:.3} s, {:.1} Mbit/s)",
            done.display(),
            total as f64 * 8.0 / secs.max(1e-9) / 1e6
        );
        Ok(())
    }

    // The reason is said by receive_runs, with the failures at the stop.
    fn on_error(&mut self, _reason: &str) {
        if let Some((_, part, _)) = self.current.take() {
            let _ = std::fs::remove_file(&part);
        }
    }
}

/// The archive receiver: writes each run into the blob store, committed only on a verified
/// stop, so the archive never shows a partial observation.
struct IntoStore {
    client: Client,
    prefix: String,
    run: u64,
    current: Option<(String, PushStream)>,
    error: Option<String>,
}

impl FlowHandler for IntoStore {
    fn on_start(&mut self, p: &Params) {
        self.run += 1;
        self.error = None;
        let (client, prefix) = (&self.client, &self.prefix);
        let name = match named(p) {
            Ok(Some(name)) => name,
            // Only a blob there takes the number: a store that cannot be asked leaves it to
            // the push, which says why.
            Ok(None) => {
                let n = unnamed(self.run, |n| client.stat(&format!("{prefix}{n}")).is_ok());
                format!("run-{n}")
            }
            Err(why) => {
                self.error = Some(why);
                return;
            }
        };
        let key = format!("{prefix}{name}");
        let text = |v: &serde_json::Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
        let route = RouteRequest {
            name: key.clone(),
            size: None,
            content_type: p.get("content_type").map(text).unwrap_or_default(),
            metadata: p.iter().map(|(k, v)| (k.clone(), text(v))).collect(),
            ..RouteRequest::default()
        };
        match self.client.open_push(&key, 0, None, Some(route)) {
            Ok(push) => self.current = Some((key, push)),
            // As into a folder: a run replaces nothing kept before.
            Err(bs_client::ClientError::AlreadyExists(_)) => {
                self.error = Some(format!(
                    "{key} already exists in the store (a run replaces no blob): remove it, \
                     or send the run under another name"
                ))
            }
            Err(e) => self.error = Some(format!("cannot store {key}: {e}")),
        }
    }

    fn on_loss(&mut self, offset: u64, len: u64) {
        // The blob can no longer be whole: write nothing more of it (on_error aborts it).
        self.error.get_or_insert_with(|| format!("{len} bytes lost at offset {offset}"));
    }

    fn on_data(&mut self, _offset: u64, data: &[u8]) {
        if let Some((key, push)) = &mut self.current
            && self.error.is_none()
            && let Err(e) = push.write(data)
        {
            self.error = Some(format!("storing {key}: {e}"));
        }
    }

    fn on_stop(&mut self, total: u64) -> Result<(), String> {
        let current = self.current.take();
        // Why the run failed, if it did: what went wrong first (its upload perhaps never
        // opened).
        if let Some(e) = self.error.take() {
            if let Some((key, _)) = current {
                let _ = self.client.abort(&key);
            }
            return Err(e);
        }
        let (key, push) = current.ok_or("no blob for this run")?;
        match push.finish(true) {
            Ok(ack) if ack.received == total && ack.committed.is_some() => {
                println!("{key}: {total} bytes, digest verified, committed");
                Ok(())
            }
            Ok(ack) => {
                let _ = self.client.abort(&key);
                Err(format!("the store holds {} of {total} bytes of {key}", ack.received))
            }
            Err(e) => {
                let _ = self.client.abort(&key);
                Err(format!("committing {key}: {e}"))
            }
        }
    }

    // The reason is said by receive_runs, with the failures at the stop.
    fn on_error(&mut self, _reason: &str) {
        if let Some((key, push)) = self.current.take() {
            drop(push);
            let _ = self.client.abort(&key);
        }
    }
}

pub fn receive(g: &Global, a: ReceiveArgs) -> Result<()> {
    let f = &a.flow;
    let mut r = Receiver::connect(target(f)?, &f.stream, &f.flow, &a.name, f.token.as_deref())
        .with_context(|| format!("joining {}/{} as {:?}", f.stream, f.flow, a.name))?;
    let into = if a.into_store {
        format!("the store at {}", g.server)
    } else {
        std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
        a.out.display().to_string()
    };
    println!("receiving {}/{} as {} (policy {}) into {into}", f.stream, f.flow, a.name, r.policy());
    if a.into_store {
        let client = crate::commands::client(g)?;
        let mut h =
            IntoStore { client, prefix: a.prefix.clone(), run: 0, current: None, error: None };
        return receive_runs(&mut r, &mut h, a.runs, |h| h.run, "nothing committed");
    }
    let mut h = ToFiles {
        dir: a.out.clone(),
        run: 0,
        started: std::time::Instant::now(),
        current: None,
        error: None,
    };
    receive_runs(&mut r, &mut h, a.runs, |h| h.run, "nothing kept")
}

/// Runs until the distributer closes (or `runs` of them), each failure said on stderr with
/// its reason (`left`: what is left of the run); fails if any run failed.
fn receive_runs<H: FlowHandler>(
    r: &mut Receiver,
    h: &mut H,
    runs: u64,
    count: impl Fn(&H) -> u64,
    left: &str,
) -> Result<()> {
    let mut failed = 0;
    loop {
        match r.run_once(h, None)? {
            // Between runs: the distributer stopped, or dropped this receiver. Said, and an
            // error (a supervisor restarts on it), unless the runs asked for are all in.
            RunEnd::Closed => {
                bail!(
                    "the distributer closed the connection after {} run(s){}",
                    count(h),
                    if failed > 0 { format!(", {failed} of them failed") } else { String::new() }
                );
            }
            RunEnd::Stopped(_) => {}
            RunEnd::Failed(why) => {
                failed += 1;
                eprintln!("run {} failed: {why} ({left})", count(h));
            }
        }
        if runs > 0 && count(h) >= runs {
            break;
        }
    }
    if failed > 0 {
        bail!("{failed} of {} runs failed", count(h));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unnamed_run_passes_over_a_number_another_receiver_just_claimed() {
        let dir = tempfile::tempdir().unwrap();
        // Another receiver claimed run-1 after this one looked (the look missed it).
        let Ok(_held) = claim(dir.path(), "run-1") else { panic!("run-1 is free") };
        let Ok((_, part, done)) = claim_unnamed(dir.path(), 1, |_| false) else {
            panic!("run-2 is free")
        };
        assert_eq!((part, done), (part_path(dir.path(), "run-2"), dir.path().join("run-2")));
        // A named run another receiver holds is refused, saying so.
        match claim(dir.path(), "run-1") {
            Err(Claim::Held(why)) => assert!(why.contains("another receiver"), "{why}"),
            _ => panic!("run-1 is held"),
        }
    }
}
