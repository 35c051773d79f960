//! What only the object-storage store does: multipart uploads of large blobs, resumes and
//! rollbacks around parts already sent, objects lost or left behind in the bucket, clear
//! errors for a wrong key, a missing bucket or a server that is down, and several front ends
//! sharing one bucket and one PostgreSQL catalogue. Against a real Garage server.

mod common;

use std::time::Duration;

use bs_meta::{Catalogue, CommitIntent};
use bs_store::{ObjStore, PART_SIZE, RouteSpec, S3Config, Store, StoreError};
use bs_wire::CHUNK_SIZE;
use object_store::ObjectStore;

fn spec(name: &str, size: Option<u64>) -> RouteSpec {
    RouteSpec { name: name.into(), size, ..Default::default() }
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed ^ (i >> 16) as u8)).collect()
}

fn read_all(s: &dyn Store, name: &str) -> Vec<u8> {
    s.open_read(name).unwrap().all().unwrap().to_vec()
}

/// Write `bytes` from `from` in 1 MiB writes.
fn write_in_pieces(w: &mut dyn bs_store::UploadSink, bytes: &[u8], from: usize) {
    for (k, piece) in bytes[from..].chunks(1 << 20).enumerate() {
        w.write_at((from + k * (1 << 20)) as u64, piece).unwrap();
    }
}

/// A blob of up to `INLINE_UP_TO` bytes is committed in its catalogue row: the bucket never
/// holds it, it reads back and is checked like any other (rot in the row is caught), and
/// replacing it by a blob with an object and back leaves no object behind.
#[test]
fn a_small_blob_lives_in_its_catalogue_row_and_never_in_the_bucket() {
    let prefix = common::fresh_prefix();
    let cfg = common::s3_config(&prefix);
    let s = ObjStore::open_s3(&cfg, Catalogue::open_in_memory().unwrap()).unwrap();
    let client = cfg.build().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The blobs' objects (not the prefix's `.catalogue` mark).
    let objects = || -> Vec<String> {
        use futures_util::StreamExt;
        let p = object_store::path::Path::from(prefix.as_str());
        rt.block_on(async {
            let listed: Vec<_> = client.list(Some(&p)).collect().await;
            let names = listed.into_iter().map(|m| m.unwrap().location.to_string());
            names.filter(|n| !n.ends_with("/.catalogue")).collect()
        })
    };
    let edge = data(bs_store::INLINE_UP_TO as usize, 5);
    bs_store::put_bytes(&s, &spec("small", None), &edge).unwrap();
    bs_store::put_bytes(&s, &spec("empty", None), b"").unwrap();
    assert!(objects().is_empty(), "{:?}", objects());
    assert_eq!(read_all(&s, "small"), edge);
    assert_eq!(read_all(&s, "empty"), b"");

    let over = |d: &[u8]| {
        let sp = RouteSpec { overwrite: true, ..spec("small", None) };
        bs_store::put_bytes(&s, &sp, d).unwrap();
    };
    let big = data(bs_store::INLINE_UP_TO as usize + 1, 6);
    over(&big);
    assert_eq!(objects().len(), 1);
    assert_eq!(read_all(&s, "small"), big);
    over(&edge);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !objects().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the replaced object stays: {:?}", objects());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(read_all(&s, "small"), edge);

    s.damage("small", 1000, 0x08).unwrap();
    let e = s.open_read("small").unwrap().all().unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
    assert!(matches!(s.open_read("small"), Err(StoreError::Corrupt { .. })), "marked");
    s.delete("small").unwrap();
    assert!(matches!(s.open_read("small"), Err(StoreError::NotFound(_))));
}

#[test]
fn a_small_blob_received_in_place_keeps_what_arrived_and_no_more() {
    let s = common::s3_store();
    let body = data(300_000, 9);
    s.route(&spec("lent", Some(body.len() as u64))).unwrap();
    let mut w = s.open_upload("lent").unwrap();
    // A receiver reads into the upload's own buffer: a read cut short keeps what arrived.
    let dst = w.lend(0, 200_000).expect("a small blob of known size is lent");
    dst.copy_from_slice(&body[..200_000]);
    w.filled(0, 150_000);
    assert_eq!(w.received(), 150_000);
    assert!(w.lend(160_000, 10).is_none(), "not past what arrived");
    assert!(w.lend(150_000, 200_000).is_none(), "not past the declared size");
    // A rollback, then the rest in place and by copy.
    w.truncate(100_000).unwrap();
    w.lend(100_000, 100_000).unwrap().copy_from_slice(&body[100_000..200_000]);
    w.filled(100_000, 100_000);
    w.write_at(200_000, &body[200_000..]).unwrap();
    let rec = w.commit(None).unwrap();
    assert_eq!(rec.digest, s.digest_algo().digest(&body).to_string());
    assert_eq!(read_all(&s, "lent"), body);
}

