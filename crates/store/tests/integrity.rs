//! Integrity at rest, against every store: a flipped byte is never read back as good data,
//! the blob is marked so later readers are refused at once, the scrubber names it, and a
//! delete on a full disk never leaves a listed blob without its bytes.

mod common;

use bs_store::{FsStore, MemStore, RouteSpec, ScrubOptions, Store, StoreError};
use bs_wire::CHUNK_SIZE;

fn spec(name: &str) -> RouteSpec {
    RouteSpec { name: name.into(), ..Default::default() }
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Behaviour every store shares once `damage(name, offset)` flipped a byte of the blob.
fn rot_is_caught(s: &dyn Store, damage: &dyn Fn(&str, u64)) {
    rot_in_a_blob_of(3 * CHUNK_SIZE as usize + 77, 2, s, damage);
}

/// The same for a blob of `size` bytes with chunk `bad` (not the first) damaged.
fn rot_in_a_blob_of(size: usize, bad: u64, s: &dyn Store, damage: &dyn Fn(&str, u64)) {
    let good = data(size, 1);
    bs_store::put_bytes(s, &spec("scan"), &good).unwrap();
    bs_store::put_bytes(s, &spec("other"), &data(1000, 2)).unwrap();
    let bad_at = bad * CHUNK_SIZE + 5;
    damage("scan", bad_at);

    // A range that avoids the bad chunk still reads; the stream stops at the bad chunk.
    let src = s.open_read("scan").unwrap();
    assert!(!src.is_mapped() || size as u64 >= bs_store::MAP_FROM);
    assert_eq!(&src.bytes(0, CHUNK_SIZE).unwrap()[..], &good[..CHUNK_SIZE as usize]);
    let pieces: Vec<_> = src.pieces(0, size as u64).unwrap().collect();
    let good_bytes: usize = pieces.iter().filter_map(|p| p.as_ref().ok()).map(|b| b.len()).sum();
    assert_eq!(good_bytes as u64, bad * CHUNK_SIZE, "every good chunk before the bad one");
    let last = pieces.last().unwrap();
    assert!(matches!(last, Err(StoreError::Corrupt { name, .. }) if name == "scan"), "{last:?}");
    drop(src);

    // Now marked: the next reader is refused before any byte, with the reason.
    let e = s.open_read("scan").unwrap_err();
    let chunk = format!("chunk {bad}");
    assert!(e.to_string().contains("corrupt") && e.to_string().contains(&chunk), "{e}");
    assert!(s.stat("scan").is_ok(), "still listed, so it can be found and dealt with");
    let mark = s.corrupt_mark("scan").unwrap().expect("the mark is told with the blob");
    assert!(mark.contains(&chunk), "{mark}");
    assert_eq!(s.corrupt_mark("other").unwrap(), None);
    assert!(matches!(s.corrupt_mark("none"), Err(StoreError::NotFound(_))));
    // A listing's page gets the marks of its names in one look-up, of those names only.
    let marks =
        |n: &[&str]| s.corrupt_marks(&n.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    let found = marks(&["other", "scan", "none"]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].0 == "scan" && found[0].1.contains(&chunk), "{found:?}");
    assert!(marks(&["other"]).is_empty() && marks(&[]).is_empty());
    assert_eq!(&s.open_read("other").unwrap().all().unwrap()[..], &data(1000, 2)[..]);

    // The scrubber names it and nothing else.
    let mut seen = Vec::new();
    let report = bs_store::scrub(s, &ScrubOptions::default(), |n, r| {
        seen.push((n.name.clone(), r.is_ok()));
        true
    })
    .unwrap();
    assert_eq!(report.blobs, 2);
    assert_eq!(report.corrupt.len(), 1);
    assert_eq!(report.corrupt[0].0, "scan");
    assert_eq!(seen, [("other".to_string(), true), ("scan".to_string(), false)]);

    // Replacing the blob clears the mark.
    let mut sp = spec("scan");
    sp.overwrite = true;
    bs_store::put_bytes(s, &sp, &good).unwrap();
    assert_eq!(&s.open_read("scan").unwrap().all().unwrap()[..], &good[..]);
    assert_eq!(s.corrupt_mark("scan").unwrap(), None);
}

#[test]
fn rot_in_memory_is_caught() {
    let s = MemStore::new();
    let handle = s.clone();
    rot_is_caught(&s, &move |name, off| handle.damage(name, off, 0x10).unwrap());
}

#[test]
fn rot_on_disk_is_caught() {
    // Small blob files are read into buffers, large ones mapped: both are checked.
    for size in [3 * CHUNK_SIZE + 77, bs_store::MAP_FROM + 77] {
        let dir = tempfile::tempdir().unwrap();
        let s = FsStore::open(dir.path()).unwrap();
        let handle = s.clone();
        let damage = move |name: &str, off| handle.damage(name, off, 0x10).unwrap();
        bs_store::put_bytes(&s, &spec("probe"), &data(size as usize, 9)).unwrap();
        let mapped = s.open_read("probe").unwrap().is_mapped();
        assert_eq!(mapped, size >= bs_store::MAP_FROM, "{size} bytes: mapped {mapped}");
        s.delete("probe").unwrap();
        rot_in_a_blob_of(size as usize, 2, &s, &damage);
    }
}

/// The one blob file under `root`'s `blobs` directory.
fn only_blob_file(root: &std::path::Path) -> std::path::PathBuf {
    let mut found = common::blob_files(root);
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}

#[test]
fn a_blob_read_again_is_read_through_its_kept_mapping_and_still_checked() {
    let dir = tempfile::tempdir().unwrap();
    let s = FsStore::open(dir.path()).unwrap();
    // Copied on a first read (too small to be worth mapping once), mapped from the second.
    let size = 2 * CHUNK_SIZE as usize + 77;
    assert!((size as u64) < bs_store::MAP_FROM);
    let good = data(size, 5);
    bs_store::put_bytes(&s, &spec("hot"), &good).unwrap();
    assert!(!s.open_read("hot").unwrap().is_mapped(), "read once: copied");
    let second = s.open_read("hot").unwrap();
    assert!(second.is_mapped(), "read again: mapped");
    let third = s.open_read("hot").unwrap();
    let at = |src: &bs_store::BlobSource| src.bytes(0, 8).unwrap().as_ptr();
    assert_eq!(at(&second), at(&third), "the third reader reads the second's mapping");
    assert_eq!(&third.all().unwrap()[..], &good[..]);
    drop((second, third));

    // Replaced: the new bytes, never the old file's mapping.
    let newer = data(size, 6);
    bs_store::put_bytes(&s, &RouteSpec { overwrite: true, ..spec("hot") }, &newer).unwrap();
    assert_eq!(&s.open_read("hot").unwrap().all().unwrap()[..], &newer[..]);
    let kept = s.open_read("hot").unwrap();
    assert!(kept.is_mapped());
    assert_eq!(&kept.all().unwrap()[..], &newer[..]);

    // A file swapped on disk behind the store's back is read, not the kept mapping of the
    // one it replaced: here a copy with one byte changed, which the digests catch.
    let path = only_blob_file(dir.path());
    let mut swapped = std::fs::read(&path).unwrap();
    swapped[CHUNK_SIZE as usize + 3] ^= 0x10;
    let tmp = dir.path().join("swap");
    std::fs::write(&tmp, &swapped).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    let e = s.open_read("hot").unwrap().all().unwrap_err();
    assert!(matches!(&e, StoreError::Corrupt { .. }) && e.to_string().contains("chunk 1"), "{e}");

    // Rot in place under a kept mapping is caught by the next reader of it.
    bs_store::put_bytes(&s, &RouteSpec { overwrite: true, ..spec("hot") }, &good).unwrap();
    s.open_read("hot").unwrap();
    let kept = s.open_read("hot").unwrap();
    assert_eq!(&kept.all().unwrap()[..], &good[..]);
    s.damage("hot", 2 * CHUNK_SIZE + 1, 0x10).unwrap();
    let e = kept.all().unwrap_err();
    assert!(e.to_string().contains("chunk 2"), "{e}");
    drop(kept);
    let e = s.open_read("hot").unwrap_err();
    assert!(e.to_string().contains("corrupt"), "marked: {e}");

    // Deleted: the store lets go of its file (no descriptor or mapping keeps its space).
    bs_store::put_bytes(&s, &RouteSpec { overwrite: true, ..spec("hot") }, &good).unwrap();
    s.open_read("hot").unwrap();
    s.open_read("hot").unwrap();
    let path = only_blob_file(dir.path());
    assert_eq!(held_open(&path), 1, "kept open after two reads");
    s.delete("hot").unwrap();
    assert_eq!(held_open(&path), 0, "let go once deleted");
}

#[test]
fn a_read_that_needs_no_waiting_is_opened_at_once_and_any_other_is_left_to_open_read() {
    let dir = tempfile::tempdir().unwrap();
    let s = FsStore::open(dir.path()).unwrap();
    assert!(matches!(s.open_read_at_once("missing"), Some(Err(StoreError::NotFound(_)))));
    assert!(matches!(s.open_read_at_once("../up"), Some(Err(StoreError::InvalidName { .. }))));

    // Kept in its catalogue row: at once, and in memory.
    let small = data(1000, 1);
    bs_store::put_bytes(&s, &spec("small"), &small).unwrap();
    let src = s.open_read_at_once("small").unwrap().unwrap();
    assert!(src.resident(0, 1000));
    assert_eq!(&src.all().unwrap()[..], &small[..]);

    // A blob file: not before a reader has left it open and mapped.
    let size = CHUNK_SIZE as usize;
    let hot = data(size, 2);
    bs_store::put_bytes(&s, &spec("hot"), &hot).unwrap();
    assert!(s.open_read_at_once("hot").is_none(), "its file is still to be opened");
    let copied = s.open_read("hot").unwrap();
    assert!(!copied.is_mapped() && !copied.resident(0, 1), "read with pread: never resident");
    assert_eq!(&s.open_read("hot").unwrap().all().unwrap()[..], &hot[..]);
    let src = s.open_read_at_once("hot").expect("kept by the second reader").unwrap();
    assert!(src.is_mapped() && src.resident(0, size as u64));
    assert_eq!(&src.all().unwrap()[..], &hot[..]);

    // Rot under the kept mapping is still caught when opened at once, and marks the blob.
    s.damage("hot", 7, 0x10).unwrap();
    let e = s.open_read_at_once("hot").unwrap().unwrap().all().unwrap_err();
    assert!(e.to_string().contains("chunk 0"), "{e}");
    let e = s.open_read_at_once("hot").unwrap().unwrap_err();
    assert!(e.to_string().contains("marked corrupt"), "{e}");

    // Pages not in the page cache are not resident: a mapped file whose pages were dropped
    // (committed blob files are synced, so a disk file system drops them when asked), until
    // read.
    let size = 6 * CHUNK_SIZE as usize;
    let big = data(size, 3);
    bs_store::put_bytes(&s, &spec("big"), &big).unwrap();
    let path = std::fs::read_dir(dir.path().join("blobs"))
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .find(|p| std::fs::metadata(p).unwrap().len() == size as u64)
        .unwrap();
    let f = std::fs::File::open(&path).unwrap();
    // SAFETY: advice on an open descriptor; no memory is touched.
    let rc = unsafe {
        libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_DONTNEED)
    };
    assert_eq!(rc, 0);
    let src = s.open_read("big").unwrap();
    assert!(src.is_mapped(), "large enough to be mapped on its first read");
    let last = (size - CHUNK_SIZE as usize) as u64;
    assert!(!src.resident(0, 1) && !src.resident(last, 1), "dropped");
    assert_eq!(&src.bytes(0, 10).unwrap()[..], &big[..10]);
    assert!(src.resident(0, CHUNK_SIZE), "read (and the kernel's readahead, if any)");
    assert!(!src.resident(size as u64, 1), "past the end");
}

