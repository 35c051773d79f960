//! Property tests: arbitrary bytes, and valid DICOM / PNG files with bytes changed or cut, fed
//! to `decode`. It must return (an image or an error), never panic, and never need its last
//! guard (a panic caught inside a decoder is reported as "decoder failed", which fails here).
//! The same bytes read as a structured report or an encapsulated document must return too.

mod common;

use bs_imageio::{Format, Limits, decode, encode};
use bs_imaging::DynImage;
use common::*;
use proptest::prelude::*;
use proptest::sample::Index;

/// Small limits keep every case cheap.
fn limits() -> Limits {
    Limits { max_pixels: 1 << 20, max_bytes: 64 << 20, max_frames: 1000, ..Limits::none() }
}

fn check(bytes: &[u8], hint: Option<&str>) -> Result<(), TestCaseError> {
    let _ = bs_imageio::structured_report(bytes, &limits());
    let _ = bs_imageio::encapsulated_document(bytes, &limits());
    match decode(bytes, hint, &limits()) {
        Ok(d) => {
            let img = &d.image;
            let samples = match img {
                DynImage::U8(i) => i.data.len(),
                DynImage::U16(i) => i.data.len(),
            };
            prop_assert_eq!(samples, img.width() * img.height() * img.channels());
            prop_assert_eq!(
                (d.meta.width as usize, d.meta.height as usize),
                (img.width(), img.height())
            );
        }
        Err(e) => {
            let text = e.to_string();
            prop_assert!(!text.contains("decoder failed"), "a decoder panicked: {}", text);
        }
    }
    Ok(())
}

fn raster_samples() -> Vec<(Vec<u8>, &'static str)> {
    vec![
        (encode(&DynImage::U16(test_image16(6, 5, 1)), Format::Png).unwrap(), "a.png"),
        (encode(&DynImage::U8(test_image8(6, 5, 4)), Format::Png).unwrap(), "a.png"),
        (encode(&DynImage::U8(smooth_image8(9, 7, 3)), Format::Jpeg).unwrap(), "a.jpg"),
        (encode(&DynImage::U8(test_image8(6, 5, 3)), Format::Tiff).unwrap(), "a.tif"),
        (encode(&DynImage::U8(few_colours8(6, 5, 3)), Format::Gif).unwrap(), "a.gif"),
        (encode(&DynImage::U16(test_image16(6, 5, 3)), Format::Pnm).unwrap(), "a.ppm"),
    ]
}

/// Apply byte changes at chosen positions, then maybe cut.
fn mutate(mut bytes: Vec<u8>, changes: &[(Index, u8)], cut: Option<Index>) -> Vec<u8> {
    for (at, value) in changes {
        let i = at.index(bytes.len());
        bytes[i] = *value;
    }
    if let Some(cut) = cut {
        let len = cut.index(bytes.len() + 1);
        bytes.truncate(len);
    }
    bytes
}

fn hints() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![
        Just(None),
        Just(Some("x.dcm")),
        Just(Some("x.png")),
        Just(Some("x.jpg")),
        Just(Some("x.tif")),
        Just(Some("x.gif")),
        Just(Some("x.pgm")),
    ]
}

proptest! {
    // A fixed seed: every run tries the same cases (a failure reproduces; none comes and goes).
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x0b10_b57e),
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512), hint in hints()) {
        check(&bytes, hint)?;
    }

    #[test]
    fn arbitrary_bytes_after_a_dicom_preamble(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = vec![0u8; 128];
        bytes.extend_from_slice(b"DICM");
        bytes.extend_from_slice(&tail);
        check(&bytes, None)?;
    }

    #[test]
    fn mutated_dicom(
        which in any::<Index>(),
        changes in proptest::collection::vec((any::<Index>(), any::<u8>()), 1..6),
        cut in proptest::option::of(any::<Index>()),
    ) {
        let samples = dicom_samples();
        let sample = samples[which.index(samples.len())].clone();
        check(&mutate(sample, &changes, cut), Some("m.dcm"))?;
    }

    #[test]
    fn mutated_dicom_data_set_only(
        which in any::<Index>(),
        changes in proptest::collection::vec((any::<Index>(), any::<u8>()), 1..4),
    ) {
        // Changes after the 132-byte preamble + magic and a typical meta group, where the
        // element lengths and pixel attributes live.
        let samples = dicom_samples();
        let sample = samples[which.index(samples.len())].clone();
        let head = 300.min(sample.len());
        let (start, rest) = sample.split_at(head);
        let mut bytes = start.to_vec();
        bytes.extend(mutate(rest.to_vec(), &changes, None));
        check(&bytes, None)?;
    }

    #[test]
    fn mutated_raster(
        which in any::<Index>(),
        changes in proptest::collection::vec((any::<Index>(), any::<u8>()), 1..6),
        cut in proptest::option::of(any::<Index>()),
    ) {
        let samples = raster_samples();
        let (sample, name) = samples[which.index(samples.len())].clone();
        check(&mutate(sample, &changes, cut), Some(name))?;
    }
}

#[test]
fn samples_are_valid() {
    for bytes in dicom_samples() {
        decode(&bytes, None, &limits()).unwrap();
    }
    for (bytes, _) in raster_samples() {
        decode(&bytes, None, &limits()).unwrap();
    }
}