/// A small blob's PUT carries a CRC-32 taken as its bytes arrive (the server checks it
/// against what it receives): bytes rolled back and written again otherwise must be what
/// is checked and stored, whether they came by copy or in place.
#[test]
fn a_small_blob_written_differently_after_a_rollback_is_stored_as_it_ends() {
    let s = common::s3_store();
    let (first, last) = (data(300_000, 11), data(300_000, 12));
    let mut want = first[..100_000].to_vec();
    want.extend_from_slice(&last[100_000..]);
    s.route(&spec("again", Some(300_000))).unwrap();
    let mut w = s.open_upload("again").unwrap();
    w.write_at(0, &first[..250_000]).unwrap();
    w.truncate(100_000).unwrap();
    w.lend(100_000, 100_000).unwrap().copy_from_slice(&last[100_000..200_000]);
    w.filled(100_000, 100_000);
    w.write_at(200_000, &last[200_000..]).unwrap();
    let rec = w.commit(None).unwrap();
    assert_eq!(rec.digest, s.digest_algo().digest(&want).to_string());
    assert_eq!(read_all(&s, "again"), want);
}

#[test]
fn a_blob_in_parts_is_received_in_place_within_each_part() {
    let s = common::s3_store();
    let body = data(2 * PART_SIZE + 300, 10);
    // Frames of 3 MiB: two of them cross a part's end and are copied; of 4 MiB: each
    // part is filled in place, and sent as its last frame arrives.
    for (frame, lent_frames) in [(3usize << 20, 4), (4 << 20, 5)] {
        let name = format!("parts{frame}");
        s.route(&spec(&name, Some(body.len() as u64))).unwrap();
        let mut w = s.open_upload(&name).unwrap();
        let (mut at, mut lent) = (0, 0);
        while at < body.len() {
            let n = frame.min(body.len() - at);
            match w.lend(at as u64, n as u64) {
                Some(dst) => {
                    dst.copy_from_slice(&body[at..at + n]);
                    w.filled(at as u64, n as u64);
                    lent += 1;
                }
                None => w.write_at(at as u64, &body[at..at + n]).unwrap(),
            }
            at += n;
            assert_eq!(w.received(), at as u64);
        }
        assert_eq!(lent, lent_frames, "frames of {frame} bytes received in place");
        let rec = w.commit(None).unwrap();
        assert_eq!(rec.digest, s.digest_algo().digest(&body).to_string());
        assert_eq!(read_all(&s, &name), body);
    }
    // An upload whose multipart upload was started as it opened, given up before a part
    // went up: aborted, and the name can be put again.
    s.route(&spec("given-up", Some(PART_SIZE as u64 + 1))).unwrap();
    drop(s.open_upload("given-up").unwrap());
    s.abort("given-up").unwrap();
    assert!(matches!(s.open_upload("given-up"), Err(StoreError::NoUpload(_))));
    bs_store::put_bytes(&s, &spec("given-up", None), &body[..PART_SIZE + 1]).unwrap();
    assert_eq!(read_all(&s, "given-up"), &body[..PART_SIZE + 1]);
}

#[test]
fn large_blobs_go_up_in_parts_and_read_back_verified() {
    let s = common::s3_store();
    let body = data(3 * PART_SIZE + 12_345, 1);
    s.route(&spec("big", Some(body.len() as u64))).unwrap();
    let mut w = s.open_upload("big").unwrap();
    write_in_pieces(&mut *w, &body, 0);
    let rec = w.commit(None).unwrap();
    assert_eq!(rec.size, body.len() as u64);
    assert_eq!(rec.digest, s.digest_algo().digest(&body).to_string());
    assert_eq!(read_all(&s, "big"), body);
    // Ranges anywhere, across part and window boundaries.
    let src = s.open_read("big").unwrap();
    for (off, len) in [(0, 10), (PART_SIZE as u64 - 3, 7), (2 * PART_SIZE as u64 + 5, 1 << 20)] {
        let got = src.bytes(off, len).unwrap();
        assert_eq!(&got[..], &body[off as usize..(off + len) as usize]);
    }
    // Read in order (streamed windows): a range longer than a window, starting and ending
    // inside chunks, and the whole blob.
    let (off, len) = (PART_SIZE as u64 / 2 + 3, bs_store::REMOTE_WINDOW + 2 * CHUNK_SIZE + 5);
    // Windows of 8 MiB from the first chunk touched to the last: none past the range.
    let windows = |from: u64, to: u64| (to - from).div_ceil(bs_store::REMOTE_WINDOW);
    let chunk_end = |at: u64| (at.div_ceil(CHUNK_SIZE) * CHUNK_SIZE).min(body.len() as u64);
    for (off, len) in [(off, len), (0, body.len() as u64)] {
        let before = s.read_counts();
        let src = s.open_read("big").unwrap();
        let got: Vec<u8> = src.pieces(off, len).unwrap().flat_map(|p| p.unwrap()).collect();
        assert!(got == body[off as usize..(off + len) as usize], "{off}+{len}: other bytes");
        let after = s.read_counts();
        let first = off / CHUNK_SIZE * CHUNK_SIZE;
        assert_eq!(after.0 - before.0, windows(first, chunk_end(off + len)), "{off}+{len}");
        assert_eq!(after.1, before.1, "no GET broke");
    }
    // A run left after one piece, then a read reaching past it on the same source: read
    // whole, not cut short at the run's end.
    let src = s.open_read("big").unwrap();
    let run = bs_store::REMOTE_WINDOW + 2 * CHUNK_SIZE;
    assert!(src.pieces(0, run).unwrap().next().unwrap().is_ok());
    let (off, len) = (CHUNK_SIZE, 2 * bs_store::REMOTE_WINDOW);
    let got = src.bytes(off, len).unwrap();
    assert!(got[..] == body[off as usize..(off + len) as usize], "read past the run");
    // Unknown size: parts as it grows, the size it reaches.
    s.route(&spec("stream", None)).unwrap();
    let mut w = s.open_upload("stream").unwrap();
    let body2 = data(PART_SIZE + 99, 2);
    write_in_pieces(&mut *w, &body2, 0);
    assert_eq!(w.commit(None).unwrap().size, body2.len() as u64);
    assert_eq!(read_all(&s, "stream"), body2);
}

