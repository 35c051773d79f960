//! The Blob API over every location (memory, local file, remote server over the memory and
//! filesystem stores) and the transporter over every pair of them, with a real server on
//! port 0.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bs_blob::{BlobError, BlobKey, CopyPath, Factory, NewBlob, Options, Transporter};
use bs_server::{BackgroundServer, ServerConfig};
use bs_store::{FsStore, MemStore, Store};

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[1]).collect()
}

struct World {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    _servers: Vec<BackgroundServer>,
    /// Control addresses: one server over a memory store, one over a filesystem store.
    remotes: Vec<String>,
    t: Transporter,
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let fs: Arc<dyn Store> = Arc::new(FsStore::open(root.join("store")).unwrap());
    let servers = vec![
        BackgroundServer::start(Arc::new(MemStore::new()), ServerConfig::ephemeral()).unwrap(),
        BackgroundServer::start(fs, ServerConfig::ephemeral()).unwrap(),
    ];
    let remotes = servers.iter().map(|s| s.control_addr().to_string()).collect();
    World { _dir: dir, root, _servers: servers, remotes, t: Transporter::new(Factory::new()) }
}

impl World {
    /// One key per location kind.
    fn keys(&self, name: &str) -> Vec<BlobKey> {
        let mut v =
            vec![BlobKey::memory(name), BlobKey::file(self.root.join(name.replace('/', "_")))];
        v.extend(self.remotes.iter().map(|r| BlobKey::remote(r, name)));
        v
    }

    fn write(&self, key: &BlobKey, bytes: &[u8]) {
        let spec = NewBlob {
            size: Some(bytes.len() as u64),
            content_type: "image/x-test".into(),
            ..Default::default()
        };
        let mut p = self.t.factory().route(key, &spec).unwrap();
        for piece in bytes.chunks(700_000) {
            p.write(piece).unwrap();
        }
        p.close().unwrap();
    }

