//! `blobstream check`: local files against their blobs, by size and digest — did the study
//! arrive whole, is the local copy still what the store holds. The local files are compared
//! with the digests recorded when the blobs were stored; then (unless `--recorded-only`) the
//! server re-reads its copies of those found the same, checking every chunk against its
//! digest (with -r a scrub of the prefix, else a digest of the one blob read whole), so a
//! blob rotted on the server's disk is not called "same".

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bs_wire::Digest;

use crate::cli::{CheckArgs, Global};
use crate::commands::{self, STDOUT};

/// How a local file and its blob compare.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Same,
    Differs(String),
    OnlyLocal,
    OnlyOnServer,
    Unreadable(String),
    /// The local copy matches the recorded digest, but the server's copy no longer does.
    CorruptOnServer(String),
}

impl Verdict {
    /// A stable word for scripts (`--json`'s "status").
    fn status(&self) -> &'static str {
        match self {
            Self::Same => "same",
            Self::Differs(_) => "differs",
            Self::OnlyLocal => "missing_on_server",
            Self::OnlyOnServer => "missing_locally",
            Self::Unreadable(_) => "unreadable",
            Self::CorruptOnServer(_) => "corrupt_on_server",
        }
    }

    fn word(&self) -> String {
        match self {
            Self::Same => "same".into(),
            Self::Differs(why) => format!("DIFFERS ({why})"),
            Self::OnlyLocal => "MISSING on the server".into(),
            Self::OnlyOnServer => "MISSING locally".into(),
            Self::Unreadable(e) => format!("UNREADABLE ({e})"),
            Self::CorruptOnServer(why) => format!("CORRUPT on the server ({why})"),
        }
    }
}

/// How the server's copy of blob `key` (`size` bytes, recorded as `digest`, which the local
/// file matched) reads back now: the server reads it whole, checking every chunk against its
/// digest (a corrupt one is marked), and the digest of the whole must be the recorded one.
fn server_copy(client: &bs_client::Client, key: &str, size: u64, digest: &str) -> Verdict {
    let Ok(recorded) = digest.parse::<Digest>() else {
        return Verdict::Unreadable(format!("the server's digest {digest:?}"));
    };
    match client.range_digest(key, 0, size, recorded.algo) {
        Ok(d) if d == recorded => Verdict::Same,
        Ok(d) => Verdict::CorruptOnServer(format!("reads back as {d}, recorded as {recorded}")),
        Err(bs_client::ClientError::Corrupt(why)) => Verdict::CorruptOnServer(why),
        Err(bs_client::ClientError::NotFound(_)) => Verdict::OnlyLocal,
        Err(e) => Verdict::Unreadable(format!("on the server: {e}")),
    }
}

fn compare(path: &Path, size: u64, digest: &str) -> Verdict {
    let want: Digest = match digest.parse() {
        Ok(d) => d,
        Err(e) => return Verdict::Unreadable(format!("the server's digest {digest:?}: {e}")),
    };
    match std::fs::metadata(path) {
        Err(e) => return Verdict::Unreadable(e.to_string()),
        Ok(m) if m.len() != size => {
            return Verdict::Differs(format!("{} bytes here, {size} on the server", m.len()));
        }
        Ok(_) => {}
    }
    let digest =
        std::fs::File::open(path).and_then(|f| bs_store::digest_file_range(&f, 0, size, want.algo));
    match digest {
        Ok(d) if d == want => Verdict::Same,
        Ok(d) => Verdict::Differs(format!("digest {d} here, {want} on the server")),
        Err(e) => Verdict::Unreadable(e.to_string()),
    }
}

