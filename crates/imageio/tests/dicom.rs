//! DICOM input: files made by the tests with dicom-object in several transfer syntaxes, bit
//! depths and photometric interpretations; exact pixels and metadata; clear errors for what
//! cannot be decoded.

mod common;

use bs_imageio::{Format, ImageIoError, Limits, apply_window, decode, read};
use bs_imaging::{DynImage, Image};
use common::*;
use dicom_core::DataElement;
use dicom_dictionary_std::tags;

fn gray8(w: usize, h: usize, data: Vec<u8>) -> DynImage {
    DynImage::U8(Image::from_vec(w, h, 1, data).unwrap())
}

fn gray16(w: usize, h: usize, data: Vec<u16>) -> DynImage {
    DynImage::U16(Image::from_vec(w, h, 1, data).unwrap())
}

fn decode_ok(bytes: &[u8]) -> bs_imageio::Decoded {
    match decode(bytes, Some("test.dcm"), &Limits::default()) {
        Ok(d) => d,
        Err(e) => panic!("decode failed: {e}"),
    }
}

#[test]
fn monochrome2_8bit_explicit_le_pixels_and_metadata() {
    let pixels: Vec<u8> = (0..12).map(|i| i * 20).collect();
    let bytes = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(3, 4, 8, 8, false),
        vec![],
        pixel_data_8(pixels.clone()),
    );
    let d = decode_ok(&bytes);
    assert_eq!(d.format, Format::Dicom);
    assert_eq!(d.image, gray8(4, 3, pixels));
    let m = &d.meta;
    assert_eq!((m.width, m.height), (4, 3));
    assert_eq!(m.pixel_kind, "gray8");
    assert_eq!((m.bits_stored, m.signed), (8, false));
    assert_eq!(m.photometric_interpretation, "MONOCHROME2");
    assert_eq!((m.number_of_frames, m.frames_decoded), (1, 1));
    assert_eq!(m.patient_name.as_deref(), Some("Doe^Jane"));
    assert_eq!(m.patient_id.as_deref(), Some("PID-0042"));
    assert_eq!(m.study_instance_uid.as_deref(), Some("1.2.826.0.1.3680043.2.1125.1.7"));
    assert_eq!(m.study_date.as_deref(), Some("20240131"));
    assert_eq!(m.study_description.as_deref(), Some("HEAD W/O CONTRAST"));
    assert_eq!(m.series_instance_uid.as_deref(), Some("1.2.826.0.1.3680043.2.1125.1.8"));
    assert_eq!(m.series_number.as_deref(), Some("3"));
    assert_eq!(m.series_description.as_deref(), Some("AXIAL 5mm"));
    assert_eq!(m.modality.as_deref(), Some("CT"));
    assert_eq!(m.acquisition_date.as_deref(), Some("20240131"));
    assert_eq!(m.acquisition_time.as_deref(), Some("101530.25"));
    assert_eq!(m.sop_instance_uid.as_deref(), Some("1.2.826.0.1.3680043.2.1125.1.9"));
    assert_eq!(m.transfer_syntax_uid.as_deref(), Some(EXPLICIT_LE));
    assert_eq!(m.transfer_syntax_name.as_deref(), Some("Explicit VR Little Endian"));
    assert_eq!((m.rescale_slope, m.window_center), (None, None));
    assert_eq!((m.pixel_offset, m.pixel_inverted), (Some(0.0), Some(false)));
    let map = m.to_map();
    assert_eq!(map["patient_name"], "Doe^Jane");
    assert_eq!(map["modality"], "CT");
    assert_eq!(map["width"], "4");
    assert!(!map.contains_key("window_center"));
}

#[test]
fn a_window_width_below_1_is_no_window() {
    // DICOM asks a width of 1 or more; 0 (or less) would show one flat shade.
    let stored: Vec<u16> = vec![0, 1000, 2000, 3000, 4000, 4095];
    for width in ["0", "-5"] {
        let bytes = image_file(
            EXPLICIT_LE,
            &PixelSpec::gray(2, 3, 16, 12, false),
            vec![ds(tags::WINDOW_CENTER, "40"), ds(tags::WINDOW_WIDTH, width)],
            pixel_data_16(stored.clone()),
        );
        let d = decode_ok(&bytes);
        assert_eq!((d.meta.window_center, d.meta.window_width), (None, None), "{width}");
        // Shown over its own range instead: black to white.
        let shown = apply_window(&d);
        let bs_imaging::DynImage::U8(img) = &shown else { panic!("8-bit") };
        assert_eq!((img.data[0], img.data[5]), (0, 255), "{width}");
    }
}

#[test]
fn unsigned_16bit_with_rescale_and_window() {
    // CT-style: unsigned 12-bit stored, HU = stored - 1024, window 40/400.
    let stored: Vec<u16> = vec![0, 864, 964, 1064, 1264, 4095];
    let bytes = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(2, 3, 16, 12, false),
        vec![
            ds(tags::RESCALE_INTERCEPT, "-1024"),
            ds(tags::RESCALE_SLOPE, "1"),
            ds(tags::WINDOW_CENTER, "40\\500"),
            ds(tags::WINDOW_WIDTH, "400\\2000"),
        ],
        pixel_data_16(stored.clone()),
    );
    let d = decode_ok(&bytes);
    // The range -1024..=3071 does not fit u16, so offset 1024: pixels equal the stored values.
    assert_eq!(d.image, gray16(3, 2, stored));
    let m = &d.meta;
    assert_eq!((m.rescale_slope, m.rescale_intercept), (Some(1.0), Some(-1024.0)));
    assert_eq!((m.window_center, m.window_width), (Some(40.0), Some(400.0)));
    assert_eq!((m.pixel_offset, m.pixel_inverted), (Some(1024.0), Some(false)));
    assert_eq!(m.modality_value(1064), Some(40.0));
    assert_eq!(m.bits_stored, 12);
    // HU -1024 and -160 are at or below the window, -60 → 63.9, 40 → 127.8, 240 → above.
    assert_eq!(apply_window(&d), gray8(3, 2, vec![0, 0, 64, 128, 255, 255]));
}

#[test]
fn rescale_slope_is_applied_first() {
    let bytes = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(1, 4, 16, 8, false),
        vec![ds(tags::RESCALE_INTERCEPT, "10"), ds(tags::RESCALE_SLOPE, "2")],
        pixel_data_16(vec![0, 1, 100, 255]),
    );
    let d = decode_ok(&bytes);
    assert_eq!(d.image, gray16(4, 1, vec![10, 12, 210, 520]));
    assert_eq!(d.meta.pixel_offset, Some(0.0));
    // No stored window: the image's own range 10..=520 maps onto 0..=255.
    let DynImage::U8(w) = apply_window(&d) else { panic!("8-bit expected") };
    assert_eq!((w.data[0], w.data[3]), (0, 255));
    assert!(w.data[1] < w.data[2]);
}

