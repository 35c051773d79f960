//! Replays the cargo-fuzz corpus kept in `crates/imageio/fuzz/corpus/dicom` (seeded with the
//! samples of every transfer syntax, grown by `scripts/fuzz-dicom --merge`): every input must
//! decode to an image or an error, without a panic caught inside a decoder, and read as a
//! structured report or an encapsulated document give one or an error.

use bs_imageio::{Limits, decode, encapsulated_document, structured_report};

#[test]
fn every_kept_fuzz_input_gives_an_image_or_an_error() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/corpus/dicom");
    let limits =
        Limits { max_pixels: 1 << 20, max_bytes: 64 << 20, max_frames: 1000, ..Limits::none() };
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        match decode(&bytes, Some("fuzz.dcm"), &limits) {
            Ok(d) => assert_eq!(d.frames.len() + 1, d.meta.frames_decoded as usize),
            Err(e) => assert!(!e.to_string().contains("decoder failed"), "{}: {e}", path.display()),
        }
        if let Ok(text) = structured_report(&bytes, &limits) {
            assert!(text.len() <= bytes.len() * 4 + (2 << 20), "{}", path.display());
        }
        if let Ok((_, doc)) = encapsulated_document(&bytes, &limits) {
            assert!(doc.len() <= bytes.len(), "{}", path.display());
        }
        seen += 1;
    }
    assert!(seen >= 10, "the corpus holds {seen} inputs");
}
