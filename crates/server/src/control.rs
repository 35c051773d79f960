//! The gRPC control plane: naming, routing, listing and transfer negotiation. Store calls
//! block, so each runs on the blocking pool; no bulk bytes pass through here.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bs_proto as pb;
use bs_store::{BlobRecord, RouteSpec, Store, StoreError};
use bs_transport::SocketOptions;
use bs_wire::DigestAlgo;
use tonic::{Request, Response, Status};

use crate::config::ServerConfig;
use crate::status::store_status;
use crate::tokens::{Direction, Grant, TokenTable};

pub(crate) struct ControlService {
    store: Arc<dyn Store>,
    /// On-demand scrubs running (at most one).
    scrubs: Arc<tokio::sync::Semaphore>,
    tokens: Arc<TokenTable>,
    data_addr: SocketAddr,
    cfg: ServerConfig,
}

impl ControlService {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        tokens: Arc<TokenTable>,
        data_addr: SocketAddr,
        cfg: ServerConfig,
    ) -> Self {
        Self { store, scrubs: Arc::new(tokio::sync::Semaphore::new(1)), tokens, data_addr, cfg }
    }

    /// Run a blocking store call off the executor, mapping its error to a gRPC status.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, Status> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&*store))
            .await
            .map_err(|e| Status::internal(format!("store task failed: {e}")))?
            .map_err(|e| store_status(&e))
    }

    /// The endpoint clients should dial: our data address, with the IP they reached us on
    /// when the data plane listens on a wildcard address.
    fn endpoint(&self, local: Option<SocketAddr>) -> String {
        if let Some(a) = &self.cfg.advertise_data {
            return a.clone();
        }
        let mut ep = self.data_addr;
        if ep.ip().is_unspecified()
            && let Some(l) = local
        {
            ep.set_ip(l.ip());
        }
        ep.to_string()
    }
}

pub(crate) fn info(r: BlobRecord) -> pb::BlobInfo {
    pb::BlobInfo {
        name: r.name,
        size: r.size,
        content_type: r.content_type,
        digest: r.digest,
        created_unix_ms: r.created_ms,
        metadata: r.metadata.into_iter().collect(),
    }
}

fn route_spec(r: pb::RouteRequest) -> RouteSpec {
    RouteSpec {
        name: r.name,
        size: r.size,
        content_type: r.content_type,
        metadata: r.metadata.into_iter().collect::<BTreeMap<_, _>>(),
        overwrite: r.overwrite,
        refuse_digests: Vec::new(),
        resume_tag: r.resume_tag,
    }
}

fn routed(r: bs_store::Routed) -> pb::RouteResponse {
    pb::RouteResponse {
        received: r.received,
        received_digest: r.received_digest.map(|d| d.to_string()).unwrap_or_default(),
        resumed: r.resumed,
    }
}

/// Pick the first algorithm the client accepts that we support.
fn pick_digest(wanted: &[String]) -> Result<DigestAlgo, Status> {
    if wanted.is_empty() {
        return Ok(DigestAlgo::default());
    }
    wanted.iter().find_map(|w| w.parse().ok()).ok_or_else(|| {
        Status::invalid_argument(format!(
            "none of the digest algorithms {wanted:?} is supported (have: xxh3-128, blake3)"
        ))
    })
}

/// The scrub RPC's reply stream.
type ScrubStream = tokio_stream::wrappers::ReceiverStream<Result<pb::ScrubEvent, Status>>;

/// One scrubbed blob as the RPC reports it.
fn scrub_event(name: &str, size: u64, res: &Result<(), StoreError>) -> pb::ScrubEvent {
    use pb::scrub_event::Outcome;
    let (outcome, error) = match res {
        Ok(()) => (Outcome::Ok, String::new()),
        Err(StoreError::Corrupt { reason, .. }) => (Outcome::Corrupt, reason.clone()),
        Err(e) => (Outcome::Failed, e.to_string()),
    };
    pb::ScrubEvent { name: name.to_string(), size, outcome: outcome as i32, error }
}

#[tonic::async_trait]
impl pb::blob_store_server::BlobStore for ControlService {
    type ScrubStream = ScrubStream;

