//! BENCHMARKS.md: one file, one section per benchmark, each rewritten in place by its run.

use std::fs;
use std::io;

/// First lines of a new BENCHMARKS.md.
pub const BENCHMARKS_MD_HEADER: &str =
    "# Benchmarks\n\nWritten by `blobstream bench`; do not edit by hand.\n";

fn markers(title: &str) -> (String, String) {
    (format!("<!-- bench:{title}:start -->"), format!("<!-- bench:{title}:end -->"))
}

/// Put `section_markdown` between the `<!-- bench:TITLE:start -->` and
/// `<!-- bench:TITLE:end -->` markers of the file at `path`, replacing what was there. The
/// section is appended when the file has no such markers yet; the file is created (with a
/// short header) when it does not exist. Other sections are left as they are. The file is
/// replaced atomically (written beside it, then renamed).
pub fn write_benchmarks_md(
    path: &std::path::Path,
    section_title: &str,
    section_markdown: &str,
) -> io::Result<()> {
    let title_ok = !section_title.is_empty()
        && !section_title.contains("--")
        && !section_title.contains(':')
        && !section_title.contains(['\n', '\r', '>']);
    if !title_ok {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("benchmark section title {section_title:?} cannot go in a marker"),
        ));
    }
    let (start, end) = markers(section_title);
    let block = format!("{start}\n{}\n{end}", section_markdown.trim_end());
    let old = match fs::read_to_string(path) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let new = if old.trim().is_empty() {
        format!("{BENCHMARKS_MD_HEADER}\n{block}\n")
    } else if let Some(s) = old.find(&start) {
        let after = s + start.len();
        let e = old[after..].find(&end).map(|i| after + i).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {start} has no matching {end}", path.display()),
            )
        })?;
        format!("{}{block}{}", &old[..s], &old[e + end.len()..])
    } else {
        format!("{}\n\n{block}\n", old.trim_end())
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&tmp, new)?;
    fs::rename(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_replaces_and_appends_sections() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("BENCHMARKS.md");

        write_benchmarks_md(&p, "transfer", "## Transfer\n\nv1\n").unwrap();
        let first = fs::read_to_string(&p).unwrap();
        assert_eq!(
            first,
            format!(
                "{BENCHMARKS_MD_HEADER}\n<!-- bench:transfer:start -->\n## Transfer\n\nv1\n\
                 <!-- bench:transfer:end -->\n"
            )
        );

        write_benchmarks_md(&p, "latency", "## Latency\n\nL1").unwrap();
        write_benchmarks_md(&p, "transfer", "## Transfer\n\nv2").unwrap();
        let text = fs::read_to_string(&p).unwrap();
        assert!(text.starts_with(BENCHMARKS_MD_HEADER));
        assert!(!text.contains("v1"));
        assert_eq!(text.matches("v2").count(), 1);
        assert_eq!(text.matches("<!-- bench:transfer:start -->").count(), 1);
        assert!(text.contains(
            "<!-- bench:latency:start -->\n## Latency\n\nL1\n<!-- bench:latency:end -->"
        ));
        assert!(text.find("v2").unwrap() < text.find("L1").unwrap(), "replaced in place");

        // Rewriting with the same content changes nothing; no temporary file is left behind.
        write_benchmarks_md(&p, "transfer", "## Transfer\n\nv2").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), text);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn keeps_foreign_text_and_refuses_broken_markers_and_titles() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("BENCHMARKS.md");
        fs::write(&p, "# Mine\n\nnotes").unwrap();
        write_benchmarks_md(&p, "transfer", "t").unwrap();
        assert_eq!(
            fs::read_to_string(&p).unwrap(),
            "# Mine\n\nnotes\n\n<!-- bench:transfer:start -->\nt\n<!-- bench:transfer:end -->\n"
        );

        fs::write(&p, "<!-- bench:transfer:start -->\nhalf").unwrap();
        let e = write_benchmarks_md(&p, "transfer", "t").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(fs::read_to_string(&p).unwrap(), "<!-- bench:transfer:start -->\nhalf");

        for bad in ["", "a:b", "x-->", "two\nlines"] {
            let e = write_benchmarks_md(&p, bad, "t").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
    }
}
