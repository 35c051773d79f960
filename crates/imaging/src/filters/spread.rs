//! `spread`: MedJava's and xv's Spread filter, every pixel swapped with a random nearby one
//! (a frosted-glass look). A permutation of the pixels: the colour histogram is preserved
//! exactly.
//!
//! # Definition
//!
//! Let `D` = `distance` and `O` the list of the `2D(D + 1)` offsets `(dx, dy)` with
//! `1 <= |dx| + |dy| <= D` (every pixel within Manhattan distance `D`, the pixel itself
//! excluded), ordered by `dy`, then `dx`, both ascending. A SplitMix64 generator is seeded
//! with `seed`. The pixels are visited once each in row-major order (top row first, left to
//! right); for the pixel at (x, y) one number `r` is drawn from the generator and
//!
//! ```text
//! (dx, dy) = O[⌊r · |O| / 2^64⌋]        (Lemire's multiply-shift reduction)
//! ```
//!
//! and if (x + dx, y + dy) is inside the image, the two pixels are swapped (all channels,
//! alpha included: a pixel moves as a whole); if it is outside, nothing happens (the draw is
//! still used up). Because later pixels see the image as earlier swaps left it, a pixel can
//! travel further than `D` in several hops.
//!
//! The result is fully determined by the image, `distance` and `seed`: it is computed on one
//! thread, in the order above, whatever `--threads` says (a parallel version would need a
//! different, partitioned definition to stay independent of the thread count, and spreading
//! is cheap next to the other filters). SplitMix64 (Steele, Lea and Flood, 2014) is written
//! out here, so the sequence never changes with a dependency's version.
//!
//! **Distance**: the paper describes a random pixel "within a 3×3 matrix"; xv's default is
//! Manhattan distance 5. We follow xv's default: at 3×3 the effect is a barely visible
//! one-pixel jitter on today's megapixel images, while 5 gives the frosted look the filter
//! is for; `distance=1` gives the paper's small-scale spread (its four edge neighbours).
//!
//! **Pixel types**: all (gray8, gray16, rgb8, rgb16, rgba8, rgba16); pixels are only moved.
//!
//! **Parameters** `distance`: 1..=32, default 5; `seed`: any u64 (0..=18446744073709551615),
//! default 0.
//!
//! # Speed
//!
//! One sequential pass of swaps of nearby memory (at most 32 rows away, in cache). A row's
//! draws do not depend on the pixels, so they are made first, for the whole row, in vectors
//! (`draws`: 8 generator steps at a time with AVX-512); the swaps then only look up their
//! offset. Pixels at least `D` from every edge (nearly all of them) skip the bounds test:
//! their table holds each offset's distance in samples. The output is not a copy of the
//! whole image made first: each row is copied in just before the swaps can reach it, while
//! the rows being swapped are in cache, so a big image goes through memory once. Measured
//! (release, one thread of a Zen 5 EPYC VM, `bench filters --quick`): drawing ahead took
//! rgb8 from about 0.36–0.40 Gpixel/s to 0.43–0.46, gray16 from 0.53–0.57 to 0.71–0.75;
//! copying row by row took rgb8 at 2048² from about 0.38 to 0.47 and at 4096² from 0.36 to
//! 0.49 (512² stays at 0.51: it fits in cache either way).

use std::sync::Arc;

use super::common::{SplitMix64, builtin_info, each_depth, multiversion, u64_param, whole};
use crate::error::ImagingError;
use crate::filter::{Filter, FilterInfo, ParamInfo, Run};
use crate::image::{DynImage, Image, Sample};
use crate::params::Params;

/// Add this module's filters to `out`.
pub fn register(out: &mut Vec<Arc<dyn Filter>>) {
    out.push(Arc::new(Spread));
}

/// The `spread` filter (see the module documentation).
pub struct Spread;

/// Largest `distance`.
const MAX_DISTANCE: usize = 32;

impl Filter for Spread {
    fn info(&self) -> FilterInfo {
        builtin_info(
            "spread",
            "swap every pixel with a random one within Manhattan distance D (seeded)",
            vec![
                ParamInfo::number(
                    "distance",
                    5.0,
                    1.0,
                    MAX_DISTANCE as f64,
                    "largest |dx| + |dy| of a swap",
                ),
                ParamInfo::text("seed", "0", "random seed, a u64: the same seed, the same result"),
            ],
        )
    }

    fn apply(&self, img: &DynImage, params: &Params, _run: &Run) -> Result<DynImage, ImagingError> {
        let info = self.info();
        info.check_known(params)?;
        let d = whole(&info, params, "distance")?;
        let seed = u64_param(&info, params, "seed")?;
        Ok(each_depth!(img, i => spread(i, d, seed)))
    }
}

