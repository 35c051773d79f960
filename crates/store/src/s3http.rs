//! The HTTP client the S3 store uses for a plain-`http://` endpoint: hyper over TCP sockets
//! that acknowledge what they receive at once (`TCP_QUICKACK` after every read).
//!
//! Why not `object_store`'s own client (reqwest): an S3 server that leaves Nagle's algorithm
//! on — Garage 2.5 does, on every connection it accepts — holds the last, short segment of
//! an answer until its first short segment (the header) is acknowledged, and Linux delays
//! that acknowledgement by up to 40 ms on a connection it sees as request/response. A
//! trace of 300 back-to-back 1 MB GETs from Garage on loopback: 13 % of ours and 5 % of
//! object_store's own took 45–50 ms instead of 3–5; with acknowledgements sent at once
//! (the route's `quickack`, for the diagnosis) none did, and our median fell from 4.1 to
//! 3.4 ms. reqwest gives no access to its sockets, so this client is hyper's own with a
//! connector of ours; it sends `TCP_QUICKACK` after each read that returned bytes (a system
//! call per read, next to the read's own). With it, none of 300 such GETs stalled and their
//! median was 2.8 ms.
//!
//! It also signs the requests (AWS Signature V4, with `object_store`'s own signer), so that
//! a body's SHA-256 — which the signature covers, and the server checks against the bytes
//! it receives — can be one the store computed while the bytes arrived from its client
//! ([`PayloadSha256`], a request extension) instead of one computed when the request
//! leaves: a 1 MB PUT then starts at once rather than after half a millisecond of hashing
//! (paired runs against object_store alone: 0.865 and 0.873 of its rate with, 0.841 and
//! 0.846 without).
//! A request without one has its body hashed here, as `object_store` would; the bucket
//! client is built with unsigned payloads so that it does not hash them too.
//!
//! Over TLS (`https://`, AWS) the store keeps `object_store`'s client, with its certificate
//! handling and proxies; see [`crate::S3Config::build`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use object_store::aws::{AwsAuthorizer, AwsCredential};
use object_store::client::{
    HttpClient, HttpError, HttpErrorKind, HttpRequest, HttpRequestBody, HttpResponse,
    HttpResponseBody, HttpService,
};
use object_store::{ClientOptions, PutPayload, client::HttpConnector as ObjConnector};
use ring::digest::{Context as Sha256, SHA256};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Idle connections are closed after this long (the server may close them sooner; a
/// request that finds its pooled connection closed is sent again on a new one).
const POOL_IDLE: Duration = Duration::from_secs(30);

/// A request body's SHA-256, computed by the store as the bytes arrived; the request is
/// signed with it (see the module doc). Wrong, the server refuses the request: never are
/// other bytes stored than were signed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PayloadSha256(pub(crate) [u8; 32]);

/// The SHA-256 of an upload's bytes so far, taken in as they arrive (in order, from the
/// start).
pub(crate) struct RunningSha {
    ctx: Sha256,
    upto: usize,
}

impl RunningSha {
    pub(crate) fn new() -> Self {
        Self { ctx: Sha256::new(&SHA256), upto: 0 }
    }

    /// Take in what `bytes` (the upload so far) holds past what was taken in before.
    /// `false` if it holds less (rolled back): this hash no longer describes it.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> bool {
        let Some(new) = bytes.get(self.upto..) else { return false };
        self.ctx.update(new);
        self.upto = bytes.len();
        true
    }

    /// The hash of `bytes`, if it is what was taken in (by length: a rewrite in between is
    /// the caller's to report by dropping this).
    pub(crate) fn finish_for(self, bytes: &[u8]) -> Option<PayloadSha256> {
        (self.upto == bytes.len()).then(|| {
            let mut d = [0u8; 32];
            d.copy_from_slice(self.ctx.finish().as_ref());
            PayloadSha256(d)
        })
    }
}

/// Signs every request of a bucket client built with unsigned payloads, with its body's
/// SHA-256.
#[derive(Debug, Clone)]
pub(crate) struct Signer {
    pub(crate) credential: Arc<AwsCredential>,
    pub(crate) region: String,
}