    fn read(&self, key: &BlobKey) -> Vec<u8> {
        let mut p = self.t.factory().bind(key).unwrap();
        let mut out = Vec::new();
        let mut buf = vec![0u8; 300_000];
        loop {
            let n = p.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        assert_eq!(out.len() as u64, p.size());
        out
    }
}

#[test]
fn proxy_api_behaves_the_same_everywhere() {
    let w = world();
    let bytes = data(2_500_000);
    for key in w.keys("api/blob") {
        w.write(&key, &bytes);
        assert_eq!(w.read(&key), bytes, "{key}");
        let mut p = w.t.factory().bind(&key).unwrap();
        assert_eq!(p.size(), 2_500_000, "{key}");
        if !matches!(key.location(), bs_blob::Location::File) {
            assert_eq!(p.content_type(), "image/x-test", "{key}");
        }
        p.seek(2_000_000).unwrap();
        assert_eq!(p.position(), 2_000_000);
        let mut buf = vec![0u8; 10];
        assert_eq!(p.read(&mut buf).unwrap(), 10);
        assert_eq!(buf, bytes[2_000_000..2_000_010], "{key}");
        assert!(p.seek(2_500_001).is_err(), "{key}");
        assert!(matches!(p.write(b"x"), Err(BlobError::WrongState { .. })), "{key}");
        p.close().unwrap();
        assert!(matches!(p.read(&mut buf), Err(BlobError::WrongState { .. })), "{key}");
        p.open().unwrap();
        assert_eq!(p.read(&mut buf).unwrap(), 10);
        assert_eq!(buf, bytes[..10], "{key}");
    }
}

#[test]
fn missing_blobs_and_existing_destinations_are_named() {
    let w = world();
    for key in w.keys("nothing/here") {
        assert!(matches!(w.t.factory().bind(&key), Err(BlobError::NotFound(_))), "{key}");
    }
    for key in w.keys("exists") {
        w.write(&key, b"1");
        let e =
            w.t.factory()
                .route(&key, &NewBlob { size: Some(1), ..Default::default() })
                .unwrap_err();
        assert!(matches!(e, BlobError::AlreadyExists(_)), "{key}: {e}");
    }
}

#[test]
fn copying_the_same_bytes_again_is_already_there_and_different_bytes_are_refused() {
    let w = world();
    let bytes = data(1_500_000);
    let src = BlobKey::file(w.root.join("same.src"));
    std::fs::write(w.root.join("same.src"), &bytes).unwrap();
    for dst in w.keys("again/blob") {
        let first = w.t.copy(&src, &dst, &Options::blocking()).wait().unwrap();
        assert_ne!(first.path, CopyPath::AlreadyThere, "{dst}");
        // The retry of a copy whose confirmation was lost (a crash after commit).
        let again = w.t.copy(&src, &dst, &Options::blocking()).wait().unwrap();
        assert_eq!(
            (again.path, again.bytes, again.resumed_from),
            (CopyPath::AlreadyThere, 0, 1_500_000),
            "{dst}"
        );
        assert_eq!(w.read(&dst), bytes);
    }
    let mut other = bytes.clone();
    other[42] ^= 1;
    std::fs::write(w.root.join("same.src"), &other).unwrap();
    for dst in w.keys("again/blob") {
        let e = w.t.copy(&src, &dst, &Options::blocking()).wait().unwrap_err();
        assert!(matches!(e, BlobError::AlreadyExists(_)), "{dst}: {e}");
        assert_eq!(w.read(&dst), bytes, "{dst} unchanged");
    }
}

#[test]
fn transporter_copies_between_every_pair_of_locations() {
    let w = world();
    let bytes = data(3_100_000);
    let srcs = w.keys("pair/src");
    for s in &srcs {
        w.write(s, &bytes);
    }
    for (i, s) in srcs.iter().enumerate() {
        for (j, d) in w.keys(&format!("pair/dst-{i}")).into_iter().enumerate() {
            let copied =
                w.t.copy(s, &d, &Options::blocking())
                    .wait()
                    .unwrap_or_else(|e| panic!("{s} -> {d}: {e}"));
            assert_eq!(copied.bytes, bytes.len() as u64);
            assert_eq!(w.read(&d), bytes, "{s} -> {d}");
            let expected = match (i, j) {
                (1, 1) => CopyPath::KernelCopy,
                (0 | 1, _) => CopyPath::Slice,
                _ => CopyPath::Relay,
            };
            assert_eq!(copied.path, expected, "{s} -> {d}");
        }
    }
}

#[test]
fn copy_range_between_open_proxies() {
    let w = world();
    let bytes = data(1_000_000);
    let src = BlobKey::memory("range/src");
    w.write(&src, &bytes);
    for d in w.keys("range/dst") {
        let reader = w.t.factory().bind(&src).unwrap();
        let writer =
            w.t.factory().route(&d, &NewBlob { size: Some(1000), ..Default::default() }).unwrap();
        let c =
            w.t.copy_range(reader, writer, Some(5000..6000), &Options::blocking()).wait().unwrap();
        assert_eq!(c.bytes, 1000);
        assert_eq!(w.read(&d), &bytes[5000..6000], "{d}");
    }
}

#[test]
fn asynchronous_mode_changes_only_the_options_value() {
    let w = world();
    let bytes = data(4_000_000);
    let src = BlobKey::file(w.root.join("async-src"));
    std::fs::write(src.path().unwrap(), &bytes).unwrap();
    let seen = Arc::new(Mutex::new(None));
    let progress = Arc::new(AtomicU64::new(0));
    let (s2, p2) = (seen.clone(), progress.clone());
    let opts = Options::asynchronous()
        .on_complete(move |r| {
            *s2.lock().unwrap() = Some(r.as_ref().map(|c| c.bytes).map_err(|e| e.to_string()))
        })
        .progress(move |done, total| {
            assert!(done <= total);
            p2.store(done, Ordering::SeqCst);
        });
    let dst = BlobKey::remote(&w.remotes[1], "async/dst");
    let pending = w.t.copy(&src, &dst, &opts);
    let copied = pending.wait().unwrap();
    assert_eq!(copied.bytes, 4_000_000);
    assert_eq!(*seen.lock().unwrap(), Some(Ok(4_000_000)), "callback saw the outcome");
    assert_eq!(progress.load(Ordering::SeqCst), 4_000_000);
    assert_eq!(w.read(&dst), bytes);

    // And the same completion can be awaited.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dst2 = BlobKey::memory("async/awaited");
    let c = rt.block_on(w.t.copy(&src, &dst2, &Options::asynchronous()));
    assert_eq!(c.unwrap().bytes, 4_000_000);
}

#[test]
fn timeouts_are_not_failures() {
    let w = world();
    // A data endpoint that accepts and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let cfg = ServerConfig {
        advertise_data: Some(silent.local_addr().unwrap().to_string()),
        ..ServerConfig::ephemeral()
    };
    let store = MemStore::new();
    let s = BackgroundServer::start(Arc::new(store.clone()), cfg).unwrap();
    let src = BlobKey::memory("t/src");
    w.write(&src, &data(10));
    let dst = BlobKey::remote(s.control_addr().to_string(), "t/dst");
    for opts in [Options::blocking(), Options::asynchronous()] {
        let e =
            w.t.copy(&src, &dst, &opts.overwrite(true).timeout(Duration::from_millis(300)))
                .wait()
                .unwrap_err();
        assert!(matches!(e, BlobError::Timeout(t) if t == Duration::from_millis(300)), "{e:?}");
    }
    // A failure is a failure, not a timeout.
    let e =
        w.t.copy(
            &BlobKey::memory("t/none"),
            &dst,
            &Options::blocking().timeout(Duration::from_secs(5)),
        )
        .wait();
    assert!(matches!(e, Err(BlobError::NotFound(_))), "{e:?}");
}

