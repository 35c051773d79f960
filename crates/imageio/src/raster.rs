//! PNG, JPEG, TIFF, GIF and PNM through the `image` crate (only those codecs compiled in).
//!
//! Decoding reads the header first and checks [`Limits`] before the pixel buffer exists; the
//! `image` crate's own limits (`max_alloc` = [`Limits::max_bytes`]) guard its intermediate
//! buffers. Decoded layouts: gray and gray+alpha become gray / RGBA, 32-bit float TIFF becomes
//! 16-bit, everything else keeps its 8- or 16-bit samples.
//!
//! Files of several frames are multi-frame images as a DICOM cine is ([`Decoded::frames`],
//! `number_of_frames`, up to [`Limits::max_frames_decoded`] decoded): an animated GIF's frames
//! as a player shows them (each drawn over the last as the file says), and a TIFF's pages of
//! the first page's size and layout (unsigned gray or RGB(A), 8 or 16 bits, interleaved) — a
//! page of another size (a pyramid's reduced resolutions, a thumbnail) or layout ends them, and
//! is not counted. Frames are counted up to [`Limits::max_frames`] (more is refused) and decoded
//! while [`Limits::max_frames_decoded`] and [`Limits::max_bytes`] leave room; a frame after the
//! first that fails to decode ends them, keeping those before it.
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
    let (frames, count) = match format {
        Format::Gif => gif_frames(bytes, &image, limits)?,
        Format::Tiff => tiff_pages(bytes, &image, limits)?,
        _ => (Vec::new(), 1),
    };
    let channels = u16::from(original.channel_count()).max(1);
    let gray = image.channels() == 1;
    let meta = ImageMeta {
        width,
        height,
        pixel_kind: image.kind().name().to_string(),
        bits_stored: original.bits_per_pixel() / channels,
        signed: false,
        photometric_interpretation: if gray { "MONOCHROME2" } else { "RGB" }.to_string(),
        number_of_frames: count,
        frames_decoded: frames.len() as u32 + 1,
        ..ImageMeta::default()
    };
    Ok(Decoded { image, frames, format, meta })
}

/// What a multi-frame file gives after its first frame: the frames decoded, and how many it
/// has (the first included).
type MoreFrames = (Vec<DynImage>, u32);

/// How many frames after `first` may be decoded: while fewer than `max_frames_decoded` are,
/// and all of them fit `max_bytes` (the rest are counted, not decoded, as `frames_decoded`
/// says).
fn frame_room(limits: &Limits, first: &DynImage) -> usize {
    let bytes = if matches!(first, DynImage::U16(_)) { 2 } else { 1 };
    let frame = (first.width() * first.height() * first.channels() * bytes).max(1) as u64;
    let by_bytes = limits.max_bytes / frame; // frames that fit, the first among them
    let frames = limits.max_frames_decoded.max(1).min(by_bytes);
    usize::try_from(frames.saturating_sub(1)).unwrap_or(usize::MAX)
}

/// A frame count past `max_frames` is refused (as a DICOM file's is), before any is decoded.
fn count_frame(count: &mut u64, limits: &Limits) -> Result<(), ImageIoError> {
    *count += 1;
    let most = limits.max_frames.min(u64::from(u32::MAX));
    if *count > most {
        return Err(ImageIoError::too_many_frames(*count as i64, limits.max_frames));
    }
    Ok(())
}

/// An animated GIF's frames after the first, each the whole picture as a player shows it.
/// Counted first without decoding (LZW skipped); then decoded while there is room — by
/// [`frame_room`], and while the frames' own declared sizes (what decoding each takes, however
/// small the picture) add up to no more than `max_bytes`. A frame that fails to decode (a file cut
/// in its last frame, as browsers still show) ends them and the count: what came whole before
/// it is kept.
fn gif_frames(bytes: &[u8], first: &DynImage, limits: &Limits) -> Result<MoreFrames, ImageIoError> {
    use image::AnimationDecoder;
    let mut options = gif::DecodeOptions::new();
    options.skip_frame_decoding(true);
    let (mut count, mut work, mut fits) = (0, 0u64, 0usize);
    if let Ok(mut d) = options.read_info(Cursor::new(bytes)) {
        while let Ok(Some(f)) = d.next_frame_info() {
            count_frame(&mut count, limits)?;
            let drawn = u64::from(f.width) * u64::from(f.height) * 4;
            work = work.saturating_add(drawn);
            if count > 1 && work <= limits.max_bytes && fits == count as usize - 2 {
                fits += 1;
            }
        }
    }
    let room = frame_room(limits, first).min(fits);
    let mut frames = Vec::new();
    if room > 0 {
        let fail = |e| map_decode_error(Format::Gif, e, limits);
        let mut decoder = image::codecs::gif::GifDecoder::new(Cursor::new(bytes)).map_err(fail)?;
        let mut image_limits = image::Limits::default();
        image_limits.max_alloc = Some(limits.max_bytes);
        decoder.set_limits(image_limits).map_err(fail)?;
        // Frame 0 is `first` (decoded again here: the frames after it are drawn over it).
        for frame in decoder.into_frames().skip(1).take(room) {
            let Ok(frame) = frame else {
                count = frames.len() as u64 + 1; // it, and what follows, are not frames
                break;
            };
            frames.push(from_dynamic(DynamicImage::ImageRgba8(frame.into_buffer()), Format::Gif)?);
        }
    }
    Ok((frames, count.max(1) as u32))
}