impl Signer {
    async fn sign(&self, req: HttpRequest) -> Result<HttpRequest, HttpError> {
        let (parts, body) = req.into_parts();
        let (digest, body) = match parts.extensions.get::<PayloadSha256>() {
            Some(d) => (d.0, body),
            None => hash_body(body).await?,
        };
        let mut req = HttpRequest::from_parts(parts, body);
        AwsAuthorizer::new(&self.credential, "s3", &self.region).authorize(&mut req, Some(&digest));
        Ok(req)
    }
}

/// A body's SHA-256, and the body (its pieces taken out to hash them and put back).
async fn hash_body(mut body: HttpRequestBody) -> Result<([u8; 32], HttpRequestBody), HttpError> {
    let mut ctx = Sha256::new(&SHA256);
    let mut pieces = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if let Ok(data) = frame?.into_data() {
            ctx.update(&data);
            pieces.push(data);
        }
    }
    let mut d = [0u8; 32];
    d.copy_from_slice(ctx.finish().as_ref());
    Ok((d, HttpRequestBody::from(PutPayload::from_iter(pieces))))
}

/// Makes the store's [`HttpClient`] for a plain-HTTP endpoint (see the module doc).
#[derive(Debug, Clone)]
pub(crate) struct QuickAckConnector {
    /// Whole request: from sending it to the last byte of the answer.
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) signer: Signer,
}

impl ObjConnector for QuickAckConnector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(self.connect_timeout));
        http.set_keepalive(Some(Duration::from_secs(30)));
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(Connect(http));
        Ok(HttpClient::new(QuickAckService {
            client,
            timeout: self.timeout,
            signer: self.signer.clone(),
        }))
    }
}

#[derive(Debug)]
struct QuickAckService {
    client: Client<Connect, HttpRequestBody>,
    timeout: Duration,
    signer: Signer,
}

#[async_trait::async_trait]
impl HttpService for QuickAckService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let req = self.signer.sign(req).await?;
        let resp = tokio::time::timeout_at(deadline, self.client.request(req))
            .await
            .map_err(|_| timed_out())?
            .map_err(client_error)?;
        let (parts, body) = resp.into_parts();
        let body = Deadline { body, sleep: Box::pin(tokio::time::sleep_until(deadline)) };
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}

fn timed_out() -> HttpError {
    HttpError::new(HttpErrorKind::Timeout, io::Error::from(io::ErrorKind::TimedOut))
}

/// The retry logic's view of a failed request: which failures are worth sending again.
fn client_error(e: hyper_util::client::legacy::Error) -> HttpError {
    let kind = if e.is_connect() {
        HttpErrorKind::Connect
    } else {
        match std::error::Error::source(&e).and_then(|s| s.downcast_ref::<hyper::Error>()) {
            Some(h) if h.is_timeout() => HttpErrorKind::Timeout,
            // The request was not answered (the connection closed, the answer cut short):
            // sent again if the retry logic may.
            _ => HttpErrorKind::Request,
        }
    };
    HttpError::new(kind, e)
}

fn body_error(e: hyper::Error) -> HttpError {
    let kind = if e.is_incomplete_message() || e.is_closed() {
        HttpErrorKind::Interrupted
    } else if e.is_timeout() {
        HttpErrorKind::Timeout
    } else {
        HttpErrorKind::Unknown
    };
    HttpError::new(kind, e)
}

/// An answer's body that fails once the request's time is up.
struct Deadline {
    body: hyper::body::Incoming,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Body for Deadline {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(body_error)));
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(timed_out()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// hyper's connector, its sockets wrapped in [`QuickAck`].
#[derive(Clone)]
struct Connect(HttpConnector);

impl tower_service::Service<http::Uri> for Connect {
    type Response = QuickAck;
    type Error = <HttpConnector as tower_service::Service<http::Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<QuickAck, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move { Ok(QuickAck(connecting.await?.into_inner())) })
    }
}

/// A TCP connection that acknowledges every read at once.
struct QuickAck(TcpStream);

impl QuickAck {
    fn ack_now(&self) {
        // A failure (never seen on Linux TCP) only leaves the kernel's own timing.
        let _ = socket2::SockRef::from(&self.0).set_tcp_quickack(true);
    }
}

