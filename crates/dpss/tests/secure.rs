//! The master's plane with TLS and a token (`master::start_secure`): only a client that trusts
//! its certificate and presents the token is answered, each other one is told why, and block
//! servers that report with the same credentials come up.

use std::time::{Duration, Instant};

use bs_dpss::master::{self, fetch_status};
use bs_dpss::{BlockServer, ClientOptions, ServerConfig, loader};
use bs_transport::{TlsClient, TlsServer};

#[test]
fn the_master_answers_only_trusted_tls_with_the_token() {
    let id = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (id.cert.pem(), id.signing_key.serialize_pem());
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let secure = bs_plane::Secure {
        tls: Some(TlsServer::from_pem(cert.as_bytes(), key.as_bytes()).unwrap()),
        token: Some("s3cret".into()),
        ..Default::default()
    };
    let bound =
        master::start_secure(&rt, "127.0.0.1:0", &dir.path().join("names.db"), secure).unwrap();
    // Reached by name: the certificate names localhost.
    let addr = bound.replace("127.0.0.1", "localhost");
    let trust = TlsClient::from_pem(cert.as_bytes(), None).unwrap();
    let good = ClientOptions { tls: Some(trust.clone()), token: Some("s3cret".into()) };
    assert!(fetch_status(&addr, &good).unwrap().servers.is_empty());

    let refused = |opts: ClientOptions| fetch_status(&addr, &opts).unwrap_err().to_string();
    let e = refused(ClientOptions { token: Some("guess".into()), ..good.clone() });
    assert!(e.contains("wrong token"), "{e}");
    let e = refused(ClientOptions { token: None, ..good.clone() });
    assert!(e.contains("requires a token"), "{e}");
    let e = refused(ClientOptions { tls: None, ..good.clone() });
    assert!(e.contains("if it speaks TLS"), "a plain client is told why: {e}");
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let stranger = TlsClient::from_pem(other.cert.pem().as_bytes(), None).unwrap();
    let e = refused(ClientOptions { tls: Some(stranger), ..good.clone() });
    assert!(e.contains("over TLS"), "an untrusted certificate is refused: {e}");

    // A block server reporting with the credentials comes up.
    let mut cfg = ServerConfig::new(vec![dir.path().join("member")]);
    cfg.name = "member".into();
    let srv = BlockServer::start("127.0.0.1:0", cfg).unwrap();
    master::heartbeat(addr.clone(), good.clone(), Duration::from_millis(50), srv.stats_source())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while loader::live_servers(&addr, &good).map_or(0, |s| s.len()) == 0 {
        assert!(Instant::now() < deadline, "the member never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A report without the token is refused and changes nothing.
    let intruder = bs_proto::DpssServerStatus {
        name: "intruder".into(),
        addr: "127.0.0.1:9".into(),
        ..Default::default()
    };
    let no_token = ClientOptions { token: None, ..good.clone() };
    let refused = bs_dpss::client::block_on(async {
        let mut c = master::connect(&addr, &no_token).await.unwrap();
        c.heartbeat(intruder).await.unwrap_err()
    });
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let names: Vec<String> =
        fetch_status(&addr, &good).unwrap().servers.into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["member"]);
}

/// With an admin token, the reader's token reads and nothing more: a block server's report,
/// a load and a drop need the admin token, at the master and at the block servers alike.
#[test]
fn the_readers_token_reads_and_only_the_admin_token_changes_what_is_served() {
    use bs_dpss::layout::Layout;
    use bs_dpss::pyramid::Synthetic;
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let secure = bs_plane::Secure {
        token: Some("reader".into()),
        admin_token: Some("admin".into()),
        ..Default::default()
    };
    let addr =
        master::start_secure(&rt, "127.0.0.1:0", &dir.path().join("names.db"), secure).unwrap();
    let reader = ClientOptions { token: Some("reader".into()), tls: None };
    let admin = ClientOptions { token: Some("admin".into()), tls: None };
    let mut cfg = ServerConfig::new(vec![dir.path().join("d0")]);
    cfg.token = Some("reader".into());
    cfg.admin_token = Some("admin".into());
    let srv = BlockServer::start("127.0.0.1:0", cfg).unwrap();
    // A report with the reader's token is refused; with the admin's, the server comes up.
    let intruder = bs_proto::DpssServerStatus {
        name: "intruder".into(),
        addr: "127.0.0.1:9".into(),
        ..Default::default()
    };
    let refused = bs_dpss::client::block_on(async {
        let mut c = master::connect(&addr, &reader).await.unwrap();
        c.heartbeat(intruder).await.unwrap_err()
    });
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert!(refused.message().contains("admin token"), "{}", refused.message());
    master::heartbeat(addr.clone(), admin.clone(), Duration::from_millis(50), srv.stats_source())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let servers = loop {
        // Status is reading: the reader's token does (until the first report, the master
        // says it knows no live server).
        if let Ok(s) = loader::live_servers(&addr, &reader)
            && !s.is_empty()
        {
            break s;
        }
        assert!(Instant::now() < deadline, "the server never came up");
        std::thread::sleep(Duration::from_millis(20));
    };
    let src = Synthetic { width: 512, height: 512, tile: 256 };
    let plan = || Layout::plan("img", "image", (512, 512), 256, servers.clone(), 1).unwrap();
    // Loading with the reader's token: refused, nothing published.
    let e = loader::load(&addr, plan(), &src, &reader, &mut |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("admin token"), "{e}");
    assert!(bs_dpss::client::lookup(&addr, "img", &reader).is_err());
    // Nor may a reader take the loader role at the block server itself.
    let hello = |token: &str| bs_dpss::msg::Hello {
        role: "loader".into(),
        session: String::new(),
        token: token.into(),
    };
    let peer = bs_dpss::conn::Peer::new(srv.addr().to_string(), None);
    let e = peer.open(&hello("reader")).unwrap_err().to_string();
    assert!(e.contains("admin token"), "{e}");
    // The admin loads; the reader reads every block back; the reader cannot drop it.
    loader::load(&addr, plan(), &src, &admin, &mut |_, _| {}).unwrap();
    let mut c = bs_dpss::Client::open(&addr, "img", reader.clone()).unwrap();
    let all: Vec<_> = c.layout().all_blocks().collect();
    assert_eq!(c.fetch(&all, Duration::from_secs(30)).unwrap().len(), all.len());
    assert!(loader::remove(&addr, "img", &reader).is_err());
    assert!(bs_dpss::client::lookup(&addr, "img", &reader).is_ok());
    loader::remove(&addr, "img", &admin).unwrap();
    assert!(bs_dpss::client::lookup(&addr, "img", &reader).is_err());
}
