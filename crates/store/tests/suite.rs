//! One behaviour suite, run against every store (in the manner of object_store's
//! `integration.rs`): whatever a test asserts holds for memory, filesystem and S3 (a real
//! Garage server) alike.

mod common;

use bs_store::{FaultyStore, FsStore, MemStore, RouteSpec, Store, StoreError};
use bs_wire::DigestAlgo;

fn spec(name: &str, size: Option<u64>) -> RouteSpec {
    RouteSpec {
        name: name.into(),
        size,
        content_type: "application/x-test".into(),
        ..Default::default()
    }
}

fn put(s: &dyn Store, name: &str, data: &[u8]) {
    let rec = bs_store::put_bytes(s, &spec(name, None), data).unwrap();
    assert_eq!((rec.name.as_str(), rec.size), (name, data.len() as u64));
}

fn read_all(s: &dyn Store, name: &str) -> Vec<u8> {
    let src = s.open_read(name).unwrap();
    let mut out = vec![0u8; src.record().size as usize];
    let mut off = 0;
    while off < out.len() {
        off += src.read_at(&mut out[off..], off as u64).unwrap();
    }
    out
}

fn put_get_stat_list_delete(s: &dyn Store) {
    put(s, "a/one", b"hello");
    put(s, "a/two", b"");
    put(s, "b/three", &[7u8; 100_000]);
    assert_eq!(read_all(s, "a/one"), b"hello");
    assert_eq!(read_all(s, "a/two"), b"");
    let st = s.stat("b/three").unwrap();
    assert_eq!(st.size, 100_000);
    assert_eq!(st.content_type, "application/x-test");
    assert_eq!(st.digest, DigestAlgo::Xxh3_128.digest(&[7u8; 100_000]).to_string());
    let names: Vec<_> = s.list("a/", "", 10).unwrap().into_iter().map(|r| r.name).collect();
    assert_eq!(names, ["a/one", "a/two"]);
    let page: Vec<_> = s.list("", "a/one", 1).unwrap().into_iter().map(|r| r.name).collect();
    assert_eq!(page, ["a/two"]);
    s.delete("a/one").unwrap();
    assert!(matches!(s.stat("a/one"), Err(StoreError::NotFound(_))));
    assert!(matches!(s.open_read("a/one"), Err(StoreError::NotFound(_))));
    assert!(matches!(s.delete("a/one"), Err(StoreError::NotFound(_))));
}

fn nothing_partial_is_visible(s: &dyn Store) {
    s.route(&spec("p", Some(10))).unwrap();
    let mut w = s.open_upload("p").unwrap();
    w.write_at(0, b"12345").unwrap();
    assert!(matches!(s.stat("p"), Err(StoreError::NotFound(_))));
    assert!(s.list("", "", 10).unwrap().is_empty());
    let err = w.commit(None).unwrap_err();
    assert!(matches!(err, StoreError::Incomplete { received: 5, size: 10, .. }), "{err}");
    assert!(matches!(s.stat("p"), Err(StoreError::NotFound(_))));
}

fn gaps_and_overruns_are_refused(s: &dyn Store) {
    s.route(&spec("g", Some(10))).unwrap();
    let mut w = s.open_upload("g").unwrap();
    assert!(matches!(w.write_at(3, b"x"), Err(StoreError::Gap { offset: 3, received: 0 })));
    assert!(matches!(w.write_at(0, &[0; 11]), Err(StoreError::BeyondSize { .. })));
    w.write_at(0, b"0123456789").unwrap();
    w.write_at(2, b"ab").unwrap(); // rewriting inside the prefix is fine
    w.truncate(4).unwrap(); // a failed transfer is rolled back
    assert_eq!(w.received(), 4);
    assert!(matches!(w.write_at(5, b"x"), Err(StoreError::Gap { offset: 5, received: 4 })));
    w.write_at(4, b"456789").unwrap();
    w.commit(None).unwrap();
    assert_eq!(read_all(s, "g"), b"01ab456789");
}

