//! One way to serve, and to reach, a plane that is an axum router — gRPC services (tonic's
//! `Routes`), plain HTTP routes such as `/metrics`, or both on one port — in the clear or over
//! TLS, optionally behind a bearer token. The block store's master and the distributer's
//! status service use it, so every plane offers TLS and a token as the control plane does
//! (without the control plane's per-address limit on wrong tokens: a long random token is
//! what keeps guessers out here).
//!
//! With a token, every request must carry `authorization: Bearer <token>` (compared in
//! constant time). A gRPC request without it is answered with status UNAUTHENTICATED, an
//! HTTP request with 401 and `WWW-Authenticate: Bearer`.

mod deadline;

pub use deadline::grpc_deadlines;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bs_transport::{TlsClient, TlsServer};
use subtle::ConstantTimeEq;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// How a plane is served.
#[derive(Clone, Default)]
pub struct Secure {
    /// Serve TLS with this certificate and key (clients then need the CA).
    pub tls: Option<TlsServer>,
    /// Require `authorization: Bearer <token>` on every request (the admin token, if any,
    /// is taken too).
    pub token: Option<String>,
    /// Require this token instead on the requests to `admin_paths` (the calls that change
    /// what the plane serves); every other request takes it as well as `token`.
    pub admin_token: Option<String>,
    /// The paths (gRPC methods: `/package.Service/Method`) only the admin token opens, when
    /// there is one.
    pub admin_paths: &'static [&'static str],
}

impl Secure {
    /// What the plane offers, for the line a server prints when it starts.
    pub fn describe(&self) -> &'static str {
        match (&self.tls, &self.token, &self.admin_token) {
            (Some(_), Some(_), Some(_)) => "TLS, token required, admin token for changes",
            (Some(_), None, Some(_)) => "TLS, admin token for changes",
            (Some(_), Some(_), None) => "TLS, token required",
            (Some(_), None, None) => "TLS, no token",
            (None, Some(_), Some(_)) => "plain TCP, token required, admin token for changes",
            (None, None, Some(_)) => "plain TCP, admin token for changes",
            (None, Some(_), None) => "plain TCP, token required",
            (None, None, None) => "plain TCP, no token",
        }
    }
}

/// How a client reaches a plane: TLS trusting a CA, and the token to present.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    pub tls: Option<TlsClient>,
    pub token: Option<String>,
}

/// Serve `router` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    secure: Secure,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = if secure.token.is_none() && secure.admin_token.is_none() {
        router
    } else {
        let bearer = |t: &Option<String>| -> Option<Arc<[u8]>> {
            t.as_ref().map(|t| format!("Bearer {t}").into_bytes().into())
        };
        let (token, admin) = (bearer(&secure.token), bearer(&secure.admin_token));
        let admin_paths = secure.admin_paths;
        router.layer(axum::middleware::from_fn(move |req: Request, next: Next| {
            let for_admin = admin.is_some() && admin_paths.contains(&req.uri().path());
            // What opens this request: the admin token alone for a change, else either.
            let keys: Vec<Arc<[u8]>> = if for_admin {
                admin.iter().cloned().collect()
            } else {
                token.iter().chain(admin.iter().filter(|_| token.is_some())).cloned().collect()
            };
            async move {
                if keys.is_empty() {
                    return next.run(req).await;
                }
                authorized(&keys, for_admin, req, next).await
            }
        }))
    };
    let tls = secure.tls.as_ref().map(grpc_tls);
    serve_http(listener, grpc_deadlines(router), tls, shutdown, HttpLimits::default()).await;
    Ok(())
}

