//! Deterministic test images: a photo-like RGB test card and a CT-like 16-bit phantom, with
//! noise, so filters meet edges, gradients and texture rather than flat colour.

use std::io::Write;
use std::path::Path;

use bs_imaging::{DynImage, Image};

/// A small LCG: the same pixels on every run and machine.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
}

/// `side`×`side` image of kind "rgb8" (test card) or "gray16" (phantom).
pub fn test_image(side: usize, pixel: &str) -> DynImage {
    let mut noise = Noise(side as u64);
    let c = side as f64 / 2.0;
    match pixel {
        "gray16" => {
            let mut img = Image::<u16>::new(side, side, 1);
            for y in 0..side {
                for x in 0..side {
                    let (dx, dy) = ((x as f64 - c) / c, (y as f64 - c) / c);
                    let r2 = dx * dx + dy * dy;
                    // Air outside, soft tissue inside, a bright "bone" ring and two lesions.
                    // Values span most of the 16-bit range, like a 16-bit scanner's output.
                    let mut v = if r2 > 0.81 { 400.0 } else { 16_600.0 };
                    if (0.64..0.72).contains(&r2) {
                        v = 58_000.0;
                    }
                    if (dx - 0.3).powi(2) + dy * dy < 0.01
                        || (dx + 0.35).powi(2) + (dy - 0.2).powi(2) < 0.004
                    {
                        v = 21_000.0;
                    }
                    v += (noise.next() % 640) as f64;
                    img.data[y * side + x] = v as u16;
                }
            }
            DynImage::U16(img)
        }
        _ => {
            let mut img = Image::<u8>::new(side, side, 3);
            for y in 0..side {
                for x in 0..side {
                    let i = (y * side + x) * 3;
                    let band = x * 8 / side.max(1);
                    let bars = [
                        [255, 255, 255],
                        [255, 255, 0],
                        [0, 255, 255],
                        [0, 255, 0],
                        [255, 0, 255],
                        [255, 0, 0],
                        [0, 0, 255],
                        [16, 16, 16],
                    ];
                    let mut px = if y < side / 2 {
                        bars[band]
                    } else {
                        let g = (x * 255 / side.max(1)) as u8;
                        [g, (y * 255 / side.max(1)) as u8, 255 - g]
                    };
                    let (dx, dy) = (x as f64 - c, y as f64 - c);
                    if (dx * dx + dy * dy).sqrt() < c / 3.0 && (x / 8 + y / 8) % 2 == 0 {
                        px = [20, 20, 20];
                    }
                    for (k, v) in px.iter().enumerate() {
                        let n = (noise.next() % 17) as i32 - 8;
                        img.data[i + k] = (*v as i32 + n).clamp(0, 255) as u8;
                    }
                }
            }
            DynImage::U8(img)
        }
    }
}

/// Samples as raw bytes (u16 little-endian) for the Python side.
pub fn write_raw(img: &DynImage, path: &Path) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    match img {
        DynImage::U8(i) => f.write_all(&i.data)?,
        DynImage::U16(i) => {
            for v in &i.data {
                f.write_all(&v.to_le_bytes())?;
            }
        }
    }
    f.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_images_are_deterministic_and_varied() {
        for pixel in ["rgb8", "gray16"] {
            let a = test_image(64, pixel);
            assert_eq!(a, test_image(64, pixel));
            assert_eq!((a.width(), a.height()), (64, 64));
            let distinct = match &a {
                DynImage::U8(i) => i.data.iter().collect::<std::collections::HashSet<_>>().len(),
                DynImage::U16(i) => i.data.iter().collect::<std::collections::HashSet<_>>().len(),
            };
            assert!(distinct > 20, "{pixel}: {distinct} distinct values");
        }
    }
}
