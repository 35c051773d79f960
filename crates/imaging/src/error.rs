//! Errors of image processing.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ImagingError {
    #[error("unknown filter {name:?} (see `blobstream filters`)")]
    UnknownFilter { name: String },
    #[error("filter {filter}: parameter {param}: {reason}")]
    BadParam { filter: String, param: String, reason: String },
    #[error("filter {filter}: unknown parameter {param:?} (it takes: {known})")]
    UnknownParam { filter: String, param: String, known: String },
    #[error("filter {filter} does not support {kind} images: {reason}")]
    Unsupported { filter: String, kind: String, reason: String },
    #[error("invalid image: {0}")]
    InvalidImage(String),
    #[error("image of {width}×{height} exceeds the limit of {limit} pixels")]
    TooLarge { width: u64, height: u64, limit: u64 },
    #[error("definition file {path}: {reason}")]
    BadDefinition { path: String, reason: String },
    #[error("{0}")]
    Io(String),
}
