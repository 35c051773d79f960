//! Real peer servers for tests and benchmarks: a PostgreSQL server ([`Postgres`]) and a
//! Garage S3 cluster ([`Garage`]), each started in a throwaway directory on free loopback
//! ports and stopped — directory removed — when dropped or when the process that started it
//! exits, however it exits (see [`guard`]).
//!
//! Where their programs are: `BLOBSTREAM_PG_BIN` (a directory holding `initdb` and
//! `postgres`) and `BLOBSTREAM_GARAGE` (the `garage` binary); when unset, the repository's
//! `scripts/peers-setup.sh` is run to install them (cached after the first run) and say.

mod error;
mod garage;
mod guard;
mod postgres;
mod setup;

pub use error::PeerError;
pub use garage::{Garage, GarageNode, S3Endpoint};
pub use postgres::Postgres;
pub use setup::{free_port, garage_binary, pg_bin_dir};
