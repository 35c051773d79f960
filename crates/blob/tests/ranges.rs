//! One blob pulled over several connections at once (`Options::connections`), against a real
//! server on port 0: the bytes arrive whole, a connection cut mid-range is continued on a new
//! one, a connection done early takes over half of a slower one's rest (pulls and pushes),
//! and an interrupted copy resumes only the ranges whose bytes check out. Pushes run against
//! a filesystem store and against an S3 one (a real Garage server), whose range writers
//! assemble the parts of one multipart upload.

use std::os::fd::RawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bs_blob::ranges::ranges_path;
use bs_blob::{BlobKey, CopyPath, Factory, NewBlob, Options, Transporter, part_path};
use bs_client::TransferSettings;
use bs_server::{BackgroundServer, ServerConfig};
use bs_store::{FsStore, ObjStore, S3Config, Store};

const MIB: u64 = 1 << 20;

fn data(n: u64) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[1]).collect()
}

struct World {
    dir: tempfile::TempDir,
    server: BackgroundServer,
    /// The server's store, when it is a filesystem one.
    fs: Option<FsStore>,
}

fn world_with(name: &str, bytes: &[u8]) -> World {
    let dir = tempfile::tempdir().unwrap();
    let fs = FsStore::open(dir.path().join("store")).unwrap();
    world_on(dir, Arc::new(fs.clone()), Some(fs), name, bytes)
}

/// A server whose blobs live in S3: a key prefix of its own in a real Garage server's
/// bucket, the catalogue in memory.
fn s3_world() -> World {
    static GARAGE: OnceLock<bs_peers::Garage> = OnceLock::new();
    let e = GARAGE.get_or_init(|| bs_peers::Garage::start("ranges").unwrap()).endpoint();
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().file_name().unwrap().to_string_lossy().replace('.', "-");
    let cfg = S3Config {
        endpoint: Some(e.url.clone()),
        region: e.region.clone(),
        bucket: e.bucket.clone(),
        prefix,
        access_key_id: e.key_id.clone(),
        secret_access_key: e.secret.clone(),
        timeout: None,
    };
    let s3 = ObjStore::open_s3(&cfg, bs_meta::Catalogue::open_in_memory().unwrap()).unwrap();
    world_on(dir, Arc::new(s3), None, "unrelated", b"x")
}

fn world_on(
    dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    fs: Option<FsStore>,
    name: &str,
    bytes: &[u8],
) -> World {
    let server = BackgroundServer::start(store, ServerConfig::ephemeral()).unwrap();
    let t = Transporter::new(Factory::new());
    let key = BlobKey::remote(server.control_addr().to_string(), name);
    let spec = NewBlob { size: Some(bytes.len() as u64), ..Default::default() };
    let mut p = t.factory().route(&key, &spec).unwrap();
    p.write(bytes).unwrap();
    p.close().unwrap();
    World { dir, server, fs }
}

impl World {
    fn remote(&self, name: &str) -> BlobKey {
        BlobKey::remote(self.server.control_addr().to_string(), name)
    }

    /// The server's filesystem store.
    fn fs(&self) -> &FsStore {
        self.fs.as_ref().expect("a server on a filesystem store")
    }
}

/// A transporter whose copies are paced at `bytes_per_s` (shared by a copy's connections).
fn paced(bytes_per_s: u64) -> Transporter {
    let settings = TransferSettings {
        layers: vec![format!("pace:{bytes_per_s}").parse::<bs_binding::LayerSpec>().unwrap()],
        ..TransferSettings::default()
    };
    Transporter::new(Factory::with_settings(settings))
}

/// The digest the server stores with blob `name`.
fn stored_digest(w: &World, name: &str) -> String {
    let t = Transporter::new(Factory::new());
    t.factory().bind(&w.remote(name)).unwrap().digest().unwrap().to_string()
}

/// The upload `name` of `size` bytes routed (with `resume_tag`: as a put of the file with
/// that tag routes it), and a client to push ranges into it by hand.
fn routed(w: &World, name: &str, size: u64, resume_tag: String) -> bs_client::Client {
    let c = bs_client::Client::connect(&w.server.control_addr().to_string()).unwrap();
    c.route(bs_client::RouteRequest {
        name: name.into(),
        size: Some(size),
        resume_tag,
        ..Default::default()
    })
    .unwrap();
    c
}

fn assert_nothing_left(dest: &Path) {
    assert!(!part_path(dest).exists(), "part file left");
    assert!(!ranges_path(dest).exists(), "ranges file left");
}

