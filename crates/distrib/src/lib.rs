//! The distributer (the ALMA ACS bulk-data system): one sender, many receivers, every byte
//! delivered or reported.
//!
//! A [`Sender`] sends each flow once to a [`Distributer`] (over a connection, or in the
//! distributer's own process: [`Distributer::sender`]), which forwards every message to
//! every receiver of that flow in parallel — the same pooled buffer to each receiver's queue,
//! one thread per receiver connection — and a [`Receiver`] hands what arrives to a
//! [`FlowHandler`]. `stop` returns only when every receiver has confirmed the exact total and
//! digest, or has been reported by name with the reason. A slow receiver holds the others
//! back only under the flow's `hold` policy ([`config::Policy`]).
//!
//! Every connection is a binding (`bs_binding`); the messages on it are in [`msg`].

pub mod config;
pub mod distributer;
pub mod error;
pub mod msg;
pub mod receiver;
mod run;
pub mod sender;
pub mod service;
pub mod target;
pub mod udp;

pub use config::{Config, FlowSpec, Policy, StreamSpec, Transport};

/// The socket options giving a flow's connection its `socket_buffer` of `n` bytes on the side
/// that moves the bytes: at the peer's own end (`at_peer`) a sender's sends and a receiver's
/// receives; the distributer's end of the same connection does the opposite.
pub(crate) fn flow_buffers(
    peer_is_sender: bool,
    at_peer: bool,
    n: u64,
) -> bs_transport::SocketOptions {
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    let sends = peer_is_sender == at_peer;
    bs_transport::SocketOptions {
        send_buffer: sends.then_some(n),
        recv_buffer: (!sends).then_some(n),
        nodelay: true,
        io_timeout: None,
    }
}
pub use distributer::{Distributer, FlowStatus, ReceiverStatus};
pub use error::DistribError;
pub use msg::Params;
pub use receiver::{FlowHandler, Receiver, RunEnd};
pub use sender::{Dropped, ReceiverOutcome, Sender, StopReport};
pub use target::Target;