/// A TIFF page's layout as this module reads pages after the first: channels and bits per
/// sample of an unsigned gray, RGB or RGBA page stored interleaved (chunky); `None` for any
/// other (palette, float, planar, CMYK, …).
fn page_kind<R: std::io::Read + std::io::Seek>(
    d: &mut tiff::decoder::Decoder<R>,
) -> Option<(usize, u8)> {
    use tiff::ColorType as C;
    use tiff::tags::Tag;
    let (channels, bits) = match d.colortype().ok()? {
        C::Gray(b @ (8 | 16)) => (1, b),
        C::RGB(b @ (8 | 16)) => (3, b),
        C::RGBA(b @ (8 | 16)) => (4, b),
        _ => return None,
    };
    let unsigned = match d.find_tag_unsigned_vec::<u16>(Tag::SampleFormat).ok()? {
        None => true,
        Some(formats) => formats.iter().all(|&f| f == 1),
    };
    let chunky = d.find_tag_unsigned::<u16>(Tag::PlanarConfiguration).ok()?.is_none_or(|p| p == 1);
    (unsigned && chunky).then_some((channels, bits))
}

/// A TIFF's pages after the first that are frames of it: of the first page's size and layout
/// ([`page_kind`]). A page of another size or layout (a pyramid's reduced resolution, a
/// thumbnail), one that cannot be read when decoded, or one whose chunk table would make the
/// pages' tables together larger than the file (as no real file's are: a hostile one could
/// point many pages at one huge table) ends them and is not counted; pages are counted up to
/// `max_frames` and decoded while there is room ([`frame_room`]).
fn tiff_pages(bytes: &[u8], first: &DynImage, limits: &Limits) -> Result<MoreFrames, ImageIoError> {
    use tiff::decoder::{Decoder, DecodingResult};
    let mut tiff_limits = tiff::decoder::Limits::default();
    let cap = usize::try_from(limits.max_bytes).unwrap_or(usize::MAX);
    tiff_limits.decoding_buffer_size = tiff_limits.decoding_buffer_size.min(cap);
    tiff_limits.intermediate_buffer_size = tiff_limits.intermediate_buffer_size.min(cap);
    // The `image` crate read the first page; one this module reads otherwise has no frames.
    let Ok(decoder) = Decoder::new(Cursor::new(bytes)) else { return Ok((Vec::new(), 1)) };
    let mut decoder = decoder.with_limits(tiff_limits);
    let (w, h) = (first.width(), first.height());
    let kind = page_kind(&mut decoder);
    let bits = if matches!(first, DynImage::U16(_)) { 16 } else { 8 };
    if kind != Some((first.channels(), bits)) {
        return Ok((Vec::new(), 1));
    }
    // Each chunk (strip or tile) has an offset and a length in the file: 8 bytes at least.
    let table = |d: &mut Decoder<Cursor<&[u8]>>| {
        let chunks = match d.get_chunk_type() {
            tiff::decoder::ChunkType::Strip => d.strip_count(),
            tiff::decoder::ChunkType::Tile => d.tile_count(),
        };
        chunks.map_or(u64::MAX, |n| u64::from(n) * 8)
    };
    let mut tables = table(&mut decoder);
    let (room, mut count, mut frames) = (frame_room(limits, first), 0, Vec::new());
    count_frame(&mut count, limits)?;
    while decoder.more_images() && decoder.next_image().is_ok() {
        let size = decoder.dimensions().ok().map(|(pw, ph)| (pw as usize, ph as usize));
        if size != Some((w, h)) || page_kind(&mut decoder) != kind {
            break;
        }
        tables = tables.saturating_add(table(&mut decoder));
        if tables > bytes.len() as u64 {
            break;
        }
        if frames.len() < room {
            let page = match decoder.read_image() {
                Ok(DecodingResult::U8(data)) => {
                    Image::from_vec(w, h, first.channels(), data).map(DynImage::U8).ok()
                }
                Ok(DecodingResult::U16(data)) => {
                    Image::from_vec(w, h, first.channels(), data).map(DynImage::U16).ok()
                }
                _ => None,
            };
            let Some(page) = page else { break };
            frames.push(page);
        }
        count_frame(&mut count, limits)?;
    }
    Ok((frames, count as u32))
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
