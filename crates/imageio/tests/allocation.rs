//! Declared sizes never drive allocations: every valid test file, with any single byte changed
//! to a few telling values or cut at any point, decodes (or fails) without any single
//! allocation larger than a small multiple of its size. A counting global allocator records
//! the largest request made by this thread.
//!
//! This is what guards against dicom-rs allocating whatever an element header claims (a
//! 700-byte file once made it zero-fill 775 MB): the pre-scan must refuse such files first.
//! (The raster formats are bounded by the `image` crate's own `max_alloc` limit instead.)

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bs_imageio::{Limits, decode};
use common::*;

struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| {
        if size > l.get() {
            l.set(size);
        }
    });
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The largest single allocation `decode` makes for `bytes`.
fn largest_allocation(bytes: &[u8], limits: &Limits) -> usize {
    LARGEST.with(|l| l.set(0));
    let _ = decode(bytes, Some("x"), limits);
    LARGEST.with(|l| l.get())
}

#[test]
fn no_declared_size_drives_an_allocation() {
    let limits =
        Limits { max_pixels: 1 << 16, max_bytes: 64 << 20, max_frames: 1000, ..Limits::none() };
    for (k, sample) in dicom_samples().iter().enumerate() {
        // A 64K-entry 16-bit lookup table is the largest fixed allocation; the rest scales
        // with the input.
        let bound = (1 << 18) + 64 * sample.len();
        let check = |bytes: &[u8], what: &str| {
            let largest = largest_allocation(bytes, &limits);
            assert!(
                largest <= bound,
                "sample {k}, {what}: allocated {largest} bytes (bound {bound})"
            );
        };
        check(sample, "as is");
        // Every byte after the preamble; the preamble is never read.
        for at in 128..sample.len() {
            for value in [0x00, 0x7F, 0xFF] {
                let mut bytes = sample.clone();
                bytes[at] = value;
                check(&bytes, &format!("byte {at} = {value:#04x}"));
            }
            if at % 3 == 0 {
                check(&sample[..at], &format!("cut at {at}"));
            }
        }
    }
}

#[test]
fn huge_declared_images_are_refused_without_allocating() {
    for bytes in [png_header_only(100_000, 100_000), tiff_header_only(100_000, 100_000)] {
        let largest = largest_allocation(&bytes, &Limits::default());
        assert!(largest < 1 << 20, "allocated {largest} bytes");
        assert!(matches!(
            decode(&bytes, None, &Limits::default()),
            Err(bs_imageio::ImageIoError::TooLarge { .. })
        ));
    }
    let dicom = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(65535, 65535, 16, 16, false),
        vec![],
        pixel_data_16(vec![0; 4]),
    );
    assert!(largest_allocation(&dicom, &Limits::default()) < 1 << 20);
}
