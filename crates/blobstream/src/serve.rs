//! `blobstream serve`: the store server on the embedded default (a data directory with an
//! SQLite catalogue), until Ctrl-C.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bs_server::{Server, ServerConfig};
use bs_store::{FsStore, MemStore, Store};

use crate::cli::{Global, ServeArgs};
use crate::security;

pub fn run(g: &Global, a: ServeArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let store: Arc<dyn Store> = if a.memory {
        Arc::new(MemStore::with_capacity(a.memory_limit.unwrap_or_else(half_the_memory)))
    } else {
        Arc::new(
            FsStore::open(&a.data)
                .with_context(|| format!("opening the store in {}", a.data.display()))?,
        )
    };
    let cfg = ServerConfig {
        control_addr: a.addr,
        data_addr: a.data_addr,
        advertise_data: a.advertise.clone(),
        token_ttl: Duration::from_secs(a.token_ttl),
        io_timeout: Duration::from_secs(a.io_timeout),
        max_connections: a.max_connections,
        auth_token: security::token(g)?,
        tls: security::server_tls(&a)?,
        ..ServerConfig::default()
    };
    if cfg.auth_token.is_none() && !cfg.control_addr.ip().is_loopback() {
        tracing::warn!(
            "listening beyond loopback without an auth token: anyone who can connect can read and write"
        );
    }
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    rt.block_on(async move {
        let server = Server::start(store.clone(), cfg).await?;
        // Best effort: a closed stdout must not take the server down.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "blobstream is serving {}", store.describe());
        let _ = writeln!(out, "  control plane (gRPC): {}", server.control_addr());
        let _ = writeln!(out, "  data plane (TCP):     {}", server.data_addr());
        let _ = writeln!(out, "try: blobstream --server {} put FILE NAME", server.control_addr());
        let _ = out.flush();
        drop(out);
        tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
        eprintln!("shutting down");
        server.shutdown().await;
        Ok(())
    })
}

/// Half of MemTotal from /proc/meminfo (1 GiB if it cannot be read).
fn half_the_memory() -> u64 {
    let kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    });
    kib.map_or(1 << 30, |k| k * 1024 / 2)
}
