//! Small blobs on the filesystem store live in their catalogue row (`INLINE_UP_TO`): no file
//! is made for them, they read back (after a restart too) checked like any other, rot in the
//! row is caught and marked, replacing one by a file blob or the other way round leaves one
//! copy of the bytes, and an upload that breaks off keeps nothing and starts again.

mod common;

use bs_store::{FsStore, INLINE_UP_TO, RouteSpec, ScrubOptions, Store, StoreError, put_bytes};
use common::blob_files;

fn spec(name: &str) -> RouteSpec {
    RouteSpec { name: name.into(), ..Default::default() }
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed)).collect()
}

fn staging_files(root: &std::path::Path) -> usize {
    std::fs::read_dir(root.join("staging")).unwrap().count()
}

#[test]
fn a_small_blob_has_no_file_and_reads_back_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let edge = INLINE_UP_TO as usize;
    {
        let s = FsStore::open(dir.path()).unwrap();
        for (name, size) in [("empty", 0), ("tiny", 1), ("edge", edge)] {
            put_bytes(&s, &spec(name), &data(size, 3)).unwrap();
        }
        assert!(blob_files(dir.path()).is_empty(), "no blob file for a small blob");
        assert_eq!(staging_files(dir.path()), 0, "nor a staging file");
        put_bytes(&s, &spec("over"), &data(edge + 1, 4)).unwrap();
        assert_eq!(blob_files(dir.path()).len(), 1, "one byte more takes a file");
    }
    let s = FsStore::open(dir.path()).unwrap();
    for (name, size, seed) in
        [("empty", 0, 3), ("tiny", 1, 3), ("edge", edge, 3), ("over", edge + 1, 4)]
    {
        let src = s.open_read(name).unwrap();
        assert!(!src.is_file() || name == "over", "{name} is read from its row");
        assert_eq!(&src.all().unwrap()[..], &data(size, seed)[..], "{name}");
        assert_eq!(s.stat(name).unwrap().size, size as u64);
    }
    let mid = s.open_read("edge").unwrap().bytes(1000, 5000).unwrap();
    assert_eq!(&mid[..], &data(edge, 3)[1000..6000], "a range of it");
    s.delete("edge").unwrap();
    assert!(matches!(s.open_read("edge"), Err(StoreError::NotFound(_))));
}

#[test]
fn rot_in_a_small_blobs_row_is_caught_marked_and_named_by_the_scrubber() {
    let dir = tempfile::tempdir().unwrap();
    let s = FsStore::open(dir.path()).unwrap();
    let good = data(40_000, 1);
    put_bytes(&s, &spec("rot"), &good).unwrap();
    put_bytes(&s, &spec("fine"), &data(1000, 2)).unwrap();
    s.damage("rot", 12_345, 0x40).unwrap();

    let e = s.open_read("rot").unwrap().all().unwrap_err();
    assert!(matches!(&e, StoreError::Corrupt { name, .. } if name == "rot"), "{e:?}");
    // Marked: the next reader is refused before any byte, after a restart too.
    let s = {
        drop(s);
        FsStore::open(dir.path()).unwrap()
    };
    let e = s.open_read("rot").unwrap_err();
    assert!(e.to_string().contains("corrupt"), "{e}");
    assert_eq!(&s.open_read("fine").unwrap().all().unwrap()[..], &data(1000, 2)[..]);
    let report = bs_store::scrub(&s, &ScrubOptions::default(), |_, _| true).unwrap();
    assert_eq!(report.corrupt.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["rot"]);
    // Put again over it: sound again.
    put_bytes(&s, &RouteSpec { overwrite: true, ..spec("rot") }, &good).unwrap();
    assert_eq!(&s.open_read("rot").unwrap().all().unwrap()[..], &good[..]);
}

