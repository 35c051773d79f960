//! `blobstream dpss …`: the parallel block store's roles as processes — master, block server,
//! all of them at once on loopback, loader, status and reading blocks.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bs_dpss::layout::Layout;
use bs_dpss::loader::{self, LoadReport};
use bs_dpss::master;
use bs_dpss::pyramid::{FileBlocks, ImagePyramid, Synthetic, TileSource};
use bs_dpss::{BlockServer, Client, ClientOptions, ServerConfig};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::{DpssAuth, DpssCommand, DpssLoadArgs, DpssServerArgs, Global};

/// How often a block server reports to the master.
const HEARTBEAT: Duration = Duration::from_secs(1);

pub fn run(g: &Global, c: DpssCommand) -> Result<()> {
    match c {
        DpssCommand::Master { addr, catalog, token, admin_token, tls } => {
            let tls = crate::security::server_tls(&tls)?;
            let secure = bs_plane::Secure { tls, token, admin_token, ..Default::default() };
            run_master(&addr, &catalog, secure)
        }
        DpssCommand::Server(a) => server(a),
        DpssCommand::Local { servers, disks, dir, master, first_port, cache_mb, token, tls } => {
            let shape = Shape { servers, disks, first_port, cache_mb };
            local(shape, &dir, &master, token, tls)
        }
        DpssCommand::Load(a) => load(g, a),
        DpssCommand::Status { master, json, auth } => status(&master, json, &auth),
        DpssCommand::Simulate { dataset, master, rate, lists, tiles, level, json, auth } => {
            let mut c = Client::open(&master, &dataset, client_options(&auth)?)?;
            let levels = c.layout().levels;
            if level >= levels {
                bail!("{dataset} has no level {level} (its levels are 0 to {})", levels - 1);
            }
            let w = bs_dpss::simulate::Workload {
                lists_per_second: rate,
                lists,
                tiles,
                level,
                ..Default::default()
            };
            let rep = bs_dpss::simulate::run(&mut c, &w, |_| {})?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rep)?);
            } else {
                print!("{}", rep.table());
            }
            if rep.lost > 0 {
                bail!("{} blocks could not be delivered by any copy", rep.lost);
            }
            Ok(())
        }
        DpssCommand::Drop { dataset, master, auth } => {
            let r = loader::remove(&master, &dataset, &client_options(&auth)?)?;
            if r.was_published {
                println!("removed {dataset} from {} live servers", r.servers.len());
            } else if !r.held.is_empty() {
                println!(
                    "{dataset} was not published (dropped before while a server was down, or \
                     its load failed): removed its blocks from {}",
                    r.held.join(", ")
                );
            }
            for (s, why) in &r.failed {
                eprintln!("server {s}: {why} (its blocks stay until `dpss drop` runs again)");
            }
            for s in &r.down {
                eprintln!(
                    "server {s} is down: any blocks of {dataset} it holds stay until `dpss drop \
                     {dataset}` runs again once it is up"
                );
            }
            let missed = r.failed.len() + r.down.len();
            if missed > 0 {
                bail!("{missed} servers could not remove {dataset} (named above)");
            }
            if !r.was_published && r.held.is_empty() {
                bail!(
                    "no data set {dataset:?}: it is not published and none of the {} live \
                     servers holds blocks of it (`blobstream dpss status` lists data sets)",
                    r.servers.len()
                );
            }
            Ok(())
        }
        DpssCommand::Get { dataset, master, level, out, json, auth } => {
            get(&dataset, &master, level, &out, json, &auth)
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

/// Start the master on `addr` in `rt`; returns the address it listens on.
fn start_master(
    rt: &tokio::runtime::Runtime,
    addr: &str,
    catalog: &Path,
    secure: bs_plane::Secure,
) -> Result<String> {
    if let Some(parent) = catalog.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    master::start_secure(rt, addr, catalog, secure)
        .with_context(|| format!("master on {addr}, catalogue {}", catalog.display()))
}

fn wait_for_signal(rt: &tokio::runtime::Runtime, what: &str) -> Result<()> {
    let sig = rt.block_on(async {
        let mut s = crate::signals::Signals::install()?;
        Ok::<_, std::io::Error>(s.next().await)
    })?;
    let _ = writeln!(std::io::stdout(), "{sig}: {what} stopped");
    Ok(())
}

fn run_master(addr: &str, catalog: &Path, secure: bs_plane::Secure) -> Result<()> {
    let rt = runtime()?;
    let offered = secure.describe();
    let bound = start_master(&rt, addr, catalog, secure)?;
    println!(
        "blobstream dpss master (and name server) on {bound}: gRPC and GET /metrics ({offered})"
    );
    println!("  catalogue {}", catalog.display());
    wait_for_signal(&rt, "master")
}

/// The block server, started, and what it offers (TLS, a token) for the start-up line.
fn start_server(a: &DpssServerArgs) -> Result<(BlockServer, String)> {
    let mut cfg = ServerConfig::new(a.disks.clone());
    cfg.name = a.name.clone().unwrap_or_default();
    cfg.cache_bytes = a.cache_mb << 20;
    cfg.max_connections = a.max_connections;
    cfg.token = a.token.clone();
    cfg.admin_token = a.admin_token.clone();
    cfg.tls = crate::security::server_tls(&a.tls)?;
    let offers = bs_plane::Secure {
        tls: cfg.tls.clone(),
        token: a.token.clone(),
        admin_token: a.admin_token.clone(),
        ..Default::default()
    }
    .describe();
    cfg.advertise_host = a.advertise_host.clone();
    let srv =
        BlockServer::start(&a.addr, cfg).with_context(|| format!("block server on {}", a.addr))?;
    // A server's report of itself is a change the master's admin token guards, when set.
    let to_master = ClientOptions {
        token: a.admin_token.clone().or_else(|| a.token.clone()),
        tls: crate::security::trust(a.master_ca.as_deref(), None)?,
    };
    master::heartbeat(a.master.clone(), to_master, HEARTBEAT, srv.stats_source())?;
    Ok((srv, offers.to_string()))
}

fn server(a: DpssServerArgs) -> Result<()> {
    let (srv, offers) = start_server(&a)?;
    println!(
        "blobstream dpss block server {} on {} ({} disks; {}), reporting to {}",
        srv.name(),
        srv.addr(),
        a.disks.len(),
        offers,
        a.master
    );
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    wait_for_signal(&rt, "block server")
}

/// How many block servers `dpss local` starts, and how.
struct Shape {
    servers: usize,
    disks: usize,
    first_port: u16,
    cache_mb: usize,
}

fn local(
    shape: Shape,
    dir: &Path,
    master: &str,
    token: Option<String>,
    tls: crate::cli::ServerTls,
) -> Result<()> {
    let Shape { servers, disks, first_port, cache_mb } = shape;
    if servers == 0 || disks == 0 {
        bail!("--servers and --disks must be at least 1");
    }
    let rt = runtime()?;
    let tls_server = crate::security::server_tls(&tls)?;
    let secure = bs_plane::Secure { tls: tls_server, token: token.clone(), ..Default::default() };
    let offered = secure.describe();
    let with_tls = secure.tls.is_some();
    let mut bound = start_master(&rt, master, &dir.join("names.db"), secure)?;
    if with_tls && let Some(port) = bound.strip_prefix("127.0.0.1:") {
        // Reached by name, as the certificate must say (loopback: localhost).
        bound = format!("localhost:{port}");
    }
    println!("blobstream dpss master (and name server) on {bound} ({offered})");
    let mut running = Vec::new();
    for s in 0..servers {
        let a = DpssServerArgs {
            disks: (0..disks).map(|d| dir.join(format!("server{s}/disk{d}"))).collect(),
            addr: if first_port == 0 {
                "127.0.0.1:0".to_string()
            } else {
                format!("127.0.0.1:{}", first_port as usize + s)
            },
            master: bound.clone(),
            name: Some(format!("server{s}")),
            cache_mb,
            max_connections: bs_dpss::server::ServerConfig::new(Vec::new()).max_connections,
            token: token.clone(),
            admin_token: None,
            tls: crate::cli::ServerTls {
                tls_cert: tls.tls_cert.clone(),
                tls_key: tls.tls_key.clone(),
            },
            // Self-signed: the certificate is its own CA, and names localhost.
            master_ca: tls.tls_cert.clone(),
            advertise_host: with_tls.then(|| "localhost".to_string()),
        };
        let (srv, _) = start_server(&a)?;
        println!(
            "  block server {} on {} ({disks} disk{} under {})",
            srv.name(),
            srv.addr(),
            if disks == 1 { "" } else { "s" },
            dir.display()
        );
        running.push(srv);
    }
    wait_for_signal(&rt, "block store")
}

fn client_options(a: &DpssAuth) -> Result<ClientOptions> {
    Ok(ClientOptions {
        token: a.token.clone(),
        tls: crate::security::trust(a.ca.as_deref(), None)?,
    })
}

/// `--synthetic WIDTHxHEIGHT`; anything else is a usage error.
fn parse_size(s: &str) -> Result<(u64, u64)> {
    let side = |v: &str| v.trim().parse::<u64>().ok().filter(|&n| n > 0);
    match s.split_once(['x', 'X']).map(|(w, h)| (side(w), side(h))) {
        Some((Some(w), Some(h))) => Ok((w, h)),
        _ => crate::commands::usage!(
            "--synthetic {s:?}: give WIDTHxHEIGHT in pixels, each at least 1 (e.g. 32768x32768)"
        ),
    }
}

fn load(g: &Global, a: DpssLoadArgs) -> Result<()> {
    let most = bs_dpss::disk::MAX_BLOCK;
    if a.block_size == 0 || a.block_size as usize > most {
        crate::commands::usage!(
            "--block-size {} is not in 1..={most} (a block is at most 16 MiB)",
            a.block_size
        );
    }
    if a.tile == 0 {
        crate::commands::usage!("--tile 0: a tile is at least 1 pixel square");
    }
    if a.copies == Some(0) {
        crate::commands::usage!("--copies 0: every block needs at least one copy");
    }
    let opts = client_options(&a.auth)?;
    let servers = loader::live_servers(&a.master, &opts)?;
    let copies = a.copies.unwrap_or(if servers.len() >= 2 { 2 } else { 1 });
    if copies as usize > servers.len() {
        bail!(
            "--copies {copies} needs {copies} live block servers; the master knows {}",
            servers.len()
        );
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} blocks eta {eta}")?
            .progress_chars("=> "),
    );
    bar.set_message(format!("loading {}", a.dataset));
    if !g.quiet && std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
    }
    let mut progress = |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let tiff = match &a.image {
        Some(path) if a.tile.is_multiple_of(2) => bs_dpss::tiffband::streamable(path)
            .with_context(|| format!("reading {}", path.display()))?
            .map(|s| (path, s)),
        _ => None,
    };
    let rep = if let Some((path, (w, h, channels))) = tiff {
        // A TIFF is read band by band: memory holds a few bands per level, not the image.
        let mut layout = Layout::plan(&a.dataset, "image", (w, h), a.tile, servers, copies)?;
        layout.channels = channels;
        let (tile, levels) = (layout.tile, layout.levels);
        let mut produce =
            |emit: &mut dyn FnMut(bs_dpss::BlockId, Vec<u8>) -> Result<(), bs_dpss::DpssError>| {
                bs_dpss::tiffband::stream(path, tile, levels, emit)
            };
        loader::load_from(&a.master, layout, &opts, &mut progress, &mut produce)
    } else {
        let (src, layout): (Box<dyn TileSource>, Layout) = if let Some(size) = &a.synthetic {
            let (w, h) = parse_size(size)?;
            let mut layout = Layout::plan(&a.dataset, "image", (w, h), a.tile, servers, copies)?;
            layout.channels = Synthetic::CHANNELS;
            (Box::new(Synthetic { width: w, height: h, tile: a.tile }), layout)
        } else if let Some(file) = &a.file {
            let f = FileBlocks::open(file, a.block_size)
                .with_context(|| format!("reading {}", file.display()))?;
            let layout =
                Layout::plan(&a.dataset, "file", (f.len, 1), a.block_size, servers, copies)?;
            (Box::new(f), layout)
        } else {
            let path = a.image.as_ref().expect("clap requires one source");
            // Levels follow from the size, so the pyramid is built once the image is read.
            let probe = ImagePyramid::read(path, a.tile, 1)
                .with_context(|| format!("reading {}", path.display()))?;
            let (w, h) = probe.size();
            let mut layout = Layout::plan(&a.dataset, "image", (w, h), a.tile, servers, copies)?;
            layout.channels = probe.channels();
            (Box::new(probe.with_levels(layout.levels)), layout)
        };
        loader::load(&a.master, layout, src.as_ref(), &opts, &mut progress)
    };
    bar.finish_and_clear();
    let rep: LoadReport =
        rep.with_context(|| format!("loading {} (nothing was published)", a.dataset))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        println!(
            "loaded {}: {} blocks in {} levels, {} bytes ({} written with {} copies) over {} servers \
             ({} disks, lattice h = {}) in {:.1} s",
            rep.dataset,
            rep.blocks,
            rep.levels,
            rep.bytes,
            rep.written,
            rep.r,
            rep.servers,
            rep.k,
            rep.h,
            rep.seconds
        );
    }
    Ok(())
}