#[test]
fn four_connections_deliver_the_whole_blob() {
    let bytes = data(10 * MIB + 12_345);
    let w = world_with("scan", &bytes);
    let dest = w.dir.path().join("scan.bin");
    let t = Transporter::new(Factory::new());
    let c = t
        .copy(&w.remote("scan"), &BlobKey::file(&dest), &Options::blocking().connections(4))
        .wait()
        .unwrap();
    assert_eq!(c.path, CopyPath::Parallel { connections: 4, reconnects: 0, splits: 0 });
    assert_eq!((c.bytes, c.resumed_from), (bytes.len() as u64, 0));
    assert!(std::fs::read(&dest).unwrap() == bytes, "bytes differ");
    assert_nothing_left(&dest);
}

#[test]
fn a_server_with_one_transfer_slot_serves_four_connections_whole() {
    // Four connections, one slot: each connection's next pieces, asked ahead, meet a server
    // busy with another connection's piece whenever that one wins the slot, and are turned
    // away; the connection then asks again the usual way, which waits for the slot. However
    // the four interleave, the copy ends whole and checked, without a failure counted.
    let dir = tempfile::tempdir().unwrap();
    let fs = FsStore::open(dir.path().join("store")).unwrap();
    let config = ServerConfig { max_connections: 1, ..ServerConfig::ephemeral() };
    let server = BackgroundServer::start(Arc::new(fs.clone()), config).unwrap();
    let bytes = data(40 * MIB + 3);
    let t = Transporter::new(Factory::new());
    let key = BlobKey::remote(server.control_addr().to_string(), "busy");
    let spec = NewBlob { size: Some(bytes.len() as u64), ..Default::default() };
    let mut p = t.factory().route(&key, &spec).unwrap();
    p.write(&bytes).unwrap();
    p.close().unwrap();
    let dest = dir.path().join("busy.bin");
    let c = t.copy(&key, &BlobKey::file(&dest), &Options::blocking().connections(4)).wait();
    let c = c.unwrap();
    assert!(
        matches!(c.path, CopyPath::Parallel { connections: 4, reconnects: 0, .. }),
        "{:?}",
        c.path
    );
    assert!(std::fs::read(&dest).unwrap() == bytes, "bytes differ");
    assert_nothing_left(&dest);
}

/// This process's TCP sockets whose peer is `port` on loopback.
fn sockets_to(port: u16) -> Vec<RawFd> {
    let mut fds = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = e.file_name().to_string_lossy().parse::<RawFd>() else { continue };
        // SAFETY: a zeroed sockaddr_storage and its length are valid arguments; a descriptor
        // that is not a connected socket only makes the call fail.
        let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let ok = unsafe { libc::getpeername(fd, (&raw mut addr).cast(), &mut len) } == 0;
        if ok && addr.ss_family as i32 == libc::AF_INET {
            // SAFETY: the family says this is a sockaddr_in.
            let sin: libc::sockaddr_in = unsafe { std::ptr::read((&raw const addr).cast()) };
            if u16::from_be(sin.sin_port) == port {
                fds.push(fd);
            }
        }
    }
    fds
}

/// Cuts one of the 4 data connections to a port with `shutdown(2)` (its reader or writer sees
/// the connection end, as when a peer or a router drops it) the first moment all 4 are open
/// once bytes flow (`flowing`, set from the copy's progress reports: a connection cut before
/// its range began is simply opened again, not continued), watching from a thread of its own
/// for as long as the copy runs.
///
/// It used to cut from the progress callback itself, which comes only every few MiB: on a
/// loaded machine (the test command's other suites running) no report came while exactly 4
/// were open, and no connection was cut.
struct Cutter {
    flowing: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    watcher: std::thread::JoinHandle<usize>,
}

impl Cutter {
    fn start(port: u16) -> Self {
        let (flowing, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (started, stop) = (flowing.clone(), done.clone());
        let watcher = std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let fds = if started.load(Ordering::Acquire) { sockets_to(port) } else { vec![] };
                if let [fd, _, _, _] = fds[..] {
                    // SAFETY: shutting down a socket this process owns.
                    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
                    return fds.len();
                }
                // A short pause between looks at /proc (a poll, not a wait for a time).
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            0
        });
        Cutter { flowing, done, watcher }
    }

    /// Options for a copy over 4 connections whose progress reports tell the cutter when bytes
    /// flow.
    fn options(&self) -> Options {
        let flowing = self.flowing.clone();
        Options::blocking().connections(4).progress(move |done, _| {
            if done > 0 {
                flowing.store(true, Ordering::Release);
            }
        })
    }

    /// How many data connections there were when one was cut (0: none was), once the copy
    /// has ended.
    fn finish(self) -> usize {
        self.done.store(true, Ordering::Release);
        self.watcher.join().unwrap()
    }
}

