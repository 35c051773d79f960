//! Pixel buffers: row-major, channels interleaved, no row padding.
//!
//! [`Image<T>`] holds samples of one type (`u8` or `u16`) with 1 (gray), 3 (RGB) or 4 (RGBA)
//! channels; [`DynImage`] is either. Filters that treat colour and alpha differently say so in
//! their own documentation; unless stated, alpha is copied through unchanged.

use std::sync::Mutex;

use crate::error::ImagingError;

/// A sample type: `u8` or `u16`.
pub trait Sample: Copy + Default + PartialEq + Send + Sync + std::fmt::Debug + 'static {
    /// Largest value (255 or 65535).
    const MAX: u32;
    fn to_u32(self) -> u32;
    /// From a value already in `0..=MAX`.
    fn from_u32(v: u32) -> Self;
    /// From any value, clamped into `0..=MAX`.
    fn clamp_i32(v: i32) -> Self {
        Self::from_u32(v.clamp(0, Self::MAX as i32) as u32)
    }
    /// Sample buffers of this type kept for reuse (see [`Image::for_overwrite`]).
    fn spares() -> &'static Spares<Self>;
}

impl Sample for u8 {
    const MAX: u32 = 255;
    #[inline(always)]
    fn to_u32(self) -> u32 {
        self as u32
    }
    #[inline(always)]
    fn from_u32(v: u32) -> Self {
        v as u8
    }
    fn spares() -> &'static Spares<Self> {
        static S: Spares<u8> = Spares::new();
        &S
    }
}

impl Sample for u16 {
    const MAX: u32 = 65535;
    #[inline(always)]
    fn to_u32(self) -> u32 {
        self as u32
    }
    #[inline(always)]
    fn from_u32(v: u32) -> Self {
        v as u16
    }
    fn spares() -> &'static Spares<Self> {
        static S: Spares<u16> = Spares::new();
        &S
    }
}

/// Sample buffers of big images that were dropped, kept for the next image of the same
/// length made by [`Image::for_overwrite`]: its pages are in place, where a fresh buffer
/// costs the kernel zeroing every page as it is first written (or `calloc` a memset of the
/// whole), a quarter to a third of a fast filter's time on a 2048² or 4096² image.
pub struct Spares<T> {
    bufs: Mutex<Vec<Vec<T>>>,
}

/// Buffers smaller than this are not kept (a fresh one costs little). Unit tests keep every
/// size, so that their filters run on reused buffers too.
const SPARE_FROM_BYTES: usize = if cfg!(test) { 1 } else { 256 << 10 };

/// Buffers kept per sample type, at most.
const SPARES: usize = 4;

/// Bytes of buffers kept per sample type, at most (a few 4096² RGB images).
const SPARE_BYTES: usize = 256 << 20;

