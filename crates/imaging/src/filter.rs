//! What a filter is: a named operation with documented, range-checked parameters, applied to
//! a [`DynImage`] with a given number of threads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rayon::prelude::*;

use crate::error::ImagingError;
use crate::image::DynImage;
use crate::params::Params;

/// One parameter a filter takes.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamInfo {
    pub name: String,
    /// Default value as text.
    pub default: String,
    /// Inclusive range for numeric parameters.
    pub range: Option<(f64, f64)>,
    pub help: String,
}

impl ParamInfo {
    pub fn number(name: &str, default: f64, min: f64, max: f64, help: &str) -> Self {
        Self {
            name: name.into(),
            default: default.to_string(),
            range: Some((min, max)),
            help: help.into(),
        }
    }

    pub fn text(name: &str, default: &str, help: &str) -> Self {
        Self { name: name.into(), default: default.into(), range: None, help: help.into() }
    }
}

/// What a filter is, for listings.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterInfo {
    pub name: String,
    pub summary: String,
    pub params: Vec<ParamInfo>,
    /// "builtin", "kernel" or "chain".
    pub kind: String,
    /// Definition file, for loaded filters.
    pub source: Option<String>,
}

impl FilterInfo {
    /// Reject parameters this filter does not take.
    pub fn check_known(&self, p: &Params) -> Result<(), ImagingError> {
        for k in p.0.keys() {
            if !self.params.iter().any(|i| &i.name == k) {
                let known: Vec<_> = self.params.iter().map(|i| i.name.as_str()).collect();
                return Err(ImagingError::UnknownParam {
                    filter: self.name.clone(),
                    param: k.clone(),
                    known: if known.is_empty() { "nothing".into() } else { known.join(", ") },
                });
            }
        }
        Ok(())
    }

    /// A numeric parameter: given or default, parsed, finite and inside its range.
    pub fn number(&self, p: &Params, name: &str) -> Result<f64, ImagingError> {
        let info =
            self.params.iter().find(|i| i.name == name).expect("filters ask for their own params");
        let text = p.get(name).unwrap_or(&info.default);
        let bad = |reason: String| ImagingError::BadParam {
            filter: self.name.clone(),
            param: name.to_string(),
            reason,
        };
        let v: f64 = text.parse().map_err(|_| bad(format!("{text:?} is not a number")))?;
        if !v.is_finite() {
            return Err(bad(format!("{text:?} is not finite")));
        }
        if let Some((lo, hi)) = info.range
            && (v < lo || v > hi)
        {
            return Err(bad(format!("{v} is outside {lo}..={hi}")));
        }
        Ok(v)
    }

    /// A text parameter: given or default.
    pub fn text<'a>(&'a self, p: &'a Params, name: &str) -> &'a str {
        let info =
            self.params.iter().find(|i| i.name == name).expect("filters ask for their own params");
        p.get(name).unwrap_or(&info.default)
    }
}

/// What a filter's output samples are, which says how to show them (in a viewer, or as the
/// 8 bits of a JPEG or GIF). Ordered: a chain's output is its steps' greatest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Output {
    /// The input's values, on its scale and with its meaning (blur, zoom, sharpen, …): shown
    /// through the input's window, in its units (HU for CT).
    #[default]
    Values,
    /// On the input's scale but without its meaning (invert's `MAX − v`): shown through the
    /// input's window, with no unit.
    Scale,
    /// Grey levels made for display (window, edge, emboss): shown on their own full scale
    /// (0 black, MAX white), not through the input's window.
    GreyLevels,
}

impl Output {
    /// As the HTTP API names it.
    pub fn name(self) -> &'static str {
        match self {
            Output::Values => "values",
            Output::Scale => "scale",
            Output::GreyLevels => "grey-levels",
        }
    }
}

/// The rescale intercept a window takes; a chain hands its own on to its windows, and the
/// command line and HTTP API set it to a DICOM file's (`bs_imageio::in_modality_units`).
pub const INTERCEPT: &str = "intercept";

