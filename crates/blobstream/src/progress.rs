//! Progress bars for long transfers: on stderr, only when it is a terminal and the transfer is
//! big enough to take a moment.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Transfers smaller than this finish before a bar would be worth drawing.
const WORTH_A_BAR: u64 = 8 << 20;

/// A bar for `total` bytes, or a hidden one.
pub fn bar(total: u64, label: &str, quiet: bool) -> ProgressBar {
    if quiet || total < WORTH_A_BAR || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
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
