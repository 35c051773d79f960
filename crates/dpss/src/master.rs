//! The master and name server on one gRPC port (`blobstream.v1.Dpss`, plus `GET /metrics`):
//! membership and statistics of the block servers from their heartbeats, the catalogue of
//! published data sets, and request-list planning.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bs_proto as pb;
use tonic::{Request, Response, Status};

use crate::ClientOptions;
use crate::block::{BlockId, Priority};
use crate::catalog::Catalog;
use crate::error::DpssError;
use crate::layout::Layout;
use crate::server::ServerStats;

/// A server not heard from for this long is reported down (and planned around).
pub const DOWN_AFTER: Duration = Duration::from_secs(5);

struct Seen {
    status: pb::DpssServerStatus,
    at: Instant,
    prev: Option<(Instant, u64, u64)>,
}

/// One server's share of a planned list: (server index in the layout, its blocks).
pub type ServerList = (usize, Vec<(BlockId, Priority)>);

/// The master's state.
pub struct Master {
    catalog: Mutex<Catalog>,
    servers: Mutex<BTreeMap<String, Seen>>,
}

impl Master {
    pub fn new(catalog: Catalog) -> Arc<Self> {
        Arc::new(Self { catalog: Mutex::new(catalog), servers: Mutex::default() })
    }

    /// Every server the master has heard from, with rates and whether it is up.
    pub fn servers(&self) -> Vec<pb::DpssServerStatus> {
        let servers = self.servers.lock().unwrap();
        servers
            .values()
            .map(|s| {
                let mut st = s.status.clone();
                st.age_s = s.at.elapsed().as_secs_f64();
                st.up = s.at.elapsed() < DOWN_AFTER;
                if let Some((t, disk, sent)) = s.prev {
                    let dt = s.at.duration_since(t).as_secs_f64().max(1e-3);
                    let disk_now: u64 = st.disk_bytes.iter().sum();
                    st.disk_mb_s = disk_now.saturating_sub(disk) as f64 / dt / 1e6;
                    st.send_mb_s = st.sent_bytes.saturating_sub(sent) as f64 / dt / 1e6;
                }
                st
            })
            .collect()
    }

    fn up(&self) -> HashMap<String, bool> {
        let servers = self.servers.lock().unwrap();
        servers.iter().map(|(a, s)| (a.clone(), s.at.elapsed() < DOWN_AFTER)).collect()
    }

    pub fn lookup(&self, dataset: &str) -> Result<Layout, DpssError> {
        self.catalog.lock().unwrap().lookup(dataset)
    }

    /// Per server, the blocks of `list` it should send: each block from its first copy on a
    /// server that is up (the primary when none is known to be).
    pub fn plan(
        &self,
        dataset: &str,
        list: &[(BlockId, Priority)],
    ) -> Result<Vec<ServerList>, DpssError> {
        let layout = self.lookup(dataset)?;
        let up = self.up();
        let mut out: BTreeMap<usize, Vec<(BlockId, Priority)>> = BTreeMap::new();
        for &(id, p) in list {
            if !layout.contains(id) {
                return Err(DpssError::UnknownBlock {
                    dataset: dataset.into(),
                    block: id.to_string(),
                });
            }
            let locs = layout.locations(id);
            let alive = |s: &usize| up.get(&layout.servers[*s].addr).copied().unwrap_or(false);
            let s = locs.iter().map(|l| l.0).find(alive).unwrap_or(locs[0].0);
            out.entry(s).or_default().push((id, p));
        }
        Ok(out.into_iter().collect())
    }
}

fn stats_pb(s: &ServerStats) -> pb::DpssServerStatus {
    pb::DpssServerStatus {
        name: s.name.clone(),
        addr: s.addr.clone(),
        disks: s.disks,
        datasets: s.datasets,
        disk_bytes: s.disk_bytes.clone(),
        disk_reads: s.disk_reads.clone(),
        cache_hits: s.cache_hits,
        cache_bytes: s.cache_bytes,
        queued: s.queued.clone(),
        sent_blocks: s.sent_blocks,
        sent_bytes: s.sent_bytes,
        lists: s.lists,
        flushed: s.flushed,
        corrupt: s.corrupt,
        clients: s.clients,
        ..Default::default()
    }
}

struct Service(Arc<Master>);

fn st(e: DpssError) -> Status {
    e.to_status()
}

#[tonic::async_trait]
impl pb::dpss_server::Dpss for Service {
    async fn heartbeat(
        &self,
        req: Request<pb::DpssServerStatus>,
    ) -> Result<Response<pb::DpssHeartbeatReply>, Status> {
        let s = req.into_inner();
        if s.addr.is_empty() {
            return Err(Status::invalid_argument("a heartbeat names its server's address"));
        }
        let mut servers = self.0.servers.lock().unwrap();
        let now = Instant::now();
        let prev = servers
            .get(&s.addr)
            .map(|p| (p.at, p.status.disk_bytes.iter().sum(), p.status.sent_bytes));
        servers.insert(s.addr.clone(), Seen { status: s, at: now, prev });
        Ok(Response::new(pb::DpssHeartbeatReply {}))
    }

