//! Helpers shared by the integration tests: DICOM files built with dicom-object, RLE and PNG
//! pieces written by hand, and deterministic test images.

#![allow(dead_code)]

use bs_imaging::{DynImage, Image};
use dicom_core::value::{DataSetSequence, PixelFragmentSequence, PrimitiveValue, Value};
use dicom_core::{DataElement, Length, Tag, VR};
use dicom_dictionary_std::tags;
use dicom_object::{FileMetaTableBuilder, InMemDicomObject};

pub const EXPLICIT_LE: &str = "1.2.840.10008.1.2.1";
pub const IMPLICIT_LE: &str = "1.2.840.10008.1.2";
pub const EXPLICIT_BE: &str = "1.2.840.10008.1.2.2";
pub const DEFLATED_LE: &str = "1.2.840.10008.1.2.1.99";
pub const RLE: &str = "1.2.840.10008.1.2.5";
pub const JPEG_BASELINE: &str = "1.2.840.10008.1.2.4.50";

pub type Elem = DataElement<InMemDicomObject>;

/// The pixel-describing attributes of an image.
#[derive(Debug, Clone)]
pub struct PixelSpec {
    pub rows: u16,
    pub cols: u16,
    pub samples: u16,
    pub bits_allocated: u16,
    pub bits_stored: u16,
    pub signed: bool,
    pub photometric: &'static str,
    pub planar: Option<u16>,
    pub frames: Option<u32>,
}

impl PixelSpec {
    pub fn gray(rows: u16, cols: u16, bits_allocated: u16, bits_stored: u16, signed: bool) -> Self {
        Self {
            rows,
            cols,
            samples: 1,
            bits_allocated,
            bits_stored,
            signed,
            photometric: "MONOCHROME2",
            planar: None,
            frames: None,
        }
    }

    pub fn rgb8(rows: u16, cols: u16) -> Self {
        Self {
            samples: 3,
            photometric: "RGB",
            planar: Some(0),
            ..Self::gray(rows, cols, 8, 8, false)
        }
    }

    pub fn elements(&self) -> Vec<Elem> {
        let mut v = vec![
            DataElement::new(tags::SAMPLES_PER_PIXEL, VR::US, PrimitiveValue::from(self.samples)),
            DataElement::new(tags::PHOTOMETRIC_INTERPRETATION, VR::CS, self.photometric),
            DataElement::new(tags::ROWS, VR::US, PrimitiveValue::from(self.rows)),
            DataElement::new(tags::COLUMNS, VR::US, PrimitiveValue::from(self.cols)),
            DataElement::new(
                tags::BITS_ALLOCATED,
                VR::US,
                PrimitiveValue::from(self.bits_allocated),
            ),
            DataElement::new(tags::BITS_STORED, VR::US, PrimitiveValue::from(self.bits_stored)),
            DataElement::new(tags::HIGH_BIT, VR::US, PrimitiveValue::from(self.bits_stored - 1)),
            DataElement::new(
                tags::PIXEL_REPRESENTATION,
                VR::US,
                PrimitiveValue::from(u16::from(self.signed)),
            ),
        ];
        if let Some(p) = self.planar {
            v.push(DataElement::new(tags::PLANAR_CONFIGURATION, VR::US, PrimitiveValue::from(p)));
        }
        if let Some(n) = self.frames {
            v.push(DataElement::new(tags::NUMBER_OF_FRAMES, VR::IS, n.to_string()));
        }
        v
    }
}

