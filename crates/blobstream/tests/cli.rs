//! The `blobstream` binary end to end: a real `serve` process on port 0 and the client
//! commands a user or script runs against it, checked by what they print and their exit codes.

use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_blobstream");

/// A `blobstream serve` child process; killed on drop.
struct Serve {
    child: Child,
    addr: String,
    /// The data plane's address, as printed.
    data: String,
    /// The browser client's URL, as printed.
    url: String,
}

impl Serve {
    /// Start a server on `data` and wait until it prints its control-plane address (it prints
    /// only after both listeners are bound).
    fn start(data: &Path) -> Self {
        Self::start_with(data, &["--no-samples"], &[])
    }

    fn start_with(data: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let data = data.to_str().unwrap();
        Self::spawn(&[&["--data", data], args].concat(), env)
    }

    /// `serve` on port 0 with `args` (and no data directory unless they name one).
    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(BIN)
            .args(["serve", "--addr", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next =
            || lines.next().expect("serve exited before printing its addresses").unwrap();
        let addr = loop {
            if let Some(a) = next().split("control plane (gRPC):").nth(1) {
                break a.trim().to_string();
            }
        };
        let data = loop {
            if let Some(a) = next().split("data plane (TCP):").nth(1) {
                break a.trim().to_string();
            }
        };
        let url = loop {
            if let Some(u) = next().split("web (HTTP):").nth(1) {
                break u.trim().to_string();
            }
        };
        // Keep draining stdout so the server never writes into a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, addr, data, url }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(BIN).args(["--server", &self.addr]).args(args).output().unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `blobstream ARGS LAST` with stdout and stderr piped, once the first line it prints says
/// `first`; the rest of its stdout is read line by line.
fn spawn_saying(
    args: &[&str],
    last: impl AsRef<std::ffi::OsStr>,
    first: &str,
) -> (Child, std::io::Lines<BufReader<std::process::ChildStdout>>) {
    let mut c = Command::new(BIN)
        .args(args)
        .arg(last)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    let said = lines.next().unwrap().unwrap();
    assert!(said.contains(first), "{said}");
    (c, lines)
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn fails_with(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(1), "stdout: {}", String::from_utf8_lossy(&o.stdout));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(needle), "stderr {err:?} lacks {needle:?}");
    assert_eq!(err.trim_end().lines().count(), 1, "one clear line: {err:?}");
}

/// A command line that cannot work: exit 2 (as clap's usage errors), one line naming why.
fn usage_error(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(2), "stdout: {}", String::from_utf8_lossy(&o.stdout));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(needle), "stderr {err:?} lacks {needle:?}");
    assert_eq!(err.trim_end().lines().count(), 1, "one clear line: {err:?}");
}

