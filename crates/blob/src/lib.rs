//! The Blob API: name a blob with a [`BlobKey`], get a [`BlobProxy`] for it from the
//! [`Factory`] (`bind` an existing blob, `route` a new one), and copy between any two with the
//! [`Transporter`], which picks the fastest path for the pair. Whether the blob is in memory,
//! in a local file or on a remote blobstream server changes the key, not the program.
//!
//! One [`Options`] value decides how a copy runs. The Blob Streaming paper's synchronous copy,
//! today:
//!
//! ```
//! use std::time::Duration;
//! use bs_blob::{BlobKey, Factory, Options, Transporter};
//!
//! # let dir = tempfile::tempdir()?;
//! # let scan = dir.path().join("ct-slice.raw");
//! # std::fs::write(&scan, vec![7u8; 256 * 1024])?;
//! let transporter = Transporter::new(Factory::new());
//! let src = BlobKey::file(&scan);            // or BlobKey::remote("pacs:7070", "ct/1")
//! let dst = BlobKey::memory("cache/ct-slice");
//!
//! let copied = transporter
//!     .copy(&src, &dst, &Options::blocking().timeout(Duration::from_secs(10)))
//!     .wait()?;                              // already finished: blocking mode
//! assert_eq!(copied.bytes, 256 * 1024);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! and its asynchronous copy: the same call with other options, a completion callback, and
//! a [`Completion`] to wait on (or `.await`) after doing other work:
//!
//! ```
//! use std::time::Duration;
//! use bs_blob::{BlobKey, Factory, Options, Transporter};
//!
//! # let dir = tempfile::tempdir()?;
//! # let scan = dir.path().join("ct-slice.raw");
//! # std::fs::write(&scan, vec![7u8; 256 * 1024])?;
//! let transporter = Transporter::new(Factory::new());
//! let (src, dst) = (BlobKey::file(&scan), BlobKey::memory("cache/ct-slice"));
//!
//! let opts = Options::asynchronous()
//!     .timeout(Duration::from_secs(10))
//!     .on_complete(|result| match result {
//!         Ok(c) => eprintln!("copied {} bytes", c.bytes),
//!         Err(e) if e.is_timeout() => eprintln!("gave up: {e}"),
//!         Err(e) => eprintln!("failed: {e}"),
//!     });
//! let pending = transporter.copy(&src, &dst, &opts);
//! // ... render the previous image meanwhile ...
//! let copied = pending.wait()?;
//! assert_eq!(copied.bytes, 256 * 1024);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod batch;
mod error;
mod factory;
mod key;
mod options;
pub mod partlock;
mod proxy;
mod pulls;
pub mod ranges;
mod transporter;

pub use batch::{
    BatchProgress, BatchReport, Job, Outcome, Problem, Selection, folder_prefix, plan_delete,
    plan_download, plan_upload,
};
pub use error::BlobError;
pub use factory::{Factory, NewBlob};
pub use key::{BlobKey, Location};
pub use options::{Callback, Completion, Mode, Options, Progress};
pub use proxy::{BlobProxy, part_path};
pub use pulls::{PULL_AHEAD_UP_TO, RUN as PULL_AHEAD_RUN};
pub use transporter::{Copied, CopyPath, Transporter};
