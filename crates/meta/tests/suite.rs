//! One behaviour suite for the catalogue and the image index, run on both databases:
//! embedded SQLite and PostgreSQL (a real server, started once for this test binary in a
//! throwaway directory; each test gets a database of its own).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use bs_meta::{BlobRecord, Catalogue, Commit, ImageIndex, ImageQuery, UploadRecord};

/// A database both kinds of handle can be (re)opened on.
trait Place {
    fn catalogue(&self) -> Catalogue;
    fn images(&self) -> ImageIndex;
}

struct Sqlite(tempfile::TempDir);

impl Place for Sqlite {
    fn catalogue(&self) -> Catalogue {
        Catalogue::open(&self.0.path().join("meta.db")).unwrap()
    }
    fn images(&self) -> ImageIndex {
        ImageIndex::open(&self.0.path().join("meta.db")).unwrap()
    }
}

struct Postgres(String);

impl Place for Postgres {
    fn catalogue(&self) -> Catalogue {
        Catalogue::connect_postgres(&self.0).unwrap()
    }
    fn images(&self) -> ImageIndex {
        ImageIndex::connect_postgres(&self.0).unwrap()
    }
}

fn server() -> &'static bs_peers::Postgres {
    static PG: OnceLock<bs_peers::Postgres> = OnceLock::new();
    PG.get_or_init(|| bs_peers::Postgres::start().expect("PostgreSQL starts"))
}

fn rec(name: &str) -> BlobRecord {
    BlobRecord {
        name: name.into(),
        size: 3,
        content_type: "image/png".into(),
        digest: "xxh3-128:00".into(),
        created_ms: 1,
        metadata: [("modality".to_string(), "CT".to_string())].into(),
    }
}

fn commit_replace_list_delete_survive_reopen(p: &dyn Place) {
    {
        let c = p.catalogue();
        assert_eq!(
            c.commit_blob(&rec("a/1"), "f1", b"", None, |_| true).unwrap(),
            Commit::Done(None)
        );
        assert_eq!(
            c.commit_blob(&rec("a/1"), "f2", b"", None, |_| true).unwrap(),
            Commit::Done(Some("f1".into()))
        );
        assert_eq!(
            c.commit_blob(&rec("a/1"), "f9", b"", None, |d| d != Some("xxh3-128:00")).unwrap(),
            Commit::Refused,
            "the check runs against what is there"
        );
        c.commit_blob(&rec("a/2"), "f3", b"", None, |_| true).unwrap();
        c.commit_blob(&rec("b/1"), "f4", b"", None, |_| true).unwrap();
        c.commit_blob(&rec("a%"), "f5", b"", None, |_| true).unwrap();
        c.commit_blob(&rec("B/upper"), "f6", b"", None, |_| true).unwrap();
    }
    let c = p.catalogue();
    assert_eq!(c.blob("a/1").unwrap().unwrap(), (rec("a/1"), "f2".to_string()));
    let names = |v: Vec<BlobRecord>| v.into_iter().map(|r| r.name).collect::<Vec<_>>();
    assert_eq!(names(c.list("a/", "", 10).unwrap()), ["a/1", "a/2"]);
    assert_eq!(names(c.list("a/", "a/1", 10).unwrap()), ["a/2"]);
    assert_eq!(names(c.list("", "", 3).unwrap()), ["B/upper", "a%", "a/1"], "byte order");
    assert_eq!(names(c.list("a%", "", 10).unwrap()), ["a%"], "no LIKE wildcards");
    assert_eq!(c.delete_blob("a/1").unwrap(), Some("f2".into()));
    assert_eq!(c.delete_blob("a/1").unwrap(), None);
    assert!(c.blob("a/1").unwrap().is_none());
    let mut locs = c.locations().unwrap();
    locs.sort();
    assert_eq!(locs, ["f3", "f4", "f5", "f6"]);
}

