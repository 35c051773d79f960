//! Bindings (GOPI): typed, negotiated, layered data connections.
//!
//! A binding is one connection with a QoS [`Profile`] both ends agreed on in three steps
//! (propose → counter → accept/refuse, [`negotiate`]), carrying messages through a [`Stack`] of
//! protocol [`layers`] that push and pop their headers in the headroom of pooled buffers
//! ([`Msg`]). The rules live here without I/O, as `quinn-proto` is to `quinn`:
//! - [`session`]: one binding's state machine — sequence numbers, layers, live renegotiation;
//! - [`transfer`]: the rules of a blob push or pull (ranges, digests, rollback, commit);
//! - [`sched`]: who sends next when several bindings leave one process;
//! - [`udp`]: sequence windows and loss/reorder accounting for datagram bindings.
//!
//! [`driver`] runs a session over a blocking `bs_transport::Conn`; the server's endpoints and
//! the client's `bind`, `put` and `get` are thin users of it.

pub mod carry;
pub mod counters;
pub mod driver;
pub mod error;
pub mod layers;
pub mod msg;
pub mod negotiate;
pub mod qos;
pub mod sched;
pub mod session;
pub mod transfer;
pub mod udp;

pub use carry::Carrier;
pub use counters::{Counters, Snapshot};
pub use driver::{Binding, Inject, Renegotiated, Report};
pub use error::{BindingError, LayerError, Refusal};
pub use layers::{Layer, Stack};
pub use msg::Msg;
pub use negotiate::{Floor, Limits, Offer};
pub use qos::{Codec, Flow, LayerSpec, Profile, ProfileBuilder, SumAlgo, TransportKind};
pub use sched::{Policy, Scheduler};
pub use session::{RenegEvent, Role, Session};

/// This host's identity for "same host?" questions (the kernel's boot id): a peer that sends
/// the same id runs here, so a Unix domain socket can reach it.
pub fn host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
