//! Big TIFFs loaded band by band: the rows of one tile height are read from the file's strips
//! (or tiles), cut into level-0 tiles, halved into the next level's band, and so on up the
//! pyramid — so memory holds a few bands per level, never the whole image. The tiles are the
//! same, byte for byte, as [`crate::pyramid::ImagePyramid`] makes from the whole image.
//!
//! Streams chunky 8- or 16-bit gray, RGB and RGBA TIFFs (16-bit samples scaled to 8); anything
//! else — planar, palette, CMYK, floating point — is read whole instead (see [`streamable`]).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use bs_imaging::Image;
use tiff::ColorType;
use tiff::decoder::{ChunkType, Decoder, DecodingResult};
use tiff::tags::Tag;

use crate::block::BlockId;
use crate::error::DpssError;

fn bad(path: &Path, e: impl std::fmt::Display) -> DpssError {
    DpssError::Image(format!("{}: {e}", path.display()))
}

/// What the TIFF decoder said, with a file that ends before the data its directory points
/// at called what it is (the decoder says only "failed to fill whole buffer").
fn tiff_error(path: &Path, e: tiff::TiffError) -> DpssError {
    match e {
        tiff::TiffError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            bad(path, "the file is cut short: it ends before the image data its header points at")
        }
        e => bad(path, e),
    }
}

type Tiff = Decoder<BufReader<File>>;

fn open(path: &Path) -> Result<Tiff, DpssError> {
    let f = File::open(path)?;
    Decoder::new(BufReader::with_capacity(1 << 20, f)).map_err(|e| tiff_error(path, e))
}

/// The size and channels of a TIFF that can be streamed; `None` when the file is not a TIFF
/// or not one of the kinds streamed (then read it whole).
pub fn streamable(path: &Path) -> Result<Option<(u64, u64, u32)>, DpssError> {
    let mut head = [0u8; 4];
    {
        use std::io::Read;
        let mut f = File::open(path)?;
        if f.read(&mut head)? < 4 || (&head != b"II*\0" && &head != b"MM\0*") {
            return Ok(None);
        }
    }
    let mut d = open(path)?;
    let planar =
        d.find_tag_unsigned::<u32>(Tag::PlanarConfiguration).map_err(|e| tiff_error(path, e))?;
    let channels = match d.colortype().map_err(|e| tiff_error(path, e))? {
        ColorType::Gray(8 | 16) => 1,
        ColorType::RGB(8 | 16) => 3,
        ColorType::RGBA(8 | 16) => 4,
        _ => return Ok(None),
    };
    if planar.is_some_and(|p| p != 1) {
        return Ok(None);
    }
    let (w, h) = d.dimensions().map_err(|e| tiff_error(path, e))?;
    Ok(Some((w as u64, h as u64, channels)))
}

/// Rows `[y0, y1)` of the image, 8-bit, `channels` per pixel.
struct Rows {
    d: Tiff,
    width: usize,
    channels: usize,
    chunk: (usize, usize),
    across: usize,
    /// The last chunk row decoded: (its index, its rows across the whole width).
    cached: Option<(usize, Vec<u8>)>,
}

impl Rows {
    fn chunk_row(&mut self, path: &Path, r: usize) -> Result<&[u8], DpssError> {
        if self.cached.as_ref().is_none_or(|(i, _)| *i != r) {
            let (cw, ch) = self.chunk;
            let stride = self.width * self.channels;
            let mut out = vec![0u8; ch * stride];
            for c in 0..self.across {
                let idx = (r * self.across + c) as u32;
                let (dw, dh) = self.d.chunk_data_dimensions(idx);
                let samples: Vec<u8> =
                    match self.d.read_chunk(idx).map_err(|e| tiff_error(path, e))? {
                        DecodingResult::U8(v) => v,
                        DecodingResult::U16(v) => v.iter().map(|s| (s >> 8) as u8).collect(),
                        _ => return Err(bad(path, "samples are neither 8 nor 16 bits")),
                    };
                let (dw, dh) = (dw as usize, dh as usize);
                let row = dw * self.channels;
                if samples.len() < dh * row {
                    return Err(bad(
                        path,
                        format!("chunk {idx} holds {} samples, not {}", samples.len(), dh * row),
                    ));
                }
                for y in 0..dh.min(ch) {
                    let at = y * stride + c * cw * self.channels;
                    let n = row.min(stride - c * cw * self.channels);
                    out[at..at + n].copy_from_slice(&samples[y * row..y * row + n]);
                }
            }
            self.cached = Some((r, out));
        }
        Ok(&self.cached.as_ref().unwrap().1)
    }

