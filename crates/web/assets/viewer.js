// The viewer: the canvas with the open image (and the filtered result beside it for
// before/after), zoom and pan, window/level by drag and presets, the readouts and the overlay.

import { clamp, fmtDate, fmtNumber, fmtPersonName, h } from './util.js';
import { bs, el, state } from './state.js';
import { rawPercentile, renderImages, toValue, windowFromRange } from './raster.js';
import { stepSlice } from './series.js';

const ctx = el.canvas.getContext('2d');

const CT_PRESETS = [
  { id: 'brain', label: 'Brain', w: 80, c: 40 },
  { id: 'soft-tissue', label: 'Soft tissue', w: 400, c: 40 },
  { id: 'lung', label: 'Lung', w: 1500, c: -600 },
  { id: 'bone', label: 'Bone', w: 2000, c: 300 },
];

export function cssSize() {
  return { w: el.canvasWrap.clientWidth, h: el.canvasWrap.clientHeight };
}

export function ensureCanvasSize() {
  const { w, h: hh } = cssSize();
  const dpr = window.devicePixelRatio || 1;
  const bw = Math.max(1, Math.round(w * dpr));
  const bh = Math.max(1, Math.round(hh * dpr));
  if (el.canvas.width !== bw || el.canvas.height !== bh) {
    el.canvas.width = bw;
    el.canvas.height = bh;
    return true;
  }
  return false;
}

export function setViewState(s, message = '') {
  el.view.dataset.state = s;
  if (message) el.viewMessageText.textContent = message;
}

function fitZoom() {
  const img = state.img;
  if (!img) return 1;
  const { w, h: hh } = cssSize();
  if (w < 2 || hh < 2) return 1;
  const pad = 8;
  return Math.max(1e-3, Math.min((w - pad) / img.orig.w, (hh - pad) / img.orig.h));
}

export function fit() {
  const img = state.img;
  if (!img) return;
  const { w, h: hh } = cssSize();
  state.zoom = fitZoom();
  state.panX = (w - img.orig.w * state.zoom) / 2;
  state.panY = (hh - img.orig.h * state.zoom) / 2;
  state.fitted = true;
  updateZoomReadout();
  requestDraw();
}

export function zoomAbout(px, py, factor) {
  const nz = clamp(state.zoom * factor, Math.min(0.02, fitZoom()), 64);
  const ix = (px - state.panX) / state.zoom;
  const iy = (py - state.panY) / state.zoom;
  state.zoom = nz;
  state.panX = px - ix * nz;
  state.panY = py - iy * nz;
  state.fitted = false;
  updateZoomReadout();
  requestDraw();
}

export function updateZoomReadout() {
  el.zoomReadout.textContent = state.img ? `${Math.round(state.zoom * 100)}%` : '–';
}

function unit() {
  // A filter that makes grey levels (window, edge, emboss), or that keeps the scale but not
  // the meaning (invert), leaves Hounsfield units behind.
  if (state.img?.filt?.ownWindow || state.img?.filt?.unitless) return '';
  const u = state.img?.display?.unit;
  return u ? ` ${u}` : '';
}

export function updateWlReadout() {
  if (!state.img) {
    el.wlReadout.textContent = '–';
    return;
  }
  const w = Math.round(state.wl.w);
  const c = Math.round(state.wl.c) + 0; // + 0 turns -0 into 0
  // A grey-level result (edge, emboss, window) is shown on its own full scale: the window
  // moves only the original (seen with the before/after slider), and the readout says so.
  const grey = state.img.filt?.ownWindow ? ' (original; result on its own scale)' : '';
  el.wlReadout.textContent = `W ${w} / L ${c}${unit()}${grey}`;
  renderOverlay();
}

export function setWindow(c, w, presetId = null) {
  state.wl = { c, w: Math.max(1, w) };
  state.activePreset = presetId;
  for (const b of el.presets.querySelectorAll('.preset')) b.classList.toggle('active', b.dataset.preset === presetId);
  updateWlReadout();
  state.lutDirty = true;
  requestDraw();
}