fn resume_continues_where_it_stopped(s: &dyn Store) {
    let mut sp = spec("r", Some(8));
    sp.resume_tag = "file-v1".into();
    assert!(!s.route(&sp).unwrap().resumed);
    {
        let mut w = s.open_upload("r").unwrap();
        w.write_at(0, b"abc").unwrap();
    } // writer vanished
    let routed = s.route(&sp).unwrap();
    assert!(routed.resumed);
    assert_eq!(routed.received, 3);
    assert_eq!(routed.received_digest, Some(DigestAlgo::Xxh3_128.digest(b"abc")));
    let mut w = s.open_upload("r").unwrap();
    assert_eq!(w.received(), 3);
    w.write_at(3, b"defgh").unwrap();
    w.commit(None).unwrap();
    assert_eq!(read_all(s, "r"), b"abcdefgh");

    // A different tag starts over.
    let mut sp2 = spec("r2", Some(2));
    sp2.resume_tag = "a".into();
    s.route(&sp2).unwrap();
    s.open_upload("r2").unwrap().write_at(0, b"x").unwrap();
    sp2.resume_tag = "b".into();
    let routed = s.route(&sp2).unwrap();
    assert!(!routed.resumed);
    assert_eq!(s.open_upload("r2").unwrap().received(), 0);
}

fn one_writer_at_a_time(s: &dyn Store) {
    s.route(&spec("w", None)).unwrap();
    let w = s.open_upload("w").unwrap();
    assert!(matches!(s.open_upload("w"), Err(StoreError::Busy(_))));
    assert!(matches!(s.route(&spec("w", None)), Err(StoreError::Busy(_))));
    drop(w);
    let mut w = s.open_upload("w").unwrap();
    w.write_at(0, b"streamed").unwrap();
    let rec = w.commit(None).unwrap();
    assert_eq!(rec.size, 8, "unknown-size uploads take the size they reach");
}

fn overwrite_is_explicit(s: &dyn Store) {
    put(s, "o", b"first");
    assert!(matches!(s.route(&spec("o", Some(1))), Err(StoreError::AlreadyExists(_))));
    let mut sp = spec("o", Some(6));
    sp.overwrite = true;
    s.route(&sp).unwrap();
    let mut w = s.open_upload("o").unwrap();
    w.write_at(0, b"second").unwrap();
    w.commit(None).unwrap();
    assert_eq!(read_all(s, "o"), b"second");
}

fn bad_names_and_missing_things(s: &dyn Store) {
    for bad in ["../x", "/abs", "a\0b", "a//b", &"n".repeat(2000)] {
        assert!(matches!(s.route(&spec(bad, Some(1))), Err(StoreError::InvalidName { .. })));
        assert!(matches!(s.stat(bad), Err(StoreError::InvalidName { .. })));
        assert!(matches!(s.open_read(bad), Err(StoreError::InvalidName { .. })));
    }
    assert!(matches!(s.open_upload("nope"), Err(StoreError::NoUpload(_))));
    assert!(matches!(s.abort("nope"), Err(StoreError::NoUpload(_))));
    s.route(&spec("ab", Some(1))).unwrap();
    s.abort("ab").unwrap();
    assert!(matches!(s.open_upload("ab"), Err(StoreError::NoUpload(_))));
}

fn range_digests(s: &dyn Store) {
    put(s, "d", b"0123456789");
    let src = s.open_read("d").unwrap();
    assert_eq!(
        src.digest_range(2, 3, DigestAlgo::Blake3).unwrap(),
        DigestAlgo::Blake3.digest(b"234")
    );
    assert!(matches!(
        src.digest_range(8, 3, DigestAlgo::Blake3),
        Err(StoreError::OutOfRange { .. })
    ));
}

