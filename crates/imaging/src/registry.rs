//! The filters a program can use by name: the built-ins plus kernels and chains defined in TOML
//! files in a directory, which can be reloaded — on request or by a watcher thread — while the
//! program runs (MedJava's Service Configurator: filters added or replaced without a restart).
//!
//! # Definition files
//!
//! Every `*.toml` file directly in the directory is read, in file-name order. A file holds any
//! number of `[[kernel]]` and `[[chain]]` tables:
//!
//! ```toml
//! [[kernel]]
//! name = "smooth"                        # required; see "Names" below
//! summary = "3×3 binomial smoothing"     # optional
//! weights = [[1, 2, 1],                  # required: rows of numbers, top row first;
//!            [2, 4, 2],                  # both sides odd, at most 15
//!            [1, 2, 1]]
//! divisor = 16                           # optional: default the sum of the weights (1 if 0)
//! offset = 0                             # optional: added after dividing, in 8-bit units
//!
//! [[chain]]
//! name = "ct-soft-tissue"
//! summary = "CT soft-tissue window, then smoothing"
//! steps = [
//!   { filter = "window", params = { center = "40", width = "400" } },
//!   { filter = "smooth" },
//! ]
//! ```
//!
//! - A kernel becomes a [`Convolution`] filter of kind `"kernel"` (its exact definition — a
//!   correlation with clamp-to-edge borders — is in [`crate::filters::convolve`]). Kernels take
//!   no parameters.
//! - A chain becomes a [`Chain`] filter of kind `"chain"` that applies its steps in order, each
//!   to the previous step's output, with the step's fixed parameters. Parameter values may be
//!   strings, numbers or booleans (`width = 400` and `width = "400"` are the same). A chain
//!   takes no parameters itself but one: when a step that takes an `intercept` (a window)
//!   fixes none, the chain takes `intercept` and hands it to such steps while the pixels are
//!   still the input's values — so a window in a chain, like one on its own, gets its centre
//!   and width in modality units (HU for CT) whatever the file's encoding (the command line
//!   and the HTTP API give DICOM files' intercept). Steps may name built-ins, kernels, and other chains from any
//!   file, in any order, as long as no chain reaches itself (a cycle is an error naming it);
//!   chains nest at most [`MAX_DEPTH`] deep.
//! - Names: 1 to 64 characters from `A–Z a–z 0–9 - _ .`, unique across all files, and not the
//!   name of a built-in (built-ins cannot be replaced by files; define a new name and point
//!   chains at it).
//! - At load time each step's parameter names are checked against the filter, and numeric ones
//!   against their ranges; text values such as `method = "cubic"` are only checked when the
//!   chain runs.
//! - Unknown keys anywhere, a missing field, a TOML syntax error, a bad kernel shape, an unknown
//!   filter in a chain, a duplicate name or a cycle fail the whole load with
//!   [`ImagingError::BadDefinition`] naming the file and the reason.
//!
//! # Reloading
//!
//! [`Registry::reload`] builds a complete new set from the directory and swaps it in atomically;
//! on any error the previous set stays in effect and the error is returned. A filter obtained
//! with [`Registry::get`] keeps working after a reload (it is reference-counted). The
//! [`Registry::watch`] thread polls the directory's `*.toml` files (name, modification time,
//! size) and reloads when they change. Editors that write in place may be seen half-written:
//! that load fails, is reported, and the next poll after the write completes succeeds. Writing a
//! temporary file and renaming it avoids the failed attempt.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, INTERCEPT, Output, ParamInfo, Run, open_intercept};
use crate::filters::{self, convolve::Convolution};
use crate::image::DynImage;
use crate::params::Params;

/// Deepest nesting of chains in chains.
pub const MAX_DEPTH: usize = 32;

/// Longest filter name.
pub const MAX_NAME: usize = 64;

/// The filters a program can use by name.
pub struct Registry {
    builtins: Vec<Arc<dyn Filter>>,
    dir: Option<PathBuf>,
    current: RwLock<Arc<Loaded>>,
    /// Serialises reloads so reports describe consecutive states.
    reloading: Mutex<()>,
}

/// One complete, consistent set of filters.
struct Loaded {
    filters: BTreeMap<String, Arc<dyn Filter>>,
    /// Definitions loaded from files, to tell what a reload changed.
    defs: BTreeMap<String, Def>,
    /// The directory as it was just before it was read.
    stamp: Stamp,
}