#[test]
fn replacing_a_small_blob_by_a_large_one_and_back_keeps_one_copy() {
    let dir = tempfile::tempdir().unwrap();
    let s = FsStore::open(dir.path()).unwrap();
    let over = |d: &[u8]| put_bytes(&s, &RouteSpec { overwrite: true, ..spec("x") }, d).unwrap();
    over(&data(100, 1));
    let large = data(3 << 20, 2);
    over(&large);
    assert_eq!(blob_files(dir.path()).len(), 1);
    assert_eq!(&s.open_read("x").unwrap().all().unwrap()[..], &large[..]);
    over(&data(200, 3));
    assert!(blob_files(dir.path()).is_empty(), "the large blob's file went with it");
    assert_eq!(&s.open_read("x").unwrap().all().unwrap()[..], &data(200, 3)[..]);
    // Without overwrite, a small put over it is refused and changes nothing.
    let e = put_bytes(&s, &spec("x"), &data(300, 4)).unwrap_err();
    assert!(matches!(e, StoreError::AlreadyExists(_)), "{e:?}");
    assert_eq!(&s.open_read("x").unwrap().all().unwrap()[..], &data(200, 3)[..]);
}

#[test]
fn a_small_upload_that_breaks_off_is_resumed_and_a_wrong_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = FsStore::open(dir.path()).unwrap();
    let want = data(5000, 7);
    let sp = RouteSpec { size: Some(5000), resume_tag: "t1".into(), ..spec("cut") };
    s.route(&sp).unwrap();
    let mut sink = s.open_upload("cut").unwrap();
    sink.write_at(0, &want[..2000]).unwrap();
    assert_eq!(staging_files(dir.path()), 0, "held in memory while it arrives");
    let e = sink.commit(None).unwrap_err();
    assert!(matches!(e, StoreError::Incomplete { .. }), "{e:?}");
    assert!(matches!(s.open_read("cut"), Err(StoreError::NotFound(_))), "nothing partial");
    // The writer is gone: what it held waits in a staging file for a resume.
    let again = s.route(&sp).unwrap();
    assert!(again.resumed);
    assert_eq!(again.received, 2000);
    let mut sink = s.open_upload("cut").unwrap();
    sink.write_at(2000, &want[2000..]).unwrap();
    sink.commit(None).unwrap();
    assert_eq!(&s.open_read("cut").unwrap().all().unwrap()[..], &want[..]);

    // A writer that backs up rewrites what it held; bytes that are not the sender's (by its
    // digest of what it meant to send) are refused and nothing becomes visible.
    let sp = RouteSpec { size: Some(5000), ..spec("wrong") };
    s.route(&sp).unwrap();
    let e = s.open_upload_range("wrong", 0).err().expect("no range writers");
    assert!(e.to_string().contains("takes one writer"), "{e}");
    let held = s.upload_piece_digests("wrong", 0, 5000, 1 << 16, s.digest_algo()).unwrap();
    assert_eq!(held, Some(Vec::new()), "nothing held yet");
    let mut sink = s.open_upload("wrong").unwrap();
    sink.write_at(0, &data(3000, 9)).unwrap();
    sink.truncate(1000).unwrap();
    assert_eq!(sink.received(), 1000);
    sink.write_at(1000, &want[1000..]).unwrap();
    let e = sink.write_at(5000, b"x").unwrap_err();
    assert!(matches!(e, StoreError::BeyondSize { .. }), "{e:?}");
    let mut h = s.digest_algo().hasher();
    h.update(&want);
    let digest = h.finish();
    let e = sink.commit(Some(digest.clone())).unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e:?}");
    assert!(matches!(s.open_read("wrong"), Err(StoreError::NotFound(_))));
    // Written right, it commits with that digest, in its row.
    s.route(&sp).unwrap();
    let mut sink = s.open_upload("wrong").unwrap();
    assert_eq!(sink.received(), 0);
    sink.write_at(0, &want).unwrap();
    let rec = sink.commit(Some(digest.clone())).unwrap();
    assert_eq!(rec.digest, digest.to_string());
    assert!(!s.open_read("wrong").unwrap().is_file());
    assert_eq!(&s.open_read("wrong").unwrap().all().unwrap()[..], &want[..]);
    assert_eq!(staging_files(dir.path()), 0);
}
