//! The distributer (the ALMA ACS bulk-data system): one sender, many receivers, every byte
//! delivered or reported.
//!
//! A [`Sender`] sends each flow once to a [`Distributer`], which forwards every message to
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
pub mod sender;
pub mod service;
pub mod target;

pub use config::{Config, FlowSpec, Policy, StreamSpec};
pub use distributer::{Distributer, FlowStatus, ReceiverStatus};
pub use error::DistribError;
pub use msg::Params;
pub use receiver::{FlowHandler, Receiver, RunEnd};
pub use sender::{Dropped, ReceiverOutcome, Sender, StopReport};
pub use target::Target;
