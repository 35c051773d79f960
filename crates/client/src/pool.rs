//! Data connections kept between transfers: a server that announces a keep-alive
//! (`NegotiateResponse.keepalive_ms`) waits that long after a transfer for the connection's
//! next HELLO, so the next transfer to the same data endpoint skips the TCP (and TLS)
//! handshake. Each transfer on it presents its own one-time token, or asks in band (a
//! `NEGOTIATE` frame in place of the control plane's call, where the server offers it).
//!
//! A connection goes back only after its transfer ended cleanly (a pull verified, a push
//! acknowledged) and is kept for half the server's keep-alive, so it is never reused just as
//! the server gives up on it; one that the server closed anyway is noticed when reused and
//! the transfer redials with the same (unredeemed) token.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bs_transport::Conn;

/// Most idle connections one client keeps (across its data endpoints).
const MAX_IDLE: usize = 16;

/// Where a data connection may be reused: its endpoint, whether it speaks TLS, and the socket
/// buffer size its client asked for (0 = kernel autotuning). A socket whose buffers were set
/// once cannot go back to autotuning, so a client that asks for none must not be handed one
/// that a clone with other settings pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key {
    pub(crate) endpoint: String,
    pub(crate) tls: bool,
    pub(crate) socket_buffer: u32,
}

#[derive(Debug)]
struct Idle {
    key: Key,
    conn: Conn,
    until: Instant,
    keepalive: Duration,
}

/// A client's idle data connections (shared by its clones).
#[derive(Debug, Default)]
pub(crate) struct DataPool {
    idle: Mutex<Vec<Idle>>,
}

impl DataPool {
    /// The most recently returned live connection to `key`, if any.
    pub(crate) fn take(&self, key: &Key) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        idle.retain(|i| i.until > now);
        while let Some(at) = idle.iter().rposition(|i| i.key == *key) {
            let mut conn = idle.remove(at).conn;
            // Readable while idle means closed by the server (or out of step): not reusable.
            if let Ok(false) = conn.readable(Duration::ZERO) {
                return Some(conn);
            }
        }
        None
    }

    /// The most recently returned live connection to any endpoint used with socket buffers of
    /// `socket_buffer` bytes, with its key and the server's keep-alive (a client talks to one
    /// server: for an in-band request).
    pub(crate) fn take_any(&self, socket_buffer: u32) -> Option<(Key, Conn, Duration)> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        idle.retain(|i| i.until > now);
        while let Some(at) = idle.iter().rposition(|i| i.key.socket_buffer == socket_buffer) {
            let mut i = idle.remove(at);
            if let Ok(false) = i.conn.readable(Duration::ZERO) {
                return Some((i.key, i.conn, i.keepalive));
            }
        }
        None
    }

    pub(crate) fn give(&self, key: Key, conn: Conn, keepalive: Duration) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() >= MAX_IDLE {
            idle.remove(0);
        }
        idle.push(Idle { key, conn, until: Instant::now() + keepalive / 2, keepalive });
    }

    /// How many connections wait.
    pub(crate) fn len(&self) -> usize {
        self.idle.lock().unwrap().len()
    }
}

/// A transfer's data connection: goes back to its pool when dropped, if [`Pooled::done`]
/// was called (the transfer ended cleanly) and the server keeps connections alive.
#[derive(Debug)]
pub(crate) struct Pooled {
    conn: Option<Conn>,
    back: Option<(Arc<DataPool>, Key, Duration)>,
    clean: bool,
    /// Taken from the pool rather than dialled for this transfer.
    pub(crate) reused: bool,
}

impl Pooled {
    /// A connection that returns to `pool` under `key` for `keepalive` once done.
    pub(crate) fn new(
        conn: Conn,
        pool: Arc<DataPool>,
        key: Key,
        keepalive: Duration,
        reused: bool,
    ) -> Self {
        let back = (!keepalive.is_zero()).then_some((pool, key, keepalive));
        Self { conn: Some(conn), back, clean: false, reused }
    }

