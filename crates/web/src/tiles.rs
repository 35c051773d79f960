//! The block store's tiles over HTTP: the web server as a DPSS client (`serve --dpss-master`).
//!
//! - `GET /iiif/{dataset}/info.json` and `GET /iiif/{dataset}/{region}/{size}/0/default.{png,jpg}`:
//!   IIIF Image API 3 at level 0 — exactly the tiles of the pyramid, so OpenSeadragon, Mirador
//!   or Leaflet-IIIF can show a data set;
//! - `POST /api/dpss/view/{dataset}` `{"level", "x0", "y0", "x1", "y1"}` (pixels of that level):
//!   the browser's viewport; the web server sends the block servers a new request list — the
//!   visible tiles high, the ring around them medium, the next finer level low — replacing
//!   the previous one;
//! - `GET /api/dpss/datasets`: the published data sets.
//!
//! Per data set one thread (the pump) owns a `bs_dpss::Client` and sends the lists; the
//! verified blocks that arrive go into an LRU cache and to the requests waiting for them
//! straight from the client's reading threads (one thread hand-off less per miss than through
//! the pump). A tile not in the cache is asked for high priority when no list has it yet —
//! and, unless a viewer sent its viewport in the last seconds, its eight neighbours medium
//! (sent when the block servers have time), since a viewer that asks for one tile asks for
//! the tiles around it next: a IIIF client that sends no viewport gets the ISS paper's
//! prefetching too.
//!
//! A data set dropped, or dropped and loaded again under its name, must not go on being
//! served from what the pump kept: beside each pump a watcher asks the master for the data
//! set's layout every [`LAYOUT_CHECK`], and when the data set is gone or its load mark
//! (`published_ns`) changed, it empties the pump's cache and ends it; the next request starts
//! a pump on the new load (or answers 404). Tiles go out with their digest as `ETag` and
//! `Cache-Control: no-cache`, so a browser asks again (a 304 when unchanged) rather than
//! showing a kept tile of an earlier load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, RawPathParams, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bs_dpss::cache::{Cache, Cached};
use bs_dpss::layout::Layout;
use bs_dpss::{BlockId, Client, ClientOptions, Event, Priority};
use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::oneshot;

use crate::AppState;
use crate::error::WebError;

/// Bytes of tiles each data set's pump keeps.
const CACHE_BYTES: usize = 128 << 20;
/// How long a tile request waits for its block.
const TILE_WAIT: Duration = Duration::from_secs(30);
/// Most tiles a viewport list holds.
const VIEW_TILES: usize = 256;
/// How long a viewport sent by a viewer guides the lists (instead of the wanted tiles'
/// neighbours).
const VIEW_GUIDES: Duration = Duration::from_secs(10);
/// Most neighbours of wanted tiles a list holds at medium priority (the oldest go first):
/// every list sent carries them all.
const AROUND_TILES: usize = 256;
/// How often a pump's watcher asks the master whether its data set is still the same load:
/// the longest a dropped or reloaded data set's tiles are still served from the pump's cache.
pub const LAYOUT_CHECK: Duration = Duration::from_secs(1);

/// A tile's bytes and digest, or why it cannot be had.
type TileAnswer = Result<(Bytes, [u8; 16]), String>;

/// Who waits for which tile: filled by the request handlers, answered by the client's reading
/// threads as blocks arrive (or by the pump, with why a tile cannot be had).
type Waiting = Mutex<HashMap<BlockId, Vec<oneshot::Sender<TileAnswer>>>>;

enum Cmd {
    View(Vec<(BlockId, Priority)>),
    /// A handler waits for this tile (it is in `Pump::waiting`): ask for it.
    Want(BlockId),
    /// The data set is gone or was loaded again: fail the waiters with this and end.
    End(String),
}

struct Pump {
    layout: Layout,
    tx: mpsc::Sender<Cmd>,
    waker: bs_dpss::Waker,
    /// Verified tiles, shared so a request for one already here never waits on the pump.
    cache: Arc<Mutex<Cache>>,
    /// Taken before `cache` when both are held.
    waiting: Arc<Waiting>,
    /// Set (and the cache emptied) when the data set is gone or loaded again: the pump is
    /// not handed out any more.
    ended: Arc<AtomicBool>,
}