/// A reader that stops mid-read for longer than the store's request timeout: no GET is held
/// open waiting for it (each window is fetched whole into memory, the chunks handed out as
/// they come), and every byte still arrives, in order, checked. Written through a store with
/// the default timeout, read through one with a 3 s timeout on the same catalogue (a whole
/// request's limit: a window's GET must fit in it on a loaded machine).
#[test]
fn a_reader_pausing_longer_than_the_request_timeout_reads_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("catalogue.db");
    let mut cfg = common::s3_config(&common::fresh_prefix());
    let writer = ObjStore::open_s3(&cfg, Catalogue::open(&db).unwrap()).unwrap();
    // Longer than the windows a reader has in flight together.
    let body = data(48 * CHUNK_SIZE as usize + 321, 7);
    bs_store::put_bytes(&writer, &spec("slow", None), &body).unwrap();
    cfg.timeout = Some(Duration::from_secs(3));
    let reader = ObjStore::open_s3(&cfg, Catalogue::open(&db).unwrap()).unwrap();
    let src = reader.open_read("slow").unwrap();
    let mut got = Vec::with_capacity(body.len());
    for (k, piece) in src.pieces(0, body.len() as u64).unwrap().enumerate() {
        got.extend_from_slice(&piece.unwrap());
        if k == 1 || k == 20 {
            std::thread::sleep(Duration::from_millis(3500));
        }
    }
    assert!(got == body, "the bytes read back differ");
    let (windows, broken) = reader.read_counts();
    assert_eq!(windows, body.len().div_ceil(bs_store::REMOTE_WINDOW as usize) as u64);
    assert_eq!(broken, 0, "no GET waited on the reader and broke");
}

/// A writer whose bytes digest to something other than the digest it commits with (a small
/// blob, stored with one PUT sent while its digest is computed, and one of 9 MiB, stored in
/// parts) is refused as corrupt and nothing becomes visible; sent again — as a new upload, and
/// as a resume of the same one, which keeps its object key — it lands.
#[test]
fn a_commit_under_another_digest_is_refused_and_nothing_lands() {
    let s = common::s3_store();
    let cases =
        [("d/small", 5usize, ""), ("d/parts", PART_SIZE + (1 << 20), ""), ("d/resumed", 5, "r1")];
    for (name, size, tag) in cases {
        let body = data(size, 3);
        let mut other = body.clone();
        other[size / 2] ^= 1;
        let sp = RouteSpec { resume_tag: tag.into(), ..spec(name, Some(size as u64)) };
        s.route(&sp).unwrap();
        let mut w = s.open_upload(name).unwrap();
        write_in_pieces(&mut *w, &body, 0);
        let err = w.commit(Some(s.digest_algo().digest(&other))).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{name}: {err}");
        assert!(matches!(s.stat(name), Err(StoreError::NotFound(_))), "{name}");
        assert!(s.list("d/", "", 10).unwrap().iter().all(|r| r.name != name), "{name}");
        let again = s.route(&sp).unwrap();
        assert_eq!(again.received, 0, "{name}: nothing of a refused commit is kept");
        assert_eq!(again.resumed, !tag.is_empty(), "{name}");
        let mut w = s.open_upload(name).unwrap();
        write_in_pieces(&mut *w, &body, 0);
        w.commit(Some(s.digest_algo().digest(&body))).unwrap();
        assert!(read_all(&s, name) == body, "{name}: other bytes read back");
    }
}

#[test]
fn a_resume_continues_after_parts_and_a_rollback_into_them_starts_over() {
    let s = common::s3_store();
    let body = data(2 * PART_SIZE + 500, 3);
    let mut sp = spec("r", Some(body.len() as u64));
    sp.resume_tag = "v1".into();
    s.route(&sp).unwrap();
    {
        let mut w = s.open_upload("r").unwrap();
        write_in_pieces(&mut *w, &body[..PART_SIZE + 4096], 0);
    } // the writer vanished after one part went up
    let routed = s.route(&sp).unwrap();
    assert!(routed.resumed);
    assert_eq!(routed.received, PART_SIZE as u64 + 4096);
    let prefix = &body[..routed.received as usize];
    assert_eq!(routed.received_digest, Some(s.digest_algo().digest(prefix)));
    let mut w = s.open_upload("r").unwrap();
    // A failed check rolls back to before the part that went up: everything goes.
    w.truncate(100).unwrap();
    assert_eq!(w.received(), 0, "bytes sent as parts cannot be kept in part");
    write_in_pieces(&mut *w, &body, 0);
    w.commit(None).unwrap();
    assert_eq!(read_all(&s, "r"), body);
}

