//! A structural pre-scan of a DICOM Part 10 file, run before dicom-object parses it.
//!
//! dicom-rs allocates (and zero-fills) a buffer of whatever length an element header declares
//! before it reads the value, so a 200-byte file claiming a 4 GB element would make it commit
//! 4 GB of memory. This scan walks the same element structure the dicom-parser reader walks
//! (file meta group, then the data set in the file's transfer syntax, through sequences, items
//! and encapsulated pixel fragments), using dicom-encoding's own header decoders, and refuses
//! the file when any declared length is longer than the bytes that remain. After it passes,
//! every allocation the parser makes is bounded by the input size, which
//! [`Limits::max_bytes`](crate::Limits::max_bytes) bounds in turn.
//!
//! For the Deflated Explicit VR Little Endian syntax the data set is inflated here, stopping at
//! `max_bytes` (a deflate bomb is refused), and the inflated bytes are walked.

use std::io::{Cursor, Read};

use dicom_core::dictionary::{DataDictionary, VirtualVr};
use dicom_core::header::{DataElementHeader, HasLength, Header, Length, SequenceItemHeader};
use dicom_core::{Tag, VR};
use dicom_dictionary_std::StandardDataDictionary;
use dicom_encoding::Endianness;
use dicom_encoding::decode::explicit_le::ExplicitVRLittleEndianDecoder;
use dicom_encoding::decode::{Decode, DecodeFrom};
use dicom_encoding::transfer_syntax::TransferSyntax;

use crate::error::ImageIoError;
use crate::format::Format;

const DICOM: Format = Format::Dicom;
const TRANSFER_SYNTAX_UID: Tag = Tag(0x0002, 0x0010);
const PIXEL_DATA: Tag = Tag(0x7FE0, 0x0010);
const PIXEL_REPRESENTATION: Tag = Tag(0x0028, 0x0103);
const ITEM: Tag = Tag(0xFFFE, 0xE000);
const ITEM_DELIMITER: Tag = Tag(0xFFFE, 0xE00D);
/// Nesting deeper than this is refused (the parser recurses per level).
const MAX_DEPTH: usize = 64;

/// The file meta group of a Part 10 file.
#[derive(Debug)]
pub(crate) struct MetaInfo {
    /// Transfer Syntax UID, trimmed of padding.
    pub ts_uid: String,
    /// Offset of the data set in the bytes given to [`scan_meta`].
    pub dataset_offset: usize,
}

/// Walk the file meta group of `body`, which starts with the "DICM" magic.
pub(crate) fn scan_meta(body: &[u8]) -> Result<MetaInfo, ImageIoError> {
    if body.get(..4) != Some(b"DICM") {
        return Err(ImageIoError::corrupt(DICOM, "no DICM magic code"));
    }
    let decoder = ExplicitVRLittleEndianDecoder::default();
    let decode = |src: &mut HeaderBytes| Decode::decode_header(&decoder, src);
    let mut pos = 4;
    let (header, n) = header_at(decode, body, pos, "file meta group length")?;
    pos += n;
    if header.tag() != Tag(0x0002, 0x0000) || header.length() != Length(4) {
        return Err(ImageIoError::corrupt(
            DICOM,
            format!("file meta group starts with {} instead of its group length", header.tag()),
        ));
    }
    let group_length = le_u32(body, pos)
        .ok_or_else(|| ImageIoError::truncated(DICOM, "file meta group length cut short"))?;
    pos += 4;
    let mut read: u64 = 0;
    let mut ts_uid = None;
    while read < u64::from(group_length) {
        let (header, n) = header_at(decode, body, pos, "file meta group")?;
        pos += n;
        let Some(len) = header.length().get() else {
            return Err(ImageIoError::corrupt(
                DICOM,
                format!("file meta element {} has undefined length", header.tag()),
            ));
        };
        let value = take(body, pos, len, header.tag())?;
        if header.tag() == TRANSFER_SYNTAX_UID {
            let text = String::from_utf8_lossy(value);
            ts_uid = Some(text.trim_end_matches(['\0', ' ']).trim().to_string());
        }
        pos += value.len();
        read = read.saturating_add(n as u64).saturating_add(u64::from(len));
    }
    let ts_uid = ts_uid.filter(|s| !s.is_empty()).ok_or_else(|| {
        ImageIoError::corrupt(DICOM, "file meta group has no Transfer Syntax UID")
    })?;
    Ok(MetaInfo { ts_uid, dataset_offset: pos })
}

/// Inflate a deflated data set, refusing more than `max_bytes` of output.
pub(crate) fn inflate(data: &[u8], max_bytes: u64, what: &str) -> Result<Vec<u8>, ImageIoError> {
    let mut out = Vec::new();
    let decoder = flate2::read::DeflateDecoder::new(data);
    match decoder.take(max_bytes.saturating_add(1)).read_to_end(&mut out) {
        Ok(_) if out.len() as u64 > max_bytes => {
            Err(ImageIoError::too_many_bytes(format!("inflated {what}"), max_bytes))
        }
        Ok(_) => Ok(out),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(ImageIoError::truncated(DICOM, format!("deflated {what}: {e}")))
        }
        Err(e) => Err(ImageIoError::corrupt(DICOM, format!("deflated {what}: {e}"))),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Sequence,
    Item,
}

