//! `blobstream bench s3`: blobstream on shared storage — a Garage S3 server (one node, on
//! loopback) and, for several front ends, a PostgreSQL catalogue.
//!
//! - put and get of 4 KiB, 1 MB, 32 MB and 256 MB through a blobstream server on the S3
//!   backend (client → server → Garage; a 4 KiB blob is kept in its catalogue row and never
//!   reaches the bucket), against the same bytes put and got directly on the same Garage
//!   with the `object_store` crate alone, on its stock HTTP client (8 MiB parts, 4 in
//!   flight, as ours; blobstream reaches Garage through its own HTTP client, `s3http.rs`);
//! - a repeated get of 32 MB through the memory tier in front of the bucket, against the
//!   same get from the filesystem store (page cache warm);
//! - aggregate throughput of parallel clients through 1, 2 and 3 front ends sharing one
//!   bucket and one catalogue.
//!
//! Paired runs, alternating which goes first; rates are medians, each ratio the median of
//! the per-run ratios.

use std::sync::Arc;
use std::time::Instant;

use bs_client::{Client, RouteRequest};
use bs_meta::Catalogue;
use bs_server::{BackgroundServer, ServerConfig};
use bs_store::{FsStore, ObjStore, S3Config, Tier};
use bytes::Bytes;
use object_store::ObjectStore;

use crate::bindings::{Row, RowsReport};
use crate::error::BenchError;
use crate::machine::machine_description;
use crate::options::BenchOptions;
use crate::payload::{median, paired_ratio, payload};
use crate::settle::Clock;

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Invalid(e.to_string())
}

fn s3_config(e: &bs_peers::S3Endpoint, prefix: &str) -> S3Config {
    S3Config {
        endpoint: Some(e.url.clone()),
        region: e.region.clone(),
        bucket: e.bucket.clone(),
        prefix: prefix.into(),
        access_key_id: e.key_id.clone(),
        secret_access_key: e.secret.clone(),
        timeout: None,
    }
}

fn push(client: &Client, name: &str, data: &[u8]) -> Result<(), BenchError> {
    let n = data.len() as u64;
    let route = RouteRequest { size: Some(n), overwrite: true, ..Default::default() };
    // A whole blob from memory: pipelined (one round trip) up to the server's bound.
    let ack = client.push_all(name, data, Some(route))?;
    if ack.received != n {
        return Err(err(format!("server acknowledged {} of {n} bytes", ack.received)));
    }
    Ok(())
}

fn pull(client: &Client, name: &str, want: &[u8]) -> Result<(), BenchError> {
    // Into plain heap memory, as object_store's get collects its body: not onto huge pages
    // (`bs_wire::alloc::zeroed`), whose first touch after the puts had churned memory cost
    // this side up to a third of a 256 MB get (the kernel compacting and zeroing 2 MiB pages
    // at fault time) and the baseline nothing.
    pull_into(client, name, want, &mut vec![0u8; want.len()])
}

/// Pull `name` into `out` (as long as `want`) and check it is `want`.
fn pull_into(client: &Client, name: &str, want: &[u8], out: &mut [u8]) -> Result<(), BenchError> {
    // Read into memory and used only once verified: the server may send before checking.
    let mut p = client.open_pull_whole(name, 0, None)?;
    p.read_exact_to_end(out)?;
    if out != want {
        return Err(err(format!("{name}: the pull returned other bytes")));
    }
    Ok(())
}

/// The plain client: `object_store` alone on the same bucket.
struct Direct {
    os: Arc<object_store::aws::AmazonS3>,
    rt: tokio::runtime::Runtime,
}

