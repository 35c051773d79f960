//! Hilbert-curve order for the tiles of one disk, so that a pan reads nearby blocks.
//!
//! The curve of order `n` visits every cell of a 2^n × 2^n grid once; cells next to each other
//! on the curve are 4-neighbours in the grid. Orders go up to [`MAX_ORDER`] (32): then curve
//! positions still fit a `u64` and coordinates a `u32`. Larger orders are treated as 32.

/// The largest order: a 2^32 × 2^32 grid, whose 4^32 positions fill a `u64`.
pub const MAX_ORDER: u32 = 32;

/// The cell at position `d` of the curve of order `order`, as `(x, y)`.
///
/// The domain is `d < 4^order`; higher bits of `d` are ignored.
pub fn d2xy(order: u32, d: u64) -> (u32, u32) {
    let n = 1u64 << order.min(MAX_ORDER);
    let (mut x, mut y) = (0u64, 0u64);
    let mut t = d;
    let mut s = 1u64;
    while s < n {
        let rx = 1 & (t / 2);
        let ry = 1 & (t ^ rx);
        rotate(s, &mut x, &mut y, rx, ry);
        x += s * rx;
        y += s * ry;
        t /= 4;
        s *= 2;
    }
    // x, y < n <= 2^32.
    (x as u32, y as u32)
}

/// The position of cell `(x, y)` on the curve of order `order`.
///
/// The domain is `x, y < 2^order`; higher bits of `x` and `y` are ignored.
pub fn xy2d(order: u32, x: u32, y: u32) -> u64 {
    let n = 1u64 << order.min(MAX_ORDER);
    let (mut x, mut y) = (u64::from(x) & (n - 1), u64::from(y) & (n - 1));
    let mut d = 0u64;
    let mut s = n / 2;
    while s > 0 {
        let rx = u64::from(x & s > 0);
        let ry = u64::from(y & s > 0);
        d += s * s * ((3 * rx) ^ ry);
        rotate(n, &mut x, &mut y, rx, ry);
        s /= 2;
    }
    d
}

/// Rotates and flips a quadrant of side `n` so the sub-curve has the right orientation.
fn rotate(n: u64, x: &mut u64, y: &mut u64, rx: u64, ry: u64) {
    if ry == 0 {
        if rx == 1 {
            *x = n - 1 - *x;
            *y = n - 1 - *y;
        }
        std::mem::swap(x, y);
    }
}

/// The smallest order whose 2^order × 2^order grid covers `width` × `height` (0 for 1×1 or
/// an empty grid).
pub fn order_for(width: u32, height: u32) -> u32 {
    u64::from(width.max(height)).next_power_of_two().trailing_zeros()
}

/// The key that orders the tiles of a `width` × `height` grid on disk: the position of
/// `(x, y)` on the smallest Hilbert curve covering the grid.
pub fn sort_key(x: u32, y: u32, width: u32, height: u32) -> u64 {
    xy2d(order_for(width, height), x, y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bijection_over_all_cells_for_small_orders() {
        for order in 0..=5u32 {
            let n = 1u32 << order;
            let mut seen = vec![false; (n * n) as usize];
            for y in 0..n {
                for x in 0..n {
                    let d = xy2d(order, x, y);
                    assert!(d < u64::from(n * n), "order {order}: ({x}, {y}) -> {d}");
                    assert!(!seen[d as usize], "order {order}: position {d} used twice");
                    seen[d as usize] = true;
                    assert_eq!(d2xy(order, d), (x, y));
                }
            }
        }
    }

    #[test]
    fn consecutive_positions_are_neighbours() {
        for order in 1..=6u32 {
            let cells = 1u64 << (2 * order);
            for d in 1..cells {
                let (x0, y0) = d2xy(order, d - 1);
                let (x1, y1) = d2xy(order, d);
                assert_eq!(x0.abs_diff(x1) + y0.abs_diff(y1), 1, "order {order}, d {d}");
            }
        }
    }

    #[test]
    fn curve_starts_at_origin_and_ends_in_the_bottom_right_corner() {
        for order in 1..=MAX_ORDER {
            let last = u32::MAX >> (32 - order);
            assert_eq!(d2xy(order, 0), (0, 0));
            assert_eq!(d2xy(order, u64::MAX >> (64 - 2 * order)), (last, 0));
        }
    }

    #[test]
    fn largest_order_round_trips_at_the_corners() {
        for (x, y) in [(0, 0), (u32::MAX, 0), (0, u32::MAX), (u32::MAX, u32::MAX), (7, 1 << 31)] {
            assert_eq!(d2xy(MAX_ORDER, xy2d(MAX_ORDER, x, y)), (x, y));
        }
        assert_eq!(xy2d(40, 3, 5), xy2d(MAX_ORDER, 3, 5));
    }

    #[test]
    fn order_for_edge_cases() {
        assert_eq!(order_for(0, 0), 0);
        assert_eq!(order_for(1, 1), 0);
        assert_eq!(order_for(2, 1), 1);
        assert_eq!(order_for(1, 2), 1);
        assert_eq!(order_for(3, 3), 2);
        assert_eq!(order_for(4, 4), 2);
        assert_eq!(order_for(5, 1), 3);
        assert_eq!(order_for(1 << 31, 1), 31);
        assert_eq!(order_for((1 << 31) + 1, 1), 32);
        assert_eq!(order_for(u32::MAX, u32::MAX), 32);
    }

    #[test]
    fn sort_key_orders_a_non_square_grid_without_collisions() {
        let (w, h) = (5, 3);
        let mut keys: Vec<u64> =
            (0..h).flat_map(|y| (0..w).map(move |x| sort_key(x, y, w, h))).collect();
        assert!(keys.iter().all(|&k| k < 64));
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), (w * h) as usize);
        assert_eq!(sort_key(2, 1, w, h), xy2d(3, 2, 1));
    }

    proptest! {
        #[test]
        fn bijection_for_random_orders(order in 0u32..=16, x in any::<u32>(), y in any::<u32>()) {
            let mask = (1u32 << order) - 1;
            let (x, y) = (x & mask, y & mask);
            let d = xy2d(order, x, y);
            prop_assert!(d < 1u64 << (2 * order));
            prop_assert_eq!(d2xy(order, d), (x, y));
        }

        #[test]
        fn inverse_for_random_positions(order in 0u32..=16, d in any::<u64>()) {
            let d = d & ((1u64 << (2 * order)) - 1);
            let (x, y) = d2xy(order, d);
            prop_assert_eq!(xy2d(order, x, y), d);
        }
    }
}
