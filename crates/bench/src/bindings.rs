//! `blobstream bench bindings`: what bindings cost against baselines doing the same work in
//! the same run, as medians of paired runs — request/reply round trips (raw TCP ping-pong,
//! tonic unary calls), bulk through a binding with 0, 1, 4 and 8 null layers (raw TCP,
//! iperf3), the buffer pool against malloc, a priority message's tail latency under bulk load
//! (per scheduling policy), and compression on a paced link.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bs_binding::{Floor, LayerSpec, Policy, Profile, Scheduler};
use bs_client::{BindEndpoint, Client};
use bs_server::{BackgroundServer, ServerConfig};
use bs_store::MemStore;
use bytes::Bytes;

use crate::error::BenchError;
use crate::machine::machine_description;
use crate::options::BenchOptions;
use crate::paths::{GrpcRunner, Iperf3Runner};
use crate::payload::{MB, gbit_per_s, median, payload};

/// One compared measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub group: &'static str,
    pub what: String,
    /// blobstream's figure and the baseline's, in `unit`.
    pub ours: f64,
    pub baseline: f64,
    pub baseline_name: String,
    pub unit: &'static str,
    /// The ratio the target is about (see `ratio_means`).
    pub ratio: f64,
    pub ratio_means: &'static str,
    /// (bound, true: the ratio must be at least the bound; false: at most).
    pub target: Option<(f64, bool)>,
}

impl Row {
    pub fn met(&self) -> Option<bool> {
        self.target.map(|(b, at_least)| if at_least { self.ratio >= b } else { self.ratio <= b })
    }
}

/// Everything one run of a benchmark of [`Row`]s measured (`bench bindings`, `bench fanout`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct RowsReport {
    /// The section's title in BENCHMARKS.md, and the command that wrote it.
    pub title: &'static str,
    pub command: &'static str,
    /// Paired runs each median is taken over.
    pub runs: usize,
    pub machine: String,
    pub quick: bool,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

pub type BindingsReport = RowsReport;

struct Plan {
    runs: usize,
    round_trips: usize,
    bulk: u64,
    pool_iterations: usize,
    probe_messages: usize,
    compress_bytes: u64,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Plan {
                runs: 3,
                round_trips: 500,
                bulk: 256 * MB,
                pool_iterations: 2000,
                probe_messages: 300,
                compress_bytes: 32 * MB,
            }
        } else {
            Plan {
                runs: 7,
                round_trips: 20000,
                bulk: 1024 * MB,
                pool_iterations: 20000,
                probe_messages: 2000,
                compress_bytes: 128 * MB,
            }
        }
    }
}

/// Run the benchmark.
pub fn run_bindings(opts: &BenchOptions) -> Result<BindingsReport, BenchError> {
    let plan = Plan::new(opts.quick);
    let server = BackgroundServer::start(Arc::new(MemStore::new()), ServerConfig::ephemeral())?;
    let client = Client::connect(&server.control_addr().to_string())?;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    rows.extend(round_trips(opts, &plan, &client)?);
    rows.extend(bulk(opts, &plan, &client, &mut notes)?);
    rows.extend(pool(opts, &plan));
    rows.extend(scheduling(opts, &plan, &client)?);
    rows.extend(compression(opts, &plan, &client)?);
    rows.extend(many_idle(opts, &mut notes)?);
    rows.extend(many_active(opts, &plan)?);
    Ok(RowsReport {
        title: "Bindings",
        command: "blobstream bench bindings",
        runs: plan.runs,
        machine: machine_description(),
        quick: opts.quick,
        rows,
        notes,
    })
}

fn bind(
    c: &Client,
    endpoint: BindEndpoint,
    p: &Profile,
    sched: Option<Arc<Scheduler>>,
) -> Result<bs_binding::Binding, BenchError> {
    Ok(c.bind(endpoint, p, &Floor::default(), "bench", sched)?.binding)
}

fn profile(layers: &[LayerSpec], max_message: u32, priority: u8) -> Profile {
    Profile { layers: layers.to_vec(), max_message, priority, ..Profile::default() }
}

