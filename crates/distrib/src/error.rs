//! What goes wrong between senders, the distributer and receivers.

use bs_binding::BindingError;
use bs_transport::TransportError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum DistribError {
    /// The configuration file is wrong; `line` is 1-based (0: the file as a whole).
    #[error("{file}{}: {reason}", if *line > 0 { format!(":{line}") } else { String::new() })]
    Config { file: String, line: usize, reason: String },
    #[error("unknown stream {0:?}")]
    UnknownStream(String),
    #[error("stream {stream:?} has no flow {flow:?}")]
    UnknownFlow { stream: String, flow: String },
    /// Also the answer to an unknown stream where streams need tokens (which names exist is
    /// told only to peers that may join).
    #[error("wrong token for stream {0:?}, or no such stream")]
    BadToken(String),
    #[error("flow {0} already has a sender")]
    SenderTaken(String),
    #[error("a receiver named {name:?} is already on flow {flow}")]
    NameTaken { flow: String, name: String },
    /// An operation out of order (send before start, start twice, …).
    #[error("{0}")]
    Order(String),
    /// A message that does not parse or breaks the protocol.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The distributer (or the peer) ended the connection with this reason.
    #[error("{0}")]
    Remote(String),
    #[error(transparent)]
    Binding(#[from] BindingError),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl DistribError {
    /// The distributer ended the connection (an `ERROR` frame): its reason, as ours.
    pub(crate) fn from_binding(e: BindingError) -> Self {
        match e {
            BindingError::Remote { message, .. } => Self::Remote(message),
            e => Self::Binding(e),
        }
    }
}