fn content(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn serve_leaves_unused_what_the_environment_sets_for_other_commands_but_refuses_typed_misfits() {
    let dir = tempfile::tempdir().unwrap();
    let (data, elsewhere) = (dir.path().join("data"), dir.path().join("elsewhere"));
    let missing_ca = dir.path().join("no-such-ca.pem");
    // Set for `dpss` commands: without --dpss-master, serve has no use for them (the CA file
    // does not even exist), and starts.
    let s = Serve::start_with(
        &data,
        &["--no-samples"],
        &[
            ("BLOBSTREAM_DPSS_TOKEN", "secret"),
            ("BLOBSTREAM_DPSS_CA", missing_ca.to_str().unwrap()),
        ],
    );
    let file = dir.path().join("f");
    std::fs::write(&file, content(1000)).unwrap();
    ok(&s.run(&["put", file.to_str().unwrap(), "k"]));
    drop(s);
    // --memory typed wins over a data directory from the environment: nothing is made there.
    let m = Serve::spawn(
        &["--memory", "--no-samples"],
        &[("BLOBSTREAM_DATA", elsewhere.to_str().unwrap())],
    );
    ok(&m.run(&["put", file.to_str().unwrap(), "k"]));
    let cat = m.run(&["cat", "k"]);
    assert!(cat.status.success());
    assert_eq!(cat.stdout, content(1000));
    drop(m);
    assert!(!elsewhere.exists(), "--memory wrote into BLOBSTREAM_DATA's directory");
    // Typed on the command line, the same misfits are usage errors (exit 2), named.
    let d = data.to_str().unwrap();
    for (args, says) in [
        (
            &["--memory", "--data", d][..],
            "--memory keeps blobs in this process: it takes no --data",
        ),
        (&["--memory", "--s3-bucket", "b"], "it takes no --s3-bucket"),
        (&["--data", d, "--dpss-token", "t"], "--dpss-token is for --dpss-master"),
        (&["--data", d, "--dpss-ca", "ca.pem"], "--dpss-ca is for --dpss-master"),
    ] {
        let o = exits_within_a_minute(Command::new(BIN).arg("serve").args(args));
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// The one file under `dir` (recursively).
fn only_file(dir: &Path) -> std::path::PathBuf {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() { todo.push(p) } else { found.push(p) }
        }
    }
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}

#[test]
fn check_has_the_server_reread_its_copy_so_a_blob_rotted_there_is_not_called_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Serve::start(&data);
    let file = dir.path().join("scan.raw");
    std::fs::write(&file, content(2 << 20)).unwrap();
    let f = file.to_str().unwrap();
    ok(&s.run(&["put", f, "scans/a.raw"]));
    let o = s.run(&["check", f, "scans/a.raw"]);
    assert!(ok(&o).starts_with("same"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("the server's copies re-read"));

    // Bit rot in the server's copy: the local file still matches the recorded digest.
    let stored = only_file(&data.join("blobs"));
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes[1 << 20] ^= 0x10;
    std::fs::write(&stored, &bytes).unwrap();
    let o = s.run(&["check", f, "scans/a.raw"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("CORRUPT on the server"), "{out}");
    // The server marked it: stat says so, and why; its neighbour's stat does not.
    let stat = ok(&s.run(&["stat", "scans/a.raw"]));
    assert!(stat.starts_with("CORRUPT:") && stat.contains("chunk"), "{stat}");
    let v: serde_json::Value =
        serde_json::from_str(&ok(&s.run(&["stat", "scans/a.raw", "--json"]))).unwrap();
    assert!(v["corrupt"].as_str().is_some_and(|r| r.contains("chunk")), "{v}");
    // A batch getting it names it, and says running again will not mend it; a blob next
    // to it that is sound still arrives.
    let other = dir.path().join("other.raw");
    std::fs::write(&other, content(3 << 10)).unwrap();
    ok(&s.run(&["put", other.to_str().unwrap(), "scans/b.raw"]));
    let v: serde_json::Value =
        serde_json::from_str(&ok(&s.run(&["stat", "scans/b.raw", "--json"]))).unwrap();
    assert!(v["corrupt"].is_null(), "{v}");
    assert!(!ok(&s.run(&["stat", "scans/b.raw"])).contains("CORRUPT"));
    // ls marks it, in its text and its JSON, and not its neighbour; stderr counts it.
    let o = s.run(&["ls", "scans/"]);
    let ls = ok(&o);
    let line = |k: &str| ls.lines().find(|l| l.ends_with(k) || l.contains(&format!("{k} ")));
    assert!(line("scans/a.raw").is_some_and(|l| l.contains("  CORRUPT: ")), "{ls}");
    assert!(line("scans/b.raw").is_some_and(|l| !l.contains("CORRUPT")), "{ls}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("1 blob(s) marked corrupt"));
    let v: serde_json::Value =
        serde_json::from_str(&ok(&s.run(&["ls", "scans/", "--json"]))).unwrap();
    assert!(v[0]["corrupt"].as_str().is_some_and(|r| r.contains("chunk")), "{v}");
    assert!(v[1]["corrupt"].is_null(), "{v}");
    let out = dir.path().join("out");
    let o = s.run(&["get", "-r", "scans/", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("FAILED scans/a.raw") && err.contains("corrupt"), "{err}");
    assert!(err.contains("1 is corrupt where it is held (running again will not mend it"), "{err}");
    assert!(!err.contains("run it again"), "{err}");
    assert_eq!(std::fs::read(out.join("b.raw")).unwrap(), std::fs::read(&other).unwrap());
    assert!(!out.join("a.raw").exists());
    // Putting the same bytes again names the corrupt stored copy, not "other content".
    let o = s.run(&["put", f, "scans/a.raw"]);
    fails_with(&o, "the stored copy is corrupt");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--overwrite replaces it"));
    // What --recorded-only compares, and says it did.
    let o = s.run(&["check", f, "scans/a.raw", "--recorded-only"]);
    assert!(ok(&o).starts_with("same"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("recorded digest"));
}

/// Command lines that cannot work exit 2 (as clap's own usage errors) with one line saying
/// why; causes are said once; check and get -r name what is wrong with their operands.
#[test]
fn misfit_command_lines_are_usage_errors_and_causes_are_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(&dir.path().join("data"));
    let file = dir.path().join("a.txt");
    std::fs::write(&file, b"hello").unwrap();
    let (f, d) = (file.to_str().unwrap(), dir.path().to_str().unwrap());
    ok(&s.run(&["put", f, "p/a.txt"]));
    let usage = |args: &[&str], says: &str| usage_error(&s.run(args), says);
    usage(&["put", f, "x", "--jobs", "4"], "go with -r");
    usage(&["sync", d, d], "sync copies between a local folder and a prefix");
    usage(&["rm", "-r", ""], "refusing to remove every blob");
    usage(&["put", f, "x", "--layer", "bogus"], "--layer");
    // Encryption is TLS: never silently sent in the clear.
    usage(&["put", f, "x", "--layer", "encrypt"], "--layer encrypt is TLS");
    usage(&["get", "-r", "p/", d, "--include", "["], "the pattern \"[\" is malformed");
    usage(&["check", d, "p/a.txt"], "is a folder (check -r compares a folder)");
    usage(&["put", d, "x"], "is a folder: put -r uploads");
    let load = ["dpss", "load", "--dataset", "x", "--master", "127.0.0.1:1", "--file", f];
    usage(&[&load[..], &["--block-size", "100000000"]].concat(), "a block is at most 16 MiB");
    usage(&[&load[..], &["--copies", "0"]].concat(), "at least one copy");
    // bs:NAME as cp writes it is the blob NAME; a blob:// URL is cp's.
    ok(&s.run(&["put", f, "bs:p/b.txt"]));
    assert_eq!(ok(&s.run(&["cat", "p/b.txt"])), "hello");
    assert_eq!(ok(&s.run(&["get", "bs:p/b.txt", "-"])), "hello");
    usage(&["put", f, "blob://127.0.0.1:1/x"], "which cp takes (cp FILE URL, cp URL FILE)");
    usage(&["put", "-", "x"], "put reads a file, not standard input");
    // A file name that is not UTF-8 is named as such, not as a missing file.
    let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"bad\xffname"));
    std::fs::write(&odd, b"x").unwrap();
    let o =
        Command::new(BIN).args(["--server", &s.addr, "put"]).arg(&odd).arg("x").output().unwrap();
    usage_error(&o, "is not UTF-8");
    // A blob that is not there is a verdict, as with -r.
    let o = s.run(&["check", f, "p/none.txt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("MISSING on the server"));
    fails_with(&s.run(&["get", "-r", "p/", f]), "is not a folder");
    // A batch whose failures running it again cannot mend does not say it would.
    let folder = dir.path().join("names");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("ok.txt"), b"1").unwrap();
    std::fs::write(folder.join("back\\slash.txt"), b"2").unwrap();
    let fo = folder.to_str().unwrap();
    let o = s.run(&["put", "-r", fo, "n/"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("1 of 2 failed (each named above)"), "{err}");
    assert!(!err.contains("run it again"), "{err}");
    let o = s.run(&["put", "-r", fo, "n2/", "--json"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("(each in the JSON summary)"));
    // The server's address: an empty BLOBSTREAM_SERVER is the default, a port is checked.
    // (Whether or not a server runs there: reached, or named as not reached.)
    let o = Command::new(BIN).args(["ls"]).env("BLOBSTREAM_SERVER", "").output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() || err.contains("at 127.0.0.1:7070"), "{err}");
    fails_with(
        &Command::new(BIN).args(["--server", "h:99999", "ls"]).output().unwrap(),
        "99999 is not a port",
    );
    // An I/O error whose message holds its cause's is said once.
    let o = Command::new(BIN).args(["image-info", "/no/such.png"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

/// `get` and `cp` into a local path put the blob where cp(1) would: into a folder under its
/// last name, through a link (the link kept), into a FIFO as it is — never replacing a folder,
/// a link or a special file with a regular file, and never leaving a part file behind.
#[test]
fn get_puts_a_blob_where_cp_would() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(&dir.path().join("data"));
    let file = dir.path().join("src.bin");
    let bytes = content(300_000);
    std::fs::write(&file, &bytes).unwrap();
    ok(&s.run(&["put", file.to_str().unwrap(), "scans/a.bin"]));
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let o = out.to_str().unwrap();

    ok(&s.run(&["get", "scans/a.bin", o]));
    assert_eq!(std::fs::read(out.join("a.bin")).unwrap(), bytes);
    ok(&s.run(&["cp", "bs:scans/a.bin", &format!("{o}/")]));
    assert_eq!(std::fs::read(out.join("a.bin")).unwrap(), bytes);
    // Through a link: its target gets the bytes, the link stays a link.
    let target = out.join("target.bin");
    std::fs::write(&target, b"old").unwrap();
    let link = out.join("link.bin");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    ok(&s.run(&["get", "scans/a.bin", link.to_str().unwrap()]));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(&target).unwrap(), bytes);
    // Into a FIFO: written into it, the FIFO left a FIFO.
    let fifo = out.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    ok(&s.run(&["get", "scans/a.bin", fifo.to_str().unwrap()]));
    assert_eq!(reader.join().unwrap(), bytes);
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    // Nothing left behind but what was asked for.
    let mut names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["a.bin", "fifo", "link.bin", "target.bin"]);
    usage_error(&s.run(&["get", "scans/a.bin", ""]), "an empty destination");
    fails_with(&s.run(&["get", "scans/a.bin", &format!("{o}/none/")]), "does not exist");
}

#[test]
fn put_list_stat_get_cat_cp_rm_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(&dir.path().join("data"));
    let file = dir.path().join("scan.dcm");
    let bytes = content(3_000_000);
    std::fs::write(&file, &bytes).unwrap();
    let f = file.to_str().unwrap();

    ok(&s.run(&["put", f, "studies/ct-1.dcm", "--meta", "modality=CT"]));
    let ls: serde_json::Value =
        serde_json::from_str(&ok(&s.run(&["ls", "studies/", "--json"]))).unwrap();
    assert_eq!(ls[0]["name"], "studies/ct-1.dcm");
    assert_eq!(ls[0]["size"], 3_000_000);
    assert_eq!(ls[0]["content_type"], "application/dicom");
    let st: serde_json::Value =
        serde_json::from_str(&ok(&s.run(&["stat", "studies/ct-1.dcm", "--json"]))).unwrap();
    assert_eq!(st["metadata"]["modality"], "CT");
    assert!(st["digest"].as_str().unwrap().starts_with("xxh3-128:"));
    assert!(ok(&s.run(&["ls"])).contains("studies/ct-1.dcm"));

    let out = dir.path().join("back.dcm");
    ok(&s.run(&["get", "studies/ct-1.dcm", out.to_str().unwrap()]));
    assert_eq!(std::fs::read(&out).unwrap(), bytes);
    let cat = s.run(&["cat", "studies/ct-1.dcm"]);
    assert!(cat.status.success());
    assert_eq!(cat.stdout, bytes);

    ok(&s.run(&["cp", "bs:studies/ct-1.dcm", "bs:copies/ct-1.dcm"]));
    let local = dir.path().join("via-cp.bin");
    ok(&s.run(&["cp", "bs:copies/ct-1.dcm", local.to_str().unwrap()]));
    assert_eq!(std::fs::read(&local).unwrap(), bytes);

    // Through message layers both ways (compression for a slow link, a checksum per frame).
    let zl = ["--layer", "compress:zstd", "--layer", "checksum:xxh3"];
    ok(&s.run(&[&["put", f, "layered/ct-1.dcm"][..], &zl].concat()));
    let lz = dir.path().join("layered.dcm");
    ok(&s.run(&["get", "layered/ct-1.dcm", lz.to_str().unwrap(), "--layer", "compress:lz4"]));
    assert_eq!(std::fs::read(&lz).unwrap(), bytes);
    usage_error(&s.run(&["put", f, "x", "--layer", "gzip"]), "unknown layer \"gzip\"");
    ok(&s.run(&["rm", "layered/ct-1.dcm"]));

    // Putting the same bytes again (a retry after a lost confirmation) succeeds; other
    // bytes are refused unless replacing is asked for.
    let again = s.run(&["put", f, "studies/ct-1.dcm"]);
    ok(&again);
    assert!(String::from_utf8_lossy(&again.stderr).contains("already there"), "{again:?}");
    let other = dir.path().join("other.dcm");
    std::fs::write(&other, b"other bytes").unwrap();
    let o = other.to_str().unwrap();
    fails_with(&s.run(&["put", o, "studies/ct-1.dcm"]), "already exists");
    ok(&s.run(&["put", f, "studies/ct-1.dcm", "--overwrite"]));
    fails_with(&s.run(&["put", f, "../etc/passwd"]), "invalid blob name");
    fails_with(&s.run(&["stat", "no/such"]), "not found");
    fails_with(&s.run(&["get", "no/such", out.to_str().unwrap()]), "not found");
    fails_with(&s.run(&["put", "/no/such/file", "x"]), "not found");

    // Several names: each tried, each failure named, exit 1 if any failed (as rm(1)).
    let o = s.run(&["rm", "studies/ct-1.dcm", "no/such", "copies/ct-1.dcm"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("FAILED no/such") && err.contains("1 of 3 blobs"), "{err}");
    assert_eq!(ok(&s.run(&["ls"])), "", "the names after the missing one were removed too");
    fails_with(&s.run(&["rm", "studies/ct-1.dcm"]), "not found");
}

#[test]
fn blobs_survive_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("f.bin");
    std::fs::write(&file, content(100_000)).unwrap();
    {
        let s = Serve::start(&data);
        ok(&s.run(&["put", file.to_str().unwrap(), "kept"]));
    } // killed, not shut down gracefully
    let s = Serve::start(&data);
    let st: serde_json::Value =
        serde_json::from_str(&ok(&s.run(&["stat", "kept", "--json"]))).unwrap();
    assert_eq!(st["size"], 100_000);
}

#[test]
fn sigterm_lets_a_running_transfer_finish_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Serve::start(&dir.path().join("data"));
    let c = bs_client::Client::connect(&s.addr).unwrap();
    let bytes = content(3 << 20);
    let route = bs_client::RouteRequest { size: Some(bytes.len() as u64), ..Default::default() };
    // Admitted before the signal: the server must wait for this push to end.
    let mut push = c.open_push("late", 0, None, Some(route)).unwrap();
    push.write(&bytes[..1 << 20]).unwrap();
    // SAFETY: signalling our own child process, which is still running (not yet waited for).
    assert_eq!(unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) }, 0);
    push.write(&bytes[1 << 20..]).unwrap();
    let ack = push.finish(true).unwrap();
    assert!(ack.committed.is_some(), "{ack:?}");
    let status = s.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    // What was acknowledged is there after a restart.
    drop(s);
    let s = Serve::start(&dir.path().join("data"));
    let st: serde_json::Value =
        serde_json::from_str(&ok(&s.run(&["stat", "late", "--json"]))).unwrap();
    assert_eq!(st["size"], 3 << 20);
}

