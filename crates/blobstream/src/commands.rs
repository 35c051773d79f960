//! The client commands: thin shells over the Blob API and the client library.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bs_blob::{BlobKey, Factory, Location, NewBlob, Options, Transporter};
use bs_client::{BlobInfo, Client, TransferSettings};

use crate::cli::{CpArgs, GetArgs, Global, LsArgs, PutArgs, TransferFlags};
use crate::{progress, security};

/// The context of every write to stdout, so a closed pipe can be told from other errors.
pub const STDOUT: &str = "writing to stdout";

/// `s` as one line a terminal may show: control characters (an escape sequence in a file name
/// that would recolour or rewrite the terminal, a line break that would split a report line)
/// written as `\u{1b}`, `\n`.
pub fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return s.into();
    }
    let one = |c: char| if c.is_control() { c.escape_default().to_string() } else { c.to_string() };
    s.chars().map(one).collect()
}

/// Whether `e` is stdout's reader going away (EPIPE on a write to stdout).
pub fn stdout_closed(e: &anyhow::Error) -> bool {
    e.to_string() == STDOUT
        && e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        })
}

pub fn client(g: &Global) -> Result<Client> {
    client_for(g, &g.server)
}

/// A control-plane client of `server`, with --server's TLS and token settings.
pub fn client_for(g: &Global, server: &str) -> Result<Client> {
    Ok(Client::connect_with(server, security::client(g)?)?)
}

pub fn factory(g: &Global, t: &TransferFlags) -> Result<Factory> {
    let layers = t
        .layers
        .iter()
        .map(|l| l.parse::<bs_binding::LayerSpec>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Usage(format!("--layer: {e}")))?;
    let security = security::client(g)?;
    if security.tls.is_none() && layers.contains(&bs_binding::LayerSpec::Encrypt) {
        usage!("--layer encrypt is TLS: give --tls-ca (the server's CA; it serves TLS)");
    }
    let settings = TransferSettings { layers, ..TransferSettings::default() };
    Ok(Factory::with_config(settings, security))
}

/// A `cp` operand: `bs:NAME` on --server, `blob://HOST:PORT/NAME`, or a local path.
pub fn operand(g: &Global, s: &str) -> Result<BlobKey> {
    if let Some(name) = s.strip_prefix("bs:") {
        if name.is_empty() {
            bail!("empty blob name in {s:?}");
        }
        return Ok(BlobKey::remote(&g.server, name));
    }
    Ok(s.parse()?)
}

/// Refuse flags that only mean something for many blobs on a single copy.
fn single(many: &crate::cli::ManyFlags) -> Result<()> {
    if many.given() {
        usage!("--jobs, --json, --include and --exclude go with -r (a folder or a prefix)");
    }
    Ok(())
}

/// Content type from a file's extension.
fn guess_content_type(path: &Path) -> &'static str {
    bs_store::guess_content_type(&path.to_string_lossy())
}

/// Run a whole-blob copy with a progress bar; returns what the transporter reports.
fn copy(
    g: &Global,
    t: &TransferFlags,
    src: &BlobKey,
    dst: &BlobKey,
    spec: &NewBlob,
    opts: Options,
) -> Result<bs_blob::Copied> {
    let transporter = Transporter::new(factory(g, t)?);
    let pb = progress::bar(dst.name());
    let (pb2, quiet) = (pb.clone(), g.quiet);
    let opts = opts
        .connections(t.connections)
        .progress(move |done, total| progress::update(&pb2, done, total, quiet));
    let res = transporter.copy_as(src, dst, spec, &opts).wait();
    pb.finish_and_clear();
    res.with_context(|| format!("copying {src} to {dst}"))
}

/// A command line that cannot work (options that do not go together, a malformed glob or
/// layer): the process exits with 2, as for clap's own usage errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// A command stopped by a signal before it was done (a folder copy after Ctrl-C): the process
/// exits with 130, as a shell reports a program ended by SIGINT.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Interrupted(pub String);

/// `--include` and `--exclude` as a selection; a malformed pattern is a usage error naming it.
pub fn selection(include: &[String], exclude: &[String]) -> Result<bs_blob::Selection> {
    bs_blob::Selection::new(include, exclude).map_err(|e| match e {
        bs_blob::BlobError::InvalidKey { key, reason } => {
            Usage(format!("--include/--exclude: the pattern {key:?} is malformed: {reason}")).into()
        }
        e => e.into(),
    })
}

