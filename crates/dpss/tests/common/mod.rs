//! A block store in one process: a master on a port of its own runtime, K block servers on
//! loopback ports reporting to it, and a loaded data set.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bs_dpss::layout::Layout;
use bs_dpss::loader::{self, LoadReport};
use bs_dpss::master;
use bs_dpss::pyramid::Synthetic;
use bs_dpss::{BlockServer, ClientOptions, ServerConfig};

pub struct Cluster {
    pub master: String,
    pub servers: Vec<Option<BlockServer>>,
    pub dirs: tempfile::TempDir,
    _rt: tokio::runtime::Runtime,
}

pub const HEARTBEAT: Duration = Duration::from_millis(100);

impl Cluster {
    /// A master and `k` servers of `disks` disks each, all up.
    pub fn start(k: usize, disks: usize, token: Option<&str>) -> Self {
        Self::start_with(k, disks, token, |_| {})
    }

    /// [`Cluster::start`], each server's configuration changed by `tweak` first.
    pub fn start_with(
        k: usize,
        disks: usize,
        token: Option<&str>,
        tweak: impl Fn(&mut ServerConfig),
    ) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dirs = tempfile::tempdir().unwrap();
        let master = master::start(&rt, "127.0.0.1:0", &dirs.path().join("names.db")).unwrap();
        let mut servers = Vec::new();
        for s in 0..k {
            let d: Vec<PathBuf> =
                (0..disks).map(|n| dirs.path().join(format!("s{s}/d{n}"))).collect();
            let mut cfg = ServerConfig::new(d);
            cfg.name = format!("server-{s}");
            cfg.token = token.map(String::from);
            tweak(&mut cfg);
            servers.push(Some(Self::server(&master, cfg)));
        }
        let c = Self { master, servers, dirs, _rt: rt };
        c.wait_up(k);
        c
    }

    pub fn server(master: &str, cfg: ServerConfig) -> BlockServer {
        let srv = BlockServer::start("127.0.0.1:0", cfg).unwrap();
        master::heartbeat(
            master.to_string(),
            ClientOptions::default(),
            HEARTBEAT,
            srv.stats_source(),
        )
        .unwrap();
        srv
    }

    /// Wait until the master reports `n` servers up.
    pub fn wait_up(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if loader::live_servers(&self.master, &ClientOptions::default())
                .map(|s| s.len())
                .unwrap_or(0)
                == n
            {
                return;
            }
            assert!(Instant::now() < deadline, "{n} servers never came up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Load a generated image of `side`² pixels in tiles of 256 with `r` copies.
    pub fn load(
        &self,
        name: &str,
        side: u64,
        r: u32,
        opts: &ClientOptions,
    ) -> (Synthetic, Result<LoadReport, bs_dpss::DpssError>) {
        let src = Synthetic { width: side, height: side, tile: 256 };
        // A name a loader just gave up is freed once the block servers have drained what
        // it had sent; until then a load of it is told another loader holds it. Asked again
        // until a deadline, never after a fixed sleep.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let servers = loader::live_servers(&self.master, &ClientOptions::default()).unwrap();
            let layout = Layout::plan(name, "image", (side, side), 256, servers, r).unwrap();
            let rep = loader::load(&self.master, layout, &src, opts, &mut |_, _| {});
            let held =
                matches!(&rep, Err(e) if e.to_string().contains("being loaded by another loader"));
            if !held || Instant::now() >= deadline {
                return (src, rep);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
