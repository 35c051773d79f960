// The block store's tiled viewer (see dpss.html). The view is (cx, cy, scale): the image
// point at the canvas centre, in full-resolution pixels, and screen pixels per image pixel.
// The level drawn is the coarsest whose pixels are still no larger than a screen pixel;
// coarser tiles already loaded are drawn first as a placeholder. window.dpssViewer exposes the
// state to tests.

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const dataset = params.get('dataset');

const state = {
  info: null, levels: 0, tile: 256, cx: 0, cy: 0, scale: 1,
  tiles: new Map(), // url -> { img, ok }
  loaded: 0, failed: 0, views: 0, viewsOwed: 0, level: 0, ready: false,
  // performance.now() when the first tile was drawn, and when every visible tile of the level
  // shown first was (time to first tile, time to a full viewport).
  firstTileMs: null, fullViewMs: null,
};

function fail(msg) {
  $('error').textContent = msg;
}

async function listSets() {
  const r = await fetch('/api/dpss/datasets');
  if (!r.ok) {
    fail(`data sets: ${(await r.json().catch(() => ({}))).error?.message || r.status}`);
    return;
  }
  const { datasets } = await r.json();
  const ul = $('sets');
  ul.hidden = false;
  for (const d of datasets.filter((d) => d.kind === 'image')) {
    const li = document.createElement('li');
    const a = document.createElement('a');
    a.href = `/dpss.html?dataset=${encodeURIComponent(d.dataset)}`;
    a.textContent = `${d.dataset} — ${d.width} × ${d.height}, ${d.levels} levels, ${d.blocks} tiles on ${d.servers.length} servers`;
    li.append(a);
    ul.append(li);
  }
  if (!ul.children.length) ul.textContent = 'No image data sets: load one with blobstream dpss load.';
  state.ready = true;
}

const canvas = $('canvas');
const ctx = canvas.getContext('2d');

function resize() {
  canvas.width = canvas.clientWidth;
  canvas.height = canvas.clientHeight;
}

function fit() {
  const { width, height } = state.info;
  state.scale = Math.min(canvas.width / width, canvas.height / height);
  state.cx = width / 2;
  state.cy = height / 2;
}

function levelFor(scale) {
  const l = Math.floor(Math.log2(1 / scale));
  return Math.max(0, Math.min(state.levels - 1, l));
}

function levelSize(l) {
  let w = state.info.width;
  let h = state.info.height;
  for (let i = 0; i < l; i++) { w = Math.ceil(w / 2); h = Math.ceil(h / 2); }
  return [w, h];
}

// The part of the image on screen, in full-resolution pixels (clamped to the image).
function visible() {
  const hw = canvas.width / 2 / state.scale;
  const hh = canvas.height / 2 / state.scale;
  const x0 = Math.max(0, state.cx - hw);
  const y0 = Math.max(0, state.cy - hh);
  const x1 = Math.min(state.info.width, state.cx + hw);
  const y1 = Math.min(state.info.height, state.cy + hh);
  return [x0, y0, x1, y1];
}

function tileUrl(l, x, y) {
  const f = 2 ** l;
  const span = state.tile * f;
  const rx = x * span;
  const ry = y * span;
  const rw = Math.min(span, state.info.width - rx);
  const rh = Math.min(span, state.info.height - ry);
  const sw = Math.ceil(rw / f);
  const sh = Math.ceil(rh / f);
  return `/iiif/${encodeURIComponent(dataset)}/${rx},${ry},${rw},${rh}/${sw},${sh}/0/default.png`;
}

function tilesOf(l, [x0, y0, x1, y1]) {
  const span = state.tile * 2 ** l;
  const [lw, lh] = levelSize(l);
  const nx = Math.ceil(lw / state.tile);
  const ny = Math.ceil(lh / state.tile);
  const out = [];
  for (let y = Math.floor(y0 / span); y < Math.min(ny, Math.ceil(y1 / span)); y++) {
    for (let x = Math.floor(x0 / span); x < Math.min(nx, Math.ceil(x1 / span)); x++) out.push([x, y]);
  }
  return out;
}

function want(l, x, y) {
  const url = tileUrl(l, x, y);
  let t = state.tiles.get(url);
  if (!t) {
    t = { img: new Image(), ok: false };
    t.img.onload = () => { t.ok = true; state.loaded++; draw(); };
    t.img.onerror = () => { state.failed++; state.tiles.delete(url); };
    t.img.src = url;
    state.tiles.set(url, t);
    if (state.tiles.size > 1500) {
      // Forget the oldest requests (Map keeps insertion order).
      for (const k of [...state.tiles.keys()].slice(0, 500)) state.tiles.delete(k);
    }
  }
  return t;
}

function drawTile(l, x, y, t) {
  const span = state.tile * 2 ** l;
  const sx = (x * span - state.cx) * state.scale + canvas.width / 2;
  const sy = (y * span - state.cy) * state.scale + canvas.height / 2;
  const w = t.img.naturalWidth * 2 ** l * state.scale;
  const h = t.img.naturalHeight * 2 ** l * state.scale;
  ctx.drawImage(t.img, sx, sy, w, h);
}

let postTimer = null;
let lastView = '';
// Viewports drawn since the debounce timer last fired (those its next post settles).
let debounced = 0;