fn uploads_are_replaced_and_cleared_on_commit(p: &dyn Place) {
    let c = p.catalogue();
    let mut u = UploadRecord {
        name: "x".into(),
        upload_id: "u1".into(),
        size: None,
        content_type: String::new(),
        metadata: BTreeMap::new(),
        overwrite: false,
        resume_tag: "t".into(),
        created_ms: 0,
        refuse_digests: vec!["xxh3-128:01".into()],
    };
    assert_eq!(c.put_upload(&u).unwrap(), None);
    u.upload_id = "u2".into();
    u.size = Some(9);
    assert_eq!(c.put_upload(&u).unwrap(), Some("u1".into()));
    assert_eq!(c.upload("x").unwrap().unwrap(), u);
    assert_eq!(c.uploads_created_before(1).unwrap(), [("x".to_string(), "u2".to_string())]);
    // Written by now (SQLite writes the row behind, with the handle's next transaction).
    assert_eq!(p.catalogue().upload("x").unwrap().unwrap(), u, "seen by another handle");
    assert!(c.uploads_created_before(0).unwrap().is_empty());
    assert_eq!(c.upload_ids().unwrap(), ["u2"]);
    c.commit_blob(&rec("x"), "loc", b"", None, |_| true).unwrap();
    assert!(c.upload("x").unwrap().is_none());
    assert!(c.upload_ids().unwrap().is_empty());
    u.name = "y".into();
    c.put_upload(&u).unwrap();
    assert_eq!(c.delete_upload("y").unwrap(), Some("u2".into()));
    assert_eq!(c.delete_upload("y").unwrap(), None);
}

fn chunks_and_corruption_marks(p: &dyn Place) {
    let c = p.catalogue();
    c.commit_blob(&rec("m"), "f0", b"abcd", None, |_| true).unwrap();
    let s = c.stored("m").unwrap().unwrap();
    assert_eq!((s.chunks.as_deref(), s.corrupt), (Some(&b"abcd"[..]), None));
    c.set_chunks("m", "f0", b"efgh").unwrap();
    assert!(c.set_corrupt("m", "f0", Some("chunk 0 differs")).unwrap());
    assert!(!c.set_corrupt("m", "elsewhere", None).unwrap(), "only at that location");
    let s = c.stored("m").unwrap().unwrap();
    assert_eq!(s.chunks.as_deref(), Some(&b"efgh"[..]));
    assert_eq!(c.corrupt().unwrap(), [("m".to_string(), "chunk 0 differs".to_string())]);
    // A listing page's marks: of the names asked about only.
    c.commit_blob(&rec("n"), "f2", b"ok", None, |_| true).unwrap();
    let m = [("m".to_string(), "chunk 0 differs".to_string())];
    let among = |n: &[&str]| c.corrupt_among(&n.iter().map(|n| n.to_string()).collect::<Vec<_>>());
    assert_eq!(among(&["m", "n", "gone"]).unwrap(), m);
    assert!(among(&["n"]).unwrap().is_empty());
    assert!(among(&[]).unwrap().is_empty());
    let many: Vec<String> = (0..1200).map(|i| format!("x{i}")).chain(["m".into()]).collect();
    assert_eq!(c.corrupt_among(&many).unwrap(), m, "more names than one statement takes");
    c.commit_blob(&rec("m"), "f1", b"new", None, |_| true).unwrap();
    let s = c.stored("m").unwrap().unwrap();
    assert_eq!((s.corrupt, s.chunks.as_deref()), (None, Some(&b"new"[..])));
    assert!(c.corrupt().unwrap().is_empty(), "a replacement is not corrupt");
}

/// A small blob's bytes kept in its row: read back with it, replaced with it by a commit
/// that keeps them elsewhere, and changed in place only where the row holds bytes.
fn inline_bytes_live_and_leave_with_their_row(p: &dyn Place) {
    let c = p.catalogue();
    c.commit_blob(&rec("s"), "i0", b"ch", Some(b"abc"[..].into()), |_| true).unwrap();
    let s = p.catalogue().stored("s").unwrap().unwrap();
    assert_eq!((s.location.as_str(), s.inline.as_deref()), ("i0", Some(&b"abc"[..])));
    assert!(c.set_inline("s", "i0", b"abd").unwrap());
    assert!(!c.set_inline("s", "elsewhere", b"xyz").unwrap(), "only at that location");
    assert_eq!(c.stored("s").unwrap().unwrap().inline.as_deref(), Some(&b"abd"[..]));
    assert_eq!(
        c.commit_blob(&rec("s"), "f1", b"ch", None, |_| true).unwrap(),
        Commit::Done(Some("i0".into()))
    );
    assert_eq!(c.stored("s").unwrap().unwrap().inline, None, "the file's commit drops the bytes");
    assert!(!c.set_inline("s", "f1", b"abc").unwrap(), "a row without bytes keeps none");
    c.commit_blob(&rec("s"), "i2", b"ch", Some(b"xyz"[..].into()), |_| true).unwrap();
    assert_eq!(c.delete_blob("s").unwrap(), Some("i2".into()));
    assert!(c.stored("s").unwrap().is_none());
}

