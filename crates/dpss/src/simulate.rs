//! The path simulator: the ISS paper's TerraVision workload — a viewer flying a path over a
//! tiled image, sending a new request list several times a second (the visible tiles high,
//! the ring around them and the tiles the path predicts next medium, the next finer level
//! low) — reporting per list what was requested, read from disk, found in the cache, sent,
//! flushed and lost, and how long the high-priority tiles took.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::block::{BlockId, Priority};
use crate::client::{Client, Event};
use crate::error::DpssError;

/// The workload.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Request lists per second.
    pub lists_per_second: f64,
    /// How many lists to send.
    pub lists: u32,
    /// About how many tiles per list.
    pub tiles: usize,
    /// The pyramid level the viewer flies at (0: full resolution).
    pub level: u32,
    /// Viewport size in pixels.
    pub viewport: (u64, u64),
    /// How far the viewer moves per list, in pixels of `level`.
    pub step: f64,
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            lists_per_second: 5.0,
            lists: 50,
            tiles: 50,
            level: 0,
            viewport: (1280, 1024),
            step: 96.0,
        }
    }
}

/// What became of one list, summed over the servers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ListRow {
    pub list: u32,
    pub requested: u32,
    pub high: u32,
    pub read: u32,
    pub cache_hits: u32,
    pub sent: u32,
    pub flushed: u32,
    /// Blocks no copy could deliver.
    pub lost: u32,
    /// Median and largest time from the list to each of its high tiles, ms (of those that
    /// arrived before the next list).
    pub high_median_ms: f64,
    pub high_max_ms: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SimReport {
    pub lists: Vec<ListRow>,
    pub requested: u64,
    pub read: u64,
    pub cache_hits: u64,
    pub sent: u64,
    pub flushed: u64,
    pub lost: u64,
    pub high_median_ms: f64,
    pub servers_lost: Vec<String>,
}

