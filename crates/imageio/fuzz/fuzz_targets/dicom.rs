//! Fuzz target: any bytes read as DICOM must give an image or an error, within the limits,
//! never a panic, a crash or a hang; read as a structured report or an encapsulated
//! document, text, a document or an error.
#![no_main]

use bs_imageio::{Limits, decode, encapsulated_document, structured_report};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_pixels: 1 << 20, max_bytes: 64 << 20, max_frames: 1000, ..Limits::none() };
    if let Ok(d) = decode(data, Some("fuzz.dcm"), &limits) {
        assert_eq!(d.meta.width as usize, d.image.width());
        assert_eq!(d.frames.len() + 1, d.meta.frames_decoded as usize);
    }
    let _ = structured_report(data, &limits);
    let _ = encapsulated_document(data, &limits);
});