/// Two handles on one database (two front ends) race to commit the same new name without
/// overwrite: exactly one commit lands, the others are refused; distinct names all land.
fn racing_handles_commit_each_name_once(p: &dyn Place) {
    let handles: Vec<Catalogue> = (0..4).map(|_| p.catalogue()).collect();
    let outcomes: Vec<Commit> = std::thread::scope(|s| {
        let racers: Vec<_> = handles
            .iter()
            .enumerate()
            .flat_map(|(i, c)| {
                (0..3).map(move |j| {
                    s.spawn(move || {
                        c.commit_blob(&rec(&format!("own/{i}-{j}")), "own", b"", None, |d| {
                            d.is_none()
                        })
                        .unwrap();
                        c.commit_blob(&rec("same"), &format!("loc{i}-{j}"), b"", None, |d| {
                            d.is_none()
                        })
                        .unwrap()
                    })
                })
            })
            .collect();
        racers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let done = outcomes.iter().filter(|o| matches!(o, Commit::Done(None))).count();
    assert_eq!(done, 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| **o == Commit::Refused).count(), 11);
    assert_eq!(p.catalogue().list("own/", "", 100).unwrap().len(), 12);
}

fn fields(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn indexed(p: &dyn Place) -> ImageIndex {
    let ix = p.images();
    let ct = fields(&[
        ("patient_name", "Doe^Jane"),
        ("patient_id", "PID-1"),
        ("modality", "CT"),
        ("study_date", "20240131"),
        ("study_description", "HEAD 100%"),
    ]);
    ix.put("studies/ct.dcm", "x:1", &ct, "{}").unwrap();
    let mr =
        fields(&[("patient_name", "Roe^Rick"), ("modality", "MR"), ("study_date", "20250301")]);
    ix.put("studies/mr.dcm", "x:2", &mr, "{}").unwrap();
    ix.put("photos/card.png", "x:3", &fields(&[("width", "640")]), "{}").unwrap();
    ix.put_not_image("docs/readme.txt", "x:4", "not an image").unwrap();
    ix
}

fn image_search_each_criterion_narrows(p: &dyn Place) {
    let _ix = indexed(p);
    let ix = p.images(); // what one front end indexed, another finds
    let names = |q: ImageQuery| -> Vec<String> {
        ix.search(&ImageQuery { limit: 100, ..q }).unwrap().into_iter().map(|e| e.name).collect()
    };
    let all = names(ImageQuery::default());
    assert_eq!(all, ["photos/card.png", "studies/ct.dcm", "studies/mr.dcm"]);
    let q = |f: fn(&mut ImageQuery)| {
        let mut q = ImageQuery::default();
        f(&mut q);
        names(q)
    };
    assert_eq!(q(|q| q.modality = Some("ct".into())), ["studies/ct.dcm"]);
    assert_eq!(q(|q| q.patient = Some("jane".into())), ["studies/ct.dcm"]);
    assert_eq!(q(|q| q.patient = Some("pid-1".into())), ["studies/ct.dcm"]);
    assert_eq!(q(|q| q.text = Some("ROE".into())), ["studies/mr.dcm"]);
    assert_eq!(q(|q| q.text = Some("card".into())), ["photos/card.png"]);
    assert_eq!(q(|q| q.date_from = Some("20250101".into())), ["studies/mr.dcm"]);
    assert_eq!(q(|q| q.date_to = Some("20241231".into())), ["studies/ct.dcm"]);
    assert_eq!(q(|q| q.prefix = "photos/".into()), ["photos/card.png"]);
    assert!(q(|q| q.text = Some("readme".into())).is_empty(), "non-images are not found");
    // LIKE wildcards in the query match only themselves.
    assert_eq!(q(|q| q.text = Some("100%".into())), ["studies/ct.dcm"]);
    assert!(q(|q| q.text = Some("1_0".into())).is_empty());
    let first = ix.search(&ImageQuery { limit: 1, ..Default::default() }).unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].name, "photos/card.png");
    // Pages: what sorts after the last name of a page, criteria still applying.
    assert_eq!(
        q(|q| q.name_after = Some("photos/card.png".into())),
        ["studies/ct.dcm", "studies/mr.dcm"]
    );
    let after_ct = |q: &mut ImageQuery| {
        q.name_after = Some("studies/ct.dcm".into());
        q.text = Some("roe".into());
    };
    assert_eq!(q(after_ct), ["studies/mr.dcm"]);
    assert!(q(|q| q.name_after = Some("studies/mr.dcm".into())).is_empty());
}

