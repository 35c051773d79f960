//! Images held in the store: decoding with a cache, the metadata index kept in step with the
//! blobs, display defaults for window/level, raw samples for the browser, and thumbnails.

use std::sync::Arc;

use bs_imageio::{Decoded, Format, Limits};
use bs_imaging::{DynImage, Image};
use bs_meta::{BlobRecord, ImageIndex};
use bs_store::Store;
use bytes::Bytes;
use serde::Serialize;

use crate::error::WebError;
use bs_store::Lru;

/// Decoded images kept for reuse: up to this many bytes of pixels.
const DECODED_CACHE_BYTES: usize = 768 << 20;
/// Thumbnails kept: up to this many bytes of PNG.
const THUMB_CACHE_BYTES: usize = 64 << 20;

/// The key under which an image's index entry keeps the user metadata of its blob.
pub use bs_meta::USER_METADATA;

/// Why a blob is recorded as no image when its first bytes are no image format's.
const NOT_AN_IMAGE: &str = "not an image format";

/// Access to the store's images.
pub struct Images {
    store: Arc<dyn Store>,
    index: Arc<ImageIndex>,
    limits: Limits,
    decoded: Lru<String, Arc<Decoded>>,
    thumbs: Lru<(String, u32), Bytes>,
}

/// How the browser should map raw samples to grey levels by default.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Display {
    /// Default window centre and width, in display units.
    pub center: f64,
    pub width: f64,
    /// Smallest and largest value in the image, in display units.
    pub min: f64,
    pub max: f64,
    /// `value = (raw - offset) × scale`, or `(offset - raw) × scale` when `inverted`.
    pub offset: f64,
    pub inverted: bool,
    pub scale: f64,
    /// "HU" for CT, otherwise empty.
    pub unit: String,
}

impl Images {
    pub fn new(store: Arc<dyn Store>, index: Arc<ImageIndex>, limits: Limits) -> Self {
        Self {
            store,
            index,
            limits,
            decoded: Lru::new(DECODED_CACHE_BYTES, 64),
            thumbs: Lru::new(THUMB_CACHE_BYTES, 4096),
        }
    }

    /// The decoding limits (filter results are held to the same pixel count).
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn index(&self) -> &ImageIndex {
        &self.index
    }

    /// Decode the blob `key` (cached by digest), indexing it on the way.
    pub fn decode(&self, key: &str) -> Result<(BlobRecord, Arc<Decoded>), WebError> {
        let src = self.store.open_read(key)?;
        let rec = src.record().clone();
        if let Some(d) = self.decoded.get(&rec.digest) {
            // Same bytes seen before, possibly under another name or before a replacement.
            if self.known(&rec).is_none() {
                self.put_index(&rec, &d);
            }
            return Ok((rec, d));
        }
        if rec.size > self.limits.max_bytes {
            return Err(WebError::TooLarge(format!(
                "{key}: {} bytes is more than the {} bytes an image may have",
                rec.size, self.limits.max_bytes
            )));
        }
        let bytes = src.all()?; // every chunk checked
        let decoded = match bs_imageio::decode(&bytes, Some(key), &self.limits) {
            Ok(d) => Arc::new(d),
            Err(e) => {
                let over_limit = matches!(
                    e,
                    bs_imageio::ImageIoError::TooLarge { .. }
                        | bs_imageio::ImageIoError::TooManyBytes { .. }
                );
                // A DICOM instance whose pixels cannot be decoded (or not within the limits)
                // keeps its study and series, so DICOMweb still finds and serves it.
                let written = match bs_imageio::dicom_ids(&bytes, &self.limits) {
                    Ok(ids) => {
                        let mut fields = ids.descriptive;
                        fields.extend(
                            [
                                ("study_instance_uid", ids.study_instance_uid),
                                ("series_instance_uid", ids.series_instance_uid),
                                ("sop_instance_uid", ids.sop_instance_uid),
                                ("sop_class_uid", ids.sop_class_uid),
                                ("transfer_syntax_uid", ids.transfer_syntax_uid),
                            ]
                            .map(|(k, v)| (k.to_string(), v)),
                        );
                        Some(self.index.put_undecodable_dicom(
                            key,
                            &rec.digest,
                            &fields,
                            &e.to_string(),
                        ))
                    }
                    // Over a limit is not "not an image": with other limits it may decode.
                    Err(_) if over_limit => None,
                    Err(_) => Some(self.index.put_not_image(key, &rec.digest, &e.to_string())),
                };
                if let Some(w) = written {
                    match w {
                        Ok(()) => self.still_current(&rec),
                        Err(ie) => tracing::warn!("indexing {key}: {ie}"),
                    }
                }
                return Err(e.into());
            }
        };
        self.put_index(&rec, &decoded);
        // Every decoded frame counts against the cache's budget.
        let frame = decoded.image.width() * decoded.image.height() * decoded.image.channels() * 2;
        let weight = frame * decoded.frame_count();
        self.decoded.put(rec.digest.clone(), decoded.clone(), weight);
        Ok((rec, decoded))
    }

