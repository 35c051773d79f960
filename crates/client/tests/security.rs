//! TLS on both planes and bearer-token authentication on the control plane, against a real
//! server on port 0 with a certificate made for the test.

use std::sync::Arc;

use bs_client::{Client, ClientError, RouteRequest, Security, TlsClient};
use bs_server::{BackgroundServer, ServerConfig};
use bs_store::MemStore;
use bs_transport::TlsServer;

struct Pki {
    cert: String,
    key: String,
}

fn pki() -> Pki {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    Pki { cert: c.cert.pem(), key: c.signing_key.serialize_pem() }
}

fn secure_server(p: &Pki) -> BackgroundServer {
    let cfg = ServerConfig {
        auth_token: Some("s3cret".into()),
        tls: Some(TlsServer::from_pem(p.cert.as_bytes(), p.key.as_bytes()).unwrap()),
        ..ServerConfig::ephemeral()
    };
    BackgroundServer::start(Arc::new(MemStore::new()), cfg).unwrap()
}

fn security(ca: &str, token: Option<&str>) -> Security {
    Security {
        auth_token: token.map(str::to_string),
        tls: Some(TlsClient::from_pem(ca.as_bytes(), Some("localhost".into())).unwrap()),
    }
}

#[test]
fn tls_and_token_carry_a_push_and_a_pull() {
    let p = pki();
    let s = secure_server(&p);
    let c = Client::connect_with(&s.control_addr().to_string(), security(&p.cert, Some("s3cret")))
        .unwrap();
    let bytes: Vec<u8> = (0..2_000_000u32).map(|i| (i % 241) as u8).collect();
    let route = RouteRequest { size: Some(bytes.len() as u64), ..Default::default() };
    let mut push = c.open_push("secret/scan", 0, None, Some(route)).unwrap();
    push.write(&bytes).unwrap();
    assert!(push.finish(true).unwrap().committed.is_some());
    let mut pull = c.open_pull("secret/scan", 0, None).unwrap();
    let mut out = vec![0u8; bytes.len()];
    pull.read_exact_to_end(&mut out).unwrap();
    assert_eq!(out, bytes);
}

#[test]
fn missing_or_wrong_tokens_are_unauthenticated() {
    let p = pki();
    let s = secure_server(&p);
    for token in [None, Some("guess")] {
        let c =
            Client::connect_with(&s.control_addr().to_string(), security(&p.cert, token)).unwrap();
        let e = c.stat("anything").unwrap_err();
        assert!(matches!(e, ClientError::Unauthenticated(_)), "{token:?}: {e:?}");
        assert!(matches!(c.open_pull("anything", 0, None), Err(ClientError::Unauthenticated(_))));
    }
}

#[test]
fn plaintext_or_untrusted_clients_cannot_talk_to_a_tls_server() {
    let p = pki();
    let s = secure_server(&p);
    let addr = s.control_addr().to_string();
    // Plaintext HTTP/2 against TLS: the call fails, nothing is served.
    if let Ok(c) = Client::connect(&addr) {
        assert!(c.stat("x").is_err());
    }
    // A client trusting another CA refuses the server's certificate.
    let other = pki();
    match Client::connect_with(&addr, security(&other.cert, Some("s3cret"))) {
        Err(ClientError::Connect { .. }) => {}
        Ok(c) => assert!(c.stat("x").is_err(), "untrusted server was accepted"),
        Err(e) => panic!("unexpected {e:?}"),
    }
}

#[test]
fn tls_alone_needs_no_token() {
    let p = pki();
    let cfg = ServerConfig {
        tls: Some(TlsServer::from_pem(p.cert.as_bytes(), p.key.as_bytes()).unwrap()),
        ..ServerConfig::ephemeral()
    };
    let s = BackgroundServer::start(Arc::new(MemStore::new()), cfg).unwrap();
    let c = Client::connect_with(&s.control_addr().to_string(), security(&p.cert, None)).unwrap();
    let route = RouteRequest { size: Some(1), ..Default::default() };
    let mut push = c.open_push("tls", 0, None, Some(route)).unwrap();
    push.write(b"x").unwrap();
    assert_eq!(push.finish(true).unwrap().received, 1);
    // A plaintext client is told the data plane needs TLS only if it gets that far; the
    // control plane already refuses it.
    let plain = Client::connect(&s.control_addr().to_string());
    assert!(plain.map(|c| c.stat("tls").is_err()).unwrap_or(true));
}