fn image_entries_are_replaced_and_forgotten(p: &dyn Place) {
    let ix = indexed(p);
    assert!(!ix.get("docs/readme.txt").unwrap().unwrap().is_image);
    ix.put("docs/readme.txt", "x:5", &fields(&[]), "{\"width\":1}").unwrap();
    let e = ix.get("docs/readme.txt").unwrap().unwrap();
    assert!(e.is_image && e.digest == "x:5" && e.meta == "{\"width\":1}");
    ix.forget("docs/readme.txt").unwrap();
    assert_eq!(ix.get("docs/readme.txt").unwrap(), None);
    // Many blobs that are no image, recorded in one write; an image entry among them is
    // replaced like any other, and nothing else changes.
    let rows: Vec<(String, String)> =
        (0..300).map(|i| (format!("raw/{i}"), format!("x:{i}"))).collect();
    ix.put("raw/7", "x:old", &fields(&[]), "{\"width\":2}").unwrap();
    ix.put_not_images(&rows, "not an image format").unwrap();
    let other = p.images();
    for (name, digest) in [("raw/0", "x:0"), ("raw/7", "x:7"), ("raw/299", "x:299")] {
        let e = other.get(name).unwrap().unwrap();
        assert!(!e.is_image && e.digest == digest, "{name}: {e:?}");
        assert_eq!(e.meta, "{\"error\":\"not an image format\"}");
    }
    assert!(other.get("docs/readme.txt").unwrap().is_none());
    ix.put_not_images(&[], "nothing").unwrap();
}

/// A CT study of two series (an axial one of three slices put out of order, a scout) and an
/// MR study, through one front end; read through another.
fn studies_series_and_slice_order(p: &dyn Place) {
    let ix = p.images();
    let slice = |series: &str, n: &str, z: &str, modality: &str, study: &str| {
        fields(&[
            ("patient_name", "Doe^Jane"),
            ("patient_id", "PID-1"),
            ("modality", modality),
            ("study_date", "20240131"),
            ("study_instance_uid", study),
            ("series_instance_uid", series),
            ("instance_number", n),
            ("image_position_patient", &format!("-125\\-125\\{z}")),
            ("image_orientation_patient", "1\\0\\0\\0\\1\\0"),
        ])
    };
    // Instance numbers disagree with position: position wins.
    let um3 = r#"{"n":3,"user_metadata":{"referral":"Ward 9","priority":"urgent"}}"#;
    ix.put("ct/3.dcm", "x:3", &slice("1.2.3.1", "1", "10.0", "CT", "1.2.3"), um3).unwrap();
    ix.put("ct/1.dcm", "x:1", &slice("1.2.3.1", "3", "-10.0", "CT", "1.2.3"), "{\"n\":1}").unwrap();
    let um2 = r#"{"n":2,"user_metadata":{"referral":"Ward 7","reader":"Dr B"}}"#;
    ix.put("ct/2.dcm", "x:2", &slice("1.2.3.1", "2", "0", "CT", "1.2.3"), um2).unwrap();
    let mut scout = slice("1.2.3.2", "1", "0", "CT", "1.2.3");
    scout.remove("image_position_patient");
    ix.put("ct/scout.dcm", "x:4", &scout, "{}").unwrap();
    ix.put("mr/1.dcm", "x:5", &slice("1.2.4.1", "1", "0", "MR", "1.2.4"), "{}").unwrap();
    ix.put("photo.png", "x:6", &fields(&[("width", "4")]), "{}").unwrap();

    let ix = p.images();
    let studies = ix.studies(&ImageQuery { limit: 100, ..Default::default() }).unwrap();
    let got: Vec<_> = studies.iter().map(|s| (s.study_uid.as_str(), s.series, s.images)).collect();
    assert_eq!(got, [("1.2.3", 2, 4), ("1.2.4", 1, 1)], "images without a study are in none");
    assert_eq!(studies[0].modalities, ["CT"]);
    assert_eq!(studies[0].meta, "{\"n\":1}", "the first instance by name speaks for the study");
    // … but the user metadata of every instance is the study's.
    let um: Vec<_> =
        studies[0].user_metadata.iter().map(|(k, v)| (k.as_str(), v.join("|"))).collect();
    assert_eq!(
        um,
        [
            ("priority", "urgent".into()),
            ("reader", "Dr B".into()),
            ("referral", "Ward 7|Ward 9".into())
        ]
    );
    assert!(studies[1].user_metadata.is_empty());
    // An entry whose metadata is not JSON in the study: the study is still listed.
    ix.put("ct/odd.dcm", "x:7", &slice("1.2.3.1", "9", "20.0", "CT", "1.2.3"), "not json").unwrap();
    let again = ix.studies(&ImageQuery { limit: 100, ..Default::default() }).unwrap();
    assert_eq!((again[0].images, again[0].user_metadata.len()), (5, 3));
    ix.forget("ct/odd.dcm").unwrap();
    // … nor does one outside any study fail the set-up of the next front end.
    ix.put("loose.png", "x:8", &fields(&[]), "not json").unwrap();
    let ix = p.images();
    assert_eq!(ix.studies(&ImageQuery { limit: 100, ..Default::default() }).unwrap().len(), 2);
    ix.forget("loose.png").unwrap();
    let mr =
        ix.studies(&ImageQuery { limit: 100, modality: Some("mr".into()), ..Default::default() });
    assert_eq!(mr.unwrap().len(), 1);
    // A criterion picks studies; their counts still cover all of their images.
    let ct =
        ix.studies(&ImageQuery { limit: 100, text: Some("ct/3".into()), ..Default::default() });
    let ct = ct.unwrap();
    assert_eq!((ct.len(), ct[0].series, ct[0].images), (1, 2, 4));
    assert_eq!(ix.studies(&ImageQuery { limit: 1, ..Default::default() }).unwrap().len(), 1);

    let series = ix.series("1.2.3").unwrap();
    let got: Vec<_> = series.iter().map(|s| (s.series_uid.as_str(), s.images)).collect();
    assert_eq!(got, [("1.2.3.1", 3), ("1.2.3.2", 1)]);
    assert!(ix.series("no-such-study").unwrap().is_empty());

    let order: Vec<_> = ix.instances("1.2.3.1").unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(order, ["ct/1.dcm", "ct/2.dcm", "ct/3.dcm"]);
    // Re-putting an instance into another series moves it.
    ix.put("ct/3.dcm", "x:7", &slice("1.2.3.2", "2", "10.0", "CT", "1.2.3"), "{}").unwrap();
    assert_eq!(ix.instances("1.2.3.1").unwrap().len(), 2);
    assert_eq!(ix.instances("1.2.3.2").unwrap().len(), 2);
}

