//! `/metrics`: request counts by route, method and status; request latencies; bytes sent and
//! received; filter run times — in the Prometheus/OpenMetrics text format (prometheus-client).

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;

use crate::AppState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FilterLabels {
    filter: String,
}

type Hist<L> = Family<L, Histogram, fn() -> Histogram>;

/// One route's metrics, looked up in the families once (their label sets are Strings:
/// building them for every request cost three allocations and three hashed lookups); the
/// handles share their values with the families, which render them.
struct RouteMetrics {
    route: String,
    latency: Histogram,
    /// Made on the route's first response with a length, as the family's series always was.
    bytes_out: std::sync::OnceLock<Counter>,
    /// Request counters by (method, status): a route sees a handful.
    requests: RwLock<Vec<(Method, u16, Counter)>>,
}

impl RouteMetrics {
    fn requests(&self, m: &Metrics, method: &Method, status: u16) -> Counter {
        let known = self.requests.read().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, c)) = known.iter().find(|(k, s, _)| k == method && *s == status) {
            return c.clone();
        }
        drop(known);
        let labels =
            RequestLabels { route: self.route.clone(), method: method.to_string(), status };
        let c = m.requests.get_or_create(&labels).clone();
        let mut known = self.requests.write().unwrap_or_else(|p| p.into_inner());
        if !known.iter().any(|(k, s, _)| k == method && *s == status) {
            known.push((method.clone(), status, c.clone()));
        }
        c
    }
}

/// The server's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    latency: Hist<RouteLabels>,
    bytes_out: Family<RouteLabels, Counter>,
    /// Each route's handles into the three families above.
    routes: RwLock<HashMap<String, Arc<RouteMetrics>>>,
    bytes_in: Counter,
    filter_seconds: Hist<FilterLabels>,
    corrupt: Counter,
    groups: Counter,
    grouped_writes: Counter,
    /// More metric families, rendered by other parts of the process (the data plane's
    /// bindings), in the text exposition format.
    sources: Mutex<Vec<MetricsSource>>,
}

/// Renders metric families (`# HELP`/`# TYPE` lines and samples, no `# EOF`).
pub type MetricsSource = Arc<dyn Fn() -> String + Send + Sync>;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("blobstream_http");
        let requests = Family::<RequestLabels, Counter>::default();
        r.register("requests", "HTTP requests by route, method and status", requests.clone());
        let latency: Hist<RouteLabels> = Family::new_with_constructor(latency_histogram);
        r.register("request_duration_seconds", "Time to the response head", latency.clone());
        let bytes_out = Family::<RouteLabels, Counter>::default();
        r.register("response_bytes", "Response body bytes (Content-Length)", bytes_out.clone());
        let bytes_in = Counter::default();
        r.register("upload_bytes", "Bytes stored by PUT and POST uploads", bytes_in.clone());
        let filter_seconds: Hist<FilterLabels> = Family::new_with_constructor(latency_histogram);
        r.register("filter_duration_seconds", "Time one filter step took", filter_seconds.clone());
        let corrupt = Counter::default();
        r.register(
            "corrupt_chunks_found",
            "Stored chunks that failed their digest check when read (any reader of this process)",
            corrupt.clone(),
        );
        let groups = Counter::default();
        r.register(
            "catalogue_group_commits",
            "Catalogue write transactions committed (a durable one is one fsync), every database of this process",
            groups.clone(),
        );
        let grouped_writes = Counter::default();
        r.register(
            "catalogue_group_commit_writes",
            "Writes those transactions held (more than one per commit: commits were shared)",
            grouped_writes.clone(),
        );
        Self {
            registry: Mutex::new(r),
            requests,
            latency,
            bytes_out,
            routes: RwLock::default(),
            bytes_in,
            filter_seconds,
            corrupt,
            groups,
            grouped_writes,
            sources: Mutex::new(Vec::new()),
        }
    }
}