impl Pump {
    /// Stop handing this pump out, forget its tiles, and tell its thread why.
    fn end(&self, why: String) {
        self.ended.store(true, Ordering::SeqCst);
        *self.cache.lock().unwrap() = Cache::new(CACHE_BYTES);
        let _ = self.tx.send(Cmd::End(why));
        self.waker.wake();
    }
}

/// The block store as the web server sees it.
pub struct Tiles {
    master: String,
    opts: ClientOptions,
    pumps: Mutex<HashMap<String, Arc<Pump>>>,
    /// Per data set, a lock held while its pump starts, so the first requests of a data set
    /// arriving together start one client between them, not one each (and a data set whose
    /// servers are slow to answer holds up no other).
    starting: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

impl Tiles {
    pub fn new(master: String, opts: ClientOptions) -> Self {
        Self { master, opts, pumps: Mutex::default(), starting: Mutex::default() }
    }

    fn existing(&self, dataset: &str) -> Option<Arc<Pump>> {
        let mut pumps = self.pumps.lock().unwrap();
        let p = pumps.get(dataset)?;
        if p.ended.load(Ordering::SeqCst) {
            pumps.remove(dataset);
            return None;
        }
        Some(p.clone())
    }

    /// The pump of `dataset`, started on first use (again if the last one ended).
    fn pump(&self, dataset: &str) -> Result<Arc<Pump>, WebError> {
        bs_dpss::block::check_name(dataset).map_err(|e| WebError::BadRequest(e.to_string()))?;
        if let Some(p) = self.existing(dataset) {
            return Ok(p);
        }
        let slot = self.starting.lock().unwrap().entry(dataset.to_string()).or_default().clone();
        let started = {
            let _one_at_a_time = slot.lock().unwrap_or_else(|p| p.into_inner());
            match self.existing(dataset) {
                Some(p) => Ok(p),
                None => self.start(dataset),
            }
        };
        // The slot is kept only while someone waits on it: names asked once stay no longer.
        let mut starting = self.starting.lock().unwrap();
        if starting.get(dataset).is_some_and(|s| Arc::ptr_eq(s, &slot) && Arc::strong_count(s) == 2)
        {
            starting.remove(dataset);
        }
        started
    }

    /// Start the pump of `dataset` (its slot in `starting` held).
    fn start(&self, dataset: &str) -> Result<Arc<Pump>, WebError> {
        let client = Client::open(&self.master, dataset, self.opts.clone()).map_err(dpss_error)?;
        let layout = client.layout().clone();
        let waker = client.waker();
        let cache = Arc::new(Mutex::new(Cache::new(CACHE_BYTES)));
        let waiting = Arc::new(Waiting::default());
        let (tx, rx) = mpsc::channel();
        let ended = Arc::new(AtomicBool::new(false));
        // A tile goes to its waiters from the thread that read it (checked against its
        // digest there), not through the pump: one thread hand-off less on every miss.
        let (c, w, e, d) = (cache.clone(), waiting.clone(), ended.clone(), dataset.to_string());
        client.on_block(Arc::new(move |id, data, digest| {
            let data = Bytes::copy_from_slice(data);
            let mut waiters = w.lock().unwrap();
            let mut kept = c.lock().unwrap();
            // Once ended (the data set gone or loaded again), its emptied cache stays so.
            if !e.load(Ordering::SeqCst) {
                kept.insert(&d, id, Cached { data: data.clone(), digest });
            }
            drop(kept);
            let txs = waiters.remove(&id);
            drop(waiters);
            for tx in txs.into_iter().flatten() {
                let _ = tx.send(Ok((data.clone(), digest)));
            }
        }));
        let (c, w, e) = (cache.clone(), waiting.clone(), ended.clone());
        std::thread::Builder::new()
            .name(format!("dpss-pump-{dataset}"))
            .spawn(move || {
                pump(client, rx, &c, &w);
                // However it ended, it is not handed out any more, and nobody waits on it.
                let mut waiters = w.lock().unwrap();
                e.store(true, Ordering::SeqCst);
                fail_all(&mut waiters, "the block store client ended; retry");
            })
            .map_err(WebError::internal)?;
        let p = Arc::new(Pump { layout, tx, waker, cache, waiting, ended });
        let (master, opts, watched) = (self.master.clone(), self.opts.clone(), Arc::downgrade(&p));
        std::thread::Builder::new()
            .name(format!("dpss-watch-{dataset}"))
            .spawn(move || watch(&master, &opts, &watched))
            .map_err(WebError::internal)?;
        self.pumps.lock().unwrap().insert(dataset.to_string(), p.clone());
        Ok(p)
    }