/// Instances whose pixels cannot be decoded (a report, a PDF) belong to their study: a study
/// made only of them is listed and matched by patient, modality and date, counts cover them,
/// and a decoded image's metadata speaks for a study that has one. Studies are read in pages.
fn studies_count_and_match_undecodable_instances(p: &dyn Place) {
    let ix = p.images();
    let instance = |study: &str, series: &str, modality: &str, patient: &str| {
        fields(&[
            ("patient_name", patient),
            ("patient_id", "PID-9"),
            ("modality", modality),
            ("study_date", "20250102"),
            ("study_instance_uid", study),
            ("series_instance_uid", series),
        ])
    };
    let why = "no Pixel Data";
    // Study 1.5: only a structured report.
    ix.put_undecodable_dicom("sr/a.dcm", "x:1", &instance("1.5", "1.5.1", "SR", "Roe^Rick"), why)
        .unwrap();
    // Study 1.6: a report named before its image, and the image.
    ix.put_undecodable_dicom("a/report.dcm", "x:2", &instance("1.6", "1.6.2", "SR", "Roe^R"), why)
        .unwrap();
    ix.put("b/ct.dcm", "x:3", &instance("1.6", "1.6.1", "CT", "Roe^Rick"), r#"{"img":1}"#).unwrap();
    // And a file that is not DICOM at all: in no study.
    ix.put_not_image("notes.txt", "x:4", "not an image").unwrap();

    let ix = p.images();
    let all = ix.studies(&ImageQuery { limit: 100, ..Default::default() }).unwrap();
    let got: Vec<_> =
        all.iter().map(|s| (s.study_uid.as_str(), s.series, s.instances, s.images)).collect();
    assert_eq!(got, [("1.5", 1, 1, 0), ("1.6", 2, 2, 1)]);
    assert_eq!(all[0].modalities, ["SR"]);
    assert_eq!(all[1].modalities, ["CT", "SR"]);
    assert_eq!(all[1].meta, r#"{"img":1}"#, "the decoded image speaks for its study");
    let meta: serde_json::Value = serde_json::from_str(&all[0].meta).unwrap();
    assert_eq!(
        (meta["patient_name"].as_str(), meta["error"].as_str()),
        (Some("Roe^Rick"), Some(why))
    );
    // Matched by what the report says.
    let by = |q: ImageQuery| -> Vec<String> {
        let q = ImageQuery { limit: 100, ..q };
        ix.studies(&q).unwrap().into_iter().map(|s| s.study_uid).collect()
    };
    assert_eq!(
        by(ImageQuery { modality: Some("sr".into()), ..Default::default() }),
        ["1.5", "1.6"]
    );
    assert_eq!(by(ImageQuery { modality: Some("CT".into()), ..Default::default() }), ["1.6"]);
    assert_eq!(by(ImageQuery { patient: Some("pid-9".into()), ..Default::default() }).len(), 2);
    let day = Some("20250102".to_string());
    let on_the_day = ImageQuery { date_from: day.clone(), date_to: day, ..Default::default() };
    assert_eq!(by(on_the_day).len(), 2);
    assert!(by(ImageQuery { date_from: Some("20250103".into()), ..Default::default() }).is_empty());
    // The image search still returns images only.
    let found = ix.search(&ImageQuery { limit: 100, ..Default::default() }).unwrap();
    assert_eq!(found.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["b/ct.dcm"]);
    // Series: instances and images counted apart.
    let series: Vec<_> = ix
        .series("1.6")
        .unwrap()
        .into_iter()
        .map(|s| (s.series_uid, s.instances, s.images))
        .collect();
    assert_eq!(series, [("1.6.1".to_string(), 1, 1), ("1.6.2".to_string(), 1, 0)]);
    // Studies named by UID (one unknown): only those, criteria still applying.
    let named = |uids: &[&str], modality: Option<&str>| -> Vec<String> {
        let q = ImageQuery {
            limit: 100,
            study_uids: uids.iter().map(|u| u.to_string()).collect(),
            modality: modality.map(String::from),
            ..Default::default()
        };
        ix.studies(&q).unwrap().into_iter().map(|s| s.study_uid).collect()
    };
    assert_eq!(named(&["1.6", "9.9"], None), ["1.6"]);
    assert_eq!(named(&["1.5", "1.6"], None), ["1.5", "1.6"]);
    assert_eq!(named(&["1.5", "1.6"], Some("CT")), ["1.6"]);
    // Pages: one study at a time, each after the last.
    let page = |after: Option<&str>| -> Vec<String> {
        let q = ImageQuery { limit: 1, study_after: after.map(String::from), ..Default::default() };
        ix.studies(&q).unwrap().into_iter().map(|s| s.study_uid).collect()
    };
    assert_eq!(page(None), ["1.5"]);
    assert_eq!(page(Some("1.5")), ["1.6"]);
    assert!(page(Some("1.6")).is_empty());
}

/// One DICOM instance stored under two names (an upload and a STOW-RS of the same file) is
/// one instance in its study's and series' counts; `instances` lists both names, and
/// `one_per_instance` keeps the first.
fn an_instance_under_two_names_counts_once(p: &dyn Place) {
    let ix = p.images();
    let slice = |n: &str| {
        fields(&[
            ("modality", "CT"),
            ("study_instance_uid", "7.1"),
            ("series_instance_uid", "7.1.1"),
            ("instance_number", n),
        ])
    };
    let sop = |uid: &str| format!(r#"{{"sop_instance_uid":"{uid}"}}"#);
    ix.put("a/1.dcm", "x:1", &slice("1"), &sop("7.1.1.1")).unwrap();
    ix.put("b/1-copy.dcm", "x:1", &slice("1"), &sop("7.1.1.1")).unwrap();
    ix.put("a/2.dcm", "x:2", &slice("2"), &sop("7.1.1.2")).unwrap();
    // Without a SOP Instance UID, names tell instances apart.
    ix.put("a/3.dcm", "x:3", &slice("3"), "{}").unwrap();
    ix.put("a/4.dcm", "x:4", &slice("4"), &sop("")).unwrap();
    let studies = ix.studies(&ImageQuery { limit: 10, ..Default::default() }).unwrap();
    assert_eq!((studies[0].instances, studies[0].images), (4, 4));
    let series = ix.series("7.1").unwrap();
    assert_eq!((series[0].instances, series[0].images), (4, 4));
    let listed = ix.instances("7.1.1").unwrap();
    assert_eq!(listed.len(), 5);
    let first = bs_meta::one_per_instance(listed, bs_meta::ImageEntry::sop_instance_uid);
    let names: Vec<_> = first.into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["a/1.dcm", "a/2.dcm", "a/3.dcm", "a/4.dcm"]);
}

macro_rules! suite {
    ($($t:ident),*) => {
        mod sqlite { $( #[test] fn $t() {
            super::$t(&super::Sqlite(tempfile::tempdir().unwrap()));
        } )* }
        mod postgres { $( #[test] fn $t() {
            super::$t(&super::Postgres(super::server().fresh_db().unwrap()));
        } )* }
    };
}

