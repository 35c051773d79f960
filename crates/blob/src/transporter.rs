//! The transporter: copies a blob, or a byte range, between any two proxies by the fastest
//! path the pair allows:
//!
//! | source → destination | path |
//! |---|---|
//! | file → file | `copy_file_range(2)`: the kernel copies (or reflinks) |
//! | memory or file → anything | one slice (memory, or the file mmapped) written in pieces: memcpy into memory, `pwrite` into files, zero-copy `write` into a push |
//! | remote → anything | pull into a buffer, write onward (relay) |
//! | small, memory or file → server | one write: request, bytes and commit pipelined on a kept-alive data connection |

use std::ops::Range;
use std::os::fd::AsRawFd;
use std::time::Duration;

use bs_wire::DigestAlgo;

use crate::error::BlobError;
use crate::factory::{Factory, NewBlob};
use crate::key::BlobKey;
use crate::options::{Completion, Deadline, Options};
use crate::proxy::{BlobProxy, Slot};

type Result<T> = std::result::Result<T, BlobError>;

/// Bytes moved between progress reports and deadline checks.
const PIECE: usize = 8 << 20;
/// Longest wait for a peer on one read or write when no deadline is nearer.
pub(crate) const IO_WAIT: Duration = Duration::from_secs(30);

/// Buffers relayed copies pass through, reused from copy to copy.
static RELAY_BUFFERS: std::sync::LazyLock<bs_wire::BufferPool> =
    std::sync::LazyLock::new(|| bs_wire::BufferPool::new(1 << 20, 8));

/// Which path a copy took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPath {
    /// `copy_file_range` between two local files.
    KernelCopy,
    /// The source as one slice (memory or mmap), written onward without an extra copy.
    Slice,
    /// Pulled from a remote store through a buffer.
    Relay,
    /// Nothing moved: the destination already held the same bytes (same size and digest).
    AlreadyThere,
    /// A small blob pushed in one round trip: request, bytes and commit in one write on a
    /// kept-alive data connection (see `bs_client::Client::try_push_pipelined`).
    Pipelined,
    /// Between a local file and a server as ranges over several connections at once (see
    /// [`crate::ranges`]); `reconnects`: ranges continued (pulls) or pushed again (pushes) on
    /// a new connection after theirs dropped; `splits`: ranges whose rest was split so that a
    /// connection done with its own took over half of it.
    Parallel { connections: usize, reconnects: usize, splits: usize },
    /// A small blob of a batch downloaded to a new local file, its request sent ahead of the
    /// answers to the ones before it on one kept-alive connection (see [`crate::pulls`]).
    PulledAhead,
}

/// What a finished copy did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Bytes moved by this copy (not counting bytes kept from an interrupted one).
    pub bytes: u64,
    /// Offset the copy started at: non-zero when it resumed an interrupted copy.
    pub resumed_from: u64,
    pub path: CopyPath,
}

/// Copies blobs between proxies.
#[derive(Clone, Default)]
pub struct Transporter {
    factory: Factory,
}

impl Transporter {
    pub fn new(factory: Factory) -> Self {
        Self { factory }
    }

    pub fn factory(&self) -> &Factory {
        &self.factory
    }

    /// The resume tag a resumable copy from `src` routes its destination with: the source's
    /// digest when it has one stored, else its key, size and modification time. A copy
    /// routed with the same tag continues what an interrupted one left.
    pub fn resume_tag_of(&self, src: &BlobKey) -> Result<String> {
        Ok(resume_tag(&self.factory().bind(src)?))
    }

    /// Copy the whole blob `src` to a new blob `dst` (routed with the source's size and content
    /// type), resuming an interrupted copy if `opts.resume` is set and the bytes already at the
    /// destination match the source.
    pub fn copy(&self, src: &BlobKey, dst: &BlobKey, opts: &Options) -> Completion<Copied> {
        self.copy_as(src, dst, &NewBlob::default(), opts)
    }

    /// [`Transporter::copy`] with the destination's content type and metadata given by `spec`
    /// (an empty content type means the source's, empty metadata the source's metadata). The
    /// size always comes from the source;
    /// `overwrite` and `resume_tag` from `opts`.
    pub fn copy_as(
        &self,
        src: &BlobKey,
        dst: &BlobKey,
        spec: &NewBlob,
        opts: &Options,
    ) -> Completion<Copied> {
        let (factory, src, dst, o) = (self.factory.clone(), src.clone(), dst.clone(), opts.clone());
        let spec = spec.clone();
        opts.run(move || copy_keys(&factory, &src, &dst, &spec, &o))
    }

