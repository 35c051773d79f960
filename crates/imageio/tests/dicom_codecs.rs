//! DICOM compressed pixel data beyond JPEG. JPEG-LS streams are made here with CharLS;
//! JPEG 2000 and HTJ2K ones come from the small codestreams in `tests/data` (made once by
//! `tests/data/make-j2k.py` with Pillow's OpenJPEG and `make-htj2k.py` with OpenJPH; lossless
//! ones must give back the exact patterns computed here), wrapped in DICOM files by the tests.

mod common;

use bs_imageio::{ImageIoError, Limits, decode};
use bs_imaging::{DynImage, Image};
use common::*;

const J2K_LOSSLESS: &str = "1.2.840.10008.1.2.4.90";
const J2K_LOSSY: &str = "1.2.840.10008.1.2.4.91";
const W: usize = 16;
const H: usize = 12;

fn data(name: &str) -> Vec<u8> {
    test_data(name)
}

fn gray_pattern() -> Vec<u8> {
    (0..H).flat_map(|y| (0..W).map(move |x| ((x * 13 + y * 7) % 256) as u8)).collect()
}

fn gray12_pattern() -> Vec<u16> {
    (0..H).flat_map(|y| (0..W).map(move |x| ((x * 331 + y * 97) % 4096) as u16)).collect()
}

fn rgb_pattern() -> Vec<u8> {
    (0..H)
        .flat_map(|y| (0..W).flat_map(move |x| [x * 16, y * 20, (x + y) * 8].map(|v| v as u8)))
        .collect()
}

/// A DICOM file of transfer syntax `ts` whose one frame is the stream in `tests/data/<name>`.
fn stream_file(ts: &str, spec: &PixelSpec, name: &str) -> Vec<u8> {
    image_file(ts, spec, vec![], pixel_data_encapsulated(vec![data(name)]))
}

