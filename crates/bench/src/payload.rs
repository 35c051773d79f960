//! The bytes every path moves, and the arithmetic of rates.

use std::time::Duration;

use bytes::Bytes;

/// One MB as the benchmark counts it: 2²⁰ bytes.
pub const MB: u64 = 1 << 20;

/// `size` bytes of non-constant content (an LCG), the same for every call with that size.
pub fn payload(size: u64) -> Bytes {
    let mut v = vec![0u8; size as usize];
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ size;
    for chunk in v.chunks_mut(8) {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        // The high bits of an LCG are the random-looking ones.
        let word = (x ^ (x >> 29)).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    Bytes::from(v)
}

/// Throughput in Gbit/s of `bytes` moved in `elapsed`.
pub fn gbit_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 * 8.0 / elapsed.as_secs_f64().max(1e-9) / 1e9
}

/// Median of `samples` (mean of the two middle ones for an even count); 0 when empty.
pub fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// How blobstream's rate compares with a baseline's, from the seconds of runs made in pairs
/// (run *i* of each met the same machine conditions): the median of the per-run ratios
/// `baseline_i / ours_i`, which drift on a shared machine cancels out of. Unpaired samples
/// (lengths differ) give the ratio of the medians.
pub fn paired_ratio(ours_secs: &[f64], baseline_secs: &[f64]) -> f64 {
    if ours_secs.len() != baseline_secs.len() || ours_secs.iter().any(|&o| o <= 0.0) {
        return median(baseline_secs) / median(ours_secs);
    }
    let per_run: Vec<f64> = ours_secs.iter().zip(baseline_secs).map(|(o, b)| b / o).collect();
    median(&per_run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_deterministic_and_not_constant() {
        let a = payload(1000);
        assert_eq!(a, payload(1000));
        assert_eq!(a.len(), 1000);
        assert!(a.windows(2).any(|w| w[0] != w[1]));
        assert!(payload(0).is_empty());
    }

    #[test]
    fn medians_and_rates() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert!((gbit_per_s(125_000_000, Duration::from_secs(1)) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn paired_ratios_take_each_run_against_its_pair() {
        // Two of three pairs say 0.5; the medians (2 s and 1.5 s) would say 0.75.
        let (ours, base) = ([1.0, 2.0, 3.0], [0.5, 3.0, 1.5]);
        assert_eq!(paired_ratio(&ours, &base), 0.5);
        assert_eq!(paired_ratio(&[2.0, 4.0], &[1.0]), 1.0 / 3.0, "unpaired: medians");
    }
}
