//! `blobstream bench fanout`: the distributer against baselines moving the same bytes in the
//! same run, as medians of paired runs — 1 → N receivers against ZeroMQ PUB/SUB without drops
//! (pyzmq, `bench/zmq_fanout.py`), with the sender in the distributer's process (as ZeroMQ's
//! publisher sends to its subscribers itself) and on a loopback connection to the distributer;
//! 1 → 1 through the distributer against the same binding point to point; 1 → N with the
//! sender on a connection against a bare TCP relay (what the hop alone costs); and what one
//! stalled receiver under the `buffer` policy costs the others.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use bs_binding::Role;
use bs_distrib::{Config, Distributer, FlowHandler, Params, Receiver, RunEnd, Sender, msg};
use bs_transport::Conn;
use bs_wire::DigestAlgo;

use crate::bindings::{Row, RowsReport};
use crate::error::BenchError;
use crate::machine::machine_description;
use crate::options::BenchOptions;
use crate::payload::{MB, median, paired_ratio, payload};

const CONFIG: &str = r#"
[[stream]]
name = "bench"

[[stream.flow]]
name = "hold"
policy = "hold"

[[stream.flow]]
name = "near"
policy = "hold"

[[stream.flow]]
name = "buffer"
policy = "buffer"
buffer = "64m"
"#;

const CHUNK: usize = 1 << 20;

/// The instrument's rate in the slow-receiver measurement (bytes/s): under the `buffer`
/// policy nothing slows the sender, so it sends at a set rate that healthy receivers keep
/// up with, as an instrument does, and the question is whether a stalled one costs them.
const PACE: f64 = 300e6;

struct Plan {
    runs: usize,
    total: u64,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick { Plan { runs: 3, total: 64 * MB } } else { Plan { runs: 7, total: 256 * MB } }
    }
}

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Invalid(e.to_string())
}

/// Counts what arrives (the receiver library checks offsets, total and digest itself).
struct Count;

impl FlowHandler for Count {
    fn on_data(&mut self, _offset: u64, _data: &[u8]) {}
    fn on_error(&mut self, _reason: &str) {}
}

/// A receiver thread; sends the end of each run down the channel.
fn receiver(addr: &str, flow: &str, name: &str) -> Result<mpsc::Receiver<RunEnd>, BenchError> {
    let mut r = Receiver::connect(addr, "bench", flow, name, None).map_err(err)?;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        loop {
            match r.run_once(&mut Count, None) {
                Ok(RunEnd::Closed) | Err(_) => return,
                Ok(end) => {
                    if tx.send(end).is_err() {
                        return;
                    }
                }
            }
        }
    });
    Ok(rx)
}

/// Wait until the distributer lists `n` receivers on `flow`.
fn joined(d: &Distributer, flow: &str, n: usize) -> Result<(), BenchError> {
    for _ in 0..4000 {
        let connected =
            |f: &bs_distrib::FlowStatus| f.receivers.iter().filter(|r| r.connected).count();
        if d.status().iter().any(|f| f.flow == flow && connected(f) == n) {
            return Ok(());
        }
        thread::sleep(std::time::Duration::from_millis(5));
    }
    Err(err(format!("{n} receivers never joined {flow}")))
}

/// One run of `total` bytes, paced to `rate` bytes/s if given (as an instrument sends);
/// returns seconds from start until every receiver confirmed.
fn run(
    s: &mut Sender,
    data: &bytes::Bytes,
    total: u64,
    rate: Option<f64>,
) -> Result<(f64, bs_distrib::StopReport), BenchError> {
    let t = Instant::now();
    s.set_pace(rate.map(|r| r as u64));
    s.start(&Params::new()).map_err(err)?;
    let mut sent = 0;
    while sent < total {
        let n = (total - sent).min(data.len() as u64) as usize;
        s.send_bytes(&data.slice(..n)).map_err(err)?;
        sent += n as u64;
    }
    let report = s.stop().map_err(err)?;
    Ok((t.elapsed().as_secs_f64(), report))
}

