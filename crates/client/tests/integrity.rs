//! Corruption at rest over the data plane: a pull stops before the first bad chunk leaves the
//! server (the good chunks before it arrive, the bad one never does), the client gets a
//! "corrupt" error rather than a checksum mismatch at the end, range digests refuse to vouch
//! for rotten bytes (so a resume cannot keep them), and the scrub RPC names the blob. A small
//! blob in an S3 bucket pulled by a reader that uses nothing before the end is sent on as its
//! bytes arrive from the bucket: its pull still ends with the "corrupt" error, never with
//! success; a reader passing bytes on as they come still gets only checked chunks. A blob in
//! memory or a file, pulled by such a reader, fails the same way.

use std::sync::Arc;

use bs_client::{Client, ClientError, RouteRequest, scrub_event::Outcome};
use bs_server::{BackgroundServer, ServerConfig};
use bs_store::{FsStore, MemStore, Store};
use bs_transport::TransportError;
use bs_wire::{CHUNK_SIZE, DigestAlgo, ErrorCode};

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0]).collect()
}

fn put(c: &Client, name: &str, bytes: &[u8]) {
    let route = RouteRequest { size: Some(bytes.len() as u64), ..Default::default() };
    let mut p = c.open_push(name, 0, Some(bytes.len() as u64), Some(route)).unwrap();
    p.write(bytes).unwrap();
    p.finish(true).unwrap();
}

/// Whether `e` is the server's refusal with `code`, its message saying `says`.
fn refused(e: &ClientError, code: ErrorCode, says: &str) -> bool {
    matches!(e, ClientError::Transfer(TransportError::Remote { code: c, message })
        if *c == code && message.contains(says))
}

/// Pull `good`, stored as `name`, whole three times and a range of it once, each read whole
/// before use; every byte as stored.
fn pulls_whole_and_a_range(c: &Client, name: &str, good: &[u8]) {
    let mut whole = vec![0u8; good.len()];
    for _ in 0..3 {
        whole.fill(0);
        c.open_pull_whole(name, 0, None).unwrap().read_exact_to_end(&mut whole).unwrap();
        assert!(whole == good);
    }
    let mut part = vec![0u8; 1000];
    let at = CHUNK_SIZE + 10;
    c.open_pull_whole(name, at, Some(1000)).unwrap().read_exact_to_end(&mut part).unwrap();
    assert_eq!(&part[..], &good[at as usize..at as usize + 1000], "a range of it");
}

fn corrupt_pull_stops_at_the_bad_chunk(store: Arc<dyn Store>, damage: &dyn Fn(u64)) {
    let s = BackgroundServer::start(store, ServerConfig::ephemeral()).unwrap();
    let c = Client::connect(&s.control_addr().to_string()).unwrap();
    let good = data(4 * CHUNK_SIZE as usize + 100);
    put(&c, "scan", &good);
    put(&c, "other", &data(5000));
    let bad_at = 3 * CHUNK_SIZE + 17;
    damage(bad_at);

    // Chunks before the bad one arrive intact; then the stream ends with a corrupt error.
    let mut p = c.open_pull("scan", 0, None).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 256 << 10];
    let err = loop {
        match p.read(&mut buf) {
            Ok(0) => panic!("a corrupt blob was read to the end with success"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => break e,
        }
    };
    assert_eq!(got.len() as u64, 3 * CHUNK_SIZE, "every good chunk, none of the bad one");
    assert_eq!(&got[..], &good[..got.len()]);
    assert!(err.is_integrity(), "{err}");
    assert!(refused(&err, ErrorCode::Corrupt, "chunk 3"), "{err}");

    // Marked now: the next pull is refused before its first byte, a range digest too (a
    // resume asks for one before keeping bytes it already has), and the scrub names it.
    let e = c.open_pull("scan", 0, None).and_then(|mut p| p.read(&mut buf)).unwrap_err();
    assert!(e.is_integrity() && e.to_string().contains("marked corrupt"), "{e}");
    let e = c.range_digest("scan", 0, CHUNK_SIZE, DigestAlgo::Xxh3_128).unwrap_err();
    assert!(matches!(e, ClientError::Corrupt(_)), "{e}");
    let mut events = Vec::new();
    c.scrub("", 0, |ev| events.push((ev.name.clone(), ev.outcome))).unwrap();
    assert_eq!(
        events,
        [("other".to_string(), Outcome::Ok as i32), ("scan".to_string(), Outcome::Corrupt as i32)]
    );
    let mut p = c.open_pull("other", 0, None).unwrap();
    let mut out = vec![0u8; 5000];
    p.read_exact_to_end(&mut out).unwrap();
    assert_eq!(out, data(5000), "other blobs are served as before");
}

/// What flips a byte of a stored blob: (blob name, byte offset).
type Damage = Box<dyn Fn(&str, u64)>;

