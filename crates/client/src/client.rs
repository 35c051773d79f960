//! The client handle: gRPC calls made synchronous over a private runtime, and the opening of
//! negotiated data connections.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bs_proto as pb;
use bs_proto::blob_store_client::BlobStoreClient;
use bs_transport::{Conn, SocketOptions, TransportError};
use bs_wire::{Digest, DigestAlgo, ErrorCode, Frame, TOKEN_LEN};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::error::ClientError;
use crate::pool::{DataPool, Key, Pooled};
use crate::settings::{Security, TransferSettings};
use crate::streams::{PullStream, PushStream};

type Result<T> = std::result::Result<T, ClientError>;

/// How long `route` waits for another writer of the same upload to let go.
pub const BUSY_WAIT: Duration = Duration::from_secs(3);

pub(crate) type Grpc = BlobStoreClient<InterceptedService<Channel, bs_plane::Bearer>>;

/// A connection to one blobstream server. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    pub(crate) rt: Arc<tokio::runtime::Runtime>,
    pub(crate) grpc: Grpc,
    pub(crate) addr: String,
    pub(crate) settings: TransferSettings,
    pub(crate) security: Security,
    /// Data connections kept between transfers (shared by clones).
    pub(crate) pool: Arc<DataPool>,
    /// Whether the server takes in-band requests on kept-alive data connections (as its
    /// last `Negotiate` answer said).
    pub(crate) in_band: Arc<std::sync::atomic::AtomicBool>,
    /// The largest push the server takes pipelined in band (its last answer said; 0: none).
    pub(crate) pipeline_up_to: Arc<std::sync::atomic::AtomicU64>,
    /// The quickest `Stat` answered so far, in microseconds (`u64::MAX`: none yet).
    quickest_stat: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("addr", &self.addr).finish()
    }
}

impl Client {
    /// Connect to the control plane at `addr` (`host:port`), without TLS or credentials.
    pub fn connect(addr: &str) -> Result<Self> {
        Self::connect_with(addr, Security::default())
    }

    /// Connect with credentials and/or TLS.
    /// Connect to the control plane at `addr` (`HOST:PORT`; a bare `HOST` means port
    /// [`DEFAULT_PORT`]) with `security`.
    pub fn connect_with(addr: &str, security: Security) -> Result<Self> {
        let bad = |reason: String| ClientError::Connect { addr: addr.into(), reason };
        if addr.trim().is_empty() {
            return Err(bad("no address given".into()));
        }
        if let Some(port) = with_default_port(addr).rsplit_once(':').map(|(_, p)| p)
            && port.parse::<u16>().map_or(true, |p| p == 0)
        {
            return Err(bad(format!("{port} is not a port (1 to 65535)")));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("blobstream-client")
            .enable_all()
            .build()
            .map_err(|e| bad(e.to_string()))?;
        let scheme = if security.tls.is_some() { "https" } else { "http" };
        let uri = if addr.contains("://") {
            addr.to_string()
        } else {
            format!("{scheme}://{}", with_default_port(addr))
        };
        let endpoint =
            bs_plane::endpoint(uri, security.tls.as_ref()).map_err(|e| bad(e.to_string()))?;
        let bearer = bs_plane::Bearer::new(security.auth_token.as_deref())
            .map_err(|_| bad("the auth token is not valid header text".into()))?;
        let channel = rt.block_on(endpoint.connect()).map_err(|e| {
            // The innermost cause says what happened ("Connection refused"); the address is
            // the one tried (a bare host's default port said).
            let reason = bs_plane::root_cause(&e).to_string();
            let addr = if addr.contains("://") { addr.into() } else { with_default_port(addr) };
            ClientError::Connect { addr, reason }
        })?;
        let grpc =
            BlobStoreClient::with_interceptor(channel, bearer).max_decoding_message_size(64 << 20);
        Ok(Self {
            rt: Arc::new(rt),
            grpc,
            addr: addr.to_string(),
            settings: TransferSettings::default(),
            security,
            pool: Arc::default(),
            in_band: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            pipeline_up_to: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            quickest_stat: Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
        })
    }

    /// Use these transfer settings from now on.
    pub fn with_settings(mut self, settings: TransferSettings) -> Self {
        self.settings = settings;
        self
    }

    pub fn settings(&self) -> &TransferSettings {
        &self.settings
    }

    /// A handle to the same server whose waits are at most `limit`: connecting, each read or
    /// write on either plane, and asking a busy server again (to meet a deadline: opening a
    /// transfer waits for the server's first answer).
    pub fn within(&self, limit: Duration) -> Self {
        let mut c = self.clone();
        let s = &mut c.settings;
        (s.io_timeout, s.connect_timeout) = (s.io_timeout.min(limit), s.connect_timeout.min(limit));
        s.busy_timeout = s.busy_timeout.min(limit);
        c
    }

    /// The server address this client talks to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn call<T, F>(&self, f: impl FnOnce(Grpc) -> F) -> Result<T>
    where
        F: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        // A control call never waits longer than one data-plane read would.
        let (limit, fut) = (self.settings.io_timeout, f(self.grpc.clone()));
        match self.rt.block_on(async move { tokio::time::timeout(limit, fut).await }) {
            Ok(r) => Ok(r?.into_inner()),
            Err(_) => Err(ClientError::Timeout),
        }
    }