#[test]
fn an_interrupted_upload_resumes_after_its_prefix_checks_out() {
    let w = world();
    let bytes = data(3_000_000);
    let src = BlobKey::file(w.root.join("resume-src"));
    std::fs::write(src.path().unwrap(), &bytes).unwrap();
    for remote in &w.remotes {
        let dst = BlobKey::remote(remote, "resume/dst");
        // A first attempt dies after 1 MB: write through a proxy routed with the same tag the
        // transporter will use, and drop it without closing.
        {
            let tag_src = w.t.factory().bind(&src).unwrap();
            let tag = format!(
                "{}:{}:{}",
                tag_src.key(),
                tag_src.size(),
                std::fs::metadata(src.path().unwrap())
                    .unwrap()
                    .modified()
                    .unwrap()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            );
            let spec = NewBlob { size: Some(3_000_000), resume_tag: tag, ..Default::default() };
            let mut p = w.t.factory().route(&dst, &spec).unwrap();
            p.write(&bytes[..1_000_000]).unwrap();
        }
        let c = w.t.copy(&src, &dst, &Options::blocking().resume(true)).wait().unwrap();
        assert_eq!((c.resumed_from, c.bytes), (1_000_000, 2_000_000), "{remote}");
        assert_eq!(w.read(&dst), bytes);
    }
}

/// A file another program truncates while it is being put: the copy fails naming it — the
/// process does not die of SIGBUS reading its mapped pages past the new end — and nothing is
/// committed.
#[test]
fn a_file_truncated_while_it_is_put_fails_the_copy_and_commits_nothing() {
    use std::sync::atomic::AtomicBool;
    let w = world();
    let path = w.root.join("shrinking.bin");
    for (i, remote) in w.remotes.iter().enumerate() {
        std::fs::write(&path, data(24 << 20)).unwrap();
        let dst = BlobKey::remote(remote, format!("shrunk/{i}"));
        let (cut, file) = (Arc::new(AtomicBool::new(false)), path.clone());
        let c = cut.clone();
        // After the first bytes went: cut the file to 1 MiB, behind the copy's back.
        let opts = Options::blocking().progress(move |done, _| {
            if done > 0 && !c.swap(true, Ordering::SeqCst) {
                let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
                f.set_len(1 << 20).unwrap();
            }
        });
        let err = w.t.copy(&BlobKey::file(&path), &dst, &opts).wait().unwrap_err();
        assert!(cut.load(Ordering::SeqCst), "the file was cut mid-copy");
        assert!(err.to_string().contains("truncated while being read"), "{err}");
        assert!(matches!(w.t.factory().bind(&dst), Err(BlobError::NotFound(_))), "{remote}");
    }
}

