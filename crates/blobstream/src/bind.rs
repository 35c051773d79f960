//! `blobstream bind` and `blobstream bindings`: open a binding with a QoS profile and watch
//! negotiation, renegotiation and the counters; list the server's live bindings.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bs_binding::{Floor, Profile, Renegotiated};
use bs_client::BindEndpoint;
use serde::Deserialize;

use crate::cli::{BindArgs, Global};

/// A profile file: the fields of `QosProfile` (sizes and rates as numbers or "64k"-style text).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    throughput: Option<Size>,
    latency_ms: Option<f64>,
    jitter_ms: Option<f64>,
    loss_ppm: Option<u32>,
    priority: Option<u8>,
    weight: Option<u32>,
    flow: Option<String>,
    layers: Option<Vec<String>>,
    transports: Option<Vec<String>>,
    max_message: Option<Size>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Size {
    Number(u64),
    Text(String),
}

impl Size {
    fn bytes(&self) -> Result<u64> {
        match self {
            Size::Number(n) => Ok(*n),
            Size::Text(t) => bs_binding::qos::parse_size(t)
                .with_context(|| format!("{t:?} is not a number of bytes")),
        }
    }
}

fn micros(ms: f64) -> u32 {
    (ms * 1000.0).round().clamp(0.0, u32::MAX as f64) as u32
}

/// The proposal: the file's profile, then the flags over it.
fn proposal(a: &BindArgs) -> Result<Profile> {
    let f: ProfileFile = match &a.profile {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("profile {}", path.display()))?
        }
        None => ProfileFile::default(),
    };
    let mut p = Profile {
        throughput_bps: f.throughput.map(|s| s.bytes()).transpose()?.unwrap_or(0),
        latency_us: f.latency_ms.map_or(0, micros),
        jitter_us: f.jitter_ms.map_or(0, micros),
        loss_ppm: f.loss_ppm.unwrap_or(0),
        priority: f.priority.unwrap_or(0),
        weight: f.weight.unwrap_or(0),
        max_message: f.max_message.map(|s| s.bytes()).transpose()?.unwrap_or(0) as u32,
        ..Profile::default()
    };
    if let Some(flow) = f.flow {
        p.flow = match flow.as_str() {
            "stream" => bs_binding::Flow::Stream,
            "request_reply" | "request/reply" => bs_binding::Flow::RequestReply,
            other => bail!("unknown flow {other:?} (stream, request_reply)"),
        };
    }
    let layers = if a.layers.is_empty() { f.layers.unwrap_or_default() } else { a.layers.clone() };
    p.layers = layers.iter().map(|l| l.parse()).collect::<Result<_, _>>()?;
    let transports = if a.transports.is_empty() {
        f.transports.unwrap_or_default()
    } else {
        a.transports.clone()
    };
    p.transports = transports.iter().map(|t| t.parse()).collect::<Result<_, _>>()?;
    if let Some(v) = a.throughput {
        p.throughput_bps = v;
    }
    if let Some(v) = a.latency_ms {
        p.latency_us = micros(v);
    }
    if let Some(v) = a.jitter_ms {
        p.jitter_us = micros(v);
    }
    if let Some(v) = a.loss_ppm {
        p.loss_ppm = v;
    }
    if let Some(v) = a.priority {
        p.priority = v;
    }
    if let Some(v) = a.weight {
        p.weight = v;
    }
    if let Some(v) = a.max_message {
        p.max_message = v as u32;
    } else if p.max_message == 0 {
        p.max_message = a.size as u32;
    }
    p.validate()?;
    Ok(p)
}