    pub fn stat(&self, name: &str) -> Result<pb::BlobInfo> {
        let req = pb::StatRequest { name: name.into() };
        let t = std::time::Instant::now();
        let r = self.call(|mut c| async move { c.stat(req).await });
        if matches!(r, Ok(_) | Err(ClientError::NotFound(_))) {
            let us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
            self.quickest_stat.fetch_min(us, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    /// The control plane's round trip as this client has seen it: its quickest `Stat`
    /// answered so far (found or not), if it has made one.
    pub fn round_trip(&self) -> Option<Duration> {
        let us = self.quickest_stat.load(std::sync::atomic::Ordering::Relaxed);
        (us != u64::MAX).then(|| Duration::from_micros(us))
    }

    /// One page of a listing; returns the blobs and the next page token (empty at the end).
    pub fn list_page(
        &self,
        prefix: &str,
        page_token: &str,
        page_size: u32,
    ) -> Result<(Vec<pb::BlobInfo>, String)> {
        let req =
            pb::ListRequest { prefix: prefix.into(), page_token: page_token.into(), page_size };
        let r = self.call(|mut c| async move { c.list(req).await })?;
        Ok((r.blobs, r.next_page_token))
    }

    /// Every blob under `prefix`, page after page.
    pub fn list(&self, prefix: &str) -> Result<Vec<pb::BlobInfo>> {
        let (mut all, mut token) = self.list_page(prefix, "", 0)?;
        while !token.is_empty() {
            let (page, next) = self.list_page(prefix, &token, 0)?;
            all.extend(page);
            token = next;
        }
        Ok(all)
    }

    pub fn delete(&self, name: &str) -> Result<()> {
        let req = pb::DeleteRequest { name: name.into() };
        self.call(|mut c| async move { c.delete(req).await }).map(|_| ())
    }

    /// Discard a pending upload.
    pub fn abort(&self, name: &str) -> Result<()> {
        let req = pb::AbortRequest { name: name.into() };
        self.call(|mut c| async move { c.abort(req).await }).map(|_| ())
    }

    /// Reserve a blob (or resume a pending reservation). A writer that just vanished may
    /// hold the upload for a moment until the server notices; this waits for it (up to
    /// [`BUSY_WAIT`]) instead of failing.
    pub fn route(&self, req: pb::RouteRequest) -> Result<pb::RouteResponse> {
        self.while_busy(|| {
            let r = req.clone();
            self.call(|mut c| async move { c.route(r).await })
        })
    }

    /// Repeat `f` while the server answers "busy" (another writer holds the upload), with
    /// growing pauses, for at most [`BUSY_WAIT`].
    pub(crate) fn while_busy<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let give_up = std::time::Instant::now() + BUSY_WAIT;
        let mut pause = Duration::from_millis(5);
        loop {
            match f() {
                Err(ClientError::Rpc { code: tonic::Code::Aborted, .. })
                    if std::time::Instant::now() + pause < give_up =>
                {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                other => return other,
            }
        }
    }

    /// Scrub the server's blobs under `prefix` (at most `rate` bytes/s; 0 = unlimited),
    /// calling `each` with every blob's outcome as the server reports it; returns when the
    /// server has checked them all. Not bounded by the I/O timeout: a scrub of a big store
    /// takes as long as reading it.
    pub fn scrub(
        &self,
        prefix: &str,
        rate: u64,
        mut each: impl FnMut(&pb::ScrubEvent),
    ) -> Result<()> {
        let req = pb::ScrubRequest { prefix: prefix.into(), rate_bytes_per_sec: rate };
        let mut grpc = self.grpc.clone();
        self.rt.block_on(async move {
            let mut stream = grpc.scrub(req).await?.into_inner();
            while let Some(ev) = stream.message().await? {
                each(&ev);
            }
            Ok(())
        })
    }

    /// Digest of a range of a committed blob.
    pub fn range_digest(
        &self,
        name: &str,
        offset: u64,
        length: u64,
        algo: DigestAlgo,
    ) -> Result<Digest> {
        let algo = algo.name().into();
        let req = pb::RangeDigestRequest {
            name: name.into(),
            offset,
            length,
            algo,
            ..Default::default()
        };
        let r = self.call(|mut c| async move { c.range_digest(req).await })?;
        parse_digest(&r.digest)
    }

    /// Digests of consecutive `piece`-byte pieces of a range of what the pending upload
    /// `name` holds (its ranges pushed so far), as far as it holds them: a last, shorter
    /// piece only where the range ends; bytes never written read as zeros.
    pub fn upload_piece_digests(
        &self,
        name: &str,
        offset: u64,
        length: u64,
        piece: u64,
        algo: DigestAlgo,
    ) -> Result<Vec<Digest>> {
        let req = pb::RangeDigestRequest {
            name: name.into(),
            offset,
            length,
            algo: algo.name().into(),
            upload: true,
            piece,
        };
        let r = self.call(|mut c| async move { c.range_digest(req).await })?;
        r.pieces.iter().map(|d| parse_digest(d)).collect()
    }

    fn negotiate(&self, req: pb::NegotiateRequest) -> Result<pb::NegotiateResponse> {
        self.while_busy(|| {
            let r = req.clone();
            self.call(|mut c| async move { c.negotiate(r).await })
        })
    }

    /// The socket options a negotiated transfer runs with.
    pub(crate) fn socket_options(&self, resp: &pb::NegotiateResponse) -> SocketOptions {
        let buf = |n: u32| (n > 0).then_some(n);
        SocketOptions {
            send_buffer: buf(resp.send_buffer),
            recv_buffer: buf(resp.recv_buffer),
            nodelay: true,
            io_timeout: Some(self.settings.io_timeout),
        }
    }

    /// The data connection for a negotiated transfer, its HELLO sent: a kept-alive one to the
    /// same endpoint when there is one (and `reuse`), else a new one.
    fn data_conn(&self, resp: &pb::NegotiateResponse, reuse: bool) -> Result<Pooled> {
        let token: [u8; TOKEN_LEN] =
            resp.token.as_slice().try_into().map_err(|_| {
                ClientError::Protocol("server sent a token of the wrong size".into())
            })?;
        let opts = self.socket_options(resp);
        let key = Key {
            endpoint: resp.endpoint.clone(),
            tls: resp.tls,
            socket_buffer: self.settings.socket_buffer,
        };
        let keepalive = Duration::from_millis(u64::from(resp.keepalive_ms));
        if reuse && let Some(mut conn) = self.pool.take(&key) {
            let ready = conn.apply(&opts).map_err(TransportError::from);
            if ready.is_ok() && conn.write_frame(&Frame::Hello { token }).is_ok() {
                return Ok(Pooled::new(conn, self.pool.clone(), key, keepalive, true));
            }
        }
        let conn = self.dial("tcp", &resp.endpoint, token, resp.tls, opts)?;
        Ok(Pooled::new(conn, self.pool.clone(), key, keepalive, false))
    }

    /// The name a data connection to `address` verifies the server's certificate as (unless
    /// the TLS settings name one): the data plane's host, or — when the server announced it
    /// as an IP address and the control plane was reached by a host name — that name, which
    /// its certificate holds (the same server: its control plane, already verified, gave the
    /// address).
    fn data_tls_host<'a>(&'a self, address: &'a str) -> &'a str {
        let data = bs_transport::host_of(address);
        let control = self.addr.split_once("://").map_or(self.addr.as_str(), |(_, a)| a);
        let control = control.split('/').next().unwrap_or_default();
        let control = if control.starts_with('[') || control.matches(':').count() == 1 {
            bs_transport::host_of(control)
        } else {
            control
        };
        let is_ip = |h: &str| h.parse::<std::net::IpAddr>().is_ok();
        if is_ip(data) && !control.is_empty() && !is_ip(control) { control } else { data }
    }

    /// Open a data connection to `address` over `transport` ("tcp" or "unix"), with TLS when
    /// the server's data plane speaks it, and present `token` in its HELLO.
    pub(crate) fn dial(
        &self,
        transport: &str,
        address: &str,
        token: [u8; TOKEN_LEN],
        tls: bool,
        opts: SocketOptions,
    ) -> Result<Conn> {
        let mut conn = if transport == "unix" {
            let s = std::os::unix::net::UnixStream::connect(address).map_err(|e| {
                ClientError::Connect { addr: address.into(), reason: format!("unix socket: {e}") }
            })?;
            let c = Conn::unix(s);
            c.set_read_timeout(opts.io_timeout).map_err(TransportError::from)?;
            c.set_write_timeout(opts.io_timeout).map_err(TransportError::from)?;
            c
        } else {
            let addr: SocketAddr =
                address.to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
                    ClientError::Protocol(format!("bad data endpoint {address:?}"))
                })?;
            let stream = opts.connect(addr, self.settings.connect_timeout).map_err(|e| {
                ClientError::Connect { addr: address.into(), reason: format!("data plane: {e}") }
            })?;
            let mut conn = match (&self.security.tls, tls) {
                (None, false) => Conn::new(stream),
                (Some(t), true) => Conn::tls_client(stream, t, self.data_tls_host(address))?,
                (None, true) => {
                    return Err(ClientError::Protocol(
                        "the server's data plane requires TLS: give its CA certificate (--tls-ca)"
                            .into(),
                    ));
                }
                (Some(_), false) => {
                    return Err(ClientError::Protocol(
                        "TLS was asked for but the server's data plane offers none; refusing \
                         plaintext"
                            .into(),
                    ));
                }
            };
            // A transfer's answer and small frames come in one read each (a small blob's
            // whole pull too); a bulk payload pays one copy of at most 8 KiB per frame.
            conn.set_read_ahead(true);
            conn
        };
        conn.write_frame(&Frame::Hello { token })?;
        Ok(conn)
    }

    pub(crate) fn base_request(
        &self,
        name: &str,
        direction: pb::Direction,
        offset: u64,
        length: Option<u64>,
    ) -> pb::NegotiateRequest {
        let s = &self.settings;
        pb::NegotiateRequest {
            name: name.into(),
            direction: direction as i32,
            offset,
            length,
            chunk_size: s.chunk_size,
            send_buffer: s.socket_buffer,
            recv_buffer: s.socket_buffer,
            digests: s.digests.iter().map(|d| d.name().to_string()).collect(),
            route: None,
            qos: Some(self.transfer_profile().to_pb()),
            range: false,
            pipelined: false,
            whole_before_use: false,
            upload_id: String::new(),
            auth: String::new(),
        }
    }

    /// `req` as the body of an in-band `NEGOTIATE` frame: with the control plane's token,
    /// which the server asks of in-band requests as of its calls.
    pub(crate) fn in_band_body(&self, req: &pb::NegotiateRequest) -> Vec<u8> {
        use prost::Message;
        match &self.security.auth_token {
            Some(t) => pb::NegotiateRequest { auth: t.clone(), ..req.clone() }.encode_to_vec(),
            None => req.encode_to_vec(),
        }
    }

    /// Were transfers asked to be encrypted (layer `encrypt`) by a client that does not speak
    /// TLS? They are refused then, never sent in the clear.
    pub(crate) fn encryption_unmet(&self) -> bool {
        self.security.tls.is_none()
            && self.settings.layers.contains(&bs_binding::LayerSpec::Encrypt)
    }

    /// The QoS a transfer proposes: the settings' chunk size, buffers and digests, and
    /// encryption when this client speaks TLS.
    pub(crate) fn transfer_profile(&self) -> bs_binding::Profile {
        let s = &self.settings;
        let mut p = bs_binding::Profile {
            chunk_size: s.chunk_size,
            send_buffer: s.socket_buffer,
            recv_buffer: s.socket_buffer,
            digests: s.digests.iter().map(|d| d.name().to_string()).collect(),
            layers: s
                .layers
                .iter()
                .filter(|l| **l != bs_binding::LayerSpec::Encrypt)
                .cloned()
                .collect(),
            ..bs_binding::Profile::default()
        };
        if self.security.tls.is_some() {
            p.layers.push(bs_binding::LayerSpec::Encrypt);
        }
        p
    }

    /// Start pulling `length` bytes (all remaining when `None`) of `name` from `offset`.
    pub fn open_pull(&self, name: &str, offset: u64, length: Option<u64>) -> Result<PullStream> {
        self.pull_with(self.base_request(name, pb::Direction::Pull, offset, length))
    }

    /// [`Client::open_pull`] for a reader that uses no byte before [`PullStream::verify`]
    /// (or [`PullStream::read_exact_to_end`]) has succeeded — one reading into memory, or
    /// into a file it throws away on failure. The server may then send a chunk's bytes
    /// before it has checked the chunk (faster for a small blob in an object store); a bad
    /// chunk still fails the pull, possibly after some of its bytes arrived. A reader that
    /// passes bytes on as they come (a pipe) must use `open_pull`, which receives only
    /// checked chunks.
    pub fn open_pull_whole(
        &self,
        name: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<PullStream> {
        let mut req = self.base_request(name, pb::Direction::Pull, offset, length);
        req.whole_before_use = true;
        self.pull_with(req)
    }

    fn pull_with(&self, req: pb::NegotiateRequest) -> Result<PullStream> {
        self.admitted(req, PullStream::open)
    }

    /// Negotiate and open a data connection, then `start` the stream on it. A server that
    /// turns the connection away before the transfer begins — BUSY, or closed without a word
    /// (how an evicted connection still in its TLS handshake ends) — is asked again, with a
    /// fresh token (tokens are one-time) after growing pauses, for at most
    /// [`TransferSettings::busy_timeout`].
    fn admitted<T>(
        &self,
        req: pb::NegotiateRequest,
        mut start: impl FnMut(Pooled, pb::NegotiateResponse) -> Result<T>,
    ) -> Result<T> {
        if self.encryption_unmet() {
            return Err(ClientError::InvalidArgument(
                "layer encrypt asked for, but this client does not speak TLS to the server \
                 (encryption is TLS: give the client the server's CA, and the server a \
                 certificate)"
                    .into(),
            ));
        }
        match self.in_band(&req, &mut start) {
            Some(Err(e)) if turned_away(&e) => {} // the control plane's way waits and retries
            Some(done) => return done,
            None => {}
        }
        let give_up = Instant::now() + self.settings.busy_timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            let attempt = self.negotiate(req.clone()).and_then(|resp| {
                self.learn(&resp);
                let conn = self.data_conn(&resp, true)?;
                let reused = conn.reused;
                match start(conn, resp.clone()) {
                    // A kept-alive connection the server had closed meanwhile never read
                    // the token: present it again on a new connection.
                    Err(e) if reused && turned_away(&e) => {
                        start(self.data_conn(&resp, false)?, resp)
                    }
                    other => other,
                }
            });
            match attempt {
                Err(e) if turned_away(&e) && Instant::now() + pause < give_up => {
                    std::thread::sleep(jitter(pause));
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                other => return other,
            }
        }
    }

    /// Remember what the server's answer says it takes in band.
    pub(crate) fn learn(&self, resp: &pb::NegotiateResponse) {
        use std::sync::atomic::Ordering::Relaxed;
        self.in_band.store(resp.in_band, Relaxed);
        self.pipeline_up_to.store(if resp.in_band { resp.pipeline_up_to } else { 0 }, Relaxed);
    }

    /// Negotiate `req` in band, on a kept-alive data connection (see `bs_wire::frame`), and
    /// `start` the stream on it: one round trip less than the control plane's call. `None`
    /// when there is no such connection, the server did not say it takes in-band requests
    /// (`NegotiateResponse.in_band`: a server from before them does not), or it is busy (the
    /// control plane's way waits and asks again).
    fn in_band<T>(
        &self,
        req: &pb::NegotiateRequest,
        start: &mut impl FnMut(Pooled, pb::NegotiateResponse) -> Result<T>,
    ) -> Option<Result<T>> {
        use std::sync::atomic::Ordering;
        if !self.in_band.load(Ordering::Relaxed) {
            return None;
        }
        let body = self.in_band_body(req);
        if body.len() > bs_wire::MAX_BODY_LEN as usize {
            return None;
        }
        let (key, mut conn, keepalive) = self.pool.take_any(self.settings.socket_buffer)?;
        conn.write_frame(&Frame::Negotiate { body: body.into() }).ok()?;
        let resp = match read_grant(&mut conn) {
            Granted::Yes(r) => {
                self.learn(&r);
                *r
            }
            Granted::No(status) => {
                // Refused: the connection waits for the next request.
                self.pool.give(key, conn, keepalive);
                return match status.code() {
                    tonic::Code::Unavailable | tonic::Code::Aborted => None,
                    _ => Some(Err(status.into())),
                };
            }
            Granted::Failed(e) => return Some(Err(e)),
            // Closed meanwhile, or out of step: the control plane's way, on a new connection.
            Granted::Gone => return None,
        };
        if let Err(e) = conn.apply(&self.socket_options(&resp)) {
            return Some(Err(TransportError::from(e).into()));
        }
        let keepalive = Duration::from_millis(u64::from(resp.keepalive_ms));
        Some(start(Pooled::new(conn, self.pool.clone(), key, keepalive, true), resp))
    }

    /// Start pushing into `name` from `offset`. With `route`, the blob is routed in the same
    /// round trip; otherwise it must already be routed. `length` bounds what may be sent.
    pub fn open_push(
        &self,
        name: &str,
        offset: u64,
        length: Option<u64>,
        route: Option<pb::RouteRequest>,
    ) -> Result<PushStream> {
        let mut req = self.base_request(name, pb::Direction::Push, offset, length);
        req.route = route;
        self.push_admitted(req)
    }

    /// [`Client::open_push`] into the upload a [`Client::route`] answered
    /// (`RouteResponse.upload_id`): refused by the server (`NotFound`: that upload is gone)
    /// if another put of `name` routed it again since (empty: whatever upload `name` has).
    pub fn open_push_into(
        &self,
        name: &str,
        upload_id: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Result<PushStream> {
        let mut req = self.base_request(name, pb::Direction::Push, offset, length);
        req.upload_id = upload_id.to_string();
        self.push_admitted(req)
    }

    /// Start pushing `length` bytes from `offset` into the routed upload `name` (of known
    /// size) next to pushes of its other ranges on other connections. Finish it with
    /// `finish(false)`; once every range is in, [`Client::commit`] makes the blob.
    /// [`ClientError::Rpc`] with code `Unimplemented` where the server's store takes one
    /// writer per upload. `upload_id`: as for [`Client::open_push_into`] (empty: whatever
    /// upload `name` has).
    pub fn open_push_range(
        &self,
        name: &str,
        upload_id: &str,
        offset: u64,
        length: u64,
    ) -> Result<PushStream> {
        let mut req = self.base_request(name, pb::Direction::Push, offset, Some(length));
        req.range = true;
        req.upload_id = upload_id.to_string();
        self.push_admitted(req)
    }

    /// Commit the upload `name` written in ranges: the server makes it the blob only if its
    /// bytes are ours (else [`ClientError::Corrupt`]) — every chunk equal to `chunks` (ours,
    /// computed in the same pass as `digest`), or without them, read back, of digest `digest`.
    pub fn commit(
        &self,
        name: &str,
        digest: &Digest,
        chunks: Option<&bs_wire::ChunkDigests>,
    ) -> Result<pb::BlobInfo> {
        let req = pb::CommitRequest {
            name: name.into(),
            digest: digest.to_string(),
            chunks: chunks.map(bs_wire::ChunkDigests::encode).unwrap_or_default(),
        };
        self.call(|mut c| async move { c.commit(req).await })
    }

    fn push_admitted(&self, req: pb::NegotiateRequest) -> Result<PushStream> {
        self.admitted(req, |mut conn, resp| match conn.read_frame_or_remote_error()? {
            // The server's admission: it holds the upload for us; send.
            Frame::Ack { committed: None, .. } => PushStream::start(conn, resp),
            other => Err(ClientError::Protocol(format!(
                "expected the server's admission ACK, got {other:?}"
            ))),
        })
    }
}

/// The answer to an in-band request.
pub(crate) enum Granted {
    Yes(Box<pb::NegotiateResponse>),
    /// Refused, with the status the control plane would give; the connection waits for the
    /// next request.
    No(tonic::Status),
    /// A GRANT that says nothing sensible, or none in time (as a call that timed out).
    Failed(ClientError),
    /// Closed meanwhile, or out of step.
    Gone,
}

/// Read the `GRANT` answering an in-band request on `conn`.
pub(crate) fn read_grant(conn: &mut Conn) -> Granted {
    use prost::Message;
    match conn.read_frame() {
        Ok(Frame::Grant { code: 0, body }) => match pb::NegotiateResponse::decode(&body[..]) {
            Ok(r) => Granted::Yes(Box::new(r)),
            Err(e) => Granted::Failed(ClientError::Protocol(format!("bad GRANT: {e}"))),
        },
        Ok(Frame::Grant { code, body }) => {
            let code = tonic::Code::from(i32::try_from(code).unwrap_or(i32::MAX));
            Granted::No(tonic::Status::new(code, String::from_utf8_lossy(&body)))
        }
        Err(TransportError::Timeout) => Granted::Failed(ClientError::Timeout),
        _ => Granted::Gone,
    }
}

fn parse_digest(d: &str) -> Result<Digest> {
    d.parse().map_err(|e| ClientError::Protocol(format!("bad digest from server: {e}")))
}

/// Whether a data connection was turned away before its transfer began, so that asking
/// again may succeed.
pub(crate) fn turned_away(e: &ClientError) -> bool {
    use std::io::ErrorKind::*;
    match e {
        ClientError::Transfer(TransportError::Remote { code, .. }) => *code == ErrorCode::Busy,
        ClientError::Transfer(TransportError::Closed) => true,
        ClientError::Transfer(TransportError::Io(e)) => {
            matches!(e.kind(), ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof)
        }
        _ => false,
    }
}

/// `pause`, give or take a quarter, so clients turned away together do not return together.
fn jitter(pause: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let quarter = pause / 4;
    pause - quarter + quarter.mul_f64(f64::from(nanos % 1000) / 500.0)
}

/// The control plane's port when an address names none.
pub const DEFAULT_PORT: u16 = 7070;

/// `addr` with [`DEFAULT_PORT`] added when it names a host only (`localhost`, `10.0.0.5`,
/// `[::1]`).
pub fn with_default_port(addr: &str) -> String {
    let has_port = match addr.rsplit_once(':') {
        None => false,
        // `[::1]` ends in its bracket; `[::1]:7070` and `host:7070` end in digits after ':'.
        Some((host, port)) => {
            !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (!host.contains(':') || host.ends_with(']'))
        }
    };
    if has_port { addr.to_string() } else { format!("{addr}:{DEFAULT_PORT}") }
}

#[cfg(test)]
mod port_tests {
    use super::*;

    #[test]
    fn a_bare_host_gets_the_default_port() {
        assert_eq!(with_default_port("localhost"), "localhost:7070");
        assert_eq!(with_default_port("10.0.0.5"), "10.0.0.5:7070");
        assert_eq!(with_default_port("[::1]"), "[::1]:7070");
        assert_eq!(with_default_port("h:7171"), "h:7171");
        assert_eq!(with_default_port("[::1]:7171"), "[::1]:7171");
    }
}
