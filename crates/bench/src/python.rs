//! Finds a Python harness under `bench/` and the interpreter that can run it (the bench
//! virtualenv that `scripts/bench-setup.sh` fills).

use std::path::PathBuf;
use std::process::Command;

/// `(python, script)` for `bench/<script>` whose interpreter imports `imports` (e.g.
/// `"numpy, cv2"`). Looks in `./bench` (running from the repository), then in the repository
/// this was built from; `BLOBSTREAM_BENCH_PYTHON` overrides the interpreter.
pub(crate) fn find(script: &str, imports: &str) -> Option<(PathBuf, PathBuf)> {
    let roots = [PathBuf::from("."), PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))];
    roots.into_iter().find_map(|root| {
        let script = root.join("bench").join(script);
        let python = std::env::var_os("BLOBSTREAM_BENCH_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("bench/.venv/bin/python"));
        let works = script.is_file()
            && Command::new(&python)
                .args(["-c", &format!("import {imports}")])
                .output()
                .is_ok_and(|o| o.status.success());
        works.then_some((python, script))
    })
}
