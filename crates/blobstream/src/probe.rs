//! Whether a server answers in TLS: said to a user who connected without it, whose call
//! otherwise failed with only "transport error".

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long the probe waits to connect, and then for the answer.
const WAIT: Duration = Duration::from_secs(2);

/// Whether the server at `addr` (`host:port`) answers bytes that are no TLS handshake with a
/// TLS alert record (content type 21, version 3.x), as a TLS server does.
pub fn speaks_tls(addr: &str) -> bool {
    let Some(at) = addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else { return false };
    let Ok(mut s) = TcpStream::connect_timeout(&at, WAIT) else { return false };
    let _ = s.set_read_timeout(Some(WAIT));
    // HTTP/2's preface, as the client sent it: no TLS record.
    if s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 2];
    s.read_exact(&mut head).is_ok() && head == [0x15, 0x03]
}