#[test]
fn a_lost_object_is_corrupt_not_empty_and_orphans_are_collected() {
    let prefix = common::fresh_prefix();
    let cfg = common::s3_config(&prefix);
    let s = ObjStore::open_s3(&cfg, Catalogue::open_in_memory().unwrap()).unwrap();
    bs_store::put_bytes(&s, &spec("kept", None), b"kept bytes").unwrap();
    // (Larger than a blob kept in its catalogue row, which has no object to lose.)
    let lost = data(bs_store::INLINE_UP_TO as usize + 1, 3);
    bs_store::put_bytes(&s, &spec("lost", None), &lost).unwrap();
    s.lose("lost").unwrap();
    assert!(s.lose("kept").is_err(), "kept in its row");
    let e = s.open_read("lost").unwrap().all().unwrap_err();
    assert!(matches!(&e, StoreError::Corrupt { reason, .. } if reason.contains("missing")), "{e}");
    assert!(matches!(s.open_read("lost"), Err(StoreError::Corrupt { .. })), "marked");
    assert!(s.stat("lost").is_ok(), "still listed, to be dealt with");
    // Long enough to be streamed: the GET's "not found" is reported the same way.
    let long = data((bs_store::REMOTE_WINDOW + CHUNK_SIZE) as usize + 5, 4);
    bs_store::put_bytes(&s, &spec("lost-long", None), &long).unwrap();
    s.lose("lost-long").unwrap();
    let first = s.open_read("lost-long").unwrap().pieces(0, long.len() as u64).unwrap().next();
    let e = first.unwrap().unwrap_err();
    assert!(matches!(&e, StoreError::Corrupt { reason, .. } if reason.contains("missing")), "{e}");
    assert_eq!(s.read_counts().1, 1, "the streamed GET's failure, then the plain GET's");

    // An object no row references (a crash between upload and commit).
    let client = cfg.build().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let put = |key: &str| {
        let key = object_store::path::Path::from(format!("{prefix}/{key}"));
        rt.block_on(client.put(&key, bytes::Bytes::from_static(b"partial").into())).unwrap();
        key
    };
    let orphan = put("0123456789abcdef0123456789abcdef");
    // Not the store's to collect: other names, keys under a deeper prefix.
    let foreign = [put("notes.txt"), put("0123456789abcdef0123456789abcdef/x")];
    assert_eq!(s.collect_garbage(bs_store::ORPHAN_AGE).unwrap(), 0, "young: maybe committing");
    assert_eq!(s.collect_garbage(Duration::ZERO).unwrap(), 1);
    assert!(rt.block_on(client.head(&orphan)).is_err(), "gone");
    for key in &foreign {
        assert!(rt.block_on(client.head(key)).is_ok(), "{key} left alone");
    }
    assert_eq!(read_all(&s, "kept"), b"kept bytes");
    // A front end with another catalogue on the same prefix would see every object as an
    // orphan: it is refused before it collects anything.
    let e = ObjStore::open_s3(&cfg, Catalogue::open_in_memory().unwrap()).err().unwrap();
    assert!(
        matches!(e, StoreError::Config(_)) && e.to_string().contains("another catalogue"),
        "{e}"
    );
    assert_eq!(read_all(&s, "kept"), b"kept bytes");
    let mut empty = cfg.clone();
    empty.prefix = "/".into();
    assert!(ObjStore::open_s3(&empty, Catalogue::open_in_memory().unwrap()).is_err());
}

/// The intent a commit of `body` as `name` at object id `id` writes before its bytes are
/// stored (see bs_meta's `intent`).
fn intent_of(s: &ObjStore, id: &str, name: &str, body: &[u8], overwrite: bool) -> CommitIntent {
    let mut chunks = bs_wire::ChunkHasher::new();
    chunks.update(body);
    CommitIntent {
        record: bs_meta::BlobRecord {
            name: name.into(),
            size: body.len() as u64,
            content_type: "application/octet-stream".into(),
            digest: s.digest_algo().digest(body).to_string(),
            created_ms: bs_meta::now_ms(),
            metadata: Default::default(),
        },
        location: id.into(),
        chunks: chunks.finish().encode(),
        overwrite,
        refuse_digests: Vec::new(),
    }
}