#[test]
fn control_characters_in_names_are_shown_escaped() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let srv = Serve::start(&data);
    // A file name with an escape sequence (it would recolour the terminal): put -r reports it
    // refused, and a single put of a missing one fails, both naming it escaped.
    let dir = t.path().join("esc");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("\u{1b}[31mred"), b"x").unwrap();
    let o = srv.run(&["put", "-r", dir.to_str().unwrap(), "up/"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains('\u{1b}') && err.contains("\\u{1b}[31mred"), "{err:?}");
    let o = srv.run(&["put", &format!("{}/\u{1b}[2Jgone", t.path().display()), "k"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains('\u{1b}') && err.contains("\\u{1b}[2Jgone"), "{err:?}");
    fails_with(&o, "gone");
}

#[test]
fn an_unreachable_server_is_one_clear_line() {
    let o = Command::new(BIN).args(["--server", "127.0.0.1:1", "ls"]).output().unwrap();
    fails_with(&o, "cannot reach blobstream server at 127.0.0.1:1");
    let o = Command::new(BIN)
        .env("BLOBSTREAM_SERVER", "127.0.0.1:1")
        .args(["stat", "x"])
        .output()
        .unwrap();
    fails_with(&o, "127.0.0.1:1");
}

#[test]
fn bench_transfer_quick_json_has_the_documented_shape() {
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(BIN)
        .args(["bench", "transfer", "--quick", "--json"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok(&o)).unwrap();
    let results = v["results"].as_array().unwrap();
    for path in ["blobstream", "raw_tcp", "grpc"] {
        for mode in ["push", "pull"] {
            // Quick: 11 runs of a small blob, 3 of a larger one.
            for (size, runs) in [(1u64 << 20, 11), (32 << 20, 3)] {
                let r = results
                    .iter()
                    .find(|r| r["path"] == path && r["mode"] == mode && r["size_bytes"] == size)
                    .unwrap_or_else(|| panic!("no {path} {mode} {size}"));
                assert!(r["gbit_per_s"].as_f64().unwrap() > 0.0);
                assert_eq!(r["runs"], runs);
            }
        }
    }
    assert!(!dir.path().join("BENCHMARKS.md").exists(), "quick runs leave BENCHMARKS.md alone");
}

#[test]
fn tls_and_a_token_protect_both_planes() {
    let dir = tempfile::tempdir().unwrap();
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key, token) =
        (dir.path().join("cert.pem"), dir.path().join("key.pem"), dir.path().join("token"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    std::fs::write(&token, "t0ken\n").unwrap();
    let (cert, key, token) =
        (cert.to_str().unwrap(), key.to_str().unwrap(), token.to_str().unwrap());
    let s = Serve::start_with(
        &dir.path().join("data"),
        &["--no-samples", "--tls-cert", cert, "--tls-key", key, "--auth-token-file", token],
        &[],
    );
    let file = dir.path().join("f.bin");
    std::fs::write(&file, content(2_000_000)).unwrap();
    let tls = ["--tls-ca", cert, "--tls-domain", "localhost"];
    let run = |extra: &[&str], env: &[(&str, &str)], args: &[&str]| {
        Command::new(BIN)
            .args(["--server", &s.addr])
            .args(extra)
            .envs(env.iter().copied())
            .args(args)
            .output()
            .unwrap()
    };
    ok(&run(&tls, &[("BLOBSTREAM_AUTH_TOKEN", "t0ken")], &["put", file.to_str().unwrap(), "p"]));
    let back = dir.path().join("back.bin");
    ok(&run(&tls, &[("BLOBSTREAM_AUTH_TOKEN", "t0ken")], &["get", "p", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), content(2_000_000));
    // Reached by the name its certificate holds, no --tls-domain: the data plane, announced
    // as an IP address, is verified as that name too.
    let named = format!("localhost:{}", s.addr.rsplit_once(':').unwrap().1);
    let by_name = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(["--server", &named, "--tls-ca", cert]).env("BLOBSTREAM_AUTH_TOKEN", "t0ken");
        c.args(args).output().unwrap()
    };
    ok(&by_name(&["put", file.to_str().unwrap(), "by-name"]));
    std::fs::remove_file(&back).unwrap();
    ok(&by_name(&["get", "by-name", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), content(2_000_000));
    fails_with(&run(&tls, &[], &["stat", "p"]), "requires a token");
    fails_with(
        &run(&tls, &[("BLOBSTREAM_AUTH_TOKEN", "nope")], &["stat", "p"]),
        "wrong credentials",
    );
    let plain = run(&[], &[("BLOBSTREAM_AUTH_TOKEN", "t0ken")], &["stat", "p"]);
    fails_with(&plain, "speaks TLS: give its CA certificate with --tls-ca");
    // And TLS asked of a server without it says so.
    let bare = Serve::start(&dir.path().join("bare"));
    let o = Command::new(BIN).args(["--server", &bare.addr, "--tls-ca", cert, "ls"]).output();
    fails_with(&o.unwrap(), "does not speak TLS: leave out --tls-ca");
}

/// A small PNG made with the project's own encoder.
fn write_png(path: &Path, w: usize, h: usize) {
    let mut img = bs_imaging::Image::<u8>::new(w, h, 3);
    for (i, v) in img.data.iter_mut().enumerate() {
        *v = (i * 7 % 256) as u8;
    }
    bs_imageio::write(path, &bs_imaging::DynImage::U8(img)).unwrap();
}

#[test]
fn image_commands_filter_describe_and_refuse_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("card.png");
    write_png(&input, 40, 30);
    let run = |args: &[&str]| Command::new(BIN).args(args).output().unwrap();

    let list: serde_json::Value = serde_json::from_str(&ok(&run(&["filters", "--json"]))).unwrap();
    let names: Vec<&str> =
        list.as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    for f in [
        "blur",
        "despeckle",
        "sharpen",
        "edge",
        "emboss",
        "oilpaint",
        "pixelize",
        "spread",
        "window",
    ] {
        assert!(names.contains(&f), "{f} missing from {names:?}");
    }

    let out = dir.path().join("out.png");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    ok(&run(&["filter", "zoom", i, o, "--param", "factor=2", "--threads", "1"]));
    let info: serde_json::Value =
        serde_json::from_str(&ok(&run(&["image-info", o, "--json"]))).unwrap();
    assert_eq!((info["width"].as_u64(), info["height"].as_u64()), (Some(80), Some(60)));
    assert_eq!(info["format"], "PNG");
    assert_eq!(info["pixel_kind"], "rgb8");

    fails_with(&run(&["filter", "nope", i, o]), "unknown filter");
    fails_with(&run(&["filter", "blur", i, o, "--param", "size=4"]), "size");
    fails_with(&run(&["filter", "blur", i, o, "--param", "bogus=1"]), "unknown parameter");
    let junk = dir.path().join("junk.png");
    std::fs::write(&junk, b"\x89PNG\r\n\x1a\nnot really").unwrap();
    fails_with(&run(&["filter", "blur", junk.to_str().unwrap(), o]), "junk.png");
    fails_with(&run(&["image-info", junk.to_str().unwrap()]), "junk.png");
    fails_with(&run(&["filter", "blur", i, o, "--max-pixels", "100"]), "limit");
    // The result is held to the limit too: 40×30 fits 2000 pixels, zoomed 4× it does not.
    let zoom = ["filter", "zoom", i, o, "-p", "factor=4", "--max-pixels", "2000"];
    fails_with(&run(&zoom), "made an image of 160×120 pixels, over the limit of 2000");
    usage_error(&run(&["filter", "blur", i, o, "-p", "size=3", "-p", "size=5"]), "given twice");
    usage_error(&run(&["filter", "blur", i, o, "-p", "size"]), "--param size: expected KEY=VALUE");

    // Definitions from a directory: a kernel and a chain using it.
    let defs = dir.path().join("defs");
    std::fs::create_dir(&defs).unwrap();
    std::fs::write(
        defs.join("mine.toml"),
        "[[kernel]]\nname = \"soft\"\nweights = [[1,2,1],[2,4,2],[1,2,1]]\n\n[[chain]]\nname = \"soft-edges\"\nsteps = [{ filter = \"soft\" }, { filter = \"edge\" }]\n",
    )
    .unwrap();
    let d = defs.to_str().unwrap();
    assert!(ok(&run(&["filters", "--defs", d])).contains("soft-edges"));
    ok(&run(&["filter", "soft-edges", i, o, "--defs", d]));
    std::fs::write(
        defs.join("broken.toml"),
        "[[chain]]\nname = \"x\"\nsteps = [{ filter = \"missing\" }]\n",
    )
    .unwrap();
    fails_with(&run(&["filters", "--defs", d]), "broken.toml");
}

#[test]
fn first_start_prints_the_url_and_has_samples_to_look_at() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_with(&dir.path().join("data"), &[], &[]);
    assert!(s.url.starts_with("http://127.0.0.1:") && s.url.ends_with('/'), "{}", s.url);
    let ls = ok(&s.run(&["ls", "samples/"]));
    for name in ["samples/ct-phantom.dcm", "samples/test-card.png", "samples/xray-16bit.png"] {
        assert!(ls.contains(name), "{ls}");
    }
    // The page answers at the printed URL (plain HTTP/1.1 over a socket: no client crate).
    let host = s.url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let mut c = std::net::TcpStream::connect(&host).unwrap();
    use std::io::{Read, Write};
    write!(c, "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").unwrap();
    let mut page = String::new();
    c.read_to_string(&mut page).unwrap();
    assert!(page.starts_with("HTTP/1.1 200") && page.contains("/app.js"), "{page}");
    drop(s);
    // A second start on the same data adds nothing: the user's store is left as it is.
    ok(&Serve::start(&dir.path().join("data")).run(&["rm", "samples/test-card.png"]));
    let s = Serve::start_with(&dir.path().join("data"), &[], &[]);
    let ls = ok(&s.run(&["ls", "samples/"]));
    assert!(!ls.contains("test-card.png"), "{ls}");
}

#[test]
fn bind_shows_negotiation_and_renegotiation_and_refuses_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("bind.sock");
    let sock_arg = sock.to_str().unwrap();
    let s = Serve::start_with(
        &dir.path().join("data"),
        &["--no-samples", "--unix-socket", sock_arg, "--max-binding-rate", "50m"],
        &[],
    );
    let profile = dir.path().join("p.toml");
    std::fs::write(
        &profile,
        "throughput = \"100m\"\npriority = 5\nlayers = [\"checksum:xxh3\", \"compress:lz4\"]\n\
         transports = [\"unix\", \"tcp\"]\n",
    )
    .unwrap();
    let o = s.run(&[
        "bind",
        "echo",
        "--profile",
        profile.to_str().unwrap(),
        "--size",
        "4k",
        "--messages",
        "200",
        "--compressible",
        "--then-layer",
        "checksum:blake3",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o)).unwrap();
    assert_eq!(v["transport"], "unix");
    assert_eq!(v["messages_in"], 200);
    assert_eq!(v["bytes_in"], 200 * 4096);
    assert_eq!(v["layers"], serde_json::json!(["checksum:blake3"]), "{v}");
    assert!(v["renegotiated"].as_str().unwrap().starts_with("applied"), "{v}");
    let lowered = v["lowered"].as_array().unwrap();
    assert!(lowered.iter().any(|l| l.as_str().unwrap().contains("52428800")), "{v}");
    // Over the first half the lz4 layer shrank the compressible messages on the wire.
    assert!(v["wire_out"].as_u64().unwrap() < 200 * 4096, "{v}");

    fails_with(&s.run(&["bind", "echo", "--layer", "rot13"]), "unknown layer \"rot13\"");
    fails_with(&s.run(&["bind", "echo", "--layer", "encrypt"]), "no TLS certificate");
    fails_with(
        &s.run(&["bind", "echo", "--throughput", "100m", "--min-throughput", "60m"]),
        "this side refused the offer",
    );
    let o = s.run(&[
        "bind",
        "sink",
        "--transport",
        "udp",
        "--loss-ppm",
        "1000",
        "--messages",
        "100",
        "--size",
        "1k",
        "--layer",
        "pace:10m",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o)).unwrap();
    assert_eq!(v["transport"], "udp");
    assert_eq!(v["messages_out"], 100);
    assert!(v["lost"].is_u64(), "{v}");
    let o = s.run(&["bindings", "--json"]);
    assert_eq!(ok(&o).trim(), "[]", "every binding ended with its command");
}

/// A receiver process per name, of `flow` (its `--distributer`, `--stream`, `--flow` and any
/// more arguments), each keeping one run in DIR/NAME; each has said it is receiving.
type Receiving = (Child, std::io::Lines<BufReader<std::process::ChildStdout>>, PathBuf);
fn receivers_of(dir: &Path, flow: &[&str], names: &[&str]) -> Vec<Receiving> {
    (names.iter())
        .map(|n| {
            let out = dir.join(n);
            let args = [&["receive"][..], flow, &["--name", n, "--runs", "1", "--out"]].concat();
            let (c, l) = spawn_saying(&args, &out, "receiving obs/raw");
            (c, l, out)
        })
        .collect()
}

/// Each receiver said it kept the run `name`, verified, ended well, and holds exactly `bytes`
/// under that name (no part file left).
fn each_kept(receivers: Vec<Receiving>, name: &str, bytes: &[u8]) {
    for (mut c, mut l, out) in receivers {
        let line = l.next().unwrap().unwrap();
        let said = format!("{name}: {} bytes, digest verified", bytes.len());
        assert!(line.contains(&said), "{line}");
        assert!(c.wait().unwrap().success());
        assert_eq!(std::fs::read(out.join(name)).unwrap(), bytes);
        assert!(!out.join(format!(".{name}.blobstream-part")).exists());
    }
}

/// `send FILE` with these arguments (`--serve …`), once it says what it serves and where, and
/// its first `n` lines on stderr (the rest drained, so it never writes to a closed pipe).
fn serving_sender(file: &Path, args: &[&str], n: usize) -> (Killed, Vec<String>) {
    let mut send = Killed(
        Command::new(BIN)
            .arg("send")
            .arg(file)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut said = BufReader::new(send.0.stderr.take().unwrap()).lines();
    let lines: Vec<String> = (0..n).map(|_| said.next().unwrap().unwrap()).collect();
    assert!(lines[0].starts_with("serving obs/raw on "), "{lines:?}");
    std::thread::spawn(move || said.for_each(drop));
    (send, lines)
}

/// What a sender process printed, once it ended well.
fn report_of(mut send: Killed) -> String {
    let mut report = String::new();
    std::io::Read::read_to_string(&mut send.0.stdout.take().unwrap(), &mut report).unwrap();
    assert!(send.0.wait().unwrap().success(), "{report}");
    report
}

/// The distributer's three processes as docs/distributer.md runs them: a bad config is
/// refused with its line; two receivers each keep the sent file, verified; status lists them.
#[test]
fn distributer_send_and_receive_as_processes() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[stream]]\nname = \"obs\"\n[[stream.flow]]\nname = \"f\"\npolicy = \"maybe\"\n",
    )
    .unwrap();
    let o = Command::new(BIN).args(["distributer", "--config"]).arg(&bad).output().unwrap();
    fails_with(&o, "bad.toml:5: unknown policy \"maybe\"");

    let cfg = dir.path().join("streams.toml");
    std::fs::write(&cfg, "[[stream]]\nname = \"obs\"\n[[stream.flow]]\nname = \"raw\"\n").unwrap();
    let (d, addr, status_addr) = start_distributer(&cfg);

    let flow = ["--distributer", &addr, "--stream", "obs", "--flow", "raw"];
    // A run before anyone joined reaches nobody: not a failure, but said.
    let early = dir.path().join("early.bin");
    std::fs::write(&early, b"x").unwrap();
    let o = Command::new(BIN).args(["-q", "send"]).arg(&early).args(flow).output().unwrap();
    assert!(ok(&o).contains("to 0 receivers"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("warning: no receiver had joined obs/raw"), "{err}");
    let receivers = receivers_of(dir.path(), &flow, &["archive", "pipeline"]);
    let file = dir.path().join("scan.bin");
    let bytes = content(3_000_000);
    std::fs::write(&file, &bytes).unwrap();
    // The receivers have joined once status lists both.
    let listed = wait_status(&status_addr, |s| s.contains("archive") && s.contains("pipeline"));
    assert!(listed.contains("obs/raw (tcp, hold"), "{listed}");
    // A folder given as the file starts no run (the receivers, one run each, would fail it).
    let o = Command::new(BIN).args(["-q", "send"]).arg(dir.path()).args(flow).output().unwrap();
    fails_with(&o, "is a directory: send takes one file");
    let sent = ok(&Command::new(BIN)
        .args(["-q", "send"])
        .arg(&file)
        .args(flow)
        .args(["--param", "name=scan-7.bin", "--param", "scan=7"])
        .output()
        .unwrap());
    assert!(sent.contains("sent 3000000 bytes to 2 receivers"), "{sent}");
    assert_eq!(sent.matches("digest verified").count(), 2, "{sent}");
    each_kept(receivers, "scan-7.bin", &bytes);
    let json = ok(&Command::new(BIN)
        .args(["distributer", "status", "--json", "--addr", &status_addr])
        .output()
        .unwrap());
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["flow"], "raw");
    // /metrics on the status address.
    use std::io::{Read, Write};
    let mut http = std::net::TcpStream::connect(&status_addr).unwrap();
    http.write_all(b"GET /metrics HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n").unwrap();
    let mut page = String::new();
    http.read_to_string(&mut page).unwrap();
    assert!(
        page.contains("blobstream_distributer_flow_running{stream=\"obs\",flow=\"raw\"} 0"),
        "{page}"
    );

    // A receiver started again into the same folder replaces none of the runs kept there:
    // the same name again fails that run (the file stays), an unnamed run takes a free name,
    // a name with folders makes them, one that would leave the folder is refused, and a file
    // kept there under a run's name plus ".part" stays as it was; a distributer that goes
    // away before the runs asked for is an error, said.
    let out = dir.path().join("archive");
    let args = [&["receive"][..], &flow, &["--name", "archive-2", "--runs", "9", "--out"]].concat();
    let (again, mut l) = spawn_saying(&args, &out, "receiving obs/raw");
    wait_status(&status_addr, |s| s.contains("archive-2"));
    std::fs::write(out.join("run-1"), b"kept from before").unwrap();
    let other = dir.path().join("other.bin");
    std::fs::write(&other, content(1000)).unwrap();
    let send = |param: &[&str]| {
        Command::new(BIN).args(["-q", "send"]).arg(&other).args(flow).args(param).output().unwrap()
    };
    let o = send(&["--param", "name=scan-7.bin"]);
    assert_eq!(o.status.code(), Some(1));
    let told = String::from_utf8_lossy(&o.stdout);
    assert!(told.contains("archive-2") && told.contains("already exists"), "{told}");
    // Status says it too, on the receiver's line, until its next run.
    let listed = wait_status(&status_addr, |s| s.contains("last error: its last run failed"));
    assert!(listed.contains("already exists"), "{listed}");
    assert_eq!(std::fs::read(out.join("scan-7.bin")).unwrap(), bytes, "a kept run replaced");
    ok(&send(&[]));
    let line = l.next().unwrap().unwrap();
    assert!(line.contains("run-2: 1000 bytes, digest verified"), "{line}");
    assert_eq!(std::fs::read(out.join("run-1")).unwrap(), b"kept from before");
    ok(&send(&["--param", "name=2026/11/obs.bin"]));
    assert!(l.next().unwrap().unwrap().contains("2026/11/obs.bin: 1000 bytes"));
    assert_eq!(std::fs::read(out.join("2026/11/obs.bin")).unwrap(), content(1000));
    for bad in ["../escape.bin", "/abs.bin", ".hidden", "a//b"] {
        let o = send(&["--param", &format!("name={bad}")]);
        assert_eq!(o.status.code(), Some(1), "{bad}");
        let told = String::from_utf8_lossy(&o.stdout);
        assert!(told.contains(&format!("the run's name {bad:?}")), "{told}");
    }
    assert!(!dir.path().join("escape.bin").exists() && !out.join(".hidden").exists());
    std::fs::write(out.join("obs.part"), b"a run kept under this name").unwrap();
    ok(&send(&["--param", "name=obs"]));
    assert!(l.next().unwrap().unwrap().contains("obs: 1000 bytes"));
    assert_eq!(std::fs::read(out.join("obs.part")).unwrap(), b"a run kept under this name");
    drop(d);
    let o = again.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("already exists"), "{err}");
    assert!(
        err.contains("the distributer closed the connection after 8 run(s), 5 of them failed"),
        "{err}"
    );
}