suite!(
    commit_replace_list_delete_survive_reopen,
    uploads_are_replaced_and_cleared_on_commit,
    chunks_and_corruption_marks,
    inline_bytes_live_and_leave_with_their_row,
    racing_handles_commit_each_name_once,
    image_search_each_criterion_narrows,
    image_entries_are_replaced_and_forgotten,
    studies_series_and_slice_order,
    studies_count_and_match_undecodable_instances,
    an_instance_under_two_names_counts_once
);

#[test]
fn older_image_indexes_gain_the_series_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE images (name TEXT PRIMARY KEY NOT NULL, digest TEXT NOT NULL,
             is_image INTEGER NOT NULL, patient TEXT NOT NULL, modality TEXT NOT NULL,
             study_date TEXT NOT NULL, meta TEXT NOT NULL, search_text TEXT NOT NULL,
             indexed_ms INTEGER NOT NULL);
             INSERT INTO images VALUES ('old.dcm', 'x:1', 1, '', 'CT', '', '{}', '', 1);
             INSERT INTO images VALUES ('old-ct.dcm', 'x:2', 1, '', 'CT', '',
               '{\"study_instance_uid\":\"9.8\",\"series_instance_uid\":\"9.8.1\",\"instance_number\":4}', '', 1);
             INSERT INTO images VALUES ('old-j2k.dcm', 'x:3', 0, '', '', '',
               '{\"error\":\"DICOM transfer syntax JPEG 2000 is not supported\"}', '', 1);",
        )
        .unwrap();
    }
    let ix = ImageIndex::open(&path).unwrap();
    assert!(ix.get("old.dcm").unwrap().is_some());
    // An indexed DICOM image joins its study and series; a verdict of "unsupported" is dropped
    // so the blob is decoded again.
    let studies = ix.studies(&ImageQuery { limit: 10, ..Default::default() }).unwrap();
    assert_eq!(studies.iter().map(|s| s.study_uid.as_str()).collect::<Vec<_>>(), ["9.8"]);
    assert_eq!(ix.instances("9.8.1").unwrap().len(), 1);
    assert_eq!(ix.get("old-j2k.dcm").unwrap(), None);
    drop(ix);
    let ix = ImageIndex::open(&path).unwrap(); // again: nothing left to change
    assert_eq!(ix.instances("9.8.1").unwrap().len(), 1);
    ix.forget("old-ct.dcm").unwrap();
    studies_series_and_slice_order(&Sqlite(dir));
}