/// A small blob in memory or a file (read once, then mapped), pulled by a reader that uses
/// nothing before the end: it arrives whole when it is sound, and its pull ends with the
/// "corrupt" error, never with success, when it is not — a range too, when the rot is
/// elsewhere in its chunk.
#[test]
fn a_local_blob_pulled_whole_before_use_is_never_rot_with_success() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FsStore::open(dir.path()).unwrap();
    let mem = MemStore::new();
    let (f, m) = (fs.clone(), mem.clone());
    let stores: [(Arc<dyn Store>, Damage); 2] = [
        (Arc::new(fs), Box::new(move |n, at| f.damage(n, at, 0x01).unwrap())),
        (Arc::new(mem), Box::new(move |n, at| m.damage(n, at, 0x01).unwrap())),
    ];
    for (store, damage) in stores {
        let s = BackgroundServer::start(store, ServerConfig::ephemeral()).unwrap();
        let c = Client::connect(&s.control_addr().to_string()).unwrap();
        let good = data(3 * CHUNK_SIZE as usize + 100);
        put(&c, "whole", &good);
        pulls_whole_and_a_range(&c, "whole", &good);
        let mut whole = vec![0u8; good.len()];

        damage("whole", 2 * CHUNK_SIZE - 5);
        let mut p = c.open_pull_whole("whole", 0, None).unwrap();
        let err = p.read_exact_to_end(&mut whole).unwrap_err();
        assert!(refused(&err, ErrorCode::Corrupt, "chunk 1"), "{err}");
        // A range ending before the bad byte, inside its chunk: refused too (its chunk is
        // checked whole before the SUM). Read twice first: a file blob is mapped from then on.
        put(&c, "tail", &good);
        for _ in 0..2 {
            c.open_pull_whole("tail", 0, None).unwrap().read_exact_to_end(&mut whole).unwrap();
        }
        damage("tail", CHUNK_SIZE + 500);
        // (Here the whole answer is the error: nothing of the range goes out before it.)
        let mut part = [0u8; 100];
        let err = c
            .open_pull_whole("tail", CHUNK_SIZE, Some(100))
            .and_then(|mut p| p.read_exact_to_end(&mut part))
            .unwrap_err();
        assert!(refused(&err, ErrorCode::Corrupt, "chunk 1"), "{err}");
    }
}

#[test]
fn s3_store_small_blob_sent_as_it_arrives() {
    let garage = bs_peers::Garage::start("integrity").unwrap();
    let e = garage.endpoint();
    let cfg = bs_store::S3Config {
        endpoint: Some(e.url.clone()),
        region: e.region.clone(),
        bucket: e.bucket.clone(),
        prefix: "scan".into(),
        access_key_id: e.key_id.clone(),
        secret_access_key: e.secret.clone(),
        timeout: None,
    };
    let store =
        bs_store::ObjStore::open_s3(&cfg, bs_meta::Catalogue::open_in_memory().unwrap()).unwrap();
    let s = BackgroundServer::start(Arc::new(store.clone()), ServerConfig::ephemeral()).unwrap();
    let c = Client::connect(&s.control_addr().to_string()).unwrap();
    let good = data(3 * CHUNK_SIZE as usize + 100);
    put(&c, "whole", &good);
    put(&c, "piped", &good);
    // Each GET on a bucket client lent to the sending thread, given back idle and lent again.
    pulls_whole_and_a_range(&c, "whole", &good);
    let mut whole = vec![0u8; good.len()];

    // Read whole before use: the pull fails, never succeeds, whatever of the bad chunk came.
    store.damage("whole", 2 * CHUNK_SIZE - 5, 0x01).unwrap();
    let mut p = c.open_pull_whole("whole", 0, None).unwrap();
    let err = p.read_exact_to_end(&mut whole).unwrap_err();
    assert!(refused(&err, ErrorCode::Corrupt, "chunk 1"), "{err}");
    let e = c.open_pull("whole", 0, None).and_then(|mut p| p.read(&mut whole)).unwrap_err();
    assert!(e.is_integrity() && e.to_string().contains("marked corrupt"), "{e}");

    // Passed on as read (a pipe): only checked chunks arrive, then the error.
    store.damage("piped", 2 * CHUNK_SIZE - 5, 0x01).unwrap();
    let mut p = c.open_pull("piped", 0, None).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let err = loop {
        match p.read(&mut buf) {
            Ok(0) => panic!("a corrupt blob was read to the end with success"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => break e,
        }
    };
    assert_eq!(got.len() as u64, CHUNK_SIZE, "the good chunk, none of the bad one");
    assert_eq!(&got[..], &good[..got.len()]);
    assert!(refused(&err, ErrorCode::Corrupt, "chunk 1"), "{err}");
}

#[test]
fn memory_store() {
    let store = MemStore::new();
    let handle = store.clone();
    corrupt_pull_stops_at_the_bad_chunk(Arc::new(store), &move |off| {
        handle.damage("scan", off, 0x01).unwrap()
    });
}

#[test]
fn fs_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = FsStore::open(dir.path()).unwrap();
    let handle = store.clone();
    corrupt_pull_stops_at_the_bad_chunk(Arc::new(store), &move |off| {
        handle.damage("scan", off, 0x01).unwrap()
    });
}

#[test]
fn an_unsized_push_that_fills_the_disk_leaves_nothing_pending() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FsStore::open(dir.path()).unwrap();
    let store = Arc::new(bs_store::FaultyStore::disk_full_after(fs.clone(), 3 << 20));
    let s = BackgroundServer::start(store, ServerConfig::ephemeral()).unwrap();
    let c = Client::connect(&s.control_addr().to_string()).unwrap();
    let route = RouteRequest { size: None, resume_tag: "t".into(), ..Default::default() };
    let mut p = c.open_push("stream", 0, None, Some(route)).unwrap();
    let res = p.write(&data(8 << 20)).and_then(|_| p.finish(true));
    let e = res.unwrap_err();
    assert!(e.to_string().contains("discarded"), "{e}");
    assert!(
        matches!(fs.abort("stream"), Err(bs_store::StoreError::NoUpload(_))),
        "nothing pending"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("staging")).unwrap().count(),
        0,
        "no staged bytes"
    );
}