/// Whether any of this process's descriptors or mappings refers to `path` (deleted or not):
/// 1 or 0.
fn held_open(path: &std::path::Path) -> usize {
    let name = path.to_string_lossy().to_string();
    let fds = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with(&name))
        .count();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mapped = maps.lines().filter(|l| l.contains(&name)).count();
    usize::from(fds > 0 || mapped > 0)
}

#[test]
fn rot_in_the_bucket_is_caught() {
    let s = common::s3_store();
    let handle = s.clone();
    rot_is_caught(&s, &move |name, off| handle.damage(name, off, 0x10).unwrap());
    // Longer than a read window, the bad chunk in the second: the pieces past the window
    // the first read fetched come from one GET streamed chunk by chunk, which stops at the
    // bad chunk.
    let s = common::s3_store();
    let handle = s.clone();
    let damage = move |name: &str, off| handle.damage(name, off, 0x10).unwrap();
    let window = bs_store::REMOTE_WINDOW / CHUNK_SIZE;
    let size = (bs_store::REMOTE_WINDOW + 3 * CHUNK_SIZE) as usize + 77;
    rot_in_a_blob_of(size, window + 1, &s, &damage);
}

/// A small remote range handed out as it arrives (`BlobSource::arriving`): every byte is the
/// blob's; a bad chunk ends the stream with an error before its last byte is handed out, so
/// its receiver never sees the end of a range that did not check, and the blob is marked.
#[test]
fn an_early_stream_from_the_bucket_hands_out_the_blob_and_stops_at_rot() {
    let s = common::s3_store();
    let size = 3 * CHUNK_SIZE as usize + 77;
    let good = data(size, 6);
    bs_store::put_bytes(&s, &spec("early"), &good).unwrap();
    let collect = |src: &bs_store::BlobSource, from: u64, len: u64| {
        let mut got = Vec::new();
        let mut end = None;
        for p in src.arriving(from, len).unwrap() {
            match p {
                Ok(b) => got.extend_from_slice(&b),
                Err(e) => end = Some(e),
            }
        }
        (got, end)
    };
    let src = s.open_read("early").unwrap();
    assert!(matches!(src.arriving(0, 1).unwrap(), bs_store::Arriving::Early(_)));
    for (from, len) in [(0, size as u64), (5, CHUNK_SIZE), (CHUNK_SIZE + 1, 2 * CHUNK_SIZE)] {
        let (got, end) = collect(&src, from, len);
        assert!(end.is_none(), "{from}+{len}: {end:?}");
        assert_eq!(&got[..], &good[from as usize..(from + len) as usize], "{from}+{len}");
    }
    drop(src);

    // Chunk 1 damaged near its end: a range ending inside chunk 1, before the damage, does
    // not hand out its end (its last piece waits for chunk 1's check), then the error.
    s.damage("early", 2 * CHUNK_SIZE - 3, 0x10).unwrap();
    let src = s.open_read("early").unwrap();
    let (got, end) = collect(&src, 0, CHUNK_SIZE + 10);
    assert!(matches!(end, Some(StoreError::Corrupt { .. })), "{end:?}");
    assert!(got.len() as u64 <= CHUNK_SIZE + 10 && got[..] == good[..got.len()]);
    assert!(got.len() < CHUNK_SIZE as usize + 10, "the range's end was handed out");
    // The whole blob: the error comes before chunk 1's last byte.
    let (got, end) = collect(&src, 0, size as u64);
    assert!(matches!(end, Some(StoreError::Corrupt { .. })), "{end:?}");
    assert!(got.len() < 2 * CHUNK_SIZE as usize && got[..] == good[..got.len()]);
    drop(src);
    let e = s.open_read("early").unwrap_err();
    assert!(e.to_string().contains("chunk 1"), "marked: {e}");
}