    async fn status(
        &self,
        _req: Request<pb::DpssStatusRequest>,
    ) -> Result<Response<pb::DpssStatusResponse>, Status> {
        let datasets = self.0.catalog.lock().unwrap().list().map_err(st)?;
        Ok(Response::new(pb::DpssStatusResponse {
            servers: self.0.servers(),
            datasets: datasets.iter().map(pb::DpssLayout::from).collect(),
        }))
    }

    async fn lookup(
        &self,
        req: Request<pb::DpssLookupRequest>,
    ) -> Result<Response<pb::DpssLayout>, Status> {
        let l = self.0.lookup(&req.into_inner().dataset).map_err(st)?;
        Ok(Response::new((&l).into()))
    }

    async fn plan(
        &self,
        req: Request<pb::DpssPlanRequest>,
    ) -> Result<Response<pb::DpssPlanResponse>, Status> {
        let r = req.into_inner();
        if r.blocks.len() > crate::conn::MAX_LIST {
            return Err(st(DpssError::ListTooLong {
                got: r.blocks.len(),
                max: crate::conn::MAX_LIST,
            }));
        }
        let mut list = Vec::with_capacity(r.blocks.len());
        for b in &r.blocks {
            let p = u8::try_from(b.priority).ok().and_then(Priority::from_u8);
            let p =
                p.ok_or_else(|| Status::invalid_argument(format!("priority {}", b.priority)))?;
            let level =
                u8::try_from(b.level).map_err(|_| Status::invalid_argument("level > 255"))?;
            list.push((BlockId::new(level, b.x, b.y), p));
        }
        let layout = self.0.lookup(&r.dataset).map_err(st)?;
        let plans = self.0.plan(&r.dataset, &list).map_err(st)?;
        let lists = plans
            .into_iter()
            .map(|(s, blocks)| pb::DpssServerList {
                server: layout.servers[s].name.clone(),
                addr: layout.servers[s].addr.clone(),
                blocks: blocks
                    .into_iter()
                    .map(|(id, p)| pb::DpssBlockRef {
                        level: id.level as u32,
                        x: id.x,
                        y: id.y,
                        priority: p as u32,
                    })
                    .collect(),
            })
            .collect();
        Ok(Response::new(pb::DpssPlanResponse { lists }))
    }

    async fn publish(
        &self,
        req: Request<pb::DpssPublishRequest>,
    ) -> Result<Response<pb::DpssPublishResponse>, Status> {
        let r = req.into_inner();
        let layout =
            r.layout.ok_or_else(|| Status::invalid_argument("publish without a layout"))?;
        let layout = Layout::try_from(layout).map_err(st)?;
        crate::block::check_name(&layout.dataset).map_err(st)?;
        let m = self.0.clone();
        tokio::task::spawn_blocking(move || m.catalog.lock().unwrap().publish(&layout, &r.blocks))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map_err(st)?;
        Ok(Response::new(pb::DpssPublishResponse {}))
    }

    async fn unpublish(
        &self,
        req: Request<pb::DpssLookupRequest>,
    ) -> Result<Response<pb::DpssUnpublishResponse>, Status> {
        let name = req.into_inner().dataset;
        crate::block::check_name(&name).map_err(st)?;
        let m = self.0.clone();
        let existed =
            tokio::task::spawn_blocking(move || m.catalog.lock().unwrap().unpublish(&name))
                .await
                .map_err(|e| Status::internal(e.to_string()))?
                .map_err(st)?;
        Ok(Response::new(pb::DpssUnpublishResponse { existed }))
    }
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Every server's counters as OpenMetrics text.
pub fn render_metrics(servers: &[pb::DpssServerStatus]) -> String {
    type Get = fn(&pb::DpssServerStatus) -> f64;
    let families: [(&str, &str, &str, Get); 9] = [
        ("up", "gauge", "1 while the server's heartbeats arrive", |s| f64::from(u8::from(s.up))),
        ("disk_read_bytes_total", "counter", "Bytes read from the server's disks", |s| {
            s.disk_bytes.iter().sum::<u64>() as f64
        }),
        ("disk_mb_per_second", "gauge", "Disk read rate between the last two heartbeats", |s| {
            s.disk_mb_s
        }),
        ("cache_hits_total", "counter", "Blocks served from the cache", |s| s.cache_hits as f64),
        ("queued_reads", "gauge", "Disk reads waiting", |s| s.queued.iter().sum::<u32>() as f64),
        ("sent_bytes_total", "counter", "Block bytes sent to clients", |s| s.sent_bytes as f64),
        ("send_mb_per_second", "gauge", "Send rate between the last two heartbeats", |s| {
            s.send_mb_s
        }),
        ("flushed_total", "counter", "Requests dropped because a new list replaced theirs", |s| {
            s.flushed as f64
        }),
        ("corrupt_blocks_total", "counter", "Blocks that failed their digest on disk", |s| {
            s.corrupt as f64
        }),
    ];
    let mut out = String::new();
    for (name, kind, help, get) in families {
        let metric = format!("blobstream_dpss_{}", name.trim_end_matches("_total"));
        out.push_str(&format!("# HELP {metric} {help}.\n# TYPE {metric} {kind}\n"));
        for s in servers {
            out.push_str(&format!(
                "blobstream_dpss_{name}{{server=\"{}\",addr=\"{}\"}} {}\n",
                label(&s.name),
                label(&s.addr),
                get(s)
            ));
        }
    }
    out.push_str("# EOF\n");
    out
}

/// Serve the master on `listener` (TLS and a token as `secure` says) until the future is
/// dropped.
/// The calls that change what the block store serves (a server's report of itself, a load's
/// plan and publication, a drop): with an admin token set, only it opens them.
pub const ADMIN_CALLS: &[&str] = &[
    "/blobstream.v1.Dpss/Heartbeat",
    "/blobstream.v1.Dpss/Plan",
    "/blobstream.v1.Dpss/Publish",
    "/blobstream.v1.Dpss/Unpublish",
];

pub async fn serve(
    listener: tokio::net::TcpListener,
    master: Arc<Master>,
    secure: bs_plane::Secure,
) -> std::io::Result<()> {
    let secure = bs_plane::Secure { admin_paths: ADMIN_CALLS, ..secure };
    let m = master.clone();
    let svc = pb::dpss_server::DpssServer::new(Service(master))
        .max_decoding_message_size(256 << 20)
        .max_encoding_message_size(256 << 20);
    let router = tonic::service::Routes::new(svc).into_axum_router().route(
        "/metrics",
        axum::routing::get(move || {
            let m = m.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    render_metrics(&m.servers()),
                )
            }
        }),
    );
    bs_plane::serve(listener, router, secure, std::future::pending()).await
}

