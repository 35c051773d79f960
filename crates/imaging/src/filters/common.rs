//! What the eight MedJava/xv filters (blur, despeckle, sharpen, edge, emboss, oilpaint,
//! pixelize, spread) share: their [`FilterInfo`] shape, whole-number parameters, a check that
//! rejects inconsistent images before any indexing, row bands for running sums, exact integer
//! division by a run-time constant without a divide instruction ([`Div`]), xv's grey, a small
//! seedable PRNG, and, for tests, small-image helpers and proptest strategies.

use crate::error::ImagingError;
use crate::filter::{FilterInfo, ParamInfo, Run};
use crate::image::{Image, Sample};
use crate::params::Params;

/// The [`FilterInfo`] of a built-in filter.
pub(crate) fn builtin_info(name: &str, summary: &str, params: Vec<ParamInfo>) -> FilterInfo {
    FilterInfo {
        name: name.into(),
        summary: summary.into(),
        params,
        kind: "builtin".into(),
        source: None,
    }
}

fn bad(info: &FilterInfo, name: &str, reason: String) -> ImagingError {
    ImagingError::BadParam { filter: info.name.clone(), param: name.to_string(), reason }
}

/// A numeric parameter that must be a whole number inside its declared range.
pub(crate) fn whole(info: &FilterInfo, p: &Params, name: &str) -> Result<usize, ImagingError> {
    let v = info.number(p, name)?;
    if v.fract() != 0.0 {
        return Err(bad(info, name, format!("{v} is not a whole number")));
    }
    // In range (checked by `number`), and every declared range is small and non-negative.
    Ok(v as usize)
}

/// A whole-number parameter that must also be odd (a window size).
pub(crate) fn odd(info: &FilterInfo, p: &Params, name: &str) -> Result<usize, ImagingError> {
    let v = whole(info, p, name)?;
    if v % 2 == 0 {
        return Err(bad(info, name, format!("{v} is not odd (a window has a centre)")));
    }
    Ok(v)
}

/// A `u64` parameter given as text (too wide for the `f64` ranges of [`ParamInfo::number`]).
pub(crate) fn u64_param(info: &FilterInfo, p: &Params, name: &str) -> Result<u64, ImagingError> {
    let text = info.text(p, name);
    text.parse::<u64>()
        .map_err(|_| bad(info, name, format!("{text:?} is not a whole number in 0..=2^64-1")))
}

/// Reject an image whose fields disagree (they are public), so that no filter indexes out of
/// bounds (see [`Image::validate`]).
pub(crate) fn check_image<T: Sample>(img: &Image<T>) -> Result<(), ImagingError> {
    img.validate()
}

/// Apply `$e` (an expression over the `Image<T>` bound to `$i`) to a [`DynImage`] of either
/// depth, after [`check_image`]: the dispatch every single-image filter starts with.
macro_rules! each_depth {
    ($img:expr, $i:ident => $e:expr) => {
        match $img {
            $crate::image::DynImage::U8($i) => {
                $crate::filters::common::check_image($i)?;
                $crate::image::DynImage::U8($e)
            }
            $crate::image::DynImage::U16($i) => {
                $crate::filters::common::check_image($i)?;
                $crate::image::DynImage::U16($e)
            }
        }
    };
}
pub(crate) use each_depth;

/// Call `f(y0, band)` for bands of whole rows of `out` (rows of `row_len` samples), where
/// `band` holds output rows `y0..y0 + band.len() / row_len`. Filters that keep running sums
/// or scratch rows use bands so that state lives for many rows; bands run in parallel on
/// `run`'s threads (about four per thread). Results never depend on the banding.
pub(crate) fn bands<T: Send>(
    run: &Run,
    out: &mut [T],
    row_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if row_len == 0 || out.is_empty() {
        return;
    }
    // A small output stays on the calling thread whatever the run asks.
    let run = if out.len() < PARALLEL_MIN { Run::single() } else { *run };
    let rows = out.len() / row_len;
    let per = rows.div_ceil(run.thread_count() * 4).max(1);
    run.rows(out, per * row_len, |b, band| f(b * per, band));
}

/// Image outputs of fewer samples than this are computed on the calling thread (see
/// [`bands`]): waking a pool and handing out bands costs tens of microseconds, as long as a
/// fast filter takes on a whole 512² grey image. A 512² RGB image (786,432 samples, about
/// 0.15 ms of blur) is split: on two threads blur went from 1640 to 2745 Mpixel/s and
/// despeckle from 1634 to 3726 (`bench filters`). Unit tests split even tiny images, so that
/// the tests comparing thread counts exercise the parallel path.
const PARALLEL_MIN: usize = if cfg!(test) { 1 } else { 1 << 19 };

