//! The signals that stop `serve`: SIGTERM (service managers, `kill`) and SIGINT (Ctrl-C). The
//! first asks for a graceful stop; a second one means "now".

use tokio::signal::unix::{Signal, SignalKind, signal};

/// Handlers for SIGTERM and SIGINT. Installed, they replace the default of dying at once.
pub struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// Install both handlers (inside a tokio runtime).
    pub fn install() -> std::io::Result<Self> {
        Ok(Self { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    /// Wait for the next SIGTERM or SIGINT; returns its name.
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