/// What a request's count needs from it, taken as it comes in (see [`crate::edge`]).
pub struct Seen {
    matched: Option<MatchedPath>,
    method: Method,
    at: Instant,
}

impl Seen {
    pub fn new(req: &Request) -> Self {
        let matched = req.extensions().get::<MatchedPath>().cloned();
        Self { matched, method: req.method().clone(), at: Instant::now() }
    }
}

/// The handles of the route one service answers for, kept by that service (each route has
/// its own): a request finds them without the lock and the hashed lookup of
/// [`Metrics::route`]. Checked against the request's route each time, so a service that
/// answers for several (none does today) still counts each under its own.
#[derive(Default)]
pub struct RouteMemo(std::sync::OnceLock<Arc<RouteMetrics>>);

impl Metrics {
    /// The handles of `route` (a route's pattern, so there are few), made on first use.
    fn route(&self, route: &str) -> Arc<RouteMetrics> {
        if let Some(r) = self.routes.read().unwrap_or_else(|p| p.into_inner()).get(route) {
            return r.clone();
        }
        let labels = RouteLabels { route: route.to_string() };
        let made = Arc::new(RouteMetrics {
            route: route.to_string(),
            latency: self.latency.get_or_create(&labels).clone(),
            bytes_out: std::sync::OnceLock::new(),
            requests: RwLock::default(),
        });
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        routes.entry(route.to_string()).or_insert(made).clone()
    }

    /// Count a request's answer (fallback's under route "unmatched"): its latency, the bytes
    /// of its body, and the request by method and status.
    pub fn count(&self, memo: &RouteMemo, seen: &Seen, resp: &Response) {
        let name = seen.matched.as_ref().map_or("unmatched", |p| p.as_str());
        // Looked up after the response, so a route's series appear with its first answer.
        let looked_up;
        let route = match memo.0.get() {
            Some(r) if r.route == name => r,
            _ => {
                looked_up = self.route(name);
                let _ = memo.0.set(looked_up.clone());
                &looked_up
            }
        };
        route.latency.observe(seen.at.elapsed().as_secs_f64());
        // Its length: as the header says (a blob's stream), else as the body knows it (JSON).
        let len = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .or_else(|| axum::body::HttpBody::size_hint(resp.body()).exact());
        if let Some(n) = len.filter(|_| seen.method != Method::HEAD) {
            let labels = || RouteLabels { route: route.route.clone() };
            route
                .bytes_out
                .get_or_init(|| self.bytes_out.get_or_create(&labels()).clone())
                .inc_by(n);
        }
        route.requests(self, &seen.method, resp.status().as_u16()).inc();
    }

    pub fn uploaded(&self, bytes: u64) {
        self.bytes_in.inc_by(bytes);
    }

    /// Include `source`'s families in every rendering.
    pub fn add_source(&self, source: MetricsSource) {
        self.sources.lock().unwrap_or_else(|p| p.into_inner()).push(source);
    }

    pub fn filtered(&self, filter: &str, seconds: f64) {
        self.filter_seconds.get_or_create(&FilterLabels { filter: filter.into() }).observe(seconds);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Brought up to the process-wide counts under the registry lock, so two renders at
        // once cannot both add the difference.
        let g = bs_meta::group_commits();
        for (counter, now) in [
            (&self.corrupt, bs_store::corruption_found()),
            (&self.groups, g.groups),
            (&self.grouped_writes, g.writes),
        ] {
            if now > counter.get() {
                counter.inc_by(now - counter.get());
            }
        }
        let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if !sources.is_empty() {
            // The exposition ends with "# EOF": the other families go before it.
            let end = out.rfind("# EOF").unwrap_or(out.len());
            let mut extra = String::new();
            for s in &sources {
                extra.push_str(&s());
            }
            out.insert_str(end, &extra);
        }
        out
    }
}

/// `GET /metrics`.
pub async fn handler(State(st): State<Arc<AppState>>) -> Response {
    let mut r = st.metrics.render().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}