    fn read(&mut self, path: &Path, y0: usize, y1: usize) -> Result<Vec<u8>, DpssError> {
        let stride = self.width * self.channels;
        let ch = self.chunk.1;
        let mut out = Vec::with_capacity((y1 - y0) * stride);
        let mut y = y0;
        while y < y1 {
            let r = y / ch;
            let upto = y1.min((r + 1) * ch);
            let rows = self.chunk_row(path, r)?;
            out.extend_from_slice(&rows[(y - r * ch) * stride..(upto - r * ch) * stride]);
            y = upto;
        }
        Ok(out)
    }
}

/// Half of a band of `n` rows of `w` pixels (each output pixel the mean of up to four, as
/// `ImagePyramid` halves a whole level).
fn halve(rows: &[u8], w: usize, n: usize, c: usize) -> (Vec<u8>, usize, usize) {
    let (hw, hn) = (w.div_ceil(2), n.div_ceil(2));
    let mut out = vec![0u8; hw * hn * c];
    for y in 0..hn {
        for x in 0..hw {
            for k in 0..c {
                let (mut sum, mut cnt) = (0u32, 0u32);
                for (dx, dy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                    let (sx, sy) = (2 * x + dx, 2 * y + dy);
                    if sx < w && sy < n {
                        sum += rows[(sy * w + sx) * c + k] as u32;
                        cnt += 1;
                    }
                }
                out[(y * hw + x) * c + k] = (sum / cnt) as u8;
            }
        }
    }
    (out, hw, hn)
}

struct Builder<'a> {
    tile: usize,
    levels: usize,
    channels: usize,
    /// Per level: rows waiting to make a band, their width, and the next band's number.
    acc: Vec<(Vec<u8>, usize, usize, u32)>,
    heights: Vec<usize>,
    emit: &'a mut dyn FnMut(BlockId, Vec<u8>) -> Result<(), DpssError>,
}