#[test]
fn a_commit_a_crash_lost_is_made_again_from_its_intent_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("catalogue.db");
    let prefix = common::fresh_prefix();
    let cfg = common::s3_config(&prefix);
    let s = ObjStore::open_s3(&cfg, Catalogue::open(&db).unwrap()).unwrap();
    let ow = |name: &str| RouteSpec { overwrite: true, ..spec(name, None) };
    bs_store::put_bytes(&s, &ow("scan"), b"first version").unwrap();
    bs_store::put_bytes(&s, &spec("kept", None), b"kept bytes").unwrap();
    // A put's commit is an intent made durable while the bytes go up, then a commit that
    // only reaches the WAL: once acknowledged, nothing is left of the intent.
    assert!(Catalogue::open(&db).unwrap().intents().unwrap().is_empty());
    let old = Catalogue::open(&db).unwrap().stored("scan").unwrap().unwrap().location;
    // What a crash that lost the WAL's unsynced commits leaves: intents whose objects are
    // (or are not) in the bucket, and no rows for them.
    let client = cfg.build().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let key = |id: &str| object_store::path::Path::from(format!("{prefix}/{id}"));
    let upload = |id: &str, body: &[u8]| {
        rt.block_on(client.put(&key(id), bytes::Bytes::copy_from_slice(body).into())).unwrap();
    };
    let second = data(300_000, 7);
    let (id2, id3, id4) = (
        "0000000000000000000000000000a002",
        "0000000000000000000000000000a003",
        "0000000000000000000000000000a004",
    );
    let cat = Catalogue::open(&db).unwrap();
    // Acknowledged: its PUT finished, its commit was lost.
    upload(id2, &second);
    assert!(cat.intend(&intent_of(&s, id2, "scan", &second, true)).unwrap());
    // Never stored (the crash came during its PUT): never acknowledged.
    assert!(cat.intend(&intent_of(&s, id3, "never-stored", b"gone", true)).unwrap());
    // Stored, but not allowed to replace what its name holds.
    upload(id4, b"not allowed");
    assert!(cat.intend(&intent_of(&s, id4, "kept", b"not allowed", false)).unwrap());
    // A first attempt's intent left behind (its PUT failed, and so did dropping it), then a
    // resend at the same key, stored, whose commit was lost: the resend's bytes are there,
    // and only its intent (here with other flags than the first's) says what they are.
    let id5 = "0000000000000000000000000000a005";
    assert!(cat.intend(&intent_of(&s, id5, "resent", b"first attempt!", true)).unwrap());
    upload(id5, b"second attempt");
    assert!(cat.intend(&intent_of(&s, id5, "resent", b"second attempt", false)).unwrap());
    drop(s);
    let s = ObjStore::open_s3(&cfg, cat).unwrap();
    assert_eq!(read_all(&s, "resent"), b"second attempt", "the later attempt describes the key");
    assert_eq!(read_all(&s, "scan"), second, "the lost commit is made again");
    assert!(rt.block_on(client.head(&key(&old))).is_err(), "the version it replaced is gone");
    assert!(matches!(s.stat("never-stored"), Err(StoreError::NotFound(_))));
    assert_eq!(read_all(&s, "kept"), b"kept bytes");
    assert!(rt.block_on(client.head(&key(id4))).is_err(), "the refused object is removed");
    assert!(Catalogue::open(&db).unwrap().intents().unwrap().is_empty(), "every intent settled");
    drop(s);
    // Settled for good: the next start finds the same.
    let s = ObjStore::open_s3(&cfg, Catalogue::open(&db).unwrap()).unwrap();
    assert_eq!(read_all(&s, "scan"), second);
    assert_eq!(read_all(&s, "kept"), b"kept bytes");
}

#[test]
fn a_wrong_key_a_missing_bucket_and_a_server_down_are_clear_errors() {
    let prefix = common::fresh_prefix();
    let open = |cfg: &S3Config| ObjStore::open_s3(cfg, Catalogue::open_in_memory().unwrap());
    let mut cfg = common::s3_config(&prefix);
    cfg.secret_access_key = "0".repeat(64);
    let e = open(&cfg).err().unwrap();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    assert!(!e.to_string().contains(&"0".repeat(64)), "never the secret: {e}");
    let mut cfg = common::s3_config(&prefix);
    cfg.bucket = "no-such-bucket".into();
    let e = open(&cfg).err().unwrap();
    assert!(e.to_string().contains("no-such-bucket"), "{e}");
    let mut cfg = common::s3_config(&prefix);
    cfg.endpoint = Some(format!("http://127.0.0.1:{}", bs_peers::free_port()));
    let e = open(&cfg).err().unwrap();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    assert!(
        format!("{cfg:?}").contains("(hidden)")
            && !format!("{cfg:?}").contains(&cfg.secret_access_key)
    );
}

/// Two front ends: one bucket prefix, one PostgreSQL catalogue.
fn two_front_ends() -> (ObjStore, ObjStore) {
    let prefix = common::fresh_prefix();
    let url = common::postgres().fresh_db().unwrap();
    let open = || {
        ObjStore::open_s3(&common::s3_config(&prefix), Catalogue::connect_postgres(&url).unwrap())
            .unwrap()
    };
    (open(), open())
}

