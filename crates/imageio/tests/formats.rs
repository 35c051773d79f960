//! PNG, JPEG, TIFF, GIF and PGM/PPM: round trips for every pixel layout each format holds,
//! refusals for those it does not, limits and bad input.

mod common;

use bs_imageio::{Format, ImageIoError, Limits, decode, encode, read, write};
use bs_imaging::{DynImage, Image};
use common::*;

fn round_trip(img: &DynImage, format: Format) -> bs_imageio::Decoded {
    let bytes =
        encode(img, format).unwrap_or_else(|e| panic!("encode {format} {}: {e}", img.kind()));
    let d = decode(&bytes, None, &Limits::default())
        .unwrap_or_else(|e| panic!("decode {format} {}: {e}", img.kind()));
    assert_eq!(d.format, format);
    assert_eq!((d.meta.width as usize, d.meta.height as usize), (img.width(), img.height()));
    d
}

fn layouts() -> Vec<DynImage> {
    vec![
        DynImage::U8(test_image8(7, 5, 1)),
        DynImage::U16(test_image16(7, 5, 1)),
        DynImage::U8(test_image8(7, 5, 3)),
        DynImage::U16(test_image16(7, 5, 3)),
        DynImage::U8(test_image8(7, 5, 4)),
        DynImage::U16(test_image16(7, 5, 4)),
    ]
}

#[test]
fn png_and_tiff_round_trip_every_layout_exactly() {
    for format in [Format::Png, Format::Tiff] {
        for img in layouts() {
            let d = round_trip(&img, format);
            assert_eq!(d.image, img, "{format} {}", img.kind());
            assert_eq!(d.meta.pixel_kind, img.kind().name());
            let bits = if matches!(img, DynImage::U8(_)) { 8 } else { 16 };
            assert_eq!(d.meta.bits_stored, bits, "{format} {}", img.kind());
        }
    }
}

#[test]
fn pnm_round_trips_gray_and_rgb_at_8_and_16_bits() {
    for img in layouts().into_iter().filter(|i| i.channels() != 4) {
        let bytes = encode(&img, Format::Pnm).unwrap();
        let magic = if img.channels() == 1 { b"P5" } else { b"P6" };
        assert_eq!(&bytes[..2], magic);
        let d = round_trip(&img, Format::Pnm);
        assert_eq!(d.image, img, "{}", img.kind());
    }
    let err = encode(&DynImage::U8(test_image8(2, 2, 4)), Format::Pnm).unwrap_err();
    assert!(matches!(err, ImageIoError::Unsupported { format: Format::Pnm, .. }), "{err}");
}

#[test]
fn jpeg_round_trips_gray8_and_rgb8_closely() {
    for channels in [1, 3] {
        let img = DynImage::U8(smooth_image8(32, 24, channels));
        let d = round_trip(&img, Format::Jpeg);
        assert_eq!(d.image.kind(), img.kind());
        let diff = max_abs_diff(&d.image, &img);
        assert!(diff <= 12, "JPEG {} differs by {diff}", img.kind());
    }
    for img in [DynImage::U8(test_image8(4, 4, 4)), DynImage::U16(test_image16(4, 4, 1))] {
        let err = encode(&img, Format::Jpeg).unwrap_err();
        assert!(matches!(err, ImageIoError::Unsupported { format: Format::Jpeg, .. }), "{err}");
    }
}

#[test]
fn gif_round_trips_few_colour_images_exactly() {
    for channels in [3, 4] {
        let img = few_colours8(9, 6, channels);
        let d = round_trip(&DynImage::U8(img.clone()), Format::Gif);
        // GIF decodes as RGBA.
        let DynImage::U8(out) = &d.image else { panic!("8-bit expected") };
        assert_eq!(out.channels, 4);
        for (p, q) in img.data.chunks(channels).zip(out.data.chunks(4)) {
            assert_eq!(&p[..3], &q[..3]);
            assert_eq!(q[3], 255);
        }
    }
    // Gray is written as RGB and comes back with R = G = B.
    let gray = Image::from_vec(4, 2, 1, vec![0, 50, 100, 150, 200, 250, 3, 7]).unwrap();
    let d = round_trip(&DynImage::U8(gray.clone()), Format::Gif);
    let DynImage::U8(out) = &d.image else { panic!("8-bit expected") };
    let back: Vec<u8> = out.data.chunks(4).map(|p| p[0]).collect();
    assert_eq!(back, gray.data);
    let err = encode(&DynImage::U16(test_image16(4, 4, 3)), Format::Gif).unwrap_err();
    assert!(matches!(err, ImageIoError::Unsupported { format: Format::Gif, .. }), "{err}");
}

