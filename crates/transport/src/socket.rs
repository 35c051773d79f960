//! Per-transfer socket tuning — the Blob Streaming paper's main lesson was that hooks to size
//! socket buffers and disable Nagle matter more than anything else in the framework.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

/// Socket parameters agreed for one transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketOptions {
    /// `SO_SNDBUF` in bytes; `None` leaves the kernel's autotuning alone.
    pub send_buffer: Option<u32>,
    /// `SO_RCVBUF` in bytes; `None` leaves the kernel's autotuning alone.
    pub recv_buffer: Option<u32>,
    /// `TCP_NODELAY`: send small control frames at once.
    pub nodelay: bool,
    /// Longest wait for the peer on a single read or write; `None` waits forever.
    pub io_timeout: Option<Duration>,
}

impl Default for SocketOptions {
    fn default() -> Self {
        Self { send_buffer: None, recv_buffer: None, nodelay: true, io_timeout: None }
    }
}

impl SocketOptions {
    /// Apply to a connected (or accepted) socket. With no send buffer chosen, a far peer's
    /// connection gets a larger one than autotuning gives (see [`crate::far`]).
    pub fn apply(&self, s: &TcpStream) -> io::Result<()> {
        self.apply_all_but_timeouts(s)?;
        s.set_read_timeout(self.io_timeout)?;
        s.set_write_timeout(self.io_timeout)?;
        Ok(())
    }

    /// [`SocketOptions::apply`] but for the timeouts (which a connection also sets for
    /// deadlines of its own: see `Conn::apply`).
    pub(crate) fn apply_all_but_timeouts(&self, s: &TcpStream) -> io::Result<()> {
        let sock = socket2::SockRef::from(s);
        self.apply_buffers(&sock)?;
        if self.send_buffer.is_none() {
            crate::far::size_for_path(s);
        }
        s.set_nodelay(self.nodelay)
    }

    /// Set only the socket buffers (best effort is the caller's choice: the kernel caps them).
    pub fn apply_buffers_to(&self, s: &TcpStream) -> io::Result<()> {
        self.apply_buffers(&socket2::SockRef::from(s))
    }

    fn apply_buffers(&self, sock: &socket2::SockRef<'_>) -> io::Result<()> {
        if let Some(n) = self.send_buffer {
            sock.set_send_buffer_size(n as usize)?;
        }
        if let Some(n) = self.recv_buffer {
            sock.set_recv_buffer_size(n as usize)?;
        }
        Ok(())
    }

    /// Connect with buffer sizes set *before* the handshake, so TCP window scaling sees them.
    pub fn connect(&self, addr: SocketAddr, connect_timeout: Duration) -> io::Result<TcpStream> {
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        self.apply_buffers(&socket2::SockRef::from(&sock))?;
        sock.connect_timeout(&addr.into(), connect_timeout)?;
        let s: TcpStream = sock.into();
        self.apply(&s)?;
        Ok(s)
    }
}

/// Connect to `addr` (`host:port`), trying each address it resolves to within `wait` each;
/// the error names the last failure. `TCP_NODELAY` is set (message streams).
pub fn connect_any(addr: &str, wait: Duration) -> io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr} has no address"));
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, wait) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn options_reach_the_socket() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let opts = SocketOptions {
            send_buffer: Some(1 << 20),
            recv_buffer: Some(1 << 20),
            nodelay: true,
            io_timeout: Some(Duration::from_secs(3)),
        };
        let s = opts.connect(l.local_addr().unwrap(), Duration::from_secs(3)).unwrap();
        assert!(s.nodelay().unwrap());
        assert_eq!(s.read_timeout().unwrap(), Some(Duration::from_secs(3)));
        // Linux doubles the requested size for bookkeeping.
        assert!(socket2::SockRef::from(&s).send_buffer_size().unwrap() >= 1 << 20);
    }
}