/** Geometry (in image coordinates of the original) where raster r is drawn. */
function rasterRect(r) {
  const o = state.img.orig;
  if (r === o || (r.w === o.w && r.h === o.h)) return { x: 0, y: 0, w: o.w, h: o.h };
  const s = Math.min(o.w / r.w, o.h / r.h);
  return { x: (o.w - r.w * s) / 2, y: (o.h - r.h * s) / 2, w: r.w * s, h: r.h * s };
}

/** Screen x (CSS pixels) of the before/after split, or null when not comparing. */
function splitX() {
  const img = state.img;
  if (!img?.filt || !el.compare.checked) return null;
  const { w } = cssSize();
  const x0 = clamp(state.panX, 0, w);
  const x1 = clamp(state.panX + img.orig.w * state.zoom, 0, w);
  return x0 + ((x1 - x0) * Number(el.compareSlider.value)) / 100;
}

export function viewInfo() {
  return {
    zoom: state.zoom,
    panX: state.panX,
    panY: state.panY,
    wl: { ...state.wl },
    splitX: splitX(),
    key: state.img?.key ?? null,
    frame: state.img?.frame ?? null,
    filtered: !!state.img?.filt,
  };
}

function requestDraw() {
  if (state.drawPending) return;
  state.drawPending = true;
  requestAnimationFrame(draw);
}

export function draw() {
  state.drawPending = false;
  ensureCanvasSize();
  const dpr = el.canvas.width / Math.max(1, cssSize().w);
  ctx.setTransform(1, 0, 0, 1, 0, 0);
  ctx.fillStyle = '#000';
  ctx.fillRect(0, 0, el.canvas.width, el.canvas.height);
  bs.frames++;
  const img = state.img;
  if (!img) return;
  if (state.lutDirty) renderImages();
  const z = state.zoom;
  const drawRaster = (r) => {
    const rect = rasterRect(r);
    ctx.setTransform(dpr * z, 0, 0, dpr * z, dpr * state.panX, dpr * state.panY);
    const smooth = (z * rect.w) / r.w < 1;
    ctx.imageSmoothingEnabled = smooth;
    if (smooth) ctx.imageSmoothingQuality = 'high';
    ctx.drawImage(r.canvas, rect.x, rect.y, rect.w, rect.h);
  };
  const sx = splitX();
  if (sx !== null) {
    const H = el.canvas.height;
    ctx.save();
    ctx.beginPath();
    ctx.rect(0, 0, sx * dpr, H);
    ctx.clip();
    drawRaster(img.orig);
    ctx.restore();
    ctx.save();
    ctx.beginPath();
    ctx.rect(sx * dpr, 0, el.canvas.width - sx * dpr, H);
    ctx.clip();
    drawRaster(img.filt);
    ctx.restore();
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.strokeStyle = '#ffd54a';
    ctx.lineWidth = 2;
    ctx.beginPath();
    ctx.moveTo(sx, 0);
    ctx.lineTo(sx, H / dpr);
    ctx.stroke();
    ctx.font = '12px system-ui, sans-serif';
    ctx.fillStyle = '#ffd54a';
    ctx.textBaseline = 'top';
    ctx.textAlign = 'right';
    ctx.fillText('before', sx - 6, 6);
    ctx.textAlign = 'left';
    ctx.fillText('after', sx + 6, 6);
  } else {
    drawRaster(img.filt || img.orig);
  }
  ctx.setTransform(1, 0, 0, 1, 0, 0);
}

/** The raster and sample under a canvas point, for the pixel readout. */
function sampleAt(px, py) {
  const img = state.img;
  if (!img) return null;
  const sx = splitX();
  const r = img.filt && (sx === null || px >= sx) ? img.filt : img.orig;
  const rect = rasterRect(r);
  const ox = (px - state.panX) / state.zoom;
  const oy = (py - state.panY) / state.zoom;
  const x = Math.floor(((ox - rect.x) / rect.w) * r.w);
  const y = Math.floor(((oy - rect.y) / rect.h) * r.h);
  if (x < 0 || y < 0 || x >= r.w || y >= r.h) return null;
  const i = (y * r.w + x) * r.ch;
  const colours = r.ch === 2 || r.ch === 4 ? r.ch - 1 : r.ch;
  const values = [];
  for (let c = 0; c < colours; c++) values.push(toValue(r.map, r.data[i + c]));
  return { x, y, values, filtered: r !== img.orig, grey: !!r.ownWindow };
}