/// The median of the per-run ratios of two series of rates (Gbit/s) over the same bytes,
/// run *i* of each in the same round.
fn rate_ratio(ours: &[f64], baseline: &[f64]) -> f64 {
    let secs = |rates: &[f64]| rates.iter().map(|r| 1.0 / r).collect::<Vec<_>>();
    paired_ratio(&secs(ours), &secs(baseline))
}

fn gbit(bytes: u64, secs: f64) -> f64 {
    bytes as f64 * 8.0 / secs / 1e9
}

/// The ZeroMQ harness, if the bench virtualenv has pyzmq.
fn zmq() -> Option<(PathBuf, PathBuf)> {
    crate::python::find("zmq_fanout.py", "zmq")
}

fn zmq_run(py: &(PathBuf, PathBuf), n: usize, total: u64) -> Result<f64, BenchError> {
    let out = Command::new(&py.0)
        .arg(&py.1)
        .args([n.to_string(), total.to_string(), CHUNK.to_string(), "1".into()])
        .output()
        .map_err(BenchError::io("running bench/zmq_fanout.py"))?;
    if !out.status.success() {
        return Err(BenchError::Baseline(String::from_utf8_lossy(&out.stdout).trim().to_string()));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| BenchError::Baseline(format!("unreadable output: {e}")))?;
    v["gbit_per_s"][0].as_f64().ok_or_else(|| BenchError::Baseline("no rate".into()))
}

/// Point to point: the same binding and messages, sender straight to one receiver.
fn point_to_point(data: &[u8], total: u64) -> Result<f64, BenchError> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(BenchError::io("p2p listen"))?;
    let addr: SocketAddr = l.local_addr().map_err(BenchError::io("p2p listen"))?;
    let rx = thread::spawn(move || -> Result<u64, String> {
        let (s, _) = l.accept().map_err(|e| e.to_string())?;
        let _ = s.set_nodelay(true);
        let mut b = bs_distrib::distributer::binding(Conn::new(s), Role::Responder, 1);
        let mut h = DigestAlgo::Xxh3_128.hasher();
        let mut got = 0u64;
        while let Some(m) = b.recv().map_err(|e| e.to_string())? {
            match msg::Message::parse(m.payload()).map_err(|e| e.to_string())? {
                msg::Message::Data { .. } => {
                    let d = msg::data_payload(m.payload());
                    h.update(d);
                    got += d.len() as u64;
                }
                msg::Message::Stop { digest, .. } => {
                    let ok = msg::digest_bytes(&h.finish()) == digest;
                    b.send(&msg::confirm(got, ok, "")).map_err(|e| e.to_string())?;
                }
                _ => {}
            }
        }
        Ok(got)
    });
    let s = TcpStream::connect(addr).map_err(BenchError::io("p2p connect"))?;
    let _ = s.set_nodelay(true);
    let mut b = bs_distrib::distributer::binding(Conn::new(s), Role::Initiator, 1);
    let t = Instant::now();
    let mut h = DigestAlgo::Xxh3_128.hasher();
    let mut sent = 0u64;
    while sent < total {
        let n = (total - sent).min(data.len() as u64) as usize;
        for piece in data[..n].chunks(CHUNK) {
            b.send_parts(&msg::data_head(sent), piece).map_err(err)?;
            h.update(piece);
            sent += piece.len() as u64;
        }
    }
    b.send(&msg::stop(total, &msg::digest_bytes(&h.finish()))).map_err(err)?;
    let confirm = b.recv().map_err(err)?.ok_or_else(|| err("p2p receiver closed"))?;
    let secs = t.elapsed().as_secs_f64();
    match msg::Message::parse(confirm.payload()).map_err(err)? {
        msg::Message::Confirm { ok: true, total: t, .. } if t == total => {}
        other => return Err(err(format!("p2p receiver answered {other:?}"))),
    }
    b.close();
    rx.join().map_err(|_| err("p2p receiver panicked"))?.map_err(err)?;
    Ok(gbit(total, secs))
}

