//! A data set's layout: its pyramid (or block count), its servers, and where every block's
//! copies live — computed, not looked up, from the lattice.
//!
//! Block (level, x, y) has its primary copy on global disk `(x + h·y + level) mod k` (the
//! lattice of [`crate::placement`]; the level shifts each pyramid level by one disk so the
//! small top levels do not all sit on disk 0) and its other `r - 1` copies on distinct other
//! servers ([`placement::replicas`]). Level 0 is full resolution; level `l` halves it `l` times.

use bs_proto as pb;
use serde::Serialize;

use crate::block::{BlockId, Priority};
use crate::error::DpssError;
use crate::placement::{self, Lattice};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerRef {
    pub name: String,
    pub addr: String,
    pub disks: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub dataset: String,
    /// "image" (a pyramid of tiles) or "file" (fixed-size blocks).
    pub kind: String,
    pub width: u64,
    pub height: u64,
    pub tile: u32,
    pub levels: u32,
    /// "png", "jpeg" or "raw".
    pub format: String,
    pub channels: u32,
    pub k: u32,
    pub h: u32,
    pub r: u32,
    pub servers: Vec<ServerRef>,
    pub blocks: u64,
    pub bytes: u64,
    /// When the name server published this load (ns since the Unix epoch); 0 before. A data
    /// set dropped and loaded again under its name has a new value.
    pub published_ns: u64,
}

impl Layout {
    /// A layout over `servers` with the best lattice for their disks and `r` copies.
    pub fn plan(
        dataset: &str,
        kind: &str,
        (width, height): (u64, u64),
        tile: u32,
        servers: Vec<ServerRef>,
        r: u32,
    ) -> Result<Self, DpssError> {
        crate::block::check_name(dataset)?;
        let k: u32 = servers.iter().map(|s| s.disks).sum();
        let lattice = Lattice::new(k).ok_or_else(|| DpssError::Layout("no disks".into()))?;
        if tile == 0 || width == 0 || height == 0 {
            return Err(DpssError::Layout("empty data set or zero tile size".into()));
        }
        let r = r.clamp(1, servers.len() as u32);
        let mut levels = 1;
        if kind == "image" {
            // Halve until the whole image fits in one tile.
            let (mut w, mut h) = (width, height);
            while w > tile as u64 || h > tile as u64 {
                w = w.div_ceil(2);
                h = h.div_ceil(2);
                levels += 1;
            }
        }
        let l = Self {
            dataset: dataset.into(),
            kind: kind.into(),
            width,
            height,
            tile,
            levels,
            format: if kind == "image" { "png".into() } else { "raw".into() },
            channels: 0,
            k,
            h: lattice.h,
            r,
            servers,
            blocks: 0,
            bytes: 0,
            published_ns: 0,
        };
        let (tx, ty) = l.grid(0);
        if tx > u32::MAX as u64 || ty > u32::MAX as u64 {
            return Err(DpssError::Layout("more than 2^32 blocks along one side".into()));
        }
        Ok(l)
    }

    /// Pixel size of `level`.
    pub fn level_size(&self, level: u32) -> (u64, u64) {
        let (mut w, mut h) = (self.width, self.height);
        for _ in 0..level {
            w = w.div_ceil(2);
            h = h.div_ceil(2);
        }
        (w, h)
    }

    /// Tiles across and down at `level`.
    pub fn grid(&self, level: u32) -> (u64, u64) {
        let (w, h) = self.level_size(level);
        (w.div_ceil(self.tile as u64), h.div_ceil(self.tile as u64))
    }

    /// Does the data set have this block?
    pub fn contains(&self, id: BlockId) -> bool {
        let (tx, ty) = self.grid(id.level as u32);
        (id.level as u32) < self.levels && (id.x as u64) < tx && (id.y as u64) < ty
    }