    /// Copy `range` of an open reader (all of it when `None`) to an open writer at its current
    /// position; the writer is closed (committed) at the end.
    pub fn copy_range(
        &self,
        mut src: BlobProxy,
        mut dst: BlobProxy,
        range: Option<Range<u64>>,
        opts: &Options,
    ) -> Completion<Copied> {
        let o = opts.clone();
        opts.run(move || {
            let range = range.unwrap_or(0..src.size());
            if range.start > range.end || range.end > src.size() {
                return Err(BlobError::InvalidKey {
                    key: src.key().to_string(),
                    reason: format!("range {range:?} is outside its {} bytes", src.size()),
                });
            }
            let deadline = o.deadline();
            let path = transfer(&mut src, &mut dst, range.clone(), &deadline, &o)
                .and_then(|p| {
                    dst.limit_io(deadline.left(IO_WAIT))?;
                    dst.close().map(|_| p)
                })
                .map_err(|e| deadline.classify(e))?;
            Ok(Copied { bytes: range.end - range.start, resumed_from: 0, path })
        })
    }
}

/// What identifies the source of an interrupted copy: its digest, or for plain files their
/// path, size and modification time.
fn resume_tag(src: &BlobProxy) -> String {
    if let Some(d) = src.digest() {
        return d.to_string();
    }
    let m = src.local_file().and_then(|f| f.metadata().ok());
    let mtime = m
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    format!("{}:{}:{}", src.key(), src.size(), mtime.map_or(0, |d| d.as_nanos()))
}

fn copy_keys(
    factory: &Factory,
    src: &BlobKey,
    dst: &BlobKey,
    template: &NewBlob,
    o: &Options,
) -> Result<Copied> {
    let deadline = o.deadline();
    // Whether this copy reserved the destination (only then is what it holds ours to discard).
    let routed = std::cell::Cell::new(false);
    let run = || -> Result<Copied> {
        let mut src = factory.bind(src)?;
        let size = src.size();
        let content_type = match template.content_type.as_str() {
            "" => src.content_type().to_string(),
            ct => ct.to_string(),
        };
        if o.if_different {
            match same_bytes(factory, &src, dst) {
                Ok(true) => {
                    return Ok(Copied {
                        bytes: 0,
                        resumed_from: size,
                        path: CopyPath::AlreadyThere,
                    });
                }
                // Missing, different, or a corrupt copy: (re)placed below.
                Ok(false) | Err(BlobError::NotFound(_)) => {}
                Err(e) if e.is_integrity() => {}
                Err(e) => return Err(e),
            }
        }
        let overwrite = o.overwrite || o.if_different;
        let spec = NewBlob {
            size: Some(size),
            content_type,
            metadata: if template.metadata.is_empty() {
                src.metadata()
            } else {
                template.metadata.clone()
            },
            overwrite,
            resume_tag: if o.resume { resume_tag(&src) } else { String::new() },
        };
        // A retry of a copy that landed (its confirmation lost to a crash) is a success —
        // unless this copy asked for a description the stored blob does not have (a put run
        // again to set other metadata): then the blob is there, but not as asked.
        let exists = |m: String| match same_bytes(factory, &src, dst) {
            Ok(true) => match described_otherwise(factory, dst, template)? {
                None => Ok(Copied { bytes: 0, resumed_from: size, path: CopyPath::AlreadyThere }),
                Some(what) => Err(BlobError::AlreadyExists(format!(
                    "{m}; it holds the same bytes with other {what}"
                ))),
            },
            Ok(false) => Err(BlobError::AlreadyExists(m)),
            Err(e) if e.is_integrity() => Err(BlobError::AlreadyExists(format!(
                "{m}; the stored copy is corrupt ({e}): replace it with overwrite"
            ))),
            Err(e) => Err(e),
        };
        if let Some(done) = pipelined(factory, &src, dst, &spec, &deadline, o)? {
            routed.set(true);
            return match done {
                Err(BlobError::AlreadyExists(m)) if !overwrite => exists(m),
                other => other,
            };
        }
        let mut out = match factory.route(dst, &spec) {
            Err(BlobError::AlreadyExists(m)) if !overwrite => return exists(m),
            r => r?,
        };
        routed.set(true);
        if let (Some((client, id)), Slot::FileRead { .. }) = (out.remote_writer(), src.slot())
            && let n = crate::ranges::connections(client, dst.name(), size, o.connections)
            && n > 1
            && let Some(data) = src.slice()?
            && let resume = (o.resume && out.held(DigestAlgo::default())?.bytes > 0)
            && let upload = (crate::ranges::Upload { name: dst.name(), id })
            && let file = src.key().name()
            && let readable = (|piece: &[u8]| data.readable(piece, file))
            && let source = (crate::ranges::Source { data: &data, readable: &readable })
            && let Some(p) = crate::ranges::push(client, upload, source, n, resume, &deadline, o)?
        {
            out.committed_elsewhere(size);
            return Ok(Copied {
                bytes: size - p.kept,
                resumed_from: p.kept,
                path: CopyPath::Parallel {
                    connections: p.connections,
                    reconnects: p.reconnects,
                    splits: p.splits,
                },
            });
        }
        if let (Some((client, info)), Some((file, dest))) = (src.remote(), out.file_dest()) {
            let n = crate::ranges::connections(client, &info.name, info.size, o.connections);
            let recorded = o.resume && crate::ranges::recorded(dest, &info.digest, info.size);
            if n > 1 || recorded {
                let p = crate::ranges::pull(client, info, file, dest, n, &deadline, o)?;
                out.seek_unchecked(size);
                out.close()?;
                return Ok(Copied {
                    bytes: p.moved,
                    resumed_from: p.resumed_from,
                    path: CopyPath::Parallel {
                        connections: p.connections,
                        reconnects: p.reconnects,
                        splits: p.splits,
                    },
                });
            }
        }
        let mut start = 0;
        if o.resume {
            let algo = DigestAlgo::default();
            let held = out.held(algo)?;
            if held.bytes > 0 {
                let same =
                    held.bytes <= size && held.digest == Some(src.prefix_digest(held.bytes, algo)?);
                if same {
                    start = held.bytes;
                } else {
                    out = factory.reroute(dst, &spec)?;
                }
            }
        }
        out.seek(start)?;
        let path = transfer(&mut src, &mut out, start..size, &deadline, o)?;
        out.limit_io(deadline.left(IO_WAIT))?;
        out.close()?;
        Ok(Copied { bytes: size - start, resumed_from: start, path })
    };
    let res = run();
    if let Err(e) = &res
        && e.is_integrity()
        && routed.get()
    {
        // Bytes that failed a check (or came from a corrupt source) are never resumed from.
        let _ = factory.discard(dst);
    }
    res.map_err(|e| deadline.classify(e))
}

