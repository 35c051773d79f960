//! Data-plane streams: a pull reads the announced payload and verifies its digest at the
//! end; a push sends payload and waits for the server's end-to-end confirmation.

use std::time::Duration;

use bs_binding::transfer::{PullReceiver, PushSender};
use bs_binding::{BindingError, Carrier, Msg, Profile, Role};
use bs_proto as pb;
use bs_transport::{Conn, TransportError};
use bs_wire::{Digest, DigestAlgo, Frame, Hasher};

use crate::error::ClientError;
use crate::pool::Pooled;

type Result<T> = std::result::Result<T, ClientError>;

fn algo_of(resp: &pb::NegotiateResponse) -> Result<DigestAlgo> {
    resp.digest
        .parse()
        .map_err(|_| ClientError::Protocol(format!("unknown digest {:?}", resp.digest)))
}

/// The layers the server's offer put on this transfer's bytes (none from a server that
/// predates bindings).
fn carrier(resp: &pb::NegotiateResponse) -> Result<Option<Box<Carrier>>> {
    let Some(q) = &resp.qos else { return Ok(None) };
    let p = Profile::from_pb(q)?;
    Ok(Carrier::for_profile(&p, Role::Initiator, Default::default()).map(Box::new))
}

fn set_timeout(conn: &Conn, t: Duration) -> Result<()> {
    let t = Some(t.max(Duration::from_millis(1)));
    conn.set_read_timeout(t).map_err(TransportError::from)?;
    conn.set_write_timeout(t).map_err(TransportError::from)?;
    Ok(())
}

/// An open pull: read it to the end, then it has verified every byte.
///
/// The server sends the range as consecutive DATA frames (one per stored chunk, each checked
/// against its chunk digest before it is sent); an ERROR frame between them — a chunk found
/// corrupt on the server — ends the stream with that error. Opened with
/// [`crate::Client::open_pull_whole`], the frames may instead carry a chunk's bytes before the
/// server has checked it (a small blob in an object store, sent as it arrives): a bad chunk
/// still ends the stream with that error, and [`PullStream::verify`] succeeds only after
/// every chunk checked.
#[derive(Debug)]
pub struct PullStream {
    conn: Pooled,
    info: pb::BlobInfo,
    rules: PullReceiver,
    hasher: Hasher,
    verified: Option<Digest>,
    /// Layered transfers only.
    layered: Option<Box<LayeredPull>>,
    /// Pulls asked on this connection after this one and not yet answered
    /// ([`crate::Client::ask_after`]): while there are any, the connection is out of step for
    /// anyone else and never goes back to the pool.
    pub(crate) asked: usize,
}

/// A pull through message layers: the stack, and the decoded message being handed out.
#[derive(Debug)]
struct LayeredPull {
    carrier: Carrier,
    /// The current frame's bytes, and how many of them were handed out.
    current: Option<(Msg, usize)>,
}

impl PullStream {
    /// The stream of a granted pull on `conn`, or the server's refusal: an ERROR as its
    /// first frame (a chunk found corrupt before the first byte, say); anything else is the
    /// stream's, left in place for it.
    pub(crate) fn open(mut conn: Pooled, resp: pb::NegotiateResponse) -> Result<Self> {
        if let Frame::Error { code, message } = conn.peek_frame()? {
            return Err(TransportError::Remote { code, message }.into());
        }
        Self::start(conn, resp)
    }

    fn start(conn: Pooled, resp: pb::NegotiateResponse) -> Result<Self> {
        let algo = algo_of(&resp)?;
        let layered = carrier(&resp)?.map(|c| Box::new(LayeredPull { carrier: *c, current: None }));
        let info =
            resp.blob.ok_or_else(|| ClientError::Protocol("pull without blob info".into()))?;
        Ok(Self {
            conn,
            info,
            rules: PullReceiver::new(resp.offset, resp.length),
            hasher: algo.hasher(),
            verified: None,
            layered,
            asked: 0,
        })
    }

    /// This pull's data connection, once its SUM was read (with the pulls asked after it).
    pub(crate) fn into_conn(self) -> Pooled {
        self.conn
    }

