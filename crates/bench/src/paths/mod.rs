//! The paths the transfer benchmark compares, each with servers it starts once and reuses.

mod blobstream;
mod grpc;
mod iperf3;
mod raw_tcp;

pub use blobstream::BlobstreamRunner;
pub use grpc::GrpcRunner;
pub use iperf3::{Iperf3Runner, find_on_path};
pub use raw_tcp::RawTcpRunner;

use std::time::Duration;

/// Longest wait for a peer or a server thread before a run counts as failed.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(60);
