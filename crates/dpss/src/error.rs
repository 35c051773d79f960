//! What goes wrong in the block store: names, frames, blocks, servers, the catalogue.

use bs_binding::BindingError;
use bs_transport::TransportError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum DpssError {
    #[error("unknown data set {0:?}")]
    UnknownDataset(String),
    #[error("data set {dataset:?} has no block {block}")]
    UnknownBlock { dataset: String, block: String },
    #[error("data set {0:?} already exists")]
    DatasetExists(String),
    /// Blocks of a data set never published, left by a loader that ended after some servers
    /// committed.
    #[error(
        "data set {dataset:?} is not published, but the block servers at {servers} still hold blocks of it from a load \
         that ended before publishing: remove them with `blobstream dpss drop {dataset}`, then load again"
    )]
    Leftover { dataset: String, servers: String },
    /// A data set name that could not be a file name on every disk.
    #[error("bad data set name {0:?}: use 1-128 letters, digits, '.', '_' or '-', not first '.'")]
    BadName(String),
    #[error("request list of {got} blocks exceeds the bound of {max}")]
    ListTooLong { got: usize, max: usize },
    /// A message that does not parse or breaks the protocol.
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("wrong token")]
    BadToken,
    /// A role that changes what a server holds (loading, dropping), asked for without the
    /// admin token.
    #[error("loading and dropping need the block store's admin token")]
    NeedsAdmin,
    /// A block whose bytes do not match the digest it was stored with.
    #[error("block {0} fails its digest")]
    Corrupt(String),
    /// No server holding a copy of this block could deliver it.
    #[error("block {block}: no replica could deliver it ({reasons})")]
    Unavailable { block: String, reasons: String },
    /// A server at its limit (of connections, say): ask again later.
    #[error("busy: {0}")]
    Busy(String),
    /// A client that leaves its answers unread while it goes on asking.
    #[error("too slow: {0}")]
    TooSlow(String),
    #[error("bad image: {0}")]
    Image(String),
    #[error("bad layout: {0}")]
    Layout(String),
    /// The peer ended the connection with this reason.
    #[error("{0}")]
    Remote(String),
    #[error("catalogue: {0}")]
    Catalogue(#[from] rusqlite::Error),
    #[error("master: {0}")]
    Master(String),
    #[error(transparent)]
    Binding(BindingError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl From<BindingError> for DpssError {
    fn from(e: BindingError) -> Self {
        match e {
            BindingError::Remote { message, .. } => Self::Remote(message),
            e => Self::Binding(e),
        }
    }
}

impl From<tonic::Status> for DpssError {
    fn from(s: tonic::Status) -> Self {
        Self::Master(s.message().to_string())
    }
}

impl DpssError {
    /// The gRPC status this error is reported as by the master.
    pub fn to_status(&self) -> tonic::Status {
        use tonic::Status;
        match self {
            Self::UnknownDataset(_) | Self::UnknownBlock { .. } => {
                Status::not_found(self.to_string())
            }
            Self::DatasetExists(_) | Self::Leftover { .. } => {
                Status::already_exists(self.to_string())
            }
            Self::BadName(_)
            | Self::ListTooLong { .. }
            | Self::Malformed(_)
            | Self::Layout(_)
            | Self::Image(_) => Status::invalid_argument(self.to_string()),
            Self::BadToken => Status::unauthenticated(self.to_string()),
            Self::NeedsAdmin => Status::permission_denied(self.to_string()),
            Self::Corrupt(_) => Status::data_loss(self.to_string()),
            Self::Unavailable { .. } | Self::Busy(_) => Status::unavailable(self.to_string()),
            Self::TooSlow(_) => Status::resource_exhausted(self.to_string()),
            _ => Status::internal(self.to_string()),
        }
    }

    /// The wire error code a block server ends a connection with for this error.
    pub fn code(&self) -> bs_wire::ErrorCode {
        use bs_wire::ErrorCode;
        match self {
            Self::BadToken | Self::NeedsAdmin => ErrorCode::BadToken,
            Self::UnknownDataset(_) | Self::UnknownBlock { .. } => ErrorCode::NotFound,
            Self::Corrupt(_) => ErrorCode::Corrupt,
            Self::Malformed(_) | Self::ListTooLong { .. } | Self::BadName(_) => ErrorCode::BadFrame,
            Self::Busy(_) => ErrorCode::Busy,
            Self::TooSlow(_) => ErrorCode::TooSlow,
            _ => ErrorCode::Internal,
        }
    }
}