    /// The transfer ended cleanly: the connection may carry another.
    pub(crate) fn done(&mut self) {
        self.clean = true;
    }

    /// Whether the server keeps this connection open after a transfer (for the next).
    pub(crate) fn kept_alive(&self) -> bool {
        self.back.is_some()
    }
}

impl std::ops::Deref for Pooled {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn.as_ref().expect("present until dropped")
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("present until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let (true, Some((pool, key, keepalive)), Some(conn)) =
            (self.clean, self.back.take(), self.conn.take())
        {
            pool.give(key, conn, keepalive);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    fn pair() -> (Conn, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (Conn::new(c), l.accept().unwrap().0)
    }

    fn key(e: &str) -> Key {
        Key { endpoint: e.into(), tls: false, socket_buffer: 0 }
    }

    #[test]
    fn only_clean_connections_return_and_only_to_their_endpoint() {
        let pool = Arc::new(DataPool::default());
        let long = Duration::from_secs(60);
        let (a, _sa) = pair();
        drop(Pooled::new(a, pool.clone(), key("h:1"), long, false));
        assert_eq!(pool.len(), 0, "a transfer that did not end cleanly closes its connection");
        let (b, _sb) = pair();
        let mut p = Pooled::new(b, pool.clone(), key("h:1"), long, false);
        p.done();
        drop(p);
        assert_eq!(pool.len(), 1);
        assert!(pool.take(&key("h:2")).is_none());
        assert!(pool.take(&Key { tls: true, ..key("h:1") }).is_none());
        assert!(pool.take(&Key { socket_buffer: 4 << 20, ..key("h:1") }).is_none());
        assert!(pool.take(&key("h:1")).is_some());
        assert_eq!(pool.len(), 0);
        let (c, _sc) = pair();
        let mut p = Pooled::new(c, pool.clone(), key("h:1"), Duration::ZERO, false);
        p.done();
        drop(p);
        assert_eq!(pool.len(), 0, "no keep-alive from the server: nothing kept");
    }

    /// A connection whose buffers a clone pinned never serves a client that leaves them to the
    /// kernel, in band either: the kernel cannot take back a set size.
    #[test]
    fn in_band_reuse_keeps_to_the_socket_buffer_asked_for() {
        let pool = Arc::new(DataPool::default());
        let long = Duration::from_secs(60);
        let (a, _sa) = pair();
        let pinned = Key { socket_buffer: 4 << 20, ..key("h:1") };
        let mut p = Pooled::new(a, pool.clone(), pinned.clone(), long, false);
        p.done();
        drop(p);
        assert!(pool.take_any(0).is_none());
        assert_eq!(pool.len(), 1, "still there for a client that asks for 4 MiB");
        let (b, _sb) = pair();
        let mut p = Pooled::new(b, pool.clone(), key("h:1"), long, false);
        p.done();
        drop(p);
        assert_eq!(pool.take_any(0).map(|t| t.0), Some(key("h:1")));
        assert_eq!(pool.take_any(4 << 20).map(|t| t.0), Some(pinned));
        assert_eq!(pool.len(), 0);
    }

    #[test]
    fn a_connection_the_server_closed_is_not_handed_out() {
        let pool = Arc::new(DataPool::default());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let observer = c.try_clone().unwrap();
        let server_side = l.accept().unwrap().0;
        let mut p =
            Pooled::new(Conn::new(c), pool.clone(), key("h:1"), Duration::from_secs(60), false);
        p.done();
        drop(p);
        drop(server_side);
        // Wait until the close has arrived (peek returns 0 at end of stream).
        observer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(observer.peek(&mut [0u8; 1]).unwrap(), 0);
        assert!(pool.take(&key("h:1")).is_none());
        assert_eq!(pool.len(), 0);
    }
}