fn decode_ok(bytes: &[u8]) -> bs_imageio::Decoded {
    decode(bytes, Some("codec.dcm"), &Limits::default()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn jpeg_2000_lossless_gray_is_exact_in_codestream_and_jp2_form() {
    for file in ["gray8-lossless.j2k", "gray8-lossless.jp2"] {
        let bytes =
            stream_file(J2K_LOSSLESS, &PixelSpec::gray(H as u16, W as u16, 8, 8, false), file);
        let d = decode_ok(&bytes);
        assert_eq!(
            d.image,
            DynImage::U8(Image::from_vec(W, H, 1, gray_pattern()).unwrap()),
            "{file}"
        );
        assert_eq!(d.meta.transfer_syntax_uid.as_deref(), Some(J2K_LOSSLESS));
    }
    let bytes = stream_file(
        J2K_LOSSLESS,
        &PixelSpec::gray(H as u16, W as u16, 16, 12, false),
        "gray16-lossless.j2k",
    );
    let d = decode_ok(&bytes);
    assert_eq!(d.image, DynImage::U16(Image::from_vec(W, H, 1, gray12_pattern()).unwrap()));
}

#[test]
fn jpeg_2000_colour_transforms_come_out_as_rgb() {
    let mut spec = PixelSpec::rgb8(H as u16, W as u16);
    spec.photometric = "YBR_RCT";
    let bytes = stream_file(J2K_LOSSLESS, &spec, "rgb8-rct-lossless.j2k");
    let want = DynImage::U8(Image::from_vec(W, H, 3, rgb_pattern()).unwrap());
    assert_eq!(decode_ok(&bytes).image, want);
    spec.photometric = "YBR_ICT";
    let bytes = stream_file(J2K_LOSSY, &spec, "rgb8-ict-lossy.j2k");
    let got = decode_ok(&bytes).image;
    assert!(max_abs_diff(&got, &want) <= 12, "lossy differs by {}", max_abs_diff(&got, &want));
}

#[test]
fn jpeg_2000_multi_frame_and_bad_streams() {
    let mut spec = PixelSpec::gray(H as u16, W as u16, 8, 8, false);
    spec.frames = Some(2);
    let j = data("gray8-lossless.j2k");
    let d = decode_ok(&image_file(
        J2K_LOSSLESS,
        &spec,
        vec![],
        pixel_data_encapsulated(vec![j.clone(), j.clone()]),
    ));
    assert_eq!(d.frames, vec![d.image.clone()]);

    let one = |spec: &PixelSpec, stream: Vec<u8>| {
        decode(
            &image_file(J2K_LOSSLESS, spec, vec![], pixel_data_encapsulated(vec![stream])),
            None,
            &Limits::default(),
        )
    };
    let spec = PixelSpec::gray(H as u16, W as u16, 8, 8, false);
    // The header disagreeing with the codestream is refused before decoding.
    let err = one(&PixelSpec::gray(H as u16, 8, 8, 8, false), j.clone()).unwrap_err();
    assert!(matches!(err, ImageIoError::Corrupt { .. }), "{err}");
    // A cut codestream, at every length: an error, never a partial image or a panic.
    for cut in (0..j.len()).step_by(7) {
        let res = one(&spec, j[..cut].to_vec());
        assert!(
            matches!(res, Err(ImageIoError::Corrupt { .. } | ImageIoError::Truncated { .. })),
            "cut at {cut}: {res:?}"
        );
    }
    // Flipped bytes after the header: an error or an image, never a panic or a hang.
    for at in (60..j.len()).step_by(5) {
        let mut bad = j.clone();
        bad[at] ^= 0x5A;
        let _ = one(&spec, bad);
    }
}

const HTJ2K_LOSSLESS: &str = "1.2.840.10008.1.2.4.201";
const HTJ2K_RPCL: &str = "1.2.840.10008.1.2.4.202";
const HTJ2K: &str = "1.2.840.10008.1.2.4.203";

/// High-Throughput JPEG 2000 streams made by OpenJPH (`tests/data/make-htj2k.py`): the
/// lossless ones give back the exact patterns, under both lossless transfer syntaxes.
#[test]
fn htj2k_lossless_is_exact_in_grey_and_colour() {
    for ts in [HTJ2K_LOSSLESS, HTJ2K_RPCL] {
        let gray = stream_file(
            ts,
            &PixelSpec::gray(H as u16, W as u16, 8, 8, false),
            "gray8-htj2k-lossless.j2c",
        );
        let d = decode_ok(&gray);
        assert_eq!(d.image, DynImage::U8(Image::from_vec(W, H, 1, gray_pattern()).unwrap()));
        assert_eq!(d.meta.transfer_syntax_uid.as_deref(), Some(ts));
        let g12 = stream_file(
            ts,
            &PixelSpec::gray(H as u16, W as u16, 16, 12, false),
            "gray12-htj2k-lossless.j2c",
        );
        let want = DynImage::U16(Image::from_vec(W, H, 1, gray12_pattern()).unwrap());
        assert_eq!(decode_ok(&g12).image, want, "{ts}");
        let mut spec = PixelSpec::rgb8(H as u16, W as u16);
        spec.photometric = "YBR_RCT";
        let rgb = stream_file(ts, &spec, "rgb8-htj2k-lossless.j2c");
        let want = DynImage::U8(Image::from_vec(W, H, 3, rgb_pattern()).unwrap());
        assert_eq!(decode_ok(&rgb).image, want, "{ts}");
    }
}

#[test]
fn htj2k_lossy_is_close_and_cut_streams_are_errors() {
    let spec = PixelSpec::gray(H as u16, W as u16, 8, 8, false);
    let lossy = data("gray8-htj2k-lossy.j2c");
    let d = decode_ok(&image_file(HTJ2K, &spec, vec![], pixel_data_encapsulated(vec![lossy])));
    let want = DynImage::U8(Image::from_vec(W, H, 1, gray_pattern()).unwrap());
    let diff = max_abs_diff(&d.image, &want);
    assert!(diff <= 8, "lossy HTJ2K differs by {diff}");
    let j = data("gray8-htj2k-lossless.j2c");
    // A stream that needs JPEG 2000 Part 2 (Rsiz bit 15) is refused, not decoded wrongly.
    let mut part2 = j.clone();
    part2[6] |= 0x80;
    let file = image_file(HTJ2K_LOSSLESS, &spec, vec![], pixel_data_encapsulated(vec![part2]));
    let e = decode(&file, None, &Limits::default()).unwrap_err();
    assert!(
        matches!(e, ImageIoError::Unsupported { .. }) && e.to_string().contains("Part 2"),
        "{e}"
    );
    for cut in (0..j.len()).step_by(3) {
        let file = image_file(
            HTJ2K_LOSSLESS,
            &spec,
            vec![],
            pixel_data_encapsulated(vec![j[..cut].to_vec()]),
        );
        let res = decode(&file, None, &Limits::default());
        assert!(
            matches!(res, Err(ImageIoError::Corrupt { .. } | ImageIoError::Truncated { .. })),
            "cut at {cut}: {res:?}"
        );
    }
}

const JLS_LOSSLESS: &str = "1.2.840.10008.1.2.4.80";
const JLS_NEAR: &str = "1.2.840.10008.1.2.4.81";

/// A JPEG-LS stream of `samples` (planes for interleave mode none, else interleaved) made by
/// CharLS.
fn jpeg_ls(
    samples: &[u8],
    bits: i32,
    components: i32,
    near: i32,
    interleave: charls::InterleaveMode,
) -> Vec<u8> {
    let mut codec = charls::CharLS::default();
    codec.set_interleave_mode(interleave).unwrap();
    let info = charls::FrameInfo {
        width: W as u32,
        height: H as u32,
        bits_per_sample: bits,
        component_count: components,
    };
    codec.encode(info, near, samples).unwrap()
}

#[test]
fn jpeg_ls_lossless_gray_8_and_12_bit_is_exact() {
    let stream = jpeg_ls(&gray_pattern(), 8, 1, 0, charls::InterleaveMode::None);
    let d = decode_ok(&image_file(
        JLS_LOSSLESS,
        &PixelSpec::gray(H as u16, W as u16, 8, 8, false),
        vec![],
        pixel_data_encapsulated(vec![stream]),
    ));
    assert_eq!(d.image, DynImage::U8(Image::from_vec(W, H, 1, gray_pattern()).unwrap()));

    let g12 = gray12_pattern();
    let bytes: Vec<u8> = g12.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let stream = jpeg_ls(&bytes, 12, 1, 0, charls::InterleaveMode::None);
    let d = decode_ok(&image_file(
        JLS_LOSSLESS,
        &PixelSpec::gray(H as u16, W as u16, 16, 12, false),
        vec![],
        pixel_data_encapsulated(vec![stream]),
    ));
    assert_eq!(d.image, DynImage::U16(Image::from_vec(W, H, 1, g12).unwrap()));
}

#[test]
fn jpeg_ls_near_lossless_stays_within_near_and_colour_in_every_interleave() {
    let stream = jpeg_ls(&gray_pattern(), 8, 1, 3, charls::InterleaveMode::None);
    let d = decode_ok(&image_file(
        JLS_NEAR,
        &PixelSpec::gray(H as u16, W as u16, 8, 8, false),
        vec![],
        pixel_data_encapsulated(vec![stream]),
    ));
    let want = DynImage::U8(Image::from_vec(W, H, 1, gray_pattern()).unwrap());
    assert!(max_abs_diff(&d.image, &want) <= 3);

    let rgb = rgb_pattern();
    let want = DynImage::U8(Image::from_vec(W, H, 3, rgb.clone()).unwrap());
    for mode in
        [charls::InterleaveMode::None, charls::InterleaveMode::Line, charls::InterleaveMode::Sample]
    {
        let input: Vec<u8> = if mode == charls::InterleaveMode::None {
            (0..3).flat_map(|c| rgb.iter().skip(c).step_by(3).copied()).collect()
        } else {
            rgb.clone()
        };
        let stream = jpeg_ls(&input, 8, 3, 0, mode);
        let d = decode_ok(&image_file(
            JLS_LOSSLESS,
            &PixelSpec::rgb8(H as u16, W as u16),
            vec![],
            pixel_data_encapsulated(vec![stream]),
        ));
        assert_eq!(d.image, want, "{mode:?}");
    }
}

#[test]
fn jpeg_ls_multi_frame_and_bad_streams() {
    let a = jpeg_ls(&gray_pattern(), 8, 1, 0, charls::InterleaveMode::None);
    let inverse: Vec<u8> = gray_pattern().iter().map(|v| 255 - v).collect();
    let b = jpeg_ls(&inverse, 8, 1, 0, charls::InterleaveMode::None);
    let mut spec = PixelSpec::gray(H as u16, W as u16, 8, 8, false);
    spec.frames = Some(2);
    let d = decode_ok(&image_file(
        JLS_LOSSLESS,
        &spec,
        vec![],
        pixel_data_encapsulated(vec![a.clone(), b]),
    ));
    assert_eq!(d.frames, vec![DynImage::U8(Image::from_vec(W, H, 1, inverse).unwrap())]);

    let one = |spec: &PixelSpec, stream: Vec<u8>| {
        decode(
            &image_file(JLS_LOSSLESS, spec, vec![], pixel_data_encapsulated(vec![stream])),
            None,
            &Limits::default(),
        )
    };
    let spec = PixelSpec::gray(H as u16, W as u16, 8, 8, false);
    let err = one(&PixelSpec::gray(H as u16 + 1, W as u16, 8, 8, false), a.clone()).unwrap_err();
    assert!(matches!(err, ImageIoError::Corrupt { .. }), "{err}");
    // A cut stream, at every fifth length: an error, never a partial image or a panic.
    for cut in (0..a.len()).step_by(5) {
        let res = one(&spec, a[..cut].to_vec());
        assert!(
            matches!(res, Err(ImageIoError::Corrupt { .. } | ImageIoError::Truncated { .. })),
            "cut at {cut}: {res:?}"
        );
    }
    // Flipped bytes: an error or an image, never a panic or a hang.
    for at in (20..a.len()).step_by(3) {
        let mut bad = a.clone();
        bad[at] ^= 0xA5;
        let _ = one(&spec, bad);
    }
}

/// A 12-bit grayscale JPEG of the W × H test pattern's size made by libjpeg-turbo: lossy at
/// `quality`, or lossless with predictor `psv` (1–7).
fn jpeg12(samples: &[u16], lossless_psv: Option<i32>, quality: i32) -> Vec<u8> {
    bs_imageio::dicom::jpeg12::encode_gray(samples, W, H, 12, lossless_psv, quality).unwrap()
}

const JPEG_EXTENDED: &str = "1.2.840.10008.1.2.4.51";
const JPEG_LOSSLESS: &str = "1.2.840.10008.1.2.4.57";

#[test]
fn jpeg_12_bit_lossy_and_lossless_with_every_predictor() {
    let want = gray12_pattern();
    let spec = PixelSpec::gray(H as u16, W as u16, 16, 12, false);
    let lossy = jpeg12(&want, None, 98);
    let d = decode_ok(&image_file(
        JPEG_EXTENDED,
        &spec,
        vec![],
        pixel_data_encapsulated(vec![lossy.clone()]),
    ));
    let DynImage::U16(img) = &d.image else { panic!("16-bit expected") };
    // A steep pattern (steps of 331 per pixel) through a lossy codec: close, not exact.
    let worst = img.data.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
    assert!(worst < 400, "12-bit lossy differs by {worst}");
    let mean: f64 = img.data.iter().zip(&want).map(|(a, b)| f64::from(a.abs_diff(*b))).sum::<f64>()
        / want.len() as f64;
    assert!(mean < 40.0, "mean error {mean}");
    for psv in 1..=7 {
        let stream = jpeg12(&want, Some(psv), 0);
        let d = decode_ok(&image_file(
            JPEG_LOSSLESS,
            &spec,
            vec![],
            pixel_data_encapsulated(vec![stream]),
        ));
        assert_eq!(
            d.image,
            DynImage::U16(Image::from_vec(W, H, 1, want.clone()).unwrap()),
            "predictor {psv}"
        );
    }
    // Padding before the end marker is skipped: the same pixels.
    let mut padded = lossy[..lossy.len() - 2].to_vec();
    padded.extend_from_slice(&[0x00, 0x11, 0x22, 0xff, 0xd9, 0x00]);
    let p =
        decode_ok(&image_file(JPEG_EXTENDED, &spec, vec![], pixel_data_encapsulated(vec![padded])));
    assert_eq!(p.image, d.image);
    // A cut 12-bit stream is an error, never a padded image.
    for cut in (0..lossy.len()).step_by(11) {
        let res = decode(
            &image_file(
                JPEG_EXTENDED,
                &spec,
                vec![],
                pixel_data_encapsulated(vec![lossy[..cut].to_vec()]),
            ),
            None,
            &Limits::default(),
        );
        assert!(
            matches!(res, Err(ImageIoError::Corrupt { .. } | ImageIoError::Truncated { .. })),
            "cut at {cut}: {res:?}"
        );
    }
}

/// Lossless JPEG of grey samples at 8, 12 and 16 bits, under both lossless syntaxes: the exact
/// samples back with every predictor; a cut stream is an error, never a padded image.
#[test]
fn jpeg_lossless_grey_at_every_precision_is_exact_and_cut_streams_are_errors() {
    const SV1: &str = "1.2.840.10008.1.2.4.70";
    for (precision, allocated) in [(8u8, 8u16), (12, 16), (16, 16)] {
        let top = (1u32 << precision) - 1;
        let want: Vec<u16> = (0..W * H)
            .map(|i| ((i as u64 * 2_654_435_761) % (u64::from(top) + 1)) as u16)
            .collect();
        let spec = PixelSpec::gray(H as u16, W as u16, allocated, u16::from(precision), false);
        let pixels = |stream: Vec<u8>, ts| {
            image_file(ts, &spec, vec![], pixel_data_encapsulated(vec![stream]))
        };
        let expect = if precision == 8 {
            DynImage::U8(Image::from_vec(W, H, 1, want.iter().map(|&v| v as u8).collect()).unwrap())
        } else {
            DynImage::U16(Image::from_vec(W, H, 1, want.clone()).unwrap())
        };
        for (ts, psvs) in [(JPEG_LOSSLESS, 1..=7), (SV1, 1..=1)] {
            for psv in psvs {
                let stream =
                    bs_imageio::dicom::jpeg12::encode_gray(&want, W, H, precision, Some(psv), 0)
                        .unwrap();
                let d = decode_ok(&pixels(stream.clone(), ts));
                assert_eq!(d.image, expect, "{precision} bits, predictor {psv}");
                for cut in (2..stream.len()).step_by(7) {
                    let res = decode(&pixels(stream[..cut].to_vec(), ts), None, &Limits::default());
                    assert!(
                        matches!(
                            res,
                            Err(ImageIoError::Corrupt { .. } | ImageIoError::Truncated { .. })
                        ),
                        "{precision} bits cut at {cut}: {res:?}"
                    );
                }
            }
        }
    }
}

/// Frames are decoded over the machine's cores: many frames still come back in order, each
/// exact, and a file with bad frames fails with the error of the first of them.
#[test]
fn many_frames_come_back_in_order_and_the_first_bad_frame_is_the_one_reported() {
    let n = 11;
    let frame =
        |k: usize| -> Vec<u16> { (0..W * H).map(|i| ((i * 37 + k * 401) % 4096) as u16).collect() };
    let streams: Vec<Vec<u8>> =
        (0..n).map(|k| jpeg12(&frame(k), Some(1 + k as i32 % 7), 0)).collect();
    let mut spec = PixelSpec::gray(H as u16, W as u16, 16, 12, false);
    spec.frames = Some(n as u32);
    let file = |streams: Vec<Vec<u8>>| {
        image_file(JPEG_LOSSLESS, &spec, vec![], pixel_data_encapsulated(streams))
    };
    let d = decode_ok(&file(streams.clone()));
    for k in 0..n {
        let want = DynImage::U16(Image::from_vec(W, H, 1, frame(k)).unwrap());
        assert_eq!(d.frame(k), Some(&want), "frame {k}");
    }
    // Frames 4 and 9 cut short (and unlike each other): the error is frame 4's.
    let mut bad = streams.clone();
    let half = bad[4].len() / 2;
    bad[4].truncate(half);
    bad[9].truncate(10);
    let err = decode(&file(bad), None, &Limits::default()).unwrap_err();
    let one = PixelSpec::gray(H as u16, W as u16, 16, 12, false);
    let alone = |stream: &[u8]| {
        let f =
            image_file(JPEG_LOSSLESS, &one, vec![], pixel_data_encapsulated(vec![stream.to_vec()]));
        decode(&f, None, &Limits::default()).unwrap_err().to_string()
    };
    let (fourth, ninth) = (alone(&streams[4][..half]), alone(&streams[9][..10]));
    assert_ne!(fourth, ninth, "the two bad frames fail differently");
    assert_eq!(err.to_string(), fourth);
}