/// What a reload changed, by filter name (each list sorted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Names whose definition differs (a chain whose own steps are unchanged is not listed
    /// when only a kernel it uses changed, though it now uses the new kernel).
    pub changed: Vec<String>,
}

impl ReloadReport {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

impl fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no changes");
        }
        let mut parts = Vec::new();
        for (what, names) in
            [("added", &self.added), ("removed", &self.removed), ("changed", &self.changed)]
        {
            if !names.is_empty() {
                parts.push(format!("{what} {}", names.join(", ")));
            }
        }
        f.write_str(&parts.join("; "))
    }
}

impl Default for Registry {
    fn default() -> Self {
        Self::builtin()
    }
}

impl Registry {
    /// The built-in filters only.
    pub fn builtin() -> Self {
        let builtins = filters::builtins();
        let mut map = BTreeMap::new();
        for f in &builtins {
            // Built-in names are unique (tested); should two clash, the first wins.
            map.entry(f.info().name).or_insert_with(|| f.clone());
        }
        let loaded = Loaded { filters: map, defs: BTreeMap::new(), stamp: Ok(Vec::new()) };
        Self {
            builtins,
            dir: None,
            current: RwLock::new(Arc::new(loaded)),
            reloading: Mutex::new(()),
        }
    }

    /// The built-ins plus every definition in the `*.toml` files of `dir`.
    pub fn with_dir(dir: impl Into<PathBuf>) -> Result<Self, ImagingError> {
        let dir = dir.into();
        let mut r = Self::builtin();
        let loaded = load(&dir, &r.builtins)?;
        r.current = RwLock::new(Arc::new(loaded));
        r.dir = Some(dir);
        Ok(r)
    }

    /// The definition directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    fn snapshot(&self) -> Arc<Loaded> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every filter, sorted by name.
    pub fn list(&self) -> Vec<FilterInfo> {
        self.snapshot().filters.values().map(|f| f.info()).collect()
    }

    /// The filter called `name`.
    pub fn get(&self, name: &str) -> Result<Arc<dyn Filter>, ImagingError> {
        self.snapshot()
            .filters
            .get(name)
            .cloned()
            .ok_or_else(|| ImagingError::UnknownFilter { name: name.to_string() })
    }

    /// Apply the filter called `name`.
    pub fn apply(
        &self,
        name: &str,
        img: &DynImage,
        params: &Params,
        run: &Run,
    ) -> Result<DynImage, ImagingError> {
        self.get(name)?.apply(img, params, run)
    }

    /// What the filter called `name` makes of its input's values with `params`.
    pub fn output(&self, name: &str, params: &Params) -> Result<Output, ImagingError> {
        Ok(self.get(name)?.output(params))
    }

    /// Re-read the directory and swap the new set in. On any error the previous set stays in
    /// effect and the error is returned. Without a directory there is nothing to reload.
    pub fn reload(&self) -> Result<ReloadReport, ImagingError> {
        let Some(dir) = &self.dir else { return Ok(ReloadReport::default()) };
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(|p| p.into_inner());
        let new = load(dir, &self.builtins)?;
        let old = self.snapshot();
        let mut report = ReloadReport::default();
        for (name, def) in &new.defs {
            match old.defs.get(name) {
                None => report.added.push(name.clone()),
                Some(d) if d != def => report.changed.push(name.clone()),
                Some(_) => {}
            }
        }
        report.removed = old.defs.keys().filter(|n| !new.defs.contains_key(*n)).cloned().collect();
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
        Ok(report)
    }

    /// Poll the directory every `interval` on a background thread and reload when its `*.toml`
    /// files change (by name, modification time or size). Errors are printed to stderr; the
    /// previous set stays. Stops when the handle is dropped.
    pub fn watch(self: &Arc<Self>, interval: Duration) -> WatchHandle {
        let dir = self.dir.clone().unwrap_or_default();
        self.watch_with(interval, move |r| {
            if let Err(e) = r {
                eprintln!("blobstream-imaging: reloading filters from {}: {e}", dir.display());
            }
        })
    }

