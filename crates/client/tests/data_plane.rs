//! The control and data planes end to end, against a real server on port 0: round trips over
//! both stores, and every kind of bad input the data plane must survive.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use bs_client::{Client, ClientError, RouteRequest, TransferSettings};
use bs_server::{BackgroundServer, ServerConfig};
use bs_store::{FaultyStore, FsStore, MemStore, Store};
use bs_transport::TransportError;
use bs_wire::{DigestAlgo, ErrorCode, Frame, FrameKind, Header, TOKEN_LEN};

fn server_with(store: Arc<dyn Store>, cfg: ServerConfig) -> (BackgroundServer, Client) {
    let s = BackgroundServer::start(store, cfg).unwrap();
    let c = Client::connect(&s.control_addr().to_string()).unwrap();
    (s, c)
}

fn server() -> (BackgroundServer, Client) {
    server_with(Arc::new(MemStore::new()), ServerConfig::ephemeral())
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0]).collect()
}

fn route(size: u64) -> Option<RouteRequest> {
    Some(RouteRequest {
        size: Some(size),
        content_type: "application/octet-stream".into(),
        ..Default::default()
    })
}

fn push(c: &Client, name: &str, bytes: &[u8]) -> bs_client::PushAck {
    let mut p = c.open_push(name, 0, Some(bytes.len() as u64), route(bytes.len() as u64)).unwrap();
    p.write(bytes).unwrap();
    p.finish(true).unwrap()
}

fn pull(c: &Client, name: &str, offset: u64, len: Option<u64>) -> Vec<u8> {
    let mut p = c.open_pull(name, offset, len).unwrap();
    let mut out = vec![0u8; p.len() as usize];
    p.read_exact_to_end(&mut out).unwrap();
    out
}

fn roundtrip(store: Arc<dyn Store>) {
    let (_s, c) = server_with(store, ServerConfig::ephemeral());
    let bytes = data(3_000_000);
    let ack = push(&c, "dir/blob", &bytes);
    assert_eq!(ack.received, 3_000_000);
    assert_eq!(ack.committed, Some(DigestAlgo::Xxh3_128.digest(&bytes)));
    assert_eq!(pull(&c, "dir/blob", 0, None), bytes);
    assert_eq!(pull(&c, "dir/blob", 1234, Some(5000)), &bytes[1234..6234]);
    assert_eq!(pull(&c, "dir/blob", 3_000_000, None), b"");
    let info = c.stat("dir/blob").unwrap();
    assert_eq!((info.size, info.digest.clone()), (3_000_000, ack.committed.unwrap().to_string()));
    assert_eq!(c.list("dir/").unwrap().len(), 1);
    c.delete("dir/blob").unwrap();
    assert!(matches!(c.stat("dir/blob"), Err(ClientError::NotFound(_))));
}

#[test]
fn roundtrip_memory_store() {
    roundtrip(Arc::new(MemStore::new()));
}

#[test]
fn roundtrip_fs_store() {
    let dir = tempfile::tempdir().unwrap();
    roundtrip(Arc::new(FsStore::open(dir.path()).unwrap()));
}

#[test]
fn blake3_and_socket_buffers_can_be_negotiated() {
    let (_s, c) = server();
    let c = c.with_settings(TransferSettings {
        digests: vec![DigestAlgo::Blake3],
        socket_buffer: 1 << 20,
        chunk_size: 128 << 10,
        ..Default::default()
    });
    let bytes = data(500_000);
    push(&c, "b3", &bytes);
    assert_eq!(pull(&c, "b3", 10, None), &bytes[10..]);
}

#[test]
fn unknown_keys_and_path_tricks_get_precise_errors() {
    let (_s, c) = server();
    assert!(matches!(c.stat("missing"), Err(ClientError::NotFound(m)) if m.contains("missing")));
    assert!(matches!(c.open_pull("missing", 0, None), Err(ClientError::NotFound(_))));
    assert!(matches!(c.delete("missing"), Err(ClientError::NotFound(_))));
    for bad in ["../etc/passwd", "/abs", "a\0b", &"x".repeat(5000)] {
        let e = c.open_push(bad, 0, None, route(1)).unwrap_err();
        assert!(
            matches!(&e, ClientError::InvalidArgument(m) if m.contains("invalid blob name")),
            "{bad:?}: {e}"
        );
        assert!(matches!(c.stat(bad), Err(ClientError::InvalidArgument(_))));
    }
    push(&c, "x", b"1");
    assert!(matches!(c.open_pull("x", 5, None), Err(ClientError::InvalidArgument(_))));
    assert!(matches!(c.open_push("x", 0, None, route(1)), Err(ClientError::AlreadyExists(_))));
}

