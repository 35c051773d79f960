//! A block server holds little for peers that have proven nothing: a first message announcing
//! more than a HELLO can be is refused before its body is read; past `MAX_UNPROVEN`
//! connections that have not said HELLO, further ones are closed at once (no thread each);
//! once they go, peers connect again.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bs_dpss::conn::Peer;
use bs_dpss::msg::Hello;
use bs_dpss::server::{BlockServer, MAX_UNPROVEN, ServerConfig};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn peers_that_have_not_said_hello_hold_little() {
    let dir = tempfile::tempdir().unwrap();
    let srv =
        BlockServer::start("127.0.0.1:0", ServerConfig::new(vec![dir.path().join("d0")])).unwrap();
    let addr = srv.addr().to_string();

    let mut big = TcpStream::connect(&addr).unwrap();
    let head = bs_wire::Header { kind: bs_wire::FrameKind::Msg, body_len: 0, a: 0, b: 16 << 20 };
    big.write_all(&head.encode()).unwrap();
    match bs_transport::Conn::new(big).read_frame().unwrap() {
        bs_wire::Frame::Error { message, .. } => {
            assert!(message.contains("a greeting is at most"), "{message}")
        }
        other => panic!("expected ERROR, got {other:?}"),
    }

    let silent: Vec<_> = (0..MAX_UNPROVEN).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    // One more: closed without a word (not held until the HELLO wait ends, then told).
    let mut extra = TcpStream::connect(&addr).unwrap();
    extra.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(extra.read(&mut buf).unwrap_or(0), 0, "closed at once, no ERROR frame");
    drop(silent);
    let hello = Hello { role: "loader".into(), session: String::new(), token: String::new() };
    let give_up = Instant::now() + WAIT;
    loop {
        match Peer::new(addr.clone(), None).open(&hello) {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < give_up, "cannot connect again: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
