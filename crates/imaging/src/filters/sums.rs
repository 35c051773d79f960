//! Sums of samples over windows in the narrowest integer type that holds them (16 bits for
//! 8-bit samples where they fit, twice the lanes per vector; else 32), and their exact
//! division rounding half up, in forms that vectorise. Shared by the box filters (`blur`)
//! and the block means (`pixelize`).

use super::common::{Div, wrapping_sums};
use crate::image::Sample;

/// The integer type sums are kept in. Arithmetic wraps: every true window sum fits, so
/// differences of wrapped (prefix) sums are exact.
pub(crate) trait Acc: Copy + Default + Send + Sync {
    fn of<T: Sample>(v: T) -> Self;
    /// The sum as a number.
    fn get(self) -> u32;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    /// The divider for windows of `d` samples (sums up to `d * max`).
    fn div_for(d: u32, max: u32) -> Div;
    /// `(s + half) · m >> k` for a divider of [`Acc::div_for`].
    fn divide(self, d: Div) -> u32;
    /// A divider for windows of a few samples, in a form that vectorises with as many lanes
    /// as the sums have.
    type Fast: Copy + Send + Sync;
    /// The [`Acc::Fast`] divider for windows of `d` samples whose sums are at most `max`, if
    /// this type has an exact one (16 bits: `d <= 128` at least for 8-bit samples; 32 bits:
    /// `d <= 25`).
    fn try_fast_for(d: u32, max: u32) -> Option<Self::Fast>;
    /// [`Acc::try_fast_for`], for a window it is known to serve.
    fn fast_for(d: u32, max: u32) -> Self::Fast {
        Self::try_fast_for(d, max).unwrap_or_else(|| panic!("no fast divider for {d}"))
    }
    /// The same quotient as [`Acc::divide`] with the divider of [`Acc::fast_for`].
    fn divide_fast(self, f: Self::Fast) -> u32;
}

/// Division of 16-bit sums as a 16-bit high multiply and a shift: `Div`'s method with the
/// exponent raised to at least 16 (any `k` with `2^k > Y·d` is exact, see `common::Div`),
/// so that `(y · m) >> 16` is one `pmulhuw` on 16 lanes.
#[derive(Clone, Copy)]
pub(crate) struct Div16 {
    half: u16,
    m: u16,
    shift: u32,
}

/// Division of sums below 2^24 by `d <= 25` in single precision: with `y = s + ⌊d/2⌋`,
/// `q = ⌊t⌋` for `t = y · fl(1/d) + 1/(2d)`. `y/d = q + f/d` for a whole `f < d`, so the exact
/// value of `t` lies in `[q + 1/(2d), q + 1 − 1/(2d)]`, and the rounding errors of the
/// operations (each below 2^−24 relative, on values below 2^16 + 1: under 0.012 in all) stay
/// below `1/(2d) >= 0.02`. Both builds use the same IEEE operations (no fused multiply-add), so
/// the result is the same on every CPU; `fast_division_is_exact` checks every sum of every
/// window it serves.
#[derive(Clone, Copy)]
pub(crate) struct DivF32 {
    half: u32,
    inv: f32,
    bias: f32,
}

impl Acc for u16 {
    wrapping_sums!(u16);
    #[inline(always)]
    fn get(self) -> u32 {
        self as u32
    }
    fn div_for(d: u32, max: u32) -> Div {
        let div = Div::new(d, max);
        // Numerators below 2^16 and products below 2^32: 32-bit arithmetic suffices.
        assert!(
            max + div.half < 1 << 16 && (max + div.half) as u64 * div.m as u64 <= u32::MAX as u64
        );
        div
    }
    #[inline(always)]
    fn divide(self, d: Div) -> u32 {
        (self.wrapping_add(d.half as u16) as u32 * d.m) >> d.k
    }
    type Fast = Div16;
    fn try_fast_for(d: u32, max: u32) -> Option<Div16> {
        let div = Div::new(d, max);
        let k = div.k.max(16);
        let m = (1u64 << k) / d as u64 + 1;
        (max + div.half < 1 << 16 && m < 1 << 16 && k < 32).then_some(Div16 {
            half: div.half as u16,
            m: m as u16,
            shift: k - 16,
        })
    }
    #[inline(always)]
    fn divide_fast(self, f: Div16) -> u32 {
        let hi = ((self.wrapping_add(f.half) as u32 * f.m as u32) >> 16) as u16;
        (hi >> f.shift) as u32
    }
}

impl Acc for u32 {
    wrapping_sums!(u32);
    #[inline(always)]
    fn get(self) -> u32 {
        self
    }
    fn div_for(d: u32, max: u32) -> Div {
        Div::new(d, max)
    }
    #[inline(always)]
    fn divide(self, d: Div) -> u32 {
        d.apply(self)
    }
    type Fast = DivF32;
    fn try_fast_for(d: u32, max: u32) -> Option<DivF32> {
        (d <= 25 && max / d <= 65535).then(|| DivF32 {
            half: d / 2,
            inv: 1.0 / d as f32,
            bias: 0.5 / d as f32 - 0.5,
        })
    }
    #[inline(always)]
    fn divide_fast(self, f: DivF32) -> u32 {
        // Rounding `t − ½` to the nearest integer gives ⌊t⌋ (t is never within 1/(2d) of a
        // whole number); adding 1.5·2^23 does that rounding (one unit in the last place there
        // is 1) and leaves the integer in the low mantissa bits. Unlike `as`, whose saturation
        // does not vectorise, these are plain vector operations.
        const MAGIC: f32 = 12_582_912.0;
        let t = (self + f.half) as i32 as f32 * f.inv + f.bias;
        (t + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sum of every window a fast divider serves gives `Div`'s quotient, which is the
    /// mean rounded half up: 8-bit windows up to 16×16 samples in 16 bits (those it has a
    /// divider for: every size from 2 to 128), 16-bit windows up to 25 samples in single precision.
    #[test]
    fn fast_division_is_exact() {
        for d in 1..=256u32 {
            let Some(f8) = u16::try_fast_for(d, d * 255) else {
                assert!(d == 1 || d > 128, "no 16-bit divider for {d}");
                continue;
            };
            let d8 = u16::div_for(d, d * 255);
            for s in 0..=d * 255 {
                assert_eq!((s as u16).divide_fast(f8), (s as u16).divide(d8), "{s}/{d}");
                assert_eq!((s as u16).divide(d8), (s + d / 2) / d);
            }
        }
        assert!(u32::try_fast_for(26, 26 * 65535).is_none());
        for d in 1..=25u32 {
            let (f16, d16) = (u32::fast_for(d, d * 65535), u32::div_for(d, d * 65535));
            for s in 0..=d * 65535 {
                assert_eq!(s.divide_fast(f16), s.divide(d16), "{s}/{d}");
                assert_eq!(s.divide(d16), (s + d / 2) / d);
            }
        }
    }
}
