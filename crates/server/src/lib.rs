//! The store server: a gRPC control plane (route, stat, list, delete, negotiate) and a TCP
//! data plane that moves the bytes a negotiation granted, one thread per transfer.
//!
//! Start one with [`Server::start`]; both listeners are bound before it returns, so the
//! addresses it reports are ready to use (tests bind port 0 and never sleep).

mod accept;
mod auth;
mod background;
mod bindings;
mod config;
mod control;
mod data;
mod error;
mod greeting;
mod maintenance;
mod negotiate;
mod scrubber;
mod source;
mod status;
mod tokens;

pub use background::BackgroundServer;
pub use bindings::{BindGrant, Endpoint};
pub use bs_transport::TlsServer;
pub use config::ServerConfig;
pub use error::ServerError;
pub use scrubber::ScrubSchedule;
pub use status::store_status;
pub use tokens::{Direction, Grant, TokenTable};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bs_proto::blob_store_server::BlobStoreServer;
use bs_store::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running server.
pub struct Server {
    control_addr: SocketAddr,
    data_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    data: Arc<data::Shared>,
}

impl Server {
    /// Bind both planes and start serving `store`. Must be called inside a tokio runtime.
    pub async fn start(store: Arc<dyn Store>, cfg: ServerConfig) -> Result<Self, ServerError> {
        let control = tokio::net::TcpListener::bind(cfg.control_addr).await.map_err(|e| {
            ServerError::Bind { what: "control plane", addr: cfg.control_addr, source: e }
        })?;
        let control_addr = control.local_addr()?;
        let data_bind = cfg.data_addr.unwrap_or_else(|| SocketAddr::new(control_addr.ip(), 0));
        let data = tokio::net::TcpListener::bind(data_bind)
            .await
            .map_err(|e| ServerError::Bind { what: "data plane", addr: data_bind, source: e })?;
        let data_addr = data.local_addr()?;
        let (shutdown, rx) = watch::channel(false);
        let tokens = Arc::new(TokenTable::new(cfg.token_ttl));
        let negotiator = Arc::new(negotiate::Negotiator::new(
            store.clone(),
            tokens.clone(),
            data_addr,
            cfg.clone(),
        ));
        let shared = Arc::new(data::Shared::new(store.clone(), negotiator.clone(), &cfg));

        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(maintenance::run(store.clone(), cfg.pending_ttl, rx.clone())));
        if let Some(schedule) = cfg.scrub {
            tasks.push(tokio::spawn(scrubber::run(store.clone(), schedule, rx.clone())));
        }
        let svc = control::ControlService::new(store, data_addr, cfg.clone(), negotiator);
        let svc = BlobStoreServer::with_interceptor(svc, auth::Auth::new(&cfg));
        let mut rx1 = rx.clone();
        // Served as every other plane is: at most `max_control_connections` open at once,
        // each to say something within 30 s (a TLS handshake within 10 s), Nagle's algorithm
        // off so small replies are never held back.
        // Each call bounded by its client's deadline (`grpc-timeout`), as tonic's server does.
        let router = bs_plane::grpc_deadlines(tonic::service::Routes::new(svc).into_axum_router());
        let tls = cfg.tls.as_ref().map(bs_plane::grpc_tls);
        let limits = bs_plane::HttpLimits {
            max_connections: cfg.max_control_connections,
            ..bs_plane::HttpLimits::default()
        };
        let grpc = tokio::spawn(async move {
            let stop = async move {
                let _ = rx1.wait_for(|s| *s).await;
            };
            bs_plane::serve_http(control, router, tls, stop, limits).await;
        });
        let door = accept::FrontDoor::new(shared.clone(), &cfg);
        if let Some(path) = &cfg.unix_socket {
            // A socket file left by a server that did not stop cleanly would block the bind.
            let _ = std::fs::remove_file(path);
            let unix = tokio::net::UnixListener::bind(path)
                .map_err(|e| ServerError::BindUnix { path: path.clone(), source: e })?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
            tasks.push(tokio::spawn(accept::accept_unix_loop(
                unix,
                door.clone(),
                cfg.hello_timeout,
                rx.clone(),
            )));
        }
        let data_task = tokio::spawn(accept::accept_loop(data, door, rx));
        tracing::info!(%control_addr, %data_addr, "blobstream server listening");
        tasks.extend([grpc, data_task]);
        Ok(Self { control_addr, data_addr, shutdown, tasks, data: shared })
    }

    /// Address of the gRPC control plane.
    pub fn control_addr(&self) -> SocketAddr {
        self.control_addr
    }

    /// The live bindings' counters as OpenMetrics families, for a `/metrics` page.
    pub fn bindings_metrics(&self) -> impl Fn() -> String + Send + Sync + 'static {
        let table = self.data.bindings.clone();
        move || table.render_metrics()
    }

    /// Address of the data plane.
    pub fn data_addr(&self) -> SocketAddr {
        self.data_addr
    }

    /// Stop accepting, let running gRPC calls finish, and wait for both listeners to close.
    /// Data transfers already running finish on their own threads.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Stop accepting on both planes, then wait up to `grace` for the data transfers already
    /// running to finish (no new one starts). Returns how many were still running when the
    /// time ran out (0: all finished).
    pub async fn drain(self, grace: Duration) -> usize {
        let data = self.data.clone();
        let stopped = tokio::time::Instant::now() + grace;
        let _ = tokio::time::timeout(grace, self.shutdown()).await;
        data.drain(stopped.saturating_duration_since(tokio::time::Instant::now())).await
    }
}
