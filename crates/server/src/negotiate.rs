//! Transfer negotiation, shared by the control plane's `Negotiate` call and the in-band
//! `NEGOTIATE` frame of a kept-alive data connection (see `bs_wire::frame`): counter the
//! proposed QoS against this server's limits, route a push or stat a pull, and say what the
//! transfer may do. Store calls block: call [`Negotiator::grant`] off the async executor.

use std::net::SocketAddr;
use std::sync::Arc;

use bs_binding::{Profile, Refusal};
use bs_proto as pb;
use bs_store::Store;
use bs_transport::SocketOptions;
use bs_wire::DigestAlgo;
use tonic::Status;

use crate::bindings::{BindGrant, BindingTable, Endpoint};
use crate::config::ServerConfig;
use crate::control::{info, route_spec, routed};
use crate::status::store_status;
use crate::tokens::{Direction, Grant, TokenTable};

/// The largest push taken pipelined in band (its bytes sent before the answer): what a
/// refused one wastes is read and dropped, so it is kept small.
pub const PIPELINE_UP_TO: u64 = 1 << 20;

pub(crate) struct Negotiator {
    store: Arc<dyn Store>,
    pub(crate) tokens: Arc<TokenTable>,
    data_addr: SocketAddr,
    cfg: ServerConfig,
    pub(crate) bindings: Arc<BindingTable>,
}

