//! The signals that stop `serve` and the folder copies: SIGTERM (service managers, `kill`) and
//! SIGINT (Ctrl-C). The first asks for a graceful stop; a second one means "now".

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// What a second signal during a folder copy exits with (128 + SIGINT, as shells report it).
pub const INTERRUPTED: u8 = 130;

/// For a folder copy: a flag the first SIGINT or SIGTERM sets (the batch then starts no more
/// copies, lets those running finish and says what was not started); a second one exits at
/// once with [`INTERRUPTED`]. The handlers are in place when this returns.
pub fn batch_stop() -> std::io::Result<Arc<AtomicBool>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut signals = {
        let _in = rt.enter();
        Signals::install()?
    };
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        rt.block_on(async {
            let name = signals.next().await;
            set.store(true, Ordering::Release);
            eprintln!(
                "\n{name}: finishing the copies under way and starting no more (again to stop at \
                 once); running the command again copies the rest"
            );
            let name = signals.next().await;
            eprintln!("{name} again: stopping now; running the command again finishes the copies");
            std::process::exit(i32::from(INTERRUPTED));
        })
    })?;
    Ok(flag)
}
