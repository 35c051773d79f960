//! PNG, JPEG, TIFF, GIF and PNM through the `image` crate (only those codecs compiled in).
//!
//! Decoding reads the header first and checks [`Limits`] before the pixel buffer exists; the
//! `image` crate's own limits (`max_alloc` = [`Limits::max_bytes`]) guard its intermediate
//! buffers. Decoded layouts: gray and gray+alpha become gray / RGBA, 32-bit float TIFF becomes
//! 16-bit, everything else keeps its 8- or 16-bit samples. Only the first frame of an animated
//! GIF or the first page of a TIFF is read.
//!
//! Encoding support (anything else is [`ImageIoError::Unsupported`]):
//!
//! | format | gray8 | gray16 | rgb8 | rgb16 | rgba8 | rgba16 |
//! |---|---|---|---|---|---|---|
//! | PNG  | ✓ | ✓ | ✓ | ✓ | ✓ | ✓ |
//! | TIFF | ✓ | ✓ | ✓ | ✓ | ✓ | ✓ |
//! | PNM  | PGM P5 | PGM P5 | PPM P6 | PPM P6 | – | – |
//! | JPEG | ✓ | – | ✓ | – | – | – |
//! | GIF  | ✓ (as RGB) | – | ✓ | – | ✓ | – |
//!
//! JPEG is written at quality [`JPEG_QUALITY`]; GIF keeps images of up to 256 colours exactly
//! and quantises others. PNM is written by this module (binary P5/P6, 16-bit samples big-endian
//! as the format requires) so that 16-bit PPM stays PPM rather than becoming PAM.

use std::io::Cursor;

use bs_imaging::{DynImage, Image};
use image::{
    DynamicImage, ExtendedColorType, ImageBuffer, ImageDecoder, ImageError, ImageReader, Luma, Rgb,
    Rgba,
};

use crate::error::ImageIoError;
use crate::format::Format;
use crate::meta::{Decoded, ImageMeta, Limits};

/// JPEG quality used by [`encode`](crate::encode).
pub const JPEG_QUALITY: u8 = 90;

/// Decode `bytes` of a raster `format` (not DICOM).
pub(crate) fn decode(
    bytes: &[u8],
    format: Format,
    limits: &Limits,
) -> Result<Decoded, ImageIoError> {
    let Some(image_format) = format.to_image_format() else {
        return Err(ImageIoError::unsupported_format(format!("{format} is not a raster format")));
    };
    if format == Format::Jpeg && !jpeg_is_complete(bytes) {
        return Err(ImageIoError::truncated(format, "no end-of-image marker after the scan"));
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), image_format);
    let mut image_limits = image::Limits::default();
    image_limits.max_alloc = Some(limits.max_bytes);
    reader.limits(image_limits);
    let decoder = reader.into_decoder().map_err(|e| map_decode_error(format, e, limits))?;
    let (width, height) = decoder.dimensions();
    let color = decoder.color_type();
    limits.check(u64::from(width), u64::from(height), u64::from(color.bytes_per_pixel()))?;
    let original = decoder.original_color_type();
    let image =
        DynamicImage::from_decoder(decoder).map_err(|e| map_decode_error(format, e, limits))?;
    let image = from_dynamic(image, format)?;
    let channels = u16::from(original.channel_count()).max(1);
    let gray = image.channels() == 1;
    let meta = ImageMeta {
        width,
        height,
        pixel_kind: image.kind().name().to_string(),
        bits_stored: original.bits_per_pixel() / channels,
        signed: false,
        photometric_interpretation: if gray { "MONOCHROME2" } else { "RGB" }.to_string(),
        number_of_frames: 1,
        frames_decoded: 1,
        ..ImageMeta::default()
    };
    Ok(Decoded { image, frames: Vec::new(), format, meta })
}