    fn send(&self, dataset: &str, p: &Pump, cmd: Cmd) -> Result<(), WebError> {
        if p.tx.send(cmd).is_err() {
            self.pumps.lock().unwrap().remove(dataset);
            return Err(WebError::Busy(format!(
                "the block store client of {dataset:?} ended; retry"
            )));
        }
        p.waker.wake();
        Ok(())
    }
}

/// The watcher of pump `p`: every [`LAYOUT_CHECK`], is its data set still the load it serves?
/// Ends the pump when the master says the data set is unknown or has another load mark; a
/// master that cannot be reached ends nothing (the tiles in hand are still that load's).
/// Returns when the pump has ended or nobody holds it any more (the web server stopped).
fn watch(master: &str, opts: &ClientOptions, p: &std::sync::Weak<Pump>) {
    let mut unreachable = false;
    let mut lookups = match bs_dpss::client::Lookups::new(master, opts) {
        Ok(l) => l,
        // Unwatched, a pump could serve a dropped load's tiles: it ends instead.
        Err(e) => return p.upgrade().into_iter().for_each(|p| p.end(format!("{e}; retry"))),
    };
    loop {
        std::thread::sleep(LAYOUT_CHECK);
        let Some(p) = p.upgrade().filter(|p| !p.ended.load(Ordering::SeqCst)) else { return };
        let dataset = &p.layout.dataset;
        let why = match lookups.lookup(dataset) {
            Ok(l) if l.published_ns == p.layout.published_ns => None,
            Ok(_) => Some(format!("{dataset:?} was loaded again; retry")),
            Err(e) => match dpss_error(e) {
                WebError::NoRoute(_) => Some(format!("{dataset:?} was dropped")),
                e => {
                    if !unreachable {
                        tracing::warn!(%dataset, error = %e, "cannot ask the block store's master");
                    }
                    unreachable = true;
                    continue;
                }
            },
        };
        unreachable = false;
        if let Some(why) = why {
            tracing::info!(%dataset, %why, "forgetting the data set's tiles");
            p.end(why);
        }
    }
}

fn dpss_error(e: bs_dpss::DpssError) -> WebError {
    use bs_dpss::DpssError as D;
    match e {
        D::UnknownDataset(d) => WebError::NoRoute(format!("data set {d:?}")),
        D::Master(m) if m.contains("unknown data set") => WebError::NoRoute(m),
        D::UnknownBlock { .. } | D::BadName(_) => WebError::BadRequest(e.to_string()),
        e => WebError::Busy(format!("the block store: {e}")),
    }
}

/// Answer every waiter with `why`.
fn fail_all(waiters: &mut HashMap<BlockId, Vec<oneshot::Sender<TileAnswer>>>, why: &str) {
    for tx in waiters.drain().flat_map(|(_, txs)| txs) {
        let _ = tx.send(Err(why.to_string()));
    }
}

/// The pump's loop: turns wanted tiles and viewports into request lists. The blocks that
/// arrive reach their waiters and the cache from the client's reading threads (`on_block`);
/// here they only leave the list.
fn pump(mut client: Client, rx: mpsc::Receiver<Cmd>, cache: &Mutex<Cache>, waiting: &Waiting) {
    let dataset = client.layout().dataset.clone();
    let mut list: Vec<(BlockId, Priority)> = Vec::new();
    // When a viewer last said what it shows.
    let mut last_view: Option<std::time::Instant> = None;
    loop {
        let mut changed = false;
        loop {
            match rx.try_recv() {
                Ok(Cmd::View(v)) => {
                    list = v;
                    changed = true;
                    last_view = Some(std::time::Instant::now());
                }
                Ok(Cmd::Want(id)) => {
                    // Arrived meanwhile: its waiters have it.
                    if cache.lock().unwrap().contains(&dataset, id) {
                        continue;
                    }
                    changed |= ask_high(&mut list, id);
                    // A viewer that sends its viewport has its ring asked for already;
                    // for a client that sends none, the tile's neighbours. They alone do not
                    // make a new list worth sending (each flushes the block servers'
                    // unserved requests): they go with the next one.
                    if last_view.is_none_or(|t| t.elapsed() > VIEW_GUIDES) {
                        ask_around(&mut list, client.layout(), id);
                    }
                }
                Ok(Cmd::End(why)) => return fail_all(&mut waiting.lock().unwrap(), &why),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        }
        if changed {
            // A new view replaces the list, but a tile someone waits for stays asked for:
            // dropped from the list (or only low in it), the block servers would flush its
            // request and the waiter would wait out TILE_WAIT for nothing.
            let waited: Vec<BlockId> = waiting.lock().unwrap().keys().copied().collect();
            for id in waited {
                ask_high(&mut list, id);
            }
            // Blocks already here are not asked again.
            let have = cache.lock().unwrap();
            list.retain(|(b, _)| !have.contains(&dataset, *b));
            drop(have);
            list.truncate(bs_dpss::conn::MAX_LIST);
            if let Err(e) = client.request(&list) {
                tracing::warn!(%dataset, error = %e, "block store list refused");
            }
        }
        // Commands wake this (Tiles::send); the timeout only bounds how long a closed
        // waiter is kept.
        match client.next(Duration::from_secs(1)) {
            // Its waiters and the cache had it from the reading thread.
            Some(Event::Block { id, .. }) => list.retain(|(b, _)| *b != id),
            Some(Event::Lost { id, reason }) => {
                list.retain(|(b, _)| *b != id);
                let txs = waiting.lock().unwrap().remove(&id);
                for tx in txs.into_iter().flatten() {
                    let _ = tx.send(Err(reason.clone()));
                }
            }
            Some(Event::ServerLost { server, reason }) => {
                tracing::warn!(%dataset, server, %reason, "block server lost");
                if client.lost_servers().len() == client.layout().servers.len() {
                    // Nothing left to ask: end, so the next request starts a fresh client
                    // (servers back, or the data set loaded again).
                    let why = "every block server of the data set was lost";
                    return fail_all(&mut waiting.lock().unwrap(), why);
                }
            }
            Some(Event::ListDone { .. }) | None => {}
        }
        waiting.lock().unwrap().retain(|_, txs| {
            txs.retain(|t| !t.is_closed());
            !txs.is_empty()
        });
    }
}

fn tiles(s: &AppState) -> Result<&Tiles, WebError> {
    s.tiles.as_deref().ok_or_else(|| {
        WebError::NoRoute(
            "the block store is not configured (start serve with --dpss-master)".into(),
        )
    })
}

async fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WebError> + Send + 'static,
) -> Result<T, WebError> {
    crate::blocking(f).await
}

/// The pump of `dataset`: straight from the map when running, else started off the executor.
async fn pump_of(s: &Arc<AppState>, dataset: &str) -> Result<Arc<Pump>, WebError> {
    if let Some(p) = tiles(s)?.existing(dataset) {
        return Ok(p);
    }
    let st = s.clone();
    let d = dataset.to_string();
    off_thread(move || tiles(&st)?.pump(&d)).await
}

/// `GET /iiif/{dataset}`, the image's base URI: a 303 to its info.json (IIIF Image API 3 §2.2).
pub async fn base(
    State(s): State<Arc<AppState>>,
    Path(dataset): Path<String>,
) -> Result<Response, WebError> {
    pump_of(&s, &dataset).await?;
    let to = format!("/iiif/{dataset}/info.json");
    let mut r = StatusCode::SEE_OTHER.into_response();
    let location = HeaderValue::from_str(&to).map_err(|e| WebError::BadRequest(e.to_string()))?;
    r.headers_mut().insert(header::LOCATION, location);
    Ok(r)
}

/// `GET /iiif/{dataset}/info.json`. Its `id` is absolute (IIIF requires it: a viewer on
/// another origin builds tile URLs from it), made from the request's `Host`; `maxWidth` and
/// `maxHeight` say what `full/max` serves at level 0: the whole image at the first level
/// that fits one tile.
pub async fn info(
    State(s): State<Arc<AppState>>,
    Path(dataset): Path<String>,
    headers: HeaderMap,
) -> Result<Response, WebError> {
    let p = pump_of(&s, &dataset).await?;
    let l = &p.layout;
    if l.kind != "image" {
        return Err(WebError::NoRoute(format!("{dataset:?} is a file, not an image")));
    }
    let scale: Vec<u64> = (0..l.levels).map(|i| 1u64 << i).collect();
    let scheme = if s.cfg.tls.is_some() { "https" } else { "http" };
    let id = match headers.get(header::HOST).and_then(|h| h.to_str().ok()) {
        Some(host) => format!("{scheme}://{host}/iiif/{dataset}"),
        None => format!("/iiif/{dataset}"),
    };
    let t = u64::from(l.tile);
    let (max_w, max_h) = (0..l.levels)
        .map(|level| l.level_size(level))
        .find(|&(w, h)| w <= t && h <= t)
        .unwrap_or((l.width, l.height));
    let body = serde_json::json!({
        "@context": "http://iiif.io/api/image/3/context.json",
        "id": id,
        "type": "ImageService3",
        "protocol": "http://iiif.io/api/image",
        "profile": "level0",
        "width": l.width,
        "height": l.height,
        "maxWidth": max_w,
        "maxHeight": max_h,
        "tiles": [{ "width": l.tile, "height": l.tile, "scaleFactors": scale }],
        "preferredFormats": [if l.format == "jpeg" { "jpg" } else { "png" }],
    });
    let mut r = axum::Json(body).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(
            "application/ld+json;profile=\"http://iiif.io/api/image/3/context.json\"",
        ),
    );
    Ok(r)
}