impl Direct {
    fn put(&self, key: &str, data: &Bytes) -> Result<(), BenchError> {
        let path = object_store::path::Path::from(key);
        self.rt
            .block_on(async {
                if data.len() <= bs_store::PART_SIZE {
                    self.os.put(&path, data.clone().into()).await?;
                } else {
                    let upload = self.os.put_multipart(&path).await?;
                    let mut w = object_store::WriteMultipart::new_with_chunk_size(
                        upload,
                        bs_store::PART_SIZE,
                    );
                    for piece in data.chunks(1 << 20) {
                        w.wait_for_capacity(4).await?;
                        w.write(piece);
                    }
                    w.finish().await?;
                }
                Ok::<_, object_store::Error>(())
            })
            .map_err(|e| err(format!("object_store put: {e}")))
    }

    fn get(&self, key: &str, want: &[u8]) -> Result<(), BenchError> {
        let path = object_store::path::Path::from(key);
        let got = self
            .rt
            .block_on(async { self.os.get(&path).await?.bytes().await })
            .map_err(|e| err(format!("object_store get: {e}")))?;
        if got != want {
            return Err(err(format!("{key}: object_store returned other bytes")));
        }
        Ok(())
    }
}

/// Paired runs of the put/get rows for blobs of `bytes`.
fn runs_of(bytes: u64, quick: bool) -> usize {
    match (quick, bytes) {
        (true, _) => 3,
        (false, ..=1_000_000) => 41,
        (false, ..=32_000_000) => 15,
        (false, _) => 9,
    }
}