/// `--meta` pairs as one map; a key given twice is a usage error (one value would be dropped
/// without a word).
pub fn user_metadata(
    meta: Vec<(String, String)>,
) -> Result<std::collections::BTreeMap<String, String>> {
    let mut out = std::collections::BTreeMap::new();
    for (k, v) in meta {
        if out.contains_key(&k) {
            return Err(Usage(format!(
                "--meta {}=… is given twice: give one value (several can be one text)",
                shown(&k)
            ))
            .into());
        }
        out.insert(k, v);
    }
    Ok(out)
}

/// Fail with a usage error (exit status 2).
macro_rules! usage {
    ($($t:tt)*) => {
        return Err($crate::commands::Usage(format!($($t)*)).into())
    };
}
pub(crate) use usage;

fn name_overwrite(dst: &BlobKey) -> impl FnOnce(anyhow::Error) -> anyhow::Error + '_ {
    move |e| match e.downcast_ref::<bs_blob::BlobError>() {
        Some(bs_blob::BlobError::AlreadyExists(m)) => {
            anyhow::anyhow!("{dst} already exists{}", in_the_way(m))
        }
        _ => e,
    }
}

/// What to say after "X already exists" of a blob in a copy's way (`m`, the refusal), naming
/// the flag that replaces it: other bytes, the same bytes described otherwise than the copy
/// asks (`--meta`, `--content-type`), or the same bytes over a stored copy that rotted.
pub(crate) fn in_the_way(m: &str) -> String {
    if m.contains("the stored copy is corrupt") {
        let (_, why) = m.split_once("; ").unwrap_or(("", m));
        return format!(
            ": {}",
            why.replace("replace it with overwrite", "--overwrite replaces it")
        );
    }
    if let Some((_, what)) = m.split_once("the same bytes with other ") {
        return format!(" with these bytes but other {what} (--overwrite replaces it)");
    }
    " with other content (--overwrite replaces it)".into()
}

fn report(g: &Global, what: &str, c: &bs_blob::Copied) {
    let what = shown(what);
    if c.path == bs_blob::CopyPath::AlreadyThere {
        if !g.quiet {
            eprintln!("{what}: already there ({} bytes, same digest)", c.resumed_from);
        }
        return;
    }
    if !g.quiet {
        let resumed = match c.path {
            _ if c.resumed_from == 0 => String::new(),
            // Ranges kept from an interrupted copy need not be one prefix.
            bs_blob::CopyPath::Parallel { .. } => {
                format!(" ({} bytes kept from the interrupted copy)", c.resumed_from)
            }
            _ => format!(" (resumed at byte {})", c.resumed_from),
        };
        let over = match c.path {
            bs_blob::CopyPath::Parallel { connections, reconnects, splits } => {
                let mut notes = Vec::new();
                if reconnects > 0 {
                    notes.push(format!("{reconnects} reconnected"));
                }
                if splits > 0 {
                    let ranges = if splits == 1 { "range" } else { "ranges" };
                    notes.push(format!("{splits} {ranges} split"));
                }
                let notes = if notes.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", notes.join(", "))
                };
                format!(" over {connections} connections{notes}")
            }
            _ => String::new(),
        };
        eprintln!("{what}: {} bytes{resumed}{over}", c.bytes + c.resumed_from);
    }
}

/// A blob name (or prefix) as every command takes it: `bs:NAME` too, as cp and sync write
/// it; a `blob://` URL is refused (it names another server: cp takes it).
pub(crate) fn blob_name(key: String) -> Result<String> {
    if key.starts_with("blob://") {
        usage!(
            "{key}: a blob:// URL names a server too, which cp takes (cp FILE URL, cp URL FILE)"
        );
    }
    Ok(match key.strip_prefix("bs:") {
        Some(name) => name.to_string(),
        None => key,
    })
}