/// Speak the data plane by hand: connect and send raw bytes, read the server's answer (past
/// the ACK that admits a push).
fn raw(s: &BackgroundServer, bytes: &[u8]) -> Frame {
    let mut t = TcpStream::connect(s.data_addr()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    t.write_all(bytes).unwrap();
    let mut conn = bs_transport::Conn::new(t);
    match conn.read_frame().unwrap() {
        Frame::Ack { committed: None, .. } => conn.read_frame().unwrap(),
        f => f,
    }
}

fn error_code(f: Frame) -> ErrorCode {
    match f {
        Frame::Error { code, .. } => code,
        other => panic!("expected ERROR, got {other:?}"),
    }
}

#[test]
fn wrong_tokens_absurd_frames_and_garbage_are_refused_and_others_are_served() {
    let (s, c) = server();
    push(&c, "ok", b"still served");
    assert_eq!(
        error_code(raw(&s, &Frame::Hello { token: [9; TOKEN_LEN] }.encode())),
        ErrorCode::BadToken
    );
    let absurd = Header { kind: FrameKind::Hello, body_len: u32::MAX, a: 0, b: 0 }.encode();
    assert_eq!(error_code(raw(&s, &absurd)), ErrorCode::BadFrame);
    assert_eq!(error_code(raw(&s, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")), ErrorCode::BadFrame);
    assert_eq!(
        error_code(raw(&s, &Frame::Data { offset: 0, len: 1 << 60 }.encode())),
        ErrorCode::BadFrame
    );
    // A client that connects and says nothing does not block anyone.
    let _idle = TcpStream::connect(s.data_addr()).unwrap();
    assert_eq!(pull(&c, "ok", 0, None), b"still served");
}

/// Negotiate with the generated gRPC client directly, to get hold of a raw token.
fn raw_token(s: &BackgroundServer, name: &str, direction: bs_proto::Direction) -> [u8; TOKEN_LEN] {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = format!("http://{}", s.control_addr());
        let mut g = bs_proto::blob_store_client::BlobStoreClient::connect(url).await.unwrap();
        let req = bs_proto::NegotiateRequest {
            name: name.into(),
            direction: direction as i32,
            ..Default::default()
        };
        g.negotiate(req).await.unwrap().into_inner().token.try_into().unwrap()
    })
}

#[test]
fn tokens_are_one_time() {
    let (s, c) = server();
    push(&c, "t", b"abc");
    let token = raw_token(&s, "t", bs_proto::Direction::Pull);
    assert!(matches!(raw(&s, &Frame::Hello { token }.encode()), Frame::Data { offset: 0, len: 3 }));
    assert_eq!(error_code(raw(&s, &Frame::Hello { token }.encode())), ErrorCode::TokenReused);
}

#[test]
fn expired_tokens_are_refused() {
    let cfg = ServerConfig { token_ttl: Duration::ZERO, ..ServerConfig::ephemeral() };
    let (_s, c) = server_with(Arc::new(MemStore::new()), cfg);
    let e = c.open_push("late", 0, None, route(1)).and_then(|mut p| {
        p.write(b"x")?;
        p.finish(true)
    });
    assert!(
        matches!(
            e,
            Err(ClientError::Transfer(TransportError::Remote {
                code: ErrorCode::TokenExpired,
                ..
            }))
        ),
        "{e:?}"
    );
}

#[test]
fn truncated_upload_stays_invisible_and_resumes_after_checking_what_arrived() {
    let (_s, c) = server();
    let bytes = data(1_000_000);
    let rr = RouteRequest { size: Some(1_000_000), resume_tag: "v1".into(), ..Default::default() };
    let mut p = c.open_push("big", 0, None, Some(rr.clone())).unwrap();
    p.write(&bytes[..300_000]).unwrap();
    drop(p); // client vanishes before SUM
    assert!(matches!(c.stat("big"), Err(ClientError::NotFound(_))));
    // Resume: the server reports what it holds and its digest; we check it against our copy.
    let mut p = c.open_push("big", 300_000, None, Some(rr)).unwrap();
    let routed = p.routed().unwrap().clone();
    assert!(routed.resumed);
    assert_eq!(routed.received, 300_000);
    assert_eq!(routed.received_digest, DigestAlgo::Xxh3_128.digest(&bytes[..300_000]).to_string());
    p.write(&bytes[300_000..]).unwrap();
    let ack = p.finish(true).unwrap();
    assert_eq!(
        ack.committed,
        Some(DigestAlgo::Xxh3_128.digest(&bytes)),
        "whole-blob digest recomputed"
    );
    assert_eq!(pull(&c, "big", 0, None), bytes);
}

#[test]
fn a_client_vanishing_mid_payload_leaves_nothing_visible() {
    let (s, c) = server();
    c.route(RouteRequest {
        name: "cut".into(),
        size: Some(1_000_000),
        resume_tag: "t".into(),
        ..Default::default()
    })
    .unwrap();
    let token = raw_token(&s, "cut", bs_proto::Direction::Push);
    let mut t = TcpStream::connect(s.data_addr()).unwrap();
    t.write_all(&Frame::Hello { token }.encode()).unwrap();
    // Admitted: from here the server holds the upload until it has taken in what we send.
    let admitted = bs_transport::Conn::new(t.try_clone().unwrap()).read_frame().unwrap();
    assert!(matches!(admitted, Frame::Ack { received: 0, committed: None }), "{admitted:?}");
    t.write_all(&Frame::Data { offset: 0, len: 1_000_000 }.encode()).unwrap();
    t.write_all(&data(100_000)).unwrap();
    drop(t); // gone after 100 000 of 1 000 000 announced bytes
    assert!(matches!(c.stat("cut"), Err(ClientError::NotFound(_))));
    assert!(c.list("").unwrap().is_empty());
    // The bytes that did arrive are offered for resume, with their digest to check first.
    let r = c
        .route(RouteRequest {
            name: "cut".into(),
            size: Some(1_000_000),
            resume_tag: "t".into(),
            ..Default::default()
        })
        .unwrap();
    assert!(r.resumed);
    assert_eq!(r.received, 100_000);
    assert_eq!(r.received_digest, DigestAlgo::Xxh3_128.digest(&data(100_000)).to_string());
    // And the server keeps serving.
    push(&c, "after", b"fine");
    assert_eq!(pull(&c, "after", 0, None), b"fine");
}

#[test]
fn a_push_with_a_wrong_digest_is_rolled_back() {
    let (s, c) = server();
    c.route(RouteRequest { name: "bad".into(), size: Some(4), ..Default::default() }).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let token: [u8; TOKEN_LEN] = rt.block_on(async {
        let mut g = bs_proto::blob_store_client::BlobStoreClient::connect(format!(
            "http://{}",
            s.control_addr()
        ))
        .await
        .unwrap();
        let r = g
            .negotiate(bs_proto::NegotiateRequest {
                name: "bad".into(),
                direction: bs_proto::Direction::Push as i32,
                ..Default::default()
            })
            .await
            .unwrap();
        r.into_inner().token.try_into().unwrap()
    });
    let mut msg = Frame::Hello { token }.encode().to_vec();
    msg.extend_from_slice(&Frame::Data { offset: 0, len: 4 }.encode());
    msg.extend_from_slice(b"abcd");
    let wrong = DigestAlgo::Xxh3_128.digest(b"abcX");
    msg.extend_from_slice(&Frame::Sum { total: 4, final_: true, digest: wrong }.encode());
    assert_eq!(error_code(raw(&s, &msg)), ErrorCode::ChecksumMismatch);
    assert!(matches!(c.stat("bad"), Err(ClientError::NotFound(_))));
    // Nothing unverified stayed behind: the upload holds 0 bytes, so continuing at 4 is a gap.
    let e = c.open_push("bad", 4, None, None).and_then(|p| p.finish(true)).unwrap_err();
    assert!(
        matches!(&e, ClientError::Transfer(TransportError::Remote { code: ErrorCode::OutOfRange, message }) if message.contains("only 0 bytes")),
        "{e:?}"
    );
    let mut p = c.open_push("bad", 0, None, None).unwrap();
    p.write(b"abcd").unwrap();
    assert_eq!(p.finish(true).unwrap().received, 4);
}

#[test]
fn pushing_past_the_declared_size_is_out_of_range() {
    let (_s, c) = server();
    let mut p = c.open_push("small", 0, None, route(10)).unwrap();
    let e = p.write(&[0u8; 4 << 20]).and_then(|_| p.finish(true)).unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Transfer(TransportError::Remote { code: ErrorCode::OutOfRange, .. })
        ),
        "{e:?}"
    );
    assert!(matches!(c.stat("small"), Err(ClientError::NotFound(_))));
}

#[test]
fn a_full_disk_fails_the_push_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = FaultyStore::disk_full_after(FsStore::open(dir.path()).unwrap(), 1 << 20);
    let (_s, c) = server_with(Arc::new(store), ServerConfig::ephemeral());
    push(&c, "fits", &data(100_000));
    let bytes = data(3 << 20);
    let mut p = c.open_push("huge", 0, None, route(bytes.len() as u64)).unwrap();
    let e = p.write(&bytes).and_then(|_| p.finish(true)).unwrap_err();
    assert!(
        matches!(
            &e,
            ClientError::Transfer(TransportError::Remote { code: ErrorCode::StorageFull, .. })
        ),
        "{e:?}"
    );
    assert!(matches!(c.stat("huge"), Err(ClientError::NotFound(_))));
    assert_eq!(pull(&c, "fits", 0, None), data(100_000));
}

/// A TCP relay to the real data plane that forwards at most `cut` bytes (read per connection)
/// from the server, then drops both connections: the server "dies" mid-pull for the client.
fn cutting_proxy(l: TcpListener, target: std::net::SocketAddr, cut: Arc<AtomicUsize>) {
    thread::spawn(move || {
        for client in l.incoming() {
            let mut client = client.unwrap();
            let mut server = TcpStream::connect(target).unwrap();
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut s2);
            });
            let mut left = cut.load(Ordering::SeqCst);
            let mut buf = [0u8; 8192];
            while left > 0 {
                let n = match server.read(&mut buf[..left.min(8192)]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if client.write_all(&buf[..n]).is_err() {
                    break;
                }
                left -= n;
            }
            let _ = client.shutdown(std::net::Shutdown::Both);
            let _ = server.shutdown(std::net::Shutdown::Both);
        }
    });
}