    /// The connection this pull runs on.
    pub(crate) fn conn_mut(&mut self) -> &mut Pooled {
        &mut self.conn
    }

    /// Pulls asked after this one on its connection ([`crate::Client::ask_after`]) and not
    /// yet opened ([`crate::Client::next_asked`]).
    pub fn asked_after(&self) -> usize {
        self.asked
    }

    /// Whether the server keeps this pull's connection for another transfer.
    pub(crate) fn kept_alive(&self) -> bool {
        self.conn.kept_alive()
    }

    /// The shortest round trip the kernel has measured on this pull's connection (TCP only).
    pub fn round_trip(&self) -> Option<Duration> {
        self.conn.tcp().and_then(bs_transport::far::rtt)
    }

    /// Read the next DATA header, which must continue exactly where the last one ended.
    fn next_frame(&mut self) -> Result<()> {
        match self.conn.read_frame_or_remote_error()? {
            Frame::Data { offset, len } => {
                self.rules.on_data(offset, len).map_err(ClientError::Protocol)
            }
            other => Err(ClientError::Protocol(format!(
                "expected DATA at {} of at most {} bytes, got {other:?}",
                self.rules.offset() + self.rules.got(),
                self.rules.left()
            ))),
        }
    }

    /// The blob being read (as it was when the pull was negotiated).
    pub fn info(&self) -> &pb::BlobInfo {
        &self.info
    }

    /// Blob offset of the first byte of this pull.
    pub fn offset(&self) -> u64 {
        self.rules.offset()
    }

    /// Bytes this pull delivers in all.
    pub fn len(&self) -> u64 {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Bytes delivered so far.
    pub fn position(&self) -> u64 {
        self.rules.got()
    }

    /// Lower the wait for the peer on each read (used to enforce a deadline).
    pub fn set_io_timeout(&self, t: Duration) -> Result<()> {
        set_timeout(&self.conn, t)
    }

    /// Read the next bytes into `buf` (straight from the socket, no intermediate copy).
    /// Returns 0 at the end, after the digest has been verified; a mismatch is an error.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        if self.rules.left() == 0 {
            self.verify()?;
            return Ok(0);
        }
        if self.rules.in_frame() == 0 {
            self.next_frame()?;
            if let Some(l) = &mut self.layered {
                // The frame's bytes come as one layered message: decode (its layers check
                // it), hash, then hand it out from memory.
                let m = l.carrier.recv(&mut self.conn, self.rules.in_frame())?;
                self.hasher.update(m.payload());
                l.current = Some((m, 0));
            }
        }
        let n = (buf.len() as u64).min(self.rules.in_frame()) as usize;
        if let Some((m, at)) = self.layered.as_mut().and_then(|l| l.current.as_mut()) {
            buf[..n].copy_from_slice(&m.payload()[*at..*at + n]);
            *at += n;
            self.rules.advance(n as u64);
            return Ok(n);
        }
        let (len, got) = (self.rules.len(), self.rules.got());
        self.conn.recv_data_into(&mut buf[..n], Some(&mut self.hasher)).map_err(|e| match e {
            TransportError::Truncated { got: g, .. } => {
                TransportError::Truncated { expected: len, got: got + g }
            }
            e => e,
        })?;
        self.rules.advance(n as u64);
        Ok(n)
    }

    /// Read everything that is left into `dst` (which must be exactly that long) and verify.
    pub fn read_exact_to_end(&mut self, dst: &mut [u8]) -> Result<Digest> {
        if dst.len() as u64 != self.rules.left() {
            return Err(ClientError::Protocol(format!(
                "destination holds {} bytes, {} remain",
                dst.len(),
                self.rules.left()
            )));
        }
        let mut off = 0;
        while off < dst.len() {
            off += self.read(&mut dst[off..])?;
        }
        self.verify()
    }

    /// After the last byte: read the sender's digest and compare.
    pub fn verify(&mut self) -> Result<Digest> {
        if let Some(d) = &self.verified {
            return Ok(d.clone());
        }
        if self.rules.left() != 0 {
            return Err(ClientError::Protocol(format!(
                "verify after {} of {} bytes",
                self.rules.got(),
                self.rules.len()
            )));
        }
        match self.conn.read_frame_or_remote_error()? {
            Frame::Sum { total, digest, .. } => {
                let ours = self.hasher.finish();
                if let Err((expected, actual)) = self.rules.on_sum(total, &digest, &ours) {
                    return Err(ClientError::ChecksumMismatch { expected, actual });
                }
                self.verified = Some(ours.clone());
                // The whole range and its SUM were read: the connection may carry another
                // (unless pulls asked after this one are still coming on it).
                if self.asked == 0 {
                    self.conn.done();
                }
                Ok(ours)
            }
            other => Err(ClientError::Protocol(format!("expected SUM, got {other:?}"))),
        }
    }
}