#[test]
fn an_interrupted_download_resumes_and_a_wrong_prefix_starts_over() {
    let w = world();
    let bytes = data(2_000_000);
    let src = BlobKey::remote(&w.remotes[0], "dl/src");
    w.write(&src, &bytes);
    let dest = w.root.join("download.bin");
    let part = w.root.join("download.bin.blobstream-part");
    std::fs::write(&part, &bytes[..700_000]).unwrap();
    let dst = BlobKey::file(&dest);
    let c = w.t.copy(&src, &dst, &Options::blocking().resume(true)).wait().unwrap();
    assert_eq!(c.resumed_from, 700_000);
    assert_eq!(std::fs::read(&dest).unwrap(), bytes);
    assert!(!part.exists(), "part file renamed into place");

    // A part file that does not match the source is discarded, not built upon.
    std::fs::write(&part, vec![0u8; 700_000]).unwrap();
    let c = w.t.copy(&src, &dst, &Options::blocking().resume(true).overwrite(true)).wait().unwrap();
    assert_eq!(c.resumed_from, 0);
    assert_eq!(std::fs::read(&dest).unwrap(), bytes);
}

/// A download into a file another download is writing (its part file locked: another
/// `get -r` into the same folder) is refused, and leaves that part file alone.
#[test]
fn a_second_download_into_the_same_file_is_refused_while_the_first_runs() {
    let w = world();
    let bytes = data(1_500_000);
    let src = BlobKey::remote(&w.remotes[0], "dl/locked");
    w.write(&src, &bytes);
    let dest = w.root.join("locked.bin");
    let part = bs_blob::part_path(&dest);
    std::fs::write(&part, b"the other download's bytes").unwrap();
    let other = std::fs::OpenOptions::new().write(true).open(&part).unwrap();
    other.lock().unwrap();
    let e = w.t.copy(&src, &BlobKey::file(&dest), &Options::blocking()).wait().unwrap_err();
    assert!(e.to_string().contains("another download into"), "{e}");
    assert_eq!(std::fs::read(&part).unwrap(), b"the other download's bytes", "left alone");
    assert!(!dest.exists());
    // Once that one is done (its lock gone), the download runs.
    drop(other);
    w.t.copy(&src, &BlobKey::file(&dest), &Options::blocking()).wait().unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), bytes);
}

#[test]
fn corruption_on_the_server_is_caught_by_the_receiver() {
    let dir = tempfile::tempdir().unwrap();
    let store = FsStore::open(dir.path()).unwrap();
    let s = BackgroundServer::start(Arc::new(store), ServerConfig::ephemeral()).unwrap();
    let t = Transporter::new(Factory::new());
    let key = BlobKey::remote(s.control_addr().to_string(), "c/blob");
    let bytes = data(1_000_000);
    let mut p =
        t.factory().route(&key, &NewBlob { size: Some(1_000_000), ..Default::default() }).unwrap();
    p.write(&bytes).unwrap();
    p.close().unwrap();
    // Flip one byte of the stored file behind the store's back (bit rot).
    let file = walk(dir.path().join("blobs")).pop().unwrap();
    let mut on_disk = std::fs::read(&file).unwrap();
    on_disk[500_000] ^= 0xff;
    std::fs::write(&file, on_disk).unwrap();
    let e = t.copy(&key, &BlobKey::memory("c/copy"), &Options::blocking()).wait().unwrap_err();
    assert!(e.is_integrity(), "{e:?}");
    assert!(e.to_string().contains("corrupt"), "{e}");
    assert!(
        t.factory().bind(&BlobKey::memory("c/copy")).is_err(),
        "nothing partial became visible"
    );
    // A download into a file, tried twice with resume on (the CLI's `get`): both fail, and
    // no part file is left for the second to build on.
    let out = dir.path().join("copy.bin");
    for _ in 0..2 {
        let r = t.copy(&key, &BlobKey::file(&out), &Options::blocking().resume(true)).wait();
        assert!(r.as_ref().is_err_and(|e| e.is_integrity()), "{r:?}");
        assert!(!out.exists());
        assert!(!bs_blob::part_path(&out).exists(), "no unverified part file kept");
    }
}

fn walk(dir: std::path::PathBuf) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() { out.extend(walk(p)) } else { out.push(p) }
    }
    out
}