#[test]
fn dicom_cannot_be_written() {
    let err = encode(&DynImage::U8(test_image8(2, 2, 1)), Format::Dicom).unwrap_err();
    assert!(matches!(err, ImageIoError::UnsupportedFormat { .. }), "{err}");
}

#[test]
fn write_and_read_choose_the_format_by_extension() {
    let dir = tempfile::tempdir().unwrap();
    let img = DynImage::U16(test_image16(5, 4, 1));
    for name in ["a.png", "a.tif", "a.tiff", "a.pgm", "a.PNG"] {
        let path = dir.path().join(name);
        write(&path, &img).unwrap();
        let d = read(&path, &Limits::default()).unwrap();
        assert_eq!(d.image, img, "{name}");
    }
    let rgb = DynImage::U8(test_image8(3, 3, 3));
    write(dir.path().join("c.ppm"), &rgb).unwrap();
    assert_eq!(read(dir.path().join("c.ppm"), &Limits::default()).unwrap().image, rgb);

    let err = write(dir.path().join("b.pgm"), &rgb).unwrap_err();
    assert!(matches!(err, ImageIoError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("b.pgm"), "{err}");
    let err = write(dir.path().join("b.ppm"), &img).unwrap_err();
    assert!(matches!(err, ImageIoError::Unsupported { .. }), "{err}");
    let err = write(dir.path().join("b.webp"), &img).unwrap_err();
    assert!(matches!(err, ImageIoError::UnsupportedFormat { .. }), "{err}");
    let err = write(dir.path().join("b.dcm"), &img).unwrap_err();
    assert!(matches!(err, ImageIoError::UnsupportedFormat { .. }), "{err}");
    let err = write(dir.path().join("no/such/dir/x.png"), &img).unwrap_err();
    assert!(matches!(err, ImageIoError::Io { .. }), "{err}");
}

#[test]
fn huge_declared_dimensions_are_refused_before_allocating() {
    let bytes = png_header_only(100_000, 100_000);
    match decode(&bytes, Some("huge.png"), &Limits::default()) {
        Err(ImageIoError::TooLarge { file, width, height, limit }) => {
            assert_eq!(file, "huge.png");
            assert_eq!((width, height, limit), (100_000, 100_000, 100_000_000));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let err = decode(&tiff_header_only(100_000, 100_000), None, &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::TooLarge { width: 100_000, height: 100_000, .. }), "{err}");
    // The hand-made TIFF header is otherwise valid: a 4 × 4 one decodes from its 16-byte strip.
    assert!(decode(&tiff_header_only(4, 4), None, &Limits::default()).is_ok());
    // Under the pixel limit but over the byte limit.
    let limits = Limits { max_bytes: 1 << 20, ..Limits::none() };
    let err = decode(&png_header_only(10_000, 10_000), None, &limits).unwrap_err();
    assert!(matches!(err, ImageIoError::TooManyBytes { .. }), "{err}");
    // A real image over a small pixel limit.
    let png = encode(&DynImage::U8(test_image8(8, 8, 3)), Format::Png).unwrap();
    let small = Limits { max_pixels: 63, ..Limits::default() };
    assert!(matches!(decode(&png, None, &small), Err(ImageIoError::TooLarge { .. })));
    let tiny_input = Limits { max_bytes: 16, ..Limits::default() };
    assert!(matches!(decode(&png, None, &tiny_input), Err(ImageIoError::TooManyBytes { .. })));
}

#[test]
fn truncated_and_corrupt_raster_files_give_errors() {
    let images = [
        (Format::Png, DynImage::U8(test_image8(16, 16, 3))),
        (Format::Jpeg, DynImage::U8(smooth_image8(16, 16, 3))),
        (Format::Tiff, DynImage::U16(test_image16(16, 16, 1))),
        (Format::Gif, DynImage::U8(few_colours8(16, 16, 3))),
        (Format::Pnm, DynImage::U8(test_image8(16, 16, 1))),
    ];
    for (format, img) in images {
        let bytes = encode(&img, format).unwrap();
        for cut in [0, 1, 3, 8, 20, bytes.len() / 2, bytes.len() - 30] {
            let result = decode(&bytes[..cut], Some("x"), &Limits::default());
            let err = result.expect_err("a cut file must not decode");
            assert_eq!(err.file(), "x", "{format} cut at {cut}: {err}");
        }
    }
    let err = decode(b"", None, &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::UnsupportedFormat { .. }), "{err}");
    let err = decode(b"just some text", Some("notes.txt"), &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::UnsupportedFormat { .. }), "{err}");
    assert!(err.to_string().starts_with("notes.txt: "), "{err}");
    // PNG magic then garbage.
    let mut bad = b"\x89PNG\r\n\x1a\n".to_vec();
    bad.extend((0..300u32).map(|i| (i * 31 % 256) as u8));
    assert!(decode(&bad, None, &Limits::default()).is_err());
    // A name picks the format when the bytes do not.
    let err = decode(&[1, 2, 3, 4, 5], Some("x.gif"), &Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            ImageIoError::Corrupt { format: Format::Gif, .. }
                | ImageIoError::Truncated { format: Format::Gif, .. }
        ),
        "{err}"
    );
}