#[test]
fn a_restored_file_is_cleared_by_the_scrubber_and_the_mark_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let size = CHUNK_SIZE + 9;
    {
        let s = FsStore::open(dir.path()).unwrap();
        bs_store::put_bytes(&s, &spec("a"), &data(size as usize, 3)).unwrap();
        s.damage("a", 7, 0x10).unwrap();
        assert!(s.open_read("a").unwrap().all().is_err());
    }
    let s = FsStore::open(dir.path()).unwrap();
    assert!(matches!(s.open_read("a"), Err(StoreError::Corrupt { .. })), "marked on disk");
    s.damage("a", 7, 0x10).unwrap(); // the administrator restores the file
    assert!(matches!(s.open_read("a"), Err(StoreError::Corrupt { .. })), "until scrubbed");
    assert!(s.scrub_blob("a", &mut |_| true).unwrap());
    assert_eq!(&s.open_read("a").unwrap().all().unwrap()[..], &data(size as usize, 3)[..]);
}

#[test]
fn blobs_from_before_chunk_digests_are_checked_whole_then_get_them() {
    let dir = tempfile::tempdir().unwrap();
    let size = 2 * CHUNK_SIZE + 1;
    {
        let s = FsStore::open(dir.path()).unwrap();
        bs_store::put_bytes(&s, &spec("old"), &data(size as usize, 4)).unwrap();
        bs_store::put_bytes(&s, &spec("rotten"), &data(size as usize + 1, 5)).unwrap();
        s.damage("rotten", 3, 0x10).unwrap();
    }
    let db = rusqlite::Connection::open(dir.path().join("meta.db")).unwrap();
    db.execute("UPDATE blobs SET chunks = NULL", []).unwrap();
    drop(db);
    let s = FsStore::open(dir.path()).unwrap();
    assert_eq!(&s.open_read("old").unwrap().all().unwrap()[..], &data(size as usize, 4)[..]);
    let e = s.open_read("rotten").unwrap_err();
    assert!(e.to_string().contains("whole-blob digest"), "{e}");
    let db = rusqlite::Connection::open(dir.path().join("meta.db")).unwrap();
    let has: i64 = db
        .query_row("SELECT count(*) FROM blobs WHERE chunks IS NOT NULL", [], |r| r.get(0))
        .unwrap();
    assert_eq!(has, 1, "the sound blob got its chunk digests");
}