/// A copy given no metadata keeps the source's (memory → remote → remote → memory); one given
/// metadata sets exactly that. A local file has none to keep.
#[test]
fn copies_keep_the_source_metadata_unless_given_other() {
    let w = world();
    let src = BlobKey::memory("meta/src");
    let spec = NewBlob {
        size: Some(3),
        metadata: [("modality".to_string(), "CT".to_string())].into(),
        ..Default::default()
    };
    let mut p = w.t.factory().route(&src, &spec).unwrap();
    p.write(b"abc").unwrap();
    p.close().unwrap();
    let hops = [
        BlobKey::remote(&w.remotes[0], "meta/a"),
        BlobKey::remote(&w.remotes[1], "meta/b"),
        BlobKey::memory("meta/back"),
    ];
    let mut from = src;
    for to in hops {
        w.t.copy(&from, &to, &Options::blocking()).wait().unwrap();
        let got = w.t.factory().bind(&to).unwrap().metadata();
        assert_eq!(got.get("modality").map(String::as_str), Some("CT"), "{to}");
        from = to;
    }
    let other = NewBlob {
        metadata: [("modality".to_string(), "MR".to_string())].into(),
        ..Default::default()
    };
    let dst = BlobKey::memory("meta/other");
    w.t.copy_as(&from, &dst, &other, &Options::blocking()).wait().unwrap();
    assert_eq!(w.t.factory().bind(&dst).unwrap().metadata(), other.metadata);
    let file = BlobKey::file(w.root.join("meta-file"));
    w.t.copy(&dst, &file, &Options::blocking()).wait().unwrap();
    assert!(w.t.factory().bind(&file).unwrap().metadata().is_empty());
}

/// Small blobs from files to a server: after the first copy has left a data connection to
/// keep, each goes in one round trip (pipelined), with the outcomes of the usual way —
/// metadata set, a repeat "already there", different bytes refused unless overwriting,
/// progress reported — and a blob past the pipelining bound goes the usual way.
#[test]
fn small_blobs_to_a_server_go_in_one_round_trip_with_the_outcomes_of_the_usual_way() {
    let w = world();
    for (r, remote) in w.remotes.iter().enumerate() {
        let mut paths = Vec::new();
        for i in 0..10 {
            let bytes = data(1000 + i * 30_000);
            let src = BlobKey::file(w.root.join(format!("small-{r}-{i}")));
            std::fs::write(w.root.join(format!("small-{r}-{i}")), &bytes).unwrap();
            let dst = BlobKey::remote(remote, format!("small/{i}"));
            let done = Arc::new(AtomicU64::new(0));
            let seen = done.clone();
            let o = Options::blocking().progress(move |n, _| seen.store(n, Ordering::SeqCst));
            let spec = NewBlob {
                metadata: [("modality".to_string(), "CT".to_string())].into(),
                ..Default::default()
            };
            let c = w.t.copy_as(&src, &dst, &spec, &o).wait().unwrap();
            paths.push(c.path);
            assert_eq!((c.bytes, done.load(Ordering::SeqCst)), (bytes.len() as u64, c.bytes));
            assert_eq!(w.read(&dst), bytes);
            let meta = w.t.factory().bind(&dst).unwrap().metadata();
            assert_eq!(meta.get("modality").map(String::as_str), Some("CT"));
            // Again: already there; different bytes: refused, or replaced with overwrite.
            let again = w.t.copy(&src, &dst, &Options::blocking()).wait().unwrap();
            assert_eq!(again.path, CopyPath::AlreadyThere);
            let mut other = bytes.clone();
            other[0] ^= 1;
            std::fs::write(w.root.join(format!("small-{r}-{i}")), &other).unwrap();
            let refused = w.t.copy(&src, &dst, &Options::blocking()).wait().unwrap_err();
            assert!(matches!(refused, BlobError::AlreadyExists(_)), "{refused}");
            let o = Options::blocking().overwrite(true);
            assert_eq!(w.t.copy(&src, &dst, &o).wait().unwrap().path, CopyPath::Pipelined);
            assert_eq!(w.read(&dst), other);
        }
        assert_ne!(paths[0], CopyPath::Pipelined, "the first copy has no connection to keep");
        assert!(paths[1..].iter().all(|p| *p == CopyPath::Pipelined), "{paths:?}");
        let big = data(1_100_000);
        std::fs::write(w.root.join("big"), &big).unwrap();
        let dst = BlobKey::remote(remote, "small/big");
        let c = w.t.copy(&BlobKey::file(w.root.join("big")), &dst, &Options::blocking());
        assert_eq!(c.wait().unwrap().path, CopyPath::Slice);
        assert_eq!(w.read(&dst), big);
    }
}