/// A small blob from memory or a local file to a server, pushed in one round trip when the
/// client can (`None`: it cannot now — copy it the usual way).
fn pipelined(
    factory: &Factory,
    src: &BlobProxy,
    dst: &BlobKey,
    spec: &NewBlob,
    deadline: &Deadline,
    o: &Options,
) -> Result<Option<Result<Copied>>> {
    let crate::key::Location::Remote(server) = dst.location() else { return Ok(None) };
    let size = src.size();
    let client = factory.client(server)?;
    if !client.pipelines(size)
        || !matches!(src.slot(), Slot::MemRead { .. } | Slot::FileRead { .. })
    {
        return Ok(None);
    }
    let Some(data) = src.slice()? else { return Ok(None) };
    data.readable(&data, src.key().name())?;
    deadline.check()?;
    let client = client.within(deadline.left(IO_WAIT));
    let Some(done) =
        client.try_push_pipelined(dst.name(), &data, Some(spec.route_request(dst.name())))
    else {
        return Ok(None);
    };
    Ok(Some(done.map_err(BlobError::from).map(|_| {
        if let Some(p) = &o.progress {
            p(size, size);
        }
        Copied { bytes: size, resumed_from: 0, path: CopyPath::Pipelined }
    })))
}

/// What of the description a copy asked for explicitly (`template`'s content type and
/// metadata, when given) the stored blob `dst` lacks: "metadata", "content type", both, or
/// `None` when it has all of it. A local file keeps neither, so it always has it.
fn described_otherwise(
    factory: &Factory,
    dst: &BlobKey,
    template: &NewBlob,
) -> Result<Option<&'static str>> {
    if matches!(dst.location(), crate::key::Location::File) {
        return Ok(None);
    }
    let existing = factory.bind(dst)?;
    let ct = !template.content_type.is_empty() && template.content_type != existing.content_type();
    let meta = !template.metadata.is_empty() && template.metadata != existing.metadata();
    Ok(match (meta, ct) {
        (false, false) => None,
        (true, false) => Some("metadata"),
        (false, true) => Some("content type"),
        (true, true) => Some("metadata and content type"),
    })
}