/// Patient, study, series and acquisition attributes, plus a nested sequence so that every
/// test file exercises sequence parsing.
pub fn patient_elements() -> Vec<Elem> {
    let item = InMemDicomObject::from_element_iter([
        DataElement::new(tags::CODE_VALUE, VR::SH, "T-D1100"),
        DataElement::new(tags::CODING_SCHEME_DESIGNATOR, VR::SH, "SRT"),
        DataElement::new(tags::CODE_MEANING, VR::LO, "Head"),
    ]);
    vec![
        DataElement::new(tags::SOP_CLASS_UID, VR::UI, "1.2.840.10008.5.1.4.1.1.7"),
        DataElement::new(tags::SOP_INSTANCE_UID, VR::UI, "1.2.826.0.1.3680043.2.1125.1.9"),
        DataElement::new(tags::STUDY_DATE, VR::DA, "20240131"),
        DataElement::new(tags::ACQUISITION_DATE, VR::DA, "20240131"),
        DataElement::new(tags::ACQUISITION_TIME, VR::TM, "101530.25"),
        DataElement::new(tags::MODALITY, VR::CS, "CT"),
        DataElement::new(tags::STUDY_DESCRIPTION, VR::LO, "HEAD W/O CONTRAST"),
        DataElement::new(tags::SERIES_DESCRIPTION, VR::LO, "AXIAL 5mm"),
        DataElement::new(
            tags::ANATOMIC_REGION_SEQUENCE,
            VR::SQ,
            DataSetSequence::new(vec![item], Length::UNDEFINED),
        ),
        DataElement::new(tags::PATIENT_NAME, VR::PN, "Doe^Jane"),
        DataElement::new(tags::PATIENT_ID, VR::LO, "PID-0042"),
        DataElement::new(tags::STUDY_INSTANCE_UID, VR::UI, "1.2.826.0.1.3680043.2.1125.1.7"),
        DataElement::new(tags::SERIES_INSTANCE_UID, VR::UI, "1.2.826.0.1.3680043.2.1125.1.8"),
        DataElement::new(tags::SERIES_NUMBER, VR::IS, "3"),
    ]
}

pub fn pixel_data_8(bytes: Vec<u8>) -> Elem {
    DataElement::new(tags::PIXEL_DATA, VR::OB, PrimitiveValue::U8(bytes.into()))
}

pub fn pixel_data_16(values: Vec<u16>) -> Elem {
    DataElement::new(tags::PIXEL_DATA, VR::OW, PrimitiveValue::U16(values.into()))
}

pub fn pixel_data_encapsulated(fragments: Vec<Vec<u8>>) -> Elem {
    DataElement::new(
        tags::PIXEL_DATA,
        VR::OB,
        Value::PixelSequence(PixelFragmentSequence::new(Vec::<u32>::new(), fragments)),
    )
}

/// Encapsulated pixel data with a Basic Offset Table.
pub fn pixel_data_encapsulated_with_table(offsets: Vec<u32>, fragments: Vec<Vec<u8>>) -> Elem {
    DataElement::new(
        tags::PIXEL_DATA,
        VR::OB,
        Value::PixelSequence(PixelFragmentSequence::new(offsets, fragments)),
    )
}

/// A 16-bit unsigned attribute of one or more values.
pub fn us(tag: Tag, v: &[u16]) -> Elem {
    DataElement::new(tag, VR::US, PrimitiveValue::U16(v.iter().copied().collect()))
}

pub fn ds(tag: Tag, v: &str) -> Elem {
    DataElement::new(tag, VR::DS, v)
}

/// A Part 10 file (preamble, DICM, meta group, data set) in transfer syntax `ts`.
pub fn dicom_file(ts: &str, elements: Vec<Elem>) -> Vec<u8> {
    let obj = InMemDicomObject::from_element_iter(elements);
    let file = obj
        .with_meta(
            FileMetaTableBuilder::new()
                .transfer_syntax(ts)
                .media_storage_sop_class_uid("1.2.840.10008.5.1.4.1.1.7")
                .media_storage_sop_instance_uid("1.2.826.0.1.3680043.2.1125.1.9"),
        )
        .expect("meta table");
    let mut out = Vec::new();
    file.write_all(&mut out).expect("write DICOM");
    out
}

/// A complete image file: patient attributes, pixel attributes, extra elements, pixel data.
pub fn image_file(ts: &str, spec: &PixelSpec, extra: Vec<Elem>, pixels: Elem) -> Vec<u8> {
    let mut all = patient_elements();
    all.extend(spec.elements());
    all.extend(extra);
    all.push(pixels);
    dicom_file(ts, all)
}