fn fill(n: usize, compressible: bool) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|i| {
            if compressible {
                return (i / 256) as u8;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

pub fn run(g: &Global, a: BindArgs) -> Result<()> {
    let endpoint = match a.endpoint.as_str() {
        "echo" => BindEndpoint::Echo,
        "sink" => BindEndpoint::Sink,
        "source" => BindEndpoint::Source,
        other => bail!("unknown endpoint {other:?} (echo, sink, source)"),
    };
    let mut p = proposal(&a)?;
    if endpoint == BindEndpoint::Echo {
        p.flow = bs_binding::Flow::RequestReply;
    }
    let floor = Floor { min_throughput_bps: a.min_throughput.unwrap_or(0), ..Floor::default() };
    let client = crate::commands::client(g)?;
    let bound = client.bind(endpoint, &p, &floor, "cli", None)?;
    let mut b = bound.binding;
    let say = |line: String| {
        if !a.json {
            eprintln!("{line}");
        }
    };
    say(format!("proposed:   {p}"));
    say(format!("negotiated: {}", b.profile()));
    for l in &bound.lowered {
        say(format!("  lowered: {l}"));
    }
    say(format!("over {} to {} (binding {})", bound.transport, bound.address, b.id()));

    let size = (a.size as usize).min(b.max_message());
    let data = fill(size, a.compressible);
    let live = !g.quiet && !a.json && std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last_print = Instant::now();
    let mut rtts = Vec::new();
    let mut reneg = None;
    for i in 0..a.messages {
        if i == a.messages / 2 && (!a.then_layers.is_empty() || a.then_throughput.is_some()) {
            let mut q = b.profile().clone();
            if !a.then_layers.is_empty() {
                q.layers = a
                    .then_layers
                    .iter()
                    .filter(|l| l.as_str() != "none")
                    .map(|l| l.parse())
                    .collect::<Result<_, _>>()?;
            }
            if let Some(t) = a.then_throughput {
                q.throughput_bps = t;
            }
            let outcome = b.renegotiate(q)?;
            say(format!("renegotiated after {i} messages: {}", describe(&outcome)));
            reneg = Some(outcome);
        }
        let n = size.min(b.max_message());
        match endpoint {
            BindEndpoint::Echo => {
                let t = Instant::now();
                let back = b.request(&data[..n])?;
                rtts.push(t.elapsed());
                if back[..] != data[..n] {
                    bail!("echo returned different bytes");
                }
            }
            BindEndpoint::Source => {
                if b.recv()?.is_none() {
                    bail!("the server closed the binding");
                }
            }
            _ => b.send(&data[..n])?,
        }
        if live && last_print.elapsed() > Duration::from_secs(1) {
            last_print = Instant::now();
            eprintln!("{}", counters_line(&b.counters().snapshot(), started.elapsed()));
        }
    }
    let report = if b.is_datagram() { Some(b.finish_datagrams()?) } else { None };
    let elapsed = started.elapsed();
    let snap = b.counters().snapshot();
    let profile = b.profile().clone();
    b.close();
    rtts.sort();
    let pct =
        |q: f64| rtts.get(((rtts.len() as f64 - 1.0) * q) as usize).map(|d| d.as_secs_f64() * 1e6);
    if a.json {
        let v = serde_json::json!({
            "transport": bound.transport,
            "profile": profile.to_string(),
            "layers": profile.layer_names(),
            "lowered": bound.lowered,
            "renegotiated": reneg.as_ref().map(describe),
            "seconds": elapsed.as_secs_f64(),
            "bytes_out": snap.bytes_out,
            "bytes_in": snap.bytes_in,
            "wire_out": snap.wire_out,
            "wire_in": snap.wire_in,
            "messages_out": snap.messages_out,
            "messages_in": snap.messages_in,
            "lost": report.map(|r| r.lost),
            "reordered": report.map(|r| r.reordered),
            "rtt_p50_us": pct(0.5),
            "rtt_p99_us": pct(0.99),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        eprintln!("{}", counters_line(&snap, elapsed));
        if let (Some(p50), Some(p99)) = (pct(0.5), pct(0.99)) {
            eprintln!("round trip: p50 {p50:.0} µs, p99 {p99:.0} µs");
        }
        if let Some(r) = report {
            eprintln!(
                "datagrams: {} arrived, {} lost, {} reordered, {} duplicated",
                r.count, r.lost, r.reordered, r.duplicates
            );
        }
    }
    Ok(())
}

fn describe(r: &Renegotiated) -> String {
    match r {
        Renegotiated::Applied(p) => format!("applied: {p}"),
        Renegotiated::RefusedByPeer(why) => format!("refused by the server: {why}"),
        Renegotiated::Refused(why) => format!("offer refused here: {why}"),
        Renegotiated::Withdrawn => "withdrawn (the server proposed at the same time)".into(),
    }
}

fn counters_line(s: &bs_binding::Snapshot, t: Duration) -> String {
    let secs = t.as_secs_f64().max(1e-9);
    format!(
        "{:.1}s: sent {} msgs / {} B ({} B on the wire), received {} msgs / {} B; {:.1} MB/s out, {:.1} MB/s in",
        secs,
        s.messages_out,
        s.bytes_out,
        s.wire_out,
        s.messages_in,
        s.bytes_in,
        s.bytes_out as f64 / secs / 1e6,
        s.bytes_in as f64 / secs / 1e6,
    )
}

/// `blobstream bindings`.
pub fn list(g: &Global, json: bool) -> Result<()> {
    let client = crate::commands::client(g)?;
    let all = client.bindings()?;
    if json {
        let v: Vec<_> = all
            .iter()
            .map(|b| {
                let p = b
                    .profile
                    .as_ref()
                    .and_then(|p| Profile::from_pb(p).ok())
                    .map(|p| p.to_string());
                serde_json::json!({
                    "id": b.id, "label": b.label, "endpoint": b.endpoint,
                    "transport": b.transport, "profile": p,
                    "bytes_in": b.bytes_in, "bytes_out": b.bytes_out,
                    "wire_in": b.wire_in, "wire_out": b.wire_out,
                    "messages_in": b.messages_in, "messages_out": b.messages_out,
                    "lost": b.lost, "reordered": b.reordered,
                    "renegotiations": b.renegotiations, "age_ms": b.age_ms,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if all.is_empty() {
        println!("no live bindings");
    }
    for b in all {
        let p = b.profile.as_ref().and_then(|p| Profile::from_pb(p).ok());
        println!(
            "{:>5} {:<8} {:<5} {:<24} in {} B ({} on the wire) / out {} B ({} on the wire), \
             {} renegotiations, {:.1}s old{}",
            b.id,
            b.endpoint,
            b.transport,
            b.label,
            b.bytes_in,
            b.wire_in,
            b.bytes_out,
            b.wire_out,
            b.renegotiations,
            b.age_ms as f64 / 1000.0,
            p.map(|p| format!("\n      {p}")).unwrap_or_default()
        );
    }
    Ok(())
}
