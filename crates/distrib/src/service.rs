//! The distributer's status on the network, on one port: the gRPC call
//! `blobstream.v1.Distributer/Status` (`blobstream distributer status`) and `GET /metrics`
//! (OpenMetrics text) with the same counters.

use std::sync::Arc;

use bs_proto as pb;
use tonic::{Request, Response, Status};

use crate::distributer::FlowStatus;

/// Where the status comes from ([`crate::Distributer::status_source`]).
pub type StatusSource = Arc<dyn Fn() -> Vec<FlowStatus> + Send + Sync>;

struct Service(StatusSource);

fn to_pb(flows: Vec<FlowStatus>) -> pb::DistributerStatusResponse {
    let flows = flows
        .into_iter()
        .map(|f| pb::DistributerFlow {
            stream: f.stream,
            flow: f.flow,
            policy: f.policy,
            transport: f.transport,
            sender: f.sender,
            running: f.running,
            receivers: f
                .receivers
                .into_iter()
                .map(|r| pb::DistributerReceiver {
                    name: r.name,
                    departed: !r.connected,
                    delivered: r.delivered,
                    rate_bytes_per_second: r.rate_bytes_per_second,
                    queued_messages: u32::try_from(r.queued_messages).unwrap_or(u32::MAX),
                    queued_bytes: r.queued_bytes,
                    last_error: r.last_error.unwrap_or_default(),
                    lost: r.lost,
                })
                .collect(),
        })
        .collect();
    pb::DistributerStatusResponse { flows }
}

/// Back from the wire form (for the CLI).
pub fn from_pb(r: pb::DistributerStatusResponse) -> Vec<FlowStatus> {
    r.flows
        .into_iter()
        .map(|f| FlowStatus {
            stream: f.stream,
            flow: f.flow,
            policy: f.policy,
            transport: f.transport,
            sender: f.sender,
            running: f.running,
            receivers: f
                .receivers
                .into_iter()
                .map(|r| crate::distributer::ReceiverStatus {
                    name: r.name,
                    connected: !r.departed,
                    delivered: r.delivered,
                    rate_bytes_per_second: r.rate_bytes_per_second,
                    queued_messages: r.queued_messages as usize,
                    queued_bytes: r.queued_bytes,
                    last_error: (!r.last_error.is_empty()).then_some(r.last_error),
                    lost: r.lost,
                })
                .collect(),
        })
        .collect()
}

#[tonic::async_trait]
impl pb::distributer_server::Distributer for Service {
    async fn status(
        &self,
        _req: Request<pb::DistributerStatusRequest>,
    ) -> Result<Response<pb::DistributerStatusResponse>, Status> {
        Ok(Response::new(to_pb((self.0)())))
    }
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The status as OpenMetrics text.
pub fn render_metrics(flows: &[FlowStatus]) -> String {
    let mut out = String::new();
    out.push_str("# HELP blobstream_distributer_flow_running A run is in progress on the flow.\n");
    out.push_str("# TYPE blobstream_distributer_flow_running gauge\n");
    for f in flows {
        out.push_str(&format!(
            "blobstream_distributer_flow_running{{stream=\"{}\",flow=\"{}\"}} {}\n",
            label(&f.stream),
            label(&f.flow),
            u8::from(f.running)
        ));
    }
    type Get = fn(&crate::distributer::ReceiverStatus) -> f64;
    let families: [(&str, &str, Get); 6] = [
        ("delivered_bytes", "Bytes of the current or last run written to the receiver", |r| {
            r.delivered as f64
        }),
        ("rate_bytes_per_second", "The receiver's rate over its current or last run", |r| {
            r.rate_bytes_per_second
        }),
        ("queued_messages", "Messages waiting for the receiver", |r| r.queued_messages as f64),
        ("queued_bytes", "Bytes waiting for the receiver", |r| r.queued_bytes as f64),
        ("receiver_up", "1 while the receiver is connected and in good standing", |r| {
            f64::from(u8::from(r.connected && r.last_error.is_none()))
        }),
        (
            "lost_datagrams",
            "Datagrams the receiver reported lost since it joined (udp flows)",
            |r| r.lost as f64,
        ),
    ];
    for (name, help, get) in families {
        out.push_str(&format!(
            "# HELP blobstream_distributer_{name} {help}.\n# TYPE blobstream_distributer_{name} gauge\n"
        ));
        for f in flows {
            for r in &f.receivers {
                out.push_str(&format!(
                    "blobstream_distributer_{name}{{stream=\"{}\",flow=\"{}\",receiver=\"{}\"}} {}\n",
                    label(&f.stream),
                    label(&f.flow),
                    label(&r.name),
                    get(r)
                ));
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

/// Serve the status call and `/metrics` on `listener` (TLS and a token as `secure` says)
/// until the future is dropped.
pub async fn serve(
    listener: tokio::net::TcpListener,
    source: StatusSource,
    secure: bs_plane::Secure,
) -> std::io::Result<()> {
    let metrics_source = source.clone();
    let router = tonic::service::Routes::new(pb::distributer_server::DistributerServer::new(
        Service(source),
    ))
    .into_axum_router()
    .route(
        "/metrics",
        axum::routing::get(move || {
            let s = metrics_source.clone();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    render_metrics(&s()),
                )
            }
        }),
    )
    .fallback(elsewhere);
    bs_plane::serve(listener, router, secure, std::future::pending()).await
}

/// Any other path: a gRPC call to a method this port does not have is told so as gRPC
/// (UNIMPLEMENTED); anything else — a browser, `curl` at the wrong path — gets a plain 404
/// saying what the port serves, not an empty gRPC answer it cannot read.
async fn elsewhere(req: axum::extract::Request) -> axum::response::Response {
    use axum::response::IntoResponse;
    let grpc = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/grpc"));
    if grpc {
        let status = Status::unimplemented(format!("no method {} here", req.uri().path()));
        return status.into_http::<axum::body::Body>();
    }
    let text = format!(
        "no {} here: this is a distributer's status port (GET /metrics, and the gRPC call \
         blobstream.v1.Distributer/Status that `blobstream distributer status` makes)\n",
        req.uri().path()
    );
    (axum::http::StatusCode::NOT_FOUND, text).into_response()
}

/// Ask the distributer's status service at `addr` (host:port), over TLS and with a token when
/// `creds` has them.
pub async fn fetch(
    addr: &str,
    creds: &bs_plane::Credentials,
) -> Result<Vec<FlowStatus>, crate::DistribError> {
    let (channel, bearer) = bs_plane::connect(addr, creds)
        .await
        .map_err(|e| crate::DistribError::Remote(format!("the status service: {e}")))?;
    let mut c = pb::distributer_client::DistributerClient::with_interceptor(channel, bearer);
    let r = c
        .status(pb::DistributerStatusRequest {})
        .await
        .map_err(|e| crate::DistribError::Remote(bs_plane::explain(addr, creds, &e)))?;
    Ok(from_pb(r.into_inner()))
}