impl Builder<'_> {
    /// A whole band of level `l` (`n` rows of width `w`): its tiles, then its half to the
    /// level above.
    fn band(&mut self, l: usize, rows: Vec<u8>, w: usize, n: usize) -> Result<(), DpssError> {
        let band_no = self.acc[l].3;
        self.acc[l].3 += 1;
        let (t, c) = (self.tile, self.channels);
        let tiles: Vec<Image<u8>> = (0..w.div_ceil(t))
            .map(|tx| {
                let (x0, tw) = (tx * t, t.min(w - tx * t));
                let mut img = Image::new(tw, n, c);
                for y in 0..n {
                    let src = &rows[(y * w + x0) * c..(y * w + x0 + tw) * c];
                    img.data[y * tw * c..(y + 1) * tw * c].copy_from_slice(src);
                }
                img
            })
            .collect();
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).min(8);
        let encoded: Vec<Result<Vec<u8>, DpssError>> = std::thread::scope(|sc| {
            let per = tiles.len().div_ceil(workers).max(1);
            let hs: Vec<_> = tiles
                .chunks(per)
                .map(|part| {
                    sc.spawn(move || {
                        part.iter()
                            .map(|i| crate::pyramid::encode_png(i.clone()))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().expect("a tile encoder panicked")).collect()
        });
        for (tx, png) in encoded.into_iter().enumerate() {
            (self.emit)(BlockId::new(l as u8, tx as u32, band_no), png?)?;
        }
        if l + 1 < self.levels {
            let last = (band_no as usize + 1) * t >= self.heights[l];
            let (half, hw, _) = halve(&rows, w, n, c);
            let acc = &mut self.acc[l + 1];
            acc.0.extend_from_slice(&half);
            acc.1 = hw;
            let held = acc.0.len() / (hw * c);
            if held >= t || last {
                let rows = std::mem::take(&mut acc.0);
                self.band(l + 1, rows, hw, held)?;
            }
        }
        Ok(())
    }
}

/// Make every tile of `path`'s pyramid (`levels` levels of `tile`² tiles) band by band and
/// hand each to `emit`. `tile` must be even (so halved bands line up).
pub fn stream(
    path: &Path,
    tile: u32,
    levels: u32,
    emit: &mut dyn FnMut(BlockId, Vec<u8>) -> Result<(), DpssError>,
) -> Result<(), DpssError> {
    if !tile.is_multiple_of(2) {
        return Err(DpssError::Layout("streaming a TIFF needs an even tile size".into()));
    }
    let (w, h, c) =
        streamable(path)?.ok_or_else(|| bad(path, "not a TIFF that can be streamed"))?;
    let d = open(path)?;
    let (cw, ch) = d.chunk_dimensions();
    let across = match d.get_chunk_type() {
        ChunkType::Strip => 1,
        ChunkType::Tile => (w as usize).div_ceil(cw as usize),
    };
    let (cw, ch) = (if across == 1 { w as usize } else { cw as usize }, ch as usize);
    let mut rows =
        Rows { d, width: w as usize, channels: c as usize, chunk: (cw, ch), across, cached: None };
    let heights: Vec<usize> = (0..levels)
        .map(|l| {
            let mut v = h;
            for _ in 0..l {
                v = v.div_ceil(2);
            }
            v as usize
        })
        .collect();
    let mut b = Builder {
        tile: tile as usize,
        levels: levels as usize,
        channels: c as usize,
        acc: vec![(Vec::new(), 0, 0, 0); levels as usize],
        heights,
        emit,
    };
    let t = tile as usize;
    for y0 in (0..h as usize).step_by(t) {
        let y1 = (y0 + t).min(h as usize);
        let band = rows.read(path, y0, y1)?;
        b.band(0, band, w as usize, y1 - y0)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pyramid::{ImagePyramid, TileSource};

    fn write_tiff(path: &Path, w: u32, h: u32, rows_per_strip: u32) -> Image<u8> {
        let data: Vec<u8> = (0..w * h * 3).map(|i| ((i * 7 + i / 3001) % 251) as u8).collect();
        let f = File::create(path).unwrap();
        let mut enc = tiff::encoder::TiffEncoder::new(f).unwrap();
        let mut img = enc.new_image::<tiff::encoder::colortype::RGB8>(w, h).unwrap();
        img.rows_per_strip(rows_per_strip).unwrap();
        img.write_data(&data).unwrap();
        Image::from_vec(w as usize, h as usize, 3, data).unwrap()
    }

    #[test]
    fn a_streamed_tiff_gives_the_same_tiles_as_the_whole_image() {
        let t = tempfile::tempdir().unwrap();
        // Strips of 7 rows: band edges fall inside strips.
        let path = t.path().join("big.tif");
        let img = write_tiff(&path, 700, 600, 7);
        assert_eq!(streamable(&path).unwrap(), Some((700, 600, 3)));
        let levels = 3; // 700 → 350 → 175
        let whole = ImagePyramid::new(img, 256, levels);
        let mut got = std::collections::HashMap::new();
        stream(&path, 256, levels, &mut |id, png| {
            assert!(got.insert(id, png).is_none(), "{id} twice");
            Ok(())
        })
        .unwrap();
        // Level 0: 3×3 tiles, level 1: 2×2, level 2: 1.
        assert_eq!(got.len(), 9 + 4 + 1);
        for (id, png) in &got {
            assert_eq!(*png, whole.block(*id).unwrap(), "{id}");
        }
    }

    #[test]
    fn what_is_not_a_streamable_tiff_says_so() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("x.png");
        std::fs::write(&p, b"\x89PNG\r\n\x1a\nnot really").unwrap();
        assert_eq!(streamable(&p).unwrap(), None);
        let cut = t.path().join("cut.tif");
        write_tiff(&cut, 300, 300, 16);
        let bytes = std::fs::read(&cut).unwrap();
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let r = stream(&cut, 256, 2, &mut |_, _| Ok(()));
        assert!(matches!(&r, Err(DpssError::Image(m)) if m.contains("cut short")), "{r:?}");
    }
}