/// A transporter paced so each of 4 ranges of 12 MiB takes about 3 s (all four in flight at
/// once for seconds, even on a loaded machine where one starts late), the options of a copy
/// over 4 connections, and a [`Cutter`] watching the data connections to `port`.
fn paced_with_one_cut(port: u16) -> (Transporter, Options, Cutter) {
    let cutter = Cutter::start(port);
    (paced(4_000_000), cutter.options(), cutter)
}

#[test]
fn a_range_whose_connection_is_cut_continues_on_a_new_one() {
    let bytes = data(12 * MIB);
    let w = world_with("cine", &bytes);
    let dest = w.dir.path().join("cine.bin");
    let (t, opts, cut) = paced_with_one_cut(w.server.data_addr().port());
    let c = t.copy(&w.remote("cine"), &BlobKey::file(&dest), &opts).wait().unwrap();
    assert_eq!(cut.finish(), 4, "one of the 4 range connections was cut");
    assert_eq!(c.path, CopyPath::Parallel { connections: 4, reconnects: 1, splits: 0 });
    assert!(std::fs::read(&dest).unwrap() == bytes, "bytes differ");
    assert_nothing_left(&dest);
}

#[test]
fn a_resumed_copy_keeps_only_ranges_that_check_out() {
    resumed_copy_keeps_only_ranges_that_check_out(4);
    // Copied again with one connection (the automatic choice for a near server): the ranges
    // recorded are still taken, not thrown away with the part file.
    resumed_copy_keeps_only_ranges_that_check_out(0);
}

fn resumed_copy_keeps_only_ranges_that_check_out(connections: usize) {
    // 13 chunks in 4 ranges: 4, 4 and 4 MiB, and the last 100 bytes.
    let bytes = data(12 * MIB + 100);
    let w = world_with("study", &bytes);
    let dest = w.dir.path().join("study.bin");
    let size = bytes.len() as u64;
    // What an interrupted copy left: range 1 whole, half of range 2, and in range 3 a
    // megabyte said to be done that is not the blob's.
    let mut part = vec![0u8; size as usize];
    let (r1, r2, r3) = (0..4 * MIB, 4 * MIB..6 * MIB, 8 * MIB..9 * MIB);
    for r in [&r1, &r2] {
        part[r.start as usize..r.end as usize]
            .copy_from_slice(&bytes[r.start as usize..r.end as usize]);
    }
    part[r3.start as usize..r3.end as usize].fill(0xAB);
    std::fs::write(part_path(&dest), &part).unwrap();
    let digest = stored_digest(&w, "study");
    let ranges = format!(
        "blobstream-ranges 1 {digest} {size}\n0 {a} {a}\n{a} {b} {h}\n{b} {c} {m}\n{c} {size} 0\n",
        a = 4 * MIB,
        b = 8 * MIB,
        c = 12 * MIB,
        h = 2 * MIB,
        m = MIB,
    );
    std::fs::write(ranges_path(&dest), ranges).unwrap();
    let t = Transporter::new(Factory::new());
    let opts = Options::blocking().connections(connections).resume(true);
    let c = t.copy(&w.remote("study"), &BlobKey::file(&dest), &opts).wait().unwrap();
    assert!(matches!(c.path, CopyPath::Parallel { .. }), "{:?}", c.path);
    assert_eq!(c.resumed_from, 6 * MIB, "range 1 and half of range 2 kept, range 3 redone");
    assert_eq!(c.bytes, size - 6 * MIB);
    assert!(std::fs::read(&dest).unwrap() == bytes, "bytes differ");
    assert_nothing_left(&dest);
}