/// A folder download: small blobs to new files go in runs with their requests sent ahead,
/// with the outcomes of the usual way — a file already holding the bytes is left alone, one
/// holding other bytes is replaced, an interrupted download resumes, a large blob streams, a
/// rotten blob in the middle of a run fails alone and leaves nothing, a blob deleted since the
/// listing is named, one grown past the bound since the listing streams to its file.
#[test]
fn a_folder_download_pulls_small_files_ahead_with_the_outcomes_of_the_usual_way() {
    let dir = tempfile::tempdir().unwrap();
    let store = FsStore::open(dir.path().join("store")).unwrap();
    let s = BackgroundServer::start(Arc::new(store.clone()), ServerConfig::ephemeral()).unwrap();
    let server = s.control_addr().to_string();
    let t = Transporter::new(Factory::new());
    let put = |name: &str, bytes: &[u8]| {
        bs_store::put_bytes(
            &store,
            &bs_store::RouteSpec { name: name.into(), ..Default::default() },
            bytes,
        )
        .unwrap();
    };
    let small = |i: usize| data(1000 + i * 19_000);
    for i in 0..40 {
        put(&format!("study/i{i:02}"), &small(i));
    }
    let big = data(1_500_000);
    put("study/big", &big);
    // Sorts in the middle of the second run (runs of 11: 44 jobs over 4 workers).
    put("study/i15x", &data(5000));
    store.damage("study/i15x", 100, 0x10).unwrap();
    put("study/gone", &data(10));
    put("study/grown", &data(10));
    let listing: Vec<(String, u64)> =
        store.list("study/", "", 1000).unwrap().into_iter().map(|r| (r.name, r.size)).collect();
    store.delete("study/gone").unwrap();
    let grown = data(1_300_000);
    let spec =
        bs_store::RouteSpec { name: "study/grown".into(), overwrite: true, ..Default::default() };
    bs_store::put_bytes(&store, &spec, &grown).unwrap();

    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("i03"), small(3)).unwrap();
    std::fs::write(out.join("i04"), b"other bytes").unwrap();
    // An interrupted download of i05: its first 2000 bytes, as a part file.
    std::fs::write(bs_blob::part_path(&out.join("i05")), &small(5)[..2000]).unwrap();
    let (jobs, problems) = bs_blob::plan_download(listing, &server, "study/", &out);
    assert!(problems.is_empty(), "{problems:?}");
    // A transfer first, so that connections are kept to send requests ahead on.
    let client = t.factory().client(&server).unwrap();
    let mut p = client.open_pull("study/i00", 0, None).unwrap();
    p.read_exact_to_end(&mut vec![0u8; p.len() as usize]).unwrap();
    drop(p);
    let last = Mutex::new(None);
    let report = t.copy_batch(jobs, 4, &Options::blocking().resume(true), |p| {
        *last.lock().unwrap() = Some(p);
    });
    let last = last.into_inner().unwrap().expect("progress was reported");
    assert_eq!((last.jobs_done, last.jobs), (44, 44));
    assert!(last.bytes_done >= last.bytes, "{last:?}");

    let outcome = |name: &str| {
        let o = report.outcomes.iter().find(|o| o.name == name).unwrap();
        o.result.as_ref()
    };
    for i in 0..40 {
        let (name, file) = (format!("study/i{i:02}"), out.join(format!("i{i:02}")));
        let c = outcome(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = std::fs::read(&file).unwrap_or_else(|e| panic!("{name} ({c:?}): {e}"));
        assert_eq!(got, small(i), "{name}");
        match i {
            3 => assert_eq!(c.path, CopyPath::AlreadyThere),
            4 => assert_eq!(c.path, CopyPath::Relay, "other bytes: replaced the usual way"),
            5 => assert_eq!((c.resumed_from, c.bytes), (2000, small(5).len() as u64 - 2000)),
            _ => assert_eq!((c.path, c.bytes), (CopyPath::PulledAhead, small(i).len() as u64)),
        }
        assert!(!bs_blob::part_path(&file).exists(), "{name}");
    }
    assert_eq!(std::fs::read(out.join("big")).unwrap(), big);
    assert_ne!(outcome("study/big").unwrap().path, CopyPath::PulledAhead);
    let e = outcome("study/i15x").unwrap_err();
    assert!(e.is_integrity(), "{e:?}");
    assert!(!out.join("i15x").exists() && !bs_blob::part_path(&out.join("i15x")).exists());
    assert_eq!(std::fs::read(out.join("grown")).unwrap(), grown);
    assert_ne!(outcome("study/grown").unwrap().path, CopyPath::PulledAhead);
    let e = outcome("study/gone").unwrap_err();
    assert!(matches!(e, BlobError::NotFound(_)) && e.to_string().contains("study/gone"), "{e}");
    assert!(!out.join("gone").exists());
    assert_eq!(report.failed().count(), 2);

    // Again: every file is already there, nothing moves.
    let listing: Vec<(String, u64)> =
        store.list("study/", "", 1000).unwrap().into_iter().map(|r| (r.name, r.size)).collect();
    let (jobs, _) = bs_blob::plan_download(listing, &server, "study/", &out);
    let again = t.copy_batch(jobs, 4, &Options::blocking(), |_| {});
    assert_eq!(again.already_there(), 42, "{:?}", again.failed().collect::<Vec<_>>());
    assert_eq!(again.failed().count(), 1, "the rotten one still fails");
}

