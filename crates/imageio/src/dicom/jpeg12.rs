//! Grayscale JPEG through libjpeg-turbo's TurboJPEG 3 API, built from the sources bundled in
//! `turbojpeg-sys`: lossy 12-bit (Extended, Process 4: 1.2.840.10008.1.2.4.51 with 12-bit
//! samples, the usual encoding of lossy CT and MR) and 8-bit (Baseline and Extended), and
//! lossless (Process 14, any predictor, 2 to 16 bits: .57 and .70).
//! Written here by hand over the raw bindings because no pure-Rust decoder reads 12-bit lossy
//! JPEG (jpeg-decoder and zune-jpeg stop at 8 bits) and the safe `turbojpeg` crate exposes
//! only 8-bit samples. TurboJPEG decides a colour stream's transform from its markers alone,
//! so 8-bit colour comes here only where that agrees with DICOM's photometric interpretation;
//! elsewhere it stays with jpeg-decoder (`jpeg.rs`), which lets the label choose.
//!
//! The stream's header is read first and checked against the DICOM header; the decoder then
//! runs with a pixel limit and stops on the first warning, so a cut or damaged stream is an
//! error rather than an image padded with grey. One case is let through: a few bytes (at most
//! [`MAX_PADDING`]) before the final end-of-image marker that libjpeg skips ("N extraneous
//! bytes before marker 0xd9"), the padding older modalities leave after the entropy-coded
//! data (DCMTK and GDCM accept such files). Those N bytes are taken out and the stream is
//! decoded again, strictly: it is kept only if that decode has no warning at all, so a stream
//! that is also cut or damaged elsewhere stays an error. (Like any JPEG decoder, this cannot
//! tell padding from entropy data so damaged that it ends a few bytes early.)
//!
//! A tall 12-bit lossy frame is decoded in two bands of rows at once ([`decode_bands`]).

