//! What every benchmark run takes: full or quick, and where its progress lines go.

use std::fmt;

/// A callback receiving a short status line.
pub type Progress = Box<dyn Fn(&str) + Send + Sync>;

/// How a benchmark runs.
#[derive(Default)]
pub struct BenchOptions {
    /// Fewer sizes and shorter or fewer runs (each benchmark says what it drops).
    pub quick: bool,
    /// Called with a short status line before each measurement.
    pub progress: Option<Progress>,
}

impl BenchOptions {
    /// Report a status line, if anyone listens.
    pub fn say(&self, line: &str) {
        if let Some(p) = &self.progress {
            p(line)
        }
    }
}

impl fmt::Debug for BenchOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BenchOptions")
            .field("quick", &self.quick)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}