/// RLE Lossless frame from interleaved little-endian samples: the 64-byte header and one
/// PackBits segment per sample byte, most significant byte first. Runs of equal bytes become
/// repeat runs, everything else literal runs.
pub fn rle_frame(data: &[u8], samples: usize, bytes_per_sample: usize) -> Vec<u8> {
    let segments = samples * bytes_per_sample;
    let pixels = data.len() / segments;
    let mut header = vec![0u8; 64];
    header[..4].copy_from_slice(&(segments as u32).to_le_bytes());
    let mut body = Vec::new();
    for seg in 0..segments {
        let sample = seg / bytes_per_sample;
        let rank = seg % bytes_per_sample;
        let at = sample * bytes_per_sample + (bytes_per_sample - 1 - rank);
        let plane: Vec<u8> = (0..pixels).map(|p| data[p * segments + at]).collect();
        let offset = 64 + body.len() as u32;
        header[4 + seg * 4..8 + seg * 4].copy_from_slice(&offset.to_le_bytes());
        let mut i = 0;
        while i < plane.len() {
            let mut run = 1;
            while i + run < plane.len() && run < 128 && plane[i + run] == plane[i] {
                run += 1;
            }
            if run >= 2 {
                body.push((1 - run as i32) as i8 as u8);
                body.push(plane[i]);
            } else {
                run = 1;
                while i + run < plane.len() && run < 128 && plane[i + run] != plane[i + run - 1] {
                    run += 1;
                }
                body.push((run - 1) as u8);
                body.extend_from_slice(&plane[i..i + run]);
            }
            i += run;
        }
        if body.len() % 2 == 1 {
            body.push(0x80);
        }
    }
    header.extend(body);
    header
}

pub fn le16(values: &[u16]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A deterministic image of `w × h` with `channels` channels.
pub fn test_image8(w: usize, h: usize, channels: usize) -> Image<u8> {
    let data = (0..w * h * channels).map(|i| ((i * 37 + i / 7) % 256) as u8).collect();
    Image::from_vec(w, h, channels, data).unwrap()
}

pub fn test_image16(w: usize, h: usize, channels: usize) -> Image<u16> {
    let data = (0..w * h * channels).map(|i| ((i * 7919 + 13) % 65536) as u16).collect();
    Image::from_vec(w, h, channels, data).unwrap()
}

/// A smooth image (gradients) that lossy codecs keep close.
pub fn smooth_image8(w: usize, h: usize, channels: usize) -> Image<u8> {
    let mut data = Vec::with_capacity(w * h * channels);
    for y in 0..h {
        for x in 0..w {
            for c in 0..channels {
                data.push((20 + x * 3 + y * 2 + c * 30).min(255) as u8);
            }
        }
    }
    Image::from_vec(w, h, channels, data).unwrap()
}

/// An image with few colours (at most 256), which GIF keeps exactly.
pub fn few_colours8(w: usize, h: usize, channels: usize) -> Image<u8> {
    let palette: [[u8; 4]; 4] =
        [[0, 0, 0, 255], [255, 0, 0, 255], [10, 200, 30, 255], [250, 250, 250, 255]];
    let mut data = Vec::with_capacity(w * h * channels);
    for i in 0..w * h {
        let c = palette[(i * 7 / 3) % 4];
        data.extend_from_slice(&c[..channels]);
    }
    Image::from_vec(w, h, channels, data).unwrap()
}

pub fn max_abs_diff(a: &DynImage, b: &DynImage) -> u32 {
    match (a, b) {
        (DynImage::U8(a), DynImage::U8(b)) => {
            assert_eq!((a.width, a.height, a.channels), (b.width, b.height, b.channels));
            a.data.iter().zip(&b.data).map(|(&x, &y)| u32::from(x.abs_diff(y))).max().unwrap_or(0)
        }
        _ => panic!("both images must be 8-bit"),
    }
}

/// CRC-32 (IEEE) for hand-made PNG chunks.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// A PNG chunk: length, type, data, CRC.
pub fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32(&body).to_be_bytes());
    out
}

