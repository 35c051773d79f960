//! Connections to and from block servers: every one is a binding with the same profile, over
//! TCP and, when the server has a certificate, TLS.

use std::time::Duration;

use bs_binding::{Binding, Floor, Limits, Profile, Role, Session};
use bs_transport::{Conn, TlsClient};

use crate::disk::MAX_BLOCK;
use crate::error::DpssError;
use crate::msg::{self, Message};

/// How long connecting and the `HELLO`/`WELCOME` exchange may take.
pub const CONNECT_WAIT: Duration = Duration::from_secs(10);
/// A peer whose host stops answering is given up after this long.
pub const DEAD_PEER: Duration = Duration::from_secs(20);
/// The most entries a request list may have.
pub const MAX_LIST: usize = 4096;

/// The profile of every block-store binding: no layers, messages up to a block and its header.
pub fn profile() -> Profile {
    Profile { max_message: (MAX_BLOCK + 64 * 1024) as u32, ..Profile::default() }
}

/// A binding on `conn` as every block-store connection runs it.
pub fn binding(conn: Conn, role: Role, id: u64) -> Binding {
    let limits = Limits { max_message: profile().max_message, ..Limits::default() };
    let session = Session::new(role, profile(), limits, Floor::default());
    Binding::new(conn, session, id)
}

/// A block server to connect to: its address, and the CA to trust when it serves TLS.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: String,
    pub tls: Option<TlsClient>,
}

impl Peer {
    pub fn new(addr: impl Into<String>, tls: Option<TlsClient>) -> Self {
        Self { addr: addr.into(), tls }
    }

    /// Connect, say `HELLO` as `role`, and wait for the `WELCOME`.
    pub fn open(&self, hello: &msg::Hello) -> Result<(Binding, msg::Welcome), DpssError> {
        let addr = self.addr.as_str();
        let tcp = bs_transport::connect_any(addr, CONNECT_WAIT)
            .map_err(|e| DpssError::Remote(format!("cannot reach {addr}: {e}")))?;
        let conn = match &self.tls {
            None => Conn::new(tcp),
            Some(t) => Conn::tls_client(tcp, t, bs_transport::host_of(addr))
                .map_err(|e| DpssError::Remote(format!("TLS to {addr}: {e}")))?,
        };
        conn.watch_for_dead_peer(DEAD_PEER)?;
        let mut b = binding(conn, Role::Initiator, 0);
        b.send(&msg::hello(hello))?;
        let answer = b.recv_within(CONNECT_WAIT).map_err(|e| match DpssError::from(e) {
            DpssError::Remote(m) => DpssError::Remote(format!("{addr}: {m}")),
            e => DpssError::Remote(format!(
                "{addr} did not answer HELLO ({e}); if it serves TLS, connect with its CA"
            )),
        })?;
        let m = answer.ok_or_else(|| DpssError::Remote(format!("{addr} did not answer HELLO")))?;
        match Message::parse(m.payload(), 0)? {
            Message::Welcome(w) => Ok((b, w)),
            other => Err(DpssError::Malformed(format!("expected WELCOME, got {other:?}"))),
        }
    }
}
