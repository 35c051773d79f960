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
//! it chooses how a body is checked. A PUT of bytes (an object or a part) is signed with
//! `UNSIGNED-PAYLOAD` and carries its CRC-32 in a signed `x-amz-checksum-crc32` header,
//! which the server checks against the bytes it receives and refuses the request on a
//! mismatch, as AWS's own SDKs now send their uploads; every other request keeps its body's
//! SHA-256 in the signature. Why not the SHA-256 everywhere, as `object_store` does: both
//! ends then hash every byte put at about 2 GB/s (this machine's SHA extensions), a cost on
//! the path of each PUT that a CRC (over 10 GB/s) all but removes. On a 2-core machine
//! shared with Garage, `bench s3` put 1, 32 and 256 MB blobs at 0.886, 0.886 and 0.941 of
//! `object_store`'s rate alone (SHA-256 signed, its default) with SHA-256 here, and at 0.992,
//! 1.053 and 1.056 with the CRC. What the bucket's check is for is the hop: a byte damaged
//! on its way to the bucket makes the PUT fail rather than be stored; the blob's own digests
//! (`bs_wire::digest`) still check every read end to end. A small blob's CRC is taken as its
//! bytes arrive from the client ([`RunningCrc`], passed as the [`PayloadCrc32`] request
//! extension), so its PUT starts at once; a part's is taken here as it leaves.
//!
//! Over TLS (`https://`, AWS) the store keeps `object_store`'s client, with its certificate
//! handling and proxies; see [`crate::S3Config::build`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
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

/// A PUT body's CRC-32, computed by the store as the bytes arrived; the request carries it
/// (see the module doc). Wrong, the server refuses the request: never are other bytes
/// stored than were checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PayloadCrc32(pub(crate) u32);

/// The CRC-32 of an upload's bytes so far, taken in as they arrive (in order, from the
/// start).
pub(crate) struct RunningCrc {
    crc: crc32fast::Hasher,
    upto: usize,
}

impl RunningCrc {
    pub(crate) fn new() -> Self {
        Self { crc: crc32fast::Hasher::new(), upto: 0 }
    }

    /// Take in what `bytes` (the upload so far) holds past what was taken in before.
    /// `false` if it holds less (rolled back): this CRC no longer describes it.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> bool {
        let Some(new) = bytes.get(self.upto..) else { return false };
        self.crc.update(new);
        self.upto = bytes.len();
        true
    }

    /// The CRC of `bytes`, if it is what was taken in (by length: a rewrite in between is
    /// the caller's to report by dropping this).
    pub(crate) fn finish_for(self, bytes: &[u8]) -> Option<PayloadCrc32> {
        (self.upto == bytes.len()).then(|| PayloadCrc32(self.crc.finalize()))
    }
}

/// The header a PUT's CRC-32 travels in (signed with the rest).
const CHECKSUM_CRC32: &str = "x-amz-checksum-crc32";

/// Signs every request of a bucket client built with unsigned payloads: a PUT of bytes
/// with its CRC-32, any other with its body's SHA-256 (see the module doc).
#[derive(Debug, Clone)]
pub(crate) struct Signer {
    pub(crate) credential: Arc<AwsCredential>,
    pub(crate) region: String,
}

impl Signer {
    async fn sign(&self, req: HttpRequest) -> Result<HttpRequest, HttpError> {
        let (mut parts, body) = req.into_parts();
        let auth = AwsAuthorizer::new(&self.credential, "s3", &self.region);
        if puts_bytes(&parts) {
            let (crc, body) = match parts.extensions.get::<PayloadCrc32>() {
                Some(c) => (c.0, body),
                None => {
                    let mut crc = crc32fast::Hasher::new();
                    let body = read_body(body, |piece| crc.update(piece)).await?;
                    (crc.finalize(), body)
                }
            };
            let value = BASE64.encode(crc.to_be_bytes());
            let value = http::HeaderValue::from_str(&value).expect("base64 is a header value");
            parts.headers.insert(CHECKSUM_CRC32, value);
            let mut req = HttpRequest::from_parts(parts, body);
            auth.with_sign_payload(false).authorize(&mut req, None);
            return Ok(req);
        }
        let mut sha = Sha256::new(&SHA256);
        let body = read_body(body, |piece| sha.update(piece)).await?;
        let mut digest = [0u8; 32];
        digest.copy_from_slice(sha.finish().as_ref());
        let mut req = HttpRequest::from_parts(parts, body);
        auth.authorize(&mut req, Some(&digest));
        Ok(req)
    }
}

