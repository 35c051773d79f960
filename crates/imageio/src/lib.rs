//! Image files in and out for blobstream, with no network code: PNG, JPEG, TIFF, GIF and
//! PGM/PPM read and written through the `image` crate (only those codecs compiled in), DICOM
//! Part 10 files read through dicom-rs, all into [`bs_imaging::DynImage`].
//!
//! - [`decode`] / [`read`] recognise the format by its bytes (DICOM by "DICM" at offset 128),
//!   then by the name's extension, check [`Limits`] against the header before allocating the
//!   image, and return the pixels with [`ImageMeta`] (dimensions, pixel type, and for DICOM the
//!   patient, study, series, modality, acquisition, rescale, window and transfer syntax tags).
//! - [`encode`] / [`write`] write any format but DICOM (see [`raster`] for what each takes).
//! - [`apply_window`] turns a decoded DICOM image into 8-bit for display using its stored
//!   window; the DICOM conversion policy is documented in [`dicom`].
//!
//! Errors ([`ImageIoError`]) name the file and the reason. No input makes these functions
//! panic: the decoders this crate owns return errors, and as a last guard a panic inside a
//! third-party decoder is caught and reported as corrupt data.

pub mod dicom;
pub mod error;
pub mod format;
pub mod meta;
pub mod raster;
pub mod window;

use std::panic::AssertUnwindSafe;
use std::path::Path;

use bs_imaging::DynImage;

pub use dicom::{DicomIds, dicom_ids, encapsulated_document, structured_report};
pub use error::ImageIoError;
pub use format::Format;
pub use meta::{Decoded, ImageMeta, Limits};
pub use raster::JPEG_QUALITY;
pub use window::{
    apply_window, apply_window_with, in_modality_units, modality_intercept, to_eight_bits,
    voi_linear,
};

/// Decode an image from memory. `hint` is a file name or extension, used to name the input in
/// errors and to choose the format when the bytes do not identify it.
pub fn decode(bytes: &[u8], hint: Option<&str>, limits: &Limits) -> Result<Decoded, ImageIoError> {
    let name = hint.unwrap_or(error::NO_FILE);
    decode_named(bytes, hint, limits).map_err(|e| e.with_file(name))
}

fn decode_named(
    bytes: &[u8],
    hint: Option<&str>,
    limits: &Limits,
) -> Result<Decoded, ImageIoError> {
    limits.check_input(bytes.len())?;
    let by_name = hint.and_then(Format::from_name);
    let format = match (Format::from_magic(bytes), by_name) {
        (Some(format), _) | (None, Some(format)) => format,
        (None, None) => {
            return Err(ImageIoError::unsupported_format(if bytes.is_empty() {
                "empty input".to_string()
            } else {
                "not a PNG, JPEG, TIFF, GIF, PGM/PPM or DICOM file".to_string()
            }));
        }
    };
    let run = || match format {
        Format::Dicom => dicom::decode(bytes, limits),
        other => raster::decode(bytes, other, limits),
    };
    match std::panic::catch_unwind(AssertUnwindSafe(run)) {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(ImageIoError::corrupt(format, format!("decoder failed: {what}")))
        }
    }
}

/// Read and decode an image file. A file larger than [`Limits::max_bytes`] is refused before
/// it is read.
pub fn read(path: impl AsRef<Path>, limits: &Limits) -> Result<Decoded, ImageIoError> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let io = |source| ImageIoError::Io { file: name.clone(), source };
    let meta = std::fs::metadata(path).map_err(io)?;
    let size = meta.len();
    if size > limits.max_bytes {
        return Err(ImageIoError::too_many_bytes(
            format!("file of {size} bytes"),
            limits.max_bytes,
        )
        .with_file(&name));
    }
    if !meta.is_file() {
        // A pipe or a device (`/dev/stdin`, `<(…)`): read it, one byte past the limit at most
        // (which `decode` then refuses).
        use std::io::Read;
        let mut bytes = Vec::new();
        let file = std::fs::File::open(path).map_err(io)?;
        file.take(limits.max_bytes.saturating_add(1)).read_to_end(&mut bytes).map_err(io)?;
        return decode(&bytes, Some(&name), limits);
    }
    let file = std::fs::File::open(path).map_err(io)?;
    if size == 0 {
        return decode(&[], Some(&name), limits);
    }
    // Mapped, not read: a decoder touches only what it needs (the header and the frames it
    // decodes), and those pages stay the page cache's, not this process's heap.
    // SAFETY: the map is read-only and lives for this call; a file truncated meanwhile by
    // another program would fault, as with any mmap reader.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    decode(&map, Some(&name), limits)
}

/// Encode an image in a format (any but DICOM).
pub fn encode(image: &DynImage, format: Format) -> Result<Vec<u8>, ImageIoError> {
    raster::encode(image, format)
}

/// Write an image to a file, choosing the format by the extension (`.pgm` must be gray and
/// `.ppm` RGB).
pub fn write(path: impl AsRef<Path>, image: &DynImage) -> Result<(), ImageIoError> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
    let Some(format) = Format::from_extension(&ext) else {
        return Err(ImageIoError::unsupported_format(format!(
            "no image format for the extension {ext:?}"
        ))
        .with_file(&name));
    };
    let mismatch = match ext.as_str() {
        "pgm" => image.channels() != 1,
        "ppm" => image.channels() != 3,
        _ => false,
    };
    if mismatch {
        return Err(ImageIoError::unsupported(
            format,
            format!("a .{ext} file cannot hold {} pixels", image.kind()),
        )
        .with_file(&name));
    }
    let bytes = encode(image, format).map_err(|e| e.with_file(&name))?;
    std::fs::write(path, bytes).map_err(|source| ImageIoError::Io { file: name, source })
}
