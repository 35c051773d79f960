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
