//! The HTTP plane of blobstream: an axum server beside the gRPC control plane and the TCP
//! data plane, serving the blob store over HTTP (`/blobs/`), JSON endpoints for browsing,
//! metadata search and filters (`/api/`), the OpenAPI document, Prometheus metrics, and the
//! browser client (`/`). See docs/http-api.md.
//!
//! Start one with [`WebServer::start`]; the listener is bound before it returns, so
//! [`WebServer::addr`] is ready to use (tests bind port 0).

mod api;
mod assets;
mod auth;
mod blobs;
mod body;
mod dicomweb;
mod edge;
mod error;
mod follow;
mod images;
mod info;
mod keys;
pub mod metrics;
pub mod openapi;
mod paced;
mod range;
pub mod samples;
mod sessions;
mod studies;
mod throttle;
pub mod tiles;
mod upload;

pub use error::WebError;
pub use images::Images;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::Uri;
use axum::routing::{get, post};
use bs_imageio::Limits;
use bs_imaging::registry::Registry;
use bs_meta::ImageIndex;
use bs_store::{RouteSpec, Store};
use bs_transport::TlsServer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Every route with its methods, as the OpenAPI document names them (a test keeps the two in
/// step). The browser client's static files are served besides these.
pub const ROUTES: &[(&str, &[&str])] = &[
    ("/blobs/{key}", &["get", "head", "put", "delete"]),
    ("/blobs", &["post"]),
    ("/api/list", &["get"]),
    ("/api/search", &["get"]),
    ("/api/studies", &["get"]),
    ("/api/studies/{study}/series", &["get"]),
    ("/api/series/{series}/instances", &["get"]),
    ("/api/filters", &["get"]),
    ("/api/filter", &["post"]),
    ("/api/meta/{key}", &["get"]),
    ("/api/pixels/{key}", &["get"]),
    ("/api/thumbnail/{key}", &["get"]),
    ("/api/session", &["get", "post", "delete"]),
    ("/api/health", &["get"]),
    ("/api/openapi.json", &["get"]),
    ("/metrics", &["get"]),
    ("/api/dpss/datasets", &["get"]),
    ("/api/dpss/view/{dataset}", &["post"]),
    ("/iiif/{dataset}", &["get"]),
    ("/iiif/{dataset}/info.json", &["get"]),
    ("/iiif/{dataset}/{region}/{size}/{rotation}/{file}", &["get"]),
    ("/dicomweb/studies", &["get", "post"]),
    ("/dicomweb/studies/{study}", &["get", "post"]),
    ("/dicomweb/studies/{study}/metadata", &["get"]),
    ("/dicomweb/studies/{study}/series", &["get"]),
    ("/dicomweb/studies/{study}/series/{series}", &["get"]),
    ("/dicomweb/studies/{study}/series/{series}/metadata", &["get"]),
    ("/dicomweb/studies/{study}/series/{series}/instances", &["get"]),
    ("/dicomweb/studies/{study}/series/{series}/instances/{instance}", &["get"]),
    ("/dicomweb/studies/{study}/series/{series}/instances/{instance}/metadata", &["get"]),
    ("/dicomweb/studies/{study}/series/{series}/instances/{instance}/frames/{frames}", &["get"]),
    ("/dicomweb/studies/{study}/series/{series}/instances/{instance}/rendered", &["get"]),
    ("/dicomweb/wado", &["get"]),
];

/// Source addresses whose failed token checks are tracked at once (beyond it, new addresses
/// share one allowance).
const THROTTLED_ADDRS: usize = 4096;

/// How the HTTP server listens and what it allows.
#[derive(Debug, Clone)]
pub struct WebConfig {
    pub addr: SocketAddr,
    /// Largest upload accepted, in bytes (413 above).
    pub max_upload: u64,
    /// Limits for decoding stored images.
    pub limits: Limits,
    /// When set, API requests need this bearer token (or the session cookie).
    pub auth_token: Option<String>,
    /// When set, HTTPS only.
    pub tls: Option<TlsServer>,
    /// Most uploads in progress at once (503 beyond).
    pub max_uploads: usize,
    /// An upload that sends nothing for this long is dropped (and nothing is stored).
    pub idle_timeout: std::time::Duration,
    /// An upload slower than this many bytes a second on average, once `idle_timeout` has
    /// passed, is dropped (and nothing is stored); 0: no floor.
    pub min_upload_rate: u64,
    /// Connections and header timeout of the HTTP server.
    pub http: bs_plane::HttpLimits,
    /// Wrong tokens one source address may present in a row before its token checks are
    /// answered 429; the allowance then comes back at one per `auth_failure_refill`.
    pub auth_failure_burst: u32,
    pub auth_failure_refill: std::time::Duration,
    /// How long a browser session (the cookie `POST /api/session` sets) lasts.
    pub session_ttl: std::time::Duration,
    /// The block store's master: serve its data sets' tiles (IIIF) and the tiled viewer.
    pub dpss_master: Option<String>,
    /// The token the block store (its master and servers) requires.
    pub dpss_token: Option<String>,
    /// Speak TLS to the block store's master and servers, trusting this CA.
    pub dpss_tls: Option<bs_transport::TlsClient>,
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_upload: 64 << 30,
            limits: Limits::default(),
            auth_token: None,
            tls: None,
            max_uploads: 64,
            idle_timeout: std::time::Duration::from_secs(30),
            min_upload_rate: 1024,
            http: bs_plane::HttpLimits::default(),
            auth_failure_burst: 10,
            auth_failure_refill: std::time::Duration::from_secs(6),
            session_ttl: std::time::Duration::from_secs(12 * 3600),
            dpss_master: None,
            dpss_token: None,
            dpss_tls: None,
        }
    }
}