/// Whether the existing blob `dst` holds exactly the bytes of `src`: same size and same
/// digest (computed for whichever side has none stored, in the other side's algorithm).
fn same_bytes(factory: &Factory, src: &BlobProxy, dst: &BlobKey) -> Result<bool> {
    let existing = factory.bind(dst)?;
    if existing.size() != src.size() {
        return Ok(false);
    }
    let parse = |p: &BlobProxy| p.digest().and_then(|d| d.parse::<bs_wire::Digest>().ok());
    // The digest of the bytes as read back and verified now, not the one recorded at commit:
    // a stored copy that has rotted since is not "the same".
    let algo = parse(&existing).map_or(DigestAlgo::default(), |d| d.algo);
    let theirs = existing.prefix_digest(existing.size(), algo)?;
    let ours = match parse(src).filter(|d| d.algo == theirs.algo) {
        Some(d) => d,
        None => src.prefix_digest(src.size(), theirs.algo)?,
    };
    Ok(ours == theirs)
}

fn transfer(
    src: &mut BlobProxy,
    dst: &mut BlobProxy,
    range: Range<u64>,
    deadline: &Deadline,
    o: &Options,
) -> Result<CopyPath> {
    if !src.is_reader() || dst.is_reader() {
        return Err(BlobError::WrongState {
            key: dst.key().to_string(),
            state: "not a writer (or the source is not a reader)",
            wanted: "copy",
            needed: "a reader as source and a writer as destination",
        });
    }
    deadline.check()?;
    let total = range.end - range.start;
    let report = |done: u64| {
        if let Some(p) = &o.progress {
            p(done, total);
        }
    };
    report(0);
    if let (Some(_), Some(_), Slot::FileRead { .. }) =
        (src.local_file(), dst.local_file(), src.slot())
        && kernel_copy(src, dst, range.clone(), deadline, &report)?
    {
        return Ok(CopyPath::KernelCopy);
    }
    if let Some(slice) = src.slice()? {
        let data = &slice[range.start as usize..range.end as usize];
        let mut done = 0u64;
        for piece in data.chunks(PIECE) {
            deadline.check()?;
            dst.limit_io(deadline.left(IO_WAIT))?;
            slice.readable(piece, src.key().name())?;
            dst.write(piece)?;
            done += piece.len() as u64;
            report(done);
        }
        return Ok(CopyPath::Slice);
    }
    src.seek(range.start)?;
    let mut buf = RELAY_BUFFERS.get();
    let mut done = 0u64;
    while done < total {
        deadline.check()?;
        src.limit_io(deadline.left(IO_WAIT))?;
        dst.limit_io(deadline.left(IO_WAIT))?;
        let want = (total - done).min(buf.len() as u64) as usize;
        let n = src.read(&mut buf[..want])?;
        if n == 0 {
            break;
        }
        dst.write(&buf[..n])?;
        done += n as u64;
        report(done);
    }
    // Read past the end once so a remote source verifies its digest.
    if src.position() == src.size() {
        src.read(&mut [0u8; 1])?;
    }
    Ok(CopyPath::Relay)
}

/// `copy_file_range` loop. Returns false (nothing copied) where the kernel refuses the pair,
/// so the caller can fall back to the slice path.
fn kernel_copy(
    src: &mut BlobProxy,
    dst: &mut BlobProxy,
    range: Range<u64>,
    deadline: &Deadline,
    report: &dyn Fn(u64),
) -> Result<bool> {
    let (fin, fout) = (
        src.local_file().expect("checked").as_raw_fd(),
        dst.local_file().expect("checked").as_raw_fd(),
    );
    let mut off_in = range.start as libc::loff_t;
    let mut off_out = dst.position() as libc::loff_t;
    let mut done = 0u64;
    let total = range.end - range.start;
    while done < total {
        deadline.check()?;
        let want = (total - done).min(PIECE as u64 * 8) as usize;
        // SAFETY: both descriptors are open for the duration of the call; the offsets are
        // live locals the kernel advances.
        let n = unsafe { libc::copy_file_range(fin, &mut off_in, fout, &mut off_out, want, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if done == 0
                && matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV | libc::ENOSYS | libc::EINVAL | libc::EOPNOTSUPP)
                )
            {
                return Ok(false);
            }
            return Err(BlobError::file(dst.key().name(), e));
        }
        if n == 0 {
            return Err(BlobError::file(
                src.key().name(),
                std::io::ErrorKind::UnexpectedEof.into(),
            ));
        }
        done += n as u64;
        report(done);
    }
    dst.seek_unchecked(dst.position() + done);
    Ok(true)
}