impl Read for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        // As `TokioIo` reads: into the cursor's unfilled part, then advance it.
        // SAFETY: tokio's ReadBuf only writes initialized bytes into the unfilled part, and
        // the cursor is advanced by exactly what it filled.
        let n = unsafe {
            let mut tbuf = tokio::io::ReadBuf::uninit(buf.as_mut());
            ready!(Pin::new(&mut self.0).poll_read(cx, &mut tbuf))?;
            tbuf.filled().len()
        };
        unsafe { buf.advance(n) };
        if n > 0 {
            self.ack_now();
        }
        Poll::Ready(Ok(()))
    }
}

impl Write for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Connection for QuickAck {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::path::Path as ObjPath;
    use object_store::{ObjectStore, PutOptions};

    fn sha(b: &[u8]) -> [u8; 32] {
        let mut d = [0u8; 32];
        d.copy_from_slice(ring::digest::digest(&SHA256, b).as_ref());
        d
    }

    #[test]
    fn a_running_sha_taken_in_pieces_is_the_whole_ones_and_notices_a_rollback() {
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut h = RunningSha::new();
        for end in [0, 1, 4096, 65_536, 65_537, 299_999, 300_000] {
            assert!(h.feed(&bytes[..end]));
        }
        assert!(h.feed(&bytes), "nothing new is nothing to take in");
        assert_eq!(h.finish_for(&bytes).map(|d| d.0), Some(sha(&bytes)));

        let mut h = RunningSha::new();
        assert!(h.feed(&bytes[..1000]));
        assert!(!h.feed(&bytes[..999]), "fewer bytes than taken in: rolled back");
        let mut h = RunningSha::new();
        assert!(h.feed(&bytes[..1000]));
        assert!(h.finish_for(&bytes[..1001]).is_none(), "not the bytes it took in");
    }

    #[tokio::test]
    async fn a_body_hashed_on_the_way_out_keeps_every_piece() {
        let pieces = [Bytes::from_static(b"abc"), Bytes::new(), Bytes::from(vec![9u8; 70_000])];
        let body = HttpRequestBody::from(PutPayload::from_iter(pieces.clone()));
        let (d, body) = hash_body(body).await.unwrap();
        assert_eq!(d, sha(&pieces.concat()));
        let (_, again) = hash_body(body).await.unwrap();
        assert_eq!(again.content_length(), 70_003);
    }

    /// Against a real Garage: a PUT signed with the SHA-256 given is stored; one given
    /// the SHA-256 of other bytes is refused by the server, and nothing is stored.
    #[test]
    fn the_server_refuses_a_put_signed_for_other_bytes() {
        let g = bs_peers::Garage::start("signing").unwrap();
        let e = g.endpoint();
        let cfg = crate::S3Config {
            endpoint: Some(e.url.clone()),
            region: e.region.clone(),
            bucket: e.bucket.clone(),
            prefix: "t".into(),
            access_key_id: e.key_id.clone(),
            secret_access_key: e.secret.clone(),
            timeout: None,
        };
        let os = cfg.build().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let body = Bytes::from(vec![7u8; 1 << 20]);
        let put = |key: &str, digest: [u8; 32]| {
            let mut opts = PutOptions::default();
            opts.extensions.insert(PayloadSha256(digest));
            rt.block_on(os.put_opts(&ObjPath::from(key), body.clone().into(), opts))
        };
        put("t/right", sha(&body)).unwrap();
        let got = rt.block_on(async { os.get(&ObjPath::from("t/right")).await?.bytes().await });
        assert_eq!(got.unwrap(), body);

        let mut other = body.to_vec();
        other[12345] ^= 1;
        let e = put("t/wrong", sha(&other)).unwrap_err();
        // The server's own reason: the body is not what was signed.
        assert!(e.to_string().contains("InvalidDigest"), "{e}");
        let gone = rt.block_on(os.head(&ObjPath::from("t/wrong")));
        assert!(matches!(gone, Err(object_store::Error::NotFound { .. })), "{gone:?}");
        // Unsigned by us (no SHA-256 given): hashed as it leaves, and stored.
        rt.block_on(os.put(&ObjPath::from("t/plain"), body.clone().into())).unwrap();
    }
}