/// `send --serve`: the sender is the distributer too. It waits for the receivers asked for,
/// hands them the run from its own process, and reports each; without them within --wait it
/// sends nothing and says so.
#[test]
fn a_sender_serving_its_flow_itself() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("streams.toml");
    std::fs::write(&cfg, "[[stream]]\nname = \"obs\"\n[[stream.flow]]\nname = \"raw\"\n").unwrap();
    let file = dir.path().join("scan.bin");
    let bytes = content(5_000_000);
    std::fs::write(&file, &bytes).unwrap();
    let serving = ["--serve", cfg.to_str().unwrap(), "--stream", "obs", "--flow", "raw"];
    let here = ["--distributer", "127.0.0.1:0"];
    let two = ["--receivers", "2", "--param", "name=s.bin"];
    let (send, said) = serving_sender(&file, &[&serving[..], &here, &two].concat(), 1);
    let line = &said[0];
    assert!(line.contains("(plain TCP): waiting for 2 receivers"), "{line}");
    let addr = line.split(" on ").nth(1).and_then(|a| a.split_whitespace().next()).unwrap();
    let flow = ["--distributer", addr, "--stream", "obs", "--flow", "raw"];
    let receivers = receivers_of(dir.path(), &flow, &["archive", "pipeline"]);
    let report = report_of(send);
    assert!(report.contains("sent 5000000 bytes to 2 receivers"), "{report}");
    assert!(!report.contains("status"), "no status service unless asked: {report}");
    assert_eq!(report.matches("digest verified").count(), 2, "{report}");
    each_kept(receivers, "s.bin", &bytes);
    // With its status service: it lists the receivers as they join, with the token. It waits
    // for two, so it is still there (not sent and gone) when the first is looked for.
    let status = ["--status-addr", "127.0.0.1:0", "--status-token", "st4tus"];
    let name = ["--param", "name=u.bin"];
    let args = [&serving[..], &here, &status, &name, &["--receivers", "2"]].concat();
    let (send, said) = serving_sender(&file, &args, 2);
    let addr = said[0].split(" on ").nth(1).and_then(|a| a.split_whitespace().next()).unwrap();
    assert!(said[1].contains("status (gRPC) and /metrics ("), "{said:?}");
    let status_addr = said[1].rsplit(" on ").next().unwrap().to_string();
    let flow = ["--distributer", addr, "--stream", "obs", "--flow", "raw"];
    let mut r = receivers_of(dir.path(), &flow, &["watched"]);
    let listed = wait_status_with(&status_addr, &["--token", "st4tus"], |s| s.contains("watched"));
    assert!(listed.contains("obs/raw (tcp, hold"), "{listed}");
    r.extend(receivers_of(dir.path(), &flow, &["second"]));
    assert!(report_of(send).contains("sent 5000000 bytes to 2 receivers\n"));
    each_kept(r, "u.bin", &bytes);

    // Over TLS: the receiver trusts the sender's certificate; one in plain TCP is refused.
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let tls = ["--tls-cert", cert, "--tls-key", key, "--param", "name=t.bin"];
    let (send, said) = serving_sender(&file, &[&serving[..], &here, &tls].concat(), 1);
    let line = &said[0];
    assert!(line.contains("(TLS): waiting for 1 receiver"), "{line}");
    let port = line.split(" on ").nth(1).and_then(|a| a.split(' ').next()).unwrap();
    let named = format!("localhost:{}", port.rsplit(':').next().unwrap());
    let flow = ["--distributer", &named, "--stream", "obs", "--flow", "raw"];
    let out = dir.path().join("tls");
    let args = [&["receive"][..], &flow, &["--name", "plain", "--runs", "1", "--out"]].concat();
    let plain = Command::new(BIN).args(&args).arg(&out).output().unwrap();
    fails_with(&plain, "TLS");
    let args = [&["receive"][..], &flow, &["--distributer-ca", cert, "--name", "a", "--runs", "1"]]
        .concat();
    let (mut c, mut l) = spawn_saying(&[&args[..], &["--out"]].concat(), &out, "receiving");
    let report = report_of(send);
    assert!(report.contains("sent 5000000 bytes to 1 receiver\n"), "{report}");
    assert!(l.next().unwrap().unwrap().contains("t.bin: 5000000 bytes, digest verified"));
    assert!(c.wait().unwrap().success());
    assert_eq!(std::fs::read(out.join("t.bin")).unwrap(), bytes);

    // `send -q FILE` with these arguments, and this environment.
    let send = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(BIN);
        c.args(["-q", "send"]).arg(&file).args(args).envs(env.iter().copied());
        c.output().unwrap()
    };
    // Nobody joins within --wait: nothing is sent, and that is an error.
    let o = send(&[&serving[..], &here, &["--wait", "1"]].concat(), &[]);
    fails_with(&o, "0 of 1 receivers joined obs/raw within 1 s (--wait): nothing sent");
    let o = send(&["--serve", cfg.to_str().unwrap(), "--stream", "obs", "--flow", "nope"], &[]);
    fails_with(&o, "stream \"obs\" has no flow \"nope\"");
    let o = send(&["--stream", "obs", "--flow", "raw", "--tls-cert", "c", "--tls-key", "k"], &[]);
    usage_error(&o, "--tls-cert serves TLS with --serve only");
    // A status token the environment sets (for `distributer`) is left unused by a plain send.
    let plain = ["--stream", "obs", "--flow", "raw", "--distributer", "127.0.0.1:1"];
    let o = send(&plain, &[("BLOBSTREAM_DISTRIBUTER_STATUS_TOKEN", "st4tus")]);
    fails_with(&o, "cannot reach the distributer at 127.0.0.1:1");
}