/// The block a IIIF level-0 request names, or why it names none.
pub fn tile_of(l: &Layout, region: &str, size: &str) -> Result<BlockId, String> {
    let num = |v: &str| v.parse::<u64>().map_err(|_| format!("{v:?} is not a number"));
    let (x, y, w, h) = if region == "full" {
        (0, 0, l.width, l.height)
    } else {
        let p: Vec<&str> = region.split(',').collect();
        if p.len() != 4 {
            return Err(format!("region {region:?}: use full or x,y,w,h"));
        }
        (num(p[0])?, num(p[1])?, num(p[2])?, num(p[3])?)
    };
    if w == 0 || h == 0 || x >= l.width || y >= l.height {
        return Err(format!("region {region:?} is empty or outside the image"));
    }
    let (w, h) = (w.min(l.width - x), h.min(l.height - y));
    let (sw, sh) = match size {
        "max" => (None, None),
        s => {
            let (a, b) =
                s.split_once(',').ok_or_else(|| format!("size {s:?}: use max, w, ,h or w,h"))?;
            let a = (!a.is_empty()).then(|| num(a)).transpose()?;
            let b = (!b.is_empty()).then(|| num(b)).transpose()?;
            if a.is_none() && b.is_none() {
                return Err(format!("size {s:?}: use max, w, ,h or w,h"));
            }
            (a, b)
        }
    };
    let t = l.tile as u64;
    for level in 0..l.levels {
        let f = 1u64 << level;
        let (tw, th) = (w.div_ceil(f), h.div_ceil(f));
        let fits = |want: Option<u64>, got: u64| want.is_none_or(|v| v == got);
        let size_ok = if size == "max" { tw <= t && th <= t } else { fits(sw, tw) && fits(sh, th) };
        let span = t * f;
        let (lw, lh) = l.level_size(level);
        let aligned = x % span == 0
            && y % span == 0
            && tw == (t).min(lw - x / f)
            && th == (t).min(lh - y / f);
        if size_ok && aligned {
            return Ok(BlockId::new(level as u8, (x / span) as u32, (y / span) as u32));
        }
    }
    Err(format!(
        "level 0 serves only the pyramid's tiles: region {region:?} at size {size:?} is not one"
    ))
}

