//! Errors starting or driving a peer server.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum PeerError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed: {detail}")]
    Command { program: String, detail: String },
    #[error("{0} did not become ready within {1:?}")]
    NotReady(String, std::time::Duration),
    #[error("postgresql: {0}")]
    Postgres(#[from] postgres::Error),
    #[error("peers-setup: {0}")]
    Setup(String),
}

impl PeerError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }
}