pub fn put(g: &Global, a: PutArgs) -> Result<()> {
    let a = PutArgs { key: blob_name(a.key)?, ..a };
    if a.batch.recursive {
        return crate::batch::put(g, a);
    }
    single(&a.batch.many)?;
    if a.file.to_str().is_none() {
        usage!(
            "the file name {} is not UTF-8, which blob names are (rename the file)",
            a.file.display()
        );
    }
    if a.file.as_os_str() == "-" && !a.file.exists() {
        usage!("put reads a file, not standard input: give the file's path");
    }
    if a.file.is_dir() {
        usage!("{} is a folder: put -r uploads a folder's files", a.file.display());
    }
    let src = BlobKey::file(&a.file);
    let dst = BlobKey::remote(&g.server, &a.key);
    // No --content-type: the file's, guessed as the copy reads it, and no demand on a blob
    // already there (the same bytes stored under another type are "already there").
    let spec = NewBlob {
        content_type: a.content_type.unwrap_or_default(),
        metadata: user_metadata(a.meta)?.into_iter().collect(),
        ..NewBlob::default()
    };
    let opts = Options::blocking().resume(!a.no_resume).overwrite(a.overwrite);
    let c = copy(g, &a.transfer, &src, &dst, &spec, opts).map_err(name_overwrite(&dst))?;
    report(g, &format!("put {}", a.key), &c);
    Ok(())
}

pub fn get(g: &Global, a: GetArgs) -> Result<()> {
    let a = GetArgs { key: blob_name(a.key)?, ..a };
    if a.batch.recursive {
        return crate::batch::get(g, a);
    }
    single(&a.batch.many)?;
    let src = BlobKey::remote(&g.server, &a.key);
    if a.file == "-" {
        return stream_into(g, &a.transfer, &src, std::io::stdout().lock(), STDOUT);
    }
    let dest = match local_destination(&a.file, &a.key)? {
        Dest::File(p) => p,
        Dest::Special(p) => return stream_to_special(g, &a.transfer, &src, &p),
    };
    let c = copy(
        g,
        &a.transfer,
        &src,
        &BlobKey::file(&dest),
        &NewBlob::default(),
        Options::blocking().resume(!a.no_resume).overwrite(true),
    )?;
    report(g, &format!("get {} -> {}", a.key, dest.display()), &c);
    Ok(())
}

/// Where a blob named `key` goes when asked into the local path `file`, as cp(1) puts it.
enum Dest {
    /// A regular file (made or replaced through its part file).
    File(PathBuf),
    /// A device, FIFO or socket: written into as it is, never replaced.
    Special(PathBuf),
}

/// Resolve `file` for blob `key`: an existing folder takes the blob under its last name; a
/// symbolic link is followed (its target replaced, the link kept); a device or FIFO is
/// written into. Checked before any byte moves, so a transfer never ends in "is a directory".
fn local_destination(file: &str, key: &str) -> Result<Dest> {
    if file.is_empty() {
        usage!("an empty destination (give a file, a folder, or - for stdout)");
    }
    let base = key.rsplit('/').next().unwrap_or(key);
    let mut p = PathBuf::from(file);
    if p.is_dir() {
        p = p.join(base);
    } else if file.ends_with('/') {
        bail!("the folder {file} does not exist");
    }
    // Through links to what they name (also a link that names nothing yet); as many as the
    // kernel follows in one path.
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&p).with_context(|| p.display().to_string())?;
                p = match p.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            _ => break,
        }
    }
    match std::fs::metadata(&p) {
        Ok(m) if m.is_dir() => bail!("{} is a folder", p.display()),
        Ok(m) if !m.is_file() => Ok(Dest::Special(p)),
        _ => {
            let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
            if let Some(dir) = parent.filter(|d| !d.is_dir()) {
                bail!("the folder {} does not exist", dir.display());
            }
            Ok(Dest::File(p))
        }
    }
}

/// Write blob `src` into `out` as it arrives (every chunk checked by the server before it is
/// sent; the end-to-end digest after the last byte: a failure then is the exit status).
fn stream_into(
    g: &Global,
    t: &TransferFlags,
    src: &BlobKey,
    mut out: impl Write,
    what: &'static str,
) -> Result<()> {
    let mut p = factory(g, t)?.bind(src)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = p.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).context(what)?;
    }
    out.flush().context(what)?;
    Ok(())
}