/// `GET /iiif/{dataset}/{region}/{size}/{rotation}/{file}`.
pub async fn tile(
    State(s): State<Arc<AppState>>,
    params: RawPathParams,
    headers: HeaderMap,
) -> Result<Response, WebError> {
    // Borrowed from the router's parameters (`Path<(String, ...)>` copied each into a String).
    let [mut dataset, mut region, mut size, mut rotation, mut file] = [""; 5];
    for (k, v) in params.iter() {
        match k {
            "dataset" => dataset = v,
            "region" => region = v,
            "size" => size = v,
            "rotation" => rotation = v,
            "file" => file = v,
            _ => {}
        }
    }
    let p = pump_of(&s, dataset).await?;
    let l = &p.layout;
    let (ext, default) =
        if l.format == "jpeg" { ("jpg", "default.jpg") } else { ("png", "default.png") };
    if rotation != "0" || file != default {
        return Err(WebError::BadRequest(format!(
            "level 0: rotation 0 and default.{ext} only (asked {rotation}/{file})"
        )));
    }
    let id = tile_of(l, region, size).map_err(WebError::BadRequest)?;
    // Checked against the tile's digest on every read, not only when it arrived.
    let hit = Cache::get_verified(&p.cache, dataset, id).map(|c| (c.data, c.digest));
    let (data, digest) = match hit {
        Some(d) => d,
        None => want(&s, dataset, &p, id).await?,
    };
    let etag = tile_etag(&digest);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|inm| crate::blobs::client_has(inm, etag.to_str().unwrap_or("")));
    let mut r = if fresh { StatusCode::NOT_MODIFIED.into_response() } else { data.into_response() };
    let h = r.headers_mut();
    if !fresh {
        let mime = if ext == "jpg" { "image/jpeg" } else { "image/png" };
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(mime));
    }
    h.insert(header::ETAG, etag);
    // Kept by the browser, but asked for again each time (a 304 while unchanged): the data
    // set may be dropped or loaded again under the same name.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, no-cache"));
    Ok(r)
}

