//! What the transfer benchmark measures and what one measurement says.

use std::fmt;

/// Direction of a transfer, seen from the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// The client sends the blob; done when the server confirms it has every byte.
    Push,
    /// The client asks for the blob and receives it.
    Pull,
}

impl Mode {
    pub const ALL: [Mode; 2] = [Mode::Push, Mode::Pull];

    /// Name used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Push => "push",
            Self::Pull => "pull",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A way of moving the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Path {
    /// A blobstream server over a memory store and a blobstream client.
    Blobstream,
    /// Plain TCP sockets: a length prefix, the bytes, a one-byte confirmation.
    RawTcp,
    /// The `GrpcBaseline` service: the bytes as a stream of 1 MiB messages.
    Grpc,
    /// The iperf3 tool, as the reference of what the loopback can do.
    Iperf3,
}

impl Path {
    pub const ALL: [Path; 4] = [Path::Blobstream, Path::RawTcp, Path::Grpc, Path::Iperf3];

    /// Name used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Blobstream => "blobstream",
            Self::RawTcp => "raw_tcp",
            Self::Grpc => "grpc",
            Self::Iperf3 => "iperf3",
        }
    }

    /// Name for prose and Markdown headers.
    pub fn label(self) -> &'static str {
        match self {
            Self::Blobstream => "blobstream",
            Self::RawTcp => "raw TCP",
            Self::Grpc => "gRPC",
            Self::Iperf3 => "iperf3",
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The median throughput of one path, mode, size and socket buffer setting.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub mode: Mode,
    pub size_bytes: u64,
    pub path: Path,
    /// `SO_SNDBUF`/`SO_RCVBUF` on both ends; 0 = kernel default (autotuning).
    pub socket_buffer: u32,
    /// Median of the runs, in Gbit/s (bytes × 8 / seconds / 10⁹).
    pub gbit_per_s: f64,
    /// Timed runs (the warm-up is not counted).
    pub runs: u32,
    /// Transfers each run makes (the paths taking turns transfer by transfer), each its own
    /// (request, bytes, confirmation); a run's rate is their bytes over their summed time.
    pub per_run: u32,
    /// Each timed run's Gbit/s, in run order. Runs of different paths with the same index
    /// ran back to back (interleaved), so they are compared pairwise.
    pub samples: Vec<f64>,
}