#[test]
fn signed_16bit_ct_with_intercept() {
    let stored: Vec<i16> = vec![-2000, -1, 0, 1024, 3071, i16::MIN, i16::MAX, 40 + 1024];
    let bytes = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(2, 4, 16, 16, true),
        vec![
            ds(tags::RESCALE_INTERCEPT, "-1024"),
            ds(tags::RESCALE_SLOPE, "1"),
            ds(tags::WINDOW_CENTER, "40"),
            ds(tags::WINDOW_WIDTH, "80"),
        ],
        pixel_data_16(stored.iter().map(|&v| v as u16).collect()),
    );
    let d = decode_ok(&bytes);
    assert!(d.meta.signed);
    // m = stored - 1024 ranges over -33792..=31743: offset 33792 maps it onto 0..=65535.
    assert_eq!(d.meta.pixel_offset, Some(33792.0));
    let DynImage::U16(img) = &d.image else { panic!("16-bit expected") };
    let hu: Vec<f64> =
        img.data.iter().map(|&p| d.meta.modality_value(u32::from(p)).unwrap()).collect();
    let want: Vec<f64> = stored.iter().map(|&v| f64::from(v) - 1024.0).collect();
    assert_eq!(hu, want);
    assert_eq!(img.data[5], 0);
    assert_eq!(img.data[6], 65535);
    let DynImage::U8(win) = apply_window(&d) else { panic!("8-bit expected") };
    // HU 40 is the centre: ((40 - 39.5) / 79 + 0.5) * 255 = 129.1.
    assert_eq!(win.data[7], 129);
    assert_eq!((win.data[0], win.data[4]), (0, 255));
}

#[test]
fn signed_12bit_is_sign_extended() {
    // Two's complement in 12 bits: 0x800 = -2048, 0xFFF = -1.
    let bytes = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(1, 4, 16, 12, true),
        vec![],
        pixel_data_16(vec![0x0800, 0x0FFF, 0, 0x07FF]),
    );
    let d = decode_ok(&bytes);
    assert_eq!(d.meta.pixel_offset, Some(2048.0));
    assert_eq!(d.image, gray16(4, 1, vec![0, 2047, 2048, 4095]));
}

#[test]
fn monochrome1_is_inverted() {
    let mut spec = PixelSpec::gray(1, 4, 8, 8, false);
    spec.photometric = "MONOCHROME1";
    let bytes = image_file(EXPLICIT_LE, &spec, vec![], pixel_data_8(vec![0, 10, 200, 255]));
    let d = decode_ok(&bytes);
    assert_eq!(d.image, gray8(4, 1, vec![255, 245, 55, 0]));
    assert_eq!(d.meta.photometric_interpretation, "MONOCHROME1");
    assert_eq!((d.meta.pixel_offset, d.meta.pixel_inverted), (Some(255.0), Some(true)));
    assert_eq!(d.meta.modality_value(245), Some(10.0));

    // 16-bit MONOCHROME1 with a window: inverted over 0..=4095, and the window output is
    // inverted too (low modality values white).
    let mut spec = PixelSpec::gray(1, 3, 16, 12, false);
    spec.photometric = "MONOCHROME1";
    let bytes = image_file(
        EXPLICIT_LE,
        &spec,
        vec![ds(tags::WINDOW_CENTER, "2048"), ds(tags::WINDOW_WIDTH, "4096")],
        pixel_data_16(vec![0, 4095, 1000]),
    );
    let d = decode_ok(&bytes);
    assert_eq!(d.image, gray16(3, 1, vec![4095, 0, 3095]));
    assert_eq!(d.meta.modality_value(3095), Some(1000.0));
    let DynImage::U8(w) = apply_window(&d) else { panic!("8-bit expected") };
    assert_eq!((w.data[0], w.data[1]), (255, 0));
}

#[test]
fn rgb_8bit_interleaved_and_planar() {
    let rgb: Vec<u8> = (0..2 * 3 * 3).map(|i| i as u8 * 10).collect();
    let bytes = image_file(EXPLICIT_LE, &PixelSpec::rgb8(2, 3), vec![], pixel_data_8(rgb.clone()));
    let d = decode_ok(&bytes);
    assert_eq!(d.image, DynImage::U8(Image::from_vec(3, 2, 3, rgb.clone()).unwrap()));
    assert_eq!(d.meta.pixel_kind, "rgb8");
    assert_eq!(d.meta.pixel_offset, None);
    assert_eq!(apply_window(&d), d.image);

    // The same pixels stored as planes (RRRRRR GGGGGG BBBBBB).
    let src = &rgb;
    let planar: Vec<u8> = (0..3).flat_map(|c| (0..6).map(move |p| src[p * 3 + c])).collect();
    let mut spec = PixelSpec::rgb8(2, 3);
    spec.planar = Some(1);
    let d = decode_ok(&image_file(EXPLICIT_LE, &spec, vec![], pixel_data_8(planar)));
    assert_eq!(d.image, DynImage::U8(Image::from_vec(3, 2, 3, rgb).unwrap()));
}

#[test]
fn implicit_vr_little_endian() {
    let values: Vec<u16> = vec![1, 500, 4000, 65535, 0, 1234];
    let bytes = image_file(
        IMPLICIT_LE,
        &PixelSpec::gray(2, 3, 16, 16, false),
        vec![ds(tags::WINDOW_CENTER, "100"), ds(tags::WINDOW_WIDTH, "50")],
        pixel_data_16(values.clone()),
    );
    let d = decode_ok(&bytes);
    assert_eq!(d.image, gray16(3, 2, values));
    assert_eq!(d.meta.transfer_syntax_uid.as_deref(), Some(IMPLICIT_LE));
    assert_eq!(d.meta.patient_name.as_deref(), Some("Doe^Jane"));
    assert_eq!(d.meta.window_center, Some(100.0));

    let pixels: Vec<u8> = (0..12).collect();
    let bytes = image_file(
        IMPLICIT_LE,
        &PixelSpec::gray(3, 4, 8, 8, false),
        vec![],
        pixel_data_8(pixels.clone()),
    );
    assert_eq!(decode_ok(&bytes).image, gray8(4, 3, pixels));
}

#[test]
fn explicit_vr_big_endian() {
    let values: Vec<u16> = vec![0x0102, 0x0304, 0xFF00, 7];
    let bytes = image_file(
        EXPLICIT_BE,
        &PixelSpec::gray(2, 2, 16, 16, false),
        vec![],
        pixel_data_16(values.clone()),
    );
    let d = decode_ok(&bytes);
    assert_eq!(d.image, gray16(2, 2, values));
    assert_eq!(d.meta.transfer_syntax_uid.as_deref(), Some(EXPLICIT_BE));
}

#[test]
fn deflated_explicit_vr_little_endian() {
    let pixels: Vec<u8> = (0..64).map(|i| (i * 3) as u8).collect();
    let bytes = image_file(
        DEFLATED_LE,
        &PixelSpec::gray(8, 8, 8, 8, false),
        vec![],
        pixel_data_8(pixels.clone()),
    );
    let d = decode_ok(&bytes);
    assert_eq!(d.image, gray8(8, 8, pixels));
    assert_eq!(d.meta.patient_id.as_deref(), Some("PID-0042"));
}

