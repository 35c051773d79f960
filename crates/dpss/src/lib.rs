//! The parallel block store (LBL's Image Server System / DPSS): a data set cut into blocks,
//! declustered over the disks of K block servers, read back through prioritized request lists.

pub mod block;
pub mod cache;
pub mod catalog;
pub mod client;
pub mod conn;
pub mod disk;
pub mod error;
pub mod hilbert;
pub mod layout;
pub mod lists;
pub mod loader;
pub mod master;
pub mod msg;
pub mod placement;
pub mod pyramid;
pub mod server;
pub mod simulate;
pub mod tiffband;

pub use block::{BlockId, Priority};
pub use client::{Client, ClientOptions, Event, OnBlock, Waker};
pub use conn::Peer;
pub use error::DpssError;
pub use layout::{Layout, ServerRef};
pub use server::{BlockServer, ServerConfig, ServerStats};