/// A download over an existing file keeps the file's permission bits, as cp(1) does (a
/// private file stays private), and its part file has them from the first byte; a new file
/// gets the usual ones.
#[test]
fn a_replaced_file_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let w = world();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let private = w.root.join("private.txt");
    std::fs::write(&private, b"old").unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let bytes = data(3 << 20);
    let spec = NewBlob { size: Some(bytes.len() as u64), overwrite: true, ..Default::default() };
    let mut p = w.t.factory().route(&BlobKey::file(&private), &spec).unwrap();
    p.write(&bytes[..1 << 20]).unwrap();
    assert_eq!(mode(&bs_blob::part_path(&private)), 0o600, "the part file, while it fills");
    p.write(&bytes[1 << 20..]).unwrap();
    p.close().unwrap();
    assert_eq!(std::fs::read(&private).unwrap(), bytes);
    assert_eq!(mode(&private), 0o600);
    // A group-readable script stays executable and group-readable.
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o750)).unwrap();
    let mut p = w.t.factory().route(&BlobKey::file(&private), &spec).unwrap();
    p.write(&bytes).unwrap();
    p.close().unwrap();
    assert_eq!(mode(&private), 0o750);
    // A new file: the process's usual mode (0666 less the umask), not a copied one.
    let fresh = w.root.join("fresh.txt");
    w.write(&BlobKey::file(&fresh), b"new");
    // SAFETY: umask only swaps the process's mask; it is put back at once.
    let umask = unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    };
    assert_eq!(mode(&fresh), 0o666 & !umask);
}

/// A server that cannot be reached stops a batch: the copy that found it gone fails, no more
/// start (each would fail alike), and the report says why; running again finds what is left.
#[test]
fn an_unreachable_server_stops_a_batch_instead_of_failing_every_file() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..20 {
        std::fs::write(dir.path().join(format!("f{i:02}")), data(1000 + i)).unwrap();
    }
    // Port 1 (tcpmux): privileged, and nothing of these tests listens there, so a connection
    // is refused at once (a port bound and let go could be given to another test's server).
    let gone = "127.0.0.1:1".to_string();
    let (jobs, problems) = bs_blob::plan_upload(dir.path(), &gone, "up/");
    assert!(problems.is_empty() && jobs.len() == 20, "{problems:?}");
    let t = Transporter::new(Factory::new());
    let report = t.copy_batch(jobs, 1, &Options::blocking(), |_| {});
    assert_eq!(report.failed().count(), 1, "only the copy that found it gone fails");
    assert_eq!(report.not_started(), 19);
    let (name, e) = report.failed().next().unwrap();
    assert!(e.is_unreachable(), "{e:?}");
    let why = report.gave_up.as_deref().expect("the report says why it stopped");
    assert!(why.starts_with(name) && why.contains(&gone), "{why}");
}