#[test]
fn rle_lossless_gray8_gray16_rgb8() {
    let gray: Vec<u8> = (0..40).map(|i| if i < 20 { 7 } else { (i * 11) as u8 }).collect();
    let bytes = image_file(
        RLE,
        &PixelSpec::gray(5, 8, 8, 8, false),
        vec![],
        pixel_data_encapsulated(vec![rle_frame(&gray, 1, 1)]),
    );
    let d = decode_ok(&bytes);
    assert_eq!(d.image, gray8(8, 5, gray));
    assert_eq!(d.meta.transfer_syntax_name.as_deref(), Some("RLE Lossless"));

    let values: Vec<u16> = (0..30).map(|i| (i * 2000 + 3) as u16).collect();
    let bytes = image_file(
        RLE,
        &PixelSpec::gray(5, 6, 16, 16, false),
        vec![ds(tags::RESCALE_INTERCEPT, "0"), ds(tags::RESCALE_SLOPE, "1")],
        pixel_data_encapsulated(vec![rle_frame(&le16(&values), 1, 2)]),
    );
    assert_eq!(decode_ok(&bytes).image, gray16(6, 5, values));

    let rgb: Vec<u8> = (0..4 * 4 * 3).map(|i| (i * 5 % 256) as u8).collect();
    let bytes = image_file(
        RLE,
        &PixelSpec::rgb8(4, 4),
        vec![],
        pixel_data_encapsulated(vec![rle_frame(&rgb, 3, 1)]),
    );
    assert_eq!(decode_ok(&bytes).image, DynImage::U8(Image::from_vec(4, 4, 3, rgb).unwrap()));
}

#[test]
fn rle_corrupt_segment_is_an_error() {
    let gray: Vec<u8> = (0..40).collect();
    let mut frame = rle_frame(&gray, 1, 1);
    frame.truncate(70); // the segment decodes to fewer bytes than the frame needs
    let bytes = image_file(
        RLE,
        &PixelSpec::gray(5, 8, 8, 8, false),
        vec![],
        pixel_data_encapsulated(vec![frame]),
    );
    let err = decode(&bytes, Some("cut.dcm"), &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::Truncated { .. }), "{err}");
    assert!(err.to_string().contains("cut.dcm"), "{err}");
}

#[test]
fn jpeg_baseline_gray_and_ybr() {
    let img = smooth_image8(16, 16, 1);
    let jpeg = bs_imageio::encode(&DynImage::U8(img.clone()), Format::Jpeg).unwrap();
    let bytes = image_file(
        JPEG_BASELINE,
        &PixelSpec::gray(16, 16, 8, 8, false),
        vec![],
        pixel_data_encapsulated(vec![jpeg.clone()]),
    );
    let d = decode_ok(&bytes);
    assert!(max_abs_diff(&d.image, &DynImage::U8(img)) <= 8);

    // The JPEG stream disagreeing with Rows/Columns is refused before decoding.
    let bytes = image_file(
        JPEG_BASELINE,
        &PixelSpec::gray(8, 16, 8, 8, false),
        vec![],
        pixel_data_encapsulated(vec![jpeg]),
    );
    let err = decode(&bytes, None, &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::Corrupt { .. }), "{err}");

    let rgb = smooth_image8(16, 8, 3);
    let jpeg = bs_imageio::encode(&DynImage::U8(rgb.clone()), Format::Jpeg).unwrap();
    let mut spec = PixelSpec::rgb8(8, 16);
    spec.photometric = "YBR_FULL_422";
    let bytes = image_file(JPEG_BASELINE, &spec, vec![], pixel_data_encapsulated(vec![jpeg]));
    let d = decode_ok(&bytes);
    assert!(max_abs_diff(&d.image, &DynImage::U8(rgb)) <= 24);
}

/// Padding between the end of the entropy-coded data and the end marker (older modalities
/// and converters leave it; libjpeg warns "extraneous bytes before marker 0xd9" and decodes
/// the image whole, as DCMTK and GDCM accept it): the image decodes. A stream cut short
/// still does not.
#[test]
fn jpeg_grey_with_padding_before_its_end_marker_decodes_and_a_cut_one_does_not() {
    let img = smooth_image8(16, 16, 1);
    let jpeg = bs_imageio::encode(&DynImage::U8(img.clone()), Format::Jpeg).unwrap();
    let clean = decode_ok(&image_file(
        JPEG_BASELINE,
        &PixelSpec::gray(16, 16, 8, 8, false),
        vec![],
        pixel_data_encapsulated(vec![jpeg.clone()]),
    ));
    assert_eq!(&jpeg[jpeg.len() - 2..], [0xff, 0xd9]);
    for tail in [&[0x00, 0x11, 0x22, 0xff, 0xd9, 0x00][..], &[0x00, 0x11, 0xff, 0xff, 0xff, 0xd9]] {
        // Padding (then DICOM's even length, or fill bytes before the marker).
        let mut padded = jpeg[..jpeg.len() - 2].to_vec();
        padded.extend_from_slice(tail);
        let d = decode_ok(&image_file(
            JPEG_BASELINE,
            &PixelSpec::gray(16, 16, 8, 8, false),
            vec![],
            pixel_data_encapsulated(vec![padded]),
        ));
        assert_eq!(d.image, clean.image, "the same pixels as the clean stream ({tail:x?})");
    }

    // Cut, and cut then given the same padding and an end marker: errors, not grey images.
    let cut = jpeg[..jpeg.len() * 2 / 3 / 2 * 2].to_vec();
    let mut cut_padded = cut.clone();
    cut_padded.extend_from_slice(&[0x00, 0x11, 0x22, 0xff, 0xd9, 0x00]);
    for stream in [cut, cut_padded] {
        let err = decode(
            &image_file(
                JPEG_BASELINE,
                &PixelSpec::gray(16, 16, 8, 8, false),
                vec![],
                pixel_data_encapsulated(vec![stream]),
            ),
            None,
            &Limits::default(),
        )
        .unwrap_err();
        assert!(
            matches!(err, ImageIoError::Corrupt { .. } | ImageIoError::Truncated { .. }),
            "{err}"
        );
    }
}