fn status(master: &str, json: bool, auth: &DpssAuth) -> Result<()> {
    let st = master::fetch_status(master, &client_options(auth)?)?;
    if json {
        let servers: Vec<_> = st
            .servers
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name, "addr": s.addr, "up": s.up, "age_s": s.age_s, "disks": s.disks,
                    "datasets": s.datasets, "disk_bytes": s.disk_bytes, "disk_reads": s.disk_reads,
                    "disk_mb_s": s.disk_mb_s, "cache_hits": s.cache_hits, "cache_bytes": s.cache_bytes,
                    "queued": s.queued, "sent_blocks": s.sent_blocks, "sent_bytes": s.sent_bytes,
                    "send_mb_s": s.send_mb_s, "lists": s.lists, "flushed": s.flushed,
                    "corrupt": s.corrupt, "clients": s.clients,
                })
            })
            .collect();
        let datasets: Vec<_> =
            st.datasets.into_iter().filter_map(|d| Layout::try_from(d).ok()).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"servers": servers, "datasets": datasets})
            )?
        );
        return Ok(());
    }
    let mut servers = crate::table::Table::new(&[
        "SERVER",
        "ADDRESS",
        "UP",
        ">DISKS",
        ">DISK MB/s",
        ">SEND MB/s",
        ">CACHE HITS",
        ">QUEUE",
        ">FLUSHED",
        ">CORRUPT",
    ]);
    for s in &st.servers {
        servers.row(vec![
            s.name.clone(),
            s.addr.clone(),
            if s.up { "yes" } else { "NO" }.into(),
            s.disks.to_string(),
            format!("{:.1}", s.disk_mb_s),
            format!("{:.1}", s.send_mb_s),
            s.cache_hits.to_string(),
            s.queued.iter().sum::<u32>().to_string(),
            s.flushed.to_string(),
            s.corrupt.to_string(),
        ]);
    }
    print!("{}", servers.render());
    if st.servers.is_empty() {
        println!("(no block server has reported)");
    }
    println!();
    let mut sets = crate::table::Table::new(&[
        "DATA SET", "KIND", ">SIZE", ">LEVELS", ">BLOCKS", ">BYTES", ">K", ">R",
    ]);
    for d in &st.datasets {
        sets.row(vec![
            d.dataset.clone(),
            d.kind.clone(),
            format!("{}x{}", d.width, d.height),
            d.levels.to_string(),
            d.blocks.to_string(),
            d.bytes.to_string(),
            d.k.to_string(),
            d.r.to_string(),
        ]);
    }
    print!("{}", sets.render());
    Ok(())
}