    /// Every block, level by level, row by row.
    pub fn all_blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        (0..self.levels).flat_map(move |l| {
            let (tx, ty) = self.grid(l);
            (0..ty)
                .flat_map(move |y| (0..tx).map(move |x| BlockId::new(l as u8, x as u32, y as u32)))
        })
    }

    fn disks_per_server(&self) -> Vec<u32> {
        self.servers.iter().map(|s| s.disks).collect()
    }

    /// Where a block's copies live: (server index, disk on that server), primary first.
    pub fn locations(&self, id: BlockId) -> Vec<(usize, u16)> {
        let lattice = Lattice { k: self.k, h: self.h };
        let primary = (lattice.disk(id.x, id.y) + id.level as u32) % self.k;
        let per = self.disks_per_server();
        placement::replicas(primary, self.r, &per)
            .into_iter()
            .filter_map(|d| placement::server_of(d, &per))
            .map(|(s, d)| (s as usize, d as u16))
            .collect()
    }

    /// The blocks a viewer wants for the window of `level` pixels `[x0, x1) × [y0, y1)`: the
    /// visible tiles high (centre first), a ring of one tile around them medium, and the
    /// visible part of the next finer level low (zooming in comes next), at most `max`.
    pub fn view(
        &self,
        level: u32,
        (x0, y0, x1, y1): (u64, u64, u64, u64),
        max: usize,
    ) -> Vec<(BlockId, Priority)> {
        let t = self.tile as u64;
        let (tx, ty) = self.grid(level.min(self.levels - 1));
        let level = level.min(self.levels - 1);
        let span =
            |a: u64, b: u64, n: u64| (a / t).min(n.saturating_sub(1))..(b.div_ceil(t)).clamp(1, n);
        let (xs, ys) = (span(x0, x1.max(x0 + 1), tx), span(y0, y1.max(y0 + 1), ty));
        let mut high: Vec<BlockId> = ys
            .clone()
            .flat_map(|y| xs.clone().map(move |x| BlockId::new(level as u8, x as u32, y as u32)))
            .collect();
        let (cx, cy) = ((xs.start + xs.end) as f64 / 2.0, (ys.start + ys.end) as f64 / 2.0);
        let dist = |b: &BlockId| {
            let (dx, dy) = (b.x as f64 + 0.5 - cx, b.y as f64 + 0.5 - cy);
            ((dx * dx + dy * dy) * 1000.0) as u64
        };
        high.sort_by_key(dist);
        let mut out: Vec<(BlockId, Priority)> =
            high.into_iter().map(|b| (b, Priority::High)).collect();
        let ring_x = xs.start.saturating_sub(1)..(xs.end + 1).min(tx);
        let ring_y = ys.start.saturating_sub(1)..(ys.end + 1).min(ty);
        for y in ring_y {
            for x in ring_x.clone() {
                if !(xs.contains(&x) && ys.contains(&y)) {
                    out.push((BlockId::new(level as u8, x as u32, y as u32), Priority::Medium));
                }
            }
        }
        if level > 0 {
            let fine = level - 1;
            let (fx, fy) = self.grid(fine);
            let fxs = (xs.start * 2).min(fx)..(xs.end * 2).min(fx);
            let fys = (ys.start * 2).min(fy)..(ys.end * 2).min(fy);
            for y in fys {
                for x in fxs.clone() {
                    out.push((BlockId::new(fine as u8, x as u32, y as u32), Priority::Low));
                }
            }
        }
        out.truncate(max);
        out
    }
}

impl From<&Layout> for pb::DpssLayout {
    fn from(l: &Layout) -> Self {
        pb::DpssLayout {
            dataset: l.dataset.clone(),
            kind: l.kind.clone(),
            width: l.width,
            height: l.height,
            tile: l.tile,
            levels: l.levels,
            format: l.format.clone(),
            k: l.k,
            h: l.h,
            r: l.r,
            servers: l
                .servers
                .iter()
                .map(|s| pb::DpssServerRef {
                    name: s.name.clone(),
                    addr: s.addr.clone(),
                    disks: s.disks,
                })
                .collect(),
            blocks: l.blocks,
            bytes: l.bytes,
            channels: l.channels,
            published_ns: l.published_ns,
        }
    }
}

