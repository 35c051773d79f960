//! Errors a benchmark can meet, named after the path that failed.

use thiserror::Error;

use crate::model::{Mode, Path};

#[derive(Debug, Error)]
pub enum BenchError {
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("blobstream client: {0}")]
    Client(#[from] bs_client::ClientError),
    #[error("blobstream server: {0}")]
    Server(#[from] bs_server::ServerError),
    #[error("blobstream store: {0}")]
    Store(#[from] bs_store::StoreError),
    #[error("binding: {0}")]
    Binding(#[from] bs_binding::BindingError),
    #[error("gRPC baseline: {0}")]
    Grpc(String),
    #[error("iperf3: {0}")]
    Iperf3(String),
    #[error("{path} is not available: {reason}")]
    Unavailable { path: Path, reason: String },
    #[error("{path} {mode} of {size} bytes delivered wrong bytes: {detail}")]
    Corrupt { path: Path, mode: Mode, size: u64, detail: String },
    #[error("imaging: {0}")]
    Imaging(#[from] bs_imaging::ImagingError),
    #[error("filter baseline (Python): {0}")]
    Baseline(String),
    #[error("invalid benchmark request: {0}")]
    Invalid(String),
    #[error("blobstream HTTP server: {0}")]
    Web(#[from] bs_web::WebError),
    #[error("image index: {0}")]
    Meta(#[from] bs_meta::MetaError),
    #[error("image encoding: {0}")]
    ImageIo(#[from] bs_imageio::ImageIoError),
    #[error("nginx: {0}")]
    Nginx(String),
    #[error("wrk: {0}")]
    Wrk(String),
    #[error("HTTP: {0}")]
    Http(String),
    #[error("{server} served wrong bytes for {url}: {detail}")]
    HttpCorrupt { server: &'static str, url: String, detail: String },
}

impl BenchError {
    /// An I/O error with what was being done.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }

    /// A gRPC status or transport error, with its causes.
    pub(crate) fn grpc(e: impl std::error::Error) -> Self {
        let mut msg = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            msg.push_str(": ");
            msg.push_str(&c.to_string());
            cause = c.source();
        }
        Self::Grpc(msg)
    }
}