/// The `image` crate's pixels as ours.
fn from_dynamic(image: DynamicImage, format: Format) -> Result<DynImage, ImageIoError> {
    let (w, h) = (image.width() as usize, image.height() as usize);
    let wrap8 = |c: usize, data: Vec<u8>| {
        Image::from_vec(w, h, c, data)
            .map(DynImage::U8)
            .map_err(|e| ImageIoError::corrupt(format, e.to_string()))
    };
    let wrap16 = |c: usize, data: Vec<u16>| {
        Image::from_vec(w, h, c, data)
            .map(DynImage::U16)
            .map_err(|e| ImageIoError::corrupt(format, e.to_string()))
    };
    match image {
        DynamicImage::ImageLuma8(b) => wrap8(1, b.into_raw()),
        DynamicImage::ImageRgb8(b) => wrap8(3, b.into_raw()),
        DynamicImage::ImageRgba8(b) => wrap8(4, b.into_raw()),
        DynamicImage::ImageLumaA8(_) => wrap8(4, image.to_rgba8().into_raw()),
        DynamicImage::ImageLuma16(b) => wrap16(1, b.into_raw()),
        DynamicImage::ImageRgb16(b) => wrap16(3, b.into_raw()),
        DynamicImage::ImageRgba16(b) => wrap16(4, b.into_raw()),
        DynamicImage::ImageLumaA16(_) => wrap16(4, image.to_rgba16().into_raw()),
        DynamicImage::ImageRgb32F(_) => wrap16(3, image.to_rgb16().into_raw()),
        other => wrap16(4, other.to_rgba16().into_raw()),
    }
}

/// Whether a JPEG stream has an end-of-image marker after its first scan. The decoder fills a
/// cut image in with grey and reports success; this finds the cut. Marker segments before the
/// scan are skipped by their lengths (so a thumbnail's EOI inside EXIF does not count); inside
/// entropy-coded data 0xFF is always followed by 0x00 or a restart marker, so 0xFF 0xD9 there
/// is the real end.
fn jpeg_is_complete(bytes: &[u8]) -> bool {
    let mut i = 2;
    loop {
        while bytes.get(i) == Some(&0xFF) && bytes.get(i + 1) == Some(&0xFF) {
            i += 1;
        }
        let (Some(&0xFF), Some(&marker)) = (bytes.get(i), bytes.get(i + 1)) else {
            // Not a marker where one must be: let the decoder report it.
            return true;
        };
        i += 2;
        if matches!(marker, 0x01 | 0xD0..=0xD7) {
            continue;
        }
        if marker == 0xD9 {
            return true;
        }
        let Some(len) = bytes.get(i..i + 2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
        else {
            return false;
        };
        i += len;
        if marker == 0xDA {
            return bytes.get(i..).is_some_and(|rest| rest.windows(2).any(|w| w == [0xFF, 0xD9]));
        }
    }
}

/// Whether an error (or any error it wraps) is an unexpected end of input.
fn is_eof(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::UnexpectedEof
        {
            return true;
        }
        let text = err.to_string().to_ascii_lowercase();
        if text.contains("unexpected end")
            || text.contains("end of file")
            || text.contains("eof")
            || text.contains("truncated")
            || text.contains("not enough data")
        {
            return true;
        }
        cur = err.source();
    }
    false
}

fn map_decode_error(format: Format, e: ImageError, limits: &Limits) -> ImageIoError {
    let reason = e.to_string();
    match &e {
        ImageError::Limits(_) => ImageIoError::too_many_bytes(
            format!("memory the {format} decoder needs ({reason})"),
            limits.max_bytes,
        ),
        ImageError::Unsupported(_) => ImageIoError::unsupported(format, reason),
        _ if is_eof(&e) => ImageIoError::truncated(format, reason),
        _ => ImageIoError::corrupt(format, reason),
    }
}

fn map_encode_error(format: Format, e: ImageError) -> ImageIoError {
    match e {
        ImageError::IoError(source) => {
            ImageIoError::Io { file: crate::error::NO_FILE.into(), source }
        }
        other => ImageIoError::unsupported(format, other.to_string()),
    }
}