impl TryFrom<pb::DpssLayout> for Layout {
    type Error = DpssError;

    fn try_from(p: pb::DpssLayout) -> Result<Self, DpssError> {
        let servers: Vec<ServerRef> = p
            .servers
            .into_iter()
            .map(|s| ServerRef { name: s.name, addr: s.addr, disks: s.disks })
            .collect();
        let k: u32 = servers.iter().map(|s| s.disks).sum();
        if k == 0 || k != p.k || p.h == 0 || p.tile == 0 || p.levels == 0 || p.r == 0 {
            return Err(DpssError::Layout(format!("layout of {:?} does not add up", p.dataset)));
        }
        Ok(Self {
            dataset: p.dataset,
            kind: p.kind,
            width: p.width,
            height: p.height,
            tile: p.tile,
            levels: p.levels,
            format: p.format,
            channels: p.channels,
            k: p.k,
            h: p.h,
            r: p.r,
            servers,
            blocks: p.blocks,
            bytes: p.bytes,
            published_ns: p.published_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(n: usize, disks: u32) -> Vec<ServerRef> {
        (0..n)
            .map(|i| ServerRef { name: format!("s{i}"), addr: format!("127.0.0.1:{i}"), disks })
            .collect()
    }

    #[test]
    fn a_pyramid_halves_to_one_tile_and_every_block_has_r_copies_on_distinct_servers() {
        let l = Layout::plan("img", "image", (1000, 600), 256, servers(4, 2), 2).unwrap();
        assert_eq!(l.levels, 3); // 1000 → 500 → 250
        assert_eq!(l.grid(0), (4, 3));
        assert_eq!(l.grid(2), (1, 1));
        assert_eq!(l.grid(1), (2, 2)); // 500 × 300
        assert_eq!(l.all_blocks().count(), 12 + 4 + 1);
        for b in l.all_blocks() {
            let locs = l.locations(b);
            assert_eq!(locs.len(), 2);
            assert_ne!(locs[0].0, locs[1].0, "{b}");
            assert!(locs.iter().all(|&(s, d)| s < 4 && d < 2));
        }
        assert!(l.contains(BlockId::new(0, 3, 2)));
        assert!(!l.contains(BlockId::new(0, 4, 0)) && !l.contains(BlockId::new(3, 0, 0)));
        let p: pb::DpssLayout = (&l).into();
        assert_eq!(Layout::try_from(p).unwrap(), l);
    }

    #[test]
    fn a_view_asks_visible_high_ring_medium_and_finer_level_low() {
        let l = Layout::plan("img", "image", (4096, 4096), 256, servers(2, 1), 2).unwrap();
        // Level 1 is 2048² = 8×8 tiles; look at pixels [512, 1024)² = tiles 2..4.
        let v = l.view(1, (512, 512, 1024, 1024), 1000);
        let count = |p| v.iter().filter(|(_, q)| *q == p).count();
        assert_eq!(count(Priority::High), 4);
        assert_eq!(count(Priority::Medium), 16 - 4);
        assert_eq!(count(Priority::Low), 16); // tiles 4..8 of level 0
        assert!(v.iter().all(|(b, _)| l.contains(*b)));
        assert!(v.iter().take(4).all(|(b, p)| *p == Priority::High && b.level == 1));
        assert_eq!(l.view(1, (512, 512, 1024, 1024), 5).len(), 5);
        // A window past the edge is clamped to the image.
        let edge = l.view(0, (4000, 4000, 9000, 9000), 1000);
        assert!(edge.iter().all(|(b, _)| l.contains(*b)));
    }
}