impl<T: Sample> Spares<T> {
    const fn new() -> Self {
        Self { bufs: Mutex::new(Vec::new()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<T>>> {
        self.bufs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kept buffer of exactly `len` samples (contents: another image's): the one kept
    /// last, whose lines are the likeliest to be still in the cache. (Taking the oldest
    /// cycled a run of filters through every kept buffer of the size, each written from
    /// memory: the 3×3 median of a 2048² RGB image ran at 0.7× its speed on one buffer.)
    fn take(&self, len: usize) -> Option<Vec<T>> {
        let mut bufs = self.lock();
        let at = bufs.iter().rposition(|b| b.len() == len)?;
        Some(bufs.remove(at))
    }

    /// Keep `buf` if it is big enough to be worth it and there is room; the oldest goes to
    /// make room (freed after the lock is let go).
    fn keep(&self, buf: Vec<T>) {
        let bytes = std::mem::size_of_val(buf.as_slice());
        if !(SPARE_FROM_BYTES..=SPARE_BYTES).contains(&bytes) {
            return;
        }
        let mut gone = Vec::new();
        let mut bufs = self.lock();
        bufs.push(buf);
        let size = |b: &Vec<T>| std::mem::size_of_val(b.as_slice());
        while bufs.len() > SPARES || bufs.iter().map(size).sum::<usize>() > SPARE_BYTES {
            gone.push(bufs.remove(0));
        }
        drop(bufs);
        drop(gone);
    }
}

/// Ask for transparent huge pages behind a large, not yet touched buffer. Advice only: the
/// contents are unaffected and failure is harmless.
fn advise_huge_pages<T>(data: &[T]) {
    const HUGE: usize = 2 << 20;
    let bytes = std::mem::size_of_val(data);
    if bytes < 2 * HUGE {
        return;
    }
    let start = data.as_ptr() as usize;
    let (lo, hi) = (start.next_multiple_of(HUGE), (start + bytes) / HUGE * HUGE);
    if hi > lo {
        // SAFETY: [lo, hi) lies inside the live allocation behind `data`; MADV_HUGEPAGE
        // changes how it is backed, never what it holds.
        unsafe {
            libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
        }
    }
}

/// An image of one sample type.
#[derive(Debug, PartialEq)]
pub struct Image<T: Sample> {
    pub width: usize,
    pub height: usize,
    /// 1 (gray), 3 (RGB) or 4 (RGBA).
    pub channels: usize,
    /// `width * height * channels` samples, row after row.
    pub data: Vec<T>,
}

/// A big image's buffer is kept for the next [`Image::for_overwrite`] of its size.
impl<T: Sample> Drop for Image<T> {
    fn drop(&mut self) {
        T::spares().keep(std::mem::take(&mut self.data));
    }
}

/// A copy in a buffer advised onto huge pages like [`Image::new`]'s (a derived `clone` would
/// fault a 4096² RGB copy in 4 KiB at a time: a quarter of `spread`'s time at that size when
/// it began with a copy).
impl<T: Sample> Clone for Image<T> {
    fn clone(&self) -> Self {
        let mut data = Vec::with_capacity(self.data.len());
        advise_huge_pages(data.spare_capacity_mut());
        data.extend_from_slice(&self.data);
        Self { width: self.width, height: self.height, channels: self.channels, data }
    }
}

impl<T: Sample> Image<T> {
    /// An image filled with `T::default()` (black, transparent). Big buffers are advised onto
    /// transparent huge pages, so filling a fresh 4096² output costs a few hundred page faults
    /// rather than tens of thousands (numpy, and so OpenCV from Python, does the same).
    pub fn new(width: usize, height: usize, channels: usize) -> Self {
        let data = vec![T::default(); width * height * channels];
        advise_huge_pages(&data);
        Self { width, height, channels, data }
    }

    /// An image whose every sample the caller overwrites before anyone reads it: in a buffer
    /// of a dropped image of the same size when one is kept (see [`Spares`]), holding that
    /// image's samples until then, else as [`Image::new`]. Only for outputs written whole —
    /// a sample left unwritten would show another image's pixel. (Unit tests fill a reused
    /// buffer with a pattern first, so that a filter leaving samples unwritten fails them.)
    pub fn for_overwrite(width: usize, height: usize, channels: usize) -> Self {
        Self::for_overwrite_from(T::spares(), width, height, channels)
    }

    /// [`Image::for_overwrite`] from `spares`.
    fn for_overwrite_from(
        spares: &Spares<T>,
        width: usize,
        height: usize,
        channels: usize,
    ) -> Self {
        let len = width * height * channels;
        match spares.take(len) {
            Some(mut data) => {
                if cfg!(test) {
                    data.fill(T::from_u32(0xA5 & T::MAX));
                }
                Self { width, height, channels, data }
            }
            None => Self::new(width, height, channels),
        }
    }

    /// Wrap samples, checking the shape.
    pub fn from_vec(
        width: usize,
        height: usize,
        channels: usize,
        data: Vec<T>,
    ) -> Result<Self, ImagingError> {
        let img = Self { width, height, channels, data };
        img.validate()?;
        Ok(img)
    }

    /// Check that the (public) fields agree: 1, 3 or 4 channels and exactly
    /// `width × height × channels` samples. Filters call this before indexing.
    pub fn validate(&self) -> Result<(), ImagingError> {
        if !matches!(self.channels, 1 | 3 | 4) {
            return Err(ImagingError::InvalidImage(format!(
                "{} channels (need 1, 3 or 4)",
                self.channels
            )));
        }
        let want = self.width.checked_mul(self.height).and_then(|p| p.checked_mul(self.channels));
        if want != Some(self.data.len()) {
            return Err(ImagingError::InvalidImage(format!(
                "{}×{}×{} needs {want:?} samples, got {}",
                self.width,
                self.height,
                self.channels,
                self.data.len()
            )));
        }
        Ok(())
    }

    /// Samples of row `y`.
    #[inline]
    pub fn row(&self, y: usize) -> &[T] {
        let w = self.width * self.channels;
        &self.data[y * w..(y + 1) * w]
    }

    /// Mutable samples of row `y`.
    #[inline]
    pub fn row_mut(&mut self, y: usize) -> &mut [T] {
        let w = self.width * self.channels;
        &mut self.data[y * w..(y + 1) * w]
    }

    /// The sample of channel `c` at (`x`, `y`).
    #[inline]
    pub fn get(&self, x: usize, y: usize, c: usize) -> T {
        self.data[(y * self.width + x) * self.channels + c]
    }

    /// Number of colour channels (alpha excluded).
    pub fn color_channels(&self) -> usize {
        if self.channels == 4 { 3 } else { self.channels }
    }

    pub fn has_alpha(&self) -> bool {
        self.channels == 4
    }
}

/// Pixel layout names used in listings and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PixelKind {
    Gray8,
    Gray16,
    Rgb8,
    Rgb16,
    Rgba8,
    Rgba16,
}

impl PixelKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Gray8 => "gray8",
            Self::Gray16 => "gray16",
            Self::Rgb8 => "rgb8",
            Self::Rgb16 => "rgb16",
            Self::Rgba8 => "rgba8",
            Self::Rgba16 => "rgba16",
        }
    }
}

impl std::fmt::Display for PixelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An image of either sample type.
#[derive(Debug, Clone, PartialEq)]
pub enum DynImage {
    U8(Image<u8>),
    U16(Image<u16>),
}

impl DynImage {
    pub fn width(&self) -> usize {
        match self {
            Self::U8(i) => i.width,
            Self::U16(i) => i.width,
        }
    }

