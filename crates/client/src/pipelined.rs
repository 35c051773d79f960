//! A small push in one round trip: its request, its bytes and its commit leave in one write
//! on a kept-alive data connection (`NegotiateRequest.pipelined`; see `bs_wire::frame`), and
//! the grant, the admission and the end-to-end confirmation come back together.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bs_proto as pb;
use bs_transport::SocketOptions;
use bs_wire::{Frame, Header};

use crate::client::{Client, Granted, read_grant};
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
            && !self.encryption_unmet()
    }

    /// Whether pull requests may go ahead of their answers now: in band, on a kept-alive
    /// connection, without message layers.
    fn pulls_ahead(&self) -> bool {
        self.in_band.load(Relaxed)
            && self.pool.len() > 0
            && !bs_binding::carry::has_message_layers(&self.transfer_profile())
            && !self.encryption_unmet()
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
        let body = self.in_band_body(&req);
        if body.len() > bs_wire::MAX_BODY_LEN as usize {
            return None;
        }
        // The server checks the SUM in the first algorithm proposed (or refuses the request).
        let algo = self.settings.digests.first().copied().unwrap_or_default();
        let sum_of = |data: &[u8]| {
            let mut hasher = algo.hasher();
            hasher.update(data);
            Frame::Sum { total: n, final_: true, digest: hasher.finish() }.encode()
        };
        let request = Frame::Negotiate { body: body.into() }.encode();
        let head = Header::data(0, n).encode();
        let (key, mut conn, keepalive) = self.pool.take_any(self.settings.socket_buffer)?;
        // This client's buffers and waits (the connection may come from a clone with other
        // waits; the pool hands out only those whose buffers were asked for alike): what it
        // proposes, as the answer would have them but for a server's lowering.
        let buf = (self.settings.socket_buffer > 0).then_some(self.settings.socket_buffer);
        let socket = SocketOptions {
            send_buffer: buf,
            recv_buffer: buf,
            nodelay: true,
            io_timeout: Some(self.settings.io_timeout),
        };
        conn.apply(&socket).ok()?;
        let sent = if n < HASH_AFTER_SENDING {
            let sum = sum_of(data);
            if n == 0 {
                conn.write_slices(&[&request, &sum])
            } else {
                conn.write_slices(&[&request, &head, data, &sum])
            }
        } else {
            // Most of the bytes leave first and are hashed while the server takes them in;
            // the rest follow with the SUM, so the server is still reading when it comes.
            let at = data.len() - (data.len() / 2).min(SENT_AFTER_HASHING);
            conn.write_slices(&[&request, &head, &data[..at]])
                .and_then(|()| conn.write_slices(&[&data[at..], &sum_of(data)]))
        };
        // Closed meanwhile: the usual way, on a new connection.
        sent.ok()?;
        let resp = match read_grant(&mut conn) {
            Granted::Yes(r) => *r,
            Granted::No(status) => {
                // Refused: the server read past our frames; the connection waits for the next
                // request.
                self.pool.give(key, conn, keepalive);
                return match status.code() {
                    // Busy, or not with this profile: the usual way.
                    tonic::Code::Unavailable
                    | tonic::Code::Aborted
                    | tonic::Code::FailedPrecondition => None,
                    _ => Some(Err(status.into())),
                };
            }
            Granted::Failed(e) => return Some(Err(e)),
            // Closed meanwhile: the usual way, on a new connection.
            Granted::Gone => return None,
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

/// Pipelined pushes of at least this many bytes send most of them before hashing them (the
/// server reads them meanwhile); smaller ones leave in one write with their SUM.
const HASH_AFTER_SENDING: u64 = 64 << 10;

/// Of a push that hashes after sending, the bytes held back to go with the SUM (at most half).
const SENT_AFTER_HASHING: usize = 512 << 10;

/// Most pull requests sent ahead of their answers on one connection.
const PULLS_AHEAD: usize = 16;

/// How one pipelined pull ended.
enum Answered {
    /// Its bytes, verified.
    Bytes(Vec<u8>),
    /// Refused in step (the connection waits for the next request): the usual way's error.
    Refused(ClientError),
    /// Busy, or the connection is out of step or gone: this one and the rest the usual way.
    Fallback,
    /// Failed after its bytes began (the connection is out of step): this one's error; the
    /// rest the usual way.
    Failed(ClientError),
    /// Larger than the caller takes whole (this many bytes), left unread (the connection is
    /// out of step): the rest the usual way.
    TooLarge(u64),
}

impl Client {
    /// Pull the whole blobs `names`, calling `each(i, bytes)` in order, every one verified
    /// against its digest. On a kept-alive data connection of a server that takes in-band
    /// requests, up to 16 requests go ahead of their answers (the server answers them in
    /// order), so many small blobs cost about one round trip in all instead of one each; the
    /// rest — and every blob whenever that is not possible — the usual way.
    pub fn pull_each(&self, names: &[&str], each: impl FnMut(usize, Result<Vec<u8>>)) {
        self.pull_each_up_to(names, u64::MAX, each);
    }

    /// [`Client::pull_each`] of blobs expected to be at most `max` bytes: one that is larger
    /// (replaced since it was listed, say) is not read — its result is
    /// [`ClientError::TooLarge`], for the caller to stream it instead.
    pub fn pull_each_up_to(
        &self,
        names: &[&str],
        max: u64,
        mut each: impl FnMut(usize, Result<Vec<u8>>),
    ) {
        let too_large =
            |name: &str, size: u64| ClientError::TooLarge { name: name.into(), size, max };
        let usual = |name: &str| -> Result<Vec<u8>> {
            let mut p = self.open_pull_whole(name, 0, None)?;
            if p.len() > max {
                return Err(too_large(name, p.len()));
            }
            let mut out = vec![0u8; p.len() as usize];
            p.read_exact_to_end(&mut out)?;
            Ok(out)
        };
        let mut next = 0;
        // The first the usual way when there is no connection to pipeline on yet.
        if names.is_empty() {
            return;
        }
        if !self.pulls_ahead() {
            each(0, usual(names[0]));
            next = 1;
        }
        // Pulls sent ahead on a kept-alive connection while it stays in step; whatever is
        // left when this block ends goes the usual way.
        'ahead: {
            let conn = if self.pulls_ahead() {
                self.pool.take_any(self.settings.socket_buffer)
            } else {
                None
            };
            let Some((key, mut conn, keepalive)) = conn else { break 'ahead };
            let socket = SocketOptions {
                send_buffer: None,
                recv_buffer: None,
                nodelay: true,
                io_timeout: Some(self.settings.io_timeout),
            };
            if conn.apply(&socket).is_err() {
                break 'ahead;
            }
            let mut sent = next;
            let mut in_step = true;
            // The outcome of `next` when its answer put the connection out of step.
            let mut pending: Option<Result<Vec<u8>>> = None;
            while next < names.len() {
                while in_step && sent < names.len() && sent - next < PULLS_AHEAD {
                    let mut req = self.base_request(names[sent], pb::Direction::Pull, 0, None);
                    // Each answer is read whole and handed over only once verified.
                    req.whole_before_use = true;
                    let body = self.in_band_body(&req);
                    if body.len() > bs_wire::MAX_BODY_LEN as usize
                        || conn.write_frame(&Frame::Negotiate { body: body.into() }).is_err()
                    {
                        in_step = false;
                        break;
                    }
                    sent += 1;
                }
                if next == sent {
                    break; // nothing asked on this connection: the rest the usual way
                }
                let r = match answer(&mut conn, max) {
                    Answered::Bytes(b) => Ok(b),
                    Answered::Refused(e) => Err(e),
                    // This one and the rest the usual way.
                    Answered::Fallback => {
                        in_step = false;
                        break;
                    }
                    Answered::Failed(e) => {
                        in_step = false;
                        Err(e)
                    }
                    // Its bytes are on their way unread.
                    Answered::TooLarge(size) => {
                        in_step = false;
                        Err(too_large(names[next], size))
                    }
                };
                if !in_step {
                    // Delivered once the connection is closed (a request could not be sent
                    // ahead, or this answer put it out of step).
                    pending = Some(r);
                    break;
                }
                each(next, r);
                next += 1;
            }
            if in_step && next == names.len() {
                self.pool.give(key, conn, keepalive);
            } else {
                // Out of step or gone: closed before anything else runs, so the server stops
                // sending what nobody reads and frees the slots of the requests queued on it.
                drop(conn);
            }
            if let Some(r) = pending {
                each(next, r);
                next += 1;
            }
        }
        for (i, name) in names.iter().enumerate().skip(next) {
            each(i, usual(name));
        }
    }
}

/// Read the answer to one pipelined pull request: a GRANT, then the blob's DATA and SUM (not
/// read when the blob is larger than `max`).
fn answer(conn: &mut bs_transport::Conn, max: u64) -> Answered {
    use bs_binding::transfer::PullReceiver;
    let resp = match read_grant(conn) {
        Granted::Yes(r) => *r,
        Granted::No(status) => {
            return match status.code() {
                tonic::Code::Unavailable | tonic::Code::Aborted => Answered::Fallback,
                _ => Answered::Refused(status.into()),
            };
        }
        Granted::Failed(e) => return Answered::Failed(e),
        Granted::Gone => return Answered::Fallback,
    };
    let Ok(algo) = resp.digest.parse::<bs_wire::DigestAlgo>() else {
        return Answered::Failed(ClientError::Protocol(format!(
            "unknown digest {:?}",
            resp.digest
        )));
    };
    if resp.qos.as_ref().is_some_and(|q| {
        bs_binding::Profile::from_pb(q).is_ok_and(|p| bs_binding::carry::has_message_layers(&p))
    }) {
        return Answered::Failed(ClientError::Protocol(
            "a layered answer to a plain request".into(),
        ));
    }
    if resp.length > max {
        return Answered::TooLarge(resp.length);
    }
    let mut rules = PullReceiver::new(resp.offset, resp.length);
    let mut out = vec![0u8; resp.length as usize];
    let mut hasher = algo.hasher();
    let res = (|| -> Result<()> {
        while rules.left() > 0 {
            match conn.read_frame_or_remote_error()? {
                Frame::Data { offset, len } => {
                    rules.on_data(offset, len).map_err(ClientError::Protocol)?;
                    let at = rules.got() as usize;
                    conn.recv_data_into(&mut out[at..at + len as usize], Some(&mut hasher))?;
                    rules.advance(len);
                }
                other => {
                    return Err(ClientError::Protocol(format!("expected DATA, got {other:?}")));
                }
            }
        }
        match conn.read_frame_or_remote_error()? {
            Frame::Sum { total, digest, .. } => {
                let ours = hasher.finish();
                rules.on_sum(total, &digest, &ours).map_err(|(expected, actual)| {
                    ClientError::ChecksumMismatch { expected, actual }
                })
            }
            other => Err(ClientError::Protocol(format!("expected SUM, got {other:?}"))),
        }
    })();
    match res {
        Ok(()) => Answered::Bytes(out),
        Err(e) => Answered::Failed(e),
    }
}