/// The archive receiver: each verified run becomes a blob (with its parameters as metadata);
/// a run whose sender dies leaves no blob at all, and one the store refuses is reported to the
/// sender with the store's reason.
#[test]
fn the_archive_receiver_commits_verified_runs_only() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(&dir.path().join("data"));
    let cfg = dir.path().join("streams.toml");
    std::fs::write(&cfg, "[[stream]]\nname = \"obs\"\n[[stream.flow]]\nname = \"raw\"\n").unwrap();
    let (d, addr, status_addr) = start_distributer(&cfg);
    let flow = ["--distributer", &addr, "--stream", "obs", "--flow", "raw"];
    let args = [
        &["--server", &s.addr, "receive"][..],
        &flow,
        &["--name", "archive", "--into-store", "--prefix", "obs/", "--runs"],
    ]
    .concat();
    let (archive, mut out) = spawn_saying(&args, "3", "into the store at");
    wait_status(&status_addr, |s| s.contains("archive"));

    // A sender that dies mid-run: nothing of that run is committed.
    let mut dying = Command::new(BIN)
        .arg("send")
        .arg("-")
        .args(flow)
        .args(["--param", "name=lost.bin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    dying.stdin.as_mut().unwrap().write_all(&content(2_000_000)).unwrap();
    // The distributer has the run once its flow shows bytes delivered to the archive.
    wait_status(&status_addr, |s| s.contains("running") && !s.contains(" 0 bytes delivered"));
    dying.kill().unwrap();
    dying.wait().unwrap();

    // A run named so that no blob may have its name: refused by the store, and the sender
    // hears why (not merely that there was no blob).
    let file = dir.path().join("scan.bin");
    let bytes = content(3_000_000);
    std::fs::write(&file, &bytes).unwrap();
    let refused =
        Command::new(BIN).arg("send").arg(&file).args(flow).args(["--param", "name=a\\b"]).output();
    let refused = refused.unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stdout) + String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("cannot store obs/a\\b") && said.contains("contains '\\'"), "{said}");

    // A good run.
    let sent = ok(&Command::new(BIN)
        .args(["-q", "send"])
        .arg(&file)
        .args(flow)
        .args(["--param", "name=scan-7.bin", "--param", "scan=7"])
        .output()
        .unwrap());
    assert!(sent.contains("archive") && sent.contains("digest verified"), "{sent}");
    let line = out.next().unwrap().unwrap();
    assert!(line.contains("obs/scan-7.bin: 3000000 bytes, digest verified, committed"), "{line}");
    let status = archive.wait_with_output().unwrap();
    assert!(!status.status.success(), "two of its three runs failed");
    let err = String::from_utf8_lossy(&status.stderr);
    assert!(err.contains("sender left mid-flow") && err.contains("nothing committed"), "{err}");
    assert!(err.contains("cannot store obs/a\\b"), "{err}");

    let listed = ok(&s.run(&["ls", "obs/"]));
    assert_eq!(listed.lines().count(), 1, "no trace of the lost run: {listed}");
    assert!(listed.contains("obs/scan-7.bin"), "{listed}");
    let st: serde_json::Value =
        serde_json::from_str(&ok(&s.run(&["stat", "obs/scan-7.bin", "--json"]))).unwrap();
    assert_eq!(st["size"], 3_000_000);
    assert_eq!(st["metadata"]["scan"], "7");
    let back = dir.path().join("back.bin");
    ok(&s.run(&["get", "obs/scan-7.bin", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), bytes);
    drop(d);
}

/// A distributer started with a certificate: a receiver and a sender that trust its CA run a
/// flow (the file arrives verified); a sender without the CA is refused with a line naming TLS.
#[test]
fn the_distributer_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let cfg = dir.path().join("streams.toml");
    std::fs::write(&cfg, "[[stream]]\nname = \"obs\"\n[[stream.flow]]\nname = \"raw\"\n").unwrap();
    // The status token from a file (`@FILE`), so it never shows in the process list.
    let token = dir.path().join("status.token");
    std::fs::write(&token, "st4tus\n").unwrap();
    let token = format!("@{}", token.display());
    let (d, addr, status_addr) = start_distributer_with(
        &cfg,
        &["--tls-cert", cert, "--tls-key", key, "--status-token", &token],
    );
    let port = addr.rsplit(':').next().unwrap();
    let named = format!("localhost:{port}");
    let flow = ["--distributer", &named, "--stream", "obs", "--flow", "raw"];
    let file = dir.path().join("scan.bin");
    std::fs::write(&file, content(1_500_000)).unwrap();
    let plain = Command::new(BIN).args(["-q", "send"]).arg(&file).args(flow).output().unwrap();
    fails_with(&plain, "TLS");

    let out = dir.path().join("in");
    let mut r = Killed(
        Command::new(BIN)
            .arg("receive")
            .args(flow)
            .args(["--distributer-ca", cert, "--name", "archive", "--runs", "1", "--out"])
            .arg(&out)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The status service speaks TLS too, with the same certificate.
    let status_port = status_addr.rsplit(':').next().unwrap();
    let status_named = format!("localhost:{status_port}");
    let trusted = ["--distributer-ca", cert, "--token", &token];
    wait_status_with(&status_named, &trusted, |s| s.contains("archive"));
    let plain_status = Command::new(BIN)
        .args(["distributer", "status", "--addr", &status_named])
        .output()
        .unwrap();
    fails_with(&plain_status, "if it speaks TLS");
    let no_token = Command::new(BIN)
        .args(["distributer", "status", "--addr", &status_named, "--distributer-ca", cert])
        .output()
        .unwrap();
    fails_with(&no_token, "token");
    let wrong = Command::new(BIN)
        .args(["distributer", "status", "--addr", &status_named, "--distributer-ca", cert])
        .args(["--token", "st4tus-not"])
        .output()
        .unwrap();
    fails_with(&wrong, "token");
    let sent = ok(&Command::new(BIN)
        .args(["-q", "send"])
        .arg(&file)
        .args(flow)
        .args(["--distributer-ca", cert, "--param", "name=scan.bin"])
        .output()
        .unwrap());
    assert!(sent.contains("digest verified"), "{sent}");
    assert!(r.0.wait().unwrap().success());
    assert_eq!(std::fs::read(out.join("scan.bin")).unwrap(), content(1_500_000));
    drop(d);
}

