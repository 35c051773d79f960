//! Lossy grayscale JPEG through libjpeg-turbo's TurboJPEG 3 API, built from the sources
//! bundled in `turbojpeg-sys`: 12-bit (Extended, Process 4: 1.2.840.10008.1.2.4.51 with 12-bit
//! samples, the usual encoding of lossy CT and MR) and 8-bit grey (Baseline and Extended).
//! Written here by hand over the raw bindings because no pure-Rust decoder reads 12-bit lossy
//! JPEG (jpeg-decoder and zune-jpeg stop at 8 bits) and the safe `turbojpeg` crate exposes
//! only 8-bit samples. Colour stays with
//! jpeg-decoder (`jpeg.rs`), which lets DICOM's photometric interpretation choose the colour
//! transform; TurboJPEG decides it from the stream's markers alone.
//!
//! The stream's header is read first and checked against the DICOM header; the decoder then
//! runs with a pixel limit and stops on the first warning, so a cut or damaged stream is an
//! error rather than an image padded with grey. One warning is let through: bytes skipped
//! before a marker ("extraneous bytes before marker"), the padding older modalities leave
//! after the entropy-coded data, which libjpeg skips with the image whole (DCMTK and GDCM
//! accept such files). When the first warning is that one, the frame is decoded again without
//! stopping, and kept only if the last warning of that run is that one too: a stream that is
//! also cut or damaged ends with a different warning and stays an error.

use std::ffi::CStr;
use std::os::raw::c_int;

use turbojpeg_sys as tj;

use super::pixels::Layout;
use crate::error::ImageIoError;
use crate::format::Format;

const DICOM: Format = Format::Dicom;

/// One TurboJPEG decompressor, destroyed on drop.
struct Handle(tj::tjhandle);

impl Handle {
    fn new() -> Result<Self, ImageIoError> {
        // SAFETY: tj3Init takes a plain integer and returns a handle or NULL.
        let h = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as c_int) };
        if h.is_null() {
            return Err(ImageIoError::corrupt(DICOM, "JPEG: cannot start the decoder"));
        }
        Ok(Self(h))
    }

    fn set(&self, param: tj::TJPARAM, value: i32) -> Result<(), ImageIoError> {
        // SAFETY: the handle is valid until drop; parameters are plain integers.
        if unsafe { tj::tj3Set(self.0, param as c_int, value) } != 0 {
            return Err(self.error());
        }
        Ok(())
    }

    fn get(&self, param: tj::TJPARAM) -> i32 {
        // SAFETY: as for `set`.
        unsafe { tj::tj3Get(self.0, param as c_int) }
    }

    fn error(&self) -> ImageIoError {
        ImageIoError::corrupt(DICOM, format!("JPEG pixel data: {}", self.message()))
    }

    fn message(&self) -> String {
        // SAFETY: tj3GetErrorStr returns a NUL-terminated string owned by the handle, valid
        // until the next call on it; it is copied at once.
        let text = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.0)) };
        text.to_string_lossy().into_owned()
    }

    /// The last call failed on a warning that leaves the image whole (see the module
    /// documentation).
    fn only_skipped_bytes(&self) -> bool {
        // SAFETY: the handle is valid until drop.
        let code = unsafe { tj::tj3GetErrorCode(self.0) };
        code == tj::TJERR_TJERR_WARNING as c_int
            && self.message().contains("extraneous bytes before marker")
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

/// A decompressor with the stream's header read and checked against the DICOM header, a
/// pixel limit and stop-on-warning as `strict` says: ready for one `tj3Decompress*` call.
fn start(stream: &[u8], layout: &Layout, strict: bool) -> Result<Handle, ImageIoError> {
    let h = Handle::new()?;
    // SAFETY: the pointer and length describe `stream`, which outlives the call.
    if unsafe { tj::tj3DecompressHeader(h.0, stream.as_ptr(), stream.len() as tj::size_t) } != 0 {
        return Err(h.error());
    }
    let (w, rows) = (h.get(tj::TJPARAM_TJPARAM_JPEGWIDTH), h.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT));
    if (w as usize, rows as usize) != (layout.cols, layout.rows) {
        return Err(ImageIoError::corrupt(
            DICOM,
            format!("JPEG is {w}×{rows}, the DICOM header says {}×{}", layout.cols, layout.rows),
        ));
    }
    let pixels = layout.rows * layout.cols;
    h.set(tj::TJPARAM_TJPARAM_MAXPIXELS, i32::try_from(pixels).unwrap_or(i32::MAX))?;
    h.set(tj::TJPARAM_TJPARAM_STOPONWARNING, i32::from(strict))?;
    Ok(h)
}

/// Run `decompress` (one `tj3Decompress*` call into the caller's buffer) strictly, and once
/// more without stopping when the first warning is only skipped bytes (module documentation).
fn decompress(
    stream: &[u8],
    layout: &Layout,
    mut decompress: impl FnMut(&Handle) -> c_int,
) -> Result<(), ImageIoError> {
    let h = start(stream, layout, true)?;
    if decompress(&h) == 0 {
        return Ok(());
    }
    if !h.only_skipped_bytes() {
        return Err(h.error());
    }
    let h = start(stream, layout, false)?;
    if decompress(&h) == 0 || h.only_skipped_bytes() { Ok(()) } else { Err(h.error()) }
}

/// Decode one 8-bit lossy grayscale JPEG frame (Baseline or Extended) to 8-bit samples with
/// libjpeg-turbo: its integer IDCT is the IJG one DCMTK builds on, so the grey levels match
/// that toolkit's to the last bit; with NASM present at build time it also runs SIMD code.
pub(crate) fn decode8_gray(stream: &[u8], layout: &Layout) -> Result<Vec<u8>, ImageIoError> {
    let mut out = vec![0u8; layout.rows * layout.cols];
    // SAFETY: `out` holds rows × cols one-byte samples, the size the header was checked to
    // have (and the pixel limit enforces); pitch 0 means rows of `cols` samples.
    decompress(stream, layout, |h| unsafe {
        tj::tj3Decompress8(
            h.0,
            stream.as_ptr(),
            stream.len() as tj::size_t,
            out.as_mut_ptr(),
            0,
            tj::TJPF_TJPF_GRAY as c_int,
        )
    })?;
    Ok(out)
}

/// Decode one 12-bit (9 to 12 bits) lossy grayscale JPEG frame to native little-endian 16-bit
/// samples.
pub(crate) fn decode(stream: &[u8], layout: &Layout) -> Result<Vec<u8>, ImageIoError> {
    if layout.samples_per_pixel != 1 {
        return Err(ImageIoError::unsupported(DICOM, "12-bit lossy JPEG in colour"));
    }
    let pixels = layout.rows * layout.cols;
    let mut out = vec![0i16; pixels];
    // SAFETY: `out` holds width × height samples of one channel (pitch 0 = width), which is
    // what a TJPF_GRAY decode of the header just checked writes.
    decompress(stream, layout, |h| unsafe {
        tj::tj3Decompress12(
            h.0,
            stream.as_ptr(),
            stream.len() as tj::size_t,
            out.as_mut_ptr(),
            0,
            tj::TJPF_TJPF_GRAY as c_int,
        )
    })?;
    Ok(out.iter().flat_map(|&v| (v as u16).to_le_bytes()).collect())
}