impl WebConfig {
    /// Defaults on loopback port 0 (for tests and benchmarks).
    pub fn ephemeral() -> Self {
        Self { addr: SocketAddr::from(([127, 0, 0, 1], 0)), ..Self::default() }
    }
}

/// What every handler shares.
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub images: Images,
    pub registry: Arc<Registry>,
    pub cfg: WebConfig,
    pub metrics: metrics::Metrics,
    /// One permit per upload in progress.
    uploads: Arc<tokio::sync::Semaphore>,
    /// Decoding and filtering take memory and every core: this many at a time, others wait.
    image_work: tokio::sync::Semaphore,
    /// Browser sessions (`POST /api/session`).
    sessions: sessions::Sessions,
    /// Failed token checks per source address.
    throttle: throttle::Throttle,
    /// The block store's tiles, when `dpss_master` is set.
    tiles: Option<Arc<tiles::Tiles>>,
}

impl AppState {
    /// A slot for one upload, or 503 when all are taken.
    pub(crate) fn upload_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, WebError> {
        self.uploads.clone().try_acquire_owned().map_err(|_| {
            WebError::Busy(format!(
                "{} uploads are in progress, the most this server takes at once; try again",
                self.cfg.max_uploads
            ))
        })
    }

    /// Wait for a turn at decoding or filtering.
    pub(crate) async fn image_turn(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.image_work.acquire().await.expect("the semaphore is never closed")
    }

    /// [`AppState::image_turn`] from blocking code (a thread of the blocking pool).
    pub(crate) fn image_turn_here(&self) -> tokio::sync::SemaphorePermit<'_> {
        tokio::runtime::Handle::current().block_on(self.image_turn())
    }
}

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let static_files = |r: Router<Arc<AppState>>| {
        assets::ASSETS.iter().fold(r, |r, (path, _, _)| {
            r.route(path, get(move || async move { assets::serve(path) }))
        })
    };
    let api = Router::new()
        .route("/blobs", post(blobs::post).layer(DefaultBodyLimit::disable()))
        .route(
            "/blobs/{*key}",
            get(blobs::get).head(blobs::get).put(blobs::put).delete(blobs::delete),
        )
        .route("/api/list", get(api::list))
        .route("/api/search", get(api::search))
        .route("/api/studies", get(studies::studies))
        .route("/api/studies/{study}/series", get(studies::series))
        .route("/api/series/{series}/instances", get(studies::instances))
        .route("/api/filters", get(api::filters))
        .route("/api/filter", post(api::filter))
        .route("/api/meta/{*key}", get(api::meta))
        .route("/api/pixels/{*key}", get(api::pixels))
        .route("/api/thumbnail/{*key}", get(api::thumbnail))
        .route("/api/session", get(auth::status).post(auth::login).delete(auth::logout))
        .route("/api/health", get(api::health))
        .route("/api/openapi.json", get(|| async { axum::Json(openapi::document()) }))
        .route("/metrics", get(metrics::handler))
        .route("/api/dpss/datasets", get(tiles::datasets))
        .route("/api/dpss/view/{dataset}", post(tiles::view))
        .route("/iiif/{dataset}", get(tiles::base))
        .route("/iiif/{dataset}/info.json", get(tiles::info))
        .route("/iiif/{dataset}/{region}/{size}/{rotation}/{file}", get(tiles::tile));
    static_files(dicomweb::routes(api))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(edge::EdgeLayer::new(state.clone()))
        .with_state(state)
}

async fn not_found(uri: Uri) -> WebError {
    WebError::NoRoute(uri.path().to_string())
}

async fn method_not_allowed(req: Request) -> WebError {
    WebError::MethodNotAllowed { method: req.method().to_string(), path: req.uri().path().into() }
}

/// Run blocking store or image work off the async executor.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WebError> + Send + 'static,
) -> Result<T, WebError> {
    tokio::task::spawn_blocking(f).await.map_err(WebError::internal)?
}