/// A child process killed when the test ends, passed or not.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `blobstream distributer` on free ports; returns it with its data and status addresses.
fn start_distributer(cfg: &Path) -> (Killed, String, String) {
    start_distributer_with(cfg, &[])
}

fn start_distributer_with(cfg: &Path, args: &[&str]) -> (Killed, String, String) {
    let mut d = Killed(
        Command::new(BIN)
            .args(["distributer", "--addr", "127.0.0.1:0", "--status-addr", "127.0.0.1:0"])
            .arg("--config")
            .arg(cfg)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(d.0.stdout.take().unwrap()).lines();
    let mut next = || lines.next().expect("the distributer printed its addresses").unwrap();
    let line = next();
    let addr = line.split("listening on ").nth(1).and_then(|a| a.split_whitespace().next());
    let addr = addr.expect("its data address").to_string();
    let status = next().split(" on ").nth(1).expect("its status address").trim().to_string();
    std::thread::spawn(move || lines.for_each(drop));
    (d, addr, status)
}

/// `distributer status` at `addr`, asked again until `done` holds for it (bounded).
fn wait_status(addr: &str, done: impl Fn(&str) -> bool) -> String {
    wait_status_with(addr, &[], done)
}

/// [`wait_status`] with more arguments for `distributer status` (a CA, a token).
fn wait_status_with(addr: &str, args: &[&str], done: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    for _ in 0..1000 {
        last = ok(&Command::new(BIN)
            .args(["distributer", "status", "--addr", addr])
            .args(args)
            .output()
            .unwrap());
        if done(&last) {
            return last;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the distributer's status never got there: {last}");
}

/// A file the user may not read fails alone, named with why; the rest of the folder goes up.
/// (As root, permission bits do not stop a read: the command then runs without the
/// capabilities that override them, through util-linux's `setpriv`.)
#[test]
fn an_unreadable_file_fails_alone_and_is_named() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(&dir.path().join("data"));
    let folder = dir.path().join("study");
    std::fs::create_dir_all(&folder).unwrap();
    for n in ["a.dcm", "secret.dcm", "c.dcm"] {
        std::fs::write(folder.join(n), content(5000)).unwrap();
    }
    let secret = folder.join("secret.dcm");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    let args = ["--server", &s.addr, "put", "-r", folder.to_str().unwrap(), "p/"];
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let out = if root {
        Command::new("setpriv")
            .args(["--bounding-set=-dac_override,-dac_read_search", BIN])
            .args(args)
            .output()
            .expect("setpriv (util-linux) runs the command without root's file access")
    } else {
        Command::new(BIN).args(args).output().unwrap()
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err.lines().find(|l| l.starts_with("FAILED")).unwrap_or_default();
    assert!(line.contains("secret.dcm") && line.contains("ermission denied"), "{err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("FAILED")).count(), 1, "{err}");
    assert!(err.contains("2 copied"), "{err}");
    let listed = ok(&s.run(&["ls", "p/"]));
    assert!(listed.contains("p/a.dcm") && listed.contains("p/c.dcm"), "{listed}");
    assert!(!listed.contains("secret"), "{listed}");
}

/// Files in the folder a Ctrl-C test puts.
const FILES: usize = 400;

/// kill(2) `sig` to `pid`, a child of this test.
fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child of this test.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// `put -r` of a folder of [`FILES`] files, one at a time, Ctrl-C'd once the first file is
/// there — with the server stopped meanwhile, so the copy cannot run on to its end before the
/// signal is taken (the caller sends SIGCONT). Returns the command, its stderr after the
/// handler's word that the stop is taken, what it said so far, and the folder.
fn put_r_then_ctrl_c(
    s: &Serve,
    dir: &Path,
) -> (Child, BufReader<std::process::ChildStderr>, String, std::path::PathBuf) {
    let folder = dir.join("many");
    std::fs::create_dir_all(&folder).unwrap();
    for i in 0..FILES {
        std::fs::write(folder.join(format!("f{i:03}")), content(64 << 10)).unwrap();
    }
    let args = ["--server", &s.addr, "put", "-r", folder.to_str().unwrap(), "p/", "--jobs", "1"];
    let mut child = Command::new(BIN).args(args).stderr(Stdio::piped()).spawn().unwrap();
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while ok(&s.run(&["ls", "p/"])).trim().is_empty() {
        assert!(std::time::Instant::now() < give_up, "no file arrived");
    }
    signal(s.child.id(), libc::SIGSTOP);
    signal(child.id(), libc::SIGINT);
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut err = String::new();
    while !err.contains("finishing the copies under way") {
        assert!(stderr.read_line(&mut err).unwrap() > 0, "no word of the stop: {err}");
    }
    (child, stderr, err, folder)
}

/// Ctrl-C during `put -r`: the copies under way finish, no more start, the summary says how
/// many were not started and the exit status is 130; the same command run again copies the
/// rest (what was copied is "already there").
#[test]
fn an_interrupted_folder_copy_says_what_was_not_started_and_finishes_when_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(&dir.path().join("data"));
    let (child, mut stderr, mut err, folder) = put_r_then_ctrl_c(&s, dir.path());
    signal(s.child.id(), libc::SIGCONT);
    std::io::Read::read_to_string(&mut stderr, &mut err).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("SIGINT: finishing the copies under way"), "{err}");
    assert!(err.contains("not started (interrupted)"), "the summary says so: {err}");
    let last = err.trim_end().lines().last().unwrap();
    assert!(
        last.contains("interrupted:") && last.contains("not started") && last.contains("again"),
        "{last}"
    );
    assert!(!err.contains("FAILED"), "nothing is a failure: {err}");
    let copied = ok(&s.run(&["ls", "p/"])).lines().count();
    assert!((1..FILES).contains(&copied), "{copied} of {FILES} copied before the stop");

    let again = ok(&s.run(&["put", "-r", folder.to_str().unwrap(), "p/", "--json"]));
    let j: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(j["already_there"].as_u64(), Some(copied as u64), "{j}");
    assert_eq!(j["copied"].as_u64(), Some((FILES - copied) as u64), "{j}");
    assert_eq!((j["interrupted"].as_bool(), j["not_started"].as_u64()), (Some(false), Some(0)));
}

/// A second Ctrl-C stops at once, the copy under way cut short (the server is stopped, so it
/// cannot have finished): exit status 130, nothing partial is a blob, and running the command
/// again copies everything, each blob checked against its file.
#[test]
fn a_second_ctrl_c_stops_at_once_and_leaves_nothing_partial() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(&dir.path().join("data"));
    let (child, mut stderr, mut err, folder) = put_r_then_ctrl_c(&s, dir.path());
    signal(child.id(), libc::SIGINT);
    std::io::Read::read_to_string(&mut stderr, &mut err).unwrap();
    let out = child.wait_with_output().unwrap();
    signal(s.child.id(), libc::SIGCONT);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("SIGINT again: stopping now"), "{err}");
    let copied = ok(&s.run(&["ls", "p/"])).lines().count();
    assert!((1..FILES).contains(&copied), "{copied} of {FILES}");
    ok(&s.run(&["-q", "put", "-r", folder.to_str().unwrap(), "p/"]));
    ok(&s.run(&["check", "-r", folder.to_str().unwrap(), "p/"]));
    assert_eq!(ok(&s.run(&["ls", "p/"])).lines().count(), FILES);
}

