//! blobstream's data-plane vocabulary: the binary frame format, end-to-end digests and the
//! pooled, reference-counted buffers payload bytes travel in. Pure logic, no I/O (like
//! `quinn-proto`): the `transport` crate drives it over sockets.

pub mod alloc;
pub mod chunks;
pub mod digest;
pub mod error;
pub mod frame;
pub mod pool;
pub mod xxh3;

pub use chunks::{CHUNK_SIZE, ChunkChecker, ChunkDigests, ChunkHasher};
pub use digest::{Digest, DigestAlgo, Hasher};
pub use error::WireError;
pub use frame::{
    ErrorCode, Frame, FrameKind, HEADER_LEN, Header, MAX_BODY_LEN, RenegStep, TOKEN_LEN,
};
pub use pool::{BufferPool, PooledBuf, SizedPools};