#[test]
fn a_connection_done_early_takes_over_half_of_a_slower_ones_rest() {
    // Two ranges recorded by an interrupted copy: the first whole, the second untouched.
    // The first's connection is done once its bytes check out; the second's, paced, has
    // most of its 32 MiB left, and gives the second half of it to the first.
    let bytes = data(48 * MIB);
    let w = world_with("slide", &bytes);
    let dest = w.dir.path().join("slide.bin");
    let size = bytes.len() as u64;
    let mut part = vec![0u8; size as usize];
    part[..(16 * MIB) as usize].copy_from_slice(&bytes[..(16 * MIB) as usize]);
    std::fs::write(part_path(&dest), &part).unwrap();
    let digest = stored_digest(&w, "slide");
    let a = 16 * MIB;
    std::fs::write(
        ranges_path(&dest),
        format!("blobstream-ranges 1 {digest} {size}\n0 {a} {a}\n{a} {size} 0\n"),
    )
    .unwrap();
    let t = paced(16_000_000);
    let opts = Options::blocking().connections(2).resume(true);
    let c = t.copy(&w.remote("slide"), &BlobKey::file(&dest), &opts).wait().unwrap();
    // At least the one split; more as each runs out of work while the other has 4 MiB or
    // more it has not asked for yet.
    assert!(
        matches!(c.path, CopyPath::Parallel { connections: 2, reconnects: 0, splits: 1.. }),
        "{:?}",
        c.path
    );
    assert_eq!((c.resumed_from, c.bytes), (16 * MIB, 32 * MIB));
    assert!(std::fs::read(&dest).unwrap() == bytes, "bytes differ");
    assert_nothing_left(&dest);
}

#[test]
fn a_small_blob_gets_one_connection_unless_more_are_asked() {
    let bytes = data(3 * MIB);
    let w = world_with("small", &bytes);
    let dest = w.dir.path().join("small.bin");
    let t = Transporter::new(Factory::new());
    let c = t.copy(&w.remote("small"), &BlobKey::file(&dest), &Options::blocking()).wait();
    assert_eq!(c.unwrap().path, CopyPath::Relay, "automatic choice: one connection");
    let dest = w.dir.path().join("small-again.bin");
    let c = t
        .copy(&w.remote("small"), &BlobKey::file(&dest), &Options::blocking().connections(8))
        .wait()
        .unwrap();
    assert_eq!(
        c.path,
        CopyPath::Parallel { connections: 3, reconnects: 0, splits: 0 },
        "one per chunk"
    );
    assert!(std::fs::read(&dest).unwrap() == bytes, "bytes differ");
}

fn pushed(w: &World, name: &str, bytes: &[u8]) {
    let got = Transporter::new(Factory::new()).factory().bind(&w.remote(name)).unwrap();
    assert_eq!(got.size(), bytes.len() as u64);
    let back = w.dir.path().join(format!("{}.back", name.replace('/', "_")));
    let t = Transporter::new(Factory::new());
    t.copy(&w.remote(name), &BlobKey::file(&back), &Options::blocking()).wait().unwrap();
    assert!(std::fs::read(&back).unwrap() == bytes, "the blob's bytes differ from the file's");
    std::fs::remove_file(&back).unwrap();
}

/// Put `bytes`, as the file `up.bin`, into `name` over `connections` connections (checked to
/// be used, none cut; a connection done early may take over half of another's rest).
fn put_file(w: &World, name: &str, bytes: &[u8], connections: usize, overwrite: bool) {
    let src = w.dir.path().join("up.bin");
    std::fs::write(&src, bytes).unwrap();
    let t = Transporter::new(Factory::new());
    let opts = Options::blocking().connections(connections).overwrite(overwrite);
    let c = t.copy(&BlobKey::file(&src), &w.remote(name), &opts).wait().unwrap();
    assert!(
        matches!(c.path, CopyPath::Parallel { connections: k, reconnects: 0, .. }
            if k == connections),
        "{:?}",
        c.path
    );
    assert_eq!((c.bytes, c.resumed_from), (bytes.len() as u64, 0));
}

#[test]
fn four_connections_push_the_whole_file_as_one_blob() {
    let w = world_with("unrelated", b"x");
    let bytes = data(9 * MIB + 777);
    put_file(&w, "up/scan", &bytes, 4, false);
    // Every chunk was vouched for by the range writer that wrote it: nothing read back.
    assert_eq!(w.fs().commit_read_back(), 0);
    pushed(&w, "up/scan", &bytes);
}

/// Into S3: 40 MiB and a bit in 4 ranges of about 10 MiB, none on a part boundary, go up as
/// the 6 parts of one multipart upload (those where two ranges meet assembled from both).
#[test]
fn four_connections_push_a_file_into_s3_as_one_blob() {
    let w = s3_world();
    let bytes = data(40 * MIB + 777);
    put_file(&w, "up/scan", &bytes, 4, false);
    pushed(&w, "up/scan", &bytes);
    // Put again over it, by 2 connections: the blob is replaced whole.
    let other = data(17 * MIB + 5).into_iter().map(|b| b ^ 0x5A).collect::<Vec<u8>>();
    put_file(&w, "up/scan", &other, 2, true);
    pushed(&w, "up/scan", &other);
}