/// A raw TCP echo server: each connection first says its message size (u32), then every
/// message of that size is sent back.
fn raw_echo_server() -> Result<std::net::SocketAddr, BenchError> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(BenchError::io("raw echo"))?;
    let addr = l.local_addr().map_err(BenchError::io("raw echo"))?;
    thread::spawn(move || {
        for s in l.incoming().flatten() {
            thread::spawn(move || {
                let mut s = s;
                let _ = s.set_nodelay(true);
                let mut n = [0u8; 4];
                if s.read_exact(&mut n).is_err() {
                    return;
                }
                let mut buf = vec![0u8; u32::from_be_bytes(n) as usize];
                while s.read_exact(&mut buf).is_ok() {
                    if s.write_all(&buf).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

fn raw_round_trips(
    addr: std::net::SocketAddr,
    size: usize,
    n: usize,
) -> Result<Duration, BenchError> {
    let io = |e| BenchError::io("raw TCP ping-pong")(e);
    let mut s = TcpStream::connect(addr).map_err(&io)?;
    s.set_nodelay(true).map_err(&io)?;
    s.write_all(&(size as u32).to_be_bytes()).map_err(&io)?;
    let mut buf = vec![7u8; size];
    let mut t = Instant::now();
    for i in 0..n + 10 {
        if i == 10 {
            t = Instant::now();
        }
        s.write_all(&buf).map_err(&io)?;
        s.read_exact(&mut buf).map_err(&io)?;
    }
    Ok(t.elapsed())
}

fn binding_round_trips(
    b: &mut bs_binding::Binding,
    size: usize,
    n: usize,
) -> Result<Duration, BenchError> {
    let data = vec![7u8; size];
    let mut t = Instant::now();
    for i in 0..n + 10 {
        if i == 10 {
            t = Instant::now();
        }
        let back = b.request(&data)?;
        if back.len() != size {
            return Err(BenchError::Invalid("echo returned a different size".into()));
        }
    }
    Ok(t.elapsed())
}

fn micros_per(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

/// Put every thread of this process on the CPUs in `cpus` (threads started later inherit the
/// mask of the thread that starts them).
fn pin_process(cpus: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity take it
    // by pointer for the duration of the call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in cpus {
            libc::CPU_SET(*c, &mut set);
        }
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return };
        for t in tasks.flatten() {
            if let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<libc::pid_t>().ok()) {
                libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
        }
    }
}

/// Every online CPU (not `available_parallelism`, which counts only this thread's mask).
fn all_cpus() -> Vec<usize> {
    // SAFETY: sysconf takes and returns plain integers.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    (0..n.max(1) as usize).collect()
}

fn round_trips(opts: &BenchOptions, plan: &Plan, c: &Client) -> Result<Vec<Row>, BenchError> {
    // Round trips between two cores of a VM cost mostly the hypervisor's cross-core wake-ups,
    // and which pairs of threads share a core is up to the OS: on one core, every path pays
    // the same for that and the ratios show what each protocol costs.
    let all = all_cpus();
    pin_process(&[0]);
    let res = round_trips_pinned(opts, plan, c);
    pin_process(&all);
    res
}

fn round_trips_pinned(
    opts: &BenchOptions,
    plan: &Plan,
    c: &Client,
) -> Result<Vec<Row>, BenchError> {
    let raw = raw_echo_server()?;
    let mut grpc = GrpcRunner::start()?;
    let mut rows = Vec::new();
    for size in [64usize, 4096] {
        opts.say(&format!("round trips of {size} B: binding, raw TCP, tonic ({} runs)", plan.runs));
        let mut b = bind(c, BindEndpoint::Echo, &profile(&[], size as u32, 0), None)?;
        let (mut ours, mut tcp, mut tonic) = (Vec::new(), Vec::new(), Vec::new());
        let n = plan.round_trips;
        for run in 0..plan.runs {
            // Each run starts with another of the three, so none always follows the same one.
            for k in 0..3 {
                match (run + k) % 3 {
                    0 => ours.push(micros_per(binding_round_trips(&mut b, size, n)?, n)),
                    1 => tcp.push(micros_per(raw_round_trips(raw, size, n)?, n)),
                    _ => tonic.push(micros_per(grpc.echo_round_trips(size, n)?, n)),
                }
            }
        }
        b.close();
        let (o, t, g) = (median(&ours), median(&tcp), median(&tonic));
        rows.push(Row {
            group: "request/reply",
            what: format!("round trip, {size} B"),
            ours: o,
            baseline: t,
            baseline_name: "raw TCP ping-pong".into(),
            unit: "µs",
            ratio: t / o,
            ratio_means: "rate vs the baseline's (its time / ours)",
            target: Some((0.9, true)),
        });
        rows.push(Row {
            group: "request/reply",
            what: format!("round trip, {size} B"),
            ours: o,
            baseline: g,
            baseline_name: "tonic unary call".into(),
            unit: "µs",
            ratio: g / o,
            ratio_means: "rate vs the baseline's (its time / ours)",
            target: Some((2.0, true)),
        });
    }
    Ok(rows)
}

/// A raw TCP sink: reads each connection to its end, then answers one byte.
fn raw_sink_server() -> Result<std::net::SocketAddr, BenchError> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(BenchError::io("raw sink"))?;
    let addr = l.local_addr().map_err(BenchError::io("raw sink"))?;
    thread::spawn(move || {
        for s in l.incoming().flatten() {
            thread::spawn(move || {
                let mut s = s;
                let mut buf = vec![0u8; 1 << 20];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        let _ = s.write_all(b"k");
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}

fn raw_bulk(addr: std::net::SocketAddr, chunk: &Bytes, total: u64) -> Result<f64, BenchError> {
    let io = |e| BenchError::io("raw TCP bulk")(e);
    let mut s = TcpStream::connect(addr).map_err(&io)?;
    let t = Instant::now();
    let mut sent = 0;
    while sent < total {
        s.write_all(chunk).map_err(&io)?;
        sent += chunk.len() as u64;
    }
    s.shutdown(Shutdown::Write).map_err(&io)?;
    let mut k = [0u8; 1];
    s.read_exact(&mut k).map_err(&io)?;
    Ok(gbit_per_s(sent, t.elapsed()))
}

/// Send `total` bytes in messages of `chunk` and wait until the server has taken them all (a
/// renegotiation to the same profile is answered only after every earlier message).
fn binding_bulk(b: &mut bs_binding::Binding, chunk: &Bytes, total: u64) -> Result<f64, BenchError> {
    let t = Instant::now();
    let mut sent = 0;
    while sent < total {
        b.send_bytes(chunk.clone())?;
        sent += chunk.len() as u64;
    }
    let same = b.profile().clone();
    b.renegotiate(same)?;
    Ok(gbit_per_s(sent, t.elapsed()))
}

fn bulk(
    opts: &BenchOptions,
    plan: &Plan,
    c: &Client,
    notes: &mut Vec<String>,
) -> Result<Vec<Row>, BenchError> {
    let chunk = payload(MB);
    let raw = raw_sink_server()?;
    let stacks = [0usize, 1, 4, 8];
    let mut bindings = Vec::new();
    for n in stacks {
        let layers = vec![LayerSpec::Null; n];
        bindings.push(bind(c, BindEndpoint::Sink, &profile(&layers, MB as u32, 0), None)?);
    }
    let mut ours: Vec<Vec<f64>> = vec![Vec::new(); stacks.len()];
    let mut tcp = Vec::new();
    for run in 0..plan.runs {
        opts.say(&format!(
            "bulk {} MiB: raw TCP and bindings with 0/1/4/8 null layers (run {})",
            plan.bulk / MB,
            run + 1
        ));
        tcp.push(raw_bulk(raw, &chunk, plan.bulk)?);
        // A different stack goes first each run, so no stack always runs on a cold path.
        for k in 0..bindings.len() {
            let i = (k + run) % bindings.len();
            ours[i].push(binding_bulk(&mut bindings[i], &chunk, plan.bulk)?);
        }
    }
    for b in bindings {
        b.close();
    }
    let t = median(&tcp);
    let base = median(&ours[0]);
    let mut rows = vec![Row {
        group: "bulk",
        what: format!("{} MiB, 1 MiB messages, no layers", plan.bulk / MB),
        ours: base,
        baseline: t,
        baseline_name: "raw TCP".into(),
        unit: "Gbit/s",
        ratio: base / t,
        ratio_means: "ours / baseline",
        target: Some((0.95, true)),
    }];
    for (i, n) in stacks.iter().enumerate().skip(1) {
        let r = median(&ours[i]);
        let per_layer = (1.0 - r / base) / *n as f64;
        rows.push(Row {
            group: "bulk",
            what: format!(
                "{n} null layer{} (throughput; run-to-run noise here is several %)",
                if *n == 1 { "" } else { "s" }
            ),
            ours: r,
            baseline: base,
            baseline_name: "the same binding, no layers".into(),
            unit: "Gbit/s",
            ratio: per_layer * 100.0,
            ratio_means: "% throughput lost per layer",
            target: None,
        });
    }
    // What a layer costs in CPU, measured without the network's noise: a 1 MiB message down
    // and up a stack of 8 null layers against an empty stack, per layer, as a share of the
    // time the same message takes on the wire at the binding's measured rate.
    let per_message_ns = |layers: usize| {
        let specs = vec![LayerSpec::Null; layers];
        let pools = bs_wire::SizedPools::default();
        let mut tx = bs_binding::Stack::new(&specs, MB as usize, pools.clone());
        let mut rx = bs_binding::Stack::new(&specs, MB as usize, pools);
        let mut out = Vec::new();
        let n = plan.pool_iterations * 10;
        let t = Instant::now();
        for _ in 0..n {
            let _ = tx.encode(tx.shared(chunk.clone()), &mut out);
            if let Some(w) = out.pop() {
                std::hint::black_box(rx.decode(w).ok());
            }
        }
        t.elapsed().as_secs_f64() * 1e9 / n as f64
    };
    let (mut c0, mut c8) = (Vec::new(), Vec::new());
    for _ in 0..plan.runs {
        c0.push(per_message_ns(0));
        c8.push(per_message_ns(8));
    }
    let layer_ns = ((median(&c8) - median(&c0)) / 8.0).max(0.0);
    let wire_ns = MB as f64 * 8.0 / (base * 1e9) * 1e9;
    rows.push(Row {
        group: "bulk",
        what: "null layer, CPU per 1 MiB message (8 layers vs none, per layer)".into(),
        ours: layer_ns,
        baseline: wire_ns,
        baseline_name: "the message's time on the wire".into(),
        unit: "ns",
        ratio: layer_ns / wire_ns * 100.0,
        ratio_means: "% of the message's time, per layer",
        target: Some((0.5, false)),
    });
    match Iperf3Runner::start()? {
        Some(mut ip) => {
            use crate::measure::PathRunner;
            let data = Bytes::from(vec![0u8; (plan.bulk.min(1024 * MB)) as usize]);
            let mut rates = Vec::new();
            for _ in 0..plan.runs {
                // One `iperf3 -s` takes one test at a time and needs a moment between them:
                // a refused start is tried again.
                let mut tries = 0;
                let rate = loop {
                    match ip.transfer(crate::model::Mode::Push, &data, 0) {
                        Ok(t) => break t.gbit_per_s,
                        Err(_) if tries < 5 => {
                            tries += 1;
                            thread::sleep(Duration::from_millis(300));
                        }
                        Err(e) => return Err(e),
                    }
                };
                rates.push(rate);
            }
            let i = median(&rates);
            rows.push(Row {
                group: "bulk",
                what: format!("{} MiB, no layers", plan.bulk / MB),
                ours: base,
                baseline: i,
                baseline_name: "iperf3 (data phase)".into(),
                unit: "Gbit/s",
                ratio: base / i,
                ratio_means: "ours / baseline",
                target: Some((0.9, true)),
            });
        }
        None => notes.push(
            "iperf3 is not installed (scripts/bench-setup.sh installs it): no iperf3 row".into(),
        ),
    }
    Ok(rows)
}

fn pool(opts: &BenchOptions, plan: &Plan) -> Vec<Row> {
    let pools = bs_wire::SizedPools::new(8);
    let mut rows = Vec::new();
    for size in [64usize << 10, 1 << 20] {
        opts.say(&format!("buffer pool vs malloc, {} KiB buffers", size >> 10));
        let touch = |b: &mut [u8]| {
            for i in (0..b.len()).step_by(4096) {
                b[i] = i as u8;
            }
            std::hint::black_box(&b[0]);
        };
        let (mut p, mut m) = (Vec::new(), Vec::new());
        for _ in 0..plan.runs {
            let t = Instant::now();
            for _ in 0..plan.pool_iterations {
                let mut b = pools.get(size);
                touch(&mut b[..size]);
            }
            p.push(t.elapsed().as_secs_f64() * 1e9 / plan.pool_iterations as f64);
            let t = Instant::now();
            for _ in 0..plan.pool_iterations {
                // What a receive path without a pool does: a fresh (zeroed) buffer each time.
                let mut v = vec![0u8; size];
                touch(&mut v);
                std::hint::black_box(v);
            }
            m.push(t.elapsed().as_secs_f64() * 1e9 / plan.pool_iterations as f64);
        }
        let (pm, mm) = (median(&p), median(&m));
        rows.push(Row {
            group: "buffers",
            what: format!("take, touch every page, give back: {} KiB", size >> 10),
            ours: pm,
            baseline: mm,
            baseline_name: "malloc/free (Vec)".into(),
            unit: "ns",
            ratio: mm / pm,
            ratio_means: "its time / ours",
            target: Some((3.0, true)),
        });
    }
    rows
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

fn probe(b: &mut bs_binding::Binding, n: usize) -> Result<Vec<f64>, BenchError> {
    let data = [1u8; 100];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        b.request(&data)?;
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(out)
}

/// Wait (bounded) until the server holds at most `n` live bindings: the ones just closed
/// have drained.
fn wait_idle(c: &Client, n: usize) -> Result<(), BenchError> {
    let until = Instant::now() + Duration::from_secs(30);
    while c.bindings()?.len() > n && Instant::now() < until {
        thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn scheduling(opts: &BenchOptions, plan: &Plan, c: &Client) -> Result<Vec<Row>, BenchError> {
    let mut rows = Vec::new();
    for (name, policy) in
        [("priority", Some(Policy::Priority)), ("fifo", Some(Policy::Fifo)), ("none", None)]
    {
        opts.say(&format!("100 B priority messages under 4 bulk bindings, scheduler: {name}"));
        let sched = policy.map(|p| Arc::new(Scheduler::new(p, 1)));
        let mut probe_b = bind(c, BindEndpoint::Echo, &profile(&[], 1024, 7), sched.clone())?;
        let probes = plan.probe_messages * plan.runs.min(3);
        // Unloaded first, with nothing else alive on the server.
        wait_idle(c, 1)?;
        let mut idle = probe(&mut probe_b, probes)?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut bulk = Vec::new();
        for _ in 0..4 {
            let mut b = bind(c, BindEndpoint::Sink, &profile(&[], 64 << 10, 1), sched.clone())?;
            let stop = stop.clone();
            bulk.push(thread::spawn(move || -> Result<(), BenchError> {
                bs_binding::sched::lower_thread_priority(1);
                let chunk = payload(64 << 10);
                while !stop.load(Ordering::Relaxed) {
                    b.send_bytes(chunk.clone())?;
                }
                b.close();
                Ok(())
            }));
        }
        // Let the bulk bindings fill their socket buffers first.
        thread::sleep(Duration::from_millis(200));
        let mut loaded = probe(&mut probe_b, probes)?;
        stop.store(true, Ordering::Relaxed);
        for t in bulk {
            t.join().map_err(|_| BenchError::Invalid("bulk thread panicked".into()))??;
        }
        probe_b.close();
        wait_idle(c, 0)?;
        let (pi, pl) = (percentile(&mut idle, 0.99), percentile(&mut loaded, 0.99));
        rows.push(Row {
            group: "scheduling",
            what: format!(
                "p99 of a 100 B priority-7 round trip, 4 priority-1 bulk bindings, scheduler {name}"
            ),
            ours: pl,
            baseline: pi,
            baseline_name: "the same, no load".into(),
            unit: "µs",
            ratio: pl / pi,
            ratio_means: "loaded / unloaded",
            target: (name == "priority").then_some((2.0, false)),
        });
    }
    Ok(rows)
}

/// Sixteen-bit slices like a CT series: smooth anatomy-like shapes plus a little noise.
fn dicom_like(total: u64) -> Vec<Bytes> {
    let (w, h) = (512usize, 512usize);
    let slices = (total as usize / (w * h * 2)).max(1);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..slices)
        .map(|z| {
            let mut v = Vec::with_capacity(w * h * 2);
            for j in 0..h {
                for i in 0..w {
                    let (dx, dy) = (i as f64 - 256.0, j as f64 - 256.0);
                    let r = (dx * dx + dy * dy).sqrt();
                    let body = if r < 200.0 + (z % 7) as f64 {
                        1000.0 + 40.0 * (r / 30.0).sin()
                    } else {
                        0.0
                    };
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let px = (body as i32 + (x >> 60) as i32) as u16;
                    v.extend_from_slice(&px.to_le_bytes());
                }
            }
            Bytes::from(v)
        })
        .collect()
}

fn compression(opts: &BenchOptions, plan: &Plan, c: &Client) -> Result<Vec<Row>, BenchError> {
    const LINK: u64 = 125_000_000; // 1 Gbit/s
    let slices = dicom_like(plan.compress_bytes);
    let total: u64 = slices.iter().map(|s| s.len() as u64).sum();
    let mut rows = Vec::new();
    let rate = |layers: &[LayerSpec]| -> Result<f64, BenchError> {
        let mut b = bind(c, BindEndpoint::Sink, &profile(layers, 1 << 20, 0), None)?;
        let mut r = Vec::new();
        for _ in 0..plan.runs.min(3) {
            let t = Instant::now();
            for s in &slices {
                b.send_bytes(s.clone())?;
            }
            let same = b.profile().clone();
            b.renegotiate(same)?;
            r.push(total as f64 / t.elapsed().as_secs_f64() / 1e6);
        }
        b.close();
        Ok(median(&r))
    };
    opts.say(&format!("{} MiB of CT-like slices over a binding paced to 1 Gbit/s", total / MB));
    let plain = rate(&[LayerSpec::Pace(LINK)])?;
    for codec in [bs_binding::Codec::Lz4, bs_binding::Codec::Zstd(1)] {
        opts.say(&format!("… with {}", LayerSpec::Compress(codec)));
        let ours = rate(&[LayerSpec::Compress(codec), LayerSpec::Pace(LINK)])?;
        rows.push(Row {
            group: "compression",
            what: format!(
                "CT-like 16-bit slices, link paced to 1 Gbit/s, {}",
                LayerSpec::Compress(codec)
            ),
            ours,
            baseline: plain,
            baseline_name: "the same binding without compression".into(),
            unit: "MB/s",
            ratio: ours / plain,
            ratio_means: "effective throughput, ours / baseline",
            target: None,
        });
    }
    Ok(rows)
}

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 =
        s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A `blobstream serve` of its own (so its memory is its own), with room for `n` bindings.
struct ServeProcess {
    child: std::process::Child,
    addr: String,
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_process(n: usize) -> Result<Option<ServeProcess>, BenchError> {
    serve_process_with(n, &[])
}

fn serve_process_with(n: usize, extra: &[&str]) -> Result<Option<ServeProcess>, BenchError> {
    use std::io::BufRead;
    let exe = std::env::current_exe().map_err(BenchError::io("finding the blobstream binary"))?;
    if exe.file_name().is_none_or(|f| f != "blobstream") {
        return Ok(None);
    }
    let mut child = std::process::Command::new(exe)
        .args(["serve", "--memory", "--no-http", "--addr", "127.0.0.1:0", "--no-udp"])
        .args(["--max-connections", &(n + 100).to_string()])
        .args(["--max-bindings", &(n + 100).to_string()])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(BenchError::io("starting blobstream serve"))?;
    let out = child.stdout.take().ok_or_else(|| BenchError::Invalid("no stdout".into()))?;
    let mut lines = std::io::BufReader::new(out).lines();
    let addr = loop {
        match lines.next() {
            Some(Ok(l)) => {
                if let Some(a) = l.split("control plane (gRPC):").nth(1) {
                    break a.trim().to_string();
                }
            }
            _ => {
                let _ = child.kill();
                return Err(BenchError::Invalid("blobstream serve exited before listening".into()));
            }
        }
    };
    thread::spawn(move || lines.for_each(drop));
    Ok(Some(ServeProcess { child, addr }))
}

/// One server holding many idle bindings: what each costs it in memory.
fn many_idle(opts: &BenchOptions, notes: &mut Vec<String>) -> Result<Vec<Row>, BenchError> {
    let n = if opts.quick { 1000 } else { 10_000 };
    // SAFETY: getrlimit with a valid, writable struct.
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    let fds = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    let want = (n + 512) as libc::rlim_t;
    if !fds || lim.rlim_max < want {
        notes.push(format!(
            "{n} idle bindings not measured: this process may open only {} files",
            lim.rlim_max
        ));
        return Ok(Vec::new());
    }
    if lim.rlim_cur < want {
        let raised = libc::rlimit { rlim_cur: want, ..lim };
        // SAFETY: as above.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) };
    }
    let Some(server) = serve_process(n)? else {
        notes.push("idle bindings not measured: run through the blobstream binary".into());
        return Ok(Vec::new());
    };
    opts.say(&format!("{n} idle bindings on one server (its own process)"));
    let c = Client::connect(&server.addr)?;
    let pid = server.child.id();
    // One binding first, so the first binding's one-off costs are not counted.
    let mut held = vec![bind(&c, BindEndpoint::Echo, &profile(&[], 4096, 0), None)?];
    held[0].request(b"warm")?;
    let before = rss(pid).unwrap_or(0);
    let t = Instant::now();
    for _ in 1..n {
        held.push(bind(&c, BindEndpoint::Echo, &profile(&[], 4096, 0), None)?);
    }
    let opened = t.elapsed();
    // Every one is live: each answers.
    for b in held.iter_mut().step_by((n / 100).max(1)) {
        b.request(b"still there?")?;
    }
    let live = c.bindings()?.len();
    let after = rss(pid).unwrap_or(0);
    let per = after.saturating_sub(before) as f64 / (n - 1) as f64;
    for b in held {
        b.close();
    }
    if live < n {
        return Err(BenchError::Invalid(format!("the server lists {live} of {n} bindings")));
    }
    notes.push(format!(
        "{n} idle bindings opened in {:.1} s ({:.0} bindings/s, a Bind call and a connection each)",
        opened.as_secs_f64(),
        n as f64 / opened.as_secs_f64()
    ));
    Ok(vec![Row {
        group: "many bindings",
        what: format!("server memory per idle binding, {n} held at once (thread, socket, session)"),
        ours: per / 1024.0,
        baseline: 64.0,
        baseline_name: "the target".into(),
        unit: "KiB",
        ratio: per / 1024.0 / 64.0,
        ratio_means: "ours / target",
        target: Some((1.0, false)),
    }])
}

/// 1,000 small blobs pushed at once into one server (its own process): transfers per second,
/// against the same blobs pushed at once through gRPC alone.
fn many_active(opts: &BenchOptions, plan: &Plan) -> Result<Vec<Row>, BenchError> {
    const SIZE: usize = 4096;
    let n = if opts.quick { 200 } else { 1000 };
    let Some(server) =
        serve_process_with(n, &["--max-unauthenticated-per-ip", &(2 * n).to_string()])?
    else {
        return Ok(Vec::new());
    };
    let client = Client::connect(&server.addr)?;
    let mut grpc = GrpcRunner::start()?;
    let data = payload(SIZE as u64);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for run in 0..plan.runs.min(5) {
        opts.say(&format!("{n} pushes of 4 KiB at once: blobstream, gRPC (run {})", run + 1));
        let t = Instant::now();
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let (c, data) = (client.clone(), data.clone());
                thread::Builder::new().stack_size(256 << 10).spawn(move || {
                    let route = bs_client::RouteRequest {
                        size: Some(SIZE as u64),
                        overwrite: true,
                        ..Default::default()
                    };
                    let name = format!("bench/many/{run}/{i}");
                    let mut p = c.open_push(&name, 0, Some(SIZE as u64), Some(route))?;
                    p.write(&data)?;
                    p.finish(true).map(|_| ())
                })
            })
            .collect::<Result<_, _>>()
            .map_err(BenchError::io("starting push threads"))?;
        for th in threads {
            th.join().map_err(|_| BenchError::Invalid("push thread panicked".into()))??;
        }
        ours.push(n as f64 / t.elapsed().as_secs_f64());
        // A baseline run whose connection breaks under the burst is run again (twice at most).
        let mut tries = 0;
        let took = loop {
            match grpc.concurrent_pushes(SIZE, n) {
                Ok(t) => break t,
                Err(_) if tries < 2 => tries += 1,
                Err(e) => return Err(e),
            }
        };
        theirs.push(n as f64 / took.as_secs_f64());
    }
    let (o, g) = (median(&ours), median(&theirs));
    Ok(vec![Row {
        group: "many bindings",
        what: format!("{n} pushes of 4 KiB started at once (each committed and confirmed)"),
        ours: o,
        baseline: g,
        baseline_name: "the same through gRPC alone, one channel, ≤ 100 streams at once".into(),
        unit: "transfers/s",
        ratio: o / g,
        ratio_means: "ours / baseline",
        target: None,
    }])
}

impl RowsReport {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    fn met_text(r: &Row) -> String {
        match (r.target, r.met()) {
            (Some((b, true)), Some(m)) => format!("≥ {b} {}", if m { "✓" } else { "✗" }),
            (Some((b, false)), Some(m)) => format!("≤ {b} {}", if m { "✓" } else { "✗" }),
            _ => "—".into(),
        }
    }

    pub fn print_table(&self) -> String {
        let mut out = String::new();
        for r in &self.rows {
            out.push_str(&format!(
                "{:<13} {:<70} ours {:>10.2} {:<6} {:<38} {:>10.2}  ratio {:>7.3} ({}) target {}\n",
                r.group,
                r.what,
                r.ours,
                r.unit,
                r.baseline_name,
                r.baseline,
                r.ratio,
                r.ratio_means,
                Self::met_text(r)
            ));
        }
        for n in &self.notes {
            out.push_str(&format!("note: {n}\n"));
        }
        out
    }

    pub fn to_markdown(&self) -> String {
        let mut out = format!("## {}\n\n", self.title);
        out.push_str(&format!(
            "`{}`{} on {}. Medians of {} paired runs; every baseline ran in the same run, on 127.0.0.1.\n\n",
            self.command,
            if self.quick { " --quick" } else { "" },
            self.machine,
            self.runs
        ));
        out.push_str("| group | measurement | blobstream | baseline | ratio | target |\n|---|---|---|---|---|---|\n");
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {:.2} {} | {}: {:.2} {} | {:.3} ({}) | {} |\n",
                r.group,
                r.what,
                r.ours,
                r.unit,
                r.baseline_name,
                r.baseline,
                r.unit,
                r.ratio,
                r.ratio_means,
                Self::met_text(r)
            ));
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for n in &self.notes {
                out.push_str(&format!("- {n}\n"));
            }
        }
        out
    }
}