/// A bare relay, the least a hop can cost: one thread reading the sender's socket into one
/// buffer and writing it to each receiver's socket in turn (no framing, no queues, no checks;
/// the receivers only count bytes). The distributer's 1 → N against it shows what its
/// protocol, queues and per-receiver threads cost over the extra hop itself.
fn bare_relay(data: &[u8], n: usize, total: u64) -> Result<f64, BenchError> {
    use std::io::{Read, Write};
    let listen = || TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(BenchError::io("relay"));
    let (from_sender, to_receivers) = (listen()?, listen()?);
    let (sa, ra) = (
        from_sender.local_addr().map_err(BenchError::io("relay"))?,
        to_receivers.local_addr().map_err(BenchError::io("relay"))?,
    );
    let counters: Vec<_> = (0..n)
        .map(|_| {
            thread::spawn(move || -> std::io::Result<u64> {
                let mut s = TcpStream::connect(ra)?;
                let mut buf = vec![0u8; CHUNK];
                let mut got = 0;
                loop {
                    match s.read(&mut buf)? {
                        0 => return Ok(got),
                        k => got += k as u64,
                    }
                }
            })
        })
        .collect();
    let relay = thread::spawn(move || -> std::io::Result<()> {
        let mut outs =
            (0..n).map(|_| to_receivers.accept().map(|(s, _)| s)).collect::<Result<Vec<_>, _>>()?;
        let (mut inp, _) = from_sender.accept()?;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let k = inp.read(&mut buf)?;
            if k == 0 {
                return Ok(());
            }
            for o in &mut outs {
                o.write_all(&buf[..k])?;
            }
        }
    });
    let mut s = TcpStream::connect(sa).map_err(BenchError::io("relay connect"))?;
    let t = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        let k = (total - sent).min(data.len() as u64) as usize;
        s.write_all(&data[..k]).map_err(BenchError::io("relay send"))?;
        sent += k as u64;
    }
    drop(s);
    relay.join().map_err(|_| err("relay panicked"))?.map_err(BenchError::io("relay"))?;
    for c in counters {
        let got = c.join().map_err(|_| err("relay receiver panicked"))?;
        let got = got.map_err(BenchError::io("relay receiver"))?;
        if got != total {
            return Err(err(format!("a relay receiver got {got} of {total} bytes")));
        }
    }
    Ok(gbit(total * n as u64, t.elapsed().as_secs_f64()))
}

/// Receivers on hosts of their own: `scripts/fanout-hosts.py --bench` puts sender, distributer
/// and three receivers in network namespaces, each receiver behind a 200 Mbit/s tbf link, and
/// reports each receiver's rate per run (its own clock, start to verified stop; the receivers
/// write into tmpfs, so the figure is the link's, not the disk's).
fn shaped_links(opts: &BenchOptions, runs: usize) -> Result<Option<(Row, String)>, BenchError> {
    let what = "3 receivers in network namespaces behind 200 Mbit/s links";
    let Some(v) = crate::hosts::run_script(opts, "fanout-hosts.py", runs, what)? else {
        return Ok(None);
    };
    let link = v["link_mbit"].as_f64().unwrap_or(200.0);
    // "Each receiver": the slowest receiver's median.
    let slowest = v["receiver_mbit"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(_, rates)| median(&crate::hosts::numbers(rates)))
        .fold(f64::INFINITY, f64::min);
    if !slowest.is_finite() {
        return Err(BenchError::Baseline("no receiver rates".into()));
    }
    let iperf = v["iperf3_mbit"].as_f64().map_or_else(
        || "iperf3 not installed".to_string(),
        |i| format!("{i:.1} Mbit/s ({:.3}× the link)", i / link),
    );
    let row = Row {
        group: "shaped links",
        what: "slowest of 3 receivers, each behind its own 200 Mbit/s tbf link (network namespaces), 96 MB runs into tmpfs".into(),
        ours: slowest,
        baseline: link,
        baseline_name: "the link's rate".into(),
        unit: "Mbit/s",
        ratio: slowest / link,
        ratio_means: "ours / link",
        target: Some((0.95, true)),
    };
    Ok(Some((row, format!("iperf3 over one of the same shaped links: {iperf}"))))
}