pub fn run_s3(opts: &BenchOptions) -> Result<RowsReport, BenchError> {
    let runs = if opts.quick { 3 } else { 9 };
    opts.say("starting Garage (one node) and PostgreSQL on loopback");
    let garage = bs_peers::Garage::start("bench").map_err(err)?;
    let pg = bs_peers::Postgres::start().map_err(err)?;
    let e = garage.endpoint().clone();
    let tmp = tempfile::tempdir().map_err(BenchError::io("temp dir"))?;

    let store = ObjStore::open_s3(
        &s3_config(&e, "blobstream"),
        Catalogue::open(&tmp.path().join("meta.db"))?,
    )?;
    let server = BackgroundServer::start(Arc::new(store.clone()), ServerConfig::ephemeral())?;
    let client = Client::connect(&server.control_addr().to_string())?;
    let direct = Direct {
        os: Arc::new(s3_config(&e, "direct").build_stock()?),
        rt: tokio::runtime::Runtime::new().map_err(BenchError::io("runtime"))?,
    };

    // Each operation timed from an idle machine: work the last one left to Garage is not
    // charged to the next.
    let clock = Clock::default();
    let mut rows = Vec::new();
    // 4 KiB: a blob kept in its catalogue row, which makes no request to the bucket.
    let sizes =
        [(4096u64, "4 KiB"), (1_000_000, "1 MB"), (32_000_000, "32 MB"), (256_000_000, "256 MB")];
    for (bytes, label) in sizes {
        let data = payload(bytes);
        let (mut ours_put, mut base_put, mut ours_get, mut base_get) =
            (vec![], vec![], vec![], vec![]);
        // Small blobs take milliseconds a run: more runs steady their medians.
        let runs = runs_of(bytes, opts.quick);
        // One pair first, not counted: connections opened, the bucket's first keys written.
        push(&client, &format!("bench/{bytes}"), &data)?;
        direct.put(&format!("direct/{bytes}"), &data)?;
        for i in 0..runs {
            opts.say(&format!("{label}: run {} of {runs}", i + 1));
            let name = format!("bench/{bytes}");
            let ours_first = i % 2 == 0;
            let (op, bp) = if ours_first {
                let op = clock.time(|| push(&client, &name, &data))?;
                (op, clock.time(|| direct.put(&format!("direct/{bytes}"), &data))?)
            } else {
                let bp = clock.time(|| direct.put(&format!("direct/{bytes}"), &data))?;
                (clock.time(|| push(&client, &name, &data))?, bp)
            };
            ours_put.push(op);
            base_put.push(bp);
            let (og, bg) = if ours_first {
                let og = clock.time(|| pull(&client, &name, &data))?;
                (og, clock.time(|| direct.get(&format!("direct/{bytes}"), &data))?)
            } else {
                let bg = clock.time(|| direct.get(&format!("direct/{bytes}"), &data))?;
                (clock.time(|| pull(&client, &name, &data))?, bg)
            };
            ours_get.push(og);
            base_get.push(bg);
            let ms = |s: f64| s * 1e3;
            opts.say(&format!(
                "{label}: put {:.1} ms (object_store {:.1}), get {:.1} ms (object_store {:.1})",
                ms(op),
                ms(bp),
                ms(og),
                ms(bg)
            ));
        }
        let rate = |secs: f64| bytes as f64 / 1e6 / secs;
        for (op, ours, base) in [("put", &ours_put, &base_put), ("get", &ours_get, &base_get)] {
            let (o, b) = (median(ours), median(base));
            rows.push(Row {
                group: "s3",
                what: format!("{op} {label} through blobstream on S3 (Garage)"),
                ours: rate(o),
                baseline: rate(b),
                baseline_name: "object_store alone on the same Garage".into(),
                unit: "MB/s",
                ratio: paired_ratio(ours, base),
                ratio_means: "ours / baseline",
                target: Some((0.9, true)),
            });
        }
    }

    // The memory tier: a repeated 32 MB get, against the filesystem store's.
    {
        let data = payload(32_000_000);
        let tier = Tier::new(Arc::new(store.clone()), 256 << 20, 64 << 20);
        let tier_server = BackgroundServer::start(Arc::new(tier), ServerConfig::ephemeral())?;
        let tier_client = Client::connect(&tier_server.control_addr().to_string())?;
        let fs = FsStore::open(tmp.path().join("fs"))?;
        let fs_server = BackgroundServer::start(Arc::new(fs), ServerConfig::ephemeral())?;
        let fs_client = Client::connect(&fs_server.control_addr().to_string())?;
        push(&tier_client, "tier/32", &data)?;
        push(&fs_client, "tier/32", &data)?;
        // Warm both: the tier holds it, the page cache holds the file.
        pull(&tier_client, "tier/32", &data)?;
        pull(&fs_client, "tier/32", &data)?;
        // Both stores serve into one buffer, its pages touched already: the row compares the
        // stores, not the first-touch cost of fresh memory, which varies more than they do.
        let mut out = vec![1u8; data.len()];
        let (mut t, mut f) = (vec![], vec![]);
        let mut get = |c: &Client| clock.time(|| pull_into(c, "tier/32", &data, &mut out));
        for i in 0..runs * 2 {
            opts.say(&format!("memory tier: run {} of {}", i + 1, runs * 2));
            if i % 2 == 0 {
                t.push(get(&tier_client)?);
                f.push(get(&fs_client)?);
            } else {
                f.push(get(&fs_client)?);
                t.push(get(&tier_client)?);
            }
        }
        let (tm, fm) = (median(&t), median(&f));
        rows.push(Row {
            group: "tier",
            what: "repeated get of 32 MB: memory tier in front of S3".into(),
            ours: 32.0 / tm,
            baseline: 32.0 / fm,
            baseline_name: "the filesystem store (page cache warm)".into(),
            unit: "MB/s",
            ratio: paired_ratio(&t, &f),
            ratio_means: "ours / baseline",
            target: Some((1.0, true)),
        });
    }

    // Front ends sharing one bucket and one catalogue: 6 clients, 4 MB puts, spread evenly.
    let url = pg.fresh_db().map_err(err)?;
    let mut fronts = Vec::new();
    for _ in 0..3 {
        let s = ObjStore::open_s3(&s3_config(&e, "shared"), Catalogue::connect_postgres(&url)?)?;
        fronts.push(BackgroundServer::start(Arc::new(s), ServerConfig::ephemeral())?);
    }
    let blob = payload(4_000_000);
    let (clients, per_client) = (6usize, if opts.quick { 4 } else { 8 });
    let mut agg = Vec::new();
    for n in 1..=3usize {
        let mut rates = Vec::new();
        for run in 0..runs {
            opts.say(&format!("{n} front end(s): run {} of {runs}", run + 1));
            let t = Instant::now();
            std::thread::scope(|s| -> Result<(), BenchError> {
                let handles: Vec<_> = (0..clients)
                    .map(|c| {
                        let addr = fronts[c % n].control_addr().to_string();
                        let blob = &blob;
                        s.spawn(move || -> Result<(), BenchError> {
                            let client = Client::connect(&addr)?;
                            for k in 0..per_client {
                                push(&client, &format!("fe{n}/{run}/{c}/{k}"), blob)?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                for h in handles {
                    h.join().map_err(|_| err("a client panicked"))??;
                }
                Ok(())
            })?;
            let mb = (clients * per_client * blob.len()) as f64 / 1e6;
            rates.push(mb / t.elapsed().as_secs_f64());
        }
        agg.push(median(&rates));
    }
    for (n, r) in agg.iter().enumerate() {
        rows.push(Row {
            group: "front ends",
            what: format!("{} front end(s), {clients} clients putting 4 MB blobs", n + 1),
            ours: *r,
            baseline: agg[0],
            baseline_name: "1 front end".into(),
            unit: "MB/s",
            ratio: r / agg[0],
            ratio_means: "aggregate / one front end's",
            target: None,
        });
    }
    let notes = vec![
        "Garage 2.5 (one node, SQLite metadata, replication 1) on loopback; blobstream's catalogue \
         in SQLite for the put/get rows, in PostgreSQL (one server, loopback) for the front-end rows"
            .into(),
        "blobstream reaches Garage (plain HTTP) through its own HTTP client: hyper, each \
         socket acknowledging what it reads at once (Garage leaves Nagle's algorithm on, and a \
         GET's last segment otherwise waited up to 40 ms for the acknowledgement: 5–13% of 1 MB \
         GETs back to back); each PUT of bytes carries their CRC-32, signed, which Garage \
         checks (a small put's taken as its bytes arrived from the client), other requests \
         are signed with their body's SHA-256; object_store alone uses its stock client \
         (reqwest) and its default signing: every body's SHA-256, taken as the request \
         leaves and checked by Garage, so both ends hash each byte put"
            .into(),
        "a 4 KiB blob (up to 64 KiB) is committed inside its catalogue row, in SQLite with \
         synchronous=FULL here (durable before it is acknowledged), and read from there: \
         blobstream makes no request to Garage for it; object_store alone PUTs and GETs it"
            .into(),
        "every get checked byte for byte; blobstream also checks each chunk against its digest \
         before the pull may succeed (a small blob's bytes are sent on as they arrive from the \
         bucket, each chunk checked as its last byte goes by), object_store alone does not; \
         both land the blob in plain heap memory (blobstream's client in a zeroed Vec, \
         object_store in the buffer it collects the body into); the tier row's gets, both \
         through blobstream, land in one buffer reused from run to run"
            .into(),
        "the front ends, Garage and PostgreSQL share the machine's cores, so more front ends add \
         no CPU: the table shows the front ends are not what limits the aggregate"
            .into(),
        format!(
            "{}, {} and {} paired runs of 1, 32 and 256 MB after one not counted, {runs} of the \
             other rows (alternating order); rates are medians, and each ratio is the median of \
             the per-run ratios (run i of blobstream against run i of the baseline)",
            runs_of(1, opts.quick),
            runs_of(32, opts.quick),
            runs_of(256, opts.quick)
        ),
        format!(
            "each timed operation started once the machine had been idle for 50 ms (at most 2 s \
             waited; {} of {} operations found it busy throughout): Garage keeps working after \
             it answers a PUT, and a put timed right after another put took 7–11% longer, \
             whoever did it",
            clock.unsettled(),
            clock.timed()
        ),
    ];
    drop(server);
    Ok(RowsReport {
        title: "Shared storage (S3 + PostgreSQL)",
        command: "blobstream bench s3",
        runs,
        machine: machine_description(),
        quick: opts.quick,
        rows,
        notes,
    })
}