/// A tmpfs of `bytes` mounted on a fresh directory, unmounted on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(bytes: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs needs root (the test suite runs as root on CI machines)");
        Self(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn delete_on_a_full_disk_leaves_no_phantom_row() {
    let t = Tmpfs::mount(16 << 20);
    let root = t.0.path().join("data");
    let s = FsStore::open(&root).unwrap();
    for i in 0..3 {
        bs_store::put_bytes(&s, &spec(&format!("b{i}")), &data(2 << 20, i)).unwrap();
    }
    // Fill the disk to the last byte.
    let filler = t.0.path().join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![7u8; 64 << 10];
        while f.write_all(&block).is_ok() {}
        while f.write_all(&[7]).is_ok() {}
        let _ = f.sync_all();
    }
    // The room kept for deletes lets the first through, and what it frees the others.
    for i in 0..3 {
        let name = format!("b{i}");
        s.delete(&name).unwrap();
        assert!(matches!(s.stat(&name), Err(StoreError::NotFound(_))));
    }
    assert!(root.join("reserve").exists(), "the room is kept again once space is freed");
    let listed: Vec<String> = s.list("", "", 10).unwrap().into_iter().map(|r| r.name).collect();
    drop(s);
    std::fs::remove_file(&filler).unwrap();
    let s = FsStore::open(&root).unwrap();
    let after: Vec<String> = s.list("", "", 10).unwrap().into_iter().map(|r| r.name).collect();
    assert_eq!(listed, after, "what a restart lists is what was listed");
    for name in after {
        assert!(s.open_read(&name).unwrap().all().is_ok(), "{name} listed and readable");
    }
}