    /// Like [`watch`](Self::watch), passing the outcome of every reload it attempts to
    /// `on_reload` (called on the watcher thread).
    pub fn watch_with(
        self: &Arc<Self>,
        interval: Duration,
        mut on_reload: impl FnMut(Result<ReloadReport, ImagingError>) + Send + 'static,
    ) -> WatchHandle {
        let Some(dir) = self.dir.clone() else {
            return WatchHandle { stop: None, thread: None };
        };
        let interval = interval.max(Duration::from_millis(1));
        let (stop, stopped) = mpsc::channel::<()>();
        let weak = Arc::downgrade(self);
        let mut last = self.snapshot().stamp.clone();
        let spawned = std::thread::Builder::new().name("filter-watch".into()).spawn(move || {
            loop {
                match stopped.recv_timeout(interval) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let Some(reg) = weak.upgrade() else { return };
                let now = stamp(&dir);
                if now != last {
                    last = now;
                    on_reload(reg.reload());
                }
            }
        });
        match spawned {
            Ok(t) => WatchHandle { stop: Some(stop), thread: Some(t) },
            Err(e) => {
                eprintln!("blobstream-imaging: cannot start the filter watcher: {e}");
                WatchHandle { stop: None, thread: None }
            }
        }
    }
}

/// Keeps a [`Registry::watch`] thread running; dropping it stops the thread (waiting for a
/// reload in progress to finish).
pub struct WatchHandle {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl WatchHandle {
    /// Whether a watcher thread is running (false without a directory).
    pub fn is_active(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

/// A chain of filters applied in order (kind `"chain"`).
pub struct Chain {
    name: String,
    summary: String,
    steps: Vec<(Arc<dyn Filter>, Params)>,
    source: Option<String>,
}

impl Chain {
    /// A chain of `steps`, each a filter with fixed parameters.
    pub fn new(
        name: &str,
        summary: &str,
        steps: Vec<(Arc<dyn Filter>, Params)>,
        source: Option<String>,
    ) -> Self {
        let summary = if summary.is_empty() {
            let names: Vec<_> = steps.iter().map(|(f, _)| f.info().name).collect();
            names.join(" → ")
        } else {
            summary.to_string()
        };
        Self { name: name.to_string(), summary, steps, source }
    }
}

impl Chain {
    /// The steps with the chain's `params` handed on: its `intercept` to each step that takes
    /// one, fixes none, and still sees the input's values.
    fn steps_with(&self, params: &Params) -> Vec<(&Arc<dyn Filter>, Params)> {
        let mut so_far = Output::Values;
        let mut out = Vec::with_capacity(self.steps.len());
        for (f, p) in &self.steps {
            let p = match params.get(INTERCEPT) {
                Some(v) if so_far == Output::Values && open_intercept(&**f, p) => {
                    p.clone().with(INTERCEPT, v)
                }
                _ => p.clone(),
            };
            so_far = so_far.max(f.output(&p));
            out.push((f, p));
        }
        out
    }
}

impl Filter for Chain {
    fn info(&self) -> FilterInfo {
        let params = if self.steps.iter().any(|(f, p)| open_intercept(&**f, p)) {
            let help = "rescale intercept for its window steps that fix none";
            vec![ParamInfo::number(INTERCEPT, 0.0, -1e9, 1e9, help)]
        } else {
            Vec::new()
        };
        FilterInfo {
            name: self.name.clone(),
            summary: self.summary.clone(),
            params,
            kind: "chain".into(),
            source: self.source.clone(),
        }
    }

    fn apply(&self, img: &DynImage, params: &Params, run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        if params.get(INTERCEPT).is_some() {
            info.number(params, INTERCEPT)?;
        }
        let mut cur: Option<DynImage> = None;
        for (f, p) in self.steps_with(params) {
            cur = Some(f.apply(cur.as_ref().unwrap_or(img), &p, run)?);
        }
        Ok(cur.unwrap_or_else(|| img.clone()))
    }

    /// Its steps' greatest: after grey levels, grey levels.
    fn output(&self, params: &Params) -> Output {
        self.steps_with(params).iter().map(|(f, p)| f.output(p)).max().unwrap_or_default()
    }
}

// ---- definition files ----

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDef {
    #[serde(default)]
    kernel: Vec<KernelDef>,
    #[serde(default)]
    chain: Vec<ChainDef>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct KernelDef {
    name: String,
    #[serde(default)]
    summary: String,
    weights: Vec<Vec<f64>>,
    divisor: Option<f64>,
    #[serde(default)]
    offset: f64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChainDef {
    name: String,
    #[serde(default)]
    summary: String,
    steps: Vec<StepDef>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepDef {
    filter: String,
    #[serde(default)]
    params: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Clone, PartialEq)]
enum Def {
    Kernel(KernelDef),
    Chain(ChainDef),
}

/// `*.toml` files of the directory: (file name, modification time, size), sorted; or why the
/// directory could not be listed.
type Stamp = Result<Vec<(String, Option<SystemTime>, u64)>, String>;

/// The `*.toml` regular files directly in `dir`, sorted by name, with their metadata.
fn toml_files(dir: &Path) -> Result<Vec<(PathBuf, std::fs::Metadata)>, String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|e| e == "toml")
            && let Ok(meta) = std::fs::metadata(&path)
            && meta.is_file()
        {
            out.push((path, meta));
        }
    }
    out.sort_by(|a, b| a.0.file_name().cmp(&b.0.file_name()));
    Ok(out)
}

fn stamp(dir: &Path) -> Stamp {
    Ok(toml_files(dir)?
        .into_iter()
        .map(|(p, m)| {
            let name = p.file_name().unwrap_or_default().to_string_lossy().into_owned();
            (name, m.modified().ok(), m.len())
        })
        .collect())
}

fn bad(path: &Path, reason: impl Into<String>) -> ImagingError {
    ImagingError::BadDefinition { path: path.display().to_string(), reason: reason.into() }
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name {name:?} must be 1 to {MAX_NAME} characters of letters, digits, '-', '_', '.'"
        ))
    }
}