#[test]
fn metadata_of_raster_images() {
    let d = round_trip(&DynImage::U8(test_image8(3, 2, 1)), Format::Png);
    assert_eq!(d.meta.photometric_interpretation, "MONOCHROME2");
    assert_eq!(d.meta.pixel_kind, "gray8");
    assert_eq!(d.meta.patient_name, None);
    let map = d.meta.to_map();
    assert_eq!(map["width"], "3");
    assert_eq!(map["height"], "2");
    assert!(!map.contains_key("modality"));
    let d = round_trip(&DynImage::U8(test_image8(3, 2, 4)), Format::Png);
    assert_eq!(d.meta.photometric_interpretation, "RGB");
}

/// An animated GIF of `n` 4×3 frames, frame `i` all grey level `40·(i+1)`; the second drawn
/// only over its top row (the rest stays as the first left it).
fn animated_gif(n: usize) -> Vec<u8> {
    animated_gif_of(n, 4, 3)
}

/// [`animated_gif`] with frames of `w`×`h`: each kept on screen under the next
/// (`DisposalMethod::Keep`), grey levels from a global palette.
fn animated_gif_of(n: usize, w: u16, h: u16) -> Vec<u8> {
    let palette: Vec<u8> = (0..4u8).flat_map(|i| [40 * i; 3]).collect();
    let mut out = Vec::new();
    let mut enc = gif::Encoder::new(&mut out, w, h, &palette).unwrap();
    for i in 0..n {
        let rows = if i == 1 { 1 } else { h };
        let frame = gif::Frame {
            width: w,
            height: rows,
            dispose: gif::DisposalMethod::Keep,
            buffer: vec![i as u8 + 1; usize::from(w) * usize::from(rows)].into(),
            ..gif::Frame::default()
        };
        enc.write_frame(&frame).unwrap();
    }
    drop(enc);
    out
}

#[test]
fn an_animated_gif_is_a_multi_frame_image() {
    let gif = animated_gif(3);
    let d = decode(&gif, None, &Limits::default()).unwrap();
    assert_eq!((d.meta.number_of_frames, d.meta.frames_decoded, d.frame_count()), (3, 3, 3));
    let grey_of = |f: &DynImage| match f {
        DynImage::U8(i) => i.data.chunks(4).map(|p| p[0]).collect::<Vec<_>>(),
        other => panic!("{}", other.kind()),
    };
    assert_eq!(grey_of(d.frame(0).unwrap()), [40; 12]);
    // The second frame as shown: its top row over the first.
    assert_eq!(grey_of(d.frame(1).unwrap()), [80, 80, 80, 80, 40, 40, 40, 40, 40, 40, 40, 40]);
    assert_eq!(grey_of(d.frame(2).unwrap()), [120; 12]);
    // Counted but not decoded past max_frames_decoded; refused past max_frames.
    let first = Limits { max_frames_decoded: 1, ..Limits::default() };
    let d = decode(&gif, None, &first).unwrap();
    assert_eq!((d.meta.number_of_frames, d.meta.frames_decoded, d.frame_count()), (3, 1, 1));
    let two = Limits { max_frames: 2, ..Limits::default() };
    let e = decode(&gif, None, &two).unwrap_err();
    assert!(e.to_string().contains("3 frames exceeds the limit of 2 frames"), "{e}");
    // Frames past what max_bytes holds are counted, not decoded: 100×100 RGBA frames are
    // 40 000 bytes, and 100 000 bytes hold two of the three.
    let small = Limits { max_bytes: 100_000, ..Limits::default() };
    let d = decode(&animated_gif_of(3, 100, 100), None, &small).unwrap();
    assert_eq!((d.meta.number_of_frames, d.meta.frames_decoded, d.frame_count()), (3, 2, 2));
    // Cut in its last frame: the frames before it, as a browser shows them.
    let whole = animated_gif(3);
    let cut = &whole[..whole.len() - 6];
    let d = decode(cut, None, &Limits::default()).unwrap();
    assert_eq!((d.meta.number_of_frames, d.frame_count()), (2, 2), "the cut one is no frame");
    assert_eq!(grey_of(d.frame(1).unwrap())[..4], [80; 4]);
    let one = decode(&animated_gif(1), None, &Limits::default()).unwrap();
    assert_eq!((one.meta.number_of_frames, one.frame_count()), (1, 1));
}

