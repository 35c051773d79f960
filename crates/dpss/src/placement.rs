//! Which disk holds a tile: lattice declustering of a tile grid over K disks, and replicas on
//! other servers.
//!
//! Tile `(x, y)` goes to disk `(x + h·y) mod K`. Two tiles share a disk exactly when their
//! difference lies in the lattice `L_h = {(x, y) : x + h·y ≡ 0 (mod K)}`, so the `h` whose
//! shortest non-zero lattice vector is longest ([`best_h`]) keeps small windows of tiles spread
//! over many disks. `h = 1` ("disk modulo") is the naive baseline.
//!
//! Throughout, `k = 0` is treated as a single disk.

use serde::Serialize;

/// The greatest common divisor of `a` and `b` (`gcd(0, 0) = 0`).
pub fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The Euclidean length of the shortest non-zero vector of `L_h` for `k` disks.
pub fn shortest_vector(k: u32, h: u32) -> f64 {
    (shortest_norm2(k, h) as f64).sqrt()
}

/// The squared length of the shortest non-zero vector of `L_h`, by Lagrange–Gauss reduction of
/// the basis `(k, 0)`, `(-h, 1)`.
fn shortest_norm2(k: u32, h: u32) -> i128 {
    let k = i128::from(k.max(1));
    let h = i128::from(h) % k;
    let norm2 = |v: (i128, i128)| v.0 * v.0 + v.1 * v.1;
    // Keep |u| <= |v|; v becomes v - m·u with m the integer nearest to <u, v> / <u, u>.
    let (mut u, mut v) = ((-h, 1), (k, 0));
    if norm2(u) > norm2(v) {
        (u, v) = (v, u);
    }
    loop {
        let (uu, uv) = (norm2(u), u.0 * v.0 + u.1 * v.1);
        let m = (2 * uv + uu).div_euclid(2 * uu);
        let w = (v.0 - m * u.0, v.1 - m * u.1);
        if norm2(w) >= uu {
            return uu;
        }
        (u, v) = (w, u);
    }
}

/// The length under the max norm (max(|x|, |y|)) of the shortest non-zero vector of the
/// lattice of `h`: a w×w window hits some disk twice exactly when this is below w. Searched
/// directly: by Minkowski's theorem it is at most ⌈√k⌉.
pub fn shortest_max_norm(k: u32, h: u32) -> u32 {
    let (k, h) = (u64::from(k.max(1)), u64::from(h));
    let s = (k as f64).sqrt().ceil() as u64;
    let mut best = k;
    for y in 0..=s {
        // x ≡ -h·y (mod k): the residue nearest 0 is the shortest x for this y.
        let r = (k - (h * y) % k) % k;
        let x = r.min(k - r);
        if (x, y) != (0, 0) {
            best = best.min(x.max(y));
        }
    }
    best.min(k) as u32
}

/// The `h` in `1..k`, coprime to `k`, whose lattice has the longest shortest vector: first
/// under the max norm (what square windows see: every w×w window with w at most that length
/// touches each disk at most once), then the Euclidean one; ties go to the smallest `h`.
/// Returns 1 for `k <= 2`.
pub fn best_h(k: u32) -> u32 {
    let key = |h: u32| (shortest_max_norm(k, h), shortest_norm2(k, h));
    let mut best = (1, key(1));
    for h in 2..k {
        if gcd(u64::from(h), u64::from(k)) != 1 {
            continue;
        }
        let kh = key(h);
        if kh > best.1 {
            best = (h, kh);
        }
    }
    best.0
}

/// A declustering of a tile grid over `k` disks: tile `(x, y)` goes to disk `(x + h·y) mod k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lattice {
    pub k: u32,
    pub h: u32,
}

impl Lattice {
    /// The best lattice for `k` disks ([`best_h`]); `None` for `k = 0`.
    pub fn new(k: u32) -> Option<Lattice> {
        (k > 0).then(|| Lattice { k, h: best_h(k) })
    }

