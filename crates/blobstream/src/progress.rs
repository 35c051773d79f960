//! Progress bars for long transfers: on stderr, only when it is a terminal and the transfer is
//! big enough to take a moment.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Transfers smaller than this finish before a bar would be worth drawing.
const WORTH_A_BAR: u64 = 8 << 20;

/// A bar that stays hidden until [`update`] learns the transfer is worth showing.
pub fn bar(label: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    pb.set_message(label.to_string());
    pb
}

/// Report progress; the first report of a big transfer on a terminal makes the bar visible.
pub fn update(pb: &ProgressBar, done: u64, total: u64, quiet: bool) {
    if pb.length().is_none() {
        pb.set_length(total);
        if !quiet && total >= WORTH_A_BAR && std::io::stderr().is_terminal() {
            pb.set_draw_target(ProgressDrawTarget::stderr());
        }
    }
    pb.set_position(done);
}