/// Build a complete set: the built-ins plus every definition in `dir`.
fn load(dir: &Path, builtins: &[Arc<dyn Filter>]) -> Result<Loaded, ImagingError> {
    let stamp = stamp(dir);
    let files = toml_files(dir).map_err(|e| {
        ImagingError::Io(format!("filter definition directory {}: {e}", dir.display()))
    })?;
    let mut filters: BTreeMap<String, Arc<dyn Filter>> = BTreeMap::new();
    for f in builtins {
        filters.entry(f.info().name).or_insert_with(|| f.clone());
    }
    let n_builtin = filters.len();
    let mut defs: BTreeMap<String, Def> = BTreeMap::new();
    let mut origin: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut chains: Vec<(ChainDef, PathBuf)> = Vec::new();
    for (path, _) in files {
        let text = std::fs::read_to_string(&path).map_err(|e| bad(&path, e.to_string()))?;
        let file: FileDef = toml::from_str(&text).map_err(|e| bad(&path, e.to_string().trim()))?;
        let names = file.kernel.iter().map(|k| &k.name).chain(file.chain.iter().map(|c| &c.name));
        for name in names {
            check_name(name).map_err(|r| bad(&path, r))?;
            if builtins.iter().any(|b| b.info().name == *name) {
                return Err(bad(&path, format!("{name:?} is the name of a built-in filter")));
            }
            if let Some(first) = origin.get(name) {
                return Err(bad(
                    &path,
                    format!("{name:?} is defined twice (also in {})", first.display()),
                ));
            }
            origin.insert(name.clone(), path.clone());
        }
        let source = Some(path.display().to_string());
        for k in file.kernel {
            let conv = Convolution::new(
                &k.name,
                &k.summary,
                &k.weights,
                k.divisor,
                k.offset,
                source.clone(),
            )
            .map_err(|r| bad(&path, format!("kernel {:?}: {r}", k.name)))?;
            filters.insert(k.name.clone(), Arc::new(conv));
            defs.insert(k.name.clone(), Def::Kernel(k));
        }
        for c in file.chain {
            if c.steps.is_empty() {
                return Err(bad(&path, format!("chain {:?} has no steps", c.name)));
            }
            defs.insert(c.name.clone(), Def::Chain(c.clone()));
            chains.push((c, path.clone()));
        }
    }
    let pending: BTreeMap<&str, (&ChainDef, &Path)> =
        chains.iter().map(|(c, p)| (c.name.as_str(), (c, p.as_path()))).collect();
    let mut stack = Vec::new();
    for (c, _) in &chains {
        resolve(&c.name, &pending, &mut filters, &mut stack)?;
    }
    debug_assert_eq!(filters.len(), n_builtin + defs.len());
    Ok(Loaded { filters, defs, stamp })
}