#[test]
fn a_server_dying_mid_pull_is_reported_and_the_pull_resumes() {
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let advertised = proxy.local_addr().unwrap().to_string();
    // One transfer per connection, so the proxy's cut applies to the pull's own connection.
    let cfg = ServerConfig {
        advertise_data: Some(advertised),
        data_keepalive: Duration::ZERO,
        ..ServerConfig::ephemeral()
    };
    let (s, c) = server_with(Arc::new(MemStore::new()), cfg);
    let cut = Arc::new(AtomicUsize::new(usize::MAX));
    cutting_proxy(proxy, s.data_addr(), cut.clone());
    let bytes = data(2_000_000);
    push(&c, "v", &bytes);

    cut.store(24 + 100_000, Ordering::SeqCst); // header plus 100 000 payload bytes
    let mut p = c.open_pull("v", 0, None).unwrap();
    let mut out = vec![0u8; 2_000_000];
    let e = p.read_exact_to_end(&mut out).unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Transfer(TransportError::Truncated { expected: 2_000_000, got: 100_000 })
        ),
        "{e:?}"
    );
    // Resume from what arrived: the prefix checks out against the server's range digest.
    cut.store(usize::MAX, Ordering::SeqCst);
    let have = DigestAlgo::Xxh3_128.digest(&out[..100_000]);
    assert_eq!(c.range_digest("v", 0, 100_000, DigestAlgo::Xxh3_128).unwrap(), have);
    out[100_000..].copy_from_slice(&pull(&c, "v", 100_000, None));
    assert_eq!(out, bytes);
}