/// A tile's `ETag`: its digest in hex, quoted (built on the stack: one per tile served).
fn tile_etag(digest: &[u8; 16]) -> HeaderValue {
    let mut v = [b'"'; 34];
    hex::encode_to_slice(digest, &mut v[1..33]).expect("32 hex digits fit 32 bytes");
    HeaderValue::from_bytes(&v).expect("hex digits and quotes are a valid header value")
}

/// Ask the pump for a tile not in the cache and wait for it.
/// Make sure `list` has `id` on its way, high: someone waits for it. Unless it is there at
/// high priority, put it at the head (a medium tile — a ring or neighbour asked for ahead —
/// is sent only when no high one is ready, a low one never). Whether the list changed.
fn ask_high(list: &mut Vec<(BlockId, Priority)>, id: BlockId) -> bool {
    match list.iter().position(|(b, _)| *b == id) {
        Some(i) if list[i].1 == Priority::High => false,
        found => {
            if let Some(i) = found {
                list.remove(i);
            }
            list.insert(0, (id, Priority::High));
            true
        }
    }
}

/// Put the tiles around `id` (its level, the eight neighbours in the grid) on `list` at
/// medium priority, after what is there, unless they are on it already. Whether the list
/// changed.
fn ask_around(list: &mut Vec<(BlockId, Priority)>, layout: &Layout, id: BlockId) -> bool {
    let (tx, ty) = layout.grid(id.level as u32);
    let mut changed = false;
    for dy in -1i64..=1 {
        for dx in -1i64..=1 {
            let (x, y) = (id.x as i64 + dx, id.y as i64 + dy);
            if (dx, dy) == (0, 0) || x < 0 || y < 0 || x as u64 >= tx || y as u64 >= ty {
                continue;
            }
            let n = BlockId::new(id.level, x as u32, y as u32);
            if !list.iter().any(|(b, _)| *b == n) {
                list.push((n, Priority::Medium));
                changed = true;
            }
        }
    }
    let mut extra = list.iter().filter(|(_, p)| *p == Priority::Medium).count();
    while extra > AROUND_TILES {
        if let Some(i) = list.iter().position(|(_, p)| *p == Priority::Medium) {
            list.remove(i);
        }
        extra -= 1;
    }
    changed
}

