//! Talks to a blobstream server: control-plane calls over gRPC, bulk bytes over the data
//! connections those calls negotiate.
//!
//! The API is synchronous: a [`Client`] owns a small tokio runtime for its gRPC calls (as
//! `reqwest::blocking` does), and data transfers run on the caller's thread with blocking
//! sockets, the fastest path for bulk bytes. Do not call it from inside an async task; the
//! blob crate's asynchronous options run it on a thread of its own.

mod ahead;
mod bind;
mod client;
mod error;
mod pipelined;
mod pool;
mod settings;
mod streams;

pub use bind::{BindEndpoint, BindOffer, Bound};
pub use bs_proto::{BindingStatus, BlobInfo, RouteRequest, RouteResponse, ScrubEvent, scrub_event};
pub use bs_transport::TlsClient;
pub use bs_transport::far::FAR_RTT;
pub use client::{Client, with_default_port};
pub use error::ClientError;
pub use settings::{Security, TransferSettings};
pub use streams::{PullStream, PushAck, PushStream};