/// A PNG header claiming `w × h` 8-bit RGB pixels, with a tiny (wrong) IDAT.
pub fn png_header_only(w: u32, h: u32) -> Vec<u8> {
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend(png_chunk(b"IHDR", &ihdr));
    out.extend(png_chunk(b"IDAT", &[0x78, 0x9C, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]));
    out.extend(png_chunk(b"IEND", &[]));
    out
}

/// A little-endian TIFF whose one IFD claims `w × h` 8-bit gray pixels in a single strip of a
/// few bytes.
pub fn tiff_header_only(w: u32, h: u32) -> Vec<u8> {
    let entries: [(u16, u16, u32); 9] = [
        (256, 4, w),                  // ImageWidth, LONG
        (257, 4, h),                  // ImageLength
        (258, 3, 8),                  // BitsPerSample, SHORT
        (259, 3, 1),                  // Compression: none
        (262, 3, 1),                  // PhotometricInterpretation: BlackIsZero
        (273, 4, 8 + 2 + 9 * 12 + 4), // StripOffsets: right after the IFD
        (277, 3, 1),                  // SamplesPerPixel
        (278, 4, h),                  // RowsPerStrip
        (279, 4, 16),                 // StripByteCounts
    ];
    let mut out = b"II*\0".to_vec();
    out.extend_from_slice(&8u32.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    for (tag, kind, value) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&[0u8; 16]);
    out
}

/// Small valid DICOM files of every transfer syntax the crate decodes: seeds for fuzzing and
/// for allocation checks.
pub fn dicom_samples() -> Vec<Vec<u8>> {
    let gray16: Vec<u16> = (0..64).map(|i| i * 1000).collect();
    let gray8: Vec<u8> = (0..64).map(|i| i as u8 * 3).collect();
    let window = vec![
        ds(tags::RESCALE_INTERCEPT, "-1024"),
        ds(tags::RESCALE_SLOPE, "1"),
        ds(tags::WINDOW_CENTER, "40"),
        ds(tags::WINDOW_WIDTH, "400"),
    ];
    let jpeg = bs_imageio::encode(&DynImage::U8(smooth_image8(8, 8, 1)), bs_imageio::Format::Jpeg)
        .unwrap();
    vec![
        image_file(
            EXPLICIT_LE,
            &PixelSpec::gray(8, 8, 16, 12, true),
            window.clone(),
            pixel_data_16(gray16.clone()),
        ),
        image_file(
            IMPLICIT_LE,
            &PixelSpec::gray(8, 8, 16, 16, false),
            window,
            pixel_data_16(gray16.clone()),
        ),
        image_file(
            EXPLICIT_BE,
            &PixelSpec::gray(8, 8, 16, 16, false),
            vec![],
            pixel_data_16(gray16.clone()),
        ),
        image_file(
            DEFLATED_LE,
            &PixelSpec::gray(8, 8, 8, 8, false),
            vec![],
            pixel_data_8(gray8.clone()),
        ),
        image_file(
            RLE,
            &PixelSpec::gray(8, 8, 16, 16, false),
            vec![],
            pixel_data_encapsulated(vec![rle_frame(&le16(&gray16), 1, 2)]),
        ),
        image_file(
            RLE,
            &PixelSpec::rgb8(4, 4),
            vec![],
            pixel_data_encapsulated(vec![rle_frame(&gray8[..48], 3, 1)]),
        ),
        image_file(
            JPEG_BASELINE,
            &PixelSpec::gray(8, 8, 8, 8, false),
            vec![],
            pixel_data_encapsulated(vec![jpeg]),
        ),
        image_file(EXPLICIT_LE, &PixelSpec::rgb8(4, 4), vec![], pixel_data_8(gray8[..48].to_vec())),
        image_file(
            "1.2.840.10008.1.2.4.90",
            &PixelSpec::gray(12, 16, 8, 8, false),
            vec![],
            pixel_data_encapsulated(vec![test_data("gray8-lossless.j2k")]),
        ),
        image_file(
            "1.2.840.10008.1.2.4.91",
            &PixelSpec { photometric: "YBR_ICT", ..PixelSpec::rgb8(12, 16) },
            vec![],
            pixel_data_encapsulated(vec![test_data("rgb8-ict-lossy.j2k")]),
        ),
        image_file(
            "1.2.840.10008.1.2.4.201",
            &PixelSpec::gray(12, 16, 16, 12, false),
            vec![],
            pixel_data_encapsulated(vec![test_data("gray12-htj2k-lossless.j2c")]),
        ),
        image_file(
            "1.2.840.10008.1.2.4.201",
            &PixelSpec { photometric: "YBR_RCT", ..PixelSpec::rgb8(12, 16) },
            vec![],
            pixel_data_encapsulated(vec![test_data("rgb8-htj2k-lossless.j2c")]),
        ),
        image_file(
            "1.2.840.10008.1.2.4.80",
            &PixelSpec::gray(8, 8, 8, 8, false),
            vec![],
            pixel_data_encapsulated(vec![jpeg_ls_gray8(&gray8, 8, 8)]),
        ),
        image_file(
            EXPLICIT_LE,
            &PixelSpec { frames: Some(2), ..PixelSpec::gray(4, 4, 8, 8, false) },
            vec![],
            pixel_data_8(gray8[..32].to_vec()),
        ),
        image_file(
            EXPLICIT_LE,
            &PixelSpec { frames: Some(3), ..PixelSpec::gray(3, 5, 1, 1, false) },
            vec![],
            pixel_data_8(vec![0xA5, 0x5A, 0xFF, 0x00, 0x81, 0x42]),
        ),
        image_file(
            EXPLICIT_LE,
            &PixelSpec::gray(2, 4, 32, 32, true),
            vec![],
            pixel_data_8((0..32).map(|i| (i * 37) as u8).collect()),
        ),
        image_file(
            EXPLICIT_LE,
            &PixelSpec { photometric: "PALETTE COLOR", ..PixelSpec::gray(4, 4, 8, 8, false) },
            palette_elements(),
            pixel_data_8(gray8[..16].to_vec()),
        ),
        image_file(
            EXPLICIT_LE,
            &PixelSpec { photometric: "YBR_FULL_422", ..PixelSpec::rgb8(2, 4) },
            vec![],
            pixel_data_8(gray8[..16].to_vec()),
        ),
    ]
}