/// The viewer's position (top-left of the viewport, level pixels) at step `t`: a Lissajous
/// figure over the level, so the path turns, doubles back and crosses itself.
fn position(t: f64, (lw, lh): (u64, u64), (vw, vh): (u64, u64), step: f64) -> (u64, u64) {
    let (rx, ry) = (lw.saturating_sub(vw) as f64 / 2.0, lh.saturating_sub(vh) as f64 / 2.0);
    let speed = step / rx.max(ry).max(1.0);
    let (x, y) = (rx * (1.0 + (t * speed).sin()), ry * (1.0 + (t * speed * 0.7 + 1.0).sin()));
    (x.max(0.0) as u64, y.max(0.0) as u64)
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What the events of a run add up to.
#[derive(Default)]
struct Tally {
    rows: BTreeMap<u32, ListRow>,
    sent_at: HashMap<u32, Instant>,
    /// The latest list's high tiles not yet arrived, with that list's number.
    highs: HashMap<BlockId, u32>,
    latencies: HashMap<u32, Vec<f64>>,
    all_lat: Vec<f64>,
    lost: u64,
}

impl Tally {
    fn event(&mut self, ev: Event) {
        match ev {
            Event::Block { id, .. } => {
                if let Some(s) = self.highs.remove(&id) {
                    let ms = self.sent_at[&s].elapsed().as_secs_f64() * 1e3;
                    self.latencies.entry(s).or_default().push(ms);
                    self.all_lat.push(ms);
                }
            }
            Event::Lost { id, .. } => {
                self.lost += 1;
                if let Some(s) = self.highs.get(&id) {
                    self.rows.entry(*s).or_default().lost += 1;
                }
            }
            Event::ListDone { seq, stats, .. } => {
                let r = self.rows.entry(seq).or_default();
                r.requested += stats.requested;
                r.read += stats.read;
                r.cache_hits += stats.cache_hits;
                r.sent += stats.sent;
                r.flushed += stats.flushed;
            }
            Event::ServerLost { .. } => {}
        }
    }
}

/// Run `w` against `client`; `on_list` is called after each list is sent (e.g. to kill a
/// server in a test).
pub fn run(
    client: &mut Client,
    w: &Workload,
    mut on_list: impl FnMut(u32),
) -> Result<SimReport, DpssError> {
    let layout = client.layout().clone();
    if layout.kind != "image" {
        return Err(DpssError::Layout("the simulator flies over images".into()));
    }
    let level = w.level.min(layout.levels - 1);
    let size = layout.level_size(level);
    let period = Duration::from_secs_f64(1.0 / w.lists_per_second.max(0.1));
    let mut tally = Tally::default();
    let mut tick = Instant::now();
    for n in 0..w.lists {
        let (x, y) = position(n as f64, size, w.viewport, w.step);
        let (nx, ny) = position(n as f64 + 2.0, size, w.viewport, w.step);
        let rect = |x: u64, y: u64| (x, y, x + w.viewport.0, y + w.viewport.1);
        let mut list = layout.view(level, rect(x, y), w.tiles);
        // Prediction: where the path will be two lists from now, medium.
        for (id, p) in layout.view(level, rect(nx, ny), w.tiles) {
            if p == Priority::High && !list.iter().any(|(b, _)| *b == id) && list.len() < w.tiles {
                list.push((id, Priority::Medium));
            }
        }
        let seq = client.request(&list)?;
        tally.sent_at.insert(seq, Instant::now());
        tally.highs =
            list.iter().filter(|(_, p)| *p == Priority::High).map(|(b, _)| (*b, seq)).collect();
        let row = tally.rows.entry(seq).or_default();
        row.list = seq;
        row.high = tally.highs.len() as u32;
        on_list(seq);
        tick += period;
        while let Some(ev) = client.next(tick.saturating_duration_since(Instant::now())) {
            tally.event(ev);
            if Instant::now() >= tick {
                break;
            }
        }
    }
    // Let the last list finish.
    let end = Instant::now() + Duration::from_secs(10);
    while !tally.highs.is_empty() && Instant::now() < end {
        match client.next(end.saturating_duration_since(Instant::now())) {
            Some(ev) => tally.event(ev),
            None => break,
        }
    }
    let Tally { rows, mut latencies, mut all_lat, lost, .. } = tally;
    let mut rep = SimReport { lost, ..Default::default() };
    for (seq, mut r) in rows {
        if let Some(l) = latencies.get_mut(&seq) {
            r.high_max_ms = l.iter().copied().fold(0.0, f64::max);
            r.high_median_ms = median(l);
        }
        rep.requested += r.requested as u64;
        rep.read += r.read as u64;
        rep.cache_hits += r.cache_hits as u64;
        rep.sent += r.sent as u64;
        rep.flushed += r.flushed as u64;
        rep.lists.push(r);
    }
    rep.high_median_ms = median(&mut all_lat);
    rep.servers_lost = client
        .lost_servers()
        .into_iter()
        .map(|(s, why)| format!("{}: {why}", layout.servers[s].name))
        .collect();
    Ok(rep)
}

impl SimReport {
    /// A short table: one line per list, then the totals.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:>5} {:>9} {:>5} {:>5} {:>10} {:>5} {:>7} {:>5} {:>12} {:>10}\n",
            "LIST",
            "REQUESTED",
            "HIGH",
            "READ",
            "CACHE HITS",
            "SENT",
            "FLUSHED",
            "LOST",
            "HIGH MED ms",
            "HIGH MAX ms"
        );
        for r in &self.lists {
            out.push_str(&format!(
                "{:>5} {:>9} {:>5} {:>5} {:>10} {:>5} {:>7} {:>5} {:>12.1} {:>10.1}\n",
                r.list,
                r.requested,
                r.high,
                r.read,
                r.cache_hits,
                r.sent,
                r.flushed,
                r.lost,
                r.high_median_ms,
                r.high_max_ms
            ));
        }
        out.push_str(&format!(
            "total: {} requested, {} read from disk, {} cache hits, {} sent, {} flushed, {} lost; \
             high-priority tiles in {:.1} ms (median)\n",
            self.requested,
            self.read,
            self.cache_hits,
            self.sent,
            self.flushed,
            self.lost,
            self.high_median_ms
        ));
        for s in &self.servers_lost {
            out.push_str(&format!("server lost: {s}\n"));
        }
        out
    }
}