#[test]
fn multi_frame_decodes_every_frame() {
    let frames: Vec<u8> = (0..3 * 4).map(|i| i as u8).collect();
    let mut spec = PixelSpec::gray(2, 2, 8, 8, false);
    spec.frames = Some(3);
    let d = decode_ok(&image_file(EXPLICIT_LE, &spec, vec![], pixel_data_8(frames.clone())));
    assert_eq!(d.image, gray8(2, 2, vec![0, 1, 2, 3]));
    assert_eq!(d.frames, vec![gray8(2, 2, vec![4, 5, 6, 7]), gray8(2, 2, vec![8, 9, 10, 11])]);
    assert_eq!((d.meta.number_of_frames, d.meta.frames_decoded), (3, 3));

    // A frame missing from the data is an error, not two frames.
    let err = decode(
        &image_file(EXPLICIT_LE, &spec, vec![], pixel_data_8(vec![0; 10])),
        None,
        &Limits::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ImageIoError::Truncated { .. }), "{err}");
    // Decoding only the first frame still counts the others, and still finds one missing.
    let first = Limits { max_frames_decoded: 1, ..Limits::default() };
    let d = decode(&image_file(EXPLICIT_LE, &spec, vec![], pixel_data_8(frames)), None, &first);
    let d = d.unwrap();
    assert_eq!(d.image, gray8(2, 2, vec![0, 1, 2, 3]));
    assert!(d.frames.is_empty());
    assert_eq!((d.meta.number_of_frames, d.meta.frames_decoded), (3, 1));
    let short = image_file(EXPLICIT_LE, &spec, vec![], pixel_data_8(vec![0; 10]));
    let err = decode(&short, None, &first).unwrap_err();
    assert!(matches!(err, ImageIoError::Truncated { .. }), "{err}");
    // Too many frames for the limits is refused before decoding.
    let few = Limits { max_frames: 2, ..Limits::default() };
    let err =
        decode(&image_file(EXPLICIT_LE, &spec, vec![], pixel_data_8(vec![0; 12])), None, &few)
            .unwrap_err();
    assert!(matches!(err, ImageIoError::TooManyBytes { .. }), "{err}");
    assert!(err.to_string().ends_with("3 frames exceeds the limit of 2 frames"), "{err}");
}

#[test]
fn multi_frame_rle_and_jpeg_by_fragment_table_and_marker() {
    let a: Vec<u8> = (0..16).collect();
    let b: Vec<u8> = (100..116).collect();
    let mut spec = PixelSpec::gray(4, 4, 8, 8, false);
    spec.frames = Some(2);
    let rle = vec![rle_frame(&a, 1, 1), rle_frame(&b, 1, 1)];
    let d = decode_ok(&image_file(RLE, &spec, vec![], pixel_data_encapsulated(rle)));
    assert_eq!((d.image.clone(), d.frames.clone()), (gray8(4, 4, a), vec![gray8(4, 4, b)]));

    // Two JPEG frames, the first split over two fragments: found by the Basic Offset Table,
    // and without it by the start-of-image marker.
    let f1 = smooth_image8(16, 16, 1);
    let mut f2 = f1.clone();
    f2.data.iter_mut().for_each(|v| *v = 255 - *v);
    let j1 = bs_imageio::encode(&DynImage::U8(f1.clone()), Format::Jpeg).unwrap();
    let j2 = bs_imageio::encode(&DynImage::U8(f2.clone()), Format::Jpeg).unwrap();
    let (head, tail) = j1.split_at((j1.len() / 2) & !1);
    let fragments = vec![head.to_vec(), tail.to_vec(), j2];
    // Items have even lengths: an odd fragment is written with a padding byte.
    let second_at = (8 + head.len() + 8 + tail.len().next_multiple_of(2)) as u32;
    let mut spec = PixelSpec::gray(16, 16, 8, 8, false);
    spec.frames = Some(2);
    for pixels in [
        pixel_data_encapsulated_with_table(vec![0, second_at], fragments.clone()),
        pixel_data_encapsulated(fragments.clone()),
    ] {
        let d = decode_ok(&image_file(JPEG_BASELINE, &spec, vec![], pixels));
        assert!(max_abs_diff(&d.image, &DynImage::U8(f1.clone())) <= 8);
        assert_eq!(d.frames.len(), 1);
        assert!(max_abs_diff(&d.frames[0], &DynImage::U8(f2.clone())) <= 8);
    }
    // A table pointing inside a fragment is refused.
    let bad = pixel_data_encapsulated_with_table(vec![0, second_at + 1], fragments);
    let err = decode(&image_file(JPEG_BASELINE, &spec, vec![], bad), None, &Limits::default())
        .unwrap_err();
    assert!(matches!(err, ImageIoError::Corrupt { .. }), "{err}");
}

/// YBR_FULL to RGB, as a JPEG decoder converts.
fn ycbcr_to_rgb(y: f64, cb: f64, cr: f64) -> [u8; 3] {
    let (cb, cr) = (cb - 128.0, cr - 128.0);
    [y + 1.402 * cr, y - 0.344_136 * cb - 0.714_136 * cr, y + 1.772 * cb]
        .map(|v| v.round().clamp(0.0, 255.0) as u8)
}

#[test]
fn jpeg_labelled_rgb_without_adobe_marker_is_not_colour_converted() {
    // A stream whose three components hold R, G and B as they are (what DICOM's RGB label
    // says): the encoder is handed pixels whose YCbCr are the wanted RGB, and the JFIF marker
    // (which would say "YCbCr") is dropped.
    let (w, h) = (16usize, 16usize);
    let mut want = Vec::new();
    let mut pre = Vec::new();
    for y in 0..h {
        for x in 0..w {
            let px = [96 + 4 * x, 120 + y, 136 - y].map(|v| v as f64);
            want.extend(px.map(|v| v as u8));
            pre.extend(ycbcr_to_rgb(px[0], px[1], px[2]));
        }
    }
    let pre = Image::from_vec(w, h, 3, pre).unwrap();
    let mut jpeg = bs_imageio::encode(&DynImage::U8(pre.clone()), Format::Jpeg).unwrap();
    assert_eq!(&jpeg[2..4], &[0xFF, 0xE0], "the encoder writes JFIF first");
    let app0 = usize::from(u16::from_be_bytes([jpeg[4], jpeg[5]]));
    jpeg.drain(2..4 + app0);
    let mut spec = PixelSpec::rgb8(h as u16, w as u16);
    let d = decode_ok(&image_file(
        JPEG_BASELINE,
        &spec,
        vec![],
        pixel_data_encapsulated(vec![jpeg.clone()]),
    ));
    let want = DynImage::U8(Image::from_vec(w, h, 3, want).unwrap());
    assert!(max_abs_diff(&d.image, &want) <= 10, "{}", max_abs_diff(&d.image, &want));
    // The same stream labelled YBR_FULL_422 is converted from YCbCr.
    spec.photometric = "YBR_FULL_422";
    let d =
        decode_ok(&image_file(JPEG_BASELINE, &spec, vec![], pixel_data_encapsulated(vec![jpeg])));
    assert!(max_abs_diff(&d.image, &DynImage::U8(pre)) <= 10);
    assert!(max_abs_diff(&d.image, &want) >= 30);
}

