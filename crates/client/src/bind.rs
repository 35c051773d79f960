//! Opening bindings: the client's side of the three-step negotiation. Step one is the `Bind`
//! call with the proposal, step two the server's answer (its offer, perhaps lowered, or a
//! refusal), step three this side's decision against its [`Floor`]: take the offer by opening
//! the data connection with the token, or refuse it (the token is then never used and
//! expires).

use std::sync::Arc;

use bs_binding::{Binding, Floor, Profile, Role, Scheduler, Session};
use bs_proto as pb;
use bs_transport::{SocketOptions, TransportError};
use bs_wire::TOKEN_LEN;

use crate::client::Client;
use crate::error::ClientError;

/// Which of the server's test endpoints to bind to.
pub use bs_proto::BindEndpoint;

/// The server's answer to a proposal (steps one and two): what it can meet.
#[derive(Debug, Clone)]
pub struct BindOffer {
    /// The profile offered (every field at most what was proposed).
    pub profile: Profile,
    /// One line per field the server lowered, saying why.
    pub lowered: Vec<String>,
    /// The transport and address the server chose.
    pub transport: String,
    pub address: String,
    /// The one-time token that takes the offer (by opening the data connection).
    pub token: [u8; TOKEN_LEN],
    /// The data connection speaks TLS.
    pub tls: bool,
    pub binding_id: u64,
    /// udp: where datagrams go, and the socket they leave from.
    pub datagram_address: String,
    pub datagram_socket: Option<Arc<std::net::UdpSocket>>,
}

/// An open binding and how it was agreed.
#[derive(Debug)]
pub struct Bound {
    pub binding: Binding,
    pub lowered: Vec<String>,
    pub transport: String,
    pub address: String,
}

impl Client {
    /// Open a binding to `endpoint` proposing `proposal`; an offer below `floor` is refused
    /// (`ClientError::Refused`, naming why), as is a proposal the server cannot meet at all.
    /// `sched`: the process's scheduler, shared by every binding it opens.
    pub fn bind(
        &self,
        endpoint: BindEndpoint,
        proposal: &Profile,
        floor: &Floor,
        label: &str,
        sched: Option<Arc<Scheduler>>,
    ) -> Result<Bound, ClientError> {
        let offer = self.propose(endpoint, proposal, label)?;
        self.accept(proposal, offer, floor, sched)
    }

    /// Steps one and two: send the proposal, get the server's offer (or its refusal, as
    /// `ClientError::Refused` with the reason).
    pub fn propose(
        &self,
        endpoint: BindEndpoint,
        proposal: &Profile,
        label: &str,
    ) -> Result<BindOffer, ClientError> {
        proposal.validate()?;
        // Should udp be chosen, the server takes datagrams from this socket's port only.
        let udp = if proposal.transports.contains(&bs_binding::TransportKind::Udp) {
            let any: std::net::SocketAddr =
                if self.addr.trim_start_matches("http://").starts_with('[') {
                    "[::]:0".parse().expect("literal")
                } else {
                    "0.0.0.0:0".parse().expect("literal")
                };
            Some(std::net::UdpSocket::bind(any).map_err(|e| ClientError::Connect {
                addr: any.to_string(),
                reason: format!("udp socket: {e}"),
            })?)
        } else {
            None
        };
        let datagram_port = match &udp {
            Some(s) => s.local_addr().map_err(bs_transport::TransportError::from)?.port().into(),
            None => 0,
        };
        let req = pb::BindRequest {
            proposal: Some(proposal.to_pb()),
            endpoint: endpoint as i32,
            host_id: bs_binding::host_id(),
            label: label.into(),
            datagram_port,
        };
        let resp = self.call(|mut c| async move { c.bind(req).await })?;
        if !resp.refused.is_empty() {
            return Err(ClientError::Refused(format!("the server refused: {}", resp.refused)));
        }
        let profile = Profile::from_pb(&resp.offer.unwrap_or_default())?;
        let is_udp = resp.transport == "udp";
        let token: [u8; TOKEN_LEN] =
            resp.token.as_slice().try_into().map_err(|_| {
                ClientError::Protocol("server sent a token of the wrong size".into())
            })?;
        Ok(BindOffer {
            profile,
            lowered: resp.lowered,
            transport: resp.transport,
            address: resp.address,
            token,
            tls: resp.tls,
            binding_id: resp.binding_id,
            datagram_socket: udp.filter(|_| is_udp).map(Arc::new),
            datagram_address: resp.datagram_address,
        })
    }

    /// Step three: take `offer` if it meets `floor` (opening the data connection), or refuse
    /// it with the reason (the token is then never used and expires).
    pub fn accept(
        &self,
        proposal: &Profile,
        offer: BindOffer,
        floor: &Floor,
        sched: Option<Arc<Scheduler>>,
    ) -> Result<Bound, ClientError> {
        bs_binding::negotiate::judge(proposal, &offer.profile, floor)
            .map_err(|r| ClientError::Refused(format!("this side refused the offer: {r}")))?;
        let opts = SocketOptions {
            send_buffer: None,
            recv_buffer: None,
            nodelay: true,
            io_timeout: Some(self.settings.io_timeout),
        };
        let conn = self.dial(&offer.transport, &offer.address, offer.token, offer.tls, opts)?;
        // A binding may sit idle between messages for as long as its user likes (bounded
        // waits: `recv_within`); only a vanished peer ends it.
        conn.watch_for_dead_peer(self.settings.io_timeout).map_err(TransportError::from)?;
        let limits = bs_binding::Limits {
            transports: offer.profile.transports.clone(),
            tls: offer.profile.wants_encryption(),
            ..bs_binding::Limits::default()
        };
        let session = Session::new(Role::Initiator, offer.profile, limits, floor.clone());
        let mut binding = Binding::new(conn, session, offer.binding_id);
        if let Some(s) = sched {
            binding = binding.with_scheduler(s);
        }
        if let Some(sock) = &offer.datagram_socket {
            let sock = sock.try_clone().map_err(bs_transport::TransportError::from)?;
            sock.connect(&offer.datagram_address).map_err(|e| ClientError::Connect {
                addr: offer.datagram_address.clone(),
                reason: format!("udp: {e}"),
            })?;
            binding = binding.with_datagrams(sock);
        }
        Ok(Bound {
            binding,
            lowered: offer.lowered,
            transport: offer.transport,
            address: offer.address,
        })
    }

    /// The server's live bindings and transfers.
    pub fn bindings(&self) -> Result<Vec<pb::BindingStatus>, ClientError> {
        let r = self.call(|mut c| async move { c.bindings(pb::BindingsRequest {}).await })?;
        Ok(r.bindings)
    }
}