#[test]
fn a_tiffs_pages_of_the_first_pages_size_are_its_frames() {
    use tiff::encoder::{TiffEncoder, colortype};
    let mut out = std::io::Cursor::new(Vec::new());
    let mut enc = TiffEncoder::new(&mut out).unwrap();
    for v in [10u16, 20, 30] {
        enc.write_image::<colortype::Gray16>(5, 2, &[v; 10]).unwrap();
    }
    // A reduced-resolution page: not a frame, and the end of them.
    enc.write_image::<colortype::Gray16>(2, 1, &[99; 2]).unwrap();
    enc.write_image::<colortype::Gray16>(5, 2, &[40; 10]).unwrap();
    let d = decode(out.get_ref(), None, &Limits::default()).unwrap();
    assert_eq!((d.meta.number_of_frames, d.frame_count()), (3, 3));
    for (i, v) in [10u16, 20, 30].into_iter().enumerate() {
        assert_eq!(
            d.frame(i),
            Some(&DynImage::U16(Image::from_vec(5, 2, 1, vec![v; 10]).unwrap()))
        );
    }
    let first = Limits { max_frames_decoded: 1, ..Limits::default() };
    let d = decode(out.get_ref(), None, &first).unwrap();
    assert_eq!((d.meta.number_of_frames, d.meta.frames_decoded), (3, 1));
    // A page of another depth or layout is no frame, whether decoded or only counted.
    let mut out = std::io::Cursor::new(Vec::new());
    let mut enc = TiffEncoder::new(&mut out).unwrap();
    enc.write_image::<colortype::Gray16>(5, 2, &[10; 10]).unwrap();
    enc.write_image::<colortype::Gray8>(5, 2, &[20; 10]).unwrap();
    enc.write_image::<colortype::Gray16>(5, 2, &[30; 10]).unwrap();
    for limits in [Limits::default(), first] {
        let d = decode(out.get_ref(), None, &limits).unwrap();
        assert_eq!((d.meta.number_of_frames, d.frame_count()), (1, 1));
    }
    // 8-bit RGB pages; a count past max_frames is refused.
    let mut out = std::io::Cursor::new(Vec::new());
    let mut enc = TiffEncoder::new(&mut out).unwrap();
    for v in [1u8, 2, 3] {
        enc.write_image::<colortype::RGB8>(2, 2, &[v; 12]).unwrap();
    }
    let d = decode(out.get_ref(), None, &Limits::default()).unwrap();
    assert_eq!((d.meta.number_of_frames, d.frame_count()), (3, 3));
    assert_eq!(d.frame(2), Some(&DynImage::U8(Image::from_vec(2, 2, 3, vec![3; 12]).unwrap())));
    let two = Limits { max_frames: 2, ..Limits::default() };
    let e = decode(out.get_ref(), None, &two).unwrap_err();
    assert!(e.to_string().contains("3 frames exceeds the limit of 2 frames"), "{e}");
    // One page: one frame.
    let png_like = encode(&DynImage::U8(test_image8(7, 5, 3)), Format::Tiff).unwrap();
    let d = decode(&png_like, None, &Limits::default()).unwrap();
    assert_eq!((d.meta.number_of_frames, d.frame_count()), (1, 1));
}