    /// The naive "disk modulo" layout (`h = 1`); `None` for `k = 0`.
    pub fn modulo(k: u32) -> Option<Lattice> {
        (k > 0).then_some(Lattice { k, h: 1 })
    }

    /// The disk of tile `(x, y)`, in `0..k`.
    pub fn disk(&self, x: u32, y: u32) -> u32 {
        // At most (2^32 - 1) + (2^32 - 1)^2 < 2^64.
        let sum = u64::from(x) + u64::from(self.h) * u64::from(y);
        (sum % u64::from(self.k.max(1))) as u32
    }
}

/// The global disks holding a block whose primary copy is on `primary_disk`: first the primary,
/// then one replica on each following server in ring order (servers without disks skipped),
/// each at local disk `primary_disk mod n_s` of its server, until there are `r` disks.
///
/// Global disk numbers are server-major: server 0 holds `0..n0`, server 1 `n0..n0+n1`, and so
/// on. Every disk returned is on a different server, so if `r` exceeds the number of servers
/// with disks, only that many are returned. Empty if `r = 0` or `primary_disk` is not a disk.
pub fn replicas(primary_disk: u32, r: u32, disks_per_server: &[u32]) -> Vec<u32> {
    let Some((server, _)) = server_of(primary_disk, disks_per_server) else {
        return Vec::new();
    };
    let first_disk: Vec<u64> = disks_per_server
        .iter()
        .scan(0u64, |next, &n| {
            let first = *next;
            *next += u64::from(n);
            Some(first)
        })
        .collect();
    let servers = disks_per_server.len();
    let others = (1..servers).map(|i| (server as usize + i) % servers);
    let mut disks = vec![primary_disk];
    for s in others.filter(|&s| disks_per_server[s] > 0) {
        let disk = first_disk[s] + u64::from(primary_disk % disks_per_server[s]);
        disks.extend(u32::try_from(disk));
    }
    disks.truncate(r as usize);
    disks
}

/// The server holding global disk `disk` and the disk's local index on it, or `None` if there
/// are fewer disks.
pub fn server_of(disk: u32, disks_per_server: &[u32]) -> Option<(u32, u32)> {
    let mut first = 0u64;
    for (server, &n) in disks_per_server.iter().enumerate() {
        let local = u64::from(disk).checked_sub(first)?;
        if local < u64::from(n) {
            return Some((server as u32, local as u32));
        }
        first += u64::from(n);
    }
    None
}

/// The most tiles any one disk holds in a `w` × `w` window of tiles.
///
/// A lattice layout is the same everywhere up to renaming disks — moving the window by
/// `(a, b)` adds `disk(a, b)` to every tile's disk, mod `k` — so the window at the origin
/// speaks for every position.
pub fn max_load(l: &Lattice, w: u32) -> u32 {
    let mut tiles = vec![0u64; l.k.max(1) as usize];
    for y in 0..w {
        for x in 0..w {
            tiles[l.disk(x, y) as usize] += 1;
        }
    }
    let most = tiles.into_iter().max().unwrap_or(0);
    u32::try_from(most).unwrap_or(u32::MAX)
}

/// The least possible [`max_load`] for a `w` × `w` window over `k` disks: `ceil(w² / k)`.
pub fn optimum(k: u32, w: u32) -> u32 {
    let tiles = u64::from(w) * u64::from(w);
    u32::try_from(tiles.div_ceil(u64::from(k.max(1)))).unwrap_or(u32::MAX)
}

/// How well the best lattice and disk modulo spread a `w` × `w` window over `k` disks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QualityRow {
    pub k: u32,
    pub w: u32,
    /// The lattice's `h` ([`best_h`]).
    pub h: u32,
    /// [`max_load`] of the best lattice.
    pub lattice: u32,
    /// [`max_load`] of disk modulo (`h = 1`).
    pub modulo: u32,
    /// [`optimum`]: no layout does better.
    pub optimum: u32,
}