fn get(
    dataset: &str,
    master: &str,
    level: Option<u8>,
    out: &Path,
    json: bool,
    auth: &DpssAuth,
) -> Result<()> {
    let mut c = Client::open(master, dataset, client_options(auth)?)?;
    let layout = c.layout().clone();
    let ids: Vec<_> = layout.all_blocks().filter(|b| level.is_none_or(|l| b.level == l)).collect();
    if ids.is_empty() {
        bail!("{dataset} has no level {}", level.unwrap_or_default());
    }
    let mut written = 0u64;
    std::fs::create_dir_all(out)?;
    let whole: PathBuf = out.join(dataset);
    let file = (layout.kind == "file").then(|| std::fs::File::create(&whole)).transpose()?;
    let mut seconds = 0.0;
    for part in ids.chunks(bs_dpss::conn::MAX_LIST) {
        let started = std::time::Instant::now();
        let got = c.fetch(part, Duration::from_secs(120))?;
        seconds += started.elapsed().as_secs_f64();
        for id in part {
            let data = &got[id];
            written += data.len() as u64;
            match &file {
                Some(f) => {
                    use std::os::unix::fs::FileExt;
                    f.write_all_at(data, id.x as u64 * layout.tile as u64)?;
                }
                None => {
                    let dir = out.join(id.level.to_string());
                    std::fs::create_dir_all(&dir)?;
                    std::fs::write(dir.join(format!("{}_{}.{}", id.x, id.y, layout.format)), data)?;
                }
            }
        }
    }
    if json {
        let lost: Vec<_> =
            c.lost_servers().into_iter().map(|(s, _)| layout.servers[s].name.clone()).collect();
        println!(
            "{}",
            serde_json::json!({"blocks": ids.len(), "bytes": written, "seconds": seconds, "servers_lost": lost})
        );
        return Ok(());
    }
    if let Some(f) = file {
        f.sync_all()?;
        println!("{}: {written} bytes, {} blocks verified", whole.display(), ids.len());
    } else {
        println!("{}: {} tiles, {written} bytes, verified", out.display(), ids.len());
    }
    for (s, why) in c.lost_servers() {
        eprintln!(
            "warning: server {} was lost ({why}); its blocks came from copies",
            layout.servers[s].name
        );
    }
    Ok(())
}
