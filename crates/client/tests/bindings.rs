//! Bindings end to end against a real server on port 0: negotiation (accept, lower, refuse),
//! every layer over a real connection, renegotiation on live bindings of each flow, Unix
//! domain sockets, status, and the bad input that must fail one binding and no other.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bs_binding::driver::Renegotiated;
use bs_binding::{BindingError, Floor, LayerSpec, Profile, TransportKind};
use bs_client::{BindEndpoint, Client, ClientError};
use bs_server::{BackgroundServer, ServerConfig};
use bs_store::MemStore;
use bs_wire::{ErrorCode, Frame, FrameKind, Header, RenegStep};

fn server_with(cfg: ServerConfig) -> (BackgroundServer, Client) {
    let s = BackgroundServer::start(Arc::new(MemStore::new()), cfg).unwrap();
    let c = Client::connect(&s.control_addr().to_string()).unwrap();
    (s, c)
}

fn server() -> (BackgroundServer, Client) {
    server_with(ServerConfig::ephemeral())
}

fn layers(names: &[&str]) -> Profile {
    let mut b = Profile::builder().max_message(1 << 20);
    for n in names {
        b = b.layer(n.parse().unwrap());
    }
    b.build().unwrap()
}

fn payload(n: usize, compressible: bool) -> Vec<u8> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..n)
        .map(|i| {
            if compressible {
                return (i / 512) as u8;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

fn echo(c: &Client, p: &Profile) -> bs_client::Bound {
    c.bind(BindEndpoint::Echo, p, &Floor::default(), "test", None).unwrap()
}

/// Wait (bounded) until the server lists `n` live bindings.
fn wait_bindings(c: &Client, n: usize) -> Vec<bs_client::BindingStatus> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let b = c.bindings().unwrap();
        if b.len() == n || Instant::now() > until {
            return b;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn every_layer_alone_and_stacked_carries_every_size() {
    let (_s, c) = server();
    let stacks: &[&[&str]] = &[
        &[],
        &["null"],
        &["null", "null", "null", "null", "null", "null", "null", "null"],
        &["checksum:xxh3"],
        &["checksum:blake3"],
        &["compress:zstd:3"],
        &["compress:lz4"],
        &["fragment:4096"],
        &["pace:1g"],
        &["checksum:blake3", "compress:lz4", "fragment:1000", "pace:1g"],
        &["compress:zstd", "checksum:xxh3", "fragment:65536"],
    ];
    for names in stacks {
        let mut b = echo(&c, &layers(names)).binding;
        for (n, comp) in [(0, false), (1, false), (100, true), (70_000, false), (1 << 20, true)] {
            let data = payload(n, comp);
            // Copied into a pooled message, and shared without a copy.
            let back = b.request(&data).unwrap();
            assert_eq!(&back[..], &data[..], "{names:?} {n}");
            b.send_bytes(bytes::Bytes::from(data.clone())).unwrap();
            let back = b.recv().unwrap().unwrap();
            assert_eq!(&back[..], &data[..], "{names:?} {n}");
        }
        b.close();
    }
}

#[test]
fn a_modest_proposal_is_accepted_as_is() {
    let (_s, c) = server();
    let p = Profile::builder()
        .throughput(10 << 20)
        .priority(4)
        .max_message(4096)
        .layer(LayerSpec::Checksum(bs_binding::SumAlgo::Xxh3))
        .build()
        .unwrap();
    let bound = echo(&c, &p);
    assert!(bound.lowered.iter().all(|l| !l.contains("throughput")), "{:?}", bound.lowered);
    assert_eq!(bound.transport, "tcp");
    let got = bound.binding.profile();
    assert_eq!((got.throughput_bps, got.priority, got.max_message), (10 << 20, 4, 4096));
    assert_eq!(got.layers, p.layers);
}

#[test]
fn what_the_server_cannot_meet_is_lowered_and_a_floor_can_refuse_it() {
    let cfg = ServerConfig { max_binding_rate: 1 << 20, ..ServerConfig::ephemeral() };
    let (_s, c) = server_with(cfg);
    let p = Profile::builder().throughput(100 << 20).build().unwrap();
    let bound = echo(&c, &p);
    assert_eq!(bound.binding.profile().throughput_bps, 1 << 20);
    assert!(bound.lowered.iter().any(|l| l.contains("per-binding limit")), "{:?}", bound.lowered);
    let floor = Floor { min_throughput_bps: 50 << 20, ..Floor::default() };
    let e = c.bind(BindEndpoint::Echo, &p, &floor, "picky", None).unwrap_err();
    assert!(
        matches!(&e, ClientError::Refused(m) if m.contains("this side refused") && m.contains("at least")),
        "{e}"
    );
}

#[test]
fn a_proposal_the_server_cannot_meet_at_all_is_refused_with_the_reason() {
    let (_s, c) = server();
    let enc = Profile::builder().layer(LayerSpec::Encrypt).build().unwrap();
    let e = c.bind(BindEndpoint::Echo, &enc, &Floor::default(), "", None).unwrap_err();
    assert!(matches!(&e, ClientError::Refused(m) if m.contains("TLS")), "{e}");
    let udp_only = Profile::builder().transport(TransportKind::Unix).build().unwrap();
    let e = c.bind(BindEndpoint::Sink, &udp_only, &Floor::default(), "", None).unwrap_err();
    assert!(matches!(&e, ClientError::Refused(m) if m.contains("no common transport")), "{e}");
}

#[test]
fn an_unknown_layer_name_is_a_clear_error() {
    let e = "rot13".parse::<LayerSpec>().unwrap_err();
    assert!(e.to_string().contains("unknown layer \"rot13\""), "{e}");
    // And from the server, for a program that sends the name over the wire itself.
    let (s, _c) = server();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(async {
        let mut g = bs_proto::blob_store_client::BlobStoreClient::connect(format!(
            "http://{}",
            s.control_addr()
        ))
        .await
        .unwrap();
        let req = bs_proto::BindRequest {
            proposal: Some(bs_proto::QosProfile {
                layers: vec!["rot13".into()],
                ..Default::default()
            }),
            endpoint: bs_proto::BindEndpoint::Echo as i32,
            ..Default::default()
        };
        g.bind(req).await.unwrap_err()
    });
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("rot13"), "{}", status.message());
}

#[test]
fn renegotiation_on_a_live_request_reply_binding() {
    let (_s, c) = server();
    let mut b = echo(&c, &layers(&["checksum:xxh3"])).binding;
    assert_eq!(&b.request(b"before").unwrap()[..], b"before");
    let want = Profile {
        layers: vec!["compress:lz4".parse().unwrap(), "checksum:blake3".parse().unwrap()],
        max_message: 8192,
        ..b.profile().clone()
    };
    let r = b.renegotiate(want).unwrap();
    let Renegotiated::Applied(p) = r else { panic!("{r:?}") };
    assert_eq!(p.max_message, 8192);
    assert_eq!(b.profile().layers.len(), 2);
    let data = payload(8192, true);
    assert_eq!(&b.request(&data).unwrap()[..], &data[..]);
    // The new cap holds both ways: a larger message is refused before it leaves.
    assert!(matches!(b.send(&[0; 8193]), Err(BindingError::Layer(_))));
    let st = wait_bindings(&c, 1);
    assert_eq!(st[0].renegotiations, 1);
    assert_eq!(st[0].profile.as_ref().unwrap().max_message, 8192);
    b.close();
}

#[test]
fn renegotiation_mid_stream_while_sending_and_while_receiving() {
    let (_s, c) = server();
    // Sink: messages keep flowing while the proposal is answered.
    let mut sink =
        c.bind(BindEndpoint::Sink, &layers(&[]), &Floor::default(), "sink", None).unwrap().binding;
    for _ in 0..50 {
        sink.send(&payload(10_000, false)).unwrap();
    }
    let r = sink.renegotiate(layers(&["compress:zstd:1", "fragment:1000"])).unwrap();
    assert!(matches!(r, Renegotiated::Applied(_)), "{r:?}");
    for _ in 0..50 {
        sink.send(&payload(10_000, true)).unwrap();
    }
    let st = wait_bindings(&c, 1);
    assert_eq!(st[0].renegotiations, 1);
    sink.close();
    wait_bindings(&c, 0);

    // Source: the server streams; the switch point is marked in its stream.
    let p = Profile { max_message: 4096, ..layers(&["checksum:xxh3"]) };
    let mut src = c.bind(BindEndpoint::Source, &p, &Floor::default(), "src", None).unwrap().binding;
    for _ in 0..20 {
        assert_eq!(src.recv().unwrap().unwrap().len(), 4096);
    }
    let r = src.renegotiate(Profile { max_message: 1000, ..layers(&["compress:lz4"]) }).unwrap();
    assert!(matches!(r, Renegotiated::Applied(_)), "{r:?}");
    // Messages sent before the switch may still be queued (as many as the socket buffers
    // hold); after them, only the new size, never the old one again.
    let mut old = 0;
    loop {
        match src.recv().unwrap().unwrap().len() {
            4096 => old += 1,
            1000 => break,
            n => panic!("a message of {n} bytes"),
        }
        assert!(old < 100_000, "the switch never came");
    }
    for _ in 0..200 {
        assert_eq!(src.recv().unwrap().unwrap().len(), 1000, "after {old} queued old ones");
    }
    src.close();
}

#[test]
fn a_counter_offer_below_the_floor_is_refused_mid_stream_and_nothing_changes() {
    let cfg = ServerConfig { max_binding_rate: 1 << 20, ..ServerConfig::ephemeral() };
    let (_s, c) = server_with(cfg);
    let p = Profile { throughput_bps: 1 << 20, ..layers(&["checksum:xxh3"]) };
    let mut b = echo(&c, &p).binding;
    // From now on this side needs 4 MiB/s; the server gives one binding at most 1 MiB/s.
    b.set_floor(Floor { min_throughput_bps: 4 << 20, ..Floor::default() });
    let r = b.renegotiate(Profile { throughput_bps: 8 << 20, ..p.clone() }).unwrap();
    assert!(
        matches!(&r, Renegotiated::Refused(bs_binding::Refusal::BelowFloor(m)) if m.contains("at least")),
        "{r:?}"
    );
    assert_eq!(b.profile(), &echo(&c, &p).binding.profile().clone());
    assert_eq!(&b.request(b"unchanged").unwrap()[..], b"unchanged");
    // The server saw the refusal too: nothing was applied.
    let st = c.bindings().unwrap();
    assert!(st.iter().all(|s| s.renegotiations == 0), "{st:?}");
    b.close();
}

#[test]
fn bindings_over_a_unix_socket_on_the_same_host() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("data.sock");
    let cfg = ServerConfig { unix_socket: Some(sock.clone()), ..ServerConfig::ephemeral() };
    let (_s, c) = server_with(cfg);
    let p = Profile::builder()
        .transport(TransportKind::Unix)
        .transport(TransportKind::Tcp)
        .layer(LayerSpec::Checksum(bs_binding::SumAlgo::Xxh3))
        .build()
        .unwrap();
    let bound = echo(&c, &p);
    assert_eq!(
        (bound.transport.as_str(), bound.address.clone()),
        ("unix", sock.display().to_string())
    );
    let mut b = bound.binding;
    assert!(b.conn().is_unix());
    let data = payload(300_000, false);
    assert_eq!(&b.request(&data).unwrap()[..], &data[..]);
    assert_eq!(wait_bindings(&c, 1)[0].transport, "unix");
    b.close();
    // The socket file is private to the server's user.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777, 0o600);
}

/// A raw data connection presenting the token of a fresh binding offer.
fn raw(c: &Client, endpoint: BindEndpoint, p: &Profile) -> TcpStream {
    let offer = c.propose(endpoint, p, "raw").unwrap();
    let mut t = TcpStream::connect(&offer.address).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    t.write_all(&Frame::Hello { token: offer.token }.encode()).unwrap();
    t
}

/// Read frames until an ERROR; returns its code and message.
fn error_of(t: &mut TcpStream) -> (ErrorCode, String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        while let Some((f, used)) = Frame::parse(&buf).unwrap() {
            let skip = match f {
                Frame::Msg { len, .. } => len as usize,
                _ => 0,
            };
            if buf.len() < used + skip {
                break;
            }
            buf.drain(..used + skip);
            if let Frame::Error { code, message } = f {
                return (code, message);
            }
        }
        let n = t.read(&mut chunk).unwrap();
        assert!(n > 0, "closed without an ERROR frame");
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn msg(seq: u64, wire: &[u8]) -> Vec<u8> {
    let mut v = Header { kind: FrameKind::Msg, body_len: 0, a: seq, b: wire.len() as u64 }
        .encode()
        .to_vec();
    v.extend_from_slice(wire);
    v
}

/// Each bad input fails its own binding with a named error; a binding opened before it and
/// one opened after it keep working.
#[test]
fn bad_input_fails_one_binding_and_no_other() {
    let (_s, c) = server();
    let mut bystander = echo(&c, &layers(&["checksum:xxh3"])).binding;

    // A compressed message that declares more than the negotiated cap.
    let mut t =
        raw(&c, BindEndpoint::Sink, &Profile { max_message: 1000, ..layers(&["compress:lz4"]) });
    let mut bomb = vec![2u8];
    bomb.extend_from_slice(&100_000u32.to_be_bytes());
    bomb.extend_from_slice(&[0u8; 100]);
    t.write_all(&msg(0, &bomb)).unwrap();
    let (code, m) = error_of(&mut t);
    assert_eq!(code, ErrorCode::BadMessage, "{m}");
    assert!(m.contains("exceeds the negotiated cap"), "{m}");

    // A checksum that does not match.
    let mut t = raw(&c, BindEndpoint::Sink, &layers(&["checksum:xxh3"]));
    let mut wire = vec![1u8];
    wire.extend_from_slice(&[0u8; 8]);
    wire.extend_from_slice(b"hello");
    t.write_all(&msg(0, &wire)).unwrap();
    let (code, m) = error_of(&mut t);
    assert_eq!(code, ErrorCode::BadMessage);
    assert!(m.contains("checksum mismatch"), "{m}");

    // A wire length no stack could produce: refused from the header, nothing allocated.
    let mut t = raw(&c, BindEndpoint::Sink, &Profile { max_message: 1000, ..layers(&[]) });
    t.write_all(&Header { kind: FrameKind::Msg, body_len: 0, a: 0, b: 1 << 50 }.encode()).unwrap();
    let (code, m) = error_of(&mut t);
    assert_eq!(code, ErrorCode::BadMessage, "{m}");

    // A renegotiation in the middle of a fragmented message.
    let mut t = raw(&c, BindEndpoint::Sink, &layers(&["fragment:512"]));
    let mut first = vec![1u8];
    first.extend_from_slice(&0u32.to_be_bytes());
    first.extend_from_slice(&2000u32.to_be_bytes());
    first.extend_from_slice(&[7u8; 512]);
    t.write_all(&msg(0, &first)).unwrap();
    let propose = Frame::Reneg { id: 1, step: RenegStep::Propose, body: layers(&[]).encode() };
    t.write_all(&propose.encode()).unwrap();
    let (code, m) = error_of(&mut t);
    assert_eq!(code, ErrorCode::BadRenegotiation, "{m}");

    // A step out of order (ACCEPT with nothing proposed).
    let mut t = raw(&c, BindEndpoint::Echo, &layers(&[]));
    let accept = Frame::Reneg { id: 1, step: RenegStep::Accept, body: bytes::Bytes::new() };
    t.write_all(&accept.encode()).unwrap();
    assert_eq!(error_of(&mut t).0, ErrorCode::BadRenegotiation);

    // A DATA frame on a binding.
    let mut t = raw(&c, BindEndpoint::Echo, &layers(&[]));
    t.write_all(&Frame::Data { offset: 0, len: 3 }.encode()).unwrap();
    assert_eq!(error_of(&mut t).0, ErrorCode::BadFrame);

    // A peer that vanishes in the middle of a renegotiation: its binding ends, alone.
    let mut t = raw(&c, BindEndpoint::Echo, &layers(&[]));
    let propose =
        Frame::Reneg { id: 1, step: RenegStep::Propose, body: layers(&["null"]).encode() };
    t.write_all(&propose.encode()).unwrap();
    drop(t);

    assert_eq!(wait_bindings(&c, 1).len(), 1, "only the bystander is left");
    assert_eq!(&bystander.request(b"still here").unwrap()[..], b"still here");
    let mut after = echo(&c, &layers(&["compress:zstd"])).binding;
    assert_eq!(&after.request(b"and a new one").unwrap()[..], b"and a new one");
}

#[test]
fn status_lists_live_bindings_with_their_counters() {
    let (_s, c) = server();
    let mut b = c
        .bind(BindEndpoint::Echo, &layers(&["checksum:xxh3"]), &Floor::default(), "probe", None)
        .unwrap()
        .binding;
    for _ in 0..10 {
        b.request(&[1u8; 1000]).unwrap();
    }
    let st = wait_bindings(&c, 1);
    let s = &st[0];
    assert_eq!(
        (s.label.as_str(), s.endpoint.as_str(), s.transport.as_str()),
        ("probe", "echo", "tcp")
    );
    assert_eq!((s.messages_in, s.messages_out), (10, 10));
    assert_eq!((s.bytes_in, s.bytes_out), (10_000, 10_000));
    let snap = b.counters().snapshot();
    assert_eq!((snap.messages_out, snap.bytes_in), (10, 10_000));
    assert!(snap.wire_out > snap.bytes_out, "checksum headers on the wire");
    b.close();
    assert!(wait_bindings(&c, 0).is_empty());
}

#[test]
fn transfers_are_negotiated_as_bindings_and_listed_while_they_run() {
    let (_s, c) = server();
    let bytes = payload(5_000_000, false);
    let mut p = c
        .open_push(
            "big",
            0,
            Some(bytes.len() as u64),
            Some(bs_client::RouteRequest { size: Some(bytes.len() as u64), ..Default::default() }),
        )
        .unwrap();
    p.write(&bytes[..1_000_000]).unwrap();
    let st = wait_bindings(&c, 1);
    assert_eq!((st[0].endpoint.as_str(), st[0].label.as_str()), ("push", "big"));
    let q = st[0].profile.clone().unwrap();
    assert_eq!(q.digests, vec!["xxh3-128".to_string()]);
    assert!(q.chunk_size > 0);
    p.write(&bytes[1_000_000..]).unwrap();
    p.finish(true).unwrap();
    wait_bindings(&c, 0);
}

fn with_layers(s: &BackgroundServer, names: &[&str]) -> Client {
    let settings = bs_client::TransferSettings {
        layers: names.iter().map(|n| n.parse().unwrap()).collect(),
        ..Default::default()
    };
    Client::connect(&s.control_addr().to_string()).unwrap().with_settings(settings)
}

/// Wait (bounded) until the server's only binding has taken in `n` application bytes.
fn wait_bytes_in(c: &Client, n: u64) -> bs_client::BindingStatus {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let st = c.bindings().unwrap();
        if let Some(b) = st.first().filter(|b| b.bytes_in == n) {
            return b.clone();
        }
        assert!(Instant::now() < until, "server never took in {n} bytes: {st:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// put and get whose profile asks for message layers send their bytes through them: the
/// server lists the layers, compression shows on its wire counters, and the blob that comes
/// back is the blob that went in (end-to-end digest checked on both legs).
#[test]
fn put_and_get_carry_their_bytes_through_the_negotiated_layers() {
    let (s, plain) = server();
    let bytes = payload(3_000_000, true);
    for (i, stack) in [
        &["compress:zstd", "checksum:xxh3"][..],
        &["checksum:blake3", "compress:lz4", "fragment:65536"],
        &["null", "pace:1g"],
    ]
    .into_iter()
    .enumerate()
    {
        let c = with_layers(&s, stack);
        let name = format!("layered-{i}");
        let size = Some(bytes.len() as u64);
        let route = bs_client::RouteRequest { size, ..Default::default() };
        let mut p = c.open_push(&name, 0, size, Some(route)).unwrap();
        p.write(&bytes[..1_000_000]).unwrap();
        let st = wait_bytes_in(&plain, 1_000_000);
        let names: Vec<&str> = stack.iter().map(|l| l.split(':').next().unwrap()).collect();
        let listed = &st.profile.as_ref().unwrap().layers;
        assert_eq!(listed.len(), stack.len(), "{listed:?}");
        for (want, got) in names.iter().zip(listed) {
            assert!(got.starts_with(want), "{stack:?}: server runs {listed:?}");
        }
        if names.contains(&"compress") {
            assert!(st.wire_in * 4 < st.bytes_in, "{stack:?}: {} on the wire", st.wire_in);
        } else {
            // null and pace add no header.
            assert_eq!(st.wire_in, st.bytes_in, "{stack:?}");
        }
        p.write(&bytes[1_000_000..]).unwrap();
        let ack = p.finish(true).unwrap();
        assert_eq!(ack.received, bytes.len() as u64);

        // Back through the layers, and again raw: the same bytes.
        let mut back = vec![0u8; bytes.len()];
        c.open_pull(&name, 0, None).unwrap().read_exact_to_end(&mut back).unwrap();
        assert!(back == bytes, "{stack:?}: pulled bytes differ");
        let mut raw = vec![0u8; 1000];
        plain.open_pull(&name, 2_000_000, Some(1000)).unwrap().read_exact_to_end(&mut raw).unwrap();
        assert_eq!(raw, bytes[2_000_000..2_001_000]);
        // A range through the layers starts where it was asked to.
        let mut part = vec![0u8; 500_000];
        let mut r = c.open_pull(&name, 1_234_567, Some(500_000)).unwrap();
        r.read_exact_to_end(&mut part).unwrap();
        assert_eq!(part, bytes[1_234_567..1_734_567]);
    }
}

/// A push negotiated with a checksum layer, written by hand: a message whose checksum does not
/// match, or that holds other than what its DATA header announced, fails the push with
/// BAD_MESSAGE and nothing of it is stored or committed.
#[test]
fn a_damaged_layered_push_fails_alone_and_stores_nothing() {
    let (s, c) = server();
    let token = |name: &str| -> Vec<u8> {
        c.route(bs_client::RouteRequest { name: name.into(), size: Some(5), ..Default::default() })
            .unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let url = format!("http://{}", s.control_addr());
            let mut g = bs_proto::blob_store_client::BlobStoreClient::connect(url).await.unwrap();
            let req = bs_proto::NegotiateRequest {
                name: name.into(),
                direction: bs_proto::Direction::Push as i32,
                qos: Some(layers(&["checksum:xxh3"]).to_pb()),
                ..Default::default()
            };
            let r = g.negotiate(req).await.unwrap().into_inner();
            assert_eq!(r.qos.unwrap().layers, vec!["checksum:xxh3".to_string()]);
            r.token
        })
    };
    let good = |data: &[u8]| {
        let mut s = bs_binding::Session::new(
            bs_binding::Role::Initiator,
            layers(&["checksum:xxh3"]),
            Default::default(),
            Default::default(),
        );
        let mut out = Vec::new();
        s.encode(s.message(data), &mut out).unwrap();
        let mut w = out.pop().unwrap().wire;
        w.make_contiguous(&Default::default());
        w.payload().to_vec()
    };
    let push = |name: &str, wire: Vec<u8>| {
        let mut t = TcpStream::connect(s.data_addr()).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let token: [u8; 32] = token(name).try_into().unwrap();
        t.write_all(&Frame::Hello { token }.encode()).unwrap();
        t.write_all(&Frame::Data { offset: 0, len: 5 }.encode()).unwrap();
        t.write_all(&msg(0, &wire)).unwrap();
        error_of(&mut t)
    };

    let mut damaged = good(b"hello");
    *damaged.last_mut().unwrap() ^= 1;
    let (code, m) = push("damaged", damaged);
    assert_eq!(code, ErrorCode::BadMessage, "{m}");
    assert!(m.contains("checksum mismatch"), "{m}");

    let (code, m) = push("short", good(b"hell"));
    assert_eq!(code, ErrorCode::BadMessage, "{m}");
    assert!(m.contains("announced 5 bytes"), "{m}");

    for name in ["damaged", "short"] {
        assert!(matches!(c.stat(name), Err(ClientError::NotFound(_))), "{name} is visible");
        // Nothing of the bad message was kept: the upload still holds 0 bytes.
        let mut p = c.open_push(name, 0, None, None).unwrap();
        p.write(b"fine!").unwrap();
        assert_eq!(p.finish(true).unwrap().received, 5);
    }
}

/// Wait (bounded) until the server's only binding has received `n` messages.
fn wait_received(c: &Client, n: u64) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let got = c.bindings().unwrap().first().map_or(0, |b| b.messages_in);
        if got == n {
            return;
        }
        assert!(got < n && Instant::now() < until, "server has {got} messages, expected {n}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn udp_bindings_count_injected_loss_and_reordering_on_both_sides() {
    use bs_binding::Inject;
    let (_s, c) = server();
    let p = Profile::builder()
        .loss_ppm(200_000)
        .transport(TransportKind::Udp)
        .transport(TransportKind::Tcp)
        .layer(LayerSpec::Checksum(bs_binding::SumAlgo::Xxh3))
        .max_message(1000)
        .build()
        .unwrap();
    let bound = c.bind(BindEndpoint::Sink, &p, &Floor::default(), "udp", None).unwrap();
    assert_eq!(bound.transport, "udp");
    assert_eq!(wait_bindings(&c, 1)[0].transport, "udp");
    let mut b = bound.binding;
    // Lose every tenth datagram (seq 3, 13, …); send every 25th (7, 32, …) after the next.
    b.inject(|seq| match (seq % 10, seq % 25) {
        (3, _) => Inject::Drop,
        (_, 7) => Inject::Hold,
        _ => Inject::Send,
    });
    let mut delivered = 0;
    for batch in 0..20u64 {
        if batch == 10 {
            // Renegotiate mid-stream: datagrams name the profile epoch they were encoded in.
            let r = b
                .renegotiate(Profile {
                    layers: vec!["checksum:blake3".parse().unwrap()],
                    ..b.profile().clone()
                })
                .unwrap();
            assert!(matches!(r, Renegotiated::Applied(_)), "{r:?}");
        }
        for seq in batch * 25..(batch + 1) * 25 {
            b.send(&[seq as u8; 1000]).unwrap();
            if seq % 10 != 3 {
                delivered += 1;
            }
        }
        // Flow control for the test only: let the receiver keep up, so the only losses are
        // the injected ones (a real lossy link is the chaos script's business).
        wait_received(&c, delivered);
    }
    let r = b.finish_datagrams().unwrap();
    assert_eq!((r.count, r.lost, r.reordered, r.duplicates), (450, 50, 20, 0));
    let mine = b.counters().snapshot();
    assert_eq!((mine.lost, mine.reordered, mine.wire_out_count), (50, 20, 500));
    b.close();
    wait_bindings(&c, 0);
}

#[test]
fn udp_is_only_for_lossy_streams_into_the_sink() {
    let (_s, c) = server();
    let reliable = Profile::builder().transport(TransportKind::Udp).build().unwrap();
    let e = c.bind(BindEndpoint::Sink, &reliable, &Floor::default(), "", None).unwrap_err();
    assert!(matches!(&e, ClientError::Refused(m) if m.contains("tolerate loss")), "{e}");
    let lossy = Profile { loss_ppm: 1000, ..reliable };
    let e = c.bind(BindEndpoint::Echo, &lossy, &Floor::default(), "", None).unwrap_err();
    assert!(matches!(&e, ClientError::Refused(_)), "{e}");
    let falls_back = Profile { transports: vec![TransportKind::Udp, TransportKind::Tcp], ..lossy };
    let b = c.bind(BindEndpoint::Source, &falls_back, &Floor::default(), "", None).unwrap();
    assert_eq!(b.transport, "tcp");
}

#[test]
fn idle_bindings_hold_no_transfer_slot_and_have_a_limit_of_their_own() {
    let cfg = ServerConfig { max_connections: 1, max_bindings: 2, ..ServerConfig::ephemeral() };
    let (_s, c) = server_with(cfg);
    let p = layers(&[]);
    let mut held: Vec<_> = (0..2).map(|_| echo(&c, &p).binding).collect();
    for b in &mut held {
        assert_eq!(&b.request(b"here").unwrap()[..], b"here");
    }
    // Both bindings open and idle: a transfer still finds the one transfer slot.
    let route = bs_client::RouteRequest { size: Some(5), ..Default::default() };
    c.push_all("blob", b"bytes", Some(route)).unwrap();
    let mut back = c.open_pull("blob", 0, None).unwrap();
    let mut out = vec![0; 5];
    back.read_exact_to_end(&mut out).unwrap();
    assert_eq!(out, b"bytes");
    // A third binding is turned away as busy, and the two stay.
    let mut third = echo(&c, &p).binding;
    let e = third.request(b"room?").unwrap_err();
    assert!(
        matches!(&e, BindingError::Remote { code: ErrorCode::Busy, message } if message.contains("binding limit")),
        "{e:?}"
    );
    assert_eq!(&held[0].request(b"still").unwrap()[..], b"still");
    // One closed makes room (once the server has seen it go: asked again until then).
    held.pop().unwrap().close();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let mut next = echo(&c, &p).binding;
        match next.request(b"in") {
            Ok(back) => break assert_eq!(&back[..], b"in"),
            Err(e) => assert!(Instant::now() < until, "no room after a close: {e:?}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
