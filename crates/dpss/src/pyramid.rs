//! Where a loader's blocks come from: an image cut into a pyramid of tiles (each level half
//! the one below, 2×2 box-filtered), a generated image of any size made tile by tile, or a
//! flat file cut into fixed-size blocks.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use bs_imageio::{Format, Limits};
use bs_imaging::{DynImage, Image};

use crate::block::BlockId;
use crate::error::DpssError;

/// Gives the bytes of each block of a data set.
pub trait TileSource: Sync {
    fn block(&self, id: BlockId) -> Result<Vec<u8>, DpssError>;
}

pub(crate) fn encode_png(img: Image<u8>) -> Result<Vec<u8>, DpssError> {
    bs_imageio::encode(&DynImage::U8(img), Format::Png).map_err(|e| DpssError::Image(e.to_string()))
}

/// An image held in memory, with every level of its pyramid.
#[derive(Debug)]
pub struct ImagePyramid {
    levels: Vec<Image<u8>>,
    tile: usize,
}

impl ImagePyramid {
    /// Read an image file (any format the imageio crate reads; 16-bit samples are scaled to 8).
    pub fn read(path: &Path, tile: u32, levels: u32) -> Result<Self, DpssError> {
        let d = bs_imageio::read(
            path,
            &Limits { max_pixels: 1 << 31, max_bytes: 8 << 30, ..Limits::default() },
        )
        .map_err(|e| DpssError::Image(e.to_string()))?;
        let img = match d.image {
            DynImage::U8(i) => i,
            DynImage::U16(i) => Image {
                width: i.width,
                height: i.height,
                channels: i.channels,
                data: i.data.iter().map(|v| (v >> 8) as u8).collect(),
            },
        };
        Ok(Self::new(img, tile, levels))
    }

    pub fn new(img: Image<u8>, tile: u32, levels: u32) -> Self {
        let mut all = vec![img];
        while all.len() < levels as usize {
            let next = halve(all.last().unwrap());
            all.push(next);
        }
        Self { levels: all, tile: tile as usize }
    }

    /// The same image with `levels` levels.
    pub fn with_levels(self, levels: u32) -> Self {
        let tile = self.tile as u32;
        let base = self.levels.into_iter().next().expect("level 0");
        Self::new(base, tile, levels)
    }

    pub fn size(&self) -> (u64, u64) {
        (self.levels[0].width as u64, self.levels[0].height as u64)
    }

    pub fn channels(&self) -> u32 {
        self.levels[0].channels as u32
    }
}

/// The image at half size, each pixel the mean of (up to) four.
fn halve(src: &Image<u8>) -> Image<u8> {
    let (w, h, c) = (src.width.div_ceil(2), src.height.div_ceil(2), src.channels);
    let mut out = Image::new(w, h, c);
    for y in 0..h {
        for x in 0..w {
            for ch in 0..c {
                let mut sum = 0u32;
                let mut n = 0u32;
                for (dx, dy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                    let (sx, sy) = (2 * x + dx, 2 * y + dy);
                    if sx < src.width && sy < src.height {
                        sum += src.get(sx, sy, ch) as u32;
                        n += 1;
                    }
                }
                out.data[(y * w + x) * c + ch] = (sum / n) as u8;
            }
        }
    }
    out
}

impl TileSource for ImagePyramid {
    fn block(&self, id: BlockId) -> Result<Vec<u8>, DpssError> {
        let img = self
            .levels
            .get(id.level as usize)
            .ok_or_else(|| DpssError::Layout(format!("no level {}", id.level)))?;
        let (x0, y0) = (id.x as usize * self.tile, id.y as usize * self.tile);
        if x0 >= img.width || y0 >= img.height {
            return Err(DpssError::Layout(format!("tile {id} is outside the image")));
        }
        let (w, h) = ((img.width - x0).min(self.tile), (img.height - y0).min(self.tile));
        let c = img.channels;
        let mut t = Image::new(w, h, c);
        for y in 0..h {
            let row = &img.row(y0 + y)[x0 * c..(x0 + w) * c];
            t.data[y * w * c..(y + 1) * w * c].copy_from_slice(row);
        }
        encode_png(t)
    }
}

/// A generated RGB image of any size (a test card: colour gradients, a grid every 1024
/// pixels and rings), made tile by tile, so a 32k × 32k data set never exists whole.
#[derive(Debug, Clone, Copy)]
pub struct Synthetic {
    pub width: u64,
    pub height: u64,
    pub tile: u32,
}

