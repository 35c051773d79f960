//! How a long operation runs: one [`Options`] value chooses blocking or asynchronous, with an
//! optional timeout and completion callback. Switching a program between the two changes that
//! value and nothing else: both return a [`Completion`], which is already finished in blocking
//! mode and can be `wait`ed on or `.await`ed in either.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::BlobError;
use crate::transporter::Copied;

/// Blocking, or on a thread of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Blocking,
    Async,
}

/// Called once with the outcome, on the thread that did the work.
pub type Callback = Arc<dyn Fn(&Result<Copied, BlobError>) + Send + Sync>;
/// Called with (bytes done, bytes in all) as a copy advances.
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// How to run a copy.
#[derive(Clone, Default)]
pub struct Options {
    pub mode: Mode,
    /// Give up (with [`BlobError::Timeout`]) when the work takes longer than this.
    pub timeout: Option<Duration>,
    pub on_complete: Option<Callback>,
    pub progress: Option<Progress>,
    /// Continue an interrupted copy where it stopped (after checking the bytes already there).
    pub resume: bool,
    /// Replace an existing destination.
    pub overwrite: bool,
    /// Sync: leave a destination that already holds the same bytes (same size and digest,
    /// read back now) as it is, and replace one that differs.
    pub if_different: bool,
    /// Data connections for one blob moved between a local file and a server (pulled into
    /// the file, or pushed from it), each carrying a range (see [`crate::ranges`]); 0 lets the
    /// copy choose (several only for a large blob and a far server), 1 is one connection.
    pub connections: usize,
    /// A batch ([`crate::Transporter::copy_batch`]) starts no further copy once this is set
    /// (a Ctrl-C, say): the copies running finish, those not started are reported as
    /// [`BlobError::NotStarted`].
    pub stop: Option<Arc<AtomicBool>>,
}

impl Options {
    /// Run in the caller's thread; `Completion::wait` returns at once.
    pub fn blocking() -> Self {
        Self {
            mode: Mode::Blocking,
            timeout: None,
            on_complete: None,
            progress: None,
            resume: false,
            overwrite: false,
            if_different: false,
            connections: 0,
            stop: None,
        }
    }

    /// Run on a thread of its own; the caller gets a `Completion` to wait on or await.
    pub fn asynchronous() -> Self {
        Self { mode: Mode::Async, ..Self::blocking() }
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    pub fn on_complete(
        mut self,
        f: impl Fn(&Result<Copied, BlobError>) + Send + Sync + 'static,
    ) -> Self {
        self.on_complete = Some(Arc::new(f));
        self
    }

    pub fn progress(mut self, f: impl Fn(u64, u64) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(f));
        self
    }

    pub fn resume(mut self, yes: bool) -> Self {
        self.resume = yes;
        self
    }

    pub fn overwrite(mut self, yes: bool) -> Self {
        self.overwrite = yes;
        self
    }

    /// Data connections for one blob (see [`Options::connections`]).
    pub fn connections(mut self, n: usize) -> Self {
        self.connections = n;
        self
    }

    pub fn if_different(mut self, yes: bool) -> Self {
        self.if_different = yes;
        self
    }

    /// Stop a batch from starting further copies once `flag` is set (see [`Options::stop`]).
    pub fn stop_when(mut self, flag: Arc<AtomicBool>) -> Self {
        self.stop = Some(flag);
        self
    }

    /// Is the batch asked to stop?
    pub(crate) fn stopped(&self) -> bool {
        self.stop.as_ref().is_some_and(|f| f.load(std::sync::atomic::Ordering::Acquire))
    }

    pub(crate) fn deadline(&self) -> Deadline {
        Deadline { at: self.timeout.map(|t| (Instant::now() + t, t)) }
    }
}

impl Options {
    /// Run `job` as these options say.
    pub(crate) fn run(
        &self,
        job: impl FnOnce() -> Result<Copied, BlobError> + Send + 'static,
    ) -> Completion<Copied> {
        let (tx, rx) = oneshot::channel();
        let cb = self.on_complete.clone();
        let work = move || {
            let r = job();
            if let Some(cb) = cb {
                cb(&r);
            }
            let _ = tx.send(r);
        };
        match self.mode {
            Mode::Blocking => work(),
            Mode::Async => {
                std::thread::Builder::new()
                    .name("blobstream-copy".into())
                    .spawn(work)
                    .expect("spawning a copy thread");
            }
        }
        Completion { rx }
    }
}

/// A point in time work must finish by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Option<(Instant, Duration)>,
}

impl Deadline {
    /// Error if the deadline has passed.
    pub(crate) fn check(&self) -> Result<(), BlobError> {
        match self.at {
            Some((at, t)) if Instant::now() >= at => Err(BlobError::Timeout(t)),
            _ => Ok(()),
        }
    }

    /// Time left, capped at `cap`.
    pub(crate) fn left(&self, cap: Duration) -> Duration {
        match self.at {
            Some((at, _)) => at.saturating_duration_since(Instant::now()).min(cap),
            None => cap,
        }
    }

    /// Map an error caused by the clock running out to `Timeout`.
    pub(crate) fn classify(&self, e: BlobError) -> BlobError {
        let timed_out = match &e {
            BlobError::Remote(c) => c.is_timeout(),
            _ => false,
        };
        match self.at {
            Some((_, t)) if timed_out => BlobError::Timeout(t),
            _ => e,
        }
    }
}

/// The outcome of an operation, now or later.
#[derive(Debug)]
pub struct Completion<T> {
    rx: oneshot::Receiver<Result<T, BlobError>>,
}

impl<T> Completion<T> {
    /// Block until the outcome is known. Do not call from inside an async task: `.await` it.
    pub fn wait(self) -> Result<T, BlobError> {
        self.rx.blocking_recv().unwrap_or(Err(BlobError::Lost))
    }

    /// The outcome if it is known already.
    pub fn try_result(&mut self) -> Option<Result<T, BlobError>> {
        match self.rx.try_recv() {
            Ok(r) => Some(r),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(BlobError::Lost)),
        }
    }
}

impl<T> Future for Completion<T> {
    type Output = Result<T, BlobError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx).poll(cx).map(|r| r.unwrap_or(Err(BlobError::Lost)))
    }
}