/// 8-bit colour goes to libjpeg-turbo wherever its own colour rule agrees with DICOM's, and
/// gives the picture jpeg-decoder gives (the two differ by rounding only); a stream whose
/// component identifiers say R, G, B is left unconverted, as its RGB label says.
#[test]
fn jpeg_colour_decodes_alike_through_either_decoder_and_rgb_ids_stay_rgb() {
    let (w, h) = (48usize, 32usize);
    let rgb = smooth_image8(w, h, 3);
    let jpeg = bs_imageio::encode(&DynImage::U8(rgb.clone()), Format::Jpeg).unwrap();
    // The stream labelled `photometric`, through our decoder; and through jpeg-decoder alone,
    // told the colour transform.
    let ours = |stream: &[u8], photometric: &'static str| {
        let mut spec = PixelSpec::rgb8(h as u16, w as u16);
        spec.photometric = photometric;
        let file = image_file(
            JPEG_BASELINE,
            &spec,
            vec![],
            pixel_data_encapsulated(vec![stream.to_vec()]),
        );
        decode_ok(&file).image
    };
    let theirs = |stream: &[u8], transform| {
        let mut jd = jpeg_decoder::Decoder::new(stream);
        jd.set_color_transform(transform);
        DynImage::U8(Image::from_vec(w, h, 3, jd.decode().unwrap()).unwrap())
    };
    // JFIF, labelled YBR: both rules convert from YCbCr (libjpeg-turbo's route).
    let (converted, reference) =
        (ours(&jpeg, "YBR_FULL_422"), theirs(&jpeg, jpeg_decoder::ColorTransform::YCbCr));
    let diff = max_abs_diff(&converted, &reference);
    assert!(diff <= 3, "{diff}");
    assert!(max_abs_diff(&converted, &DynImage::U8(rgb)) <= 24);

    // No JFIF, component identifiers 'R', 'G', 'B' (frame and scan header alike), labelled RGB:
    // neither rule converts, so the samples come out as coded (the YCbCr the encoder wrote).
    let app0 = usize::from(u16::from_be_bytes([jpeg[4], jpeg[5]]));
    let mut raw = jpeg.clone();
    raw.drain(2..4 + app0);
    // The marker segment `m`, walking the segments from the start.
    let find = |raw: &[u8], m: u8| {
        let mut i = 2;
        while raw[i + 1] != m {
            i += 2 + usize::from(u16::from_be_bytes([raw[i + 2], raw[i + 3]]));
        }
        i
    };
    let sof = find(&raw, 0xC0);
    for (k, id) in b"RGB".iter().enumerate() {
        raw[sof + 10 + 3 * k] = *id;
    }
    let sos = find(&raw, 0xDA);
    assert_eq!(raw[sos + 4], 3, "one scan of three components");
    for (k, id) in b"RGB".iter().enumerate() {
        raw[sos + 5 + 2 * k] = *id;
    }
    // Against jpeg-decoder told the stream is RGB (this label's route before).
    let kept = ours(&raw, "RGB");
    let diff = max_abs_diff(&kept, &theirs(&raw, jpeg_decoder::ColorTransform::RGB));
    assert!(diff <= 3, "{diff}");
    assert!(max_abs_diff(&kept, &reference) >= 30, "not converted");
}

#[test]
fn palette_color_one_bit_thirty_two_bit_and_float_pixels() {
    // PALETTE COLOR, 8-bit indices, 16-bit entries starting at value 1.
    let mut spec = PixelSpec::gray(1, 3, 8, 8, false);
    spec.photometric = "PALETTE COLOR";
    let lut = |tag_d, tag_t, values: &[u16]| {
        vec![
            us(tag_d, &[values.len() as u16, 1, 16]),
            DataElement::new(
                tag_t,
                dicom_core::VR::OW,
                dicom_core::PrimitiveValue::U16(values.iter().copied().collect()),
            ),
        ]
    };
    let mut extra = lut(
        tags::RED_PALETTE_COLOR_LOOKUP_TABLE_DESCRIPTOR,
        tags::RED_PALETTE_COLOR_LOOKUP_TABLE_DATA,
        &[0, 1000, 65535],
    );
    extra.extend(lut(
        tags::GREEN_PALETTE_COLOR_LOOKUP_TABLE_DESCRIPTOR,
        tags::GREEN_PALETTE_COLOR_LOOKUP_TABLE_DATA,
        &[1, 2, 3],
    ));
    extra.extend(lut(
        tags::BLUE_PALETTE_COLOR_LOOKUP_TABLE_DESCRIPTOR,
        tags::BLUE_PALETTE_COLOR_LOOKUP_TABLE_DATA,
        &[7, 8, 9],
    ));
    let d = decode_ok(&image_file(EXPLICIT_LE, &spec, extra, pixel_data_8(vec![1, 2, 3])));
    let rgb16 = vec![0, 1, 7, 1000, 2, 8, 65535, 3, 9];
    assert_eq!(d.image, DynImage::U16(Image::from_vec(3, 1, 3, rgb16).unwrap()));

    // 1-bit: 0 and 1 shown as 0 and 255; the modality value is the stored bit.
    let mut spec = PixelSpec::gray(2, 4, 1, 1, false);
    spec.frames = Some(2);
    // 16 bits: frame 1 = 1,0,0,0 / 0,0,0,1; frame 2 = all ones.
    let d = decode_ok(&image_file(EXPLICIT_LE, &spec, vec![], pixel_data_8(vec![0x81, 0xFF])));
    assert_eq!(d.image, gray8(4, 2, vec![255, 0, 0, 0, 0, 0, 0, 255]));
    assert_eq!(d.frames, vec![gray8(4, 2, vec![255; 8])]);
    assert_eq!(d.meta.modality_value(255), Some(1.0));

    // 32-bit signed integers: kept in integer steps when the range fits 16 bits.
    let values: Vec<i32> = vec![-70_000, -69_000, -65_000, -70_000];
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let d = decode_ok(&image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(2, 2, 32, 32, true),
        vec![],
        pixel_data_8(bytes),
    ));
    let DynImage::U16(img) = &d.image else { panic!("16-bit expected") };
    let back: Vec<f64> =
        img.data.iter().map(|&p| d.meta.modality_value(u32::from(p)).unwrap()).collect();
    assert_eq!(back, vec![-70_000.0, -69_000.0, -65_000.0, -70_000.0]);
    assert_eq!(d.meta.pixel_scale, None);

    // Float Pixel Data (7FE0,0008): spread over 16 bits, values kept within a step.
    let mut elems = patient_elements();
    let spec = PixelSpec::gray(1, 4, 32, 32, false);
    // Bits Stored and High Bit do not apply to floats; a writer may leave them in.
    elems.extend(spec.elements());
    let floats = [0.5f32, -2.0, 10.25, 3.0];
    elems.push(DataElement::new(
        tags::FLOAT_PIXEL_DATA,
        dicom_core::VR::OF,
        dicom_core::PrimitiveValue::F32(floats.iter().copied().collect()),
    ));
    let d = decode_ok(&dicom_file(EXPLICIT_LE, elems));
    let DynImage::U16(img) = &d.image else { panic!("16-bit expected") };
    let scale = d.meta.pixel_scale.expect("a scale for float data");
    for (p, want) in img.data.iter().zip(floats) {
        let got = d.meta.modality_value(u32::from(*p)).unwrap();
        assert!((got - f64::from(want)).abs() <= scale, "{got} vs {want}");
    }
}