/// A client asked to encrypt its transfers (layer `encrypt`) that does not speak TLS refuses
/// them, small and large, pushes and pulls, rather than sending the bytes in the clear.
#[test]
fn encryption_asked_without_tls_is_refused_not_dropped() {
    let server =
        BackgroundServer::start(Arc::new(MemStore::new()), ServerConfig::ephemeral()).unwrap();
    let plain = Client::connect(&server.control_addr().to_string()).unwrap();
    let route = RouteRequest { size: Some(8), ..Default::default() };
    plain.push_all("clear", b"readable", Some(route)).unwrap();
    let settings = bs_client::TransferSettings {
        layers: vec![bs_binding::LayerSpec::Encrypt],
        ..Default::default()
    };
    let c = plain.clone().with_settings(settings);
    let refused = |e: ClientError| {
        assert!(matches!(&e, ClientError::InvalidArgument(m) if m.contains("encrypt")), "{e}");
    };
    for n in [10usize, 3 << 20] {
        let route = RouteRequest { size: Some(n as u64), ..Default::default() };
        refused(c.push_all("secret", &vec![1u8; n], Some(route)).unwrap_err());
    }
    refused(c.open_pull("clear", 0, None).unwrap_err());
    assert!(plain.stat("secret").is_err(), "nothing stored");
}

/// With a token required, a data connection once admitted by a one-time token grants nothing
/// more to whoever holds it: an in-band request on it must carry the token, as a control-plane
/// call does (the client's own requests do, and go through); one without is refused, the
/// connection closed, and nothing written.
#[test]
fn in_band_requests_carry_the_token_a_call_would() {
    use bs_wire::{ErrorCode, Frame};
    use prost::Message;
    let cfg = ServerConfig { auth_token: Some("tok-123".into()), ..ServerConfig::ephemeral() };
    let s = BackgroundServer::start(Arc::new(MemStore::new()), cfg).unwrap();
    let sec = Security { auth_token: Some("tok-123".into()), tls: None };
    let c = Client::connect_with(&s.control_addr().to_string(), sec).unwrap();
    // Back to back: after the first, these go in band on the kept connection.
    for i in 0..4u8 {
        let route = RouteRequest { size: Some(3), ..Default::default() };
        c.push_all(&format!("p/{i}"), &[i; 3], Some(route)).unwrap();
        let mut back = vec![0u8; 3];
        c.open_pull(&format!("p/{i}"), 0, None).unwrap().read_exact_to_end(&mut back).unwrap();
        assert_eq!(back, [i; 3]);
    }

    // One token got hold of (here: asked with the credential), redeemed for a pull.
    let token: [u8; bs_wire::TOKEN_LEN] = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let url = format!("http://{}", s.control_addr());
        let mut g = bs_proto::blob_store_client::BlobStoreClient::connect(url).await.unwrap();
        let mut req = tonic::Request::new(bs_proto::NegotiateRequest {
            name: "p/0".into(),
            direction: bs_proto::Direction::Pull as i32,
            ..Default::default()
        });
        req.metadata_mut().insert("authorization", "Bearer tok-123".parse().unwrap());
        g.negotiate(req).await.unwrap().into_inner().token.try_into().unwrap()
    });
    let tcp = std::net::TcpStream::connect(s.data_addr()).unwrap();
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let mut conn = bs_transport::Conn::new(tcp);
    conn.write_frame(&Frame::Hello { token }).unwrap();
    let Frame::Data { len, .. } = conn.read_frame().unwrap() else { panic!("no DATA") };
    let mut got = vec![0u8; len as usize];
    conn.recv_data_into(&mut got, None).unwrap();
    assert!(matches!(conn.read_frame().unwrap(), Frame::Sum { .. }));
    // The same connection, asked in band without the token: refused and closed.
    let evil = bs_proto::NegotiateRequest {
        name: "p/evil".into(),
        direction: bs_proto::Direction::Push as i32,
        route: Some(bs_proto::RouteRequest { name: "p/evil".into(), ..Default::default() }),
        ..Default::default()
    };
    conn.write_frame(&Frame::Negotiate { body: evil.encode_to_vec().into() }).unwrap();
    match conn.read_frame().unwrap() {
        Frame::Error { code, message } => {
            assert_eq!(code, ErrorCode::BadToken);
            assert!(message.contains("needs the server's token"), "{message}");
        }
        other => panic!("expected ERROR, got {other:?}"),
    }
    assert!(conn.read_frame().is_err(), "the connection is closed");
    assert!(matches!(c.stat("p/evil"), Err(ClientError::NotFound(_))));
}