#[test]
fn front_ends_sharing_a_bucket_and_a_catalogue_see_each_others_blobs() {
    let (a, b) = two_front_ends();
    bs_store::put_bytes(&a, &spec("study/1", None), b"one").unwrap();
    bs_store::put_bytes(&b, &spec("study/2", None), b"two").unwrap();
    for s in [&a, &b] {
        let names: Vec<_> = s.list("study/", "", 10).unwrap().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["study/1", "study/2"]);
        assert_eq!(read_all(s, "study/1"), b"one");
    }
    // A replace through one is what the other reads; a delete through one is seen by both.
    let mut sp = spec("study/1", None);
    sp.overwrite = true;
    bs_store::put_bytes(&b, &sp, b"one, again").unwrap();
    assert_eq!(read_all(&a, "study/1"), b"one, again");
    a.delete("study/2").unwrap();
    assert!(matches!(b.stat("study/2"), Err(StoreError::NotFound(_))));
    assert!(matches!(b.open_read("study/2"), Err(StoreError::NotFound(_))));

    // Both write one new name at once: one wins whole, the other is told: the name exists,
    // or its upload was taken over (busy) or ended (no upload) by the other's put.
    let outcomes: Vec<_> = std::thread::scope(|t| {
        let ha = t.spawn(|| bs_store::put_bytes(&a, &spec("same", None), &data(PART_SIZE + 7, 4)));
        let hb = t.spawn(|| bs_store::put_bytes(&b, &spec("same", None), &data(PART_SIZE + 9, 5)));
        vec![ha.join().unwrap(), hb.join().unwrap()]
    });
    let won: Vec<usize> = (0..2).filter(|&k| outcomes[k].is_ok()).collect();
    assert_eq!(won.len(), 1, "{outcomes:?}");
    let lost = &outcomes[1 - won[0]];
    assert!(
        matches!(
            lost,
            Err(StoreError::AlreadyExists(_) | StoreError::Busy(_) | StoreError::NoUpload(_))
        ),
        "{lost:?}"
    );
    let want = if won[0] == 0 { data(PART_SIZE + 7, 4) } else { data(PART_SIZE + 9, 5) };
    assert_eq!(read_all(&a, "same"), want);
    assert_eq!(read_all(&b, "same"), want);
}

#[test]
fn a_put_routed_again_through_another_front_end_loses_its_upload_whole() {
    let (a, b) = two_front_ends();
    let (first, second) = (data(PART_SIZE + 7, 7), data(PART_SIZE + 9, 8));
    a.route(&spec("same", Some(first.len() as u64))).unwrap();
    b.route(&spec("same", Some(second.len() as u64))).unwrap();
    // The first put's writer is told, and never writes into the second's upload: nor does
    // its retry (a client asks again when told busy), while the second is the name's upload.
    assert!(matches!(a.open_upload("same"), Err(StoreError::Busy(_))));
    assert!(matches!(a.open_upload("same"), Err(StoreError::Busy(_))));
    let mut w = b.open_upload("same").unwrap();
    write_in_pieces(&mut *w, &second, 0);
    w.commit(None).unwrap();
    assert_eq!(read_all(&a, "same"), second);
    assert_eq!(read_all(&b, "same"), second);
    assert!(matches!(a.open_upload("same"), Err(StoreError::NoUpload(_))));
    // Routed again, the name is the first front end's to write.
    let mut sp = spec("same", Some(first.len() as u64));
    sp.overwrite = true;
    a.route(&sp).unwrap();
    let mut w = a.open_upload("same").unwrap();
    write_in_pieces(&mut *w, &first, 0);
    w.commit(None).unwrap();
    assert_eq!(read_all(&b, "same"), first);
}

#[test]
fn an_upload_abandoned_by_a_dead_front_end_is_expired_by_another() {
    let (a, b) = two_front_ends();
    a.route(&spec("half", None)).unwrap();
    {
        let mut w = a.open_upload("half").unwrap();
        write_in_pieces(&mut *w, &data(PART_SIZE + 10, 6), 0); // a part went up
    }
    drop(a); // the front end dies
    assert!(matches!(b.stat("half"), Err(StoreError::NotFound(_))), "nothing partial visible");
    assert_eq!(b.expire_uploads(Duration::from_secs(3600)).unwrap(), Vec::<String>::new());
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(b.expire_uploads(Duration::ZERO).unwrap(), ["half"]);
    assert!(matches!(b.open_upload("half"), Err(StoreError::NoUpload(_))));
    assert!(b.list("", "", 10).unwrap().is_empty());
    // Routed again through the survivor, it starts over there and lands whole.
    b.route(&spec("half", None)).unwrap();
    let mut w = b.open_upload("half").unwrap();
    write_in_pieces(&mut *w, &data(PART_SIZE + 10, 6), 0);
    w.commit(None).unwrap();
    assert_eq!(read_all(&b, "half"), data(PART_SIZE + 10, 6));
}

#[test]
fn an_upload_routed_by_one_front_end_is_written_through_another() {
    let (a, b) = two_front_ends();
    let mut sp = spec("moved", Some(5));
    sp.resume_tag = "t".into();
    a.route(&sp).unwrap();
    a.open_upload("moved").unwrap().write_at(0, b"ab").unwrap();
    // The other front end cannot read back a's unsent bytes: it starts over, and says so.
    let routed = b.route(&sp).unwrap();
    assert!(!routed.resumed);
    let mut w = b.open_upload("moved").unwrap();
    assert_eq!(w.received(), 0);
    w.write_at(0, b"abcde").unwrap();
    w.commit(None).unwrap();
    assert_eq!(read_all(&a, "moved"), b"abcde");
}

#[test]
fn postgres_down_mid_request_is_unavailable_and_nothing_half_visible() {
    let mut pg = bs_peers::Postgres::start().unwrap();
    let url = pg.fresh_db().unwrap();
    let s = ObjStore::open_s3(
        &common::s3_config(&common::fresh_prefix()),
        Catalogue::connect_postgres(&url).unwrap(),
    )
    .unwrap();
    bs_store::put_bytes(&s, &spec("before", None), b"ok").unwrap();
    s.route(&spec("during", Some(3))).unwrap();
    let mut w = s.open_upload("during").unwrap();
    w.write_at(0, b"abc").unwrap();
    pg.stop();
    let e = w.commit(None).unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    let e = s.stat("before").unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    assert!(e.to_string().contains("PostgreSQL"), "{e}");
}

