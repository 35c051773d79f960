//! `blobstream serve`: the store server on the embedded default (a data directory with an
//! SQLite catalogue) or the storage its configuration names (see [`crate::storage`]), until
//! SIGTERM or SIGINT (Ctrl-C): then it stops accepting, gives running
//! transfers a grace period to finish, and exits with status 0.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bs_imaging::registry::Registry;
use bs_server::{ScrubSchedule, Server, ServerConfig};
use bs_web::{WebConfig, WebServer};

use crate::cli::{Global, ServeArgs};
use crate::security;
use crate::signals::Signals;
use crate::storage;

pub fn run(g: &Global, a: ServeArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal; a log file gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let storage = storage::open(&a)?;
    tracing::info!("storing into {}", storage.describe);
    let (store, index) = (storage.store, Arc::new(storage.index));
    let registry = Arc::new(match &a.filters {
        Some(dir) => Registry::with_dir(dir)
            .with_context(|| format!("loading filter definitions from {}", dir.display()))?,
        None => Registry::builtin(),
    });
    let web_cfg = WebConfig {
        addr: a.http,
        max_upload: a.max_upload,
        max_uploads: a.max_uploads,
        min_upload_rate: a.min_upload_rate,
        http: bs_plane::HttpLimits {
            max_connections: a.max_http_connections,
            ..bs_plane::HttpLimits::default()
        },
        auth_token: security::token(g)?,
        tls: security::server_tls(&a.tls)?,
        dpss_master: a.dpss_master.clone(),
        dpss_token: a.dpss_token.clone(),
        dpss_tls: security::trust(a.dpss_ca.as_deref(), None)?,
        ..WebConfig::default()
    };
    let cfg = ServerConfig {
        control_addr: a.addr,
        data_addr: a.data_addr,
        advertise_data: a.advertise.clone(),
        token_ttl: Duration::from_secs(a.token_ttl),
        io_timeout: Duration::from_secs(a.io_timeout),
        max_connections: a.max_connections,
        max_bindings: a.max_bindings,
        max_control_connections: a.max_control_connections,
        min_transfer_rate: a.min_transfer_rate,
        data_keepalive: Duration::from_secs(a.data_keepalive),
        max_idle_data_connections: a.max_idle_data_connections,
        hello_timeout: Duration::from_secs(a.hello_timeout),
        hello_timeout_under_pressure: Duration::from_secs(a.hello_timeout_under_pressure),
        max_unauthenticated: a.max_unauthenticated,
        max_unauthenticated_per_ip: a.max_unauthenticated_per_ip,
        max_unsized_upload: a.max_unsized_upload,
        auth_failure_burst: a.auth_failure_burst,
        auth_failure_interval: Duration::from_secs(a.auth_failure_interval),
        auth_token: security::token(g)?,
        tls: security::server_tls(&a.tls)?,
        scrub: (a.scrub_every > 0).then(|| ScrubSchedule {
            first_after: Duration::from_secs(600),
            every: Duration::from_secs(a.scrub_every * 3600),
            rate: a.scrub_rate.max(1) << 20,
        }),
        unix_socket: a.unix_socket.clone(),
        schedule: a.schedule,
        max_binding_rate: a.max_binding_rate,
        udp: !a.no_udp,
        ..ServerConfig::default()
    };
    if cfg.auth_token.is_none() && !cfg.control_addr.ip().is_loopback() {
        tracing::warn!(
            "listening beyond loopback without an auth token: anyone who can connect can read and write"
        );
    }
    if !a.no_http && !web_cfg.addr.ip().is_loopback() {
        if web_cfg.auth_token.is_none() {
            tracing::warn!(
                "HTTP on {} beyond loopback without an auth token: anyone who can connect can \
                 read, write and delete (requests by host name are refused; use --auth-token-file)",
                web_cfg.addr
            );
        } else if web_cfg.tls.is_none() {
            tracing::warn!(
                "HTTP on {} beyond loopback without TLS: the auth token crosses the network in \
                 clear (use --tls-cert/--tls-key)",
                web_cfg.addr
            );
        }
    }
    raise_fd_limit(
        cfg.max_unauthenticated
            + cfg.max_connections
            + cfg.max_bindings
            + cfg.max_control_connections
            + 1024,
    );
    let grace = Duration::from_secs(a.shutdown_grace);
    let rt = tokio::runtime::Runtime::new().context("starting the runtime")?;
    let res = rt.block_on(async move {
        // Before the addresses are printed: from then on a signal drains instead of killing.
        let mut signals = Signals::install().context("installing signal handlers")?;
        let server = Server::start(store.clone(), cfg).await?;
        let web = if a.no_http {
            None
        } else {
            let web = WebServer::start(store.clone(), index, registry.clone(), web_cfg)
                .await
                .context("starting the HTTP server")?;
            let state = web.state().clone();
            state.metrics.add_source(std::sync::Arc::new(server.bindings_metrics()));
            let seed = !a.no_samples;
            let seeded = tokio::task::spawn_blocking(move || {
                let n = if seed { bs_web::seed_samples(&state)? } else { 0 };
                // Blobs stored over gRPC or by an older version: index them in the background.
                std::thread::spawn(move || {
                    if let Err(e) = bs_web::index_all(&state) {
                        tracing::warn!("indexing stored images: {e}");
                    }
                });
                Ok::<_, bs_web::WebError>(n)
            })
            .await?
            .context("storing the sample images")?;
            if seeded > 0 {
                tracing::info!("empty store: added {seeded} sample images under samples/");
            }
            Some(web)
        };
        let _watch = a.filters.is_some().then(|| registry.watch(Duration::from_secs(2)));
        // Best effort: a closed stdout must not take the server down.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "blobstream is serving {}", store.describe());
        let _ = writeln!(out, "  control plane (gRPC): {}", server.control_addr());
        let _ = writeln!(out, "  data plane (TCP):     {}", server.data_addr());
        if let Some(web) = &web {
            let _ = writeln!(out, "  web (HTTP):           {}", web.url());
            let _ =
                writeln!(out, "open {} in a browser to browse, view, filter and upload", web.url());
        }
        let _ = writeln!(out, "try: blobstream --server {} put FILE NAME", server.control_addr());
        let _ = out.flush();
        drop(out);
        let which = signals.next().await;
        tracing::info!("{which}: stopping; running transfers have {} s to finish", grace.as_secs());
        let web_stopped = async {
            if let Some(web) = web {
                let stopped = tokio::time::timeout(grace, web.shutdown()).await;
                if stopped.is_err() {
                    tracing::warn!("HTTP requests still running after {} s", grace.as_secs());
                }
            }
        };
        let stopped = async { tokio::join!(web_stopped, server.drain(grace)).1 };
        tokio::select! {
            left = stopped => match left {
                0 => tracing::info!("stopped; every data transfer finished"),
                n => tracing::warn!("stopped; {n} data transfers cut short after {} s", grace.as_secs()),
            },
            again = signals.next() => tracing::warn!("{again} again: stopping now"),
        }
        Ok(())
    });
    // Whatever still runs on the blocking pool was given its grace period already.
    rt.shutdown_timeout(Duration::from_secs(1));
    res
}

/// Raise the soft limit on open files towards `want` (within the hard limit): every data
/// connection waiting for its token holds a descriptor.
fn raise_fd_limit(want: usize) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit with a valid, writable struct.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    let want = (want as libc::rlim_t).min(lim.rlim_max);
    if !ok || lim.rlim_cur >= want {
        return;
    }
    let raised = libc::rlimit { rlim_cur: want, ..lim };
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        tracing::warn!("cannot raise the open-file limit from {} to {want}", lim.rlim_cur);
    }
}