/// A range push names the upload its put's route answered: once another put of the name
/// routed it again (the same size, so only the id tells them apart), the range is refused at
/// once (`NotFound`: that upload is gone), never written into the other put's upload.
#[test]
fn a_range_into_an_upload_another_put_routed_again_is_refused() {
    let w = world_with("unrelated", b"x");
    let bytes = data(2 * MIB);
    let size = bytes.len() as u64;
    let c = bs_client::Client::connect(&w.server.control_addr().to_string()).unwrap();
    let route = |who: &str| {
        let metadata = [("who".to_string(), who.to_string())].into();
        let r = bs_client::RouteRequest {
            name: "up/raced".into(),
            size: Some(size),
            metadata,
            ..Default::default()
        };
        c.route(r).unwrap().upload_id
    };
    let (mine, theirs) = (route("me"), route("them"));
    assert_ne!(mine, theirs);
    let Err(e) = c.open_push_range("up/raced", &mine, 0, MIB) else {
        panic!("a range admitted into the other put's upload");
    };
    let gone = |m: &str| m.contains("routed it again");
    assert!(
        matches!(&e, bs_client::ClientError::Transfer(bs_transport::TransportError::Remote {
            code: bs_wire::ErrorCode::NotFound,
            message
        }) if gone(message)),
        "{e}"
    );
    for (start, end) in [(0, MIB), (MIB, size)] {
        let mut p = c.open_push_range("up/raced", &theirs, start, end - start).unwrap();
        p.write(&bytes[start as usize..end as usize]).unwrap();
        p.finish(false).unwrap();
    }
    let algo = bs_wire::DigestAlgo::default();
    c.commit("up/raced", &algo.digest(&bytes), Some(&bs_wire::ChunkDigests::of(&bytes))).unwrap();
    pushed(&w, "up/raced", &bytes);
    assert_eq!(c.stat("up/raced").unwrap().metadata["who"], "them");
}

#[test]
fn a_commit_checks_every_chunk_reading_back_only_those_no_range_writer_saw_whole() {
    let w = world_with("unrelated", b"x");
    let bytes = data(3 * MIB + 10);
    let size = bytes.len() as u64;
    let c = routed(&w, "up/split", size, String::new());
    // Two ranges meeting in the middle of chunk 1: neither writer saw all of it.
    let half = MIB + MIB / 2;
    for (start, end) in [(half, size), (0, half)] {
        let mut p = c.open_push_range("up/split", "", start, end - start).unwrap();
        p.write(&bytes[start as usize..end as usize]).unwrap();
        p.finish(false).unwrap();
    }
    let algo = bs_wire::DigestAlgo::default();
    let whole = algo.digest(&bytes);
    // The right whole digest with chunk digests of other bytes: refused, nothing committed.
    let mut other = bytes.clone();
    other[2 * MIB as usize + 3] ^= 1;
    let wrong = bs_wire::ChunkDigests::of(&other);
    let e = c.commit("up/split", &whole, Some(&wrong)).unwrap_err();
    assert!(matches!(e, bs_client::ClientError::Corrupt(_)), "{e}");
    assert!(e.to_string().contains("chunk 2"), "{e}");
    assert!(matches!(c.stat("up/split"), Err(bs_client::ClientError::NotFound(_))));
    // Chunk digests of another size do not fit the upload.
    let short = bs_wire::ChunkDigests::of(&bytes[..MIB as usize]);
    let e = c.commit("up/split", &whole, Some(&short)).unwrap_err();
    assert!(matches!(e, bs_client::ClientError::Corrupt(_)), "{e}");
    // The first attempt read chunk 1 back (the second did not fit before any read); the
    // writers' records outlive failed attempts, so the right chunks commit reading back
    // chunk 1 alone.
    let before = w.fs().commit_read_back();
    assert_eq!(before, MIB);
    let info = c.commit("up/split", &whole, Some(&bs_wire::ChunkDigests::of(&bytes))).unwrap();
    assert_eq!(info.digest, whole.to_string());
    assert_eq!(w.fs().commit_read_back() - before, MIB);
    // Without chunk digests the whole upload is read back.
    c.route(bs_client::RouteRequest {
        name: "up/whole".into(),
        size: Some(size),
        ..Default::default()
    })
    .unwrap();
    let mut p = c.open_push_range("up/whole", "", 0, size).unwrap();
    p.write(&bytes).unwrap();
    p.finish(false).unwrap();
    let before = w.fs().commit_read_back();
    c.commit("up/whole", &whole, None).unwrap();
    assert_eq!(w.fs().commit_read_back() - before, size);
    pushed(&w, "up/whole", &bytes);

    // A sender whose digest of the whole is not that of its chunks' bytes (a broken client):
    // the server keeps the digest it was given, but no reader gets the bytes with success,
    // and the scrubber marks the blob.
    c.route(bs_client::RouteRequest {
        name: "up/liar".into(),
        size: Some(size),
        ..Default::default()
    })
    .unwrap();
    let mut p = c.open_push_range("up/liar", "", 0, size).unwrap();
    p.write(&bytes).unwrap();
    p.finish(false).unwrap();
    let lie = algo.digest(b"not these bytes");
    c.commit("up/liar", &lie, Some(&bs_wire::ChunkDigests::of(&bytes))).unwrap();
    let back = w.dir.path().join("liar.back");
    let t = Transporter::new(Factory::new());
    let e = t.copy(&w.remote("up/liar"), &BlobKey::file(&back), &Options::blocking()).wait();
    assert!(e.is_err_and(|e| e.is_integrity()), "a pull of the blob fails its check");
    assert!(!back.exists());
    let e = w.fs().scrub_blob("up/liar", &mut |_| true).unwrap_err();
    assert!(matches!(e, bs_store::StoreError::Corrupt { .. }), "{e}");
    assert!(matches!(w.fs().open_read("up/liar"), Err(bs_store::StoreError::Corrupt { .. })));
    pushed(&w, "up/split", &bytes);

    // Pushed again the same way: only chunk 1 is read back.
    c.route(bs_client::RouteRequest {
        name: "up/split2".into(),
        size: Some(size),
        ..Default::default()
    })
    .unwrap();
    for (start, end) in [(0, half), (half, size)] {
        let mut p = c.open_push_range("up/split2", "", start, end - start).unwrap();
        p.write(&bytes[start as usize..end as usize]).unwrap();
        p.finish(false).unwrap();
    }
    let before = w.fs().commit_read_back();
    c.commit("up/split2", &whole, Some(&bs_wire::ChunkDigests::of(&bytes))).unwrap();
    assert_eq!(w.fs().commit_read_back() - before, MIB);
    pushed(&w, "up/split2", &bytes);
}