fn lent_memory_is_the_upload_itself(s: &dyn Store) {
    s.route(&spec("l", Some(6))).unwrap();
    let mut w = s.open_upload("l").unwrap();
    assert!(w.lend(0, 7).is_none(), "never past the declared size");
    assert!(w.lend(2, 1).is_none(), "never leaving a gap");
    match w.lend(0, 4) {
        Some(buf) => {
            buf.copy_from_slice(b"abcd");
            w.filled(0, 4);
        }
        None => w.write_at(0, b"abcd").unwrap(), // stores that keep uploads elsewhere
    }
    assert_eq!(w.received(), 4);
    w.write_at(4, b"ef").unwrap();
    w.commit(None).unwrap();
    assert_eq!(read_all(s, "l"), b"abcdef");
}

fn resuming_takes_the_new_request_flags(s: &dyn Store) {
    let mut sp = spec("f", Some(2));
    sp.resume_tag = "t".into();
    s.route(&sp).unwrap();
    s.open_upload("f").unwrap().write_at(0, b"a").unwrap();
    sp.overwrite = true;
    sp.content_type = "text/plain".into();
    assert!(s.route(&sp).unwrap().resumed);
    let mut w = s.open_upload("f").unwrap();
    w.write_at(1, b"b").unwrap();
    let rec = w.commit(None).unwrap();
    assert_eq!(rec.content_type, "text/plain");
    assert_eq!(read_all(s, "f"), b"ab");
}

fn full_disk_loses_nothing(s: impl Store) {
    let s = FaultyStore::disk_full_after(s, 4);
    put(&s, "small", b"1234");
    s.route(&spec("big", Some(10))).unwrap();
    let mut w = s.open_upload("big").unwrap();
    let err = w.write_at(0, b"0123456789").unwrap_err();
    assert!(matches!(err, StoreError::StorageFull(_)), "{err}");
    drop(w);
    assert!(matches!(s.stat("big"), Err(StoreError::NotFound(_))));
    assert_eq!(read_all(&s, "small"), b"1234");
}

/// One blob written by two range writers at once (one blob over two connections) is
/// committed whole by `commit_expecting`; bytes that are not the sender's are refused and
/// nothing becomes visible, and written again (both ranges: on S3 a part written again is
/// held once it is whole again) the same upload commits.
fn range_writers_commit_one_blob(s: &dyn Store) {
    let size = 9 << 20; // past one 8 MiB part, so the S3 store sends parts as they fill
    let bytes: Vec<u8> = (0..size).map(|i| (i as u8).wrapping_mul(31) ^ (i >> 20) as u8).collect();
    let (whole, sums) = (s.digest_algo().digest(&bytes), bs_wire::ChunkDigests::of(&bytes));
    s.route(&spec("r", Some(size as u64))).unwrap();
    let half = 5 << 20;
    let mut a = s.open_upload_range("r", 0).unwrap().expect("takes range writers");
    let mut b = s.open_upload_range("r", half as u64).unwrap().expect("takes range writers");
    assert!(matches!(s.open_upload("r"), Err(StoreError::Busy(_))), "one writer while ranges");
    let mut wrong = bytes[half..].to_vec();
    wrong[100] ^= 1;
    let write = |w: &mut dyn bs_store::UploadSink, from: usize, part: &[u8]| {
        for (k, piece) in part.chunks(1 << 20).enumerate() {
            w.write_at((from + (k << 20)) as u64, piece).unwrap();
        }
    };
    write(&mut *b, half, &wrong);
    write(&mut *a, 0, &bytes[..half]);
    drop((a, b));
    let e = s.open_upload("r").unwrap().commit_expecting(&whole, Some(&sums)).unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
    assert!(matches!(s.stat("r"), Err(StoreError::NotFound(_))));
    for from in [0, half] {
        let mut w = s.open_upload_range("r", from as u64).unwrap().unwrap();
        write(&mut *w, from, &bytes[from..if from == 0 { half } else { size }]);
    }
    let rec = s.open_upload("r").unwrap().commit_expecting(&whole, Some(&sums)).unwrap();
    assert_eq!((rec.size, rec.digest), (size as u64, whole.to_string()));
    assert!(read_all(s, "r") == bytes, "the blob's bytes differ");
}