impl Synthetic {
    /// Samples per pixel of its tiles (RGB).
    pub const CHANNELS: u32 = 3;

    /// The colour of level-0 pixel (x, y).
    pub fn pixel(&self, x: u64, y: u64) -> [u8; 3] {
        let (fx, fy) = (x as f64 / self.width as f64, y as f64 / self.height as f64);
        let grid = x % 1024 < 8 || y % 1024 < 8;
        let (dx, dy) = (fx - 0.5, fy - 0.5);
        let ring = (((dx * dx + dy * dy).sqrt() * 64.0) as u64).is_multiple_of(2);
        if grid {
            return [255, 255, 255];
        }
        let r = (fx * 255.0) as u8;
        let g = (fy * 255.0) as u8;
        let b = if ring { 200 } else { 40 };
        [r, g, b]
    }
}

impl TileSource for Synthetic {
    fn block(&self, id: BlockId) -> Result<Vec<u8>, DpssError> {
        let scale = 1u64 << id.level;
        let (lw, lh) = (self.width.div_ceil(scale), self.height.div_ceil(scale));
        let t = self.tile as u64;
        let (x0, y0) = (id.x as u64 * t, id.y as u64 * t);
        if x0 >= lw || y0 >= lh {
            return Err(DpssError::Layout(format!("tile {id} is outside the image")));
        }
        let (w, h) = ((lw - x0).min(t) as usize, (lh - y0).min(t) as usize);
        let mut img = Image::new(w, h, Self::CHANNELS as usize);
        for y in 0..h {
            for x in 0..w {
                let p = self.pixel((x0 + x as u64) * scale, (y0 + y as u64) * scale);
                img.data[(y * w + x) * 3..(y * w + x) * 3 + 3].copy_from_slice(&p);
            }
        }
        encode_png(img)
    }
}

/// A file cut into blocks of `block` bytes (block n is (level 0, x n, y 0)).
#[derive(Debug)]
pub struct FileBlocks {
    file: File,
    pub len: u64,
    pub block: u32,
}

impl FileBlocks {
    pub fn open(path: &Path, block: u32) -> Result<Self, DpssError> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        if len == 0 {
            return Err(DpssError::Layout(format!("{} is empty", path.display())));
        }
        Ok(Self { file, len, block })
    }
}

impl TileSource for FileBlocks {
    fn block(&self, id: BlockId) -> Result<Vec<u8>, DpssError> {
        let off = id.x as u64 * self.block as u64;
        if id.level != 0 || id.y != 0 || off >= self.len {
            return Err(DpssError::Layout(format!("block {id} is outside the file")));
        }
        let mut buf = vec![0u8; (self.len - off).min(self.block as u64) as usize];
        self.file.read_exact_at(&mut buf, off)?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_pyramid_cuts_edge_tiles_short_and_halves_each_level() {
        let img =
            Image::from_vec(300, 200, 1, (0..60_000).map(|i| (i % 251) as u8).collect()).unwrap();
        let p = ImagePyramid::new(img.clone(), 256, 2);
        assert_eq!(p.levels[1].width, 150);
        assert_eq!(p.levels[1].height, 100);
        let edge =
            bs_imageio::decode(&p.block(BlockId::new(0, 1, 0)).unwrap(), None, &Limits::default())
                .unwrap();
        assert_eq!((edge.image.width(), edge.image.height()), (44, 200));
        let DynImage::U8(e) = edge.image else { panic!("8-bit") };
        assert_eq!(e.get(0, 0, 0), img.get(256, 0, 0));
        assert!(p.block(BlockId::new(0, 2, 0)).is_err());
        assert!(p.block(BlockId::new(2, 0, 0)).is_err());
    }

    #[test]
    fn a_synthetic_level_samples_the_full_resolution_image() {
        let s = Synthetic { width: 4096, height: 4096, tile: 256 };
        let t =
            bs_imageio::decode(&s.block(BlockId::new(2, 1, 0)).unwrap(), None, &Limits::default())
                .unwrap();
        let DynImage::U8(t) = t.image else { panic!("8-bit") };
        // Level 2 pixel (256, 0) is level 0 pixel (1024, 0): on a grid line.
        assert_eq!([t.get(0, 0, 0), t.get(0, 0, 1), t.get(0, 0, 2)], s.pixel(1024, 0));
        assert!(s.block(BlockId::new(4, 1, 0)).is_err());
    }
}
