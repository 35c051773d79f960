//! `blobstream bench dpss`: the parallel block store against baselines in the same run, as
//! medians of paired runs — one block server streaming cached blocks against raw TCP moving
//! the same bytes (the ISS paper's comparison with ttcp); K = 1..4 servers on hosts of their
//! own (network namespaces, each link shaped to B with tbf) against K × B; and the quality of
//! lattice declustering against disk modulo and the optimum.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use bs_dpss::layout::Layout;
use bs_dpss::master;
use bs_dpss::placement::{Lattice, quality_table};
use bs_dpss::pyramid::TileSource;
use bs_dpss::{BlockId, BlockServer, Client, ClientOptions, DpssError, ServerConfig};

use crate::bindings::{Row, RowsReport};
use crate::error::BenchError;
use crate::machine::machine_description;
use crate::options::BenchOptions;
use crate::payload::{MB, median, payload};

const BLOCK: u64 = 256 * 1024;

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Baseline(e.to_string())
}

struct Mem(bytes::Bytes);

impl TileSource for Mem {
    fn block(&self, id: BlockId) -> Result<Vec<u8>, DpssError> {
        let off = id.x as usize * BLOCK as usize;
        Ok(self.0[off..(off + BLOCK as usize).min(self.0.len())].to_vec())
    }
}

/// Raw TCP: the same bytes written in block-sized writes, read into one buffer.
fn raw_tcp(data: &bytes::Bytes) -> Result<f64, BenchError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(err)?;
    let addr = l.local_addr().map_err(err)?;
    let d = data.clone();
    let t = thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        for c in d.chunks(BLOCK as usize) {
            s.write_all(c)?;
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr).map_err(err)?;
    let mut buf = vec![0u8; BLOCK as usize];
    let started = Instant::now();
    let mut got = 0u64;
    loop {
        let n = s.read(&mut buf).map_err(err)?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    t.join().map_err(|_| err("raw TCP sender panicked"))?.map_err(err)?;
    if got != data.len() as u64 {
        return Err(err(format!("raw TCP moved {got} of {} bytes", data.len())));
    }
    Ok(got as f64 * 8.0 / secs / 1e9)
}

/// One block server, every block already in its cache: all of them, high priority, each
/// block used and let go as it arrives (as raw TCP reads into one buffer).
fn ours(c: &mut Client, ids: &[BlockId], bytes: u64) -> Result<f64, BenchError> {
    let list: Vec<_> = ids.iter().map(|&id| (id, bs_dpss::Priority::High)).collect();
    let started = Instant::now();
    c.request(&list).map_err(err)?;
    let (mut n, mut blocks) = (0u64, 0usize);
    while blocks < ids.len() {
        match c.next(Duration::from_secs(60)) {
            Some(bs_dpss::Event::Block { data, .. }) => {
                n += data.len() as u64;
                blocks += 1;
            }
            Some(bs_dpss::Event::Lost { id, reason }) => {
                return Err(err(format!("{id}: {reason}")));
            }
            Some(_) => {}
            None => return Err(err("the block server went quiet")),
        }
    }
    let secs = started.elapsed().as_secs_f64();
    if n != bytes {
        return Err(err(format!("the block server delivered {n} of {bytes} bytes")));
    }
    Ok(n as f64 * 8.0 / secs / 1e9)
}

fn one_server(opts: &BenchOptions, runs: usize, total: u64) -> Result<Row, BenchError> {
    let dir = tempfile::tempdir().map_err(err)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(err)?;
    let maddr = master::start(&rt, "127.0.0.1:0", &dir.path().join("names.db")).map_err(err)?;
    let mut cfg = ServerConfig::new(vec![dir.path().join("disk")]);
    cfg.cache_bytes = (total * 2) as usize;
    let srv = BlockServer::start("127.0.0.1:0", cfg).map_err(err)?;
    let servers = vec![bs_dpss::ServerRef {
        name: srv.name().to_string(),
        addr: srv.addr().to_string(),
        disks: 1,
    }];
    let data = payload(total);
    let layout =
        Layout::plan("bench", "file", (total, 1), BLOCK as u32, servers, 1).map_err(err)?;
    bs_dpss::loader::load(
        &maddr,
        layout,
        &Mem(data.clone()),
        &ClientOptions::default(),
        &mut |_, _| {},
    )
    .map_err(err)?;
    let mut c = Client::open(&maddr, "bench", ClientOptions::default()).map_err(err)?;
    let ids: Vec<BlockId> = c.layout().all_blocks().collect();
    ours(&mut c, &ids, total)?; // warms the cache
    opts.say(&format!(
        "one block server, cached blocks vs raw TCP ({runs} runs of {} MB)",
        total / MB
    ));
    let (mut o, mut r) = (Vec::new(), Vec::new());
    for i in 0..runs {
        if i % 2 == 0 {
            o.push(ours(&mut c, &ids, total)?);
            r.push(raw_tcp(&data)?);
        } else {
            r.push(raw_tcp(&data)?);
            o.push(ours(&mut c, &ids, total)?);
        }
    }
    let (o, r) = (median(&o), median(&r));
    Ok(Row {
        group: "block server",
        what: format!(
            "one server streaming {} KiB blocks from its cache to one client, {} MB per run, \
             each block checked against its digest and used as it arrives",
            BLOCK / 1024,
            total / MB
        ),
        ours: o,
        baseline: r,
        baseline_name: "raw TCP, the same bytes in the same writes".into(),
        unit: "Gbit/s",
        ratio: o / r,
        ratio_means: "ours / baseline",
        target: Some((0.95, true)),
    })
}