/// `(start, len)` pieces covering `0..len` for a loop over whole blocks of `block` samples:
/// the longest prefix that is a whole number of blocks, then, if samples remain, the last
/// `block` samples, overlapping it (`len < block`: the whole, as one short piece). Vectorised
/// loops over the pieces never fall back to a scalar remainder loop (in blur's fused pass at
/// 512 samples a row, 30 scalar samples took a sixth of the time). Outputs in the overlap
/// are computed twice, so only pure outputs can be pieced so (not sums updated in place).
pub(crate) fn block_pieces(len: usize, block: usize) -> [(usize, usize); 2] {
    if len < block {
        return [(0, len), (len, 0)];
    }
    let whole = len / block * block;
    [(0, whole), if whole == len { (len, 0) } else { (len - block, block) }]
}

/// The builds of inner loops, from the target's baseline (SSE2 on x86-64) up.
///
/// Filters compile their hot band function twice from one `#[inline(always)]` body — for the
/// baseline and with `#[target_feature(enable = "avx2")]` — and those that gain from it a
/// third time with AVX-512 (F, BW, VL, DQ), so the same loops vectorise with two and four
/// times the lanes, with the 16-bit
/// min/max and 32-bit multiplies SSE2 lacks, and with AVX-512's masked tails and wider
/// shuffles. Every build is integer code or IEEE arithmetic without fused operations (Rust
/// never contracts `a * b + c` on its own), so they give bit-identical results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    Baseline = 0,
    Avx2 = 1,
    Avx512 = 2,
}

/// The widest build this CPU runs (a cached check), lowered while a test forces a narrower
/// one (see `testkit::on_every_build`).
#[inline]
pub(crate) fn isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    let native = {
        use std::arch::is_x86_feature_detected as has;
        // Everything the AVX-512 build enables, what `avx512f` implies (`fma`, `f16c`) too.
        if has!("avx2")
            && has!("fma")
            && has!("f16c")
            && has!("avx512f")
            && has!("avx512bw")
            && has!("avx512vl")
            && has!("avx512dq")
        {
            Isa::Avx512
        } else if has!("avx2") {
            Isa::Avx2
        } else {
            Isa::Baseline
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let native = Isa::Baseline;
    #[cfg(test)]
    {
        let forced = match FORCE_AT_MOST.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Some(Isa::Baseline),
            1 => Some(Isa::Avx2),
            2 => Some(Isa::Avx512),
            _ => None,
        };
        if let Some(f) = forced {
            return native.min(f);
        }
    }
    native
}

/// While set (tests set it, see `testkit::on_every_build`), no build wider than this one
/// (`Isa as usize`) runs. Other tests running meanwhile are unaffected: every build gives the
/// same results.
#[cfg(test)]
pub(crate) static FORCE_AT_MOST: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(NOT_FORCED);

#[cfg(test)]
pub(crate) const NOT_FORCED: usize = usize::MAX;

/// Whether this CPU runs 512-bit vectors at full width: Intel's AVX-512 cores, and AMD's
/// Zen 5 in its EPYC 9005 (family 0x1A, models 0x00–0x1F) and Ryzen 9000 desktop (models
/// 0x40–0x4F) parts. AMD's Zen 4 (family 0x19) executes each 512-bit operation as two
/// 256-bit halves, as do Zen 5's mobile parts. The 3×3 median and small blurs measured
/// slower with AVX-512 than with AVX2 on a Zen 4 EPYC, and faster on an Intel Xeon
/// (despeckle rgb8 about +20% at 512² and +40% at 2048², blur rgb8 +15–30%) and on a Zen 5
/// EPYC (blur +25–40%, despeckle gray16 at 512² +25%; one thread, alternating runs of each
/// build).
pub(crate) fn full_width_512() -> bool {
    static FULL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FULL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // `__cpuid` is a safe function from Rust 1.94 on, an unsafe one before.
            #[allow(unused_unsafe)]
            // SAFETY: every x86-64 CPU has the CPUID instruction, and leaves 0 and 1 always
            // exist.
            let (vendor, signature) = unsafe {
                let v = std::arch::x86_64::__cpuid(0);
                (
                    // The vendor string in EBX, EDX, ECX: "GenuineIntel", "AuthenticAMD".
                    [v.ebx, v.edx, v.ecx],
                    std::arch::x86_64::__cpuid(1).eax,
                )
            };
            const INTEL: [u32; 3] = [0x756e_6547, 0x4965_6e69, 0x6c65_746e];
            const AMD: [u32; 3] = [0x6874_7541, 0x6974_6e65, 0x444d_4163];
            let (family, model) = family_model(signature);
            vendor == INTEL
                || (vendor == AMD && family == 0x1A && matches!(model, 0x00..=0x1F | 0x40..=0x4F))
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// The family and model in CPUID leaf 1's EAX: the extended fields count only where the base
/// family is 0xF (the family) or 0x6 or 0xF (the model).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn family_model(eax: u32) -> (u32, u32) {
    let (base_family, base_model) = ((eax >> 8) & 0xF, (eax >> 4) & 0xF);
    let family = if base_family == 0xF { base_family + ((eax >> 20) & 0xFF) } else { base_family };
    let model = if matches!(base_family, 0x6 | 0xF) {
        base_model | (((eax >> 16) & 0xF) << 4)
    } else {
        base_model
    };
    (family, model)
}

