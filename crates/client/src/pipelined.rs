//! A small push in one round trip: its request, its bytes and its commit leave in one write
//! on a kept-alive data connection (`NegotiateRequest.pipelined`; see `bs_wire::frame`), and
//! the grant, the admission and the end-to-end confirmation come back together.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bs_proto as pb;
use bs_transport::{SocketOptions, TransportError};
use bs_wire::{Frame, Header};
use prost::Message;

use crate::client::Client;
use crate::error::ClientError;
use crate::pool::Pooled;
use crate::streams::PushAck;

type Result<T> = std::result::Result<T, ClientError>;

impl Client {
    /// Push `data` as the whole blob `name` (routed with `route` in the same request) and
    /// commit it: pipelined in one round trip when it can be, else the usual way.
    pub fn push_all(
        &self,
        name: &str,
        data: &[u8],
        route: Option<pb::RouteRequest>,
    ) -> Result<PushAck> {
        if let Some(done) = self.try_push_pipelined(name, data, route.clone()) {
            return done;
        }
        let mut p = self.open_push(name, 0, Some(data.len() as u64), route)?;
        p.write(data)?;
        p.finish(true)
    }

    /// Whether a push of `len` bytes may be pipelined now (as far as this client knows: the
    /// server may still be busy, or have closed the kept-alive connection).
    pub fn pipelines(&self, len: u64) -> bool {
        self.in_band.load(Relaxed)
            && len <= self.pipeline_up_to.load(Relaxed)
            && self.pool.len() > 0
            && !bs_binding::carry::has_message_layers(&self.transfer_profile())
    }

    /// [`Client::push_all`] pipelined, or `None` when it cannot be now: no kept-alive data
    /// connection, a server that does not take it (or not this size), message layers in the
    /// profile, or a server busy or gone meanwhile — then push the usual way. A refusal the
    /// usual way would meet too (the blob exists, a bad name) is `Some(Err)`.
    pub fn try_push_pipelined(
        &self,
        name: &str,
        data: &[u8],
        route: Option<pb::RouteRequest>,
    ) -> Option<Result<PushAck>> {
        let n = data.len() as u64;
        if !self.pipelines(n) {
            return None;
        }
        let mut req = self.base_request(name, pb::Direction::Push, 0, Some(n));
        req.route = route;
        req.pipelined = true;
        let body = req.encode_to_vec();
        if body.len() > bs_wire::MAX_BODY_LEN as usize {
            return None;
        }
        // The server checks the SUM in the first algorithm proposed (or refuses the request).
        let algo = self.settings.digests.first().copied().unwrap_or_default();
        let mut hasher = algo.hasher();
        hasher.update(data);
        let sum = Frame::Sum { total: n, final_: true, digest: hasher.finish() }.encode();
        let request = Frame::Negotiate { body: body.into() }.encode();
        let head = Header::data(0, n).encode();
        let (key, mut conn, keepalive) = self.pool.take_any()?;
        // This client's buffers and waits (the connection may come from a clone with others):
        // what it proposes, as the answer would have them but for a server's lowering.
        let buf = (self.settings.socket_buffer > 0).then_some(self.settings.socket_buffer);
        let socket = SocketOptions {
            send_buffer: buf,
            recv_buffer: buf,
            nodelay: true,
            io_timeout: Some(self.settings.io_timeout),
        };
        if let Some(t) = conn.tcp() {
            socket.apply(t).ok()?;
        }
        let sent = if n == 0 {
            conn.write_slices(&[&request, &sum])
        } else {
            conn.write_slices(&[&request, &head, data, &sum])
        };
        // Closed meanwhile: the usual way, on a new connection.
        sent.ok()?;
        let resp = match conn.read_frame() {
            Ok(Frame::Grant { code: 0, body }) => match pb::NegotiateResponse::decode(&body[..]) {
                Ok(r) => r,
                Err(e) => return Some(Err(ClientError::Protocol(format!("bad GRANT: {e}")))),
            },
            Ok(Frame::Grant { code, body }) => {
                let code = tonic::Code::from(i32::try_from(code).unwrap_or(i32::MAX));
                let status = tonic::Status::new(code, String::from_utf8_lossy(&body));
                // Refused: the server read past our frames; the connection waits for the next
                // request.
                self.pool.give(key, conn, keepalive);
                return match code {
                    // Busy, or not with this profile: the usual way.
                    tonic::Code::Unavailable
                    | tonic::Code::Aborted
                    | tonic::Code::FailedPrecondition => None,
                    _ => Some(Err(status.into())),
                };
            }
            Err(TransportError::Timeout) => return Some(Err(ClientError::Timeout)),
            _ => return None,
        };
        self.learn(&resp);
        let keepalive = Duration::from_millis(u64::from(resp.keepalive_ms));
        let mut conn = Pooled::new(conn, self.pool.clone(), key, keepalive, true);
        match conn.read_frame_or_remote_error() {
            Ok(Frame::Ack { committed: None, .. }) => {}
            // Turned away before the upload was opened (another writer still holds it, the
            // connection closed): nothing was stored; the usual way waits and asks again.
            Err(e) => {
                let e = ClientError::from(e);
                return if crate::client::turned_away(&e) { None } else { Some(Err(e)) };
            }
            Ok(other) => {
                return Some(Err(ClientError::Protocol(format!(
                    "expected the server's admission ACK, got {other:?}"
                ))));
            }
        }
        Some((|| match conn.read_frame_or_remote_error()? {
            Frame::Ack { received, committed: Some(d) } => {
                conn.done();
                Ok(PushAck { received, committed: Some(d) })
            }
            other => Err(ClientError::Protocol(format!(
                "expected the server's commit ACK, got {other:?}"
            ))),
        })())
    }
}