#[test]
fn the_memory_tier_serves_repeats_and_follows_changes_from_other_front_ends() {
    let (a, b) = two_front_ends();
    let tier = bs_store::Tier::new(std::sync::Arc::new(a), 3 << 20, 2 << 20);
    bs_store::put_bytes(&tier, &spec("hot", None), &data(1 << 20, 7)).unwrap();
    bs_store::put_bytes(&tier, &spec("huge", None), &data(3 << 20, 8)).unwrap();
    for _ in 0..3 {
        assert_eq!(read_all(&tier, "hot"), data(1 << 20, 7));
        assert_eq!(read_all(&tier, "huge"), data(3 << 20, 8));
    }
    assert_eq!(tier.stats(), (2, 4), "hot from memory after the first; huge never held");
    assert_eq!(tier.held_bytes(), 1 << 20);
    // Replaced through the other front end: the next read sees the new bytes.
    let mut sp = spec("hot", None);
    sp.overwrite = true;
    bs_store::put_bytes(&b, &sp, b"cooler").unwrap();
    assert_eq!(read_all(&tier, "hot"), b"cooler");
    b.delete("hot").unwrap();
    assert!(matches!(tier.open_read("hot"), Err(StoreError::NotFound(_))));
    // The budget holds: three 1 MiB blobs in 3 MiB, a fourth pushes the oldest out.
    for k in 0..4u8 {
        bs_store::put_bytes(&tier, &spec(&format!("w{k}"), None), &data(1 << 20, k)).unwrap();
        read_all(&tier, &format!("w{k}"));
    }
    assert!(tier.held_bytes() <= 3 << 20);
    let before = tier.stats();
    assert_eq!(read_all(&tier, "w3"), data(1 << 20, 3));
    assert_eq!(tier.stats().0, before.0 + 1, "the newest is held");
    assert_eq!(read_all(&tier, "w0"), data(1 << 20, 0));
    assert_eq!(tier.stats().1, before.1 + 1, "the oldest went");
}

#[test]
fn the_disk_tier_serves_repeats_across_restarts_and_follows_changes() {
    let (a, b) = two_front_ends();
    let a: std::sync::Arc<dyn Store> = std::sync::Arc::new(a);
    let dir = tempfile::tempdir().unwrap();
    {
        let tier = bs_store::Tier::on_disk(a.clone(), dir.path(), 3 << 20, 2 << 20).unwrap();
        let mut sp = spec("hot", None);
        sp.metadata = [("modality".to_string(), "CT".to_string())].into();
        bs_store::put_bytes(&tier, &sp, &data(1 << 20, 7)).unwrap();
        for _ in 0..3 {
            let src = tier.open_read("hot").unwrap();
            assert_eq!(src.all().unwrap().to_vec(), data(1 << 20, 7));
            assert_eq!(src.record(), &a.stat("hot").unwrap(), "the blob's own record");
        }
        assert_eq!(tier.stats(), (2, 1));
        assert!(tier.open_read("hot").unwrap().is_file(), "served from the local file");
    }
    // A new process: the copy on disk is used again.
    let tier = bs_store::Tier::on_disk(a.clone(), dir.path(), 3 << 20, 2 << 20).unwrap();
    assert_eq!(read_all(&tier, "hot"), data(1 << 20, 7));
    assert_eq!(tier.stats(), (1, 0));
    // Replaced through another front end: seen at once; deleted: gone.
    let mut sp = spec("hot", None);
    sp.overwrite = true;
    bs_store::put_bytes(&b, &sp, b"cooler").unwrap();
    assert_eq!(read_all(&tier, "hot"), b"cooler");
    b.delete("hot").unwrap();
    assert!(matches!(tier.open_read("hot"), Err(StoreError::NotFound(_))));
    // The budget holds.
    for k in 0..4u8 {
        bs_store::put_bytes(&tier, &spec(&format!("w{k}"), None), &data(1 << 20, k)).unwrap();
        assert_eq!(read_all(&tier, &format!("w{k}")), data(1 << 20, k));
    }
    assert!(tier.held_bytes() <= 3 << 20, "{}", tier.held_bytes());
    // Memory in front of disk in front of the bucket.
    let disk: std::sync::Arc<dyn Store> = std::sync::Arc::new(tier);
    let mem = bs_store::Tier::new(disk, 8 << 20, 2 << 20);
    assert_eq!(read_all(&mem, "w3"), data(1 << 20, 3));
    assert_eq!(read_all(&mem, "w3"), data(1 << 20, 3));
    assert_eq!(mem.stats(), (1, 1));
}