#[derive(Debug, Clone, Copy)]
struct Open {
    kind: Kind,
    /// Inside encapsulated pixel data.
    pixel: bool,
    /// Offset where a defined-length sequence or item ends.
    end: Option<usize>,
}

/// Walk a data set (not deflated) encoded in `ts`, mirroring dicom-parser's `DataSetReader`.
/// Returns where the value of a top-level, defined-length Pixel Data element lies in `data`
/// (native pixels a caller may then take straight from the input, without the parser's copy).
pub(crate) fn scan_dataset(
    data: &[u8],
    ts: &TransferSyntax,
) -> Result<Option<std::ops::Range<usize>>, ImageIoError> {
    let Some(decoder) = ts.decoder_for::<HeaderBytes>() else {
        return Err(ImageIoError::UnsupportedTransferSyntax {
            file: crate::error::NO_FILE.into(),
            uid: ts.uid().to_string(),
            name: ts.name().to_string(),
        });
    };
    let mut stack: Vec<Open> = Vec::new();
    let mut in_sequence = false;
    let mut signed_pixels = false;
    let mut pixels = None;
    let mut pos = 0usize;
    loop {
        // Close defined-length sequences and items that end here.
        while let Some(top) = stack.last() {
            match top.end {
                Some(end) if end == pos => {
                    in_sequence = top.kind == Kind::Item;
                    stack.pop();
                }
                Some(end) if end < pos => {
                    return Err(ImageIoError::corrupt(
                        DICOM,
                        format!(
                            "a sequence or item ending at byte {end} overlaps the next element"
                        ),
                    ));
                }
                _ => break,
            }
        }
        if stack.len() > MAX_DEPTH {
            return Err(ImageIoError::corrupt(DICOM, "sequences nested too deeply"));
        }
        if pos >= data.len() {
            // End of data; whatever is still open the parser reports itself.
            return Ok(pixels);
        }
        if in_sequence {
            let Some(item) = item_header_at(&*decoder, data, pos)? else {
                // The parser treats a cut inside pixel fragments as the end of the object.
                return Ok(pixels);
            };
            pos += 8;
            match item {
                SequenceItemHeader::Item { len } => {
                    let Some(top) = stack.last().copied() else {
                        return Err(ImageIoError::corrupt(DICOM, "item outside a sequence"));
                    };
                    let end = defined_end(data, pos, len.0, ITEM, top.pixel)?;
                    stack.push(Open { kind: Kind::Item, pixel: top.pixel, end });
                    in_sequence = false;
                }
                SequenceItemHeader::ItemDelimiter => {
                    stack.pop();
                    in_sequence = true;
                }
                SequenceItemHeader::SequenceDelimiter => {
                    stack.pop();
                    in_sequence = false;
                }
            }
        } else if let Some(Open { kind: Kind::Item, pixel: true, end }) = stack.last().copied() {
            // A pixel data fragment: raw bytes up to the item's end.
            let Some(end) = end else {
                return Err(ImageIoError::corrupt(
                    DICOM,
                    "pixel data fragment of undefined length",
                ));
            };
            pos = end;
        } else {
            let decode = |src: &mut HeaderBytes| decoder.decode_header(src);
            let (header, n) = header_at(decode, data, pos, "data set")?;
            pos += n;
            let tag = header.tag();
            let len = header.length();
            // dicom-parser reads "US or SS" attributes as SS once Pixel Representation says
            // the pixels are signed.
            let vr = if signed_pixels && is_us_or_ss(tag) { VR::SS } else { header.vr() };
            if vr == VR::SQ {
                let end = defined_end(data, pos, len.0, tag, false)?;
                stack.push(Open { kind: Kind::Sequence, pixel: false, end });
                in_sequence = true;
            } else if tag == ITEM_DELIMITER {
                if !stack.is_empty() {
                    stack.pop();
                    in_sequence = true;
                }
            } else if tag == PIXEL_DATA && len.is_undefined() {
                stack.push(Open { kind: Kind::Sequence, pixel: true, end: None });
                let Some(item) = item_header_at(&*decoder, data, pos)? else {
                    return Ok(pixels);
                };
                pos += 8;
                match item {
                    SequenceItemHeader::Item { len } => {
                        // The basic offset table is read as 32-bit values; dicom-parser loses
                        // step (and fails) on other lengths.
                        if len.0 != u32::MAX && len.0 % 4 != 0 {
                            return Err(ImageIoError::corrupt(
                                DICOM,
                                format!("basic offset table of {} bytes", len.0),
                            ));
                        }
                        let end = defined_end(data, pos, len.0, ITEM, true)?;
                        stack.push(Open { kind: Kind::Item, pixel: true, end });
                    }
                    SequenceItemHeader::SequenceDelimiter => {
                        stack.pop();
                    }
                    SequenceItemHeader::ItemDelimiter => {
                        return Err(ImageIoError::corrupt(
                            DICOM,
                            "encapsulated pixel data starts with an item delimiter",
                        ));
                    }
                }
            } else if len.is_undefined() {
                // dicom-parser reads other undefined-length elements as sequences.
                stack.push(Open { kind: Kind::Sequence, pixel: false, end: None });
                in_sequence = true;
            } else {
                // dicom-parser reads whole numbers of fixed-size values but counts the
                // declared length, so a length that is not a multiple of the value size puts
                // it out of step with the bytes: refuse that here.
                let unit = value_size(vr);
                if len.0 % unit != 0 {
                    return Err(ImageIoError::corrupt(
                        DICOM,
                        format!(
                            "element {tag} of VR {vr:?} has length {}, not a multiple of {unit}",
                            len.0
                        ),
                    ));
                }
                let value = take(data, pos, len.0, tag)?;
                if tag == PIXEL_REPRESENTATION && matches!(vr, VR::US | VR::OW) && value.len() >= 2
                {
                    let b = [value[0], value[1]];
                    let v = match ts.endianness() {
                        Endianness::Little => u16::from_le_bytes(b),
                        Endianness::Big => u16::from_be_bytes(b),
                    };
                    signed_pixels = v != 0;
                }
                if tag == PIXEL_DATA && stack.is_empty() {
                    pixels = Some(pos..pos + value.len());
                }
                pos += value.len();
            }
        }
    }
}

