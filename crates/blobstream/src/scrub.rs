//! `blobstream scrub`: have the server re-read its blobs and check every chunk against its
//! digest; corrupt blobs are named (and the server marks them, so readers are refused at once).

use std::io::IsTerminal;

use anyhow::{Result, bail};
use bs_client::scrub_event::Outcome;

use crate::cli::{Global, ScrubArgs};

/// A spinner on stderr headed `what` while the server scrubs, on a terminal only (not with
/// `--quiet` or `--json`).
pub fn spinner(g: &Global, json: bool, what: &str) -> Option<indicatif::ProgressBar> {
    (!g.quiet && !json && std::io::stderr().is_terminal()).then(|| {
        let pb = indicatif::ProgressBar::new_spinner();
        let style =
            indicatif::ProgressStyle::with_template(&format!("{{spinner}} {what}: {{msg}}"))
                .expect("a template with only {spinner} and {msg}");
        pb.set_style(style);
        pb
    })
}

pub fn run(g: &Global, a: ScrubArgs) -> Result<()> {
    let client = crate::commands::client(g)?;
    let spinner = spinner(g, a.json, "scrub");
    let (mut blobs, mut bytes) = (0u64, 0u64);
    let (mut corrupt, mut failed) = (Vec::new(), Vec::new());
    client.scrub(&a.prefix, a.rate << 20, |ev| {
        blobs += 1;
        bytes += ev.size;
        let outcome = Outcome::try_from(ev.outcome).unwrap_or(Outcome::Failed);
        let line = format!("{}: {}", ev.name, ev.error);
        match outcome {
            Outcome::Ok => {}
            Outcome::Corrupt => corrupt.push((ev.name.clone(), ev.error.clone())),
            Outcome::Failed => failed.push((ev.name.clone(), ev.error.clone())),
        }
        if outcome != Outcome::Ok && !a.json {
            let what = if outcome == Outcome::Corrupt { "CORRUPT" } else { "unreadable" };
            match &spinner {
                Some(pb) => pb.println(format!("{what} {line}")),
                None => eprintln!("{what} {line}"),
            }
        }
        if let Some(pb) = &spinner {
            pb.set_message(format!("{blobs} blobs, {} MiB checked; {}", bytes >> 20, ev.name));
            pb.tick();
        }
    })?;
    if let Some(pb) = spinner {
        pb.finish_and_clear();
    }
    let pairs = |v: &[(String, String)]| -> Vec<serde_json::Value> {
        v.iter().map(|(n, r)| serde_json::json!({ "name": n, "reason": r })).collect()
    };
    // A prefix that names nothing checked nothing: no all-clear (a mistyped prefix).
    let nothing = blobs == 0 && !a.prefix.is_empty();
    if nothing && !a.json {
        bail!("no blobs under {:?}: nothing was checked", a.prefix);
    }
    if a.json {
        let v = serde_json::json!({
            "blobs": blobs,
            "bytes": bytes,
            "corrupt": pairs(&corrupt),
            "failed": pairs(&failed),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        eprintln!(
            "scrub: {blobs} blobs, {bytes} bytes checked; {} corrupt, {} unreadable",
            corrupt.len(),
            failed.len()
        );
    }
    if !corrupt.is_empty() || !failed.is_empty() {
        bail!("{} corrupt and {} unreadable blobs (named above)", corrupt.len(), failed.len());
    }
    if nothing {
        bail!("no blobs under {:?}: nothing was checked", a.prefix);
    }
    Ok(())
}