#[test]
fn a_push_range_whose_connection_is_cut_is_pushed_again() {
    push_range_cut_and_pushed_again(&world_with("unrelated", b"x"));
}

/// On S3 the 3 MiB ranges meet inside the upload's 8 MiB parts, which take bytes from two
/// writers, one of them writing its part again after the cut.
#[test]
fn a_push_range_whose_connection_is_cut_is_pushed_again_into_s3() {
    push_range_cut_and_pushed_again(&s3_world());
}

fn push_range_cut_and_pushed_again(w: &World) {
    let bytes = data(12 * MIB);
    let src = w.dir.path().join("cine.bin");
    std::fs::write(&src, &bytes).unwrap();
    let (t, opts, cut) = paced_with_one_cut(w.server.data_addr().port());
    let c = t.copy(&BlobKey::file(&src), &w.remote("up/cine"), &opts).wait().unwrap();
    assert_eq!(cut.finish(), 4, "one of the 4 range connections was cut");
    assert_eq!(c.path, CopyPath::Parallel { connections: 4, reconnects: 1, splits: 0 });
    pushed(w, "up/cine", &bytes);
}

#[test]
fn ranges_committed_with_a_wrong_digest_leave_no_blob() {
    let w = world_with("unrelated", b"x");
    let bytes = data(2 * MIB);
    let c = routed(&w, "up/bad", bytes.len() as u64, String::new());
    for (start, end) in [(MIB, 2 * MIB), (0, MIB)] {
        let mut p = c.open_push_range("up/bad", "", start, end - start).unwrap();
        p.write(&bytes[start as usize..end as usize]).unwrap();
        assert_eq!(p.finish(false).unwrap().received, end);
    }
    let wrong = bs_wire::DigestAlgo::default().digest(b"other bytes");
    let e = c.commit("up/bad", &wrong, None).unwrap_err();
    assert!(matches!(e, bs_client::ClientError::Corrupt(_)), "{e}");
    assert!(matches!(c.stat("up/bad"), Err(bs_client::ClientError::NotFound(_))));
    // In an algorithm other than the store's the bytes are read back all the same.
    assert_ne!(bs_wire::DigestAlgo::default(), bs_wire::DigestAlgo::Blake3);
    let wrong = bs_wire::DigestAlgo::Blake3.digest(b"other bytes");
    let e = c.commit("up/bad", &wrong, None).unwrap_err();
    assert!(matches!(e, bs_client::ClientError::Corrupt(_)), "{e}");
    assert!(matches!(c.stat("up/bad"), Err(bs_client::ClientError::NotFound(_))));
    // The right digest commits the same upload.
    let right = bs_wire::DigestAlgo::Blake3.digest(&bytes);
    assert_eq!(c.commit("up/bad", &right, None).unwrap().size, bytes.len() as u64);
    // A range push cannot commit by itself (of a blob larger than one kept whole in its
    // catalogue row, which takes no range pushes).
    let n = bs_store::INLINE_UP_TO + 10;
    c.route(bs_client::RouteRequest {
        name: "up/final".into(),
        size: Some(n),
        ..Default::default()
    })
    .unwrap();
    let mut p = c.open_push_range("up/final", "", 0, n).unwrap();
    p.write(&vec![1; n as usize]).unwrap();
    assert!(p.finish(true).is_err(), "FINAL on a range push is refused");
}