/// Our pixels as the `image` crate's (a copy).
fn to_dynamic(img: &DynImage) -> Option<DynamicImage> {
    let (w, h) = (u32::try_from(img.width()).ok()?, u32::try_from(img.height()).ok()?);
    Some(match img {
        DynImage::U8(i) => match i.channels {
            1 => DynamicImage::ImageLuma8(ImageBuffer::<Luma<u8>, _>::from_raw(
                w,
                h,
                i.data.clone(),
            )?),
            3 => {
                DynamicImage::ImageRgb8(ImageBuffer::<Rgb<u8>, _>::from_raw(w, h, i.data.clone())?)
            }
            4 => DynamicImage::ImageRgba8(ImageBuffer::<Rgba<u8>, _>::from_raw(
                w,
                h,
                i.data.clone(),
            )?),
            _ => return None,
        },
        DynImage::U16(i) => match i.channels {
            1 => DynamicImage::ImageLuma16(ImageBuffer::<Luma<u16>, _>::from_raw(
                w,
                h,
                i.data.clone(),
            )?),
            3 => DynamicImage::ImageRgb16(ImageBuffer::<Rgb<u16>, _>::from_raw(
                w,
                h,
                i.data.clone(),
            )?),
            4 => DynamicImage::ImageRgba16(ImageBuffer::<Rgba<u16>, _>::from_raw(
                w,
                h,
                i.data.clone(),
            )?),
            _ => return None,
        },
    })
}

/// Encode `img` as `format` (see the module table for what each format takes).
pub(crate) fn encode(img: &DynImage, format: Format) -> Result<Vec<u8>, ImageIoError> {
    let kind = img.kind();
    let refuse =
        |why: &str| Err(ImageIoError::unsupported(format, format!("{kind} pixels: {why}")));
    if img.width() == 0 || img.height() == 0 {
        return refuse("an image needs at least one pixel");
    }
    if format == Format::Pnm {
        return encode_pnm(img);
    }
    let Some(dynamic) = to_dynamic(img) else {
        return refuse("the pixel buffer does not match its dimensions");
    };
    let mut out = Vec::new();
    let result = match format {
        Format::Png => dynamic.write_with_encoder(image::codecs::png::PngEncoder::new(&mut out)),
        Format::Tiff => {
            let mut cursor = Cursor::new(&mut out);
            dynamic.write_with_encoder(image::codecs::tiff::TiffEncoder::new(&mut cursor))
        }
        Format::Jpeg => {
            if !matches!(img, DynImage::U8(i) if i.channels != 4) {
                return refuse("JPEG holds 8-bit gray or RGB only");
            }
            dynamic.write_with_encoder(image::codecs::jpeg::JpegEncoder::new_with_quality(
                &mut out,
                JPEG_QUALITY,
            ))
        }
        Format::Gif => {
            let DynImage::U8(i) = img else {
                return refuse("GIF holds 8-bit samples only");
            };
            let (data, color) = match i.channels {
                1 => (i.data.iter().flat_map(|&v| [v, v, v]).collect(), ExtendedColorType::Rgb8),
                3 => (i.data.clone(), ExtendedColorType::Rgb8),
                _ => (i.data.clone(), ExtendedColorType::Rgba8),
            };
            let (w, h) = (dynamic.width(), dynamic.height());
            if w > u32::from(u16::MAX) || h > u32::from(u16::MAX) {
                return refuse("GIF images are at most 65535 pixels on a side");
            }
            let mut encoder = image::codecs::gif::GifEncoder::new(&mut out);
            encoder.encode(&data, w, h, color)
        }
        Format::Pnm | Format::Dicom => {
            return Err(ImageIoError::unsupported_format(format!("{format} cannot be written")));
        }
    };
    result.map_err(|e| map_encode_error(format, e))?;
    Ok(out)
}

/// Binary PGM (P5) for gray, PPM (P6) for RGB; 16-bit samples big-endian with maxval 65535.
fn encode_pnm(img: &DynImage) -> Result<Vec<u8>, ImageIoError> {
    let magic = match img.channels() {
        1 => "P5",
        3 => "P6",
        _ => {
            return Err(ImageIoError::unsupported(
                Format::Pnm,
                format!("{} pixels: PGM/PPM hold gray or RGB without alpha", img.kind()),
            ));
        }
    };
    let (w, h) = (img.width(), img.height());
    let mut out = Vec::new();
    match img {
        DynImage::U8(i) => {
            out.extend_from_slice(format!("{magic}\n{w} {h}\n255\n").as_bytes());
            out.extend_from_slice(&i.data);
        }
        DynImage::U16(i) => {
            out.extend_from_slice(format!("{magic}\n{w} {h}\n65535\n").as_bytes());
            out.reserve(i.data.len() * 2);
            for v in &i.data {
                out.extend_from_slice(&v.to_be_bytes());
            }
        }
    }
    Ok(out)
}