/// `tls` for a plane that serves gRPC: gRPC clients insist on HTTP/2 being agreed in the
/// handshake (ALPN).
pub fn grpc_tls(tls: &TlsServer) -> Arc<rustls::ServerConfig> {
    let mut config = (*tls.config()).clone();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

async fn authorized(keys: &[Arc<[u8]>], for_admin: bool, req: Request, next: Next) -> Response {
    let given = req.headers().get(axum::http::header::AUTHORIZATION);
    // Every key compared, in constant time each.
    let matches =
        given.map_or(0u8, |v| keys.iter().fold(0u8, |m, k| m | v.as_bytes().ct_eq(k).unwrap_u8()));
    if matches == 1 {
        return next.run(req).await;
    }
    let why = match (given.is_some(), for_admin) {
        (true, false) => "wrong token",
        (true, true) => "this call changes what the plane serves: it needs the admin token",
        (false, false) => "this plane requires a token",
        (false, true) => "this call needs the admin token",
    };
    let grpc = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|c| c.as_bytes().starts_with(b"application/grpc"));
    if grpc {
        tonic::Status::unauthenticated(why).into_http::<axum::body::Body>()
    } else {
        (
            axum::http::StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
            format!("{why}\n"),
        )
            .into_response()
    }
}

/// What every HTTP plane holds each client to, so that none holds more than its share: a
/// connection must send a request's headers within `header_timeout` (and an idle keep-alive
/// connection is closed after as long: a client trickling a header a byte at a time, or
/// opening connections and saying nothing, holds them no longer), and at most
/// `max_connections` are open at once (the next ones wait in the kernel's backlog until one
/// closes, rather than the process running out of descriptors for everyone), of which one
/// address holds at most `per_address` (its next ones are closed at once: one client cannot
/// take every place). An HTTP/2 connection is pinged when idle and closed when its peer stops
/// answering, so a peer that vanished holds no place either.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub per_address: usize,
}

/// How often an idle HTTP/2 connection is pinged, and how long its answer may take.
const H2_PING: Duration = Duration::from_secs(30);
const H2_PING_WAIT: Duration = Duration::from_secs(20);