/// [`stream_into`] a device, FIFO or socket at `path` (opened for writing, not replaced).
fn stream_to_special(g: &Global, t: &TransferFlags, src: &BlobKey, path: &Path) -> Result<()> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    stream_into(g, t, src, f, "writing into the special file")?;
    if !g.quiet {
        let line = format!("get {src} -> {}: written into it (not a regular file)", path.display());
        eprintln!("{}", shown(&line));
    }
    Ok(())
}

pub fn cp(g: &Global, a: CpArgs) -> Result<()> {
    // `-` is standard output, as for `get`; not standard input (a file named `-` is ./-).
    let is_stdio = |o: &str| o == "-" && !Path::new("-").exists();
    if is_stdio(&a.src) {
        usage!("cp reads a file or a blob, not standard input: give the file's path");
    }
    let src = operand(g, &a.src)?;
    // (As for `get`: `-` as the destination is standard output, whatever files are here.)
    if a.dst == "-" {
        if src.location() == &Location::File {
            usage!("cp to - writes a blob to standard output: give bs:NAME as the source");
        }
        return stream_into(g, &a.transfer, &src, std::io::stdout().lock(), STDOUT);
    }
    let mut dst = operand(g, &a.dst)?;
    if let Some(path) = dst.path() {
        // Into a local path: a folder, a link or a special file as `get` takes them (the
        // file's name from the source's, a blob's or a local file's).
        let local = src.path().and_then(|p| p.file_name().map(|n| n.to_string_lossy().into()));
        let name: String = local.unwrap_or_else(|| src.name().to_string());
        match local_destination(&path.to_string_lossy(), &name)? {
            Dest::File(p) => dst = BlobKey::file(&p),
            Dest::Special(p) if matches!(src.location(), Location::Remote(_)) => {
                return stream_to_special(g, &a.transfer, &src, &p);
            }
            Dest::Special(p) => bail!("{} is not a regular file", p.display()),
        }
    }
    // Local files are replaced like cp(1) does; blobs only when asked.
    let overwrite = a.overwrite || *dst.location() == Location::File;
    // A blob keeps its user metadata: the transporter takes the source's when none is given.
    let spec = NewBlob {
        content_type: src.path().map(|p| guess_content_type(&p).to_string()).unwrap_or_default(),
        ..NewBlob::default()
    };
    let opts = Options::blocking().resume(!a.no_resume).overwrite(overwrite);
    let c = copy(g, &a.transfer, &src, &dst, &spec, opts).map_err(name_overwrite(&dst))?;
    report(g, &format!("cp {src} -> {dst}"), &c);
    Ok(())
}

fn info_json(b: &BlobInfo) -> serde_json::Value {
    serde_json::json!({
        "name": b.name,
        "size": b.size,
        "content_type": b.content_type,
        "digest": b.digest,
        "created_unix_ms": b.created_unix_ms,
        "created": utc(b.created_unix_ms),
        "metadata": b.metadata,
        "corrupt": (!b.corrupt.is_empty()).then_some(&b.corrupt),
    })
}

pub fn ls(g: &Global, a: LsArgs) -> Result<()> {
    let blobs = client(g)?.list(&a.prefix)?;
    let mut out = std::io::stdout().lock();
    if a.json {
        let v: Vec<_> = blobs.iter().map(info_json).collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?).context(STDOUT)?;
        return Ok(());
    }
    for b in &blobs {
        let size = if a.human { crate::batch::human(b.size) } else { b.size.to_string() };
        let (when, name) = (utc(b.created_unix_ms), shown(&b.name));
        match b.corrupt.as_str() {
            "" => writeln!(out, "{size:>14}  {when}  {name}"),
            why => writeln!(out, "{size:>14}  {when}  {name}  CORRUPT: {}", shown(why)),
        }
        .context(STDOUT)?;
    }
    let marked = blobs.iter().filter(|b| !b.corrupt.is_empty()).count();
    if marked > 0 {
        eprintln!(
            "{marked} blob(s) marked corrupt: reads are refused; put a good copy over each with \
             --overwrite, or rm it (blobstream stat KEY says why)"
        );
    }
    Ok(())
}