    async fn scrub(
        &self,
        req: Request<pb::ScrubRequest>,
    ) -> Result<Response<Self::ScrubStream>, Status> {
        let r = req.into_inner();
        // One on-demand scrub at a time: each reads the whole store.
        let Ok(permit) = self.scrubs.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(
                "a scrub requested by another client is running; try again when it is done",
            ));
        };
        let opts = bs_store::ScrubOptions {
            prefix: r.prefix,
            rate: (r.rate_bytes_per_sec > 0).then_some(r.rate_bytes_per_sec),
            stop: None,
        };
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let done = bs_store::scrub(&*store, &opts, |rec, res| {
                // A client that went away stops the scrub.
                tx.blocking_send(Ok(scrub_event(&rec.name, rec.size, res))).is_ok()
            });
            if let Err(e) = done {
                let _ = tx.blocking_send(Err(store_status(&e)));
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn route(
        &self,
        req: Request<pb::RouteRequest>,
    ) -> Result<Response<pb::RouteResponse>, Status> {
        let spec = route_spec(req.into_inner());
        let r = self.blocking(move |s| s.route(&spec)).await?;
        Ok(Response::new(routed(r)))
    }

    async fn stat(&self, req: Request<pb::StatRequest>) -> Result<Response<pb::BlobInfo>, Status> {
        let name = req.into_inner().name;
        Ok(Response::new(info(self.blocking(move |s| s.stat(&name)).await?)))
    }

    async fn list(
        &self,
        req: Request<pb::ListRequest>,
    ) -> Result<Response<pb::ListResponse>, Status> {
        let r = req.into_inner();
        let limit = match r.page_size {
            0 => 1000,
            n => n.min(10_000) as usize,
        };
        let (prefix, after) = (r.prefix, r.page_token);
        let mut page = self.blocking(move |s| s.list(&prefix, &after, limit + 1)).await?;
        let more = page.len() > limit;
        page.truncate(limit);
        let next_page_token = if more {
            page.last().map(|b| b.name.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListResponse {
            blobs: page.into_iter().map(info).collect(),
            next_page_token,
        }))
    }

    async fn delete(
        &self,
        req: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let name = req.into_inner().name;
        self.blocking(move |s| s.delete(&name)).await?;
        Ok(Response::new(pb::DeleteResponse {}))
    }

    async fn abort(
        &self,
        req: Request<pb::AbortRequest>,
    ) -> Result<Response<pb::AbortResponse>, Status> {
        let name = req.into_inner().name;
        self.blocking(move |s| s.abort(&name)).await?;
        Ok(Response::new(pb::AbortResponse {}))
    }

    async fn range_digest(
        &self,
        req: Request<pb::RangeDigestRequest>,
    ) -> Result<Response<pb::RangeDigestResponse>, Status> {
        let r = req.into_inner();
        let wanted: Vec<String> =
            std::iter::once(r.algo.clone()).filter(|a| !a.is_empty()).collect();
        let algo = pick_digest(&wanted)?;
        let d = self
            .blocking(move |s| s.open_read(&r.name)?.digest_range(r.offset, r.length, algo))
            .await?;
        Ok(Response::new(pb::RangeDigestResponse { digest: d.to_string() }))
    }

    async fn negotiate(
        &self,
        req: Request<pb::NegotiateRequest>,
    ) -> Result<Response<pb::NegotiateResponse>, Status> {
        let local = req.local_addr();
        let r = req.into_inner();
        let direction = match pb::Direction::try_from(r.direction) {
            Ok(pb::Direction::Push) => Direction::Push,
            Ok(pb::Direction::Pull) => Direction::Pull,
            _ => return Err(Status::invalid_argument("direction must be PUSH or PULL")),
        };
        let algo = pick_digest(&r.digests)?;
        let (lo, hi) = ServerConfig::CHUNK_RANGE;
        let chunk =
            if r.chunk_size == 0 { self.cfg.default_chunk } else { r.chunk_size.clamp(lo, hi) };
        let buf = |n: u32| (n > 0).then(|| n.min(self.cfg.max_socket_buffer));
        let socket = SocketOptions {
            send_buffer: buf(r.send_buffer),
            recv_buffer: buf(r.recv_buffer),
            nodelay: true,
            io_timeout: None,
        };
        let name = r.name.clone();
        let (offset, length, blob, route) = match direction {
            Direction::Pull => {
                if r.route.is_some() {
                    return Err(Status::invalid_argument("route is only meaningful for PUSH"));
                }
                let rec = self.blocking(move |s| s.stat(&name)).await?;
                if r.offset > rec.size {
                    return Err(Status::out_of_range(format!(
                        "offset {} is past the end of {:?} ({} bytes)",
                        r.offset, rec.name, rec.size
                    )));
                }
                let avail = rec.size - r.offset;
                let length = r.length.unwrap_or(avail);
                if length > avail {
                    return Err(Status::out_of_range(format!(
                        "range {}+{length} is past the end of {:?} ({} bytes)",
                        r.offset, rec.name, rec.size
                    )));
                }
                (r.offset, length, Some(rec), None)
            }
            Direction::Push => {
                let route = match r.route {
                    Some(mut rt) => {
                        rt.name = name.clone();
                        let spec = route_spec(rt);
                        Some(self.blocking(move |s| s.route(&spec)).await?)
                    }
                    None => {
                        bs_store::validate_name(&name).map_err(|e| store_status(&e))?;
                        None
                    }
                };
                let length = r.length.unwrap_or(u64::MAX - r.offset);
                (r.offset, length, None, route)
            }
        };
        let grant = Grant {
            name: r.name,
            direction,
            offset,
            length,
            algo,
            chunk,
            socket,
            blob_digest: blob.as_ref().map(|b| b.digest.clone()),
        };
        let token = self.tokens.issue(grant);
        Ok(Response::new(pb::NegotiateResponse {
            endpoint: self.endpoint(local),
            token: token.to_vec(),
            offset,
            length,
            chunk_size: chunk,
            send_buffer: socket.send_buffer.unwrap_or(0),
            recv_buffer: socket.recv_buffer.unwrap_or(0),
            digest: algo.name().to_string(),
            expires_in_ms: self.tokens.ttl().as_millis() as u64,
            blob: blob.map(info),
            route: route.map(routed),
            tls: self.cfg.tls.is_some(),
        }))
    }
}