/// The offsets `O` of the module documentation, in order.
fn offsets(d: i64) -> Vec<(i64, i64)> {
    let mut v = Vec::new();
    for dy in -d..=d {
        for dx in -d..=d {
            let m = dx.abs() + dy.abs();
            if (1..=d).contains(&m) {
                v.push((dx, dy));
            }
        }
    }
    v
}

/// The spread of the module documentation.
///
/// # Panics
///
/// If `distance` is not in 1..=32 or the image's fields disagree (see [`Image::from_vec`]).
pub fn spread<T: Sample>(img: &Image<T>, distance: usize, seed: u64) -> Image<T> {
    assert!((1..=MAX_DISTANCE).contains(&distance), "spread distance {distance}");
    let mut out = Image::for_overwrite(img.width, img.height, img.channels);
    match img.channels {
        1 => spread_into::<T, 1>(img, &mut out, distance, seed),
        3 => spread_into::<T, 3>(img, &mut out, distance, seed),
        _ => spread_into::<T, 4>(img, &mut out, distance, seed),
    }
    out
}

/// The spread of `src` into `out` (of the same size, its samples not yet written): each row
/// is copied from `src` just before the first swap that can reach it (the swaps of row `y`
/// reach rows up to `y + d`), so a big image is read from memory once, not copied whole and
/// then read again.
fn spread_into<T: Sample, const C: usize>(
    src: &Image<T>,
    out: &mut Image<T>,
    distance: usize,
    seed: u64,
) {
    let (w, h, d) = (src.width as i64, src.height as i64, distance as i64);
    let row_len = src.width * C;
    let offs = offsets(d);
    let n = offs.len() as u64;
    // Away from the border every offset lands inside: there a draw picks a precomputed
    // distance in samples, with no bounds test and no 2-D arithmetic.
    let rel: Vec<isize> =
        offs.iter().map(|&(dx, dy)| ((dy * w + dx) * C as i64) as isize).collect();
    let mut rng = SplitMix64(seed);
    let data = &mut out.data;
    // Rows [0, copied) of `data` hold `src`'s samples, with the swaps made so far.
    let mut copied = 0;
    // Near the border: the draw's target, if it is inside.
    let target = |x: i64, y: i64, r: u32| {
        let (dx, dy) = offs[r as usize];
        let (tx, ty) = (x + dx, y + dy);
        ((0..w).contains(&tx) && (0..h).contains(&ty)).then(|| ((ty * w + tx) as usize) * C)
    };
    // A row's draws, made ahead of its swaps (they do not depend on the pixels).
    let mut row_draws = vec![0u32; w as usize];
    for y in 0..h {
        let reach = ((y + d + 1).min(h) as usize) * row_len;
        data[copied..reach].copy_from_slice(&src.data[copied..reach]);
        copied = reach;
        draws(&mut rng, n, &mut row_draws);
        let r = &row_draws;
        // Pixels [inner.0, inner.1) of this row are at least `d` from every edge.
        let inner = if y >= d && y + d < h && w > 2 * d { (d, w - d) } else { (w, w) };
        for x in 0..inner.0 {
            if let Some(b) = target(x, y, r[x as usize]) {
                swap_pixels::<T, C>(data, ((y * w + x) as usize) * C, b);
            }
        }
        for x in inner.0..inner.1 {
            let a = ((y * w + x) as usize) * C;
            let b = a.wrapping_add_signed(rel[r[x as usize] as usize]);
            swap_pixels::<T, C>(data, a, b);
        }
        for x in inner.1.max(inner.0)..w {
            if let Some(b) = target(x, y, r[x as usize]) {
                swap_pixels::<T, C>(data, ((y * w + x) as usize) * C, b);
            }
        }
    }
}

/// The next `out.len()` draws of `rng.below(n)`, in order (`0 < n < 2^32`), and `rng`
/// advanced past them: the same numbers as that many calls, made lane by lane in vectors.
/// A 64×64-bit product's high half does not vectorise; `n` < 2^32 lets it be made of two
/// 32×32-bit products (see `draws_body`).
fn draws(rng: &mut SplitMix64, n: u64, out: &mut [u32]) {
    assert!(n > 0 && n < 1 << 32, "draws below {n}");
    draws_built(rng.0, n, out);
    rng.0 = rng.0.wrapping_add((out.len() as u64).wrapping_mul(SplitMix64::GAMMA));
}

multiversion! {
    /// `draws` for the widest build this CPU runs.
    fn draws_built<>(state: u64, n: u64, out: &mut [u32]) => draws_body, avx512
}