function postView(level, [x0, y0, x1, y1]) {
  const f = 2 ** level;
  const body = JSON.stringify({
    level,
    x0: Math.floor(x0 / f), y0: Math.floor(y0 / f),
    x1: Math.max(Math.floor(x0 / f) + 1, Math.ceil(x1 / f)),
    y1: Math.max(Math.floor(y0 / f) + 1, Math.ceil(y1 / f)),
  });
  if (body === lastView) return;
  lastView = body;
  clearTimeout(postTimer);
  state.viewsOwed++;
  debounced++;
  // A pan sends one list when it pauses, not one per mouse move.
  postTimer = setTimeout(async () => {
    // Only the views debounced into this post: one still in flight settles its own.
    const owed = debounced;
    debounced = 0;
    try {
      const r = await fetch(`/api/dpss/view/${encodeURIComponent(dataset)}`, {
        method: 'POST', headers: { 'content-type': 'application/json' }, body,
      });
      if (r.ok) state.views++;
      else fail(`view: ${(await r.json().catch(() => ({}))).error?.message || r.status}`);
    } finally {
      // Views superseded while this one was debounced are settled by it.
      state.viewsOwed -= owed;
    }
  }, 40);
}

function draw() {
  if (!state.info) return;
  ctx.fillStyle = '#111';
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const vis = visible();
  const level = levelFor(state.scale);
  state.level = level;
  // Placeholders: coarser levels already loaded, coarsest first.
  for (let l = state.levels - 1; l > level; l--) {
    for (const [x, y] of tilesOf(l, vis)) {
      const t = state.tiles.get(tileUrl(l, x, y));
      if (t?.ok) drawTile(l, x, y, t);
    }
  }
  let complete = true;
  for (const [x, y] of tilesOf(level, vis)) {
    const t = want(level, x, y);
    if (t.ok) {
      drawTile(level, x, y, t);
      state.firstTileMs ??= performance.now();
    } else {
      complete = false;
    }
  }
  if (complete && state.firstTileMs != null) state.fullViewMs ??= performance.now();
  postView(level, vis);
  $('info').textContent = `level ${level} of ${state.levels - 1} · ${(state.scale * 100).toPrecision(3)}% · ${state.loaded} tiles loaded`;
}

function zoomAt(factor, px = canvas.width / 2, py = canvas.height / 2) {
  const ix = state.cx + (px - canvas.width / 2) / state.scale;
  const iy = state.cy + (py - canvas.height / 2) / state.scale;
  const min = Math.min(canvas.width / state.info.width, canvas.height / state.info.height) / 2;
  state.scale = Math.max(min, Math.min(4, state.scale * factor));
  state.cx = ix - (px - canvas.width / 2) / state.scale;
  state.cy = iy - (py - canvas.height / 2) / state.scale;
  draw();
}

function pan(dx, dy) {
  state.cx -= dx / state.scale;
  state.cy -= dy / state.scale;
  draw();
}

async function open() {
  $('name').textContent = dataset;
  document.title = `${dataset} — blobstream block store`;
  const r = await fetch(`/iiif/${encodeURIComponent(dataset)}/info.json`);
  if (!r.ok) {
    fail(`${dataset}: ${(await r.json().catch(() => ({}))).error?.message || r.status}`);
    state.ready = true;
    return;
  }
  state.info = await r.json();
  state.tile = state.info.tiles[0].width;
  state.levels = state.info.tiles[0].scaleFactors.length;
  $('stage').hidden = false;
  resize();
  fit();
  draw();
  let drag = null;
  canvas.addEventListener('pointerdown', (e) => { drag = [e.clientX, e.clientY]; canvas.setPointerCapture(e.pointerId); });
  canvas.addEventListener('pointermove', (e) => {
    if (!drag) return;
    pan(e.clientX - drag[0], e.clientY - drag[1]);
    drag = [e.clientX, e.clientY];
  });
  canvas.addEventListener('pointerup', () => { drag = null; });
  canvas.addEventListener('wheel', (e) => {
    e.preventDefault();
    const rect = canvas.getBoundingClientRect();
    zoomAt(e.deltaY < 0 ? 1.25 : 0.8, e.clientX - rect.left, e.clientY - rect.top);
  }, { passive: false });
  window.addEventListener('keydown', (e) => {
    if (e.key === '+' || e.key === '=') zoomAt(1.25);
    else if (e.key === '-') zoomAt(0.8);
    else if (e.key === '0') { fit(); draw(); }
    else if (e.key.startsWith('Arrow')) {
      const d = 64;
      pan({ ArrowLeft: d, ArrowRight: -d }[e.key] || 0, { ArrowUp: d, ArrowDown: -d }[e.key] || 0);
    }
  });
  window.addEventListener('resize', () => { resize(); draw(); });
  $('zoom-in').onclick = () => zoomAt(1.25);
  $('zoom-out').onclick = () => zoomAt(0.8);
  $('home').onclick = () => { fit(); draw(); };
  state.ready = true;
}

window.dpssViewer = {
  get ready() { return state.ready; },
  stats: () => ({
    level: state.level, loaded: state.loaded, failed: state.failed, views: state.views,
    pending: [...state.tiles.values()].filter((t) => !t.ok).length,
    // Viewports drawn but not yet posted (debounced or in flight).
    viewsOwed: state.viewsOwed,
    scale: state.scale, cx: state.cx, cy: state.cy,
    firstTileMs: state.firstTileMs, fullViewMs: state.fullViewMs,
  }),
  zoomAt, pan,
  // Where full-resolution image point (x, y) is on the canvas.
  toScreen: (x, y) => [(x - state.cx) * state.scale + canvas.width / 2, (y - state.cy) * state.scale + canvas.height / 2],
};

if (dataset) open().catch((e) => fail(String(e)));
else listSets().catch((e) => fail(String(e)));