/// K servers on hosts of their own behind links of B: `scripts/dpss-hosts.py --bench`.
fn shaped(opts: &BenchOptions, runs: usize) -> Result<Option<Vec<Row>>, BenchError> {
    let what = "K = 1..4 servers in network namespaces behind 200 Mbit/s links";
    let Some(v) = crate::hosts::run_script(opts, "dpss-hosts.py", runs, what)? else {
        return Ok(None);
    };
    let link = v["link_mbit"].as_f64().unwrap_or(200.0);
    let mut rows = Vec::new();
    for k in 1..=4u32 {
        let rates = crate::hosts::numbers(&v["runs"][k.to_string()]);
        if rates.is_empty() {
            return Err(BenchError::Baseline(format!("no rates for K = {k}")));
        }
        let m = median(&rates);
        rows.push(Row {
            group: "shaped links",
            what: format!(
                "K = {k} servers, each on its own host behind a {link} Mbit/s tbf link, one client \
                 reading a 128 MiB data set (1 MiB blocks)"
            ),
            ours: m,
            baseline: link * k as f64,
            baseline_name: format!("K × B = {k} × {link} Mbit/s"),
            unit: "Mbit/s",
            ratio: m / (link * k as f64),
            ratio_means: "ours / (K × B)",
            target: Some((0.9, true)),
        });
    }
    Ok(Some(rows))
}

/// Run the benchmark.
pub fn run_dpss(opts: &BenchOptions) -> Result<RowsReport, BenchError> {
    let (runs, total) = if opts.quick { (3, 64 * MB) } else { (7, 256 * MB) };
    let mut rows = vec![one_server(opts, runs, total)?];
    let mut notes = Vec::new();
    match shaped(opts, if opts.quick { 2 } else { 3 })? {
        Some(r) => rows.extend(r),
        None => notes.push(
            "not root, or no ip/tc: no rows for servers on hosts of their own (network namespaces)"
                .into(),
        ),
    }
    let (truns, requests) = if opts.quick { (2, 1000) } else { (7, 4000) };
    match crate::dpss_tiles::tiles_vs_nginx(opts, truns, requests)? {
        Some(r) => {
            rows.extend(r);
            notes.push(
                "tiles: rates are medians; each ratio is the median of the per-run ratios (our \
                 run i against nginx's run i), so it can differ from the ratio of the medians; \
                 every timed pass, ours or nginx's, starts once the machine is idle; the first \
                 run checks every body against the tile's bytes, on both"
                    .into(),
            );
        }
        None => notes.push("nginx is not installed (scripts/bench-setup.sh): no tile rows".into()),
    }
    // Declustering: computed, not timed.
    let ks: Vec<u32> = (4..=32).collect();
    let ws: Vec<u32> = (2..=8).collect();
    let table = quality_table(&ks, &ws);
    for k in [8u32, 16, 32] {
        let of = |f: fn(&bs_dpss::placement::QualityRow) -> u32| -> u32 {
            table.iter().filter(|r| r.k == k).map(f).sum()
        };
        let (lat, modulo, opt) = (of(|r| r.lattice), of(|r| r.modulo), of(|r| r.optimum));
        rows.push(Row {
            group: "declustering",
            what: format!(
                "K = {k} disks (lattice h = {}): most tiles one disk serves for a w×w window, summed over w = 2..8",
                Lattice::new(k).map_or(0, |l| l.h)
            ),
            ours: lat as f64,
            baseline: opt as f64,
            baseline_name: format!("the optimum ⌈w²/K⌉ (disk modulo, h = 1: {modulo})"),
            unit: "tiles",
            ratio: opt as f64 / lat as f64,
            ratio_means: "optimum / ours (1 is optimal)",
            target: None,
        });
    }
    let mut t = String::from(
        "declustering, for each K: h, then per w = 2..8 the most tiles one disk serves \
         lattice / modulo / optimum:",
    );
    for k in ks {
        let r: Vec<_> = table.iter().filter(|r| r.k == k).collect();
        let cells: Vec<String> =
            r.iter().map(|r| format!("{}/{}/{}", r.lattice, r.modulo, r.optimum)).collect();
        t.push_str(&format!(" K={k} h={}: {};", r[0].h, cells.join(" ")));
    }
    notes.push(t);
    notes.push("block server, client and raw TCP share this machine's two cores".into());
    Ok(RowsReport {
        title: "Parallel block store",
        command: "blobstream bench dpss",
        runs,
        machine: machine_description(),
        quick: opts.quick,
        rows,
        notes,
    })
}