macro_rules! suite {
    ($($t:ident),*) => {
        mod mem { $( #[test] fn $t() { super::$t(&bs_store::MemStore::new()); } )* }
        mod fs { $( #[test] fn $t() {
            let dir = tempfile::tempdir().unwrap();
            super::$t(&bs_store::FsStore::open(dir.path()).unwrap());
        } )* }
        mod s3 { $( #[test] fn $t() { super::$t(&super::common::s3_store()); } )* }
        mod memory_tier_over_s3 { $( #[test] fn $t() {
            let back = std::sync::Arc::new(super::common::s3_store());
            super::$t(&bs_store::Tier::new(back, 64 << 20, 16 << 20));
        } )* }
        mod disk_tier_over_s3 { $( #[test] fn $t() {
            let back = std::sync::Arc::new(super::common::s3_store());
            let dir = tempfile::tempdir().unwrap();
            super::$t(&bs_store::Tier::on_disk(back, dir.path(), 64 << 20, 16 << 20).unwrap());
        } )* }
    };
}

suite!(
    put_get_stat_list_delete,
    nothing_partial_is_visible,
    gaps_and_overruns_are_refused,
    resume_continues_where_it_stopped,
    one_writer_at_a_time,
    overwrite_is_explicit,
    bad_names_and_missing_things,
    range_digests,
    lent_memory_is_the_upload_itself,
    resuming_takes_the_new_request_flags,
    commits_and_deletes_are_announced,
    stale_uploads_expire_unless_being_written,
    conditional_replace_is_checked_at_commit,
    concurrent_commits_each_land_once,
    range_writers_commit_one_blob
);

fn conditional_replace_is_checked_at_commit(s: &dyn Store) {
    put(s, "c", b"first");
    let digest = |d: &[u8]| s.digest_algo().digest(d).to_string();
    let mut sp = spec("c", None);
    sp.overwrite = true;
    sp.refuse_digests = vec![digest(b"first")];
    assert!(matches!(s.route(&sp), Err(StoreError::AlreadyExists(_))), "refused at once");
    // Refusing other versions: the replacement goes through. (The catalogue checks the
    // condition again inside the commit's transaction; see bs_meta's tests.)
    sp.refuse_digests = vec![digest(b"second")];
    bs_store::put_bytes(s, &sp, b"third").unwrap();
    assert_eq!(read_all(s, "c"), b"third");
    sp.refuse_digests = vec![digest(b"third")];
    assert!(matches!(bs_store::put_bytes(s, &sp, b"fourth"), Err(StoreError::AlreadyExists(_))));
    assert_eq!(read_all(s, "c"), b"third");
    // Requiring a version (HTTP If-Match): only a blob of one of those digests is replaced.
    let require = |d: &[u8]| format!("{}{}", bs_store::REQUIRE_DIGEST, digest(d));
    let changed = |r: Result<_, StoreError>| matches!(r, Err(StoreError::ConditionFailed(_)));
    sp.refuse_digests = vec![require(b"second")];
    assert!(changed(s.route(&sp).map(drop)), "not the one stored");
    sp.refuse_digests = vec![require(b"second"), require(b"third")];
    bs_store::put_bytes(s, &sp, b"fourth").unwrap();
    assert_eq!(read_all(s, "c"), b"fourth");
    sp.refuse_digests = vec![require(b"third")];
    assert!(changed(bs_store::put_bytes(s, &sp, b"fifth").map(drop)));
    assert_eq!(read_all(s, "c"), b"fourth");
    // Any version (If-Match: *): a blob must be there, at the route and again at the commit.
    sp.refuse_digests = vec![bs_store::REQUIRE_DIGEST.to_string()];
    bs_store::put_bytes(s, &sp, b"fifth").unwrap();
    assert_eq!(read_all(s, "c"), b"fifth");
    // The version asked for deleted after the route: refused at the commit, nothing made.
    for required in [require(b"fifth"), bs_store::REQUIRE_DIGEST.to_string()] {
        let _ = s.delete("c");
        put(s, "c", b"fifth");
        sp.refuse_digests = vec![required];
        s.route(&sp).unwrap();
        let mut w = s.open_upload("c").unwrap();
        w.write_at(0, b"sixth").unwrap();
        s.delete("c").unwrap();
        assert!(changed(w.commit(None).map(drop)), "a deleted version is not made anew");
        assert!(matches!(s.stat("c"), Err(StoreError::NotFound(_))));
        assert!(changed(s.route(&sp).map(drop)), "nothing there to replace");
    }
}

fn stale_uploads_expire_unless_being_written(s: &dyn Store) {
    s.route(&spec("x/idle", None)).unwrap();
    s.route(&spec("x/busy", None)).unwrap();
    let mut w = s.open_upload("x/busy").unwrap();
    w.write_at(0, b"abc").unwrap();
    assert!(s.expire_uploads(std::time::Duration::from_secs(3600)).unwrap().is_empty(), "young");
    std::thread::sleep(std::time::Duration::from_millis(5));
    let gone = s.expire_uploads(std::time::Duration::ZERO).unwrap();
    assert_eq!(gone, ["x/idle"], "the one being written stays");
    assert!(matches!(s.open_upload("x/idle"), Err(StoreError::NoUpload(_))));
    w.commit(None).unwrap();
    assert_eq!(read_all(s, "x/busy"), b"abc");
}

fn commits_and_deletes_are_announced(s: &dyn Store) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    s.subscribe(std::sync::Arc::new(move |e: &bs_store::StoreEvent| {
        log.lock().unwrap().push(match e {
            bs_store::StoreEvent::Committed(r) => format!("+{}:{}", r.name, r.size),
            bs_store::StoreEvent::Deleted(n) => format!("-{n}"),
        })
    }));
    put(s, "e/a", b"abc");
    let mut sp = spec("e/a", None);
    sp.overwrite = true;
    bs_store::put_bytes(s, &sp, b"abcd").unwrap();
    s.route(&spec("e/pending", Some(3))).unwrap();
    s.abort("e/pending").unwrap();
    assert!(s.delete("e/none").is_err());
    s.delete("e/a").unwrap();
    assert_eq!(*seen.lock().unwrap(), ["+e/a:3", "+e/a:4", "-e/a"]);
}