/// One [`QualityRow`] for every `k` in `ks` and `w` in `ws`, `k`-major.
pub fn quality_table(ks: &[u32], ws: &[u32]) -> Vec<QualityRow> {
    let mut rows = Vec::with_capacity(ks.len() * ws.len());
    for &k in ks {
        let h = best_h(k);
        let (lattice, modulo) = (Lattice { k, h }, Lattice { k, h: 1 });
        for &w in ws {
            rows.push(QualityRow {
                k,
                w,
                h,
                lattice: max_load(&lattice, w),
                modulo: max_load(&modulo, w),
                optimum: optimum(k, w),
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shortest non-zero vector of `L_h` by search; it is no longer than `(k, 0)`.
    fn brute_force_norm2(k: u32, h: u32) -> i64 {
        let (k, h) = (i64::from(k), i64::from(h));
        let mut best = k * k;
        for y in -k..=k {
            for x in -k..=k {
                if (x, y) != (0, 0) && (x + h * y).rem_euclid(k) == 0 {
                    best = best.min(x * x + y * y);
                }
            }
        }
        best
    }

    fn coprime(h: u32, k: u32) -> bool {
        gcd(u64::from(h), u64::from(k)) == 1
    }

    #[test]
    fn gcd_values() {
        assert_eq!(gcd(0, 0), 0);
        assert_eq!(gcd(0, 7), 7);
        assert_eq!(gcd(7, 0), 7);
        assert_eq!(gcd(12, 18), 6);
        assert_eq!(gcd(17, 5), 1);
        assert_eq!(gcd(u64::MAX, u64::MAX - 1), 1);
    }

    #[test]
    fn shortest_vector_matches_brute_force() {
        for k in 1..=40 {
            for h in 0..=k {
                let expected = brute_force_norm2(k, h);
                assert_eq!(shortest_norm2(k, h), i128::from(expected), "k {k}, h {h}");
                assert_eq!(shortest_vector(k, h), (expected as f64).sqrt());
            }
        }
    }

    #[test]
    fn shortest_vector_known_values_and_large_inputs() {
        assert_eq!(shortest_vector(1, 0), 1.0);
        assert_eq!(shortest_vector(0, 5), 1.0);
        assert_eq!(shortest_vector(5, 2), 5f64.sqrt());
        assert_eq!(shortest_vector(10, 1), 2f64.sqrt());
        assert_eq!(shortest_vector(10, 3), 10f64.sqrt());
        // h = 2^16 has h² ≡ 1 (mod 2^32 - 1): (-2^16, 1) and (-1, 2^16) are a reduced basis.
        assert_eq!(shortest_norm2(u32::MAX, 1 << 16), (1 << 32) + 1);
        assert_eq!(shortest_vector(u32::MAX, u32::MAX - 1), 2f64.sqrt());
    }

    #[test]
    fn best_h_is_coprime_and_maximal() {
        for k in 0..=64 {
            let h = best_h(k);
            assert!(coprime(h, k) || k == 0, "k {k}, h {h}");
            assert!(h == 1 || h < k, "k {k}, h {h}");
            let key = |h| (shortest_max_norm(k, h), shortest_norm2(k, h));
            for other in (1..k).filter(|&o| coprime(o, k)) {
                let (best, theirs) = (key(h), key(other));
                assert!(best >= theirs, "k {k}: h {h} beaten by {other}");
                assert!(other >= h || theirs < best, "k {k}: tie not broken by smallest h");
            }
        }
        assert_eq!(best_h(1), 1);
        assert_eq!(best_h(2), 1);
    }

    #[test]
    fn the_max_norm_shortest_vector_matches_brute_force() {
        for k in 1..=40u32 {
            for h in 1..k.max(2) {
                let mut want = u32::MAX;
                for y in 0..=k as i64 {
                    for x in -(k as i64)..=k as i64 {
                        if (x, y) != (0, 0) && (x + h as i64 * y).rem_euclid(k as i64) == 0 {
                            want = want.min(x.unsigned_abs().max(y as u64) as u32);
                        }
                    }
                }
                assert_eq!(shortest_max_norm(k, h), want, "k {k}, h {h}");
            }
        }
    }

    #[test]
    fn lattice_constructors_and_disks() {
        assert_eq!(Lattice::new(0), None);
        assert_eq!(Lattice::modulo(0), None);
        assert_eq!(Lattice::new(1), Some(Lattice { k: 1, h: 1 }));
        assert_eq!(Lattice::modulo(8), Some(Lattice { k: 8, h: 1 }));
        let l = Lattice::new(13).unwrap();
        assert_eq!(l.h, best_h(13));
        let mut row: Vec<u32> = (0..13).map(|x| l.disk(x, 7)).collect();
        row.sort_unstable();
        assert_eq!(row, (0..13).collect::<Vec<_>>(), "a row of k tiles covers every disk");
        let mut column: Vec<u32> = (0..13).map(|y| l.disk(3, y)).collect();
        column.sort_unstable();
        assert_eq!(column, (0..13).collect::<Vec<_>>(), "so does a column (h coprime)");
        let big = Lattice { k: u32::MAX, h: u32::MAX - 1 };
        let expected = (u128::from(u32::MAX) + u128::from(u32::MAX - 1) * u128::from(u32::MAX))
            % u128::from(u32::MAX);
        assert_eq!(u128::from(big.disk(u32::MAX, u32::MAX)), expected);
        assert_eq!(Lattice { k: 0, h: 3 }.disk(5, 9), 0);
    }

    #[test]
    fn max_load_is_the_same_at_every_window_position() {
        for k in [5, 8, 12, 13] {
            for h in [1, best_h(k)] {
                let l = Lattice { k, h };
                for w in 1..=6 {
                    let origin = max_load(&l, w);
                    for (x0, y0) in (0..k).flat_map(|y0| (0..k).map(move |x0| (x0, y0))) {
                        let mut tiles = vec![0; k as usize];
                        for y in y0..y0 + w {
                            for x in x0..x0 + w {
                                tiles[l.disk(x, y) as usize] += 1;
                            }
                        }
                        assert_eq!(tiles.into_iter().max(), Some(origin), "k {k} h {h} w {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn optimum_values() {
        assert_eq!(optimum(4, 2), 1);
        assert_eq!(optimum(4, 3), 3);
        assert_eq!(optimum(10, 3), 1);
        assert_eq!(optimum(10, 4), 2);
        assert_eq!(optimum(1, 0), 0);
        assert_eq!(optimum(1, u32::MAX), u32::MAX);
    }

    /// No `w` × `w` window with `w <= √K` puts two tiles on one disk whenever some coprime `h`
    /// manages it — except at K = 21 and 32, where the longest Euclidean shortest vector is a
    /// diagonal one ((3, 3) and (4, 4)) and a shorter but axis-leaning one ((4, 1) with h = 4,
    /// (5, 1) with h = 5) would keep the largest window perfect.
    #[test]
    fn small_windows_hit_each_disk_once_where_a_lattice_allows_it() {
        let perfect = |k: u32, h: u32, w: u32| max_load(&Lattice { k, h }, w) == 1;
        let mut missed = Vec::new();
        for k in 4..=32u32 {
            let best = best_h(k);
            for w in (1..).take_while(|w| w * w <= k) {
                if (1..k).any(|h| coprime(h, k) && perfect(k, h, w)) && !perfect(k, best, w) {
                    assert_eq!(max_load(&Lattice { k, h: best }, w), 2, "k {k}, w {w}");
                    missed.push((k, w));
                }
            }
        }
        assert_eq!(missed, []);
        for k in [5, 10, 13, 17, 26, 29] {
            let w = (1..).take_while(|w| w * w <= k).last().unwrap();
            assert!(perfect(k, best_h(k), w), "k {k}, w {w}");
        }
        // A perfect square K = w² would need (w, 0) or (0, w) in the lattice: not with h coprime.
        for k in [4, 9, 16, 25] {
            let w = (1..).take_while(|w| w * w <= k).last().unwrap();
            assert!((1..k).filter(|&h| coprime(h, k)).all(|h| !perfect(k, h, w)), "k {k}");
            assert!(perfect(k, best_h(k), w - 1), "k {k}, w {}", w - 1);
        }
    }

    #[test]
    fn lattice_never_worse_than_modulo_and_better_from_eight_disks() {
        let ks: Vec<u32> = (4..=32).collect();
        let ws: Vec<u32> = (2..=8).collect();
        let rows = quality_table(&ks, &ws);
        assert_eq!(rows.len(), ks.len() * ws.len());
        for row in &rows {
            assert!(row.optimum <= row.lattice, "{row:?}");
            assert!(row.lattice <= row.modulo, "{row:?}");
        }
        for k in 8..=32 {
            assert!(rows.iter().any(|r| r.k == k && r.lattice < r.modulo), "k {k}");
        }
    }

    #[test]
    fn quality_table_rows() {
        let rows = quality_table(&[13, 8], &[3, 2]);
        let keys: Vec<(u32, u32)> = rows.iter().map(|r| (r.k, r.w)).collect();
        assert_eq!(keys, [(13, 3), (13, 2), (8, 3), (8, 2)]);
        let row = rows[0];
        assert_eq!(row.h, best_h(13));
        assert_eq!(row.lattice, max_load(&Lattice { k: 13, h: row.h }, 3));
        assert_eq!(row.modulo, max_load(&Lattice::modulo(13).unwrap(), 3));
        assert_eq!(row.modulo, 3);
        assert_eq!(row.optimum, 1);
        let json = serde_json::to_string(&row).unwrap();
        assert!(json.contains("\"lattice\":1") && json.contains("\"modulo\":3"), "{json}");
    }

    #[test]
    fn server_of_round_trips() {
        let servers = [3, 0, 4, 2];
        let total: u32 = servers.iter().sum();
        let mut seen = Vec::new();
        for disk in 0..total {
            let (server, local) = server_of(disk, &servers).unwrap();
            assert!(local < servers[server as usize]);
            let first: u32 = servers[..server as usize].iter().sum();
            assert_eq!(first + local, disk);
            seen.push(server);
        }
        assert_eq!(seen, [0, 0, 0, 2, 2, 2, 2, 3, 3]);
        assert_eq!(server_of(total, &servers), None);
        assert_eq!(server_of(0, &[]), None);
        assert_eq!(server_of(u32::MAX, &[u32::MAX, 1]), Some((1, 0)));
    }

    #[test]
    fn replicas_are_on_distinct_servers_starting_with_the_primary() {
        let servers = [3, 0, 4, 2, 5];
        let total: u32 = servers.iter().sum();
        for primary in 0..total {
            for r in 0..=6 {
                let disks = replicas(primary, r, &servers);
                assert_eq!(disks.len(), (r as usize).min(4), "primary {primary}, r {r}");
                if r == 0 {
                    continue;
                }
                assert_eq!(disks[0], primary);
                let mut owners: Vec<u32> =
                    disks.iter().map(|&d| server_of(d, &servers).unwrap().0).collect();
                let primary_server = owners[0];
                // Ring order after the primary's server.
                let ring: Vec<u32> = (0..5).map(|i| (primary_server + i) % 5).collect();
                let order: Vec<usize> =
                    owners.iter().map(|s| ring.iter().position(|t| t == s).unwrap()).collect();
                assert!(order.windows(2).all(|p| p[0] < p[1]), "{disks:?}");
                owners.sort_unstable();
                owners.dedup();
                assert_eq!(owners.len(), disks.len(), "{disks:?}");
            }
        }
        // Disk 7 is server 3's first; the ring goes on to server 4 (disks 9..14, local
        // 7 mod 5 = 2: disk 11), server 0 (local 7 mod 3 = 1), skips server 1 (no disks) and
        // ends at server 2 (disks 3..7, local 7 mod 4 = 3: disk 6).
        assert_eq!(replicas(7, 5, &servers), [7, 11, 1, 6]);
        assert_eq!(replicas(total, 2, &servers), Vec::<u32>::new());
    }
}