/// A file from `tests/data`.
pub fn test_data(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A lossless JPEG-LS stream of 8-bit gray samples, made by CharLS.
pub fn jpeg_ls_gray8(samples: &[u8], w: u32, h: u32) -> Vec<u8> {
    let info = charls::FrameInfo { width: w, height: h, bits_per_sample: 8, component_count: 1 };
    charls::CharLS::default().encode(info, 0, &samples[..(w * h) as usize]).unwrap()
}

/// PALETTE COLOR tables of 4 entries of 8 bits, from value 0.
pub fn palette_elements() -> Vec<Elem> {
    let table = |d, t, v: [u16; 4]| {
        [
            DataElement::new(d, VR::US, PrimitiveValue::U16([4u16, 0, 8].into_iter().collect())),
            DataElement::new(t, VR::OW, PrimitiveValue::U16(v.into_iter().collect())),
        ]
    };
    let mut v = Vec::new();
    v.extend(table(
        tags::RED_PALETTE_COLOR_LOOKUP_TABLE_DESCRIPTOR,
        tags::RED_PALETTE_COLOR_LOOKUP_TABLE_DATA,
        [0, 80, 160, 255],
    ));
    v.extend(table(
        tags::GREEN_PALETTE_COLOR_LOOKUP_TABLE_DESCRIPTOR,
        tags::GREEN_PALETTE_COLOR_LOOKUP_TABLE_DATA,
        [255, 160, 80, 0],
    ));
    v.extend(table(
        tags::BLUE_PALETTE_COLOR_LOOKUP_TABLE_DESCRIPTOR,
        tags::BLUE_PALETTE_COLOR_LOOKUP_TABLE_DATA,
        [9, 9, 9, 9],
    ));
    v
}
