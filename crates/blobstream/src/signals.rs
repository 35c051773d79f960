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

/// For a folder copy: `stop` is set by the first SIGINT or SIGTERM while the copies run (the
/// batch then starts no more, lets those running finish and says what was not started); a
/// second one, or a first one once [`BatchStop::copies_over`] was called (a `--delete` after
/// the copies, say), exits at once with [`INTERRUPTED`].
pub struct BatchStop {
    pub stop: Arc<AtomicBool>,
    over: Arc<AtomicBool>,
}

impl BatchStop {
    /// Install the handlers (in place when this returns).
    pub fn install() -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let mut signals = {
            let _in = rt.enter();
            Signals::install()?
        };
        let (stop, over) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (set, after) = (stop.clone(), over.clone());
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            rt.block_on(async {
                let name = signals.next().await;
                if !after.load(Ordering::Acquire) {
                    set.store(true, Ordering::Release);
                    eprintln!(
                        "\n{name}: finishing the copies under way and starting no more (again \
                         to stop at once); running the command again copies the rest"
                    );
                    let again = signals.next().await;
                    eprintln!("{again} again: stopping now; running the command again finishes");
                } else {
                    eprintln!("\n{name}: stopping now");
                }
                std::process::exit(i32::from(INTERRUPTED));
            })
        })?;
        Ok(Self { stop, over })
    }

    /// Was a stop asked for while the copies ran?
    pub fn asked(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// The copies are over: a signal from now on stops the command at once.
    pub fn copies_over(&self) {
        self.over.store(true, Ordering::Release);
    }
}