/// Whether a request uploads bytes: a PUT of an object or a part, not a copy (whose body
/// is empty and whose source the server reads), nor one carrying a checksum already.
fn puts_bytes(parts: &http::request::Parts) -> bool {
    parts.method == http::Method::PUT
        && !parts.headers.contains_key("x-amz-copy-source")
        && !parts.headers.keys().any(|k| k.as_str().starts_with("x-amz-checksum-"))
}

/// A body, each of its pieces shown to `take` on the way (taken out and put back).
async fn read_body(
    mut body: HttpRequestBody,
    mut take: impl FnMut(&[u8]),
) -> Result<HttpRequestBody, HttpError> {
    // By its length: object_store 0.12's `is_empty` says a multi-piece body with bytes is
    // empty (its test is inverted).
    if body.content_length() == 0 {
        return Ok(body);
    }
    let mut pieces = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if let Ok(data) = frame?.into_data() {
            take(&data);
            pieces.push(data);
        }
    }
    Ok(HttpRequestBody::from(PutPayload::from_iter(pieces)))
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
    use object_store::multipart::MultipartStore;
    use object_store::path::Path as ObjPath;
    use object_store::{ObjectStore, PutOptions};

    fn crc(b: &[u8]) -> u32 {
        crc32fast::hash(b)
    }

    #[test]
    fn a_running_crc_taken_in_pieces_is_the_whole_ones_and_notices_a_rollback() {
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut h = RunningCrc::new();
        for end in [0, 1, 4096, 65_536, 65_537, 299_999, 300_000] {
            assert!(h.feed(&bytes[..end]));
        }
        assert!(h.feed(&bytes), "nothing new is nothing to take in");
        assert_eq!(h.finish_for(&bytes).map(|d| d.0), Some(crc(&bytes)));

        let mut h = RunningCrc::new();
        assert!(h.feed(&bytes[..1000]));
        assert!(!h.feed(&bytes[..999]), "fewer bytes than taken in: rolled back");
        let mut h = RunningCrc::new();
        assert!(h.feed(&bytes[..1000]));
        assert!(h.finish_for(&bytes[..1001]).is_none(), "not the bytes it took in");
    }

    #[tokio::test]
    async fn a_body_read_on_the_way_out_keeps_every_piece() {
        let pieces = [Bytes::from_static(b"abc"), Bytes::new(), Bytes::from(vec![9u8; 70_000])];
        let body = HttpRequestBody::from(PutPayload::from_iter(pieces.clone()));
        let mut seen = Vec::new();
        let body = read_body(body, |p| seen.extend_from_slice(p)).await.unwrap();
        assert_eq!(seen, pieces.concat());
        assert_eq!(body.content_length(), 70_003);
        let again = read_body(body, |_| {}).await.unwrap();
        assert_eq!(again.content_length(), 70_003);
    }

    #[test]
    fn only_a_put_of_bytes_is_checked_by_its_crc() {
        let parts = |method: http::Method, header: Option<&'static str>| {
            let mut b = http::Request::builder().method(method).uri("http://h/b/k");
            if let Some(h) = header {
                b = b.header(h, "x");
            }
            b.body(()).unwrap().into_parts().0
        };
        assert!(puts_bytes(&parts(http::Method::PUT, None)));
        assert!(!puts_bytes(&parts(http::Method::PUT, Some("x-amz-copy-source"))));
        assert!(!puts_bytes(&parts(http::Method::PUT, Some("x-amz-checksum-sha256"))));
        assert!(!puts_bytes(&parts(http::Method::POST, None)));
        assert!(!puts_bytes(&parts(http::Method::GET, None)));
    }

    /// A server that takes a PUT and never answers it: once the request times out, the PUT
    /// (idempotent) goes again on a new connection, and the answer to that one counts.
    #[test]
    fn a_put_the_server_never_answers_is_sent_again_after_the_timeout() {
        use std::io::{BufRead, BufReader, Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, seen) = std::sync::mpsc::channel();
        // The first connection is held open and never answered; every later one is answered
        // (so a busy machine that times out the second try as well still gets a third).
        std::thread::spawn(move || {
            let mut unanswered = Vec::new();
            for s in l.incoming() {
                let Ok(s) = s else { return };
                let mut r = BufReader::new(s.try_clone().unwrap());
                let (mut line, mut len) = (String::new(), 0usize);
                let _ = r.read_line(&mut line);
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap_or(0) == 0 {
                        break;
                    }
                    let h = h.trim_end().to_ascii_lowercase();
                    if h.is_empty() {
                        break;
                    }
                    if let Some(v) = h.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0u8; len];
                let _ = r.read_exact(&mut body);
                let _ = tx.send((line.trim_end().to_string(), body));
                if unanswered.is_empty() {
                    unanswered.push(s);
                } else {
                    let ok = b"HTTP/1.1 200 OK\r\nETag: \"e1\"\r\nContent-Length: 0\r\n\r\n";
                    let _ = (&s).write_all(ok);
                }
            }
        });
        let cfg = crate::S3Config {
            endpoint: Some(format!("http://{addr}")),
            region: "garage".into(),
            bucket: "b".into(),
            prefix: "t".into(),
            access_key_id: "GK1".into(),
            secret_access_key: "secret".into(),
            timeout: Some(Duration::from_secs(2)),
        };
        let os = cfg.build().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let put = rt.block_on(os.put(&ObjPath::from("t/k"), Bytes::from_static(b"bytes").into()));
        assert_eq!(put.unwrap().e_tag.as_deref(), Some("\"e1\""));
        // The unanswered PUT and at least one more, each the whole request.
        let seen: Vec<_> = seen.try_iter().collect();
        assert!(seen.len() >= 2, "{seen:?}");
        for (line, body) in &seen {
            assert_eq!((line.as_str(), &body[..]), ("PUT /b/t/k HTTP/1.1", &b"bytes"[..]));
        }
    }

    /// Against a real Garage: a PUT carrying the CRC of its body is stored; one carrying
    /// the CRC of other bytes is refused by the server, and nothing is stored; a part's CRC
    /// is taken as it leaves, and its upload completes.
    #[test]
    fn the_server_refuses_a_put_whose_crc_is_of_other_bytes() {
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
        let put = |key: &str, crc: u32| {
            let mut opts = PutOptions::default();
            opts.extensions.insert(PayloadCrc32(crc));
            rt.block_on(os.put_opts(&ObjPath::from(key), body.clone().into(), opts))
        };
        let get =
            |key: &str| rt.block_on(async { os.get(&ObjPath::from(key)).await?.bytes().await });
        put("t/right", crc(&body)).unwrap();
        assert_eq!(get("t/right").unwrap(), body);

        let mut other = body.to_vec();
        other[12345] ^= 1;
        let e = put("t/wrong", crc(&other)).unwrap_err();
        // The server's own reason: the body is not what its checksum says.
        assert!(e.to_string().contains("InvalidDigest"), "{e}");
        let gone = rt.block_on(os.head(&ObjPath::from("t/wrong")));
        assert!(matches!(gone, Err(object_store::Error::NotFound { .. })), "{gone:?}");
        // No CRC given: taken as the body leaves, and stored.
        rt.block_on(os.put(&ObjPath::from("t/plain"), body.clone().into())).unwrap();
        assert_eq!(get("t/plain").unwrap(), body);
        // Parts likewise, and the upload they make completes.
        let key = ObjPath::from("t/parts");
        let whole = rt.block_on(async {
            let id = os.create_multipart(&key).await?;
            let big = Bytes::from(vec![3u8; 5 << 20]);
            let p0 = os.put_part(&key, &id, 0, big.clone().into()).await?;
            let p1 = os.put_part(&key, &id, 1, body.clone().into()).await?;
            os.complete_multipart(&key, &id, vec![p0, p1]).await?;
            Ok::<_, object_store::Error>([big, body.clone()].concat())
        });
        assert_eq!(get("t/parts").unwrap(), whole.unwrap());
    }
}