/// Connections open per peer address, each counted while its guard lives.
#[derive(Default)]
struct PerAddress(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

struct AddressPlace(Arc<PerAddress>, std::net::IpAddr);

impl PerAddress {
    fn take(self: &Arc<Self>, ip: std::net::IpAddr, most: usize) -> Option<AddressPlace> {
        let mut m = self.0.lock().unwrap();
        let n = m.entry(ip).or_default();
        if *n >= most {
            return None;
        }
        *n += 1;
        Some(AddressPlace(self.clone(), ip))
    }
}

impl Drop for AddressPlace {
    fn drop(&mut self) {
        let mut m = (self.0).0.lock().unwrap();
        if let Some(n) = m.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self { max_connections: 1024, header_timeout: Duration::from_secs(30), per_address: 256 }
    }
}

/// Serve `app` on `listener` — HTTP/1.1 or HTTP/2, in TLS when `tls` is given (handshake
/// within 10 s; HTTP/2 as its ALPN allows) — within `limits`, until `shutdown` completes;
/// then every connection is asked to finish the requests it has and close, and this returns
/// once they have (as `axum::serve`'s graceful shutdown does). Each request carries the peer
/// address (`ConnectInfo`). Written here rather than with `axum::serve`, which takes no
/// header timeout and no connection limit.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: HttpLimits,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let open = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let per_address = Arc::new(PerAddress::default());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // Told to connections still waiting for their first bytes (or their TLS handshake): they
    // hold a place in `graceful`, which would otherwise wait out their timeout.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = open.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = &mut shutdown => break,
        };
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, say: pause rather than spin (as `axum::serve` does).
                    tracing::warn!("HTTP accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Some(place) = per_address.take(peer.ip(), limits.per_address.max(1)) else {
            tracing::debug!(%peer, "connection closed: its address holds its share already");
            drop(permit);
            continue;
        };
        // Nagle's algorithm off: a response written as headers, then body (or a gRPC answer's
        // headers, data and trailers) would wait on the client's delayed ACK.
        let _ = tcp.set_nodelay(true);
        let (acceptor, app, watcher) = (acceptor.clone(), app.clone(), graceful.watcher());
        let mut stopping = stopping.clone();
        let local = tcp.local_addr().ok();
        tokio::spawn(async move {
            let _open = (permit, place);
            // The peer address goes with each request (failed logins count per address), as
            // axum's `ConnectInfo` and as tonic's (`Request::remote_addr`, `local_addr`).
            let app = tower::ServiceExt::map_request(
                app,
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                    req.extensions_mut().insert(tonic::transport::server::TcpConnectInfo {
                        local_addr: local,
                        remote_addr: Some(peer),
                    });
                    req
                },
            );
            let svc = hyper_util::service::TowerToHyperService::new(app);
            let mut builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            builder
                .http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                // A client that shuts down its sending side once its request is out (`nc -N`,
                // some scripts) still gets the answer: the write may have committed.
                .half_close(true);
            builder
                .http2()
                .timer(hyper_util::rt::TokioTimer::new())
                .keep_alive_interval(H2_PING)
                .keep_alive_timeout(H2_PING_WAIT);
            let done = match acceptor {
                None => {
                    // The first bytes, too, within the header timeout: hyper's starts only
                    // once it knows the protocol, and it waits for a byte to tell.
                    // (A peek: readiness alone may be reported before any byte is there.)
                    // A connection that has sent nothing when the server stops is closed.
                    let mut byte = [0u8; 1];
                    let first = tokio::time::timeout(limits.header_timeout, tcp.peek(&mut byte));
                    tokio::select! {
                        first = first => {
                            let Ok(Ok(1..)) = first else { return };
                        }
                        _ = stopping.wait_for(|s| *s) => return,
                    }
                    let io = hyper_util::rt::TokioIo::new(tcp);
                    watcher.watch(builder.serve_connection(io, svc).into_owned()).await
                }
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp));
                    let stream = tokio::select! {
                        handshake = handshake => {
                            let Ok(Ok(stream)) = handshake else { return };
                            stream
                        }
                        _ = stopping.wait_for(|s| *s) => return,
                    };
                    let io = hyper_util::rt::TokioIo::new(stream);
                    watcher.watch(builder.serve_connection(io, svc).into_owned()).await
                }
            };
            if let Err(e) = done {
                tracing::debug!(%peer, "HTTP connection: {e}");
            }
        });
    }
    let _ = stop.send(true);
    graceful.shutdown().await;
}

/// Adds the bearer token to every call of a gRPC client.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Bearer {
    /// `authorization: Bearer <token>` on every call, or nothing without a token.
    pub fn new(token: Option<&str>) -> Result<Self, ConnectError> {
        let value = token
            .map(|t| format!("Bearer {t}").parse())
            .transpose()
            .map_err(|_| ConnectError("the token is not valid header text".into()))?;
        Ok(Self(value))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A failed call's message for a user: a plain client meeting a TLS plane sees only an HTTP/2
/// protocol error, a transport error or a cancelled call (which of them depends on when the
/// server's TLS layer hangs up), so it is told what that likely means.
pub fn explain(addr: &str, creds: &Credentials, status: &tonic::Status) -> String {
    let msg = status.message();
    let broken = matches!(
        status.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::Internal
            | tonic::Code::Cancelled
    );
    if creds.tls.is_none() && broken {
        return format!(
            "{addr} did not answer as a plain gRPC service ({msg}); if it speaks TLS, trust its \
             certificate's CA"
        );
    }
    msg.to_string()
}

/// Why a plane could not be reached.
#[derive(Debug)]
pub struct ConnectError(pub String);

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectError {}

/// A gRPC endpoint at `uri` (10 s to connect, no Nagle delay), speaking TLS that trusts `tls`
/// (and checks its domain, if it names one) when given.
pub fn endpoint(uri: String, tls: Option<&TlsClient>) -> Result<Endpoint, ConnectError> {
    let mut endpoint = Endpoint::from_shared(uri)
        .map_err(|e| ConnectError(e.to_string()))?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        let mut cfg = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(tls.ca_pem()));
        if let Some(d) = tls.domain() {
            cfg = cfg.domain_name(d);
        }
        endpoint = endpoint.tls_config(cfg).map_err(|e| ConnectError(format!("TLS: {e}")))?;
    }
    Ok(endpoint)
}