async fn want(
    s: &Arc<AppState>,
    dataset: &str,
    p: &Pump,
    id: BlockId,
) -> Result<(Bytes, [u8; 16]), WebError> {
    let (tx, rx) = oneshot::channel();
    {
        let mut waiters = p.waiting.lock().unwrap();
        // Looked for again under the lock the reading threads answer waiters under: a tile
        // that arrived since the handler looked is here now, one arriving later finds `tx`.
        if let Some(c) = Cache::get_verified(&p.cache, dataset, id) {
            return Ok((c.data, c.digest));
        }
        if p.ended.load(Ordering::SeqCst) {
            return Err(WebError::Busy(format!(
                "the block store client of {dataset:?} ended; retry"
            )));
        }
        waiters.entry(id).or_default().push(tx);
    }
    tiles(s)?.send(dataset, p, Cmd::Want(id))?;
    Ok(match tokio::time::timeout(TILE_WAIT, rx).await {
        Ok(Ok(Ok(d))) => d,
        Ok(Ok(Err(reason))) => return Err(WebError::Busy(format!("tile {id}: {reason}"))),
        Ok(Err(_)) => {
            return Err(WebError::Busy(format!("tile {id}: the block store client ended")));
        }
        Err(_) => {
            return Err(WebError::Busy(format!("tile {id} did not arrive within {TILE_WAIT:?}")));
        }
    })
}

#[derive(Deserialize)]
pub struct View {
    level: u32,
    x0: u64,
    y0: u64,
    x1: u64,
    y1: u64,
}

