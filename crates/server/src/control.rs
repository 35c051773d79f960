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

use bs_binding::{Flow, Profile, TransportKind};

use crate::bindings::{BindGrant, Endpoint};
use crate::config::ServerConfig;
use crate::negotiate::{Negotiator, no_common_digest};
use crate::status::store_status;
use crate::tokens::{Direction, Grant};

pub(crate) struct ControlService {
    store: Arc<dyn Store>,
    /// On-demand scrubs running (at most one).
    scrubs: Arc<tokio::sync::Semaphore>,
    /// Range digests computed at once (each reads its range whole on the blocking pool, which
    /// the data transfers share): more wait their turn rather than crowd the pool.
    digests: Arc<tokio::sync::Semaphore>,
    data_addr: SocketAddr,
    cfg: ServerConfig,
    /// Grants transfers; also holds the token table and the live bindings.
    negotiator: Arc<Negotiator>,
    host_id: String,
}

impl ControlService {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        data_addr: SocketAddr,
        cfg: ServerConfig,
        negotiator: Arc<Negotiator>,
    ) -> Self {
        Self {
            store,
            scrubs: Arc::new(tokio::sync::Semaphore::new(1)),
            digests: Arc::new(tokio::sync::Semaphore::new(
                2 * std::thread::available_parallelism().map_or(2, |n| n.get()),
            )),
            data_addr,
            cfg,
            negotiator,
            host_id: bs_binding::host_id(),
        }
    }

    /// A UDP socket for one datagram binding, on the data plane's address, taking datagrams
    /// from `peer` only; and the address to give the initiator.
    fn datagram_socket(
        &self,
        local: Option<SocketAddr>,
        peer: SocketAddr,
    ) -> std::io::Result<(std::net::UdpSocket, String)> {
        let mut ip = self.data_addr.ip();
        if ip.is_unspecified()
            && let Some(l) = local
        {
            ip = l.ip();
        }
        let s = socket2::Socket::new(
            socket2::Domain::for_address(peer),
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        // A deep receive queue rides out bursts; what still overflows is counted as lost.
        let _ = s.set_recv_buffer_size(8 << 20);
        s.bind(&SocketAddr::new(ip, 0).into())?;
        s.connect(&peer.into())?;
        let sock: std::net::UdpSocket = s.into();
        let addr = sock.local_addr()?;
        let host = self.endpoint(local);
        let host = host.rsplit_once(':').map_or(host.as_str(), |(h, _)| h).to_string();
        Ok((sock, format!("{host}:{}", addr.port())))
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

    fn endpoint(&self, local: Option<SocketAddr>) -> String {
        self.negotiator.endpoint(local)
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
        corrupt: String::new(),
    }
}

pub(crate) fn route_spec(r: pb::RouteRequest) -> RouteSpec {
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

pub(crate) fn routed(r: bs_store::Routed) -> pb::RouteResponse {
    pb::RouteResponse {
        received: r.received,
        received_digest: r.received_digest.map(|d| d.to_string()).unwrap_or_default(),
        resumed: r.resumed,
        upload_id: r.upload_id,
    }
}

/// Pick the first algorithm the client accepts that we support.
fn pick_digest(wanted: &[String]) -> Result<DigestAlgo, Status> {
    if wanted.is_empty() {
        return Ok(DigestAlgo::default());
    }
    wanted.iter().find_map(|w| w.parse().ok()).ok_or_else(|| no_common_digest(wanted))
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
        bs_store::validate_route(&spec).map_err(|e| store_status(&e))?;
        let r = self.blocking(move |s| s.route(&spec)).await?;
        Ok(Response::new(routed(r)))
    }

    async fn stat(&self, req: Request<pb::StatRequest>) -> Result<Response<pb::BlobInfo>, Status> {
        let name = req.into_inner().name;
        let (rec, corrupt) = self
            .blocking(move |s| {
                let rec = s.stat(&name)?;
                // (Deleted between the two: said as not found, as a stat a moment later.)
                Ok((rec, s.corrupt_mark(&name)?))
            })
            .await?;
        Ok(Response::new(pb::BlobInfo { corrupt: corrupt.unwrap_or_default(), ..info(rec) }))
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
        let (mut page, marks) = self
            .blocking(move |s| {
                let page = s.list(&prefix, &after, limit + 1)?;
                let names: Vec<String> = page.iter().take(limit).map(|b| b.name.clone()).collect();
                Ok((page, s.corrupt_marks(&names)?))
            })
            .await?;
        let more = page.len() > limit;
        page.truncate(limit);
        let mut marks: std::collections::HashMap<_, _> = marks.into_iter().collect();
        let next_page_token = if more {
            page.last().map(|b| b.name.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListResponse {
            blobs: page
                .into_iter()
                .map(|rec| {
                    let corrupt = marks.remove(&rec.name).unwrap_or_default();
                    pb::BlobInfo { corrupt, ..info(rec) }
                })
                .collect(),
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

    async fn commit(
        &self,
        req: Request<pb::CommitRequest>,
    ) -> Result<Response<pb::BlobInfo>, Status> {
        if !self.store.takes_range_writes() {
            return Err(Status::unimplemented(
                "this server's store takes one writer per upload: nothing to commit",
            ));
        }
        let r = req.into_inner();
        let expected: bs_wire::Digest = r
            .digest
            .parse()
            .map_err(|e| Status::invalid_argument(format!("digest {:?}: {e}", r.digest)))?;
        let rec = self
            .blocking(move |s| {
                let up = s.open_upload(&r.name)?;
                let size = up.size().unwrap_or(up.received());
                let sender = match r.chunks.is_empty() {
                    true => None,
                    false => Some(bs_wire::ChunkDigests::decode(&r.chunks, size).map_err(|e| {
                        StoreError::Corrupt {
                            name: r.name.clone(),
                            reason: format!("the sender's chunk digests do not fit it: {e}"),
                        }
                    })?),
                };
                up.commit_expecting(&expected, sender.as_ref())
            })
            .await?;
        Ok(Response::new(info(rec)))
    }

    async fn range_digest(
        &self,
        req: Request<pb::RangeDigestRequest>,
    ) -> Result<Response<pb::RangeDigestResponse>, Status> {
        let r = req.into_inner();
        let wanted: Vec<String> =
            std::iter::once(r.algo.clone()).filter(|a| !a.is_empty()).collect();
        let algo = pick_digest(&wanted)?;
        let _turn = self.digests.acquire().await.expect("the semaphore is never closed");
        if r.upload {
            // At most a million pieces of at least 64 KiB: the answer stays a few tens of MB.
            if r.piece < 64 << 10 || r.length / r.piece > 1 << 20 {
                return Err(Status::invalid_argument(
                    "an upload's digests come in pieces of at least 64 KiB, at most 2^20 of them",
                ));
            }
            let pieces = self
                .blocking(move |s| {
                    s.upload_piece_digests(&r.name, r.offset, r.length, r.piece, algo)
                })
                .await?
                .ok_or_else(|| {
                    Status::unimplemented(
                        "this server's store takes one writer per upload: it keeps no ranges",
                    )
                })?;
            let pieces = pieces.iter().map(|d| d.to_string()).collect();
            return Ok(Response::new(pb::RangeDigestResponse { digest: String::new(), pieces }));
        }
        let d = self
            .blocking(move |s| s.open_read(&r.name)?.digest_range(r.offset, r.length, algo))
            .await?;
        Ok(Response::new(pb::RangeDigestResponse { digest: d.to_string(), pieces: Vec::new() }))
    }

    async fn negotiate(
        &self,
        req: Request<pb::NegotiateRequest>,
    ) -> Result<Response<pb::NegotiateResponse>, Status> {
        let local = req.local_addr();
        let r = req.into_inner();
        if r.pipelined {
            return Err(Status::invalid_argument(
                "only an in-band request on a kept-alive data connection can be pipelined",
            ));
        }
        let n = self.negotiator.clone();
        let (grant, mut answer) =
            tokio::task::spawn_blocking(move || n.grant(r, local))
                .await
                .map_err(|e| Status::internal(format!("store task failed: {e}")))??;
        answer.token = self.negotiator.tokens.issue(grant).map_err(full)?.to_vec();
        Ok(Response::new(answer))
    }

    async fn bind(
        &self,
        req: Request<pb::BindRequest>,
    ) -> Result<Response<pb::BindResponse>, Status> {
        let local = req.local_addr();
        let remote = req.remote_addr();
        let r = req.into_inner();
        let endpoint = match pb::BindEndpoint::try_from(r.endpoint) {
            Ok(pb::BindEndpoint::Echo) => Endpoint::Echo,
            Ok(pb::BindEndpoint::Sink) => Endpoint::Sink,
            Ok(pb::BindEndpoint::Source) => Endpoint::Source,
            _ => return Err(Status::invalid_argument("endpoint must be ECHO, SINK or SOURCE")),
        };
        let mut proposal = Profile::from_pb(&r.proposal.unwrap_or_default())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let flow = if endpoint == Endpoint::Echo { Flow::RequestReply } else { Flow::Stream };
        let mut lowered = Vec::new();
        if proposal.flow != flow {
            lowered.push(format!(
                "flow {:?} → {flow:?}: the {} endpoint is {}",
                proposal.flow,
                endpoint.name(),
                if flow == Flow::Stream { "one way" } else { "request/reply" }
            ));
            proposal.flow = flow;
        }
        let same_host = !r.host_id.is_empty() && r.host_id == self.host_id;
        let mut limits = self.cfg.binding_limits(same_host);
        if endpoint != Endpoint::Sink || r.datagram_port == 0 {
            // Datagrams flow one way, into the sink, from a port the initiator named.
            limits.transports.retain(|t| *t != TransportKind::Udp);
        }
        let offer = match bs_binding::negotiate::counter(&proposal, &limits) {
            Ok(o) => o,
            Err(refusal) => {
                return Ok(Response::new(pb::BindResponse {
                    refused: refusal.to_string(),
                    ..Default::default()
                }));
            }
        };
        lowered.extend(offer.lowered);
        let transport = offer.profile.transports[0];
        let address = match transport {
            TransportKind::Unix => {
                self.cfg.unix_socket.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
            }
            _ => self.endpoint(local),
        };
        let (udp, datagram_address) = if transport == TransportKind::Udp {
            let peer = remote.ok_or_else(|| Status::internal("caller address unknown"))?;
            let (sock, addr) = self
                .datagram_socket(local, SocketAddr::new(peer.ip(), r.datagram_port as u16))
                .map_err(|e| Status::unavailable(format!("cannot open a udp socket: {e}")))?;
            (Some(Arc::new(sock)), addr)
        } else {
            (None, String::new())
        };
        let id = self.negotiator.bindings.next_id();
        let label = if r.label.is_empty() { format!("binding-{id}") } else { r.label };
        let grant = Grant {
            name: label.clone(),
            direction: Direction::Bind,
            offset: 0,
            length: 0,
            algo: DigestAlgo::default(),
            chunk: 0,
            socket: SocketOptions::default(),
            blob_digest: None,
            range: false,
            upload_id: None,
            whole_before_use: false,
            bind: BindGrant { id, endpoint, profile: offer.profile.clone(), label, udp },
            source: None,
        };
        let token = self.negotiator.tokens.issue(grant).map_err(full)?;
        Ok(Response::new(pb::BindResponse {
            refused: String::new(),
            offer: Some(offer.profile.to_pb()),
            lowered,
            transport: transport.name().into(),
            address,
            token: token.to_vec(),
            expires_in_ms: self.negotiator.tokens.ttl().as_millis() as u64,
            tls: self.cfg.tls.is_some() && offer.profile.wants_encryption(),
            binding_id: id,
            datagram_address,
        }))
    }

    async fn bindings(
        &self,
        _req: Request<pb::BindingsRequest>,
    ) -> Result<Response<pb::BindingsResponse>, Status> {
        Ok(Response::new(pb::BindingsResponse { bindings: self.negotiator.bindings.status() }))
    }
}

/// The token table is full: the call is refused with why (the client may ask again later).
fn full(f: crate::tokens::Full) -> Status {
    Status::resource_exhausted(f.0)
}