/// A gRPC client of the master.
pub type MasterClient = pb::dpss_client::DpssClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, bs_plane::Bearer>,
>;

/// A gRPC client of the master at `addr` (host:port), over TLS and with the token in `opts`
/// when given.
pub async fn connect(addr: &str, opts: &ClientOptions) -> Result<MasterClient, DpssError> {
    let (channel, bearer) = bs_plane::connect(addr, opts)
        .await
        .map_err(|e| DpssError::Master(format!("the master: {e}")))?;
    Ok(pb::dpss_client::DpssClient::with_interceptor(channel, bearer)
        .max_decoding_message_size(256 << 20)
        .max_encoding_message_size(256 << 20))
}

/// Report `stats()` to the master at `master` every `every`, on a thread of its own, until
/// `stats()` returns `None` (the server is gone). Failures are logged and retried.
pub fn heartbeat(
    master: String,
    opts: ClientOptions,
    every: Duration,
    stats: impl Fn() -> Option<ServerStats> + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("dpss-heartbeat".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => return tracing::error!(error = %e, "no runtime for heartbeats"),
        };
        rt.block_on(async move {
            let mut client = None;
            let mut warned = false;
            while let Some(s) = stats() {
                if client.is_none() {
                    client = match connect(&master, &opts).await {
                        Ok(c) => Some(c),
                        Err(e) => {
                            if !warned {
                                tracing::warn!(%master, error = %e, "heartbeat failed");
                            }
                            warned = true;
                            None
                        }
                    };
                }
                if let Some(c) = client.as_mut() {
                    match c.heartbeat(stats_pb(&s)).await {
                        Ok(_) => warned = false,
                        Err(e) => {
                            if !warned {
                                tracing::warn!(%master, error = %e.message(), "heartbeat failed");
                            }
                            warned = true;
                            client = None;
                        }
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
    })
}

/// The master's status (every server and data set), from blocking code.
pub fn fetch_status(addr: &str, opts: &ClientOptions) -> Result<pb::DpssStatusResponse, DpssError> {
    crate::client::block_on(async {
        let mut c = connect(addr, opts).await?;
        let r = c.status(pb::DpssStatusRequest {}).await;
        r.map(|r| r.into_inner()).map_err(|e| DpssError::Master(bs_plane::explain(addr, opts, &e)))
    })
}

/// Open the catalogue at `catalog`, bind `addr` and serve the master on `rt`, in the clear and
/// without a token; returns the address it listens on (for `addr` with port 0).
pub fn start(
    rt: &tokio::runtime::Runtime,
    addr: &str,
    catalog: &std::path::Path,
) -> Result<String, DpssError> {
    start_secure(rt, addr, catalog, bs_plane::Secure::default())
}

/// [`start`] with TLS and a token as `secure` says.
pub fn start_secure(
    rt: &tokio::runtime::Runtime,
    addr: &str,
    catalog: &std::path::Path,
    secure: bs_plane::Secure,
) -> Result<String, DpssError> {
    let cat = Catalog::open(catalog)?;
    let listener = rt.block_on(tokio::net::TcpListener::bind(addr))?;
    let bound = listener.local_addr()?.to_string();
    rt.spawn(serve(listener, Master::new(cat), secure));
    Ok(bound)
}
