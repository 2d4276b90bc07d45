//! Progress bars for long commands (pack, split, extract, verify): on stderr, only when a
//! person is watching (stderr is a terminal) and the work is large enough to take a while.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Below this many bytes a bar would only flicker.
const THRESHOLD: u64 = 64 << 20;

/// A byte-count bar for `total` bytes of work, or `None` when nobody would see it.
pub fn bar(total: u64) -> Option<ProgressBar> {
    if total < THRESHOLD || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style);
    }
    Some(bar)
}