pub fn run(g: &Global, a: CheckArgs) -> Result<()> {
    let client = commands::client(g)?;
    let mut rows: Vec<(String, PathBuf, Verdict)> = Vec::new();
    if a.recursive {
        if !a.file.exists() {
            bail!("check -r: {} does not exist", a.file.display());
        }
        if !a.file.is_dir() {
            bail!("check -r: {} is not a folder", a.file.display());
        }
        let prefix = bs_blob::folder_prefix(&a.key);
        let selection = crate::commands::selection(&a.include, &a.exclude)?;
        let taken = |name: &str| selection.takes(name.strip_prefix(&prefix).unwrap_or(name));
        let mut remote: BTreeMap<String, (u64, String)> = client
            .list(&prefix)
            .with_context(|| format!("listing {prefix:?}"))?
            .into_iter()
            .filter(|b| taken(&b.name))
            .map(|b| (b.name, (b.size, b.digest)))
            .collect();
        let (mut local, problems) = bs_blob::plan_upload(&a.file, &g.server, &prefix);
        local.retain(|j| taken(&j.name));
        // What `put -r` skips on purpose (links to folders, special files) is not compared.
        for p in problems.into_iter().filter(|p| p.failed) {
            rows.push((p.what.clone(), PathBuf::from(&p.what), Verdict::Unreadable(p.reason)));
        }
        for j in local {
            let path = j.src.path().expect("a local file").to_path_buf();
            let v = match remote.remove(&j.name) {
                Some((size, digest)) => compare(&path, size, &digest),
                None => Verdict::OnlyLocal,
            };
            rows.push((j.name, path, v));
        }
        for name in remote.into_keys() {
            let rel = name.strip_prefix(&prefix).unwrap_or(&name);
            let path = a.file.join(rel);
            rows.push((name, path, Verdict::OnlyOnServer));
        }
    } else {
        if !a.include.is_empty() || !a.exclude.is_empty() {
            crate::commands::usage!(
                "--include and --exclude go with -r (a folder against a prefix)"
            );
        }
        if a.file.is_dir() {
            crate::commands::usage!(
                "check: {} is a folder (check -r compares a folder)",
                a.file.display()
            );
        }
        let v = match client.stat(&a.key) {
            Ok(b) => match compare(&a.file, b.size, &b.digest) {
                // The server re-reads this one blob, every chunk against its digest.
                Verdict::Same if !a.recorded_only => {
                    server_copy(&client, &a.key, b.size, &b.digest)
                }
                v => v,
            },
            Err(bs_client::ClientError::NotFound(_)) => Verdict::OnlyLocal,
            Err(e) => return Err(e).with_context(|| format!("reading {}", a.key)),
        };
        rows.push((a.key.clone(), a.file.clone(), v));
    }
    if a.recursive && !a.recorded_only && rows.iter().any(|r| r.2 == Verdict::Same) {
        let prefix = bs_blob::folder_prefix(&a.key);
        let mut server: BTreeMap<String, Verdict> = BTreeMap::new();
        let spinner = crate::scrub::spinner(g, a.json, "check: the server re-reads its copies");
        client
            .scrub(&prefix, 0, |ev| {
                use bs_client::scrub_event::Outcome;
                let v = match Outcome::try_from(ev.outcome).unwrap_or(Outcome::Failed) {
                    Outcome::Ok => Verdict::Same,
                    Outcome::Corrupt => Verdict::CorruptOnServer(ev.error.clone()),
                    Outcome::Failed => Verdict::Unreadable(format!("on the server: {}", ev.error)),
                };
                server.insert(ev.name.clone(), v);
                if let Some(pb) = &spinner {
                    pb.set_message(ev.name.clone());
                }
            })
            .with_context(|| {
                format!("having the server re-read {prefix:?} (--recorded-only skips this)")
            })?;
        if let Some(pb) = spinner {
            pb.finish_and_clear();
        }
        for (name, _, v) in rows.iter_mut().filter(|r| r.2 == Verdict::Same) {
            // Not scrubbed: deleted since it was compared.
            *v = server.remove(name.as_str()).unwrap_or(Verdict::OnlyLocal);
        }
    }
    rows.sort_by(|x, y| x.0.cmp(&y.0));
    let bad = rows.iter().filter(|r| r.2 != Verdict::Same).count();
    let mut out = std::io::stdout().lock();
    if a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(name, path, v)| {
                serde_json::json!({
                    "name": name,
                    "path": path.display().to_string(),
                    "same": *v == Verdict::Same,
                    "status": v.status(),
                    "verdict": v.word(),
                })
            })
            .collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?).context(STDOUT)?;
    } else {
        for (name, path, v) in &rows {
            if *v != Verdict::Same || !g.quiet {
                writeln!(out, "{:<8} {name} ({})", v.word(), path.display()).context(STDOUT)?;
            }
        }
    }
    if bad > 0 {
        let count = |s: &str| rows.iter().filter(|r| r.2.status() == s).count();
        let kinds = [
            ("differs", "differ"),
            ("missing_on_server", "missing on the server"),
            ("missing_locally", "missing locally"),
            ("unreadable", "unreadable"),
            ("corrupt_on_server", "corrupt on the server"),
        ];
        let said: Vec<String> = kinds
            .iter()
            .filter_map(|(s, words)| {
                Some(count(s)).filter(|&n| n > 0).map(|n| format!("{n} {words}"))
            })
            .collect();
        bail!("check: {bad} of {} are not the same: {}", rows.len(), said.join(", "));
    }
    if !g.quiet && !a.json {
        let how = if a.recorded_only {
            "size and recorded digest"
        } else {
            "size and digest; the server's copies re-read"
        };
        eprintln!("check: all {} the same ({how})", rows.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_compared_by_size_then_digest() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"hello").unwrap();
        let algo = bs_wire::DigestAlgo::Xxh3_128;
        let good = algo.digest(b"hello").to_string();
        assert_eq!(compare(&f, 5, &good), Verdict::Same);
        let other = algo.digest(b"hellp").to_string();
        assert!(matches!(compare(&f, 5, &other), Verdict::Differs(w) if w.contains("digest")));
        assert!(matches!(compare(&f, 6, &good), Verdict::Differs(w) if w.contains("bytes")));
        assert!(matches!(compare(&f, 5, "md5:00"), Verdict::Unreadable(_)));
        assert!(matches!(compare(&dir.path().join("no"), 5, &good), Verdict::Unreadable(_)));
    }
}