impl Negotiator {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        tokens: Arc<TokenTable>,
        data_addr: SocketAddr,
        cfg: ServerConfig,
    ) -> Self {
        Self { store, tokens, data_addr, cfg, bindings: Arc::new(BindingTable::default()) }
    }

    /// The transfer's QoS: the `qos` profile if sent, else the legacy fields as one; then
    /// countered against this server's limits, as every binding is.
    pub(crate) fn transfer_offer(
        &self,
        r: &pb::NegotiateRequest,
    ) -> Result<bs_binding::Offer, Status> {
        let proposal = match &r.qos {
            Some(q) => Profile::from_pb(q).map_err(|e| Status::invalid_argument(e.to_string()))?,
            None => Profile {
                chunk_size: r.chunk_size,
                send_buffer: r.send_buffer,
                recv_buffer: r.recv_buffer,
                digests: r.digests.clone(),
                ..Profile::default()
            },
        };
        bs_binding::negotiate::counter(&proposal, &self.cfg.binding_limits(false)).map_err(|e| {
            match e {
                Refusal::NoCommonDigest(wanted) => no_common_digest(&wanted),
                other => Status::failed_precondition(other.to_string()),
            }
        })
    }

    /// The endpoint clients should dial: our data address, with the IP they reached us on
    /// when the data plane listens on a wildcard address.
    pub(crate) fn endpoint(&self, local: Option<SocketAddr>) -> String {
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

    /// What `r` is granted, and the answer to give — without a token, which only the control
    /// plane's call needs (an in-band request runs on its connection at once). `local`: the
    /// address the client reached us on. Blocks on the store.
    pub(crate) fn grant(
        &self,
        r: pb::NegotiateRequest,
        local: Option<SocketAddr>,
    ) -> Result<(Grant, pb::NegotiateResponse), Status> {
        self.grant_opening(r, local, false)
    }

    /// [`Negotiator::grant`] for a transfer that starts at once (in band): a pull's blob is
    /// opened here and handed to it in [`Grant::source`], not looked up twice.
    pub(crate) fn grant_in_band(
        &self,
        r: pb::NegotiateRequest,
        local: Option<SocketAddr>,
    ) -> Result<(Grant, pb::NegotiateResponse), Status> {
        self.grant_opening(r, local, true)
    }

    fn grant_opening(
        &self,
        r: pb::NegotiateRequest,
        local: Option<SocketAddr>,
        open: bool,
    ) -> Result<(Grant, pb::NegotiateResponse), Status> {
        let direction = match pb::Direction::try_from(r.direction) {
            Ok(pb::Direction::Push) => Direction::Push,
            Ok(pb::Direction::Pull) => Direction::Pull,
            _ => return Err(Status::invalid_argument("direction must be PUSH or PULL")),
        };
        if r.pipelined {
            pipelinable(&r)?;
        }
        let offer = self.transfer_offer(&r)?;
        let q = &offer.profile;
        let algo: DigestAlgo = q.digests[0].parse().map_err(|_| Status::internal("digest"))?;
        if r.pipelined {
            // Its bytes are already on the way, hashed and framed as proposed.
            let asked = r.qos.as_ref().map_or(&r.digests, |q| &q.digests).first();
            let asked = asked.map_or(Ok(DigestAlgo::default()), |d| d.parse());
            if asked.ok() != Some(algo) || bs_binding::carry::has_message_layers(q) {
                return Err(Status::failed_precondition(
                    "a pipelined push runs only with the digest and plain framing it proposed",
                ));
            }
        }
        let chunk = q.chunk_size;
        let buf = |n: u32| (n > 0).then_some(n);
        let socket = SocketOptions {
            send_buffer: buf(q.send_buffer),
            recv_buffer: buf(q.recv_buffer),
            nodelay: true,
            io_timeout: None,
        };
        let store = |e: bs_store::StoreError| store_status(&e);
        let mut source = None;
        let (offset, length, blob, route) = match direction {
            Direction::Pull => {
                if r.route.is_some() || r.range {
                    return Err(Status::invalid_argument(
                        "route and range are only meaningful for PUSH",
                    ));
                }
                // A blob that will not open (gone, marked corrupt) is looked up as before: the
                // transfer then meets the same error and reports it as it always has.
                let opened = if open { self.store.open_read(&r.name).ok() } else { None };
                let rec = match &opened {
                    Some(src) => src.record().clone(),
                    None => self.store.stat(&r.name).map_err(store)?,
                };
                source = opened;
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
            Direction::Bind => unreachable!("negotiate grants only pushes and pulls"),
            Direction::Push if r.range => {
                if r.route.is_some() {
                    return Err(Status::invalid_argument(
                        "a range push writes into an upload routed before",
                    ));
                }
                if !self.store.takes_range_writes() {
                    return Err(Status::unimplemented(
                        "this server's store takes one writer per upload: push it over one \
                         connection",
                    ));
                }
                bs_store::validate_name(&r.name).map_err(store)?;
                let Some(length) = r.length else {
                    return Err(Status::invalid_argument("a range push needs a length"));
                };
                (r.offset, length, None, None)
            }
            Direction::Push => {
                let route = match r.route.clone() {
                    Some(mut rt) => {
                        rt.name = r.name.clone();
                        let spec = route_spec(rt);
                        bs_store::validate_route(&spec).map_err(store)?;
                        Some(self.store.route(&spec).map_err(store)?)
                    }
                    None => {
                        bs_store::validate_name(&r.name).map_err(store)?;
                        None
                    }
                };
                let length = r.length.unwrap_or(u64::MAX - r.offset);
                (r.offset, length, None, route)
            }
        };
        let grant = Grant {
            name: r.name.clone(),
            direction,
            offset,
            length,
            algo,
            chunk,
            socket,
            blob_digest: blob.as_ref().map(|b| b.digest.clone()),
            range: r.range,
            // The upload this push routed, or the one the client's Route answered.
            upload_id: match &route {
                Some(rt) => Some(rt.upload_id.clone()),
                None if direction == Direction::Push && !r.upload_id.is_empty() => {
                    Some(r.upload_id.clone())
                }
                None => None,
            },
            whole_before_use: direction == Direction::Pull && r.whole_before_use,
            bind: BindGrant {
                id: self.bindings.next_id(),
                endpoint: if direction == Direction::Push {
                    Endpoint::Push
                } else {
                    Endpoint::Pull
                },
                profile: offer.profile.clone(),
                label: r.name.clone(),
                udp: None,
            },
            source,
        };
        let answer = pb::NegotiateResponse {
            endpoint: self.endpoint(local),
            token: Vec::new(),
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
            qos: Some(offer.profile.to_pb()),
            lowered: offer.lowered,
            keepalive_ms: self.cfg.data_keepalive.as_millis().try_into().unwrap_or(u32::MAX),
            in_band: !self.cfg.data_keepalive.is_zero(),
            pipeline_up_to: if self.cfg.data_keepalive.is_zero() { 0 } else { PIPELINE_UP_TO },
        };
        Ok((grant, answer))
    }
}

/// Whether `r` may be pipelined: a push of a whole known length, small enough.
fn pipelinable(r: &pb::NegotiateRequest) -> Result<(), Status> {
    let push = r.direction == pb::Direction::Push as i32 && !r.range;
    match r.length {
        Some(n) if push && n <= PIPELINE_UP_TO => Ok(()),
        _ => Err(Status::invalid_argument(format!(
            "only a push of a known length of at most {PIPELINE_UP_TO} bytes can be pipelined"
        ))),
    }
}

pub(crate) fn no_common_digest(wanted: &[String]) -> Status {
    Status::invalid_argument(format!(
        "none of the digest algorithms {wanted:?} is supported (have: xxh3-128, blake3)"
    ))
}