/// Many writers committing at once (the filesystem store shares their catalogue commits):
/// every distinct blob lands whole, and of writers racing for one name without overwrite
/// exactly one wins — the others are refused, not merged.
fn concurrent_commits_each_land_once(s: &dyn Store) {
    let body = |i: usize| vec![i as u8; 1000 + i * 37];
    let raced = std::thread::scope(|t| {
        let racers: Vec<_> = (0..24)
            .map(|i| {
                t.spawn(move || {
                    if i % 4 == 3 {
                        // Uploads of one name, each its own pending upload until commit.
                        let name = format!("race/{i}");
                        let rec = bs_store::put_bytes(s, &spec(&name, None), &body(i));
                        assert_eq!(rec.unwrap().size, body(i).len() as u64);
                        let again = bs_store::put_bytes(s, &spec("race/same", None), &body(i));
                        Some(again.map(|_| i))
                    } else {
                        put(s, &format!("many/{i:02}"), &body(i));
                        None
                    }
                })
            })
            .collect();
        racers.into_iter().filter_map(|r| r.join().unwrap()).collect::<Vec<_>>()
    });
    let winners: Vec<usize> = raced.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
    assert_eq!(winners.len(), 1, "{raced:?}");
    for r in raced.iter().filter(|r| r.is_err()) {
        assert!(
            matches!(
                r,
                Err(StoreError::AlreadyExists(_) | StoreError::Busy(_) | StoreError::NoUpload(_))
            ),
            "{r:?}"
        );
    }
    assert_eq!(read_all(s, "race/same"), body(winners[0]));
    for i in (0..24).filter(|i| i % 4 != 3) {
        assert_eq!(read_all(s, &format!("many/{i:02}")), body(i));
    }
    assert_eq!(s.list("many/", "", 100).unwrap().len(), 18);
}