/// Where a `multiversion!` definition's AVX-512 build runs (on a CPU that has it), by the name
/// the definition ends in.
pub(crate) mod wide {
    /// `, avx512`: wherever the CPU has AVX-512.
    #[inline(always)]
    pub(crate) fn avx512() -> bool {
        true
    }

    /// `, avx512_full_width`: only where 512-bit vectors run at full width
    /// ([`super::full_width_512`]) — and on any CPU with AVX-512 while a test forces the
    /// builds in turn (`testkit::on_every_build`), so that build is tested everywhere it can
    /// run (every build gives the same results, so other tests meanwhile are unaffected).
    #[inline(always)]
    pub(crate) fn avx512_full_width() -> bool {
        #[cfg(test)]
        if super::FORCE_AT_MOST.load(std::sync::atomic::Ordering::Relaxed) != super::NOT_FORCED {
            return true;
        }
        super::full_width_512()
    }
}

/// Define `$name`, which runs the `#[inline(always)]` function `$body` compiled for the widest
/// build [`isa`] allows (see [`Isa`]), up to AVX2 — or up to AVX-512 when the definition ends
/// in `, avx512` (for the filters measured faster so on every CPU tried) or
/// `, avx512_full_width` (faster where 512-bit vectors run at full width, slower elsewhere: see
/// [`full_width_512`]). Only those get an AVX-512 build at all.
macro_rules! multiversion {
    ($(#[$m:meta])* fn $name:ident<$($g:ident: $b:path $(| $bb:path)*),*>($($a:ident: $t:ty),* $(,)?) $(-> $ret:ty)? => $body:ident, $wide:ident) => {
        $(#[$m])*
        fn $name<$($g: $b $(+ $bb)*),*>($($a: $t),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")]
                fn avx512<$($g: $b $(+ $bb)*),*>($($a: $t),*) $(-> $ret)? {
                    $body::<$($g),*>($($a),*)
                }
                if $crate::filters::common::isa() == $crate::filters::common::Isa::Avx512
                    && $crate::filters::common::wide::$wide()
                {
                    // SAFETY: `isa` has checked that this CPU has every feature enabled above.
                    return unsafe { avx512::<$($g),*>($($a),*) };
                }
            }
            $crate::filters::common::multiversion!(@narrow [$($g: $b $(| $bb)*),*] [$($a: $t),*] [$($ret)?] $body)
        }
    };
    ($(#[$m:meta])* fn $name:ident<$($g:ident: $b:path $(| $bb:path)*),*>($($a:ident: $t:ty),* $(,)?) $(-> $ret:ty)? => $body:ident) => {
        $(#[$m])*
        fn $name<$($g: $b $(+ $bb)*),*>($($a: $t),*) $(-> $ret)? {
            $crate::filters::common::multiversion!(@narrow [$($g: $b $(| $bb)*),*] [$($a: $t),*] [$($ret)?] $body)
        }
    };
    // The AVX2 build when the CPU has AVX2 (and no wider build ran), else the baseline.
    (@narrow [$($g:ident: $b:path $(| $bb:path)*),*] [$($a:ident: $t:ty),*] [$($ret:ty)?] $body:ident) => {{
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx2")]
            fn avx2<$($g: $b $(+ $bb)*),*>($($a: $t),*) $(-> $ret)? {
                $body::<$($g),*>($($a),*)
            }
            if $crate::filters::common::isa() >= $crate::filters::common::Isa::Avx2 {
                // SAFETY: `isa` has checked that this CPU supports AVX2.
                return unsafe { avx2::<$($g),*>($($a),*) };
            }
        }
        $body::<$($g),*>($($a),*)
    }};
}
pub(crate) use multiversion;

/// Copy the alpha samples (every 4th) of `src` into `dst`; nothing for 1 or 3 channels.
pub(crate) fn copy_alpha<T: Copy>(dst: &mut [T], src: &[T], channels: usize) {
    if channels == 4 {
        for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
            d[3] = s[3];
        }
    }
}

/// The part of a filter's sum type (its `Acc` trait: `sums::Acc`, edge's) that is the same
/// for every integer type: a sample as that type, and wrapping addition and subtraction
/// (every true sum fits, so wrapped intermediate sums give exact results).
macro_rules! wrapping_sums {
    ($t:ty) => {
        #[inline(always)]
        fn of<T: $crate::image::Sample>(v: T) -> Self {
            v.to_u32() as $t
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            self.wrapping_add(o)
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            self.wrapping_sub(o)
        }
    };
}
pub(crate) use wrapping_sums;

/// Ask the CPU to bring `data` into its first-level cache ahead of use (a hint: nothing is
/// read, nothing can fault), for access patterns the hardware prefetchers do not run far
/// ahead on: pixelize reads a block of rows, computes, then writes, and fetches the next
/// block's rows while writing.
#[inline(always)]
pub(crate) fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let bytes = data.as_ptr().cast::<i8>();
        for at in (0..std::mem::size_of_val(data)).step_by(64) {
            // SAFETY: a prefetch is only a hint; it never faults, whatever the address, and
            // `at` stays inside `data` anyway. (`unsafe` only because the intrinsic needs
            // SSE, which every x86-64 CPU has.)
            unsafe { _mm_prefetch::<_MM_HINT_T0>(bytes.add(at)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// xv's grey of a colour: `(11 R + 16 G + 5 B) >> 5`.
#[inline(always)]
pub(crate) fn grey(r: u32, g: u32, b: u32) -> u32 {
    (11 * r + 16 * g + 5 * b) >> 5
}

/// Division by a run-time constant `d`, rounding half up: `(x + d / 2) / d`, exact for every
/// `x <= max_num`, computed as a multiply and a shift (which vectorises; a divide does not).
///
/// With `y = x + d/2 <= Y`, `k` the smallest power with `2^k > Y·d` and
/// `m = ⌊2^k / d⌋ + 1 = (2^k + e)/d` (`1 <= e <= d`): `y·m / 2^k = y/d + y·e/(d·2^k)`, and
/// `y·e/2^k < 1`, so the fraction `(y mod d + y·e/2^k)/d` stays below 1 and the floor is
/// `⌊y/d⌋`. `m <= 2Y + 1`, so for the sums used here (`Y < 2^27`) `m` fits in 32 bits and
/// `y·m` in 64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Div {
    pub half: u32,
    pub m: u32,
    pub k: u32,
}

impl Div {
    pub fn new(d: u32, max_num: u32) -> Self {
        assert!(d > 0);
        let half = d / 2;
        let y = (max_num as u64 + half as u64) * d as u64;
        let k = 64 - y.leading_zeros();
        let m = (1u64 << k) / d as u64 + 1;
        assert!(m <= u32::MAX as u64 && k < 64, "Div::new({d}, {max_num}) out of range");
        Self { half, m: m as u32, k }
    }

    #[inline(always)]
    pub fn apply(self, x: u32) -> u32 {
        (((x + self.half) as u64 * self.m as u64) >> self.k) as u32
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, fast, well-mixed PRNG; the same seed always
/// gives the same sequence on every platform.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The step the state advances by per number.
    pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

    /// The next number. Filters draw in batches (`spread::draws`); this one-at-a-time form
    /// is the definition their tests check those against.
    #[cfg(test)]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(Self::GAMMA);
        Self::mix(self.0)
    }

    /// The number a state gives (the generator's output function).
    #[inline(always)]
    pub fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`) by Lemire's multiply-shift: `⌊r·n / 2^64⌋`.
    #[cfg(test)]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

#[cfg(test)]
pub(crate) mod testkit {
    //! Small-image helpers and proptest strategies for the filters' tests.

    use proptest::prelude::*;

    use crate::filter::{Filter, Run};
    use crate::image::{DynImage, Image};
    use crate::params::Params;

    pub fn img8(w: usize, h: usize, c: usize, data: &[u8]) -> DynImage {
        DynImage::U8(Image::from_vec(w, h, c, data.to_vec()).unwrap())
    }

    pub fn img16(w: usize, h: usize, c: usize, data: &[u16]) -> DynImage {
        DynImage::U16(Image::from_vec(w, h, c, data.to_vec()).unwrap())
    }

    /// Apply with the given parameters on one thread, panicking on error.
    pub fn apply(f: &dyn Filter, img: &DynImage, params: &[(&str, &str)]) -> DynImage {
        let mut p = Params::new();
        for (k, v) in params {
            p = p.with(k, v);
        }
        f.apply(img, &p, &Run::single()).unwrap()
    }

    pub fn data8(img: &DynImage) -> Vec<u8> {
        match img {
            DynImage::U8(i) => i.data.clone(),
            DynImage::U16(_) => panic!("expected an 8-bit image"),
        }
    }

    pub fn data16(img: &DynImage) -> Vec<u16> {
        match img {
            DynImage::U16(i) => i.data.clone(),
            DynImage::U8(_) => panic!("expected a 16-bit image"),
        }
    }

    /// Any image up to `max_w`×`max_h` (sizes from 1), 1, 3 or 4 channels, 8 or 16 bits.
    /// Samples come from a few values half of the time, so that ties and flat areas occur.
    pub fn any_image(max_w: usize, max_h: usize) -> impl Strategy<Value = DynImage> {
        (
            1..=max_w,
            1..=max_h,
            prop::sample::select(vec![1usize, 3, 4]),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_flat_map(|(w, h, c, wide, few)| {
                let n = w * h * c;
                let samples = if few {
                    prop::collection::vec(
                        prop::sample::select(vec![0u16, 1, 2, 254, 255, 65535]),
                        n,
                    )
                    .boxed()
                } else {
                    prop::collection::vec(any::<u16>(), n).boxed()
                };
                samples.prop_map(move |v| {
                    if wide {
                        DynImage::U16(Image::from_vec(w, h, c, v).unwrap())
                    } else {
                        let v = v.into_iter().map(|s| (s & 0xff) as u8).collect();
                        DynImage::U8(Image::from_vec(w, h, c, v).unwrap())
                    }
                })
            })
    }

    /// A constant image (every pixel the same colour).
    pub fn constant_image(max_w: usize, max_h: usize) -> impl Strategy<Value = DynImage> {
        (
            1..=max_w,
            1..=max_h,
            prop::sample::select(vec![1usize, 3, 4]),
            any::<bool>(),
            any::<[u16; 4]>(),
        )
            .prop_map(|(w, h, c, wide, px)| {
                let v: Vec<u16> = (0..w * h).flat_map(|_| px[..c].to_vec()).collect();
                if wide {
                    DynImage::U16(Image::from_vec(w, h, c, v).unwrap())
                } else {
                    let v = v.into_iter().map(|s| s as u8).collect();
                    DynImage::U8(Image::from_vec(w, h, c, v).unwrap())
                }
            })
    }

    /// Applying `f` on 1 and on 3 threads gives the same image (or the same error).
    pub fn same_on_threads(f: &dyn Filter, img: &DynImage, p: &Params) {
        let one = f.apply(img, p, &Run::single());
        let three = f.apply(img, p, &Run::with_threads(3));
        match (one, three) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            (a, b) => panic!("1 thread: {a:?}, 3 threads: {b:?}"),
        }
    }

    /// Run proptest cases of `strategy` through `check` with every build of the inner loops
    /// this CPU runs, each forced in turn (the baseline, AVX2, AVX-512). Tests that force a
    /// build take turns; other tests running meanwhile may get a narrower build, which gives
    /// the same results.
    pub fn on_every_build<S: Strategy>(
        strategy: S,
        check: impl Fn(S::Value) -> Result<(), TestCaseError>,
    ) {
        each_build(|| proptest::test_runner::TestRunner::default().run(&strategy, &check).unwrap());
    }

    /// Run `f` once on every build this CPU runs, each forced in turn (see [`on_every_build`]).
    pub fn each_build(f: impl Fn()) {
        use super::{FORCE_AT_MOST, Isa, NOT_FORCED, isa};
        use std::sync::atomic::Ordering::Relaxed;
        static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
        struct Restore;
        impl Drop for Restore {
            fn drop(&mut self) {
                FORCE_AT_MOST.store(NOT_FORCED, Relaxed);
            }
        }
        let _restore = Restore;
        let widest = isa();
        for level in [Isa::Baseline, Isa::Avx2, Isa::Avx512].into_iter().filter(|l| *l <= widest) {
            FORCE_AT_MOST.store(level as usize, Relaxed);
            assert_eq!(isa(), level);
            f();
        }
    }

    /// Images that must not make a filter panic: empty, 1×1, 1×N, N×1, of every kind.
    pub fn tiny_images() -> Vec<DynImage> {
        let mut v = Vec::new();
        for (w, h) in [(0, 0), (0, 3), (3, 0), (1, 1), (1, 2), (2, 1), (1, 7), (7, 1), (2, 2)] {
            for c in [1, 3, 4] {
                let n = w * h * c;
                let d8: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
                let d16: Vec<u16> = (0..n).map(|i| (i * 7919 % 65536) as u16).collect();
                v.push(DynImage::U8(Image::from_vec(w, h, c, d8).unwrap()));
                v.push(DynImage::U16(Image::from_vec(w, h, c, d16).unwrap()));
            }
        }
        v
    }

    /// An image whose fields disagree; filters must reject it, not panic.
    pub fn broken_images() -> Vec<DynImage> {
        vec![
            DynImage::U8(Image { width: 3, height: 3, channels: 3, data: vec![0; 5] }),
            DynImage::U16(Image { width: 2, height: 2, channels: 2, data: vec![0; 8] }),
            DynImage::U8(Image { width: usize::MAX, height: 3, channels: 1, data: vec![] }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn div_is_exact_for_all_8_bit_window_sums() {
        for d in 1..=961u32 {
            let max = d * 255;
            let div = Div::new(d, max);
            for x in 0..=max {
                assert_eq!(div.apply(x), (x + d / 2) / d, "d {d} x {x}");
            }
        }
    }

    #[test]
    fn div_is_exact_for_16_bit_window_sums() {
        // Every d that a 31×31 window with clipping can produce, at the top of the range and
        // around every multiple near it (where an inexact reciprocal would fail first).
        for d in 1..=961u32 {
            let max = d * 65535;
            let div = Div::new(d, max);
            for q in (0..=65535u32).step_by(257).chain(65500..=65535) {
                for x in (q * d).saturating_sub(d)..=(q * d + d).min(max) {
                    assert_eq!(div.apply(x), (x + d / 2) / d, "d {d} x {x}");
                }
            }
        }
    }

    #[test]
    fn block_pieces_cover_every_sample_in_whole_blocks() {
        for block in [1, 4, 64] {
            for len in 0..300 {
                let pieces = block_pieces(len, block);
                let mut covered = vec![false; len];
                for (start, n) in pieces {
                    assert!(start + n <= len, "len {len} block {block}: {pieces:?}");
                    assert!(len < block || n % block == 0, "len {len} block {block}: {pieces:?}");
                    covered[start..start + n].iter_mut().for_each(|c| *c = true);
                }
                assert!(covered.iter().all(|&c| c), "len {len} block {block}: {pieces:?}");
            }
        }
    }

    #[test]
    fn family_and_model_from_cpuid_signatures() {
        // EPYC 9005 (Zen 5, 512-bit vectors whole), EPYC 9004 (Zen 4, halves), Xeon
        // Sapphire Rapids, and an old family-6 part without extended fields.
        assert_eq!(family_model(0x00B0_0F21), (0x1A, 0x02));
        assert_eq!(family_model(0x00A1_0F11), (0x19, 0x11));
        assert_eq!(family_model(0x0008_06F8), (0x06, 0x8F));
        assert_eq!(family_model(0x0000_0695), (0x06, 0x09));
    }

    #[test]
    fn splitmix_is_reproducible() {
        let mut a = SplitMix64(0);
        // Reference value of SplitMix64 seeded with 0.
        assert_eq!(a.next_u64(), 0xE220_A839_7B1D_CDAF);
        let mut b = SplitMix64(42);
        let mut c = SplitMix64(42);
        for _ in 0..100 {
            let (x, y) = (b.below(7), c.below(7));
            assert!(x < 7);
            assert_eq!(x, y);
        }
    }

    #[test]
    fn grey_weights_sum_to_one() {
        assert_eq!(grey(255, 255, 255), 255);
        assert_eq!(grey(65535, 65535, 65535), 65535);
        assert_eq!(grey(128, 128, 128), 128);
        assert_eq!(grey(32, 0, 0), 11);
    }
}