    pub fn height(&self) -> usize {
        match self {
            Self::U8(i) => i.height,
            Self::U16(i) => i.height,
        }
    }

    pub fn channels(&self) -> usize {
        match self {
            Self::U8(i) => i.channels,
            Self::U16(i) => i.channels,
        }
    }

    pub fn kind(&self) -> PixelKind {
        match (self, self.channels()) {
            (Self::U8(_), 1) => PixelKind::Gray8,
            (Self::U8(_), 3) => PixelKind::Rgb8,
            (Self::U8(_), _) => PixelKind::Rgba8,
            (Self::U16(_), 1) => PixelKind::Gray16,
            (Self::U16(_), 3) => PixelKind::Rgb16,
            (Self::U16(_), _) => PixelKind::Rgba16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_buffer_is_reused_for_an_output_of_its_size_only() {
        // Spares of this test's own: the shared ones are taken and filled by every test thread.
        let spares = Spares::<u16>::new();
        let (w, h, c) = (7, 11, 3);
        let first = vec![7u16; w * h * c];
        let at = first.as_ptr();
        spares.keep(first);
        let other = Image::<u16>::for_overwrite_from(&spares, w, h + 1, c);
        assert_ne!(other.data.as_ptr(), at, "not for another size");
        assert_eq!(other.data, vec![0; w * (h + 1) * c], "a new one is zeroed");
        let again = Image::<u16>::for_overwrite_from(&spares, w, h, c);
        assert_eq!(again.data.as_ptr(), at, "the kept buffer");
        assert_eq!(again.data.len(), w * h * c);
        assert!(again.data.iter().all(|&v| v == 0xA5), "filled with the test pattern");
        let fresh = Image::<u16>::for_overwrite_from(&spares, w, h, c);
        assert_ne!(fresh.data.as_ptr(), at, "taken once");
        // At most SPARES kept, the oldest going first.
        let firsts: Vec<_> = (0..=SPARES).map(|k| vec![0u16; 10 + k]).collect();
        let ptrs: Vec<_> = firsts.iter().map(|b| b.as_ptr()).collect();
        for b in firsts {
            spares.keep(b);
        }
        assert!(spares.take(10).is_none(), "the oldest went");
        for (k, &p) in ptrs.iter().enumerate().skip(1) {
            assert_eq!(spares.take(10 + k).map(|b| b.as_ptr()), Some(p));
        }
    }

    #[test]
    fn the_buffer_kept_last_is_taken_first() {
        // Of buffers of one size, the last kept (likeliest in the cache) comes back, so a run
        // of filters reuses one buffer rather than cycling through every one kept.
        let spares = Spares::<u8>::new();
        let bufs: Vec<_> = (0..3).map(|_| vec![0u8; 64]).collect();
        let ptrs: Vec<_> = bufs.iter().map(|b| b.as_ptr()).collect();
        for b in bufs {
            spares.keep(b);
        }
        for _ in 0..3 {
            let b = spares.take(64).expect("a kept buffer");
            assert_eq!(b.as_ptr(), ptrs[2]);
            spares.keep(b);
        }
        assert_eq!(spares.take(64).map(|b| b.as_ptr()), Some(ptrs[2]));
        assert_eq!(spares.take(64).map(|b| b.as_ptr()), Some(ptrs[1]));
        assert_eq!(spares.take(64).map(|b| b.as_ptr()), Some(ptrs[0]));
        assert!(spares.take(64).is_none());
    }

    #[test]
    fn shapes_are_checked() {
        assert!(Image::<u8>::from_vec(2, 2, 3, vec![0; 12]).is_ok());
        assert!(Image::<u8>::from_vec(2, 2, 3, vec![0; 11]).is_err());
        assert!(Image::<u16>::from_vec(2, 2, 2, vec![0; 8]).is_err());
        assert!(Image::<u8>::from_vec(usize::MAX, 2, 1, vec![]).is_err());
        let i = Image::<u16>::from_vec(2, 1, 1, vec![1, 2]).unwrap();
        assert_eq!(DynImage::U16(i).kind(), PixelKind::Gray16);
    }
}