/// A study folder up and down: `put -r` names every failure and continues, re-running is
/// idempotent (everything "already there"), `get -r` rebuilds the folder, `check -r` finds a
/// changed file and a missing one, `get -r` repairs it, `rm -r` removes the prefix.
#[test]
fn folders_up_and_down_with_check_and_rm_r() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(&dir.path().join("data"));
    let study = dir.path().join("study");
    for (i, se) in ["se1", "se1", "se2/sub"].iter().cycle().take(30).enumerate() {
        std::fs::create_dir_all(study.join(se)).unwrap();
        std::fs::write(study.join(format!("{se}/i{i}.dcm")), content(1000 + i * 997)).unwrap();
    }
    std::os::unix::fs::symlink(&study, study.join("se1/loop")).unwrap();
    std::os::unix::fs::symlink(study.join("gone"), study.join("dangling.dcm")).unwrap();
    let study_s = study.to_str().unwrap();

    let first = s.run(&["put", "-r", study_s, "studies/ct-1", "--meta", "modality=CT"]);
    assert_eq!(first.status.code(), Some(1), "a failure makes the exit non-zero");
    let err = String::from_utf8_lossy(&first.stderr);
    assert!(err.contains("FAILED") && err.contains("dangling.dcm"), "{err}");
    assert!(err.contains("dangling.dcm: a link to nothing ("), "{err}");
    assert!(err.contains("skipped") && err.contains("loop"), "{err}");
    // Every file the plan met is counted once: 30 + 1 + 1.
    assert!(err.contains("32 files, "), "{err}");
    assert!(err.contains("30 copied, 0 already there, 1 skipped, 1 failed"), "{err}");

    std::fs::remove_file(study.join("dangling.dcm")).unwrap();
    let again = ok(&s.run(&["put", "-r", study_s, "studies/ct-1/", "--json"]));
    let j: serde_json::Value = serde_json::from_str(&again).unwrap();
    // 30 already there and the link to a folder, skipped again.
    assert_eq!((j["files"].as_u64(), j["already_there"].as_u64()), (Some(31), Some(30)));
    assert_eq!((j["copied"].as_u64(), j["bytes_moved"].as_u64()), (Some(0), Some(0)));
    let stat = ok(&s.run(&["stat", "studies/ct-1/se2/sub/i2.dcm"]));
    assert!(stat.contains("meta modality: CT"), "{stat}");
    // A file changed since: its blob is in the way, which running again will not change.
    std::fs::write(study.join("se1/i0.dcm"), b"changed").unwrap();
    let o = s.run(&["put", "-r", study_s, "studies/ct-1/"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    let named = "FAILED studies/ct-1/se1/i0.dcm: already exists with other content \
                 (--overwrite replaces it)";
    assert!(err.contains(named), "{err}");
    assert!(err.contains("1 is in the way of a blob that exists (--overwrite replaces it)"));
    assert!(!err.contains("run it again") && !err.contains("set overwrite"), "{err}");
    ok(&s.run(&["-q", "put", "-r", study_s, "studies/ct-1/", "--overwrite"]));
    std::fs::write(study.join("se1/i0.dcm"), content(1000)).unwrap();
    ok(&s.run(&["-q", "put", "-r", study_s, "studies/ct-1/", "--overwrite"]));

    let back = dir.path().join("back");
    let back_s = back.to_str().unwrap();
    ok(&s.run(&["-q", "get", "-r", "studies/ct-1", back_s]));
    for i in 0..30 {
        let se = ["se1", "se1", "se2/sub"][i % 3];
        let f = format!("{se}/i{i}.dcm");
        assert_eq!(std::fs::read(back.join(&f)).unwrap(), content(1000 + i * 997), "{f}");
    }
    ok(&s.run(&["check", "-r", back_s, "studies/ct-1"]));
    std::fs::write(back.join("se1/i0.dcm"), b"changed").unwrap();
    std::fs::remove_file(back.join("se1/i1.dcm")).unwrap();
    let o = s.run(&["check", "-r", back_s, "studies/ct-1"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("DIFFERS") && out.contains("i0.dcm"), "{out}");
    assert!(out.contains("MISSING locally") && out.contains("i1.dcm"), "{out}");
    // Globs choose what is compared: se2 alone is whole; se1 without i0 and i1 too.
    let only_se2 = ok(&s.run(&["check", "-r", back_s, "studies/ct-1", "--include", "se2/**"]));
    assert!(!only_se2.contains("se1/") && only_se2.contains("se2/sub/i2.dcm"), "{only_se2}");
    let args = ["check", "-r", back_s, "studies/ct-1", "--exclude", "i0.dcm", "--exclude", "i1.*"];
    ok(&s.run(&args));
    let o = s.run(&["check", back_s, "studies/ct-1/se1/i0.dcm", "--include", "*.dcm"]);
    assert_eq!(o.status.code(), Some(2), "globs without -r are refused");
    let o = s.run(&["get", "-r", "studies/ct-1", back_s]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains("2 copied, 28 already there"), "{err}");
    ok(&s.run(&["check", "-r", back_s, "studies/ct-1"]));

    // A file where a folder should be, and a folder that is a link out of the target: the
    // files under them fail alone (nothing written through the link), the rest lands.
    let blocked = dir.path().join("blocked");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(blocked.join("se2")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(blocked.join("se2/sub"), b"a file in the way").unwrap();
    std::os::unix::fs::symlink(&outside, blocked.join("se1")).unwrap();
    let o = s.run(&["get", "-r", "studies/ct-1", blocked.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("se2/sub/i2.dcm") && err.contains("in the way"), "{err}");
    assert!(err.contains("se1/i0.dcm") && err.contains("is a link (not followed)"), "{err}");
    assert!(err.contains("0 copied, 0 already there, 0 skipped, 30 failed"), "{err}");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "written through the link");
    std::fs::remove_file(blocked.join("se1")).unwrap();
    let o = s.run(&["get", "-r", "studies/ct-1", blocked.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("20 copied, 0 already there, 0 skipped, 10 failed"), "{err}");
    // Running again would meet the same file in the way: not advised.
    assert!(err.contains("running again meets the same") && !err.contains("run it again"), "{err}");
    assert_eq!(std::fs::read(blocked.join("se1/i0.dcm")).unwrap(), content(1000));

    ok(&s.run(&["rm", "-r", "studies/ct-1"]));
    assert_eq!(ok(&s.run(&["ls", "studies/"])), "");
    fails_with(&s.run(&["get", "-r", "studies/ct-1", back_s]), "no blobs under");
    // Removing nothing is said and fails: a typo, or a blob's own name (which stays).
    let o = s.run(&["rm", "-r", "studies/ct-1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no blobs under \"studies/ct-1/\""));
    ok(&s.run(&["put", study.join("se1/i0.dcm").to_str().unwrap(), "one/blob"]));
    let o = s.run(&["rm", "-r", "one/blob"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("one/blob is a blob: `rm one/blob` removes it"), "{err}");
    ok(&s.run(&["stat", "one/blob"]));
}

/// `sync` both ways: only what differs moves, --delete removes what the source lacks (and
/// refuses when the source was not read in full), --include/--exclude choose the files.
#[test]
fn sync_moves_only_what_differs_and_deletes_only_when_safe() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(&dir.path().join("data"));
    let study = dir.path().join("study");
    let put = |rel: &str, body: &[u8]| {
        let f = study.join(rel);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, body).unwrap();
    };
    for (i, rel) in ["se1/a.dcm", "se1/b.dcm", "se2/c.dcm", "notes.txt", "scout/s.dcm", "x.tmp"]
        .iter()
        .enumerate()
    {
        put(rel, &content(500 + i * 301));
    }
    let study_s = study.to_str().unwrap();
    let json = |o: &Output| -> serde_json::Value { serde_json::from_str(&ok(o)).unwrap() };
    let count = |j: &serde_json::Value, k: &str| j[k].as_u64().unwrap();
    let filters = ["--exclude", "*.tmp", "--exclude", "scout/**"];
    let sync = |args: &[&str]| {
        let mut all = vec!["sync", "--json"];
        all.extend_from_slice(args);
        all.extend_from_slice(&filters);
        s.run(&all)
    };

    let j = json(&sync(&[study_s, "bs:p/"]));
    assert_eq!((count(&j, "copied"), count(&j, "excluded")), (4, 2), "{j}");
    put("se1/a.dcm", b"changed");
    std::fs::remove_file(study.join("se2/c.dcm")).unwrap();
    put("new.dcm", b"new");
    let j = json(&sync(&[study_s, "bs:p", "--delete"]));
    assert_eq!((count(&j, "copied"), count(&j, "already_there")), (2, 2), "{j}");
    assert_eq!(j["deleted"], serde_json::json!(["p/se2/c.dcm"]));
    assert_eq!(ok(&s.run(&["cat", "p/se1/a.dcm"])), "changed");
    let listed = ok(&s.run(&["ls", "p/"]));
    assert!(!listed.contains("c.dcm") && !listed.contains("scout") && !listed.contains("tmp"));

    // Down: a changed and an extra local file; only those are touched.
    let here = dir.path().join("here");
    let here_s = here.to_str().unwrap();
    assert_eq!(count(&json(&sync(&["bs:p/", here_s])), "copied"), 4);
    std::fs::write(here.join("se1/b.dcm"), b"edited locally").unwrap();
    std::fs::write(here.join("extra.bin"), b"x").unwrap();
    std::fs::write(here.join("keep.tmp"), b"excluded, so kept").unwrap();
    let j = json(&sync(&["bs:p", here_s, "--delete"]));
    assert_eq!((count(&j, "copied"), count(&j, "already_there")), (1, 3), "{j}");
    // Named as what was removed: the local file, not a blob.
    let removed = here.join("extra.bin").display().to_string();
    assert_eq!(j["deleted"], serde_json::json!([removed]));
    assert!(!here.join("extra.bin").exists() && here.join("keep.tmp").exists());
    std::fs::remove_file(here.join("keep.tmp")).unwrap();
    ok(&s.run(&["check", "-r", here_s, "p/", "--json"]));

    // A source not read in full deletes nothing; the rest still syncs, the exit says so.
    std::os::unix::fs::symlink(study.join("gone"), study.join("dangling.dcm")).unwrap();
    std::fs::remove_file(study.join("new.dcm")).unwrap();
    let o = sync(&[study_s, "bs:p", "--delete"]);
    assert_eq!(o.status.code(), Some(1));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(j["failed"].to_string().contains("nothing removed"), "{j}");
    assert_eq!(j["deleted"], serde_json::json!([]));
    // The dangling link's entry names its path and the blob it would have been.
    let dangling = j["failed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"].as_str().is_some_and(|n| n.ends_with("dangling.dcm")));
    assert_eq!(dangling.map(|f| f["blob"].clone()), Some("p/dangling.dcm".into()), "{j}");
    assert!(ok(&s.run(&["ls", "p/"])).contains("new.dcm"));

    // --include alone; flags that need many blobs; what sync cannot do.
    let o = s.run(&["put", "-r", study_s, "only-dcm/", "--include", "*.dcm", "--json"]);
    assert_eq!(o.status.code(), Some(1), "the dangling link still fails");
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((count(&j, "copied"), count(&j, "excluded")), (3, 2), "{j}");
    usage_error(&s.run(&["put", study_s, "k", "--jobs", "2"]), "go with -r");
    usage_error(&s.run(&["sync", "bs:p/", "bs:q/"]), "between a local folder and a prefix");
    usage_error(&s.run(&["sync", study_s, "bs:p", "--include", "a["]), "a[");
}

/// What a new user meets first: a filter closing the pipe ends `cat` quietly; the HTTP port
/// given as --server is named as such; `get` into a missing folder names the folder; an
/// existing blob names --overwrite; `cp` between servers keeps user metadata; `ls -h`.
#[test]
fn first_steps_get_clear_answers() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(&dir.path().join("data"));
    let file = dir.path().join("f.bin");
    std::fs::write(&file, content(3_000_000)).unwrap();
    let f = file.to_str().unwrap();
    ok(&s.run(&["put", f, "a/f.bin", "--meta", "modality=CT"]));
    // Put again: the same bytes and description are already there; other metadata or another
    // content type is not what is stored, so it is refused, not reported as done.
    let again = s.run(&["put", f, "a/f.bin", "--meta", "modality=CT"]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("already there"), "{again:?}");
    ok(&again);
    let other_meta = s.run(&["put", f, "a/f.bin", "--meta", "modality=MR"]);
    fails_with(&other_meta, "already exists with these bytes but other metadata (--overwrite");
    let other_type = s.run(&["put", f, "a/f.bin", "--content-type", "application/x-foo"]);
    fails_with(&other_type, "other content type");
    // No --content-type asks for none: the blob stored as image/png is the same blob.
    ok(&s.run(&["put", f, "a/typed.png", "--content-type", "image/png"]));
    let again = s.run(&["put", f, "a/typed.png"]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("already there"), "{again:?}");
    ok(&again);
    // Metadata a terminal or an HTTP header cannot carry is refused, as is a key given twice.
    usage_error(&s.run(&["put", f, "a/m", "--meta", "k=1", "--meta", "k=2"]), "given twice");
    fails_with(&s.run(&["put", f, "a/m", "--meta", "k=a\x1b[31mred"]), "control character");
    fails_with(&s.run(&["put", f, "a/m", "--content-type", "te\nxt/plain"]), "printable ASCII");
    assert_eq!(s.run(&["stat", "a/m"]).status.code(), Some(1), "nothing stored");
    assert!(ok(&s.run(&["stat", "a/f.bin"])).contains("meta modality: CT"));
    ok(&s.run(&["put", f, "a/f.bin", "--meta", "modality=MR", "--overwrite"]));
    assert!(ok(&s.run(&["stat", "a/f.bin"])).contains("meta modality: MR"));
    ok(&s.run(&["put", f, "a/f.bin", "--meta", "modality=CT", "--overwrite"]));

    let mut cat = Command::new(BIN)
        .args(["--server", &s.addr, "cat", "a/f.bin"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 10];
    std::io::Read::read_exact(cat.stdout.as_mut().unwrap(), &mut head).unwrap();
    drop(cat.stdout.take());
    let o = cat.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stderr), "");

    let http = s.url.trim_start_matches("http://").trim_end_matches('/');
    let o = Command::new(BIN).args(["--server", http, "ls"]).output().unwrap();
    fails_with(&o, "is --server its HTTP port?");
    let o = Command::new(BIN).args(["--server", &s.data, "ls"]).output().unwrap();
    fails_with(&o, &format!("is {} a blobstream control plane?", s.data));
    // A host without a port: the default port is said.
    let o = Command::new(BIN).args(["--server", "127.0.0.9", "ls"]).output().unwrap();
    fails_with(&o, "cannot reach blobstream server at 127.0.0.9:7070");
    let missing = dir.path().join("nope/out.bin");
    fails_with(&s.run(&["get", "a/f.bin", missing.to_str().unwrap()]), "nope does not exist");
    let other = dir.path().join("g.bin");
    std::fs::write(&other, b"other").unwrap();
    fails_with(&s.run(&["put", other.to_str().unwrap(), "a/f.bin"]), "--overwrite replaces it");
    ok(&s.run(&["cp", "bs:a/f.bin", "bs:b/f.bin"]));
    assert!(ok(&s.run(&["stat", "b/f.bin"])).contains("meta modality: CT"));
    let ls = ok(&s.run(&["ls", "-h", "a/"]));
    assert!(ls.contains("2.9 MiB") && ls.contains("a/f.bin"), "{ls}");
}