    /// The blob behind `src` decoded as far as its first frame, if it decodes within the
    /// limits.
    fn first_frame(&self, src: &bs_store::BlobSource) -> Option<Decoded> {
        let rec = src.record();
        if rec.size > self.limits.max_bytes {
            return None;
        }
        let bytes = src.all().ok()?; // every chunk checked
        let first = Limits { max_frames_decoded: 1, ..self.limits };
        bs_imageio::decode(&bytes, Some(&rec.name), &first).ok()
    }

    fn put_index(&self, rec: &BlobRecord, d: &Decoded) {
        let mut meta = serde_json::to_value(&d.meta).unwrap_or_else(|_| serde_json::json!({}));
        let mut fields = d.meta.to_map();
        fields.insert("format".into(), d.format.name().to_string());
        // The metadata given at upload (`put --meta`, `X-Blobstream-Meta-*`) is shown with the
        // image's own and searched as free text.
        if !rec.metadata.is_empty() {
            meta[USER_METADATA] = serde_json::json!(rec.metadata);
            for (k, v) in &rec.metadata {
                fields.insert(format!("{USER_METADATA}.{k}"), v.clone());
            }
        }
        let json = meta.to_string();
        match self.index.put(&rec.name, &rec.digest, &fields, &json) {
            Ok(()) => self.still_current(rec),
            Err(e) => tracing::warn!("indexing {}: {e}", rec.name),
        }
    }

    /// After writing the index row of `rec`: were its bytes deleted or replaced while they
    /// were decoded (which can take seconds)? Then the row would outlive the blob — a study
    /// listed that cannot be opened — or stand in for the new bytes' row. It is dropped (only
    /// if it is still this digest's), and a replacement is indexed anew.
    fn still_current(&self, rec: &BlobRecord) {
        let gone = match self.store.stat(&rec.name) {
            Ok(now) if now.digest == rec.digest => return,
            Ok(_) => false,
            Err(bs_store::StoreError::NotFound(_)) => true,
            Err(e) => return tracing::warn!("checking {} after indexing it: {e}", rec.name),
        };
        if let Err(e) = self.index.forget_at(&rec.name, &rec.digest) {
            return tracing::warn!("dropping the stale index entry of {}: {e}", rec.name);
        }
        if !gone && let Err(e) = self.refresh(&rec.name) {
            tracing::warn!("indexing {} again: {e}", rec.name);
        }
    }

    /// Bring the index entry of `key` up to date: decode it if its first bytes or its name say
    /// it is an image, otherwise record that it is not. Returns the fresh metadata, if any.
    pub fn refresh(&self, key: &str) -> Result<Option<serde_json::Value>, WebError> {
        self.refresh_in_turn(key, || ())
    }