#[test]
fn unknown_and_unsupported_transfer_syntaxes_are_refused_by_name() {
    // JPIP HTJ2K Referenced: the HTJ2K family is decoded, but not pixels kept elsewhere.
    let jpip = "1.2.840.10008.1.2.4.204";
    let bytes = image_file(
        jpip,
        &PixelSpec::gray(2, 2, 8, 8, false),
        vec![],
        pixel_data_encapsulated(vec![vec![0xFF, 0x4F, 0xFF, 0x51]]),
    );
    match decode(&bytes, Some("jpip.dcm"), &Limits::default()) {
        Err(ImageIoError::UnsupportedTransferSyntax { file, uid, .. }) => {
            assert_eq!((file.as_str(), uid.as_str()), ("jpip.dcm", jpip));
        }
        other => panic!("expected UnsupportedTransferSyntax, got {other:?}"),
    }
    // Just the meta group (no data set at all) is enough to be refused.
    let header_only = dicom_file("1.2.840.10008.1.2.4.110", vec![]);
    match decode(&header_only, None, &Limits::default()) {
        Err(e @ ImageIoError::UnsupportedTransferSyntax { .. }) => {
            assert!(e.to_string().contains("unsupported: transfer syntax JPEG XL"), "{e}");
        }
        other => panic!("expected UnsupportedTransferSyntax, got {other:?}"),
    }
    // dicom-object will not write an unknown syntax: patch the UID of an Explicit VR LE file
    // ("1.2.840.10008.1.2.1\0", 20 bytes) into another of the same length.
    let mut unknown = dicom_file(EXPLICIT_LE, vec![]);
    let at = unknown.windows(20).position(|w| w == b"1.2.840.10008.1.2.1\0").unwrap();
    unknown[at..at + 20].copy_from_slice(b"1.2.3.4.5.6\0\0\0\0\0\0\0\0\0");
    let err = decode(&unknown, None, &Limits::default()).unwrap_err();
    assert!(
        matches!(&err, ImageIoError::UnsupportedTransferSyntax { uid, .. } if uid == "1.2.3.4.5.6"),
        "{err}"
    );
    assert!(err.to_string().contains("1.2.3.4.5.6"));
}

#[test]
fn unsupported_pixels_and_missing_attributes() {
    let mut spec = PixelSpec::gray(2, 2, 8, 8, false);
    spec.photometric = "PALETTE COLOR";
    let err = decode(
        &image_file(EXPLICIT_LE, &spec, vec![], pixel_data_8(vec![0; 4])),
        None,
        &Limits::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ImageIoError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("PALETTE COLOR"));
    // A segmented palette is a feature not decoded, not a broken file.
    let segmented = vec![DataElement::new(
        tags::SEGMENTED_RED_PALETTE_COLOR_LOOKUP_TABLE_DATA,
        dicom_core::VR::OW,
        dicom_core::PrimitiveValue::U16([0u16, 1, 0].into_iter().collect()),
    )];
    let err = decode(
        &image_file(EXPLICIT_LE, &spec, segmented, pixel_data_8(vec![0; 4])),
        None,
        &Limits::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ImageIoError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("unsupported: segmented"), "{err}");

    let spec = PixelSpec::gray(2, 2, 24, 24, false);
    let err = decode(
        &image_file(EXPLICIT_LE, &spec, vec![], pixel_data_8(vec![0; 12])),
        None,
        &Limits::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ImageIoError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("unsupported: Bits Allocated 24"), "{err}");

    // No pixel data at all, though the image's attributes are there: a broken image.
    let mut elems = patient_elements();
    elems.extend(PixelSpec::gray(2, 2, 8, 8, false).elements());
    let err = decode(&dicom_file(EXPLICIT_LE, elems), None, &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("Pixel Data"));
    // No image at all (a structured report, a PDF): not corrupt, only not an image.
    let mut elems = patient_elements();
    elems.push(DataElement::new(
        tags::SOP_CLASS_UID,
        dicom_core::VR::UI,
        dicom_core::PrimitiveValue::from("1.2.840.10008.5.1.4.1.1.88.11"),
    ));
    let err = decode(&dicom_file(EXPLICIT_LE, elems), None, &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::Unsupported { .. }), "{err}");
    let says = err.to_string();
    assert!(
        says.contains("not an image") && says.contains("1.2.840.10008.5.1.4.1.1.88.11"),
        "{says}"
    );

    // Pixel data shorter than Rows × Columns.
    let err = decode(
        &image_file(
            EXPLICIT_LE,
            &PixelSpec::gray(4, 4, 8, 8, false),
            vec![],
            pixel_data_8(vec![1; 10]),
        ),
        None,
        &Limits::default(),
    )
    .unwrap_err();
    assert!(matches!(err, ImageIoError::Truncated { .. }), "{err}");
}

#[test]
fn pixel_limit_is_checked_before_decoding() {
    // 65535 × 65535 (the most DICOM can declare) with 4 bytes of pixel data.
    let bytes = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(65535, 65535, 8, 8, false),
        vec![],
        pixel_data_8(vec![0; 4]),
    );
    match decode(&bytes, None, &Limits::default()) {
        Err(ImageIoError::TooLarge { width, height, limit, .. }) => {
            assert_eq!((width, height, limit), (65535, 65535, 100_000_000));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let small = Limits { max_pixels: 10, ..Limits::default() };
    let ok = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(4, 4, 8, 8, false),
        vec![],
        pixel_data_8(vec![0; 16]),
    );
    assert!(matches!(decode(&ok, None, &small), Err(ImageIoError::TooLarge { .. })));
    let few_bytes = Limits { max_bytes: 100, ..Limits::default() };
    assert!(matches!(decode(&ok, None, &few_bytes), Err(ImageIoError::TooManyBytes { .. })));
}