/// `POST /api/dpss/view/{dataset}`: the viewport, as a new request list.
pub async fn view(
    State(s): State<Arc<AppState>>,
    Path(dataset): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, WebError> {
    let v: View =
        serde_json::from_slice(&body).map_err(|e| WebError::BadRequest(format!("view: {e}")))?;
    if v.x1 <= v.x0 || v.y1 <= v.y0 {
        return Err(WebError::BadRequest("view: x1 > x0 and y1 > y0, please".into()));
    }
    let p = pump_of(&s, &dataset).await?;
    if v.level >= p.layout.levels {
        return Err(WebError::BadRequest(format!("{dataset} has levels 0..{}", p.layout.levels)));
    }
    let list = p.layout.view(v.level, (v.x0, v.y0, v.x1, v.y1), VIEW_TILES);
    let (high, medium, low) = list.iter().fold((0, 0, 0), |(h, m, l), (_, p)| match p {
        Priority::High => (h + 1, m, l),
        Priority::Medium => (h, m + 1, l),
        Priority::Low => (h, m, l + 1),
    });
    tiles(&s)?.send(&dataset, &p, Cmd::View(list))?;
    Ok(axum::Json(serde_json::json!({ "high": high, "medium": medium, "low": low }))
        .into_response())
}

/// `GET /api/dpss/datasets`.
pub async fn datasets(State(s): State<Arc<AppState>>) -> Result<Response, WebError> {
    let (master, opts) = (tiles(&s)?.master.clone(), tiles(&s)?.opts.clone());
    let st = off_thread(move || {
        bs_dpss::master::fetch_status(&master, &opts)
            .map_err(|e| WebError::Busy(format!("the block store: {e}")))
    })
    .await?;
    let sets: Vec<_> = st.datasets.into_iter().filter_map(|d| Layout::try_from(d).ok()).collect();
    Ok(axum::Json(serde_json::json!({ "datasets": sets })).into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_waited_for_tile_is_put_back_high_whatever_the_view_says() {
        let (a, b, c) = (BlockId::new(0, 0, 0), BlockId::new(0, 1, 0), BlockId::new(0, 2, 0));
        // Dropped from the new view's list: asked for again, first.
        let mut list = vec![(b, Priority::High)];
        assert!(ask_high(&mut list, a));
        assert_eq!(list, vec![(a, Priority::High), (b, Priority::High)]);
        // Only low in it (read, never sent): raised.
        let mut list = vec![(b, Priority::High), (c, Priority::Low)];
        assert!(ask_high(&mut list, c));
        assert_eq!(list, vec![(c, Priority::High), (b, Priority::High)]);
        // Only medium (asked for ahead, sent when there is time): raised too.
        let mut list = vec![(b, Priority::High), (c, Priority::Medium)];
        assert!(ask_high(&mut list, c));
        assert_eq!(list, vec![(c, Priority::High), (b, Priority::High)]);
        // High already: left alone.
        assert!(!ask_high(&mut list, c));
        assert!(!ask_high(&mut list, b));
        assert_eq!(list.len(), 2);
    }

    use super::*;
    use bs_dpss::ServerRef;

    #[test]
    fn a_wanted_tiles_neighbours_are_asked_for_medium_once() {
        let servers = vec![ServerRef { name: "s".into(), addr: "a".into(), disks: 1 }];
        let l = Layout::plan("d", "image", (1000, 600), 256, servers, 1).unwrap();
        // In a corner of the 4 × 3 grid: three neighbours.
        let mut list = vec![(BlockId::new(0, 0, 0), Priority::High)];
        assert!(ask_around(&mut list, &l, BlockId::new(0, 0, 0)));
        let medium: Vec<_> =
            list.iter().filter(|(_, p)| *p == Priority::Medium).map(|(b, _)| *b).collect();
        assert_eq!(medium, [BlockId::new(0, 1, 0), BlockId::new(0, 0, 1), BlockId::new(0, 1, 1)]);
        // Inside: eight, those already listed (at any priority) left as they are.
        let mut list = vec![(BlockId::new(0, 1, 1), Priority::Low)];
        assert!(ask_around(&mut list, &l, BlockId::new(0, 2, 1)));
        assert_eq!(list.len(), 8);
        assert_eq!(list[0], (BlockId::new(0, 1, 1), Priority::Low));
        assert!(!ask_around(&mut list, &l, BlockId::new(0, 2, 1)), "nothing new");
    }

    #[test]
    fn iiif_requests_map_to_exactly_the_pyramids_tiles() {
        let servers = vec![ServerRef { name: "s".into(), addr: "a".into(), disks: 1 }];
        let l = Layout::plan("d", "image", (1000, 600), 256, servers, 1).unwrap();
        // Level 0, second tile of the first row; the edge tile is short.
        assert_eq!(tile_of(&l, "256,0,256,256", "256,256"), Ok(BlockId::new(0, 1, 0)));
        assert_eq!(tile_of(&l, "768,512,232,88", "232,"), Ok(BlockId::new(0, 3, 2)));
        // Level 1: 512-pixel regions at 256.
        assert_eq!(tile_of(&l, "512,0,488,512", "244,256"), Ok(BlockId::new(1, 1, 0)));
        // The whole image, as its top level.
        assert_eq!(tile_of(&l, "full", "250,150"), Ok(BlockId::new(2, 0, 0)));
        assert_eq!(tile_of(&l, "full", "max"), Ok(BlockId::new(2, 0, 0)));
        for (r, s) in [
            ("10,0,256,256", "256,"),
            ("0,0,256,256", "128,"),
            ("0,0,1", "max"),
            ("5000,0,1,1", "1,"),
            ("0,0,256,256", "x,"),
        ] {
            assert!(tile_of(&l, r, s).is_err(), "{r} {s}");
        }
    }
}