use std::ffi::CStr;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

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

    /// Decode only rows `top .. top + rows` of the frame (full width) in the next call.
    fn set_rows(&self, top: usize, rows: usize) -> Result<(), ImageIoError> {
        let region = tj::tjregion { x: 0, y: top as c_int, w: 0, h: rows as c_int };
        // SAFETY: a live handle whose header was read (`start`), and a plain struct.
        if unsafe { tj::tj3SetCroppingRegion(self.0, region) } != 0 {
            return Err(self.error());
        }
        Ok(())
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

    /// After a strict call failed: `stream` without the padding its warning names, when the
    /// warning is padding before the final end-of-image marker (module documentation).
    fn without_padding(&self, stream: &[u8]) -> Option<Vec<u8>> {
        // SAFETY: the handle is valid until drop.
        if unsafe { tj::tj3GetErrorCode(self.0) } != tj::TJERR_TJERR_WARNING as c_int {
            return None;
        }
        let msg = self.message();
        let n: usize = msg
            .strip_prefix("Corrupt JPEG data: ")?
            .strip_suffix(" extraneous bytes before marker 0xd9")?
            .parse()
            .ok()?;
        // The end-of-image marker, then at most DICOM's zero padding to an even length.
        let end = stream.len() - stream.iter().rev().take_while(|&&b| b == 0).count();
        let eoi = end.checked_sub(2).filter(|&e| stream[e..end] == [0xff, 0xd9])?;
        // Fill bytes (0xFF) before a marker are allowed, and libjpeg does not count them.
        let at = eoi - stream[..eoi].iter().rev().take_while(|&&b| b == 0xff).count();
        if n == 0 || n > MAX_PADDING || n > at {
            return None;
        }
        Some([&stream[..at - n], &stream[at..]].concat())
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

/// Bytes of padding before the end-of-image marker a stream may have and still decode.
const MAX_PADDING: usize = 16;

/// Run `decompress` (one `tj3Decompress*` call on the stream it is given, into the caller's
/// buffer), strictly; when the only trouble is padding before the end marker, again on the
/// stream without it, as strictly (module documentation). With `rows`, only those rows of
/// the frame are decoded (`Handle::set_rows`).
fn decompress(
    stream: &[u8],
    layout: &Layout,
    rows: Option<(usize, usize)>,
    mut decompress: impl FnMut(&Handle, &[u8]) -> c_int,
) -> Result<(), ImageIoError> {
    let begin = |s: &[u8]| {
        let h = start(s, layout, true)?;
        if let Some((top, n)) = rows {
            h.set_rows(top, n)?;
        }
        Ok::<_, ImageIoError>(h)
    };
    let h = begin(stream)?;
    if decompress(&h, stream) == 0 {
        return Ok(());
    }
    let Some(trimmed) = h.without_padding(stream) else { return Err(h.error()) };
    let again = begin(&trimmed)?;
    if decompress(&again, &trimmed) == 0 { Ok(()) } else { Err(again.error()) }
}

/// Lossy grey frames with at least this many rows are decoded in two bands at once.
const BAND_ROWS: usize = 256;

/// 12-bit lossy decodes under way in this process (see [`decode_bands`]).
static DECODING: AtomicUsize = AtomicUsize::new(0);

/// One decode under way, counted in [`DECODING`] while it lives.
struct Decoding {
    alone: bool,
}

impl Decoding {
    fn start() -> Self {
        Self { alone: DECODING.fetch_add(1, Ordering::SeqCst) == 0 }
    }
}

impl Drop for Decoding {
    fn drop(&mut self) {
        DECODING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Decode a frame whole into `out`: rows × cols pixels of `channels` samples (TJPF_GRAY for
/// 1, TJPF_RGB for 3).
fn decode_whole<T: TjSample>(
    stream: &[u8],
    layout: &Layout,
    channels: usize,
    out: &mut [T],
) -> Result<(), ImageIoError> {
    let pf = if channels == 3 { tj::TJPF_TJPF_RGB } else { tj::TJPF_TJPF_GRAY } as c_int;
    assert_eq!(out.len(), layout.rows * layout.cols * channels, "TurboJPEG output size");
    // SAFETY: `out` holds rows × cols pixels of `channels` samples (asserted), the size the
    // header was checked to have (and the pixel limit enforces), what a decode in `pf` writes.
    decompress(stream, layout, None, |h, s| unsafe { T::decompress(h, s, out, pf) })
}

/// Decode a lossy grey frame into `out` (rows × cols samples) in two bands of rows at once,
/// on two threads.
///
/// libjpeg-turbo decodes a band by skipping the rows above and below it. Skipping the rows
/// above runs only their Huffman decoding, not their inverse DCT (the simple case of
/// `jpeg_skip_scanlines`: one scan, no upsampling, as grey is); skipping the rows below, to
/// the end, costs nothing. So the lower band pays the whole frame's entropy decoding (and so
/// checks all of it) but only its own rows' inverse DCT and output (12-bit samples have no
/// SIMD inverse DCT in libjpeg-turbo: it is a third of a decode), the upper band only its
/// own rows: it takes more of them ([`upper_share`]). The 512 × 512 12-bit phantom of
/// `blobstream bench dicom` decodes at 850 MB/s instead of 650 whole. The upper band's rows
/// are entropy-decoded twice, though, so [`decode`] bands a frame only while no other 12-bit
/// decode runs (otherwise the cores have other frames to work on). The lower band runs on
/// rayon's pool: while the pool is busy (filters), it starts when a worker is free.
fn decode_bands<T: TjSample + Send>(
    stream: &[u8],
    layout: &Layout,
    out: &mut [T],
) -> Result<(), ImageIoError> {
    let pf = tj::TJPF_TJPF_GRAY as c_int;
    assert_eq!(out.len(), layout.rows * layout.cols, "TurboJPEG output size");
    // Split on an iMCU row (8 rows for grey), so the lower band starts on a whole one.
    let split = (layout.rows as f64 * upper_share(stream, layout)) as usize & !7;
    let (upper, lower) = out.split_at_mut(split * layout.cols);
    // The upper band on this thread, the lower one on the pool's (`rayon::join` from outside
    // the pool ran both there, waking two threads, and was slower than one whole decode).
    let mut b = Ok(());
    let a = rayon::in_place_scope(|sc| {
        sc.spawn(|_| {
            let rows = Some((split, layout.rows - split));
            // SAFETY: `lower` holds the rows from `split` on (`out` is the whole frame:
            // asserted), what this band writes.
            b = decompress(stream, layout, rows, |h, s| unsafe { T::decompress(h, s, lower, pf) });
        });
        // SAFETY: `upper` holds the first `split` rows, what this band writes.
        decompress(stream, layout, Some((0, split)), |h, s| unsafe {
            T::decompress(h, s, upper, pf)
        })
    });
    a.and(b)
}

/// The share of a frame's rows the upper band decodes. The lower band reads the upper one's
/// entropy-coded data too (Huffman only) to skip its rows, so even halves finish apart: the
/// upper band takes more rows, the more so the denser the data is. Measured on the bench phantom at
/// quality 50 to 98 (1.1 to 3.5 bits per pixel), the fastest split took 62 % to 72 % of the
/// rows, and this line follows those; an even split was 10 to 15 % slower.
fn upper_share(stream: &[u8], layout: &Layout) -> f64 {
    let bits_per_pixel = 8.0 * stream.len() as f64 / (layout.rows * layout.cols).max(1) as f64;
    (0.58 + 0.04 * bits_per_pixel).clamp(0.5, 0.8)
}

/// A sample type a TurboJPEG decode writes: the function for its precision, and how the
/// samples become this crate's native little-endian bytes.
trait TjSample: Copy + Default {
    /// One `tj3Decompress*` call of `stream` into `out`, pixel format `pf`, pitch 0.
    ///
    /// # Safety
    ///
    /// `out` holds the frame the handle's header describes, in `pf`'s samples per pixel.
    unsafe fn decompress(h: &Handle, stream: &[u8], out: &mut [Self], pf: c_int) -> c_int;
    fn into_bytes(samples: Vec<Self>) -> Vec<u8>;
}

impl TjSample for u8 {
    unsafe fn decompress(h: &Handle, stream: &[u8], out: &mut [u8], pf: c_int) -> c_int {
        let len = stream.len() as tj::size_t;
        // SAFETY: as the caller promises; `stream` outlives the call.
        unsafe { tj::tj3Decompress8(h.0, stream.as_ptr(), len, out.as_mut_ptr(), 0, pf) }
    }
    fn into_bytes(samples: Vec<u8>) -> Vec<u8> {
        samples
    }
}

/// 9 to 12 bits (TurboJPEG's `J12SAMPLE`).
impl TjSample for i16 {
    unsafe fn decompress(h: &Handle, stream: &[u8], out: &mut [i16], pf: c_int) -> c_int {
        let len = stream.len() as tj::size_t;
        // SAFETY: as the caller promises; `stream` outlives the call.
        unsafe { tj::tj3Decompress12(h.0, stream.as_ptr(), len, out.as_mut_ptr(), 0, pf) }
    }
    fn into_bytes(samples: Vec<i16>) -> Vec<u8> {
        le16_bytes(samples.iter().map(|&v| v as u16))
    }
}

/// 13 to 16 bits (lossless only).
impl TjSample for u16 {
    unsafe fn decompress(h: &Handle, stream: &[u8], out: &mut [u16], pf: c_int) -> c_int {
        let len = stream.len() as tj::size_t;
        // SAFETY: as the caller promises; `stream` outlives the call.
        unsafe { tj::tj3Decompress16(h.0, stream.as_ptr(), len, out.as_mut_ptr(), 0, pf) }
    }
    fn into_bytes(samples: Vec<u16>) -> Vec<u8> {
        le16_bytes(samples.iter().copied())
    }
}

/// 16-bit samples as little-endian bytes (a loop the compiler vectorises; collecting
/// `flat_map(to_le_bytes)` went byte by byte).
fn le16_bytes(samples: impl ExactSizeIterator<Item = u16>) -> Vec<u8> {
    let mut bytes = vec![0u8; samples.len() * 2];
    for (b, v) in bytes.chunks_exact_mut(2).zip(samples) {
        b.copy_from_slice(&v.to_le_bytes());
    }
    bytes
}

/// Decode one frame of `channels` samples per pixel (TJPF_GRAY for 1, TJPF_RGB for 3) into
/// samples of type `T`, as native little-endian bytes.
fn decode_as<T: TjSample>(
    stream: &[u8],
    layout: &Layout,
    channels: usize,
) -> Result<Vec<u8>, ImageIoError> {
    let mut out = vec![T::default(); layout.rows * layout.cols * channels];
    decode_whole(stream, layout, channels, &mut out)?;
    Ok(T::into_bytes(out))
}

/// Decode one 8-bit lossy grayscale JPEG frame (Baseline or Extended) to 8-bit samples with
/// libjpeg-turbo: its integer IDCT is the IJG one DCMTK builds on, so the grey levels match
/// that toolkit's to the last bit; with NASM present at build time it also runs SIMD code.
pub(crate) fn decode8_gray(stream: &[u8], layout: &Layout) -> Result<Vec<u8>, ImageIoError> {
    decode_as::<u8>(stream, layout, 1)
}

/// Decode one 8-bit lossy three-component JPEG frame to interleaved 8-bit RGB, converted from
/// YCbCr or not as libjpeg's rule says (the caller checked that is what DICOM asks for).
pub(crate) fn decode8_rgb(stream: &[u8], layout: &Layout) -> Result<Vec<u8>, ImageIoError> {
    decode_as::<u8>(stream, layout, 3)
}

/// Decode one 12-bit (9 to 12 bits) lossy grayscale JPEG frame to native little-endian 16-bit
/// samples.
pub(crate) fn decode(stream: &[u8], layout: &Layout) -> Result<Vec<u8>, ImageIoError> {
    if layout.samples_per_pixel != 1 {
        return Err(ImageIoError::unsupported(DICOM, "12-bit lossy JPEG in colour"));
    }
    let mut out = vec![0i16; layout.rows * layout.cols];
    let decoding = Decoding::start();
    if decoding.alone && layout.rows >= BAND_ROWS && rayon::current_num_threads() > 1 {
        decode_bands(stream, layout, &mut out)?;
    } else {
        decode_whole(stream, layout, 1, &mut out)?;
    }
    Ok(i16::into_bytes(out))
}

/// Decode one lossless grayscale JPEG frame (Process 14, any predictor: 1.2.840.10008.1.2.4.57
/// and .70) of `precision` bits (2 to 16) to native samples: one byte each up to 8 bits, else
/// two, little-endian. libjpeg-turbo's lossless decoder, which took 1.3 ms for a 512 × 512
/// 12-bit CT slice where `jpeg-decoder` took 3.3 (predictor 1; 1.5 against 4.1 with
/// predictor 6).
pub(crate) fn decode_lossless_gray(
    stream: &[u8],
    layout: &Layout,
    precision: u8,
) -> Result<Vec<u8>, ImageIoError> {
    match precision {
        0..=8 => decode_as::<u8>(stream, layout, 1),
        9..=12 => decode_as::<i16>(stream, layout, 1),
        _ => decode_as::<u16>(stream, layout, 1),
    }
}

/// A grayscale JPEG of `samples` (`width` × `height`, row by row, each below 2^`precision`)
/// made by libjpeg-turbo: lossy (Baseline at 8 bits, Extended at 12) at `quality`, or
/// lossless (Process 14, 2 to 16 bits) with predictor `psv` (1–7; predictor 1 is the SV1 of
/// 1.2.840.10008.1.2.4.70). What tests and benchmarks make their 12-bit and lossless JPEG
/// files with: no other tool here writes them (Pillow and pydicom cannot).
///
/// # Panics
///
/// If `samples` does not hold `width × height` values.
pub fn encode_gray(
    samples: &[u16],
    width: usize,
    height: usize,
    precision: u8,
    lossless_psv: Option<i32>,
    quality: i32,
) -> Result<Vec<u8>, ImageIoError> {
    assert_eq!(samples.len(), width * height, "JPEG: samples for {width} × {height}");
    let fail = |what: &str| ImageIoError::unsupported(Format::Jpeg, format!("encoding: {what}"));
    let (w, h) = (c_int::try_from(width), c_int::try_from(height));
    let (Ok(w), Ok(h)) = (w, h) else { return Err(fail("too large")) };
    // SAFETY: tj3Init takes a plain integer and returns a handle or NULL.
    let handle = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_COMPRESS as c_int) };
    if handle.is_null() {
        return Err(fail("no compressor"));
    }
    let handle = Handle(handle);
    let set = |p: tj::TJPARAM, v: c_int| {
        // SAFETY: a live handle and a parameter of the TurboJPEG 3 API.
        (unsafe { tj::tj3Set(handle.0, p as c_int, v) } == 0).then_some(()).ok_or(())
    };
    let mut params = vec![
        (tj::TJPARAM_TJPARAM_PRECISION, c_int::from(precision)),
        (tj::TJPARAM_TJPARAM_SUBSAMP, tj::TJSAMP_TJSAMP_GRAY as c_int),
    ];
    match lossless_psv {
        Some(psv) => {
            params.push((tj::TJPARAM_TJPARAM_LOSSLESS, 1));
            params.push((tj::TJPARAM_TJPARAM_LOSSLESSPSV, psv));
        }
        None => params.push((tj::TJPARAM_TJPARAM_QUALITY, quality)),
    }
    if params.into_iter().any(|(p, v)| set(p, v).is_err()) {
        return Err(fail("a parameter was refused"));
    }
    let mut buf: *mut u8 = std::ptr::null_mut();
    let mut size: tj::size_t = 0;
    let gray = tj::TJPF_TJPF_GRAY as c_int;
    // SAFETY (each call): the source holds width × height samples of the type the function
    // for that precision reads, one row after another (pitch 0); the library allocates the
    // output, which is copied and freed below.
    let rc = match precision {
        0..=8 => {
            let data: Vec<u8> = samples.iter().map(|&v| v as u8).collect();
            unsafe { tj::tj3Compress8(handle.0, data.as_ptr(), w, 0, h, gray, &mut buf, &mut size) }
        }
        9..=12 => {
            let data: Vec<i16> = samples.iter().map(|&v| (v & 0x0fff) as i16).collect();
            unsafe {
                tj::tj3Compress12(handle.0, data.as_ptr(), w, 0, h, gray, &mut buf, &mut size)
            }
        }
        _ => unsafe {
            tj::tj3Compress16(handle.0, samples.as_ptr(), w, 0, h, gray, &mut buf, &mut size)
        },
    };
    if rc != 0 || buf.is_null() {
        return Err(fail("the compressor failed"));
    }
    // SAFETY: the library wrote `size` bytes at `buf`, freed once copied.
    let out = unsafe { std::slice::from_raw_parts(buf, size as usize).to_vec() };
    // SAFETY: `buf` came from the library's allocator.
    unsafe { tj::tj3Free(buf.cast()) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dicom::pixels::grey_layout;

    /// A 12-bit frame with edges and noise, so every block has coefficients to decode.
    fn frame(rows: usize, cols: usize) -> Vec<u16> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..rows * cols)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let (r, c) = (i / cols, i % cols);
                let disc = if (r as i64 - 150).pow(2) + (c as i64 - 160).pow(2) < 110 * 110 {
                    1800
                } else {
                    200
                };
                (disc + (r * 7 + c * 3) % 500 + (x % 64) as usize) as u16
            })
            .collect()
    }

    fn whole(stream: &[u8], l: &Layout) -> Result<Vec<i16>, ImageIoError> {
        let mut out = vec![0i16; l.rows * l.cols];
        decode_whole(stream, l, 1, &mut out).map(|()| out)
    }

    fn bands(stream: &[u8], l: &Layout) -> Result<Vec<i16>, ImageIoError> {
        let mut out = vec![0i16; l.rows * l.cols];
        decode_bands(stream, l, &mut out).map(|()| out)
    }

    #[test]
    fn two_bands_decode_to_exactly_the_whole_frames_samples() {
        // Heights with the split on and off a multiple of 16, and a last iMCU row cut short.
        for (rows, cols) in [(256, 320), (300, 200), (263, 129), (512, 64)] {
            let stream = encode_gray(&frame(rows, cols), cols, rows, 12, None, 90).unwrap();
            let l = grey_layout(rows, cols, 12);
            let want = whole(&stream, &l).unwrap();
            assert_eq!(bands(&stream, &l).unwrap(), want, "{rows} × {cols}");
            // The public path, alone in its process or not, gives the same samples.
            let mut bytes = Vec::new();
            for v in &want {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            assert_eq!(decode(&stream, &l).unwrap(), bytes, "{rows} × {cols}");
        }
    }

    #[test]
    fn in_bands_a_damaged_stream_is_an_error_wherever_the_damage_is() {
        let (rows, cols) = (320, 256);
        let stream = encode_gray(&frame(rows, cols), cols, rows, 12, None, 90).unwrap();
        let l = grey_layout(rows, cols, 12);
        // Cut in the upper band's rows, in the lower band's, and just before the end marker:
        // the lower band entropy-decodes the whole stream (the upper one's rows to skip them)
        // and sees any cut.
        for keep in [stream.len() / 4, stream.len() * 3 / 4, stream.len() - 3] {
            let res = bands(&stream[..keep], &l);
            assert!(res.is_err(), "cut to {keep} of {} bytes decoded", stream.len());
        }
        // Padding before the end marker is let through in bands as whole (module docs).
        let mut padded = stream[..stream.len() - 2].to_vec();
        padded.extend_from_slice(&[0, 0, 0, 0xFF, 0xD9]);
        assert_eq!(bands(&padded, &l).unwrap(), whole(&stream, &l).unwrap());
    }
}