#[test]
fn a_huge_declared_length_is_refused_without_allocating() {
    let bytes = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(2, 2, 8, 8, false),
        vec![],
        pixel_data_8(vec![0; 4]),
    );
    // Find the Patient ID element (0010,0020) LO and make its 2-byte length 0xFFFF; then the
    // Pixel Data (7FE0,0010) OB 4-byte length 0xFFFFFFF0.
    let mut patched = bytes.clone();
    let at = find(&patched, &[0x10, 0x00, 0x20, 0x00, b'L', b'O']).unwrap();
    patched[at + 6..at + 8].copy_from_slice(&[0xFF, 0xFF]);
    let err = decode(&patched, None, &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::Truncated { .. } | ImageIoError::Corrupt { .. }), "{err}");

    let mut patched = bytes;
    let at = find(&patched, &[0xE0, 0x7F, 0x10, 0x00, b'O', b'B']).unwrap();
    patched[at + 8..at + 12].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    let err = decode(&patched, None, &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::Truncated { .. }), "{err}");
    assert!(err.to_string().contains("(7FE0,0010)"), "{err}");

    // The same in the file meta group.
    let mut meta = dicom_file(EXPLICIT_LE, vec![]);
    let at = find(&meta, &[0x02, 0x00, 0x10, 0x00, b'U', b'I']).unwrap();
    meta[at + 6..at + 8].copy_from_slice(&[0xFF, 0x7F]);
    assert!(decode(&meta, None, &Limits::default()).is_err());
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn truncated_and_corrupt_files_give_errors() {
    let files = [
        image_file(
            EXPLICIT_LE,
            &PixelSpec::gray(4, 4, 16, 12, false),
            vec![],
            pixel_data_16((0..16).collect()),
        ),
        image_file(
            IMPLICIT_LE,
            &PixelSpec::gray(4, 4, 8, 8, false),
            vec![],
            pixel_data_8((0..16).collect()),
        ),
        image_file(
            RLE,
            &PixelSpec::gray(4, 4, 8, 8, false),
            vec![],
            pixel_data_encapsulated(vec![rle_frame(&[3; 16], 1, 1)]),
        ),
        image_file(
            DEFLATED_LE,
            &PixelSpec::gray(4, 4, 8, 8, false),
            vec![],
            pixel_data_8((0..16).collect()),
        ),
    ];
    for bytes in &files {
        assert!(decode(bytes, None, &Limits::default()).is_ok());
        // (Cutting only an encapsulated file's final sequence delimiter is accepted, as
        // dicom-rs does, so the last cut is 10 bytes from the end.)
        for cut in
            [0, 10, 128, 131, 132, 140, 200, bytes.len() / 2, bytes.len() - 20, bytes.len() - 10]
        {
            let result = decode(&bytes[..cut], Some("cut.dcm"), &Limits::default());
            let err = result.expect_err("a cut file must not decode");
            assert_eq!(err.file(), "cut.dcm");
        }
    }
    // DICM magic followed by garbage.
    let mut garbage = vec![0u8; 128];
    garbage.extend_from_slice(b"DICM");
    garbage.extend((0..500u32).map(|i| (i * 97 % 251) as u8));
    assert!(decode(&garbage, None, &Limits::default()).is_err());
    // A .dcm name on something that is not DICOM at all.
    let err = decode(b"hello, world", Some("x.dcm"), &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::Corrupt { format: Format::Dicom, .. }), "{err}");
}

#[test]
fn read_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scan.dcm");
    let bytes = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(2, 2, 8, 8, false),
        vec![],
        pixel_data_8(vec![1, 2, 3, 4]),
    );
    std::fs::write(&path, &bytes).unwrap();
    let d = read(&path, &Limits::default()).unwrap();
    assert_eq!(d.image, gray8(2, 2, vec![1, 2, 3, 4]));

    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let err = read(&path, &Limits::default()).unwrap_err();
    assert!(err.to_string().contains("scan.dcm"), "{err}");
    let err = read(dir.path().join("missing.dcm"), &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::Io { .. }), "{err}");
    assert!(err.to_string().contains("missing.dcm"));
}

#[test]
fn a_file_without_preamble_is_read_too() {
    let bytes = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(2, 2, 8, 8, false),
        vec![],
        pixel_data_8(vec![9, 8, 7, 6]),
    );
    let d = decode_ok(&bytes[128..]);
    assert_eq!(d.image, gray8(2, 2, vec![9, 8, 7, 6]));
}

/// Implicit or explicit VR little-endian element bytes.
fn elem(explicit: bool, group: u16, element: u16, vr: &[u8; 2], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&group.to_le_bytes());
    out.extend_from_slice(&element.to_le_bytes());
    let long = matches!(vr, b"SQ" | b"OB" | b"OW" | b"UN");
    if explicit {
        out.extend_from_slice(vr);
        if long {
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        } else {
            out.extend_from_slice(&(value.len() as u16).to_le_bytes());
        }
    } else {
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(value);
    out
}

/// A data set with a defined-length sequence holding a defined-length item, written by hand
/// (dicom-object writes undefined lengths); `item_len_delta` corrupts the item's length.
fn defined_length_file(explicit: bool, item_len_delta: i64) -> Vec<u8> {
    let ts = if explicit { EXPLICIT_LE } else { IMPLICIT_LE };
    let mut out = dicom_file(ts, vec![]);
    let content = elem(explicit, 0x0008, 0x0100, b"SH", b"AB");
    let mut item = vec![0xFE, 0xFF, 0x00, 0xE0];
    item.extend_from_slice(&((content.len() as i64 + item_len_delta) as u32).to_le_bytes());
    item.extend_from_slice(&content);
    out.extend(elem(explicit, 0x0008, 0x2218, b"SQ", &item));
    out.extend(elem(explicit, 0x0028, 0x0002, b"US", &1u16.to_le_bytes()));
    out.extend(elem(explicit, 0x0028, 0x0004, b"CS", b"MONOCHROME2 "));
    out.extend(elem(explicit, 0x0028, 0x0010, b"US", &2u16.to_le_bytes()));
    out.extend(elem(explicit, 0x0028, 0x0011, b"US", &2u16.to_le_bytes()));
    out.extend(elem(explicit, 0x0028, 0x0100, b"US", &8u16.to_le_bytes()));
    out.extend(elem(explicit, 0x0028, 0x0101, b"US", &8u16.to_le_bytes()));
    out.extend(elem(explicit, 0x0028, 0x0102, b"US", &7u16.to_le_bytes()));
    out.extend(elem(explicit, 0x0028, 0x0103, b"US", &0u16.to_le_bytes()));
    out.extend(elem(explicit, 0x7FE0, 0x0010, b"OB", &[1, 2, 3, 4]));
    out
}

#[test]
fn defined_length_sequences_in_both_vr_encodings() {
    for explicit in [true, false] {
        let d = decode_ok(&defined_length_file(explicit, 0));
        assert_eq!(d.image, gray8(2, 2, vec![1, 2, 3, 4]), "explicit: {explicit}");
        // An item claiming more than its sequence holds, or less than its content.
        for delta in [4, -2, 1_000_000] {
            let err = decode(&defined_length_file(explicit, delta), None, &Limits::default())
                .expect_err("inconsistent lengths must fail");
            assert!(
                matches!(err, ImageIoError::Corrupt { .. } | ImageIoError::Truncated { .. }),
                "{err}"
            );
        }
    }
}

#[test]
fn encapsulated_uncompressed_and_deflated_frames() {
    let values: Vec<u16> = (0..12).map(|i| i * 5000).collect();
    let spec = PixelSpec::gray(3, 4, 16, 16, false);
    let bytes = image_file(
        "1.2.840.10008.1.2.1.98",
        &spec,
        vec![],
        pixel_data_encapsulated(vec![le16(&values)]),
    );
    assert_eq!(decode_ok(&bytes).image, gray16(4, 3, values.clone()));

    use std::io::Write;
    let mut deflater =
        flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    deflater.write_all(&le16(&values)).unwrap();
    let frame = deflater.finish().unwrap();
    let bytes =
        image_file("1.2.840.10008.1.2.8.1", &spec, vec![], pixel_data_encapsulated(vec![frame]));
    let d = decode_ok(&bytes);
    assert_eq!(d.image, gray16(4, 3, values));
    assert_eq!(d.meta.transfer_syntax_uid.as_deref(), Some("1.2.840.10008.1.2.8.1"));
}