/// One blob written by range writers (several connections at once): two ranges meeting
/// inside a part, which whichever writer fills it sends. What a resumed push is told the
/// upload holds stops at the first piece not held whole; a commit with a part missing is
/// incomplete, one with a chunk that is not the sender's is corrupt, and neither makes
/// anything visible; bytes of a part sent, written again, forget the part until all of it is
/// written again; the blob reads back whole once it commits.
#[test]
fn ranges_from_several_writers_commit_as_one_multipart_upload() {
    let s = common::s3_store();
    let chunk = CHUNK_SIZE as usize;
    let size = 2 * PART_SIZE + 3 * chunk + 100; // parts of 8 MiB, 8 MiB and 3 MiB + 100
    let bytes = data(size, 11);
    let algo = s.digest_algo();
    let (whole, sums) = (algo.digest(&bytes), bs_wire::ChunkDigests::of(&bytes));
    s.route(&spec("ranged", Some(size as u64))).unwrap();
    let held = |from: usize| -> Vec<bs_wire::Digest> {
        let len = (size - from) as u64;
        s.upload_piece_digests("ranged", from as u64, len, CHUNK_SIZE, algo).unwrap().unwrap()
    };
    let pieces = |from: usize, n: usize| -> Vec<bs_wire::Digest> {
        (0..n)
            .map(|k| algo.digest(&bytes[from + k * chunk..(from + (k + 1) * chunk).min(size)]))
            .collect()
    };
    let commit = || s.open_upload("ranged").unwrap().commit_expecting(&whole, Some(&sums));
    let mid = PART_SIZE + 2 * chunk;
    let mut b = s.open_upload_range("ranged", mid as u64).unwrap().expect("range writers");
    let mut a = s.open_upload_range("ranged", 0).unwrap().expect("range writers");
    // While range writers are open, nobody takes the upload whole.
    assert!(matches!(s.open_upload("ranged"), Err(StoreError::Busy(_))));
    write_in_pieces(&mut *b, &bytes[..size], mid);
    a.write_at(0, &bytes[..PART_SIZE + chunk]).unwrap();
    // Part 0 sent, part 1 held but for one chunk, part 2 sent.
    assert_eq!(held(0), pieces(0, PART_SIZE / chunk + 1));
    assert_eq!(held(mid), pieces(mid, (size - mid).div_ceil(chunk)));
    drop((a, b));
    let e = commit().unwrap_err();
    assert!(matches!(e, StoreError::Incomplete { .. }), "{e}");
    // The chunk missing, written wrong: part 1 fills and goes up, and the commit finds it.
    let gap = PART_SIZE + chunk;
    let mut w = s.open_upload_range("ranged", gap as u64).unwrap().unwrap();
    w.write_at(gap as u64, &vec![0xEE; chunk]).unwrap();
    drop(w);
    let e = commit().unwrap_err();
    assert!(
        e.to_string().contains("chunk 9 ") && e.to_string().contains("not the sender's"),
        "{e}"
    );
    assert!(matches!(s.stat("ranged"), Err(StoreError::NotFound(_))));
    // Written right: part 1 was sent, so only the bytes written again are held of it.
    let mut w = s.open_upload_range("ranged", gap as u64).unwrap().unwrap();
    w.write_at(gap as u64, &bytes[gap..gap + chunk]).unwrap();
    assert_eq!(held(PART_SIZE), Vec::<bs_wire::Digest>::new());
    assert_eq!(held(gap).first(), Some(&algo.digest(&bytes[gap..gap + chunk])));
    drop(w);
    assert!(matches!(commit().unwrap_err(), StoreError::Incomplete { .. }));
    // One writer cannot write into it, nor commit it without the chunk digests.
    let mut one = s.open_upload("ranged").unwrap();
    let e = one.write_at(0, b"x").unwrap_err();
    assert!(e.to_string().contains("written in ranges"), "{e}");
    let e = one.commit_expecting(&whole, None).unwrap_err();
    assert!(e.to_string().contains("chunk digests"), "{e}");
    // All of part 1 again, and it commits.
    let mut w = s.open_upload_range("ranged", PART_SIZE as u64).unwrap().unwrap();
    write_in_pieces(&mut *w, &bytes[..2 * PART_SIZE], PART_SIZE);
    drop(w);
    let rec = commit().unwrap();
    assert_eq!((rec.size, rec.digest.as_str()), (size as u64, whole.to_string().as_str()));
    assert!(read_all(&s, "ranged") == bytes, "the blob's bytes differ");
}

/// Range writers of an upload aborted (or routed anew) under them are refused, and leave
/// nothing in the bucket's multipart uploads to the blob's name.
#[test]
fn range_writers_of_an_aborted_upload_are_refused() {
    let s = common::s3_store();
    let bytes = data(PART_SIZE + 10, 3);
    s.route(&spec("gone", Some(bytes.len() as u64))).unwrap();
    let mut w = s.open_upload_range("gone", 0).unwrap().unwrap();
    w.write_at(0, &bytes[..PART_SIZE]).unwrap(); // part 0 goes up
    s.abort("gone").unwrap();
    let e = w.write_at(PART_SIZE as u64, &bytes[PART_SIZE..]).unwrap_err();
    assert!(matches!(e, StoreError::NoUpload(_)), "{e}");
    drop(w);
    assert!(matches!(s.open_upload_range("gone", 0), Err(StoreError::NoUpload(_))));
    assert!(matches!(s.stat("gone"), Err(StoreError::NotFound(_))));
}