/// The filter `name`, building chains (and the chains they use) on first use.
fn resolve(
    name: &str,
    pending: &BTreeMap<&str, (&ChainDef, &Path)>,
    filters: &mut BTreeMap<String, Arc<dyn Filter>>,
    stack: &mut Vec<String>,
) -> Result<Option<Arc<dyn Filter>>, ImagingError> {
    if let Some(f) = filters.get(name) {
        return Ok(Some(f.clone()));
    }
    let Some(&(def, path)) = pending.get(name) else { return Ok(None) };
    if let Some(pos) = stack.iter().position(|n| n == name) {
        let mut cycle = stack[pos..].to_vec();
        cycle.push(name.to_string());
        return Err(bad(path, format!("chain {name:?} uses itself: {}", cycle.join(" → "))));
    }
    if stack.len() >= MAX_DEPTH {
        return Err(bad(path, format!("chain {name:?} nests chains more than {MAX_DEPTH} deep")));
    }
    stack.push(name.to_string());
    let mut steps = Vec::with_capacity(def.steps.len());
    for (i, step) in def.steps.iter().enumerate() {
        let at = |reason: String| {
            bad(path, format!("chain {name:?} step {} ({}): {reason}", i + 1, step.filter))
        };
        let Some(f) = resolve(&step.filter, pending, filters, stack)? else {
            return Err(at("unknown filter".into()));
        };
        let mut params = Params::new();
        for (k, v) in &step.params {
            let text = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(x) => x.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(at(format!(
                        "parameter {k:?}: {} is not a string, number or boolean",
                        other.type_str()
                    )));
                }
            };
            params.0.insert(k.clone(), text);
        }
        let info = f.info();
        info.check_known(&params).map_err(|e| at(e.to_string()))?;
        for p in info.params.iter().filter(|p| p.range.is_some() && params.get(&p.name).is_some()) {
            info.number(&params, &p.name).map_err(|e| at(e.to_string()))?;
        }
        steps.push((f, params));
    }
    stack.pop();
    let chain: Arc<dyn Filter> =
        Arc::new(Chain::new(name, &def.summary, steps, Some(path.display().to_string())));
    filters.insert(name.to_string(), chain.clone());
    Ok(Some(chain))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::image::Image;

    fn gray8(w: usize, h: usize, d: &[u8]) -> DynImage {
        DynImage::U8(Image::from_vec(w, h, 1, d.to_vec()).unwrap())
    }

    fn write(dir: &Path, file: &str, text: &str) {
        // Write then rename, so a watcher never sees a half-written file.
        let tmp = dir.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, dir.join(file)).unwrap();
    }

    const BASIC: &str = r#"
        [[kernel]]
        name = "smooth"
        summary = "binomial"
        weights = [[1, 2, 1]]

        [[kernel]]
        name = "shift-right"
        weights = [[0, 0, 1.0]]
        divisor = 1
        offset = 0

        [[chain]]
        name = "neg-smooth"
        summary = "invert, then smooth"
        steps = [{ filter = "invert" }, { filter = "smooth" }]
    "#;

    fn run(r: &Registry, name: &str, img: &DynImage) -> DynImage {
        r.apply(name, img, &Params::new(), &Run::single()).unwrap()
    }

    #[test]
    fn builtins_are_listed_sorted_and_unique() {
        let r = Registry::builtin();
        let list = r.list();
        let all: Vec<String> = list.iter().map(|i| i.name.clone()).collect();
        let mut sorted = all.clone();
        sorted.sort();
        assert_eq!(all, sorted);
        let raw: Vec<String> = filters::builtins().iter().map(|f| f.info().name).collect();
        assert_eq!(raw.len(), all.len(), "two built-ins share a name: {raw:?}");
        for n in ["window", "invert", "zoom", "rotate", "flip", "unsharp", "convolve"] {
            assert!(all.iter().any(|a| a == n), "{n} missing");
        }
        assert!(list.iter().all(|i| i.kind == "builtin" && i.source.is_none()));
        assert!(matches!(r.get("nope"), Err(ImagingError::UnknownFilter { .. })));
        assert!(r.apply("nope", &gray8(1, 1, &[0]), &Params::new(), &Run::single()).is_err());
        assert_eq!(r.reload().unwrap(), ReloadReport::default());
        assert!(r.dir().is_none());
        let r = Arc::new(r);
        assert!(!r.watch(Duration::from_millis(5)).is_active());
    }

    #[test]
    fn loads_kernels_and_chains() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.toml", BASIC);
        std::fs::write(dir.path().join("notes.txt"), "not a definition").unwrap();
        let r = Registry::with_dir(dir.path()).unwrap();
        let list = r.list();
        let info = |n: &str| list.iter().find(|i| i.name == n).unwrap().clone();
        assert_eq!(info("smooth").kind, "kernel");
        assert_eq!(info("smooth").summary, "binomial");
        assert_eq!(info("neg-smooth").kind, "chain");
        assert!(info("neg-smooth").source.unwrap().ends_with("a.toml"));
        assert_eq!(info("shift-right").kind, "kernel");
        let g = gray8(4, 1, &[0, 40, 80, 120]);
        assert_eq!(run(&r, "smooth", &g), gray8(4, 1, &[10, 40, 80, 110]));
        assert_eq!(run(&r, "shift-right", &g), gray8(4, 1, &[40, 80, 120, 120]));
        // invert: 255, 215, 175, 135; smooth: (3·255+215)/4 = 245, (255+430+175)/4 = 215, …
        assert_eq!(run(&r, "neg-smooth", &g), gray8(4, 1, &[245, 215, 175, 145]));
        let e = r.apply("neg-smooth", &g, &Params::new().with("x", 1), &Run::single());
        assert!(matches!(e, Err(ImagingError::UnknownParam { .. })));
        assert!(r.dir().is_some());
    }

    #[test]
    fn chains_use_chains_across_files_in_any_order_with_params() {
        let dir = tempfile::tempdir().unwrap();
        // "a.toml" uses a chain and a kernel from "b.toml", which is read after it.
        write(
            dir.path(),
            "a.toml",
            r#"[[chain]]
               name = "outer"
               steps = [{ filter = "inner" }, { filter = "rotate", params = { degrees = 180 } }]"#,
        );
        write(
            dir.path(),
            "b.toml",
            r#"[[chain]]
               name = "inner"
               steps = [
                 { filter = "window", params = { center = "60.5", width = 101 } },
                 { filter = "shift" },
               ]
               [[kernel]]
               name = "shift"
               weights = [[0, 0, 1]]"#,
        );
        let r = Registry::with_dir(dir.path()).unwrap();
        let g = gray8(6, 1, &[0, 10, 35, 60, 110, 160]);
        // window → 0 0 64 128 255 255; shift → 0 64 128 255 255 255; rotate 180 reverses.
        assert_eq!(run(&r, "inner", &g), gray8(6, 1, &[0, 64, 128, 255, 255, 255]));
        assert_eq!(run(&r, "outer", &g), gray8(6, 1, &[255, 255, 255, 128, 64, 0]));
        let inner = r.list().into_iter().find(|i| i.name == "inner").unwrap();
        assert_eq!(inner.summary, "window → shift");
    }

    #[test]
    fn the_documented_example_loads() {
        let doc: String = include_str!("registry.rs")
            .lines()
            .skip_while(|l| !l.starts_with("//! ```toml"))
            .skip(1)
            .take_while(|l| !l.starts_with("//! ```"))
            .map(|l| format!("{}\n", l.trim_start_matches("//!").trim_start_matches(' ')))
            .collect();
        assert!(doc.contains("ct-soft-tissue"));
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "example.toml", &doc);
        let r = Registry::with_dir(dir.path()).unwrap();
        // Stored 1064 is 40 HU with the intercept −1024 the chain hands to its window, and so
        // is 32808 with −32768: the window centre, (0.5/399 + 0.5)·65535 rounds to 32850, and
        // a 1×1 image is constant under smoothing.
        for (stored, intercept) in [(1064, -1024), (32808, -32768)] {
            let g = DynImage::U16(Image::from_vec(1, 1, 1, vec![stored]).unwrap());
            let p = Params::new().with("intercept", intercept);
            let out = r.apply("ct-soft-tissue", &g, &p, &Run::single()).unwrap();
            assert_eq!(out, DynImage::U16(Image::from_vec(1, 1, 1, vec![32850]).unwrap()));
        }
        let chain = r.get("ct-soft-tissue").unwrap();
        assert_eq!(chain.info().params.len(), 1, "it takes the intercept for its window");
        assert_eq!(chain.output(&Params::new()), Output::GreyLevels);
        let g = DynImage::U16(Image::from_vec(1, 1, 1, vec![0]).unwrap());
        let center = Params::new().with("center", 1);
        assert!(r.apply("ct-soft-tissue", &g, &center, &Run::single()).is_err(), "only intercept");
        let smooth = r.get("smooth").unwrap();
        assert!(smooth.info().params.is_empty());
        assert_eq!(smooth.output(&Params::new()), Output::Values, "weights sum to the divisor");
        assert_eq!(r.get("smooth").unwrap().info().kind, "kernel");
    }

    fn load_err(files: &[(&str, &str)]) -> String {
        let dir = tempfile::tempdir().unwrap();
        for (f, t) in files {
            write(dir.path(), f, t);
        }
        match Registry::with_dir(dir.path()) {
            Err(ImagingError::BadDefinition { path, reason }) => format!("{path}: {reason}"),
            Err(e) => panic!("not BadDefinition: {e}"),
            Ok(_) => panic!("loaded {files:?}"),
        }
    }

    #[test]
    fn bad_definitions_are_rejected_with_reasons() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("x.toml", "[[kernel]]\nname='k'\nweights=[[1,1]]")], "odd"),
            (&[("x.toml", "[[kernel]]\nname='k'\nweights=[[1],[1,2,3],[1]]")], "row 2"),
            (&[("x.toml", "[[kernel]]\nname='k'\nweights=[]")], "odd"),
            (
                &[(
                    "x.toml",
                    &format!("[[kernel]]\nname='k'\nweights=[[{}]]", ["1"; 17].join(",")),
                )],
                "at most 15",
            ),
            (&[("x.toml", "[[kernel]]\nname='k'\nweights=[[1]]\ndivisor=0")], "divisor"),
            (&[("x.toml", "[[kernel]]\nname='k'\nweights=[['a']]")], "x.toml"),
            (&[("x.toml", "[[kernel]]\nname='k'\nweights=[[1]]\ncolour=1")], "colour"),
            (&[("x.toml", "[[kernel]]\nweights=[[1]]")], "name"),
            (&[("x.toml", "[[kernel]]\nname='a b'\nweights=[[1]]")], "letters"),
            (&[("x.toml", "[[kernel]]\nname='invert'\nweights=[[1]]")], "built-in"),
            (
                &[(
                    "x.toml",
                    "[[kernel]]\nname='k'\nweights=[[1]]\n[[chain]]\nname='k'\nsteps=[{filter='invert'}]",
                )],
                "twice",
            ),
            (
                &[
                    ("x.toml", "[[kernel]]\nname='k'\nweights=[[1]]"),
                    ("y.toml", "[[kernel]]\nname='k'\nweights=[[1]]"),
                ],
                "x.toml",
            ),
            (&[("x.toml", "[[chain]]\nname='c'\nsteps=[{filter='nothing'}]")], "unknown filter"),
            (&[("x.toml", "[[chain]]\nname='c'\nsteps=[]")], "no steps"),
            (
                &[("x.toml", "[[chain]]\nname='c'\nsteps=[{filter='zoom', params={scale=2}}]")],
                "scale",
            ),
            (
                &[("x.toml", "[[chain]]\nname='c'\nsteps=[{filter='zoom', params={factor=99}}]")],
                "factor",
            ),
            (
                &[("x.toml", "[[chain]]\nname='c'\nsteps=[{filter='zoom', params={factor=[2]}}]")],
                "array",
            ),
            (&[("x.toml", "[[chain]]\nname='c'\nsteps=[{filter='invert', param={}}]")], "param"),
            (&[("x.toml", "[[chain]\nname='c'")], "x.toml"),
        ];
        for (files, want) in cases {
            let msg = load_err(files);
            assert!(msg.contains(want), "{files:?}: {msg:?} lacks {want:?}");
        }
    }

    #[test]
    fn cycles_are_rejected() {
        let own =
            load_err(&[("c.toml", "[[chain]]\nname='a'\nsteps=[{filter='invert'},{filter='a'}]")]);
        assert!(own.contains("a → a"), "{own}");
        let two = load_err(&[
            ("c.toml", "[[chain]]\nname='a'\nsteps=[{filter='b'}]"),
            ("d.toml", "[[chain]]\nname='b'\nsteps=[{filter='invert'},{filter='a'}]"),
        ]);
        assert!(two.contains("a → b → a"), "{two}");
        let mut deep = String::new();
        for i in 0..=MAX_DEPTH + 1 {
            deep += &format!("[[chain]]\nname='c{i}'\nsteps=[{{filter='c{}'}}]\n", i + 1);
        }
        deep += &format!("[[chain]]\nname='c{}'\nsteps=[{{filter='invert'}}]\n", MAX_DEPTH + 2);
        assert!(load_err(&[("deep.toml", &deep)]).contains("more than 32 deep"));
    }

    #[test]
    fn missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = Registry::with_dir(dir.path().join("absent")).err().unwrap();
        assert!(matches!(e, ImagingError::Io(_)), "{e}");
    }

    #[test]
    fn reload_reports_changes_and_keeps_the_old_set_on_error() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.toml", BASIC);
        let r = Registry::with_dir(dir.path()).unwrap();
        assert_eq!(r.reload().unwrap(), ReloadReport::default());
        let held = r.get("smooth").unwrap();

        write(dir.path(), "b.toml", "[[kernel]]\nname='hdiff'\nweights=[[-1,0,1]]\noffset=128");
        let rep = r.reload().unwrap();
        assert_eq!(rep.added, vec!["hdiff".to_string()]);
        assert!(rep.removed.is_empty() && rep.changed.is_empty());
        let g = gray8(3, 1, &[0, 10, 30]);
        assert_eq!(run(&r, "hdiff", &g), gray8(3, 1, &[138, 158, 148]));

        let text = BASIC.replace("[[1, 2, 1]]", "[[1, 0, 1]]").replace(
            "[[chain]]\n        name = \"neg-smooth\"",
            "[[chain]]\n        name = \"neg-smooth2\"",
        );
        write(dir.path(), "a.toml", &text);
        let rep = r.reload().unwrap();
        assert_eq!(rep.added, vec!["neg-smooth2".to_string()]);
        assert_eq!(rep.removed, vec!["neg-smooth".to_string()]);
        assert_eq!(rep.changed, vec!["smooth".to_string()]);
        assert_eq!(rep.to_string(), "added neg-smooth2; removed neg-smooth; changed smooth");
        // The new smooth averages the neighbours; a filter held from before still works.
        assert_eq!(run(&r, "smooth", &g), gray8(3, 1, &[5, 15, 20]));
        assert_eq!(
            held.apply(&g, &Params::new(), &Run::single()).unwrap(),
            gray8(3, 1, &[3, 13, 25])
        );

        // A broken file: the error names it, and everything stays as it was.
        let before = r.list();
        write(dir.path(), "c.toml", "[[chain]]\nname='broken'\nsteps=[{filter='missing'}]");
        match r.reload() {
            Err(ImagingError::BadDefinition { path, reason }) => {
                assert!(path.ends_with("c.toml") && reason.contains("missing"), "{path}: {reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.list(), before);
        assert!(r.get("broken").is_err());
        assert_eq!(run(&r, "hdiff", &g), gray8(3, 1, &[138, 158, 148]));
        // Fixing it loads it.
        write(dir.path(), "c.toml", "[[chain]]\nname='broken'\nsteps=[{filter='invert'}]");
        assert_eq!(r.reload().unwrap().added, vec!["broken".to_string()]);
        std::fs::remove_file(dir.path().join("b.toml")).unwrap();
        assert_eq!(r.reload().unwrap().removed, vec!["hdiff".to_string()]);
    }

    /// Poll `cond` until it holds, for at most 10 s.
    fn eventually(mut cond: impl FnMut() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        cond()
    }

    #[test]
    fn watcher_reloads_on_change_and_reports_errors() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.toml", BASIC);
        let r = Arc::new(Registry::with_dir(dir.path()).unwrap());
        let (tx, rx) = mpsc::channel();
        let handle = r.watch_with(Duration::from_millis(10), move |res| {
            let _ = tx.send(res.map_err(|e| e.to_string()));
        });
        assert!(handle.is_active());

        write(dir.path(), "b.toml", "[[kernel]]\nname='new'\nweights=[[1]]");
        assert!(eventually(|| r.get("new").is_ok()), "watcher never loaded b.toml");
        let first = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        assert_eq!(first.added, vec!["new".to_string()]);

        write(dir.path(), "c.toml", "[[kernel]]\nname='bad'\nweights=[[1, 1]]");
        let err = loop {
            match rx.recv_timeout(Duration::from_secs(10)).expect("no reload reported") {
                Err(e) => break e,
                Ok(rep) => assert!(rep.is_empty(), "{rep}"),
            }
        };
        assert!(err.contains("c.toml"), "{err}");
        assert!(r.get("new").is_ok() && r.get("bad").is_err());

        std::fs::remove_file(dir.path().join("c.toml")).unwrap();
        std::fs::remove_file(dir.path().join("b.toml")).unwrap();
        assert!(eventually(|| r.get("new").is_err()), "watcher never saw the removal");

        drop(handle);
        // The thread has stopped: a new file is no longer picked up by anyone but reload().
        write(dir.path(), "d.toml", "[[kernel]]\nname='late'\nweights=[[1]]");
        assert!(r.get("late").is_err());
        assert_eq!(r.reload().unwrap().added, vec!["late".to_string()]);
    }

    #[test]
    fn watcher_stops_when_the_registry_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let r = Arc::new(Registry::with_dir(dir.path()).unwrap());
        let handle = r.watch(Duration::from_millis(1));
        drop(r);
        assert!(eventually(|| !handle.is_active()));
    }
}