/// The innermost cause of an error ("Connection refused", "invalid peer certificate: …"):
/// the part that says what happened.
pub fn root_cause<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> &'a (dyn std::error::Error + 'static) {
    let mut cause = e;
    while let Some(s) = cause.source() {
        cause = s;
    }
    cause
}

/// A gRPC channel to the plane at `addr` (host:port) with `creds`, and the interceptor that
/// presents its token. A refused TLS handshake or connection is one line saying which.
pub async fn connect(addr: &str, creds: &Credentials) -> Result<(Channel, Bearer), ConnectError> {
    let scheme = if creds.tls.is_some() { "https" } else { "http" };
    let endpoint = endpoint(format!("{scheme}://{addr}"), creds.tls.as_ref())
        .map_err(|e| ConnectError(format!("{addr}: {e}")))?;
    let bearer = Bearer::new(creds.token.as_deref())?;
    let channel = endpoint.connect().await.map_err(|e| {
        let tls = if creds.tls.is_some() { " over TLS" } else { "" };
        ConnectError(format!("cannot reach {addr}{tls}: {}", root_cause(&e)))
    })?;
    Ok((channel, bearer))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::SocketAddr;

    use super::*;

    /// A router answering only `/metrics`, with an empty OpenMetrics page.
    fn metrics_only() -> Router {
        Router::new().route("/metrics", axum::routing::get(|| async { "# EOF\n" }))
    }

    fn get(addr: SocketAddr, auth: Option<&str>) -> String {
        get_path(addr, "/metrics", auth)
    }

    /// The whole answer to a GET of `path` with `auth` as its authorization header, if any.
    fn get_path(addr: SocketAddr, path: &str, auth: Option<&str>) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let auth = auth.map(|a| format!("authorization: {a}\r\n")).unwrap_or_default();
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n{auth}connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn http_routes_need_the_token_when_one_is_set() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let router = metrics_only();
        let secure = Secure { tls: None, token: Some("t0k".into()), ..Secure::default() };
        assert_eq!(secure.describe(), "plain TCP, token required");
        rt.spawn(serve(listener, router, secure, std::future::pending()));
        let page = get(addr, None);
        assert!(page.starts_with("HTTP/1.1 401"), "{page}");
        assert!(page.to_ascii_lowercase().contains("www-authenticate: bearer"), "{page}");
        assert!(page.contains("requires a token"), "{page}");
        assert!(get(addr, Some("Bearer nope")).starts_with("HTTP/1.1 401"));
        let page = get(addr, Some("Bearer t0k"));
        assert!(page.starts_with("HTTP/1.1 200") && page.ends_with("# EOF\n"), "{page}");
    }

    #[test]
    fn calls_that_change_things_need_the_admin_token_when_there_is_one() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let ok = || async { "# EOF\n" };
        let router = || {
            Router::new()
                .route("/metrics", axum::routing::get(ok))
                .route("/drop", axum::routing::get(ok))
        };
        let status = |addr, path: &str, auth: Option<&str>| {
            get_path(addr, path, auth.map(|a| format!("Bearer {a}")).as_deref())[9..12].to_string()
        };
        let start = |secure: Secure| {
            let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
            let addr = listener.local_addr().unwrap();
            rt.spawn(serve(listener, router(), secure, std::future::pending()));
            addr
        };
        // Both tokens: reading takes either, a change only the admin's.
        let both = start(Secure {
            token: Some("reader".into()),
            admin_token: Some("admin".into()),
            admin_paths: &["/drop"],
            ..Secure::default()
        });
        assert_eq!(status(both, "/metrics", Some("reader")), "200");
        assert_eq!(status(both, "/metrics", Some("admin")), "200");
        assert_eq!(status(both, "/metrics", None), "401");
        assert_eq!(status(both, "/drop", Some("reader")), "401");
        assert_eq!(status(both, "/drop", None), "401");
        assert_eq!(status(both, "/drop", Some("admin")), "200");
        // An admin token alone: reading is open, a change is not.
        let admin_only = start(Secure {
            admin_token: Some("admin".into()),
            admin_paths: &["/drop"],
            ..Secure::default()
        });
        assert_eq!(status(admin_only, "/metrics", None), "200");
        assert_eq!(status(admin_only, "/drop", None), "401");
        assert_eq!(status(admin_only, "/drop", Some("admin")), "200");
    }

    #[test]
    fn one_address_holds_at_most_its_share_of_the_connections() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let router = metrics_only();
        let limits = HttpLimits { max_connections: 8, per_address: 2, ..HttpLimits::default() };
        rt.spawn(serve_http(listener, router, None, std::future::pending(), limits));
        // Two silent connections from 127.0.0.1 take its share...
        let held: Vec<_> = (0..2).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        // ...so a third from it is closed at once, unanswered (however long it waits).
        let mut third = std::net::TcpStream::connect(addr).unwrap();
        third.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let _ = third.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n");
        let mut buf = [0u8; 64];
        assert_eq!(third.read(&mut buf).unwrap_or(0), 0, "closed without an answer");
        // Another address is served, and so is this one once a place is given back.
        let from = |ip: &str| {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.bind(std::net::SocketAddr::new(ip.parse().unwrap(), 0)).unwrap();
            let s = rt.block_on(s.connect(addr)).unwrap().into_std().unwrap();
            s.set_nonblocking(false).unwrap();
            s
        };
        // (A connection closed at once may be reset under the request: an empty answer.)
        let ask = |mut s: std::net::TcpStream| {
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        };
        assert!(ask(from("127.0.0.2")).starts_with("HTTP/1.1 200"));
        drop(held);
        let until = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let page = ask(std::net::TcpStream::connect(addr).unwrap());
            if page.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(std::time::Instant::now() < until, "never served again: {page:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stopping waits for requests in flight, not for a connection that never sent a byte
    /// (a client's pool may open one it does not use): that one is closed, and the server
    /// is done long before its first bytes would have been due.
    #[test]
    fn stopping_does_not_wait_for_a_connection_that_sent_nothing() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let limits =
            HttpLimits { header_timeout: Duration::from_secs(3600), ..HttpLimits::default() };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = rt.spawn(serve_http(
            listener,
            metrics_only(),
            None,
            async move {
                let _ = stopped.await;
            },
            limits,
        ));
        assert!(get(addr, None).starts_with("HTTP/1.1 200"));
        let mut silent = std::net::TcpStream::connect(addr).unwrap();
        // Accepted (a request after it is answered: the server took it in before).
        assert!(get(addr, None).starts_with("HTTP/1.1 200"));
        stop.send(()).unwrap();
        // Bounded only so that a hang fails the test instead of stalling it for an hour.
        let done =
            rt.block_on(async { tokio::time::timeout(Duration::from_secs(60), server).await });
        assert!(done.is_ok(), "the server waited for the silent connection");
        silent.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(silent.read(&mut buf).unwrap_or(0), 0, "closed, unanswered");
    }

    #[test]
    fn a_plain_client_failing_on_a_tls_plane_is_told_why() {
        let plain = Credentials::default();
        let e = explain("h:1", &plain, &tonic::Status::unavailable("transport error"));
        assert!(e.contains("if it speaks TLS"), "{e}");
        let e = explain("h:1", &plain, &tonic::Status::cancelled("operation was canceled"));
        assert!(e.contains("if it speaks TLS"), "{e}");
        let e = explain("h:1", &plain, &tonic::Status::unauthenticated("wrong token"));
        assert_eq!(e, "wrong token");
    }
}