/// A server on a memory store.
fn mem_world() -> World {
    let dir = tempfile::tempdir().unwrap();
    world_on(dir, Arc::new(bs_store::MemStore::new()), None, "unrelated", b"x")
}

/// Into the memory store: the ranges share the upload's buffer, and the commit reads it
/// back once against the file's digest.
#[test]
fn four_connections_push_a_file_into_memory_as_one_blob() {
    let w = mem_world();
    let bytes = data(9 * MIB + 777);
    put_file(&w, "up/scan", &bytes, 4, false);
    pushed(&w, "up/scan", &bytes);
}

#[test]
fn a_push_range_whose_connection_is_cut_is_pushed_again_into_memory() {
    push_range_cut_and_pushed_again(&mem_world());
}

/// A store that takes one writer per upload (the fault-injecting wrapper takes no range
/// writers) gets the put over one connection.
#[test]
fn a_store_with_one_writer_per_upload_takes_the_push_over_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let one = bs_store::FaultyStore::disk_full_after(bs_store::MemStore::new(), u64::MAX);
    let server = BackgroundServer::start(Arc::new(one), ServerConfig::ephemeral()).unwrap();
    let bytes = data(5 * MIB);
    let src = dir.path().join("f.bin");
    std::fs::write(&src, &bytes).unwrap();
    let t = Transporter::new(Factory::new());
    let dst = BlobKey::remote(server.control_addr().to_string(), "mem/f");
    let c = t.copy(&BlobKey::file(&src), &dst, &Options::blocking().connections(4)).wait();
    assert_eq!(c.unwrap().path, CopyPath::Slice, "one connection");
    assert_eq!(t.factory().bind(&dst).unwrap().size(), bytes.len() as u64);
}

/// What an interrupted parallel push left — range 1 whole, the first half of range 2, range
/// 3 with its first megabyte wrong, nothing of range 4 — is resumed range by range: range 1
/// and half of range 2 are kept, the rest is pushed, and the blob is whole. Without
/// `resume`, every range is pushed.
#[test]
fn a_push_connection_done_early_takes_over_half_of_a_slower_ones_rest() {
    // An interrupted push left the first of two ranges whole in the upload. Resumed, the
    // first's connection is done once its pieces check out; the second's, paced, has most of
    // its 24 MiB left, and gives the second half of it to the first.
    let w = world_with("unrelated", b"x");
    let bytes = data(48 * MIB);
    let size = bytes.len() as u64;
    let src = w.dir.path().join("split.bin");
    std::fs::write(&src, &bytes).unwrap();
    let t = paced(8_000_000);
    let key = BlobKey::file(&src);
    let c = routed(&w, "up/split", size, t.resume_tag_of(&key).unwrap());
    let mut p = c.open_push_range("up/split", "", 0, 24 * MIB).unwrap();
    p.write(&bytes[..(24 * MIB) as usize]).unwrap();
    p.finish(false).unwrap();
    let opts = Options::blocking().connections(2).resume(true);
    let done = t.copy(&key, &w.remote("up/split"), &opts).wait().unwrap();
    // At least the one split (more as each runs out of work while the other has 4 MiB left).
    assert!(
        matches!(done.path, CopyPath::Parallel { connections: 2, reconnects: 0, splits: 1.. }),
        "{:?}",
        done.path
    );
    assert_eq!((done.resumed_from, done.bytes), (24 * MIB, 24 * MIB));
    pushed(&w, "up/split", &bytes);
}