function updatePixelReadout(px, py) {
  const s = sampleAt(px, py);
  if (!s) {
    el.pixelReadout.textContent = '';
    return;
  }
  const v = s.values.map(fmtNumber).join(' ');
  el.pixelReadout.textContent = `${s.x}, ${s.y}: ${v}${s.values.length === 1 && !s.grey ? unit() : ''}${s.filtered ? ' (filtered)' : ''}`;
}

function canvasPoint(e) {
  const r = el.canvas.getBoundingClientRect();
  return { x: e.clientX - r.left, y: e.clientY - r.top };
}

/** A wheel event this far (pixels) or more is a mouse notch: one slice. */
const NOTCH_PX = 50;
/** Smaller (trackpad) deltas add up: one slice per this many pixels. */
const SLICE_PX = 100;
/** Trackpad scrolling not yet a whole slice (its sign the direction). */
let wheelAcc = 0;

/** Display units moved per screen pixel of a window/level drag. */
function wlSensitivity() {
  const img = state.img;
  const d = img.display || {};
  let range = Number(d.max) - Number(d.min);
  if (!Number.isFinite(range) || range <= 0) range = img.orig.rawMax - img.orig.rawMin;
  if (!Number.isFinite(range) || range <= 0) range = (1 << img.orig.bits) - 1;
  return Math.max(range / 512, Math.abs(img.orig.map?.scale || 1) / 8);
}

export function setupCanvas() {
  const c = el.canvas;
  c.addEventListener('contextmenu', (e) => e.preventDefault());
  c.addEventListener('pointerdown', (e) => {
    if (!state.img) return;
    let mode = null;
    if (e.button === 2 || (e.button === 0 && e.shiftKey)) mode = 'wl';
    else if (e.button === 0) mode = 'pan';
    if (!mode) return;
    e.preventDefault();
    c.setPointerCapture(e.pointerId);
    state.drag = { mode, id: e.pointerId, x: e.clientX, y: e.clientY, panX: state.panX, panY: state.panY, c: state.wl.c, w: state.wl.w, k: wlSensitivity() };
    c.classList.add(mode === 'pan' ? 'panning' : 'windowing');
  });
  c.addEventListener('pointermove', (e) => {
    const p = canvasPoint(e);
    const d = state.drag;
    if (d && d.id === e.pointerId) {
      const dx = e.clientX - d.x;
      const dy = e.clientY - d.y;
      if (d.mode === 'pan') {
        state.panX = d.panX + dx;
        state.panY = d.panY + dy;
        state.fitted = false;
        requestDraw();
      } else {
        // Right: wider window, by a factor (×2 per 140 px), so no drag collapses it; down:
        // higher level, in steps proportional to the window (a quarter width per 64 px) and
        // never finer than the image's value range allows.
        const w = clamp(d.w * Math.exp(dx / 200), d.k, d.k * 4096);
        setWindow(d.c + dy * Math.max(d.w / 256, d.k / 4), w);
      }
    }
    updatePixelReadout(p.x, p.y);
  });
  const end = (e) => {
    if (state.drag && state.drag.id === e.pointerId) {
      state.drag = null;
      c.classList.remove('panning', 'windowing');
    }
  };
  c.addEventListener('pointerup', end);
  c.addEventListener('pointercancel', end);
  c.addEventListener('pointerleave', () => {
    if (!state.drag) el.pixelReadout.textContent = '';
  });
  c.addEventListener(
    'wheel',
    (e) => {
      if (!state.img) return;
      e.preventDefault();
      if (state.stack && state.stack.length > 1 && !e.ctrlKey && !e.metaKey) {
        // Within a series or frame stack the wheel scrolls slices, as radiologists expect:
        // one slice per mouse notch; a trackpad's many small deltas add up to one per
        // SLICE_PX (a small flick does not fly through the series).
        const px = e.deltaY * (e.deltaMode === 1 ? 40 : e.deltaMode === 2 ? 800 : 1);
        if (Math.sign(px) !== Math.sign(wheelAcc)) wheelAcc = 0;
        if (Math.abs(px) >= NOTCH_PX) {
          wheelAcc = 0;
          stepSlice(Math.sign(px));
          return;
        }
        wheelAcc += px;
        if (Math.abs(wheelAcc) >= SLICE_PX) {
          stepSlice(Math.sign(wheelAcc));
          wheelAcc = 0;
        }
        return;
      }
      const p = canvasPoint(e);
      const perLine = e.deltaMode === 1 ? 40 : e.deltaMode === 2 ? 400 : 1;
      zoomAbout(p.x, p.y, Math.exp(-e.deltaY * perLine * 0.0015));
    },
    { passive: false },
  );
  c.addEventListener('dblclick', (e) => {
    e.preventDefault();
    fit();
  });
  el.fitButton.addEventListener('click', fit);
  el.compare.addEventListener('change', () => {
    el.compareBar.hidden = !(el.compare.checked && state.img?.filt);
    requestDraw();
  });
  el.compareSlider.addEventListener('input', requestDraw);

  new ResizeObserver(() => {
    if (ensureCanvasSize() && state.img && state.fitted) fit();
    else requestDraw();
  }).observe(el.canvasWrap);
}