#[test]
fn fs_concurrent_commits_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    concurrent_commits_each_land_once(&FsStore::open(dir.path()).unwrap());
    let s = FsStore::open(dir.path()).unwrap();
    assert_eq!(s.list("many/", "", 100).unwrap().len(), 18);
    assert_eq!(s.list("race/", "", 100).unwrap().len(), 7);
    assert_eq!(read_all(&s, "many/05"), vec![5u8; 1000 + 5 * 37]);
}

#[test]
fn full_disk_mem() {
    full_disk_loses_nothing(MemStore::new());
}

#[test]
fn full_disk_fs() {
    let dir = tempfile::tempdir().unwrap();
    full_disk_loses_nothing(FsStore::open(dir.path()).unwrap());
}

#[test]
fn impossible_sizes_are_storage_full_not_a_crash() {
    let s = MemStore::new();
    for size in [u64::MAX, 1 << 62] {
        let e = s.route(&spec("huge", Some(size))).unwrap_err();
        assert!(matches!(e, StoreError::StorageFull(_)), "{e}");
    }
    put(&s, "fine", b"still works");
    assert_eq!(read_all(&s, "fine"), b"still works");
    let dir = tempfile::tempdir().unwrap();
    let fs = FsStore::open(dir.path()).unwrap();
    assert!(matches!(fs.route(&spec("huge", Some(u64::MAX))), Err(StoreError::StorageFull(_))));
}

#[test]
fn memory_capacity_reports_storage_full() {
    let s = MemStore::with_capacity(8);
    assert!(matches!(s.route(&spec("x", Some(9))), Err(StoreError::StorageFull(_))));
    s.route(&spec("y", None)).unwrap();
    let mut w = s.open_upload("y").unwrap();
    assert!(matches!(w.write_at(0, &[0; 9]), Err(StoreError::StorageFull(_))));
}

#[test]
fn fs_blobs_survive_restart_and_crash_leftovers_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = FsStore::open(dir.path()).unwrap();
        put(&s, "keep", b"durable");
        put(&s, "big", &vec![5u8; bs_store::READ_WHOLE_UP_TO as usize + 1]);
        let mut sp = spec("pending", Some(4));
        sp.resume_tag = "t".into();
        s.route(&sp).unwrap();
        s.open_upload("pending").unwrap().write_at(0, b"ab").unwrap();
    }
    // A crash between rename and catalogue commit leaves an unreferenced file behind.
    let orphan = dir.path().join("blobs/ff/ff00");
    std::fs::create_dir_all(orphan.parent().unwrap()).unwrap();
    std::fs::write(&orphan, b"partial").unwrap();
    std::fs::write(dir.path().join("staging/stray"), b"x").unwrap();

    let s = FsStore::open(dir.path()).unwrap();
    assert_eq!(read_all(&s, "keep"), b"durable");
    assert!(!orphan.exists(), "orphan removed");
    assert!(!dir.path().join("staging/stray").exists());
    let mut sp = spec("pending", Some(4));
    sp.resume_tag = "t".into();
    assert_eq!(s.route(&sp).unwrap().received, 2, "pending upload resumes after restart");
    // Read from its file (a small one is read whole into memory, checked all the same).
    assert!(s.open_read("big").unwrap().is_file());
    assert!(!s.open_read("keep").unwrap().is_file());
    assert_eq!(read_all(&s, "big"), vec![5u8; bs_store::READ_WHOLE_UP_TO as usize + 1]);
}