#[test]
fn help_of_commands_that_are_not_clients_leaves_out_client_options() {
    let help = |args: &[&str]| {
        let o = Command::new(BIN).args(args).arg("--help").output().unwrap();
        String::from_utf8(ok(&o).into_bytes()).unwrap()
    };
    let serve = help(&["serve"]);
    for client_only in ["--server", "--tls-ca", "--tls-domain", "--quiet"] {
        assert!(!serve.contains(client_only), "serve --help lists {client_only}");
    }
    assert!(serve.contains("--auth-token-file"), "serve takes the token to require");
    for local in [&["filter"][..], &["bench", "transfer"], &["image-info"]] {
        assert!(!help(local).contains("--server"), "{local:?} --help lists --server");
    }
    let put = help(&["put"]);
    assert!(put.contains("--server") && put.contains("--tls-ca"), "clients keep them");
    // Still accepted where hidden, also after nested subcommands (scripts that always pass
    // --server or -q keep working).
    ok(&Command::new(BIN).args(["filters", "--server", "127.0.0.1:1"]).output().unwrap());
    let nested = ["bench", "transfer", "-q", "--server", "127.0.0.1:1", "--help"];
    ok(&Command::new(BIN).args(nested).output().unwrap());
    // Tokens set in the environment are not shown by --help (a pasted help text, a CI log).
    let secrets = [
        ("BLOBSTREAM_DPSS_TOKEN", &["serve"][..]),
        ("BLOBSTREAM_DPSS_TOKEN", &["dpss", "status"]),
        ("BLOBSTREAM_STREAM_TOKEN", &["send"]),
        ("BLOBSTREAM_DISTRIBUTER_STATUS_TOKEN", &["distributer"]),
        ("BLOBSTREAM_DISTRIBUTER_STATUS_TOKEN", &["send"]),
    ];
    for (var, cmd) in secrets {
        let o = Command::new(BIN).args(cmd).arg("--help").env(var, "s3cret-value").output();
        let text = ok(&o.unwrap());
        assert!(text.contains(var) && !text.contains("s3cret-value"), "{cmd:?} --help shows {var}");
    }
}

/// One server per data directory: a second one started on it (other ports) is refused at
/// start-up, naming the first, and touches nothing; once the first has stopped, it starts.
#[test]
fn a_second_server_on_the_same_data_directory_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let first = Serve::start(&data);
    let d = data.to_str().unwrap();
    let o = exits_within_a_minute(
        Command::new(BIN)
            .args(["serve", "--data", d, "--addr", "127.0.0.1:0", "--data-addr", "127.0.0.1:0"])
            .args(["--no-http", "--no-samples"]),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("in use by another blobstream server"), "{err}");
    assert!(err.contains(&format!("(process {})", first.child.id())), "{err}");
    drop(first);
    let again = Serve::start(&data);
    ok(&again.run(&["ls"]));
}

/// `cmd`'s output, or a failure if it has not exited within 60 s (a server that started
/// where it should have refused to: the test fails rather than waits for ever).
fn exits_within_a_minute(cmd: &mut Command) -> Output {
    use std::io::Read;
    let mut child =
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("the binary runs");
    // Both pipes drained while it runs: a child that writes more than a pipe holds would
    // otherwise block on the write, and look hung.
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&stderr.join().unwrap()).into_owned();
            panic!("still running after 60 s; stderr: {err}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

/// `cp` takes `-` as standard output (never standard input), and a local destination as `get`
/// does: a folder gets the file, a link is followed and kept.
#[test]
fn cp_writes_to_stdout_into_folders_and_through_links() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(&dir.path().join("data"));
    let f = dir.path().join("f");
    std::fs::write(&f, b"hello").unwrap();
    let f = f.to_str().unwrap();
    ok(&s.run(&["put", f, "k/f"]));
    assert_eq!(ok(&s.run(&["cp", "bs:k/f", "-"])), "hello");
    usage_error(&s.run(&["cp", "-", "bs:x"]), "not standard input");
    usage_error(&s.run(&["cp", f, "-"]), "give bs:NAME as the source");
    let folder = dir.path().join("sd");
    std::fs::create_dir(&folder).unwrap();
    ok(&s.run(&["cp", f, &format!("{}/", folder.display())]));
    assert_eq!(std::fs::read(folder.join("f")).unwrap(), b"hello");
    let (target, link) = (dir.path().join("same"), dir.path().join("link"));
    std::fs::write(&target, b"old").unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    ok(&s.run(&["cp", f, link.to_str().unwrap()]));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "kept");
    assert_eq!(std::fs::read(&target).unwrap(), b"hello");
}

/// A server gone before a folder's copies start: the copies under way fail once, said in two
/// lines at most, the rest are not started; the JSON summary's total is the whole job's.
#[test]
fn a_batch_to_a_server_that_is_gone_says_so_once() {
    let dir = tempfile::tempdir().unwrap();
    let study = dir.path().join("study");
    std::fs::create_dir(&study).unwrap();
    for i in 0..20 {
        std::fs::write(study.join(format!("f{i:02}")), content(1000)).unwrap();
    }
    // Port 1 (tcpmux): privileged, and nothing of these tests listens there, so a connection
    // is refused at once (a port the OS gave and the test freed could be given again to a
    // server another test starts meanwhile).
    let gone = "127.0.0.1:1".to_string();
    let study = study.to_str().unwrap();
    let o = Command::new(BIN).args(["--server", &gone, "put", "-r", study, "up/"]).output();
    let o = o.unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.matches("FAILED").count() <= 2, "{err}");
    assert!(err.contains("stopped, the server could not be reached"), "{err}");
    let args = ["--server", &gone, "put", "-r", study, "up/", "--json"];
    let o = Command::new(BIN).args(args).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["bytes_total"], 20_000, "{v}");
    assert_eq!(v["bytes_moved"], 0, "{v}");
}

/// A limit or timeout of 0 that would fail every transfer is refused as a usage error.
#[test]
fn serve_refuses_zero_limits_and_timeouts() {
    let refused = |flag: &str, value: &str, why: &str| {
        let o = exits_within_a_minute(Command::new(BIN).args(["serve", "--memory", flag, value]));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag) && err.contains(why), "{flag} {value}: {err}");
    };
    for flag in ["--token-ttl", "--io-timeout", "--max-connections", "--max-uploads"] {
        refused(flag, "0", "0 would refuse or end everything");
    }
    refused("--max-upload", "0k", "0 would refuse everything");
    let o = Command::new(BIN).args(["put", "-r", ".", "x/", "--jobs", "0"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "--jobs 0 copies nothing");
}

/// `bs:PREFIX` means the prefix in every command, and a scrub of a prefix that holds nothing
/// is no all-clear.
#[test]
fn bs_names_work_everywhere_and_an_empty_scrub_is_not_an_all_clear() {
    let t = tempfile::tempdir().unwrap();
    let srv = Serve::start(&t.path().join("data"));
    let f = t.path().join("f.bin");
    std::fs::write(&f, content(5000)).unwrap();
    ok(&srv.run(&["put", f.to_str().unwrap(), "bs:m/f.bin"]));
    assert!(ok(&srv.run(&["ls", "bs:m/"])).contains("m/f.bin"));
    assert!(ok(&srv.run(&["stat", "bs:m/f.bin"])).contains("m/f.bin"));
    ok(&srv.run(&["check", f.to_str().unwrap(), "bs:m/f.bin"]));
    ok(&srv.run(&["scrub", "bs:m/"]));
    fails_with(&srv.run(&["scrub", "bs:nomatch/"]), "no blobs under \"nomatch/\"");
    ok(&srv.run(&["rm", "bs:m/f.bin"]));
    fails_with(&srv.run(&["stat", "m/f.bin"]), "m/f.bin");
}