/// Undecodable DICOM rows written before they kept patient, date and modality (an empty
/// `patient` column) are dropped on open, so the blobs are indexed again; rows written now stay.
#[test]
fn older_undecodable_rows_are_indexed_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    let ix = ImageIndex::open(&path).unwrap();
    let ids = fields(&[("study_instance_uid", "7.1"), ("series_instance_uid", "7.1.1")]);
    ix.put_undecodable_dicom("new.dcm", "x:1", &ids, "no pixel data").unwrap();
    ix.put_undecodable_dicom("old.dcm", "x:2", &ids, "no pixel data").unwrap();
    drop(ix);
    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute("UPDATE images SET patient = '' WHERE name = 'old.dcm'", []).unwrap();
    drop(c);
    let ix = ImageIndex::open(&path).unwrap();
    assert!(ix.get("new.dcm").unwrap().is_some(), "a row written now stays");
    assert_eq!(ix.get("old.dcm").unwrap(), None, "an older one is dropped, to be indexed again");
    // An encoding unsupported is looked at again on the next open (a newer decoder may
    // decode it); an instance with no pixels at all is not.
    let sr =
        "DICOM: unsupported: not an image: no Pixel Data (SOP class 1.2.840.10008.5.1.4.1.1.88.11)";
    ix.put_undecodable_dicom("report.dcm", "x:3", &ids, sr).unwrap();
    let j2k = "DICOM: unsupported: transfer syntax JPEG 2000 Part 2 (1.2.840.10008.1.2.4.92)";
    ix.put_undecodable_dicom("part2.dcm", "x:4", &ids, j2k).unwrap();
    drop(ix);
    let ix = ImageIndex::open(&path).unwrap();
    assert!(ix.get("report.dcm").unwrap().is_some());
    assert_eq!(ix.get("part2.dcm").unwrap(), None);
}

