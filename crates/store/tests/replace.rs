//! Replacing a blob on the filesystem store: the replaced blob's file is removed — a large one
//! by a thread of its own once the commit has returned, a small one at once — and only the new
//! blob's bytes remain, read back whole.

use std::path::PathBuf;
use std::time::{Duration, Instant};

mod common;

use bs_store::{FsStore, RouteSpec, Store, put_bytes};
use common::blob_files;

fn read_back(s: &FsStore, name: &str) -> Vec<u8> {
    let src = s.open_read(name).unwrap();
    let mut out = Vec::new();
    for piece in src.pieces(0, src.size()).unwrap() {
        out.extend_from_slice(&piece.unwrap());
    }
    out
}

fn replace(s: &FsStore, name: &str, data: &[u8]) {
    let spec = RouteSpec { name: name.into(), overwrite: true, ..Default::default() };
    put_bytes(s, &spec, data).unwrap();
}

#[test]
fn a_replaced_blob_file_is_removed_and_the_new_bytes_remain() {
    let dir = tempfile::tempdir().unwrap();
    let s = FsStore::open(dir.path()).unwrap();
    // (Not smaller: a blob of up to `INLINE_UP_TO` bytes has no file; see `inline.rs`.)
    for (size, what) in [(64usize << 20, "large"), (1 << 20, "small")] {
        let name = format!("scan-{what}");
        let others = blob_files(dir.path());
        replace(&s, &name, &vec![7u8; size]);
        let before: Vec<PathBuf> =
            blob_files(dir.path()).into_iter().filter(|p| !others.contains(p)).collect();
        assert_eq!(before.len(), 1, "the {what} blob's file");
        let newer = vec![9u8; size + 1];
        replace(&s, &name, &newer);
        // The old file goes: at once for a small blob, within a bounded wait (polled) for a
        // large one, whose removal does not hold back the commit.
        let gone = Instant::now() + Duration::from_secs(60);
        while before.iter().any(|p| p.exists()) {
            assert!(Instant::now() < gone, "the replaced {what} blob's file is still there");
            assert_eq!(what, "large", "a small replaced file is removed before the commit returns");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(blob_files(dir.path()).len(), others.len() + 1, "one file per blob");
        assert!(read_back(&s, &name) == newer, "the {what} blob reads back as its new bytes");
    }
}