/// Parse the query string into `T`, with a JSON error on failure.
pub(crate) fn query<T: serde::de::DeserializeOwned>(uri: &Uri) -> Result<T, WebError> {
    // Decoding would turn bytes that are not UTF-8 into U+FFFD, so `prefix=%ff/` would ask for
    // another prefix than sent: refused, as such a key in a path is.
    for part in uri.query().unwrap_or_default().split('&') {
        if percent_encoding::percent_decode_str(part).decode_utf8().is_err() {
            return Err(WebError::BadRequest(format!(
                "query string: {part:?} is percent-encoding that is not UTF-8"
            )));
        }
    }
    axum::extract::Query::<T>::try_from_uri(uri)
        .map(|q| q.0)
        .map_err(|e| WebError::BadRequest(format!("query string: {}", e.body_text())))
}

/// A request that takes no query parameters: one given is refused (400), so that a misspelt
/// or invented option (`?overwrite=false`, `?dry_run=1`) cannot be ignored while the request
/// goes ahead.
pub(crate) fn no_query(uri: &Uri) -> Result<(), WebError> {
    query_only::<Vec<(String, String)>>(uri, &[]).map(|_| ())
}

/// [`query`], refusing any parameter not in `allowed`: a misspelt criterion must not silently
/// widen a search.
pub(crate) fn query_only<T: serde::de::DeserializeOwned>(
    uri: &Uri,
    allowed: &[&str],
) -> Result<T, WebError> {
    for (k, _) in query::<Vec<(String, String)>>(uri)? {
        if !allowed.contains(&k.as_str()) {
            let takes = if allowed.is_empty() { "none".into() } else { allowed.join(", ") };
            return Err(WebError::BadRequest(format!(
                "unknown query parameter {k:?} (this takes {takes})"
            )));
        }
    }
    query(uri)
}

/// A running HTTP server.
pub struct WebServer {
    addr: SocketAddr,
    https: bool,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
    state: Arc<AppState>,
}

impl WebServer {
    /// Bind and serve. Must be called inside a tokio runtime.
    pub async fn start(
        store: Arc<dyn Store>,
        index: Arc<ImageIndex>,
        registry: Arc<Registry>,
        cfg: WebConfig,
    ) -> Result<Self, WebError> {
        let listener = tokio::net::TcpListener::bind(cfg.addr)
            .await
            .map_err(|source| WebError::Listen { addr: cfg.addr, source })?;
        let addr = listener.local_addr().map_err(WebError::internal)?;
        let images = Images::new(store.clone(), index, cfg.limits);
        let tls = cfg.tls.clone();
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let state = Arc::new(AppState {
            store,
            images,
            registry,
            uploads: Arc::new(tokio::sync::Semaphore::new(cfg.max_uploads.max(1))),
            image_work: tokio::sync::Semaphore::new(cores.max(2)),
            sessions: sessions::Sessions::new(cfg.session_ttl, sessions::MAX_SESSIONS),
            throttle: throttle::Throttle::new(
                cfg.auth_failure_burst,
                cfg.auth_failure_refill,
                THROTTLED_ADDRS,
            ),
            tiles: cfg.dpss_master.clone().map(|m| {
                let opts = bs_dpss::ClientOptions {
                    token: cfg.dpss_token.clone(),
                    tls: cfg.dpss_tls.clone(),
                };
                Arc::new(tiles::Tiles::new(m, opts))
            }),
            cfg,
            metrics: metrics::Metrics::default(),
        });
        follow::follow_store(&state);
        let app = router(state.clone());
        let (shutdown, mut rx) = watch::channel(false);
        let stop = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let limits = state.cfg.http;
        let task = tokio::spawn(bs_plane::serve_http(
            listener,
            app,
            tls.map(|t| t.config()),
            stop,
            limits,
        ));
        Ok(Self { addr, https: state.cfg.tls.is_some(), shutdown, task, state })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL to open in a browser.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}/", self.addr)
    }

    /// Shared state (for seeding and tests).
    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// Stop accepting, let requests in flight finish, and return.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

/// Put the sample images into `store` if it holds no blob at all; returns how many were
/// stored. Also indexes them.
pub fn seed_samples(state: &AppState) -> Result<usize, WebError> {
    if !state.store.list("", "", 1)?.is_empty() {
        return Ok(0);
    }
    let samples = samples::all();
    for (name, content_type, bytes) in &samples {
        let spec = RouteSpec {
            name: name.to_string(),
            content_type: content_type.to_string(),
            overwrite: false,
            ..RouteSpec::default()
        };
        bs_store::put_bytes(state.store.as_ref(), &spec, bytes)?;
        state.images.refresh(name)?;
    }
    Ok(samples.len())
}

/// Index every blob the image index has no current entry for (blobs stored through gRPC or
/// the CLI, or before this version). Meant for a background thread at start-up.
pub fn index_all(state: &AppState) -> Result<usize, WebError> {
    let mut after = String::new();
    let mut n = 0;
    loop {
        let page = state.store.list("", &after, 256)?;
        let Some(last) = page.last() else { return Ok(n) };
        after = last.name.clone();
        for rec in page {
            if state.images.known(&rec).is_none() {
                match state.images.refresh(&rec.name) {
                    Ok(_) => n += 1,
                    Err(WebError::NotFound(_)) => {}
                    Err(e) => tracing::warn!("indexing {}: {e}", rec.name),
                }
            }
        }
    }
}