/// An Encapsulated PDF gives back its document, cut to its stated length (the element is
/// padded to an even length); a length past the bytes is corrupt; an instance with no
/// document (an image, a report) is unsupported, not corrupt.
#[test]
fn an_encapsulated_document_is_given_back_as_stored() {
    use bs_imageio::encapsulated_document;
    let pdf = b"%PDF-1.4\n%%EOF\n".to_vec(); // 15 bytes: padded to 16 in the file
    let with = |len: Option<u32>| {
        let mut elems = patient_elements();
        elems.push(DataElement::new(
            tags::SOP_CLASS_UID,
            dicom_core::VR::UI,
            dicom_core::PrimitiveValue::from("1.2.840.10008.5.1.4.1.1.104.1"),
        ));
        let mut padded = pdf.clone();
        padded.push(0);
        elems.push(DataElement::new(
            tags::ENCAPSULATED_DOCUMENT,
            dicom_core::VR::OB,
            dicom_core::PrimitiveValue::U8(padded.into()),
        ));
        elems.push(DataElement::new(
            tags::MIME_TYPE_OF_ENCAPSULATED_DOCUMENT,
            dicom_core::VR::LO,
            dicom_core::PrimitiveValue::from("application/pdf"),
        ));
        if let Some(n) = len {
            elems.push(DataElement::new(
                tags::ENCAPSULATED_DOCUMENT_LENGTH,
                dicom_core::VR::UL,
                dicom_core::PrimitiveValue::from(n),
            ));
        }
        dicom_file(EXPLICIT_LE, elems)
    };
    let limits = Limits::default();
    let (mime, doc) = encapsulated_document(&with(Some(15)), &limits).unwrap();
    assert_eq!((mime.as_str(), doc), ("application/pdf", pdf.clone()));
    // Without a stated length, the element's bytes as they are.
    let (_, doc) = encapsulated_document(&with(None), &limits).unwrap();
    assert_eq!(doc.len(), 16);
    let err = encapsulated_document(&with(Some(17)), &limits).unwrap_err();
    assert!(matches!(err, ImageIoError::Corrupt { .. }), "{err}");
    let image = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(2, 2, 8, 8, false),
        vec![],
        pixel_data_8(vec![1; 4]),
    );
    let err = encapsulated_document(&image, &limits).unwrap_err();
    assert!(matches!(err, ImageIoError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("not an encapsulated document"), "{err}");
}

/// A structured report reads as text: its title, patient, then one line per content item
/// (concept: value, numbers with their units' code), nested items indented; content nested
/// past the depth written is summarised; an instance with no content tree is unsupported.
#[test]
fn a_structured_report_reads_as_text() {
    use bs_imageio::structured_report;
    use dicom_core::value::DataSetSequence;
    use dicom_core::{Length, VR};
    use dicom_object::InMemDicomObject;
    let seq = |tag, items: Vec<InMemDicomObject>| {
        DataElement::new(tag, VR::SQ, DataSetSequence::new(items, Length::UNDEFINED))
    };
    let code = |value: &str, meaning: &str| {
        InMemDicomObject::from_element_iter([
            DataElement::new(tags::CODE_VALUE, VR::SH, value),
            DataElement::new(tags::CODING_SCHEME_DESIGNATOR, VR::SH, "DCM"),
            DataElement::new(tags::CODE_MEANING, VR::LO, meaning),
        ])
    };
    let item = |kind: &str, name: &str, mut more: Vec<Elem>| {
        more.push(DataElement::new(tags::VALUE_TYPE, VR::CS, kind));
        more.push(seq(tags::CONCEPT_NAME_CODE_SEQUENCE, vec![code("1", name)]));
        InMemDicomObject::from_element_iter(more)
    };
    let num = InMemDicomObject::from_element_iter([
        seq(tags::MEASUREMENT_UNITS_CODE_SEQUENCE, vec![code("mm", "millimeter")]),
        DataElement::new(tags::NUMERIC_VALUE, VR::DS, "12.5"),
    ]);
    // A container 20 levels deep (the parser takes 64 levels of sequences), holding a text
    // item at the bottom.
    let mut deep = item("TEXT", "Bottom", vec![DataElement::new(tags::TEXT_VALUE, VR::UT, "x")]);
    for _ in 0..20 {
        deep = item("CONTAINER", "Level", vec![seq(tags::CONTENT_SEQUENCE, vec![deep])]);
    }
    let findings = item(
        "CONTAINER",
        "Findings",
        vec![seq(
            tags::CONTENT_SEQUENCE,
            vec![
                item(
                    "TEXT",
                    "Impression",
                    vec![DataElement::new(tags::TEXT_VALUE, VR::UT, "Normal.")],
                ),
                item("NUM", "Diameter", vec![seq(tags::MEASURED_VALUE_SEQUENCE, vec![num])]),
                item(
                    "CODE",
                    "Laterality",
                    vec![seq(tags::CONCEPT_CODE_SEQUENCE, vec![code("7771000", "Left")])],
                ),
            ],
        )],
    );
    let mut elems = patient_elements();
    elems.push(DataElement::new(tags::SOP_CLASS_UID, VR::UI, "1.2.840.10008.5.1.4.1.1.88.33"));
    elems.push(DataElement::new(tags::VALUE_TYPE, VR::CS, "CONTAINER"));
    elems.push(seq(tags::CONCEPT_NAME_CODE_SEQUENCE, vec![code("18748-4", "Imaging Report")]));
    elems.push(DataElement::new(tags::COMPLETION_FLAG, VR::CS, "COMPLETE"));
    elems.push(seq(tags::CONTENT_SEQUENCE, vec![findings, deep]));
    let text = structured_report(&dicom_file(EXPLICIT_LE, elems), &Limits::default()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        &lines[..4],
        ["Imaging Report", "Patient: Doe^Jane", "Patient ID: PID-0042", "Study date: 20240131"]
    );
    assert!(lines.contains(&"Completion: COMPLETE"), "{text}");
    for want in ["Findings", "  Impression: Normal.", "  Diameter: 12.5 mm", "  Laterality: Left"] {
        assert!(lines.contains(&want), "{want:?} in\n{text}");
    }
    assert!(lines.iter().any(|l| l.trim() == "… 1 items nested deeper"), "{text}");
    assert!(!text.contains("Bottom"), "{text}");
    let image = image_file(
        EXPLICIT_LE,
        &PixelSpec::gray(2, 2, 8, 8, false),
        vec![],
        pixel_data_8(vec![1; 4]),
    );
    let err = structured_report(&image, &Limits::default()).unwrap_err();
    assert!(matches!(err, ImageIoError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("not a structured report"), "{err}");
}