pub fn stat(g: &Global, key: &str, json: bool) -> Result<()> {
    let b = client(g)?.stat(key)?;
    let corrupt = (!b.corrupt.is_empty()).then_some(&b.corrupt);
    if json {
        let mut v = info_json(&b);
        v["corrupt"] = serde_json::json!(corrupt);
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    // Every stored text escaped: a blob stored before the checks (or by another server) may
    // hold control characters.
    if let Some(why) = corrupt {
        let why = shown(why);
        println!(
            "CORRUPT:      {why} (readers are refused: put a good copy over it with --overwrite, \
             or rm it)"
        );
    }
    println!("name:         {}", shown(&b.name));
    println!("size:         {}", b.size);
    println!("content type: {}", shown(&b.content_type));
    println!("digest:       {}", shown(&b.digest));
    println!("created:      {}", utc(b.created_unix_ms));
    let mut meta: Vec<_> = b.metadata.iter().collect();
    meta.sort();
    for (k, v) in meta {
        println!("meta {}: {}", shown(k), shown(v));
    }
    Ok(())
}

pub fn rm(g: &Global, keys: &[String], recursive: bool) -> Result<()> {
    let c = client(g)?;
    if !recursive {
        // Like rm(1): every name is tried, each failure said, and the exit is 1 if any failed.
        if let [k] = keys {
            return c.delete(k).with_context(|| format!("removing {k}"));
        }
        let mut failed = 0;
        for k in keys {
            if let Err(e) = c.delete(k) {
                eprintln!("FAILED {k}: {e}");
                failed += 1;
            }
        }
        if failed > 0 {
            bail!("rm: {failed} of {} blobs could not be removed (named above)", keys.len());
        }
        return Ok(());
    }
    let (mut removed, mut failed, mut empty) = (0, 0, 0);
    for k in keys {
        let prefix = bs_blob::folder_prefix(k);
        if prefix.is_empty() {
            usage!("rm -r: refusing to remove every blob (give a prefix)");
        }
        let under = c.list(&prefix).with_context(|| format!("listing {prefix}"))?;
        if under.is_empty() {
            // Nothing to remove is a mistake to say (a typo, or a blob's own name).
            let hint = match c.stat(k.trim_end_matches('/')) {
                Ok(_) => format!(" ({} is a blob: `rm {0}` removes it)", k.trim_end_matches('/')),
                Err(_) => String::new(),
            };
            eprintln!("FAILED {k}: no blobs under {prefix:?}{hint}");
            empty += 1;
        }
        for b in under {
            match c.delete(&b.name) {
                Ok(()) => removed += 1,
                // Removed meanwhile by someone else: gone either way.
                Err(bs_client::ClientError::NotFound(_)) => {}
                Err(e) => {
                    eprintln!("FAILED {}: {e}", b.name);
                    failed += 1;
                }
            }
        }
    }
    if !g.quiet {
        eprintln!("rm -r: removed {removed} blobs");
    }
    match (failed, empty) {
        (0, 0) => {}
        (0, n) => bail!("rm -r: {n} of the prefixes given hold no blob (each named above)"),
        (f, 0) => bail!("rm -r: {f} could not be removed (each named above)"),
        (f, n) => bail!(
            "rm -r: {f} could not be removed, and {n} of the prefixes given hold no blob (each \
             named above)"
        ),
    }
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SSZ` for Unix milliseconds (civil-from-days, H. Hinnant's algorithm:
/// one small function instead of a date crate).
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_known_instants() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_795_000_000_123), "2026-11-18T11:06:40Z");
    }

    #[test]
    fn operands_and_content_types() {
        let g = Global {
            server: "h:1".into(),
            quiet: true,
            auth_token_file: None,
            tls_ca: None,
            tls_domain: None,
        };
        assert_eq!(operand(&g, "bs:a/b").unwrap(), BlobKey::remote("h:1", "a/b"));
        assert_eq!(operand(&g, "blob://x:2/n").unwrap(), BlobKey::remote("x:2", "n"));
        assert_eq!(operand(&g, "local.bin").unwrap(), BlobKey::file("local.bin"));
        assert!(operand(&g, "bs:").is_err());
        assert_eq!(guess_content_type(Path::new("x/CT.DCM")), "application/dicom");
        assert_eq!(guess_content_type(Path::new("noext")), "application/octet-stream");
    }
}