/// A TCP relay to the real data plane that counts the connections made through it.
fn counting_proxy(l: TcpListener, target: std::net::SocketAddr, count: Arc<AtomicUsize>) {
    thread::spawn(move || {
        for client in l.incoming() {
            count.fetch_add(1, Ordering::SeqCst);
            let client = client.unwrap();
            let server = TcpStream::connect(target).unwrap();
            for (mut from, mut to) in
                [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
            {
                thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
}

/// A server whose data connections are kept alive far longer than any pause between a
/// test's transfers on a loaded machine.
fn long_keepalive() -> ServerConfig {
    ServerConfig { data_keepalive: Duration::from_secs(120), ..ServerConfig::ephemeral() }
}

fn through_counting_proxy(cfg: ServerConfig) -> (BackgroundServer, Client, Arc<AtomicUsize>) {
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let advertised = proxy.local_addr().unwrap().to_string();
    let cfg = ServerConfig { advertise_data: Some(advertised), ..cfg };
    let (s, c) = server_with(Arc::new(MemStore::new()), cfg);
    let count = Arc::new(AtomicUsize::new(0));
    counting_proxy(proxy, s.data_addr(), count.clone());
    (s, c, count)
}

#[test]
fn back_to_back_transfers_share_one_data_connection() {
    let cfg = long_keepalive();
    let (_s, c, connections) = through_counting_proxy(cfg);
    for i in 0..5 {
        push(&c, &format!("k/{i}"), &data(1000 + i * 100_000));
    }
    for i in 0..5 {
        assert_eq!(pull(&c, &format!("k/{i}"), 0, None), data(1000 + i * 100_000));
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1, "ten transfers, one TCP connection");
    // A pull read only in part does not hand its connection on (the rest is still coming).
    let mut p = c.open_pull("k/4", 0, None).unwrap();
    p.read(&mut [0u8; 10]).unwrap();
    drop(p);
    assert_eq!(pull(&c, "k/3", 0, None), data(301_000));
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[test]
fn a_kept_alive_connection_the_server_closed_is_replaced_without_a_failure() {
    // The server announces keep-alive but keeps no connection waiting: each one the client
    // puts aside is closed under it, and the next transfer must still just work.
    let cfg = ServerConfig { max_idle_data_connections: 0, ..ServerConfig::ephemeral() };
    let (_s, c, connections) = through_counting_proxy(cfg);
    for i in 0..5 {
        push(&c, &format!("k/{i}"), &data(5000));
        assert_eq!(pull(&c, &format!("k/{i}"), 0, None), data(5000));
    }
    assert_eq!(connections.load(Ordering::SeqCst), 10);
}

#[test]
fn a_kept_alive_connection_still_needs_a_fresh_token_for_each_transfer() {
    let (s, c) = server();
    push(&c, "t", b"abc");
    let token = raw_token(&s, "t", bs_proto::Direction::Pull);
    let t = TcpStream::connect(s.data_addr()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut conn = bs_transport::Conn::new(t);
    let pull_on = |conn: &mut bs_transport::Conn, token| {
        conn.write_frame(&Frame::Hello { token }).unwrap();
        assert!(matches!(conn.read_frame().unwrap(), Frame::Data { offset: 0, len: 3 }));
        let mut body = [0u8; 3];
        conn.recv_data_into(&mut body, None).unwrap();
        assert_eq!(&body, b"abc");
        assert!(matches!(conn.read_frame().unwrap(), Frame::Sum { total: 3, .. }));
    };
    pull_on(&mut conn, token);
    // The same connection carries a second transfer with a token of its own...
    pull_on(&mut conn, raw_token(&s, "t", bs_proto::Direction::Pull));
    // ...but never one with a token already used, and nothing but a HELLO.
    conn.write_frame(&Frame::Hello { token }).unwrap();
    assert_eq!(error_code(conn.read_frame().unwrap()), ErrorCode::TokenReused);
    let t = TcpStream::connect(s.data_addr()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut conn = bs_transport::Conn::new(t);
    pull_on(&mut conn, raw_token(&s, "t", bs_proto::Direction::Pull));
    conn.write_frame(&Frame::Data { offset: 0, len: 1 }).unwrap();
    assert_eq!(error_code(conn.read_frame().unwrap()), ErrorCode::BadFrame);
    // A binding's token opens a connection of its own, never a kept-alive one.
    let t = TcpStream::connect(s.data_addr()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut conn = bs_transport::Conn::new(t);
    pull_on(&mut conn, raw_token(&s, "t", bs_proto::Direction::Pull));
    conn.write_frame(&Frame::Hello { token: bind_token(&s) }).unwrap();
    match conn.read_frame().unwrap() {
        Frame::Error { code: ErrorCode::BadFrame, message } => {
            assert!(message.contains("binding"), "{message}")
        }
        other => panic!("expected ERROR(BadFrame), got {other:?}"),
    }
}

/// An in-band request for `name` in `direction`, as a NEGOTIATE frame.
fn negotiate_frame(name: &str, direction: bs_proto::Direction) -> Frame {
    use prost::Message;
    let req = bs_proto::NegotiateRequest {
        name: name.into(),
        direction: direction as i32,
        ..Default::default()
    };
    Frame::Negotiate { body: req.encode_to_vec().into() }
}

#[test]
fn a_kept_alive_connection_takes_requests_in_band_and_stays_after_a_refusal() {
    use prost::Message;
    let (s, c) = server();
    push(&c, "t", b"abc");
    // A new connection must first present a token: no request before it.
    let e = raw(&s, &negotiate_frame("t", bs_proto::Direction::Pull).encode());
    match e {
        Frame::Error { code: ErrorCode::BadFrame, message } => {
            assert!(message.contains("kept alive"), "{message}")
        }
        other => panic!("expected ERROR(BadFrame), got {other:?}"),
    }
    let t = TcpStream::connect(s.data_addr()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut conn = bs_transport::Conn::new(t);
    let read_abc = |conn: &mut bs_transport::Conn| {
        assert!(matches!(conn.read_frame().unwrap(), Frame::Data { offset: 0, len: 3 }));
        let mut body = [0u8; 3];
        conn.recv_data_into(&mut body, None).unwrap();
        assert_eq!(&body, b"abc");
        assert!(matches!(conn.read_frame().unwrap(), Frame::Sum { total: 3, .. }));
    };
    conn.write_frame(&Frame::Hello { token: raw_token(&s, "t", bs_proto::Direction::Pull) })
        .unwrap();
    read_abc(&mut conn);
    // Then a request on the same connection is granted, with the answer the control plane
    // gives (but no token), and the stream follows.
    conn.write_frame(&negotiate_frame("t", bs_proto::Direction::Pull)).unwrap();
    match conn.read_frame().unwrap() {
        Frame::Grant { code: 0, body } => {
            let r = bs_proto::NegotiateResponse::decode(&body[..]).unwrap();
            assert_eq!((r.length, r.blob.unwrap().size), (3, 3));
            assert!(r.token.is_empty());
        }
        other => panic!("expected GRANT, got {other:?}"),
    }
    read_abc(&mut conn);
    // A refusal carries the status the control plane would give, and the connection waits
    // for the next request.
    conn.write_frame(&negotiate_frame("missing", bs_proto::Direction::Pull)).unwrap();
    match conn.read_frame().unwrap() {
        Frame::Grant { code, body } => {
            assert_eq!(tonic::Code::from(code as i32), tonic::Code::NotFound);
            assert!(String::from_utf8_lossy(&body).contains("missing"));
        }
        other => panic!("expected a refusing GRANT, got {other:?}"),
    }
    conn.write_frame(&negotiate_frame("t", bs_proto::Direction::Pull)).unwrap();
    assert!(matches!(conn.read_frame().unwrap(), Frame::Grant { code: 0, .. }));
    read_abc(&mut conn);
    // A body that is no request ends the connection with a reason.
    conn.write_frame(&Frame::Negotiate { body: bytes::Bytes::from_static(b"\xff\xff\xff") })
        .unwrap();
    assert_eq!(error_code(conn.read_frame().unwrap()), ErrorCode::BadFrame);
}

#[test]
fn the_client_negotiates_in_band_with_the_same_outcomes_as_the_control_plane() {
    let cfg = long_keepalive();
    let (s, _, connections) = through_counting_proxy(cfg);
    // The control plane through a proxy that counts what the client sends it.
    let control = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = Client::connect(&control.local_addr().unwrap().to_string()).unwrap();
    let asked = Arc::new(AtomicUsize::new(0));
    let (target, counter) = (s.control_addr(), asked.clone());
    thread::spawn(move || {
        for client in control.incoming() {
            let client = client.unwrap();
            let server = TcpStream::connect(target).unwrap();
            let (mut up, mut down) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            thread::spawn(move || {
                let _ = std::io::copy(&mut down, &mut up);
                let _ = up.shutdown(std::net::Shutdown::Write);
            });
            let (mut from, mut to, counter) = (client, server, counter.clone());
            thread::spawn(move || {
                let mut buf = [0u8; 16384];
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    counter.fetch_add(n, Ordering::SeqCst);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    // The first transfer negotiates through the control plane; the rest in band, on the same
    // connection — and every refusal is the same error either way.
    push(&c, "first", b"x");
    let control_bytes = asked.load(Ordering::SeqCst);
    for i in 0..20 {
        push(&c, &format!("k/{i}"), &data(1000 + i * 10_000));
        let again = c.open_push(&format!("k/{i}"), 0, None, route(10)).unwrap_err();
        assert!(matches!(again, ClientError::AlreadyExists(_)), "{again:?}");
        let missing = c.open_pull(&format!("none/{i}"), 0, None).unwrap_err();
        assert!(matches!(missing, ClientError::NotFound(_)), "{missing:?}");
        let past = c.open_pull(&format!("k/{i}"), 1 << 30, None).unwrap_err();
        assert!(matches!(past, ClientError::InvalidArgument(_)), "{past:?}");
    }
    for i in 0..20 {
        assert_eq!(pull(&c, &format!("k/{i}"), 0, None), data(1000 + i * 10_000));
    }
    assert_eq!(
        asked.load(Ordering::SeqCst),
        control_bytes,
        "no control-plane call after the first"
    );
    // A push resumed in band continues where it stopped.
    let tagged = |size| RouteRequest {
        name: "resumed".into(),
        size: Some(size),
        resume_tag: "r1".into(),
        ..Default::default()
    };
    let mut p = c.open_push("resumed", 0, None, Some(tagged(6))).unwrap();
    p.write(b"abc").unwrap();
    p.finish(false).unwrap();
    let routed = c.route(tagged(6)).unwrap();
    assert_eq!(routed.received, 3);
    let mut p = c.open_push("resumed", 3, None, None).unwrap();
    p.write(b"def").unwrap();
    p.finish(true).unwrap();
    assert_eq!(pull(&c, "resumed", 0, None), b"abcdef");
    assert_eq!(connections.load(Ordering::SeqCst), 1, "every transfer on one connection");
}

/// A pipelined in-band push of `bytes` into `name` announcing `length`: the request, DATA
/// and the final SUM, in one write (the SUM's digest as given, else of `bytes` in the default
/// algorithm).
fn pipelined_push(
    conn: &mut bs_transport::Conn,
    name: &str,
    length: u64,
    bytes: &[u8],
    digest: Option<bs_wire::Digest>,
) {
    use prost::Message;
    let req = bs_proto::NegotiateRequest {
        name: name.into(),
        direction: bs_proto::Direction::Push as i32,
        length: Some(length),
        route: route(length),
        pipelined: true,
        ..Default::default()
    };
    let digest = digest.unwrap_or_else(|| DigestAlgo::default().digest(bytes));
    let frames = [
        Frame::Negotiate { body: req.encode_to_vec().into() }.encode(),
        Frame::Data { offset: 0, len: bytes.len() as u64 }.encode(),
        bytes::Bytes::copy_from_slice(bytes),
        Frame::Sum { total: bytes.len() as u64, final_: true, digest }.encode(),
    ];
    conn.write_slices(&frames.iter().map(|f| &f[..]).collect::<Vec<_>>()).unwrap();
}

/// The status code of a refusing GRANT.
fn refused(f: Frame) -> (tonic::Code, String) {
    match f {
        Frame::Grant { code, body } if code != 0 => {
            (tonic::Code::from(code as i32), String::from_utf8_lossy(&body).into_owned())
        }
        other => panic!("expected a refusing GRANT, got {other:?}"),
    }
}

#[test]
fn a_pipelined_push_is_one_write_and_a_refused_one_is_read_past() {
    let (s, c) = server();
    push(&c, "t", b"abc");
    let t = TcpStream::connect(s.data_addr()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut conn = bs_transport::Conn::new(t);
    conn.write_frame(&Frame::Hello { token: raw_token(&s, "t", bs_proto::Direction::Pull) })
        .unwrap();
    let pull_t = |conn: &mut bs_transport::Conn| {
        conn.write_frame(&negotiate_frame("t", bs_proto::Direction::Pull)).unwrap();
        assert!(matches!(conn.read_frame().unwrap(), Frame::Grant { code: 0, .. }));
        assert!(matches!(conn.read_frame().unwrap(), Frame::Data { offset: 0, len: 3 }));
        let mut body = [0u8; 3];
        conn.recv_data_into(&mut body, None).unwrap();
        assert_eq!(&body, b"abc");
        assert!(matches!(conn.read_frame().unwrap(), Frame::Sum { total: 3, .. }));
    };
    assert!(matches!(conn.read_frame().unwrap(), Frame::Data { .. }));
    conn.recv_data_into(&mut [0u8; 3], None).unwrap();
    assert!(matches!(conn.read_frame().unwrap(), Frame::Sum { .. }));

    // Request, bytes and commit in one write: granted, admitted and committed.
    let bytes = data(70_000);
    pipelined_push(&mut conn, "p/1", 70_000, &bytes, None);
    assert!(matches!(conn.read_frame().unwrap(), Frame::Grant { code: 0, .. }));
    assert!(matches!(conn.read_frame().unwrap(), Frame::Ack { committed: None, .. }));
    match conn.read_frame().unwrap() {
        Frame::Ack { received: 70_000, committed: Some(d) } => {
            assert_eq!(d, DigestAlgo::default().digest(&bytes))
        }
        other => panic!("expected the commit ACK, got {other:?}"),
    }
    assert_eq!(pull(&c, "p/1", 0, None), bytes);

    // Refused (it exists; too long to pipeline): the bytes that followed are read past, and
    // the connection takes the next request.
    pipelined_push(&mut conn, "p/1", 70_000, &bytes, None);
    let (code, why) = refused(conn.read_frame().unwrap());
    assert_eq!(code, tonic::Code::AlreadyExists, "{why}");
    pull_t(&mut conn);
    pipelined_push(&mut conn, "p/big", 2 << 20, &bytes, None);
    let (code, why) = refused(conn.read_frame().unwrap());
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert!(why.contains("pipelined"), "{why}");
    pull_t(&mut conn);

    // A digest algorithm the server would not check the SUM in (it takes the first it
    // knows): refused before a byte is stored.
    let req = bs_proto::NegotiateRequest {
        name: "p/md5".into(),
        direction: bs_proto::Direction::Push as i32,
        length: Some(3),
        route: route(3),
        digests: vec!["md5".into(), "blake3".into()],
        pipelined: true,
        ..Default::default()
    };
    let frames = [
        Frame::Negotiate { body: prost::Message::encode_to_vec(&req).into() }.encode(),
        Frame::Data { offset: 0, len: 3 }.encode(),
        bytes::Bytes::from_static(b"abc"),
        Frame::Sum { total: 3, final_: true, digest: DigestAlgo::Blake3.digest(b"abc") }.encode(),
    ];
    conn.write_slices(&frames.iter().map(|f| &f[..]).collect::<Vec<_>>()).unwrap();
    assert_eq!(refused(conn.read_frame().unwrap()).0, tonic::Code::FailedPrecondition);
    pull_t(&mut conn);
    assert!(matches!(c.stat("p/md5"), Err(ClientError::NotFound(_))));

    // A wrong digest: the push fails and nothing becomes visible.
    let wrong = DigestAlgo::default().digest(b"something else");
    pipelined_push(&mut conn, "p/2", 70_000, &bytes, Some(wrong));
    assert!(matches!(conn.read_frame().unwrap(), Frame::Grant { code: 0, .. }));
    assert!(matches!(conn.read_frame().unwrap(), Frame::Ack { committed: None, .. }));
    assert_eq!(error_code(conn.read_frame().unwrap()), ErrorCode::ChecksumMismatch);
    assert!(matches!(c.stat("p/2"), Err(ClientError::NotFound(_))));

    // A refused push that sends more than a pipelined push may is cut off.
    let mut conn = kept_alive(&s);
    use prost::Message;
    let req = bs_proto::NegotiateRequest {
        name: "p/1".into(),
        direction: bs_proto::Direction::Push as i32,
        length: Some(10),
        route: route(10),
        pipelined: true,
        ..Default::default()
    };
    conn.write_frame(&Frame::Negotiate { body: req.encode_to_vec().into() }).unwrap();
    conn.write_frame(&Frame::Data { offset: 0, len: 3 << 20 }).unwrap();
    match conn.read_frame().unwrap() {
        Frame::Error { code: ErrorCode::BadFrame, message } => {
            assert!(message.contains("more than it may"), "{message}")
        }
        other => panic!("expected ERROR(BadFrame), got {other:?}"),
    }
}

#[test]
fn a_refused_pipelined_push_that_stalls_is_cut_off_and_holds_no_slot() {
    let cfg = ServerConfig {
        hello_timeout: Duration::from_millis(300),
        max_connections: 1,
        ..ServerConfig::ephemeral()
    };
    let (s, c) = server_with(Arc::new(MemStore::new()), cfg);
    push(&c, "t", b"abc");
    let mut conn = kept_alive(&s);
    // Refused (it exists), announcing a megabyte that never comes.
    use prost::Message;
    let req = bs_proto::NegotiateRequest {
        name: "t".into(),
        direction: bs_proto::Direction::Push as i32,
        length: Some(1 << 20),
        route: route(1 << 20),
        pipelined: true,
        ..Default::default()
    };
    conn.write_frame(&Frame::Negotiate { body: req.encode_to_vec().into() }).unwrap();
    conn.write_frame(&Frame::Data { offset: 0, len: 1 << 20 }).unwrap();
    conn.write_slices(&[&[7u8; 10]]).unwrap();
    // Meanwhile the one transfer slot is free for others.
    assert_eq!(pull(&c, "t", 0, None), b"abc");
    push(&c, "u", b"def");
    // And the stalled connection is closed well before the test's own 10 s wait.
    match conn.read_frame() {
        Err(TransportError::Closed) => {}
        Err(TransportError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the server to close the stalled connection, got {other:?}"),
    }
}

#[test]
fn pulls_sent_ahead_come_back_in_order_verified_with_the_usual_errors() {
    let cfg = long_keepalive();
    let (_s, c, connections) = through_counting_proxy(cfg);
    let size = |i: usize| match i {
        7 => 0,
        20 => 3_000_000, // several chunks
        i => 1 + i * 997,
    };
    for i in 0..40 {
        push(&c, &format!("m/{i}"), &data(size(i)));
    }
    let mut names: Vec<String> = (0..40).map(|i| format!("m/{i}")).collect();
    names.insert(13, "m/missing".into());
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut got = Vec::new();
    c.pull_each(&refs, |i, r| got.push((i, r)));
    assert_eq!(got.len(), names.len());
    for (k, (i, r)) in got.into_iter().enumerate() {
        assert_eq!(i, k, "in order");
        match names[i].strip_prefix("m/").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => assert_eq!(r.unwrap(), data(size(n)), "{}", names[i]),
            None => assert!(matches!(r, Err(ClientError::NotFound(_))), "{r:?}"),
        }
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1, "every transfer on the one connection");
}

#[test]
fn a_corrupt_blob_among_pulls_sent_ahead_fails_alone() {
    let store = MemStore::new();
    let (_s, c) = server_with(Arc::new(store.clone()), ServerConfig::ephemeral());
    for i in 0..6 {
        push(&c, &format!("k/{i}"), &data(5000 + i));
    }
    store.damage("k/2", 100, 0x01).unwrap();
    let names = ["k/0", "k/1", "k/2", "k/3", "k/4", "k/5"];
    let mut got = Vec::new();
    c.pull_each(&names, |i, r| got.push((i, r)));
    assert_eq!(got.len(), 6);
    for (i, r) in got {
        if i == 2 {
            assert!(r.as_ref().is_err_and(|e| e.is_integrity()), "{r:?}");
        } else {
            assert_eq!(r.unwrap(), data(5000 + i), "k/{i}");
        }
    }
}

#[test]
fn a_blob_larger_than_asked_among_pulls_sent_ahead_is_left_unread() {
    let cfg = long_keepalive();
    let (_s, c, connections) = through_counting_proxy(cfg);
    for i in 0..6 {
        push(&c, &format!("u/{i}"), &data(if i == 1 || i == 3 { 200_000 } else { 5000 }));
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1, "one kept-alive connection so far");
    // u/1 is answered on that connection, which is then closed unread; u/3 the usual way.
    let names = ["u/0", "u/1", "u/2", "u/3", "u/4", "u/5"];
    let mut got = Vec::new();
    c.pull_each_up_to(&names, 100_000, |i, r| got.push((i, r)));
    assert_eq!(got.len(), 6);
    // Each connection a blob too large was left unread on is closed, never used again:
    // u/2 and u/3 went on a second one, u/4 and u/5 on a third.
    assert_eq!(connections.load(Ordering::SeqCst), 3);
    let mut again = Vec::new();
    c.pull_each(&["u/0", "u/2"], |i, r| again.push((i, r.unwrap())));
    assert_eq!(again, [(0, data(5000)), (1, data(5000))]);
    assert_eq!(connections.load(Ordering::SeqCst), 3, "the next pulls on the kept one");
    for (k, (i, r)) in got.into_iter().enumerate() {
        assert_eq!(i, k, "in order");
        if i == 1 || i == 3 {
            let e = r.unwrap_err();
            assert!(
                matches!(&e, ClientError::TooLarge { size: 200_000, max: 100_000, name } if *name == names[i]),
                "{e:?}"
            );
        } else {
            assert_eq!(r.unwrap(), data(5000), "u/{i}");
        }
    }
}

/// A data connection that has carried one transfer (a pull of `t`, which must hold `abc`),
/// so it takes in-band requests.
fn kept_alive(s: &BackgroundServer) -> bs_transport::Conn {
    let t = TcpStream::connect(s.data_addr()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut conn = bs_transport::Conn::new(t);
    conn.write_frame(&Frame::Hello { token: raw_token(s, "t", bs_proto::Direction::Pull) })
        .unwrap();
    assert!(matches!(conn.read_frame().unwrap(), Frame::Data { offset: 0, len: 3 }));
    conn.recv_data_into(&mut [0u8; 3], None).unwrap();
    assert!(matches!(conn.read_frame().unwrap(), Frame::Sum { total: 3, .. }));
    conn
}

#[test]
fn the_client_pushes_small_blobs_in_one_round_trip_and_larger_ones_the_usual_way() {
    let (s, c) = server();
    // Nothing to pipeline on before a first transfer has left a connection to keep.
    assert!(c.try_push_pipelined("p/0", b"x", route(1)).is_none());
    push(&c, "first", b"x");
    for i in 0..20 {
        let bytes = data(1 + i * 40_000);
        let ack = c.try_push_pipelined(&format!("p/{i}"), &bytes, route(bytes.len() as u64));
        let ack = ack.expect("pipelined").unwrap();
        assert_eq!(ack.committed, Some(DigestAlgo::default().digest(&bytes)));
        assert_eq!(pull(&c, &format!("p/{i}"), 0, None), bytes);
    }
    // The same refusals as the usual way, and the connection goes on serving.
    let again = c.try_push_pipelined("p/3", b"abc", route(3)).expect("pipelined").unwrap_err();
    assert!(matches!(again, ClientError::AlreadyExists(_)), "{again:?}");
    // Larger than one write (sent in pieces, its SUM after them): refused alike, read past.
    let again = data(700_000);
    let e = c.try_push_pipelined("p/3", &again, route(700_000)).expect("pipelined").unwrap_err();
    assert!(matches!(e, ClientError::AlreadyExists(_)), "{e:?}");
    let bad = c.try_push_pipelined("../x", b"abc", route(3)).expect("pipelined").unwrap_err();
    assert!(matches!(bad, ClientError::InvalidArgument(_)), "{bad:?}");
    assert!(c.try_push_pipelined("p/empty", b"", route(0)).expect("pipelined").is_ok());
    assert_eq!(c.stat("p/empty").unwrap().size, 0);
    // Past the server's bound (1 MiB), or with message layers, the usual way.
    let big = data((1 << 20) + 1);
    assert!(c.try_push_pipelined("p/big", &big, route(big.len() as u64)).is_none());
    c.push_all("p/big", &big, route(big.len() as u64)).unwrap();
    assert_eq!(pull(&c, "p/big", 0, None), big);
    let layered = c.clone().with_settings(TransferSettings {
        layers: vec![bs_binding::LayerSpec::Checksum(bs_binding::SumAlgo::Xxh3)],
        ..Default::default()
    });
    assert!(layered.try_push_pipelined("p/layered", b"abc", route(3)).is_none());
    // Checked in either digest the client may propose (the blob's stored digest is the
    // store's own).
    let b3 = c.clone().with_settings(TransferSettings {
        digests: vec![DigestAlgo::Blake3],
        ..Default::default()
    });
    let ack = b3.try_push_pipelined("p/b3", b"abc", route(3)).expect("pipelined").unwrap();
    assert_eq!(ack.committed, Some(DigestAlgo::default().digest(b"abc")));
    assert_eq!(pull(&c, "p/b3", 0, None), b"abc");
    let more = data(900_000);
    let ack = b3.try_push_pipelined("p/b3-big", &more, route(900_000)).expect("pipelined");
    assert_eq!(ack.unwrap().committed, Some(DigestAlgo::default().digest(&more)));
    assert_eq!(pull(&c, "p/b3-big", 0, None), more);
    // A server that keeps no connection alive offers none of it.
    let cfg = ServerConfig { data_keepalive: Duration::ZERO, ..ServerConfig::ephemeral() };
    let (_s2, c2) = server_with(Arc::new(MemStore::new()), cfg);
    push(&c2, "first", b"x");
    assert!(c2.try_push_pipelined("p/0", b"x", route(1)).is_none());
    drop(s);
}

#[test]
fn the_control_plane_refuses_a_pipelined_request_and_announces_the_bound() {
    let off = ServerConfig { data_keepalive: Duration::ZERO, ..ServerConfig::ephemeral() };
    for (cfg, bound) in [(ServerConfig::ephemeral(), 1 << 20), (off, 0)] {
        let (s, _c) = server_with(Arc::new(MemStore::new()), cfg);
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (refused, answer) = rt.block_on(async {
            let url = format!("http://{}", s.control_addr());
            let mut g = bs_proto::blob_store_client::BlobStoreClient::connect(url).await.unwrap();
            let mut req = bs_proto::NegotiateRequest {
                name: "p".into(),
                direction: bs_proto::Direction::Push as i32,
                length: Some(3),
                route: route(3),
                pipelined: true,
                ..Default::default()
            };
            let refused = g.negotiate(req.clone()).await.unwrap_err();
            req.pipelined = false;
            (refused, g.negotiate(req).await.unwrap().into_inner())
        });
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
        // Pipelining is offered only with keep-alive (a kept connection is what it runs on).
        assert_eq!(answer.pipeline_up_to, bound);
    }
}

/// A binding to the echo endpoint, negotiated with the generated gRPC client: its token.
fn bind_token(s: &BackgroundServer) -> [u8; TOKEN_LEN] {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = format!("http://{}", s.control_addr());
        let mut g = bs_proto::blob_store_client::BlobStoreClient::connect(url).await.unwrap();
        let req = bs_proto::BindRequest {
            proposal: Some(bs_binding::Profile::default().to_pb()),
            endpoint: bs_proto::BindEndpoint::Echo as i32,
            ..Default::default()
        };
        let r = g.bind(req).await.unwrap().into_inner();
        assert_eq!(r.refused, "", "the default profile is accepted");
        r.token.try_into().unwrap()
    })
}

#[test]
fn a_silent_peer_times_out() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = ServerConfig {
        advertise_data: Some(silent.local_addr().unwrap().to_string()),
        ..ServerConfig::ephemeral()
    };
    let (_s, c) = server_with(Arc::new(MemStore::new()), cfg);
    let c = c.with_settings(TransferSettings {
        io_timeout: Duration::from_millis(200),
        ..Default::default()
    });
    // The advertised data endpoint accepts connections and never answers.
    c.route(RouteRequest { name: "s".into(), size: Some(0), ..Default::default() }).unwrap();
    let e = c.open_push("s", 0, None, None).and_then(|p| p.finish(true)).unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    // The same through a handle bounded for a deadline.
    let c = c.with_settings(TransferSettings::default()).within(Duration::from_millis(200));
    assert!(c.open_push("s", 0, None, None).unwrap_err().is_timeout());
    drop(silent);
}

#[test]
fn an_absurd_data_length_after_a_valid_hello_is_refused_at_once() {
    let (s, c) = server();
    c.route(RouteRequest { name: "ten".into(), size: Some(10), ..Default::default() }).unwrap();
    let token = raw_token(&s, "ten", bs_proto::Direction::Push);
    let mut msg = Frame::Hello { token }.encode().to_vec();
    msg.extend_from_slice(&Frame::Data { offset: 0, len: 1 << 60 }.encode());
    assert_eq!(error_code(raw(&s, &msg)), ErrorCode::OutOfRange);
    assert!(matches!(c.stat("ten"), Err(ClientError::NotFound(_))));
}

/// A client that will not wait for a busy server is told it is busy (not that its token was
/// used up, nor anything else).
fn told_busy(c: &Client) {
    let impatient = c
        .clone()
        .with_settings(TransferSettings { busy_timeout: Duration::ZERO, ..Default::default() });
    let e = impatient.open_pull("x", 0, None).unwrap_err();
    assert!(
        matches!(e, ClientError::Transfer(TransportError::Remote { code: ErrorCode::Busy, .. })),
        "{e:?}"
    );
}

#[test]
fn transfers_beyond_the_limit_are_told_busy_and_the_client_waits_for_room() {
    let cfg = ServerConfig { max_connections: 1, ..ServerConfig::ephemeral() };
    let (s, c) = server_with(Arc::new(MemStore::new()), cfg);
    push(&c, "x", b"payload");
    // An admitted push holds the one transfer slot.
    let mut held = c.open_push("held", 0, None, route(4)).unwrap();
    let token = raw_token(&s, "x", bs_proto::Direction::Pull);
    assert_eq!(error_code(raw(&s, &Frame::Hello { token }.encode())), ErrorCode::Busy);
    // A client that will not wait is told why...
    told_busy(&c);
    // ...one that will asks again, with fresh tokens, until the slot is free.
    let waiting = thread::spawn(move || pull(&c, "x", 0, None));
    held.write(b"done").unwrap();
    held.finish(true).unwrap();
    assert_eq!(waiting.join().unwrap(), b"payload");
}

#[test]
fn a_push_trickling_under_the_rate_floor_is_ended_and_frees_its_slot() {
    let cfg = ServerConfig {
        io_timeout: Duration::from_secs(1),
        min_transfer_rate: 100_000,
        max_connections: 1,
        ..ServerConfig::ephemeral()
    };
    let (s, c) = server_with(Arc::new(MemStore::new()), cfg);
    c.route(RouteRequest { name: "slow".into(), size: Some(1_000_000), ..Default::default() })
        .unwrap();
    let token = raw_token(&s, "slow", bs_proto::Direction::Push);
    let mut t = TcpStream::connect(s.data_addr()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    t.write_all(&Frame::Hello { token }.encode()).unwrap();
    let mut conn = bs_transport::Conn::new(t.try_clone().unwrap());
    assert!(matches!(conn.read_frame().unwrap(), Frame::Ack { committed: None, .. }));
    t.write_all(&Frame::Data { offset: 0, len: 1_000_000 }.encode()).unwrap();
    // A kilobyte every 100 ms: each read comes well within the 1 s timeout, but 10 kB/s is
    // under the 100 kB/s floor.
    let trickle = thread::spawn(move || {
        for _ in 0..600 {
            if t.write_all(&[7; 1000]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!("the server took a minute of trickling");
    });
    match conn.read_frame().unwrap() {
        Frame::Error { code, message } => {
            assert_eq!(code, ErrorCode::TooSlow, "{message}");
            assert!(message.contains("under the 100000 bytes/s"), "{message}");
        }
        f => panic!("expected ERROR(TooSlow), got {f:?}"),
    }
    drop(conn);
    trickle.join().unwrap();
    assert!(matches!(c.stat("slow"), Err(ClientError::NotFound(_))));
    // The one transfer slot is free again.
    push(&c, "next", b"fine");
    assert_eq!(pull(&c, "next", 0, None), b"fine");

    // An upload of unknown length (a pipe, an instrument's stream) may come as slowly as it
    // is made: the same trickle, past the grace, is taken whole.
    c.route(RouteRequest { name: "stream".into(), size: None, ..Default::default() }).unwrap();
    let mut p = c.open_push("stream", 0, None, None).unwrap();
    let piece = [5u8; 1000];
    for _ in 0..20 {
        p.write(&piece).unwrap();
        thread::sleep(Duration::from_millis(100));
    }
    assert!(p.finish(true).unwrap().committed.is_some());
    assert_eq!(pull(&c, "stream", 0, None), vec![5u8; 20_000]);
}

#[test]
fn a_busy_server_met_on_a_kept_alive_connection_is_waited_for() {
    let cfg = ServerConfig { max_connections: 1, ..ServerConfig::ephemeral() };
    let (s, c) = server_with(Arc::new(MemStore::new()), cfg);
    push(&c, "x", b"payload"); // leaves a kept-alive connection in c's pool
    // Another client holds the one transfer slot.
    let other = Client::connect(&s.control_addr().to_string()).unwrap();
    let mut held = other.open_push("held", 0, None, route(4)).unwrap();
    // c asks in band and is told the server is busy; it asks the control plane and presents
    // the token on the kept-alive connection, then (turned away) on a new one: busy both
    // times, and the first refusal must not have used the token up (not TokenReused).
    told_busy(&c);
    held.write(b"done").unwrap();
    held.finish(true).unwrap();
    assert_eq!(pull(&c, "x", 0, None), b"payload");
}

#[test]
fn a_draining_server_lets_an_admitted_push_finish() {
    let (s, c) = server();
    let mut p = c.open_push("late", 0, None, route(6)).unwrap();
    let drain = thread::spawn(move || s.drain(Duration::from_secs(600)));
    p.write(b"landed").unwrap();
    assert!(p.finish(true).unwrap().committed.is_some());
    assert_eq!(drain.join().unwrap(), 0, "no transfer was cut short");
}

#[test]
fn a_push_of_unknown_size_stops_at_the_server_limit() {
    let cfg = ServerConfig { max_unsized_upload: 1 << 20, ..ServerConfig::ephemeral() };
    let (s, c) = server_with(Arc::new(MemStore::new()), cfg);
    let unsized_route = || RouteRequest { size: None, ..Default::default() };
    // Within the limit: fine.
    let mut p = c.open_push("fits", 0, None, Some(unsized_route())).unwrap();
    p.write(&data(1 << 20)).unwrap();
    assert_eq!(p.finish(true).unwrap().received, 1 << 20);
    // A DATA frame that reaches past it is refused from its header, named as such.
    for len in [(1 << 20) + 1, 1 << 62] {
        c.route(RouteRequest { name: "big".into(), ..unsized_route() }).unwrap();
        let token = raw_token(&s, "big", bs_proto::Direction::Push);
        let mut msg = Frame::Hello { token }.encode().to_vec();
        msg.extend_from_slice(&Frame::Data { offset: 0, len }.encode());
        match raw(&s, &msg) {
            Frame::Error { code: ErrorCode::OutOfRange, message } => {
                assert!(
                    message.contains("unknown size") && message.contains("1048576"),
                    "{message}"
                );
            }
            other => panic!("{len}: {other:?}"),
        }
    }
    // Through the client, too: the push fails and nothing is committed.
    let mut p = c.open_push("big", 0, None, Some(unsized_route())).unwrap();
    let e = p.write(&data((1 << 20) + 100)).and_then(|_| p.finish(true)).unwrap_err();
    assert!(
        matches!(
            &e,
            ClientError::Transfer(TransportError::Remote { code: ErrorCode::OutOfRange, .. })
        ),
        "{e:?}"
    );
    assert!(matches!(c.stat("big"), Err(ClientError::NotFound(_))));
}

#[test]
fn by_default_a_push_of_unknown_size_cannot_announce_exabytes() {
    let (s, c) = server();
    c.route(RouteRequest { name: "huge".into(), size: None, ..Default::default() }).unwrap();
    let token = raw_token(&s, "huge", bs_proto::Direction::Push);
    let mut msg = Frame::Hello { token }.encode().to_vec();
    msg.extend_from_slice(&Frame::Data { offset: 0, len: 1 << 62 }.encode());
    assert_eq!(error_code(raw(&s, &msg)), ErrorCode::OutOfRange);
    assert!(matches!(c.stat("huge"), Err(ClientError::NotFound(_))));
}

#[test]
fn impossible_sizes_are_refused_and_the_server_lives_on() {
    let (_s, c) = server();
    let e = c
        .route(RouteRequest { name: "huge".into(), size: Some(u64::MAX), ..Default::default() })
        .unwrap_err();
    assert!(matches!(e, ClientError::StorageFull(_)), "{e:?}");
    push(&c, "small", b"ok");
    assert_eq!(pull(&c, "small", 0, None), b"ok");
}

#[test]
fn a_blob_replaced_after_negotiation_is_not_served_half_old() {
    let (s, c) = server();
    push(&c, "v", b"version one");
    let token = raw_token(&s, "v", bs_proto::Direction::Pull);
    let mut p = c
        .open_push(
            "v",
            0,
            None,
            Some(RouteRequest { size: Some(11), overwrite: true, ..Default::default() }),
        )
        .unwrap();
    p.write(b"version two").unwrap();
    p.finish(true).unwrap();
    assert_eq!(error_code(raw(&s, &Frame::Hello { token }.encode())), ErrorCode::NotFound);
}

#[test]
fn bad_negotiations_are_invalid_arguments() {
    let (s, c) = server();
    push(&c, "n", b"1");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let url = format!("http://{}", s.control_addr());
        let mut g = bs_proto::blob_store_client::BlobStoreClient::connect(url).await.unwrap();
        let no_direction = bs_proto::NegotiateRequest { name: "n".into(), ..Default::default() };
        assert_eq!(
            g.negotiate(no_direction).await.unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let bad_digest = bs_proto::NegotiateRequest {
            name: "n".into(),
            direction: bs_proto::Direction::Pull as i32,
            digests: vec!["md5".into()],
            ..Default::default()
        };
        assert_eq!(g.negotiate(bad_digest).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    });
}

#[test]
fn a_final_push_commits_only_what_it_verified() {
    let (_s, c) = server();
    let rr = RouteRequest { size: None, resume_tag: "t".into(), ..Default::default() };
    let mut p = c.open_push("tail", 0, None, Some(rr.clone())).unwrap();
    p.write(&data(100)).unwrap();
    drop(p); // 100 bytes held, never confirmed
    // Wait (bounded) until the server has taken in the 100 bytes.
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while c.route(RouteRequest { name: "tail".into(), ..rr.clone() }).unwrap().received < 100 {
        assert!(std::time::Instant::now() < give_up);
        thread::yield_now();
    }
    let mut p = c.open_push("tail", 0, None, None).unwrap();
    p.write(&data(60)).unwrap();
    let ack = p.finish(true).unwrap();
    assert_eq!(ack.received, 60);
    assert_eq!(pull(&c, "tail", 0, None), data(60), "the unconfirmed tail was dropped");
}

/// A put that routed its upload, then another put of the same name routing it again before
/// the first pushes: the first's push names the upload it routed and is refused at once,
/// that upload being gone (not let fill the other's upload under the other's metadata, nor
/// made to wait as for a busy one), and the other's lands — on the memory and the
/// filesystem store, the other of the same size and of another.
#[test]
fn a_push_into_an_upload_another_put_routed_again_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let stores: Vec<Arc<dyn Store>> =
        vec![Arc::new(MemStore::new()), Arc::new(FsStore::open(dir.path()).unwrap())];
    for store in stores {
        let (_s, c) = server_with(store, ServerConfig::ephemeral());
        for (size, tag) in [(3u64, "same size"), (5, "another size")] {
            let name = format!("raced/{size}");
            let mine = RouteRequest { name: name.clone(), size: Some(3), ..Default::default() };
            let theirs = RouteRequest {
                size: Some(size),
                metadata: [("who".to_string(), "them".to_string())].into(),
                ..mine.clone()
            };
            let first = c.route(mine).unwrap();
            let second = c.route(theirs).unwrap();
            assert_ne!(first.upload_id, second.upload_id, "{tag}");
            let Err(e) = c.open_push_into(&name, &first.upload_id, 0, Some(3)) else {
                panic!("{tag}: admitted into the other put's upload");
            };
            let gone = |m: &str| m.contains("routed it again");
            assert!(
                matches!(&e, ClientError::Transfer(TransportError::Remote {
                    code: ErrorCode::NotFound,
                    message
                }) if gone(message)),
                "{tag}: {e}"
            );
            let bytes = &data(size as usize);
            let mut p = c.open_push_into(&name, &second.upload_id, 0, Some(size)).unwrap();
            p.write(bytes).unwrap();
            p.finish(true).unwrap();
            assert_eq!(pull(&c, &name, 0, None), *bytes, "{tag}");
            assert_eq!(c.stat(&name).unwrap().metadata["who"], "them", "{tag}");
        }
    }
}