#[test]
fn a_disk_filled_by_blobs_can_always_be_freed_by_a_delete() {
    let t = Tmpfs::mount(16 << 20);
    let s = FsStore::open(t.0.path().join("data")).unwrap();
    let mut stored = 0;
    // Unsized uploads (no up-front space check) until the disk says no.
    let full = loop {
        let mut sp = spec(&format!("f{stored}"));
        sp.size = None;
        match bs_store::put_bytes(&s, &sp, &data(1 << 20, stored as u8)) {
            Ok(_) => stored += 1,
            Err(e) => break e,
        }
        assert!(stored < 64, "a 16 MiB disk cannot take 64 MiB");
    };
    assert!(matches!(full, StoreError::StorageFull(_)), "{full}");
    assert!(stored > 0);
    s.delete("f0").expect("the catalogue kept room to commit a delete");
    assert!(matches!(s.stat("f0"), Err(StoreError::NotFound(_))));
    bs_store::put_bytes(&s, &spec("after"), &data(1 << 20, 9)).expect("the space came back");
}

/// A blob of one chunk takes its chunk digest from its whole digest (no pass of its own), a
/// longer one reads its first chunk back once bytes past it arrive: either way the digests
/// are those of the bytes, and rot in the first chunk is caught. Written in pieces, committed
/// with the whole digest (as the data plane does) and without (as `put_bytes` does).
#[test]
fn chunk_digests_written_in_pieces_catch_rot_in_the_first_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let fs = FsStore::open(dir.path()).unwrap();
    let mem = MemStore::new();
    let fs_damage = |name: &str| fs.damage(name, 5, 0x10).unwrap();
    let mem_damage = |name: &str| mem.damage(name, 5, 0x10).unwrap();
    type Damage<'a> = &'a dyn Fn(&str);
    let stores: [(&dyn Store, Damage); 2] = [(&fs, &fs_damage), (&mem, &mem_damage)];
    // Kept in the catalogue row, held in memory, staged in a file; the edges of one chunk.
    let sizes = [200, 241, 50_000, 700_000, CHUNK_SIZE as usize, 2 * CHUNK_SIZE as usize + 5];
    for (k, (s, damage)) in stores.iter().enumerate() {
        for size in sizes {
            for whole in [false, true] {
                let name = format!("s{k}-{size}-{whole}");
                let good = data(size, 3);
                let sp = RouteSpec { size: Some(size as u64), ..spec(&name) };
                s.route(&sp).unwrap();
                let mut up = s.open_upload(&name).unwrap();
                for (i, piece) in good.chunks(100_000).enumerate() {
                    up.write_at(i as u64 * 100_000, piece).unwrap();
                }
                let digest = bs_wire::DigestAlgo::default().digest(&good);
                let read_back = fs.commit_read_back();
                up.commit(whole.then(|| digest.clone())).unwrap();
                // A file's bytes are read back at commit only to digest them for a writer
                // that gave no digest: the chunk digests were taken as they were written.
                let file = k == 0 && size as u64 > bs_store::INLINE_UP_TO;
                let want = if file && !whole { size as u64 } else { 0 };
                assert_eq!(fs.commit_read_back() - read_back, want, "{name}");
                let src = s.open_read(&name).unwrap();
                assert_eq!(src.chunk_digests(), &bs_wire::ChunkDigests::of(&good), "{name}");
                assert_eq!(src.record().digest, digest.to_string(), "{name}");
                assert!(src.all().unwrap() == good, "{name}");
                drop(src);
                damage(&name);
                let e = s.open_read(&name).and_then(|src| src.all()).unwrap_err();
                assert!(e.to_string().contains("chunk 0"), "{name}: {e}");
            }
        }
    }
}
