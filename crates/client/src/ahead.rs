//! Ranged pulls asked ahead on one data connection: while a pull's bytes arrive, the next
//! ranges of the same blob are asked for in band on the same connection (`NEGOTIATE` frames
//! the server reads once the current transfer ends; see `bs_wire::frame`), so the server goes
//! from one range to the next without waiting a round trip, and the connection keeps its
//! congestion window. A copy over several connections pulls its ranges this way in pieces,
//! which lets a connection done with its own work take over the unasked rest of another's
//! range without cutting it short.
//!
//! A connection whose server does not take in-band requests, or does not keep connections
//! alive, takes no requests ahead ([`Client::takes_asks`]).

use std::sync::atomic::Ordering::Relaxed;

use bs_proto as pb;
use bs_transport::TransportError;
use bs_wire::Frame;

use crate::client::{Client, Granted, read_grant};
use crate::error::ClientError;
use crate::streams::PullStream;

type Result<T> = std::result::Result<T, ClientError>;

impl Client {
    /// Ask, on `pull`'s connection, for `length` bytes of the same blob from `offset`, to be
    /// answered after `pull` and the pulls asked before this one; [`Client::next_asked`]
    /// opens it once `pull` has verified. Only where [`Client::takes_asks`] says so. Ranges
    /// start and end where the caller likes; whole stored chunks keep the server's DATA
    /// frames whole.
    pub fn ask_after(&self, pull: &mut PullStream, offset: u64, length: u64) -> Result<()> {
        if !self.takes_asks(pull) {
            return Err(ClientError::InvalidArgument(
                "this pull's connection takes no requests ahead".into(),
            ));
        }
        let name = pull.info().name.clone();
        let req = self.base_request(&name, pb::Direction::Pull, offset, Some(length));
        let body = self.in_band_body(&req);
        // Counted first: once a request may be on its way, the connection is out of step
        // for anyone else, whatever happens to the write.
        pull.asked += 1;
        pull.conn_mut().write_frame(&Frame::Negotiate { body: body.into() })?;
        Ok(())
    }

    /// Whether pulls may be asked after `pull` on its connection ([`Client::ask_after`]):
    /// the server takes requests in band and keeps the connection. (Each pull asked gets
    /// its own answer and its own message layers, as a pull negotiated alone does.)
    pub fn takes_asks(&self, pull: &PullStream) -> bool {
        self.in_band.load(Relaxed) && pull.kept_alive() && !self.encryption_unmet()
    }

    /// The pull asked next on `pull`'s connection ([`Client::ask_after`]), once `pull` has
    /// read to its end and verified: the server's `GRANT` read and its stream opened. A
    /// refusal (the server busy, say) is its status as an error, and the connection is
    /// dropped with whatever else was asked on it.
    pub fn next_asked(&self, pull: PullStream) -> Result<PullStream> {
        if pull.asked == 0 {
            return Err(ClientError::Protocol("no pull was asked after this one".into()));
        }
        let asked = pull.asked - 1;
        let mut conn = pull.into_conn();
        let resp = match read_grant(&mut conn) {
            Granted::Yes(r) => *r,
            Granted::No(status) => return Err(status.into()),
            Granted::Failed(e) => return Err(e),
            Granted::Gone => return Err(TransportError::Closed.into()),
        };
        self.learn(&resp);
        conn.apply(&self.socket_options(&resp)).map_err(TransportError::from)?;
        let mut next = PullStream::open(conn, resp)?;
        next.asked = asked;
        Ok(next)
    }
}