export function buildPresets() {
  const img = state.img;
  const list = [];
  if (!img) {
    state.presets = list;
    el.presets.replaceChildren();
    return;
  }
  const d = img.display || {};
  const o = img.orig;
  const gray = o.ch <= 2;
  if (gray && String(img.meta?.image?.modality || '').toUpperCase() === 'CT') list.push(...CT_PRESETS);
  if (Number.isFinite(d.center) && Number.isFinite(d.width)) {
    list.push({ id: 'default', label: 'Default', c: d.center, w: d.width });
  }
  let lo = Number(d.min);
  let hi = Number(d.max);
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) {
    lo = toValue(o.map, o.rawMin);
    hi = toValue(o.map, o.rawMax);
  }
  list.push({ id: 'full', label: 'Full', ...windowFromRange(lo, hi) });
  if (o.bits === 16) {
    const a = toValue(o.map, rawPercentile(o, 0.01));
    const b = toValue(o.map, rawPercentile(o, 0.99));
    list.push({ id: 'auto', label: 'Auto 1–99%', ...windowFromRange(a, b) });
  }
  state.presets = list;
  el.presets.replaceChildren(
    ...list.map((p, i) =>
      h('button', {
        type: 'button',
        class: 'preset',
        'data-preset': p.id,
        title: `W ${Math.round(p.w)} / L ${Math.round(p.c)}${unit()} (key ${i + 1})`,
        text: p.label,
        onclick: () => setWindow(p.c, p.w, p.id),
      }),
    ),
  );
}

/** The on-image overlay: patient and study top left; slice, window top right. */
export function renderOverlay() {
  const img = state.img;
  if (!img) {
    el.overlay.hidden = true;
    return;
  }
  const m = img.meta.image || {};
  const st = state.stack;
  const tl = [fmtPersonName(m.patient_name || ''), m.patient_id, [fmtDate(m.study_date || ''), m.modality].filter(Boolean).join(' '), m.series_description].filter(Boolean);
  const br = [];
  if (st) br.push(`${st.info.kind === 'frames' ? 'Frame' : 'Im'} ${st.index + 1} / ${st.length}`);
  if (m.slice_location !== undefined) br.push(`Loc ${fmtNumber(m.slice_location)} mm`);
  if (img.orig.ch === 1) br.push(el.wlReadout.textContent);
  el.overlayTl.textContent = tl.join('\n');
  el.overlayBr.textContent = br.join('\n');
  el.overlay.hidden = tl.length === 0 && br.length === 0;
}