#[test]
fn an_interrupted_parallel_push_resumes_only_the_ranges_that_check_out() {
    interrupted_push_resumes_what_checks_out(&world_with("unrelated", b"x"));
}

/// On S3 what the interrupted push left is in parts not yet full (held in memory until
/// they are): the pieces held whole are told, the rest pushed, and the commit completes
/// one multipart upload.
#[test]
fn an_interrupted_parallel_push_into_s3_resumes_only_the_ranges_that_check_out() {
    interrupted_push_resumes_what_checks_out(&s3_world());
}

/// On S3, a resumed push that writes again into a part already sent makes the store forget
/// that part, bytes a range kept included: the commit finds them missing, and the client
/// pushes what each range misses once more before committing again.
#[test]
fn a_resumed_push_into_s3_writing_a_sent_part_again_pushes_what_the_commit_misses() {
    let w = s3_world();
    let bytes = data(12 * MIB);
    let size = bytes.len() as u64;
    let src = w.dir.path().join("again.bin");
    std::fs::write(&src, &bytes).unwrap();
    let t = Transporter::new(Factory::new());
    let key = BlobKey::file(&src);
    let c = routed(&w, "up/again", size, t.resume_tag_of(&key).unwrap());
    // The first part (8 MiB) sent whole, its third megabyte wrong.
    let mut first = bytes[..8 << 20].to_vec();
    first[(2 << 20) + 7] ^= 0xFF;
    let mut p = c.open_push_range("up/again", "", 0, 8 * MIB).unwrap();
    p.write(&first).unwrap();
    p.finish(false).unwrap();
    // Resumed over 2 ranges of 6 MiB: the first keeps its first 2 MiB and writes the part
    // again from its wrong megabyte, which forgets those 2 MiB.
    let opts = Options::blocking().connections(2).resume(true);
    let done = t.copy(&key, &w.remote("up/again"), &opts).wait().unwrap();
    assert!(
        matches!(done.path, CopyPath::Parallel { connections: 2, reconnects: 0, .. }),
        "{:?}",
        done.path
    );
    assert!(done.resumed_from >= 2 * MIB, "{done:?}");
    pushed(&w, "up/again", &bytes);
}

fn interrupted_push_resumes_what_checks_out(w: &World) {
    // 13 chunks in 4 ranges: 4, 4 and 4 MiB, and the last 100 bytes.
    let bytes = data(12 * MIB + 100);
    let size = bytes.len() as u64;
    let src = w.dir.path().join("resume.bin");
    std::fs::write(&src, &bytes).unwrap();
    let t = Transporter::new(Factory::new());
    let key = BlobKey::file(&src);
    let c = routed(w, "up/resumed", size, t.resume_tag_of(&key).unwrap());
    let push = |start: u64, part: &[u8]| {
        let mut p = c.open_push_range("up/resumed", "", start, part.len() as u64).unwrap();
        p.write(part).unwrap();
        p.finish(false).unwrap();
    };
    let at = |a: u64, b: u64| &bytes[a as usize..b as usize];
    push(0, at(0, 4 * MIB));
    push(4 * MIB, at(4 * MIB, 6 * MIB));
    push(8 * MIB, &vec![0xAB; MIB as usize]);
    push(9 * MIB, at(9 * MIB, 12 * MIB));
    // Pieces are at least 64 KiB (the answer stays bounded).
    let tiny = c.upload_piece_digests("up/resumed", 0, size, 1, bs_wire::DigestAlgo::default());
    assert!(matches!(tiny, Err(bs_client::ClientError::InvalidArgument(_))), "{tiny:?}");
    let progress = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = progress.clone();
    let opts = Options::blocking()
        .connections(4)
        .resume(true)
        .progress(move |done, _| seen.lock().unwrap().push(done));
    let done = t.copy(&key, &w.remote("up/resumed"), &opts).wait().unwrap();
    assert!(
        matches!(done.path, CopyPath::Parallel { connections: 4, reconnects: 0, .. }),
        "{:?}",
        done.path
    );
    assert_eq!(
        (done.resumed_from, done.bytes),
        (6 * MIB, size - 6 * MIB),
        "range 1 and half of range 2 kept, range 3 pushed again from its wrong megabyte"
    );
    assert_eq!(progress.lock().unwrap().last(), Some(&size));
    pushed(w, "up/resumed", &bytes);
    let opts = Options::blocking().connections(4).overwrite(true);
    let again = t.copy(&key, &w.remote("up/resumed"), &opts).wait().unwrap();
    assert_eq!((again.resumed_from, again.bytes), (0, size));
    pushed(w, "up/resumed", &bytes);
}