/// Whether `f` takes an intercept that its parameters `p` leave open.
pub fn open_intercept(f: &dyn Filter, p: &Params) -> bool {
    p.get(INTERCEPT).is_none() && f.info().params.iter().any(|i| i.name == INTERCEPT)
}

/// An image operation.
pub trait Filter: Send + Sync {
    fn info(&self) -> FilterInfo;
    /// Apply to `img`. Implementations check parameters first (unknown names, ranges) and
    /// return a new image; they never panic on any input.
    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError>;
    /// What the output's samples are when applied with `params`.
    fn output(&self, _params: &Params) -> Output {
        Output::Values
    }
}

/// Most threads a run uses, whatever it asks for (unless the machine has more cores).
pub const MAX_THREADS: usize = 64;

/// How to run: on how many threads. Work is split into bands of whole output rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// 1 = this thread only; 0 = all cores.
    pub threads: usize,
}

impl Default for Run {
    fn default() -> Self {
        Self::all()
    }
}

impl Run {
    pub fn single() -> Self {
        Self { threads: 1 }
    }

    pub fn all() -> Self {
        Self { threads: 0 }
    }

    pub fn with_threads(threads: usize) -> Self {
        Self { threads }
    }

    /// Threads this run uses.
    pub fn thread_count(&self) -> usize {
        let cores = cores();
        match self.threads {
            0 => cores,
            // More threads than cores only adds overhead; never build absurd pools.
            n => n.min(cores.max(MAX_THREADS)),
        }
    }

    /// Call `f(y, row)` for every output row of `out` (rows of `row_len` samples), in
    /// parallel bands when this run has more than one thread.
    pub fn rows<T: Send>(
        &self,
        out: &mut [T],
        row_len: usize,
        f: impl Fn(usize, &mut [T]) + Sync + Send,
    ) {
        if row_len == 0 {
            return;
        }
        let n = self.thread_count();
        if n <= 1 {
            for (y, row) in out.chunks_mut(row_len).enumerate() {
                f(y, row);
            }
            return;
        }
        let rows = out.len() / row_len;
        // A few bands per thread balance uneven rows without per-row scheduling cost.
        let band = rows.div_ceil(n * 4).max(1);
        pool(n).install(|| {
            out.par_chunks_mut(row_len * band).enumerate().for_each(|(b, chunk)| {
                for (i, row) in chunk.chunks_mut(row_len).enumerate() {
                    f(b * band + i, row);
                }
            });
        });
    }
}

/// The cores this process may use, asked once: `available_parallelism` reads cgroup files on
/// every call (tens of microseconds, as long as a whole filter on a small image).
fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// One rayon pool per thread count, built once.
fn pool(n: usize) -> Arc<rayon::ThreadPool> {
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    pools
        .entry(n)
        .or_insert_with(|| {
            Arc::new(rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("thread pool"))
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_visits_every_row_once_on_any_thread_count() {
        for threads in [1, 2, 3, 0] {
            let mut out = vec![0u32; 7 * 5];
            Run::with_threads(threads)
                .rows(&mut out, 5, |y, row| row.iter_mut().for_each(|v| *v += y as u32 + 1));
            for (y, row) in out.chunks(5).enumerate() {
                assert!(row.iter().all(|&v| v == y as u32 + 1), "threads {threads}");
            }
        }
    }

    #[test]
    fn numbers_are_checked() {
        let info = FilterInfo {
            name: "f".into(),
            summary: String::new(),
            params: vec![ParamInfo::number("r", 3.0, 1.0, 9.0, "")],
            kind: "builtin".into(),
            source: None,
        };
        assert_eq!(info.number(&Params::new(), "r").unwrap(), 3.0);
        assert_eq!(info.number(&Params::new().with("r", 5), "r").unwrap(), 5.0);
        for bad in ["0", "10", "x", "NaN", "inf"] {
            assert!(info.number(&Params::new().with("r", bad), "r").is_err(), "{bad}");
        }
        assert!(info.check_known(&Params::new().with("q", 1)).is_err());
    }
}