#[inline(always)]
fn draws_body(state: u64, n: u64, out: &mut [u32]) {
    for (k, o) in out.iter_mut().enumerate() {
        let z = SplitMix64::mix(state.wrapping_add((k as u64 + 1).wrapping_mul(SplitMix64::GAMMA)));
        // ⌊z·n / 2^64⌋ = ⌊(hi·n + ⌊lo·n / 2^32⌋) / 2^32⌋ for z = hi·2^32 + lo (the dropped
        // fraction of lo·n / 2^32 cannot carry), and neither sum overflows for n < 2^32.
        let (hi, lo) = (z >> 32, z & 0xFFFF_FFFF);
        *o = ((hi * n + ((lo * n) >> 32)) >> 32) as u32;
    }
}

/// Swap the `C` samples of the pixels starting at `a` and `b`.
#[inline(always)]
fn swap_pixels<T: Copy, const C: usize>(data: &mut [T], a: usize, b: usize) {
    let pa: [T; C] = data[a..a + C].try_into().expect("C samples");
    let pb: [T; C] = data[b..b + C].try_into().expect("C samples");
    data[a..a + C].copy_from_slice(&pb);
    data[b..b + C].copy_from_slice(&pa);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::filters::common::testkit::*;

    /// A batch of draws is the same numbers as drawing one at a time, on every build, for
    /// any state (wrapping included) and any table size, and leaves the generator where
    /// one at a time would.
    #[test]
    fn draws_in_a_batch_are_the_draws_one_at_a_time() {
        let cases = (any::<u64>(), 1u64..1 << 32, 0usize..200);
        on_every_build(cases, |(state, n, len)| {
            let (mut batch, mut one) = (SplitMix64(state), SplitMix64(state));
            let mut out = vec![0u32; len];
            draws(&mut batch, n, &mut out);
            let expected: Vec<u32> = (0..len).map(|_| one.below(n) as u32).collect();
            prop_assert_eq!(out, expected);
            prop_assert_eq!(batch.next_u64(), one.next_u64());
            Ok(())
        });
    }

    /// The definition, word for word: every draw bounds-checked in two dimensions.
    fn spread_by_definition(img: &DynImage, d: usize, seed: u64) -> DynImage {
        fn go<T: Sample>(img: &Image<T>, d: usize, seed: u64) -> Image<T> {
            let mut out = img.clone();
            let (w, h, c) = (img.width as i64, img.height as i64, img.channels);
            let offs = offsets(d as i64);
            let mut rng = SplitMix64(seed);
            for y in 0..h {
                for x in 0..w {
                    let (dx, dy) = offs[rng.below(offs.len() as u64) as usize];
                    let (tx, ty) = (x + dx, y + dy);
                    if (0..w).contains(&tx) && (0..h).contains(&ty) {
                        let (a, b) = (((y * w + x) as usize) * c, ((ty * w + tx) as usize) * c);
                        for k in 0..c {
                            out.data.swap(a + k, b + k);
                        }
                    }
                }
            }
            out
        }
        match img {
            DynImage::U8(i) => DynImage::U8(go(i, d, seed)),
            DynImage::U16(i) => DynImage::U16(go(i, d, seed)),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        /// The fast path inside the border swaps exactly what the definition swaps, on
        /// images wide and tall enough to have an inside (and on those that have none).
        #[test]
        fn the_inside_fast_path_is_the_definition(
            img in any_image(90, 70), d in 1usize..=12, seed in any::<u64>()
        ) {
            let params = [("distance", d.to_string()), ("seed", seed.to_string())];
            let p: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let out = apply(&Spread, &img, &p);
            prop_assert_eq!(out, spread_by_definition(&img, d, seed));
        }
    }

    #[test]
    fn offsets_are_the_diamond() {
        assert_eq!(offsets(1), [(0, -1), (-1, 0), (1, 0), (0, 1)]);
        let o = offsets(5);
        assert_eq!(o.len(), 2 * 5 * 6);
        assert!(o.iter().all(|&(x, y)| (1..=5).contains(&(x.abs() + y.abs()))));
        assert_eq!(offsets(32).len(), 2 * 32 * 33);
    }

    // Expected images computed independently (a few lines of Python implementing the
    // definition: SplitMix64, the offset list, the scan) for the test images below.

    #[test]
    fn gray8_every_pixel() {
        let img = img8(3, 3, 1, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let out = apply(&Spread, &img, &[("distance", "1")]);
        assert_eq!(data8(&out), EXPECT_3X3_D1_SEED0);
        let out = apply(&Spread, &img, &[("distance", "2"), ("seed", "42")]);
        assert_eq!(data8(&out), EXPECT_3X3_D2_SEED42);
    }

    #[test]
    fn gray16_and_rgba_move_whole_pixels() {
        let img = img16(3, 3, 1, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let out = apply(&Spread, &img, &[("distance", "1")]);
        let expect: Vec<u16> = EXPECT_3X3_D1_SEED0.iter().map(|&v| v as u16).collect();
        assert_eq!(data16(&out), expect);
        // RGBA: the same permutation, each pixel's four samples together.
        let px: Vec<u8> = (1..=9).flat_map(|i| [i, 10 * i, 100 + i, 200 + i]).collect();
        let out = data8(&apply(&Spread, &img8(3, 3, 4, &px), &[("distance", "1")]));
        let expect: Vec<u8> =
            EXPECT_3X3_D1_SEED0.iter().flat_map(|&i| [i, 10 * i, 100 + i, 200 + i]).collect();
        assert_eq!(out, expect);
    }

    const EXPECT_3X3_D1_SEED0: [u8; 9] = [2, 5, 3, 1, 6, 9, 7, 8, 4];
    const EXPECT_3X3_D2_SEED42: [u8; 9] = [1, 2, 3, 7, 5, 6, 9, 8, 4];

    #[test]
    fn default_distance_every_pixel() {
        // 5×4 with the defaults (distance 5, seed 0).
        let img = img8(5, 4, 1, &(0..20).collect::<Vec<u8>>());
        let expect = [0, 1, 2, 3, 4, 5, 6, 16, 18, 9, 8, 11, 14, 13, 12, 7, 17, 15, 10, 19];
        assert_eq!(data8(&apply(&Spread, &img, &[])), expect);
    }

    #[test]
    fn bad_parameters_are_errors() {
        let img = img8(2, 2, 1, &[0; 4]);
        for (k, v) in [
            ("distance", "0"),
            ("distance", "33"),
            ("distance", "1.5"),
            ("seed", "-1"),
            ("seed", "1.5"),
            ("seed", "18446744073709551616"),
            ("seed", "x"),
        ] {
            let e = Spread.apply(&img, &Params::new().with(k, v), &Run::single());
            assert!(matches!(e, Err(ImagingError::BadParam { .. })), "{k}={v}: {e:?}");
        }
        let p = Params::new().with("seed", u64::MAX);
        assert!(Spread.apply(&img, &p, &Run::single()).is_ok());
        let e = Spread.apply(&img, &Params::new().with("radius", 3), &Run::single());
        assert!(matches!(e, Err(ImagingError::UnknownParam { .. })));
    }

    #[test]
    fn tiny_and_broken_images() {
        for img in tiny_images() {
            for d in [1, 5, 32] {
                let out = Spread.apply(&img, &Params::new().with("distance", d), &Run::single());
                assert_eq!(sorted_pixels(&out.unwrap()), sorted_pixels(&img));
            }
        }
        for img in broken_images() {
            let e = Spread.apply(&img, &Params::new(), &Run::single());
            assert!(matches!(e, Err(ImagingError::InvalidImage(_))));
        }
    }

    /// The multiset of pixels (each as its samples).
    fn sorted_pixels(img: &DynImage) -> Vec<Vec<u16>> {
        let c = img.channels();
        let mut v: Vec<Vec<u16>> = match img {
            DynImage::U8(i) => {
                i.data.chunks(c).map(|p| p.iter().map(|&s| s as u16).collect()).collect()
            }
            DynImage::U16(i) => i.data.chunks(c).map(|p| p.to_vec()).collect(),
        };
        v.sort();
        v
    }

    proptest! {
        #[test]
        fn preserves_the_histogram(img in any_image(30, 30), d in 1usize..=32, seed in any::<u64>()) {
            let p = Params::new().with("distance", d).with("seed", seed);
            let out = Spread.apply(&img, &p, &Run::single()).unwrap();
            prop_assert_eq!(sorted_pixels(&out), sorted_pixels(&img));
        }

        #[test]
        fn deterministic_for_a_seed(img in any_image(20, 20), d in 1usize..=8, seed in any::<u64>()) {
            let p = Params::new().with("distance", d).with("seed", seed);
            let a = Spread.apply(&img, &p, &Run::single()).unwrap();
            let b = Spread.apply(&img, &p, &Run::single()).unwrap();
            prop_assert_eq!(a, b);
            same_on_threads(&Spread, &img, &p);
        }
    }

    #[test]
    fn the_seed_chooses_the_swaps() {
        // Determinism alone would also hold for a filter that ignored its seed: on an image of
        // distinct pixels, different seeds must give different results.
        let data: Vec<u8> = (0..=255).collect();
        let img = img8(16, 16, 1, &data);
        let outs: std::collections::HashSet<Vec<u8>> = (0..4u64)
            .map(|seed| data8(&apply(&Spread, &img, &[("seed", &seed.to_string())])))
            .collect();
        assert_eq!(outs.len(), 4, "every seed gives its own arrangement");
        assert!(!outs.contains(&data), "pixels moved");
    }
}