#[test]
fn older_sqlite_databases_gain_chunks_corruption_marks_and_inline_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.db");
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE blobs (name TEXT PRIMARY KEY NOT NULL, location TEXT NOT NULL,
             size INTEGER NOT NULL, content_type TEXT NOT NULL, digest TEXT NOT NULL,
             created_ms INTEGER NOT NULL, metadata TEXT NOT NULL);
             INSERT INTO blobs VALUES ('old', 'f0', 3, '', 'xxh3-128:00', 1, '{}');",
        )
        .unwrap();
    }
    let c = Catalogue::open(&path).unwrap();
    let old = c.stored("old").unwrap().unwrap();
    assert_eq!((old.chunks, old.corrupt, old.inline), (None, None, None));
    chunks_and_corruption_marks(&Sqlite(dir));
}

#[test]
fn postgres_errors_name_what_went_wrong() {
    let e = Catalogue::connect_postgres("not a url").err().unwrap();
    assert!(e.to_string().contains("not a PostgreSQL URL"), "{e}");
    // Nothing listens there: unavailable, said at start-up.
    let port = bs_peers::free_port();
    let url = format!("postgres://u:secret@127.0.0.1:{port}/x?connect_timeout=2");
    let e = Catalogue::connect_postgres(&url).err().unwrap();
    assert!(e.is_unavailable(), "{e}");
    assert!(!e.to_string().contains("secret"), "never the password: {e}");
    // A database that does not exist.
    let url = server().url("no_such_db");
    let e = Catalogue::connect_postgres(&url).err().unwrap();
    assert!(e.to_string().contains("no_such_db"), "{e}");
    let c = Catalogue::connect_postgres(&server().fresh_db().unwrap()).unwrap();
    assert!(c.describe().starts_with("postgres://127.0.0.1:"), "{}", c.describe());
}

#[test]
fn postgres_over_tls_with_its_ca_and_not_without() {
    let ca =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert, key) = (ca.cert.pem(), ca.signing_key.serialize_pem());
    let pg = bs_peers::Postgres::start_tls(cert.as_bytes(), key.as_bytes()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &cert).unwrap();
    let url = pg.fresh_db().unwrap();
    // The server refuses connections without TLS.
    let e = Catalogue::connect_postgres(&format!("{url}&sslmode=disable")).err().unwrap();
    assert!(
        e.to_string().contains("no pg_hba.conf entry") || e.to_string().contains("reject"),
        "{e}"
    );
    // TLS checked against the system's roots: this self-signed server is not trusted.
    let e = Catalogue::connect_postgres(&format!("{url}&sslmode=require")).err().unwrap();
    assert!(e.is_unavailable(), "{e}");
    // sslmode=prefer (the default), as in libpq: encrypted, the certificate not checked.
    let c = Catalogue::connect_postgres(&url).unwrap();
    assert!(c.list("", "", 1).unwrap().is_empty());
    // With its CA: works, and everything behaves as on plain connections.
    let tls = format!("{url}&sslmode=require&sslrootcert={}", ca_file.display());
    let c = Catalogue::connect_postgres(&tls).unwrap();
    c.commit_blob(&rec("over/tls"), "f", b"", None, |_| true).unwrap();
    assert_eq!(c.blob("over/tls").unwrap().unwrap().1, "f");
    assert!(!c.describe().contains("sslrootcert"));
    let ix = ImageIndex::connect_postgres(&tls).unwrap();
    ix.put_not_image("over/tls", "x:1", "not an image").unwrap();
}

#[test]
fn more_callers_than_connections_are_all_served() {
    // More threads at once than the pool opens connections (64): they wait their turn.
    let url = server().fresh_db().unwrap();
    let c = Catalogue::connect_postgres(&url).unwrap();
    std::thread::scope(|s| {
        for t in 0..96 {
            let c = &c;
            s.spawn(move || {
                c.commit_blob(&rec(&format!("many/{t}")), "f", b"", None, |_| true).unwrap();
                assert!(c.blob(&format!("many/{t}")).unwrap().is_some());
            });
        }
    });
    assert_eq!(c.list("many/", "", 200).unwrap().len(), 96);
}