/// Bytes per value that dicom-parser reads for a VR (1 for text and bytes).
fn value_size(vr: VR) -> u32 {
    match vr {
        VR::US | VR::SS | VR::OW => 2,
        VR::AT | VR::UL | VR::OL | VR::SL | VR::FL | VR::OF => 4,
        VR::FD | VR::OD | VR::SV | VR::UV | VR::OV => 8,
        _ => 1,
    }
}

/// Whether the standard dictionary gives `tag` the VR "US or SS".
fn is_us_or_ss(tag: Tag) -> bool {
    StandardDataDictionary.by_tag(tag).map(|e| e.vr) == Some(VirtualVr::Xs)
}

/// Where a sequence or item of length `len` starting at `pos` ends (`None`: undefined length).
fn defined_end(
    data: &[u8],
    pos: usize,
    len: u32,
    tag: Tag,
    pixel: bool,
) -> Result<Option<usize>, ImageIoError> {
    if len == u32::MAX {
        if pixel {
            return Err(ImageIoError::corrupt(DICOM, "pixel data fragment of undefined length"));
        }
        return Ok(None);
    }
    Ok(Some(pos + take(data, pos, len, tag)?.len()))
}

/// The `len` bytes at `pos`, or an error naming `tag` when fewer remain.
fn take(data: &[u8], pos: usize, len: u32, tag: Tag) -> Result<&[u8], ImageIoError> {
    let remaining = data.len().saturating_sub(pos);
    if len as usize > remaining {
        return Err(ImageIoError::truncated(
            DICOM,
            format!("element {tag} declares {len} bytes but only {remaining} remain"),
        ));
    }
    Ok(&data[pos..pos + len as usize])
}

/// The (at most) 12 bytes at `pos`, zero-padded, for a header decoder to read from.
type HeaderBytes = Cursor<[u8; 12]>;

fn header_bytes(data: &[u8], pos: usize) -> HeaderBytes {
    let mut buf = [0u8; 12];
    let rest = data.get(pos..).unwrap_or_default();
    let n = rest.len().min(12);
    buf[..n].copy_from_slice(&rest[..n]);
    Cursor::new(buf)
}

/// Decode an element header at `pos` with `decode`: the header and the bytes it took.
fn header_at(
    decode: impl FnOnce(&mut HeaderBytes) -> dicom_encoding::decode::Result<(DataElementHeader, usize)>,
    data: &[u8],
    pos: usize,
    context: &str,
) -> Result<(DataElementHeader, usize), ImageIoError> {
    let remaining = data.len().saturating_sub(pos);
    let mut src = header_bytes(data, pos);
    match decode(&mut src) {
        Ok((header, _)) if src.position() as usize <= remaining => {
            Ok((header, src.position() as usize))
        }
        Ok(_) => Err(ImageIoError::truncated(
            DICOM,
            format!("{context}: element header at byte {pos} cut short"),
        )),
        Err(e) => Err(ImageIoError::corrupt(
            DICOM,
            format!("{context}: bad element header at byte {pos}: {e}"),
        )),
    }
}

/// The item header at `pos` (`Ok(None)` when fewer than 8 bytes remain).
fn item_header_at(
    decoder: &dyn DecodeFrom<HeaderBytes>,
    data: &[u8],
    pos: usize,
) -> Result<Option<SequenceItemHeader>, ImageIoError> {
    if data.len().saturating_sub(pos) < 8 {
        return Ok(None);
    }
    let mut src = header_bytes(data, pos);
    decoder.decode_item_header(&mut src).map(Some).map_err(|e| {
        ImageIoError::corrupt(DICOM, format!("expected a sequence item at byte {pos}: {e}"))
    })
}

fn le_u32(data: &[u8], pos: usize) -> Option<u32> {
    let b = data.get(pos..pos.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}