/// Run the benchmark.
pub fn run_fanout(opts: &BenchOptions) -> Result<RowsReport, BenchError> {
    let plan = Plan::new(opts.quick);
    let cfg = Config::parse(CONFIG, "bench").map_err(err)?;
    let d = Distributer::start(cfg, (Ipv4Addr::LOCALHOST, 0).into()).map_err(err)?;
    let addr = d.addr().to_string();
    let data = payload(64 * MB);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let py = zmq();
    if py.is_none() {
        notes.push(
            "pyzmq is not installed (scripts/bench-setup.sh installs it): no ZeroMQ rows".into(),
        );
    }

    // 1 → N against ZeroMQ, and 1 → 1 against point to point: the sender on a connection to
    // the distributer (flow "hold"), and in the distributer's process (flow "near").
    let (mut receivers, mut near) = (Vec::new(), Vec::new());
    let mut s = Sender::connect(&addr, "bench", "hold", None).map_err(err)?;
    let mut ns = d.sender("bench", "near").map_err(err)?;
    for n in [1usize, 2, 4] {
        while receivers.len() < n {
            receivers.push(receiver(&addr, "hold", &format!("r{}", receivers.len()))?);
            near.push(receiver(&addr, "near", &format!("n{}", near.len()))?);
        }
        joined(&d, "hold", n)?;
        joined(&d, "near", n)?;
        opts.say(&format!(
            "1 → {n}: distributer, ZeroMQ ({} runs of {} MB)",
            plan.runs,
            plan.total / MB
        ));
        let (mut ours, mut ours_near, mut theirs, mut p2p, mut bare) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let ours_run = |s: &mut Sender, rs: &[mpsc::Receiver<RunEnd>]| {
            let (secs, report) = run(s, &data, plan.total, None)?;
            if !report.all_delivered() {
                return Err(err(format!("a receiver failed: {report:?}")));
            }
            for r in rs {
                r.recv().map_err(err)?;
            }
            Ok::<f64, BenchError>(gbit(plan.total * n as u64, secs))
        };
        for i in 0..plan.runs {
            // Take turns at going first.
            for k in 0..3 {
                match (i + k) % 3 {
                    0 => ours.push(ours_run(&mut s, &receivers)?),
                    1 => ours_near.push(ours_run(&mut ns, &near)?),
                    _ => {
                        if let Some(py) = &py {
                            theirs.push(zmq_run(py, n, plan.total)?);
                        }
                    }
                }
            }
            bare.push(bare_relay(&data, n, plan.total)?);
            if n == 1 {
                p2p.push(point_to_point(&data, plan.total)?);
            }
        }
        let (o, on) = (median(&ours), median(&ours_near));
        let total = plan.total / MB;
        let row =
            |what: String, ours: f64, runs: &[f64], baseline: &str, base: &[f64], target| Row {
                group: "fan-out",
                what,
                ours,
                baseline: median(base),
                baseline_name: baseline.into(),
                unit: "Gbit/s",
                ratio: rate_ratio(runs, base),
                ratio_means: "ours / baseline",
                target,
            };
        let zmq = "ZeroMQ PUB/SUB, no drops (pyzmq)";
        if py.is_some() {
            rows.push(row(
                format!(
                    "1 → {n} receivers, {total} MB per run, aggregate delivered: the sender in \
                     the distributer's process (as ZeroMQ's publisher)"
                ),
                on,
                &ours_near,
                zmq,
                &theirs,
                Some((1.0, true)),
            ));
            rows.push(row(
                format!(
                    "1 → {n} receivers, the same with the sender on a connection to the \
                     distributer (one more hop)"
                ),
                o,
                &ours,
                zmq,
                &theirs,
                None,
            ));
        }
        rows.push(row(
            format!("1 → {n} with the sender on a connection, against the least a hop costs"),
            o,
            &ours,
            "a bare TCP relay (read → write to each, no protocol)",
            &bare,
            None,
        ));
        if n == 1 {
            let p2p_name = "the same binding, point to point";
            rows.push(row(
                "1 → 1 through the distributer, the sender in its process".into(),
                on,
                &ours_near,
                p2p_name,
                &p2p,
                Some((0.8, true)),
            ));
            rows.push(row(
                "1 → 1 through the distributer, the sender on a connection to it".into(),
                o,
                &ours,
                p2p_name,
                &p2p,
                None,
            ));
        }
    }
    s.close();
    ns.close();
    drop((receivers, near));

    // One stalled receiver under `buffer`: what the three others keep.
    opts.say("3 receivers under buffer, with and without a stalled fourth");
    let healthy: Vec<_> =
        (0..3).map(|i| receiver(&addr, "buffer", &format!("h{i}"))).collect::<Result<_, _>>()?;
    joined(&d, "buffer", 3)?;
    let mut s = Sender::connect(&addr, "bench", "buffer", None).map_err(err)?;
    let (mut alone, mut stalled) = (Vec::new(), Vec::new());
    // Long enough for the stalled receiver to pass the bound (64 MB and its socket buffers).
    let total = plan.total.max(256 * MB);
    for i in 0..plan.runs {
        for k in 0..2 {
            let with_stalled = (i + k) % 2 == 0;
            let stall = if with_stalled {
                let r =
                    Receiver::connect(&addr, "bench", "buffer", "stalled", None).map_err(err)?;
                joined(&d, "buffer", 4)?;
                Some(r)
            } else {
                None
            };
            let (secs, report) = run(&mut s, &data, total, Some(PACE))?;
            let ok = report.receivers.iter().filter(|r| r.ok).count();
            if ok != 3 {
                return Err(err(format!("expected the 3 healthy receivers to finish: {report:?}")));
            }
            for r in &healthy {
                r.recv().map_err(err)?;
            }
            let rate = gbit(total * 3, secs);
            if with_stalled {
                stalled.push(rate)
            } else {
                alone.push(rate)
            }
            drop(stall);
            joined(&d, "buffer", 3)?;
        }
    }
    s.close();
    let (w, a) = (median(&stalled), median(&alone));
    rows.push(Row {
        group: "slow receiver",
        what: "3 receivers' aggregate, sender paced to 300 MB/s, with a 4th stalled (buffer policy, 64 MB bound)".into(),
        ours: w,
        baseline: a,
        baseline_name: "the same 3 without it".into(),
        unit: "Gbit/s",
        ratio: w / a,
        ratio_means: "with / without",
        target: Some((0.9, true)),
    });
    match shaped_links(opts, plan.runs) {
        Ok(Some((row, note))) => {
            rows.push(row);
            notes.push(note);
        }
        Ok(None) => notes.push(
            "no shaped-link row: it needs root, iproute2 (ip, tc) and scripts/fanout-hosts.py"
                .into(),
        ),
        Err(e) => notes.push(format!("no shaped-link row: {e}")),
    }
    notes.push(
        "every receiver checks each message's offset and the run's total and xxh3-128 digest; \
         ZeroMQ's subscribers only count bytes"
            .into(),
    );
    notes.push(
        "ZeroMQ has no broker: its publisher writes to each subscriber itself, as a sender in \
         the distributer's process (`Distributer::sender`, `blobstream send --serve`) does, so \
         the targets are on those rows; a sender on a connection to the distributer (in a \
         deployment another process or host; here a thread of this process over loopback) \
         makes every byte cross loopback twice on the same two cores (the bare relay rows \
         show what that hop costs)"
            .into(),
    );
    notes.push(
        "the sender in the distributer's process can beat point to point: it hashes on its own \
         thread while a writer thread writes, where point to point does both on one"
            .into(),
    );
    notes.push(
        "each ratio is the median of the per-run ratios (our run i against the baseline's run \
         i, in the same round; which goes first rotates), so it can differ from the ratio of \
         the medians"
            .into(),
    );
    notes.push(
        "all processes on one 2-core machine: sender, distributer and receivers share its cores"
            .into(),
    );
    Ok(RowsReport {
        title: "Fan-out",
        command: "blobstream bench fanout",
        runs: plan.runs,
        machine: machine_description(),
        quick: opts.quick,
        rows,
        notes,
    })
}