/// The server's confirmation of a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushAck {
    /// Bytes the upload now holds.
    pub received: u64,
    /// Digest of the whole blob, when the push committed it.
    pub committed: Option<Digest>,
}

/// An open push: write payload, then `finish` for the server's confirmation.
#[derive(Debug)]
pub struct PushStream {
    conn: Pooled,
    rules: PushSender,
    hasher: Hasher,
    route: Option<pb::RouteResponse>,
    carrier: Option<Box<Carrier>>,
}

impl PushStream {
    pub(crate) fn start(conn: Pooled, resp: pb::NegotiateResponse) -> Result<Self> {
        let algo = algo_of(&resp)?;
        Ok(Self {
            conn,
            rules: PushSender::new(resp.offset, resp.length, resp.chunk_size),
            hasher: algo.hasher(),
            carrier: carrier(&resp)?,
            route: resp.route,
        })
    }

    /// What routing in the same round trip returned (bytes already held when resumed).
    pub fn routed(&self) -> Option<&pb::RouteResponse> {
        self.route.as_ref()
    }

    /// Blob offset the next byte will be written at.
    pub fn position(&self) -> u64 {
        self.rules.position()
    }

    /// Lower the wait for the peer on each write (used to enforce a deadline).
    pub fn set_io_timeout(&self, t: Duration) -> Result<()> {
        set_timeout(&self.conn, t)
    }

    /// Send `data` as the next bytes of the blob, in DATA frames of at most the negotiated
    /// chunk size, straight from `data` (no copy).
    pub fn write(&mut self, data: &[u8]) -> Result<()> {
        self.rules.check(data.len()).map_err(ClientError::InvalidArgument)?;
        let piece_len = match &self.carrier {
            Some(c) => self.rules.chunk().min(c.max_piece()),
            None => self.rules.chunk(),
        };
        for piece in data.chunks(piece_len) {
            let at = self.rules.position();
            let h = Some(&mut self.hasher);
            let sent = match &mut self.carrier {
                Some(c) => c.send(&mut self.conn, at, piece, h),
                None => self.conn.send_data_slice(at, piece, h).map_err(BindingError::from),
            };
            match sent {
                Ok(()) => {}
                Err(BindingError::Transport(e)) => return Err(self.server_reason(e)),
                Err(e) => return Err(e.into()),
            }
            self.rules.advance(piece.len());
        }
        Ok(())
    }

    /// When a write fails because the server hung up, its ERROR frame says why; prefer that.
    fn server_reason(&mut self, e: TransportError) -> ClientError {
        if matches!(e, TransportError::Io(_))
            && let Err(TransportError::Remote { code, message }) =
                self.conn.read_frame_or_remote_error()
        {
            return TransportError::Remote { code, message }.into();
        }
        e.into()
    }

    /// Send the digest and wait for the server's confirmation. `commit`: this completes the
    /// blob, make it visible.
    pub fn finish(mut self, commit: bool) -> Result<PushAck> {
        let digest = self.hasher.finish();
        let total = self.rules.sent();
        self.conn
            .write_frame(&Frame::Sum { total, final_: commit, digest })
            .map_err(|e| self.server_reason(e))?;
        match self.conn.read_frame_or_remote_error()? {
            Frame::Ack { received, committed } => {
                self.conn.done();
                Ok(PushAck { received, committed })
            }
            other => Err(ClientError::Protocol(format!("expected ACK, got {other:?}"))),
        }
    }
}