    /// [`Images::refresh`] that decodes (if it must) only once `turn()` has returned, holding
    /// what it returned meanwhile: the caller's share of the server's decoding (a blob that is
    /// no image, or indexed already, waits for none).
    pub fn refresh_in_turn<T>(
        &self,
        key: &str,
        turn: impl FnOnce() -> T,
    ) -> Result<Option<serde_json::Value>, WebError> {
        let mut not_image = Vec::new();
        let found = self.refresh_or_note(key, &mut not_image, turn)?;
        if !not_image.is_empty() {
            self.note_not_images(&not_image)?;
        }
        Ok(found)
    }

    /// [`Images::refresh`], except that a blob found to be in no image format is not
    /// recorded but added to `not_images` (name, digest), for the caller to record many at
    /// once with [`Images::note_not_images`].
    pub fn refresh_or_note<T>(
        &self,
        key: &str,
        not_images: &mut Vec<(String, String)>,
        turn: impl FnOnce() -> T,
    ) -> Result<Option<serde_json::Value>, WebError> {
        let rec = self.store.stat(key)?;
        if let Some(m) = self.known(&rec) {
            return Ok(m);
        }
        let src = self.store.open_read(key)?;
        let mut head = [0u8; 132];
        let n = src.read_at(&mut head, 0)?;
        drop(src);
        if Format::from_magic(&head[..n]).is_none() && Format::from_name(key).is_none() {
            not_images.push((key.to_string(), rec.digest));
            return Ok(None);
        }
        let _turn = turn();
        match self.decode(key) {
            Ok((_, d)) => Ok(serde_json::to_value(&d.meta).ok()),
            Err(WebError::Unprocessable(_) | WebError::TooLarge(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Record that the blobs `rows` (name, digest) are in no image format, in one write.
    pub fn note_not_images(&self, rows: &[(String, String)]) -> Result<(), WebError> {
        Ok(self.index.put_not_images(rows, NOT_AN_IMAGE)?)
    }

    /// What the index knows about `rec` at its current digest: `Some(Some(meta))` an image,
    /// `Some(None)` not an image, `None` not indexed (or indexed for other bytes).
    pub fn known(&self, rec: &BlobRecord) -> Option<Option<serde_json::Value>> {
        let e = self.index.get(&rec.name).ok()??;
        if e.digest != rec.digest {
            return None;
        }
        if !e.is_image {
            return Some(None);
        }
        let meta: serde_json::Value = serde_json::from_str(&e.meta).ok()?;
        // The same bytes stored again with other user metadata: index them again.
        let indexed = meta.get(USER_METADATA).cloned().unwrap_or_else(|| serde_json::json!({}));
        (indexed == serde_json::json!(rec.metadata)).then_some(Some(meta))
    }

    /// A PNG thumbnail whose longer side is `size`, with the default window applied.
    /// A blob marked corrupt has none, even one made before the mark.
    pub fn thumbnail(&self, key: &str, size: u32) -> Result<Bytes, WebError> {
        let src = self.store.open_read(key)?; // refuses a blob marked corrupt
        let rec = src.record().clone();
        let ck = (rec.digest.clone(), size);
        if let Some(t) = self.thumbs.get(&ck) {
            return Ok(t);
        }
        // A thumbnail shows the first frame: an image not decoded yet is decoded that far for
        // it (a cine of hundreds of frames is not decoded whole to draw one), and what that
        // gives is not kept as the image. One that does not decode so goes through `decode`,
        // which files why.
        let d = match self.decoded.get(&rec.digest) {
            Some(d) => d,
            None => match self.first_frame(&src) {
                Some(d) => Arc::new(d),
                None => self.decode(key)?.1,
            },
        };
        let shown = bs_imageio::apply_window(&d);
        let DynImage::U8(img) = shown else {
            return Err(WebError::Internal("window did not give 8-bit pixels".into()));
        };
        let small = shrink(&img, size as usize);
        let png = bs_imageio::encode(&DynImage::U8(small), Format::Png)?;
        let png = Bytes::from(png);
        self.thumbs.put(ck, png.clone(), png.len());
        Ok(png)
    }
}

/// Display defaults for a decoded image.
pub fn display(d: &Decoded) -> Display {
    let meta = &d.meta;
    let offset = meta.pixel_offset.unwrap_or(0.0);
    let inverted = meta.pixel_inverted == Some(true);
    let scale = meta.pixel_scale.unwrap_or(1.0);
    let value = |raw: f64| scale * if inverted { offset - raw } else { raw - offset };
    let (lo, hi) = match &d.image {
        DynImage::U8(i) => range(&i.data),
        DynImage::U16(i) => range(&i.data),
    };
    let (a, b) = (value(lo), value(hi));
    let (min, max) = (a.min(b), a.max(b));
    let unit = if meta.pixel_offset.is_some() && meta.modality.as_deref() == Some("CT") {
        "HU"
    } else {
        ""
    };
    let (center, width) = match (meta.window_center, meta.window_width) {
        (Some(c), Some(w)) => (c, w),
        // Same defaults as `apply_window`: 8-bit shown as is, 16-bit over its own range.
        _ => match &d.image {
            DynImage::U8(_) => (128.0, 256.0),
            DynImage::U16(i) if i.channels == 1 => {
                let step = scale.abs();
                ((min + max + step) / 2.0, max - min + step)
            }
            DynImage::U16(_) => (32768.0, 65536.0),
        },
    };
    Display { center, width, min, max, offset, inverted, scale, unit: unit.into() }
}

fn range<T: Copy + Into<f64> + PartialOrd>(data: &[T]) -> (f64, f64) {
    let mut it = data.iter().copied();
    let Some(first) = it.next() else { return (0.0, 0.0) };
    let (lo, hi) = it.fold((first, first), |(lo, hi), v| {
        (if v < lo { v } else { lo }, if v > hi { v } else { hi })
    });
    (lo.into(), hi.into())
}

/// Samples as little-endian bytes (the `/api/pixels` body).
pub fn raw_bytes(img: &DynImage) -> Bytes {
    match img {
        DynImage::U8(i) => Bytes::copy_from_slice(&i.data),
        DynImage::U16(i) => {
            let mut out = Vec::with_capacity(i.data.len() * 2);
            for v in &i.data {
                out.extend_from_slice(&v.to_le_bytes());
            }
            Bytes::from(out)
        }
    }
}

/// Bits per sample of a decoded image (8 or 16).
pub fn bits(img: &DynImage) -> u32 {
    match img {
        DynImage::U8(_) => 8,
        DynImage::U16(_) => 16,
    }
}

/// Area-average reduction so the longer side is at most `size` (never enlarges). Written
/// here because the filters' zoom samples points (nearest/bilinear), which aliases when
/// shrinking a 2048-pixel image to 128.
pub fn shrink(img: &Image<u8>, size: usize) -> Image<u8> {
    let (w, h, c) = (img.width, img.height, img.channels);
    let longest = w.max(h).max(1);
    if longest <= size {
        return img.clone();
    }
    let nw = (w * size).div_ceil(longest).max(1);
    let nh = (h * size).div_ceil(longest).max(1);
    let mut out = Image::<u8>::new(nw, nh, c);
    for oy in 0..nh {
        let (y0, y1) = (oy * h / nh, ((oy + 1) * h / nh).max(oy * h / nh + 1));
        for ox in 0..nw {
            let (x0, x1) = (ox * w / nw, ((ox + 1) * w / nw).max(ox * w / nw + 1));
            let n = ((y1 - y0) * (x1 - x0)) as u32;
            for ch in 0..c {
                let mut sum = 0u32;
                for y in y0..y1 {
                    let row = img.row(y);
                    for x in x0..x1 {
                        sum += u32::from(row[x * c + ch]);
                    }
                }
                out.data[(oy * nw + ox) * c + ch] = ((sum + n / 2) / n) as u8;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decode that ends after its blob was deleted, or replaced, writes its row late; the
    /// row must not outlive the blob nor stand in for the new bytes' row (the worklist and
    /// QIDO-RS read rows without opening the blobs).
    #[test]
    fn a_row_written_for_bytes_deleted_or_replaced_while_they_decoded_does_not_stand() {
        let store: Arc<dyn Store> = Arc::new(bs_store::MemStore::new());
        let index = Arc::new(ImageIndex::open_in_memory().unwrap());
        let images = Images::new(store.clone(), index.clone(), Limits::default());
        let key = "ct/1.dcm";
        let put = |b: Vec<u8>| {
            let spec = bs_store::RouteSpec {
                name: key.into(),
                overwrite: true,
                ..bs_store::RouteSpec::default()
            };
            bs_store::put_bytes(store.as_ref(), &spec, &b).unwrap()
        };
        put(crate::samples::ct_series_slice(0));
        let (first, decoded) = images.decode(key).unwrap();
        assert_eq!(index.get(key).unwrap().unwrap().digest, first.digest);

        // Deleted (and its row forgotten) while a decode of it ran: the late row goes.
        store.delete(key).unwrap();
        index.forget(key).unwrap();
        images.put_index(&first, &decoded);
        assert!(index.get(key).unwrap().is_none(), "a row for a deleted blob");

        // Replaced, and the new bytes indexed, while a decode of the old ran: the new row
        // stands (written again if the late one overwrote it).
        put(crate::samples::ct_series_slice(1));
        let second = store.stat(key).unwrap();
        assert_ne!(second.digest, first.digest);
        images.refresh(key).unwrap();
        images.put_index(&first, &decoded);
        let row = index.get(key).unwrap().unwrap();
        assert_eq!(row.digest, second.digest, "the replaced bytes' row stood in for the new");
        assert!(row.is_image);
    }

    /// Indexing waits for a turn at decoding only when it decodes: not for a blob that is no
    /// image, nor for one indexed already.
    #[test]
    fn indexing_takes_a_decode_turn_only_to_decode() {
        let store: Arc<dyn Store> = Arc::new(bs_store::MemStore::new());
        let index = Arc::new(ImageIndex::open_in_memory().unwrap());
        let images = Images::new(store.clone(), index, Limits::default());
        let put = |name: &str, b: &[u8]| {
            let spec = bs_store::RouteSpec { name: name.into(), ..Default::default() };
            bs_store::put_bytes(store.as_ref(), &spec, b).unwrap();
        };
        put("notes/a", b"plain words, no image");
        put("ct/1.dcm", &crate::samples::ct_series_slice(0));
        let turns = std::cell::Cell::new(0);
        let turn = || turns.set(turns.get() + 1);
        assert!(images.refresh_in_turn("notes/a", turn).unwrap().is_none());
        assert_eq!(turns.get(), 0, "no image: no turn");
        assert!(images.refresh_in_turn("ct/1.dcm", turn).unwrap().is_some());
        assert_eq!(turns.get(), 1, "decoded in a turn");
        images.refresh_in_turn("ct/1.dcm", turn).unwrap();
        assert_eq!(turns.get(), 1, "indexed already: no turn");
    }

    /// A DICOM instance too big to decode within the limits is still filed under its study
    /// and series (so DICOMweb finds and serves it), with why it was not decoded.
    #[test]
    fn an_instance_over_the_decode_limits_keeps_its_study_and_series() {
        let store: Arc<dyn Store> = Arc::new(bs_store::MemStore::new());
        let index = Arc::new(ImageIndex::open_in_memory().unwrap());
        let small = Limits { max_pixels: 100, ..Limits::default() };
        let images = Images::new(store.clone(), index.clone(), small);
        let bytes = crate::samples::ct_series_slice(0);
        let ids = bs_imageio::dicom_ids(&bytes, &Limits::default()).unwrap();
        let spec = bs_store::RouteSpec { name: "ct/big.dcm".into(), ..Default::default() };
        bs_store::put_bytes(store.as_ref(), &spec, &bytes).unwrap();
        assert!(matches!(images.refresh("ct/big.dcm"), Ok(None)), "not decoded");
        let found = index.instances(&ids.series_instance_uid).unwrap();
        assert_eq!(found.len(), 1, "filed under its series");
        assert_eq!(found[0].name, "ct/big.dcm");
        assert!(!found[0].is_image && found[0].meta.contains("pixels"), "{}", found[0].meta);
    }

    /// A multi-frame image's thumbnail is drawn from its first frame, decoded that far only:
    /// the same picture as from the whole decode, and nothing of it kept as the image (the
    /// viewer's decode still has every frame).
    #[test]
    fn a_thumbnail_decodes_only_the_first_frame() {
        use crate::samples::{el, grey_pixels, part10};
        use dicom_core::{DataElement, PrimitiveValue, VR};
        use dicom_dictionary_std::tags;
        let (n, frames) = (16u16, 40usize);
        let px: Vec<u8> = (0..usize::from(n * n) * frames).map(|i| (i * 7 % 251) as u8).collect();
        let obj = dicom_object::InMemDicomObject::from_element_iter(
            [
                el(tags::SOP_CLASS_UID, VR::UI, "1.2.840.10008.5.1.4.1.1.7.2"),
                el(tags::SOP_INSTANCE_UID, VR::UI, "2.25.7"),
                el(tags::NUMBER_OF_FRAMES, VR::IS, &frames.to_string()),
                DataElement::new(tags::PIXEL_DATA, VR::OB, PrimitiveValue::from(px)),
            ]
            .into_iter()
            .chain(grey_pixels(n, 8, false)),
        );
        let bytes = part10(obj, "1.2.840.10008.5.1.4.1.1.7.2", "2.25.7");
        let store: Arc<dyn Store> = Arc::new(bs_store::MemStore::new());
        let spec = bs_store::RouteSpec { name: "cine.dcm".into(), ..Default::default() };
        let rec = bs_store::put_bytes(store.as_ref(), &spec, &bytes).unwrap();
        let index = || Arc::new(ImageIndex::open_in_memory().unwrap());
        let first = Images::new(store.clone(), index(), Limits::default());
        let thumb = first.thumbnail("cine.dcm", 8).unwrap();
        assert!(first.decoded.get(&rec.digest).is_none(), "decoded whole for a thumbnail");
        let whole = Images::new(store, index(), Limits::default());
        let (_, d) = whole.decode("cine.dcm").unwrap();
        assert_eq!(d.frame_count(), frames, "the viewer's decode has every frame");
        assert_eq!(whole.thumbnail("cine.dcm", 8).unwrap(), thumb, "the same picture");
        assert_eq!(first.decode("cine.dcm").unwrap().1.frame_count(), frames);
    }

    #[test]
    fn shrink_averages_blocks_and_keeps_aspect() {
        let img = Image::<u8>::from_vec(4, 2, 1, vec![0, 10, 20, 30, 40, 50, 60, 70]).unwrap();
        let s = shrink(&img, 2);
        assert_eq!((s.width, s.height), (2, 1));
        assert_eq!(s.data, vec![25, 45]);
        assert_eq!(shrink(&img, 8), img, "never enlarges");
    }

    #[test]
    fn raw_bytes_are_little_endian() {
        let img = DynImage::U16(Image::from_vec(2, 1, 1, vec![0x0102, 0xA0B0]).unwrap());
        assert_eq!(&raw_bytes(&img)[..], &[0x02, 0x01, 0xB0, 0xA0]);
        assert_eq!(bits(&img), 16);
    }
}
